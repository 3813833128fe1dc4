//! `repetitive_text`: one reply that "chants" — a window of `chunk_chars` characters that
//! recurs at least `min_repeats` times at an average spacing of at most
//! `max_avg_spacing_chars`.
//!
//! A model caught in a degenerate generation repeats itself inside one reply long before
//! its turns repeat. Fenced code, tables, list items, headings, quotes and divider lines
//! are skipped (legitimately repetitive). It only warns (once per reply): a chanting reply
//! can still end well, and `similar_turns` or `stall` follow the ones that do not.

use serde::{Deserialize, Serialize};

use super::settings::Bounded;
use super::{Class, Detector, Evidence, LlmContext, Message, Reading, SessionView, Signal, num};
use crate::engine::levels::Levels;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepetitiveText {
    /// The repeated window's length.
    pub chunk_chars: Bounded<8, 1000>,
    /// How often the window must recur.
    pub min_repeats: Bounded<2, 1000>,
    /// Repeats must be this close on average.
    pub max_avg_spacing_chars: usize,
}

impl Default for RepetitiveText {
    fn default() -> Self {
        RepetitiveText {
            chunk_chars: Bounded::new(50),
            min_repeats: Bounded::new(10),
            max_avg_spacing_chars: 250,
        }
    }
}

impl Detector for RepetitiveText {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a LlmContext<'a>;
    type State = ();

    fn default_levels() -> Levels {
        Levels::new(Some(1.0), None, None)
    }

    fn evaluate(&self, levels: &Levels, _: &SessionView<'_, Self::State>, l: &LlmContext) -> Option<Signal> {
        l.has_text.then(|| Signal::flag(l.chant.is_some(), levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, l: &LlmContext, _: Reading, ev: &mut Evidence) -> Message {
        if let Some(c) = l.chant {
            ev.insert("repeats".into(), c.repeats.into());
            ev.insert("avg_spacing_chars".into(), num(c.avg_spacing));
            ev.insert("chunk_chars".into(), c.chunk.into());
        }
        Message::new(
            "the reply repeats the same passage over and over",
            "your last reply repeated the same text many times; stop and say plainly what you will do next",
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::RepetitiveText;
    use crate::engine::levels::Level;

    #[test]
    fn fires_once_on_a_chanting_turn() {
        let evs = vec![turn(1, &"I will not output any text. I am done now. ".repeat(30))];
        assert_eq!(of(&evs, RepetitiveText), vec![(0, Level::Warning)]);
    }

    #[test]
    fn needs_min_repeats() {
        // 43 characters a sentence: 9 repeats of a 50-character window is one short.
        let evs = vec![turn(1, &"I will not output any text. I am done now. ".repeat(10))];
        assert!(of(&evs, RepetitiveText).is_empty());
        let cfg = "[detectors.repetitive_text]\nmin_repeats = 5\n";
        assert_eq!(of_with(cfg, &evs, RepetitiveText), vec![(0, Level::Warning)]);
    }
}

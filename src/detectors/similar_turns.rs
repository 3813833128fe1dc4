//! `similar_turns`: consecutive turns whose text nearly repeats one of the previous 5
//! (Jaccard similarity of lowercased whitespace tokens ≥ `min_similarity`).
//!
//! An agent saying the same thing each turn ("I have verified the file and will now mark
//! the task complete") is stuck even when its tool calls vary. Warn at 3 such turns in a
//! row, terminate at 5; 0.85 leaves room for the few words that change between honest
//! steps of a plan.

use serde::{Deserialize, Serialize};

use super::settings::Share;
use super::{Class, Detector, Evidence, LlmContext, Message, Reading, Signal};
use crate::policy::Levels;
use crate::state::SessionState;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimilarTurns {
    /// Jaccard similarity at or above which two turns are "the same".
    pub min_similarity: Share,
}

impl Default for SimilarTurns {
    fn default() -> Self {
        SimilarTurns {
            min_similarity: Share::new(0.85),
        }
    }
}

impl Detector for SimilarTurns {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a LlmContext;

    fn default_levels() -> Levels {
        Levels::new(Some(3.0), None, Some(5.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionState, l: &LlmContext) -> Option<Signal> {
        (l.is_turn && l.has_text).then(|| Signal::of(st.run.similar_streak as f64, levels))
    }

    fn describe(&self, _: &SessionState, _: &LlmContext, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("{} turns in a row nearly repeat an earlier turn", r.count()),
            "your last replies say nearly the same thing; move the task forward or say what blocks you",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::detectors::testing::*;
    use crate::detectors::DetectorKind::SimilarTurns;
    use crate::policy::Level;

    /// Turns with `text`, each followed by a call whose result is `result(i)`.
    fn turns(
        n: usize,
        text: impl Fn(usize) -> String,
        result: impl Fn(usize) -> serde_json::Value,
    ) -> Vec<serde_json::Value> {
        let mut evs = Vec::new();
        for i in 0..n {
            evs.push(turn(1, &text(i)));
            evs.push(call("check", json!({"what": "status"}), result(i)));
        }
        evs
    }

    const SAME: &str = "I have verified the file and will now mark the task complete";

    #[test]
    fn warns_at_3_and_terminates_at_5() {
        // The same words each turn, and nothing new from the tools between them (the
        // first result is news, so the count starts with the turn after it).
        let evs = turns(7, |_| SAME.to_string(), |_| json!("unchanged"));
        assert!(of_alone(&first(&evs, 8), SimilarTurns).is_empty());
        assert_eq!(
            of_alone(&evs, SimilarTurns),
            vec![(8, Level::Warning), (12, Level::Terminate)]
        );
    }

    #[test]
    fn a_turn_that_learned_something_is_progress_however_alike_the_words() {
        // Scrolling through a file: "let me scroll down" each turn, a new page each time.
        let evs = turns(8, |_| SAME.to_string(), words);
        assert!(of_alone(&evs, SimilarTurns).is_empty());
    }

    #[test]
    fn dissimilar_turns_are_not_counted() {
        let text = |i| format!("step {i}: {}", "word ".repeat(i + 1));
        let evs = turns(8, text, |_| json!("unchanged"));
        assert!(of_alone(&evs, SimilarTurns).is_empty());
        // ...unless the bar is lowered far enough.
        let cfg = alone("similar_turns") + "min_similarity = 0.05\n";
        assert!(!of_with(&cfg, &evs, SimilarTurns).is_empty());
    }
}

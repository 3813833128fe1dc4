//! `write_no_effect`: a tool classed `write` (`[tools] write` globs) that gives an
//! unchanged result for the same call again — an edit that does not take.
//!
//! Warn at the 3rd identical result of the same write in the window; no kill (`repeat`
//! and the ceilings stop the ones that go on).

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Message, Reading, SessionView, Signal, ToolContext};
use crate::engine::levels::Levels;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteNoEffect {}

impl Detector for WriteNoEffect {
    const CLASS: Class = Class::ToolLoop;
    type On<'a> = &'a ToolContext<'a>;
    type State = ();

    fn default_levels() -> Levels {
        Levels::new(Some(3.0), None, None)
    }

    fn evaluate(&self, levels: &Levels, _: &SessionView<'_, Self::State>, t: &ToolContext) -> Option<Signal> {
        t.obs
            .write
            .then(|| Signal::of(t.facts.pair_count.saturating_sub(1) as f64, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, t: &ToolContext, r: Reading, _: &mut Evidence) -> Message {
        let tool = t.tool;
        Message::new(
            format!("write `{tool}` gave an unchanged result {} more times for the same call", r.count()),
            format!("your `{tool}` edit does not change anything; check that the target and content are right"),
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::WriteNoEffect;
    use crate::engine::levels::Level;

    fn writes(n: usize) -> Vec<Value> {
        let mut evs = Vec::new();
        for i in 0..n {
            evs.push(call(
                "edit_file",
                json!({"path": "a", "patch": "x"}),
                json!("no change"),
            ));
            evs.push(call("read", json!(i), json!(i)));
        }
        evs
    }

    #[test]
    fn warns_at_the_third_unchanged_result_after_the_first() {
        assert!(of(&writes(3), WriteNoEffect).is_empty());
        assert_eq!(of(&writes(4), WriteNoEffect), vec![(6, Level::Warning)]);
    }
}

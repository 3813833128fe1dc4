//! `compaction_loop`: history compactions (`call_kind = "compaction"`) with no tool call
//! between them.
//!
//! An agent whose context fills up again before it does any work compacts forever. Warn
//! at 3 compactions in a row, terminate at 10 (compaction is expensive but sometimes
//! needed several times on a long task).

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, LlmContext, Message, Reading, SessionView, Signal};
use crate::engine::levels::Levels;
use crate::engine::trajectory::{RunState};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionLoop {}

impl Detector for CompactionLoop {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a LlmContext<'a>;
    /// Compactions with no tool call since the first of them.
    type State = u32;

    fn observe(&self, streak: &mut u32, _: &RunState, input: &Input<'_>) {
        if input.tool().is_some() {
            *streak = 0;
        } else if input.llm().is_some_and(|l| l.is_compaction) {
            *streak += 1;
        }
    }

    fn default_levels() -> Levels {
        Levels::new(Some(3.0), None, Some(10.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, l: &LlmContext) -> Option<Signal> {
        l.is_compaction
            .then(|| Signal::of(*st.own as f64, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, _: &LlmContext, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("{} history compactions without any tool call in between", r.count()),
            "the conversation keeps being compacted without any work in between; do one concrete step now",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::CompactionLoop;
    use crate::engine::levels::Level;

    #[test]
    fn warns_at_3_and_terminates_at_10_in_a_row() {
        let evs: Vec<Value> = (0..10)
            .map(|_| llm(json!({"call_kind": "compaction", "tool_calls": 0})))
            .collect();
        assert!(of(&first(&evs, 2), CompactionLoop).is_empty());
        assert_eq!(
            of(&evs, CompactionLoop),
            vec![(2, Level::Warning), (9, Level::Terminate)]
        );
    }

    #[test]
    fn needs_no_tool_call_between() {
        let mut evs = Vec::new();
        for i in 0..10 {
            evs.push(llm(json!({"call_kind": "compaction"})));
            evs.push(call("read", json!(i), json!(i)));
        }
        assert!(of(&evs, CompactionLoop).is_empty());
    }
}

//! `tool_call_cap`: a hard ceiling on tool calls in a session (all runs together).
//!
//! Catches a session that acts without end, each call different enough to pass the loop
//! detectors. Default 1,000 calls (warnings at 80 % and 90 %): several times what a long
//! productive coding session makes, so it only ends the ones that would not stop.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal};
use crate::engine::levels::Levels;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallCap {}

impl Detector for ToolCallCap {
    const CLASS: Class = Class::Budget;
    type On<'a> = Input<'a>;
    type State = ();

    fn default_levels() -> Levels {
        Levels::budget(1000.0)
    }

    fn evaluate(&self, levels: &Levels, state: &SessionView<'_, Self::State>, _: Input<'_>) -> Option<Signal> {
        Some(Signal::of(state.stats.tool_calls as f64, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, _: Input<'_>, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("{} tool calls in the session (limit {})", r.count(), r.limit()),
            "you have made very many tool calls in this session; wrap up or explain what is blocking you",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::ToolCallCap;
    use crate::engine::levels::Level;

    #[test]
    fn counts_calls_across_runs() {
        // A new run resets the loop detectors, not the ceilings.
        let mut evs: Vec<Value> = Vec::new();
        for run_id in ["a", "b", "c"] {
            for _ in 0..2 {
                let mut e = call("read", json!({"p": 1}), json!("x"));
                e["run_id"] = json!(run_id);
                evs.push(e);
            }
        }
        assert!(run(&evs).is_empty());
        let cfg = "[detectors.tool_call_cap]\nterminate_at = 6\n";
        let found = run_with(cfg, &evs);
        assert_eq!(
            found.last().map(|x| (x.0, x.1, x.2)),
            Some((5, ToolCallCap, Level::Terminate))
        );
        assert_eq!(
            of_with(cfg, &evs, ToolCallCap),
            vec![(4, Level::Warning), (5, Level::Terminate)],
            "4.8 and 5.4 round up to the 5th call"
        );
    }
}

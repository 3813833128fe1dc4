//! `unknown_tool`: consecutive calls to tools that do not exist
//! (`error_kind = "unknown_tool"`), whatever their arguments.
//!
//! A model that hallucinates a tool tends to keep trying it with new arguments, so
//! arguments do not matter here. Warn at 3 in a row (a hint naming the problem often
//! suffices), terminate at 10.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal, ToolContext};
use crate::engine::levels::Levels;
use crate::engine::trajectory::{RunState};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnknownTool {}

impl Detector for UnknownTool {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a ToolContext<'a>;
    /// Calls to tools the runtime does not know, in a row.
    type State = u32;

    fn observe(&self, streak: &mut u32, _: &RunState, input: &Input<'_>) {
        let Some(t) = input.tool() else { return };
        *streak = if t.obs.unknown_tool { *streak + 1 } else { 0 };
    }

    fn default_levels() -> Levels {
        Levels::new(Some(3.0), None, Some(10.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, _: &ToolContext) -> Option<Signal> {
        Some(Signal::of(*st.own as f64, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, t: &ToolContext, r: Reading, _: &mut Evidence) -> Message {
        let tool = t.tool;
        Message::new(
            format!("{} calls in a row to tools that do not exist (last: `{tool}`)", r.count()),
            format!("`{tool}` is not an available tool; use one of the tools you were given"),
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::UnknownTool;
    use crate::engine::levels::Level;

    #[test]
    fn counts_calls_with_changing_args() {
        let evs: Vec<Value> = (0..10)
            .map(|i| fail("exec", json!({"c": i}), Some("unknown_tool")))
            .collect();
        // The same "no such tool" for every attempt is error_repeat's business too.
        assert!(of_alone(&first(&evs, 2), UnknownTool).is_empty());
        assert_eq!(
            of_alone(&evs, UnknownTool),
            vec![(2, Level::Warning), (9, Level::Terminate)]
        );
    }
}

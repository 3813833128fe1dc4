//! `error_streak`: consecutive failing calls, any action.
//!
//! An agent whose every call fails has lost its footing: a wrong working directory,
//! revoked credentials, its whole reply sent to the shell as a command. Varied failing
//! attempts are honest exploration for a while, so it warns at 5 failures in a row and
//! is critical at 10; at 12 (and, as for every loop, only `grace_steps` after its first
//! warning) nothing has worked for so long that going on is spend, not search: working
//! coding agents rarely fail more than 4 calls in a row. One success resets it.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal, ToolContext};
use crate::engine::levels::Levels;
use crate::engine::trajectory::{RunState};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorStreak {}

impl Detector for ErrorStreak {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a ToolContext<'a>;
    /// Failures in a row (a changed poll ends them).
    type State = u32;

    fn observe(&self, streak: &mut u32, _: &RunState, input: &Input<'_>) {
        let Some(t) = input.tool() else { return };
        *streak = if t.obs.is_error && !t.facts.poll_moved {
            *streak + 1
        } else {
            0
        };
    }

    fn default_levels() -> Levels {
        Levels::new(Some(5.0), Some(10.0), Some(12.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, _: &ToolContext) -> Option<Signal> {
        Some(Signal::of(*st.own as f64, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, _: &ToolContext, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("{} failing tool calls in a row", r.count()),
            "your last tool calls all failed; stop and rethink the approach before calling more tools",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::ErrorStreak;
    use crate::engine::levels::Level;

    fn failures(n: usize, prefix: &str) -> Vec<Value> {
        (0..n)
            .map(|i| fail(&format!("{prefix}{i}"), json!(i), None))
            .collect()
    }

    #[test]
    fn warns_at_5_is_critical_at_10_and_terminates_at_12() {
        assert!(of(&failures(4, "t"), ErrorStreak).is_empty());
        assert_eq!(
            of(&failures(11, "t"), ErrorStreak),
            vec![(4, Level::Warning), (9, Level::Critical)]
        );
        assert_eq!(
            of(&failures(12, "t"), ErrorStreak),
            vec![(4, Level::Warning), (9, Level::Critical), (11, Level::Terminate)]
        );
    }

    #[test]
    fn a_success_resets_the_streak() {
        let mut evs = failures(4, "t");
        evs.push(call("ok", json!(1), json!("fine")));
        evs.extend(failures(4, "u"));
        assert!(of(&evs, ErrorStreak).is_empty());
    }
}

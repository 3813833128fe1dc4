//! `turn_cap`: a hard ceiling on the steps of a session (all runs together): its LLM
//! calls, and the tool calls no LLM call asked for (a source whose LLM calls stop
//! arriving, or never came, still takes steps).
//!
//! Catches what no loop detector names: an agent that keeps taking steps, each one
//! different, without ever finishing. Default 200 steps, warning at 80 % and 90 %: long
//! enough for real multi-hour coding sessions, short enough that a session stuck for a
//! different reason every step still ends.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal};
use crate::engine::levels::Levels;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnCap {}

impl Detector for TurnCap {
    const CLASS: Class = Class::Budget;
    type On<'a> = Input<'a>;
    type State = ();

    fn default_levels() -> Levels {
        Levels::budget(200.0)
    }

    fn evaluate(&self, levels: &Levels, state: &SessionView<'_, Self::State>, _: Input<'_>) -> Option<Signal> {
        Some(Signal::of(state.stats.steps as f64, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, _: Input<'_>, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("{} steps in the session (limit {})", r.count(), r.limit()),
            "you have used most of this session's step budget; finish the task or report what blocks you",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::TurnCap;
    use crate::engine::levels::Level;

    fn calls(n: usize) -> Vec<Value> {
        (0..n)
            .map(|i| llm(json!({"text": format!("distinct text number {i}"), "tool_calls": 1})))
            .collect()
    }

    #[test]
    fn warns_at_80_and_90_percent_and_terminates_at_the_limit() {
        let cfg = "[detectors.turn_cap]\nterminate_at = 10\n";
        assert_eq!(
            of_with(cfg, &calls(10), TurnCap),
            vec![
                (7, Level::Warning),
                (8, Level::Critical),
                (9, Level::Terminate)
            ]
        );
        assert!(of_with(cfg, &calls(7), TurnCap).is_empty());
    }

    #[test]
    fn tool_calls_no_llm_call_asked_for_are_steps() {
        // One LLM call asking for one tool call, then tool calls alone: the first is the
        // LLM call's, each later one a step of its own (steps 2..10).
        let cfg = "[detectors.turn_cap]\nterminate_at = 10\n";
        let mut evs = vec![llm(json!({"tool_calls": 1}))];
        evs.extend((0..10).map(|i| call("fetch", json!({"page": i}), words(i))));
        assert_eq!(of_with(cfg, &evs, TurnCap).last(), Some(&(10, Level::Terminate)));
        assert!(of_with(cfg, &evs[..10], TurnCap)
            .iter()
            .all(|f| f.1 != Level::Terminate));
    }

    #[test]
    fn the_default_limit_is_200_calls() {
        let found = of(&calls(200), TurnCap);
        assert_eq!(found.last(), Some(&(199, Level::Terminate)));
        assert_eq!(found.first(), Some(&(159, Level::Warning)));
    }
}

//! `stall`: an agent that narrates instead of acting — consecutive turns that request no
//! tool call (`tool_calls = 0`), with no `tool.called` between them.
//!
//! Warn at 3 such turns (the hint says to act), terminate at 5. A turn that does not say
//! how many tool calls it made is not counted either way: signals a session does not send
//! are not guessed.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, LlmContext, Message, Reading, SessionView, Signal};
use crate::engine::levels::Levels;
use crate::engine::trajectory::RunState;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stall {}

impl Detector for Stall {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a LlmContext<'a>;
    /// Turns in a row that asked for no tool call, with none since.
    type State = u32;

    fn observe(&self, stall: &mut u32, _: &RunState, input: &Input<'_>) {
        if input.tool().is_some() {
            *stall = 0;
        } else if let Some(l) = input.llm().filter(|l| l.is_turn) {
            match l.tool_calls {
                Some(0) => *stall += 1,
                Some(_) => *stall = 0,
                None => {}
            }
        }
    }

    fn default_levels() -> Levels {
        Levels::new(Some(3.0), None, Some(5.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, l: &LlmContext) -> Option<Signal> {
        (l.is_turn && l.tool_calls.is_some()).then(|| Signal::of(*st.own as f64, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, _: &LlmContext, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("{} turns in a row without any tool call", r.count()),
            "you have described what you will do several times without doing it; call the tool now or say what blocks you",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::Stall;
    use crate::engine::levels::Level;

    #[test]
    fn counts_turns_without_tool_calls() {
        let evs: Vec<Value> = (0..5)
            .map(|i| turn(0, &format!("I will do step {i} now")))
            .collect();
        assert!(of(&first(&evs, 2), Stall).is_empty());
        assert_eq!(
            of(&evs, Stall),
            vec![(2, Level::Warning), (4, Level::Terminate)]
        );
    }

    #[test]
    fn ignores_turns_that_do_not_say_and_resets_on_a_tool_call() {
        let mut evs = vec![turn(0, "a"), turn(0, "b")];
        evs.push(llm(json!({"text": "c"})));
        evs.push(call("read", json!(1), json!(1)));
        evs.push(turn(0, "d"));
        evs.push(turn(0, "e"));
        assert!(of(&evs, Stall).is_empty());
    }
}

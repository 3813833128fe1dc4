//! `cycle`: the last k calls (k = 3..8) repeated as a block, with unchanged results (a
//! failure's error up to its digits, as for `repeat`).
//!
//! A longer loop than `ping_pong`: edit, run, read, edit, run, read… and nothing
//! changes. Only irreducible blocks count (a block that is itself a shorter repetition is
//! `repeat`'s or `ping_pong`'s). Warn at 4 repeats of the block, terminate at 6: a
//! whole block coming back with the same results four times is no coincidence, and
//! real agents' cycles run to 6–7 calls.

use serde::{Deserialize, Serialize};

use super::{recent_calls, Class, Detector, Evidence, Message, Reading, Signal, ToolContext};
use crate::policy::Levels;
use crate::state::SessionState;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cycle {}

impl Detector for Cycle {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a ToolContext<'a>;

    fn default_levels() -> Levels {
        Levels::new(Some(4.0), None, Some(6.0))
    }

    fn evaluate(&self, levels: &Levels, _: &SessionState, t: &ToolContext) -> Option<Signal> {
        Some(Signal::of(
            t.facts.cycle.map_or(0, |(_, n)| n) as f64,
            levels,
        ))
    }

    fn describe(&self, st: &SessionState, t: &ToolContext, _: Reading, ev: &mut Evidence) -> Message {
        let (k, n) = t.facts.cycle.unwrap_or((0, 0));
        ev.insert("cycle_length".into(), k.into());
        ev.insert("repeats".into(), n.into());
        ev.insert("recent".into(), recent_calls(st, k * 2));
        Message::new(
            format!("the same {k} calls repeat in a cycle {n} times with unchanged results"),
            format!("you are repeating the same sequence of {k} calls and getting the same results; try something different"),
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::detectors::testing::*;
    use crate::detectors::DetectorKind::Cycle;
    use crate::policy::Level;

    #[test]
    fn a_cycle_of_three_warns_at_4_repeats_and_terminates_at_6() {
        let evs: Vec<Value> = (0..18)
            .map(|i| call("t", json!(i % 3), json!(i % 3)))
            .collect();
        assert!(of(&first(&evs, 11), Cycle).is_empty());
        assert_eq!(
            of(&evs, Cycle),
            vec![(11, Level::Warning), (17, Level::Terminate)]
        );
    }

    #[test]
    fn cycles_of_up_to_8_calls_are_followed() {
        for k in [6, 8] {
            let evs: Vec<Value> = (0..6 * k)
                .map(|i| call("t", json!(i % k), json!(i % k)))
                .collect();
            // The 4th repeat completes at call 4k, the 6th at 6k.
            assert_eq!(
                of_alone(&evs, Cycle),
                vec![(4 * k - 1, Level::Warning), (6 * k - 1, Level::Terminate)],
                "k = {k}"
            );
        }
    }

    #[test]
    fn a_changing_result_breaks_the_cycle() {
        let evs: Vec<Value> = (0..18)
            .map(|i| call("t", json!(i % 3), words(i)))
            .collect();
        assert!(of(&evs, Cycle).is_empty());
    }
}

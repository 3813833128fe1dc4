//! `ping_pong`: two calls alternating, A,B,A,B, with unchanged results on both sides.
//!
//! The agent swings between two fixes (or two files) and neither changes anything. The
//! signal is the length of the strict alternation tail: warn at 6 calls (three round
//! trips), terminate at 10. A changed result on either side ends the tail.

use serde::{Deserialize, Serialize};

use super::{recent_calls, Class, Detector, Evidence, Message, Reading, Signal, ToolContext};
use crate::engine::policy::Levels;
use crate::engine::state::SessionState;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PingPong {}

impl Detector for PingPong {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a ToolContext<'a>;

    fn default_levels() -> Levels {
        Levels::new(Some(6.0), None, Some(10.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionState, _: &ToolContext) -> Option<Signal> {
        Some(Signal::of(st.run.alternation as f64, levels))
    }

    fn describe(&self, st: &SessionState, _: &ToolContext, r: Reading, ev: &mut Evidence) -> Message {
        ev.insert("alternation".into(), st.run.alternation.into());
        ev.insert("recent".into(), recent_calls(st, 6));
        Message::new(
            format!("two calls alternate with unchanged results for {} calls", r.count()),
            "you are alternating between the same two calls and getting the same results; step back and try a different approach",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::PingPong;
    use crate::engine::policy::Level;

    fn alternate(n: usize, b_results: impl Fn(usize) -> Value) -> Vec<Value> {
        (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    call("a", json!(1), json!("A"))
                } else {
                    call("b", json!(2), b_results(i))
                }
            })
            .collect()
    }

    #[test]
    fn warns_at_6_and_terminates_at_10() {
        let cfg = "[detectors.low_novelty]\nmode = \"shadow\"\n";
        let evs = alternate(10, |_| json!("B"));
        assert!(of_with(cfg, &first(&evs, 5), PingPong).is_empty());
        assert_eq!(
            of_with(cfg, &evs, PingPong),
            vec![(5, Level::Warning), (9, Level::Terminate)]
        );
    }

    #[test]
    fn a_changing_result_on_one_side_is_progress() {
        let evs = alternate(12, words);
        assert!(of(&evs, PingPong).is_empty());
    }
}

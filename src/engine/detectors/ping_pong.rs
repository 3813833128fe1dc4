//! `ping_pong`: two calls alternating, A,B,A,B, with unchanged results on both sides.
//!
//! The agent swings between two fixes (or two files) and neither changes anything. The
//! signal is the length of the strict alternation tail: warn at 6 calls (three round
//! trips), terminate at 10. A changed result on either side ends the tail, and so does
//! waiting: a job's status still working on either side, or polls on both (an agent
//! waiting on a job between two `sleep`s).

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal, ToolContext, recent_calls};
use crate::engine::levels::Levels;
use crate::engine::trajectory::RunState;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PingPong {}

impl Detector for PingPong {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a ToolContext<'a>;
    /// Length of the strict A,B,A,B tail with stable results.
    type State = u32;

    fn observe(&self, alternation: &mut u32, run: &RunState, input: &Input<'_>) {
        if input.tool().is_none() {
            return;
        }
        let Some(this) = run.latest() else { return };
        *alternation = match (run.before_latest(1), run.before_latest(2)) {
            // Waiting is no swing: a job still working on either side (its status read
            // between `sleep 30`s), or polls on both sides (`sleep`, a status tool). Polls
            // are `poll_no_progress`'s to judge, with the room polls get; a poll by its
            // name beside a call that is none (an edit and `git_status`) can still swing.
            (Some(p1), _)
                if this.is_waiting() || p1.is_waiting() || (this.is_poll() && p1.is_poll()) =>
            {
                1
            }
            (Some(p1), _) if p1.action == this.action => 1,
            (Some(_), Some(p2)) if p2.same_outcome(&this) && *alternation >= 2 => {
                *alternation + 1
            }
            (Some(_), _) => 2,
            (None, _) => 1,
        };
    }

    fn default_levels() -> Levels {
        Levels::new(Some(6.0), None, Some(10.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, _: &ToolContext) -> Option<Signal> {
        Some(Signal::of(*st.own as f64, levels))
    }

    fn describe(&self, st: &SessionView<'_, Self::State>, _: &ToolContext, r: Reading, ev: &mut Evidence) -> Message {
        ev.insert("alternation".into(), (*st.own).into());
        ev.insert("recent".into(), recent_calls(st.run, 6));
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
    use crate::engine::levels::Level;

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

    /// `a` and `b` in turn, `n` calls.
    fn in_turn(n: usize, a: Value, b: Value) -> Vec<Value> {
        (0..n).map(|i| if i % 2 == 0 { a.clone() } else { b.clone() }).collect()
    }

    #[test]
    fn a_poll_between_waits_is_no_swing() {
        // `sleep`, then the job's status (its result reads as pending), 12 times over.
        let sleep = call("sleep", json!({"seconds": 60}), json!("slept 60s"));
        let job = call("get_job", json!({"id": "j1"}), json!({"status": {"state": "RUNNING"}}));
        assert!(of(&in_turn(24, sleep, job.clone()), PingPong).is_empty());
        // A shell's `sleep` (no poll by its name) and a job still running: waiting too.
        let shell = call("bash", json!({"command": "sleep 30"}), json!(""));
        assert!(of(&in_turn(24, shell, job), PingPong).is_empty());
        // One side no poll: an edit and `git_status` (a poll by its name), unchanged.
        let edit = call("edit_file", json!({"path": "a.py"}), json!("edited"));
        let status = call("git_status", json!({}), json!("modified: a.py"));
        assert!(!of(&in_turn(10, edit, status), PingPong).is_empty());
    }

    #[test]
    fn a_changing_result_on_one_side_is_progress() {
        let evs = alternate(12, words);
        assert!(of(&evs, PingPong).is_empty());
    }
}

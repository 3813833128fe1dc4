//! `cycle`: the last k calls (k = 3..12) repeated as a block, with unchanged results (a
//! failure's error up to its digits, as for `repeat`).
//!
//! A longer loop than `ping_pong`: edit, run, read, edit, run, read… and nothing
//! changes. Only irreducible blocks count (a block that is itself a shorter repetition is
//! `repeat`'s or `ping_pong`'s), and only once the block has come back whole. The
//! signal is the number of calls the repeating tail covers — what the loop has wasted —
//! not the number of repeats, so a 7-call cycle is judged as soon as a 3-call one (a
//! block with a job's status still working in it, or of polls only, is waiting): warn
//! at 12 calls (a 3-call block four times, a 6-call block twice), terminate at 18. Real
//! agents' cycles run to 6–10 calls; a whole block of a dozen calls coming back with the
//! same results is no coincidence either.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal, ToolContext, recent_calls};
use crate::engine::levels::Levels;
use crate::engine::trajectory::RunState;

/// Cycle lengths `cycle` looks for (2 is `ping_pong`'s, 1 `repeat`'s).
pub const CYCLE_LENGTHS: [usize; 10] = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cycle {}

impl Detector for Cycle {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a ToolContext<'a>;
    /// Per cycle length k: how many trailing calls equal the call k before them.
    type State = [u32; CYCLE_LENGTHS.len()];

    fn observe(&self, matched: &mut Self::State, run: &RunState, input: &Input<'_>) {
        if input.tool().is_none() {
            return;
        }
        let Some(this) = run.latest() else { return };
        for (m, k) in matched.iter_mut().zip(CYCLE_LENGTHS) {
            *m = match run.before_latest(k) {
                Some(prev) if prev.same_outcome(&this) => *m + 1,
                _ => 0,
            };
        }
    }

    fn default_levels() -> Levels {
        Levels::new(Some(12.0), None, Some(18.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, _: &ToolContext) -> Option<Signal> {
        Some(Signal::of(
            longest_cycle(st.run, st.own).map_or(0, |(_, n)| n) as f64,
            levels,
        ))
    }

    fn describe(&self, st: &SessionView<'_, Self::State>, _: &ToolContext, _: Reading, ev: &mut Evidence) -> Message {
        let (k, covered) = longest_cycle(st.run, st.own).unwrap_or((0, 0));
        let repeats = covered as usize / k.max(1);
        ev.insert("cycle_length".into(), k.into());
        ev.insert("calls_covered".into(), covered.into());
        ev.insert("repeats".into(), repeats.into());
        ev.insert("recent".into(), recent_calls(st.run, k * 2));
        Message::new(
            format!("the same {k} calls repeat in a cycle ({covered} calls, {repeats} times) with unchanged results"),
            format!("you are repeating the same sequence of {k} calls and getting the same results; try something different"),
        )
    }
}

/// The cycle at the window's tail that covers the most calls, as (length k, calls
/// covered), once its block came back whole at least once and if the block is not
/// itself a shorter repetition (that is `repeat` or `ping_pong`'s business).
fn longest_cycle(run: &RunState, matched: &[u32; CYCLE_LENGTHS.len()]) -> Option<(usize, u32)> {
    let w = &run.window;
    let mut best: Option<(usize, u32)> = None;
    for (m, k) in matched.iter().zip(CYCLE_LENGTHS) {
        let m = *m as usize;
        let n = w.len();
        // A window shorter than the block comes only with a restored state that does not
        // hang together; it is passed over rather than indexed below its start.
        if m < k || n < k {
            continue;
        }
        // The block is w[n-k..]; it is reducible when it repeats with a period d | k.
        let reducible = (1..k)
            .filter(|d| k % d == 0)
            .any(|d| (d..k).all(|i| w[n - k + i].same_outcome(&w[n - k + i - d])));
        // Waiting is no cycle: a block with a job's status still working in it (its
        // metrics, its status, its log), or of polls only (`sleep`, one status tool,
        // another). The polls are `poll_no_progress`'s to judge, with the room polls
        // get; a poll by its name among calls that are none is a cycle (an edit, the
        // tests, `git_status`), and so is a pod table's `Running` (prose, no status),
        // and so are sleeps alone (`sleep 5`, `sleep 10`, …: waiting on nothing).
        let block = || w.range(n - k..);
        let waiting = block().all(|c| c.is_poll()) && !block().all(|c| c.is_wait());
        if reducible || block().any(|c| c.is_waiting()) || waiting {
            continue;
        }
        let covered = (m + k) as u32;
        if best.is_none_or(|(_, c)| covered > c) {
            best = Some((k, covered));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::Cycle;
    use crate::engine::levels::Level;

    #[test]
    fn a_cycle_of_three_warns_at_12_calls_and_terminates_at_18() {
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
    fn longer_cycles_are_judged_on_the_calls_they_cover_once_they_came_back_whole() {
        // (k, first warning, termination) as event indices: 12 and 18 calls covered, and
        // never before the block has come back whole (2k calls).
        for (k, warn, terminate) in [(6, 11, 17), (8, 15, 17), (12, 23, 23)] {
            let evs: Vec<Value> = (0..2 * k + 6)
                .map(|i| call("t", json!(i % k), json!(i % k)))
                .collect();
            let expected = if warn == terminate {
                vec![(terminate, Level::Terminate)]
            } else {
                vec![(warn, Level::Warning), (terminate, Level::Terminate)]
            };
            assert!(of_alone(&first(&evs, warn), Cycle).is_empty(), "k = {k}");
            assert_eq!(of_alone(&evs, Cycle), expected, "k = {k}");
        }
    }

    #[test]
    fn a_block_of_polls_only_or_with_a_job_still_working_is_waiting() {
        // `sleep`, the job's status (still running), its queue's status: 8 times over;
        // with an edit for the `sleep`, still waiting while the job runs.
        let block = |first: Value| -> Vec<Value> {
            (0..24)
                .map(|i| match i % 3 {
                    0 => first.clone(),
                    1 => call("get_job", json!({"id": 1}), json!({"status": "RUNNING"})),
                    _ => call("queue_status", json!({"q": 1}), json!("3 jobs ahead")),
                })
                .collect()
        };
        let sleep = call("sleep", json!({"s": 60}), json!("slept 60s"));
        assert!(of_alone(&block(sleep), Cycle).is_empty());
        let edit = call("edit_file", json!({"path": "a.py"}), json!("edited"));
        assert!(of_alone(&block(edit.clone()), Cycle).is_empty(), "the job is running");
        // Without a job still working: an edit, `git_status` (a poll by its name), the
        // tests, unchanged, is a cycle.
        let cycle: Vec<Value> = (0..24)
            .map(|i| match i % 3 {
                0 => edit.clone(),
                1 => call("git_status", json!({}), json!("modified: a.py")),
                _ => call("run_tests", json!({}), json!("1 failed")),
            })
            .collect();
        assert!(!of_alone(&cycle, Cycle).is_empty());
        // A pod table's `Running` is prose, no job waited on: a deploy loop around it is
        // a cycle.
        let pods = call("kubectl", json!({"get": "pods"}), json!("NAME  READY  STATUS\napi-1  0/1  Running"));
        let deploy: Vec<Value> = (0..24)
            .map(|i| match i % 3 {
                0 => call("kubectl", json!({"apply": "api.yaml"}), json!("configured")),
                1 => pods.clone(),
                _ => call("curl", json!({"url": "/health"}), json!("500 Internal Server Error")),
            })
            .collect();
        assert!(!of_alone(&deploy, Cycle).is_empty());
    }

    #[test]
    fn a_block_that_repeats_a_shorter_one_is_not_a_cycle() {
        // The same call again and again is `repeat`'s; A,B,A,B… is `ping_pong`'s.
        let same: Vec<Value> = (0..20).map(|_| call("t", json!(1), json!(1))).collect();
        assert!(of_alone(&same, Cycle).is_empty());
        let two: Vec<Value> = (0..20)
            .map(|i| call("t", json!(i % 2), json!(i % 2)))
            .collect();
        assert!(of_alone(&two, Cycle).is_empty());
    }

    #[test]
    fn a_block_of_13_calls_is_not_followed() {
        let evs: Vec<Value> = (0..39)
            .map(|i| call("t", json!(i % 13), json!(i % 13)))
            .collect();
        assert!(of_alone(&evs, Cycle).is_empty());
    }

    #[test]
    fn a_changing_result_breaks_the_cycle() {
        let evs: Vec<Value> = (0..18)
            .map(|i| call("t", json!(i % 3), words(i)))
            .collect();
        assert!(of(&evs, Cycle).is_empty());
    }
}

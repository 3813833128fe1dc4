//! `poll_no_progress`: a polling call that keeps returning an unchanged result.
//!
//! Waiting on a job is not a loop until it has waited too long, so polls get more room
//! than `repeat` (which they replace): warn after 10 unchanged results, terminate after
//! 20. A changed status (`35% complete` → `60% complete`) resets the count. A call is a
//! poll by its tool class (`[tools] poll` globs) or because its result reads as pending.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Message, Reading, SessionView, Signal, ToolContext, fp_hex};
use crate::engine::levels::Levels;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollNoProgress {}

impl Detector for PollNoProgress {
    const CLASS: Class = Class::ToolLoop;
    type On<'a> = &'a ToolContext<'a>;
    type State = ();

    fn default_levels() -> Levels {
        Levels::new(Some(10.0), None, Some(20.0))
    }

    fn evaluate(&self, levels: &Levels, _: &SessionView<'_, Self::State>, t: &ToolContext) -> Option<Signal> {
        t.obs
            .poll
            .then(|| Signal::of(t.facts.poll_unchanged as f64, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, t: &ToolContext, r: Reading, ev: &mut Evidence) -> Message {
        let (tool, n) = (t.tool, r.count());
        ev.insert("action".into(), fp_hex(t.obs.action).into());
        ev.insert("result".into(), fp_hex(t.obs.result).into());
        Message::new(
            format!("polling `{tool}` returned the same result {n} more times"),
            format!("`{tool}` has returned the same status {n} times; stop polling and check whether the job is stuck or already finished"),
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::{PollNoProgress, Repeat};
    use crate::engine::levels::Level;

    #[test]
    fn polls_get_more_room_but_not_forever() {
        let evs: Vec<Value> = (0..22)
            .map(|_| call("job_status", json!({"id": 1}), json!({"status": "running"})))
            .collect();
        assert!(of(&first(&evs, 10), PollNoProgress).is_empty());
        let f = run(&evs);
        assert!(only(&f, Repeat).is_empty());
        assert_eq!(
            only(&f, PollNoProgress),
            vec![(10, Level::Warning), (20, Level::Terminate)]
        );
    }

    #[test]
    fn a_pending_result_makes_any_tool_a_poll() {
        let evs: Vec<Value> = (0..5)
            .map(|_| {
                call(
                    "curl",
                    json!({"u": "/jobs/1"}),
                    json!("{\"state\": \"queued\"}"),
                )
            })
            .collect();
        assert!(run(&evs).is_empty());
    }

    #[test]
    fn a_changed_status_is_progress() {
        let evs: Vec<Value> = (0..30)
            .map(|i| call("job_status", json!({"id": 1}), json!({"done": i / 5})))
            .collect();
        assert!(of(&evs, PollNoProgress).is_empty());
    }
}

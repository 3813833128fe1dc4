//! `error_repeat`: the same call failing again and again (its error texts may differ).
//!
//! Retrying a failing call unchanged does not make it pass. Warn at the 2nd failure in a
//! row, critical at the 3rd, terminate at the 6th — and, like every loop detector, only
//! `grace_steps` after the warning, so an agent that reads the error and changes the
//! call within a few tries goes on. (DESIGN's table terminates at the 3rd; with the grace
//! that ended the 5th failure. Three testers writing corpora cold, one after another,
//! each let an agent fail the same way five times and then recover by reading what it
//! was changing, and would have nudged it, not ended it; on the recorded sessions the
//! 6th ends all but one of the failing sessions the 3rd did, the others by the same or
//! another detector: `docs/DEVELOPMENT.md`, the fifty-first look.) Different attempts rejected the same way are `same_error`'s. Tools
//! classed `retry_safe` (flaky network fetches and the like) are exempt, and so is a
//! failure that says it is passing (a 503's "temporarily unavailable", a rate limit:
//! [`crate::engine::fingerprint::reads_transient`]; not a command that timed out, which
//! times out again); `error_streak` ends a retry that never gets through.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal, ToolContext};
use crate::engine::levels::Levels;
use crate::engine::trajectory::{CallRecord, RunState};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorRepeat {}

impl Detector for ErrorRepeat {
    const CLASS: Class = Class::ToolLoop;
    type On<'a> = &'a ToolContext<'a>;
    /// Failures in words in a row of the same action (a changed poll ends them).
    type State = u32;

    fn observe(&self, streak: &mut u32, run: &RunState, input: &Input<'_>) {
        let Some(t) = input.tool() else { return };
        // A failure that says nothing (an exit code, an empty output: `grep` finding
        // nothing) is an answer, not an error to retry: `repeat` follows it.
        let Some(this) = run.latest() else { return };
        *streak = match run.before_latest(1) {
            _ if !t.obs.error_text || t.facts.poll_moved => 0,
            Some(l) if l.has(CallRecord::ERROR_TEXT) && l.action == this.action => *streak + 1,
            _ => 1,
        };
    }

    fn default_levels() -> Levels {
        Levels::new(Some(2.0), Some(3.0), Some(6.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, t: &ToolContext) -> Option<Signal> {
        (!t.obs.retry_safe).then(|| Signal::of(*st.own as f64, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, t: &ToolContext, r: Reading, _: &mut Evidence) -> Message {
        let tool = t.tool;
        Message::new(
            format!("`{tool}` failed {} times in a row with the same arguments", r.count()),
            format!("`{tool}` keeps failing with the same arguments; read the error and change the call instead of retrying it"),
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::ErrorRepeat;
    use crate::engine::levels::Level;

    #[test]
    fn warns_at_2_is_critical_at_3_and_terminates_at_6() {
        let evs: Vec<Value> = (0..6)
            .map(|_| fail("deploy", json!({"env": "prod"}), None))
            .collect();
        assert!(of_alone(&first(&evs, 1), ErrorRepeat).is_empty());
        assert_eq!(
            of_alone(&first(&evs, 5), ErrorRepeat),
            vec![(1, Level::Warning), (2, Level::Critical)]
        );
        assert_eq!(
            of_alone(&evs, ErrorRepeat),
            vec![(1, Level::Warning), (2, Level::Critical), (5, Level::Terminate)]
        );
    }

    #[test]
    fn a_failure_that_says_it_is_passing_is_retried_until_the_streak_ends_it() {
        // A 503 that asks to be retried, by its text or by its kind: retrying is what it
        // asks for, until `error_streak` says the retries never get through.
        let unavailable = |i: usize| {
            let mut e = fail("create_refund", json!({"charge": "ch_1"}), None);
            e["result"] = json!({"error": {"message": "The service is temporarily unavailable. Please retry.", "request": i}});
            e
        };
        let evs: Vec<Value> = (0..12).map(unavailable).collect();
        assert!(of(&evs, ErrorRepeat).is_empty());
        let by_kind: Vec<Value> = (0..3)
            .map(|_| fail("create_refund", json!({"charge": "ch_1"}), Some("http_503")))
            .collect();
        assert!(of(&by_kind, ErrorRepeat).is_empty());
        let streak = of(&evs, crate::engine::detectors::DetectorKind::ErrorStreak);
        assert_eq!(streak.last(), Some(&(11, Level::Terminate)), "{streak:?}");
        // The same failure in words that say nothing of passing is stopped at its 6th, and
        // so is a command that timed out.
        for kind in ["denied", "timeout"] {
            let again: Vec<Value> = (0..6)
                .map(|_| {
                    let mut e = fail("bash", json!({"command": "mvn test"}), Some(kind));
                    e["result"] = json!("\nEXECUTION TIMED OUT");
                    e
                })
                .collect();
            assert_eq!(of_alone(&again, ErrorRepeat).last(), Some(&(5, Level::Terminate)), "{kind}");
        }
    }

    #[test]
    fn a_new_attempt_that_fails_differently_starts_over() {
        let evs: Vec<Value> = (0..4)
            .map(|i| fail("deploy", json!({"env": i}), None))
            .collect();
        assert!(of(&evs, ErrorRepeat).is_empty());
    }

    #[test]
    fn a_failure_that_says_nothing_is_an_answer_for_repeat_not_an_error_to_retry() {
        // `grep` finding nothing exits 1 with an empty output: asking again is `repeat`'s.
        let evs: Vec<Value> = (0..3)
            .map(|_| {
                let mut e = fail("bash", json!({"command": "grep -r x tests"}), None);
                e["result"] = json!("<returncode>1</returncode>\n<output>\n</output>");
                e
            })
            .collect();
        assert!(of(&evs, ErrorRepeat).is_empty());
        assert_eq!(
            of(&evs, crate::engine::detectors::DetectorKind::Repeat),
            vec![(2, Level::Warning)]
        );
    }

    #[test]
    fn a_failing_poll_whose_only_change_is_a_counter_is_still_stopped() {
        // A poll by its name whose every answer is the same failure up to its attempt
        // count: an error's numbers are counters, not a job moving.
        let evs: Vec<Value> = (0..6)
            .map(|i| {
                let mut e = fail("service_status", json!({"name": "db"}), None);
                e["result"] = json!(format!("Error: service not running (attempt {i})"));
                e
            })
            .collect();
        assert_eq!(
            of_alone(&evs, ErrorRepeat),
            vec![(1, Level::Warning), (2, Level::Critical), (5, Level::Terminate)]
        );
    }
}

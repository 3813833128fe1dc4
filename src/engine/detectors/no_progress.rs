//! `no_progress`: the runtime's own progress score (`progress` on `cost.attributed`) has
//! not improved on its best for several reports.
//!
//! The most direct signal there is, where a runtime has one (a test pass rate, a plan's
//! completed steps). Warn after 3 reports without improvement, terminate after 6.
//! Sessions that do not report progress are never judged.
//!
//! A report weighs in full only when the last turn's tool calls got nowhere new either
//! (no answer, up to digits, that the window had not seen; see [`Got`]); after calls
//! that did, it weighs a third; after a turn that only waited and checked on a job that
//! moved, nothing (a job moving is progress for every detector). A score kept in coarse
//! steps (a plan's steps, reported at every model call) stands still for the many calls
//! one step takes, while the agent reads new code and its test run fails differently
//! after each edit, or waits on a CI run: progress is also what the agent sees. But a
//! score that stands still three times as long ends the session whatever the calls find
//! (an agent trying a new pattern, a reworded question, a new file each turn, getting
//! nowhere). A report on a call beside the turn (a sub-agent's, a summary's) with no
//! call of this session since its turn weighs a third: a sub-agent works in its own
//! session.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, LlmContext, Message, Reading, SessionView, Signal, num};
use crate::engine::levels::Levels;
use crate::engine::trajectory::{Got, RunState};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoProgress {}

/// The best progress the run reported, and the reports since that did not pass it, in
/// thirds of a report (see [`STALE_THIRDS`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub best: Option<f64>,
    /// Thirds of a stale report. (Written in whole reports before the fiftieth look: a
    /// state stored by such a build counts a third of what it counted there.)
    pub stale: u32,
}

/// A report that did not improve on the best, after calls that got nowhere new: a whole
/// stale report, in thirds.
const STALE_THIRDS: u32 = 3;
/// Such a report after calls that got somewhere new: a third. (After a turn that only
/// waited and checked on a job that moved: nothing.)
const FLAT_THIRDS: u32 = 1;

impl Detector for NoProgress {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a LlmContext<'a>;
    type State = Progress;

    fn observe(&self, own: &mut Progress, run: &RunState, input: &Input<'_>) {
        let Some(l) = input.llm() else { return };
        let Some(p) = l.progress else { return };
        match own.best {
            Some(best) if p <= best => {
                // A report beside the turn (a sub-agent's call, a summary's) with no call of
                // this session since: what it reports on was done elsewhere, or judged with
                // the reports before it. A turn without calls is the agent only talking.
                let weight = if !l.is_turn && l.calls_since_turn == 0 {
                    FLAT_THIRDS
                } else {
                    match run.got_in_last(l.calls_since_turn) {
                        Got::Nowhere => STALE_THIRDS,
                        Got::New => FLAT_THIRDS,
                        Got::JobMoving => 0,
                    }
                };
                own.stale = own.stale.saturating_add(weight);
            }
            _ => {
                own.best = Some(p);
                own.stale = 0;
            }
        }
    }

    fn default_levels() -> Levels {
        Levels::new(Some(3.0), None, Some(6.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, l: &LlmContext) -> Option<Signal> {
        l.progress
            .is_some()
            .then(|| Signal::of(stale_reports(st.own.stale), levels))
    }

    fn describe(&self, st: &SessionView<'_, Self::State>, _: &LlmContext, _: Reading, ev: &mut Evidence) -> Message {
        let best = st.own.best.map(num).unwrap_or_default();
        ev.insert("best_progress".into(), best);
        Message::new(
            format!(
                "progress has not improved for {} reports (one after calls that found something new counts a third)",
                in_thirds(st.own.stale)
            ),
            "your progress has not improved for a while; change the approach or report what blocks you",
        )
    }
}

/// Stale reports, from thirds.
fn stale_reports(thirds: u32) -> f64 {
    f64::from(thirds) / f64::from(STALE_THIRDS)
}

/// Stale reports, from thirds, as people read them: `4`, `4⅓`, `⅔`.
fn in_thirds(thirds: u32) -> String {
    let (whole, part) = (thirds / STALE_THIRDS, ["", "⅓", "⅔"][(thirds % STALE_THIRDS) as usize]);
    match (whole, part) {
        (0, "") => "0".to_string(),
        (0, part) => part.to_string(),
        (whole, part) => format!("{whole}{part}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::NoProgress;
    use crate::engine::levels::Level;

    fn reports(values: &[f64]) -> Vec<Value> {
        values
            .iter()
            .map(|p| llm(json!({"progress": p, "tool_calls": 0})))
            .collect()
    }

    #[test]
    fn warns_at_3_and_terminates_at_6_stale_reports() {
        let evs = reports(&[0.5, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4]);
        assert!(of(&first(&evs, 3), NoProgress).is_empty());
        // (`stall` would end turns without calls first: it runs in `warn` mode here.)
        assert_eq!(
            of_alone(&evs, NoProgress),
            vec![(3, Level::Warning), (6, Level::Terminate)]
        );
    }

    #[test]
    fn an_improvement_resets_the_count() {
        let evs = reports(&[0.1, 0.1, 0.1, 0.2, 0.2, 0.2, 0.3, 0.3, 0.3]);
        assert!(of(&evs, NoProgress).is_empty());
    }

    /// Turns reporting a plan's share of steps done (`progress`), each with one call.
    fn turns_with_calls(progress: &[f64], call: impl Fn(usize) -> Value) -> Vec<Value> {
        turns(progress, |i| vec![call(i)])
    }

    /// Turns reporting `progress`, each with the calls `calls(turn)` gives.
    fn turns(progress: &[f64], calls: impl Fn(usize) -> Vec<Value>) -> Vec<Value> {
        (progress.iter().enumerate())
            .flat_map(|(i, p)| {
                let calls = calls(i);
                std::iter::once(llm(json!({"progress": p, "tool_calls": calls.len()}))).chain(calls)
            })
            .collect()
    }

    #[test]
    fn a_coarse_score_standing_still_weighs_a_third_while_the_calls_get_somewhere_new() {
        // One plan step takes eight turns: new code read, a test run failing differently
        // after each edit. Nothing to say.
        let mut steps = vec![0.0; 8];
        steps.push(0.34);
        let working = turns_with_calls(&steps, |i| call("shell", json!({"cmd": "pytest"}), words(i)));
        assert!(run(&working).is_empty());
        // A score that stands still three times as long ends the session whatever the
        // calls find: warned at the 9th flat report, ended at the 18th.
        let endless = turns_with_calls(&[0.0; 24], |i| call("read", json!({"file": i}), words(i)));
        assert_eq!(of(&endless, NoProgress), vec![(18, Level::Warning), (36, Level::Terminate)]);
        // The same call and answer each turn: every report after the second stands still
        // in full (`repeat` would end this first: it runs in `warn` mode here).
        let stuck = turns_with_calls(&steps, |_| call("shell", json!({"cmd": "pytest"}), json!("2 failed")));
        assert_eq!(
            of_alone(&stuck, NoProgress),
            vec![(8, Level::Warning), (14, Level::Terminate)]
        );
    }

    #[test]
    fn new_questions_with_answers_the_window_had_are_nowhere_new() {
        // A new pattern each turn, the same "No matches found."; a knob turned each turn
        // ("Applied 1 edit"), the same failure in another time. Stale in full.
        let patterns = turns_with_calls(&[0.2; 8], |i| {
            call("grep", json!({"pattern": format!("handler_{i}")}), json!("No matches found."))
        });
        assert_eq!(
            of_alone(&patterns, NoProgress),
            vec![(8, Level::Warning), (14, Level::Terminate)]
        );
        let knob = turns(&[0.2; 8], |i| {
            vec![
                call("edit_file", json!({"old": format!("timeout={i}"), "new": format!("timeout={}", i + 1)}), json!("Applied 1 edit")),
                call("run_tests", json!({}), json!(format!("FAILED test_sync - TimeoutError after {}.{}s", 3 + i, i))),
            ]
        });
        assert_eq!(
            of_alone(&knob, NoProgress),
            vec![(12, Level::Warning), (21, Level::Terminate)]
        );
        // An empty output is news to a new question (`mkdir`, `cp`): a third each.
        let silent = turns_with_calls(&[0.2; 8], |i| call("bash", json!({"cmd": format!("mkdir d{i}")}), json!("")));
        assert!(of(&silent, NoProgress).is_empty());
    }

    #[test]
    fn a_job_waited_on_that_moves_is_progress() {
        // `sleep 60`, then the CI run's status, each after a model call of its own, under
        // a flat score: the run moves at each check, the sleep lets it. Once the run
        // stops moving, each check weighs in full.
        let rounds = |status: fn(usize) -> String| -> Vec<Value> {
            (0..12)
                .flat_map(|i| {
                    [
                        llm(json!({"progress": 0.5, "tool_calls": 1})),
                        call("Bash", json!({"command": "sleep 60"}), json!("")),
                        llm(json!({"progress": 0.5, "tool_calls": 1})),
                        call("Bash", json!({"command": "gh run view 42"}), json!(status(i))),
                    ]
                })
                .collect()
        };
        assert!(of(&rounds(|i| format!("in_progress: {i} of 12 jobs done")), NoProgress).is_empty());
        assert_eq!(
            of_alone(&rounds(|_| "in_progress: 3 of 12 jobs done".into()), NoProgress),
            vec![(16, Level::Warning), (28, Level::Terminate)]
        );
    }

    #[test]
    fn a_turn_that_acts_is_judged_by_its_actions_beside_a_moving_check() {
        // Each turn: the service's status (its uptime ticking), then the same deploy
        // failing the same way. The status moves; the agent gets nowhere.
        let evs = turns(&[0.4; 8], |i| {
            vec![
                call("health_status", json!({"svc": "api"}), json!(format!("healthy, uptime {}s", 3600 + 47 * i))),
                call("deploy", json!({"env": "prod", "tag": "v2.3.1"}), json!("deployed: 0 of 3 replicas updated, manifest rejected")),
            ]
        });
        assert_eq!(
            of_alone(&evs, NoProgress),
            vec![(12, Level::Warning), (21, Level::Terminate)]
        );
    }

    #[test]
    fn a_pending_word_in_prose_is_no_job_moving() {
        // The same task dispatched again and again, its worker answering in new words,
        // one of them "waiting": no check on a job, an action answered anew (a third).
        let evs = turns_with_calls(&[0.6; 20], |i| {
            let answer = format!("{} still waiting for the ledger entry", words(i).as_str().unwrap());
            call("Task", json!({"prompt": "reconcile the ledger"}), json!(answer))
        });
        assert_eq!(
            of_alone(&evs, NoProgress),
            vec![(18, Level::Warning), (36, Level::Terminate)]
        );
    }

    #[test]
    fn a_failing_check_is_no_job_moving() {
        // A status tool failing each turn with a counter in its error: no job moving
        // (as for `poll_no_progress`), and nowhere new up to digits.
        let evs = turns_with_calls(&[0.3; 10], |i| {
            let mut failing = call("job_status", json!({"id": 7}), json!(format!("job 7 not running (attempt {i})")));
            failing["is_error"] = json!(true);
            failing
        });
        assert_eq!(
            of_alone(&evs, NoProgress),
            vec![(8, Level::Warning), (14, Level::Terminate)]
        );
    }

    #[test]
    fn reports_beside_the_turn_with_no_call_since_weigh_a_third() {
        // A parent delegating each step to a sub-agent (whose calls are in its own
        // session): its turn, three `subagent` calls, then the delegation's answer; the
        // score moves every third step. Nudged, never ended.
        let steps = |reported: &str| -> Vec<Value> {
            (0..9)
                .flat_map(|step| {
                    let p = 0.1 * (step / 3) as f64;
                    let sub = || llm(json!({"progress": p, "call_kind": reported}));
                    [
                        llm(json!({"progress": p, "tool_calls": 1})),
                        sub(),
                        sub(),
                        sub(),
                        call("task", json!({"step": step}), words(step)),
                    ]
                })
                .collect()
        };
        assert_eq!(
            of(&steps("subagent"), NoProgress),
            vec![(11, Level::Warning), (26, Level::Warning), (41, Level::Warning)]
        );
        // The same reports as turns without calls (an agent only talking): in full.
        assert_eq!(
            of_alone(&steps("turn"), NoProgress),
            vec![(3, Level::Warning), (8, Level::Terminate)]
        );
    }

    #[test]
    fn stale_reports_read_in_thirds() {
        assert_eq!(super::in_thirds(0), "0");
        assert_eq!(super::in_thirds(2), "⅔");
        assert_eq!(super::in_thirds(9), "3");
        assert_eq!(super::in_thirds(13), "4⅓");
    }
}

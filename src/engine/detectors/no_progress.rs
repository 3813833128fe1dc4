//! `no_progress`: the runtime's own progress score (`progress` on `cost.attributed`) has
//! not improved on its best for several reports.
//!
//! The most direct signal there is, where a runtime has one (a test pass rate, a plan's
//! completed steps). Warn after 3 reports without improvement, terminate after 6.
//! Sessions that do not report progress are never judged.
//!
//! A report counts as stale only when the last turn's tool calls got nowhere new either
//! (no answer, up to digits, that the window had not seen from the same call): a score kept in coarse steps (a plan's steps,
//! reported at every model call) stands still for the many calls one step takes, while
//! the agent reads new code and its test run fails differently after each edit. Progress
//! is also what the agent sees; the score ends the session once both stand still.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, LlmContext, Message, Reading, SessionView, Signal, num};
use crate::engine::levels::Levels;
use crate::engine::trajectory::{RunState};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoProgress {}

/// The best progress the run reported, and the reports since that did not pass it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub best: Option<f64>,
    pub stale: u32,
}

impl Detector for NoProgress {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a LlmContext<'a>;
    type State = Progress;

    fn observe(&self, own: &mut Progress, run: &RunState, input: &Input<'_>) {
        let Some(l) = input.llm() else { return };
        let Some(p) = l.progress else { return };
        match own.best {
            Some(best) if p <= best => {
                if !run.new_answer_in_last(l.calls_since_turn) {
                    own.stale += 1;
                }
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
            .then(|| Signal::of(st.own.stale as f64, levels))
    }

    fn describe(&self, st: &SessionView<'_, Self::State>, _: &LlmContext, r: Reading, ev: &mut Evidence) -> Message {
        let best = st.own.best.map(num).unwrap_or_default();
        ev.insert("best_progress".into(), best);
        Message::new(
            format!("progress has not improved for {} reports", r.count()),
            "your progress has not improved for a while; change the approach or report what blocks you",
        )
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
            .map(|p| llm(json!({"progress": p, "call_kind": "summary"})))
            .collect()
    }

    #[test]
    fn warns_at_3_and_terminates_at_6_stale_reports() {
        let evs = reports(&[0.5, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4]);
        assert!(of(&first(&evs, 3), NoProgress).is_empty());
        assert_eq!(
            of(&evs, NoProgress),
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
        (progress.iter().enumerate())
            .flat_map(|(i, p)| [llm(json!({"progress": p, "tool_calls": 1})), call(i)])
            .collect()
    }

    #[test]
    fn a_coarse_score_standing_still_is_no_stall_while_the_calls_get_somewhere_new() {
        // One plan step takes eight turns: new code read, a test run failing differently
        // after each edit. Then the same turns with the same call and answer each time.
        let steps = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.34];
        let working = turns_with_calls(&steps, |i| call("shell", json!({"cmd": "pytest"}), words(i)));
        assert!(run(&working).is_empty());
        let stuck = turns_with_calls(&steps, |_| call("shell", json!({"cmd": "pytest"}), json!("2 failed")));
        // The first call's answer is new; the reports after the second one stand still
        // (`repeat` would end this first: it runs in `warn` mode here).
        assert_eq!(
            of_alone(&stuck, NoProgress),
            vec![(8, Level::Warning), (14, Level::Terminate)]
        );
    }
}

//! `no_progress`: the runtime's own progress score (`progress` on `cost.attributed`) has
//! not improved on its best for several reports.
//!
//! The most direct signal there is, where a runtime has one (a test pass rate, a plan's
//! completed steps). Warn after 3 reports without improvement, terminate after 6.
//! Sessions that do not report progress are never judged.

use serde::{Deserialize, Serialize};

use super::{num, Class, Detector, Evidence, LlmContext, Message, Reading, Signal};
use crate::engine::policy::Levels;
use crate::engine::state::SessionState;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoProgress {}

impl Detector for NoProgress {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a LlmContext;

    fn default_levels() -> Levels {
        Levels::new(Some(3.0), None, Some(6.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionState, l: &LlmContext) -> Option<Signal> {
        l.has_progress
            .then(|| Signal::of(st.run.progress_stale as f64, levels))
    }

    fn describe(&self, st: &SessionState, _: &LlmContext, r: Reading, ev: &mut Evidence) -> Message {
        let best = st.run.best_progress.map(num).unwrap_or_default();
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
    use crate::engine::policy::Level;

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
}

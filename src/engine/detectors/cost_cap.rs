//! `cost_cap`: a ceiling on a session's attributed spend (`cost_usd`, all runs).
//!
//! The budget pattern every team already runs by hand: warn at 80 %, be critical at 90 %,
//! stop at the limit (default 10.00 USD). A session that never sends `cost_usd` is never
//! judged: its spend is not guessed.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal};
use crate::engine::levels::Levels;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostCap {}

impl Detector for CostCap {
    const CLASS: Class = Class::Budget;
    type On<'a> = Input<'a>;
    type State = ();

    fn default_levels() -> Levels {
        Levels::budget(10.0)
    }

    fn evaluate(&self, levels: &Levels, state: &SessionView<'_, Self::State>, _: Input<'_>) -> Option<Signal> {
        let s = &state.stats;
        s.has_cost.then(|| Signal::of(s.cost_usd, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, _: Input<'_>, r: Reading, _: &mut Evidence) -> Message {
        let (v, limit) = (r.value, r.threshold);
        Message::new(
            format!("cost {v:.2} USD in the session (limit {limit:.2})"),
            format!("this session has spent {v:.2} USD of its {limit:.2} USD budget; finish with what you have"),
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::CostCap;
    use crate::engine::levels::Level;

    #[test]
    fn warns_at_8_critical_at_9_terminates_at_10_usd() {
        let evs: Vec<Value> = [7.99, 0.01, 1.0, 0.5, 0.5]
            .iter()
            .map(|c| llm(json!({"cost_usd": c})))
            .collect();
        assert_eq!(
            of(&evs, CostCap),
            vec![(1, Level::Warning), (2, Level::Critical), (4, Level::Terminate)]
        );
    }

    #[test]
    fn sessions_without_cost_are_not_judged() {
        let evs: Vec<Value> = (0..3)
            .map(|_| llm(json!({"input_tokens": 900_000, "output_tokens": 0})))
            .collect();
        assert!(of(&evs, CostCap).is_empty());
    }
}

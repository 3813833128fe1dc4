//! `low_novelty`: too few distinct (action, result) pairs among the last calls —
//! below `min_ratio` of `last_calls` (default: under 0.34 of the last 8).
//!
//! Catches the loop that has no strict shape: three or four calls reshuffled, each
//! returning what it returned before. Action and result count together: a call that
//! returns something new is novel. It only warns, once per episode. Polls are ignored.

use serde::{Deserialize, Serialize};

use super::settings::{Bounded, Share};
use super::{num, Class, Detector, Evidence, Message, Reading, Signal, ToolContext};
use crate::engine::policy::Levels;
use crate::engine::state::{SessionState, WINDOW_CALLS};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LowNovelty {
    /// How many recent calls it looks at (at most the window).
    pub last_calls: Bounded<2, { WINDOW_CALLS as u64 }>,
    /// Distinct share below which the calls are "not novel".
    pub min_ratio: Share,
}

impl Default for LowNovelty {
    fn default() -> Self {
        LowNovelty {
            last_calls: Bounded::new(8),
            min_ratio: Share::new(0.34),
        }
    }
}

impl Detector for LowNovelty {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a ToolContext<'a>;

    fn default_levels() -> Levels {
        Levels::new(Some(1.0), None, None)
    }

    fn evaluate(&self, levels: &Levels, _: &SessionState, t: &ToolContext) -> Option<Signal> {
        if t.obs.poll || (t.facts.recent_len as usize) < self.last_calls.get() {
            return None;
        }
        let ratio = t.facts.recent_distinct as f64 / t.facts.recent_len as f64;
        Some(Signal::flag(ratio < self.min_ratio.get(), levels))
    }

    fn describe(&self, _: &SessionState, t: &ToolContext, _: Reading, ev: &mut Evidence) -> Message {
        let (distinct, calls) = (t.facts.recent_distinct, t.facts.recent_len);
        ev.insert("distinct".into(), distinct.into());
        ev.insert("calls".into(), calls.into());
        ev.insert("ratio".into(), num(distinct as f64 / calls.max(1) as f64));
        Message::new(
            format!("only {distinct} distinct call/result pairs among the last {calls} calls"),
            "your recent tool calls keep returning what you already have; try a different source or approach",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::LowNovelty;
    use crate::engine::policy::Level;

    fn two_pairs(n: usize) -> Vec<Value> {
        (0..n)
            .map(|i| {
                if i % 4 == 0 {
                    call("a", json!(1), json!(1))
                } else {
                    call("b", json!(2), json!(2))
                }
            })
            .collect()
    }

    #[test]
    fn fires_below_a_third_distinct() {
        let cfg = "[detectors.repeat]\nmode = \"shadow\"\n";
        assert!(of_with(cfg, &two_pairs(7), LowNovelty).is_empty(), "7 < 8 calls");
        assert_eq!(
            of_with(cfg, &two_pairs(8), LowNovelty),
            vec![(7, Level::Warning)]
        );
    }

    #[test]
    fn three_distinct_pairs_of_eight_are_enough() {
        let evs: Vec<Value> = (0..12)
            .map(|i| call("t", json!(i % 3), json!(i % 3)))
            .collect();
        let cfg = "[detectors.cycle]\nmode = \"shadow\"\n";
        assert!(of_with(cfg, &evs, LowNovelty).is_empty(), "3/8 >= 0.34");
    }
}

//! `low_novelty`: too few distinct (action, result) pairs among the last calls —
//! below `min_ratio` of `last_calls` (default: under 0.34 of the last 8).
//!
//! Catches the loop that has no strict shape: three or four calls reshuffled, each
//! returning what it returned before. Action and result count together: a call that
//! returns something new is novel. It only warns, once per episode. Polls are ignored.

use serde::{Deserialize, Serialize};

use super::settings::{Bounded, Share};
use super::{Class, Detector, Evidence, Message, Reading, SessionView, Signal, ToolContext, num};
use crate::engine::levels::Levels;
use crate::engine::trajectory::{RunState, WINDOW_CALLS};

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

impl LowNovelty {
    /// Distinct (action, result) pairs among the last `last_calls` non-poll calls of the
    /// window (the latest included), and how many such calls there were.
    fn recent(&self, run: &RunState) -> (u32, u32) {
        let mut recent = [(0u64, 0u64); WINDOW_CALLS];
        let want = self.last_calls.get().min(WINDOW_CALLS);
        let mut len = 0;
        for call in run.window.iter().rev().filter(|c| !c.is_poll()) {
            if len == want {
                break;
            }
            recent[len] = (call.action, call.result);
            len += 1;
        }
        (distinct_pairs(&recent[..len]), len as u32)
    }
}

/// How many distinct pairs `pairs` holds. The window is short (8 calls by default):
/// comparing each pair with the ones before it costs less than sorting a copy, up to
/// the window's 30.
fn distinct_pairs(pairs: &[(u64, u64)]) -> u32 {
    let mut distinct = 0;
    for (i, p) in pairs.iter().enumerate() {
        distinct += u32::from(!pairs[..i].contains(p));
    }
    distinct
}

impl Detector for LowNovelty {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a ToolContext<'a>;
    type State = ();

    fn default_levels() -> Levels {
        Levels::new(Some(1.0), None, None)
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, t: &ToolContext) -> Option<Signal> {
        if t.obs.poll {
            return None;
        }
        let (distinct, calls) = self.recent(st.run);
        if (calls as usize) < self.last_calls.get() {
            return None;
        }
        let ratio = distinct as f64 / calls as f64;
        Some(Signal::flag(ratio < self.min_ratio.get(), levels))
    }

    fn describe(&self, st: &SessionView<'_, Self::State>, _: &ToolContext, _: Reading, ev: &mut Evidence) -> Message {
        let (distinct, calls) = self.recent(st.run);
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
    proptest::proptest! {
        /// The count without sorting is the number of distinct pairs (as a set counts
        /// them), for windows up to the longest with few values (so pairs recur).
        #[test]
        fn distinct_pairs_counts_a_set(
            pairs in proptest::collection::vec((0u64..4, 0u64..3), 0..=super::WINDOW_CALLS)
        ) {
            let set: std::collections::BTreeSet<_> = pairs.iter().collect();
            proptest::prop_assert_eq!(super::distinct_pairs(&pairs) as usize, set.len());
        }
    }

    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::LowNovelty;
    use crate::engine::levels::Level;

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

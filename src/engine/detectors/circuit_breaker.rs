//! `circuit_breaker`: a global ceiling on wasted calls — calls that repeated an earlier
//! (action, result) pair — among the recent calls, whatever the actions.
//!
//! The loop detectors each follow one shape; an agent can waste calls in a shape none of
//! them names (several loops interleaved). Default: terminate at 30 no-progress calls
//! among the last 64 (the state keeps one bit per call, so at most 64; 30 of 30 could
//! not be told from `repeat`).

use serde::{Deserialize, Serialize};

use super::settings::Bounded;
use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal, ToolContext};
use crate::engine::levels::Levels;
use crate::engine::trajectory::{fixed, RunState};

/// The most calls the breaker can look back over (one bit per call in state).
pub const MAX_WINDOW: u64 = 64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CircuitBreaker {
    /// How many recent calls it looks at.
    pub window_calls: Bounded<1, MAX_WINDOW>,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker {
            window_calls: Bounded::new(MAX_WINDOW),
        }
    }
}

/// The recent calls, one bit each (newest = bit 0): the call repeated a pair seen in the
/// window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wasted {
    #[serde(with = "fixed::u64")]
    pub bits: u64,
}

impl Detector for CircuitBreaker {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a ToolContext<'a>;
    type State = Wasted;

    fn observe(&self, own: &mut Wasted, run: &RunState, input: &Input<'_>) {
        if let Some(t) = input.tool() {
            // A poll's unchanged answer is `poll_no_progress`'s to judge, with the room
            // polls get: a job's status queued for an hour, read between `sleep`s, wastes
            // no call, nor does a sleep. A call taken for a poll only for following a wait
            // still counts (its room is its own; a loop of clicks and waits is bounded).
            // Nor does a `Next page` click whose answer is the same while the page read
            // after it last time showed new lines: paging (see `RunState::repeat_paged`;
            // a repeat that may have paged is counted).
            let judged_as_poll = t.obs.poll && !t.obs.after_wait;
            let wasted = t.facts.pair_count > 1 && !judged_as_poll && !run.repeat_paged();
            own.bits = (own.bits << 1) | u64::from(wasted);
        }
    }

    fn default_levels() -> Levels {
        Levels::new(None, None, Some(30.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, _: &ToolContext) -> Option<Signal> {
        let w = self.window_calls.get();
        let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
        let wasted = (st.own.bits & mask).count_ones();
        Some(Signal::of(wasted as f64, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, _: &ToolContext, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("{} of the recent tool calls repeated an earlier call and result", r.count()),
            "most of your recent tool calls repeated earlier ones without new results; stop and report what blocks you",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::CircuitBreaker;
    use crate::engine::levels::Level;

    #[test]
    fn terminates_at_30_no_progress_calls_in_64() {
        // Pairs rotating with unchanged results, padded with fresh calls so that no
        // shorter-range detector fires first.
        let cfg = "mode = \"shadow\"\n[detectors.circuit_breaker]\nmode = \"enforce\"\n";
        let mut evs = Vec::new();
        for i in 0..40 {
            evs.push(call("r", json!(i % 4), json!(i % 4)));
            evs.push(call("fresh", json!(i), json!(i)));
        }
        // Calls 8, 10, 12, … are the repeats; the 30th such call is at index 66.
        assert!(of_with(cfg, &first(&evs, 66), CircuitBreaker).is_empty());
        assert_eq!(
            of_with(cfg, &evs, CircuitBreaker),
            vec![(66, Level::Terminate)]
        );
    }

    #[test]
    fn a_shorter_window_sees_fewer_wasted_calls() {
        let cfg = "mode = \"shadow\"\n[detectors.circuit_breaker]\nmode = \"enforce\"\nwindow_calls = 40\n";
        let mut evs = Vec::new();
        for i in 0..60 {
            evs.push(call("r", json!(i % 4), json!(i % 4)));
            evs.push(call("fresh", json!(i), json!(i)));
        }
        // Every other call is wasted: 20 in 40, never 30.
        assert!(of_with(cfg, &evs, CircuitBreaker).is_empty());
    }

    #[test]
    fn a_click_that_pages_wastes_no_call() {
        // `Next page` answers the same each time; the page read after it is new, so 40
        // pages waste nothing. A dead `Next page` (the same page each time) wastes both.
        let cfg = "mode = \"shadow\"\n[detectors.circuit_breaker]\nmode = \"enforce\"\n";
        assert!(of_with(cfg, &pages(40, new_rows, None), CircuitBreaker).is_empty());
        // (From the second click on: the 30th wasted call is the 32nd call.)
        let found = of_with(cfg, &pages(40, |_| new_rows(0), None), CircuitBreaker);
        assert_eq!(found, vec![(31, Level::Terminate)], "{found:?}");
    }
}

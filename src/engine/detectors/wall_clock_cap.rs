//! `wall_clock_cap`: a ceiling on a session's duration in event time (first event to
//! the latest), never the host's clock, so a replay judges it as the bus did.
//!
//! Catches a session that stays alive for hours, whatever it is doing. Default 4 hours
//! (warnings at 80 % and 90 %).

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal};
use crate::engine::levels::Levels;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WallClockCap {}

impl Detector for WallClockCap {
    const CLASS: Class = Class::Budget;
    type On<'a> = Input<'a>;
    type State = ();

    fn default_levels() -> Levels {
        Levels::budget(4.0 * 3600.0)
    }

    fn evaluate(&self, levels: &Levels, state: &SessionView<'_, Self::State>, _: Input<'_>) -> Option<Signal> {
        Some(Signal::of(state.wall_seconds(), levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, _: Input<'_>, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("session running for {} s (limit {} s)", r.count(), r.limit()),
            "this session has been running for a long time; finish the task or report what blocks you",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::WallClockCap;
    use crate::engine::levels::Level;

    #[test]
    fn uses_event_time() {
        let evs = vec![
            json!({"type": "session.started", "timestamp": "2026-01-01T00:00:00Z"}),
            json!({"type": "session.started", "timestamp": "2026-01-01T03:11:59Z", "event_id": "x"}),
            json!({"type": "session.started", "timestamp": "2026-01-01T03:13:00Z", "event_id": "y"}),
            json!({"type": "session.started", "timestamp": "2026-01-01T04:00:00Z"}),
        ];
        // session_gap must exceed the spacing or the session closes in between.
        let w = of_with(
            "[engine]\nsession_gap_secs = 20000\n",
            &evs,
            WallClockCap,
        );
        assert_eq!(w, vec![(2, Level::Warning), (3, Level::Terminate)]);
    }

    fn started(at: &str) -> serde_json::Value {
        json!({"type": "session.started", "timestamp": at})
    }

    /// An event of another session at `at`: the stream's clock reads `at` from it on.
    fn clock_at(at: &str) -> serde_json::Value {
        json!({"type": "session.started", "timestamp": at, "session_id": "other"})
    }

    #[test]
    fn a_first_event_from_a_clock_hours_behind_is_no_duration() {
        // A runtime stamping local time (UTC-5) as UTC sent the session's first event and
        // every other one; the gateway, on time, the rest. Five hours of skew read as a
        // span stopped it at its second event.
        let evs = vec![
            clock_at("2026-01-01T10:00:00Z"),
            started("2026-01-01T05:00:00Z"),
            started("2026-01-01T10:00:05Z"),
            started("2026-01-01T05:00:10Z"),
            started("2026-01-01T10:00:15Z"),
        ];
        assert_eq!(of(&evs, WallClockCap), vec![]);
    }

    #[test]
    fn after_a_break_in_its_clock_a_session_is_timed_from_the_break() {
        // The stream's clock is ahead of the whole session (a backlog, a session
        // recorded earlier): it stays open across its own gaps.
        let mut evs = vec![
            clock_at("2026-01-01T12:00:00Z"),
            started("2026-01-01T00:00:00Z"),
            started("2026-01-01T00:20:00Z"),
            started("2026-01-01T06:00:00Z"),
        ];
        let w = of_with("[engine]\nsession_gap_secs = 30000\n", &evs, WallClockCap);
        assert_eq!(w, vec![(3, Level::Terminate)], "a gap within the session gap is no break");
        // With a gap of an hour, 06:00 is a break: 20 minutes before it count, and what
        // follows it.
        evs.extend(
            ["06:50", "07:40", "08:30", "08:55", "09:20", "09:41"]
                .map(|t| started(&format!("2026-01-01T{t}:00Z"))),
        );
        let w = of_with("[engine]\nsession_gap_secs = 3600\n", &evs, WallClockCap);
        // 20 min + 2 h 55 min at 08:55 (80 %), + 3 h 20 min at 09:20 (90 %), + 3 h 41 min.
        assert_eq!(
            w,
            vec![(7, Level::Warning), (8, Level::Critical), (9, Level::Terminate)]
        );
    }
}

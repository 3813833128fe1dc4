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
}

//! `depth_cap`: sub-agent nesting (`depth`; fires when the depth reaches the value).
//!
//! Decomposition must stay bounded: an agent that delegates to a sub-agent that
//! delegates again… never does the work. Warn at depth 4, terminate at 5.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal};
use crate::engine::levels::Levels;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DepthCap {}

impl Detector for DepthCap {
    const CLASS: Class = Class::Ceiling;
    type On<'a> = Input<'a>;
    type State = ();

    fn default_levels() -> Levels {
        Levels::new(Some(4.0), None, Some(5.0))
    }

    fn evaluate(&self, levels: &Levels, _: &SessionView<'_, Self::State>, input: Input<'_>) -> Option<Signal> {
        input.depth.map(|d| Signal::of(d as f64, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, _: Input<'_>, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("sub-agent depth {} (limit {})", r.count(), r.limit()),
            "sub-agents are nested very deep; do the work here instead of delegating again",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::DepthCap;
    use crate::engine::levels::Level;

    #[test]
    fn fires_at_the_depth() {
        let evs = vec![
            json!({"type": "session.started", "depth": 3}),
            json!({"type": "session.started", "depth": 4}),
            json!({"type": "session.started", "depth": 5}),
        ];
        assert_eq!(
            of(&evs, DepthCap),
            vec![(1, Level::Warning), (2, Level::Terminate)]
        );
    }
}

//! `no_new_information`: consecutive turns whose tool results were all seen before in the
//! run (information gain).
//!
//! An agent that keeps getting back what it already knows has stopped learning about its
//! task, even when its actions vary. The turn is judged when the next one starts. Warn at
//! 2 such turns in a row, critical at 3; never a kill. Polls count neither as new nor as
//! old news.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, LlmContext, Message, Reading, Signal};
use crate::policy::Levels;
use crate::state::SessionState;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoNewInformation {}

impl Detector for NoNewInformation {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a LlmContext;

    fn default_levels() -> Levels {
        Levels::new(Some(2.0), Some(3.0), None)
    }

    fn evaluate(&self, levels: &Levels, st: &SessionState, l: &LlmContext) -> Option<Signal> {
        l.is_turn
            .then(|| Signal::of(st.run.no_new_info_streak as f64, levels))
    }

    fn describe(&self, _: &SessionState, _: &LlmContext, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("{} turns in a row whose tool results were all seen before", r.count()),
            "your recent tool calls only returned things you had already seen; look somewhere new",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::detectors::testing::*;
    use crate::detectors::DetectorKind::NoNewInformation;
    use crate::policy::Level;

    #[test]
    fn counts_turns_of_old_results() {
        let mut evs = vec![
            turn(1, "t0"),
            call("read", json!(1), json!("A")),
            call("read", json!(2), json!("B")),
        ];
        for i in 0..4 {
            evs.push(turn(1, &format!("turn {i}")));
            evs.push(call(
                "read",
                json!(i % 2 + 1),
                json!(if i % 2 == 0 { "A" } else { "B" }),
            ));
        }
        evs.push(turn(1, "last"));
        // Turn events at 3, 5, 7, 9, 11 judge the turns before them.
        assert!(of(&first(&evs, 7), NoNewInformation).is_empty());
        assert_eq!(
            of(&evs, NoNewInformation),
            vec![(7, Level::Warning), (9, Level::Critical)]
        );
    }
}

//! `generic_repeat`: the same action again and again in the window, whatever it returned.
//!
//! Arguments alone never kill: a call whose result keeps changing may be progress (a
//! build re-run after each edit). But an agent that runs the same command ten times in
//! thirty calls should hear about it, so it warns at 10 and goes critical at 20; it has no
//! termination. The episode follows the one action that is repeating, so a second
//! action repeated later does not ride on the first one's count. Polls are ignored.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Message, Reading, SessionView, Signal, ToolContext, recent_calls};
use crate::engine::levels::Levels;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenericRepeat {}

impl Detector for GenericRepeat {
    const CLASS: Class = Class::ToolLoop;
    type On<'a> = &'a ToolContext<'a>;
    type State = ();

    fn default_levels() -> Levels {
        Levels::new(Some(10.0), Some(20.0), None)
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, t: &ToolContext) -> Option<Signal> {
        if t.obs.poll {
            return None;
        }
        // The episode follows the action that is repeating: while it is open, its
        // action's count in the window (the calls before this one and this one) holds it.
        let subject_count = if st.subject == 0 {
            0
        } else {
            let calls = st.run.window.iter().chain(t.facts.departed.iter());
            calls.filter(|c| !c.is_poll() && c.action == st.subject).count() as u32
        };
        let count = t.facts.action_count.max(subject_count);
        Some(Signal {
            subject: Some(t.obs.action),
            ..Signal::of(count as f64, levels)
        })
    }

    fn describe(
        &self,
        st: &SessionView<'_, Self::State>,
        t: &ToolContext,
        r: Reading,
        ev: &mut Evidence,
    ) -> Message {
        let (tool, n) = (t.tool, r.count());
        ev.insert("recent".into(), recent_calls(st.run, 10));
        Message::new(
            format!("`{tool}` called with the same arguments {n} times in the last {} calls", st.run.window.len()),
            format!("you called `{tool}` with the same arguments {n} times recently; make sure each call moves the task forward"),
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::GenericRepeat;
    use crate::engine::levels::Level;

    #[test]
    fn warns_at_10_goes_critical_at_20_and_never_kills() {
        let evs: Vec<Value> = (0..25)
            .map(|i| call("exec", json!({"c": "date"}), words(i)))
            .collect();
        assert!(of(&first(&evs, 9), GenericRepeat).is_empty());
        let f = run(&evs);
        assert_eq!(
            only(&f, GenericRepeat),
            vec![(9, Level::Warning), (19, Level::Critical)]
        );
        assert!(f.iter().all(|x| x.2 != Level::Terminate));
    }

    #[test]
    fn polls_are_ignored() {
        let evs: Vec<Value> = (0..12)
            .map(|i| call("job_status", json!({"id": 1}), json!({"step": i})))
            .collect();
        assert!(of(&evs, GenericRepeat).is_empty());
    }
}

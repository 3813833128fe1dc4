//! `same_error`: different attempts rejected with the same error, again and again — the
//! same error in words, up to its digits (line numbers, counters), whatever the call.
//!
//! Varying an attempt that the environment rejects for one reason every time (a linter
//! refusing every edit, a shell receiving prose instead of a command, a missing binary)
//! is no progress, however different the attempts look. Working agents often get the
//! same rejection two or three times and then change approach, so it warns at the 3rd
//! such failure in a row and terminates at the 4th — and, like every loop detector, only
//! `grace_steps` after its warning. A failure that says nothing in words (an exit code
//! with an empty output: `grep` finding nothing) is no rejection to repeat. Tools classed
//! `retry_safe` are exempt, as from `error_repeat`.

use serde::{Deserialize, Serialize};

use super::{fp_hex, Class, Detector, Evidence, Message, Reading, Signal, ToolContext};
use crate::policy::Levels;
use crate::state::SessionState;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SameError {}

impl Detector for SameError {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a ToolContext<'a>;

    fn default_levels() -> Levels {
        Levels::new(Some(3.0), None, Some(4.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionState, t: &ToolContext) -> Option<Signal> {
        (!t.obs.retry_safe).then(|| Signal::of(st.run.same_error_streak as f64, levels))
    }

    fn describe(&self, _: &SessionState, t: &ToolContext, r: Reading, ev: &mut Evidence) -> Message {
        ev.insert("error".into(), fp_hex(u64::from(t.obs.shape)).into());
        Message::new(
            format!("{} failures in a row with the same error (last: `{}`)", r.count(), t.tool),
            "your different attempts all fail with the same error; read it and change the approach, not the details",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::detectors::testing::*;
    use crate::detectors::DetectorKind::SameError;
    use crate::policy::Level;

    /// A linter rejecting every edit the same way, up to its line numbers.
    fn rejected(n: usize) -> Vec<Value> {
        (0..n)
            .map(|i| {
                let mut e = fail("edit", json!({"patch": format!("attempt {}", words(i))}), None);
                e["result"] = json!(format!("syntax error at line {}: unexpected EOF", 40 + i));
                e
            })
            .collect()
    }

    #[test]
    fn warns_at_the_3rd_and_terminates_at_the_4th_same_error() {
        assert!(of(&rejected(2), SameError).is_empty());
        assert_eq!(
            of(&rejected(4), SameError),
            vec![(2, Level::Warning), (3, Level::Terminate)]
        );
    }

    #[test]
    fn a_different_error_or_a_success_starts_over() {
        let mut evs = rejected(2);
        evs.push(call("edit", json!({"patch": "right"}), json!("Changes applied")));
        evs.extend(rejected(2));
        evs.push(fail("edit", json!({"patch": "other"}), None));
        evs.extend(rejected(2));
        assert!(of(&evs, SameError).is_empty());
    }

    #[test]
    fn failures_that_say_nothing_are_not_the_same_error() {
        // `grep` finding nothing exits 1 with an empty output.
        let evs: Vec<Value> = (0..6)
            .map(|i| {
                let mut e = fail("bash", json!({"command": format!("grep {}", words(i))}), None);
                e["result"] = json!("<returncode>1</returncode>\n<output>\n</output>");
                e
            })
            .collect();
        assert!(of(&evs, SameError).is_empty());
    }
}

//! `same_error`: different attempts rejected with the same error, again and again — the
//! same error in words, up to its digits (line numbers, counters), whatever the call.
//!
//! Varying an attempt that the environment rejects for one reason every time (a linter
//! refusing every edit, a shell receiving prose instead of a command, a missing binary)
//! is no progress, however different the attempts look. Working agents often get the
//! same rejection two or three times and then change approach, so it warns at the 3rd
//! such failure in a row and terminates at the 4th — and, like every loop detector, only
//! `grace_steps` after its warning. The same rejection also counts in the run's window,
//! for a loop whose failures are interleaved with calls that work (edit a scratch file,
//! compile it, `javac: command not found`, again and again): 10 of the last 30 calls
//! failing the same way terminates, where working runs reach 5. A failure that says
//! nothing in words (an exit code with an empty output: `grep` finding nothing) is no
//! rejection to repeat. Tools classed `retry_safe` are exempt, as from `error_repeat`.

use serde::{Deserialize, Serialize};

use super::settings::Threshold;
use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal, ToolContext, fp_hex};
use crate::engine::levels::Levels;
use crate::engine::trajectory::RunState;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SameError {
    /// Terminates when the same error occurs this many times in the window, in a row or
    /// not.
    pub window_terminate_at: Threshold,
}

impl Default for SameError {
    fn default() -> Self {
        SameError {
            window_terminate_at: Threshold(Some(10.0)),
        }
    }
}

/// The episode subject of an error: its shape, never 0.
fn error_subject(t: &ToolContext) -> u64 {
    if t.facts.error_count > 0 {
        u64::from(t.obs.shape) | 1 << 32
    } else {
        0
    }
}

impl Detector for SameError {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a ToolContext<'a>;
    /// Failures in a row with the same error in words (up to digits), any action (a
    /// changed poll ends them).
    type State = u32;

    fn observe(&self, streak: &mut u32, run: &RunState, input: &Input<'_>) {
        let Some(t) = input.tool() else { return };
        let Some(this) = run.latest() else { return };
        *streak = match run.before_latest(1) {
            _ if t.facts.poll_moved => 0,
            Some(l) if t.obs.error_text && l.is_error() && l.shape == this.shape => *streak + 1,
            _ if t.obs.error_text => 1,
            _ => 0,
        };
    }

    fn default_levels() -> Levels {
        Levels::new(Some(3.0), None, Some(4.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, t: &ToolContext) -> Option<Signal> {
        if t.obs.retry_safe {
            return None;
        }
        Some(
            Signal::of(*st.own as f64, levels).or_window(
            levels,
                t.facts.error_count,
                self.window_terminate_at.get(),
                error_subject(t),
                st.subject,
            ),
        )
    }

    fn describe(&self, st: &SessionView<'_, Self::State>, t: &ToolContext, r: Reading, ev: &mut Evidence) -> Message {
        let (in_a_row, in_window) = (*st.own, t.facts.error_count);
        ev.insert("error".into(), fp_hex(u64::from(t.obs.shape)).into());
        ev.insert("in_a_row".into(), in_a_row.into());
        ev.insert("in_window".into(), in_window.into());
        let reason = if u64::from(in_a_row) >= r.limit() {
            format!("{in_a_row} failures in a row with the same error (last: `{}`)", t.tool)
        } else {
            format!("the same error {in_window} times in the last {} calls (last: `{}`)", st.run.window.len(), t.tool)
        };
        Message::new(
            reason,
            "your different attempts all fail with the same error; read it and change the approach, not the details",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::SameError;
    use crate::engine::levels::Level;

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
    fn the_same_error_interleaved_with_calls_that_work_terminates_at_10_in_the_window() {
        // Edit a scratch file (works), compile it (the same error), again and again.
        let mut evs = Vec::new();
        for i in 0..10 {
            evs.push(call("edit", json!({"text": words(i)}), json!(format!("File updated: {}", words(i)))));
            let mut e = fail("bash", json!({"command": format!("javac A{i}.java")}), None);
            e["result"] = json!(format!("/bin/bash: line {}: javac: command not found", 400 + 15 * i));
            evs.push(e);
        }
        assert!(of(&first(&evs, 18), SameError).is_empty(), "9 in the window");
        assert_eq!(of(&evs, SameError), vec![(19, Level::Terminate)]);
        // Under the grace, the termination waits for the error to come back once the
        // steps have passed: the edits in between neither end nor advance the episode.
        let with_grace = "[engine]\ngrace_steps = 1\n";
        assert_eq!(of_with(with_grace, &evs, SameError), vec![(19, Level::Critical)]);
        let mut more = evs.clone();
        more.push(turn(1, "again"));
        more.push(evs[0].clone());
        more.push(evs[19].clone());
        assert_eq!(
            of_with(with_grace, &more, SameError),
            vec![(19, Level::Critical), (22, Level::Terminate)]
        );
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

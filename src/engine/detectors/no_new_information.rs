//! `no_new_information`: consecutive turns whose tool calls all returned what the same
//! call had returned before in the run, or an answer with content that another call in
//! the window gave whole (information gain).
//!
//! An agent that keeps getting back what it already knows has stopped learning about its
//! task. Novelty is the (action, result) pair: a new file written answers "File updated"
//! like the last one, an empty output of a new command is an answer to a new question,
//! and both are progress; the same call answering the same thing again is not, nor is a
//! new call answered, word for word and digit for digit, with a page or a list another
//! call gave (a page parameter the API ignores, a rephrased search finding the very
//! same results). The turn
//! is judged when the next one starts. Warn at 3 such turns in a row, critical at 5,
//! never a kill: a final verification pass (re-running the same checks after a fix)
//! reads as 2–4 such turns in working sessions. Polls count neither as new nor as old
//! news.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, LlmContext, Message, Reading, SessionView, Signal};
use crate::engine::levels::Levels;
use crate::engine::trajectory::{RunState};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoNewInformation {}

/// Turns in a row whose calls told nothing new, and what the current turn's calls told
/// so far: any answer that counts, and all of them seen before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answers {
    pub streak: u32,
    pub turn_had_results: bool,
    pub turn_all_seen: bool,
}

impl Detector for NoNewInformation {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a LlmContext<'a>;
    type State = Answers;

    fn observe(&self, own: &mut Answers, _: &RunState, input: &Input<'_>) {
        if let Some(seen) = input.tool().and_then(|t| t.facts.news) {
            own.turn_had_results = true;
            own.turn_all_seen &= seen;
        } else if input.llm().is_some_and(|l| l.is_turn) {
            // The turn that just ended: were all of its tool results seen before?
            if own.turn_had_results {
                own.streak = if own.turn_all_seen { own.streak + 1 } else { 0 };
            }
            own.turn_had_results = false;
            own.turn_all_seen = true;
        }
    }

    fn default_levels() -> Levels {
        Levels::new(Some(3.0), Some(5.0), None)
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, l: &LlmContext) -> Option<Signal> {
        l.is_turn
            .then(|| Signal::of(st.own.streak as f64, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, _: &LlmContext, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("{} turns in a row whose calls returned nothing they had not returned before", r.count()),
            "your recent tool calls only returned things you had already seen; look somewhere new",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::NoNewInformation;
    use crate::engine::levels::Level;

    /// A first turn reading A and B, then `n` turns each re-reading one of them.
    fn rereading(n: usize) -> Vec<serde_json::Value> {
        let mut evs = vec![
            turn(1, "t0"),
            call("read", json!(1), json!("A")),
            call("read", json!(2), json!("B")),
        ];
        for i in 0..n {
            evs.push(turn(1, &format!("turn {i}")));
            evs.push(call(
                "read",
                json!(i % 2 + 1),
                json!(if i % 2 == 0 { "A" } else { "B" }),
            ));
        }
        evs.push(turn(1, "last"));
        evs
    }

    #[test]
    fn counts_turns_whose_calls_returned_what_they_returned_before() {
        // Turn events at 3, 5, 7, … judge the turns before them.
        let evs = rereading(6);
        assert!(of_alone(&first(&evs, 9), NoNewInformation).is_empty());
        assert_eq!(
            of_alone(&evs, NoNewInformation),
            vec![(9, Level::Warning), (13, Level::Critical)]
        );
    }

    #[test]
    fn a_new_call_with_an_answer_seen_before_is_news() {
        // Each turn writes another file and gets the same "File updated".
        let mut evs = vec![turn(1, "t0")];
        for i in 0..8 {
            evs.push(call("write", json!({"path": format!("f{}", words(i))}), json!("File updated")));
            evs.push(turn(1, &format!("turn {i}")));
        }
        assert!(of_alone(&evs, NoNewInformation).is_empty());
    }

    #[test]
    fn a_new_call_given_another_call_s_answer_whole_is_old_news() {
        // A page parameter the API ignores: each page asked for is the first page again.
        let page = json!((0..40)
            .map(|i| format!("Kyoto Ceramic Vase {} in stock at store {}", words(i), words(i + 3)))
            .collect::<Vec<_>>()
            .join("\n"));
        let mut evs = vec![turn(1, "t0")];
        for p in 1..=5 {
            evs.push(call("list_products", json!({"limit": 50, "page": p}), page.clone()));
            evs.push(turn(1, &format!("page {p} done")));
        }
        assert_eq!(of_alone(&evs, NoNewInformation), vec![(8, Level::Warning)]);
        // Pages that are pages: each its own lines.
        let mut paged = evs.clone();
        for p in 0..5 {
            paged[1 + 2 * p]["result"] = json!((0..40)
                .map(|i| format!("Aalto Side Table {} at store {}", words(8 * p + i), words(i)))
                .collect::<Vec<_>>()
                .join("\n"));
        }
        assert!(of_alone(&paged, NoNewInformation).is_empty());
        // A short answer is no page: another call's "no results" tells something new.
        let mut short = evs.clone();
        for p in 0..5 {
            short[1 + 2 * p]["result"] = json!("No products match the filter");
        }
        assert!(of_alone(&short, NoNewInformation).is_empty());
    }

    #[test]
    fn a_silent_call_repeated_is_neither_news_nor_old_news() {
        // Check a fix by undoing it: revert (silent), test (fails as at first), re-apply
        // (silent, as the first time), test (passes as before), then look at the diff.
        let silent = json!("<returncode>0</returncode>\n<output>\n</output>");
        let test = |out: &str| call("bash", json!({"command": "python t.py"}), json!(out));
        let mut evs = vec![turn(1, "t0"), test("FAIL"), turn(1, "fix")];
        evs.push(call("bash", json!({"command": "sed -i s/a/b/ f.py"}), silent.clone()));
        evs.extend([turn(1, "test"), test("PASS"), turn(1, "revert")]);
        evs.push(call("bash", json!({"command": "sed -i s/b/a/ f.py"}), silent.clone()));
        evs.extend([turn(1, "test"), test("FAIL"), turn(1, "re-apply")]);
        evs.push(call("bash", json!({"command": "sed -i s/a/b/ f.py"}), silent));
        evs.extend([turn(1, "test"), test("PASS"), turn(1, "diff")]);
        evs.extend([call("bash", json!({"command": "git diff"}), json!("+b")), turn(0, "done")]);
        assert!(of_alone(&evs, NoNewInformation).is_empty());
        // Had the re-applied write answered in words, that turn would be old news too.
        let mut worded = evs.clone();
        worded[11]["result"] = json!("File updated");
        worded[3]["result"] = json!("File updated");
        assert_eq!(of_alone(&worded, NoNewInformation), vec![(14, Level::Warning)]);
    }
}

//! `similar_turns`: consecutive turns whose text nearly repeats one of the previous 5
//! (Jaccard similarity of lowercased whitespace tokens ≥ `min_similarity`).
//!
//! An agent saying the same thing each turn ("I have verified the file and will now mark
//! the task complete") may be stuck even when its tool calls vary. The streak counts
//! repeated words with nothing learned since the first of them (a turn that brought new
//! content, paging through a file, starts it over): warn at the 3rd such turn, as the
//! seed does. Words alone never kill: the streak terminates (at 5) only when its turns
//! also made no progress: nothing new learned, no call with an outcome the window had not
//! seen (a changed status, a new price: digits count), and no poll waiting on a job
//! (an unchanged one is `poll_no_progress`'s to judge, with the room polls get). So an
//! agent narrating "still running, checking again" while its job moves is nudged, never
//! killed; one whose words and results both stand still is.
//! 0.85 leaves room for the few words that change between honest steps of a plan.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::settings::{Bounded, Share};
use super::{Class, Detector, Evidence, Input, LlmContext, Message, Reading, SessionView, Signal};
use crate::engine::levels::Levels;
use crate::engine::text::TextSketch;
use crate::engine::trajectory::{fixed, push_bounded, Did, Gained, RunState};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimilarTurns {
    /// Jaccard similarity at or above which two turns are "the same".
    pub min_similarity: Share,
    /// A turn that opens with the same words as one of the previous 5 (this many
    /// words), while calls were made since the last turn with text and every one failed
    /// (none a poll), counts as similar, and as no progress, too (0: off).
    pub opening_words: Bounded<0, 64>,
}

impl Default for SimilarTurns {
    fn default() -> Self {
        SimilarTurns {
            min_similarity: Share::new(0.85),
            opening_words: Bounded::new(8),
        }
    }
}

/// Sketches of previous turns kept.
pub const TURN_SKETCHES: usize = 5;

/// The run's recent turns with text and what happened since the latest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Turns {
    /// Turns in a row that nearly repeat an earlier turn, with nothing learned since the
    /// first of them.
    pub streak: u32,
    /// Of those, the turns in a row since which no call made progress (see
    /// `since_text`): only these may terminate.
    pub stale: u32,
    pub sketches: VecDeque<TextSketch>,
    /// How the previous turns opened (see [`crate::engine::text::opening`]), as many as
    /// `sketches`; 0 for a turn too short to have an opening.
    #[serde(with = "fixed::deque")]
    pub openings: VecDeque<u64>,
    /// What `sketches` and `openings` gained since the state was last written.
    #[serde(skip)]
    pub sketches_gained: Gained,
    #[serde(skip)]
    pub openings_gained: Gained,
    /// What the calls since the last turn with text did (bits of [`Did`]); turns
    /// without text, common with native tool use, pass it on.
    pub since_text: u8,
}

impl Detector for SimilarTurns {
    const CLASS: Class = Class::Loop;
    type On<'a> = &'a LlmContext<'a>;
    type State = Turns;

    fn observe(&self, own: &mut Turns, _: &RunState, input: &Input<'_>) {
        if let Some(t) = input.tool() {
            own.since_text |= t.facts.did;
            return;
        }
        let Some(l) = input.llm().filter(|l| l.is_turn) else { return };
        let Some(sketch) = l.sketch.filter(|s| !s.is_empty()) else { return };
        let since = std::mem::take(&mut own.since_text);
        let learned = since & Did::LEARNED != 0;
        let progressed = since & (Did::LEARNED | Did::PROGRESSED) != 0;
        // Alike as a whole, or opening as an earlier turn did while nothing got done
        // since (calls were made and each failed or showed lines the run had nearly
        // all seen, none of them a poll): the same apology or restatement before a
        // different body is still the agent saying it again.
        let nothing_done = since & (Did::SUCCEEDED | Did::POLLED) == 0
            && since & (Did::FAILED | Did::REREAD) != 0;
        let opens_alike = l
            .opening
            .is_some_and(|o| nothing_done && own.openings.contains(&o));
        let min_similarity = self.min_similarity.get();
        let similar = opens_alike
            || own
                .sketches
                .iter()
                .any(|prev| prev.similar_at_least(sketch, min_similarity));
        // The words repeat: the first such turn opens the streak whatever it learned,
        // the next ones count while they learn nothing new (a turn that opens as
        // before with nothing done learned nothing from its failures). Repeated words
        // may nudge; they end the session only while the results stand still too.
        own.streak = match (similar, learned && !opens_alike) {
            (false, _) => 0,
            (true, true) => 1,
            (true, false) => own.streak + 1,
        };
        own.stale = if similar && (!progressed || opens_alike) {
            own.stale + 1
        } else {
            0
        };
        push_bounded(&mut own.sketches, sketch.clone(), TURN_SKETCHES);
        own.sketches_gained.push();
        push_bounded(&mut own.openings, l.opening.unwrap_or(0), TURN_SKETCHES);
        own.openings_gained.push();
    }

    fn default_levels() -> Levels {
        Levels::new(Some(3.0), None, Some(5.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, l: &LlmContext) -> Option<Signal> {
        (l.is_turn && l.has_text).then(|| {
            let words = Signal::of(st.own.streak as f64, levels);
            let stale = st.own.stale as f64;
            if levels.terminate_at.is_some_and(|at| stale >= at - 1e-9) {
                return words;
            }
            // While the results progress the words may nudge, never end the session.
            let nudge_only = Levels {
                terminate_at: None,
                ..*levels
            };
            Signal::of(st.own.streak as f64, &nudge_only)
        })
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, _: &LlmContext, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("{} turns in a row nearly repeat an earlier turn", r.count()),
            "your last replies say nearly the same thing; move the task forward or say what blocks you",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::SimilarTurns;
    use crate::engine::levels::Level;

    /// Turns with `text`, each followed by a call whose result is `result(i)`.
    fn turns(
        n: usize,
        text: impl Fn(usize) -> String,
        result: impl Fn(usize) -> serde_json::Value,
    ) -> Vec<serde_json::Value> {
        let mut evs = Vec::new();
        for i in 0..n {
            evs.push(turn(1, &text(i)));
            evs.push(call("check", json!({"what": "status"}), result(i)));
        }
        evs
    }

    const SAME: &str = "I have verified the file and will now mark the task complete";

    #[test]
    fn warns_at_3_and_terminates_at_5() {
        // The same words each turn, and nothing new from the tools between them. The 2nd
        // turn (event 2) is the first similar one: it opens the streak though the call
        // before it brought news (its first answer); the 3rd similar turn (event 6) warns.
        let evs = turns(7, |_| SAME.to_string(), |_| json!("unchanged"));
        assert!(of_alone(&first(&evs, 6), SimilarTurns).is_empty());
        assert_eq!(
            of_alone(&evs, SimilarTurns),
            vec![(6, Level::Warning), (12, Level::Terminate)]
        );
    }

    #[test]
    fn the_seeds_trading_agent_is_nudged_at_its_3rd_similar_turn_and_not_killed_while_prices_move(
    ) {
        // The seed's example: the same sentence each turn while re-checking a price that
        // moves. Words alike: a nudge by the 3rd similar turn (event 6). Results still
        // changing: never a kill, however long it goes on.
        let text = |_| "I need to check the current price and make a trading decision".to_string();
        let price = |i: usize| json!({"symbol": "AAPL", "price": 187.32 + i as f64 * 0.41});
        let mut evs = Vec::new();
        for i in 0..12 {
            evs.push(turn(1, &text(i)));
            evs.push(call("get_price", json!({"symbol": "AAPL"}), price(i)));
        }
        assert_eq!(of_alone(&evs, SimilarTurns), vec![(6, Level::Warning)]);
    }

    #[test]
    fn a_job_whose_status_moves_is_nudged_never_killed_whatever_the_narration() {
        // "Still running; checking again" each turn while the job reports 10 % … 90 %:
        // a poll (its result reads as pending) whose result changes is progress.
        let mut evs = vec![
            turn(1, "I will start the training job now"),
            call("start_job", json!({"name": "train"}), json!({"job_id": "j1"})),
        ];
        for p in (10..=90).step_by(10) {
            evs.push(turn(1, "The job is still running; checking again."));
            evs.push(call(
                "get_job",
                json!({"job_id": "j1"}),
                json!({"state": "running", "progress": format!("{p}%")}),
            ));
        }
        let found = of_alone(&evs, SimilarTurns);
        assert_eq!(found, vec![(8, Level::Warning)], "a nudge, no kill");
        // The same narration over a job that no longer moves is a loop: the unchanged
        // polls are `poll_no_progress`'s (polls get room), while a call answering the
        // same each time lets the words end the session.
        let mut stuck = evs[..2].to_vec();
        for _ in 0..9 {
            stuck.push(turn(1, "The job is still running; checking again."));
            stuck.push(call("tail_log", json!({"job_id": "j1"}), json!("epoch 3 loss 0.41")));
        }
        assert_eq!(
            of_alone(&stuck, SimilarTurns),
            vec![(8, Level::Warning), (14, Level::Terminate)]
        );
    }

    #[test]
    fn a_turn_that_learned_something_is_progress_however_alike_the_words() {
        // Scrolling through a file: "let me scroll down" each turn, a new page each time.
        let evs = turns(8, |_| SAME.to_string(), words);
        assert!(of_alone(&evs, SimilarTurns).is_empty());
    }

    #[test]
    fn the_same_opening_while_every_call_fails_is_saying_it_again() {
        // "I apologize for the confusion..." then a different body each turn, and every
        // action rejected: the whole texts differ, the opening repeats while nothing gets
        // done. Warned at the 3rd such turn (event 6), killed two turns later.
        let text = |i: usize| {
            format!(
                "I apologize for the confusion in my previous answer. This time I will {}",
                words(i * 7)
            )
        };
        let mut evs = Vec::new();
        for i in 0..7 {
            evs.push(turn(1, &text(i)));
            evs.push(fail("EditCode", json!({"attempt": i}), Some("invalid_action")));
        }
        assert_eq!(
            of_alone(&evs, SimilarTurns),
            vec![(6, Level::Warning), (10, Level::Terminate)]
        );
        // The same openings over calls that work are an agent's habit, not a loop.
        let mut working = Vec::new();
        for i in 0..7 {
            working.push(turn(1, &text(i)));
            working.push(call("EditCode", json!({"attempt": i}), words(i)));
        }
        assert!(of_alone(&working, SimilarTurns).is_empty());
        // Off with opening_words = 0.
        let cfg = alone("similar_turns") + "opening_words = 0\n";
        assert!(of_with(&cfg, &evs, SimilarTurns).is_empty());
    }

    /// Nothing in `evs` terminates, under the defaults without grace.
    fn never_killed(evs: &[serde_json::Value]) {
        let kills: Vec<_> = run(evs)
            .into_iter()
            .filter(|f| f.2 == Level::Terminate)
            .collect();
        assert!(kills.is_empty(), "{kills:?}");
    }

    fn started_job() -> Vec<serde_json::Value> {
        vec![
            turn(1, "I will start the training job now"),
            call("start_job", json!({"name": "train"}), json!({"job_id": "j1"})),
        ]
    }

    #[test]
    fn turns_without_text_pass_on_what_their_calls_did() {
        // Native tool use: a turn with text and a poll that moves, then a turn without
        // text and a sleep, again and again. The poll's progress reaches the next turn
        // with text, and the sleep's same empty answer repeats nothing across it.
        let mut evs = started_job();
        for p in 0..12 {
            evs.push(turn(1, "The job is still running; I will wait and check it again."));
            let status = json!({"state": "running", "progress": format!("{}%", 5 * p)});
            evs.push(call("get_job_status", json!({"job_id": "j1"}), status));
            evs.push(llm(json!({"tool_calls": 1})));
            evs.push(call("bash", json!({"command": "sleep 30"}), json!("")));
        }
        never_killed(&evs);
    }

    #[test]
    fn a_poll_between_turns_that_open_alike_keeps_the_words_from_killing() {
        // A status poll that fails each time ("still running: N %") between turns that
        // open alike: waiting on a job is not "nothing done", so the opening rule stays
        // out (a failing poll whose only change is a number is the error detectors' to
        // judge: an error's numbers read as counters).
        let mut evs = started_job();
        for p in 1..12 {
            let text = format!("The job is still running, so I will check it again: {}", words(p));
            evs.push(turn(1, &text));
            let mut status = fail("get_job_status", json!({"job_id": "j1"}), None);
            status["result"] = json!(format!("job still running: {}% complete", 8 * p));
            evs.push(status);
        }
        let found = of_alone(&evs, SimilarTurns);
        assert!(found.iter().all(|f| f.1 != Level::Terminate), "{found:?}");
    }

    #[test]
    fn replies_that_open_alike_without_any_call_are_not_judged_on_their_openings() {
        // A chat agent that reports no tool calls at all: signals a session does not send
        // are not guessed, so its habit of opening replies alike is nothing.
        let evs: Vec<_> = (0..8)
            .map(|i| {
                let text = format!("Thank you for your patience, I understand what you need: {}", words(5 * i));
                llm(json!({ "text": text }))
            })
            .collect();
        assert!(of_alone(&evs, SimilarTurns).is_empty());
    }

    #[test]
    fn dissimilar_turns_are_not_counted() {
        let text = |i| format!("step {i}: {}", "word ".repeat(i + 1));
        let evs = turns(8, text, |_| json!("unchanged"));
        assert!(of_alone(&evs, SimilarTurns).is_empty());
        // ...unless the bar is lowered far enough.
        let cfg = alone("similar_turns") + "min_similarity = 0.05\n";
        assert!(!of_with(&cfg, &evs, SimilarTurns).is_empty());
    }
}

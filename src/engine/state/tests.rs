//! The session state's unit tests: bounds, the stored bytes, steps, the detectors'
//! counters, runs.

use super::*;
use crate::engine::content::ContentSample;
use crate::engine::detectors::similar_turns::TURN_SKETCHES;
use crate::engine::detectors::{Context, Detectors, Input, LlmContext, ToolContext};
use crate::engine::text::TextSketch;
use crate::engine::trajectory::{
    CallRecord, PollTracker, ToolFacts, ToolObservation, MAX_NAMED_TOOLS, POLL_TRACKERS,
    SEEN_PAIRS, WINDOW_CALLS,
};

/// A tool call applied as the engine applies it: the trajectory, then every detector's
/// counters (default settings).
fn observe_call(s: &mut SessionState, tool: &str, mut obs: ToolObservation) -> ToolFacts {
    let facts = s.observe_tool(tool, &mut obs);
    let ctx = Context::Tool(ToolContext { tool, obs, facts });
    observe_detectors(s, &ctx);
    facts
}

/// A turn or another LLM call, as the engine applies it.
fn observe_llm_call(s: &mut SessionState, call: LlmObservation, text: Option<&str>) {
    s.observe_llm(call);
    let sketch = text.map(TextSketch::of);
    let ctx = Context::Llm(LlmContext {
        is_turn: call.is_turn,
        tool_calls: call.tool_calls,
        has_text: text.is_some(),
        sketch: sketch.as_ref(),
        opening: text.and_then(|t| crate::engine::text::opening(t, 8)),
        ..LlmContext::default()
    });
    observe_detectors(s, &ctx);
}

fn observe_detectors(s: &mut SessionState, ctx: &Context<'_>) {
    let input = Input {
        context: ctx,
        depth: None,
    };
    Detectors::default().observe(&mut s.counters, &s.run, &input);
}

fn tool(action: u64, result: u64) -> ToolObservation {
    ToolObservation {
        action,
        result,
        shape: result as u32,
        is_error: false,
        error_text: false,
        wordless: false,
        unknown_tool: false,
        poll: false,
        waiting: false,
        poll_class: false,
        checks_after_wait: false,
        wait: false,
        sleeps_first: false,
        after_wait: false,
        reads_pending: false,
        retry_safe: false,
        write: false,
        content: ContentSample::default(),
    }
}

/// A state as a running instance stores it: identity, its rings wrapped around (more
/// calls, turns and event ids than they hold), named and other tools, a poll, an
/// episode with findings, a termination.
fn stored_state() -> SessionState {
    let mut s = SessionState::new(1_000, 1_000);
    s.note_labels(Some("coder"), Some("acme"));
    s.note_run(Some("run-7"));
    for i in 0..45u64 {
        let mut obs = tool(i % 9, i * 31 % 11);
        obs.poll = i % 13 == 0;
        obs.is_error = i % 17 == 0;
        // Results long enough to sample: the run's seen lines wrap around too.
        let listing: String = (0..40)
            .map(|k| format!("line_{k} of listing_{i}, with enough words to count\n"))
            .collect();
        obs.content =
            ContentSample::of_canonical(serde_json::json!(listing).to_string().as_bytes());
        observe_call(&mut s, &format!("tool_{}", i % 11), obs);
        s.is_duplicate(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    }
    for t in 0..8 {
        let text = format!("turn {t}: reading the file again, then the tests {}", t % 3);
        let call = LlmObservation {
            is_turn: true,
            input_tokens: 1_000 + t,
            output_tokens: 200,
            cache_read_tokens: Some(50),
            cache_write_tokens: None,
            cost_usd: Some(0.01),
            tool_calls: Some(1),
        };
        observe_llm_call(&mut s, call, Some(&text));
    }
    s.count_finding(DetectorKind::Repeat, Level::Warning);
    s.count_finding(DetectorKind::Repeat, Level::Terminate);
    *s.episodes.get_mut(DetectorKind::Repeat) = Episode {
        number: 2,
        emitted: Level::Warning.bit() | Level::Terminate.bit(),
        subject: 0xfeed_f00d,
        warned_at_step: Some(40),
    };
    s.termination = Some(Termination {
        detector: DetectorKind::Repeat,
        at_ms: 5_000,
        shadow: false,
    });
    s
}

/// Every ring full, every label and tool name at its cap, every poll tracker used,
/// every detector's episode marked: the largest state a session can have (3,212
/// bytes when written, with small counters) stays within [`STATE_BYTES_MAX`].
#[test]
fn the_largest_state_stays_within_the_bound() {
    let mut s = SessionState::new(1_000, 1_000);
    let long = "x".repeat(500);
    s.note_labels(Some(&long), Some(&long));
    s.note_run(Some(&long));
    for i in 0..200u64 {
        let mut obs = tool(
            i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            i.rotate_left(17) ^ 0xdead_beef_dead_beef,
        );
        obs.poll = i % 3 == 0;
        obs.is_error = i % 5 == 0;
        let listing: String = (0..200)
            .map(|k| format!("line_{k} of listing_{i}, with enough words to count\n"))
            .collect();
        obs.content =
            ContentSample::of_canonical(serde_json::json!(listing).to_string().as_bytes());
        observe_call(&mut s, &format!("{}{}", i % 20, "t".repeat(60)), obs);
        s.is_duplicate(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    }
    for t in 0..20u64 {
        let text: String = (0..100).map(|w| format!("word{} ", w * 7 + t)).collect();
        let call = LlmObservation {
            is_turn: true,
            input_tokens: u64::MAX / 4,
            output_tokens: u64::MAX / 4,
            cache_read_tokens: Some(u64::MAX / 4),
            cache_write_tokens: Some(u64::MAX / 4),
            cost_usd: Some(1e9),
            tool_calls: Some(u32::MAX),
        };
        observe_llm_call(&mut s, call, Some(&text));
    }
    for d in DetectorKind::ALL {
        s.count_finding(*d, Level::Warning);
        s.count_finding(*d, Level::Critical);
        *s.episodes.get_mut(*d) = Episode {
            number: u32::MAX,
            emitted: 7,
            subject: u64::MAX,
            warned_at_step: Some(u32::MAX),
        };
    }
    s.termination = Some(Termination {
        detector: DetectorKind::Repeat,
        at_ms: i64::MAX,
        shadow: true,
    });
    assert_eq!(s.run.seen_lines.len(), crate::engine::content::SEEN_LINES);
    let n = s.to_bytes().len();
    assert!(n <= STATE_BYTES_MAX, "{n} bytes");
}

/// A stored state (the fixture of the current format, written by that format's first
/// release) reads back and writes again byte for byte: an upgrade restores every open
/// session from the store and changelog. A change to the encoding must fail here:
/// either it was not meant (the layout moved), or it is a new format, which bumps
/// [`crate::engine::store::STATE_FORMAT`] and records its own fixture
/// (`LOOPWARDEN_RECORD_STATE=1 cargo test --lib stored_states`).
#[test]
fn stored_states_read_back_byte_for_byte() {
    let format = crate::engine::store::STATE_FORMAT;
    let path = format!(
        "{}/tests/fixtures/session-state-{format}.postcard",
        env!("CARGO_MANIFEST_DIR")
    );
    if std::env::var_os("LOOPWARDEN_RECORD_STATE").is_some()
        && !std::path::Path::new(&path).exists()
    {
        std::fs::write(&path, stored_state().to_bytes()).unwrap();
    }
    let stored = std::fs::read(&path).unwrap_or_else(|e| {
        panic!("{path}: {e}; a new state format records its fixture with LOOPWARDEN_RECORD_STATE=1")
    });
    let state = SessionState::from_bytes(&stored).expect("a stored state reads back");
    assert_eq!(
        state.to_bytes(),
        stored,
        "format {format} encodes as its fixture"
    );
    // The halves of flag bits given to calls that are no poll since the format's first
    // release (`CallRecord::WRITE`, `NEW_LINES`, `REREAD`) are 0 in its fixture: a state
    // written before them reads as one whose calls were not judged so.
    let mut built = stored_state();
    let later_bits = CallRecord::WRITE | CallRecord::NEW_ANSWER;
    assert!(built
        .run
        .window
        .iter()
        .any(|r| !r.is_poll() && r.flags & later_bits != 0));
    for rec in built.run.window.iter_mut().filter(|r| !r.is_poll()) {
        rec.flags &= !later_bits;
    }
    // Since then a polled action's answer when it is no poll is its poll's last answer
    // too (`answer_of_a_polled_action`; the inputs here call polled actions as no polls):
    // the trackers are compared by action and count.
    assert_eq!(built.run.polls.len(), state.run.polls.len());
    for (b, s) in built.run.polls.iter_mut().zip(&state.run.polls) {
        assert_eq!((b.action, b.unchanged), (s.action, s.unchanged));
        b.result = s.result;
    }
    assert_eq!(state, built);
    assert_eq!(state.run.window.len(), WINDOW_CALLS);
    assert_eq!(state.counters.similar_turns.sketches.len(), TURN_SKETCHES);
    assert_eq!(
        state.run.seen_lines.len(),
        crate::engine::content::SEEN_LINES
    );
    assert_eq!(state.recent_event_ids.len(), RECENT_EVENT_IDS);
}

/// An LLM call (a turn, or a sub-agent's call when `turn` is false) asking for
/// `asks` calls.
fn llm_call(s: &mut SessionState, turn: bool, asks: Option<u32>) {
    let call = LlmObservation {
        is_turn: turn,
        input_tokens: 100,
        output_tokens: 10,
        cache_read_tokens: None,
        cache_write_tokens: None,
        cost_usd: None,
        tool_calls: asks,
    };
    observe_llm_call(s, call, None);
}

#[test]
fn steps_are_turns_and_the_calls_no_turn_asked_for() {
    // Three calls per turn, the turns saying so: one step a turn.
    let mut s = SessionState::new(0, 0);
    for _ in 0..4 {
        llm_call(&mut s, true, Some(3));
        for i in 0..3 {
            observe_call(&mut s, "read", tool(i, i));
        }
    }
    assert_eq!(s.stats.steps, 4);
    // Turns that do not say ask for as many as this agent's turns have been seen to:
    // the first turn's two extra calls are steps, later turns' are not.
    let mut s = SessionState::new(0, 0);
    for _ in 0..4 {
        llm_call(&mut s, true, None);
        for i in 0..3 {
            observe_call(&mut s, "read", tool(i, i));
        }
    }
    assert_eq!(s.stats.steps, 4 + 2);
    // A sub-agent's LLM call between a turn and its call (a search tool ranking with a
    // model of its own) is a step, and asks for none of the agent's calls; one that
    // asks for a call of its own covers it.
    let mut s = SessionState::new(0, 0);
    llm_call(&mut s, true, Some(1));
    llm_call(&mut s, false, Some(0));
    observe_call(&mut s, "search", tool(1, 1));
    assert_eq!(s.stats.steps, 2);
    llm_call(&mut s, false, Some(1));
    observe_call(&mut s, "read", tool(2, 2));
    assert_eq!(s.stats.steps, 3);
    // Tool calls no LLM call asked for are steps each.
    for i in 0..5 {
        observe_call(&mut s, "read", tool(i, i));
    }
    assert_eq!(s.stats.steps, 8);
}

#[test]
fn window_and_rings_stay_bounded() {
    let mut s = SessionState::new(0, 0);
    for i in 0..10_000u64 {
        observe_call(&mut s, &format!("tool{}", i % 50), tool(i % 7, i));
        s.is_duplicate(i);
    }
    assert_eq!(s.run.window.len(), WINDOW_CALLS);
    assert!(s.tools.len() <= MAX_NAMED_TOOLS + 1);
    assert_eq!(s.recent_event_ids.len(), RECENT_EVENT_IDS);
    assert_eq!(s.run.seen_pairs.len(), SEEN_PAIRS);
}

#[test]
fn a_restored_state_with_more_poll_trackers_than_the_bound_comes_back_to_it() {
    let mut s = SessionState::new(0, 0);
    s.run.polls = (0..POLL_TRACKERS as u64 + 2)
        .map(|action| PollTracker {
            action,
            result: 0,
            unchanged: 0,
        })
        .collect();
    let mut s = SessionState::from_bytes(&s.to_bytes()).unwrap();
    let mut poll = tool(1_000, 1);
    poll.poll = true;
    observe_call(&mut s, "job_status", poll);
    assert_eq!(s.run.polls.len(), POLL_TRACKERS);
    assert_eq!(s.run.polls.last().map(|p| p.action), Some(1_000));
}

#[test]
fn streaks_follow_the_sequence() {
    let mut s = SessionState::new(0, 0);
    for _ in 0..3 {
        observe_call(&mut s, "read", tool(1, 1));
    }
    assert_eq!(s.counters.repeat, 3);
    let f = observe_call(&mut s, "list", tool(2, 2));
    assert_eq!(s.counters.repeat, 1);
    assert_eq!(f.pair_count, 1);
    let f = observe_call(&mut s, "read", tool(1, 1));
    assert_eq!(f.pair_count, 4);
    assert_eq!(s.counters.ping_pong, 3, "read,list,read");
    // A run's counters, the detectors' own included, start again with a new run.
    s.note_run(Some("first"));
    assert!(s.note_run(Some("next")));
    assert_eq!(s.counters, DetectorStates::default());
}

#[test]
fn a_first_run_id_after_events_without_one_is_a_new_run() {
    let mut s = SessionState::new(0, 0);
    s.touch(0, 0, 1);
    assert!(!s.note_run(Some("a")), "the session's first event");
    let mut s = SessionState::new(0, 0);
    for _ in 0..2 {
        s.touch(0, 0, 1);
        s.note_run(None);
        observe_call(&mut s, "read", tool(1, 1));
    }
    s.touch(0, 0, 1);
    assert!(s.note_run(Some("a")));
    assert_eq!(s.run.window.len(), 0);
    s.touch(0, 0, 1);
    assert!(!s.note_run(None), "no run_id: same run");
}

#[test]
fn run_change_resets_loop_state_but_not_counters() {
    let mut s = SessionState::new(0, 0);
    s.note_run(Some("a"));
    observe_call(&mut s, "read", tool(1, 1));
    observe_call(&mut s, "read", tool(1, 1));
    assert!(s.note_run(Some("b")));
    assert_eq!(s.run.window.len(), 0);
    assert_eq!(s.stats.tool_calls, 2);
}

#[test]
fn round_trips_through_bytes() {
    let mut s = SessionState::new(5, 5);
    observe_call(&mut s, "read", tool(1, 2));
    let call = LlmObservation {
        is_turn: true,
        input_tokens: 10,
        output_tokens: 5,
        cache_read_tokens: None,
        cache_write_tokens: None,
        cost_usd: Some(0.5),
        tool_calls: Some(0),
    };
    observe_llm_call(&mut s, call, Some("hello there"));
    let back = SessionState::from_bytes(&s.to_bytes()).unwrap();
    assert_eq!(back, s);
}

/// Episode marks are held sparse: an entry made for a detector whose marks stay the default
/// is no change (equal, and written as no entry); read back, an index past the detectors
/// is passed over and the later of one index given twice holds.
#[test]
fn episodes_held_sparse_read_and_write_as_a_full_list_did() {
    let mut touched = SessionState::new(1, 1);
    touched.episodes.get_mut(DetectorKind::Cycle);
    let untouched = SessionState::new(1, 1);
    assert_eq!(touched, untouched);
    assert_eq!(touched.to_bytes(), untouched.to_bytes());
    assert_eq!(
        touched.episodes.get(DetectorKind::Cycle),
        Episode::default()
    );
    // Ending an episode that never emitted leaves no entry behind.
    let mut ended = SessionState::new(1, 1);
    ended.end_episode(DetectorKind::Repeat);
    assert!(ended.episodes.existing_mut(DetectorKind::Repeat).is_none());

    let marks = |number| Episode {
        number,
        emitted: 1,
        subject: 7,
        warned_at_step: Some(3),
    };
    let repeat = DetectorKind::Repeat.index() as u8;
    let stored: Vec<(u8, Episode)> = vec![
        (repeat, marks(1)),
        (DETECTOR_COUNT as u8 + 5, marks(9)),
        (repeat, marks(2)),
    ];
    let mut state = SessionState::new(1, 1);
    *state.episodes.get_mut(DetectorKind::Repeat) = marks(2);
    // The state's bytes with its episode list swapped for `stored`: postcard writes the
    // fields in order, so the list is what lies between the fields before and after it.
    let written = state.to_bytes();
    let own = postcard::to_allocvec(&vec![(repeat, marks(2))]).unwrap();
    let at = written
        .windows(own.len())
        .position(|w| w == own.as_slice())
        .expect("the episode list is in the state's bytes");
    let mut swapped = written[..at].to_vec();
    swapped.extend(postcard::to_allocvec(&stored).unwrap());
    swapped.extend_from_slice(&written[at + own.len()..]);
    let read = SessionState::from_bytes(&swapped).unwrap();
    assert_eq!(read, state);
    assert_eq!(read.episodes.get(DetectorKind::Repeat), marks(2));
}

/// Marks made out of detector order (a policy's order need not be the detectors') are
/// written in detector order, as the full list wrote them.
#[test]
fn episodes_made_out_of_order_are_written_in_detector_order() {
    let marks = |number| Episode {
        number,
        emitted: 1,
        subject: 0,
        warned_at_step: None,
    };
    let (late, early) = (DetectorKind::ALL[5], DetectorKind::ALL[2]);
    let mut out_of_order = SessionState::new(1, 1);
    *out_of_order.episodes.get_mut(late) = marks(1);
    *out_of_order.episodes.get_mut(early) = marks(2);
    let mut in_order = SessionState::new(1, 1);
    *in_order.episodes.get_mut(early) = marks(2);
    *in_order.episodes.get_mut(late) = marks(1);
    assert_eq!(out_of_order.to_bytes(), in_order.to_bytes());
    let list = postcard::to_allocvec(&vec![(2u8, marks(2)), (5u8, marks(1))]).unwrap();
    let written = out_of_order.to_bytes();
    assert!(
        written.windows(list.len()).any(|w| w == list.as_slice()),
        "the episode list is written in detector order"
    );
    assert_eq!(out_of_order.episodes.get(late), marks(1));
    assert_eq!(out_of_order.episodes.get(early), marks(2));
}

#[test]
fn a_label_is_kept_whole_up_to_its_cap_and_a_longer_one_as_its_start_and_digest() {
    let short = "r".repeat(MAX_LABEL);
    assert!(matches!(kept_label(&short), Cow::Borrowed(s) if s == short));
    let long = "é".repeat(100); // 200 bytes: the cut falls inside a character
    let kept = kept_label(&long);
    assert!(kept.len() <= MAX_LABEL, "{kept}");
    assert!(kept.starts_with(&"é".repeat(57)), "{kept}");
    // The form is stored: a build that kept it otherwise would take every long run id
    // for a new run once, at the upgrade.
    assert_eq!(
        kept_label(&"r".repeat(300)),
        format!("{}~{}", "r".repeat(115), "4b7ae0000877")
    );
    // Labels alike in their start, and only there, stay apart.
    let (a, b) = (format!("{short}/run/1"), format!("{short}/run/2"));
    assert_ne!(kept_label(&a), kept_label(&b));
    // A kept form is kept as it is: a label stored, then compared again, is the same.
    assert_eq!(kept_label(&kept_label(&a)), kept_label(&a));
}

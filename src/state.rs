//! Per-session state (DESIGN §4): what has happened in a session, as counters, a ring of
//! recent tool-call fingerprints, fixed-size text sketches and per-detector episode marks.
//!
//! Guarantees: the state is bounded whatever the session's length (every collection has
//! a fixed cap; tool names are capped in number and length); it holds digests, never
//! args, results or text; updating it is deterministic; it round-trips through
//! [`SessionState::to_bytes`] / [`SessionState::from_bytes`] unchanged.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::content::ContentSample;
use crate::detectors::{DetectorKind, DETECTOR_COUNT};
use crate::policy::Level;
use crate::text::TextSketch;

/// Tools counted by name in `stats`; further tools are counted under [`OTHER_TOOLS`].
pub const MAX_NAMED_TOOLS: usize = 8;
/// Name under which tools past [`MAX_NAMED_TOOLS`] are counted.
pub const OTHER_TOOLS: &str = "(other)";
/// Longest tool name kept (longer names are cut at a char boundary).
pub const MAX_TOOL_NAME: usize = 40;
/// Recent distinct (action, result) pairs remembered for `no_new_information`.
pub const SEEN_PAIRS: usize = 32;
/// Recent event ids remembered to drop exact duplicates.
pub const RECENT_EVENT_IDS: usize = 16;
/// Poll actions tracked at once by `poll_no_progress`.
pub const POLL_TRACKERS: usize = 4;
/// Longest `run_id` / `agent_id` / `tenant` kept.
pub const MAX_LABEL: usize = 64;
/// The serialized size session states stay under (DESIGN §4 target): every state the
/// adversarial and property tests drive, and the recorded agent sessions' (median
/// 1.0–1.5 kB, largest 1.87 kB).
pub const STATE_BYTES_BOUND: usize = 2048;
/// The size no state passes: every ring full and every label and tool name at its cap
/// at once take 3,025 bytes, and each of the counters grown large a few bytes more.
/// Above DESIGN §4's 2 KiB: the rings alone take 1.6 kB, and eight tool names and
/// three labels at their caps another 0.5 kB.
pub const STATE_BYTES_MAX: usize = 3 * 1024 + 256;
/// The tool-call window of loop detectors (DESIGN §3: the last 30 calls of the run).
pub const WINDOW_CALLS: usize = 30;
/// Sketches of previous turns kept for `similar_turns`.
pub const TURN_SKETCHES: usize = 5;

/// Digests are random 64-bit values: as varints they would take 10 bytes, fixed they take 8.
mod fixed {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::VecDeque;

    pub mod u64 {
        use super::*;
        pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
            v.to_le_bytes().serialize(s)
        }
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
            Ok(u64::from_le_bytes(<[u8; 8]>::deserialize(d)?))
        }
    }

    pub mod u32 {
        use super::*;
        pub fn serialize<S: Serializer>(v: &u32, s: S) -> Result<S::Ok, S::Error> {
            v.to_le_bytes().serialize(s)
        }
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
            Ok(u32::from_le_bytes(<[u8; 4]>::deserialize(d)?))
        }
    }

    /// Rings of fixed-width values: each written as its little-endian bytes.
    pub mod deque {
        use super::*;

        pub trait Fixed: Copy {
            type Bytes: Serialize + for<'de> Deserialize<'de>;
            fn to_le(self) -> Self::Bytes;
            fn from_le(b: Self::Bytes) -> Self;
        }

        impl Fixed for u16 {
            type Bytes = [u8; 2];
            fn to_le(self) -> [u8; 2] {
                self.to_le_bytes()
            }
            fn from_le(b: [u8; 2]) -> u16 {
                u16::from_le_bytes(b)
            }
        }

        impl Fixed for u64 {
            type Bytes = [u8; 8];
            fn to_le(self) -> [u8; 8] {
                self.to_le_bytes()
            }
            fn from_le(b: [u8; 8]) -> u64 {
                u64::from_le_bytes(b)
            }
        }

        pub fn serialize<T: Fixed, S: Serializer>(
            v: &VecDeque<T>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            let bytes: Vec<T::Bytes> = v.iter().map(|x| x.to_le()).collect();
            bytes.serialize(s)
        }

        pub fn deserialize<'de, T: Fixed, D: Deserializer<'de>>(
            d: D,
        ) -> Result<VecDeque<T>, D::Error> {
            Ok(Vec::<T::Bytes>::deserialize(d)?
                .into_iter()
                .map(T::from_le)
                .collect())
        }
    }
}

/// Cycle lengths `cycle` looks for (2 is `ping_pong`'s, 1 `repeat`'s).
pub const CYCLE_LENGTHS: [usize; 10] = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

/// One tool call in the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    #[serde(with = "fixed::u64")]
    pub action: u64,
    #[serde(with = "fixed::u64")]
    pub result: u64,
    /// The result up to its digits (see [`crate::fingerprint::ResultPrint::shape`]).
    #[serde(with = "fixed::u32")]
    pub shape: u32,
    pub flags: u8,
}

impl CallRecord {
    pub const ERROR: u8 = 1;
    pub const POLL: u8 = 2;
    pub const RETRY_SAFE: u8 = 4;
    /// A failure whose result says something in words (see [`ToolObservation::error_text`]).
    pub const ERROR_TEXT: u8 = 8;

    pub fn is_error(&self) -> bool {
        self.flags & Self::ERROR != 0
    }

    pub fn is_poll(&self) -> bool {
        self.flags & Self::POLL != 0
    }

    fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// The same action and the very same result.
    pub fn same_pair(&self, other: &CallRecord) -> bool {
        self.action == other.action && self.result == other.result
    }

    /// The same action with the same outcome: the same result, or, when both failed,
    /// the same error up to its digits (an error's numbers are line numbers and
    /// counters). A success's digits are data (`35% complete`, `chunk 3`, the time).
    pub fn same_outcome(&self, other: &CallRecord) -> bool {
        self.action == other.action
            && (self.result == other.result
                || (self.is_error() && other.is_error() && self.shape == other.shape))
    }

    /// Identifies what a call told the agent: its action and its result up to digits (an
    /// answer that differs only in numbers teaches nothing new).
    fn news_key(&self) -> u64 {
        self.action.rotate_left(29) ^ u64::from(self.shape)
    }
}

/// Calls, and calls that repeated an earlier (action, result) pair, of one tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCount {
    pub tool: String,
    pub calls: u64,
    pub repeats: u64,
}

/// Session-wide counters (ceilings keep counting across runs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    pub events: u64,
    /// The agent's steps: its LLM calls (each can carry a hint to the agent), and its
    /// tool calls that no LLM call asked for (a source that reports tool calls but lost
    /// its LLM calls still takes steps). Never decreases.
    pub steps: u64,
    /// Tool calls the latest turn asked for that have not come yet: each is part of that
    /// turn's step.
    pub tool_calls_asked: u32,
    /// Tool calls since the latest turn, and the most that followed one turn so far: a
    /// turn that does not say how many calls it asks for asks for as many as this
    /// agent's turns have been seen to (one at least).
    pub calls_since_turn: u32,
    pub most_calls_per_turn: u32,
    pub llm_calls: u64,
    pub turns: u64,
    pub tool_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    pub cost_usd: f64,
    pub has_cost: bool,
    pub max_depth: Option<u32>,
    pub duplicates: u64,
    pub dropped_after_termination: u64,
}

/// A tracked poll: the action, its last result and how often that result came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollTracker {
    #[serde(with = "fixed::u64")]
    pub action: u64,
    #[serde(with = "fixed::u64")]
    pub result: u64,
    pub unchanged: u32,
}

/// Loop-detector state of the current run (reset when `run_id` changes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    pub window: VecDeque<CallRecord>,
    /// Same (action, result) in a row, counting the latest call.
    pub repeat_streak: u32,
    pub polls: Vec<PollTracker>,
    /// Same action failing in a row.
    pub error_repeat_streak: u32,
    /// Failures in a row with the same error in words (up to digits), any action.
    pub same_error_streak: u32,
    pub unknown_tool_streak: u32,
    pub error_streak: u32,
    /// One bit per recent call: it repeated a pair seen in the window (newest = bit 0).
    #[serde(with = "fixed::u64")]
    pub no_progress_bits: u64,
    /// Length of the strict A,B,A,B tail with stable results.
    pub alternation: u32,
    /// Per cycle length k: how many trailing calls equal the call k before them.
    pub cycle_match: [u32; CYCLE_LENGTHS.len()],
    pub stall: u32,
    /// Turns in a row that nearly repeat an earlier turn, with nothing learned since the
    /// first of them.
    pub similar_streak: u32,
    /// Of those, the turns in a row since which no call made progress (see
    /// [`RunState::since_text`]): only these may terminate.
    pub similar_stale: u32,
    pub sketches: VecDeque<TextSketch>,
    /// How the previous turns opened (see [`crate::text::opening`]), as many as
    /// `sketches`; 0 for a turn too short to have an opening.
    #[serde(with = "fixed::deque")]
    pub openings: VecDeque<u64>,
    pub compaction_streak: u32,
    pub best_progress: Option<f64>,
    pub progress_stale: u32,
    /// What the run's recent calls told the agent (see `CallRecord::news_key`).
    #[serde(with = "fixed::deque")]
    pub seen_pairs: VecDeque<u64>,
    /// Results since the last turn that count for information gain: any, and all seen
    /// before.
    pub turn_had_results: bool,
    pub turn_all_seen: bool,
    /// What happened since the last turn with text (`similar_turns` judges turns with
    /// text; those without, common with native tool use, pass it on): bits of
    /// [`RunState::LEARNED`], [`RunState::PROGRESSED`], [`RunState::SUCCEEDED`],
    /// [`RunState::FAILED`], [`RunState::POLLED`], [`RunState::REREAD`].
    pub since_text: u8,
    /// Calls at the window's end since a poll's result last changed in this run (at
    /// most the window; `None`: none has): a call that works (a `sleep`) repeats only
    /// these, since waiting on a job that moves is no loop; a failure repeats them all.
    pub since_poll_moved: Option<u8>,
    pub no_new_info_streak: u32,
    /// Lines the run's results showed, sampled (see [`crate::content`]), oldest first.
    #[serde(with = "fixed::deque")]
    pub seen_lines: VecDeque<u16>,
}

impl RunState {
    /// A call since learned something new: an answer this action had not given before
    /// (see [`CallRecord::news_key`]) that showed lines the run had not seen.
    pub const LEARNED: u8 = 1;
    /// A call made progress: a poll (a changed status is progress; an unchanged one is
    /// `poll_no_progress`'s to judge, with the room polls get), or an outcome new to the
    /// window (the same call answering differently, digits included: a price, a
    /// progress count; a failure up to its digits).
    pub const PROGRESSED: u8 = 2;
    /// A call succeeded and was not a [`RunState::REREAD`]: the agent did something (a
    /// write, a poll, a read that showed lines the run had not seen, or one too short
    /// to judge by its lines).
    pub const SUCCEEDED: u8 = 4;
    /// A call failed.
    pub const FAILED: u8 = 8;
    /// A call was a poll.
    pub const POLLED: u8 = 16;
    /// A read succeeded whose sampled lines the run had nearly all seen (see
    /// [`crate::content::ContentSample::all_seen_in`]).
    pub const REREAD: u8 = 32;
}

/// Emission marks of one detector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Episode {
    /// Episode counter; part of each finding's `event_id`.
    pub number: u32,
    /// Levels already emitted in this episode (bits of [`Level::bit`]).
    pub emitted: u8,
    /// What the episode is about, for detectors that follow one action.
    #[serde(with = "fixed::u64")]
    pub subject: u64,
    /// The session's step ([`SessionState::steps`]) when the episode's first finding was
    /// emitted: a termination waits `grace_steps` past it.
    pub warned_at_step: Option<u32>,
}

/// Episodes are mostly untouched: only the non-default ones are stored, with their index.
mod sparse_episodes {
    use super::{Episode, DETECTOR_COUNT};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &[Episode], s: S) -> Result<S::Ok, S::Error> {
        let used: Vec<(u8, Episode)> = v
            .iter()
            .enumerate()
            .filter(|(_, e)| **e != Episode::default())
            .map(|(i, e)| (i as u8, *e))
            .collect();
        used.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Episode>, D::Error> {
        let mut out = vec![Episode::default(); DETECTOR_COUNT];
        for (i, e) in Vec::<(u8, Episode)>::deserialize(d)? {
            if let Some(slot) = out.get_mut(i as usize) {
                *slot = e;
            }
        }
        Ok(out)
    }
}

/// Findings per level of one detector, for the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindingCounts {
    pub detector: u8,
    pub counts: [u32; 3],
}

/// How a session was terminated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Termination {
    pub detector: DetectorKind,
    pub at_ms: i64,
    /// In shadow mode nothing was published and the session goes on.
    pub shadow: bool,
}

/// Everything loopwarden keeps about one session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionState {
    pub run_id: Option<String>,
    pub agent_id: Option<String>,
    pub tenant: Option<String>,
    /// The session's own clock: its first and latest event times.
    pub first_event_ms: i64,
    pub last_event_ms: i64,
    /// The stream's clock (the partition's latest event time) when the session's latest
    /// event arrived: idleness is measured from here, so a session whose own clock lags
    /// the stream is not closed for it.
    pub last_arrival_ms: i64,
    pub stats: Counters,
    pub tools: Vec<ToolCount>,
    pub run: RunState,
    #[serde(with = "fixed::deque")]
    pub recent_event_ids: VecDeque<u64>,
    #[serde(with = "sparse_episodes")]
    pub episodes: Vec<Episode>,
    pub findings: Vec<FindingCounts>,
    pub termination: Option<Termination>,
}

/// Why a stored state could not be read back (poison for that key).
#[derive(Debug, thiserror::Error)]
#[error("corrupt session state: {0}")]
pub struct CorruptState(#[from] postcard::Error);

fn cap_label(s: &str) -> String {
    let mut end = s.len().min(MAX_LABEL);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn push_bounded<T>(q: &mut VecDeque<T>, item: T, cap: usize) {
    // `while`: a stored state holding more (written by another build) comes back down.
    while q.len() >= cap {
        q.pop_front();
    }
    q.push_back(item);
}

/// What one tool call did to the window, for the detectors to judge.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ToolFacts {
    /// Occurrences of this (action, result) pair in the window, this call included.
    pub pair_count: u32,
    /// Occurrences of this call's outcome in the window, this call included: the same
    /// action with the same result, or with the same error up to digits when it failed
    /// (see [`CallRecord::same_outcome`]). Polls and `retry_safe` calls count 0.
    pub outcome_count: u32,
    /// Occurrences in the window of this failure's error in words (up to digits), any
    /// action, this call included; 0 when this call is no such failure.
    pub error_count: u32,
    /// Occurrences of this action in the window among non-poll calls, this call included.
    pub action_count: u32,
    /// Occurrences of the `generic_repeat` episode's action (non-poll calls).
    pub subject_count: u32,
    /// Distinct (action, result) pairs among the last `last_calls` non-poll calls, and how
    /// many such calls there were.
    pub recent_distinct: u32,
    pub recent_len: u32,
    /// Unchanged results in a row of this poll action (0 when not a poll).
    pub poll_unchanged: u32,
    /// The longest cycle at the window's tail: (length k, calls it covers).
    pub cycle: Option<(usize, u32)>,
}

/// A tool call as the state sees it: fingerprints and classes, nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolObservation {
    pub action: u64,
    pub result: u64,
    /// The result up to its digits.
    pub shape: u32,
    pub is_error: bool,
    /// A failure whose result says something in words (not only an exit code or an
    /// empty output): two such failures alike are the same error.
    pub error_text: bool,
    /// The result says nothing in words (an empty output, an exit code, a bare number):
    /// it tells neither news nor old news.
    pub wordless: bool,
    pub unknown_tool: bool,
    /// A poll by class or a pending-looking result.
    pub poll: bool,
    pub retry_safe: bool,
    pub write: bool,
    /// The lines the result showed, sampled (empty when it says nothing in words).
    pub content: ContentSample,
}

impl SessionState {
    pub fn new(first_event_ms: i64, arrival_ms: i64) -> SessionState {
        SessionState {
            first_event_ms,
            last_event_ms: first_event_ms,
            last_arrival_ms: arrival_ms,
            episodes: vec![Episode::default(); DETECTOR_COUNT],
            ..SessionState::default()
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("session state always serializes")
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<SessionState, CorruptState> {
        let mut s: SessionState = postcard::from_bytes(bytes)?;
        s.episodes.resize(DETECTOR_COUNT, Episode::default());
        Ok(s)
    }

    /// Records the agent and tenant an event names; true when either label was set anew
    /// (so the session's policy may have changed).
    pub fn note_labels(&mut self, agent_id: Option<&str>, tenant: Option<&str>) -> bool {
        let mut relabelled = false;
        if let Some(a) = agent_id {
            if self.agent_id.as_deref() != Some(a) {
                self.agent_id = Some(cap_label(a));
                relabelled = true;
            }
        }
        if let Some(t) = tenant {
            if self.tenant.as_deref() != Some(t) {
                self.tenant = Some(cap_label(t));
                relabelled = true;
            }
        }
        relabelled
    }

    /// Records the `run_id` an event names; true when it starts a new run, which resets
    /// the loop detectors' state: a changed `run_id`, or the first one of a session that
    /// had sent events without one (a runtime that starts naming runs has started a new
    /// one). An event without `run_id` stays in the current run.
    pub fn note_run(&mut self, run_id: Option<&str>) -> bool {
        let Some(run) = run_id else { return false };
        if self.run_id.as_deref() == Some(run) {
            return false;
        }
        // `touch` has counted this event: more than one means the session had a past.
        let changed = self.run_id.is_some() || self.stats.events > 1;
        self.run_id = Some(cap_label(run));
        if changed {
            self.run = RunState::default();
            for kind in DetectorKind::ALL.iter().filter(|k| !k.is_ceiling()) {
                self.end_episode(*kind);
            }
        }
        changed
    }

    /// Returns true when `event_id` was seen recently (an exact duplicate to drop).
    pub fn is_duplicate(&mut self, event_hash: u64) -> bool {
        if self.recent_event_ids.contains(&event_hash) {
            self.stats.duplicates += 1;
            return true;
        }
        push_bounded(&mut self.recent_event_ids, event_hash, RECENT_EVENT_IDS);
        false
    }

    /// Counts an event of the session at `event_ms` (its own time) that arrived when the
    /// stream's clock read `arrival_ms`.
    pub fn touch(&mut self, event_ms: i64, arrival_ms: i64) {
        self.stats.events += 1;
        self.last_event_ms = self.last_event_ms.max(event_ms);
        self.last_arrival_ms = self.last_arrival_ms.max(arrival_ms);
    }

    /// Applies an LLM call. Returns whether the previous turn's results were all old news
    /// (`Some(streak)`) when this call opens a new turn.
    #[allow(clippy::too_many_arguments)]
    pub fn observe_llm(
        &mut self,
        is_turn: bool,
        is_compaction: bool,
        input: u64,
        output: u64,
        cache_read: Option<u64>,
        cache_write: Option<u64>,
        cost: Option<f64>,
        tool_calls: Option<u32>,
        progress: Option<f64>,
        sketch: Option<&TextSketch>,
        opening: Option<u64>,
        min_similarity: f64,
    ) {
        let s = &mut self.stats;
        s.llm_calls += 1;
        s.steps += 1;
        if is_turn {
            // The calls a turn asks for are part of its step; one that does not say asks
            // for as many as this agent's turns have.
            s.most_calls_per_turn = s.most_calls_per_turn.max(s.calls_since_turn);
            s.calls_since_turn = 0;
            s.tool_calls_asked = tool_calls.unwrap_or(s.most_calls_per_turn.max(1));
        } else {
            // A sub-agent's or a compaction's call covers the calls it says it asks for,
            // on top of the turn's (it was a step itself), and none when it does not say.
            s.tool_calls_asked = s.tool_calls_asked.saturating_add(tool_calls.unwrap_or(0));
        }
        s.input_tokens = s.input_tokens.saturating_add(input);
        s.output_tokens = s.output_tokens.saturating_add(output);
        s.cache_read_tokens = s.cache_read_tokens.saturating_add(cache_read.unwrap_or(0));
        s.cache_write_tokens = s
            .cache_write_tokens
            .saturating_add(cache_write.unwrap_or(0));
        if let Some(c) = cost {
            s.cost_usd += c;
            s.has_cost = true;
        }
        let r = &mut self.run;
        if is_compaction {
            r.compaction_streak += 1;
        }
        if let Some(p) = progress {
            match r.best_progress {
                Some(best) if p <= best => r.progress_stale += 1,
                _ => {
                    r.best_progress = Some(p);
                    r.progress_stale = 0;
                }
            }
        }
        if !is_turn {
            return;
        }
        s.turns += 1;
        match tool_calls {
            Some(0) => r.stall += 1,
            Some(_) => r.stall = 0,
            None => {}
        }
        // The turn that just ended: were all of its tool results seen before?
        if r.turn_had_results {
            if r.turn_all_seen {
                r.no_new_info_streak += 1;
            } else {
                r.no_new_info_streak = 0;
            }
        }
        r.turn_had_results = false;
        r.turn_all_seen = true;
        if let Some(sk) = sketch.filter(|s| !s.is_empty()) {
            let since = std::mem::take(&mut r.since_text);
            let learned = since & RunState::LEARNED != 0;
            let progressed = since & (RunState::LEARNED | RunState::PROGRESSED) != 0;
            // Alike as a whole, or opening as an earlier turn did while nothing got done
            // since (calls were made and each failed or showed lines the run had nearly
            // all seen, none of them a poll): the same apology or restatement before a
            // different body is still the agent saying it again.
            let nothing_done = since & (RunState::SUCCEEDED | RunState::POLLED) == 0
                && since & (RunState::FAILED | RunState::REREAD) != 0;
            let opens_alike = opening.is_some_and(|o| nothing_done && r.openings.contains(&o));
            let similar = opens_alike
                || r.sketches
                    .iter()
                    .any(|prev| prev.similarity(sk) >= min_similarity);
            // The words repeat: the first such turn opens the streak whatever it learned,
            // the next ones count while they learn nothing new (a turn that opens as
            // before with nothing done learned nothing from its failures). Repeated words
            // may nudge; they end the session only while the results stand still too.
            r.similar_streak = match (similar, learned && !opens_alike) {
                (false, _) => 0,
                (true, true) => 1,
                (true, false) => r.similar_streak + 1,
            };
            r.similar_stale = if similar && (!progressed || opens_alike) {
                r.similar_stale + 1
            } else {
                0
            };
            push_bounded(&mut r.sketches, sk.clone(), TURN_SKETCHES);
            push_bounded(&mut r.openings, opening.unwrap_or(0), TURN_SKETCHES);
        }
    }

    /// Applies a tool call and returns what the detectors need to know about the window.
    #[cfg_attr(
        not(test),
        expect(
            clippy::too_many_lines,
            reason = "each detector's counters move into the detector that keeps them (issue 30, item 2)"
        )
    )]
    pub fn observe_tool(
        &mut self,
        tool: &str,
        obs: ToolObservation,
        last_calls: usize,
    ) -> ToolFacts {
        self.stats.tool_calls += 1;
        self.stats.calls_since_turn = self.stats.calls_since_turn.saturating_add(1);
        if self.stats.tool_calls_asked > 0 {
            self.stats.tool_calls_asked -= 1;
        } else {
            self.stats.steps += 1;
        }
        let subject = self.episodes[DetectorKind::GenericRepeat.index()].subject;
        let r = &mut self.run;
        let rec = CallRecord {
            action: obs.action,
            result: obs.result,
            shape: obs.shape,
            flags: (if obs.is_error { CallRecord::ERROR } else { 0 })
                | (if obs.poll { CallRecord::POLL } else { 0 })
                | (if obs.retry_safe {
                    CallRecord::RETRY_SAFE
                } else {
                    0
                })
                | (if obs.error_text {
                    CallRecord::ERROR_TEXT
                } else {
                    0
                }),
        };
        let mut facts = ToolFacts::default();

        // One pass over the window (newest last) for every count the detectors need.
        let mut recent: [(u64, u64); WINDOW_CALLS] = [(0, 0); WINDOW_CALLS];
        let want_recent = last_calls.min(WINDOW_CALLS);
        let mut recent_len = 0usize;
        if !obs.poll && want_recent > 0 {
            recent[0] = (rec.action, rec.result);
            recent_len = 1;
        }
        let (mut pair_count, mut action_count, mut subject_count) =
            (1u32, u32::from(!obs.poll), 0u32);
        if !obs.poll && subject == rec.action {
            subject_count = 1;
        }
        let judged_outcome = !obs.poll && !obs.retry_safe;
        let mut outcome_count = u32::from(judged_outcome);
        let mut error_count = u32::from(obs.error_text && !obs.retry_safe);
        let mut outcome_seen = false;
        // A call that works, between polls of a job that moves (a `sleep`, a look at the
        // log), is waiting, not repeating: it counts only what came after the last move.
        // A failure repeats across the poll as it would without it.
        let repeatable = if !obs.is_error {
            r.since_poll_moved.map_or(WINDOW_CALLS, usize::from)
        } else {
            WINDOW_CALLS
        };
        for (i, prev) in r.window.iter().rev().enumerate() {
            let same_outcome = prev.same_outcome(&rec);
            outcome_seen |= same_outcome;
            let counts = i < repeatable;
            if counts && prev.same_pair(&rec) {
                pair_count += 1;
            }
            if counts && judged_outcome && same_outcome && !prev.has(CallRecord::RETRY_SAFE) {
                outcome_count += 1;
            }
            // (A failure's window is never cut by a poll: `counts` always holds here.)
            if error_count > 0
                && prev.has(CallRecord::ERROR_TEXT)
                && !prev.has(CallRecord::RETRY_SAFE)
                && prev.shape == rec.shape
            {
                error_count += 1;
            }
            if !prev.is_poll() {
                if !obs.poll && prev.action == rec.action {
                    action_count += 1;
                }
                if subject != 0 && prev.action == subject {
                    subject_count += 1;
                }
                if recent_len < want_recent {
                    recent[recent_len] = (prev.action, prev.result);
                    recent_len += 1;
                }
            }
        }
        facts.pair_count = pair_count;
        facts.outcome_count = outcome_count;
        facts.error_count = error_count;
        facts.action_count = action_count;
        facts.subject_count = subject_count;
        facts.recent_len = recent_len as u32;
        facts.recent_distinct = distinct_pairs(&recent[..recent_len]);

        // Streaks against the previous call.
        let last = r.window.back().copied();
        let repeated = pair_count > 1;
        // A write re-applied in a row is a loop whatever it returns (the same insert grows
        // the file with each copy).
        r.repeat_streak = match last {
            Some(l) if l.action == rec.action && (obs.write || l.same_outcome(&rec)) => {
                r.repeat_streak + 1
            }
            _ => 1,
        };
        // A failure that says nothing (an exit code, an empty output: `grep` finding
        // nothing) is an answer, not an error to retry: `repeat` follows it.
        r.error_repeat_streak = if !obs.error_text {
            0
        } else {
            match last {
                Some(l) if l.has(CallRecord::ERROR_TEXT) && l.action == rec.action => {
                    r.error_repeat_streak + 1
                }
                _ => 1,
            }
        };
        // The same error in words as the previous failure, whatever the attempt.
        r.same_error_streak = match last {
            Some(l) if obs.error_text && l.is_error() && l.shape == rec.shape => {
                r.same_error_streak + 1
            }
            _ if obs.error_text => 1,
            _ => 0,
        };
        r.error_streak = if obs.is_error { r.error_streak + 1 } else { 0 };
        r.unknown_tool_streak = if obs.unknown_tool {
            r.unknown_tool_streak + 1
        } else {
            0
        };
        r.no_progress_bits = (r.no_progress_bits << 1) | u64::from(repeated);
        r.alternation = {
            let n = r.window.len();
            let prev1 = last;
            let prev2 = if n >= 2 {
                r.window.get(n - 2).copied()
            } else {
                None
            };
            match (prev1, prev2) {
                (Some(p1), _) if p1.action == rec.action => 1,
                (Some(_), Some(p2)) if p2.same_outcome(&rec) && r.alternation >= 2 => {
                    r.alternation + 1
                }
                (Some(_), _) => 2,
                (None, _) => 1,
            }
        };
        for (slot, k) in CYCLE_LENGTHS.iter().enumerate() {
            let n = r.window.len();
            r.cycle_match[slot] = if n >= *k && r.window[n - k].same_outcome(&rec) {
                r.cycle_match[slot] + 1
            } else {
                0
            };
        }

        // Polls: per-action trackers so that interleaved pollers are each followed.
        if obs.poll {
            let found = r.polls.iter().position(|p| p.action == rec.action);
            let unchanged = match found {
                Some(i) => {
                    let mut t = r.polls.remove(i);
                    if t.result != rec.result && !obs.is_error {
                        // A changed poll is progress for every detector: the job it
                        // waits on is moving. A failing poll's change is not (an error's
                        // numbers are counters: "not running (attempt 7)").
                        r.error_repeat_streak = 0;
                        r.same_error_streak = 0;
                        r.error_streak = 0;
                        r.since_poll_moved = Some(0);
                    }
                    t.unchanged = if t.result == rec.result {
                        t.unchanged + 1
                    } else {
                        0
                    };
                    t.result = rec.result;
                    let u = t.unchanged;
                    r.polls.push(t);
                    u
                }
                None => {
                    if r.polls.len() == POLL_TRACKERS {
                        r.polls.remove(0);
                    }
                    r.polls.push(PollTracker {
                        action: rec.action,
                        result: rec.result,
                        unchanged: 0,
                    });
                    0
                }
            };
            facts.poll_unchanged = unchanged;
        }
        // A read whose lines the run had nearly all seen (a rephrased search finding the
        // code it found before, a file viewed again through another tool or range) is
        // no news, whatever its arguments. Every result's lines count as seen from then
        // on (an edit shows the agent its new code too).
        let known_content = !obs.is_error
            && !obs.poll
            && !obs.write
            && obs.content.all_seen_in(&r.seen_lines) == Some(true);
        obs.content.remember_in(&mut r.seen_lines);
        // The same call answering differently stays progress (digits count: a test run
        // whose failures go down), however alike its lines: only a call new to the
        // window (a rephrased search) is judged by what it showed.
        let stale_read = known_content && facts.action_count == 1;
        r.since_text |= if obs.poll || !(outcome_seen || stale_read) {
            RunState::PROGRESSED
        } else {
            0
        } | if obs.is_error {
            RunState::FAILED
        } else if known_content {
            RunState::REREAD
        } else {
            RunState::SUCCEEDED
        } | if obs.poll { RunState::POLLED } else { 0 };

        // Information gain: a call is news when this action has not returned this result
        // (up to digits) before in the run (a new file written says "File updated" too).
        // Polls count neither as news nor as old news. Nor does a call repeated with an
        // answer without words (an empty output, an exit code): its answer tells nothing,
        // and re-applying a silent write (undo a fix to check the test fails, redo it) is
        // what it did; a new call is news whatever it answers.
        if !obs.poll {
            let pair = rec.news_key();
            let seen = r.seen_pairs.contains(&pair);
            if !(seen && obs.wordless) {
                r.turn_had_results = true;
                r.turn_all_seen &= seen;
            }
            if !seen {
                push_bounded(&mut r.seen_pairs, pair, SEEN_PAIRS);
                // Learned, for `similar_turns`, unless what it showed was all seen
                // before. (`no_new_information` judges answers as a whole: re-reading
                // part of a file read before, to work on it, is how work looks.)
                if !known_content {
                    r.since_text |= RunState::LEARNED;
                }
            }
        }

        r.stall = 0;
        r.compaction_streak = 0;
        push_bounded(&mut r.window, rec, WINDOW_CALLS);
        r.since_poll_moved = r
            .since_poll_moved
            .map(|n| n.saturating_add(1).min(WINDOW_CALLS as u8));

        facts.cycle = self.longest_cycle();
        self.count_tool(tool, repeated);
        // generic_repeat follows the action that is repeating, not every call.
        let generic_repeat = &mut self.episodes[DetectorKind::GenericRepeat.index()];
        if facts.action_count >= 2 && generic_repeat.subject == 0 {
            generic_repeat.subject = obs.action;
        }
        facts
    }

    /// The cycle at the window's tail that covers the most calls, as (length k, calls
    /// covered), once its block came back whole at least once and if the block is not
    /// itself a shorter repetition (that is `repeat` or `ping_pong`'s business).
    fn longest_cycle(&self) -> Option<(usize, u32)> {
        let w = &self.run.window;
        let mut best: Option<(usize, u32)> = None;
        for (slot, k) in CYCLE_LENGTHS.iter().enumerate() {
            let m = self.run.cycle_match[slot] as usize;
            if m < *k {
                continue;
            }
            // The block is w[n-k..]; it is reducible when it repeats with a period d | k.
            let n = w.len();
            let reducible = (1..*k)
                .filter(|d| k % d == 0)
                .any(|d| (d..*k).all(|i| w[n - k + i].same_outcome(&w[n - k + i - d])));
            if reducible {
                continue;
            }
            let covered = (m + k) as u32;
            if best.is_none_or(|(_, c)| covered > c) {
                best = Some((*k, covered));
            }
        }
        best
    }

    fn count_tool(&mut self, tool: &str, repeated: bool) {
        let name = if tool.len() > MAX_TOOL_NAME {
            let mut end = MAX_TOOL_NAME;
            while !tool.is_char_boundary(end) {
                end -= 1;
            }
            &tool[..end]
        } else {
            tool
        };
        let idx = match self.tools.iter().position(|t| t.tool == name) {
            Some(i) => i,
            None if self.tools.len() < MAX_NAMED_TOOLS => {
                self.tools.push(ToolCount {
                    tool: name.to_string(),
                    calls: 0,
                    repeats: 0,
                });
                self.tools.len() - 1
            }
            None => match self.tools.iter().position(|t| t.tool == OTHER_TOOLS) {
                Some(i) => i,
                None => {
                    self.tools.push(ToolCount {
                        tool: OTHER_TOOLS.to_string(),
                        calls: 0,
                        repeats: 0,
                    });
                    self.tools.len() - 1
                }
            },
        };
        let t = &mut self.tools[idx];
        t.calls += 1;
        t.repeats += u64::from(repeated);
    }

    /// Closes the detector's current episode, if it emitted anything.
    pub fn end_episode(&mut self, kind: DetectorKind) {
        let e = &mut self.episodes[kind.index()];
        if e.emitted != 0 {
            e.number += 1;
            e.emitted = 0;
        }
        e.subject = 0;
        e.warned_at_step = None;
    }

    /// The agent's steps so far ([`Counters::steps`]).
    pub fn steps(&self) -> u32 {
        self.stats.steps.min(u32::MAX as u64) as u32
    }

    pub fn count_finding(&mut self, kind: DetectorKind, level: Level) {
        let d = kind.index() as u8;
        let i = match self.findings.iter().position(|f| f.detector == d) {
            Some(i) => i,
            None => {
                self.findings.push(FindingCounts {
                    detector: d,
                    counts: [0; 3],
                });
                self.findings.len() - 1
            }
        };
        self.findings[i].counts[level as usize] += 1;
    }

    /// Is this session a tombstone (terminated for real, not in shadow)?
    pub fn is_tombstone(&self) -> bool {
        self.termination.is_some_and(|t| !t.shadow)
    }

    /// Drops what a tombstone no longer needs, keeping counters for the summary.
    pub fn shrink_to_tombstone(&mut self) {
        self.run = RunState::default();
        self.recent_event_ids.clear();
    }

    pub fn wall_seconds(&self) -> f64 {
        (self.last_event_ms - self.first_event_ms).max(0) as f64 / 1000.0
    }
}

/// How many distinct pairs `pairs` holds. The window is short (`low_novelty` looks at 8
/// calls by default): comparing each pair with the ones before it costs less than sorting
/// a copy, up to the window's 30.
fn distinct_pairs(pairs: &[(u64, u64)]) -> u32 {
    let mut distinct = 0;
    for (i, p) in pairs.iter().enumerate() {
        distinct += u32::from(!pairs[..i].contains(p));
    }
    distinct
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The count without sorting is the number of distinct pairs (as a set counts
        /// them), for windows up to the longest with few values (so pairs recur).
        #[test]
        fn distinct_pairs_counts_a_set(
            pairs in proptest::collection::vec((0u64..4, 0u64..3), 0..=WINDOW_CALLS)
        ) {
            let set: std::collections::BTreeSet<_> = pairs.iter().collect();
            proptest::prop_assert_eq!(distinct_pairs(&pairs) as usize, set.len());
        }
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
            s.observe_tool(&format!("tool_{}", i % 11), obs, 8);
            s.is_duplicate(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        for t in 0..8 {
            let text = format!("turn {t}: reading the file again, then the tests {}", t % 3);
            let sketch = crate::text::TextSketch::of(&text);
            s.observe_llm(
                true,
                false,
                1_000 + t,
                200,
                Some(50),
                None,
                Some(0.01),
                Some(1),
                None,
                Some(&sketch),
                crate::text::opening(&text, 8),
                0.85,
            );
        }
        s.count_finding(DetectorKind::Repeat, Level::Warning);
        s.count_finding(DetectorKind::Repeat, Level::Terminate);
        s.episodes[DetectorKind::Repeat.index()] = Episode {
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
    /// every detector's episode marked: the largest state a session can have (3,025
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
            s.observe_tool(&format!("{}{}", i % 20, "t".repeat(60)), obs, 8);
            s.is_duplicate(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        for t in 0..20u64 {
            let text: String = (0..100).map(|w| format!("word{} ", w * 7 + t)).collect();
            let sketch = crate::text::TextSketch::of(&text);
            s.observe_llm(
                true,
                false,
                u64::MAX / 4,
                u64::MAX / 4,
                Some(u64::MAX / 4),
                Some(u64::MAX / 4),
                Some(1e9),
                Some(u32::MAX),
                Some(0.5 + t as f64),
                Some(&sketch),
                crate::text::opening(&text, 8),
                0.85,
            );
        }
        for d in DetectorKind::ALL {
            s.count_finding(*d, Level::Warning);
            s.count_finding(*d, Level::Critical);
            s.episodes[d.index()] = Episode {
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
        assert_eq!(s.run.seen_lines.len(), crate::content::SEEN_LINES);
        let n = s.to_bytes().len();
        assert!(n <= STATE_BYTES_MAX, "{n} bytes");
    }

    /// A stored state (the fixture of the current format, written by that format's first
    /// release) reads back and writes again byte for byte: an upgrade restores every open
    /// session from the store and changelog. A change to the encoding must fail here:
    /// either it was not meant (the layout moved), or it is a new format, which bumps
    /// [`crate::store::STATE_FORMAT`] and records its own fixture
    /// (`LOOPWARDEN_RECORD_STATE=1 cargo test --lib stored_states`).
    #[test]
    fn stored_states_read_back_byte_for_byte() {
        let format = crate::store::STATE_FORMAT;
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
        assert_eq!(state, stored_state());
        assert_eq!(state.run.window.len(), WINDOW_CALLS);
        assert_eq!(state.run.sketches.len(), TURN_SKETCHES);
        assert_eq!(state.run.seen_lines.len(), crate::content::SEEN_LINES);
        assert_eq!(state.recent_event_ids.len(), RECENT_EVENT_IDS);
    }

    /// An LLM call (a turn, or a sub-agent's call when `turn` is false) asking for
    /// `asks` calls.
    fn llm_call(s: &mut SessionState, turn: bool, asks: Option<u32>) {
        s.observe_llm(
            turn, false, 100, 10, None, None, None, asks, None, None, None, 0.85,
        );
    }

    #[test]
    fn steps_are_turns_and_the_calls_no_turn_asked_for() {
        // Three calls per turn, the turns saying so: one step a turn.
        let mut s = SessionState::new(0, 0);
        for _ in 0..4 {
            llm_call(&mut s, true, Some(3));
            for i in 0..3 {
                s.observe_tool("read", tool(i, i), 8);
            }
        }
        assert_eq!(s.stats.steps, 4);
        // Turns that do not say ask for as many as this agent's turns have been seen to:
        // the first turn's two extra calls are steps, later turns' are not.
        let mut s = SessionState::new(0, 0);
        for _ in 0..4 {
            llm_call(&mut s, true, None);
            for i in 0..3 {
                s.observe_tool("read", tool(i, i), 8);
            }
        }
        assert_eq!(s.stats.steps, 4 + 2);
        // A sub-agent's LLM call between a turn and its call (a search tool ranking with a
        // model of its own) is a step, and asks for none of the agent's calls; one that
        // asks for a call of its own covers it.
        let mut s = SessionState::new(0, 0);
        llm_call(&mut s, true, Some(1));
        llm_call(&mut s, false, Some(0));
        s.observe_tool("search", tool(1, 1), 8);
        assert_eq!(s.stats.steps, 2);
        llm_call(&mut s, false, Some(1));
        s.observe_tool("read", tool(2, 2), 8);
        assert_eq!(s.stats.steps, 3);
        // Tool calls no LLM call asked for are steps each.
        for i in 0..5 {
            s.observe_tool("read", tool(i, i), 8);
        }
        assert_eq!(s.stats.steps, 8);
    }

    #[test]
    fn window_and_rings_stay_bounded() {
        let mut s = SessionState::new(0, 0);
        for i in 0..10_000u64 {
            s.observe_tool(&format!("tool{}", i % 50), tool(i % 7, i), 8);
            s.is_duplicate(i);
        }
        assert_eq!(s.run.window.len(), WINDOW_CALLS);
        assert!(s.tools.len() <= MAX_NAMED_TOOLS + 1);
        assert_eq!(s.recent_event_ids.len(), RECENT_EVENT_IDS);
        assert_eq!(s.run.seen_pairs.len(), SEEN_PAIRS);
    }

    #[test]
    fn streaks_follow_the_sequence() {
        let mut s = SessionState::new(0, 0);
        for _ in 0..3 {
            s.observe_tool("read", tool(1, 1), 8);
        }
        assert_eq!(s.run.repeat_streak, 3);
        let f = s.observe_tool("list", tool(2, 2), 8);
        assert_eq!(s.run.repeat_streak, 1);
        assert_eq!(f.pair_count, 1);
        let f = s.observe_tool("read", tool(1, 1), 8);
        assert_eq!(f.pair_count, 4);
        assert_eq!(s.run.alternation, 3, "read,list,read");
    }

    #[test]
    fn cycles_need_an_irreducible_block() {
        let mut s = SessionState::new(0, 0);
        let mut last = ToolFacts::default();
        for i in 0..12u64 {
            last = s.observe_tool("t", tool(i % 3, i % 3), 8);
        }
        assert_eq!(last.cycle, Some((3, 12)), "12 calls covered");
        let mut s = SessionState::new(0, 0);
        for _ in 0..12 {
            last = s.observe_tool("t", tool(1, 1), 8);
        }
        assert_eq!(last.cycle, None);
    }

    #[test]
    fn a_first_run_id_after_events_without_one_is_a_new_run() {
        let mut s = SessionState::new(0, 0);
        s.touch(0, 0);
        assert!(!s.note_run(Some("a")), "the session's first event");
        let mut s = SessionState::new(0, 0);
        for _ in 0..2 {
            s.touch(0, 0);
            s.note_run(None);
            s.observe_tool("read", tool(1, 1), 8);
        }
        s.touch(0, 0);
        assert!(s.note_run(Some("a")));
        assert_eq!(s.run.window.len(), 0);
        s.touch(0, 0);
        assert!(!s.note_run(None), "no run_id: same run");
    }

    #[test]
    fn run_change_resets_loop_state_but_not_counters() {
        let mut s = SessionState::new(0, 0);
        s.note_run(Some("a"));
        s.observe_tool("read", tool(1, 1), 8);
        s.observe_tool("read", tool(1, 1), 8);
        assert!(s.note_run(Some("b")));
        assert_eq!(s.run.window.len(), 0);
        assert_eq!(s.stats.tool_calls, 2);
    }

    #[test]
    fn round_trips_through_bytes() {
        let mut s = SessionState::new(5, 5);
        s.observe_tool("read", tool(1, 2), 8);
        s.observe_llm(
            true,
            false,
            10,
            5,
            None,
            None,
            Some(0.5),
            Some(0),
            None,
            Some(&TextSketch::of("hello there")),
            None,
            0.85,
        );
        let back = SessionState::from_bytes(&s.to_bytes()).unwrap();
        assert_eq!(back, s);
    }
}

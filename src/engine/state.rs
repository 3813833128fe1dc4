//! Per-session state (DESIGN §4): what has happened in a session, as counters, a ring of
//! recent tool-call fingerprints, fixed-size text sketches and per-detector episode marks.
//!
//! Guarantees: the state is bounded whatever the session's length (every collection has
//! a fixed cap; tool names are capped in number and length); it holds digests, never
//! args, results or text; updating it is deterministic; it round-trips through
//! [`SessionState::to_bytes`] / [`SessionState::from_bytes`] unchanged.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::engine::content::ContentSample;
use crate::engine::detectors::{DetectorKind, DETECTOR_COUNT};
use crate::engine::policy::Level;
use crate::engine::text::TextSketch;

mod observe;
#[cfg(test)]
use observe::distinct_pairs;

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
    /// The result up to its digits (see [`crate::engine::fingerprint::ResultPrint::shape`]).
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
    /// How the previous turns opened (see [`crate::engine::text::opening`]), as many as
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
    /// Lines the run's results showed, sampled (see [`crate::engine::content`]), oldest first.
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
    /// [`crate::engine::content::ContentSample::all_seen_in`]).
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

/// An LLM call as the state sees it: its kind, tokens and cost, the calls it asks for,
/// and its text's features.
#[derive(Debug, Clone, Copy, Default)]
pub struct LlmObservation<'a> {
    pub is_turn: bool,
    pub is_compaction: bool,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: Option<u64>,
    pub cache_write_tokens: Option<u64>,
    pub cost_usd: Option<f64>,
    /// The tool calls it asks for, when it says.
    pub tool_calls: Option<u32>,
    pub progress: Option<f64>,
    pub sketch: Option<&'a TextSketch>,
    pub opening: Option<u64>,
    /// `similar_turns`' threshold: how alike two turns' sketches must be to count.
    pub min_similarity: f64,
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

#[cfg(test)]
mod tests;

//! The trajectory as the detectors read it (DESIGN §4): the session's counters, the
//! window of the run's recent tool calls, its polls and what its results showed, and
//! what one tool call did to them ([`ToolFacts`]).
//!
//! Guarantees: plain data, bounded (every collection has a fixed cap), digests only
//! (never args, results or text). Nothing here knows a detector: the detectors read
//! it, and keep their own counters beside it ([`crate::engine::detectors::Detector::State`]).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::engine::content::ContentSample;

/// Tools counted by name in `stats`; further tools are counted under [`OTHER_TOOLS`].
pub const MAX_NAMED_TOOLS: usize = 8;
/// Name under which tools past [`MAX_NAMED_TOOLS`] are counted.
pub const OTHER_TOOLS: &str = "(other)";
/// Longest tool name kept (longer names are cut at a char boundary).
pub const MAX_TOOL_NAME: usize = 40;
/// Recent distinct (action, result) pairs remembered for `no_new_information`.
pub const SEEN_PAIRS: usize = 32;
/// Poll actions tracked at once by `poll_no_progress`.
pub const POLL_TRACKERS: usize = 4;
/// The tool-call window of loop detectors (DESIGN §3: the last 30 calls of the run).
pub const WINDOW_CALLS: usize = 30;

/// Digests are random 64-bit values: as varints they would take 10 bytes, fixed they take 8.
pub(crate) mod fixed {
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
    /// On a poll ([`CallRecord::is_waiting`]): a job still working (see
    /// [`ToolObservation::waiting`]). On a call that is no poll: a read whose lines the
    /// run had nearly all seen ([`CallRecord::REREAD`]). The flag bits are part of the
    /// state's format: a bit added is 0 in states written before it (see
    /// [`CallRecord::WRITE`] for how a release before reads the halves given since).
    pub const WAITING: u8 = 16;
    /// On a poll ([`CallRecord::is_wait`]): a call that lets time pass and reads no job
    /// still working (see [`ToolObservation::wait`]): the call after it is a poll. On a
    /// call that is no poll: a read that showed new lines ([`CallRecord::NEW_LINES`]).
    pub const WAIT: u8 = 32;
    /// A result that says nothing in words (see [`ToolObservation::wordless`]).
    pub const WORDLESS: u8 = 64;
    /// On a poll ([`CallRecord::is_check`]): a check on a job that did not fail: a poll
    /// by its tool's class, a call whose answer reads a job still working right after a
    /// wait, or a result whose status says the job is still working (not a pending word
    /// in prose only). On a call that is no poll: a write ([`CallRecord::WRITE`]).
    pub const CHECK: u8 = 128;
    /// [`CallRecord::CHECK`]'s bit on a call that is no poll: a call of a tool classed
    /// `write`.
    ///
    /// A job still working, a wait and a check are always polls, so their bits' other
    /// halves were free. A state written before holds no write and no read judged by
    /// its lines: a call restored so is judged as a read too short to judge, as it was.
    /// A build before reads a write as an action that is no check, as it judged it; a
    /// read whose lines were all seen as a job still working (`ping_pong` and `cycle`
    /// leave an alternation or block with one alone); a read that showed new lines as a
    /// wait (the call after it, once, as a check after a wait, and a turn with it as one
    /// that waited, which `no_progress` weighs as a job moving). Each reads later
    /// findings, never earlier ones. Every flag bit is taken: another needs a state
    /// format change.
    pub const WRITE: u8 = Self::CHECK;
    /// [`CallRecord::WAIT`]'s bit on a call that is no poll: a read that showed lines
    /// the run had not seen, enough of them to judge (it did not fail, is no write; see
    /// [`crate::engine::content`]): a page of new rows. A short answer (an id, a few
    /// lines) or an image is not judged: its digest differs whether it is a new page or
    /// the same one with a fresh id or clock.
    pub const NEW_LINES: u8 = Self::WAIT;
    /// [`CallRecord::WAITING`]'s bit on a call that is no poll: a read judged by its lines
    /// whose lines the run had nearly all seen (at most one sampled line in eight new;
    /// see [`crate::engine::content`]): the same page with a new clock or request id in
    /// its footer.
    pub const REREAD: u8 = Self::WAITING;
    /// Both bits, [`CallRecord::NEW_LINES`] and [`CallRecord::REREAD`], on a call that is
    /// no poll: a read not judged by its lines (too few, or an image) that answered what
    /// this action had not answered before in the run (up to digits; see
    /// [`ToolFacts::news`]): a new page, or the same one with a fresh id.
    pub const NEW_ANSWER: u8 = Self::NEW_LINES | Self::REREAD;

    pub fn is_error(&self) -> bool {
        self.flags & Self::ERROR != 0
    }

    pub fn is_poll(&self) -> bool {
        self.flags & Self::POLL != 0
    }

    /// Whether a flag is set; for the bits that mean one thing on a poll and another on
    /// a call that is no poll, ask [`CallRecord::is_waiting`], [`CallRecord::is_wait`],
    /// [`CallRecord::is_check`], [`CallRecord::is_write`] or [`CallRecord::read`].
    pub fn has(&self, flag: u8) -> bool {
        debug_assert!(
            flag & (Self::WAITING | Self::WAIT | Self::CHECK) == 0,
            "a bit of two meanings"
        );
        self.flags & flag != 0
    }

    /// Whether `bit` is set on a poll (`on_poll`), or on a call that is no poll.
    fn has_on(&self, bit: u8, on_poll: bool) -> bool {
        let poll = if on_poll { Self::POLL } else { 0 };
        self.flags & (Self::POLL | bit) == poll | bit
    }

    /// A job still working (see [`CallRecord::WAITING`]).
    pub fn is_waiting(&self) -> bool {
        self.has_on(Self::WAITING, true)
    }

    /// A wait (see [`CallRecord::WAIT`]).
    pub fn is_wait(&self) -> bool {
        self.has_on(Self::WAIT, true)
    }

    /// A check on a job (see [`CallRecord::CHECK`]).
    pub fn is_check(&self) -> bool {
        self.has_on(Self::CHECK, true)
    }

    /// A write (see [`CallRecord::WRITE`]).
    pub fn is_write(&self) -> bool {
        self.has_on(Self::WRITE, false)
    }

    /// What a read showed (see [`Read`]).
    pub fn read(&self) -> Read {
        match self.flags & (Self::POLL | Self::NEW_ANSWER) {
            Self::NEW_LINES => Read::NewLines,
            Self::REREAD => Read::Reread,
            Self::NEW_ANSWER => Read::NewAnswer,
            _ => Read::Other,
        }
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
    pub(crate) fn news_key(&self) -> u64 {
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

/// How many items a ring gained since its session's state was last written
/// ([`crate::engine::state::SessionState::mark_written`]), for a delta that writes only
/// those (`engine::state::delta`). Not stored: a state read back or new says
/// [`Gained::WHOLE`], so that its next delta writes the whole ring (one emptied since
/// needs nothing: every item it then holds was counted). Not part of a state's equality
/// either: two states that hold the same are equal however they were written.
#[derive(Debug, Clone, Copy)]
pub struct Gained(u8);

impl Gained {
    /// Unknown, or more than any ring holds: the whole ring.
    pub const WHOLE: Gained = Gained(u8::MAX);
    /// Nothing since the last write.
    pub const NONE: Gained = Gained(0);

    /// One item pushed (counts stop short of [`Gained::WHOLE`], past every ring's cap).
    #[inline]
    pub fn push(&mut self) {
        if self.0 < u8::MAX - 1 {
            self.0 += 1;
        }
    }

    /// Whether the count is unknown (the ring is written whole).
    pub fn is_whole(self) -> bool {
        self.0 == u8::MAX
    }

    /// The items gained over two spans, one after the other.
    pub fn then(self, later: Gained) -> Gained {
        if self.is_whole() || later.is_whole() {
            Gained::WHOLE
        } else {
            Gained(self.0.saturating_add(later.0).min(u8::MAX - 1))
        }
    }

    /// The items of a ring of `len` a delta writes.
    pub fn of(self, len: usize) -> usize {
        if self.0 == u8::MAX {
            len
        } else {
            len.min(usize::from(self.0))
        }
    }
}

impl Default for Gained {
    fn default() -> Gained {
        Gained::WHOLE
    }
}

impl PartialEq for Gained {
    fn eq(&self, _: &Gained) -> bool {
        true
    }
}

/// What the current run's tool calls were and showed, shared by the loop detectors
/// (reset when `run_id` changes). A detector's own counters are its own
/// ([`crate::engine::detectors::Detector::State`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    pub window: VecDeque<CallRecord>,
    pub polls: Vec<PollTracker>,
    /// Calls at the window's end since a job last moved in this run (a poll by class or
    /// by a pending result, or a wait that reads a job still working, gave a new answer;
    /// at most the window; `None`: none has): a call that works (a `sleep`) repeats only
    /// these, since waiting on a job that moves is no loop; a failure repeats them all.
    pub since_poll_moved: Option<u8>,
    /// What the run's recent calls told the agent (see `CallRecord::news_key`).
    #[serde(with = "fixed::deque")]
    pub seen_pairs: VecDeque<u64>,
    /// Lines the run's results showed, sampled (see [`crate::engine::content`]), oldest first.
    #[serde(with = "fixed::deque")]
    pub seen_lines: VecDeque<u16>,
    /// What `window` and `seen_pairs` gained since the state was last written.
    #[serde(skip)]
    pub window_gained: Gained,
    #[serde(skip)]
    pub pairs_gained: Gained,
}

impl RunState {
    /// The latest call (on a tool call's event: that call, as the window keeps it).
    pub fn latest(&self) -> Option<CallRecord> {
        self.window.back().copied()
    }

    /// The call `back` calls before the latest one (1: the one before it), once the
    /// latest has joined the window.
    pub fn before_latest(&self, back: usize) -> Option<CallRecord> {
        let n = self.window.len();
        (back < n).then(|| self.window[n - 1 - back])
    }

    /// Where the last `n` calls got (see [`Got`]).
    pub fn got_in_last(&self, n: u32) -> Got {
        let len = self.window.len();
        // In a full window the oldest call's predecessors have left it: it is judged
        // only as the one before the others.
        let from = len
            .saturating_sub(n as usize)
            .max(usize::from(len == WINDOW_CALLS));
        let (mut acted, mut new, mut job_moved) = (false, false, false);
        for i in from..len {
            let rec = &self.window[i];
            let mut before = self.window.range(..i);
            // (`||`: a call's predecessors are looked at only while the answer is open.)
            if rec.is_wait() {
                job_moved = true;
            } else if rec.is_check() {
                job_moved = job_moved
                    || !before.any(|prev| prev.action == rec.action && prev.result == rec.result);
            } else {
                acted = true;
                new = new
                    || if rec.has(CallRecord::WORDLESS) {
                        !before.any(|prev| prev.action == rec.action)
                    } else {
                        !before.any(|prev| prev.shape == rec.shape)
                    };
            }
        }
        match (new, job_moved && !acted) {
            (true, _) => Got::New,
            (false, true) => Got::JobMoving,
            (false, false) => Got::Nowhere,
        }
    }
}

/// What a call that is no poll showed, as its record keeps it
/// ([`CallRecord::NEW_LINES`], [`CallRecord::REREAD`], [`CallRecord::NEW_ANSWER`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// Judged by its lines: lines the run had not seen.
    NewLines,
    /// Judged by its lines: only lines the run had seen.
    Reread,
    /// Not judged by its lines (too few, or an image): an answer new to the run.
    NewAnswer,
    /// Anything else: a poll, a failure, a write, an answer without words, or one this
    /// action gave before.
    Other,
}

/// Whether a repeated call paged before it came again (see [`RunState::paged`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Paged {
    /// Nothing new was read between, or something other than the same read again came
    /// between (a write, an edit by a command, a new question): an attempt again.
    No,
    /// A read between gave an answer new to the run, too short to judge by its lines,
    /// or an image ([`Read::NewAnswer`]): a new page, or the same one with a fresh id.
    Maybe,
    /// A read between showed new lines ([`CallRecord::NEW_LINES`]): a new page.
    Yes,
}

/// How many of a call's earlier occurrences paged (see [`RunState::paged_outcomes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PagedCount {
    pub surely: u32,
    pub maybe: u32,
}

impl RunState {
    /// Of the latest call's outcome's earlier occurrences among the calls its window
    /// count looks at (a success counts those since a job last moved: see
    /// [`RunState::since_poll_moved`]), how many paged before the outcome came again
    /// (see [`RunState::paged`]). A failure pages nothing.
    pub fn paged_outcomes(&self) -> PagedCount {
        let mut count = PagedCount::default();
        let Some(latest) = self.latest().filter(|l| !l.is_error()) else {
            return count;
        };
        let n = self.window.len();
        // The calls before the latest that its count looked at (the latest has joined
        // the window, and `since_poll_moved` counts it).
        let span = self
            .since_poll_moved
            .map_or(n - 1, |since| usize::from(since).saturating_sub(1))
            .min(n - 1);
        let mut last = None;
        for i in n - 1 - span..n {
            let rec = &self.window[i];
            if rec.same_outcome(&latest) && !rec.has(CallRecord::RETRY_SAFE) {
                match last.map(|at| self.paged(at, i)) {
                    Some(Paged::Yes) => count.surely += 1,
                    Some(Paged::Maybe) => count.maybe += 1,
                    _ => {}
                }
                last = Some(i);
            }
        }
        count
    }

    /// Whether the latest call, a success, repeats an earlier call and result that
    /// surely paged before it came again (see [`RunState::paged`]). Asked for every
    /// repeated pair (`circuit_breaker`): a look over the calls since its last time.
    pub fn repeat_paged(&self) -> bool {
        let Some(latest) = self.latest().filter(|l| !l.is_error()) else {
            return false;
        };
        let n = self.window.len();
        (self.window.range(..n - 1))
            .rposition(|prev| prev.same_pair(&latest))
            .is_some_and(|at| self.paged(at, n - 1) == Paged::Yes)
    }

    /// Whether the call at `at` paged before the call at `next`: the action moved a
    /// cursor (a `Next page` click, a scroll, whose answer is the same while the same
    /// read after it, a snapshot, a screenshot, is not), so coming back to it is paging,
    /// not a loop. Every call between must be the same read again (its action earlier in
    /// the window) or a poll (a wait for the page). Anything else makes it an attempt,
    /// whatever a read after it shows: a write (an edit, then the same script's same
    /// output, then the same `git diff`), an edit by a shell command, a new question
    /// (another file each time before the same check). So does the action being a write
    /// itself (the same insert grows what is read after it). A read counts when its
    /// answer differs from its last one (lines a bounded memory forgot are no news when
    /// the answer is the same): with new lines it paged, with a short answer or an image
    /// new to the run it may have.
    pub fn paged(&self, at: usize, next: usize) -> Paged {
        let repeated = self.window[at];
        if repeated.is_write() {
            return Paged::No;
        }
        let mut paged = Paged::No;
        for i in at + 1..next {
            let rec = &self.window[i];
            if rec.is_poll() {
                continue;
            }
            let last = (self.window.range(..i).rev()).find(|prev| prev.action == rec.action);
            let Some(last) = last.filter(|_| rec.action != repeated.action && !rec.is_write())
            else {
                return Paged::No;
            };
            if last.result != rec.result {
                paged = paged.max(match rec.read() {
                    Read::NewLines => Paged::Yes,
                    Read::NewAnswer => Paged::Maybe,
                    Read::Reread | Read::Other => Paged::No,
                });
            }
        }
        paged
    }
}

/// Where a turn's calls got, for a progress score that stood still.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Got {
    /// Every answer was one the window had: up to digits, from any call (a game's move
    /// counter, a command's wall time, a pipeline's new number are no news, nor is the
    /// same "No matches found." to another pattern).
    Nowhere,
    /// An answer no call before it in the window got; an answer without words (an empty
    /// output) is news to a question new to the window.
    New,
    /// Only waits and checks on a job (see [`CallRecord::CHECK`]: a call whose prose only
    /// mentions waiting, a failing check, a call that is a poll only for following a
    /// wait are judged as actions), one of them a wait or a check whose
    /// answer changed (digits count: `35% complete` → `60% complete`): a job the agent
    /// waits on is moving, which is progress for every detector (DESIGN §3); the check
    /// after a wait says whether it moved. A turn that also acts is judged by what its
    /// actions got: a health check's ticking uptime beside the same failing deploy is no
    /// progress.
    JobMoving,
}

/// What a tool call did, as bits of [`ToolFacts::did`]: `similar_turns` gathers them
/// between turns with text.
pub struct Did;

impl Did {
    /// The call learned something new: an answer this action had not given before
    /// (see `CallRecord::news_key`) that showed lines the run had not seen.
    pub const LEARNED: u8 = 1;
    /// The call made progress: a poll (a changed status is progress; an unchanged one is
    /// `poll_no_progress`'s to judge, with the room polls get), or an outcome new to the
    /// window (the same call answering differently, digits included: a price, a
    /// progress count; a failure up to its digits).
    pub const PROGRESSED: u8 = 2;
    /// The call succeeded and was not a [`Did::REREAD`]: the agent did something (a
    /// write, a poll, a read that showed lines the run had not seen, or one too short
    /// to judge by its lines).
    pub const SUCCEEDED: u8 = 4;
    /// The call failed.
    pub const FAILED: u8 = 8;
    /// The call was a poll.
    pub const POLLED: u8 = 16;
    /// The call was a read that succeeded, whose sampled lines the run had nearly all seen (see
    /// [`crate::engine::content::ContentSample::seen_then_remember`]).
    pub const REREAD: u8 = 32;
}

/// A session's own clock, from its first event to its latest, in seconds.
pub fn wall_seconds(first_event_ms: i64, last_event_ms: i64) -> f64 {
    (last_event_ms - first_event_ms).max(0) as f64 / 1000.0
}

/// Whether `q` holds `item`: every entry compared, without an early exit, which the
/// compiler turns into SIMD compares (most lookups of these sets miss).
#[inline]
pub(crate) fn holds<T: Copy + PartialEq>(q: &VecDeque<T>, item: T) -> bool {
    let any = |s: &[T]| s.iter().fold(false, |found, &x| found | (x == item));
    let (front, back) = q.as_slices();
    any(front) | any(back)
}

/// Pushes `item`, dropping the oldest items past `cap`; returns the one that left.
pub(crate) fn push_bounded<T>(q: &mut VecDeque<T>, item: T, cap: usize) -> Option<T> {
    // `while`: a stored state holding more (written by another build) comes back down.
    let mut departed = None;
    while q.len() >= cap {
        departed = q.pop_front();
    }
    q.push_back(item);
    departed
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
    /// Unchanged results in a row of this poll action (0 when not a poll).
    pub poll_unchanged: u32,
    /// The call that left the window when this one joined it (the window was full):
    /// with the window it makes the calls before this one and this one.
    pub departed: Option<CallRecord>,
    /// This call is a poll whose result changed (and did not fail): the job it waits on
    /// is moving, which is progress for every detector.
    pub poll_moved: bool,
    /// What this call told the agent, for information gain: `None` when it counts
    /// neither as news nor as old news (a poll; a call repeated with an answer without
    /// words); `Some(seen)`: whether this action had given this answer before in the run.
    pub news: Option<bool>,
    /// What it did, as bits of [`Did`].
    pub did: u8,
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
    /// A poll by class or a pending-looking result, or a check after a wait: the call
    /// right after one, or a command that sleeps first (see `SessionState::observe_tool`).
    pub poll: bool,
    /// A call that lets time pass: a wait by class, or a shell command that only sleeps.
    pub wait: bool,
    /// The result reads as pending, in a status or in words (`still running, step 100`).
    pub reads_pending: bool,
    /// A shell command that sleeps a second or more and then checks (`sleep 60 && tail
    /// apply.log`): a check after its own wait.
    pub sleeps_first: bool,
    /// A poll only for being a check after a wait: the call right after one, or one that
    /// sleeps first (set by `SessionState::observe_tool`, which reads the call before).
    /// Its unchanged answers are judged as a poll's, its changes are no job moving for
    /// the other detectors.
    pub after_wait: bool,
    /// A success whose result says a job is still working, as a status (a status field,
    /// or a value that is a pending word alone; not prose, where a pod table's `Running`
    /// or a test run's `2 pending` is no job waited on).
    pub waiting: bool,
    /// A poll by its tool's class (`[tools] poll`, or `wait`).
    pub poll_class: bool,
    /// A call that was a poll already (by its class or its answer) and comes right after
    /// a wait: a check on the job waited for. (A call that is a poll only for following
    /// a wait is `after_wait` instead.)
    pub checks_after_wait: bool,
    pub retry_safe: bool,
    pub write: bool,
    /// The lines the result showed, sampled (empty when it says nothing in words).
    pub content: ContentSample,
}

impl CallRecord {
    /// A tool call as the window keeps it.
    pub fn of(obs: &ToolObservation) -> CallRecord {
        // The halves of `WAITING`, `WAIT` and `CHECK` on a call that is no poll mean
        // something else (see `CallRecord::WRITE`): a wait or a job still working is a
        // poll (`work.rs`: a wait or a pending answer makes one; `waiting` reads pending).
        debug_assert!(
            obs.poll || !(obs.wait || obs.waiting),
            "a wait or a job still working that is no poll"
        );
        CallRecord {
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
                })
                | (if obs.waiting { CallRecord::WAITING } else { 0 })
                | (if obs.wordless { CallRecord::WORDLESS } else { 0 })
                // A failing check's change is no job moving (an error's numbers are
                // counters), nor is that of a call taken for a poll only for following a
                // wait (new pod names after each restart and sleep).
                | (if obs.poll
                    && !obs.is_error
                    && (obs.poll_class || obs.checks_after_wait || obs.waiting)
                {
                    CallRecord::CHECK
                } else {
                    0
                })
                | (if obs.write && !obs.poll {
                    CallRecord::WRITE
                } else {
                    0
                })
                // (A read's lines are judged later: `CallRecord::NEW_LINES`, `REREAD`.)
                // A wait that reads a job still working (`wait_for_job` answering
                // `still running`) is a check on it as well: no bare wait.
                | (if obs.wait && !obs.reads_pending {
                    CallRecord::WAIT
                } else {
                    0
                }),
        }
    }
}

//! Per-session state (DESIGN §4), as stored: the session's identity, its trajectory
//! ([`crate::engine::trajectory`]: counters, the run's window of tool calls, what its
//! results showed), each detector's own counters ([`DetectorStates`], declared by the
//! detectors), and the engine's per-detector episode marks, finding counts and
//! termination.
//!
//! Guarantees: the state is bounded whatever the session's length (every collection has
//! a fixed cap; tool names are capped in number and length); it holds digests, never
//! args, results or text; updating it is deterministic; it round-trips through
//! [`SessionState::to_bytes`] / [`SessionState::from_bytes`] unchanged, and its layout
//! is pinned to [`crate::engine::store::STATE_FORMAT`] (`layout_tests`); against the
//! state last written it round-trips through a delta ([`SessionState::delta_bytes`] /
//! [`SessionState::apply_delta`], the `delta` module) too.

use std::borrow::Cow;
use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::contract::event::hex;
use crate::engine::detectors::{DetectorKind, DetectorStates, SessionView, DETECTOR_COUNT};
use crate::engine::levels::Level;
use crate::engine::trajectory::{
    fixed, holds, push_bounded, wall_seconds, Counters, Gained, RunState, ToolCount,
};
use crate::prefetch;

mod delta;
mod encode;
mod observe;

pub use delta::{DeltaError, Marks, DELTA_FORMAT};
pub use encode::Encode;

/// Recent event ids remembered to drop exact duplicates.
pub const RECENT_EVENT_IDS: usize = 16;
/// Longest `run_id` / `agent_id` / `tenant` kept ([`kept_label`]).
pub const MAX_LABEL: usize = 128;
/// The most bytes a label longer than [`MAX_LABEL`] keeps of its own, before its digest.
pub const LABEL_PREFIX: usize = MAX_LABEL - 1 - LABEL_DIGEST_HEX;
/// Hex digits of a long label's SHA-256 that its kept form ends with.
const LABEL_DIGEST_HEX: usize = 12;
/// The serialized size session states stay under (DESIGN §4 target): every state the
/// adversarial and property tests drive, and the recorded agent sessions' (median
/// 1.0–1.5 kB, largest 1.87 kB).
pub const STATE_BYTES_BOUND: usize = 2048;
/// The size no state passes: every ring full and every label and tool name at its cap
/// at once take 3,212 bytes, and each of the counters grown large a few bytes more.
/// Above DESIGN §4's 2 KiB: the rings alone take 1.6 kB, and eight tool names and
/// three labels at their caps another 0.7 kB.
pub const STATE_BYTES_MAX: usize = 3 * 1024 + 256;
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

/// Each detector's episode marks, held sparse: most detectors never emit in a session, and
/// a full list (25 × 24 bytes) was over a quarter of an open session's memory. The used
/// ones, in detector order; a detector without an entry has the default marks.
#[derive(Debug, Clone, Default)]
pub struct Episodes(Vec<(u8, Episode)>);

impl Episodes {
    fn find(&self, kind: DetectorKind) -> Result<usize, usize> {
        self.find_index(kind.index() as u8)
    }

    fn find_index(&self, index: u8) -> Result<usize, usize> {
        self.0.binary_search_by_key(&index, |(i, _)| *i)
    }

    /// The marks of `kind`'s current episode.
    pub fn get(&self, kind: DetectorKind) -> Episode {
        self.find(kind)
            .map_or_else(|_| Episode::default(), |at| self.0[at].1)
    }

    /// `kind`'s marks, to change (an entry is made for it).
    pub fn get_mut(&mut self, kind: DetectorKind) -> &mut Episode {
        self.entry(kind.index() as u8)
    }

    /// The marks of the detector at `index` (in range), an entry made for it if need be.
    fn entry(&mut self, index: u8) -> &mut Episode {
        let at = match self.find_index(index) {
            Ok(at) => at,
            Err(at) => {
                self.0.insert(at, (index, Episode::default()));
                at
            }
        };
        &mut self.0[at].1
    }

    /// `kind`'s marks, to change, when it has an entry (one made by [`Episodes::get_mut`]
    /// may still hold the default).
    pub fn existing_mut(&mut self, kind: DetectorKind) -> Option<&mut Episode> {
        let at = self.find(kind).ok()?;
        Some(&mut self.0[at].1)
    }

    /// The entries that differ from the default, in detector order.
    fn used(&self) -> impl Iterator<Item = &(u8, Episode)> + '_ {
        self.0.iter().filter(|(_, e)| *e != Episode::default())
    }
}

/// Equal when every detector's marks are: an entry holding the default marks is no entry.
impl PartialEq for Episodes {
    fn eq(&self, other: &Episodes) -> bool {
        self.used().eq(other.used())
    }
}

/// Episodes are mostly untouched: only the non-default ones are stored, with their index.
mod sparse_episodes {
    use super::{Episode, Episodes, DETECTOR_COUNT};
    use serde::{Deserialize, Deserializer, Serializer};

    /// Written as a `Vec<(u8, Episode)>` of the used ones, in detector order.
    pub fn serialize<S: Serializer>(v: &Episodes, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq as _;
        let mut seq = s.serialize_seq(Some(v.used().count()))?;
        for entry in v.used() {
            seq.serialize_element(entry)?;
        }
        seq.end()
    }

    /// An index past the detectors (a newer build's) is passed over; of one index given
    /// twice, the later holds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Episodes, D::Error> {
        let mut out = Episodes::default();
        for (i, e) in Vec::<(u8, Episode)>::deserialize(d)? {
            if (i as usize) < DETECTOR_COUNT {
                *out.entry(i) = e;
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
    /// The session's own clock: its first and latest event times, with each break in it
    /// (an event more than the session gap after the latest, [`SessionState::touch`])
    /// taken out of the span between them: the first is moved forward by the break.
    pub first_event_ms: i64,
    pub last_event_ms: i64,
    /// The stream's clock (the partition's latest event time) when the session's latest
    /// event arrived: idleness is measured from here, so a session whose own clock lags
    /// the stream is not closed for it.
    pub last_arrival_ms: i64,
    pub stats: Counters,
    pub tools: Vec<ToolCount>,
    pub run: RunState,
    /// Each detector's own counters of the current run.
    pub counters: DetectorStates,
    #[serde(with = "fixed::deque")]
    pub recent_event_ids: VecDeque<u64>,
    /// What `recent_event_ids` gained since the state was last written.
    #[serde(skip)]
    pub ids_gained: Gained,
    #[serde(with = "sparse_episodes")]
    pub episodes: Episodes,
    pub findings: Vec<FindingCounts>,
    pub termination: Option<Termination>,
}

/// The events after its termination from which a session was not stopped by its runtime:
/// one that stopped it may still report the calls in flight when the verdict reached it
/// (the model call under way and the tool calls it asked for), and its own
/// `session.completed`, which is not counted here; a loop that goes on passes this within
/// as many of its steps.
pub const UNSTOPPED_AFTER: u64 = 8;
// The metric counts a session at this event, told only at powers of two.
const _: () = assert!(UNSTOPPED_AFTER.is_power_of_two());

/// A terminated session still sending events ([`SessionState::unheeded_termination`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnheededTermination {
    /// The session's events since its termination, the one that tells included.
    pub events: u64,
    /// The detector that terminated it.
    pub detector: DetectorKind,
    /// Event time from the termination to that event (0 when a clock put it before).
    pub after_ms: i64,
}

/// A session closed by `session.completed`, as the engine remembers it for a while: an
/// event of it stamped at or before its end is a straggler, not a new session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completed {
    /// Its latest event time.
    pub end_ms: i64,
    /// The stream's clock when it closed.
    pub closed_at: i64,
}

/// What an event's labels changed in its session ([`SessionState::note_labels`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Relabelled {
    /// A label was set anew: the session's policy may have changed.
    pub labels: bool,
    /// The tenant the session had, when the event names another. An agent may hand a
    /// session to another agent, but a session's tenant is not expected to change: two
    /// tenants' sessions under one id (judged as one), or producers that name one
    /// session's tenant differently.
    pub other_tenant_was: Option<String>,
}

/// Why a stored state could not be read back (poison for that key).
#[derive(Debug, thiserror::Error)]
#[error("corrupt session state: {0}")]
pub struct CorruptState(#[from] postcard::Error);

/// A label (`run_id`, `agent_id`, `tenant`, a runtime's stop reason) as loopwarden keeps
/// it: whole up to [`MAX_LABEL`] bytes (an ARN, a cloud resource name); a longer one as
/// at most its first 115 bytes (cut at a character boundary), `~` and 12 hex digits of
/// its SHA-256, at most [`MAX_LABEL`] bytes in all. State stays bounded, and labels that
/// differ stay apart (but for a 48-bit collision, or a label sent in that very form):
/// cut alone, run ids alike in their first bytes (`…/sessions/42/runs/7`) were one run.
/// An arriving label is compared by its kept form: compared whole with its cut, a long
/// run id was a new run at every event, which reset the loop detectors at each.
/// Borrowed when kept whole: the common case costs a length check.
pub fn kept_label(s: &str) -> Cow<'_, str> {
    if s.len() <= MAX_LABEL {
        return Cow::Borrowed(s);
    }
    let digest = Sha256::digest(s.as_bytes());
    let mut kept = String::with_capacity(MAX_LABEL);
    kept.push_str(cut_at_char(s, LABEL_PREFIX));
    kept.push('~');
    kept.push_str(&hex(&digest[..LABEL_DIGEST_HEX / 2]));
    Cow::Owned(kept)
}

/// The longest label a build before [`kept_label`] stored, cut to it.
const OLDER_MAX_LABEL: usize = 64;

/// How a label as stored stands to a label as it comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stands {
    /// The stored one is its kept form.
    Same,
    /// The stored one is its cut to 64 bytes, as a build before kept it: the same label
    /// in a state stored before an upgrade, or another that starts with a 64-byte one.
    Older,
    Other,
}

fn stands(kept: Option<&str>, label: &str) -> Stands {
    if kept == Some(&*kept_label(label)) {
        Stands::Same
    } else if label.len() > OLDER_MAX_LABEL && kept == Some(cut_at_char(label, OLDER_MAX_LABEL)) {
        Stands::Older
    } else {
        Stands::Other
    }
}

/// `s` cut to at most `max` bytes, at a char boundary.
pub(crate) fn cut_at_char(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// An LLM call as the session's counters see it: its kind, tokens and cost, and the
/// calls it asks for.
#[derive(Debug, Clone, Copy, Default)]
pub struct LlmObservation {
    pub is_turn: bool,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: Option<u64>,
    pub cache_write_tokens: Option<u64>,
    pub cost_usd: Option<f64>,
    /// The tool calls it asks for, when it says.
    pub tool_calls: Option<u32>,
}

impl SessionState {
    pub fn new(first_event_ms: i64, arrival_ms: i64) -> SessionState {
        SessionState {
            first_event_ms,
            last_event_ms: first_event_ms,
            last_arrival_ms: arrival_ms,
            ..SessionState::default()
        }
    }

    /// The state stored under a completed session's key while the engine remembers it:
    /// one that counts no event, which no session's state does (the event that opens a
    /// session is counted before anything is stored), its end as its latest event time and
    /// the clock it closed at as its arrival. A build before this one reads it as a session
    /// without events, which closes idle.
    pub fn completed_marker(completed: Completed) -> SessionState {
        SessionState {
            first_event_ms: completed.end_ms,
            last_event_ms: completed.end_ms,
            last_arrival_ms: completed.closed_at,
            ..SessionState::default()
        }
    }

    /// The completed session a stored state marks ([`SessionState::completed_marker`]).
    pub fn as_completed_marker(&self) -> Option<Completed> {
        (self.stats.events == 0).then_some(Completed {
            end_ms: self.last_event_ms,
            closed_at: self.last_arrival_ms,
        })
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.to_bytes_with(&mut Vec::new())
    }

    /// [`SessionState::to_bytes`], written into `scratch` first (its capacity kept from
    /// state to state), then copied once at its size: a vector grown from empty is
    /// reallocated half a dozen times for every state stored. The bytes are postcard's
    /// for the derived `Serialize`, written by [`Encode`] (the `encode` module).
    pub fn to_bytes_with(&self, scratch: &mut Vec<u8>) -> Vec<u8> {
        self.to_bytes_after_room_with(scratch, 0)
    }

    /// [`SessionState::to_bytes_with`] after `room` zero bytes (the changelog's frame
    /// goes there: `store::StateBytes`), in the one copy out of `scratch`.
    pub fn to_bytes_after_room_with(&self, scratch: &mut Vec<u8>, room: usize) -> Vec<u8> {
        scratch.clear();
        self.encode(scratch);
        let mut out = Vec::with_capacity(room + scratch.len());
        out.resize(room, 0);
        out.extend_from_slice(scratch);
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<SessionState, CorruptState> {
        Ok(postcard::from_bytes(bytes)?)
    }

    /// Records the agent and tenant an event names, and says what changed.
    pub fn note_labels(&mut self, agent_id: Option<&str>, tenant: Option<&str>) -> Relabelled {
        let mut relabelled = Relabelled::default();
        if let Some(a) = agent_id {
            if stands(self.agent_id.as_deref(), a) != Stands::Same {
                self.agent_id = Some(kept_label(a).into_owned());
                relabelled.labels = true;
            }
        }
        if let Some(t) = tenant {
            let stood = stands(self.tenant.as_deref(), t);
            if stood != Stands::Same {
                let was = self.tenant.replace(kept_label(t).into_owned());
                relabelled.other_tenant_was = was.filter(|_| stood == Stands::Other);
                relabelled.labels = true;
            }
        }
        relabelled
    }

    /// Counts an event of a terminated session, which is dropped, not applied; returns
    /// the session's tenant when the event, `tenant` its, names another (told, as
    /// [`SessionState::note_labels`] tells it of a live session, without recording it).
    pub fn drop_after_termination(&mut self, tenant: Option<&str>) -> Option<String> {
        self.stats.dropped_after_termination += 1;
        let other = tenant.is_some_and(|t| stands(self.tenant.as_deref(), t) == Stands::Other);
        // None when the session has no tenant: naming one then is no other.
        other.then(|| self.tenant.clone())?
    }

    /// The termination of a session that goes on sending events, when the event just
    /// dropped ([`SessionState::drop_after_termination`]), at `event_ms`, is its
    /// [`UNSTOPPED_AFTER`]th since, or a later power of two: its runtime did not stop it.
    /// Not when that event `completes` the session (a runtime that stopped it sends its
    /// `session.completed`). Counted in the state, so a restart tells the same events.
    pub fn unheeded_termination(
        &self,
        event_ms: i64,
        completes: bool,
    ) -> Option<UnheededTermination> {
        let events = self.stats.dropped_after_termination;
        let told = !completes && events >= UNSTOPPED_AFTER && events.is_power_of_two();
        let t = self.termination.filter(|_| told)?;
        Some(UnheededTermination {
            events,
            detector: t.detector,
            after_ms: event_ms.saturating_sub(t.at_ms).max(0),
        })
    }

    /// Records the `run_id` an event names; true when it starts a new run, which resets
    /// the loop detectors' state: a changed `run_id`, or the first one of a session that
    /// had sent events without one (a runtime that starts naming runs has started a new
    /// one). An event without `run_id` stays in the current run.
    pub fn note_run(&mut self, run_id: Option<&str>) -> bool {
        let Some(run) = run_id else { return false };
        // A run id stored cut by a build before is taken for another (`Stands::Older`
        // cannot tell it from a 64-byte run id this build kept, and another run taken
        // for the same one would join two runs' loops): a new run once, at an upgrade.
        if stands(self.run_id.as_deref(), run) == Stands::Same {
            return false;
        }
        // `touch` has counted this event: more than one means the session had a past.
        let changed = self.run_id.is_some() || self.stats.events > 1;
        self.run_id = Some(kept_label(run).into_owned());
        if changed {
            self.run = RunState::default();
            self.counters = DetectorStates::default();
            for kind in DetectorKind::ALL.iter().filter(|k| !k.is_ceiling()) {
                self.end_episode(*kind);
            }
        }
        changed
    }

    /// Asks memory for the parts of the state an event reads (its rings, sketches and
    /// tables), all at once: a state that has left the cache (a fleet of many sessions
    /// touches each once a batch) would otherwise miss on each part in turn, as the
    /// event's path reaches it. Called as the session is found, before the event's own
    /// features are computed, so the loads overlap that work. A hint: no result depends
    /// on it.
    #[inline]
    pub fn prefetch(&self) {
        const MAX: usize = 1024;
        prefetch::value(self);
        prefetch::deque(&self.recent_event_ids, MAX);
        prefetch::deque(&self.run.window, MAX);
        prefetch::deque(&self.run.seen_pairs, MAX);
        prefetch::deque(&self.run.seen_lines, MAX);
        prefetch::slice(&self.run.polls, MAX);
        prefetch::slice(&self.tools, MAX);
        let turns = &self.counters.similar_turns;
        prefetch::deque(&turns.sketches, MAX);
        prefetch::deque(&turns.openings, MAX);
        prefetch::slice(&self.episodes.0, MAX);
        prefetch::slice(&self.findings, MAX);
    }

    /// Returns true when `event_id` was seen recently (an exact duplicate to drop).
    pub fn is_duplicate(&mut self, event_hash: u64) -> bool {
        if holds(&self.recent_event_ids, event_hash) {
            self.stats.duplicates += 1;
            return true;
        }
        push_bounded(&mut self.recent_event_ids, event_hash, RECENT_EVENT_IDS);
        self.ids_gained.push();
        false
    }

    /// Counts an event of the session at `event_ms` (its own time) that arrived when the
    /// stream's clock read `arrival_ms`.
    ///
    /// An event more than `gap` (the session gap) after the session's latest is a break
    /// in its clock, not time it ran: a live session silent that long would have closed.
    /// Its events then come from clocks that disagree (a runtime that stamps local time as
    /// UTC, a host whose clock is hours off, a first event without a time of its own), and
    /// the span up to it would be a skew read as a duration, enough for `wall_clock_cap` to
    /// stop a session seconds old. So the span leaves the break out: the first event time
    /// moves forward by it. An event behind the latest moves neither.
    pub fn touch(&mut self, event_ms: i64, arrival_ms: i64, gap: i64) {
        self.stats.events += 1;
        let ahead = event_ms.saturating_sub(self.last_event_ms);
        if ahead > gap {
            self.first_event_ms = self.first_event_ms.saturating_add(ahead);
        }
        self.last_event_ms = self.last_event_ms.max(event_ms);
        self.last_arrival_ms = self.last_arrival_ms.max(arrival_ms);
    }

    /// Closes the detector's current episode, if it emitted anything.
    pub fn end_episode(&mut self, kind: DetectorKind) {
        // A detector without marks has nothing to close (the default is closed).
        let Some(e) = self.episodes.existing_mut(kind) else {
            return;
        };
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
        self.counters = DetectorStates::default();
        self.recent_event_ids.clear();
    }

    /// The session as detector `kind` reads it: the trajectory, every detector's
    /// counters, and the subject of `kind`'s open episode.
    pub fn view_for(&self, kind: DetectorKind) -> SessionView<'_, DetectorStates> {
        SessionView {
            stats: &self.stats,
            run: &self.run,
            first_event_ms: self.first_event_ms,
            last_event_ms: self.last_event_ms,
            subject: self.episodes.get(kind).subject,
            own: &self.counters,
        }
    }

    pub fn wall_seconds(&self) -> f64 {
        wall_seconds(self.first_event_ms, self.last_event_ms)
    }
}

#[cfg(test)]
mod layout_tests;
#[cfg(test)]
mod tests;

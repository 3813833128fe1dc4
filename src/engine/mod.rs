//! The engine: applies validated events to session state, runs every detector, turns
//! signals into findings (levels, episodes, modes, the termination tombstone) and closes
//! sessions on event-time gaps and `session.completed`.
//!
//! Guarantees: synchronous and deterministic (time is the events' own time; the only
//! clock is the watermark, the latest event time seen, or one injected by the caller);
//! `terminate` is emitted at most once per session; a session's state is bounded; the
//! per-event cost does not grow with the number of open sessions (hash map lookup plus
//! a coalesced expiry heap). All I/O (reading input, publishing, storing) is the caller's.
//!
//! Its parts, each a module: `state` (bounded per-session state), `detectors` (one file
//! each, and the list that makes them a set), `policy` (levels, modes, thresholds and
//! overrides), `fingerprint` (canonical SHA-256 digests of actions and results),
//! `content` (what a result showed), `text` (features of assistant text), `hash` (the
//! fast in-process hashes) and `store`
//! (sled and in-memory state stores).

pub mod content;
pub mod detectors;
pub mod fingerprint;
pub mod hash;
pub mod levels;
pub mod policy;
pub mod state;
pub mod store;
pub mod text;
pub mod trajectory;

mod judge;
mod work;

use judge::judge;
use work::{hash_id, policy_key, Work};

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::{Hash, Hasher};
use std::ptr::NonNull;
use std::sync::Arc;

use hashbrown::hash_map::EntryRef;
use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet, FxHasher};

use crate::config::{Config, ToolClasses};
use crate::contract::event::{
    format_rfc3339_ms, CallKind, Completion, Event, EventBody, LlmCall, ToolCall,
};
use crate::contract::json;
use crate::contract::output::{
    finding_event_id, summary_event_id, ClosedBy, FindingEvent, Output, Stats, SummaryEvent,
    Trigger, SCHEMA_VERSION,
};
use crate::engine::content::ContentSample;
use crate::engine::detectors::{Context, DetectorKind, Input, LlmContext, On, Signal, ToolContext};
use crate::engine::levels::{Level, Mode};
use crate::engine::policy::Policy;
use crate::engine::state::{
    cut_at_char, kept_label, Completed, LlmObservation, Marks, SessionState, UnheededTermination,
};
use crate::engine::store::{StateBytes, StateStore, StoreBatch, StoreError};
use crate::engine::text::{opening, turn_features, Chant, ChantRule, ChantScratch, TextSketch};
use crate::engine::trajectory::ToolObservation;
use crate::prefetch;
use fingerprint::Fingerprinter;

/// Where an event came from, for `trigger` and for the event-time fallback.
#[derive(Debug, Clone, Copy, Default)]
pub struct EventMeta<'a> {
    /// Borrowed: an event's topic is its consumer's, and only a finding copies it.
    pub topic: Option<&'a str>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    /// The Kafka message timestamp: the event's time when it has no `timestamp`, and with
    /// the processing time the bound on how far its time moves the clock ([`clock_limit`]).
    pub message_timestamp_ms: Option<i64>,
    /// Processing time (`run`'s host clock) for `detected_at`, and the bound on how far an
    /// event's time moves the clock ([`clock_limit`]); `None` uses the event time and takes
    /// every time as it is (replay).
    pub processing_time_ms: Option<i64>,
}

/// Counters the pipeline exports as metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineCounters {
    pub events: u64,
    pub duplicates: u64,
    /// Events of sessions terminated (enforced) before them: dropped. A runtime that
    /// stopped the session may still report the calls in flight and its completion; more
    /// is told ([`Engine::take_unheeded_termination`]).
    pub dropped_after_termination: u64,
    pub sessions_opened: u64,
    pub sessions_closed: u64,
    /// Events whose own time was behind the stream's clock by more than `session_gap`.
    pub late_events: u64,
    /// Events stamped later than their [`clock_limit`]: the clock took that limit for
    /// them.
    pub future_events: u64,
    /// Events of a session that had completed, stamped at or before its end and arriving
    /// within [`COMPLETED_LINGER_MS`] of the clock after it: dropped, not opened as a
    /// session of their own.
    pub after_completion: u64,
    /// Events that named another tenant than the session they joined had until then:
    /// two tenants' sessions under one `session_id` (ids unique per tenant only), judged
    /// as one, each one's verdicts reaching the other's agent; or producers that name one
    /// session's tenant differently. Judged as any event (a terminated session's dropped);
    /// counted to be seen.
    pub other_tenant_events: u64,
}

/// How long (on the stream's clock) a session closed by `session.completed` is
/// remembered, so that an event of it arriving late is not taken for a new session
/// (Engine::process). Producers' stragglers come within seconds; bounded so that
/// memory follows completions per minute, not per session gap.
pub const COMPLETED_LINGER_MS: i64 = 60_000;

struct Slot {
    /// Boxed: the session table holds its entries inline and is 7/16 to 7/8 full, so a
    /// state inline made each bucket ~700 bytes and the table about half a session's
    /// memory.
    state: Box<SessionState>,
    /// The deadline under which the session sits in the expiry heap.
    scheduled: i64,
    /// The last batch that changed it changed it more than once, so the next one writes
    /// its state at the batch's end only (see [`Change`]). Eight bytes more a session in
    /// the table (a few MB at a million open sessions, against their states' 1–2 kB each).
    changed_again: bool,
    /// The session's policy, resolved when it opened or its tenant / agent changed.
    policy: Arc<Policy>,
    policy_key: u64,
}

/// How a batch (the events since the last [`Engine::take_changes`]) changed a session.
///
/// A session that a batch changes once (nearly every one in a fleet of agents at about an
/// event a second each, and at a million open sessions) is written right after that
/// change, while its state is in the cache: written at the batch's end, thousands of
/// sessions later, its state's memory (a dozen allocations) has left the cache, and
/// reading it back cost more than writing it. A session that the last batch to change it
/// changed more than once (a burst of its events) is left to the batch's end, written
/// once for all of its changes.
///
/// Each state taken is handed whole and, when the session was written before in this
/// engine, as a delta from that write too (the store picks, `engine::store::records`);
/// the state is then marked written. A state written early and changed again before the
/// batch's end is unmarked ([`SessionState::unmark`]): the batch's end writes its delta
/// from the write before.
enum Change {
    /// Changed once, and its bytes written right after. The batch's end takes them
    /// without looking the session up: a change of a session that closes is dropped.
    Written(Written),
    /// Changed once, to be written at the batch's end.
    Once,
    /// Changed more than once, to be written at the batch's end.
    Again,
}

/// How many states ahead of the one taken [`Engine::take_changes`] asks memory for: the
/// parts of this far, the state itself of twice as far (its parts' addresses are in it).
const TAKE_AHEAD: usize = 8;

/// Changes [`Engine::take_changes`] drains at a time: a chunk's ids and pointers stay in
/// the cache between its two passes.
const TAKE_CHUNK: usize = 1024;

/// Puts a session's state as taken into `batch`: whole, and its delta when it has one.
/// (Its marks are not needed once it is taken: only an early write that the session's
/// next change drops undoes them.)
fn put_taken(batch: &mut StoreBatch, id: String, written: Written) {
    if let Some(delta) = written.delta {
        batch.deltas.push((batch.puts.len() as u32, delta));
    }
    batch.puts.push((id, StateBytes::with_room(written.whole)));
}

/// A state written early in a batch ([`Change::Written`]).
struct Written {
    /// After [`store::STATE_FRAME_ROOM`] bytes of room.
    whole: Vec<u8>,
    delta: Option<Vec<u8>>,
    /// What marking it written dropped, to undo it if the session changes again.
    marks: Marks,
}

/// A session's state as a batch takes it: whole, as a delta from its last write when it
/// was written before, and marked written.
fn take_state(state: &mut SessionState, scratch: &mut Vec<u8>) -> Written {
    let whole = state.to_bytes_after_room_with(scratch, store::STATE_FRAME_ROOM);
    let delta = state.written_before().then(|| {
        let mut delta = Vec::with_capacity(whole.len() / 2);
        state.delta_bytes(&mut delta);
        delta
    });
    let marks = state.mark_written();
    Written {
        whole,
        delta,
        marks,
    }
}

/// When an idle session closes (see [`Engine::advance_clock_with_deadlines`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseAt {
    /// The earliest stream clock at which one engine over every event closes it.
    pub clock: i64,
    /// Its idle deadline: closes at one clock go in (deadline, session id) order.
    pub deadline: i64,
}

/// Longest tool name a finding's reason and hint name, and the engine caches a tool's
/// classes by, in bytes (real names are far shorter): with the ids
/// ([`crate::contract::event::MAX_ID_BYTES`]) and labels ([`state::MAX_LABEL`]) bounded,
/// every output is, whatever the event, and so is the cache.
pub const MAX_SHOWN_TOOL_NAME: usize = 256;

/// Store key under which the engine's clock is kept with the offsets.
pub const WATERMARK_KEY: &str = "engine/watermark";

/// The detection engine over one stream of events (one Kafka partition, or one file).
pub struct Engine {
    config: Arc<Config>,
    /// hashbrown's own map for `entry_ref`: an event finds (or opens) its session in one
    /// probe, without an owned key.
    sessions: hashbrown::HashMap<String, Slot, FxBuildHasher>,
    expiry: BinaryHeap<Reverse<(i64, String)>>,
    watermark: Option<i64>,
    work: Work,
    /// Sessions changed since the last flush, when a durable store is attached, and how.
    dirty: Option<FxHashMap<String, Change>>,
    /// Sessions closed by `session.completed` within the linger: their end (latest event
    /// time) and the clock when they closed, in that order in `completed_order`. A durable
    /// engine stores each as a marker under its session's key
    /// ([`SessionState::completed_marker`]) until it is forgotten, so that a restart drops
    /// the same stragglers.
    completed: FxHashMap<String, Completed>,
    completed_order: std::collections::VecDeque<(i64, String)>,
    /// Sessions completed since the last flush, whose markers it puts (durable engines).
    completed_unwritten: Vec<String>,
    closed: Vec<String>,
    counters: EngineCounters,
    /// Where changed states are serialized (its capacity kept between them).
    state_bytes: Vec<u8>,
    /// The tenant a session had when an event last named another, until taken.
    other_tenant_was: Option<String>,
    /// A terminated session's event that tells it still goes on, until taken.
    unheeded: Option<UnheededTermination>,
}

impl Engine {
    pub fn new(config: Arc<Config>) -> Engine {
        Engine {
            work: Work::new(config.clone()),
            config,
            sessions: hashbrown::HashMap::default(),
            expiry: BinaryHeap::new(),
            watermark: None,
            dirty: None,
            completed: FxHashMap::default(),
            completed_order: std::collections::VecDeque::new(),
            completed_unwritten: Vec::new(),
            closed: Vec::new(),
            counters: EngineCounters::default(),
            state_bytes: Vec::new(),
            other_tenant_was: None,
            unheeded: None,
        }
    }

    /// An engine that resumes from a store's sessions and tracks changes for
    /// [`Engine::flush`].
    pub fn restore(config: Arc<Config>, store: &dyn StateStore) -> Result<Engine, StoreError> {
        let mut engine = Engine::new(config);
        engine.dirty = Some(FxHashMap::default());
        engine.watermark = store.offset(WATERMARK_KEY)?;
        for (id, state) in store.load_sessions()? {
            engine.watermark = Some(
                engine
                    .watermark
                    .map_or(state.last_arrival_ms, |w| w.max(state.last_arrival_ms)),
            );
            if let Some(completed) = state.as_completed_marker() {
                engine
                    .completed_order
                    .push_back((completed.closed_at, id.clone()));
                engine.completed.insert(id, completed);
                continue;
            }
            let key = policy_key(state.tenant.as_deref(), state.agent_id.as_deref());
            let policy =
                engine
                    .work
                    .policy(key, state.tenant.as_deref(), state.agent_id.as_deref());
            let deadline = state
                .last_arrival_ms
                .saturating_add(engine.config.engine.session_gap_ms);
            engine.expiry.push(Reverse((deadline, id.clone())));
            engine.sessions.insert(
                id,
                Slot {
                    state: Box::new(state),
                    scheduled: deadline,
                    changed_again: false,
                    policy,
                    policy_key: key,
                },
            );
        }
        // Forgotten in the order they closed, as by the engine that stored them.
        engine.completed_order.make_contiguous().sort_unstable();
        Ok(engine)
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn counters(&self) -> EngineCounters {
        self.counters
    }

    /// The tenant a session had when an event last named another
    /// ([`EngineCounters::other_tenant_events`]), once: for the log that tells of it.
    pub fn take_other_tenant_was(&mut self) -> Option<String> {
        self.other_tenant_was.take()
    }

    /// Set by the event of a terminated session that is its
    /// [`UNSTOPPED_AFTER`](crate::engine::state::UNSTOPPED_AFTER)th since
    /// the termination or a later power of two ([`SessionState::unheeded_termination`]),
    /// once: for the metric and the log that tell the runtime did not stop it.
    pub fn take_unheeded_termination(&mut self) -> Option<UnheededTermination> {
        self.unheeded.take()
    }

    pub fn open_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// The engine's clock: the latest event time seen (or advanced by the caller).
    pub fn watermark(&self) -> Option<i64> {
        self.watermark
    }

    pub fn session(&self, id: &str) -> Option<&SessionState> {
        self.sessions.get(id).map(|s| &*s.state)
    }

    /// What a durable engine has stored for `id` once it flushed: its open session's
    /// state, or the marker of the completed session it remembers.
    #[cfg(test)]
    fn stored_view(&self, id: &str) -> Option<SessionState> {
        let marker = || {
            self.completed
                .get(id)
                .map(|c| SessionState::completed_marker(*c))
        };
        self.session(id).cloned().or_else(marker)
    }

    /// Moves the clock forward (e.g. wall-clock time while a partition is idle) and closes
    /// the sessions that have been silent for `session_gap`.
    pub fn advance_clock(&mut self, now_ms: i64, out: &mut Vec<Output>) {
        if self.watermark.is_none_or(|w| now_ms > w) {
            self.watermark = Some(now_ms);
        }
        self.expire(out);
    }

    /// [`Engine::advance_clock`], also telling for each closed session (the i-th
    /// summary appended to `out`) the clock at which one engine seeing every event would
    /// have closed it at the earliest, and its idle deadline (the order of closes at one
    /// clock): a caller that splits one stream over several engines puts their outputs
    /// back in order with them.
    pub fn advance_clock_with_deadlines(
        &mut self,
        now_ms: i64,
        out: &mut Vec<Output>,
        deadlines: &mut Vec<CloseAt>,
    ) {
        if self.watermark.is_none_or(|w| now_ms > w) {
            self.watermark = Some(now_ms);
        }
        self.expire_due(out, Some(deadlines));
    }

    fn expire(&mut self, out: &mut Vec<Output>) {
        self.expire_due(out, None);
    }

    fn expire_due(&mut self, out: &mut Vec<Output>, mut deadlines: Option<&mut Vec<CloseAt>>) {
        let Some(now) = self.watermark else { return };
        self.forget_completed(now);
        let gap = self.config.engine.session_gap_ms;
        let mut due: Vec<(i64, String, i64)> = Vec::new();
        while let Some(Reverse((deadline, _))) = self.expiry.peek() {
            if *deadline > now {
                break;
            }
            let Reverse((deadline, id)) = self.expiry.pop().expect("peeked");
            let Some(slot) = self.sessions.get_mut(&id) else {
                continue;
            };
            if slot.scheduled != deadline {
                continue; // a stale entry: the session was rescheduled
            }
            let actual = slot.state.last_arrival_ms.saturating_add(gap);
            if actual > now {
                slot.scheduled = actual;
                self.expiry.push(Reverse((actual, id)));
                continue;
            }
            // The heap entry that fell due was its latest: it is popped at the first clock
            // past both it and the session's deadline, whoever advances the clock.
            due.push((actual, id, deadline.max(actual)));
        }
        // Close in (deadline, id) order whatever the heap's lazy history, so that a
        // restored engine closes sessions in the same order as the one it replaced.
        due.sort();
        for (deadline, id, clock) in due {
            // A session can sit in the heap twice (closed and reopened): closed once.
            let closed = self.close(&id, ClosedBy::IdleTimeout, None, None, out);
            if let (true, Some(d)) = (closed, deadlines.as_deref_mut()) {
                d.push(CloseAt { clock, deadline });
            }
        }
    }

    /// Forgets the completed sessions whose linger the clock `now` has passed.
    fn forget_completed(&mut self, now: i64) {
        while let Some((closed_at, _)) = self.completed_order.front() {
            if closed_at.saturating_add(COMPLETED_LINGER_MS) >= now {
                break;
            }
            let (closed_at, id) = self.completed_order.pop_front().expect("looked at");
            // The latest close of that id only: one closed again since is still owed.
            if self
                .completed
                .get(&id)
                .is_some_and(|c| c.closed_at == closed_at)
            {
                self.completed.remove(&id);
                if self.dirty.is_some() {
                    // Its marker's delete (none while the session is open again).
                    self.closed.push(id);
                }
            }
        }
    }

    /// Closes every open session (end of a replay), in session-id order.
    pub fn close_all(&mut self, closed_by: ClosedBy, out: &mut Vec<Output>) {
        let mut ids: Vec<String> = self.sessions.keys().cloned().collect();
        ids.sort();
        for id in ids {
            self.close(&id, closed_by, None, None, out);
        }
        self.expiry.clear();
    }

    /// Closes a session and appends its summary; false when it was not open.
    fn close(
        &mut self,
        id: &str,
        closed_by: ClosedBy,
        completion: Option<&Completion>,
        trace_id: Option<&str>,
        out: &mut Vec<Output>,
    ) -> bool {
        let Some(slot) = self.sessions.remove(id) else {
            return false;
        };
        let st = slot.state;
        self.counters.sessions_closed += 1;
        if let Some(dirty) = self.dirty.as_mut() {
            // Every session with a change to take is open: `take_changes` relies on it.
            dirty.remove(id);
            self.closed.push(id.to_string());
        }
        let stop_reason = match (st.termination, closed_by) {
            (Some(t), _) if !t.shadow => t.detector.name().to_string(),
            (_, ClosedBy::Completed) => "done".to_string(),
            (_, ClosedBy::IdleTimeout) => "idle_timeout".to_string(),
            (_, ClosedBy::EndOfInput) => "end_of_input".to_string(),
        };
        let mut findings = std::collections::BTreeMap::new();
        for f in &st.findings {
            // A newer build's detector (a state restored after a rollback, or written to
            // the changelog by anyone): its counts are not this build's to name.
            let Some(&kind) = DetectorKind::ALL.get(f.detector as usize) else {
                continue;
            };
            let mut per_level = std::collections::BTreeMap::new();
            for level in Level::ALL {
                let n = f.counts[level as usize];
                if n > 0 {
                    per_level.insert(level.name().to_string(), n);
                }
            }
            findings.insert(kind.name().to_string(), per_level);
        }
        out.push(Output::Summary(Box::new(SummaryEvent {
            kind: "session.summary".to_string(),
            schema_version: SCHEMA_VERSION,
            event_id: summary_event_id(id, st.first_event_ms),
            session_id: id.to_string(),
            run_id: st.run_id.clone(),
            agent_id: st.agent_id.clone(),
            tenant: st.tenant.clone(),
            stop_reason,
            closed_by,
            // A label for charts, kept as the session's own labels are (bounded).
            runtime_stop_reason: completion
                .and_then(|c| c.stop_reason.as_deref())
                .map(|r| kept_label(r).into_owned()),
            outcome: completion.and_then(|c| c.outcome),
            shadow_stop_reason: st.termination.filter(|t| t.shadow).map(|t| t.detector),
            started_at: format_rfc3339_ms(st.first_event_ms),
            ended_at: format_rfc3339_ms(st.last_event_ms),
            stats: Stats::of(&st),
            findings,
            trace_id: trace_id.map(str::to_string),
        })));
        true
    }

    /// The time of an event `stamped` so ([`stamped_ms`]), and the clock once it is applied
    /// ([`event_time`], with `run`'s bound on a time ahead of its message's or of the
    /// host's clock, [`clock_limit`]).
    fn times_of(&mut self, stamped: Option<i64>, meta: &EventMeta<'_>) -> (i64, i64) {
        let (event_ms, now) = event_time(self.watermark, stamped, None);
        // A time past its limit is a producer's clock running ahead: taken as it is, it
        // would move the partition's clock and close every session on it as idle, and
        // leave none to close until real time caught up (a year, for an event stamped a
        // year ahead). The clock (and the event's arrival on it) takes the limit instead;
        // the event keeps its own time for its session, whose times (and the ids hashed
        // from them) must not depend on when it was read.
        if let Some(limit) = clock_limit(meta, self.config.engine.future_grace_ms) {
            if event_ms > limit {
                self.counters.future_events += 1;
                return (
                    event_ms,
                    self.watermark.map_or(limit, |clock| clock.max(limit)),
                );
            }
        }
        (event_ms, now)
    }

    /// Applies one event and appends what it caused (findings, summaries) to `out`.
    pub fn process(&mut self, event: &Event<'_>, meta: &EventMeta<'_>, out: &mut Vec<Output>) {
        self.counters.events += 1;
        let stamped = stamped_ms(event, meta);
        let (event_ms, now) = self.times_of(stamped, meta);
        // An event without a time of its own took the clock's: none to compare.
        let stamped = stamped.is_some();
        self.watermark = Some(now);
        let gap = self.config.engine.session_gap_ms;
        if event_ms.saturating_add(gap) < now {
            self.counters.late_events += 1;
        }
        self.expire(out);

        let id: &str = &event.session_id;
        let (first_change, unwritten) = self.change_of(id);
        let deadline = now.saturating_add(gap);
        let slot = match self.sessions.entry_ref(id) {
            EntryRef::Occupied(found) => {
                let slot = found.into_mut();
                slot.state.prefetch();
                slot
            }
            EntryRef::Vacant(unknown) => {
                if straggles(&mut self.completed, id, stamped.then_some(event_ms), now) {
                    self.counters.after_completion += 1;
                    return;
                }
                let (key, policy) = self.work.policy_of(event);
                self.expiry.push(Reverse((deadline, id.to_string())));
                self.counters.sessions_opened += 1;
                unknown.insert(Slot {
                    state: Box::new(SessionState::new(event_ms, now)),
                    scheduled: deadline,
                    changed_again: false,
                    policy,
                    policy_key: key,
                })
            }
        };
        if let Some(marks) = unwritten {
            slot.state.unmark(marks);
        }
        // Reschedule lazily: only when the deadline moved by more than an eighth of the gap.
        if deadline > slot.scheduled.saturating_add(gap / 8) {
            slot.scheduled = deadline;
            self.expiry.push(Reverse((deadline, id.to_string())));
        }
        if slot.state.is_duplicate(hash_id(&event.event_id)) {
            self.counters.duplicates += 1;
            if let (true, Some(d)) = (first_change, self.dirty.as_mut()) {
                d.insert(id.to_string(), Change::Once);
            }
            return;
        }
        slot.state.touch(event_ms, now, gap);
        let completion = match &event.body {
            EventBody::SessionCompleted(c) => Some(c),
            _ => None,
        };
        let other_tenant_was = if slot.state.is_tombstone() {
            self.counters.dropped_after_termination += 1;
            let was = slot.state.drop_after_termination(event.tenant.as_deref());
            let completes = completion.is_some();
            self.unheeded = slot.state.unheeded_termination(event_ms, completes);
            was
        } else {
            apply(&mut self.work, slot, event, meta, event_ms, out)
        };
        if other_tenant_was.is_some() {
            self.counters.other_tenant_events += 1;
            self.other_tenant_was = other_tenant_was;
        }
        // A completed session closes below, which drops its change: none to record.
        if let (true, None, Some(d)) = (first_change, completion, self.dirty.as_mut()) {
            let change = if slot.changed_again {
                Change::Once
            } else {
                Change::Written(take_state(&mut slot.state, &mut self.state_bytes))
            };
            d.insert(id.to_string(), change);
        }
        if let Some(c) = completion {
            // Times to tell its stragglers by: a completion without one of its own (a
            // file without timestamps, whose clock then never moves) leaves none.
            let end_ms = stamped.then_some(slot.state.last_event_ms);
            self.complete(id, c, event.trace_id.as_deref(), end_ms, out);
        }
    }

    /// Closes a session `session.completed` ended and remembers it for its stragglers, by
    /// `end_ms`, its latest event time, when it has one (a durable engine stores its
    /// marker).
    fn complete(
        &mut self,
        id: &str,
        completion: &Completion,
        trace_id: Option<&str>,
        end_ms: Option<i64>,
        out: &mut Vec<Output>,
    ) {
        self.close(id, ClosedBy::Completed, Some(completion), trace_id, out);
        let (Some(end_ms), Some(now)) = (end_ms, self.watermark) else {
            return;
        };
        let completed = Completed {
            end_ms,
            closed_at: now,
        };
        self.completed.insert(id.to_string(), completed);
        self.completed_order.push_back((now, id.to_string()));
        if self.dirty.is_some() {
            self.completed_unwritten.push(id.to_string());
        }
    }

    /// Whether changes wait for the next flush (sessions changed or closed, completed
    /// sessions' markers to put or delete).
    pub fn has_changes(&self) -> bool {
        let dirty = self.dirty.as_ref().is_some_and(|d| !d.is_empty());
        dirty || !self.closed.is_empty() || !self.completed_unwritten.is_empty()
    }
}

/// Whether an event of `id` stamped at `event_ms` (`None`: with no time of its own),
/// arriving at clock `now` with no session of `id` open, is a straggler of the session
/// `completed` remembers under `id`: stamped at or before its end, within the linger (a
/// gateway's last cost record, a completion sent twice). Opened, it made a session of its
/// own, summarised again as idle a gap later. Any other event of `id` starts the session
/// again (a conversation's next run), and the completed one is forgotten.
fn straggles(
    completed: &mut FxHashMap<String, Completed>,
    id: &str,
    event_ms: Option<i64>,
    now: i64,
) -> bool {
    let Some(c) = completed.get(id).copied() else {
        return false;
    };
    let within = c.closed_at.saturating_add(COMPLETED_LINGER_MS) >= now;
    if within && event_ms.is_some_and(|at| at <= c.end_ms) {
        return true;
    }
    completed.remove(id);
    false
}

/// The latest time an event may move its partition's clock to: `future_grace_ms` after
/// the earlier of its processing time and its message's timestamp. An event stamped after
/// the message that carries it was produced, or after this host read it, by more than
/// clock skew claims what no clock can tell. The processing time bounds a producer whose
/// clock runs ahead of this host's. The message's timestamp bounds a backlog read hours
/// late, the same at every read of the log, where it comes from another clock than the
/// event's (the broker's with `LogAppendTime`, a relay's, the OTLP ingest's); a producer
/// that stamps both with one fast clock is bounded by the processing time alone. `None`
/// without a processing time: a replay takes times as they are.
pub fn clock_limit(meta: &EventMeta<'_>, future_grace_ms: i64) -> Option<i64> {
    let processed = meta.processing_time_ms?;
    // A timestamp of 0 or less is none (librdkafka passes such a value on as it is).
    let produced = meta.message_timestamp_ms.filter(|&m| m > 0);
    let reference = produced.map_or(processed, |m| m.min(processed));
    Some(reference.saturating_add(future_grace_ms))
}

/// The time an event is stamped with: its own, else its message's (the broker's
/// timestamp); `None` when it has neither.
pub fn stamped_ms(event: &Event<'_>, meta: &EventMeta<'_>) -> Option<i64> {
    event.timestamp_ms.or(meta.message_timestamp_ms)
}

/// An event's time and the stream's clock once it is applied: its own time, else its
/// message's (the broker's timestamp), else the clock as it stands (0 before any event);
/// the clock is the latest event time seen. An event behind the clock is applied as
/// usual; idleness is measured on the clock from each session's last arrival. Whoever
/// splits a stream over engines computes the clock with this too (the driver does).
pub(crate) fn event_time(
    clock: Option<i64>,
    event_ms: Option<i64>,
    message_ms: Option<i64>,
) -> (i64, i64) {
    let event_ms = event_ms.or(message_ms).or(clock).unwrap_or(0);
    let now = match clock {
        Some(c) if c >= event_ms => c,
        _ => event_ms,
    };
    (event_ms, now)
}

/// Applies an event to its (live) session: identity, then the observation its kind
/// makes, then every detector. The straight path of the engine: nothing here looks the
/// session up again or goes back to the configuration but through `work`'s caches.
/// Returns the tenant the session had when the event names another.
fn apply(
    work: &mut Work,
    slot: &mut Slot,
    event: &Event<'_>,
    meta: &EventMeta<'_>,
    event_ms: i64,
    out: &mut Vec<Output>,
) -> Option<String> {
    let other_tenant_was = note_identity(work, slot, event);
    // The event's context for the detectors, and the tool override's policy if any.
    let mut sketch = None;
    let (ctx, tool_policy) = match &event.body {
        EventBody::LlmCall(call) => (observe_llm_call(work, slot, call, &mut sketch), None),
        EventBody::ToolCall(call) => observe_tool_call(work, slot, call, &event.event_id),
        EventBody::SessionStarted => (Context::Other, None),
        EventBody::SessionCompleted(_) => return other_tenant_was,
    };
    let policy: &Policy = tool_policy.as_deref().unwrap_or(&slot.policy);
    let input = Input {
        context: &ctx,
        depth: event.depth,
    };
    // Every detector's own counters take the event in before any is judged on it.
    let st = &mut slot.state;
    policy.detectors.observe(&mut st.counters, &st.run, &input);
    let order = match ctx {
        Context::Llm(_) => &work.order_llm,
        Context::Tool(_) => &work.order_tool,
        Context::Other => &work.order_other,
    };
    judge(order, st, policy, event, meta, event_ms, &input, out);
    other_tenant_was
}

/// The session's labels, run and depth as the event gives them; the policy follows the
/// labels as stored ([`kept_label`]), resolved again only when they changed (a session's
/// first labelled event, or a relabelling). Returns the tenant the session had when the
/// event names another.
fn note_identity(work: &mut Work, slot: &mut Slot, event: &Event<'_>) -> Option<String> {
    let st = &mut slot.state;
    let relabelled = st.note_labels(event.agent_id.as_deref(), event.tenant.as_deref());
    st.note_run(event.run_id.as_deref());
    if let Some(d) = event.depth {
        st.stats.max_depth = Some(st.stats.max_depth.map_or(d, |m| m.max(d)));
    }
    if relabelled.labels {
        let key = policy_key(st.tenant.as_deref(), st.agent_id.as_deref());
        if key != slot.policy_key {
            slot.policy = work.policy(key, st.tenant.as_deref(), st.agent_id.as_deref());
            slot.policy_key = key;
        }
    }
    relabelled.other_tenant_was
}

/// An LLM call observed: its tokens and cost counted, and the detectors' context for
/// it with its text's features (the turn's sketch kept in `sketch`).
fn observe_llm_call<'e>(
    work: &mut Work,
    slot: &mut Slot,
    call: &LlmCall<'_>,
    sketch: &'e mut Option<TextSketch>,
) -> Context<'e> {
    let is_turn = call.call_kind == CallKind::Turn;
    let (features, opening, chant, has_text) = work.text_features(call, is_turn, &slot.policy);
    let calls_since_turn = slot.state.stats.calls_since_turn;
    slot.state.observe_llm(LlmObservation {
        is_turn,
        input_tokens: call.input_tokens,
        output_tokens: call.output_tokens,
        cache_read_tokens: call.cache_read_tokens,
        cache_write_tokens: call.cache_write_tokens,
        cost_usd: call.cost_usd,
        tool_calls: call.tool_calls,
    });
    *sketch = features;
    Context::Llm(LlmContext {
        is_turn,
        is_compaction: call.call_kind == CallKind::Compaction,
        progress: call.progress,
        calls_since_turn,
        tool_calls: call.tool_calls,
        has_text,
        chant,
        sketch: sketch.as_ref(),
        opening,
    })
}

/// A tool call observed under its policy (a tool override's, if one applies, which is
/// returned with the detectors' context for it).
fn observe_tool_call<'e>(
    work: &mut Work,
    slot: &mut Slot,
    call: &'e ToolCall<'_>,
    event_id: &str,
) -> (Context<'e>, Option<Arc<Policy>>) {
    let (mut obs, has_action) = work.tool_observation(call, event_id);
    let tool_policy = if work.config.has_tool_overrides() {
        let name = std::mem::take(&mut work.action_name);
        let p = work.tool_policy(slot, &call.tool, has_action.then_some(name.as_str()));
        work.action_name = name;
        p
    } else {
        None
    };
    // The state may class the call anew (a check after a wait is a poll): the detectors
    // read the call as the state took it.
    let facts = slot.state.observe_tool(&call.tool, &mut obs);
    let ctx = Context::Tool(ToolContext {
        // Named in findings' reasons and hints (which reach the agent's next call): a
        // name no real tool has is cut there, so an output stays bounded.
        tool: cut_at_char(&call.tool, MAX_SHOWN_TOOL_NAME),
        obs,
        facts,
    });
    (ctx, tool_policy)
}

impl Engine {
    /// Whether an event of session `id` is the batch's first change of it, recorded by the
    /// caller once the event is applied (one insert, not an insert and a lookup); a later
    /// one drops the bytes written after the first, and returns what writing them marked,
    /// to be undone ([`SessionState::unmark`]).
    fn change_of(&mut self, id: &str) -> (bool, Option<Marks>) {
        let Some(dirty) = self.dirty.as_mut() else {
            return (false, None);
        };
        match dirty.get_mut(id) {
            Some(change) => match std::mem::replace(change, Change::Again) {
                Change::Written(w) => (false, Some(w.marks)),
                _ => (false, None),
            },
            None => (true, None),
        }
    }

    /// The batches taken since the last one stored were dropped, not stored: every open
    /// session's next write is whole (a delta from a state the store never got would
    /// rebuild a wrong one).
    pub fn forget_writes(&mut self) {
        for slot in self.sessions.values_mut() {
            slot.state.forget_written();
        }
    }

    /// Writes every changed session, closed session and the given offsets to `store` in
    /// one atomic batch. Only engines made by [`Engine::restore`] track changes.
    pub fn flush(
        &mut self,
        store: &mut dyn StateStore,
        offsets: &[(String, i64)],
    ) -> Result<(), StoreError> {
        match self.take_changes(offsets) {
            Some(batch) => store.commit(&batch),
            None => Ok(()),
        }
    }

    /// The changes since the last call (changed sessions, closed sessions, the given
    /// offsets and the clock) as one batch, for the caller to store — and to keep until
    /// it is stored, since the engine forgets them. `None` for engines that do not track
    /// changes.
    pub fn take_changes(&mut self, offsets: &[(String, i64)]) -> Option<StoreBatch> {
        let dirty = self.dirty.as_mut()?;
        let mut batch = StoreBatch::default();
        // A chunk of changes at a time, in two passes. The first takes the states written
        // early, and finds the state of each other session to take (changed after its
        // early write, or never written early): one independent probe after another,
        // which the core overlaps. The second takes those in turn, asking memory for the
        // states a few ahead. A batch of seconds at a million open sessions takes
        // hundreds of thousands, each a dozen allocations out of every cache: taken one at
        // a time, each missed on the table, then on its state, then on each of its parts.
        let mut found: Vec<(String, NonNull<SessionState>)> =
            Vec::with_capacity(dirty.len().min(TAKE_CHUNK));
        let mut changes = dirty.drain();
        loop {
            found.clear();
            let mut drained = 0;
            for (id, change) in changes.by_ref() {
                match change {
                    // Written after its one change, so its `changed_again` is false
                    // already (it is written early only then) and its session open (a
                    // close drops the change): its slot is not looked up again, which at
                    // a million open sessions was a cache miss or two a state written.
                    Change::Written(written) => put_taken(&mut batch, id, written),
                    Change::Once | Change::Again => {
                        let Some(slot) = self.sessions.get_mut(&id) else {
                            debug_assert!(false, "a change of a closed session: {id}");
                            continue;
                        };
                        slot.changed_again = matches!(change, Change::Again);
                        found.push((id, NonNull::from(&mut *slot.state)));
                    }
                }
                drained += 1;
                if drained == TAKE_CHUNK {
                    break;
                }
            }
            if drained == 0 {
                break;
            }
            for i in 0..found.len() {
                // The state itself by its address alone (nothing is read).
                if let Some((_, state)) = found.get(i + 2 * TAKE_AHEAD) {
                    let size = std::mem::size_of::<SessionState>();
                    prefetch::span(state.as_ptr().cast(), size, usize::MAX);
                }
                // SAFETY (both `unsafe` below): each pointer is to a distinct open
                // session's boxed state (the ids came from a map, so no two are one). From
                // the first pass's lookup to the end of this one no session is opened or
                // closed (the table's later probes reach other slots, and nothing moves a
                // box), and no state is otherwise borrowed: every state is where the first
                // pass found it, a shared borrow here ends before the state's own take,
                // and the one taken is borrowed by nothing else.
                if let Some((_, state)) = found.get(i + TAKE_AHEAD) {
                    unsafe { state.as_ref() }.prefetch();
                }
                let (id, mut state) = (std::mem::take(&mut found[i].0), found[i].1);
                let written = take_state(unsafe { state.as_mut() }, &mut self.state_bytes);
                put_taken(&mut batch, id, written);
            }
        }
        // Completed sessions still remembered and not open again: their markers.
        let sessions = &self.sessions;
        let mut marked = FxHashSet::default();
        for id in self.completed_unwritten.drain(..) {
            let Some(c) = self.completed.get(&id) else {
                continue; // forgotten since: its delete is in `closed`
            };
            if sessions.contains_key(&id) || !marked.insert(id.clone()) {
                continue;
            }
            let mut marker = SessionState::completed_marker(*c);
            let written = take_state(&mut marker, &mut self.state_bytes);
            put_taken(&mut batch, id, written);
        }
        // A session that closed and reopened since the last flush is a put, not a delete;
        // one that completed, its marker.
        batch.deletes.extend(
            self.closed
                .drain(..)
                .filter(|id| !sessions.contains_key(id) && !marked.contains(id)),
        );
        batch.offsets.extend(offsets.iter().cloned());
        if let Some(w) = self.watermark {
            batch.offsets.push((WATERMARK_KEY.to_string(), w));
        }
        Some(batch)
    }
}

#[cfg(test)]
mod tests;

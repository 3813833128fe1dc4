//! The engine: applies validated events to session state, runs every detector, turns
//! signals into findings (levels, episodes, modes, the termination tombstone) and closes
//! sessions on event-time gaps and `session.completed`.
//!
//! Guarantees: synchronous and deterministic (time is the events' own time; the only
//! clock is the watermark, the latest event time seen, or one injected by the caller);
//! `terminate` is emitted at most once per session; a session's state is bounded; the
//! per-event cost does not grow with the number of open sessions (hash map lookup plus
//! a coalesced expiry heap). All I/O (reading input, publishing, storing) is the caller's.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use hashbrown::hash_map::EntryRef;
use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet, FxHasher};

use crate::config::{Config, ToolClasses};
use crate::content::ContentSample;
use crate::detectors::{Context, DetectorKind, Input, LlmContext, On, Signal, ToolContext};
use crate::event::{format_rfc3339_ms, CallKind, Completion, Event, EventBody, LlmCall, ToolCall};
use crate::fingerprint::{self, Fingerprinter};
use crate::json;
use crate::output::{
    finding_event_id, summary_event_id, ClosedBy, FindingEvent, Output, Stats, SummaryEvent,
    Trigger, SCHEMA_VERSION,
};
use crate::policy::{Level, Mode, Policy};
use crate::state::{SessionState, ToolObservation};
use crate::store::{StateStore, StoreBatch, StoreError};
use crate::text::{opening, turn_features, Chant, ChantRule, ChantScratch, TextSketch};

/// Where an event came from, for `trigger` and for the event-time fallback.
#[derive(Debug, Clone, Default)]
pub struct EventMeta {
    pub topic: Option<Arc<str>>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    /// The Kafka message timestamp, used when the event has no `timestamp`.
    pub message_timestamp_ms: Option<i64>,
    /// Processing time for `detected_at`; `None` uses the event time (replay).
    pub processing_time_ms: Option<i64>,
}

/// Counters the pipeline exports as metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineCounters {
    pub events: u64,
    pub duplicates: u64,
    pub dropped_after_termination: u64,
    pub sessions_opened: u64,
    pub sessions_closed: u64,
    /// Events whose own time was behind the stream's clock by more than `session_gap`.
    pub late_events: u64,
}

struct Slot {
    state: SessionState,
    /// The deadline under which the session sits in the expiry heap.
    scheduled: i64,
    /// The session's policy, resolved when it opened or its tenant / agent changed.
    policy: Arc<Policy>,
    policy_key: u64,
}

/// When an idle session closes (see [`Engine::advance_clock_with_deadlines`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseAt {
    /// The earliest stream clock at which one engine over every event closes it.
    pub clock: i64,
    /// Its idle deadline: closes at one clock go in (deadline, session id) order.
    pub deadline: i64,
}

/// Store key under which the engine's clock is kept with the offsets.
pub const WATERMARK_KEY: &str = "engine/watermark";

/// Caps on the resolution caches; past them they are cleared (they only save work).
const POLICY_CACHE_CAP: usize = 4096;
const CLASS_CACHE_CAP: usize = 16_384;

/// What judging an event needs besides its session: configuration resolved once, caches,
/// and the buffers reused from event to event (so the hot path allocates nothing).
struct Work {
    config: Arc<Config>,
    fingerprinter: Fingerprinter,
    prints: fingerprint::Scratch,
    text: String,
    chant: ChantScratch,
    /// `tool.action`, when a call has an `action` argument.
    action_name: String,
    /// The detectors judged on LLM calls, tool calls and other events, in order.
    order_llm: Vec<DetectorKind>,
    order_tool: Vec<DetectorKind>,
    order_other: Vec<DetectorKind>,
    policies: FxHashMap<u64, Arc<Policy>>,
    /// Tool-override policies by (session policy key, tool or `tool.action` hash); `None`:
    /// no override applies.
    tool_policies: FxHashMap<(u64, u64), Option<Arc<Policy>>>,
    classes: FxHashMap<String, ToolClasses>,
}

/// The detection engine over one stream of events (one Kafka partition, or one file).
pub struct Engine {
    config: Arc<Config>,
    /// hashbrown's own map for `entry_ref`: an event finds (or opens) its session in one
    /// probe, without an owned key.
    sessions: hashbrown::HashMap<String, Slot, FxBuildHasher>,
    expiry: BinaryHeap<Reverse<(i64, String)>>,
    watermark: Option<i64>,
    work: Work,
    /// Sessions changed since the last flush, when a durable store is attached.
    dirty: Option<FxHashSet<String>>,
    closed: Vec<String>,
    counters: EngineCounters,
}

fn hash_id(s: &str) -> u64 {
    let mut h = FxHasher::default();
    s.hash(&mut h);
    h.finish()
}

fn policy_key(tenant: Option<&str>, agent: Option<&str>) -> u64 {
    let mut h = FxHasher::default();
    tenant.hash(&mut h);
    agent.hash(&mut h);
    h.finish()
}

impl Work {
    fn new(config: Arc<Config>) -> Work {
        Work {
            fingerprinter: Fingerprinter::new(&config.fingerprint),
            config,
            prints: fingerprint::Scratch::default(),
            text: String::new(),
            chant: ChantScratch::default(),
            action_name: String::new(),
            order_llm: DetectorKind::evaluation_order_for(On::LlmCalls),
            order_tool: DetectorKind::evaluation_order_for(On::ToolCalls),
            order_other: DetectorKind::evaluation_order_for(On::Any),
            policies: FxHashMap::default(),
            tool_policies: FxHashMap::default(),
            classes: FxHashMap::default(),
        }
    }

    /// The policy key and policy of a session opened by `event`.
    fn policy_of(&mut self, event: &Event<'_>) -> (u64, Arc<Policy>) {
        let (tenant, agent) = (event.tenant.as_deref(), event.agent_id.as_deref());
        let key = policy_key(tenant, agent);
        (key, self.policy(key, tenant, agent))
    }

    fn policy(&mut self, key: u64, tenant: Option<&str>, agent: Option<&str>) -> Arc<Policy> {
        if let Some(p) = self.policies.get(&key) {
            return p.clone();
        }
        if self.policies.len() >= POLICY_CACHE_CAP {
            self.policies.clear();
            self.tool_policies.clear();
        }
        let p = Arc::new(self.config.policy_for(tenant, agent));
        self.policies.insert(key, p.clone());
        p
    }

    fn classify(&mut self, tool: &str, action_name: Option<&str>) -> ToolClasses {
        let key = action_name.unwrap_or(tool);
        if let Some(c) = self.classes.get(key) {
            return *c;
        }
        if self.classes.len() >= CLASS_CACHE_CAP {
            self.classes.clear();
        }
        let c = self.config.tools.classify(tool, action_name);
        self.classes.insert(key.to_string(), c);
        c
    }

    /// The policy of one tool call when a tool override applies to it.
    fn tool_policy(
        &mut self,
        slot: &Slot,
        tool: &str,
        action_name: Option<&str>,
    ) -> Option<Arc<Policy>> {
        let key = (slot.policy_key, hash_id(action_name.unwrap_or(tool)));
        if let Some(p) = self.tool_policies.get(&key) {
            return p.clone();
        }
        let st = &slot.state;
        let p = self
            .config
            .policy_for_tool(
                &slot.policy,
                st.tenant.as_deref(),
                st.agent_id.as_deref(),
                tool,
                action_name,
            )
            .map(Arc::new);
        if self.tool_policies.len() >= POLICY_CACHE_CAP {
            self.tool_policies.clear();
        }
        self.tool_policies.insert(key, p.clone());
        p
    }

    /// The features of an LLM call's text: its sketch and opening (turns only) and any
    /// chant.
    fn text_features(
        &mut self,
        call: &LlmCall<'_>,
        is_turn: bool,
        policy: &Policy,
    ) -> (Option<TextSketch>, Option<u64>, Option<Chant>, bool) {
        let Some(content) = call
            .text
            .as_ref()
            .and_then(|t| json::string_content(t.as_str()))
            .filter(|c| !c.is_empty())
        else {
            return (None, None, None, false);
        };
        self.text.clear();
        json::unescape_into(content, &mut self.text);
        let rt = &policy.detectors.repetitive_text;
        let rule = ChantRule {
            chunk: rt.chunk_chars.get(),
            min_repeats: rt.min_repeats.get() as u32,
            max_spacing: rt.max_avg_spacing_chars,
        };
        let (sketch, chant) = turn_features(&self.text, is_turn, rule, &mut self.chant);
        let words = policy.detectors.similar_turns.opening_words.get();
        let opening = if is_turn {
            opening(&self.text, words)
        } else {
            None
        };
        (sketch, opening, chant, true)
    }

    /// A tool call's fingerprints and classes, and its `tool.action` name if any.
    fn tool_observation(&mut self, call: &ToolCall<'_>, event_id: &str) -> (ToolObservation, bool) {
        let action = self
            .fingerprinter
            .action(&call.tool, call.args.as_ref(), &mut self.prints);
        let has_action = action.action_arg.is_some();
        if let Some(a) = &action.action_arg {
            self.action_name.clear();
            self.action_name.push_str(&call.tool);
            self.action_name.push('.');
            self.action_name.push_str(a);
        }
        let name = std::mem::take(&mut self.action_name);
        let classes = self.classify(&call.tool, has_action.then_some(name.as_str()));
        self.action_name = name;
        // A call that says nothing of its result (neither `result` nor `result_digest`)
        // is not guessed to have returned what the last one did: its result is its own,
        // a digest of the event's id (unique in a session: an exact duplicate is dropped
        // before), as the OTLP ingest names an uncaptured one by its span id. Hex of a
        // hash, not the id itself: ids that differ only in a number (`call-7`, `call-8`)
        // would read alike to the comparisons that read numbers as any number. Counts,
        // ceilings and error streaks still judge it.
        let unknown;
        let given = match (&call.result, &call.result_digest) {
            (None, None) => {
                unknown = format!("{:016x}", hash_id(event_id));
                Some(unknown.as_str())
            }
            (_, digest) => digest.as_deref(),
        };
        let result = self
            .fingerprinter
            .result(call.result.as_ref(), given, &mut self.prints);
        let unknown_tool = call.error_kind.as_deref() == Some("unknown_tool");
        let is_error = call.is_error || unknown_tool;
        let wordless = !result.has_words;
        let obs = ToolObservation {
            action: action.digest.short(),
            result: result.digest.short(),
            shape: result.shape,
            is_error,
            error_text: is_error && !wordless,
            wordless,
            unknown_tool,
            poll: classes.poll || (result.pending && !is_error),
            retry_safe: classes.retry_safe,
            write: classes.write,
            content: if wordless {
                ContentSample::default()
            } else {
                self.prints.content_sample()
            },
        };
        (obs, has_action)
    }
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
            closed: Vec::new(),
            counters: EngineCounters::default(),
        }
    }

    /// An engine that resumes from a store's sessions and tracks changes for
    /// [`Engine::flush`].
    pub fn restore(config: Arc<Config>, store: &dyn StateStore) -> Result<Engine, StoreError> {
        let mut engine = Engine::new(config);
        engine.dirty = Some(FxHashSet::default());
        engine.watermark = store.offset(WATERMARK_KEY)?;
        for (id, state) in store.load_sessions()? {
            engine.watermark = Some(
                engine
                    .watermark
                    .map_or(state.last_arrival_ms, |w| w.max(state.last_arrival_ms)),
            );
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
                    state,
                    scheduled: deadline,
                    policy,
                    policy_key: key,
                },
            );
        }
        Ok(engine)
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn counters(&self) -> EngineCounters {
        self.counters
    }

    pub fn open_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// The engine's clock: the latest event time seen (or advanced by the caller).
    pub fn watermark(&self) -> Option<i64> {
        self.watermark
    }

    pub fn session(&self, id: &str) -> Option<&SessionState> {
        self.sessions.get(id).map(|s| &s.state)
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
        if self.dirty.is_some() {
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
            let kind = DetectorKind::ALL[f.detector as usize];
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
            runtime_stop_reason: completion.and_then(|c| c.stop_reason.clone()),
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

    /// Applies one event and appends what it caused (findings, summaries) to `out`.
    pub fn process(&mut self, event: &Event<'_>, meta: &EventMeta, out: &mut Vec<Output>) {
        self.counters.events += 1;
        let (event_ms, now) = event_time(
            self.watermark,
            event.timestamp_ms,
            meta.message_timestamp_ms,
        );
        self.watermark = Some(now);
        let gap = self.config.engine.session_gap_ms;
        if event_ms.saturating_add(gap) < now {
            self.counters.late_events += 1;
        }
        self.expire(out);

        let id: &str = &event.session_id;
        if let Some(d) = self.dirty.as_mut() {
            if !d.contains(id) {
                d.insert(id.to_string());
            }
        }
        let deadline = now.saturating_add(gap);
        let slot = match self.sessions.entry_ref(id) {
            EntryRef::Occupied(found) => found.into_mut(),
            EntryRef::Vacant(unknown) => {
                let (key, policy) = self.work.policy_of(event);
                self.expiry.push(Reverse((deadline, id.to_string())));
                self.counters.sessions_opened += 1;
                unknown.insert(Slot {
                    state: SessionState::new(event_ms, now),
                    scheduled: deadline,
                    policy,
                    policy_key: key,
                })
            }
        };
        // Reschedule lazily: only when the deadline moved by more than an eighth of the gap.
        if deadline > slot.scheduled.saturating_add(gap / 8) {
            slot.scheduled = deadline;
            self.expiry.push(Reverse((deadline, id.to_string())));
        }
        if slot.state.is_duplicate(hash_id(&event.event_id)) {
            self.counters.duplicates += 1;
            return;
        }
        slot.state.touch(event_ms, now);
        let completion = match &event.body {
            EventBody::SessionCompleted(c) => Some(c),
            _ => None,
        };
        if slot.state.is_tombstone() {
            slot.state.stats.dropped_after_termination += 1;
            self.counters.dropped_after_termination += 1;
        } else {
            apply(&mut self.work, slot, event, meta, event_ms, out);
        }
        if let Some(c) = completion {
            self.close(
                id,
                ClosedBy::Completed,
                Some(c),
                event.trace_id.as_deref(),
                out,
            );
        }
    }
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
#[cfg_attr(
    not(test),
    expect(
        clippy::too_many_lines,
        reason = "the observation of an LLM call moves into the detectors that read it (issue 30, item 2)"
    )
)]
fn apply(
    work: &mut Work,
    slot: &mut Slot,
    event: &Event<'_>,
    meta: &EventMeta,
    event_ms: i64,
    out: &mut Vec<Output>,
) {
    let st = &mut slot.state;
    let relabelled = st.note_labels(event.agent_id.as_deref(), event.tenant.as_deref());
    st.note_run(event.run_id.as_deref());
    if let Some(d) = event.depth {
        st.stats.max_depth = Some(st.stats.max_depth.map_or(d, |m| m.max(d)));
    }
    // The policy follows the labels as stored (capped): resolved again only when they
    // changed (a session's first labelled event, or a relabelling).
    if relabelled {
        let key = policy_key(st.tenant.as_deref(), st.agent_id.as_deref());
        if key != slot.policy_key {
            slot.policy = work.policy(key, st.tenant.as_deref(), st.agent_id.as_deref());
            slot.policy_key = key;
        }
    }
    // The event's context for the detectors, and the tool override's policy if any.
    let (ctx, tool_policy) = match &event.body {
        EventBody::LlmCall(call) => {
            let is_turn = call.call_kind == CallKind::Turn;
            let is_compaction = call.call_kind == CallKind::Compaction;
            let policy = &slot.policy;
            let (sketch, opening, chant, has_text) = work.text_features(call, is_turn, policy);
            slot.state.observe_llm(
                is_turn,
                is_compaction,
                call.input_tokens,
                call.output_tokens,
                call.cache_read_tokens,
                call.cache_write_tokens,
                call.cost_usd,
                call.tool_calls,
                call.progress,
                sketch.as_ref(),
                opening,
                policy.detectors.similar_turns.min_similarity.get(),
            );
            let ctx = Context::Llm(LlmContext {
                is_turn,
                is_compaction,
                has_progress: call.progress.is_some(),
                has_tool_calls: call.tool_calls.is_some(),
                has_text,
                chant,
            });
            (ctx, None)
        }
        EventBody::ToolCall(call) => {
            let (obs, has_action) = work.tool_observation(call, &event.event_id);
            let tool_policy = if work.config.has_tool_overrides() {
                let name = std::mem::take(&mut work.action_name);
                let p = work.tool_policy(slot, &call.tool, has_action.then_some(name.as_str()));
                work.action_name = name;
                p
            } else {
                None
            };
            let policy: &Policy = tool_policy.as_deref().unwrap_or(&slot.policy);
            let last_calls = policy.detectors.low_novelty.last_calls.get();
            let facts = slot.state.observe_tool(&call.tool, obs, last_calls);
            let ctx = Context::Tool(ToolContext {
                tool: &call.tool,
                obs,
                facts,
            });
            (ctx, tool_policy)
        }
        EventBody::SessionStarted => (Context::Other, None),
        EventBody::SessionCompleted(_) => return,
    };
    let policy: &Policy = tool_policy.as_deref().unwrap_or(&slot.policy);
    let order = match ctx {
        Context::Llm(_) => &work.order_llm,
        Context::Tool(_) => &work.order_tool,
        Context::Other => &work.order_other,
    };
    judge(
        order,
        &mut slot.state,
        policy,
        event,
        meta,
        event_ms,
        &ctx,
        out,
    );
}

/// Runs every detector on the updated state and emits what crosses a new level.
#[allow(clippy::too_many_arguments)]
fn judge(
    order: &[DetectorKind],
    st: &mut SessionState,
    policy: &Policy,
    event: &Event<'_>,
    meta: &EventMeta,
    event_ms: i64,
    ctx: &Context<'_>,
    out: &mut Vec<Output>,
) {
    let input = Input {
        context: ctx,
        depth: event.depth,
    };
    for &kind in order {
        let levels = policy.levels(kind);
        let Some(sig) = policy.detectors.evaluate(kind, levels, st, &input) else {
            continue;
        };
        if sig.reset {
            st.end_episode(kind);
        }
        let Some((reached, threshold)) = sig.level else {
            continue;
        };
        let ep = st.episodes[kind.index()];
        let steps = st.steps();
        // Nudge before kill: a termination waits until the episode's first finding has
        // had `grace_steps` steps to reach the agent and be acted on; until then it
        // is said as a critical warning.
        let grace_left = match ep.warned_at_step {
            Some(at) => levels.grace_steps.saturating_sub(steps.saturating_sub(at)),
            None => levels.grace_steps,
        };
        let level = if reached == Level::Terminate && grace_left > 0 {
            Level::Critical
        } else {
            reached
        };
        // Emitted once per level per episode; a level also covers the ones below it.
        if ep.emitted >= level.bit() {
            continue;
        }
        let mode = levels.mode;
        let effective = if level == Level::Terminate && mode == Mode::Warn {
            Level::Critical
        } else {
            level
        };
        // Terminate at most once per session, and a shadow termination once too. A
        // shadow one does not hold back an enforced one: a detector tried out in shadow
        // mode must not switch off the others' kills for the rest of the session.
        if level == Level::Terminate
            && st
                .termination
                .is_some_and(|t| !t.shadow || mode == Mode::Shadow)
        {
            continue;
        }
        let e = &mut st.episodes[kind.index()];
        let said_before = e.emitted & effective.bit() != 0;
        e.emitted |= (level.bit() << 1) - 1;
        if said_before {
            continue; // `warn` mode: the held termination was already said as critical
        }
        e.warned_at_step.get_or_insert(steps);
        if let Some(subject) = sig.subject {
            e.subject = subject;
        }
        let episode = e.number;
        st.count_finding(kind, effective);
        let terminated = effective == Level::Terminate;
        if terminated {
            st.termination = Some(crate::state::Termination {
                detector: kind,
                at_ms: event_ms,
                shadow: mode == Mode::Shadow,
            });
        }
        let finding = Finding {
            kind,
            level: effective,
            signal: sig,
            threshold,
            episode,
            mode,
            held_for_steps: (level != reached).then_some(grace_left),
        };
        out.push(Output::Finding(Box::new(build_finding(
            event, meta, event_ms, st, policy, &input, &finding,
        ))));
        if terminated && mode != Mode::Shadow {
            st.shrink_to_tombstone();
            break;
        }
    }
}

impl Engine {
    /// Writes every changed session, closed session and the given offsets to `store` in
    /// one atomic batch. Only engines made by [`Engine::restore`] track changes.
    pub fn flush(
        &mut self,
        store: &mut dyn StateStore,
        offsets: &[(String, i64)],
    ) -> Result<(), StoreError> {
        match self.take_changes(offsets) {
            Some(batch) => store.commit(batch),
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
        for id in dirty.drain() {
            if let Some(slot) = self.sessions.get(&id) {
                batch.puts.push((id, slot.state.to_bytes()));
            }
        }
        // A session that closed and reopened since the last flush is a put, not a delete.
        let sessions = &self.sessions;
        batch.deletes.extend(
            self.closed
                .drain(..)
                .filter(|id| !sessions.contains_key(id)),
        );
        batch.offsets.extend(offsets.iter().cloned());
        if let Some(w) = self.watermark {
            batch.offsets.push((WATERMARK_KEY.to_string(), w));
        }
        Some(batch)
    }
}

/// A finding the engine decided to emit.
#[derive(Clone, Copy)]
struct Finding {
    kind: DetectorKind,
    /// The level published (a termination in `warn` mode is a critical warning).
    level: Level,
    signal: Signal,
    threshold: f64,
    episode: u32,
    mode: Mode,
    /// A termination held back by the grace: the steps it still waits.
    held_for_steps: Option<u32>,
}

fn build_finding(
    event: &Event<'_>,
    meta: &EventMeta,
    event_ms: i64,
    st: &SessionState,
    policy: &Policy,
    input: &Input<'_>,
    finding: &Finding,
) -> FindingEvent {
    let Finding {
        kind,
        level,
        signal,
        threshold,
        episode,
        mode,
        held_for_steps,
    } = *finding;
    let mut d = policy
        .detectors
        .describe(kind, st, input, &signal, threshold);
    if let Some(steps) = held_for_steps {
        d.evidence
            .insert("terminates_in_steps".into(), serde_json::json!(steps));
        d.hint
            .push_str("; if this goes on, the session will be stopped");
    }
    let terminated = level == Level::Terminate;
    FindingEvent {
        kind: if terminated {
            "session.terminated"
        } else {
            "session.warning"
        }
        .to_string(),
        schema_version: SCHEMA_VERSION,
        event_id: finding_event_id(&event.session_id, kind, level, episode),
        session_id: event.session_id.to_string(),
        run_id: st.run_id.clone(),
        agent_id: st.agent_id.clone(),
        tenant: st.tenant.clone(),
        detector: kind,
        level,
        reason: d.reason,
        hint: d.hint,
        evidence: d.evidence,
        stats: Stats::of(st),
        trigger: Trigger {
            topic: meta.topic.as_deref().map(str::to_string),
            partition: meta.partition,
            offset: meta.offset,
            event_id: event.event_id.to_string(),
            trace_id: event.trace_id.as_deref().map(str::to_string),
        },
        event_time: format_rfc3339_ms(event_ms),
        detected_at: format_rfc3339_ms(meta.processing_time_ms.unwrap_or(event_ms)),
        mode,
        stop_reason: terminated.then_some(kind),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::event::{parse_event, ParseLimits};

    /// (index, detector, level, event_id) of every finding of `events` under `config`,
    /// the events in session `s`, a second apart, with their own ids (`e{i}` where one has
    /// none).
    fn findings(config: &str, events: &[serde_json::Value]) -> Vec<(usize, String, Level, String)> {
        let config = Arc::new(Config::from_toml_str(config, "t", std::iter::empty()).unwrap());
        let mut engine = Engine::new(config);
        let mut found = Vec::new();
        for (i, e) in events.iter().enumerate() {
            let mut e = e.clone();
            e["session_id"] = json!("s");
            if e.get("event_id").is_none() {
                e["event_id"] = json!(format!("e{i}"));
            }
            e["timestamp"] = json!(format_rfc3339_ms(1_800_000_000_000 + i as i64 * 1000));
            let line = e.to_string();
            let ev = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
            let mut out = Vec::new();
            engine.process(&ev, &EventMeta::default(), &mut out);
            for o in out {
                if let Output::Finding(f) = o {
                    found.push((i, f.detector.name().to_string(), f.level, f.event_id));
                }
            }
        }
        found
    }

    fn same_call() -> serde_json::Value {
        json!({"type": "tool.called", "tool": "read", "args": {"p": 1}, "result": "x"})
    }

    fn turn() -> serde_json::Value {
        json!({"type": "cost.attributed", "input_tokens": 10, "output_tokens": 5, "tool_calls": 1})
    }

    #[test]
    fn a_call_without_a_result_is_not_guessed_to_repeat_the_last_one() {
        let unknown = json!({"type": "tool.called", "tool": "run_tests", "args": {}});
        let f = findings("", &vec![unknown.clone(); 10]);
        let loops: Vec<&str> = f
            .iter()
            .map(|x| x.1.as_str())
            .filter(|d| ["repeat", "circuit_breaker", "low_novelty", "cycle"].contains(d))
            .collect();
        assert!(loops.is_empty(), "{f:?}");
        // One such call a turn, failing, with ids that differ only in a number standing
        // alone: neither old news nor the same error.
        let failing =
            json!({"type": "tool.called", "tool": "run_tests", "args": {}, "is_error": true});
        let mut events = Vec::new();
        for i in 0..8 {
            events.push(turn());
            let mut call = failing.clone();
            call["event_id"] = json!(format!("call-{i}"));
            events.push(call);
        }
        let f = findings("", &events);
        let judged: Vec<&str> = f
            .iter()
            .map(|x| x.1.as_str())
            .filter(|d| ["no_new_information", "same_error", "repeat"].contains(d))
            .collect();
        assert!(judged.is_empty(), "{f:?}");
        // The same action naming the same result, `null` (a tool that said nothing), does.
        let nothing =
            json!({"type": "tool.called", "tool": "run_tests", "args": {}, "result": null});
        let f = findings("", &vec![nothing; 10]);
        assert!(
            f.iter().any(|x| x.1 == "repeat" && x.2 == Level::Terminate),
            "{f:?}"
        );
    }

    #[test]
    fn a_shadow_termination_does_not_hold_back_an_enforced_one() {
        let failing = json!({"type": "tool.called", "tool": "run", "args": {"x": 1}, "result": "boom", "is_error": true});
        let mut events = vec![same_call(); 8];
        events.extend(vec![failing; 8]);
        let f = findings("[detectors.repeat]\nmode = \"shadow\"\n", &events);
        let kills: Vec<(usize, &str)> = f
            .iter()
            .filter(|x| x.2 == Level::Terminate)
            .map(|x| (x.0, x.1.as_str()))
            .collect();
        // `repeat`'s shadow kill of the first loop, then `error_repeat`'s real one of the
        // second (after which the session is a tombstone: nothing more).
        assert_eq!(kills.len(), 2, "{f:?}");
        assert_eq!(kills[0], (5, "repeat"));
        assert_eq!(kills[1].1, "error_repeat");
        assert_eq!(f.last().unwrap().2, Level::Terminate, "{f:?}");
    }

    /// A finding names the trace of the event that fired it, and a summary the trace of
    /// the event that completed its session, so a kill switch can match either id.
    #[test]
    fn outputs_carry_the_trace_of_their_event() {
        let config = Arc::new(Config::default());
        let mut engine = Engine::new(config);
        let mut out = Vec::new();
        for i in 0..6 {
            let mut e = same_call();
            e["session_id"] = json!("s");
            e["event_id"] = json!(format!("e{i}"));
            e["trace_id"] = json!(format!("trace-{i}"));
            let line = e.to_string();
            let ev = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
            engine.process(&ev, &EventMeta::default(), &mut out);
        }
        let done = json!({"type": "session.completed", "session_id": "s", "trace_id": "trace-end"});
        let line = done.to_string();
        let ev = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
        engine.process(&ev, &EventMeta::default(), &mut out);
        let Output::Finding(first) = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(first.trigger.trace_id.as_deref(), Some("trace-2"));
        let Some(Output::Summary(summary)) = out.last() else {
            panic!("{out:?}")
        };
        assert_eq!(summary.trace_id.as_deref(), Some("trace-end"));
        let json = serde_json::to_value(first).unwrap();
        assert_eq!(json["trigger"]["trace_id"], "trace-2");
        // Without one, the field is left out: outputs of other sources are unchanged.
        let mut untraced = first.clone();
        untraced.trigger.trace_id = None;
        let json = serde_json::to_value(&untraced).unwrap();
        assert!(json["trigger"].get("trace_id").is_none(), "{json}");
    }

    #[test]
    fn a_loop_terminates_only_grace_steps_after_its_first_warning() {
        // No turns reported: steps are tool calls. Warned at the 3rd call (step 3); the
        // 4th reaches the termination threshold but is held (critical); step 6 kills.
        let f = findings("", &vec![same_call(); 8]);
        let levels: Vec<(usize, Level)> = f.iter().map(|x| (x.0, x.2)).collect();
        assert_eq!(
            levels,
            vec![
                (2, Level::Warning),
                (3, Level::Critical),
                (5, Level::Terminate)
            ]
        );
        let f = findings("[engine]\ngrace_steps = 0\n", &vec![same_call(); 8]);
        assert_eq!(f.last().map(|x| (x.0, x.2)), Some((3, Level::Terminate)));
    }

    /// `repeat`'s findings under `config`, as (event index, level).
    fn repeat_levels(config: &str, events: &[serde_json::Value]) -> Vec<(usize, Level)> {
        findings(config, events)
            .iter()
            .filter(|x| x.1 == "repeat")
            .map(|x| (x.0, x.2))
            .collect()
    }

    #[test]
    fn grace_is_counted_in_turns_when_the_session_reports_them() {
        // turn, call, turn, call, …: the warning comes with the 3rd call (turn 3); the kill
        // waits for the 3rd turn after it, whatever the calls in between.
        let mut evs = Vec::new();
        for _ in 0..8 {
            evs.push(turn());
            evs.push(same_call());
        }
        assert_eq!(
            repeat_levels("[detectors.repeat]\ngrace_steps = 3\n", &evs),
            vec![
                (5, Level::Warning),
                (7, Level::Critical),
                (11, Level::Terminate)
            ]
        );
    }

    #[test]
    fn tool_calls_no_llm_call_asked_for_are_steps() {
        // A source whose LLM calls stop arriving (spans that lost their token counts): the
        // grace of the critical warning ("terminates in 3 steps") is kept in tool calls.
        let mut evs = vec![turn(), same_call()];
        evs.extend(vec![same_call(); 10]);
        let f = findings("", &evs);
        let levels: Vec<(usize, Level)> = f.iter().map(|x| (x.0, x.2)).collect();
        assert_eq!(
            levels,
            vec![
                (3, Level::Warning),
                (4, Level::Critical),
                (6, Level::Terminate)
            ]
        );
        // The calls one response asks for are that response's step, not steps of their
        // own: three parallel calls per turn keep the grace counted in turns.
        let mut evs = Vec::new();
        for _ in 0..6 {
            let mut t = turn();
            t["tool_calls"] = json!(3);
            evs.push(t);
            evs.extend(vec![same_call(); 3]);
        }
        // Warned at the 3rd call (turn 1, event 3), held at the 4th (turn 2, event 5);
        // the kill waits three turns past the warning: turn 4's first call (event 13).
        assert_eq!(
            repeat_levels("[detectors.repeat]\nwindow_terminate_at = \"off\"\n", &evs),
            vec![
                (3, Level::Warning),
                (5, Level::Critical),
                (13, Level::Terminate)
            ]
        );
    }

    #[test]
    fn a_loop_that_ends_within_the_grace_is_not_killed() {
        let mut evs = vec![same_call(); 5];
        evs.push(json!({"type": "tool.called", "tool": "edit", "args": {"p": 2}, "result": "y"}));
        evs.extend(vec![same_call(); 2]);
        let f = findings("", &evs);
        assert!(f.iter().all(|x| x.2 != Level::Terminate), "{f:?}");
        assert!(f.iter().any(|x| x.2 == Level::Critical));
    }

    #[test]
    fn detectors_without_a_warning_level_hold_their_first_termination() {
        // warn_at off: reaching terminate_at is said as a critical warning first.
        let cfg = "[detectors.repeat]\nwarn_at = \"off\"\n";
        let f = findings(cfg, &vec![same_call(); 8]);
        let levels: Vec<(usize, Level)> = f.iter().map(|x| (x.0, x.2)).collect();
        assert_eq!(levels, vec![(3, Level::Critical), (6, Level::Terminate)]);
    }

    #[test]
    fn warn_mode_says_a_held_termination_once() {
        let f = findings(
            "[detectors.repeat]\nmode = \"warn\"\n",
            &vec![same_call(); 10],
        );
        let mut ids: Vec<&str> = f.iter().map(|x| x.3.as_str()).collect();
        let all = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), all, "an event_id twice: {f:?}");
        let repeat: Vec<Level> = f.iter().filter(|x| x.1 == "repeat").map(|x| x.2).collect();
        assert_eq!(repeat, vec![Level::Warning, Level::Critical]);
    }

    #[test]
    fn ceilings_stop_at_their_limit_without_grace() {
        let evs: Vec<serde_json::Value> = (0..5)
            .map(|i| json!({"type": "tool.called", "tool": "t", "args": {"i": i}, "result": i}))
            .collect();
        let f = findings("[detectors.tool_call_cap]\nterminate_at = 5\n", &evs);
        assert_eq!(
            f.iter().map(|x| (x.0, x.2)).collect::<Vec<_>>(),
            vec![(3, Level::Warning), (4, Level::Terminate)]
        );
    }

    #[test]
    fn duplicates_are_dropped_and_sessions_close_on_the_gap() {
        let config = Arc::new(
            Config::from_toml_str("[engine]\nsession_gap_secs = 60\n", "t", std::iter::empty())
                .unwrap(),
        );
        let mut engine = Engine::new(config);
        let mut out = Vec::new();
        let ev = |id: &str, sid: &str, ts: &str| {
            let e = json!({"type": "tool.called", "tool": "t", "session_id": sid, "event_id": id, "timestamp": ts});
            parse_event(e.to_string().as_bytes(), &ParseLimits::default())
                .unwrap()
                .into_owned()
        };
        for _ in 0..3 {
            let e = ev("same", "s", "2026-01-01T00:00:00Z");
            engine.process(&e, &EventMeta::default(), &mut out);
        }
        assert_eq!(engine.session("s").unwrap().stats.tool_calls, 1);
        assert_eq!(engine.session("s").unwrap().stats.duplicates, 2);
        let e = ev("x", "other", "2026-01-01T00:01:01Z");
        engine.process(&e, &EventMeta::default(), &mut out);
        let closed: Vec<_> = out
            .iter()
            .filter_map(|o| match o {
                Output::Summary(s) => Some((s.session_id.clone(), s.stop_reason.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(closed, vec![("s".to_string(), "idle_timeout".to_string())]);
        engine.close_all(ClosedBy::EndOfInput, &mut out);
        assert_eq!(engine.open_sessions(), 0);
    }
}

//! Prometheus metrics of `loopwarden run`: what was consumed, found, stopped, stored and
//! delivered, and how long it took.
//!
//! Guarantees: every name is `loopwarden_<name>_<unit>[_total]`; labels are bounded
//! (event type, bad-input reason, detector, level, mode, stop reason, topic and partition
//! number) and never carry a session id. The one per-owner family (findings by tenant and
//! agent, for "top agents" charts) holds at most `telemetry.owner_series_limit` owners;
//! later owners are counted under `(other)`. Updating a metric is a few atomic operations
//! (plus one short lock per finding for the owner family) and never blocks the pipeline.

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Buckets (seconds) for latencies from a millisecond to a minute.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Owners (tenant, agent) counted one by one in `loopwarden_findings_by_owner_total`
/// by default.
pub const DEFAULT_OWNER_SERIES_LIMIT: usize = 1000;

/// Services counted one by one in `loopwarden_otlp_uncaptured_spans_total`.
pub const UNCAPTURED_SERVICE_LIMIT: usize = 100;

/// The label value of findings without a tenant or agent id.
pub const NO_OWNER: &str = "(none)";
/// The label value of owners beyond the series limit.
pub const OTHER_OWNERS: &str = "(other)";

/// Every metric loopwarden exports, registered in one registry.
pub struct Metrics {
    registry: Registry,
    /// Published findings by tenant, agent and level; bounded, see `finding_by_owner`.
    findings_by_owner: IntCounterVec,
    owners: Mutex<HashSet<(String, String)>>,
    owner_series_limit: usize,
    /// Steps the OTLP ingest mapped without token counts or content, by service;
    /// bounded, see `uncaptured_spans`.
    otlp_uncaptured: IntCounterVec,
    uncaptured_services: Mutex<HashSet<String>>,
    /// Input events applied, by `type`.
    pub events_consumed: IntCounterVec,
    /// Events at or below a partition's stored offset, skipped after a restart.
    pub events_skipped: IntCounter,
    /// Events whose own time was behind their partition's clock by more than
    /// `session_gap_secs` (a lagging producer clock or a backlog); judged as usual.
    pub late_events: IntCounter,
    /// Events stamped more than `engine.future_grace_secs` after their message's timestamp
    /// or this host's clock, whichever is earlier (a clock running ahead): their
    /// partition's clock moved to that limit only; judged as usual.
    pub future_events: IntCounter,
    /// Events of a session that had completed, stamped at or before its end and arriving
    /// within a minute of the stream's clock after it: dropped, not opened as a session.
    pub events_after_completion: IntCounter,
    /// Terminated sessions that went on ([`crate::engine::state::UNSTOPPED_AFTER`]).
    pub sessions_unstopped: IntCounter,
    /// Events that named another tenant than their session had.
    pub other_tenant_events: IntCounter,
    /// Times a partition's heads went on without an input topic that still claimed
    /// unpolled events after the aligner's bound (the order may then differ from replay's).
    pub align_overruns: IntCounter,
    /// Bad input sent to the dead-letter topic, by reason.
    pub bad_events: IntCounterVec,
    /// Input events whose message key is not their `session_id`, by `key`: `missing`
    /// (unkeyed) or `other` (keyed by something else). Applied as usual, but such a
    /// session may be split over partitions and instances.
    pub events_miskeyed: IntCounterVec,
    /// Published findings, by detector, level and mode.
    pub findings: IntCounterVec,
    /// Findings a shadow-mode detector would have published.
    pub shadow_findings: IntCounterVec,
    /// Terminations, by stop reason (the detector).
    pub terminations: IntCounterVec,
    /// Sessions closed, by how they closed, their final stop reason and their outcome.
    pub sessions_closed: IntCounterVec,
    /// Closed sessions a shadow-mode detector would have terminated, by detector and
    /// outcome: what enforcing would have cost (`outcome="success"`) or saved.
    pub shadow_stops: IntCounterVec,
    /// Open sessions held by this process.
    pub sessions_open: IntGauge,
    /// Bytes of the sled state directory on disk.
    pub state_store_bytes: IntGauge,
    /// How long the longest state store write in progress has lasted, whole seconds (0
    /// when none is): set when scraped, from [`super::Liveness`].
    pub store_write_in_progress_seconds: IntGauge,
    /// Messages on the broker behind what this process applied, per input partition.
    pub consumer_lag: IntGaugeVec,
    /// From an event's poll to its batch being delivered, stored and committed.
    pub processing_latency: Histogram,
    /// From the producer's timestamp on the triggering event to the finding's delivery.
    pub produce_to_finding_latency: Histogram,
    /// Committing a batch: the offset commit (at-least-once) or the transaction.
    pub commit_duration: Histogram,
    /// Writing and fsyncing a batch's state to sled.
    pub flush_duration: Histogram,
    /// Delivering a batch's output records (until every acknowledgement).
    pub delivery_duration: Histogram,
    /// A batch's time per stage (`wait`, `apply`, `close` (at_least_once), `deliver`,
    /// `store`, `commit`): the latency budget of a finding.
    pub batch_stages: HistogramVec,
    /// Output deliveries that failed and were retried.
    pub delivery_retries: IntCounter,
    /// Batches finished.
    pub batches: IntCounter,
    /// Session states written: one per session a batch changed and left open (a sled
    /// write, and with the changelog on a changelog record), counted as the batch is
    /// handed to the store writer, once it is on the broker (closed sessions' deletes are
    /// not counted; a batch dropped unstored, after a lost assignment or a fenced
    /// transaction, is not either).
    pub states_written: IntCounter,
    /// Bytes of those states, whole (each also a changelog record's value when the
    /// changelog is on): with `states_written`, the size of a state written, which sets
    /// the store's and the changelog's cost per event as much as their number does.
    pub states_written_bytes: IntCounter,
    /// Bytes the state store wrote to sled (records of whole states and deltas, the
    /// chains folding copies, deletions), counted as the store writer reports a batch
    /// stored: against `states_written_bytes`, what the deltas save net of the folding.
    pub store_written_bytes: IntCounter,
    /// Session records applied from the changelog, and restores by duration.
    pub restored_records: IntCounter,
    pub restore_duration: Histogram,
    /// Partitions currently assigned to this process.
    pub partitions_assigned: IntGauge,
    /// Spans dropped because the exporter could not keep up or reach its collector.
    pub spans_dropped: IntCounter,
    /// Spans read by the OTLP ingest, by what they gave (an LLM call, a tool call, an
    /// agent) or why they gave nothing.
    pub otlp_spans: IntCounterVec,
    /// Events the OTLP ingest published onto the input topic.
    pub otlp_events_published: IntCounter,
}

/// A metric family: its name, its help text and its label names.
struct Family {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
}

// The families (the exposition sorts them by name).
const FINDINGS_BY_OWNER: Family = Family {
    name: "loopwarden_findings_by_owner_total",
    help: "Published findings by tenant, agent and level; owners beyond telemetry.owner_series_limit count as (other).",
    labels: &["tenant", "agent", "level"],
};

const EVENTS_CONSUMED: Family = Family {
    name: "loopwarden_events_consumed_total",
    help: "Input events applied to the engine, by event type.",
    labels: &["type"],
};

const EVENTS_SKIPPED: Family = Family {
    name: "loopwarden_events_skipped_total",
    help: "Events at or below a partition's stored offset (already applied before a restart).",
    labels: &[],
};

const LATE_EVENTS: Family = Family {
    name: "loopwarden_late_events_total",
    help: "Events whose own time was behind their partition's clock by more than session_gap_secs (a lagging producer clock or a backlog); judged as usual.",
    labels: &[],
};

const FUTURE_EVENTS: Family = Family {
    name: "loopwarden_future_events_total",
    help: "Events stamped more than future_grace_secs after their message's timestamp or this host's clock, whichever is earlier (a clock running ahead): their partition's clock moved to that limit only; judged as usual.",
    labels: &[],
};

const OTHER_TENANT_EVENTS: Family = Family {
    name: "loopwarden_other_tenant_events_total",
    help: "Events that named another tenant than the session they joined had until then: two tenants' sessions under one session id, judged as one session (make session ids unique across tenants), or producers that name a session's tenant differently; judged as any event.",
    labels: &[],
};

const EVENTS_AFTER_COMPLETION: Family = Family {
    name: "loopwarden_events_after_completion_total",
    help: "Events of a session that had completed, stamped at or before its end and arriving within a minute of the stream's clock after it (a producer's straggler, a completion sent twice): dropped, not opened as a session of their own.",
    labels: &[],
};

const SESSIONS_UNSTOPPED: Family = Family {
    name: "loopwarden_sessions_unstopped_total",
    help: "Sessions terminated (enforce mode) whose events went on: 8 after the termination (session.completed aside), more than the calls in flight when it was published. Their runtime did not stop them: its kill path did not act on session.terminated, or missed it.",
    labels: &[],
};

const BAD_EVENTS: Family = Family {
    name: "loopwarden_bad_events_total",
    help: "Bad input messages sent to the dead-letter topic, by reason.",
    labels: &["reason"],
};

const EVENTS_MISKEYED: Family = Family {
    name: "loopwarden_events_miskeyed_total",
    help: "Input events whose message key is not their session id (key: missing or other); applied as usual, but such a session may be split over partitions.",
    labels: &["key"],
};

const FINDINGS: Family = Family {
    name: "loopwarden_findings_total",
    help: "Published findings (warnings and terminations), by detector, level and mode.",
    labels: &["detector", "level", "mode"],
};

const SHADOW_FINDINGS: Family = Family {
    name: "loopwarden_shadow_findings_total",
    help: "Findings of shadow-mode detectors (not published), by detector and level.",
    labels: &["detector", "level"],
};

const TERMINATIONS: Family = Family {
    name: "loopwarden_terminations_total",
    help: "Sessions terminated, by stop reason (the detector that stopped them).",
    labels: &["stop_reason"],
};

const SESSIONS_CLOSED: Family = Family {
    name: "loopwarden_sessions_closed_total",
    help: "Sessions closed (a session.summary was emitted), by how they closed, their final stop reason and the outcome the runtime reported (success, failure, unknown).",
    labels: &["closed_by", "stop_reason", "outcome"],
};

const SHADOW_STOPS: Family = Family {
    name: "loopwarden_shadow_stops_total",
    help: "Closed sessions that a shadow-mode detector would have terminated, by detector and the outcome the runtime reported (success, failure, unknown).",
    labels: &["detector", "outcome"],
};

const SESSIONS_OPEN: Family = Family {
    name: "loopwarden_sessions_open",
    help: "Open sessions held by this process.",
    labels: &[],
};

const STATE_STORE_BYTES: Family = Family {
    name: "loopwarden_state_store_bytes",
    help: "Size of the sled state directory on disk.",
    labels: &[],
};

const STORE_WRITE_IN_PROGRESS: Family = Family {
    name: "loopwarden_store_write_in_progress_seconds",
    help: "How long the longest state store write in progress has lasted (0: none); past state.write_stall_secs, /healthz fails.",
    labels: &[],
};

const CONSUMER_LAG: Family = Family {
    name: "loopwarden_consumer_lag_messages",
    help: "Messages on the broker behind the last applied offset, per input partition.",
    labels: &["topic", "partition"],
};

const PROCESSING_LATENCY: Family = Family {
    name: "loopwarden_processing_latency_seconds",
    help: "From an event's poll to its batch being delivered, stored and committed (with a commit interval, its partition's).",
    labels: &[],
};

const PRODUCE_TO_FINDING_LATENCY: Family = Family {
    name: "loopwarden_produce_to_finding_latency_seconds",
    help: "From the Kafka timestamp of the event that fired a finding to the broker's acknowledgement of the finding (exactly_once: before its transaction commits).",
    labels: &[],
};

const COMMIT_DURATION: Family = Family {
    name: "loopwarden_commit_duration_seconds",
    help: "Committing a batch: the offset commit, or the whole transaction in exactly_once mode.",
    labels: &[],
};

const FLUSH_DURATION: Family = Family {
    name: "loopwarden_flush_duration_seconds",
    help: "Writing a batch's state and offsets to sled and fsyncing it.",
    labels: &[],
};

const DELIVERY_DURATION: Family = Family {
    name: "loopwarden_delivery_duration_seconds",
    help: "Producing a batch's output records until every acknowledgement (at_least_once).",
    labels: &[],
};

const BATCH_STAGES: Family = Family {
    name: "loopwarden_batch_stage_seconds",
    help: "A batch's time per stage: wait (first event polled to the batch closing), apply (events through the engines), close (at_least_once: the batch's changes taken, its records handed to the producer and the batch before handed to the store writer, on the thread that polls), deliver (waiting for the broker to acknowledge the batch before, whose records were in flight while this one was polled; exactly_once: the whole transaction), store (sled write and fsync), commit (offset commit).",
    labels: &["stage"],
};

const ALIGN_OVERRUNS: Family = Family {
    name: "loopwarden_align_overruns_total",
    help: "Times a partition's events went on without an input topic that still claimed unpolled events after 30 s.",
    labels: &[],
};

const DELIVERY_RETRIES: Family = Family {
    name: "loopwarden_delivery_retries_total",
    help: "Output records whose delivery failed and was retried.",
    labels: &[],
};

const BATCHES: Family = Family {
    name: "loopwarden_batches_total",
    help: "Batches finished.",
    labels: &[],
};

const STATES_WRITTEN: Family = Family {
    name: "loopwarden_states_written_total",
    help: "Session states written to the store (and the changelog when on): one per session a batch changed and left open.",
    labels: &[],
};

const STATES_WRITTEN_BYTES: Family = Family {
    name: "loopwarden_states_written_bytes_total",
    help: "Bytes of the session states written to the store (and the changelog when on), whole: over loopwarden_states_written_total, a state's size.",
    labels: &[],
};

const STORE_WRITTEN_BYTES: Family = Family {
    name: "loopwarden_state_store_written_bytes_total",
    help: "Bytes of records the state store wrote to sled: whole states, deltas, the copies its folding writes and deletions.",
    labels: &[],
};

const RESTORED_RECORDS: Family = Family {
    name: "loopwarden_restored_records_total",
    help: "Session records applied from the changelog while restoring partitions.",
    labels: &[],
};

const RESTORE_DURATION: Family = Family {
    name: "loopwarden_restore_duration_seconds",
    help: "Restoring one partition's state from the changelog.",
    labels: &[],
};

const PARTITIONS_ASSIGNED: Family = Family {
    name: "loopwarden_partitions_assigned",
    help: "Input partition numbers currently assigned to this process.",
    labels: &[],
};

const SPANS_DROPPED: Family = Family {
    name: "loopwarden_spans_dropped_total",
    help: "Spans dropped because the exporter's queue was full or its collector unreachable.",
    labels: &[],
};

const OTLP_SPANS: Family = Family {
    name: "loopwarden_otlp_spans_total",
    help: "Spans read by the OTLP ingest, by outcome: llm_call, tool_call, agent (names and depth for its descendants), or why they gave no event (no_tool_name, not_agent_step, invalid_ids).",
    labels: &["outcome"],
};

const OTLP_UNCAPTURED: Family = Family {
    name: "loopwarden_otlp_uncaptured_spans_total",
    help: "Steps the OTLP ingest mapped without what the detectors read, by service (service.name; beyond 100 services: (other)) and what was missing: token_usage (counted as 0 tokens) or content (the output, or a tool call's arguments or result).",
    labels: &["service", "missing"],
};

const OTLP_EVENTS_PUBLISHED: Family = Family {
    name: "loopwarden_otlp_events_published_total",
    help: "Events the OTLP ingest published, keyed by session, onto the input topic (dead letters not counted).",
    labels: &[],
};

/// Creates each family and registers it at once, so that none is left unregistered.
struct Registering<'r>(&'r Registry);

impl Registering<'_> {
    fn add<C: prometheus::core::Collector + Clone + 'static>(&self, c: C) -> C {
        self.0
            .register(Box::new(c.clone()))
            .expect("metric names are unique");
        c
    }

    fn counter(&self, f: Family) -> IntCounter {
        self.add(IntCounter::new(f.name, f.help).expect("valid metric"))
    }

    fn counter_vec(&self, f: Family) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(f.name, f.help), f.labels).expect("valid metric"))
    }

    fn gauge(&self, f: Family) -> IntGauge {
        self.add(IntGauge::new(f.name, f.help).expect("valid metric"))
    }

    fn gauge_vec(&self, f: Family) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(f.name, f.help), f.labels).expect("valid metric"))
    }

    fn histogram(&self, f: Family) -> Histogram {
        let opts = HistogramOpts::new(f.name, f.help).buckets(LATENCY_BUCKETS.to_vec());
        self.add(Histogram::with_opts(opts).expect("valid metric"))
    }

    fn histogram_vec(&self, f: Family) -> HistogramVec {
        let opts = HistogramOpts::new(f.name, f.help).buckets(LATENCY_BUCKETS.to_vec());
        self.add(HistogramVec::new(opts, f.labels).expect("valid metric"))
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::with_owner_series_limit(DEFAULT_OWNER_SERIES_LIMIT)
    }

    /// Observes how long a batch spent in `stage` (see [`Metrics::batch_stages`]).
    pub fn observe_stage(&self, stage: &str, took: std::time::Duration) {
        self.batch_stages
            .with_label_values(&[stage])
            .observe(took.as_secs_f64());
    }

    /// Metrics whose per-owner family holds at most `owner_series_limit` owners.
    pub fn with_owner_series_limit(owner_series_limit: usize) -> Metrics {
        let registry = Registry::new();
        let r = Registering(&registry);
        Metrics {
            findings_by_owner: r.counter_vec(FINDINGS_BY_OWNER),
            events_consumed: r.counter_vec(EVENTS_CONSUMED),
            events_skipped: r.counter(EVENTS_SKIPPED),
            late_events: r.counter(LATE_EVENTS),
            future_events: r.counter(FUTURE_EVENTS),
            events_after_completion: r.counter(EVENTS_AFTER_COMPLETION),
            sessions_unstopped: r.counter(SESSIONS_UNSTOPPED),
            other_tenant_events: r.counter(OTHER_TENANT_EVENTS),
            bad_events: r.counter_vec(BAD_EVENTS),
            events_miskeyed: r.counter_vec(EVENTS_MISKEYED),
            findings: r.counter_vec(FINDINGS),
            shadow_findings: r.counter_vec(SHADOW_FINDINGS),
            terminations: r.counter_vec(TERMINATIONS),
            sessions_closed: r.counter_vec(SESSIONS_CLOSED),
            shadow_stops: r.counter_vec(SHADOW_STOPS),
            sessions_open: r.gauge(SESSIONS_OPEN),
            state_store_bytes: r.gauge(STATE_STORE_BYTES),
            store_write_in_progress_seconds: r.gauge(STORE_WRITE_IN_PROGRESS),
            consumer_lag: r.gauge_vec(CONSUMER_LAG),
            processing_latency: r.histogram(PROCESSING_LATENCY),
            produce_to_finding_latency: r.histogram(PRODUCE_TO_FINDING_LATENCY),
            commit_duration: r.histogram(COMMIT_DURATION),
            flush_duration: r.histogram(FLUSH_DURATION),
            delivery_duration: r.histogram(DELIVERY_DURATION),
            batch_stages: r.histogram_vec(BATCH_STAGES),
            align_overruns: r.counter(ALIGN_OVERRUNS),
            delivery_retries: r.counter(DELIVERY_RETRIES),
            batches: r.counter(BATCHES),
            states_written: r.counter(STATES_WRITTEN),
            states_written_bytes: r.counter(STATES_WRITTEN_BYTES),
            store_written_bytes: r.counter(STORE_WRITTEN_BYTES),
            restored_records: r.counter(RESTORED_RECORDS),
            restore_duration: r.histogram(RESTORE_DURATION),
            partitions_assigned: r.gauge(PARTITIONS_ASSIGNED),
            spans_dropped: r.counter(SPANS_DROPPED),
            otlp_spans: r.counter_vec(OTLP_SPANS),
            otlp_uncaptured: r.counter_vec(OTLP_UNCAPTURED),
            otlp_events_published: r.counter(OTLP_EVENTS_PUBLISHED),
            owners: Mutex::new(HashSet::new()),
            owner_series_limit,
            uncaptured_services: Mutex::new(HashSet::new()),
            registry,
        }
    }

    /// Counts a published finding for its owner. The first `owner_series_limit` distinct
    /// (tenant, agent) pairs get their own series; later ones share `(other)`, so a fleet
    /// with unbounded agent ids cannot grow the exposition without bound.
    pub fn finding_by_owner(&self, tenant: Option<&str>, agent: Option<&str>, level: &str) {
        let tenant = tenant.unwrap_or(NO_OWNER);
        let agent = agent.unwrap_or(NO_OWNER);
        let counted = {
            let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
            let key = (tenant.to_string(), agent.to_string());
            owners.contains(&key) || (owners.len() < self.owner_series_limit && owners.insert(key))
        };
        let (tenant, agent) = if counted {
            (tenant, agent)
        } else {
            (OTHER_OWNERS, OTHER_OWNERS)
        };
        self.findings_by_owner
            .with_label_values(&[tenant, agent, level])
            .inc();
    }

    /// Counts `spans` steps of `service` mapped without `missing` (`token_usage`,
    /// `content`). The first [`UNCAPTURED_SERVICE_LIMIT`] services are counted by name,
    /// later ones as `(other)`.
    pub fn uncaptured_spans(&self, service: &str, missing: &str, spans: u64) {
        let service = if service.is_empty() {
            NO_OWNER
        } else {
            service
        };
        let counted = {
            let mut seen = self
                .uncaptured_services
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            seen.contains(service)
                || (seen.len() < UNCAPTURED_SERVICE_LIMIT && seen.insert(service.to_string()))
        };
        let service = if counted { service } else { OTHER_OWNERS };
        self.otlp_uncaptured
            .with_label_values(&[service, missing])
            .inc_by(spans);
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("encoding to memory cannot fail");
        String::from_utf8(out).expect("the exposition is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_convention_and_labels_never_name_a_session() {
        let m = Metrics::new();
        m.findings
            .with_label_values(&["repeat", "terminate", "enforce"])
            .inc();
        m.consumer_lag
            .with_label_values(&["tool.called", "3"])
            .set(7);
        m.processing_latency.observe(0.02);
        let text = m.render();
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        // Labelled families appear once they have a series; the rest always do.
        assert_eq!(names.len(), 27, "{names:?}");
        for name in &names {
            assert!(name.starts_with("loopwarden_"), "{name}");
        }
        assert!(text.contains(
            "loopwarden_findings_total{detector=\"repeat\",level=\"terminate\",mode=\"enforce\"} 1"
        ));
        assert!(text
            .contains("loopwarden_consumer_lag_messages{partition=\"3\",topic=\"tool.called\"} 7"));
        assert!(!text.contains("session_id"));
    }

    #[test]
    fn owners_beyond_the_limit_share_one_series() {
        let m = Metrics::with_owner_series_limit(2);
        m.finding_by_owner(Some("acme"), Some("coder"), "warning");
        m.finding_by_owner(None, Some("coder"), "warning");
        m.finding_by_owner(Some("acme"), Some("coder"), "terminate");
        m.finding_by_owner(Some("globex"), Some("coder"), "warning");
        m.finding_by_owner(Some("initech"), None, "warning");
        let text = m.render();
        let series = |tenant: &str, agent: &str, level: &str| {
            format!("loopwarden_findings_by_owner_total{{agent=\"{agent}\",level=\"{level}\",tenant=\"{tenant}\"}}")
        };
        assert!(
            text.contains(&(series("acme", "coder", "warning") + " 1")),
            "{text}"
        );
        assert!(text.contains(&(series("acme", "coder", "terminate") + " 1")));
        assert!(text.contains(&(series("(none)", "coder", "warning") + " 1")));
        assert!(text.contains(&(series("(other)", "(other)", "warning") + " 2")));
        assert!(!text.contains("globex") && !text.contains("initech"));
    }
}

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
    /// A batch's time per stage (`wait`, `apply`, `deliver`, `store`, `commit`): the
    /// latency budget of a finding.
    pub batch_stages: HistogramVec,
    /// Output deliveries that failed and were retried.
    pub delivery_retries: IntCounter,
    /// Batches finished.
    pub batches: IntCounter,
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

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
}

fn histogram(name: &str, help: &str) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()))
        .expect("valid metric")
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
        let m = Metrics {
            registry: Registry::new(),
            findings_by_owner: counter_vec(
                "loopwarden_findings_by_owner_total",
                "Published findings by tenant, agent and level; owners beyond telemetry.owner_series_limit count as (other).",
                &["tenant", "agent", "level"],
            ),
            owners: Mutex::new(HashSet::new()),
            owner_series_limit,
            events_consumed: counter_vec(
                "loopwarden_events_consumed_total",
                "Input events applied to the engine, by event type.",
                &["type"],
            ),
            events_skipped: IntCounter::new(
                "loopwarden_events_skipped_total",
                "Events at or below a partition's stored offset (already applied before a restart).",
            )
            .expect("valid metric"),
            late_events: IntCounter::new(
                "loopwarden_late_events_total",
                "Events whose own time was behind their partition's clock by more than session_gap_secs (a lagging producer clock or a backlog); judged as usual.",
            )
            .expect("valid metric"),
            bad_events: counter_vec(
                "loopwarden_bad_events_total",
                "Bad input messages sent to the dead-letter topic, by reason.",
                &["reason"],
            ),
            events_miskeyed: counter_vec(
                "loopwarden_events_miskeyed_total",
                "Input events whose message key is not their session id (key: missing or other); applied as usual, but such a session may be split over partitions.",
                &["key"],
            ),
            findings: counter_vec(
                "loopwarden_findings_total",
                "Published findings (warnings and terminations), by detector, level and mode.",
                &["detector", "level", "mode"],
            ),
            shadow_findings: counter_vec(
                "loopwarden_shadow_findings_total",
                "Findings of shadow-mode detectors (not published), by detector and level.",
                &["detector", "level"],
            ),
            terminations: counter_vec(
                "loopwarden_terminations_total",
                "Sessions terminated, by stop reason (the detector that stopped them).",
                &["stop_reason"],
            ),
            sessions_closed: counter_vec(
                "loopwarden_sessions_closed_total",
                "Sessions closed (a session.summary was emitted), by how they closed, their final stop reason and the outcome the runtime reported (success, failure, unknown).",
                &["closed_by", "stop_reason", "outcome"],
            ),
            shadow_stops: counter_vec(
                "loopwarden_shadow_stops_total",
                "Closed sessions that a shadow-mode detector would have terminated, by detector and the outcome the runtime reported (success, failure, unknown).",
                &["detector", "outcome"],
            ),
            sessions_open: IntGauge::new(
                "loopwarden_sessions_open",
                "Open sessions held by this process.",
            )
            .expect("valid metric"),
            state_store_bytes: IntGauge::new(
                "loopwarden_state_store_bytes",
                "Size of the sled state directory on disk.",
            )
            .expect("valid metric"),
            consumer_lag: IntGaugeVec::new(
                Opts::new(
                    "loopwarden_consumer_lag_messages",
                    "Messages on the broker behind the last applied offset, per input partition.",
                ),
                &["topic", "partition"],
            )
            .expect("valid metric"),
            processing_latency: histogram(
                "loopwarden_processing_latency_seconds",
                "From an event's poll to its batch being delivered, stored and committed.",
            ),
            produce_to_finding_latency: histogram(
                "loopwarden_produce_to_finding_latency_seconds",
                "From the Kafka timestamp of the event that fired a finding to the broker's acknowledgement of the finding (exactly_once: before its transaction commits).",
            ),
            commit_duration: histogram(
                "loopwarden_commit_duration_seconds",
                "Committing a batch: the offset commit, or the whole transaction in exactly_once mode.",
            ),
            flush_duration: histogram(
                "loopwarden_flush_duration_seconds",
                "Writing a batch's state and offsets to sled and fsyncing it.",
            ),
            delivery_duration: histogram(
                "loopwarden_delivery_duration_seconds",
                "Producing a batch's output records until every acknowledgement (at_least_once).",
            ),
            batch_stages: HistogramVec::new(
                HistogramOpts::new(
                    "loopwarden_batch_stage_seconds",
                    "A batch's time per stage: wait (first event polled to the batch closing), apply (events through the engines), deliver (waiting for the broker to acknowledge the batch before, whose records were in flight while this one was polled; exactly_once: the whole transaction), store (sled write and fsync), commit (offset commit).",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["stage"],
            )
            .expect("valid metric"),
            align_overruns: IntCounter::new(
                "loopwarden_align_overruns_total",
                "Times a partition's events went on without an input topic that still claimed unpolled events after 30 s.",
            )
            .expect("valid metric"),
            delivery_retries: IntCounter::new(
                "loopwarden_delivery_retries_total",
                "Output records whose delivery failed and was retried.",
            )
            .expect("valid metric"),
            batches: IntCounter::new("loopwarden_batches_total", "Batches finished.")
                .expect("valid metric"),
            restored_records: IntCounter::new(
                "loopwarden_restored_records_total",
                "Session records applied from the changelog while restoring partitions.",
            )
            .expect("valid metric"),
            restore_duration: histogram(
                "loopwarden_restore_duration_seconds",
                "Restoring one partition's state from the changelog.",
            ),
            partitions_assigned: IntGauge::new(
                "loopwarden_partitions_assigned",
                "Input partition numbers currently assigned to this process.",
            )
            .expect("valid metric"),
            spans_dropped: IntCounter::new(
                "loopwarden_spans_dropped_total",
                "Spans dropped because the exporter's queue was full or its collector unreachable.",
            )
            .expect("valid metric"),
            otlp_spans: counter_vec(
                "loopwarden_otlp_spans_total",
                "Spans read by the OTLP ingest, by outcome: llm_call, tool_call, agent (names and depth for its descendants), or why they gave no event (no_tool_name, not_agent_step, invalid_ids).",
                &["outcome"],
            ),
            otlp_uncaptured: counter_vec(
                "loopwarden_otlp_uncaptured_spans_total",
                "Steps the OTLP ingest mapped without what the detectors read, by service (service.name; beyond 100 services: (other)) and what was missing: token_usage (counted as 0 tokens) or content (the output, or a tool call's arguments or result).",
                &["service", "missing"],
            ),
            uncaptured_services: Mutex::new(HashSet::new()),
            otlp_events_published: IntCounter::new(
                "loopwarden_otlp_events_published_total",
                "Events the OTLP ingest published, keyed by session, onto the input topic (dead letters not counted).",
            )
            .expect("valid metric"),
        };
        let r = &m.registry;
        let all: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(m.events_consumed.clone()),
            Box::new(m.events_skipped.clone()),
            Box::new(m.late_events.clone()),
            Box::new(m.align_overruns.clone()),
            Box::new(m.bad_events.clone()),
            Box::new(m.events_miskeyed.clone()),
            Box::new(m.findings.clone()),
            Box::new(m.findings_by_owner.clone()),
            Box::new(m.shadow_findings.clone()),
            Box::new(m.terminations.clone()),
            Box::new(m.sessions_closed.clone()),
            Box::new(m.shadow_stops.clone()),
            Box::new(m.sessions_open.clone()),
            Box::new(m.state_store_bytes.clone()),
            Box::new(m.consumer_lag.clone()),
            Box::new(m.processing_latency.clone()),
            Box::new(m.produce_to_finding_latency.clone()),
            Box::new(m.commit_duration.clone()),
            Box::new(m.flush_duration.clone()),
            Box::new(m.delivery_duration.clone()),
            Box::new(m.batch_stages.clone()),
            Box::new(m.delivery_retries.clone()),
            Box::new(m.batches.clone()),
            Box::new(m.restored_records.clone()),
            Box::new(m.restore_duration.clone()),
            Box::new(m.partitions_assigned.clone()),
            Box::new(m.spans_dropped.clone()),
            Box::new(m.otlp_spans.clone()),
            Box::new(m.otlp_uncaptured.clone()),
            Box::new(m.otlp_events_published.clone()),
        ];
        for c in all {
            r.register(c).expect("metric names are unique");
        }
        m
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
        assert_eq!(names.len(), 19, "{names:?}");
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

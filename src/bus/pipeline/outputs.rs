//! What the engine's outputs become on the bus: each finding or summary counted in the
//! metrics, given its span (a child of the triggering message's trace), and turned into
//! a record for its topic. Shadow findings are counted and logged, never published.

use crate::bus::kafka::headers::{self, RawHeaders};
use rdkafka::Message;
use tracing::{debug, info};

use super::outbox::{Record, Sink};
use super::RunStats;
use crate::contract::output::Output;
use crate::telemetry::spans::{TraceParent, TRACEPARENT};
use crate::telemetry::Telemetry;

/// Where an output came from: the triggering message's Kafka timestamp (latency metric)
/// and its W3C `traceparent` (the parent of the output's span).
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub timestamp_ms: Option<i64>,
    pub traceparent: Option<TraceParent>,
    /// The message (partition, offset) whose headers are not read yet:
    /// [`Source::read_from`] reads them once the event has outputs, or once it is held
    /// past its message. Most events have none, and reading a consumed message's headers
    /// makes librdkafka allocate and free a parse buffer even for a message without any,
    /// and a list and each header for one with them (7 % of a worker's time at a million
    /// open sessions).
    unread: Option<(i32, i64)>,
}

impl Source {
    /// The source of outputs triggered by message `m` (Kafka timestamp
    /// `timestamp_ms`), its headers left unread for [`Source::read_from`] while the
    /// message is at hand.
    pub fn deferred<M: Message>(m: &M, timestamp_ms: Option<i64>) -> Source {
        Source {
            timestamp_ms,
            traceparent: None,
            unread: Some((m.partition(), m.offset())),
        }
    }

    pub fn is_unread(&self) -> bool {
        self.unread.is_some()
    }

    /// Reads the `traceparent` of `m` if this source waits for that message's headers
    /// (a source made for another message is left as it is).
    pub fn read_from<M: Message>(&mut self, m: &M)
    where
        M::Headers: RawHeaders,
    {
        if self.unread == Some((m.partition(), m.offset())) {
            self.unread = None;
            self.traceparent = traceparent_of(m);
        }
    }
}

/// A message's well-formed `traceparent` header (its first, the name's case ignored), if
/// it has one.
fn traceparent_of<M: Message>(m: &M) -> Option<TraceParent>
where
    M::Headers: RawHeaders,
{
    let (_, value) = headers::each(m.headers()?)
        .find(|(name, _)| name.eq_ignore_ascii_case(TRACEPARENT.as_bytes()))?;
    TraceParent::parse(value?)
}

/// The record `output` is published as (`None` for a shadow finding), counting it.
pub fn record(
    output: &Output,
    source: &Source,
    stats: &mut RunStats,
    telemetry: &Telemetry,
) -> Option<Record> {
    let sink = count(output, stats, telemetry)?;
    // The output's span is a child of the triggering message's trace; its message
    // carries the span's context (or the input's, without spans).
    let parent = source.traceparent.as_ref();
    let traceparent = match (telemetry.spans.as_ref(), output) {
        (Some(spans), Output::Finding(f)) => Some(spans.finding(f, parent)),
        (Some(spans), Output::Summary(s)) => Some(spans.session(s, parent)),
        (None, _) => parent.map(|tp| tp.as_str().to_string()),
    };
    Some(Record {
        sink,
        partition: None,
        key: output.session_id().as_bytes().to_vec(),
        payload: output.to_json().into_bytes().into(),
        headers: traceparent
            .map(|tp| vec![(TRACEPARENT, tp.into_bytes().into())])
            .unwrap_or_default(),
        source_headers: Vec::new(),
        // Findings only: the produce → finding latency.
        source_ms: source.timestamp_ms.filter(|_| sink != Sink::Summary),
    })
}

/// Counts `output` in the stats and metrics; its topic, or `None` when it stays local.
fn count(output: &Output, stats: &mut RunStats, telemetry: &Telemetry) -> Option<Sink> {
    let metrics = &telemetry.metrics;
    match output {
        Output::Finding(f) if !output.is_published() => {
            metrics
                .shadow_findings
                .with_label_values(&[f.detector.name(), f.level.name()])
                .inc();
            debug!(session = %f.session_id, detector = f.detector.name(), "shadow finding");
            None
        }
        Output::Finding(f) => {
            metrics
                .findings
                .with_label_values(&[f.detector.name(), f.level.name(), f.mode.name()])
                .inc();
            metrics.finding_by_owner(f.tenant.as_deref(), f.agent_id.as_deref(), f.level.name());
            if let Some(reason) = f.stop_reason {
                stats.terminations += 1;
                metrics
                    .terminations
                    .with_label_values(&[reason.name()])
                    .inc();
                info!(session = %f.session_id, detector = f.detector.name(), mode = ?f.mode, "session terminated");
                Some(Sink::Terminated)
            } else {
                stats.warnings += 1;
                Some(Sink::Warning)
            }
        }
        Output::Summary(s) => {
            stats.summaries += 1;
            let outcome = s.outcome.map_or("unknown", |o| o.name());
            metrics
                .sessions_closed
                .with_label_values(&[s.closed_by.name(), &s.stop_reason, outcome])
                .inc();
            if let Some(detector) = s.shadow_stop_reason {
                metrics
                    .shadow_stops
                    .with_label_values(&[detector.name(), outcome])
                    .inc();
            }
            Some(Sink::Summary)
        }
    }
}

//! The OTLP ingest on the bus (`[ingest.otlp]`): a consumer group of its own reads the
//! trace topics, maps each export to events ([`crate::contract::otlp`]) and publishes them keyed by
//! `session_id` onto an input topic, so that a session's events reach the instance that
//! owns it (a repartition, as Kafka Streams does before a keyed step).
//!
//! Per batch, in this order: map every polled message (a message that is not a trace
//! export, or a span whose event the engine would refuse, is dead-lettered with its
//! reason) → deliver the events and dead letters until
//! each is acknowledged → commit the trace topics' offsets. At least once: a crash before
//! the commit maps and publishes the batch again, with the same `event_id`s (span ids),
//! which the engine drops as exact duplicates. In `exactly_once` mode the events, the dead
//! letters and the offsets are one transaction, and the engine's `read_committed`
//! consumer sees each event once; a transaction fenced by a rebalance is dropped and its
//! messages read again from the committed offsets. Each event carries its span's `traceparent` header, so
//! loopwarden's spans for it land in the agent's trace.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use tracing::{error, info, warn};

use super::backoff::{Backoff, DeadlinePassed};
use super::bus::seek_to_committed;
use super::commit::Commit;
use super::outbox::{dead_letter, Outbox, Record, Sink};
use super::PipelineError;
use crate::bus::ingest::OtlpIngest;
use crate::bus::kafka::settings::KafkaSettings;
use crate::bus::kafka::{consumer_config, producer_config, ClientErrorsLogged};
use crate::config::Config;
use crate::contract::event::{parse_event, ParseLimits, MAX_SESSION_ID_BYTES};
use crate::contract::otlp::{decode, MapReport, MappedEvent, Mapper, Missing, Skipped};
use crate::shutdown::Shutdown;
use crate::telemetry::Telemetry;

/// What the ingest did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestStats {
    pub messages: u64,
    pub events: u64,
    pub dead_lettered: u64,
    pub spans: MapReport,
}

/// The settings of the ingest's own clients: its group, its topics, and (for
/// `exactly_once`) a transactional id of its own.
fn ingest_settings(kafka: &KafkaSettings, ingest: &OtlpIngest) -> KafkaSettings {
    let mut s = kafka.clone();
    s.group_id = ingest.group_id.clone();
    s.input_topics = ingest.topics.clone();
    s.workers = 1;
    s
}

/// Runs the ingest until `shutdown`: then it finishes the batch in hand (deliver, commit)
/// and returns. An error, at its start as later, stops the process (`shutdown`): the
/// workers beside it would otherwise run on, healthy and ready, with nothing to read.
pub fn run_ingest(
    config: Arc<Config>,
    ingest: OtlpIngest,
    brokers: &str,
    shutdown: Shutdown,
    telemetry: Arc<Telemetry>,
) -> Result<IngestStats, PipelineError> {
    let result = ingest_until_stopped(config, ingest, brokers, &shutdown, telemetry);
    if let Err(e) = &result {
        error!(error = %e, "otlp ingest failed; stopping");
        shutdown.trigger();
    }
    result
}

fn ingest_until_stopped(
    config: Arc<Config>,
    ingest: OtlpIngest,
    brokers: &str,
    shutdown: &Shutdown,
    telemetry: Arc<Telemetry>,
) -> Result<IngestStats, PipelineError> {
    let settings = ingest_settings(&config.kafka, &ingest);
    let commit = Commit::of(&settings, &config.state_path, 0);
    // Mapped events can be larger than the trace exports they came from only by their
    // JSON framing; leave room for the largest event the engine accepts.
    let mut producer = producer_config(&settings, brokers, config.limits.max_event_bytes);
    if let Some(id) = commit.transactional_id() {
        producer.set("transactional.id", id);
    }
    let mut outbox = Outbox::new(&producer, &settings, telemetry.clone(), shutdown)
        .map_err(PipelineError::Client)?
        .publishing_to(&ingest.to_topic);
    let consumer: BaseConsumer<ClientErrorsLogged> = consumer_config(&settings, brokers, 0)
        .create_with_context(ClientErrorsLogged("otlp ingest consumer"))
        .map_err(PipelineError::Client)?;
    if let Some(transaction) = commit.transaction() {
        if !transaction.init(&outbox, &mut Backoff::new(&settings, shutdown))? {
            return Ok(IngestStats::default());
        }
    }
    let topics: Vec<&str> = ingest.topics.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .map_err(|source| PipelineError::Subscribe {
            topics: topics.join(", "),
            source,
        })?;
    info!(brokers, group = %ingest.group_id, topics = ?topics, encoding = ingest.encoding.name(), to_topic = %ingest.to_topic, "ingesting otlp traces");
    let mut batch = IngestBatch {
        mapper: OtlpIngest::mapper(config.otlp_session_attribute.as_deref(), &config.limits),
        limits: config.limits,
        ingest: &ingest,
        settings: &settings,
        telemetry: &telemetry,
        stats: IngestStats::default(),
        mapped: Vec::new(),
        batch_events: 0,
        offsets: TopicPartitionList::new(),
        told_uncaptured: HashSet::new(),
    };
    let result = batch.consume(&consumer, &mut outbox, &commit, shutdown);
    let stats = batch.stats;
    match &result {
        Ok(()) => info!(?stats, "otlp ingest stopped"),
        Err(_) => warn!(?stats, "otlp ingest stopped with an error"),
    }
    result.map(|()| stats)
}

/// The batch in hand and what the ingest has done.
struct IngestBatch<'a> {
    mapper: Mapper,
    limits: ParseLimits,
    ingest: &'a OtlpIngest,
    settings: &'a KafkaSettings,
    telemetry: &'a Telemetry,
    stats: IngestStats,
    mapped: Vec<MappedEvent>,
    /// The events (not dead letters) of the batch in hand.
    batch_events: u64,
    /// The next offset to read per trace partition, once the batch is delivered.
    offsets: TopicPartitionList,
    /// (service, scope, what) whose missing capture was logged: once each.
    told_uncaptured: HashSet<(String, String, Missing)>,
}

/// At most this many (service, scope, what) are logged as missing capture.
const UNCAPTURED_LOGGED_MAX: usize = 1000;

impl IngestBatch<'_> {
    /// Batches of up to `max_batch_events` messages, closed after `max_batch_wait`.
    fn consume(
        &mut self,
        consumer: &BaseConsumer<ClientErrorsLogged>,
        outbox: &mut Outbox,
        commit: &Commit,
        shutdown: &Shutdown,
    ) -> Result<(), PipelineError> {
        while !shutdown.is_triggered() {
            let mut started: Option<Instant> = None;
            let mut in_batch = 0usize;
            loop {
                // At most 100 ms at a time: a stop is seen within it.
                let idle_poll = Duration::from_millis(100);
                let timeout = match started {
                    None => idle_poll,
                    Some(t) => match self.settings.max_batch_wait.checked_sub(t.elapsed()) {
                        Some(left) if !left.is_zero() => left.min(idle_poll),
                        _ => break,
                    },
                };
                match consumer.poll(timeout) {
                    Some(Ok(m)) => {
                        self.take(&m, outbox);
                        in_batch += 1;
                        started.get_or_insert_with(Instant::now);
                        if in_batch >= self.settings.max_batch_events {
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        warn!(error = %e, "otlp ingest consumer error");
                        if in_batch > 0 {
                            break;
                        }
                    }
                    None if shutdown.is_triggered() => break,
                    // An open batch's time is checked at the top.
                    None => {}
                }
            }
            self.finish(consumer, outbox, commit, shutdown)?;
        }
        Ok(())
    }

    /// Maps one message into the outbox (or dead-letters it).
    fn take(&mut self, m: &BorrowedMessage<'_>, outbox: &mut Outbox) {
        self.stats.messages += 1;
        let next = Offset::Offset(m.offset() + 1);
        let _ = self
            .offsets
            .add_partition_offset(m.topic(), m.partition(), next);
        let request = match decode(m.payload().unwrap_or_default(), self.ingest.encoding) {
            Ok(r) => r,
            Err(e) => {
                warn!(topic = m.topic(), partition = m.partition(), offset = m.offset(), error = %e, "dead-lettering a message that is not a trace export");
                let letter = dead_letter(m, m.topic(), e.reason(), &e.to_string());
                self.dead_letter(outbox, letter, e.reason());
                return;
            }
        };
        self.mapped.clear();
        let report = self.mapper.map(&request, &mut self.mapped);
        count_spans(self.telemetry, &report);
        for u in &report.uncaptured {
            let key = (u.service.clone(), u.scope.clone(), u.missing);
            if self.told_uncaptured.len() < UNCAPTURED_LOGGED_MAX
                && self.told_uncaptured.insert(key)
            {
                warn!(
                    service = %u.service,
                    scope = %u.scope,
                    missing = u.missing.name(),
                    setting = u.setting(),
                    "steps mapped without what the detectors read; turn capture on"
                );
            }
        }
        self.stats.spans.add(&report);
        let mut mapped = std::mem::take(&mut self.mapped);
        for e in mapped.drain(..) {
            // What no mapping can mend (an oversized event, a session id over the
            // contract's limit) is refused here, where the span can still be named,
            // rather than by the engine or by the broker.
            if let Err(bad) = parse_event(&e.json, &self.limits) {
                let span_id = e.traceparent.split('-').nth(2).unwrap_or_default();
                let what = format!(
                    "span {span_id} of this export maps to an event the engine refuses: {bad}"
                );
                warn!(topic = m.topic(), partition = m.partition(), offset = m.offset(), error = %what, "dead-lettering a span");
                let mut letter = dead_letter(m, m.topic(), bad.reason(), &what);
                letter.key = e.session_id.as_bytes()
                    [..e.session_id.len().min(MAX_SESSION_ID_BYTES)]
                    .to_vec();
                let mut json = e.json;
                json.truncate(self.limits.max_event_bytes);
                letter.payload = json.into();
                self.dead_letter(outbox, letter, bad.reason());
                continue;
            }
            self.stats.events += 1;
            self.batch_events += 1;
            outbox.push(Record {
                sink: Sink::Ingested,
                partition: None,
                key: e.session_id.into_bytes(),
                payload: e.json.into(),
                headers: vec![("traceparent", e.traceparent.into_bytes().into())],
                source_headers: Vec::new(),
                source_ms: None,
            });
        }
        self.mapped = mapped;
    }

    fn dead_letter(&mut self, outbox: &mut Outbox, letter: Record, reason: &str) {
        self.stats.dead_lettered += 1;
        self.telemetry
            .metrics
            .bad_events
            .with_label_values(&[reason])
            .inc();
        outbox.push(letter);
    }

    /// Delivers the batch's records, then commits its offsets (or does both in one
    /// transaction).
    fn finish(
        &mut self,
        consumer: &BaseConsumer<ClientErrorsLogged>,
        outbox: &mut Outbox,
        commit: &Commit,
        shutdown: &Shutdown,
    ) -> Result<(), PipelineError> {
        if self.offsets.count() == 0 {
            return Ok(());
        }
        let records = outbox.len();
        let mut backoff = Backoff::new(self.settings, shutdown);
        match commit.transaction() {
            None => {
                outbox
                    .deliver(&mut backoff)
                    .map_err(|DeadlinePassed| PipelineError::deadline(&backoff, outbox.len()))?;
                // Synchronous at a stop (nothing may be left uncommitted), else in the
                // background: a lost commit only means the batch is mapped again.
                let mode = if shutdown.is_triggered() {
                    CommitMode::Sync
                } else {
                    CommitMode::Async
                };
                if let Err(e) = consumer.commit(&self.offsets, mode) {
                    warn!(error = %e, "otlp ingest offset commit failed; the batch will be ingested again");
                }
            }
            Some(transaction) => {
                if !transaction.commit(outbox, consumer, &self.offsets, &mut backoff)? {
                    warn!(records, "otlp ingest batch dropped: the group moved on; reading it again from the committed offsets");
                    outbox.clear();
                    seek_to_committed(consumer, &[], &mut backoff)?;
                    self.offsets = TopicPartitionList::new();
                    self.batch_events = 0;
                    return Ok(());
                }
            }
        }
        self.telemetry
            .metrics
            .otlp_events_published
            .inc_by(self.batch_events);
        self.batch_events = 0;
        self.offsets = TopicPartitionList::new();
        Ok(())
    }
}

fn count_spans(telemetry: &Telemetry, report: &MapReport) {
    for u in &report.uncaptured {
        telemetry
            .metrics
            .uncaptured_spans(&u.service, u.missing.name(), u.spans);
    }
    let m = &telemetry.metrics.otlp_spans;
    m.with_label_values(&["llm_call"]).inc_by(report.llm_calls);
    m.with_label_values(&["tool_call"])
        .inc_by(report.tool_calls);
    m.with_label_values(&["agent"]).inc_by(report.agents);
    for why in Skipped::ALL {
        let n = report.skipped(why);
        if n > 0 {
            m.with_label_values(&[why.name()]).inc_by(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::otlp::Encoding;

    #[test]
    fn an_ingest_that_cannot_start_stops_the_process() {
        // Its producer refused at creation (a CA file that is not there, which only the
        // client's creation reads): an error before it consumes anything.
        let toml = "[kafka.producer]\n\"security.protocol\" = \"ssl\"\n\"ssl.ca.location\" = \"/nonexistent/ca.pem\"\n";
        let config = Arc::new(Config::from_toml_str(toml, "t", std::iter::empty()).unwrap());
        let ingest = OtlpIngest {
            topics: vec!["agent-traces".into()],
            encoding: Encoding::OtlpProto,
            to_topic: "tool.called".into(),
            group_id: "ingest".into(),
        };
        let shutdown = Shutdown::new();
        let telemetry = Arc::new(Telemetry::new());
        let result = run_ingest(config, ingest, "127.0.0.1:1", shutdown.clone(), telemetry);
        assert!(
            matches!(result, Err(PipelineError::Client(_))),
            "{result:?}"
        );
        assert!(shutdown.is_triggered(), "the workers beside it stop too");
    }
}

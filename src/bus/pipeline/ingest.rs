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
//!
//! An offset commit the group's coordinator refuses (as it does while the group
//! rebalances) is sent again, at most once a second, while the partition stays assigned
//! and no later offset of it has been sent, and every partition's last offset is committed
//! synchronously at a stop: a trace partition quiet after the refusal would otherwise keep
//! the group's offset behind, and a restart would map spans again long after their
//! sessions closed, which their events would open again. A partition a rebalance moves
//! is forgotten (its next owner commits it; an old offset sent once it came back would
//! move the group's offset back), and a revoked one's offset in the batch in hand is
//! dropped from its commit (what it read after being given it back is kept).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use tracing::{debug, error, info, warn};

use super::backoff::Backoff;
use super::bus::{
    failed_commits, offsets_list, seek_to_committed, CommitFailures, FailedCommit, Input,
    OwedCommits,
};
use super::commit::Commit;
use super::outbox::{dead_letter, Outbox, Record, Sink};
use super::{lock, PipelineError};
use crate::bus::ingest::OtlpIngest;
use crate::bus::kafka::settings::KafkaSettings;
use crate::bus::kafka::{consumer_config, log_client_error, producer_config};
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
    let consumer: BaseConsumer<IngestContext> = consumer_config(&settings, brokers, 0)
        .create_with_context(IngestContext::default())
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
        commits_sent: OwedCommits::default(),
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
    /// The last offset sent to be committed per trace partition assigned, and which a
    /// refusal left owed.
    commits_sent: OwedCommits<(String, i32)>,
    /// (service, scope, what) whose missing capture was logged: once each.
    told_uncaptured: HashSet<(String, String, Missing)>,
}

/// At most this many (service, scope, what) are logged as missing capture.
const UNCAPTURED_LOGGED_MAX: usize = 1000;

/// The ingest consumer's context: client errors logged as the other clients' are, the
/// offset commits that failed kept to be sent again (an asynchronous commit's answer comes
/// back inside a poll), and the partitions rebalances moved (both run inside a poll, on
/// the ingest's thread).
#[derive(Default)]
struct IngestContext {
    failed: Mutex<Vec<FailedCommit>>,
    moved: Mutex<Moved>,
}

/// Partitions rebalances took from this member or gave it since they were last read.
#[derive(Default)]
struct Moved {
    revoked: Vec<(String, i32)>,
    assigned: Vec<(String, i32)>,
}

impl ClientContext for IngestContext {
    fn error(&self, error: KafkaError, reason: &str) {
        log_client_error("otlp ingest consumer", &error, reason);
    }
}

impl ConsumerContext for IngestContext {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let named = |tpl: &TopicPartitionList| -> Vec<(String, i32)> {
            let elements = tpl.elements();
            elements
                .iter()
                .map(|e| (e.topic().to_string(), e.partition()))
                .collect()
        };
        let mut moved = lock(&self.moved);
        match rebalance {
            Rebalance::Revoke(tpl) => moved.revoked.extend(named(tpl)),
            Rebalance::Assign(tpl) => moved.assigned.extend(named(tpl)),
            Rebalance::Error(_) => {}
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        lock(&self.failed).extend(failed_commits(&result, offsets));
    }
}

impl CommitFailures for IngestContext {
    fn take_failed_commits(&self) -> Vec<FailedCommit> {
        std::mem::take(&mut *lock(&self.failed))
    }
}

impl IngestBatch<'_> {
    /// Batches of up to `max_batch_events` messages, closed after `max_batch_wait`.
    fn consume(
        &mut self,
        consumer: &BaseConsumer<IngestContext>,
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
                let polled = consumer.poll(timeout);
                self.follow_rebalances(consumer);
                self.send_owed_commits(consumer);
                match polled {
                    Some(Ok(m)) => {
                        self.take(&m, outbox);
                        in_batch += 1;
                        started.get_or_insert_with(Instant::now);
                        if in_batch >= self.settings.max_batch_events {
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        let failed =
                            PipelineError::consumer_failed(consumer.client(), &e, self.settings, 0);
                        if let Some(failed) = failed {
                            // The batch in hand is not delivered (the outbox holds it
                            // until `finish`), nor committed: librdkafka refuses every
                            // commit once its client failed fatally. Its partitions are
                            // read again from the committed offsets by their next owner.
                            return Err(failed);
                        }
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
            if let Err(e) = self.finish(consumer, outbox, commit, shutdown) {
                // What earlier batches delivered is committed all the same.
                self.commit_last_offsets(consumer);
                return Err(e);
            }
        }
        self.commit_last_offsets(consumer);
        Ok(())
    }

    /// Maps one message into the outbox (or dead-letters it).
    fn take(&mut self, m: &BorrowedMessage<'_>, outbox: &mut Outbox) {
        self.stats.messages += 1;
        let next = Offset::Offset(m.offset() + 1);
        // One element a partition: rdkafka's `add_partition_offset` appends another each
        // call (an element with no offset, the first one's set), which grew the list by
        // one a message, and copying it element by element took the last, empty one.
        let set = self
            .offsets
            .set_partition_offset(m.topic(), m.partition(), next);
        if set.is_err() {
            let _ = self
                .offsets
                .add_partition_offset(m.topic(), m.partition(), next);
        }
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
        consumer: &BaseConsumer<IngestContext>,
        outbox: &mut Outbox,
        commit: &Commit,
        shutdown: &Shutdown,
    ) -> Result<(), PipelineError> {
        self.follow_rebalances(consumer);
        if self.offsets.count() == 0 {
            return Ok(());
        }
        let records = outbox.len();
        let mut backoff = Backoff::new(self.settings, shutdown);
        match commit.transaction() {
            None => {
                outbox
                    .deliver(&mut backoff)
                    .map_err(|why| PipelineError::undelivered(why, &backoff, outbox.len()))?;
                // Synchronous at a stop (nothing may be left uncommitted), else in the
                // background: a lost commit only means the batch is mapped again.
                let mode = if shutdown.is_triggered() {
                    CommitMode::Sync
                } else {
                    CommitMode::Async
                };
                let result = Input::commit(consumer, &self.offsets, mode);
                note_commits_sent(&mut self.commits_sent, &self.offsets, result.is_err());
                if let Err(e) = result {
                    warn!(error = %e, "otlp ingest offset commit failed; the batch will be ingested again unless a later commit of its partitions goes through");
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

/// Keeps `offsets` in `sent` as the last sent of their partitions, owed when `failed` (a
/// synchronous commit refused at once).
fn note_commits_sent(
    sent: &mut OwedCommits<(String, i32)>,
    offsets: &TopicPartitionList,
    failed: bool,
) {
    for e in offsets.elements() {
        if let Offset::Offset(offset) = e.offset() {
            sent.note_sent((e.topic().to_string(), e.partition()), offset, failed);
        }
    }
}

impl IngestBatch<'_> {
    /// Forgets the partitions rebalances moved since the last call (their offsets are
    /// their next owner's to commit, or, given back, start again from the group's), and
    /// drops a revoked one's offset from the batch in hand. Rebalances run inside a poll
    /// before the message it returns, so what the batch takes after this is of the
    /// assignment as it is now.
    fn follow_rebalances(&mut self, consumer: &BaseConsumer<IngestContext>) {
        let moved = std::mem::take(&mut *lock(&consumer.context().moved));
        if moved.assigned.is_empty() && moved.revoked.is_empty() {
            return;
        }
        let assigned: HashSet<(String, i32)> = moved.assigned.into_iter().collect();
        let revoked: HashSet<(String, i32)> = moved.revoked.into_iter().collect();
        self.commits_sent
            .retain(|key| !assigned.contains(key) && !revoked.contains(key));
        if revoked.is_empty() {
            return;
        }
        let mut kept = TopicPartitionList::new();
        for e in self.offsets.elements() {
            if !revoked.contains(&(e.topic().to_string(), e.partition())) {
                let _ = kept.add_partition_offset(e.topic(), e.partition(), e.offset());
            }
        }
        self.offsets = kept;
    }

    /// Sends again the offsets whose commit was refused, at most once every
    /// [`OWED_COMMIT_RETRY`](super::bus::OWED_COMMIT_RETRY), for the partitions still
    /// assigned.
    fn send_owed_commits(&mut self, consumer: &BaseConsumer<IngestContext>) {
        for failed in consumer.take_failed_commits() {
            let key = (failed.topic.clone(), failed.partition);
            self.commits_sent.note_failed(Some(key), &failed);
        }
        if !self.commits_sent.due(false) {
            return;
        }
        let assignment = consumer.assignment().ok();
        let (again, error) = self
            .commits_sent
            .take_owed(|key| assigned(&assignment, key));
        if again.is_empty() {
            return;
        }
        let owed = offsets_of(&again);
        match error {
            None => debug!(
                partitions = owed.count(),
                "sending otlp ingest offsets whose commit failed again"
            ),
            Some(error) => {
                warn!(partitions = owed.count(), %error, "otlp ingest offset commit refused; sending the offsets again")
            }
        }
        let result = Input::commit(consumer, &owed, CommitMode::Async);
        note_commits_sent(&mut self.commits_sent, &owed, result.is_err());
    }

    /// At a stop: the last offset sent of every partition still assigned, committed and
    /// waited for, whether its commit was refused or its answer had not come yet (the
    /// consumer's close does not wait for it).
    fn commit_last_offsets(&mut self, consumer: &BaseConsumer<IngestContext>) {
        self.follow_rebalances(consumer);
        let assignment = consumer.assignment().ok();
        let last = offsets_of(
            &self
                .commits_sent
                .take_last(|key| assigned(&assignment, key)),
        );
        if last.count() == 0 {
            return;
        }
        if let Err(e) = Input::commit(consumer, &last, CommitMode::Sync) {
            warn!(error = %e, partitions = last.count(), "otlp ingest offsets not committed at the stop; their messages will be ingested again");
        }
    }
}

/// Whether `key`'s partition is in `assignment` (`None`: the client could not say, taken
/// as assigned).
fn assigned(assignment: &Option<TopicPartitionList>, (topic, partition): &(String, i32)) -> bool {
    assignment
        .as_ref()
        .is_none_or(|a| a.find_partition(topic, *partition).is_some())
}

/// `offsets`, keyed by (topic, partition), as a list to commit.
fn offsets_of(offsets: &[((String, i32), i64)]) -> TopicPartitionList {
    offsets_list(offsets.iter().map(|((t, p), o)| (t.as_str(), *p, *o)))
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

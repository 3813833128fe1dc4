//! `loopwarden run`: the engine on the bus (DESIGN §6). A consumer group reads the input
//! topics; each assigned partition number has its own [`Engine`] and its own sled tree;
//! findings and summaries go to the output topics, bad messages to the dead-letter topic.
//!
//! Guarantees (at-least-once end to end), per batch and in this order:
//! 1. apply: every polled message is applied to its partition's engine (or dead-lettered);
//! 2. deliver: every output record of the batch is produced and acknowledged — failures
//!    are retried with backoff, never dropped;
//! 3. store: each changed partition writes its session states and its applied offsets in
//!    one atomic sled batch, then the database is flushed to disk;
//! 4. commit: the consumer group's offsets are committed.
//!
//! A crash between any two steps loses nothing: events after the stored offset are
//! applied again (and re-emit findings with the same `event_id`), events at or below it
//! are skipped, so no session counts an event twice. A revoked partition is stored before
//! the revoke is acknowledged. Session expiry runs on a per-partition clock: the latest
//! event time, advanced by wall-clock time while the partition is idle.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use rustc_hash::FxHashMap;
use tracing::{debug, error, info, warn};

use crate::config::Config;
use crate::engine::{Engine, EventMeta};
use crate::event::{parse_event, Event};
use crate::kafka::settings::{Delivery, KafkaSettings};
use crate::kafka::{
    cached_high_watermark, check_topics, consumer_config, ensure_changelog, partition_counts,
    producer_config, transactional_id, TopicError,
};
use crate::output::Output;
use crate::shutdown::Shutdown;
use crate::store::{open_db, SledStore, StateStore, StoreBatch, StoreError, STATE_FORMAT};
use crate::telemetry::spans::{TraceParent, TRACEPARENT};
use crate::telemetry::Telemetry;

mod align;
use align::{Aligner, Held};

/// Header names put on dead-lettered messages (after the message's own headers).
pub const DLQ_SOURCE_TOPIC: &str = "loopwarden.source.topic";
pub const DLQ_SOURCE_PARTITION: &str = "loopwarden.source.partition";
pub const DLQ_SOURCE_OFFSET: &str = "loopwarden.source.offset";
/// The bad-input class (`oversized`, `invalid_json`, … see [`crate::event::BadEvent`]).
pub const DLQ_REASON: &str = "loopwarden.error.reason";
/// The precise error, with the JSON path or byte offset where it applies.
pub const DLQ_MESSAGE: &str = "loopwarden.error.message";
/// Set when the broker refused the whole message and only its first bytes were kept.
pub const DLQ_TRUNCATED_FROM: &str = "loopwarden.truncated_from_bytes";

/// Header of changelog records: `session` (key = session id, value = its state, or no
/// value when it closed) or `commit` (value = the batch's offsets as JSON): the records of
/// a batch count only once its commit record follows them.
pub const CHANGELOG_KIND: &str = "loopwarden.changelog";
const CHANGELOG_COMMIT_KEY: &[u8] = b"loopwarden/commit";
/// Header of changelog session records: the state format of their payload. Records of
/// another format (or none: format 1) are skipped on restore; those sessions start anew.
pub const CHANGELOG_STATE_FORMAT: &str = "loopwarden.state_format";
/// Store key of the last changelog offset the local state reflects.
const CHANGELOG_POSITION: &str = "changelog/position";

/// Bytes of an oversized dead letter kept when the broker refuses the whole message.
const DLQ_TRUNCATE_TO: usize = 64 * 1024;

/// Why `run` stopped with an error. Bad messages (poison) never get here: they are
/// dead-lettered; transient failures (broker away, disk write failing) are retried with
/// backoff where they happen; what escapes is fatal and ends the process non-zero.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("kafka client could not be created: {0}")]
    Client(#[source] KafkaError),
    #[error(transparent)]
    Topics(#[from] TopicError),
    #[error("cannot subscribe to {topics}: {source}")]
    Subscribe { topics: String, source: KafkaError },
    #[error("state store: {0}")]
    Store(#[from] StoreError),
    #[error("cannot restore partition {partition} from the changelog: {reason}")]
    Restore { partition: i32, reason: String },
    #[error("cannot start a worker thread: {0}")]
    Thread(std::io::Error),
    #[error("a worker thread panicked")]
    WorkerPanicked,
    #[error("kafka transaction failed fatally (is another instance using transactional.id {transactional_id}? set kafka.instance_id per instance): {source}")]
    Transaction {
        transactional_id: String,
        source: KafkaError,
    },
    #[error("shutdown deadline ({secs} s) passed with {undelivered} output record(s) undelivered; nothing was stored or committed for them, so a restart processes their events again")]
    DeadlineExceeded { secs: u64, undelivered: usize },
}

/// What a run did (also the demo's and the tests' view of it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    pub events: u64,
    /// Events at or below a partition's stored offset (already applied before a restart).
    pub skipped: u64,
    pub dead_lettered: u64,
    pub warnings: u64,
    pub terminations: u64,
    pub summaries: u64,
    pub batches: u64,
    /// Session records applied from the changelog, and the time restores took.
    pub restored_records: u64,
    pub restore_ms: u64,
}

impl std::ops::AddAssign for RunStats {
    fn add_assign(&mut self, o: RunStats) {
        self.events += o.events;
        self.skipped += o.skipped;
        self.dead_lettered += o.dead_lettered;
        self.warnings += o.warnings;
        self.terminations += o.terminations;
        self.summaries += o.summaries;
        self.batches += o.batches;
        self.restored_records += o.restored_records;
        self.restore_ms += o.restore_ms;
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Index of an output topic in [`KafkaSettings::output_topics`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sink {
    Warning = 0,
    Terminated = 1,
    Summary = 2,
    DeadLetter = 3,
    Changelog = 4,
}

/// One message to produce.
struct Record {
    sink: Sink,
    /// An explicit partition (changelog records go to their input partition's number).
    partition: Option<i32>,
    key: Vec<u8>,
    payload: Vec<u8>,
    headers: Vec<(&'static str, Vec<u8>)>,
    /// For dead letters: the source message's own headers, kept first.
    source_headers: Vec<(String, Option<Vec<u8>>)>,
    /// For findings: the Kafka timestamp of the event that fired it (latency metric).
    source_ms: Option<i64>,
}

impl Record {
    fn headers(&self) -> Option<OwnedHeaders> {
        if self.headers.is_empty() && self.source_headers.is_empty() {
            return None;
        }
        let mut h = OwnedHeaders::new_with_capacity(self.headers.len() + self.source_headers.len());
        for (k, v) in &self.source_headers {
            h = h.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        for (k, v) in &self.headers {
            h = h.insert(Header {
                key: k,
                value: Some(v.as_slice()),
            });
        }
        Some(h)
    }
}

/// Collects failed deliveries (the opaque is the record's index in the outbox).
#[derive(Default)]
pub struct DeliveryTracker {
    failed: Mutex<Vec<(usize, KafkaError)>>,
    changelog_topic: String,
    /// Highest acknowledged changelog offset per partition.
    changelog_offsets: Mutex<FxHashMap<i32, i64>>,
}

impl ClientContext for DeliveryTracker {
    fn error(&self, error: KafkaError, reason: &str) {
        warn!(client = "producer", %error, reason, "kafka client error");
    }
}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = Box<usize>;
    fn delivery(&self, result: &DeliveryResult<'_>, index: Box<usize>) {
        match result {
            Err((e, _)) => lock(&self.failed).push((*index, e.clone())),
            Ok(m) if m.topic() == self.changelog_topic => {
                let mut offsets = lock(&self.changelog_offsets);
                let o = offsets.entry(m.partition()).or_insert(m.offset());
                *o = (*o).max(m.offset());
            }
            Ok(_) => {}
        }
    }
}

/// A message's well-formed `traceparent` header, if it has one.
fn traceparent_of(m: &BorrowedMessage<'_>) -> Option<TraceParent> {
    let value = m
        .headers()?
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(TRACEPARENT))?
        .value?;
    TraceParent::parse(value)
}

/// The dead letter of a bad message: its key, payload and headers, and where it came
/// from and why it was refused.
fn dead_letter(m: &BorrowedMessage<'_>, topic: &str, bad: &crate::event::BadEvent) -> Record {
    let source_headers = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default();
    Record {
        sink: Sink::DeadLetter,
        partition: None,
        key: m.key().unwrap_or_default().to_vec(),
        payload: m.payload().unwrap_or_default().to_vec(),
        headers: vec![
            (DLQ_SOURCE_TOPIC, topic.as_bytes().to_vec()),
            (DLQ_SOURCE_PARTITION, m.partition().to_string().into_bytes()),
            (DLQ_SOURCE_OFFSET, m.offset().to_string().into_bytes()),
            (DLQ_REASON, bad.reason().as_bytes().to_vec()),
            (DLQ_MESSAGE, bad.to_string().into_bytes()),
        ],
        source_headers,
        source_ms: None,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where an output came from: the triggering message's Kafka timestamp (latency metric)
/// and its W3C `traceparent` (the parent of the output's span).
#[derive(Debug, Clone, Default)]
struct Source {
    timestamp_ms: Option<i64>,
    traceparent: Option<TraceParent>,
}

/// A polled message waiting for its turn: an event, or a dead letter (which keeps its
/// place so that the applied offsets stay a prefix of each topic).
// Nearly every item is an event: boxing it to shrink the rare dead letter's slot would
// cost an allocation per event.
#[allow(clippy::large_enum_variant)]
enum Pending {
    Event(Event<'static>, EventMeta, Source),
    DeadLetter(Record, &'static str),
}

/// One assigned partition number (partition *p* of every input topic).
struct Partition {
    engine: Engine,
    store: SledStore,
    /// Last applied offset per input topic.
    applied: BTreeMap<Arc<str>, i64>,
    /// Polled messages not applied yet, released across topics in event-time order.
    held: Aligner<Pending>,
    /// Whether state or offsets changed since the last store.
    dirty: bool,
    /// Wall time and engine clock at the last event, for the idle clock.
    last_event_wall: Instant,
    clock_at_last_event: Option<i64>,
}

/// Everything a batch touches; shared between the poll loop and the rebalance callback
/// (both run on the consumer's thread, so the lock is never contended).
struct Worker {
    config: Arc<Config>,
    db: sled::Db,
    producer: BaseProducer<DeliveryTracker>,
    partitions: BTreeMap<i32, Partition>,
    outbox: Vec<Record>,
    scratch: Vec<Output>,
    topics: FxHashMap<String, Arc<str>>,
    /// The input topics, in configuration order (the aligner's topic indexes).
    inputs: Vec<Arc<str>>,
    shutdown: Shutdown,
    stats: RunStats,
    /// A fatal error raised inside a rebalance callback, for the poll loop to return.
    fatal: Option<PipelineError>,
    /// Reads the changelog when a partition's state must be restored (made on first use).
    changelog_reader: Option<BaseConsumer>,
    brokers: String,
    /// Set in exactly_once mode: every batch is one transaction of this producer.
    transactional_id: Option<String>,
    telemetry: Arc<Telemetry>,
    /// For each output in `scratch`, the Kafka timestamp of the event that produced it.
    scratch_sources: Vec<Source>,
    /// When each event of the current batch was polled (processing latency).
    polled: Vec<Instant>,
    /// What this worker last added to the process-wide gauges.
    reported_sessions: i64,
    reported_partitions: i64,
    /// When the state directory's size was last measured.
    store_size_at: Option<Instant>,
    /// `events_consumed` per event type, resolved once (not a labelled lookup per event).
    consumed: FxHashMap<&'static str, prometheus::IntCounter>,
}

impl Worker {
    fn settings(&self) -> &KafkaSettings {
        &self.config.kafka
    }

    fn topic(&mut self, name: &str) -> Arc<str> {
        if let Some(t) = self.topics.get(name) {
            return t.clone();
        }
        let t: Arc<str> = Arc::from(name);
        self.topics.insert(name.to_string(), t.clone());
        t
    }

    /// Loads a newly assigned partition's sessions and offsets from sled.
    fn acquire(&mut self, partition: i32) -> Result<(), PipelineError> {
        if self.partitions.contains_key(&partition) {
            return Ok(());
        }
        let mut store = SledStore::partition(&self.db, partition)?;
        if self.settings().changelog {
            let telemetry = self.telemetry.clone();
            let _restoring = telemetry.readiness.restoring();
            self.restore_from_changelog(partition, &mut store)?;
        }
        let engine = Engine::restore(self.config.clone(), &store)?;
        let mut applied = BTreeMap::new();
        for topic in self.config.kafka.input_topics.clone() {
            if let Some(o) = StateStore::offset(&store, &format!("{topic}/{partition}"))? {
                applied.insert(self.topic(&topic), o);
            }
        }
        info!(
            partition,
            sessions = engine.open_sessions(),
            offsets = ?applied,
            "partition assigned"
        );
        let clock = engine.watermark();
        self.partitions.insert(
            partition,
            Partition {
                engine,
                store,
                applied,
                held: Aligner::new(self.inputs.len(), self.settings().align_wait),
                dirty: false,
                last_event_wall: Instant::now(),
                clock_at_last_event: clock,
            },
        );
        Ok(())
    }

    /// Brings a partition's local state up to the changelog's end: from the beginning
    /// when the disk holds nothing of it, else from the last changelog offset it
    /// reflects. Only whole batches are applied (records followed by their commit
    /// record); a trailing incomplete batch is left out, so its events are consumed
    /// again. In exactly_once mode a batch also counts only if the group's committed
    /// input offsets cover it: a broker that hands out records of aborted transactions
    /// (no `read_committed` filtering) cannot make the state run ahead of the offsets.
    /// Blocks until done: the partition is not consumed before.
    fn restore_from_changelog(
        &mut self,
        partition: i32,
        store: &mut SledStore,
    ) -> Result<(), PipelineError> {
        let topic = self.settings().changelog_topic.clone();
        if self.changelog_reader.is_none() {
            // The group's id, so that it can read the group's committed offsets; it only
            // ever assigns partitions itself, so it never joins the group or commits.
            let reader = crate::kafka::client_config(self.settings(), &self.brokers)
                .set("group.id", &self.settings().group_id)
                .set("enable.auto.commit", "false")
                .set("enable.auto.offset.store", "false")
                .set("isolation.level", "read_committed")
                // Says at once when the read reaches the end (see the loop below).
                .set("enable.partition.eof", "true")
                .create()
                .map_err(PipelineError::Client)?;
            self.changelog_reader = Some(reader);
        }
        let shut_down = || PipelineError::Restore {
            partition,
            reason: "shut down before the restore finished".into(),
        };
        let reader = self.changelog_reader.as_ref().expect("made above");
        let settings = &self.config.kafka;
        let mut backoff = settings.retry_backoff_min;
        let mut retry = |what: &str, error: &KafkaError| {
            warn!(topic = %topic, partition, error = %error, what, "changelog restore step failed; retrying");
            let stop = self.shutdown.sleep(backoff);
            backoff = (backoff * 2).min(settings.retry_backoff_max);
            stop
        };
        let (low, high) = loop {
            match reader.fetch_watermarks(&topic, partition, Duration::from_secs(10)) {
                Ok(w) => break w,
                Err(e) if retry("read the changelog's extent", &e) => return Err(shut_down()),
                Err(_) => {}
            }
        };
        let committed: Option<FxHashMap<String, i64>> = match settings.delivery {
            Delivery::AtLeastOnce => None,
            Delivery::ExactlyOnce => Some(loop {
                let mut tpl = TopicPartitionList::new();
                for t in &settings.input_topics {
                    tpl.add_partition(t, partition);
                }
                match reader.committed_offsets(tpl, Duration::from_secs(10)) {
                    Ok(tpl) => {
                        break tpl
                            .elements()
                            .iter()
                            .filter_map(|e| match e.offset() {
                                Offset::Offset(o) => {
                                    Some((format!("{}/{partition}", e.topic()), o))
                                }
                                _ => None,
                            })
                            .collect()
                    }
                    Err(e) if retry("read the group's committed offsets", &e) => {
                        return Err(shut_down())
                    }
                    Err(_) => {}
                }
            }),
        };
        let input_keys: Vec<String> = settings
            .input_topics
            .iter()
            .map(|t| format!("{t}/{partition}"))
            .collect();
        let local = store.offset(CHANGELOG_POSITION)?;
        let from = local.map_or(low, |l| (l + 1).max(low));
        if from >= high {
            return Ok(());
        }
        let started = Instant::now();
        info!(partition, from, to = high, local = ?local, "restoring partition state from the changelog");
        let mut tpl = TopicPartitionList::new();
        let _ = tpl.add_partition_offset(&topic, partition, Offset::Offset(from));
        reader.assign(&tpl).map_err(PipelineError::Client)?;
        let mut pending = StoreBatch::default();
        let (mut sessions, mut batches, mut uncommitted) = (0u64, 0u64, 0u64);
        let mut other_format = 0u64;
        let mut next = from;
        while next < high {
            match reader.poll(Duration::from_millis(500)) {
                Some(Ok(m)) => {
                    next = m.offset() + 1;
                    let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                    let header = |name: &str| {
                        m.headers()
                            .and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
                    };
                    let kind = header(CHANGELOG_KIND).unwrap_or_default();
                    let format = header(CHANGELOG_STATE_FORMAT).unwrap_or(b"1");
                    match kind {
                        b"commit" => {
                            let offsets: Vec<(String, i64)> = serde_json::from_slice(
                                m.payload().unwrap_or_default(),
                            )
                            .map_err(|e| PipelineError::Restore {
                                partition,
                                reason: format!("commit record at offset {}: {e}", m.offset()),
                            })?;
                            let covered = committed.as_ref().is_none_or(|c| {
                                offsets.iter().all(|(k, o)| {
                                    !input_keys.contains(k) || c.get(k).is_some_and(|next| o < next)
                                })
                            });
                            if !covered {
                                uncommitted += 1;
                                pending = StoreBatch::default();
                                continue;
                            }
                            pending.offsets.extend(offsets);
                            pending
                                .offsets
                                .push((CHANGELOG_POSITION.to_string(), m.offset()));
                            sessions += (pending.puts.len() + pending.deletes.len()) as u64;
                            batches += 1;
                            store.commit(std::mem::take(&mut pending))?;
                        }
                        b"session" => match m.payload() {
                            Some(_) if format != STATE_FORMAT.to_string().as_bytes() => {
                                other_format += 1;
                            }
                            Some(state) => pending.puts.push((key, state.to_vec())),
                            None => pending.deletes.push(key),
                        },
                        other => warn!(
                            partition,
                            offset = m.offset(),
                            kind = %String::from_utf8_lossy(other),
                            "skipping a changelog record of unknown kind"
                        ),
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) | None => {
                    if self.shutdown.is_triggered() {
                        return Err(shut_down());
                    }
                    // Transaction markers take offsets but are never handed out: the
                    // read position, not the last record, says how far the read got.
                    if let Ok(position) = reader.position() {
                        if let Some(Offset::Offset(o)) = position
                            .find_partition(&topic, partition)
                            .map(|e| e.offset())
                        {
                            next = next.max(o);
                        }
                    }
                }
                Some(Err(e)) => warn!(partition, error = %e, "changelog read error; retrying"),
            }
        }
        let _ = reader.unassign();
        self.db.flush().map_err(StoreError::Io)?;
        self.stats.restored_records += sessions;
        self.stats.restore_ms += started.elapsed().as_millis() as u64;
        let metrics = &self.telemetry.metrics;
        metrics.restored_records.inc_by(sessions);
        metrics
            .restore_duration
            .observe(started.elapsed().as_secs_f64());
        info!(
            partition,
            batches,
            session_records = sessions,
            left_out = pending.puts.len() + pending.deletes.len(),
            uncommitted_batches = uncommitted,
            ms = started.elapsed().as_millis() as u64,
            "partition state restored"
        );
        if other_format > 0 {
            warn!(
                partition,
                records = other_format,
                format = STATE_FORMAT,
                "skipped changelog session records of another state format (an upgrade): those sessions start anew"
            );
        }
        Ok(())
    }

    /// Takes one polled message: parsed, it waits in its partition's aligner (an event,
    /// or a dead letter for a bad one) until [`Worker::apply_ready`] applies it.
    fn handle(&mut self, m: &BorrowedMessage<'_>) -> Result<(), PipelineError> {
        let partition = m.partition();
        if !self.partitions.contains_key(&partition) {
            // Assignment callbacks always come first; this only guards against surprises.
            self.acquire(partition)?;
        }
        let Some(topic_index) = self.inputs.iter().position(|t| **t == *m.topic()) else {
            warn!(
                topic = m.topic(),
                partition, "skipping a message of a topic that is not an input"
            );
            return Ok(());
        };
        let topic = self.inputs[topic_index].clone();
        let offset = m.offset();
        let limits = self.config.limits;
        let p = self.partitions.get_mut(&partition).expect("acquired above");
        let seen = p.applied.get(&topic).is_some_and(|&last| offset <= last)
            || p.held
                .last_offset(topic_index)
                .is_some_and(|last| offset <= last);
        if seen {
            self.stats.skipped += 1;
            self.telemetry.metrics.events_skipped.inc();
            return Ok(());
        }
        let payload = m.payload().unwrap_or_default();
        let (time, pending) = match parse_event(payload, &limits) {
            Ok(event) => {
                let meta = EventMeta {
                    topic: Some(topic),
                    partition: Some(partition),
                    offset: Some(offset),
                    message_timestamp_ms: m.timestamp().to_millis(),
                    processing_time_ms: Some(now_ms()),
                };
                let event_ms = event
                    .timestamp_ms
                    .or(meta.message_timestamp_ms)
                    .unwrap_or(0);
                let source = Source {
                    timestamp_ms: meta.message_timestamp_ms,
                    traceparent: traceparent_of(m),
                };
                (
                    Some(event_ms),
                    Pending::Event(event.into_owned(), meta, source),
                )
            }
            Err(bad) => {
                warn!(topic = %topic, partition, offset, reason = bad.reason(), error = %bad, "dead-lettering bad message");
                (
                    None,
                    Pending::DeadLetter(dead_letter(m, &topic, &bad), bad.reason()),
                )
            }
        };
        p.held.push(
            topic_index,
            Held {
                time,
                offset,
                polled: Instant::now(),
                item: pending,
            },
        );
        Ok(())
    }

    /// Applies what the partitions' aligners release (events to their engines, dead
    /// letters to the outbox), advancing the applied offsets, and queues the outputs.
    fn apply_ready(&mut self) {
        let now = Instant::now();
        let metrics = &self.telemetry.metrics;
        for p in self.partitions.values_mut() {
            let late = p.engine.counters().late_events;
            let mut applied_any = false;
            while let Some((topic, held)) = p.held.pop_ready(now) {
                applied_any = true;
                p.applied.insert(self.inputs[topic].clone(), held.offset);
                self.polled.push(held.polled);
                match held.item {
                    Pending::Event(event, meta, source) => {
                        self.stats.events += 1;
                        let kind = event.body.type_name();
                        self.consumed
                            .entry(kind)
                            .or_insert_with(|| metrics.events_consumed.with_label_values(&[kind]))
                            .inc();
                        p.engine.process(&event, &meta, &mut self.scratch);
                        self.scratch_sources.resize(self.scratch.len(), source);
                    }
                    Pending::DeadLetter(record, reason) => {
                        self.stats.dead_lettered += 1;
                        metrics.bad_events.with_label_values(&[reason]).inc();
                        self.outbox.push(record);
                    }
                }
            }
            if !applied_any {
                continue;
            }
            p.dirty = true;
            metrics
                .late_events
                .inc_by(p.engine.counters().late_events - late);
            p.last_event_wall = Instant::now();
            p.clock_at_last_event = p.engine.watermark();
        }
        self.queue_outputs();
    }

    /// When the next held event that waits for another topic may go.
    fn next_due(&self) -> Option<Instant> {
        self.partitions
            .values()
            .filter_map(|p| p.held.next_due())
            .min()
    }

    /// Moves the engine outputs in `scratch` to the outbox (shadow findings stay local),
    /// counting them.
    fn queue_outputs(&mut self) {
        // Outputs of the idle clock have no triggering message.
        self.scratch_sources
            .resize(self.scratch.len(), Source::default());
        let metrics = &self.telemetry.metrics;
        let spans = self.telemetry.spans.as_ref();
        for (o, source) in self.scratch.drain(..).zip(self.scratch_sources.drain(..)) {
            let sink = match &o {
                Output::Finding(f) if !o.is_published() => {
                    metrics
                        .shadow_findings
                        .with_label_values(&[f.detector.name(), f.level.name()])
                        .inc();
                    debug!(session = %f.session_id, detector = f.detector.name(), "shadow finding");
                    continue;
                }
                Output::Finding(f) => {
                    metrics
                        .findings
                        .with_label_values(&[f.detector.name(), f.level.name(), f.mode.name()])
                        .inc();
                    metrics.finding_by_owner(
                        f.tenant.as_deref(),
                        f.agent_id.as_deref(),
                        f.level.name(),
                    );
                    if let Some(reason) = f.stop_reason {
                        self.stats.terminations += 1;
                        metrics
                            .terminations
                            .with_label_values(&[reason.name()])
                            .inc();
                        info!(session = %f.session_id, detector = f.detector.name(), mode = ?f.mode, "session terminated");
                        Sink::Terminated
                    } else {
                        self.stats.warnings += 1;
                        Sink::Warning
                    }
                }
                Output::Summary(s) => {
                    self.stats.summaries += 1;
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
                    Sink::Summary
                }
            };
            // The output's span is a child of the triggering message's trace; its
            // message carries the span's context (or the input's, without spans).
            let parent = source.traceparent.as_ref();
            let traceparent = match (spans, &o) {
                (Some(spans), Output::Finding(f)) => Some(spans.finding(f, parent)),
                (Some(spans), Output::Summary(s)) => Some(spans.session(s, parent)),
                (None, _) => parent.map(|tp| tp.as_str().to_string()),
            };
            let source_ms = if sink == Sink::Summary {
                None
            } else {
                source.timestamp_ms
            };
            self.outbox.push(Record {
                sink,
                partition: None,
                key: o.session_id().as_bytes().to_vec(),
                payload: o.to_json().into_bytes(),
                headers: traceparent
                    .map(|tp| vec![(TRACEPARENT, tp.into_bytes())])
                    .unwrap_or_default(),
                source_headers: Vec::new(),
                source_ms,
            });
        }
    }

    /// Applies what is ready, then advances the clock of partitions that have been idle
    /// (nothing applied or held), closing silent sessions.
    fn tick_idle(&mut self) {
        self.apply_ready();
        let idle_after = self.settings().idle_after;
        for p in self.partitions.values_mut() {
            if !p.held.is_empty() {
                continue;
            }
            let idle = p.last_event_wall.elapsed();
            let Some(clock) = p.clock_at_last_event else {
                continue;
            };
            if idle < idle_after {
                continue;
            }
            let before = self.scratch.len();
            p.engine.advance_clock(
                clock.saturating_add(idle.as_millis() as i64),
                &mut self.scratch,
            );
            if self.scratch.len() > before {
                p.dirty = true;
            }
        }
        self.queue_outputs();
    }

    /// Messages waiting on the broker behind what this worker applied, by the client's
    /// cached high watermarks (no request).
    /// Also sets the per-partition lag gauge.
    fn lag(&self, consumer: &BaseConsumer<RebalanceHandler>) -> i64 {
        let mut lag = 0;
        for (&partition, p) in &self.partitions {
            for (topic, applied) in &p.applied {
                if let Some(high) = cached_high_watermark(consumer.client(), topic, partition) {
                    let behind = (high - applied - 1).max(0);
                    lag += behind;
                    self.telemetry
                        .metrics
                        .consumer_lag
                        .with_label_values(&[&**topic, &partition.to_string()])
                        .set(behind);
                }
            }
        }
        lag
    }

    fn past_deadline(&self) -> bool {
        self.shutdown
            .triggered_at()
            .is_some_and(|t| t.elapsed() >= self.settings().shutdown_deadline)
    }

    /// Waits `d` (or until shutdown, after which the deadline governs).
    fn pause(&self, d: Duration) {
        if !self.shutdown.is_triggered() {
            self.shutdown.sleep(d);
        } else {
            std::thread::sleep(d.min(Duration::from_millis(100)));
        }
    }

    /// Hands the outbox records at `indexes` to the producer (waiting while its queue is
    /// full); a record it refuses outright is recorded as failed, like a failed delivery.
    fn send(&mut self, indexes: &[usize]) {
        let mut topics: Vec<&str> = self.config.kafka.output_topics().to_vec();
        topics.push(&self.config.kafka.changelog_topic);
        for &i in indexes {
            let r = &self.outbox[i];
            let mut record =
                BaseRecord::with_opaque_to(topics[r.sink as usize], Box::new(i)).key(&r.key);
            // A changelog tombstone has no value at all (compaction drops the key).
            if !(r.sink == Sink::Changelog && r.payload.is_empty()) {
                record = record.payload(&r.payload);
            }
            if let Some(p) = r.partition {
                record = record.partition(p);
            }
            if let Some(h) = r.headers() {
                record = record.headers(h);
            }
            loop {
                match self.producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        self.producer.poll(Duration::from_millis(5));
                        record = back;
                    }
                    Err((e, _)) => {
                        lock(&self.producer.context().failed).push((i, e));
                        break;
                    }
                }
            }
        }
    }

    /// Takes the failed deliveries; a dead letter the broker refused as too large is cut
    /// to its first bytes (with a header saying how long it was), so it is never lost.
    fn take_failed(&mut self) -> Vec<(usize, KafkaError)> {
        let failed = std::mem::take(&mut *lock(&self.producer.context().failed));
        for (i, e) in &failed {
            let r = &mut self.outbox[*i];
            let too_large = matches!(
                e.rdkafka_error_code(),
                Some(RDKafkaErrorCode::MessageSizeTooLarge)
            );
            if too_large && r.sink == Sink::DeadLetter && r.payload.len() > DLQ_TRUNCATE_TO {
                let len = r.payload.len();
                r.payload.truncate(DLQ_TRUNCATE_TO);
                r.headers
                    .push((DLQ_TRUNCATED_FROM, len.to_string().into_bytes()));
            }
        }
        failed
    }

    /// Produces the outbox and waits until the broker has acknowledged every record,
    /// retrying failures with backoff.
    fn deliver(&mut self) -> Result<(), PipelineError> {
        if self.outbox.is_empty() {
            return Ok(());
        }
        let mut pending: Vec<usize> = (0..self.outbox.len()).collect();
        let mut backoff = self.settings().retry_backoff_min;
        loop {
            self.send(&pending);
            while self.producer.in_flight_count() > 0 {
                self.producer.poll(Duration::from_millis(1));
                if self.past_deadline() {
                    return Err(self.deadline_exceeded());
                }
            }
            let failed = self.take_failed();
            if failed.is_empty() {
                self.outbox.clear();
                return Ok(());
            }
            self.telemetry
                .metrics
                .delivery_retries
                .inc_by(failed.len() as u64);
            let (_, first) = &failed[0];
            warn!(failed = failed.len(), error = %first, backoff_ms = backoff.as_millis() as u64, "output delivery failed; retrying");
            pending = failed.iter().map(|(i, _)| *i).collect();
            if self.past_deadline() {
                return Err(self.deadline_exceeded());
            }
            self.pause(backoff);
            backoff = (backoff * 2).min(self.settings().retry_backoff_max);
        }
    }

    /// Commits the outbox and the input `offsets` as one transaction (exactly_once).
    /// After an abortable failure (a delivery failed, a broker timed out) the same
    /// records and offsets are sent again in a new transaction: the engine state they
    /// came from is unchanged, so the retry is the same batch. Returns `false` when the
    /// consumer group has moved on (our generation is fenced): the batch must then be
    /// dropped and its events read again by whoever owns them now.
    fn transact(
        &mut self,
        consumer: &BaseConsumer<RebalanceHandler>,
        offsets: &TopicPartitionList,
    ) -> Result<bool, PipelineError> {
        if self.outbox.is_empty() && offsets.count() == 0 {
            return Ok(true);
        }
        let timeout = TRANSACTION_CALL_TIMEOUT;
        let mut backoff = self.settings().retry_backoff_min;
        loop {
            let attempt = (|| -> Result<(), KafkaError> {
                self.producer.begin_transaction()?;
                let all: Vec<usize> = (0..self.outbox.len()).collect();
                self.send(&all);
                // Await the acks (commit would flush too): a failed record is known before
                // the offsets are sent, and the records are on the broker at the crash
                // point below.
                while self.producer.in_flight_count() > 0 && !self.past_deadline() {
                    self.producer.poll(Duration::from_millis(1));
                }
                if let Some((_, e)) = lock(&self.producer.context().failed).first() {
                    // A record that failed (or the producer refused) is not in the
                    // transaction: abort it.
                    return Err(e.clone());
                }
                if offsets.count() > 0 {
                    let group = consumer.group_metadata().ok_or(KafkaError::Subscription(
                        "no consumer group metadata".into(),
                    ))?;
                    self.producer
                        .send_offsets_to_transaction(offsets, &group, timeout)?;
                }
                crash_point("txn-before-commit");
                let mut commit_backoff = self.settings().retry_backoff_min;
                loop {
                    match self.producer.commit_transaction(timeout) {
                        Ok(()) => return Ok(()),
                        Err(e) if is_retriable(&e) && !self.past_deadline() => {
                            warn!(error = %e, "transaction commit not confirmed yet; retrying");
                            self.pause(commit_backoff);
                            commit_backoff =
                                (commit_backoff * 2).min(self.settings().retry_backoff_max);
                        }
                        Err(e) => return Err(e),
                    }
                }
            })();
            let error = match attempt {
                Ok(()) => {
                    crash_point("txn-after-commit");
                    lock(&self.producer.context().failed).clear();
                    self.outbox.clear();
                    return Ok(true);
                }
                Err(e) => e,
            };
            if is_fatal(&error) {
                return Err(self.transaction_failed(error));
            }
            warn!(error = %error, records = self.outbox.len(), backoff_ms = backoff.as_millis() as u64, "transaction failed; aborting it");
            self.abort()?;
            self.telemetry
                .metrics
                .delivery_retries
                .inc_by(self.outbox.len() as u64);
            self.take_failed();
            if is_group_fenced(&error) {
                return Ok(false);
            }
            if self.past_deadline() {
                return Err(self.deadline_exceeded());
            }
            self.pause(backoff);
            backoff = (backoff * 2).min(self.settings().retry_backoff_max);
        }
    }

    /// Aborts the open transaction, retrying while the broker is away.
    fn abort(&mut self) -> Result<(), PipelineError> {
        let mut backoff = self.settings().retry_backoff_min;
        loop {
            match self.producer.abort_transaction(TRANSACTION_CALL_TIMEOUT) {
                Ok(()) => return Ok(()),
                Err(e) if is_fatal(&e) => return Err(self.transaction_failed(e)),
                Err(e) => {
                    if self.past_deadline() {
                        return Err(self.deadline_exceeded());
                    }
                    warn!(error = %e, "transaction abort not confirmed yet; retrying");
                    self.pause(backoff);
                    backoff = (backoff * 2).min(self.settings().retry_backoff_max);
                }
            }
        }
    }

    fn transaction_failed(&self, source: KafkaError) -> PipelineError {
        PipelineError::Transaction {
            transactional_id: self.transactional_id.clone().unwrap_or_default(),
            source,
        }
    }

    /// Drops the batch in hand after the group fenced our transaction: the in-memory
    /// state of every partition goes (it is loaded again from sled and the changelog on
    /// the next event) and the consumer is moved back to the group's committed offsets,
    /// which are where the last committed transaction left them.
    fn rewind(&mut self, consumer: &BaseConsumer<RebalanceHandler>) {
        warn!(partitions = ?self.partitions.keys().collect::<Vec<_>>(), "consumer group moved on during the transaction; dropping the batch and reading it again");
        self.outbox.clear();
        self.polled.clear();
        self.partitions.clear();
        lock(&self.producer.context().changelog_offsets).clear();
        let Ok(assigned) = consumer.assignment() else {
            return;
        };
        let committed = consumer
            .committed_offsets(assigned.clone(), TRANSACTION_CALL_TIMEOUT)
            .unwrap_or(assigned);
        for e in committed.elements() {
            let to = match e.offset() {
                Offset::Offset(o) => Offset::Offset(o),
                _ => Offset::Beginning,
            };
            if let Err(error) = consumer.seek(e.topic(), e.partition(), to, Duration::from_secs(10))
            {
                // A partition that is no longer ours starts from the committed offset anyway.
                debug!(topic = e.topic(), partition = e.partition(), %error, "cannot seek back");
            }
        }
    }

    fn deadline_exceeded(&self) -> PipelineError {
        PipelineError::DeadlineExceeded {
            secs: self.settings().shutdown_deadline.as_secs(),
            undelivered: self.outbox.len(),
        }
    }

    /// Takes every changed partition's changes (sessions + offsets, one batch each) and
    /// the offsets to commit once they are stored.
    fn take_changes(&mut self) -> (Vec<(i32, StoreBatch)>, TopicPartitionList) {
        let mut batches = Vec::new();
        let mut commit = TopicPartitionList::new();
        for (&partition, p) in self.partitions.iter_mut().filter(|(_, p)| p.dirty) {
            let offsets: Vec<(String, i64)> = p
                .applied
                .iter()
                .map(|(t, o)| (format!("{t}/{partition}"), *o))
                .collect();
            if let Some(batch) = p.engine.take_changes(&offsets) {
                batches.push((partition, batch));
            }
            p.dirty = false;
            for (t, o) in &p.applied {
                let _ = commit.add_partition_offset(t, partition, Offset::Offset(o + 1));
            }
        }
        (batches, commit)
    }

    /// Puts a batch's changes on the changelog: the session records now, the commit
    /// record (`commit = true`) only after those are acknowledged, so a commit record
    /// is never ahead of the changes it vouches for.
    fn queue_changelog(&mut self, batches: &[(i32, StoreBatch)], commit: bool) {
        for (partition, batch) in batches {
            let record = |key: &[u8], payload: Vec<u8>, kind: &str| Record {
                sink: Sink::Changelog,
                partition: Some(*partition),
                key: key.to_vec(),
                payload,
                headers: vec![(CHANGELOG_KIND, kind.as_bytes().to_vec())],
                source_headers: Vec::new(),
                source_ms: None,
            };
            if commit {
                let offsets = serde_json::to_vec(&batch.offsets).unwrap_or_default();
                self.outbox
                    .push(record(CHANGELOG_COMMIT_KEY, offsets, "commit"));
                continue;
            }
            for (id, state) in &batch.puts {
                let mut r = record(id.as_bytes(), state.clone(), "session");
                r.headers.push((
                    CHANGELOG_STATE_FORMAT,
                    STATE_FORMAT.to_string().into_bytes(),
                ));
                self.outbox.push(r);
            }
            for id in &batch.deletes {
                self.outbox
                    .push(record(id.as_bytes(), Vec::new(), "session"));
            }
        }
    }

    /// Stores the batches (one atomic sled batch per partition) and flushes the database.
    fn store(&mut self, batches: Vec<(i32, StoreBatch)>) -> Result<(), PipelineError> {
        let mut backoff = self.settings().retry_backoff_min;
        let positions = std::mem::take(&mut *lock(&self.producer.context().changelog_offsets));
        let stored_any = !batches.is_empty();
        for (partition, mut batch) in batches {
            if let Some(o) = positions.get(&partition) {
                batch.offsets.push((CHANGELOG_POSITION.to_string(), *o));
            }
            let Some(p) = self.partitions.get_mut(&partition) else {
                continue;
            };
            loop {
                match p.store.commit(batch.clone()) {
                    Ok(()) => break,
                    Err(StoreError::Io(e)) => {
                        error!(partition, error = %e, "state store write failed; retrying");
                        if self.shutdown.is_triggered() {
                            return Err(StoreError::Io(e).into());
                        }
                        self.shutdown.sleep(backoff);
                        backoff = (backoff * 2).min(self.config.kafka.retry_backoff_max);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if stored_any {
            self.db.flush().map_err(StoreError::Io)?;
        }
        Ok(())
    }

    /// Ends a batch. at_least_once: deliver (findings and changelog), store, commit.
    /// exactly_once: one transaction (findings, changelog, offsets), then store.
    fn finish_batch(
        &mut self,
        consumer: &BaseConsumer<RebalanceHandler>,
        mode: CommitMode,
    ) -> Result<(), PipelineError> {
        self.apply_ready();
        let started = Instant::now();
        let (batches, commit) = self.take_changes();
        let changelog = self.settings().changelog;
        let finding_sources: Vec<i64> = self.outbox.iter().filter_map(|r| r.source_ms).collect();
        let metrics = self.telemetry.clone();
        let metrics = &metrics.metrics;
        let records;
        if self.transactional_id.is_some() {
            // The transaction makes the batch atomic; the commit records still mark where
            // each batch ends, so one restore path serves both modes.
            self.queue_changelog(&batches, false);
            self.queue_changelog(&batches, true);
            records = self.outbox.len();
            let committed = self.transact(consumer, &commit)?;
            metrics
                .commit_duration
                .observe(started.elapsed().as_secs_f64());
            if !committed {
                self.rewind(consumer);
                self.report_gauges();
                return Ok(());
            }
        } else {
            if changelog {
                self.queue_changelog(&batches, false);
            }
            records = self.outbox.len();
            self.deliver()?;
            if changelog && !batches.is_empty() {
                self.queue_changelog(&batches, true);
                self.deliver()?;
            }
            metrics
                .delivery_duration
                .observe(started.elapsed().as_secs_f64());
        }
        let delivered = Instant::now();
        let now = now_ms();
        for source in finding_sources {
            let ms = (now - source).max(0);
            metrics.produce_to_finding_latency.observe(ms as f64 / 1e3);
        }
        let stored_any = !batches.is_empty();
        self.store(batches)?;
        if stored_any {
            metrics
                .flush_duration
                .observe(delivered.elapsed().as_secs_f64());
        }
        self.stats.batches += 1;
        metrics.batches.inc();
        debug!(
            records,
            deliver_ms = (delivered - started).as_secs_f64() * 1e3,
            store_ms = delivered.elapsed().as_secs_f64() * 1e3,
            "batch finished"
        );
        if self.transactional_id.is_none() && commit.count() > 0 {
            let committing = Instant::now();
            if let Err(e) = consumer.commit(&commit, mode) {
                // sled holds the truth: a lost commit only means re-reading and skipping.
                warn!(error = %e, "offset commit failed; the stored offsets still hold");
            }
            metrics
                .commit_duration
                .observe(committing.elapsed().as_secs_f64());
        }
        let done = Instant::now();
        for polled in self.polled.drain(..) {
            metrics
                .processing_latency
                .observe((done - polled).as_secs_f64());
        }
        self.report_gauges();
        Ok(())
    }

    /// Brings the process-wide gauges up to date with this worker's share: open
    /// sessions, assigned partitions, per-partition lag, and (every 10 s) the state
    /// directory's size.
    fn report_gauges(&mut self) {
        let metrics = &self.telemetry.metrics;
        let sessions: i64 = self
            .partitions
            .values()
            .map(|p| p.engine.open_sessions() as i64)
            .sum();
        metrics.sessions_open.add(sessions - self.reported_sessions);
        self.reported_sessions = sessions;
        let partitions = self.partitions.len() as i64;
        metrics
            .partitions_assigned
            .add(partitions - self.reported_partitions);
        self.reported_partitions = partitions;
        if self
            .store_size_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            if let Ok(bytes) = self.db.size_on_disk() {
                metrics.state_store_bytes.set(bytes as i64);
            }
            self.store_size_at = Some(Instant::now());
        }
    }
}

/// How long one transaction call (send offsets, commit, abort) may block before it is
/// retried; the shutdown deadline bounds the retries.
const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_secs(10);

fn rd_error(e: &KafkaError) -> Option<&rdkafka::error::RDKafkaError> {
    match e {
        KafkaError::Transaction(rd) => Some(rd),
        _ => None,
    }
}

fn is_fatal(e: &KafkaError) -> bool {
    rd_error(e).is_some_and(|rd| rd.is_fatal())
}

/// A transaction call that timed out or met a passing broker error: call it again.
fn is_retriable(e: &KafkaError) -> bool {
    matches!(e, KafkaError::Flush(_)) || rd_error(e).is_some_and(|rd| rd.is_retriable())
}

/// The group has a newer generation than the one our offsets were sent with.
fn is_group_fenced(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::IllegalGeneration
                | RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::FencedInstanceId
                | RDKafkaErrorCode::RebalanceInProgress
        )
    )
}

/// A crash point for the exactly_once tests (feature `failpoints`, off in release
/// builds): when armed through `FAILPOINTS`, the process exits on the spot, as if killed.
fn crash_point(name: &str) {
    #[cfg(feature = "failpoints")]
    if fail::eval(name, |_| ()).is_some() {
        eprintln!("failpoint {name}: exiting");
        std::process::exit(86);
    }
    let _ = name;
}

/// The consumer's context: stores revoked partitions before the revoke is acknowledged,
/// loads assigned ones from sled.
pub struct RebalanceHandler {
    worker: Mutex<Worker>,
}

impl ClientContext for RebalanceHandler {
    fn error(&self, error: KafkaError, reason: &str) {
        warn!(client = "consumer", %error, reason, "kafka client error");
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<i32> {
    let mut ps: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
    ps.sort_unstable();
    ps.dedup();
    ps
}

impl ConsumerContext for RebalanceHandler {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let mut w = lock(&self.worker);
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let revoked = partitions_of(tpl);
                if consumer.assignment_lost() {
                    // The group went on without us (session timed out): another member may
                    // own these partitions already, so nothing of them may be written —
                    // no findings, no changelog, no state. Their events are consumed again
                    // by the new owner from the last committed point.
                    warn!(partitions = ?revoked, "assignment lost; dropping the unstored batch");
                    w.outbox.clear();
                    w.polled.clear();
                    for p in w.partitions.values_mut() {
                        p.held.clear();
                    }
                } else if let Err(e) = w.finish_batch(consumer, CommitMode::Sync) {
                    error!(error = %e, "cannot store the batch before the revoke");
                    w.fatal.get_or_insert(e);
                }
                for p in &revoked {
                    w.partitions.remove(p);
                    for topic in &w.config.kafka.input_topics {
                        let _ = w
                            .telemetry
                            .metrics
                            .consumer_lag
                            .remove_label_values(&[topic, &p.to_string()]);
                    }
                }
                w.report_gauges();
                info!(partitions = ?revoked, "partitions revoked");
            }
            Rebalance::Assign(tpl) => {
                for p in partitions_of(tpl) {
                    if let Err(e) = w.acquire(p) {
                        error!(partition = p, error = %e, "cannot load partition state");
                        w.fatal.get_or_insert(e);
                    }
                }
                if w.fatal.is_none() {
                    w.telemetry.readiness.assignment_loaded();
                }
                w.report_gauges();
            }
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }
}

/// Waits until the topics exist and checks them (retrying while the cluster is
/// unreachable or a topic is missing). Returns `None` when shutdown came first.
fn wait_for_topics(
    consumer: &BaseConsumer<RebalanceHandler>,
    settings: &KafkaSettings,
    brokers: &str,
    shutdown: &Shutdown,
) -> Result<Option<usize>, PipelineError> {
    let mut topics: Vec<&str> = settings.input_topics.iter().map(String::as_str).collect();
    topics.extend(settings.output_topics());
    let mut backoff = settings.retry_backoff_min;
    loop {
        let counts = partition_counts(consumer.client(), &topics, Duration::from_secs(5)).and_then(
            |counts| {
                let changelog = if settings.changelog {
                    partition_counts(
                        consumer.client(),
                        &[&settings.changelog_topic],
                        Duration::from_secs(5),
                    )?
                    .remove(&settings.changelog_topic)
                    .flatten()
                } else {
                    None
                };
                Ok((counts, changelog))
            },
        );
        match counts {
            Ok((counts, changelog)) => {
                let partitions = match check_topics(&counts, &settings.input_topics, brokers) {
                    // Topics created by a job that runs alongside (a fresh cluster, a
                    // Helm install) appear a little later: wait for them, not ready.
                    Err(missing @ TopicError::Missing { .. }) => {
                        warn!(error = %missing, backoff_ms = backoff.as_millis() as u64, "waiting for topics");
                        if shutdown.sleep(backoff) {
                            return Ok(None);
                        }
                        backoff = (backoff * 2).min(settings.retry_backoff_max);
                        continue;
                    }
                    other => other?,
                };
                if settings.changelog {
                    ensure_changelog(settings, brokers, partitions, changelog)?;
                }
                return Ok(Some(partitions));
            }
            Err(e) => {
                warn!(brokers, error = %e, backoff_ms = backoff.as_millis() as u64, "cannot read cluster metadata; retrying");
                if shutdown.sleep(backoff) {
                    return Ok(None);
                }
                backoff = (backoff * 2).min(settings.retry_backoff_max);
            }
        }
    }
}

/// Registers the transactional producer with the broker, which fences any earlier
/// producer with the same id and aborts the transaction it left open. Retries while the
/// broker is away; `false` when shutdown came first.
fn init_transactions(w: &Worker, id: &str) -> Result<bool, PipelineError> {
    let mut backoff = w.settings().retry_backoff_min;
    loop {
        match w.producer.init_transactions(TRANSACTION_CALL_TIMEOUT) {
            Ok(()) => {
                info!(transactional_id = id, "transactional producer ready");
                return Ok(true);
            }
            Err(e) if is_fatal(&e) => return Err(w.transaction_failed(e)),
            Err(e) => {
                warn!(transactional_id = id, error = %e, backoff_ms = backoff.as_millis() as u64, "cannot initialise transactions; retrying");
                if w.shutdown.sleep(backoff) {
                    return Ok(false);
                }
                backoff = (backoff * 2).min(w.settings().retry_backoff_max);
            }
        }
    }
}

/// Runs the pipeline against `brokers` until `shutdown` is triggered: then it stops
/// fetching, finishes the batch in hand (deliver, store, commit) and returns.
pub fn run(
    config: Arc<Config>,
    brokers: &str,
    shutdown: Shutdown,
) -> Result<RunStats, PipelineError> {
    run_observed(config, brokers, shutdown, Arc::new(Telemetry::new()))
}

/// [`run`], reporting metrics and readiness to `telemetry`.
pub fn run_observed(
    config: Arc<Config>,
    brokers: &str,
    shutdown: Shutdown,
    telemetry: Arc<Telemetry>,
) -> Result<RunStats, PipelineError> {
    let db = open_db(&config.state_path)?;
    let workers = config.kafka.workers;
    if workers == 1 {
        return run_worker(config, brokers, db, shutdown, 0, telemetry);
    }
    // Several members of the group in one process: each owns its partitions, engines and
    // sled trees; while one waits for the broker or the disk, the other computes.
    let threads: Vec<_> = (0..workers)
        .map(|i| {
            let (config, brokers, db, shutdown, telemetry) = (
                config.clone(),
                brokers.to_string(),
                db.clone(),
                shutdown.clone(),
                telemetry.clone(),
            );
            std::thread::Builder::new()
                .name(format!("loopwarden-worker-{i}"))
                .spawn(move || {
                    let result = run_worker(config, &brokers, db, shutdown.clone(), i, telemetry);
                    if result.is_err() {
                        // One worker failing stops the process: the others finish cleanly.
                        shutdown.trigger();
                    }
                    result
                })
        })
        .collect::<Result<_, _>>()
        .map_err(PipelineError::Thread)?;
    let mut total = RunStats::default();
    let mut first_error = None;
    for t in threads {
        match t.join() {
            Ok(Ok(stats)) => total += stats,
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(PipelineError::WorkerPanicked);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(total),
    }
}

/// One member of the consumer group (one thread): subscribe, consume, stop.
fn run_worker(
    config: Arc<Config>,
    brokers: &str,
    db: sled::Db,
    shutdown: Shutdown,
    index: usize,
    telemetry: Arc<Telemetry>,
) -> Result<RunStats, PipelineError> {
    let settings = config.kafka.clone();
    let transactional_id = (settings.delivery == Delivery::ExactlyOnce)
        .then(|| transactional_id(&settings, &config.state_path, index));
    let mut producer_config = producer_config(&settings, brokers, config.limits.max_event_bytes);
    if let Some(id) = &transactional_id {
        producer_config.set("transactional.id", id);
    }
    let producer: BaseProducer<DeliveryTracker> = producer_config
        .create_with_context(DeliveryTracker {
            changelog_topic: settings.changelog_topic.clone(),
            ..DeliveryTracker::default()
        })
        .map_err(PipelineError::Client)?;
    let worker = Worker {
        config: config.clone(),
        db,
        producer,
        partitions: BTreeMap::new(),
        outbox: Vec::new(),
        scratch: Vec::new(),
        topics: FxHashMap::default(),
        inputs: settings
            .input_topics
            .iter()
            .map(|t| Arc::from(t.as_str()))
            .collect(),
        shutdown: shutdown.clone(),
        stats: RunStats::default(),
        fatal: None,
        changelog_reader: None,
        brokers: brokers.to_string(),
        transactional_id: transactional_id.clone(),
        telemetry,
        scratch_sources: Vec::new(),
        polled: Vec::new(),
        reported_sessions: 0,
        reported_partitions: 0,
        store_size_at: None,
        consumed: FxHashMap::default(),
    };
    let consumer: BaseConsumer<RebalanceHandler> = consumer_config(&settings, brokers, index)
        .create_with_context(RebalanceHandler {
            worker: Mutex::new(worker),
        })
        .map_err(PipelineError::Client)?;
    let Some(partitions) = wait_for_topics(&consumer, &settings, brokers, &shutdown)? else {
        return Ok(RunStats::default());
    };
    if let Some(id) = &transactional_id {
        let w = lock(&consumer.context().worker);
        if !init_transactions(&w, id)? {
            return Ok(RunStats::default());
        }
    }
    let inputs: Vec<&str> = settings.input_topics.iter().map(String::as_str).collect();
    consumer
        .subscribe(&inputs)
        .map_err(|source| PipelineError::Subscribe {
            topics: inputs.join(", "),
            source,
        })?;
    info!(brokers, group = %settings.group_id, topics = ?inputs, partitions, worker = index, state = %config.state_path.display(), "consuming");

    let result = consume(&consumer, &settings, &shutdown);
    let mut w = lock(&consumer.context().worker);
    let result = result.and_then(|()| w.finish_batch(&consumer, CommitMode::Sync));
    let held: usize = w.partitions.values().map(|p| p.held.len()).sum();
    if held > 0 {
        // Applying them now could put them before an event of another topic still on
        // its way; not applied, their offsets are not committed and they are read again.
        info!(
            held,
            "events still waiting for alignment are left for the next start"
        );
    }
    if result.is_err() {
        // Nothing of the unfinished batch may be stored (its events are processed again
        // on restart), and leaving the group must not wait on a broker that is away.
        w.outbox.clear();
        w.partitions.clear();
        shutdown.trigger();
    }
    let stats = w.stats;
    drop(w);
    // Leaving the group runs the revoke callback (an empty batch) before the drop returns.
    drop(consumer);
    match &result {
        Ok(()) => info!(worker = index, ?stats, "stopped"),
        Err(e) => error!(worker = index, error = %e, ?stats, "stopped with an error"),
    }
    result.map(|()| stats)
}

/// The poll loop: batches of up to `max_batch_events`, closed after `max_batch_wait`.
fn consume(
    consumer: &BaseConsumer<RebalanceHandler>,
    settings: &KafkaSettings,
    shutdown: &Shutdown,
) -> Result<(), PipelineError> {
    let idle_poll = Duration::from_millis(100);
    // Adaptive batching: while there is a backlog (a batch runs out of time with more
    // messages waiting on the broker than it took), batches grow up to 8× the configured wait, so the fixed cost of
    // delivering and storing a batch is spread over more events; once caught up, batches
    // are short again (latency).
    let mut wait = settings.max_batch_wait;
    while !shutdown.is_triggered() {
        let mut in_batch = 0usize;
        let mut started: Option<Instant> = None;
        let mut timed_out = false;
        loop {
            let timeout = match started {
                // Idle: wake up for a held event whose wait for another topic ends.
                None => lock(&consumer.context().worker)
                    .next_due()
                    .map_or(idle_poll, |due| {
                        due.saturating_duration_since(Instant::now()).min(idle_poll)
                    }),
                Some(t) => match wait.checked_sub(t.elapsed()) {
                    Some(left) if !left.is_zero() => left,
                    _ => {
                        timed_out = true;
                        break;
                    }
                },
            };
            match consumer.poll(timeout) {
                Some(Ok(m)) => {
                    let mut w = lock(&consumer.context().worker);
                    w.handle(&m)?;
                    in_batch += 1;
                    started.get_or_insert_with(Instant::now);
                    if in_batch >= settings.max_batch_events {
                        break;
                    }
                }
                Some(Err(e)) => {
                    warn!(error = %e, "consumer error");
                    if in_batch > 0 {
                        break;
                    }
                }
                None => {
                    if in_batch > 0 || shutdown.is_triggered() {
                        break;
                    }
                    let mut w = lock(&consumer.context().worker);
                    if let Some(e) = w.fatal.take() {
                        return Err(e);
                    }
                    w.tick_idle();
                    // Keeps the lag gauge current while the input is idle.
                    w.lag(consumer);
                    if !w.outbox.is_empty() || w.partitions.values().any(|p| p.dirty) {
                        break;
                    }
                }
            }
        }
        let mut w = lock(&consumer.context().worker);
        let lag = w.lag(consumer);
        wait = if timed_out && lag > in_batch as i64 {
            (wait * 2).min(settings.max_batch_wait * 8)
        } else {
            settings.max_batch_wait
        };
        if let Some(e) = w.fatal.take() {
            return Err(e);
        }
        w.tick_idle();
        w.finish_batch(consumer, CommitMode::Async)?;
    }
    Ok(())
}

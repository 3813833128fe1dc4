//! The outbox: every record a batch produces (findings, summaries, dead letters,
//! changelog records), handed to the producer and tracked until the broker has
//! acknowledged each one.
//!
//! Guarantees: [`Outbox::deliver`] returns only when every record is acknowledged
//! (failures are sent again with backoff, never dropped), the shutdown deadline has
//! passed, or the producer failed fatally (it delivers nothing more: [`Undelivered`]);
//! a dead letter the broker refuses as too large is cut to its first 64 KiB with a
//! header saying how long it was, so it is never lost. Records name their topic by kind
//! ([`Sink`]), resolved by name from the settings. A record's value is shared with the
//! producer while it is in flight, not copied ([`Payload`]): the outbox may drop or cut
//! its record meanwhile without touching what librdkafka reads.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::Message;
use rustc_hash::FxHashMap;
use tracing::warn;

use super::backoff::{Backoff, DeadlinePassed};
use super::bus::{DeliveryTracker, KafkaTransport, Outgoing, Payload, Report, Transport};
use super::lock;
use crate::bus::kafka::headers::{self, RawHeaders};
use crate::bus::kafka::settings::KafkaSettings;
use crate::shutdown::Shutdown;
use crate::telemetry::Telemetry;

/// Header names put on dead-lettered messages (after the message's own headers).
pub const DLQ_SOURCE_TOPIC: &str = "loopwarden.source.topic";
pub const DLQ_SOURCE_PARTITION: &str = "loopwarden.source.partition";
pub const DLQ_SOURCE_OFFSET: &str = "loopwarden.source.offset";
/// The bad-input class (`oversized`, `invalid_json`, … see [`crate::contract::event::BadEvent`]).
pub const DLQ_REASON: &str = "loopwarden.error.reason";
/// The precise error, with the JSON path or byte offset where it applies.
pub const DLQ_MESSAGE: &str = "loopwarden.error.message";
/// Set when the broker refused the whole message and only its first bytes were kept:
/// the payload's length before.
pub const DLQ_TRUNCATED_FROM: &str = "loopwarden.truncated_from_bytes";
/// Set when the key was cut too: its length before.
pub const DLQ_KEY_TRUNCATED_FROM: &str = "loopwarden.key_truncated_from_bytes";
/// Set when the source's own headers were left out: how many there were.
pub const DLQ_SOURCE_HEADERS_DROPPED: &str = "loopwarden.source_headers_dropped";

/// Bytes of an oversized dead letter kept when the broker refuses the whole message.
const DLQ_TRUNCATE_TO: usize = 64 * 1024;
/// Bytes of its key kept then.
const DLQ_KEY_TRUNCATE_TO: usize = 1024;
/// The source's headers are kept then while their names and values take at most this.
const DLQ_SOURCE_HEADERS_KEEP: usize = 4 * 1024;

/// What a record is, and so where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    Warning,
    Terminated,
    Summary,
    DeadLetter,
    Changelog,
    /// Events the OTLP ingest publishes onto an input topic (see [`Outbox::publishing_to`]).
    Ingested,
}

impl Sink {
    /// The topic records of this kind go to.
    pub fn topic(self, settings: &KafkaSettings) -> &str {
        match self {
            Sink::Warning => &settings.warning_topic,
            Sink::Terminated => &settings.terminated_topic,
            Sink::Summary => &settings.summary_topic,
            Sink::DeadLetter => &settings.dlq_topic,
            Sink::Changelog => &settings.changelog_topic,
            // Resolved by the outbox that publishes them.
            Sink::Ingested => "",
        }
    }
}

/// One message to produce.
pub struct Record {
    pub sink: Sink,
    /// An explicit partition (changelog records go to their input partition's number).
    pub partition: Option<i32>,
    pub key: Vec<u8>,
    /// Shared with the producer while the record is in flight (not copied).
    pub payload: Payload,
    /// Values borrowed where they are the same for every record (a changelog record's
    /// kind and state format): most records are changelog records, one a state written.
    pub headers: Vec<(&'static str, Cow<'static, [u8]>)>,
    /// For dead letters: the source message's own headers, kept first.
    pub source_headers: Vec<(String, Option<Vec<u8>>)>,
    /// For findings: the Kafka timestamp of the event that fired it (latency metric).
    pub source_ms: Option<i64>,
}

impl Record {
    /// Makes a dead letter the broker (or the producer) refused as too large smaller, so
    /// that it lands as its first bytes instead of being sent again for ever. The first
    /// time: the payload cut to [`DLQ_TRUNCATE_TO`] bytes, the key to
    /// [`DLQ_KEY_TRUNCATE_TO`], the source's own headers left out when they take more than
    /// [`DLQ_SOURCE_HEADERS_KEEP`]. Refused again (a dead-letter topic whose limit is under
    /// that), or when none of those applied: the payload halved, and once it is empty, the
    /// source's headers and then the key left out. Each cut is said in a header with the
    /// size before; what is left at the end is loopwarden's own headers (under 1 KiB).
    fn cut_to_fit(&mut self) {
        let said = |n: usize| -> Cow<'static, [u8]> { n.to_string().into_bytes().into() };
        let first = ![
            DLQ_TRUNCATED_FROM,
            DLQ_KEY_TRUNCATED_FROM,
            DLQ_SOURCE_HEADERS_DROPPED,
        ]
        .iter()
        .any(|name| self.has_header(name));
        let (payload, key) = (self.payload.len(), self.key.len());
        let source_bytes: usize = self
            .source_headers
            .iter()
            .map(|(name, value)| name.len() + value.as_ref().map_or(0, Vec::len))
            .sum();
        let (cut_payload, cut_key, drop_source) = if first
            && (payload > DLQ_TRUNCATE_TO
                || key > DLQ_KEY_TRUNCATE_TO
                || source_bytes > DLQ_SOURCE_HEADERS_KEEP)
        {
            (
                DLQ_TRUNCATE_TO.min(payload),
                DLQ_KEY_TRUNCATE_TO.min(key),
                source_bytes > DLQ_SOURCE_HEADERS_KEEP,
            )
        } else if payload > 0 {
            (payload / 2, key, false)
        } else if !self.source_headers.is_empty() {
            (0, key, true)
        } else {
            (0, 0, false)
        };
        if cut_payload < payload && !self.has_header(DLQ_TRUNCATED_FROM) {
            self.headers.push((DLQ_TRUNCATED_FROM, said(payload)));
        }
        // Refused: its report was served, so the producer holds no reference to the value
        // and nothing is copied (a value still in flight would be, and stay intact).
        Payload::make_mut(&mut self.payload).truncate(cut_payload);
        if cut_key < key && !self.has_header(DLQ_KEY_TRUNCATED_FROM) {
            self.headers.push((DLQ_KEY_TRUNCATED_FROM, said(key)));
        }
        self.key.truncate(cut_key);
        if drop_source {
            self.headers
                .push((DLQ_SOURCE_HEADERS_DROPPED, said(self.source_headers.len())));
            self.source_headers.clear();
        }
    }

    fn has_header(&self, name: &str) -> bool {
        self.headers.iter().any(|(n, _)| *n == name)
    }
}

/// The dead letter of a bad message: its key, payload and headers, and where it came
/// from and why it was refused (`reason`: the bounded class; `message`: what and where).
pub fn dead_letter<M: Message>(m: &M, topic: &str, reason: &str, message: &str) -> Record
where
    M::Headers: RawHeaders,
{
    // A name that is not UTF-8 is copied with its bad bytes as U+FFFD: the producer
    // takes UTF-8 names only (the key and the payload stay as they came).
    let source_headers = m
        .headers()
        .map(|h| {
            headers::each(h)
                .map(|(name, value)| {
                    (
                        String::from_utf8_lossy(name).into_owned(),
                        value.map(<[u8]>::to_vec),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Record {
        sink: Sink::DeadLetter,
        partition: None,
        key: m.key().unwrap_or_default().to_vec(),
        payload: Payload::new(m.payload().unwrap_or_default().to_vec()),
        headers: vec![
            (DLQ_SOURCE_TOPIC, topic.as_bytes().to_vec().into()),
            (
                DLQ_SOURCE_PARTITION,
                m.partition().to_string().into_bytes().into(),
            ),
            (
                DLQ_SOURCE_OFFSET,
                m.offset().to_string().into_bytes().into(),
            ),
            (DLQ_REASON, reason.as_bytes().to_vec().into()),
            (DLQ_MESSAGE, message.as_bytes().to_vec().into()),
        ],
        source_headers,
        source_ms: None,
    }
}

/// Why records were left undelivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undelivered {
    /// The shutdown deadline passed while failures were being sent again.
    DeadlinePassed,
    /// The producer failed fatally, for the reason given: no record it is handed can be
    /// delivered any more, so sending them again would wait for ever. Only a new producer
    /// (a restart) delivers them.
    ProducerFailed(String),
}

impl From<DeadlinePassed> for Undelivered {
    fn from(_: DeadlinePassed) -> Undelivered {
        Undelivered::DeadlinePassed
    }
}

/// The records of the batch in hand and the producer they go through: the first `sent`
/// are with the producer until [`Outbox::settle`] (or [`Outbox::settle_below`], for the
/// records before a mark) sees them acknowledged; records pushed meanwhile (the next
/// batch's) wait behind them. Records are numbered from the outbox's first one: the
/// first held is number `base`, and a mark ([`Outbox::end`]) is a number.
pub struct Outbox {
    records: Vec<Record>,
    base: usize,
    sent: usize,
    pub transport: Box<dyn Transport>,
    settings: KafkaSettings,
    telemetry: Arc<Telemetry>,
    /// Where [`Sink::Ingested`] records go.
    ingest_topic: String,
    /// Bounds the wait for room in the producer's queue once shutdown has come.
    shutdown: Shutdown,
}

impl Outbox {
    pub fn new(
        producer_config: &rdkafka::ClientConfig,
        settings: &KafkaSettings,
        telemetry: Arc<Telemetry>,
        shutdown: &Shutdown,
    ) -> Result<Outbox, KafkaError> {
        let tracker = DeliveryTracker::of(&telemetry);
        let transport = KafkaTransport::new(producer_config, tracker)?;
        Ok(Outbox::with_transport(
            Box::new(transport),
            settings,
            telemetry,
            shutdown,
        ))
    }

    /// An outbox over any transport (the unit tests' in-memory bus).
    pub fn with_transport(
        transport: Box<dyn Transport>,
        settings: &KafkaSettings,
        telemetry: Arc<Telemetry>,
        shutdown: &Shutdown,
    ) -> Outbox {
        Outbox {
            records: Vec::new(),
            base: 0,
            sent: 0,
            transport,
            settings: settings.clone(),
            telemetry,
            ingest_topic: String::new(),
            shutdown: shutdown.clone(),
        }
    }

    /// An outbox onto the unit tests' in-memory bus, with telemetry of its own.
    #[cfg(test)]
    pub fn on_memory_bus(bus: &super::memory::Bus, settings: &KafkaSettings) -> Outbox {
        let telemetry = Arc::new(Telemetry::new());
        let tracker = DeliveryTracker::of(&telemetry);
        let transport = super::memory::MemoryTransport::new(bus, tracker);
        Outbox::with_transport(Box::new(transport), settings, telemetry, &Shutdown::new())
    }

    /// This outbox publishes [`Sink::Ingested`] records to `topic`.
    pub fn publishing_to(mut self, topic: &str) -> Outbox {
        self.ingest_topic = topic.to_string();
        self
    }

    fn topic_of(&self, sink: Sink) -> &str {
        match sink {
            Sink::Ingested => &self.ingest_topic,
            other => other.topic(&self.settings),
        }
    }

    pub fn push(&mut self, record: Record) {
        self.records.push(record);
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The mark after the last record pushed: [`Outbox::settle_below`] it waits for
    /// every record pushed so far, and for none pushed later.
    pub fn end(&self) -> usize {
        self.base + self.records.len()
    }

    /// Drops the records, sent or not (a batch given up: its events are read again);
    /// reports still to come for them are ignored.
    pub fn clear(&mut self) {
        self.base += self.records.len();
        self.records.clear();
        self.sent = 0;
        let tracker = self.transport.tracker();
        tracker.epoch.fetch_add(1, Ordering::AcqRel);
        lock(&tracker.failed).clear();
        lock(&tracker.unacknowledged).clear();
    }

    /// Counts `records` sent again (a retried delivery or transaction).
    pub fn retried(&self, records: usize) {
        self.telemetry
            .metrics
            .delivery_retries
            .inc_by(records as u64);
    }

    /// The highest acknowledged changelog offset per partition since the last call.
    pub fn take_changelog_positions(&self) -> FxHashMap<i32, i64> {
        std::mem::take(&mut *lock(&self.transport.tracker().changelog_offsets))
    }

    /// Forgets acknowledged changelog offsets (a batch given up).
    pub fn forget_changelog_positions(&self) {
        lock(&self.transport.tracker().changelog_offsets).clear();
    }

    /// Whether a delivery failed since the last [`Outbox::take_failed`].
    pub fn has_failed(&self) -> bool {
        !lock(&self.transport.tracker().failed).is_empty()
    }

    /// The first failure recorded since the last [`Outbox::take_failed`].
    pub fn first_failure(&self) -> Option<KafkaError> {
        lock(&self.transport.tracker().failed)
            .first()
            .map(|(_, e)| e.clone())
    }

    /// Hands the records at `indexes` (positions in the outbox) to the producer (waiting
    /// while its queue is full); a record it refuses outright is recorded as failed, like
    /// a failed delivery.
    pub fn send(&mut self, indexes: &[usize]) {
        let epoch = self.transport.tracker().epoch.load(Ordering::Acquire);
        for &i in indexes {
            let number = self.base + i;
            let r = &self.records[i];
            loop {
                let record = Outgoing {
                    topic: self.topic_of(r.sink),
                    partition: r.partition,
                    key: &r.key,
                    // A changelog tombstone has no value at all (compaction drops the key).
                    payload: (!(r.sink == Sink::Changelog && r.payload.is_empty()))
                        .then_some(&r.payload),
                    source_headers: &r.source_headers,
                    headers: &r.headers,
                };
                let report = Report {
                    epoch,
                    index: number,
                    source_ms: r.source_ms,
                    changelog: r.sink == Sink::Changelog,
                };
                // Before the send: a transport may report inside it. A record that
                // fails stays in it until sent again and acknowledged.
                lock(&self.transport.tracker().unacknowledged).insert(number);
                match self.transport.send(record, report) {
                    Ok(()) => break,
                    Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)) => {
                        // The queue drains as the broker acknowledges, or as its records
                        // expire (`message.timeout.ms`, minutes): past the shutdown
                        // deadline, the record fails instead, as the deadline says.
                        if Backoff::new(&self.settings, &self.shutdown).past_deadline() {
                            let full = KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull);
                            lock(&self.transport.tracker().failed).push((number, full));
                            break;
                        }
                        self.transport.poll(Duration::from_millis(5));
                    }
                    Err(e) => {
                        // Failed, not with the producer: sent again by a settling.
                        lock(&self.transport.tracker().failed).push((number, e));
                        break;
                    }
                }
            }
        }
    }

    /// Waits until the producer has nothing in flight (or the deadline passed).
    pub fn await_acks(&self, backoff: &Backoff) -> Result<(), DeadlinePassed> {
        while self.transport.in_flight() > 0 {
            self.transport.poll(Duration::from_millis(1));
            if backoff.past_deadline() {
                return Err(DeadlinePassed);
            }
        }
        Ok(())
    }

    /// Takes the failed deliveries, by position in the outbox; a dead letter the broker
    /// refused as too large is cut to fit ([`Record::cut_to_fit`]), so it is never lost.
    pub fn take_failed(&mut self) -> Vec<(usize, KafkaError)> {
        let mut failed = std::mem::take(&mut *lock(&self.transport.tracker().failed));
        for (number, _) in &mut failed {
            *number -= self.base;
        }
        for (i, e) in &failed {
            let r = &mut self.records[*i];
            let too_large = matches!(
                e.rdkafka_error_code(),
                Some(RDKafkaErrorCode::MessageSizeTooLarge)
            );
            if too_large && r.sink == Sink::DeadLetter {
                r.cut_to_fit();
            }
        }
        failed
    }

    /// Hands the records not sent yet to the producer without waiting for the broker;
    /// they stay in the outbox until [`Outbox::settle`] has seen each one acknowledged.
    pub fn send_all(&mut self) {
        let unsent: Vec<usize> = (self.sent..self.records.len()).collect();
        self.send(&unsent);
        self.sent = self.records.len();
    }

    /// Whether records wait to be handed to the producer.
    pub fn has_unsent(&self) -> bool {
        self.sent < self.records.len()
    }

    /// Whether records are with the producer, not yet settled.
    pub fn has_sent(&self) -> bool {
        self.sent > 0
    }

    /// Waits until the broker has acknowledged every record sent, sending failures again
    /// with backoff, then drops them (records pushed since stay, unsent).
    pub fn settle(&mut self, backoff: &mut Backoff) -> Result<(), Undelivered> {
        self.settle_below(self.base + self.sent, backoff)
    }

    /// Sends failed deliveries again after the backoff's pause, unless the producer
    /// failed fatally.
    fn send_again(
        &mut self,
        failed: Vec<(usize, KafkaError)>,
        backoff: &mut Backoff,
    ) -> Result<(), Undelivered> {
        if let Some(reason) = self.transport.fatal_error() {
            // Kept as failed (by number, as the tracker holds them): a settling after this
            // one (a stop's) fails at once too, instead of waiting out its deadline. As
            // failed fatally: taken again, a dead letter refused as too large is not cut
            // again (it is not sent again either).
            let base = self.base;
            let fatal = || KafkaError::MessageProduction(RDKafkaErrorCode::Fatal);
            lock(&self.transport.tracker().failed)
                .extend(failed.into_iter().map(|(i, _)| (i + base, fatal())));
            return Err(Undelivered::ProducerFailed(reason));
        }
        self.retried(failed.len());
        let (_, first) = &failed[0];
        warn!(failed = failed.len(), error = %first, backoff_ms = backoff.delay_ms(), "output delivery failed; retrying");
        let pending: Vec<usize> = failed.iter().map(|(i, _)| *i).collect();
        backoff.pause()?;
        self.send(&pending);
        Ok(())
    }

    /// Whether every record before `mark` was handed to the producer and acknowledged
    /// (delivery reports served first, without waiting); failures are sent again.
    fn acknowledged_below(
        &mut self,
        mark: usize,
        backoff: &mut Backoff,
    ) -> Result<bool, Undelivered> {
        self.transport.poll(Duration::ZERO);
        let failed = self.take_failed();
        if !failed.is_empty() {
            self.send_again(failed, backoff)?;
            return Ok(false);
        }
        Ok(self.delivered_below(mark))
    }

    /// Whether every record before `mark` was sent and none of them waits for its
    /// acknowledgement (a failed one waits until sent again).
    fn delivered_below(&self, mark: usize) -> bool {
        mark <= self.base + self.sent
            && !lock(&self.transport.tracker().unacknowledged).any_below(mark)
    }

    /// Drops the records before `mark` (sent and acknowledged).
    fn drop_below(&mut self, mark: usize) {
        let count = mark.saturating_sub(self.base);
        self.records.drain(..count);
        self.sent -= count;
        self.base += count;
    }

    /// Waits until the broker has acknowledged every record before `mark` (an
    /// [`Outbox::end`]), sending failures again with backoff, then drops them; records
    /// after the mark stay with the producer, unsettled. When records before it are not
    /// sent yet, every unsent record is sent first.
    pub fn settle_below(&mut self, mark: usize, backoff: &mut Backoff) -> Result<(), Undelivered> {
        if mark > self.base + self.sent {
            self.send_all();
        }
        while !self.acknowledged_below(mark, backoff)? {
            if backoff.past_deadline() {
                return Err(Undelivered::DeadlinePassed);
            }
            self.transport.poll(Duration::from_millis(1));
        }
        self.drop_below(mark);
        Ok(())
    }

    /// [`Outbox::settle_below`] without waiting: `true` (and the records before `mark`
    /// dropped) when the broker has acknowledged each of them already. Failures are left
    /// for a settling that may wait.
    pub fn try_settle_below(&mut self, mark: usize) -> bool {
        self.transport.poll(Duration::ZERO);
        if self.has_failed() || !self.delivered_below(mark) {
            return false;
        }
        self.drop_below(mark);
        true
    }

    /// Produces every record and waits until the broker has acknowledged each one
    /// ([`Outbox::send_all`], then [`Outbox::settle`]).
    pub fn deliver(&mut self, backoff: &mut Backoff) -> Result<(), Undelivered> {
        self.send_all();
        self.settle(backoff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::pipeline::memory::Bus;

    fn warning(payload: &str) -> Record {
        Record {
            sink: Sink::Warning,
            partition: None,
            key: b"s".to_vec(),
            payload: Payload::new(payload.as_bytes().to_vec()),
            headers: Vec::new(),
            source_headers: Vec::new(),
            source_ms: None,
        }
    }

    /// A record's report says whether it is a changelog record, by its sink: only the
    /// changelog's acknowledged offsets become the positions a batch stores with its
    /// states, a finding's never (on any partition).
    #[test]
    fn only_changelog_records_move_the_changelog_positions() {
        let bus = Bus::default();
        let settings = KafkaSettings::default();
        let mut outbox = Outbox::on_memory_bus(&bus, &settings);
        let state = |partition| Record {
            sink: Sink::Changelog,
            partition: Some(partition),
            ..warning("state")
        };
        outbox.push(warning("a"));
        outbox.push(state(1));
        outbox.push(state(1));
        outbox.push(Record {
            partition: Some(2),
            ..warning("b")
        });
        let mut backoff = Backoff::new(&settings, &Shutdown::new());
        outbox.settle_below(outbox.end(), &mut backoff).unwrap();
        assert_eq!(
            outbox
                .take_changelog_positions()
                .into_iter()
                .collect::<Vec<_>>(),
            [(1, 1)]
        );
        assert!(outbox.take_changelog_positions().is_empty(), "taken");
    }

    #[test]
    fn a_producer_failed_fatally_is_not_waited_on_but_said() {
        // librdkafka's idempotent producer fails fatally when the broker no longer
        // follows its sequence: every record fails from then on, so sending them again
        // with backoff waited for ever (or, at a stop, for the whole deadline).
        let bus = Bus::default();
        let settings = KafkaSettings::default();
        let mut outbox = Outbox::on_memory_bus(&bus, &settings);
        outbox.push(warning("a"));
        outbox
            .deliver(&mut Backoff::new(&settings, &Shutdown::new()))
            .unwrap();
        outbox.push(warning("b"));
        outbox.push(warning("c"));
        outbox.send_all();
        bus.fail_producer("sequence desynchronization");
        outbox.push(warning("d"));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut backoff = Backoff::new(&settings, &Shutdown::new());
            let first = outbox.deliver(&mut backoff);
            // A settling after it (a stop's) says so at once too.
            let again = outbox.settle(&mut backoff);
            tx.send((first, again, outbox.len())).unwrap();
        });
        let (first, again, held) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the outbox waits on a producer that failed fatally");
        let failed = Undelivered::ProducerFailed("sequence desynchronization".into());
        assert_eq!(first, Err(failed.clone()));
        assert_eq!(again, Err(failed));
        assert_eq!(held, 3, "b, c and d stay, undelivered");
        assert_eq!(
            bus.records(&KafkaSettings::default().warning_topic).len(),
            1
        );
    }

    #[test]
    fn settling_below_a_mark_leaves_the_records_after_it_with_the_producer() {
        let bus = Bus::default();
        let settings = KafkaSettings::default();
        let mut outbox = Outbox::on_memory_bus(&bus, &settings);
        let mut backoff = Backoff::new(&settings, &Shutdown::new());
        outbox.push(warning("a"));
        outbox.push(warning("b"));
        let mark = outbox.end();
        assert!(!outbox.try_settle_below(mark), "not sent: not acknowledged");
        outbox.send_all();
        outbox.push(warning("c"));
        outbox.send_all();
        outbox.push(warning("d"));
        outbox.settle_below(mark, &mut backoff).unwrap();
        assert_eq!(outbox.len(), 2, "c (sent) and d (not sent) stay");
        assert_eq!(bus.records(&settings.warning_topic).len(), 3);
        let end = outbox.end();
        assert_eq!(end, mark + 2, "marks count every record pushed");
        assert!(!outbox.try_settle_below(end), "d is not sent");
        outbox.settle_below(end, &mut backoff).unwrap();
        assert!(outbox.is_empty());
        let landed: Vec<_> = bus
            .records(&settings.warning_topic)
            .into_iter()
            .map(|r| r.payload.unwrap())
            .collect();
        assert_eq!(landed, [b"a", b"b", b"c", b"d"].map(|p| p.to_vec()));
        // A cleared outbox numbers on: a report of a record given up names no other.
        outbox.push(warning("e"));
        outbox.send_all();
        outbox.clear();
        outbox.push(warning("f"));
        assert_eq!(outbox.end(), end + 2);
        outbox.settle_below(outbox.end(), &mut backoff).unwrap();
        assert!(outbox.is_empty());
    }

    #[test]
    fn a_failed_delivery_after_the_outbox_numbered_on_is_sent_again_and_settled() {
        let bus = Bus::default();
        let settings = KafkaSettings {
            retry_backoff_min: Duration::from_millis(1),
            shutdown_deadline: Duration::from_secs(5),
            ..KafkaSettings::default()
        };
        let mut outbox = Outbox::on_memory_bus(&bus, &settings);
        // Settling gives up at the deadline (instead of waiting for ever) if the record
        // sent again is not the one that failed.
        let stopping = Shutdown::new();
        stopping.trigger();
        let mut backoff = Backoff::new(&settings, &stopping);
        outbox.push(warning("a"));
        outbox.push(warning("b"));
        outbox.settle_below(outbox.end(), &mut backoff).unwrap();
        outbox.push(warning("c"));
        outbox.push(warning("d"));
        let mark = outbox.end();
        outbox.push(warning("e"));
        outbox.send_all();
        // c fails once: d and e land first.
        bus.fail_deliveries(1);
        assert!(
            !outbox.try_settle_below(mark),
            "c failed: a settling sends it"
        );
        outbox.settle_below(mark, &mut backoff).unwrap();
        assert_eq!(outbox.len(), 1, "e stays, past the mark");
        let landed: Vec<_> = bus
            .records(&settings.warning_topic)
            .into_iter()
            .map(|r| r.payload.unwrap())
            .collect();
        assert_eq!(landed, [b"a", b"b", b"d", b"e", b"c"].map(|p| p.to_vec()));
        outbox.settle(&mut backoff).unwrap();
        assert!(outbox.is_empty());
        assert_eq!(bus.records(&settings.warning_topic).len(), 5, "each once");
    }

    /// An outbox whose producer reaches no broker (nothing is ever acknowledged), with
    /// `properties`: what librdkafka checks in the send itself is all that happens.
    fn outbox_to_nowhere(
        settings: &KafkaSettings,
        shutdown: &Shutdown,
        properties: &[(&str, &str)],
    ) -> Outbox {
        let mut config = rdkafka::ClientConfig::new();
        config
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("message.timeout.ms", "3600000");
        for (key, value) in properties {
            config.set(*key, *value);
        }
        Outbox::new(&config, settings, Arc::new(Telemetry::new()), shutdown).unwrap()
    }

    /// Sends the outbox's records, and each refused one again (cut to fit), until the
    /// producer takes them all; how many refusals that took.
    fn send_until_taken(outbox: &mut Outbox) -> usize {
        outbox.send_all();
        let mut refusals = 0;
        loop {
            let failed = outbox.take_failed();
            if failed.is_empty() {
                return refusals;
            }
            refusals += 1;
            assert!(refusals < 30, "still refused after {refusals} cuts");
            let indexes: Vec<usize> = failed.iter().map(|(i, _)| *i).collect();
            outbox.send(&indexes);
        }
    }

    /// The value of header `name` of `r`, as text.
    fn header_of(r: &Record, name: &str) -> Option<String> {
        r.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    #[test]
    fn a_dead_letter_too_large_is_cut_until_the_producer_takes_it() {
        // librdkafka refuses a message over `message.max.bytes` in the send itself, as
        // the broker refuses one over the topic's limit: a huge key, a payload over the
        // limit and large source headers, with a limit under the first cut's 64 KiB.
        let settings = KafkaSettings::default();
        let limit = [("message.max.bytes", "20000")];
        let mut outbox = outbox_to_nowhere(&settings, &Shutdown::new(), &limit);
        outbox.push(Record {
            sink: Sink::DeadLetter,
            partition: None,
            key: vec![b'k'; 50_000],
            payload: Payload::new(vec![b'p'; 100_000]),
            headers: vec![(DLQ_REASON, b"oversized".to_vec().into())],
            source_headers: vec![("big".to_string(), Some(vec![b'h'; 8_000]))],
            source_ms: None,
        });
        // 64 KiB, then 32, then 16: taken.
        assert_eq!(send_until_taken(&mut outbox), 3);
        let r = &outbox.records[0];
        assert_eq!(r.payload.len(), 16 * 1024);
        assert_eq!(r.key.len(), DLQ_KEY_TRUNCATE_TO);
        assert!(r.source_headers.is_empty());
        assert_eq!(header_of(r, DLQ_TRUNCATED_FROM).as_deref(), Some("100000"));
        assert_eq!(
            header_of(r, DLQ_KEY_TRUNCATED_FROM).as_deref(),
            Some("50000")
        );
        assert_eq!(
            header_of(r, DLQ_SOURCE_HEADERS_DROPPED).as_deref(),
            Some("1")
        );
        assert_eq!(header_of(r, DLQ_REASON).as_deref(), Some("oversized"));
        // Dropping the producer would wait on the silent broker.
        std::mem::forget(outbox);
    }

    #[test]
    fn a_small_dead_letter_still_refused_loses_its_payload_then_its_source_headers() {
        // librdkafka's smallest limit: no part is over the first cut's sizes, and the
        // message is still too large.
        let settings = KafkaSettings::default();
        let limit = [("message.max.bytes", "1000")];
        let mut outbox = outbox_to_nowhere(&settings, &Shutdown::new(), &limit);
        outbox.push(Record {
            sink: Sink::DeadLetter,
            partition: None,
            key: vec![b'k'; 300],
            payload: Payload::new(vec![b'p'; 3_000]),
            headers: vec![(DLQ_REASON, b"invalid_json".to_vec().into())],
            source_headers: vec![("h".to_string(), Some(vec![b'h'; 900]))],
            source_ms: None,
        });
        let refusals = send_until_taken(&mut outbox);
        let r = &outbox.records[0];
        assert!(
            r.payload.is_empty() && r.source_headers.is_empty(),
            "{refusals} cuts"
        );
        assert_eq!(r.key.len(), 300, "the key fits once the rest is gone");
        assert_eq!(header_of(r, DLQ_TRUNCATED_FROM).as_deref(), Some("3000"));
        assert_eq!(
            header_of(r, DLQ_SOURCE_HEADERS_DROPPED).as_deref(),
            Some("1")
        );
        assert_eq!(header_of(r, DLQ_KEY_TRUNCATED_FROM), None);
        std::mem::forget(outbox);
    }

    #[test]
    fn a_full_producer_queue_gives_up_at_the_shutdown_deadline() {
        // A broker that never answers and a queue with room for one record: the second
        // waits for room that only `message.timeout.ms` (an hour here) would make.
        let settings = KafkaSettings {
            shutdown_deadline: Duration::from_millis(50),
            ..KafkaSettings::default()
        };
        let shutdown = Shutdown::new();
        let room_for_one = [("queue.buffering.max.messages", "1")];
        let mut outbox = outbox_to_nowhere(&settings, &shutdown, &room_for_one);
        for _ in 0..3 {
            outbox.push(Record {
                sink: Sink::Warning,
                partition: None,
                key: b"s".to_vec(),
                payload: Payload::new(b"{}".to_vec()),
                headers: Vec::new(),
                source_headers: Vec::new(),
                source_ms: None,
            });
        }
        shutdown.trigger();
        std::thread::sleep(Duration::from_millis(60));
        let (done, finished) = std::sync::mpsc::channel();
        let sender = std::thread::spawn(move || {
            outbox.send_all();
            let failed = outbox.take_failed();
            done.send(failed.len()).unwrap();
            // Dropping the producer would wait on the silent broker: the test ends without.
            std::mem::forget(outbox);
        });
        let failed = finished
            .recv_timeout(Duration::from_secs(30))
            .expect("send_all returned past the deadline");
        assert_eq!(failed, 2, "the records without room failed");
        sender.join().unwrap();
    }
}

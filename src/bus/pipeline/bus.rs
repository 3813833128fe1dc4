//! The two seams between the batch recipe and the bus, as traits: [`Input`], what a
//! worker asks of its group's consumer (commit offsets, positions, cached watermarks,
//! a seek back to the committed offsets), and [`Transport`], what the outbox asks of its
//! producer (hand a record over, serve delivery reports, transactions). Kafka implements
//! both here (`BaseConsumer`, [`KafkaTransport`]); the unit tests' in-memory bus
//! (`memory`) implements them too, so the recipe and its crash windows run without a
//! broker. Here too: the [`DeliveryTracker`] every transport hands its delivery reports
//! to, and [`seek_to_committed`], a Kafka consumer moved back to its group's offsets.
//!
//! Guarantees: the Kafka implementations are the calls the pipeline made before the
//! seams existed, one for one (no new request, no new wait); delivery reports reach the
//! [`DeliveryTracker`] the same way from either implementation.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, ConsumerGroupMetadata,
};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};
use rustc_hash::FxHashMap;
use tracing::{info, warn};

use super::backoff::Backoff;
use super::lock;
use super::PipelineError;
use crate::bus::kafka::cached_watermarks;
use crate::bus::kafka::settings::KafkaSettings;
use crate::telemetry::Telemetry;

/// What a worker asks of its consumer group's consumer, besides polling.
pub trait Input {
    /// Commits the group's offsets (`CommitMode::Sync`: waits for the broker's answer).
    fn commit(&self, offsets: &TopicPartitionList, mode: CommitMode) -> KafkaResult<()>;
    /// Where the next poll reads, per assigned partition (`None`: not known).
    fn positions(&self) -> Option<TopicPartitionList>;
    /// A partition's low and high watermarks as last seen (no request; `None` before the
    /// first fetch).
    fn cached_watermarks(&self, topic: &str, partition: i32) -> Option<(Option<i64>, i64)>;
    /// Moves every assigned partition but those in `revoking` back to its committed
    /// offset (a dropped batch is read again), retrying with `backoff`.
    fn seek_to_committed(
        &self,
        revoking: &[i32],
        backoff: &mut Backoff,
    ) -> Result<(), PipelineError>;
    /// The group's metadata, which a transaction's offsets are sent with (`None`: not a
    /// Kafka group).
    fn group_metadata(&self) -> Option<ConsumerGroupMetadata>;
    /// Whether `partition` of `topic` is assigned to this member (`true` when the client
    /// cannot say).
    fn is_assigned(&self, topic: &str, partition: i32) -> bool;
}

impl<C: ConsumerContext> Input for BaseConsumer<C> {
    fn commit(&self, offsets: &TopicPartitionList, mode: CommitMode) -> KafkaResult<()> {
        Consumer::commit(self, offsets, mode)
    }

    fn positions(&self) -> Option<TopicPartitionList> {
        self.position().ok()
    }

    fn is_assigned(&self, topic: &str, partition: i32) -> bool {
        self.assignment()
            .map_or(true, |a| a.find_partition(topic, partition).is_some())
    }

    fn cached_watermarks(&self, topic: &str, partition: i32) -> Option<(Option<i64>, i64)> {
        cached_watermarks(self.client(), topic, partition)
    }

    fn seek_to_committed(
        &self,
        revoking: &[i32],
        backoff: &mut Backoff,
    ) -> Result<(), PipelineError> {
        seek_to_committed(self, revoking, backoff)
    }

    fn group_metadata(&self) -> Option<ConsumerGroupMetadata> {
        Consumer::group_metadata(self)
    }
}

/// One record as the outbox hands it over.
pub struct Outgoing<'a> {
    pub topic: &'a str,
    /// An explicit partition (else the key's).
    pub partition: Option<i32>,
    pub key: &'a [u8],
    /// `None`: no value at all (a changelog tombstone).
    pub payload: Option<&'a [u8]>,
    pub headers: Option<OwnedHeaders>,
}

/// What the tracker gets back with a record's delivery report: the outbox's epoch, the
/// record's index in it, and the Kafka timestamp of the event behind it (findings).
pub type Report = Box<(u64, usize, Option<i64>)>;

/// What the outbox asks of its producer. Delivery reports are handed to
/// [`Transport::tracker`] while [`Transport::poll`] runs.
pub trait Transport: Send {
    /// Hands one record over (`Err`: refused at once, e.g. a full queue; nothing sent).
    fn send(&self, record: Outgoing<'_>, report: Report) -> KafkaResult<()>;
    /// Serves delivery reports for up to `timeout`.
    fn poll(&self, timeout: Duration);
    /// Records handed over whose delivery report has not been served yet (for Kafka,
    /// with the client's other events waiting to be served).
    fn in_flight(&self) -> usize;
    fn tracker(&self) -> &DeliveryTracker;
    fn init_transactions(&self, timeout: Duration) -> KafkaResult<()>;
    fn begin_transaction(&self) -> KafkaResult<()>;
    /// Adds the group's `offsets` to the open transaction.
    fn send_offsets_to_transaction(
        &self,
        offsets: &TopicPartitionList,
        input: &dyn Input,
        timeout: Duration,
    ) -> KafkaResult<()>;
    fn commit_transaction(&self, timeout: Duration) -> KafkaResult<()>;
    fn abort_transaction(&self, timeout: Duration) -> KafkaResult<()>;
}

/// A Kafka producer as the outbox's transport.
pub struct KafkaTransport {
    producer: BaseProducer<Reports>,
}

impl KafkaTransport {
    pub fn new(config: &ClientConfig, tracker: DeliveryTracker) -> KafkaResult<KafkaTransport> {
        Ok(KafkaTransport {
            producer: config.create_with_context(Reports(tracker))?,
        })
    }
}

/// The producer's context: hands each delivery report to the tracker.
pub struct Reports(DeliveryTracker);

impl ClientContext for Reports {
    fn error(&self, error: KafkaError, reason: &str) {
        warn!(client = "producer", %error, reason, "kafka client error");
    }
}

impl ProducerContext for Reports {
    type DeliveryOpaque = Report;
    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Report) {
        let result = match result {
            Ok(m) => Ok((m.topic(), m.partition(), m.offset())),
            Err((e, _)) => Err(e.clone()),
        };
        self.0.report(result, *opaque);
    }
}

/// How long [`KafkaTransport::poll`] sleeps between polls that served no report: short
/// beside a broker's acknowledgement (milliseconds), long enough that waiting costs no core.
const REPORT_WAIT: Duration = Duration::from_micros(250);

/// The most librdkafka events one [`KafkaTransport::serve_reports`] serves: reports come
/// far slower than they are served, so this only bounds a call under a flood.
const REPORT_EVENTS_MAX: usize = 4096;

impl KafkaTransport {
    /// Serves every delivery report that has come, without waiting; `true` when there
    /// were any. librdkafka hands reports over as one event per message set (a
    /// partition's records of one produce request), and rdkafka's `poll` without a wait
    /// serves one event a call: a batch's records over many partitions were served one
    /// partition's set per call, so a batch in flight looked unacknowledged long after
    /// the broker had acknowledged it. The producer's count of what is in flight
    /// (`rd_kafka_outq_len`: its records not yet reported, plus the events waiting to be
    /// served) changes with every event served, so a poll that leaves it unchanged found
    /// the queue empty.
    fn serve_reports(&self) -> bool {
        let mut served = false;
        let mut before = self.in_flight();
        for _ in 0..REPORT_EVENTS_MAX {
            self.producer.poll(Duration::ZERO);
            let after = self.in_flight();
            if after == before {
                break;
            }
            served = true;
            before = after;
        }
        served
    }
}

impl Transport for KafkaTransport {
    fn send(&self, r: Outgoing<'_>, report: Report) -> KafkaResult<()> {
        let mut record = BaseRecord::with_opaque_to(r.topic, report).key(r.key);
        if let Some(payload) = r.payload {
            record = record.payload(payload);
        }
        if let Some(p) = r.partition {
            record = record.partition(p);
        }
        if let Some(h) = r.headers {
            record = record.headers(h);
        }
        self.producer.send(record).map_err(|(e, _)| e)
    }

    /// Serves every report that has come without waiting, then sleeps in steps of
    /// [`REPORT_WAIT`] until a report is served or `timeout` has passed. rdkafka's own
    /// `poll(t)` serves reports until `t` has passed and hands librdkafka its wait in
    /// whole milliseconds rounded down: with under a millisecond left it does not wait at
    /// all, so the outbox's `poll(1 ms)` loop kept a core busy for as long as the broker
    /// took.
    fn poll(&self, timeout: Duration) {
        let until = Instant::now() + timeout;
        loop {
            let served = self.serve_reports();
            let now = Instant::now();
            if served || now >= until {
                return;
            }
            std::thread::sleep(REPORT_WAIT.min(until - now));
        }
    }

    fn in_flight(&self) -> usize {
        self.producer.in_flight_count().max(0) as usize
    }

    fn tracker(&self) -> &DeliveryTracker {
        &self.producer.context().0
    }

    fn init_transactions(&self, timeout: Duration) -> KafkaResult<()> {
        self.producer.init_transactions(timeout)
    }

    fn begin_transaction(&self) -> KafkaResult<()> {
        self.producer.begin_transaction()
    }

    fn send_offsets_to_transaction(
        &self,
        offsets: &TopicPartitionList,
        input: &dyn Input,
        timeout: Duration,
    ) -> KafkaResult<()> {
        let group = input.group_metadata().ok_or(KafkaError::Subscription(
            "no consumer group metadata".into(),
        ))?;
        self.producer
            .send_offsets_to_transaction(offsets, &group, timeout)
    }

    fn commit_transaction(&self, timeout: Duration) -> KafkaResult<()> {
        self.producer.commit_transaction(timeout)
    }

    fn abort_transaction(&self, timeout: Duration) -> KafkaResult<()> {
        self.producer.abort_transaction(timeout)
    }
}

/// Collects failed deliveries (the opaque is the record's epoch and its number in the
/// outbox, counted from the outbox's first record), the records sent and not yet
/// acknowledged, and the highest acknowledged changelog offset per partition. Reports of an earlier
/// epoch (records given up by [`Outbox::clear`] while in flight) are ignored: their
/// indexes refer to nothing now, and their changelog offsets to no stored batch.
#[derive(Default)]
pub struct DeliveryTracker {
    pub(super) failed: Mutex<Vec<(usize, KafkaError)>>,
    /// The numbers of the records handed to the producer and not acknowledged (a failed
    /// one stays until it is sent again and acknowledged).
    pub(super) unacknowledged: Mutex<BTreeSet<usize>>,
    pub(super) changelog_topic: String,
    pub(super) changelog_offsets: Mutex<FxHashMap<i32, i64>>,
    pub(super) epoch: AtomicU64,
    /// Observes each finding's produce → acknowledged latency as its report arrives.
    pub(super) finding_latency: Option<prometheus::Histogram>,
}

impl DeliveryTracker {
    /// The tracker of an outbox that writes to `settings`' topics.
    pub fn of(settings: &KafkaSettings, telemetry: &Telemetry) -> DeliveryTracker {
        DeliveryTracker {
            changelog_topic: settings.changelog_topic.clone(),
            finding_latency: Some(telemetry.metrics.produce_to_finding_latency.clone()),
            ..DeliveryTracker::default()
        }
    }

    /// One record's delivery report: where it landed, or why it failed.
    pub fn report(
        &self,
        result: Result<(&str, i32, i64), KafkaError>,
        report: (u64, usize, Option<i64>),
    ) {
        let (epoch, index, source_ms) = report;
        if epoch != self.epoch.load(Ordering::Acquire) {
            return;
        }
        if let (Ok(_), Some(source), Some(h)) = (&result, source_ms, &self.finding_latency) {
            h.observe((crate::contract::event::wall_ms() - source).max(0) as f64 / 1e3);
        }
        match result {
            Err(e) => lock(&self.failed).push((index, e)),
            Ok((topic, partition, offset)) => {
                lock(&self.unacknowledged).remove(&index);
                if topic == self.changelog_topic {
                    let mut offsets = lock(&self.changelog_offsets);
                    let o = offsets.entry(partition).or_insert(offset);
                    *o = (*o).max(offset);
                }
            }
        }
    }
}

/// How long one read of the group's committed offsets may block before it is retried
/// (as long as one transaction call may).
const COMMITTED_OFFSETS_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`seek_to_committed`] keeps retrying before the run ends instead: well
/// inside `max.poll.interval.ms` (it does not poll meanwhile), long enough for a group
/// coordinator to move.
const REWIND_BUDGET: Duration = Duration::from_secs(30);

/// Seeks every assigned partition but those in `revoking` back to its committed offset
/// (the start when none is committed): after a fenced transaction the batch is dropped
/// and read again from there. A partition the group let us keep would otherwise go on
/// past the dropped batch, whose events would then never be applied: so a failure is
/// retried with `backoff`, and past [`REWIND_BUDGET`] the run ends with an error (a
/// restart resumes from the committed offsets). Nothing to do at a stop (the restart
/// does it) or for partitions being revoked (their next owner starts from there).
pub fn seek_to_committed<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    revoking: &[i32],
    backoff: &mut Backoff,
) -> Result<(), PipelineError> {
    let started = std::time::Instant::now();
    loop {
        if backoff.stopping() {
            info!("stopping: the dropped batch is read again from the committed offsets at the next start");
            return Ok(());
        }
        let error = match seek_back(consumer, revoking) {
            Ok(()) => return Ok(()),
            Err(error) => error,
        };
        if started.elapsed() >= REWIND_BUDGET {
            return Err(PipelineError::Rewind(error));
        }
        warn!(%error, backoff_ms = backoff.delay_ms(), "cannot move back to the committed offsets; retrying");
        backoff.sleep();
    }
}

fn seek_back<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    revoking: &[i32],
) -> Result<(), KafkaError> {
    let mut kept = TopicPartitionList::new();
    for e in consumer.assignment()?.elements() {
        if !revoking.contains(&e.partition()) {
            kept.add_partition(e.topic(), e.partition());
        }
    }
    if kept.count() == 0 {
        return Ok(());
    }
    let committed = consumer.committed_offsets(kept, COMMITTED_OFFSETS_TIMEOUT)?;
    for e in committed.elements() {
        // A partition's own fetch error comes with an invalid offset: not "none committed".
        e.error()?;
        let to = match e.offset() {
            Offset::Offset(o) => Offset::Offset(o),
            _ => Offset::Beginning,
        };
        consumer.seek(e.topic(), e.partition(), to, Duration::from_secs(10))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::kafka::embedded::EmbeddedBroker;
    use crate::shutdown::Shutdown;
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::Message;

    /// (partition, offset) of the next `n` messages `consumer` reads.
    fn read(consumer: &BaseConsumer, n: usize) -> Vec<(i32, i64)> {
        let mut got = Vec::new();
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while got.len() < n && std::time::Instant::now() < until {
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                let m = m.expect("a message");
                got.push((m.partition(), m.offset()));
            }
        }
        got.sort();
        got
    }

    /// One poll without a wait serves every report that has come, not one partition's
    /// (librdkafka hands them over as an event per message set).
    #[test]
    fn one_poll_serves_every_report_that_has_come() {
        let partitions = 16;
        let broker = EmbeddedBroker::start(&["out"], partitions).expect("mock cluster");
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", broker.bootstrap_servers())
            .set("linger.ms", "1");
        let transport = KafkaTransport::new(&config, DeliveryTracker::default()).expect("producer");
        let records = 20 * partitions as usize;
        for number in 0..records {
            lock(&transport.tracker().unacknowledged).insert(number);
            let record = Outgoing {
                topic: "out",
                partition: Some(number as i32 % partitions),
                key: b"k",
                payload: Some(b"v"),
                headers: None,
            };
            transport
                .send(record, Box::new((0, number, None)))
                .expect("queued");
        }
        // Polls at a batch's pace until every record is reported: once the broker has
        // acknowledged them all, one poll serves them all.
        let mut polls = 0;
        let until = Instant::now() + Duration::from_secs(30);
        while !lock(&transport.tracker().unacknowledged).is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(250));
            transport.poll(Duration::ZERO);
            polls += 1;
        }
        assert!(
            lock(&transport.tracker().unacknowledged).is_empty(),
            "every record reported"
        );
        assert!(
            polls < partitions as usize,
            "{polls} polls served the reports of {records} records over {partitions} partitions"
        );
        assert!(lock(&transport.tracker().failed).is_empty());
    }

    /// After a fenced transaction the dropped batch is read again: each assigned partition
    /// goes back to its committed offset, one without any to its start.
    #[test]
    fn seek_to_committed_reads_the_dropped_batch_again() {
        let broker = EmbeddedBroker::start(&["input"], 2).expect("mock cluster");
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", broker.bootstrap_servers())
            .create()
            .expect("producer");
        for partition in 0..2 {
            for i in 0..5 {
                let payload = format!("{partition}-{i}");
                producer
                    .send(
                        BaseRecord::<(), _>::to("input")
                            .payload(&payload)
                            .partition(partition),
                    )
                    .expect("queued");
            }
        }
        producer.flush(Duration::from_secs(30)).expect("produced");
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", broker.bootstrap_servers())
            .set("group.id", "rewind")
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        let mut all = TopicPartitionList::new();
        for partition in 0..2 {
            all.add_partition_offset("input", partition, Offset::Beginning)
                .expect("partition");
        }
        consumer.assign(&all).expect("assigned");
        assert_eq!(read(&consumer, 10).len(), 10);
        let mut committed = TopicPartitionList::new();
        committed
            .add_partition_offset("input", 0, Offset::Offset(3))
            .expect("partition");
        Consumer::commit(&consumer, &committed, CommitMode::Sync).expect("committed");

        let shutdown = Shutdown::new();
        let mut backoff = Backoff::new(&KafkaSettings::default(), &shutdown);
        seek_to_committed(&consumer, &[], &mut backoff).expect("moved back");
        let again = read(&consumer, 7);
        assert_eq!(
            again,
            [(0, 3), (0, 4), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4)]
        );

        // A partition being revoked stays where it is (its next owner starts from the
        // committed offset): partition 1 is read to its end above, so only partition 0
        // comes again.
        seek_to_committed(&consumer, &[1], &mut backoff).expect("moved back");
        assert_eq!(read(&consumer, 2), [(0, 3), (0, 4)]);
        assert!(consumer.poll(Duration::from_millis(500)).is_none());
        // At a stop nothing moves: the next start reads from the committed offsets.
        shutdown.trigger();
        seek_to_committed(&consumer, &[], &mut backoff).expect("nothing to do");
        assert!(consumer.poll(Duration::from_millis(500)).is_none());
    }
}

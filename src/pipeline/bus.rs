//! The two seams between the batch recipe and the bus, as traits: [`Input`], what a
//! worker asks of its group's consumer (commit offsets, positions, cached watermarks,
//! a seek back to the committed offsets), and [`Transport`], what the outbox asks of its
//! producer (hand a record over, serve delivery reports, transactions). Kafka implements
//! both here (`BaseConsumer`, [`KafkaTransport`]); the unit tests' in-memory bus
//! (`memory`) implements them too, so the recipe and its crash windows run without a
//! broker.
//!
//! Guarantees: the Kafka implementations are the calls the pipeline made before the
//! seams existed, one for one (no new request, no new wait); delivery reports reach the
//! [`DeliveryTracker`] the same way from either implementation.

use std::time::Duration;

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, ConsumerGroupMetadata,
};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext, Message, TopicPartitionList};
use tracing::warn;

use super::backoff::Backoff;
use super::commit::seek_to_committed;
use super::outbox::DeliveryTracker;
use super::PipelineError;
use crate::kafka::cached_watermarks;

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
}

impl<C: ConsumerContext> Input for BaseConsumer<C> {
    fn commit(&self, offsets: &TopicPartitionList, mode: CommitMode) -> KafkaResult<()> {
        Consumer::commit(self, offsets, mode)
    }

    fn positions(&self) -> Option<TopicPartitionList> {
        self.position().ok()
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
    /// Records handed over whose delivery report has not come yet.
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

    fn poll(&self, timeout: Duration) {
        self.producer.poll(timeout);
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

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
//! seams existed, one for one (no new request, no new wait), but for an asynchronous
//! offset commit, whose answer now comes back through the consumer's poll (its failures
//! kept for the worker to send again, [`CommitFailures`]); delivery reports reach the
//! [`DeliveryTracker`] the same way from either implementation. A record's value is not
//! copied into the producer: librdkafka reads it in place, and a reference to it
//! ([`Payload`]) travels with the record as its delivery opaque, so it lives until the
//! record's delivery report is served, whatever the outbox does with the record meanwhile.

use std::borrow::Cow;
use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, ConsumerGroupMetadata,
};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::IntoOpaque;
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};
use rustc_hash::FxHashMap;
use tracing::{info, warn};

use super::backoff::Backoff;
use super::lock;
use super::unacknowledged::Unacknowledged;
use super::PipelineError;
use crate::bus::kafka::cached_watermarks;
use crate::telemetry::Telemetry;

/// What a worker asks of its consumer group's consumer, besides polling.
pub trait Input {
    /// Commits the group's offsets (`CommitMode::Sync`: waits for the broker's answer;
    /// `Async`: a failure answered later is kept for [`Input::take_failed_commits`]).
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
    /// The offsets whose commit failed after it was sent, since the last call (an
    /// asynchronous commit's answer comes back inside a later poll).
    fn take_failed_commits(&self) -> Vec<FailedCommit>;
}

/// An offset commit the group's coordinator refused (a rebalance in progress, a generation
/// gone by) or that did not reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedCommit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// Why, as librdkafka says (`None`: it did not say).
    pub error: Option<RDKafkaErrorCode>,
}

/// Whether a commit failed with `error` because the group was changing (a rebalance, a
/// generation gone by, a coordinator moving), which the next commit after it settles goes
/// through; not a refusal that would meet every commit (authorization, a fenced member).
pub fn refused_while_the_group_changes(error: Option<RDKafkaErrorCode>) -> bool {
    use RDKafkaErrorCode as E;
    matches!(
        error,
        Some(
            E::RebalanceInProgress
                | E::IllegalGeneration
                | E::UnknownMemberId
                | E::NotCoordinator
                | E::CoordinatorNotAvailable
                | E::CoordinatorLoadInProgress
                | E::RequestTimedOut
        )
    )
}

/// `offsets` (topic, partition, offset) as a list to commit.
pub fn offsets_list<'t>(
    offsets: impl IntoIterator<Item = (&'t str, i32, i64)>,
) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for (topic, partition, offset) in offsets {
        let _ = list.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset));
    }
    list
}

/// How often offsets whose commit failed are sent again, at most (while a rebalance
/// refuses them, once a second), but for a revoke's or a stop's last try.
pub const OWED_COMMIT_RETRY: Duration = Duration::from_secs(1);

/// An offset sent to be committed ([`OwedCommits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentCommit {
    pub offset: i64,
    /// Its commit failed, and no later offset of its partition was sent since.
    pub owed: bool,
}

/// The last offset sent to be committed per partition (keyed by `K`), which of them a
/// refusal left owed, and when owed ones were last sent again: what the pipeline's workers
/// and the OTLP ingest send again, so that a partition quiet after a refused commit does
/// not keep the group's offset behind.
#[derive(Debug)]
pub struct OwedCommits<K> {
    sent: FxHashMap<K, SentCommit>,
    sent_again_at: Option<Instant>,
    /// Why a commit failed since owed offsets were last sent, when not because the group
    /// was changing.
    error: Option<String>,
}

impl<K> Default for OwedCommits<K> {
    fn default() -> Self {
        OwedCommits {
            sent: FxHashMap::default(),
            sent_again_at: None,
            error: None,
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone> OwedCommits<K> {
    /// `offset` sent for `key`'s partition, owed when its commit `failed` at once.
    pub fn note_sent(&mut self, key: K, offset: i64, failed: bool) {
        self.sent.insert(
            key,
            SentCommit {
                offset,
                owed: failed,
            },
        );
    }

    /// A commit librdkafka reports `failed`, of `key`'s partition (`None`: not one of
    /// ours): owed unless a later offset of it has been sent since.
    pub fn note_failed(&mut self, key: Option<K>, failed: &FailedCommit) {
        if !refused_while_the_group_changes(failed.error) {
            let error = failed
                .error
                .map_or("unknown".to_string(), |e| e.to_string());
            self.error.get_or_insert(error);
        }
        if let Some(sent) = key.and_then(|k| self.sent.get_mut(&k)) {
            sent.owed |= sent.offset == failed.offset;
        }
    }

    /// Whether owed offsets are to be sent again now: some are owed, and none were sent
    /// again within [`OWED_COMMIT_RETRY`] (unless `settle`: a revoke's or a stop's last
    /// try).
    pub fn due(&self, settle: bool) -> bool {
        let recently = self
            .sent_again_at
            .is_some_and(|at| at.elapsed() < OWED_COMMIT_RETRY);
        (settle || !recently) && self.sent.values().any(|sent| sent.owed)
    }

    /// The owed offsets of the partitions `held` says are still ours, each no longer owed
    /// (sent again now), and why a commit failed if not the group changing.
    pub fn take_owed(&mut self, held: impl Fn(&K) -> bool) -> (Vec<(K, i64)>, Option<String>) {
        self.sent_again_at = Some(Instant::now());
        (self.take(|sent| sent.owed, held), self.error.take())
    }

    /// The last offset sent of every partition `held` says is still ours, each no longer
    /// owed.
    pub fn take_last(&mut self, held: impl Fn(&K) -> bool) -> Vec<(K, i64)> {
        self.take(|_| true, held)
    }

    fn take(
        &mut self,
        which: impl Fn(&SentCommit) -> bool,
        held: impl Fn(&K) -> bool,
    ) -> Vec<(K, i64)> {
        let mut picked = Vec::new();
        for (key, sent) in &mut self.sent {
            if which(sent) && held(key) {
                picked.push((key.clone(), sent.offset));
                sent.owed = false;
            }
        }
        picked
    }

    /// Forgets the partitions `keep` says are no longer ours (their next owner commits
    /// them: an offset of ours sent later could take the group's offset back).
    pub fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        self.sent.retain(|k, _| keep(k));
    }

    pub fn clear(&mut self) {
        self.sent.clear();
    }
}

/// A consumer's context that keeps the offset commits that failed, as librdkafka reports
/// them (`ConsumerContext::commit_callback`, inside a poll), for [`Input`].
pub trait CommitFailures {
    fn take_failed_commits(&self) -> Vec<FailedCommit>;
}

/// The failed commits among those librdkafka reports in `offsets` with `result`: every
/// offset when the commit failed, otherwise those with an error of their own.
pub fn failed_commits(result: &KafkaResult<()>, offsets: &TopicPartitionList) -> Vec<FailedCommit> {
    offsets
        .elements()
        .iter()
        .filter(|e| result.is_err() || e.error().is_err())
        .filter_map(|e| match e.offset() {
            Offset::Offset(offset) => Some(FailedCommit {
                topic: e.topic().to_string(),
                partition: e.partition(),
                offset,
                error: e
                    .error()
                    .err()
                    .or_else(|| result.clone().err())
                    .and_then(|e| e.rdkafka_error_code()),
            }),
            _ => None,
        })
        .collect()
}

/// Sends `offsets` to be committed without waiting, the answer to come back on the
/// consumer's own queue, where a poll hands it to the context's `commit_callback`. An
/// asynchronous `rd_kafka_commit` (rdkafka's `CommitMode::Async`) sends its answer only
/// to a configured `offset_commit_cb`, which rdkafka does not set: a failure was only
/// logged (`COMMITFAIL`), and nothing could send the offsets again.
fn commit_answered_in_poll<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    offsets: &TopicPartitionList,
) -> KafkaResult<()> {
    let rk = consumer.client().native_ptr();
    // SAFETY: a live client and offsets list, which librdkafka copies. The reference to
    // the consumer's queue taken here is given back at once: the commit's reply holds its
    // own until it is enqueued.
    let err = unsafe {
        let queue = rdsys::rd_kafka_queue_get_consumer(rk);
        if queue.is_null() {
            return Consumer::commit(consumer, offsets, CommitMode::Async);
        }
        let err = rdsys::rd_kafka_commit_queue(rk, offsets.ptr(), queue, None, ptr::null_mut());
        rdsys::rd_kafka_queue_destroy(queue);
        err
    };
    if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        Ok(())
    } else {
        Err(KafkaError::ConsumerCommit(err.into()))
    }
}

impl<C: ConsumerContext + CommitFailures> Input for BaseConsumer<C> {
    fn take_failed_commits(&self) -> Vec<FailedCommit> {
        self.context().take_failed_commits()
    }

    fn commit(&self, offsets: &TopicPartitionList, mode: CommitMode) -> KafkaResult<()> {
        match mode {
            CommitMode::Sync => Consumer::commit(self, offsets, mode),
            CommitMode::Async => commit_answered_in_poll(self, offsets),
        }
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
    pub payload: Option<&'a Payload>,
    /// A dead letter's headers of the message it stands for (a value may be missing),
    /// written first…
    pub source_headers: &'a [(String, Option<Vec<u8>>)],
    /// …then the record's own.
    pub headers: &'a [(&'static str, Cow<'static, [u8]>)],
}

impl Outgoing<'_> {
    /// Every header, in the order written: the source's, then the record's own.
    pub fn each_header(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)> {
        let source = self.source_headers.iter();
        let own = self.headers.iter();
        source
            .map(|(name, value)| (name.as_str(), value.as_deref()))
            .chain(own.map(|(name, value)| (*name, Some(value.as_ref()))))
    }
}

/// A record's value, shared instead of copied: the outbox keeps one reference (to send
/// the record again after a failure) and a record in flight another, which librdkafka
/// hands back with the record's delivery report (see [`KafkaTransport::send`]). A
/// changelog record's is its store batch's state, the same allocation the store reads
/// (the frame written into the room before the state: `engine::store::StateBytes`).
pub type Payload = std::sync::Arc<Vec<u8>>;

/// What the tracker gets back with a record's delivery report, as the outbox handed it
/// over with the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The outbox's epoch when it was sent.
    pub epoch: u64,
    /// The record's number in the outbox.
    pub index: usize,
    /// The Kafka timestamp of the event behind it (findings).
    pub source_ms: Option<i64>,
    /// A changelog record, whose acknowledged offsets the tracker keeps: told by the
    /// record's sink, not read back from the report's topic name (one report a state
    /// written, at a million open sessions one an event).
    pub changelog: bool,
}

#[cfg(test)]
impl Report {
    /// The report of record `index` of epoch 0, no finding's nor the changelog's.
    pub(crate) fn numbered(index: usize) -> Report {
        Report {
            epoch: 0,
            index,
            source_ms: None,
            changelog: false,
        }
    }
}

/// A record's delivery opaque: its report, and the reference to its value that keeps the
/// value alive while librdkafka reads it in place (dropped with the opaque, once the
/// report is served).
pub struct InFlight {
    report: Report,
    _value: Option<Payload>,
}

/// Where an acknowledged record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acknowledged {
    pub partition: i32,
    pub offset: i64,
}

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
    /// Why the producer failed fatally, once it has (librdkafka's fatal error: an
    /// idempotent producer whose sequence the broker no longer follows): from then on it
    /// delivers nothing, and every record handed over fails.
    fn fatal_error(&self) -> Option<String>;
}

/// A Kafka producer as the outbox's transport.
pub struct KafkaTransport {
    producer: BaseProducer<Reports>,
    /// librdkafka's handle of each topic sent to, by name (a few: the outputs, the dead
    /// letters, the changelog). A produce call given the handle skips the lookup by name,
    /// which takes the client's lock for writing on every record.
    topics: Mutex<Vec<(String, TopicHandle)>>,
}

/// A topic handle of librdkafka's, destroyed with the transport.
struct TopicHandle(*mut rdsys::rd_kafka_topic_t);

// SAFETY: librdkafka's topic handles may be used and destroyed from any thread.
unsafe impl Send for TopicHandle {}

impl KafkaTransport {
    pub fn new(config: &ClientConfig, tracker: DeliveryTracker) -> KafkaResult<KafkaTransport> {
        Ok(KafkaTransport {
            producer: config.create_with_context(Reports(tracker))?,
            topics: Mutex::new(Vec::new()),
        })
    }

    /// The handle of `topic`, made at its first record.
    fn topic(&self, topic: &str) -> KafkaResult<*mut rdsys::rd_kafka_topic_t> {
        let mut topics = lock(&self.topics);
        if let Some((_, handle)) = topics.iter().find(|(name, _)| name == topic) {
            return Ok(handle.0);
        }
        let name = CString::new(topic)?;
        // SAFETY: a live client, a C string it copies, and the default topic settings.
        let handle = unsafe {
            rdsys::rd_kafka_topic_new(
                self.producer.client().native_ptr(),
                name.as_ptr(),
                ptr::null_mut(),
            )
        };
        if handle.is_null() {
            // SAFETY: reads the calling thread's last librdkafka error.
            let err = unsafe { rdsys::rd_kafka_last_error() };
            return Err(KafkaError::MessageProduction(err.into()));
        }
        topics.push((topic.to_string(), TopicHandle(handle)));
        Ok(handle)
    }
}

impl Drop for KafkaTransport {
    fn drop(&mut self) {
        for (_, handle) in lock(&self.topics).drain(..) {
            // SAFETY: each handle is ours and destroyed once, before the client (a field,
            // dropped after this); records still queued hold references of their own.
            unsafe { rdsys::rd_kafka_topic_destroy(handle.0) };
        }
    }
}

/// The producer's context: hands each delivery report to the tracker.
pub struct Reports(DeliveryTracker);

impl ClientContext for Reports {
    fn error(&self, error: KafkaError, reason: &str) {
        crate::bus::kafka::log_client_error("producer", &error, reason);
    }
}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<InFlight>;
    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Box<InFlight>) {
        let result = match result {
            Ok(m) => Ok(Acknowledged {
                partition: m.partition(),
                offset: m.offset(),
            }),
            Err((e, _)) => Err(e.clone()),
        };
        self.0.report(result, opaque.report);
        // The opaque drops here, and with it the reference that kept the value alive:
        // librdkafka is done with the record.
    }
}

/// `r`'s headers as librdkafka's own list (null: none), each name and value copied into
/// it; a produce call that succeeds takes the list over.
fn native_headers(r: &Outgoing<'_>) -> *mut rdsys::rd_kafka_headers_t {
    let count = r.source_headers.len() + r.headers.len();
    if count == 0 {
        return ptr::null_mut();
    }
    // SAFETY: a new list, then each header's name and value copied into it from slices
    // that outlive the calls (librdkafka keeps no pointer to them).
    unsafe {
        let list = rdsys::rd_kafka_headers_new(count);
        for (name, value) in r.each_header() {
            let (value_ptr, value_len) = value.map_or((ptr::null(), 0), |v| {
                (v.as_ptr().cast::<c_void>(), v.len() as isize)
            });
            let err = rdsys::rd_kafka_header_add(
                list,
                name.as_ptr().cast::<c_char>(),
                name.len() as isize,
                value_ptr,
                value_len,
            );
            // A list of our own is writable: adding to it does not fail.
            debug_assert_eq!(err, rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
        }
        list
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
    /// rdkafka's `BaseProducer::send`, but with the value read in place: rdkafka always
    /// asks librdkafka to copy it (`RD_KAFKA_MSG_F_COPY`) into the message's own
    /// allocation from the C heap, which then grows by the value (most records are a
    /// session's whole state, a kilobyte and more on aged states: past glibc's thread
    /// cache). Here the record's opaque holds a reference to the value instead, which is
    /// what librdkafka asks of a value it does not copy: that it stay valid and unchanged
    /// until the record's delivery report.
    fn send(&self, r: Outgoing<'_>, report: Report) -> KafkaResult<()> {
        let topic = self.topic(r.topic)?;
        let (value_ptr, value_len) = r.payload.map_or((ptr::null_mut(), 0), |p| {
            (p.as_ptr().cast_mut().cast::<c_void>(), p.len())
        });
        let opaque = Box::new(InFlight {
            report,
            _value: r.payload.cloned(),
        })
        .into_ptr();
        let headers = native_headers(&r);
        // SAFETY: the argument list is rdkafka's own `send`'s (less its timestamp 0, the
        // default: now; the topic by its handle, which the call takes a reference to, not
        // by name), with the message flags 0 (no copy, no free), each value of the type
        // librdkafka reads for its tag. `value_ptr` points into the `Payload` that
        // `opaque` holds a reference to, and a `Payload` is never changed while it is
        // shared (`Arc` hands out no `&mut` then), so the value stays valid and unchanged
        // until librdkafka hands the opaque back with the delivery report. librdkafka
        // reports a message only once no request buffer refers to it any more (it relies
        // on that itself: a value over `message.copy.max.bytes` is referred to by the
        // request, never copied, even with `RD_KAFKA_MSG_F_COPY`), so after the report it
        // reads the value no more. A record never reported (the producer destroyed
        // first) leaks its opaque rather than free what librdkafka may still read. The
        // key is copied by the call; the headers' list is librdkafka's on success.
        let err = unsafe {
            rdsys::rd_kafka_producev(
                self.producer.client().native_ptr(),
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_RKT,
                topic,
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_PARTITION,
                r.partition.unwrap_or(-1),
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_MSGFLAGS,
                0 as c_int,
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_VALUE,
                value_ptr,
                value_len,
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_KEY,
                r.key.as_ptr().cast::<c_void>(),
                r.key.len(),
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_OPAQUE,
                opaque,
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_HEADERS,
                headers,
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_END,
            )
        };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            // SAFETY: refused (a fatal or transactional state, no room in the queue, a
            // value too large, no such partition): librdkafka kept neither the opaque nor
            // the headers' list (on the partitioner's refusal it takes the list back off
            // the message before destroying it), so both are still ours to free.
            unsafe {
                drop(Box::<InFlight>::from_ptr(opaque));
                if !headers.is_null() {
                    rdsys::rd_kafka_headers_destroy(headers);
                }
            }
            return Err(KafkaError::MessageProduction(err.into()));
        }
        Ok(())
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

    fn fatal_error(&self) -> Option<String> {
        self.producer
            .client()
            .fatal_error()
            .map(|(_, reason)| reason)
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
    pub(super) unacknowledged: Mutex<Unacknowledged>,
    pub(super) changelog_offsets: Mutex<FxHashMap<i32, i64>>,
    pub(super) epoch: AtomicU64,
    /// Observes each finding's produce → acknowledged latency as its report arrives.
    pub(super) finding_latency: Option<prometheus::Histogram>,
}

impl DeliveryTracker {
    /// The tracker of an outbox whose findings' latency `telemetry` observes.
    pub fn of(telemetry: &Telemetry) -> DeliveryTracker {
        DeliveryTracker {
            finding_latency: Some(telemetry.metrics.produce_to_finding_latency.clone()),
            ..DeliveryTracker::default()
        }
    }

    /// One record's delivery report: where it landed, or why it failed.
    pub fn report(&self, result: Result<Acknowledged, KafkaError>, report: Report) {
        if report.epoch != self.epoch.load(Ordering::Acquire) {
            return;
        }
        if let (Ok(_), Some(source), Some(h)) = (&result, report.source_ms, &self.finding_latency) {
            h.observe((crate::contract::event::wall_ms() - source).max(0) as f64 / 1e3);
        }
        match result {
            Err(e) => lock(&self.failed).push((report.index, e)),
            Ok(Acknowledged { partition, offset }) => {
                lock(&self.unacknowledged).remove(report.index);
                if report.changelog {
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
    use crate::bus::kafka::settings::KafkaSettings;
    use crate::shutdown::Shutdown;
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::BaseRecord;
    use rdkafka::types::RDKafkaErrorCode;
    use rdkafka::Message;
    use std::sync::Arc;

    #[test]
    fn a_failed_commit_names_each_offset_sent_and_why() {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("in", 1, Offset::Offset(136))
            .unwrap();
        tpl.add_partition_offset("in", 2, Offset::Offset(69))
            .unwrap();
        // A logical offset was never sent to the broker.
        tpl.add_partition_offset("in", 3, Offset::Stored).unwrap();
        assert_eq!(failed_commits(&Ok(()), &tpl), vec![]);
        let refused = Err(KafkaError::ConsumerCommit(
            RDKafkaErrorCode::RebalanceInProgress,
        ));
        let failed = failed_commits(&refused, &tpl);
        let sent: Vec<(&str, i32, i64)> = failed
            .iter()
            .map(|f| (f.topic.as_str(), f.partition, f.offset))
            .collect();
        assert_eq!(sent, vec![("in", 1, 136), ("in", 2, 69)]);
        assert!(failed
            .iter()
            .all(|f| refused_while_the_group_changes(f.error)));
        let denied = Err(KafkaError::ConsumerCommit(
            RDKafkaErrorCode::GroupAuthorizationFailed,
        ));
        let failed = failed_commits(&denied, &tpl);
        assert_eq!(
            failed[0].error,
            Some(RDKafkaErrorCode::GroupAuthorizationFailed)
        );
        assert!(!refused_while_the_group_changes(failed[0].error));
        assert!(!refused_while_the_group_changes(None));
    }

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

    /// A changelog record's acknowledgement moves its partition's changelog position to
    /// the highest offset acknowledged; a finding's moves none, whatever its partition
    /// (the record's kind goes out in its report and comes back with it, not read back
    /// from the report's topic). Findings land on partition 2, which has no changelog
    /// record, and on partition 0 past the changelog's last offset there: read as
    /// changelog records, either would show.
    #[test]
    fn only_changelog_acknowledgements_move_the_changelog_positions() {
        let broker = EmbeddedBroker::start(&["changes", "out"], 3).expect("mock cluster");
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", broker.bootstrap_servers());
        let transport = KafkaTransport::new(&config, DeliveryTracker::default()).expect("producer");
        let value = Payload::new(b"state".to_vec());
        let sends = [
            ("changes", 0),
            ("changes", 0),
            ("changes", 0),
            ("changes", 1),
        ]
        .into_iter()
        .chain([
            ("out", 2),
            ("out", 2),
            ("out", 0),
            ("out", 0),
            ("out", 0),
            ("out", 0),
        ]);
        for (index, (topic, partition)) in sends.enumerate() {
            lock(&transport.tracker().unacknowledged).insert(index);
            let record = Outgoing {
                topic,
                partition: Some(partition),
                key: b"k",
                payload: Some(&value),
                source_headers: &[],
                headers: &[],
            };
            let report = Report {
                changelog: topic == "changes",
                ..Report::numbered(index)
            };
            transport.send(record, report).expect("queued");
        }
        let until = Instant::now() + Duration::from_secs(30);
        while !lock(&transport.tracker().unacknowledged).is_empty() && Instant::now() < until {
            transport.poll(Duration::from_millis(10));
        }
        assert!(lock(&transport.tracker().failed).is_empty());
        assert!(lock(&transport.tracker().unacknowledged).is_empty());
        let positions: std::collections::BTreeMap<i32, i64> =
            lock(&transport.tracker().changelog_offsets)
                .iter()
                .map(|(p, o)| (*p, *o))
                .collect();
        assert_eq!(positions, [(0, 2), (1, 0)].into_iter().collect());
    }

    /// A record's value is read in place, not copied: it lands whole, with its headers in
    /// order (the source's first, a missing value kept missing), held alive by the record
    /// in flight alone and let go once its report is served; a record for a partition the
    /// topic has not is refused at once and keeps no reference (nor frees its headers
    /// twice).
    #[test]
    fn a_value_read_in_place_lands_whole_and_is_let_go_at_its_report() {
        let broker = EmbeddedBroker::start(&["out"], 1).expect("mock cluster");
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", broker.bootstrap_servers());
        let transport = KafkaTransport::new(&config, DeliveryTracker::default()).expect("producer");
        // Past `message.copy.max.bytes` (64 KiB), so that the request refers to the value
        // instead of copying it, and unlike itself at every offset.
        let bytes = || (0..70_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
        let value = Payload::new(bytes());
        let source_headers = [
            ("source-a".to_string(), Some(b"1".to_vec())),
            ("source-none".to_string(), None),
        ];
        let headers = [("kind", Cow::Borrowed(b"session".as_slice()))];
        fn record<'a>(
            partition: i32,
            value: &'a Payload,
            source_headers: &'a [(String, Option<Vec<u8>>)],
            headers: &'a [(&'static str, Cow<'static, [u8]>)],
        ) -> Outgoing<'a> {
            Outgoing {
                topic: "out",
                partition: Some(partition),
                key: b"the-key",
                payload: Some(value),
                source_headers,
                headers,
            }
        }
        lock(&transport.tracker().unacknowledged).insert(0);
        transport
            .send(
                record(0, &value, &source_headers, &headers),
                Report::numbered(0),
            )
            .expect("queued");
        // The record in flight is all that keeps the value now.
        let sent = Arc::downgrade(&value);
        drop(value);
        assert_eq!(sent.strong_count(), 1, "the record in flight holds it");
        let until = Instant::now() + Duration::from_secs(30);
        while !lock(&transport.tracker().unacknowledged).is_empty() && Instant::now() < until {
            transport.poll(Duration::from_millis(10));
        }
        assert!(lock(&transport.tracker().failed).is_empty());
        assert!(
            lock(&transport.tracker().unacknowledged).is_empty(),
            "reported"
        );
        assert_eq!(sent.strong_count(), 0, "let go with its report");

        // The topic's partitions are known now: one past them is refused at once.
        let another = Payload::new(b"v".to_vec());
        let unknown = record(5, &another, &source_headers, &headers);
        let refused = transport.send(unknown, Report::numbered(1));
        assert!(
            matches!(
                refused,
                Err(KafkaError::MessageProduction(
                    RDKafkaErrorCode::UnknownPartition
                ))
            ),
            "{refused:?}"
        );
        assert_eq!(Arc::strong_count(&another), 1, "refused: not held");

        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", broker.bootstrap_servers())
            .set("group.id", "in-place")
            .set("auto.offset.reset", "earliest")
            .create()
            .expect("consumer");
        consumer.subscribe(&["out"]).expect("subscribed");
        let until = Instant::now() + Duration::from_secs(30);
        let landed = loop {
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                break m.expect("a message").detach();
            }
            assert!(Instant::now() < until, "nothing landed");
        };
        assert_eq!(landed.key(), Some(b"the-key".as_slice()));
        assert_eq!(landed.payload(), Some(bytes().as_slice()));
        let landed_headers: Vec<(String, Option<Vec<u8>>)> = landed
            .headers()
            .map(|h| {
                use rdkafka::message::Headers as _;
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(
            landed_headers,
            [
                ("source-a".to_string(), Some(b"1".to_vec())),
                ("source-none".to_string(), None),
                ("kind".to_string(), Some(b"session".to_vec())),
            ]
        );
    }

    /// A record the producer refuses at once (its queue full) hands back the reference
    /// its opaque was to hold: nothing is kept alive for a report that will never come.
    #[test]
    fn a_refused_record_keeps_no_reference_to_its_value() {
        let mut config = ClientConfig::new();
        // Nothing listens there: the first record stays queued, the second finds no room.
        config
            .set("bootstrap.servers", "127.0.0.1:9")
            .set("queue.buffering.max.messages", "1");
        let transport = KafkaTransport::new(&config, DeliveryTracker::default()).expect("producer");
        let (first, second) = (Payload::new(b"one".to_vec()), Payload::new(b"two".to_vec()));
        let headers = [("kind", Cow::Borrowed(b"session".as_slice()))];
        let record = |value| Outgoing {
            topic: "out",
            partition: Some(0),
            key: b"k",
            payload: Some(value),
            source_headers: &[],
            headers: &headers,
        };
        transport
            .send(record(&first), Report::numbered(0))
            .expect("queued");
        let refused = transport.send(record(&second), Report::numbered(1));
        assert!(
            matches!(
                refused,
                Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull))
            ),
            "{refused:?}"
        );
        assert_eq!(
            Arc::strong_count(&first),
            2,
            "queued: held until its report"
        );
        assert_eq!(Arc::strong_count(&second), 1, "refused: not held");
        // A topic name librdkafka refuses (over 512 bytes) is an error too, not a panic.
        let long = "t".repeat(600);
        let refused = transport.send(
            Outgoing {
                topic: &long,
                ..record(&second)
            },
            Report::numbered(2),
        );
        assert!(
            matches!(
                refused,
                Err(KafkaError::MessageProduction(
                    RDKafkaErrorCode::InvalidArgument
                ))
            ),
            "{refused:?}"
        );
        assert_eq!(Arc::strong_count(&second), 1, "refused: not held");
        // Dropping the producer purges the queued record, and its report, never served,
        // would leak what it holds: the test ends without.
        std::mem::forget(transport);
    }

    /// CPU time of `clock` (this thread's or the process's), in milliseconds.
    fn cpu_ms(clock: libc::clockid_t) -> f64 {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid clock id and a timespec to write.
        unsafe { libc::clock_gettime(clock, &mut t) };
        t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
    }

    /// A measurement, not a test (it asserts nothing of its times): the CPU a changelog
    /// record costs the sending thread (the worker's) and the whole process (the embedded
    /// broker's threads included), sent in place by [`KafkaTransport::send`] against
    /// rdkafka's own `send`, which has librdkafka copy the value (both producers with the
    /// pipeline's settings and context): twelve alternating rounds of 20,000 records of
    /// `LOOPWARDEN_MEASURE_VALUE_BYTES` (default 1,000) with a changelog record's three
    /// headers, each round sent and then awaited; the medians of the last eleven.
    /// `cargo test --release --lib -- --ignored measure_a_value_sent_in_place --nocapture`
    #[test]
    #[ignore = "a measurement: run it with --release --ignored --nocapture"]
    fn measure_a_value_sent_in_place_against_rdkafkas_copy() {
        use rdkafka::message::{Header, OwnedHeaders};
        let partitions = 32;
        let broker = EmbeddedBroker::start(&["out"], partitions).expect("mock cluster");
        // The pipeline's own producer settings.
        let config = crate::bus::kafka::producer_config(
            &KafkaSettings::default(),
            broker.bootstrap_servers(),
            crate::contract::event::ParseLimits::default().max_event_bytes,
        );
        let records = 20_000usize;
        let bytes: usize = std::env::var("LOOPWARDEN_MEASURE_VALUE_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000);
        let values: Vec<Payload> = (0..records)
            .map(|i| Payload::new((0..bytes).map(|j| ((i + j) % 251) as u8).collect()))
            .collect();
        let keys: Vec<Vec<u8>> = (0..records)
            .map(|i| format!("session-{i}").into_bytes())
            .collect();
        let headers = [
            ("loopwarden.kind", Cow::Borrowed(b"session".as_slice())),
            ("loopwarden.batch", Cow::Owned(b"12345".to_vec())),
            ("loopwarden.state_format", Cow::Borrowed(b"7".as_slice())),
        ];
        // Both with the pipeline's context, whose delivery reports reach a tracker.
        let in_place = KafkaTransport::new(&config, DeliveryTracker::default()).expect("producer");
        let copying = KafkaTransport::new(&config, DeliveryTracker::default()).expect("producer");
        let partition = |i: usize| (i % partitions as usize) as i32;
        let (mut copied, mut placed) = (Vec::new(), Vec::new());
        for _ in 0..12 {
            for copy in [true, false] {
                let thread = cpu_ms(libc::CLOCK_THREAD_CPUTIME_ID);
                let process = cpu_ms(libc::CLOCK_PROCESS_CPUTIME_ID);
                let transport = if copy { &copying } else { &in_place };
                for i in 0..records {
                    let report = Report::numbered(i);
                    if copy {
                        let mut h = OwnedHeaders::new_with_capacity(headers.len());
                        for (key, value) in &headers {
                            h = h.insert(Header {
                                key,
                                value: Some(value.as_ref()),
                            });
                        }
                        let opaque = Box::new(InFlight {
                            report,
                            _value: None,
                        });
                        let mut record = BaseRecord::with_opaque_to("out", opaque)
                            .key(keys[i].as_slice())
                            .payload(values[i].as_slice())
                            .partition(partition(i))
                            .headers(h);
                        while let Err((_, back)) = copying.producer.send(record) {
                            record = back;
                            copying.poll(Duration::from_millis(1));
                        }
                    } else {
                        let record = Outgoing {
                            topic: "out",
                            partition: Some(partition(i)),
                            key: &keys[i],
                            payload: Some(&values[i]),
                            source_headers: &[],
                            headers: &headers,
                        };
                        in_place
                            .send(record, report)
                            .expect("the queue holds a round");
                    }
                }
                while transport.in_flight() > 0 {
                    transport.poll(Duration::from_millis(1));
                }
                let per_record = |since: f64, clock| (cpu_ms(clock) - since) * 1e3 / records as f64;
                let took = (
                    per_record(thread, libc::CLOCK_THREAD_CPUTIME_ID),
                    per_record(process, libc::CLOCK_PROCESS_CPUTIME_ID),
                );
                if copy { &mut copied } else { &mut placed }.push(took);
            }
        }
        // The first round of each warms the heaps and the connections: left out.
        for (name, mut rounds) in [("copied (rdkafka's send)", copied), ("in place", placed)] {
            rounds.remove(0);
            let median = |mut v: Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            eprintln!(
                "{name}: medians of {} rounds, sending thread {:.3} µs a record, process {:.3}",
                rounds.len(),
                median(rounds.iter().map(|r| r.0).collect()),
                median(rounds.iter().map(|r| r.1).collect()),
            );
        }
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
        let value = Payload::new(b"v".to_vec());
        for number in 0..records {
            lock(&transport.tracker().unacknowledged).insert(number);
            let record = Outgoing {
                topic: "out",
                partition: Some(number as i32 % partitions),
                key: b"k",
                payload: Some(&value),
                source_headers: &[],
                headers: &[],
            };
            transport
                .send(record, Report::numbered(number))
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
        let payloads: Vec<(i32, String)> = (0..2)
            .flat_map(|partition| (0..5).map(move |i| (partition, format!("{partition}-{i}"))))
            .collect();
        let records: Vec<_> = payloads
            .iter()
            .map(|(partition, payload)| (*partition, None, payload.as_bytes()))
            .collect();
        broker.produce("input", &records);
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

//! An in-memory bus for the unit tests: topics as lists of records, a consumer group's
//! committed offsets, a producer whose delivery reports land records when polled. It
//! implements the pipeline's two seams ([`Input`], [`Transport`]), so the batch recipe
//! and its crash windows run without a broker; the tests against a real broker prove the
//! same recipe on Kafka. Its consumer can be told to refuse offset commits as a group's
//! coordinator does while the group rebalances (`MemoryConsumer::refuse_commits`).
//!
//! A crash is the process dying between two of the bus's operations (a send, a record
//! landing on the broker before its report comes back, an offset commit):
//! [`Bus::crash_at`] arms the bus to panic at the n-th operation from then on (the
//! records still in the dead producer's hands are lost), and the test catches the
//! panic, drops the worker as a kill would (its store writer finishes the write in
//! progress and writes none of the batches queued), and starts another over the same
//! bus. When the writer reports, and so where its offset commits fall among the bus's
//! operations, varies from run to run: the windows are the same, their order is not.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, Timestamp, TopicPartitionList};

use super::backoff::Backoff;
use super::bus::DeliveryTracker;
use super::bus::{failed_commits, Acknowledged, FailedCommit, Input, Outgoing, Report, Transport};
use super::changelog::{ChangelogSource, RecordParts};
use super::changelog::{CHANGELOG_BATCH, CHANGELOG_KIND, CHANGELOG_STATE_FORMAT};
use super::lock;
use super::PipelineError;
use crate::contract::event::wall_ms;

/// The panic message of a crash the bus was armed for.
pub const CRASH: &str = "the in-memory bus crashed the process here";

/// One record on a topic.
#[derive(Debug, Clone)]
pub struct Landed {
    pub key: Vec<u8>,
    /// `None`: a tombstone.
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Its timestamp: the wall clock when it was produced, as a producer's `CreateTime`.
    pub timestamp_ms: i64,
}

impl Landed {
    /// The record as a changelog reader hands it to the restore.
    pub fn parts(&self) -> RecordParts<'_> {
        let header = |name: &str| {
            self.headers
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.as_deref())
        };
        RecordParts {
            kind: header(CHANGELOG_KIND),
            batch: header(CHANGELOG_BATCH),
            format: header(CHANGELOG_STATE_FORMAT),
            key: Some(&self.key),
            payload: self.payload.as_deref(),
        }
    }
}

#[derive(Default)]
struct State {
    logs: BTreeMap<(String, i32), Vec<Landed>>,
    /// The group's committed offsets: the next offset to read, as Kafka keeps them.
    committed: BTreeMap<(String, i32), i64>,
    /// Sent, not yet landed: served in order by [`Transport::poll`].
    in_flight: VecDeque<((String, i32), Landed, Report)>,
    /// Polls land nothing while set (a broker slow to acknowledge).
    held: bool,
    /// Producer polls still to land nothing ([`Bus::hold_deliveries_for_polls`]).
    held_polls: usize,
    /// Deliveries still to fail (not landed, reported failed) before records land again.
    failing: usize,
    /// Why the producer failed fatally ([`Bus::fail_producer`]): it delivers nothing more.
    producer_failed: Option<String>,
    /// Operations so far, and the one that crashes.
    ops: u64,
    crash_at: Option<u64>,
    /// The kind of operation the last crash happened at.
    crashed_at: Option<&'static str>,
}

impl State {
    /// Counts one operation, failing when it is the one armed to crash.
    fn tick(&mut self, kind: &'static str) -> Result<(), ()> {
        self.ops += 1;
        if self.crash_at == Some(self.ops) {
            self.crash_at = None;
            self.crashed_at = Some(kind);
            return Err(());
        }
        Ok(())
    }
}

/// The bus, shared by every client the test makes of it.
#[derive(Clone, Default)]
pub struct Bus(Arc<Mutex<State>>);

impl Bus {
    /// Appends an input record (as a producer outside the pipeline would).
    pub fn produce(&self, topic: &str, partition: i32, key: &[u8], payload: &[u8]) {
        self.produce_with_headers(topic, partition, key, payload, &[]);
    }

    /// [`Bus::produce`] with headers (name, value) in order.
    pub fn produce_with_headers(
        &self,
        topic: &str,
        partition: i32,
        key: &[u8],
        payload: &[u8],
        headers: &[(&str, &[u8])],
    ) {
        lock(&self.0)
            .logs
            .entry((topic.to_string(), partition))
            .or_default()
            .push(Landed {
                key: key.to_vec(),
                payload: Some(payload.to_vec()),
                headers: headers
                    .iter()
                    .map(|(name, value)| (name.to_string(), Some(value.to_vec())))
                    .collect(),
                timestamp_ms: wall_ms(),
            });
    }

    /// Every record of `topic`, partition by partition, in order.
    pub fn records(&self, topic: &str) -> Vec<Landed> {
        lock(&self.0)
            .logs
            .iter()
            .filter(|((t, _), _)| t == topic)
            .flat_map(|(_, log)| log.iter().cloned())
            .collect()
    }

    /// The group's committed offset of a partition (the next offset to read).
    pub fn committed(&self, topic: &str, partition: i32) -> Option<i64> {
        lock(&self.0)
            .committed
            .get(&(topic.to_string(), partition))
            .copied()
    }

    /// Operations so far (sends, delivery reports, offset commits).
    pub fn ops(&self) -> u64 {
        lock(&self.0).ops
    }

    /// Arms the bus to crash at its `n`-th operation from now (1: the next one).
    pub fn crash_at(&self, n: u64) {
        let mut state = lock(&self.0);
        state.crash_at = Some(state.ops + n);
    }

    /// The kind of operation the last crash happened at: `send`, `delivery report` or
    /// `offset commit`.
    pub fn crashed_at(&self) -> Option<&'static str> {
        lock(&self.0).crashed_at
    }

    /// While `held`, the producer's polls land nothing: what is sent stays in flight,
    /// unacknowledged.
    pub fn hold_deliveries(&self, held: bool) {
        lock(&self.0).held = held;
    }

    /// The producer's next `polls` polls land nothing (the polls after land what is in
    /// flight): acknowledgements that arrive between two polls of one call.
    pub fn hold_deliveries_for_polls(&self, polls: usize) {
        lock(&self.0).held_polls = polls;
    }

    /// Fails the next `deliveries` records served by the producer's polls: they do not
    /// land, and their reports say they failed.
    pub fn fail_deliveries(&self, deliveries: usize) {
        lock(&self.0).failing = deliveries;
    }

    /// Every producer of the bus fails fatally for `reason`, as librdkafka's idempotent
    /// producer does when the broker no longer follows its sequence: every record sent
    /// after fails, and so does what is in flight (librdkafka lets a request already
    /// sent land; failing it too is the harder case for the outbox).
    pub fn fail_producer(&self, reason: &str) {
        lock(&self.0).producer_failed = Some(reason.to_string());
    }

    /// Disarms a crash not reached.
    pub fn disarm(&self) {
        lock(&self.0).crash_at = None;
    }

    /// Counts one operation; panics (the process "dies") when it is the armed one. The
    /// bus's lock is not held while panicking.
    fn tick(&self, kind: &'static str) {
        let crashed = {
            let mut state = lock(&self.0);
            let crashed = state.tick(kind).is_err();
            if crashed {
                // What the dead process had handed its producer and the broker had not
                // taken yet dies with it.
                state.in_flight.clear();
            }
            crashed
        };
        if crashed {
            std::panic::panic_any(CRASH);
        }
    }
}

/// A producer on the bus.
pub struct MemoryTransport {
    bus: Bus,
    tracker: DeliveryTracker,
}

impl MemoryTransport {
    pub fn new(bus: &Bus, tracker: DeliveryTracker) -> MemoryTransport {
        MemoryTransport {
            bus: bus.clone(),
            tracker,
        }
    }
}

/// No transactions on the in-memory bus (exactly_once is tested against the broker).
fn no_transactions() -> KafkaResult<()> {
    Err(KafkaError::Subscription(
        "the in-memory bus has no transactions".into(),
    ))
}

impl Transport for MemoryTransport {
    fn send(&self, r: Outgoing<'_>, report: Report) -> KafkaResult<()> {
        self.bus.tick("send");
        if lock(&self.bus.0).producer_failed.is_some() {
            return Err(KafkaError::MessageProduction(RDKafkaErrorCode::Fatal));
        }
        let landed = Landed {
            key: r.key.to_vec(),
            payload: r.payload.map(|p| p.to_vec()),
            headers: r
                .each_header()
                .map(|(name, value)| (name.to_string(), value.map(<[u8]>::to_vec)))
                .collect(),
            timestamp_ms: wall_ms(),
        };
        let partition = r.partition.unwrap_or(0);
        lock(&self.bus.0)
            .in_flight
            .push_back(((r.topic.to_string(), partition), landed, report));
        Ok(())
    }

    /// Lands every record in flight, in order, each one's report an operation.
    fn poll(&self, _timeout: Duration) {
        {
            let mut state = lock(&self.bus.0);
            if state.held_polls > 0 {
                state.held_polls -= 1;
                return;
            }
        }
        loop {
            let landed = {
                let mut state = lock(&self.bus.0);
                if state.held {
                    return;
                }
                let Some((at, record, report)) = state.in_flight.pop_front() else {
                    return;
                };
                let failed = if state.producer_failed.is_some() {
                    Some(RDKafkaErrorCode::Fatal)
                } else if state.failing > 0 {
                    state.failing -= 1;
                    Some(RDKafkaErrorCode::RequestTimedOut)
                } else {
                    None
                };
                if let Some(code) = failed {
                    drop(state);
                    let failed = KafkaError::MessageProduction(code);
                    self.tracker.report(Err(failed), report);
                    continue;
                }
                let log = state.logs.entry(at.clone()).or_default();
                log.push(record);
                (at, log.len() as i64 - 1, report)
            };
            // On the broker, its report not yet back: a crash here leaves it landed and
            // unacknowledged.
            self.bus.tick("delivery report");
            let ((_, partition), offset, report) = landed;
            self.tracker
                .report(Ok(Acknowledged { partition, offset }), report);
        }
    }

    fn in_flight(&self) -> usize {
        lock(&self.bus.0).in_flight.len()
    }

    fn tracker(&self) -> &DeliveryTracker {
        &self.tracker
    }

    fn init_transactions(&self, _timeout: Duration) -> KafkaResult<()> {
        no_transactions()
    }

    fn begin_transaction(&self) -> KafkaResult<()> {
        no_transactions()
    }

    fn send_offsets_to_transaction(
        &self,
        _offsets: &TopicPartitionList,
        _input: &dyn Input,
        _timeout: Duration,
    ) -> KafkaResult<()> {
        no_transactions()
    }

    fn commit_transaction(&self, _timeout: Duration) -> KafkaResult<()> {
        no_transactions()
    }

    fn abort_transaction(&self, _timeout: Duration) -> KafkaResult<()> {
        no_transactions()
    }

    fn fatal_error(&self) -> Option<String> {
        lock(&self.bus.0).producer_failed.clone()
    }
}

/// A member of a consumer group on the bus, with its partitions of the input topics.
pub struct MemoryConsumer {
    bus: Bus,
    topics: Vec<String>,
    /// The next offset to read, per assigned (topic, partition).
    positions: Mutex<BTreeMap<(String, i32), i64>>,
    /// The group's coordinator refuses commits (as while the group rebalances): a
    /// synchronous one fails, an asynchronous one is answered later with the refusal.
    refusing: std::sync::atomic::AtomicBool,
    /// The asynchronous commits refused, not yet taken.
    refused: Mutex<Vec<FailedCommit>>,
}

impl MemoryConsumer {
    /// A member reading `topics`, assigned `partitions` from the group's committed offsets.
    pub fn new(bus: &Bus, topics: &[&str], partitions: &[i32]) -> MemoryConsumer {
        let consumer = MemoryConsumer {
            bus: bus.clone(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            positions: Mutex::new(BTreeMap::new()),
            refusing: std::sync::atomic::AtomicBool::new(false),
            refused: Mutex::new(Vec::new()),
        };
        {
            let state = lock(&bus.0);
            let mut positions = lock(&consumer.positions);
            for t in topics {
                for &p in partitions {
                    let at = (t.to_string(), p);
                    let from = state.committed.get(&at).copied().unwrap_or(0);
                    positions.insert(at, from);
                }
            }
        }
        consumer
    }

    /// The next message of the assigned partitions (topic by topic, partition by
    /// partition), `None` when every one is read to its end.
    pub fn poll(&self) -> Option<OwnedMessage> {
        let state = lock(&self.bus.0);
        let mut positions = lock(&self.positions);
        for ((topic, partition), next) in positions.iter_mut() {
            let Some(r) = state
                .logs
                .get(&(topic.clone(), *partition))
                .and_then(|log| log.get(*next as usize))
            else {
                continue;
            };
            let offset = *next;
            *next += 1;
            let headers = (!r.headers.is_empty()).then(|| {
                r.headers
                    .iter()
                    .fold(OwnedHeaders::new(), |headers, (name, value)| {
                        headers.insert(Header {
                            key: name,
                            value: value.as_deref(),
                        })
                    })
            });
            return Some(OwnedMessage::new(
                r.payload.clone(),
                Some(r.key.clone()),
                topic.clone(),
                Timestamp::CreateTime(r.timestamp_ms),
                *partition,
                offset,
                headers,
            ));
        }
        None
    }
}

impl MemoryConsumer {
    /// The group's coordinator refuses commits from now on (`true`), or takes them.
    pub fn refuse_commits(&self, refuse: bool) {
        self.refusing.store(refuse, Ordering::Relaxed);
    }
}

impl Input for MemoryConsumer {
    fn take_failed_commits(&self) -> Vec<FailedCommit> {
        std::mem::take(&mut *lock(&self.refused))
    }

    fn commit(&self, offsets: &TopicPartitionList, mode: CommitMode) -> KafkaResult<()> {
        self.bus.tick("offset commit");
        if self.refusing.load(Ordering::Relaxed) {
            let refusal = Err(KafkaError::ConsumerCommit(
                RDKafkaErrorCode::RebalanceInProgress,
            ));
            if matches!(mode, CommitMode::Sync) {
                return refusal;
            }
            lock(&self.refused).extend(failed_commits(&refusal, offsets));
            return Ok(());
        }
        let mut state = lock(&self.bus.0);
        for e in offsets.elements() {
            if let Offset::Offset(o) = e.offset() {
                state
                    .committed
                    .insert((e.topic().to_string(), e.partition()), o);
            }
        }
        Ok(())
    }

    fn positions(&self) -> Option<TopicPartitionList> {
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in lock(&self.positions).iter() {
            tpl.add_partition_offset(topic, *partition, Offset::Offset(*next))
                .ok()?;
        }
        Some(tpl)
    }

    fn cached_watermarks(&self, topic: &str, partition: i32) -> Option<(Option<i64>, i64)> {
        let state = lock(&self.bus.0);
        let high = state
            .logs
            .get(&(topic.to_string(), partition))
            .map_or(0, |log| log.len() as i64);
        Some((Some(0), high))
    }

    fn seek_to_committed(
        &self,
        revoking: &[i32],
        _backoff: &mut Backoff,
    ) -> Result<(), PipelineError> {
        let state = lock(&self.bus.0);
        for ((topic, partition), next) in lock(&self.positions).iter_mut() {
            if !revoking.contains(partition) && self.topics.contains(topic) {
                *next = state
                    .committed
                    .get(&(topic.clone(), *partition))
                    .copied()
                    .unwrap_or(0);
            }
        }
        Ok(())
    }

    fn group_metadata(&self) -> Option<ConsumerGroupMetadata> {
        None
    }

    fn is_assigned(&self, topic: &str, partition: i32) -> bool {
        lock(&self.positions).contains_key(&(topic.to_string(), partition))
    }
}

/// The changelog on the bus, as a restore reads it.
pub struct MemoryChangelog {
    bus: Bus,
    topic: String,
    inputs: Vec<String>,
    /// Times it was told to let go of its reader ([`ChangelogSource::release`]).
    releases: Arc<AtomicUsize>,
}

impl MemoryChangelog {
    pub fn new(bus: &Bus, topic: &str, inputs: &[&str]) -> MemoryChangelog {
        MemoryChangelog {
            bus: bus.clone(),
            topic: topic.to_string(),
            inputs: inputs.iter().map(|t| t.to_string()).collect(),
            releases: Arc::default(),
        }
    }

    /// How many times it was told to let go of its reader, as it goes on counting once
    /// the restorer holds it.
    pub fn releases(&self) -> Arc<AtomicUsize> {
        self.releases.clone()
    }

    fn high(&self, topic: &str, partition: i32) -> i64 {
        lock(&self.bus.0)
            .logs
            .get(&(topic.to_string(), partition))
            .map_or(0, |log| log.len() as i64)
    }
}

impl ChangelogSource for MemoryChangelog {
    fn extent(&mut self, partition: i32) -> Result<Option<(i64, i64)>, PipelineError> {
        Ok(Some((0, self.high(&self.topic, partition))))
    }

    fn committed(
        &mut self,
        partition: i32,
    ) -> Result<Option<FxHashMap<String, i64>>, PipelineError> {
        let state = lock(&self.bus.0);
        Ok(Some(
            self.inputs
                .iter()
                .filter_map(|t| {
                    let o = state.committed.get(&(t.clone(), partition))?;
                    Some((format!("{t}/{partition}"), *o))
                })
                .collect(),
        ))
    }

    fn read(
        &mut self,
        partition: i32,
        from: i64,
        _high: i64,
        each: &mut dyn FnMut(i64, RecordParts<'_>) -> Result<(), PipelineError>,
    ) -> Result<(), PipelineError> {
        let log: Vec<Landed> = lock(&self.bus.0)
            .logs
            .get(&(self.topic.clone(), partition))
            .map(|log| log.iter().skip(from.max(0) as usize).cloned().collect())
            .unwrap_or_default();
        for (i, r) in log.iter().enumerate() {
            each(from.max(0) + i as i64, r.parts())?;
        }
        Ok(())
    }

    fn high_watermarks(&mut self, topics: &[Arc<str>], partition: i32) -> Vec<Option<i64>> {
        topics
            .iter()
            .map(|t| Some(self.high(t, partition)))
            .collect()
    }

    fn release(&mut self) {
        self.releases.fetch_add(1, Ordering::Relaxed);
    }
}

//! A worker: one member of the consumer group and everything its batches touch — the
//! assigned partitions (engine, sled tree, applied offsets, held events), the outbox,
//! the delivery mode and the restorer.
//!
//! Events are applied as they are polled (what the aligners release), and at least once
//! their findings are sent at once. A batch ends with [`Worker::finish_batch`], the
//! recipe in `batch.rs`.
//!
//! Guarantees: an event is applied at most once per stored state (offsets at or below a
//! partition's applied offset are skipped); a partition's state and its applied offsets
//! are stored together in one atomic sled batch, only after the batch's outputs are on
//! the broker; the group's offsets are committed only after the store (which the store
//! writer does off the worker's thread, `writer.rs`). A crash between any two steps
//! re-applies the events after the stored offsets, never fewer. A partition whose log ends
//! before the offsets its state applied (a topic made again under a kept state) is told at
//! its first skipped event, as a warning; its state is not reset on that reading.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::telemetry::metrics::Metrics;
use prometheus::IntCounter;
use rdkafka::{Message, Offset, TopicPartitionList};
use rustc_hash::FxHashMap;
use tracing::{info, warn};

use super::align::{Held, UNPOLLED_WAIT_MAX};
use super::backoff::Backoff;
use super::batch::PolledTimes;
use super::bus::{Input, OwedCommits};
use super::changelog::{self, BatchIds, Restorer};
use super::commit::Commit;
use super::holds::{PartitionHolds, StoppedWaiting};
use super::outbox::{Outbox, Undelivered};
use super::outputs::{self, Source};
use super::partition::{first_due, Partition, Pending};
use super::writer::{Stored, Writer};
use super::{PipelineError, RunStats};
use crate::bus::kafka::c_heap;
use crate::bus::kafka::headers::RawHeaders;
use crate::bus::kafka::settings::KafkaSettings;
use crate::config::Config;
use crate::contract::event::Event;
use crate::contract::output::Output;
use crate::engine::state::{UnheededTermination, UNSTOPPED_AFTER};
use crate::engine::store::{SledStore, StateStore, StoreBatch, StoreError};
use crate::engine::{clock_limit, stamped_ms, Engine, EngineCounters, EventMeta};
use crate::shutdown::Shutdown;
use crate::telemetry::{GroupMember, Telemetry, WriteWatch};

/// A worker's open sessions (as of its gauges' last report: each batch's end and each
/// rebalance) from which [`Worker::warm`] looks sessions up ahead. With fewer, the cache
/// holds their tables and the lookups ahead cost more than they hide: on a 2-core VM (the
/// pipeline bench's growth phase, two workers) the workers' CPU an event rose 5 % at
/// 5,000 sessions a worker, was the same at 20,000, and fell 4 % at 50,000 and 9 % at
/// 500,000.
const LOOKAHEAD_FROM_SESSIONS: i64 = 20_000;

/// Everything a batch touches.
pub struct Worker {
    pub(super) config: Arc<Config>,
    pub(super) db: sled::Db,
    pub(super) outbox: Outbox,
    pub(super) commit: Commit,
    pub(super) restorer: Restorer,
    pub(super) partitions: BTreeMap<i32, Partition>,
    /// The input topics, in configuration order (the aligners' topic indexes).
    pub(super) inputs: Vec<Arc<str>>,
    pub(super) shutdown: Shutdown,
    pub(super) stats: RunStats,
    /// The partitions a revoke is taking away while their batch is finished.
    pub(super) revoking: Vec<i32>,
    pub(super) telemetry: Arc<Telemetry>,
    pub(super) scratch: Vec<Output>,
    /// For each output in `scratch`, where the event that produced it came from.
    pub(super) scratch_sources: Vec<Source>,
    /// What this worker last added to the process-wide gauges.
    pub(super) reported_sessions: i64,
    pub(super) reported_partitions: i64,
    /// When the state directory's size was last measured.
    pub(super) store_size_at: Option<Instant>,
    /// `events_consumed` per event type, resolved once (not a labelled lookup per event)
    /// and counted here, added to the shared counter by [`Worker::flush_counts`] (an
    /// atomic add per event was ~2 % of this thread's time).
    pub(super) consumed: FxHashMap<&'static str, prometheus::local::LocalIntCounter>,
    /// `events_miskeyed`, resolved once (an unkeyed producer sends every event so).
    miskeyed: Miskeyed,
    /// Time spent applying events since the last batch finished.
    pub(super) applying: Duration,
    /// Ids of the batches this worker writes to the changelog.
    pub(super) batch_ids: BatchIds,
    /// at_least_once: the batch whose records are with the producer.
    pub(super) unacked: Option<Unacked>,
    /// Writes acknowledged batches to sled off this thread.
    pub(super) writer: Writer,
    /// This thread's own calls into the store (a partition's load, a restore's records,
    /// the flush at a clean stop), as `/healthz` sees them.
    store_watch: WriteWatch,
    /// The batches handed to the writer whose input offsets are not committed yet, in
    /// hand-over order (the writer reports in that order).
    pub(super) storing: VecDeque<Storing>,
    /// This worker's consumer as `/readyz` counts it: holding an assignment or awaiting
    /// one.
    pub(super) member: GroupMember,
    /// at_least_once: the input offsets this worker last sent to be committed, of the
    /// partitions it holds, by input topic (its index in `inputs`) and partition.
    pub(super) commits_sent: OwedCommits<(usize, i32)>,
    /// The partitions this worker holds among the process's workers. Last: dropped after
    /// the writer, whose drop waits for its thread, so a partition is given back only
    /// once nothing of this worker writes it.
    holds: Holding,
}

/// A worker's hold on its partitions ([`PartitionHolds`]), all given back when dropped.
struct Holding {
    holds: Arc<PartitionHolds>,
    worker: usize,
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.holds.give_back_all(self.worker);
    }
}

/// A batch with the store writer: what to commit once it is stored.
pub(super) struct Storing {
    /// The input offsets to commit once stored.
    pub(super) offsets: TopicPartitionList,
    /// The partitions it writes.
    pub(super) partitions: Vec<i32>,
    /// When its events were polled (processing latency), a count per partition taken.
    pub(super) polled: Vec<PolledTimes>,
    /// The writer's report, once it came.
    pub(super) stored: Option<Stored>,
}

impl Drop for Worker {
    /// The events counted but not yet added, when a panic unwinds the worker (its other
    /// ends, a stop, an error or a lost assignment, pass through `report_gauges`).
    fn drop(&mut self) {
        self.flush_counts();
    }
}

impl Worker {
    /// Which worker of the process this is (`kafka.workers`).
    pub(super) fn index(&self) -> usize {
        self.holds.worker
    }

    /// A worker of the process; `index` names its store writer's thread.
    // Each part is built by the caller (the tests give in-memory ones), so none is left out.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        index: usize,
        config: Arc<Config>,
        db: sled::Db,
        outbox: Outbox,
        commit: Commit,
        restorer: Restorer,
        shutdown: &Shutdown,
        telemetry: Arc<Telemetry>,
        member: GroupMember,
        holds: Arc<PartitionHolds>,
    ) -> Result<Worker, PipelineError> {
        let settings = &config.kafka;
        let watch = telemetry.liveness.store_watch();
        let writer = Writer::start(index, db.clone(), settings, shutdown, watch)?;
        let store_watch = telemetry.liveness.store_watch();
        Ok(Worker {
            restorer,
            inputs: settings
                .input_topics
                .iter()
                .map(|t| Arc::from(t.as_str()))
                .collect(),
            config: config.clone(),
            db,
            outbox,
            commit,
            partitions: BTreeMap::new(),
            shutdown: shutdown.clone(),
            stats: RunStats::default(),
            revoking: Vec::new(),
            telemetry: telemetry.clone(),
            scratch: Vec::new(),
            scratch_sources: Vec::new(),
            reported_sessions: 0,
            reported_partitions: 0,
            store_size_at: None,
            consumed: FxHashMap::default(),
            miskeyed: Miskeyed::of(&telemetry.metrics),
            applying: Duration::ZERO,
            batch_ids: BatchIds::new(),
            unacked: None,
            writer,
            store_watch,
            storing: VecDeque::new(),
            member,
            commits_sent: OwedCommits::default(),
            holds: Holding {
                holds,
                worker: index,
            },
        })
    }

    /// `topic`'s index among the input topics (`None`: not an input).
    pub(super) fn input_index(&self, topic: &str) -> Option<usize> {
        self.inputs.iter().position(|t| **t == *topic)
    }

    pub(super) fn settings(&self) -> &KafkaSettings {
        &self.config.kafka
    }

    /// Events held for alignment in all partitions.
    pub(super) fn held(&self) -> usize {
        self.partitions.values().map(|p| p.held.len()).sum()
    }

    /// Whether the batch in hand has anything to finish at `now`.
    pub(super) fn has_work(&self, now: Instant) -> bool {
        let interval = self.config.kafka.commit_interval;
        !self.outbox.is_empty()
            || self.unacked.is_some()
            // Changes whose turn has not come wait without a batch's end.
            || self.partitions.values().any(|p| p.dirty && p.is_due(now, interval))
    }

    /// Forgets the batch in hand without storing or committing anything (an assignment
    /// lost): its events are read again from the committed offsets by their next owner.
    /// Records already with the producer are seen delivered first (a failure sent again,
    /// unless the producer failed fatally: then the batch is forgotten and that error
    /// returned): findings published twice at worst, with one `event_id`. (The batch's
    /// changelog session records may land too; without its commit records no restore
    /// applies them. Its commit records may have been sent, only once its records and
    /// outputs were acknowledged: then a restore applies the batch, as after a crash right
    /// after them, and its findings are on the bus.) What was not sent yet is dropped.
    pub(super) fn drop_unstored(&mut self) -> Result<(), PipelineError> {
        let mut stored = self.await_stores_uncommitted();
        if self.outbox.has_sent() {
            let mut backoff = Backoff::new(self.settings(), &self.shutdown);
            match self.outbox.settle(&mut backoff) {
                Ok(()) => {}
                Err(Undelivered::DeadlinePassed) => warn!(
                    records = self.outbox.len(),
                    "shutdown deadline passed while delivering the records of a lost assignment"
                ),
                // Found here, not at the next batch's end: a worker with nothing to
                // publish would go on storing and committing with a dead producer.
                Err(why @ Undelivered::ProducerFailed(_)) => {
                    let undelivered = self.outbox.len();
                    stored =
                        stored.and(Err(PipelineError::undelivered(why, &backoff, undelivered)));
                }
            }
        }
        self.forget_batch();
        for p in self.partitions.values_mut() {
            p.held.clear(Instant::now());
            // The dropped batch's states were marked written: a partition kept (not
            // expected: an assignment is lost whole, and revoked partitions are released
            // after this) writes each session whole next, not as a delta from them.
            p.engine.forget_writes();
        }
        stored
    }

    /// Waits for the batches with the store writer and forgets their input offsets: the
    /// partitions they came from are gone (an assignment lost, a fenced transaction), and
    /// a commit now could move the group's offsets of a partition another member reads.
    /// Their states are stored (acknowledged batches), so a partition that comes back is
    /// restored after them. A batch the writer could not store is an error: sled may
    /// hold part of it, and the run must not go on over that tree.
    pub(super) fn await_stores_uncommitted(&mut self) -> Result<(), PipelineError> {
        self.collect_stored(true);
        let mut first_error = Ok(());
        for s in self.storing.drain(..) {
            if let Some(Stored { result: Err(e), .. }) = s.stored {
                if first_error.is_ok() {
                    first_error = Err(e);
                }
            }
        }
        first_error
    }

    /// Takes the store writer's reports into [`Worker::storing`]: those ready, or with
    /// `wait` every outstanding one.
    pub(super) fn collect_stored(&mut self, wait: bool) {
        for slot in self.storing.iter_mut().filter(|s| s.stored.is_none()) {
            match self.writer.next(wait) {
                Some(stored) => slot.stored = Some(stored),
                None => break,
            }
        }
    }

    /// Waits for the writer while a batch it has not reported writes one of `partitions`
    /// (its reports are kept for the commits).
    fn await_stores_of(&mut self, partitions: &[i32]) {
        let pending =
            |s: &Storing| s.stored.is_none() && s.partitions.iter().any(|p| partitions.contains(p));
        if self.storing.iter().any(pending) {
            self.collect_stored(true);
        }
    }

    /// Forgets the batch in hand: its records, its changelog positions and its latency
    /// marks (nothing of it will be stored or committed).
    fn forget_batch(&mut self) {
        self.unacked = None;
        self.outbox.clear();
        self.outbox.forget_changelog_positions();
        for p in self.partitions.values_mut() {
            p.polled.clear();
        }
    }

    /// at_least_once with a changelog: sends the batch in flight's changelog commit
    /// records as soon as its records are acknowledged, without waiting for them: their
    /// round trip then passes while the next batch is polled, instead of at its end,
    /// where no event is applied. Called between polls. (The next batch's findings sent
    /// meanwhile may be in flight: they come of events after the batch, which a restore
    /// of it leaves to be consumed again.)
    pub(super) fn send_commit_records_once_acked(&mut self) {
        let Some(unacked) = &mut self.unacked else {
            return;
        };
        if !unacked.commits_due()
            || !self.commit.changelog_after_acks()
            || !self.outbox.try_settle_below(unacked.records_end)
        {
            return;
        }
        unacked.commits_end =
            Some(unacked.queue_commits(&mut self.outbox, &self.config.kafka.group_id));
        self.outbox.send_all();
    }

    /// at_least_once: whether the batch in flight still waits for the broker (its
    /// records, or its changelog commit records), checked without waiting; its commit
    /// records are sent first if they are due ([`Worker::send_commit_records_once_acked`]).
    /// A batch's end would wait for it with no event applied, so the poll loop keeps the
    /// next batch open meanwhile. `false` once a delivery failed: the batch's end sends
    /// it again, with backoff.
    pub(super) fn awaits_batch_in_flight(&mut self) -> bool {
        self.send_commit_records_once_acked();
        let Some(unacked) = &self.unacked else {
            return false;
        };
        if self.outbox.has_failed() {
            return false;
        }
        // Its records' acknowledgements may arrive after the send above looked: its
        // commit records then go at the next call.
        if self.commit.changelog_after_acks() && unacked.commits_due() {
            return true;
        }
        let mark = unacked.commits_end.unwrap_or(unacked.records_end);
        !self.outbox.try_settle_below(mark) && !self.outbox.has_failed()
    }

    /// Lets revoked partitions go (their batch already finished or dropped). A batch of
    /// theirs still with the store writer (a settling that failed on the way) is written
    /// first: another worker of this process may take them over the same database.
    pub(super) fn release(&mut self, revoked: &[i32]) {
        self.await_stores_of(revoked);
        self.give_back(revoked.iter().copied());
        // A partition's next owner commits its offsets from now on: one of ours sent
        // again later could take the group's offset back.
        self.commits_sent.retain(|(_, p)| !revoked.contains(p));
        for p in revoked {
            self.partitions.remove(p);
            for topic in &self.config.kafka.input_topics {
                let _ = self
                    .telemetry
                    .metrics
                    .consumer_lag
                    .remove_label_values(&[topic, &p.to_string()]);
            }
        }
        self.report_gauges();
    }

    /// Drops all in-memory partitions after a fatal error: the batch in hand is not
    /// stored, nor committed; the batches already with the store writer (acknowledged)
    /// are written or fail before this returns, and none is committed.
    pub(super) fn abandon(&mut self) {
        if let Err(e) = self.await_stores_uncommitted() {
            warn!(error = %e, "a batch handed to the store writer was not stored");
        }
        self.forget_batch();
        self.clear_partitions();
    }

    /// Drops every partition in memory, giving them back (their batches with the writer
    /// awaited by the caller).
    fn clear_partitions(&mut self) {
        // The worker holds exactly the partitions it has loaded (`acquire`).
        self.partitions.clear();
        self.commits_sent.clear();
        self.holds.holds.give_back_all(self.holds.worker);
    }

    /// Once an assignment's partitions are loaded: when a restore read records, the
    /// changelog reader goes (its threads fetched them, and keep what they allocated
    /// until they end, [`Restorer::release`]), and this thread's heap is collected and
    /// the pages freed by then are handed back to the kernel
    /// (`c_heap::release_freed_memory`).
    pub(super) fn loaded_assignment(&mut self) {
        if self.restorer.release() {
            c_heap::release_freed_memory(true);
        }
    }

    /// Lets `partitions` go among the process's workers.
    fn give_back(&self, partitions: impl IntoIterator<Item = i32>) {
        self.holds.holds.give_back(partitions, self.holds.worker);
    }

    /// Loads a newly assigned partition's sessions and offsets from sled, once no other
    /// worker of the process holds it ([`PartitionHolds`]).
    pub(super) fn acquire(&mut self, partition: i32) -> Result<(), PipelineError> {
        if self.partitions.contains_key(&partition) {
            return Ok(());
        }
        self.holds
            .holds
            .take(partition, self.holds.worker, &self.shutdown)
            .map_err(|StoppedWaiting| PipelineError::RestoreInterrupted { partition })?;
        let loaded = self.load(partition);
        if loaded.is_err() {
            self.give_back([partition]);
        }
        loaded
    }

    /// [`Worker::acquire`] once the partition is held.
    fn load(&mut self, partition: i32) -> Result<(), PipelineError> {
        // A batch of this partition still with the writer (from before it was taken
        // away) is written before the partition is read again.
        self.await_stores_of(&[partition]);
        let mut store = self
            .store_watch
            .during(|| SledStore::partition(&self.db, partition))?;
        if self.commit.changelog() {
            let telemetry = self.telemetry.clone();
            let _restoring = telemetry.readiness.restoring();
            let restored =
                self.restorer
                    .restore(partition, &mut store, &self.db, &self.store_watch)?;
            self.stats.restored_records += restored.session_records;
            self.stats.restore_ms += restored.took.as_millis() as u64;
            let metrics = &telemetry.metrics;
            metrics.restored_records.inc_by(restored.session_records);
            metrics
                .restore_duration
                .observe(restored.took.as_secs_f64());
        }
        let loading = self.store_watch.begin(Instant::now());
        let engine = Engine::restore(self.config.clone(), &store)?;
        let mut applied = BTreeMap::new();
        for topic in &self.inputs {
            if let Some(o) = StateStore::offset(&store, &format!("{topic}/{partition}"))? {
                applied.insert(topic.clone(), o);
            }
        }
        drop(loading);
        info!(
            partition,
            sessions = engine.open_sessions(),
            offsets = ?applied,
            "partition assigned"
        );
        let align_wait = self.settings().align_wait;
        let due = first_due(partition, Instant::now(), self.settings().commit_interval);
        let mut p = Partition::new(engine, store, applied, self.inputs.len(), align_wait, due);
        if self.inputs.len() > 1 && !align_wait.is_zero() {
            p.high_at_assignment = self.restorer.high_watermarks(&self.inputs, partition);
        }
        self.partitions.insert(partition, p);
        Ok(())
    }

    /// Starts loading the sessions of `messages`, polled and about to be handled in turn:
    /// looked up all at once, each lookup's misses (a session table's control bytes,
    /// bucket and id; at a million open sessions none is in the cache) overlap the
    /// others', where a lookup inside [`Worker::handle`] waits them out alone. The first
    /// pass asks for each state's first lines, a second for the parts they point to. A
    /// message's key is taken for its session's id (the producer's partitioning key; one
    /// that is not warms nothing). A hint: nothing depends on it.
    pub(super) fn warm<M: Message>(&self, messages: &[Option<M>]) {
        if self.reported_sessions < LOOKAHEAD_FROM_SESSIONS {
            return;
        }
        // Each pass short, so that the core holds several lookups at once.
        let mut ids: [Option<(&Engine, &str)>; super::LOOKAHEAD] = [None; super::LOOKAHEAD];
        for (slot, m) in ids.iter_mut().zip(messages.iter().flatten()) {
            *slot = self.partitions.get(&m.partition()).and_then(|p| {
                let id = std::str::from_utf8(m.key()?).ok()?;
                Some((&p.engine, id))
            });
        }
        let mut states: [Option<&crate::engine::state::SessionState>; super::LOOKAHEAD] =
            [None; super::LOOKAHEAD];
        for (state, id) in states.iter_mut().zip(&ids) {
            *state = id.and_then(|(engine, id)| engine.session(id));
            if let Some(state) = state {
                crate::prefetch::value(*state);
            }
        }
        for state in states.iter().flatten() {
            state.prefetch();
        }
    }

    /// Takes one message `input` polled: parsed (an event, or a dead letter for a bad one),
    /// it goes through its partition's aligner and is applied as soon as the aligner
    /// releases it; with one input topic (which the aligner would release at once) it is
    /// applied straight from the message instead. A message of a partition this worker
    /// is not assigned (a surprise: the assignment callbacks come first) is left unapplied
    /// and uncommitted, for the partition's owner, rather than loaded: a load would hold
    /// the partition against the worker of this process that owns it until this one's
    /// next revoke. Returns the time its work ended, when it read the clock then and
    /// handed nothing to the producer after (a message applied or held that left no
    /// output to send), for the poll loop to go on from; `None` otherwise.
    pub(super) fn handle<M: Message>(
        &mut self,
        m: &M,
        input: &dyn Input,
    ) -> Result<Option<Instant>, PipelineError>
    where
        M::Headers: RawHeaders,
    {
        // A worker's bug, for the test that a panicking worker stops the process
        // (`FAILPOINTS=worker-handle=1*panic`).
        #[cfg(feature = "failpoints")]
        fail::eval("worker-handle", |_| ());
        let partition = m.partition();
        if !self.partitions.contains_key(&partition) {
            if !input.is_assigned(m.topic(), partition) {
                warn!(
                    topic = m.topic(),
                    partition,
                    offset = m.offset(),
                    "skipping a message of a partition not assigned to this worker"
                );
                return Ok(None);
            }
            // Assigned but not loaded (assignment callbacks come first; this only guards
            // against surprises).
            match self.acquire(partition) {
                Ok(()) => self.loaded_assignment(),
                // Shutting down: the message stays unapplied (and uncommitted), for
                // whoever owns the partition next.
                Err(PipelineError::RestoreInterrupted { .. }) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        let Some(topic_index) = self.input_index(m.topic()) else {
            warn!(
                topic = m.topic(),
                partition, "skipping a message of a topic that is not an input"
            );
            return Ok(None);
        };
        let topic = &*self.inputs[topic_index];
        let offset = m.offset();
        let (limits, grace) = (self.config.limits, self.config.engine.future_grace_ms);
        let p = self.partitions.get_mut(&partition).expect("acquired above");
        let applied = p.applied.get(topic).is_some_and(|&last| offset <= last);
        let seen = applied
            || p.held
                .last_offset(topic_index)
                .is_some_and(|last| offset <= last);
        if seen {
            self.stats.skipped += 1;
            self.telemetry.metrics.events_skipped.inc();
            if applied && p.log_ends_before_state.is_none() {
                check_log_end(p, topic, partition, input);
            }
            return Ok(None);
        }
        let (time, pending) = Pending::of(m, topic, &limits, grace);
        if let Pending::Event(event, ..) = &pending {
            self.miskeyed.check(m, &event.session_id);
        }
        let polled = Instant::now();
        let held = Held {
            time,
            offset,
            polled,
            item: pending,
        };
        // With one input topic and nothing held, the aligner would hand it back at once:
        // it is applied from the message's own bytes, without an owned copy of its event
        // (2–3 % of a worker's time at a million sessions). Held, it owns its strings.
        let direct = if self.inputs.len() == 1 && p.held.is_empty() {
            Some((topic_index, held))
        } else {
            // Applied after its message is gone: its headers are read now.
            let mut held = held.map(Pending::into_owned);
            if let Pending::Event(_, _, source) = &mut held.item {
                source.read_from(m);
            }
            p.held.push(topic_index, held);
            None
        };
        // Applied as it comes (not at the batch's end), and at least once its findings
        // go out at once: they need not wait for the batch before to be acknowledged
        // (only the changelog's records do), and are acknowledged before this batch's
        // offsets are committed all the same.
        self.apply_ready_in(partition, polled, direct);
        self.read_sources_from(m);
        self.queue_outputs();
        let applied = Instant::now();
        self.applying += applied - polled;
        // The end of its work is the poll loop's next reading of the clock as well (one
        // read fewer a message), unless findings were handed to the producer after it:
        // a full queue holds that for as long as the broker takes to drain it.
        let sent = self.send_findings();
        Ok((!sent).then_some(applied))
    }

    /// Reads the headers of `m`, the message just handled, into the sources of the
    /// outputs its event produced, applied at once (a held event's own source was read
    /// as it was held). No other output's source is unread (every event is applied or
    /// held by the end of its message's [`Worker::handle`]), and one that were would be
    /// left so, not given `m`'s.
    fn read_sources_from<M: Message>(&mut self, m: &M)
    where
        M::Headers: RawHeaders,
    {
        // (librdkafka parses a message's headers once: a second output's read is cheap.)
        for source in &mut self.scratch_sources {
            source.read_from(m);
        }
    }

    /// at_least_once: hands the outputs found so far to the producer without waiting for
    /// the batch's end (exactly_once: they wait for its transaction).
    /// Whether it handed any.
    fn send_findings(&mut self) -> bool {
        let sending = self.commit.at_least_once() && self.outbox.has_unsent();
        if sending {
            self.outbox.send_all();
        }
        sending
    }

    /// Applies what every partition's aligner releases by now (events whose wait for
    /// another topic ended) and sends their findings.
    pub(super) fn release_due(&mut self) {
        // One input topic holds nothing: its events are applied as they are polled.
        if self.held() > 0 {
            self.apply_ready();
            self.send_findings();
        }
    }

    /// Applies what the partitions' aligners release (events to their engines, dead
    /// letters to the outbox), advancing the applied offsets, and queues the outputs.
    pub(super) fn apply_ready(&mut self) {
        let started = Instant::now();
        let ready: Vec<i32> = self.partitions.keys().copied().collect();
        for partition in ready {
            self.apply_ready_in(partition, started, None);
        }
        self.queue_outputs();
        self.applying += started.elapsed();
    }

    /// `direct` (a message applied without being held), then what partition
    /// `partition`'s aligner releases, applied (outputs stay in `scratch` until
    /// [`Worker::queue_outputs`]).
    fn apply_ready_in(
        &mut self,
        partition: i32,
        now: Instant,
        mut direct: Option<(usize, Held<Pending<'_>>)>,
    ) {
        let Some(p) = self.partitions.get_mut(&partition) else {
            return;
        };
        let metrics = &self.telemetry.metrics;
        let counted_before = p.engine.counters();
        let mut applied_any = false;
        // `direct` first: it comes after everything held, which is nothing then.
        while let Some((topic, held)) = direct.take().or_else(|| p.held.pop_ready(now)) {
            applied_any = true;
            // Updated in place: a new key (an `Arc` clone) only for a topic's first event.
            match p.applied.get_mut(&*self.inputs[topic]) {
                Some(applied) => *applied = held.offset,
                None => {
                    p.applied.insert(self.inputs[topic].clone(), held.offset);
                }
            }
            p.polled.push(held.polled);
            match held.item {
                Pending::Event(event, meta, source) => {
                    self.stats.events += 1;
                    let kind = event.body.type_name();
                    self.consumed
                        .entry(kind)
                        .or_insert_with(|| {
                            metrics.events_consumed.with_label_values(&[kind]).local()
                        })
                        .inc();
                    let meta = EventMeta {
                        topic: Some(&self.inputs[topic]),
                        ..meta
                    };
                    let future = p.engine.counters().future_events;
                    p.engine.process(&event, &meta, &mut self.scratch);
                    if p.engine.counters().future_events != future {
                        note_future_event(metrics, &event, &meta);
                    }
                    // Set by the event that named another tenant, and only by it.
                    if let Some(was) = p.engine.take_other_tenant_was() {
                        note_other_tenant_event(metrics, &event, &meta, &was);
                    }
                    if let Some(unheeded) = p.engine.take_unheeded_termination() {
                        note_unheeded_termination(metrics, &event, &meta, unheeded);
                    }
                    self.scratch_sources.resize(self.scratch.len(), source);
                }
                Pending::DeadLetter(record, reason) => {
                    self.stats.dead_lettered += 1;
                    metrics.bad_events.with_label_values(&[reason]).inc();
                    self.outbox.push(record);
                }
            }
        }
        for topic in p.held.take_overruns() {
            warn!(
                partition,
                topic = %self.inputs[topic],
                waited_secs = UNPOLLED_WAIT_MAX.as_secs(),
                "input topic still unpolled after the bound; its partition's other topics go on without it"
            );
            metrics.align_overruns.inc();
        }
        if !applied_any {
            return;
        }
        p.dirty = true;
        add_counted_since(counted_before, p.engine.counters(), metrics);
        p.last_event_wall = now;
        p.clock_at_last_event = p.engine.watermark();
    }

    /// Adds the events counted since the last call to the process-wide counters: with
    /// the gauges ([`Worker::report_gauges`]: a batch's end, a release, a rebalance), and
    /// while a batch is open at each of the poll loop's sweeps (every few milliseconds),
    /// so that `loopwarden_events_consumed_total` keeps up within a batch of seconds.
    pub(super) fn flush_counts(&self) {
        for consumed in self.consumed.values() {
            consumed.flush();
        }
    }

    /// When the next held event that waits for another topic may go.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.partitions
            .values()
            .filter_map(|p| p.held.next_due())
            .min()
    }

    /// Moves the engine outputs in `scratch` to the outbox (shadow findings stay local).
    pub(super) fn queue_outputs(&mut self) {
        // Outputs of the idle clock have no triggering message.
        self.scratch_sources
            .resize(self.scratch.len(), Source::default());
        debug_assert!(
            !self.scratch_sources.iter().any(Source::is_unread),
            "an output's message headers left unread"
        );
        for (output, source) in self.scratch.drain(..).zip(self.scratch_sources.drain(..)) {
            if let Some(record) =
                outputs::record(&output, &source, &mut self.stats, &self.telemetry)
            {
                self.outbox.push(record);
            }
        }
    }

    /// Applies what is ready, then advances the clock of partitions that have been idle
    /// (nothing applied or held), closing silent sessions.
    pub(super) fn tick_idle(&mut self) {
        self.apply_ready();
        let idle_after = self.config.kafka.idle_after;
        for p in self.partitions.values_mut() {
            p.advance_idle_clock(idle_after, &mut self.scratch);
        }
        self.queue_outputs();
    }

    /// Tells each partition's aligner, for the input topics it holds nothing of, whether
    /// the broker holds events of them that were not polled yet (by the client's cached
    /// watermarks and the consumer's position; no request). Only while some held event
    /// waits for another topic: otherwise the answer changes nothing.
    pub(super) fn observe_unpolled(&mut self, input: &dyn Input) {
        if self.inputs.len() < 2 || self.next_due().is_none() {
            return;
        }
        let now = Instant::now();
        let positions = input.positions();
        let position = |topic: &str, partition: i32| {
            let entry = positions.as_ref()?.find_partition(topic, partition)?;
            match entry.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            }
        };
        for (&partition, p) in &mut self.partitions {
            for (index, topic) in self.inputs.iter().enumerate() {
                if !p.held.is_drained(index) {
                    continue;
                }
                // The client's cache, unless the broker's answer at the assignment is
                // newer (the cache outlives a revoke).
                let cached = input.cached_watermarks(topic, partition);
                let at_assignment = p.high_at_assignment.get(index).copied().flatten();
                let watermarks = match (cached, at_assignment) {
                    (Some((low, high)), Some(then)) => Some((low, high.max(then))),
                    (Some(cached), None) => Some(cached),
                    (None, Some(then)) => Some((None, then)),
                    (None, None) => None,
                };
                // A partition that never held an event (high watermark 0): a topic
                // this deployment does not write (OpenTelemetry only), nothing to wait for.
                p.held
                    .set_never_written(index, matches!(watermarks, Some((_, 0))));
                let unpolled = match watermarks {
                    // Nothing known: no fetch has answered since the client started.
                    None => true,
                    Some((low, high)) => {
                        // Where the next poll reads: after the last message polled, else
                        // after the last applied (a restored partition), else from the
                        // start of the log (nothing of it was ever applied here).
                        let next = position(topic, partition)
                            .or_else(|| p.applied.get(topic).map(|o| o + 1))
                            .or(low)
                            .unwrap_or(0);
                        high > next
                    }
                };
                p.held.set_unpolled(index, unpolled, now);
            }
        }
    }

    /// Messages waiting on the broker behind what this worker applied, by the client's
    /// cached high watermarks (no request). Also sets the per-partition lag gauge, and
    /// marks the partitions that are behind (their idle clock waits).
    pub(super) fn lag(&mut self, input: &dyn Input) -> i64 {
        let mut lag = 0;
        // The consumer's position steps over transaction markers, which take offsets
        // and are never delivered; the applied offset does not.
        let positions = input.positions();
        for (&partition, p) in &mut self.partitions {
            let mut waiting = false;
            for (topic, applied) in &p.applied {
                if let Some((_, high)) = input.cached_watermarks(topic, partition) {
                    let behind = (high - applied - 1).max(0);
                    lag += behind;
                    self.telemetry
                        .metrics
                        .consumer_lag
                        .with_label_values(&[&**topic, &partition.to_string()])
                        .set(behind);
                    let next = positions
                        .as_ref()
                        .and_then(|tpl| tpl.find_partition(topic, partition))
                        .and_then(|e| match e.offset() {
                            Offset::Offset(o) => Some(o),
                            _ => None,
                        })
                        .unwrap_or(applied + 1);
                    waiting |= high > next;
                }
            }
            p.behind = waiting;
        }
        lag
    }

    /// Drops the batch in hand after the group fenced our transaction: the in-memory
    /// state of every partition goes (it is loaded again from sled and the changelog on
    /// the next event) and the consumer is moved back to the group's committed offsets,
    /// which are where the last committed transaction left them.
    pub(super) fn rewind(&mut self, input: &dyn Input) -> Result<(), PipelineError> {
        warn!(partitions = ?self.partitions.keys().collect::<Vec<_>>(), "consumer group moved on during the transaction; dropping the batch and reading it again");
        let stored = self.await_stores_uncommitted();
        self.forget_batch();
        self.clear_partitions();
        stored?;
        let mut backoff = Backoff::new(self.settings(), &self.shutdown);
        input.seek_to_committed(&self.revoking, &mut backoff)
    }

    /// Puts everything stored so far on disk (a clean stop: the next start restores
    /// nothing). Called once the batches are settled (none is with the writer).
    pub(super) fn flush_store(&self) -> Result<(), PipelineError> {
        self.store_watch
            .during(|| self.db.flush())
            .map_err(StoreError::Io)?;
        Ok(())
    }

    /// Brings the process-wide gauges up to date with this worker's share: open
    /// sessions, assigned partitions, per-partition lag, and (every 10 s) the state
    /// directory's size; every 10 s too, the C heap's free pages go back to the kernel.
    pub(super) fn report_gauges(&mut self) {
        self.flush_counts();
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
            c_heap::release_freed_memory(false);
            self.store_size_at = Some(Instant::now());
        }
    }
}

/// Counts (and logs, at the 1st, 2nd, 4th, 8th…) an event stamped past its
/// [`clock_limit`] (its message's timestamp or its processing time, whichever is earlier,
/// and `engine.future_grace_secs`), whose partition's clock the engine moved to that limit
/// only: the clock that stamped it runs ahead of its producer's or of this host's.
fn note_future_event(metrics: &Metrics, event: &Event<'_>, meta: &EventMeta<'_>) {
    let counter = &metrics.future_events;
    counter.inc();
    let n = counter.get();
    if n.is_power_of_two() {
        let ahead = stamped_ms(event, meta)
            .zip(clock_limit(meta, 0))
            .map(|(stamped, reference)| stamped.saturating_sub(reference) / 1000);
        warn!(
            topic = meta.topic,
            partition = meta.partition,
            offset = meta.offset,
            session_id = %crate::contract::event::printable(&event.session_id),
            ahead_secs = ahead,
            count = n,
            "input event stamped after its message's timestamp or this host's clock, past the grace; its partition's clock moved to that limit only: check the clocks of the producer and of this host"
        );
    }
}

/// Counts (and logs, at the 1st, 2nd, 4th, 8th…) an event that named another tenant
/// than the session it joined had (`was`): session ids unique per tenant only, whose
/// sessions are judged as one (and each one's verdicts reach the other's agent), or
/// producers that name one session's tenant differently.
fn note_other_tenant_event(metrics: &Metrics, event: &Event<'_>, meta: &EventMeta<'_>, was: &str) {
    let counter = &metrics.other_tenant_events;
    counter.inc();
    let n = counter.get();
    if n.is_power_of_two() {
        use crate::contract::event::printable;
        let tenant = (event.tenant.as_deref())
            .map(|t| printable(&crate::engine::state::kept_label(t)).into_owned())
            .unwrap_or_default();
        warn!(
            topic = meta.topic,
            partition = meta.partition,
            offset = meta.offset,
            session_id = %printable(&event.session_id),
            tenant = %tenant,
            session_tenant = %printable(was),
            count = n,
            "input event names another tenant than its session had: two tenants' sessions share this session_id and are judged as one (make session ids unique across tenants: prefix them with the tenant), or its producers name the session's tenant differently"
        );
    }
}

/// Adds to the process-wide counters the events the engine counted from `before` to
/// `now` that are not counted elsewhere (late, after a completion).
fn add_counted_since(before: EngineCounters, now: EngineCounters, metrics: &Metrics) {
    for (counter, counted) in [
        (&metrics.late_events, now.late_events - before.late_events),
        (
            &metrics.events_after_completion,
            now.after_completion - before.after_completion,
        ),
    ] {
        if counted > 0 {
            counter.inc_by(counted);
        }
    }
}

/// Counts (once, `loopwarden_sessions_unstopped_total`) and logs a terminated session's
/// event that is its [`UNSTOPPED_AFTER`]th since the termination or a later power of two:
/// the runtime did not stop the session (its kill path did not act, or missed the
/// verdict), which goes on unjudged, its spend unbounded (its events are dropped).
fn note_unheeded_termination(
    metrics: &Metrics,
    event: &Event<'_>,
    meta: &EventMeta<'_>,
    unheeded: UnheededTermination,
) {
    use crate::contract::event::printable;
    if unheeded.events == UNSTOPPED_AFTER {
        metrics.sessions_unstopped.inc();
    }
    warn!(
        topic = meta.topic,
        partition = meta.partition,
        offset = meta.offset,
        session_id = %printable(&event.session_id),
        stop_reason = unheeded.detector.name(),
        events_after_termination = unheeded.events,
        secs_after_termination = unheeded.after_ms / 1000,
        "terminated session still sends events: its runtime did not stop it (route session.terminated to the runtime's kill path, or run loopwarden-guard in the agent process); its events are dropped unjudged"
    );
}

/// Input events not keyed by their `session_id`, counted by how. DESIGN §1 asks producers
/// to key by it, so that a session stays in one partition; one that is not may be judged
/// in pieces.
struct Miskeyed {
    missing: IntCounter,
    other: IntCounter,
}

impl Miskeyed {
    fn of(metrics: &Metrics) -> Miskeyed {
        let by = |key: &str| metrics.events_miskeyed.with_label_values(&[key]);
        Miskeyed {
            missing: by("missing"),
            other: by("other"),
        }
    }

    /// Counts (and logs, at the 1st, 2nd, 4th, 8th… of each kind) `m` when its key is
    /// not `session_id`.
    fn check(&self, m: &impl Message, session_id: &str) {
        let (key, counter) = match m.key() {
            None => ("missing", &self.missing),
            Some(k) if k != session_id.as_bytes() => ("other", &self.other),
            Some(_) => return,
        };
        counter.inc();
        let n = counter.get();
        if n.is_power_of_two() {
            warn!(
                topic = m.topic(),
                partition = m.partition(),
                offset = m.offset(),
                session_id = %crate::contract::event::printable(session_id),
                key,
                count = n,
                "input message not keyed by its session_id: the session may be split over partitions"
            );
        }
    }
}

/// A batch from its records' send to its store: what is stored and committed once the
/// broker has acknowledged every record.
pub(super) struct Unacked {
    pub(super) changes: Vec<(i32, StoreBatch)>,
    /// The input offsets to commit once stored.
    pub(super) offsets: TopicPartitionList,
    /// Its changelog batch id.
    pub(super) batch: u64,
    /// When its events were polled (processing latency), a count per partition taken.
    pub(super) polled: Vec<PolledTimes>,
    pub(super) sent: Instant,
    /// The outbox's mark after its records (its findings, dead letters and changelog
    /// session records; the next batch's come after).
    pub(super) records_end: usize,
    /// The outbox's mark after its changelog commit records, once they are sent (as soon
    /// as its records were acknowledged, [`Worker::send_commit_records_once_acked`]).
    pub(super) commits_end: Option<usize>,
}

impl Unacked {
    /// Its changelog commit records are still to send.
    pub(super) fn commits_due(&self) -> bool {
        self.commits_end.is_none() && !self.changes.is_empty()
    }

    /// Queues its changelog commit records, written by the consumer group `group`, and
    /// returns the outbox's mark after them.
    pub(super) fn queue_commits(&self, outbox: &mut Outbox, group: &str) -> usize {
        changelog::queue_commits(outbox, &self.changes, self.batch, group);
        outbox.end()
    }
}

/// At a partition's first skipped event since it was loaded: skipping is what a restart
/// does with what it applied before, but a log that ends at or before the offset the state
/// applied (the client's high watermark, as the fetch that brought the event left it) is
/// not the log the state was applied from. Says so once, as a warning.
fn check_log_end(p: &mut Partition, topic: &str, partition: i32, input: &dyn Input) {
    let last = p.applied.get(topic).copied();
    let end = input
        .cached_watermarks(topic, partition)
        .map(|(_, high)| high);
    let behind = matches!((last, end), (Some(last), Some(end)) if end <= last);
    p.log_ends_before_state = Some(behind);
    if behind {
        warn!(
            topic,
            partition,
            log_end = end,
            applied = last,
            "the partition's log ends before the offset this state applied (a topic made again, or a cluster replaced, under this state directory?): its events up to that offset are skipped as already applied; start over with an empty state.path"
        );
    }
}

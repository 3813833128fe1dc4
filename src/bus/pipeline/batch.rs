//! A batch's end, as a recipe ([`Worker::finish_batch`]): at least once, acknowledge
//! the batch before → apply what is left → take the changes → send them with the
//! changelog → hand the batch before to the store writer, and commit the input offsets of
//! the batches it has stored; exactly once, one transaction, then the store. At least
//! once with a commit interval, a batch's end takes the changes of the partitions that
//! come due ([`super::partition::Partition::take_turn`]); the others' wait in their
//! engines, uncommitted, for a later end (a stop takes every partition's, a revoke the
//! revoked partitions').
//!
//! Guarantees: a batch's input offsets are committed only after every record it sent is
//! acknowledged and its state stored (the writer's report); a partition's offsets go
//! only with its changes, so those committed are always those its stored state reflects,
//! and every record sent before them was acknowledged first; nothing of a batch's
//! changelog records is sent before the batch before it is acknowledged (so the changelog
//! holds whole batches in order); exactly once, a batch's findings, changelog records and
//! offsets are one transaction. At least once, an offset commit that failed is sent again
//! (at most once a second) while its partition is held and no later commit of it was
//! sent, and never after the partition is given up (its next owner's offsets govern).

use std::time::{Duration, Instant};

use rdkafka::consumer::CommitMode;
use rdkafka::TopicPartitionList;
use rustc_hash::FxHashMap;
use tracing::{debug, warn};

use super::backoff::Backoff;
use super::bus::{offsets_list, refused_while_the_group_changes, Input};
use super::changelog::{self, SessionRecords, CHANGELOG_POSITION};
use super::commit::Transactional;
use super::outbox::Outbox;
use super::worker::{Storing, Unacked, Worker};
use super::writer::Job;
use super::PipelineError;
use crate::bus::kafka::settings::KafkaSettings;
use crate::engine::store::StoreBatch;
use crate::shutdown::Shutdown;

/// Logs a commit that failed at once: at info while the group changes (a revoke's own
/// commit in a rebalance, which the next owner's restore does not need: it skips what the
/// stored offsets say was applied), else as a warning.
fn log_commit_failure(error: &rdkafka::error::KafkaError, message: &'static str) {
    if refused_while_the_group_changes(error.rdkafka_error_code()) {
        tracing::info!(%error, "{message}");
    } else {
        warn!(%error, "{message}");
    }
}

/// A batch's poll instants are counted to this: an event's processing latency reads up
/// to this much long.
pub(super) const POLLED_RESOLUTION: Duration = Duration::from_millis(1);

/// When a partition's events were polled since its changes were last taken, for the
/// processing-latency histogram: how many in each millisecond after the first event
/// counted (and, for events polled before it, held for another topic and applied after
/// it, in each millisecond before). It holds one count a millisecond of the span its
/// events were polled over, whatever their number or order (a batch's length, or with a
/// commit interval up to the interval: 60,000 counts at most): one instant an event held
/// 16 bytes for each, 78 MB for a 10-second batch at 490,000 events/s, twice over while
/// the batch before awaits its store.
#[derive(Debug, Default)]
pub(super) struct PolledTimes {
    /// The first event counted: the milliseconds are counted from it.
    anchor: Option<Instant>,
    /// Events polled in each millisecond from `anchor` (`[anchor + i ms, anchor + i + 1 ms)`).
    after: Vec<u32>,
    /// Events polled in each millisecond before it (`[anchor - (i + 1) ms, anchor - i ms)`).
    before: Vec<u32>,
}

impl PolledTimes {
    /// Counts an event polled at `at` (once an event: whole milliseconds in 64 bits, not
    /// a division of `Duration::as_nanos`'s 128).
    pub(super) fn push(&mut self, at: Instant) {
        const _: () = assert!(POLLED_RESOLUTION.as_nanos() == 1_000_000, "counted in ms");
        let millis = |d: Duration| d.as_secs() * 1_000 + u64::from(d.subsec_millis());
        let anchor = *self.anchor.get_or_insert(at);
        let (counts, index) = match at.checked_duration_since(anchor) {
            Some(later) => (&mut self.after, millis(later)),
            // `[anchor - (i + 1) ms, anchor - i ms)`: `at` is strictly before `anchor`.
            None => (
                &mut self.before,
                millis(anchor - at - Duration::from_nanos(1)),
            ),
        };
        let index = index as usize;
        if counts.len() <= index {
            counts.resize(index + 1, 0);
        }
        counts[index] = counts[index].saturating_add(1);
    }

    /// Observes each event's latency until `done`, from the start of its millisecond.
    pub(super) fn observe_until(&self, done: Instant, latency: &prometheus::Histogram) {
        let Some(anchor) = self.anchor else {
            return;
        };
        // Observed locally and added at once: a histogram's observe is a few atomic adds,
        // and this is one per event.
        let local = latency.local();
        let observe = |start: Option<Instant>, n: u32| {
            let seconds = start.map_or(0.0, |s| done.saturating_duration_since(s).as_secs_f64());
            for _ in 0..n {
                local.observe(seconds);
            }
        };
        for (i, &n) in self.after.iter().enumerate() {
            observe(anchor.checked_add(POLLED_RESOLUTION * i as u32), n);
        }
        for (i, &n) in self.before.iter().enumerate() {
            observe(anchor.checked_sub(POLLED_RESOLUTION * (i as u32 + 1)), n);
        }
        local.flush();
    }

    pub(super) fn clear(&mut self) {
        *self = PolledTimes::default();
    }

    /// The counts it holds (its memory).
    #[cfg(test)]
    fn counts(&self) -> usize {
        self.after.len() + self.before.len()
    }
}

/// How far [`Worker::finish_batch`] takes a batch before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The poll loop: at_least_once leaves the batch's records in flight while the next
    /// batch is polled (handed to the store writer once acknowledged, at the next batch's
    /// end, and committed once stored); the offset commit does not wait for the broker.
    Overlap,
    /// A revoke or a stop: the batch acknowledged, stored and committed (waiting for the
    /// writer and the commit) before it returns.
    Settle,
}

/// The changes a batch's end takes ([`Worker::take_changes`]).
#[derive(Default)]
struct Taken {
    /// Each partition taken's store batch (its sessions and applied offsets).
    changes: Vec<(i32, StoreBatch)>,
    /// Their input offsets, to commit once the batches are stored.
    offsets: TopicPartitionList,
    /// When their events were polled, a count per partition taken.
    polled: Vec<PolledTimes>,
}

/// An acknowledged batch and the changelog offsets its records reached.
type Acked = (Unacked, FxHashMap<i32, i64>);

impl Worker {
    /// Takes the changes of every changed partition whose turn it is at `now`, or that a
    /// revoke takes away (with `all`, of every changed partition: a stop, a transaction):
    /// sessions + offsets, one batch each, the offsets to commit once they are stored,
    /// and when their events were polled.
    fn take_changes(&mut self, all: bool, now: Instant) -> Taken {
        let mut taken = Taken::default();
        let interval = self.config.kafka.commit_interval;
        for (&partition, p) in &mut self.partitions {
            let forced = all || self.revoking.contains(&partition);
            if !forced && !p.take_turn(now, interval) {
                continue;
            }
            if let Some((batch, polled)) = p.take_changes(partition, &mut taken.offsets) {
                taken.changes.push((partition, batch));
                taken.polled.push(polled);
            }
        }
        taken
    }

    /// Hands an acknowledged batch to the store writer (one atomic sled batch per
    /// partition, the database flushed after them where sled is the only record of the
    /// state); its input offsets are committed once it is stored
    /// ([`Worker::commit_stored`]). Without the changelog, sled is the only record of the
    /// state: it reaches the disk before the offsets are committed. With it, the changelog
    /// and the group's offsets already hold the batch, so the fsync stays off the batch's
    /// path (sled flushes in the background): after a crash, the restore reads whatever
    /// sled missed from the changelog, from the last position sled holds.
    fn store(&mut self, (batch, positions): Acked) {
        let mut batches = Vec::with_capacity(batch.changes.len());
        let mut offsets = batch.offsets;
        for (partition, mut changes) in batch.changes {
            // A partition released since is neither written nor committed (not expected:
            // a revoke settles the batch first, a lost assignment drops it).
            let Some(p) = self.partitions.get(&partition) else {
                warn!(partition, "a released partition's batch is not stored");
                offsets = without_partition(&offsets, partition);
                continue;
            };
            if let Some(o) = positions.get(&partition) {
                changes.offsets.push((CHANGELOG_POSITION.to_string(), *o));
            }
            batches.push((partition, p.store.clone(), changes));
        }
        let partitions = batches.iter().map(|(p, _, _)| *p).collect();
        let (states, bytes) = batches
            .iter()
            .flat_map(|(_, _, c)| &c.puts)
            .fold((0u64, 0u64), |(n, b), (_, state)| {
                (n + 1, b + state.len() as u64)
            });
        let metrics = &self.telemetry.metrics;
        metrics.states_written.inc_by(states);
        metrics.states_written_bytes.inc_by(bytes);
        let waited = Instant::now();
        self.writer.hand(Job {
            batches,
            flush: !self.commit.changelog(),
        });
        // Only when the writer is `QUEUED_MAX` batches behind.
        let waited = waited.elapsed();
        if waited >= Duration::from_millis(1) {
            debug!(
                waited_ms = waited.as_secs_f64() * 1e3,
                "waited for the store writer"
            );
        }
        self.storing.push_back(Storing {
            offsets,
            partitions,
            polled: batch.polled,
            stored: None,
        });
    }

    /// Commits the input offsets of the batches the writer has stored, in hand-over
    /// order (at_least_once; exactly_once committed them in the transaction): those
    /// stored so far, or with `settle` every batch handed over, waiting for the writer.
    /// A batch the writer could not store ends the run (its offsets are not committed).
    pub(super) fn commit_stored(
        &mut self,
        input: &dyn Input,
        mode: CommitMode,
        settle: bool,
    ) -> Result<(), PipelineError> {
        self.collect_stored(settle);
        let mut refused = false;
        while self.storing.front().is_some_and(|s| s.stored.is_some()) {
            let Some(Storing {
                offsets,
                polled,
                stored: Some(stored),
                ..
            }) = self.storing.pop_front()
            else {
                unreachable!("checked above");
            };
            stored.result?;
            self.telemetry
                .metrics
                .store_written_bytes
                .inc_by(stored.bytes);
            refused |= self.commit_offsets(offsets, polled, stored.wrote, stored.took, input, mode);
            // The states written, freed on the thread that allocated them.
            drop(stored.spent);
        }
        // A stop or a revoke whose own (synchronous) commit was just refused does not wait
        // for another (a coordinator that is gone holds each up to the session timeout):
        // what it owes is sent at the poll loop's next call, or the next stop's.
        if self.commit.at_least_once() && !(settle && refused) {
            self.send_owed_commits(input, mode, settle);
        }
        Ok(())
    }

    /// Sends again the offsets whose commit failed (the coordinator refuses those sent
    /// while the group rebalances) and that no later commit of their partition replaced:
    /// a partition quiet after a rebalance would otherwise leave the group's offset, which
    /// lag dashboards and a restart read, where it was until its next event. At most once
    /// every [`OWED_COMMIT_RETRY`](super::bus::OWED_COMMIT_RETRY), but at once when
    /// settling (a revoke, a stop: the last chance, synchronous). Only partitions the
    /// worker holds: one it gave up is its next owner's to commit.
    fn send_owed_commits(&mut self, input: &dyn Input, mode: CommitMode, settle: bool) {
        for failed in input.take_failed_commits() {
            let key = self
                .input_index(&failed.topic)
                .map(|t| (t, failed.partition));
            self.commits_sent.note_failed(key, &failed);
        }
        if !self.commits_sent.due(settle) {
            return;
        }
        let (again, error) = self
            .commits_sent
            .take_owed(|(_, partition)| self.partitions.contains_key(partition));
        if again.is_empty() {
            return;
        }
        let owed = offsets_list(
            again
                .iter()
                .map(|&((topic, partition), offset)| (&*self.inputs[topic], partition, offset)),
        );
        match error {
            // Refused while the group changed (a rebalance): expected, and sent again.
            None => debug!(
                partitions = owed.count(),
                "sending offsets whose commit failed again"
            ),
            Some(error) => warn!(
                partitions = owed.count(),
                %error,
                "offset commit refused; sending the offsets again (the stored offsets still hold)"
            ),
        }
        let result = input.commit(&owed, mode);
        self.note_commits_sent(&owed, result.is_err());
        if let Err(e) = result {
            log_commit_failure(
                &e,
                "offset commit failed again; the stored offsets still hold",
            );
        }
    }

    /// Keeps the offsets in `offsets` as the last sent of their partitions, owed when
    /// their commit `failed` at once (a failure reported later comes through the input).
    fn note_commits_sent(&mut self, offsets: &TopicPartitionList, failed: bool) {
        for e in offsets.elements() {
            let (rdkafka::Offset::Offset(offset), Some(topic)) =
                (e.offset(), self.input_index(e.topic()))
            else {
                continue;
            };
            self.commits_sent
                .note_sent((topic, e.partition()), offset, failed);
        }
    }

    /// Commits a stored batch's input offsets, and counts the batch done; whether the
    /// commit failed at once.
    fn commit_offsets(
        &mut self,
        offsets: TopicPartitionList,
        polled: Vec<PolledTimes>,
        wrote: bool,
        store_took: Duration,
        input: &dyn Input,
        mode: CommitMode,
    ) -> bool {
        let telemetry = self.telemetry.clone();
        let metrics = &telemetry.metrics;
        if wrote {
            metrics.observe_stage("store", store_took);
            metrics.flush_duration.observe(store_took.as_secs_f64());
        }
        let started = Instant::now();
        let mut refused = false;
        if self.commit.at_least_once() && offsets.count() > 0 {
            let result = input.commit(&offsets, mode);
            refused = result.is_err();
            self.note_commits_sent(&offsets, refused);
            if let Err(e) = result {
                // sled holds the truth: a lost commit only means re-reading and skipping
                // (and it is sent again, `send_owed_commits`).
                log_commit_failure(&e, "offset commit failed; the stored offsets still hold");
            }
            let took = started.elapsed();
            metrics.observe_stage("commit", took);
            metrics.commit_duration.observe(took.as_secs_f64());
        }
        let done = Instant::now();
        for polled in &polled {
            polled.observe_until(done, &metrics.processing_latency);
        }
        self.stats.batches += 1;
        metrics.batches.inc();
        debug!(
            store_ms = store_took.as_secs_f64() * 1e3,
            commit_ms = (done - started).as_secs_f64() * 1e3,
            "batch finished"
        );
        refused
    }

    /// Ends a batch, as a recipe. at_least_once: the batch before is acknowledged, then
    /// its changelog commit records sent and acknowledged (none of this one's changelog
    /// records is sent before, so the changelog holds whole batches in order; its
    /// findings went out as they were found) → apply what is ready → take the changes →
    /// send (findings not sent yet, changelog session records) → hand the batch before
    /// to the store writer → commit the offsets of the batches it has stored (the rest
    /// are committed as the poll loop sees them stored, or at the next batch's end).
    /// This batch's acknowledgements are awaited at the next batch's end, while the next
    /// batch is polled: that round trip is off the path of the next batch's findings.
    /// Its commit records go out as soon as its records are acknowledged, also while the
    /// next batch is polled ([`Worker::send_commit_records_once_acked`]), else at that
    /// batch's end, one more round trip there. With [`Finish::Settle`] this batch is also
    /// acknowledged, and every batch handed to the writer stored and committed, before
    /// returning. exactly_once: apply → take the changes → one transaction (findings,
    /// changelog, offsets) → hand to the store writer.
    pub(super) fn finish_batch(
        &mut self,
        input: &dyn Input,
        finish: Finish,
    ) -> Result<(), PipelineError> {
        let mode = match finish {
            Finish::Overlap => CommitMode::Async,
            Finish::Settle => CommitMode::Sync,
        };
        let previous = self.acknowledge()?;
        self.apply_ready();
        let closing = Instant::now();
        // A stop takes every partition's changes (a revoke, those it takes away). Exactly
        // once, a transaction commits the batch's offsets with its findings: every
        // partition's changes go with it.
        let stop = finish == Finish::Settle && self.revoking.is_empty();
        let all = stop || self.commit.transaction().is_some();
        let Taken {
            changes,
            offsets,
            polled,
        } = self.take_changes(all, closing);
        let telemetry = self.telemetry.clone();
        let metrics = &telemetry.metrics;
        metrics.observe_stage("apply", std::mem::take(&mut self.applying));
        let mut this = Unacked {
            changes,
            offsets,
            batch: self.batch_ids.next(),
            polled,
            sent: Instant::now(),
            records_end: 0,
            commits_end: None,
        };
        let transaction = match self.commit.transaction() {
            None => None,
            Some(transaction) => Some(transact(
                transaction,
                &mut self.outbox,
                input,
                &mut this,
                &self.config.kafka,
                &self.shutdown,
            )?),
        };
        if transaction.is_some() {
            let took = this.sent.elapsed().as_secs_f64();
            self.telemetry.metrics.commit_duration.observe(took);
        }
        match transaction {
            None => {
                self.send(this);
                if let Some(previous) = previous {
                    self.store(previous);
                }
                // The polling thread's own share of a batch's end (a stop's or a
                // revoke's waits below are not): events wait in the consumer meanwhile.
                metrics.observe_stage("close", closing.elapsed());
                if finish == Finish::Settle {
                    if let Some(this) = self.acknowledge()? {
                        self.store(this);
                    }
                }
                self.commit_stored(input, mode, finish == Finish::Settle)?;
            }
            Some(false) => {
                // The group moved on: the batch is dropped and read again from the
                // committed offsets, by the new owner or (partitions we keep) by us.
                self.rewind(input)?;
            }
            Some(true) => {
                metrics.observe_stage("deliver", this.sent.elapsed());
                self.delivered(&this);
                let positions = self.outbox.take_changelog_positions();
                self.store((this, positions));
                self.commit_stored(input, mode, finish == Finish::Settle)?;
            }
        }
        self.report_gauges();
        Ok(())
    }

    /// at_least_once: waits until the broker has acknowledged the batch in flight
    /// (sending failures again with backoff), then returns it with the changelog
    /// positions it reached, ready to be stored.
    fn acknowledge(&mut self) -> Result<Option<Acked>, PipelineError> {
        let Some(unacked) = self.unacked.take() else {
            return Ok(None);
        };
        let waited = Instant::now();
        let mut backoff = Backoff::new(self.settings(), &self.shutdown);
        let undelivered =
            |why, outbox: &Outbox, b: &Backoff| PipelineError::undelivered(why, b, outbox.len());
        // Its records, and its commit records if they went out while this batch was
        // polled; not this batch's findings sent since.
        let mark = unacked.commits_end.unwrap_or(unacked.records_end);
        self.outbox
            .settle_below(mark, &mut backoff)
            .map_err(|why| undelivered(why, &self.outbox, &backoff))?;
        if self.commit.changelog_after_acks() && unacked.commits_due() {
            // Everything the batch produced is on the broker, and its session records:
            // now its commit records (see the changelog's module docs). Whatever of the
            // next batch waits in the outbox goes with them: its findings may precede
            // its store, and its changelog records are not queued yet.
            let end = unacked.queue_commits(&mut self.outbox, &self.config.kafka.group_id);
            self.outbox
                .settle_below(end, &mut backoff)
                .map_err(|why| undelivered(why, &self.outbox, &backoff))?;
        }
        self.telemetry
            .metrics
            .observe_stage("deliver", waited.elapsed());
        self.delivered(&unacked);
        let positions = self.outbox.take_changelog_positions();
        Ok(Some((unacked, positions)))
    }

    /// Counts a batch's outputs as on the broker: how long they took (each finding's
    /// produce → acknowledged latency is observed as its report arrives).
    fn delivered(&self, batch: &Unacked) {
        self.telemetry
            .metrics
            .delivery_duration
            .observe(batch.sent.elapsed().as_secs_f64());
    }

    /// at_least_once: hands the batch's records (with its changelog records) to the
    /// producer and keeps the batch until [`Worker::acknowledge`].
    fn send(&mut self, mut batch: Unacked) {
        if self.commit.changelog_after_acks() {
            changelog::queue_sessions(
                &mut self.outbox,
                &mut batch.changes,
                batch.batch,
                SessionRecords::of(&self.config.kafka),
            );
        }
        batch.records_end = self.outbox.end();
        self.outbox.send_all();
        if self.outbox.has_sent() || batch.offsets.count() > 0 || !batch.changes.is_empty() {
            self.unacked = Some(batch);
        }
    }
}

/// `offsets` without those of input partition `partition` (of every topic).
fn without_partition(offsets: &TopicPartitionList, partition: i32) -> TopicPartitionList {
    let mut kept = TopicPartitionList::new();
    for e in offsets.elements() {
        if e.partition() != partition {
            let _ = kept.add_partition_offset(e.topic(), e.partition(), e.offset());
        }
    }
    kept
}

/// exactly_once: the batch's records, its changelog records and its input offsets in one
/// transaction; `false` when the group moved on (the batch must be dropped).
fn transact(
    transaction: &Transactional,
    outbox: &mut Outbox,
    input: &dyn Input,
    batch: &mut Unacked,
    settings: &KafkaSettings,
    shutdown: &Shutdown,
) -> Result<bool, PipelineError> {
    let mut backoff = Backoff::new(settings, shutdown);
    // The transaction makes the batch atomic; the commit records still mark where each
    // batch ends, so one restore path serves both modes.
    changelog::queue(
        outbox,
        &mut batch.changes,
        batch.batch,
        &settings.group_id,
        SessionRecords::of(settings),
    );
    transaction.commit(outbox, input, &batch.offsets, &mut backoff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram() -> prometheus::Histogram {
        prometheus::Histogram::with_opts(prometheus::HistogramOpts::new("h", "h")).unwrap()
    }

    #[test]
    fn each_event_is_observed_once_from_the_start_of_its_millisecond() {
        let t0 = Instant::now() + Duration::from_secs(1);
        let at = |micros: u64| t0 + Duration::from_micros(micros);
        let mut polled = PolledTimes::default();
        // 1,000 events in the first 0.9 ms, one at 1 ms, one held back (polled 0.5 ms
        // before the first, applied after the one at 1 ms), one exactly 1 ms before, one
        // at 5 ms.
        let mut times: Vec<Instant> = (0..1_000u64)
            .map(|i| t0 + Duration::from_nanos(i * 900))
            .collect();
        times.extend([
            at(1_000),
            t0 - Duration::from_micros(500),
            t0 - Duration::from_micros(1_000),
            at(5_000),
        ]);
        for &t in &times {
            polled.push(t);
        }
        // Milliseconds 0, 1 and 5 after the first; the first before it.
        assert_eq!(polled.counts(), 6 + 1, "{polled:?}");
        let h = histogram();
        let done = at(10_000);
        polled.observe_until(done, &h);
        assert_eq!(h.get_sample_count(), 1_004, "every event observed once");
        let exact: f64 = times.iter().map(|&t| (done - t).as_secs_f64()).sum();
        let sum = h.get_sample_sum();
        assert!(sum >= exact - 1e-9, "never short: {sum} against {exact}");
        assert!(
            sum <= exact + times.len() as f64 * POLLED_RESOLUTION.as_secs_f64(),
            "at most the resolution long: {sum} against {exact}"
        );
    }

    #[test]
    fn events_of_two_topics_polled_apart_and_applied_in_turn_hold_a_count_a_millisecond() {
        // Two topics' fetches 5 ms apart, their events applied alternately (the aligner
        // releases by event time): one instant an event would not merge into runs.
        let t0 = Instant::now() + Duration::from_secs(1);
        let mut polled = PolledTimes::default();
        for i in 0..10_000u64 {
            let fetch = t0 + Duration::from_millis(10 * (i / 100));
            polled.push(fetch + Duration::from_millis(5 * (i % 2)));
        }
        assert!(polled.counts() <= 1_000, "{}", polled.counts());
    }

    #[test]
    fn a_long_batch_holds_a_count_a_millisecond_not_an_instant_an_event() {
        let t0 = Instant::now();
        let mut polled = PolledTimes::default();
        // Two seconds at 500,000 events/s, as the clock reads them (2 µs apart).
        for i in 0..1_000_000u64 {
            polled.push(t0 + Duration::from_micros(2 * i));
        }
        assert_eq!(polled.counts(), 2_000);
        polled.clear();
        assert_eq!(polled.counts(), 0);
    }
}

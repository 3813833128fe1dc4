//! Rebalances: the consumer's context takes what librdkafka hands over inside `poll`
//! (partitions revoked, assigned, or a rebalance error) and parks it; the poll loop then
//! hands it to its worker ([`serve`]), which finishes or drops the batch, loads or lets
//! go of partitions, and only then acknowledges the rebalance to librdkafka (the assign
//! or unassign call it waits for). So the worker is owned by the poll loop alone, and the
//! callback touches nothing of it (quickwit's Kafka source hands rebalances over the same
//! way). The same context keeps the offset commits librdkafka reports refused (their
//! answers come inside a poll too), for the worker to send again (`batch`).
//!
//! Guarantees: a revoked partition's batch is finished (delivered, stored, committed)
//! before the revoke is acknowledged, so its next owner starts where this one stopped;
//! an assignment that was *lost* (the group went on without us) commits nothing more of
//! those partitions, since another member may own them already, and stores only the
//! batches already with the store writer (acknowledged: their outputs are out); records
//! of a batch already in flight are seen delivered first (findings published twice at
//! worst, with one event id; the batch's changelog records carry no commit record, so no
//! restore applies them); an assigned partition is loaded from sled (and restored from
//! the changelog) before the assignment is acknowledged, so before it is fetched. A
//! restore that shutdown interrupts leaves its partition unloaded: not a failure. From a
//! revoke, a lost assignment or a rebalance error until the next assignment is loaded,
//! the worker's member counts as awaiting one (not ready, `/readyz`). Once
//! the worker has stopped (a stop, an error, a panic), rebalances are acknowledged at
//! once, so the consumer's close never waits on it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{ClientContext, TopicPartitionList};
use tracing::{error, info, warn};

use super::batch::Finish;
use super::bus::{failed_commits, CommitFailures, FailedCommit};
use super::lock;
use super::worker::Worker;
use super::PipelineError;

/// A rebalance as librdkafka handed it over, waiting for the worker.
enum Parked {
    Revoke(TopicPartitionList),
    Assign(TopicPartitionList),
    Error(KafkaError, TopicPartitionList),
}

/// The consumer's context: parks each rebalance for the poll loop's worker, and keeps the
/// offset commits that failed for it to send again.
#[derive(Default)]
pub struct RebalanceHandler {
    parked: Mutex<VecDeque<Parked>>,
    failed_commits: Mutex<Vec<FailedCommit>>,
    /// The worker has stopped and the consumer is closing: rebalances are acknowledged
    /// in the callback (nothing is left to finish).
    closing: AtomicBool,
}

/// The worker has stopped: rebalances still parked, and any from now on (the consumer's
/// close revokes everything), are acknowledged without it.
fn closing(consumer: &BaseConsumer<RebalanceHandler>) {
    let handler = consumer.context();
    handler.closing.store(true, Ordering::Release);
    loop {
        let Some(parked) = lock(&handler.parked).pop_front() else {
            return;
        };
        acknowledge(consumer, &parked);
    }
}

/// Switches the consumer to acknowledging rebalances itself when dropped (declared after
/// the consumer, it drops first): the consumer's close, which polls until librdkafka has
/// left the group, then never waits on a worker that is gone — after a stop, an error
/// or a panic alike.
pub(super) struct AcknowledgeOnDrop<'c>(pub(super) &'c BaseConsumer<RebalanceHandler>);

impl Drop for AcknowledgeOnDrop<'_> {
    fn drop(&mut self) {
        closing(self.0);
    }
}

/// The worker lets go of every partition it holds or is assigned (a stop: the gauges
/// lose its share, as a revoke would have taken it).
pub(super) fn release_all(consumer: &BaseConsumer<RebalanceHandler>, worker: &mut Worker) {
    let mut held: Vec<i32> = worker.partitions.keys().copied().collect();
    if let Ok(assigned) = consumer.assignment() {
        held.extend(partitions_of(&assigned));
    }
    held.sort_unstable();
    held.dedup();
    worker.release(&held);
}

impl ClientContext for RebalanceHandler {
    fn error(&self, error: KafkaError, reason: &str) {
        crate::bus::kafka::log_client_error("consumer", &error, reason);
    }
}

impl ConsumerContext for RebalanceHandler {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let parked = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => Parked::Assign(tpl.clone()),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => Parked::Revoke(tpl.clone()),
            other => Parked::Error(
                KafkaError::Rebalance(RDKafkaErrorCode::from(other)),
                tpl.clone(),
            ),
        };
        if self.closing.load(Ordering::Acquire) {
            acknowledge(consumer, &parked);
            return;
        }
        lock(&self.parked).push_back(parked);
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        let failed = failed_commits(&result, offsets);
        if !failed.is_empty() {
            lock(&self.failed_commits).extend(failed);
        }
    }
}

impl CommitFailures for RebalanceHandler {
    fn take_failed_commits(&self) -> Vec<FailedCommit> {
        std::mem::take(&mut *lock(&self.failed_commits))
    }
}

/// The partition numbers in `tpl`, each once.
fn partitions_of(tpl: &TopicPartitionList) -> Vec<i32> {
    let mut ps: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
    ps.sort_unstable();
    ps.dedup();
    ps
}

/// Tells librdkafka the rebalance is done: the assign or unassign call it waits for
/// (incremental under the cooperative protocol).
fn acknowledge(consumer: &BaseConsumer<RebalanceHandler>, parked: &Parked) {
    let cooperative = matches!(
        consumer.rebalance_protocol(),
        RebalanceProtocol::Cooperative
    );
    let result: KafkaResult<()> = match parked {
        Parked::Assign(tpl) if cooperative => consumer.incremental_assign(tpl),
        Parked::Assign(tpl) => consumer.assign(tpl),
        Parked::Revoke(tpl) | Parked::Error(_, tpl) if cooperative => {
            consumer.incremental_unassign(tpl)
        }
        Parked::Revoke(_) | Parked::Error(..) => consumer.unassign(),
    };
    if let Err(e) = result {
        error!(error = %e, "cannot acknowledge a rebalance");
    }
}

/// Hands every parked rebalance to `worker`, in order, acknowledging each once the
/// worker is done with it; whether there was any. The first fatal error is returned
/// (after the rest are served and acknowledged: librdkafka waits for every
/// acknowledgement, even while stopping).
pub(super) fn serve(
    consumer: &BaseConsumer<RebalanceHandler>,
    worker: &mut Worker,
) -> Result<bool, PipelineError> {
    let mut fatal = None;
    let mut served = false;
    loop {
        let Some(parked) = lock(&consumer.context().parked).pop_front() else {
            break;
        };
        served = true;
        let result = match &parked {
            Parked::Revoke(tpl) => revoke(consumer, worker, &partitions_of(tpl)),
            Parked::Assign(tpl) => assign(worker, &partitions_of(tpl)),
            Parked::Error(e, _) => {
                warn!(error = %e, "rebalance error");
                // Not expected (librdkafka 2.12 hands over only assignments and revokes).
                // It is acknowledged by giving up the assignment, so the worker holds
                // nothing until the group hands it one: not ready meanwhile.
                worker.member.awaiting_assignment();
                Ok(())
            }
        };
        acknowledge(consumer, &parked);
        if let Err(e) = result {
            fatal.get_or_insert(e);
        }
    }
    fatal.map_or(Ok(served), Err)
}

fn revoke(
    consumer: &BaseConsumer<RebalanceHandler>,
    worker: &mut Worker,
    revoked: &[i32],
) -> Result<(), PipelineError> {
    worker.member.awaiting_assignment();
    let result = if consumer.assignment_lost() {
        // No offsets are committed, and no state is written but the batches already with
        // the store writer (acknowledged: their outputs are out). Records already with
        // the producer may land (a batch whose commit records went out is then applied
        // by a restore, as after a crash: its outputs were on the broker first); their
        // events are consumed again by the new owner from the last committed point.
        warn!(partitions = ?revoked, "assignment lost; dropping the unstored batch");
        let dropped = worker.drop_unstored();
        if let Err(e) = &dropped {
            error!(error = %e, "the lost assignment's batches could not be settled");
        }
        dropped
    } else {
        worker.revoking = revoked.to_vec();
        let settled = worker.finish_batch(consumer, Finish::Settle);
        if let Err(e) = &settled {
            error!(error = %e, "cannot store the batch before the revoke");
        }
        worker.revoking.clear();
        settled
    };
    worker.release(revoked);
    info!(partitions = ?revoked, "partitions revoked");
    result
}

pub(super) fn assign(worker: &mut Worker, assigned: &[i32]) -> Result<(), PipelineError> {
    let mut fatal = None;
    for &p in assigned {
        match worker.acquire(p) {
            Ok(()) => {}
            Err(PipelineError::RestoreInterrupted { .. }) => {
                info!(
                    partition = p,
                    "restore interrupted by shutdown; the partition is left unloaded"
                );
            }
            Err(e) => {
                error!(partition = p, error = %e, "cannot load partition state");
                fatal.get_or_insert(e);
            }
        }
    }
    worker.loaded_assignment();
    if fatal.is_none() {
        worker.member.assignment_loaded();
    }
    worker.report_gauges();
    fatal.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_of_lists_each_number_once() {
        let mut tpl = TopicPartitionList::new();
        for (topic, p) in [("llm", 2), ("tools", 2), ("llm", 0), ("tools", 0)] {
            tpl.add_partition(topic, p);
        }
        assert_eq!(partitions_of(&tpl), vec![0, 2]);
    }
}

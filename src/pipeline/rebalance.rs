//! Rebalances: the consumer's context, called by librdkafka inside `poll` when the group
//! takes partitions away or hands new ones out.
//!
//! Guarantees: a revoked partition's batch is finished (delivered, stored, committed)
//! before the revoke is acknowledged, so its next owner starts where this one stopped;
//! an assignment that was *lost* (the group went on without us) stores and commits
//! nothing more of those partitions, since another member may own them already; records
//! of a batch already in flight are seen delivered first (findings published twice at
//! worst, with one event id; the batch's changelog records carry no commit record, so no
//! restore applies them); an assigned partition is loaded from sled (and restored from
//! the changelog) before it is consumed. A restore that shutdown interrupts leaves its
//! partition unloaded: not a failure.

use std::sync::Mutex;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::{ClientContext, TopicPartitionList};
use tracing::{error, info, warn};

use super::batch::Finish;
use super::outbox::lock;
use super::worker::Worker;
use super::PipelineError;

/// The consumer's context: owns the worker, so the poll loop and the callbacks (both on
/// the consumer's thread) share it without contention.
pub struct RebalanceHandler {
    pub(super) worker: Mutex<Worker>,
}

impl RebalanceHandler {
    pub(super) fn new(worker: Worker) -> RebalanceHandler {
        RebalanceHandler {
            worker: Mutex::new(worker),
        }
    }
}

impl ClientContext for RebalanceHandler {
    fn error(&self, error: KafkaError, reason: &str) {
        warn!(client = "consumer", %error, reason, "kafka client error");
    }
}

/// The partition numbers in `tpl`, each once.
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
                    // Nothing of them may be written — no findings, no changelog, no
                    // state. Their events are consumed again by the new owner from the
                    // last committed point.
                    warn!(partitions = ?revoked, "assignment lost; dropping the unstored batch");
                    w.drop_unstored();
                } else {
                    w.revoking.clone_from(&revoked);
                    if let Err(e) = w.finish_batch(consumer, Finish::Settle) {
                        error!(error = %e, "cannot store the batch before the revoke");
                        w.fatal.get_or_insert(e);
                    }
                    w.revoking.clear();
                }
                w.release(&revoked);
                info!(partitions = ?revoked, "partitions revoked");
            }
            Rebalance::Assign(tpl) => {
                for p in partitions_of(tpl) {
                    match w.acquire(p) {
                        Ok(()) => {}
                        Err(PipelineError::RestoreInterrupted { .. }) => {
                            info!(
                                partition = p,
                                "restore interrupted by shutdown; the partition is left unloaded"
                            );
                        }
                        Err(e) => {
                            error!(partition = p, error = %e, "cannot load partition state");
                            w.fatal.get_or_insert(e);
                        }
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

//! How a batch becomes durable: the delivery mode as one type ([`Commit`]), and the
//! transactions of exactly_once.
//!
//! - `AtLeastOnce { changelog }`: the outbox is delivered (findings, and with the
//!   changelog its session records, then its commit records), the state is stored in
//!   sled, then the group's offsets are committed. A crash between any two steps
//!   re-applies events after the stored offsets; their findings come again with the same
//!   `event_id`.
//! - `ExactlyOnce(Transactional)`: findings, changelog records and the input offsets go in
//!   one Kafka transaction; sled is written after the commit. A crash before the commit
//!   aborts it all (the restart fences the old producer); after it, the changelog holds
//!   what sled may have missed.
//!
//! Guarantees: a transaction that fails abortably is aborted and the same batch is sent
//! again in a new one (the engine state it came from is unchanged); a fenced group
//! generation drops the batch and moves the consumer back to the committed offsets
//! (whoever owns the partitions now reads it again; when the consumer cannot be moved
//! back, the run ends rather than go on past the batch); a fatal producer error ends the
//! run.

use std::path::Path;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::TopicPartitionList;
use tracing::{info, warn};

use super::backoff::{Backoff, DeadlinePassed};
use super::bus::Input;
use super::outbox::Outbox;
use super::PipelineError;
use crate::bus::kafka::settings::{Delivery, KafkaSettings};
use crate::bus::kafka::transactional_id;

/// The delivery mode of a worker.
pub enum Commit {
    AtLeastOnce { changelog: bool },
    ExactlyOnce(Transactional),
}

impl Commit {
    /// The mode the settings ask for, for worker `worker` of the instance whose state
    /// lives at `state_path` (the transactional id depends on both).
    pub fn of(settings: &KafkaSettings, state_path: &Path, worker: usize) -> Commit {
        match settings.delivery {
            Delivery::AtLeastOnce => Commit::AtLeastOnce {
                changelog: settings.changelog,
            },
            Delivery::ExactlyOnce => Commit::ExactlyOnce(Transactional {
                id: transactional_id(settings, state_path, worker),
            }),
        }
    }

    /// Whether stored batches are also written to the changelog topic.
    pub fn changelog(&self) -> bool {
        match self {
            Commit::AtLeastOnce { changelog } => *changelog,
            // Validated: exactly_once needs the changelog.
            Commit::ExactlyOnce(_) => true,
        }
    }

    pub fn transactional_id(&self) -> Option<&str> {
        self.transaction().map(|t| t.id.as_str())
    }

    /// exactly_once: the transaction that carries each batch.
    pub fn transaction(&self) -> Option<&Transactional> {
        match self {
            Commit::AtLeastOnce { .. } => None,
            Commit::ExactlyOnce(t) => Some(t),
        }
    }

    /// at_least_once: findings go to the producer as they are found, and the group's
    /// offsets are committed after the store (exactly_once: both wait for the batch's
    /// transaction).
    pub fn at_least_once(&self) -> bool {
        matches!(self, Commit::AtLeastOnce { .. })
    }

    /// at_least_once with the changelog: a batch's session records go out with it and
    /// its commit records once everything it sent is acknowledged (exactly_once queues
    /// both into its transaction).
    pub fn changelog_after_acks(&self) -> bool {
        matches!(self, Commit::AtLeastOnce { changelog: true })
    }
}

/// How long one transaction call (send offsets, commit, abort) may block before it is
/// retried; the shutdown deadline bounds the retries.
pub const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The transactional producer's identity (stable per instance and worker).
pub struct Transactional {
    pub id: String,
}

impl Transactional {
    fn failed(&self, source: KafkaError) -> PipelineError {
        PipelineError::Transaction {
            transactional_id: self.id.clone(),
            source,
        }
    }

    /// Registers the transactional producer with the broker, which fences any earlier
    /// producer with the same id and aborts the transaction it left open. Retries while
    /// the broker is away; `false` when shutdown came first.
    pub fn init(&self, outbox: &Outbox, backoff: &mut Backoff) -> Result<bool, PipelineError> {
        loop {
            match outbox.transport.init_transactions(TRANSACTION_CALL_TIMEOUT) {
                Ok(()) => {
                    info!(transactional_id = %self.id, "transactional producer ready");
                    return Ok(true);
                }
                Err(e) if is_fatal(&e) => return Err(self.failed(e)),
                Err(e) => {
                    warn!(transactional_id = %self.id, error = %e, backoff_ms = backoff.delay_ms(), "cannot initialise transactions; retrying");
                    if backoff.sleep() {
                        return Ok(false);
                    }
                }
            }
        }
    }

    /// Commits the outbox and the input `offsets` as one transaction. After an abortable
    /// failure the same records and offsets are sent again in a new transaction. Returns
    /// `false` when the consumer group has moved on (our generation is fenced): the batch
    /// must then be dropped and its events read again by whoever owns them now.
    pub fn commit(
        &self,
        outbox: &mut Outbox,
        input: &dyn Input,
        offsets: &TopicPartitionList,
        backoff: &mut Backoff,
    ) -> Result<bool, PipelineError> {
        if outbox.is_empty() && offsets.count() == 0 {
            return Ok(true);
        }
        loop {
            let error = match self.attempt(outbox, input, offsets, backoff) {
                Ok(()) => {
                    crash_point("txn-after-commit");
                    outbox.clear();
                    return Ok(true);
                }
                Err(e) => e,
            };
            if is_fatal(&error) {
                return Err(self.failed(error));
            }
            warn!(error = %error, records = outbox.len(), backoff_ms = backoff.delay_ms(), "transaction failed; aborting it");
            self.abort(outbox, backoff)?;
            outbox.retried(outbox.len());
            outbox.take_failed();
            if is_group_fenced(&error) {
                return Ok(false);
            }
            backoff
                .pause()
                .map_err(|DeadlinePassed| PipelineError::deadline(backoff, outbox.len()))?;
        }
    }

    /// One transaction: begin, send and await every record, send the offsets, commit.
    fn attempt(
        &self,
        outbox: &mut Outbox,
        input: &dyn Input,
        offsets: &TopicPartitionList,
        backoff: &Backoff,
    ) -> Result<(), KafkaError> {
        outbox.transport.begin_transaction()?;
        let all: Vec<usize> = (0..outbox.len()).collect();
        outbox.send(&all);
        // Await the acks (commit would flush too): a failed record is known before the
        // offsets are sent, and the records are on the broker at the crash point below.
        let _ = outbox.await_acks(backoff);
        if let Some(e) = outbox.first_failure() {
            // A record that failed (or the producer refused) is not in the transaction.
            return Err(e);
        }
        if offsets.count() > 0 {
            // A call that timed out while the broker was slow may be retried (librdkafka's
            // contract); aborting instead would throw away a batch already on the broker.
            retrying(backoff, "transaction offsets", || {
                outbox.transport.send_offsets_to_transaction(
                    offsets,
                    input,
                    TRANSACTION_CALL_TIMEOUT,
                )
            })?;
        }
        crash_point("txn-before-commit");
        retrying(backoff, "transaction commit", || {
            outbox
                .transport
                .commit_transaction(TRANSACTION_CALL_TIMEOUT)
        })
    }

    /// Aborts the open transaction, retrying while the broker is away.
    fn abort(&self, outbox: &Outbox, backoff: &mut Backoff) -> Result<(), PipelineError> {
        let mut abort_backoff = backoff.fresh();
        loop {
            match outbox.transport.abort_transaction(TRANSACTION_CALL_TIMEOUT) {
                Ok(()) => return Ok(()),
                Err(e) if is_fatal(&e) => return Err(self.failed(e)),
                Err(e) => {
                    warn!(error = %e, "transaction abort not confirmed yet; retrying");
                    if abort_backoff.pause().is_err() {
                        return Err(PipelineError::deadline(backoff, outbox.len()));
                    }
                }
            }
        }
    }
}

fn rd_error(e: &KafkaError) -> Option<&rdkafka::error::RDKafkaError> {
    match e {
        KafkaError::Transaction(rd) => Some(rd),
        _ => None,
    }
}

fn is_fatal(e: &KafkaError) -> bool {
    rd_error(e).is_some_and(|rd| rd.is_fatal())
}

/// `call` again while it fails with a retriable error and `backoff`'s deadline holds.
fn retrying(
    backoff: &Backoff,
    what: &str,
    mut call: impl FnMut() -> Result<(), KafkaError>,
) -> Result<(), KafkaError> {
    let mut pause = backoff.fresh();
    loop {
        match call() {
            Ok(()) => return Ok(()),
            Err(e) if is_retriable(&e) && !backoff.past_deadline() => {
                warn!(error = %e, what, "not confirmed yet; retrying");
                let _ = pause.pause();
            }
            Err(e) => return Err(e),
        }
    }
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

/// A crash point for the crash tests (feature `failpoints`, off in release builds): when
/// armed through `FAILPOINTS`, the process exits on the spot, as if killed.
pub fn crash_point(name: &str) {
    #[cfg(feature = "failpoints")]
    if fail::eval(name, |_| ()).is_some() {
        eprintln!("failpoint {name}: exiting");
        std::process::exit(86);
    }
    let _ = name;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shutdown::Shutdown;

    /// A transactional call is tried again while it fails retriably (a call that timed
    /// out while the broker was slow), not again after any other error or past the
    /// shutdown deadline.
    #[test]
    fn retrying_repeats_only_retriable_failures_within_the_deadline() {
        let retriable = || KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut);
        let settings = KafkaSettings {
            retry_backoff_min: Duration::from_millis(1),
            retry_backoff_max: Duration::from_millis(2),
            shutdown_deadline: Duration::from_millis(200),
            ..KafkaSettings::default()
        };
        let shutdown = Shutdown::new();
        let backoff = Backoff::new(&settings, &shutdown);
        let mut calls = 0;
        let twice_then_ok = retrying(&backoff, "test", || {
            calls += 1;
            if calls < 3 {
                Err(retriable())
            } else {
                Ok(())
            }
        });
        assert!(twice_then_ok.is_ok());
        assert_eq!(calls, 3);

        let mut calls = 0;
        let refused = retrying(&backoff, "test", || {
            calls += 1;
            Err(KafkaError::Subscription("no group".into()))
        });
        assert!(matches!(refused, Err(KafkaError::Subscription(_))));
        assert_eq!(calls, 1, "not retriable: returned at once");

        // After shutdown, retried until the deadline, then the error is returned.
        shutdown.trigger();
        let mut calls = 0;
        let late = retrying(&backoff, "test", || {
            calls += 1;
            Err(retriable())
        });
        assert!(matches!(late, Err(KafkaError::Flush(_))));
        assert!(calls > 1, "{calls} calls: retried before the deadline");
    }
}

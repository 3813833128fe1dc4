//! `loopwarden run`: the engine on the bus (DESIGN §6). A consumer group reads the input
//! topics; each assigned partition number has its own [`Engine`](crate::engine::Engine)
//! and its own sled tree; findings and summaries go to the output topics, bad messages to
//! the dead-letter topic.
//!
//! Guarantees (at-least-once end to end), per batch and in this order:
//! 1. apply: polled messages are applied to their partition's engine (or dead-lettered)
//!    as they come, in event-time order across the input topics (`align`); at least
//!    once, their findings are produced at once;
//! 2. deliver: every output record of the batch is produced and acknowledged — failures
//!    are retried with backoff, never dropped (`outbox`; in exactly_once one transaction
//!    holds outputs, changelog and offsets: `commit`). At least once, the batch's records
//!    are acknowledged while the next batch is polled, and before any of the next
//!    batch's changelog records is sent (so the changelog keeps whole batches in order);
//! 3. store: each changed partition writes its session states and its applied offsets in
//!    one atomic sled batch (with a commit interval, at least once, only the partitions
//!    whose turn it is: the others' changes and offsets wait in their engines, and step 4
//!    commits nothing of them); without the changelog the database is flushed to disk here,
//!    with it sled flushes in the background (the changelog already holds the batch, and
//!    a restart restores from it what sled had not written). The worker's store writer
//!    does this on a thread of its own while the worker polls the next batch;
//! 4. commit: the consumer group's offsets are committed, once the writer reports the
//!    batch stored.
//!
//! A crash between any two steps loses nothing: events after the stored offset are
//! applied again (and re-emit findings with the same `event_id`), events at or below it
//! are skipped, so no session counts an event twice. A revoked partition is stored before
//! the revoke is acknowledged (`rebalance`). Session expiry runs on a per-partition
//! clock: the latest event time, advanced by wall-clock time while the partition is idle.
//!
//! The modules, in the order a batch meets them:
//! - `mod.rs` (this): `run`, the worker threads, and the poll loop that cuts batches;
//! - `worker`: a group member's partitions, events applied as they are polled;
//! - `batch`: the batch recipe (`finish_batch`): acknowledge, send, store, commit;
//! - `writer`: the store writer, a worker's thread that writes its stored batches;
//! - `partition`: one assigned partition, and a polled message made an event or a dead
//!   letter;
//! - `align`: event-time order across a partition's input topics;
//! - `outputs`: findings and summaries counted, given spans, made records;
//! - `outbox`: records, their topics, dead letters, delivery until acknowledged;
//! - `commit`: the delivery mode (`Commit`) and exactly_once's transactions;
//! - `changelog`: the changelog's format and writer; `changelog::restore`, its reader;
//! - `rebalance`: what happens when the group revokes or assigns partitions (parked by
//!   the consumer's context, served by the poll loop's worker, then acknowledged);
//! - `bus`: the seams to the bus, as traits (`Input`: what the recipe asks of the
//!   consumer; `Transport`: of the producer), with their Kafka implementations; `memory`
//!   (tests only) implements them, and the changelog's `ChangelogSource`, in memory, so
//!   that `recipe_tests` drives the recipe and a crash at each of its windows without a
//!   broker;
//! - `backoff`: the one shutdown-aware retry rhythm;
//! - `ingest`: `[ingest.otlp]`, traces on the bus re-published as events (its own group).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::client::{Client, ClientContext};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use tracing::{error, info, warn};

use crate::bus::kafka::settings::KafkaSettings;
use crate::bus::kafka::{
    check_topics, consumer_config, ensure_changelog, group_instance_id, partition_counts,
    producer_config, TopicError,
};
use crate::config::Config;
use crate::engine::store::{open_db_with_cache, StoreError};
use crate::shutdown::{Shutdown, StopOnPanic};
use crate::telemetry::{GroupMember, Telemetry};
use changelog::Restorer;
use holds::PartitionHolds;

/// A mutex's guard, whether or not a thread panicked while holding it (what it guards
/// stays consistent: every holder leaves it whole before anything can panic).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

mod align;
mod backoff;
mod batch;
mod bus;
mod changelog;
mod commit;
mod holds;
mod ingest;
#[cfg(test)]
mod memory;
mod outbox;
mod outputs;
mod partition;
mod rebalance;
#[cfg(test)]
mod recipe_tests;
mod unacknowledged;
mod worker;
mod writer;

use backoff::Backoff;
use batch::Finish;
#[doc(hidden)]
pub use changelog::{assemble as assemble_changelog, RecordParts as ChangelogRecordParts};
pub use changelog::{changelog_compaction_lag, CHANGELOG_KIND, CHANGELOG_STATE_FORMAT};
use commit::Commit;
pub use ingest::{run_ingest, IngestStats};
use outbox::{Outbox, Undelivered};
pub use outbox::{
    DLQ_MESSAGE, DLQ_REASON, DLQ_SOURCE_OFFSET, DLQ_SOURCE_PARTITION, DLQ_SOURCE_TOPIC,
    DLQ_TRUNCATED_FROM,
};
pub use partition::BEHIND_WAITS;
use rebalance::RebalanceHandler;
use worker::Worker;

/// Why `run` stopped with an error. Bad messages (poison) never get here: they are
/// dead-lettered; transient failures (broker away, disk write failing) are retried with
/// backoff where they happen; what escapes is fatal and ends the process non-zero.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("kafka client could not be created: {0}")]
    Client(#[source] KafkaError),
    #[error(transparent)]
    Topics(#[from] TopicError),
    #[error("cannot subscribe to {topics}: {source}")]
    Subscribe { topics: String, source: KafkaError },
    #[error("state store: {0}")]
    Store(#[from] StoreError),
    #[error("cannot restore partition {partition} from the changelog: {reason}")]
    Restore { partition: i32, reason: String },
    #[error("changelog topic `{topic}` partition {partition} holds state of consumer group `{writer}` (commit record at offset {offset}), and this deployment's group is `{ours}`: two deployments share one changelog topic; give this one a kafka.changelog_topic of its own and an empty state.path (its sessions then start anew), or set kafka.group_id back to `{writer}` if this is that deployment")]
    ChangelogOfAnotherGroup {
        topic: String,
        partition: i32,
        offset: i64,
        writer: String,
        ours: String,
    },
    /// Shutdown came while a partition was being restored: not a failure (the partition
    /// is left unloaded, for the next owner), the rest drains as usual.
    #[error("the restore of partition {partition} was interrupted by shutdown")]
    RestoreInterrupted { partition: i32 },
    #[error("cannot start a worker thread: {0}")]
    Thread(std::io::Error),
    #[error("a worker thread panicked")]
    WorkerPanicked,
    #[error("a batch was not stored since the one before it could not be (its offsets would pass over that batch's events)")]
    StoreAfterFailure,
    #[error("the state store's writer thread ended unexpectedly (a panic in the store)")]
    StoreWriterEnded,
    #[error("kafka transaction failed fatally (is another instance using transactional.id {transactional_id}? set kafka.instance_id per instance): {source}")]
    Transaction {
        transactional_id: String,
        source: KafkaError,
    },
    #[error("cannot move the consumer back to the committed offsets after a fenced transaction ({0}); stopping so that a restart reads the dropped batch again")]
    Rewind(#[source] KafkaError),
    #[error("kafka consumer fenced: another member joined consumer group `{group}` with this one's group.instance.id `{member}`, and its partitions are that member's now; each instance needs a kafka.instance_id of its own (is another instance, or an earlier copy of this one, still running with it?)")]
    Fenced { group: String, member: String },
    #[error("kafka consumer of group `{group}` failed fatally and cannot go on: {reason}")]
    ConsumerFatal { group: String, reason: String },
    #[error("kafka producer failed fatally and delivers nothing more ({reason}); stopping with {undelivered} record(s) in hand: nothing undelivered was stored or committed, so a restart (a new producer) processes those events again")]
    ProducerFatal { reason: String, undelivered: usize },
    #[error("shutdown deadline ({secs} s) passed with {undelivered} output record(s) undelivered; nothing was stored or committed for them, so a restart processes their events again")]
    DeadlineExceeded { secs: u64, undelivered: usize },
}

/// What a run did (also the demo's and the tests' view of it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    pub events: u64,
    /// Events at or below a partition's stored offset (already applied before a restart).
    pub skipped: u64,
    pub dead_lettered: u64,
    pub warnings: u64,
    pub terminations: u64,
    pub summaries: u64,
    pub batches: u64,
    /// Session records applied from the changelog, and the time restores took.
    pub restored_records: u64,
    pub restore_ms: u64,
}

impl std::ops::AddAssign for RunStats {
    fn add_assign(&mut self, o: RunStats) {
        self.events += o.events;
        self.skipped += o.skipped;
        self.dead_lettered += o.dead_lettered;
        self.warnings += o.warnings;
        self.terminations += o.terminations;
        self.summaries += o.summaries;
        self.batches += o.batches;
        self.restored_records += o.restored_records;
        self.restore_ms += o.restore_ms;
    }
}

impl PipelineError {
    /// The error that ends worker `worker` (or the OTLP ingest, worker 0 of its settings)
    /// once its consumer `client` failed fatally, `None` while it has not: a poll returned
    /// `polled` (a fatal error comes once, so; the client keeps it, with its reason). A
    /// fenced static member stops: the member that fenced it holds its partitions now, and
    /// a batch of them applied here would be applied twice.
    pub(super) fn consumer_failed<C: ClientContext>(
        client: &Client<C>,
        polled: &KafkaError,
        settings: &KafkaSettings,
        worker: usize,
    ) -> Option<PipelineError> {
        let (code, reason) = match (client.fatal_error(), polled) {
            (Some(fatal), _) => fatal,
            (None, KafkaError::MessageConsumptionFatal(code)) => (*code, code.to_string()),
            _ => return None,
        };
        let group = settings.group_id.clone();
        Some(match group_instance_id(settings, worker) {
            Some(member) if code == RDKafkaErrorCode::FencedInstanceId => {
                PipelineError::Fenced { group, member }
            }
            _ => PipelineError::ConsumerFatal { group, reason },
        })
    }

    /// Why `undelivered` records in hand were not delivered, as the run's error.
    pub(super) fn undelivered(
        why: Undelivered,
        backoff: &Backoff,
        undelivered: usize,
    ) -> PipelineError {
        match why {
            Undelivered::DeadlinePassed => PipelineError::deadline(backoff, undelivered),
            Undelivered::ProducerFailed(reason) => PipelineError::ProducerFatal {
                reason,
                undelivered,
            },
        }
    }

    /// The shutdown deadline passed with `undelivered` records in hand.
    fn deadline(backoff: &Backoff, undelivered: usize) -> PipelineError {
        PipelineError::DeadlineExceeded {
            secs: backoff.deadline_secs(),
            undelivered,
        }
    }
}

/// Waits until the topics exist and checks them (retrying while the cluster is
/// unreachable or a topic is missing). Returns `None` when shutdown came first.
fn wait_for_topics(
    consumer: &BaseConsumer<RebalanceHandler>,
    settings: &KafkaSettings,
    brokers: &str,
    shutdown: &Shutdown,
    compaction_lag: Duration,
) -> Result<Option<usize>, PipelineError> {
    let mut topics: Vec<&str> = settings.input_topics.iter().map(String::as_str).collect();
    topics.extend(settings.output_topics());
    let mut backoff = Backoff::new(settings, shutdown);
    loop {
        let counts = partition_counts(consumer.client(), &topics, Duration::from_secs(5)).and_then(
            |counts| {
                let changelog = if settings.changelog {
                    partition_counts(
                        consumer.client(),
                        &[&settings.changelog_topic],
                        Duration::from_secs(5),
                    )?
                    .remove(&settings.changelog_topic)
                    .flatten()
                } else {
                    None
                };
                Ok((counts, changelog))
            },
        );
        match counts {
            Ok((counts, changelog)) => {
                let partitions = match check_topics(&counts, &settings.input_topics, brokers) {
                    // Topics created by a job that runs alongside (a fresh cluster, a
                    // Helm install) appear a little later: wait for them, not ready.
                    Err(missing @ TopicError::Missing { .. }) => {
                        warn!(error = %missing, backoff_ms = backoff.delay_ms(), "waiting for topics");
                        if backoff.sleep() {
                            return Ok(None);
                        }
                        continue;
                    }
                    other => other?,
                };
                if settings.changelog {
                    ensure_changelog(settings, brokers, partitions, changelog, compaction_lag)?;
                }
                return Ok(Some(partitions));
            }
            Err(e) => {
                warn!(brokers, error = %e, backoff_ms = backoff.delay_ms(), "cannot read cluster metadata; retrying");
                if backoff.sleep() {
                    return Ok(None);
                }
            }
        }
    }
}

/// Runs the pipeline against `brokers` until `shutdown` is triggered: then it stops
/// fetching, finishes the batch in hand (deliver, store, commit) and returns.
pub fn run(
    config: Arc<Config>,
    brokers: &str,
    shutdown: Shutdown,
) -> Result<RunStats, PipelineError> {
    run_observed(config, brokers, shutdown, Arc::new(Telemetry::new()))
}

/// [`run`], reporting metrics and readiness to `telemetry`.
pub fn run_observed(
    config: Arc<Config>,
    brokers: &str,
    shutdown: Shutdown,
    telemetry: Arc<Telemetry>,
) -> Result<RunStats, PipelineError> {
    let db = open_db_with_cache(&config.state_path, config.state_cache_bytes)?;
    // The OTLP ingest, if on, runs beside the workers: a consumer group of its own that
    // feeds the input topic they read.
    let ingest = match config.ingest.clone() {
        Some(ingest) => {
            let (config, brokers, shutdown, telemetry) = (
                config.clone(),
                brokers.to_string(),
                shutdown.clone(),
                telemetry.clone(),
            );
            Some(
                std::thread::Builder::new()
                    .name("lw-otlp-ingest".into())
                    .spawn(move || {
                        let _stop = StopOnPanic(shutdown.clone());
                        run_ingest(config, ingest, &brokers, shutdown, telemetry)
                    })
                    .map_err(PipelineError::Thread)?,
            )
        }
        None => None,
    };
    let workers = config.kafka.workers;
    let result = if workers == 1 {
        let holds = Arc::new(PartitionHolds::default());
        let member = telemetry.readiness.member();
        run_worker(
            config,
            brokers,
            db,
            holds,
            shutdown.clone(),
            0,
            member,
            telemetry,
        )
    } else {
        run_workers(config, brokers, db, shutdown.clone(), telemetry)
    };
    if result.is_err() {
        shutdown.trigger();
    }
    let ingested = match ingest.map(|t| t.join()) {
        None => Ok(()),
        Some(Ok(r)) => r.map(|_| ()),
        Some(Err(_)) => Err(PipelineError::WorkerPanicked),
    };
    match (result, ingested) {
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        (Ok(stats), Ok(())) => Ok(stats),
    }
}

/// Worker `index`'s thread name (with more than one worker; one runs on the caller's
/// thread). Linux keeps the first 15 bytes of a thread's name (`top -H`,
/// `/proc/<pid>/task/*/comm`), so the pipeline's threads are named short enough that
/// each worker's, and each worker's store writer's ([`store_thread`]), stays apart there.
fn worker_thread(index: usize) -> String {
    format!("lw-worker-{index}")
}

/// The thread name of worker `index`'s store writer (see [`worker_thread`]).
pub(super) fn store_thread(index: usize) -> String {
    format!("lw-store-{index}")
}

/// Several members of the group in one process: each owns its partitions, engines and
/// sled trees; while one waits for the broker or the disk, the other computes.
fn run_workers(
    config: Arc<Config>,
    brokers: &str,
    db: sled::Db,
    shutdown: Shutdown,
    telemetry: Arc<Telemetry>,
) -> Result<RunStats, PipelineError> {
    let workers = config.kafka.workers;
    // One for all: a partition is held by one worker of the process at a time.
    let holds = Arc::new(PartitionHolds::default());
    // Every worker counts for readiness before any thread starts, so that the first to
    // hold an assignment cannot read ready while the others are still starting.
    let members: Vec<GroupMember> = (0..workers).map(|_| telemetry.readiness.member()).collect();
    // The order in which workers failed: the first failure stops the others, and may make
    // one of them fail too (its deadline passing at the stop); the first is the cause.
    let failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let threads: Vec<_> = members
        .into_iter()
        .enumerate()
        .map(|(i, member)| {
            let (config, brokers, db, holds, shutdown, telemetry, failures) = (
                config.clone(),
                brokers.to_string(),
                db.clone(),
                holds.clone(),
                shutdown.clone(),
                telemetry.clone(),
                failures.clone(),
            );
            std::thread::Builder::new()
                .name(worker_thread(i))
                .spawn(move || {
                    // A panic stops the process as an error does.
                    let _stop = StopOnPanic(shutdown.clone());
                    // With several workers, each line a worker logs says which (its
                    // partitions assigned and revoked, its commits). At the error level,
                    // so that it is kept whatever level `RUST_LOG` lets through.
                    let _worker =
                        (workers > 1).then(|| tracing::error_span!("worker", worker = i).entered());
                    let result = run_worker(
                        config,
                        &brokers,
                        db,
                        holds,
                        shutdown.clone(),
                        i,
                        member,
                        telemetry,
                    );
                    result.map_err(|e| {
                        let order = failures.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        // One worker failing stops the process: the others finish cleanly.
                        shutdown.trigger();
                        (order, e)
                    })
                })
        })
        .collect::<Result<_, _>>()
        .map_err(PipelineError::Thread)?;
    let mut total = RunStats::default();
    let mut first_error: Option<(usize, PipelineError)> = None;
    for t in threads {
        let failed = match t.join() {
            Ok(Ok(stats)) => {
                total += stats;
                continue;
            }
            Ok(Err(failed)) => failed,
            // A panic's place in time is not known: after every error counted.
            Err(_) => (usize::MAX, PipelineError::WorkerPanicked),
        };
        if first_error
            .as_ref()
            .is_none_or(|(first, _)| failed.0 < *first)
        {
            first_error = Some(failed);
        }
    }
    match first_error {
        Some((_, e)) => Err(e),
        None => Ok(total),
    }
}

/// One member of the consumer group (one thread): subscribe, consume, stop.
// Each part is made by its caller for this worker alone, so none is left out.
#[allow(clippy::too_many_arguments)]
fn run_worker(
    config: Arc<Config>,
    brokers: &str,
    db: sled::Db,
    holds: Arc<PartitionHolds>,
    shutdown: Shutdown,
    index: usize,
    member: GroupMember,
    telemetry: Arc<Telemetry>,
) -> Result<RunStats, PipelineError> {
    let settings = config.kafka.clone();
    let commit = Commit::of(&settings, &config.state_path, index);
    let mut producer_config = producer_config(&settings, brokers, config.limits.max_event_bytes);
    if let Some(id) = commit.transactional_id() {
        producer_config.set("transactional.id", id);
    }
    let outbox = Outbox::new(&producer_config, &settings, telemetry.clone(), &shutdown)
        .map_err(PipelineError::Client)?;
    let mut worker = Worker::new(
        index,
        config.clone(),
        db,
        outbox,
        commit,
        Restorer::new(&settings, brokers, &shutdown),
        &shutdown,
        telemetry,
        member,
        holds,
    )?;
    let consumer: BaseConsumer<RebalanceHandler> = consumer_config(&settings, brokers, index)
        .create_with_context(RebalanceHandler::default())
        .map_err(PipelineError::Client)?;
    // However this function ends (a panic included), the consumer's close must not wait
    // on a rebalance parked for a worker that is gone: dropped before the consumer.
    let _closing = rebalance::AcknowledgeOnDrop(&consumer);
    let session_gap = Duration::from_millis(config.engine.session_gap_ms.max(0) as u64);
    let compaction_lag = changelog_compaction_lag(session_gap, settings.idle_after);
    let Some(partitions) =
        wait_for_topics(&consumer, &settings, brokers, &shutdown, compaction_lag)?
    else {
        return Ok(RunStats::default());
    };
    if let Some(transaction) = worker.commit.transaction() {
        if !transaction.init(&worker.outbox, &mut Backoff::new(&settings, &shutdown))? {
            return Ok(RunStats::default());
        }
    }
    let inputs: Vec<&str> = settings.input_topics.iter().map(String::as_str).collect();
    consumer
        .subscribe(&inputs)
        .map_err(|source| PipelineError::Subscribe {
            topics: inputs.join(", "),
            source,
        })?;
    info!(brokers, group = %settings.group_id, topics = ?inputs, partitions, worker = index, state = %config.state_path.display(), "consuming");

    let w = &mut worker;
    let result = consume(&consumer, w, &settings, &shutdown);
    let result = result
        .and_then(|()| w.finish_batch(&consumer, Finish::Settle))
        .and_then(|()| w.flush_store());
    let held = w.held();
    if held > 0 {
        // Applying them now could put them before an event of another topic still on
        // its way; not applied, their offsets are not committed and they are read again.
        info!(
            held,
            "events still waiting for alignment are left for the next start"
        );
    }
    if result.is_err() {
        // Nothing of the unfinished batch may be stored (its events are processed again
        // on restart), and leaving the group must not wait on a broker that is away.
        // Shutdown first: the store writer's retries end at its deadline.
        shutdown.trigger();
        w.abandon();
    }
    let stats = w.stats;
    // Leaving the group revokes everything: the worker's share of the gauges goes now,
    // and the revoke is acknowledged without it (its batch is settled or abandoned above).
    rebalance::release_all(&consumer, w);
    match &result {
        Ok(()) => info!(worker = index, ?stats, "stopped"),
        Err(e) => error!(worker = index, error = %e, ?stats, "stopped with an error"),
    }
    result.map(|()| stats)
}

/// How many times `max_batch_wait` a batch may stay open: while there is a backlog, or
/// while the batch before is still in flight.
const LONGEST_WAIT_FACTOR: u32 = 8;

/// The most messages a run takes (`handle_run`): the one polled and those librdkafka
/// already holds after it, polled ahead so that their sessions' lookups overlap instead
/// of each stalling its event (a million open sessions leave every session table's
/// entries out of the cache).
pub(super) const LOOKAHEAD: usize = 8;

/// Whether a batch open for `open`, whose time is up, stays open: while the batch before
/// still `awaiting` the broker (at least once), its end would wait for that with no event
/// applied (every event polled meanwhile waits, and so do its findings), so the batch
/// stays open until then, within `longest`, unless the worker is `stopping`.
fn stays_open(open: Duration, longest: Duration, awaiting: bool, stopping: bool) -> bool {
    awaiting && open < longest && !stopping
}

/// The poll loop: batches of up to `max_batch_events`, closed after `max_batch_wait`
/// (longer while the batch before waits for the broker).
fn consume(
    consumer: &BaseConsumer<RebalanceHandler>,
    w: &mut Worker,
    settings: &KafkaSettings,
    shutdown: &Shutdown,
) -> Result<(), PipelineError> {
    // Adaptive batching: while there is a backlog (a batch runs out of time with more
    // messages waiting on the broker than it took), batches grow up to 8× the configured
    // wait, so the fixed cost of delivering and storing a batch is spread over more
    // events, and a batch that fills up keeps its wait; once caught up, batches are short
    // again (latency) (`next_wait`).
    let mut wait = settings.max_batch_wait;
    while !shutdown.is_triggered() {
        let polled = poll_batch(consumer, w, settings, shutdown, wait)?;
        if let Some(first_polled) = polled.started {
            w.telemetry
                .metrics
                .observe_stage("wait", first_polled.elapsed());
        }
        let lag = w.lag(consumer);
        wait = next_wait(wait, &polled, lag, settings);
        w.tick_idle();
        w.finish_batch(consumer, Finish::Overlap)?;
    }
    Ok(())
}

/// How long the next batch may wait, after a batch that `polled` with `lag` messages
/// still on the broker: twice as long when its time ran out with more waiting than it
/// took (a backlog), up to [`LONGEST_WAIT_FACTOR`] × `max_batch_wait`; as long when it
/// filled up (the input outruns the batch: a backlog too, whose batches must not shrink
/// back); the configured wait once a batch timed out caught up.
fn next_wait(wait: Duration, polled: &Polled, lag: i64, settings: &KafkaSettings) -> Duration {
    if polled.messages >= settings.max_batch_events {
        wait
    } else if polled.timed_out && lag > polled.messages as i64 {
        (wait * 2).min(settings.max_batch_wait * LONGEST_WAIT_FACTOR)
    } else {
        settings.max_batch_wait
    }
}

/// What one batch's polling took.
struct Polled {
    messages: usize,
    /// When its first message came (`None`: the batch holds only idle-clock work).
    started: Option<Instant>,
    /// It ended because its time was up (not because it was full or there was a stop).
    timed_out: bool,
}

/// Polls (and, through the worker, applies) one batch's messages: until `wait` after
/// the first one (or, while the batch before still waits for the broker, until it has
/// it, within [`LONGEST_WAIT_FACTOR`] × `max_batch_wait`), `max_batch_events` of them,
/// a stop, or idle-clock work to finish.
fn poll_batch(
    consumer: &BaseConsumer<RebalanceHandler>,
    w: &mut Worker,
    settings: &KafkaSettings,
    shutdown: &Shutdown,
    wait: Duration,
) -> Result<Polled, PipelineError> {
    let idle_poll = Duration::from_millis(100);
    // Held events whose wait for another topic ended are released at least this often
    // while a batch is open (a partition's own messages release its events at once).
    let sweep_every = Duration::from_millis(5);
    let longest_wait = settings.max_batch_wait * LONGEST_WAIT_FACTOR;
    let mut polled = Polled {
        messages: 0,
        started: None,
        timed_out: false,
    };
    let mut swept = Instant::now();
    // Whether the batch before still awaits the broker, as of the last sweep (asking
    // polls the producer: once a sweep, not once a message).
    let mut awaiting = w.awaits_batch_in_flight();
    // When the last message's work ended, if `handle` read the clock then and did nothing
    // after that could wait (see `Worker::handle`): the time now, but for the few
    // microseconds since.
    let mut handled_at: Option<Instant> = None;
    loop {
        let now = handled_at.take().unwrap_or_else(Instant::now);
        if polled.started.is_some() && now.duration_since(swept) >= sweep_every {
            w.observe_unpolled(consumer);
            w.release_due();
            // The events applied so far, counted where a scrape (and the pipeline
            // bench's feed) sees them, not only at the batch's end.
            w.flush_counts();
            // Sends its commit records once its records are acknowledged.
            awaiting = w.awaits_batch_in_flight();
            w.commit_stored(consumer, CommitMode::Async, false)?;
            swept = now;
        }
        let timeout = match polled.started {
            // Idle: wake up for a held event whose wait for another topic ends.
            None => w.next_due().map_or(idle_poll, |due| {
                due.saturating_duration_since(now).min(idle_poll)
            }),
            // At most `sweep_every` at a time: a stop and due events are seen within it,
            // however long the batch may wait.
            Some(t) => {
                let open = now.duration_since(t);
                match wait.checked_sub(open) {
                    Some(left) if !left.is_zero() => left.min(sweep_every),
                    _ if stays_open(open, longest_wait, awaiting, shutdown.is_triggered()) => {
                        sweep_every
                    }
                    _ => {
                        polled.timed_out = true;
                        return Ok(polled);
                    }
                }
            }
        };
        let message = consumer.poll(timeout);
        // A rebalance librdkafka handed over inside the poll (which then returns
        // nothing): the worker's, before anything else.
        rebalance::serve(consumer, w)?;
        let error = match message {
            Some(Ok(m)) => {
                let room = settings.max_batch_events - polled.messages;
                let ended_by = handle_run(consumer, w, m, room, &mut polled, &mut handled_at)?;
                // An error that ended the run is logged below, and ends the batch there.
                if ended_by.is_none() && polled.messages >= settings.max_batch_events {
                    return Ok(polled);
                }
                ended_by
            }
            Some(Err(e)) => Some(e),
            None => None,
        };
        match error {
            Some(e) => {
                consumer_error(consumer, w, settings, &e)?;
                if polled.messages > 0 {
                    return Ok(polled);
                }
            }
            // The batch's time is checked at the top.
            None if polled.messages > 0 && !shutdown.is_triggered() => {}
            None => {
                if shutdown.is_triggered() {
                    return Ok(polled);
                }
                // Keeps the lag gauge current while the input is idle, and tells an idle
                // partition from one whose events wait on the broker.
                w.lag(consumer);
                w.observe_unpolled(consumer);
                w.commit_stored(consumer, CommitMode::Async, false)?;
                w.tick_idle();
                if w.has_work(Instant::now()) {
                    return Ok(polled);
                }
            }
        }
    }
}

/// A consumer error a poll returned (both polls of the worker's consumer, in
/// [`poll_batch`] and [`handle_run`], end here): logged, if librdkafka goes on after it;
/// the worker's end, if the consumer failed fatally.
fn consumer_error(
    consumer: &BaseConsumer<RebalanceHandler>,
    w: &Worker,
    settings: &KafkaSettings,
    polled: &KafkaError,
) -> Result<(), PipelineError> {
    let client = consumer.client();
    if let Some(failed) = PipelineError::consumer_failed(client, polled, settings, w.index()) {
        return Err(failed);
    }
    warn!(error = %polled, "consumer error");
    Ok(())
}

/// Handles message `first` and the messages librdkafka already holds after it, up to
/// [`LOOKAHEAD`] and `room` in all, polled ahead without waiting so that their sessions
/// are looked up together (`Worker::warm`), then handled in order. A run ends at that
/// count, or at the first poll that returns no message: nothing more waiting, an event
/// the poll took instead (a rebalance, which a poll hands over alone, or an offset
/// commit's result), or an error (returned). What ended it comes after its messages, as
/// it came from the consumer: a rebalance parked by the run's last poll is served once
/// they are handled, so each message is handled under the assignment it was polled in,
/// as when each is handled before the next poll.
fn handle_run<'c>(
    consumer: &'c BaseConsumer<RebalanceHandler>,
    w: &mut Worker,
    first: BorrowedMessage<'c>,
    room: usize,
    polled: &mut Polled,
    handled_at: &mut Option<Instant>,
) -> Result<Option<KafkaError>, PipelineError> {
    let mut ahead: [Option<BorrowedMessage<'c>>; LOOKAHEAD] = std::array::from_fn(|_| None);
    ahead[0] = Some(first);
    let mut ended_by = None;
    for slot in ahead.iter_mut().take(LOOKAHEAD.min(room)).skip(1) {
        match consumer.poll(Duration::ZERO) {
            Some(Ok(next)) => *slot = Some(next),
            Some(Err(e)) => {
                ended_by = Some(e);
                break;
            }
            None => break,
        }
    }
    if ahead[1].is_some() {
        w.warm(&ahead);
    }
    for m in ahead.iter().flatten() {
        *handled_at = w.handle(m, consumer)?;
        polled.messages += 1;
        polled
            .started
            .get_or_insert_with(|| handled_at.unwrap_or_else(Instant::now));
    }
    // The messages go back to librdkafka before a revoke settles their partitions.
    drop(ahead);
    if rebalance::serve(consumer, w)? {
        // Serving took its time (a revoke's batch settled, an assignment restored): the
        // last message's clock is stale for the loop.
        *handled_at = None;
    }
    Ok(ended_by)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumer_failed_fatally_ends_its_worker_and_a_fence_names_the_member() {
        // The client's own fatal error (`rd_kafka_fatal_error`, read first) is set by a
        // real fence in `tests/pipeline_inprocess.rs`: a client failed fatally by
        // `rd_kafka_test_fatal_error` alone never finished its destroy here.
        let mut settings = KafkaSettings {
            group_id: "lw".into(),
            instance_id: Some("pod-3".into()),
            workers: 2,
            ..KafkaSettings::default()
        };
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .create()
            .unwrap();
        let client = consumer.client();
        let transient = KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure);
        assert!(PipelineError::consumer_failed(client, &transient, &settings, 1).is_none());

        let fenced = KafkaError::MessageConsumptionFatal(RDKafkaErrorCode::FencedInstanceId);
        match PipelineError::consumer_failed(client, &fenced, &settings, 1) {
            Some(PipelineError::Fenced { group, member }) => {
                assert_eq!((group.as_str(), member.as_str()), ("lw", "pod-3-1"));
            }
            other => panic!("{other:?}"),
        }
        let other =
            KafkaError::MessageConsumptionFatal(RDKafkaErrorCode::InconsistentGroupProtocol);
        match PipelineError::consumer_failed(client, &other, &settings, 0) {
            Some(PipelineError::ConsumerFatal { group, reason }) => {
                assert_eq!(group, "lw");
                assert_eq!(
                    reason,
                    RDKafkaErrorCode::InconsistentGroupProtocol.to_string()
                );
            }
            other => panic!("{other:?}"),
        }
        // Without an instance id there is no static member to name.
        settings.instance_id = None;
        assert!(matches!(
            PipelineError::consumer_failed(client, &fenced, &settings, 0),
            Some(PipelineError::ConsumerFatal { .. })
        ));
    }

    #[test]
    fn each_workers_threads_stay_apart_within_what_linux_keeps_of_a_name() {
        // `kafka.workers` is at most 64.
        let names: Vec<String> = (0..64)
            .flat_map(|i| [worker_thread(i), store_thread(i)])
            .collect();
        for name in &names {
            assert!(name.len() <= 15, "{name} is cut short by Linux");
        }
        let distinct: std::collections::HashSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), names.len());
    }

    #[test]
    fn batches_grow_while_there_is_a_backlog_and_shrink_back_once_caught_up() {
        let settings = KafkaSettings {
            max_batch_wait: Duration::from_millis(100),
            max_batch_events: 1_000,
            ..KafkaSettings::default()
        };
        let ms = Duration::from_millis;
        // The next wait after a batch that waited `wait` ms and took `messages`, timed
        // out or not, with `lag` messages left on the broker.
        let next = |wait: u64, messages: usize, timed_out: bool, lag: i64| {
            let polled = Polled {
                messages,
                started: Some(Instant::now()),
                timed_out,
            };
            next_wait(ms(wait), &polled, lag, &settings)
        };
        // Timed out with more waiting than it took: twice as long, up to 8 ×.
        assert_eq!(next(100, 400, true, 401), ms(200));
        assert_eq!(next(800, 400, true, 5_000), ms(800));
        // Timed out caught up: back to the configured wait.
        assert_eq!(next(400, 400, true, 400), ms(100));
        // Ended by a stop or an error, neither full nor timed out: back too.
        assert_eq!(next(400, 10, false, 9_000), ms(100));
        // Full: the input outruns it, whatever the lag reads; it keeps its wait.
        assert_eq!(next(400, 1_000, false, 0), ms(400));
        assert_eq!(next(100, 1_000, false, 0), ms(100));
    }

    #[test]
    fn a_batch_stays_open_past_its_time_only_while_the_batch_before_awaits_and_within_the_longest_wait(
    ) {
        let longest = Duration::from_millis(800);
        let open = Duration::from_millis(120);
        assert!(stays_open(open, longest, true, false));
        assert!(!stays_open(open, longest, false, false), "nothing awaited");
        assert!(!stays_open(open, longest, true, true), "stopping");
        assert!(
            !stays_open(longest, longest, true, false),
            "at the longest wait"
        );
        assert!(stays_open(
            longest - Duration::from_millis(1),
            longest,
            true,
            false
        ));
    }
}

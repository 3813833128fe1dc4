//! The batch recipe (apply → deliver → store → commit) driven on the in-memory bus
//! (`memory`), without a broker: what each step leaves on the bus, and a crash at every
//! window between two of the bus's operations, each followed by a restart over the same
//! sled directory, judged against the run without a crash.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Once};

use rdkafka::consumer::CommitMode;
use rdkafka::Message;

use super::batch::Finish;
use super::bus::DeliveryTracker;
use super::changelog::{Restorer, CHANGELOG_BATCH, CHANGELOG_KIND};
use super::commit::Commit;
use super::holds::PartitionHolds;
use super::memory::{Bus, Landed, MemoryChangelog, MemoryConsumer, MemoryTransport, CRASH};
use super::outbox::Outbox;
use super::worker::Worker;
use super::writer::SharedStore;
use super::PipelineError;
use crate::config::Config;
use crate::contract::event::{parse_event, ParseLimits};
use crate::engine::store::{open_db_with_cache, SledStore};
use crate::engine::{Engine, EventMeta};
use crate::shutdown::Shutdown;
use crate::telemetry::Telemetry;
use crate::tools::simulate::{Fleet, FleetSpec, SimEvent};

const INPUT: &str = "tool.called";
const PARTITIONS: [i32; 2] = [0, 1];

fn config(batch_events: usize, changelog: bool) -> Arc<Config> {
    config_with(batch_events, changelog, "")
}

/// [`config`] with a commit interval (`kafka.commit_interval_ms`): [`Member::consume_all`]
/// then makes partition 0 due at every second batch's end and partition 1 at every third
/// (each partition's due time set by hand, the interval itself never passing), so that
/// batch ends take one partition, both or neither.
fn config_taking_in_turns(batch_events: usize, changelog: bool) -> Arc<Config> {
    config_with(batch_events, changelog, "commit_interval_ms = 60000\n")
}

fn config_with(batch_events: usize, changelog: bool, kafka: &str) -> Arc<Config> {
    let toml = format!(
        "[kafka]\ninput_topics = [\"{INPUT}\"]\nchangelog = {changelog}\nmax_batch_events = {batch_events}\n{kafka}"
    );
    Arc::new(Config::from_toml_str(&toml, "recipe", std::iter::empty()).unwrap())
}

/// A bus holding a small fleet's events, keyed by session, over two partitions.
fn bus_with_a_fleet(sessions: u64) -> Bus {
    let bus = Bus::default();
    for_each_fleet_event(sessions, |e, partition| {
        bus.produce(INPUT, partition, e.session_id.as_bytes(), &e.json)
    });
    bus
}

/// Calls `each` with every event of a small fleet, in order, and the partition (of two)
/// its session is keyed to.
fn for_each_fleet_event(sessions: u64, mut each: impl FnMut(&SimEvent, i32)) {
    let mut fleet = Fleet::new(FleetSpec {
        sessions,
        concurrency: 12,
        loop_share: 0.5,
        seed: 30,
    });
    let mut t = 1_763_000_000_000;
    while let Some(e) = fleet.next_event(t) {
        let partition = (crate::engine::hash::line_hash(e.session_id.as_bytes()) % 2) as i32;
        each(&e, partition);
        t += 200;
    }
}

/// One group member on the bus: a worker over sled in `dir`, assigned both partitions.
struct Member {
    worker: Worker,
    input: MemoryConsumer,
    /// The process's partition holds, shared with a second member over the same sled.
    holds: Arc<PartitionHolds>,
    /// Times the restorer let its changelog reader go.
    reader_releases: Arc<std::sync::atomic::AtomicUsize>,
}

impl Member {
    fn start(bus: &Bus, dir: &Path, config: &Arc<Config>) -> Member {
        let db = open_db_with_cache(dir, 8 << 20).unwrap();
        let holds = Arc::new(PartitionHolds::default());
        Member::on(bus, dir, config, db, holds, 0, &PARTITIONS)
    }

    /// Worker `index` of a process over `db`, assigned `partitions`.
    fn on(
        bus: &Bus,
        dir: &Path,
        config: &Arc<Config>,
        db: sled::Db,
        holds: Arc<PartitionHolds>,
        index: usize,
        partitions: &[i32],
    ) -> Member {
        let telemetry = Arc::new(Telemetry::new());
        let shutdown = Shutdown::new();
        let settings = &config.kafka;
        let tracker = DeliveryTracker::of(&telemetry);
        let transport = MemoryTransport::new(bus, tracker);
        let outbox =
            Outbox::with_transport(Box::new(transport), settings, telemetry.clone(), &shutdown);
        let commit = Commit::of(settings, dir, index);
        let inputs: Vec<&str> = settings.input_topics.iter().map(String::as_str).collect();
        let changelog = MemoryChangelog::new(bus, &settings.changelog_topic, &inputs);
        let reader_releases = changelog.releases();
        let restorer = Restorer::with_source(settings, Box::new(changelog));
        let mut worker = Worker::new(
            index,
            config.clone(),
            db,
            outbox,
            commit,
            restorer,
            &shutdown,
            telemetry.clone(),
            telemetry.readiness.member(),
            holds.clone(),
        )
        .unwrap();
        // As a rebalance's assignment loads them.
        super::rebalance::assign(&mut worker, partitions).unwrap();
        let input = MemoryConsumer::new(bus, &inputs, partitions);
        Member {
            worker,
            input,
            holds,
            reader_releases,
        }
    }

    /// Polls and applies the next `n` messages.
    fn handle_next(&mut self, n: usize) {
        for _ in 0..n {
            let msg = self.input.poll().unwrap();
            self.worker.handle(&msg, &self.input).unwrap();
        }
    }

    /// Polls and applies everything on the bus, finishing a batch every
    /// `max_batch_events`, then settles and stops as `loopwarden run` does. Between polls
    /// it sends the batch in flight's commit records once its records are acknowledged
    /// in one batch of three (they may land after the next events), and asks whether the
    /// batch in flight still awaits the broker, as the poll loop does (which sends them
    /// and settles what landed), in another; the third sends them at the next batch's
    /// end, so crashes cross every path.
    fn consume_all(&mut self) -> Result<(), PipelineError> {
        let batch = self.worker.settings().max_batch_events;
        let mut polled = 0;
        while let Some(m) = self.input.poll() {
            self.worker.handle(&m, &self.input)?;
            polled += 1;
            match (polled / batch) % 3 {
                1 => self.worker.send_commit_records_once_acked(),
                2 => {
                    self.worker.awaits_batch_in_flight();
                }
                _ => {}
            }
            if polled % batch == 0 {
                self.set_turns(polled / batch);
                self.worker.finish_batch(&self.input, Finish::Overlap)?;
            }
        }
        self.worker.finish_batch(&self.input, Finish::Settle)?;
        self.worker.flush_store()
    }

    /// With a commit interval ([`config_taking_in_turns`]), which partitions come due at
    /// the end of batch `n` (from 1): partition 0 at every second, 1 at every third.
    fn set_turns(&mut self, n: usize) {
        if !self.worker.settings().commit_interval.is_zero() {
            self.due_now(|partition| n % (2 + partition as usize) == 0);
        }
    }

    /// Makes the partitions `due` says due now, and the others an hour away.
    fn due_now(&mut self, due: impl Fn(i32) -> bool) {
        let now = std::time::Instant::now();
        for (&partition, p) in &mut self.worker.partitions {
            p.due = if due(partition) {
                now
            } else {
                now + std::time::Duration::from_secs(3600)
            };
        }
    }
}

/// The panics of armed crashes are expected: only other panics are printed.
fn quiet_crashes() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let print = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&CRASH) {
                print(info);
            }
        }));
    });
}

/// The outputs of a topic by `event_id`: each copy's JSON (re-emissions share the id).
fn by_event_id(records: &[Landed]) -> BTreeMap<String, Vec<serde_json::Value>> {
    let mut out: BTreeMap<String, Vec<serde_json::Value>> = BTreeMap::new();
    for r in records {
        let v: serde_json::Value =
            serde_json::from_slice(r.payload.as_deref().unwrap_or_default()).unwrap();
        let id = v["event_id"].as_str().unwrap().to_string();
        out.entry(id).or_default().push(v);
    }
    out
}

/// What a run left on the bus: warnings, terminations and summaries by `event_id`.
struct Outputs {
    warnings: BTreeMap<String, Vec<serde_json::Value>>,
    terminated: BTreeMap<String, Vec<serde_json::Value>>,
    summaries: BTreeMap<String, Vec<serde_json::Value>>,
}

fn outputs(bus: &Bus, config: &Config) -> Outputs {
    Outputs {
        warnings: by_event_id(&bus.records(&config.kafka.warning_topic)),
        terminated: by_event_id(&bus.records(&config.kafka.terminated_topic)),
        summaries: by_event_id(&bus.records(&config.kafka.summary_topic)),
    }
}

/// Every output of `want` is in `got` with the same counters in each copy, and nothing
/// else is: none lost, none invented, no event counted twice. Returns the copies.
fn assert_same(want: &Outputs, got: &Outputs, context: &str) -> usize {
    let mut copies = 0;
    for (kind, want, got) in [
        ("warning", &want.warnings, &got.warnings),
        ("termination", &want.terminated, &got.terminated),
        ("summary", &want.summaries, &got.summaries),
    ] {
        let want_ids: BTreeSet<&String> = want.keys().collect();
        let got_ids: BTreeSet<&String> = got.keys().collect();
        assert_eq!(got_ids, want_ids, "{context}: {kind} event ids");
        for (id, copies_of) in got {
            copies += copies_of.len() - 1;
            for c in copies_of {
                assert_eq!(
                    c["stats"], want[id][0]["stats"],
                    "{context}: {kind} {id} stats"
                );
            }
        }
    }
    copies
}

/// A member over a fresh directory and a bus holding a small fleet, its first batch of
/// 10 events finished: its records in flight.
struct InFlight {
    m: Member,
    bus: Bus,
    config: Arc<Config>,
    _dir: tempfile::TempDir,
}

fn a_batch_in_flight(changelog: bool) -> InFlight {
    let bus = bus_with_a_fleet(6);
    let config = config(10, changelog);
    let dir = tempfile::tempdir().unwrap();
    let mut m = Member::start(&bus, dir.path(), &config);
    m.handle_next(10);
    m.worker.finish_batch(&m.input, Finish::Overlap).unwrap();
    InFlight {
        m,
        bus,
        config,
        _dir: dir,
    }
}

/// The member's partition stores (what its store writer writes).
fn stores_of(m: &Member) -> Vec<SharedStore> {
    m.worker
        .partitions
        .values()
        .map(|p| p.store.clone())
        .collect()
}

#[test]
fn each_batch_commits_its_offsets_only_after_its_records_are_acknowledged_and_stored() {
    let InFlight {
        mut m, bus, _dir, ..
    } = a_batch_in_flight(false);
    assert_eq!(
        committed(&bus),
        None,
        "the batch is in flight: nothing committed yet"
    );
    m.handle_next(10);
    // The store writer cannot write while the partitions' stores are held: the first
    // batch, acknowledged at the second's end and handed to it, is not committed.
    let stores = stores_of(&m);
    let held: Vec<_> = stores.iter().map(|s| s.lock().unwrap()).collect();
    m.worker.finish_batch(&m.input, Finish::Overlap).unwrap();
    assert_eq!(
        m.worker.storing.len(),
        1,
        "the first batch is with the writer"
    );
    m.worker
        .commit_stored(&m.input, CommitMode::Async, false)
        .unwrap();
    assert_eq!(committed(&bus), None, "not stored yet: not committed");
    drop(held);
    assert_eq!(
        committed_once_stored(&mut m, &bus),
        Some(10),
        "the first batch's 10 events are committed once the writer stored them"
    );
    m.worker.finish_batch(&m.input, Finish::Settle).unwrap();
    assert_eq!(
        committed(&bus),
        Some(20),
        "a settled batch is committed before it returns"
    );
}

#[test]
fn a_producer_failed_fatally_ends_the_worker_and_nothing_it_did_not_deliver_is_committed() {
    let InFlight {
        mut m, bus, _dir, ..
    } = a_batch_in_flight(true);
    m.handle_next(10);
    m.worker.finish_batch(&m.input, Finish::Overlap).unwrap();
    assert_eq!(
        committed_once_stored(&mut m, &bus),
        Some(10),
        "the first batch"
    );
    // The second batch's records are in flight when the producer fails.
    bus.fail_producer("sequence desynchronization");
    m.handle_next(5);
    match m.worker.finish_batch(&m.input, Finish::Settle) {
        Err(PipelineError::ProducerFatal {
            reason,
            undelivered,
        }) => {
            assert_eq!(reason, "sequence desynchronization");
            assert!(undelivered > 0);
        }
        other => panic!("not the producer's fatal error: {other:?}"),
    }
    assert_eq!(
        committed(&bus),
        Some(10),
        "nothing undelivered is committed"
    );
}

#[test]
fn a_lost_assignments_batch_whose_producer_failed_fatally_ends_the_worker() {
    // Found at the revoke, not at a next batch's end that a worker with nothing to
    // publish reaches committing with a dead producer. (Its changelog records are what
    // is in flight.)
    let InFlight {
        mut m, bus, _dir, ..
    } = a_batch_in_flight(true);
    assert!(m.worker.outbox.has_sent(), "records in flight");
    bus.fail_producer("sequence desynchronization");
    assert!(matches!(
        m.worker.drop_unstored(),
        Err(PipelineError::ProducerFatal { .. })
    ));
    assert_eq!(committed(&bus), None);
}

/// The states each batch leaves to write, from engines of their own fed the same
/// messages in the same order (one per partition, as a worker has), `batch` at a time:
/// the sessions a batch changed and left open.
fn states_per_batch(bus: &Bus, config: &Arc<Config>, batch: usize, batches: usize) -> Vec<usize> {
    let dir = tempfile::tempdir().unwrap();
    let db = open_db_with_cache(dir.path(), 8 << 20).unwrap();
    let mut engines: BTreeMap<i32, Engine> = PARTITIONS
        .iter()
        .map(|&p| {
            let store = SledStore::partition(&db, p).unwrap();
            (p, Engine::restore(config.clone(), &store).unwrap())
        })
        .collect();
    let input = MemoryConsumer::new(bus, &[INPUT], &PARTITIONS);
    let mut out = Vec::new();
    (0..batches)
        .map(|_| {
            for _ in 0..batch {
                let m = input.poll().unwrap();
                let event = parse_event(m.payload().unwrap(), &ParseLimits::default()).unwrap();
                engines.get_mut(&m.partition()).unwrap().process(
                    &event,
                    &EventMeta::default(),
                    &mut out,
                );
            }
            engines
                .values_mut()
                .filter_map(|e| e.take_changes(&[]))
                .map(|changes| changes.puts.len())
                .sum()
        })
        .collect()
}

#[test]
fn a_batchs_states_are_counted_written_once_it_is_on_the_broker_and_once_only() {
    let written = |m: &Member| m.worker.telemetry.metrics.states_written.get() as usize;
    let mut t = a_batch_in_flight(true);
    // Read before anything is committed: the same messages the member polled.
    let want = states_per_batch(&t.bus, &t.config, 10, 2);
    let m = &mut t.m;
    assert!(
        want[0] > 0,
        "the first batch leaves open sessions: {want:?}"
    );
    assert_eq!(
        written(m),
        0,
        "the first batch is in flight: nothing written yet"
    );
    m.handle_next(10);
    m.worker.finish_batch(&m.input, Finish::Overlap).unwrap();
    assert_eq!(
        written(m),
        want[0],
        "acknowledged: the first batch's states"
    );
    m.worker.finish_batch(&m.input, Finish::Settle).unwrap();
    assert_eq!(
        written(m),
        want[0] + want[1],
        "settled: both batches' states, each once"
    );
    m.worker.finish_batch(&m.input, Finish::Settle).unwrap();
    assert_eq!(
        written(m),
        want[0] + want[1],
        "a batch with no events writes nothing"
    );
}

/// The input offsets committed over both partitions (`None`: none).
fn committed(bus: &Bus) -> Option<i64> {
    PARTITIONS
        .iter()
        .filter_map(|&p| bus.committed(INPUT, p))
        .reduce(|a, b| a + b)
}

/// [`committed`] once the member's store writer has stored every batch handed to it
/// and their offsets are committed.
fn committed_once_stored(m: &mut Member, bus: &Bus) -> Option<i64> {
    m.worker
        .commit_stored(&m.input, CommitMode::Async, true)
        .unwrap();
    committed(bus)
}

/// The changelog commit records on the bus, by batch id.
fn commit_records(bus: &Bus, config: &Config) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in bus.records(&config.kafka.changelog_topic) {
        let header = |name: &str| {
            r.headers
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.clone())
        };
        if header(CHANGELOG_KIND).as_deref() == Some(b"commit".as_slice()) {
            let batch = String::from_utf8(header(CHANGELOG_BATCH).unwrap()).unwrap();
            *out.entry(batch).or_default() += 1;
        }
    }
    out
}

#[test]
fn a_batchs_commit_records_go_out_once_its_records_are_acknowledged_before_the_next_batch_ends() {
    let InFlight {
        mut m,
        bus,
        config,
        _dir,
    } = a_batch_in_flight(true);
    // Its records in flight, unacknowledged: no commit record goes.
    bus.hold_deliveries(true);
    m.handle_next(1);
    m.worker.send_commit_records_once_acked();
    bus.hold_deliveries(false);
    let end = m.worker.outbox.end();
    assert!(m.worker.outbox.try_settle_below(end));
    assert!(
        commit_records(&bus, &config).is_empty(),
        "no commit record while the batch's records were in flight"
    );
    m.worker.send_commit_records_once_acked();
    assert!(
        commit_records(&bus, &config).is_empty(),
        "sent, not landed yet"
    );
    // The producer's next poll: they land, acknowledged.
    let end = m.worker.outbox.end();
    assert!(m.worker.outbox.try_settle_below(end));
    let early = commit_records(&bus, &config);
    assert_eq!(
        early.len(),
        1,
        "the first batch's commit records, before its end"
    );
    assert_eq!(
        committed(&bus),
        None,
        "its offsets wait for its store, at the next batch's end"
    );
    m.worker.send_commit_records_once_acked();
    m.handle_next(9);
    m.worker.finish_batch(&m.input, Finish::Overlap).unwrap();
    let after_end = commit_records(&bus, &config);
    assert_eq!(after_end, early, "sent once, not again at the batch's end");
    assert_eq!(
        committed_once_stored(&mut m, &bus),
        Some(10),
        "handed to the writer at the second batch's end, committed once stored"
    );
    m.worker.finish_batch(&m.input, Finish::Settle).unwrap();
    let settled = commit_records(&bus, &config);
    assert_eq!(settled.len(), 2, "the second batch's, at its settling");
}

/// Where the restarted member's state comes from.
#[derive(Clone, Copy, PartialEq)]
enum Restart {
    /// The same sled directory (whatever it held when the process died).
    SameDisk,
    /// An empty directory (a lost disk, another machine): the changelog alone.
    EmptyDisk,
}

/// Crashes a run at each of the bus's operations in turn and restarts it: every output
/// of the run without a crash, each copy with its counters, and nothing else.
fn crash_at_every_window(config: &Arc<Config>, restart: Restart) -> Windows {
    quiet_crashes();
    let sessions = 16;
    let (want, windows) = {
        let bus = bus_with_a_fleet(sessions);
        let dir = tempfile::tempdir().unwrap();
        let before = bus.ops();
        Member::start(&bus, dir.path(), config)
            .consume_all()
            .unwrap();
        (outputs(&bus, config), bus.ops() - before)
    };
    assert!(
        !want.terminated.is_empty() && !want.summaries.is_empty(),
        "the fleet has terminations and summaries to lose"
    );
    let mut copies = 0;
    let mut restored = 0;
    let mut crashed_at: BTreeMap<&str, u64> = BTreeMap::new();
    for crash_at in 1..=windows {
        let bus = bus_with_a_fleet(sessions);
        let dir = tempfile::tempdir().unwrap();
        bus.crash_at(crash_at);
        let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Member::start(&bus, dir.path(), config).consume_all()
        }));
        match crashed {
            Err(panic) if panic.downcast_ref::<&str>() == Some(&CRASH) => {}
            other => panic!("crash {crash_at} of {windows} did not happen: {other:?}"),
        }
        *crashed_at.entry(bus.crashed_at().unwrap()).or_default() += 1;
        bus.disarm();
        let empty = tempfile::tempdir().unwrap();
        let disk = match restart {
            Restart::SameDisk => dir.path(),
            Restart::EmptyDisk => empty.path(),
        };
        let mut member = Member::start(&bus, disk, config);
        member.consume_all().unwrap();
        restored += member.worker.stats.restored_records;
        copies += assert_same(
            &want,
            &outputs(&bus, config),
            &format!("crash at {crash_at}"),
        );
    }
    let kinds: Vec<&str> = crashed_at.keys().copied().collect();
    assert_eq!(
        kinds,
        ["delivery report", "offset commit", "send"],
        "every kind of window"
    );
    // Some windows re-emit (findings before the offsets are committed), with one event id.
    assert!(
        copies > 0,
        "no crash window re-emitted anything: {windows} windows"
    );
    Windows {
        crashed_at,
        copies,
        restored,
    }
}

/// What [`crash_at_every_window`] went through.
struct Windows {
    /// Crashes, by the kind of operation crashed at.
    crashed_at: BTreeMap<&'static str, u64>,
    /// Outputs on the bus more than once (one `event_id`).
    copies: usize,
    /// Session records the restarts restored from the changelog.
    restored: u64,
}

#[test]
fn a_crash_at_any_window_loses_and_double_counts_nothing_with_sled_alone() {
    let windows = crash_at_every_window(&config(25, false), Restart::SameDisk);
    eprintln!("sled alone: {windows}");
}

#[test]
fn a_crash_at_any_window_loses_and_double_counts_nothing_with_the_changelog() {
    let windows = crash_at_every_window(&config(25, true), Restart::SameDisk);
    eprintln!("with the changelog: {windows}");
}

#[test]
fn a_crash_at_any_window_loses_and_double_counts_nothing_with_partitions_taken_in_turns() {
    for (changelog, restart) in [
        (false, Restart::SameDisk),
        (true, Restart::SameDisk),
        (true, Restart::EmptyDisk),
    ] {
        let windows = crash_at_every_window(&config_taking_in_turns(25, changelog), restart);
        eprintln!(
            "in turns, changelog {changelog}, {}: {windows}",
            if restart == Restart::SameDisk {
                "same disk"
            } else {
                "empty disk"
            }
        );
    }
}

/// Applies the fleet's input as it is read, a partition at a time: all of partition 0's,
/// then 10 of 1's; the offsets applied in each.
fn all_of_0_and_10_of_1(m: &mut Member) -> (i64, i64) {
    while !m.worker.partitions[&1].applied.contains_key(INPUT) {
        m.handle_next(1);
    }
    m.handle_next(9);
    let applied = |partition: i32| m.worker.partitions[&partition].applied[INPUT];
    (applied(0), applied(1))
}

#[test]
fn a_refused_commit_is_sent_again_for_a_partition_still_held_and_never_for_one_given_up() {
    let bus = bus_with_a_fleet(6);
    let config = config(10, true);
    let dir = tempfile::tempdir().unwrap();
    let mut m = Member::start(&bus, dir.path(), &config);
    m.input.refuse_commits(true);
    let (applied_0, applied_1) = all_of_0_and_10_of_1(&mut m);
    m.worker.finish_batch(&m.input, Finish::Overlap).unwrap();
    // Stored and sent, refused (and sent again at once while settling, refused again).
    assert_eq!(committed_once_stored(&mut m, &bus), None);
    // Partition 1 given up (a revoke: its own last commit refused too), then given back.
    m.worker.revoking = vec![1];
    m.worker.finish_batch(&m.input, Finish::Settle).unwrap();
    m.worker.revoking.clear();
    m.worker.release(&[1]);
    super::rebalance::assign(&mut m.worker, &[1]).unwrap();
    assert_eq!(
        m.worker.partitions[&1].applied[INPUT], applied_1,
        "loaded as stored"
    );
    // The coordinator takes commits again: partition 0's refused offset goes through with
    // no event after it; partition 1's, sent while it was given up, is its next owner's
    // business and never sent again (here the same member, but the group may have moved on
    // in between).
    m.input.refuse_commits(false);
    m.worker
        .commit_stored(&m.input, CommitMode::Async, true)
        .unwrap();
    assert_eq!(bus.committed(INPUT, 0), Some(applied_0 + 1));
    assert_eq!(bus.committed(INPUT, 1), None);
}

/// The partitions whose log a skipped event has checked, and what it found: whether the
/// log ended before the offsets the state applied.
fn logs_checked(m: &Member) -> Vec<(i32, bool)> {
    m.worker
        .partitions
        .iter()
        .filter_map(|(&p, part)| part.log_ends_before_state.map(|behind| (p, behind)))
        .collect()
}

#[test]
fn a_log_that_ends_before_the_offsets_a_state_applied_is_told_from_a_log_read_again() {
    let config = config(10, true);
    let dir = tempfile::tempdir().unwrap();
    let bus = bus_with_a_fleet(6);
    {
        let mut m = Member::start(&bus, dir.path(), &config);
        // Nothing committed: the next member reads the whole log again.
        m.input.refuse_commits(true);
        m.consume_all().unwrap();
    }
    // The same log: its first event is skipped as applied, and the log goes on past it.
    let mut again = Member::start(&bus, dir.path(), &config);
    assert_eq!(logs_checked(&again), vec![]);
    again.handle_next(1);
    let checked = logs_checked(&again);
    assert!(
        checked.len() == 1 && !checked[0].1,
        "a log read again: {checked:?}"
    );
    drop(again);
    // Another log under the same state (a topic made again): fewer events than the state
    // applied, so its first is skipped too, and the log ends before the state's offset.
    let other = bus_with_a_fleet(2);
    let mut m = Member::start(&other, dir.path(), &config);
    m.handle_next(1);
    let checked = logs_checked(&m);
    assert!(
        checked.len() == 1 && checked[0].1,
        "another log: {checked:?}"
    );
}

#[test]
fn a_revoke_takes_the_revoked_partitions_changes_and_leaves_the_others_to_their_turn() {
    let bus = bus_with_a_fleet(6);
    let config = config_taking_in_turns(10, true);
    let want = {
        let bus = bus_with_a_fleet(6);
        let dir = tempfile::tempdir().unwrap();
        Member::start(&bus, dir.path(), &config)
            .consume_all()
            .unwrap();
        outputs(&bus, &config)
    };
    let dir = tempfile::tempdir().unwrap();
    let mut m = Member::start(&bus, dir.path(), &config);
    let (applied_0, applied_1) = all_of_0_and_10_of_1(&mut m);
    m.due_now(|_| false);
    // Neither's turn: a batch's end takes nothing, and nothing is committed.
    m.worker.finish_batch(&m.input, Finish::Overlap).unwrap();
    assert!(m.worker.partitions.values().all(|p| p.dirty));
    assert_eq!(committed_once_stored(&mut m, &bus), None);
    // Partition 1 revoked (a cooperative rebalance's partial revoke): its changes are
    // stored and committed before the revoke returns, partition 0's wait for its turn.
    m.worker.revoking = vec![1];
    m.worker.finish_batch(&m.input, Finish::Settle).unwrap();
    m.worker.revoking.clear();
    assert_eq!(bus.committed(INPUT, 1), Some(applied_1 + 1));
    assert_eq!(
        bus.committed(INPUT, 0),
        None,
        "partition 0 is not taken away"
    );
    assert!(
        m.worker.partitions[&0].dirty,
        "its changes wait in its engine"
    );
    // The rest of the stream, then a stop: every output as without the revoke, partition
    // 0's changes written at last.
    m.consume_all().unwrap();
    assert_same(&want, &outputs(&bus, &config), "after a partial revoke");
    assert_eq!(bus.committed(INPUT, 0), Some(applied_0 + 1));
}

#[test]
fn a_crash_at_any_window_then_a_restart_on_an_empty_disk_restores_everything_from_the_changelog() {
    let windows = crash_at_every_window(&config(25, true), Restart::EmptyDisk);
    eprintln!("changelog, empty disk: {windows}");
    assert!(
        windows.restored > 0,
        "the restarts restored from the changelog"
    );
}

#[test]
fn an_assignment_whose_restore_read_records_lets_the_changelog_reader_go_and_one_that_did_not_keeps_it(
) {
    use std::sync::atomic::Ordering;
    let bus = bus_with_a_fleet(6);
    let config = config(10, true);
    let first_disk = tempfile::tempdir().unwrap();
    let mut first = Member::start(&bus, first_disk.path(), &config);
    // Nothing on the changelog yet: nothing read, the reader kept.
    assert_eq!(first.reader_releases.load(Ordering::Relaxed), 0);
    first.consume_all().unwrap();
    drop(first);
    // An empty disk restores both partitions from the changelog: the reader goes once,
    // after the assignment is loaded.
    let second_disk = tempfile::tempdir().unwrap();
    let second = Member::start(&bus, second_disk.path(), &config);
    assert!(second.worker.stats.restored_records > 0, "nothing restored");
    assert_eq!(second.reader_releases.load(Ordering::Relaxed), 1);
    drop(second);
    // The same disk again, up to date with the changelog: nothing read, the reader kept.
    let third = Member::start(&bus, second_disk.path(), &config);
    assert_eq!(third.worker.stats.restored_records, 0);
    assert_eq!(third.reader_releases.load(Ordering::Relaxed), 0);
}

impl std::fmt::Display for Windows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: u64 = self.crashed_at.values().sum();
        write!(
            f,
            "{total} crash windows {:?}; {} outputs re-emitted; {} session records restored",
            self.crashed_at, self.copies, self.restored
        )
    }
}

/// Holds the member's partition stores from another thread for `hold` (the store writer
/// cannot write meanwhile); returns once they are held.
fn hold_stores_for(m: &Member, hold: std::time::Duration) -> std::thread::JoinHandle<()> {
    let stores = stores_of(m);
    let (held, holding) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        let guards: Vec<_> = stores.iter().map(|s| s.lock().unwrap()).collect();
        held.send(()).unwrap();
        std::thread::sleep(hold);
        drop(guards);
    });
    holding.recv().unwrap();
    holder
}

/// A second batch polled after the one in flight ([`a_batch_in_flight`]); the first,
/// acknowledged at the second's end, handed to a store writer that cannot write it yet
/// (its stores held for `hold`).
fn a_batch_with_the_writer(
    m: &mut Member,
    hold: std::time::Duration,
) -> std::thread::JoinHandle<()> {
    m.handle_next(10);
    let holder = hold_stores_for(m, hold);
    m.worker.finish_batch(&m.input, Finish::Overlap).unwrap();
    let first = m
        .worker
        .storing
        .front()
        .expect("the first batch is with the writer");
    assert!(
        first.stored.is_none(),
        "not written while its stores are held"
    );
    assert!(first.partitions.contains(&0), "it wrote partition 0");
    holder
}

#[test]
fn a_partition_is_released_only_after_its_batch_with_the_writer_is_written() {
    let mut t = a_batch_in_flight(true);
    let holder = a_batch_with_the_writer(&mut t.m, std::time::Duration::from_millis(200));
    let m = &mut t.m;
    m.worker.release(&[0]);
    assert!(
        m.worker.storing.front().is_some_and(|s| s.stored.is_some()),
        "released before the writer wrote its batch"
    );
    holder.join().unwrap();
}

#[test]
fn a_partition_is_acquired_again_only_after_its_batch_with_the_writer_is_written() {
    let mut t = a_batch_in_flight(true);
    let holder = a_batch_with_the_writer(&mut t.m, std::time::Duration::from_millis(200));
    let m = &mut t.m;
    // Taken away without waiting (as no path does since the writer), then given back:
    // the store is read again only once the batch is written.
    m.worker.partitions.remove(&0);
    m.worker.acquire(0).unwrap();
    assert!(
        m.worker.storing.front().is_some_and(|s| s.stored.is_some()),
        "acquired before the writer wrote its batch"
    );
    holder.join().unwrap();
}

#[test]
fn a_partition_another_worker_of_the_process_holds_is_loaded_only_once_it_is_let_go() {
    let mut t = a_batch_in_flight(true);
    let holder = a_batch_with_the_writer(&mut t.m, std::time::Duration::from_millis(300));
    // Kafka gives partition 0 to a second worker of the process while the first still
    // holds it: out of the group (it did not poll in time), it has not learnt so yet.
    let (bus, config) = (t.bus.clone(), t.config.clone());
    let (db, holds) = (t.m.worker.db.clone(), t.m.holds.clone());
    let dir = t._dir.path().to_path_buf();
    let second = std::thread::spawn(move || {
        let mut m = Member::on(&bus, &dir, &config, db, holds, 1, &[]);
        m.worker.acquire(0).unwrap();
        m.worker.partitions[&0].applied.get(INPUT).copied()
    });
    std::thread::sleep(std::time::Duration::from_millis(600));
    assert!(
        !second.is_finished(),
        "the second worker loaded partition 0 while the first held it"
    );
    holder.join().unwrap();
    // At its next poll the first learns the assignment is lost: its batch with the
    // writer is written, then the partition let go.
    t.m.worker.drop_unstored().unwrap();
    t.m.worker.release(&[0]);
    let loaded = second.join().unwrap();
    let stored = crate::engine::store::StateStore::offset(
        &SledStore::partition(&t.m.worker.db, 0).unwrap(),
        &format!("{INPUT}/0"),
    )
    .unwrap();
    assert!(
        stored.is_some(),
        "the first worker's batch wrote partition 0"
    );
    assert_eq!(loaded, stored, "loaded as the first worker left it");
}

#[test]
fn a_message_of_a_partition_the_worker_is_not_assigned_is_left_for_its_owner() {
    let bus = bus_with_a_fleet(6);
    let config = config(100, true);
    let dir = tempfile::tempdir().unwrap();
    let db = open_db_with_cache(dir.path(), 8 << 20).unwrap();
    let holds = Arc::new(PartitionHolds::default());
    let mut first = Member::on(
        &bus,
        dir.path(),
        &config,
        db.clone(),
        holds.clone(),
        0,
        &[0],
    );
    // A message of partition 1 reaches the worker assigned only partition 0.
    let stray = MemoryConsumer::new(&bus, &[INPUT], &[1]).poll().unwrap();
    assert_eq!(stray.partition(), 1);
    first.worker.handle(&stray, &first.input).unwrap();
    assert!(
        !first.worker.partitions.contains_key(&1),
        "the stray message's partition was loaded"
    );
    // The worker of the process that owns partition 1 takes it at once.
    let (bus2, config2, dir2) = (bus.clone(), config.clone(), dir.path().to_path_buf());
    let (loaded, took) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let owner = Member::on(&bus2, &dir2, &config2, db, holds, 1, &[1]);
        let _ = loaded.send(owner.worker.partitions.contains_key(&1));
    });
    assert_eq!(
        took.recv_timeout(std::time::Duration::from_secs(10)),
        Ok(true),
        "the owner waited for the partition"
    );
    // A partition assigned but not loaded (a surprise too) is loaded and applied.
    first.worker.partitions.remove(&0);
    let own = first.input.poll().unwrap();
    first.worker.handle(&own, &first.input).unwrap();
    assert!(
        first.worker.partitions[&0].dirty,
        "its message was not applied"
    );
}

#[test]
fn the_next_batch_waits_for_the_batch_in_flight_until_the_broker_has_all_of_it() {
    let bus = bus_with_a_fleet(6);
    let config = config(10, true);
    let dir = tempfile::tempdir().unwrap();
    let mut m = Member::start(&bus, dir.path(), &config);
    assert!(
        !m.worker.awaits_batch_in_flight(),
        "no batch in flight before the first batch's end"
    );
    m.handle_next(10);
    bus.hold_deliveries(true);
    m.worker.finish_batch(&m.input, Finish::Overlap).unwrap();
    m.handle_next(1);
    assert!(
        m.worker.awaits_batch_in_flight(),
        "its records are in flight"
    );
    assert!(commit_records(&bus, &config).is_empty());
    // Its records' acknowledgements come after the asking's first look at the producer
    // (a second look would see them): its commit records are still to send.
    bus.hold_deliveries(false);
    bus.hold_deliveries_for_polls(1);
    assert!(
        m.worker.awaits_batch_in_flight(),
        "its commit records are not sent yet"
    );
    assert!(commit_records(&bus, &config).is_empty());
    // They land; the next asking sends its commit records: in flight in turn.
    let end = m.worker.outbox.end();
    assert!(m.worker.outbox.try_settle_below(end));
    bus.hold_deliveries(true);
    assert!(
        m.worker.awaits_batch_in_flight(),
        "its commit records are in flight"
    );
    assert!(
        commit_records(&bus, &config).is_empty(),
        "the commit records have not landed"
    );
    bus.hold_deliveries(false);
    assert!(
        !m.worker.awaits_batch_in_flight(),
        "everything of the batch is on the broker"
    );
    assert_eq!(commit_records(&bus, &config).len(), 1);
    // A failed delivery ends the wait: the batch's end sends it again, with backoff.
    m.handle_next(9);
    bus.hold_deliveries(true);
    m.worker.finish_batch(&m.input, Finish::Overlap).unwrap();
    assert!(m.worker.awaits_batch_in_flight());
    bus.hold_deliveries(false);
    bus.fail_deliveries(1);
    assert!(
        !m.worker.awaits_batch_in_flight(),
        "a failed delivery is for the batch's end to send again"
    );
    m.worker.finish_batch(&m.input, Finish::Settle).unwrap();
    assert!(!m.worker.awaits_batch_in_flight(), "settled");
    assert_eq!(
        commit_records(&bus, &config).len(),
        2,
        "the second batch's commit records, after its failed record was sent again"
    );
    assert_eq!(committed_once_stored(&mut m, &bus), Some(20));
}

/// The trace of session `session` (32 hex digits).
fn trace_of_session(session: &[u8]) -> String {
    let h = crate::engine::hash::line_hash(session);
    format!("{:016x}{:016x}", h | 1, !h)
}

/// The W3C `traceparent` of the message at `offset` of `topic`/`partition`: its
/// session's trace, and a parent span of that message's own.
fn traceparent_of_message(session: &[u8], topic: &str, partition: i32, offset: i64) -> String {
    let span = crate::engine::hash::line_hash(format!("{topic}/{partition}/{offset}").as_bytes());
    format!("00-{}-{:016x}-01", trace_of_session(session), span | 1)
}

/// Each input message carries a `traceparent` of its own (its session's trace), and every
/// output carries its triggering message's: each finding the one at its trigger's
/// offset, each summary (closed by an event here) one of its session's trace. With one
/// input topic, where an event is applied as its message is handled, and with two, where
/// the first topic's events are held for the second's (polled after it) and applied
/// once their messages are gone.
#[test]
fn each_output_carries_the_traceparent_of_the_message_that_triggered_it() {
    const LLM: &str = "cost.attributed";
    for inputs in [vec![INPUT], vec![INPUT, LLM]] {
        let bus = Bus::default();
        let mut next_offset: BTreeMap<(&str, i32), i64> = BTreeMap::new();
        for_each_fleet_event(12, |e, partition| {
            let session = e.session_id.as_bytes();
            let llm = e.json.windows(17).any(|w| w == br#""cost.attributed""#);
            let topic = if llm && inputs.len() == 2 { LLM } else { INPUT };
            let offset = next_offset.entry((topic, partition)).or_default();
            let tp = traceparent_of_message(session, topic, partition, *offset);
            *offset += 1;
            bus.produce_with_headers(
                topic,
                partition,
                session,
                &e.json,
                &[("traceparent", tp.as_bytes())],
            );
        });
        let topics = inputs
            .iter()
            .map(|t| format!("\"{t}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let toml = format!("[kafka]\ninput_topics = [{topics}]\nmax_batch_events = 50\n");
        let config = Arc::new(Config::from_toml_str(&toml, "recipe", std::iter::empty()).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let mut m = Member::start(&bus, dir.path(), &config);
        let mut most_held = 0;
        let mut polled = 0;
        while let Some(msg) = m.input.poll() {
            m.worker.handle(&msg, &m.input).unwrap();
            most_held = most_held.max(m.worker.held());
            polled += 1;
            if polled % 50 == 0 {
                m.worker.finish_batch(&m.input, Finish::Overlap).unwrap();
            }
        }
        // What still waits for the other topic goes once its wait is over.
        std::thread::sleep(config.kafka.align_wait + std::time::Duration::from_millis(50));
        m.worker.observe_unpolled(&m.input);
        m.worker.release_due();
        assert_eq!(m.worker.held(), 0, "{inputs:?}: nothing left held");
        m.worker.finish_batch(&m.input, Finish::Settle).unwrap();
        if inputs.len() == 2 {
            assert!(
                most_held > 100,
                "the first topic's events were held: {most_held}"
            );
        }
        let header = |r: &Landed| {
            let (_, value) = r.headers.iter().find(|(name, _)| name == "traceparent")?;
            String::from_utf8(value.clone()?).ok()
        };
        let mut findings = 0;
        for topic in [&config.kafka.warning_topic, &config.kafka.terminated_topic] {
            for r in bus.records(topic) {
                let finding: serde_json::Value =
                    serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap();
                let trigger = &finding["trigger"];
                let want = traceparent_of_message(
                    &r.key,
                    trigger["topic"].as_str().unwrap(),
                    trigger["partition"].as_i64().unwrap() as i32,
                    trigger["offset"].as_i64().unwrap(),
                );
                assert_eq!(header(&r), Some(want), "{inputs:?}: a finding on {topic}");
                findings += 1;
            }
        }
        let summaries = bus.records(&config.kafka.summary_topic);
        for r in &summaries {
            let trace = header(r).map(|tp| tp[3..35].to_string());
            assert_eq!(
                trace,
                Some(trace_of_session(&r.key)),
                "{inputs:?}: a summary"
            );
        }
        assert!(findings > 0, "{inputs:?}: no finding");
        assert_eq!(summaries.len(), 12, "{inputs:?}: every session's summary");
    }
}

#[test]
fn a_message_that_leaves_nothing_to_send_hands_the_poll_loop_its_clock_and_one_that_does_not() {
    let bus = Bus::default();
    let mut first_event = None;
    for_each_fleet_event(1, |e, _| {
        first_event.get_or_insert_with(|| e.json.clone());
    });
    let event = first_event.expect("a fleet event");
    bus.produce(INPUT, 0, b"s", &event);
    bus.produce(INPUT, 0, b"s", b"not an event");
    let config = config(100, true);
    let dir = tempfile::tempdir().unwrap();
    let db = open_db_with_cache(dir.path(), 8 << 20).unwrap();
    let holds = Arc::new(PartitionHolds::default());
    let mut member = Member::on(&bus, dir.path(), &config, db, holds, 0, &[0]);
    let before = std::time::Instant::now();
    let quiet = member.input.poll().unwrap();
    let handled = member.worker.handle(&quiet, &member.input).unwrap();
    assert!(
        handled.is_some_and(|t| t >= before),
        "an event with no output did not hand back when its work ended: {handled:?}"
    );
    // A dead letter is handed to the producer after the work's end: the loop reads the
    // clock again.
    let bad = member.input.poll().unwrap();
    assert_eq!(member.worker.handle(&bad, &member.input).unwrap(), None);
}

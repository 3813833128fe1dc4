//! The pipeline in-process on the embedded broker (librdkafka's mock cluster): the middle
//! test layer, fast enough to run on every change (no broker to install, no subprocess).
//! What it shows: a batch is delivered, stored and committed (a restart re-reads nothing
//! and re-emits nothing); findings go out as their events are applied, before their
//! batch closes; the changelog rebuilds a fresh state directory; two members of
//! the group share the partitions and together find what `replay` finds; bad messages are
//! dead-lettered with their reason; the OTLP ingest re-publishes spans keyed by session and
//! dead-letters what the engine would refuse; readiness holds while every worker holds
//! the group's assignment (an empty one too) and not while a group that refuses its joins
//! leaves a worker without one; a member that joins a settled group on the embedded
//! broker's own defaults gets its partitions in seconds; an offset commit the
//! coordinator refused is sent again once it takes them; a static member fenced by
//! another with its id (the pipeline's and the OTLP ingest's) stops the process with an
//! error naming it, and so does a producer that failed fatally (a restart loses nothing
//! after either). Transactions, pause/resume, SIGKILL and several
//! processes stay in `tests/pipeline.rs` against Tansu (the mock cluster does not show
//! them faithfully).

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::*;
use loopwarden::bus::kafka::embedded::{ApiKey, EmbeddedBroker};
use loopwarden::bus::pipeline::{run_observed, PipelineError, RunStats};
use loopwarden::config::Config;
use loopwarden::engine::store::{open_db, SledStore, StateStore};
use loopwarden::shutdown::Shutdown;
use loopwarden::telemetry::Telemetry;
use rdkafka::message::OwnedMessage;
use rdkafka::types::RDKafkaRespErr;

const PARTITIONS: i32 = 3;

/// A mock cluster with fresh topics, and configs for instances of one deployment.
struct Cluster {
    broker: EmbeddedBroker,
    topics: Topics,
    dir: tempfile::TempDir,
    group: String,
}

impl Cluster {
    fn start() -> Cluster {
        let topics = Topics::named();
        let broker = EmbeddedBroker::start(&[], 1).unwrap();
        for (name, partitions) in topics.layout(PARTITIONS) {
            broker.create_topic(name, partitions).unwrap();
        }
        // The mock cluster does not take topic creation through the admin API, which is
        // how `run` creates the changelog elsewhere.
        broker.create_topic(&topics.changelog, PARTITIONS).unwrap();
        Cluster {
            broker,
            topics,
            dir: tempfile::tempdir().unwrap(),
            group: unique("g"),
        }
    }

    fn brokers(&self) -> String {
        self.broker.bootstrap_servers().to_string()
    }

    /// The config of instance `name` (its own state directory), with `extra` TOML.
    fn config(&self, name: &str, extra: &str) -> Arc<Config> {
        self.config_with_env(name, extra, &[])
    }

    /// [`Cluster::config`] with `env`'s settings over the file's (`LOOPWARDEN_*`).
    fn config_with_env(&self, name: &str, extra: &str, env: &[(&str, &str)]) -> Arc<Config> {
        self.config_keeping(name, extra, env, |_| true)
    }

    /// The config of instance `name` as `run` has it on the embedded broker it starts: no
    /// `kafka.brokers` (the address is handed to `run` apart), and the group's timing left
    /// to loopwarden (the tests' own short session dropped).
    fn embedded_config(&self, name: &str) -> Arc<Config> {
        self.config_keeping(name, "", &[], |l| {
            !l.starts_with("brokers = ")
                && !l.starts_with("\"session.timeout.ms\"")
                && !l.starts_with("\"heartbeat.interval.ms\"")
        })
    }

    /// [`Cluster::config_with_env`] with only the file's lines that `keep`.
    fn config_keeping(
        &self,
        name: &str,
        extra: &str,
        env: &[(&str, &str)],
        keep: impl Fn(&str) -> bool,
    ) -> Arc<Config> {
        let home = self.dir.path().join(name);
        std::fs::create_dir_all(&home).unwrap();
        let path = write_config(&home, &self.brokers(), &self.topics, extra);
        // One group for every instance of the deployment.
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text
            .lines()
            .filter(|l| keep(l))
            .map(|l| {
                if l.starts_with("group_id = ") {
                    format!("group_id = \"{}\"", self.group)
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&path, text).unwrap();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Arc::new(Config::load(&path, env).unwrap())
    }

    fn produce(&self, events: &[Vec<u8>]) {
        produce(&self.brokers(), &self.topics.input, events, &[]);
    }

    /// Waits (up to 60 s) until the group has committed `events` input offsets in all:
    /// everything produced so far is applied, stored and committed. Whether it did.
    fn wait_committed(&self, events: usize) -> bool {
        let (brokers, within) = (self.brokers(), Duration::from_secs(60));
        committed_reaching(&brokers, &self.group, &self.topics.input, events, within)
            >= events as i64
    }

    /// [`Cluster::wait_committed`], failing with the offsets committed when it times out.
    fn assert_committed(&self, events: usize, context: &str) {
        assert!(
            self.wait_committed(events),
            "{context}: {events} events produced, offsets committed: {:?}",
            committed_offsets(&self.brokers(), &self.group, &self.topics.input)
        );
    }

    /// Asserts that the group has committed no input offset yet.
    fn assert_nothing_committed(&self, when: &str) {
        let committed = committed_offsets(&self.brokers(), &self.group, &self.topics.input);
        assert!(
            committed.iter().all(Option::is_none),
            "nothing committed {when}: {committed:?}"
        );
    }

    /// Runs instance `config` until the group has committed `committed` input events,
    /// then stops it: its telemetry, for the metrics, and its stats.
    fn run_until_committed(
        &self,
        config: Arc<Config>,
        committed: usize,
    ) -> (Arc<Telemetry>, RunStats) {
        let telemetry = Arc::new(Telemetry::new());
        let running = Running::observed(config, self.brokers(), telemetry.clone());
        self.assert_committed(committed, "every event applied");
        (telemetry, running.stop())
    }

    fn read(&self, topic: &str, min: usize) -> Vec<OwnedMessage> {
        read_topic(
            &self.brokers(),
            topic,
            min,
            Duration::from_secs(30),
            Duration::from_millis(300),
        )
    }
}

/// `run` on its own thread, stopped by [`Running::stop`].
struct Running {
    shutdown: Shutdown,
    thread: JoinHandle<Result<RunStats, PipelineError>>,
}

impl Running {
    fn start(config: Arc<Config>, brokers: String) -> Running {
        Running::observed(config, brokers, Arc::new(Telemetry::new()))
    }

    /// [`Running::start`], reporting metrics and readiness to `telemetry`.
    fn observed(config: Arc<Config>, brokers: String, telemetry: Arc<Telemetry>) -> Running {
        let shutdown = Shutdown::new();
        let thread = {
            let shutdown = shutdown.clone();
            std::thread::spawn(move || run_observed(config, &brokers, shutdown, telemetry))
        };
        Running { shutdown, thread }
    }

    fn stop(self) -> RunStats {
        self.shutdown.trigger();
        self.thread.join().unwrap().unwrap()
    }
}

/// What replay finds in `events`: the finding keys, and the terminations' event ids.
fn replayed(config: &Arc<Config>, events: &[Vec<u8>]) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut findings = BTreeSet::new();
    let mut terminations = BTreeSet::new();
    for v in replay(config.clone(), events) {
        match v["type"].as_str().unwrap() {
            "session.summary" => {}
            t => {
                findings.insert(finding_key(&v));
                if t == "session.terminated" {
                    terminations.insert(v["event_id"].as_str().unwrap().to_string());
                }
            }
        }
    }
    (findings, terminations)
}

fn event_ids(msgs: &[OwnedMessage]) -> Vec<String> {
    msgs.iter()
        .map(|m| json(m)["event_id"].as_str().unwrap().to_string())
        .collect()
}

/// Each partition's applied offset of `topic` as stored in `state`.
fn stored_offsets(state: &Path, topic: &str) -> Vec<Option<i64>> {
    let db = open_db(state).unwrap();
    (0..PARTITIONS)
        .map(|p| {
            SledStore::partition(&db, p)
                .unwrap()
                .offset(&format!("{topic}/{p}"))
                .unwrap()
        })
        .collect()
}

/// A fleet of `sessions` (half of them looping, from `seed`), and the terminations replay
/// finds in it under `config`: at least `loops` of them.
fn looping_fleet(
    config: &Arc<Config>,
    sessions: u64,
    seed: u64,
    loops: usize,
) -> (Vec<Vec<u8>>, BTreeSet<String>) {
    let (events, _) = fleet(sessions, 0.5, seed);
    let (_, want) = replayed(config, &events);
    assert!(want.len() >= loops, "the fleet loops");
    (events, want)
}

/// Once a run over `cluster` stopped: every partition's committed offset is the one after
/// its stored offset, and a restart reads from them, applies nothing and re-emits none of
/// the `terminations` already on the bus.
fn assert_a_restart_re_reads_nothing(cluster: &Cluster, config: Arc<Config>, terminations: usize) {
    let stored = stored_offsets(&config.state_path, &cluster.topics.input);
    let committed = committed_offsets(&cluster.brokers(), &cluster.group, &cluster.topics.input);
    let ends: Vec<Option<i64>> = stored.iter().map(|o| o.map(|o| o + 1)).collect();
    assert_eq!(committed, ends, "group offsets = stored offsets + 1");
    let again = Running::start(config, cluster.brokers());
    std::thread::sleep(Duration::from_secs(2));
    let stats = again.stop();
    assert_eq!((stats.events, stats.skipped, stats.terminations), (0, 0, 0));
    assert_eq!(
        cluster.read(&cluster.topics.terminated, 0).len(),
        terminations,
        "nothing re-emitted"
    );
}

#[test]
fn a_batch_is_delivered_stored_and_committed_and_a_restart_re_reads_nothing() {
    let cluster = Cluster::start();
    let config = cluster.config("a", "");
    let (events, want) = looping_fleet(&config, 60, 3, 11);
    cluster.produce(&events);

    let running = Running::start(config.clone(), cluster.brokers());
    let terminated = cluster.read(&cluster.topics.terminated, want.len());
    let stats = running.stop();
    let got: BTreeSet<String> = event_ids(&terminated).into_iter().collect();
    assert_eq!(got, want, "terminations differ from replay");
    assert_eq!(terminated.len(), want.len(), "each termination once");
    assert_eq!(stats.events, events.len() as u64);

    // Stored: every partition's last offset; committed: the next one, for the group.
    let stored = stored_offsets(&config.state_path, &cluster.topics.input);
    assert_eq!(
        stored.iter().flatten().map(|o| o + 1).sum::<i64>(),
        events.len() as i64,
        "every event stored as applied"
    );
    assert_a_restart_re_reads_nothing(&cluster, config, want.len());
}

/// Instance "a" of `cluster` with the whole backlog in one batch that closes after
/// `batch_wait`, and a small looping fleet with the terminations replay finds in it.
fn one_batch_of_loops(
    cluster: &Cluster,
    batch_wait: Duration,
) -> (Arc<Config>, Vec<Vec<u8>>, BTreeSet<String>) {
    let mut config = (*cluster.config("a", "")).clone();
    config.kafka.max_batch_wait = batch_wait;
    config.kafka.max_batch_events = 1_000_000;
    let config = Arc::new(config);
    let (events, want) = looping_fleet(&config, 30, 5, 1);
    (config, events, want)
}

#[test]
fn findings_go_out_as_their_event_is_applied_and_the_batch_is_still_committed_whole() {
    let cluster = Cluster::start();
    // One batch for the whole run: it closes only at the stop.
    let (config, events, want) = one_batch_of_loops(&cluster, Duration::from_secs(120));
    cluster.produce(&events);
    let running = Running::start(config.clone(), cluster.brokers());
    let terminated = cluster.read(&cluster.topics.terminated, want.len());
    let got: BTreeSet<String> = event_ids(&terminated).into_iter().collect();
    assert_eq!(got, want, "terminations out while the batch is open");
    cluster.assert_nothing_committed("before the batch closes");
    let stats = running.stop();
    assert_eq!(stats.events, events.len() as u64);
    let committed = committed_offsets(&cluster.brokers(), &cluster.group, &cluster.topics.input);
    assert_eq!(
        committed.iter().flatten().sum::<i64>(),
        events.len() as i64,
        "the batch stored and committed at the stop"
    );
}

/// Instance "a" of `cluster` with batches of 50 ms and `kafka.commit_interval_ms` at
/// `interval`, and a small looping fleet with the terminations replay finds in it.
fn commit_interval_of(
    cluster: &Cluster,
    interval: Duration,
) -> (Arc<Config>, Vec<Vec<u8>>, BTreeSet<String>) {
    let interval = interval.as_millis().to_string();
    let config = cluster.config_with_env(
        "a",
        "",
        &[
            ("LOOPWARDEN_KAFKA__MAX_BATCH_WAIT_MS", "50"),
            ("LOOPWARDEN_KAFKA__COMMIT_INTERVAL_MS", &interval),
        ],
    );
    let (events, want) = looping_fleet(&config, 60, 11, 11);
    (config, events, want)
}

#[test]
fn a_commit_interval_holds_each_partitions_commit_to_its_turn_and_a_stop_commits_all() {
    let cluster = Cluster::start();
    // The longest interval, a minute: partition 0's first turn is the first batch's end,
    // partition 1's 37 s later (0.618 of it), partition 2's 14 s later (0.236).
    let (config, events, want) = commit_interval_of(&cluster, Duration::from_secs(60));
    cluster.produce(&events);
    let telemetry = Arc::new(Telemetry::new());
    let started = std::time::Instant::now();
    let running = Running::observed(config.clone(), cluster.brokers(), telemetry.clone());
    let terminated = cluster.read(&cluster.topics.terminated, want.len());
    let got: BTreeSet<String> = event_ids(&terminated).into_iter().collect();
    assert_eq!(got, want, "terminations go out as their events are applied");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while consumed_total(&telemetry) < events.len() as u64 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The batch in flight settles; then, idle, changes whose turn has not come end no
    // batch (before, one ended at every idle poll while any partition had changes).
    std::thread::sleep(Duration::from_secs(1));
    let batch_ends = || {
        telemetry
            .metrics
            .batch_stages
            .with_label_values(&["close"])
            .get_sample_count()
    };
    let ends = batch_ends();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(batch_ends(), ends, "no batch ends while the input is idle");
    let committed = committed_offsets(&cluster.brokers(), &cluster.group, &cluster.topics.input);
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(35),
        "the run took {waited:?}: partition 1's turn is near"
    );
    assert_eq!(
        committed[1], None,
        "partition 1 waits for its turn (or a stop): {committed:?}"
    );
    // Partition 2's turn comes 14 s in: held until then.
    if waited < Duration::from_secs(13) {
        assert_eq!(committed[2], None, "partition 2 too: {committed:?}");
    }
    let batches_before_stop = telemetry.metrics.batches.get();
    let stats = running.stop();
    assert_eq!(stats.events, events.len() as u64);
    let committed = committed_offsets(&cluster.brokers(), &cluster.group, &cluster.topics.input);
    assert!(committed.iter().all(Option::is_some), "{committed:?}");
    assert_eq!(
        committed.iter().flatten().sum::<i64>(),
        events.len() as i64,
        "the stop stores and commits every partition"
    );
    // Each event's processing latency observed once, when its partition was committed.
    assert_eq!(
        telemetry.metrics.processing_latency.get_sample_count(),
        events.len() as u64
    );
    assert!(
        telemetry.metrics.batches.get() > batches_before_stop,
        "the stop finished a batch"
    );
    assert_a_restart_re_reads_nothing(&cluster, config, want.len());
}

#[test]
fn with_a_short_commit_interval_every_partition_is_committed_without_a_stop() {
    let cluster = Cluster::start();
    let (config, events, want) = commit_interval_of(&cluster, Duration::from_millis(700));
    cluster.produce(&events);
    let telemetry = Arc::new(Telemetry::new());
    let running = Running::observed(config, cluster.brokers(), telemetry.clone());
    let terminated = cluster.read(&cluster.topics.terminated, want.len());
    assert_eq!(event_ids(&terminated).len(), want.len());
    cluster.wait_committed(events.len());
    let committed = committed_offsets(&cluster.brokers(), &cluster.group, &cluster.topics.input);
    assert_eq!(
        committed.iter().flatten().sum::<i64>(),
        events.len() as i64,
        "every partition came due and was committed: {committed:?}"
    );
    assert_eq!(
        telemetry.metrics.processing_latency.get_sample_count(),
        events.len() as u64,
        "each event's latency observed once, at its commit"
    );
    let stats = running.stop();
    assert_eq!(stats.events, events.len() as u64);
}

/// `loopwarden_events_consumed_total`, every type together.
fn consumed_total(telemetry: &Telemetry) -> u64 {
    use prometheus::core::Collector;
    telemetry
        .metrics
        .events_consumed
        .collect()
        .iter()
        .flat_map(|family| family.get_metric())
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}

#[test]
fn events_are_counted_consumed_while_their_batch_is_still_open() {
    let cluster = Cluster::start();
    // One batch for the whole run: it closes only at the stop.
    let (config, events, _) = one_batch_of_loops(&cluster, Duration::from_secs(120));
    cluster.produce(&events);
    let telemetry = Arc::new(Telemetry::new());
    let running = Running::observed(config, cluster.brokers(), telemetry.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while consumed_total(&telemetry) < events.len() as u64 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        consumed_total(&telemetry),
        events.len() as u64,
        "every event counted before its batch closes"
    );
    cluster.assert_nothing_committed("while the batch is open");
    let stats = running.stop();
    assert_eq!(stats.events, events.len() as u64);
    assert_eq!(
        consumed_total(&telemetry),
        events.len() as u64,
        "none counted twice"
    );
}

/// Commit records on the changelog (what makes a batch count on restore), read for 2 s
/// (errors of the partition left without a leader meanwhile are passed over).
fn changelog_commits(cluster: &Cluster) -> usize {
    let consumer = reader_isolated(
        &cluster.brokers(),
        &[&cluster.topics.changelog],
        "read_uncommitted",
    );
    let until = std::time::Instant::now() + Duration::from_secs(2);
    let mut commits = 0;
    while std::time::Instant::now() < until {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            commits += usize::from(
                header(&m.detach(), "loopwarden.changelog").as_deref() == Some("commit"),
            );
        }
    }
    commits
}

#[test]
fn a_batch_counts_on_the_changelog_only_once_its_terminations_are_on_the_broker() {
    let cluster = Cluster::start();
    // The whole backlog in the first batch, so that its terminations are in it.
    let (config, events, want) = one_batch_of_loops(&cluster, Duration::from_millis(300));
    // The terminations' topic without a leader: they cannot be delivered; the changelog
    // can.
    let terminated = &cluster.topics.terminated;
    cluster.broker.set_leader(terminated, 0, None).unwrap();
    cluster.produce(&events);
    let running = Running::start(config.clone(), cluster.brokers());
    std::thread::sleep(Duration::from_secs(5));
    // Were a batch's commit record on the changelog now, a crash here would restore the
    // batch, skip its events and lose its terminations for good.
    assert_eq!(
        changelog_commits(&cluster),
        0,
        "a batch committed on the changelog while its terminations are not on the broker"
    );
    cluster.broker.set_leader(terminated, 0, Some(1)).unwrap();
    cluster.wait_committed(events.len());
    let terminated = cluster.read(&cluster.topics.terminated, want.len());
    let got: BTreeSet<String> = event_ids(&terminated).into_iter().collect();
    assert_eq!(got, want);
    assert!(
        changelog_commits(&cluster) > 0,
        "the batches committed after all"
    );
    let stats = running.stop();
    assert_eq!(stats.events, events.len() as u64);
}

#[test]
fn the_changelog_rebuilds_a_fresh_state_directory() {
    let cluster = Cluster::start();
    let a = cluster.config("a", "");
    // Sessions that stay open (no session.completed): their state lives only in the
    // engine, sled and the changelog when A stops.
    let (events, _) = fleet(40, 0.0, 8);
    let open: Vec<Vec<u8>> = events
        .into_iter()
        .filter(|e| !String::from_utf8_lossy(e).contains("session.completed"))
        .collect();
    cluster.produce(&open[..open.len() / 2]);
    let running = Running::start(a.clone(), cluster.brokers());
    cluster.wait_committed(open.len() / 2);
    let first = running.stop();
    assert_eq!(first.events, (open.len() / 2) as u64);

    // B: same group, empty disk. It restores the sessions, then takes the rest.
    let b = cluster.config("b", "");
    cluster.produce(&open[open.len() / 2..]);
    let running = Running::start(b.clone(), cluster.brokers());
    cluster.wait_committed(open.len());
    let second = running.stop();
    assert!(second.restored_records > 0, "restored from the changelog");
    assert_eq!(second.events, (open.len() - open.len() / 2) as u64);
    assert_eq!(second.skipped, 0, "resumed at the restored offsets");
    assert_eq!(
        stored_offsets(&b.state_path, &cluster.topics.input),
        stored_offsets(&a.state_path, &cluster.topics.input)
            .iter()
            .zip(committed_offsets(
                &cluster.brokers(),
                &cluster.group,
                &cluster.topics.input
            ))
            .map(|(_, c)| c.map(|c| c - 1))
            .collect::<Vec<_>>(),
        "B stored what the group committed"
    );
    // One engine over the whole stream finds what A then B found.
    let (want, _) = replayed(&a, &open);
    let got: BTreeSet<String> = cluster
        .read(&cluster.topics.warning, 0)
        .iter()
        .chain(cluster.read(&cluster.topics.terminated, 0).iter())
        .map(|m| finding_key(&json(m)))
        .collect();
    assert_eq!(
        got, want,
        "findings across the hand-over differ from replay"
    );
}

#[test]
fn two_group_members_share_the_partitions_and_find_what_replay_finds() {
    let cluster = Cluster::start();
    let config = cluster.config("a", "");
    let (events, _) = fleet(80, 0.5, 21);
    let (want, terminations) = replayed(&config, &events);
    let first_half = events.len() / 2;
    cluster.produce(&events[..first_half]);
    let one = Running::start(config.clone(), cluster.brokers());
    std::thread::sleep(Duration::from_millis(1500));
    // A second member joins mid-stream (its own state directory): the partitions are
    // rebalanced, the first stores what it gives up, the second restores it.
    let other = Running::start(cluster.config("b", ""), cluster.brokers());
    cluster.produce(&events[first_half..]);
    let terminated = cluster.read(&cluster.topics.terminated, terminations.len());
    let warnings = cluster.read(&cluster.topics.warning, 1);
    let (s1, s2) = (one.stop(), other.stop());
    assert_eq!(
        s1.events + s2.events,
        events.len() as u64,
        "every event applied once between the two"
    );
    let got: BTreeSet<String> = terminated
        .iter()
        .chain(warnings.iter())
        .map(|m| finding_key(&json(m)))
        .collect();
    assert_eq!(got, want, "findings differ from replay");
}

/// Waits (up to 30 s) until `ready` reads `want`; false if it never did.
fn readiness_becomes(telemetry: &Telemetry, want: bool) -> bool {
    eventually(Duration::from_secs(30), || {
        telemetry.readiness.is_ready() == want
    })
}

/// Waits (up to 30 s) until ready, saying why not if it never is.
fn assert_becomes_ready(telemetry: &Telemetry, context: &str) {
    assert!(
        readiness_becomes(telemetry, true),
        "{context}: not ready: {}",
        telemetry.readiness.describe()
    );
}

/// Produces a small fleet (`seed`), waits until the group has committed all of it, and
/// stops `running`, which applied every event.
fn applies_a_fleet_then_stops(cluster: &Cluster, running: Running, seed: u64) {
    let (events, _) = fleet(12, 0.0, seed);
    cluster.produce(&events);
    cluster.wait_committed(events.len());
    assert_eq!(running.stop().events, events.len() as u64);
}

#[test]
fn a_worker_given_no_partitions_by_a_settled_group_is_ready() {
    // Four workers, three partitions: one worker's consumer is handed an empty assignment.
    let cluster = Cluster::start();
    let config = cluster.config_with_env("a", "", &[("LOOPWARDEN_KAFKA__WORKERS", "4")]);
    assert_eq!(config.kafka.workers, 4);
    let telemetry = Arc::new(Telemetry::new());
    let running = Running::observed(config, cluster.brokers(), telemetry.clone());
    assert_becomes_ready(&telemetry, "four workers, three partitions");
    applies_a_fleet_then_stops(&cluster, running, 5);
}

/// One member on a fresh cluster, once it is ready, with the telemetry it reports to.
fn a_ready_member(context: &str) -> (Cluster, Arc<Telemetry>, Running) {
    let cluster = Cluster::start();
    let telemetry = Arc::new(Telemetry::new());
    let running = Running::observed(
        cluster.config("a", ""),
        cluster.brokers(),
        telemetry.clone(),
    );
    assert_becomes_ready(&telemetry, context);
    (cluster, telemetry, running)
}

#[test]
fn a_member_whose_group_cannot_settle_is_not_ready_until_it_holds_an_assignment_again() {
    let (cluster, telemetry, running) = a_ready_member("once assigned");
    // The coordinator forgets the member (its assignment is lost at the next heartbeat)
    // and refuses every join after: the group cannot hand it partitions again.
    let refused = RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID;
    cluster
        .broker
        .fail_requests(ApiKey::JoinGroup, refused, 100_000);
    cluster.broker.fail_requests(ApiKey::Heartbeat, refused, 1);
    assert!(
        readiness_becomes(&telemetry, false),
        "a member that lost its partitions reads ready"
    );
    assert_eq!(
        telemetry.readiness.describe(),
        "waiting for a partition assignment"
    );
    // Rejoins keep failing (about one a second): it stays not ready meanwhile.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !telemetry.readiness.is_ready(),
        "ready while no join succeeds"
    );
    cluster.broker.clear_request_failures(ApiKey::JoinGroup);
    assert_becomes_ready(&telemetry, "once the group settles again");
    applies_a_fleet_then_stops(&cluster, running, 7);
}

#[test]
fn on_the_embedded_broker_a_member_that_joins_a_settled_group_gets_its_partitions_in_seconds() {
    // The mock cluster hands out partitions only once the session timeout less a second
    // has passed since a member joined a group with members: with librdkafka's 45 s, the
    // second member (a process's second worker) waited 44 s, past the 30 s of
    // `assert_becomes_ready`; loopwarden's timing for the embedded broker makes it 2 s.
    let cluster = Cluster::start();
    let (config_a, config_b) = (cluster.embedded_config("a"), cluster.embedded_config("b"));
    assert_eq!(config_a.kafka.brokers, None);
    assert!(!config_a.kafka.consumer.contains_key("session.timeout.ms"));

    let first_telemetry = Arc::new(Telemetry::new());
    let first = Running::observed(config_a, cluster.brokers(), first_telemetry.clone());
    assert_becomes_ready(&first_telemetry, "the first member");
    let second_telemetry = Arc::new(Telemetry::new());
    let second = Running::observed(config_b, cluster.brokers(), second_telemetry.clone());
    assert_becomes_ready(&second_telemetry, "the member that joined");
    assert_becomes_ready(&first_telemetry, "the first member after the rebalance");
    let (events, _) = fleet(12, 0.0, 9);
    cluster.produce(&events);
    cluster.assert_committed(events.len(), "after the rebalance");
    let (a, b) = (first.stop(), second.stop());
    assert_eq!(a.events + b.events, events.len() as u64, "every event once");
    assert!(
        a.events > 0 && b.events > 0,
        "both members consumed: {} and {}",
        a.events,
        b.events
    );
}

#[test]
fn an_offset_commit_the_coordinator_refused_is_sent_again_once_it_takes_them() {
    // While a group rebalances, its coordinator refuses offset commits; a partition quiet
    // after that kept the group's offset (what lag dashboards and a restart read) where it
    // was, until its next event.
    let (cluster, telemetry, running) = a_ready_member("before the commits are refused");
    let refused = RDKafkaRespErr::RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS;
    cluster
        .broker
        .fail_requests(ApiKey::OffsetCommit, refused, 100_000);
    let commits_before = telemetry.metrics.commit_duration.get_sample_count();
    let (events, _) = fleet(12, 0.0, 11);
    cluster.produce(&events);
    assert!(
        eventually(Duration::from_secs(30), || consumed_total(&telemetry)
            == events.len() as u64),
        "applied {} of {} events",
        consumed_total(&telemetry),
        events.len()
    );
    // Every batch has sent its commit once none has been sent for a second (each is sent
    // within a batch's wait of its events); the refusals are the mock's answers to them.
    let commits = || telemetry.metrics.commit_duration.get_sample_count();
    let (mut seen, mut since) = (commits(), std::time::Instant::now());
    assert!(
        eventually(Duration::from_secs(30), || {
            if commits() != seen {
                (seen, since) = (commits(), std::time::Instant::now());
            }
            seen > commits_before && since.elapsed() >= Duration::from_secs(1)
        }),
        "the batches' commits were not all sent: {seen} since the start, {commits_before} before"
    );
    cluster.assert_nothing_committed("while the coordinator refuses commits");
    cluster.broker.clear_request_failures(ApiKey::OffsetCommit);
    // No event comes after: only sending the refused offsets again commits them.
    cluster.assert_committed(events.len(), "once the coordinator takes commits again");
    assert_eq!(running.stop().events, events.len() as u64);
}

/// The coordinator of `cluster` answers every group request (heartbeats, joins, syncs)
/// as a broker answers a static member whose id another member joined with, until
/// `thread` (the member) ends, within 30 s: its error. (Every request, not one
/// heartbeat: librdkafka drops a heartbeat's answer that comes while its member
/// rejoins, and on a busy machine a group of short sessions rejoins often.)
fn fence<T: std::fmt::Debug>(
    cluster: &Cluster,
    thread: JoinHandle<Result<T, PipelineError>>,
    what: &str,
) -> PipelineError {
    let fenced = RDKafkaRespErr::RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID;
    let group_requests = [ApiKey::Heartbeat, ApiKey::JoinGroup, ApiKey::SyncGroup];
    for api in group_requests {
        cluster.broker.fail_requests(api, fenced, 100_000);
    }
    let ended = eventually(Duration::from_secs(30), || thread.is_finished());
    for api in group_requests {
        cluster.broker.clear_request_failures(api);
    }
    assert!(ended, "{what} runs on");
    thread.join().unwrap().expect_err("a fence is an error")
}

/// That `error` says the member `member` of `group` was fenced, and what to do about it.
fn assert_fenced(error: PipelineError, group: &str, member: impl Fn(&str) -> bool) {
    let said = error.to_string();
    match error {
        PipelineError::Fenced {
            group: g,
            member: m,
        } => {
            assert_eq!(g, group);
            assert!(member(&m), "the member named: {m}");
        }
        other => panic!("not a fence: {other}"),
    }
    assert!(said.contains("kafka.instance_id"), "no remedy: {said}");
}

#[test]
fn a_static_member_fenced_by_another_with_its_id_stops_the_process_and_its_restart_loses_nothing() {
    // Two instances given one `kafka.instance_id`, or an old pod still running when its
    // replacement joined: the broker fences the member whose id the other took, and its
    // partitions are the other's from then on. It logged a warning and polled on, ready,
    // and (on this mock cluster, which takes any member's fetches and commits) went on
    // consuming what the other member owns.
    let cluster = Cluster::start();
    let env = [
        ("LOOPWARDEN_KAFKA__INSTANCE_ID", "pod-a"),
        ("LOOPWARDEN_KAFKA__WORKERS", "2"),
    ];
    let config = cluster.config_with_env("a", "", &env);
    let (events, want) = looping_fleet(&config, 60, 13, 5);
    let telemetry = Arc::new(Telemetry::new());
    let running = Running::observed(config.clone(), cluster.brokers(), telemetry.clone());
    assert_becomes_ready(&telemetry, "before the fence");
    let pace = Pace {
        delay: Duration::ZERO,
        chunks: 30,
        pause: Duration::from_millis(100),
    };
    let feeder = feed_paced(
        &cluster.brokers(),
        cluster.topics.input.clone(),
        events.clone(),
        pace,
    );
    // Fenced while the feed flows, once the group has committed some of it: the
    // coordinator answers one worker's heartbeat as a broker answers a static member
    // whose id another member joined with.
    let (brokers, group, input) = (
        cluster.brokers(),
        cluster.group.clone(),
        cluster.topics.input.clone(),
    );
    assert!(
        eventually(Duration::from_secs(30), || committed_sum(
            &brokers, &group, &input
        ) > 0),
        "nothing committed before the fence"
    );
    let error = fence(&cluster, running.thread, "a fenced member");
    // One worker fenced stops the process: its other worker with it.
    assert_fenced(error, &cluster.group, |m| m == "pod-a-0" || m == "pod-a-1");
    let fenced_at = committed_sum(&brokers, &group, &input);
    assert!(
        (fenced_at as usize) < events.len(),
        "the feed ended before the fence"
    );

    // Restarted on its disk, it applies the rest (a copy of a termination, of a batch the
    // fence left open and read again, shares its `event_id`).
    feeder.join().unwrap();
    a_restart_applies_every_event(&cluster, config, events.len(), &want);
}

/// Instance `config` of `cluster`, restarted on its disk, applies every one of the
/// `events` produced (the group commits them all), and every termination replay finds
/// (`want`) is on the bus.
fn a_restart_applies_every_event(
    cluster: &Cluster,
    config: Arc<Config>,
    events: usize,
    want: &BTreeSet<String>,
) {
    let again = Running::start(config, cluster.brokers());
    cluster.assert_committed(events, "after the restart");
    let terminated = cluster.read(&cluster.topics.terminated, want.len());
    again.stop();
    let got: BTreeSet<String> = event_ids(&terminated).into_iter().collect();
    assert_eq!(&got, want, "terminations differ from replay");
}

#[test]
fn a_producer_failed_fatally_stops_the_process_and_its_restart_loses_nothing() {
    // An idempotent producer whose first request in flight the broker answers "out of
    // order sequence" has lost its sequence with the broker: librdkafka fails it fatally,
    // and every record fails from then on. The outbox sent them again each second for
    // ever, ready, committing nothing.
    let cluster = Cluster::start();
    let config = cluster.config("a", "");
    let (events, want) = looping_fleet(&config, 30, 17, 3);
    cluster.produce(&events);
    // Armed after the test's own produce: the run's first produce request takes it.
    let out_of_order = RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER;
    cluster
        .broker
        .fail_requests(ApiKey::Produce, out_of_order, 1);
    let running = Running::start(config.clone(), cluster.brokers());
    assert!(
        eventually(Duration::from_secs(30), || running.thread.is_finished()),
        "a run whose producer failed fatally runs on"
    );
    match running.thread.join().unwrap() {
        Err(PipelineError::ProducerFatal {
            reason,
            undelivered,
        }) => {
            assert!(reason.contains("sequence"), "{reason}");
            assert!(undelivered > 0);
        }
        other => panic!("not a producer's fatal error: {other:?}"),
    }
    cluster.assert_nothing_committed("once the producer failed");

    // Restarted on its disk (a new producer), it applies every event.
    a_restart_applies_every_event(&cluster, config, events.len(), &want);
}

#[test]
fn an_event_stamped_a_day_ahead_closes_no_other_session_of_its_partition() {
    // One event of a producer whose clock runs a day ahead: taken as stamped, it moved
    // its partition's clock a day, and every other session there closed as idle.
    let cluster = Cluster::start();
    let config = cluster.config(
        "a",
        "[engine]\nsession_gap_secs = 60\nfuture_grace_secs = 5\n",
    );
    let now = loopwarden::contract::event::wall_ms();
    let event = |session: &str, i: i64, at: i64| -> Vec<u8> {
        serde_json::json!({
            "type": "tool.called", "session_id": session, "event_id": format!("{session}-{i}"),
            "timestamp": loopwarden::contract::event::format_rfc3339_ms(at),
            "tool": "read", "args": {"path": format!("f{i}")}, "result": format!("line {i}"),
        })
        .to_string()
        .into_bytes()
    };
    // Twelve sessions over the 3 partitions: the one ahead shares its partition with some.
    let steady: Vec<String> = (0..12).map(|s| format!("steady-{s}")).collect();
    let round = |i: i64| steady.iter().map(move |s| event(s, i, now + i * 100));
    let mut events: Vec<Vec<u8>> = (0..3).flat_map(round).collect();
    events.push(event("ahead", 0, now + 24 * 3600 * 1000));
    events.extend((3..6).flat_map(round));
    cluster.produce(&events);
    // Without steady sessions beside the one ahead there would be nothing to close.
    use rdkafka::Message as _;
    let input = cluster.read(&cluster.topics.input, events.len());
    let partition_of = |session: &str| {
        let on = input.iter().find(|m| json(m)["session_id"] == session);
        on.map(|m| m.partition())
    };
    let beside = steady
        .iter()
        .filter(|s| partition_of(s) == partition_of("ahead"))
        .count();
    assert!(
        beside > 0,
        "no steady session on the partition of the one ahead"
    );
    let (telemetry, stats) = cluster.run_until_committed(config, events.len());
    assert_eq!(stats.events, events.len() as u64);
    let summaries = read_topic(
        &cluster.brokers(),
        &cluster.topics.summary,
        0,
        Duration::from_secs(5),
        Duration::from_secs(1),
    );
    let closed: Vec<String> = summaries
        .iter()
        .map(|m| format!("{} {}", json(m)["session_id"], json(m)["stop_reason"]))
        .collect();
    assert_eq!(closed, Vec::<String>::new(), "no session closed");
    assert_eq!(telemetry.metrics.future_events.get(), 1);
    assert_eq!(telemetry.metrics.late_events.get(), 0);
}

#[test]
fn a_straggler_after_a_completion_opens_no_session_even_on_the_instance_taking_over() {
    // The gateway's last cost record reaches the bus after the runtime's completion
    // (stamped before it), once on the instance that closed the session and once on one
    // that took its partitions over from the changelog on an empty disk. Opened as a
    // session, each was summarised again as idle a session gap later.
    let cluster = Cluster::start();
    let extra = "";
    let now = loopwarden::contract::event::wall_ms();
    let event = |session: &str, id: &str, kind: &str, at: i64| -> Vec<u8> {
        let mut e = serde_json::json!({
            "type": kind, "session_id": session, "event_id": id,
            "timestamp": loopwarden::contract::event::format_rfc3339_ms(at),
        });
        match kind {
            "tool.called" => e["tool"] = "read".into(),
            "cost.attributed" => {
                e["input_tokens"] = 10.into();
                e["output_tokens"] = 5.into();
            }
            _ => e["outcome"] = "success".into(),
        }
        e.to_string().into_bytes()
    };
    let session = |s: &str| {
        vec![
            event(s, &format!("{s}-1"), "tool.called", now),
            event(s, &format!("{s}-2"), "session.completed", now + 2),
        ]
    };
    let straggler = |s: &str| event(s, &format!("{s}-cost"), "cost.attributed", now + 1);
    let (a, b) = (cluster.config("a", extra), cluster.config("b", extra));
    let mut first: Vec<Vec<u8>> = session("x");
    first.extend(session("y"));
    first.push(straggler("x"));
    // z stays open: the changelog has a session to restore whatever else it holds.
    first.push(event("z", "z-1", "tool.called", now));
    cluster.produce(&first);
    let (telemetry, stats) = cluster.run_until_committed(a, first.len());
    assert_eq!(stats.events, first.len() as u64);
    assert_eq!(telemetry.metrics.events_after_completion.get(), 1);
    // B, same group, empty disk: y's marker comes back with the changelog.
    cluster.produce(&[straggler("y")]);
    // B applies y's straggler.
    let (telemetry, stats) = cluster.run_until_committed(b, first.len() + 1);
    assert!(stats.restored_records > 0, "restored from the changelog");
    assert_eq!(
        telemetry.metrics.events_after_completion.get(),
        1,
        "y's straggler"
    );
    let summaries: Vec<String> = cluster
        .read(&cluster.topics.summary, 2)
        .iter()
        .map(|m| format!("{} {}", json(m)["session_id"], json(m)["closed_by"]))
        .collect();
    let mut summaries = summaries;
    summaries.sort();
    assert_eq!(
        summaries,
        ["\"x\" \"completed\"", "\"y\" \"completed\""],
        "one summary a session"
    );
}

#[test]
fn bad_messages_are_dead_lettered_with_their_reason() {
    let cluster = Cluster::start();
    let config = cluster.config("a", "");
    let bad = vec![
        b"{not json".to_vec(),
        br#"{"type":"tool.called","session_id":"s-1"}"#.to_vec(),
    ];
    let (events, _) = fleet(5, 0.0, 2);
    cluster.produce(&bad);
    cluster.produce(&events);
    let running = Running::start(config, cluster.brokers());
    let dead = cluster.read(&cluster.topics.dlq, 2);
    let summaries = cluster.read(&cluster.topics.summary, 5);
    let stats = running.stop();
    assert_eq!(stats.dead_lettered, 2);
    assert_eq!(summaries.len(), 5, "the partitions flowed on");
    let reasons: BTreeSet<String> = dead
        .iter()
        .map(|m| header(m, "loopwarden.error.reason").unwrap())
        .collect();
    assert_eq!(
        reasons,
        BTreeSet::from(["invalid_json".to_string(), "missing_field".to_string()])
    );
    for m in &dead {
        assert_eq!(
            header(m, "loopwarden.source.topic").as_deref(),
            Some(cluster.topics.input.as_str())
        );
        assert!(header(m, "loopwarden.error.message").is_some());
    }
}

/// A header whose name is not UTF-8 (any producer may write raw bytes there; rdkafka's
/// own header reader panics on it) on a bad message and on every event: the events are
/// applied, the bad one is dead-lettered with its headers, and the partitions flow on.
#[test]
fn a_header_name_that_is_not_utf8_stops_nothing() {
    use loopwarden::bus::kafka::headers::with_raw_name;
    use rdkafka::message::OwnedHeaders;
    use rdkafka::producer::BaseRecord;
    let cluster = Cluster::start();
    let config = cluster.config("a", "");
    let (events, _) = fleet(3, 0.0, 2);
    let bad = b"{not json".to_vec();
    let producer = producer(&cluster.brokers());
    for payload in std::iter::once(&bad).chain(&events) {
        let headers = with_raw_name(OwnedHeaders::new(), b"\xffname", b"v");
        let key = session_of(payload);
        let record = BaseRecord::to(&cluster.topics.input)
            .payload(payload)
            .key(&key)
            .headers(headers);
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    flush(&producer);
    let running = Running::start(config, cluster.brokers());
    let dead = cluster.read(&cluster.topics.dlq, 1);
    let summaries = cluster.read(&cluster.topics.summary, 3);
    let stats = running.stop();
    assert_eq!(stats.dead_lettered, 1);
    assert_eq!(summaries.len(), 3, "the partitions flowed on");
    assert_eq!(
        header(&dead[0], "loopwarden.error.reason").as_deref(),
        Some("invalid_json")
    );
    // The source's header, its bad byte as U+FFFD (a produced name is UTF-8).
    assert_eq!(header(&dead[0], "\u{fffd}name").as_deref(), Some("v"));
}

/// One OTLP protobuf export of `spans`, all in one trace.
fn export(spans: Vec<opentelemetry_proto::tonic::trace::v1::Span>) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
    use prost::Message as _;
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
    .encode_to_vec()
}

/// A GenAI `execute_tool` span of `session` whose captured result is `result`.
fn tool_span(id: u8, session: &str, result: &str) -> opentelemetry_proto::tonic::trace::v1::Span {
    use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
    let kv = |k: &str, v: &str| KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
    };
    opentelemetry_proto::tonic::trace::v1::Span {
        trace_id: vec![9; 16],
        span_id: vec![id; 8],
        name: "execute_tool read".into(),
        start_time_unix_nano: 1_700_000_000_000_000_000,
        end_time_unix_nano: 1_700_000_000_100_000_000,
        attributes: vec![
            kv("gen_ai.operation.name", "execute_tool"),
            kv("gen_ai.conversation.id", session),
            kv("gen_ai.tool.name", "read"),
            kv("gen_ai.tool.call.arguments", r#"{"path":"a.txt"}"#),
            kv("gen_ai.tool.call.result", result),
        ],
        ..Default::default()
    }
}

/// The OTLP ingest of `config` on a thread of its own, stopped by the shutdown returned.
fn spawn_ingest(
    config: &Arc<Config>,
    cluster: &Cluster,
) -> (
    Shutdown,
    JoinHandle<Result<loopwarden::bus::pipeline::IngestStats, PipelineError>>,
) {
    let shutdown = Shutdown::new();
    let (config, brokers, stop) = (config.clone(), cluster.brokers(), shutdown.clone());
    let ingest = config.ingest.clone().expect("ingest on");
    let telemetry = Arc::new(loopwarden::telemetry::Telemetry::new());
    let thread = std::thread::spawn(move || {
        loopwarden::bus::pipeline::run_ingest(config, ingest, &brokers, stop, telemetry)
    });
    (shutdown, thread)
}

/// The sum of `group`'s committed offsets on `topic` (offsets from 0: one a message
/// committed).
fn committed_sum(brokers: &str, group: &str, topic: &str) -> i64 {
    committed_offsets(brokers, group, topic)
        .into_iter()
        .flatten()
        .sum()
}

/// [`committed_sum`] once it reaches `messages` or `within` passes (read every 100 ms).
fn committed_reaching(
    brokers: &str,
    group: &str,
    topic: &str,
    messages: usize,
    within: Duration,
) -> i64 {
    let deadline = std::time::Instant::now() + within;
    loop {
        let committed = committed_sum(brokers, group, topic);
        if committed >= messages as i64 || std::time::Instant::now() > deadline {
            return committed;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_otlp_ingest_commit_the_coordinator_refused_is_sent_again_once_it_takes_them() {
    // A trace partition quiet after a refused commit kept the ingest group's offset
    // behind: a restart would map its spans again, after their sessions closed.
    let cluster = Cluster::start();
    let traces = unique("traces");
    cluster.broker.create_topic(&traces, 2).unwrap();
    let config = cluster.config("a", &format!("[ingest.otlp]\ntopics = [\"{traces}\"]\n"));
    let group = config.ingest.as_ref().expect("ingest on").group_id.clone();
    let (shutdown, ingest) = spawn_ingest(&config, &cluster);
    let exports = |from: u8, to: u8| -> Vec<Vec<u8>> {
        (from..to)
            .map(|i| export(vec![tool_span(i, &format!("sess-{i}"), "fine")]))
            .collect()
    };
    produce(&cluster.brokers(), &traces, &exports(1, 3), &[]);
    cluster.read(&cluster.topics.input, 2);
    let (brokers, within) = (cluster.brokers(), Duration::from_secs(20));
    assert_eq!(
        committed_reaching(&brokers, &group, &traces, 2, within),
        2,
        "committed before the coordinator refuses"
    );
    let refused = RDKafkaRespErr::RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS;
    cluster
        .broker
        .fail_requests(ApiKey::OffsetCommit, refused, 100_000);
    produce(&cluster.brokers(), &traces, &exports(3, 9), &[]);
    cluster.read(&cluster.topics.input, 8);
    // The batch's commit follows its delivery at once, and one sending again a second
    // later: both refused.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        committed_sum(&brokers, &group, &traces),
        2,
        "nothing more committed while the coordinator refuses"
    );
    cluster.broker.clear_request_failures(ApiKey::OffsetCommit);
    // No message comes after: only sending the refused offsets again commits them.
    assert_eq!(
        committed_reaching(&brokers, &group, &traces, 8, within),
        8,
        "every message committed once the coordinator takes commits again"
    );
    shutdown.trigger();
    let stats = ingest.join().unwrap().unwrap();
    assert_eq!((stats.messages, stats.events), (8, 8));
}

#[test]
fn an_otlp_ingest_fenced_by_a_member_with_its_id_stops_the_process() {
    let cluster = Cluster::start();
    let traces = unique("traces");
    cluster.broker.create_topic(&traces, 2).unwrap();
    let ingest = format!("[ingest.otlp]\ntopics = [\"{traces}\"]\n");
    let env = [("LOOPWARDEN_KAFKA__INSTANCE_ID", "pod-a")];
    let config = cluster.config_with_env("a", &ingest, &env);
    let group = config.ingest.as_ref().expect("ingest on").group_id.clone();
    let (shutdown, ingest) = spawn_ingest(&config, &cluster);
    let export = export(vec![tool_span(1, "sess-1", "fine")]);
    produce(&cluster.brokers(), &traces, &[export], &[]);
    cluster.read(&cluster.topics.input, 1);
    let error = fence(&cluster, ingest, "a fenced ingest");
    assert_fenced(error, &group, |m| m == "pod-a");
    assert!(shutdown.is_triggered(), "the workers beside it run on");
}

#[test]
fn the_otlp_ingest_republishes_by_session_and_dead_letters_what_the_engine_would_refuse() {
    let cluster = Cluster::start();
    let traces = unique("traces");
    cluster.broker.create_topic(&traces, 2).unwrap();
    let config = cluster.config(
        "a",
        &format!("[engine]\nmax_event_bytes = 4096\n[ingest.otlp]\ntopics = [\"{traces}\"]\n"),
    );
    let long_session = "s".repeat(300);
    let messages = vec![
        export(vec![
            tool_span(1, "sess-ok", "fine"),
            tool_span(2, "sess-ok", &"x".repeat(5_000)),
            tool_span(3, &long_session, "fine"),
        ]),
        b"\x0a\xff\xff garbage".to_vec(),
        Vec::new(),
    ];
    produce(&cluster.brokers(), &traces, &messages, &[]);
    let (shutdown, ingest) = spawn_ingest(&config, &cluster);
    let dead = cluster.read(&cluster.topics.dlq, 4);
    let events = cluster.read(&cluster.topics.input, 1);
    shutdown.trigger();
    let stats = ingest.join().unwrap().unwrap();
    assert_eq!(
        (stats.messages, stats.events, stats.dead_lettered),
        (3, 1, 4)
    );
    assert_eq!(events.len(), 1);
    let event = json(&events[0]);
    assert_eq!(event["session_id"], "sess-ok");
    assert_eq!(event["event_id"], "0101010101010101");
    use rdkafka::Message as _;
    assert_eq!(events[0].key(), Some(&b"sess-ok"[..]), "keyed by session");
    assert_eq!(
        header(&events[0], "traceparent").unwrap(),
        format!("00-{}-{}-01", "09".repeat(16), "01".repeat(8))
    );
    let mut reasons: Vec<String> = dead
        .iter()
        .map(|m| header(m, "loopwarden.error.reason").unwrap())
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        ["invalid_otlp", "invalid_otlp", "invalid_value", "oversized"]
    );
    for m in &dead {
        assert_eq!(
            header(m, "loopwarden.source.topic").as_deref(),
            Some(traces.as_str())
        );
        let why = header(m, "loopwarden.error.message").unwrap();
        match header(m, "loopwarden.error.reason").unwrap().as_str() {
            "oversized" => assert!(why.contains("span 0202020202020202"), "{why}"),
            "invalid_value" => assert!(why.contains("session_id"), "{why}"),
            _ => assert!(why.contains("not an OTLP"), "{why}"),
        }
    }
}

#[test]
fn two_tenants_sessions_under_one_id_are_counted_as_such() {
    // Ids unique per tenant only: the two sessions are judged as one (each one's verdicts
    // reach the other's agent), which the bus cannot mend, but the operator is told.
    let cluster = Cluster::start();
    let config = cluster.config("a", "");
    let now = loopwarden::contract::event::wall_ms();
    let event = |session: &str, tenant: Option<&str>, i: i64| -> Vec<u8> {
        let mut e = serde_json::json!({
            "type": "tool.called", "session_id": session, "event_id": format!("{session}-{i}"),
            "timestamp": loopwarden::contract::event::format_rfc3339_ms(now + i * 100),
            "tool": "read", "args": {"path": format!("f{i}")}, "result": format!("line {i}"),
        });
        if let Some(t) = tenant {
            e["tenant"] = t.into();
        }
        e.to_string().into_bytes()
    };
    let tenants = ["acme", "globex"];
    let mut events: Vec<Vec<u8>> = (0..6)
        .map(|i| event("1", Some(tenants[i % 2]), i as i64))
        .collect();
    // A session whose first events name no tenant, then one: no other tenant.
    events.extend((0..4).map(|i| event("2", (i > 1).then_some("acme"), i)));
    cluster.produce(&events);
    let (telemetry, stats) = cluster.run_until_committed(config, events.len());
    assert_eq!(stats.events, events.len() as u64);
    assert_eq!(
        telemetry.metrics.other_tenant_events.get(),
        5,
        "each turn after the first"
    );
}

#[test]
fn a_terminated_session_that_goes_on_is_counted() {
    // A runtime whose kill path did not act: the session's events after its termination
    // are dropped, and the session counted so that the operator sees the loop go on;
    // one whose runtime stopped it (a call in flight, then its completion) is not.
    let cluster = Cluster::start();
    let config = cluster.config("a", "");
    let now = loopwarden::contract::event::wall_ms();
    let call = |session: &str, i: i64| -> Vec<u8> {
        serde_json::json!({
            "type": "tool.called", "session_id": session, "event_id": format!("{session}-{i}"),
            "timestamp": loopwarden::contract::event::format_rfc3339_ms(now + i * 100),
            "tool": "run_tests", "args": {"path": "tests/"}, "result": "1 failed",
        })
        .to_string()
        .into_bytes()
    };
    // 30 identical calls: terminated well before the last; and 12, then a completion.
    let mut events: Vec<Vec<u8>> = (0..30).map(|i| call("looping", i)).collect();
    events.extend((0..12).map(|i| call("stopped", i)));
    events.push(
        serde_json::json!({
            "type": "session.completed", "session_id": "stopped", "event_id": "stopped-done",
            "timestamp": loopwarden::contract::event::format_rfc3339_ms(now + 1200),
            "stop_reason": "cancelled",
        })
        .to_string()
        .into_bytes(),
    );
    cluster.produce(&events);
    let (telemetry, stats) = cluster.run_until_committed(config, events.len());
    assert_eq!(stats.events, events.len() as u64);
    let terminations: Vec<serde_json::Value> = (cluster.read(&cluster.topics.terminated, 1))
        .iter()
        .map(|m| serde_json::from_slice(rdkafka::Message::payload(m).unwrap()).unwrap())
        .collect();
    let trigger = |session: &str| -> i64 {
        let t = terminations.iter().find(|t| t["session_id"] == session);
        let id = t.unwrap_or_else(|| panic!("{session} terminated: {terminations:?}"));
        id["trigger"]["event_id"].as_str().unwrap()[session.len() + 1..]
            .parse()
            .unwrap()
    };
    let (looping, stopped) = (trigger("looping"), trigger("stopped"));
    assert!(looping < 20, "looping terminated at its {looping}th call");
    assert!(
        11 - stopped < 8,
        "stopped terminated at its {stopped}th call"
    );
    assert_eq!(
        telemetry.metrics.sessions_unstopped.get(),
        1,
        "the session that went on, not the one that stopped"
    );
}

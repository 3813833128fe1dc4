//! Helpers for the tests that talk to a real Kafka-protocol broker (Tansu, started by
//! `scripts/broker`, or the one named by LOOPWARDEN_TEST_BROKERS).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use loopwarden::config::Config;
use loopwarden::contract::event::parse_event;
use loopwarden::contract::output::ClosedBy;
use loopwarden::engine::{Engine, EventMeta};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// The broker address, starting Tansu through `scripts/broker` when none is given.
pub fn broker() -> String {
    static BROKER: OnceLock<String> = OnceLock::new();
    BROKER
        .get_or_init(|| {
            if let Ok(b) = std::env::var("LOOPWARDEN_TEST_BROKERS") {
                return b;
            }
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/broker");
            let status = Command::new(&script)
                .arg("start")
                .status()
                .expect("run scripts/broker");
            assert!(status.success(), "scripts/broker start failed");
            let port = std::env::var("LOOPWARDEN_BROKER_PORT").unwrap_or_else(|_| "19092".into());
            format!("127.0.0.1:{port}")
        })
        .clone()
}

/// Where `scripts/broker` installs Tansu and keeps each port's pid and log file.
pub fn broker_dir() -> String {
    std::env::var("LOOPWARDEN_BROKER_DIR")
        .unwrap_or_else(|_| format!("{}/.cache/loopwarden/tansu", std::env::var("HOME").unwrap()))
}

/// Where `scripts/broker` keeps the pid of the broker it started on `port`.
pub fn pid_file(port: u16) -> String {
    format!("{}/tansu-{port}.pid", broker_dir())
}

/// Where the broker `scripts/broker` started on `port` writes its log.
pub fn log_file(port: u16) -> String {
    format!("{}/tansu-{port}.log", broker_dir())
}

/// A broker of the test's own on a free port (for tests that pause or stop it), with
/// the pid to signal. Stops it when dropped.
pub struct OwnBroker {
    pub address: String,
    pub pid: u32,
    port: u16,
}

impl OwnBroker {
    /// Starts a broker on a port free now: a fixed port would reach whatever an earlier
    /// run left listening there (`scripts/broker start` leaves a listener alone), and the
    /// test would pause or stop a broker that is not its own. The broker stops once this
    /// process is gone, dropped or not (a killed test run leaves none behind).
    pub fn start() -> OwnBroker {
        OwnBroker::start_owned_by(std::process::id())
    }

    /// [`OwnBroker::start`], the broker stopped once process `owner` is gone.
    pub fn start_owned_by(owner: u32) -> OwnBroker {
        let port = free_port();
        // A pid file an earlier, killed run left for this port would name a process that
        // is not this broker.
        let _ = std::fs::remove_file(pid_file(port));
        OwnBroker::launch(port, Some(owner))
    }

    /// Starts a broker on `port`, or takes the one listening there (the soak's second
    /// run reads what its first left on it, so it outlives this process until dropped).
    pub fn start_on(port: u16) -> OwnBroker {
        OwnBroker::launch(port, None)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn launch(port: u16, owner: Option<u32>) -> OwnBroker {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/broker");
        let mut start = Command::new(&script);
        start
            .arg("start")
            .env("LOOPWARDEN_BROKER_PORT", port.to_string());
        match owner {
            Some(owner) => start.env("LOOPWARDEN_BROKER_OWNER", owner.to_string()),
            None => start.env_remove("LOOPWARDEN_BROKER_OWNER"),
        };
        let status = start.status().expect("run scripts/broker");
        assert!(status.success(), "scripts/broker start on {port} failed");
        let pid = std::fs::read_to_string(pid_file(port))
            .expect("the broker's pid file")
            .trim()
            .parse()
            .unwrap();
        OwnBroker {
            address: format!("127.0.0.1:{port}"),
            pid,
            port,
        }
    }

    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([signal, &self.pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {signal} {}", self.pid);
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.pid.to_string()])
            .status();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/broker");
        let _ = Command::new(&script)
            .arg("stop")
            .env("LOOPWARDEN_BROKER_PORT", self.port.to_string())
            .status();
        // `stop` keeps a port's log (CI's shared broker's is worth reading after a
        // failure); a test's own broker's is not kept.
        let _ = std::fs::remove_file(log_file(self.port));
    }
}

/// A name no other test (or earlier run against the same broker) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

pub fn create_topics(brokers: &str, topics: &[(&str, i32)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|(t, p)| NewTopic::new(t, *p, TopicReplication::Fixed(1)))
        .collect();
    let results = block_on(admin.create_topics(&new, &AdminOptions::new())).unwrap();
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
    }
}

/// A topic's configuration value `name`, as the broker describes it.
pub fn topic_config(brokers: &str, topic: &str, name: &str) -> Option<String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let specifier = rdkafka::admin::ResourceSpecifier::Topic(topic);
    let results = block_on(admin.describe_configs(&[specifier], &AdminOptions::new())).unwrap();
    let resource = results.into_iter().next()?.ok()?;
    resource.get(name).and_then(|e| e.value.clone())
}

/// The topics of one pipeline under test.
#[derive(Clone, Debug)]
pub struct Topics {
    pub input: String,
    pub warning: String,
    pub terminated: String,
    pub summary: String,
    pub dlq: String,
    /// Created by `run` itself (compacted, as many partitions as the input).
    pub changelog: String,
}

impl Topics {
    /// Fresh names (nothing created).
    pub fn named() -> Topics {
        Topics::of(&unique("t"))
    }

    /// The topics of the run whose names start with `base` (`t-…`).
    pub fn of(base: &str) -> Topics {
        Topics {
            input: format!("{base}.in"),
            warning: format!("{base}.warning"),
            terminated: format!("{base}.terminated"),
            summary: format!("{base}.summary"),
            dlq: format!("{base}.dlq"),
            changelog: format!("{base}.changelog"),
        }
    }

    /// (topic, partitions): the input with `partitions`, each output with one.
    pub fn layout(&self, partitions: i32) -> Vec<(&str, i32)> {
        vec![
            (&self.input, partitions),
            (&self.warning, 1),
            (&self.terminated, 1),
            (&self.summary, 1),
            (&self.dlq, 1),
        ]
    }

    /// Fresh topics created on `brokers` with the admin API.
    pub fn create(brokers: &str, partitions: i32) -> Topics {
        let t = Topics::named();
        create_topics(brokers, &t.layout(partitions));
        t
    }
}

/// A config file for `loopwarden run` against `brokers`, with `extra` TOML appended.
pub fn write_config(dir: &Path, brokers: &str, topics: &Topics, extra: &str) -> PathBuf {
    let path = dir.join("loopwarden.toml");
    let text = format!(
        r#"
[state]
path = "{state}"

[telemetry]
# Any free port: tests run many instances at once (the address is logged).
http_listen = "127.0.0.1:0"

[kafka]
brokers = "{brokers}"
group_id = "{group}"
input_topics = ["{input}"]
warning_topic = "{warning}"
terminated_topic = "{terminated}"
summary_topic = "{summary}"
dlq_topic = "{dlq}"
changelog_topic = "{changelog}"
shutdown_deadline_secs = 20
retry_backoff_max_ms = 1000

[kafka.consumer]
"session.timeout.ms" = 2000
"heartbeat.interval.ms" = 200
{extra}
"#,
        state = dir.join("state").display(),
        group = unique("g"),
        input = topics.input,
        warning = topics.warning,
        terminated = topics.terminated,
        summary = topics.summary,
        dlq = topics.dlq,
        changelog = topics.changelog,
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// What most pipeline tests start from: fresh topics on the broker, a state directory
/// and a config naming them.
pub struct Fixture {
    pub brokers: String,
    pub topics: Topics,
    pub dir: tempfile::TempDir,
    pub cfg: PathBuf,
}

/// Fresh topics (`partitions` input partitions) and a config with `extra` TOML appended.
pub fn fixture(partitions: i32, extra: &str) -> Fixture {
    fixture_on(broker(), partitions, extra)
}

/// [`fixture`] on a given broker.
pub fn fixture_on(brokers: String, partitions: i32, extra: &str) -> Fixture {
    let topics = Topics::create(&brokers, partitions);
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &brokers, &topics, extra);
    Fixture {
        brokers,
        topics,
        dir,
        cfg,
    }
}

impl Fixture {
    /// Another instance of the same deployment (same group and topics) with a state
    /// directory of its own under `dir/name`: its config and log paths.
    pub fn instance(&self, name: &str) -> (PathBuf, PathBuf) {
        let home = self.dir.path().join(name);
        std::fs::create_dir_all(&home).unwrap();
        let own_state = home.join("state").display().to_string();
        let text = std::fs::read_to_string(&self.cfg).unwrap().replace(
            &self.dir.path().join("state").display().to_string(),
            &own_state,
        );
        let cfg = home.join("loopwarden.toml");
        std::fs::write(&cfg, text).unwrap();
        (cfg, home.join("run.log"))
    }
}

/// A `loopwarden run` child process.
pub struct Running {
    pub child: Child,
    pub log: PathBuf,
}

pub fn spawn_run(config: &Path, log: &Path) -> Running {
    spawn_run_with_env(config, log, &[])
}

/// `loopwarden run` with extra environment (e.g. LOOPWARDEN_* overrides).
pub fn spawn_run_with_env(config: &Path, log: &Path, env: &[(&str, &str)]) -> Running {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_loopwarden"))
        .args(["run", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .unwrap();
    Running {
        child,
        log: log.to_path_buf(),
    }
}

/// A run a failing test leaves behind is killed, not left consuming.
impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Running {
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then waits (up to `limit`) for the exit.
    pub fn terminate(mut self, limit: Duration) -> ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        wait_exit(&mut self, limit)
    }

    /// SIGTERM, and asserts a clean exit within 30 s (showing the log when not).
    pub fn stop_gracefully(self) {
        let log = self.log_text();
        let status = self.terminate(Duration::from_secs(30));
        assert!(status.success(), "exit {status} after SIGTERM; log:\n{log}");
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// How many times `text` appears in the log at `log` so far (0 before it exists).
pub fn log_count(log: &Path, text: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches(text)
        .count()
}

/// Asks `holds` every 20 ms until it answers true, for at most `within`; whether it did.
pub fn eventually(within: Duration, mut holds: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while !holds() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Waits until `text` appears `at_least` times in the log at `log`, for at most
/// `within`; whether it did.
pub fn log_reaches(log: &Path, text: &str, at_least: usize, within: Duration) -> bool {
    eventually(within, || log_count(log, text) >= at_least)
}

pub fn session_of(payload: &[u8]) -> Vec<u8> {
    serde_json::from_slice::<serde_json::Value>(payload)
        .ok()
        .and_then(|v| v["session_id"].as_str().map(|s| s.as_bytes().to_vec()))
        .unwrap_or_default()
}

/// Produces messages (key = session id when the payload has one), waiting for every ack.
pub fn produce(brokers: &str, topic: &str, payloads: &[Vec<u8>], headers: &[(&str, &str)]) {
    produce_with(&producer(brokers), topic, payloads, headers);
}

/// An idempotent producer for [`produce_with`] (one per feeding thread: a producer per
/// chunk would add its start-up to every chunk's time).
pub fn producer(brokers: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("message.max.bytes", "10000000")
        .create()
        .unwrap()
}

/// [`produce`] through `producer`: every payload keyed by its session, then flushed.
pub fn produce_with(
    producer: &BaseProducer,
    topic: &str,
    payloads: &[Vec<u8>],
    headers: &[(&str, &str)],
) {
    send_with(producer, topic, payloads, headers);
    flush(producer);
}

/// Hands every payload, keyed by its session, to `producer` (not flushed: see [`flush`]).
pub fn send_with(
    producer: &BaseProducer,
    topic: &str,
    payloads: &[Vec<u8>],
    headers: &[(&str, &str)],
) {
    for p in payloads {
        let key = session_of(p);
        let mut h = OwnedHeaders::new();
        for (k, v) in headers {
            h = h.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        let mut r = BaseRecord::to(topic).payload(p).key(&key).headers(h);
        loop {
            match producer.send(r) {
                Ok(()) => break,
                Err((_, back)) => {
                    producer.poll(Duration::from_millis(10));
                    r = back;
                }
            }
        }
    }
}

/// How a feeder thread spreads its events over time: it waits `delay`, then produces
/// them in about `chunks` chunks with `pause` after each.
#[derive(Clone, Copy)]
pub struct Pace {
    pub delay: Duration,
    pub chunks: usize,
    pub pause: Duration,
}

/// Produces `events` to `topic` on a thread of its own, at `pace`.
pub fn feed_paced(
    brokers: &str,
    topic: String,
    events: Vec<Vec<u8>>,
    pace: Pace,
) -> std::thread::JoinHandle<()> {
    let brokers = brokers.to_string();
    std::thread::spawn(move || {
        let producer = producer(&brokers);
        std::thread::sleep(pace.delay);
        for chunk in events.chunks(events.len() / pace.chunks + 1) {
            produce_with(&producer, &topic, chunk, &[]);
            std::thread::sleep(pace.pause);
        }
    })
}

/// Waits until `producer` has delivered everything handed to it.
pub fn flush(producer: &BaseProducer) {
    producer
        .flush(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("producing: {e}"));
}

/// A consumer assigned every partition of `topics` from the start (no group join, so it
/// reads at once); `read_committed` like the clients downstream.
pub fn reader(brokers: &str, topics: &[&str]) -> BaseConsumer {
    reader_isolated(brokers, topics, "read_committed")
}

/// The readers' `fetch.wait.max.ms` (5: the tests' topics are small, and Tansu holds a
/// fetch for its whole wait). A soak's topics are large: Tansu answers a fetch empty when
/// finding its records outlasts the wait, so it reads with more ([`set_reader_fetch_wait_ms`]).
pub static READER_FETCH_WAIT_MS: AtomicU32 = AtomicU32::new(5);

pub fn set_reader_fetch_wait_ms(ms: u32) {
    READER_FETCH_WAIT_MS.store(ms, Ordering::Relaxed);
}

/// [`reader`] with the given `isolation.level`.
pub fn reader_isolated(brokers: &str, topics: &[&str], isolation: &str) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .set(
            "fetch.wait.max.ms",
            READER_FETCH_WAIT_MS.load(Ordering::Relaxed).to_string(),
        )
        .set("isolation.level", isolation)
        // A request the broker never answers is sent again after this (librdkafka's
        // default is 60 s, most of a test's patience): a reader is a test's eyes, and a
        // reader that stalls fails a test of the pipeline.
        .set("socket.timeout.ms", "10000")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for topic in topics {
        let md = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .unwrap();
        for p in md.topics()[0].partitions() {
            tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
                .unwrap();
        }
    }
    consumer.assign(&tpl).unwrap();
    consumer
}

/// Every message of `topic` (all partitions, from the start) once at least `min` have
/// arrived or `limit` passed, then whatever else arrives within `quiet`.
pub fn read_topic(
    brokers: &str,
    topic: &str,
    min: usize,
    limit: Duration,
    quiet: Duration,
) -> Vec<OwnedMessage> {
    read_topic_until(brokers, topic, limit, quiet, |out| out.len() >= min)
}

/// Every message of `topic` (all partitions, from the start) once `done` holds for what
/// has arrived (or `limit` passed), then whatever else arrives within `quiet`.
pub fn read_topic_until(
    brokers: &str,
    topic: &str,
    limit: Duration,
    quiet: Duration,
    done: impl Fn(&[OwnedMessage]) -> bool,
) -> Vec<OwnedMessage> {
    drain(&reader(brokers, &[topic]), topic, limit, quiet, done)
}

/// [`read_topic`] with the usual patience: up to 60 s for `min` records, then until
/// 500 ms pass without another.
pub fn read_at_least(brokers: &str, topic: &str, min: usize) -> Vec<OwnedMessage> {
    read_topic(
        brokers,
        topic,
        min,
        Duration::from_secs(60),
        Duration::from_millis(500),
    )
}

/// [`read_topic`] including the records of open transactions (`read_uncommitted`).
pub fn read_topic_uncommitted(brokers: &str, topic: &str, quiet: Duration) -> Vec<OwnedMessage> {
    let consumer = reader_isolated(brokers, &[topic], "read_uncommitted");
    drain(&consumer, topic, quiet, quiet, |_| false)
}

fn drain(
    consumer: &BaseConsumer,
    topic: &str,
    limit: Duration,
    quiet: Duration,
    done: impl Fn(&[OwnedMessage]) -> bool,
) -> Vec<OwnedMessage> {
    let mut out = Vec::new();
    let until = Instant::now() + limit;
    let mut last = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                out.push(m.detach());
                last = Instant::now();
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
        if last.elapsed() >= quiet && done(&out) {
            break;
        }
        if Instant::now() > until {
            break;
        }
    }
    out
}

pub fn json(m: &OwnedMessage) -> serde_json::Value {
    serde_json::from_slice(m.payload().unwrap_or_default()).unwrap()
}

pub fn header(m: &OwnedMessage, name: &str) -> Option<String> {
    use rdkafka::message::Headers;
    m.headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// What `replay` finds in `events` (in this order): findings and summaries as JSON.
pub fn replay(config: Arc<Config>, events: &[Vec<u8>]) -> Vec<serde_json::Value> {
    let mut engine = Engine::new(config.clone());
    let mut out = Vec::new();
    for e in events {
        if let Ok(ev) = parse_event(e, &config.limits) {
            engine.process(&ev, &EventMeta::default(), &mut out);
        }
    }
    engine.close_all(ClosedBy::EndOfInput, &mut out);
    out.iter()
        .filter(|o| o.is_published())
        .map(|o| serde_json::from_str(&o.to_json()).unwrap())
        .collect()
}

/// The part of a finding that must not depend on how it was computed (not the trigger's
/// Kafka position, not `detected_at`).
pub fn finding_key(v: &serde_json::Value) -> String {
    format!(
        "{} {} {} {} {} {}",
        v["event_id"],
        v["type"],
        v["session_id"],
        v["detector"],
        v["level"],
        v["trigger"]["event_id"]
    )
}

/// Groups JSON outputs by `event_id`.
pub fn by_event_id(values: &[serde_json::Value]) -> BTreeMap<String, Vec<serde_json::Value>> {
    let mut m: BTreeMap<String, Vec<serde_json::Value>> = BTreeMap::new();
    for v in values {
        m.entry(v["event_id"].as_str().unwrap().to_string())
            .or_default()
            .push(v.clone());
    }
    m
}

/// A simulated fleet as raw events (synthetic clock), with its ground truth.
pub fn fleet(
    sessions: u64,
    loop_share: f64,
    seed: u64,
) -> (Vec<Vec<u8>>, Vec<loopwarden::tools::simulate::Truth>) {
    let mut f = loopwarden::tools::simulate::Fleet::new(loopwarden::tools::simulate::FleetSpec {
        sessions,
        concurrency: 40,
        loop_share,
        seed,
    });
    let mut events = Vec::new();
    let mut t = 1_763_000_000_000;
    while let Some(e) = f.next_event(t) {
        events.push(e.json);
        t += 20;
    }
    (events, f.truths().to_vec())
}

/// The consumer group's committed offset of each partition of `topic` (`None`: nothing
/// committed), read with the group's id from a client that never joins it.
pub fn committed_offsets(brokers: &str, group: &str, topic: &str) -> Vec<Option<i64>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in md.topics()[0].partitions() {
        tpl.add_partition(topic, p.id());
    }
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .unwrap();
    got.elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        })
        .collect()
}

/// Waits (up to `limit`) for a child to exit by itself.
pub fn wait_exit(run: &mut Running, limit: Duration) -> ExitStatus {
    let until = Instant::now() + limit;
    loop {
        if let Some(s) = run.child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > until {
            run.child.kill().unwrap();
            panic!("did not exit within {limit:?}; log:\n{}", run.log_text());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn config_of(path: &std::path::Path) -> Arc<Config> {
    Arc::new(Config::load(path, std::iter::empty()).unwrap())
}

/// Replay's expectations: findings (warnings and terminations), and the summaries of the
/// sessions that completed (the others close by idle time in `run`, by end of input here).
pub struct Expected {
    pub findings: BTreeSet<String>,
    pub terminations: BTreeMap<String, serde_json::Value>,
    pub summaries: BTreeMap<String, serde_json::Value>,
}

pub fn expected(config: Arc<Config>, events: &[Vec<u8>]) -> Expected {
    let out = replay(config, events);
    let mut e = Expected {
        findings: BTreeSet::new(),
        terminations: BTreeMap::new(),
        summaries: BTreeMap::new(),
    };
    for v in out {
        let id = v["event_id"].as_str().unwrap().to_string();
        match v["type"].as_str().unwrap() {
            "session.summary" if v["closed_by"] == "completed" => {
                e.summaries.insert(id, v);
            }
            "session.summary" => {}
            t => {
                e.findings.insert(finding_key(&v));
                if t == "session.terminated" {
                    e.terminations.insert(id, v);
                }
            }
        }
    }
    e
}

/// The terminations and summaries on the bus, once every one `want` holds has arrived by
/// `event_id` (or `limit` passed), plus whatever else arrives within a moment. Counting
/// messages instead would stop early: re-emitted copies and summaries of sessions that
/// did not complete count too.
pub fn read_expected(
    brokers: &str,
    topics: &Topics,
    want: &Expected,
    limit: Duration,
) -> (
    Vec<rdkafka::message::OwnedMessage>,
    Vec<rdkafka::message::OwnedMessage>,
) {
    let quiet = Duration::from_millis(500);
    let summaries = read_topic_until(brokers, &topics.summary, limit, quiet, |out| {
        has_every(out, &want.summaries)
    });
    let terminated = read_topic_until(brokers, &topics.terminated, limit, quiet, |out| {
        has_every(out, &want.terminations)
    });
    (terminated, summaries)
}

/// Whether `out` holds a message of every `event_id` in `want`.
pub fn has_every<V>(out: &[rdkafka::message::OwnedMessage], want: &BTreeMap<String, V>) -> bool {
    let got = by_event_id(&values(out));
    want.keys().all(|id| got.contains_key(id))
}

/// Every termination and completed-session summary of replay is on the bus, no other
/// termination, one termination per session, and every copy (at-least-once re-emissions
/// share the `event_id`) carries replay's counters. Returns the number of extra copies.
pub fn assert_each_once_as_replay(
    want: &Expected,
    terminated: &[rdkafka::message::OwnedMessage],
    summaries: &[rdkafka::message::OwnedMessage],
) -> usize {
    let got = by_event_id(&values(terminated));
    let missing: Vec<&String> = want
        .terminations
        .keys()
        .filter(|id| !got.contains_key(*id))
        .collect();
    assert!(missing.is_empty(), "terminations lost: {missing:?}");
    let extra: Vec<&String> = got
        .keys()
        .filter(|id| !want.terminations.contains_key(*id))
        .collect();
    assert!(
        extra.is_empty(),
        "terminations that replay does not produce: {extra:?}"
    );
    let mut per_session: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut duplicates = 0;
    for (id, copies) in &got {
        duplicates += copies.len() - 1;
        for c in copies {
            // Same counters in every copy: nothing was applied twice before it fired.
            assert_eq!(
                c["stats"], want.terminations[id]["stats"],
                "termination {id} stats"
            );
            per_session
                .entry(c["session_id"].as_str().unwrap().into())
                .or_default()
                .insert(id.clone());
        }
    }
    assert!(
        per_session.values().all(|ids| ids.len() == 1),
        "one termination per session"
    );
    let got_summaries = by_event_id(&values(summaries));
    let lost: Vec<String> = want
        .summaries
        .iter()
        .filter(|(id, _)| !got_summaries.contains_key(*id))
        .map(|(id, s)| {
            // What the bus holds for the same session says how it was lost: another
            // closing (another `event_id` when the session restarted from a state that
            // lacked its first events), or nothing at all.
            let session = &s["session_id"];
            let others: Vec<String> = got_summaries
                .values()
                .flatten()
                .filter(|c| &c["session_id"] == session)
                .map(|c| {
                    format!(
                        "{} closed_by {} started_at {} stats {}",
                        c["event_id"], c["closed_by"], c["started_at"], c["stats"]
                    )
                })
                .collect();
            format!(
                "{id} (session {session}, started_at {}, stats {}; on the bus for the session: {others:?})",
                s["started_at"], s["stats"]
            )
        })
        .collect();
    assert!(lost.is_empty(), "summaries lost: {lost:#?}");
    for (id, s) in &want.summaries {
        let copies = &got_summaries[id];
        for c in copies {
            assert_eq!(
                c["stats"], s["stats"],
                "summary {id}: counters differ from replay"
            );
            assert_eq!(c["stop_reason"], s["stop_reason"]);
        }
    }
    duplicates
}

/// The finding keys of the terminations and warnings read from the bus.
pub fn finding_keys(
    terminated: &[rdkafka::message::OwnedMessage],
    warnings: &[rdkafka::message::OwnedMessage],
) -> BTreeSet<String> {
    terminated
        .iter()
        .chain(warnings)
        .map(|m| finding_key(&json(m)))
        .collect()
}

pub fn values(msgs: &[rdkafka::message::OwnedMessage]) -> Vec<serde_json::Value> {
    msgs.iter().map(json).collect()
}

/// The process's resident memory (kB), (0 when it cannot be read).
pub fn rss_kb(pid: u32) -> u64 {
    status_kb(pid, "VmRSS")
}

/// One `kB` field of `/proc/PID/status` (`VmRSS`, `RssAnon`, `RssFile`), 0 when it
/// cannot be read.
pub fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or(0)
}

/// A tool of the OpenTelemetry virtualenv (`scripts/otel-python`: `python`, `rotel`),
/// installed, pinned, on first use.
pub fn otel_python(what: &str) -> PathBuf {
    let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/otel-python"))
        .arg(what)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/otel-python");
    assert!(out.status.success(), "scripts/otel-python {what} failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The collector, exporting traces to `topic` on `brokers` in `format`, listening for
/// OTLP/HTTP on a free port. Stopped when dropped.
pub struct Collector {
    child: Child,
    /// The OTLP/HTTP endpoint (`http://127.0.0.1:port`).
    pub http: String,
}

impl Collector {
    pub fn start(brokers: &str, topic: &str, format: &str, log: &Path) -> Collector {
        let port = free_port();
        let grpc = free_port();
        let child = Command::new(otel_python("rotel"))
            .args(["start", "--exporter", "kafka"])
            .args(["--otlp-http-endpoint", &format!("127.0.0.1:{port}")])
            .args(["--otlp-grpc-endpoint", &format!("127.0.0.1:{grpc}")])
            .args(["--kafka-exporter-brokers", brokers])
            .args(["--kafka-exporter-traces-topic", topic])
            .args(["--kafka-exporter-format", format])
            .args(["--kafka-exporter-acks", "all"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("start rotel");
        let http = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&http).is_err() {
            assert!(
                Instant::now() < deadline,
                "rotel did not listen: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Collector {
            child,
            http: format!("http://{http}"),
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

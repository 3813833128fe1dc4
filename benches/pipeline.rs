//! The Kafka pipeline against a real local broker (Tansu via `scripts/broker`, or
//! LOOPWARDEN_BENCH_BROKERS), DESIGN §8: sustained events/s, and the latency from an
//! event's produce to its finding being readable on the output topic at a fixed rate.
//!
//! `cargo bench --bench pipeline` runs three phases: throughput, latency, and the time a
//! fresh instance takes to restore open sessions from the changelog. Knobs (environment):
//! - LOOPWARDEN_BENCH_EVENTS: events of the throughput phase (default 300000);
//! - LOOPWARDEN_BENCH_RATE / LOOPWARDEN_BENCH_SECS: the latency phase's rate (default
//!   10000 events/s) and length (default 20 s); the phase's pipeline fetches with its
//!   reader's `fetch.wait.max.ms` (5) unless the config's `[kafka.consumer]` or
//!   `[kafka.client]` sets one, with several workers its feed starts once the
//!   pipeline's partition assignments have been still for 4 s, and it prints each
//!   finding's latency split where the pipeline parsed the event (`detected_at`) with
//!   the partitions loaded during the feed (0 unless a rebalance was measured);
//! - LOOPWARDEN_BENCH_PARTITIONS: input partitions (default 4; 32 on the embedded broker,
//!   which keeps only ~5 MB per partition);
//! - LOOPWARDEN_BENCH_BROKERS: `host:port` of a running broker, or `embedded` for the
//!   in-process mock cluster (default: Tansu, started by `scripts/broker`);
//! - LOOPWARDEN_BENCH_CONFIG: extra TOML appended to the pipeline's config;
//! - LOOPWARDEN_BENCH_FEED_LINGER_MS: the bench's producers' `linger.ms` (default 2): how
//!   many records a produced batch holds at a fixed rate (the embedded broker answers a
//!   fetch with at most one produced batch a partition);
//! - spans: OTEL_EXPORTER_OTLP_ENDPOINT, or LOOPWARDEN_TELEMETRY__SPANS_TO_KAFKA=true
//!   (a topic of their own on the broker under test; Tansu only), as in `loopwarden run`;
//! - LOOPWARDEN_BENCH_RESTORE_SESSIONS: open sessions a fresh instance restores from the
//!   changelog in the third phase (default 100000; 0 skips it);
//! - LOOPWARDEN_BENCH_GROWTH_SESSIONS / LOOPWARDEN_BENCH_GROWTH_EVENTS: a fourth phase
//!   (skipped by default) where events go round-robin to that many sessions that never
//!   complete (default 5 events each) and that no step ceiling stops (`GROWTH_CONFIG`:
//!   every event is applied, up to 100M events), so the open sessions grow to it and
//!   then every session is touched once a round; it prints, every 2 s, events/s, open
//!   sessions, the store's size, each stage's mean and the producer's backlog, to show
//!   whether throughput holds as state grows (issue 32), and at its end the states
//!   written per event and the CPU per event (by thread, and in all but the bench's
//!   producer threads: the figure to compare runs by). The producers stay at most
//!   LOOPWARDEN_BENCH_GROWTH_AHEAD events (default 200000) ahead of the pipeline, within
//!   what the embedded broker keeps: a backlog held near it says the pipeline set the
//!   pace, one well under it the producers.
//!   Held back, they go on once the backlog is LOOPWARDEN_BENCH_GROWTH_REFILL events
//!   (default 20000, about what a worker's batch applies) under that, so the backlog a
//!   pipeline-paced run reports swings between the two: the events
//!   consumed they read are counted every few milliseconds, and a producer that followed
//!   them event by event sent the embedded broker produce requests a fraction of the
//!   size, which cost its thread (on the same cores as the pipeline) half as much again;
//! - LOOPWARDEN_BENCH_GROWTH_PRODUCERS (default 1): the growth phase's producer threads,
//!   each with its own client and its share of the sessions (one client fed at most
//!   ~300,000 events/s on a 16-core server);
//! - LOOPWARDEN_BENCH_LIMIT_SECS (default 600): how long the throughput phase waits for
//!   its last summary, and how long the growth phase runs at most (it says when it
//!   stopped for it).
//!
//! Throughput is measured from the first output readable to the last session summary
//! readable, so group-join time is left out; every session completes, so the last
//! summary means every event was applied, delivered, stored and committed.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "shared/growth.rs"]
mod growth;
#[path = "shared/proc.rs"]
mod proc;
use growth::{growth_event, GROWTH_CONFIG};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loopwarden::bus::kafka::embedded::EmbeddedBroker;
use loopwarden::bus::pipeline::run_observed;
use loopwarden::config::Config;
use loopwarden::contract::event::parse_rfc3339_ms;
use loopwarden::contract::event::wall_ms;
use loopwarden::shutdown::Shutdown;
use loopwarden::telemetry::{Spans, Telemetry};
use loopwarden::tools::feed::{feed, FeedProducer, Routing, Target};
use loopwarden::tools::simulate::{Fleet, FleetSpec};
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{ClientConfig, Message};

// The allocator `loopwarden` itself runs on (src/main.rs), so that the pipeline is measured
// as it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config(dir: &std::path::Path, brokers: &str, topics: &common::Topics) -> Arc<Config> {
    config_with(dir, brokers, topics, "")
}

/// [`config`] with `workload`'s TOML after LOOPWARDEN_BENCH_CONFIG's (which may start
/// with bare keys: they land in `[kafka.consumer]`; `workload` opens tables of its own).
fn config_with(
    dir: &std::path::Path,
    brokers: &str,
    topics: &common::Topics,
    workload: &str,
) -> Arc<Config> {
    // LOOPWARDEN_BENCH_CONFIG: extra TOML for the pipeline's config (tuning experiments).
    let extra = std::env::var("LOOPWARDEN_BENCH_CONFIG").unwrap_or_default();
    let extra = format!("{}\n{workload}", extra.replace("\\n", "\n"));
    let path = common::write_config(dir, brokers, topics, &extra);
    // LOOPWARDEN_* variables apply, e.g. LOOPWARDEN_KAFKA__WORKERS=1.
    let env = std::env::vars().filter(|(k, _)| !k.starts_with("LOOPWARDEN_BENCH_"));
    let mut config = Config::load(&path, env).unwrap();
    if config.telemetry.spans_to_kafka {
        // LOOPWARDEN_TELEMETRY__SPANS_TO_KAFKA=true: spans onto a topic of their own.
        config.telemetry.spans_topic = format!("{}.spans", topics.input);
        common::create_topics(brokers, &[(&config.telemetry.spans_topic, 1)]);
    }
    Arc::new(config)
}

/// The pipeline with telemetry as `loopwarden run` sets it up: metrics always, spans when
/// configured (OTEL_EXPORTER_OTLP_ENDPOINT, or LOOPWARDEN_TELEMETRY__SPANS_TO_KAFKA=true).
fn run(
    config: Arc<Config>,
    brokers: &str,
    shutdown: Shutdown,
) -> Result<loopwarden::bus::pipeline::RunStats, loopwarden::bus::pipeline::PipelineError> {
    let telemetry = telemetry_for(&config, brokers);
    run_observed_with_spans(config, brokers, shutdown, telemetry)
}

/// The telemetry `loopwarden run` sets up for `config`: metrics always, spans when
/// configured.
fn telemetry_for(config: &Config, brokers: &str) -> Arc<Telemetry> {
    let mut telemetry = Telemetry::new();
    telemetry.spans = Spans::start(
        &config.telemetry,
        &config.kafka,
        brokers,
        telemetry.metrics.spans_dropped.clone(),
    )
    .unwrap();
    Arc::new(telemetry)
}

/// The pipeline observed by `telemetry`, its spans flushed once it stops.
fn run_observed_with_spans(
    config: Arc<Config>,
    brokers: &str,
    shutdown: Shutdown,
    telemetry: Arc<Telemetry>,
) -> Result<loopwarden::bus::pipeline::RunStats, loopwarden::bus::pipeline::PipelineError> {
    let result = run_observed(config, brokers, shutdown, telemetry.clone());
    if let Some(spans) = &telemetry.spans {
        spans.shutdown();
        eprintln!("spans: {} dropped", telemetry.metrics.spans_dropped.get());
    }
    result
}

/// Partitions loaded by the pipeline so far (each assignment of a partition to a worker
/// restores it from the changelog, and each restore is observed once), and those it holds
/// now: together they change whenever the group rebalances.
fn assignments(telemetry: &Telemetry) -> (u64, i64) {
    let m = &telemetry.metrics;
    (
        m.restore_duration.get_sample_count(),
        m.partitions_assigned.get(),
    )
}

/// The batch stages' times from the pipeline's own histogram: mean and the bucket bound
/// under which 50 % and 99 % of batches fell.
fn print_stage_budget(telemetry: &Telemetry) {
    eprintln!("latency budget per batch: {}", stage_budget(telemetry));
}

/// [`print_stage_budget`]'s text.
fn stage_budget(telemetry: &Telemetry) -> String {
    let mut parts = Vec::new();
    for stage in ["wait", "apply", "close", "deliver", "store", "commit"] {
        let m = stage_metric(telemetry, stage);
        let h = m.get_histogram();
        let count = h.get_sample_count();
        if count == 0 {
            continue;
        }
        let bound = |q: f64| {
            let want = (count as f64 * q).ceil() as u64;
            h.get_bucket()
                .iter()
                .find(|b| b.cumulative_count() >= want)
                .map_or("> 60 s".to_string(), |b| {
                    format!("≤ {} ms", b.upper_bound() * 1e3)
                })
        };
        parts.push(format!(
            "{stage} mean {:.1} ms (p50 {}, p99 {})",
            h.get_sample_sum() / count as f64 * 1e3,
            bound(0.5),
            bound(0.99)
        ));
    }
    parts.join("; ")
}

/// The bench's producers' `linger.ms` (LOOPWARDEN_BENCH_FEED_LINGER_MS, default 2).
fn feed_linger_ms() -> u32 {
    env_or("LOOPWARDEN_BENCH_FEED_LINGER_MS", 2)
}

fn producer(brokers: &str) -> FeedProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", feed_linger_ms().to_string())
        .create_with_context(Default::default())
        .unwrap()
}

/// The broker under test: a local one reached by address, or the embedded mock cluster
/// (LOOPWARDEN_BENCH_BROKERS=embedded), which shows the pipeline's own latency without a
/// separate broker process competing for the two cores.
enum Cluster {
    Address(String),
    Embedded(EmbeddedBroker),
}

impl Cluster {
    fn brokers(&self) -> String {
        match self {
            Cluster::Address(a) => a.clone(),
            Cluster::Embedded(e) => e.bootstrap_servers().to_string(),
        }
    }

    fn topics(&self, partitions: i32) -> common::Topics {
        match self {
            Cluster::Address(a) => common::Topics::create(a, partitions),
            Cluster::Embedded(e) => {
                let t = common::Topics::named();
                for (name, n) in t.layout(partitions) {
                    e.create_topic(name, n).unwrap();
                }
                // The mock cluster does not take topic creation through the admin API.
                e.create_topic(&t.changelog, partitions).unwrap();
                t
            }
        }
    }
}

fn throughput(cluster: &Cluster, partitions: i32, events_wanted: u64) {
    let brokers = &cluster.brokers();
    let topics = cluster.topics(partitions);
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), brokers, &topics);
    // ~44 events per session on average.
    let sessions = (events_wanted / 44).max(10);
    let mut fleet = Fleet::new(FleetSpec {
        sessions,
        concurrency: 2000,
        loop_share: 0.2,
        seed: 42,
    });
    let p = producer(brokers);
    let t = Instant::now();
    let fed = feed(
        &mut fleet,
        Target::Kafka {
            producer: &p,
            routing: Routing::single(&topics.input),
        },
        0.0,
        Some((1_763_000_000_000, 2)),
        None,
        &Shutdown::new(),
    )
    .unwrap();
    eprintln!(
        "throughput: produced {} events of {} sessions in {:.1} s ({:.0} events/s produce)",
        fed.events,
        fed.sessions,
        t.elapsed().as_secs_f64(),
        fed.events as f64 / t.elapsed().as_secs_f64()
    );

    let r = common::reader(
        brokers,
        &[&topics.summary, &topics.terminated, &topics.warning],
    );
    let shutdown = Shutdown::new();
    let pipeline = {
        let (config, brokers, shutdown) = (config.clone(), brokers.to_string(), shutdown.clone());
        std::thread::spawn(move || run(config, &brokers, shutdown))
    };
    let started = Instant::now();
    let mut first: Option<Instant> = None;
    let mut summaries = 0u64;
    let limit = Duration::from_secs(env_or("LOOPWARDEN_BENCH_LIMIT_SECS", 600));
    while summaries < fed.sessions && started.elapsed() < limit {
        if let Some(Ok(m)) = r.poll(Duration::from_millis(100)) {
            first.get_or_insert_with(Instant::now);
            if m.topic() == topics.summary {
                summaries += 1;
            }
        }
    }
    let end = Instant::now();
    shutdown.trigger();
    let stats = pipeline.join().unwrap().unwrap();
    let first = first.expect("some output");
    if stats.events < fed.events {
        eprintln!(
            "throughput: only {} of {} events were there to consume (the embedded broker keeps ~5 MB per partition; raise LOOPWARDEN_BENCH_PARTITIONS)",
            stats.events, fed.events
        );
    }
    let secs = (end - first).as_secs_f64();
    eprintln!(
        "throughput: {:?}\nthroughput: {} events applied ({} batches), first output after {:.1} s (group join), then {:.2} s to the last summary: {:.0} events/s sustained",
        stats,
        stats.events,
        stats.batches,
        (first - started).as_secs_f64(),
        secs,
        stats.events as f64 / secs
    );
}

fn latency(cluster: &Cluster, partitions: i32, rate: f64, secs: u64) {
    let brokers = &cluster.brokers();
    let topics = cluster.topics(partitions);
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::clone(&config(dir.path(), brokers, &topics));
    // The hop is the broker's as the bench's reader sees it (`fetch.wait.max.ms` 5): the
    // pipeline's consumer fetches alike unless told otherwise, because the embedded
    // broker (and Tansu) hold a fetch that finds nothing for its whole wait, so the
    // pipeline's default 20 ms would be counted as the pipeline's own latency (a Kafka
    // broker answers a waiting fetch as a record arrives: there the wait costs nothing).
    const FETCH_WAIT: &str = "fetch.wait.max.ms";
    let kafka = &mut config.kafka;
    let fetch_wait = match kafka.consumer_property(FETCH_WAIT) {
        Some(set) => format!("{set} (as configured)"),
        None => {
            let reader = common::READER_FETCH_WAIT_MS.load(Ordering::Relaxed);
            kafka.consumer.insert(FETCH_WAIT.into(), reader.to_string());
            format!("{reader} (the reader's; the pipeline's default is 20)")
        }
    };
    let config = Arc::new(config);
    let shutdown = Shutdown::new();
    let telemetry = telemetry_for(&config, brokers);
    let pipeline = {
        let (config, brokers, shutdown, telemetry) = (
            config.clone(),
            brokers.to_string(),
            shutdown.clone(),
            telemetry.clone(),
        );
        std::thread::spawn(move || run_observed_with_spans(config, &brokers, shutdown, telemetry))
    };
    // Wait until the pipeline is assigned and delivering: one session through end to end.
    let r = common::reader(
        brokers,
        &[
            &topics.terminated,
            &topics.warning,
            &topics.summary,
            &topics.input,
        ],
    );
    let p = producer(brokers);
    let warm = br#"{"type":"session.completed","session_id":"warmup"}"#.to_vec();
    common::produce(brokers, &topics.input, &[warm], &[]);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        if let Some(Ok(m)) = r.poll(Duration::from_millis(100)) {
            if m.topic() == topics.summary {
                break;
            }
        }
    }
    // The workers start together, but a broker that assigns a new group at once (the
    // embedded one; a Kafka broker waits 3 s for more members) gives every partition to
    // the first to join, and the group rebalances once the others' joins are seen, at
    // the first's next heartbeat (librdkafka's `heartbeat.interval.ms`, 3 s), which held
    // the moved partitions' events for about a second. So with several workers the feed
    // starts once the assignments have not changed for 4 s (within a minute), and the
    // partitions loaded during the feed are reported: 0 unless a rebalance was measured.
    if config.kafka.workers > 1 {
        let (settle, started) = (Duration::from_secs(4), Instant::now());
        let (mut seen, mut since) = (assignments(&telemetry), Instant::now());
        while since.elapsed() < settle && started.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(50));
            let now = assignments(&telemetry);
            if now != seen {
                (seen, since) = (now, Instant::now());
            }
        }
    }
    let loads_before_feed = assignments(&telemetry).0;
    // Each finding's produce → readable, and the part of it before the pipeline parsed
    // the event (produce → `detected_at`, stamped as a worker parses the message: the
    // broker's first hop and the pipeline's fetch).
    let samples = Arc::new(Mutex::new(Vec::<(i64, Option<i64>)>::new()));
    // The broker alone: produce → readable for the input events themselves.
    let raw = Arc::new(Mutex::new(Vec::<i64>::new()));
    let stop_reading = Shutdown::new();
    let reading = {
        let (samples, raw, input, stop, terminated, warning) = (
            samples.clone(),
            raw.clone(),
            topics.input.clone(),
            stop_reading.clone(),
            topics.terminated.clone(),
            topics.warning.clone(),
        );
        std::thread::spawn(move || {
            while !stop.is_triggered() {
                let Some(Ok(m)) = r.poll(Duration::from_millis(50)) else {
                    continue;
                };
                let now = wall_ms();
                if m.topic() == input {
                    if let Some(t) = m.timestamp().to_millis() {
                        raw.lock().unwrap().push(now - t);
                    }
                    continue;
                }
                if m.topic() != terminated && m.topic() != warning {
                    continue;
                }
                let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
                // The triggering event was stamped with the wall clock when it was produced.
                if let Some(t) = v["event_time"].as_str().and_then(parse_rfc3339_ms) {
                    let detected = v["detected_at"].as_str().and_then(parse_rfc3339_ms);
                    samples
                        .lock()
                        .unwrap()
                        .push((now - t, detected.map(|d| d - t)));
                }
            }
        })
    };
    let mut fleet = Fleet::new(FleetSpec {
        sessions: u64::MAX,
        concurrency: 2000,
        loop_share: 0.2,
        seed: 7,
    });
    let fed = feed(
        &mut fleet,
        Target::Kafka {
            producer: &p,
            routing: Routing::single(&topics.input),
        },
        rate,
        None,
        Some((rate * secs as f64) as u64),
        &Shutdown::new(),
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    stop_reading.trigger();
    reading.join().unwrap();
    let loaded_during_feed = assignments(&telemetry).0 - loads_before_feed;
    shutdown.trigger();
    let stats = pipeline.join().unwrap().unwrap();
    let pct = |s: &[i64], q: f64| {
        s.get(((s.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(-1)
    };
    let mut r = raw.lock().unwrap().clone();
    r.sort_unstable();
    eprintln!(
        "latency: the broker alone, input event produce → readable: p50 {} ms, p99 {} ms ({} events)",
        pct(&r, 0.5),
        pct(&r, 0.99),
        r.len()
    );
    let sampled = samples.lock().unwrap().clone();
    let mut s: Vec<i64> = sampled.iter().map(|&(total, _)| total).collect();
    s.sort_unstable();
    eprintln!(
        "latency at {rate:.0} events/s for {secs} s ({} events fed, {} applied, {} batches): {} findings; produce → finding readable: p50 {} ms, p99 {} ms, max {} ms",
        fed.events,
        stats.events,
        stats.batches,
        s.len(),
        pct(&s, 0.5),
        pct(&s, 0.99),
        s.last().copied().unwrap_or(-1)
    );
    let (mut before, mut after): (Vec<i64>, Vec<i64>) = sampled
        .iter()
        .filter_map(|&(total, before)| before.map(|b| (b, total - b)))
        .unzip();
    before.sort_unstable();
    after.sort_unstable();
    let changelog = if config.kafka.changelog {
        ""
    } else {
        " (not counted: the changelog is off)"
    };
    eprintln!(
        "latency split (the pipeline's fetch.wait.max.ms {fetch_wait}; the bench's producers' linger.ms {}; partitions loaded during the feed: {loaded_during_feed}{changelog}; {} of {} findings with detected_at): produce → parsed by the pipeline p50 {} ms, p99 {} ms; parsed → finding readable p50 {} ms, p99 {} ms",
        feed_linger_ms(),
        before.len(),
        sampled.len(),
        pct(&before, 0.5),
        pct(&before, 0.99),
        pct(&after, 0.5),
        pct(&after, 0.99)
    );
    print_stage_budget(&telemetry);
}

/// Restore time: instance A consumes a fleet that leaves `sessions` sessions open, then
/// instance B, with an empty state directory, restores them from the changelog.
fn restore(cluster: &Cluster, partitions: i32, sessions: u64) {
    let brokers = &cluster.brokers();
    let topics = cluster.topics(partitions);
    let base = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (base.path().join("a"), base.path().join("b"));
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    let config_a = config(&a_dir, brokers, &topics);
    let mut config_b = (*config_a).clone();
    config_b.state_path = b_dir.join("state");
    // Three events each: every session is still open when the feed ends.
    let mut fleet = Fleet::new(FleetSpec {
        sessions,
        concurrency: sessions as usize,
        loop_share: 0.2,
        seed: 11,
    });
    let fed = feed(
        &mut fleet,
        Target::Kafka {
            producer: &producer(brokers),
            routing: Routing::single(&topics.input),
        },
        0.0,
        Some((1_763_000_000_000, 1)),
        Some(sessions * 3),
        &Shutdown::new(),
    )
    .unwrap();
    // Runs an instance until `grows` stops growing for 3 s (or 300 s pass).
    let run_until_settled = |config: Arc<Config>, grows: &dyn Fn() -> u64| {
        let shutdown = Shutdown::new();
        let handle = {
            let (brokers, shutdown) = (brokers.to_string(), shutdown.clone());
            std::thread::spawn(move || run(config, &brokers, shutdown))
        };
        let started = Instant::now();
        let (mut last, mut since) = (0u64, Instant::now());
        while started.elapsed() < Duration::from_secs(300) {
            std::thread::sleep(Duration::from_millis(250));
            let now = grows();
            if now != last {
                (last, since) = (now, Instant::now());
            } else if now > 0 && since.elapsed() > Duration::from_secs(3) {
                break;
            }
        }
        shutdown.trigger();
        handle.join().unwrap().unwrap()
    };
    // A: until its changelog stops growing.
    let probe = common::reader(brokers, &[]);
    let changelog_end = || -> u64 {
        (0..partitions)
            .map(|p| {
                probe
                    .fetch_watermarks(&topics.changelog, p, Duration::from_secs(5))
                    .map(|(_, h)| h.max(0) as u64)
                    .unwrap_or(0)
            })
            .sum()
    };
    let a = run_until_settled(config_a, &changelog_end);
    // B, with an empty state directory: until its state directory stops growing.
    let b_state = config_b.state_path.clone();
    let b = run_until_settled(Arc::new(config_b), &|| dir_bytes(&b_state));
    eprintln!(
        "restore: instance A applied {} of {} events, leaving {sessions} sessions open; instance B read {} session records from the changelog (uncompacted: every stored version) and restored them in {} ms ({:.0} ms per 100k open sessions)",
        a.events,
        fed.events,
        b.restored_records,
        b.restore_ms,
        b.restore_ms as f64 * 100_000.0 / sessions as f64
    );
}

/// Bytes under a directory (recursively).
fn dir_bytes(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The running sum and count of one stage's histogram.
fn stage_totals(telemetry: &Telemetry, stage: &str) -> (f64, u64) {
    let m = stage_metric(telemetry, stage);
    let h = m.get_histogram();
    (h.get_sample_sum(), h.get_sample_count())
}

/// One batch stage's histogram as it stands.
fn stage_metric(telemetry: &Telemetry, stage: &str) -> prometheus::proto::Metric {
    use prometheus::core::Metric as _;
    telemetry
        .metrics
        .batch_stages
        .with_label_values(&[stage])
        .metric()
}

fn growth(cluster: &Cluster, partitions: i32, sessions: u64, events: u64) {
    let brokers = &cluster.brokers();
    let topics = cluster.topics(partitions);
    let dir = tempfile::tempdir().unwrap();
    let config = config_with(dir.path(), brokers, &topics, GROWTH_CONFIG);
    let ahead: u64 = env_or("LOOPWARDEN_BENCH_GROWTH_AHEAD", 200_000);
    assert!(
        ahead > 0,
        "LOOPWARDEN_BENCH_GROWTH_AHEAD must be at least 1"
    );
    let refill: u64 = env_or("LOOPWARDEN_BENCH_GROWTH_REFILL", 20_000);
    assert!(
        refill < ahead,
        "LOOPWARDEN_BENCH_GROWTH_REFILL must be under LOOPWARDEN_BENCH_GROWTH_AHEAD (0: refill event by event)"
    );
    // A producer held back goes on once the backlog is down to this.
    let resume_at = ahead - refill.max(1);
    let shutdown = Shutdown::new();
    let mut telemetry = Telemetry::new();
    telemetry.spans = None;
    let telemetry = Arc::new(telemetry);
    let pipeline = {
        let (config, brokers, shutdown, telemetry) = (
            config.clone(),
            brokers.to_string(),
            shutdown.clone(),
            telemetry.clone(),
        );
        // Named: with one worker the pipeline's worker runs on this thread (the CPU by
        // thread below).
        std::thread::Builder::new()
            .name("pipeline".into())
            .spawn(move || run_observed(config, &brokers, shutdown, telemetry))
            .unwrap()
    };
    // Resolved once: a labelled lookup per event produced would cost the cores measured.
    let consumed = telemetry
        .metrics
        .events_consumed
        .with_label_values(&["tool.called"]);
    let producers: u64 = env_or("LOOPWARDEN_BENCH_GROWTH_PRODUCERS", 1);
    assert!(
        producers > 0,
        "LOOPWARDEN_BENCH_GROWTH_PRODUCERS must be at least 1"
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs(env_or("LOOPWARDEN_BENCH_LIMIT_SECS", 600));
    // The pipeline gone, or out of time: stop feeding and waiting, and say so below.
    let stopped = || pipeline.is_finished() || Instant::now() >= deadline;
    let mut last = (Instant::now(), 0u64, [(0.0, 0u64); 3]);
    // States written and their bytes at the last report: the size of a state written over
    // each interval, which grows as the sessions' rings fill (and the store's and the
    // changelog's cost per state with it).
    let written = || {
        let m = &telemetry.metrics;
        (m.states_written.get(), m.states_written_bytes.get())
    };
    let mut last_written = written();
    let stages = ["apply", "deliver", "store"];
    // Events produced so far, by all the producers: the backlog (produced, not yet
    // consumed) says who sets the pace. Held near `ahead`, the pipeline; well under it,
    // the producers.
    let produced = Arc::new(AtomicU64::new(0));
    eprintln!(
        "growth: {events} events round-robin over {sessions} sessions, {partitions} partitions, {producers} producer thread(s), the producer at most {ahead} ahead"
    );
    eprintln!("growth:    secs   consumed   events/s  open sessions  store MB  state B  stage means over the interval (ms): apply deliver store  backlog");
    // The first report with every session open: the sustained rate is read from there to
    // the phase's end (the group's join and the sessions' opening left out).
    let mut all_open: Option<(Instant, u64)> = None;
    let mut report = |final_line: bool| {
        let now = Instant::now();
        let done = consumed.get();
        let open = telemetry.metrics.sessions_open.get();
        if all_open.is_none() && open >= sessions as i64 {
            all_open = Some((now, done));
        }
        let totals = stages.map(|s| stage_totals(&telemetry, s));
        let rate = (done - last.1) as f64 / (now - last.0).as_secs_f64();
        let means: Vec<String> = totals
            .iter()
            .zip(last.2.iter())
            .map(|((sum, n), (sum0, n0))| {
                if n > n0 {
                    format!("{:.1}", (sum - sum0) / (n - n0) as f64 * 1e3)
                } else {
                    "-".to_string()
                }
            })
            .collect();
        let now_written = written();
        let (states, bytes) = (
            now_written.0 - last_written.0,
            now_written.1 - last_written.1,
        );
        last_written = now_written;
        let state_bytes = if states > 0 {
            format!("{:.0}", bytes as f64 / states as f64)
        } else {
            "-".to_string()
        };
        eprintln!(
            "growth: {:7.2} {:10} {:10.0} {:14} {:9.1} {:>8}  {}  backlog {}{}",
            started.elapsed().as_secs_f64(),
            done,
            rate,
            open,
            telemetry.metrics.state_store_bytes.get() as f64 / 1e6,
            state_bytes,
            means.join(" "),
            produced.load(Ordering::Relaxed).saturating_sub(done),
            if final_line { " (last)" } else { "" }
        );
        last = (now, done, totals);
    };
    // One producer thread is one client: on a many-core machine a single one sets the
    // pace before the workers do (about 300,000 events/s on the 16-core server), so the
    // sessions are dealt to `producers` threads, each with its own client: every event
    // of a session from one producer, in order.
    let stop_feeding = Arc::new(AtomicBool::new(false));
    let feeders: Vec<_> = (0..producers)
        .map(|first| {
            let (brokers, input, produced, stop, consumed) = (
                brokers.to_string(),
                topics.input.clone(),
                produced.clone(),
                stop_feeding.clone(),
                consumed.clone(),
            );
            std::thread::Builder::new()
                .name(format!("feed-{first}"))
                .spawn(move || {
                    // A producer that fails stops the others and the wait below (its
                    // panic is raised again at its join).
                    let _failing = StopOnPanic(stop.clone());
                    let p = producer(&brokers);
                    let mine = (0..events).filter(|k| (k % sessions) % producers == first);
                    let backlog = || {
                        produced
                            .load(Ordering::Relaxed)
                            .saturating_sub(consumed.get())
                    };
                    'feed: for (sent, k) in mine.enumerate() {
                        let held = backlog() >= ahead;
                        while held && backlog() > resume_at {
                            if stop.load(Ordering::Relaxed) {
                                break 'feed;
                            }
                            // rdkafka's `poll(t)` serves events until `t` has passed,
                            // spinning through its last millisecond: poll without
                            // waiting, and sleep, to leave the cores to the pipeline.
                            p.poll(Duration::ZERO);
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        // Out of time while the pipeline keeps up (the wait above never
                        // runs then).
                        if sent % 1024 == 0 && stop.load(Ordering::Relaxed) {
                            break 'feed;
                        }
                        let (id, json) = growth_event(k, sessions);
                        let mut record = BaseRecord::to(&input).key(id.as_bytes()).payload(&json);
                        loop {
                            match p.send(record) {
                                Ok(()) => break,
                                Err((
                                    KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
                                    r,
                                )) => {
                                    p.poll(Duration::ZERO);
                                    std::thread::sleep(Duration::from_millis(1));
                                    record = r;
                                }
                                Err((e, _)) => panic!("growth: producing event {k}: {e}"),
                            }
                        }
                        produced.fetch_add(1, Ordering::Relaxed);
                        p.poll(Duration::ZERO);
                    }
                    if let Err(e) = p.flush(Duration::from_secs(30)) {
                        eprintln!("growth: producer {first} could not flush: {e}");
                    }
                    // Read before the thread ends and leaves /proc (the CPU by thread);
                    // the client is handed back, so that its threads are still there
                    // when the CPU by thread is read.
                    let cpu = proc::this_thread_cpu_ms().unwrap_or_else(|| {
                        eprintln!("growth: producer {first}'s CPU time could not be read");
                        0
                    });
                    (cpu, p)
                })
                .unwrap()
        })
        .collect();
    let mut next_report = Instant::now() + Duration::from_secs(2);
    while !(feeders.iter().all(|f| f.is_finished()) && consumed.get() >= events) {
        if stopped() || stop_feeding.load(Ordering::Relaxed) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        if Instant::now() >= next_report {
            report(false);
            next_report += Duration::from_secs(2);
        }
    }
    stop_feeding.store(true, Ordering::Relaxed);
    let (feeders_cpu, _feeding_clients): (Vec<(String, u64)>, Vec<_>) = feeders
        .into_iter()
        .enumerate()
        .map(|(i, feeder)| {
            let (cpu, client) = feeder.join().unwrap();
            ((format!("feed-{i}"), cpu), client)
        })
        .unzip();
    report(true);
    let phase_end = Instant::now();
    let done = consumed.get();
    if done < events {
        eprintln!(
            "growth: stopped after {done} of {events} events ({})",
            if pipeline.is_finished() {
                "the pipeline ended"
            } else {
                "LOOPWARDEN_BENCH_LIMIT_SECS passed"
            }
        );
    }
    eprintln!(
        "growth: {done} events in {:.1} s ({:.0} events/s over the whole phase, the group's join included)",
        started.elapsed().as_secs_f64(),
        done as f64 / started.elapsed().as_secs_f64()
    );
    // The number to compare runs by (one line, so that nothing has to pick report lines
    // out of the log: a script that did once counted this phase's other lines as reports).
    match all_open {
        Some((at, from)) if phase_end > at && done > from => eprintln!(
            "growth: sustained {:.0} events/s with every session open ({} events from {:.1} s to the phase's end at {:.1} s)",
            (done - from) as f64 / (phase_end - at).as_secs_f64(),
            done - from,
            (at - started).as_secs_f64(),
            (phase_end - started).as_secs_f64(),
        ),
        _ => eprintln!(
            "growth: no sustained rate (no report after every one of the {sessions} sessions was open)"
        ),
    }
    // Each state written is a serialization, a changelog record and a sled write: a batch
    // that touches a session several times writes it once, so fewer sessions mean fewer
    // writes per event at the same rate.
    let (states, bytes) = written();
    eprintln!(
        "growth: {:.3} states written per event, {:.0} bytes a state ({} batches, {:.0} events a batch); the store wrote {:.0} bytes a state (deltas, folding and offsets)",
        states as f64 / done.max(1) as f64,
        bytes as f64 / states.max(1) as f64,
        telemetry.metrics.batches.get(),
        done as f64 / telemetry.metrics.batches.get().max(1) as f64,
        telemetry.metrics.store_written_bytes.get() as f64 / states.max(1) as f64
    );
    // `close` is how long each batch end stopped the worker's applying (its states taken
    // and handed on): what a commit interval spreads over the partitions' turns.
    eprintln!(
        "growth: batch stages over the phase: {}",
        stage_budget(&telemetry)
    );
    if let Some((now, peak)) = proc::resident_mib() {
        eprintln!("growth: the process's resident memory {now} MiB at the phase's end, {peak} MiB at its peak");
    }
    // Every thread's CPU so far, read once for both lines below: this process's, and the
    // producers' that have ended.
    let threads_split = proc::threads_cpu_split();
    let threads_cpu = threads_split.as_ref().map(|split| {
        let mut threads: Vec<(String, u64)> = split
            .iter()
            .map(|(name, cpu)| (name.clone(), cpu.total_ms()))
            .collect();
        threads.extend(feeders_cpu.iter().cloned());
        threads
    });
    if let Some(threads) = threads_cpu.as_deref().map(cpu_by_thread) {
        // What bounds one worker on cores of its own is its own thread's CPU per event;
        // its share of a core says whether it had work all along (near 1) or waited.
        let phase = started.elapsed().as_secs_f64();
        let per_event: Vec<String> = threads
            .iter()
            .map(|(name, secs)| {
                let per_event = secs * 1e6 / done.max(1) as f64;
                if name == "pipeline" || name.starts_with("lw-") || name.starts_with("feed-") {
                    format!("{name} {per_event:.2} ({:.2} of a core)", secs / phase)
                } else {
                    format!("{name} {per_event:.2}")
                }
            })
            .collect();
        eprintln!(
            "growth: CPU per event by thread, µs (this phase's pipeline threads with their share of a core over the phase, each worker `lw-worker-N`, or `pipeline` when there is one, and its store writer `lw-store-N`; the bench's producer threads `feed-N` with theirs; `rdk:*` counts the whole run): {}",
            per_event.join(", ")
        );
        // One figure to compare runs by: every thread's but the producers' own, `sled-io`
        // and the ones too small for the line above included.
        let (feed_ms, rest_ms) = threads_cpu.as_deref().unwrap_or_default().iter().fold(
            (0u64, 0u64),
            |(feed, rest), (name, ms)| {
                if name.starts_with("feed-") {
                    (feed + ms, rest)
                } else {
                    (feed, rest + ms)
                }
            },
        );
        let us_per_event = |ms: u64| ms as f64 * 1e3 / done.max(1) as f64;
        eprintln!(
            "growth: CPU per event, µs: {:.2} in all but the bench's producer threads (`rdk:*` over the whole run, the producers' clients among them), {:.2} in the producer threads",
            us_per_event(rest_ms),
            us_per_event(feed_ms)
        );
    }
    if let Some(split) = &threads_split {
        // Time in the kernel is mostly fresh memory faulted in and cleared (a heap that
        // grows, or freed pages handed back and taken again), which no profile of the
        // program's own code shows.
        let shares: Vec<String> = split
            .iter()
            .filter(|(name, _)| name == "pipeline" || name.starts_with("lw-"))
            .map(|(name, cpu)| format!("{name} {:.0} %", cpu.system_share() * 100.0))
            .collect();
        eprintln!(
            "growth: the kernel's share of each pipeline thread's CPU (system time: fresh memory faulted in and cleared, system calls): {}",
            shares.join(", ")
        );
    }
    if let Some(mut threads) = threads_cpu {
        // The busiest threads one by one: a thread near a whole core is a stage that
        // cannot go faster by more workers (the embedded broker runs in one thread of
        // librdkafka's mock cluster, each client's broker connection in one of its own).
        threads.sort_by_key(|t| std::cmp::Reverse(t.1));
        let phase = started.elapsed().as_secs_f64();
        let busiest: Vec<String> = threads
            .iter()
            .take(6)
            .map(|(name, ms)| format!("{name} {:.2}", *ms as f64 / 1e3 / phase))
            .collect();
        eprintln!(
            "growth: busiest threads, CPU over the phase's wall time (threads older than the phase, the broker's and the clients', count from their start): {}",
            busiest.join(", ")
        );
    }
    shutdown.trigger();
    pipeline.join().unwrap().unwrap();
}

/// Sets its flag when dropped by a panicking thread.
struct StopOnPanic(Arc<AtomicBool>);

impl Drop for StopOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// CPU seconds (user + system) of `threads` (name and CPU ms each) by name, busiest
/// first: each worker (`pipeline` is the one worker's when there is one) and each store
/// writer, sled's and the Kafka clients' threads together, the rest by name.
fn cpu_by_thread(threads: &[(String, u64)]) -> Vec<(String, f64)> {
    let mut by_name: std::collections::BTreeMap<String, f64> = Default::default();
    for (name, ms) in threads.iter().cloned() {
        let group = if name.starts_with("rdk:") {
            "rdk:*".to_string()
        } else if name.starts_with("sled-io") {
            "sled-io (all)".to_string()
        } else {
            name
        };
        *by_name.entry(group).or_default() += ms as f64 / 1e3;
    }
    let mut threads: Vec<(String, f64)> = by_name.into_iter().filter(|(_, s)| *s >= 0.05).collect();
    threads.sort_by(|a, b| b.1.total_cmp(&a.1));
    threads
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run only then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    // RUST_LOG=loopwarden=debug shows every batch's delivery and store times.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    // The heap as `loopwarden run` holds it: mimalloc without huge pages, for the Rust
    // heap and the C heap alike (the embedded broker's threads get it too, as in `run`
    // with `brokers = "embedded"`).
    loopwarden::heap::without_transparent_huge_pages();
    let cluster = match std::env::var("LOOPWARDEN_BENCH_BROKERS") {
        Ok(b) if b == "embedded" => Cluster::Embedded(EmbeddedBroker::start(&[], 1).unwrap()),
        Ok(b) => Cluster::Address(b),
        Err(_) => Cluster::Address(common::broker()),
    };
    match &cluster {
        Cluster::Address(a) => eprintln!("broker: {a} (a separate process)"),
        Cluster::Embedded(_) => eprintln!("broker: embedded mock cluster (in process)"),
    }
    // The embedded broker keeps only ~5 MB per partition: spread the backlog wider.
    let default_partitions = match cluster {
        Cluster::Embedded(_) => 32,
        Cluster::Address(_) => 4,
    };
    let partitions = env_or("LOOPWARDEN_BENCH_PARTITIONS", default_partitions);
    throughput(
        &cluster,
        partitions,
        env_or("LOOPWARDEN_BENCH_EVENTS", 300_000),
    );
    latency(
        &cluster,
        partitions,
        env_or("LOOPWARDEN_BENCH_RATE", 10_000.0),
        env_or("LOOPWARDEN_BENCH_SECS", 20),
    );
    let restore_sessions = env_or("LOOPWARDEN_BENCH_RESTORE_SESSIONS", 100_000u64);
    if restore_sessions > 0 {
        restore(&cluster, partitions, restore_sessions);
    }
    let growth_sessions = env_or("LOOPWARDEN_BENCH_GROWTH_SESSIONS", 0u64);
    if growth_sessions > 0 {
        let events = env_or("LOOPWARDEN_BENCH_GROWTH_EVENTS", 5 * growth_sessions);
        growth(&cluster, partitions, growth_sessions, events);
    }
}

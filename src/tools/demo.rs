//! `loopwarden demo`: the embedded broker, the simulator and the real pipeline in one
//! process. Prints terminations as they arrive on the output topic and, at the end, the
//! stop-reason mix and how many looping sessions were caught, missed or wrongly stopped.
//!
//! Guarantees: it reads its results back from the broker (what a platform's consumer
//! would see), deduplicated by `event_id`; it cleans up its temporary state directory.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;
use serde_json::Value;

use crate::bus::kafka::embedded::{EmbeddedBroker, EmbeddedError};
use crate::bus::kafka::{client_config, producer_config, ClientErrorsLogged};
use crate::bus::pipeline::{run, PipelineError, RunStats};
use crate::config::Config;
use crate::shutdown::Shutdown;
use crate::tools::feed::{feed, FeedError, FeedProducer, Routing, Target};
use crate::tools::simulate::{Fleet, FleetSpec, Truth};

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Embedded(#[from] EmbeddedError),
    #[error("kafka client: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    #[error("feeding the simulated fleet: {0}")]
    Feed(#[from] FeedError),
    #[error("the pipeline stopped: {0}")]
    Pipeline(#[from] PipelineError),
    #[error("the pipeline thread panicked")]
    Panicked,
    #[error("cannot create the demo's state directory: {0}")]
    StateDir(std::io::Error),
    #[error("writing the report: {0}")]
    Write(#[from] std::io::Error),
}

/// What the demo saw, read back from the output topics.
#[derive(Debug, Clone, Default)]
pub struct DemoReport {
    pub sessions: u64,
    pub events: u64,
    pub stop_reasons: BTreeMap<String, u64>,
    /// Per loop pattern: (sessions, caught).
    pub patterns: BTreeMap<String, (u64, u64)>,
    pub looping: u64,
    pub caught: u64,
    pub missed: u64,
    pub healthy: u64,
    pub wrongly_stopped: u64,
    pub warnings: u64,
    pub summaries: u64,
    pub pipeline: RunStats,
    pub seconds: f64,
}

impl std::fmt::Display for DemoReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "\n{} sessions, {} events in {:.1} s; {} summaries, {} warnings read back",
            self.sessions, self.events, self.seconds, self.summaries, self.warnings
        )?;
        writeln!(f, "\nstop reason          sessions")?;
        for (reason, n) in &self.stop_reasons {
            writeln!(f, "  {reason:<18} {n:>8}")?;
        }
        writeln!(f, "\nloop pattern         looping   caught")?;
        for (p, (n, c)) in &self.patterns {
            writeln!(f, "  {p:<18} {n:>8} {c:>8}")?;
        }
        writeln!(
            f,
            "\nlooping sessions: {} caught, {} missed (of {}); healthy sessions wrongly stopped: {} (of {})",
            self.caught, self.missed, self.looping, self.wrongly_stopped, self.healthy
        )
    }
}

/// Options of a demo run.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub fleet: FleetSpec,
    /// Events per second fed to the broker.
    pub rate: f64,
    /// Longest wait for the last summaries after the fleet is fed.
    pub settle: Duration,
}

/// One output read back.
enum Seen {
    Terminated(Value),
    Warning,
    Summary(Value),
}

/// The index of an event within its session, from the simulator's `session#index` ids.
fn event_index(trigger_event_id: &str) -> Option<u32> {
    trigger_event_id.rsplit_once('#')?.1.parse().ok()
}

/// Runs the demo, printing progress to `out`.
pub fn demo(
    config: Arc<Config>,
    options: DemoOptions,
    out: &mut dyn Write,
    shutdown: Shutdown,
) -> Result<DemoReport, DemoError> {
    let started = Instant::now();
    let settings = &config.kafka;
    let topics = settings.all_topics();
    let broker = EmbeddedBroker::start(&topics, settings.embedded_partitions)?;
    let brokers = broker.bootstrap_servers().to_string();
    writeln!(
        out,
        "embedded broker on {brokers}; topics: {}",
        topics.join(", ")
    )?;

    let state = TempDir::create(format!("loopwarden-demo-{}", std::process::id()))?;
    let mut pipeline_config = (*config).clone();
    pipeline_config.state_path = state.0.clone();
    // Its broker is the embedded one, whatever the configuration names: its clients get
    // the embedded broker's settings (`bus::kafka::consumer_config`).
    pipeline_config.kafka.brokers = None;
    let pipeline_shutdown = Shutdown::new();
    let pipeline = {
        let (config, brokers, shutdown) = (
            Arc::new(pipeline_config),
            brokers.clone(),
            pipeline_shutdown.clone(),
        );
        std::thread::spawn(move || run(config, &brokers, shutdown))
    };

    let (rx, reader_stop, reader_thread) = spawn_reader(settings, &brokers)?;

    let producer: FeedProducer = producer_config(settings, &brokers, config.limits.max_event_bytes)
        .create_with_context(Default::default())?;
    let mut fleet = Fleet::new(options.fleet.clone());
    writeln!(
        out,
        "feeding {} simulated sessions at {} events/s ({}% fall into a loop)…\n",
        options.fleet.sessions,
        options.rate,
        (options.fleet.loop_share * 100.0).round()
    )?;
    let routing = Routing::for_inputs(&settings.input_topics);
    let mut report = DemoReport::default();
    let mut seen = Collector::default();
    // Feed in slices so terminations print while the fleet runs.
    let mut fed = 0u64;
    let slice = (options.rate / 4.0).max(1.0) as u64;
    loop {
        let r = feed(
            &mut fleet,
            Target::Kafka {
                producer: &producer,
                routing: routing.clone(),
            },
            options.rate,
            None,
            Some(slice),
            &shutdown,
        )?;
        fed += r.events;
        seen.drain(&rx, &mut report, out, Duration::ZERO)?;
        if r.events == 0 || shutdown.is_triggered() {
            break;
        }
    }
    report.events = fed;
    let truths: Vec<Truth> = fleet.truths().to_vec();
    let settle_until = Instant::now() + options.settle;
    while seen.summaries.len() < truths.len()
        && Instant::now() < settle_until
        && !shutdown.is_triggered()
    {
        seen.drain(&rx, &mut report, out, Duration::from_millis(200))?;
    }
    pipeline_shutdown.trigger();
    let stats = pipeline.join().map_err(|_| DemoError::Panicked)??;
    seen.drain(&rx, &mut report, out, Duration::ZERO)?;
    reader_stop.trigger();
    let _ = reader_thread.join();
    drop(broker);
    drop(state);

    report.pipeline = stats;
    report.tally(&truths, &seen);
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The reader: what a platform's consumer of the output topics sees, on a thread of its
/// own until its stop is triggered.
fn spawn_reader(
    settings: &crate::bus::kafka::settings::KafkaSettings,
    brokers: &str,
) -> Result<(mpsc::Receiver<Seen>, Shutdown, std::thread::JoinHandle<()>), DemoError> {
    let reader: BaseConsumer<ClientErrorsLogged> = client_config(settings, brokers)
        .set("group.id", "loopwarden-demo-reader")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .create_with_context(ClientErrorsLogged("demo reader"))?;
    reader.subscribe(&[
        settings.terminated_topic.as_str(),
        settings.warning_topic.as_str(),
        settings.summary_topic.as_str(),
    ])?;
    let (tx, rx) = mpsc::channel();
    let stop = Shutdown::new();
    let thread = {
        let stop = stop.clone();
        let (t_term, t_warn) = (
            settings.terminated_topic.clone(),
            settings.warning_topic.clone(),
        );
        std::thread::spawn(move || {
            while !stop.is_triggered() {
                let Some(Ok(m)) = reader.poll(Duration::from_millis(100)) else {
                    continue;
                };
                let Ok(v) = serde_json::from_slice::<Value>(m.payload().unwrap_or_default()) else {
                    continue;
                };
                let seen = if m.topic() == t_term {
                    Seen::Terminated(v)
                } else if m.topic() == t_warn {
                    Seen::Warning
                } else {
                    Seen::Summary(v)
                };
                if tx.send(seen).is_err() {
                    break;
                }
            }
        })
    };
    Ok((rx, stop, thread))
}

impl DemoReport {
    /// The sessions' stop reasons, and each simulated session judged against its truth:
    /// a looping one caught (stopped at or after its loop began) or missed, a healthy one
    /// left alone or wrongly stopped.
    fn tally(&mut self, truths: &[Truth], seen: &Collector) {
        let report = self;
        report.sessions = truths.len() as u64;
        for reason in seen.summaries.values() {
            *report.stop_reasons.entry(reason.clone()).or_default() += 1;
        }
        let missing = truths.len().saturating_sub(seen.summaries.len());
        if missing > 0 {
            report
                .stop_reasons
                .insert("(no summary yet)".to_string(), missing as u64);
        }
        for t in truths {
            let stopped = seen.terminations.get(&t.session_id);
            match (t.pattern, stopped) {
                (Some(p), s) => {
                    report.looping += 1;
                    let caught = s.is_some_and(|(_, at)| {
                        at.zip(t.loop_from_event).is_none_or(|(a, from)| a >= from)
                    });
                    let e = report.patterns.entry(p.name().to_string()).or_default();
                    e.0 += 1;
                    if caught {
                        e.1 += 1;
                        report.caught += 1;
                    } else {
                        report.missed += 1;
                    }
                }
                (None, s) => {
                    report.healthy += 1;
                    if s.is_some() {
                        report.wrongly_stopped += 1;
                    }
                }
            }
        }
    }
}

/// The demo's state directory, removed however the demo ends.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn create(name: String) -> Result<TempDir, DemoError> {
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&path).map_err(DemoError::StateDir)?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The outputs read back so far, deduplicated by `event_id`.
#[derive(Default)]
struct Collector {
    /// Session → (detector, index of the triggering event in its session).
    terminations: BTreeMap<String, (String, Option<u32>)>,
    /// Session → stop reason.
    summaries: BTreeMap<String, String>,
    seen_ids: BTreeSet<String>,
}

impl Collector {
    /// Takes what has arrived (waiting up to `wait` for one output when non-zero).
    fn drain(
        &mut self,
        rx: &mpsc::Receiver<Seen>,
        report: &mut DemoReport,
        out: &mut dyn Write,
        wait: Duration,
    ) -> std::io::Result<()> {
        loop {
            let seen = if wait.is_zero() {
                rx.try_recv().ok()
            } else {
                rx.recv_timeout(wait).ok()
            };
            let Some(seen) = seen else { return Ok(()) };
            match seen {
                Seen::Terminated(v) => {
                    let id = v["event_id"].as_str().unwrap_or_default().to_string();
                    if !self.seen_ids.insert(id) {
                        continue;
                    }
                    let session = v["session_id"].as_str().unwrap_or_default().to_string();
                    let detector = v["detector"].as_str().unwrap_or_default().to_string();
                    writeln!(
                        out,
                        "TERMINATED {session:<16} {detector:<18} {}",
                        v["reason"].as_str().unwrap_or_default()
                    )?;
                    let at = event_index(v["trigger"]["event_id"].as_str().unwrap_or_default());
                    self.terminations.insert(session, (detector, at));
                }
                Seen::Warning => report.warnings += 1,
                Seen::Summary(v) => {
                    let id = v["event_id"].as_str().unwrap_or_default().to_string();
                    if !self.seen_ids.insert(id) {
                        continue;
                    }
                    report.summaries += 1;
                    self.summaries.insert(
                        v["session_id"].as_str().unwrap_or_default().to_string(),
                        v["stop_reason"].as_str().unwrap_or_default().to_string(),
                    );
                }
            }
            if !wait.is_zero() {
                return Ok(());
            }
        }
    }
}

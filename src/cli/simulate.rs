//! `loopwarden simulate`: a realistic fleet of agent sessions, produced to a broker or
//! written to a JSON Lines file, with its ground truth.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use loopwarden::bus::kafka;
use loopwarden::config::Config;
use loopwarden::shutdown::Shutdown;
use loopwarden::tools::feed::{
    feed, write_truth, FeedError, FeedProducer, FeedReport, Routing, Target, FILE_CLOCK,
};
use loopwarden::tools::simulate::{Fleet, FleetSpec};

use super::{events_per_second, load_config, on_signals, share};

#[derive(Args)]
pub struct SimulateArgs {
    /// Configuration (its [kafka] section gives the client settings and input topics).
    #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
    config: Option<PathBuf>,
    /// Produce to these brokers (`host:port,…`) instead of writing a file.
    #[arg(long, conflicts_with = "output")]
    brokers: Option<String>,
    /// Put every event on this topic (default: by type onto the configured input topics).
    #[arg(long, requires = "brokers")]
    topic: Option<String>,
    /// JSON Lines output file (`-` for stdout).
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Write the ground truth (which sessions loop, how, from which event) here.
    #[arg(long)]
    truth: Option<PathBuf>,
    #[arg(long, default_value_t = 1000)]
    sessions: u64,
    /// Sessions in flight at once.
    #[arg(long, default_value_t = 100)]
    concurrency: usize,
    /// Share of sessions that fall into a loop (0..1).
    #[arg(long, value_parser = share, default_value_t = 0.2)]
    loop_share: f64,
    /// Events per second (0: as fast as possible).
    #[arg(long, value_parser = events_per_second, default_value_t = 0.0)]
    rate: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(args: SimulateArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(args.config.as_deref())?;
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be > 0");
    let mut fleet = Fleet::new(FleetSpec {
        sessions: args.sessions,
        concurrency: args.concurrency,
        loop_share: args.loop_share,
        seed: args.seed,
    });
    let shutdown = Shutdown::new();
    on_signals(shutdown.clone())?;
    let report = match (&args.brokers, &args.output) {
        (Some(brokers), _) => to_kafka(
            &config,
            brokers,
            args.topic.as_deref(),
            &mut fleet,
            args.rate,
            &shutdown,
        )?,
        (None, Some(path)) => to_file(path, &mut fleet, args.rate, &shutdown)?,
        (None, None) => anyhow::bail!("say where the events go: --brokers or --output"),
    };
    if shutdown.is_triggered() {
        // The events stop mid-session: a ground truth of the sessions started would name
        // ones the output does not hold whole.
        eprintln!(
            "interrupted: simulated {} events of {} sessions; no ground truth written",
            report.events, report.sessions
        );
        return Ok(ExitCode::from(130));
    }
    if let Some(path) = &args.truth {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        );
        write_truth(fleet.truths(), &mut f)?;
    }
    eprintln!(
        "simulated {} events of {} sessions",
        report.events, report.sessions
    );
    Ok(ExitCode::SUCCESS)
}

/// The fleet produced to `brokers`: onto `topic`, or by type onto the input topics.
fn to_kafka(
    config: &Config,
    brokers: &str,
    topic: Option<&str>,
    fleet: &mut Fleet,
    rate: f64,
    shutdown: &Shutdown,
) -> anyhow::Result<FeedReport> {
    let producer: FeedProducer =
        kafka::producer_config(&config.kafka, brokers, config.limits.max_event_bytes)
            .create_with_context(Default::default())
            .context("cannot create the producer")?;
    let routing = match topic {
        Some(t) => Routing::single(t),
        None => Routing::for_inputs(&config.kafka.input_topics),
    };
    let target = Target::Kafka {
        producer: &producer,
        routing,
    };
    Ok(feed(fleet, target, rate, None, None, shutdown)?)
}

/// The fleet written to `path` (`-`: stdout), on the file clock.
fn to_file(
    path: &Path,
    fleet: &mut Fleet,
    rate: f64,
    shutdown: &Shutdown,
) -> anyhow::Result<FeedReport> {
    let mut w: Box<dyn Write> = if path == Path::new("-") {
        Box::new(std::io::BufWriter::new(std::io::stdout().lock()))
    } else {
        Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        ))
    };
    let to_stdout = path == Path::new("-");
    feed(
        fleet,
        Target::Lines(&mut *w),
        rate,
        Some(FILE_CLOCK),
        None,
        shutdown,
    )
    .map_err(|e| match e {
        FeedError::Write(e) if to_stdout => super::stdout_error(e),
        FeedError::Write(e) => {
            anyhow::Error::new(e).context(format!("cannot write {}", path.display()))
        }
        e => e.into(),
    })
}

//! `loopwarden run`: the service. Loads the configuration, starts an embedded broker when
//! no brokers are configured (refusing a state directory an earlier run wrote: the broker
//! starts empty), the telemetry (metrics, spans, the HTTP endpoint) and the pipeline, and
//! stops gracefully on SIGTERM / SIGINT.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;

use loopwarden::bus::kafka::embedded::EmbeddedBroker;
use loopwarden::bus::pipeline;
use loopwarden::config::Config;
use loopwarden::shutdown::Shutdown;
use loopwarden::telemetry::{http, Liveness, Metrics, Spans, Telemetry};

use super::{load_config, on_signals};

#[derive(Args)]
pub struct RunArgs {
    #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
    config: Option<PathBuf>,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    loopwarden::heap::without_transparent_huge_pages();
    #[cfg(feature = "heap-stats")]
    super::heap::log_every_30_secs();
    let config = load_config(args.config.as_deref())?;
    let shutdown = Shutdown::new();
    on_signals(shutdown.clone())?;
    // Kept until the pipeline is done: dropping it stops the broker.
    let (_embedded, brokers) = match &config.kafka.brokers {
        Some(b) => (None, b.clone()),
        None => {
            refuse_state_written_before(&config.state_path)?;
            let (embedded, brokers) = start_embedded_broker(&config)?;
            (Some(embedded), brokers)
        }
    };
    let mut telemetry = Telemetry::new();
    telemetry.metrics = Metrics::with_owner_series_limit(config.telemetry.owner_series_limit);
    telemetry.liveness = Liveness::new(config.state_write_stall);
    telemetry.spans = Spans::start(
        &config.telemetry,
        &config.kafka,
        &brokers,
        telemetry.metrics.spans_dropped.clone(),
    )?;
    let telemetry = Arc::new(telemetry);
    let http = match &config.telemetry.http_listen {
        Some(addr) => Some(http::serve(addr, telemetry.clone(), shutdown.clone())?),
        None => None,
    };
    let result = pipeline::run_observed(config, &brokers, shutdown.clone(), telemetry.clone());
    shutdown.trigger();
    if let Some(spans) = &telemetry.spans {
        spans.shutdown();
    }
    if let Some(server) = http {
        server.join();
    }
    let stats = result?;
    eprintln!(
        "processed {} events ({} skipped as already applied, {} dead-lettered): {} warnings, {} terminations, {} summaries",
        stats.events, stats.skipped, stats.dead_lettered, stats.warnings, stats.terminations, stats.summaries
    );
    Ok(ExitCode::SUCCESS)
}

/// The embedded broker starts empty every time, its offsets from 0, while the state
/// directory keeps the offsets an earlier run applied: every new event up to them would be
/// skipped as already applied (a second `run` in the same directory applied 62 of 3,175).
/// So a state directory that holds anything is refused, with what to do.
fn refuse_state_written_before(state_path: &std::path::Path) -> anyhow::Result<()> {
    let held = std::fs::read_dir(state_path).is_ok_and(|mut entries| entries.next().is_some());
    if held {
        anyhow::bail!(
            "the state at {} was written by an earlier run, but the embedded broker (no \
             kafka.brokers) starts empty: its new events would be skipped as already \
             applied. Remove that directory, or set state.path (LOOPWARDEN_STATE__PATH) to \
             a new one",
            state_path.display()
        );
    }
    Ok(())
}

/// The in-memory broker of a configuration without brokers (for trying loopwarden out),
/// with every topic the run uses, and its address, printed on stdout.
fn start_embedded_broker(config: &Config) -> anyhow::Result<(EmbeddedBroker, String)> {
    let mut topics = config.kafka.all_topics();
    if config.telemetry.spans_to_kafka {
        topics.push(&config.telemetry.spans_topic);
    }
    if let Some(ingest) = &config.ingest {
        topics.extend(ingest.topics.iter().map(String::as_str));
    }
    let embedded = EmbeddedBroker::start(&topics, config.kafka.embedded_partitions)?;
    let b = embedded.bootstrap_servers().to_string();
    // One write, and a closed stdout is not fatal: whoever started us may read the
    // address and hang up, and the service must keep running.
    let banner = format!(
        "embedded broker (in memory, for trying loopwarden out) listening on {b}\n\
         produce events to {} with any Kafka client, e.g.\n  \
         loopwarden simulate --brokers {b} --sessions 100 --rate 500\n",
        config.kafka.input_topics.join(", ")
    );
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout
        .write_all(banner.as_bytes())
        .and_then(|()| stdout.flush())
    {
        tracing::warn!(%error, "cannot print the embedded broker's address");
    }
    Ok((embedded, b))
}

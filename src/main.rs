//! The `loopwarden` command line: `run`, `demo`, `simulate`, `replay`, `backtest`,
//! `eval`, `check-config`, `healthcheck`. Exit codes: 0 done, 1 `eval` cases failed or
//! `healthcheck` unhealthy, 2 any error (the message says what and where), 141 (quiet)
//! when the reader of the output went away, as a SIGPIPE would end it. This file
//! parses the arguments and dispatches; each command is a module of `cli`.

#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// mimalloc rather than the system allocator: replay and the pipeline are faster with
/// it, and scale better over threads (docs/DEVELOPMENT.md, "Performance").
#[cfg(not(feature = "heap-stats"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The diagnostic build: mimalloc, counting the live heap (`cli::heap`).
#[cfg(feature = "heap-stats")]
#[global_allocator]
static GLOBAL: cli::heap::Counting = cli::heap::Counting;

/// loopwarden stops runaway AI agents: it reads agent events (LLM calls and tool calls),
/// detects loops and runaways per session, and emits warnings, terminations and summaries.
#[derive(Parser)]
#[command(name = "loopwarden", version, about, long_about = None)]
struct Cli {
    /// Log format on stderr (`text` for people, `json` for log pipelines); the level
    /// comes from RUST_LOG (default `info`).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "LOOPWARDEN_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Copy, Clone, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Consume agent events from Kafka, publish warnings, terminations and summaries.
    ///
    /// With `kafka.brokers` unset it starts an embedded in-memory broker (for trying it
    /// out) and prints its address. SIGTERM / SIGINT stop it gracefully: it stops
    /// fetching, delivers and stores what it has, commits, and exits 0 within
    /// `kafka.shutdown_deadline_secs`.
    Run(cli::run::RunArgs),
    /// Everything in one process: embedded broker, simulated fleet, the real pipeline;
    /// prints terminations as they happen and a stop-reason table at the end.
    Demo(cli::demo::DemoArgs),
    /// Generate a realistic fleet of agent sessions (healthy ones, and looping ones that
    /// fall into a loop after a healthy start) to a broker or a JSON Lines file.
    ///
    /// Example: loopwarden simulate --sessions 1000 --output fleet.jsonl --truth truth.jsonl
    Simulate(cli::simulate::SimulateArgs),
    /// Run the detectors over a JSON Lines file of events (or `-` for stdin) and print
    /// every warning, termination and session summary as it happens.
    ///
    /// Each line is one input event (DESIGN §1). Bad lines are reported on stderr with
    /// their line number and skipped. The end of the input closes every open session.
    /// Example: loopwarden replay examples/sessions.jsonl --format table
    Replay(cli::replay::ReplayArgs),
    /// What enforcing a configuration would have done to recorded sessions: sessions
    /// warned and killed per detector and per outcome, the kills of successful sessions,
    /// and the spend (tokens, cost, steps) after each kill point.
    ///
    /// Outcomes come from `session.completed` events (`"outcome": "success" | "failure"`)
    /// or, for logs without them, from `--outcomes`. Shadow-mode terminations count as
    /// kill points. Example: loopwarden backtest fleet.jsonl.gz --outcomes outcomes.jsonl
    Backtest(cli::backtest::BacktestArgs),
    /// Check a labelled scenario corpus: per case, whether its expectations hold, then
    /// totals (cases held, false alarms, false kills, late detections).
    ///
    /// Each line is {"id", "events": [...], "expect": {"first_finding_by", "terminate_by",
    /// "max_level"}}. Exits 1 when any case does not hold, so it can gate a config change.
    Eval(cli::eval::EvalArgs),
    /// Validate a configuration file (and LOOPWARDEN_* overrides), report every error at
    /// once, and print the effective configuration.
    CheckConfig(cli::check_config::CheckConfigArgs),
    /// Ask a running `loopwarden run` whether it is alive (`/healthz`) or ready
    /// (`/readyz`): exits 0 on HTTP 2xx, 1 otherwise. For container health checks, where
    /// the image has no curl.
    ///
    /// Example: loopwarden healthcheck --url http://127.0.0.1:9464/readyz
    Healthcheck(cli::healthcheck::HealthcheckArgs),
}

/// Logs on stderr; RUST_LOG wins over `default_level`.
fn init_logs(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // The demo prints its own story on stdout; the pipeline's logs would drown it.
    let default_level = match cli.command {
        Command::Demo(_) => "warn",
        _ => "info",
    };
    init_logs(cli.log_format, default_level);
    match cli.command {
        Command::Run(args) => cli::run::run(args),
        Command::Demo(args) => cli::demo::run(args),
        Command::Simulate(args) => cli::simulate::run(args),
        Command::Replay(args) => cli::replay::run(args),
        Command::Backtest(args) => cli::backtest::run(args),
        Command::Eval(args) => cli::eval::run(args),
        Command::Healthcheck(args) => cli::healthcheck::run(args),
        Command::CheckConfig(args) => cli::check_config::run(args),
    }
}

/// The variables the command line reads (clap's `env`): set but empty, they are taken as
/// unset, as a deployment template that leaves one blank means (clap would refuse the
/// empty value of every command).
const COMMAND_LINE_ENV: [&str; 3] = [
    "LOOPWARDEN_CONFIG",
    "LOOPWARDEN_LOG_FORMAT",
    "LOOPWARDEN_THREADS",
];

fn main() -> ExitCode {
    for name in COMMAND_LINE_ENV {
        if std::env::var_os(name).is_some_and(|v| v.is_empty()) {
            // Before any other thread exists: nothing reads the environment meanwhile.
            std::env::remove_var(name);
        }
    }
    let cli = Cli::parse();
    // Test builds only: crash points armed through the FAILPOINTS environment variable.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    match run(cli) {
        Ok(code) => code,
        // The reader of the output went away (`| head`): quiet, with the status a
        // SIGPIPE gives in a shell (Rust ignores the signal, so the write fails instead).
        Err(e) if output_closed(&e) => ExitCode::from(128 + 13),
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::from(2)
        }
    }
}

/// Whether `e` is standard output's reader gone ([`cli::OutputClosed`]; a broken pipe
/// elsewhere, a socket's, is an error like any other).
fn output_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| cause.is::<cli::OutputClosed>())
}

/// An error and its causes on one line, each cause said once: many errors name their
/// cause in their own message already (`{e:#}` would say it twice).
fn error_chain(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_says_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("kafka client: {0}")]
        struct Wrapping(#[from] std::io::Error);
        let io = || std::io::Error::other("broker down");
        let e = anyhow::Error::from(Wrapping(io())).context("cannot start");
        assert_eq!(error_chain(&e), "cannot start: kafka client: broker down");
        let plain = anyhow::Error::from(io()).context("cannot read x");
        assert_eq!(error_chain(&plain), "cannot read x: broker down");
    }
}

//! `loopwarden backtest`: what enforcing a configuration would have done to recorded
//! sessions with known outcomes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use loopwarden::tools::backtest::{backtest, Outcomes};
use loopwarden::tools::driver::input::open_input;

use super::{load_config, FormatArg, InputOptions};

#[derive(Args)]
pub struct BacktestArgs {
    /// JSON Lines file of events (`.gz` is read compressed), or `-` for standard input.
    input: PathBuf,
    #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
    config: Option<PathBuf>,
    /// JSON Lines of {"session_id": …, "outcome": "success" | "failure"}.
    #[arg(long)]
    outcomes: Option<PathBuf>,
    /// A table for people, or the report as one JSON object.
    #[arg(long, value_enum, default_value = "table")]
    format: FormatArg,
    #[command(flatten)]
    reading: InputOptions,
}

pub fn run(args: BacktestArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(args.config.as_deref())?;
    let is_stdin = |p: &Path| {
        p == Path::new("-") || p == Path::new("/dev/stdin") || p == Path::new("/proc/self/fd/0")
    };
    if is_stdin(&args.input) && args.outcomes.as_deref().is_some_and(is_stdin) {
        anyhow::bail!("the events and --outcomes cannot both be read from standard input");
    }
    let outcomes = match &args.outcomes {
        Some(path) => Outcomes::read(&mut *open_input(path)?)
            .with_context(|| format!("in {}", path.display()))?,
        None => Outcomes::default(),
    };
    let mut events = args.reading.open(&args.input, &config)?;
    let threads = args.reading.threads()?;
    let report = backtest(
        config,
        events.input(),
        &outcomes,
        &mut std::io::stderr(),
        threads,
    )
    .map_err(|e| super::drive_error(e, &args.input))?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match args.format {
        FormatArg::Table => report.write_table(&mut out).map_err(super::stdout_error)?,
        FormatArg::Json => writeln!(out, "{}", serde_json::to_string_pretty(&report)?)
            .map_err(super::stdout_error)?,
    }
    Ok(ExitCode::SUCCESS)
}

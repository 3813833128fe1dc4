//! `loopwarden replay`: the detectors over a file of events, every output printed as it
//! happens.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use loopwarden::driver::input::open_events;
use loopwarden::replay::{replay, Format, ReplayOptions};

use super::{load_config, threads_or_cores, FormatArg, InputArg};

#[derive(Args)]
pub struct ReplayArgs {
    /// JSON Lines file of events, or `-` for standard input.
    input: PathBuf,
    /// Configuration file (defaults to the built-in defaults; LOOPWARDEN_* variables apply).
    #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
    config: Option<PathBuf>,
    /// Output format: one JSON object a line, or a readable table.
    #[arg(long, value_enum, default_value = "json")]
    format: FormatArg,
    /// Stop at the first bad line instead of skipping it.
    #[arg(long)]
    strict: bool,
    /// Worker threads, sessions split between them, 1 to 256 (default: the cores
    /// available, at most 256).
    /// The output is the same for any number.
    #[arg(long, env = "LOOPWARDEN_THREADS")]
    threads: Option<usize>,
    /// What the input holds: loopwarden events, or OTLP JSON trace exports (mapped as
    /// `[ingest.otlp]` maps them); `auto` tells them apart by the first line that is not blank.
    #[arg(long, value_enum, default_value = "auto")]
    input_format: InputArg,
    /// Read a file with read calls instead of mapping it into memory. Use it for a
    /// file that may change during the run: mapped, a file cut short (e.g. rotated
    /// with copytruncate) or failing on disk ends the process with SIGBUS, one
    /// rewritten in place may be read half old, half new, and one that grows is read
    /// only up to its size at the start.
    #[arg(long)]
    no_mmap: bool,
}

pub fn run(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(args.config.as_deref())?;
    let mut events = open_events(
        &args.input,
        args.input_format.into(),
        &config,
        !args.no_mmap,
    )?;
    let options = ReplayOptions {
        threads: threads_or_cores(args.threads)?,
        strict: args.strict,
        ..ReplayOptions::default()
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut err = std::io::stderr();
    let format = match args.format {
        FormatArg::Json => Format::Json,
        FormatArg::Table => Format::Table,
    };
    let report = replay(config, events.input(), &mut out, &mut err, format, options)?;
    drop(out);
    eprintln!("{report}");
    Ok(ExitCode::SUCCESS)
}

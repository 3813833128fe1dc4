//! `loopwarden replay`: the detectors over a file of events, every output printed as it
//! happens.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use loopwarden::tools::replay::{replay, Format, ReplayOptions};

use super::{load_config, FormatArg, InputOptions};

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
    #[command(flatten)]
    reading: InputOptions,
}

pub fn run(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(args.config.as_deref())?;
    let mut events = args.reading.open(&args.input, &config)?;
    let options = ReplayOptions {
        threads: args.reading.threads()?,
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
    let report = replay(config, events.input(), &mut out, &mut err, format, options)
        .map_err(|e| super::drive_error(e, &args.input))?;
    drop(out);
    eprintln!("{report}");
    Ok(ExitCode::SUCCESS)
}

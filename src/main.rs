//! The `loopwarden` command line: `replay`, `eval`, `check-config`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};

use loopwarden::config::Config;
use loopwarden::eval::run_corpus;
use loopwarden::replay::{replay, Format};

/// loopwarden stops runaway AI agents: it reads agent events (LLM calls and tool calls),
/// detects loops and runaways per session, and emits warnings, terminations and summaries.
#[derive(Parser)]
#[command(name = "loopwarden", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Copy, Clone, ValueEnum)]
enum FormatArg {
    Json,
    Table,
}

#[derive(Subcommand)]
enum Command {
    /// Run the detectors over a JSON Lines file of events (or `-` for stdin) and print
    /// every warning, termination and session summary as it happens.
    ///
    /// Each line is one input event (DESIGN §1). Bad lines are reported on stderr with
    /// their line number and skipped. The end of the input closes every open session.
    /// Example: loopwarden replay examples/sessions.jsonl --format table
    Replay {
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
    },
    /// Check a labelled scenario corpus: per case, whether its expectations hold, then
    /// totals (cases held, false alarms, false kills, late detections).
    ///
    /// Each line is {"id", "events": [...], "expect": {"first_finding_by", "terminate_by",
    /// "max_level"}}. Exits 1 when any case does not hold, so it can gate a config change.
    Eval {
        /// The corpus, one case per line.
        corpus: PathBuf,
        #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
        config: Option<PathBuf>,
        /// Also list every finding of every case.
        #[arg(long, short)]
        verbose: bool,
    },
    /// Validate a configuration file (and LOOPWARDEN_* overrides), report every error at
    /// once, and print the effective configuration.
    CheckConfig {
        /// The file to check; without it, the built-in defaults plus the environment.
        file: Option<PathBuf>,
    },
}

fn load_config(path: Option<&Path>) -> anyhow::Result<Arc<Config>> {
    let env = std::env::vars();
    let config = match path {
        Some(p) => Config::load(p, env)?,
        None => Config::from_toml_str("", "defaults", env)?,
    };
    Ok(Arc::new(config))
}

fn open_input(path: &Path) -> anyhow::Result<Box<dyn BufRead>> {
    if path == Path::new("-") {
        Ok(Box::new(BufReader::with_capacity(
            1 << 16,
            std::io::stdin(),
        )))
    } else {
        let f =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        Ok(Box::new(BufReader::with_capacity(1 << 16, f)))
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Replay {
            input,
            config,
            format,
            strict,
        } => {
            let config = load_config(config.as_deref())?;
            let mut reader = open_input(&input)?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
            let mut err = std::io::stderr();
            let format = match format {
                FormatArg::Json => Format::Json,
                FormatArg::Table => Format::Table,
            };
            let report = replay(config, &mut reader, &mut out, &mut err, format, strict)?;
            drop(out);
            eprintln!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval {
            corpus,
            config,
            verbose,
        } => {
            let config = load_config(config.as_deref())?;
            let mut reader = open_input(&corpus)?;
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            let totals = run_corpus(&config, &mut reader, |r| {
                let _ = match r {
                    Ok(c) if c.held => writeln!(out, "held    {}", c.id),
                    Ok(c) => writeln!(out, "FAILED  {}: {}", c.id, c.failures.join("; ")),
                    Err((line, ref e)) => writeln!(out, "UNREADABLE line {line}: {e}"),
                };
                if verbose {
                    if let Ok(c) = r {
                        for (at, det, level) in &c.findings {
                            let _ = writeln!(out, "          event {at}: {det} {}", level.name());
                        }
                    }
                }
            })?;
            writeln!(out, "{totals}")?;
            Ok(if totals.held == totals.cases && totals.bad_lines == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::CheckConfig { file } => {
            let config = load_config(file.as_deref())?;
            print!("{}", config.effective_toml());
            eprintln!("configuration is valid");
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

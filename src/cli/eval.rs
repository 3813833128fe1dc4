//! `loopwarden eval`: a labelled scenario corpus checked case by case; exits 1 when a
//! case does not hold.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use loopwarden::tools::driver::input::open_input;
use loopwarden::tools::eval::run_corpus;

use super::load_config;

#[derive(Args)]
pub struct EvalArgs {
    /// The corpus, one case per line.
    corpus: PathBuf,
    #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
    config: Option<PathBuf>,
    /// Also list every finding of every case.
    #[arg(long, short)]
    verbose: bool,
}

pub fn run(args: EvalArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(args.config.as_deref())?;
    let mut reader = open_input(&args.corpus)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let totals = run_corpus(&config, &mut reader, |r| {
        let _ = match r {
            Ok(c) if c.held => writeln!(out, "held    {}", c.id),
            Ok(c) => writeln!(out, "FAILED  {}: {}", c.id, c.failures.join("; ")),
            Err((line, ref e)) => writeln!(out, "UNREADABLE line {line}: {e}"),
        };
        if args.verbose {
            if let Ok(c) = r {
                for (at, det, level) in &c.findings {
                    let _ = writeln!(out, "          event {at}: {det} {}", level.name());
                }
            }
        }
    })?;
    writeln!(out, "{totals}").map_err(super::stdout_error)?;
    if totals.cases == 0 && totals.bad_lines == 0 {
        // An empty corpus (a wrong path to an empty file, a pipe that gave nothing)
        // proves nothing: not a pass.
        eprintln!(
            "error: {} holds no case",
            loopwarden::tools::driver::input::input_name(&args.corpus)
        );
        return Ok(ExitCode::from(1));
    }
    Ok(if totals.held == totals.cases && totals.bad_lines == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

//! `loopwarden check-config`: a configuration validated (every error at once) and its
//! effective values printed.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::load_config;

#[derive(Args)]
pub struct CheckConfigArgs {
    /// The file to check (it wins over `--config`); without either, the built-in
    /// defaults plus the environment.
    file: Option<PathBuf>,
    /// The file to check, named as the other commands take it.
    #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
    config: Option<PathBuf>,
}

pub fn run(args: CheckConfigArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(args.file.or(args.config).as_deref())?;
    write!(std::io::stdout().lock(), "{}", config.effective_toml()).map_err(super::stdout_error)?;
    eprintln!("configuration is valid");
    Ok(ExitCode::SUCCESS)
}

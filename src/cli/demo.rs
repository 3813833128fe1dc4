//! `loopwarden demo`: an embedded broker, a simulated fleet and the real pipeline in one
//! process, telling the story on stdout.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use loopwarden::shutdown::Shutdown;
use loopwarden::tools::demo::{demo, DemoOptions};
use loopwarden::tools::simulate::FleetSpec;

use super::{events_per_second, load_config, on_signals, share};

#[derive(Args)]
pub struct DemoArgs {
    #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
    config: Option<PathBuf>,
    /// Sessions to simulate.
    #[arg(long, default_value_t = 300)]
    sessions: u64,
    /// Events per second.
    #[arg(long, value_parser = events_per_second, default_value_t = 3000.0)]
    rate: f64,
    /// Share of sessions that fall into a loop (0..1).
    #[arg(long, value_parser = share, default_value_t = 0.3)]
    loop_share: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(args.config.as_deref())?;
    let shutdown = Shutdown::new();
    on_signals(shutdown.clone())?;
    let options = DemoOptions {
        fleet: FleetSpec {
            sessions: args.sessions,
            concurrency: 60,
            loop_share: args.loop_share,
            seed: args.seed,
        },
        rate: args.rate,
        settle: std::time::Duration::from_secs(30),
    };
    let stdout = std::io::stdout();
    let report = demo(config, options, &mut stdout.lock(), shutdown)?;
    writeln!(stdout.lock(), "{report}").map_err(super::stdout_error)?;
    Ok(ExitCode::SUCCESS)
}

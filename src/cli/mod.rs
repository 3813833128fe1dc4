//! The commands of the `loopwarden` binary, one module each (`main.rs` parses the
//! arguments and dispatches), and what they share: loading the configuration with the
//! environment, the `--threads` rule, the input arguments of the file-driven commands,
//! and stopping on signals.

pub mod backtest;
pub mod check_config;
pub mod demo;
pub mod eval;
pub mod healthcheck;
#[cfg(feature = "heap-stats")]
pub mod heap;
pub mod replay;
pub mod run;
pub mod simulate;

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use clap::ValueEnum;

use loopwarden::config::Config;
use loopwarden::shutdown::Shutdown;
use loopwarden::tools::driver::input::{input_name, open_events, Events, InputFormat};
use loopwarden::tools::driver::DriveError;

/// How `replay` and `backtest` print.
#[derive(Copy, Clone, ValueEnum)]
pub enum FormatArg {
    Json,
    Table,
}

/// What an input file holds.
#[derive(Copy, Clone, ValueEnum)]
pub enum InputArg {
    /// OTLP JSON when the first line that is not blank is a trace export
    /// (`{"resourceSpans": …`), else events.
    Auto,
    /// loopwarden events, one JSON object a line.
    Events,
    /// OTLP JSON trace exports, one a line (the Collector's file exporter).
    OtlpJson,
}

impl From<InputArg> for InputFormat {
    fn from(arg: InputArg) -> InputFormat {
        match arg {
            InputArg::Auto => InputFormat::Auto,
            InputArg::Events => InputFormat::Events,
            InputArg::OtlpJson => InputFormat::OtlpJson,
        }
    }
}

/// How `replay` and `backtest` read their events.
#[derive(clap::Args)]
pub struct InputOptions {
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

impl InputOptions {
    /// The events of `path` (see [`open_events`]).
    pub fn open(&self, path: &Path, config: &Config) -> anyhow::Result<Events> {
        Ok(open_events(
            path,
            self.input_format.into(),
            config,
            !self.no_mmap,
        )?)
    }

    /// `--threads`, or every core available.
    pub fn threads(&self) -> anyhow::Result<usize> {
        threads_or_cores(self.threads)
    }
}

/// A share, 0..=1 (for `--loop-share`).
pub fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a share between 0 and 1")),
    }
}

/// `--rate`: events per second, 0 (as fast as possible) or from one every 1,000 s to a
/// billion (a rate that is not a number, or so small that the schedule overflows, would
/// panic the pacing).
pub fn events_per_second(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v == 0.0 || (1e-3..=1e9).contains(&v) => Ok(v),
        _ => Err(format!(
            "`{s}` is not a rate: 0 (as fast as possible) or 0.001 to 1e9 events a second"
        )),
    }
}

/// Standard output's reader went away (`… | head`): the command ends quietly, with the
/// status a SIGPIPE gives (`main`; Rust ignores the signal, so the write fails instead).
#[derive(Debug, thiserror::Error)]
#[error("standard output was closed")]
pub struct OutputClosed;

/// A failed write to standard output: [`OutputClosed`] when its reader went away.
pub fn stdout_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        OutputClosed.into()
    } else {
        anyhow::Error::new(e).context("cannot write to standard output")
    }
}

/// A drive's error, with the input named when reading it failed (a gzip stream corrupt
/// past its start, a disk error): the driver reads a stream and does not know its name.
pub fn drive_error(e: DriveError, input: &Path) -> anyhow::Error {
    match e {
        DriveError::Read { .. } => {
            let name = input_name(input);
            anyhow::Error::new(e).context(format!("cannot read {name}"))
        }
        DriveError::Write(e) => stdout_error(e),
        e => e.into(),
    }
}

pub fn load_config(path: Option<&Path>) -> anyhow::Result<Arc<Config>> {
    let env = config_env(std::env::vars_os())?.into_iter();
    let config = match path {
        Some(p) => Config::load(p, env)?,
        None => Config::from_toml_str("", "defaults", env)?,
    };
    Ok(Arc::new(config))
}

/// The process environment as the configuration reads it: a `LOOPWARDEN_…` variable whose
/// name or value is not UTF-8 is an error naming it; any other such variable is none of
/// the configuration's business and is passed over (`std::env::vars` would panic on it).
pub fn config_env(
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> anyhow::Result<Vec<(String, String)>> {
    use loopwarden::config::{ENV_PREFIX, RESERVED_ENV, RESERVED_ENV_PREFIX};
    let mut env = Vec::new();
    for (name, value) in vars {
        let bytes = name.as_encoded_bytes();
        // The command line's and the tools' own variables are not configuration keys
        // (`LOOPWARDEN_CONFIG` may name a path that is not UTF-8).
        let reserved = RESERVED_ENV.iter().any(|r| r.as_bytes() == bytes)
            || bytes.starts_with(RESERVED_ENV_PREFIX.as_bytes());
        let ours = bytes.starts_with(ENV_PREFIX.as_bytes()) && !reserved;
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => env.push((name, value)),
            (Ok(name), Err(_)) if ours => {
                anyhow::bail!("environment variable {name}: its value is not UTF-8")
            }
            (Err(name), _) if ours => anyhow::bail!(
                "environment variable {}: its name is not UTF-8",
                name.to_string_lossy()
            ),
            _ => {}
        }
    }
    Ok(env)
}

/// `--threads`, or every core available.
pub fn threads_or_cores(threads: Option<usize>) -> anyhow::Result<usize> {
    match threads {
        Some(0) => anyhow::bail!("--threads must be at least 1"),
        Some(n) if n > loopwarden::tools::driver::MAX_THREADS => anyhow::bail!(
            "--threads must be at most {} (it was {n})",
            loopwarden::tools::driver::MAX_THREADS
        ),
        Some(n) => Ok(n),
        None => Ok(loopwarden::tools::driver::available_threads()),
    }
}

/// SIGTERM / SIGINT trigger `shutdown`; a second signal exits at once.
pub fn on_signals(shutdown: Shutdown) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the signal runtime")?;
    // Registered before returning, so no signal falls into the default (kill) action.
    let (mut term, mut int) = rt.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        ))
    })?;
    std::thread::spawn(move || {
        rt.block_on(async move {
            for received in 0..2 {
                let name = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                };
                // The second signal, not the first after a stop the process began itself
                // (a worker's error): that one still gets the clean stop under way.
                if received > 0 {
                    tracing::warn!(signal = name, "second signal: exiting now");
                    std::process::exit(130);
                }
                tracing::info!(signal = name, "shutting down");
                shutdown.trigger();
            }
        })
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_one_to_the_most_a_drive_takes() {
        assert_eq!(threads_or_cores(Some(3)).unwrap(), 3);
        let max = loopwarden::tools::driver::MAX_THREADS;
        assert_eq!(threads_or_cores(Some(max)).unwrap(), max);
        for bad in [0, max + 1, 100_000] {
            assert!(threads_or_cores(Some(bad)).is_err(), "{bad}");
        }
        let cores = threads_or_cores(None).unwrap();
        assert!((1..=max).contains(&cores), "{cores}");
    }

    #[test]
    fn the_environment_is_read_without_panicking_on_bytes_that_are_not_utf8() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;
        let var = |name: &[u8], value: &[u8]| {
            (
                OsString::from_vec(name.to_vec()),
                OsString::from_vec(value.to_vec()),
            )
        };
        // Someone else's variable that is not UTF-8: passed over.
        let env = config_env(
            [
                var(b"X", b"\xff"),
                var(b"\xfe", b"1"),
                var(b"LOOPWARDEN_MODE", b"warn"),
            ]
            .into_iter(),
        )
        .unwrap();
        assert_eq!(env, vec![("LOOPWARDEN_MODE".into(), "warn".into())]);
        // Ours: an error that names it.
        let err = config_env([var(b"LOOPWARDEN_MODE", b"w\xffrn")].into_iter()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "environment variable LOOPWARDEN_MODE: its value is not UTF-8"
        );
        let err = config_env([var(b"LOOPWARDEN_\xff", b"1")].into_iter()).unwrap_err();
        assert!(err.to_string().contains("its name is not UTF-8"), "{err}");
        // A reserved variable naming a path that is not UTF-8: none of the config's.
        let env =
            config_env([var(b"LOOPWARDEN_CONFIG", b"/etc/caf\xe9.toml")].into_iter()).unwrap();
        assert!(env.is_empty(), "{env:?}");
    }
}

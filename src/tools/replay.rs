//! `loopwarden replay`: the engine over a JSON Lines file or stdin, with the in-memory
//! store, printing every output as it happens.
//!
//! Guarantees: memory is constant in the input's length (batches of lines, bounded state
//! per open session); a bad line is reported with its line number and reason, counted and
//! skipped (or fatal with `strict`); the end of input closes every open session; the
//! output is the same for any number of threads ([`crate::tools::driver`]).

use std::io::Write;
use std::sync::Arc;

use crate::config::Config;
use crate::contract::output::Output;
use crate::tools::driver::{drive, DriveError, Input, Options};

/// How outputs are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Json,
    Table,
}

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayReport {
    pub lines: u64,
    pub events: u64,
    pub bad_lines: u64,
    pub warnings: u64,
    pub terminations: u64,
    pub summaries: u64,
    pub shadow_findings: u64,
}

impl std::fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "replayed {} events from {} lines ({} bad): {} warnings, {} terminations, {} sessions closed, {} shadow findings",
            self.events, self.lines, self.bad_lines, self.warnings, self.terminations, self.summaries, self.shadow_findings
        )
    }
}

fn table_header(out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<24} {:<20} {:<18} {:<10} {:<19} REASON",
        "EVENT TIME", "SESSION", "OUTPUT", "LEVEL", "DETECTOR"
    )
}

/// `s` shown (control characters escaped) in at most `n` characters.
fn cut(s: &str, n: usize) -> String {
    let s = crate::contract::event::printable(s);
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

fn write_output(o: &Output, format: Format, out: &mut dyn Write) -> std::io::Result<()> {
    match format {
        Format::Json => writeln!(out, "{}", o.to_json()),
        Format::Table => match o {
            Output::Finding(f) => {
                let level = if f.mode == crate::engine::levels::Mode::Shadow {
                    format!("{}*", f.level.name())
                } else {
                    f.level.name().to_string()
                };
                writeln!(
                    out,
                    "{:<24} {:<20} {:<18} {:<10} {:<19} {}",
                    f.event_time,
                    cut(&f.session_id, 20),
                    f.kind,
                    level,
                    f.detector.name(),
                    crate::contract::event::printable(&f.reason)
                )
            }
            Output::Summary(s) => writeln!(
                out,
                "{:<24} {:<20} {:<18} {:<10} {:<19} stop_reason={} turns={} tool_calls={}",
                s.ended_at,
                cut(&s.session_id, 20),
                s.kind,
                "-",
                "-",
                s.stop_reason,
                s.stats.turns,
                s.stats.tool_calls
            ),
        },
    }
}

/// Replays `input` through fresh engines on `threads` threads (sessions split between
/// them; the output is the same for any number), writing outputs to `out` and bad-line
/// reports to `errors`.
pub fn replay(
    config: Arc<Config>,
    input: Input<'_>,
    out: &mut dyn Write,
    errors: &mut dyn Write,
    format: Format,
    options: ReplayOptions,
) -> Result<ReplayReport, DriveError> {
    let mut report = ReplayReport::default();
    if format == Format::Table {
        table_header(out).map_err(DriveError::Write)?;
    }
    let drive_options = Options {
        threads: options.threads,
        strict: options.strict,
        ordered_outputs: true,
        render_json: format == Format::Json,
        batch_bytes: options.batch_bytes,
    };
    let (read, _) = drive(
        config,
        input,
        errors,
        drive_options,
        || (),
        |outputs| {
            for (o, json) in outputs.iter() {
                match o {
                    Output::Finding(f) if f.mode == crate::engine::levels::Mode::Shadow => {
                        report.shadow_findings += 1
                    }
                    Output::Finding(f) if f.stop_reason.is_some() => report.terminations += 1,
                    Output::Finding(_) => report.warnings += 1,
                    Output::Summary(_) => report.summaries += 1,
                }
                let written = match format {
                    // Rendered on the shards' threads.
                    Format::Json => out
                        .write_all(json.as_bytes())
                        .and_then(|_| out.write_all(b"\n")),
                    Format::Table => write_output(o, format, out),
                };
                written.map_err(DriveError::Write)?;
            }
            Ok(())
        },
    )?;
    out.flush().map_err(DriveError::Write)?;
    report.lines = read.lines;
    report.events = read.events;
    report.bad_lines = read.bad_lines;
    Ok(report)
}

/// How a replay runs.
#[derive(Debug, Clone, Copy)]
pub struct ReplayOptions {
    /// Worker threads (see [`crate::tools::driver`]: four engines a thread when more
    /// than one).
    pub threads: usize,
    /// Stop at the first bad line.
    pub strict: bool,
    /// Bytes read per batch (default: [`crate::tools::driver::batch_bytes_for`] the
    /// threads).
    pub batch_bytes: Option<usize>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            threads: 1,
            strict: false,
            batch_bytes: None,
        }
    }
}

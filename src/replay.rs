//! `loopwarden replay`: the engine over a JSON Lines file or stdin, with the in-memory
//! store, printing every output as it happens.
//!
//! Guarantees: memory is constant in the input's length (one line buffer, bounded state
//! per open session); a bad line is reported with its line number and reason, counted and
//! skipped (or fatal with `strict`); the end of input closes every open session.

use std::io::{BufRead, Write};
use std::sync::Arc;

use crate::config::Config;
use crate::engine::{Engine, EventMeta};
use crate::event::{parse_event, Event};
use crate::output::{ClosedBy, Output};

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

/// Why a replay stopped early (fatal).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("reading input failed: {0}")]
    Read(std::io::Error),
    #[error("writing output failed: {0}")]
    Write(std::io::Error),
    #[error("line {line}: {reason} (stopping: --strict)")]
    BadLine { line: u64, reason: String },
}

fn table_header(out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<24} {:<20} {:<18} {:<10} {:<19} REASON",
        "EVENT TIME", "SESSION", "OUTPUT", "LEVEL", "DETECTOR"
    )
}

fn cut(s: &str, n: usize) -> String {
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
                let level = if f.mode == crate::policy::Mode::Shadow {
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
                    f.reason
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

/// What the driving loop read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Read {
    pub lines: u64,
    pub events: u64,
    pub bad_lines: u64,
}

/// One step of a drive: an event the engine applied, or the end of the input.
pub enum Step<'a> {
    /// An event, whether the engine dropped it as an exact duplicate, and what it caused.
    Event { event: &'a Event, duplicate: bool },
    /// The end of the input: every open session was closed.
    End,
}

/// Runs the JSON Lines events of `input` through a fresh engine (event time is the
/// events' own), calling `on` with each step and the outputs it caused (which `on` may
/// drain). Bad lines are reported to `errors` with their line number and skipped, or are
/// fatal with `strict`.
pub fn drive(
    config: Arc<Config>,
    input: &mut dyn BufRead,
    errors: &mut dyn Write,
    strict: bool,
    mut on: impl FnMut(Step<'_>, &mut Vec<Output>) -> Result<(), ReplayError>,
) -> Result<Read, ReplayError> {
    let limits = config.limits;
    let mut engine = Engine::new(config);
    let mut read = Read::default();
    let mut line = Vec::with_capacity(4096);
    let mut outputs = Vec::new();
    let meta = EventMeta::default();
    loop {
        line.clear();
        let n = input
            .read_until(b'\n', &mut line)
            .map_err(ReplayError::Read)?;
        if n == 0 {
            break;
        }
        read.lines += 1;
        let trimmed = trim_line(&line);
        if trimmed.is_empty() {
            continue;
        }
        match parse_event(trimmed, &limits) {
            Ok(event) => {
                read.events += 1;
                let duplicates = engine.counters().duplicates;
                engine.process(&event, &meta, &mut outputs);
                let duplicate = engine.counters().duplicates > duplicates;
                on(
                    Step::Event {
                        event: &event,
                        duplicate,
                    },
                    &mut outputs,
                )?;
            }
            Err(e) => {
                read.bad_lines += 1;
                if strict {
                    return Err(ReplayError::BadLine {
                        line: read.lines,
                        reason: e.to_string(),
                    });
                }
                let _ = writeln!(errors, "line {}: {} ({})", read.lines, e, e.reason());
            }
        }
    }
    engine.close_all(ClosedBy::EndOfInput, &mut outputs);
    on(Step::End, &mut outputs)?;
    Ok(read)
}

/// Replays `input` through a fresh engine, writing outputs to `out` and bad-line reports
/// to `errors`.
pub fn replay(
    config: Arc<Config>,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
    errors: &mut dyn Write,
    format: Format,
    strict: bool,
) -> Result<ReplayReport, ReplayError> {
    let mut report = ReplayReport::default();
    if format == Format::Table {
        table_header(out).map_err(ReplayError::Write)?;
    }
    let read = drive(config, input, errors, strict, |_, outputs| {
        for o in outputs.drain(..) {
            match &o {
                Output::Finding(f) if f.mode == crate::policy::Mode::Shadow => {
                    report.shadow_findings += 1
                }
                Output::Finding(f) if f.stop_reason.is_some() => report.terminations += 1,
                Output::Finding(_) => report.warnings += 1,
                Output::Summary(_) => report.summaries += 1,
            }
            write_output(&o, format, out).map_err(ReplayError::Write)?;
        }
        Ok(())
    })?;
    out.flush().map_err(ReplayError::Write)?;
    report.lines = read.lines;
    report.events = read.events;
    report.bad_lines = read.bad_lines;
    Ok(report)
}

fn trim_line(line: &[u8]) -> &[u8] {
    let mut end = line.len();
    while end > 0 && matches!(line[end - 1], b'\n' | b'\r' | b' ' | b'\t') {
        end -= 1;
    }
    let mut start = 0;
    while start < end && matches!(line[start], b' ' | b'\t') {
        start += 1;
    }
    &line[start..end]
}

//! `loopwarden backtest`: what enforcing a configuration would have done to a recorded
//! set of sessions, told apart by their outcome — the report a platform engineer reads
//! before switching `enforce` on.
//!
//! For every session it follows the spend (tokens, cost, steps, tool calls) from the
//! recorded events themselves, and the first termination the engine emits (in `shadow`
//! mode too: a shadow termination is where enforcing would have stopped it). Everything a
//! session spent after its kill point is what the kill would have saved — or, in a
//! successful session, a success it would have cost.
//!
//! Guarantees: the same engine and event-time rules as `replay` (the findings are
//! `replay`'s); memory is bounded by the open sessions plus one row per killed successful
//! session; an exact duplicate event among its session's recent ones is not counted
//! twice (one redelivered after its session closed opens a session of its own, as in
//! `replay`); a `warn` configuration is judged as its `shadow` twin, and nothing a
//! session says past its kill point is counted.

use std::io::{BufRead, Write};
use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::hash_map::Entry;

use crate::config::Config;
use crate::contract::event::{printable, without_byte_order_mark, Event, EventBody, Outcome};
use crate::contract::output::Output;
use crate::engine::detectors::{DetectorKind, DETECTOR_COUNT};
use crate::engine::levels::Level;
use crate::tools::driver::{drive, DriveError, Input, Options, Sink, Step};

/// Outcomes given beside the events (`--outcomes`), for logs whose `session.completed`
/// events do not carry one. An outcome on the event wins.
#[derive(Debug, Clone, Default)]
pub struct Outcomes(FxHashMap<String, Given>);

/// One session's outcome as given, and its place in the file (which entry a run used).
#[derive(Debug, Clone, Copy)]
struct Given {
    outcome: Outcome,
    entry: usize,
    line: u64,
}

/// Why an outcomes file was refused (fatal).
#[derive(Debug, thiserror::Error)]
pub enum OutcomesError {
    // The cause is said by the error chain (`{:#}`), not twice.
    #[error("reading outcomes failed")]
    Read(#[from] std::io::Error),
    #[error("outcomes line {line}: {reason} (expected {{\"session_id\": \"…\", \"outcome\": \"success\" | \"failure\"}})")]
    BadLine { line: u64, reason: String },
}

impl Outcomes {
    /// Reads JSON Lines of `{"session_id": …, "outcome": "success" | "failure"}`. A
    /// session named twice must be given the same outcome both times: which of two
    /// contradicting ones is true, the backtest cannot tell.
    pub fn read(input: &mut dyn BufRead) -> Result<Outcomes, OutcomesError> {
        #[derive(serde::Deserialize)]
        struct Line {
            session_id: String,
            outcome: String,
        }
        let mut map = FxHashMap::default();
        // Lines as bytes: one that is not UTF-8 is a bad line that says where, not a
        // read error that does not.
        for (i, line) in input.split(b'\n').enumerate() {
            let line = line?;
            if line.trim_ascii().is_empty() {
                continue;
            }
            let bad = |reason: String| OutcomesError::BadLine {
                line: i as u64 + 1,
                reason,
            };
            let parsed: Line = serde_json::from_slice(without_byte_order_mark(&line))
                .map_err(|e| bad(e.to_string()))?;
            let outcome = Outcome::parse(&parsed.outcome)
                .ok_or_else(|| bad(format!("unknown outcome \"{}\"", parsed.outcome)))?;
            let line = i as u64 + 1;
            let entry = map.len();
            match map.entry(parsed.session_id) {
                Entry::Vacant(v) => {
                    v.insert(Given {
                        outcome,
                        entry,
                        line,
                    });
                }
                Entry::Occupied(o) if o.get().outcome == outcome => {}
                Entry::Occupied(o) => {
                    return Err(bad(format!(
                        "session \"{}\" is \"{}\" here but \"{}\" on line {}",
                        printable(o.key()),
                        outcome.name(),
                        o.get().outcome.name(),
                        o.get().line
                    )))
                }
            }
        }
        Ok(Outcomes(map))
    }

    fn get(&self, session: &str) -> Option<&Given> {
        self.0.get(session)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What sessions spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Spend {
    /// Tokens paid for at the full price: uncached input plus output.
    pub tokens: u64,
    /// Input tokens read from the provider's cache.
    pub cached_tokens: u64,
    /// Cost in billionths of a dollar: an exact sum, the same in whatever order sessions
    /// are added (shards add theirs in another order than one thread would).
    #[serde(rename = "cost_usd", serialize_with = "nanos_as_usd")]
    pub cost_nanos: i64,
    /// LLM calls.
    pub steps: u64,
    pub tool_calls: u64,
}

fn nanos_as_usd<S: serde::Serializer>(nanos: &i64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(*nanos as f64 / 1e9)
}

impl Spend {
    pub fn cost_usd(&self) -> f64 {
        self.cost_nanos as f64 / 1e9
    }

    // Every sum saturates (at 2^64 - 1 tokens, ~9.2 billion USD): events may carry any
    // count, and a total must never wrap around to a small or negative one.
    fn add_event(&mut self, event: &Event) {
        match &event.body {
            EventBody::LlmCall(c) => {
                let cached = c.cache_read_tokens.unwrap_or(0).min(c.input_tokens);
                let paid = (c.input_tokens - cached).saturating_add(c.output_tokens);
                self.tokens = self.tokens.saturating_add(paid);
                self.cached_tokens = self.cached_tokens.saturating_add(cached);
                // A float's cast saturates too.
                let nanos = (c.cost_usd.unwrap_or(0.0) * 1e9).round() as i64;
                self.cost_nanos = self.cost_nanos.saturating_add(nanos);
                self.steps = self.steps.saturating_add(1);
            }
            EventBody::ToolCall(_) => self.tool_calls = self.tool_calls.saturating_add(1),
            _ => {}
        }
    }

    fn add(&mut self, other: &Spend) {
        self.tokens = self.tokens.saturating_add(other.tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.cost_nanos = self.cost_nanos.saturating_add(other.cost_nanos);
        self.steps = self.steps.saturating_add(other.steps);
        self.tool_calls = self.tool_calls.saturating_add(other.tool_calls);
    }

    fn minus(&self, other: &Spend) -> Spend {
        Spend {
            tokens: self.tokens.saturating_sub(other.tokens),
            cached_tokens: self.cached_tokens.saturating_sub(other.cached_tokens),
            cost_nanos: self.cost_nanos.saturating_sub(other.cost_nanos).max(0),
            steps: self.steps.saturating_sub(other.steps),
            tool_calls: self.tool_calls.saturating_sub(other.tool_calls),
        }
    }
}

/// Sessions of one outcome.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Group {
    pub sessions: u64,
    /// Sessions with at least one warning (or critical warning).
    pub warned: u64,
    /// Sessions with a termination (enforced or shadow).
    pub killed: u64,
    pub spend: Spend,
    /// What the killed sessions spent after their kill point.
    pub spend_after_kill: Spend,
}

impl Group {
    fn add(&mut self, other: &Group) {
        self.sessions += other.sessions;
        self.warned += other.warned;
        self.killed += other.killed;
        self.spend.add(&other.spend);
        self.spend_after_kill.add(&other.spend_after_kill);
    }
}

/// Sessions warned and killed by one detector, per outcome (success, failure, unknown).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DetectorRow {
    pub detector: String,
    pub warned: [u64; 3],
    pub killed: [u64; 3],
}

/// A successful session a termination would have stopped.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KilledSuccess {
    pub session_id: String,
    pub detector: DetectorKind,
    /// Steps (LLM calls) up to the kill point, and in the whole session.
    pub at_step: u64,
    pub steps: u64,
    pub spend_after_kill: Spend,
}

/// The backtest's findings.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    pub lines: u64,
    pub events: u64,
    pub bad_lines: u64,
    /// Sessions `--outcomes` named, and how many of them no session in the events had (a
    /// sign of ids written another way, or of another fleet's file).
    pub outcomes_given: u64,
    pub outcomes_unmatched: u64,
    /// By outcome: success, failure, unknown.
    pub success: Group,
    pub failure: Group,
    pub unknown: Group,
    /// Detectors that warned or killed at least one session.
    pub detectors: Vec<DetectorRow>,
    pub killed_successes: Vec<KilledSuccess>,
}

const OUTCOME_COLUMNS: [&str; 3] = ["success", "failure", "unknown"];

fn column(outcome: Option<Outcome>) -> usize {
    match outcome {
        Some(Outcome::Success) => 0,
        Some(Outcome::Failure) => 1,
        None => 2,
    }
}

/// A session being followed.
#[derive(Default)]
struct Tally {
    spend: Spend,
    /// The first termination and what had been spent up to and including its trigger.
    kill: Option<(DetectorKind, Spend)>,
    /// Bit per detector that warned.
    warned: u32,
}

struct Backtest<'a> {
    outcomes: &'a Outcomes,
    /// Per `--outcomes` entry: some session closed under its id.
    outcomes_used: Vec<bool>,
    open: FxHashMap<String, Tally>,
    report: Report,
    warned: [[u64; 3]; DETECTOR_COUNT],
    killed: [[u64; 3]; DETECTOR_COUNT],
}

impl Backtest<'_> {
    fn tally(&mut self, session: &str) -> &mut Tally {
        if !self.open.contains_key(session) {
            self.open.insert(session.to_string(), Tally::default());
        }
        self.open.get_mut(session).expect("inserted above")
    }

    fn account(&mut self, event: &Event) {
        self.tally(&event.session_id).spend.add_event(event);
    }

    fn finding(&mut self, session: &str, detector: DetectorKind, level: Level) {
        let tally = self.tally(session);
        // Past its kill point an enforced session says nothing more (the engine stops
        // judging it at its termination); a shadow one goes on, and what it says is not
        // what enforcing would have done.
        if tally.kill.is_some() {
            return;
        }
        if level == Level::Terminate {
            tally.kill = Some((detector, tally.spend));
        } else {
            tally.warned |= 1 << detector.index();
        }
    }

    fn close(&mut self, session: &str, reported: Option<Outcome>) {
        let tally = self.open.remove(session).unwrap_or_default();
        let given = self.outcomes.get(session);
        if let Some(g) = given {
            self.outcomes_used[g.entry] = true;
        }
        let outcome = reported.or(given.map(|g| g.outcome));
        let c = column(outcome);
        let group = match c {
            0 => &mut self.report.success,
            1 => &mut self.report.failure,
            _ => &mut self.report.unknown,
        };
        group.sessions += 1;
        group.spend.add(&tally.spend);
        group.warned += u64::from(tally.warned != 0);
        for kind in DetectorKind::ALL {
            if tally.warned & (1 << kind.index()) != 0 {
                self.warned[kind.index()][c] += 1;
            }
        }
        let Some((detector, at_kill)) = tally.kill else {
            return;
        };
        let after = tally.spend.minus(&at_kill);
        group.killed += 1;
        group.spend_after_kill.add(&after);
        self.killed[detector.index()][c] += 1;
        if outcome == Some(Outcome::Success) {
            self.report.killed_successes.push(KilledSuccess {
                session_id: session.to_string(),
                detector,
                at_step: at_kill.steps,
                steps: tally.spend.steps,
                spend_after_kill: after,
            });
        }
    }

    /// Another shard's sessions added to this one's (sessions are independent).
    fn absorb(&mut self, other: Backtest<'_>) {
        for (mine, theirs) in self.outcomes_used.iter_mut().zip(&other.outcomes_used) {
            *mine |= *theirs;
        }
        self.report.success.add(&other.report.success);
        self.report.failure.add(&other.report.failure);
        self.report.unknown.add(&other.report.unknown);
        self.report
            .killed_successes
            .extend(other.report.killed_successes);
        for k in 0..DETECTOR_COUNT {
            for c in 0..3 {
                self.warned[k][c] += other.warned[k][c];
                self.killed[k][c] += other.killed[k][c];
            }
        }
    }
}

impl Sink for Backtest<'_> {
    fn step(&mut self, step: Step<'_>, outputs: &[Output]) {
        let event = match step {
            Step::Event { event, duplicate } => (!duplicate).then_some(event),
            Step::Clock | Step::End => None,
        };
        let mut accounted = false;
        for o in outputs {
            // Idle closes come before the event is applied; findings and a completion
            // after it, so the event counts for its own session first.
            let caused_by_event = match &o {
                Output::Finding(_) => true,
                Output::Summary(s) => {
                    s.closed_by == crate::contract::output::ClosedBy::Completed
                        && event.is_some_and(|e| e.session_id == s.session_id)
                }
            };
            if caused_by_event && !accounted {
                if let Some(e) = event {
                    self.account(e);
                }
                accounted = true;
            }
            match o {
                Output::Finding(f) => self.finding(&f.session_id, f.detector, f.level),
                Output::Summary(s) => self.close(&s.session_id, s.outcome),
            }
        }
        if let (Some(e), false) = (event, accounted) {
            self.account(e);
        }
    }
}

/// Runs the backtest of `input` under `config` on `threads` engines (the report is the
/// same for any number).
pub fn backtest(
    config: Arc<Config>,
    input: Input<'_>,
    outcomes: &Outcomes,
    errors: &mut dyn Write,
    threads: usize,
) -> Result<Report, DriveError> {
    let make = || Backtest {
        outcomes,
        outcomes_used: vec![false; outcomes.len()],
        open: FxHashMap::default(),
        report: Report::default(),
        warned: [[0; 3]; DETECTOR_COUNT],
        killed: [[0; 3]; DETECTOR_COUNT],
    };
    let options = Options {
        threads,
        strict: false,
        ordered_outputs: false,
        render_json: false,
        batch_bytes: None,
    };
    // A `warn` config's terminations are critical warnings: read as `shadow`, they are
    // kept as the kill points enforcing would have had.
    let config = Arc::new(config.with_warn_as_shadow());
    let (read, shards) = drive(config, input, errors, options, make, |_| Ok(()))?;
    let mut shards = shards.into_iter();
    let mut run = shards.next().unwrap_or_else(make);
    shards.for_each(|other| run.absorb(other));
    let mut report = run.report;
    report.lines = read.lines;
    report.events = read.events;
    report.bad_lines = read.bad_lines;
    report.outcomes_given = outcomes.len() as u64;
    let mut unmatched: Vec<(&String, &Given)> = outcomes
        .0
        .iter()
        .filter(|(_, g)| !run.outcomes_used[g.entry])
        .collect();
    report.outcomes_unmatched = unmatched.len() as u64;
    if !unmatched.is_empty() {
        unmatched.sort_by_key(|(_, g)| g.entry);
        let first: Vec<String> = unmatched
            .iter()
            .take(3)
            .map(|(id, g)| format!("\"{}\" (line {})", printable(id), g.line))
            .collect();
        let _ = writeln!(
            errors,
            "warning: {} of {} sessions in --outcomes are not in the events: {}{}",
            unmatched.len(),
            outcomes.len(),
            first.join(", "),
            if unmatched.len() > first.len() {
                ", …"
            } else {
                ""
            }
        );
    }
    for kind in DetectorKind::ALL {
        let (warned, killed) = (run.warned[kind.index()], run.killed[kind.index()]);
        if warned != [0; 3] || killed != [0; 3] {
            report.detectors.push(DetectorRow {
                detector: kind.name().to_string(),
                warned,
                killed,
            });
        }
    }
    report
        .killed_successes
        .sort_by(|a, b| a.session_id.cmp(&b.session_id));
    Ok(report)
}

fn share(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:.1}%", 100.0 * part / whole)
    } else {
        "-".to_string()
    }
}

fn count_share(part: u64, whole: u64) -> String {
    format!("{part} ({})", share(part as f64, whole as f64))
}

fn big(n: u64) -> String {
    match n {
        n if n >= 10_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 10_000 => format!("{:.1}k", n as f64 / 1e3),
        n => n.to_string(),
    }
}

impl Report {
    fn groups(&self) -> [&Group; 3] {
        [&self.success, &self.failure, &self.unknown]
    }

    /// The report as a table for people.
    pub fn write_table(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let g = self.groups();
        let sessions: u64 = g.iter().map(|g| g.sessions).sum();
        writeln!(
            out,
            "backtest: {sessions} sessions, {} events ({} bad lines)",
            self.events, self.bad_lines
        )?;
        if self.outcomes_given > 0 {
            writeln!(
                out,
                "outcomes given: {} ({} not in the events)",
                self.outcomes_given, self.outcomes_unmatched
            )?;
        }
        writeln!(out)?;
        self.write_outcomes(out)?;
        self.write_detectors_and_kills(out)
    }

    /// Sessions, warnings, kills and spend per outcome, and the spend after kill points.
    fn write_outcomes(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let g = self.groups();
        let row = |out: &mut dyn Write, name: &str, cells: [String; 3]| {
            writeln!(
                out,
                "{name:<30} {:>16} {:>16} {:>16}",
                cells[0], cells[1], cells[2]
            )
        };
        row(out, "", OUTCOME_COLUMNS.map(str::to_string))?;
        row(out, "sessions", g.map(|g| g.sessions.to_string()))?;
        row(out, "warned", g.map(|g| count_share(g.warned, g.sessions)))?;
        row(out, "killed", g.map(|g| count_share(g.killed, g.sessions)))?;
        type Measure = (&'static str, fn(&Spend) -> f64, fn(f64) -> String);
        let measures: [Measure; 5] = [
            (
                "tokens (uncached in + out)",
                |s| s.tokens as f64,
                |v| big(v as u64),
            ),
            (
                "cached input tokens",
                |s| s.cached_tokens as f64,
                |v| big(v as u64),
            ),
            ("cost (USD)", |s| s.cost_usd(), |v| format!("{v:.2}")),
            ("steps (LLM calls)", |s| s.steps as f64, |v| big(v as u64)),
            ("tool calls", |s| s.tool_calls as f64, |v| big(v as u64)),
        ];
        for (name, get, show) in measures {
            row(out, name, g.map(|g| show(get(&g.spend))))?;
            row(
                out,
                "  after kill points",
                g.map(|g| {
                    let (after, all) = (get(&g.spend_after_kill), get(&g.spend));
                    format!("{} ({})", show(after), share(after, all))
                }),
            )?;
        }
        Ok(())
    }

    /// Sessions warned and killed per detector and outcome; the successful sessions killed.
    fn write_detectors_and_kills(&self, out: &mut dyn Write) -> std::io::Result<()> {
        writeln!(
            out,
            "\n{:<20} {:>24}   {:>24}",
            "sessions by detector", "warned: succ/fail/unk", "killed: succ/fail/unk"
        )?;
        for d in &self.detectors {
            let cells = |v: [u64; 3]| format!("{} / {} / {}", v[0], v[1], v[2]);
            writeln!(
                out,
                "{:<20} {:>24}   {:>24}",
                d.detector,
                cells(d.warned),
                cells(d.killed)
            )?;
        }
        writeln!(
            out,
            "\nkills of successful sessions: {}",
            self.killed_successes.len()
        )?;
        for k in &self.killed_successes {
            writeln!(
                out,
                "  {}  {} at step {} of {} ({} tokens after)",
                printable(&k.session_id),
                k.detector,
                k.at_step,
                k.steps,
                big(k.spend_after_kill.tokens)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lines(events: &[serde_json::Value]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in events {
            serde_json::to_writer(&mut out, e).unwrap();
            out.push(b'\n');
        }
        out
    }

    fn session(id: &str, loops: bool, outcome: Option<&str>) -> Vec<serde_json::Value> {
        let mut evs = Vec::new();
        for i in 0..12 {
            let n = evs.len();
            evs.push(json!({"type": "cost.attributed", "session_id": id, "event_id": format!("{id}#{n}"), "timestamp": format!("2026-01-01T00:00:{:02}Z", n), "input_tokens": 1000, "cache_read_tokens": 400, "output_tokens": 100, "cost_usd": 0.01, "tool_calls": 1}));
            let args = if loops {
                json!({"p": 1})
            } else {
                json!({"p": i})
            };
            let n = evs.len();
            evs.push(json!({"type": "tool.called", "session_id": id, "event_id": format!("{id}#{n}"), "timestamp": format!("2026-01-01T00:00:{:02}Z", n), "tool": "read", "args": args, "result": "same"}));
        }
        let n = evs.len();
        let mut done = json!({"type": "session.completed", "session_id": id, "event_id": format!("{id}#{n}"), "timestamp": format!("2026-01-01T00:00:{:02}Z", n)});
        if let Some(o) = outcome {
            done["outcome"] = json!(o);
        }
        evs.push(done);
        evs
    }

    #[test]
    fn spend_after_the_kill_point_is_what_the_kill_saves() {
        let mut evs = session("loop-ok", true, Some("success"));
        evs.extend(session("loop-bad", true, None));
        evs.extend(session("fine", false, Some("success")));
        let outcomes =
            Outcomes::read(&mut &b"{\"session_id\": \"loop-bad\", \"outcome\": \"failure\"}\n"[..])
                .unwrap();
        let input = lines(&evs);
        let config = Arc::new(Config::default());
        let report = backtest(
            config.clone(),
            Input::Reader(&mut &input[..]),
            &outcomes,
            &mut std::io::sink(),
            1,
        )
        .unwrap();
        // The sessions split over three engines, read in place: the same report.
        let bytes = Arc::new(input.clone());
        let split = backtest(
            config,
            Input::Bytes(bytes),
            &outcomes,
            &mut std::io::sink(),
            3,
        )
        .unwrap();
        assert_eq!(split, report);
        assert_eq!((report.success.sessions, report.failure.sessions), (2, 1));
        assert_eq!((report.success.killed, report.failure.killed), (1, 1));
        // 12 LLM calls of 700 paid tokens (1000 in, 400 of them cached, and 100 out).
        assert_eq!(report.failure.spend.tokens, 12 * 700);
        assert_eq!(report.failure.spend.cached_tokens, 12 * 400);
        let after = report.failure.spend_after_kill;
        assert!(after.steps > 0 && after.steps < 12, "{after:?}");
        assert_eq!(after.tokens, after.steps * 700);
        assert_eq!(report.killed_successes.len(), 1);
        let k = &report.killed_successes[0];
        assert_eq!((k.session_id.as_str(), k.steps), ("loop-ok", 12));
        assert_eq!(k.at_step + k.spend_after_kill.steps, 12);
        let repeat = report
            .detectors
            .iter()
            .find(|d| d.detector == k.detector.name())
            .unwrap();
        assert_eq!(repeat.killed, [1, 1, 0]);
        // A `warn` or `shadow` configuration backtests as its enforcing twin: the same
        // kill points, and nothing counted that the session would not have said before
        // them (a warn config's terminations were critical warnings: no kill at all).
        for mode in ["warn", "shadow"] {
            let twin =
                Config::from_toml_str(&format!("mode = \"{mode}\"\n"), "t", std::iter::empty())
                    .unwrap();
            let twin = backtest(
                Arc::new(twin),
                Input::Reader(&mut &input[..]),
                &outcomes,
                &mut std::io::sink(),
                1,
            )
            .unwrap();
            assert_eq!(twin, report, "{mode}");
        }
    }

    #[test]
    fn spend_totals_saturate_instead_of_wrapping() {
        let huge = |id: &str| json!({"type": "cost.attributed", "session_id": id, "input_tokens": u64::MAX / 2 + 1, "output_tokens": 1, "cost_usd": 1e308});
        let input = lines(&[huge("a"), huge("b"), huge("a")]);
        let report = backtest(
            Arc::new(Config::default()),
            Input::Reader(&mut &input[..]),
            &Outcomes::default(),
            &mut std::io::sink(),
            2,
        )
        .unwrap();
        let spend = report.unknown.spend;
        assert_eq!(spend.tokens, u64::MAX);
        assert_eq!(spend.cost_nanos, i64::MAX);
        assert_eq!(spend.steps, 3);
    }

    #[test]
    fn outcomes_files_are_checked() {
        let e = Outcomes::read(&mut &b"{\"session_id\": \"a\", \"outcome\": \"won\"}\n"[..])
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1") && e.contains("won"), "{e}");
        // A line that is not UTF-8 is a bad line too, named.
        let e =
            Outcomes::read(&mut &b"\n{\"session_id\": \"a\xff\", \"outcome\": \"success\"}\n"[..])
                .unwrap_err()
                .to_string();
        assert!(e.contains("line 2") && e.contains("column"), "{e}");
        // A file a Windows tool wrote as "UTF-8" starts with a byte order mark: read.
        let marked = "\u{feff}{\"session_id\": \"a\", \"outcome\": \"success\"}\n";
        let read = Outcomes::read(&mut marked.as_bytes()).unwrap();
        assert_eq!(read.get("a").map(|g| g.outcome), Some(Outcome::Success));
    }

    #[test]
    fn a_session_given_two_outcomes_is_refused_and_a_repeat_is_not() {
        let line = |id: &str, outcome: &str| json!({"session_id": id, "outcome": outcome});
        let first_three = [
            line("a", "success"),
            line("b", "failure"),
            line("b", "failure"),
        ];
        let repeated = Outcomes::read(&mut &lines(&first_three)[..]).unwrap();
        assert_eq!(repeated.len(), 2);
        let mut all = first_three.to_vec();
        all.push(line("a", "failure"));
        let e = Outcomes::read(&mut &lines(&all)[..])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 4")
                && e.contains("\"a\" is \"failure\" here but \"success\" on line 1"),
            "{e}"
        );
    }

    #[test]
    fn outcomes_of_sessions_not_in_the_events_are_counted_and_named() {
        let mut evs = session("s1", false, None);
        evs.extend(session("s2", false, None));
        let outcomes = Outcomes::read(
            &mut &b"{\"session_id\": \"S1\", \"outcome\": \"success\"}\n\
                {\"session_id\": \"s2\", \"outcome\": \"failure\"}\n\
                {\"session_id\": \"s3\", \"outcome\": \"success\"}\n"[..],
        )
        .unwrap();
        let input = Arc::new(lines(&evs));
        // On one engine and on two (where s1 and s2 may close on different ones).
        for threads in [1, 2] {
            let mut errors = Vec::new();
            let report = backtest(
                Arc::new(Config::default()),
                Input::Bytes(input.clone()),
                &outcomes,
                &mut errors,
                threads,
            )
            .unwrap();
            assert_eq!((report.outcomes_given, report.outcomes_unmatched), (3, 2));
            assert_eq!((report.failure.sessions, report.unknown.sessions), (1, 1));
            let errors = String::from_utf8(errors).unwrap();
            assert_eq!(
                errors,
                "warning: 2 of 3 sessions in --outcomes are not in the events: \"S1\" (line 1), \"s3\" (line 3)\n"
            );
        }
    }
}

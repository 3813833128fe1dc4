//! `loopwarden eval`: runs a labelled scenario corpus (the format of the shared
//! `scenarios/README.md`) and says, per case, whether its expectations hold.
//!
//! Guarantees: each case runs in a fresh engine with the given configuration, exactly as
//! `replay` would run its events; a verdict names what failed (false alarm, false kill,
//! late or missing detection) with the event indices involved.

use std::collections::HashMap;
use std::io::BufRead;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use crate::config::Config;
use crate::contract::event::parse_event;
use crate::contract::output::{ClosedBy, Output};
use crate::engine::levels::Level;
use crate::engine::{Engine, EventMeta};

/// The expectations of one case.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Expect {
    pub first_finding_by: Option<usize>,
    pub terminate_by: Option<usize>,
    pub max_level: String,
}

/// One labelled session.
#[derive(Debug, Clone, Deserialize)]
pub struct Case {
    pub id: String,
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub description: String,
    pub events: Vec<Value>,
    pub expect: Expect,
}

/// How a case went.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseResult {
    pub id: String,
    pub held: bool,
    pub failures: Vec<String>,
    pub false_alarm: bool,
    pub false_kill: bool,
    pub late: bool,
    /// (event index, detector, level) of every finding.
    pub findings: Vec<(usize, String, Level)>,
}

fn level_rank(name: &str) -> Option<u8> {
    match name {
        "none" => Some(0),
        "warning" => Some(1),
        "critical" => Some(2),
        "terminate" => Some(3),
        _ => None,
    }
}

fn rank(level: Level) -> u8 {
    level as u8 + 1
}

/// Runs one case.
pub fn run_case(config: &Arc<Config>, case: &Case) -> CaseResult {
    let mut failures = Vec::new();
    let findings = findings_of(config, case, &mut failures);
    let max_allowed = level_rank(&case.expect.max_level).unwrap_or_else(|| {
        failures.push(format!("unknown max_level `{}`", case.expect.max_level));
        3
    });
    let mut late = false;
    if let Some(by) = case.expect.first_finding_by {
        match findings.iter().map(|f| f.0).min() {
            Some(at) if at <= by => {}
            Some(at) => {
                late = true;
                failures.push(format!("first finding at event {at}, expected by {by}"));
            }
            None => {
                late = true;
                failures.push(format!("no finding, expected one by event {by}"));
            }
        }
    }
    if let Some(by) = case.expect.terminate_by {
        let terminations = findings.iter().filter(|f| f.2 == Level::Terminate);
        match terminations.map(|f| f.0).min() {
            Some(at) if at <= by => {}
            Some(at) => {
                late = true;
                failures.push(format!("terminated at event {at}, expected by {by}"));
            }
            None => {
                late = true;
                failures.push(format!("not terminated, expected by event {by}"));
            }
        }
    }
    let (mut false_alarm, mut false_kill) = (false, false);
    for (at, det, level) in &findings {
        if rank(*level) > max_allowed {
            if *level == Level::Terminate {
                false_kill = true;
            } else {
                false_alarm = true;
            }
            failures.push(format!(
                "{det} {} at event {at} exceeds max_level {}",
                level.name(),
                case.expect.max_level
            ));
        }
    }
    CaseResult {
        id: case.id.clone(),
        held: failures.is_empty(),
        failures,
        false_alarm,
        false_kill,
        late,
        findings,
    }
}

/// The case's events through one engine, then closed: each finding as (the index of
/// the event that fired it, detector, level). An event that is not valid input is a
/// failure of the case.
fn findings_of(
    config: &Arc<Config>,
    case: &Case,
    failures: &mut Vec<String>,
) -> Vec<(usize, String, Level)> {
    let mut engine = Engine::new(config.clone());
    let mut outputs = Vec::new();
    let mut index_of: HashMap<String, usize> = HashMap::new();
    for (i, ev) in case.events.iter().enumerate() {
        let bytes = serde_json::to_vec(ev).unwrap_or_default();
        match parse_event(&bytes, &config.limits) {
            Ok(event) => {
                index_of.entry(event.event_id.to_string()).or_insert(i);
                engine.process(&event, &EventMeta::default(), &mut outputs);
            }
            Err(e) => failures.push(format!("event {i} is not valid input: {e}")),
        }
    }
    engine.close_all(ClosedBy::EndOfInput, &mut outputs);
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Finding(f) => Some((
                *index_of.get(&f.trigger.event_id).unwrap_or(&usize::MAX),
                f.detector.name().to_string(),
                f.level,
            )),
            Output::Summary(_) => None,
        })
        .collect()
}

/// Totals over a corpus.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvalTotals {
    pub cases: usize,
    pub held: usize,
    pub false_alarms: usize,
    pub false_kills: usize,
    pub late: usize,
    pub bad_lines: usize,
}

impl std::fmt::Display for EvalTotals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} cases held; false alarms: {}, false kills: {}, late detections: {}, unreadable cases: {}",
            self.held, self.cases, self.false_alarms, self.false_kills, self.late, self.bad_lines
        )
    }
}

/// Reads a corpus (one case a line) and runs every case; `on_case` sees each result.
pub fn run_corpus(
    config: &Arc<Config>,
    input: &mut dyn BufRead,
    mut on_case: impl FnMut(Result<&CaseResult, (usize, String)>),
) -> std::io::Result<EvalTotals> {
    let mut totals = EvalTotals::default();
    for (n, line) in input.split(b'\n').enumerate() {
        let line = line?;
        if line.trim_ascii().is_empty() {
            continue;
        }
        // Read as bytes: a line that is not UTF-8 is one unreadable case, where
        // `lines()` would end the whole run without saying which.
        match serde_json::from_slice::<Case>(&line) {
            Ok(case) => {
                let r = run_case(config, &case);
                totals.cases += 1;
                totals.held += usize::from(r.held);
                totals.false_alarms += usize::from(r.false_alarm);
                totals.false_kills += usize::from(r.false_kill);
                totals.late += usize::from(r.late);
                on_case(Ok(&r));
            }
            Err(e) => {
                totals.bad_lines += 1;
                on_case(Err((n + 1, e.to_string())));
            }
        }
    }
    Ok(totals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_that_is_not_utf8_is_one_unreadable_case_and_the_run_goes_on() {
        let config = Arc::new(Config::from_toml_str("", "t", std::iter::empty()).unwrap());
        let case = r#"{"id":"c","events":[],"expect":{"max_level":"none"}}"#;
        let corpus = [
            b"{\"id\":\"\xff\"}".as_slice(),
            b"\n",
            case.as_bytes(),
            b"\n",
        ]
        .concat();
        let mut said = Vec::new();
        let totals = run_corpus(&config, &mut corpus.as_slice(), |r| {
            said.push(r.map(|c| c.id.clone()))
        })
        .unwrap();
        assert_eq!((totals.bad_lines, totals.cases), (1, 1), "{said:?}");
        let (line, error) = said[0].clone().unwrap_err();
        assert_eq!(line, 1);
        assert!(error.contains("column"), "says where: {error}");
        assert_eq!(said[1], Ok("c".to_string()));
    }
}

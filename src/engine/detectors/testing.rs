//! Helpers for the detectors' unit tests: synthetic events driven through the engine
//! (session "s", one second apart: tests drive the clock through event time).

use std::sync::Arc;

use serde_json::{json, Value};

use crate::config::Config;
use crate::contract::event::{parse_event, ParseLimits};
use crate::contract::output::Output;
use crate::engine::levels::{Level, Mode};
use crate::engine::{Engine, EventMeta};

use super::DetectorKind;

/// A finding as the tests compare it: (event index, detector, level, mode).
pub type Found = (usize, DetectorKind, Level, Mode);

/// Runs `events` under `config` and returns every finding. Thresholds are tested as they
/// are: without the grace that holds terminations back (`[engine] grace_steps = 0`,
/// unless `config` sets it; the grace has its own tests in the engine).
pub fn run_with(config: &str, events: &[Value]) -> Vec<Found> {
    let no_grace = (
        "LOOPWARDEN_ENGINE__GRACE_STEPS".to_string(),
        "0".to_string(),
    );
    let env = (!config.contains("grace_steps")).then_some(no_grace);
    let config = Arc::new(Config::from_toml_str(config, "test", env.into_iter()).unwrap());
    let mut engine = Engine::new(config);
    let mut found = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let mut e = e.clone();
        let o = e.as_object_mut().unwrap();
        o.entry("session_id").or_insert(json!("s"));
        o.insert("event_id".into(), json!(format!("e{i}")));
        o.entry("timestamp").or_insert(json!(format!(
            "2026-01-01T00:{:02}:{:02}Z",
            i / 60 % 60,
            i % 60
        )));
        let line = e.to_string();
        let ev = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
        let mut out = Vec::new();
        engine.process(&ev, &EventMeta::default(), &mut out);
        for o in out {
            if let Output::Finding(f) = o {
                found.push((i, f.detector, f.level, f.mode));
            }
        }
    }
    found
}

/// Every finding under the defaults: (index, detector, level).
pub fn run(events: &[Value]) -> Vec<(usize, DetectorKind, Level)> {
    run_with("", events)
        .into_iter()
        .map(|(i, d, l, _)| (i, d, l))
        .collect()
}

/// The (index, level) findings of one detector under a config.
pub fn of_with(config: &str, events: &[Value], kind: DetectorKind) -> Vec<(usize, Level)> {
    run_with(config, events)
        .into_iter()
        .filter(|f| f.1 == kind)
        .map(|f| (f.0, f.2))
        .collect()
}

/// The (index, level) findings of one detector under the defaults.
pub fn of(events: &[Value], kind: DetectorKind) -> Vec<(usize, Level)> {
    of_with("", events, kind)
}

/// The (index, level) findings of one detector among `found`.
pub fn only(found: &[(usize, DetectorKind, Level)], kind: DetectorKind) -> Vec<(usize, Level)> {
    found
        .iter()
        .filter(|f| f.1 == kind)
        .map(|f| (f.0, f.2))
        .collect()
}

/// The first `n` events of `events` (to show that nothing fires one short of a threshold).
pub fn first(events: &[Value], n: usize) -> Vec<Value> {
    events[..n].to_vec()
}

/// A result text of its own for each `i`, differing in words (not only in digits, which
/// the detectors read as noise between two runs of the same call).
pub fn words(i: usize) -> Value {
    const W: [&str; 8] = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
    ];
    json!(format!("{} {} {}", W[i % 8], W[i / 8 % 8], W[i / 64 % 8]))
}

/// A config where only `detector` may terminate: the others run in `warn` mode, so they
/// neither end the session nor claim its one termination.
pub fn alone(detector: &str) -> String {
    format!("mode = \"warn\"\n[detectors.{detector}]\nmode = \"enforce\"\n")
}

/// The enforced findings of `kind` under `alone(kind)`.
pub fn of_alone(events: &[Value], kind: DetectorKind) -> Vec<(usize, Level)> {
    run_with(&alone(kind.name()), events)
        .into_iter()
        .filter(|f| f.1 == kind && f.3 == Mode::Enforce)
        .map(|f| (f.0, f.2))
        .collect()
}

pub fn call(tool: &str, args: Value, result: Value) -> Value {
    json!({"type": "tool.called", "tool": tool, "args": args, "result": result})
}

/// A failing call; its error text names the tool and arguments (different calls fail
/// differently).
pub fn fail(tool: &str, args: Value, kind: Option<&str>) -> Value {
    let seed = format!("{tool}{args}")
        .bytes()
        .fold(7usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize));
    let error = format!("{tool} failed: {}", words(seed % 512));
    let mut v = json!({"type": "tool.called", "tool": tool, "args": args, "result": error, "is_error": true});
    if let Some(k) = kind {
        v["error_kind"] = json!(k);
    }
    v
}

pub fn turn(tool_calls: u32, text: &str) -> Value {
    json!({"type": "cost.attributed", "input_tokens": 100, "output_tokens": 10, "tool_calls": tool_calls, "text": text})
}

pub fn llm(extra: Value) -> Value {
    let mut v = json!({"type": "cost.attributed", "input_tokens": 100, "output_tokens": 10});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

/// A `Next page` click answering the same words each time, and the page read after it:
/// `rows(p)` is page `p`'s answer; `between(p)`, if any, comes before the read.
pub fn pages(
    n: usize,
    rows: impl Fn(usize) -> Value,
    between: Option<&dyn Fn(usize) -> Value>,
) -> Vec<Value> {
    let mut evs = Vec::new();
    for p in 0..n {
        evs.push(call(
            "browser_click",
            json!({"element": "Next page"}),
            json!("Clicked \"Next page\""),
        ));
        if let Some(between) = between {
            evs.push(between(p));
        }
        evs.push(call("browser_snapshot", json!({}), rows(p)));
    }
    evs
}

/// Page `p`'s forty rows: new words on each page (enough lines to be judged by them, as
/// a page of a real snapshot is).
pub fn new_rows(p: usize) -> Value {
    let rows: Vec<String> = (0..40)
        .map(|i| format!("- row \"{} {} invoice\" [ref=e{i}]", words(p), words(i)))
        .collect();
    json!(format!(
        "- grid \"Invoices\":\n{}\n- text: Page {p}",
        rows.join("\n")
    ))
}

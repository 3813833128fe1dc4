//! `loopwarden replay`'s output, byte for byte, on the inputs that say how the detectors
//! judge: the scenario corpus, simulated fleets (seeds 1, 2, 3, as `loopwarden simulate
//! --sessions 1000 --seed N --output …` writes them) and, when they are beside the
//! checkout, the recorded real sessions (`../shared/real-sessions/sessions.jsonl.gz` and
//! `sessions-2.jsonl.gz`).
//!
//! The same bytes must come out of one thread and of several (sessions split between
//! engines, `loopwarden replay --threads`).
//!
//! Each output's SHA-256 and line count are recorded in
//! `tests/fixtures/replay-outputs.sha256`. A refactoring or an optimisation must leave
//! them unchanged. A deliberate change of verdicts re-records them:
//!
//! ```sh
//! LOOPWARDEN_RECORD_REPLAY=1 cargo test --test replay_outputs
//! ```
//!
//! and its commit says what changed and why (the backtest numbers before and after).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use loopwarden::config::Config;
use loopwarden::shutdown::Shutdown;
use loopwarden::tools::driver::Input;
use loopwarden::tools::feed::{feed, Target, FILE_CLOCK};
use loopwarden::tools::replay::{replay, Format, ReplayOptions};
use loopwarden::tools::simulate::{Fleet, FleetSpec};

const RECORD_ENV: &str = "LOOPWARDEN_RECORD_REPLAY";

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn record_file() -> PathBuf {
    manifest().join("tests/fixtures/replay-outputs.sha256")
}

/// The corpus's events, one JSON object a line, case after case.
fn scenario_events() -> Vec<u8> {
    let text = std::fs::read_to_string(manifest().join("tests/fixtures/scenarios.jsonl")).unwrap();
    let mut out = Vec::new();
    for line in text.lines() {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        for event in case["events"].as_array().unwrap() {
            serde_json::to_writer(&mut out, event).unwrap();
            out.push(b'\n');
        }
    }
    out
}

/// What `loopwarden simulate --sessions 1000 --seed <seed> --output -` writes.
fn fleet_events(seed: u64) -> Vec<u8> {
    let mut fleet = Fleet::new(FleetSpec {
        sessions: 1000,
        concurrency: 100,
        loop_share: 0.2,
        seed,
    });
    let mut out = Vec::new();
    feed(
        &mut fleet,
        Target::Lines(&mut out),
        0.0,
        Some(FILE_CLOCK),
        None,
        &Shutdown::new(),
    )
    .unwrap();
    out
}

/// One file of the recorded real sessions (`sessions.jsonl.gz`, `sessions-2.jsonl.gz`).
fn real_sessions(file: &str) -> Option<Vec<u8>> {
    let path = manifest().join("../shared/real-sessions").join(file);
    let file = std::fs::File::open(path).ok()?;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(file)
        .read_to_end(&mut out)
        .unwrap();
    Some(out)
}

/// SHA-256 (hex) and line count of the default-config replay output of `input`, on
/// `threads` engines.
fn replay_digest(input: &[u8], threads: usize) -> (String, usize) {
    let mut output = Vec::new();
    replay(
        Arc::new(Config::default()),
        Input::Reader(&mut &input[..]),
        &mut output,
        &mut std::io::sink(),
        Format::Json,
        ReplayOptions {
            threads,
            strict: true,
            ..ReplayOptions::default()
        },
    )
    .unwrap();
    let digest: String = Sha256::digest(&output)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    (digest, output.iter().filter(|b| **b == b'\n').count())
}

fn recorded() -> BTreeMap<String, (String, usize)> {
    let text = std::fs::read_to_string(record_file()).unwrap_or_default();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_string(), (f[1].to_string(), f[2].parse().unwrap()))
        })
        .collect()
}

#[test]
fn replay_output_is_what_was_recorded() {
    let mut inputs: Vec<(String, Vec<u8>)> = vec![("scenarios".into(), scenario_events())];
    for seed in 1..=3 {
        inputs.push((format!("fleet-seed-{seed}"), fleet_events(seed)));
    }
    for (name, file) in [
        ("real-sessions", "sessions.jsonl.gz"),
        ("real-sessions-2", "sessions-2.jsonl.gz"),
    ] {
        match real_sessions(file) {
            Some(events) => inputs.push((name.into(), events)),
            None => {
                eprintln!("../shared/real-sessions/{file} is not beside the checkout: not compared")
            }
        }
    }
    let now: BTreeMap<String, (String, usize)> = inputs
        .iter()
        .map(|(name, input)| (name.clone(), replay_digest(input, 1)))
        .collect();
    // Sessions split over three engines: the same bytes.
    for (name, input) in &inputs {
        assert_eq!(replay_digest(input, 3), now[name], "{name} on 3 threads");
    }

    let before = recorded();
    if std::env::var_os(RECORD_ENV).is_some() {
        let mut all = before.clone();
        all.extend(now.clone());
        let mut text = String::from(
            "# SHA-256 and line count of `loopwarden replay`'s output (default configuration)\n\
             # per input; tests/replay_outputs.rs says how they are made and re-recorded.\n",
        );
        for (name, (digest, lines)) in &all {
            text.push_str(&format!("{name} {digest} {lines}\n"));
        }
        std::fs::write(record_file(), text).unwrap();
        eprintln!("recorded {}", record_file().display());
        return;
    }
    let mut changed = Vec::new();
    for (name, (digest, lines)) in &now {
        match before.get(name) {
            Some((d, l)) if d == digest && l == lines => {}
            Some((_, l)) => changed.push(format!(
                "{name}: the output changed ({l} lines recorded, {lines} now)"
            )),
            None => changed.push(format!("{name}: no recorded output")),
        }
    }
    assert!(
        changed.is_empty(),
        "replay output differs from tests/fixtures/replay-outputs.sha256:\n  {}\n\
         If the change of verdicts is deliberate, re-record with {RECORD_ENV}=1 and say why.",
        changed.join("\n  ")
    );
}

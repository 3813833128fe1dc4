//! What `loopwarden run` shows of itself, against a real broker (Tansu): `/healthz`,
//! `/readyz` that flips only once partitions are assigned, and `/metrics` whose counts
//! match what `replay` finds in the same events, in an exposition `promtool` accepts.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use loopwarden::config::Config;

/// The address the HTTP endpoint logged, once it did.
fn http_address(run: &Running) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = run.log_text();
        if let Some(line) = log.lines().find(|l| l.contains("serving /metrics")) {
            let addr = line
                .split("addr=")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .unwrap_or_else(|| panic!("no addr= in {line}"));
            return addr.to_string();
        }
        assert!(Instant::now() < deadline, "no HTTP endpoint logged:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// (status, body) of `GET http://addr/path`.
fn get(addr: &str, path: &str) -> (u16, String) {
    match ureq::get(&format!("http://{addr}{path}"))
        .timeout(Duration::from_secs(5))
        .call()
    {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("GET {path}: {e}"),
    }
}

/// Sample values of `name` keyed by their label set as written (`{a="x",b="y"}`).
fn samples(exposition: &str, name: &str) -> BTreeMap<String, f64> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let labels = series.strip_prefix(name)?;
            if !(labels.is_empty() || labels.starts_with('{')) {
                return None;
            }
            Some((labels.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn total(exposition: &str, name: &str) -> f64 {
    samples(exposition, name).values().sum()
}

fn label<'a>(labels: &'a str, key: &str) -> &'a str {
    labels
        .split(&format!("{key}=\""))
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or("")
}

#[test]
fn metrics_count_what_replay_finds_and_readyz_waits_for_the_assignment() {
    let brokers = broker();
    // The topics do not exist yet: the process is alive but cannot be assigned anything.
    let topics = Topics::named();
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &brokers, &topics, "");
    let config = Arc::new(Config::load(&cfg, std::iter::empty()).unwrap());
    let run = spawn_run(&cfg, &dir.path().join("run.log"));
    let addr = http_address(&run);
    assert_eq!(get(&addr, "/healthz").0, 200);
    for _ in 0..3 {
        let (status, body) = get(&addr, "/readyz");
        assert_eq!(status, 503, "ready before any assignment: {body}");
        std::thread::sleep(Duration::from_millis(300));
    }

    create_topics(&brokers, &topics.layout(2));
    let (events, _) = fleet(80, 0.4, 71);
    let mut input = events.clone();
    input.push(b"{not json".to_vec());
    produce(&brokers, &topics.input, &input, &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(&addr, "/readyz").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "never ready:\n{}",
            run.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Replay's view of the same events.
    let out = replay(config, &events);
    let completed = out
        .iter()
        .filter(|v| v["type"] == "session.summary" && v["closed_by"] == "completed")
        .count();
    let mut stop_reasons: BTreeMap<String, f64> = BTreeMap::new();
    for v in out.iter().filter(|v| v["type"] == "session.terminated") {
        *stop_reasons
            .entry(v["stop_reason"].as_str().unwrap().to_string())
            .or_default() += 1.0;
    }
    let findings = out
        .iter()
        .filter(|v| v["type"] != "session.summary")
        .count();
    let mut by_type: BTreeMap<String, f64> = BTreeMap::new();
    for e in &events {
        let v: serde_json::Value = serde_json::from_slice(e).unwrap();
        *by_type
            .entry(v["type"].as_str().unwrap().to_string())
            .or_default() += 1.0;
    }
    let _ = read_topic(
        &brokers,
        &topics.summary,
        completed,
        Duration::from_secs(60),
        Duration::from_millis(500),
    );
    // Every event applied and every batch finished before the scrape.
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let (status, body) = get(&addr, "/metrics");
        assert_eq!(status, 200);
        if total(&body, "loopwarden_events_consumed_total") >= events.len() as f64
            && total(&body, "loopwarden_sessions_closed_total") >= completed as f64
            || Instant::now() > deadline
        {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };

    let consumed: BTreeMap<String, f64> = samples(&metrics, "loopwarden_events_consumed_total")
        .into_iter()
        .map(|(l, v)| (label(&l, "type").to_string(), v))
        .collect();
    assert_eq!(consumed, by_type, "events consumed by type");
    assert_eq!(
        samples(&metrics, "loopwarden_bad_events_total"),
        BTreeMap::from([("{reason=\"invalid_json\"}".to_string(), 1.0)])
    );
    let terminations: BTreeMap<String, f64> = samples(&metrics, "loopwarden_terminations_total")
        .into_iter()
        .map(|(l, v)| (label(&l, "stop_reason").to_string(), v))
        .collect();
    assert_eq!(terminations, stop_reasons, "terminations by stop reason");
    assert_eq!(
        total(&metrics, "loopwarden_findings_total"),
        findings as f64,
        "findings"
    );
    let completed_metric: f64 = samples(&metrics, "loopwarden_sessions_closed_total")
        .iter()
        .filter(|(l, _)| label(l, "closed_by") == "completed")
        .map(|(_, v)| v)
        .sum();
    assert_eq!(completed_metric, completed as f64, "sessions completed");
    assert_eq!(total(&metrics, "loopwarden_partitions_assigned"), 2.0);
    assert!(total(&metrics, "loopwarden_batches_total") >= 1.0);
    assert_eq!(
        total(&metrics, "loopwarden_processing_latency_seconds_count"),
        events.len() as f64 + 1.0,
        "every polled message timed"
    );
    assert!(total(&metrics, "loopwarden_state_store_bytes") > 0.0);
    assert!(!metrics.contains("session_id"), "no session ids in labels");

    promtool_accepts(&metrics, dir.path());
    assert!(run.terminate(Duration::from_secs(30)).success());
}

/// `promtool check metrics` (Prometheus's own linter) on an exposition.
fn promtool_accepts(exposition: &str, dir: &Path) {
    let file = dir.join("metrics.txt");
    std::fs::write(&file, exposition).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool not found ({e}): apt-get install prometheus (CI installs it)")
        });
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

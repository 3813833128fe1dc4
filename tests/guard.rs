//! `loopwarden-guard` (the Python package in `python/loopwarden-guard`) against a real
//! Kafka-protocol broker (Tansu): findings produced onto the warning and termination
//! topics as loopwarden publishes them reach the watch of their session, once each; a
//! termination matched by trace id stops it (never another named session of that
//! trace); a hint is given once across a session's watches; shadow and warn-mode
//! terminations stop nothing; unreadable messages are skipped. The package's own unittest suite
//! (`python/loopwarden-guard/tests/test_guard.py`) runs in the virtualenv
//! `scripts/otel-python` makes (confluent-kafka pinned there).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{broker, create_topics, unique};

#[test]
fn the_guard_follows_the_verdicts_of_its_sessions() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = Command::new(manifest.join("scripts/otel-python"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/otel-python");
    assert!(python.status.success(), "scripts/otel-python failed");
    let python = String::from_utf8(python.stdout).unwrap().trim().to_string();
    let brokers = broker();
    let (warnings, terminations) = (unique("guard-warn"), unique("guard-term"));
    create_topics(&brokers, &[(&warnings, 2), (&terminations, 2)]);
    let out = Command::new(python)
        .arg(manifest.join("python/loopwarden-guard/tests/test_guard.py"))
        .arg("-v")
        .env("LOOPWARDEN_GUARD_BROKERS", &brokers)
        .env("LOOPWARDEN_GUARD_WARNING_TOPIC", &warnings)
        .env("LOOPWARDEN_GUARD_TERMINATED_TOPIC", &terminations)
        .output()
        .expect("run the guard's tests");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    // Every case ran (a test file that found nothing to run would pass too).
    assert!(said.contains("Ran 19 tests"), "{said}");
}

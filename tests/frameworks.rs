//! `loopwarden-guard`'s adapters in the real frameworks: pydantic-ai, Strands Agents, the
//! OpenAI Agents SDK (with OpenInference) and LangGraph (with OpenInference), each in a
//! virtualenv of its own with every package pinned (`scripts/framework-python`), driven
//! by a scripted OpenAI-compatible model (`tests/frameworks/model_server.py`), against a
//! real Kafka-protocol broker (Tansu). A stuck agent's tool publishes, as loopwarden
//! would, a warning at its 3rd call and a termination at its 6th: the hint must be in the
//! model call after the warning and never twice in one call, and the run must end with
//! no model call and no tool call after the termination; where the adapter names the
//! session (OpenAI Agents SDK, LangGraph), every span must carry it.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{broker, create_topics, unique};

fn framework(name: &str) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = Command::new(manifest.join("scripts/framework-python"))
        .arg(name)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/framework-python");
    assert!(
        python.status.success(),
        "scripts/framework-python {name} failed"
    );
    let python = String::from_utf8(python.stdout).unwrap().trim().to_string();
    let brokers = broker();
    let (warnings, terminations) = (unique("fw-warn"), unique("fw-term"));
    create_topics(&brokers, &[(&warnings, 2), (&terminations, 2)]);
    let script = manifest.join(format!(
        "tests/frameworks/guard_{}.py",
        name.replace('-', "_")
    ));
    let out = Command::new(python)
        .arg(&script)
        .env("LOOPWARDEN_GUARD_BROKERS", &brokers)
        .env("LOOPWARDEN_GUARD_WARNING_TOPIC", &warnings)
        .env("LOOPWARDEN_GUARD_TERMINATED_TOPIC", &terminations)
        .output()
        .expect("run the framework's guard test");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name}: {said}");
    assert!(said.contains("ok: hint in model call 3"), "{name}: {said}");
}

#[test]
fn pydantic_ai_gets_the_hint_once_and_stops_on_termination() {
    framework("pydantic-ai");
}

#[test]
fn strands_gets_the_hint_once_and_stops_on_termination() {
    framework("strands");
}

#[test]
fn openai_agents_gets_the_hint_once_and_stops_on_termination() {
    framework("openai-agents");
}

#[test]
fn langgraph_gets_the_hint_once_and_stops_on_termination() {
    framework("langgraph");
}

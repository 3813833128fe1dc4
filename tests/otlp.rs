//! Agents that only emit OpenTelemetry (issue 15), with real parts: spans made by the
//! official OpenTelemetry Python SDK and encoded by its OTLP encoder (`tests/otlp/agent.py`),
//! a real collector with a Kafka exporter (rotel, from PyPI), a real Kafka-protocol broker
//! (Tansu). `scripts/otel-python` installs the SDK and the collector, pinned, on first use.
//!
//! - the mapping reads the conventions' own attribute names (checked against the
//!   published packages, which a look-alike fails);
//! - a looping agent's OTLP JSON file is stopped by `loopwarden replay`, and its protobuf
//!   exports map to the very same events;
//! - end to end: SDK → collector → Kafka → `loopwarden run` with `[ingest.otlp]` →
//!   `session.terminated`, in both encodings; a message that is not a trace export is
//!   dead-lettered with its reason.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use loopwarden::contract::otlp::{attr, decode, Encoding, Mapper};
use rdkafka::Message;

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The virtualenv's python (installed, pinned, on first use).
fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| otel_python("python")).clone()
}

fn otel_python(what: &str) -> PathBuf {
    common::otel_python(what)
}

/// Runs the instrumented agent with `args`.
fn agent(args: &[&str]) {
    let status = Command::new(python())
        .arg(manifest().join("tests/otlp/agent.py"))
        .args(args)
        .status()
        .expect("run tests/otlp/agent.py");
    assert!(status.success(), "agent.py {args:?} failed");
}

fn names_json(extra: &[(&str, &str)]) -> String {
    let attributes: Vec<(&str, &str)> = attr::ALL.iter().chain(extra).copied().collect();
    serde_json::json!({"attributes": attributes, "operations": attr::OPERATIONS}).to_string()
}

/// Whether the published packages know every name (the checker's exit status).
fn names_check(json: &str) -> (bool, String) {
    use std::io::Write as _;
    let mut child = Command::new(python())
        .arg(manifest().join("tests/otlp/check_names.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(json.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_mapping_reads_the_conventions_own_names() {
    let (ok, said) = names_check(&names_json(&[]));
    assert!(ok, "{said}");
    assert!(
        said.contains(&format!("checked {} attribute names", attr::ALL.len())),
        "{said}"
    );
    // A look-alike typed by hand is caught.
    let (ok, said) = names_check(&names_json(&[("gen_ai.usage.input_token", "gen_ai")]));
    assert!(!ok && said.contains("gen_ai.usage.input_token"), "{said}");
}

/// `loopwarden replay` of a file; its stdout as JSON values.
fn replay(file: &Path) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_loopwarden"))
        .arg("replay")
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn terminations<'a>(outputs: &'a [serde_json::Value], session: &str) -> Vec<&'a serde_json::Value> {
    outputs
        .iter()
        .filter(|o| o["type"] == "session.terminated" && o["session_id"] == session)
        .collect()
}

#[test]
fn a_looping_agent_is_stopped_from_its_traces_and_both_encodings_agree() {
    for style in ["gen_ai", "openinference"] {
        let dir = tempfile::tempdir().unwrap();
        let (json, proto) = (dir.path().join("traces.jsonl"), dir.path().join("pb"));
        let conversation = format!("conv-{style}");
        agent(&[
            "--conversation",
            &conversation,
            "--style",
            style,
            "--json",
            json.to_str().unwrap(),
            "--proto",
            proto.to_str().unwrap(),
        ]);
        let outputs = replay(&json);
        let stopped = terminations(&outputs, &conversation);
        assert_eq!(stopped.len(), 1, "{style}: {outputs:#?}");
        // Stopped in its loop (the same failing test run), after warnings.
        assert!(outputs.iter().any(|o| o["type"] == "session.warning"));
        assert_eq!(
            stopped[0]["stats"]["tool_calls"].as_u64().map(|n| n > 3),
            Some(true)
        );

        // The protobuf exports (the SDK's own encoding) map to the same events, byte for
        // byte, as the OTLP JSON lines (each read by a mapper of its own: what a mapper
        // learns of a trace's sessions is kept for its later exports).
        let (mut json_mapper, mut proto_mapper) = (Mapper::default(), Mapper::default());
        let (mut from_json, mut from_proto) = (Vec::new(), Vec::new());
        for line in std::fs::read_to_string(&json).unwrap().lines() {
            json_mapper.map(
                &decode(line.as_bytes(), Encoding::OtlpJson).unwrap(),
                &mut from_json,
            );
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(&proto)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for f in files {
            let bytes = std::fs::read(f).unwrap();
            proto_mapper.map(
                &decode(&bytes, Encoding::OtlpProto).unwrap(),
                &mut from_proto,
            );
        }
        assert!(from_json.len() > 20, "{style}: {} events", from_json.len());
        assert_eq!(from_json, from_proto, "{style}");
    }
}

/// Waits for the session's termination on the bus.
fn await_termination(brokers: &str, topic: &str, session: &str, log: &Path) -> serde_json::Value {
    let consumer = common::reader(brokers, &[topic]);
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let v = common::json(&m.detach());
            if v["session_id"] == session {
                return v;
            }
        }
    }
    panic!(
        "no termination of {session} on {topic}; loopwarden log:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

#[test]
fn an_agent_traced_only_with_opentelemetry_is_terminated_through_a_collector_and_kafka() {
    // Both encodings at least once, and the protobuf path in exactly_once mode (the
    // ingest's events, dead letters and offsets in one transaction).
    for (format, encoding, delivery) in [
        ("protobuf", "otlp_proto", "at_least_once"),
        ("json", "otlp_json", "at_least_once"),
        ("protobuf", "otlp_proto", "exactly_once"),
    ] {
        let traces = common::unique("traces");
        let brokers = common::broker();
        common::create_topics(&brokers, &[(&traces, 2)]);
        let fx = common::fixture(
            2,
            &format!("[ingest.otlp]\ntopics = [\"{traces}\"]\nencoding = \"{encoding}\"\n"),
        );
        if delivery == "exactly_once" {
            let text = std::fs::read_to_string(&fx.cfg)
                .unwrap()
                .replace("[kafka]\n", "[kafka]\ndelivery = \"exactly_once\"\n");
            assert!(text.contains("exactly_once"));
            std::fs::write(&fx.cfg, text).unwrap();
        }
        let run = common::spawn_run(&fx.cfg, &fx.dir.path().join("run.log"));
        let collector =
            common::Collector::start(&brokers, &traces, format, &fx.dir.path().join("rotel.log"));

        // The whole trace in one export: the agent's name comes from its `invoke_agent`
        // span, which ends last, and only steps exported in the same request inherit it
        // (README, OTLP). In smaller batches the steps before it carry no agent id, unless
        // the collector happens to merge the exports (its batch timeout): a flaky test.
        let conversation = common::unique("conv");
        agent(&[
            "--conversation",
            &conversation,
            "--otlp-http",
            &collector.http,
            "--batch",
            "512",
            "--export-delay-ms",
            "600000",
        ]);
        let stopped = await_termination(&brokers, &fx.topics.terminated, &conversation, &run.log);
        assert_eq!(stopped["agent_id"], "coder", "{encoding}: {stopped}");
        assert!(stopped["trigger"]["event_id"]
            .as_str()
            .is_some_and(|id| id.len() == 16));

        // The events on the input topic are keyed by session and carry the span's
        // traceparent, so loopwarden's own spans join the agent's trace.
        let events = common::read_at_least(&brokers, &fx.topics.input, 20);
        let ours: Vec<_> = events
            .iter()
            .filter(|m| m.key() == Some(conversation.as_bytes()))
            .collect();
        assert!(
            ours.len() >= 20,
            "{encoding}: {} events keyed by the session",
            ours.len()
        );
        let tp = common::header(ours[0], "traceparent").expect("traceparent header");
        assert!(tp.starts_with("00-") && tp.ends_with("-01"), "{tp}");

        // A message that is not a trace export is dead-lettered with its reason.
        common::produce(
            &brokers,
            &traces,
            &[b"\x0bnot a trace export".to_vec()],
            &[],
        );
        let dead = common::read_at_least(&brokers, &fx.topics.dlq, 1);
        assert_eq!(
            common::header(&dead[0], loopwarden::bus::pipeline::DLQ_REASON).as_deref(),
            Some("invalid_otlp")
        );
        assert_eq!(
            common::header(&dead[0], loopwarden::bus::pipeline::DLQ_SOURCE_TOPIC).as_deref(),
            Some(traces.as_str())
        );
        if delivery == "exactly_once" {
            let log = run.log_text();
            assert!(
                log.matches("transactional producer ready").count() >= 2,
                "{log}"
            );
        }
        drop(collector);
        run.stop_gracefully();
    }
}

//! `loopwarden-guard`'s adapters in the real frameworks: pydantic-ai, Strands Agents, the
//! OpenAI Agents SDK (with OpenInference), LangGraph (with OpenInference) and Google ADK
//! (its model calls sent to the same scripted model by a model class of the test's), each in a
//! virtualenv of its own with every package pinned (`scripts/framework-python`), driven
//! by a scripted OpenAI-compatible model (`tests/frameworks/model_server.py`), against a
//! real Kafka-protocol broker (Tansu). A stuck agent's tool publishes, as loopwarden
//! would, a warning at its 3rd call and a termination at its 6th: the hint must be in the
//! model call after the warning and never twice in one call, and the run must end with
//! no model call and no tool call after the termination; where the adapter names the
//! session (OpenAI Agents SDK, LangGraph), every span must carry it.
//!
//! And end to end (`..._end_to_end`): each framework's own spans, with its defaults and
//! what the README tells users to set, exported within 200 ms to a real collector
//! (rotel) that puts them on Kafka, `loopwarden run` with `[ingest.otlp]` judging them,
//! and the guard acting on the verdicts in the agent's process. Per framework: a stuck
//! agent, a poll that never moves and a loop that starts after 12 turns are stopped; a
//! healthy agent and a poll that progresses (with the same narration every turn) are
//! not; an agent that changes course once the hint is in its prompt escapes unkilled.
//! Every finding names the agent (`agent_id`). Each termination's path is printed in
//! hops: span end to the collector's record on the traces topic, that record to
//! loopwarden's termination on the bus (loopwarden's own share: both Kafka timestamps),
//! and on to the guard reading it (`cargo test --release --test frameworks --
//! --nocapture end_to_end` for a release build's numbers).
//!
//! And traced only (`..._is_judged_on_its_calls`): LangGraph traced by OpenLLMetry, and
//! Google ADK by its own telemetry, each agent's spans written as OTLP JSON and replayed:
//! the mapping must read each instrumentation's spans as the run they were.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{broker, create_topics, unique};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

fn framework_python(name: &str) -> String {
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
    String::from_utf8(python.stdout).unwrap().trim().to_string()
}

fn framework(name: &str) {
    framework_with(name, &[]);
}

fn framework_with(name: &str, args: &[&str]) {
    framework_says(name, args, "ok: hint in model call 3");
}

/// Runs `tests/frameworks/guard_<name>.py` with `args` in `name`'s virtualenv, which
/// must pass saying `ok`.
fn framework_says(name: &str, args: &[&str], ok: &str) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = framework_python(name);
    let brokers = broker();
    let (warnings, terminations) = (unique("fw-warn"), unique("fw-term"));
    create_topics(&brokers, &[(&warnings, 2), (&terminations, 2)]);
    let script = manifest.join(format!(
        "tests/frameworks/guard_{}.py",
        name.replace('-', "_")
    ));
    let out = Command::new(python)
        .arg(&script)
        .args(args)
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
    assert!(said.contains(ok), "{name}: {said}");
}

#[test]
fn pydantic_ai_gets_the_hint_once_and_stops_on_termination() {
    framework("pydantic-ai");
}

/// An agent process restarted (a deploy, a crash) resumes a conversation loopwarden
/// terminated while no guard ran: the guard started after it stops the resumed run
/// before its first model call.
#[test]
fn pydantic_ai_stops_a_resumed_run_terminated_while_no_guard_ran() {
    framework_says(
        "pydantic-ai",
        &["resumed"],
        "ok: the resumed run stopped before its first model call",
    );
}

#[test]
fn strands_gets_the_hint_once_and_stops_on_termination() {
    framework("strands");
}

/// A termination read after the loop's last cancellation check: the hook before the
/// model call stops the run, and the result still says `cancelled`.
#[test]
fn strands_stops_on_a_termination_that_lands_before_a_model_call() {
    framework_with("strands", &["late"]);
}

#[test]
fn openai_agents_gets_the_hint_once_and_stops_on_termination() {
    framework("openai-agents");
}

#[test]
fn langgraph_gets_the_hint_once_and_stops_on_termination() {
    framework("langgraph");
}

#[test]
fn google_adk_gets_the_hint_once_and_stops_on_termination() {
    framework("google-adk");
}

/// As for pydantic-ai: a session terminated while no guard ran is stopped before the
/// resumed run's first model call, the run ending with the stop message.
#[test]
fn google_adk_stops_a_resumed_run_terminated_while_no_guard_ran() {
    framework_says(
        "google-adk",
        &["resumed"],
        "ok: the resumed run stopped before its first model call",
    );
}

/// A termination aborts the whole run: the agent after the terminated one in a
/// `SequentialAgent` never starts (ADK runs each agent on a copy of the run's context).
#[test]
fn google_adk_stops_the_rest_of_a_sequence_on_termination() {
    framework_with("google-adk", &["sequence"]);
}

/// A termination that arrives between two agents of a sequence, after the first one's
/// last callback (its context gone), still aborts the run: the next one never starts.
#[test]
fn google_adk_stops_a_sequence_terminated_between_its_agents() {
    framework_says(
        "google-adk",
        &["between"],
        "ok: the run aborted between its agents",
    );
}

/// A run cancelled mid-way (a server dropping the request's task) has no after-run
/// callback: its watch goes with its context.
#[test]
fn google_adk_forgets_a_cancelled_runs_watch() {
    framework_says(
        "google-adk",
        &["cancelled"],
        "ok: a cancelled run's watch is gone",
    );
}

/// `tests/frameworks/traced_openllmetry.py` in LangGraph's virtualenv: a ReAct agent
/// traced by OpenLLMetry (no loopwarden code in it), its spans as OTLP JSON; then
/// `loopwarden replay` of them, the session named by the attribute the README gives
/// (`traceloop.association.properties.thread_id`): every output is thread `thread-<mode>`'s.
fn openllmetry_langgraph(mode: &str) -> Vec<serde_json::Value> {
    let config =
        "[ingest.otlp]\nsession_attribute = \"traceloop.association.properties.thread_id\"\n";
    let (_, outputs) = traced("langgraph", "traced_openllmetry.py", mode, Some(config));
    let thread = format!("thread-{mode}");
    let others: Vec<&serde_json::Value> = (outputs.iter())
        .filter(|o| o["session_id"] != thread.as_str())
        .collect();
    assert!(
        !outputs.is_empty() && others.is_empty(),
        "{mode}: not all {thread}'s: {others:?}"
    );
    outputs
}

/// `tests/frameworks/<script> OUT mode` in `framework`'s virtualenv, which writes the
/// traced agent's spans as OTLP JSON to OUT; then `loopwarden replay` of them (with
/// `config`, if any). Returns what the script printed and the outputs.
fn traced(
    framework: &str,
    script: &str,
    mode: &str,
    config: Option<&str>,
) -> (String, Vec<serde_json::Value>) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let spans = dir.path().join("spans.jsonl");
    let out = Command::new(framework_python(framework))
        .arg(manifest.join("tests/frameworks").join(script))
        .arg(&spans)
        .arg(mode)
        .output()
        .expect("run the traced agent");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{mode}: {said}");
    let mut replay = Command::new(env!("CARGO_BIN_EXE_loopwarden"));
    replay.arg("replay");
    if let Some(config) = config {
        let path = dir.path().join("loopwarden.toml");
        std::fs::write(&path, config).unwrap();
        replay.arg("--config").arg(path);
    }
    let replayed = replay.arg(&spans).output().unwrap();
    let said = String::from_utf8_lossy(&replayed.stderr);
    assert!(replayed.status.success(), "{mode}: {said}");
    assert!(
        said.contains("tool calls"),
        "{mode}: not read as OTLP: {said}"
    );
    let outputs = (String::from_utf8(replayed.stdout).unwrap().lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (String::from_utf8(out.stdout).unwrap(), outputs)
}

/// OpenLLMetry's LangChain instrumentation writes LangChain's whole callback records as
/// a tool call's arguments and result: the run's step and checkpoint ids and the call's
/// id, new on every call; and a tool that raised has no result, only the exception on its
/// span. A stuck agent must still be seen calling the same tool with the same arguments
/// and the same failure, either way, or meeting the same refusal whatever it tries, and
/// a healthy one not.
#[test]
fn langgraph_traced_by_openllmetry_is_judged_on_its_calls() {
    // The same failure as a result, and as an exception the graph hands back; every
    // attempt refused the same way, known only by what each raised.
    for (mode, detectors) in [
        ("stuck", &["repeat"][..]),
        ("raising", &["error_repeat"][..]),
        ("rejected", &["same_error"][..]),
    ] {
        let outputs = openllmetry_langgraph(mode);
        let stopped: Vec<&serde_json::Value> = (outputs.iter())
            .filter(|o| o["type"] == "session.terminated")
            .collect();
        let [termination] = stopped.as_slice() else {
            panic!("{mode}: one termination: {outputs:?}");
        };
        let detector = termination["detector"].as_str().unwrap_or_default();
        assert!(detectors.contains(&detector), "{mode}: {termination}");
    }
    let healthy = openllmetry_langgraph("healthy");
    let findings: Vec<&serde_json::Value> = (healthy.iter())
        .filter(|o| o["type"] != "session.summary")
        .collect();
    assert!(findings.is_empty(), "a healthy agent judged: {findings:?}");
}

/// `tests/frameworks/traced_adk.py` in Google ADK's virtualenv: an agent traced by ADK's
/// own telemetry (no loopwarden code in it), each span exported as it ends; then
/// `loopwarden replay` of its spans. Returns the run's ADK session id and the outputs.
fn adk(mode: &str) -> (String, Vec<serde_json::Value>) {
    let (stdout, outputs) = traced("google-adk", "traced_adk.py", mode, None);
    let session = (stdout.lines())
        .find_map(|l| l.strip_prefix("session "))
        .unwrap_or_else(|| panic!("{mode}: no session: {stdout}"))
        .to_string();
    (session, outputs)
}

/// A summary: its session, LLM calls, tool calls, and each tool's calls.
type Summary = (String, u64, u64, Vec<(String, u64)>);

/// The summaries among `outputs`: the session `named` first, those named by trace ids
/// last.
fn summaries(outputs: &[serde_json::Value], named: &str) -> Vec<Summary> {
    let mut all: Vec<Summary> = (outputs.iter())
        .filter(|o| o["type"] == "session.summary")
        .map(|o| {
            let stats = &o["stats"];
            let tools = (stats["tools"].as_array().unwrap().iter())
                .map(|t| {
                    let name = t["tool"].as_str().unwrap().to_string();
                    (name, t["calls"].as_u64().unwrap())
                })
                .collect();
            (
                o["session_id"].as_str().unwrap().to_string(),
                stats["llm_calls"].as_u64().unwrap(),
                stats["tool_calls"].as_u64().unwrap(),
                tools,
            )
        })
        .collect();
    all.sort_by_key(|(s, ..)| (s != named, is_trace_id(s)));
    all
}

/// A session named by its trace id (32 hex digits), not by the framework.
fn is_trace_id(session: &str) -> bool {
    session.len() == 32 && session.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Google ADK names the session (`gen_ai.conversation.id`) on its model calls and its
/// agent's span, not on its tool calls, and the agent's span is exported after the run:
/// a run must still be one session, its model calls and its tools together, judged on
/// both; an agent called as a tool (`AgentTool`, a session of its own in the same trace)
/// another session, holding its own calls and none of its caller's, nor its caller any
/// of its. On ADK's schema 1 a run's first tool call comes before anything named under
/// the agent's span, and takes the trace id: a session of its own, never another run's.
/// Its content comes on spans with `SPAN_ONLY` (schema 2, its default), or in ADK's own
/// attributes (schema 1), where "{}" stands for content not captured and must not make
/// every call alike.
#[test]
fn google_adk_traced_by_its_own_telemetry_is_judged_on_its_calls() {
    for (mode, llm_calls, tool_calls, first_apart, stopped) in [
        ("stuck", 6, 6, false, true),
        ("schema1", 7, 6, true, true),
        ("healthy", 9, 8, false, false),
        ("uncaptured", 13, 11, true, false),
    ] {
        let (session, outputs) = adk(mode);
        let findings: Vec<&serde_json::Value> = (outputs.iter())
            .filter(|o| o["type"] != "session.summary")
            .collect();
        let terminations: Vec<&&serde_json::Value> = (findings.iter())
            .filter(|o| o["type"] == "session.terminated")
            .collect();
        if stopped {
            let [termination] = terminations.as_slice() else {
                panic!("{mode}: one termination: {outputs:?}");
            };
            assert_eq!(termination["detector"], "repeat", "{mode}: {termination}");
            assert_eq!(termination["session_id"], session.as_str(), "{mode}");
        } else {
            assert!(findings.is_empty(), "{mode}: judged: {findings:?}");
        }
        let sessions = summaries(&outputs, &session);
        let (run, apart) = sessions.split_first().expect("a session");
        assert_eq!(
            (&run.0, run.1, run.2),
            (&session, llm_calls, tool_calls),
            "{mode}: the run's session, its model calls and tools together: {sessions:?}"
        );
        let apart_calls: u64 = apart.iter().map(|s| s.2).sum();
        assert!(
            apart.iter().all(|s| is_trace_id(&s.0) && s.1 == 0)
                && apart_calls == u64::from(first_apart),
            "{mode}: {sessions:?}"
        );
    }
    for mode in ["delegating", "delegating-first"] {
        let (session, outputs) = adk(mode);
        let findings: Vec<&serde_json::Value> = (outputs.iter())
            .filter(|o| o["type"] != "session.summary")
            .collect();
        assert!(findings.is_empty(), "{mode}: judged: {findings:?}");
        let sessions = summaries(&outputs, &session);
        // The caller's session: its 7 model calls and 6 `run_tests`, and the `helper` call
        // where it was not the first; the helper's: its 3 model calls, and its `lookup`s
        // (the first apart on schema 1). Nothing of one in the other's.
        let (caller, helper) = match sessions.as_slice() {
            [caller, helper] if mode == "delegating" => (caller, helper),
            [caller, helper, first] if mode == "delegating-first" => {
                assert!(
                    is_trace_id(&first.0) && first.2 == 2,
                    "{mode}: {sessions:?}"
                );
                (caller, helper)
            }
            _ => panic!("{mode}: {sessions:?}"),
        };
        let tools = |s: &Summary| s.3.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>();
        assert!(
            caller.0 == session
                && caller.1 == 8
                && tools(caller)
                    .iter()
                    .all(|t| t == "run_tests" || t == "helper")
                && caller.3.contains(&("run_tests".to_string(), 6)),
            "{mode}: the caller's: {sessions:?}"
        );
        assert!(
            !is_trace_id(&helper.0)
                && helper.1 == 3
                && !tools(helper).is_empty()
                && tools(helper).iter().all(|t| t == "lookup"),
            "{mode}: the helper's: {sessions:?}"
        );
    }
}

/// What a scenario must come to.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    /// Terminated by loopwarden, and the run ended by the guard.
    Stopped,
    /// Never terminated, and the run ended by itself.
    Unstopped,
    /// Warned (the hint reached the model), never terminated.
    Escaped,
}

const SCENARIOS: &[(&str, Verdict)] = &[
    ("stuck", Verdict::Stopped),
    ("healthy", Verdict::Unstopped),
    ("poll_progress", Verdict::Unstopped),
    ("poll_stuck", Verdict::Stopped),
    ("late_loop", Verdict::Stopped),
    ("responsive", Verdict::Escaped),
];

/// The findings of `session` on `topic`, each with its record's Kafka timestamp (ms: when
/// loopwarden produced it), read until a poll brings nothing more (or `limit`).
fn findings_of(
    brokers: &str,
    topic: &str,
    session: &str,
    limit: Duration,
) -> Vec<(serde_json::Value, i64)> {
    let consumer = common::reader(brokers, &[topic]);
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(300)) {
            Some(Ok(m)) => {
                let v = common::json(&m.detach());
                if v["session_id"] == session {
                    out.push((v, m.timestamp().to_millis().unwrap_or(0)));
                }
            }
            _ if !out.is_empty() => break,
            _ => {}
        }
    }
    out
}

/// The Kafka timestamp (ms) of the record at `offset` of `topic`'s `partition`: for an
/// input record, when the collector produced it.
fn record_timestamp_ms(brokers: &str, topic: &str, partition: i32, offset: i64) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("fw-at"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("a consumer");
    let mut at = TopicPartitionList::new();
    at.add_partition_offset(topic, partition, Offset::Offset(offset))
        .expect("an offset");
    consumer.assign(&at).expect("assign");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(300)) {
            if m.offset() == offset {
                return m.timestamp().to_millis().expect("a record timestamp");
            }
        }
    }
    panic!("no record at {topic}/{partition}@{offset}");
}

/// The median of `xs` (the lower middle of an even count); `None` when empty.
fn median(mut xs: Vec<f64>) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len().saturating_sub(1) / 2).copied()
}

fn end_to_end(name: &str) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = framework_python(name);
    let brokers = broker();
    let traces = unique("fw-traces");
    create_topics(&brokers, &[(&traces, 2)]);
    let fx = common::fixture(
        2,
        &format!("[ingest.otlp]\ntopics = [\"{traces}\"]\nencoding = \"otlp_proto\"\n"),
    );
    let run = common::spawn_run(&fx.cfg, &fx.dir.path().join("run.log"));
    let collector = common::Collector::start(
        &brokers,
        &traces,
        "protobuf",
        &fx.dir.path().join("rotel.log"),
    );
    let mut report = Vec::new();
    let mut loopwarden_share = Vec::new();
    for &(scenario, want) in SCENARIOS {
        // A model answers in 0.3 s, faster than any real one, so the runs stay short;
        // but an agent that heeds the hint has two of its steps between the warning and
        // the termination, and on a loaded 2-core machine (the whole suite beside it)
        // the warning's path took longer than two 0.3 s steps once (the hint came in
        // the 7th call, after the termination at the 6th). At 1 s a step, still faster
        // than real models, the window is what a real agent has.
        let latency = if scenario == "responsive" {
            "1.0"
        } else {
            "0.3"
        };
        let out = Command::new(&python)
            .arg(manifest.join("tests/frameworks/e2e.py"))
            .args([name, scenario])
            .env("LOOPWARDEN_GUARD_BROKERS", &brokers)
            .env("LOOPWARDEN_GUARD_WARNING_TOPIC", &fx.topics.warning)
            .env("LOOPWARDEN_GUARD_TERMINATED_TOPIC", &fx.topics.terminated)
            .env("LOOPWARDEN_OTLP_HTTP", &collector.http)
            .env("LOOPWARDEN_MODEL_LATENCY_S", latency)
            .output()
            .expect("run tests/frameworks/e2e.py");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name} {scenario}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
            .unwrap_or_else(|e| panic!("{name} {scenario}: {e}: {stdout}"));
        let session = got["session"].as_str().expect("a session id").to_string();
        let stopped = got["stopped"] == true;
        let wait = if want == Verdict::Stopped { 30 } else { 3 };
        let terminations = findings_of(
            &brokers,
            &fx.topics.terminated,
            &session,
            Duration::from_secs(wait),
        );
        // Steps the agent began after loopwarden decided (its `detected_at`).
        let after_decision = terminations.first().map(|(t, _)| {
            let decided = t["detected_at"].as_str().unwrap_or_default().to_string();
            let decided_s = chrono_secs(&decided);
            got["calls_started"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|c| c.as_f64().unwrap() > decided_s)
                .count()
        });
        // The path of the first termination in hops (s): the span's end (its event time)
        // to its export on the traces topic (the exporter's batch and the collector), to
        // loopwarden's termination on the bus (loopwarden's own share: consume, judge,
        // produce), to the guard reading it.
        let hops = terminations.first().map(|(t, produced_ms)| {
            let trigger = &t["trigger"];
            let ingested_ms = record_timestamp_ms(
                &brokers,
                trigger["topic"].as_str().expect("a trigger topic"),
                trigger["partition"].as_i64().expect("a trigger partition") as i32,
                trigger["offset"].as_i64().expect("a trigger offset"),
            );
            let span_end_s = chrono_secs(t["event_time"].as_str().expect("an event time"));
            let exported = ingested_ms as f64 / 1000.0 - span_end_s;
            let judged = (produced_ms - ingested_ms) as f64 / 1000.0;
            let read = got["span_end_to_readable_s"]
                .as_f64()
                .map(|total| total - exported - judged);
            (exported, judged, read)
        });
        if let Some((_, judged, _)) = hops {
            loopwarden_share.push(judged);
        }
        let context = format!(
            "{name} {scenario}: {got}\nterminations: {terminations:?}\nloopwarden log:\n{}",
            run.log_text()
        );
        // Every finding names the agent: the framework's own attributes, or what the
        // guard's step processor copies onto the steps (README, per framework).
        assert!(
            got["agent_ids"]
                .as_array()
                .expect("agent ids")
                .iter()
                .all(|a| a == "fixer"),
            "a finding without the agent's name: {context}"
        );
        match want {
            Verdict::Stopped => {
                assert!(
                    stopped && !terminations.is_empty(),
                    "not stopped: {context}"
                );
                // The verdict reaches the agent within about a model call (0.3 s here,
                // a fast model's): at most the step already under way when loopwarden
                // decided.
                assert!(
                    after_decision.is_some_and(|n| n <= 1),
                    "steps after the decision: {after_decision:?}: {context}"
                );
            }
            Verdict::Unstopped => {
                assert!(!stopped && terminations.is_empty(), "stopped: {context}");
            }
            Verdict::Escaped => {
                assert!(!stopped && terminations.is_empty(), "stopped: {context}");
                assert!(
                    got["hint_seen"] == true,
                    "no hint reached the model: {context}"
                );
            }
        }
        report.push(format!(
            "{scenario}: {} tool calls, stopped {stopped}, steps after the decision {after_decision:?}, span end to termination readable {} s (exported, judged by loopwarden, read by the guard: {hops:?}), agent ids {}",
            got["tool_calls"], got["span_end_to_readable_s"], got["agent_ids"]
        ));
    }
    eprintln!(
        "{name} end to end:\n  {}\n  loopwarden's share (termination produced - trigger ingested), median {:?} s of {:?}",
        report.join("\n  "),
        median(loopwarden_share.clone()),
        loopwarden_share
    );
    drop(collector);
    run.stop_gracefully();
}

/// Seconds since the epoch of an RFC 3339 UTC time (`2026-11-27T01:02:03.456Z`).
fn chrono_secs(t: &str) -> f64 {
    let ms =
        loopwarden::contract::event::parse_rfc3339_ms(t).unwrap_or_else(|| panic!("a time: {t}"));
    ms as f64 / 1000.0
}

#[test]
fn pydantic_ai_end_to_end() {
    end_to_end("pydantic-ai");
}

#[test]
fn strands_end_to_end() {
    end_to_end("strands");
}

#[test]
fn openai_agents_end_to_end() {
    end_to_end("openai-agents");
}

#[test]
fn google_adk_end_to_end() {
    end_to_end("google-adk");
}

#[test]
fn langgraph_end_to_end() {
    end_to_end("langgraph");
}

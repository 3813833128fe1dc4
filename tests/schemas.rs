//! The JSON Schemas in `schemas/` and the Rust types agree both ways: inputs the schema
//! accepts parse, inputs it rejects are bad events, and every output the engine emits
//! validates against the schema of its type.

use std::sync::Arc;

use loopwarden::config::Config;
use loopwarden::contract::event::{parse_event, ParseLimits};
use loopwarden::contract::output::{ClosedBy, Output};
use loopwarden::engine::detectors::DetectorKind;
use loopwarden::engine::{Engine, EventMeta};
use serde_json::{json, Value};

fn schema(name: &str) -> Value {
    let path = format!("{}/schemas/{name}.schema.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn validator(name: &str) -> jsonschema::Validator {
    // The output schemas name detectors through the shared `detector.json`.
    let detector = schema("detector");
    let uri = detector["$id"].as_str().unwrap().to_string();
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .with_resource(uri, jsonschema::Resource::from_contents(detector).unwrap())
        .build(&schema(name))
        .unwrap_or_else(|e| panic!("schemas/{name}.schema.json: {e}"))
}

fn corpus_events() -> Vec<Value> {
    let text = std::fs::read_to_string(format!(
        "{}/tests/fixtures/scenarios.jsonl",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    text.lines()
        .flat_map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["events"]
                .as_array()
                .unwrap()
                .clone()
        })
        .collect()
}

fn input_validator_for(v: &Value) -> Option<jsonschema::Validator> {
    let t = v.get("type")?.as_str()?;
    match t {
        "cost.attributed" | "tool.called" | "session.started" | "session.completed" => {
            Some(validator(t))
        }
        _ => None,
    }
}

/// Variants of a valid event: each known field dropped, or given a value of another type.
fn mutations(v: &Value) -> Vec<Value> {
    let obj = v.as_object().unwrap();
    let mut out = Vec::new();
    let replacements = [
        json!("text"),
        json!(-1),
        json!(1.5),
        json!(true),
        json!([1]),
        json!({"a": 1}),
        Value::Null,
        json!(""),
        json!("2026-13-45"),
        // Longer than any id the contract takes (`session_id`, `event_id`, `trace_id`).
        json!("x".repeat(300)),
    ];
    for key in obj.keys() {
        let mut dropped = obj.clone();
        dropped.remove(key);
        out.push(Value::Object(dropped));
        if key == "args" || key == "result" {
            continue; // any JSON is fine there
        }
        for r in &replacements {
            let mut m = obj.clone();
            m.insert(key.clone(), r.clone());
            out.push(Value::Object(m));
        }
    }
    out
}

#[test]
fn schema_valid_inputs_parse_and_invalid_ones_are_rejected() {
    let limits = ParseLimits::default();
    let mut samples: Vec<Value> = Vec::new();
    let mut seen_types = std::collections::BTreeSet::new();
    for e in corpus_events() {
        if seen_types.insert((
            e["type"].as_str().unwrap().to_string(),
            e.get("text").is_some(),
            e.get("is_error").map(|v| v.to_string()),
        )) {
            samples.push(e);
        }
    }
    samples.push(json!({"type": "session.started", "session_id": "s", "run_id": "r", "agent_id": "a", "tenant": "t", "depth": 2, "parent_session_id": "p"}));
    samples.push(json!({"type": "session.completed", "session_id": "s", "stop_reason": "done", "outcome": "success", "timestamp": "2026-11-18T11:06:40.5+01:00"}));
    samples.push(json!({"type": "tool.called", "session_id": "s", "tool": "t", "result_digest": "abcDEF01", "duration_ms": 3.5, "error_kind": "timeout", "call_id": "c", "event_id": "e", "trace_id": "0af7651916cd43dd8448eb211c80319c"}));
    samples.push(json!({"type": "cost.attributed", "session_id": "s", "input_tokens": 1, "output_tokens": 2, "cache_read_tokens": 3, "cache_write_tokens": 4, "call_kind": "compaction", "progress": 0.5, "finish_reason": "end_turn", "turn": 3}));
    let mut checked = 0;
    for sample in &samples {
        let v = input_validator_for(sample).unwrap();
        assert!(v.is_valid(sample), "sample must be schema-valid: {sample}");
        assert!(
            parse_event(sample.to_string().as_bytes(), &limits).is_ok(),
            "sample must parse: {sample}"
        );
        for m in mutations(sample) {
            let bytes = m.to_string();
            let parsed = parse_event(bytes.as_bytes(), &limits);
            let schema_ok = match input_validator_for(&m) {
                Some(v) => v.is_valid(&m),
                None => false, // no or unknown `type`: no schema accepts it
            };
            assert_eq!(
                schema_ok,
                parsed.is_ok(),
                "schema says {schema_ok}, parser says {parsed:?} for {bytes}"
            );
            checked += 1;
        }
    }
    assert!(checked > 500, "only {checked} mutations checked");
}

fn validate_outputs(outputs: &[Output], counts: &mut std::collections::BTreeMap<String, usize>) {
    for o in outputs {
        let v: Value = serde_json::from_str(&o.to_json()).unwrap();
        let name = o.type_name().to_string();
        let validator = validator(&name);
        let errors: Vec<String> = validator
            .iter_errors(&v)
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect();
        assert!(
            errors.is_empty(),
            "{name} does not match its schema: {errors:?}\n{v}"
        );
        *counts.entry(name).or_default() += 1;
    }
}

#[test]
fn every_output_of_the_corpus_validates_against_its_schema() {
    let limits = ParseLimits::default();
    let mut counts = std::collections::BTreeMap::new();
    for mode in ["enforce", "warn", "shadow"] {
        let config = Arc::new(
            Config::from_toml_str(&format!("mode = \"{mode}\""), "t", std::iter::empty()).unwrap(),
        );
        let mut engine = Engine::new(config);
        let mut outputs = Vec::new();
        let meta = EventMeta {
            topic: Some("tool.called"),
            partition: Some(3),
            offset: Some(17),
            message_timestamp_ms: None,
            processing_time_ms: Some(1_800_000_000_000),
        };
        for e in corpus_events() {
            let line = e.to_string();
            let event = parse_event(line.as_bytes(), &limits).unwrap();
            engine.process(&event, &meta, &mut outputs);
        }
        engine.close_all(ClosedBy::EndOfInput, &mut outputs);
        validate_outputs(&outputs, &mut counts);
    }
    for t in ["session.warning", "session.terminated", "session.summary"] {
        assert!(
            counts.get(t).copied().unwrap_or(0) > 0,
            "no {t} produced: {counts:?}"
        );
    }
}

#[test]
fn outputs_round_trip_through_their_types() {
    let limits = ParseLimits::default();
    let mut engine = Engine::new(Arc::new(Config::default()));
    let mut outputs = Vec::new();
    for e in corpus_events() {
        engine.process(
            &parse_event(e.to_string().as_bytes(), &limits).unwrap(),
            &EventMeta::default(),
            &mut outputs,
        );
    }
    engine.close_all(ClosedBy::EndOfInput, &mut outputs);
    for o in &outputs {
        let back: Output = serde_json::from_str(&o.to_json()).unwrap();
        assert_eq!(&back, o);
    }
}

/// Every place in `v` (a JSON pointer) holding an `enum` that names a detector.
fn detector_enums(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            if let Some(Value::Array(items)) = o.get("enum") {
                if items
                    .iter()
                    .any(|i| i.as_str().and_then(DetectorKind::from_name).is_some())
                {
                    out.push(format!("{at}/enum"));
                }
            }
            for (k, x) in o {
                detector_enums(x, &format!("{at}/{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                detector_enums(x, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_detector_schema_lists_every_detector_and_the_outputs_use_it() {
    let listed: Vec<String> = schema("detector")["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let known: Vec<String> = DetectorKind::ALL
        .iter()
        .map(|k| k.name().to_string())
        .collect();
    for name in &known {
        assert!(
            listed.contains(name),
            "schemas/detector.schema.json does not list the detector `{name}`"
        );
    }
    for name in &listed {
        assert!(
            known.contains(name),
            "schemas/detector.schema.json lists `{name}`, which is not a detector"
        );
    }
    for output in ["session.warning", "session.terminated", "session.summary"] {
        let s = schema(output);
        let mut own = Vec::new();
        detector_enums(&s, "", &mut own);
        assert!(
            own.is_empty(),
            "schemas/{output}.schema.json lists detectors itself at {own:?}; use {{\"$ref\": \"detector.json\"}}"
        );
        assert!(
            s.to_string().contains("\"$ref\":\"detector.json\""),
            "schemas/{output}.schema.json does not name detectors through detector.json"
        );
    }
    // The shared list is what validates: an unknown detector is refused.
    let v = validator("session.warning");
    let mut warning = serde_json::to_value(sample_warning()).unwrap();
    assert!(v.is_valid(&warning), "{warning}");
    warning["detector"] = json!("no_such_detector");
    assert!(!v.is_valid(&warning));
}

/// One warning the engine emits (three identical calls).
fn sample_warning() -> loopwarden::contract::output::FindingEvent {
    let mut engine = Engine::new(Arc::new(Config::default()));
    let mut outputs = Vec::new();
    for i in 0..3 {
        let e = json!({"type": "tool.called", "session_id": "s", "event_id": format!("e{i}"), "tool": "read", "args": {"p": 1}, "result": "x"});
        let line = e.to_string();
        let event = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
        engine.process(&event, &EventMeta::default(), &mut outputs);
    }
    match outputs.pop() {
        Some(Output::Finding(f)) => *f,
        other => panic!("expected a warning, got {other:?}"),
    }
}

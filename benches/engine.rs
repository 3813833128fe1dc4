//! Engine throughput on a generated fleet (DESIGN §8: ≥ 1,000,000 events/s on one core,
//! per-event cost flat from 1k to 1M open sessions).
//!
//! Workload: thousands of interleaved sessions; ~60 % tool calls (args ~100 B, results
//! 0.2–2 kB, a tenth of them polls), ~40 % LLM calls (turn text 0.2–0.8 kB); one session
//! in ten falls into a loop (same call and result) after a healthy start.
//! `cargo bench --bench engine` runs it: `parse_only` (and, for reference, a SIMD JSON
//! parser of the field on the same lines), then `process` (engine alone) and
//! `parse_and_process` (one core's work per event) with 1k, 100k and 1M sessions open;
//! set `LOOPWARDEN_BENCH_MAX_SESSIONS` to skip the larger cases on small machines. Last,
//! `state/to_bytes` and `state/from_bytes`: a long-running session's state written as
//! the store and the changelog write it after each batch that changed it, and read back
//! as a restore does (throughput in states; issue 32). Before all these,
//! `content_sample/tool_outputs`: the lines of tool outputs (file views with line numbers,
//! search hits, test logs, and structured records of short fields) sampled as a tool
//! result's content is (throughput in bytes of canonical JSON given; the reading stops
//! once a sample is full). With `LOOPWARDEN_BENCH_MAX_SESSIONS` at 200,000 or more (the
//! default), `state/batch_changes`: a batch of 15,000 events of as many of 200,000 open
//! sessions and its changes taken, as the pipeline's worker does at a batch's end
//! (`LOOPWARDEN_BENCH_BATCH_CHANGES=<sessions>` times its two parts apart instead).
//! Whole-process replay is timed by `benches/vs-seeds`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use loopwarden::config::Config;
use loopwarden::contract::event::{parse_event, parse_rfc3339_ms, Event, EventBody, ParseLimits};
use loopwarden::contract::otlp::{attr, decode, Encoding, Mapper};
use loopwarden::contract::output::Output;
use loopwarden::engine::content::ContentSample;
use loopwarden::engine::state::SessionState;
use loopwarden::engine::store::{MemoryStore, StoreBatch};
use loopwarden::engine::{Engine, EventMeta};
use loopwarden::tools::simulate::{prose, Rng};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value as Attr, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message as _;
use serde_json::json;
use sha2::{Digest as _, Sha256};

#[path = "shared/growth.rs"]
mod growth;
#[path = "shared/proc.rs"]
mod proc;

// The allocator `loopwarden` itself runs on (src/main.rs), so that the engine is measured
// as it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The `i`-th event of session `sid` (JSON bytes), `looping` sessions repeat from step 6.
fn event_json(rng: &mut Rng, sid: &str, step: u64, looping: bool, ts_ms: i64) -> Vec<u8> {
    let ts = loopwarden::contract::event::format_rfc3339_ms(ts_ms);
    let v = if step % 5 == 0 || step % 5 == 3 {
        let len = 200 + rng.below(600) as usize;
        let text = prose(rng, len);
        json!({"type": "cost.attributed", "session_id": sid, "event_id": format!("{sid}#{step}"), "timestamp": ts, "agent_id": "coder", "tenant": "acme",
               "input_tokens": 1500 + rng.below(3000), "output_tokens": 100 + rng.below(400), "cost_usd": 0.004, "model": "model-x", "tool_calls": 1, "text": text})
    } else if looping && step > 6 {
        json!({"type": "tool.called", "session_id": sid, "event_id": format!("{sid}#{step}"), "timestamp": ts, "tool": "run_tests",
               "args": {"target": "unit", "path": "src/parser/mod.rs", "flags": ["--nocapture", "--quiet"]}, "result": {"status": "failed", "output": "test_parse failed: expected 3, got 4\n".repeat(8), "duration_ms": rng.below(500)}})
    } else if step % 10 == 4 {
        json!({"type": "tool.called", "session_id": sid, "event_id": format!("{sid}#{step}"), "timestamp": ts, "tool": "job_status",
               "args": {"job": format!("build-{}", rng.below(100))}, "result": {"status": "running", "progress": format!("{}% complete", rng.below(100))}})
    } else {
        let len = 200 + rng.below(1800) as usize;
        let result = prose(rng, len);
        json!({"type": "tool.called", "session_id": sid, "event_id": format!("{sid}#{step}"), "timestamp": ts, "tool": if step % 2 == 0 { "read_file" } else { "grep" },
               "args": {"path": format!("src/module_{}/file_{}.rs", rng.below(50), rng.below(1000)), "pattern": "fn handle_request", "context_lines": 3}, "result": result})
    };
    serde_json::to_vec(&v).unwrap()
}

/// A fleet of `sessions` sessions (`warm-<n>`) that goes on across batches: every batch
/// continues each session's steps and the event clock, so no batch repeats another.
struct Fleet {
    rng: Rng,
    steps: Vec<u64>,
    clock_ms: i64,
}

impl Fleet {
    fn new(sessions: u64, seed: u64) -> Fleet {
        Fleet {
            rng: Rng::new(seed),
            steps: vec![0; sessions as usize],
            clock_ms: 1_763_000_000_000,
        }
    }

    /// The id of session `s`.
    fn session_id(s: u64) -> String {
        format!("warm-{s:08}")
    }

    fn raw_event(&mut self, s: u64) -> Vec<u8> {
        let sid = Fleet::session_id(s);
        let step = self.steps[s as usize];
        self.steps[s as usize] += 1;
        self.clock_ms += 2;
        event_json(&mut self.rng, &sid, step, s % 10 == 0, self.clock_ms)
    }

    /// `count` events, each for a session picked at random, as raw JSON lines.
    fn raw_batch(&mut self, count: usize) -> Vec<Vec<u8>> {
        (0..count)
            .map(|_| {
                let s = self.rng.below(self.steps.len() as u64);
                self.raw_event(s)
            })
            .collect()
    }

    fn batch(&mut self, count: usize) -> Vec<Event<'static>> {
        self.raw_batch(count)
            .iter()
            .map(|b| {
                parse_event(b, &ParseLimits::default())
                    .unwrap()
                    .into_owned()
            })
            .collect()
    }

    /// Events generated so far per session, on average.
    fn events_per_session(&self) -> u64 {
        self.steps.iter().sum::<u64>() / self.steps.len().max(1) as u64
    }

    /// An engine in which every session of the fleet is open (two events each).
    fn warmed_engine(&mut self) -> Engine {
        // Sessions never close and ceilings never stop them: every event does the full
        // work of a live session (a terminated one would take the cheap tombstone path).
        let config = Config::from_toml_str(
            "[engine]\nsession_gap_secs = 315360000\n[detectors.turn_cap]\nterminate_at = 1e12\n[detectors.tool_call_cap]\nterminate_at = 1e12\n[detectors.token_cap]\nterminate_at = 1e15\n[detectors.cost_cap]\nterminate_at = 1e12\n",
            "bench",
            std::iter::empty(),
        )
        .unwrap();
        let mut engine = Engine::new(Arc::new(config));
        let mut out = Vec::new();
        for s in 0..self.steps.len() as u64 {
            for _ in 0..2 {
                let raw = self.raw_event(s);
                let ev = parse_event(&raw, &ParseLimits::default()).unwrap();
                engine.process(&ev, &EventMeta::default(), &mut out);
                out.clear();
            }
        }
        engine
    }
}

/// The same events as OpenTelemetry spans (GenAI conventions, content captured), in trace
/// exports of `per_request` spans, OTLP protobuf: what the ingest reads for them.
fn as_trace_exports(raw: &[Vec<u8>], per_request: usize) -> Vec<Vec<u8>> {
    let kv = |key: &str, value: Attr| KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
    };
    let s = |key: &str, v: &str| kv(key, Attr::StringValue(v.into()));
    let spans: Vec<Span> = raw
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let e: serde_json::Value = serde_json::from_slice(r).unwrap();
            let sid = e["session_id"].as_str().unwrap();
            let mut attributes = vec![
                s(attr::GEN_AI_CONVERSATION_ID, sid),
                s(attr::GEN_AI_AGENT_NAME, "coder"),
            ];
            if e["type"] == "cost.attributed" {
                attributes.push(s(attr::GEN_AI_OPERATION_NAME, "chat"));
                attributes.push(kv(
                    attr::GEN_AI_USAGE_INPUT_TOKENS,
                    Attr::IntValue(e["input_tokens"].as_i64().unwrap()),
                ));
                attributes.push(kv(
                    attr::GEN_AI_USAGE_OUTPUT_TOKENS,
                    Attr::IntValue(e["output_tokens"].as_i64().unwrap()),
                ));
                attributes.push(s(attr::GEN_AI_RESPONSE_MODEL, "model-x"));
                let messages = serde_json::json!([{"role": "assistant", "parts": [
                    {"type": "text", "content": e["text"]},
                    {"type": "tool_call", "id": "c", "name": "read_file", "arguments": {}}]}]);
                attributes.push(s(attr::GEN_AI_OUTPUT_MESSAGES, &messages.to_string()));
            } else {
                attributes.push(s(attr::GEN_AI_OPERATION_NAME, "execute_tool"));
                attributes.push(s(attr::GEN_AI_TOOL_NAME, e["tool"].as_str().unwrap()));
                attributes.push(s(attr::GEN_AI_TOOL_CALL_ARGUMENTS, &e["args"].to_string()));
                let result = match &e["result"] {
                    serde_json::Value::String(t) => t.clone(),
                    other => other.to_string(),
                };
                attributes.push(s(attr::GEN_AI_TOOL_CALL_RESULT, &result));
            }
            let end =
                parse_rfc3339_ms(e["timestamp"].as_str().unwrap()).unwrap() as u64 * 1_000_000;
            Span {
                // Ids as OTLP requires them: never all zeros.
                trace_id: (i as u128 / 64 + 1).to_be_bytes().to_vec(),
                span_id: (i as u64 + 1).to_be_bytes().to_vec(),
                name: "span".into(),
                start_time_unix_nano: end - 1_000_000,
                end_time_unix_nano: end,
                attributes,
                ..Span::default()
            }
        })
        .collect();
    spans
        .chunks(per_request)
        .map(|chunk| {
            ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    scope_spans: vec![ScopeSpans {
                        spans: chunk.to_vec(),
                        ..ScopeSpans::default()
                    }],
                    ..ResourceSpans::default()
                }],
            }
            .encode_to_vec()
        })
        .collect()
}

/// Applies `events` in order, dropping what they cause (`out` is kept for its capacity).
fn apply_all(engine: &mut Engine, events: &[Event<'_>], out: &mut Vec<Output>) {
    for ev in events {
        engine.process(ev, &EventMeta::default(), out);
        out.clear();
    }
}

/// `LOOPWARDEN_BENCH_MANUAL=<sessions>`: generate a few batches first, then time only
/// `process` over them (a clean target for `perf record`).
fn manual(open: u64) {
    let mut fleet = Fleet::new(open, open);
    let mut engine = fleet.warmed_engine();
    let batches: Vec<Vec<Event<'static>>> = (0..6).map(|_| fleet.batch(50_000)).collect();
    let mut out = Vec::new();
    let start = std::time::Instant::now();
    for b in &batches {
        apply_all(&mut engine, b, &mut out);
    }
    let n: usize = batches.iter().map(Vec::len).sum();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "manual: {open} open sessions, {n} events in {secs:.3} s = {:.0} events/s",
        n as f64 / secs
    );
}

fn bench_engine(c: &mut Criterion) {
    if let Some(open) = std::env::var("LOOPWARDEN_BENCH_MANUAL")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        manual(open);
        return;
    }
    if let Some(sessions) = std::env::var("LOOPWARDEN_BENCH_BATCH_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        manual_batch_changes(sessions);
        return;
    }
    let max_sessions: u64 = std::env::var("LOOPWARDEN_BENCH_MAX_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    const BATCH: usize = 50_000;
    let mut sample = Fleet::new(1_000, 42);
    let raw = sample.raw_batch(BATCH);
    let bytes: usize = raw.iter().map(|r| r.len()).sum();
    eprintln!(
        "workload: {BATCH} events, {:.0} bytes/event on average",
        bytes as f64 / BATCH as f64
    );
    if let Ok(path) = std::env::var("LOOPWARDEN_BENCH_DUMP") {
        // The workload as JSON Lines (four batches of a 1k-session fleet, 200k events),
        // to run `loopwarden replay` or a profiler on it; nothing is timed then.
        let mut text = Vec::new();
        let mut more = Fleet::new(1_000, 42);
        for r in (0..4).flat_map(|_| more.raw_batch(BATCH)) {
            text.extend_from_slice(&r);
            text.push(b'\n');
        }
        std::fs::write(&path, text).expect("write the workload dump");
        return;
    }

    let mut group = c.benchmark_group("engine");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.sample_size(10);
    group.bench_function("parse_only", |b| {
        b.iter(|| {
            for r in &raw {
                std::hint::black_box(parse_event(r, &ParseLimits::default()).unwrap());
            }
        })
    });
    // References, not loopwarden's code: a SIMD JSON parser of the field (sonic-rs) on the
    // same lines, reading each event's members with their values kept as raw JSON (as
    // the event reader keeps `args`, `result` and `text`), and building its document of
    // the whole event. They show where the event parser stands.
    group.bench_function("reference/sonic_rs_members", |b| {
        b.iter(|| {
            for r in &raw {
                for member in sonic_rs::to_object_iter(r.as_slice()) {
                    let (key, value) = member.unwrap();
                    std::hint::black_box((key, value.as_raw_str().len()));
                }
            }
        })
    });
    group.bench_function("reference/sonic_rs_document", |b| {
        b.iter(|| {
            for r in &raw {
                let document: sonic_rs::Value = sonic_rs::from_slice(r).unwrap();
                std::hint::black_box(document);
            }
        })
    });
    // The SHA-256 that DESIGN §2 asks of every tool call's fingerprints, alone: over each
    // event's `args` and `result` as written (their canonical forms are about as long).
    // With `parse_only`, a floor under `parse_and_process` that no engine work removes.
    let hashed: Vec<String> = raw
        .iter()
        .filter_map(
            |r| match parse_event(r, &ParseLimits::default()).unwrap().body {
                EventBody::ToolCall(call) => Some(format!(
                    "{}{}",
                    call.args.as_ref().map_or("", |a| a.as_str()),
                    call.result.as_ref().map_or("", |r| r.as_str())
                )),
                _ => None,
            },
        )
        .collect();
    group.bench_function("reference/sha256_of_args_and_results", |b| {
        b.iter(|| {
            for text in &hashed {
                std::hint::black_box(Sha256::digest(text.as_bytes()));
            }
        })
    });
    // The OTLP ingest: trace exports (OTLP protobuf, 100 spans each) decoded, mapped to
    // events and each event checked by the event parser, as `[ingest.otlp]` does before
    // publishing them; throughput in spans.
    let exports = as_trace_exports(&raw, 100);
    let mut mapper = Mapper::default();
    group.bench_function("otlp_ingest", |b| {
        let mut events = Vec::with_capacity(BATCH);
        let limits = ParseLimits::default();
        b.iter(|| {
            events.clear();
            for x in &exports {
                let request = decode(x, Encoding::OtlpProto).unwrap();
                mapper.map(&request, &mut events);
            }
            for e in &events {
                parse_event(&e.json, &limits).unwrap();
            }
            assert_eq!(events.len(), BATCH);
            std::hint::black_box(&events);
        })
    });
    for open in [1_000u64, 100_000, 1_000_000] {
        if open > max_sessions {
            continue;
        }
        let mut fleet = Fleet::new(open, open);
        let mut engine = fleet.warmed_engine();
        let mut out = Vec::new();
        group.bench_function(format!("process/{open}_open_sessions"), |b| {
            b.iter_batched(
                || fleet.batch(BATCH),
                |batch| {
                    apply_all(&mut engine, &batch, &mut out);
                    batch
                },
                BatchSize::PerIteration,
            )
        });
        // Parse + engine: what one core does per event of the bus or of a replayed file.
        group.bench_function(format!("parse_and_process/{open}_open_sessions"), |b| {
            b.iter_batched(
                || fleet.raw_batch(BATCH),
                |batch| {
                    for r in &batch {
                        let ev = parse_event(r, &ParseLimits::default()).unwrap();
                        engine.process(&ev, &EventMeta::default(), &mut out);
                        out.clear();
                    }
                    batch
                },
                BatchSize::PerIteration,
            )
        });
        let mut sizes = Vec::new();
        let mut tombstones = 0;
        for s in 0..open {
            if let Some(st) = engine.session(&Fleet::session_id(s)) {
                sizes.push(st.to_bytes().len());
                tombstones += usize::from(st.is_tombstone());
            }
        }
        let avg = sizes.iter().sum::<usize>() as f64 / sizes.len().max(1) as f64;
        eprintln!(
            "{open} open sessions: {} events each on average; state bytes per session avg {avg:.0}, max {}; terminated: {tombstones}",
            fleet.events_per_session(),
            sizes.iter().max().unwrap_or(&0),
        );
    }
    bench_state_bytes(&mut group, BATCH as u64);
    if max_sessions >= GROWTH_SESSIONS {
        bench_batch_changes(&mut group);
    }
    group.finish();
}

/// Open sessions of `state/batch_changes`.
const GROWTH_SESSIONS: u64 = 200_000;

/// Events a batch of [`growth_batches`].
const GROWTH_BATCH_EVENTS: usize = 15_000;

/// The pipeline's growth workload (issue 32) as the engine does it under a durable
/// store: batches of 15,000 events, each of another of `sessions` open sessions (one
/// event each, as a fleet at about an event a second per agent gives a batch), each
/// followed by its changes taken (`take_changes`: every changed state written). The
/// sessions' states (at 200,000 sessions and more) are far more than the caches hold, so
/// a state read at the batch's end comes from memory (the eleventh look of issue 32).
/// Returns the feed of batches and the engine, every session opened and written once.
fn growth_batches(sessions: u64) -> (GrowthFeed, GrowthEngine) {
    let config = Arc::new(
        Config::from_toml_str(growth::GROWTH_CONFIG, "growth", std::iter::empty()).unwrap(),
    );
    let mut feed = GrowthFeed {
        sessions,
        next: 0,
        events: GROWTH_BATCH_EVENTS,
    };
    let mut engine = GrowthEngine {
        engine: Engine::restore(config, &MemoryStore::new()).unwrap(),
        out: Vec::new(),
    };
    while feed.next < sessions {
        engine.process(&feed.batch());
        engine.engine.take_changes(&[]).unwrap();
    }
    (feed, engine)
}

/// The next batches' events (apart from the engine, for criterion's setup closure).
struct GrowthFeed {
    sessions: u64,
    next: u64,
    /// Events a batch: [`GROWTH_BATCH_EVENTS`], unless `LOOPWARDEN_BENCH_BATCH_EVENTS` sets
    /// it (the batch-changes mode only).
    events: usize,
}

impl GrowthFeed {
    fn batch(&mut self) -> Vec<String> {
        (0..self.events)
            .map(|_| {
                self.next += 1;
                growth::growth_event(self.next - 1, self.sessions).1
            })
            .collect()
    }
}

struct GrowthEngine {
    engine: Engine,
    out: Vec<Output>,
}

impl GrowthEngine {
    fn process(&mut self, batch: &[String]) {
        for line in batch {
            let ev = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
            self.engine
                .process(&ev, &EventMeta::default(), &mut self.out);
            self.out.clear();
        }
    }

    /// The changes of a batch of `events` events over `sessions` sessions, round robin.
    fn take_changes(&mut self, events: usize, sessions: u64) -> StoreBatch {
        let changes = self.engine.take_changes(&[]).unwrap();
        assert_eq!(
            changes.puts.len() as u64,
            (events as u64).min(sessions),
            "every event's session put"
        );
        changes
    }
}

/// `state/batch_changes`: a batch of [`growth_batches`] and its changes taken. What the
/// worker pays per event and state besides the broker; throughput in events.
fn bench_batch_changes(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
) {
    let (mut feed, mut engine) = growth_batches(GROWTH_SESSIONS);
    group.throughput(Throughput::Elements(GROWTH_BATCH_EVENTS as u64));
    group.bench_function(
        format!("state/batch_changes/{GROWTH_SESSIONS}_sessions"),
        |b| {
            b.iter_batched(
                || feed.batch(),
                |batch| {
                    engine.process(&batch);
                    let changes = engine.take_changes(GROWTH_BATCH_EVENTS, GROWTH_SESSIONS);
                    (batch, changes)
                },
                BatchSize::PerIteration,
            )
        },
    );
}

/// `LOOPWARDEN_BENCH_BATCH_CHANGES=<sessions>`: batches of [`growth_batches`] over that
/// many open sessions (at least a batch's 15,000), parsing and `process` timed apart from
/// `take_changes` (criterion's case times them together). With
/// `LOOPWARDEN_BENCH_BATCH_EVENTS=<events>` a batch holds that many events instead (more
/// than the sessions: each changed more than once, as a batch of seconds changes them,
/// and taken at the batch's end from memory), as many batches as make 600,000 events, at
/// least two.
fn manual_batch_changes(sessions: u64) {
    assert!(
        sessions >= GROWTH_BATCH_EVENTS as u64,
        "LOOPWARDEN_BENCH_BATCH_CHANGES: at least {GROWTH_BATCH_EVENTS} sessions, one event each a batch"
    );
    // The heap as the pipeline's worker has it (`loopwarden run`): without transparent
    // huge pages, whose clearing on first touch took half of a batch of seconds' time here.
    loopwarden::heap::without_transparent_huge_pages();
    let (mut feed, mut engine) = growth_batches(sessions);
    feed.events = match std::env::var("LOOPWARDEN_BENCH_BATCH_EVENTS") {
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => panic!("LOOPWARDEN_BENCH_BATCH_EVENTS: a number of events above 0, not {v:?}"),
        },
        Err(_) => GROWTH_BATCH_EVENTS,
    };
    let (mut processing, mut taking) = (Duration::ZERO, Duration::ZERO);
    let batches = (600_000 / feed.events).max(2);
    let (mut states, mut deltas) = (0, 0);
    let (mut processing_cpu, mut taking_cpu) = (proc::CpuTime::default(), proc::CpuTime::default());
    let cpu = || proc::this_thread_cpu().unwrap_or_default();
    for _ in 0..batches {
        let batch = feed.batch();
        let started = Instant::now();
        let cpu_started = cpu();
        engine.process(&batch);
        let processed = Instant::now();
        let cpu_processed = cpu();
        let changes = engine.take_changes(feed.events, sessions);
        taking += processed.elapsed();
        processing += processed - started;
        processing_cpu.add(cpu_processed.since(cpu_started));
        taking_cpu.add(cpu().since(cpu_processed));
        states += changes.puts.len();
        deltas += changes.deltas.len();
        drop(changes);
    }
    let events = (batches * feed.events) as f64;
    let kernel = |c: proc::CpuTime| 100.0 * c.system_share();
    eprintln!(
        "batch changes: {sessions} open sessions, {batches} batches of {}: parse + process {:.3} µs an event ({:.0} % of its CPU in the kernel), take_changes {:.3} µs an event ({:.3} µs a state of {states}, {deltas} as deltas; {:.0} % in the kernel)",
        feed.events,
        processing.as_secs_f64() / events * 1e6,
        kernel(processing_cpu),
        taking.as_secs_f64() / events * 1e6,
        taking.as_secs_f64() / states as f64 * 1e6,
        kernel(taking_cpu),
    );
}

/// A session's state written as the store and the changelog write it after each batch
/// that changed it (issue 32: at a million open sessions nearly every event writes one),
/// and read back as a restore does, throughput in states. The states are a 1k-session
/// fleet's after about 200 events each (two to warm, then four batches), whatever ran
/// before.
fn bench_state_bytes(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    batch: u64,
) {
    let open = 1_000u64;
    let mut fleet = Fleet::new(open, 7);
    let mut engine = fleet.warmed_engine();
    let mut out = Vec::new();
    for _ in 0..4 {
        apply_all(&mut engine, &fleet.batch(batch as usize), &mut out);
    }
    let states: Vec<_> = (0..open)
        .filter_map(|s| engine.session(&Fleet::session_id(s)).cloned())
        .collect();
    let stored: Vec<Vec<u8>> = states.iter().map(|st| st.to_bytes()).collect();
    let bytes: usize = stored.iter().map(Vec::len).sum();
    eprintln!(
        "state bench: {} states after {} events each on average, {:.0} bytes each on average",
        states.len(),
        fleet.events_per_session(),
        bytes as f64 / states.len().max(1) as f64
    );
    group.throughput(Throughput::Elements(states.len() as u64));
    let mut scratch = Vec::new();
    group.bench_function(format!("state/to_bytes/{open}_sessions"), |b| {
        b.iter(|| {
            for st in &states {
                std::hint::black_box(st.to_bytes_with(&mut scratch));
            }
        })
    });
    group.bench_function(format!("state/from_bytes/{open}_sessions"), |b| {
        b.iter(|| {
            for bytes in &stored {
                std::hint::black_box(SessionState::from_bytes(bytes).unwrap());
            }
        })
    });
}

/// Tool outputs as agents read them, in canonical JSON: a file view (numbered, tab after
/// the number), search hits (`path:line:code`) and a test log with timings as strings,
/// each about the 8 kB a content sample reads, and records of short fields (a listing of
/// files as objects).
fn tool_outputs(rng: &mut Rng) -> Vec<Vec<u8>> {
    let code = |rng: &mut Rng| {
        let indent = " ".repeat(4 * rng.below(4) as usize);
        let width = 16 + rng.below(80) as usize;
        format!("{indent}{}", prose(rng, width).trim_end())
    };
    let mut outputs = Vec::new();
    for k in 0..30u64 {
        let mut text = String::new();
        let mut n = 1 + rng.below(2000);
        while text.len() < 8 * 1024 {
            let line = match k % 3 {
                0 => format!("{n:6}\t{}", code(rng)),
                1 => format!(
                    "src/module_{}/file_{}.py:{n}:{}",
                    k,
                    rng.below(40),
                    code(rng)
                ),
                _ => format!(
                    "tests/test_{k}.py::test_case_{} PASSED [{:3}%] in {}.{:03}s",
                    rng.below(500),
                    n % 100,
                    rng.below(9),
                    rng.below(1000)
                ),
            };
            text.push_str(&line);
            text.push('\n');
            n += 1;
        }
        outputs.push(
            serde_json::to_string(&text)
                .expect("a string serializes")
                .into_bytes(),
        );
    }
    for k in 0..10u64 {
        let records: Vec<serde_json::Value> = (0..80)
            .map(|j| {
                json!({"name": format!("file_{k}_{j}.py"), "size": rng.below(100_000), "kind": "file", "mode": "0644"})
            })
            .collect();
        outputs.push(serde_json::to_vec(&records).expect("records serialize"));
    }
    outputs
}

fn bench_content_sample(c: &mut Criterion) {
    // The plain-timing modes time one thing alone (see `bench_engine`).
    if ["LOOPWARDEN_BENCH_MANUAL", "LOOPWARDEN_BENCH_BATCH_CHANGES"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        return;
    }
    let outputs = tool_outputs(&mut Rng::new(7));
    let mut group = c.benchmark_group("engine");
    group.throughput(Throughput::Bytes(
        outputs.iter().map(|o| o.len() as u64).sum(),
    ));
    group.bench_function("content_sample/tool_outputs", |b| {
        b.iter(|| {
            for o in &outputs {
                std::hint::black_box(ContentSample::of_canonical(o));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, bench_content_sample, bench_engine);
criterion_main!(benches);

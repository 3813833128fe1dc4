//! Invariants under generated input: determinism (whole, chunked through a store
//! round-trip), bounded state for any session length, and no panic on any JSON.

use std::sync::Arc;

use loopwarden::config::Config;
use loopwarden::contract::event::{parse_event, Event, ParseLimits};
use loopwarden::contract::output::{ClosedBy, Output};
use loopwarden::engine::state::STATE_BYTES_BOUND;
use loopwarden::engine::store::{MemoryStore, SledStore, StateStore};
use loopwarden::engine::{Engine, EventMeta};
use loopwarden::tools::driver::Input;
use proptest::prelude::*;
use serde_json::{json, Value};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "[a-z0-9 _-]{0,12}".prop_map(Value::String),
        Just(json!(
            "2026-01-01T00:00:00Z id 123e4567-e89b-12d3-a456-426614174000 running"
        )),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z_]{1,10}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A small alphabet of actions and results so that loops actually happen.
fn arb_event() -> impl Strategy<Value = Value> {
    let session = prop_oneof![Just("s1"), Just("s2"), Just("s3")];
    let run = prop_oneof![Just(None), Just(Some("r1")), Just(Some("r2"))];
    let tool = (0u8..4, 0u8..3, 0u8..3, any::<bool>(), prop::option::of(Just("unknown_tool"))).prop_map(|(t, a, r, err, kind)| {
        let tools = ["read", "job_status", "edit_file", "search"];
        let mut v = json!({"type": "tool.called", "tool": tools[t as usize], "args": {"a": a}, "result": format!("r{r}"), "is_error": err});
        if let Some(k) = kind {
            v["error_kind"] = json!(k);
        }
        v
    });
    let llm = (0u8..3, prop::option::of(0u32..2), 0u8..3, prop::option::of(0u8..4), 0u64..5000).prop_map(|(kind, calls, text, progress, tokens)| {
        let kinds = ["turn", "compaction", "summary"];
        let texts = ["I will write the file now", "Let me look at the logs again", "done"];
        let mut v = json!({"type": "cost.attributed", "input_tokens": tokens, "output_tokens": tokens / 3, "cost_usd": 0.01, "call_kind": kinds[kind as usize], "text": texts[text as usize]});
        if let Some(c) = calls {
            v["tool_calls"] = json!(c);
        }
        if let Some(p) = progress {
            v["progress"] = json!(p as f64 / 4.0);
        }
        v
    });
    let life = prop_oneof![
        Just(json!({"type": "session.started", "depth": 1})),
        Just(json!({"type": "session.completed", "stop_reason": "done"}))
    ];
    (
        prop_oneof![6 => tool, 3 => llm, 1 => life],
        session,
        run,
        0i64..400,
    )
        .prop_map(|(mut v, s, r, dt)| {
            v["session_id"] = json!(s);
            if let Some(r) = r {
                v["run_id"] = json!(r);
            }
            v["dt"] = json!(dt);
            v
        })
}

/// Gives the generated events increasing timestamps (with jumps that close sessions).
fn timed(events: &[Value]) -> Vec<Event<'static>> {
    let mut t = 1_700_000_000i64;
    events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut e = e.clone();
            t += e["dt"].as_i64().unwrap() * 10;
            e["event_id"] = json!(format!("e{i}"));
            e["timestamp"] = json!(loopwarden::contract::event::format_rfc3339_ms(t * 1000));
            parse_event(e.to_string().as_bytes(), &ParseLimits::default())
                .unwrap()
                .into_owned()
        })
        .collect()
}

fn config() -> Arc<Config> {
    Arc::new(
        Config::from_toml_str(
            "[engine]\nsession_gap_secs = 1800\n",
            "t",
            std::iter::empty(),
        )
        .unwrap(),
    )
}

fn run_whole(events: &[Event]) -> Vec<Output> {
    let mut e = Engine::new(config());
    let mut out = Vec::new();
    for ev in events {
        e.process(ev, &EventMeta::default(), &mut out);
    }
    e.close_all(ClosedBy::EndOfInput, &mut out);
    out
}

fn run_chunked(events: &[Event], chunk: usize, store: &mut dyn StateStore) -> Vec<Output> {
    let mut out = Vec::new();
    let mut engine = Engine::restore(config(), store).unwrap();
    for (i, part) in events.chunks(chunk.max(1)).enumerate() {
        for ev in part {
            engine.process(ev, &EventMeta::default(), &mut out);
        }
        engine
            .flush(store, &[("p/0".to_string(), i as i64)])
            .unwrap();
        // A fresh engine from the stored state, as after a restart.
        engine = Engine::restore(config(), store).unwrap();
    }
    engine.close_all(ClosedBy::EndOfInput, &mut out);
    out
}

/// The findings of `events` (one JSON line each), by session, in order.
fn findings_by_session(events: &[Event]) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut by = std::collections::BTreeMap::<String, Vec<String>>::new();
    for o in run_whole(events) {
        if let Output::Finding(f) = &o {
            by.entry(f.session_id.clone())
                .or_default()
                .push(o.to_json());
        }
    }
    by
}

/// One session's events on its own clock: starting `offset_days` from a fixed day, with
/// gaps shorter than `session_gap` (a gap longer than that ends a session on any clock).
fn session_on_its_clock(id: &str, events: &[Value], offset_days: i64) -> Vec<Event<'static>> {
    let mut t = 1_700_000_000i64 + offset_days * 86_400;
    events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut e = e.clone();
            t += e["dt"].as_i64().unwrap() % 150 * 10;
            e["session_id"] = json!(id);
            e["event_id"] = json!(format!("{id}-{i}"));
            e["timestamp"] = json!(loopwarden::contract::event::format_rfc3339_ms(t * 1000));
            parse_event(e.to_string().as_bytes(), &ParseLimits::default())
                .unwrap()
                .into_owned()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn concatenated_session_logs_are_judged_as_if_each_were_alone(
        sessions in prop::collection::vec(
            (prop::collection::vec(arb_event(), 1..80), -800i64..800),
            1..6,
        )
    ) {
        // Sessions one after another, each on its own clock (a lagging producer, a backlog,
        // logs of different days): every session gets the findings it gets alone.
        let mut all = Vec::new();
        let mut alone = std::collections::BTreeMap::new();
        for (i, (events, offset_days)) in sessions.iter().enumerate() {
            let id = format!("s{i}");
            let evs = session_on_its_clock(&id, events, *offset_days);
            alone.extend(findings_by_session(&evs));
            all.extend(evs);
        }
        prop_assert_eq!(findings_by_session(&all), alone);
    }

    #[test]
    fn same_events_same_findings(events in prop::collection::vec(arb_event(), 1..300)) {
        let evs = timed(&events);
        prop_assert_eq!(run_whole(&evs), run_whole(&evs));
    }

    #[test]
    fn chunked_replay_through_the_store_gives_the_same_outputs(events in prop::collection::vec(arb_event(), 1..200), chunk in 1usize..40) {
        let evs = timed(&events);
        let whole = run_whole(&evs);
        let mut store = MemoryStore::new();
        prop_assert_eq!(&run_chunked(&evs, chunk, &mut store), &whole);
    }

    #[test]
    fn state_stays_under_its_bound(events in prop::collection::vec(arb_event(), 1..600)) {
        let mut e = Engine::new(config());
        let mut out = Vec::new();
        for ev in timed(&events) {
            e.process(&ev, &EventMeta::default(), &mut out);
            if let Some(st) = e.session(&ev.session_id) {
                let n = st.to_bytes().len();
                prop_assert!(n <= STATE_BYTES_BOUND, "{} bytes", n);
            }
        }
    }

    #[test]
    fn no_panic_on_any_json_in_args_or_result(args in arb_json(), result in arb_json(), tool in "\\PC{1,30}") {
        let ev = json!({"type": "tool.called", "session_id": "s", "tool": tool, "args": args, "result": result});
        let bytes = ev.to_string();
        if let Ok(parsed) = parse_event(bytes.as_bytes(), &ParseLimits::default()) {
            let mut e = Engine::new(config());
            let mut out = Vec::new();
            for _ in 0..3 {
                e.process(&parsed, &EventMeta::default(), &mut out);
            }
        }
    }

    #[test]
    fn no_panic_on_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_event(&bytes, &ParseLimits::default());
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn replay_gives_the_same_bytes_on_any_number_of_threads(
        events in prop::collection::vec((arb_event(), 0u8..12, 0u8..10), 1..300),
        batch_bytes in prop_oneof![Just(1usize << 22), 64usize..4096],
    ) {
        // Many sessions (spread over the engines), clocks that jump (idle closes, sessions
        // reopening), lag far behind or are missing, exact duplicates and bad lines.
        let mut lines = String::new();
        let mut t = 1_700_000_000i64;
        for (i, (e, session, how)) in events.iter().enumerate() {
            let mut e = e.clone();
            t += e["dt"].as_i64().unwrap() * 10;
            e["session_id"] = json!(format!("s{session}"));
            e["event_id"] = json!(format!("e{i}"));
            let ts = match how {
                0 => None,
                1 => Some(t - 86_400),
                _ => Some(t),
            };
            if let Some(ts) = ts {
                e["timestamp"] = json!(loopwarden::contract::event::format_rfc3339_ms(ts * 1000));
            }
            let line = e.to_string();
            lines.push_str(&line);
            lines.push('\n');
            match how {
                2 => lines.push_str(&format!("{line}\n")),
                3 => lines.push_str("{\"type\": 1}\n"),
                _ => {}
            }
        }
        // Read in place (odd thread counts, as a mapped file is) or through a reader
        // (even ones): batches cut alike, the same outputs.
        let replay = |threads: usize| {
            let mut out = Vec::new();
            let mut reader = lines.as_bytes();
            let input = if threads % 2 == 1 {
                Input::Bytes(Arc::new(lines.clone().into_bytes()))
            } else {
                Input::Reader(&mut reader)
            };
            loopwarden::tools::replay::replay(
                config(),
                input,
                &mut out,
                &mut std::io::sink(),
                loopwarden::tools::replay::Format::Json,
                loopwarden::tools::replay::ReplayOptions { threads, strict: false, batch_bytes: Some(batch_bytes) },
            )
            .unwrap();
            out
        };
        // One engine over the whole input, event after event: the order to keep.
        let mut engine = Engine::new(config());
        let mut outputs = Vec::new();
        for line in lines.lines() {
            if let Ok(ev) = parse_event(line.as_bytes(), &ParseLimits::default()) {
                engine.process(&ev, &EventMeta::default(), &mut outputs);
            }
        }
        engine.close_all(ClosedBy::EndOfInput, &mut outputs);
        let one: Vec<u8> = outputs.iter().flat_map(|o| format!("{}\n", o.to_json()).into_bytes()).collect();
        for threads in 1..=4 {
            let split = replay(threads);
            prop_assert_eq!(
                String::from_utf8_lossy(&split),
                String::from_utf8_lossy(&one),
                "{} threads", threads
            );
        }
    }
}

#[test]
fn adversarial_long_session_stays_under_the_bound() {
    // Maxed-out labels, many tool names, long texts, every kind of event, for 20k events.
    let mut e = Engine::new(config());
    let mut out = Vec::new();
    let long = "x".repeat(500);
    let mut max = 0;
    for i in 0..20_000u64 {
        let v = match i % 4 {
            0 => {
                json!({"type": "cost.attributed", "input_tokens": 10, "output_tokens": 10, "tool_calls": 1, "text": format!("{long} {i} {}", (0..40).map(|j| format!("w{}", (i + j) % 97)).collect::<Vec<_>>().join(" "))})
            }
            1 => {
                json!({"type": "tool.called", "tool": format!("{}{}", "t".repeat(100), i % 50), "args": {"i": i}, "result": i})
            }
            2 => {
                json!({"type": "tool.called", "tool": "job_status", "args": {"i": i % 7}, "result": {"status": "running", "n": i % 3}})
            }
            _ => {
                json!({"type": "cost.attributed", "input_tokens": 10, "output_tokens": 10, "progress": (i % 10) as f64})
            }
        };
        let mut v = v;
        v["session_id"] = json!("s");
        v["event_id"] = json!(format!("id-{i}"));
        v["run_id"] = json!("r".repeat(300));
        v["agent_id"] = json!("a".repeat(300));
        v["tenant"] = json!("t".repeat(300));
        v["timestamp"] = json!(loopwarden::contract::event::format_rfc3339_ms(
            1_700_000_000_000 + i as i64 * 100
        ));
        let line = v.to_string();
        let ev = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
        e.process(&ev, &EventMeta::default(), &mut out);
        if let Some(st) = e.session("s") {
            max = max.max(st.to_bytes().len());
        }
    }
    assert!(max <= STATE_BYTES_BOUND, "state reached {max} bytes");
}

#[test]
fn restart_from_sled_resumes_where_it_left_off() {
    let events: Vec<Value> = (0..40)
        .map(|i| json!({"type": "tool.called", "session_id": format!("s{}", i % 3), "tool": "read", "args": {"p": 1}, "result": "same", "dt": 5}))
        .collect();
    let evs = timed(&events);
    let dir = tempfile::tempdir().unwrap();
    let whole = run_whole(&evs);
    let chunked = {
        let mut store = SledStore::open(dir.path()).unwrap();
        run_chunked(&evs, 7, &mut store)
    };
    assert_eq!(chunked, whole);
    assert!(whole
        .iter()
        .any(|o| matches!(o, Output::Finding(f) if f.stop_reason.is_some())));
}

/// Any text, long (past every cap) and full of characters JSON escapes six bytes wide
/// likely: what a broken producer names its runs, agents, tools and stop reasons.
fn arb_text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{0,8}",
        prop::collection::vec(any::<char>(), 0..max).prop_map(|c| c.into_iter().collect()),
        (1..max).prop_map(|n| "\u{1}".repeat(n)),
    ]
}

/// `fill` cut to `max` bytes after `prefix`, at a char boundary.
fn id_of(prefix: String, fill: &str, max: usize) -> String {
    let mut id = prefix;
    for c in fill.chars() {
        if id.len() + c.len_utf8() > max {
            break;
        }
        id.push(c);
    }
    id
}

/// What one session's outputs are when every event names `fill` in its ids (cut to
/// their limits), `run`, `agent` and `tenant` as labels, and `tool`: eight other tools
/// once each, then the same call of `tool` until it is killed, then a completion whose
/// `stop_reason` is `stop_reason`; read from a topic of Kafka's longest name.
fn outputs_naming(fill: &str, [run, agent, tenant, tool, stop_reason]: [&str; 5]) -> Vec<Output> {
    use loopwarden::contract::event::{MAX_ID_BYTES, MAX_SESSION_ID_BYTES};
    // Ids and names told apart (and made non-empty) by a control character first: JSON
    // writes one six bytes wide, as it does the worst of what follows.
    let control = |n: u8| char::from(n);
    let session = id_of(String::new(), &format!("\u{2}{fill}"), MAX_SESSION_ID_BYTES);
    let trace = id_of(String::new(), &format!("\u{3}{fill}"), MAX_ID_BYTES);
    let tool = format!("\u{1}{tool}");
    // Named apart in their first bytes, so that the stats keep eight names at their cap.
    let mut bodies: Vec<Value> = (0..8)
        .map(|i| json!({"type": "tool.called", "tool": format!("{}{tool}", control(0x18 + i)), "args": {}, "result": i}))
        .collect();
    bodies.extend(
        (0..14).map(
            |_| json!({"type": "tool.called", "tool": tool, "args": {"a": 1}, "result": "same"}),
        ),
    );
    bodies.push(
        json!({"type": "session.completed", "stop_reason": stop_reason, "outcome": "failure"}),
    );
    let topic = "t".repeat(249);
    let mut engine = Engine::new(config());
    let mut out = Vec::new();
    for (i, mut body) in bodies.into_iter().enumerate() {
        body["session_id"] = json!(session);
        body["event_id"] = json!(id_of(control(1 + i as u8).to_string(), fill, MAX_ID_BYTES));
        body["trace_id"] = json!(trace);
        body["run_id"] = json!(run);
        body["agent_id"] = json!(agent);
        body["tenant"] = json!(tenant);
        body["timestamp"] = json!(loopwarden::contract::event::format_rfc3339_ms(
            1_700_000_000_000 + i as i64 * 1000
        ));
        let line = body.to_string();
        let event = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
        let meta = EventMeta {
            topic: Some(&topic),
            partition: Some(0),
            offset: Some(i as i64),
            ..EventMeta::default()
        };
        engine.process(&event, &meta, &mut out);
    }
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::Finding(f) if f.stop_reason.is_some())),
        "no termination: the bound was not tried on one"
    );
    assert!(out.iter().any(|o| matches!(o, Output::Summary(_))));
    out
}

/// The largest output's type and bytes.
fn largest(out: &[Output]) -> (String, usize) {
    let sizes = out
        .iter()
        .map(|o| (o.type_name().to_string(), o.to_json().len()));
    sizes.max_by_key(|(_, n)| *n).unwrap()
}

/// The bound at its worst: every id, label and tool name as long as it is kept whole
/// (a longer label is kept shorter, with a digest), of characters JSON writes six bytes
/// wide.
#[test]
fn outputs_at_their_worst_stay_under_the_bound() {
    use loopwarden::contract::output::MAX_OUTPUT_BYTES;
    use loopwarden::engine::state::MAX_LABEL;
    let (wide, label) = ("\u{1}".repeat(3000), "\u{1}".repeat(MAX_LABEL));
    let out = outputs_naming(&wide, [&label, &label, &label, &wide, &label]);
    let (kind, n) = largest(&out);
    println!("largest output at worst: {kind} of {n} bytes");
    assert!(n <= MAX_OUTPUT_BYTES, "{kind} of {n} bytes");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every output stays under `MAX_OUTPUT_BYTES`, whatever its events name: ids at the
    /// longest the contract takes, labels, tool names and a runtime's stop reason of any
    /// length, eight tools named in the stats, a topic at Kafka's longest name. Unbounded,
    /// a finding carried a tool name or an id as long as its event (a megabyte).
    #[test]
    fn every_output_is_bounded_whatever_its_events_name(
        fill in arb_text(400),
        run in arb_text(6000),
        agent in arb_text(6000),
        tenant in arb_text(6000),
        tool in arb_text(6000),
        stop_reason in arb_text(6000),
    ) {
        use loopwarden::contract::output::MAX_OUTPUT_BYTES;
        let out = outputs_naming(&fill, [&run, &agent, &tenant, &tool, &stop_reason]);
        let (kind, n) = largest(&out);
        prop_assert!(n <= MAX_OUTPUT_BYTES, "{kind} of {n} bytes");
    }
}

//! The engine's unit tests: levels, grace, modes, duplicates and the session gap.

use serde_json::json;

use super::*;
use crate::contract::event::{parse_event, ParseLimits};

/// (index, detector, level, event_id) of every finding of `events` under `config`,
/// the events in session `s`, a second apart, with their own ids (`e{i}` where one has
/// none).
fn findings(config: &str, events: &[serde_json::Value]) -> Vec<(usize, String, Level, String)> {
    let config = Arc::new(Config::from_toml_str(config, "t", std::iter::empty()).unwrap());
    let mut engine = Engine::new(config);
    let mut found = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let mut e = e.clone();
        e["session_id"] = json!("s");
        if e.get("event_id").is_none() {
            e["event_id"] = json!(format!("e{i}"));
        }
        e["timestamp"] = json!(format_rfc3339_ms(1_800_000_000_000 + i as i64 * 1000));
        let line = e.to_string();
        let ev = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
        let mut out = Vec::new();
        engine.process(&ev, &EventMeta::default(), &mut out);
        for o in out {
            if let Output::Finding(f) = o {
                found.push((i, f.detector.name().to_string(), f.level, f.event_id));
            }
        }
    }
    found
}

fn same_call() -> serde_json::Value {
    json!({"type": "tool.called", "tool": "read", "args": {"p": 1}, "result": "x"})
}

fn turn() -> serde_json::Value {
    json!({"type": "cost.attributed", "input_tokens": 10, "output_tokens": 5, "tool_calls": 1})
}

#[test]
fn a_call_without_a_result_is_not_guessed_to_repeat_the_last_one() {
    let unknown = json!({"type": "tool.called", "tool": "run_tests", "args": {}});
    let f = findings("", &vec![unknown.clone(); 10]);
    let loops: Vec<&str> = f
        .iter()
        .map(|x| x.1.as_str())
        .filter(|d| ["repeat", "circuit_breaker", "low_novelty", "cycle"].contains(d))
        .collect();
    assert!(loops.is_empty(), "{f:?}");
    // One such call a turn, failing, with ids that differ only in a number standing
    // alone: neither old news nor the same error.
    let failing = json!({"type": "tool.called", "tool": "run_tests", "args": {}, "is_error": true});
    let mut events = Vec::new();
    for i in 0..8 {
        events.push(turn());
        let mut call = failing.clone();
        call["event_id"] = json!(format!("call-{i}"));
        events.push(call);
    }
    let f = findings("", &events);
    let judged: Vec<&str> = f
        .iter()
        .map(|x| x.1.as_str())
        .filter(|d| ["no_new_information", "same_error", "repeat"].contains(d))
        .collect();
    assert!(judged.is_empty(), "{f:?}");
    // The same action naming the same result, `null` (a tool that said nothing), does.
    let nothing = json!({"type": "tool.called", "tool": "run_tests", "args": {}, "result": null});
    let f = findings("", &vec![nothing; 10]);
    assert!(
        f.iter().any(|x| x.1 == "repeat" && x.2 == Level::Terminate),
        "{f:?}"
    );
}

#[test]
fn a_shadow_termination_does_not_hold_back_an_enforced_one() {
    let failing = json!({"type": "tool.called", "tool": "run", "args": {"x": 1}, "result": "boom", "is_error": true});
    let mut events = vec![same_call(); 8];
    events.extend(vec![failing; 8]);
    let f = findings("[detectors.repeat]\nmode = \"shadow\"\n", &events);
    let kills: Vec<(usize, &str)> = f
        .iter()
        .filter(|x| x.2 == Level::Terminate)
        .map(|x| (x.0, x.1.as_str()))
        .collect();
    // `repeat`'s shadow kill of the first loop, then `error_repeat`'s real one of the
    // second (after which the session is a tombstone: nothing more).
    assert_eq!(kills.len(), 2, "{f:?}");
    assert_eq!(kills[0], (5, "repeat"));
    assert_eq!(kills[1].1, "error_repeat");
    assert_eq!(f.last().unwrap().2, Level::Terminate, "{f:?}");
}

/// A finding names the trace of the event that fired it, and a summary the trace of
/// the event that completed its session, so a kill switch can match either id.
#[test]
fn outputs_carry_the_trace_of_their_event() {
    let config = Arc::new(Config::default());
    let mut engine = Engine::new(config);
    let mut out = Vec::new();
    for i in 0..6 {
        let mut e = same_call();
        e["session_id"] = json!("s");
        e["event_id"] = json!(format!("e{i}"));
        e["trace_id"] = json!(format!("trace-{i}"));
        let line = e.to_string();
        let ev = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
        engine.process(&ev, &EventMeta::default(), &mut out);
    }
    let done = json!({"type": "session.completed", "session_id": "s", "trace_id": "trace-end"});
    let line = done.to_string();
    let ev = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
    engine.process(&ev, &EventMeta::default(), &mut out);
    let Output::Finding(first) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(first.trigger.trace_id.as_deref(), Some("trace-2"));
    let Some(Output::Summary(summary)) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(summary.trace_id.as_deref(), Some("trace-end"));
    let json = serde_json::to_value(first).unwrap();
    assert_eq!(json["trigger"]["trace_id"], "trace-2");
    // Without one, the field is left out: outputs of other sources are unchanged.
    let mut untraced = first.clone();
    untraced.trigger.trace_id = None;
    let json = serde_json::to_value(&untraced).unwrap();
    assert!(json["trigger"].get("trace_id").is_none(), "{json}");
}

#[test]
fn a_loop_terminates_only_grace_steps_after_its_first_warning() {
    // No turns reported: steps are tool calls. Warned at the 3rd call (step 3); the
    // 4th reaches the termination threshold but is held (critical); step 6 kills.
    let f = findings("", &vec![same_call(); 8]);
    let levels: Vec<(usize, Level)> = f.iter().map(|x| (x.0, x.2)).collect();
    assert_eq!(
        levels,
        vec![
            (2, Level::Warning),
            (3, Level::Critical),
            (5, Level::Terminate)
        ]
    );
    let f = findings("[engine]\ngrace_steps = 0\n", &vec![same_call(); 8]);
    assert_eq!(f.last().map(|x| (x.0, x.2)), Some((3, Level::Terminate)));
}

/// `repeat`'s findings under `config`, as (event index, level).
fn repeat_levels(config: &str, events: &[serde_json::Value]) -> Vec<(usize, Level)> {
    findings(config, events)
        .iter()
        .filter(|x| x.1 == "repeat")
        .map(|x| (x.0, x.2))
        .collect()
}

#[test]
fn grace_is_counted_in_turns_when_the_session_reports_them() {
    // turn, call, turn, call, …: the warning comes with the 3rd call (turn 3); the kill
    // waits for the 3rd turn after it, whatever the calls in between.
    let mut evs = Vec::new();
    for _ in 0..8 {
        evs.push(turn());
        evs.push(same_call());
    }
    assert_eq!(
        repeat_levels("[detectors.repeat]\ngrace_steps = 3\n", &evs),
        vec![
            (5, Level::Warning),
            (7, Level::Critical),
            (11, Level::Terminate)
        ]
    );
}

#[test]
fn tool_calls_no_llm_call_asked_for_are_steps() {
    // A source whose LLM calls stop arriving (spans that lost their token counts): the
    // grace of the critical warning ("terminates in 3 steps") is kept in tool calls.
    let mut evs = vec![turn(), same_call()];
    evs.extend(vec![same_call(); 10]);
    let f = findings("", &evs);
    let levels: Vec<(usize, Level)> = f.iter().map(|x| (x.0, x.2)).collect();
    assert_eq!(
        levels,
        vec![
            (3, Level::Warning),
            (4, Level::Critical),
            (6, Level::Terminate)
        ]
    );
    // The calls one response asks for are that response's step, not steps of their
    // own: three parallel calls per turn keep the grace counted in turns.
    let mut evs = Vec::new();
    for _ in 0..6 {
        let mut t = turn();
        t["tool_calls"] = json!(3);
        evs.push(t);
        evs.extend(vec![same_call(); 3]);
    }
    // Warned at the 3rd call (turn 1, event 3), held at the 4th (turn 2, event 5);
    // the kill waits three turns past the warning: turn 4's first call (event 13).
    assert_eq!(
        repeat_levels("[detectors.repeat]\nwindow_terminate_at = \"off\"\n", &evs),
        vec![
            (3, Level::Warning),
            (5, Level::Critical),
            (13, Level::Terminate)
        ]
    );
}

#[test]
fn a_loop_that_ends_within_the_grace_is_not_killed() {
    let mut evs = vec![same_call(); 5];
    evs.push(json!({"type": "tool.called", "tool": "edit", "args": {"p": 2}, "result": "y"}));
    evs.extend(vec![same_call(); 2]);
    let f = findings("", &evs);
    assert!(f.iter().all(|x| x.2 != Level::Terminate), "{f:?}");
    assert!(f.iter().any(|x| x.2 == Level::Critical));
}

#[test]
fn detectors_without_a_warning_level_hold_their_first_termination() {
    // warn_at off: reaching terminate_at is said as a critical warning first.
    let cfg = "[detectors.repeat]\nwarn_at = \"off\"\n";
    let f = findings(cfg, &vec![same_call(); 8]);
    let levels: Vec<(usize, Level)> = f.iter().map(|x| (x.0, x.2)).collect();
    assert_eq!(levels, vec![(3, Level::Critical), (6, Level::Terminate)]);
}

#[test]
fn warn_mode_says_a_held_termination_once() {
    let f = findings(
        "[detectors.repeat]\nmode = \"warn\"\n",
        &vec![same_call(); 10],
    );
    let mut ids: Vec<&str> = f.iter().map(|x| x.3.as_str()).collect();
    let all = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), all, "an event_id twice: {f:?}");
    let repeat: Vec<Level> = f.iter().filter(|x| x.1 == "repeat").map(|x| x.2).collect();
    assert_eq!(repeat, vec![Level::Warning, Level::Critical]);
}

#[test]
fn ceilings_stop_at_their_limit_without_grace() {
    let evs: Vec<serde_json::Value> = (0..5)
        .map(|i| json!({"type": "tool.called", "tool": "t", "args": {"i": i}, "result": i}))
        .collect();
    let f = findings("[detectors.tool_call_cap]\nterminate_at = 5\n", &evs);
    assert_eq!(
        f.iter().map(|x| (x.0, x.2)).collect::<Vec<_>>(),
        vec![(3, Level::Warning), (4, Level::Terminate)]
    );
}

/// The first summary among `out` and what closing every session at the end of input adds.
fn summary_at_the_end(engine: &mut Engine, mut out: Vec<Output>) -> serde_json::Value {
    engine.close_all(ClosedBy::EndOfInput, &mut out);
    let summary = out
        .iter()
        .find(|o| matches!(o, Output::Summary(_)))
        .expect("a summary")
        .to_json();
    serde_json::from_str(&summary).unwrap()
}

/// An engine under the configuration `toml`.
fn engine_with(toml: &str) -> Engine {
    Engine::new(Arc::new(
        Config::from_toml_str(toml, "t", std::iter::empty()).unwrap(),
    ))
}

#[test]
fn a_session_id_that_comes_back_after_its_session_closed_gets_findings_of_its_own_ids() {
    let mut engine = engine_with("[engine]\nsession_gap_secs = 60\n");
    let mut run = |first_step: u32, start_ms: i64| {
        let mut found = Vec::new();
        for i in 0..8 {
            let at = start_ms + i64::from(i) * 1000;
            for o in process_as(&mut engine, same_call(), "s", first_step + i, at) {
                if let Output::Finding(f) = o {
                    found.push((f.detector, f.level, f.event_id));
                }
            }
        }
        found
    };
    let first = run(0, 1_800_000_000_000);
    // The same id an hour later: the session before closed on the gap.
    let second = run(100, 1_800_003_600_000);
    assert!(!first.is_empty());
    let kinds = |f: &[(DetectorKind, Level, String)]| -> Vec<(DetectorKind, Level)> {
        f.iter().map(|x| (x.0, x.1)).collect()
    };
    assert_eq!(
        kinds(&first),
        kinds(&second),
        "the same loop, judged the same"
    );
    for (_, _, id) in &second {
        assert!(
            first.iter().all(|f| &f.2 != id),
            "finding id {id} of the second session was the first's"
        );
    }
}

#[test]
fn duplicates_are_dropped_and_sessions_close_on_the_gap() {
    let mut engine = engine_with("[engine]\nsession_gap_secs = 60\n");
    let mut out = Vec::new();
    let ev = |id: &str, sid: &str, ts: &str| {
        let e = json!({"type": "tool.called", "tool": "t", "session_id": sid, "event_id": id, "timestamp": ts});
        parse_event(e.to_string().as_bytes(), &ParseLimits::default())
            .unwrap()
            .into_owned()
    };
    for _ in 0..3 {
        let e = ev("same", "s", "2026-01-01T00:00:00Z");
        engine.process(&e, &EventMeta::default(), &mut out);
    }
    assert_eq!(engine.session("s").unwrap().stats.tool_calls, 1);
    assert_eq!(engine.session("s").unwrap().stats.duplicates, 2);
    let e = ev("x", "other", "2026-01-01T00:01:01Z");
    engine.process(&e, &EventMeta::default(), &mut out);
    let closed: Vec<_> = out
        .iter()
        .filter_map(|o| match o {
            Output::Summary(s) => Some((s.session_id.clone(), s.closed_by.name().to_string())),
            _ => None,
        })
        .collect();
    assert_eq!(closed, vec![("s".to_string(), "idle_timeout".to_string())]);
    engine.close_all(ClosedBy::EndOfInput, &mut out);
    assert_eq!(engine.open_sessions(), 0);
}

/// The sessions `out` closed, with how.
fn closed_in(out: &[Output]) -> Vec<(String, String)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Summary(s) => Some((s.session_id.clone(), s.closed_by.name().to_string())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_clock_limit_is_the_earlier_of_the_message_and_the_processing_time_and_the_grace() {
    let meta = |message, processing| EventMeta {
        message_timestamp_ms: message,
        processing_time_ms: processing,
        ..EventMeta::default()
    };
    assert_eq!(clock_limit(&meta(Some(1000), Some(5000)), 30), Some(1030));
    assert_eq!(clock_limit(&meta(Some(9000), Some(5000)), 30), Some(5030));
    assert_eq!(clock_limit(&meta(None, Some(5000)), 30), Some(5030));
    assert_eq!(
        clock_limit(&meta(Some(0), Some(5000)), 30),
        Some(5030),
        "0 is none"
    );
    assert_eq!(clock_limit(&meta(Some(1000), None), 30), None, "a replay");
}

#[test]
fn an_event_stamped_ahead_of_its_message_and_this_host_moves_the_clock_no_further() {
    // Sessions a and b go on a second apart as produced; c, the same call six times in a
    // row, comes from a host whose clock runs a day ahead. `read_after`: how long after
    // its message was produced (its timestamp, the stamp of a and b) an event is
    // processed (`None`: a replay).
    let (start, day) = (1_800_000_000_000i64, 24 * 3600 * 1000);
    let feed = |engine: &mut Engine, read_after: Option<i64>| {
        let mut out = Vec::new();
        for i in 0..600i64 {
            let at = start + i * 1000;
            let (session, stamped, args, result) = match i {
                300..=305 => ("c", at + day, json!({"p": 1}), json!("same")),
                _ if i % 2 == 0 => ("a", at, json!({"i": i}), json!(i)),
                _ => ("b", at, json!({"i": i}), json!(i)),
            };
            let e = json!({"type": "tool.called", "tool": "read", "args": args,
                "result": result, "session_id": session, "event_id": format!("{session}-{i}"),
                "timestamp": format_rfc3339_ms(stamped)});
            let line = e.to_string();
            let e = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
            let meta = EventMeta {
                processing_time_ms: read_after.map(|after| at + after),
                message_timestamp_ms: read_after.map(|_| at),
                ..EventMeta::default()
            };
            engine.process(&e, &meta, &mut out);
        }
        out
    };
    // c's findings' and summary's ids.
    let ids_of_c = |out: &[Output]| -> Vec<String> {
        out.iter()
            .filter_map(|o| match o {
                Output::Finding(f) if f.session_id == "c" => Some(f.event_id.clone()),
                Output::Summary(s) if s.session_id == "c" => Some(s.event_id.clone()),
                _ => None,
            })
            .collect()
    };
    let config = "[engine]\nsession_gap_secs = 60\nfuture_grace_secs = 30\n";
    let mut engine = engine_with(config);
    let out = feed(&mut engine, Some(50));
    let idle = |s: &str| (s.to_string(), "idle_timeout".to_string());
    assert_eq!(closed_in(&out), vec![idle("c")], "a and b stay open");
    assert_eq!(engine.counters().future_events, 6);
    assert_eq!(engine.counters().late_events, 0);
    // c arrived at its limit (30 s past its message's timestamp) and closed a gap after
    // it; it keeps its own times.
    let ended = out.iter().find_map(|o| match o {
        Output::Summary(s) => Some(s.ended_at.clone()),
        _ => None,
    });
    assert_eq!(ended, Some(format_rfc3339_ms(start + 305_000 + day)));
    assert_eq!(engine.watermark(), Some(start + 599_000));
    // Read again 20 s later (a batch applied again after a restart), and as a backlog an
    // hour late: the same limits (from the messages' timestamps), the same ids of c.
    let ids = ids_of_c(&out);
    assert!(ids.len() > 1, "c's loop is found: {ids:?}");
    for late in [20_050, 3_600_000] {
        let mut engine = engine_with(config);
        let again = feed(&mut engine, Some(late));
        assert_eq!(closed_in(&again), vec![idle("c")], "read {late} ms late");
        assert_eq!(ids_of_c(&again), ids);
        assert_eq!(engine.counters().future_events, 6);
    }
    // A replay takes the time as it is: the clock jumps a day, a and b close idle, and
    // what follows of them is a day late.
    let mut engine = engine_with(config);
    let out = feed(&mut engine, None);
    assert_eq!(closed_in(&out), vec![idle("a"), idle("b")]);
    assert_eq!(engine.counters().future_events, 0);
    assert_eq!(engine.counters().late_events, 294);
}

#[test]
fn an_event_of_a_completed_session_stamped_before_its_end_opens_no_session_of_its_own() {
    let mut engine = engine_with("[engine]\nsession_gap_secs = 600\n");
    let start = 1_800_000_000_000i64;
    let mut out = Vec::new();
    let mut send =
        |engine: &mut Engine, body: serde_json::Value, session: &str, id: &str, at: i64| {
            let mut e = body;
            e["session_id"] = json!(session);
            e["event_id"] = json!(id);
            e["timestamp"] = json!(format_rfc3339_ms(start + at));
            let line = e.to_string();
            let ev = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
            engine.process(&ev, &EventMeta::default(), &mut out);
        };
    let done = json!({"type": "session.completed", "stop_reason": "done", "outcome": "success"});
    let cost = json!({"type": "cost.attributed", "input_tokens": 10, "output_tokens": 5});
    for (i, session) in ["a", "b", "c"].iter().enumerate() {
        let at = i as i64 * 1000;
        send(
            &mut engine,
            same_call(),
            session,
            &format!("{session}-0"),
            at,
        );
        send(
            &mut engine,
            done.clone(),
            session,
            &format!("{session}-done"),
            at + 5000,
        );
    }
    // a's gateway sends its last cost record after the completion (stamped before it), and
    // the runtime sends a's completion again; b goes on in a next run; c's straggler
    // comes after the linger.
    send(&mut engine, cost.clone(), "a", "a-cost", 4000);
    send(&mut engine, done.clone(), "a", "a-done", 5000);
    send(&mut engine, same_call(), "b", "b-next", 7000);
    send(
        &mut engine,
        same_call(),
        "other",
        "o-1",
        7000 + COMPLETED_LINGER_MS + 1,
    );
    send(&mut engine, cost, "c", "c-cost", 6000);
    assert_eq!(
        engine.counters().after_completion,
        2,
        "a's straggler and its completion"
    );
    assert!(engine.session("a").is_none());
    assert_eq!(
        engine.session("b").map(|s| s.stats.events),
        Some(1),
        "b's next run"
    );
    assert_eq!(
        engine.session("c").map(|s| s.stats.events),
        Some(1),
        "past the linger"
    );
    let closed = closed_in(&out);
    let done = |s: &str| (s.to_string(), "completed".to_string());
    assert_eq!(
        closed,
        vec![done("a"), done("b"), done("c")],
        "one summary each"
    );
    // Forgotten past the linger: nothing is held for them any more.
    assert!(engine.completed.is_empty(), "{:?}", engine.completed);
    assert!(engine.completed_order.is_empty());
}

#[test]
fn without_times_of_their_own_a_completed_sessions_next_events_open_it_again() {
    // Every event takes the clock's time, which never moves: none is a straggler, and
    // nothing is remembered to tell one by.
    let mut engine = engine_with("");
    let mut out = Vec::new();
    for (i, kind) in ["session.started", "session.completed", "session.started"]
        .iter()
        .enumerate()
    {
        let e = json!({"type": kind, "session_id": "a", "event_id": format!("a{i}")});
        let line = e.to_string();
        let ev = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
        engine.process(&ev, &EventMeta::default(), &mut out);
    }
    assert_eq!(engine.counters().after_completion, 0);
    assert_eq!(engine.session("a").map(|s| s.stats.events), Some(1));
    assert!(engine.completed.is_empty());
    // A completion with a time of its own, then an event without one, which takes the
    // clock's time, the session's end: opened as the next run, and the end forgotten.
    let events = [
        json!({"type": "session.started", "timestamp": "2026-01-01T00:00:00Z"}),
        json!({"type": "session.completed", "timestamp": "2026-01-01T00:00:01Z"}),
        json!({"type": "session.started"}),
    ];
    for (i, mut e) in events.into_iter().enumerate() {
        e["session_id"] = json!("b");
        e["event_id"] = json!(format!("b{i}"));
        let line = e.to_string();
        let ev = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
        engine.process(&ev, &EventMeta::default(), &mut out);
    }
    assert_eq!(engine.counters().after_completion, 0);
    assert_eq!(engine.session("b").map(|s| s.stats.events), Some(1));
    assert!(engine.completed.is_empty(), "{:?}", engine.completed);
}

#[test]
fn a_completed_session_is_remembered_across_a_restart_until_its_linger_ends() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[engine]\nsession_gap_secs = 600\n";
    let config = Arc::new(Config::from_toml_str(config, "t", std::iter::empty()).unwrap());
    let mut sled = store::SledStore::open(dir.path()).unwrap();
    let mut engine = Engine::restore(config.clone(), &sled).unwrap();
    let start = 1_800_000_000_000i64;
    let done = json!({"type": "session.completed", "stop_reason": "done"});
    let cost = json!({"type": "cost.attributed", "input_tokens": 10, "output_tokens": 5});
    process_as(&mut engine, same_call(), "a", 0, start);
    process_as(&mut engine, same_call(), "b", 0, start);
    process_as(&mut engine, done.clone(), "a", 1, start + 5000);
    engine.flush(&mut sled, &[]).unwrap();
    let stored = |sled: &store::SledStore| -> Vec<(String, bool)> {
        let mut ids: Vec<(String, bool)> = (sled.load_sessions().unwrap().into_iter())
            .map(|(id, state)| (id, state.as_completed_marker().is_some()))
            .collect();
        ids.sort();
        ids
    };
    let a_marked = ("a".to_string(), true);
    assert_eq!(
        stored(&sled),
        vec![a_marked.clone(), ("b".to_string(), false)]
    );
    // A restart: a's straggler is still known for one.
    let mut engine = Engine::restore(config.clone(), &sled).unwrap();
    assert_eq!(engine.open_sessions(), 1, "b; a's marker is no session");
    assert!(process_as(&mut engine, cost.clone(), "a", 2, start + 4000).is_empty());
    assert_eq!(engine.counters().after_completion, 1);
    assert!(engine.session("a").is_none());
    engine.flush(&mut sled, &[]).unwrap();
    assert_eq!(stored(&sled)[0], a_marked, "kept while remembered");
    // Past the linger it is forgotten, and its marker deleted.
    let later = start + 5000 + COMPLETED_LINGER_MS + 1;
    process_as(&mut engine, same_call(), "b", 1, later);
    engine.flush(&mut sled, &[]).unwrap();
    assert_eq!(stored(&sled), vec![("b".to_string(), false)]);
    let mut engine = Engine::restore(config, &sled).unwrap();
    process_as(&mut engine, cost, "a", 3, start + 4000);
    assert_eq!(
        engine.session("a").map(|s| s.stats.events),
        Some(1),
        "a session again"
    );
}

/// Processes `body` as the `step`th event, of `session`, at `at`; returns what it caused.
fn process_as(
    engine: &mut Engine,
    mut body: serde_json::Value,
    session: &str,
    step: u32,
    at: i64,
) -> Vec<Output> {
    body["session_id"] = json!(session);
    body["event_id"] = json!(format!("{session}-{step}"));
    body["timestamp"] = json!(format_rfc3339_ms(at));
    let line = body.to_string();
    let ev = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
    let mut out = Vec::new();
    engine.process(&ev, &EventMeta::default(), &mut out);
    out
}

/// A batch's changes carry each changed session's state as it stands at the batch's end,
/// whether the batch changed it once (its bytes written right after that change, or at
/// the end when the batch before changed it more than once), more than once, or closed
/// it and opened it again; a session completed and not reopened is its marker, and a
/// delete once the linger forgets it.
#[test]
fn a_batch_writes_each_changed_session_as_it_stands_at_its_end() {
    let mut engine = Engine::restore(Arc::new(Config::default()), &store::MemoryStore::new())
        .expect("an empty store");
    let mut clock = 1_800_000_000_000i64;
    let mut step = 0;
    let mut send = |engine: &mut Engine, session: &str, body: serde_json::Value| {
        step += 1;
        clock += 1000;
        process_as(engine, body, session, step, clock);
    };
    let completed = json!({"type": "session.completed"});
    // "twice" is changed twice in the first three batches, then once (left to the batch's
    // end, the batch before having changed it twice), then once again (written right
    // after its change).
    for batch in 0..5 {
        send(&mut engine, "once", same_call());
        send(&mut engine, "twice", same_call());
        if batch < 3 {
            send(&mut engine, "twice", turn());
        }
        send(&mut engine, "reopened", same_call());
        send(&mut engine, "reopened", completed.clone());
        send(&mut engine, "reopened", turn());
        send(&mut engine, "closed", turn());
        send(&mut engine, "closed", completed.clone());
        let changes = engine.take_changes(&[]).expect("tracked");
        let puts: std::collections::BTreeMap<_, _> = changes.puts.into_iter().collect();
        for id in ["once", "twice", "reopened"] {
            let now = engine.session(id).expect("open").to_bytes();
            assert_eq!(
                puts.get(id).map(|v| &v[..]),
                Some(&now[..]),
                "{id} after batch {batch}"
            );
        }
        let marker = puts
            .get("closed")
            .map(|v| SessionState::from_bytes(v).unwrap());
        let remembered = engine.completed.get("closed").copied();
        assert!(remembered.is_some());
        assert_eq!(marker.and_then(|m| m.as_completed_marker()), remembered);
        assert_eq!(puts.len(), 4, "{:?}", puts.keys());
        assert_eq!(changes.deletes, Vec::<String>::new());
    }
    process_as(
        &mut engine,
        same_call(),
        "once",
        100,
        clock + COMPLETED_LINGER_MS + 1,
    );
    let changes = engine.take_changes(&[]).expect("tracked");
    assert_eq!(changes.deletes, vec!["closed".to_string()], "forgotten");
    let puts: Vec<&str> = changes.puts.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(puts, ["once"]);
}

/// A batch that changes more sessions than `take_changes` drains at a time (several of
/// its chunks, each session's state taken a few after it was found): every changed
/// session once, as it stands at the batch's end, whether written early (changed once),
/// left to the end (changed again, or once after a batch that changed it twice), or
/// changed and then completed (its marker); whether the next batch writes it early
/// or leaves it to its end; its deltas, one for each state written before, in put order;
/// and sled, fed the batches, rebuilding the engine's states from them. Last, a batch of
/// exactly two chunks.
#[test]
fn a_batch_of_many_chunks_takes_each_changed_session_once_as_it_stands() {
    use std::collections::{BTreeMap, BTreeSet};
    let sessions = 2 * super::TAKE_CHUNK + 300;
    let mut engine = Engine::restore(Arc::new(Config::default()), &store::MemoryStore::new())
        .expect("an empty store");
    let dir = tempfile::tempdir().unwrap();
    let mut sled = store::SledStore::open(dir.path()).unwrap();
    let (mut clock, mut step) = (1_800_000_000_000i64, 0);
    let completed = json!({"type": "session.completed"});
    let id_of = |i: usize| format!("s{i:05}");
    for batch in 0..5 {
        let mut changed: BTreeSet<String> = BTreeSet::new();
        let mut closed = Vec::new();
        let touched = if batch < 4 {
            sessions
        } else {
            2 * super::TAKE_CHUNK
        };
        for i in 0..touched {
            let id = id_of(i);
            // A third of them changed once a batch; a third twice in the first two
            // batches, then once (left to the batch's end, then written early); the
            // rest once in the even batches, every hundredth of them closed in the third
            // after its change; in the last batch, every one of the first two chunks'
            // worth once (those closed open again).
            let closes = i % 3 == 2 && batch == 2 && i % 100 == 2;
            let times = match i % 3 {
                _ if batch == 4 => 1,
                0 => 1,
                1 if batch < 2 => 2,
                1 => 1,
                _ => usize::from(batch % 2 == 0),
            };
            for _ in 0..times {
                step += 1;
                clock += 1;
                process_as(&mut engine, same_call(), &id, step, clock);
                changed.insert(id.clone());
            }
            if closes {
                step += 1;
                process_as(&mut engine, completed.clone(), &id, step, clock);
                closed.push(id);
            }
        }
        // Those changed twice (and once in the third batch, after two batches that changed
        // them twice) are taken at the batch's end: each one written before must be taken
        // as a delta too. (A state written early took its delta, or not, as it was written.)
        let taken_at_the_end_with_a_base: BTreeSet<String> = (0..touched)
            .filter(|i| i % 3 == 1 && batch < 3)
            .map(id_of)
            .filter(|id| engine.session(id).is_some_and(|s| s.written_before()))
            .collect();
        let changes = engine.take_changes(&[]).expect("tracked");
        let indexes: Vec<u32> = changes.deltas.iter().map(|(i, _)| *i).collect();
        assert!(
            indexes.windows(2).all(|w| w[0] < w[1])
                && indexes
                    .last()
                    .is_none_or(|&i| (i as usize) < changes.puts.len()),
            "deltas by their puts' index, ascending"
        );
        let with_deltas: BTreeSet<&str> = indexes
            .iter()
            .map(|&i| changes.puts[i as usize].0.as_str())
            .collect();
        if batch == 0 {
            assert!(with_deltas.is_empty(), "no state was written before");
        } else if batch < 3 {
            assert!(
                !taken_at_the_end_with_a_base.is_empty(),
                "batch {batch} takes states written before at its end"
            );
        }
        for id in &taken_at_the_end_with_a_base {
            assert!(
                with_deltas.contains(id.as_str()),
                "{id}'s delta, batch {batch}"
            );
        }
        let puts: BTreeMap<_, _> = changes
            .puts
            .iter()
            .map(|(id, state)| (id.clone(), state.clone()))
            .collect();
        assert_eq!(puts.len(), changes.puts.len(), "each session once");
        // Those completed too: their markers.
        assert_eq!(
            puts.keys().cloned().collect::<BTreeSet<_>>(),
            changed,
            "batch {batch}"
        );
        if batch == 4 {
            assert_eq!(puts.len(), 2 * super::TAKE_CHUNK);
        }
        for (id, state) in &puts {
            let now = engine
                .stored_view(id)
                .expect("open or remembered")
                .to_bytes();
            assert!(state[..] == now[..], "{id} after batch {batch}");
            let marked = SessionState::from_bytes(state)
                .unwrap()
                .as_completed_marker();
            assert_eq!(
                marked.is_some(),
                closed.contains(id),
                "{id} after batch {batch}"
            );
        }
        assert_eq!(changes.deletes, Vec::<String>::new(), "batch {batch}");
        // Changed twice: the next batch leaves it to its end; else it writes it early.
        for i in 0..touched {
            if let Some(slot) = engine.sessions.get(&id_of(i)) {
                let twice = i % 3 == 1 && batch < 2;
                assert_eq!(slot.changed_again, twice, "s{i:05} after batch {batch}");
            }
        }
        sled.commit(&changes).unwrap();
    }
    let stored = sled.load_sessions().unwrap();
    assert_eq!(
        stored.len(),
        engine.open_sessions() + engine.completed.len()
    );
    for (id, state) in &stored {
        assert!(
            engine.stored_view(id).as_ref() == Some(state),
            "{id} as sled rebuilds it"
        );
    }
}

/// A session written right after its one change and closed later in the same batch (by
/// its idle deadline, not by its own event) is a delete, not a put; one that reopens
/// after is a put of its new state.
#[test]
fn a_session_closed_after_its_change_in_a_batch_is_not_put() {
    let config = Arc::new(Config::default());
    let gap = config.engine.session_gap_ms;
    let mut engine = Engine::restore(config, &store::MemoryStore::new()).expect("an empty store");
    let start = 1_800_000_000_000i64;
    let mut step = 0;
    let mut send = |engine: &mut Engine, session: &str, at: i64| {
        step += 1;
        process_as(engine, same_call(), session, step, at)
    };
    send(&mut engine, "idle", start);
    send(&mut engine, "busy", start);
    let first = engine.take_changes(&[]).expect("tracked");
    assert_eq!(first.puts.len(), 2);

    // A change of "idle", then "busy" moves the clock past both deadlines: both close,
    // and "busy" opens again with its event.
    send(&mut engine, "idle", start + 1000);
    let out = send(&mut engine, "busy", start + 1000 + gap + 1);
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::Summary(s) if s.session_id == "idle")),
        "idle closed"
    );
    let changes = engine.take_changes(&[]).expect("tracked");
    let puts: Vec<&str> = changes.puts.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(puts, ["busy"]);
    assert_eq!(changes.deletes, ["idle"]);

    // Changed, closed and opened again within one batch: its new state is put.
    let later = start + 1000 + gap + 1;
    send(&mut engine, "idle", later);
    send(&mut engine, "busy", later + 1000 + gap + 1);
    send(&mut engine, "idle", later + 1000 + gap + 2);
    let changes = engine.take_changes(&[]).expect("tracked");
    let puts: std::collections::BTreeMap<_, _> = changes.puts.into_iter().collect();
    assert_eq!(
        puts.get("idle").map(|v| v.to_vec()),
        Some(engine.session("idle").expect("open").to_bytes())
    );
    assert!(changes.deletes.is_empty(), "{:?}", changes.deletes);
}

#[test]
fn an_absurd_cost_is_summed_to_a_number_never_null() {
    // Costs near f64's largest, each valid: their sum, or its micro-dollars, must not go
    // infinite, which JSON writes as `null` ("the session reported no cost").
    let off = "[detectors.cost_cap]\nwarn_at = \"off\"\nterminate_at = \"off\"\n";
    let config = Arc::new(Config::from_toml_str(off, "t", std::iter::empty()).unwrap());
    let mut engine = Engine::new(config);
    let mut out = Vec::new();
    for i in 0..2 {
        let e = json!({"type": "cost.attributed", "session_id": "s", "event_id": format!("c{i}"),
            "input_tokens": 1, "output_tokens": 1, "cost_usd": 1e308});
        let line = e.to_string();
        let e = parse_event(line.as_bytes(), &ParseLimits::default()).unwrap();
        engine.process(&e, &EventMeta::default(), &mut out);
    }
    let summary = summary_at_the_end(&mut engine, out);
    assert_eq!(
        summary["stats"]["cost_usd"].as_f64(),
        Some(f64::MAX),
        "{summary}"
    );
}

#[test]
fn a_restored_state_that_counts_findings_of_a_detector_this_build_lacks_closes_without_them() {
    // A newer build's detector index in a state restored after a rollback (or written to
    // the changelog by anyone): the summary leaves it out instead of panicking.
    let mut engine = Engine::restore(Arc::new(Config::default()), &store::MemoryStore::new())
        .expect("an empty store");
    process_as(&mut engine, same_call(), "s", 1, 1_800_000_000_000);
    let mut state = engine.session("s").expect("open").clone();
    state.findings.push(state::FindingCounts {
        detector: detectors::DETECTOR_COUNT as u8,
        counts: [1, 0, 0],
    });
    let mut store = store::MemoryStore::new();
    store
        .commit(&store::StoreBatch {
            puts: vec![("s".to_string(), state.to_bytes().into())],
            ..store::StoreBatch::default()
        })
        .unwrap();
    let mut engine = Engine::restore(Arc::new(Config::default()), &store).unwrap();
    let summary = summary_at_the_end(&mut engine, Vec::new());
    assert_eq!(summary["findings"], json!({}), "{summary}");
}

/// Runs a generated fleet through an engine restored from a sled store, storing its
/// batches (whole states and deltas) there and in an in-memory store (whole states),
/// every `batch_events` events; every `reopen_every` batches the sled store is opened
/// afresh and the engine restored from it (its states read back, so their next writes
/// are whole), and once a sled batch fails part-way, its first retry fails to plan (after
/// finishing the writes sled did not take) and the second is taken. After every batch
/// the sled store's sessions must be the in-memory store's, and those the engine's.
/// Returns the deltas the sled store held after a batch, summed over the batches.
fn fleet_through_the_sled_store(seed: u64, batch_events: usize, reopen_every: usize) -> usize {
    use crate::tools::simulate::{Fleet, FleetSpec};
    let config = Arc::new(Config::default());
    let dir = tempfile::tempdir().unwrap();
    let mut sled = store::SledStore::open(dir.path()).unwrap();
    let mut memory = store::MemoryStore::new();
    let mut engine = Engine::restore(config.clone(), &sled).unwrap();
    let mut fleet = Fleet::new(FleetSpec {
        sessions: 16,
        concurrency: 6,
        loop_share: 0.5,
        seed,
    });
    let (limits, mut out) = (ParseLimits::default(), Vec::new());
    let (mut t, mut events, mut batches, mut deltas) = (1_763_000_000_000i64, 0, 0, 0);
    let mut failed = false;
    loop {
        let next = fleet.next_event(t);
        if let Some(e) = &next {
            t += 250;
            let event = parse_event(&e.json, &limits).expect("the fleet's events parse");
            engine.process(&event, &EventMeta::default(), &mut out);
            out.clear();
            events += 1;
        }
        if next.is_some() && events % batch_events != 0 {
            continue;
        }
        let batch = engine.take_changes(&[]).expect("tracked");
        if !failed && batches > 2 {
            failed = true;
            sled.fail_next_write_after(1 + batches % 3);
            assert!(sled.commit(&batch).is_err());
            sled.fail_next_plan();
            assert!(sled.commit(&batch).is_err());
        }
        sled.commit(&batch).unwrap();
        memory.commit(&batch).unwrap();
        deltas += sled.stored_deltas().unwrap();
        batches += 1;
        if batches % reopen_every == 0 {
            drop(sled);
            sled = store::SledStore::open(dir.path()).unwrap();
            engine = Engine::restore(config.clone(), &sled).unwrap();
        }
        let (stored, want) = (
            sled.load_sessions().unwrap(),
            memory.load_sessions().unwrap(),
        );
        let names =
            |v: &[(String, SessionState)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(&stored), names(&want), "after batch {batches}");
        for ((id, got), (_, want)) in stored.iter().zip(&want) {
            assert!(
                got == want,
                "{id} after batch {batches}: {}",
                first_difference(got, want)
            );
        }
        for (id, state) in &stored {
            assert_eq!(
                engine.stored_view(id).as_ref(),
                Some(state),
                "{id} after batch {batches}"
            );
        }
        if next.is_none() {
            return deltas;
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(6))]
    /// The sled store's chains of whole states and deltas rebuild the engine's states,
    /// across reopens, restores, folds and a batch sled took in part.
    #[test]
    fn the_sled_store_rebuilds_the_engines_states_from_its_deltas(
        seed in proptest::prelude::any::<u64>(),
        batch_events in 1usize..24,
        reopen_every in 2usize..9,
    ) {
        proptest::prop_assert!(fleet_through_the_sled_store(seed, batch_events, reopen_every) > 20);
    }
}

/// Where two states' debug forms first differ (a few dozen characters around it).
fn first_difference(a: &SessionState, b: &SessionState) -> String {
    let (a, b) = (format!("{a:?}"), format!("{b:?}"));
    let at = a
        .bytes()
        .zip(b.bytes())
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let from = at.saturating_sub(120);
    format!(
        "stored …{}… against …{}…",
        &a[from..(at + 60).min(a.len())],
        &b[from..(at + 60).min(b.len())]
    )
}

/// A batch taken and then dropped, not stored (an assignment lost): after
/// `forget_writes` the next batch's states rebuild the engine's from the store, though
/// the dropped batch's were marked written.
#[test]
fn a_dropped_batch_is_forgotten_and_the_next_writes_rebuild_the_states() {
    let dir = tempfile::tempdir().unwrap();
    let mut sled = store::SledStore::open(dir.path()).unwrap();
    let mut engine = Engine::restore(Arc::new(Config::default()), &sled).unwrap();
    let start = 1_800_000_000_000i64;
    let mut step = 0u32;
    let mut send = |engine: &mut Engine, n: usize| {
        for _ in 0..n {
            step += 1;
            let call = json!({"type": "tool.called", "tool": "read_file",
                "args": {"path": format!("f{step}")}, "result": format!("r{step}")});
            process_as(engine, call, "s", step, start + i64::from(step) * 1000);
        }
    };
    // A state of some size first, so that its chain has room for small deltas.
    send(&mut engine, 12);
    sled.commit(&engine.take_changes(&[]).unwrap()).unwrap();
    send(&mut engine, 1);
    sled.commit(&engine.take_changes(&[]).unwrap()).unwrap();
    assert_eq!(sled.stored_deltas().unwrap(), 1, "the chain takes deltas");
    send(&mut engine, 1);
    let dropped = engine.take_changes(&[]).unwrap();
    assert_eq!(dropped.deltas.len(), 1, "a delta was taken, then dropped");
    engine.forget_writes();
    send(&mut engine, 1);
    sled.commit(&engine.take_changes(&[]).unwrap()).unwrap();
    // Its delta holds its rings whole, about the whole state: the whole state is written.
    assert_eq!(sled.stored_deltas().unwrap(), 0);
    drop(sled);
    let sled = store::SledStore::open(dir.path()).unwrap();
    assert_eq!(
        sled.load_sessions().unwrap(),
        vec![("s".to_string(), engine.session("s").unwrap().clone())]
    );
}

/// (index, detector, level) of the findings of `events`, each given `labels`.
fn findings_labelled(
    config: &str,
    events: &[serde_json::Value],
    labels: impl Fn(usize) -> serde_json::Value,
) -> Vec<(usize, String, Level)> {
    let labelled: Vec<serde_json::Value> = (events.iter().enumerate())
        .map(|(i, e)| {
            let mut e = e.clone();
            for (k, v) in labels(i).as_object().unwrap() {
                e[k] = v.clone();
            }
            e
        })
        .collect();
    let found = findings(config, &labelled).into_iter();
    found.map(|(i, d, l, _)| (i, d, l)).collect()
}

#[test]
fn a_run_id_longer_than_a_label_is_one_run_and_two_alike_in_their_start_are_two() {
    let calls = vec![same_call(); 10];
    let short = findings_labelled("", &calls, |_| json!({"run_id": "r"}));
    assert!(short.iter().any(|f| f.2 == Level::Terminate), "{short:?}");
    // Compared whole with its cut, a long run id was a new run at each event: no finding.
    let long = findings_labelled("", &calls, |_| json!({"run_id": "r".repeat(300)}));
    assert_eq!(long, short);
    // Two runs of five calls each find nothing; ids alike in their first 200 bytes are
    // two runs all the same (cut alone, they were one of ten calls).
    let two = |a: &str, b: &str| {
        let (a, b) = (a.to_string(), b.to_string());
        findings_labelled(
            "",
            &calls,
            move |i| json!({"run_id": if i < 5 { a.clone() } else { b.clone() }}),
        )
    };
    let apart = two("r1", "r2");
    let prefix = "projects/p/locations/l/sessions/".repeat(7);
    let alike = two(&format!("{prefix}1"), &format!("{prefix}2"));
    assert!(!apart.iter().any(|f| f.2 == Level::Terminate), "{apart:?}");
    assert_eq!(alike, apart);
}

#[test]
fn a_long_tenants_or_agents_override_holds_at_every_event_and_across_a_restart() {
    let label = format!("tenants/{}", "acme-".repeat(40));
    for (key, pattern, field) in [
        ("tenant", label.as_str(), "tenant"),
        ("agent", &label, "agent_id"),
        ("agent", "tenants/acme-acme-*", "agent_id"),
    ] {
        a_long_labels_override_holds(key, pattern, field, &label);
    }
}

/// An override naming `pattern` under `key` (`tenant`, or `agent`: the whole label, or
/// a glob on its start) holds for a session whose `field` is `label` (208 bytes), at
/// each of its events and across restarts.
fn a_long_labels_override_holds(key: &str, pattern: &str, field: &str, label: &str) {
    let config = format!(
        "[[overrides]]\n{key} = \"{pattern}\"\n[overrides.detectors.repeat]\nterminate_at = \"off\"\nwindow_terminate_at = \"off\"\n"
    );
    let calls = vec![same_call(); 10];
    let killed = |found: &[(usize, String, Level)]| {
        found
            .iter()
            .any(|f| f.1 == "repeat" && f.2 == Level::Terminate)
    };
    let other = findings_labelled(&config, &calls, |_| json!({field: "other"}));
    assert!(killed(&other), "{field}: {other:?}");
    // Resolved from the whole tenant at the first event and from its cut at the second,
    // the override held for one event; a literal agent that long never met the cut.
    let found = findings_labelled(&config, &calls, |_| json!({field: label}));
    assert!(!killed(&found), "{field}: {found:?}");
    // A restart resolves the policy from the stored labels: the same one.
    let dir = tempfile::tempdir().unwrap();
    let config = Arc::new(Config::from_toml_str(&config, "t", std::iter::empty()).unwrap());
    let mut sled = store::SledStore::open(dir.path()).unwrap();
    let start = 1_800_000_000_000i64;
    let mut call = same_call();
    call[field] = json!(label);
    let mut engine = Engine::restore(config.clone(), &sled).unwrap();
    let mut found = Vec::new();
    for step in 0..10 {
        if step % 3 == 2 {
            engine.flush(&mut sled, &[]).unwrap();
            engine = Engine::restore(config.clone(), &sled).unwrap();
        }
        let at = start + i64::from(step) * 1000;
        for o in process_as(&mut engine, call.clone(), "s", step, at) {
            if let Output::Finding(f) = o {
                found.push((step as usize, f.detector.name().to_string(), f.level));
            }
        }
    }
    assert!(found.iter().any(|f| f.1 == "repeat"), "{field}: {found:?}");
    assert!(!killed(&found), "{field}: {found:?}");
}

#[test]
fn a_tool_named_longer_than_any_real_one_is_classified_each_time_not_cached() {
    let mut engine = engine_with("");
    let long = "t".repeat(MAX_SHOWN_TOOL_NAME + 1);
    let start = 1_800_000_000_000i64;
    for (step, tool) in [long.as_str(), "read", long.as_str()]
        .into_iter()
        .enumerate()
    {
        let call = json!({"type": "tool.called", "tool": tool, "args": {}, "result": "x"});
        process_as(
            &mut engine,
            call,
            "s",
            step as u32,
            start + step as i64 * 1000,
        );
    }
    let cached: Vec<&String> = engine.work.classes.keys().collect();
    assert_eq!(cached, ["read"]);
}

#[test]
fn an_event_naming_another_tenant_than_its_session_had_is_counted() {
    let mut engine = engine_with("");
    let start = 1_800_000_000_000i64;
    // Calls apart (no loop, no termination), labelled as given.
    let call = |step: u32, tenant: Option<&str>, agent: &str| {
        let mut c =
            json!({"type": "tool.called", "tool": "read", "args": {"p": step}, "result": step});
        c["agent_id"] = json!(agent);
        if let Some(t) = tenant {
            c["tenant"] = json!(t);
        }
        c
    };
    let process = |engine: &mut Engine, step: u32, tenant: Option<&str>, agent: &str| {
        let at = start + i64::from(step) * 1000;
        process_as(engine, call(step, tenant, agent), "s", step, at)
    };
    // No tenant, then one, then the same one from another agent (a handoff): none.
    for (step, tenant, agent) in [
        (0, None, "a"),
        (1, Some("acme"), "a"),
        (2, Some("acme"), "b"),
    ] {
        process(&mut engine, step, tenant, agent);
    }
    assert_eq!(engine.counters().other_tenant_events, 0);
    // Another tenant under the same id, and back: two, each telling the one before.
    process(&mut engine, 3, Some("globex"), "a");
    assert_eq!(engine.take_other_tenant_was().as_deref(), Some("acme"));
    process(&mut engine, 4, Some("acme"), "a");
    process(&mut engine, 5, Some("acme"), "a");
    assert_eq!(engine.counters().other_tenant_events, 2);
    assert_eq!(engine.take_other_tenant_was().as_deref(), Some("globex"));
    // Terminated, the session's events are dropped, and another tenant's still told.
    let mut engine = engine_with("");
    let mut out = Vec::new();
    for step in 0..12 {
        out.extend(process_as(&mut engine, json!({"type": "tool.called", "tool": "read", "args": {}, "result": "x", "tenant": "acme"}), "s", step, start + i64::from(step) * 1000));
    }
    assert!(
        engine.session("s").is_some_and(|s| s.is_tombstone()),
        "{out:?}"
    );
    let dropped = engine.counters().dropped_after_termination;
    process(&mut engine, 20, Some("globex"), "a");
    assert_eq!(engine.counters().other_tenant_events, 1);
    assert_eq!(engine.counters().dropped_after_termination, dropped + 1);
    assert_eq!(engine.take_other_tenant_was().as_deref(), Some("acme"));
}

#[test]
fn a_long_tenant_a_build_before_stored_cut_is_no_other_tenant() {
    // A state stored before labels were kept with a digest holds a long one cut to 64
    // bytes. The session's next event, naming its tenant whole, names no other tenant;
    // its run id, as long, starts a new run once (a 64-byte run id and a longer one that
    // starts with it are two runs: taking the cut for the same run would join them).
    let long = format!("tenants/{}", "acme-".repeat(40));
    let mut engine = engine_with("");
    let start = 1_800_000_000_000i64;
    let labelled = |step: u32| json!({"type": "tool.called", "tool": "read", "args": {}, "result": "x", "tenant": long, "run_id": long, "event_id": format!("e{step}")});
    process_as(&mut engine, labelled(0), "s", 0, start);
    let slot = engine.sessions.get_mut("s").unwrap();
    slot.state.tenant = Some(long[..64].to_string());
    slot.state.run_id = Some(long[..64].to_string());
    let mut found = Vec::new();
    for step in 1..6 {
        let at = start + i64::from(step) * 1000;
        found.extend(process_as(&mut engine, labelled(step), "s", step, at));
    }
    assert_eq!(engine.counters().other_tenant_events, 0);
    let st = engine.session("s").unwrap();
    assert_eq!(st.run_id.as_deref(), Some(&*state::kept_label(&long)));
    assert_eq!(st.tenant.as_deref(), Some(&*state::kept_label(&long)));
    // A new run at the first event after the cut: `repeat` warns at its third call.
    let first_repeat = found.iter().find_map(|o| match o {
        Output::Finding(f) if f.detector == DetectorKind::Repeat => {
            Some(f.trigger.event_id.clone())
        }
        _ => None,
    });
    assert_eq!(first_repeat.as_deref(), Some("s-3"), "{found:?}");
}

/// A terminated session that goes on sending events was not stopped by its runtime: its
/// 8th event since the termination (more than the calls in flight then) and each later
/// power of two are told (for the metric and the log), with the detector and how long
/// after; its `session.completed` is not (a runtime that stopped it sends one). The
/// count is the state's, so a restart from the store tells the same events.
#[test]
fn a_terminated_session_that_goes_on_is_told_at_its_8th_event() {
    let dir = tempfile::tempdir().unwrap();
    let config = Arc::new(Config::from_toml_str("", "t", std::iter::empty()).unwrap());
    let mut sled = store::SledStore::open(dir.path()).unwrap();
    let mut engine = Engine::restore(config.clone(), &sled).unwrap();
    let start = 1_800_000_000_000i64;
    // The same call a second apart: a loop.
    let next = |engine: &mut Engine, step: u32| {
        let out = process_as(
            engine,
            same_call(),
            "s",
            step,
            start + i64::from(step) * 1000,
        );
        (out, engine.take_unheeded_termination())
    };
    let mut step = 0;
    loop {
        let (out, told) = next(&mut engine, step);
        step += 1;
        assert_eq!(told, None, "nothing told before the termination");
        if out
            .iter()
            .any(|o| matches!(o, Output::Finding(f) if f.level == Level::Terminate))
        {
            break;
        }
        assert!(step < 40, "the loop was never terminated");
    }
    let mut told = Vec::new();
    for after in 1..=15u32 {
        if after == 6 {
            // A restart from the store in between.
            engine.flush(&mut sled, &[]).unwrap();
            engine = Engine::restore(config.clone(), &sled).unwrap();
        }
        let (out, said) = next(&mut engine, step);
        step += 1;
        assert!(
            out.is_empty(),
            "a terminated session's event is dropped: {out:?}"
        );
        if let Some(u) = said {
            assert_eq!(u.detector.name(), "repeat");
            told.push((u.events, u.after_ms));
        }
    }
    assert_eq!(told, [(8, 8000)]);
    assert_eq!(
        engine.counters().dropped_after_termination,
        10,
        "since the restart"
    );
    // The 16th: the runtime's `session.completed`, which closes it, untold.
    let done = json!({"type": "session.completed", "stop_reason": "cancelled"});
    let out = process_as(&mut engine, done, "s", step, start + i64::from(step) * 1000);
    assert_eq!(engine.take_unheeded_termination(), None);
    assert!(engine.session("s").is_none(), "closed: {out:?}");
}

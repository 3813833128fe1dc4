//! The detectors of DESIGN §3 as pure functions: (session state after the event, what the
//! event was, the detector's policy) in, a signal out; and, only when a finding is
//! emitted, its reason, hint and evidence.
//!
//! Guarantees: no I/O, no clock, no randomness: the same inputs give the same signal;
//! a detector that does not apply to an event returns `None` and leaves its episode
//! alone; every finding gets a one-sentence hint fit to show the agent.

use serde_json::{json, Map, Value};

use crate::policy::{DetectorKind, DetectorPolicy, Level};
use crate::state::{SessionState, ToolFacts, ToolObservation};
use crate::text::Chant;

/// What the event was, as far as the detectors care.
#[derive(Debug, Clone, Copy)]
pub enum Context<'a> {
    Llm(LlmContext),
    Tool(ToolContext<'a>),
    /// Lifecycle events and anything else: only ceilings are judged.
    Other,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct LlmContext {
    pub is_turn: bool,
    pub is_compaction: bool,
    pub has_progress: bool,
    pub has_tool_calls: bool,
    pub has_text: bool,
    pub chant: Option<Chant>,
}

#[derive(Debug, Clone, Copy)]
pub struct ToolContext<'a> {
    pub tool: &'a str,
    pub obs: ToolObservation,
    pub facts: ToolFacts,
}

/// A detector's reading for one event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Signal {
    pub value: f64,
    /// The highest level reached and the threshold it crossed.
    pub level: Option<(Level, f64)>,
    /// The signal reset: the current episode is over.
    pub reset: bool,
}

fn plain(value: f64, policy: &DetectorPolicy) -> Option<Signal> {
    let level = policy.level_for(value);
    let below = policy.lowest_threshold().is_none_or(|t| value < t - 1e-9);
    Some(Signal {
        value,
        level,
        reset: below,
    })
}

/// Judges one detector on one event.
pub fn evaluate(
    kind: DetectorKind,
    st: &SessionState,
    ctx: &Context<'_>,
    policy: &DetectorPolicy,
    depth: Option<u32>,
) -> Option<Signal> {
    use DetectorKind::*;
    let r = &st.run;
    let s = &st.stats;
    match kind {
        TurnCap => plain(s.llm_calls as f64, policy),
        ToolCallCap => plain(s.tool_calls as f64, policy),
        TokenCap => plain(
            s.input_tokens.saturating_add(s.output_tokens) as f64,
            policy,
        ),
        CostCap => s.has_cost.then(|| plain(s.cost_usd, policy)).flatten(),
        WallClockCap => plain(st.wall_seconds(), policy),
        TokenRatio => {
            let total = s.input_tokens.saturating_add(s.output_tokens);
            if total < policy.params.min_tokens || !matches!(ctx, Context::Llm(_)) {
                return None;
            }
            plain(
                s.output_tokens as f64 / s.input_tokens.max(1) as f64,
                policy,
            )
        }
        DepthCap => depth.and_then(|d| plain(d as f64, policy)),
        Repeat => {
            let Context::Tool(t) = ctx else { return None };
            if t.obs.poll || t.obs.retry_safe {
                return None;
            }
            let mut sig = plain(r.repeat_streak as f64, policy)?;
            if let Some(w) = policy.params.window_terminate_at {
                if t.facts.pair_count as f64 >= w
                    && sig.level.is_none_or(|(l, _)| l < Level::Terminate)
                {
                    sig.level = Some((Level::Terminate, w));
                    sig.value = t.facts.pair_count as f64;
                    sig.reset = false;
                }
            }
            Some(sig)
        }
        GenericRepeat => {
            let Context::Tool(t) = ctx else { return None };
            if t.obs.poll {
                return None;
            }
            plain(
                t.facts.action_count.max(t.facts.subject_count) as f64,
                policy,
            )
        }
        PollNoProgress => {
            let Context::Tool(t) = ctx else { return None };
            if !t.obs.poll {
                return None;
            }
            plain(t.facts.poll_unchanged as f64, policy)
        }
        PingPong => {
            let Context::Tool(_) = ctx else { return None };
            plain(r.alternation as f64, policy)
        }
        Cycle => {
            let Context::Tool(t) = ctx else { return None };
            plain(t.facts.cycle.map_or(0, |(_, n)| n) as f64, policy)
        }
        ErrorRepeat => {
            let Context::Tool(t) = ctx else { return None };
            if t.obs.retry_safe {
                return None;
            }
            plain(r.error_repeat_streak as f64, policy)
        }
        UnknownTool => {
            let Context::Tool(_) = ctx else { return None };
            plain(r.unknown_tool_streak as f64, policy)
        }
        ErrorStreak => {
            let Context::Tool(_) = ctx else { return None };
            plain(r.error_streak as f64, policy)
        }
        CircuitBreaker => {
            let Context::Tool(_) = ctx else { return None };
            let w = policy.params.window_calls.min(64);
            let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
            plain((r.no_progress_bits & mask).count_ones() as f64, policy)
        }
        LowNovelty => {
            let Context::Tool(t) = ctx else { return None };
            if t.obs.poll || (t.facts.recent_len as usize) < policy.params.last_calls {
                return None;
            }
            let ratio = t.facts.recent_distinct as f64 / t.facts.recent_len as f64;
            plain(
                if ratio < policy.params.min_ratio {
                    1.0
                } else {
                    0.0
                },
                policy,
            )
        }
        WriteNoEffect => {
            let Context::Tool(t) = ctx else { return None };
            if !t.obs.write {
                return None;
            }
            plain(t.facts.pair_count.saturating_sub(1) as f64, policy)
        }
        Stall => match ctx {
            Context::Llm(l) if l.is_turn && l.has_tool_calls => plain(r.stall as f64, policy),
            _ => None,
        },
        SimilarTurns => match ctx {
            Context::Llm(l) if l.is_turn && l.has_text => plain(r.similar_streak as f64, policy),
            _ => None,
        },
        RepetitiveText => match ctx {
            Context::Llm(l) if l.has_text => {
                plain(if l.chant.is_some() { 1.0 } else { 0.0 }, policy)
            }
            _ => None,
        },
        NoProgress => match ctx {
            Context::Llm(l) if l.has_progress => plain(r.progress_stale as f64, policy),
            _ => None,
        },
        NoNewInformation => match ctx {
            Context::Llm(l) if l.is_turn => plain(r.no_new_info_streak as f64, policy),
            _ => None,
        },
        CompactionLoop => match ctx {
            Context::Llm(l) if l.is_compaction => plain(r.compaction_streak as f64, policy),
            _ => None,
        },
    }
}

/// What a finding says: one line for people, one sentence for the agent, and evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Description {
    pub reason: String,
    pub hint: String,
    pub evidence: Map<String, Value>,
}

fn fp_hex(v: u64) -> String {
    format!("{v:016x}")
}

fn recent_calls(st: &SessionState, n: usize) -> Value {
    let w = &st.run.window;
    let start = w.len().saturating_sub(n);
    Value::Array(
        w.range(start..)
            .map(|c| json!({"action": fp_hex(c.action), "result": fp_hex(c.result), "error": c.is_error()}))
            .collect(),
    )
}

fn num(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9e15 {
        json!(v as i64)
    } else {
        json!((v * 1e6).round() / 1e6)
    }
}

/// Builds the reason, hint and evidence of a finding (cold path: only on emission).
pub fn describe(
    kind: DetectorKind,
    st: &SessionState,
    ctx: &Context<'_>,
    sig: &Signal,
    threshold: f64,
) -> Description {
    use DetectorKind::*;
    let tool = match ctx {
        Context::Tool(t) => t.tool,
        _ => "",
    };
    let v = sig.value;
    let vi = v as u64;
    let ti = threshold as u64;
    let mut ev = Map::new();
    ev.insert("value".into(), num(v));
    ev.insert("threshold".into(), num(threshold));
    let (reason, hint) = match kind {
        TurnCap => (
            format!("{vi} LLM calls in the session (limit {ti})"),
            "you have used most of this session's step budget; finish the task or report what blocks you".to_string(),
        ),
        ToolCallCap => (
            format!("{vi} tool calls in the session (limit {ti})"),
            "you have made very many tool calls in this session; wrap up or explain what is blocking you".to_string(),
        ),
        TokenCap => (
            format!("{vi} tokens used in the session (limit {ti})"),
            "this session has used most of its token budget; finish with what you have".to_string(),
        ),
        CostCap => (
            format!("cost {:.2} USD in the session (limit {:.2})", v, threshold),
            format!("this session has spent {:.2} USD of its {:.2} USD budget; finish with what you have", v, threshold),
        ),
        WallClockCap => (
            format!("session running for {vi} s (limit {ti} s)"),
            "this session has been running for a long time; finish the task or report what blocks you".to_string(),
        ),
        TokenRatio => (
            format!("output/input token ratio {:.1} (limit {:.1})", v, threshold),
            "you are generating far more text than you read; stop and check whether the output is what was asked".to_string(),
        ),
        DepthCap => (
            format!("sub-agent depth {vi} (limit {ti})"),
            "sub-agents are nested very deep; do the work here instead of delegating again".to_string(),
        ),
        Repeat => {
            let Context::Tool(t) = ctx else { unreachable!("repeat is judged on tool calls") };
            ev.insert("in_a_row".into(), json!(st.run.repeat_streak));
            ev.insert("in_window".into(), json!(t.facts.pair_count));
            ev.insert("action".into(), json!(fp_hex(t.obs.action)));
            ev.insert("result".into(), json!(fp_hex(t.obs.result)));
            ev.insert("recent".into(), recent_calls(st, 8));
            (
                format!("`{tool}` called with the same arguments and the same result {} times in a row ({} in the last {} calls)", st.run.repeat_streak, t.facts.pair_count, st.run.window.len()),
                format!("you called `{tool}` with the same arguments {} times and got the same result; try something different", st.run.repeat_streak.max(t.facts.pair_count)),
            )
        }
        GenericRepeat => {
            ev.insert("recent".into(), recent_calls(st, 10));
            (
                format!("`{tool}` called with the same arguments {vi} times in the last {} calls", st.run.window.len()),
                format!("you called `{tool}` with the same arguments {vi} times recently; make sure each call moves the task forward"),
            )
        }
        PollNoProgress => {
            let Context::Tool(t) = ctx else { unreachable!() };
            ev.insert("action".into(), json!(fp_hex(t.obs.action)));
            ev.insert("result".into(), json!(fp_hex(t.obs.result)));
            (
                format!("polling `{tool}` returned the same result {vi} more times"),
                format!("`{tool}` has returned the same status {vi} times; stop polling and check whether the job is stuck or already finished"),
            )
        }
        PingPong => {
            ev.insert("alternation".into(), json!(st.run.alternation));
            ev.insert("recent".into(), recent_calls(st, 6));
            (
                format!("two calls alternate with unchanged results for {vi} calls"),
                "you are alternating between the same two calls and getting the same results; step back and try a different approach".to_string(),
            )
        }
        Cycle => {
            let Context::Tool(t) = ctx else { unreachable!() };
            let (k, n) = t.facts.cycle.unwrap_or((0, 0));
            ev.insert("cycle_length".into(), json!(k));
            ev.insert("repeats".into(), json!(n));
            ev.insert("recent".into(), recent_calls(st, k * 2));
            (
                format!("the same {k} calls repeat in a cycle {n} times with unchanged results"),
                format!("you are repeating the same sequence of {k} calls and getting the same results; try something different"),
            )
        }
        ErrorRepeat => (
            format!("`{tool}` failed {vi} times in a row with the same arguments"),
            format!("`{tool}` keeps failing with the same arguments; read the error and change the call instead of retrying it"),
        ),
        UnknownTool => (
            format!("{vi} calls in a row to tools that do not exist (last: `{tool}`)"),
            format!("`{tool}` is not an available tool; use one of the tools you were given"),
        ),
        ErrorStreak => (
            format!("{vi} failing tool calls in a row"),
            "your last tool calls all failed; stop and rethink the approach before calling more tools".to_string(),
        ),
        CircuitBreaker => (
            format!("{vi} of the recent tool calls repeated an earlier call and result"),
            "most of your recent tool calls repeated earlier ones without new results; stop and report what blocks you".to_string(),
        ),
        LowNovelty => {
            let Context::Tool(t) = ctx else { unreachable!() };
            let ratio = t.facts.recent_distinct as f64 / t.facts.recent_len.max(1) as f64;
            ev.insert("distinct".into(), json!(t.facts.recent_distinct));
            ev.insert("calls".into(), json!(t.facts.recent_len));
            ev.insert("ratio".into(), num(ratio));
            (
                format!("only {} distinct call/result pairs among the last {} calls", t.facts.recent_distinct, t.facts.recent_len),
                "your recent tool calls keep returning what you already have; try a different source or approach".to_string(),
            )
        }
        WriteNoEffect => (
            format!("write `{tool}` gave an unchanged result {vi} more times for the same call"),
            format!("your `{tool}` edit does not change anything; check that the target and content are right"),
        ),
        Stall => (
            format!("{vi} turns in a row without any tool call"),
            "you have described what you will do several times without doing it; call the tool now or say what blocks you".to_string(),
        ),
        SimilarTurns => (
            format!("{vi} turns in a row nearly repeat an earlier turn"),
            "your last replies say nearly the same thing; move the task forward or say what blocks you".to_string(),
        ),
        RepetitiveText => {
            let Context::Llm(l) = ctx else { unreachable!() };
            if let Some(c) = l.chant {
                ev.insert("repeats".into(), json!(c.repeats));
                ev.insert("avg_spacing_chars".into(), num(c.avg_spacing));
                ev.insert("chunk_chars".into(), json!(c.chunk));
            }
            (
                "the reply repeats the same passage over and over".to_string(),
                "your last reply repeated the same text many times; stop and say plainly what you will do next".to_string(),
            )
        }
        NoProgress => {
            ev.insert("best_progress".into(), st.run.best_progress.map(num).unwrap_or(Value::Null));
            (
                format!("progress has not improved for {vi} reports"),
                "your progress has not improved for a while; change the approach or report what blocks you".to_string(),
            )
        }
        NoNewInformation => (
            format!("{vi} turns in a row whose tool results were all seen before"),
            "your recent tool calls only returned things you had already seen; look somewhere new".to_string(),
        ),
        CompactionLoop => (
            format!("{vi} history compactions without any tool call in between"),
            "the conversation keeps being compacted without any work in between; do one concrete step now".to_string(),
        ),
    };
    Description {
        reason,
        hint,
        evidence: ev,
    }
}

#[cfg(test)]
mod tests {
    //! Each detector at and around its thresholds, driven through the engine with
    //! synthetic events (event time is the events' own: tests drive the clock).
    use std::sync::Arc;

    use serde_json::{json, Value};

    use crate::config::Config;
    use crate::engine::{Engine, EventMeta};
    use crate::event::{parse_event, ParseLimits};
    use crate::output::{ClosedBy, Output};
    use crate::policy::{DetectorKind, Level, Mode};

    /// Runs events (session "s", one second apart) and returns (index, detector, level, mode).
    fn run_with(config: &str, events: &[Value]) -> Vec<(usize, DetectorKind, Level, Mode)> {
        let config = Arc::new(Config::from_toml_str(config, "test", std::iter::empty()).unwrap());
        let mut engine = Engine::new(config);
        let mut found = Vec::new();
        for (i, e) in events.iter().enumerate() {
            let mut e = e.clone();
            let o = e.as_object_mut().unwrap();
            o.entry("session_id").or_insert(json!("s"));
            o.insert("event_id".into(), json!(format!("e{i}")));
            o.entry("timestamp").or_insert(json!(format!(
                "2026-01-01T00:{:02}:{:02}Z",
                i / 60 % 60,
                i % 60
            )));
            let ev = parse_event(e.to_string().as_bytes(), &ParseLimits::default()).unwrap();
            let mut out = Vec::new();
            engine.process(&ev, &EventMeta::default(), &mut out);
            for o in out {
                if let Output::Finding(f) = o {
                    found.push((i, f.detector, f.level, f.mode));
                }
            }
        }
        found
    }

    fn run(events: &[Value]) -> Vec<(usize, DetectorKind, Level)> {
        run_with("", events)
            .into_iter()
            .map(|(i, d, l, _)| (i, d, l))
            .collect()
    }

    /// The (index, level) findings of one detector under a config.
    fn of_with(config: &str, events: &[Value], kind: DetectorKind) -> Vec<(usize, Level)> {
        run_with(config, events)
            .into_iter()
            .filter(|f| f.1 == kind)
            .map(|f| (f.0, f.2))
            .collect()
    }

    fn of(found: &[(usize, DetectorKind, Level)], kind: DetectorKind) -> Vec<(usize, Level)> {
        found
            .iter()
            .filter(|f| f.1 == kind)
            .map(|f| (f.0, f.2))
            .collect()
    }

    fn call(tool: &str, args: Value, result: Value) -> Value {
        json!({"type": "tool.called", "tool": tool, "args": args, "result": result})
    }

    fn fail(tool: &str, args: Value, kind: Option<&str>) -> Value {
        let mut v = json!({"type": "tool.called", "tool": tool, "args": args, "result": "boom", "is_error": true});
        if let Some(k) = kind {
            v["error_kind"] = json!(k);
        }
        v
    }

    fn turn(tool_calls: u32, text: &str) -> Value {
        json!({"type": "cost.attributed", "input_tokens": 100, "output_tokens": 10, "tool_calls": tool_calls, "text": text})
    }

    fn llm(extra: Value) -> Value {
        let mut v = json!({"type": "cost.attributed", "input_tokens": 100, "output_tokens": 10});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    #[test]
    fn repeat_warns_at_3_and_terminates_at_4_in_a_row() {
        let evs: Vec<Value> = (0..6)
            .map(|_| call("read", json!({"p": 1}), json!("x")))
            .collect();
        let f = run(&evs);
        assert_eq!(
            of(&f, DetectorKind::Repeat),
            vec![(2, Level::Warning), (3, Level::Terminate)]
        );
        // Tombstone: nothing after the termination.
        assert!(f.iter().all(|x| x.0 <= 3));
    }

    #[test]
    fn repeat_terminates_at_8_in_the_window_even_when_interleaved() {
        let mut evs = Vec::new();
        for i in 0..8 {
            evs.push(call("read", json!({"p": 1}), json!("x")));
            evs.push(call("other", json!({"i": i}), json!(i)));
        }
        let f = run(&evs);
        assert_eq!(of(&f, DetectorKind::Repeat), vec![(14, Level::Terminate)]);
    }

    #[test]
    fn a_changed_result_is_progress_for_repeat() {
        let evs: Vec<Value> = (0..12)
            .map(|i| call("read", json!({"p": 1}), json!(i)))
            .collect();
        let f = run(&evs);
        assert!(of(&f, DetectorKind::Repeat).is_empty());
        // ...but the arguments alone still count for generic_repeat (warn 10, no kill).
        assert_eq!(
            of(&f, DetectorKind::GenericRepeat),
            vec![(9, Level::Warning)]
        );
        assert!(f.iter().all(|x| x.2 != Level::Terminate));
    }

    #[test]
    fn generic_repeat_goes_critical_at_20_and_never_kills() {
        let evs: Vec<Value> = (0..25)
            .map(|i| call("exec", json!({"c": "date"}), json!(i)))
            .collect();
        let f = run(&evs);
        assert_eq!(
            of(&f, DetectorKind::GenericRepeat),
            vec![(9, Level::Warning), (19, Level::Critical)]
        );
    }

    #[test]
    fn polls_get_more_room_but_not_forever() {
        let evs: Vec<Value> = (0..22)
            .map(|_| call("job_status", json!({"id": 1}), json!({"status": "running"})))
            .collect();
        let f = run(&evs);
        assert!(of(&f, DetectorKind::Repeat).is_empty());
        assert_eq!(
            of(&f, DetectorKind::PollNoProgress),
            vec![(10, Level::Warning), (20, Level::Terminate)]
        );
    }

    #[test]
    fn a_pending_result_makes_any_tool_a_poll() {
        let evs: Vec<Value> = (0..5)
            .map(|_| {
                call(
                    "curl",
                    json!({"u": "/jobs/1"}),
                    json!("{\"state\": \"queued\"}"),
                )
            })
            .collect();
        assert!(run(&evs).is_empty());
    }

    #[test]
    fn ping_pong_warns_at_6_and_terminates_at_10() {
        let evs: Vec<Value> = (0..10)
            .map(|i| {
                if i % 2 == 0 {
                    call("a", json!(1), json!("A"))
                } else {
                    call("b", json!(2), json!("B"))
                }
            })
            .collect();
        let pp = of_with(
            "[detectors.low_novelty]\nmode = \"shadow\"\n",
            &evs,
            DetectorKind::PingPong,
        );
        assert_eq!(pp, vec![(5, Level::Warning), (9, Level::Terminate)]);
    }

    #[test]
    fn cycle_of_three_warns_at_4_repeats() {
        let evs: Vec<Value> = (0..18)
            .map(|i| call("t", json!(i % 3), json!(i % 3)))
            .collect();
        let f = run(&evs);
        assert_eq!(
            of(&f, DetectorKind::Cycle),
            vec![(11, Level::Warning), (17, Level::Terminate)]
        );
    }

    #[test]
    fn error_repeat_warns_at_2_and_terminates_at_3() {
        let evs: Vec<Value> = (0..3)
            .map(|_| fail("deploy", json!({"env": "prod"}), None))
            .collect();
        let f = run(&evs);
        assert_eq!(
            of(&f, DetectorKind::ErrorRepeat),
            vec![(1, Level::Warning), (2, Level::Terminate)]
        );
    }

    #[test]
    fn retry_safe_tools_are_exempt_from_repeat_and_error_repeat() {
        let evs: Vec<Value> = (0..4)
            .map(|_| fail("fetch", json!({"u": 1}), None))
            .collect();
        let f = run_with("[tools]\nretry_safe = [\"fetch\"]\n", &evs);
        assert!(
            f.iter()
                .all(|x| x.1 != DetectorKind::ErrorRepeat && x.1 != DetectorKind::Repeat),
            "{f:?}"
        );
    }

    #[test]
    fn unknown_tool_counts_calls_with_changing_args() {
        let evs: Vec<Value> = (0..10)
            .map(|i| fail("exec", json!({"c": i}), Some("unknown_tool")))
            .collect();
        let f = run(&evs);
        assert_eq!(
            of(&f, DetectorKind::UnknownTool),
            vec![(2, Level::Warning), (9, Level::Terminate)]
        );
    }

    #[test]
    fn error_streak_warns_at_5_and_is_critical_at_10() {
        let evs: Vec<Value> = (0..10)
            .map(|i| fail(&format!("t{i}"), json!(i), None))
            .collect();
        let f = run(&evs);
        assert_eq!(
            of(&f, DetectorKind::ErrorStreak),
            vec![(4, Level::Warning), (9, Level::Critical)]
        );
    }

    #[test]
    fn a_success_resets_the_error_streak() {
        let mut evs: Vec<Value> = (0..4)
            .map(|i| fail(&format!("t{i}"), json!(i), None))
            .collect();
        evs.push(call("ok", json!(1), json!("fine")));
        evs.extend((0..4).map(|i| fail(&format!("u{i}"), json!(i), None)));
        assert!(of(&run(&evs), DetectorKind::ErrorStreak).is_empty());
    }

    #[test]
    fn circuit_breaker_terminates_at_30_no_progress_calls_in_64() {
        // Three pairs rotating with unchanged results, padded with fresh calls so that no
        // shorter-range detector fires first.
        let cfg = "mode = \"shadow\"\n[detectors.circuit_breaker]\nmode = \"enforce\"\n";
        let mut evs = Vec::new();
        for i in 0..40 {
            evs.push(call("r", json!(i % 4), json!(i % 4)));
            evs.push(call("fresh", json!(i), json!(i)));
        }
        let f: Vec<_> = run_with(cfg, &evs)
            .into_iter()
            .filter(|x| x.1 == DetectorKind::CircuitBreaker)
            .collect();
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].2, Level::Terminate);
        // Calls 8, 10, 12, … are the repeats; the 30th such call is at index 66.
        assert_eq!(f[0].0, 66);
    }

    #[test]
    fn stall_counts_turns_without_tool_calls() {
        let evs: Vec<Value> = (0..5)
            .map(|i| turn(0, &format!("I will do step {i} now")))
            .collect();
        let f = run(&evs);
        assert_eq!(
            of(&f, DetectorKind::Stall),
            vec![(2, Level::Warning), (4, Level::Terminate)]
        );
    }

    #[test]
    fn stall_ignores_turns_that_do_not_say_tool_calls_and_resets_on_a_tool() {
        let mut evs = vec![turn(0, "a"), turn(0, "b")];
        evs.push(llm(json!({"text": "c"})));
        evs.push(call("read", json!(1), json!(1)));
        evs.push(turn(0, "d"));
        evs.push(turn(0, "e"));
        assert!(of(&run(&evs), DetectorKind::Stall).is_empty());
    }

    #[test]
    fn similar_turns_warns_at_3_and_terminates_at_5() {
        let mut evs = Vec::new();
        for _ in 0..6 {
            evs.push(turn(
                1,
                "I have verified the file and will now mark the task complete",
            ));
            evs.push(call("noop", json!(evs.len()), json!(evs.len())));
        }
        let f = run(&evs);
        assert_eq!(
            of(&f, DetectorKind::SimilarTurns),
            vec![(6, Level::Warning), (10, Level::Terminate)]
        );
    }

    #[test]
    fn repetitive_text_fires_once_on_a_chanting_turn() {
        let evs = vec![turn(
            1,
            &"I will not output any text. I am done now. ".repeat(30),
        )];
        assert_eq!(
            of(&run(&evs), DetectorKind::RepetitiveText),
            vec![(0, Level::Warning)]
        );
    }

    #[test]
    fn low_novelty_fires_below_a_third_distinct() {
        let evs: Vec<Value> = (0..8)
            .map(|i| {
                if i % 4 == 0 {
                    call("a", json!(1), json!(1))
                } else {
                    call("b", json!(2), json!(2))
                }
            })
            .collect();
        let cfg = "[detectors.repeat]\nmode = \"shadow\"\n";
        let f: Vec<_> = run_with(cfg, &evs)
            .into_iter()
            .filter(|x| x.1 == DetectorKind::LowNovelty)
            .collect();
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].0, f[0].2), (7, Level::Warning));
    }

    #[test]
    fn no_progress_warns_at_3_and_terminates_at_6_stale_reports() {
        let evs: Vec<Value> = (0..7)
            .map(|i| {
                llm(json!({"progress": if i == 0 { 0.5 } else { 0.4 }, "call_kind": "summary"}))
            })
            .collect();
        let f = run(&evs);
        assert_eq!(
            of(&f, DetectorKind::NoProgress),
            vec![(3, Level::Warning), (6, Level::Terminate)]
        );
    }

    #[test]
    fn no_new_information_counts_turns_of_old_results() {
        let mut evs = vec![
            turn(1, "t0"),
            call("read", json!(1), json!("A")),
            call("read", json!(2), json!("B")),
        ];
        for i in 0..4 {
            evs.push(turn(1, &format!("turn {i}")));
            evs.push(call(
                "read",
                json!(i % 2 + 1),
                json!(if i % 2 == 0 { "A" } else { "B" }),
            ));
        }
        evs.push(turn(1, "last"));
        let f = run(&evs);
        // Turn events at 3, 5, 7, 9, 11 judge the turns before them.
        assert_eq!(
            of(&f, DetectorKind::NoNewInformation),
            vec![(7, Level::Warning), (9, Level::Critical)]
        );
    }

    #[test]
    fn compaction_loop_needs_no_tool_call_between() {
        let evs: Vec<Value> = (0..10)
            .map(|_| llm(json!({"call_kind": "compaction", "tool_calls": 0})))
            .collect();
        let f = run(&evs);
        assert_eq!(
            of(&f, DetectorKind::CompactionLoop),
            vec![(2, Level::Warning), (9, Level::Terminate)]
        );
        let mut evs = Vec::new();
        for i in 0..10 {
            evs.push(llm(json!({"call_kind": "compaction"})));
            evs.push(call("read", json!(i), json!(i)));
        }
        assert!(of(&run(&evs), DetectorKind::CompactionLoop).is_empty());
    }

    #[test]
    fn write_no_effect_warns_at_the_third_unchanged_write() {
        let mut evs = Vec::new();
        for i in 0..4 {
            evs.push(call(
                "edit_file",
                json!({"path": "a", "patch": "x"}),
                json!("no change"),
            ));
            evs.push(call("read", json!(i), json!(i)));
        }
        let f = run(&evs);
        assert_eq!(
            of(&f, DetectorKind::WriteNoEffect),
            vec![(6, Level::Warning)]
        );
    }

    #[test]
    fn ceilings_warn_at_80_and_90_percent() {
        let cfg = "[detectors.turn_cap]\nterminate_at = 10\n";
        let evs: Vec<Value> = (0..10)
            .map(|i| llm(json!({"text": format!("distinct text number {i}"), "tool_calls": 1})))
            .collect();
        let f: Vec<_> = run_with(cfg, &evs)
            .into_iter()
            .filter(|x| x.1 == DetectorKind::TurnCap)
            .map(|x| (x.0, x.2))
            .collect();
        assert_eq!(
            f,
            vec![
                (7, Level::Warning),
                (8, Level::Critical),
                (9, Level::Terminate)
            ]
        );
    }

    #[test]
    fn cost_cap_needs_cost_and_token_cap_counts_tokens() {
        let evs: Vec<Value> = (0..3)
            .map(|_| llm(json!({"input_tokens": 900_000, "output_tokens": 0})))
            .collect();
        let f = run(&evs);
        assert!(of(&f, DetectorKind::CostCap).is_empty());
        assert_eq!(
            of(&f, DetectorKind::TokenCap),
            vec![(1, Level::Critical), (2, Level::Terminate)],
            "1.8M tokens is 90 %"
        );
    }

    #[test]
    fn wall_clock_cap_uses_event_time() {
        let evs = vec![
            json!({"type": "session.started", "timestamp": "2026-01-01T00:00:00Z"}),
            json!({"type": "session.started", "timestamp": "2026-01-01T03:13:00Z", "event_id": "x"}),
            json!({"type": "session.started", "timestamp": "2026-01-01T04:00:00Z"}),
        ];
        // session_gap must exceed the spacing or the session closes in between.
        let w = of_with(
            "[engine]\nsession_gap_secs = 20000\n",
            &evs,
            DetectorKind::WallClockCap,
        );
        assert_eq!(w, vec![(1, Level::Warning), (2, Level::Terminate)]);
    }

    #[test]
    fn token_ratio_waits_for_enough_tokens() {
        let evs = vec![
            llm(json!({"input_tokens": 10, "output_tokens": 5000})),
            llm(json!({"input_tokens": 10, "output_tokens": 6000})),
        ];
        let f = run(&evs);
        assert_eq!(of(&f, DetectorKind::TokenRatio), vec![(1, Level::Warning)]);
    }

    #[test]
    fn depth_cap_fires_at_the_depth() {
        let evs = vec![
            json!({"type": "session.started", "depth": 3}),
            json!({"type": "session.started", "depth": 4}),
            json!({"type": "session.started", "depth": 5}),
        ];
        assert_eq!(
            of(&run(&evs), DetectorKind::DepthCap),
            vec![(1, Level::Warning), (2, Level::Terminate)]
        );
    }

    #[test]
    fn warn_mode_downgrades_terminations_and_shadow_marks_them() {
        let evs: Vec<Value> = (0..5)
            .map(|_| call("read", json!({"p": 1}), json!("x")))
            .collect();
        let rep = of_with(
            "[detectors.repeat]\nmode = \"warn\"\n",
            &evs,
            DetectorKind::Repeat,
        );
        assert_eq!(rep, vec![(2, Level::Warning), (3, Level::Critical)]);
        let shadow = run_with("mode = \"shadow\"\n", &evs);
        assert!(shadow.iter().all(|x| x.3 == Mode::Shadow));
        assert!(shadow.iter().any(|x| x.2 == Level::Terminate));
    }

    #[test]
    fn run_change_resets_loop_detectors_but_not_ceilings() {
        let mut evs = Vec::new();
        for run_id in ["a", "b", "c"] {
            for _ in 0..2 {
                let mut e = call("read", json!({"p": 1}), json!("x"));
                e["run_id"] = json!(run_id);
                evs.push(e);
            }
        }
        assert!(run(&evs).is_empty());
        let f = run_with("[detectors.tool_call_cap]\nterminate_at = 6\n", &evs);
        assert_eq!(
            f.last().map(|x| (x.0, x.1, x.2)),
            Some((5, DetectorKind::ToolCallCap, Level::Terminate))
        );
    }

    #[test]
    fn findings_are_emitted_once_per_level_per_episode() {
        // A,A,A (warn) B A,A,A (warn again: a new episode).
        let a = || call("read", json!({"p": 1}), json!("x"));
        let evs = vec![a(), a(), a(), call("b", json!(1), json!(1)), a(), a(), a()];
        let f = run_with(
            "[detectors.repeat]\nterminate_at = \"off\"\nwindow_terminate_at = \"off\"\n",
            &evs,
        );
        let rep: Vec<_> = f
            .iter()
            .filter(|x| x.1 == DetectorKind::Repeat)
            .map(|x| x.0)
            .collect();
        assert_eq!(rep, vec![2, 6]);
    }

    #[test]
    fn tool_overrides_change_thresholds_for_that_tool_only() {
        let cfg = "[[overrides]]\ntool = \"slow_*\"\n[overrides.detectors.repeat]\nwarn_at = 5\nterminate_at = 6\n";
        let evs: Vec<Value> = (0..6)
            .map(|_| call("slow_read", json!(1), json!(1)))
            .collect();
        let rep = of_with(cfg, &evs, DetectorKind::Repeat);
        assert_eq!(rep, vec![(4, Level::Warning), (5, Level::Terminate)]);
    }

    #[test]
    fn duplicates_are_dropped_and_sessions_close_on_the_gap() {
        let config = Arc::new(
            Config::from_toml_str("[engine]\nsession_gap_secs = 60\n", "t", std::iter::empty())
                .unwrap(),
        );
        let mut engine = Engine::new(config);
        let mut out = Vec::new();
        let ev = |id: &str, sid: &str, ts: &str| {
            parse_event(json!({"type": "tool.called", "tool": "t", "session_id": sid, "event_id": id, "timestamp": ts}).to_string().as_bytes(), &ParseLimits::default()).unwrap()
        };
        for _ in 0..3 {
            engine.process(
                &ev("same", "s", "2026-01-01T00:00:00Z"),
                &EventMeta::default(),
                &mut out,
            );
        }
        assert_eq!(engine.session("s").unwrap().stats.tool_calls, 1);
        assert_eq!(engine.session("s").unwrap().stats.duplicates, 2);
        engine.process(
            &ev("x", "other", "2026-01-01T00:01:01Z"),
            &EventMeta::default(),
            &mut out,
        );
        let closed: Vec<_> = out
            .iter()
            .filter_map(|o| {
                if let Output::Summary(s) = o {
                    Some((s.session_id.clone(), s.stop_reason.clone()))
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(closed, vec![("s".to_string(), "idle_timeout".to_string())]);
        engine.close_all(ClosedBy::EndOfInput, &mut out);
        assert_eq!(engine.open_sessions(), 0);
    }

    #[test]
    fn every_finding_has_a_hint() {
        let evs: Vec<Value> = (0..4)
            .map(|_| call("read", json!({"p": 1}), json!("x")))
            .collect();
        let config = Arc::new(Config::default());
        let mut engine = Engine::new(config);
        let mut out = Vec::new();
        for (i, e) in evs.iter().enumerate() {
            let mut e = e.clone();
            e["session_id"] = json!("s");
            e["event_id"] = json!(format!("e{i}"));
            engine.process(
                &parse_event(e.to_string().as_bytes(), &ParseLimits::default()).unwrap(),
                &EventMeta::default(),
                &mut out,
            );
        }
        let hints: Vec<String> = out
            .iter()
            .filter_map(|o| {
                if let Output::Finding(f) = o {
                    Some(f.hint.clone())
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(hints.len(), 2);
        assert!(
            hints[0].contains("`read`") && hints[0].contains("3 times"),
            "{}",
            hints[0]
        );
    }
}

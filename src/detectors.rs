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

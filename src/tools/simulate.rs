//! The fleet simulator behind `loopwarden simulate`, the demo and the pipeline benchmark:
//! interleaved agent sessions, most of them healthy (reading, searching, editing, testing
//! and polling with results that change), some falling into one of the loops of DESIGN §3
//! after a healthy start.
//!
//! Guarantees: deterministic for a seed (the same sessions, events and ground truth,
//! whatever the clock values passed in); every session ends with `session.completed`; the
//! ground truth says which sessions loop, how, and from which of their events.

use serde::Serialize;
use serde_json::{json, Value};

use crate::contract::event::format_rfc3339_ms;

/// Deterministic xorshift64*.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

const WORDS: &[&str] = &[
    "the", "file", "module", "test", "function", "error", "parse", "config", "update", "check",
    "build", "result", "value", "return", "handler", "request", "session", "agent", "loop",
    "state", "read", "write", "search", "index", "cache", "query", "table", "schema", "field",
    "type",
];

/// Prose with a Zipf-like vocabulary: common words, and a long tail of identifiers, so two
/// texts share their function words but not their content.
pub fn prose(rng: &mut Rng, bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 16);
    while s.len() < bytes {
        if rng.below(3) == 0 {
            s.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
        } else {
            let spread = rng.below(50_000) + 1;
            let tail = rng.below(spread);
            s.push_str("ident");
            s.push_str(&tail.to_string());
        }
        s.push(if rng.below(12) == 0 { '\n' } else { ' ' });
    }
    s
}

/// How a looping session loops (each one a pattern of DESIGN §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopPattern {
    /// The same failing test run, the same output, again and again.
    RepeatCall,
    /// Polling a job that has long finished.
    PollFinished,
    /// Two edits undoing each other.
    PingPong,
    /// read → edit → test, the same three calls with the same results.
    Cycle,
    /// Turns that narrate instead of calling tools.
    Stall,
    /// Compacting the history again and again.
    CompactionLoop,
    /// Calling a tool that does not exist.
    UnknownTool,
    /// The same call failing each time.
    ErrorRepeat,
}

impl LoopPattern {
    pub const ALL: [LoopPattern; 8] = [
        LoopPattern::RepeatCall,
        LoopPattern::PollFinished,
        LoopPattern::PingPong,
        LoopPattern::Cycle,
        LoopPattern::Stall,
        LoopPattern::CompactionLoop,
        LoopPattern::UnknownTool,
        LoopPattern::ErrorRepeat,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LoopPattern::RepeatCall => "repeat_call",
            LoopPattern::PollFinished => "poll_finished",
            LoopPattern::PingPong => "ping_pong",
            LoopPattern::Cycle => "cycle",
            LoopPattern::Stall => "stall",
            LoopPattern::CompactionLoop => "compaction_loop",
            LoopPattern::UnknownTool => "unknown_tool",
            LoopPattern::ErrorRepeat => "error_repeat",
        }
    }
}

/// Ground truth for one session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Truth {
    pub session_id: String,
    pub agent_id: String,
    pub tenant: String,
    /// `None` for a healthy session.
    pub pattern: Option<LoopPattern>,
    /// Index (0-based, among the session's events) of the first looping event.
    pub loop_from_event: Option<u32>,
    /// Events the session emits in all, `session.completed` included.
    pub events: u32,
}

/// What fleet to generate.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    pub sessions: u64,
    /// Sessions in flight at once (their events interleave).
    pub concurrency: usize,
    /// Share of sessions that fall into a loop.
    pub loop_share: f64,
    pub seed: u64,
}

impl Default for FleetSpec {
    fn default() -> Self {
        FleetSpec {
            sessions: 200,
            concurrency: 50,
            loop_share: 0.3,
            seed: 1,
        }
    }
}

/// One generated event.
#[derive(Debug, Clone)]
pub struct SimEvent {
    pub session_id: String,
    /// `cost.attributed`, `tool.called`, `session.started` or `session.completed`.
    pub kind: &'static str,
    pub json: Vec<u8>,
}

struct Live {
    truth: Truth,
    step: u32,
    /// Healthy progress counters, so results change as a real agent's do.
    edits: u32,
    tested_at_edit: Option<u32>,
    poll: u32,
    jobs: u32,
    /// Loop events still to emit after the healthy start (when looping).
    healthy_steps: u32,
}

const AGENTS: &[&str] = &["coder", "researcher", "ops-bot", "support", "data-analyst"];
const TENANTS: &[&str] = &["acme", "globex", "initech"];

/// An endless-until-done interleaving of sessions; call [`Fleet::next_event`] with the
/// event time to stamp.
pub struct Fleet {
    spec: FleetSpec,
    rng: Rng,
    started: u64,
    live: Vec<Live>,
    truths: Vec<Truth>,
}

/// Loop events a looping session emits: enough for every detector's default
/// termination threshold, with LLM turns in between.
const LOOP_EVENTS: u32 = 48;

impl Fleet {
    pub fn new(spec: FleetSpec) -> Fleet {
        let rng = Rng::new(spec.seed);
        Fleet {
            spec,
            rng,
            started: 0,
            live: Vec::new(),
            truths: Vec::new(),
        }
    }

    /// Ground truth of every session started so far.
    pub fn truths(&self) -> &[Truth] {
        &self.truths
    }

    fn start_session(&mut self) -> Live {
        let n = self.started;
        self.started += 1;
        let rng = &mut self.rng;
        let looping = rng.chance(self.spec.loop_share);
        let healthy_steps = 8 + rng.below(30) as u32;
        let pattern =
            looping.then(|| LoopPattern::ALL[rng.below(LoopPattern::ALL.len() as u64) as usize]);
        // +1 for session.started, +1 for session.completed.
        let body = if looping {
            healthy_steps + LOOP_EVENTS
        } else {
            healthy_steps
        };
        let truth = Truth {
            session_id: format!("sim-{}-{n:06}", self.spec.seed),
            agent_id: AGENTS[rng.below(AGENTS.len() as u64) as usize].to_string(),
            tenant: TENANTS[rng.below(TENANTS.len() as u64) as usize].to_string(),
            pattern,
            loop_from_event: looping.then_some(healthy_steps + 1),
            events: body + 2,
        };
        self.truths.push(truth.clone());
        Live {
            truth,
            step: 0,
            edits: 0,
            tested_at_edit: None,
            poll: 0,
            jobs: 0,
            healthy_steps,
        }
    }

    /// The next event of a random session in flight, stamped `now_ms`; `None` once every
    /// session has completed.
    pub fn next_event(&mut self, now_ms: i64) -> Option<SimEvent> {
        while self.live.len() < self.spec.concurrency && self.started < self.spec.sessions {
            let s = self.start_session();
            self.live.push(s);
        }
        if self.live.is_empty() {
            return None;
        }
        let i = self.rng.below(self.live.len() as u64) as usize;
        let (kind, value) = step(&mut self.live[i], &mut self.rng, now_ms);
        let live = &mut self.live[i];
        live.step += 1;
        let session_id = live.truth.session_id.clone();
        if live.step >= live.truth.events {
            self.live.swap_remove(i);
        }
        Some(SimEvent {
            session_id,
            kind,
            json: serde_json::to_vec(&value).expect("a JSON value serialises"),
        })
    }
}

fn base(live: &Live, kind: &str, now_ms: i64) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("type".into(), kind.into());
    m.insert("session_id".into(), live.truth.session_id.clone().into());
    m.insert(
        "event_id".into(),
        format!("{}#{}", live.truth.session_id, live.step).into(),
    );
    m.insert("timestamp".into(), format_rfc3339_ms(now_ms).into());
    m.insert("agent_id".into(), live.truth.agent_id.clone().into());
    m.insert("tenant".into(), live.truth.tenant.clone().into());
    m
}

fn with(mut m: serde_json::Map<String, Value>, extra: Value) -> (&'static str, Value) {
    let kind = match m.get("type").and_then(Value::as_str) {
        Some("cost.attributed") => "cost.attributed",
        Some("tool.called") => "tool.called",
        Some("session.started") => "session.started",
        _ => "session.completed",
    };
    if let Value::Object(e) = extra {
        m.extend(e);
    }
    (kind, Value::Object(m))
}

fn llm_turn(
    live: &Live,
    rng: &mut Rng,
    now_ms: i64,
    tool_calls: u32,
    text: String,
) -> (&'static str, Value) {
    with(
        base(live, "cost.attributed", now_ms),
        json!({
            "input_tokens": 1500 + rng.below(3000) + 40 * live.step as u64,
            "output_tokens": 80 + rng.below(400),
            "cost_usd": 0.004,
            "model": "model-x",
            "tool_calls": tool_calls,
            "finish_reason": if tool_calls > 0 { "tool_use" } else { "end_turn" },
            "text": text,
        }),
    )
}

fn tool(live: &Live, now_ms: i64, name: &str, args: Value, result: Value) -> (&'static str, Value) {
    with(
        base(live, "tool.called", now_ms),
        json!({"tool": name, "args": args, "result": result, "duration_ms": 20 + (live.step as u64 * 7) % 400}),
    )
}

/// A healthy step: work whose results change.
fn healthy(live: &mut Live, rng: &mut Rng, now_ms: i64) -> (&'static str, Value) {
    let k = live.step % 4;
    if k == 1 {
        let len = 150 + rng.below(500) as usize;
        let text = prose(rng, len);
        return llm_turn(live, rng, now_ms, 1, text);
    }
    match rng.below(6) {
        0 => read_step(live, rng, now_ms),
        1 => grep_step(live, rng, now_ms),
        2 => edit_step(live, rng, now_ms),
        // Tests run after an edit (re-running unchanged code is what loops do).
        3 if live.tested_at_edit != Some(live.edits) => test_step(live, now_ms),
        4 => poll_step(live, now_ms),
        _ => search_step(live, rng, now_ms),
    }
}

/// A file read.
fn read_step(live: &Live, rng: &mut Rng, now_ms: i64) -> (&'static str, Value) {
    let path = format!("src/module_{}/file_{}.rs", rng.below(40), rng.below(500));
    let len = 200 + rng.below(1200) as usize;
    tool(
        live,
        now_ms,
        "read_file",
        json!({"path": path}),
        json!(prose(rng, len)),
    )
}

/// A search of the code.
fn grep_step(live: &Live, rng: &mut Rng, now_ms: i64) -> (&'static str, Value) {
    let pattern = format!("fn handle_{}", rng.below(10_000));
    let len = 100 + rng.below(600) as usize;
    tool(
        live,
        now_ms,
        "grep",
        json!({"pattern": pattern, "path": "src"}),
        json!(prose(rng, len)),
    )
}

/// An edit, each one new.
fn edit_step(live: &mut Live, rng: &mut Rng, now_ms: i64) -> (&'static str, Value) {
    live.edits += 1;
    let path = format!("src/module_{}/file_{}.rs", rng.below(40), rng.below(500));
    tool(
        live,
        now_ms,
        "edit_file",
        json!({"path": path, "old": format!("let x = {};", live.edits), "new": format!("let x = {};", live.edits + 1)}),
        json!({"ok": true, "lines_changed": 1 + rng.below(20), "revision": live.edits}),
    )
}

/// The tests, run after an edit: fewer fail with each.
fn test_step(live: &mut Live, now_ms: i64) -> (&'static str, Value) {
    live.tested_at_edit = Some(live.edits);
    let failing = 5u32.saturating_sub(live.edits);
    tool(
        live,
        now_ms,
        "run_tests",
        json!({"target": "unit"}),
        json!({"status": if failing == 0 { "passed" } else { "failed" }, "failed": failing, "passed": 40 + live.edits}),
    )
}

/// A job polled until it finishes; the next poll is of a new job.
fn poll_step(live: &mut Live, now_ms: i64) -> (&'static str, Value) {
    live.poll += 1;
    let pct = (live.poll * 17).min(100);
    let job = format!("build-{}", live.jobs);
    if pct >= 100 {
        live.jobs += 1;
        live.poll = 0;
    }
    tool(
        live,
        now_ms,
        "job_status",
        json!({"job": job}),
        json!({"status": if pct >= 100 { "succeeded" } else { "running" }, "progress": format!("{pct}% complete")}),
    )
}

/// A web search.
fn search_step(live: &Live, rng: &mut Rng, now_ms: i64) -> (&'static str, Value) {
    let q = format!(
        "how to {} {}",
        WORDS[rng.below(30) as usize],
        rng.below(100_000)
    );
    let len = 300 + rng.below(900) as usize;
    tool(
        live,
        now_ms,
        "web_search",
        json!({"query": q}),
        json!(prose(rng, len)),
    )
}

/// A looping step of `pattern`; `i` counts loop steps from 0.
fn looping(
    live: &mut Live,
    rng: &mut Rng,
    now_ms: i64,
    pattern: LoopPattern,
    i: u32,
) -> (&'static str, Value) {
    let turn_between = !matches!(pattern, LoopPattern::Stall | LoopPattern::CompactionLoop);
    if turn_between && i % 2 == 1 {
        // The model keeps deciding to do it again (its words vary).
        let len = 120 + rng.below(300) as usize;
        let text = prose(rng, len);
        return llm_turn(live, rng, now_ms, 1, text);
    }
    let j = i / 2;
    match pattern {
        LoopPattern::RepeatCall => tool(
            live,
            now_ms,
            "run_tests",
            json!({"target": "unit", "path": "src/parser/mod.rs"}),
            json!({"status": "failed", "output": "test_parse failed: expected 3, got 4"}),
        ),
        LoopPattern::PollFinished => tool(
            live,
            now_ms,
            "job_status",
            json!({"job": "deploy-42"}),
            json!({"status": "succeeded", "progress": "100% complete"}),
        ),
        LoopPattern::PingPong => ping_pong(live, now_ms, j),
        LoopPattern::Cycle => cycle(live, now_ms, j),
        LoopPattern::Stall => {
            let text = format!(
                "I will now look into the failing test and fix the parser. Let me think about what the right approach is here, step {}.",
                j % 3
            );
            llm_turn(live, rng, now_ms, 0, text)
        }
        LoopPattern::CompactionLoop => with(
            base(live, "cost.attributed", now_ms),
            json!({"input_tokens": 90_000 + rng.below(5000), "output_tokens": 2000, "cost_usd": 0.05, "call_kind": "compaction", "text": prose(rng, 200)}),
        ),
        LoopPattern::UnknownTool => tool_error(
            live,
            now_ms,
            &format!("run_{}", ["shell", "bash", "cmd"][(j % 3) as usize]),
            json!({"cmd": format!("ls -la {j}")}),
            "unknown_tool",
            "no such tool",
        ),
        LoopPattern::ErrorRepeat => tool_error(
            live,
            now_ms,
            "http_get",
            json!({"url": "https://api.internal/v1/items"}),
            "timeout",
            &format!("timed out after {} ms", 5000 + j),
        ),
    }
}

/// An edit and its undo, in turn.
fn ping_pong(live: &Live, now_ms: i64, j: u32) -> (&'static str, Value) {
    let (old, new) = if j % 2 == 0 {
        ("a + b", "b + a")
    } else {
        ("b + a", "a + b")
    };
    tool(
        live,
        now_ms,
        "edit_file",
        json!({"path": "src/math.rs", "old": old, "new": new}),
        json!({"ok": true, "lines_changed": 1}),
    )
}

/// Read, patch (refused), test (failing), and again.
fn cycle(live: &Live, now_ms: i64, j: u32) -> (&'static str, Value) {
    match j % 3 {
        0 => tool(
            live,
            now_ms,
            "read_file",
            json!({"path": "src/lib.rs"}),
            json!("pub fn answer() -> u32 { 41 }"),
        ),
        1 => tool(
            live,
            now_ms,
            "apply_patch",
            json!({"path": "src/lib.rs", "patch": "-41\n+42"}),
            json!({"ok": false, "error": "patch does not apply"}),
        ),
        _ => tool(
            live,
            now_ms,
            "run_tests",
            json!({"target": "all"}),
            json!({"status": "failed", "failed": 1}),
        ),
    }
}

fn tool_error(
    live: &Live,
    now_ms: i64,
    name: &str,
    args: Value,
    kind: &str,
    message: &str,
) -> (&'static str, Value) {
    with(
        base(live, "tool.called", now_ms),
        json!({"tool": name, "args": args, "result": {"error": message}, "is_error": true, "error_kind": kind}),
    )
}

fn step(live: &mut Live, rng: &mut Rng, now_ms: i64) -> (&'static str, Value) {
    let s = live.step;
    if s == 0 {
        return with(base(live, "session.started", now_ms), json!({}));
    }
    if s + 1 == live.truth.events {
        return with(
            base(live, "session.completed", now_ms),
            json!({"stop_reason": "done"}),
        );
    }
    match live.truth.pattern {
        Some(p) if s > live.healthy_steps => {
            looping(live, rng, now_ms, p, s - live.healthy_steps - 1)
        }
        _ => healthy(live, rng, now_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::contract::event::{parse_event, ParseLimits};
    use crate::contract::output::Output;
    use crate::engine::{Engine, EventMeta};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn generate(spec: FleetSpec) -> (Vec<SimEvent>, Vec<Truth>) {
        let mut fleet = Fleet::new(spec);
        let mut events = Vec::new();
        let mut t = 1_763_000_000_000;
        while let Some(e) = fleet.next_event(t) {
            events.push(e);
            t += 50;
        }
        (events, fleet.truths().to_vec())
    }

    #[test]
    fn same_seed_same_fleet_and_every_event_is_valid() {
        let spec = FleetSpec {
            sessions: 40,
            concurrency: 8,
            loop_share: 0.5,
            seed: 7,
        };
        let (a, ta) = generate(spec.clone());
        let (b, tb) = generate(spec);
        assert_eq!(ta, tb);
        assert_eq!(a.len(), b.len());
        assert!(a.iter().zip(&b).all(|(x, y)| x.json == y.json));
        let total: u32 = ta.iter().map(|t| t.events).sum();
        assert_eq!(a.len() as u32, total);
        for e in &a {
            parse_event(&e.json, &ParseLimits::default()).expect("valid event");
        }
    }

    /// The detectors judge the simulated fleet as its ground truth says: every looping
    /// session is terminated, no healthy one is, and none before its loop starts.
    #[test]
    fn the_engine_catches_every_simulated_loop_and_stops_no_healthy_session() {
        let spec = FleetSpec {
            sessions: 400,
            concurrency: 40,
            loop_share: 0.4,
            seed: 3,
        };
        let (events, truths) = generate(spec);
        let mut engine = Engine::new(Arc::new(Config::default()));
        let mut out = Vec::new();
        let mut index: BTreeMap<String, u32> = BTreeMap::new();
        let mut terminated_at: BTreeMap<String, u32> = BTreeMap::new();
        for e in &events {
            let ev = parse_event(&e.json, &ParseLimits::default()).unwrap();
            engine.process(&ev, &EventMeta::default(), &mut out);
            let i = index.entry(e.session_id.clone()).or_default();
            for o in out.drain(..) {
                if let Output::Finding(f) = o {
                    if f.stop_reason.is_some() {
                        terminated_at.insert(f.session_id.clone(), *i);
                    }
                }
            }
            *i += 1;
        }
        for t in &truths {
            match (t.pattern, terminated_at.get(&t.session_id)) {
                (None, Some(at)) => panic!("healthy {} stopped at event {at}", t.session_id),
                (Some(p), None) => panic!("{} ({}) not stopped", t.session_id, p.name()),
                (Some(_), Some(at)) => assert!(
                    *at >= t.loop_from_event.unwrap(),
                    "{} stopped at {at}, before its loop",
                    t.session_id
                ),
                (None, None) => {}
            }
        }
    }
}

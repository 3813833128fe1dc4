//! What a detector reads and what it returns: its session as it sees it
//! ([`SessionView`]: the trajectory and its own counters), the event as the detectors
//! see it ([`Context`], and the views a detector is judged on), its reading
//! ([`Signal`]), and the words of a finding ([`Message`], evidence helpers).
//!
//! Guarantees: plain data, no I/O; a view exists only for the events it names, so a
//! detector never sees an event it is not judged on.

use serde_json::{json, Map, Value};

use crate::engine::levels::{Level, Levels};
use crate::engine::text::{Chant, TextSketch};
use crate::engine::trajectory::{wall_seconds, Counters, RunState, ToolFacts, ToolObservation};

/// A detector's session: the trajectory every detector reads (counters, the run's
/// window of calls, its clock) and the detector's own counters (`own`, of its
/// [`super::Detector::State`]).
#[derive(Debug)]
pub struct SessionView<'a, S = ()> {
    pub stats: &'a Counters,
    pub run: &'a RunState,
    pub first_event_ms: i64,
    pub last_event_ms: i64,
    /// What the detector's open episode is about (0: none, or none it follows).
    pub subject: u64,
    pub own: &'a S,
}

impl<S> Clone for SessionView<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for SessionView<'_, S> {}

impl<'a, S> SessionView<'a, S> {
    /// The same session with only `part` of the counters (a detector's own, out of
    /// every detector's).
    pub fn narrow<T>(self, part: &'a T) -> SessionView<'a, T> {
        SessionView {
            stats: self.stats,
            run: self.run,
            first_event_ms: self.first_event_ms,
            last_event_ms: self.last_event_ms,
            subject: self.subject,
            own: part,
        }
    }

    /// The session's own clock, from its first event to its latest, in seconds.
    pub fn wall_seconds(&self) -> f64 {
        wall_seconds(self.first_event_ms, self.last_event_ms)
    }
}

/// What the event was, as far as the detectors care.
#[derive(Debug, Clone, Copy)]
pub enum Context<'a> {
    Llm(LlmContext<'a>),
    Tool(ToolContext<'a>),
    /// Lifecycle events and anything else: only ceilings are judged.
    Other,
}

/// An LLM call, after the trajectory has taken it in.
#[derive(Debug, Clone, Copy, Default)]
pub struct LlmContext<'a> {
    pub is_turn: bool,
    pub is_compaction: bool,
    /// The progress it reports, when it does.
    pub progress: Option<f64>,
    /// The tool calls since the last turn, before this call: the last turn's.
    pub calls_since_turn: u32,
    /// The tool calls it asks for, when it says.
    pub tool_calls: Option<u32>,
    pub has_text: bool,
    pub chant: Option<Chant>,
    /// A turn's text, as a sketch (see [`crate::engine::text::TextSketch`]), and how it
    /// opens (see [`crate::engine::text::opening`]).
    pub sketch: Option<&'a TextSketch>,
    pub opening: Option<u64>,
}

/// A tool call, after the trajectory has taken it in.
#[derive(Debug, Clone, Copy)]
pub struct ToolContext<'a> {
    pub tool: &'a str,
    pub obs: ToolObservation,
    pub facts: ToolFacts,
}

/// One event, for every detector.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub context: &'a Context<'a>,
    /// The event's sub-agent depth, when it says.
    pub depth: Option<u32>,
}

impl<'a> Input<'a> {
    /// The tool call it is, if it is one (for a detector's `observe`).
    pub fn tool(&self) -> Option<&'a ToolContext<'a>> {
        <&ToolContext>::view(self)
    }

    /// The LLM call it is, if it is one.
    pub fn llm(&self) -> Option<&'a LlmContext<'a>> {
        <&LlmContext>::view(self)
    }
}

/// The part of an event a detector is judged on; `None` when the event is not of that
/// kind, and the detector is then not judged (its episode is left alone).
pub trait View<'a>: Copy {
    /// The events the view exists for.
    const ON: On;
    fn view(input: &Input<'a>) -> Option<Self>;
}

/// The kinds of event a detector is judged on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    Any,
    LlmCalls,
    ToolCalls,
}

impl On {
    /// Whether a detector judged on these events is judged on an event of kind `event`.
    pub fn covers(self, event: On) -> bool {
        self == On::Any || self == event
    }
}

/// Any event (ceilings).
impl<'a> View<'a> for Input<'a> {
    const ON: On = On::Any;
    fn view(input: &Input<'a>) -> Option<Self> {
        Some(*input)
    }
}

/// LLM calls.
impl<'a> View<'a> for &'a LlmContext<'a> {
    const ON: On = On::LlmCalls;
    fn view(input: &Input<'a>) -> Option<Self> {
        match input.context {
            Context::Llm(l) => Some(l),
            _ => None,
        }
    }
}

/// Tool calls.
impl<'a> View<'a> for &'a ToolContext<'a> {
    const ON: On = On::ToolCalls;
    fn view(input: &Input<'a>) -> Option<Self> {
        match input.context {
            Context::Tool(t) => Some(t),
            _ => None,
        }
    }
}

/// A detector's reading for one event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Signal {
    pub value: f64,
    /// The highest level reached and the threshold it crossed.
    pub level: Option<(Level, f64)>,
    /// The signal reset: the current episode is over.
    pub reset: bool,
    /// What the episode is about, remembered when a finding is emitted (a digest).
    pub subject: Option<u64>,
}

impl Signal {
    /// The plain reading of `value` against `levels`: the level it reaches, and a reset
    /// when it is below every threshold.
    #[inline]
    pub fn of(value: f64, levels: &Levels) -> Signal {
        // Below every threshold (most readings): no level to look for.
        let reset = levels.lowest_threshold().is_none_or(|t| value < t - 1e-9);
        Signal {
            value,
            level: if reset { None } else { levels.level_for(value) },
            reset,
            subject: None,
        }
    }

    /// Adds a rule over the run's window to a streak's reading: `count` occurrences of
    /// `subject` in the window reaching `at` terminates (held back by the grace like any
    /// termination). Such an episode follows its subject: while it is open, events about
    /// other subjects (the calls interleaved with the loop) neither end nor advance it;
    /// its subject coming back below `at` (with something new) ends it, and so does
    /// another subject reaching a level of its own. A detector whose `terminate_at` is
    /// off never terminates, by its window either.
    pub fn or_window(
        mut self,
        levels: &Levels,
        count: u32,
        at: Option<f64>,
        subject: u64,
        open: u64,
    ) -> Signal {
        let Some(at) = at.filter(|_| levels.terminate_at.is_some()) else {
            return self;
        };
        if !self.raise(Level::Terminate, count, at, subject) {
            let another = open != 0 && open != subject;
            // Another subject reaching a level of its own (another action repeated in
            // a row while a window episode stays open: nudged, or in `warn` or `shadow`
            // mode) starts its own episode: its warning is said, its grace its own.
            // Without a level, the open episode goes on.
            self.reset = if self.level.is_some() {
                self.reset || another
            } else {
                self.reset && !another
            };
        }
        self
    }

    /// [`Signal::or_window`]'s count for a nudge only: `count` reaching `at` raises the
    /// reading to `critical` (never past it) where it was lower, in an episode that
    /// follows its subject as `or_window`'s does. For a count whose evidence is not
    /// enough to end a session (a repeat that may have paged).
    pub fn or_window_nudge(
        mut self,
        levels: &Levels,
        count: u32,
        at: Option<f64>,
        subject: u64,
    ) -> Signal {
        if let Some(at) = at.filter(|_| levels.terminate_at.is_some()) {
            self.raise(Level::Critical, count, at, subject);
        }
        self
    }

    /// Raises the reading to `level` about `subject` where `count` reaches `at` and the
    /// reading was lower; whether it did. (Two subjects both at their count join one
    /// episode: ending the other's at each raise would say the level again at each
    /// turn and restart the grace.)
    fn raise(&mut self, level: Level, count: u32, at: f64, subject: u64) -> bool {
        let raised = f64::from(count) >= at && self.level.is_none_or(|(l, _)| l < level);
        if raised {
            self.level = Some((level, at));
            self.value = f64::from(count);
            self.reset = false;
            self.subject = Some(subject);
        }
        raised
    }

    /// [`Signal::of`] for a condition that either holds (1) or not (0).
    pub fn flag(holds: bool, levels: &Levels) -> Signal {
        Signal::of(if holds { 1.0 } else { 0.0 }, levels)
    }
}

/// What a finding says: one line for people and one sentence for the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub reason: String,
    pub hint: String,
}

impl Message {
    pub fn new(reason: impl Into<String>, hint: impl Into<String>) -> Message {
        Message {
            reason: reason.into(),
            hint: hint.into(),
        }
    }
}

/// A finding's words and its evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Description {
    pub reason: String,
    pub hint: String,
    pub evidence: Map<String, Value>,
}

/// The reading a finding is described from: the signal's value and the threshold it
/// crossed (as whole numbers too, for counts).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub value: f64,
    pub threshold: f64,
}

impl Reading {
    pub fn count(&self) -> u64 {
        self.value as u64
    }

    pub fn limit(&self) -> u64 {
        self.threshold as u64
    }
}

/// Evidence a detector adds to a finding (`value` and `threshold` are already in).
pub type Evidence = Map<String, Value>;

/// A digest as evidence prints it (16 hex digits).
pub fn fp_hex(v: u64) -> String {
    format!("{v:016x}")
}

/// The last `n` calls of the run's window, oldest first, as evidence.
pub fn recent_calls(run: &RunState, n: usize) -> Value {
    let w = &run.window;
    let start = w.len().saturating_sub(n);
    Value::Array(
        w.range(start..)
            .map(|c| json!({"action": fp_hex(c.action), "result": fp_hex(c.result), "error": c.is_error()}))
            .collect(),
    )
}

/// A number as evidence prints it: whole numbers as integers, others to 6 decimals.
pub fn num(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9e15 {
        json!(v as i64)
    } else {
        json!((v * 1e6).round() / 1e6)
    }
}

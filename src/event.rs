//! The input event contract (DESIGN §1): turns the raw bytes of one message into a typed
//! [`Event`], or into a [`BadEvent`] that says exactly what is wrong and where.
//!
//! Guarantees: parsing never panics on any input; every rejection is a poison error
//! (dead-letter it, never retry it) with a stable machine-readable `reason` and a human
//! message naming the offending field; unknown fields are ignored (forward compatibility),
//! a wrong type for a known field is rejected.
//!
//! Two paths, one contract: a fast path reads the fields straight from the bytes and
//! keeps `args`, `result` and `text` as their JSON text (no `serde_json::Value` is built,
//! and strings without escapes are borrowed); on anything it is not sure of, it gives up
//! and serde_json reads the message — the same event, or the exact error.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::json::{Bail, Json};

/// Largest accepted message, in bytes, unless configured otherwise.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1024 * 1024;
/// Deepest accepted JSON nesting (objects and arrays), unless configured otherwise.
pub const DEFAULT_MAX_NESTING: usize = 64;
/// Longest accepted `session_id`, in bytes.
pub const MAX_SESSION_ID_BYTES: usize = 256;

/// Why an input message was rejected. Every variant is poison: the same bytes will fail
/// the same way again, so they go to the dead-letter topic, never back to a retry.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BadEvent {
    #[error("message is {size} bytes, larger than the {limit}-byte limit")]
    Oversized { size: usize, limit: usize },
    #[error("message is not valid UTF-8 (first bad byte at offset {offset})")]
    InvalidUtf8 { offset: usize },
    #[error("JSON nests deeper than {limit} levels (at byte {offset})")]
    TooDeep { limit: usize, offset: usize },
    #[error("invalid JSON: {detail}")]
    InvalidJson { detail: String },
    #[error("the message is JSON but not an object")]
    NotAnObject,
    #[error("field `{field}`: {detail}")]
    WrongType { field: String, detail: String },
    #[error("missing required field `{field}` for `{event_type}`")]
    MissingField {
        field: &'static str,
        event_type: String,
    },
    #[error("field `{field}`: {detail}")]
    InvalidValue { field: &'static str, detail: String },
    #[error("unknown event type `{0}` (expected cost.attributed, tool.called, session.started or session.completed)")]
    UnknownType(String),
}

impl BadEvent {
    /// The error for a log line or a dead-letter header: at most [`DETAIL_BYTES`] (a bad
    /// message's text is echoed in some errors, and may be as large as the message), with
    /// control characters escaped (so that a crafted value cannot forge a line of a log or
    /// drive a terminal).
    pub fn detail(&self) -> String {
        let full = self.to_string();
        let shown = printable(&full);
        if shown.len() <= DETAIL_BYTES {
            return shown.into_owned();
        }
        let mut end = DETAIL_BYTES;
        while !shown.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &shown[..end])
    }

    /// A short, bounded label for metrics and dead-letter headers.
    pub fn reason(&self) -> &'static str {
        match self {
            BadEvent::Oversized { .. } => "oversized",
            BadEvent::InvalidUtf8 { .. } => "invalid_utf8",
            BadEvent::TooDeep { .. } => "too_deep",
            BadEvent::InvalidJson { .. } => "invalid_json",
            BadEvent::NotAnObject => "not_an_object",
            BadEvent::WrongType { .. } => "wrong_type",
            BadEvent::MissingField { .. } => "missing_field",
            BadEvent::InvalidValue { .. } => "invalid_value",
            BadEvent::UnknownType(_) => "unknown_type",
        }
    }
}

/// Text from the input as a terminal or a log line may show it: control characters
/// (line breaks, escape sequences) and the bidirectional overrides that reorder a line
/// escaped, the rest as it is.
pub fn printable(text: &str) -> Cow<'_, str> {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden(c) {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    Cow::Owned(shown)
}

/// The most of an error's text [`BadEvent::detail`] keeps.
pub const DETAIL_BYTES: usize = 512;

/// Limits applied before any JSON parsing.
#[derive(Debug, Clone, Copy)]
pub struct ParseLimits {
    pub max_event_bytes: usize,
    pub max_nesting: usize,
}

impl Default for ParseLimits {
    fn default() -> Self {
        ParseLimits {
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            max_nesting: DEFAULT_MAX_NESTING,
        }
    }
}

/// What kind of LLM call a `cost.attributed` event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    Turn,
    Compaction,
    Summary,
    Subagent,
    /// A kind this version does not know; counted for ceilings, ignored by loop detectors.
    Other,
}

impl CallKind {
    fn parse(s: Option<&str>) -> CallKind {
        match s {
            None | Some("turn") => CallKind::Turn,
            Some("compaction") => CallKind::Compaction,
            Some("summary") => CallKind::Summary,
            Some("subagent") => CallKind::Subagent,
            Some(_) => CallKind::Other,
        }
    }
}

/// A string field of an event: borrowed from the input unless it had escapes.
pub type Str<'a> = Cow<'a, str>;

/// One LLM call (`cost.attributed`).
#[derive(Debug, Clone, PartialEq)]
pub struct LlmCall<'a> {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: Option<u64>,
    pub cache_write_tokens: Option<u64>,
    pub cost_usd: Option<f64>,
    pub model: Option<Str<'a>>,
    pub tool_calls: Option<u32>,
    /// Assistant text, as its JSON string literal; only hashed features of it are kept.
    pub text: Option<Json<'a>>,
    pub finish_reason: Option<Str<'a>>,
    pub call_kind: CallKind,
    pub progress: Option<f64>,
    pub turn: Option<u64>,
}

/// One completed tool call (`tool.called`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall<'a> {
    pub tool: Str<'a>,
    /// The arguments and the result as their JSON text.
    pub args: Option<Json<'a>>,
    pub result: Option<Json<'a>>,
    /// The emitter's own digest of the result (hex), used instead of `result`.
    pub result_digest: Option<Str<'a>>,
    pub is_error: bool,
    pub error_kind: Option<Str<'a>>,
    pub duration_ms: Option<f64>,
    pub call_id: Option<Str<'a>>,
    pub turn: Option<u64>,
}

/// The task's outcome as the runtime judges it, sent on `session.completed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Success,
    Failure,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        match s {
            "success" => Some(Outcome::Success),
            "failure" => Some(Outcome::Failure),
            _ => None,
        }
    }
}

/// How the runtime says a session ended (`session.completed`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completion {
    /// The runtime's own stop reason, e.g. `done`.
    pub stop_reason: Option<String>,
    pub outcome: Option<Outcome>,
}

/// The type-specific part of an event.
#[derive(Debug, Clone, PartialEq)]
pub enum EventBody<'a> {
    LlmCall(LlmCall<'a>),
    ToolCall(ToolCall<'a>),
    SessionStarted,
    SessionCompleted(Completion),
}

impl EventBody<'_> {
    pub fn type_name(&self) -> &'static str {
        match self {
            EventBody::LlmCall(_) => "cost.attributed",
            EventBody::ToolCall(_) => "tool.called",
            EventBody::SessionStarted => "session.started",
            EventBody::SessionCompleted(_) => "session.completed",
        }
    }
}

/// A validated input event, borrowing what it can from the message's bytes
/// ([`Event::into_owned`] keeps it past them).
#[derive(Debug, Clone, PartialEq)]
pub struct Event<'a> {
    pub session_id: Str<'a>,
    /// The producer's `event_id`, or one derived from the SHA-256 of the payload.
    pub event_id: Str<'a>,
    /// Event time in milliseconds since the Unix epoch, when the event carried one.
    pub timestamp_ms: Option<i64>,
    pub run_id: Option<Str<'a>>,
    pub agent_id: Option<Str<'a>>,
    pub tenant: Option<Str<'a>>,
    pub parent_session_id: Option<Str<'a>>,
    pub depth: Option<u32>,
    /// The OpenTelemetry trace the event came from (the OTLP ingest sets it), passed on
    /// to the findings it triggers so a kill switch can match either id.
    pub trace_id: Option<Str<'a>>,
    pub body: EventBody<'a>,
}

fn owned(s: Str<'_>) -> Str<'static> {
    Cow::Owned(s.into_owned())
}

fn owned_opt(s: Option<Str<'_>>) -> Option<Str<'static>> {
    s.map(owned)
}

impl Event<'_> {
    /// The same event, owning its strings.
    pub fn into_owned(self) -> Event<'static> {
        let body = match self.body {
            EventBody::LlmCall(c) => EventBody::LlmCall(LlmCall {
                input_tokens: c.input_tokens,
                output_tokens: c.output_tokens,
                cache_read_tokens: c.cache_read_tokens,
                cache_write_tokens: c.cache_write_tokens,
                cost_usd: c.cost_usd,
                model: owned_opt(c.model),
                tool_calls: c.tool_calls,
                text: c.text.map(Json::into_owned),
                finish_reason: owned_opt(c.finish_reason),
                call_kind: c.call_kind,
                progress: c.progress,
                turn: c.turn,
            }),
            EventBody::ToolCall(c) => EventBody::ToolCall(ToolCall {
                tool: owned(c.tool),
                args: c.args.map(Json::into_owned),
                result: c.result.map(Json::into_owned),
                result_digest: owned_opt(c.result_digest),
                is_error: c.is_error,
                error_kind: owned_opt(c.error_kind),
                duration_ms: c.duration_ms,
                call_id: owned_opt(c.call_id),
                turn: c.turn,
            }),
            EventBody::SessionStarted => EventBody::SessionStarted,
            EventBody::SessionCompleted(c) => EventBody::SessionCompleted(c),
        };
        Event {
            session_id: owned(self.session_id),
            event_id: owned(self.event_id),
            timestamp_ms: self.timestamp_ms,
            run_id: owned_opt(self.run_id),
            agent_id: owned_opt(self.agent_id),
            tenant: owned_opt(self.tenant),
            parent_session_id: owned_opt(self.parent_session_id),
            trace_id: owned_opt(self.trace_id),
            depth: self.depth,
            body,
        }
    }
}

/// Every known field of an event as read, before the per-type validation (a missing
/// field is reported by name rather than as a serde enum error).
#[derive(Default)]
struct Wire<'a> {
    kind: Option<Str<'a>>,
    session_id: Option<Str<'a>>,
    event_id: Option<Str<'a>>,
    timestamp: Option<Str<'a>>,
    run_id: Option<Str<'a>>,
    agent_id: Option<Str<'a>>,
    tenant: Option<Str<'a>>,
    parent_session_id: Option<Str<'a>>,
    depth: Option<u32>,
    trace_id: Option<Str<'a>>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_tokens: Option<u64>,
    cache_write_tokens: Option<u64>,
    cost_usd: Option<f64>,
    model: Option<Str<'a>>,
    tool_calls: Option<u32>,
    text: Option<Json<'a>>,
    finish_reason: Option<Str<'a>>,
    call_kind: Option<Str<'a>>,
    progress: Option<f64>,
    turn: Option<u64>,
    tool: Option<Str<'a>>,
    args: Option<Json<'a>>,
    result: Option<Json<'a>>,
    result_digest: Option<Str<'a>>,
    is_error: Option<bool>,
    error_kind: Option<Str<'a>>,
    duration_ms: Option<f64>,
    call_id: Option<Str<'a>>,
    stop_reason: Option<Str<'a>>,
    outcome: Option<Str<'a>>,
}

/// The wire shape serde_json reads on the slow path: the same fields, owned.
#[derive(Deserialize)]
struct SerdeWire {
    #[serde(rename = "type")]
    kind: Option<String>,
    session_id: Option<String>,
    event_id: Option<String>,
    timestamp: Option<String>,
    run_id: Option<String>,
    agent_id: Option<String>,
    tenant: Option<String>,
    parent_session_id: Option<String>,
    depth: Option<u32>,
    trace_id: Option<String>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_tokens: Option<u64>,
    cache_write_tokens: Option<u64>,
    cost_usd: Option<f64>,
    model: Option<String>,
    tool_calls: Option<u32>,
    text: Option<String>,
    finish_reason: Option<String>,
    call_kind: Option<String>,
    progress: Option<f64>,
    turn: Option<u64>,
    tool: Option<String>,
    args: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    result: Option<Value>,
    result_digest: Option<String>,
    is_error: Option<bool>,
    error_kind: Option<String>,
    duration_ms: Option<f64>,
    call_id: Option<String>,
    stop_reason: Option<String>,
    outcome: Option<String>,
}

/// A field that is there, `null` included (`Some(Value::Null)`); absent, it stays `None`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl From<SerdeWire> for Wire<'static> {
    fn from(w: SerdeWire) -> Wire<'static> {
        let s = |v: Option<String>| v.map(Cow::Owned);
        Wire {
            kind: s(w.kind),
            session_id: s(w.session_id),
            event_id: s(w.event_id),
            timestamp: s(w.timestamp),
            run_id: s(w.run_id),
            agent_id: s(w.agent_id),
            tenant: s(w.tenant),
            parent_session_id: s(w.parent_session_id),
            depth: w.depth,
            trace_id: s(w.trace_id),
            input_tokens: w.input_tokens,
            output_tokens: w.output_tokens,
            cache_read_tokens: w.cache_read_tokens,
            cache_write_tokens: w.cache_write_tokens,
            cost_usd: w.cost_usd,
            model: s(w.model),
            tool_calls: w.tool_calls,
            text: w.text.as_deref().map(Json::of_str),
            finish_reason: s(w.finish_reason),
            call_kind: s(w.call_kind),
            progress: w.progress,
            turn: w.turn,
            tool: s(w.tool),
            args: w.args.as_ref().map(Json::of_value),
            result: w.result.as_ref().map(Json::of_value),
            result_digest: s(w.result_digest),
            is_error: w.is_error,
            error_kind: s(w.error_kind),
            duration_ms: w.duration_ms,
            call_id: s(w.call_id),
            stop_reason: s(w.stop_reason),
            outcome: s(w.outcome),
        }
    }
}

/// Parses one message. `bytes` is the whole Kafka value or JSON Lines line; the event
/// borrows from it.
pub fn parse_event<'a>(bytes: &'a [u8], limits: &ParseLimits) -> Result<Event<'a>, BadEvent> {
    if bytes.len() > limits.max_event_bytes {
        return Err(BadEvent::Oversized {
            size: bytes.len(),
            limit: limits.max_event_bytes,
        });
    }
    // SIMD validation, with std's error (where the first bad byte is).
    let text = match simdutf8::compat::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            return Err(BadEvent::InvalidUtf8 {
                offset: e.valid_up_to(),
            })
        }
    };
    let wire = match fast::read(text, limits.max_nesting) {
        Ok(w) => w,
        Err(Bail) => slow_read(bytes, limits)?,
    };
    validate(wire, bytes)
}

/// For the fuzzers: whether both parse paths read `bytes` the same way. The fast path
/// may give up on anything (the slow path then reads it), but what it accepts, the slow
/// path must accept too and give the same event, or refuse for the same reason.
#[doc(hidden)]
pub fn parse_paths_disagree(bytes: &[u8], limits: &ParseLimits) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    let fast = fast::read(text, limits.max_nesting).ok()?;
    let slow = match slow_read(bytes, limits) {
        Ok(slow) => slow,
        Err(e) => return Some(format!("the fast path read it, the slow path refused: {e}")),
    };
    // The fast path keeps `args`, `result` and `text` as written, the slow path as
    // serde_json writes them again: the same values, compared as values.
    let as_values = |e: Result<Event<'_>, BadEvent>| {
        e.map(|mut e| {
            let mut values = Vec::new();
            match &mut e.body {
                EventBody::ToolCall(t) => {
                    for json in [&mut t.args, &mut t.result] {
                        values.push(json.take().map(|j| j.to_value()));
                    }
                }
                EventBody::LlmCall(l) => values.push(l.text.take().map(|j| j.to_value())),
                _ => {}
            }
            (e.into_owned(), values)
        })
    };
    let (fast, slow) = (
        as_values(validate(fast, bytes)),
        as_values(validate(slow, bytes)),
    );
    (fast != slow).then(|| format!("fast path: {fast:?}\nslow path: {slow:?}"))
}

/// The slow path: serde_json reads the event (and says exactly what is wrong with it).
fn slow_read(bytes: &[u8], limits: &ParseLimits) -> Result<Wire<'static>, BadEvent> {
    check_nesting(bytes, limits.max_nesting)?;
    match serde_json::from_slice::<SerdeWire>(bytes) {
        Ok(w) => Ok(w.into()),
        Err(e) => Err(explain_json_error(bytes, e)),
    }
}

/// The fast path: the event's fields read straight from its text, `args`, `result` and
/// `text` kept as their JSON text. It accepts only what serde_json would read the same
/// way (see [`crate::json::Scanner`]) and gives up on anything else, errors included.
mod fast {
    use std::borrow::Cow;

    use super::{Str, Wire};
    use crate::json::{unescape, Bail, Json, NumKind, Scanner};

    struct Reader<'a> {
        text: &'a str,
        sc: Scanner<'a>,
        /// Fields already read: a second one is serde's "duplicate field" error.
        seen: u64,
    }

    impl<'a> Reader<'a> {
        fn once(&mut self, bit: u32) -> Result<(), Bail> {
            if self.seen & (1 << bit) != 0 {
                return Err(Bail);
            }
            self.seen |= 1 << bit;
            Ok(())
        }

        fn string(&mut self) -> Result<Option<Str<'a>>, Bail> {
            if self.sc.null() {
                return Ok(None);
            }
            let span = self.sc.string()?;
            Ok(Some(unescape(
                &self.text[span.start..span.end],
                span.escaped,
            )))
        }

        fn number(&mut self) -> Result<Option<(&'a str, NumKind)>, Bail> {
            if self.sc.null() {
                return Ok(None);
            }
            let (start, end, kind) = self.sc.number()?;
            Ok(Some((&self.text[start..end], kind)))
        }

        fn unsigned(&mut self) -> Result<Option<u64>, Bail> {
            match self.number()? {
                None => Ok(None),
                Some((digits, NumKind::Integer)) if !digits.starts_with('-') => {
                    digits.parse::<u64>().map(Some).map_err(|_| Bail)
                }
                Some(_) => Err(Bail),
            }
        }

        fn small(&mut self) -> Result<Option<u32>, Bail> {
            match self.unsigned()? {
                None => Ok(None),
                Some(n) => u32::try_from(n).map(Some).map_err(|_| Bail),
            }
        }

        fn float(&mut self) -> Result<Option<f64>, Bail> {
            match self.number()? {
                None => Ok(None),
                // serde_json reads a non-negative integer as u64, then converts.
                Some((digits, NumKind::Integer)) if !digits.starts_with('-') => {
                    match digits.parse::<u64>() {
                        Ok(n) => Ok(Some(n as f64)),
                        Err(_) => serde_json::from_str(digits).map(Some).map_err(|_| Bail),
                    }
                }
                Some((text, _)) => serde_json::from_str(text).map(Some).map_err(|_| Bail),
            }
        }

        fn boolean(&mut self) -> Result<Option<bool>, Bail> {
            if self.sc.null() {
                return Ok(None);
            }
            self.sc.boolean().map(Some)
        }

        fn json(&mut self) -> Result<Option<Json<'a>>, Bail> {
            if self.sc.null() {
                return Ok(None);
            }
            let start = self.sc.value()?;
            Ok(Some(Json(Cow::Borrowed(&self.text[start..self.sc.pos]))))
        }

        fn json_keeping_null(&mut self) -> Result<Option<Json<'a>>, Bail> {
            if self.sc.null() {
                return Ok(Some(Json(Cow::Borrowed("null"))));
            }
            self.json()
        }

        fn string_literal(&mut self) -> Result<Option<Json<'a>>, Bail> {
            if self.sc.null() {
                return Ok(None);
            }
            let start = self.sc.pos;
            self.sc.string()?;
            Ok(Some(Json(Cow::Borrowed(&self.text[start..self.sc.pos]))))
        }
    }

    pub(super) fn read(text: &str, max_nesting: usize) -> Result<Wire<'_>, Bail> {
        let mut r = Reader {
            text,
            sc: Scanner::new(text.as_bytes(), max_nesting),
            seen: 0,
        };
        let mut w = Wire::default();
        r.sc.ws();
        r.sc.open(b'{')?;
        r.sc.ws();
        if r.sc.peek() == Some(b'}') {
            r.sc.pos += 1;
        } else {
            loop {
                r.sc.ws();
                let key = r.sc.string()?;
                if key.escaped {
                    return Err(Bail);
                }
                r.sc.ws();
                r.sc.eat(b':')?;
                r.sc.ws();
                field(&mut r, &mut w, &text.as_bytes()[key.start..key.end])?;
                r.sc.ws();
                match r.sc.peek() {
                    Some(b',') => r.sc.pos += 1,
                    Some(b'}') => {
                        r.sc.pos += 1;
                        break;
                    }
                    _ => return Err(Bail),
                }
            }
        }
        r.sc.close();
        r.sc.ws();
        if !r.sc.at_end() {
            return Err(Bail);
        }
        Ok(w)
    }

    fn field<'a>(r: &mut Reader<'a>, w: &mut Wire<'a>, key: &[u8]) -> Result<(), Bail> {
        macro_rules! read {
            ($bit:expr, $slot:ident, $how:ident) => {{
                r.once($bit)?;
                w.$slot = r.$how()?;
            }};
        }
        match key {
            b"type" => read!(0, kind, string),
            b"session_id" => read!(1, session_id, string),
            b"event_id" => read!(2, event_id, string),
            b"timestamp" => read!(3, timestamp, string),
            b"run_id" => read!(4, run_id, string),
            b"agent_id" => read!(5, agent_id, string),
            b"tenant" => read!(6, tenant, string),
            b"parent_session_id" => read!(7, parent_session_id, string),
            b"depth" => read!(8, depth, small),
            b"input_tokens" => read!(9, input_tokens, unsigned),
            b"output_tokens" => read!(10, output_tokens, unsigned),
            b"cache_read_tokens" => read!(11, cache_read_tokens, unsigned),
            b"cache_write_tokens" => read!(12, cache_write_tokens, unsigned),
            b"cost_usd" => read!(13, cost_usd, float),
            b"model" => read!(14, model, string),
            b"tool_calls" => read!(15, tool_calls, small),
            b"text" => read!(16, text, string_literal),
            b"finish_reason" => read!(17, finish_reason, string),
            b"call_kind" => read!(18, call_kind, string),
            b"progress" => read!(19, progress, float),
            b"turn" => read!(20, turn, unsigned),
            b"tool" => read!(21, tool, string),
            b"args" => read!(22, args, json),
            // A `null` result is a result (the tool said nothing), kept as written; an
            // absent one is unknown.
            b"result" => read!(23, result, json_keeping_null),
            b"result_digest" => read!(24, result_digest, string),
            b"is_error" => read!(25, is_error, boolean),
            b"error_kind" => read!(26, error_kind, string),
            b"duration_ms" => read!(27, duration_ms, float),
            b"call_id" => read!(28, call_id, string),
            b"stop_reason" => read!(29, stop_reason, string),
            b"outcome" => read!(30, outcome, string),
            b"trace_id" => read!(31, trace_id, string),
            _ => {
                r.sc.value()?;
            }
        }
        Ok(())
    }
}

/// Whether a JSON text nests at most `limit` deep (strings skipped).
pub(crate) fn nesting_within(bytes: &[u8], limit: usize) -> bool {
    check_nesting(bytes, limit).is_ok()
}

/// Rejects documents nested deeper than `limit` before serde sees them (serde_json's own
/// recursion limit is 128 and reports a less useful error).
fn check_nesting(bytes: &[u8], limit: usize) -> Result<(), BadEvent> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (offset, &b) in bytes.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > limit {
                    return Err(BadEvent::TooDeep { limit, offset });
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Cold path: re-parses to learn which field failed, so the error names it.
fn explain_json_error(bytes: &[u8], first: serde_json::Error) -> BadEvent {
    use serde_json::error::Category;
    match first.classify() {
        Category::Syntax | Category::Eof | Category::Io => {
            return BadEvent::InvalidJson {
                detail: first.to_string(),
            }
        }
        Category::Data => {}
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(_)) => {}
        Ok(_) => return BadEvent::NotAnObject,
        Err(e) => {
            return BadEvent::InvalidJson {
                detail: e.to_string(),
            }
        }
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, SerdeWire>(&mut de) {
        Err(e) => BadEvent::WrongType {
            field: e.path().to_string(),
            detail: e.inner().to_string(),
        },
        Ok(_) => BadEvent::InvalidJson {
            detail: first.to_string(),
        },
    }
}

fn require<T>(value: Option<T>, field: &'static str, event_type: &str) -> Result<T, BadEvent> {
    value.ok_or_else(|| BadEvent::MissingField {
        field,
        event_type: event_type.to_string(),
    })
}

/// The body of a `cost.attributed` event.
fn llm_call<'a>(w: &mut Wire<'a>, kind: &str) -> Result<EventBody<'a>, BadEvent> {
    let input_tokens = require(w.input_tokens, "input_tokens", kind)?;
    let output_tokens = require(w.output_tokens, "output_tokens", kind)?;
    if let Some(c) = w.cost_usd {
        if !(c.is_finite() && c >= 0.0) {
            return Err(BadEvent::InvalidValue {
                field: "cost_usd",
                detail: format!("must be a finite number >= 0, got {c}"),
            });
        }
    }
    if let Some(p) = w.progress {
        if !p.is_finite() {
            return Err(BadEvent::InvalidValue {
                field: "progress",
                detail: "must be a finite number".to_string(),
            });
        }
    }
    Ok(EventBody::LlmCall(LlmCall {
        input_tokens,
        output_tokens,
        cache_read_tokens: w.cache_read_tokens,
        cache_write_tokens: w.cache_write_tokens,
        cost_usd: w.cost_usd,
        model: w.model.take(),
        tool_calls: w.tool_calls,
        text: w.text.take(),
        finish_reason: w.finish_reason.take(),
        call_kind: CallKind::parse(w.call_kind.as_deref()),
        progress: w.progress,
        turn: w.turn,
    }))
}

/// The body of a `tool.called` event.
fn tool_call<'a>(w: &mut Wire<'a>, kind: &str) -> Result<EventBody<'a>, BadEvent> {
    let tool = require(w.tool.take(), "tool", kind)?;
    if tool.is_empty() {
        return Err(BadEvent::InvalidValue {
            field: "tool",
            detail: "must not be empty".to_string(),
        });
    }
    if let Some(d) = &w.result_digest {
        if d.is_empty() || !d.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(BadEvent::InvalidValue {
                field: "result_digest",
                detail: "must be a non-empty hex string".to_string(),
            });
        }
    }
    Ok(EventBody::ToolCall(ToolCall {
        tool,
        args: w.args.take(),
        result: w.result.take(),
        result_digest: w.result_digest.take(),
        is_error: w.is_error.unwrap_or(false),
        error_kind: w.error_kind.take(),
        duration_ms: w.duration_ms,
        call_id: w.call_id.take(),
        turn: w.turn,
    }))
}

/// The body of a `session.completed` event.
fn completion<'a>(w: &mut Wire<'a>) -> Result<EventBody<'a>, BadEvent> {
    let outcome = match w.outcome.as_deref() {
        None => None,
        Some(o) => Some(Outcome::parse(o).ok_or_else(|| BadEvent::InvalidValue {
            field: "outcome",
            detail: format!("must be \"success\" or \"failure\", got \"{o}\""),
        })?),
    };
    Ok(EventBody::SessionCompleted(Completion {
        stop_reason: w.stop_reason.take().map(Cow::into_owned),
        outcome,
    }))
}

fn validate<'a>(mut w: Wire<'a>, bytes: &[u8]) -> Result<Event<'a>, BadEvent> {
    let kind = w.kind.take().ok_or_else(|| BadEvent::MissingField {
        field: "type",
        event_type: "any event".to_string(),
    })?;
    let session_id = require(w.session_id.take(), "session_id", &kind)?;
    if session_id.is_empty() || session_id.len() > MAX_SESSION_ID_BYTES {
        return Err(BadEvent::InvalidValue {
            field: "session_id",
            detail: format!(
                "must be 1..={MAX_SESSION_ID_BYTES} bytes, got {}",
                session_id.len()
            ),
        });
    }
    let timestamp_ms = match &w.timestamp {
        None => None,
        Some(ts) => Some(parse_rfc3339_ms(ts).ok_or_else(|| BadEvent::InvalidValue {
            field: "timestamp",
            detail: format!("`{ts}` is not an RFC 3339 timestamp"),
        })?),
    };
    let body = match &*kind {
        "cost.attributed" => llm_call(&mut w, &kind)?,
        "tool.called" => tool_call(&mut w, &kind)?,
        "session.started" => EventBody::SessionStarted,
        "session.completed" => completion(&mut w)?,
        _ => return Err(BadEvent::UnknownType(kind.into_owned())),
    };
    let event_id = match w.event_id {
        Some(id) if !id.is_empty() => id,
        _ => Cow::Owned(derive_event_id(bytes)),
    };
    Ok(Event {
        session_id,
        event_id,
        timestamp_ms,
        run_id: w.run_id,
        agent_id: w.agent_id,
        tenant: w.tenant,
        parent_session_id: w.parent_session_id,
        depth: w.depth,
        trace_id: w.trace_id,
        body,
    })
}

/// The id of an event that carries none: the first 128 bits of the SHA-256 of its bytes,
/// so a resent copy of the same payload gets the same id and is dropped as a duplicate.
pub fn derive_event_id(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    format!("sha256:{}", hex(&digest[..16]))
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0xf) as usize] as char);
    }
    out
}

/// Parses an RFC 3339 timestamp into Unix milliseconds.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    if let Some(ms) = parse_common_rfc3339_ms(s) {
        return Some(ms);
    }
    let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// The usual shape, `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, read without the `time`
/// crate's general parser; anything else (and any value it would judge differently:
/// leap seconds, lowercase letters) is left to it.
fn parse_common_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let d = b.get(r)?;
        let mut acc = 0i64;
        let mut bad = false;
        for &c in d {
            let digit = c.wrapping_sub(b'0');
            bad |= digit > 9;
            acc = acc * 10 + i64::from(digit);
        }
        (!bad).then_some(acc)
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if day < 1 || day > days_in_month || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0i64;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || digits > 9 {
            return None;
        }
        nanos = num(start..i)? * 10i64.pow(9 - digits as u32);
    }
    let offset_secs = match (b.get(i), b.len() - i) {
        (Some(b'Z'), 1) => 0,
        (Some(sign @ (b'+' | b'-')), 6) if b[i + 3] == b':' => {
            let (h, m) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if h > 23 || m > 59 {
                return None;
            }
            let secs = h * 3600 + m * 60;
            if *sign == b'-' {
                -secs
            } else {
                secs
            }
        }
        _ => return None,
    };
    // Days since 1970-01-01 (Howard Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
    if secs >= 0 {
        // Rounding toward zero is rounding down here: no 128-bit division.
        return Some(secs * 1000 + nanos / 1_000_000);
    }
    let total_nanos = secs as i128 * 1_000_000_000 + nanos as i128;
    i64::try_from(total_nanos / 1_000_000).ok()
}

/// Unix milliseconds of 0000-01-01T00:00:00Z and of 10000-01-01T00:00:00Z: the times
/// with a four-digit year.
const FOUR_DIGIT_YEARS_MS: std::ops::Range<i64> = -62_167_219_200_000..253_402_300_800_000;

/// Formats Unix milliseconds as RFC 3339 (UTC, millisecond precision).
pub fn format_rfc3339_ms(ms: i64) -> String {
    if !FOUR_DIGIT_YEARS_MS.contains(&ms) {
        return format_rfc3339_ms_by_time(ms);
    }
    // Outputs carry two times each: written digit by digit, not through `format!`.
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut v: i64| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, ms_of_day / 3_600_000);
    put(14, 2, ms_of_day / 60_000 % 60);
    put(17, 2, ms_of_day / 1000 % 60);
    put(20, 3, ms_of_day % 1000);
    String::from_utf8(out.to_vec()).expect("ASCII digits and separators")
}

/// [`format_rfc3339_ms`] by the `time` crate, for the years that do not have four digits.
fn format_rfc3339_ms_by_time(ms: i64) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let (y, mo, d) = (t.year(), t.month() as u8, t.day());
    let (h, mi, s, milli) = (t.hour(), t.minute(), t.second(), t.millisecond());
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Event<'_>, BadEvent> {
        parse_event(s.as_bytes(), &ParseLimits::default())
    }

    #[test]
    fn a_bad_events_detail_is_one_bounded_printable_line() {
        let long = BadEvent::UnknownType(format!(
            "foo\nline 99: fake\u{1b}[31m{}",
            "x".repeat(100_000)
        ));
        let d = long.detail();
        assert!(!d.chars().any(char::is_control), "{d}");
        assert!(
            d.starts_with("unknown event type `foo\\nline 99: fake\\u{1b}[31m"),
            "{d}"
        );
        assert!(d.len() <= DETAIL_BYTES + '…'.len_utf8() && d.ends_with('…'));
        assert_eq!(printable("a\u{202e}b"), "a\\u{202e}b");
        let short = BadEvent::NotAnObject;
        assert_eq!(short.detail(), short.to_string());
        // Cut on a character boundary.
        let wide = BadEvent::UnknownType("é".repeat(1000));
        assert!(wide.detail().ends_with('…'));
    }

    #[test]
    fn parses_a_tool_call_and_ignores_unknown_fields() {
        let e = parse(r#"{"type":"tool.called","session_id":"s1","tool":"read","args":{"p":1},"future_field":[1,2]}"#).unwrap();
        assert_eq!(e.session_id, "s1");
        assert!(e.event_id.starts_with("sha256:"));
        match e.body {
            EventBody::ToolCall(t) => {
                assert_eq!(t.tool, "read");
                assert!(!t.is_error);
            }
            other => panic!("unexpected body {other:?}"),
        }
    }

    #[test]
    fn times_are_formatted_as_the_time_crate_formats_them() {
        let (first, end) = (FOUR_DIGIT_YEARS_MS.start, FOUR_DIGIT_YEARS_MS.end);
        let edges = [
            first - 1,
            first,
            first + 1,
            -1,
            0,
            1,
            951_782_400_000,
            end - 1,
            end,
        ];
        let mut rng = crate::simulate::Rng::new(7);
        let spread = (0..20_000).map(|_| first + rng.below((end - first) as u64) as i64);
        for ms in edges.into_iter().chain(spread) {
            assert_eq!(format_rfc3339_ms(ms), format_rfc3339_ms_by_time(ms), "{ms}");
        }
        assert_eq!(format_rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339_ms(end - 1), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn invalid_utf8_is_reported_where_it_starts() {
        let mut line = br#"{"type":"session.started","session_id":"s","x":"caf"#.to_vec();
        let at = line.len();
        line.extend_from_slice(b"\xc3(\"}"); // a lead byte without its continuation
        match parse_event(&line, &ParseLimits::default()) {
            Err(e @ BadEvent::InvalidUtf8 { .. }) => {
                assert_eq!(e, BadEvent::InvalidUtf8 { offset: at });
                assert_eq!(e.reason(), "invalid_utf8");
            }
            other => panic!("expected invalid UTF-8, got {other:?}"),
        }
        // The same text with a whole two-byte character parses.
        line[at + 1] = 0xa9;
        assert!(parse_event(&line, &ParseLimits::default()).is_ok());
    }

    #[test]
    fn derived_event_ids_are_stable_and_payload_specific() {
        let a = parse(r#"{"type":"session.started","session_id":"s"}"#).unwrap();
        let b = parse(r#"{"type":"session.started","session_id":"s"}"#).unwrap();
        let c = parse(r#"{"type":"session.started","session_id":"t"}"#).unwrap();
        assert_eq!(a.event_id, b.event_id);
        assert_ne!(a.event_id, c.event_id);
    }

    #[test]
    fn a_null_result_is_a_result_and_an_absent_one_is_not_on_both_paths() {
        let null = r#"{"type":"tool.called","session_id":"s","tool":"t","result":null}"#;
        let absent = r#"{"type":"tool.called","session_id":"s","tool":"t"}"#;
        let result = |wire: Wire<'_>| wire.result.map(|r| r.as_str().to_string());
        let limits = ParseLimits::default();
        let fast = |text| result(fast::read(text, limits.max_nesting).unwrap());
        let slow = |text: &str| result(slow_read(text.as_bytes(), &limits).unwrap());
        assert_eq!(fast(null), Some("null".into()));
        assert_eq!(slow(null), Some("null".into()));
        assert_eq!(fast(absent), None);
        assert_eq!(slow(absent), None);
    }

    #[test]
    fn names_the_missing_field() {
        let err =
            parse(r#"{"type":"cost.attributed","session_id":"s","input_tokens":1}"#).unwrap_err();
        assert_eq!(err.reason(), "missing_field");
        assert!(err.to_string().contains("output_tokens"), "{err}");
    }

    #[test]
    fn names_the_field_with_a_wrong_type() {
        let err = parse(r#"{"type":"cost.attributed","session_id":"s","input_tokens":"many","output_tokens":1}"#).unwrap_err();
        assert_eq!(err.reason(), "wrong_type");
        assert!(err.to_string().contains("input_tokens"), "{err}");
    }

    #[test]
    fn rejects_each_bad_input_class_with_its_reason() {
        let limits = ParseLimits {
            max_event_bytes: 64,
            max_nesting: 4,
        };
        let big = format!(
            r#"{{"type":"session.started","session_id":"{}"}}"#,
            "x".repeat(80)
        );
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (big.into_bytes(), "oversized"),
            (b"{\"type\":\"\xff\"}".to_vec(), "invalid_utf8"),
            (b"{\"a\":[[[[[1]]]]]}".to_vec(), "too_deep"),
            (b"{\"type\":".to_vec(), "invalid_json"),
            (b"[1,2]".to_vec(), "not_an_object"),
            (
                b"{\"type\":\"x.y\",\"session_id\":\"s\"}".to_vec(),
                "unknown_type",
            ),
            (b"{\"session_id\":\"s\"}".to_vec(), "missing_field"),
            (
                b"{\"type\":\"session.started\",\"session_id\":\"\"}".to_vec(),
                "invalid_value",
            ),
        ];
        for (bytes, reason) in cases {
            let err = parse_event(&bytes, &limits).unwrap_err();
            assert_eq!(
                err.reason(),
                reason,
                "{err} for {:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }

    #[test]
    fn a_number_beyond_f64_is_refused_on_both_paths() {
        // Found by the fuzzer: the fast path took `5e333…` inside `args`, serde_json
        // refuses it ("number out of range").
        let limits = ParseLimits::default();
        let near_max = format!("17976931348623158{}", "0".repeat(292));
        for number in [
            "5e3333333333333333333",
            "1e400",
            &"9".repeat(400),
            "1.7976931348623158e308",
            &near_max,
        ] {
            let line = format!(
                r#"{{"type":"tool.called","session_id":"s","tool":"t","args":{{"a":[1,{number}]}}}}"#
            );
            let err = parse_event(line.as_bytes(), &limits).unwrap_err();
            assert_eq!(err.reason(), "invalid_json", "{err}");
            assert_eq!(parse_paths_disagree(line.as_bytes(), &limits), None);
        }
        // In range (an underflow is 0, as serde_json reads it) still takes the fast path.
        for number in ["1e-400", "1.5e300", &"9".repeat(300)] {
            let line = format!(
                r#"{{"type":"tool.called","session_id":"s","tool":"t","args":{{"a":{number}}}}}"#
            );
            assert!(fast::read(&line, limits.max_nesting).is_ok(), "{number}");
            assert_eq!(parse_paths_disagree(line.as_bytes(), &limits), None);
        }
    }

    #[test]
    fn nesting_inside_strings_does_not_count() {
        let limits = ParseLimits {
            max_event_bytes: 1024,
            max_nesting: 2,
        };
        let ok = br#"{"type":"session.started","session_id":"[[[[{{{{\"]]]"}"#;
        assert!(parse_event(ok, &limits).is_ok());
    }

    proptest::proptest! {
        /// The usual shape read without the `time` crate gives what the crate gives, for
        /// any year, fraction and offset (and a day, hour or second out of range).
        #[test]
        fn timestamps_are_read_as_the_time_crate_reads_them(
            s in "[0-9]{4}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9](\\.[0-9]{1,10})?(Z|[+-][0-2][0-9]:[0-5][0-9])"
        ) {
            let by_time = OffsetDateTime::parse(&s, &Rfc3339)
                .ok()
                .and_then(|t| i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok());
            proptest::prop_assert_eq!(parse_rfc3339_ms(&s), by_time);
            if let Some(ms) = parse_common_rfc3339_ms(&s) {
                proptest::prop_assert_eq!(Some(ms), by_time);
            }
        }
    }

    #[test]
    fn timestamps_round_trip() {
        let ms = parse_rfc3339_ms("2026-11-18T11:06:40Z").unwrap();
        assert_eq!(format_rfc3339_ms(ms), "2026-11-18T11:06:40.000Z");
        assert!(parse_rfc3339_ms("yesterday").is_none());
    }
}

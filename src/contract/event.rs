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

use crate::contract::json::{Bail, Json};

mod timestamps;
#[cfg(test)]
use timestamps::*;
pub use timestamps::{format_rfc3339_ms, parse_rfc3339_ms, wall_ms};

/// Largest accepted message, in bytes, unless configured otherwise.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1024 * 1024;
/// The largest `engine.max_event_bytes` may allow (256 MiB): the producer's message limit
/// is twice it and 64 KiB more, within librdkafka's 1,000,000,000 bytes.
pub const MAX_EVENT_BYTES_LIMIT: usize = 256 * 1024 * 1024;
/// Deepest accepted JSON nesting (objects and arrays), unless configured otherwise.
pub const DEFAULT_MAX_NESTING: usize = 64;
/// The deepest `engine.max_nesting` may allow: serde_json, which reads an event the fast
/// reader leaves to it, stops at its 128th level.
pub const MAX_NESTING_LIMIT: usize = 127;
/// The byte order mark as UTF-8.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// `text` without a byte order mark ahead of it: RFC 8259 lets a parser ignore one
/// before a JSON text, and a file a Windows tool wrote as "UTF-8" starts with one (each
/// JSON Lines line is a text of its own, so any line may carry it).
pub fn without_byte_order_mark(text: &[u8]) -> &[u8] {
    text.strip_prefix(UTF8_BOM).unwrap_or(text)
}
/// Longest accepted `session_id`, in bytes.
pub const MAX_SESSION_ID_BYTES: usize = 256;
/// Longest accepted `event_id` and `trace_id`, in bytes. Every output names its trigger's
/// ids whole (an id cut names nothing), so an output is as long as they are: unbounded,
/// a finding could outgrow a broker's largest message, and an output the broker refuses
/// is sent again without end while its worker waits
/// ([`crate::contract::output::MAX_OUTPUT_BYTES`]).
pub const MAX_ID_BYTES: usize = 256;

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
    // A byte order mark ahead of the object (a file a Windows tool wrote as "UTF-8")
    // is no part of it: RFC 8259 lets a parser ignore one, and an event without it is the
    // same event (its derived id too). Offsets in errors still count from the message's
    // first byte (serde's columns, in an `invalid_json` detail, from the object's).
    let marked = bytes.len();
    let bytes = without_byte_order_mark(bytes);
    let mark = marked - bytes.len();
    // SIMD validation, with std's error (where the first bad byte is).
    let text = match simdutf8::compat::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            return Err(BadEvent::InvalidUtf8 {
                offset: mark + e.valid_up_to(),
            })
        }
    };
    let wire = match fast::read(text, limits.max_nesting) {
        Ok(w) => w,
        Err(Bail) => match slow_read(bytes, limits) {
            Ok(w) => w,
            Err(BadEvent::TooDeep { limit, offset }) => {
                let offset = mark + offset;
                return Err(BadEvent::TooDeep { limit, offset });
            }
            Err(e) => return Err(e),
        },
    };
    validate(wire, bytes)
}

/// For the fuzzers: whether both parse paths read `bytes` the same way. The fast path
/// may give up on anything (the slow path then reads it), but what it accepts, the slow
/// path must accept too and give the same event, or refuse for the same reason.
#[doc(hidden)]
pub fn parse_paths_disagree(bytes: &[u8], limits: &ParseLimits) -> Option<String> {
    // As `parse_event` reads it: after a byte order mark.
    let bytes = without_byte_order_mark(bytes);
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
    // serde reads a struct from an array too, its fields by position: an event is an
    // object, whatever an array's elements would make of it.
    let first = bytes
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if first != Some(&b'{') {
        return Err(match serde_json::from_slice::<Value>(bytes) {
            Ok(_) => BadEvent::NotAnObject,
            Err(e) => BadEvent::InvalidJson {
                detail: e.to_string(),
            },
        });
    }
    match serde_json::from_slice::<SerdeWire>(bytes) {
        Ok(w) => Ok(w.into()),
        Err(e) => Err(explain_json_error(bytes, e)),
    }
}

mod fast;

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
    for (field, id) in [("event_id", &w.event_id), ("trace_id", &w.trace_id)] {
        if let Some(id) = id.as_deref().filter(|id| id.len() > MAX_ID_BYTES) {
            return Err(BadEvent::InvalidValue {
                field,
                detail: format!("must be at most {MAX_ID_BYTES} bytes, got {}", id.len()),
            });
        }
    }
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

#[cfg(test)]
mod tests;

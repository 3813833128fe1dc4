//! The input event contract (DESIGN §1): turns the raw bytes of one message into a typed
//! [`Event`], or into a [`BadEvent`] that says exactly what is wrong and where.
//!
//! Guarantees: parsing never panics on any input; every rejection is a poison error
//! (dead-letter it, never retry it) with a stable machine-readable `reason` and a human
//! message naming the offending field; unknown fields are ignored (forward compatibility),
//! a wrong type for a known field is rejected.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

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

/// One LLM call (`cost.attributed`).
#[derive(Debug, Clone, PartialEq)]
pub struct LlmCall {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: Option<u64>,
    pub cache_write_tokens: Option<u64>,
    pub cost_usd: Option<f64>,
    pub model: Option<String>,
    pub tool_calls: Option<u32>,
    /// Assistant text; only hashed features of it are ever kept.
    pub text: Option<String>,
    pub finish_reason: Option<String>,
    pub call_kind: CallKind,
    pub progress: Option<f64>,
    pub turn: Option<u64>,
}

/// One completed tool call (`tool.called`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub tool: String,
    pub args: Option<Value>,
    pub result: Option<Value>,
    /// The emitter's own digest of the result (hex), used instead of `result`.
    pub result_digest: Option<String>,
    pub is_error: bool,
    pub error_kind: Option<String>,
    pub duration_ms: Option<f64>,
    pub call_id: Option<String>,
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
pub enum EventBody {
    LlmCall(LlmCall),
    ToolCall(ToolCall),
    SessionStarted,
    SessionCompleted(Completion),
}

impl EventBody {
    pub fn type_name(&self) -> &'static str {
        match self {
            EventBody::LlmCall(_) => "cost.attributed",
            EventBody::ToolCall(_) => "tool.called",
            EventBody::SessionStarted => "session.started",
            EventBody::SessionCompleted(_) => "session.completed",
        }
    }
}

/// A validated input event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub session_id: String,
    /// The producer's `event_id`, or one derived from the SHA-256 of the payload.
    pub event_id: String,
    /// Event time in milliseconds since the Unix epoch, when the event carried one.
    pub timestamp_ms: Option<i64>,
    pub run_id: Option<String>,
    pub agent_id: Option<String>,
    pub tenant: Option<String>,
    pub parent_session_id: Option<String>,
    pub depth: Option<u32>,
    pub body: EventBody,
}

/// The wire shape: every known field optional, validated per type afterwards so that a
/// missing field is reported by name rather than as a serde enum error.
#[derive(Deserialize)]
struct WireEvent {
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
    result: Option<Value>,
    result_digest: Option<String>,
    is_error: Option<bool>,
    error_kind: Option<String>,
    duration_ms: Option<f64>,
    call_id: Option<String>,
    stop_reason: Option<String>,
    outcome: Option<String>,
}

/// Parses one message. `bytes` is the whole Kafka value or JSON Lines line.
pub fn parse_event(bytes: &[u8], limits: &ParseLimits) -> Result<Event, BadEvent> {
    if bytes.len() > limits.max_event_bytes {
        return Err(BadEvent::Oversized {
            size: bytes.len(),
            limit: limits.max_event_bytes,
        });
    }
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(BadEvent::InvalidUtf8 {
            offset: e.valid_up_to(),
        });
    }
    check_nesting(bytes, limits.max_nesting)?;
    let wire: WireEvent = match serde_json::from_slice(bytes) {
        Ok(w) => w,
        Err(e) => return Err(explain_json_error(bytes, e)),
    };
    validate(wire, bytes)
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
    match serde_path_to_error::deserialize::<_, WireEvent>(&mut de) {
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

fn validate(w: WireEvent, bytes: &[u8]) -> Result<Event, BadEvent> {
    let kind = w.kind.ok_or(BadEvent::MissingField {
        field: "type",
        event_type: "any event".to_string(),
    })?;
    let session_id = require(w.session_id, "session_id", &kind)?;
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
    let body = match kind.as_str() {
        "cost.attributed" => {
            let input_tokens = require(w.input_tokens, "input_tokens", &kind)?;
            let output_tokens = require(w.output_tokens, "output_tokens", &kind)?;
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
            EventBody::LlmCall(LlmCall {
                input_tokens,
                output_tokens,
                cache_read_tokens: w.cache_read_tokens,
                cache_write_tokens: w.cache_write_tokens,
                cost_usd: w.cost_usd,
                model: w.model,
                tool_calls: w.tool_calls,
                text: w.text,
                finish_reason: w.finish_reason,
                call_kind: CallKind::parse(w.call_kind.as_deref()),
                progress: w.progress,
                turn: w.turn,
            })
        }
        "tool.called" => {
            let tool = require(w.tool, "tool", &kind)?;
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
            EventBody::ToolCall(ToolCall {
                tool,
                args: w.args,
                result: w.result,
                result_digest: w.result_digest,
                is_error: w.is_error.unwrap_or(false),
                error_kind: w.error_kind,
                duration_ms: w.duration_ms,
                call_id: w.call_id,
                turn: w.turn,
            })
        }
        "session.started" => EventBody::SessionStarted,
        "session.completed" => {
            let outcome = match w.outcome.as_deref() {
                None => None,
                Some(o) => Some(Outcome::parse(o).ok_or_else(|| BadEvent::InvalidValue {
                    field: "outcome",
                    detail: format!("must be \"success\" or \"failure\", got \"{o}\""),
                })?),
            };
            EventBody::SessionCompleted(Completion {
                stop_reason: w.stop_reason,
                outcome,
            })
        }
        _ => return Err(BadEvent::UnknownType(kind)),
    };
    let event_id = match w.event_id {
        Some(id) if !id.is_empty() => id,
        _ => derive_event_id(bytes),
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
    let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Formats Unix milliseconds as RFC 3339 (UTC, millisecond precision).
pub fn format_rfc3339_ms(ms: i64) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let (y, mo, d) = (t.year(), t.month() as u8, t.day());
    let (h, mi, s, milli) = (t.hour(), t.minute(), t.second(), t.millisecond());
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Event, BadEvent> {
        parse_event(s.as_bytes(), &ParseLimits::default())
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
    fn derived_event_ids_are_stable_and_payload_specific() {
        let a = parse(r#"{"type":"session.started","session_id":"s"}"#).unwrap();
        let b = parse(r#"{"type":"session.started","session_id":"s"}"#).unwrap();
        let c = parse(r#"{"type":"session.started","session_id":"t"}"#).unwrap();
        assert_eq!(a.event_id, b.event_id);
        assert_ne!(a.event_id, c.event_id);
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
    fn nesting_inside_strings_does_not_count() {
        let limits = ParseLimits {
            max_event_bytes: 1024,
            max_nesting: 2,
        };
        let ok = br#"{"type":"session.started","session_id":"[[[[{{{{\"]]]"}"#;
        assert!(parse_event(ok, &limits).is_ok());
    }

    #[test]
    fn timestamps_round_trip() {
        let ms = parse_rfc3339_ms("2026-11-18T11:06:40Z").unwrap();
        assert_eq!(format_rfc3339_ms(ms), "2026-11-18T11:06:40.000Z");
        assert!(parse_rfc3339_ms("yesterday").is_none());
    }
}

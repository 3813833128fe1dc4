//! Agents traced with OpenTelemetry, read as loopwarden events (DESIGN §1): each
//! `ExportTraceServiceRequest` (OTLP protobuf, or OTLP JSON as the Collector's Kafka and
//! file exporters write it) is exploded into `cost.attributed` and `tool.called` events.
//!
//! Which spans, and what they give (the names are the conventions' own: [`attr`] lists
//! each one with its convention, and a test holds the list to the published packages):
//! - GenAI semantic conventions: `gen_ai.operation.name` = `chat`, `text_completion` or
//!   `generate_content` is an LLM call, `execute_tool` a tool call, `invoke_agent` and
//!   `create_agent` an agent;
//! - OpenInference: `openinference.span.kind` = `LLM`, `TOOL`, `AGENT` likewise;
//! - any other span (HTTP, database, framework internals) is not an agent's step and is
//!   left out;
//! - content comes from attributes, else from span events (the older GenAI event
//!   conventions, which Strands writes by default); the end of a trace's root agent span
//!   completes its session.
//!
//! Guarantees: the mapping is a function of the requests read, in order (the same
//! exports in the same order give the same events, bytes included: the `event_id` is the
//! span id, the time the span's end; a request's events depend on earlier requests only
//! through the sessions their spans named, [`seen`]);
//! a signal a span does not carry is not guessed (no token usage: the LLM call is still a
//! step, with 0 tokens; no output messages: no `text` and no `tool_calls`; either is
//! counted per service and scope in the report); what it makes is an event [`crate::contract::event::parse_event`] reads, but for
//! what no mapping can mend (a session id over 256 bytes, an event over
//! `engine.max_event_bytes`), which the ingest dead-letters and `replay` reports. What
//! the spans do not say it does not invent: an agent's name, the sub-agent depth and
//! parent session come from ancestors found in the same request, and depth only when the
//! chain to the trace's root is there; the session of an LLM or tool call without one of
//! its own and without an ancestor naming one is the one its siblings named, in this
//! export or an earlier one ([`seen`]), else its trace.

use std::collections::HashMap;
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{status::StatusCode, Span};
use prost::Message as _;
use serde_json::json;

use crate::contract::event::{format_rfc3339_ms, hex, without_byte_order_mark};
use crate::engine::state::kept_label;

mod fields;
use fields::*;
mod seen;
use seen::{span_key, SessionsSeen};

/// The attribute names the mapping reads, by convention.
pub mod attr {
    // OpenTelemetry GenAI semantic conventions.
    pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
    pub const GEN_AI_CONVERSATION_ID: &str = "gen_ai.conversation.id";
    pub const GEN_AI_AGENT_ID: &str = "gen_ai.agent.id";
    pub const GEN_AI_AGENT_NAME: &str = "gen_ai.agent.name";
    pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    /// The conventions' names for the two before v1.27 (deprecated, "replaced by
    /// `gen_ai.usage.input_tokens`"), which instrumentations of that time still send.
    pub const GEN_AI_USAGE_PROMPT_TOKENS: &str = "gen_ai.usage.prompt_tokens";
    pub const GEN_AI_USAGE_COMPLETION_TOKENS: &str = "gen_ai.usage.completion_tokens";
    pub const GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
    pub const GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: &str =
        "gen_ai.usage.cache_creation.input_tokens";
    pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
    pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
    pub const GEN_AI_RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    pub const GEN_AI_OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
    pub const GEN_AI_TOOL_NAME: &str = "gen_ai.tool.name";
    pub const GEN_AI_TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
    pub const GEN_AI_TOOL_CALL_ARGUMENTS: &str = "gen_ai.tool.call.arguments";
    pub const GEN_AI_TOOL_CALL_RESULT: &str = "gen_ai.tool.call.result";
    // OpenTelemetry general conventions.
    pub const ERROR_TYPE: &str = "error.type";
    pub const SESSION_ID: &str = "session.id";
    pub const SERVICE_NAME: &str = "service.name";
    /// On the `exception` span event ([`super::event::EXCEPTION`]).
    pub const EXCEPTION_TYPE: &str = "exception.type";
    pub const EXCEPTION_MESSAGE: &str = "exception.message";
    // OpenInference.
    pub const OPENINFERENCE_SPAN_KIND: &str = "openinference.span.kind";
    pub const LLM_TOKEN_COUNT_PROMPT: &str = "llm.token_count.prompt";
    pub const LLM_TOKEN_COUNT_COMPLETION: &str = "llm.token_count.completion";
    pub const LLM_TOKEN_COUNT_PROMPT_DETAILS_CACHE_READ: &str =
        "llm.token_count.prompt_details.cache_read";
    pub const LLM_TOKEN_COUNT_PROMPT_DETAILS_CACHE_WRITE: &str =
        "llm.token_count.prompt_details.cache_write";
    pub const LLM_MODEL_NAME: &str = "llm.model_name";
    pub const LLM_COST_TOTAL: &str = "llm.cost.total";
    /// `llm.output_messages.<i>.message.content` and
    /// `llm.output_messages.<i>.message.tool_calls.<j>.tool_call.function.name`.
    pub const LLM_OUTPUT_MESSAGES: &str = "llm.output_messages";
    pub const MESSAGE_CONTENT: &str = "message.content";
    pub const MESSAGE_TOOL_CALLS: &str = "message.tool_calls";
    pub const TOOL_NAME: &str = "tool.name";
    pub const TOOL_CALL_ID: &str = "tool_call.id";
    pub const INPUT_VALUE: &str = "input.value";
    pub const OUTPUT_VALUE: &str = "output.value";
    pub const AGENT_NAME: &str = "agent.name";
    // Google ADK's own, on its tool spans in its telemetry schema 1 (ADK before 2.0, and
    // 2.x opted in with `ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN=1`); "{}" where content
    // capture is off. Held by no conventions package: `tests/frameworks.rs` holds them
    // to a real ADK run.
    pub const GCP_VERTEX_AGENT_TOOL_CALL_ARGS: &str = "gcp.vertex.agent.tool_call_args";
    pub const GCP_VERTEX_AGENT_TOOL_RESPONSE: &str = "gcp.vertex.agent.tool_response";

    /// The convention each name belongs to, for the check against the published
    /// packages: `gen_ai` (OpenTelemetry's GenAI attributes), `otel` (its general ones),
    /// `openinference`.
    pub const ALL: &[(&str, &str)] = &[
        (GEN_AI_OPERATION_NAME, "gen_ai"),
        (GEN_AI_CONVERSATION_ID, "gen_ai"),
        (GEN_AI_AGENT_ID, "gen_ai"),
        (GEN_AI_AGENT_NAME, "gen_ai"),
        (GEN_AI_USAGE_INPUT_TOKENS, "gen_ai"),
        (GEN_AI_USAGE_OUTPUT_TOKENS, "gen_ai"),
        (GEN_AI_USAGE_PROMPT_TOKENS, "gen_ai"),
        (GEN_AI_USAGE_COMPLETION_TOKENS, "gen_ai"),
        (GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, "gen_ai"),
        (GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS, "gen_ai"),
        (GEN_AI_REQUEST_MODEL, "gen_ai"),
        (GEN_AI_RESPONSE_MODEL, "gen_ai"),
        (GEN_AI_RESPONSE_FINISH_REASONS, "gen_ai"),
        (GEN_AI_OUTPUT_MESSAGES, "gen_ai"),
        (GEN_AI_TOOL_NAME, "gen_ai"),
        (GEN_AI_TOOL_CALL_ID, "gen_ai"),
        (GEN_AI_TOOL_CALL_ARGUMENTS, "gen_ai"),
        (GEN_AI_TOOL_CALL_RESULT, "gen_ai"),
        (ERROR_TYPE, "otel"),
        (SESSION_ID, "otel"),
        (SERVICE_NAME, "otel"),
        (EXCEPTION_TYPE, "otel"),
        (EXCEPTION_MESSAGE, "otel"),
        (OPENINFERENCE_SPAN_KIND, "openinference"),
        (LLM_TOKEN_COUNT_PROMPT, "openinference"),
        (LLM_TOKEN_COUNT_COMPLETION, "openinference"),
        (LLM_TOKEN_COUNT_PROMPT_DETAILS_CACHE_READ, "openinference"),
        (LLM_TOKEN_COUNT_PROMPT_DETAILS_CACHE_WRITE, "openinference"),
        (LLM_MODEL_NAME, "openinference"),
        (LLM_COST_TOTAL, "openinference"),
        (LLM_OUTPUT_MESSAGES, "openinference"),
        (MESSAGE_CONTENT, "openinference"),
        (MESSAGE_TOOL_CALLS, "openinference"),
        (TOOL_NAME, "openinference"),
        (TOOL_CALL_ID, "openinference"),
        (INPUT_VALUE, "openinference"),
        (OUTPUT_VALUE, "openinference"),
        (AGENT_NAME, "openinference"),
    ];

    /// The values of `gen_ai.operation.name` and `openinference.span.kind` the mapping
    /// knows, with what they are.
    pub const OPERATIONS: &[(&str, &str)] = &[
        ("chat", "gen_ai"),
        ("text_completion", "gen_ai"),
        ("generate_content", "gen_ai"),
        ("execute_tool", "gen_ai"),
        ("invoke_agent", "gen_ai"),
        ("create_agent", "gen_ai"),
        ("LLM", "openinference"),
        ("TOOL", "openinference"),
        ("AGENT", "openinference"),
    ];
}

/// The span events the mapping reads, and their attributes: the older GenAI event
/// conventions, as Strands writes them by default (content in events, not attributes).
pub mod event {
    pub const GEN_AI_CHOICE: &str = "gen_ai.choice";
    pub const GEN_AI_TOOL_MESSAGE: &str = "gen_ai.tool.message";
    pub const MESSAGE: &str = "message";
    pub const CONTENT: &str = "content";
    pub const FINISH_REASON: &str = "finish_reason";
    /// The event an exception is recorded as (OpenTelemetry's general conventions).
    pub const EXCEPTION: &str = "exception";
}

/// How OTLP traces are encoded on the bus (the Collector's Kafka exporter `encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    OtlpProto,
    OtlpJson,
}

impl Encoding {
    pub fn name(self) -> &'static str {
        match self {
            Encoding::OtlpProto => "otlp_proto",
            Encoding::OtlpJson => "otlp_json",
        }
    }
}

/// A message that is not an OTLP trace export (poison: dead-letter it).
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("an empty message (a tombstone?) is not an OTLP trace export")]
    Empty,
    #[error("not an OTLP protobuf ExportTraceServiceRequest: {0}")]
    Protobuf(#[from] prost::DecodeError),
    #[error("not an OTLP JSON ExportTraceServiceRequest: {0}")]
    Json(#[from] serde_json::Error),
}

impl OtlpError {
    /// A short, bounded label for metrics and dead-letter headers.
    pub fn reason(&self) -> &'static str {
        "invalid_otlp"
    }
}

/// Reads one message (or line) as a trace export. In JSON, an export
/// (`{"resourceSpans": [...]}`, as the OpenTelemetry Collector writes it) or its bare
/// array of resource spans (as rotel's Kafka exporter writes it); its times as strings
/// (as the Collector writes them) or as numbers, which the OTLP specification asks a
/// decoder to take too.
pub fn decode(bytes: &[u8], encoding: Encoding) -> Result<ExportTraceServiceRequest, OtlpError> {
    if bytes.is_empty() {
        // Protobuf would read it as an export without spans.
        return Err(OtlpError::Empty);
    }
    match encoding {
        Encoding::OtlpProto => Ok(ExportTraceServiceRequest::decode(bytes)?),
        Encoding::OtlpJson => {
            let bytes = without_byte_order_mark(bytes);
            match decode_json(bytes) {
                Ok(request) => Ok(request),
                Err(first) => {
                    // The generated decoder takes the three nanosecond times as strings
                    // only: read again with those given as numbers made strings.
                    let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(bytes) else {
                        return Err(first.into());
                    };
                    if !times_as_strings(&mut value) {
                        return Err(first.into());
                    }
                    decode_value(value).map_err(|_| first.into())
                }
            }
        }
    }
}

fn decode_json(bytes: &[u8]) -> Result<ExportTraceServiceRequest, serde_json::Error> {
    if bytes.trim_ascii_start().starts_with(b"[") {
        Ok(ExportTraceServiceRequest {
            resource_spans: serde_json::from_slice(bytes)?,
        })
    } else {
        serde_json::from_slice(bytes)
    }
}

/// [`decode_json`] of a document already read.
fn decode_value(value: serde_json::Value) -> Result<ExportTraceServiceRequest, serde_json::Error> {
    use serde::Deserialize as _;
    if value.is_array() {
        Ok(ExportTraceServiceRequest {
            resource_spans: Vec::deserialize(value)?,
        })
    } else {
        ExportTraceServiceRequest::deserialize(value)
    }
}

/// The span and span-event times in `value` that are whole numbers, made decimal strings;
/// whether there was one.
fn times_as_strings(value: &mut serde_json::Value) -> bool {
    use serde_json::Value as V;
    const TIMES: [&str; 3] = ["startTimeUnixNano", "endTimeUnixNano", "timeUnixNano"];
    let mut changed = false;
    match value {
        V::Object(members) => {
            for (key, v) in members.iter_mut() {
                let whole = match v {
                    V::Number(n) if TIMES.contains(&key.as_str()) => n.as_u64().or_else(|| {
                        // A JSON writer may print a large integer as a float (1.7e18).
                        n.as_f64()
                            .filter(|f| f.is_finite() && *f >= 0.0 && f.fract() == 0.0)
                            .map(|f| f as u64)
                    }),
                    _ => None,
                };
                match whole {
                    Some(n) => {
                        *v = V::String(n.to_string());
                        changed = true;
                    }
                    None => changed |= times_as_strings(v),
                }
            }
        }
        V::Array(items) => {
            for item in items {
                changed |= times_as_strings(item);
            }
        }
        _ => {}
    }
    changed
}

/// One event made of a span.
#[derive(Debug, Clone, PartialEq)]
pub struct MappedEvent {
    pub session_id: String,
    /// The event as one JSON object (the input contract).
    pub json: Vec<u8>,
    /// W3C `traceparent` of the span: loopwarden's own spans for this event join the
    /// agent's trace.
    pub traceparent: String,
    /// When the span happened ([`span_time_unix_nano`]), `u64::MAX` for a span with no
    /// time: a request's events are ordered by it.
    pub at_unix_nano: u64,
}

/// When a span happened: its end, else its start. A span without its end (which an
/// exporter should not send, and OTLP JSON without `endTimeUnixNano` reads as) is not
/// dated 1970: that would make its session 56 years long at its next event. A span with
/// neither gives an event without `timestamp`, which the Kafka message's time stands in
/// for (DESIGN §1).
pub fn span_time_unix_nano(span: &Span) -> Option<u64> {
    [span.end_time_unix_nano, span.start_time_unix_nano]
        .into_iter()
        .find(|&t| t > 0)
}

/// Why a span gave no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Skipped {
    /// A tool call without a tool name.
    NoToolName,
    /// Not an agent's LLM call, tool call or agent (HTTP, database, framework spans).
    NotAgentStep,
    /// An LLM or tool call without a valid trace id and span id (OTLP requires both).
    InvalidIds,
}

impl Skipped {
    pub const ALL: [Skipped; 3] = [
        Skipped::NoToolName,
        Skipped::NotAgentStep,
        Skipped::InvalidIds,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Skipped::NoToolName => "no_tool_name",
            Skipped::NotAgentStep => "not_agent_step",
            Skipped::InvalidIds => "invalid_ids",
        }
    }
}

/// What a step's event lacks that the instrumentation's settings would give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Missing {
    /// An LLM call without token counts: still a step, its tokens counted as 0.
    TokenUsage,
    /// An LLM call without its output, or a tool call without its arguments or result.
    Content,
}

impl Missing {
    pub const ALL: [Missing; 2] = [Missing::TokenUsage, Missing::Content];

    pub fn name(self) -> &'static str {
        match self {
            Missing::TokenUsage => "token_usage",
            Missing::Content => "content",
        }
    }
}

/// Steps of one service (`service.name`) and instrumentation scope mapped without
/// something the detectors read; both names kept as labels are
/// ([`crate::engine::state::kept_label`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uncaptured {
    pub service: String,
    pub scope: String,
    pub missing: Missing,
    pub spans: u64,
}

impl Uncaptured {
    /// What turns capture on for this scope's instrumentation (what the README says).
    pub fn setting(&self) -> &'static str {
        capture_setting(&self.scope, self.missing)
    }
}

/// What a request gave.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapReport {
    pub spans: u64,
    pub llm_calls: u64,
    pub tool_calls: u64,
    pub agents: u64,
    /// Agent runs that ended (root agent spans): their sessions completed.
    pub completions: u64,
    /// Spans that gave no event, by reason (agent spans are not counted here: they give
    /// names and depth to their descendants).
    pub skipped: Vec<(Skipped, u64)>,
    /// Steps mapped without part of what the detectors read, by service and scope.
    pub uncaptured: Vec<Uncaptured>,
}

impl MapReport {
    fn skip(&mut self, why: Skipped) {
        match self.skipped.iter_mut().find(|(s, _)| *s == why) {
            Some((_, n)) => *n += 1,
            None => self.skipped.push((why, 1)),
        }
    }

    fn lacks(&mut self, service: &str, scope: &str, missing: Missing, spans: u64) {
        // Kept as labels are: they become a metric label, a log line and the ingest's set
        // of what it has said, and a span may name itself at any length.
        let (service, scope) = (kept_label(service), kept_label(scope));
        let (service, scope) = (&*service, &*scope);
        match self
            .uncaptured
            .iter_mut()
            .find(|u| u.missing == missing && u.service == service && u.scope == scope)
        {
            Some(u) => u.spans += spans,
            None => self.uncaptured.push(Uncaptured {
                service: service.to_string(),
                scope: scope.to_string(),
                missing,
                spans,
            }),
        }
    }

    pub fn add(&mut self, other: &MapReport) {
        self.spans += other.spans;
        self.llm_calls += other.llm_calls;
        self.tool_calls += other.tool_calls;
        self.agents += other.agents;
        self.completions += other.completions;
        for &(why, n) in &other.skipped {
            match self.skipped.iter_mut().find(|(s, _)| *s == why) {
                Some((_, m)) => *m += n,
                None => self.skipped.push((why, n)),
            }
        }
        for u in &other.uncaptured {
            self.lacks(&u.service, &u.scope, u.missing, u.spans);
        }
    }

    /// Steps mapped without `missing`, over every service.
    pub fn uncaptured(&self, missing: Missing) -> u64 {
        self.uncaptured
            .iter()
            .filter(|u| u.missing == missing)
            .map(|u| u.spans)
            .sum()
    }

    pub fn skipped(&self, why: Skipped) -> u64 {
        self.skipped
            .iter()
            .find(|(s, _)| *s == why)
            .map_or(0, |(_, n)| *n)
    }
}

/// What kind of step a span is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Llm,
    Tool,
    Agent,
    Other,
}

/// A span with the resource and instrumentation scope it came from.
struct Located<'r> {
    span: &'r Span,
    resource: &'r [KeyValue],
    scope: &'r str,
    kind: Kind,
}

/// Maps trace exports to events, in the order they were read.
#[derive(Debug, Clone)]
pub struct Mapper {
    /// An attribute naming the session when neither `gen_ai.conversation.id` nor
    /// `session.id` does.
    pub session_attribute: Option<String>,
    /// The event parser's nesting limit (`engine.max_nesting`): a captured argument or
    /// result embedded as JSON must stay within it one level down, inside the event.
    pub max_nesting: usize,
    /// The sessions spans of earlier exports named, for spans that name none.
    seen: SessionsSeen,
}

impl Default for Mapper {
    fn default() -> Mapper {
        Mapper::new(None, crate::contract::event::DEFAULT_MAX_NESTING)
    }
}

impl Mapper {
    pub fn new(session_attribute: Option<String>, max_nesting: usize) -> Mapper {
        Mapper {
            session_attribute,
            max_nesting,
            seen: SessionsSeen::default(),
        }
    }

    /// Appends the events of `request` to `out`, in the order their spans ended; learns
    /// the sessions its spans name, for later exports of their traces.
    pub fn map(
        &mut self,
        request: &ExportTraceServiceRequest,
        out: &mut Vec<MappedEvent>,
    ) -> MapReport {
        let mut report = MapReport::default();
        let mut spans: Vec<Located<'_>> = Vec::new();
        for rs in &request.resource_spans {
            let resource = rs.resource.as_ref().map_or(&[][..], |r| &r.attributes[..]);
            for ss in &rs.scope_spans {
                let scope = ss.scope.as_ref().map_or("", |s| s.name.as_str());
                for span in &ss.spans {
                    spans.push(Located {
                        span,
                        resource,
                        scope,
                        kind: kind_of(&span.attributes),
                    });
                }
            }
        }
        report.spans = spans.len() as u64;
        // The session each span names on itself, read once.
        let own: Vec<Option<&str>> = (spans.iter())
            .map(|l| self.session_named(&l.span.attributes))
            .collect();
        let ancestry = Ancestry::of(&spans, |i| own[i].is_some());
        let sessions = self.sessions(&spans, &ancestry, &own);
        let request_events = out.len();
        for (i, l) in spans.iter().enumerate() {
            if matches!(l.kind, Kind::Llm | Kind::Tool) && !valid_ids(l.span) {
                report.skip(Skipped::InvalidIds);
                continue;
            }
            let service = string(l.resource, attr::SERVICE_NAME).unwrap_or("");
            let fields = match l.kind {
                Kind::Llm => {
                    let (f, lacking) = llm_fields(l.span);
                    report.llm_calls += 1;
                    for missing in lacking {
                        report.lacks(service, l.scope, missing, 1);
                    }
                    f
                }
                Kind::Tool => match tool_fields(l.span, self.max_nesting) {
                    Ok((f, captured)) => {
                        report.tool_calls += 1;
                        if !captured {
                            report.lacks(service, l.scope, Missing::Content, 1);
                        }
                        f
                    }
                    Err(why) => {
                        report.skip(why);
                        continue;
                    }
                },
                Kind::Agent => {
                    report.agents += 1;
                    // A root agent run's span ends when the run does: a session that is
                    // that trace completed (its summary now, not a session gap later). A
                    // nested agent's end is its parent's step; a session named by the
                    // agent (a conversation) may go on in another run, its ceilings
                    // counting across them; creating an agent is no run.
                    let run = string(&l.span.attributes, attr::GEN_AI_OPERATION_NAME)
                        != Some("create_agent");
                    let is_trace =
                        || (sessions[i].as_ref()).is_none_or(|s| s.name() == hex(&l.span.trace_id));
                    if !run
                        || !l.span.parent_span_id.is_empty()
                        || !valid_ids(l.span)
                        || !is_trace()
                    {
                        continue;
                    }
                    report.completions += 1;
                    completion_fields()
                }
                Kind::Other => {
                    report.skip(Skipped::NotAgentStep);
                    continue;
                }
            };
            out.push(event(&spans, i, &ancestry, &sessions, fields));
        }
        // In the order the spans ended (ties: as they came), the order they happened in.
        out[request_events..].sort_by_key(|e| e.at_unix_nano);
        report
    }

    /// The session an attribute list names: `gen_ai.conversation.id`, `session.id` or the
    /// configured attribute.
    fn session_named<'a>(&self, attrs: &'a [KeyValue]) -> Option<&'a str> {
        [attr::GEN_AI_CONVERSATION_ID, attr::SESSION_ID]
            .into_iter()
            .chain(self.session_attribute.as_deref())
            .find_map(|k| string(attrs, k).filter(|s| !s.is_empty()))
    }

    /// The session of each span (none: its trace's): the one it or its export names for
    /// it (`own`, each span's on itself: on the span, its nearest ancestor in the request
    /// that names one, or its resource). Learns the sessions the request's
    /// spans name, each under its parent span; then a framework's span wrapping a model
    /// call passes its children's session on to its siblings; then each LLM or tool call
    /// that names none takes its siblings', in this request or an earlier one ([`seen`]),
    /// whatever their order in the request.
    fn sessions<'a>(
        &mut self,
        spans: &[Located<'a>],
        ancestry: &Ancestry,
        own: &[Option<&'a str>],
    ) -> Vec<Option<Session<'a>>> {
        let mut sessions: Vec<Option<Session<'a>>> = (0..spans.len())
            .map(|i| {
                (ancestry.named[i].and_then(|n| own[n]))
                    .or_else(|| self.session_named(spans[i].resource))
                    .map(Session::Named)
            })
            .collect();
        for (l, session) in spans.iter().zip(&sessions) {
            if let (Some(Session::Named(session)), Some(parent)) =
                (session, span_key(&l.span.trace_id, &l.span.parent_span_id))
            {
                self.seen.learn(parent, session, l.kind == Kind::Llm);
            }
        }
        // A wrapper of a model call (of no kind the mapping reads, naming nothing, its
        // children naming one session, a model call among them: ADK's `call_llm` in its
        // schema 1) is in that session, and so are its siblings. One level only: what it
        // passes on makes no wrapper of its parent (a request handler's span above an
        // agent's run). Not a tool call: its children may be an agent's run in a session
        // of its own (ADK's `AgentTool`).
        for (i, l) in spans.iter().enumerate() {
            if sessions[i].is_some() || l.kind != Kind::Other {
                continue;
            }
            let children = span_key(&l.span.trace_id, &l.span.span_id);
            let named = children.and_then(|c| {
                let named = self.seen.under(&c)?;
                named.of_a_model_call().cloned()
            });
            let parent = span_key(&l.span.trace_id, &l.span.parent_span_id);
            if let (Some(session), Some(parent)) = (named, parent) {
                self.seen.learn(parent, &session, false);
            }
        }
        let wanted = |i: usize| matches!(spans[i].kind, Kind::Llm | Kind::Tool);
        let remembered =
            self.siblings_sessions(spans, ancestry, |i| sessions[i].is_none() && wanted(i));
        for (session, remembered) in sessions.iter_mut().zip(remembered) {
            if let (None, Some(Some(r))) = (&session, remembered) {
                *session = Some(Session::Remembered(r));
            }
        }
        sessions
    }

    /// For each span `wanted` (one naming no session, nor any of its ancestors in the
    /// request), the session its siblings named, else its parent's siblings, and so on
    /// up its ancestors in the request, where they named exactly one; none where they
    /// named several (ambiguous, not to be passed over). Resolved once per span, top
    /// down (O(spans), however deep the chains, a loop of parents cut where it closes);
    /// `None` for a span neither wanted nor above one.
    fn siblings_sessions(
        &self,
        spans: &[Located<'_>],
        ancestry: &Ancestry,
        wanted: impl Fn(usize) -> bool,
    ) -> Vec<Option<Option<Arc<str>>>> {
        let mut done: Vec<Option<Option<Arc<str>>>> = vec![None; spans.len()];
        let starts = (0..spans.len()).filter(|&i| wanted(i));
        top_down(&ancestry.parent, starts, |x, above| {
            let span = spans[x].span;
            let siblings =
                span_key(&span.trace_id, &span.parent_span_id).and_then(|p| self.seen.under(&p));
            done[x] = Some(match siblings {
                Some(named) => named.one().cloned(),
                None => above.and_then(|p| done[p].clone().flatten()),
            });
        });
        done
    }
}

/// The session a span is in: named on it, on its nearest ancestor in the request that
/// names one, or on its resource; else, for an LLM or tool call, the one its siblings
/// named, in this export or an earlier one ([`seen`]). None: its trace.
enum Session<'a> {
    Named(&'a str),
    Remembered(Arc<str>),
}

impl Session<'_> {
    fn name(&self) -> &str {
        match self {
            Session::Named(s) => s,
            Session::Remembered(s) => s,
        }
    }
}

/// The session id of span `i`: its session's, else its trace id.
fn session_of(spans: &[Located<'_>], sessions: &[Option<Session<'_>>], i: usize) -> String {
    sessions[i]
        .as_ref()
        .map_or_else(|| hex(&spans[i].span.trace_id), |s| s.name().to_string())
}

/// Span `i`'s event: `fields` with its session, ids, time, agent, depth and parent
/// session.
fn event(
    spans: &[Located<'_>],
    i: usize,
    ancestry: &Ancestry,
    sessions: &[Option<Session<'_>>],
    fields: Obj,
) -> MappedEvent {
    let span = spans[i].span;
    let session_id = session_of(spans, sessions, i);
    let mut event = fields;
    event
        .str("session_id", &session_id)
        .str("event_id", &hex(&span.span_id))
        .str("trace_id", &hex(&span.trace_id));
    let at = span_time_unix_nano(span);
    if let Some(at) = at {
        event.str("timestamp", &format_rfc3339_ms((at / 1_000_000) as i64));
    }
    let agent = ancestry.agent[i];
    if let Some(agent_id) = agent_at(spans, ancestry, i) {
        event.str("agent_id", agent_id);
    }
    if ancestry.rooted[i] {
        if let Some(depth) = ancestry.agents[i].checked_sub(1) {
            event.num("depth", depth);
        }
    }
    // The nearest agent above this event's own agent, if its session differs. Not its
    // trace where this event's session is only remembered: the parent agent's own
    // session is unknown then, not another.
    let remembered = matches!(sessions[i], Some(Session::Remembered(_)));
    let parent_agent = agent.and_then(|a| ancestry.parent_agent(a));
    if let Some(parent_agent) = parent_agent.filter(|&p| !remembered || sessions[p].is_some()) {
        let parent_session = session_of(spans, sessions, parent_agent);
        if parent_session != session_id {
            event.str("parent_session_id", &parent_session);
        }
    }
    MappedEvent {
        session_id,
        json: event.finish(),
        traceparent: format!("00-{}-{}-01", hex(&span.trace_id), hex(&span.span_id)),
        at_unix_nano: at.unwrap_or(u64::MAX),
    }
}

/// The agent of span `i`: its own agent attributes, else its nearest agent's (not one
/// further up: a sub-agent's steps are the sub-agent's).
fn agent_at<'a>(spans: &[Located<'a>], ancestry: &Ancestry, i: usize) -> Option<&'a str> {
    agent_of(&spans[i].span.attributes)
        .or_else(|| ancestry.agent[i].and_then(|a| agent_of(&spans[a].span.attributes)))
}

/// A span's ids as OTLP requires them: a 16-byte trace id and an 8-byte span id, neither
/// all zeros. Without them there is no `event_id` and no trace to join.
fn valid_ids(span: &Span) -> bool {
    span.trace_id.len() == 16
        && span.span_id.len() == 8
        && span.trace_id.iter().any(|&b| b != 0)
        && span.span_id.iter().any(|&b| b != 0)
}

/// What each span of a request inherits from its ancestors found in the same request
/// (itself included), resolved once per request: O(spans), however deep the traces.
struct Ancestry {
    parent: Vec<Option<usize>>,
    /// The nearest span naming a session.
    named: Vec<Option<usize>>,
    /// The nearest agent span.
    agent: Vec<Option<usize>>,
    /// How many agent spans the chain holds.
    agents: Vec<usize>,
    /// The chain reaches a span without a parent (the trace's root) inside the request.
    rooted: Vec<bool>,
}

impl Ancestry {
    fn of(spans: &[Located<'_>], names_session: impl Fn(usize) -> bool) -> Ancestry {
        let by_id: HashMap<(&[u8], &[u8]), usize> = spans
            .iter()
            .enumerate()
            .map(|(i, l)| ((&l.span.trace_id[..], &l.span.span_id[..]), i))
            .collect();
        let parent: Vec<Option<usize>> = spans
            .iter()
            .map(|l| {
                let s = l.span;
                let key = (&s.trace_id[..], &s.parent_span_id[..]);
                (!s.parent_span_id.is_empty())
                    .then(|| by_id.get(&key).copied())
                    .flatten()
            })
            .collect();
        let n = spans.len();
        let (mut named, mut agent) = (vec![None; n], vec![None; n]);
        let (mut agents, mut rooted) = (vec![0; n], vec![false; n]);
        top_down(&parent, 0..n, |x, above| {
            let is_agent = spans[x].kind == Kind::Agent;
            let (above_named, above_agent, above_agents) = match above {
                Some(p) => (named[p], agent[p], agents[p]),
                None => (None, None, 0),
            };
            named[x] = if names_session(x) {
                Some(x)
            } else {
                above_named
            };
            agent[x] = if is_agent { Some(x) } else { above_agent };
            agents[x] = above_agents + usize::from(is_agent);
            rooted[x] = above.map_or(spans[x].span.parent_span_id.is_empty(), |p| rooted[p]);
        });
        Ancestry {
            parent,
            named,
            agent,
            agents,
            rooted,
        }
    }

    /// The nearest agent above agent span `agent`.
    fn parent_agent(&self, agent: usize) -> Option<usize> {
        self.parent[agent].and_then(|p| self.agent[p])
    }
}

/// Visits the spans of `starts` and their ancestors in the request, each once and after
/// its parent: `visit(x, above)`, `above` the parent visited before it, or none at a top
/// (a root, a parent not in the request, or a loop of parents, cut where it closes: a
/// malformed request may have one). O(spans) however deep the chains.
fn top_down(
    parent: &[Option<usize>],
    starts: impl IntoIterator<Item = usize>,
    mut visit: impl FnMut(usize, Option<usize>),
) {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        New,
        OnChain,
        Done,
    }
    let mut state = vec![State::New; parent.len()];
    let mut chain = Vec::new();
    for start in starts {
        // Climb to a visited span, a top, or a span already on this chain.
        let mut at = start;
        let mut above = loop {
            match state[at] {
                State::Done => break Some(at),
                State::OnChain => break None,
                State::New => {}
            }
            state[at] = State::OnChain;
            chain.push(at);
            match parent[at] {
                Some(p) => at = p,
                None => break None,
            }
        };
        // Visit from the top down.
        while let Some(x) = chain.pop() {
            visit(x, above);
            state[x] = State::Done;
            above = Some(x);
        }
    }
}

fn kind_of(attrs: &[KeyValue]) -> Kind {
    if let Some(k) = string(attrs, attr::OPENINFERENCE_SPAN_KIND) {
        return match k {
            "LLM" => Kind::Llm,
            "TOOL" => Kind::Tool,
            "AGENT" => Kind::Agent,
            _ => Kind::Other,
        };
    }
    match string(attrs, attr::GEN_AI_OPERATION_NAME) {
        Some("chat" | "text_completion" | "generate_content") => Kind::Llm,
        Some("execute_tool") => Kind::Tool,
        Some("invoke_agent" | "create_agent") => Kind::Agent,
        _ => Kind::Other,
    }
}

fn agent_of(attrs: &[KeyValue]) -> Option<&str> {
    [
        attr::GEN_AI_AGENT_ID,
        attr::GEN_AI_AGENT_NAME,
        attr::AGENT_NAME,
    ]
    .into_iter()
    .find_map(|k| string(attrs, k).filter(|s| !s.is_empty()))
}

#[cfg(test)]
mod tests;

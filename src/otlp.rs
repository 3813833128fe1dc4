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
//! Guarantees: the mapping is a pure function of the request (the same request gives the
//! same events, bytes included: the `event_id` is the span id, the time the span's end);
//! a signal a span does not carry is not guessed (no token usage: the LLM call is still a
//! step, with 0 tokens; no output messages: no `text` and no `tool_calls`; either is
//! counted per service and scope in the report); what it makes is an event [`crate::event::parse_event`] reads, but for
//! what no mapping can mend (a session id over 256 bytes, an event over
//! `engine.max_event_bytes`), which the ingest dead-letters and `replay` reports. What it
//! cannot know from one request it does not invent: an agent's name, the session of a
//! span without one of its own, the sub-agent depth and parent session come from
//! ancestors found in the same request, and depth only when the chain to the trace's root
//! is there.

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{status::StatusCode, Span};
use prost::Message as _;
use serde_json::json;

use crate::event::{format_rfc3339_ms, hex};

/// The attribute names the mapping reads, by convention.
pub mod attr {
    // OpenTelemetry GenAI semantic conventions.
    pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
    pub const GEN_AI_CONVERSATION_ID: &str = "gen_ai.conversation.id";
    pub const GEN_AI_AGENT_ID: &str = "gen_ai.agent.id";
    pub const GEN_AI_AGENT_NAME: &str = "gen_ai.agent.name";
    pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
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
/// array of resource spans (as rotel's Kafka exporter writes it).
pub fn decode(bytes: &[u8], encoding: Encoding) -> Result<ExportTraceServiceRequest, OtlpError> {
    if bytes.is_empty() {
        // Protobuf would read it as an export without spans.
        return Err(OtlpError::Empty);
    }
    match encoding {
        Encoding::OtlpProto => Ok(ExportTraceServiceRequest::decode(bytes)?),
        Encoding::OtlpJson if bytes.trim_ascii_start().starts_with(b"[") => {
            Ok(ExportTraceServiceRequest {
                resource_spans: serde_json::from_slice(bytes)?,
            })
        }
        Encoding::OtlpJson => Ok(serde_json::from_slice(bytes)?),
    }
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
    pub end_unix_nano: u64,
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
/// something the detectors read.
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

/// Maps trace exports to events.
#[derive(Debug, Clone)]
pub struct Mapper {
    /// An attribute naming the session when neither `gen_ai.conversation.id` nor
    /// `session.id` does.
    pub session_attribute: Option<String>,
    /// The event parser's nesting limit (`engine.max_nesting`): a captured argument or
    /// result embedded as JSON must stay within it one level down, inside the event.
    pub max_nesting: usize,
}

impl Default for Mapper {
    fn default() -> Mapper {
        Mapper {
            session_attribute: None,
            max_nesting: crate::event::DEFAULT_MAX_NESTING,
        }
    }
}

impl Mapper {
    /// Appends the events of `request` to `out`, in the order their spans ended.
    pub fn map(
        &self,
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
        let ancestry = Ancestry::of(&spans, |attrs| self.session_named(attrs).is_some());
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
                    Some((f, captured)) => {
                        report.tool_calls += 1;
                        if !captured {
                            report.lacks(service, l.scope, Missing::Content, 1);
                        }
                        f
                    }
                    None => {
                        report.skip(Skipped::NoToolName);
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
                        || self.session_of(&spans, &ancestry, i) == hex(&l.span.trace_id);
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
            out.push(self.event(&spans, i, &ancestry, fields));
        }
        // In the order the spans ended (ties: as they came), the order they happened in.
        out[request_events..].sort_by_key(|e| e.end_unix_nano);
        report
    }

    fn event(
        &self,
        spans: &[Located<'_>],
        i: usize,
        ancestry: &Ancestry,
        fields: Obj,
    ) -> MappedEvent {
        let span = spans[i].span;
        let session_id = self.session_of(spans, ancestry, i);
        let mut event = fields;
        event
            .str("session_id", &session_id)
            .str("event_id", &hex(&span.span_id))
            .str("trace_id", &hex(&span.trace_id));
        let end_ms = (span.end_time_unix_nano / 1_000_000) as i64;
        event.str("timestamp", &format_rfc3339_ms(end_ms));
        // The span's own agent attributes, else its nearest agent's (not one further up:
        // a sub-agent's steps are the sub-agent's).
        let agent = ancestry.agent[i];
        let agent_id = agent_of(&span.attributes)
            .or_else(|| agent.and_then(|a| agent_of(&spans[a].span.attributes)));
        if let Some(agent_id) = agent_id {
            event.str("agent_id", agent_id);
        }
        if ancestry.rooted[i] {
            if let Some(depth) = ancestry.agents[i].checked_sub(1) {
                event.num("depth", depth);
            }
        }
        // The nearest agent above this event's own agent, if its session differs.
        if let Some(parent_agent) = agent.and_then(|a| ancestry.parent_agent(a)) {
            let parent_session = self.session_of(spans, ancestry, parent_agent);
            if parent_session != session_id {
                event.str("parent_session_id", &parent_session);
            }
        }
        MappedEvent {
            session_id,
            json: event.finish(),
            traceparent: format!("00-{}-{}-01", hex(&span.trace_id), hex(&span.span_id)),
            end_unix_nano: span.end_time_unix_nano,
        }
    }

    /// The session an attribute list names: `gen_ai.conversation.id`, `session.id` or the
    /// configured attribute.
    fn session_named<'a>(&self, attrs: &'a [KeyValue]) -> Option<&'a str> {
        [attr::GEN_AI_CONVERSATION_ID, attr::SESSION_ID]
            .into_iter()
            .chain(self.session_attribute.as_deref())
            .find_map(|k| string(attrs, k).filter(|s| !s.is_empty()))
    }

    /// The session of span `i`: named on the span, else on its nearest ancestor in the
    /// request that names one, else on its resource; else its trace.
    fn session_of(&self, spans: &[Located<'_>], ancestry: &Ancestry, i: usize) -> String {
        ancestry.named[i]
            .and_then(|n| self.session_named(&spans[n].span.attributes))
            .or_else(|| self.session_named(spans[i].resource))
            .map_or_else(|| hex(&spans[i].span.trace_id), str::to_string)
    }
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
    fn of(spans: &[Located<'_>], names_session: impl Fn(&[KeyValue]) -> bool) -> Ancestry {
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
        let mut a = Ancestry {
            parent,
            named: vec![None; n],
            agent: vec![None; n],
            agents: vec![0; n],
            rooted: vec![false; n],
        };
        #[derive(Clone, Copy, PartialEq)]
        enum State {
            New,
            OnChain,
            Done,
        }
        let mut state = vec![State::New; n];
        let mut chain = Vec::new();
        for start in 0..n {
            // Climb to a resolved span, the root, a parent not in the request, or a span
            // already on this chain (a malformed request may loop its parents).
            let mut at = start;
            let mut above = loop {
                match state[at] {
                    State::Done => break Some(at),
                    State::OnChain => break None,
                    State::New => {}
                }
                state[at] = State::OnChain;
                chain.push(at);
                match a.parent[at] {
                    Some(p) => at = p,
                    None => break None,
                }
            };
            // Resolve from the top down.
            while let Some(x) = chain.pop() {
                let (named, agent, agents, rooted) = match above {
                    Some(p) => (a.named[p], a.agent[p], a.agents[p], a.rooted[p]),
                    None => (None, None, 0, spans[x].span.parent_span_id.is_empty()),
                };
                let is_agent = spans[x].kind == Kind::Agent;
                a.named[x] = if names_session(&spans[x].span.attributes) {
                    Some(x)
                } else {
                    named
                };
                a.agent[x] = if is_agent { Some(x) } else { agent };
                a.agents[x] = agents + usize::from(is_agent);
                a.rooted[x] = rooted;
                state[x] = State::Done;
                above = Some(x);
            }
        }
        a
    }

    /// The nearest agent above agent span `agent`.
    fn parent_agent(&self, agent: usize) -> Option<usize> {
        self.parent[agent].and_then(|p| self.agent[p])
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

/// An event's JSON object written as it is built (no tree, no map): its fields in the
/// order they are added, strings escaped as serde_json escapes them.
struct Obj {
    buf: Vec<u8>,
}

impl Obj {
    fn new() -> Obj {
        Obj {
            buf: Vec::with_capacity(256),
        }
    }

    fn key(&mut self, key: &str) {
        self.buf.push(if self.buf.is_empty() { b'{' } else { b',' });
        self.put(&key);
        self.buf.push(b':');
    }

    fn put<T: serde::Serialize + ?Sized>(&mut self, value: &T) {
        serde_json::to_writer(&mut self.buf, value).expect("strings and numbers serialize");
    }

    fn str(&mut self, key: &str, value: &str) -> &mut Obj {
        self.key(key);
        self.put(value);
        self
    }

    fn num<T: serde::Serialize>(&mut self, key: &str, value: T) -> &mut Obj {
        self.key(key);
        self.put(&value);
        self
    }

    /// A captured value: as it is when it is a JSON object or array (arguments and
    /// results usually are) the event parser reads within its nesting limit, as a string
    /// otherwise.
    fn json_or_text(&mut self, key: &str, text: &str, max_nesting: usize) -> &mut Obj {
        self.key(key);
        let t = text.trim_ascii();
        // One level is the event object itself.
        let room = max_nesting.saturating_sub(1);
        if (t.starts_with('{') || t.starts_with('[')) && is_json(t, room) {
            self.buf.extend_from_slice(t.as_bytes());
        } else {
            self.put(text);
        }
        self
    }

    fn finish(mut self) -> Vec<u8> {
        self.buf.push(b'}');
        self.buf
    }
}

/// Whether a text is one JSON value, nested at most `max_nesting` deep, that the event
/// parser reads: its fast scanner, or where that gives up (surrogate escapes, …)
/// serde_json into a value, as the parser's slow path does (which refuses lone
/// surrogates).
fn is_json(text: &str, max_nesting: usize) -> bool {
    let mut sc = crate::json::Scanner::new(text.as_bytes(), max_nesting);
    if sc.value().is_ok() {
        sc.ws();
        if sc.at_end() {
            return true;
        }
    }
    crate::event::nesting_within(text.as_bytes(), max_nesting)
        && serde_json::from_str::<serde_json::Value>(text).is_ok()
}

/// The `session.completed` fields of a root agent span.
fn completion_fields() -> Obj {
    let mut m = Obj::new();
    m.str("type", "session.completed");
    m
}

/// The `cost.attributed` fields of an LLM span, and what it lacks. Without token counts
/// (an instrumentation that lost them: OpenInference's flattened history past the SDK's
/// attribute limit) the call is still a step, its tokens counted as 0: dropping it would
/// leave a loop's turns uncounted and its grace never elapsing.
fn llm_fields(span: &Span) -> (Obj, Vec<Missing>) {
    let a = &span.attributes[..];
    let mut lacking = Vec::new();
    let first = |keys: &[&str]| keys.iter().find_map(|k| count(a, k));
    let input = first(&[
        attr::GEN_AI_USAGE_INPUT_TOKENS,
        attr::LLM_TOKEN_COUNT_PROMPT,
    ]);
    let output = first(&[
        attr::GEN_AI_USAGE_OUTPUT_TOKENS,
        attr::LLM_TOKEN_COUNT_COMPLETION,
    ]);
    if input.is_none() || output.is_none() {
        lacking.push(Missing::TokenUsage);
    }
    let mut m = Obj::new();
    m.str("type", "cost.attributed")
        .num("input_tokens", input.unwrap_or(0))
        .num("output_tokens", output.unwrap_or(0));
    let cache_read = first(&[
        attr::GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
        attr::LLM_TOKEN_COUNT_PROMPT_DETAILS_CACHE_READ,
    ]);
    if let Some(n) = cache_read {
        m.num("cache_read_tokens", n);
    }
    let cache_write = first(&[
        attr::GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
        attr::LLM_TOKEN_COUNT_PROMPT_DETAILS_CACHE_WRITE,
    ]);
    if let Some(n) = cache_write {
        m.num("cache_write_tokens", n);
    }
    let model = [
        attr::GEN_AI_RESPONSE_MODEL,
        attr::GEN_AI_REQUEST_MODEL,
        attr::LLM_MODEL_NAME,
    ]
    .into_iter()
    .find_map(|k| string(a, k));
    if let Some(model) = model {
        m.str("model", model);
    }
    if let Some(cost) = number(a, attr::LLM_COST_TOTAL).filter(|c| *c >= 0.0 && c.is_finite()) {
        m.num("cost_usd", cost);
    }
    let reason = strings(a, attr::GEN_AI_RESPONSE_FINISH_REASONS)
        .into_iter()
        .next()
        .or_else(|| event_string(span, event::GEN_AI_CHOICE, event::FINISH_REASON));
    if let Some(reason) = reason {
        m.str("finish_reason", reason);
    }
    // The output as the GenAI conventions put it (an attribute, or since their event
    // form an attribute of a span event), as OpenInference flattens it, or as the older
    // `gen_ai.choice` span event carries it (Strands by default).
    let said = span_string(span, attr::GEN_AI_OUTPUT_MESSAGES)
        .and_then(output_messages)
        .or_else(|| openinference_output(a))
        .or_else(|| event_string(span, event::GEN_AI_CHOICE, event::MESSAGE).map(choice_message));
    match said {
        Some((text, tool_calls)) => {
            if !text.is_empty() {
                m.str("text", &text);
            }
            m.num("tool_calls", tool_calls);
        }
        None => lacking.push(Missing::Content),
    }
    (m, lacking)
}

/// The text and the count of tool calls of a `gen_ai.choice` event's `message`: content
/// blocks (`[{"text": …}, {"toolUse": …}]`, as Strands writes them), a message object
/// (`{"content": …, "tool_calls": […]}`), or plain text.
fn choice_message(message: &str) -> (String, u32) {
    fn blocks(v: &serde_json::Value, text: &mut String, calls: &mut u32) {
        let mut say = |t: &str| {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(t);
        };
        match v {
            serde_json::Value::String(t) => say(t),
            serde_json::Value::Array(items) => {
                for item in items {
                    blocks(item, text, calls);
                }
            }
            serde_json::Value::Object(o) => {
                if let Some(t) = o.get("text").and_then(|t| t.as_str()) {
                    say(t);
                } else if o.contains_key("toolUse")
                    || matches!(
                        o.get("type").and_then(|t| t.as_str()),
                        Some("tool_call" | "tool_use" | "function")
                    )
                {
                    *calls += 1;
                } else if let Some(content) = o.get("content") {
                    blocks(content, text, calls);
                }
                if let Some(serde_json::Value::Array(tc)) = o.get("tool_calls") {
                    *calls += tc.len() as u32;
                }
            }
            _ => {}
        }
    }
    match serde_json::from_str::<serde_json::Value>(message) {
        Ok(v @ (serde_json::Value::Array(_) | serde_json::Value::Object(_))) => {
            let (mut text, mut calls) = (String::new(), 0);
            blocks(&v, &mut text, &mut calls);
            (text, calls)
        }
        _ => (message.trim_end().to_string(), 0),
    }
}

/// The text and the count of tool calls of `gen_ai.output.messages` (a JSON array of
/// messages, each with `parts` of `type` `text` or `tool_call`).
fn output_messages(messages: &str) -> Option<(String, u32)> {
    #[derive(serde::Deserialize)]
    struct Message<'a> {
        #[serde(borrow, default)]
        parts: Vec<Part<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Part<'a> {
        #[serde(borrow, rename = "type")]
        kind: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow)]
        content: Option<std::borrow::Cow<'a, str>>,
    }
    let messages: Vec<Message<'_>> = serde_json::from_str(messages).ok()?;
    let mut text = String::new();
    let mut calls = 0u32;
    for part in messages.iter().flat_map(|m| &m.parts) {
        match part.kind.as_deref() {
            Some("text") => {
                if let Some(c) = &part.content {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(c);
                }
            }
            Some("tool_call") => calls += 1,
            _ => {}
        }
    }
    Some((text, calls))
}

/// The text and the count of tool calls of OpenInference's flattened output messages.
fn openinference_output(a: &[KeyValue]) -> Option<(String, u32)> {
    let prefix = format!("{}.", attr::LLM_OUTPUT_MESSAGES);
    let mut texts: Vec<(u32, &str)> = Vec::new();
    let mut calls: Vec<(u32, u32)> = Vec::new();
    let mut any = false;
    for kv in a {
        let Some(rest) = kv.key.strip_prefix(&prefix) else {
            continue;
        };
        any = true;
        let Some((index, field)) = rest.split_once('.') else {
            continue;
        };
        let Ok(index) = index.parse::<u32>() else {
            continue;
        };
        if field == attr::MESSAGE_CONTENT {
            if let Some(Value::StringValue(s)) = kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                texts.push((index, s));
            }
        } else if let Some(call) = field
            .strip_prefix(attr::MESSAGE_TOOL_CALLS)
            .and_then(|r| r.strip_prefix('.'))
            .and_then(|r| r.split('.').next())
            .and_then(|j| j.parse::<u32>().ok())
        {
            calls.push((index, call));
        }
    }
    if !any {
        return None;
    }
    texts.sort_by_key(|(i, _)| *i);
    calls.sort_unstable();
    calls.dedup();
    let text = texts.iter().map(|(_, t)| *t).collect::<Vec<_>>().join("\n");
    Some((text, calls.len() as u32))
}

/// The `tool.called` fields of a tool span, and whether its content was captured;
/// `None` without a tool name.
fn tool_fields(span: &Span, max_nesting: usize) -> Option<(Obj, bool)> {
    let a = &span.attributes[..];
    let tool = [attr::GEN_AI_TOOL_NAME, attr::TOOL_NAME]
        .into_iter()
        .find_map(|k| string(a, k).filter(|s| !s.is_empty()))?;
    let mut m = Obj::new();
    m.str("type", "tool.called").str("tool", tool);
    // Arguments and result as attributes (GenAI, OpenInference), else as the span
    // events Strands writes by default (`gen_ai.tool.message`, `gen_ai.choice`).
    let args = string(a, attr::GEN_AI_TOOL_CALL_ARGUMENTS)
        .or_else(|| string(a, attr::INPUT_VALUE))
        .or_else(|| event_string(span, event::GEN_AI_TOOL_MESSAGE, event::CONTENT));
    let result = string(a, attr::GEN_AI_TOOL_CALL_RESULT)
        .or_else(|| string(a, attr::OUTPUT_VALUE))
        .or_else(|| event_string(span, event::GEN_AI_CHOICE, event::MESSAGE));
    // LangChain's tool spans carry the whole `ToolMessage`, its id new on every call:
    // the result is its content, and its status says whether the call failed.
    let (result, tool_message_failed) = match result.map(langchain_tool_message) {
        Some((r, failed)) => (Some(r), failed),
        None => (None, false),
    };
    let captured = args.is_some() && result.is_some();
    // Arguments and results are there only with content capture on. Without them two
    // calls cannot be told alike, so each is its own: arguments that name the span, and
    // the span id as the result's digest (a result that cannot be read, judged as one that
    // says something). Content detectors then never fire on it; counts, ceilings and
    // error streaks still judge it.
    let span_id = hex(&span.span_id);
    match args {
        Some(args) => m.json_or_text("args", args, max_nesting),
        None => {
            m.key("args");
            m.put(&json!({ UNCAPTURED: span_id }));
            &mut m
        }
    };
    match result {
        Some(std::borrow::Cow::Borrowed(result)) => m.json_or_text("result", result, max_nesting),
        Some(std::borrow::Cow::Owned(result)) => m.json_or_text("result", &result, max_nesting),
        None => m.str("result_digest", &span_id),
    };
    let call_id = string(a, attr::GEN_AI_TOOL_CALL_ID).or_else(|| string(a, attr::TOOL_CALL_ID));
    if let Some(id) = call_id {
        m.str("call_id", id);
    }
    let error_type = string(a, attr::ERROR_TYPE);
    let failed = span
        .status
        .as_ref()
        .is_some_and(|s| s.code == StatusCode::Error as i32);
    if failed || error_type.is_some() || tool_message_failed {
        m.num("is_error", true);
    }
    if let Some(kind) = error_type {
        m.str("error_kind", kind);
    }
    let duration_ns = span
        .end_time_unix_nano
        .saturating_sub(span.start_time_unix_nano);
    m.num("duration_ms", (duration_ns / 1_000) as f64 / 1_000.0);
    Some((m, captured))
}

/// A LangChain `ToolMessage` as its OpenInference span writes it
/// (`{"type": "tool", "data": {"content": …, "status": …, "tool_call_id": …}}`): its
/// content, and whether its status is `error`. Anything else is the result as it is.
fn langchain_tool_message(result: &str) -> (std::borrow::Cow<'_, str>, bool) {
    use std::borrow::Cow;
    let t = result.trim_ascii_start();
    if !(t.starts_with('{') && t.contains("\"tool_call_id\"")) {
        return (Cow::Borrowed(result), false);
    }
    let Ok(serde_json::Value::Object(mut o)) = serde_json::from_str::<serde_json::Value>(t) else {
        return (Cow::Borrowed(result), false);
    };
    if o.get("type").and_then(|v| v.as_str()) != Some("tool") {
        return (Cow::Borrowed(result), false);
    }
    let Some(serde_json::Value::Object(mut data)) = o.remove("data") else {
        return (Cow::Borrowed(result), false);
    };
    let failed = data.get("status").and_then(|v| v.as_str()) == Some("error");
    match data.remove("content") {
        Some(serde_json::Value::String(c)) => (Cow::Owned(c), failed),
        Some(other) => (Cow::Owned(other.to_string()), failed),
        None => (Cow::Borrowed(result), false),
    }
}

/// What turns the missing capture on for an instrumentation scope (the README's table).
fn capture_setting(scope: &str, missing: Missing) -> &'static str {
    let scope = scope.to_ascii_lowercase();
    match missing {
        Missing::TokenUsage if scope.contains("openinference") => {
            "OPENINFERENCE_HIDE_INPUT_MESSAGES=true (its flattened history otherwise fills the SDK's 128-attribute limit and evicts the token counts), or a higher OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT"
        }
        Missing::TokenUsage => {
            "an instrumentation that records gen_ai.usage.input_tokens and gen_ai.usage.output_tokens (or OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT above what the span carries)"
        }
        Missing::Content if scope.contains("openinference") => {
            "OPENINFERENCE_HIDE_OUTPUTS and OPENINFERENCE_HIDE_INPUTS unset (or false)"
        }
        Missing::Content if scope.contains("pydantic") => {
            "InstrumentationSettings(include_content=True) (pydantic-ai's default)"
        }
        Missing::Content if scope.contains("strands") => {
            "Strands' default telemetry (its span events carry the content), or OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental"
        }
        Missing::Content => "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true (OpenTelemetry's GenAI instrumentations)",
    }
}

/// An attribute of the span, else of the last of its events that carries it.
fn span_string<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    string(&span.attributes, key).or_else(|| {
        span.events
            .iter()
            .rev()
            .find_map(|e| string(&e.attributes, key))
    })
}

/// An attribute of the span's last event named `name` that carries it.
fn event_string<'a>(span: &'a Span, name: &str, key: &str) -> Option<&'a str> {
    span.events
        .iter()
        .rev()
        .filter(|e| e.name == name)
        .find_map(|e| string(&e.attributes, key))
}

/// The argument naming a call whose arguments were not captured.
pub const UNCAPTURED: &str = "uncaptured_call";

fn value<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attrs
        .iter()
        .rev() // the last of repeated keys wins, as in a map
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn string<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match value(attrs, key)? {
        Value::StringValue(s) => Some(s),
        _ => None,
    }
}

/// A non-negative whole count (token counts arrive as ints, sometimes as doubles or
/// strings).
fn count(attrs: &[KeyValue], key: &str) -> Option<u64> {
    match value(attrs, key)? {
        Value::IntValue(n) => u64::try_from(*n).ok(),
        Value::DoubleValue(d) if *d >= 0.0 && d.fract() == 0.0 && *d < 1e18 => Some(*d as u64),
        Value::StringValue(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn number(attrs: &[KeyValue], key: &str) -> Option<f64> {
    match value(attrs, key)? {
        Value::IntValue(n) => Some(*n as f64),
        Value::DoubleValue(d) => Some(*d),
        Value::StringValue(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn strings<'a>(attrs: &'a [KeyValue], key: &str) -> Vec<&'a str> {
    match value(attrs, key) {
        Some(Value::StringValue(s)) => vec![s.as_str()],
        Some(Value::ArrayValue(a)) => a
            .values
            .iter()
            .filter_map(|v| match v.value.as_ref() {
                Some(Value::StringValue(s)) => Some(s.as_str()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status};

    use super::*;
    use crate::config::Config;
    use crate::event::{parse_event, ParseLimits};

    fn kv(key: &str, v: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(v) }),
        }
    }

    fn s(key: &str, v: &str) -> KeyValue {
        kv(key, Value::StringValue(v.into()))
    }

    fn i(key: &str, v: i64) -> KeyValue {
        kv(key, Value::IntValue(v))
    }

    fn span(id: u8, parent: Option<u8>, end_ms: u64, attributes: Vec<KeyValue>) -> Span {
        Span {
            trace_id: vec![7; 16],
            span_id: vec![id; 8],
            parent_span_id: parent.map(|p| vec![p; 8]).unwrap_or_default(),
            name: format!("span {id}"),
            start_time_unix_nano: (end_ms - 5) * 1_000_000,
            end_time_unix_nano: end_ms * 1_000_000,
            attributes,
            ..Span::default()
        }
    }

    fn request(resource: Vec<KeyValue>, spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: resource,
                    ..Resource::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        }
    }

    fn chat(id: u8, parent: Option<u8>, end_ms: u64) -> Span {
        span(
            id,
            parent,
            end_ms,
            vec![
                s(attr::GEN_AI_OPERATION_NAME, "chat"),
                s(attr::GEN_AI_CONVERSATION_ID, "conv-1"),
                i(attr::GEN_AI_USAGE_INPUT_TOKENS, 1200),
                i(attr::GEN_AI_USAGE_OUTPUT_TOKENS, 80),
                i(attr::GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, 1000),
                s(attr::GEN_AI_RESPONSE_MODEL, "model-x"),
                kv(
                    attr::GEN_AI_RESPONSE_FINISH_REASONS,
                    Value::ArrayValue(ArrayValue {
                        values: vec![AnyValue {
                            value: Some(Value::StringValue("tool_calls".into())),
                        }],
                    }),
                ),
                s(
                    attr::GEN_AI_OUTPUT_MESSAGES,
                    r#"[{"role":"assistant","parts":[{"type":"text","content":"Let me read it."},{"type":"tool_call","id":"c1","name":"read","arguments":{"p":"a"}}],"finish_reason":"tool_call"}]"#,
                ),
            ],
        )
    }

    fn tool(id: u8, parent: Option<u8>, end_ms: u64) -> Span {
        span(
            id,
            parent,
            end_ms,
            vec![
                s(attr::GEN_AI_OPERATION_NAME, "execute_tool"),
                s(attr::GEN_AI_CONVERSATION_ID, "conv-1"),
                s(attr::GEN_AI_TOOL_NAME, "read_file"),
                s(attr::GEN_AI_TOOL_CALL_ID, "call-1"),
                s(
                    attr::GEN_AI_TOOL_CALL_ARGUMENTS,
                    r#"{"path": "src/main.rs"}"#,
                ),
                s(attr::GEN_AI_TOOL_CALL_RESULT, "fn main() {}"),
            ],
        )
    }

    fn events(
        mapper: &Mapper,
        req: &ExportTraceServiceRequest,
    ) -> (Vec<serde_json::Value>, MapReport) {
        let mut out = Vec::new();
        let report = mapper.map(req, &mut out);
        let values = out
            .iter()
            .map(|e| {
                // Every event is one the contract accepts.
                parse_event(&e.json, &ParseLimits::default()).expect("a valid event");
                serde_json::from_slice(&e.json).unwrap()
            })
            .collect();
        (values, report)
    }

    #[test]
    fn chat_and_tool_spans_become_llm_and_tool_calls() {
        let req = request(vec![], vec![tool(2, None, 2_000), chat(1, None, 1_000)]);
        let (ev, report) = events(&Mapper::default(), &req);
        assert_eq!((report.llm_calls, report.tool_calls), (1, 1));
        // In the order the spans ended.
        let llm = &ev[0];
        assert_eq!(llm["type"], "cost.attributed");
        assert_eq!(llm["session_id"], "conv-1");
        assert_eq!(llm["event_id"], "0101010101010101");
        assert_eq!(llm["trace_id"], "07070707070707070707070707070707");
        assert_eq!(llm["timestamp"], "1970-01-01T00:00:01.000Z");
        assert_eq!(
            (llm["input_tokens"].as_u64(), llm["output_tokens"].as_u64()),
            (Some(1200), Some(80))
        );
        assert_eq!(llm["cache_read_tokens"], 1000);
        assert_eq!(llm["model"], "model-x");
        assert_eq!(llm["finish_reason"], "tool_calls");
        assert_eq!(llm["text"], "Let me read it.");
        assert_eq!(llm["tool_calls"], 1);
        let t = &ev[1];
        assert_eq!(t["type"], "tool.called");
        assert_eq!(t["tool"], "read_file");
        assert_eq!(t["args"], json!({"path": "src/main.rs"}));
        assert_eq!(t["result"], "fn main() {}");
        assert_eq!(t["call_id"], "call-1");
        assert_eq!(t["duration_ms"], 5.0);
        assert!(t.get("is_error").is_none());
    }

    #[test]
    fn what_a_span_does_not_say_is_not_guessed() {
        let mut bare = chat(1, None, 1_000);
        bare.attributes
            .retain(|kv| kv.key != attr::GEN_AI_OUTPUT_MESSAGES);
        let mut no_usage = chat(2, None, 1_100);
        no_usage
            .attributes
            .retain(|kv| kv.key != attr::GEN_AI_USAGE_INPUT_TOKENS);
        let http = span(3, None, 1_200, vec![s("http.request.method", "GET")]);
        let mut nameless = tool(4, None, 1_300);
        nameless
            .attributes
            .retain(|kv| kv.key != attr::GEN_AI_TOOL_NAME);
        let req = request(
            vec![s(attr::SERVICE_NAME, "billing-agent")],
            vec![bare, no_usage, http, nameless],
        );
        let (ev, report) = events(&Mapper::default(), &req);
        assert_eq!(ev.len(), 2);
        assert!(ev[0].get("text").is_none() && ev[0].get("tool_calls").is_none());
        // An LLM call without token counts is still a step: its tokens count as 0.
        assert_eq!(
            (
                ev[1]["input_tokens"].as_u64(),
                ev[1]["output_tokens"].as_u64()
            ),
            (Some(0), Some(80))
        );
        assert_eq!(ev[1]["text"], "Let me read it.");
        assert_eq!(report.llm_calls, 2);
        assert_eq!(report.skipped(Skipped::NotAgentStep), 1);
        assert_eq!(report.skipped(Skipped::NoToolName), 1);
        // What each lacked is counted by service, with the setting that gives it.
        assert_eq!(report.uncaptured(Missing::TokenUsage), 1);
        assert_eq!(report.uncaptured(Missing::Content), 1);
        let u = &report.uncaptured[0];
        assert_eq!(u.service, "billing-agent");
        assert!(
            u.setting().contains("CAPTURE_MESSAGE_CONTENT"),
            "{}",
            u.setting()
        );
    }

    fn with_events(mut sp: Span, evs: &[(&str, Vec<KeyValue>)]) -> Span {
        use opentelemetry_proto::tonic::trace::v1::span::Event;
        sp.events = evs
            .iter()
            .map(|(name, attributes)| Event {
                time_unix_nano: sp.end_time_unix_nano,
                name: name.to_string(),
                attributes: attributes.clone(),
                dropped_attributes_count: 0,
            })
            .collect();
        sp
    }

    /// Strands with its default telemetry: content in span events, as it writes them.
    #[test]
    fn content_in_span_events_is_read() {
        let chat_span = with_events(
            span(
                1,
                None,
                1_000,
                vec![
                    s(attr::GEN_AI_OPERATION_NAME, "chat"),
                    i(attr::GEN_AI_USAGE_INPUT_TOKENS, 100),
                    i(attr::GEN_AI_USAGE_OUTPUT_TOKENS, 20),
                ],
            ),
            &[
                (
                    "gen_ai.user.message",
                    vec![s("content", r#"[{"text": "fix the bug"}]"#)],
                ),
                (
                    event::GEN_AI_CHOICE,
                    vec![
                        s(event::FINISH_REASON, "tool_use"),
                        s(
                            event::MESSAGE,
                            r#"[{"text": "Running the tests again."}, {"toolUse": {"toolUseId": "c1", "name": "run_tests", "input": {"path": "tests/"}}}]"#,
                        ),
                    ],
                ),
            ],
        );
        let tool_span = with_events(
            span(
                2,
                None,
                1_100,
                vec![
                    s(attr::GEN_AI_OPERATION_NAME, "execute_tool"),
                    s(attr::GEN_AI_TOOL_NAME, "run_tests"),
                ],
            ),
            &[
                (
                    event::GEN_AI_TOOL_MESSAGE,
                    vec![s(event::CONTENT, r#"{"path": "tests/"}"#)],
                ),
                (
                    event::GEN_AI_CHOICE,
                    vec![s(event::MESSAGE, r#"[{"text": "FAILED test_x"}]"#)],
                ),
            ],
        );
        // The GenAI conventions' newer event form: output messages on a span event.
        let details = with_events(
            span(
                3,
                None,
                1_200,
                vec![
                    s(attr::GEN_AI_OPERATION_NAME, "chat"),
                    i(attr::GEN_AI_USAGE_INPUT_TOKENS, 100),
                    i(attr::GEN_AI_USAGE_OUTPUT_TOKENS, 20),
                ],
            ),
            &[(
                "gen_ai.client.inference.operation.details",
                vec![s(
                    attr::GEN_AI_OUTPUT_MESSAGES,
                    r#"[{"role": "assistant", "parts": [{"type": "text", "content": "Done."}]}]"#,
                )],
            )],
        );
        let (ev, report) = events(
            &Mapper::default(),
            &request(vec![], vec![chat_span, tool_span, details]),
        );
        assert_eq!(ev[0]["text"], "Running the tests again.");
        assert_eq!(ev[0]["tool_calls"], 1);
        assert_eq!(ev[0]["finish_reason"], "tool_use");
        assert_eq!(ev[1]["args"], json!({"path": "tests/"}));
        assert_eq!(ev[1]["result"], json!([{"text": "FAILED test_x"}]));
        assert_eq!(
            (ev[2]["text"].clone(), ev[2]["tool_calls"].clone()),
            (json!("Done."), json!(0))
        );
        assert!(report.uncaptured.is_empty(), "{:?}", report.uncaptured);
    }

    #[test]
    fn choice_messages_of_every_shape() {
        assert_eq!(choice_message("Giving up.\n"), ("Giving up.".into(), 0));
        assert_eq!(
            choice_message(r#"{"content": "Checking.", "tool_calls": [{"id": "a"}, {"id": "b"}]}"#),
            ("Checking.".into(), 2)
        );
        assert_eq!(
            choice_message(
                r#"[{"type": "text", "text": "a"}, {"type": "tool_use", "name": "x"}, {"text": "b"}]"#
            ),
            ("a\nb".into(), 1)
        );
    }

    /// LangChain's tool spans (OpenInference) carry the whole `ToolMessage`, whose
    /// `tool_call_id` is new on every call: the result is its content.
    #[test]
    fn a_langchain_tool_message_is_its_content() {
        let lc = |id: u8, status: &str| {
            span(
                id,
                None,
                1_000 + id as u64,
                vec![
                    s(attr::OPENINFERENCE_SPAN_KIND, "TOOL"),
                    s(attr::TOOL_NAME, "run_tests"),
                    s(attr::INPUT_VALUE, "tests/"),
                    s(
                        attr::OUTPUT_VALUE,
                        &format!(
                            r#"{{"type": "tool", "data": {{"content": "FAILED test_x", "additional_kwargs": {{}}, "type": "tool", "name": "run_tests", "id": null, "tool_call_id": "call_{id}", "status": "{status}"}}}}"#
                        ),
                    ),
                ],
            )
        };
        let (ev, _) = events(
            &Mapper::default(),
            &request(vec![], vec![lc(1, "success"), lc(2, "error")]),
        );
        assert_eq!(ev[0]["result"], "FAILED test_x");
        assert!(ev[0].get("is_error").is_none());
        assert_eq!(
            (ev[1]["result"].clone(), ev[1]["is_error"].clone()),
            (json!("FAILED test_x"), json!(true))
        );
        // Other JSON results are left as they are.
        assert_eq!(
            langchain_tool_message(r#"{"type": "tool", "tool_call_id": 1}"#).0,
            r#"{"type": "tool", "tool_call_id": 1}"#
        );
    }

    /// The end of a trace's root agent run completes the session that is that trace; a
    /// nested agent's end, a conversation named by the agent (it may go on in another
    /// run) and the creation of an agent do not.
    #[test]
    fn a_root_agent_run_completes_the_session_of_its_trace() {
        let agent = |id: u8, parent: Option<u8>, end_ms: u64, op: &str, conv: Option<&str>| {
            let mut attrs = vec![
                s(attr::GEN_AI_OPERATION_NAME, op),
                s(attr::GEN_AI_AGENT_NAME, "fixer"),
            ];
            if let Some(c) = conv {
                attrs.push(s(attr::GEN_AI_CONVERSATION_ID, c));
            }
            span(id, parent, end_ms, attrs)
        };
        let mut step = chat(3, Some(2), 1_000);
        step.attributes
            .retain(|kv| kv.key != attr::GEN_AI_CONVERSATION_ID);
        let req = request(
            vec![],
            vec![
                step,
                agent(2, Some(1), 1_500, "invoke_agent", None),
                agent(1, None, 2_000, "invoke_agent", None),
            ],
        );
        let (ev, report) = events(&Mapper::default(), &req);
        assert_eq!(report.completions, 1);
        let done: Vec<_> = ev
            .iter()
            .filter(|e| e["type"] == "session.completed")
            .collect();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0]["session_id"], "07070707070707070707070707070707");
        assert_eq!(done[0]["event_id"], "0101010101010101");
        // Last: the run's steps come before its end.
        assert_eq!(ev.last().unwrap()["type"], "session.completed");
        // A conversation, or an agent's creation: no completion.
        for (op, conv) in [("invoke_agent", Some("conv-1")), ("create_agent", None)] {
            let req = request(vec![], vec![agent(1, None, 2_000, op, conv)]);
            let (ev, report) = events(&Mapper::default(), &req);
            assert_eq!((ev.len(), report.completions), (0, 0), "{op} {conv:?}");
        }
    }

    /// Findings of the default configuration's engine on `events`.
    fn findings(events: &[serde_json::Value]) -> usize {
        let mut engine = crate::engine::Engine::new(std::sync::Arc::new(Config::default()));
        let mut out = Vec::new();
        for v in events {
            let bytes = serde_json::to_vec(v).unwrap();
            let e = parse_event(&bytes, &ParseLimits::default()).unwrap();
            engine.process(&e, &crate::engine::EventMeta::default(), &mut out);
        }
        out.len()
    }

    #[test]
    fn calls_without_content_capture_are_each_their_own() {
        let bare = |id: u8| {
            let mut sp = tool(id, None, 1_000 + id as u64);
            sp.attributes.retain(|kv| {
                kv.key != attr::GEN_AI_TOOL_CALL_ARGUMENTS
                    && kv.key != attr::GEN_AI_TOOL_CALL_RESULT
            });
            sp
        };
        let (ev, _) = events(
            &Mapper::default(),
            &request(vec![], (1..=8).map(bare).collect()),
        );
        assert_eq!(ev[0]["args"], json!({UNCAPTURED: "0101010101010101"}));
        assert_eq!(ev[0]["result_digest"], "0101010101010101");
        // Eight calls of one tool whose arguments and results are unknown: no loop found;
        // the same eight calls with their (identical) content captured are one.
        assert_eq!(findings(&ev), 0);
        let captured = (1..=8).map(|i| tool(i, None, 1_000 + i as u64)).collect();
        let (ev, _) = events(&Mapper::default(), &request(vec![], captured));
        assert!(findings(&ev) > 0);
    }

    #[test]
    fn failures_say_so() {
        let mut failed = tool(1, None, 1_000);
        failed.status = Some(Status {
            code: StatusCode::Error as i32,
            message: "boom".into(),
        });
        let mut typed = tool(2, None, 1_100);
        typed.attributes.push(s(attr::ERROR_TYPE, "timeout"));
        let (ev, _) = events(&Mapper::default(), &request(vec![], vec![failed, typed]));
        assert_eq!(ev[0]["is_error"], true);
        assert!(ev[0].get("error_kind").is_none());
        assert_eq!(
            (ev[1]["is_error"].clone(), ev[1]["error_kind"].clone()),
            (json!(true), json!("timeout"))
        );
    }

    #[test]
    fn agents_name_their_steps_and_nested_agents_give_depth_and_parent() {
        // root agent (conv-root) -> sub-agent (conv-sub) -> chat; the whole chain is here.
        let root = span(
            10,
            None,
            9_000,
            vec![
                s(attr::GEN_AI_OPERATION_NAME, "invoke_agent"),
                s(attr::GEN_AI_AGENT_NAME, "planner"),
                s(attr::GEN_AI_CONVERSATION_ID, "conv-root"),
            ],
        );
        let sub = span(
            11,
            Some(10),
            8_000,
            vec![
                s(attr::GEN_AI_OPERATION_NAME, "invoke_agent"),
                s(attr::GEN_AI_AGENT_ID, "coder-7"),
                s(attr::GEN_AI_CONVERSATION_ID, "conv-sub"),
            ],
        );
        let mut step = chat(12, Some(11), 1_000);
        step.attributes
            .retain(|kv| kv.key != attr::GEN_AI_CONVERSATION_ID);
        let (ev, report) = events(
            &Mapper::default(),
            &request(vec![], vec![step.clone(), sub.clone(), root]),
        );
        assert_eq!(report.agents, 2);
        assert_eq!(ev[0]["agent_id"], "coder-7");
        assert_eq!(
            ev[0]["session_id"], "conv-sub",
            "the nearest ancestor's session"
        );
        assert_eq!(ev[0]["depth"], 1);
        assert_eq!(ev[0]["parent_session_id"], "conv-root");
        // Without the root in the request, depth is not known (not guessed as 0).
        let (ev, _) = events(&Mapper::default(), &request(vec![], vec![step, sub]));
        assert_eq!(ev[0]["agent_id"], "coder-7");
        assert!(ev[0].get("depth").is_none() && ev[0].get("parent_session_id").is_none());
    }

    #[test]
    fn sessions_fall_back_in_order() {
        let plain = |id: u8, extra: Vec<KeyValue>| {
            let mut sp = chat(id, None, 1_000 + id as u64);
            sp.attributes
                .retain(|kv| kv.key != attr::GEN_AI_CONVERSATION_ID);
            sp.attributes.extend(extra);
            sp
        };
        let spans = vec![
            plain(1, vec![s(attr::SESSION_ID, "oi-session")]),
            plain(2, vec![s("app.thread", "thread-9")]),
            plain(3, vec![]),
        ];
        let mapper = Mapper {
            session_attribute: Some("app.thread".into()),
            ..Mapper::default()
        };
        let (ev, _) = events(&mapper, &request(vec![], spans.clone()));
        let sessions: Vec<&str> = ev
            .iter()
            .map(|e| e["session_id"].as_str().unwrap())
            .collect();
        assert_eq!(
            sessions,
            ["oi-session", "thread-9", "07070707070707070707070707070707"]
        );
        let (ev, _) = events(
            &Mapper::default(),
            &request(vec![s(attr::SESSION_ID, "from-resource")], spans),
        );
        assert_eq!(ev[2]["session_id"], "from-resource");
        assert_eq!(
            ev[1]["session_id"], "from-resource",
            "not configured: app.thread is no session"
        );
    }

    /// An OpenInference LLM span (session `s-oi`) asking for two tools.
    fn openinference_llm(id: u8, parent: Option<u8>) -> Span {
        span(
            id,
            parent,
            1_000,
            vec![
                s(attr::OPENINFERENCE_SPAN_KIND, "LLM"),
                s(attr::SESSION_ID, "s-oi"),
                i(attr::LLM_TOKEN_COUNT_PROMPT, 300),
                i(attr::LLM_TOKEN_COUNT_COMPLETION, 20),
                s(attr::LLM_MODEL_NAME, "m"),
                kv(attr::LLM_COST_TOTAL, Value::DoubleValue(0.002)),
                s(
                    "llm.output_messages.0.message.content",
                    "Checking the file.",
                ),
                s(
                    "llm.output_messages.0.message.tool_calls.0.tool_call.function.name",
                    "read",
                ),
                s(
                    "llm.output_messages.0.message.tool_calls.1.tool_call.function.name",
                    "grep",
                ),
            ],
        )
    }

    /// An OpenInference tool span (session `s-oi`) of `read`.
    fn openinference_tool(id: u8, parent: Option<u8>) -> Span {
        span(
            id,
            parent,
            1_100,
            vec![
                s(attr::OPENINFERENCE_SPAN_KIND, "TOOL"),
                s(attr::SESSION_ID, "s-oi"),
                s(attr::TOOL_NAME, "read"),
                s(attr::INPUT_VALUE, r#"{"p": 1}"#),
                s(attr::OUTPUT_VALUE, "contents"),
            ],
        )
    }

    #[test]
    fn openinference_spans_map_too() {
        let (llm, tool) = (openinference_llm(1, None), openinference_tool(2, None));
        let (ev, _) = events(&Mapper::default(), &request(vec![], vec![llm, tool]));
        assert_eq!(ev[0]["input_tokens"], 300);
        assert_eq!(ev[0]["cost_usd"], 0.002);
        assert_eq!(ev[0]["text"], "Checking the file.");
        assert_eq!(ev[0]["tool_calls"], 2);
        assert_eq!(ev[1]["tool"], "read");
        assert_eq!(ev[1]["args"], json!({"p": 1}));
    }

    #[test]
    fn both_encodings_decode_and_garbage_is_refused() {
        let req = request(vec![], vec![chat(1, None, 1_000)]);
        let proto = req.encode_to_vec();
        assert_eq!(decode(&proto, Encoding::OtlpProto).unwrap(), req);
        // OTLP JSON as the Collector writes it: hex ids, nanoseconds as strings.
        let json_text = r#"{"resourceSpans":[{"resource":{"attributes":[]},"scopeSpans":[{"scope":{"name":"x"},"spans":[
            {"traceId":"07070707070707070707070707070707","spanId":"0101010101010101","name":"chat m","kind":3,
             "startTimeUnixNano":"995000000","endTimeUnixNano":"1000000000",
             "attributes":[{"key":"gen_ai.operation.name","value":{"stringValue":"chat"}},
                           {"key":"gen_ai.usage.input_tokens","value":{"intValue":"12"}},
                           {"key":"gen_ai.usage.output_tokens","value":{"intValue":3}}],
             "status":{}}]}]}]}"#;
        let from_json = decode(json_text.as_bytes(), Encoding::OtlpJson).unwrap();
        let (ev, _) = events(&Mapper::default(), &from_json);
        assert_eq!(
            (
                ev[0]["input_tokens"].as_u64(),
                ev[0]["output_tokens"].as_u64()
            ),
            (Some(12), Some(3))
        );
        assert_eq!(ev[0]["event_id"], "0101010101010101");
        for (bytes, enc) in [
            (&b"\xff\x00garbage"[..], Encoding::OtlpProto),
            (&b"{\"resourceSpans\": 3}"[..], Encoding::OtlpJson),
        ] {
            let e = decode(bytes, enc).unwrap_err();
            assert_eq!(e.reason(), "invalid_otlp");
            assert!(e.to_string().contains("ExportTraceServiceRequest"), "{e}");
        }
    }

    #[test]
    fn the_same_request_maps_to_the_same_bytes() {
        let req = request(vec![], vec![chat(1, None, 1_000), tool(2, Some(1), 1_500)]);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        Mapper::default().map(&req, &mut a);
        Mapper::default().map(&req, &mut b);
        assert_eq!(a, b);
        assert_eq!(
            a[1].traceparent,
            format!("00-{}-{}-01", "07".repeat(16), "02".repeat(8))
        );
    }

    #[test]
    fn deep_and_looping_parent_chains_resolve() {
        let id = |n: u32| {
            let mut v = vec![1u8; 8];
            v[4..].copy_from_slice(&n.to_be_bytes());
            v
        };
        let agent = |n: u32, parent: Option<u32>| {
            let mut sp = span(
                1,
                None,
                9_000,
                vec![
                    s(attr::GEN_AI_OPERATION_NAME, "invoke_agent"),
                    s(attr::GEN_AI_AGENT_NAME, &format!("a{n}")),
                    s(attr::GEN_AI_CONVERSATION_ID, &format!("c{n}")),
                ],
            );
            sp.span_id = id(n);
            sp.parent_span_id = parent.map(id).unwrap_or_default();
            sp
        };
        let step_below = |parent: u32| {
            let mut step = chat(2, None, 1_000);
            step.parent_span_id = id(parent);
            step.attributes
                .retain(|kv| kv.key != attr::GEN_AI_CONVERSATION_ID);
            step
        };
        // 3,000 agents, each the parent of the next, and a step below the last.
        let mut spans: Vec<Span> = (0..3_000).map(|n| agent(n, n.checked_sub(1))).collect();
        spans.reverse(); // children before parents: resolution must not depend on order
        spans.push(step_below(2_999));
        let (ev, report) = events(&Mapper::default(), &request(vec![], spans));
        assert_eq!(report.agents, 3_000);
        assert_eq!(ev[0]["agent_id"], "a2999");
        assert_eq!(ev[0]["session_id"], "c2999");
        assert_eq!(ev[0]["depth"], 2_999);
        assert_eq!(ev[0]["parent_session_id"], "c2998");
        // Two agents that are each other's parent: the step still maps, without a depth.
        let looped = vec![agent(1, Some(2)), agent(2, Some(1)), step_below(1)];
        let (ev, _) = events(&Mapper::default(), &request(vec![], looped));
        assert_eq!(ev[0]["agent_id"], "a1");
        assert_eq!(ev[0]["session_id"], "c1");
        assert_eq!(ev[0]["parent_session_id"], "c2");
        assert!(ev[0].get("depth").is_none(), "{}", ev[0]);
    }

    #[test]
    fn steps_without_valid_ids_are_skipped_and_counted() {
        let mut no_span_id = chat(1, None, 1_000);
        no_span_id.span_id.clear();
        let mut zero_trace = tool(2, None, 1_100);
        zero_trace.trace_id = vec![0; 16];
        let (ev, report) = events(
            &Mapper::default(),
            &request(vec![], vec![no_span_id, zero_trace, chat(3, None, 1_200)]),
        );
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0]["event_id"], "0303030303030303");
        assert_eq!(report.skipped(Skipped::InvalidIds), 2);
    }

    #[test]
    fn captured_values_are_embedded_only_as_the_event_parser_reads_them() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        // A tool span capturing exactly these arguments and result.
        let capturing = |args: &str, result: &str| {
            let mut t = tool(2, None, 1_500);
            t.attributes.retain(|kv| {
                kv.key != attr::GEN_AI_TOOL_CALL_ARGUMENTS
                    && kv.key != attr::GEN_AI_TOOL_CALL_RESULT
            });
            t.attributes.push(s(attr::GEN_AI_TOOL_CALL_ARGUMENTS, args));
            t.attributes.push(s(attr::GEN_AI_TOOL_CALL_RESULT, result));
            t
        };
        let with = |args: &str, result: &str| {
            let (ev, _) = events(
                &Mapper::default(),
                &request(vec![], vec![capturing(args, result)]),
            );
            ev.into_iter().next().unwrap()
        };
        let limit = crate::event::DEFAULT_MAX_NESTING;
        // Inside the event object, a value may nest one level less than the limit.
        let ev = with(&nested(limit - 1), &nested(limit));
        assert!(ev["args"].is_array(), "{}", ev["args"]);
        assert_eq!(ev["result"], nested(limit));
        // A lone surrogate escape is text; a valid pair is JSON.
        let ev = with(r#"{"a":"\ud800"}"#, r#"{"a":"\ud83d\ude00"}"#);
        assert_eq!(ev["args"], r#"{"a":"\ud800"}"#);
        assert_eq!(ev["result"]["a"], "\u{1f600}");
        // A lower configured limit is followed too.
        let shallow = Mapper {
            max_nesting: 3,
            ..Mapper::default()
        };
        let mut out = Vec::new();
        shallow.map(
            &request(vec![], vec![capturing(&nested(3), "ok")]),
            &mut out,
        );
        let limits = ParseLimits {
            max_nesting: 3,
            ..ParseLimits::default()
        };
        parse_event(&out[0].json, &limits).expect("within the configured nesting");
    }

    #[test]
    fn an_empty_message_is_not_an_export() {
        for enc in [Encoding::OtlpProto, Encoding::OtlpJson] {
            let e = decode(b"", enc).unwrap_err();
            assert!(matches!(e, OtlpError::Empty), "{e}");
            assert_eq!(e.reason(), "invalid_otlp");
        }
    }

    /// Writes the OTLP fuzz targets' seed corpus (`fuzz/corpus/otlp_*`): exports of the
    /// span shapes the mapper reads, in both encodings. Run once by hand; the fuzzer
    /// grows the corpus from there (`scripts/fuzz`).
    #[test]
    #[ignore = "writes fuzz seeds: cargo test --lib write_otlp_fuzz_seeds -- --ignored"]
    fn write_otlp_fuzz_seeds() {
        use prost::Message as _;
        let agent = span(
            9,
            None,
            900,
            vec![
                s(attr::GEN_AI_OPERATION_NAME, "invoke_agent"),
                s(attr::GEN_AI_CONVERSATION_ID, "conv-1"),
            ],
        );
        let mut failing = tool(3, Some(9), 3_000);
        failing.status = Some(Status {
            code: 2,
            message: "exit 1".into(),
        });
        let requests = [
            request(vec![], vec![chat(1, None, 1_000), tool(2, None, 2_000)]),
            request(
                vec![s("service.name", "agent")],
                vec![agent, chat(1, Some(9), 1_000), failing],
            ),
            request(
                vec![],
                vec![openinference_llm(4, None), openinference_tool(5, Some(4))],
            ),
            request(
                vec![],
                vec![span(6, None, 10, vec![s("http.method", "GET")])],
            ),
        ];
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
        for (n, req) in requests.iter().enumerate() {
            for (dir, bytes) in [
                ("otlp_proto", req.encode_to_vec()),
                ("otlp_json", serde_json::to_vec(req).unwrap()),
                (
                    "otlp_json",
                    serde_json::to_vec(&req.resource_spans).unwrap(),
                ),
            ] {
                let dir = root.join(dir);
                std::fs::create_dir_all(&dir).unwrap();
                let name = format!("seed-{n}-{}", bytes.len());
                std::fs::write(dir.join(name), &bytes).unwrap();
            }
        }
    }
}

//! What a span gives an event: its fields read from the span's attributes and events
//! (model, tokens, cost, tool name, arguments, result, text; in the GenAI, OpenInference
//! and LangChain shapes), written as the event's JSON object without building a tree.

use super::*;

/// An event's JSON object written as it is built (no tree, no map): its fields in the
/// order they are added, strings escaped as serde_json escapes them.
pub(super) struct Obj {
    pub(super) buf: Vec<u8>,
}

impl Obj {
    pub(super) fn new() -> Obj {
        Obj {
            buf: Vec::with_capacity(256),
        }
    }

    pub(super) fn key(&mut self, key: &str) {
        self.buf.push(if self.buf.is_empty() { b'{' } else { b',' });
        self.put(&key);
        self.buf.push(b':');
    }

    pub(super) fn put<T: serde::Serialize + ?Sized>(&mut self, value: &T) {
        serde_json::to_writer(&mut self.buf, value).expect("strings and numbers serialize");
    }

    pub(super) fn str(&mut self, key: &str, value: &str) -> &mut Obj {
        self.key(key);
        self.put(value);
        self
    }

    pub(super) fn num<T: serde::Serialize>(&mut self, key: &str, value: T) -> &mut Obj {
        self.key(key);
        self.put(&value);
        self
    }

    /// A captured value: as it is when it is a JSON object or array (arguments and
    /// results usually are) the event parser reads within its nesting limit, as a string
    /// otherwise.
    pub(super) fn json_or_text(&mut self, key: &str, text: &str, max_nesting: usize) -> &mut Obj {
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

    pub(super) fn finish(mut self) -> Vec<u8> {
        self.buf.push(b'}');
        self.buf
    }
}

/// Whether a text is one JSON value, nested at most `max_nesting` deep, that the event
/// parser reads: its fast scanner, or where that gives up (surrogate escapes, …)
/// serde_json into a value, as the parser's slow path does (which refuses lone
/// surrogates).
pub(super) fn is_json(text: &str, max_nesting: usize) -> bool {
    let mut sc = crate::contract::json::Scanner::new(text.as_bytes(), max_nesting);
    if sc.value().is_ok() {
        sc.ws();
        if sc.at_end() {
            return true;
        }
    }
    crate::contract::event::nesting_within(text.as_bytes(), max_nesting)
        && serde_json::from_str::<serde_json::Value>(text).is_ok()
}

/// The `session.completed` fields of a root agent span.
pub(super) fn completion_fields() -> Obj {
    let mut m = Obj::new();
    m.str("type", "session.completed");
    m
}

/// The `cost.attributed` fields of an LLM span, and what it lacks. Without token counts
/// (an instrumentation that lost them: OpenInference's flattened history past the SDK's
/// attribute limit) the call is still a step, its tokens counted as 0: dropping it would
/// leave a loop's turns uncounted and its grace never elapsing.
pub(super) fn llm_fields(span: &Span) -> (Obj, Vec<Missing>) {
    let a = &span.attributes[..];
    let mut lacking = Vec::new();
    let first = |keys: &[&str]| keys.iter().find_map(|k| count(a, k));
    let input = first(&[
        attr::GEN_AI_USAGE_INPUT_TOKENS,
        attr::GEN_AI_USAGE_PROMPT_TOKENS,
        attr::LLM_TOKEN_COUNT_PROMPT,
    ]);
    let output = first(&[
        attr::GEN_AI_USAGE_OUTPUT_TOKENS,
        attr::GEN_AI_USAGE_COMPLETION_TOKENS,
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
pub(super) fn choice_message(message: &str) -> (String, u32) {
    pub(super) fn blocks(v: &serde_json::Value, text: &mut String, calls: &mut u32) {
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
pub(super) fn output_messages(messages: &str) -> Option<(String, u32)> {
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
pub(super) fn openinference_output(a: &[KeyValue]) -> Option<(String, u32)> {
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

/// The `tool.called` fields of a tool span, and whether its content was captured; why
/// it gives no event where it does not (no tool name; Google ADK's span over calls made
/// together, no call of its own).
pub(super) fn tool_fields(span: &Span, max_nesting: usize) -> Result<(Obj, bool), Skipped> {
    let a = &span.attributes[..];
    let tool = [attr::GEN_AI_TOOL_NAME, attr::TOOL_NAME]
        .into_iter()
        .find_map(|k| string(a, k).filter(|s| !s.is_empty()))
        .ok_or(Skipped::NoToolName)?;
    if tool == ADK_MERGED_TOOLS {
        return Err(Skipped::NotAgentStep);
    }
    let mut m = Obj::new();
    m.str("type", "tool.called").str("tool", tool);
    // Arguments and result as attributes (GenAI, OpenInference, Google ADK's own), else
    // as the span events Strands writes by default (`gen_ai.tool.message`,
    // `gen_ai.choice`). ADK's placeholders are read as not captured, or every call would
    // look like every other: "{}" for both where content capture is off (a tool's own
    // empty response beside real arguments is read), and a response
    // `{"result": "<not specified>"}` where the tool raised (then what it raised answers).
    let args = string(a, attr::GEN_AI_TOOL_CALL_ARGUMENTS).or_else(|| string(a, attr::INPUT_VALUE));
    let result = string(a, attr::GEN_AI_TOOL_CALL_RESULT).or_else(|| string(a, attr::OUTPUT_VALUE));
    let (adk_args, adk_response) = match (args, result) {
        (Some(_), Some(_)) => (None, None),
        _ => adk_tool_content(a),
    };
    let args = args
        .or(adk_args)
        .or_else(|| event_string(span, event::GEN_AI_TOOL_MESSAGE, event::CONTENT));
    let failed = span
        .status
        .as_ref()
        .is_some_and(|s| s.code == StatusCode::Error as i32);
    let result = result
        .or(adk_response)
        .or_else(|| event_string(span, event::GEN_AI_CHOICE, event::MESSAGE));
    // LangChain's tool spans may carry its callback handler's whole records (the run's
    // step and checkpoint ids, the call's id: new on every call) and the whole
    // `ToolMessage`: the arguments are the call's inputs, the result is the message's
    // content, and its status says whether the call failed.
    let (result, tool_message_failed) = match result.map(langchain_tool_message) {
        Some((r, failed)) => (Some(r), failed),
        None => (None, false),
    };
    // A tool that raised has no result: what it raised is its answer (the exception
    // OpenTelemetry records on the span, its type and message; not its stack trace,
    // whose lines and addresses differ from build to build). Only where the arguments
    // were captured: instrumentations record exceptions whatever their content setting,
    // and calls whose arguments are unknown cannot be told apart as attempts.
    let result = result.or_else(|| (failed && args.is_some()).then(|| raised(span)).flatten());
    let args = args.map(langchain_tool_input);
    let captured = args.is_some() && result.is_some();
    // Arguments and results are there only with content capture on. Without them two
    // calls cannot be told alike, so each is its own: arguments that name the span, and
    // the span id as the result's digest (a result that cannot be read, judged as one that
    // says something). Content detectors then never fire on it; counts, ceilings and
    // error streaks still judge it.
    let span_id = hex(&span.span_id);
    match args {
        Some(args) => m.json_or_text("args", &args, max_nesting),
        None => {
            m.key("args");
            m.put(&json!({ UNCAPTURED: span_id }));
            &mut m
        }
    };
    match result {
        Some(result) => m.json_or_text("result", &result, max_nesting),
        None => m.str("result_digest", &span_id),
    };
    let call_id = string(a, attr::GEN_AI_TOOL_CALL_ID).or_else(|| string(a, attr::TOOL_CALL_ID));
    if let Some(id) = call_id {
        m.str("call_id", id);
    }
    let error_type = string(a, attr::ERROR_TYPE);
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
    Ok((m, captured))
}

/// The tool name of Google ADK's span over tool calls made together
/// (`trace_merged_tool_calls`), each of which has its own span: no call.
pub(super) const ADK_MERGED_TOOLS: &str = "(merged tools)";

/// A tool call's arguments and response in Google ADK's own attributes (its schema 1),
/// but for its placeholders.
fn adk_tool_content(a: &[KeyValue]) -> (Option<&str>, Option<&str>) {
    let args = string(a, attr::GCP_VERTEX_AGENT_TOOL_CALL_ARGS);
    let response = string(a, attr::GCP_VERTEX_AGENT_TOOL_RESPONSE);
    let uncaptured =
        args.is_none_or(|r| r.trim() == "{}") && response.is_some_and(|r| r.trim() == "{}");
    if uncaptured {
        return (None, None);
    }
    (args, response.filter(|r| !adk_raised(r)))
}

/// Google ADK's tool response where the tool raised: `{"result": "<not specified>"}`.
fn adk_raised(response: &str) -> bool {
    match serde_json::from_str::<serde_json::Value>(response) {
        Ok(serde_json::Value::Object(m)) => {
            m.len() == 1
                && m.get("result").and_then(serde_json::Value::as_str) == Some("<not specified>")
        }
        _ => false,
    }
}

/// What a failed span raised, from its last `exception` event: `type: message`. Not
/// an exception without a message (a cancellation, a bare timeout): a failure that says
/// nothing tells no two causes apart.
fn raised(span: &Span) -> Option<std::borrow::Cow<'_, str>> {
    let e = span
        .events
        .iter()
        .rev()
        .find(|e| e.name == event::EXCEPTION)?;
    let message =
        string(&e.attributes, attr::EXCEPTION_MESSAGE).filter(|m| !m.trim().is_empty())?;
    Some(match string(&e.attributes, attr::EXCEPTION_TYPE) {
        Some(kind) => std::borrow::Cow::Owned(format!("{kind}: {message}")),
        None => std::borrow::Cow::Borrowed(message),
    })
}

/// The keys of the records LangChain's callback handler gets for a tool call's start
/// and end, which OpenLLMetry's LangChain instrumentation writes whole as the call's
/// `gen_ai.tool.call.arguments` and `gen_ai.tool.call.result`.
const LANGCHAIN_TOOL_START: &[&str] = &["input_str", "tags", "metadata", "inputs", "kwargs"];
const LANGCHAIN_TOOL_END: &[&str] = &["output", "kwargs"];

/// `text` as one of LangChain's callback records: an object of exactly `keys` (the
/// handler writes them all, `null` where it has no value), the `quoted` key among them.
fn langchain_record(
    text: &str,
    keys: &[&str],
    quoted: &str,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    let t = text.trim_ascii_start();
    if !(t.starts_with('{') && t.contains(quoted)) {
        return None;
    }
    match serde_json::from_str::<serde_json::Value>(t) {
        Ok(serde_json::Value::Object(o))
            if o.len() == keys.len() && o.keys().all(|k| keys.contains(&k.as_str())) =>
        {
            Some(o)
        }
        _ => None,
    }
}

/// A tool call's arguments as the call was made: where the span carries LangChain's whole
/// `on_tool_start` record, its `inputs` (the arguments the model asked for), else its
/// `input_str`. Anything else is the arguments as they are.
pub(super) fn langchain_tool_input(args: &str) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    let Some(mut record) = langchain_record(args, LANGCHAIN_TOOL_START, "\"input_str\"") else {
        return Cow::Borrowed(args);
    };
    match (record.remove("inputs"), record.remove("input_str")) {
        (Some(inputs @ serde_json::Value::Object(_)), _) => Cow::Owned(inputs.to_string()),
        (_, Some(serde_json::Value::String(input))) => Cow::Owned(input),
        _ => Cow::Borrowed(args),
    }
}

/// A LangChain `ToolMessage`'s content, and whether its status is `error`: as its
/// OpenInference span writes it (`{"type": "tool", "data": {…}}`) or as LangChain
/// serializes it (`{"lc": 1, "type": "constructor", "id": […, "ToolMessage"], "kwargs":
/// {…}}`); `None` for anything else.
fn tool_message_content(
    message: &mut serde_json::Map<String, serde_json::Value>,
) -> Option<(String, bool)> {
    let fields = match message.get("type").and_then(|v| v.as_str()) {
        Some("tool") => "data",
        Some("constructor")
            if (message.get("id").and_then(|v| v.as_array()))
                .and_then(|id| id.last())
                .and_then(|v| v.as_str())
                == Some("ToolMessage") =>
        {
            "kwargs"
        }
        _ => return None,
    };
    // Taken only once it is a message with content: anything else stays whole.
    let fields = message.get_mut(fields)?.as_object_mut()?;
    let content = fields.remove("content")?;
    let failed = fields.get("status").and_then(|v| v.as_str()) == Some("error");
    match content {
        serde_json::Value::String(c) => Some((c, failed)),
        other => Some((other.to_string(), failed)),
    }
}

/// A tool call's result as the tool gave it: a LangChain `ToolMessage`
/// ([`tool_message_content`]) is its content and says whether the call failed, within
/// LangChain's whole `on_tool_end` record (its `output`) or not. Anything else is the
/// result as it is.
pub(super) fn langchain_tool_message(result: &str) -> (std::borrow::Cow<'_, str>, bool) {
    use std::borrow::Cow;
    if let Some(mut record) = langchain_record(result, LANGCHAIN_TOOL_END, "\"output\"") {
        // A record holds all its keys: `output` is there.
        return match record.remove("output").unwrap_or_default() {
            serde_json::Value::Object(mut output) => match tool_message_content(&mut output) {
                Some((content, failed)) => (Cow::Owned(content), failed),
                None => (
                    Cow::Owned(serde_json::Value::Object(output).to_string()),
                    false,
                ),
            },
            serde_json::Value::String(output) => (Cow::Owned(output), false),
            other => (Cow::Owned(other.to_string()), false),
        };
    }
    let t = result.trim_ascii_start();
    if !(t.starts_with('{') && t.contains("\"tool_call_id\"")) {
        return (Cow::Borrowed(result), false);
    }
    let Ok(serde_json::Value::Object(mut o)) = serde_json::from_str::<serde_json::Value>(t) else {
        return (Cow::Borrowed(result), false);
    };
    match tool_message_content(&mut o) {
        Some((content, failed)) => (Cow::Owned(content), failed),
        None => (Cow::Borrowed(result), false),
    }
}

/// What turns the missing capture on for an instrumentation scope (the README's table).
pub(super) fn capture_setting(scope: &str, missing: Missing) -> &'static str {
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
        Missing::Content if scope.contains("autogen") => {
            "none: AutoGen's own tool spans carry no arguments or results whatever the setting, so its tool calls are counted and timed, never compared; an instrumentation of its model client (OpenInference's OpenAI) adds its model calls and their text"
        }
        Missing::Content if scope.contains("gcp.vertex.agent") => {
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY (Google ADK 2: `true` puts the content on log records, not on spans), or ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS unset (its telemetry schema 1)"
        }
        Missing::Content if scope.contains("strands") => {
            "Strands' default telemetry (its span events carry the content), or OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental"
        }
        Missing::Content => "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true (OpenTelemetry's GenAI instrumentations)",
    }
}

/// An attribute of the span, else of the last of its events that carries it.
pub(super) fn span_string<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    string(&span.attributes, key).or_else(|| {
        span.events
            .iter()
            .rev()
            .find_map(|e| string(&e.attributes, key))
    })
}

/// An attribute of the span's last event named `name` that carries it.
pub(super) fn event_string<'a>(span: &'a Span, name: &str, key: &str) -> Option<&'a str> {
    span.events
        .iter()
        .rev()
        .filter(|e| e.name == name)
        .find_map(|e| string(&e.attributes, key))
}

/// The argument naming a call whose arguments were not captured.
pub const UNCAPTURED: &str = "uncaptured_call";

pub(super) fn value<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attrs
        .iter()
        .rev() // the last of repeated keys wins, as in a map
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

pub(super) fn string<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match value(attrs, key)? {
        Value::StringValue(s) => Some(s),
        _ => None,
    }
}

/// A non-negative whole count (token counts arrive as ints, sometimes as doubles or
/// strings).
pub(super) fn count(attrs: &[KeyValue], key: &str) -> Option<u64> {
    match value(attrs, key)? {
        Value::IntValue(n) => u64::try_from(*n).ok(),
        Value::DoubleValue(d) if *d >= 0.0 && d.fract() == 0.0 && *d < 1e18 => Some(*d as u64),
        Value::StringValue(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(super) fn number(attrs: &[KeyValue], key: &str) -> Option<f64> {
    match value(attrs, key)? {
        Value::IntValue(n) => Some(*n as f64),
        Value::DoubleValue(d) => Some(*d),
        Value::StringValue(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(super) fn strings<'a>(attrs: &'a [KeyValue], key: &str) -> Vec<&'a str> {
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

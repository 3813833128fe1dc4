//! The OTLP mapping's unit tests: spans of each convention and framework shape, read as events.

use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status};

use super::*;
use crate::config::Config;
use crate::contract::event::{parse_event, ParseLimits};

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
    mapper: &mut Mapper,
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
    let (ev, report) = events(&mut Mapper::default(), &req);
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
fn token_counts_under_the_names_before_v1_27_are_read() {
    // Instrumentations of that time send `gen_ai.usage.prompt_tokens` and
    // `completion_tokens`; where a span carries both names, the current one wins.
    let renamed = |sp: &mut Span| {
        for kv in &mut sp.attributes {
            kv.key = match kv.key.as_str() {
                attr::GEN_AI_USAGE_INPUT_TOKENS => attr::GEN_AI_USAGE_PROMPT_TOKENS.into(),
                attr::GEN_AI_USAGE_OUTPUT_TOKENS => attr::GEN_AI_USAGE_COMPLETION_TOKENS.into(),
                _ => continue,
            };
        }
    };
    let mut old = chat(1, None, 1_000);
    renamed(&mut old);
    let mut both = chat(2, None, 2_000);
    renamed(&mut both);
    both.attributes.push(i(attr::GEN_AI_USAGE_INPUT_TOKENS, 7));
    both.attributes.push(i(attr::GEN_AI_USAGE_OUTPUT_TOKENS, 3));
    let (ev, report) = events(&mut Mapper::default(), &request(vec![], vec![old, both]));
    let tokens = |e: &serde_json::Value| (e["input_tokens"].as_u64(), e["output_tokens"].as_u64());
    assert_eq!(tokens(&ev[0]), (Some(1200), Some(80)));
    assert_eq!(tokens(&ev[1]), (Some(7), Some(3)));
    assert!(report.uncaptured.is_empty(), "{:?}", report.uncaptured);
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
    let (ev, report) = events(&mut Mapper::default(), &req);
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
    // Per instrumentation, where its setting differs or none exists.
    for (scope, says) in [
        ("gcp.vertex.agent", "=SPAN_ONLY"),
        ("autogen-core", "never compared"),
        (
            "openinference.instrumentation.langchain",
            "OPENINFERENCE_HIDE_OUTPUTS",
        ),
    ] {
        let setting = capture_setting(scope, Missing::Content);
        assert!(setting.contains(says), "{scope}: {setting}");
    }
    // A service named at any length is kept as a label is (it becomes a metric label, a
    // log line and an entry of the ingest's set of what it has said).
    let mut req = req;
    let long = "billing-".repeat(125);
    req.resource_spans[0].resource.as_mut().unwrap().attributes =
        vec![s(attr::SERVICE_NAME, &long)];
    let (_, report) = events(&mut Mapper::default(), &req);
    let services: Vec<&str> = report.uncaptured.iter().map(|u| &*u.service).collect();
    let kept = crate::engine::state::kept_label(&long);
    assert_eq!(services, [&*kept, &*kept]);
    assert!(kept.len() <= crate::engine::state::MAX_LABEL);
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
        &mut Mapper::default(),
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
        &mut Mapper::default(),
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

/// A GenAI `run_tests` tool span (no session named: the trace's), with `args` and, when
/// given, `result`.
fn run_tests(id: u8, args: &str, result: Option<&str>) -> Span {
    let mut attributes = vec![
        s(attr::GEN_AI_OPERATION_NAME, "execute_tool"),
        s(attr::GEN_AI_TOOL_NAME, "run_tests"),
        s(attr::GEN_AI_TOOL_CALL_ARGUMENTS, args),
    ];
    if let Some(result) = result {
        attributes.push(s(attr::GEN_AI_TOOL_CALL_RESULT, result));
    }
    span(id, None, 1_000 + u64::from(id), attributes)
}

/// OpenLLMetry's LangChain instrumentation writes LangChain's whole callback records as
/// a tool call's arguments and result (as its 0.62 wrote them for a LangGraph agent): the
/// graph's step and checkpoint ids and the call's id are new on every call, so two calls
/// alike are told alike only by the inputs and the `ToolMessage`'s content.
#[test]
fn langchains_callback_records_are_the_calls_inputs_and_output() {
    let call = |id: u8, step: u32, status: &str| {
        let args = json!({
            "input_str": "{'path': 'tests/'}", "tags": ["seq:step:1"],
            "metadata": {"thread_id": "thread-7", "langgraph_step": step, "langgraph_node": "tools",
                         "langgraph_checkpoint_ns": format!("tools:5796b8b6-dfaa-13c0-da39-c1cacc8bb8{id:02x}")},
            "inputs": {"path": "tests/"},
            "kwargs": {"color": "green", "name": null, "tool_call_id": format!("call_{id}")},
        });
        let result = json!({
            "output": {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "ToolMessage"],
                       "kwargs": {"content": "FAILED test_x", "type": "tool", "name": "run_tests",
                                  "tool_call_id": format!("call_{id}"), "status": status}},
            "kwargs": {"tags": ["seq:step:1"], "color": "green", "name": "run_tests"},
        });
        run_tests(id, &args.to_string(), Some(&result.to_string()))
    };
    let (ev, report) = events(
        &mut Mapper::default(),
        &request(vec![], vec![call(1, 2, "success"), call(2, 4, "error")]),
    );
    assert!(report.uncaptured.is_empty(), "{:?}", report.uncaptured);
    for e in &ev {
        assert_eq!(
            (&e["args"], &e["result"]),
            (&json!({"path": "tests/"}), &json!("FAILED test_x"))
        );
    }
    assert!(ev[0].get("is_error").is_none());
    assert_eq!(ev[1]["is_error"], true);
    // Without `inputs` (a tool given a string), the input as given; an output that is no
    // message, as it is; anything else that merely shares a key, untouched.
    let record =
        r#"{"input_str": "tests/", "inputs": null, "tags": [], "metadata": {}, "kwargs": {}}"#;
    assert_eq!(langchain_tool_input(record), "tests/");
    assert_eq!(
        langchain_tool_message(r#"{"output": "3 passed", "kwargs": {}}"#).0,
        "3 passed"
    );
    assert_eq!(
        langchain_tool_message(r#"{"output": {"passed": 3}, "kwargs": {}}"#).0,
        r#"{"passed":3}"#
    );
    // A tool's own arguments or result that merely share some of the keys: as they are.
    for own in [
        r#"{"input_str": "a", "path": "b"}"#,
        r#"{"inputs": {"p": 1}}"#,
        r#"{"input_str": "a", "tags": ["x"]}"#,
    ] {
        assert_eq!(langchain_tool_input(own), own);
    }
    for own in [r#"{"output": "x", "exit_code": 0}"#, r#"{"output": "x"}"#] {
        assert_eq!(langchain_tool_message(own).0, own);
    }
    // An output that looks like a message but holds no content: whole, not cut.
    let running = r#"{"output": {"type": "tool", "data": {"status": "running"}}, "kwargs": {}}"#;
    assert_eq!(
        langchain_tool_message(running).0,
        r#"{"data":{"status":"running"},"type":"tool"}"#
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
    let (ev, report) = events(&mut Mapper::default(), &req);
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
        let (ev, report) = events(&mut Mapper::default(), &req);
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
            kv.key != attr::GEN_AI_TOOL_CALL_ARGUMENTS && kv.key != attr::GEN_AI_TOOL_CALL_RESULT
        });
        sp
    };
    let (ev, _) = events(
        &mut Mapper::default(),
        &request(vec![], (1..=8).map(bare).collect()),
    );
    assert_eq!(ev[0]["args"], json!({UNCAPTURED: "0101010101010101"}));
    assert_eq!(ev[0]["result_digest"], "0101010101010101");
    // Eight calls of one tool whose arguments and results are unknown: no loop found;
    // the same eight calls with their (identical) content captured are one.
    assert_eq!(findings(&ev), 0);
    let captured = (1..=8).map(|i| tool(i, None, 1_000 + i as u64)).collect();
    let (ev, _) = events(&mut Mapper::default(), &request(vec![], captured));
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
    let (ev, _) = events(
        &mut Mapper::default(),
        &request(vec![], vec![failed, typed]),
    );
    assert_eq!(ev[0]["is_error"], true);
    assert!(ev[0].get("error_kind").is_none());
    assert_eq!(
        (ev[1]["is_error"].clone(), ev[1]["error_kind"].clone()),
        (json!(true), json!("timeout"))
    );
}

/// A tool that raised has no result: what it raised, as OpenTelemetry records it on the
/// span (the `exception` event), is its answer, so the same failure twice reads alike;
/// the stack trace (its lines differ from build to build) is not part of it.
#[test]
fn a_tool_that_raised_answered_with_what_it_raised() {
    let raising = |id: u8, trace: &str| {
        let mut sp = run_tests(id, r#"{"path": "tests/"}"#, None);
        sp.status = Some(Status {
            code: StatusCode::Error as i32,
            message: "no such directory".into(),
        });
        with_events(
            sp,
            &[(
                event::EXCEPTION,
                vec![
                    s(attr::EXCEPTION_TYPE, "ValueError"),
                    s(
                        attr::EXCEPTION_MESSAGE,
                        "no such directory: tests/ (errno 2)",
                    ),
                    s("exception.stacktrace", trace),
                ],
            )],
        )
    };
    let mut silent = raising(3, "");
    silent.events.clear();
    // Raised without words (a cancellation): no more than no event.
    let mut bare = raising(4, "");
    bare.events[0]
        .attributes
        .retain(|kv| kv.key != attr::EXCEPTION_MESSAGE);
    // Without content capture: arguments unknown, so what it raised is not read either.
    let mut blind = raising(5, "line 1099");
    blind
        .attributes
        .retain(|kv| kv.key != attr::GEN_AI_TOOL_CALL_ARGUMENTS);
    let req = request(
        vec![],
        vec![
            raising(1, "line 1099"),
            raising(2, "line 1101"),
            silent,
            bare,
            blind,
        ],
    );
    let (ev, report) = events(&mut Mapper::default(), &req);
    for e in &ev[..2] {
        assert_eq!(
            (&e["result"], &e["is_error"]),
            (
                &json!("ValueError: no such directory: tests/ (errno 2)"),
                &json!(true)
            )
        );
    }
    // Raised without saying what: a failure of its own, as before.
    assert_eq!(ev[2]["result_digest"], "0303030303030303");
    assert_eq!(ev[3]["result_digest"], "0404040404040404");
    assert_eq!(ev[4]["result_digest"], "0505050505050505");
    assert!(ev[2..].iter().all(|e| e["is_error"] == true));
    let uncaptured: u64 = report.uncaptured.iter().map(|u| u.spans).sum();
    assert_eq!(uncaptured, 3, "{:?}", report.uncaptured);
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
        &mut Mapper::default(),
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
    let (ev, _) = events(&mut Mapper::default(), &request(vec![], vec![step, sub]));
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
    let mut mapper = Mapper {
        session_attribute: Some("app.thread".into()),
        ..Mapper::default()
    };
    let (ev, _) = events(&mut mapper, &request(vec![], spans.clone()));
    let sessions: Vec<&str> = ev
        .iter()
        .map(|e| e["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        sessions,
        ["oi-session", "thread-9", "07070707070707070707070707070707"]
    );
    let (ev, _) = events(
        &mut Mapper::default(),
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
    let (ev, _) = events(&mut Mapper::default(), &request(vec![], vec![llm, tool]));
    assert_eq!(ev[0]["input_tokens"], 300);
    assert_eq!(ev[0]["cost_usd"], 0.002);
    assert_eq!(ev[0]["text"], "Checking the file.");
    assert_eq!(ev[0]["tool_calls"], 2);
    assert_eq!(ev[1]["tool"], "read");
    assert_eq!(ev[1]["args"], json!({"p": 1}));
}

mod robustness;

#[test]
fn a_span_without_its_end_is_dated_by_its_start_never_1970() {
    // OTLP JSON without `endTimeUnixNano` reads as an end of 0.
    let mut unended = chat(1, None, 1_700_000_000_000);
    unended.end_time_unix_nano = 0;
    let mut timeless = tool(2, None, 1_700_000_000_000);
    timeless.end_time_unix_nano = 0;
    timeless.start_time_unix_nano = 0;
    let later = chat(3, None, 1_700_000_001_000);
    let req = request(vec![], vec![timeless, later, unended]);
    let (ev, _) = events(&mut Mapper::default(), &req);
    let ids: Vec<_> = ev.iter().map(|e| e["event_id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        ["0101010101010101", "0303030303030303", "0202020202020202"],
        "in the order they happened, the span with no time last"
    );
    // The start (5 ms before the end the helper gives).
    assert_eq!(ev[0]["timestamp"], "2023-11-14T22:13:19.995Z");
    assert_eq!(ev[1]["timestamp"], "2023-11-14T22:13:21.000Z");
    // No time at all: the message's time stands in, as for any event without one.
    assert!(ev[2].get("timestamp").is_none(), "{}", ev[2]);
}

/// A step of agent `agent` under `parent`, naming `session` or none: a chat, or a tool
/// call without a session (as Google ADK writes them).
fn step(id: u8, parent: u8, kind: &str, agent: &str, session: Option<&str>) -> Span {
    let mut sp = if kind == "chat" {
        chat(id, Some(parent), 1_000 + id as u64)
    } else {
        tool(id, Some(parent), 1_000 + id as u64)
    };
    sp.attributes
        .retain(|kv| kv.key != attr::GEN_AI_CONVERSATION_ID);
    sp.attributes.push(s(attr::GEN_AI_AGENT_NAME, agent));
    if let Some(session) = session {
        sp.attributes.push(s(attr::GEN_AI_CONVERSATION_ID, session));
    }
    sp
}

/// A span of no kind the mapping reads under `parent` (a framework's own), naming
/// `session` or none.
fn internal(id: u8, parent: u8, session: Option<&str>) -> Span {
    let mut sp = span(id, Some(parent), 1_000 + id as u64, vec![]);
    sp.name = "call_llm".into();
    if let Some(session) = session {
        sp.attributes.push(s(attr::GEN_AI_CONVERSATION_ID, session));
    }
    sp
}

/// An agent's span `id` under `parent`, naming `session` or none.
fn agent_run(id: u8, parent: u8, agent: &str, session: Option<&str>) -> Span {
    let mut attributes = vec![
        s(attr::GEN_AI_OPERATION_NAME, "invoke_agent"),
        s(attr::GEN_AI_AGENT_NAME, agent),
    ];
    if let Some(session) = session {
        attributes.push(s(attr::GEN_AI_CONVERSATION_ID, session));
    }
    span(id, Some(parent), 1_000 + id as u64, attributes)
}

/// Each group of spans as an export, in turn, through one mapper: the sessions of the
/// events, in order.
fn sessions_by_export(mapper: &mut Mapper, exports: Vec<Vec<Span>>) -> Vec<String> {
    exports
        .into_iter()
        .flat_map(|spans| events(mapper, &request(vec![], spans)).0)
        .map(|e| e["session_id"].as_str().unwrap().to_string())
        .collect()
}

/// Each span as an export of its own.
fn sessions_one_export_each(mapper: &mut Mapper, spans: Vec<Span>) -> Vec<String> {
    sessions_by_export(mapper, spans.into_iter().map(|sp| vec![sp]).collect())
}

const TRACE: &str = "07070707070707070707070707070707";

#[test]
fn a_tool_call_exported_alone_is_in_the_session_its_siblings_named() {
    // Google ADK's schema 2: the model call names the conversation, the tool call does
    // not, both under the agent's span (9), which comes after the run.
    let run = || {
        vec![
            step(1, 9, "chat", "coder", Some("adk-1")),
            step(2, 9, "tool", "coder", None),
            step(3, 9, "chat", "coder", Some("adk-1")),
            step(4, 9, "tool", "coder", None),
        ]
    };
    let sessions = sessions_one_export_each(&mut Mapper::default(), run());
    assert_eq!(sessions, ["adk-1"; 4]);
    // Exported together, the same, whatever their order (not first come, first named).
    let mut reversed = run();
    reversed.reverse();
    let (ev, _) = events(&mut Mapper::default(), &request(vec![], reversed));
    assert!(ev.iter().all(|e| e["session_id"] == "adk-1"), "{ev:?}");
    // The tool call alone, nothing read before: its trace, as without the memory.
    let (ev, _) = events(
        &mut Mapper::default(),
        &request(vec![], vec![run().remove(1)]),
    );
    assert_eq!(ev[0]["session_id"], TRACE);
    // Siblings that named two sessions name neither.
    let sessions = sessions_one_export_each(
        &mut Mapper::default(),
        vec![
            step(1, 9, "chat", "coder", Some("a")),
            step(2, 9, "chat", "coder", Some("b")),
            step(3, 9, "tool", "coder", None),
        ],
    );
    assert_eq!(sessions, ["a", "b", TRACE]);
}

#[test]
fn a_model_call_wrapped_in_a_span_of_its_own_names_its_wrappers_siblings() {
    // Google ADK's schema 1: `call_llm` (5, internal) wraps the model call (6), which
    // names the conversation; the tool call (7) is the wrapper's sibling under the agent
    // (9). The wrapper ends after the calls it asked for, so it comes after the first.
    let sessions = sessions_by_export(
        &mut Mapper::default(),
        vec![
            vec![step(6, 5, "chat", "coder", Some("adk-1"))],
            vec![step(7, 9, "tool", "coder", None)],
            vec![internal(5, 9, None)],
            vec![step(8, 9, "tool", "coder", None)],
        ],
    );
    assert_eq!(
        sessions,
        ["adk-1", TRACE, "adk-1"],
        "the first call, before the wrapper was read, takes its trace; not a guess"
    );
    // The wrapper and a sibling in one export: the sibling takes the session whichever
    // comes first.
    for wrapper_first in [true, false] {
        let mut together = vec![step(8, 9, "tool", "coder", None), internal(5, 9, None)];
        if wrapper_first {
            together.reverse();
        }
        let sessions = sessions_by_export(
            &mut Mapper::default(),
            vec![vec![step(6, 5, "chat", "coder", Some("adk-1"))], together],
        );
        assert_eq!(
            sessions,
            ["adk-1", "adk-1"],
            "wrapper first: {wrapper_first}"
        );
    }
    // One level only: what `call_llm` (5) passed on to the span above it (9, another span
    // of no kind the mapping reads) makes no wrapper of that span; a tool call under it
    // is the run's, one under its parent (4) is not.
    let sessions = sessions_by_export(
        &mut Mapper::default(),
        vec![
            vec![step(6, 5, "chat", "coder", Some("adk-1"))],
            vec![internal(5, 9, None)],
            vec![internal(9, 4, None)],
            vec![step(7, 4, "tool", "other", None)],
            vec![step(8, 9, "tool", "coder", None)],
        ],
    );
    assert_eq!(sessions, ["adk-1", TRACE, "adk-1"]);
    // And only a model call's wrapper: ADK's `invocation` span (4, under a request
    // handler's span 3) holds the agent's run (9, naming `adk-1`), not a model call;
    // another model call of the handler's (2, a title for the chat) is not the run's.
    let sessions = sessions_by_export(
        &mut Mapper::default(),
        vec![
            vec![agent_run(9, 4, "coder", Some("adk-1"))],
            vec![internal(4, 3, None)],
            vec![step(2, 3, "chat", "titler", None)],
        ],
    );
    assert_eq!(sessions, [TRACE]);
}

#[test]
fn a_call_that_only_remembers_its_session_names_no_parent_session() {
    // A tool call under an unnamed sub-agent's span (10, under the unnamed agent 9): its
    // siblings named `adk-1`; its parent agent's own session is unknown, and not its
    // trace.
    let sub = |id: u8, parent: u8| agent_run(id, parent, "helper", None);
    let mut mapper = Mapper::default();
    events(
        &mut mapper,
        &request(vec![], vec![step(1, 10, "chat", "helper", Some("adk-1"))]),
    );
    let (ev, _) = events(
        &mut mapper,
        &request(
            vec![],
            vec![step(2, 10, "tool", "helper", None), sub(10, 9), sub(9, 7)],
        ),
    );
    assert_eq!(ev[0]["session_id"], "adk-1");
    assert!(ev[0].get("parent_session_id").is_none(), "{}", ev[0]);
}

/// A Google ADK tool span of its schema 1: its content in ADK's own attributes.
fn adk_tool(id: u8, tool: &str, args: &str, response: &str) -> Span {
    span(
        id,
        None,
        1_000 + id as u64,
        vec![
            s(attr::GEN_AI_OPERATION_NAME, "execute_tool"),
            s(attr::GEN_AI_TOOL_NAME, tool),
            s(attr::GCP_VERTEX_AGENT_TOOL_CALL_ARGS, args),
            s(attr::GCP_VERTEX_AGENT_TOOL_RESPONSE, response),
        ],
    )
}

#[test]
fn google_adks_span_over_calls_made_together_is_not_a_call() {
    let merged = adk_tool(1, "(merged tools)", "N/A", "[]");
    let (ev, report) = events(&mut Mapper::default(), &request(vec![], vec![merged]));
    assert!(ev.is_empty(), "{ev:?}");
    assert_eq!(report.tool_calls, 0);
}

#[test]
fn a_sub_agent_with_a_session_of_its_own_is_not_its_callers() {
    // The caller (agent span 9) names `adk-1`; the helper (agent span 8, under the
    // caller's tool call 4) names `helper-1` on its model calls.
    let sessions = sessions_one_export_each(
        &mut Mapper::default(),
        vec![
            step(1, 9, "chat", "coder", Some("adk-1")),
            // The helper's tool call, before any of its model calls was exported: its
            // trace, not the caller's session.
            step(2, 8, "tool", "helper", None),
            step(3, 8, "chat", "helper", Some("helper-1")),
            step(5, 8, "tool", "helper", None),
            step(4, 9, "tool", "coder", None),
            step(6, 9, "tool", "coder", None),
        ],
    );
    assert_eq!(
        sessions,
        ["adk-1", TRACE, "helper-1", "helper-1", "adk-1", "adk-1"]
    );
    // ADK's schema 1, the helper called on the caller's first turn: nothing named sits
    // under the caller's agent span yet when its tool call (4) comes, whose children (the
    // helper's run, 8) named `helper-1`. The call is not the helper's; the caller's
    // later calls are the caller's, once its wrapped model call (5) is read.
    let sessions = sessions_by_export(
        &mut Mapper::default(),
        vec![
            vec![step(6, 5, "chat", "coder", Some("adk-1"))],
            vec![step(3, 8, "chat", "helper", Some("helper-1"))],
            vec![agent_run(8, 4, "helper", Some("helper-1"))],
            vec![step(4, 9, "tool", "coder", None)],
            vec![internal(5, 9, None)],
            vec![step(7, 9, "tool", "coder", None)],
        ],
    );
    assert_eq!(sessions, ["adk-1", "helper-1", TRACE, "adk-1"]);
    // Two runs of one agent in one trace (an evaluation loop under one span), each its
    // own session: the second run's first tool call is not the first run's.
    let sessions = sessions_one_export_each(
        &mut Mapper::default(),
        vec![
            step(1, 9, "chat", "coder", Some("run-1")),
            step(2, 9, "tool", "coder", None),
            step(3, 8, "tool", "coder", None),
            step(4, 8, "chat", "coder", Some("run-2")),
            step(5, 8, "tool", "coder", None),
        ],
    );
    assert_eq!(sessions, ["run-1", "run-1", TRACE, "run-2", "run-2"]);
}

#[test]
fn the_sessions_remembered_are_bounded() {
    let mut mapper = Mapper {
        seen: seen::SessionsSeen::with_capacity(8),
        ..Mapper::default()
    };
    for t in 1..=200u8 {
        let mut sp = step(1, 9, "chat", "coder", Some(&format!("s-{t}")));
        sp.trace_id = vec![t; 16];
        events(&mut mapper, &request(vec![], vec![sp]));
        assert!(mapper.seen.len() <= 2 * 8, "{}", mapper.seen.len());
    }
    // The latest trace's is still known; the first's is forgotten.
    let ask = |mapper: &mut Mapper, t: u8| {
        let mut sp = step(2, 9, "tool", "coder", None);
        sp.trace_id = vec![t; 16];
        let (ev, _) = events(mapper, &request(vec![], vec![sp]));
        ev[0]["session_id"].as_str().unwrap().to_string()
    };
    assert_eq!(ask(&mut mapper, 200), "s-200");
    assert_eq!(ask(&mut mapper, 1), "01".repeat(16));
}

#[test]
fn google_adks_own_tool_content_is_read_and_its_placeholders_are_not() {
    let adk = |id: u8, args: &str, response: &str| adk_tool(id, "run_tests", args, response);
    // A tool that raised: ADK's response says nothing; what it raised answers.
    let mut raised = adk(
        3,
        r#"{"path": "tests/"}"#,
        r#"{"result": "<not specified>"}"#,
    );
    raised.status = Some(Status {
        code: StatusCode::Error as i32,
        message: "ValueError".into(),
    });
    let raised = with_events(
        raised,
        &[(
            event::EXCEPTION,
            vec![
                s(attr::EXCEPTION_TYPE, "ValueError"),
                s(attr::EXCEPTION_MESSAGE, "no such directory: tests/"),
            ],
        )],
    );
    let (ev, report) = events(
        &mut Mapper::default(),
        &request(
            vec![],
            vec![
                adk(1, r#"{"path": "tests/"}"#, r#"{"result": "1 failed"}"#),
                adk(2, "{}", "{}"),
                raised,
            ],
        ),
    );
    assert_eq!(ev[0]["args"], json!({"path": "tests/"}));
    assert_eq!(ev[0]["result"], json!({"result": "1 failed"}));
    assert_eq!(ev[1]["args"], json!({UNCAPTURED: "0202020202020202"}));
    assert_eq!(ev[1]["result_digest"], "0202020202020202");
    assert_eq!(ev[2]["args"], json!({"path": "tests/"}));
    assert_eq!(ev[2]["result"], "ValueError: no such directory: tests/");
    assert_eq!(report.uncaptured(Missing::Content), 1);
    // A tool's own empty response, beside real arguments: read.
    let (ev, report) = events(
        &mut Mapper::default(),
        &request(vec![], vec![adk(4, r#"{"path": "tests/"}"#, "{}")]),
    );
    assert_eq!(ev[0]["result"], json!({}));
    assert_eq!(report.uncaptured(Missing::Content), 0);
    // Eight calls with capture off: no loop found.
    let off = (1..=8).map(|i| adk(i, "{}", "{}")).collect();
    let (ev, _) = events(&mut Mapper::default(), &request(vec![], off));
    assert_eq!(findings(&ev), 0);
}

#[test]
fn a_chain_of_unnamed_spans_takes_the_nearest_siblings_session_once_each() {
    let with_ids = |mut sp: Span, id: u64, parent: u64| {
        sp.span_id = id.to_be_bytes().to_vec();
        sp.parent_span_id = parent.to_be_bytes().to_vec();
        sp
    };
    let tool_at = |id: u64, parent: u64| with_ids(step(1, 1, "tool", "coder", None), id, parent);
    let mut mapper = Mapper::default();
    // Siblings of the chain's top (under span 1000) named `adk-1`.
    let chat = with_ids(step(1, 1, "chat", "coder", Some("adk-1")), 999, 1000);
    events(&mut mapper, &request(vec![], vec![chat]));
    // 3,000 tool calls, each under the one before, the first under span 1000: each
    // takes `adk-1` (its own siblings named none), resolved once per span.
    let chain: Vec<Span> = (0..3_000u64)
        .map(|k| tool_at(2_000 + k, if k == 0 { 1000 } else { 1_999 + k }))
        .collect();
    let (ev, _) = events(&mut mapper, &request(vec![], chain));
    assert_eq!(ev.len(), 3_000);
    assert!(ev.iter().all(|e| e["session_id"] == "adk-1"));
    // Two spans each other's parent: the walk ends, each in its trace.
    let (ev, _) = events(
        &mut mapper,
        &request(vec![], vec![tool_at(7_001, 7_002), tool_at(7_002, 7_001)]),
    );
    assert!(ev.iter().all(|e| e["session_id"] == TRACE), "{ev:?}");
    // Siblings that named two sessions stop the walk: not the session further up.
    let upper = with_ids(step(1, 1, "chat", "coder", Some("g")), 8_000, 8_100);
    let a = with_ids(step(1, 1, "chat", "coder", Some("a")), 8_001, 8_200);
    let b = with_ids(step(1, 1, "chat", "coder", Some("b")), 8_002, 8_200);
    sessions_by_export(&mut mapper, vec![vec![upper], vec![a, b]]);
    let mut middle = internal(1, 1, None);
    middle = with_ids(middle, 8_200, 8_100);
    let (ev, _) = events(
        &mut mapper,
        &request(vec![], vec![middle, tool_at(8_300, 8_200)]),
    );
    assert_eq!(ev[0]["session_id"], TRACE, "{}", ev[0]);
}

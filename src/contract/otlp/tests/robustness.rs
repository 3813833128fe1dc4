//! The mapping under any input: both encodings, garbage refused, the same bytes every time, deep and looping parent chains, invalid ids, captured values as the parser reads them; and the fuzzers' seeds.

use super::*;

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
    let (ev, _) = events(&mut Mapper::default(), &from_json);
    assert_eq!(
        (
            ev[0]["input_tokens"].as_u64(),
            ev[0]["output_tokens"].as_u64()
        ),
        (Some(12), Some(3))
    );
    assert_eq!(ev[0]["event_id"], "0101010101010101");
    // The times as numbers, which the OTLP specification asks a decoder to take too (a
    // float's whole value included): the same request.
    let numbers = json_text
        .replace(r#""995000000""#, "995000000")
        .replace(r#""1000000000""#, "1.0e9");
    assert_eq!(
        decode(numbers.as_bytes(), Encoding::OtlpJson).unwrap(),
        from_json
    );
    // Not a whole number: refused, with the decoder's own error.
    let fraction = json_text.replace(r#""995000000""#, "995000000.5");
    let e = decode(fraction.as_bytes(), Encoding::OtlpJson).unwrap_err();
    assert!(e.to_string().contains("ExportTraceServiceRequest"), "{e}");
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
    let (ev, report) = events(&mut Mapper::default(), &request(vec![], spans));
    assert_eq!(report.agents, 3_000);
    assert_eq!(ev[0]["agent_id"], "a2999");
    assert_eq!(ev[0]["session_id"], "c2999");
    assert_eq!(ev[0]["depth"], 2_999);
    assert_eq!(ev[0]["parent_session_id"], "c2998");
    // Two agents that are each other's parent: the step still maps, without a depth.
    let looped = vec![agent(1, Some(2)), agent(2, Some(1)), step_below(1)];
    let (ev, _) = events(&mut Mapper::default(), &request(vec![], looped));
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
        &mut Mapper::default(),
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
            kv.key != attr::GEN_AI_TOOL_CALL_ARGUMENTS && kv.key != attr::GEN_AI_TOOL_CALL_RESULT
        });
        t.attributes.push(s(attr::GEN_AI_TOOL_CALL_ARGUMENTS, args));
        t.attributes.push(s(attr::GEN_AI_TOOL_CALL_RESULT, result));
        t
    };
    let with = |args: &str, result: &str| {
        let (ev, _) = events(
            &mut Mapper::default(),
            &request(vec![], vec![capturing(args, result)]),
        );
        ev.into_iter().next().unwrap()
    };
    let limit = crate::contract::event::DEFAULT_MAX_NESTING;
    // Inside the event object, a value may nest one level less than the limit.
    let ev = with(&nested(limit - 1), &nested(limit));
    assert!(ev["args"].is_array(), "{}", ev["args"]);
    assert_eq!(ev["result"], nested(limit));
    // A lone surrogate escape is text; a valid pair is JSON.
    let ev = with(r#"{"a":"\ud800"}"#, r#"{"a":"\ud83d\ude00"}"#);
    assert_eq!(ev["args"], r#"{"a":"\ud800"}"#);
    assert_eq!(ev["result"]["a"], "\u{1f600}");
    // A lower configured limit is followed too.
    let mut shallow = Mapper {
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

//! The fingerprints' unit and property tests: canonical JSON against a tree walk over serde_json's values.

use super::*;
use serde_json::{json, Value};

fn fp() -> Fingerprinter {
    Fingerprinter::default()
}

fn act(f: &Fingerprinter, tool: &str, args: &Value) -> Fp {
    let j = Json::of_value(args);
    f.action(tool, Some(&j), &mut Scratch::default()).digest
}

fn res(f: &Fingerprinter, result: &Value) -> ResultPrint {
    f.result(Some(&Json::of_value(result)), None, &mut Scratch::default())
}

#[test]
fn key_sets_match_whole_keys_only() {
    let set = KeySet::new(&["abc", "ab_dd", "Request-ID"]);
    assert!(set.contains(b"ABC") && set.contains(b"a_b_c") && set.contains(b"abdd"));
    assert!(set.contains(b"request_id") && set.contains(b"requestId"));
    assert!(!set.contains(b"abcd") && !set.contains(b"ab") && !set.contains(b"abd"));
    let long = "k".repeat(70);
    assert!(KeySet::new(&[long.as_str()]).contains(format!("{long}_").as_bytes()));
    assert!(!KeySet::new(&[long.as_str()]).contains(&long.as_bytes()[1..]));
}

proptest::proptest! {
    /// A key is in the set when it equals one of the set's keys once `_` and `-` are
    /// dropped and letters lowercased, whatever its length (a long one included).
    #[test]
    fn key_sets_match_keys_as_normalized(
        // Two letters: keys share prefixes and lengths often.
        set in proptest::collection::vec("[abAB_-]{0,5}|[ab_]{60,70}", 0..8),
        key in "[abAB_-]{0,6}|[ab_-]{60,72}",
    ) {
        let normalized = |k: &str| normalize_key(k.as_bytes()).collect::<Vec<u8>>();
        let expected = set.iter().any(|k| normalized(k) == normalized(&key));
        proptest::prop_assert_eq!(KeySet::new(&set).contains(key.as_bytes()), expected);
    }
}

#[test]
fn shapes_read_a_number_as_any_number_but_keep_the_digits_of_words() {
    let f = Fingerprinter::default();
    let shape = |s: &str| res(&f, &json!(s)).shape;
    assert_eq!(
        shape("/bin/bash: line 406: x"),
        shape("/bin/bash: line 424: x")
    );
    assert_eq!(shape("took 1.25s\n42 passed"), shape("took 0.5s\n7 passed"));
    assert_ne!(shape("dtype float32"), shape("dtype float64"));
    assert_ne!(shape("x86_64"), shape("x86_32"));
    assert_ne!(shape("line 4 ok"), shape("line 4 no"));
}

#[test]
fn key_order_and_layout_do_not_matter() {
    let a = json!({"q": "loop", "page": 1});
    let b = Json::borrowed("{ \"page\" : 1 ,\n \"q\":\"lo\\u006fp\"}");
    assert_eq!(
        act(&fp(), "search", &a),
        fp().action("search", Some(&b), &mut Scratch::default())
            .digest
    );
}

#[test]
fn volatile_arg_keys_are_ignored_at_every_depth_and_any_case() {
    let a = json!({"path": "/a", "Request-Id": "1", "meta": {"traceId": "x", "k": 1}});
    let b = json!({"path": "/a", "request_id": "2", "meta": {"TRACE_ID": "y", "k": 1}});
    assert_eq!(act(&fp(), "read", &a), act(&fp(), "read", &b));
    let c = json!({"path": "/a", "meta": {"k": 2}});
    assert_ne!(act(&fp(), "read", &a), act(&fp(), "read", &c));
}

#[test]
fn tool_name_is_part_of_the_action() {
    let a = json!({"path": "src/main.ts"});
    assert_ne!(act(&fp(), "read_file", &a), act(&fp(), "list_files", &a));
}

#[test]
fn the_action_argument_is_read_for_classes() {
    let j = Json::borrowed(r#"{"action":"po\u006cl","id":1}"#);
    let a = fp().action("process", Some(&j), &mut Scratch::default());
    assert_eq!(a.action_arg.as_deref(), Some("poll"));
    let j = Json::borrowed(r#"{"x":{"action":"poll"}}"#);
    assert_eq!(
        fp().action("process", Some(&j), &mut Scratch::default())
            .action_arg,
        None
    );
}

#[test]
fn result_volatile_keys_and_patterns_are_erased_but_digits_are_not() {
    let f = fp();
    let a = json!({"status": "completed", "durationMs": 100, "cwd": "/tmp/1", "out": "done at 2026-11-18T11:06:40Z id 123e4567-e89b-12d3-a456-426614174000"});
    let b = json!({"status": "completed", "durationMs": 250, "cwd": "/tmp/2", "out": "done at 2026-11-19T01:00:00.5+02:00 id 00000000-0000-0000-0000-0000000000ff"});
    assert_eq!(res(&f, &a).digest, res(&f, &b).digest);
    let p1 = json!({"output": "[build] 35% complete"});
    let p2 = json!({"output": "[build] 60% complete"});
    assert_ne!(res(&f, &p1).digest, res(&f, &p2).digest);
}

#[test]
fn result_keys_are_not_volatile_in_args() {
    // `cwd` is volatile in results only.
    let a = json!({"cwd": "/a", "command": "ls"});
    let b = json!({"cwd": "/b", "command": "ls"});
    assert_ne!(act(&fp(), "exec", &a), act(&fp(), "exec", &b));
}

#[test]
fn pending_reads_status_fields_and_short_strings() {
    let f = fp();
    assert!(res(&f, &json!({"status": "running", "log": "x"})).pending);
    assert!(res(&f, &json!({"output": "{\"status\": \"queued\"}"})).pending);
    assert!(!res(&f, &json!({"status": "completed", "log": "was running"})).pending);
    assert!(!res(&f, &json!("the runningboard")).pending);
    let long = format!("{} running", "x".repeat(300));
    assert!(!res(&f, &json!(long)).pending);
}

#[test]
fn a_status_is_a_field_named_so_or_a_bare_word_and_any_status_pending_is_pending() {
    let f = fp();
    // The key's last word names a status; inside a word it does not.
    for key in [
        "ticketing_status",
        "job-state",
        "DBInstanceStatus",
        "provisioningState",
        "STATUS",
    ] {
        assert!(
            res(&f, &json!({ key: "creating", "note": "done" })).pending,
            "{key}"
        );
        assert!(
            !res(&f, &json!({ key: "available", "note": "running" })).pending,
            "{key}"
        );
    }
    // A lifecycle word in a few words reads only in a status field: so a key is told.
    assert!(res(&f, &json!({"real_estate_status": "creating the listing"})).pending);
    assert!(!res(&f, &json!({"estate": "creating the listing"})).pending);
    // A status that is not the current one does not say the result is waited on.
    assert!(!res(&f, &json!({"state": "FAILED", "desired_state": "RUNNING"})).pending);
    assert!(!res(&f, &json!({"phase": "Failed", "target_phase": "running"})).pending);
    // ECS's `lastStatus` is its task's current status.
    let ecs = json!({"tasks": [{"lastStatus": "PROVISIONING", "desiredStatus": "RUNNING", "healthStatus": "UNKNOWN"}]});
    assert!(res(&f, &ecs).pending);
    assert!(
        !res(
            &f,
            &json!({"Status": "stopped", "PreviousStatus": "pending"})
        )
        .pending
    );
    // An order `confirmed` whose ticketing is pending is still waited on.
    let order = json!({"data": {"status": "confirmed", "ticketing_status": "PENDING_TICKETING"}});
    assert!(res(&f, &order).pending);
    // A lifecycle word as a value alone is a status; in prose it is content (a section's
    // title).
    assert!(res(&f, &json!(["creating", {}])).pending);
    assert!(res(&f, &json!({"rows": [{"s": " Provisioning…"}]})).pending);
    assert!(!res(&f, &json!({"section": "1. Data Processing"})).pending);
    // A prose term reads in any short string (an envelope's text: ADK's `result`, MCP's
    // `content`).
    assert!(res(&f, &json!({"result": "Job 42 is still running"})).pending);
    let mcp = json!({"content": [{"type": "text", "text": "Export still running"}]});
    assert!(res(&f, &mcp).pending);
    assert!(res(&f, &json!("job still running")).pending);
    // Read as a status (a job waited on), or only in prose (a pod table, a test run).
    let status = |v: Value| res(&f, &v).status_pending;
    assert!(status(json!({"status": "RUNNING"})) && status(json!(["creating", {}])));
    assert!(!status(json!("NAME READY STATUS\napi-1 0/1 Running")));
    assert!(!status(json!({"out": "12 passing, 2 pending"})));
    assert!(res(&f, &json!({"out": "12 passing, 2 pending"})).pending);
    // A lifecycle word reads only as a status: a bare value, not a log's line.
    assert!(res(&f, &json!("Creating")).pending);
    assert!(!res(&f, &json!("Table created.\nCreating s0...\ns0 created")).pending);
    // A resource on its way down or through maintenance is waited on too; a container's
    // crash loop and a form's answer are not.
    for state in [
        "stopping",
        "shutting-down",
        "backing-up",
        "RUNNABLE",
        "deleting",
    ] {
        assert!(status(json!({"State": {"Name": state}})), "{state}");
    }
    assert!(!status(json!({"State": {"Name": "stopped"}})));
    assert!(!status(json!({"status": "restarting"})) && !status(json!({"status": "submitted"})));
}

#[test]
fn a_result_key_is_volatile_as_its_last_words_an_action_key_only_whole() {
    let f = fp();
    let child =
        |id: &str| json!({"status": "completed", "subagent_session_id": id, "result": "BLOCKED"});
    assert_eq!(
        res(&f, &child("sess_1")).digest,
        res(&f, &child("sess_2")).digest
    );
    let camel = |id: &str| json!({"childRunId": id, "parentRequestId": id, "out": "x"});
    assert_eq!(res(&f, &camel("a1")).digest, res(&f, &camel("b2")).digest);
    // Not inside a word, and not an action's: a query's `start_ts` is its range.
    let word = |v: &str| json!({"counts": v, "start_times": v});
    assert_ne!(res(&f, &word("1")).digest, res(&f, &word("2")).digest);
    let query = |t: u32| json!({"q": "error", "start_ts": t});
    assert_ne!(act(&f, "logs", &query(1)), act(&f, "logs", &query(2)));
    assert_eq!(
        act(&f, "logs", &json!({"q": "e", "ts": 1})),
        act(&f, "logs", &json!({"q": "e", "ts": 2}))
    );
}

#[test]
fn a_failure_says_it_is_passing_in_words_or_by_its_kind_not_in_a_name() {
    let t =
        |kind: Option<&str>, result: &Value| reads_transient(kind, Some(&Json::of_value(result)));
    let body =
        json!({"error": {"message": "The service is temporarily unavailable. Please retry."}});
    assert!(t(None, &body));
    assert!(t(None, &json!("HTTP 429: Too Many Requests")));
    let plaid = json!({"error_code": "PRODUCT_NOT_READY", "error_message": "the requested product is not yet ready. please provide a webhook or try the request again later"});
    assert!(t(Some("product_not_ready"), &plaid));
    assert!(t(Some("http_503"), &json!("")) && t(Some("Rate-Limited"), &json!("")));
    // An exception's type, as OpenTelemetry's `error.type` names it; gRPC's code.
    for kind in [
        "openai.RateLimitError",
        "ThrottlingException",
        "ServiceUnavailable",
        "TooManyRequestsException",
        "overloaded_error",
        "503 Service Unavailable",
        "UNAVAILABLE",
        "RESOURCE_EXHAUSTED",
    ] {
        assert!(t(Some(kind), &json!("")), "{kind}");
    }
    // A break written as an escape before the phrase.
    assert!(t(None, &json!("HTTP/1.1 503\nService Unavailable")));
    // A timeout of its own, a permanent kind, names and headers are not.
    for (kind, result) in [
        (Some("timeout"), json!("\nEXECUTION TIMED OUT")),
        (Some("tool_unavailable"), json!("no such tool")),
        (Some("unavailable"), json!("seat 12A is taken")),
        (Some("TimeoutError"), json!("")),
        (Some("migrate_error"), json!("failed")),
        (
            None,
            json!("FAILED tests/test_api.py::test_returns_429_when_rate_limited"),
        ),
        (None, json!("./middleware/ratelimit.go:12: undefined: x")),
        (
            None,
            json!("HTTP/2 404\nx-ratelimit-remaining: 59\n\nNot Found"),
        ),
        (None, json!(format!("{}\nrate limit hit", "x".repeat(2000)))),
    ] {
        assert!(!t(kind, &result), "{kind:?} {result}");
    }
}

#[test]
fn a_result_key_ends_with_a_volatile_identifier_and_is_read_in_linear_time() {
    let set = KeySet::new(&["session_id", "ts", "time", "requestId", "latency_ms"]);
    for key in [
        "subagent_session_id",
        "childSessionId",
        "parent-request-id",
        "session_id",
    ] {
        assert!(set.contains_key_or_last_words(key.as_bytes()), "{key}");
    }
    // Measurements are answers: a benchmark's `p99_latency_ms`, a query's `query_time`.
    for key in [
        "p99_latency_ms",
        "query_time",
        "executionTime",
        "start_ts",
        "src/app.ts",
        "sessionidx",
        "a_session",
    ] {
        assert!(!set.contains_key_or_last_words(key.as_bytes()), "{key}");
    }
    // Keys of 800,000 bytes of words, or of separators, are read from their end only.
    let long = "a_".repeat(400_000);
    assert!(!set.contains_key_or_last_words(long.as_bytes()));
    let run = format!("x{}y", "_".repeat(800_000));
    assert!(!set.contains_key_or_last_words(run.as_bytes()));
}

#[test]
fn a_string_holding_json_is_read_as_that_json() {
    let f = fp();
    let text = |v: Value| json!(serde_json::to_string_pretty(&v).unwrap());
    // Its status field is read, its volatile keys dropped, its key order and layout free.
    let job = |req: &str| json!({"status": {"state": "RUNNING"}, "request_id": req, "id": 7});
    let (a, b) = (res(&f, &text(job("r1"))), res(&f, &text(job("r2"))));
    assert!(a.pending && b.pending);
    assert_eq!(a.digest, b.digest);
    assert_eq!(a.digest, res(&f, &json!(job("r3").to_string())).digest);
    assert_eq!(a.digest, res(&f, &job("r4")).digest);
    // Nested in a field (a shell's output), too; and a digit is still a change.
    let shell =
        |s: &str| json!({"output": json!({"state": s, "ts": 1}).to_string(), "exit_code": 0});
    assert!(res(&f, &shell("queued")).pending);
    assert!(!res(&f, &shell("done")).pending);
    let done = |n: u32| text(json!({"status": "DONE", "rows": n}));
    assert_ne!(res(&f, &done(3)).digest, res(&f, &done(4)).digest);
    // Text that only looks like JSON is a string.
    for s in ["[1, 2", "{not json}", "[INFO] started [done]"] {
        let r = res(&f, &json!(s));
        assert!(r.has_words || s.starts_with("[1"), "{s}");
        assert_ne!(r.digest, res(&f, &json!(format!("{s} "))).digest, "{s}");
    }
}

#[test]
fn json_texts_are_read_two_deep_and_as_python_writes_them() {
    let f = fp();
    // Python's `json.dumps` escapes an emoji as a surrogate pair.
    let text =
        r#"{"status": {"state": "RUNNING"}, "note": "\ud83d\ude80 export", "request_id": "r1"}"#;
    let r = res(&f, &json!(text));
    assert!(r.pending);
    assert_eq!(r.digest, res(&f, &json!(text.replace("r1", "r2"))).digest);
    // A text in a text is read (key order free); a third is a string (key order kept).
    let two = |inner: &str| json!(json!({"out": inner}).to_string());
    let three = |inner: &str| two(&json!({"x": inner}).to_string());
    let (ab, ba) = (r#"{"a":1,"b":2}"#, r#"{"b":2,"a":1}"#);
    assert_eq!(res(&f, &two(ab)).digest, res(&f, &two(ba)).digest);
    assert_ne!(res(&f, &three(ab)).digest, res(&f, &three(ba)).digest);
}

#[test]
fn the_content_sample_of_a_json_text_reads_it_as_the_text_it_is() {
    // A search's chunks, as text: the sample reads its lines, keys and all (its values
    // alone, ids too short to be content, are too few lines to judge it by).
    let f = fp();
    let chunks: Vec<Value> = (0..5)
        .map(|i| json!({"chunk_id": format!("ch_{i}"), "section": format!("Section {i} of the agreement"), "score": 0.7}))
        .collect();
    let result = json!(serde_json::to_string_pretty(&json!({"chunks": chunks})).unwrap());
    let mut scratch = Scratch::default();
    f.result(Some(&Json::of_value(&result)), None, &mut scratch);
    let sample = scratch.content_sample();
    let as_text = Fingerprinter::new(&FingerprintSpec::default());
    let mut plain = Scratch::default();
    let mut c = Canon::new(&mut plain, &as_text.result_keys, None);
    c.patterns = Some(Patterns {
        builtins: &as_text.builtins,
        custom: &as_text.custom_patterns,
    });
    c.document(Json::of_value(&result).as_str().as_bytes(), false);
    assert_eq!(sample, plain.content_sample());
}

#[test]
fn a_shell_command_that_only_sleeps_is_a_wait() {
    let only_sleeps = |args: Option<&Json>| sleeps(args) == Some(Sleeps::Only);
    let sleeps = |v: Value| only_sleeps(Some(&Json::of_value(&v)));
    assert!(sleeps(json!({"command": "sleep 30"})));
    assert!(sleeps(json!({"cmd": " sleep 1m 30s;"})));
    assert!(sleeps(json!("sleep 0.5")));
    // A harness's description beside it; an argv; arguments written as a JSON text.
    assert!(sleeps(
        json!({"command": "sleep 900", "description": "Wait 15 minutes for the SLURM job to start before checking the queue again", "timeout": 960000})
    ));
    assert!(sleeps(json!({"command": ["bash", "-lc", "sleep 900"]})));
    assert!(sleeps(json!({"command": ["sleep", "900"]})));
    assert!(sleeps(json!(json!({"command": "sleep 5"}).to_string())));
    // Not a command: a file's content.
    assert!(!sleeps(json!({"path": "wait.sh", "content": "sleep 30"})));
    // A command that does something after its sleep, or that is no sleep.
    assert!(!sleeps(json!({"command": "sleep 30 && kubectl get pods"})));
    assert!(!sleeps(json!({"command": "sleep"})));
    assert!(!sleeps(json!({"command": "sleep -1"})));
    assert!(!sleeps(json!({"command": "sleep inf"})));
    assert!(!sleeps(json!({"command": "sleepy 3"})));
    assert!(!sleeps(json!({"command": "echo sleep 3"})));
    assert!(!sleeps(json!({"seconds": 30})));
    assert!(!sleeps(
        json!({"command": format!("sleep 1{}", " ".repeat(SLEEP_ARGS_MAX_BYTES))})
    ));
    assert!(!sleeps(
        json!({"command": ["bash", "-lc", "sleep 9 && make"]})
    ));
    assert!(!only_sleeps(None));
}

#[test]
fn a_call_that_lasted_its_own_timeout_waited_it_out() {
    let waited = |v: Value, ms: f64| waited_out_its_timeout(Some(&Json::of_value(&v)), Some(ms));
    // A serial read, a queue's long poll, a bare timeout in ms and in seconds, and
    // arguments written as a JSON text.
    assert!(waited(
        json!({"port": "/dev/ttyUSB0", "timeout_ms": 10000}),
        10_004.0
    ));
    assert!(waited(
        json!({"QueueUrl": "q", "WaitTimeSeconds": 20}),
        20_310.0
    ));
    assert!(waited(json!({"timeout": 30000}), 30_000.0));
    assert!(waited(json!({"timeout": 30}), 31_200.0));
    assert!(waited(json!(json!({"timeout_s": 5}).to_string()), 5_000.0));
    // A shell command, code or a query that hung until its timeout, a request that
    // changes something.
    assert!(!waited(
        json!({"command": "pytest -x tests/", "timeout": 120}),
        120_100.0
    ));
    assert!(!waited(
        json!({"code": "while True: pass", "timeout": 120}),
        120_100.0
    ));
    assert!(!waited(
        json!({"query": "service:api error", "timeout": 30}),
        30_000.0
    ));
    assert!(!waited(
        json!({"method": "POST", "url": "u", "timeout": 30}),
        29_500.0
    ));
    assert!(waited(
        json!({"method": "get", "url": "u", "timeout": 30}),
        30_100.0
    ));
    // Keys in any case; a key without a unit is in seconds unless it is whole seconds
    // written in milliseconds.
    assert!(!waited(json!({"Method": "POST", "Timeout": 30}), 30_000.0));
    assert!(!waited(json!({"Command": "make", "timeout": 30}), 30_000.0));
    assert!(!waited(json!({"timeout": 1800}), 1_900.0));
    assert!(waited(json!({"timeout": 1800}), 1_800_400.0));
    assert!(waited(json!({"read_timeout": 30}), 30_200.0));
    // Done before its timeout, or far past it (the timeout was not what it waited on).
    assert!(!waited(
        json!({"command": "npm test", "timeout": 600000}),
        41_000.0
    ));
    assert!(!waited(json!({"timeout_ms": 10000}), 8_000.0));
    assert!(!waited(json!({"timeout_ms": 10000}), 40_000.0));
    // Under a second, no number, no such key, a nested key, or no duration.
    assert!(!waited(json!({"timeout_ms": 500}), 500.0));
    assert!(!waited(json!({"wait": true}), 5_000.0));
    assert!(!waited(json!({"limit": 10000}), 10_000.0));
    assert!(!waited(json!({"options": {"timeout_ms": 10000}}), 10_000.0));
    assert!(!waited_out_its_timeout(
        Some(&Json::of_value(&json!({"timeout_ms": 10000}))),
        None
    ));
}

#[test]
fn a_shell_command_that_sleeps_first_is_a_check_after_a_wait() {
    use Sleeps::{First, Only};
    let cases = [
        (
            json!({"command": "sleep 60 && tail -n 3 apply.log"}),
            Some(First),
        ),
        (
            json!({"cmd": "sleep 20; adb shell getprop sys.boot_completed"}),
            Some(First),
        ),
        (
            json!({"command": ["bash", "-lc", "sleep 9\nsqueue -j 42"]}),
            Some(First),
        ),
        (
            json!({"command": "sleep 5 || true; kubectl get pods"}),
            Some(First),
        ),
        // Sleeps only, split or not.
        (json!({"command": "sleep 5 && sleep 5;"}), Some(Only)),
        (json!({"command": "sleep 30"}), Some(Only)),
        // A check before its sleep, a sleep in the background, no sleep at all.
        (json!({"command": "make; sleep 5"}), None),
        (json!({"command": "sleep 5 & make"}), None),
        (json!({"command": "echo sleep 3 && make"}), None),
        (json!({"path": "wait.sh", "content": "sleep 3; make"}), None),
        // Where it runs first; its durations and units; a sleep under a second is no wait
        // on anything (alone, it is still a wait).
        (
            json!({"command": "cd /repo && sleep 30 && tail -n 5 run.log"}),
            Some(First),
        ),
        (json!({"command": "sleep 1e3\r\nsqueue"}), Some(First)),
        (json!({"command": "sleep .5 && make"}), None),
        (json!({"command": "sleep 0; python -m pytest"}), None),
        (json!({"command": "sleep 0.5s 0.5s && make"}), Some(First)),
        (json!({"command": "sleep 0.5"}), Some(Only)),
        (json!({"command": "sleep 5s; sleep 5m"}), Some(Only)),
        (json!({"command": "cd /repo && make"}), None),
        // Steps that check on nothing after the sleep leave it a wait; a command's output
        // echoed is a check.
        (json!({"command": "sleep 60 || true"}), Some(Only)),
        (
            json!({"command": "sleep 60 && echo waited; date -u +%T"}),
            Some(Only),
        ),
        (
            json!({"command": "sleep 60 && echo $(squeue -j 7)"}),
            Some(First),
        ),
        (
            json!({"command": "sleep 60 && echo done && squeue -j 7"}),
            Some(First),
        ),
        (json!({"command": "sleep 60 && echoes"}), Some(First)),
    ];
    for (args, want) in cases {
        assert_eq!(sleeps(Some(&Json::of_value(&args))), want, "{args}");
    }
}

#[test]
fn the_content_sample_of_a_json_text_on_one_line_reads_its_values() {
    // `json.dumps` writes one line: read as written it is one line, too few to judge the
    // result by; its values are its lines, as those of the JSON itself.
    let f = fp();
    let (colours, items) = (
        ["amber", "slate", "ivory", "olive", "coral", "indigo"],
        [
            "ceramic vase",
            "side table",
            "throw blanket",
            "table lamp",
            "candle set",
            "wall mirror",
        ],
    );
    let products: Vec<Value> = (0..36)
        .map(|i| json!({"id": format!("prod_{i}"), "name": format!("Kyoto {} {}", colours[i % 6], items[i / 6]), "images": i}))
        .collect();
    let page = json!({"data": products, "request_id": "req_1"});
    let sample = |v: &Value| {
        let mut scratch = Scratch::default();
        f.result(Some(&Json::of_value(v)), None, &mut scratch);
        scratch.content_sample()
    };
    let as_text = sample(&json!(page.to_string()));
    assert!(as_text.hashes().len() >= crate::engine::content::MIN_SAMPLED_LINES);
    assert_eq!(as_text, sample(&page));
    // Written over lines, it is read line by line (the test above).
    let pretty = json!(serde_json::to_string_pretty(&page).unwrap());
    assert_ne!(sample(&pretty), as_text);
}

#[test]
fn words_are_letters_of_values_outside_markup() {
    let f = fp();
    assert!(
        !res(
            &f,
            &json!("<returncode>1</returncode>\n<output>\n</output>")
        )
        .has_words
    );
    assert!(!res(&f, &json!({"exit": 1, "code": "42"})).has_words);
    assert!(
        res(&f, &json!({"cwd": "/tmp/x"})).has_words,
        "volatile values count"
    );
    assert!(res(&f, &json!(["ok"])).has_words);
}

#[test]
fn given_digest_replaces_the_result() {
    let f = fp();
    let x = Json::of_value(&json!("x"));
    let y = Json::of_value(&json!("y"));
    let a = f.result(Some(&x), Some("ABCD"), &mut Scratch::default());
    let b = f.result(Some(&y), Some("abcd"), &mut Scratch::default());
    assert_eq!(a.digest, b.digest);
    assert!(a.has_words);
}

#[test]
fn per_tool_ignored_arg_keys() {
    let spec = FingerprintSpec {
        ignore_args: vec![("todo".to_string(), vec!["note".to_string()])],
        ..FingerprintSpec::default()
    };
    let f = Fingerprinter::new(&spec);
    let a = json!({"item": 1, "note": "thinking"});
    let b = json!({"item": 1, "note": "still thinking"});
    assert_eq!(act(&f, "todo", &a), act(&f, "todo", &b));
    assert_ne!(act(&f, "other", &a), act(&f, "other", &b));
}

#[test]
fn uuid_and_date_matchers_respect_boundaries() {
    let p = Patterns {
        builtins: &[BuiltinPattern::Uuid, BuiltinPattern::Rfc3339],
        custom: &[],
    };
    assert_eq!(
        next_volatile(b"x 123e4567-e89b-12d3-a456-426614174000 y", 0, p),
        Some((2, 38))
    );
    assert_eq!(
        next_volatile(b"a1123e4567-e89b-12d3-a456-426614174000", 0, p),
        None
    );
    assert_eq!(
        next_volatile(b"on 2026-01-02T03:04:05Z.", 0, p),
        Some((3, 23))
    );
    assert_eq!(next_volatile(b"v1-2-3 and 12-34", 0, p), None);
}

/// The canonical JSON written by walking serde_json's tree: the definition the fast
/// pass over the text is held to.
mod reference {
    use super::super::*;
    use serde_json::Value;

    pub struct Out {
        pub canonical: Vec<u8>,
        pub shape: Option<Shape>,
    }

    impl Out {
        fn put(&mut self, b: &[u8]) {
            self.canonical.extend_from_slice(b);
            if let Some(s) = self.shape.as_mut() {
                s.text(b);
            }
        }

        fn escaped(&mut self, esc: &[u8]) {
            self.canonical.extend_from_slice(esc);
            if let Some(s) = self.shape.as_mut() {
                s.escape(esc);
            }
        }

        fn string(&mut self, s: &[u8]) {
            self.put(b"\"");
            self.body(s);
            self.put(b"\"");
        }

        fn body(&mut self, s: &[u8]) {
            let mut start = 0;
            for (i, &b) in s.iter().enumerate() {
                let esc: Vec<u8> = match b {
                    b'"' => b"\\\"".to_vec(),
                    b'\\' => b"\\\\".to_vec(),
                    b'\n' => b"\\n".to_vec(),
                    b'\r' => b"\\r".to_vec(),
                    b'\t' => b"\\t".to_vec(),
                    0x08 => b"\\b".to_vec(),
                    0x0c => b"\\f".to_vec(),
                    0..=0x1f => format!("\\u{:04x}", b).into_bytes(),
                    _ => continue,
                };
                self.put(&s[start..i]);
                self.escaped(&esc);
                start = i + 1;
            }
            self.put(&s[start..]);
        }
    }

    pub struct Walker<'a> {
        pub out: Out,
        pub keys: &'a KeySet,
        pub extra: Option<&'a KeySet>,
        pub patterns: Option<Patterns<'a>>,
        pub pending: Option<(&'a AhoCorasick, PendingScan)>,
        /// A result: a string holding a JSON object or array is walked as that JSON, a
        /// key is volatile as its last words too.
        pub json_text: bool,
        pub depth: usize,
        /// JSON texts in strings the value being walked is in.
        pub levels: usize,
        /// Some string value says something in words (a volatile key's value as written).
        pub words: bool,
        /// Some string was walked as the JSON it holds, written over lines.
        pub expanded: bool,
    }

    /// The JSON object or array a string holds (JSON's whitespace around it allowed),
    /// nesting at most `budget` deep.
    pub fn json_of(s: &str, budget: usize) -> Option<Value> {
        let t = s.trim_matches(JSON_WS);
        let ends =
            (t.starts_with('{') && t.ends_with('}')) || (t.starts_with('[') && t.ends_with(']'));
        ends.then(|| serde_json::from_str::<Value>(t).ok())
            .flatten()
            .filter(|v| (v.is_object() || v.is_array()) && value_depth(v) <= budget)
    }

    impl Walker<'_> {
        fn held_json(&self, s: &str) -> Option<Value> {
            let budget = JSON_TEXT_MAX_NESTING.saturating_sub(self.depth);
            (self.levels < JSON_TEXT_LEVELS)
                .then(|| json_of(s, budget))
                .flatten()
        }

        pub fn value(&mut self, v: &Value) {
            match v {
                Value::Null => self.out.put(b"null"),
                Value::Bool(b) => self.out.put(if *b { b"true" } else { b"false" }),
                Value::Number(n) => self.out.put(n.to_string().as_bytes()),
                Value::String(s) if self.json_text && self.held_json(s).is_some() => {
                    let held = self.held_json(s).unwrap();
                    self.expanded |= s.trim_matches(JSON_WS).contains('\n');
                    self.levels += 1;
                    self.value(&held);
                    self.levels -= 1;
                }
                Value::String(s) => {
                    self.words |= has_words(v);
                    if let Some((ac, scan)) = self.pending.as_mut() {
                        if !scan.bare && s.len() <= PENDING_SCAN_MAX_BYTES {
                            if is_pending_value(ac, s.as_bytes()) {
                                (scan.bare, scan.any_short) = (true, true);
                            } else if reads_pending(ac, s.as_bytes(), scan.prose_terms) {
                                scan.any_short = true;
                            }
                        }
                    }
                    let Some(p) = self.patterns else {
                        self.out.string(s.as_bytes());
                        return;
                    };
                    let s = s.as_bytes();
                    self.out.put(b"\"");
                    let mut pos = 0;
                    while let Some((start, end)) = next_volatile(s, pos, p) {
                        self.out.body(&s[pos..start]);
                        self.out.put(b"\x00");
                        pos = end;
                    }
                    self.out.body(&s[pos..]);
                    self.out.put(b"\"");
                }
                Value::Array(items) => {
                    self.depth += 1;
                    self.out.put(b"[");
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            self.out.put(b",");
                        }
                        self.value(item);
                    }
                    self.out.put(b"]");
                    self.depth -= 1;
                }
                Value::Object(map) => {
                    self.depth += 1;
                    self.out.put(b"{");
                    let mut first = true;
                    for (k, item) in map {
                        let kb = k.as_bytes();
                        let volatile = if self.json_text {
                            self.keys.contains_key_or_last_words(kb)
                        } else {
                            self.keys.contains(kb)
                        };
                        if volatile || self.extra.is_some_and(|e| e.contains(kb)) {
                            self.words |= has_words(item);
                            continue;
                        }
                        if !first {
                            self.out.put(b",");
                        }
                        first = false;
                        self.out.string(kb);
                        self.out.put(b":");
                        if let (Value::String(s), Some((ac, scan))) = (item, self.pending.as_mut())
                        {
                            if scan.status != Some(true) && is_status_key(kb) {
                                scan.status = Some(reads_pending(ac, s.as_bytes(), usize::MAX));
                            }
                        }
                        self.value(item);
                    }
                    self.out.put(b"}");
                    self.depth -= 1;
                }
            }
        }
    }

    /// Whether some string value of `v`, as written, says something in words.
    pub fn has_words(v: &Value) -> bool {
        match v {
            Value::String(s) => crate::contract::json::content_has_words(
                serde_json::to_string(s)
                    .unwrap()
                    .trim_matches('"')
                    .as_bytes(),
                &mut false,
            ),
            Value::Array(items) => items.iter().any(has_words),
            Value::Object(map) => map.values().any(has_words),
            _ => false,
        }
    }

    pub fn action(f: &Fingerprinter, tool: &str, args: &Value) -> Vec<u8> {
        let mut w = Walker {
            out: Out {
                canonical: Vec::new(),
                shape: None,
            },
            keys: &f.arg_keys,
            extra: f.ignore_args.get(tool),
            patterns: None,
            pending: None,
            json_text: false,
            depth: 0,
            levels: 0,
            words: false,
            expanded: false,
        };
        w.out.put(b"[");
        w.out.string(tool.as_bytes());
        w.out.put(b",");
        w.value(args);
        w.out.put(b"]");
        w.out.canonical
    }

    /// A result's digest, its shape, whether it reads pending, whether it has words,
    /// and the canonical text its content sample reads (strings holding JSON as the
    /// strings they are).
    /// Pending, read anywhere and as a status.
    pub type Pending = Option<(bool, bool)>;

    pub fn result(f: &Fingerprinter, result: &Value) -> (Fp, u32, Pending, bool, Vec<u8>) {
        let walk = |json_text: bool| {
            let mut w = Walker {
                out: Out {
                    canonical: Vec::new(),
                    shape: Some(Shape::default()),
                },
                keys: &f.result_keys,
                extra: None,
                patterns: Some(Patterns {
                    builtins: &f.builtins,
                    custom: &f.custom_patterns,
                }),
                pending: (f.pending.as_ref()).map(|ac| (ac, PendingScan::new(f.prose_terms))),
                json_text,
                depth: 0,
                levels: 0,
                words: false,
                expanded: false,
            };
            w.value(result);
            w
        };
        let w = walk(true);
        let pending = w
            .pending
            .as_ref()
            .map(|(_, s)| (s.pending(), s.status_pending()));
        (
            Fp::of(&w.out.canonical),
            w.out.shape.unwrap().finish(),
            pending,
            w.words,
            if w.expanded && w.words {
                walk(false).out.canonical
            } else {
                w.out.canonical.clone()
            },
        )
    }
}

mod agreement {
    use super::super::*;
    use super::reference;
    use proptest::prelude::*;
    use serde_json::Value;

    fn leaf() -> impl Strategy<Value = Value> {
        let text = prop_oneof![
            "[a-zA-Z0-9 _:./<>\\-]{0,12}",
            Just("running".to_string()),
            Just("2026-01-02T03:04:05Z".to_string()),
            Just("123e4567-e89b-12d3-a456-426614174000".to_string()),
            Just("line 4\n\t\"q\" \\ \u{8}\u{c}\u{1}/é😀".to_string()),
            Just("<output>\n</output>".to_string()),
            // JSON held in strings: a status, a bare pending word, prose with one in it.
            Just("{\"status\": {\"state\": \"RUNNING\"}, \"trace_id\": \"x\"}".to_string()),
            Just("\n [\"creating\", {}, 1.50]\n".to_string()),
            Just("{\"title\": \"1. Data Processing\", \"job_state\": \"done\"}".to_string()),
            Just("[1, 2".to_string()),
            // A surrogate pair's escapes (Python's `json.dumps` of an emoji), a JSON text
            // in a JSON text, a duplicate key, JSON's whitespace at the ends, nesting past
            // the limit and within it.
            Just("{\"s\": \"\\ud83d\\ude80 running\", \"n\": 1.5e308}".to_string()),
            Just("{\"output\": \"{\\\"state\\\": \\\"queued\\\"}\"}".to_string()),
            Just("{\"a\": 1, \"a\": \"creating\"}".to_string()),
            Just("\t[\"x\"]\r\n".to_string()),
            Just(format!("{}{}", "[".repeat(70), "]".repeat(70))),
            Just(format!("{}{}", "[".repeat(3), "]".repeat(3))),
            Just(
                "\nfab2026-01-02T03:04:05Z\u{c}123e4567-e89b-12d3-a456-426614174000\u{8}"
                    .to_string()
            ),
        ];
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e12f64..1e12).prop_map(Value::from),
            text.prop_map(Value::from),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        let keys = prop_oneof![
            "[a-z_]{1,6}",
            Just("status".to_string()),
            Just("cwd".to_string()),
            Just("TraceId".to_string()),
            Just("subagentSessionId".to_string()),
            Just("estate".to_string()),
            Just("action".to_string()),
            Just("k\"ey\n".to_string()),
        ];
        leaf().prop_recursive(4, 40, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((keys.clone(), inner), 0..5)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// The same value written in other ways JSON allows: spaces, `\/`, `\u` escapes
    /// of plain characters.
    fn respell(v: &Value, how: u8) -> String {
        let compact = v.to_string();
        match how {
            0 => compact,
            1 => serde_json::to_string_pretty(v).unwrap(),
            _ => {
                let mut out = String::new();
                let mut in_string = false;
                let mut escaped = false;
                for c in compact.chars() {
                    if in_string && !escaped && c == '/' {
                        out.push_str("\\/");
                    } else if in_string && !escaped && c == 'e' {
                        out.push_str("\\u0065");
                    } else {
                        out.push(c);
                    }
                    if in_string {
                        if escaped {
                            escaped = false;
                        } else if c == '\\' {
                            escaped = true;
                        } else if c == '"' {
                            in_string = false;
                        }
                    } else if c == '"' {
                        in_string = true;
                    }
                }
                out
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn the_fast_pass_writes_what_the_tree_walk_writes(v in value(), how in 0u8..3) {
            let f = Fingerprinter::default();
            let text = respell(&v, how);
            // The tree as serde_json reads the text (numbers as it parses them).
            let v: Value = serde_json::from_str(&text).unwrap();
            let json = Json::borrowed(&text);
            let mut scratch = Scratch::default();
            let a = f.action("tool", Some(&json), &mut scratch);
            let expected = reference::action(&f, "tool", &v);
            prop_assert_eq!(
                String::from_utf8_lossy(&scratch.canonical),
                String::from_utf8_lossy(&expected)
            );
            prop_assert_eq!(a.digest, Fp::of(&expected));
            let expected_arg = v.get("action").and_then(Value::as_str).map(str::to_string);
            prop_assert_eq!(a.action_arg.map(|c| c.into_owned()), expected_arg);
            let r = f.result(Some(&json), None, &mut scratch);
            let (digest, shape, pending, words, canonical) = reference::result(&f, &v);
            prop_assert_eq!(
                String::from_utf8_lossy(&scratch.canonical),
                String::from_utf8_lossy(&canonical)
            );
            prop_assert_eq!(r.digest, digest);
            prop_assert_eq!(r.shape, shape);
            let (any, as_status) = pending.unwrap_or((false, false));
            prop_assert_eq!(r.pending, any);
            prop_assert_eq!(r.status_pending, as_status);
            prop_assert_eq!(r.has_words, words);
        }
    }
}

//! The event contract's unit tests: both parse paths, their errors, and timestamps.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

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
    let mut rng = crate::tools::simulate::Rng::new(7);
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
    let err = parse(r#"{"type":"cost.attributed","session_id":"s","input_tokens":1}"#).unwrap_err();
    assert_eq!(err.reason(), "missing_field");
    assert!(err.to_string().contains("output_tokens"), "{err}");
}

#[test]
fn names_the_field_with_a_wrong_type() {
    let err = parse(
        r#"{"type":"cost.attributed","session_id":"s","input_tokens":"many","output_tokens":1}"#,
    )
    .unwrap_err();
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
        (b" \n\"session.started\"".to_vec(), "not_an_object"),
        (b"".to_vec(), "invalid_json"),
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

#[test]
fn an_array_is_not_an_event_whatever_its_elements() {
    // serde would read the event's fields from an array by position: as many elements as
    // the event has fields, in their order, made a `session.started` of session `s1`.
    let array = format!(r#"["session.started","s1"{}]"#, ",null".repeat(30));
    let err = parse_event(array.as_bytes(), &ParseLimits::default()).unwrap_err();
    assert_eq!(err.reason(), "not_an_object", "{err}");
    let err = parse_event(b" [\"session.started\", \"s1\"", &ParseLimits::default()).unwrap_err();
    assert_eq!(err.reason(), "invalid_json", "{err}");
}

#[test]
fn the_deepest_nesting_allowed_parses_on_either_path() {
    let limits = ParseLimits {
        max_nesting: crate::contract::event::MAX_NESTING_LIMIT,
        ..ParseLimits::default()
    };
    // The event object, `args`, then arrays down to the limit.
    let depth = limits.max_nesting - 2;
    let args = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    let plain =
        format!(r#"{{"type":"tool.called","session_id":"s","tool":"t","args":{{"a":{args}}}}}"#);
    parse_event(plain.as_bytes(), &limits).expect("the fast path");
    // A field the fast path leaves to serde (an escaped surrogate pair) takes the slow one.
    let slow = plain.replacen('{', r#"{"x":"\ud83d\ude00","#, 1);
    parse_event(slow.as_bytes(), &limits).expect("the slow path");
    // One more level is too deep, on either path.
    let deeper = plain.replace("[1]", "[[1]]");
    assert_eq!(
        parse_event(deeper.as_bytes(), &limits)
            .unwrap_err()
            .reason(),
        "too_deep"
    );
}

#[test]
fn an_event_or_trace_id_longer_than_an_id_is_a_bad_value_on_both_paths() {
    for field in ["event_id", "trace_id"] {
        // Plain, and as escaped surrogate pairs (4 bytes each once read), which only the
        // slower reader takes.
        for (filler, bytes) in [("x", 1), ("\\ud83d\\ude00", 4)] {
            let id = |n: usize| {
                let (whole, rest) = (n / bytes, n % bytes);
                let value = format!("{}{}", "y".repeat(rest), filler.repeat(whole));
                format!(r#"{{"type":"session.started","session_id":"s","{field}":"{value}"}}"#)
            };
            let at_most = id(MAX_ID_BYTES);
            assert!(parse(&at_most).is_ok(), "{field} of {MAX_ID_BYTES} bytes");
            let over = id(MAX_ID_BYTES + 1);
            let err = parse(&over).unwrap_err();
            assert_eq!(err.reason(), "invalid_value", "{err}");
            let said = err.to_string();
            assert!(said.contains(field) && said.contains("257"), "{said}");
        }
    }
    // An event of no known type says so first, whatever its `event_id` and `trace_id`.
    let unknown = format!(
        r#"{{"type":"x.y","session_id":"s","event_id":"{}"}}"#,
        "x".repeat(300)
    );
    assert_eq!(parse(&unknown).unwrap_err().reason(), "unknown_type");
}

#[test]
fn a_byte_order_mark_ahead_of_an_event_is_no_part_of_it() {
    let plain = r#"{"type":"tool.called","session_id":"s","tool":"read","args":{"p":1}}"#;
    let marked = [b"\xEF\xBB\xBF".as_slice(), plain.as_bytes()].concat();
    let limits = ParseLimits::default();
    let event = parse_event(&marked, &limits).unwrap();
    assert_eq!(
        event,
        parse(plain).unwrap(),
        "the same event, its derived id too"
    );
    // Anywhere else it is what it is: not JSON's whitespace.
    let inside = plain.replacen('{', "{\u{feff}", 1);
    assert_eq!(parse(&inside).unwrap_err().reason(), "invalid_json");
    // An error's offset counts from the message's first byte, the mark's.
    let bad = [marked.as_slice(), b"\xff"].concat();
    let err = parse_event(&bad, &limits).unwrap_err();
    assert_eq!(
        err,
        BadEvent::InvalidUtf8 {
            offset: marked.len()
        },
        "{err}"
    );
}

//! The configuration's unit tests: parsing, validation, environment overrides, the
//! effective TOML.

use super::*;
use crate::engine::detectors::DetectorKind;
use crate::engine::levels::Mode;
use std::time::Duration;

fn cfg(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml_str(text, "test.toml", std::iter::empty())
}

#[test]
fn empty_file_gives_the_design_defaults() {
    let c = cfg("").unwrap();
    assert_eq!(c.policy, Policy::default());
    assert_eq!(c.engine.session_gap_ms, 1_800_000);
    assert_eq!(c.engine.future_grace_ms, 60_000);
}

#[test]
fn a_future_grace_is_zero_to_a_day_and_below_the_session_gap() {
    assert_eq!(
        cfg("[engine]\nfuture_grace_secs = 0\n")
            .unwrap()
            .engine
            .future_grace_ms,
        0
    );
    let day = cfg("[engine]\nsession_gap_secs = 86401\nfuture_grace_secs = 86400\n").unwrap();
    assert_eq!(day.engine.future_grace_ms, 86_400_000);
    let gap = |secs: u64| cfg(&format!("[engine]\nsession_gap_secs = {secs}\n")).unwrap();
    assert_eq!(gap(90).engine.future_grace_ms, 45_000, "half a short gap");
    assert_eq!(gap(1).engine.future_grace_ms, 0);
    for bad in ["86401", "-1", "\"1m\"", "1800"] {
        let err = cfg(&format!("[engine]\nfuture_grace_secs = {bad}\n")).unwrap_err();
        let keys: Vec<&str> = err.key_errors().iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["engine.future_grace_secs"], "{bad}: {err}");
    }
    let err = cfg("[engine]\nsession_gap_secs = 60\nfuture_grace_secs = 60\n").unwrap_err();
    assert!(
        err.to_string()
            .contains("below engine.session_gap_secs (60)"),
        "{err}"
    );
}

#[test]
fn reports_every_error_at_once_with_its_key() {
    let err = cfg(r#"
        bogus = 1
        mode = "loud"
        [engine]
        session_gap_secs = 0
        [detectors.repeat]
        warn_at = 5
        terminate_at = 4
        min_similarity = 0.5
        [detectors.nope]
        warn_at = 1
        [tools]
        poll = ["[bad"]
        wait = ["{bad"]
        "#)
    .unwrap_err();
    let keys: Vec<&str> = err.key_errors().iter().map(|e| e.key.as_str()).collect();
    for expected in [
        "bogus",
        "mode",
        "engine.session_gap_secs",
        "detectors.repeat",
        "detectors.repeat.min_similarity",
        "detectors.nope",
        "tools.poll[0]",
        "tools.wait[0]",
    ] {
        assert!(keys.contains(&expected), "missing {expected} in {keys:?}");
    }
}

#[test]
fn an_error_in_a_key_the_environment_set_names_the_variable() {
    let env = [
        ("LOOPWARDEN_KAFKA__GROUP_ID", "123"),
        ("LOOPWARDEN_FOO", "1"),
        ("LOOPWARDEN_ENGINE__SESSION_GAP_SECS", "60"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let err = Config::from_toml_str(
        "[engine]\nmax_nesting = 1000\n",
        "test.toml",
        env.into_iter(),
    )
    .unwrap_err();
    let messages: Vec<(&str, &str)> = err
        .key_errors()
        .iter()
        .map(|e| (e.key.as_str(), e.message.as_str()))
        .collect();
    for (key, by) in [
        ("kafka.group_id", Some("LOOPWARDEN_KAFKA__GROUP_ID")),
        ("foo", Some("LOOPWARDEN_FOO")),
        ("engine.max_nesting", None),
    ] {
        let (_, message) = messages
            .iter()
            .find(|(k, _)| *k == key)
            .unwrap_or_else(|| panic!("{key} in {messages:?}"));
        match by {
            Some(name) => assert!(message.ends_with(&format!("(set by {name})")), "{message}"),
            None => assert!(!message.contains("set by"), "{message}"),
        }
    }
}

#[test]
fn spans_on_the_bus_need_a_topic_of_their_own() {
    for (text, expected) in [
        ("[telemetry]\nspans_topic = \"a/b\"\n", "not a valid topic name"),
        (
            "[telemetry]\nspans_to_kafka = true\nspans_topic = \"tool.called\"\n",
            "also an input topic",
        ),
        (
            "[telemetry]\nspans_to_kafka = true\nspans_topic = \"s\"\n[kafka]\nchangelog_topic = \"s\"\n",
            "also the changelog topic",
        ),
    ] {
        let err = cfg(text).unwrap_err();
        let errors = err.key_errors();
        assert_eq!(errors.len(), 1, "{text}: {err}");
        assert_eq!(errors[0].key, "telemetry.spans_topic");
        assert!(errors[0].message.contains(expected), "{err}");
    }
    // Off the bus, the topic is not used.
    cfg("[telemetry]\nspans_topic = \"tool.called\"\n").unwrap();
}

#[test]
fn the_variables_kubernetes_sets_for_a_loopwarden_service_are_not_keys() {
    // The kubelet's service links for the chart's `loopwarden-metrics` Service (and for
    // a Service named `loopwarden`), beside a key set by the environment.
    let env = [
        ("LOOPWARDEN_METRICS_SERVICE_HOST", "10.0.0.7"),
        ("LOOPWARDEN_METRICS_SERVICE_PORT", "9464"),
        ("LOOPWARDEN_METRICS_SERVICE_PORT_HTTP_METRICS", "9464"),
        ("LOOPWARDEN_METRICS_PORT", "tcp://10.0.0.7:9464"),
        ("LOOPWARDEN_METRICS_PORT_9464_TCP", "tcp://10.0.0.7:9464"),
        ("LOOPWARDEN_METRICS_PORT_9464_TCP_PROTO", "tcp"),
        ("LOOPWARDEN_METRICS_PORT_9464_TCP_PORT", "9464"),
        ("LOOPWARDEN_METRICS_PORT_9464_TCP_ADDR", "10.0.0.7"),
        ("LOOPWARDEN_SERVICE_HOST", "10.0.0.8"),
        ("LOOPWARDEN_PORT", "tcp://10.0.0.8:9464"),
        ("LOOPWARDEN_MODE", "shadow"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let c = Config::from_toml_str("", "t", env.into_iter()).unwrap();
    assert_eq!(
        c.policy,
        Config::from_toml_str("mode = \"shadow\"", "t", std::iter::empty())
            .unwrap()
            .policy
    );
    // Anything else under the prefix is still an unknown key.
    let err = Config::from_toml_str(
        "",
        "t",
        [("LOOPWARDEN_METRICS_HOST".to_string(), "x".to_string())].into_iter(),
    )
    .unwrap_err();
    assert_eq!(err.key_errors()[0].key, "metrics_host");
}

#[test]
fn an_otlp_endpoint_must_be_plain_http() {
    for endpoint in ["https://collector:4317", "collector:4317"] {
        let err = cfg(&format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\n")).unwrap_err();
        let errors = err.key_errors();
        assert_eq!(errors.len(), 1, "{err}");
        assert_eq!(errors[0].key, "telemetry.otlp_endpoint");
        assert!(errors[0].message.contains("not an http:// URL"), "{err}");
    }
    let c = cfg("[telemetry]\notlp_endpoint = \"http://collector:4317\"\n").unwrap();
    assert_eq!(
        c.telemetry.otlp_endpoint.as_deref(),
        Some("http://collector:4317")
    );
    // The environment's endpoint, where the file names none, is checked too.
    let with_env = |text: &str, vars: &[(&str, &str)]| {
        let env = vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Config::from_toml_str(text, "t", env.collect::<Vec<_>>().into_iter())
    };
    let err = with_env(
        "",
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317")],
    )
    .unwrap_err();
    assert_eq!(
        err.key_errors()[0].key,
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "{err}"
    );
    let err = with_env(
        "",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://collector:4317",
            ),
        ],
    )
    .unwrap_err();
    assert_eq!(
        err.key_errors()[0].key,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "{err}"
    );
    for fine in [
        vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")],
        vec![
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://collector:4317",
            ),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://metrics-only:4317"),
        ],
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317"),
            ("OTEL_SDK_DISABLED", "true"),
        ],
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ],
        vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "")],
    ] {
        with_env("", &fine).unwrap();
    }
    // The file's endpoint wins over the environment's.
    with_env(
        "[telemetry]\notlp_endpoint = \"http://collector:4317\"\n",
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://elsewhere:4317")],
    )
    .unwrap();
}

#[test]
fn overrides_that_can_apply_together_are_checked_together() {
    let chain = |second: &str| {
        format!("[[overrides]]\ntenant = \"t\"\n[overrides.detectors.stall]\nwarn_at = 10\nterminate_at = 20\n[[overrides]]\n{second}\n[overrides.detectors.stall]\nterminate_at = 6\n")
    };
    for meets in ["agent = \"*\"", "tenant = \"t\"", "agent = \"coder\""] {
        let err = cfg(&chain(meets)).unwrap_err();
        let errors = err.key_errors();
        assert_eq!(errors.len(), 1, "{meets}: {err}");
        assert_eq!(errors[0].key, "overrides[1].detectors.stall");
        assert!(
            errors[0].message.contains("applied after overrides[0]"),
            "{err}"
        );
    }
    // Overrides that never meet: other tenants, agents apart by their globs.
    cfg(&chain("tenant = \"u\"")).unwrap();
    let apart = "[[overrides]]\nagent = \"research-*\"\n[overrides.detectors.stall]\nwarn_at = 10\nterminate_at = 20\n[[overrides]]\nagent = \"coder-*\"\n[overrides.detectors.stall]\nterminate_at = 6\n";
    cfg(apart).unwrap();
    let ends_apart = apart
        .replace("research-*", "*-research")
        .replace("coder-*", "*-coder");
    cfg(&ends_apart).unwrap();
    // Three for one tenant, rising after each: never two of them without the third.
    let three = "[[overrides]]\ntenant = \"t\"\n[overrides.detectors.stall]\nwarn_at = 10\nterminate_at = 20\n[[overrides]]\ntenant = \"t\"\n[overrides.detectors.stall]\nwarn_at = 2\n[[overrides]]\ntenant = \"t\"\n[overrides.detectors.stall]\nterminate_at = 6\n";
    cfg(three).unwrap();
    // A tool override on top of a session override.
    let tool = "[[overrides]]\nagent = \"a*\"\n[overrides.detectors.repeat]\nwarn_at = 6\nterminate_at = 9\nwindow_terminate_at = 12\n[[overrides]]\ntool = \"deploy*\"\n[overrides.detectors.repeat]\nterminate_at = 5\n";
    let err = cfg(tool).unwrap_err();
    assert_eq!(
        err.key_errors()[0].key,
        "overrides[1].detectors.repeat",
        "{err}"
    );
}

#[test]
fn an_empty_state_path_and_an_endless_session_gap_are_refused() {
    let err = cfg("[state]\npath = \"\"\n[engine]\nsession_gap_secs = 9223372036854775807\n")
        .unwrap_err();
    let keys: Vec<&str> = err.key_errors().iter().map(|e| e.key.as_str()).collect();
    // Section by section, in the order of the reference (`engine` before `state`).
    assert_eq!(keys, ["engine.session_gap_secs", "state.path"], "{err}");
    cfg(&format!(
        "[engine]\nsession_gap_secs = {MAX_SESSION_GAP_SECS}\n"
    ))
    .unwrap();
}

/// How long a store write may last before `/healthz` fails: two minutes by default,
/// settable in seconds from 1 s to a day, and printed with the effective configuration.
#[test]
fn the_write_stall_bound_has_a_default_and_limits() {
    assert_eq!(
        cfg("").unwrap().state_write_stall,
        Duration::from_secs(DEFAULT_WRITE_STALL_SECS)
    );
    for bad in ["0", "86401", "-5"] {
        let err = cfg(&format!("[state]\nwrite_stall_secs = {bad}\n")).unwrap_err();
        assert!(
            err.key_errors()
                .iter()
                .any(|e| e.key == "state.write_stall_secs"),
            "{bad}: {err}"
        );
    }
    let env = vec![(
        "LOOPWARDEN_STATE__WRITE_STALL_SECS".to_string(),
        "30".to_string(),
    )];
    let c = Config::from_toml_str("", "t", env.into_iter()).unwrap();
    assert_eq!(c.state_write_stall, Duration::from_secs(30));
    let again = Config::from_toml_str(&c.effective_toml(), "t", std::iter::empty()).unwrap();
    assert_eq!(again.state_write_stall, Duration::from_secs(30));
}

/// sled's page cache is bounded by default (its own default is 1 GiB), settable in
/// MiB, from 1 MiB to 64 GiB.
#[test]
fn the_state_cache_is_bounded_and_settable() {
    assert_eq!(
        cfg("").unwrap().state_cache_bytes,
        DEFAULT_STATE_CACHE_MIB * 1024 * 1024
    );
    for bad in ["0", "65537", "-1"] {
        let err = cfg(&format!("[state]\ncache_mib = {bad}\n")).unwrap_err();
        assert!(
            err.key_errors().iter().any(|e| e.key == "state.cache_mib"),
            "{bad}: {err}"
        );
    }
    let env = vec![("LOOPWARDEN_STATE__CACHE_MIB".to_string(), "8".to_string())];
    let c = Config::from_toml_str("", "t", env.into_iter()).unwrap();
    assert_eq!(c.state_cache_bytes, 8 * 1024 * 1024);
    // What the effective configuration prints loads as the same.
    let again = cfg(&c.effective_toml()).unwrap();
    assert_eq!(again.state_cache_bytes, c.state_cache_bytes);
}

#[test]
fn every_refused_key_of_a_section_is_reported() {
    let err = cfg("[kafka]\nworkers = 0\nmax_batch_events = \"lots\"\nidle_after_secs = -1\nbogus = 1\n[engine]\nsession_gap_secs = -5\ngrace_steps = -1\n")
        .unwrap_err();
    let keys: Vec<&str> = err.key_errors().iter().map(|e| e.key.as_str()).collect();
    for expected in [
        "kafka.max_batch_events",
        "kafka.idle_after_secs",
        "kafka.bogus",
        "engine.session_gap_secs",
        "engine.grace_steps",
    ] {
        assert!(keys.contains(&expected), "missing {expected} in {keys:?}");
    }
    // An array's first bad item, named by its own index, once.
    let err =
        cfg("[kafka]\ninput_topics = [\"a\", 1, 2]\n[tools]\npoll = [1, 2, 3]\n").unwrap_err();
    let keys: Vec<&str> = err.key_errors().iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["tools.poll[0]", "kafka.input_topics[1]"], "{err}");
}

#[test]
fn unknown_keys_inside_sections_are_rejected() {
    let err = cfg("[engine]\nsession_gap = 5\n").unwrap_err();
    assert_eq!(err.key_errors()[0].key, "engine.session_gap");
    assert!(
        err.key_errors()[0].message.contains("unknown field"),
        "{err}"
    );
}

#[test]
fn whole_floats_are_accepted_where_integers_are_expected() {
    // What Helm's toToml writes for `max_batch_events: 20000` in values.yaml.
    let c = Config::from_toml_str(
        "[kafka]\nmax_batch_events = 20000.0\n[kafka.consumer]\n\"fetch.wait.max.ms\" = 50.0\n[detectors.repeat]\nterminate_at = 5.0\n[detectors.similar_turns]\nmin_similarity = 0.9\n",
        "test",
        std::iter::empty(),
    )
    .unwrap();
    assert_eq!(c.kafka.max_batch_events, 20000);
    assert_eq!(c.kafka.consumer["fetch.wait.max.ms"], "50");
    let e = Config::from_toml_str(
        "[kafka]\nmax_batch_events = 20000.5\n",
        "test",
        std::iter::empty(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("kafka.max_batch_events"), "{e}");
}

#[test]
fn env_sets_librdkafka_properties_verbatim_and_check_config_redacts_secrets() {
    let env = [
        ("LOOPWARDEN_KAFKA__CLIENT__SASL_USERNAME", "svc-loopwarden"),
        ("LOOPWARDEN_KAFKA__CLIENT__SASL_PASSWORD", "1e5"),
        ("LOOPWARDEN_KAFKA__CLIENT__SASL_MECHANISMS", "SCRAM-SHA-512"),
        ("LOOPWARDEN_KAFKA__CLIENT__SECURITY_PROTOCOL", "SASL_SSL"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let c = Config::from_toml_str("", "test", env.into_iter()).unwrap();
    assert_eq!(c.kafka.client["sasl.password"], "1e5");
    assert_eq!(c.kafka.client["sasl.username"], "svc-loopwarden");
    let shown = c.effective_toml();
    assert!(!shown.contains("1e5"), "{shown}");
    assert!(shown.contains("svc-loopwarden") && shown.contains("(redacted)"));
}

#[test]
fn env_overrides_nested_keys_with_types() {
    let env = vec![
        (
            "LOOPWARDEN_DETECTORS__REPEAT__TERMINATE_AT".to_string(),
            "6".to_string(),
        ),
        ("LOOPWARDEN_MODE".to_string(), "shadow".to_string()),
        ("LOOPWARDEN_CONFIG".to_string(), "/ignored".to_string()),
        ("LOOPWARDEN_THREADS".to_string(), "4".to_string()),
        ("LOOPWARDEN_BROKER_PORT".to_string(), "19192".to_string()),
        ("LOOPWARDEN_BENCH_RATE".to_string(), "5000".to_string()),
        ("OTHER".to_string(), "x".to_string()),
    ];
    let c = Config::from_toml_str(
        "[detectors.repeat]\nterminate_at = 5\n",
        "t",
        env.into_iter(),
    )
    .unwrap();
    assert_eq!(
        c.policy.levels(DetectorKind::Repeat).terminate_at,
        Some(6.0)
    );
    assert_eq!(c.policy.levels(DetectorKind::Stall).mode, Mode::Shadow);
}

#[test]
fn cap_warnings_follow_a_new_limit() {
    let c = cfg("[detectors.turn_cap]\nterminate_at = 100\n").unwrap();
    let p = c.policy.levels(DetectorKind::TurnCap);
    assert_eq!(
        (p.warn_at, p.critical_at, p.terminate_at),
        (Some(80.0), Some(90.0), Some(100.0))
    );
}

#[test]
fn overrides_apply_by_tenant_agent_and_tool() {
    let c = cfg(r#"
        [[overrides]]
        tenant = "acme"
        agent = "coder-*"
        mode = "warn"
        [overrides.detectors.stall]
        terminate_at = "off"

        [[overrides]]
        tool = "deploy*"
        [overrides.detectors.repeat]
        terminate_at = 10
        "#)
    .unwrap();
    let p = c.policy_for(Some("acme"), Some("coder-7"));
    assert_eq!(p.levels(DetectorKind::Stall).terminate_at, None);
    assert_eq!(p.levels(DetectorKind::Repeat).mode, Mode::Warn);
    let other = c.policy_for(Some("acme"), Some("writer"));
    assert_eq!(other.levels(DetectorKind::Stall).terminate_at, Some(5.0));
    let tool = c
        .policy_for_tool(&other, None, None, "deploy_app", None)
        .unwrap();
    assert_eq!(tool.levels(DetectorKind::Repeat).terminate_at, Some(10.0));
    assert!(c
        .policy_for_tool(&other, None, None, "read", None)
        .is_none());
}

#[test]
fn tool_overrides_only_take_per_tool_detectors() {
    let err =
        cfg("[[overrides]]\ntool = \"x\"\n[overrides.detectors.stall]\nwarn_at = 1\n").unwrap_err();
    assert_eq!(err.key_errors()[0].key, "overrides[0].detectors.stall");
}

#[test]
fn claude_codes_edit_tools_are_writes_and_globs_match_case_and_all() {
    let default = cfg("").unwrap();
    for write in [
        "Edit",
        "MultiEdit",
        "Write",
        "NotebookEdit",
        "str_replace_editor",
        "apply_patch",
    ] {
        assert!(default.tools.classify(write, None).write, "{write}");
    }
    // A case-blind match would take a todo list, an editor's diagnostics, a waitlist and
    // a poll's creation for writes, waits and polls.
    for name in ["TodoWrite", "GetEditorDiagnostics", "Read"] {
        assert!(!default.tools.classify(name, None).write, "{name}");
    }
    assert!(!default.tools.classify("CheckWaitlist", None).wait);
    assert!(!default.tools.classify("CreatePoll", None).poll);
}

#[test]
fn wait_tools_are_classed_by_their_globs_and_default_to_sleeps_and_waits() {
    let default = cfg("").unwrap();
    assert!(default.tools.classify("sleep", None).wait);
    assert!(default.tools.classify("wait_for_job", None).wait);
    assert!(!default.tools.classify("get_status", None).wait);
    let own = cfg("[tools]\nwait = [\"pause\"]\n").unwrap();
    assert!(own.tools.classify("pause", None).wait);
    assert!(!own.tools.classify("sleep", None).wait);
    let again = cfg(&own.effective_toml()).unwrap();
    assert_eq!(again.tools.wait_globs, ["pause"]);
}

#[test]
fn effective_toml_reparses_to_the_same_policy() {
    let c = cfg("mode = \"warn\"\n[detectors.cycle]\nwarn_at = 3\n").unwrap();
    let again = cfg(&c.effective_toml()).unwrap();
    assert_eq!(again.policy, c.policy);
}

#[test]
fn the_parse_limits_stay_within_what_the_parsers_and_the_producer_take() {
    use crate::contract::event::{MAX_EVENT_BYTES_LIMIT, MAX_NESTING_LIMIT};
    let ok = cfg(&format!(
        "[engine]\nmax_nesting = {MAX_NESTING_LIMIT}\nmax_event_bytes = {MAX_EVENT_BYTES_LIMIT}\n"
    ))
    .unwrap();
    assert_eq!(ok.limits.max_nesting, 127);
    // One level more, serde_json refuses; bytes past the limit would overflow the
    // producer's message limit (twice it and 64 KiB).
    let err = cfg(&format!(
        "[engine]\nmax_nesting = 128\nmax_event_bytes = {}\n",
        MAX_EVENT_BYTES_LIMIT + 1
    ))
    .unwrap_err();
    let keys: Vec<&str> = err.key_errors().iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        ["engine.max_event_bytes", "engine.max_nesting"],
        "{err}"
    );
    assert!(cfg("[engine]\nmax_event_bytes = 9223372036854775807\n").is_err());
}

#[test]
fn an_override_names_a_long_agent_whole_or_by_its_start() {
    let with = |agent: &str| {
        cfg(&format!(
            "[[overrides]]\nagent = \"{agent}\"\n[overrides.detectors.stall]\nterminate_at = 6\n"
        ))
    };
    let id = format!(
        "arn:aws:bedrock:us-east-1:123456789012:agent-alias/{}",
        "A".repeat(100)
    );
    // Whole, or by a start an id's kept form holds.
    with(&id).unwrap();
    with(&format!("{}*", &id[..100])).unwrap();
    // A start longer than any label is kept: it could match no session.
    let err = with(&format!("{}*", &id[..140])).unwrap_err();
    let errors = err.key_errors();
    assert_eq!(errors.len(), 1, "{err}");
    assert_eq!(errors[0].key, "overrides[0].agent");
    assert!(errors[0].message.contains("starts with 140 bytes"), "{err}");
}

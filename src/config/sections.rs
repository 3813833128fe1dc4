//! The sections that are plain settings — `[engine]`, `[state]`, `[telemetry]`,
//! `[fingerprint]`, `[tools]` — each read raw, validated into its settings (every problem
//! reported under its key), and written back as the effective TOML `check-config` prints.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Deserialize;
use toml::Value as V;

use super::raw::section;
use super::{
    Errors, DEFAULT_FUTURE_GRACE_SECS, DEFAULT_HTTP_LISTEN, DEFAULT_POLL_GLOBS,
    DEFAULT_SESSION_GAP_SECS, DEFAULT_SPANS_TOPIC, DEFAULT_STATE_CACHE_MIB, DEFAULT_STATE_PATH,
    DEFAULT_WAIT_GLOBS, DEFAULT_WRITE_GLOBS, DEFAULT_WRITE_STALL_SECS, MAX_FUTURE_GRACE_SECS,
    MAX_SESSION_GAP_SECS, MAX_STATE_CACHE_MIB, MAX_WRITE_STALL_SECS,
};
use crate::contract::event::{
    ParseLimits, DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_NESTING, MAX_EVENT_BYTES_LIMIT,
    MAX_NESTING_LIMIT,
};
use crate::engine::fingerprint::{BuiltinPattern, FingerprintSpec};
use crate::engine::levels::DEFAULT_GRACE_STEPS;
use crate::telemetry::spans;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEngine {
    session_gap_secs: Option<u64>,
    future_grace_secs: Option<u64>,
    max_event_bytes: Option<usize>,
    max_nesting: Option<usize>,
    grace_steps: Option<u32>,
}

/// Settings of the engine itself.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSettings {
    /// Event-time gap after which a silent session closes, in milliseconds.
    pub session_gap_ms: i64,
    /// How far after its processing time (`run`'s host clock) an event's time may move its
    /// partition's clock, in milliseconds; a later time moves it to this limit only.
    pub future_grace_ms: i64,
    /// The loop detectors' default `grace_steps` (nudge before kill).
    pub grace_steps: u32,
}

/// `[engine]`: the engine's settings and the limits of one event.
pub(super) fn engine(table: &toml::Table, errors: &mut Errors) -> (EngineSettings, ParseLimits) {
    let engine: RawEngine = section(table, "engine", errors);
    let gap = engine.session_gap_secs.unwrap_or(DEFAULT_SESSION_GAP_SECS);
    // At most a century: beyond it, no session is meant to stay open, and the gap in
    // milliseconds must fit event times.
    if gap == 0 || gap > MAX_SESSION_GAP_SECS {
        errors.push(
            "engine.session_gap_secs",
            format!("must be > 0 and at most {MAX_SESSION_GAP_SECS} (a century)"),
        );
    }
    // Below the gap: an event up to the grace ahead still moves its partition's clock, and
    // one a gap ahead closes every session there as idle.
    let future_grace = match engine.future_grace_secs {
        None => DEFAULT_FUTURE_GRACE_SECS.min(gap / 2),
        Some(grace) if grace > MAX_FUTURE_GRACE_SECS => {
            errors.push(
                "engine.future_grace_secs",
                format!("{grace} is not a grace: 0 to {MAX_FUTURE_GRACE_SECS} (seconds, a day)"),
            );
            grace
        }
        Some(grace) if grace >= gap => {
            errors.push(
                "engine.future_grace_secs",
                format!("{grace} must be below engine.session_gap_secs ({gap}): an event this far ahead of its message's timestamp or the host's clock still moves its partition's clock, and would close every session there as idle"),
            );
            grace
        }
        Some(grace) => grace,
    };
    let limits = ParseLimits {
        max_event_bytes: engine.max_event_bytes.unwrap_or(DEFAULT_MAX_EVENT_BYTES),
        max_nesting: engine.max_nesting.unwrap_or(DEFAULT_MAX_NESTING),
    };
    if !(64..=MAX_EVENT_BYTES_LIMIT).contains(&limits.max_event_bytes) {
        errors.push(
            "engine.max_event_bytes",
            format!("must be 64..={MAX_EVENT_BYTES_LIMIT} (256 MiB)"),
        );
    }
    if !(2..=MAX_NESTING_LIMIT).contains(&limits.max_nesting) {
        errors.push(
            "engine.max_nesting",
            format!("must be 2..={MAX_NESTING_LIMIT}"),
        );
    }
    let settings = EngineSettings {
        session_gap_ms: (gap as i64).saturating_mul(1000),
        future_grace_ms: (future_grace.min(MAX_FUTURE_GRACE_SECS) as i64) * 1000,
        grace_steps: engine.grace_steps.unwrap_or(DEFAULT_GRACE_STEPS),
    };
    (settings, limits)
}

pub(super) fn engine_toml(settings: &EngineSettings, limits: &ParseLimits) -> toml::Table {
    let mut engine = toml::Table::new();
    engine.insert(
        "session_gap_secs".into(),
        V::Integer(settings.session_gap_ms / 1000),
    );
    engine.insert(
        "future_grace_secs".into(),
        V::Integer(settings.future_grace_ms / 1000),
    );
    engine.insert(
        "max_event_bytes".into(),
        V::Integer(limits.max_event_bytes as i64),
    );
    engine.insert("max_nesting".into(), V::Integer(limits.max_nesting as i64));
    engine.insert(
        "grace_steps".into(),
        V::Integer(settings.grace_steps as i64),
    );
    engine
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawState {
    path: Option<String>,
    cache_mib: Option<u64>,
    write_stall_secs: Option<u64>,
}

/// `[state]`: the store's directory, sled's page cache in bytes, and how long a store
/// write may last before the process counts as stuck.
pub(super) fn state(table: &toml::Table, errors: &mut Errors) -> (PathBuf, u64, Duration) {
    let state: RawState = section(table, "state", errors);
    let write_stall_secs = state.write_stall_secs.unwrap_or(DEFAULT_WRITE_STALL_SECS);
    if !(1..=MAX_WRITE_STALL_SECS).contains(&write_stall_secs) {
        errors.push(
            "state.write_stall_secs",
            format!("{write_stall_secs} is not a duration: 1 to {MAX_WRITE_STALL_SECS} (seconds)"),
        );
    }
    let cache_mib = state.cache_mib.unwrap_or(DEFAULT_STATE_CACHE_MIB);
    if !(1..=MAX_STATE_CACHE_MIB).contains(&cache_mib) {
        errors.push(
            "state.cache_mib",
            format!("{cache_mib} is not a cache size: 1 to {MAX_STATE_CACHE_MIB} (MiB)"),
        );
    }
    if state.path.as_deref().is_some_and(|p| p.trim().is_empty()) {
        errors.push(
            "state.path",
            "must name a directory (empty, the store would be written into the working directory)",
        );
    }
    let path = PathBuf::from(state.path.unwrap_or_else(|| DEFAULT_STATE_PATH.to_string()));
    (
        path,
        cache_mib.saturating_mul(1024 * 1024),
        Duration::from_secs(write_stall_secs),
    )
}

pub(super) fn state_toml(
    path: &std::path::Path,
    cache_bytes: u64,
    write_stall: Duration,
) -> toml::Table {
    let mut state = toml::Table::new();
    state.insert("path".into(), V::String(path.display().to_string()));
    state.insert(
        "cache_mib".into(),
        V::Integer((cache_bytes / (1024 * 1024)) as i64),
    );
    state.insert(
        "write_stall_secs".into(),
        V::Integer(write_stall.as_secs() as i64),
    );
    state
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTelemetry {
    http_listen: Option<String>,
    otlp_endpoint: Option<String>,
    otlp_protocol: Option<String>,
    spans_to_kafka: Option<bool>,
    spans_topic: Option<String>,
    owner_series_limit: Option<usize>,
}

/// The `[telemetry]` section.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetrySettings {
    /// `host:port` of the HTTP endpoint; `None` (configured as "") turns it off.
    pub http_listen: Option<String>,
    /// Where spans go over OTLP; `None`: the standard `OTEL_EXPORTER_OTLP_*` variables
    /// decide (no endpoint there either: no OTLP export).
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf`; `None`: `OTEL_EXPORTER_OTLP_PROTOCOL`, else `grpc`.
    pub otlp_protocol: Option<String>,
    /// Whether spans are also produced onto `spans_topic` (OTLP protobuf).
    pub spans_to_kafka: bool,
    pub spans_topic: String,
    /// Distinct (tenant, agent) pairs with their own series in
    /// `loopwarden_findings_by_owner_total`; later ones count as `(other)`.
    pub owner_series_limit: usize,
}

impl TelemetrySettings {
    /// `[telemetry]`, on its own (whether its spans topic is free is the caller's check).
    pub(super) fn parse(table: &toml::Table, errors: &mut Errors) -> TelemetrySettings {
        let raw: RawTelemetry = section(table, "telemetry", errors);
        let http_listen = raw
            .http_listen
            .unwrap_or_else(|| DEFAULT_HTTP_LISTEN.to_string());
        let http_listen = (!http_listen.trim().is_empty()).then_some(http_listen);
        if let Some(addr) = &http_listen {
            if addr.parse::<std::net::SocketAddr>().is_err() {
                errors.push(
                    "telemetry.http_listen",
                    format!("`{addr}` is not an ip:port address (e.g. 0.0.0.0:9464; \"\" turns the endpoint off)"),
                );
            }
        }
        let nonempty = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
        let otlp_protocol = nonempty(raw.otlp_protocol);
        if let Some(p) = &otlp_protocol {
            if p != "grpc" && p != "http/protobuf" {
                errors.push(
                    "telemetry.otlp_protocol",
                    format!("`{p}` is not an OTLP protocol: grpc or http/protobuf"),
                );
            }
        }
        let otlp_endpoint = nonempty(raw.otlp_endpoint);
        if let Some(e) = &otlp_endpoint {
            if !spans::plain_http_endpoint(e) {
                errors.push("telemetry.otlp_endpoint", spans::not_plain_http(e));
            }
        }
        let spans_topic = raw
            .spans_topic
            .unwrap_or_else(|| DEFAULT_SPANS_TOPIC.to_string());
        if !crate::bus::kafka::settings::valid_topic(&spans_topic) {
            errors.push(
                "telemetry.spans_topic",
                crate::bus::kafka::settings::invalid_topic(&spans_topic),
            );
        }
        TelemetrySettings {
            http_listen,
            otlp_endpoint,
            otlp_protocol,
            spans_to_kafka: raw.spans_to_kafka.unwrap_or(false),
            spans_topic,
            owner_series_limit: raw
                .owner_series_limit
                .unwrap_or(crate::telemetry::metrics::DEFAULT_OWNER_SERIES_LIMIT),
        }
    }

    /// Where the environment sends spans when the file does not say
    /// (`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`, unless `OTEL_SDK_DISABLED=true` or
    /// `OTEL_TRACES_EXPORTER=none`): an endpoint that is not plain http is an error here,
    /// so that `check-config` finds it before `run` refuses to start on it.
    pub(super) fn check_otel_env(&self, otel: &[(String, String)], errors: &mut Errors) {
        // The last value of a name, as the process would see it; empty is unset.
        let var = |name: &str| {
            otel.iter()
                .rev()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .filter(|v| !v.trim().is_empty())
        };
        if self.otlp_endpoint.is_some() || spans::export_disabled(var) {
            return;
        }
        if let Some((name, endpoint)) = spans::env_otlp_endpoint(var) {
            if !spans::plain_http_endpoint(&endpoint) {
                errors.push(name, spans::not_plain_http(&endpoint));
            }
        }
    }

    pub(super) fn to_toml(&self) -> toml::Table {
        let text = |v: &Option<String>| V::String(v.clone().unwrap_or_default());
        let mut telemetry = toml::Table::new();
        telemetry.insert("http_listen".into(), text(&self.http_listen));
        telemetry.insert("otlp_endpoint".into(), text(&self.otlp_endpoint));
        telemetry.insert("otlp_protocol".into(), text(&self.otlp_protocol));
        telemetry.insert("spans_to_kafka".into(), V::Boolean(self.spans_to_kafka));
        telemetry.insert("spans_topic".into(), V::String(self.spans_topic.clone()));
        telemetry.insert(
            "owner_series_limit".into(),
            V::Integer(self.owner_series_limit as i64),
        );
        telemetry
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFingerprint {
    volatile_arg_keys: Option<Vec<String>>,
    volatile_result_keys: Option<Vec<String>>,
    extra_volatile_arg_keys: Option<Vec<String>>,
    extra_volatile_result_keys: Option<Vec<String>>,
    volatile_value_patterns: Option<Vec<String>>,
    pending_terms: Option<Vec<String>>,
    pending_status_terms: Option<Vec<String>>,
}

/// `[fingerprint]`, with `[tools].ignore_args` (the arguments a tool's fingerprint leaves
/// out).
pub(super) fn fingerprint(
    table: &toml::Table,
    ignore_args: BTreeMap<String, Vec<String>>,
    errors: &mut Errors,
) -> FingerprintSpec {
    let fp: RawFingerprint = section(table, "fingerprint", errors);
    let mut spec = FingerprintSpec::default();
    if let Some(k) = fp.volatile_arg_keys {
        spec.volatile_arg_keys = k;
    }
    if let Some(k) = fp.volatile_result_keys {
        spec.volatile_result_keys = k;
    }
    spec.volatile_arg_keys
        .extend(fp.extra_volatile_arg_keys.unwrap_or_default());
    spec.volatile_result_keys
        .extend(fp.extra_volatile_result_keys.unwrap_or_default());
    if let Some(patterns) = fp.volatile_value_patterns {
        spec.builtin_patterns.clear();
        for (i, p) in patterns.iter().enumerate() {
            let key = || format!("fingerprint.volatile_value_patterns[{i}]");
            if let Some(b) = BuiltinPattern::parse(p) {
                spec.builtin_patterns.push(b);
            } else if let Some(re) = p.strip_prefix("re:") {
                match regex::bytes::Regex::new(re) {
                    Ok(r) => spec.custom_patterns.push(r),
                    Err(e) => errors.push(key(), format!("bad regex: {e}")),
                }
            } else {
                errors.push(
                    key(),
                    format!("\"{p}\" is neither uuid, rfc3339 nor re:<regex>"),
                );
            }
        }
    }
    if let Some(t) = fp.pending_terms {
        spec.pending_terms = t;
    }
    if let Some(t) = fp.pending_status_terms {
        spec.pending_status_terms = t;
    }
    spec.ignore_args = ignore_args.into_iter().collect();
    spec
}

pub(super) fn fingerprint_toml(spec: &FingerprintSpec) -> toml::Table {
    let mut fp = toml::Table::new();
    fp.insert("volatile_arg_keys".into(), strings(&spec.volatile_arg_keys));
    fp.insert(
        "volatile_result_keys".into(),
        strings(&spec.volatile_result_keys),
    );
    let mut patterns: Vec<String> = spec
        .builtin_patterns
        .iter()
        .map(|b| match b {
            BuiltinPattern::Uuid => "uuid".to_string(),
            BuiltinPattern::Rfc3339 => "rfc3339".to_string(),
        })
        .collect();
    patterns.extend(
        spec.custom_patterns
            .iter()
            .map(|r| format!("re:{}", r.as_str())),
    );
    fp.insert("volatile_value_patterns".into(), strings(&patterns));
    fp.insert("pending_terms".into(), strings(&spec.pending_terms));
    fp.insert(
        "pending_status_terms".into(),
        strings(&spec.pending_status_terms),
    );
    fp
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTools {
    poll: Option<Vec<String>>,
    wait: Option<Vec<String>>,
    write: Option<Vec<String>>,
    retry_safe: Option<Vec<String>>,
    ignore_args: Option<BTreeMap<String, Vec<String>>>,
}

/// Tool classes by glob on the tool name or on `tool.action`.
#[derive(Debug, Clone)]
pub struct ToolClassifier {
    poll: GlobSet,
    wait: GlobSet,
    write: GlobSet,
    retry_safe: GlobSet,
    pub poll_globs: Vec<String>,
    pub wait_globs: Vec<String>,
    pub write_globs: Vec<String>,
    pub retry_safe_globs: Vec<String>,
}

/// The classes one tool name belongs to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolClasses {
    pub poll: bool,
    /// A call that lets time pass (`sleep`, `wait`): the agent waiting on something.
    pub wait: bool,
    pub write: bool,
    pub retry_safe: bool,
}

impl ToolClassifier {
    /// `[tools]`: the classifier, and `ignore_args` (the fingerprint's).
    pub(super) fn parse(
        table: &toml::Table,
        errors: &mut Errors,
    ) -> (ToolClassifier, BTreeMap<String, Vec<String>>) {
        let tools: RawTools = section(table, "tools", errors);
        let default = |globs: &[&str]| globs.iter().map(|s| s.to_string()).collect();
        let poll_globs = tools.poll.unwrap_or_else(|| default(DEFAULT_POLL_GLOBS));
        let wait_globs = tools.wait.unwrap_or_else(|| default(DEFAULT_WAIT_GLOBS));
        let write_globs = tools.write.unwrap_or_else(|| default(DEFAULT_WRITE_GLOBS));
        let retry_safe_globs = tools.retry_safe.unwrap_or_default();
        let classifier = ToolClassifier {
            poll: globset(&poll_globs, "tools.poll", errors),
            wait: globset(&wait_globs, "tools.wait", errors),
            write: globset(&write_globs, "tools.write", errors),
            retry_safe: globset(&retry_safe_globs, "tools.retry_safe", errors),
            poll_globs,
            wait_globs,
            write_globs,
            retry_safe_globs,
        };
        (classifier, tools.ignore_args.unwrap_or_default())
    }

    /// Whether any tool is a wait (`tools.wait = []` turns waits off, shell sleeps
    /// included).
    pub fn has_waits(&self) -> bool {
        !self.wait_globs.is_empty()
    }

    /// Classes of a call; `action_name` is `tool.action` when `args.action` is a string.
    pub fn classify(&self, tool: &str, action_name: Option<&str>) -> ToolClasses {
        let hit =
            |set: &GlobSet| set.is_match(tool) || action_name.is_some_and(|a| set.is_match(a));
        ToolClasses {
            poll: hit(&self.poll),
            wait: hit(&self.wait),
            write: hit(&self.write),
            retry_safe: hit(&self.retry_safe),
        }
    }

    pub(super) fn to_toml(&self, ignore_args: &[(String, Vec<String>)]) -> toml::Table {
        let mut tools = toml::Table::new();
        tools.insert("poll".into(), strings(&self.poll_globs));
        tools.insert("wait".into(), strings(&self.wait_globs));
        tools.insert("write".into(), strings(&self.write_globs));
        tools.insert("retry_safe".into(), strings(&self.retry_safe_globs));
        let mut ignore = toml::Table::new();
        for (tool, keys) in ignore_args {
            ignore.insert(tool.clone(), strings(keys));
        }
        tools.insert("ignore_args".into(), V::Table(ignore));
        tools
    }
}

fn globset(globs: &[String], key: &str, errors: &mut Errors) -> GlobSet {
    let mut b = GlobSetBuilder::new();
    for (i, g) in globs.iter().enumerate() {
        match Glob::new(g) {
            Ok(g) => {
                b.add(g);
            }
            Err(e) => errors.push(format!("{key}[{i}]"), format!("bad glob: {e}")),
        }
    }
    b.build().unwrap_or_else(|_| GlobSet::empty())
}

/// A TOML array of strings.
fn strings(v: &[String]) -> V {
    V::Array(v.iter().cloned().map(V::String).collect())
}

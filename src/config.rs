//! Configuration (DESIGN §7): `loopwarden.toml` plus `LOOPWARDEN_…` environment
//! overrides, parsed raw (unknown keys rejected, named defaults, unit suffixes), then
//! validated without I/O.
//!
//! Guarantees: every problem of a file is reported at once, each with its key path; a
//! [`Config`] that exists is valid; resolving the policy of a tenant / agent / tool never
//! fails. All errors here are fatal: the process refuses to start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use globset::{Glob, GlobMatcher, GlobSet, GlobSetBuilder};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::detectors::settings::Threshold;
use crate::detectors::{Class, DetectorKind};
use crate::event::{ParseLimits, DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_NESTING};
use crate::fingerprint::{BuiltinPattern, FingerprintSpec};
use crate::ingest::{OtlpIngest, RawIngest};
use crate::kafka::settings::{KafkaSettings, RawKafka};
use crate::policy::{Levels, Mode, Policy, DEFAULT_GRACE_STEPS};

/// Default event-time gap after which a silent session closes.
pub const DEFAULT_SESSION_GAP_SECS: u64 = 30 * 60;
/// Default on-disk state directory.
pub const DEFAULT_STATE_PATH: &str = "./loopwarden-state";
/// sled's page cache, MiB (`state.cache_mib`): bounded, where sled's own default (1 GiB)
/// lets a long-running process grow toward it as the state churns.
pub const DEFAULT_STATE_CACHE_MIB: u64 = 32;
/// The largest `state.cache_mib` accepted (64 GiB).
pub const MAX_STATE_CACHE_MIB: u64 = 64 * 1024;
/// Environment variables with this prefix override file keys (`__` separates levels).
pub const ENV_PREFIX: &str = "LOOPWARDEN_";

/// The longest `engine.session_gap_secs`: a century.
pub const MAX_SESSION_GAP_SECS: u64 = 100 * 365 * 24 * 3600;
/// Environment variables under the prefix that are not config keys: the command line's
/// own (`--config`, `--log-format`, `--threads`) and the development tools' (broker and
/// promtool scripts, tests, benchmarks), so that setting one never fails a command.
pub const RESERVED_ENV: &[&str] = &[
    "LOOPWARDEN_CONFIG",
    "LOOPWARDEN_LOG_FORMAT",
    "LOOPWARDEN_THREADS",
    "LOOPWARDEN_BROKER_PORT",
    "LOOPWARDEN_BROKER_DIR",
    "LOOPWARDEN_PROMTOOL_DIR",
    "LOOPWARDEN_DEBIAN_MIRROR",
    "LOOPWARDEN_TEST_BROKERS",
    "LOOPWARDEN_CRASH_SEED",
    "LOOPWARDEN_RECORD_REPLAY",
    "LOOPWARDEN_OTEL_DIR",
];
/// Prefix of the benchmarks' variables (`LOOPWARDEN_BENCH_RATE`, …), not config keys.
pub const RESERVED_ENV_PREFIX: &str = "LOOPWARDEN_BENCH_";

/// Default globs of tools that wait on something (DESIGN §3).
pub const DEFAULT_POLL_GLOBS: &[&str] = &["*status*", "*poll*", "*wait*", "*sleep*", "process.log"];
/// Default globs of tools whose unchanged result means an edit did not take.
pub const DEFAULT_WRITE_GLOBS: &[&str] =
    &["*write*", "*edit*", "*replace*", "*patch*", "*apply_diff*"];

/// One problem with one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Why a configuration was refused (always fatal).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // The cause is said by the error chain (`{:#}`), not twice.
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: invalid TOML: {message}")]
    Syntax { origin: String, message: String },
    #[error("{origin}: {} error(s):\n{}", .errors.len(), .errors.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        origin: String,
        errors: Vec<KeyError>,
    },
}

impl ConfigError {
    pub fn key_errors(&self) -> &[KeyError] {
        match self {
            ConfigError::Invalid { errors, .. } => errors,
            _ => &[],
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEngine {
    session_gap_secs: Option<u64>,
    max_event_bytes: Option<usize>,
    max_nesting: Option<usize>,
    grace_steps: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawState {
    path: Option<String>,
    cache_mib: Option<u64>,
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

/// The topic spans go to when `telemetry.spans_to_kafka` is on.
pub const DEFAULT_SPANS_TOPIC: &str = "otlp_spans";

/// Where `loopwarden run` serves `/metrics`, `/healthz` and `/readyz` by default (the
/// OpenTelemetry Prometheus exporter's customary port).
pub const DEFAULT_HTTP_LISTEN: &str = "0.0.0.0:9464";

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

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFingerprint {
    volatile_arg_keys: Option<Vec<String>>,
    volatile_result_keys: Option<Vec<String>>,
    extra_volatile_arg_keys: Option<Vec<String>>,
    extra_volatile_result_keys: Option<Vec<String>>,
    volatile_value_patterns: Option<Vec<String>>,
    pending_terms: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTools {
    poll: Option<Vec<String>>,
    write: Option<Vec<String>>,
    retry_safe: Option<Vec<String>>,
    ignore_args: Option<BTreeMap<String, Vec<String>>>,
}

/// One `[detectors.<name>]` table: the levels every detector takes, and the rest, which
/// is the detector's own settings (read through its own type).
#[derive(Debug, Clone, Default)]
struct DetectorTable {
    mode: Option<Mode>,
    grace_steps: Option<u32>,
    warn_at: Option<Threshold>,
    critical_at: Option<Threshold>,
    terminate_at: Option<Threshold>,
    settings: toml::Table,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverride {
    tenant: Option<String>,
    agent: Option<String>,
    tool: Option<String>,
    mode: Option<String>,
    #[serde(default)]
    detectors: BTreeMap<String, toml::Value>,
}

/// Settings of the engine itself.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSettings {
    /// Event-time gap after which a silent session closes, in milliseconds.
    pub session_gap_ms: i64,
    /// The loop detectors' default `grace_steps` (nudge before kill).
    pub grace_steps: u32,
}

/// Tool classes by glob on the tool name or on `tool.action`.
#[derive(Debug, Clone)]
pub struct ToolClassifier {
    poll: GlobSet,
    write: GlobSet,
    retry_safe: GlobSet,
    pub poll_globs: Vec<String>,
    pub write_globs: Vec<String>,
    pub retry_safe_globs: Vec<String>,
}

/// The classes one tool name belongs to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolClasses {
    pub poll: bool,
    pub write: bool,
    pub retry_safe: bool,
}

impl ToolClassifier {
    /// Classes of a call; `action_name` is `tool.action` when `args.action` is a string.
    pub fn classify(&self, tool: &str, action_name: Option<&str>) -> ToolClasses {
        let hit =
            |set: &GlobSet| set.is_match(tool) || action_name.is_some_and(|a| set.is_match(a));
        ToolClasses {
            poll: hit(&self.poll),
            write: hit(&self.write),
            retry_safe: hit(&self.retry_safe),
        }
    }
}

/// A policy override for a tenant, an agent glob and/or a tool glob.
#[derive(Debug, Clone)]
pub struct Override {
    pub tenant: Option<String>,
    pub agent: Option<GlobMatcher>,
    pub tool: Option<GlobMatcher>,
    pub mode: Option<Mode>,
    detectors: Vec<(DetectorKind, DetectorTable)>,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub engine: EngineSettings,
    pub limits: ParseLimits,
    pub state_path: PathBuf,
    /// sled's page cache, bytes.
    pub state_cache_bytes: u64,
    pub fingerprint: FingerprintSpec,
    pub tools: ToolClassifier,
    pub policy: Policy,
    pub overrides: Vec<Override>,
    pub kafka: KafkaSettings,
    pub telemetry: TelemetrySettings,
    /// `[ingest.otlp]`: OTLP traces on the bus mapped to events, when on.
    pub ingest: Option<OtlpIngest>,
    /// `ingest.otlp.session_attribute`: names sessions in the OTLP mapping, of the bus
    /// ingest and of OTLP JSON files (`replay`, `backtest`) alike.
    pub otlp_session_attribute: Option<String>,
    /// The merged TOML this config was built from (for `check-config`).
    effective: toml::Table,
}

impl Default for Config {
    fn default() -> Self {
        Config::from_toml_str("", "defaults", std::iter::empty()).expect("the defaults are valid")
    }
}

struct Errors {
    list: Vec<KeyError>,
}

impl Errors {
    fn push(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.list.push(KeyError {
            key: key.into(),
            message: message.into(),
        });
    }
}

fn section<T: DeserializeOwned + Default>(
    table: &toml::Table,
    name: &str,
    errors: &mut Errors,
) -> T {
    match table.get(name) {
        None => T::default(),
        Some(v) => decode(v.clone(), name, errors).unwrap_or_default(),
    }
}

/// Decodes `value` (the config's `key`), reporting every key of it serde refuses, not only
/// the first: each refused key is taken out and the rest decoded again. Any refused key
/// makes the whole value `None`, so that no check runs on defaults standing in for it.
fn decode<T: DeserializeOwned>(
    mut value: toml::Value,
    key: &str,
    errors: &mut Errors,
) -> Option<T> {
    let mut refused = false;
    // Bounded: each round takes a key out (and a value has few).
    for _ in 0..256 {
        let e = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
            Ok(v) => return (!refused).then_some(v),
            Err(e) => e,
        };
        refused = true;
        let path = e.path().to_string();
        let full = if path == "." || path.is_empty() {
            key.to_string()
        } else {
            format!("{key}.{path}")
        };
        errors.push(full, e.inner().message().to_string());
        let mut segments: Vec<&serde_path_to_error::Segment> = e.path().iter().collect();
        // An array loses the whole of it: taking one item out would shift the indices
        // of the others, and a later error would name the wrong one.
        while matches!(
            segments.last(),
            Some(serde_path_to_error::Segment::Seq { .. })
        ) {
            segments.pop();
        }
        if !remove_at(&mut value, &segments) {
            break;
        }
    }
    None
}

/// Takes the table entry at `path` out of `value`; false when there is none (`decode`
/// never takes out an array's item).
fn remove_at(value: &mut toml::Value, path: &[&serde_path_to_error::Segment]) -> bool {
    use serde_path_to_error::Segment;
    let Some((Segment::Map { key: last }, parents)) = path.split_last() else {
        return false;
    };
    let mut cursor = value;
    for seg in parents {
        let next = match (seg, cursor) {
            (Segment::Map { key }, toml::Value::Table(t)) => t.get_mut(key.as_str()),
            (Segment::Seq { index }, toml::Value::Array(a)) => a.get_mut(*index),
            _ => None,
        };
        match next {
            Some(v) => cursor = v,
            None => return false,
        }
    }
    match cursor {
        toml::Value::Table(t) => t.remove(last.as_str()).is_some(),
        _ => false,
    }
}

/// Turns floats without a fraction (`20000.0`) into integers, at any depth. TOML written
/// by tools often has them — Helm's `toToml` writes every YAML number as a float — and an
/// integer key (batch sizes, ports, librdkafka properties) would reject them; a float key
/// accepts an integer as well, so nothing else changes.
fn whole_floats_to_integers(table: &mut toml::Table) {
    fn visit(value: &mut toml::Value) {
        match value {
            toml::Value::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                *value = toml::Value::Integer(*f as i64);
            }
            toml::Value::Table(t) => t.iter_mut().for_each(|(_, v)| visit(v)),
            toml::Value::Array(items) => items.iter_mut().for_each(visit),
            _ => {}
        }
    }
    table.iter_mut().for_each(|(_, v)| visit(v));
}

/// The literal start and end of a glob (up to its first and from its last special
/// character), for telling two globs apart without the strings they match.
fn glob_literals(glob: &GlobMatcher) -> (&str, &str) {
    let pattern = glob.glob().glob();
    let special = |c: char| matches!(c, '*' | '?' | '[' | ']' | '{' | '}' | '\\');
    let start = pattern.find(special).map_or(pattern, |i| &pattern[..i]);
    let end = pattern
        .rfind(special)
        .map_or(pattern, |i| &pattern[i + 1..]);
    (start, end)
}

/// Whether no string matches both globs, as far as their literal starts (and, with
/// `ends`, ends) tell: sure when true, a maybe when false.
fn globs_disjoint(a: &GlobMatcher, b: &GlobMatcher, ends: bool) -> bool {
    let ((a_start, a_end), (b_start, b_end)) = (glob_literals(a), glob_literals(b));
    let apart = |x: &str, y: &str, f: fn(&str, &str) -> bool| !f(x, y) && !f(y, x);
    apart(a_start, b_start, |x, y| x.starts_with(y))
        || (ends && apart(a_end, b_end, |x, y| x.ends_with(y)))
}

/// Overrides are checked one by one against the base as they are read; this checks the
/// ones that can apply together (the same session, or call) in the order they would be
/// applied, since one may set `terminate_at` under the `warn_at` another set. Two exact
/// tenants that differ never meet, nor globs whose literal starts (or, for agents, ends)
/// differ; anything else may. Every combination of up to 12 overrides that set
/// detectors is tried (pairs only beyond), the smallest first.
fn check_overrides_together(policy: &Policy, overrides: &[Override], errors: &mut Errors) {
    let setting: Vec<usize> = (0..overrides.len())
        .filter(|&i| !overrides[i].detectors.is_empty())
        .collect();
    let n = setting.len();
    if n < 2 {
        return;
    }
    let meet = |a: &Override, b: &Override| {
        let tenants = match (&a.tenant, &b.tenant) {
            (Some(x), Some(y)) => x == y,
            _ => true,
        };
        let agents = match (&a.agent, &b.agent) {
            (Some(x), Some(y)) => !globs_disjoint(x, y, true),
            _ => true,
        };
        // A tool glob matches a call's tool or its `tool.action` name: only literal
        // starts tell two apart.
        let tools = match (&a.tool, &b.tool) {
            (Some(x), Some(y)) => !globs_disjoint(x, y, false),
            _ => true,
        };
        tenants && agents && tools
    };
    let mut sets: Vec<Vec<usize>> = if n <= 12 {
        (1u32..1 << n)
            .filter(|m| m.count_ones() >= 2)
            .map(|m| {
                (0..n)
                    .filter(|b| m >> b & 1 == 1)
                    .map(|b| setting[b])
                    .collect()
            })
            .collect()
    } else {
        (0..n)
            .flat_map(|a| {
                let setting = &setting;
                (a + 1..n).map(move |b| vec![setting[a], setting[b]])
            })
            .collect()
    };
    // An override that matches wherever all of a set match (its tenant, agent and tool
    // each unset or one of the set's own) always applies with them: it joins the set.
    let implied = |set: &[usize], o: &Override| {
        let tenant = o
            .tenant
            .as_ref()
            .is_none_or(|t| set.iter().any(|&i| overrides[i].tenant.as_ref() == Some(t)));
        let glob = |pick: fn(&Override) -> Option<&GlobMatcher>| {
            pick(o).is_none_or(|g| {
                set.iter().any(|&i| {
                    pick(&overrides[i]).is_some_and(|h| h.glob().glob() == g.glob().glob())
                })
            })
        };
        tenant && glob(|o| o.agent.as_ref()) && glob(|o| o.tool.as_ref())
    };
    for set in &mut sets {
        let joining: Vec<usize> = setting
            .iter()
            .copied()
            .filter(|i| !set.contains(i) && implied(set, &overrides[*i]))
            .collect();
        set.extend(joining);
        set.sort_unstable();
    }
    // The smallest first, each once.
    sets.sort_by(|a, b| (a.len(), a).cmp(&(b.len(), b)));
    sets.dedup();
    let mut reported: Vec<String> = Vec::new();
    for set in sets {
        if !set.iter().enumerate().all(|(x, &a)| {
            set[x + 1..]
                .iter()
                .all(|&b| meet(&overrides[a], &overrides[b]))
        }) {
            continue;
        }
        // Session overrides first, then tool overrides, each in order (`policy_for`,
        // `policy_for_tool`).
        let mut order = set.clone();
        order.sort_by_key(|&i| (overrides[i].tool.is_some(), i));
        let mut p = policy.clone();
        for (at, &i) in order.iter().enumerate() {
            let mut found = Errors { list: Vec::new() };
            for (kind, table) in &overrides[i].detectors {
                apply_detector(
                    *kind,
                    table,
                    &mut p,
                    &format!("overrides[{i}].detectors.{kind}"),
                    &mut found,
                );
            }
            for e in found.list {
                if reported.contains(&e.key) {
                    continue;
                }
                let before: Vec<String> = order[..at]
                    .iter()
                    .map(|j| format!("overrides[{j}]"))
                    .collect();
                reported.push(e.key.clone());
                errors.push(
                    e.key,
                    format!(
                        "{}, applied after {} (which can match the same sessions or calls)",
                        e.message,
                        before.join(", ")
                    ),
                );
            }
        }
    }
}

/// Applies `LOOPWARDEN_A__B=value` as `a.b = value` on `table`; returns which variable
/// set which key (`a.b`), so that an error about a key can name the variable.
fn apply_env(
    table: &mut toml::Table,
    env: impl Iterator<Item = (String, String)>,
    errors: &mut Errors,
) -> Vec<(String, String)> {
    let mut set_by = Vec::new();
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if RESERVED_ENV.contains(&name.as_str())
            || name.starts_with(RESERVED_ENV_PREFIX)
            || rest.is_empty()
        {
            continue;
        }
        let path: Vec<String> = rest.split("__").map(|s| s.to_ascii_lowercase()).collect();
        if path.iter().any(|p| p.is_empty()) {
            errors.push(name.clone(), "empty key segment in environment override");
            continue;
        }
        // A value that parses as TOML (number, bool, array) keeps its type; else a string.
        // librdkafka properties are strings, taken as given: a password such as `1e5` or
        // `"x"` must reach the client unchanged.
        let librdkafka_property = path.len() > 2
            && path[0] == "kafka"
            && matches!(path[1].as_str(), "client" | "consumer" | "producer");
        let value = if librdkafka_property {
            toml::Value::String(raw.clone())
        } else {
            toml::from_str::<toml::Table>(&format!("v = {raw}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(raw.clone()))
        };
        if let Err(seg) = set_path(table, &path, value) {
            errors.push(name.clone(), format!("`{seg}` is not a table"));
            continue;
        }
        set_by.push((path.join("."), name));
    }
    set_by
}

/// Sets `path` in `table`, creating tables on the way; fails on a non-table segment.
fn set_path(table: &mut toml::Table, path: &[String], value: toml::Value) -> Result<(), String> {
    let (last, parents) = path.split_last().expect("path is never empty");
    let mut cursor = table;
    for seg in parents {
        let entry = cursor
            .entry(seg.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cursor = match entry {
            toml::Value::Table(t) => t,
            _ => return Err(seg.clone()),
        };
    }
    cursor.insert(last.clone(), value);
    Ok(())
}

fn mode(raw: &str, key: &str, errors: &mut Errors) -> Option<Mode> {
    let m = Mode::parse(raw);
    if m.is_none() {
        errors.push(
            key,
            format!("unknown mode \"{raw}\" (expected enforce, warn or shadow)"),
        );
    }
    m
}

/// Reads a `[detectors.<name>]` table: the common levels here, the rest is left to the
/// detector's own type (see [`apply_detector`]).
fn detector_table(value: &toml::Value, key: &str, errors: &mut Errors) -> Option<DetectorTable> {
    let Some(table) = value.as_table() else {
        errors.push(key, "must be a table of settings");
        return None;
    };
    let mut settings = table.clone();
    let mut take = |name: &str, errors: &mut Errors| {
        let value = settings.remove(name)?;
        decode::<Threshold>(value, &format!("{key}.{name}"), errors)
    };
    let warn_at = take("warn_at", errors);
    let critical_at = take("critical_at", errors);
    let terminate_at = take("terminate_at", errors);
    let grace_steps = settings
        .remove("grace_steps")
        .and_then(|v| decode::<u32>(v, &format!("{key}.grace_steps"), errors));
    let mode = settings
        .remove("mode")
        .and_then(|v| decode::<String>(v, &format!("{key}.mode"), errors))
        .and_then(|m| mode(&m, &format!("{key}.mode"), errors));
    Some(DetectorTable {
        mode,
        grace_steps,
        warn_at,
        critical_at,
        terminate_at,
        settings,
    })
}

/// Applies one detector table on `policy`, reporting problems under `key`.
fn apply_detector(
    kind: DetectorKind,
    table: &DetectorTable,
    policy: &mut Policy,
    key: &str,
    errors: &mut Errors,
) {
    let levels = policy.levels_mut(kind);
    if let Some(m) = table.mode {
        levels.mode = m;
    }
    if let Some(g) = table.grace_steps {
        levels.grace_steps = g;
    }
    if let Some(t) = table.terminate_at {
        levels.terminate_at = t.get();
        // A budget with only `terminate_at` set keeps its warnings relative to it.
        if kind.class() == Class::Budget {
            let (warn, critical) = Levels::budget_warnings(t.get());
            if table.warn_at.is_none() {
                levels.warn_at = warn;
            }
            if table.critical_at.is_none() {
                levels.critical_at = critical;
            }
        }
    }
    if let Some(t) = table.warn_at {
        levels.warn_at = t.get();
    }
    if let Some(t) = table.critical_at {
        levels.critical_at = t.get();
    }
    if !levels.rise() {
        errors.push(
            key.to_string(),
            {
                let shown = |t: Option<f64>| t.map_or_else(|| "off".to_string(), |v| v.to_string());
                format!(
                    "thresholds must rise (those not off): warn_at {} <= critical_at {} <= terminate_at {}",
                    shown(levels.warn_at),
                    shown(levels.critical_at),
                    shown(levels.terminate_at)
                )
            },
        );
    }
    if let Err(problems) = policy.detectors.configure(kind, &table.settings) {
        for p in problems {
            errors.push(format!("{key}.{}", p.key), p.message);
        }
    }
}

fn detector_tables(
    table: &BTreeMap<String, toml::Value>,
    prefix: &str,
    errors: &mut Errors,
) -> Vec<(DetectorKind, DetectorTable)> {
    let mut out = Vec::new();
    for (name, value) in table {
        let key = format!("{prefix}.{name}");
        let Some(kind) = DetectorKind::from_name(name) else {
            errors.push(
                key,
                format!(
                    "unknown detector (known: {})",
                    DetectorKind::ALL
                        .iter()
                        .map(|k| k.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            continue;
        };
        if let Some(t) = detector_table(value, &key, errors) {
            out.push((kind, t));
        }
    }
    out
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

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

const TOP_LEVEL_KEYS: &[&str] = &[
    "mode",
    "engine",
    "state",
    "fingerprint",
    "tools",
    "detectors",
    "overrides",
    "kafka",
    "telemetry",
    "ingest",
];

impl Config {
    /// Reads and validates a file, then applies environment overrides.
    pub fn load(
        path: &Path,
        env: impl Iterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml_str(&text, &path.display().to_string(), env)
    }

    /// Validates TOML text (`origin` names it in errors), with environment overrides.
    pub fn from_toml_str(
        text: &str,
        origin: &str,
        env: impl Iterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            origin: origin.to_string(),
            message: e.message().to_string()
                + &e.span()
                    .map(|s| format!(" (at byte {})", s.start))
                    .unwrap_or_default(),
        })?;
        let mut errors = Errors { list: Vec::new() };
        let set_by_env = apply_env(&mut table, env, &mut errors);
        whole_floats_to_integers(&mut table);
        for key in table.keys() {
            if !TOP_LEVEL_KEYS.contains(&key.as_str()) {
                errors.push(
                    key.clone(),
                    format!("unknown key (known: {})", TOP_LEVEL_KEYS.join(", ")),
                );
            }
        }
        let engine: RawEngine = section(&table, "engine", &mut errors);
        let state: RawState = section(&table, "state", &mut errors);
        let fp: RawFingerprint = section(&table, "fingerprint", &mut errors);
        let tools: RawTools = section(&table, "tools", &mut errors);
        let global_mode: Option<String> = match table.get("mode") {
            None => None,
            Some(v) => decode(v.clone(), "mode", &mut errors),
        };
        let detectors: BTreeMap<String, toml::Value> = section(&table, "detectors", &mut errors);
        let overrides: Vec<toml::Value> = section(&table, "overrides", &mut errors);
        let raw_telemetry: RawTelemetry = section(&table, "telemetry", &mut errors);
        let http_listen = raw_telemetry
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
        let otlp_endpoint = nonempty(raw_telemetry.otlp_endpoint);
        let otlp_protocol = nonempty(raw_telemetry.otlp_protocol);
        if let Some(p) = &otlp_protocol {
            if p != "grpc" && p != "http/protobuf" {
                errors.push(
                    "telemetry.otlp_protocol",
                    format!("`{p}` is not an OTLP protocol: grpc or http/protobuf"),
                );
            }
        }
        let spans_to_kafka = raw_telemetry.spans_to_kafka.unwrap_or(false);
        let spans_topic = raw_telemetry
            .spans_topic
            .unwrap_or_else(|| DEFAULT_SPANS_TOPIC.to_string());
        if !crate::kafka::settings::valid_topic(&spans_topic) {
            errors.push(
                "telemetry.spans_topic",
                crate::kafka::settings::invalid_topic(&spans_topic),
            );
        }
        let state_cache_mib = state.cache_mib.unwrap_or(DEFAULT_STATE_CACHE_MIB);
        if !(1..=MAX_STATE_CACHE_MIB).contains(&state_cache_mib) {
            errors.push(
                "state.cache_mib",
                format!("{state_cache_mib} is not a cache size: 1 to {MAX_STATE_CACHE_MIB} (MiB)"),
            );
        }
        let owner_series_limit = raw_telemetry
            .owner_series_limit
            .unwrap_or(crate::telemetry::metrics::DEFAULT_OWNER_SERIES_LIMIT);
        let raw_kafka: RawKafka = section(&table, "kafka", &mut errors);
        let mut kafka_errors = Vec::new();
        let kafka = KafkaSettings::validate(raw_kafka, &mut kafka_errors);
        let raw_ingest: RawIngest = section(&table, "ingest", &mut errors);
        let otlp_session_attribute = crate::ingest::session_attribute(&raw_ingest);
        let ingest = OtlpIngest::validate(
            raw_ingest,
            &kafka,
            spans_to_kafka.then_some(spans_topic.as_str()),
            &mut kafka_errors,
        );
        for (key, message) in kafka_errors {
            errors.push(key, message);
        }
        if spans_to_kafka {
            // Spans are OTLP protobuf: on an input topic they would be read back as bad
            // events, on the changelog as broken state.
            let shared = if kafka.input_topics.contains(&spans_topic) {
                Some("an input topic")
            } else {
                (kafka.changelog && kafka.changelog_topic == spans_topic)
                    .then_some("the changelog topic")
            };
            if let Some(other) = shared {
                errors.push(
                    "telemetry.spans_topic",
                    format!("`{spans_topic}` is also {other}: spans need a topic of their own"),
                );
            }
        }

        if state.path.as_deref().is_some_and(|p| p.trim().is_empty()) {
            errors.push(
                "state.path",
                "must name a directory (empty, the store would be written into the working directory)",
            );
        }
        // engine
        let gap = engine.session_gap_secs.unwrap_or(DEFAULT_SESSION_GAP_SECS);
        // At most a century: beyond it, no session is meant to stay open, and the gap in
        // milliseconds must fit event times.
        if gap == 0 || gap > MAX_SESSION_GAP_SECS {
            errors.push(
                "engine.session_gap_secs",
                format!("must be > 0 and at most {MAX_SESSION_GAP_SECS} (a century)"),
            );
        }
        let limits = ParseLimits {
            max_event_bytes: engine.max_event_bytes.unwrap_or(DEFAULT_MAX_EVENT_BYTES),
            max_nesting: engine.max_nesting.unwrap_or(DEFAULT_MAX_NESTING),
        };
        if limits.max_event_bytes < 64 {
            errors.push("engine.max_event_bytes", "must be at least 64");
        }
        if !(2..=128).contains(&limits.max_nesting) {
            errors.push("engine.max_nesting", "must be 2..=128");
        }

        // fingerprint
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
                if let Some(b) = BuiltinPattern::parse(p) {
                    spec.builtin_patterns.push(b);
                } else if let Some(re) = p.strip_prefix("re:") {
                    match regex::bytes::Regex::new(re) {
                        Ok(r) => spec.custom_patterns.push(r),
                        Err(e) => errors.push(
                            format!("fingerprint.volatile_value_patterns[{i}]"),
                            format!("bad regex: {e}"),
                        ),
                    }
                } else {
                    errors.push(
                        format!("fingerprint.volatile_value_patterns[{i}]"),
                        format!("\"{p}\" is neither uuid, rfc3339 nor re:<regex>"),
                    );
                }
            }
        }
        if let Some(t) = fp.pending_terms {
            spec.pending_terms = t;
        }
        spec.ignore_args = tools
            .ignore_args
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();

        // tools
        let poll_globs = tools.poll.unwrap_or_else(|| strings(DEFAULT_POLL_GLOBS));
        let write_globs = tools.write.unwrap_or_else(|| strings(DEFAULT_WRITE_GLOBS));
        let retry_safe_globs = tools.retry_safe.unwrap_or_default();
        let classifier = ToolClassifier {
            poll: globset(&poll_globs, "tools.poll", &mut errors),
            write: globset(&write_globs, "tools.write", &mut errors),
            retry_safe: globset(&retry_safe_globs, "tools.retry_safe", &mut errors),
            poll_globs,
            write_globs,
            retry_safe_globs,
        };

        // policy
        let grace_steps = engine.grace_steps.unwrap_or(DEFAULT_GRACE_STEPS);
        let mut policy = Policy::default();
        for kind in DetectorKind::ALL.iter().filter(|k| !k.is_ceiling()) {
            policy.levels_mut(*kind).grace_steps = grace_steps;
        }
        if let Some(m) = global_mode
            .as_deref()
            .and_then(|m| mode(m, "mode", &mut errors))
        {
            policy.set_mode(m);
        }
        for (kind, table) in detector_tables(&detectors, "detectors", &mut errors) {
            apply_detector(
                kind,
                &table,
                &mut policy,
                &format!("detectors.{kind}"),
                &mut errors,
            );
        }

        // overrides
        let mut parsed_overrides = Vec::new();
        for (i, value) in overrides.into_iter().enumerate() {
            let key = format!("overrides[{i}]");
            let Some(raw) = decode::<RawOverride>(value, &key, &mut errors) else {
                continue;
            };
            if raw.tenant.is_none() && raw.agent.is_none() && raw.tool.is_none() {
                errors.push(key.clone(), "names none of tenant, agent, tool: it would apply to everything (use the top-level settings instead)");
            }
            let glob =
                |g: &Option<String>, field: &str, errors: &mut Errors| -> Option<GlobMatcher> {
                    g.as_ref().and_then(|g| match Glob::new(g) {
                        Ok(g) => Some(g.compile_matcher()),
                        Err(e) => {
                            errors.push(format!("{key}.{field}"), format!("bad glob: {e}"));
                            None
                        }
                    })
                };
            let agent = glob(&raw.agent, "agent", &mut errors);
            let tool = glob(&raw.tool, "tool", &mut errors);
            let o_mode = raw
                .mode
                .as_deref()
                .and_then(|m| mode(m, &format!("{key}.mode"), &mut errors));
            let dets = detector_tables(&raw.detectors, &format!("{key}.detectors"), &mut errors);
            for (kind, d) in &dets {
                if raw.tool.is_some() && !kind.is_per_tool() {
                    let per_tool: Vec<&str> = DetectorKind::ALL
                        .iter()
                        .filter(|k| k.is_per_tool())
                        .map(|k| k.name())
                        .collect();
                    errors.push(
                        format!("{key}.detectors.{kind}"),
                        format!(
                            "{kind} is not judged per tool call; only {} can be set per tool",
                            per_tool.join(", ")
                        ),
                    );
                }
                // Validate against the base so threshold order errors show up now.
                let mut probe = policy.clone();
                apply_detector(
                    *kind,
                    d,
                    &mut probe,
                    &format!("{key}.detectors.{kind}"),
                    &mut errors,
                );
            }
            parsed_overrides.push(Override {
                tenant: raw.tenant,
                agent,
                tool,
                mode: o_mode,
                detectors: dets,
            });
        }

        if errors.list.is_empty() {
            check_overrides_together(&policy, &parsed_overrides, &mut errors);
        }
        if !errors.list.is_empty() {
            // A key the environment set is the variable's doing, not the file's.
            for e in &mut errors.list {
                let by = set_by_env.iter().find(|(path, _)| {
                    e.key == *path
                        || e.key
                            .strip_prefix(path.as_str())
                            .is_some_and(|rest| rest.starts_with(['.', '[']))
                });
                if let Some((_, name)) = by {
                    e.message.push_str(&format!(" (set by {name})"));
                }
            }
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                errors: errors.list,
            });
        }
        Ok(Config {
            engine: EngineSettings {
                session_gap_ms: (gap as i64).saturating_mul(1000),
                grace_steps,
            },
            limits,
            state_path: PathBuf::from(state.path.unwrap_or_else(|| DEFAULT_STATE_PATH.to_string())),
            state_cache_bytes: state_cache_mib.saturating_mul(1024 * 1024),
            fingerprint: spec,
            tools: classifier,
            policy,
            overrides: parsed_overrides,
            kafka,
            telemetry: TelemetrySettings {
                http_listen,
                otlp_endpoint,
                otlp_protocol,
                spans_to_kafka,
                spans_topic,
                owner_series_limit,
            },
            ingest,
            otlp_session_attribute,
            effective: table,
        })
    }

    /// Whether some override is scoped to a tool (the engine then resolves per tool).
    pub fn has_tool_overrides(&self) -> bool {
        self.overrides.iter().any(|o| o.tool.is_some())
    }

    /// The policy of a session: the base with every matching tenant / agent override
    /// applied in file order.
    pub fn policy_for(&self, tenant: Option<&str>, agent: Option<&str>) -> Policy {
        let mut p = self.policy.clone();
        for o in self.overrides.iter().filter(|o| o.tool.is_none()) {
            if Self::matches_session(o, tenant, agent) {
                Self::apply_override(o, &mut p);
            }
        }
        p
    }

    /// The policy of one tool call: the session's policy with the matching tool overrides.
    pub fn policy_for_tool(
        &self,
        session_policy: &Policy,
        tenant: Option<&str>,
        agent: Option<&str>,
        tool: &str,
        action_name: Option<&str>,
    ) -> Option<Policy> {
        let mut out: Option<Policy> = None;
        for o in self.overrides.iter() {
            let Some(t) = &o.tool else { continue };
            if !(t.is_match(tool) || action_name.is_some_and(|a| t.is_match(a)))
                || !Self::matches_session(o, tenant, agent)
            {
                continue;
            }
            let p = out.get_or_insert_with(|| session_policy.clone());
            Self::apply_override(o, p);
        }
        out
    }

    fn matches_session(o: &Override, tenant: Option<&str>, agent: Option<&str>) -> bool {
        let tenant_ok = o.tenant.as_deref().is_none_or(|t| tenant == Some(t));
        let agent_ok = o
            .agent
            .as_ref()
            .is_none_or(|g| agent.is_some_and(|a| g.is_match(a)));
        tenant_ok && agent_ok
    }

    fn apply_override(o: &Override, p: &mut Policy) {
        if let Some(m) = o.mode {
            p.set_mode(m);
        }
        let mut sink = Errors { list: Vec::new() };
        for (kind, table) in &o.detectors {
            apply_detector(*kind, table, p, "", &mut sink);
        }
        debug_assert!(sink.list.is_empty(), "overrides are validated at load");
    }

    /// The effective configuration as TOML: every key with its value in force.
    pub fn effective_toml(&self) -> String {
        use toml::Value as V;
        let arr = |v: &[String]| V::Array(v.iter().cloned().map(V::String).collect());
        let mut root = toml::Table::new();
        let mut engine = toml::Table::new();
        engine.insert(
            "session_gap_secs".into(),
            V::Integer(self.engine.session_gap_ms / 1000),
        );
        engine.insert(
            "max_event_bytes".into(),
            V::Integer(self.limits.max_event_bytes as i64),
        );
        engine.insert(
            "max_nesting".into(),
            V::Integer(self.limits.max_nesting as i64),
        );
        engine.insert(
            "grace_steps".into(),
            V::Integer(self.engine.grace_steps as i64),
        );
        root.insert("engine".into(), V::Table(engine));
        let mut state = toml::Table::new();
        state.insert(
            "path".into(),
            V::String(self.state_path.display().to_string()),
        );
        state.insert(
            "cache_mib".into(),
            V::Integer((self.state_cache_bytes / (1024 * 1024)) as i64),
        );
        root.insert("state".into(), V::Table(state));
        let mut fp = toml::Table::new();
        fp.insert(
            "volatile_arg_keys".into(),
            arr(&self.fingerprint.volatile_arg_keys),
        );
        fp.insert(
            "volatile_result_keys".into(),
            arr(&self.fingerprint.volatile_result_keys),
        );
        let mut patterns: Vec<String> = self
            .fingerprint
            .builtin_patterns
            .iter()
            .map(|b| match b {
                BuiltinPattern::Uuid => "uuid".to_string(),
                BuiltinPattern::Rfc3339 => "rfc3339".to_string(),
            })
            .collect();
        patterns.extend(
            self.fingerprint
                .custom_patterns
                .iter()
                .map(|r| format!("re:{}", r.as_str())),
        );
        fp.insert("volatile_value_patterns".into(), arr(&patterns));
        fp.insert("pending_terms".into(), arr(&self.fingerprint.pending_terms));
        root.insert("fingerprint".into(), V::Table(fp));
        let mut tools = toml::Table::new();
        tools.insert("poll".into(), arr(&self.tools.poll_globs));
        tools.insert("write".into(), arr(&self.tools.write_globs));
        tools.insert("retry_safe".into(), arr(&self.tools.retry_safe_globs));
        let mut ignore = toml::Table::new();
        for (tool, keys) in &self.fingerprint.ignore_args {
            ignore.insert(tool.clone(), arr(keys));
        }
        tools.insert("ignore_args".into(), V::Table(ignore));
        root.insert("tools".into(), V::Table(tools));
        let mut dets = toml::Table::new();
        for kind in DetectorKind::ALL {
            let levels = self.policy.levels(*kind);
            let th = |v: Option<f64>| V::try_from(Threshold(v)).expect("a threshold prints");
            let mut t = self.policy.detectors.settings(*kind);
            t.insert("mode".into(), V::String(levels.mode.name().into()));
            t.insert("grace_steps".into(), V::Integer(levels.grace_steps as i64));
            t.insert("warn_at".into(), th(levels.warn_at));
            t.insert("critical_at".into(), th(levels.critical_at));
            t.insert("terminate_at".into(), th(levels.terminate_at));
            dets.insert(kind.name().to_string(), V::Table(t));
        }
        root.insert("detectors".into(), V::Table(dets));
        root.insert("kafka".into(), V::Table(self.kafka.to_toml()));
        let mut telemetry = toml::Table::new();
        telemetry.insert(
            "http_listen".into(),
            V::String(self.telemetry.http_listen.clone().unwrap_or_default()),
        );
        telemetry.insert(
            "otlp_endpoint".into(),
            V::String(self.telemetry.otlp_endpoint.clone().unwrap_or_default()),
        );
        telemetry.insert(
            "otlp_protocol".into(),
            V::String(self.telemetry.otlp_protocol.clone().unwrap_or_default()),
        );
        telemetry.insert(
            "spans_to_kafka".into(),
            V::Boolean(self.telemetry.spans_to_kafka),
        );
        telemetry.insert(
            "spans_topic".into(),
            V::String(self.telemetry.spans_topic.clone()),
        );
        telemetry.insert(
            "owner_series_limit".into(),
            V::Integer(self.telemetry.owner_series_limit as i64),
        );
        root.insert("telemetry".into(), V::Table(telemetry));
        root.insert(
            "ingest".into(),
            V::Table(OtlpIngest::to_toml(
                self.ingest.as_ref(),
                self.otlp_session_attribute.as_deref(),
            )),
        );
        if let Some(o) = self.effective.get("overrides") {
            root.insert("overrides".into(), o.clone());
        }
        toml::to_string_pretty(&root).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(text, "test.toml", std::iter::empty())
    }

    #[test]
    fn empty_file_gives_the_design_defaults() {
        let c = cfg("").unwrap();
        assert_eq!(c.policy, Policy::default());
        assert_eq!(c.engine.session_gap_ms, 1_800_000);
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
        assert_eq!(keys, ["state.path", "engine.session_gap_secs"], "{err}");
        cfg(&format!(
            "[engine]\nsession_gap_secs = {MAX_SESSION_GAP_SECS}\n"
        ))
        .unwrap();
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
        let err = cfg("[[overrides]]\ntool = \"x\"\n[overrides.detectors.stall]\nwarn_at = 1\n")
            .unwrap_err();
        assert_eq!(err.key_errors()[0].key, "overrides[0].detectors.stall");
    }

    #[test]
    fn effective_toml_reparses_to_the_same_policy() {
        let c = cfg("mode = \"warn\"\n[detectors.cycle]\nwarn_at = 3\n").unwrap();
        let again = cfg(&c.effective_toml()).unwrap();
        assert_eq!(again.policy, c.policy);
    }
}

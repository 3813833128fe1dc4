//! Configuration (DESIGN §7): `loopwarden.toml` plus `LOOPWARDEN_…` environment
//! overrides, parsed raw (unknown keys rejected, named defaults, unit suffixes), then
//! validated without I/O.
//!
//! Each section parses and validates itself (`sections.rs`: engine, state, telemetry,
//! fingerprint, tools; `policy.rs`: mode, detectors, overrides; `kafka::settings` and
//! `ingest` their own), into one list of errors; this module joins them, checks what
//! spans sections, and says which environment variable set a refused key.
//!
//! Guarantees: every problem of a file is reported at once, each with its key path; a
//! [`Config`] that exists is valid; resolving the policy of a tenant / agent / tool never
//! fails. All errors here are fatal: the process refuses to start.

mod env;
mod policy;
mod raw;
mod sections;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use crate::bus::ingest::{OtlpIngest, RawIngest};
use crate::bus::kafka::settings::{KafkaSettings, RawKafka};
use crate::contract::event::ParseLimits;
use crate::engine::fingerprint::FingerprintSpec;
use crate::engine::levels::Mode;
use crate::engine::policy::Policy;

pub use policy::Override;
pub use sections::{EngineSettings, TelemetrySettings, ToolClasses, ToolClassifier};

/// Default event-time gap after which a silent session closes.
pub const DEFAULT_SESSION_GAP_SECS: u64 = 30 * 60;
/// How far after its message's timestamp or the host's clock (the earlier) `run` lets an
/// event's time move its partition's clock
/// (`engine.future_grace_secs`): past clock skew between hosts, well within a session gap
/// (half the gap when that is less).
pub const DEFAULT_FUTURE_GRACE_SECS: u64 = 60;
/// The longest `engine.future_grace_secs` accepted (a day).
pub const MAX_FUTURE_GRACE_SECS: u64 = 24 * 3600;
/// Default on-disk state directory.
pub const DEFAULT_STATE_PATH: &str = "./loopwarden-state";
/// sled's page cache, MiB (`state.cache_mib`): bounded, where sled's own default (1 GiB)
/// lets a long-running process grow toward it as the state churns. Small: the engine
/// keeps open sessions in memory and reads the store only to load a partition (a
/// restore of 50,000 sessions took as long with 8 MiB as with 32).
pub const DEFAULT_STATE_CACHE_MIB: u64 = 8;
/// The largest `state.cache_mib` accepted (64 GiB).
pub const MAX_STATE_CACHE_MIB: u64 = 64 * 1024;
/// How long a state store write may last before `/healthz` fails (`state.write_stall_secs`).
/// A batch's write takes milliseconds, seconds on a slow disk with a large fold; one still
/// in progress after two minutes is taken for one that will not end.
pub const DEFAULT_WRITE_STALL_SECS: u64 = 120;
/// The longest `state.write_stall_secs` accepted (a day).
pub const MAX_WRITE_STALL_SECS: u64 = 24 * 3600;
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
    "LOOPWARDEN_BROKER_OWNER",
    "LOOPWARDEN_PROMTOOL_DIR",
    "LOOPWARDEN_DEBIAN_MIRROR",
    "LOOPWARDEN_TEST_BROKERS",
    "LOOPWARDEN_CRASH_SEED",
    "LOOPWARDEN_RECORD_REPLAY",
    "LOOPWARDEN_OTEL_DIR",
];
/// Prefix of the benchmarks' variables (`LOOPWARDEN_BENCH_RATE`, …), not config keys.
pub const RESERVED_ENV_PREFIX: &str = "LOOPWARDEN_BENCH_";
/// The standard variables naming where spans go, the first set (not empty) winning, when
/// `telemetry.otlp_endpoint` is not set.
pub const OTEL_ENDPOINT_ENV: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Default globs of tools that wait on something (DESIGN §3).
pub const DEFAULT_POLL_GLOBS: &[&str] = &["*status*", "*poll*", "*wait*", "*sleep*", "process.log"];
/// Default globs of tools that let time pass: the call after one is a poll (checking
/// again after waiting is what polling is).
pub const DEFAULT_WAIT_GLOBS: &[&str] = &["*sleep*", "*wait*"];
/// Default globs of tools whose unchanged result means an edit did not take. Globs match
/// case and all (a case-blind `*edit*` takes `GetEditorDiagnostics` for a write, `*wait*`
/// `CheckWaitlist` for a wait): Claude Code's capitalised edit tools are named whole.
pub const DEFAULT_WRITE_GLOBS: &[&str] = &[
    "*write*",
    "*edit*",
    "*replace*",
    "*patch*",
    "*apply_diff*",
    "Edit",
    "MultiEdit",
    "Write",
    "NotebookEdit",
];

/// The topic spans go to when `telemetry.spans_to_kafka` is on.
pub const DEFAULT_SPANS_TOPIC: &str = "otlp_spans";

/// Where `loopwarden run` serves `/metrics`, `/healthz` and `/readyz` by default (the
/// OpenTelemetry Prometheus exporter's customary port).
pub const DEFAULT_HTTP_LISTEN: &str = "0.0.0.0:9464";

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

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub engine: EngineSettings,
    pub limits: ParseLimits,
    pub state_path: PathBuf,
    /// sled's page cache, bytes.
    pub state_cache_bytes: u64,
    /// How long a store write may last before the process counts as stuck (`/healthz`).
    pub state_write_stall: std::time::Duration,
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

/// The problems found so far, each with its key.
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
        // The OpenTelemetry variables that decide where spans go when the file does not.
        let mut otel = Vec::new();
        let env = env.inspect(|(name, value)| {
            if name.starts_with("OTEL_") {
                otel.push((name.clone(), value.clone()));
            }
        });
        let set_by_env = env::apply_env(&mut table, env, &mut errors);
        raw::whole_floats_to_integers(&mut table);
        for key in table.keys() {
            if !TOP_LEVEL_KEYS.contains(&key.as_str()) {
                errors.push(
                    key.clone(),
                    format!("unknown key (known: {})", TOP_LEVEL_KEYS.join(", ")),
                );
            }
        }
        let (engine, limits) = sections::engine(&table, &mut errors);
        let (state_path, state_cache_bytes, state_write_stall) =
            sections::state(&table, &mut errors);
        let (tools, ignore_args) = ToolClassifier::parse(&table, &mut errors);
        let fingerprint = sections::fingerprint(&table, ignore_args, &mut errors);
        let policy = policy::base_policy(&table, engine.grace_steps, &mut errors);
        let overrides = policy::overrides(&table, &policy, &mut errors);
        let telemetry = TelemetrySettings::parse(&table, &mut errors);
        telemetry.check_otel_env(&otel, &mut errors);
        let (kafka, ingest, otlp_session_attribute) = bus(&table, &telemetry, &mut errors);
        if errors.list.is_empty() {
            policy::check_overrides_together(&policy, &overrides, &mut errors);
        }
        if !errors.list.is_empty() {
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                errors: named_by_env(errors.list, &set_by_env),
            });
        }
        Ok(Config {
            engine,
            limits,
            state_path,
            state_cache_bytes,
            state_write_stall,
            fingerprint,
            tools,
            policy,
            overrides,
            kafka,
            telemetry,
            ingest,
            otlp_session_attribute,
            effective: table,
        })
    }

    /// This configuration with every `warn` mode (the top level's, a detector's, an
    /// override's) read as `shadow`: in `warn` a termination is published as a critical
    /// warning, so the terminations `backtest` counts as kill points are lost, where in
    /// `shadow` they are kept (and nothing is published either way).
    pub fn with_warn_as_shadow(&self) -> Config {
        let mut config = self.clone();
        for levels in &mut config.policy.levels {
            if levels.mode == Mode::Warn {
                levels.mode = Mode::Shadow;
            }
        }
        for o in &mut config.overrides {
            o.warn_as_shadow();
        }
        config
    }

    /// Whether some override is scoped to a tool (the engine then resolves per tool).
    pub fn has_tool_overrides(&self) -> bool {
        self.overrides.iter().any(|o| o.tool.is_some())
    }

    /// The policy of a session: the base with every matching tenant / agent override
    /// applied in file order. `tenant` and `agent` as sessions keep them
    /// ([`crate::engine::state::kept_label`]).
    pub fn policy_for(&self, tenant: Option<&str>, agent: Option<&str>) -> Policy {
        let mut p = self.policy.clone();
        for o in self.overrides.iter().filter(|o| o.tool.is_none()) {
            if o.matches_session(tenant, agent) {
                o.apply(&mut p);
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
                || !o.matches_session(tenant, agent)
            {
                continue;
            }
            let p = out.get_or_insert_with(|| session_policy.clone());
            o.apply(p);
        }
        out
    }

    /// The effective configuration as TOML: every key with its value in force.
    pub fn effective_toml(&self) -> String {
        use toml::Value as V;
        let mut root = toml::Table::new();
        let engine = sections::engine_toml(&self.engine, &self.limits);
        root.insert("engine".into(), V::Table(engine));
        let state = sections::state_toml(
            &self.state_path,
            self.state_cache_bytes,
            self.state_write_stall,
        );
        root.insert("state".into(), V::Table(state));
        let fp = sections::fingerprint_toml(&self.fingerprint);
        root.insert("fingerprint".into(), V::Table(fp));
        let tools = self.tools.to_toml(&self.fingerprint.ignore_args);
        root.insert("tools".into(), V::Table(tools));
        let dets = policy::detectors_toml(&self.policy);
        root.insert("detectors".into(), V::Table(dets));
        root.insert("kafka".into(), V::Table(self.kafka.to_toml()));
        root.insert("telemetry".into(), V::Table(self.telemetry.to_toml()));
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

/// `[kafka]` and `[ingest]`: the bus's settings, the OTLP ingest (whose topics must be
/// none of the bus's, nor the spans topic), and its session attribute; then whether the
/// spans topic, when spans go on the bus, is a topic of its own.
fn bus(
    table: &toml::Table,
    telemetry: &TelemetrySettings,
    errors: &mut Errors,
) -> (KafkaSettings, Option<OtlpIngest>, Option<String>) {
    let raw_kafka: RawKafka = raw::section(table, "kafka", errors);
    let raw_ingest: RawIngest = raw::section(table, "ingest", errors);
    let mut kafka_errors = Vec::new();
    let kafka = KafkaSettings::validate(raw_kafka, &mut kafka_errors);
    let otlp_session_attribute = crate::bus::ingest::session_attribute(&raw_ingest);
    let spans_topic = telemetry.spans_topic.as_str();
    let ingest = OtlpIngest::validate(
        raw_ingest,
        &kafka,
        telemetry.spans_to_kafka.then_some(spans_topic),
        &mut kafka_errors,
    );
    for (key, message) in kafka_errors {
        errors.push(key, message);
    }
    if telemetry.spans_to_kafka {
        // Spans are OTLP protobuf: on an input topic they would be read back as bad
        // events, on the changelog as broken state.
        let shared = if kafka.input_topics.iter().any(|t| t == spans_topic) {
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
    (kafka, ingest, otlp_session_attribute)
}

/// A key the environment set is the variable's doing, not the file's: its errors say so.
fn named_by_env(mut errors: Vec<KeyError>, set_by_env: &[(String, String)]) -> Vec<KeyError> {
    for e in &mut errors {
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
    errors
}

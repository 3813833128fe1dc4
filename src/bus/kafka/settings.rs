//! The `[kafka]` section of the configuration: topics, group, batching, shutdown and retry
//! timing, and librdkafka properties passed through to the clients.
//!
//! Guarantees: validated without I/O (librdkafka parses the pass-through properties in
//! memory, so a misspelt property is reported by `check-config`, not at 3 a.m.); the
//! properties loopwarden owns for its delivery guarantees cannot be overridden.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// Default input topics (DESIGN §1).
pub const DEFAULT_INPUT_TOPICS: &[&str] = &["cost.attributed", "tool.called"];
pub const DEFAULT_GROUP_ID: &str = "loopwarden";
pub const DEFAULT_WARNING_TOPIC: &str = "session.warning";
pub const DEFAULT_TERMINATED_TOPIC: &str = "session.terminated";
pub const DEFAULT_SUMMARY_TOPIC: &str = "session.summary";
pub const DEFAULT_DLQ_TOPIC: &str = "loopwarden.dlq";
pub const DEFAULT_CHANGELOG_TOPIC: &str = "loopwarden.state-changelog";
/// A batch closes at this many events…
pub const DEFAULT_MAX_BATCH_EVENTS: usize = 20_000;
/// …or this long after its first event, whichever comes first. At least once a batch
/// paces only the store and the commit (findings go out as they are found), so it can be
/// long; exactly once its findings wait for its transaction, so it is short.
pub const DEFAULT_MAX_BATCH_WAIT_MS: u64 = 100;
pub const DEFAULT_MAX_BATCH_WAIT_EXACTLY_ONCE_MS: u64 = 10;
/// At least once, how often each partition's changed states are written (to sled and the
/// changelog) and its input offsets committed: once an interval, at the first batch end
/// of each of its turns (0: every batch's end). A session touched again within it is
/// written once, and a worker's partitions take their turns in phases of their own, so
/// each batch end writes a slice of them (`pipeline::partition`). Off by default: shorter
/// than the time between a session's events it costs more than it saves. Exactly once,
/// every batch is one transaction with its offsets: there it is 0.
pub const DEFAULT_COMMIT_INTERVAL_MS: u64 = 0;
/// The longest commit interval: a crash re-applies up to this much of each partition's
/// events, the processing-latency histogram's buckets end at a minute, and a partition
/// counts its events' poll times a millisecond at a time until its turn (60,000 counts).
pub const MAX_COMMIT_INTERVAL_MS: u64 = 60_000;
pub const DEFAULT_SHUTDOWN_DEADLINE_SECS: u64 = 30;
/// A partition with no events for this long has its clock advanced by wall-clock time.
pub const DEFAULT_IDLE_AFTER_SECS: u64 = 5;
/// How long an event waits for the other input topics of its partition to show data,
/// so that events of all topics are applied in event-time order (see `pipeline::align`).
pub const DEFAULT_ALIGN_WAIT_MS: u64 = 100;
pub const DEFAULT_RETRY_BACKOFF_MIN_MS: u64 = 100;
pub const DEFAULT_RETRY_BACKOFF_MAX_MS: u64 = 10_000;
/// Consumer threads (group members) per process.
pub const DEFAULT_WORKERS: usize = 1;
/// Partitions of each topic the embedded broker creates.
pub const DEFAULT_EMBEDDED_PARTITIONS: i32 = 4;

/// How findings, state and offsets reach the bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// Produce and await the findings, store state, then commit offsets: a crash can
    /// re-emit findings (same `event_id`), never lose one or count an event twice.
    #[default]
    AtLeastOnce,
    /// One Kafka transaction per batch carries the findings, the changelog records and
    /// the input offsets: `read_committed` consumers see each finding once.
    ExactlyOnce,
}

impl Delivery {
    pub fn name(self) -> &'static str {
        match self {
            Delivery::AtLeastOnce => "at_least_once",
            Delivery::ExactlyOnce => "exactly_once",
        }
    }
}

/// librdkafka properties loopwarden sets itself, and why a user may not.
/// (librdkafka's aliases of them too: `metadata.broker.list` is what `bootstrap.servers`
/// names, and `auto.commit.enable` is the old name of `enable.auto.commit`.)
pub const OWNED_PROPERTIES: &[(&str, &str)] = &[
    ("bootstrap.servers", "set kafka.brokers instead"),
    ("metadata.broker.list", "set kafka.brokers instead"),
    (
        "auto.commit.enable",
        "offsets are committed only after state is stored (at-least-once)",
    ),
    ("group.id", "set kafka.group_id instead"),
    (
        "enable.auto.commit",
        "offsets are committed only after state is stored (at-least-once)",
    ),
    (
        "enable.auto.offset.store",
        "offsets are stored only after state is stored (at-least-once)",
    ),
    (
        "enable.idempotence",
        "the producer is always idempotent (no duplicates from retries)",
    ),
    (
        "partition.assignment.strategy",
        "cooperative-sticky for one input topic, range to keep several co-partitioned",
    ),
    (
        "group.instance.id",
        "set kafka.instance_id instead (each worker thread gets its own)",
    ),
    (
        "transactional.id",
        "derived from kafka.group_id and kafka.instance_id (or the host and state path) in exactly_once mode",
    ),
    (
        "isolation.level",
        "read_committed: loopwarden reads only committed input and changelog records",
    ),
    (
        "delivery.report.only.error",
        "every record's delivery is awaited before its batch is committed (and its report lets go of the record)",
    ),
];

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKafka {
    brokers: Option<String>,
    group_id: Option<String>,
    input_topics: Option<Vec<String>>,
    warning_topic: Option<String>,
    terminated_topic: Option<String>,
    summary_topic: Option<String>,
    dlq_topic: Option<String>,
    changelog: Option<bool>,
    changelog_topic: Option<String>,
    changelog_headers: Option<bool>,
    delivery: Option<String>,
    max_batch_events: Option<usize>,
    max_batch_wait_ms: Option<u64>,
    commit_interval_ms: Option<u64>,
    shutdown_deadline_secs: Option<u64>,
    idle_after_secs: Option<u64>,
    align_wait_ms: Option<u64>,
    retry_backoff_min_ms: Option<u64>,
    retry_backoff_max_ms: Option<u64>,
    embedded_partitions: Option<i32>,
    workers: Option<usize>,
    instance_id: Option<String>,
    client: Option<BTreeMap<String, toml::Value>>,
    consumer: Option<BTreeMap<String, toml::Value>>,
    producer: Option<BTreeMap<String, toml::Value>>,
}

/// Validated Kafka settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaSettings {
    /// `host:port,…`; `None` starts the embedded broker.
    pub brokers: Option<String>,
    pub group_id: String,
    pub input_topics: Vec<String>,
    pub warning_topic: String,
    pub terminated_topic: String,
    pub summary_topic: String,
    pub dlq_topic: String,
    /// Whether every stored change is also written to the changelog topic, so that a
    /// partition's state can move to another instance (or a fresh disk).
    pub changelog: bool,
    pub changelog_topic: String,
    /// Whether session records go on the changelog in the form builds before the framed
    /// records wrote (and could read): kind, batch and state format in headers, the state
    /// alone in the value. For a rolling upgrade from such a build, or a rollback to one
    /// (`changelog::SessionFrame`).
    pub changelog_headers: bool,
    pub delivery: Delivery,
    pub max_batch_events: usize,
    pub max_batch_wait: Duration,
    /// How often a partition's changed states are written and its offsets committed
    /// ([`DEFAULT_COMMIT_INTERVAL_MS`]); zero: at every batch's end.
    pub commit_interval: Duration,
    pub shutdown_deadline: Duration,
    pub idle_after: Duration,
    /// The longest an event is held back waiting for another input topic of its
    /// partition that has no data yet (Kafka Streams' `max.task.idle.ms`).
    pub align_wait: Duration,
    pub retry_backoff_min: Duration,
    pub retry_backoff_max: Duration,
    pub embedded_partitions: i32,
    /// Consumer threads per process, each a member of the group with its own partitions.
    pub workers: usize,
    /// Static group membership (`group.instance.id`): a restarted instance with the same
    /// id gets its partitions back without a rebalance, within the session timeout.
    pub instance_id: Option<String>,
    /// Properties for every client (consumer, producer, admin), e.g. TLS and SASL.
    pub client: BTreeMap<String, String>,
    /// Properties for the consumer only.
    pub consumer: BTreeMap<String, String>,
    /// Properties for the producer only.
    pub producer: BTreeMap<String, String>,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        let mut errors = Vec::new();
        let s = KafkaSettings::validate(RawKafka::default(), &mut errors);
        debug_assert!(errors.is_empty(), "{errors:?}");
        s
    }
}

/// What is said of a topic name that is not [`valid_topic`].
pub(crate) fn invalid_topic(name: &str) -> String {
    format!("`{name}` is not a valid topic name (1-249 of [a-zA-Z0-9._-])")
}

/// A Kafka topic name as the broker accepts it.
pub(crate) fn valid_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Why a value of a librdkafka property would break the idempotent producer that every
/// output goes through, if it would; librdkafka itself says so only when the client is
/// created, at `run`, where `check-config` should have said it.
fn breaks_idempotence(name: &str, value: &str) -> Option<&'static str> {
    let number = value.trim().parse::<i64>().ok();
    match name {
        "acks" | "request.required.acks" => {
            (!matches!(value.trim().to_ascii_lowercase().as_str(), "all" | "-1")).then_some(
                "the idempotent producer needs acks from every in-sync replica: all or -1",
            )
        }
        "max.in.flight" | "max.in.flight.requests.per.connection" => number
            .is_some_and(|n| n > 5)
            .then_some("the idempotent producer keeps order with at most 5 requests in flight"),
        "retries" | "message.send.max.retries" => number
            .is_some_and(|n| n < 1)
            .then_some("the idempotent producer needs retries (at least 1)"),
        _ => None,
    }
}

/// What `to_toml` shows instead of a secret property's value.
pub const REDACTED: &str = "(redacted)";

/// librdkafka properties holding secrets: passwords, client secrets, PEM keys.
fn is_secret_property(name: &str) -> bool {
    name.contains("password") || name.contains("secret") || name == "ssl.key.pem"
}

/// Pass-through properties as librdkafka strings; `_` in a key stands for `.` so that
/// environment variables (`LOOPWARDEN_KAFKA__CLIENT__SASL_PASSWORD`) can set them.
fn properties(
    raw: Option<BTreeMap<String, toml::Value>>,
    section: &str,
    errors: &mut Vec<(String, String)>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in raw.unwrap_or_default() {
        let key = format!("kafka.{section}.{k}");
        let name = k.replace('_', ".");
        if let Some((_, why)) = OWNED_PROPERTIES.iter().find(|(p, _)| *p == name) {
            errors.push((key, format!("set by loopwarden: {why}")));
            continue;
        }
        let value = match v {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Float(f) => f.to_string(),
            other => {
                errors.push((
                    key,
                    format!(
                        "must be a string, number or boolean, not {}",
                        other.type_str()
                    ),
                ));
                continue;
            }
        };
        if section != "consumer" {
            if let Some(why) = breaks_idempotence(&name, &value) {
                errors.push((key, format!("`{value}` is refused: {why}")));
                continue;
            }
        }
        // librdkafka checks names and values in memory: no broker is contacted.
        let mut probe = rdkafka::ClientConfig::new();
        probe.set(&name, &value);
        if let Err(e) = probe.create_native_config() {
            errors.push((key, format!("librdkafka refuses it: {e}")));
            continue;
        }
        out.insert(name, value);
    }
    out
}

/// The topics of a `[kafka]` section: where events come from and findings go.
struct Topics {
    input: Vec<String>,
    warning: String,
    terminated: String,
    summary: String,
    dlq: String,
    changelog: String,
}

impl Topics {
    /// Each topic valid, the inputs none of the outputs, none listed twice.
    fn validate(raw: &mut RawKafka, errors: &mut Vec<(String, String)>) -> Topics {
        let mut topic = |key: &str, value: Option<String>, default: &str| -> String {
            let t = value.unwrap_or_else(|| default.to_string());
            if !valid_topic(&t) {
                errors.push((format!("kafka.{key}"), invalid_topic(&t)));
            }
            t
        };
        let topics = Topics {
            warning: topic(
                "warning_topic",
                raw.warning_topic.take(),
                DEFAULT_WARNING_TOPIC,
            ),
            terminated: topic(
                "terminated_topic",
                raw.terminated_topic.take(),
                DEFAULT_TERMINATED_TOPIC,
            ),
            summary: topic(
                "summary_topic",
                raw.summary_topic.take(),
                DEFAULT_SUMMARY_TOPIC,
            ),
            dlq: topic("dlq_topic", raw.dlq_topic.take(), DEFAULT_DLQ_TOPIC),
            changelog: topic(
                "changelog_topic",
                raw.changelog_topic.take(),
                DEFAULT_CHANGELOG_TOPIC,
            ),
            input: raw
                .input_topics
                .take()
                .unwrap_or_else(|| DEFAULT_INPUT_TOPICS.iter().map(|s| s.to_string()).collect()),
        };
        if topics.input.is_empty() {
            errors.push((
                "kafka.input_topics".into(),
                "needs at least one topic".into(),
            ));
        }
        let outputs = topics.outputs();
        for (i, t) in topics.input.iter().enumerate() {
            let key = || format!("kafka.input_topics[{i}]");
            if !valid_topic(t) {
                errors.push((key(), invalid_topic(t)));
            }
            if topics.input[..i].contains(t) {
                errors.push((key(), format!("`{t}` is listed twice")));
            }
            if outputs.iter().any(|(_, o)| *o == t) {
                errors.push((
                    key(),
                    format!(
                        "`{t}` is also an output topic: loopwarden would read its own findings"
                    ),
                ));
            }
        }
        topics
    }

    /// The output topics with their keys, in a fixed order.
    fn outputs(&self) -> [(&'static str, &String); 4] {
        [
            ("warning_topic", &self.warning),
            ("terminated_topic", &self.terminated),
            ("summary_topic", &self.summary),
            ("dlq_topic", &self.dlq),
        ]
    }

    /// The changelog holds session state: a topic it shares would mix state records with
    /// events (read back as bad input) or with findings (read by consumers).
    fn check_changelog(&self, errors: &mut Vec<(String, String)>) {
        let changelog = &self.changelog;
        let shared = if self.input.contains(changelog) {
            Some("an input topic".to_string())
        } else {
            self.outputs()
                .into_iter()
                .find(|(_, t)| *t == changelog)
                .map(|(key, _)| format!("kafka.{key}"))
        };
        if let Some(other) = shared {
            errors.push((
                "kafka.changelog_topic".into(),
                format!("`{changelog}` is also {other}: the changelog needs a topic of its own"),
            ));
        }
    }
}

/// `kafka.delivery`; exactly once needs the changelog.
fn delivery(raw: Option<&str>, changelog: bool, errors: &mut Vec<(String, String)>) -> Delivery {
    let delivery = match raw {
        None | Some("at_least_once") => Delivery::AtLeastOnce,
        Some("exactly_once") => Delivery::ExactlyOnce,
        Some(other) => {
            errors.push((
                "kafka.delivery".into(),
                format!("`{other}` is not a delivery mode: at_least_once or exactly_once"),
            ));
            Delivery::AtLeastOnce
        }
    };
    if delivery == Delivery::ExactlyOnce && !changelog {
        errors.push((
            "kafka.delivery".into(),
            "exactly_once needs kafka.changelog = true: a restart after a committed transaction restores the state from it".into(),
        ));
    }
    delivery
}

/// `kafka.commit_interval_ms`: at least once up to [`MAX_COMMIT_INTERVAL_MS`]; exactly
/// once none (its transaction commits a batch's offsets with its findings, so every batch
/// writes its states).
fn commit_interval_ms(
    raw: Option<u64>,
    delivery: Delivery,
    errors: &mut Vec<(String, String)>,
) -> u64 {
    match (raw, delivery) {
        (None, Delivery::AtLeastOnce) => DEFAULT_COMMIT_INTERVAL_MS,
        (None | Some(0), Delivery::ExactlyOnce) => 0,
        (Some(_), Delivery::ExactlyOnce) => {
            errors.push((
                "kafka.commit_interval_ms".into(),
                "exactly_once commits every batch in its transaction: leave it unset (or 0), or use at_least_once".into(),
            ));
            0
        }
        (Some(ms), Delivery::AtLeastOnce) if ms > MAX_COMMIT_INTERVAL_MS => {
            errors.push((
                "kafka.commit_interval_ms".into(),
                format!("must be at most {MAX_COMMIT_INTERVAL_MS} (1 min): a crash re-applies up to this much of each partition's events"),
            ));
            MAX_COMMIT_INTERVAL_MS
        }
        (Some(ms), Delivery::AtLeastOnce) => ms,
    }
}

/// The timings of a `[kafka]` section, each checked.
struct Timings {
    shutdown_deadline: Duration,
    idle_after: Duration,
    align_wait: Duration,
    retry_backoff_min: Duration,
    retry_backoff_max: Duration,
}

impl Timings {
    fn validate(raw: &RawKafka, errors: &mut Vec<(String, String)>) -> Timings {
        let backoff_min = raw
            .retry_backoff_min_ms
            .unwrap_or(DEFAULT_RETRY_BACKOFF_MIN_MS);
        let backoff_max = raw
            .retry_backoff_max_ms
            .unwrap_or(DEFAULT_RETRY_BACKOFF_MAX_MS);
        if backoff_min == 0 || backoff_min > backoff_max {
            errors.push((
                "kafka.retry_backoff_min_ms".into(),
                format!("must be > 0 and <= retry_backoff_max_ms ({backoff_max})"),
            ));
        }
        let shutdown = raw
            .shutdown_deadline_secs
            .unwrap_or(DEFAULT_SHUTDOWN_DEADLINE_SECS);
        if shutdown == 0 {
            errors.push(("kafka.shutdown_deadline_secs".into(), "must be > 0".into()));
        }
        let idle_after = raw.idle_after_secs.unwrap_or(DEFAULT_IDLE_AFTER_SECS);
        if idle_after == 0 {
            errors.push(("kafka.idle_after_secs".into(), "must be > 0".into()));
        }
        let align_wait = raw.align_wait_ms.unwrap_or(DEFAULT_ALIGN_WAIT_MS);
        if idle_after > 0 && align_wait >= idle_after.saturating_mul(1000) {
            errors.push((
                "kafka.align_wait_ms".into(),
                format!("must be less than idle_after_secs ({idle_after} s)"),
            ));
        }
        Timings {
            shutdown_deadline: Duration::from_secs(shutdown),
            idle_after: Duration::from_secs(idle_after),
            align_wait: Duration::from_millis(align_wait),
            retry_backoff_min: Duration::from_millis(backoff_min),
            retry_backoff_max: Duration::from_millis(backoff_max),
        }
    }
}

impl KafkaSettings {
    /// Validates the raw section; problems go to `errors` as (key, message).
    pub(crate) fn validate(mut raw: RawKafka, errors: &mut Vec<(String, String)>) -> KafkaSettings {
        let topics = Topics::validate(&mut raw, errors);
        let changelog = raw.changelog.unwrap_or(true);
        if changelog {
            topics.check_changelog(errors);
        }
        let group_id = raw
            .group_id
            .take()
            .unwrap_or_else(|| DEFAULT_GROUP_ID.to_string());
        if group_id.is_empty() {
            errors.push(("kafka.group_id".into(), "must not be empty".into()));
        }
        let max_batch_events = raw.max_batch_events.unwrap_or(DEFAULT_MAX_BATCH_EVENTS);
        if max_batch_events == 0 {
            errors.push(("kafka.max_batch_events".into(), "must be > 0".into()));
        }
        let timings = Timings::validate(&raw, errors);
        let embedded_partitions = raw
            .embedded_partitions
            .unwrap_or(DEFAULT_EMBEDDED_PARTITIONS);
        if !(1..=1024).contains(&embedded_partitions) {
            errors.push((
                "kafka.embedded_partitions".into(),
                "must be 1..=1024".into(),
            ));
        }
        let workers = raw.workers.unwrap_or(DEFAULT_WORKERS);
        if !(1..=64).contains(&workers) {
            errors.push(("kafka.workers".into(), "must be 1..=64".into()));
        }
        let delivery = delivery(raw.delivery.as_deref(), changelog, errors);
        let max_batch_wait_ms = raw.max_batch_wait_ms.unwrap_or(match delivery {
            Delivery::AtLeastOnce => DEFAULT_MAX_BATCH_WAIT_MS,
            Delivery::ExactlyOnce => DEFAULT_MAX_BATCH_WAIT_EXACTLY_ONCE_MS,
        });
        let commit_interval_ms = commit_interval_ms(raw.commit_interval_ms, delivery, errors);
        KafkaSettings {
            brokers: raw.brokers.filter(|b| !b.trim().is_empty()),
            group_id,
            input_topics: topics.input,
            warning_topic: topics.warning,
            terminated_topic: topics.terminated,
            summary_topic: topics.summary,
            dlq_topic: topics.dlq,
            changelog,
            changelog_topic: topics.changelog,
            changelog_headers: raw.changelog_headers.unwrap_or(false),
            delivery,
            max_batch_events,
            max_batch_wait: Duration::from_millis(max_batch_wait_ms),
            commit_interval: Duration::from_millis(commit_interval_ms),
            shutdown_deadline: timings.shutdown_deadline,
            idle_after: timings.idle_after,
            align_wait: timings.align_wait,
            retry_backoff_min: timings.retry_backoff_min,
            retry_backoff_max: timings.retry_backoff_max,
            embedded_partitions,
            workers,
            instance_id: raw.instance_id.filter(|i| !i.is_empty()),
            client: properties(raw.client, "client", errors),
            consumer: properties(raw.consumer, "consumer", errors),
            producer: properties(raw.producer, "producer", errors),
        }
    }

    /// The value the user gave a librdkafka property for the input consumer: under
    /// `[kafka.consumer]`, else under `[kafka.client]` (the order in which they apply).
    pub fn consumer_property(&self, name: &str) -> Option<&str> {
        self.consumer
            .get(name)
            .or_else(|| self.client.get(name))
            .map(String::as_str)
    }

    /// The output topics, in a fixed order.
    pub fn output_topics(&self) -> [&str; 4] {
        [
            &self.warning_topic,
            &self.terminated_topic,
            &self.summary_topic,
            &self.dlq_topic,
        ]
    }

    /// Every topic `run` reads or writes (the embedded broker creates them all).
    pub fn all_topics(&self) -> Vec<&str> {
        let mut t: Vec<&str> = self.input_topics.iter().map(String::as_str).collect();
        t.extend(self.output_topics());
        if self.changelog {
            t.push(&self.changelog_topic);
        }
        t
    }

    /// The section as TOML, every key with its value in force (for `check-config`).
    pub fn to_toml(&self) -> toml::Table {
        use toml::Value as V;
        let text = |v: &str| V::String(v.to_string());
        let int = |v: u128| V::Integer(v as i64);
        let mut t: toml::Table = [
            ("brokers", text(self.brokers.as_deref().unwrap_or_default())),
            ("group_id", text(&self.group_id)),
            (
                "input_topics",
                V::Array(self.input_topics.iter().map(|t| text(t)).collect()),
            ),
            ("warning_topic", text(&self.warning_topic)),
            ("terminated_topic", text(&self.terminated_topic)),
            ("summary_topic", text(&self.summary_topic)),
            ("dlq_topic", text(&self.dlq_topic)),
            ("changelog", V::Boolean(self.changelog)),
            ("changelog_topic", text(&self.changelog_topic)),
            ("changelog_headers", V::Boolean(self.changelog_headers)),
            ("delivery", text(self.delivery.name())),
            ("max_batch_events", int(self.max_batch_events as u128)),
            ("max_batch_wait_ms", int(self.max_batch_wait.as_millis())),
            ("commit_interval_ms", int(self.commit_interval.as_millis())),
            (
                "shutdown_deadline_secs",
                int(self.shutdown_deadline.as_secs().into()),
            ),
            ("idle_after_secs", int(self.idle_after.as_secs().into())),
            ("align_wait_ms", int(self.align_wait.as_millis())),
            (
                "retry_backoff_min_ms",
                int(self.retry_backoff_min.as_millis()),
            ),
            (
                "retry_backoff_max_ms",
                int(self.retry_backoff_max.as_millis()),
            ),
            (
                "embedded_partitions",
                V::Integer(self.embedded_partitions.into()),
            ),
            ("workers", int(self.workers as u128)),
            (
                "instance_id",
                text(self.instance_id.as_deref().unwrap_or_default()),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        // `check-config` prints this: secrets (SASL passwords, keys) must not reach a
        // terminal or a CI log.
        let props = |m: &BTreeMap<String, String>| {
            V::Table(
                m.iter()
                    .map(|(k, v)| {
                        let v = if is_secret_property(k) {
                            REDACTED.to_string()
                        } else {
                            v.clone()
                        };
                        (k.clone(), V::String(v))
                    })
                    .collect(),
            )
        };
        t.insert("client".into(), props(&self.client));
        t.insert("consumer".into(), props(&self.consumer));
        t.insert("producer".into(), props(&self.producer));
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(text: &str) -> (KafkaSettings, Vec<(String, String)>) {
        let raw: RawKafka = toml::from_str(text).unwrap();
        let mut errors = Vec::new();
        (KafkaSettings::validate(raw, &mut errors), errors)
    }

    #[test]
    fn defaults_follow_the_design() {
        let (s, errors) = validate("");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(s.input_topics, ["cost.attributed", "tool.called"]);
        assert_eq!(s.dlq_topic, "loopwarden.dlq");
        assert_eq!(s.brokers, None);
        // At least once findings do not wait for their batch; exactly once they do.
        assert_eq!(s.max_batch_wait, Duration::from_millis(100));
        let (s, _) = validate("delivery = \"exactly_once\"\n");
        assert_eq!(s.max_batch_wait, Duration::from_millis(10));
        let (s, _) = validate("delivery = \"exactly_once\"\nmax_batch_wait_ms = 40\n");
        assert_eq!(s.max_batch_wait, Duration::from_millis(40));
    }

    #[test]
    fn a_commit_interval_is_at_least_once_and_bounded() {
        let (s, errors) = validate("");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            s.commit_interval,
            Duration::from_millis(DEFAULT_COMMIT_INTERVAL_MS)
        );
        let (s, errors) = validate("commit_interval_ms = 5000\n");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(s.commit_interval, Duration::from_secs(5));
        assert_eq!(
            s.to_toml()["commit_interval_ms"],
            toml::Value::Integer(5000)
        );
        // Exactly once: every batch, and an interval asked for is refused, not ignored.
        let (s, errors) = validate("delivery = \"exactly_once\"\n");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(s.commit_interval, Duration::ZERO);
        let (_, errors) = validate("delivery = \"exactly_once\"\ncommit_interval_ms = 0\n");
        assert!(errors.is_empty(), "{errors:?}");
        let (_, errors) = validate("delivery = \"exactly_once\"\ncommit_interval_ms = 5000\n");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].0, "kafka.commit_interval_ms");
        assert!(errors[0].1.contains("exactly_once"), "{errors:?}");
        let (_, errors) = validate("commit_interval_ms = 60001\n");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].1.contains("at most 60000"), "{errors:?}");
        let (_, errors) = validate("commit_interval_ms = 60000\n");
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn pass_through_properties_are_checked_by_librdkafka() {
        let (s, errors) = validate(
            "[client]\n\"security.protocol\" = \"SASL_SSL\"\nsasl_mechanisms = \"PLAIN\"\n[consumer]\n\"fetch.wait.max.ms\" = 50\n",
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(s.client["security.protocol"], "SASL_SSL");
        assert_eq!(s.client["sasl.mechanisms"], "PLAIN");
        assert_eq!(s.consumer["fetch.wait.max.ms"], "50");
        let (_, errors) =
            validate("[client]\n\"no.such.property\" = \"x\"\n\"fetch.wait.max.ms\" = \"soon\"\n");
        let keys: Vec<&str> = errors.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "kafka.client.fetch.wait.max.ms",
                "kafka.client.no.such.property"
            ]
        );
    }

    #[test]
    fn delivery_modes_are_named_and_exactly_once_needs_the_changelog() {
        let (s, errors) = validate("delivery = \"exactly_once\"\n");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(s.delivery, Delivery::ExactlyOnce);
        let (_, errors) = validate("delivery = \"exactly-once\"\n");
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].1.contains("at_least_once or exactly_once"),
            "{errors:?}"
        );
        let (_, errors) = validate("delivery = \"exactly_once\"\nchangelog = false\n");
        assert_eq!(errors.len(), 1);
        assert!(errors[0].1.contains("kafka.changelog"), "{errors:?}");
    }

    #[test]
    fn aliases_of_owned_properties_and_values_breaking_idempotence_are_refused() {
        let (_, errors) = validate(
            "[client]\n\"metadata.broker.list\" = \"evil:9092\"\n[consumer]\n\"auto.commit.enable\" = \"true\"\n\"acks\" = \"0\"\n[producer]\nacks = \"1\"\n\"max.in.flight\" = 6\nretries = 0\n\"linger.ms\" = 5\n",
        );
        let keys: Vec<&str> = errors.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "kafka.client.metadata.broker.list",
                "kafka.consumer.auto.commit.enable",
                "kafka.producer.acks",
                "kafka.producer.max.in.flight",
                "kafka.producer.retries",
            ],
            "{errors:?}"
        );
        let (s, errors) =
            validate("[producer]\nacks = \"ALL\"\n\"max.in.flight\" = 5\nretries = 3\n");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(s.producer["acks"], "ALL");
    }

    #[test]
    fn the_changelog_topic_is_shared_with_no_other() {
        for (shared, other) in [
            ("changelog_topic = \"tool.called\"\n", "an input topic"),
            (
                "changelog_topic = \"x\"\nsummary_topic = \"x\"\n",
                "kafka.summary_topic",
            ),
            (
                "changelog_topic = \"x\"\ndlq_topic = \"x\"\n",
                "kafka.dlq_topic",
            ),
        ] {
            let (_, errors) = validate(shared);
            assert_eq!(errors.len(), 1, "{shared}: {errors:?}");
            assert_eq!(errors[0].0, "kafka.changelog_topic");
            assert!(errors[0].1.contains(other), "{errors:?}");
        }
        let (_, errors) = validate("changelog = false\nchangelog_topic = \"tool.called\"\n");
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn owned_properties_and_bad_topics_are_refused_at_once() {
        let (_, errors) = validate(
            "input_topics = [\"a\", \"a\", \"session.warning\", \"bad topic\"]\n[producer]\n\"enable.idempotence\" = false\n\"delivery.report.only.error\" = true\n",
        );
        let keys: Vec<&str> = errors.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "kafka.input_topics[1]",
                "kafka.input_topics[2]",
                "kafka.input_topics[3]",
                "kafka.producer.delivery.report.only.error",
                "kafka.producer.enable.idempotence"
            ],
            "{errors:?}"
        );
    }
}

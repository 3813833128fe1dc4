//! Kafka plumbing shared by `run`, `simulate`, `demo` and the tests: client settings
//! built from the `[kafka]` section, topic checks (existence, co-partitioning), the
//! embedded broker and the C heap librdkafka allocates from ([`c_heap`]).
//!
//! Guarantees: every client loopwarden creates carries the user's pass-through
//! properties, and the consumer and producer always carry the properties the delivery
//! guarantees rest on (manual offset commits, idempotence, the range assignor). What
//! loopwarden sets only to tune the input consumer or the output producer (a fetch wait,
//! a linger) yields to a value the user gives for every client or for that one. (The
//! changelog's reader and the span producer keep their own tuning: see theirs.)

pub mod c_heap;
pub mod embedded;
pub mod headers;
pub mod settings;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use rdkafka::client::{Client, ClientContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

use settings::KafkaSettings;

/// The context of loopwarden's clients that want nothing else of librdkafka (the
/// changelog's reader, the OTLP ingest's consumer, the demo's reader): their client
/// errors logged as the input consumer's and the producer's are ([`log_client_error`]).
/// rdkafka hands every consumer error to [`ClientContext::error`] before a poll returns
/// it, and its default context logs each at `error`, so a restore's reader logged
/// "Global error: PartitionEOF" at ERROR once a partition read to its end, as it asked to
/// be told.
pub struct ClientErrorsLogged(pub &'static str);

impl ClientContext for ClientErrorsLogged {
    fn error(&self, error: KafkaError, reason: &str) {
        log_client_error(self.0, &error, reason);
    }
}

impl rdkafka::consumer::ConsumerContext for ClientErrorsLogged {}

/// A client error of `client`: one librdkafka retries itself (a broker gone, a request
/// timed out) as a warning; one that no retry mends (a fatal error, credentials or
/// rights refused) as an error; the end of a partition, which only a reader that set
/// `enable.partition.eof` is told and its poll returns as well, not at all.
pub fn log_client_error(client: &str, error: &KafkaError, reason: &str) {
    use RDKafkaErrorCode as E;
    match error.rdkafka_error_code() {
        Some(E::PartitionEOF) => {}
        Some(
            E::Fatal
            // A static member fenced by another with its id: the consumer's fatal error
            // comes with its poll, but a client may report it here too.
            | E::FencedInstanceId
            | E::Authentication
            | E::SaslAuthenticationFailed
            | E::TopicAuthorizationFailed
            | E::GroupAuthorizationFailed
            | E::ClusterAuthorizationFailed
            | E::TransactionalIdAuthorizationFailed,
        ) => tracing::error!(client, %error, reason, "kafka client error"),
        _ => tracing::warn!(client, %error, reason, "kafka client error"),
    }
}

/// A client config with the bootstrap address and the shared pass-through properties.
pub fn client_config(settings: &KafkaSettings, brokers: &str) -> ClientConfig {
    client_config_over(settings, brokers, &[])
}

/// [`client_config`] over loopwarden's own tuning `defaults`: each is set first, so that a
/// value the user gave for every client (`[kafka.client]`) replaces it, as one given for
/// this client alone does later. (Only tuning goes here: what the delivery guarantees rest
/// on is set after, and refused in every section (`settings::OWNED_PROPERTIES`) or
/// checked there (`acks` and the like).)
fn client_config_over(
    settings: &KafkaSettings,
    brokers: &str,
    defaults: &[(&str, &str)],
) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    for (k, v) in defaults {
        c.set(*k, *v);
    }
    for (k, v) in &settings.client {
        c.set(k, v);
    }
    c
}

/// The group timing of consumers on the embedded broker (no `kafka.brokers`: DESIGN §6;
/// a Kafka cluster would refuse a session under its `group.min.session.timeout.ms`, 6 s),
/// under the user's own. librdkafka's mock cluster, unlike a Kafka broker, does not end a
/// rebalance once every member has joined again: when a member joins a group that has
/// members, it waits for the session timeout less a second before it hands out
/// partitions (`rd_kafka_mock_cgrp_classic_rebalance`). With librdkafka's 45 s, after the
/// second worker of `kafka.workers = 2` joined, no worker held any partition of two input
/// topics (the range assignor's rebalance revokes them all) for 44 s, and a lone input
/// topic's moved partitions waited as long. Every member of a group on the embedded
/// broker is a worker of this process, so a short session loses nothing: a rebalance
/// takes 2 s, and a member is dropped only when its client's own threads go 3 s without
/// a heartbeat.
const EMBEDDED_GROUP_TIMING: [(&str, &str); 2] = [
    ("session.timeout.ms", "3000"),
    ("heartbeat.interval.ms", "500"),
];

/// The config of worker `worker`'s consumer: manual offsets (stored state first);
/// cooperative-sticky assignment for one input topic (a joining member does not stop the
/// others), range for several (it keeps partition p of each on one member); static
/// membership when `instance_id` is set.
pub fn consumer_config(settings: &KafkaSettings, brokers: &str, worker: usize) -> ClientConfig {
    let mut tuning = vec![
        // Findings are latency-sensitive: do not let a fetch sit for librdkafka's 500 ms
        // default on brokers that wait out fetch.wait.max.ms.
        ("fetch.wait.max.ms", "20"),
        // Once its queue of fetched records holds `queued.min.messages` (100,000) or
        // `queued.max.messages.kbytes` (64 MiB), a partition's next fetch waits this long
        // (librdkafka's default is 1,000 ms). With a backlog, the worker emptied that
        // queue in about half a second and then waited out the rest of the second with
        // nothing to apply: one worker moved ~110,000 events/s at most, with a core idle,
        // and ~185,000 with this (docs/DEVELOPMENT.md, issue 32's fourteenth look). No
        // longer than a fetch may wait at the broker.
        ("fetch.queue.backoff.ms", "20"),
    ];
    if settings.brokers.is_none() {
        tuning.extend(EMBEDDED_GROUP_TIMING);
    }
    let mut c = client_config_over(settings, brokers, &tuning);
    let strategy = if settings.input_topics.len() == 1 {
        "cooperative-sticky"
    } else {
        "range"
    };
    c.set("group.id", &settings.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // A new group reads its input from the start: not tuning, so a value for every
        // client does not change it (one under `[kafka.consumer]` does).
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", strategy)
        // Input written by transactional producers counts once it is committed; in
        // exactly_once mode this is what makes the changelog and findings atomic.
        .set("isolation.level", "read_committed");
    if let Some(member) = group_instance_id(settings, worker) {
        c.set("group.instance.id", member);
    }
    for (k, v) in &settings.consumer {
        c.set(k, v);
    }
    c
}

/// The static group membership id (`group.instance.id`) of worker `worker`'s consumer:
/// `kafka.instance_id`, and with several workers `<instance_id>-<worker>`, so that the
/// workers of one instance do not fence each other. `None` without an instance id.
pub fn group_instance_id(settings: &KafkaSettings, worker: usize) -> Option<String> {
    let id = settings.instance_id.as_ref()?;
    Some(if settings.workers > 1 {
        format!("{id}-{worker}")
    } else {
        id.clone()
    })
}

/// The producer's config: idempotent, acks from all replicas, short linger (each batch
/// waits for its own deliveries), room for dead-lettering an oversized event whole.
pub fn producer_config(
    settings: &KafkaSettings,
    brokers: &str,
    max_event_bytes: usize,
) -> ClientConfig {
    let room = (max_event_bytes.saturating_mul(2) + 65_536)
        .min(1_000_000_000)
        .to_string();
    let tuning = [("linger.ms", "1"), ("message.max.bytes", room.as_str())];
    let mut c = client_config_over(settings, brokers, &tuning);
    // A user's `acks` can only be another name for this one: `settings::breaks_idempotence`
    // refuses any other under `[kafka.client]` and `[kafka.producer]`.
    c.set("enable.idempotence", "true").set("acks", "all");
    for (k, v) in &settings.producer {
        c.set(k, v);
    }
    c
}

/// The `transactional.id` of worker `worker` in exactly_once mode: stable across restarts
/// of one instance (so a restart fences its predecessor and aborts the transaction it left
/// open) and distinct between instances: `<group>-<instance_id>`, or without an instance
/// id `<group>-<host>-<hash of the state directory>` (two instances on one host never
/// share a state directory: sled locks it).
pub fn transactional_id(settings: &KafkaSettings, state_path: &Path, worker: usize) -> String {
    use sha2::{Digest, Sha256};
    let instance = match &settings.instance_id {
        Some(id) => id.clone(),
        None => {
            let host = gethostname::gethostname().to_string_lossy().into_owned();
            let dir = std::fs::canonicalize(state_path).unwrap_or_else(|_| state_path.into());
            let digest = Sha256::digest(dir.to_string_lossy().as_bytes());
            let hash: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
            format!("{host}-{hash}")
        }
    };
    if settings.workers > 1 {
        format!("{}-{instance}-{worker}", settings.group_id)
    } else {
        format!("{}-{instance}", settings.group_id)
    }
}

/// The low and high watermarks of a partition as the client last saw them in a fetch
/// response (no request is made): `None` before the first fetch answered; a low
/// watermark the client has not learned yet is `None` within.
pub fn cached_watermarks<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    partition: i32,
) -> Option<(Option<i64>, i64)> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: a live client handle, a NUL-terminated topic name and two out-pointers
    // that outlive the call; librdkafka only reads its local cache here.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            client.native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
        .then_some(((low >= 0).then_some(low), high))
}

/// Partition count per topic as the cluster reports it (`None`: the topic is missing).
pub fn partition_counts<C: ClientContext>(
    client: &Client<C>,
    topics: &[&str],
    timeout: Duration,
) -> Result<BTreeMap<String, Option<usize>>, KafkaError> {
    let md = client.fetch_metadata(None, timeout)?;
    Ok(topics
        .iter()
        .map(|t| {
            let count = md
                .topics()
                .iter()
                .find(|m| m.name() == *t && m.error().is_none())
                .map(|m| m.partitions().len())
                .filter(|n| *n > 0);
            (t.to_string(), count)
        })
        .collect())
}

/// Why the topics cannot be consumed as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("topic(s) {} do not exist on {brokers}; create them (see the README) or fix the [kafka] topic names", .missing.join(", "))]
    Missing {
        missing: Vec<String>,
        brokers: String,
    },
    #[error("changelog topic {topic} has {has} partitions but the inputs have {inputs}: partition p of the changelog holds input partition p's state, so they must match (create it anew, or set kafka.changelog_topic)")]
    ChangelogPartitions {
        topic: String,
        has: usize,
        inputs: usize,
    },
    #[error("cannot create changelog topic {topic}: {reason}")]
    CreateChangelog { topic: String, reason: String },
    #[error("input topics are not co-partitioned ({}): a session's events must land in partition p of every input topic, so all input topics need the same partition count", .counts.iter().map(|(t, n)| format!("{t}: {n}")).collect::<Vec<_>>().join(", "))]
    NotCoPartitioned { counts: Vec<(String, usize)> },
}

/// Checks that every topic exists and that the inputs share one partition count,
/// which it returns.
pub fn check_topics(
    counts: &BTreeMap<String, Option<usize>>,
    inputs: &[String],
    brokers: &str,
) -> Result<usize, TopicError> {
    let missing: Vec<String> = counts
        .iter()
        .filter(|(_, n)| n.is_none())
        .map(|(t, _)| t.clone())
        .collect();
    if !missing.is_empty() {
        return Err(TopicError::Missing {
            missing,
            brokers: brokers.to_string(),
        });
    }
    let input_counts: Vec<(String, usize)> = inputs
        .iter()
        .map(|t| (t.clone(), counts[t].unwrap_or(0)))
        .collect();
    let first = input_counts[0].1;
    if input_counts.iter().any(|(_, n)| *n != first) {
        return Err(TopicError::NotCoPartitioned {
            counts: input_counts,
        });
    }
    Ok(first)
}

/// Makes sure the changelog topic exists with `partitions` partitions: creates it
/// (compacted, the broker's default replication, `min.compaction.lag.ms` = `lag`) when
/// `existing` says it is missing. An existing one's lag is checked in the background
/// (a warning when it is shorter; `pipeline::changelog_compaction_lag` says how long).
pub fn ensure_changelog(
    settings: &KafkaSettings,
    brokers: &str,
    partitions: usize,
    existing: Option<usize>,
    lag: Duration,
) -> Result<(), TopicError> {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    let topic = settings.changelog_topic.clone();
    match existing {
        Some(has) if has == partitions => {
            let config = client_config(settings, brokers);
            std::thread::spawn(move || warn_on_short_compaction_lag(&config, &topic, lag));
            return Ok(());
        }
        Some(has) => {
            return Err(TopicError::ChangelogPartitions {
                topic,
                has,
                inputs: partitions,
            })
        }
        None => {}
    }
    let fail = |reason: String| TopicError::CreateChangelog {
        topic: topic.clone(),
        reason,
    };
    let (admin, runtime) = admin_client(&client_config(settings, brokers)).map_err(fail)?;
    let lag_ms = lag.as_millis().to_string();
    let new = NewTopic::new(&topic, partitions as i32, TopicReplication::Fixed(-1))
        .set("cleanup.policy", "compact")
        .set("min.compaction.lag.ms", &lag_ms);
    let options = AdminOptions::new()
        .request_timeout(Some(std::time::Duration::from_secs(30)))
        .operation_timeout(Some(std::time::Duration::from_secs(30)));
    let results = runtime
        .block_on(admin.create_topics(&[new], &options))
        .map_err(|e| fail(e.to_string()))?;
    for r in results {
        match r {
            Ok(_) => {}
            // Another instance created it first.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(fail(code.to_string())),
        }
    }
    tracing::info!(topic = %topic, partitions, min_compaction_lag_ms = %lag_ms, "changelog topic created (compacted)");
    Ok(())
}

type Admin = rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>;

/// An admin client, and a runtime of its own to wait on its requests with (the pipeline's
/// threads have none).
fn admin_client(config: &ClientConfig) -> Result<(Admin, tokio::runtime::Runtime), String> {
    let admin = config.create().map_err(|e: KafkaError| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    Ok((admin, runtime))
}

/// Reads an existing changelog topic's configuration and warns when it is compacted with
/// a `min.compaction.lag.ms` below `lag`; a broker that cannot say is passed over (debug).
fn warn_on_short_compaction_lag(config: &ClientConfig, topic: &str, lag: Duration) {
    use rdkafka::admin::{AdminOptions, ResourceSpecifier};
    let described = (|| -> Result<Option<(String, u64)>, String> {
        let (admin, runtime) = admin_client(config)?;
        let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
        let results = runtime
            .block_on(admin.describe_configs(&[ResourceSpecifier::Topic(topic)], &options))
            .map_err(|e| e.to_string())?;
        let resource = results
            .into_iter()
            .next()
            .ok_or("no answer")?
            .map_err(|e| e.to_string())?;
        let value = |name: &str| resource.get(name).and_then(|e| e.value.clone());
        let policy = value("cleanup.policy").unwrap_or_default();
        let lag_ms = value("min.compaction.lag.ms").and_then(|v| v.parse().ok());
        Ok(lag_ms.map(|ms| (policy, ms)))
    })();
    match described {
        Ok(Some((policy, ms)))
            if policy.contains("compact") && u128::from(ms) < lag.as_millis() =>
        {
            tracing::warn!(
                topic,
                min_compaction_lag_ms = ms,
                wanted_ms = lag.as_millis() as u64,
                "the changelog topic may be compacted before its batches are whole: a restore could then leave open sessions out; raise min.compaction.lag.ms (kafka-configs --alter --entity-type topics --entity-name TOPIC --add-config min.compaction.lag.ms=WANTED)"
            );
        }
        Ok(_) => {}
        Err(error) => {
            tracing::debug!(topic, %error, "could not read the changelog topic's configuration")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(list: &[(&str, Option<usize>)]) -> BTreeMap<String, Option<usize>> {
        list.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    #[test]
    fn co_partitioned_inputs_pass_and_others_are_named() {
        let inputs = vec!["a".to_string(), "b".to_string()];
        let ok = counts(&[("a", Some(4)), ("b", Some(4)), ("out", Some(1))]);
        assert_eq!(check_topics(&ok, &inputs, "k:9092"), Ok(4));
        let skew = counts(&[("a", Some(4)), ("b", Some(6)), ("out", Some(1))]);
        let e = check_topics(&skew, &inputs, "k:9092").unwrap_err();
        assert!(e.to_string().contains("a: 4, b: 6"), "{e}");
        let missing = counts(&[("a", Some(4)), ("b", None), ("out", None)]);
        let e = check_topics(&missing, &inputs, "k:9092").unwrap_err();
        assert!(
            e.to_string().contains("b, out do not exist on k:9092"),
            "{e}"
        );
    }

    #[test]
    fn user_properties_cannot_weaken_delivery() {
        let mut s = KafkaSettings::default();
        s.consumer.insert("fetch.wait.max.ms".into(), "20".into());
        let c = consumer_config(&s, "k:9092", 0);
        assert_eq!(c.get("enable.auto.commit"), Some("false"));
        assert_eq!(c.get("fetch.wait.max.ms"), Some("20"));
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("20"));
        // A user's value wins over loopwarden's defaults.
        s.consumer
            .insert("fetch.queue.backoff.ms".into(), "1000".into());
        let c = consumer_config(&s, "k:9092", 0);
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("1000"));
        // Two input topics: range keeps them co-partitioned; no static membership.
        assert_eq!(c.get("partition.assignment.strategy"), Some("range"));
        assert_eq!(c.get("group.instance.id"), None);
        s.input_topics = vec!["agent.events".into()];
        s.instance_id = Some("lw-a".into());
        s.workers = 2;
        let c = consumer_config(&s, "k:9092", 1);
        assert_eq!(
            c.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        assert_eq!(c.get("group.instance.id"), Some("lw-a-1"));
        let p = producer_config(&s, "k:9092", 1 << 20);
        assert_eq!(p.get("enable.idempotence"), Some("true"));
    }

    #[test]
    fn consumers_on_the_embedded_broker_rebalance_in_seconds_unless_told_otherwise() {
        let mut s = KafkaSettings::default();
        assert_eq!(s.brokers, None, "no brokers: the embedded one");
        let c = consumer_config(&s, "127.0.0.1:9092", 0);
        assert_eq!(c.get("session.timeout.ms"), Some("3000"));
        assert_eq!(c.get("heartbeat.interval.ms"), Some("500"));
        // A user's value wins, for every client or for the consumer.
        s.client.insert("session.timeout.ms".into(), "10000".into());
        s.consumer
            .insert("heartbeat.interval.ms".into(), "1000".into());
        let c = consumer_config(&s, "127.0.0.1:9092", 0);
        assert_eq!(c.get("session.timeout.ms"), Some("10000"));
        assert_eq!(c.get("heartbeat.interval.ms"), Some("1000"));
        // A Kafka cluster keeps librdkafka's group timing.
        let s = KafkaSettings {
            brokers: Some("k:9092".into()),
            ..KafkaSettings::default()
        };
        let c = consumer_config(&s, "k:9092", 0);
        assert_eq!(c.get("session.timeout.ms"), None);
        assert_eq!(c.get("heartbeat.interval.ms"), None);
    }

    #[test]
    fn a_value_given_for_every_client_replaces_loopwardens_tuning() {
        let mut s = KafkaSettings::default();
        let c = consumer_config(&s, "k:9092", 0);
        assert_eq!(c.get("fetch.wait.max.ms"), Some("20"));
        let p = producer_config(&s, "k:9092", 1 << 20);
        assert_eq!(p.get("linger.ms"), Some("1"));
        assert_eq!(p.get("message.max.bytes"), Some("2162688"));
        for (k, v) in [
            ("fetch.wait.max.ms", "500"),
            ("fetch.queue.backoff.ms", "100"),
            ("linger.ms", "5"),
            ("message.max.bytes", "4000000"),
            ("auto.offset.reset", "latest"),
        ] {
            s.client.insert(k.into(), v.into());
        }
        let c = consumer_config(&s, "k:9092", 0);
        assert_eq!(c.get("fetch.wait.max.ms"), Some("500"));
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("100"));
        // Where a new group starts reading is not tuning: only the consumer's own says.
        assert_eq!(c.get("auto.offset.reset"), Some("earliest"));
        let p = producer_config(&s, "k:9092", 1 << 20);
        assert_eq!(p.get("linger.ms"), Some("5"));
        assert_eq!(p.get("message.max.bytes"), Some("4000000"));
        // One given for a client alone replaces the client-wide one there.
        s.consumer.insert("fetch.wait.max.ms".into(), "50".into());
        s.producer.insert("linger.ms".into(), "2".into());
        assert_eq!(
            consumer_config(&s, "k:9092", 0).get("fetch.wait.max.ms"),
            Some("50")
        );
        assert_eq!(
            producer_config(&s, "k:9092", 1 << 20).get("linger.ms"),
            Some("2")
        );
        s.consumer
            .insert("auto.offset.reset".into(), "latest".into());
        assert_eq!(
            consumer_config(&s, "k:9092", 0).get("auto.offset.reset"),
            Some("latest")
        );
    }

    #[test]
    fn transactional_ids_are_stable_per_instance_and_distinct_between_them() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let mut s = KafkaSettings::default();
        assert_eq!(transactional_id(&s, &a, 0), transactional_id(&s, &a, 0));
        assert_ne!(transactional_id(&s, &a, 0), transactional_id(&s, &b, 0));
        assert!(transactional_id(&s, &a, 0).starts_with("loopwarden-"));
        s.instance_id = Some("pod-3".into());
        assert_eq!(transactional_id(&s, &a, 0), "loopwarden-pod-3");
        s.workers = 2;
        assert_eq!(transactional_id(&s, &b, 1), "loopwarden-pod-3-1");
    }
}

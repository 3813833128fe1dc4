//! The embedded broker: librdkafka's in-process mock cluster, so `loopwarden run` and
//! `loopwarden demo` work on one machine with nothing installed (DESIGN §6).
//!
//! Guarantees: the cluster lives exactly as long as the [`EmbeddedBroker`]; topics are
//! created before it is handed out; consumer groups rebalance without the broker's
//! default 3 s initial delay. It keeps data in memory only: it is for trying loopwarden
//! out and for tests, never for production.

use std::ffi::{CStr, CString};

use rdkafka::bindings as rd;
use rdkafka::producer::{BaseProducer, DefaultProducerContext, Producer};
use rdkafka::ClientConfig;

/// Why the embedded broker could not start (fatal).
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("cannot create the embedded broker's client: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    #[error("librdkafka refused to start a mock cluster")]
    Cluster,
    #[error("cannot create topic {topic} on the embedded broker: {code}")]
    Topic { topic: String, code: String },
}

/// A request of the Kafka protocol, by its API key (the protocol's numbers), that
/// [`EmbeddedBroker::fail_requests`] can refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i16)]
pub enum ApiKey {
    Produce = 0,
    OffsetCommit = 8,
    JoinGroup = 11,
    Heartbeat = 12,
    SyncGroup = 14,
}

/// A record for [`EmbeddedBroker::produce`]: its partition, key and payload.
#[cfg(test)]
pub(crate) type TestRecord<'a> = (i32, Option<&'a [u8]>, &'a [u8]);

/// A running in-process Kafka-protocol broker.
pub struct EmbeddedBroker {
    cluster: *mut rd::rd_kafka_mock_cluster_t,
    bootstrap: String,
    // The client that owns the cluster; it must outlive `cluster` (see Drop).
    _owner: BaseProducer<DefaultProducerContext>,
}

// The mock cluster runs on its own librdkafka thread; its handle is only used through
// librdkafka's thread-safe API (topic creation and destroy).
unsafe impl Send for EmbeddedBroker {}
unsafe impl Sync for EmbeddedBroker {}

impl EmbeddedBroker {
    /// Starts a one-broker cluster and creates `topics` with `partitions` partitions each.
    pub fn start(topics: &[&str], partitions: i32) -> Result<EmbeddedBroker, EmbeddedError> {
        let owner: BaseProducer<DefaultProducerContext> =
            ClientConfig::new().set("log_level", "3").create()?;
        // SAFETY: the producer's handle is valid for the call; the cluster it returns is
        // destroyed in Drop before the producer is.
        let cluster = unsafe { rd::rd_kafka_mock_cluster_new(owner.client().native_ptr(), 1) };
        if cluster.is_null() {
            return Err(EmbeddedError::Cluster);
        }
        // SAFETY: `cluster` is a live mock cluster; the bootstrap string it returns is
        // owned by the cluster, so it is copied at once.
        let bootstrap = unsafe {
            rd::rd_kafka_mock_group_initial_rebalance_delay_ms(cluster, 0);
            CStr::from_ptr(rd::rd_kafka_mock_cluster_bootstraps(cluster))
                .to_string_lossy()
                .into_owned()
        };
        let broker = EmbeddedBroker {
            cluster,
            bootstrap,
            _owner: owner,
        };
        for topic in topics {
            broker.create_topic(topic, partitions)?;
        }
        Ok(broker)
    }

    /// Creates a topic (replication factor 1).
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), EmbeddedError> {
        let name = CString::new(topic).map_err(|_| EmbeddedError::Topic {
            topic: topic.to_string(),
            code: "name contains NUL".to_string(),
        })?;
        // SAFETY: live cluster, NUL-terminated name that outlives the call.
        let err =
            unsafe { rd::rd_kafka_mock_topic_create(self.cluster, name.as_ptr(), partitions, 1) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(EmbeddedError::Topic {
                topic: topic.to_string(),
                code: format!("{err:?}"),
            });
        }
        Ok(())
    }

    /// Gives a partition a leader, or none (`None`: its records cannot be produced until
    /// it has one again), as a broker's outage looks to its clients (tests).
    pub fn set_leader(
        &self,
        topic: &str,
        partition: i32,
        leader: Option<i32>,
    ) -> Result<(), EmbeddedError> {
        let fail = |code: String| EmbeddedError::Topic {
            topic: topic.to_string(),
            code,
        };
        let name = CString::new(topic).map_err(|_| fail("name contains NUL".to_string()))?;
        // SAFETY: live cluster, NUL-terminated name that outlives the call.
        let err = unsafe {
            rd::rd_kafka_mock_partition_set_leader(
                self.cluster,
                name.as_ptr(),
                partition,
                leader.unwrap_or(-1),
            )
        };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(fail(format!("{err:?}")));
        }
        Ok(())
    }

    /// Answers the next `count` requests of `api` with `error` instead of serving them,
    /// as a broker that refuses looks to its clients (tests: a coordinator that keeps a
    /// group from settling).
    pub fn fail_requests(&self, api: ApiKey, error: rd::rd_kafka_resp_err_t, count: usize) {
        let errors = vec![error; count];
        // SAFETY: live cluster; librdkafka copies the `count` errors before returning.
        unsafe {
            rd::rd_kafka_mock_push_request_errors_array(
                self.cluster,
                api as i16,
                count,
                errors.as_ptr(),
            )
        };
    }

    /// Serves `api`'s requests again: the errors [`EmbeddedBroker::fail_requests`] left
    /// unused are dropped.
    pub fn clear_request_failures(&self, api: ApiKey) {
        // SAFETY: live cluster.
        unsafe { rd::rd_kafka_mock_clear_request_errors(self.cluster, api as i16) };
    }

    /// `host:port` to give any Kafka client.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// Produces `records` to `topic` and waits until all are on the broker (tests that
    /// read what is there).
    #[cfg(test)]
    pub(crate) fn produce(&self, topic: &str, records: &[TestRecord<'_>]) {
        use rdkafka::producer::BaseRecord;
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap_servers())
            .create()
            .expect("producer");
        for &(partition, key, payload) in records {
            let mut record = BaseRecord::<[u8], [u8]>::to(topic)
                .partition(partition)
                .payload(payload);
            if let Some(key) = key {
                record = record.key(key);
            }
            producer.send(record).expect("queued");
        }
        producer
            .flush(std::time::Duration::from_secs(30))
            .expect("produced");
    }
}

impl Drop for EmbeddedBroker {
    fn drop(&mut self) {
        // SAFETY: created in `start`, destroyed once, while its owner is still alive.
        unsafe { rd::rd_kafka_mock_cluster_destroy(self.cluster) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use std::time::Duration;

    #[test]
    fn starts_with_its_topics_and_a_bootstrap_address() {
        let broker = EmbeddedBroker::start(&["a.in", "b.out"], 3).unwrap();
        assert!(broker.bootstrap_servers().contains(':'));
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", broker.bootstrap_servers())
            .create()
            .unwrap();
        let md = consumer
            .fetch_metadata(Some("a.in"), Duration::from_secs(5))
            .unwrap();
        assert_eq!(md.topics()[0].partitions().len(), 3);
        drop(consumer);
    }
}

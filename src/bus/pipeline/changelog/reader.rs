//! The changelog read from Kafka: a consumer of the group's id that only ever assigns
//! partitions itself (it never joins the group or commits), made on first use.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use rustc_hash::FxHashMap;
use tracing::warn;

use super::{
    ChangelogSource, RecordParts, CHANGELOG_BATCH, CHANGELOG_KIND, CHANGELOG_STATE_FORMAT,
};
use crate::bus::kafka::settings::KafkaSettings;
use crate::bus::kafka::{headers, ClientErrorsLogged};
use crate::bus::pipeline::backoff::Backoff;
use crate::bus::pipeline::PipelineError;
use crate::shutdown::Shutdown;

/// The changelog on the brokers.
pub struct KafkaChangelog {
    settings: KafkaSettings,
    brokers: String,
    shutdown: Shutdown,
    /// Made on first use.
    reader: Option<BaseConsumer<ClientErrorsLogged>>,
}

impl KafkaChangelog {
    pub fn new(settings: &KafkaSettings, brokers: &str, shutdown: &Shutdown) -> KafkaChangelog {
        KafkaChangelog {
            settings: settings.clone(),
            brokers: brokers.to_string(),
            shutdown: shutdown.clone(),
            reader: None,
        }
    }

    fn reader(&mut self) -> Result<&BaseConsumer<ClientErrorsLogged>, PipelineError> {
        if self.reader.is_none() {
            let reader = reader_config(&self.settings, &self.brokers)
                .create_with_context(ClientErrorsLogged("changelog reader"))
                .map_err(PipelineError::Client)?;
            self.reader = Some(reader);
        }
        Ok(self.reader.as_ref().expect("made above"))
    }
}

/// The changelog reader's config. It carries the group's id, so that it can read the
/// group's committed offsets; it only ever assigns partitions itself, so it never joins
/// the group or commits.
fn reader_config(settings: &KafkaSettings, brokers: &str) -> ClientConfig {
    let mut c = crate::bus::kafka::client_config(settings, brokers);
    c.set("group.id", &settings.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        // Says at once when the read reaches the end (see `read`; how long that takes is
        // the fetch wait below).
        .set("enable.partition.eof", "true")
        // Fetched records wait in a queue of at most 2 MiB (librdkafka's default is 64
        // MiB): a restore applies them slower than they arrive, and each restore's queue
        // would otherwise stay in the process's heap (10 MB after the first restore of
        // the hour-long soak, issue 28).
        .set("queued.max.messages.kbytes", "2048")
        // …and a full queue holds the next fetch back this long (librdkafka's default is
        // 1,000 ms, which a restore that empties 2 MiB in a few milliseconds then waited
        // out with nothing to apply).
        .set("fetch.queue.backoff.ms", "10");
    // The end of a read takes a fetch that finds nothing new, which the broker holds up to
    // `fetch.wait.max.ms` (librdkafka's default is 500 ms, which each partition's
    // restore then waited once at its end): 10 ms, unless the user chose a wait for the
    // input consumer (or for every client). That is one chosen for the brokers: Tansu,
    // for one, answers a fetch empty when finding its records takes longer than the
    // fetch may wait, which its in-memory log does once it holds tens of thousands of
    // record batches a partition (`benches/tansu-fetch-wait`: with 80,000 one-record
    // batches a 10 ms fetch read nothing in 60 s, a 500 ms one 2,000 records in 0.6 s; a
    // soak's restore took 55 s for 1,125 records). The restore then ends up to that wait
    // later, once a partition.
    const WAIT: &str = "fetch.wait.max.ms";
    c.set(WAIT, settings.consumer_property(WAIT).unwrap_or("10"));
    c
}

impl ChangelogSource for KafkaChangelog {
    fn release(&mut self) {
        self.reader = None;
    }

    /// One try, 5 s at most, no retry.
    fn high_watermarks(&mut self, topics: &[Arc<str>], partition: i32) -> Vec<Option<i64>> {
        let Ok(reader) = self.reader() else {
            return vec![None; topics.len()];
        };
        topics
            .iter()
            .map(|topic| {
                reader
                    .fetch_watermarks(topic, partition, Duration::from_secs(5))
                    .map_err(|e| warn!(topic = %topic, partition, error = %e, "cannot read an input topic's high watermark at the assignment; its first fetch is waited for instead"))
                    .ok()
                    .map(|(_, high)| high)
            })
            .collect()
    }

    /// The changelog partition's (low, high) watermarks; `None` when shutdown came first.
    fn extent(&mut self, partition: i32) -> Result<Option<(i64, i64)>, PipelineError> {
        let topic = self.settings.changelog_topic.clone();
        let mut backoff = Backoff::new(&self.settings, &self.shutdown);
        let reader = self.reader()?;
        loop {
            match reader.fetch_watermarks(&topic, partition, Duration::from_secs(10)) {
                Ok(w) => return Ok(Some(w)),
                Err(e) => {
                    warn!(topic = %topic, partition, error = %e, what = "read the changelog's extent", "changelog restore step failed; retrying");
                    if backoff.sleep() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// The group's committed input offsets of `partition` (`topic/partition` → offset);
    /// `None` when shutdown came first.
    fn committed(
        &mut self,
        partition: i32,
    ) -> Result<Option<FxHashMap<String, i64>>, PipelineError> {
        let mut backoff = Backoff::new(&self.settings, &self.shutdown);
        let mut tpl = TopicPartitionList::new();
        for t in &self.settings.input_topics {
            tpl.add_partition(t, partition);
        }
        let reader = self.reader()?;
        loop {
            match reader.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
                Ok(tpl) => {
                    return Ok(Some(
                        tpl.elements()
                            .iter()
                            .filter_map(|e| match e.offset() {
                                Offset::Offset(o) => {
                                    Some((format!("{}/{partition}", e.topic()), o))
                                }
                                _ => None,
                            })
                            .collect(),
                    ))
                }
                Err(e) => {
                    warn!(partition, error = %e, what = "read the group's committed offsets", "changelog restore step failed; retrying");
                    if backoff.sleep() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Reads on past `high` until the end: the watermark alone is not enough, since a
    /// broker may report it short of the last produce batch (Tansu reports the last
    /// batch's first offset + 1), which would cut off the batch's commit record.
    fn read(
        &mut self,
        partition: i32,
        from: i64,
        high: i64,
        each: &mut dyn FnMut(i64, RecordParts<'_>) -> Result<(), PipelineError>,
    ) -> Result<(), PipelineError> {
        let topic = self.settings.changelog_topic.clone();
        let shutdown = self.shutdown.clone();
        let reader = self.reader()?;
        let mut tpl = TopicPartitionList::new();
        let _ = tpl.add_partition_offset(&topic, partition, Offset::Offset(from));
        reader.assign(&tpl).map_err(PipelineError::Client)?;
        let mut next = from;
        let mut at_end = false;
        while !(at_end && next >= high) {
            match reader.poll(Duration::from_millis(500)) {
                Some(Ok(m)) => {
                    next = m.offset() + 1;
                    at_end = false;
                    each(m.offset(), parts_of(&m))?;
                }
                Some(Err(KafkaError::PartitionEOF(_))) | None => {
                    if shutdown.is_triggered() {
                        let _ = reader.unassign();
                        return Err(PipelineError::RestoreInterrupted { partition });
                    }
                    // Nothing more to read right now (end of partition, or a poll that
                    // timed out). Transaction markers take offsets but are never handed
                    // out: the read position, not the last record, says how far it got.
                    at_end = true;
                    if let Ok(position) = reader.position() {
                        if let Some(Offset::Offset(o)) = position
                            .find_partition(&topic, partition)
                            .map(|e| e.offset())
                        {
                            next = next.max(o);
                        }
                    }
                }
                Some(Err(e)) => {
                    if shutdown.is_triggered() {
                        let _ = reader.unassign();
                        return Err(PipelineError::RestoreInterrupted { partition });
                    }
                    warn!(partition, error = %e, "changelog read error; retrying");
                }
            }
        }
        let _ = reader.unassign();
        Ok(())
    }
}

/// A changelog record's headers, key and payload.
fn parts_of<'a>(m: &'a BorrowedMessage<'_>) -> RecordParts<'a> {
    let header = |name: &str| m.headers().and_then(|h| headers::value(h, name));
    RecordParts {
        kind: header(CHANGELOG_KIND),
        batch: header(CHANGELOG_BATCH),
        format: header(CHANGELOG_STATE_FORMAT),
        key: m.key(),
        payload: m.payload(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::kafka::embedded::EmbeddedBroker;

    /// Every record of partition 0, as (offset, key) pairs.
    fn read_all(source: &mut KafkaChangelog) -> Vec<(i64, Vec<u8>)> {
        let (low, high) = source.extent(0).unwrap().expect("not shut down");
        let mut read = Vec::new();
        source
            .read(0, low, high, &mut |offset, parts| {
                read.push((offset, parts.key.unwrap_or_default().to_vec()));
                Ok(())
            })
            .unwrap();
        read
    }

    #[test]
    fn a_released_reader_lets_its_client_go_and_the_next_read_makes_another() {
        let broker = EmbeddedBroker::start(&["changes"], 1).expect("mock cluster");
        let keys: Vec<String> = (0..5).map(|i| format!("session-{i}")).collect();
        let records: Vec<_> = keys
            .iter()
            .map(|k| (0, Some(k.as_bytes()), b"state".as_slice()))
            .collect();
        broker.produce("changes", &records);
        let settings = KafkaSettings {
            changelog_topic: "changes".into(),
            ..KafkaSettings::default()
        };
        let mut source =
            KafkaChangelog::new(&settings, broker.bootstrap_servers(), &Shutdown::new());
        let first = read_all(&mut source);
        assert_eq!(first.len(), 5, "{first:?}");
        assert!(source.reader.is_some(), "read without a client");
        source.release();
        assert!(source.reader.is_none(), "the client kept after a release");
        assert_eq!(read_all(&mut source), first, "the read after a release");
    }

    #[test]
    fn the_reader_waits_as_briefly_as_it_can_unless_the_consumer_was_told_to_wait_longer() {
        let mut s = KafkaSettings::default();
        let c = reader_config(&s, "k:9092");
        assert_eq!(c.get("fetch.wait.max.ms"), Some("10"));
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("2048"));
        // Set for every client: the reader too.
        s.client.insert("fetch.wait.max.ms".into(), "200".into());
        let c = reader_config(&s, "k:9092");
        assert_eq!(c.get("fetch.wait.max.ms"), Some("200"));
        // Set for the consumer: that wins, as it does for the consumer.
        s.consumer.insert("fetch.wait.max.ms".into(), "500".into());
        // Only the fetch wait follows the input consumer's settings: its queue does not.
        s.consumer
            .insert("queued.max.messages.kbytes".into(), "65536".into());
        let c = reader_config(&s, "k:9092");
        assert_eq!(c.get("fetch.wait.max.ms"), Some("500"));
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("2048"));
        assert_eq!(c.get("enable.partition.eof"), Some("true"));
    }
}

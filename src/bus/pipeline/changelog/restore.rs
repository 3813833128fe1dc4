//! The changelog's restore: brings a partition's local state up to the changelog's end
//! before the partition is consumed, applying whole batches only (the format and why
//! one produce round is enough: the parent module's docs). Where the records come from
//! is a [`ChangelogSource`]: Kafka (`reader`), or the unit tests' in-memory bus.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use tracing::{info, warn};

use super::reader::KafkaChangelog;
use super::{
    BatchIds, ChangelogSource, CommitValue, RecordParts, SessionFrame, CHANGELOG_POSITION,
};
use crate::bus::kafka::settings::{Delivery, KafkaSettings};
use crate::bus::pipeline::PipelineError;
use crate::engine::store::{
    SledStore, StateBytes, StateStore, StoreBatch, StoreError, STATE_FORMAT,
};
use crate::shutdown::Shutdown;
use crate::telemetry::WriteWatch;

/// What a restore applied.
#[derive(Debug, Default, Clone, Copy)]
pub struct Restored {
    pub session_records: u64,
    pub took: Duration,
}

/// Reads the changelog back into a partition's store.
pub struct Restorer {
    settings: KafkaSettings,
    source: Box<dyn ChangelogSource>,
    /// A restore read changelog records (applied or not) since the last release.
    read_since_release: bool,
}

impl Restorer {
    /// A restorer reading the changelog from the brokers.
    pub fn new(settings: &KafkaSettings, brokers: &str, shutdown: &Shutdown) -> Restorer {
        Restorer::with_source(
            settings,
            Box::new(KafkaChangelog::new(settings, brokers, shutdown)),
        )
    }

    pub fn with_source(settings: &KafkaSettings, source: Box<dyn ChangelogSource>) -> Restorer {
        Restorer {
            settings: settings.clone(),
            source,
            read_since_release: false,
        }
    }

    /// Lets go of the reader's client once an assignment's restores are done, if one of
    /// them read records since the last release; whether it did. The next restore makes
    /// a new one. Its threads fetched every record a restore read, and the
    /// allocator keeps a thread's freed memory with that thread until the thread
    /// allocates again or ends (mimalloc serves the C heap, `bus::kafka::c_heap`): a
    /// reader left idle between rebalances would hold on to the pages of the last
    /// restore's fetched records. What that saves was not shown by the soaks
    /// (docs/DEVELOPMENT.md, issue 32's twenty-ninth look).
    pub fn release(&mut self) -> bool {
        let read = std::mem::take(&mut self.read_since_release);
        if read {
            self.source.release();
        }
        read
    }

    /// The high watermark of partition `partition` of each of `topics`, as the broker
    /// answers now (`None` where it does not within 5 s: one try, no retry).
    pub fn high_watermarks(&mut self, topics: &[Arc<str>], partition: i32) -> Vec<Option<i64>> {
        self.source.high_watermarks(topics, partition)
    }

    /// Brings a partition's local state up to the changelog's end: from the beginning
    /// when the disk holds nothing of it, else from the last changelog offset it
    /// reflects. In exactly_once mode a batch also counts only if the group's committed
    /// input offsets cover it: a broker that hands out records of aborted transactions
    /// (no `read_committed` filtering) cannot make the state run ahead of the offsets.
    /// Blocks until done: the partition is not consumed before.
    /// Each call into the store shows in `watch` while it lasts (`/healthz`), not the
    /// changelog's reading, whose length depends on the changelog.
    pub fn restore(
        &mut self,
        partition: i32,
        store: &mut SledStore,
        db: &sled::Db,
        watch: &WriteWatch,
    ) -> Result<Restored, PipelineError> {
        let shut_down = || PipelineError::RestoreInterrupted { partition };
        let (low, high) = self.source.extent(partition)?.ok_or_else(shut_down)?;
        let committed = match self.settings.delivery {
            Delivery::AtLeastOnce => None,
            Delivery::ExactlyOnce => Some(self.source.committed(partition)?.ok_or_else(shut_down)?),
        };
        let local = watch.during(|| store.offset(CHANGELOG_POSITION))?;
        let from = local.map_or(low, |l| (l + 1).max(low));
        if from >= high {
            // Up to date (the usual case for a partition that stays on its disk). A
            // watermark reported short of the last produce batch (see `read`) cannot hide
            // a batch here: the local position is then inside that batch, which is ours.
            return Ok(Restored::default());
        }
        let started = Instant::now();
        info!(partition, from, to = high, local = ?local, "restoring partition state from the changelog");
        // A restore as slow as a large changelog's, for the rebalance tests (feature
        // `failpoints`: `FAILPOINTS=restore-read=sleep(4000)`).
        #[cfg(feature = "failpoints")]
        fail::eval("restore-read", |_| ());
        let input_keys: Vec<String> = self
            .settings
            .input_topics
            .iter()
            .map(|t| format!("{t}/{partition}"))
            .collect();
        let mut applied_offsets = FxHashMap::default();
        for key in &input_keys {
            if let Some(o) = watch.during(|| store.offset(key))? {
                applied_offsets.insert(key.clone(), o);
            }
        }
        let mut batches = Assembler {
            partition,
            topic: self.settings.changelog_topic.clone(),
            group: self.settings.group_id.clone(),
            input_keys,
            committed,
            applied_offsets,
            ..Assembler::default()
        };
        let read_since_release = &mut self.read_since_release;
        self.source
            .read(partition, from, high, &mut |offset, parts| {
                *read_since_release = true;
                watch.during(|| batches.add(Entry::from_parts(offset, parts), store))
            })?;
        watch.during(|| db.flush()).map_err(StoreError::Io)?;
        info!(
            partition,
            batches = batches.applied,
            session_records = batches.session_records,
            left_out = batches.records.len(),
            uncommitted_batches = batches.uncommitted,
            stale_batches = batches.stale,
            incomplete_commits = batches.incomplete,
            ms = started.elapsed().as_millis() as u64,
            "partition state restored"
        );
        if batches.other_format > 0 {
            warn!(
                partition,
                records = batches.other_format,
                format = STATE_FORMAT,
                "skipped changelog session records of another state format (an upgrade): those sessions start anew"
            );
        }
        Ok(Restored {
            session_records: batches.session_records,
            took: started.elapsed(),
        })
    }
}

/// What a session record says.
enum Change {
    Put(StateBytes),
    Delete,
    /// A state of another format (an upgrade, a rollback): it counts towards its batch
    /// being whole, but is not restored: the session starts anew (its stored state, if
    /// any, is deleted).
    Skip,
}

/// Puts changelog records together into whole batches and stores each one.
#[derive(Default)]
struct Assembler {
    partition: i32,
    /// The changelog topic and the reader's consumer group (whose batches it applies).
    topic: String,
    group: String,
    /// `topic/partition` keys of this partition's inputs.
    input_keys: Vec<String>,
    /// exactly_once: the group's committed offsets a batch must be covered by.
    committed: Option<FxHashMap<String, i64>>,
    /// Session records since the last applied batch, with their batch id (`None`: the
    /// earlier format).
    records: Vec<(Option<u64>, String, Change)>,
    /// The input offsets applied so far (the local state's, then each applied batch's).
    applied_offsets: FxHashMap<String, i64>,
    applied: u64,
    /// Batches behind `applied_offsets`, skipped (see [`Assembler::commit`]).
    stale: u64,
    session_records: u64,
    uncommitted: u64,
    /// Commit records seen before all their batch's session records.
    incomplete: u64,
    other_format: u64,
}

/// A changelog record as the restorer reads it.
struct Entry<'a> {
    offset: i64,
    kind: &'a [u8],
    batch: Option<u64>,
    /// A session record's state format (a header that says none: format 1; one that is
    /// not a number: 0, no format's).
    format: u32,
    key: &'a [u8],
    /// A session record's state, out of its frame when it is framed.
    payload: Option<&'a [u8]>,
}

impl<'a> Entry<'a> {
    fn from_parts(offset: i64, parts: RecordParts<'a>) -> Entry<'a> {
        let key = parts.key.unwrap_or_default();
        // A session record as written since its frame: no headers (a record with a kind
        // header is read by its headers, whatever its value holds).
        if parts.kind.is_none() {
            if let Some(frame) = parts.payload.and_then(SessionFrame::read) {
                return Entry {
                    offset,
                    kind: b"session",
                    batch: Some(frame.batch),
                    format: frame.format,
                    key,
                    payload: Some(frame.state),
                };
            }
        }
        fn decimal<T: std::str::FromStr>(b: &[u8]) -> Option<T> {
            std::str::from_utf8(b).ok()?.parse().ok()
        }
        Entry {
            offset,
            kind: parts.kind.unwrap_or_default(),
            batch: parts.batch.and_then(decimal),
            format: parts.format.map_or(1, |f| decimal(f).unwrap_or(0)),
            key,
            payload: parts.payload,
        }
    }
}

/// For the fuzzers: what a restore of partition 0 (input `in/0`, group `ours`) makes of
/// `records`, read in order from changelog offset 0, in `store`. Stops at the first
/// record a restore stops at, with its error.
#[doc(hidden)]
pub fn assemble(
    records: &[RecordParts<'_>],
    store: &mut impl StateStore,
) -> Result<(), PipelineError> {
    let mut batches = Assembler {
        topic: "loopwarden.changelog".into(),
        group: "ours".into(),
        input_keys: vec!["in/0".into()],
        ..Assembler::default()
    };
    for (offset, parts) in records.iter().enumerate() {
        batches.add(Entry::from_parts(offset as i64, *parts), store)?;
    }
    Ok(())
}

impl Assembler {
    fn add(&mut self, m: Entry<'_>, store: &mut impl StateStore) -> Result<(), PipelineError> {
        let batch = m.batch;
        match m.kind {
            b"commit" => {
                let value = m.payload.unwrap_or_default();
                // A commit record that cannot be read stops the restore: passing over it
                // would drop its batch at the writer's next commit, whose input offsets
                // cover the batch's events, and lose its changes for good.
                let bad = |e: serde_json::Error| PipelineError::Restore {
                    partition: self.partition,
                    reason: format!("commit record at offset {}: {e}", m.offset),
                };
                let (offsets, complete) = if value.first() == Some(&b'[') {
                    // The earlier format: everything before it belongs to the batch.
                    let offsets = serde_json::from_slice(value).map_err(bad)?;
                    (offsets, Some(None))
                } else {
                    let commit: CommitValue = serde_json::from_slice(value).map_err(bad)?;
                    if let Some(writer) = commit.group.filter(|g| *g != self.group) {
                        return Err(PipelineError::ChangelogOfAnotherGroup {
                            topic: self.topic.clone(),
                            partition: self.partition,
                            offset: m.offset,
                            writer,
                            ours: self.group.clone(),
                        });
                    }
                    let seen = self.distinct_records_of(Some(commit.batch));
                    (
                        commit.offsets,
                        (seen == commit.records).then_some(Some(commit.batch)),
                    )
                };
                match complete {
                    Some(batch) => self.commit(batch, offsets, m.offset, store)?,
                    None => self.incomplete += 1,
                }
            }
            b"session" => {
                let change = match m.payload {
                    Some(_) if m.format != STATE_FORMAT => {
                        self.other_format += 1;
                        Change::Skip
                    }
                    Some(state) => Change::Put(StateBytes::from(state)),
                    None => Change::Delete,
                };
                let key = String::from_utf8_lossy(m.key).into_owned();
                self.records.push((batch, key, change));
            }
            other => warn!(
                partition = self.partition,
                offset = m.offset,
                kind = %String::from_utf8_lossy(other),
                "skipping a changelog record of unknown kind"
            ),
        }
        Ok(())
    }

    /// Distinct session keys held for `batch` (a record sent twice counts once).
    fn distinct_records_of(&self, batch: Option<u64>) -> usize {
        let mut keys: Vec<&str> = self
            .records
            .iter()
            .filter(|(b, _, _)| *b == batch)
            .map(|(_, k, _)| k.as_str())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.len()
    }

    /// A complete commit record of `batch` at changelog offset `at`: the batch's records
    /// (in the order written; the last copy of a key wins) are stored with its input
    /// offsets and the changelog position. Records held for earlier batches of the same
    /// writer belong to batches that never completed and are dropped; those of other
    /// writers stay (another writer's batch may be half written around this one, as when
    /// an owner that lost the partition still had a batch in flight).
    fn commit(
        &mut self,
        batch: Option<u64>,
        offsets: Vec<(String, i64)>,
        at: i64,
        store: &mut impl StateStore,
    ) -> Result<(), PipelineError> {
        let (records, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.records)
            .into_iter()
            .partition(|(b, _, _)| *b == batch);
        self.records = match batch {
            // The earlier format: everything before its commit belonged to it.
            None => Vec::new(),
            Some(this) => others
                .into_iter()
                .filter(|(b, _, _)| {
                    b.is_some_and(|b| {
                        BatchIds::writer_of(b) != BatchIds::writer_of(this) || b > this
                    })
                })
                .collect(),
        };
        let covered = self.committed.as_ref().is_none_or(|c| {
            offsets
                .iter()
                .all(|(k, o)| !self.input_keys.contains(k) || c.get(k).is_some_and(|next| o < next))
        });
        if !covered {
            self.uncommitted += 1;
            return Ok(());
        }
        // A batch behind the input already applied was written by an owner that lost the
        // partition while the batch was in flight (at least once, a batch's records are
        // acknowledged after the next batch is polled); the next owner consumed the same
        // events again into later batches, so applying it would turn newer state back.
        // Equal offsets are not behind: a batch of idle closes applies no new event.
        let inputs = || offsets.iter().filter(|(k, _)| self.input_keys.contains(k));
        let behind = inputs().any(|(k, o)| self.applied_offsets.get(k).is_some_and(|a| o < a));
        if behind {
            self.stale += 1;
            return Ok(());
        }
        let applied: Vec<(String, i64)> = inputs().cloned().collect();
        self.applied_offsets.extend(applied);
        // The last copy of each key, in the order the keys first came.
        let mut last: FxHashMap<String, usize> = FxHashMap::default();
        let mut order: Vec<(String, Change)> = Vec::new();
        for (_, key, state) in records {
            match last.get(&key) {
                Some(&i) => order[i].1 = state,
                None => {
                    last.insert(key.clone(), order.len());
                    order.push((key, state));
                }
            }
        }
        let mut changes = StoreBatch::default();
        for (key, change) in order {
            match change {
                Change::Put(state) => changes.puts.push((key, state)),
                // A state this build cannot read: the session starts anew (as the
                // README's upgrades say), not from an older state of it, which would
                // come back without the events the offsets pass over.
                Change::Delete | Change::Skip => changes.deletes.push(key),
            }
        }
        changes.offsets.extend(offsets);
        changes.offsets.push((CHANGELOG_POSITION.to_string(), at));
        self.session_records += (changes.puts.len() + changes.deletes.len()) as u64;
        self.applied += 1;
        store.commit(&changes)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;

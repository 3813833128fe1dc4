//! The changelog: every stored batch of a partition's session states, also written to
//! the changelog topic (partition *p* holds input partition *p*), so that another
//! instance, or this one on a fresh disk, can rebuild the state before consuming.
//!
//! Format: one `session` record per changed session (key: the session id; value: its
//! state in a frame that holds the batch's id and the state format, no headers,
//! [`SessionFrame`]; when it closed, no value, and its kind and batch in headers), then
//! one `commit` record (key `loopwarden/commit`; value: JSON with the consumer group
//! that wrote it, the batch's input offsets and how many session records it has; its
//! kind and batch in headers). Session records written before the frame carried the kind,
//! batch and state format in headers and the state alone: they are read as before.
//!
//! A changelog belongs to one deployment (its consumer group): a restore that meets a
//! commit record of another group stops with an error naming both groups, instead of
//! taking that deployment's sessions for its own (two deployments left on the default
//! changelog topic). Commit records that name no group (written before they did) are
//! taken as the reader's own.
//!
//! The commit record is what makes a batch count: the restorer applies a batch only at a
//! commit record that follows all of the batch's session records (by batch id and
//! count). So no commit record may reach the broker before anything the batch's events
//! produced: at_least_once sends the commit records only once the batch's session
//! records and its outputs (findings, summaries, dead letters) are acknowledged
//! ([`queue_commits`]). Otherwise a crash between a commit record's acknowledgement and
//! a finding's could restore the batch, skip its events and lose the finding for good.
//! (Outputs of the next batch may be in flight then: they come of later events, which a
//! restore of the batch leaves to be consumed again.) exactly_once: one transaction holds outputs, records and commit
//! records (a commit record sent again is applied at its first complete copy). A batch
//! that never got a complete commit (its process died) is never applied: its records are
//! dropped at the same writer's next complete commit, or left out at the end (its events
//! were consumed again, into a later batch). Records of different writers may
//! interleave (an owner that lost the partition while a batch was in flight, and the
//! next owner): batches are told apart by id, never by position.
//!
//! Guarantees: the restorer applies whole batches only, each as one atomic store batch
//! with the changelog position, so a restore interrupted anywhere resumes where it
//! stopped, and a trailing incomplete batch is left out (its events are consumed again);
//! a batch whose input offsets are behind those already applied is skipped (an owner
//! that lost the partition while that batch was in flight wrote it; the next owner
//! consumed its events again into later batches, which it must not turn back). Left as
//! is: such a late batch with exactly the input offsets already applied (the next owner
//! re-applied exactly its events and nothing more yet) is applied; it holds the state
//! after the same events. Records of the earlier format (no batch id; the commit record a
//! JSON array of offsets, produced only after its records were acknowledged) are still
//! read.

mod reader;
mod restore;

pub use restore::{assemble, Restorer};

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use rustc_hash::{FxHashMap, FxHashSet};

use super::bus::Payload;
use super::outbox::{Outbox, Record, Sink};
use super::PipelineError;
use crate::bus::kafka::settings::KafkaSettings;
use crate::engine::store::{StateBytes, StoreBatch, STATE_FORMAT, STATE_FRAME_ROOM};

/// Header of changelog records: `session` or `commit` (see the module docs; a framed
/// session record has none).
pub const CHANGELOG_KIND: &str = "loopwarden.changelog";
const CHANGELOG_COMMIT_KEY: &[u8] = b"loopwarden/commit";
/// Header of changelog session records written before their frame: the state format of
/// their payload (framed records say it in their frame). Records of another format (or
/// none: format 1) are skipped on restore; those sessions start anew.
pub const CHANGELOG_STATE_FORMAT: &str = "loopwarden.state_format";
/// Header of every record of a batch but a framed one (whose frame holds it): the
/// batch's id (decimal), unique per writer.
pub const CHANGELOG_BATCH: &str = "loopwarden.changelog.batch";
/// Store key of the last changelog offset the local state reflects.
pub const CHANGELOG_POSITION: &str = "changelog/position";

/// A commit record's value (fields a later version adds are passed over: an older
/// version rolled back to still reads its commit records).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct CommitValue {
    /// The consumer group of the deployment that wrote it (`None`: written before
    /// records said so). A restore refuses another group's batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<String>,
    batch: u64,
    /// Session records of the batch on this partition.
    records: usize,
    offsets: Vec<(String, i64)>,
}

/// Ids for the batches one writer puts on the changelog: distinct across writers and
/// restarts (the start time, the process id and the writer's number in the process seed
/// them), counting up within one.
pub struct BatchIds(u64);

impl Default for BatchIds {
    fn default() -> BatchIds {
        BatchIds::new()
    }
}

impl BatchIds {
    pub fn new() -> BatchIds {
        static WRITERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let writer = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let seed = nanos ^ (u64::from(std::process::id()) << 32) ^ (writer << 56);
        // The low 20 bits count batches; the seed is spread over the rest.
        BatchIds(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) & !0xF_FFFF)
    }

    /// The writer a batch id belongs to (ids of one writer share all but the low 20
    /// bits, which count its batches).
    pub fn writer_of(batch: u64) -> u64 {
        batch >> 20
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        self.0
    }
}

/// The kind header of a changelog record that has headers (a framed session record has
/// none: [`state_record`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A session: a closed one (no value), or a headed state.
    Session,
    /// A batch's commit record: kind `commit`.
    Commit,
}

/// A changelog record of batch `batch` (its id, in decimal) with the kind and batch
/// headers: a tombstone, a commit record, or the base of a headed state record.
fn record(partition: i32, batch: &[u8], key: &[u8], payload: Payload, kind: Kind) -> Record {
    let name = match kind {
        Kind::Session => "session",
        Kind::Commit => "commit",
    };
    Record {
        sink: Sink::Changelog,
        partition: Some(partition),
        key: key.to_vec(),
        payload,
        headers: vec![
            (CHANGELOG_KIND, Cow::Borrowed(name.as_bytes())),
            (CHANGELOG_BATCH, Cow::Owned(batch.to_vec())),
        ],
        source_headers: Vec::new(),
        source_ms: None,
    }
}

/// The first bytes of a framed session record's value (see [`SessionFrame`]).
const SESSION_FRAME_MAGIC: [u8; 4] = *b"lwS\x01";
/// The frame's bytes before the state: the magic, the batch id and the state format.
const SESSION_FRAME_BYTES: usize = 16;

/// A session record as written since the thirty-eighth look of issue 32: no headers, and
/// a value that starts with [`SESSION_FRAME_MAGIC`], the batch's id (8 bytes, big-endian)
/// and the state's format (4 bytes, big-endian), then the state's bytes. Headers cost
/// librdkafka a list and an allocation each on every record, written into each produce
/// request and read back on restore, and every state written is a record: in the
/// bench's growth phase at a million open sessions the instance spent about 4 % less
/// CPU an event without them (`docs/DEVELOPMENT.md`). A record of the earlier form
/// (kind, batch and format in headers, the state alone in the value) is read as before;
/// one with no kind header whose value is not a frame is of no kind the restorer knows,
/// as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SessionFrame<'a> {
    pub(super) batch: u64,
    pub(super) format: u32,
    pub(super) state: &'a [u8],
}

impl<'a> SessionFrame<'a> {
    /// The frame of `value`, when it is one.
    pub(super) fn read(value: &'a [u8]) -> Option<SessionFrame<'a>> {
        let (head, state) = value.split_at_checked(SESSION_FRAME_BYTES)?;
        let (magic, rest) = head.split_at(SESSION_FRAME_MAGIC.len());
        if magic != SESSION_FRAME_MAGIC {
            return None;
        }
        let (batch, format) = rest.split_at(8);
        Some(SessionFrame {
            batch: u64::from_be_bytes(batch.try_into().expect("eight bytes")),
            format: u32::from_be_bytes(format.try_into().expect("four bytes")),
            state,
        })
    }

    /// The frame of batch `batch`, in this build's state format, into the room before a
    /// state.
    fn write_into(room: &mut [u8; SESSION_FRAME_BYTES], batch: u64) {
        let (magic, rest) = room.split_at_mut(SESSION_FRAME_MAGIC.len());
        let (batch_bytes, format) = rest.split_at_mut(8);
        magic.copy_from_slice(&SESSION_FRAME_MAGIC);
        batch_bytes.copy_from_slice(&batch.to_be_bytes());
        format.copy_from_slice(&STATE_FORMAT.to_be_bytes());
    }

    /// `state`'s value in a frame of batch `batch` (a copy: for tests).
    #[cfg(test)]
    pub(super) fn write(batch: u64, state: &[u8]) -> Vec<u8> {
        let mut bytes = StateBytes::from(state);
        bytes
            .framed(|room| SessionFrame::write_into(room, batch))
            .to_vec()
    }
}

// The frame fills the room the engine leaves before each state.
const _: () = assert!(SESSION_FRAME_BYTES == STATE_FRAME_ROOM);

/// How session records go on the changelog (`kafka.changelog_headers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionRecords {
    /// Framed ([`SessionFrame`]): no headers, the value the state's own allocation.
    Framed,
    /// As builds before the frame wrote them, and as they read them: kind, batch and
    /// state format in headers, the state alone in the value (a copy of it). For a rolling
    /// upgrade from such a build (its members may restore what the new ones wrote), or a
    /// rollback to one.
    Headed,
}

impl SessionRecords {
    pub fn of(settings: &KafkaSettings) -> SessionRecords {
        if settings.changelog_headers {
            SessionRecords::Headed
        } else {
            SessionRecords::Framed
        }
    }
}

/// The state format header's value: the same for every headed session record.
static STATE_FORMAT_VALUE: LazyLock<Vec<u8>> =
    LazyLock::new(|| STATE_FORMAT.to_string().into_bytes());

/// A session's state as its headed changelog record ([`SessionRecords::Headed`]).
fn headed_state_record(partition: i32, batch: &[u8], key: &[u8], state: &StateBytes) -> Record {
    let mut r = record(
        partition,
        batch,
        key,
        Payload::new(state.to_vec()),
        Kind::Session,
    );
    r.headers.push((
        CHANGELOG_STATE_FORMAT,
        Cow::Borrowed(STATE_FORMAT_VALUE.as_slice()),
    ));
    r
}

/// A session's state as its changelog record: framed, without headers, its value the
/// state's own allocation (the frame written into its room).
fn state_record(partition: i32, batch: u64, key: &[u8], state: &mut StateBytes) -> Record {
    Record {
        sink: Sink::Changelog,
        partition: Some(partition),
        key: key.to_vec(),
        payload: state.framed(|room| SessionFrame::write_into(room, batch)),
        headers: Vec::new(),
        source_headers: Vec::new(),
        source_ms: None,
    }
}

/// Queues a batch's changelog records in the outbox, one set per changed partition: its
/// session records, then its commit record (exactly_once: one transaction holds them).
pub fn queue(
    outbox: &mut Outbox,
    batches: &mut [(i32, StoreBatch)],
    batch: u64,
    group: &str,
    form: SessionRecords,
) {
    queue_sessions(outbox, batches, batch, form);
    queue_commits(outbox, batches, batch, group);
}

/// Queues a batch's session records only (at_least_once: its commit records follow once
/// these and the batch's outputs are acknowledged, [`queue_commits`]).
pub fn queue_sessions(
    outbox: &mut Outbox,
    batches: &mut [(i32, StoreBatch)],
    batch: u64,
    form: SessionRecords,
) {
    // Written once a batch, not formatted again for each of its tombstones.
    let batch_header = batch.to_string().into_bytes();
    for (partition, changes) in batches {
        for (id, state) in &mut changes.puts {
            let id = id.as_bytes();
            outbox.push(match form {
                SessionRecords::Framed => state_record(*partition, batch, id, state),
                SessionRecords::Headed => headed_state_record(*partition, &batch_header, id, state),
            });
        }
        for id in &changes.deletes {
            outbox.push(record(
                *partition,
                &batch_header,
                id.as_bytes(),
                Payload::default(),
                Kind::Session,
            ));
        }
    }
}

/// Queues the commit records of the batch, one per changed partition, written by the
/// consumer group `group`.
pub fn queue_commits(outbox: &mut Outbox, batches: &[(i32, StoreBatch)], batch: u64, group: &str) {
    for (partition, changes) in batches {
        let value = CommitValue {
            group: Some(group.to_string()),
            batch,
            records: distinct_keys(changes),
            offsets: changes.offsets.clone(),
        };
        let payload = serde_json::to_vec(&value).expect("plain data serialises");
        outbox.push(record(
            *partition,
            batch.to_string().as_bytes(),
            CHANGELOG_COMMIT_KEY,
            payload.into(),
            Kind::Commit,
        ));
    }
}

/// The distinct keys of a batch's session records: what the restorer counts, a key
/// written twice counting once, and what a batch's commit record must say for a restore
/// to take the batch. A batch's puts are one a session ([`StoreBatch::puts`]); its
/// deletions may repeat (a session closed, reopened and closed again), and a key both put
/// and deleted counts once. Counted without sorting the keys: at a million open
/// sessions a batch puts tens of thousands, and sorting them was 1.7 % of a worker's
/// time, most of it comparing ids out of the cache.
fn distinct_keys(changes: &StoreBatch) -> usize {
    let puts = changes.puts.len();
    if changes.deletes.is_empty() {
        return puts;
    }
    let deleted: FxHashSet<&str> = changes.deletes.iter().map(String::as_str).collect();
    let put_too = changes
        .puts
        .iter()
        .filter(|(id, _)| deleted.contains(id.as_str()))
        .count();
    puts + deleted.len() - put_too
}

/// How long the changelog's records stay out of the log cleaner's reach
/// (`min.compaction.lag.ms`). A batch counts on restore only at its commit record, and
/// the commit records of a partition share one key, so compaction keeps the last one
/// only: were a batch's commit record compacted away while its session records are
/// still the latest of their sessions, a restore would leave those sessions out. While
/// loopwarden keeps up with its input, a session open without a write for longer than
/// its gap, plus the idle clock's longest wait (`idle_after` × [`super::BEHIND_WAITS`] for a
/// partition whose events wait on the broker), is closed, and the close is a newer
/// record; twice that, and at least an hour, keeps open sessions' batches whole (a commit
/// interval writes a close up to a minute later, well within the doubling). (An
/// instance that takes a partition back after longer than the lag, or a consumer behind
/// its input for that long, is not covered: see the README.)
pub fn changelog_compaction_lag(session_gap: Duration, idle_after: Duration) -> Duration {
    let longest_idle_wait = idle_after.saturating_mul(super::BEHIND_WAITS);
    (session_gap.saturating_add(longest_idle_wait))
        .saturating_mul(2)
        .max(Duration::from_secs(3600))
}

/// Where a restore reads the changelog from: Kafka (`reader::KafkaChangelog`), or the unit
/// tests' in-memory bus.
pub trait ChangelogSource: Send {
    /// The changelog partition's (low, high) watermarks; `None` when shutdown came first.
    fn extent(&mut self, partition: i32) -> Result<Option<(i64, i64)>, PipelineError>;
    /// The group's committed input offsets of `partition` (`topic/partition` → offset);
    /// `None` when shutdown came first.
    fn committed(
        &mut self,
        partition: i32,
    ) -> Result<Option<FxHashMap<String, i64>>, PipelineError>;
    /// Hands every changelog record of `partition` from `from` to the end, with its
    /// offset, to `each`: up to `high`, the watermark read before, and on until the
    /// reader reaches the end.
    fn read(
        &mut self,
        partition: i32,
        from: i64,
        high: i64,
        each: &mut dyn FnMut(i64, RecordParts<'_>) -> Result<(), PipelineError>,
    ) -> Result<(), PipelineError>;
    /// The high watermark of partition `partition` of each of `topics`, as the broker
    /// answers now (`None` where it does not).
    fn high_watermarks(&mut self, topics: &[Arc<str>], partition: i32) -> Vec<Option<i64>>;
    /// Lets go of what reading held between restores (the Kafka reader's client: see
    /// [`Restorer::release`]). The next call makes it again.
    fn release(&mut self) {}
}

/// A changelog record as it comes off the broker: its headers' values, key and payload.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RecordParts<'a> {
    pub kind: Option<&'a [u8]>,
    pub batch: Option<&'a [u8]>,
    pub format: Option<&'a [u8]>,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
}

#[cfg(test)]
mod tests {
    use super::super::memory::{Bus, Landed};
    use super::*;

    /// What `queue_with` queues in an outbox on an in-memory bus, as it lands on the
    /// changelog topic.
    fn landed(settings: &KafkaSettings, queue_with: impl FnOnce(&mut Outbox)) -> Vec<Landed> {
        let bus = Bus::default();
        let mut outbox = Outbox::on_memory_bus(&bus, settings);
        queue_with(&mut outbox);
        outbox.send_all();
        let shutdown = crate::shutdown::Shutdown::new();
        let mut backoff = super::super::backoff::Backoff::new(settings, &shutdown);
        outbox.settle_below(outbox.end(), &mut backoff).unwrap();
        bus.records(&settings.changelog_topic)
    }

    #[test]
    fn the_changelog_outlives_an_open_sessions_longest_silence_twice_and_an_hour_at_least() {
        let lag = |gap, idle| {
            changelog_compaction_lag(Duration::from_secs(gap), Duration::from_secs(idle)).as_secs()
        };
        assert_eq!(lag(1800, 5), 3640);
        assert_eq!(lag(86_400, 5), 172_840);
        assert_eq!(lag(600, 3600), 30_000);
        assert_eq!(lag(1, 5), 3600);
        assert!(lag(u64::MAX, 5) > 0, "saturates, never wraps");
    }

    /// What a batch puts on the changelog, as it lands: a state's record is framed (no
    /// headers; its batch and state format, big-endian, before the state), a tombstone
    /// says its kind and batch in headers, the commit record its kind and batch (the
    /// format restores read).
    #[test]
    fn a_batchs_records_carry_their_kind_batch_and_state_format() {
        let changes = StoreBatch {
            puts: vec![("s1".to_string(), b"state".to_vec().into())],
            deltas: Vec::new(),
            deletes: vec!["s2".to_string()],
            offsets: vec![("in/3".to_string(), 41)],
        };
        let mut batches = [(3, changes)];
        let landed = landed(&KafkaSettings::default(), |outbox| {
            queue(outbox, &mut batches, 77, "g", SessionRecords::Framed)
        });
        // The frame went into the state's own room: its record's value is not a copy.
        assert_eq!(batches[0].1.puts[0].1.room(), SessionFrame::write(77, b""));
        let headers = |i: usize| -> Vec<(String, Vec<u8>)> {
            landed[i]
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone().unwrap()))
                .collect()
        };
        let header = |k: &str, v: &[u8]| (k.to_string(), v.to_vec());
        assert_eq!(landed.len(), 3);
        assert_eq!(landed[0].key, b"s1");
        let mut framed = b"lwS\x01".to_vec();
        framed.extend(77u64.to_be_bytes());
        framed.extend(STATE_FORMAT.to_be_bytes());
        framed.extend(b"state");
        assert_eq!(landed[0].payload.as_deref(), Some(framed.as_slice()));
        assert!(headers(0).is_empty(), "{:?}", headers(0));
        assert_eq!(
            SessionFrame::read(&framed),
            Some(SessionFrame {
                batch: 77,
                format: STATE_FORMAT,
                state: b"state"
            })
        );
        assert_eq!(landed[1].key, b"s2");
        assert_eq!(landed[1].payload, None, "a tombstone has no value");
        assert_eq!(
            headers(1),
            [
                header(CHANGELOG_KIND, b"session"),
                header(CHANGELOG_BATCH, b"77")
            ]
        );
        assert_eq!(landed[2].key, CHANGELOG_COMMIT_KEY);
        assert_eq!(
            headers(2),
            [
                header(CHANGELOG_KIND, b"commit"),
                header(CHANGELOG_BATCH, b"77")
            ]
        );
        let commit: CommitValue =
            serde_json::from_slice(landed[2].payload.as_ref().unwrap()).unwrap();
        assert_eq!(
            (commit.group.as_deref(), commit.batch, commit.records),
            (Some("g"), 77, 2)
        );
    }

    /// `kafka.changelog_headers`: a state's record lands as builds before the frame
    /// wrote it (kind, batch and format in headers, the state alone), which those builds
    /// and this one read.
    #[test]
    fn headed_session_records_are_written_as_before_the_frame() {
        let settings = KafkaSettings {
            changelog_headers: true,
            ..KafkaSettings::default()
        };
        assert_eq!(SessionRecords::of(&settings), SessionRecords::Headed);
        assert_eq!(
            SessionRecords::of(&KafkaSettings::default()),
            SessionRecords::Framed
        );
        let changes = StoreBatch {
            puts: vec![("s1".to_string(), b"state".to_vec().into())],
            ..StoreBatch::default()
        };
        let landed = landed(&settings, |outbox| {
            queue_sessions(outbox, &mut [(0, changes)], 78, SessionRecords::Headed)
        });
        assert_eq!(landed.len(), 1);
        assert_eq!(landed[0].payload.as_deref(), Some(b"state".as_slice()));
        let headers: Vec<(String, Vec<u8>)> = landed[0]
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().unwrap()))
            .collect();
        assert_eq!(
            headers,
            [
                (CHANGELOG_KIND.to_string(), b"session".to_vec()),
                (CHANGELOG_BATCH.to_string(), b"78".to_vec()),
                (
                    CHANGELOG_STATE_FORMAT.to_string(),
                    STATE_FORMAT.to_string().into_bytes()
                ),
            ]
        );
    }

    proptest::proptest! {
        /// A batch's records as the writer queues them, read back by the restore, are
        /// taken whole: the count its commit record carries ([`distinct_keys`]) is the
        /// restorer's own, for any batch of distinct puts and deletions that repeat or
        /// name a put too (the last record of a key wins: a key put and deleted is gone).
        /// A count the restorer did not find would leave the batch out, offsets and all:
        /// the offsets' check is what catches a wrong count.
        #[test]
        fn a_batch_written_is_restored_whole_with_its_offsets(
            puts in proptest::collection::btree_set(0u8..24, 0..12),
            deletes in proptest::collection::vec(0u8..24, 0..12),
            form in proptest::prop_oneof![
                proptest::strategy::Just(SessionRecords::Framed),
                proptest::strategy::Just(SessionRecords::Headed),
            ],
        ) {
            use crate::engine::store::{MemoryStore, StateStore};

            let state_of = |k: u8| format!("state of s{k}").into_bytes();
            let changes = StoreBatch {
                puts: puts.iter().map(|&k| (format!("s{k}"), state_of(k).into())).collect(),
                deltas: Vec::new(),
                deletes: deletes.iter().map(|k| format!("s{k}")).collect(),
                offsets: vec![("in/0".to_string(), 41)],
            };
            let landed = landed(&KafkaSettings::default(), |outbox| {
                queue(outbox, &mut [(0, changes)], 7, "ours", form)
            });
            let parts: Vec<RecordParts<'_>> = landed.iter().map(|r| r.parts()).collect();
            let mut store = MemoryStore::new();
            restore::assemble(&parts, &mut store).unwrap();

            proptest::prop_assert_eq!(store.offset("in/0").unwrap(), Some(41));
            for k in 0u8..24 {
                let kept = puts.contains(&k) && !deletes.contains(&k);
                let stored = store.session_bytes(&format!("s{k}")).unwrap();
                proptest::prop_assert_eq!(stored, kept.then(|| state_of(k)), "s{}", k);
            }
        }
    }

    #[test]
    fn batch_ids_differ_between_writers_and_count_up() {
        let (mut a, mut b) = (BatchIds::new(), BatchIds::new());
        let (a1, a2, b1) = (a.next(), a.next(), b.next());
        assert_eq!(a2, a1 + 1);
        assert_ne!(a1, b1);
    }
}

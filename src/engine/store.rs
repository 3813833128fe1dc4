//! Session state storage (DESIGN §4): a small trait with two implementations, sled on
//! disk (each partition's states as a log of records, whole states and deltas from the
//! state before, [`records`]) and an in-memory map for `replay` and tests.
//!
//! Guarantees: [`StateStore::commit`] is atomic — session puts, deletes and the partition
//! offsets of one batch are all visible after it returns, or none are — and durable for
//! the sled store (flushed to disk before it returns), which is what lets the pipeline
//! commit Kafka offsets afterwards; a commit that failed may be tried again (the batch
//! after a failed one is written whole). A state (or a delta) that cannot be decoded is
//! reported with its session, never silently dropped.

use std::cell::{RefCell, RefMut};
use std::collections::BTreeMap;
use std::path::Path;

use rustc_hash::FxHashMap;

mod records;
pub use records::BadRecord;
use records::{Entry, Log, Writer};

use crate::engine::state::{CorruptState, DeltaError, SessionState, DELTA_FORMAT};

/// Storage failures. `Io` is transient (retry with backoff); `Corrupt` is poison for one
/// key; `Open` is fatal at start.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open state store at {path}: {source}")]
    Open { path: String, source: sled::Error },
    #[error("state store at {path} holds store format {found}; this build reads store format {expected} and upgrades formats 5 and 6 (move it aside and start with an empty one: with the changelog on, its partitions are restored from it)")]
    Format {
        path: String,
        found: String,
        expected: u32,
    },
    #[error("state store I/O failed: {0}")]
    Io(#[from] sled::Error),
    #[error("cannot read or record the state store's segment, {path}: {source}")]
    SegmentFile {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} holds {found:?}, not a segment this build opens ({SEGMENT_BYTES} or {LEGACY_SEGMENT_BYTES} bytes): delete that file (the segment is then read from sled's own files) or move the state directory aside (with the changelog on, its partitions are restored from it)")]
    Segment { path: String, found: String },
    #[error("session {session}: {source}")]
    Corrupt {
        session: String,
        source: CorruptState,
    },
    #[error("session {session}: {source}")]
    BadDelta { session: String, source: DeltaError },
}

/// Bytes kept free before each state a batch hands on, for the changelog's frame
/// (`bus::pipeline::changelog::SessionFrame`): its record's value is then the same
/// allocation as the state, the frame written into this room, not a copy.
pub const STATE_FRAME_ROOM: usize = 16;

/// A state's bytes as a batch hands them on, shared by whoever sends or stores them,
/// after [`STATE_FRAME_ROOM`] bytes of room. It reads (derefs, compares, prints) as the
/// state's bytes alone; [`StateBytes::framed`] hands out the whole allocation.
#[derive(Clone)]
pub struct StateBytes(std::sync::Arc<Vec<u8>>);

impl StateBytes {
    /// Bytes that start with the room (as [`SessionState::to_bytes_after_room_with`]
    /// writes them), taken as they are.
    ///
    /// # Panics
    /// When `with_room` is shorter than the room (a bug of the caller's).
    pub fn with_room(with_room: Vec<u8>) -> StateBytes {
        assert!(with_room.len() >= STATE_FRAME_ROOM, "no room for the frame");
        StateBytes(std::sync::Arc::new(with_room))
    }

    /// The whole allocation, its room written by `frame` first: in place while nothing
    /// else holds these bytes (as when a batch's states are queued for the changelog,
    /// before the store writer has them), otherwise into a copy that this value holds
    /// from then on (bytes shared are never changed: librdkafka may be reading them).
    pub fn framed(
        &mut self,
        frame: impl FnOnce(&mut [u8; STATE_FRAME_ROOM]),
    ) -> std::sync::Arc<Vec<u8>> {
        let all = std::sync::Arc::make_mut(&mut self.0);
        frame(
            (&mut all[..STATE_FRAME_ROOM])
                .try_into()
                .expect("the room is there"),
        );
        self.0.clone()
    }
}

#[cfg(test)]
impl StateBytes {
    /// The room before the state (tests: whether a frame went into this allocation).
    pub(crate) fn room(&self) -> &[u8] {
        &self.0[..STATE_FRAME_ROOM]
    }
}

impl std::ops::Deref for StateBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0[STATE_FRAME_ROOM..]
    }
}

impl Default for StateBytes {
    fn default() -> StateBytes {
        StateBytes::from(&[][..])
    }
}

/// A copy after a room of its own (restores, tests: not the engine's path).
impl From<&[u8]> for StateBytes {
    fn from(state: &[u8]) -> StateBytes {
        let mut with_room = Vec::with_capacity(STATE_FRAME_ROOM + state.len());
        with_room.resize(STATE_FRAME_ROOM, 0);
        with_room.extend_from_slice(state);
        StateBytes::with_room(with_room)
    }
}

impl From<Vec<u8>> for StateBytes {
    fn from(state: Vec<u8>) -> StateBytes {
        StateBytes::from(state.as_slice())
    }
}

impl PartialEq for StateBytes {
    fn eq(&self, other: &StateBytes) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for StateBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// One atomic unit of state changes.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StoreBatch {
    /// Sessions' new states, whole (what the changelog and the in-memory store take),
    /// one a session (the engine takes them out of its map of changed sessions), shared:
    /// a changelog record's payload is the same allocation, framed in the room before
    /// the state, not a copy (a batch of seconds at a million sessions writes a million
    /// states at its end, and each copy was fresh memory the kernel zeroed).
    pub puts: Vec<(String, StateBytes)>,
    /// Some puts' states as deltas from the state the session's put before wrote
    /// (`engine::state::delta`), by their index in `puts`, ascending: the sled store
    /// writes the delta in place of the whole state while the session's chain of deltas is
    /// short. Only for a session whose state before was handed to the same store in the
    /// batch before, as the engine's batches are, in order.
    pub deltas: Vec<(u32, Vec<u8>)>,
    pub deletes: Vec<String>,
    /// Last applied offset per input partition (key: `topic/partition`).
    pub offsets: Vec<(String, i64)>,
}

/// Puts of a batch whose chains the store writer looks up together before writing them
/// (`records::Writer::warm`): a few hundred entries' lines stay in a core's cache.
const WARM_WINDOW: usize = 256;

/// Where session states live between events.
pub trait StateStore {
    /// Every stored session (at start, or when a partition is assigned).
    fn load_sessions(&self) -> Result<Vec<(String, SessionState)>, StoreError>;
    /// The last applied offset of a partition.
    fn offset(&self, partition: &str) -> Result<Option<i64>, StoreError>;
    /// Applies a batch atomically (and durably, for on-disk stores).
    fn commit(&mut self, batch: &StoreBatch) -> Result<(), StoreError>;
    /// Stored bytes of one session (for size measurements and tests).
    fn session_bytes(&self, session: &str) -> Result<Option<Vec<u8>>, StoreError>;
}

/// A stored session as loaded: a state (or a delta) that cannot be read is poison for
/// its session only (logged and passed over: the session starts anew, and the sled
/// store's deltas after it with it), never for the partition, whose every instance would
/// otherwise fail at each start.
fn passed_over(session: &str, state: Result<SessionState, StoreError>) -> Option<SessionState> {
    state
        .map_err(|error| {
            tracing::warn!(
                session_id = %crate::contract::event::printable(session),
                %error,
                "skipping a stored session state that cannot be read; the session starts anew"
            )
        })
        .ok()
}

fn decode(session: &str, bytes: &[u8]) -> Result<SessionState, StoreError> {
    SessionState::from_bytes(bytes).map_err(|source| StoreError::Corrupt {
        session: session.to_string(),
        source,
    })
}

/// The state a stored delta gives, from the one before it.
fn apply(session: &str, before: &SessionState, delta: &[u8]) -> Result<SessionState, StoreError> {
    SessionState::apply_delta(before, delta).map_err(|source| StoreError::BadDelta {
        session: session.to_string(),
        source,
    })
}

/// In-memory store.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    sessions: BTreeMap<String, Vec<u8>>,
    offsets: BTreeMap<String, i64>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

impl StateStore for MemoryStore {
    fn load_sessions(&self) -> Result<Vec<(String, SessionState)>, StoreError> {
        let mut out = Vec::new();
        for (k, v) in &self.sessions {
            if let Some(state) = passed_over(k, decode(k, v)) {
                out.push((k.clone(), state));
            }
        }
        Ok(out)
    }

    fn offset(&self, partition: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.offsets.get(partition).copied())
    }

    fn commit(&mut self, batch: &StoreBatch) -> Result<(), StoreError> {
        for (k, v) in &batch.puts {
            self.sessions.insert(k.clone(), v.to_vec());
        }
        for k in &batch.deletes {
            self.sessions.remove(k);
        }
        for (p, o) in &batch.offsets {
            self.offsets.insert(p.clone(), *o);
        }
        Ok(())
    }

    fn session_bytes(&self, session: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.sessions.get(session).cloned())
    }
}

/// Sessions of the per-session layout (store format 5), read only to upgrade it.
const SESSION_PREFIX: &[u8] = b"s/";
const OFFSET_PREFIX: &[u8] = b"o/";

fn key(prefix: &[u8], name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + name.len());
    k.extend_from_slice(prefix);
    k.extend_from_slice(name.as_bytes());
    k
}

/// sled on disk: one tree, the sessions' states in records under `r/` ([`records`]),
/// offsets under `o/`, so a batch of both is one atomic `apply_batch`.
pub struct SledStore {
    db: sled::Db,
    tree: sled::Tree,
    /// Whether `commit` flushes the database itself (else the owner flushes it once
    /// for the batches of several trees).
    flush_on_commit: bool,
    /// Where its records are cut ([`records::record_bytes`] of the directory's segment).
    record_bytes: usize,
    /// Where each session's newest state is, read from the records on first use and kept
    /// as batches are written; `None` until then, and again when a batch could not be
    /// planned (sled's tree is what is true).
    log: RefCell<Option<Log>>,
    /// The writes of a batch sled did not take: it applies a batch's writes one by one
    /// and stops at the first error, so its tree may hold part of them (its recovery at
    /// the next open is what is atomic). They are applied again, whole, before the next
    /// batch, so the tree ends as the index describes it whatever part was kept.
    unapplied: Option<Writes>,
    /// Whether the last commit failed (at any point: its plan, its writes, the flush):
    /// the tree may hold its writes, which its retry must not repeat as deltas, so the
    /// next commit writes whole states only; cleared once one succeeds.
    failed: bool,
    /// Bytes of the values this store's batches put in sled's tree (its records and
    /// offsets), since it was opened.
    written_bytes: u64,
    /// Tests: the next apply writes this many of its writes, then fails.
    #[cfg(test)]
    fail_after: Option<usize>,
    /// Tests: the next plan fails (as reading a record to fold it fails).
    #[cfg(test)]
    fail_plan: bool,
}

/// A batch's writes to the tree, in the order sled applies them (by key): `None` removes.
type Writes = BTreeMap<Vec<u8>, Option<sled::IVec>>;

/// How long to wait for the state directory's lock: a handle dropped a moment ago (sled
/// releases the lock from its flusher thread) or a previous process still exiting.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The encoding of session states (on disk and on the changelog). Bump it when
/// `SessionState`'s encoding changes: `state::layout_tests` fails until it is (format 5:
/// each detector's counters its own, in the list's order). [`STORE_FORMAT`] goes with it.
pub const STATE_FORMAT: u32 = 5;

/// The state directory's format: the states' encoding and how they are laid out. Format
/// 7: [`STATE_FORMAT`] 5's states in records ([`records`]) as whole states and deltas
/// ([`DELTA_FORMAT`] 1); format 6 held whole states only (its records are format 7's,
/// and it is marked 7 when opened); format 5 held one key per session and is upgraded in
/// place when opened.
pub const STORE_FORMAT: u32 = 7;
const _: () = assert!(
    STORE_FORMAT == STATE_FORMAT + 2 && DELTA_FORMAT == 1,
    "a new state or delta format is a new store format too: bump STORE_FORMAT with them"
);
/// The store format of records of whole states only, read as they are.
const WHOLE_RECORDS_FORMAT: u32 = 6;
/// The state encoding of [`WHOLE_RECORDS_FORMAT`]'s states (read only while it is this
/// build's).
const WHOLE_RECORDS_STATE_FORMAT: u32 = 5;
/// The store format of one key per session, whose states this build reads.
const PER_SESSION_FORMAT: u32 = 5;
/// The state encoding of [`PER_SESSION_FORMAT`]'s states (upgraded only while it is
/// this build's).
const PER_SESSION_STATE_FORMAT: u32 = 5;
/// Marks a directory while format 5 is rewritten as format 6: a build of format 5
/// refuses it (an unknown format), as it must, since part of it may be records already;
/// this build resumes the upgrade.
const UPGRADING_TO_RECORDS: u32 = 0x0005_0006;
/// The key of the format marker (named when it held the state format; it holds the
/// store format).
const FORMAT_KEY: &[u8] = b"loopwarden/state-format";

/// sled's log segment in a state directory this build creates. Its records are cut at
/// [`records::record_bytes`] of it: the longer the segment, the longer the records sled
/// keeps in its log, and the less CPU it spends a byte of them (about half, 2 MiB
/// against the default 512 KiB: DEVELOPMENT.md, thirty-fourth and thirty-fifth looks).
/// sled opens a directory only with the segment it was made with, and refuses it to
/// another (a build from before this segment refuses a directory made with it, naming
/// the segment).
pub(crate) const SEGMENT_BYTES: usize = 2 << 20;
/// sled's default segment, which every state directory made before [`SEGMENT_BYTES`] has;
/// such a directory keeps it, and its records stay as short as they were.
pub(crate) const LEGACY_SEGMENT_BYTES: usize = 512 << 10;
/// The file in a state directory that names its segment (in decimal), written and synced
/// before sled makes the directory. sled's own record of it (`conf`) is written without a
/// sync, and sled rewrites a missing or empty one with whatever segment it is opened
/// with: a log of another segment would then be misread. A directory without this file
/// was made before [`SEGMENT_BYTES`] (it holds sled's files) or is new (it holds none).
const SEGMENT_FILE: &str = "loopwarden-segment";
/// The segment a database was opened with, in its default tree (big-endian), for each
/// partition's store to cut its records by ([`records::record_bytes`]); a database
/// without it (opened other than by [`open_db_with_cache`]) has [`LEGACY_SEGMENT_BYTES`].
const SEGMENT_KEY: &[u8] = b"loopwarden/segment-bytes";

/// The segment the [`SEGMENT_FILE`] of the directory at `path` names; `None` where there
/// is none or it is empty (a directory made before [`SEGMENT_BYTES`], or a new one).
fn named_segment(path: &Path) -> Result<Option<usize>, StoreError> {
    let file = path.join(SEGMENT_FILE);
    let text = match std::fs::read(&file) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StoreError::SegmentFile {
                path: file.display().to_string(),
                source,
            })
        }
    };
    let text = String::from_utf8_lossy(&text);
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    match text.parse::<usize>() {
        Ok(segment) if segment == SEGMENT_BYTES || segment == LEGACY_SEGMENT_BYTES => {
            Ok(Some(segment))
        }
        _ => Err(StoreError::Segment {
            path: file.display().to_string(),
            found: text.to_string(),
        }),
    }
}

/// Writes `segment` as the [`SEGMENT_FILE`] of the directory at `path` (made if it is
/// not there): written and synced under another name, then renamed over it and the
/// directory synced, so that a crash leaves the file as it was or whole.
fn record_segment(path: &Path, segment: usize) -> Result<(), StoreError> {
    let file = path.join(SEGMENT_FILE);
    let failed = |source| StoreError::SegmentFile {
        path: file.display().to_string(),
        source,
    };
    std::fs::create_dir_all(path).map_err(failed)?;
    let written = path.join(format!("{SEGMENT_FILE}.new"));
    let mut f = std::fs::File::create(&written).map_err(failed)?;
    std::io::Write::write_all(&mut f, format!("{segment}\n").as_bytes()).map_err(failed)?;
    f.sync_all().map_err(failed)?;
    std::fs::rename(&written, &file).map_err(failed)?;
    std::fs::File::open(path)
        .and_then(|dir| dir.sync_all())
        .map_err(failed)
}

/// Opens (or creates) the sled database at `path`, checking (or recording) its store
/// format, with the default page cache ([`crate::config::DEFAULT_STATE_CACHE_MIB`]).
pub fn open_db(path: &Path) -> Result<sled::Db, StoreError> {
    open_db_with_cache(path, crate::config::DEFAULT_STATE_CACHE_MIB * 1024 * 1024)
}

/// [`open_db`] with a page cache of `cache_bytes` (`state.cache_mib`). sled keeps the
/// pages it reads and writes up to this size; its own default of 1 GiB lets a process
/// that runs for days grow toward it as sessions come and go.
pub fn open_db_with_cache(path: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
    let opened = |source| StoreError::Open {
        path: path.display().to_string(),
        source,
    };
    let (db, segment) = open_with_its_segment(path, cache_bytes)?;
    let expected = STORE_FORMAT.to_be_bytes();
    let found = db.get(FORMAT_KEY).map_err(opened)?;
    let found = match found.as_deref().map(<[u8; 4]>::try_from) {
        // Databases from before the marker hold format 1.
        None if db.tree_names().len() > 1 || !db.is_empty() => Err("1".to_string()),
        None => {
            db.insert(FORMAT_KEY, &expected).map_err(opened)?;
            db.flush().map_err(opened)?;
            Ok(STORE_FORMAT)
        }
        Some(Ok(b)) => Ok(u32::from_be_bytes(b)),
        Some(Err(_)) => Err(format!("{:?}", found.as_deref().unwrap_or_default())),
    };
    match found {
        Ok(STORE_FORMAT) => {}
        Ok(WHOLE_RECORDS_FORMAT) if STATE_FORMAT == WHOLE_RECORDS_STATE_FORMAT => {
            // Its records are this format's, without deltas: only an older build, which
            // cannot read deltas, must refuse the directory from now on.
            db.insert(FORMAT_KEY, &expected).map_err(opened)?;
            db.flush().map_err(opened)?;
            tracing::info!(
                path = %path.display(),
                from = WHOLE_RECORDS_FORMAT,
                to = STORE_FORMAT,
                "state store upgraded"
            );
        }
        Ok(PER_SESSION_FORMAT | UPGRADING_TO_RECORDS)
            if STATE_FORMAT == PER_SESSION_STATE_FORMAT =>
        {
            db.insert(FORMAT_KEY, &UPGRADING_TO_RECORDS.to_be_bytes())
                .map_err(opened)?;
            db.flush().map_err(opened)?;
            upgrade_per_session(&db, records::record_bytes(segment)).map_err(opened)?;
            db.insert(FORMAT_KEY, &expected).map_err(opened)?;
            db.flush().map_err(opened)?;
            tracing::info!(
                path = %path.display(),
                from = PER_SESSION_FORMAT,
                to = STORE_FORMAT,
                "state store upgraded"
            );
        }
        Ok(other) => {
            return Err(StoreError::Format {
                path: path.display().to_string(),
                found: other.to_string(),
                expected: STORE_FORMAT,
            })
        }
        Err(found) => {
            return Err(StoreError::Format {
                path: path.display().to_string(),
                found,
                expected: STORE_FORMAT,
            })
        }
    }
    // Recorded after the format, which takes a default tree without keys for a new
    // directory.
    let segment = (segment as u64).to_be_bytes();
    if db.get(SEGMENT_KEY).map_err(opened)?.as_deref() != Some(segment.as_slice()) {
        db.insert(SEGMENT_KEY, &segment).map_err(opened)?;
        db.flush().map_err(opened)?;
    }
    Ok(db)
}

/// Opens the sled database at `path` with the segment its directory was made with, and
/// returns that segment, recorded in [`SEGMENT_FILE`] if the file did not name it.
fn open_with_its_segment(path: &Path, cache_bytes: u64) -> Result<(sled::Db, usize), StoreError> {
    let opened = |source| StoreError::Open {
        path: path.display().to_string(),
        source,
    };
    // As the segment file says; sled's default for a directory of sled's files without
    // one; the larger segment for a new directory, recorded in it before sled makes it.
    let mut recorded = named_segment(path)?;
    let guess = match recorded {
        Some(segment) => segment,
        None if ["conf", "db"].iter().any(|f| path.join(f).exists()) => LEGACY_SEGMENT_BYTES,
        None => {
            record_segment(path, SEGMENT_BYTES)?;
            recorded = Some(SEGMENT_BYTES);
            SEGMENT_BYTES
        }
    };
    // sled's `conf`, where it holds another segment, is what the log was written with
    // (where it is missing or empty, sled takes the segment it is given).
    let (db, segment) = match open_locked(path, cache_bytes, guess) {
        Err(sled::Error::Unsupported(why)) if why.contains("io buffer size") => {
            let other = if guess == SEGMENT_BYTES {
                LEGACY_SEGMENT_BYTES
            } else {
                SEGMENT_BYTES
            };
            (
                open_locked(path, cache_bytes, other).map_err(opened)?,
                other,
            )
        }
        opened_with_guess => (opened_with_guess.map_err(opened)?, guess),
    };
    if recorded != Some(segment) {
        record_segment(path, segment)?;
    }
    Ok((db, segment))
}

/// Rewrites each tree's per-session keys (store format 5) as records of `record_bytes`
/// (its segment's: the segment key is recorded after the upgrade), one atomic batch per
/// tree (held in memory: a tree's states at once): a tree already rewritten holds none,
/// so an upgrade cut short resumes. Records a tree already holds stay, and the
/// rewritten states come after them.
fn upgrade_per_session(db: &sled::Db, record_bytes: usize) -> Result<(), sled::Error> {
    for name in db.tree_names() {
        if name.as_ref() == b"__sled__default" {
            continue;
        }
        let tree = db.open_tree(&name)?;
        if tree.scan_prefix(SESSION_PREFIX).next().is_none() {
            continue;
        }
        let mut log = read_log(&tree)?;
        let mut writer = Writer::new(&mut log, record_bytes);
        let mut batch = sled::Batch::default();
        for item in tree.scan_prefix(SESSION_PREFIX) {
            let (k, v) = item?;
            writer.put(&k[SESSION_PREFIX.len()..], &v);
            batch.remove(k);
        }
        let (records, _) = writer.finish();
        if records.is_empty() {
            continue;
        }
        for (seq, bytes) in records {
            batch.insert(&records::record_key(seq), bytes);
        }
        tree.apply_batch(batch)?;
    }
    Ok(())
}

/// The record size of `db`'s directory (see [`SEGMENT_KEY`]).
fn record_bytes_of(db: &sled::Db) -> Result<usize, sled::Error> {
    let segment = match db.get(SEGMENT_KEY)? {
        None => LEGACY_SEGMENT_BYTES,
        Some(v) => match <[u8; 8]>::try_from(v.as_ref()).map(u64::from_be_bytes) {
            Ok(s) if s == SEGMENT_BYTES as u64 || s == LEGACY_SEGMENT_BYTES as u64 => s as usize,
            _ => {
                return Err(sled::Error::Unsupported(format!(
                    "the state store's segment key holds {v:?}, not a segment this build opens"
                )))
            }
        },
    };
    Ok(records::record_bytes(segment))
}

fn open_locked(path: &Path, cache_bytes: u64, segment_bytes: usize) -> sled::Result<sled::Db> {
    let started = std::time::Instant::now();
    loop {
        match sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes)
            .segment_size(segment_bytes)
            .open()
        {
            Ok(db) => return Ok(db),
            Err(source) => {
                let locked = source.to_string().contains("could not acquire lock");
                if !locked || started.elapsed() >= LOCK_WAIT {
                    return Err(source);
                }
                tracing::debug!(path = %path.display(), "state directory locked; waiting");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
}

impl SledStore {
    pub fn open(path: &Path) -> Result<SledStore, StoreError> {
        let db = open_db(path)?;
        let opened = |source| StoreError::Open {
            path: path.display().to_string(),
            source,
        };
        let tree = db.open_tree("loopwarden").map_err(opened)?;
        let record_bytes = record_bytes_of(&db).map_err(opened)?;
        Ok(SledStore::new(db, tree, true, record_bytes))
    }

    /// The store of one input partition inside a shared database: its own tree, so its
    /// sessions and offsets commit atomically. `commit` does not flush: the pipeline's
    /// store writer flushes the database once per batch where sled is the only record
    /// of the state (no changelog), before the batch's offsets are committed to Kafka.
    pub fn partition(db: &sled::Db, partition: i32) -> Result<SledStore, StoreError> {
        let tree = db.open_tree(format!("partition/{partition}"))?;
        let record_bytes = record_bytes_of(db)?;
        Ok(SledStore::new(db.clone(), tree, false, record_bytes))
    }

    fn new(
        db: sled::Db,
        tree: sled::Tree,
        flush_on_commit: bool,
        record_bytes: usize,
    ) -> SledStore {
        SledStore {
            db,
            tree,
            flush_on_commit,
            record_bytes,
            log: RefCell::new(None),
            unapplied: None,
            failed: false,
            written_bytes: 0,
            #[cfg(test)]
            fail_after: None,
            #[cfg(test)]
            fail_plan: false,
        }
    }

    /// Tests: the next write applies `n` of its writes to the tree, then fails as sled
    /// fails (an I/O error).
    #[cfg(test)]
    pub fn fail_next_write_after(&mut self, n: usize) {
        self.fail_after = Some(n);
    }

    /// Tests: the next batch's plan fails as sled fails (an I/O error), before it writes.
    #[cfg(test)]
    pub fn fail_next_plan(&mut self) {
        self.fail_plan = true;
    }

    /// Bytes of the values this store's batches put in sled's tree since it was opened
    /// (records of whole states and deltas, the folding's copies, offsets).
    pub fn written_bytes(&self) -> u64 {
        self.written_bytes
    }

    /// Bytes the database occupies on disk.
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.db.size_on_disk()?)
    }

    /// The records' index, read from the tree when it is not held.
    fn log(&self) -> Result<RefMut<'_, Log>, StoreError> {
        let mut held = self.log.borrow_mut();
        if held.is_none() {
            *held = Some(read_log(&self.tree)?);
        }
        Ok(RefMut::map(held, |l| l.as_mut().expect("read above")))
    }

    /// Sessions whose newest state the records hold.
    pub fn stored_sessions(&self) -> Result<usize, StoreError> {
        Ok(self.log()?.sessions())
    }

    /// Deltas the sessions' chains hold, after their state entries (walks every
    /// session: for measurements and tests).
    pub fn stored_deltas(&self) -> Result<usize, StoreError> {
        Ok(self.log()?.deltas())
    }

    /// A batch's writes: its states (as deltas where `deltas` and the batch has them)
    /// and deletions as records, the records it folds or empties removed, its offsets.
    /// The index is kept as if they were applied.
    fn plan(&mut self, batch: &StoreBatch, deltas: bool) -> Result<Writes, StoreError> {
        #[cfg(test)]
        if std::mem::take(&mut self.fail_plan) {
            return Err(sled::Error::Io(std::io::Error::other("failed for the test")).into());
        }
        let mut log = self.log()?;
        let mut writer = Writer::new(&mut log, self.record_bytes);
        let mut deltas = batch.deltas.iter().filter(|_| deltas).peekable();
        for (i, (k, v)) in batch.puts.iter().enumerate() {
            // A window of puts looked up together at a time, so that what the lookups
            // bring into the cache is still there when the window's writes come.
            if i % WARM_WINDOW == 0 {
                let window = batch.puts[i..].iter().take(WARM_WINDOW);
                writer.warm(window.map(|(k, _)| k.as_bytes()));
            }
            match deltas.next_if(|(at, _)| *at as usize == i) {
                Some((_, delta)) => writer.put_delta(k.as_bytes(), delta, v),
                None => writer.put(k.as_bytes(), v),
            }
        }
        for k in &batch.deletes {
            writer.delete(k.as_bytes());
        }
        let budget = writer.written().max(records::FOLD_BYTES_MIN);
        writer.fold(budget, |seq| self.tree.get(records::record_key(seq)))?;
        let (written, removed) = writer.finish();
        let mut writes = Writes::new();
        for (seq, bytes) in written {
            writes.insert(records::record_key(seq).to_vec(), Some(bytes.into()));
        }
        for seq in removed {
            writes.insert(records::record_key(seq).to_vec(), None);
        }
        for (p, o) in &batch.offsets {
            writes.insert(
                key(OFFSET_PREFIX, p),
                Some(o.to_be_bytes().as_slice().into()),
            );
        }
        Ok(writes)
    }

    /// Applies writes as one sled batch (flushed if this store flushes its commits);
    /// writes sled did not take are kept to be applied again.
    fn apply(&mut self, writes: Writes) -> Result<(), StoreError> {
        if let Err(e) = self.apply_to_tree(&writes) {
            self.unapplied = Some(writes);
            return Err(e.into());
        }
        self.written_bytes += writes
            .values()
            .flatten()
            .map(|v| v.len() as u64)
            .sum::<u64>();
        if self.flush_on_commit {
            self.db.flush()?;
        }
        Ok(())
    }

    /// One sled batch of `writes`.
    fn apply_to_tree(&mut self, writes: &Writes) -> Result<(), sled::Error> {
        #[cfg(test)]
        if let Some(n) = self.fail_after.take() {
            // As sled fails: the writes before the failing one are in its tree.
            self.tree.apply_batch(sled_batch(writes.iter().take(n)))?;
            return Err(sled::Error::Io(std::io::Error::other(
                "failed for the test",
            )));
        }
        self.tree.apply_batch(sled_batch(writes))
    }
}

/// A sled batch of writes.
fn sled_batch<'a>(
    writes: impl IntoIterator<Item = (&'a Vec<u8>, &'a Option<sled::IVec>)>,
) -> sled::Batch {
    let mut batch = sled::Batch::default();
    for (k, v) in writes {
        match v {
            Some(v) => batch.insert(k.as_slice(), v.clone()),
            None => batch.remove(k.as_slice()),
        }
    }
    batch
}

/// A tree's records read into their index (records that cannot be read whole are logged
/// and what can be read of them is kept).
fn read_log(tree: &sled::Tree) -> Result<Log, sled::Error> {
    let mut log = Log::default();
    for item in tree.scan_prefix(records::RECORD_PREFIX) {
        let (k, v) = item?;
        let Some(seq) = records::record_seq(&k) else {
            tracing::error!(key = ?k, "skipping a state store key that names no record");
            continue;
        };
        if let Err(error) = log.read_record(seq, &v) {
            tracing::error!(
                record = seq,
                %error,
                "a state store record cannot be read to its end; the sessions after the fault start anew"
            );
        }
    }
    Ok(log)
}

impl StateStore for SledStore {
    fn load_sessions(&self) -> Result<Vec<(String, SessionState)>, StoreError> {
        let log = self.log()?;
        // Each chain read in the log's order: its state entry, then its deltas applied.
        let mut chains: FxHashMap<Vec<u8>, Option<SessionState>> = FxHashMap::default();
        chains.reserve(log.sessions());
        for item in self.tree.scan_prefix(records::RECORD_PREFIX) {
            let (k, v) = item?;
            let Some(seq) = records::record_seq(&k) else {
                continue;
            };
            for (entry, _) in log.live_entries(seq, &v) {
                let session = String::from_utf8_lossy(entry.name());
                let state = match entry {
                    Entry::State { state, .. } => decode(&session, state),
                    Entry::Delta { delta, .. } => match chains.get(entry.name()) {
                        Some(Some(before)) => apply(&session, before, delta),
                        // Its chain's state was passed over: so is the delta.
                        _ => continue,
                    },
                    Entry::Deletion { .. } => continue,
                };
                chains.insert(entry.name().to_vec(), passed_over(&session, state));
            }
        }
        let mut out: Vec<(String, SessionState)> = chains
            .into_iter()
            .filter_map(|(name, state)| Some((String::from_utf8_lossy(&name).into_owned(), state?)))
            .collect();
        // In the sessions' order, as a tree of one key per session gave them.
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn offset(&self, partition: &str) -> Result<Option<i64>, StoreError> {
        Ok(self
            .tree
            .get(key(OFFSET_PREFIX, partition))?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(i64::from_be_bytes))
    }

    fn commit(&mut self, batch: &StoreBatch) -> Result<(), StoreError> {
        // After a failure the tree may hold the failed commit's writes, whole or in
        // part: a retry writes its states again, whole (the same states, superseding;
        // a delta written twice would be applied twice).
        let deltas = !std::mem::replace(&mut self.failed, true);
        // A batch sled did not take is finished first.
        if let Some(writes) = self.unapplied.take() {
            self.apply(writes)?;
        }
        match self.plan(batch, deltas) {
            Ok(writes) => self.apply(writes)?,
            Err(e) => {
                // Planned in part, applied not at all: the tree is what is true.
                *self.log.get_mut() = None;
                return Err(e);
            }
        }
        self.failed = false;
        Ok(())
    }

    /// The session's state entry as stored when its chain has no deltas; else the state
    /// its chain gives, encoded whole.
    fn session_bytes(&self, session: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(chain) = self.log()?.chain(session.as_bytes()).cloned() else {
            return Ok(None);
        };
        let mut parts = Vec::with_capacity(1 + chain.deltas.len());
        for h in chain.entries() {
            let Some(record) = self.tree.get(records::record_key(h.record))? else {
                return Ok(None);
            };
            let Some((_, bytes)) = records::entry_at(&record, h.entry) else {
                return Ok(None);
            };
            parts.push(bytes);
        }
        let (whole, deltas) = parts.split_first().expect("a chain has its state entry");
        if deltas.is_empty() {
            return Ok(Some(whole.clone()));
        }
        let mut state = decode(session, whole)?;
        for delta in deltas {
            state = apply(session, &state, delta)?;
        }
        Ok(Some(state.to_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state's frame is written into its own allocation while nothing else holds it
    /// (the changelog's value is the state's bytes, not a copy), and into a copy once
    /// something does: bytes shared are never changed. Either way the state reads the
    /// same.
    #[test]
    fn a_frame_is_written_in_place_when_unshared_and_into_a_copy_when_shared() {
        let state = SessionState::new(42, 42).to_bytes();
        let mut with_room =
            SessionState::new(42, 42).to_bytes_after_room_with(&mut Vec::new(), STATE_FRAME_ROOM);
        let at = with_room.as_ptr();
        assert!(with_room[..STATE_FRAME_ROOM].iter().all(|&b| b == 0));
        with_room[0] = 9; // the room is the frame's, whatever it held
        let mut bytes = StateBytes::with_room(with_room);
        assert_eq!(&bytes[..], &state[..]);
        let framed = bytes.framed(|room| room.fill(1));
        assert_eq!(framed.as_ptr(), at, "in place");
        assert_eq!(&framed[..STATE_FRAME_ROOM], &[1; STATE_FRAME_ROOM]);
        assert_eq!(&framed[STATE_FRAME_ROOM..], &state[..]);
        // `framed` still holds it: a second frame goes into a copy, the first untouched.
        let second = bytes.framed(|room| room.fill(2));
        assert_ne!(second.as_ptr(), at, "a copy");
        assert_eq!(&framed[..STATE_FRAME_ROOM], &[1; STATE_FRAME_ROOM]);
        assert_eq!(&second[..STATE_FRAME_ROOM], &[2; STATE_FRAME_ROOM]);
        assert_eq!(&bytes[..], &state[..]);
        assert_eq!(
            bytes,
            StateBytes::from(state.clone()),
            "compared as the state"
        );
        assert_eq!(&StateBytes::default()[..], b"");
    }

    fn exercise(store: &mut dyn StateStore) {
        let st = SessionState::new(42, 42);
        store
            .commit(&StoreBatch {
                puts: vec![
                    ("a".into(), st.to_bytes().into()),
                    ("b".into(), st.to_bytes().into()),
                ],
                deltas: Vec::new(),
                deletes: vec![],
                offsets: vec![("t/0".into(), 7)],
            })
            .unwrap();
        store
            .commit(&StoreBatch {
                puts: vec![],
                deltas: Vec::new(),
                deletes: vec!["a".into()],
                offsets: vec![("t/0".into(), 9)],
            })
            .unwrap();
        let sessions = store.load_sessions().unwrap();
        assert_eq!(sessions, vec![("b".to_string(), st)]);
        assert_eq!(store.offset("t/0").unwrap(), Some(9));
        assert_eq!(store.offset("t/1").unwrap(), None);
    }

    #[test]
    fn a_session_state_that_cannot_be_read_is_passed_over_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut sled = SledStore::open(dir.path()).unwrap();
        let mut memory = MemoryStore::new();
        let st = SessionState::new(42, 42);
        for store in [&mut sled as &mut dyn StateStore, &mut memory] {
            store
                .commit(&StoreBatch {
                    puts: vec![
                        ("garbled".into(), vec![0xff; 7].into()),
                        ("fine".into(), st.to_bytes().into()),
                    ],
                    deltas: Vec::new(),
                    deletes: vec![],
                    offsets: vec![],
                })
                .unwrap();
            assert_eq!(
                store.load_sessions().unwrap(),
                vec![("fine".to_string(), st.clone())]
            );
        }
    }

    #[test]
    fn memory_store_applies_batches() {
        exercise(&mut MemoryStore::new());
    }

    #[test]
    fn sled_store_applies_batches_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = SledStore::open(dir.path()).unwrap();
            exercise(&mut s);
        }
        let s = SledStore::open(dir.path()).unwrap();
        assert_eq!(s.load_sessions().unwrap().len(), 1);
        assert_eq!(s.offset("t/0").unwrap(), Some(9));
    }

    #[test]
    fn a_database_of_another_store_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        {
            let db = open_db(&path).unwrap();
            assert_eq!(
                db.get(FORMAT_KEY).unwrap().unwrap().as_ref(),
                STORE_FORMAT.to_be_bytes()
            );
            db.insert(FORMAT_KEY, &(STORE_FORMAT + 1).to_be_bytes())
                .unwrap();
            db.flush().unwrap();
        }
        let e = open_db(&path).unwrap_err().to_string();
        let (found, reads) = (
            format!("store format {}", STORE_FORMAT + 1),
            format!("reads store format {STORE_FORMAT}"),
        );
        assert!(e.contains(&found) && e.contains(&reads), "{e}");
    }

    /// A directory made before the larger segment (with sled's default, as those builds
    /// made it) keeps its segment and its records' length across opens; a new one gets
    /// the larger segment and longer records, and sled refuses it to a build of the
    /// default segment, naming the one it needs.
    #[test]
    fn a_directory_keeps_the_segment_it_was_made_with() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = dir.path().join("legacy");
        drop(sled::open(&legacy).unwrap());
        let new = dir.path().join("new");
        let states: Vec<(String, StateBytes)> = (0..1000)
            .map(|i| {
                let state = SessionState::new(i, i + 1).to_bytes();
                (format!("session-{i:04}"), state.into())
            })
            .collect();
        for (path, segment) in [(&legacy, LEGACY_SEGMENT_BYTES), (&new, SEGMENT_BYTES)] {
            for open in 0..2 {
                let db = open_db(path).unwrap();
                let mut store = SledStore::partition(&db, 0).unwrap();
                let record_bytes = records::record_bytes(segment);
                assert_eq!(store.record_bytes, record_bytes, "{path:?}");
                if open == 0 {
                    store
                        .commit(&StoreBatch {
                            puts: states.clone(),
                            offsets: vec![("t/0".into(), 3)],
                            ..StoreBatch::default()
                        })
                        .unwrap();
                }
                let longest = store
                    .tree
                    .scan_prefix(records::RECORD_PREFIX)
                    .map(|r| r.unwrap().1.len())
                    .max()
                    .unwrap();
                assert!(
                    longest <= record_bytes && longest > record_bytes * 3 / 4,
                    "{path:?}: {longest} bytes"
                );
                assert_eq!(store.load_sessions().unwrap().len(), states.len());
                db.flush().unwrap();
            }
        }
        let refused = sled::open(&new).unwrap_err().to_string();
        assert!(refused.contains(&SEGMENT_BYTES.to_string()), "{refused}");
        // sled's `conf` lost (it writes it without a sync, and rewrites a missing one
        // with the segment it is given): each directory opens with its own segment all
        // the same, its sessions whole; one made before and never opened since too.
        let untouched = dir.path().join("untouched");
        {
            let db = sled::open(&untouched).unwrap();
            db.insert(FORMAT_KEY, &STORE_FORMAT.to_be_bytes()).unwrap();
            let mut store = SledStore::partition(&db, 0).unwrap();
            store
                .commit(&StoreBatch {
                    puts: states.clone(),
                    ..StoreBatch::default()
                })
                .unwrap();
            db.flush().unwrap();
        }
        for (path, segment) in [
            (&legacy, LEGACY_SEGMENT_BYTES),
            (&new, SEGMENT_BYTES),
            (&untouched, LEGACY_SEGMENT_BYTES),
        ] {
            std::fs::remove_file(path.join("conf")).unwrap();
            let db = open_db(path).unwrap();
            let store = SledStore::partition(&db, 0).unwrap();
            assert_eq!(
                store.record_bytes,
                records::record_bytes(segment),
                "{path:?}"
            );
            assert_eq!(store.load_sessions().unwrap().len(), states.len());
        }
    }

    /// A state directory whose segment file holds no segment this build opens is refused,
    /// naming the file and saying what to do.
    #[test]
    fn a_segment_file_that_names_no_segment_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(open_db(dir.path()).unwrap());
        let file = dir.path().join(SEGMENT_FILE);
        std::fs::write(&file, "lots\n").unwrap();
        let e = open_db(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(&file.display().to_string()) && e.contains("lots") && e.contains("delete"),
            "{e}"
        );
    }

    /// A segment file left empty (as one cut short by a crash of a build that wrote it in
    /// place would be) is read as none: a directory of the larger segment still opens with
    /// it, from sled's own files, and the file is written whole again; one half-written
    /// under its other name changes nothing.
    #[test]
    fn an_empty_segment_file_is_read_from_sleds_files() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = open_db(dir.path()).unwrap();
            let mut store = SledStore::partition(&db, 0).unwrap();
            store
                .commit(&StoreBatch {
                    puts: vec![("s".into(), SessionState::new(1, 2).to_bytes().into())],
                    ..StoreBatch::default()
                })
                .unwrap();
            db.flush().unwrap();
        }
        let file = dir.path().join(SEGMENT_FILE);
        std::fs::write(&file, "").unwrap();
        std::fs::write(dir.path().join(format!("{SEGMENT_FILE}.new")), "52").unwrap();
        let db = open_db(dir.path()).unwrap();
        let store = SledStore::partition(&db, 0).unwrap();
        assert_eq!(store.record_bytes, records::record_bytes(SEGMENT_BYTES));
        assert_eq!(store.load_sessions().unwrap().len(), 1);
        assert_eq!(
            std::fs::read_to_string(&file).unwrap().trim(),
            SEGMENT_BYTES.to_string()
        );
    }

    /// Records appended, rewritten and removed as batches come, in a directory this build
    /// makes, leave every leaf of them in sled's log: none goes to a blob file, which
    /// sled's flush does not sync.
    #[test]
    fn no_leaf_of_records_is_written_as_a_blob() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db(dir.path()).unwrap();
        let mut store = SledStore::partition(&db, 0).unwrap();
        for batch in 0..16u8 {
            let puts = (0..1000u32)
                .filter(|i| (i + u32::from(batch)) % 2 == 0)
                .map(|i| (format!("session-{i:04}"), vec![batch; 2000].into()))
                .collect();
            store
                .commit(&StoreBatch {
                    puts,
                    offsets: vec![("t/0".into(), i64::from(batch))],
                    ..StoreBatch::default()
                })
                .unwrap();
        }
        db.flush().unwrap();
        let records = store.tree.scan_prefix(records::RECORD_PREFIX).count();
        assert!(records > 2 * records::LEAF_KEYS_MAX, "{records} records");
        let blobs: Vec<_> = std::fs::read_dir(dir.path().join("blobs"))
            .unwrap()
            .collect();
        assert!(blobs.is_empty(), "{blobs:?}");
    }

    #[test]
    fn a_database_from_before_the_format_marker_is_format_1() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        {
            let db = sled::open(&path).unwrap();
            db.open_tree("partition/0")
                .unwrap()
                .insert("s", &b"old"[..])
                .unwrap();
            db.flush().unwrap();
        }
        let e = open_db(&path).unwrap_err().to_string();
        assert!(e.contains("store format 1"), "{e}");
        // An empty directory is new, not old.
        let fresh = dir.path().join("fresh");
        drop(open_db(&fresh).unwrap());
        drop(open_db(&fresh).unwrap());
    }

    /// A state directory of one key per session (store format 5, written here as that
    /// build wrote it) opens with its sessions and offsets, as records.
    #[test]
    fn a_database_of_one_key_per_session_is_upgraded_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let states: Vec<(String, SessionState)> = (0..50u64)
            .map(|i| {
                (
                    format!("s{i:02}"),
                    SessionState::new(i as i64, i as i64 + 1),
                )
            })
            .collect();
        {
            let db = sled::open(&path).unwrap();
            db.insert(FORMAT_KEY, &PER_SESSION_FORMAT.to_be_bytes())
                .unwrap();
            for p in 0..2 {
                let tree = db.open_tree(format!("partition/{p}")).unwrap();
                for (name, st) in states.iter().skip(p).step_by(2) {
                    tree.insert(key(SESSION_PREFIX, name), st.to_bytes())
                        .unwrap();
                }
                tree.insert(key(OFFSET_PREFIX, "t/0"), &(7 + p as i64).to_be_bytes())
                    .unwrap();
            }
            db.flush().unwrap();
        }
        for _ in 0..2 {
            // The second open finds this format and nothing to upgrade.
            let db = open_db(&path).unwrap();
            assert_eq!(
                db.get(FORMAT_KEY).unwrap().unwrap().as_ref(),
                STORE_FORMAT.to_be_bytes()
            );
            for p in 0..2 {
                let store = SledStore::partition(&db, p as i32).unwrap();
                let want: Vec<_> = states.iter().skip(p).step_by(2).cloned().collect();
                assert_eq!(store.load_sessions().unwrap(), want);
                assert_eq!(store.offset("t/0").unwrap(), Some(7 + p as i64));
                assert_eq!(store.tree.scan_prefix(SESSION_PREFIX).count(), 0);
            }
        }
    }

    /// sled applies a batch's writes one by one and stops at the first error, leaving
    /// the ones before in its tree: whichever write fails, the retry (and the batch after
    /// it) end with what the in-memory store holds, a folded record's states included.
    #[test]
    fn a_batch_sled_took_in_part_is_finished_by_the_retry() {
        let st = |n: u64, round: u64| {
            let mut st = SessionState::new(n as i64, round as i64);
            st.agent_id = Some(format!("agent-{n}-{round}-{}", "y".repeat(300)));
            st.to_bytes()
        };
        for fail_after in 0..12 {
            let dir = tempfile::tempdir().unwrap();
            let mut sled = SledStore::open(dir.path()).unwrap();
            let mut memory = MemoryStore::new();
            let mut failed = false;
            for round in 0..60u64 {
                // Sessions 0–99 written, then a few of them at a time again: the old
                // records hold fewer and fewer live states, and fold.
                let names: Vec<u64> = if round < 10 {
                    (round * 10..round * 10 + 10).collect()
                } else {
                    vec![round * 7 % 100, round * 13 % 100, round * 17 % 100]
                };
                let batch = StoreBatch {
                    puts: names
                        .iter()
                        .map(|n| (format!("s{n}"), st(*n, round).into()))
                        .collect(),
                    deltas: Vec::new(),
                    deletes: if round == 30 {
                        vec!["s5".into()]
                    } else {
                        vec![]
                    },
                    offsets: vec![("t/0".into(), round as i64)],
                };
                memory.commit(&batch).unwrap();
                let folds = sled.log().unwrap().needs_folding();
                if folds && !failed {
                    failed = true;
                    sled.fail_after = Some(fail_after);
                    assert!(sled.commit(&batch).is_err());
                }
                sled.commit(&batch).unwrap();
                if round % 20 == 19 {
                    drop(sled);
                    sled = SledStore::open(dir.path()).unwrap();
                }
            }
            assert!(failed, "the run folds");
            assert_eq!(
                sled.load_sessions().unwrap(),
                memory.load_sessions().unwrap(),
                "failing after {fail_after} writes"
            );
            assert_eq!(sled.offset("t/0").unwrap(), Some(59));
        }
    }

    /// Writes `states` into `tree` as records of whole states, as a store writes them.
    fn write_records(tree: &sled::Tree, states: &[(&[u8], SessionState)]) {
        let mut log = Log::default();
        let mut w = Writer::new(&mut log, records::record_bytes(SEGMENT_BYTES));
        for (name, state) in states {
            w.put(name, &state.to_bytes());
        }
        for (seq, bytes) in w.finish().0 {
            tree.insert(records::record_key(seq), bytes).unwrap();
        }
    }

    /// A directory whose upgrade was cut short (marked as upgrading, one tree rewritten,
    /// one not) is upgraded on: both trees' sessions load.
    #[test]
    fn an_upgrade_cut_short_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let state = |i: i64| SessionState::new(i, i);
        {
            let db = sled::open(&path).unwrap();
            db.insert(FORMAT_KEY, &UPGRADING_TO_RECORDS.to_be_bytes())
                .unwrap();
            write_records(&db.open_tree("partition/0").unwrap(), &[(b"a", state(1))]);
            let left = db.open_tree("partition/1").unwrap();
            left.insert(key(SESSION_PREFIX, "b"), state(2).to_bytes())
                .unwrap();
            db.flush().unwrap();
        }
        let db = open_db(&path).unwrap();
        let loaded = |p| {
            SledStore::partition(&db, p)
                .unwrap()
                .load_sessions()
                .unwrap()
        };
        assert_eq!(loaded(0), vec![("a".to_string(), state(1))]);
        assert_eq!(loaded(1), vec![("b".to_string(), state(2))]);
    }

    /// The sled store against the in-memory one over many batches of a fleet whose
    /// sessions come, change and end, reopened now and then: the same sessions with the
    /// same bytes, and the records folded (the tree holds far fewer bytes than were
    /// written).
    #[test]
    fn the_sled_store_holds_what_the_memory_store_holds_across_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let mut sled = SledStore::open(dir.path()).unwrap();
        let mut memory = MemoryStore::new();
        let mut written = 0usize;
        for round in 0..120u64 {
            let mut batch = StoreBatch::default();
            for i in 0..30u64 {
                let n = (round * 30 + i) % 400;
                let mut st = SessionState::new(n as i64, round as i64);
                st.agent_id = Some(format!(
                    "agent-{round}-{i}-{}",
                    "x".repeat((i * 11 % 90) as usize)
                ));
                batch
                    .puts
                    .push((format!("session-{n}"), st.to_bytes().into()));
            }
            batch
                .deletes
                .push(format!("session-{}", (round * 13) % 400));
            batch.offsets.push(("t/0".into(), round as i64));
            written += batch.puts.iter().map(|(_, v)| v.len()).sum::<usize>();
            sled.commit(&batch).unwrap();
            memory.commit(&batch).unwrap();
            if round % 40 == 39 {
                drop(sled);
                sled = SledStore::open(dir.path()).unwrap();
            }
        }
        assert_eq!(
            sled.load_sessions().unwrap(),
            memory.load_sessions().unwrap()
        );
        assert_eq!(sled.offset("t/0").unwrap(), Some(119));
        for name in memory.sessions.keys() {
            assert_eq!(
                sled.session_bytes(name).unwrap(),
                memory.session_bytes(name).unwrap()
            );
        }
        assert_eq!(sled.session_bytes("nobody").unwrap(), None);
        assert_eq!(sled.stored_sessions().unwrap(), memory.len());
        let stored: usize = sled
            .tree
            .scan_prefix(records::RECORD_PREFIX)
            .map(|kv| kv.unwrap().1.len())
            .sum();
        // Folded: within a few times the live states (not the 480 kB written).
        let live: usize = memory
            .sessions
            .iter()
            .map(|(k, v)| 9 + k.len() + v.len())
            .sum();
        assert!(
            stored < 3 * live + 16 * 1024,
            "{stored} bytes stored for {live} live, of {written} written"
        );
    }

    /// A state directory of store format 6 (records of whole states) is read as it is
    /// and marked format 7, which a build of format 6 (that cannot read deltas) refuses.
    #[test]
    fn a_database_of_whole_state_records_is_read_and_marked_as_this_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let state = |i: i64| SessionState::new(i, i);
        {
            let db = sled::open(&path).unwrap();
            db.insert(FORMAT_KEY, &WHOLE_RECORDS_FORMAT.to_be_bytes())
                .unwrap();
            write_records(
                &db.open_tree("partition/0").unwrap(),
                &[(b"a", state(1)), (b"b", state(2))],
            );
            db.flush().unwrap();
        }
        let db = open_db(&path).unwrap();
        assert_eq!(
            db.get(FORMAT_KEY).unwrap().unwrap().as_ref(),
            STORE_FORMAT.to_be_bytes()
        );
        let store = SledStore::partition(&db, 0).unwrap();
        assert_eq!(
            store.load_sessions().unwrap(),
            vec![("a".to_string(), state(1)), ("b".to_string(), state(2))]
        );
    }

    /// A stored delta that does not apply to its chain passes over its session alone (it
    /// starts anew), and reading that session's bytes says which session and why.
    #[test]
    fn a_delta_that_does_not_apply_passes_over_its_session_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SledStore::open(dir.path()).unwrap();
        let mut st = SessionState::new(1, 1);
        st.agent_id = Some("x".repeat(200));
        let batch = |deltas| StoreBatch {
            puts: vec![
                ("a".into(), st.to_bytes().into()),
                ("b".into(), st.to_bytes().into()),
            ],
            deltas,
            ..StoreBatch::default()
        };
        store.commit(&batch(vec![])).unwrap();
        store
            .commit(&batch(vec![(0, vec![DELTA_FORMAT, 0xff, 0xff])]))
            .unwrap();
        assert_eq!(store.stored_deltas().unwrap(), 1);
        assert_eq!(
            store.load_sessions().unwrap(),
            vec![("b".to_string(), st.clone())]
        );
        let err = store.session_bytes("a").unwrap_err().to_string();
        assert!(err.starts_with("session a: state delta"), "{err}");
        assert_eq!(store.session_bytes("b").unwrap(), Some(st.to_bytes()));
    }

    #[test]
    fn corrupt_state_names_the_session() {
        let err = decode("bad", &[0xff, 0xff, 0xff]).unwrap_err();
        assert!(err.to_string().contains("session bad"), "{err}");
    }
}

//! Session state storage (DESIGN §4): a small trait with two implementations, sled on
//! disk and an in-memory map for `replay` and tests.
//!
//! Guarantees: [`StateStore::commit`] is atomic — session puts, deletes and the partition
//! offsets of one batch are all visible after it returns, or none are — and durable for
//! the sled store (flushed to disk before it returns), which is what lets the pipeline
//! commit Kafka offsets afterwards. A state that cannot be decoded is reported with its
//! key, never silently dropped.

use std::collections::BTreeMap;
use std::path::Path;

use crate::engine::state::{CorruptState, SessionState};

/// Storage failures. `Io` is transient (retry with backoff); `Corrupt` is poison for one
/// key; `Open` is fatal at start.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open state store at {path}: {source}")]
    Open { path: String, source: sled::Error },
    #[error("state store at {path} holds state format {found}; this build reads format {expected} (move it aside and start with an empty one: with the changelog on, its partitions are restored from it)")]
    Format {
        path: String,
        found: String,
        expected: u32,
    },
    #[error("state store I/O failed: {0}")]
    Io(#[from] sled::Error),
    #[error("session {session}: {source}")]
    Corrupt {
        session: String,
        source: CorruptState,
    },
}

/// One atomic unit of state changes.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StoreBatch {
    pub puts: Vec<(String, Vec<u8>)>,
    pub deletes: Vec<String>,
    /// Last applied offset per input partition (key: `topic/partition`).
    pub offsets: Vec<(String, i64)>,
}

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

/// A stored session as loaded: a state that cannot be read is poison for its session
/// only (logged and passed over: the session starts anew), never for the partition,
/// whose every instance would otherwise fail at each start.
fn loaded(session: String, bytes: &[u8], out: &mut Vec<(String, SessionState)>) {
    match decode(&session, bytes) {
        Ok(state) => out.push((session, state)),
        Err(error) => tracing::warn!(
            session_id = %crate::contract::event::printable(&session),
            %error,
            "skipping a stored session state that cannot be read; the session starts anew"
        ),
    }
}

fn decode(session: &str, bytes: &[u8]) -> Result<SessionState, StoreError> {
    SessionState::from_bytes(bytes).map_err(|source| StoreError::Corrupt {
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
            loaded(k.clone(), v, &mut out);
        }
        Ok(out)
    }

    fn offset(&self, partition: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.offsets.get(partition).copied())
    }

    fn commit(&mut self, batch: &StoreBatch) -> Result<(), StoreError> {
        for (k, v) in &batch.puts {
            self.sessions.insert(k.clone(), v.clone());
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

const SESSION_PREFIX: &[u8] = b"s/";
const OFFSET_PREFIX: &[u8] = b"o/";

fn key(prefix: &[u8], name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + name.len());
    k.extend_from_slice(prefix);
    k.extend_from_slice(name.as_bytes());
    k
}

/// sled on disk: one tree, sessions under `s/`, offsets under `o/`, so a batch of both is
/// one atomic `apply_batch`.
pub struct SledStore {
    db: sled::Db,
    tree: sled::Tree,
    /// Whether `commit` flushes the database itself (else the owner flushes it once
    /// for the batches of several trees).
    flush_on_commit: bool,
}

/// How long to wait for the state directory's lock: a handle dropped a moment ago (sled
/// releases the lock from its flusher thread) or a previous process still exiting.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The encoding of session states and offsets on disk. Bump it when `SessionState`'s
/// encoding changes: `state::layout_tests` fails until it is (format 5: each
/// detector's counters its own, in the list's order).
pub const STATE_FORMAT: u32 = 5;
const FORMAT_KEY: &[u8] = b"loopwarden/state-format";

/// Opens (or creates) the sled database at `path`, checking (or recording) its state
/// format, with the default page cache ([`crate::config::DEFAULT_STATE_CACHE_MIB`]).
pub fn open_db(path: &Path) -> Result<sled::Db, StoreError> {
    open_db_with_cache(path, crate::config::DEFAULT_STATE_CACHE_MIB * 1024 * 1024)
}

/// [`open_db`] with a page cache of `cache_bytes` (`state.cache_mib`). sled keeps the
/// pages it reads and writes up to this size; its own default of 1 GiB lets a process
/// that runs for days grow toward it as sessions come and go.
pub fn open_db_with_cache(path: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
    let db = open_locked(path, cache_bytes)?;
    let opened = |source| StoreError::Open {
        path: path.display().to_string(),
        source,
    };
    let expected = STATE_FORMAT.to_be_bytes();
    match db.get(FORMAT_KEY).map_err(opened)? {
        // Databases from before the marker hold format 1.
        None if db.tree_names().len() > 1 || !db.is_empty() => {
            return Err(StoreError::Format {
                path: path.display().to_string(),
                found: "1".to_string(),
                expected: STATE_FORMAT,
            })
        }
        None => {
            db.insert(FORMAT_KEY, &expected).map_err(opened)?;
            db.flush().map_err(opened)?;
        }
        Some(found) if found.as_ref() == expected => {}
        Some(found) => {
            return Err(StoreError::Format {
                path: path.display().to_string(),
                found: match <[u8; 4]>::try_from(found.as_ref()) {
                    Ok(b) => u32::from_be_bytes(b).to_string(),
                    Err(_) => format!("{:?}", found.as_ref()),
                },
                expected: STATE_FORMAT,
            })
        }
    }
    Ok(db)
}

fn open_locked(path: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
    let started = std::time::Instant::now();
    loop {
        match sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes)
            .open()
        {
            Ok(db) => return Ok(db),
            Err(source) => {
                let locked = source.to_string().contains("could not acquire lock");
                if !locked || started.elapsed() >= LOCK_WAIT {
                    return Err(StoreError::Open {
                        path: path.display().to_string(),
                        source,
                    });
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
        let tree = db
            .open_tree("loopwarden")
            .map_err(|source| StoreError::Open {
                path: path.display().to_string(),
                source,
            })?;
        Ok(SledStore {
            db,
            tree,
            flush_on_commit: true,
        })
    }

    /// The store of one input partition inside a shared database: its own tree, so its
    /// sessions and offsets commit atomically. `commit` does not flush: the pipeline
    /// flushes the database once per batch, before it commits offsets to Kafka.
    pub fn partition(db: &sled::Db, partition: i32) -> Result<SledStore, StoreError> {
        let tree = db.open_tree(format!("partition/{partition}"))?;
        Ok(SledStore {
            db: db.clone(),
            tree,
            flush_on_commit: false,
        })
    }

    /// Bytes the database occupies on disk.
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.db.size_on_disk()?)
    }
}

impl StateStore for SledStore {
    fn load_sessions(&self) -> Result<Vec<(String, SessionState)>, StoreError> {
        let mut out = Vec::new();
        for item in self.tree.scan_prefix(SESSION_PREFIX) {
            let (k, v) = item?;
            let name = String::from_utf8_lossy(&k[SESSION_PREFIX.len()..]).into_owned();
            loaded(name, &v, &mut out);
        }
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
        let mut b = sled::Batch::default();
        for (k, v) in &batch.puts {
            b.insert(key(SESSION_PREFIX, k), v.as_slice());
        }
        for k in &batch.deletes {
            b.remove(key(SESSION_PREFIX, k));
        }
        for (p, o) in &batch.offsets {
            b.insert(key(OFFSET_PREFIX, p), &o.to_be_bytes());
        }
        self.tree.apply_batch(b)?;
        if self.flush_on_commit {
            self.db.flush()?;
        }
        Ok(())
    }

    fn session_bytes(&self, session: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .tree
            .get(key(SESSION_PREFIX, session))?
            .map(|v| v.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(store: &mut dyn StateStore) {
        let st = SessionState::new(42, 42);
        store
            .commit(&StoreBatch {
                puts: vec![("a".into(), st.to_bytes()), ("b".into(), st.to_bytes())],
                deletes: vec![],
                offsets: vec![("t/0".into(), 7)],
            })
            .unwrap();
        store
            .commit(&StoreBatch {
                puts: vec![],
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
                        ("garbled".into(), vec![0xff; 7]),
                        ("fine".into(), st.to_bytes()),
                    ],
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
    fn a_database_of_another_state_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        {
            let db = open_db(&path).unwrap();
            assert_eq!(
                db.get(FORMAT_KEY).unwrap().unwrap().as_ref(),
                STATE_FORMAT.to_be_bytes()
            );
            db.insert(FORMAT_KEY, &(STATE_FORMAT + 1).to_be_bytes())
                .unwrap();
            db.flush().unwrap();
        }
        let e = open_db(&path).unwrap_err().to_string();
        let (found, reads) = (
            format!("state format {}", STATE_FORMAT + 1),
            format!("reads format {STATE_FORMAT}"),
        );
        assert!(e.contains(&found) && e.contains(&reads), "{e}");
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
        assert!(e.contains("state format 1"), "{e}");
        // An empty directory is new, not old.
        let fresh = dir.path().join("fresh");
        drop(open_db(&fresh).unwrap());
        drop(open_db(&fresh).unwrap());
    }

    #[test]
    fn corrupt_state_names_the_session() {
        let err = decode("bad", &[0xff, 0xff, 0xff]).unwrap_err();
        assert!(err.to_string().contains("session bad"), "{err}");
    }
}

//! How the sled store lays out a partition's session states: as a log of records, each
//! holding the states (and deletions) of one batch, instead of one key per session.
//!
//! Why: a fleet whose every event belongs to a session of its own writes one state per
//! event, and sled's cost per key written (its tree walk, page cache and log entry) was as
//! much as the engine's whole work on the event, growing with the tree. A record holds
//! many states, so a batch costs a few sled writes per partition, and the tree holds as
//! many keys as there are records, not sessions.
//!
//! A record is a sled value under `r/<sequence>` (big-endian, so a scan reads them in the
//! order they were written): entries one after another, each a state (`0`, the session's
//! name and its state's bytes, both length-prefixed), a deletion (`1` and the name) or a
//! delta (`2`, the name and the delta's bytes: the change from the session's state
//! before it, `engine::state::delta`). A session's state is its chain: its newest state
//! entry and the deltas after it, applied in order, unless a later deletion ends it. A
//! delta with no state before it (its chain's state was folded, below) is dead. Records
//! are cut at [`record_bytes`] of the database's log segment: as long as sled can keep a
//! leaf of them in its log (a leaf it writes to a file of its own is not synced by its
//! flush), and no shorter, since sled's cost of a record written, rewritten in its leaf
//! and removed is much the same whatever its size.
//!
//! Why deltas: an aged state is 0.7–1.3 kB and an event changes a quarter to a third of
//! it (`benches/state_delta.rs`); every byte of a state written costs its copy into a
//! record, sled's log and its leaves' rewrites. A chain is cut short: a delta is written
//! only while the chain's deltas, with it, hold no more bytes than its state entry
//! ([`CHAIN_DELTA_FACTOR`]); past that the whole state is written and starts a new chain.
//! So a chain holds at most about twice a state's bytes and a restore applies a few
//! deltas per session.
//!
//! The store keeps in memory which entries make each session's chain ([`Log`]) and how
//! many bytes of each record are still live. A record written before a batch that holds
//! no live entry and no deletion is removed by that batch (a deletion stays until its
//! record is the oldest: an older record may hold a state it ends). While the records
//! hold more than twice the live bytes (plus [`FOLD_SLACK_BYTES`]), the oldest are
//! folded: the chains with a live entry there are written again, whole chain in order
//! (its state entry and deltas as they are, none decoded), in the batch's records, and
//! the record is removed, deletions and all, since no older record is left. A chain's
//! state entry is its oldest, so the oldest record holds the state entry of every chain
//! it holds a part of, and a chain copied later in the log reads, in the log's order,
//! before any delta appended to it. A batch folds about as many live bytes as it wrote
//! itself (at least [`FOLD_BYTES_MIN`]; the last record folded may pass it), so no batch
//! pays for the whole log, and the log stays within a bounded multiple of the live
//! entries.
//!
//! Guarantees: a batch's records, the removals it folds and the partition's offsets are
//! one sled batch, which the store applies whole or applies again (`store.rs`); the
//! in-memory index describes the tree once the batch is applied (property-tested: the
//! index kept as batches are written equals the one read afresh from the tree); a record
//! that cannot be read is reported with its sequence number and what could be read of it
//! is kept, never a panic.

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// Key prefix of the records.
pub(super) const RECORD_PREFIX: &[u8] = b"r/";

/// The bytes at which a record is cut (a longer entry gets one of its own) in a
/// database of `segment_bytes` log segments: 20 records and their keys under a quarter
/// segment less 8 KiB, rounded down to a KiB (6 KiB in sled's default 512 KiB segments,
/// 25 KiB in the 2 MiB ones of a directory this build creates). sled writes a log
/// message over a quarter of a segment (less its headers) to a file of its own, a blob,
/// which its flush does not sync. It splits a leaf past 16 keys, and a merge hands a leaf
/// up to 3 more, so a leaf it rewrites whole holds at most 20 keys (records and the
/// partition's offsets): under the threshold while no entry is longer than a record.
///
/// Why as long as that: sled's CPU a byte of records falls with their length, since each
/// record costs an insert, its share of its leaf's rewrites, a removal and the log's
/// cleaning whatever its bytes (`benches/sled_records.rs`: 10.3 s of CPU a GB of
/// records at 6 KiB in 512 KiB segments, 5.2 at 25 KiB in 2 MiB ones, with the page
/// cache held to its 8 MiB; DEVELOPMENT.md, thirty-fifth look).
pub(super) const fn record_bytes(segment_bytes: usize) -> usize {
    ((segment_bytes / 4 - LEAF_HEADROOM_BYTES) / LEAF_KEYS_MAX) & !1023
}

/// The most keys a sled leaf holds when it is written whole (see [`record_bytes`]).
pub(super) const LEAF_KEYS_MAX: usize = 20;
/// What a leaf of records leaves under sled's blob threshold: its keys, their lengths,
/// its bounds and the message's headers.
pub(super) const LEAF_HEADROOM_BYTES: usize = 8 * 1024;

/// The live bytes folded per batch when the batch itself wrote fewer (smaller in the
/// unit tests, so that their small stores fold).
pub(super) const FOLD_BYTES_MIN: u64 = if cfg!(test) { 2048 } else { 256 * 1024 };

/// The records are folded while they hold more than this many times the live bytes…
const FOLD_FACTOR: u64 = 2;
/// …plus this much (a small store is not folded over and over).
const FOLD_SLACK_BYTES: u64 = if cfg!(test) { 4096 } else { 1024 * 1024 };

/// A chain's deltas hold at most this many times its state entry's bytes: past it the
/// whole state is written (a chain is at most about twice a state, and a restore applies a
/// few deltas a session: 3 at the quarter-to-a-third deltas of the recorded sessions).
pub(super) const CHAIN_DELTA_FACTOR: u64 = 1;

const STATE: u8 = 0;
const DELETION: u8 = 1;
const DELTA: u8 = 2;

pub(super) fn record_key(seq: u64) -> [u8; 10] {
    let mut k = [0u8; 10];
    k[..2].copy_from_slice(RECORD_PREFIX);
    k[2..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The sequence number of a record's key (`u64::MAX` is none: no record is written
/// there, and the next would have no number).
pub(super) fn record_seq(key: &[u8]) -> Option<u64> {
    let rest = key.strip_prefix(RECORD_PREFIX)?;
    Some(u64::from_be_bytes(rest.try_into().ok()?)).filter(|seq| *seq != u64::MAX)
}

/// One entry of a record, as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Entry<'a> {
    State { name: &'a [u8], state: &'a [u8] },
    Deletion { name: &'a [u8] },
    Delta { name: &'a [u8], delta: &'a [u8] },
}

impl<'a> Entry<'a> {
    pub(super) fn name(&self) -> &'a [u8] {
        match *self {
            Entry::State { name, .. } | Entry::Deletion { name } | Entry::Delta { name, .. } => {
                name
            }
        }
    }
}

/// Why a record could not be read to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("entry {entry} at byte {at}: {reason}")]
pub struct BadRecord {
    pub entry: u32,
    pub at: usize,
    pub reason: &'static str,
}

/// Reads a record's entries in order; stops at the first that cannot be read.
pub(super) struct Entries<'a> {
    bytes: &'a [u8],
    at: usize,
    entry: u32,
}

pub(super) fn entries(bytes: &[u8]) -> Entries<'_> {
    Entries {
        bytes,
        at: 0,
        entry: 0,
    }
}

impl<'a> Entries<'a> {
    fn bad(&mut self, reason: &'static str) -> BadRecord {
        let bad = BadRecord {
            entry: self.entry,
            at: self.at,
            reason,
        };
        self.at = self.bytes.len();
        bad
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let part = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(part)
    }

    fn length_prefixed(&mut self) -> Option<&'a [u8]> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().ok()?);
        self.take(len as usize)
    }
}

impl<'a> Iterator for Entries<'a> {
    /// The entry and its length in the record.
    type Item = Result<(Entry<'a>, u32), BadRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.bytes.len() {
            return None;
        }
        let start = self.at;
        let kind = self.bytes[self.at];
        if !matches!(kind, STATE | DELETION | DELTA) {
            return Some(Err(self.bad("unknown entry kind")));
        }
        self.at += 1;
        let Some(name) = self.length_prefixed() else {
            self.at = start;
            return Some(Err(self.bad("the name runs past the record's end")));
        };
        let entry = match kind {
            STATE | DELTA => match self.length_prefixed() {
                Some(state) if kind == STATE => Entry::State { name, state },
                Some(delta) => Entry::Delta { name, delta },
                None => {
                    self.at = start;
                    return Some(Err(self.bad("the state runs past the record's end")));
                }
            },
            _ => Entry::Deletion { name },
        };
        self.entry += 1;
        Some(Ok((entry, (self.at - start) as u32)))
    }
}

/// Where an entry of a session's chain is: its record, its index there, its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Holder {
    pub record: u64,
    pub entry: u32,
    len: u32,
}

/// A session's chain: its newest state entry and the deltas written after it, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Chain {
    pub state: Holder,
    pub deltas: Vec<Holder>,
}

impl Chain {
    /// Its entries in the order they apply: its state entry, then its deltas.
    pub(super) fn entries(&self) -> impl Iterator<Item = &Holder> {
        std::iter::once(&self.state).chain(&self.deltas)
    }

    fn holds(&self, record: u64, entry: u32) -> bool {
        self.entries()
            .any(|h| h.record == record && h.entry == entry)
    }

    fn delta_bytes(&self) -> u64 {
        self.deltas.iter().map(|h| u64::from(h.len)).sum()
    }

    /// The record of its newest entry.
    fn last_record(&self) -> u64 {
        self.deltas.last().unwrap_or(&self.state).record
    }
}

/// What one record holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct RecordStats {
    /// The record's bytes (once it is written whole).
    bytes: u64,
    /// Its entries holding a session's newest state, and their bytes.
    live: u32,
    live_bytes: u64,
    /// Its deletions. What each ends is not tracked: they stay until their record is the
    /// oldest, when nothing older is left to hold a state they end.
    deletions: u32,
    /// Entries so far (the next entry's index).
    entries: u32,
}

/// The in-memory index of a partition's records.
#[derive(Debug, Default)]
pub(super) struct Log {
    /// The sequence number of the next record.
    next: u64,
    chains: FxHashMap<Box<[u8]>, Chain>,
    records: BTreeMap<u64, RecordStats>,
    stored_bytes: u64,
    live_bytes: u64,
    /// Records that may hold nothing live and end nothing any more (checked again when
    /// removed), so that a batch finds them without walking every record.
    emptied: Vec<u64>,
    /// The newest record read that could not be read to its end. What followed its fault
    /// is lost, a session's state or delta among it may be, so a chain that ends at or
    /// before it is not extended by a delta after it (which may have been taken against
    /// a lost entry): that delta is dead, and the session's next state is written whole.
    damaged: Option<u64>,
}

impl Log {
    /// Adds a record read from the tree (records are read in order); what could be read
    /// of a record that cannot be read to its end is kept.
    pub(super) fn read_record(&mut self, seq: u64, bytes: &[u8]) -> Result<(), BadRecord> {
        self.next = self.next.max(seq + 1);
        let mut result = Ok(());
        for entry in entries(bytes) {
            match entry {
                Ok((e, len)) => self.note(seq, e, len),
                Err(e) => result = Err(e),
            }
        }
        if result.is_err() {
            self.damaged = Some(self.damaged.map_or(seq, |d| d.max(seq)));
        }
        self.seal(seq, bytes.len());
        result
    }

    /// Whether a delta may extend `chain` (see [`Log::damaged`]).
    fn extends(&self, chain: &Chain) -> bool {
        self.damaged.is_none_or(|d| chain.last_record() > d)
    }

    pub(super) fn chain(&self, name: &[u8]) -> Option<&Chain> {
        self.chains.get(name)
    }

    /// Looks up every chain of `names` (some of a batch's sessions) in one run, before the
    /// batch's writes look them up one at a time between copies of their states, and asks
    /// for each chain's deltas. With hundreds of thousands of sessions each lookup misses
    /// the cache three times (the index's control bytes, its bucket, the name's bytes),
    /// one after the other; lookups in a row that do not depend on each other overlap
    /// those misses, where one between two writes waits them out. A hint: nothing depends
    /// on it.
    pub(super) fn warm<'n>(&self, names: impl Iterator<Item = &'n [u8]>) {
        for name in names {
            if let Some(chain) = self.chains.get(name) {
                crate::prefetch::line(chain.deltas.as_ptr().cast());
            }
        }
    }

    /// The entries of record `seq` (its `bytes`) that are part of their session's chain
    /// (states and deltas), in the record's order, with their lengths. Read over the
    /// records in order, each session's state entry comes before its deltas, in the
    /// order they apply.
    pub(super) fn live_entries<'s, 'b>(
        &'s self,
        seq: u64,
        bytes: &'b [u8],
    ) -> impl Iterator<Item = (Entry<'b>, u32)> + use<'s, 'b> {
        entries(bytes)
            .enumerate()
            .filter_map(move |(index, entry)| match entry {
                Ok((e @ (Entry::State { .. } | Entry::Delta { .. }), len)) => self
                    .chain(e.name())
                    .is_some_and(|c| c.holds(seq, index as u32))
                    .then_some((e, len)),
                _ => None,
            })
    }

    pub(super) fn sessions(&self) -> usize {
        self.chains.len()
    }

    /// The deltas the sessions' chains hold (walks every chain).
    pub(super) fn deltas(&self) -> usize {
        self.chains.values().map(|c| c.deltas.len()).sum()
    }

    /// An entry of `seq` no longer part of a chain.
    fn unlive(&mut self, old: Holder) {
        // The holder's record is in the index while it holds a live entry (a record is
        // removed only once none of its entries is live).
        if let Some(stats) = self.records.get_mut(&old.record) {
            stats.live -= 1;
            stats.live_bytes -= u64::from(old.len);
            self.live_bytes -= u64::from(old.len);
            if stats.live == 0 && stats.deletions == 0 {
                self.emptied.push(old.record);
            }
        }
    }

    /// Forgets a session's chain, its entries no longer live.
    fn forget(&mut self, name: &[u8]) {
        if let Some(chain) = self.chains.remove(name) {
            for h in chain.entries() {
                self.unlive(*h);
            }
        }
    }

    /// Accounts for an entry written (or read) at the end of record `seq`.
    fn note(&mut self, seq: u64, entry: Entry<'_>, len: u32) {
        let stats = self.records.entry(seq).or_default();
        let holder = Holder {
            record: seq,
            entry: stats.entries,
            len,
        };
        stats.entries += 1;
        let live = |log: &mut Log| {
            let stats = log.records.get_mut(&seq).expect("noted above");
            stats.live += 1;
            stats.live_bytes += u64::from(len);
            log.live_bytes += u64::from(len);
        };
        match entry {
            Entry::State { name, .. } => {
                live(self);
                let chain = Chain {
                    state: holder,
                    deltas: Vec::new(),
                };
                let before = match self.chains.get_mut(name) {
                    Some(c) => Some(std::mem::replace(c, chain)),
                    None => {
                        self.chains.insert(name.into(), chain);
                        None
                    }
                };
                for h in before.iter().flat_map(Chain::entries) {
                    self.unlive(*h);
                }
            }
            Entry::Delta { name, .. } => {
                // A delta with no state before it is dead from the start: its chain's
                // state was folded (and the chain copied later in the log). So is one
                // after a fault that may have lost what it was taken against.
                let damaged = self.damaged;
                if let Some(chain) = self.chains.get_mut(name) {
                    if damaged.is_none_or(|d| chain.last_record() > d) {
                        chain.deltas.push(holder);
                        live(self);
                    }
                }
            }
            Entry::Deletion { name } => {
                stats.deletions += 1;
                self.forget(name);
            }
        }
    }

    /// Record `seq` is written whole, `bytes` long.
    fn seal(&mut self, seq: u64, bytes: usize) {
        let stats = self.records.entry(seq).or_default();
        stats.bytes = bytes as u64;
        self.stored_bytes += bytes as u64;
    }

    /// Removes a record from the index; sessions whose chain it is still part of (only
    /// when it could not be read whole while it was folded) are forgotten with it.
    fn remove(&mut self, seq: u64) {
        if self.records.get(&seq).is_some_and(|r| r.live > 0) {
            let broken: Vec<Box<[u8]>> = self
                .chains
                .iter()
                .filter(|(_, c)| c.entries().any(|h| h.record == seq))
                .map(|(name, _)| name.clone())
                .collect();
            for name in broken {
                self.forget(&name);
            }
        }
        let Some(stats) = self.records.remove(&seq) else {
            return;
        };
        self.stored_bytes -= stats.bytes;
        self.live_bytes -= stats.live_bytes;
    }

    pub(super) fn needs_folding(&self) -> bool {
        self.stored_bytes > FOLD_FACTOR * self.live_bytes + FOLD_SLACK_BYTES
    }
}

/// A batch's records being written: entries go into the open record, which is cut into
/// a new one at `record_bytes` ([`record_bytes`]).
pub(super) struct Writer<'l> {
    log: &'l mut Log,
    record_bytes: usize,
    /// Records written whole (sequence, bytes).
    sealed: Vec<(u64, Vec<u8>)>,
    open: Option<(u64, Vec<u8>)>,
    /// The first record this batch writes: older ones may be folded.
    first: u64,
    /// Bytes of entries written (folded ones included).
    written: u64,
    /// Records to remove.
    removed: Vec<u64>,
}

impl<'l> Writer<'l> {
    pub(super) fn new(log: &'l mut Log, record_bytes: usize) -> Writer<'l> {
        let first = log.next;
        Writer {
            log,
            record_bytes,
            sealed: Vec::new(),
            open: None,
            first,
            written: 0,
            removed: Vec::new(),
        }
    }

    fn write(&mut self, kind: u8, name: &[u8], state: Option<&[u8]>) {
        let len = 1 + 4 + name.len() + state.map_or(0, |s| 4 + s.len());
        if self
            .open
            .as_ref()
            .is_some_and(|(_, b)| !b.is_empty() && b.len() + len > self.record_bytes)
        {
            self.seal();
        }
        let (seq, buf) = self.open.get_or_insert_with(|| {
            let seq = self.log.next;
            self.log.next += 1;
            (seq, Vec::with_capacity(self.record_bytes.max(len)))
        });
        buf.push(kind);
        buf.extend_from_slice(&(name.len() as u32).to_le_bytes());
        buf.extend_from_slice(name);
        let entry = match state {
            Some(s) => {
                buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
                buf.extend_from_slice(s);
                if kind == DELTA {
                    Entry::Delta { name, delta: s }
                } else {
                    Entry::State { name, state: s }
                }
            }
            None => Entry::Deletion { name },
        };
        let seq = *seq;
        self.log.note(seq, entry, len as u32);
        self.written += len as u64;
    }

    fn seal(&mut self) {
        if let Some((seq, buf)) = self.open.take() {
            self.log.seal(seq, buf.len());
            self.sealed.push((seq, buf));
        }
    }

    /// [`Log::warm`] for the sessions of puts about to be written.
    pub(super) fn warm<'n>(&self, names: impl Iterator<Item = &'n [u8]>) {
        self.log.warm(names);
    }

    /// Bytes of the entries written so far.
    pub(super) fn written(&self) -> u64 {
        self.written
    }

    /// A session's state.
    pub(super) fn put(&mut self, name: &[u8], state: &[u8]) {
        self.write(STATE, name, Some(state));
    }

    /// A session's state, `delta` the change from its state before (the one the chain
    /// ends at), `whole` the state itself: the delta is written while the session has a
    /// chain whose deltas, with this one, stay within [`CHAIN_DELTA_FACTOR`] times its
    /// state entry; else the whole state, which starts a new chain.
    pub(super) fn put_delta(&mut self, name: &[u8], delta: &[u8], whole: &[u8]) {
        let entry = entry_len(name, delta) as u64;
        let fits = self.log.chains.get(name).is_some_and(|c| {
            c.delta_bytes() + entry <= CHAIN_DELTA_FACTOR * u64::from(c.state.len)
                && self.log.extends(c)
        });
        if fits {
            self.write(DELTA, name, Some(delta));
        } else {
            self.put(name, whole);
        }
    }

    /// A session's end: written only when some record holds its state.
    pub(super) fn delete(&mut self, name: &[u8]) {
        if self.log.chains.contains_key(name) {
            self.write(DELETION, name, None);
        }
    }

    /// Writes a session's chain again, in order, from the records' bytes (`read` gives a
    /// record written before this batch); the bytes of live entries written. A chain one
    /// of whose entries cannot be found (which the index never says) is forgotten: its
    /// session starts anew.
    fn copy_chain<E>(
        &mut self,
        name: &[u8],
        read: &mut impl FnMut(u64) -> Result<Option<sled::IVec>, E>,
    ) -> Result<u64, E> {
        let Some(chain) = self.log.chains.get(name).cloned() else {
            return Ok(0);
        };
        let mut parts: Vec<(u8, Vec<u8>)> = Vec::with_capacity(1 + chain.deltas.len());
        for h in chain.entries() {
            let part = match self.written_record(h.record) {
                Some(bytes) => entry_at(bytes, h.entry),
                None => read(h.record)?.and_then(|bytes| entry_at(&bytes, h.entry)),
            };
            match part {
                Some(part) => parts.push(part),
                None => {
                    tracing::error!(
                        record = h.record,
                        entry = h.entry,
                        "a state store chain's entry is not where the index says; its session starts anew"
                    );
                    self.log.forget(name);
                    return Ok(0);
                }
            }
        }
        let mut copied = 0;
        for (kind, bytes) in parts {
            copied += entry_len(name, &bytes) as u64;
            self.write(kind, name, Some(&bytes));
        }
        Ok(copied)
    }

    /// The bytes of a record this batch wrote.
    fn written_record(&self, seq: u64) -> Option<&[u8]> {
        if seq < self.first {
            return None;
        }
        self.sealed
            .iter()
            .chain(self.open.as_ref())
            .find(|(s, _)| *s == seq)
            .map(|(_, b)| b.as_slice())
    }

    /// Removes the records written before this batch that hold nothing live and end
    /// nothing, then folds the oldest while the records hold more than [`FOLD_FACTOR`]
    /// times the live bytes plus [`FOLD_SLACK_BYTES`], until `budget` bytes of live
    /// entries are folded (the last record may pass it). `read` gives an older record's
    /// bytes.
    pub(super) fn fold<E>(
        &mut self,
        budget: u64,
        mut read: impl FnMut(u64) -> Result<Option<sled::IVec>, E>,
    ) -> Result<(), E> {
        // Records of this batch stay candidates for the next.
        let first = self.first;
        let (older, this): (Vec<u64>, Vec<u64>) = std::mem::take(&mut self.log.emptied)
            .into_iter()
            .partition(|seq| *seq < first);
        self.log.emptied = this;
        for seq in older {
            let dead = self
                .log
                .records
                .get(&seq)
                .is_some_and(|r| r.live == 0 && r.deletions == 0);
            if dead {
                self.log.remove(seq);
                self.removed.push(seq);
            }
        }
        // A chain's deltas may lie in a few records, each read once a fold.
        let mut cache: FxHashMap<u64, Option<sled::IVec>> = FxHashMap::default();
        let mut read = |seq: u64| -> Result<Option<sled::IVec>, E> {
            if let Some(bytes) = cache.get(&seq) {
                return Ok(bytes.clone());
            }
            let bytes = read(seq)?;
            cache.insert(seq, bytes.clone());
            Ok(bytes)
        };
        let mut folded = 0u64;
        while self.log.needs_folding() && folded < budget {
            let Some((&oldest, stats)) = self.log.records.first_key_value() else {
                break;
            };
            if oldest >= self.first {
                break;
            }
            if stats.live > 0 {
                // A record the index counts but sled does not hold would be a bug;
                // it is removed from the index like any other.
                if let Some(bytes) = read(oldest)? {
                    // Each chain once, whole: the record may hold its state and deltas
                    // (a chain copied has its state entry elsewhere after, and is not
                    // copied again; `dedup` only spares the common repeats).
                    let mut names: Vec<Box<[u8]>> = self
                        .log
                        .live_entries(oldest, &bytes)
                        .map(|(e, _)| Box::from(e.name()))
                        .collect();
                    names.dedup();
                    for name in names {
                        if self
                            .log
                            .chain(&name)
                            .is_some_and(|c| c.state.record == oldest)
                        {
                            folded += self.copy_chain(&name, &mut read)?;
                        }
                    }
                }
            }
            // Live entries not carried: the record is not in the tree (which the index
            // never says), or holds a delta whose chain's state is not in it (which the
            // log's order never makes), so their states are gone.
            let lost = self.log.records.get(&oldest).map_or(0, |r| r.live);
            if lost > 0 {
                tracing::error!(
                    record = oldest,
                    sessions = lost,
                    "a state store record being folded is not in the tree; its sessions start anew"
                );
            }
            // Its deletions end nothing now: no older record is left.
            self.log.remove(oldest);
            self.removed.push(oldest);
        }
        Ok(())
    }

    /// The records to insert (sequence, bytes) and the ones to remove.
    pub(super) fn finish(mut self) -> (Vec<(u64, Vec<u8>)>, Vec<u64>) {
        self.seal();
        (self.sealed, self.removed)
    }
}

/// An entry's length in a record: its kind, its name and its bytes, length-prefixed.
fn entry_len(name: &[u8], bytes: &[u8]) -> usize {
    1 + 4 + name.len() + 4 + bytes.len()
}

/// The kind and bytes of entry `index` of a record, if it is a state or a delta.
pub(super) fn entry_at(record: &[u8], index: u32) -> Option<(u8, Vec<u8>)> {
    match entries(record).nth(index as usize)? {
        Ok((Entry::State { state, .. }, _)) => Some((STATE, state.to_vec())),
        Ok((Entry::Delta { delta, .. }, _)) => Some((DELTA, delta.to_vec())),
        _ => None,
    }
}

#[cfg(test)]
mod tests;

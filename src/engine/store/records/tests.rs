use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// sled's tree as the records see it: records by sequence.
type Tree = BTreeMap<u64, Vec<u8>>;
/// What the store must hold: each session's newest state.
type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// Records as a directory this build creates cuts them.
const RECORD_BYTES: usize = record_bytes(crate::engine::store::SEGMENT_BYTES);

/// A batch's change of a session. A delta here is bytes appended to the state: the
/// records do not read what they hold, so any rule that rebuilds a state from its chain
/// in order checks them (appending fails on a lost, doubled or reordered delta).
#[derive(Debug, Clone)]
enum Change {
    Put(u8, Vec<u8>),
    Delta(u8, Vec<u8>),
    Delete(u8),
}

fn name(n: u8) -> Vec<u8> {
    format!("session-{n}").into_bytes()
}

/// The state a delta change gives (the model's state before, appended to).
fn after_delta(model: &Model, n: u8, delta: &[u8]) -> Vec<u8> {
    let mut state = model.get(&name(n)).cloned().unwrap_or_default();
    state.extend_from_slice(delta);
    state
}

/// Writes one batch as the store does: its states, its deletions, folding, then the
/// records in and the folded ones out. `model` holds the states before the batch (a
/// batch changes a session once, as the engine's do).
fn write(log: &mut Log, tree: &mut Tree, model: &Model, changes: &[Change]) -> u64 {
    let mut w = Writer::new(log, RECORD_BYTES);
    for c in changes {
        match c {
            Change::Put(n, state) => w.put(&name(*n), state),
            Change::Delta(n, delta) => {
                if model.contains_key(&name(*n)) {
                    w.put_delta(&name(*n), delta, &after_delta(model, *n, delta));
                } else {
                    w.put(&name(*n), delta);
                }
            }
            Change::Delete(_) => {}
        }
    }
    for c in changes {
        if let Change::Delete(n) = c {
            w.delete(&name(*n));
        }
    }
    let written = w.written();
    w.fold(written.max(FOLD_BYTES_MIN), |seq| {
        Ok::<_, ()>(tree.get(&seq).map(|b| sled::IVec::from(b.as_slice())))
    })
    .unwrap();
    let (records, removed) = w.finish();
    for (seq, bytes) in records {
        assert!(
            tree.insert(seq, bytes).is_none(),
            "record {seq} written twice"
        );
    }
    for seq in removed {
        assert!(
            tree.remove(&seq).is_some(),
            "record {seq} removed but not there"
        );
    }
    written
}

fn apply(model: &mut Model, changes: &[Change]) {
    for c in changes {
        match c {
            Change::Put(n, state) => {
                model.insert(name(*n), state.clone());
            }
            Change::Delta(n, delta) => {
                let state = after_delta(model, *n, delta);
                model.insert(name(*n), state);
            }
            Change::Delete(_) => {}
        }
    }
    for c in changes {
        if let Change::Delete(n) = c {
            model.remove(&name(*n));
        }
    }
}

/// The index read afresh from the tree, as a store opened on it reads it.
fn reread(tree: &Tree) -> Log {
    let mut log = Log::default();
    for (seq, bytes) in tree {
        log.read_record(*seq, bytes).unwrap();
    }
    log
}

/// The sessions' states as loading reads them: each chain's entries in the log's order,
/// its state entry first, each delta appended.
fn loaded(log: &Log, tree: &Tree) -> Model {
    let mut out = Model::new();
    for (seq, bytes) in tree {
        for (entry, _) in log.live_entries(*seq, bytes) {
            match entry {
                Entry::State { name, state } => {
                    assert!(out.insert(name.to_vec(), state.to_vec()).is_none());
                }
                Entry::Delta { name, delta } => out
                    .get_mut(name)
                    .expect("a live delta comes after its state entry")
                    .extend_from_slice(delta),
                Entry::Deletion { .. } => unreachable!("deletions are not live"),
            }
        }
    }
    out
}

fn check(log: &Log, tree: &Tree, model: &Model) {
    let fresh = reread(tree);
    // The kept index is the one the tree reads as (what may have emptied aside).
    assert_eq!(
        (
            &fresh.chains,
            &fresh.records,
            fresh.stored_bytes,
            fresh.live_bytes
        ),
        (&log.chains, &log.records, log.stored_bytes, log.live_bytes)
    );
    assert_eq!(&loaded(&fresh, tree), model);
    assert_eq!(fresh.chains.len(), model.len());
    for chain in fresh.chains.values() {
        assert!(
            chain.delta_bytes() <= CHAIN_DELTA_FACTOR * u64::from(chain.state.len),
            "{chain:?}"
        );
    }
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        // A state's bytes do not matter here, its length does (up to past a record's).
        3 => (0u8..24, any::<u8>(), 0usize..9000).prop_map(|(n, b, len)| Change::Put(n, vec![b; len])),
        // Deltas of distinct bytes, so that one lost, doubled or moved shows.
        4 => (0u8..24, prop::collection::vec(any::<u8>(), 1..400)).prop_map(|(n, d)| Change::Delta(n, d)),
        1 => (0u8..24).prop_map(Change::Delete),
    ]
}

/// A batch changes each session once (the engine's batches take a session's state once).
fn once_each(changes: Vec<Change>) -> Vec<Change> {
    let mut seen = std::collections::HashSet::new();
    changes
        .into_iter()
        .filter(|c| {
            let (Change::Put(n, _) | Change::Delta(n, _) | Change::Delete(n)) = c;
            seen.insert(*n)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// Any batches of states, deltas and deletions, of states up to past a record's
    /// size: the tree's chains give each session's newest state, and the index kept as
    /// batches were written is the one read afresh from the tree.
    #[test]
    fn the_records_hold_the_newest_states_and_the_kept_index_is_the_read_one(
        batches in prop::collection::vec(
            (prop::collection::vec(change(), 0..12).prop_map(once_each), prop::bool::weighted(0.2)),
            1..40,
        )
    ) {
        let (mut log, mut tree, mut model) = (Log::default(), Tree::new(), Model::new());
        for (b, reopen) in &batches {
            if *reopen {
                // A store opened afresh goes on from the index it reads.
                log = reread(&tree);
            }
            write(&mut log, &mut tree, &model, b);
            apply(&mut model, b);
            check(&log, &tree, &model);
        }
    }
}

/// A leaf of records stays in sled's log: [`LEAF_KEYS_MAX`] records (sled splits a leaf
/// past 16 keys, and a merge hands it up to 3 more) and their keys under a quarter
/// segment, sled's blob threshold, with room for the partition's offsets; sled's default
/// segment keeps the 6 KiB of the directories made before the larger segment.
#[test]
fn a_leaf_of_records_stays_under_sleds_blob_threshold() {
    use crate::engine::store::{LEGACY_SEGMENT_BYTES, SEGMENT_BYTES};
    assert_eq!(record_bytes(LEGACY_SEGMENT_BYTES), 6 * 1024);
    assert_eq!(record_bytes(SEGMENT_BYTES), 25 * 1024);
    for segment in [LEGACY_SEGMENT_BYTES, SEGMENT_BYTES] {
        let leaf = LEAF_KEYS_MAX * (record_bytes(segment) + record_key(0).len() + 16);
        assert!(leaf + 4096 < segment / 4, "{leaf} bytes in {segment}");
    }
}

#[test]
fn records_are_cut_at_their_size_and_a_large_state_has_one_of_its_own() {
    let (mut log, mut tree, mut model) = (Log::default(), Tree::new(), Model::new());
    let batch: Vec<Change> = (0..20)
        .map(|n| {
            let len = if n == 7 {
                3 * RECORD_BYTES
            } else {
                RECORD_BYTES / 6
            };
            Change::Put(n, vec![n; len])
        })
        .collect();
    write(&mut log, &mut tree, &model, &batch);
    apply(&mut model, &batch);
    check(&log, &tree, &model);
    assert!(tree.len() > 3, "{} records", tree.len());
    for bytes in tree.values() {
        let n = entries(bytes).count();
        assert!(
            bytes.len() <= RECORD_BYTES || n == 1,
            "{} bytes in {n} entries",
            bytes.len()
        );
    }
}

/// A fleet's case: every batch rewrites a share of many sessions; the log stays within
/// the folding bound of the live bytes (plus what a batch writes), however long it runs.
#[test]
fn the_log_stays_within_a_multiple_of_the_live_states() {
    let (mut log, mut tree, mut model) = (Log::default(), Tree::new(), Model::new());
    let mut most = 0u64;
    for round in 0..300u32 {
        // 40 of 200 sessions a batch, round-robin; some end and come back.
        let batch: Vec<Change> = (0..40u32)
            .map(|i| {
                let n = ((round * 40 + i) % 200) as u8;
                if (round + i) % 17 == 0 {
                    Change::Delete(n)
                } else {
                    Change::Put(n, vec![round as u8; 300 + (i as usize * 7) % 400])
                }
            })
            .collect();
        let written = write(&mut log, &mut tree, &model, &batch);
        apply(&mut model, &batch);
        most = most.max(written);
        assert!(
            log.stored_bytes
                <= FOLD_FACTOR * log.live_bytes + FOLD_SLACK_BYTES + 2 * most.max(FOLD_BYTES_MIN),
            "round {round}: {} bytes stored for {} live",
            log.stored_bytes,
            log.live_bytes
        );
    }
    check(&log, &tree, &model);
}

/// A record written again whole is removed by the batch that empties it (a store this
/// small is never folded).
#[test]
fn a_record_emptied_by_a_batch_is_removed_with_it() {
    let (mut log, mut tree, mut model) = (Log::default(), Tree::new(), Model::new());
    for round in 0..5u8 {
        let batch: Vec<Change> = (0..4).map(|n| Change::Put(n, vec![round; 50])).collect();
        write(&mut log, &mut tree, &model, &batch);
        apply(&mut model, &batch);
        assert_eq!(tree.len(), 1, "round {round}: {:?}", tree.keys());
        assert!(!log.needs_folding());
    }
    check(&log, &tree, &model);
    // One ended: its record keeps the deletion until the record is the oldest.
    let batch = [Change::Delete(0), Change::Put(1, vec![9; 50])];
    write(&mut log, &mut tree, &model, &batch);
    apply(&mut model, &batch);
    check(&log, &tree, &model);
    assert_eq!(tree.len(), 2);
}

/// A session ended where no record holds it costs no deletion.
#[test]
fn a_deletion_is_written_only_for_a_stored_session() {
    let (mut log, mut tree, model) = (Log::default(), Tree::new(), Model::new());
    write(&mut log, &mut tree, &model, &[Change::Delete(1)]);
    assert!(tree.is_empty());
    write(&mut log, &mut tree, &model, &[Change::Put(1, vec![1; 10])]);
    write(&mut log, &mut tree, &model, &[Change::Delete(1)]);
    let deletions = tree
        .values()
        .flat_map(|b| entries(b))
        .filter(|e| matches!(e, Ok((Entry::Deletion { .. }, _))))
        .count();
    assert_eq!(deletions, 1);
}

#[test]
fn a_record_cut_short_keeps_what_can_be_read_and_says_where_it_stops() {
    let (mut log, mut tree) = (Log::default(), Tree::new());
    write(
        &mut log,
        &mut tree,
        &Model::new(),
        &[Change::Put(1, vec![1; 10]), Change::Put(2, vec![2; 10])],
    );
    let (seq, bytes) = tree.iter().next().map(|(s, b)| (*s, b.clone())).unwrap();
    let cut = &bytes[..bytes.len() - 3];
    let mut fresh = Log::default();
    let err = fresh.read_record(seq, cut).unwrap_err();
    assert_eq!(err.entry, 1);
    assert!(err.to_string().contains("entry 1"), "{err}");
    assert!(fresh.chain(&name(1)).is_some() && fresh.chain(&name(2)).is_none());
    let mut unknown = bytes.clone();
    unknown[0] = 9;
    let err = Log::default().read_record(seq, &unknown).unwrap_err();
    assert_eq!(
        (err.entry, err.at, err.reason),
        (0, 0, "unknown entry kind")
    );
}

/// A chain is cut once its deltas would pass its state entry's bytes: the whole state is
/// written then, and starts a new chain.
#[test]
fn a_chain_is_cut_at_its_state_entrys_bytes() {
    let (mut log, mut tree, mut model) = (Log::default(), Tree::new(), Model::new());
    let kinds = |log: &Log| log.chain(&name(0)).map(|c| c.deltas.len());
    let batch = [Change::Put(0, vec![0; 1000])];
    write(&mut log, &mut tree, &model, &batch);
    apply(&mut model, &batch);
    let mut seen = Vec::new();
    for round in 1..=8u8 {
        let batch = [Change::Delta(0, vec![round; 300])];
        write(&mut log, &mut tree, &model, &batch);
        apply(&mut model, &batch);
        check(&log, &tree, &model);
        seen.push(kinds(&log).unwrap());
    }
    // Three deltas of ~320 bytes fit a state entry of ~1,015; the fourth writes the whole
    // state (here the deltas appended: 2,200 bytes), which holds six.
    assert_eq!(seen, [1, 2, 3, 0, 1, 2, 3, 4]);
}

/// A session's chain whose state entry is in the oldest record is copied whole, in
/// order, when that record folds, its deltas from the records after it and from the
/// batch folding it alike; a store opened afresh reads the copy, not the deltas left
/// behind.
#[test]
fn a_folded_chain_is_copied_whole_and_in_order() {
    let (mut log, mut tree, mut model) = (Log::default(), Tree::new(), Model::new());
    let mut folded = false;
    for round in 0..200u32 {
        // Session 0: a state, then deltas (one in each batch); the others rewritten
        // whole, so the old records empty and fold.
        let mut batch = vec![if round == 0 {
            Change::Put(0, vec![7; 2000])
        } else {
            Change::Delta(0, vec![round as u8; 40])
        }];
        batch.extend((1..6u8).map(|n| Change::Put(n, vec![round as u8; 900])));
        let first_record = *tree.keys().next().unwrap_or(&0);
        write(&mut log, &mut tree, &model, &batch);
        apply(&mut model, &batch);
        check(&log, &tree, &model);
        let chain = log.chain(&name(0)).unwrap();
        if round > 0 && chain.state.record > first_record && !chain.deltas.is_empty() {
            folded = folded || tree.keys().next() != Some(&first_record);
        }
    }
    assert!(
        folded,
        "session 0's state entry was folded with deltas after it"
    );
}

/// A record cut short may have lost a session's state or delta that a delta after it was
/// taken against: read afresh, such a delta does not extend the session's older chain
/// (the session keeps its older state, as it would with whole states), and its next
/// state is written whole.
#[test]
fn a_delta_after_a_record_cut_short_does_not_extend_an_older_chain() {
    let (mut log, mut tree, mut model) = (Log::default(), Tree::new(), Model::new());
    let batches = [
        // Session 2 keeps the first record live.
        vec![Change::Put(0, vec![1; 100]), Change::Put(2, vec![7; 100])],
        vec![Change::Put(1, vec![2; 100]), Change::Put(0, vec![3; 100])],
        vec![Change::Delta(0, vec![4; 10])],
    ];
    for batch in &batches {
        write(&mut log, &mut tree, &model, batch);
        apply(&mut model, batch);
    }
    assert_eq!(log.chain(&name(0)).unwrap().deltas.len(), 1);
    // The second record loses session 0's state: cut after its first entry.
    let (&seq, bytes) = tree.iter().nth(1).unwrap();
    let (_, first_len) = entries(bytes).next().unwrap().unwrap();
    let cut = bytes[..first_len as usize + 3].to_vec();
    tree.insert(seq, cut);
    let mut fresh = Log::default();
    let results: Vec<bool> = tree
        .iter()
        .map(|(seq, bytes)| fresh.read_record(*seq, bytes).is_ok())
        .collect();
    assert_eq!(results, [true, false, true]);
    let read = loaded(&fresh, &tree);
    assert_eq!(
        read.get(&name(0)),
        Some(&vec![1; 100]),
        "the older state, no delta"
    );
    assert_eq!(read.get(&name(1)), Some(&vec![2; 100]));
    // Its next delta is written whole.
    let mut w = Writer::new(&mut fresh, RECORD_BYTES);
    w.put_delta(&name(0), &[5; 10], &[6; 120]);
    drop(w.finish());
    let chain = fresh.chain(&name(0)).unwrap();
    assert!(
        chain.deltas.is_empty() && chain.state.record > seq,
        "{chain:?}"
    );
}

//! loopwarden's change to where sled splits a tree's rightmost leaf
//! (`vendor/sled/LOOPWARDEN.md`): a tree that takes its keys in order, as the state
//! store's records do, keeps its leaves nearly full, and the tree still reads as what was
//! written to it through appends, removals at its head, overwrites and a reopen.

use std::collections::BTreeMap;

/// A leaf past 16 keys is split; in sled 0.34.7 always after its ninth, so the leaves a
/// tree of appended keys leaves behind hold 9. Split near the end, they hold 11 (the
/// right node keeps 6: two over the 4 below which a leaf is merged back).
#[test]
fn the_leaves_of_keys_appended_in_order_stay_nearly_full() {
    let db = sled::Config::new().temporary(true).open().unwrap();
    let tree = db.open_tree("records").unwrap();
    for sequence in 0..4_000u64 {
        tree.insert(sequence.to_be_bytes(), vec![7u8; 64]).unwrap();
    }
    let leaves = tree.loopwarden_leaf_keys().unwrap();
    assert_eq!(leaves.iter().sum::<usize>(), 4_000, "{leaves:?}");
    // The last leaf is the one still taking keys.
    let full = &leaves[..leaves.len() - 1];
    let mean = full.iter().sum::<usize>() as f64 / full.len() as f64;
    assert!(
        mean >= 10.5,
        "the leaves behind the last hold {mean:.1} keys on average ({} leaves): split in \
         the middle, as in the published sled",
        full.len()
    );
    assert!(
        full.iter().all(|&k| k <= 16),
        "a leaf holds more than sled's 16 keys: {full:?}"
    );
}

/// xorshift64: the same operations on every run.
struct Steps(u64);

impl Steps {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

fn record_key(sequence: u64) -> Vec<u8> {
    let mut key = b"r/".to_vec();
    key.extend_from_slice(&sequence.to_be_bytes());
    key
}

fn read_all(tree: &sled::Tree) -> BTreeMap<Vec<u8>, Vec<u8>> {
    tree.iter()
        .map(|kv| {
            let (k, v) = kv.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect()
}

/// As the store writes a partition's records: each batch appends records at the tail,
/// removes the oldest (leaves at the head shrink and merge), overwrites the partition's
/// offsets (a key before the records), now and then a live record (a leaf behind the
/// tail) and a recent record (as the store removes one once nothing in it is live), with
/// a small page cache so that pages are read back from the log; then the database is
/// opened again and read back from its files.
#[test]
fn a_tree_of_appended_records_reads_as_written_through_removals_overwrites_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    // A cache of a few leaves: most pages are read back from the log.
    let config = sled::Config::new()
        .path(dir.path())
        .cache_capacity(64 * 1024);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut steps = Steps(0x9e37_79b9_7f4a_7c15);
    let (mut next, mut oldest) = (0u64, 0u64);
    {
        let db = config.open().unwrap();
        let tree = db.open_tree("records").unwrap();
        for round in 0..400u64 {
            let mut batch = sled::Batch::default();
            for _ in 0..1 + steps.next(24) {
                let value = vec![(next % 251) as u8; 20 + steps.next(400) as usize];
                batch.insert(record_key(next), value.clone());
                model.insert(record_key(next), value);
                next += 1;
            }
            while next - oldest > 300 {
                batch.remove(record_key(oldest));
                model.remove(&record_key(oldest));
                oldest += 1;
            }
            let offsets = round.to_be_bytes().to_vec();
            batch.insert(b"o/offsets".to_vec(), offsets.clone());
            model.insert(b"o/offsets".to_vec(), offsets);
            if steps.next(4) == 0 && next - oldest > 8 {
                let recent = next - 1 - steps.next(8);
                batch.remove(record_key(recent));
                model.remove(&record_key(recent));
            }
            if steps.next(4) == 0 {
                let live = oldest + steps.next(next - oldest);
                let value = vec![0xee; 1 + steps.next(200) as usize];
                batch.insert(record_key(live), value.clone());
                model.insert(record_key(live), value);
            }
            tree.apply_batch(batch).unwrap();
            if round % 50 == 49 {
                assert_eq!(read_all(&tree), model, "after round {round}");
            }
        }
        db.flush().unwrap();
    }
    let db = config.open().unwrap();
    let tree = db.open_tree("records").unwrap();
    assert_eq!(read_all(&tree), model, "after the reopen");
    assert_eq!(tree.len(), model.len());
}

/// The leaf taking appended keys gathers every one of them as an update on its page
/// until it splits (sled writes a page whole only once it holds 16 entries): read back
/// after a reopen at its fullest, all of them apply.
#[test]
fn the_leaf_taking_appends_reads_back_at_its_fullest_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let config = sled::Config::new().path(dir.path());
    let mut model = BTreeMap::new();
    {
        let db = config.open().unwrap();
        let tree = db.open_tree("records").unwrap();
        let mut sequence = 0u64;
        let mut append = |tree: &sled::Tree| {
            let value = sequence.to_le_bytes().repeat(1 + (sequence % 7) as usize);
            tree.insert(record_key(sequence), value.clone()).unwrap();
            model.insert(record_key(sequence), value);
            sequence += 1;
        };
        for _ in 0..2_000 {
            append(&tree);
        }
        // On until the last leaf holds 16 keys, the most before it splits.
        while *tree.loopwarden_leaf_keys().unwrap().last().unwrap() < 16 {
            append(&tree);
        }
        db.flush().unwrap();
    }
    let db = config.open().unwrap();
    let tree = db.open_tree("records").unwrap();
    assert_eq!(read_all(&tree), model);
    assert_eq!(tree.loopwarden_leaf_keys().unwrap().last(), Some(&16));
}

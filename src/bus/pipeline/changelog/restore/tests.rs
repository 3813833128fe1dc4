//! Unit tests of `restore`.

use super::super::CHANGELOG_COMMIT_KEY;
use super::*;
use crate::engine::state::SessionState;

/// Keeps what the assembler stores (the trait is ours; sled is tested in store.rs).
#[derive(Default)]
struct Stored(Vec<StoreBatch>);

impl StateStore for Stored {
    fn load_sessions(&self) -> Result<Vec<(String, SessionState)>, StoreError> {
        Ok(Vec::new())
    }
    fn offset(&self, _: &str) -> Result<Option<i64>, StoreError> {
        Ok(None)
    }
    fn commit(&mut self, batch: &StoreBatch) -> Result<(), StoreError> {
        self.0.push(batch.clone());
        Ok(())
    }
    fn session_bytes(&self, _: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
}

/// The current state format, as the header carries it.
fn current() -> &'static [u8] {
    static FORMAT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    FORMAT.get_or_init(|| STATE_FORMAT.to_string()).as_bytes()
}

fn session<'a>(offset: i64, batch: u64, key: &'a str, state: &'a [u8]) -> Entry<'a> {
    Entry {
        offset,
        kind: b"session",
        batch: Some(batch),
        format: STATE_FORMAT,
        key: key.as_bytes(),
        payload: Some(state),
    }
}

fn commit(offset: i64, batch: u64, records: usize, value: &mut Vec<u8>) -> Entry<'_> {
    commit_at(offset, batch, records, offset * 10, value)
}

/// A commit record at changelog `offset` of a batch that applied input up to `input`
/// (and, as the engine writes, its watermark: not an input offset).
fn commit_at(
    offset: i64,
    batch: u64,
    records: usize,
    input: i64,
    value: &mut Vec<u8>,
) -> Entry<'_> {
    *value = serde_json::to_vec(&CommitValue {
        group: Some("ours".into()),
        batch,
        records,
        offsets: vec![
            ("in/0".into(), input),
            ("engine/watermark".into(), 1_000_000 - input),
        ],
    })
    .unwrap();
    Entry {
        offset,
        kind: b"commit",
        batch: Some(batch),
        format: 1,
        key: CHANGELOG_COMMIT_KEY,
        payload: Some(value),
    }
}

fn feed(entries: Vec<Entry<'_>>) -> (Assembler, Stored) {
    let mut a = Assembler {
        group: "ours".into(),
        input_keys: vec!["in/0".into()],
        ..Assembler::default()
    };
    let mut stored = Stored::default();
    for e in entries {
        a.add(e, &mut stored).unwrap();
    }
    (a, stored)
}

/// `state` framed for batch `batch`, leaked for the records' lifetime (a test's few
/// bytes).
fn framed(batch: u64, state: &[u8]) -> &'static [u8] {
    super::super::SessionFrame::write(batch, state).leak()
}

fn keys(b: &StoreBatch) -> Vec<(&str, &[u8])> {
    b.puts.iter().map(|(k, v)| (k.as_str(), &v[..])).collect()
}

#[test]
fn a_restore_that_shutdown_interrupts_says_so_and_is_no_failure() {
    // No broker answers: the restore retries reading the changelog's extent until
    // shutdown, which (already triggered) ends it at the first retry.
    let settings = KafkaSettings {
        changelog_topic: "changelog".into(),
        ..KafkaSettings::default()
    };
    let shutdown = Shutdown::new();
    shutdown.trigger();
    let mut restorer = Restorer::new(&settings, "127.0.0.1:1", &shutdown);
    let dir = tempfile::tempdir().unwrap();
    let db = crate::engine::store::open_db(dir.path()).unwrap();
    let mut store = SledStore::partition(&db, 0).unwrap();
    let watch = crate::telemetry::Liveness::default().store_watch();
    match restorer.restore(0, &mut store, &db, &watch) {
        Err(PipelineError::RestoreInterrupted { partition: 0 }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_batch_counts_at_its_commit_record() {
    let mut v = Vec::new();
    let entries = vec![
        session(0, 7, "a", b"A"),
        session(1, 7, "b", b"B"),
        commit(2, 7, 2, &mut v),
    ];
    let (a, stored) = feed(entries);
    assert_eq!(stored.0.len(), 1);
    assert_eq!(keys(&stored.0[0]), vec![("a", &b"A"[..]), ("b", &b"B"[..])]);
    assert!(stored.0[0]
        .offsets
        .contains(&(CHANGELOG_POSITION.to_string(), 2)));
    assert!(stored.0[0].offsets.contains(&("in/0".to_string(), 20)));
    assert_eq!((a.applied, a.incomplete), (1, 0));
}

#[test]
fn an_unreadable_commit_record_stops_the_restore_and_a_later_field_does_not() {
    let mut v1 = Vec::new();
    let garbled = Entry {
        offset: 1,
        kind: b"commit",
        batch: Some(7),
        format: 1,
        key: CHANGELOG_COMMIT_KEY,
        payload: Some(b"{not json"),
    };
    let mut a = Assembler::default();
    let e = a
        .add(garbled, &mut Stored::default())
        .expect_err("an unreadable commit record is an error");
    assert!(e.to_string().contains("offset 1"), "{e}");
    // A field a later version adds, read by this one (a rollback).
    let mut later = commit(3, 8, 1, &mut v1);
    let mut value: serde_json::Value = serde_json::from_slice(later.payload.unwrap()).unwrap();
    value["added_later"] = serde_json::json!(true);
    let v2 = serde_json::to_vec(&value).unwrap();
    later.payload = Some(&v2);
    let (a, stored) = feed(vec![session(2, 8, "b", b"B"), later]);
    assert_eq!((a.applied, a.incomplete), (1, 0));
    assert_eq!(keys(&stored.0[0]), vec![("b", &b"B"[..])]);
}

#[test]
fn another_groups_changelog_is_refused_naming_both_and_an_unnamed_one_is_ours() {
    let mut v1 = Vec::new();
    let mut theirs = commit(1, 7, 1, &mut v1);
    let mut value: serde_json::Value = serde_json::from_slice(theirs.payload.unwrap()).unwrap();
    value["group"] = serde_json::json!("billing-agents");
    let v2 = serde_json::to_vec(&value).unwrap();
    theirs.payload = Some(&v2);
    let mut a = Assembler {
        topic: "loopwarden.changelog".into(),
        group: "ours".into(),
        input_keys: vec!["in/0".into()],
        ..Assembler::default()
    };
    let mut stored = Stored::default();
    a.add(session(0, 7, "a", b"A"), &mut stored).unwrap();
    let e = a
        .add(theirs, &mut stored)
        .expect_err("another group's batch is refused");
    let text = e.to_string();
    for said in [
        "`billing-agents`",
        "`ours`",
        "loopwarden.changelog",
        "offset 1",
    ] {
        assert!(text.contains(said), "{said} missing from: {text}");
    }
    assert!(stored.0.is_empty(), "nothing of theirs stored");
    // A commit record written before records named their group is the reader's.
    let mut v3 = Vec::new();
    let mut unnamed = commit(3, 8, 1, &mut v3);
    let mut value: serde_json::Value = serde_json::from_slice(unnamed.payload.unwrap()).unwrap();
    value.as_object_mut().unwrap().remove("group");
    let v4 = serde_json::to_vec(&value).unwrap();
    unnamed.payload = Some(&v4);
    let (a, stored) = feed(vec![session(2, 8, "b", b"B"), unnamed]);
    assert_eq!(a.applied, 1);
    assert_eq!(keys(&stored.0[0]), vec![("b", &b"B"[..])]);
}

#[test]
fn a_batch_behind_the_input_already_applied_is_skipped() {
    let (mut v1, mut v2, mut v3) = (Vec::new(), Vec::new(), Vec::new());
    let entries = vec![
        // The next owner's batch, through input offset 30...
        session(0, 9, "a", b"new"),
        commit_at(1, 9, 1, 30, &mut v1),
        // ...then the earlier owner's batch through 20, landing late.
        session(2, 7, "a", b"old"),
        commit_at(3, 7, 1, 20, &mut v2),
        // A batch of idle closes: no new input, still applied.
        session(4, 10, "a", b"closed"),
        commit_at(5, 10, 1, 30, &mut v3),
    ];
    let (a, stored) = feed(entries);
    assert_eq!((a.applied, a.stale), (2, 1));
    let states: Vec<_> = stored.0.iter().map(|b| keys(b)[0].1).collect();
    assert_eq!(states, vec![&b"new"[..], &b"closed"[..]]);
}

#[test]
fn batches_of_two_writers_interleaved_are_each_applied_whole() {
    // Writer B (ids 2<<20 …) is the next owner; writer A (ids 1<<20 …) lost the
    // partition with a batch in flight, which lands in the middle of B's batch.
    let (a_batch, b_batch) = ((1 << 20) + 5, (2 << 20) + 1);
    let (mut v1, mut v2) = (Vec::new(), Vec::new());
    let entries = vec![
        session(0, b_batch, "x", b"B-x"),
        session(1, a_batch, "y", b"A-y"),
        commit_at(2, a_batch, 1, 20, &mut v1),
        session(3, b_batch, "z", b"B-z"),
        commit_at(4, b_batch, 2, 30, &mut v2),
    ];
    let (a, stored) = feed(entries);
    assert_eq!((a.applied, a.incomplete, a.stale), (2, 0, 0));
    assert_eq!(
        keys(&stored.0[1]),
        vec![("x", &b"B-x"[..]), ("z", &b"B-z"[..])]
    );
}

#[test]
fn a_record_sent_again_after_its_commit_counts_at_the_commit_sent_after_it() {
    let (mut v1, mut v2) = (Vec::new(), Vec::new());
    let entries = vec![
        session(0, 7, "a", b"A"),
        // "b" failed the first time: the commit comes before it...
        commit(1, 7, 2, &mut v1),
        session(2, 7, "b", b"B"),
        // ...and is sent again after it.
        commit(3, 7, 2, &mut v2),
    ];
    let (a, stored) = feed(entries);
    assert_eq!((a.applied, a.incomplete), (1, 1));
    assert_eq!(keys(&stored.0[0]), vec![("a", &b"A"[..]), ("b", &b"B"[..])]);
    assert!(stored.0[0]
        .offsets
        .contains(&(CHANGELOG_POSITION.to_string(), 3)));
}

#[test]
fn records_of_a_batch_that_never_completed_are_dropped_at_the_next_commit() {
    let (mut v1, mut v2) = (Vec::new(), Vec::new());
    let entries = vec![
        // Batch 7 died with one of its two records written (its commit too early).
        session(0, 7, "a", b"stale"),
        commit(1, 7, 2, &mut v1),
        // After the restart its events went into batch 9.
        session(2, 9, "a", b"A"),
        session(3, 9, "c", b"C"),
        session(4, 9, "a", b"A2"),
        commit(5, 9, 2, &mut v2),
    ];
    let (_, stored) = feed(entries);
    assert_eq!(stored.0.len(), 1);
    // The last copy of a key wins; batch 7's record is gone.
    assert_eq!(
        keys(&stored.0[0]),
        vec![("a", &b"A2"[..]), ("c", &b"C"[..])]
    );
}

#[test]
fn the_earlier_format_is_still_read_and_other_state_formats_are_skipped() {
    let legacy_commit = serde_json::to_vec(&vec![("in/0", 41)]).unwrap();
    let entries = vec![
        Entry {
            batch: None,
            ..session(0, 0, "a", b"A")
        },
        Entry {
            batch: None,
            format: 1,
            ..session(1, 0, "old", b"format 1")
        },
        Entry {
            batch: None,
            payload: None,
            format: 1,
            ..session(2, 0, "closed", b"")
        },
        Entry {
            offset: 3,
            kind: b"commit",
            batch: None,
            format: 1,
            key: CHANGELOG_COMMIT_KEY,
            payload: Some(&legacy_commit),
        },
    ];
    let (a, stored) = feed(entries);
    assert_eq!(a.other_format, 1);
    assert_eq!(keys(&stored.0[0]), vec![("a", &b"A"[..])]);
    // The skipped session starts anew (deleted, as the closed one).
    assert_eq!(
        stored.0[0].deletes,
        vec!["old".to_string(), "closed".to_string()]
    );
    assert!(stored.0[0].offsets.contains(&("in/0".to_string(), 41)));
}

#[test]
fn a_state_of_another_format_still_makes_its_batch_whole() {
    let mut v = Vec::new();
    let entries = vec![
        session(0, 7, "a", b"A"),
        Entry {
            format: 0,
            ..session(1, 7, "old", b"other format")
        },
        commit(2, 7, 2, &mut v),
    ];
    let (a, stored) = feed(entries);
    assert_eq!((a.applied, a.other_format, a.incomplete), (1, 1, 0));
    assert_eq!(keys(&stored.0[0]), vec![("a", &b"A"[..])]);
    assert!(stored.0[0].offsets.contains(&("in/0".to_string(), 20)));
    // The session it skips starts anew: its state from before is not kept.
    assert_eq!(stored.0[0].deletes, vec!["old".to_string()]);
}

#[test]
fn a_session_whose_later_state_is_of_another_format_starts_anew_not_from_its_older_one() {
    // A rollback's restore: batch 8, of a newer build, wrote `a` in a format this build
    // does not read. Keeping batch 7's `a` would bring it back without batch 8's events,
    // which the offsets pass over.
    let (mut v7, mut v8) = (Vec::new(), Vec::new());
    let entries = vec![
        session(0, 7, "a", b"A"),
        commit(1, 7, 1, &mut v7),
        Entry {
            format: 999,
            ..session(2, 8, "a", b"newer")
        },
        commit(3, 8, 1, &mut v8),
    ];
    let (a, stored) = feed(entries);
    assert_eq!((a.applied, a.other_format), (2, 1));
    assert_eq!(keys(&stored.0[0]), vec![("a", &b"A"[..])]);
    let batch_8 = &stored.0[1];
    assert!(batch_8.puts.is_empty(), "{batch_8:?}");
    assert_eq!(batch_8.deletes, vec!["a".to_string()]);
    assert!(batch_8.offsets.contains(&("in/0".to_string(), 30)));
}

/// A session record as written since its frame (no headers, the batch and format at the
/// start of its value), and as written before (all three in headers), are read alike; a
/// kind header wins over a value that looks like a frame; a record with neither is of no
/// kind the restorer knows.
#[test]
fn framed_and_headed_session_records_are_read_alike_and_neither_is_of_no_kind() {
    let framed = super::super::SessionFrame::write(7, b"A");
    let read = Entry::from_parts(
        3,
        RecordParts {
            key: Some(b"a"),
            payload: Some(&framed),
            ..RecordParts::default()
        },
    );
    assert_eq!(
        (
            read.offset,
            read.kind,
            read.batch,
            read.format,
            read.key,
            read.payload
        ),
        (
            3,
            &b"session"[..],
            Some(7),
            STATE_FORMAT,
            &b"a"[..],
            Some(&b"A"[..])
        )
    );
    let headed = Entry::from_parts(
        4,
        RecordParts {
            kind: Some(b"session"),
            batch: Some(b"7"),
            format: Some(current()),
            key: Some(b"a"),
            payload: Some(b"A"),
        },
    );
    assert_eq!(
        (headed.kind, headed.batch, headed.format, headed.payload),
        (&b"session"[..], Some(7), STATE_FORMAT, Some(&b"A"[..]))
    );
    // A kind header: read by its headers, the value left whole.
    let both = Entry::from_parts(
        5,
        RecordParts {
            kind: Some(b"session"),
            batch: Some(b"8"),
            payload: Some(&framed),
            ..RecordParts::default()
        },
    );
    assert_eq!(
        (both.batch, both.format),
        (Some(8), 1),
        "no format header: format 1"
    );
    assert_eq!(both.payload, Some(&framed[..]));
    // No kind header and no frame (a short one, another magic): no kind.
    for value in [&framed[..15], b"lwS\x02 and then sixteen bytes".as_slice()] {
        let neither = Entry::from_parts(
            6,
            RecordParts {
                key: Some(b"a"),
                payload: Some(value),
                ..RecordParts::default()
            },
        );
        assert_eq!(neither.kind, b"", "{value:?}");
    }
    let garbled = Entry::from_parts(
        7,
        RecordParts {
            kind: Some(b"session"),
            format: Some(b"five"),
            ..RecordParts::default()
        },
    );
    assert_eq!(
        garbled.format, 0,
        "a format header that is no number is no format's"
    );
}

/// A batch whose session records are framed and whose tombstone is headed (as `queue`
/// writes them) is whole at its commit record, its states stored as they were framed.
#[test]
fn a_batch_of_framed_states_and_a_tombstone_is_applied_whole() {
    let parts = |key: &'static [u8], value: &'static [u8]| RecordParts {
        key: Some(key),
        payload: Some(value),
        ..RecordParts::default()
    };
    let mut v = Vec::new();
    let entries = vec![
        Entry::from_parts(0, parts(b"a", framed(9, b"A"))),
        Entry::from_parts(1, parts(b"b", framed(9, b"B"))),
        Entry::from_parts(
            2,
            RecordParts {
                kind: Some(b"session"),
                batch: Some(b"9"),
                key: Some(b"gone"),
                ..RecordParts::default()
            },
        ),
        commit(3, 9, 3, &mut v),
    ];
    let (a, stored) = feed(entries);
    assert_eq!((a.applied, a.incomplete, a.other_format), (1, 0, 0));
    assert_eq!(keys(&stored.0[0]), vec![("a", &b"A"[..]), ("b", &b"B"[..])]);
    assert_eq!(stored.0[0].deletes, vec!["gone".to_string()]);
}

/// A framed state of another state format (a newer build's, read after a rollback) is
/// read with its own format: it makes its batch whole and its session starts anew, as a
/// headed one of another format does.
#[test]
fn a_framed_state_of_another_format_is_skipped_and_its_session_starts_anew() {
    let mut other = super::super::SessionFrame::write(9, b"newer");
    other[12..16].copy_from_slice(&(STATE_FORMAT + 1).to_be_bytes());
    let other: &'static [u8] = other.leak();
    let read = Entry::from_parts(
        0,
        RecordParts {
            key: Some(b"a"),
            payload: Some(other),
            ..RecordParts::default()
        },
    );
    assert_eq!(
        (read.kind, read.format),
        (&b"session"[..], STATE_FORMAT + 1)
    );
    let mut v = Vec::new();
    let (a, stored) = feed(vec![read, commit(1, 9, 1, &mut v)]);
    assert_eq!((a.applied, a.other_format, a.incomplete), (1, 1, 0));
    assert!(stored.0[0].puts.is_empty(), "{:?}", stored.0[0]);
    assert_eq!(stored.0[0].deletes, vec!["a".to_string()]);
}

/// A framed record whose state is empty (its frame alone: never written, a corrupt
/// record) is a session record of its batch like any: the batch is whole at its commit
/// record, and the empty state is what any state that cannot be read is at a load,
/// passed over, its session starting anew, while the batch's other states and offsets
/// stand.
#[test]
fn a_frame_with_an_empty_state_makes_its_batch_whole_and_loads_as_no_session() {
    use crate::engine::store::MemoryStore;

    let state = SessionState::new(1_000, 1_000).to_bytes();
    let record = |offset, key: &'static [u8], state: &[u8]| {
        Entry::from_parts(
            offset,
            RecordParts {
                key: Some(key),
                payload: Some(framed(9, state)),
                ..RecordParts::default()
            },
        )
    };
    let empty = record(0, b"empty", b"");
    assert_eq!(empty.payload, Some(&b""[..]));
    let mut v = Vec::new();
    let (a, stored) = feed(vec![
        empty,
        record(1, b"kept", &state),
        commit(2, 9, 2, &mut v),
    ]);
    assert_eq!((a.applied, a.incomplete), (1, 0), "the batch is whole");
    let mut store = MemoryStore::new();
    store.commit(&stored.0[0]).unwrap();
    assert_eq!(store.session_bytes("empty").unwrap(), Some(Vec::new()));
    let loaded: Vec<String> = store
        .load_sessions()
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(loaded, vec!["kept".to_string()]);
}

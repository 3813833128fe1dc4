//! The sled store written by several threads at once, as a worker's store writers write
//! one database, while the machine is busy: every writer keeps making progress.
//!
//! sled 0.34.7 could deadlock here: a segment freed at the end of its file is truncated
//! by a task on sled's I/O thread pool, and the next segment taken waits for that task
//! while holding the lock every pool thread's log write needs; with the pool's threads
//! all in such writes, the task never ran and every writer stopped for good (sled issue
//! #1412). `vendor/sled` truncates on a thread of its own instead (see its
//! `LOOPWARDEN.md`). The test fails when any writer makes no progress for
//! `STALL_SECS`, and says where each stopped. The hang needs the pool's threads all in
//! log writes at the moment a truncation is queued: this run did not reproduce it against
//! the published crate in the tries made (its truncations: ~100 in 20 s), so it guards the
//! writers' progress under load; `tests/sled_truncation.rs` holds the change itself.

#[path = "../benches/shared/growth.rs"]
mod growth;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use growth::{growth_config_never_closing, growth_event};
use loopwarden::contract::event::{parse_event, ParseLimits};
use loopwarden::engine::store::{open_db_with_cache, SledStore, StateStore};
use loopwarden::engine::{Engine, EventMeta};

const WRITERS: u64 = 6;
const PARTITIONS_PER_WRITER: u64 = 8;
const SESSIONS_PER_WRITER: u64 = 2_000;
const BATCH_EVENTS: u64 = 1_000;
const RUN_SECS: u64 = 20;
const STALL_SECS: u64 = 10;

#[test]
fn writers_sharing_a_database_keep_making_progress() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_db_with_cache(dir.path(), 8 * 1024 * 1024).unwrap();
    let config = Arc::new(growth_config_never_closing("test"));
    let batches: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let started = Instant::now();
    let run_for = Duration::from_secs(RUN_SECS);
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (db, config, batches) = (db.clone(), config.clone(), batches.clone());
        let writer = std::thread::spawn(move || {
            let mut stores: Vec<SledStore> = (0..PARTITIONS_PER_WRITER)
                .map(|p| SledStore::partition(&db, (w * PARTITIONS_PER_WRITER + p) as i32).unwrap())
                .collect();
            let mut engines: Vec<Engine> = stores
                .iter()
                .map(|s| Engine::restore(config.clone(), s).unwrap())
                .collect();
            let (limits, mut out) = (ParseLimits::default(), Vec::new());
            let mut k = 0u64;
            while started.elapsed() < run_for {
                for _ in 0..BATCH_EVENTS {
                    let (_, json) = growth_event(k, SESSIONS_PER_WRITER);
                    let event = parse_event(json.as_bytes(), &limits).unwrap();
                    let meta = EventMeta {
                        offset: Some(k as i64),
                        ..EventMeta::default()
                    };
                    engines[(k % PARTITIONS_PER_WRITER) as usize].process(&event, &meta, &mut out);
                    out.clear();
                    k += 1;
                }
                for (engine, store) in engines.iter_mut().zip(&mut stores) {
                    if let Some(b) = engine.take_changes(&[("input/0".to_string(), k as i64)]) {
                        store.commit(&b).unwrap();
                    }
                }
                batches[w as usize].fetch_add(1, Ordering::Relaxed);
            }
        });
        writers.push(Some(writer));
    }
    let read = || -> Vec<u64> { batches.iter().map(|b| b.load(Ordering::Relaxed)).collect() };
    let (mut seen, mut moved) = (read(), vec![Instant::now(); WRITERS as usize]);
    while started.elapsed() < run_for {
        std::thread::sleep(Duration::from_millis(250));
        let now = read();
        for w in 0..WRITERS as usize {
            // A writer gone before the run's end failed: its panic says why.
            if writers[w].as_ref().is_some_and(|t| t.is_finished()) && started.elapsed() < run_for {
                let ended = writers[w].take().map(|t| t.join());
                panic!("writer {w} ended before the run's end: {ended:?}");
            }
            if now[w] != seen[w] {
                moved[w] = Instant::now();
            }
            assert!(
                moved[w].elapsed() < Duration::from_secs(STALL_SECS),
                "writer {w} made no progress for {STALL_SECS} s ({:.1} s into the run; batches \
                 stored by each writer: {now:?}): the store is stuck",
                started.elapsed().as_secs_f64()
            );
        }
        seen = now;
    }
    eprintln!("batches stored by each writer in {RUN_SECS} s: {seen:?}");
    // Each writer ends at the run's end (a stuck one would have failed the test above,
    // never joined).
    for (w, writer) in writers.into_iter().enumerate() {
        if let Some(Err(panic)) = writer.map(|t| t.join()) {
            panic!("writer {w} failed: {panic:?}");
        }
    }
}

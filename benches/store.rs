//! The state store alone as open sessions grow (issue 32): the engine and sled, no broker.
//!
//! Events go round-robin to `sessions` sessions that never complete (the pipeline bench's
//! growth phase, without Kafka): each input partition has its engine and its sled tree in
//! one database, as a worker has, and every `batch` events each partition's changes are
//! stored as one atomic batch, as the pipeline's store stage does. It prints, per round
//! (every session touched once), the time per event of parsing and the engine and of the
//! store (serializing the changed states and writing them to sled), the process
//! CPU (sled's flusher threads included), the database's size on disk and the bytes each
//! stored state takes, so the store's cost can be read against the state's size; at the
//! end, the resident memory each open session took (for the first size: run one size per
//! process for it; transparent huge pages off, as `loopwarden run` has them), and how long
//! loading every session afresh takes, as a restart does.
//!
//! Knobs (environment): LOOPWARDEN_BENCH_STORE_SESSIONS (comma-separated, default
//! `10000,200000`), LOOPWARDEN_BENCH_STORE_ROUNDS (events per session, default 4),
//! LOOPWARDEN_BENCH_STORE_BATCH (events per batch, default 10000),
//! LOOPWARDEN_BENCH_STORE_PARTITIONS (default 128), LOOPWARDEN_BENCH_STORE_CACHE_MIB (sled's
//! page cache, default the pipeline's), LOOPWARDEN_BENCH_STORE_FLUSH=1 (flush after every
//! batch, as the pipeline does when the changelog is off).
//!
//! `cargo bench --bench store`

use std::hash::BuildHasher as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use loopwarden::contract::event::{parse_event, ParseLimits};
use loopwarden::engine::store::{open_db_with_cache, SledStore, StateStore};
use loopwarden::engine::{Engine, EventMeta};

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "shared/growth.rs"]
mod growth;
#[path = "shared/proc.rs"]
mod proc;
use growth::{growth_config_never_closing, growth_event};
use proc::cpu_ms;

// The allocator `loopwarden` itself runs on (src/main.rs), so that the engine and the
// store are measured as they run.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

/// User + system CPU of this process so far (every thread, sled's included).
fn process_cpu() -> Duration {
    Duration::from_millis(cpu_ms(std::process::id()))
}

/// Resident memory of this process, bytes (`None` where it cannot be read).
fn rss_bytes() -> Option<u64> {
    Some(common::rss_kb(std::process::id()))
        .filter(|kb| *kb > 0)
        .map(|kb| kb * 1024)
}

/// `first`: the process's first run, whose memory growth is its own (a later run reuses
/// what the ones before it left resident).
fn run(
    sessions: u64,
    rounds: u64,
    batch: u64,
    partitions: u64,
    cache_mib: u64,
    flush: bool,
    first: bool,
) {
    let rss_before = rss_bytes();
    let dir = tempfile::tempdir().unwrap();
    let db = open_db_with_cache(dir.path(), cache_mib * 1024 * 1024).unwrap();
    // Sessions never close and ceilings never stop them, however many rounds.
    let config = Arc::new(growth_config_never_closing("bench"));
    let mut stores: Vec<SledStore> = (0..partitions)
        .map(|p| SledStore::partition(&db, p as i32).unwrap())
        .collect();
    let mut engines: Vec<Engine> = stores
        .iter()
        .map(|s| Engine::restore(config.clone(), s).unwrap())
        .collect();
    let mut out = Vec::new();
    let limits = ParseLimits::default();
    println!(
        "store: {sessions} sessions, {rounds} rounds, batches of {batch} events, {partitions} partitions, cache {cache_mib} MiB{}",
        if flush { ", flushed every batch" } else { "" }
    );
    println!("store: round  parse + engine µs/event  store µs/event  CPU µs/event  wall µs/event  MB on disk  bytes/state");
    let (mut engine_time, mut store_time) = (Duration::ZERO, Duration::ZERO);
    let (mut round_start, mut cpu_start) = (Instant::now(), process_cpu());
    let mut put_bytes = (0u64, 0u64);
    for k in 0..sessions * rounds {
        let (_, json) = growth_event(k, sessions);
        let started = Instant::now();
        let event = parse_event(json.as_bytes(), &limits).unwrap();
        let partition = (rustc_hash::FxBuildHasher.hash_one(k % sessions) % partitions) as usize;
        let meta = EventMeta {
            offset: Some(k as i64),
            ..EventMeta::default()
        };
        engines[partition].process(&event, &meta, &mut out);
        out.clear();
        engine_time += started.elapsed();
        // A batch also ends with each round, so that a round's row holds its own stores.
        if (k + 1) % batch == 0 || (k + 1) % sessions == 0 {
            let started = Instant::now();
            for (engine, store) in engines.iter_mut().zip(&mut stores) {
                let offsets = [("input/0".to_string(), k as i64)];
                if let Some(b) = engine.take_changes(&offsets) {
                    for (_, v) in &b.puts {
                        put_bytes.0 += 1;
                        put_bytes.1 += v.len() as u64;
                    }
                    store.commit(&b).unwrap();
                }
            }
            if flush {
                db.flush().unwrap();
            }
            store_time += started.elapsed();
        }
        if (k + 1) % sessions == 0 {
            let events = sessions as f64;
            let per = |d: Duration| d.as_secs_f64() * 1e6 / events;
            println!(
                "store: {:5}  {:23.2}  {:14.2}  {:12.2}  {:13.2}  {:10.1}  {:11.0}",
                (k + 1) / sessions,
                per(engine_time),
                per(store_time),
                per(process_cpu() - cpu_start),
                per(round_start.elapsed()),
                db.size_on_disk().unwrap() as f64 / 1e6,
                put_bytes.1 as f64 / put_bytes.0.max(1) as f64,
            );
            (engine_time, store_time) = (Duration::ZERO, Duration::ZERO);
            (round_start, cpu_start) = (Instant::now(), process_cpu());
            put_bytes = (0, 0);
        }
    }
    let deltas: usize = stores.iter().map(|s| s.stored_deltas().unwrap()).sum();
    println!(
        "store: the sessions' chains hold {deltas} deltas after their whole states ({:.2} a session)",
        deltas as f64 / sessions as f64
    );
    let open: usize = engines.iter().map(Engine::open_sessions).sum();
    assert_eq!(open as u64, sessions, "every session stays open");
    match (first, rss_before, rss_bytes()) {
        (true, Some(before), Some(after)) => println!(
            "store: resident memory grew {:.1} MB over the run, {} bytes per open session (the engines' session tables, states, ids and expiry heaps, sled's cache and structures, and whatever else the run left resident)",
            after.saturating_sub(before) as f64 / 1e6,
            after.saturating_sub(before) / sessions
        ),
        (false, ..) => println!(
            "store: resident memory per open session: only for a process's first size (run one size per process)"
        ),
        _ => println!("store: resident memory: not readable here (/proc/self/status)"),
    }
    // What a restart reads: each partition's store opened afresh (its index read from
    // the records) and its sessions loaded.
    drop(stores);
    let load_start = Instant::now();
    let stored: usize = (0..partitions)
        .map(|p| {
            let store = SledStore::partition(&db, p as i32).unwrap();
            store.load_sessions().unwrap().len()
        })
        .sum();
    let load = load_start.elapsed();
    assert_eq!(stored as u64, sessions, "every session is stored");
    println!(
        "store: loading the {stored} sessions afresh took {:.2} s ({:.2} µs a session)",
        load.as_secs_f64(),
        load.as_secs_f64() * 1e6 / stored as f64
    );
}

fn main() {
    // The heap as the service's workers hold it (without huge pages).
    loopwarden::heap::without_transparent_huge_pages();
    let sizes: String = env_or(
        "LOOPWARDEN_BENCH_STORE_SESSIONS",
        "10000,200000".to_string(),
    );
    let rounds = env_or("LOOPWARDEN_BENCH_STORE_ROUNDS", 4u64);
    let batch = env_or("LOOPWARDEN_BENCH_STORE_BATCH", 10_000u64);
    let partitions = env_or("LOOPWARDEN_BENCH_STORE_PARTITIONS", 128u64);
    let cache = env_or(
        "LOOPWARDEN_BENCH_STORE_CACHE_MIB",
        loopwarden::config::DEFAULT_STATE_CACHE_MIB,
    );
    let flush = match env_or("LOOPWARDEN_BENCH_STORE_FLUSH", 0u8) {
        0 => false,
        1 => true,
        other => panic!("LOOPWARDEN_BENCH_STORE_FLUSH={other}: 0 or 1"),
    };
    assert!(
        batch > 0 && rounds > 0 && (1..=i32::MAX as u64).contains(&partitions),
        "LOOPWARDEN_BENCH_STORE_BATCH, _ROUNDS and _PARTITIONS must be at least 1"
    );
    assert!(
        (1..=loopwarden::config::MAX_STATE_CACHE_MIB).contains(&cache),
        "LOOPWARDEN_BENCH_STORE_CACHE_MIB={cache}: 1 to {} (MiB), as state.cache_mib",
        loopwarden::config::MAX_STATE_CACHE_MIB
    );
    for (i, size) in sizes.split(',').enumerate() {
        let sessions: u64 = match size.trim().parse() {
            Ok(n) if n > 0 => n,
            _ => panic!("LOOPWARDEN_BENCH_STORE_SESSIONS: {size:?} is not a count of at least 1"),
        };
        run(sessions, rounds, batch, partitions, cache, flush, i == 0);
    }
}

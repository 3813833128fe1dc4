//! What sled costs a byte of the state store's records, by the records' length and the
//! log's segment (issue 32, thirty-fourth look in docs/DEVELOPMENT.md): what longer
//! records in longer segments would save against 6 KiB records in sled's default 512 KiB
//! segments (`records::record_bytes`: what a directory made before the 2 MiB segment
//! keeps).
//!
//! sled alone, written as the store writes its records (`src/engine/store/records.rs`):
//! 16 trees (a worker's partitions), each taking a batch at a time of records under
//! big-endian sequence keys and removing the oldest, so each tree holds a fixed number
//! of live bytes, with the pipeline's 8 MiB page cache. Each configuration runs in a
//! process of its own (the bench starts itself again), so that one's memory does not
//! show in the next. Once the trees hold their live bytes, it counts the process's CPU
//! (user and system: sled's I/O threads and the kernel's page-cache copies are most of
//! it), the bytes it wrote (`wchar` of `/proc/self/io`) and the disk's (`write_bytes`),
//! each over the bytes of records written, and at the end the process's resident memory.
//! Configurations whose leaves (up to 20 keys: sled splits a leaf past 16, and a merge
//! hands it up to 3 more) may pass a quarter segment can have them written as blobs,
//! files of their own, which sled's flush does not sync: they are measured for
//! comparison, not usable. CPU is read in the
//! kernel's clock ticks of 1/100 s (Linux's `USER_HZ`).
//!
//! Knobs (environment): LOOPWARDEN_BENCH_SLED_LIVE_MIB (live bytes over all trees, default
//! 300), LOOPWARDEN_BENCH_SLED_WRITE_MIB (bytes of records written, default 2000),
//! LOOPWARDEN_BENCH_SLED_BATCH_KIB (KiB of records a tree takes a batch, rounded up to
//! whole records; default 288: a million open sessions' batch of states, about 1,250
//! deltas of 230 bytes a partition), LOOPWARDEN_BENCH_SLED_CONFIGS (`segment KiB:record KiB` pairs, comma
//! separated; default `512:6,512:24,1024:12,2048:25,4096:48`).
//!
//! `cargo bench --bench sled_records`

use std::time::Instant;

const TREES: usize = 16;
/// Set in the process that runs one configuration (`segment KiB:record KiB`).
const ONE: &str = "LOOPWARDEN_BENCH_SLED_ONE";

/// Stops the bench on a knob it cannot read, saying which.
fn refuse(what: String) -> ! {
    eprintln!("sled: {what}");
    std::process::exit(2)
}

fn knob(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| refuse(format!("{name}={v}: not a whole number"))),
        Err(_) => default,
    }
}

/// `(segment KiB, record KiB)` of a `segment:record` pair of
/// LOOPWARDEN_BENCH_SLED_CONFIGS, each a power of two of at least 512 KiB and a record
/// of at least 1 KiB.
fn config(pair: &str) -> (usize, usize) {
    let bad = || -> ! {
        refuse(format!(
            "LOOPWARDEN_BENCH_SLED_CONFIGS: {pair:?} is not `segment KiB:record KiB` (a segment a power of two of 512 or more, a record of 1 or more)"
        ))
    };
    let parse = |s: &str| s.trim().parse::<usize>().unwrap_or_else(|_| bad());
    let Some((segment, record)) = pair.split_once(':') else {
        bad()
    };
    let (segment, record) = (parse(segment), parse(record));
    if segment < 512 || !segment.is_power_of_two() || record == 0 {
        bad()
    }
    (segment, record)
}

/// `wchar` and `write_bytes` of this process.
fn written() -> (u64, u64) {
    let io = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    let field = |name: &str| {
        io.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("wchar:"), field("write_bytes:"))
}

/// User and system CPU seconds of this process.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after_name = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn resident_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn run_one(segment_kib: usize, record_kib: usize) {
    let live_mib = knob("LOOPWARDEN_BENCH_SLED_LIVE_MIB", 300);
    let write_mib = knob("LOOPWARDEN_BENCH_SLED_WRITE_MIB", 2000);
    let batch_kib = knob("LOOPWARDEN_BENCH_SLED_BATCH_KIB", 288);
    if write_mib < 3 * live_mib || live_mib == 0 {
        refuse(format!(
            "LOOPWARDEN_BENCH_SLED_WRITE_MIB={write_mib} is under three times LOOPWARDEN_BENCH_SLED_LIVE_MIB={live_mib}: the measurement starts once twice the live bytes are written"
        ))
    }
    let record = record_kib * 1024;
    let live = (live_mib << 20) / record / TREES;
    let total = (write_mib << 20) / record / TREES;
    let per_batch = (batch_kib * 1024).div_ceil(record).max(1);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = sled::Config::new()
        .path(dir.path())
        .cache_capacity(8 << 20)
        .segment_size(segment_kib * 1024)
        .open()
        .expect("sled opens");
    let trees: Vec<sled::Tree> = (0..TREES)
        .map(|i| db.open_tree(format!("partition/{i}")).expect("a tree"))
        .collect();
    let value = vec![7u8; record];
    let mut next = 0u64;
    let mut steady = None;
    let started = Instant::now();
    while (next as usize) < total {
        for tree in &trees {
            let mut batch = sled::Batch::default();
            for seq in next..next + per_batch as u64 {
                batch.insert(&seq.to_be_bytes(), value.as_slice());
                if let Some(oldest) = seq.checked_sub(live as u64) {
                    batch.remove(&oldest.to_be_bytes());
                }
            }
            tree.apply_batch(batch).expect("sled takes the batch");
        }
        next += per_batch as u64;
        if steady.is_none() && next as usize >= 2 * live {
            steady = Some((next, written(), cpu_secs()));
        }
    }
    let (from, (wchar, disk), cpu) = steady.expect("a run past twice the live records");
    let (wchar_end, disk_end) = written();
    let bytes = ((next - from) as usize * TREES * record) as f64;
    println!(
        "sled: {segment_kib:>5} KiB {record_kib:>4} KiB {:>7.2} {:>7.2} {:>8.2} {:>9.0} {:>8.1}",
        (wchar_end - wchar) as f64 / bytes,
        (disk_end - disk) as f64 / bytes,
        (cpu_secs() - cpu) / (bytes / 1e9),
        resident_mib(),
        started.elapsed().as_secs_f64(),
    );
}

fn main() {
    if let Ok(one) = std::env::var(ONE) {
        let (segment, record) = config(&one);
        run_one(segment, record);
        return;
    }
    let configs = std::env::var("LOOPWARDEN_BENCH_SLED_CONFIGS")
        .unwrap_or_else(|_| "512:6,512:24,1024:12,2048:25,4096:48".into());
    println!(
        "sled: segment  record  wchar/B  disk/B  CPU s/GB  resident MiB  secs   (per byte of records, once the trees hold their live bytes)"
    );
    let me = std::env::current_exe().expect("the bench's own path");
    for pair in configs.split(',') {
        let (segment, record) = config(pair);
        if 20 * record > segment / 4 - 8 {
            println!(
                "sled: {segment} KiB segments, {record} KiB records: leaves may be written as blobs (not usable)"
            );
        }
        let status = std::process::Command::new(&me)
            .env(ONE, pair)
            .status()
            .expect("the bench starts itself");
        if !status.success() {
            eprintln!("sled: {pair} failed: {status}");
            std::process::exit(1);
        }
    }
}

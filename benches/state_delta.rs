//! How many bytes a session state's delta would take against the whole state, per event
//! (issue 32, eighteenth look in docs/DEVELOPMENT.md): the measurement a delta format for
//! the store and the changelog is to be held to, taken before it is built.
//!
//! Each input file (JSON Lines in the event contract, `.gz` or plain: a recorded agent
//! file, a `loopwarden simulate` fleet) goes through one engine with the default
//! settings, as `replay` does. After each event its session's state is compared with
//! the one before it. The delta counted is what a reader holding the previous state
//! needs: every field but the rings written whole (the state encoded with its rings
//! empty), and for each ring (the window of tool calls, the seen pairs and seen lines,
//! the recent event ids, `similar_turns`' sketches) its new length and the items it
//! gained at its end (all of them when it changed otherwise, as the seen lines do when
//! a line seen before moves to the end). The items gained are found by comparison (the
//! longest run of the previous ring's last items that the new ring starts with is kept):
//! an item pushed onto a full ring of one repeated item is not counted (a tight loop's
//! window, 21 bytes), where a delta format, counting its pushes, would write it. It
//! prints, per file, the whole state's and the delta's mean, median and 90th percentile
//! in bytes, and the ratio of the means.
//!
//! `cargo bench --bench state_delta -- FILE...`

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::sync::Arc;

use loopwarden::config::Config;
use loopwarden::contract::event::{parse_event, ParseLimits};
use loopwarden::engine::state::{Encode, SessionState};
use loopwarden::engine::{Engine, EventMeta};

/// Items `after` gained at its end over `before`: the longest run of `before`'s last
/// items that `after` starts with is kept, the rest of `after` is new.
fn gained<T: PartialEq>(before: Option<&VecDeque<T>>, after: &VecDeque<T>) -> usize {
    let Some(before) = before else {
        return after.len();
    };
    let (b, a) = (before.len(), after.len());
    (0..=b.min(a))
        .rev()
        .find(|&kept| (0..kept).all(|i| before[b - kept + i] == after[i]))
        .map_or(a, |kept| a - kept)
}

/// The bytes of `ring`'s last `n` items as the state stores them (`item_len` each), and
/// the two varints (its length, `n`) before them.
fn tail_bytes<T>(ring: &VecDeque<T>, n: usize, item_len: impl FnMut(&T) -> usize) -> usize {
    let mut header = Vec::new();
    (ring.len() as u32).encode(&mut header);
    (n as u32).encode(&mut header);
    header.len()
        + ring
            .iter()
            .skip(ring.len() - n)
            .map(item_len)
            .sum::<usize>()
}

/// An item's stored bytes, through the state's own encoder.
fn encoded<T: Encode>(item: &T, scratch: &mut Vec<u8>) -> usize {
    scratch.clear();
    item.encode(scratch);
    scratch.len()
}

fn delta_bytes(
    before: Option<&SessionState>,
    after: &SessionState,
    scratch: &mut Vec<u8>,
) -> usize {
    let mut bare = after.clone();
    bare.run.window.clear();
    bare.run.seen_pairs.clear();
    bare.run.seen_lines.clear();
    bare.recent_event_ids.clear();
    bare.counters.similar_turns.sketches.clear();
    let mut n = bare.to_bytes().len();
    let (run, ids, sketches) = (
        before.map(|s| &s.run),
        before.map(|s| &s.recent_event_ids),
        before.map(|s| &s.counters.similar_turns.sketches),
    );
    let (a, ar) = (after, &after.run);
    // Digests in rings are stored fixed-width: 8 bytes a u64, 2 a u16.
    let call = gained(run.map(|r| &r.window), &ar.window);
    n += tail_bytes(&ar.window, call, |c| encoded(c, scratch));
    n += tail_bytes(
        &ar.seen_pairs,
        gained(run.map(|r| &r.seen_pairs), &ar.seen_pairs),
        |_| 8,
    );
    n += tail_bytes(
        &ar.seen_lines,
        gained(run.map(|r| &r.seen_lines), &ar.seen_lines),
        |_| 2,
    );
    n += tail_bytes(&a.recent_event_ids, gained(ids, &a.recent_event_ids), |_| 8);
    let own = &a.counters.similar_turns.sketches;
    n += tail_bytes(own, gained(sketches, own), |k| encoded(k, scratch));
    n
}

fn summary(v: &mut [usize]) -> (f64, usize, usize) {
    v.sort_unstable();
    let mean = v.iter().sum::<usize>() as f64 / v.len().max(1) as f64;
    let at = |p: f64| {
        v.get(((v.len().saturating_sub(1)) as f64 * p) as usize)
            .copied()
            .unwrap_or(0)
    };
    (mean, at(0.5), at(0.9))
}

fn measure(path: &str) -> std::io::Result<()> {
    let file = std::fs::File::open(path)?;
    let reader: Box<dyn BufRead> = if path.ends_with(".gz") {
        Box::new(BufReader::new(flate2::read::GzDecoder::new(file)))
    } else {
        Box::new(BufReader::new(file))
    };
    let mut engine = Engine::new(Arc::new(Config::default()));
    let limits = ParseLimits::default();
    let (mut out, mut scratch) = (Vec::new(), Vec::new());
    let (mut whole, mut delta, mut bad) = (Vec::new(), Vec::new(), 0u64);
    for line in reader.lines() {
        let line = line?;
        let Ok(event) = parse_event(line.as_bytes(), &limits) else {
            bad += 1;
            continue;
        };
        let before = engine.session(&event.session_id).cloned();
        engine.process(&event, &EventMeta::default(), &mut out);
        out.clear();
        // A session that closed with this event is not written again.
        let Some(after) = engine.session(&event.session_id) else {
            continue;
        };
        whole.push(after.to_bytes().len());
        delta.push(delta_bytes(before.as_ref(), after, &mut scratch));
    }
    let (wm, w50, w90) = summary(&mut whole);
    let (dm, d50, d90) = summary(&mut delta);
    println!(
        "| {path} ({} states, {bad} lines not events) | {wm:.0} ({w50} / {w90}) | {dm:.0} ({d50} / {d90}) | {:.2} |",
        whole.len(),
        dm / wm.max(1.0)
    );
    Ok(())
}

fn main() {
    let files: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    // `cargo test --benches` runs this with no files: nothing to measure then.
    if files.is_empty() {
        eprintln!("usage: cargo bench --bench state_delta -- FILE...");
        return;
    }
    println!(
        "| events | whole state, mean (p50 / p90) | delta, mean (p50 / p90) | delta / whole |"
    );
    println!("|---|---|---|---|");
    for path in &files {
        if let Err(error) = measure(path) {
            eprintln!("state_delta: cannot read {path}: {error}");
            std::process::exit(2);
        }
    }
}

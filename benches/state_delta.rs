//! How many bytes a session state's delta would take against the whole state, per event
//! (issue 32, eighteenth look in docs/DEVELOPMENT.md): the measurement a delta format for
//! the store and the changelog is to be held to, taken before it is built.
//!
//! Each input file (JSON Lines in the event contract, `.gz` or plain: a recorded agent
//! file, a `loopwarden simulate` fleet) goes through one engine with the default
//! settings, as `replay` does. After each event its session's state is written as a
//! delta from the state before it by the state's own encoder (`SessionState::delta_bytes`,
//! `engine::state::delta`: every field whole but five rings, which write the items they
//! gained), and the delta is applied to that state and must give the new one back (the
//! bench exits 1 when it does not). The engine does not count what its rings gained for
//! a store yet, so the counts are found by comparison (the longest run of the previous
//! ring's last items that the new ring starts with is kept): an item pushed onto a full
//! ring of one repeated item is not counted (a tight loop's window, 21 bytes), where the
//! engine's own count would write it. A session's first state counts whole. It prints,
//! per file, the whole state's and the delta's mean, median and 90th percentile in
//! bytes, and the ratio of the means.
//!
//! `cargo bench --bench state_delta -- FILE...`

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::sync::Arc;

use loopwarden::config::Config;
use loopwarden::contract::event::{parse_event, ParseLimits};
use loopwarden::engine::state::SessionState;
use loopwarden::engine::trajectory::Gained;
use loopwarden::engine::{Engine, EventMeta};

/// Items `after` gained at its end over `before`: the longest run of `before`'s last
/// items that `after` starts with is kept, the rest of `after` is new.
fn gained<T: PartialEq>(before: &VecDeque<T>, after: &VecDeque<T>) -> usize {
    let (b, a) = (before.len(), after.len());
    (0..=b.min(a))
        .rev()
        .find(|&kept| (0..kept).all(|i| before[b - kept + i] == after[i]))
        .map_or(a, |kept| a - kept)
}

/// The state's delta from `before` through the state's own encoder
/// (`SessionState::delta_bytes`), its rings' gained counts set from the comparison; the
/// delta is applied to `before` and must give `after` back.
fn delta_bytes(before: &SessionState, after: &SessionState, out: &mut Vec<u8>) -> usize {
    let mut st = after.clone();
    st.mark_written();
    let count = |gained: &mut Gained, n: usize| (0..n).for_each(|_| gained.push());
    count(
        &mut st.run.window_gained,
        gained(&before.run.window, &after.run.window),
    );
    count(
        &mut st.run.pairs_gained,
        gained(&before.run.seen_pairs, &after.run.seen_pairs),
    );
    count(
        &mut st.ids_gained,
        gained(&before.recent_event_ids, &after.recent_event_ids),
    );
    let (bt, at) = (
        &before.counters.similar_turns,
        &after.counters.similar_turns,
    );
    let turns = &mut st.counters.similar_turns;
    count(
        &mut turns.sketches_gained,
        gained(&bt.sketches, &at.sketches),
    );
    count(
        &mut turns.openings_gained,
        gained(&bt.openings, &at.openings),
    );
    out.clear();
    st.delta_bytes(out);
    match SessionState::apply_delta(before, out) {
        Ok(rebuilt) if rebuilt == *after => out.len(),
        Ok(_) => fail("a delta applied to the state before gave another state"),
        Err(error) => fail(&format!("a delta does not apply: {error}")),
    }
}

fn fail(what: &str) -> ! {
    eprintln!("state_delta: {what}");
    std::process::exit(1);
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
        let whole_len = after.to_bytes().len();
        whole.push(whole_len);
        // A session's first state is written whole.
        delta.push(before.map_or(whole_len, |b| delta_bytes(&b, after, &mut scratch)));
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

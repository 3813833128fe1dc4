//! A session state as the change from the state written before it (issue 32): what a
//! reader holding that state needs to rebuild this one, in a quarter to a third of the
//! whole state's bytes on the recorded agent sessions (`benches/state_delta.rs`).
//!
//! Most of an aged state is its rings (the window of tool calls, the seen pairs, the
//! recent event ids, `similar_turns`' sketches and openings), and an event adds an item
//! or none to each: a delta writes each ring's length and the items it gained since the
//! last write (its [`Gained`] count, kept at every push site), and every other field
//! whole. The layout: [`DELTA_FORMAT`], the state as [`SessionState::to_bytes`] writes
//! it with those rings empty, then for each ring in [`RINGS`]' order its new length, the
//! count of items written, and those items (fixed 8-byte digests, or the items' own
//! encoding).
//!
//! Guarantees: [`SessionState::apply_delta`] on the state last written (whole, or rebuilt
//! from deltas) gives back the state the delta was taken of, provided
//! [`SessionState::mark_written`] was called at that write (property-tested over
//! generated fleets, written after every event and every few). That holds because each
//! ring in [`RINGS`] only gains items at its end (each counted where it is pushed) and
//! loses its oldest ones, or is emptied (a new run, a tombstone), after which every item
//! it holds was counted; a ring that changes otherwise (the seen lines move a line seen
//! again to the end) belongs in the whole part. A delta that does not fit the state it
//! is applied to is an error that says which ring and why, never a panic.
//!
//! The sled store writes these in its records (`engine::store::records`); the changelog
//! takes whole states.

use std::collections::VecDeque;

use serde::de::DeserializeOwned;

use super::encode::fixed_items;
use super::{Encode, SessionState};
use crate::engine::text::TextSketch;
use crate::engine::trajectory::{CallRecord, Gained};

/// The first byte of every delta: its layout's version.
pub const DELTA_FORMAT: u8 = 1;

/// The rings a delta writes by the items they gained, in the order it writes them (the
/// names its errors give).
const RINGS: [&str; 5] = [
    "run.window",
    "run.seen_pairs",
    "recent_event_ids",
    "similar_turns.sketches",
    "similar_turns.openings",
];

/// The rings' gain counts a [`SessionState::mark_written`] dropped, in [`RINGS`]' order.
#[derive(Debug, Clone, Copy)]
pub struct Marks([Gained; 5]);

/// A delta that does not fit the state it is applied to, or is not one.
#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    #[error("state delta of layout {0}; this build reads layout {DELTA_FORMAT}")]
    Format(u8),
    #[error("state delta is empty")]
    Empty,
    #[error("state delta's state cannot be read: {0}")]
    State(#[from] postcard::Error),
    #[error("state delta's ring {ring}: {reason}")]
    Ring { ring: &'static str, reason: String },
    #[error("state delta has {0} bytes past its last ring")]
    Trailing(usize),
}

/// A state's rings, taken out (leaving them empty) and put back.
struct Rings {
    window: VecDeque<CallRecord>,
    seen_pairs: VecDeque<u64>,
    recent_event_ids: VecDeque<u64>,
    sketches: VecDeque<TextSketch>,
    openings: VecDeque<u64>,
}

impl Rings {
    fn take(st: &mut SessionState) -> Rings {
        let turns = &mut st.counters.similar_turns;
        Rings {
            window: std::mem::take(&mut st.run.window),
            seen_pairs: std::mem::take(&mut st.run.seen_pairs),
            recent_event_ids: std::mem::take(&mut st.recent_event_ids),
            sketches: std::mem::take(&mut turns.sketches),
            openings: std::mem::take(&mut turns.openings),
        }
    }

    fn put_back(self, st: &mut SessionState) {
        st.run.window = self.window;
        st.run.seen_pairs = self.seen_pairs;
        st.recent_event_ids = self.recent_event_ids;
        st.counters.similar_turns.sketches = self.sketches;
        st.counters.similar_turns.openings = self.openings;
    }
}

/// A ring's length, the count of the items it gained (those it holds of them), and those
/// items.
fn write_tail<T>(
    out: &mut Vec<u8>,
    ring: &VecDeque<T>,
    gained: Gained,
    item: impl Fn(&T, &mut Vec<u8>),
) {
    let written = gained.of(ring.len());
    (ring.len() as u32).encode(out);
    (written as u32).encode(out);
    for x in ring.iter().skip(ring.len() - written) {
        item(x, out);
    }
}

/// [`write_tail`] of a ring of fixed-width items, written `N` bytes each in place.
fn write_fixed_tail<T: Copy, const N: usize>(
    out: &mut Vec<u8>,
    ring: &VecDeque<T>,
    gained: Gained,
    le: impl Fn(T) -> [u8; N],
) {
    let written = gained.of(ring.len());
    (ring.len() as u32).encode(out);
    (written as u32).encode(out);
    let skip = ring.len() - written;
    let (front, back) = ring.as_slices();
    match front.get(skip..) {
        Some(front) => {
            fixed_items(out, front, &le);
            fixed_items(out, back, &le);
        }
        None => fixed_items(out, &back[skip - front.len()..], &le),
    }
}

fn take<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, &[u8]), DeltaError> {
    Ok(postcard::take_from_bytes(bytes)?)
}

/// A digest as rings store it (`fixed::deque`: its 8 little-endian bytes).
fn fixed_u64(bytes: &[u8]) -> Result<(u64, &[u8]), DeltaError> {
    take::<[u8; 8]>(bytes).map(|(b, rest)| (u64::from_le_bytes(b), rest))
}

/// The ring rebuilt from `before` and the tail at the front of `bytes`; the bytes after it.
fn read_tail<'a, T: Clone>(
    ring: &'static str,
    before: &VecDeque<T>,
    bytes: &'a [u8],
    item: impl Fn(&'a [u8]) -> Result<(T, &'a [u8]), DeltaError>,
) -> Result<(VecDeque<T>, &'a [u8]), DeltaError> {
    let bad = |reason: String| DeltaError::Ring { ring, reason };
    let (len, rest) = take::<u32>(bytes)?;
    let (written, mut rest) = take::<u32>(rest)?;
    let (len, written) = (len as usize, written as usize);
    let kept = len
        .checked_sub(written)
        .ok_or_else(|| bad(format!("{written} items written of a ring of {len}")))?;
    if kept > before.len() {
        return Err(bad(format!(
            "keeps {kept} items of the state before, which holds {}",
            before.len()
        )));
    }
    let mut out: VecDeque<T> = VecDeque::with_capacity(len);
    out.extend(before.iter().skip(before.len() - kept).cloned());
    for _ in 0..written {
        let (x, r) = item(rest)?;
        out.push_back(x);
        rest = r;
    }
    Ok((out, rest))
}

impl SessionState {
    /// This state as a delta from the state last written (appended to `out`): what its
    /// rings gained since [`SessionState::mark_written`], everything else whole. The
    /// rings are taken out while the rest is written and put back after (no copy).
    pub fn delta_bytes(&mut self, out: &mut Vec<u8>) {
        out.push(DELTA_FORMAT);
        let rings = Rings::take(self);
        self.encode(out);
        rings.put_back(self);
        let le = u64::to_le_bytes;
        let (run, turns) = (&self.run, &self.counters.similar_turns);
        write_fixed_tail(out, &run.window, run.window_gained, CallRecord::fixed_bytes);
        write_fixed_tail(out, &run.seen_pairs, run.pairs_gained, le);
        write_fixed_tail(out, &self.recent_event_ids, self.ids_gained, le);
        write_tail(out, &turns.sketches, turns.sketches_gained, |x, o| {
            x.encode(o)
        });
        write_fixed_tail(out, &turns.openings, turns.openings_gained, le);
    }

    /// Records that this state was written (whole or as a delta): the next delta is
    /// taken against it. Returns the counts it drops, for [`SessionState::unmark`].
    pub fn mark_written(&mut self) -> Marks {
        let turns = &mut self.counters.similar_turns;
        Marks([
            std::mem::replace(&mut self.run.window_gained, Gained::NONE),
            std::mem::replace(&mut self.run.pairs_gained, Gained::NONE),
            std::mem::replace(&mut self.ids_gained, Gained::NONE),
            std::mem::replace(&mut turns.sketches_gained, Gained::NONE),
            std::mem::replace(&mut turns.openings_gained, Gained::NONE),
        ])
    }

    /// Undoes a [`SessionState::mark_written`] whose write was not kept (a state written
    /// early in a batch and changed again before its end): the next delta is taken
    /// against the write before it again, counting what was gained before and since.
    pub fn unmark(&mut self, dropped: Marks) {
        let turns = &mut self.counters.similar_turns;
        let [window, pairs, ids, sketches, openings] = dropped.0;
        self.run.window_gained = window.then(self.run.window_gained);
        self.run.pairs_gained = pairs.then(self.run.pairs_gained);
        self.ids_gained = ids.then(self.ids_gained);
        turns.sketches_gained = sketches.then(turns.sketches_gained);
        turns.openings_gained = openings.then(turns.openings_gained);
    }

    /// Forgets what was written: the store may not hold the last write (a batch
    /// dropped), so the next delta writes every ring whole, fitting any state before.
    pub fn forget_written(&mut self) {
        self.unmark(Marks([Gained::WHOLE; 5]));
    }

    /// Whether a state was written since it was made or read (every ring's gain since
    /// then is counted): a delta of one that was not holds its rings whole, no smaller
    /// than the state.
    pub fn written_before(&self) -> bool {
        let turns = &self.counters.similar_turns;
        [
            self.run.window_gained,
            self.run.pairs_gained,
            self.ids_gained,
            turns.sketches_gained,
            turns.openings_gained,
        ]
        .iter()
        .all(|g| !g.is_whole())
    }

    /// The state `delta` describes, taken against `before` ([`SessionState::delta_bytes`]).
    pub fn apply_delta(before: &SessionState, delta: &[u8]) -> Result<SessionState, DeltaError> {
        let (&format, rest) = delta.split_first().ok_or(DeltaError::Empty)?;
        if format != DELTA_FORMAT {
            return Err(DeltaError::Format(format));
        }
        let (mut st, rest) = take::<SessionState>(rest)?;
        let turns = &before.counters.similar_turns;
        let (window, rest) = read_tail(RINGS[0], &before.run.window, rest, take)?;
        let (seen_pairs, rest) = read_tail(RINGS[1], &before.run.seen_pairs, rest, fixed_u64)?;
        let (ids, rest) = read_tail(RINGS[2], &before.recent_event_ids, rest, fixed_u64)?;
        let (sketches, rest) = read_tail(RINGS[3], &turns.sketches, rest, take)?;
        let (openings, rest) = read_tail(RINGS[4], &turns.openings, rest, fixed_u64)?;
        if !rest.is_empty() {
            return Err(DeltaError::Trailing(rest.len()));
        }
        Rings {
            window,
            seen_pairs,
            recent_event_ids: ids,
            sketches,
            openings,
        }
        .put_back(&mut st);
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::contract::event::{parse_event, ParseLimits};
    use crate::engine::{Engine, EventMeta};
    use crate::tools::simulate::{Fleet, FleetSpec};
    use proptest::prelude::*;
    use std::collections::HashMap;
    use std::sync::Arc;

    /// A ring's tail written in place is the tail written item by item, for every count
    /// gained, whether the ring is stored in one part or wrapped round its buffer (the
    /// gained items then in its second part, in both, or across the two).
    #[test]
    fn a_fixed_tail_is_the_tail_item_by_item_wherever_the_ring_is_split() {
        for len in 0..=9u64 {
            for dropped in 0..=len + 3 {
                // A ring of capacity `len` (at least) that dropped `dropped` items off its
                // front: its items start `dropped` places in, wrapping round.
                let mut ring: VecDeque<u64> = VecDeque::with_capacity(len as usize);
                for i in 0..dropped {
                    ring.push_back(1000 + i);
                    ring.pop_front();
                }
                ring.extend((0..len).map(|i| i * 0x0101_0101_0101));
                for gained in 0..=len as u8 + 1 {
                    let mut count = Gained::NONE;
                    (0..gained).for_each(|_| count.push());
                    let (mut fixed, mut each) = (Vec::new(), Vec::new());
                    write_fixed_tail(&mut fixed, &ring, count, u64::to_le_bytes);
                    write_tail(&mut each, &ring, count, |x, o| {
                        o.extend_from_slice(&x.to_le_bytes())
                    });
                    assert_eq!(
                        fixed,
                        each,
                        "{len} items in parts of {} and {}, {gained} gained",
                        ring.as_slices().0.len(),
                        ring.as_slices().1.len()
                    );
                }
            }
        }
    }

    /// Runs a generated fleet through an engine, writing each session's state every
    /// `every` of its events: whole the first time, then as a delta applied to the state
    /// last rebuilt, which must be the engine's state. Returns the deltas checked.
    fn fleet_rebuilt_by_deltas(seed: u64, sessions: u64, every: usize) -> usize {
        let mut fleet = Fleet::new(FleetSpec {
            sessions,
            concurrency: 8,
            loop_share: 0.5,
            seed,
        });
        let mut engine = Engine::new(Arc::new(Config::default()));
        let (limits, mut out) = (ParseLimits::default(), Vec::new());
        // Per session: the state as last written (rebuilt from bytes), and events since.
        let mut written: HashMap<String, (SessionState, usize)> = HashMap::new();
        let (mut t, mut checked) = (1_763_000_000_000i64, 0);
        while let Some(e) = fleet.next_event(t) {
            t += 250;
            let event = parse_event(&e.json, &limits).expect("the fleet's events parse");
            engine.process(&event, &EventMeta::default(), &mut out);
            out.clear();
            let Some(slot) = engine.sessions.get_mut(&e.session_id) else {
                written.remove(&e.session_id);
                continue;
            };
            let now = &mut slot.state;
            let Some((base, since)) = written.get_mut(&e.session_id) else {
                let whole = SessionState::from_bytes(&now.to_bytes()).unwrap();
                now.mark_written();
                written.insert(e.session_id.clone(), (whole, 0));
                continue;
            };
            *since += 1;
            if *since < every {
                continue;
            }
            let mut delta = Vec::new();
            now.delta_bytes(&mut delta);
            now.mark_written();
            let rebuilt = SessionState::apply_delta(base, &delta).expect("the delta applies");
            assert_eq!(&rebuilt, &**now, "session {}", e.session_id);
            assert_eq!(rebuilt.to_bytes(), now.to_bytes());
            (*base, *since) = (rebuilt, 0);
            checked += 1;
        }
        checked
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// A state rebuilt from the one written before it and its delta is the state,
        /// written after every event or every few.
        #[test]
        fn a_state_is_rebuilt_from_the_one_written_before_and_its_delta(
            seed in any::<u64>(),
            every in 1usize..=4,
        ) {
            prop_assert!(fleet_rebuilt_by_deltas(seed, 12, every) > 20);
        }
    }

    /// A session some events in, its state last written: its rings hold items.
    fn aged() -> SessionState {
        let mut engine = Engine::new(Arc::new(Config::default()));
        let mut fleet = Fleet::new(FleetSpec {
            sessions: 1,
            concurrency: 1,
            loop_share: 1.0,
            seed: 3,
        });
        let (limits, mut out, mut t) = (ParseLimits::default(), Vec::new(), 1_763_000_000_000);
        let mut last = None;
        for _ in 0..25 {
            let Some(e) = fleet.next_event(t) else { break };
            t += 250;
            let event = parse_event(&e.json, &limits).unwrap();
            engine.process(&event, &EventMeta::default(), &mut out);
            last = engine.session(&e.session_id).cloned().or(last);
        }
        let mut st = last.expect("the session is open");
        assert!(st.run.window.len() > 2 && st.recent_event_ids.len() > 2);
        st.mark_written();
        st
    }

    #[test]
    fn a_delta_after_one_event_is_a_fraction_of_the_state() {
        let mut st = aged();
        let before = st.clone();
        // One more tool call's worth: an item on the window, the pairs and the ids.
        st.run.window.push_back(st.run.window[0]);
        st.run.window_gained.push();
        st.run.seen_pairs.push_back(7);
        st.run.pairs_gained.push();
        st.recent_event_ids.push_back(9);
        st.ids_gained.push();
        let mut delta = Vec::new();
        st.delta_bytes(&mut delta);
        let whole = st.to_bytes().len();
        assert!(delta.len() * 2 < whole, "{} against {whole}", delta.len());
        assert_eq!(SessionState::apply_delta(&before, &delta).unwrap(), st);
    }

    #[test]
    fn a_state_read_back_writes_its_rings_whole() {
        let st = aged();
        let mut read = SessionState::from_bytes(&st.to_bytes()).unwrap();
        let mut delta = Vec::new();
        read.delta_bytes(&mut delta);
        // Whatever it is applied to, it gives the state: no ring keeps an item.
        assert_eq!(
            SessionState::apply_delta(&SessionState::default(), &delta).unwrap(),
            st
        );
    }

    #[test]
    fn a_delta_that_does_not_fit_is_an_error_that_says_why() {
        let mut st = aged();
        st.run.window.push_back(st.run.window[0]);
        st.run.window_gained.push();
        let mut delta = Vec::new();
        st.delta_bytes(&mut delta);
        // Against an empty state, the window keeps items it does not have.
        let err = SessionState::apply_delta(&SessionState::default(), &delta).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("state delta's ring run.window: keeps"),
            "{err}"
        );
        for cut in [1, delta.len() / 2, delta.len() - 1] {
            assert!(
                SessionState::apply_delta(&st, &delta[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut longer = delta.clone();
        longer.push(0);
        assert!(matches!(
            SessionState::apply_delta(&st, &longer),
            Err(DeltaError::Trailing(1))
        ));
        let mut other = delta.clone();
        other[0] = DELTA_FORMAT + 1;
        assert!(matches!(
            SessionState::apply_delta(&st, &other),
            Err(DeltaError::Format(f)) if f == DELTA_FORMAT + 1
        ));
        assert!(matches!(
            SessionState::apply_delta(&st, &[]),
            Err(DeltaError::Empty)
        ));
    }
}

//! A session state's stored bytes, written without serde: exactly the bytes postcard
//! writes for the derived `Serialize` of [`SessionState`] (the state format,
//! [`crate::engine::store::STATE_FORMAT`]), so the store, the changelog and a restore
//! (which reads with postcard, [`SessionState::from_bytes`]) see no difference.
//!
//! Why: at a million open sessions nearly every event writes its session's state (issue
//! 32), and through serde every byte of a fixed-width digest went through the serializer
//! one call at a time (about ten instructions a byte; 1.2 µs for a 430-byte state).
//! Here each digest is copied whole and each count written as its varint at once.
//!
//! Guarantees: the same bytes as `postcard::to_extend` for every state (a property test
//! holds this writer to postcard over arbitrary states, and the stored-state fixture
//! pins the format); no allocation but the output's growth. The wire format written
//! (postcard 1.x): unsigned integers as LEB128 varints, signed ones zigzagged first,
//! `u8` and `f64` as their little-endian bytes, `bool` as one byte, an `Option` as a
//! `0`/`1` tag and its value, a sequence or string as its length (varint) and its items,
//! a struct or tuple as its fields in order, a unit variant as its index (varint). The
//! fields written with `fixed::` (digests) are their little-endian bytes, no length.
//! A new field or detector state needs its line here: a field left out fails the
//! property test (and the stored-state fixture), and a detector's state type does not
//! compile without an [`Encode`] impl. Set a new field in the test's strategy too: a field
//! written in the wrong place or form shows only once it holds more than its default. A
//! ring written as `fixed::deque`, and the window of calls (fixed-width items), go
//! through [`ring`], not the `VecDeque` impl (which writes each item's varints), and
//! are written in place ([`fixed_items`], the module's one `unsafe` block).

use std::collections::VecDeque;

use super::{Episode, Episodes, FindingCounts, SessionState, Termination};
use crate::engine::detectors::circuit_breaker::Wasted;
use crate::engine::detectors::no_new_information::Answers;
use crate::engine::detectors::no_progress::Progress;
use crate::engine::detectors::similar_turns::Turns;
use crate::engine::detectors::DetectorKind;
use crate::engine::text::TextSketch;
use crate::engine::trajectory::{CallRecord, Counters, PollTracker, RunState, ToolCount};

/// A value written as postcard writes its derived `Serialize`.
pub trait Encode {
    fn encode(&self, out: &mut Vec<u8>);
}

/// An unsigned integer as postcard's varint (LEB128: seven bits a byte, low first).
#[inline]
fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A sequence's or string's length.
#[inline]
fn len(out: &mut Vec<u8>, n: usize) {
    varint(out, n as u64);
}

/// A ring of fixed-width values (`fixed::deque`, or a sequence of [`CallRecord`]s): its
/// length, then each value's bytes.
#[inline]
fn ring<T: Copy, const N: usize>(out: &mut Vec<u8>, v: &VecDeque<T>, le: impl Fn(T) -> [u8; N]) {
    len(out, v.len());
    let (front, back) = v.as_slices();
    fixed_items(out, front, &le);
    fixed_items(out, back, &le);
}

/// Each value's `N` bytes, in order. The output grows once and the values are written
/// into it in place: appended one at a time, each would check the vector's capacity and
/// store its length (a ring of 128 two-byte hashes took 128 such appends).
#[inline]
pub(super) fn fixed_items<T: Copy, const N: usize>(
    out: &mut Vec<u8>,
    items: &[T],
    le: impl Fn(T) -> [u8; N],
) {
    // An item's bytes are no more than its size, so `items.len() × N` is at most the
    // slice's size in bytes and cannot overflow.
    const { assert!(N > 0 && N <= std::mem::size_of::<T>()) };
    if items.is_empty() {
        // A ring's second part, most often.
        return;
    }
    let (start, bytes) = (out.len(), items.len() * N);
    out.reserve(bytes);
    // SAFETY: the `bytes` bytes past the length are reserved above; item `i` is written
    // to the `N` of them at `i × N` (a `[u8; N]` has no alignment to keep), so every one
    // is written before the length takes them in. `out` is borrowed mutably here, so
    // neither `items` nor `le` can reach it; a panic in `le` leaves the length as it was
    // (bytes have nothing to drop).
    unsafe {
        let at = out.as_mut_ptr().add(start);
        for (i, x) in items.iter().enumerate() {
            at.add(i * N).cast::<[u8; N]>().write(le(*x));
        }
        out.set_len(start + bytes);
    }
}

impl Encode for u8 {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(*self);
    }
}

impl Encode for u32 {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        varint(out, u64::from(*self));
    }
}

impl Encode for u64 {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        varint(out, *self);
    }
}

impl Encode for i64 {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        varint(out, ((*self << 1) ^ (*self >> 63)) as u64);
    }
}

impl Encode for f64 {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Encode for bool {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
}

impl Encode for () {
    #[inline]
    fn encode(&self, _: &mut Vec<u8>) {}
}

impl Encode for String {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        len(out, self.len());
        out.extend_from_slice(self.as_bytes());
    }
}

impl<T: Encode> Encode for Option<T> {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.encode(out);
            }
        }
    }
}

/// An array is a tuple: its items, no length.
impl<T: Encode, const N: usize> Encode for [T; N] {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        for x in self {
            x.encode(out);
        }
    }
}

impl<T: Encode> Encode for Vec<T> {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        len(out, self.len());
        for x in self {
            x.encode(out);
        }
    }
}

impl<T: Encode> Encode for VecDeque<T> {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        len(out, self.len());
        for x in self {
            x.encode(out);
        }
    }
}

impl Encode for SessionState {
    fn encode(&self, out: &mut Vec<u8>) {
        self.run_id.encode(out);
        self.agent_id.encode(out);
        self.tenant.encode(out);
        self.first_event_ms.encode(out);
        self.last_event_ms.encode(out);
        self.last_arrival_ms.encode(out);
        self.stats.encode(out);
        self.tools.encode(out);
        self.run.encode(out);
        self.counters.encode(out);
        ring(out, &self.recent_event_ids, u64::to_le_bytes);
        self.episodes.encode(out);
        self.findings.encode(out);
        self.termination.encode(out);
    }
}

impl Encode for Counters {
    fn encode(&self, out: &mut Vec<u8>) {
        self.events.encode(out);
        self.steps.encode(out);
        self.tool_calls_asked.encode(out);
        self.calls_since_turn.encode(out);
        self.most_calls_per_turn.encode(out);
        self.llm_calls.encode(out);
        self.turns.encode(out);
        self.tool_calls.encode(out);
        self.input_tokens.encode(out);
        self.output_tokens.encode(out);
        self.cache_read_tokens.encode(out);
        self.cache_write_tokens.encode(out);
        self.cost_usd.encode(out);
        self.has_cost.encode(out);
        self.max_depth.encode(out);
        self.duplicates.encode(out);
        self.dropped_after_termination.encode(out);
    }
}

impl Encode for ToolCount {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        self.tool.encode(out);
        self.calls.encode(out);
        self.repeats.encode(out);
    }
}

impl Encode for RunState {
    fn encode(&self, out: &mut Vec<u8>) {
        ring(out, &self.window, CallRecord::fixed_bytes);
        self.polls.encode(out);
        self.since_poll_moved.encode(out);
        ring(out, &self.seen_pairs, u64::to_le_bytes);
        ring(out, &self.seen_lines, u16::to_le_bytes);
    }
}

impl CallRecord {
    /// Action, result and shape fixed-width (`fixed::u64`, `fixed::u32`), then the flags
    /// byte: what the derived `Serialize` writes, as one array.
    #[inline]
    pub(super) fn fixed_bytes(self) -> [u8; 21] {
        let mut bytes = [0u8; 21];
        bytes[..8].copy_from_slice(&self.action.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.result.to_le_bytes());
        bytes[16..20].copy_from_slice(&self.shape.to_le_bytes());
        bytes[20] = self.flags;
        bytes
    }
}

impl Encode for PollTracker {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.action.to_le_bytes());
        out.extend_from_slice(&self.result.to_le_bytes());
        self.unchanged.encode(out);
    }
}

/// The used entries only, in detector order (`sparse_episodes`).
impl Encode for Episodes {
    fn encode(&self, out: &mut Vec<u8>) {
        len(out, self.used().count());
        for (index, episode) in self.used() {
            index.encode(out);
            episode.encode(out);
        }
    }
}

impl Encode for Episode {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        self.number.encode(out);
        self.emitted.encode(out);
        out.extend_from_slice(&self.subject.to_le_bytes());
        self.warned_at_step.encode(out);
    }
}

impl Encode for FindingCounts {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        self.detector.encode(out);
        self.counts.encode(out);
    }
}

impl Encode for Termination {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        self.detector.encode(out);
        self.at_ms.encode(out);
        self.shadow.encode(out);
    }
}

/// A unit variant: its index.
impl Encode for DetectorKind {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        varint(out, self.index() as u64);
    }
}

// The detectors' own states (`Detector::State`) beyond integers and arrays.

impl Encode for Wasted {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.bits.to_le_bytes());
    }
}

impl Encode for Answers {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        self.streak.encode(out);
        self.turn_had_results.encode(out);
        self.turn_all_seen.encode(out);
    }
}

impl Encode for Progress {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        self.best.encode(out);
        self.stale.encode(out);
    }
}

impl Encode for Turns {
    fn encode(&self, out: &mut Vec<u8>) {
        self.streak.encode(out);
        self.stale.encode(out);
        self.sketches.encode(out);
        ring(out, &self.openings, u64::to_le_bytes);
        self.since_text.encode(out);
    }
}

/// Its hashes as a sequence of 4-byte little-endian values, then whether it is complete.
impl Encode for TextSketch {
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) {
        let mins = self.mins();
        len(out, mins.len());
        fixed_items(out, mins, u32::to_le_bytes);
        self.complete.encode(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::detectors::{DetectorStates, DETECTOR_COUNT};
    use crate::engine::trajectory::Gained;
    use proptest::collection::{vec, vec_deque};
    use proptest::prelude::*;

    fn label() -> impl Strategy<Value = Option<String>> {
        proptest::option::of("\\PC{0,70}")
    }

    /// The same items, stored wrapped round the ring's buffer (in two parts) when `wrap`,
    /// as a ring that has dropped items off its front holds them (a writer must join
    /// both parts, in order); else in one part, as a ring that never dropped any.
    fn wrapped<T: Copy>(items: VecDeque<T>, wrap: bool) -> VecDeque<T> {
        let Some(&first) = items.front().filter(|_| wrap) else {
            return items;
        };
        let mut ring = VecDeque::with_capacity(items.len());
        let shift = ring.capacity() - items.len().div_ceil(2);
        for _ in 0..shift {
            ring.push_back(first);
            ring.pop_front();
        }
        ring.extend(items);
        assert!(
            ring.len() < 2 || !ring.as_slices().1.is_empty(),
            "a ring of {} items is stored in one part",
            ring.len()
        );
        ring
    }

    fn counters() -> impl Strategy<Value = Counters> {
        (
            (
                any::<u64>(),
                any::<u64>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
            ),
            (
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
            ),
            (any::<u64>(), any::<u64>(), any::<f64>(), any::<bool>()),
            (any::<Option<u32>>(), any::<u64>(), any::<u64>()),
        )
            .prop_map(|(a, b, c, d)| Counters {
                events: a.0,
                steps: a.1,
                tool_calls_asked: a.2,
                calls_since_turn: a.3,
                most_calls_per_turn: a.4,
                llm_calls: b.0,
                turns: b.1,
                tool_calls: b.2,
                input_tokens: b.3,
                output_tokens: b.4,
                cache_read_tokens: c.0,
                cache_write_tokens: c.1,
                cost_usd: c.2,
                has_cost: c.3,
                max_depth: d.0,
                duplicates: d.1,
                dropped_after_termination: d.2,
            })
    }

    fn run() -> impl Strategy<Value = RunState> {
        let call = (any::<u64>(), any::<u64>(), any::<u32>(), any::<u8>()).prop_map(
            |(action, result, shape, flags)| CallRecord {
                action,
                result,
                shape,
                flags,
            },
        );
        let poll =
            (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(action, result, unchanged)| {
                PollTracker {
                    action,
                    result,
                    unchanged,
                }
            });
        (
            vec_deque(call, 0..=30),
            vec(poll, 0..=4),
            any::<Option<u8>>(),
            vec_deque(any::<u64>(), 0..=32),
            vec_deque(any::<u16>(), 0..=128),
            any::<[bool; 3]>(),
        )
            .prop_map(
                |(window, polls, since_poll_moved, seen_pairs, seen_lines, wrap)| RunState {
                    window: wrapped(window, wrap[0]),
                    polls,
                    since_poll_moved,
                    seen_pairs: wrapped(seen_pairs, wrap[1]),
                    seen_lines: wrapped(seen_lines, wrap[2]),
                    window_gained: Gained::WHOLE,
                    pairs_gained: Gained::WHOLE,
                },
            )
    }

    /// What every detector's counters are set from.
    #[derive(Debug)]
    struct DetectorInputs {
        /// The plain counters, in turn.
        small: Vec<u32>,
        cycle: [u32; 10],
        bits: u64,
        answers: (u32, bool, bool),
        progress: (Option<f64>, u32),
        /// Texts whose sketches `similar_turns` keeps.
        texts: Vec<String>,
        openings: Vec<u64>,
        since_text: u8,
    }

    prop_compose! {
        fn detector_inputs()(
            small in vec(any::<u32>(), 1..12),
            cycle in any::<[u32; 10]>(),
            bits in any::<u64>(),
            answers in any::<(u32, bool, bool)>(),
            progress in any::<(Option<f64>, u32)>(),
            texts in vec("[a-z ]{0,200}", 0..=5),
            openings in vec(any::<u64>(), 0..=5),
            since_text in any::<u8>(),
        ) -> DetectorInputs {
            DetectorInputs { small, cycle, bits, answers, progress, texts, openings, since_text }
        }
    }

    /// Every detector's counters set from `d`: listed whole, so that a detector added
    /// with counters does not compile here until the test sets them.
    fn detector_states(d: &DetectorInputs) -> DetectorStates {
        let mut n = d.small.iter().copied().cycle();
        let mut next = || n.next().unwrap_or_default();
        DetectorStates {
            turn_cap: (),
            tool_call_cap: (),
            token_cap: (),
            cost_cap: (),
            wall_clock_cap: (),
            repeat: next(),
            generic_repeat: (),
            poll_no_progress: (),
            ping_pong: next(),
            cycle: d.cycle,
            error_repeat: next(),
            unknown_tool: next(),
            error_streak: next(),
            circuit_breaker: Wasted { bits: d.bits },
            stall: next(),
            similar_turns: Turns {
                streak: next(),
                stale: next(),
                sketches: d.texts.iter().map(|t| TextSketch::of(t)).collect(),
                openings: d.openings.iter().copied().collect(),
                since_text: d.since_text,
                sketches_gained: Gained::WHOLE,
                openings_gained: Gained::WHOLE,
            },
            repetitive_text: (),
            low_novelty: (),
            no_progress: Progress {
                best: d.progress.0,
                stale: d.progress.1,
            },
            no_new_information: Answers {
                streak: d.answers.0,
                turn_had_results: d.answers.1,
                turn_all_seen: d.answers.2,
            },
            compaction_loop: next(),
            write_no_effect: (),
            token_ratio: (),
            depth_cap: (),
            same_error: next(),
        }
    }

    prop_compose! {
        fn state()(
            labels in (label(), label(), label()),
            times in (any::<i64>(), any::<i64>(), any::<i64>()),
            stats in counters(),
            tools in vec(("\\PC{0,45}", any::<u64>(), any::<u64>()), 0..=9),
            run in run(),
            detectors in detector_inputs(),
            recent in vec_deque(any::<u64>(), 0..=16),
            wrap in any::<[bool; 2]>(),
            episodes in vec((0..DETECTOR_COUNT, any::<(u32, u8, u64, Option<u32>)>()), 0..8),
            findings in vec(any::<(u8, [u32; 3])>(), 0..8),
            termination in proptest::option::of((0..DETECTOR_COUNT, any::<i64>(), any::<bool>())),
        ) -> SessionState {
            // Listed whole (no `..Default::default()`): a new field does not compile here
            // until the test sets it.
            let mut s = SessionState {
                run_id: labels.0,
                agent_id: labels.1,
                tenant: labels.2,
                first_event_ms: times.0,
                last_event_ms: times.1,
                last_arrival_ms: times.2,
                stats,
                tools: tools
                    .into_iter()
                    .map(|(tool, calls, repeats)| ToolCount { tool, calls, repeats })
                    .collect(),
                run,
                recent_event_ids: wrapped(recent, wrap[0]),
                ids_gained: Gained::WHOLE,
                findings: findings
                    .into_iter()
                    .map(|(detector, counts)| FindingCounts { detector, counts })
                    .collect(),
                termination: termination.map(|(d, at_ms, shadow)| Termination {
                    detector: DetectorKind::ALL[d],
                    at_ms,
                    shadow,
                }),
                counters: detector_states(&detectors),
                episodes: Episodes::default(),
            };
            let openings = &mut s.counters.similar_turns.openings;
            *openings = wrapped(std::mem::take(openings), wrap[1]);
            for (d, (number, emitted, subject, warned_at_step)) in episodes {
                *s.episodes.get_mut(DetectorKind::ALL[d]) = Episode {
                    number,
                    emitted,
                    subject,
                    warned_at_step,
                };
            }
            s
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The writer's bytes are postcard's, for any state.
        #[test]
        fn writes_what_postcard_writes(s in state()) {
            let ours = s.to_bytes_with(&mut Vec::new());
            let postcard = postcard::to_allocvec(&s).unwrap();
            prop_assert_eq!(ours, postcard);
        }
    }

    /// Each length of a varint, at its bounds, and signed values zigzagged.
    #[test]
    fn varints_at_their_bounds() {
        for shift in 0..64 {
            for v in [1u64 << shift, (1u64 << shift) - 1, !0u64 >> shift] {
                let mut ours = Vec::new();
                v.encode(&mut ours);
                assert_eq!(ours, postcard::to_allocvec(&v).unwrap(), "{v}");
                let signed = v as i64;
                let mut ours = Vec::new();
                signed.encode(&mut ours);
                assert_eq!(ours, postcard::to_allocvec(&signed).unwrap(), "{signed}");
                let narrow = v as u32;
                let mut ours = Vec::new();
                narrow.encode(&mut ours);
                assert_eq!(ours, postcard::to_allocvec(&narrow).unwrap(), "{narrow}");
            }
        }
    }
}

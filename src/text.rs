//! Features of an assistant text, computed once per LLM call and then the text is
//! dropped: a bottom-k token sketch for `similar_turns` and the "chanting" test of
//! `repetitive_text`.
//!
//! Guarantees: the sketch is fixed-size (it estimates Jaccard similarity, exactly for
//! texts of up to [`SKETCH_K`] distinct tokens); the chant test is linear in the text's
//! length, allocates nothing once its scratch space has grown, and never keeps the text.

use serde::{Deserialize, Serialize};

use crate::hash::token_hash;

/// Token hashes kept per sketch.
pub const SKETCH_K: usize = 16;

/// A bottom-k sketch of a text's lowercased whitespace tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextSketch {
    /// The smallest distinct token hashes, ascending.
    #[serde(with = "crate::state::fixed_u32_vec")]
    pub mins: Vec<u32>,
    /// All distinct tokens are in `mins` (so similarity is exact).
    pub complete: bool,
}

impl TextSketch {
    pub fn of(text: &str) -> TextSketch {
        let mut mins: Vec<u32> = Vec::with_capacity(SKETCH_K + 1);
        let mut overflowed = false;
        for token in text.as_bytes().split(|b| b.is_ascii_whitespace()) {
            if token.is_empty() {
                continue;
            }
            let h = token_hash(token);
            if mins.len() == SKETCH_K && h > *mins.last().unwrap() {
                overflowed = true;
                continue;
            }
            if let Err(pos) = mins.binary_search(&h) {
                mins.insert(pos, h);
                if mins.len() > SKETCH_K {
                    mins.pop();
                    overflowed = true;
                }
            }
        }
        TextSketch {
            mins,
            complete: !overflowed,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.mins.is_empty()
    }

    /// Estimated Jaccard similarity of the two token sets.
    pub fn similarity(&self, other: &TextSketch) -> f64 {
        if self.mins.is_empty() && other.mins.is_empty() {
            return 1.0;
        }
        let (a, b) = (&self.mins, &other.mins);
        let exact = self.complete && other.complete;
        let limit = if exact { usize::MAX } else { SKETCH_K };
        let (mut i, mut j, mut union, mut common) = (0, 0, 0usize, 0usize);
        // Walk the merged order: the first k of the union, and which of them both hold.
        while union < limit && (i < a.len() || j < b.len()) {
            match (a.get(i), b.get(j)) {
                (Some(x), Some(y)) if x == y => {
                    common += 1;
                    i += 1;
                    j += 1;
                }
                (Some(x), Some(y)) if x < y => i += 1,
                (Some(_), Some(_)) => j += 1,
                (Some(_), None) => {
                    if !other.complete {
                        break; // beyond what `other` can tell us
                    }
                    i += 1
                }
                (None, Some(_)) => {
                    if !self.complete {
                        break;
                    }
                    j += 1
                }
                (None, None) => break,
            }
            union += 1;
        }
        if union == 0 {
            0.0
        } else {
            common as f64 / union as f64
        }
    }
}

/// Evidence that one text chants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chant {
    /// How often the repeated window occurred (at least the configured minimum).
    pub repeats: u32,
    /// Average distance between the last `min_repeats` occurrences, in bytes.
    pub avg_spacing: f64,
    /// The repeated window's length in bytes.
    pub chunk: usize,
}

/// Reusable buffers for [`find_chant`].
#[derive(Debug, Default)]
pub struct ChantScratch {
    filtered: Vec<u8>,
    prev: Vec<u32>,
    slots: Vec<Slot>,
    generation: u32,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    generation: u32,
    key: u64,
    last: u32,
    count: u32,
}

const NONE: u32 = u32::MAX;

fn is_divider(line: &str) -> bool {
    let mut chars = line.chars().filter(|c| !c.is_whitespace());
    let Some(first) = chars.next() else {
        return false;
    };
    !first.is_alphanumeric() && chars.all(|c| c == first)
}

fn is_structural(trimmed: &str) -> bool {
    let b = trimmed.as_bytes();
    match b.first() {
        None => false,
        Some(b'|' | b'#' | b'>') => true,
        Some(b'-' | b'*' | b'+') if b.get(1).is_none_or(|c| *c == b' ') => true,
        Some(c) if c.is_ascii_digit() => {
            let digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
            matches!(b.get(digits), Some(b'.' | b')'))
                && b.get(digits + 1).is_none_or(|c| *c == b' ')
        }
        _ => is_divider(trimmed),
    }
}

/// Copies the prose of `text` into `out`, skipping fenced code, tables, list items,
/// headings, quotes and divider lines: their regularity is layout, not a loop.
fn prose(text: &str, out: &mut Vec<u8>) {
    out.clear();
    let mut in_fence = false;
    for line in text.split('\n') {
        let trimmed = line.trim();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence || is_structural(trimmed) {
            continue;
        }
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
}

/// Looks for a `chunk`-byte window that occurs at least `min_repeats` times with its last
/// `min_repeats` occurrences at most `max_spacing` bytes apart on average.
pub fn find_chant(
    text: &str,
    chunk: usize,
    min_repeats: u32,
    max_spacing: usize,
    scratch: &mut ChantScratch,
) -> Option<Chant> {
    let min_repeats = min_repeats.max(2);
    // The shortest chanting text: the window plus one byte per further repeat.
    if text.len() < chunk + min_repeats as usize - 1 || chunk == 0 {
        return None;
    }
    let ChantScratch {
        filtered,
        prev,
        slots,
        generation,
    } = scratch;
    prose(text, filtered);
    let s = filtered.as_slice();
    if s.len() < chunk + min_repeats as usize - 1 || s.len() > u32::MAX as usize / 2 {
        return None;
    }
    let windows = s.len() - chunk + 1;
    let cap = (windows * 2).next_power_of_two().max(64);
    if slots.len() < cap {
        slots.resize(cap, Slot::default());
    }
    *generation = generation.wrapping_add(1);
    if *generation == 0 {
        slots.iter_mut().for_each(|sl| sl.generation = 0);
        *generation = 1;
    }
    let generation = *generation;
    prev.clear();
    prev.resize(windows, NONE);
    let mask = cap - 1;

    const B: u64 = 0x100_0000_01b3;
    let mut pow = 1u64;
    for _ in 1..chunk {
        pow = pow.wrapping_mul(B);
    }
    let mut h = 0u64;
    for &c in &s[..chunk] {
        h = h.wrapping_mul(B).wrapping_add(c as u64 + 1);
    }
    for i in 0..windows {
        if i > 0 {
            h = h
                .wrapping_sub((s[i - 1] as u64 + 1).wrapping_mul(pow))
                .wrapping_mul(B)
                .wrapping_add(s[i + chunk - 1] as u64 + 1);
        }
        let key = h ^ (h >> 31);
        let mut idx = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & mask;
        loop {
            let slot = &mut slots[idx];
            if slot.generation != generation {
                *slot = Slot {
                    generation,
                    key,
                    last: i as u32,
                    count: 1,
                };
                break;
            }
            if slot.key == key {
                prev[i] = slot.last;
                slot.last = i as u32;
                slot.count += 1;
                if slot.count >= min_repeats {
                    // Walk back to the occurrence `min_repeats - 1` before this one.
                    let mut first = i as u32;
                    for _ in 0..min_repeats - 1 {
                        first = prev[first as usize];
                    }
                    let avg = (i as u32 - first) as f64 / (min_repeats - 1) as f64;
                    let (a, b) = (first as usize, i);
                    if avg <= max_spacing as f64 && s[a..a + chunk] == s[b..b + chunk] {
                        return Some(Chant {
                            repeats: slot.count,
                            avg_spacing: avg,
                            chunk,
                        });
                    }
                }
                break;
            }
            idx = (idx + 1) & mask;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chant(text: &str) -> Option<Chant> {
        find_chant(text, 50, 10, 250, &mut ChantScratch::default())
    }

    #[test]
    fn identical_short_texts_are_fully_similar() {
        let a = TextSketch::of("I'm doing well, thanks for asking.");
        assert!(a.complete);
        assert_eq!(a.similarity(&a.clone()), 1.0);
    }

    #[test]
    fn similarity_is_exact_for_small_texts_and_case_insensitive() {
        let a = TextSketch::of("step 1 inspecting module one");
        let b = TextSketch::of("STEP 2 inspecting module one");
        // {step,1,inspecting,module,one} vs {step,2,...}: 4 shared of 6.
        assert!((a.similarity(&b) - 4.0 / 6.0).abs() < 1e-9);
    }

    #[test]
    fn similarity_estimate_tracks_large_texts() {
        let base: Vec<String> = (0..200).map(|i| format!("w{i}")).collect();
        let a = TextSketch::of(&base.join(" "));
        let mut other = base.clone();
        other.truncate(180);
        other.extend((0..20).map(|i| format!("x{i}")));
        let b = TextSketch::of(&other.join(" "));
        assert!(!a.complete);
        let s = a.similarity(&b);
        assert!(s > 0.5 && s < 1.0, "{s}");
        let far = TextSketch::of(
            &(0..200)
                .map(|i| format!("z{i}"))
                .collect::<Vec<_>>()
                .join(" "),
        );
        assert!(a.similarity(&far) < 0.2);
    }

    #[test]
    fn chanting_is_found() {
        let text = "Let me reconsider the approach. ".repeat(40);
        let c = chant(&text).expect("chant");
        assert!(c.repeats >= 10);
        assert!(c.avg_spacing <= 250.0);
    }

    #[test]
    fn nine_repeats_are_not_enough() {
        let unit = "This exact sentence repeats here exactly, twice over!! ";
        assert!(unit.len() >= 50);
        let text = format!(
            "{}{}",
            unit.repeat(9),
            "and then something else entirely different happens in the end."
        );
        assert_eq!(chant(&text), None);
        let ten = unit.repeat(11);
        assert!(chant(&ten).is_some());
    }

    #[test]
    fn far_apart_repeats_are_not_chanting() {
        // Filler that never repeats itself: 300 bytes of counting words per gap.
        let text: String = (0..12)
            .map(|i| {
                let filler: String = (0..60).map(|j| format!("{:04} ", i * 100 + j)).collect();
                format!("The same sentence shows up here again and again. {filler}")
            })
            .collect();
        assert_eq!(chant(&text), None);
    }

    #[test]
    fn layout_is_skipped() {
        let divider = "-".repeat(80);
        let text = format!("{}\n", divider).repeat(20);
        assert_eq!(chant(&text), None);
        let table = "| col a | col b | col c | col d | col e | col f | g |\n".repeat(20);
        assert_eq!(chant(&table), None);
        let code = format!(
            "```\n{}```\n",
            "print('hello world, this is a long line of code!!')\n".repeat(20)
        );
        assert_eq!(chant(&code), None);
        let list = "- item that looks the same in every single line here\n".repeat(20);
        assert_eq!(chant(&list), None);
    }
}

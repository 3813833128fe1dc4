//! Features of an assistant text, computed once per LLM call and then the text is
//! dropped: a bottom-k token sketch for `similar_turns` and the "chanting" test of
//! `repetitive_text`.
//!
//! Guarantees: the sketch is fixed-size (it estimates Jaccard similarity, exactly for
//! texts of up to [`SKETCH_K`] distinct tokens); the chant test is linear in the text's
//! length, allocates nothing once its scratch space has grown, and never keeps the text.

use serde::{Deserialize, Serialize};

use crate::contract::classes::{whitespace, Block, BLOCK};
use crate::engine::hash::{each_token_hash, each_token_hash_and_space};

/// Token hashes kept per sketch.
pub const SKETCH_K: usize = 16;

/// A bottom-k sketch of a text's lowercased whitespace tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextSketch {
    /// The smallest distinct token hashes, ascending.
    mins: Mins,
    /// All distinct tokens are in `mins` (so similarity is exact).
    pub complete: bool,
}

/// Up to [`SKETCH_K`] hashes, ascending, inline (no allocation per sketch). Stored as a
/// sequence of 4-byte little-endian values. The places past `len` hold `u32::MAX`, so that
/// an insertion can compare the whole array at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mins {
    vals: [u32; SKETCH_K],
    len: u8,
}

impl Default for Mins {
    fn default() -> Mins {
        Mins {
            vals: [u32::MAX; SKETCH_K],
            len: 0,
        }
    }
}

impl Mins {
    fn as_slice(&self) -> &[u32] {
        &self.vals[..self.len as usize]
    }

    /// Inserts `h` in order unless present; drops the largest past capacity. Returns
    /// whether a value was dropped or refused for lack of room.
    #[inline]
    fn insert(&mut self, h: u32) -> bool {
        #[cfg(target_arch = "x86_64")]
        if h != u32::MAX {
            // SAFETY: SSE2 is part of the x86_64 baseline.
            return unsafe { sse2_insert(self, h) };
        }
        self.insert_by_places(h)
    }

    /// [`Mins::insert`] place by place (the definition; `u32::MAX`, and other targets).
    fn insert_by_places(&mut self, h: u32) -> bool {
        let len = self.len as usize;
        let pos = self.as_slice().iter().take_while(|&&v| v < h).count();
        if self.vals.get(pos) == Some(&h) && pos < len {
            return false;
        }
        let full = len == SKETCH_K;
        if full && pos == SKETCH_K {
            return true;
        }
        let last = if full { SKETCH_K - 1 } else { len };
        self.vals.copy_within(pos..last, pos + 1);
        self.vals[pos] = h;
        self.len += u8::from(!full);
        full
    }
}

/// [`Mins::insert`] for `h < u32::MAX` on four lanes at a time: the array is compared with
/// `h` at once, and everything from `h`'s place on moves up one lane (the array shifted
/// by one lane, where it is not below `h`, is `max(shifted, h)`: `h` at its place, the
/// shifted values above it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn sse2_insert(m: &mut Mins, h: u32) -> bool {
    use core::arch::x86_64::*;
    // Unsigned order through signed compares: both sides with the top bit flipped.
    let bias = _mm_set1_epi32(i32::MIN);
    let hv = _mm_set1_epi32(h as i32);
    let hb = _mm_xor_si128(hv, bias);
    let ptr = m.vals.as_mut_ptr() as *mut __m128i;
    // SAFETY: `vals` is 16 `u32`s, four 16-byte lanes; `loadu`/`storeu` need no alignment.
    let v: [__m128i; 4] = std::array::from_fn(|k| unsafe { _mm_loadu_si128(ptr.add(k)) });
    let mut below = [_mm_setzero_si128(); 4];
    let (mut places, mut equal) = (0u32, 0i32);
    for k in 0..4 {
        below[k] = _mm_cmpgt_epi32(hb, _mm_xor_si128(v[k], bias));
        places += (_mm_movemask_epi8(below[k]) as u32).count_ones() / 4;
        equal |= _mm_movemask_epi8(_mm_cmpeq_epi32(v[k], hv));
    }
    // Unused places hold u32::MAX, never below `h` nor equal to it.
    if equal != 0 {
        return false;
    }
    let full = m.len as usize == SKETCH_K;
    if full && places as usize == SKETCH_K {
        return true;
    }
    for k in (0..4).rev() {
        let carried = if k == 0 {
            _mm_setzero_si128()
        } else {
            _mm_srli_si128(v[k - 1], 12)
        };
        let shifted = _mm_or_si128(_mm_slli_si128(v[k], 4), carried);
        let above = _mm_cmpgt_epi32(_mm_xor_si128(shifted, bias), hb);
        let moved = _mm_or_si128(_mm_and_si128(above, shifted), _mm_andnot_si128(above, hv));
        let new = _mm_or_si128(
            _mm_and_si128(below[k], v[k]),
            _mm_andnot_si128(below[k], moved),
        );
        // SAFETY: as above.
        unsafe { _mm_storeu_si128(ptr.add(k), new) };
    }
    m.len += u8::from(!full);
    full
}

impl Serialize for Mins {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.len as usize))?;
        for v in self.as_slice() {
            seq.serialize_element(&v.to_le_bytes())?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for Mins {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Mins, D::Error> {
        let stored = Vec::<[u8; 4]>::deserialize(d)?;
        let mut m = Mins::default();
        for b in stored.iter().take(SKETCH_K) {
            m.vals[m.len as usize] = u32::from_le_bytes(*b);
            m.len += 1;
        }
        Ok(m)
    }
}

/// A sketch being built, token by token.
#[derive(Default)]
struct Sketching {
    mins: Mins,
    overflowed: bool,
}

impl Sketching {
    #[inline]
    fn token(&mut self, h: u32) {
        if self.mins.len as usize == SKETCH_K && h > self.mins.vals[SKETCH_K - 1] {
            self.overflowed = true;
            return;
        }
        self.overflowed |= self.mins.insert(h);
    }

    fn finish(self) -> TextSketch {
        TextSketch {
            mins: self.mins,
            complete: !self.overflowed,
        }
    }
}

impl TextSketch {
    pub fn of(text: &str) -> TextSketch {
        let mut sketch = Sketching::default();
        each_token_hash(text.as_bytes(), |h| sketch.token(h));
        sketch.finish()
    }

    /// The smallest distinct token hashes, ascending.
    pub fn mins(&self) -> &[u32] {
        self.mins.as_slice()
    }

    pub fn is_empty(&self) -> bool {
        self.mins.len == 0
    }

    /// Estimated Jaccard similarity of the two token sets.
    pub fn similarity(&self, other: &TextSketch) -> f64 {
        self.walk(other, None)
    }

    /// Whether [`TextSketch::similarity`] is at least `min`, exactly, but the walk stops
    /// as soon as too few of the first k can be shared to reach it (most turns compared
    /// are unlike, and that shows within a few steps).
    pub fn similar_at_least(&self, other: &TextSketch, min: f64) -> bool {
        self.walk(other, Some(min)) >= min
    }

    /// The similarity, or with `stop_below`, any value below it as soon as the estimate
    /// cannot reach it: of the first k of the union, at most `k - union + common` can be
    /// shared, and the estimate is at most that over k (so `common / union`, rounded, is
    /// at most it rounded: rounding keeps the order).
    fn walk(&self, other: &TextSketch, stop_below: Option<f64>) -> f64 {
        if self.is_empty() && other.is_empty() {
            return 1.0;
        }
        let (a, b) = (self.mins(), other.mins());
        let exact = self.complete && other.complete;
        let limit = if exact { usize::MAX } else { SKETCH_K };
        // Past its end a list reads as a value above any hash.
        const END: u64 = 1 << 32;
        let at = |list: &[u32], k: usize| list.get(k).map_or(END, |&v| u64::from(v));
        let (mut i, mut j, mut union, mut common) = (0, 0, 0usize, 0usize);
        // Walk the merged order: the first k of the union, and which of them both hold.
        // Each step without branches on the values (they are random: no predictor wins).
        while union < limit {
            let (x, y) = (at(a, i), at(b, j));
            // A list that has ended says nothing of what lies beyond unless its sketch is
            // complete.
            if (x == END && (y == END || !self.complete)) || (y == END && !other.complete) {
                break;
            }
            let (same, below) = (x == y, x < y);
            common += usize::from(same);
            i += usize::from(same | below);
            j += usize::from(!below);
            union += 1;
            if let Some(min) = stop_below.filter(|_| !exact) {
                let best = (SKETCH_K - union + common) as f64 / SKETCH_K as f64;
                if best < min {
                    return best;
                }
            }
        }
        if union == 0 {
            0.0
        } else {
            common as f64 / union as f64
        }
    }
}

/// How a text opens: a digest of its first `words` words (runs of letters and digits,
/// lowercased; markup and punctuation between them do not count), or `None` when it has
/// fewer. An agent that opens every turn with the same apology or restatement while the
/// rest of the text varies shows it here, where the whole text's similarity does not.
pub fn opening(text: &str, words: usize) -> Option<u64> {
    if words == 0 {
        return None;
    }
    // FNV-1a over the words, a separator between them: stable across builds and
    // platforms (it is stored), and the opening is short.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    let (mut seen, mut in_word) = (0, false);
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        // ASCII byte by byte (as a char it reads the same); other chars whole.
        let wide =
            (!bytes[at].is_ascii()).then(|| text[at..].chars().next().expect("at a char boundary"));
        let (alphanumeric, len) = match wide {
            None => (bytes[at].is_ascii_alphanumeric(), 1),
            Some(c) => (c.is_alphanumeric(), c.len_utf8()),
        };
        if !alphanumeric {
            in_word = false;
            at += len;
            continue;
        }
        if !in_word {
            if seen == words {
                break;
            }
            seen += 1;
            in_word = true;
            mix(b' ');
        }
        match wide {
            None => mix(bytes[at].to_ascii_lowercase()),
            Some(c) => {
                for l in c.to_lowercase() {
                    let mut buf = [0u8; 4];
                    l.encode_utf8(&mut buf).bytes().for_each(&mut mix);
                }
            }
        }
        at += len;
    }
    (seen == words).then_some(h.max(1))
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
    grams: Vec<u8>,
    prev: Vec<u32>,
    slots: Vec<Slot>,
    generation: u32,
}

/// The most the chant search's buffers keep between texts. They grow with the text
/// searched (the search's table: ~50 bytes a byte of prose), and an engine lives as long
/// as its partition: one 1 MiB reply would otherwise hold ~50 MiB for good. Texts of up
/// to ~128 KiB of prose keep theirs (the table reused without clearing, by generation).
pub const CHANT_SCRATCH_KEPT_BYTES: usize = 8 << 20;

impl ChantScratch {
    /// Lets go of its buffers once they hold more than [`CHANT_SCRATCH_KEPT_BYTES`].
    pub fn trim(&mut self) {
        if self.held_bytes() > CHANT_SCRATCH_KEPT_BYTES {
            *self = ChantScratch {
                generation: self.generation,
                ..ChantScratch::default()
            };
        }
    }

    /// The bytes its buffers hold.
    pub fn held_bytes(&self) -> usize {
        self.filtered.capacity()
            + self.grams.capacity()
            + self.prev.capacity() * std::mem::size_of::<u32>()
            + self.slots.capacity() * std::mem::size_of::<Slot>()
    }
}

/// Whether some 8-byte sequence of `s` may recur `times` times: counts per hash bucket
/// (a bucket counts at least every sequence in it, so "no" is certain). A window that
/// recurs `times` times has an 8-byte prefix that does, so a text for which this says no
/// cannot chant.
fn some_gram_may_recur(s: &[u8], times: u32, table: &mut Vec<u8>) -> bool {
    if s.len() < 8 {
        return true;
    }
    let bits = bucket_bits(s.len());
    table.clear();
    table.resize(1 << bits, 0);
    let limit = times.min(255) as u8;
    (0..=s.len() - 8).any(|i| count_gram(table, bits, load8(s, i), limit))
}

/// [`some_gram_may_recur`] for most texts at a sixth of the cost: only the 8-byte grams
/// that start a word (right after ASCII whitespace) are counted. A `chunk`-byte window
/// with whitespace among its first `chunk - 8` bytes has such a gram inside it, the same
/// one in each of its occurrences, so when it recurs `times` times that gram does too;
/// "no" stays certain. A text with a run of `chunk - 8` bytes without whitespace may hide
/// a window without one (a base64 blob, a long path): it gets the full count.
fn word_gram_may_recur(s: &[u8], chunk: usize, times: u32, table: &mut Vec<u8>) -> bool {
    if chunk < 9 {
        return some_gram_may_recur(s, times, table);
    }
    if s.len() < 8 {
        return true;
    }
    let reach = chunk - 8;
    let bits = bucket_bits(s.len() / 4);
    table.clear();
    table.resize(1 << bits, 0);
    let limit = times.min(255) as u8;
    // The last position a gram can start at, and the end of the previous whitespace run.
    let last_start = s.len() - 8;
    let mut prev_space: Option<usize> = None;
    let mut longest_run = 0usize;
    let mut word_start = |space: usize, prev: &mut Option<usize>, run: &mut usize| -> bool {
        *run = (*run).max(space - prev.map_or(0, |p| p + 1));
        *prev = Some(space);
        let at = space + 1;
        at <= last_start && count_gram(table, bits, load8(s, at), limit)
    };
    let mut pad = [0; BLOCK];
    let mut at = 0;
    while at < s.len() {
        let block = Block::at(s, at, &mut pad);
        let mut ws = whitespace(block.bytes) & block.valid;
        while ws != 0 {
            let space = at + ws.trailing_zeros() as usize;
            if word_start(space, &mut prev_space, &mut longest_run) {
                return true;
            }
            ws &= ws - 1;
        }
        at += BLOCK;
    }
    longest_run = longest_run.max(s.len() - prev_space.map_or(0, |p| p + 1));
    longest_run >= reach && some_gram_may_recur(s, times, table)
}

/// [`word_gram_may_recur`] over a whole text before its prose is picked out, so that a
/// text that cannot chant costs neither the copy of its prose nor a second count. Each
/// gram is cut after its first line break (a missing last one read as there): a prose
/// line is a line of the text followed by a line break, so every gram the prose count
/// would find at a word start is found here too, at the same word start in the text
/// (one byte after whitespace there as well), with the same bytes. Counts here are at
/// least the prose's, and the text's longest run without whitespace at least the
/// prose's: "no" stays certain. Needs `chunk >= 9` (a gram of eight whole bytes fits
/// inside the window after its whitespace).
fn line_gram_may_recur(text: &[u8], chunk: usize, times: u32, table: &mut Vec<u8>) -> bool {
    let mut count = LineGrams::new(text, chunk, times, table);
    let mut pad = [0; BLOCK];
    let mut at = 0;
    while at < text.len() && !count.found {
        let block = Block::at(text, at, &mut pad);
        count.spaces(at, whitespace(block.bytes) & block.valid);
        at += BLOCK;
    }
    count.may_recur()
}

/// The count of [`line_gram_may_recur`], fed a block's whitespace at a time.
struct LineGrams<'a> {
    text: &'a [u8],
    table: &'a mut Vec<u8>,
    bits: u32,
    limit: u8,
    reach: usize,
    prev_space: Option<usize>,
    longest_run: usize,
    /// Some gram's bucket reached the limit (counting stops).
    found: bool,
}

impl<'a> LineGrams<'a> {
    fn new(text: &'a [u8], chunk: usize, times: u32, table: &'a mut Vec<u8>) -> LineGrams<'a> {
        debug_assert!(chunk >= 9);
        let bits = bucket_bits(text.len() / 4);
        table.clear();
        table.resize(1 << bits, 0);
        LineGrams {
            text,
            table,
            bits,
            limit: times.min(255) as u8,
            reach: chunk - 8,
            prev_space: None,
            longest_run: 0,
            found: false,
        }
    }

    /// The whitespace of the 64 bytes at `at` (bit `i`: `text[at + i]`).
    #[inline]
    fn spaces(&mut self, at: usize, mut ws: u64) {
        if self.found {
            return;
        }
        while ws != 0 {
            let space = at + ws.trailing_zeros() as usize;
            let run = space - self.prev_space.map_or(0, |p| p + 1);
            self.longest_run = self.longest_run.max(run);
            self.prev_space = Some(space);
            if count_gram(
                self.table,
                self.bits,
                line_gram(self.text, space + 1),
                self.limit,
            ) {
                self.found = true;
                return;
            }
            ws &= ws - 1;
        }
    }

    fn may_recur(&self) -> bool {
        let tail = self.text.len() - self.prev_space.map_or(0, |p| p + 1);
        self.found || self.longest_run.max(tail) >= self.reach
    }
}

/// The (up to) eight bytes of `s` from `at` (at most `s.len()`), cut after the first line
/// break, the end of the text reading as one; zeros past the cut.
#[inline]
fn line_gram(s: &[u8], at: usize) -> u64 {
    let w = match s.get(at..at + 8) {
        Some(word) => u64::from_le_bytes(word.try_into().expect("eight bytes")),
        None => {
            let rest = &s[at..];
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            buf[rest.len()] = b'\n'; // rest is shorter than eight bytes
            u64::from_le_bytes(buf)
        }
    };
    let breaks = crate::contract::json::bytes_equal(w, b'\n');
    if breaks == 0 {
        return w;
    }
    // Keep the bits up to the first break's high bit (which marks it), zero the rest.
    w & (u64::MAX >> (63 - breaks.trailing_zeros()))
}

fn bucket_bits(n: usize) -> u32 {
    n.next_power_of_two().clamp(256, 8192).trailing_zeros()
}

/// Counts one gram in its bucket; true once the bucket holds `limit`.
#[inline]
fn count_gram(table: &mut [u8], bits: u32, gram: u64, limit: u8) -> bool {
    let bucket = (gram.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize;
    let count = &mut table[bucket];
    *count = count.saturating_add(1);
    *count >= limit
}

#[inline]
fn load8(s: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(s[at..at + 8].try_into().expect("eight bytes"))
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

/// What chanting is: a `chunk`-byte window that occurs at least `min_repeats` times with
/// its last `min_repeats` occurrences at most `max_spacing` bytes apart on average.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChantRule {
    pub chunk: usize,
    pub min_repeats: u32,
    pub max_spacing: usize,
}

impl ChantRule {
    /// Fewer than two occurrences are no repeat.
    fn min_repeats(&self) -> u32 {
        self.min_repeats.max(2)
    }

    /// The shortest text that can chant: the window plus one byte per further repeat.
    fn fits(&self, len: usize) -> bool {
        self.chunk != 0 && len >= self.chunk + self.min_repeats() as usize - 1
    }
}

/// Looks for a window of `text` that chants by `rule`.
pub fn find_chant(text: &str, rule: ChantRule, scratch: &mut ChantScratch) -> Option<Chant> {
    if !rule.fits(text.len()) {
        return None;
    }
    let grams = &mut scratch.grams;
    let chant = if rule.chunk >= 9
        && !line_gram_may_recur(text.as_bytes(), rule.chunk, rule.min_repeats(), grams)
    {
        None
    } else {
        chant_in_prose(text, rule, scratch)
    };
    chant
}

/// A turn's text features in one pass over it: its sketch (when `sketch`) and whether it
/// chants ([`find_chant`]), the word-start grams counted off the same blocks the tokens
/// are found in.
pub fn turn_features(
    text: &str,
    sketch: bool,
    rule: ChantRule,
    scratch: &mut ChantScratch,
) -> (Option<TextSketch>, Option<Chant>) {
    if !(sketch && rule.fits(text.len()) && rule.chunk >= 9) {
        let s = sketch.then(|| TextSketch::of(text));
        return (s, find_chant(text, rule, scratch));
    }
    let bytes = text.as_bytes();
    let mut sketching = Sketching::default();
    let mut grams = LineGrams::new(bytes, rule.chunk, rule.min_repeats(), &mut scratch.grams);
    each_token_hash_and_space(bytes, |h| sketching.token(h), |at, ws| grams.spaces(at, ws));
    let chant = if grams.may_recur() {
        chant_in_prose(text, rule, scratch)
    } else {
        None
    };
    (Some(sketching.finish()), chant)
}

/// [`find_chant`] past the count over the whole text: the prose picked out, counted again
/// and searched.
fn chant_in_prose(text: &str, rule: ChantRule, scratch: &mut ChantScratch) -> Option<Chant> {
    let (chunk, min_repeats, max_spacing) = (rule.chunk, rule.min_repeats(), rule.max_spacing);
    let ChantScratch {
        filtered,
        grams,
        prev,
        slots,
        generation,
    } = scratch;
    prose(text, filtered);
    let s = filtered.as_slice();
    if !rule.fits(s.len()) || s.len() > u32::MAX as usize / 2 {
        return None;
    }
    if chunk >= 8 && !word_gram_may_recur(s, chunk, min_repeats, grams) {
        return None;
    }
    window_search(s, chunk, min_repeats, max_spacing, prev, slots, generation)
}

/// The exact search over prose bytes `s` (at least `chunk + min_repeats - 1` long): a
/// rolling hash of every window, the occurrences of each chained, the spacing checked
/// when one reaches `min_repeats`.
fn window_search(
    s: &[u8],
    chunk: usize,
    min_repeats: u32,
    max_spacing: usize,
    prev: &mut Vec<u32>,
    slots: &mut Vec<Slot>,
    generation: &mut u32,
) -> Option<Chant> {
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
mod tests;

//! Fast hashes for values that never leave the process's judgement: a result's "shape"
//! (its text with every number read as any number) and the tokens of a turn's text.
//! DESIGN §2's digests (actions, results) stay SHA-256; these only decide whether two
//! things are alike within one session, so they need to be fast and stable, not
//! cryptographic.
//!
//! Guarantees: a hash depends only on the bytes fed, never on how they were split into
//! calls (so a tree walk and a streaming pass over raw JSON agree); no allocation; the
//! algorithms are written out here, not borrowed from a crate whose output could change
//! with its version (the values live in stored session state).

use crate::contract::classes::{compact, digits_and_words, eq2, whitespace, Block, BLOCK};

/// The multiplier of FxHash: odd, with well-spread bits.
const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;

#[inline]
fn mix(h: u64, word: u64) -> u64 {
    (h.rotate_left(5) ^ word).wrapping_mul(K)
}

#[inline]
pub(crate) fn fold(h: u64) -> u32 {
    let h = h ^ (h >> 29);
    (h as u32) ^ ((h >> 32) as u32)
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// Lowercases the ASCII letters of eight bytes (other bytes unchanged).
#[inline]
pub(crate) fn lower8(x: u64) -> u64 {
    let low7 = x & !HI;
    let ge_a = low7 + (0x80 - b'A' as u64) * LO;
    let gt_z = low7 + (0x80 - b'Z' as u64 - 1) * LO;
    let upper = ge_a & !gt_z & !x & HI;
    x | (upper >> 2)
}

/// A streaming hash over a byte stream, eight bytes at a time.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WordHasher {
    h: u64,
    pending: u64,
    /// Bytes held in `pending` (0..8).
    held: u32,
    len: u64,
}

impl WordHasher {
    #[inline]
    pub(crate) fn byte(&mut self, b: u8) {
        self.pending |= (b as u64) << (8 * self.held);
        self.held += 1;
        self.len += 1;
        if self.held == 8 {
            self.h = mix(self.h, self.pending);
            self.pending = 0;
            self.held = 0;
        }
    }

    /// Eight bytes at once, `word` in little-endian order.
    #[inline]
    pub(crate) fn word(&mut self, word: u64) {
        self.len += 8;
        if self.held == 0 {
            self.h = mix(self.h, word);
        } else {
            let shift = 8 * self.held;
            self.h = mix(self.h, self.pending | (word << shift));
            self.pending = word >> (64 - shift);
        }
    }

    /// The low `n` bytes of `bytes` (n < 8; the bytes above them clear).
    #[inline]
    pub(crate) fn bytes(&mut self, bytes: u64, n: u32) {
        if n == 0 {
            return;
        }
        debug_assert!(n < 8 && bytes >> (8 * n) == 0, "{n} bytes of {bytes:#x}");
        self.len += n as u64;
        let shift = 8 * self.held;
        self.pending |= bytes << shift;
        let total = self.held + n;
        if total >= 8 {
            self.h = mix(self.h, self.pending);
            // The bytes that did not fit (shift > 0 here, since n < 8).
            self.pending = bytes >> (64 - shift);
            self.held = total - 8;
        } else {
            self.held = total;
        }
    }

    pub(crate) fn finish(mut self) -> u64 {
        if self.held > 0 {
            self.h = mix(self.h, self.pending);
        }
        mix(self.h, self.len)
    }
}

#[inline]
fn load8(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("eight bytes"))
}

/// The bytes of `b` (at most eight), little-endian, the rest of the word zero.
///
/// Read as two overlapping 4-byte loads (four bytes or more) or three single bytes (fewer),
/// each byte landing at its own place (an overlap ORs a byte with itself): a copy into a
/// zeroed word of `b.len()` bytes was a call to `memcpy` per line or token hashed, and
/// the word's load then waited on the copy's byte stores.
#[inline(always)]
fn load_short(b: &[u8]) -> u64 {
    let n = b.len();
    assert!(n <= 8, "load_short takes at most eight bytes");
    if n >= 4 {
        let head = u32::from_le_bytes(b[..4].try_into().expect("four bytes"));
        let tail = u32::from_le_bytes(b[n - 4..n].try_into().expect("four bytes"));
        u64::from(head) | u64::from(tail) << (8 * (n - 4))
    } else if n > 0 {
        u64::from(b[0])
            | u64::from(b[n / 2]) << (8 * (n / 2))
            | u64::from(b[n - 1]) << (8 * (n - 1))
    } else {
        0
    }
}

/// The shape of a text: every maximal run of ASCII digits that stands on its own counts
/// as one `0` — numbers are counters, line numbers and timings — while a run right after
/// a letter or `_` is part of a word and kept (`float32`, `utf8`, `x86_64`). Text is fed
/// as literal bytes ([`Shape::text`]) and escape sequences ([`Shape::escape`]), which
/// separate words (so `\n42` is a line break and a number, not the word `n42`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Shape {
    hasher: WordHasher,
    /// The previous literal byte continues a word (a letter or `_`), or is a digit.
    prev_word: bool,
    prev_digit: bool,
}

impl Shape {
    /// Literal bytes (no escape sequence inside).
    #[inline]
    pub fn text(&mut self, bytes: &[u8]) {
        let mut st = self.state();
        let mut pad = [0; BLOCK];
        let mut at = 0;
        while at < bytes.len() {
            let block = Block::at(bytes, at, &mut pad);
            let (digits, words) = digits_and_words(block.bytes);
            st.block(&block, digits, words);
            at += BLOCK;
        }
        self.keep(st);
    }

    /// Canonical JSON text: escape sequences (`\n`, `\u001f`) are hashed as they are
    /// written and separate words, the rest is literal.
    pub fn json(&mut self, canonical: &[u8]) {
        let mut st = self.state();
        // The bytes of an escape that runs on past the end of its block.
        let mut escape_carry = 0u64;
        let mut pad = [0; BLOCK];
        let mut at = 0;
        while at < canonical.len() {
            let block = Block::at(canonical, at, &mut pad);
            let (digits, words) = digits_and_words(block.bytes);
            let (backslashes, us) = eq2(block.bytes, b'\\', b'u');
            let (escapes, carry) =
                escapes_in(canonical, at, backslashes & block.valid, us, escape_carry);
            escape_carry = carry;
            // An escape's bytes are neither digits nor word bytes: kept as written, and
            // the byte after one starts afresh.
            st.block(&block, digits & !escapes, words & !escapes);
            at += BLOCK;
        }
        self.keep(st);
    }

    /// An escape sequence (as written in JSON, `\n`, `\u00e9`): hashed, and a separator.
    #[inline]
    pub fn escape(&mut self, esc: &[u8]) {
        for &b in esc {
            self.hasher.byte(b);
        }
        self.prev_word = false;
        self.prev_digit = false;
    }

    pub fn finish(self) -> u32 {
        fold(self.hasher.finish())
    }

    // The state in locals while a text is read: the loops must not go through memory.
    #[inline]
    fn state(&self) -> ShapeState {
        ShapeState {
            hasher: self.hasher,
            prev_word: self.prev_word,
            prev_digit: self.prev_digit,
        }
    }

    #[inline]
    fn keep(&mut self, st: ShapeState) {
        self.hasher = st.hasher;
        self.prev_word = st.prev_word;
        self.prev_digit = st.prev_digit;
    }
}

/// The bytes of the block of JSON text `s` at `at` that belong to escape sequences, and
/// those of the next block that do. `backslashes` and `us` mark the block's `\` (valid
/// bytes only) and `u` bytes, `carried` its bytes that an escape of the block before
/// covers. Read as a parser reads: a backslash starts an escape, `\u` and four more bytes
/// or two bytes in all. Found with mask arithmetic, not a walk from escape to escape
/// (every line break of a text result is one): in a run of backslashes they pair up, so a
/// run of odd length escapes the byte after it (simdjson's odd-run trick, with a carry
/// out of the block); an escaped `u` covers the four bytes after it. A block where a
/// backslash sits among those four bytes (never in valid JSON) is walked instead.
#[inline]
fn escapes_in(s: &[u8], at: usize, backslashes: u64, us: u64, carried: u64) -> (u64, u64) {
    let starting = backslashes & !carried;
    if starting == 0 {
        return (carried, 0);
    }
    const EVEN: u64 = 0x5555_5555_5555_5555;
    let follows = starting << 1;
    // Runs that start at an odd position, added to all runs: a run's sum carries out of
    // it, so a run starting at an even position keeps its bits and an odd one flips them.
    let odd_starts = starting & !EVEN & !follows;
    let (sums, out_of_block) = odd_starts.overflowing_add(starting);
    // The bytes a backslash escapes: at odd offsets within a run, and the byte after a
    // run of odd length.
    let escaped = (EVEN ^ (sums << 1)) & follows;
    let u_escapes = u128::from(escaped & us);
    let hex = (u_escapes << 1) | (u_escapes << 2) | (u_escapes << 3) | (u_escapes << 4);
    if hex as u64 & starting != 0 {
        return escapes_walked(s, at, backslashes, carried);
    }
    // The byte after the block is escaped (the block ends in a run of odd length): it
    // covers that byte, and four more when it is a `u`.
    let next = match (out_of_block, s.get(at + BLOCK)) {
        (false, _) => 0,
        (true, Some(b'u')) => 0b1_1111,
        (true, _) => 1,
    };
    (
        carried | starting | escaped | hex as u64,
        (hex >> 64) as u64 | next,
    )
}

/// [`escapes_in`], walked from escape to escape (its fallback, and what it is held to).
fn escapes_walked(s: &[u8], at: usize, backslashes: u64, carried: u64) -> (u64, u64) {
    let (mut escapes, mut carry) = (carried, 0u64);
    let mut starts = backslashes & !escapes;
    while starts != 0 {
        let p = starts.trailing_zeros() as usize;
        let len = if s.get(at + p + 1) == Some(&b'u') {
            6
        } else {
            2
        };
        let span = ((1u128 << len) - 1) << p;
        escapes |= span as u64;
        carry |= (span >> 64) as u64;
        starts &= !(span as u64);
    }
    (escapes, carry)
}

/// [`compact`] of `block`'s `kept` bytes, each byte of `zeros` written as `0` first (in
/// `block`): the first digit of a number standing on its own, which reads as any number.
/// The shape and the content sample's lines normalize text this way.
// Always inlined: left to the compiler, a content sample's line and a shape's block each
// paid a call here (+0.8 % instructions replaying a real-session file).
#[inline(always)]
pub(crate) fn compact_numbers(
    block: &mut [u8; BLOCK],
    mut zeros: u64,
    kept: u64,
    out: &mut [u8],
    at: usize,
) -> usize {
    while zeros != 0 {
        block[zeros.trailing_zeros() as usize] = b'0';
        zeros &= zeros - 1;
    }
    compact(block, kept, out, at)
}

struct ShapeState {
    hasher: WordHasher,
    prev_word: bool,
    prev_digit: bool,
}

impl ShapeState {
    /// One block, given its digits and word bytes: a number standing on its own (a run of
    /// digits not right after a word byte) becomes one `0`, the digits of words stay.
    #[inline]
    fn block(&mut self, block: &Block, digits: u64, words: u64) {
        let valid = block.valid;
        let (digits, words) = (digits & valid, words & valid);
        let (carry_digit, carry_word) = (u64::from(self.prev_digit), u64::from(self.prev_word));
        // The first digit of each run in the block (bit 0 may go on with the last block's).
        let run_heads = digits & !((digits << 1) | carry_digit);
        let continued = digits & carry_digit;
        // A run belongs to a word when the byte before it does (or, for a run that began
        // in the last block, when that one did): marked at its head, then filled along
        // the run by a carry that stops at the run's end.
        let marks = (run_heads | continued) & ((words << 1) | carry_word);
        let in_words = digits & !digits.wrapping_add(marks);
        let zeros = run_heads & !in_words;
        let dropped = digits & !in_words & !zeros;
        let last = 63 - valid.leading_zeros();
        if digits >> last & 1 == 1 {
            self.prev_digit = true;
            self.prev_word = in_words >> last & 1 == 1;
        } else {
            self.prev_digit = false;
            self.prev_word = words >> last & 1 == 1;
        }
        let kept = valid & !dropped;
        if kept == u64::MAX && zeros == 0 {
            // A whole block kept as it is (no number stands on its own in it): the
            // common case of prose and identifiers.
            for j in 0..BLOCK / 8 {
                self.hasher.word(block.word(j));
            }
            return;
        }
        // Otherwise the kept bytes (each number's first digit read as `0`) are moved
        // together (`classes::compact`: eight at a time by a byte shuffle where SSSE3 is
        // there), then hashed a word at a time: a byte-by-byte gather of each eight was
        // the cost of results full of numbers (code with line numbers, logs).
        let mut bytes = *block.bytes;
        let mut out = [0u8; BLOCK + 8];
        let n = compact_numbers(&mut bytes, zeros, kept, &mut out, 0);
        let mut at = 0;
        while at + 8 <= n {
            self.hasher.word(load8(&out[at..]));
            at += 8;
        }
        let rest = (n - at) as u32;
        // `compact` may write scratch past the kept bytes (zeros today): masked, so that
        // the hash does not depend on it.
        self.hasher.bytes(load8(&out[at..]) & low_bytes(rest), rest);
    }
}

/// The hashes of a text's whitespace-separated tokens, in order, ASCII case ignored:
/// [`token_hash`] of each. The tokens are found a block at a time (where a run of
/// non-whitespace bytes starts and ends), then each is hashed straight from the text.
#[inline]
pub fn each_token_hash(text: &[u8], f: impl FnMut(u32)) {
    each_token_hash_and_space(text, f, |_, _| {});
}

/// [`each_token_hash`], and each block's whitespace on the way: `spaces(at, mask)` with
/// bit `i` of `mask` set when `text[at + i]` is ASCII whitespace (once per 64 bytes, in
/// order), so that a second feature of the text needs no pass of its own.
#[inline]
pub fn each_token_hash_and_space(
    text: &[u8],
    mut f: impl FnMut(u32),
    mut spaces: impl FnMut(usize, u64),
) {
    let mut pad = [0; BLOCK];
    // Where the token that runs on into the next block started.
    let mut open: Option<usize> = None;
    let mut at = 0;
    while at < text.len() {
        let block = Block::at(text, at, &mut pad);
        let ws = whitespace(block.bytes) & block.valid;
        spaces(at, ws);
        let inside = !ws & block.valid;
        let before = (inside << 1) | u64::from(open.is_some());
        // Starts and ends alternate: a token ends at the first byte that is not in it.
        let mut starts = inside & !before;
        let mut ends = !inside & before & block.valid;
        // The token left open by the previous block ends first, then this block's own.
        let mut carried = open.take();
        while let Some(start) = carried.take().or_else(|| {
            (starts != 0).then(|| {
                let start = at + starts.trailing_zeros() as usize;
                starts &= starts - 1;
                start
            })
        }) {
            if ends == 0 {
                open = Some(start);
                break;
            }
            f(token_hash_in(
                text,
                start,
                at + ends.trailing_zeros() as usize,
            ));
            ends &= ends - 1;
        }
        at += BLOCK;
    }
    if let Some(start) = open {
        f(token_hash_in(text, start, text.len()));
    }
}

/// [`token_hash`] of `text[start..end]`, its last word loaded whole when the text goes on
/// for eight bytes (and masked), read by [`load_short`] otherwise.
// Always inlined: it runs once per token, and the compiler once left it out of line (a
// call per token: about 12 % more instructions for a turn's text features).
#[inline(always)]
fn token_hash_in(text: &[u8], start: usize, end: usize) -> u32 {
    let mut h = 0u64;
    let mut i = start;
    while i + 8 <= end {
        h = mix(h, lower8(load8(&text[i..])));
        i += 8;
    }
    let n = end - i;
    if n > 0 {
        let w = match text.get(i..i + 8) {
            Some(word) => load8(word) & low_bytes(n as u32),
            None => load_short(&text[i..end]),
        };
        h = mix(h, lower8(w));
    }
    fold(mix(h, (end - start) as u64))
}

/// A mask of the low `n` bytes (n <= 8).
#[inline]
fn low_bytes(n: u32) -> u64 {
    if n >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * n)) - 1
    }
}

/// The hash of a line of output, as written (case kept).
#[inline]
pub fn line_hash(line: &[u8]) -> u32 {
    let mut h = WordHasher::default();
    let mut rest = line;
    while rest.len() >= 8 {
        h.word(load8(rest));
        rest = &rest[8..];
    }
    // The last bytes at once: a content sample hashes every line of a result, and a
    // byte at a time its tail took an eighth of a line's instructions.
    if !rest.is_empty() {
        h.bytes(load_short(rest), rest.len() as u32);
    }
    fold(h.finish())
}

/// The hash of a token, ASCII case ignored.
#[inline]
pub fn token_hash(token: &[u8]) -> u32 {
    let mut h = 0u64;
    let mut rest = token;
    while rest.len() >= 8 {
        h = mix(h, lower8(load8(rest)));
        rest = &rest[8..];
    }
    if !rest.is_empty() {
        h = mix(h, lower8(load_short(rest)));
    }
    fold(mix(h, token.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape_of(parts: &[&[u8]]) -> u32 {
        let mut s = Shape::default();
        for p in parts {
            s.text(p);
        }
        s.finish()
    }

    #[test]
    fn swar_helpers_agree_with_the_bytewise_rules() {
        for b in 0..=255u8 {
            let w = u64::from_le_bytes([b, b'a', b, 0x80, b, b'9', b, 0xff]);
            let lower = lower8(w).to_le_bytes();
            for (i, &x) in w.to_le_bytes().iter().enumerate() {
                assert_eq!(lower[i], x.to_ascii_lowercase(), "{x:#x}");
            }
        }
    }

    #[test]
    fn hashes_do_not_depend_on_how_the_bytes_were_split() {
        let text = b"line 406: javac: command not found; float32 x86_64 took 12.5s __init__ 7";
        let whole = shape_of(&[text]);
        for cut in 0..text.len() {
            assert_eq!(
                shape_of(&[&text[..cut], &text[cut..]]),
                whole,
                "cut at {cut}"
            );
        }
        let mut h = WordHasher::default();
        h.word(load8(b"abcdefgh"));
        let mut g = WordHasher::default();
        b"abcdefgh".iter().for_each(|b| g.byte(*b));
        assert_eq!(h.finish(), g.finish());
        // A line's hash is its bytes' one by one, whatever its length (values are stored).
        for len in 0..=text.len() {
            let mut g = WordHasher::default();
            text[..len].iter().for_each(|b| g.byte(*b));
            assert_eq!(line_hash(&text[..len]), fold(g.finish()), "length {len}");
        }
    }

    #[test]
    fn a_short_load_is_the_bytes_copied_into_a_zeroed_word() {
        let bytes: Vec<u8> = (1..=8u8).map(|b| b.wrapping_mul(37) | 0x80).collect();
        for from in 0..8 {
            for len in 0..=8 - from {
                let b = &bytes[from..from + len];
                let mut word = [0u8; 8];
                word[..len].copy_from_slice(b);
                assert_eq!(load_short(b), u64::from_le_bytes(word), "{b:?}");
            }
        }
    }

    /// The rule byte by byte, as the definition the eight-byte paths are held to.
    fn shape_bytewise(bytes: &[u8]) -> u32 {
        let mut h = WordHasher::default();
        let (mut prev_word, mut prev_digit) = (false, false);
        for &b in bytes {
            if b.is_ascii_digit() {
                if !prev_digit {
                    h.byte(if prev_word { b } else { b'0' });
                } else if prev_word {
                    h.byte(b);
                }
                prev_digit = true;
            } else {
                h.byte(b);
                prev_word = b.is_ascii_alphabetic() || b == b'_';
                prev_digit = false;
            }
        }
        fold(h.finish())
    }

    proptest::proptest! {
        #[test]
        fn the_fast_paths_follow_the_rule(
            // Digits anywhere; or digits only inside words, so that whole blocks are kept
            // as they are; or long numbers, so that whole blocks (and eights) are dropped.
            text in proptest::prop_oneof![
                "[a-c0-9_ .\\-]{0,300}",
                "([a-c_]{1,9}[0-9]{0,3}[ .\\-]){0,40}",
                "([a-c ]{0,3}[0-9]{1,200}){0,3}",
            ],
            cut in 0usize..300,
        ) {
            let b = text.as_bytes();
            let cut = cut.min(b.len());
            proptest::prop_assert_eq!(shape_of(&[&b[..cut], &b[cut..]]), shape_bytewise(b));
        }

        /// Tokens across blocks, long ones and runs of whitespace: the hashes of the
        /// tokens split out one by one.
        #[test]
        fn tokens_are_found_across_blocks(text in "([a-zA-Z_]{0,90}[ \t\n\r]{0,3}){0,12}", from in 0usize..5) {
            let t = &text.as_bytes()[from.min(text.len())..];
            let mut fast = Vec::new();
            each_token_hash(t, |h| fast.push(h));
            let slow: Vec<u32> = t
                .split(|b| b.is_ascii_whitespace())
                .filter(|s| !s.is_empty())
                .map(token_hash)
                .collect();
            proptest::prop_assert_eq!(fast, slow);
        }

        /// Escapes found a block at a time by masks are those a walk finds, carries across
        /// blocks included: in runs of backslashes, `\u` with its four bytes (and without,
        /// the walk's fallback), `u`s escaped and not.
        #[test]
        fn escapes_found_by_masks_are_the_walks(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    4 => proptest::strategy::Just("\\"),
                    2 => proptest::strategy::Just("u"),
                    2 => proptest::strategy::Just("a"),
                    2 => proptest::strategy::Just("\\u00a0"),
                    1 => proptest::strategy::Just("\\n"),
                ],
                0..200,
            ),
        ) {
            let text = parts.concat().into_bytes();
            let (mut fast_carry, mut walked_carry) = (0, 0);
            let mut pad = [0; BLOCK];
            let mut at = 0;
            while at < text.len() {
                let block = Block::at(&text, at, &mut pad);
                let (backslashes, us) = eq2(block.bytes, b'\\', b'u');
                let backslashes = backslashes & block.valid;
                let fast = escapes_in(&text, at, backslashes, us, fast_carry);
                let walked = escapes_walked(&text, at, backslashes, walked_carry);
                proptest::prop_assert_eq!(fast.0 & block.valid, walked.0 & block.valid, "at {}", at);
                (fast_carry, walked_carry) = (fast.1, walked.1);
                if at + BLOCK < text.len() {
                    proptest::prop_assert_eq!(fast_carry, walked_carry, "carry at {}", at);
                }
                at += BLOCK;
            }
        }

        /// Canonical JSON read in blocks reads as its literal runs and escapes one by one.
        #[test]
        fn json_reads_as_its_runs_and_escapes(
            parts in proptest::collection::vec(
                ("[a-c0-9_ .]{0,70}", proptest::prop_oneof!["\\\\[nt\"\\\\]", "\\\\u00[01][0-9a-f]"]),
                0..8,
            ),
            tail in "[a-c0-9_ .]{0,70}",
        ) {
            let mut canonical = String::new();
            let mut expected = Shape::default();
            for (text, escape) in &parts {
                canonical.push_str(text);
                canonical.push_str(escape);
                expected.text(text.as_bytes());
                expected.escape(escape.as_bytes());
            }
            canonical.push_str(&tail);
            expected.text(tail.as_bytes());
            let mut got = Shape::default();
            got.json(canonical.as_bytes());
            proptest::prop_assert_eq!(got.finish(), expected.finish(), "{:?}", canonical);
        }
    }

    #[test]
    fn numbers_are_any_number_but_the_digits_of_words_stay() {
        let s = |t: &str| shape_of(&[t.as_bytes()]);
        assert_eq!(s("line 406: x"), s("line 7: x"));
        assert_eq!(s("took 1.25s, 42 passed"), s("took 0.5s, 7 passed"));
        assert_ne!(s("float32"), s("float64"));
        assert_ne!(s("x86_64"), s("x86_32"));
        assert_ne!(s("line 4 ok"), s("line 4 no"));
        assert_ne!(s("a1"), s("a"));
        // An escape separates: `\n42` is a break and a number.
        let mut a = Shape::default();
        a.escape(b"\\n");
        a.text(b"42 failed");
        let mut b = Shape::default();
        b.escape(b"\\n");
        b.text(b"7 failed");
        assert_eq!(a.finish(), b.finish());
    }

    #[test]
    fn tokens_hash_the_same_one_by_one_and_over_the_text() {
        let text = "Hello  world\tTHIS\nis a Longer_token_than_eight bytes\r\x0cend x\u{b}y é";
        for cut in 0..text.len() {
            let t = &text.as_bytes()[cut..];
            let mut fast = Vec::new();
            each_token_hash(t, |h| fast.push(h));
            let slow: Vec<u32> = t
                .split(|b| b.is_ascii_whitespace())
                .filter(|s| !s.is_empty())
                .map(token_hash)
                .collect();
            assert_eq!(fast, slow, "from byte {cut}");
        }
    }

    #[test]
    fn tokens_hash_without_case() {
        assert_eq!(token_hash(b"Hello"), token_hash(b"hELLO"));
        assert_eq!(
            token_hash(b"INSPECTING_MODULE"),
            token_hash(b"inspecting_module")
        );
        assert_ne!(token_hash(b"step"), token_hash(b"step1"));
        assert_ne!(token_hash(b"a"), token_hash(b"a\0"));
    }
}

//! What a tool result showed the agent, sampled line by line, so that a read whose
//! answer shows only lines the run has already seen counts as no news, whatever its
//! arguments were: a rephrased search that finds the code it found before, the same
//! file viewed through another tool or range.
//!
//! A result's lines are its text split at line breaks (and, in structured results, at
//! JSON's structure: each value its own line; keys are not content). A line is read up to whitespace and
//! numbers (a number standing on its own is any number: line numbers, counters; the
//! digits of a word such as `utf8` stay, as in a result's shape), and lines with fewer
//! than [`MIN_LINE_CHARS`] characters left (`}`, `else:`, a fence) are not content. One line
//! in [`SAMPLE_ONE_IN`] is sampled, by its hash, so the same line is sampled wherever it
//! appears, and a session keeps [`SEEN_LINES`] sampled hashes: its state stays bounded
//! while a result's share of new lines is still estimated from a few of them.
//!
//! Guarantees: the sample depends only on the result's canonical JSON (so the streaming
//! and the tree parser agree); no allocation, and the reading stops once
//! [`SAMPLED_LINES_MAX`] lines are sampled; a result with fewer than
//! [`MIN_SAMPLED_LINES`] sampled lines is not judged here (short answers, prices,
//! statuses keep the exact comparison of their digest).

use std::collections::VecDeque;

use crate::contract::classes::{self, BLOCK};
use crate::engine::hash::compact_numbers;
use crate::engine::trajectory::holds;

/// Sampled line hashes kept from one result.
pub const SAMPLED_LINES_MAX: usize = 32;
/// One line in this many is sampled.
pub const SAMPLE_ONE_IN: u32 = 4;
/// Characters (beyond whitespace) a line needs to be content.
pub const MIN_LINE_CHARS: usize = 12;
/// A result is judged on its content when it has at least this many sampled lines.
pub const MIN_SAMPLED_LINES: usize = 4;
/// Sampled lines a run keeps (oldest forgotten first), 16 bits each: 256 bytes of its
/// state, about 500 lines of output (the odds that a new line passes for one of them
/// are 1 in 500).
pub const SEEN_LINES: usize = 128;

/// The sampled lines of one result, distinct, in order of appearance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentSample {
    hashes: [u16; SAMPLED_LINES_MAX],
    len: u8,
}

impl Default for ContentSample {
    fn default() -> Self {
        ContentSample {
            hashes: [0; SAMPLED_LINES_MAX],
            len: 0,
        }
    }
}

/// Bytes of a line kept for its hash (a longer line is known by its beginning).
const LINE_BYTES_MAX: usize = 256;

/// Room for a normalized line (see [`Line::normalized`]).
const NORMALIZED_BYTES: usize = LINE_BYTES_MAX + 2 * BLOCK + 8;

/// One line being read, copied as it comes (escapes resolved): the walk's way, for what
/// the block reading of strings leaves to it (see [`ContentSample::string`]).
struct Line {
    bytes: [u8; LINE_BYTES_MAX],
    len: usize,
    /// The normalized line. `compact` asks for a block and 8 bytes of room past where
    /// it writes; the walk writes a block's bytes after at most `LINE_BYTES_MAX - BLOCK`
    /// kept bytes, the block reading after at most `LINE_BYTES_MAX`, and it moves a
    /// block's worth from at most `LINE_BYTES_MAX + BLOCK`.
    normalized: [u8; NORMALIZED_BYTES],
}

impl Line {
    fn new() -> Line {
        Line {
            bytes: [0; LINE_BYTES_MAX],
            len: 0,
            normalized: [0; NORMALIZED_BYTES],
        }
    }

    #[inline]
    fn push(&mut self, chunk: &[u8]) {
        let n = chunk.len().min(LINE_BYTES_MAX - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&chunk[..n]);
        self.len += n;
    }

    /// The line's hash up to whitespace and numbers, and how many characters counted:
    /// whitespace is dropped (indentation, alignment) and a number standing on its own
    /// (a line number, a counter, a timing) counts as one `0`, while the digits of a
    /// word (`utf8`, `x86_64`) stay, as in a result's shape. The same code viewed at
    /// other line numbers or indentation reads the same.
    ///
    /// Read a 64-byte block at a time ([`normalize_block`]); the kept bytes are then
    /// copied out eight at a time (`classes::compact`), with no branch per byte. A number
    /// standing on its own is written as `0` over its first digit in the raw line, which
    /// is read no more after this.
    fn normalized_hash(&mut self) -> (u32, usize) {
        let out = &mut self.normalized;
        let mut n = 0;
        let mut before = Before::default();
        let mut at = 0;
        while at < self.len {
            let block: &mut [u8; BLOCK] = (&mut self.bytes[at..at + BLOCK])
                .try_into()
                .expect("LINE_BYTES_MAX is a multiple of BLOCK");
            let valid = low_bits(self.len - at);
            let (kept, own_starts, after) = normalize_block(block, valid, before, BLOCK - 1);
            n = compact_numbers(block, own_starts, kept, out, n);
            before = after;
            at += BLOCK;
        }
        (crate::engine::hash::line_hash(&out[..n]), n)
    }
}

/// What the escapes of a block of a string's text (its bytes from where the last block
/// ended) say about it: where the block's part of the string ends, which bytes start
/// a line break, which belong to no class of the normalization.
struct StringBlock {
    /// Bytes of the block that are the string's (its closing quote, or an escape that
    /// runs past the block, stops it short of 64).
    limit: usize,
    /// Whether the closing quote is at `limit`.
    ends_string: bool,
    /// The `\` of each `\n` and `\r`.
    breaks: u64,
    /// Bytes the copied line would not have or would have as whitespace: the two of a
    /// line break, of a `\t`, `\b` or `\f`, the `\` before an escaped `"`, `\`, `/`.
    classless: u64,
}

impl StringBlock {
    /// `avail`: the bytes of `block` that are the text's (the rest are zeros); `more`:
    /// whether the text goes on after the block. `None` for what the walk reads instead:
    /// an escape JSON does not have (`\` before another letter), and a string that the
    /// text's end cuts off.
    #[inline]
    fn scan(block: &[u8; BLOCK], avail: usize, more: bool) -> Option<StringBlock> {
        let (mut quotes, mut backslashes) = classes::eq2(block, b'"', b'\\');
        let (mut breaks, mut classless) = (0u64, 0u64);
        loop {
            let quote = quotes.trailing_zeros() as usize;
            let p = backslashes.trailing_zeros() as usize;
            if quote < p {
                return Some(StringBlock {
                    limit: quote,
                    ends_string: true,
                    breaks,
                    classless,
                });
            }
            let (limit, escape_len) = match (p, block.get(p + 1)) {
                (BLOCK, _) => (BLOCK, 0),
                (_, Some(b'u')) => (p, 6),
                _ => (p, 2),
            };
            if escape_len == 0 || p + escape_len > avail {
                // The next block starts at this escape, whole; at the text's end, the
                // walk reads what is left.
                return more.then_some(StringBlock {
                    limit,
                    ends_string: false,
                    breaks,
                    classless,
                });
            }
            let at = 1u64 << p;
            match block[p + 1] {
                b'n' | b'r' => {
                    breaks |= at;
                    classless |= at | at << 1;
                }
                b't' | b'b' | b'f' => classless |= at | at << 1,
                b'"' | b'\\' | b'/' => classless |= at,
                // Kept as written, its four bytes whatever they are, as the walk keeps
                // it (the sample never leaves the process).
                b'u' => {}
                _ => return None,
            }
            let escape = (u64::MAX >> (64 - escape_len)) << p;
            quotes &= !escape;
            backslashes &= !escape;
        }
    }
}

/// The bits below `n` (`n <= 64`).
#[inline]
fn low_bits(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// Whether the byte before a block was a digit, a word byte, a word's digit (one bit each,
/// at bit 0).
#[derive(Debug, Clone, Copy, Default)]
struct Before {
    digit: u64,
    word: u64,
    word_digit: u64,
}

/// The normalization of one block (its `valid` bytes, `before` saying what the byte before
/// them was): the bytes kept, the first digits of numbers standing on their own (to be
/// written as `0`), and what the byte at `last` is for the block after it.
///
/// Read as byte-class masks: a run of digits is a word's when the byte before it continues
/// a word, found for whole runs at once by carrying the run's first bit through it
/// (`((digits + starts) ^ digits) & digits`); whitespace and the digits after a number's
/// first are dropped.
#[inline(always)]
fn normalize_block(
    block: &[u8; BLOCK],
    valid: u64,
    before: Before,
    last: usize,
) -> (u64, u64, Before) {
    let ws = classes::whitespace(block);
    let (digits, words) = classes::digits_and_words(block);
    let (digits, words) = (digits & valid, words & valid);
    let starts = digits & !((digits << 1) | before.digit);
    // A run continued from the block before is a word's when that one was.
    let word_starts = (starts & ((words << 1) | before.word)) | (digits & before.word_digit);
    let word_digits = (digits.wrapping_add(word_starts) ^ digits) & digits;
    let own_starts = starts & !word_starts;
    let kept = valid & !ws & !(digits & !word_digits & !own_starts);
    let after = Before {
        digit: digits >> last & 1,
        word: words >> last & 1,
        word_digit: word_digits >> last & 1,
    };
    (kept, own_starts, after)
}

/// Where the block reading of a string stands.
struct Reading {
    /// The next block's first byte.
    at: usize,
    /// The open line's first byte.
    line_start: usize,
    /// The open line's normalized bytes so far (in [`Line::normalized`]).
    normalized: usize,
    before: Before,
}

impl Reading {
    /// At a line's start.
    fn at(at: usize) -> Reading {
        Reading {
            at,
            line_start: at,
            normalized: 0,
            before: Before::default(),
        }
    }
}

/// What a block of a string leaves to do.
enum Step {
    /// Read the next block.
    Next,
    /// The string (or the sample) ended; reading goes on here.
    Ended(usize),
    /// The walk reads the open line.
    Walk,
}

impl ContentSample {
    /// Samples the lines of a result's canonical JSON text.
    pub fn of_canonical(canonical: &[u8]) -> ContentSample {
        let mut sample = ContentSample::default();
        let mut line = Line::new();
        let s = canonical;
        let mut i = 0;
        while i < s.len() && !sample.is_full() {
            // Outside strings: structure ends lines, and a number or literal is a line.
            match s[i] {
                b'"' => {
                    sample.end_line(&mut line);
                    i = sample.string(s, i + 1, &mut line);
                }
                b'{' | b'}' | b'[' | b']' | b',' | b':' => {
                    sample.end_line(&mut line);
                    i += 1;
                }
                c => {
                    line.push(&[c]);
                    i += 1;
                }
            }
        }
        sample.end_line(&mut line);
        sample
    }

    /// Samples the lines of the string whose text starts at `from` (after its opening
    /// quote) and returns where it ends (after its closing quote; the text's end when it
    /// has none). Its last line is no content when the string is an object's key.
    ///
    /// Read a 64-byte block at a time, without copying a line out: the escapes of a
    /// block are walked (in a tool's output, mostly its line breaks), each line break
    /// marked, and the bytes an escape turns into whitespace or drops (`\t`, the `\` of
    /// `\"`) taken out of every class. A byte's class then depends only on the byte
    /// before it as on the copied line's (whitespace, a `"`, a `\` are no digit and no
    /// word), so the normalization's masks are made once for the block and each line's
    /// kept bytes moved out of them. A line whose text may pass [`LINE_BYTES_MAX`] (kept
    /// by its beginning), an escape JSON does not have, or a string cut off by the text's
    /// end is read by the walk ([`ContentSample::walk_line`]) instead, so both read every
    /// line alike (a property test holds them to it).
    fn string(&mut self, s: &[u8], from: usize, line: &mut Line) -> usize {
        let mut reading = Reading::at(from);
        loop {
            let at = reading.at;
            let mut block = [0u8; BLOCK];
            let avail = (s.len() - at).min(BLOCK);
            match s.get(at..at + BLOCK) {
                // A whole block is copied as one (no call to `memcpy`).
                Some(whole) => block = whole.try_into().expect("64 bytes"),
                None => block[..avail].copy_from_slice(&s[at..]),
            }
            let step = match StringBlock::scan(&block, avail, at + BLOCK < s.len()) {
                Some(scan) => self.string_block(s, &mut block, &scan, &mut reading, line),
                None => Step::Walk,
            };
            match step {
                Step::Next => {}
                Step::Ended(end) => return end,
                Step::Walk => {
                    // The walk reads this line, from its start; the blocks go on after it.
                    let (next, ended) = self.walk_line(s, reading.line_start, line);
                    if ended || self.is_full() {
                        return next;
                    }
                    reading = Reading::at(next);
                }
            }
        }
    }

    /// The lines of one block of a string (see [`ContentSample::string`]).
    #[inline(always)]
    fn string_block(
        &mut self,
        s: &[u8],
        block: &mut [u8; BLOCK],
        scan: &StringBlock,
        reading: &mut Reading,
        line: &mut Line,
    ) -> Step {
        let at = reading.at;
        let valid = low_bits(scan.limit) & !scan.classless;
        // `limit > 0` when the string goes on: such a block holds at least 58 bytes.
        let last = scan.limit.saturating_sub(1);
        let (kept, own_starts, after) = normalize_block(block, valid, reading.before, last);
        // The block's kept bytes, every line's, moved out at once after the open
        // line's: a line then is a run of them, `kept`'s bits counted up to its ends.
        let out = &mut line.normalized;
        let packed_from = reading.normalized;
        let packed_end = compact_numbers(block, own_starts, kept, out, packed_from);
        let packed_at = |bit: usize| packed_from + (kept & low_bits(bit)).count_ones() as usize;
        // Each line break ends a line; the line after it starts past its two bytes.
        let (mut line_from, mut breaks) = (0, scan.breaks);
        while breaks != 0 {
            let to = breaks.trailing_zeros() as usize;
            if at + to - reading.line_start > LINE_BYTES_MAX {
                // A line longer than the copy keeps.
                return Step::Walk;
            }
            self.sample_line(&out[line_from..packed_at(to)]);
            if self.is_full() {
                return Step::Ended(at + to);
            }
            reading.line_start = at + to + 2;
            line_from = packed_at(to + 2);
            breaks &= breaks - 1;
        }
        if at + scan.limit - reading.line_start > LINE_BYTES_MAX {
            return Step::Walk;
        }
        if scan.ends_string {
            // An object's key names a field; its value is the content.
            if s.get(at + scan.limit + 1) != Some(&b':') {
                self.sample_line(&out[line_from..packed_end]);
            }
            return Step::Ended(at + scan.limit + 1);
        }
        // The open line's bytes to the front, for the next block's to follow; a line that
        // began in this block has at most a block's (a fixed copy, no call).
        reading.normalized = packed_end - line_from;
        if line_from > 0 {
            let tail: [u8; BLOCK] = out[line_from..line_from + BLOCK]
                .try_into()
                .expect("room for a block past the packed bytes");
            out[..BLOCK].copy_from_slice(&tail);
        }
        reading.before = after;
        reading.at += scan.limit;
        Step::Next
    }

    /// Reads the line of a string starting at `i` as first written, copying it: up to
    /// its line break (the index after it, and `false`) or the string's end (the index
    /// after the closing quote, and `true`), then ends it as [`ContentSample::string`]
    /// does.
    fn walk_line(&mut self, s: &[u8], mut i: usize, line: &mut Line) -> (usize, bool) {
        line.len = 0;
        while i < s.len() {
            // Literal runs up to the next quote or escape.
            let Some(p) = memchr::memchr2(b'"', b'\\', &s[i..]) else {
                line.push(&s[i..]);
                i = s.len();
                break;
            };
            line.push(&s[i..i + p]);
            i += p;
            if s[i] == b'"' {
                i += 1;
                break;
            }
            match s.get(i + 1) {
                Some(b'n') | Some(b'r') => {
                    self.end_line(line);
                    return (i + 2, false);
                }
                Some(b't') | Some(b'b') | Some(b'f') => line.push(b" "),
                // Kept as written (the sample never leaves the process).
                Some(b'u') => line.push(&s[i..(i + 6).min(s.len())]),
                Some(c) => line.push(&[*c]),
                None => {}
            }
            i += if s.get(i + 1) == Some(&b'u') { 6 } else { 2 };
        }
        if s.get(i) == Some(&b':') {
            // An object's key names a field; its value is the content.
            line.len = 0;
        } else {
            self.end_line(line);
        }
        (i, true)
    }

    fn is_full(&self) -> bool {
        self.len as usize == SAMPLED_LINES_MAX
    }

    /// Ends the line copied into `line` (outside strings, and the walk's).
    #[inline]
    fn end_line(&mut self, line: &mut Line) {
        if line.len < MIN_LINE_CHARS || self.is_full() {
            line.len = 0;
            return;
        }
        let (full, chars) = line.normalized_hash();
        self.sample_hash(full, chars);
        line.len = 0;
    }

    /// Ends a line given normalized.
    #[inline]
    fn sample_line(&mut self, normalized: &[u8]) {
        if normalized.len() >= MIN_LINE_CHARS {
            self.sample_hash(crate::engine::hash::line_hash(normalized), normalized.len());
        }
    }

    #[inline]
    fn sample_hash(&mut self, full: u32, chars: usize) {
        if chars >= MIN_LINE_CHARS && !self.is_full() {
            // One line in SAMPLE_ONE_IN, chosen by the low bits; the high ones are kept.
            let h = (full >> 16) as u16;
            if full % SAMPLE_ONE_IN == 0 && !self.hashes[..self.len as usize].contains(&h) {
                self.hashes[self.len as usize] = h;
                self.len += 1;
            }
        }
    }

    pub fn hashes(&self) -> &[u16] {
        &self.hashes[..self.len as usize]
    }

    /// Whether every line sampled here, but at most one in eight, is in `seen` (`None`
    /// when too few lines were sampled to judge the result by its content); then adds
    /// them to `seen`, which keeps the newest [`SEEN_LINES`]. Each line is looked up once
    /// for both.
    pub fn seen_then_remember(&self, seen: &mut VecDeque<u16>) -> Option<bool> {
        let lines = self.hashes();
        let mut held = [false; SAMPLED_LINES_MAX];
        for (h, held) in lines.iter().zip(&mut held) {
            *held = holds(seen, *h);
        }
        for (&h, &held) in lines.iter().zip(&held) {
            // A line held before may have been pushed out by one added since (then it
            // is not found); one not held is not there now (the sample's are distinct).
            if held {
                if let Some(at) = seen.iter().position(|&s| s == h) {
                    seen.remove(at);
                }
            }
            // `while`: a stored state holding more (another build's) comes back down.
            while seen.len() >= SEEN_LINES {
                seen.pop_front();
            }
            seen.push_back(h);
        }
        if lines.len() < MIN_SAMPLED_LINES {
            return None;
        }
        let new = held[..lines.len()].iter().filter(|&&held| !held).count();
        Some(new * 8 <= lines.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Judging alone, by lookups of its own: the reference
    /// [`ContentSample::seen_then_remember`] is held to.
    impl ContentSample {
        fn all_seen_in(&self, seen: &VecDeque<u16>) -> Option<bool> {
            let lines = self.hashes();
            if lines.len() < MIN_SAMPLED_LINES {
                return None;
            }
            let new = lines.iter().filter(|&&h| !holds(seen, h)).count();
            Some(new * 8 <= lines.len())
        }
    }

    /// The sample as first written: every string's lines copied out and walked, escape
    /// by escape. [`ContentSample::of_canonical`] is held to it.
    fn of_canonical_walked(s: &[u8]) -> ContentSample {
        let mut sample = ContentSample::default();
        let mut line = Line::new();
        let mut i = 0;
        while i < s.len() && !sample.is_full() {
            match s[i] {
                b'"' => {
                    sample.end_line(&mut line);
                    i += 1;
                    while i < s.len() {
                        let Some(p) = memchr::memchr2(b'"', b'\\', &s[i..]) else {
                            line.push(&s[i..]);
                            i = s.len();
                            break;
                        };
                        line.push(&s[i..i + p]);
                        i += p;
                        if s[i] == b'"' {
                            i += 1;
                            break;
                        }
                        match s.get(i + 1) {
                            Some(b'n') | Some(b'r') => {
                                sample.end_line(&mut line);
                                if sample.is_full() {
                                    return sample;
                                }
                            }
                            Some(b't') | Some(b'b') | Some(b'f') => line.push(b" "),
                            Some(b'u') => line.push(&s[i..(i + 6).min(s.len())]),
                            Some(c) => line.push(&[*c]),
                            None => {}
                        }
                        i += if s.get(i + 1) == Some(&b'u') { 6 } else { 2 };
                    }
                    if s.get(i) == Some(&b':') {
                        line.len = 0;
                    } else {
                        sample.end_line(&mut line);
                    }
                }
                b'{' | b'}' | b'[' | b']' | b',' | b':' => {
                    sample.end_line(&mut line);
                    i += 1;
                }
                c => {
                    line.push(&[c]);
                    i += 1;
                }
            }
        }
        sample.end_line(&mut line);
        sample
    }

    /// Text of JSON strings and structure, with every escape JSON has and some it does not,
    /// lines short and past the copy's cap, keys, and strings cut off by the text's end.
    fn canonical_like() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            8 => "[a-zA-Z_]{1,9}",
            6 => "[0-9]{1,12}",
            3 => "[ ]{1,5}",
            8 => Just("\\n".to_string()),
            2 => Just("\\r".to_string()),
            3 => Just("\\t".to_string()),
            1 => prop_oneof![Just("\\b"), Just("\\f"), Just("\\/"), Just("\\\\")].prop_map(String::from),
            2 => Just("\\\"".to_string()),
            2 => "\\\\u[0-9a-fA-F]{4}",
            1 => prop_oneof![Just("\\u12\""), Just("\\u1\\n"), Just("\\x"), Just("\\"), Just("\\u")].prop_map(String::from),
            3 => "[-.:;,(){}<>=+*/#'\\[\\]]{1,3}",
            4 => Just("\"".to_string()),
            2 => Just("\":".to_string()),
            1 => "[é日🦀\\x01\\x0b]{1,2}",
            1 => "[a-z0-9 ]{60,300}",
        ];
        proptest::collection::vec(piece, 0..160).prop_map(|p| p.concat().into_bytes())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn the_block_reading_of_strings_samples_as_the_walk_does(text in canonical_like()) {
            prop_assert_eq!(ContentSample::of_canonical(&text), of_canonical_walked(&text));
        }

        /// Every line sampled: a string of listing-like lines in any wrapping, so that
        /// sampled lines are many and long lines and escapes fall anywhere in a block.
        #[test]
        fn listings_sample_as_the_walk_does(
            lines in proptest::collection::vec(("[ ]{0,8}[0-9]{0,5}", canonical_like()), 1..40),
            wrap in 0..3usize,
        ) {
            let body: Vec<u8> = lines
                .iter()
                .flat_map(|(head, rest)| {
                    let rest: Vec<u8> = rest.iter().copied().filter(|&b| b != b'"').collect();
                    [head.as_bytes(), b"\\t", &rest, b"\\n"].concat()
                })
                .collect();
            let text = match wrap {
                0 => [b"\"".as_slice(), &body, b"\""].concat(),
                1 => [b"{\"output\":\"".as_slice(), &body, b"\",\"code\":0}"].concat(),
                _ => [b"[\"".as_slice(), &body].concat(),
            };
            prop_assert_eq!(ContentSample::of_canonical(&text), of_canonical_walked(&text));
        }
    }

    /// The normalization byte by byte, as first written: the block version is held to it.
    fn normalized_hash_bytewise(line: &[u8]) -> (u32, usize) {
        const WHITESPACE: u8 = 0;
        const DIGIT: u8 = 1;
        const WORD: u8 = 2;
        const OTHER: u8 = 3;
        let class = |c: u8| {
            if c.is_ascii_whitespace() {
                WHITESPACE
            } else if c.is_ascii_digit() {
                DIGIT
            } else if c.is_ascii_alphabetic() || c == b'_' {
                WORD
            } else {
                OTHER
            }
        };
        let mut out = Vec::new();
        let mut prev = 0u8;
        for &b in line {
            match class(b) {
                WHITESPACE => prev = WHITESPACE,
                DIGIT if prev == WORD => out.push(b),
                DIGIT => {
                    if prev != DIGIT {
                        out.push(b'0');
                    }
                    prev = DIGIT;
                }
                c => {
                    out.push(b);
                    prev = c;
                }
            }
        }
        (crate::engine::hash::line_hash(&out), out.len())
    }

    #[test]
    fn the_block_normalization_holds_at_block_edges_and_long_runs() {
        let digits = |n: usize| "7".repeat(n);
        let cases = [
            format!("a{}", digits(130)),
            digits(256),
            format!("{}a{}", "x".repeat(62), digits(70)),
            format!("{} {}", "x".repeat(62), digits(70)),
            format!("{}.{}", digits(63), digits(100)),
            "ab 1 c".repeat(11),
            "w".repeat(64),
            "9 ".repeat(64),
            format!("{}z", " ".repeat(191)),
            "utf8 x86_64 12:30 ".repeat(15),
        ];
        for text in cases {
            let mut line = Line::new();
            line.push(text.as_bytes());
            let expected = normalized_hash_bytewise(&line.bytes[..line.len]);
            assert_eq!(line.normalized_hash(), expected, "{text:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Lines of words, numbers, whitespace, punctuation and wide characters, of any
        /// length up to the cap, with stale bytes of a longer line behind them.
        #[test]
        fn the_block_normalization_is_the_bytewise_one(
            parts in proptest::collection::vec(
                prop_oneof![
                    "[a-zA-Z_]{1,9}",
                    "[0-9]{1,12}",
                    "[ \t\r\n\x0b\x0c]{1,5}",
                    "[-.:;,(){}<>=+*/#'\"]{1,3}",
                    "[é日🦀]{1,2}",
                ],
                0..80,
            ),
            stale in "[0-9a-z ]{0,256}",
        ) {
            let text = parts.concat();
            let mut line = Line::new();
            line.push(stale.as_bytes());
            line.len = 0;
            line.push(text.as_bytes());
            let expected = normalized_hash_bytewise(&line.bytes[..line.len]);
            prop_assert_eq!(line.normalized_hash(), expected);
        }
    }

    proptest! {
        /// One lookup per line judges and remembers as judging, then remembering, did:
        /// with a set full or nearly (a line added pushes out the oldest, which may be
        /// one of the sample's), duplicates in it (a stored state from another build),
        /// and samples made mostly of lines it holds, so both verdicts come up.
        #[test]
        fn seen_then_remember_is_all_seen_in_then_remembering(
            seen in proptest::collection::vec_deque(0u16..200, SEEN_LINES - 8..=SEEN_LINES),
            held in proptest::collection::vec(any::<proptest::sample::Index>(), 0..=SAMPLED_LINES_MAX),
            fresh in proptest::collection::btree_set(200u16..300, 0..=6),
            order in any::<u64>(),
        ) {
            // A sample's lines are distinct (`end_line`).
            let mut lines: Vec<u16> = Vec::new();
            for h in held.iter().map(|i| seen[i.index(seen.len())]).chain(fresh) {
                if !lines.contains(&h) && lines.len() < SAMPLED_LINES_MAX {
                    lines.push(h);
                }
            }
            let turn = (order as usize) % lines.len().max(1);
            lines.rotate_left(turn);
            let mut sample = ContentSample::default();
            sample.hashes[..lines.len()].copy_from_slice(&lines);
            sample.len = lines.len() as u8;
            let (mut before, mut merged) = (seen.clone(), seen);
            let judged = sample.all_seen_in(&before);
            // Remembering as first written: each line looked up as it is added.
            for &h in sample.hashes() {
                if holds(&before, h) {
                    let at = before.iter().position(|&s| s == h).unwrap();
                    before.remove(at);
                }
                while before.len() >= SEEN_LINES {
                    before.pop_front();
                }
                before.push_back(h);
            }
            prop_assert_eq!(sample.seen_then_remember(&mut merged), judged);
            prop_assert_eq!(merged, before);
        }
    }

    fn sample(v: serde_json::Value) -> ContentSample {
        ContentSample::of_canonical(v.to_string().as_bytes())
    }

    /// A code listing of `n` functions starting at function `from`, as a viewer prints
    /// it with line numbers from `numbered_from`.
    fn listing_numbered(from: usize, n: usize, numbered_from: usize) -> String {
        (0..n)
            .map(|k| {
                let (i, line) = (from + k, numbered_from + k);
                format!("{line:6}\tdef function_number_{i}(argument): return argument * {i}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn listing(from: usize, n: usize) -> String {
        listing_numbered(from, n, from)
    }

    #[test]
    fn the_same_lines_are_sampled_wherever_they_appear() {
        let a = sample(serde_json::json!(listing(1, 200)));
        assert!(a.hashes().len() >= MIN_SAMPLED_LINES, "{a:?}");
        // The same lines in another wrapping (a search result's header, other line
        // numbers, other indentation) sample the same.
        let b = sample(serde_json::json!({
            "found": "12 code sections",
            "code": listing_numbered(1, 200, 351).replace('\t', "    "),
        }));
        let mut seen = VecDeque::new();
        a.seen_then_remember(&mut seen);
        assert_eq!(b.all_seen_in(&seen), Some(true));
    }

    #[test]
    fn new_lines_are_news_and_short_results_are_not_judged() {
        let mut seen = VecDeque::new();
        sample(serde_json::json!(listing(1, 200))).seen_then_remember(&mut seen);
        assert_eq!(
            sample(serde_json::json!(listing(1000, 200))).all_seen_in(&seen),
            Some(false)
        );
        // Every other line new: news.
        let old = listing(1, 100);
        let new = listing(2000, 100);
        let half: Vec<&str> = old
            .lines()
            .zip(new.lines())
            .flat_map(|(a, b)| [a, b])
            .collect();
        assert_eq!(
            sample(serde_json::json!(half.join("\n"))).all_seen_in(&seen),
            Some(false)
        );
        // A status, a price, a one-line error: too short to judge by content.
        for short in [
            serde_json::json!({"status": "running", "progress": 40}),
            serde_json::json!("The old_str and new_str are the same. No changes were made."),
            serde_json::json!({"symbol": "AAPL", "price": 187.32}),
        ] {
            assert_eq!(sample(short.clone()).all_seen_in(&seen), None, "{short}");
        }
    }

    #[test]
    fn keys_are_not_content_and_a_stored_set_past_its_cap_comes_back_down() {
        // A record of long field names and short values: nothing to judge it by.
        let record: serde_json::Map<String, serde_json::Value> = (0..40)
            .map(|k| {
                (
                    format!("a_rather_long_field_name_{k}"),
                    serde_json::json!(k),
                )
            })
            .collect();
        let s = sample(serde_json::Value::Object(record));
        assert!(s.hashes().is_empty(), "{s:?}");
        let mut seen: VecDeque<u16> = (0..SEEN_LINES as u16 + 50).collect();
        sample(serde_json::json!(listing(1, 200))).seen_then_remember(&mut seen);
        assert_eq!(seen.len(), SEEN_LINES);
    }

    #[test]
    fn the_run_keeps_a_bounded_set_of_lines() {
        let mut seen = VecDeque::new();
        for k in 0..50 {
            sample(serde_json::json!(listing(k * 1000, 300))).seen_then_remember(&mut seen);
            assert!(seen.len() <= SEEN_LINES);
        }
        assert_eq!(seen.len(), SEEN_LINES);
        // The oldest listings are forgotten, the newest known.
        assert_eq!(
            sample(serde_json::json!(listing(49_000, 300))).all_seen_in(&seen),
            Some(true)
        );
        assert_eq!(
            sample(serde_json::json!(listing(0, 300))).all_seen_in(&seen),
            Some(false)
        );
    }

    #[test]
    fn a_line_is_read_up_to_whitespace_and_numbers_but_the_digits_of_words_stay() {
        // The hash decides whether a line is sampled, in every copy of it or in none:
        // find a padding that gets this line sampled.
        let hash_of = |line: &str| sample(serde_json::json!(line)).hashes().first().copied();
        let (pad, h) = (0..64)
            .find_map(|k| {
                hash_of(&format!(
                    "   359\tcounter 17 of widget utf8 {}",
                    "x".repeat(k)
                ))
                .map(|h| (k, h))
            })
            .unwrap();
        let padded = |line: &str| format!("{line} {}", "x".repeat(pad));
        for alike in [
            "12 counter 923 of widget utf8",
            "\t\t359   counter 17 of   widget utf8",
        ] {
            assert_eq!(hash_of(&padded(alike)), Some(h), "{alike}");
        }
        for other in [
            "359 counter 17 of widget utf16",
            "359 counter 17 of gadget utf8",
        ] {
            assert_ne!(hash_of(&padded(other)), Some(h), "{other}");
        }
    }
}

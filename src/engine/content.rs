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
    /// Only the result's beginning was read (see [`ContentSample::read_whole`]).
    cut: bool,
}

impl Default for ContentSample {
    fn default() -> Self {
        ContentSample {
            hashes: [0; SAMPLED_LINES_MAX],
            len: 0,
            cut: false,
        }
    }
}

/// Bytes of a line kept for its hash (a longer line is known by its beginning).
const LINE_BYTES_MAX: usize = 256;

/// One line being read, copied as it comes (escapes resolved).
struct Line {
    bytes: [u8; LINE_BYTES_MAX],
    len: usize,
    /// The normalized line. `compact` asks for a block and 8 bytes of room past where
    /// it writes, and a block's bytes follow at most the kept bytes of the blocks before
    /// it (at most `LINE_BYTES_MAX - BLOCK`).
    normalized: [u8; LINE_BYTES_MAX + 8],
}

impl Line {
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
    /// Read a 64-byte block at a time as byte-class masks: a run of digits is a word's
    /// when the byte before it continues a word, found for whole runs at once by carrying
    /// the run's first bit through it (`((digits + starts) ^ digits) & digits`); the kept
    /// bytes are then copied out eight at a time (`classes::compact`), with no branch per
    /// byte. A number standing on its own is written as `0` over its first digit in the
    /// raw line, which is read no more after this.
    fn normalized_hash(&mut self) -> (u32, usize) {
        let out = &mut self.normalized;
        let mut n = 0;
        // Whether the byte before the block was a digit, a word byte, a word's digit.
        let (mut digit_before, mut word_before, mut word_digit_before) = (0u64, 0u64, 0u64);
        let mut at = 0;
        while at < self.len {
            let block: &mut [u8; BLOCK] = (&mut self.bytes[at..at + BLOCK])
                .try_into()
                .expect("LINE_BYTES_MAX is a multiple of BLOCK");
            let valid = match self.len - at {
                rest if rest >= BLOCK => u64::MAX,
                rest => (1u64 << rest) - 1,
            };
            let ws = classes::whitespace(block);
            let (digits, words) = classes::digits_and_words(block);
            let (digits, words) = (digits & valid, words & valid);
            let starts = digits & !((digits << 1) | digit_before);
            // A run continued from the block before is a word's when that one was.
            let word_starts =
                (starts & ((words << 1) | word_before)) | (digits & word_digit_before);
            let word_digits = (digits.wrapping_add(word_starts) ^ digits) & digits;
            let own_starts = starts & !word_starts;
            let dropped = ws | (digits & !word_digits & !own_starts);
            n = compact_numbers(block, own_starts, valid & !dropped, out, n);
            digit_before = digits >> 63;
            word_before = words >> 63;
            word_digit_before = word_digits >> 63;
            at += BLOCK;
        }
        (crate::engine::hash::line_hash(&out[..n]), n)
    }
}

impl ContentSample {
    /// Samples the lines of a result's canonical JSON text.
    pub fn of_canonical(canonical: &[u8]) -> ContentSample {
        ContentSample::sampled(canonical, true)
    }

    /// [`ContentSample::of_canonical`], short strings passed over (`skip_short`) or
    /// walked as every string is (what the tests hold the skip to).
    #[inline(always)]
    fn sampled(canonical: &[u8], skip_short: bool) -> ContentSample {
        let mut sample = ContentSample::default();
        let mut line = Line {
            bytes: [0; LINE_BYTES_MAX],
            len: 0,
            normalized: [0; LINE_BYTES_MAX + 8],
        };
        let s = canonical;
        let mut i = 0;
        while i < s.len() && !sample.is_full() {
            // Outside strings: structure ends lines, and a number or literal is a line.
            match s[i] {
                b'"' => {
                    sample.end_line(&mut line);
                    i += 1;
                    // Most keys and values of a structured result are short strings:
                    // one 16-byte compare instead of a `memchr2` call and the line's copy.
                    // A string closed before MIN_LINE_CHARS bytes, with no escape before
                    // its quote, is no content, key or not.
                    const _: () =
                        assert!(MIN_LINE_CHARS <= 16, "the quote is looked for in 16 bytes");
                    if skip_short {
                        if let Some(head) = s.get(i..i + 16) {
                            let head: &[u8; 16] = head.try_into().expect("16 bytes");
                            let stops = classes::eq_either16(head, b'"', b'\\');
                            let first = stops.trailing_zeros() as usize;
                            if first < MIN_LINE_CHARS && s[i + first] == b'"' {
                                i += first + 1;
                                continue;
                            }
                        }
                    }
                    // Inside a string: literal runs up to the next quote or escape.
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

    fn is_full(&self) -> bool {
        self.len as usize == SAMPLED_LINES_MAX
    }

    /// Whether the whole result was read: not when its text was cut before it was read
    /// ([`ContentSample::cut_short`]), nor when the sample filled up, where the reading
    /// stops (a long page's last rows, after its header and menus, were not sampled).
    pub fn read_whole(&self) -> bool {
        !self.cut && !self.is_full()
    }

    /// The sample of a result's beginning only (its text was cut before it was read).
    pub fn cut_short(mut self) -> ContentSample {
        self.cut = true;
        self
    }

    #[inline]
    fn end_line(&mut self, line: &mut Line) {
        if line.len < MIN_LINE_CHARS || self.is_full() {
            line.len = 0;
            return;
        }
        let (full, chars) = line.normalized_hash();
        if chars >= MIN_LINE_CHARS {
            // One line in SAMPLE_ONE_IN, chosen by the low bits; the high ones are kept.
            let h = (full >> 16) as u16;
            if full % SAMPLE_ONE_IN == 0 && !self.hashes[..self.len as usize].contains(&h) {
                self.hashes[self.len as usize] = h;
                self.len += 1;
            }
        }
        line.len = 0;
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

    /// Text of JSON strings and structure: short strings (closed anywhere in their first 16
    /// bytes, keys among them), every escape JSON has and some it does not (before a
    /// quote, the walk reads the string), lines past [`LINE_BYTES_MAX`], and strings cut
    /// off by the text's end.
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
        fn the_sample_skips_short_strings_as_the_walk_reads_them(
            text in canonical_like(),
            // Distinct lines first, so that the sample fills (and stops) in some cases.
            lines_first in 0..300usize,
        ) {
            let lines: String = (0..lines_first).map(|k| format!("a listing's line_{k} of many\\n")).collect();
            let text = [b"\"".as_slice(), lines.as_bytes(), b"\"", text.as_slice()].concat();
            // Every string walked from its start, short ones too, as first written.
            prop_assert_eq!(ContentSample::of_canonical(&text), ContentSample::sampled(&text, false));
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
            let mut line = Line {
                bytes: [0; LINE_BYTES_MAX],
                len: 0,
                normalized: [0; LINE_BYTES_MAX + 8],
            };
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
            let mut line = Line { bytes: [0; LINE_BYTES_MAX], len: 0, normalized: [0; LINE_BYTES_MAX + 8] };
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

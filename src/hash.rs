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

/// The multiplier of FxHash: odd, with well-spread bits.
const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;

#[inline]
fn mix(h: u64, word: u64) -> u64 {
    (h.rotate_left(5) ^ word).wrapping_mul(K)
}

#[inline]
fn fold(h: u64) -> u32 {
    let h = h ^ (h >> 29);
    (h as u32) ^ ((h >> 32) as u32)
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `x` that is an ASCII digit.
#[inline]
pub(crate) fn digit_bytes(x: u64) -> u64 {
    // A byte is a digit when x ^ 0x30 < 10 (only 0x30..=0x39 map below 10), tested
    // without carries between bytes: on 7-bit values, adding 0x76 sets the high bit
    // exactly from 10 up.
    let t = x ^ (0x30 * LO);
    let low7 = t & !HI;
    let ge10 = (low7 + 0x76 * LO) | t;
    !ge10 & HI
}

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
        let mut rest = bytes;
        while rest.len() >= 8 {
            let w = load8(rest);
            if digit_bytes(w) == 0 {
                self.hasher.word(w);
                let last = rest[7];
                self.prev_word = last.is_ascii_alphabetic() || last == b'_';
                self.prev_digit = false;
            } else {
                for &b in &rest[..8] {
                    self.one(b);
                }
            }
            rest = &rest[8..];
        }
        for &b in rest {
            self.one(b);
        }
    }

    #[inline]
    fn one(&mut self, b: u8) {
        if b.is_ascii_digit() {
            if self.prev_digit {
                if self.prev_word {
                    self.hasher.byte(b); // the digits of a word are kept
                }
                return;
            }
            self.prev_digit = true;
            // `prev_word` now says whether this run belongs to a word.
            self.hasher.byte(if self.prev_word { b } else { b'0' });
            return;
        }
        self.prev_digit = false;
        self.prev_word = b.is_ascii_alphabetic() || b == b'_';
        self.hasher.byte(b);
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
        let mut buf = [0u8; 8];
        buf[..rest.len()].copy_from_slice(rest);
        h = mix(h, lower8(u64::from_le_bytes(buf)));
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
            let digits = digit_bytes(w).to_le_bytes();
            let lower = lower8(w).to_le_bytes();
            for (i, &x) in w.to_le_bytes().iter().enumerate() {
                assert_eq!(digits[i] == 0x80, x.is_ascii_digit(), "{x:#x}");
                assert_eq!(digits[i] & 0x7f, 0);
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

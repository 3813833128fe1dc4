//! Byte classes of a 64-byte block as bit masks (bit i stands for byte i): the primitive
//! the hot paths read text with, so that a rule about bytes ("a digit right after a
//! letter", "the next `"` or `\`") becomes a few integer operations per block instead of
//! a branch per byte.
//!
//! Guarantees: every function gives exactly the mask its byte-by-byte definition gives
//! (the tests hold each to it for every byte value at every position); on x86_64 the
//! masks come from SSE2, which every x86_64 processor has, so nothing is detected at run
//! time; elsewhere from a portable loop. [`compact`] alone detects SSSE3 and POPCNT at
//! run time (a portable loop without them), and checks its output's room itself.

/// Bytes per block.
pub const BLOCK: usize = 64;

/// A block of a longer text: the 64 bytes at `at`, or the text's last bytes padded with
/// zeros (a zero byte is in no class but `eq(0)`), with `valid` saying which are real.
#[derive(Clone, Copy)]
pub struct Block<'a> {
    pub bytes: &'a [u8; BLOCK],
    pub valid: u64,
}

impl<'a> Block<'a> {
    /// The block of `s` starting at `at` (`at < s.len()`): borrowed from `s`, or for the
    /// last bytes copied into `pad`.
    #[inline]
    pub fn at(s: &'a [u8], at: usize, pad: &'a mut [u8; BLOCK]) -> Block<'a> {
        match s.get(at..at + BLOCK) {
            Some(full) => Block {
                bytes: full.try_into().expect("64 bytes"),
                valid: u64::MAX,
            },
            None => {
                let tail = &s[at..];
                pad[..tail.len()].copy_from_slice(tail);
                pad[tail.len()..].fill(0);
                Block {
                    bytes: pad,
                    valid: (1u64 << tail.len()) - 1,
                }
            }
        }
    }

    /// The eight bytes at `8 * j`, little-endian.
    #[inline]
    pub fn word(&self, j: usize) -> u64 {
        u64::from_le_bytes(self.bytes[8 * j..8 * j + 8].try_into().expect("8 bytes"))
    }
}

/// ASCII digits, and bytes that continue a word (ASCII letters and `_`).
#[inline]
pub fn digits_and_words(b: &[u8; BLOCK]) -> (u64, u64) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE2 is part of the x86_64 baseline: every x86_64 processor has it.
        unsafe { sse2::digits_and_words(b) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        portable::digits_and_words(b)
    }
}

/// Bytes equal to `x`, and bytes equal to `y`.
#[inline]
pub fn eq2(b: &[u8; BLOCK], x: u8, y: u8) -> (u64, u64) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: as in `digits_and_words`.
        unsafe { sse2::eq2(b, x, y) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        portable::eq2(b, x, y)
    }
}

/// The bytes that end a run of plain JSON string content: `"`, `\\` and control
/// characters (below 0x20, which a string may not hold unescaped).
#[inline]
pub fn string_stops(b: &[u8; BLOCK]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: as in `digits_and_words`.
        unsafe { sse2::string_stops(b) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        portable::string_stops(b)
    }
}

/// Bytes equal to `x` or `y` among sixteen (the short steps of a string search).
#[inline]
pub fn eq_either16(b: &[u8; 16], x: u8, y: u8) -> u16 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: as in `digits_and_words`.
        unsafe { sse2::eq_either16(b, x, y) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        portable::eq_either16(b, x, y)
    }
}

/// ASCII whitespace (`u8::is_ascii_whitespace`: space, tab, line feed, form feed,
/// carriage return).
#[inline]
pub fn whitespace(b: &[u8; BLOCK]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: as in `digits_and_words`.
        unsafe { sse2::whitespace(b) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        portable::whitespace(b)
    }
}

/// Copies the bytes of `block` whose bits are set in `keep` to `out` from `at` on, in
/// order, and returns where they end. Up to 8 bytes past the end may be written too
/// (scratch), so `out` needs `BLOCK + 8` bytes from `at` on.
///
/// With SSSE3 and POPCNT (detected at run time; nearly every x86_64 processor since
/// 2008 has both) eight bytes at a time by a byte shuffle from a table of the 256 masks;
/// otherwise a byte per set bit.
#[inline]
pub fn compact(block: &[u8; BLOCK], keep: u64, out: &mut [u8], at: usize) -> usize {
    // `checked_sub`: a huge `at` must not wrap around into a passing check.
    let room = out.len().checked_sub(at);
    assert!(
        room.is_some_and(|r| r >= BLOCK + 8),
        "compact: out too short"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("ssse3") && std::is_x86_feature_detected!("popcnt") {
            // SAFETY: both features were just detected; `out` has room (asserted).
            return unsafe { ssse3::compact(block, keep, out, at) };
        }
    }
    portable::compact(block, keep, out, at)
}

#[cfg(target_arch = "x86_64")]
mod ssse3 {
    use core::arch::x86_64::*;

    use super::BLOCK;

    /// For each 8-bit mask, the shuffle that moves its set bytes to the front.
    static COMPACT: [u64; 256] = {
        let mut table = [0u64; 256];
        let mut m = 0;
        while m < 256 {
            let (mut pattern, mut k, mut i) = (0u64, 0, 0);
            while i < 8 {
                if m >> i & 1 == 1 {
                    pattern |= (i as u64) << (8 * k);
                    k += 1;
                }
                i += 1;
            }
            // Lanes past the kept bytes read byte 0x80: a shuffle writes zero there.
            while k < 8 {
                pattern |= 0x80 << (8 * k);
                k += 1;
            }
            table[m] = pattern;
            m += 1;
        }
        table
    };

    /// # Safety
    /// SSSE3 and POPCNT available; `out.len() >= at + BLOCK + 8`.
    #[target_feature(enable = "ssse3,popcnt")]
    pub unsafe fn compact(block: &[u8; BLOCK], keep: u64, out: &mut [u8], mut at: usize) -> usize {
        // Up to the word of the last kept byte.
        let words = (BLOCK - keep.leading_zeros() as usize).div_ceil(8);
        for j in 0..words {
            let m = (keep >> (8 * j)) as u8;
            // SAFETY: `8 * j + 8 <= BLOCK`; the store ends at most 8 bytes past the
            // kept ones, inside `out` by the caller's contract.
            unsafe {
                let bytes = _mm_loadl_epi64(block.as_ptr().add(8 * j) as *const __m128i);
                let pattern = _mm_cvtsi64_si128(COMPACT[m as usize] as i64);
                let moved = _mm_shuffle_epi8(bytes, pattern);
                _mm_storel_epi64(out.as_mut_ptr().add(at) as *mut __m128i, moved);
            }
            at += m.count_ones() as usize;
        }
        at
    }
}

#[cfg(target_arch = "x86_64")]
mod sse2 {
    use core::arch::x86_64::*;

    use super::BLOCK;

    #[inline]
    #[target_feature(enable = "sse2")]
    fn load(b: &[u8; BLOCK], i: usize) -> __m128i {
        // SAFETY: `i < 4`, so the 16 bytes at `16 * i` are inside the 64-byte array;
        // `loadu` has no alignment requirement.
        unsafe { _mm_loadu_si128(b.as_ptr().add(16 * i) as *const __m128i) }
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    fn bits(m: __m128i, i: usize) -> u64 {
        (_mm_movemask_epi8(m) as u16 as u64) << (16 * i)
    }

    /// `v - lo <= span` as unsigned bytes.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn in_range(v: __m128i, lo: u8, span: u8) -> __m128i {
        let t = _mm_sub_epi8(v, _mm_set1_epi8(lo as i8));
        _mm_cmpeq_epi8(_mm_min_epu8(t, _mm_set1_epi8(span as i8)), t)
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    pub fn digits_and_words(b: &[u8; BLOCK]) -> (u64, u64) {
        let (mut digits, mut words) = (0, 0);
        for i in 0..4 {
            let v = load(b, i);
            let letter = in_range(_mm_or_si128(v, _mm_set1_epi8(0x20)), b'a', 25);
            let underscore = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'_' as i8));
            digits |= bits(in_range(v, b'0', 9), i);
            words |= bits(_mm_or_si128(letter, underscore), i);
        }
        (digits, words)
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    pub fn eq2(b: &[u8; BLOCK], x: u8, y: u8) -> (u64, u64) {
        let (mut xs, mut ys) = (0, 0);
        for i in 0..4 {
            let v = load(b, i);
            xs |= bits(_mm_cmpeq_epi8(v, _mm_set1_epi8(x as i8)), i);
            ys |= bits(_mm_cmpeq_epi8(v, _mm_set1_epi8(y as i8)), i);
        }
        (xs, ys)
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    pub fn string_stops(b: &[u8; BLOCK]) -> u64 {
        let mut stops = 0;
        for i in 0..4 {
            let v = load(b, i);
            let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
            let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
            let control = in_range(v, 0, 0x1f);
            stops |= bits(_mm_or_si128(_mm_or_si128(quote, backslash), control), i);
        }
        stops
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    pub fn eq_either16(b: &[u8; 16], x: u8, y: u8) -> u16 {
        // SAFETY: the sixteen bytes are the array; `loadu` has no alignment requirement.
        let v = unsafe { _mm_loadu_si128(b.as_ptr() as *const __m128i) };
        let m = _mm_or_si128(
            _mm_cmpeq_epi8(v, _mm_set1_epi8(x as i8)),
            _mm_cmpeq_epi8(v, _mm_set1_epi8(y as i8)),
        );
        _mm_movemask_epi8(m) as u16
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    pub fn whitespace(b: &[u8; BLOCK]) -> u64 {
        let mut ws = 0;
        for i in 0..4 {
            let v = load(b, i);
            // Tab, line feed, vertical tab, form feed, carriage return are 9..=13; the
            // vertical tab (11) is not ASCII whitespace.
            let controls =
                _mm_andnot_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(0x0b)), in_range(v, 0x09, 4));
            let space = _mm_cmpeq_epi8(v, _mm_set1_epi8(b' ' as i8));
            ws |= bits(_mm_or_si128(controls, space), i);
        }
        ws
    }
}

#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
mod portable {
    use super::BLOCK;

    fn mask(b: &[u8; BLOCK], f: impl Fn(u8) -> bool) -> u64 {
        b.iter()
            .enumerate()
            .fold(0, |m, (i, &x)| m | (u64::from(f(x)) << i))
    }

    pub fn digits_and_words(b: &[u8; BLOCK]) -> (u64, u64) {
        (
            mask(b, |x| x.is_ascii_digit()),
            mask(b, |x| x.is_ascii_alphabetic() || x == b'_'),
        )
    }

    pub fn eq2(b: &[u8; BLOCK], x: u8, y: u8) -> (u64, u64) {
        (mask(b, |c| c == x), mask(b, |c| c == y))
    }

    pub fn whitespace(b: &[u8; BLOCK]) -> u64 {
        mask(b, |x| x.is_ascii_whitespace())
    }

    pub fn string_stops(b: &[u8; BLOCK]) -> u64 {
        mask(b, |x| x == b'"' || x == b'\\' || x < 0x20)
    }

    pub fn compact(block: &[u8; BLOCK], mut keep: u64, out: &mut [u8], mut at: usize) -> usize {
        while keep != 0 {
            out[at] = block[keep.trailing_zeros() as usize];
            at += 1;
            keep &= keep - 1;
        }
        at
    }

    pub fn eq_either16(b: &[u8; 16], x: u8, y: u8) -> u16 {
        b.iter()
            .enumerate()
            .fold(0, |m, (i, &c)| m | (u16::from(c == x || c == y) << i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte value at every position of a block.
    fn blocks() -> impl Iterator<Item = [u8; BLOCK]> {
        (0..=255u8).map(|v| {
            let mut b = [0u8; BLOCK];
            for (i, x) in b.iter_mut().enumerate() {
                *x = v.wrapping_add((i as u8).wrapping_mul(97));
            }
            b
        })
    }

    #[test]
    fn masks_follow_the_bytewise_definitions() {
        for b in blocks() {
            let (d, w) = digits_and_words(&b);
            let (q, s) = eq2(&b, b'"', b'\\');
            let ws = whitespace(&b);
            let stops = string_stops(&b);
            assert_eq!(stops, portable::string_stops(&b));
            let head: &[u8; 16] = b[..16].try_into().unwrap();
            let either = eq_either16(head, b'"', b'\\');
            assert_eq!(either, portable::eq_either16(head, b'"', b'\\'));
            let (pd, pw) = portable::digits_and_words(&b);
            assert_eq!((d, w), (pd, pw));
            assert_eq!((q, s), portable::eq2(&b, b'"', b'\\'));
            assert_eq!(ws, portable::whitespace(&b));
            for (i, &x) in b.iter().enumerate() {
                assert_eq!(d >> i & 1 == 1, x.is_ascii_digit(), "{x:#x}");
                assert_eq!(w >> i & 1 == 1, x.is_ascii_alphabetic() || x == b'_');
                assert_eq!(q >> i & 1 == 1, x == b'"');
                assert_eq!(s >> i & 1 == 1, x == b'\\');
                assert_eq!(ws >> i & 1 == 1, x.is_ascii_whitespace(), "{x:#x}");
                assert_eq!(stops >> i & 1 == 1, x == b'"' || x == b'\\' || x < 0x20);
                if i < 16 {
                    assert_eq!(either >> i & 1 == 1, x == b'"' || x == b'\\');
                }
            }
        }
    }

    #[test]
    fn compact_keeps_the_marked_bytes_in_order() {
        for (k, b) in blocks().enumerate() {
            for keep in [0, u64::MAX, 0x8000_0000_0000_0001, 0x00ff_00f0_0f00_ff00]
                .into_iter()
                .chain((0..64).map(|r| {
                    (k as u64)
                        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                        .rotate_left(r)
                }))
            {
                let expected: Vec<u8> = (0..BLOCK)
                    .filter(|i| keep >> i & 1 == 1)
                    .map(|i| b[i])
                    .collect();
                let (mut out, mut plain) = ([0u8; 3 + BLOCK + 8], [0u8; 3 + BLOCK + 8]);
                let end = compact(&b, keep, &mut out, 3);
                assert_eq!(&out[3..end], &expected[..], "{keep:#x}");
                assert_eq!(portable::compact(&b, keep, &mut plain, 3), end);
                assert_eq!(&plain[3..end], &expected[..]);
            }
        }
    }

    #[test]
    #[should_panic(expected = "compact: out too short")]
    fn compact_refuses_a_start_past_the_output_however_large() {
        let mut out = [0u8; BLOCK + 8];
        compact(&[b'a'; BLOCK], 1, &mut out, usize::MAX - 70);
    }

    #[test]
    fn a_tail_block_is_padded_and_marked() {
        let s = b"0123456789";
        let mut pad = [7u8; BLOCK];
        let b = Block::at(s, 4, &mut pad);
        assert_eq!(b.valid, 0b111111);
        assert_eq!(&b.bytes[..6], b"456789");
        assert!(b.bytes[6..].iter().all(|&x| x == 0));
        let long = [b'a'; 100];
        assert_eq!(Block::at(&long, 0, &mut pad).valid, u64::MAX);
        assert_eq!(Block::at(&long, 64, &mut pad).valid, (1 << 36) - 1);
    }
}

//! Raw JSON: checking a document without building it, and reading text already checked.
//!
//! The hot path never builds a `serde_json::Value`: an event's fields are read straight
//! from its bytes, `args`, `result` and `text` are kept as their JSON text ([`Json`]),
//! and the fingerprints and text features are computed from that text.
//!
//! Guarantees: [`Scanner`] accepts only a conservative subset of JSON (well-formed, no
//! control characters in strings, no `\u` escapes of surrogates, nesting within its
//! limit) and gives up ([`Bail`]) on anything else, so that the caller falls back to
//! serde_json, which decides and explains; the readers of checked text never panic, even
//! on text that was not checked.

use std::borrow::Cow;

use crate::contract::classes::{eq2, eq_either16, string_stops, Block, BLOCK};

/// The fast pass gave up: serde_json decides (and says what is wrong, if anything).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bail;

/// A JSON value as its text (checked JSON), borrowed from the input or owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Json<'a>(pub Cow<'a, str>);

impl<'a> Json<'a> {
    pub fn borrowed(text: &'a str) -> Json<'a> {
        Json(Cow::Borrowed(text))
    }

    /// The text of a value serde_json built (the slow path).
    pub fn of_value(value: &serde_json::Value) -> Json<'static> {
        Json(Cow::Owned(value.to_string()))
    }

    /// A string as a JSON string literal.
    pub fn of_str(s: &str) -> Json<'static> {
        Json(Cow::Owned(
            serde_json::to_string(s).expect("a string always serializes"),
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_owned(self) -> Json<'static> {
        Json(Cow::Owned(self.0.into_owned()))
    }

    /// The value, built (tests and cold paths only).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or(serde_json::Value::Null)
    }
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `x` equal to `b` (exact for the lowest such byte).
#[inline]
pub(crate) fn bytes_equal(x: u64, b: u8) -> u64 {
    let v = x ^ (b as u64 * LO);
    v.wrapping_sub(LO) & !v & HI
}

#[inline]
fn load8(s: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(s[at..at + 8].try_into().expect("eight bytes"))
}

fn hex4(s: &[u8], at: usize) -> Option<u32> {
    let d = s.get(at..at + 4)?;
    let mut v = 0u32;
    for &c in d {
        v = v * 16 + (c as char).to_digit(16)?;
    }
    Some(v)
}

/// A string's span inside the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrSpan {
    /// The content, between the quotes.
    pub start: usize,
    pub end: usize,
    pub escaped: bool,
}

/// What kind of number a span holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumKind {
    /// `-?[0-9]+`.
    Integer,
    /// With a fraction or an exponent.
    Float,
}

/// The closing quote of a string whose content starts at `from` (or `s.len()` when there
/// is none), for text without control characters: sixteen bytes at a time over the first
/// 32 bytes (most strings are keys and short values) and over the last bytes of the text
/// (no block is padded), 64 bytes at a time in between, so that a long text with an
/// escape every line costs no more than one without. `escape(at)` is told of each `\`
/// that starts an escape and gives the escape's length, or gives up.
#[inline]
pub fn string_close(
    s: &[u8],
    from: usize,
    mut escape: impl FnMut(usize) -> Result<usize, Bail>,
) -> Result<usize, Bail> {
    let mut i = from;
    loop {
        while let Some(chunk) = s.get(i..i + 16) {
            if i >= from + 32 && i + BLOCK <= s.len() {
                break; // a long string: on by blocks
            }
            let chunk: &[u8; 16] = chunk.try_into().expect("sixteen bytes");
            let m = eq_either16(chunk, b'"', b'\\');
            if m == 0 {
                i += 16;
                continue;
            }
            let at = i + m.trailing_zeros() as usize;
            if s[at] == b'"' {
                return Ok(at);
            }
            i = at + escape(at)?;
        }
        if i + BLOCK > s.len() {
            break; // fewer than sixteen bytes left
        }
        while let Some(block) = s.get(i..i + BLOCK) {
            let block: &[u8; BLOCK] = block.try_into().expect("a whole block");
            let (quotes, backslashes) = eq2(block, b'"', b'\\');
            let mut stops = quotes | backslashes;
            let mut next = i + BLOCK;
            while stops != 0 {
                let p = stops.trailing_zeros() as usize;
                if quotes >> p & 1 == 1 {
                    return Ok(i + p);
                }
                let len = escape(i + p)?;
                if p + len >= BLOCK {
                    // The escape ends the block or runs past it: the next block starts
                    // right after it.
                    next = i + p + len;
                    break;
                }
                stops &= !(((1u64 << len) - 1) << p);
            }
            i = next;
        }
    }
    // The last fifteen bytes or fewer (the end of a line's last string): eight at a time,
    // then one by one.
    while i + 8 <= s.len() {
        let w = load8(s, i);
        let m = bytes_equal(w, b'"') | bytes_equal(w, b'\\');
        if m == 0 {
            i += 8;
            continue;
        }
        let at = i + (m.trailing_zeros() / 8) as usize;
        if s[at] == b'"' {
            return Ok(at);
        }
        i = at + escape(at)?;
    }
    while i < s.len() {
        match s[i] {
            b'"' => return Ok(i),
            b'\\' => i += escape(i)?,
            _ => i += 1,
        }
    }
    Ok(s.len())
}

/// The length of the escape at `s[at]` (a `\`) in checked text: `\u` escapes are six
/// bytes (checked text has no surrogate pairs), the others two.
#[inline]
pub fn checked_escape_len(s: &[u8], at: usize) -> usize {
    if s.get(at + 1) == Some(&b'u') {
        6
    } else {
        2
    }
}

/// A validating pass over a JSON document, giving up on anything unusual.
pub struct Scanner<'a> {
    pub s: &'a [u8],
    pub pos: usize,
    depth: usize,
    max_depth: usize,
    /// The 64-byte block (at a multiple of 64) whose string stops are in `stops`.
    stops_block: usize,
    /// The bytes of that block that end plain string content ([`string_stops`]): found
    /// once per block, so the many short keys and values in one cost a shift each.
    stops: u64,
}

impl<'a> Scanner<'a> {
    pub fn new(s: &'a [u8], max_depth: usize) -> Scanner<'a> {
        Scanner {
            s,
            pos: 0,
            depth: 0,
            max_depth,
            stops_block: usize::MAX,
            stops: 0,
        }
    }

    /// The first `"`, `\` or control character at or after `from`; `s.len()` if none.
    #[inline]
    fn next_stop(&mut self, mut from: usize) -> usize {
        loop {
            let block = from & !(BLOCK - 1);
            if block != self.stops_block {
                if block >= self.s.len() {
                    return self.s.len();
                }
                let mut pad = [0; BLOCK];
                let b = Block::at(self.s, block, &mut pad);
                self.stops = string_stops(b.bytes) & b.valid;
                self.stops_block = block;
            }
            let ahead = self.stops >> (from - block);
            if ahead != 0 {
                return from + ahead.trailing_zeros() as usize;
            }
            from = block + BLOCK;
        }
    }

    #[inline]
    pub fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.pos) {
            self.pos += 1;
        }
    }

    #[inline]
    pub fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    #[inline]
    pub fn eat(&mut self, b: u8) -> Result<(), Bail> {
        if self.peek() == Some(b) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Bail)
        }
    }

    pub fn at_end(&self) -> bool {
        self.pos == self.s.len()
    }

    /// A string at the cursor.
    #[inline]
    pub fn string(&mut self) -> Result<StrSpan, Bail> {
        self.eat(b'"')?;
        let start = self.pos;
        let mut escaped = false;
        let mut i = start;
        loop {
            let at = self.next_stop(i);
            match self.s.get(at) {
                Some(b'"') => {
                    self.pos = at + 1;
                    return Ok(StrSpan {
                        start,
                        end: at,
                        escaped,
                    });
                }
                Some(b'\\') => {
                    escaped = true;
                    i = at + valid_escape(self.s, at)?;
                }
                _ => return Err(Bail), // a control character, or the end
            }
        }
    }

    /// A number at the cursor (JSON's grammar).
    pub fn number(&mut self) -> Result<(usize, usize, NumKind), Bail> {
        let s = self.s;
        let start = self.pos;
        let mut i = start;
        if s.get(i) == Some(&b'-') {
            i += 1;
        }
        match s.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while s.get(i).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                }
            }
            _ => return Err(Bail),
        }
        let mut kind = NumKind::Integer;
        if s.get(i) == Some(&b'.') {
            i += 1;
            kind = NumKind::Float;
            if !s.get(i).is_some_and(u8::is_ascii_digit) {
                return Err(Bail);
            }
            while s.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
        let mut exponent = false;
        if let Some(b'e' | b'E') = s.get(i) {
            i += 1;
            kind = NumKind::Float;
            exponent = true;
            if let Some(b'+' | b'-') = s.get(i) {
                i += 1;
            }
            if !s.get(i).is_some_and(u8::is_ascii_digit) {
                return Err(Bail);
            }
            while s.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
        // serde_json refuses a number beyond f64's range ("number out of range"), so
        // this one gives up on it too (found by the fuzzer), and leaves the last
        // stretch below f64::MAX, where the two round differently, to serde_json. Only
        // an exponent or more than 300 digits can get there: the common number is not
        // parsed here.
        if (exponent || i - start > 300)
            && std::str::from_utf8(&s[start..i])
                .ok()
                .and_then(|n| n.parse::<f64>().ok())
                .is_none_or(|v| v.abs() >= 1e308)
        {
            return Err(Bail);
        }
        self.pos = i;
        Ok((start, i, kind))
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), Bail> {
        if self.s.get(self.pos..self.pos + word.len()) == Some(word) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(Bail)
        }
    }

    /// `null` at the cursor, if it is there.
    pub fn null(&mut self) -> bool {
        self.literal(b"null").is_ok()
    }

    /// `true` or `false` at the cursor.
    pub fn boolean(&mut self) -> Result<bool, Bail> {
        match self.peek() {
            Some(b't') => self.literal(b"true").map(|_| true),
            Some(b'f') => self.literal(b"false").map(|_| false),
            _ => Err(Bail),
        }
    }

    /// Enters an object or an array (counting nesting as the limit does).
    pub fn open(&mut self, b: u8) -> Result<(), Bail> {
        self.eat(b)?;
        self.depth += 1;
        if self.depth > self.max_depth {
            return Err(Bail);
        }
        Ok(())
    }

    pub fn close(&mut self) {
        self.depth -= 1;
    }

    /// Any value at the cursor; returns where it starts.
    pub fn value(&mut self) -> Result<usize, Bail> {
        let start = self.pos;
        match self.peek().ok_or(Bail)? {
            b'"' => {
                self.string()?;
            }
            b'{' => {
                self.open(b'{')?;
                self.ws();
                if self.peek() == Some(b'}') {
                    self.pos += 1;
                } else {
                    loop {
                        self.ws();
                        self.string()?;
                        self.ws();
                        self.eat(b':')?;
                        self.ws();
                        self.value()?;
                        self.ws();
                        match self.peek() {
                            Some(b',') => self.pos += 1,
                            Some(b'}') => {
                                self.pos += 1;
                                break;
                            }
                            _ => return Err(Bail),
                        }
                    }
                }
                self.close();
            }
            b'[' => {
                self.open(b'[')?;
                self.ws();
                if self.peek() == Some(b']') {
                    self.pos += 1;
                } else {
                    loop {
                        self.ws();
                        self.value()?;
                        self.ws();
                        match self.peek() {
                            Some(b',') => self.pos += 1,
                            Some(b']') => {
                                self.pos += 1;
                                break;
                            }
                            _ => return Err(Bail),
                        }
                    }
                }
                self.close();
            }
            b't' | b'f' => {
                self.boolean()?;
            }
            b'n' => self.literal(b"null")?,
            _ => {
                self.number()?;
            }
        }
        Ok(start)
    }
}

/// The length of the escape at `s[at]` (a `\`) if serde_json reads it as this module
/// does: a simple escape, or `\u` with four hex digits that is not a surrogate.
#[inline]
fn valid_escape(s: &[u8], at: usize) -> Result<usize, Bail> {
    match s.get(at + 1) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(2),
        Some(b'u') => {
            let c = hex4(s, at + 2).ok_or(Bail)?;
            if (0xD800..=0xDFFF).contains(&c) {
                return Err(Bail); // surrogates: serde_json decides
            }
            Ok(6)
        }
        _ => Err(Bail),
    }
}

/// Decodes the escape at `s[i]` (a `\`): the character and the escape's length.
fn escape_at(s: &[u8], i: usize) -> Option<(char, usize)> {
    let c = match s.get(i + 1)? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let hi = hex4(s, i + 2)?;
            if (0xD800..0xDC00).contains(&hi) && s.get(i + 6) == Some(&b'\\') {
                let lo = hex4(s, i + 8)?;
                if (0xDC00..0xE000).contains(&lo) {
                    let c = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                    return Some((char::from_u32(c)?, 12));
                }
            }
            return Some((char::from_u32(hi).unwrap_or('\u{fffd}'), 6));
        }
        _ => return None,
    };
    Some((c, 2))
}

/// Appends the unescaped content of a JSON string (the text between its quotes).
pub fn unescape_into(content: &str, out: &mut String) {
    let s = content.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while let Some(off) = memchr::memchr(b'\\', &s[i..]) {
        let at = i + off;
        out.push_str(&content[start..at]);
        match escape_at(s, at) {
            Some((c, len)) => {
                out.push(c);
                i = at + len;
            }
            None => {
                out.push('\\');
                i = at + 1;
            }
        }
        start = i;
    }
    out.push_str(&content[start..]);
}

/// The unescaped content of a JSON string: borrowed when it has no escapes.
pub fn unescape(content: &str, escaped: bool) -> Cow<'_, str> {
    if !escaped {
        return Cow::Borrowed(content);
    }
    let mut out = String::with_capacity(content.len());
    unescape_into(content, &mut out);
    Cow::Owned(out)
}

/// The content of a JSON string literal (`"…"`), if the text is one.
pub fn string_content(literal: &str) -> Option<&str> {
    let b = literal.as_bytes();
    (b.len() >= 2 && b[0] == b'"' && b[b.len() - 1] == b'"').then(|| &literal[1..literal.len() - 1])
}

/// Whether a string's unescaped text has a letter outside markup tags (`<output>`):
/// escapes are read as the characters they stand for.
pub fn content_has_words(content: &[u8], in_tag: &mut bool) -> bool {
    let mut i = 0;
    while i < content.len() {
        let (c, len) = if content[i] == b'\\' {
            match escape_at(content, i) {
                Some((c, len)) => (c, len),
                None => ('\\', 1),
            }
        } else {
            (content[i] as char, 1) // a byte of a UTF-8 sequence is never ASCII
        };
        match c {
            '<' => *in_tag = true,
            '>' => *in_tag = false,
            c if !*in_tag && c.is_ascii_alphabetic() => return true,
            _ => {}
        }
        i += len;
    }
    false
}

/// Skips any value of checked text at `pos`; returns the position after it.
pub fn skip(s: &[u8], pos: usize) -> usize {
    let mut i = pos;
    let mut depth = 0usize;
    loop {
        match s.get(i) {
            None => return s.len(),
            Some(b'"') => {
                let close =
                    string_close(s, i + 1, |at| Ok(checked_escape_len(s, at))).unwrap_or(s.len());
                if close >= s.len() {
                    return s.len();
                }
                i = close + 1;
            }
            Some(b'{' | b'[') => {
                depth += 1;
                i += 1;
            }
            Some(b'}' | b']') => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Some(b',' | b':' | b' ' | b'\t' | b'\n' | b'\r') if depth > 0 => i += 1,
            Some(_) if depth > 0 => i += 1,
            Some(_) => {
                // A scalar at the top: up to the next delimiter.
                while let Some(b) = s.get(i) {
                    if matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                        break;
                    }
                    i += 1;
                }
                return i;
            }
        }
        if depth == 0 {
            return i;
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::strategy::{Just, Strategy};

    use super::*;

    fn scan(s: &str) -> Result<usize, Bail> {
        let mut sc = Scanner::new(s.as_bytes(), 64);
        sc.ws();
        sc.value()?;
        sc.ws();
        if sc.at_end() {
            Ok(sc.pos)
        } else {
            Err(Bail)
        }
    }

    #[test]
    fn accepts_what_serde_json_accepts_in_the_subset() {
        for ok in [
            r#"{"a":[1,-2.5e3,true,false,null,"x\n\u00e9"],"b":{}}"#,
            " [ ] ",
            r#""é€😀""#,
            "0",
            "-0.0e-0",
        ] {
            assert!(scan(ok).is_ok(), "{ok}");
            assert!(
                serde_json::from_str::<serde_json::Value>(ok).is_ok(),
                "{ok}"
            );
        }
    }

    #[test]
    fn gives_up_on_anything_else() {
        for bad in [
            "{",
            "[1,]",
            "01",
            "1.",
            "-",
            r#"{"a" 1}"#,
            "\"a\u{1}\"",
            r#""\x""#,
            r#""\ud800""#,
            "nul",
            "[1 2]",
            "{}x",
        ] {
            assert_eq!(scan(bad), Err(Bail), "{bad:?}");
        }
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        assert_eq!(scan(&deep), Err(Bail));
        let ok = format!("{}{}", "[".repeat(64), "]".repeat(64));
        assert!(scan(&ok).is_ok());
    }

    proptest::proptest! {
        /// Strings read one after another, each block's stops found once and shared by
        /// the strings in it (strings across block edges, escapes, control characters):
        /// every string's span is its content, and the first one with a control character
        /// gives up, as serde_json refuses the document.
        #[test]
        fn scanner_reads_strings_one_after_another(
            strings in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::prop_oneof![
                        "[a-z é]{0,70}".prop_map(String::from),
                        r#"\\[nt"\\/]"#.prop_map(String::from),
                        r"\\u00[0-9a-f]{2}".prop_map(String::from),
                        proptest::prop_oneof![Just("\u{1}"), Just("\n"), Just("\u{1f}")].prop_map(String::from),
                    ],
                    0..6,
                )
                .prop_map(|parts| parts.concat()),
                1..12,
            ),
        ) {
            let doc = format!(
                "[{}]",
                strings.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(",")
            );
            let mut sc = Scanner::new(doc.as_bytes(), 64);
            sc.open(b'[').unwrap();
            for (i, content) in strings.iter().enumerate() {
                if i > 0 {
                    sc.eat(b',').unwrap();
                }
                let got = sc.string();
                if content.bytes().any(|b| b < 0x20) {
                    proptest::prop_assert_eq!(got, Err(Bail));
                    proptest::prop_assert!(serde_json::from_str::<serde_json::Value>(&doc).is_err());
                    return Ok(());
                }
                let span = got.unwrap();
                proptest::prop_assert_eq!(&doc[span.start..span.end], content.as_str());
                proptest::prop_assert_eq!(span.escaped, content.contains('\\'));
            }
            proptest::prop_assert_eq!(scan(&doc), Ok(doc.len()));
        }
    }

    /// A string's closing quote found byte by byte, as the definition.
    fn close_bytewise(s: &[u8], from: usize) -> usize {
        let mut i = from;
        while i < s.len() {
            match s[i] {
                b'"' => return i,
                b'\\' => i += checked_escape_len(s, i),
                _ => i += 1,
            }
        }
        s.len()
    }

    proptest::proptest! {
        /// Blocks, escapes across their edges, the short path: the quote the byte-by-byte
        /// walk finds, and every escape on the way told once.
        #[test]
        fn string_close_finds_the_closing_quote(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    "[a-z ]{0,70}".prop_map(String::from),
                    proptest::prop_oneof![r#"\\[nt"\\/]"#, r"\\u00[0-9a-f]{2}"].prop_map(String::from),
                ],
                0..12,
            ),
            // A close, none, or an escape cut off by the end of the text.
            end in proptest::prop_oneof![r#"""#, r#"x""#, "", r"\\", r"\\u00"],
            // At the start, a few bytes in, or anywhere up to just past the end.
            from in proptest::prop_oneof![0usize..3, 0usize..1000],
        ) {
            let text = format!("{}{end}", parts.concat());
            let s = text.as_bytes();
            let from = from.min(s.len() + 1);
            let mut told = Vec::new();
            let got = string_close(s, from, |at| {
                told.push(at);
                Ok(checked_escape_len(s, at))
            });
            proptest::prop_assert_eq!(got, Ok(close_bytewise(s, from)));
            let mut expected = Vec::new();
            let mut i = from;
            while i < s.len() && s[i] != b'"' {
                if s[i] == b'\\' {
                    expected.push(i);
                    i += checked_escape_len(s, i);
                } else {
                    i += 1;
                }
            }
            proptest::prop_assert_eq!(told, expected);
        }
    }

    #[test]
    fn unescapes_as_serde_json_does() {
        let lit = r#""a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00z""#;
        let expected: String = serde_json::from_str(lit).unwrap();
        let mut out = String::new();
        unescape_into(string_content(lit).unwrap(), &mut out);
        assert_eq!(out, expected);
    }

    #[test]
    fn words_are_letters_outside_tags_with_escapes_read() {
        let w = |s: &str| content_has_words(s.as_bytes(), &mut false);
        assert!(!w(r"<returncode>1</returncode>\n<output>\n</output>"));
        assert!(w(r"<output>\nFAILED</output>"));
        assert!(!w(r"\n\t42"));
        assert!(w(r"\u0041"));
        assert!(!w(r"\u003cx\u003e"));
    }

    #[test]
    fn skips_checked_values() {
        let s = br#"{"a":"}\"","b":[1,{"c":2}]} ,"#;
        assert_eq!(skip(s, 0), s.len() - 2);
        assert_eq!(skip(b"123,", 0), 3);
        assert_eq!(skip(br#""x\"y","#, 0), 6);
    }
}

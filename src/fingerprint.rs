//! Fingerprints (DESIGN §2): SHA-256 over canonical JSON with volatile keys and value
//! patterns erased, so that "the same action" and "the same result" mean what a person
//! would mean.
//!
//! Guarantees: a fingerprint depends only on the value (object key order, volatile keys,
//! UUIDs and RFC 3339 timestamps inside result strings do not change it; digits elsewhere
//! do), not on how its JSON was written (whitespace, escapes, duplicate keys: the last
//! wins, as in any JSON object); no input panics. Only the resulting digests leave this
//! module.
//!
//! How: the canonical JSON is written straight from the value's text into a reusable
//! buffer ([`Scratch`]) — members of an object sorted by key, strings re-escaped only
//! when they hold escapes other than the canonical ones — and hashed in one call. No
//! `serde_json::Value` is built; the tests hold the result to a tree walk over
//! serde_json's values for any JSON.

use crate::content::ContentSample;
use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use sha2::{Digest as _, Sha256};

use crate::hash::Shape;
use crate::json::{checked_escape_len, content_has_words, skip, string_close, unescape_into, Json};

/// A 128-bit truncated SHA-256 digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Fp(pub u128);

impl Fp {
    /// The first 64 bits, which is what session state keeps: within one session's
    /// bounded window a 64-bit collision is out of reach (2^-64 per pair).
    pub fn short(self) -> u64 {
        (self.0 >> 64) as u64
    }

    fn of(canonical: &[u8]) -> Fp {
        let d = Sha256::digest(canonical);
        let mut b = [0u8; 16];
        b.copy_from_slice(&d[..16]);
        Fp(u128::from_be_bytes(b))
    }
}

/// Default volatile argument keys (DESIGN §2).
pub const DEFAULT_VOLATILE_ARG_KEYS: &[&str] = &[
    "timestamp",
    "ts",
    "nonce",
    "request_id",
    "trace_id",
    "span_id",
    "idempotency_key",
    "task_progress",
];

/// Volatile result keys on top of the argument keys (DESIGN §2).
pub const DEFAULT_EXTRA_VOLATILE_RESULT_KEYS: &[&str] = &[
    "time",
    "created_at",
    "updated_at",
    "elapsed_ms",
    "duration_ms",
    "latency_ms",
    "pid",
    "cwd",
    "session_id",
    "message_id",
    "run_id",
    "receipt",
];

/// Words that make a result read as "still waiting".
pub const DEFAULT_PENDING_TERMS: &[&str] = &[
    "running",
    "pending",
    "queued",
    "in progress",
    "in_progress",
    "in-progress",
    "starting",
    "waiting",
    "not ready",
    "scheduled",
];

/// Result strings longer than this are not scanned for pending terms: a long text that
/// happens to contain "running" is content, not a status.
pub const PENDING_SCAN_MAX_BYTES: usize = 256;

/// Built-in volatile value patterns inside result strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltinPattern {
    Uuid,
    Rfc3339,
}

impl BuiltinPattern {
    pub fn parse(name: &str) -> Option<BuiltinPattern> {
        match name {
            "uuid" => Some(BuiltinPattern::Uuid),
            "rfc3339" => Some(BuiltinPattern::Rfc3339),
            _ => None,
        }
    }
}

/// A set of keys matched case-, `_`- and `-`-insensitively.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    normalized: Vec<Box<[u8]>>,
    /// Bit n set: some key normalizes to n bytes (n < 64), a cheap first test.
    lengths: u64,
}

fn normalize_key(key: &[u8]) -> impl Iterator<Item = u8> + '_ {
    key.iter()
        .copied()
        .filter(|b| *b != b'_' && *b != b'-')
        .map(|b| b.to_ascii_lowercase())
}

impl KeySet {
    pub fn new<S: AsRef<str>>(keys: &[S]) -> KeySet {
        let mut normalized: Vec<Box<[u8]>> = keys
            .iter()
            .map(|k| {
                normalize_key(k.as_ref().as_bytes())
                    .collect::<Vec<u8>>()
                    .into_boxed_slice()
            })
            .collect();
        normalized.sort();
        normalized.dedup();
        let lengths = normalized.iter().fold(0u64, |m, k| {
            m | 1u64.checked_shl(k.len() as u32).unwrap_or(0)
        });
        KeySet {
            normalized,
            lengths,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.normalized.is_empty()
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        let len = normalize_key(key).count();
        if len < 64 && self.lengths & (1 << len) == 0 {
            return false;
        }
        self.normalized
            .iter()
            .any(|k| k.len() == len && k.iter().copied().eq(normalize_key(key)))
    }
}

/// Everything needed to fingerprint actions and results; built once from configuration.
#[derive(Debug, Clone)]
pub struct Fingerprinter {
    arg_keys: KeySet,
    result_keys: KeySet,
    builtins: Vec<BuiltinPattern>,
    custom_patterns: Vec<regex::bytes::Regex>,
    pending: Option<AhoCorasick>,
    ignore_args: rustc_hash::FxHashMap<String, KeySet>,
}

/// Configuration of a [`Fingerprinter`].
#[derive(Debug, Clone)]
pub struct FingerprintSpec {
    pub volatile_arg_keys: Vec<String>,
    pub volatile_result_keys: Vec<String>,
    pub builtin_patterns: Vec<BuiltinPattern>,
    pub custom_patterns: Vec<regex::bytes::Regex>,
    pub pending_terms: Vec<String>,
    pub ignore_args: Vec<(String, Vec<String>)>,
}

impl Default for FingerprintSpec {
    fn default() -> Self {
        let args: Vec<String> = DEFAULT_VOLATILE_ARG_KEYS
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut results = args.clone();
        results.extend(
            DEFAULT_EXTRA_VOLATILE_RESULT_KEYS
                .iter()
                .map(|s| s.to_string()),
        );
        FingerprintSpec {
            volatile_arg_keys: args,
            volatile_result_keys: results,
            builtin_patterns: vec![BuiltinPattern::Uuid, BuiltinPattern::Rfc3339],
            custom_patterns: Vec::new(),
            pending_terms: DEFAULT_PENDING_TERMS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            ignore_args: Vec::new(),
        }
    }
}

/// The digest of an action, and its `args.action` when that is a string (a tool can be
/// classed by `tool.action`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionPrint<'a> {
    pub digest: Fp,
    pub action_arg: Option<std::borrow::Cow<'a, str>>,
}

/// The digest of a result plus what its content says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultPrint {
    pub digest: Fp,
    /// The digest's text with every number that stands on its own read as any number:
    /// results that differ only in counters, timings or line numbers share it (not a
    /// DESIGN §2 fingerprint: it never leaves the session's state).
    pub shape: u32,
    /// The result reads as a pending state (`running`, `queued`, …).
    pub pending: bool,
    /// Some string of the result has a letter outside markup tags (`<output>`): an empty
    /// output wrapped in a runtime's markup, or a bare exit code, says nothing.
    pub has_words: bool,
}

/// Reusable buffers for fingerprinting, so that it allocates nothing once they have grown.
#[derive(Debug, Default)]
pub struct Scratch {
    canonical: Vec<u8>,
    members: Vec<Member>,
    keys: Vec<u8>,
    text: String,
}

impl Default for Fingerprinter {
    fn default() -> Self {
        Fingerprinter::new(&FingerprintSpec::default())
    }
}

impl Fingerprinter {
    pub fn new(spec: &FingerprintSpec) -> Fingerprinter {
        let pending = if spec.pending_terms.is_empty() {
            None
        } else {
            AhoCorasickBuilder::new()
                .ascii_case_insensitive(true)
                .match_kind(MatchKind::LeftmostLongest)
                .build(&spec.pending_terms)
                .ok()
        };
        Fingerprinter {
            arg_keys: KeySet::new(&spec.volatile_arg_keys),
            result_keys: KeySet::new(&spec.volatile_result_keys),
            builtins: spec.builtin_patterns.clone(),
            custom_patterns: spec.custom_patterns.clone(),
            pending,
            ignore_args: spec
                .ignore_args
                .iter()
                .map(|(tool, keys)| (tool.clone(), KeySet::new(keys)))
                .collect(),
        }
    }

    /// The action fingerprint: SHA-256 over the canonical JSON of `[tool, args]`.
    pub fn action<'a>(
        &self,
        tool: &str,
        args: Option<&'a Json>,
        scratch: &mut Scratch,
    ) -> ActionPrint<'a> {
        let mut c = Canon::new(scratch, &self.arg_keys, self.ignore_args.get(tool));
        c.put(b"[");
        c.escape_string(tool.as_bytes());
        c.put(b",");
        let mut action_arg = None;
        match args {
            Some(a) => {
                let text = a.as_str();
                c.document(text.as_bytes(), true);
                action_arg = c.action_arg.take().map(|(start, end)| {
                    crate::json::unescape(&text[start..end], text[start..end].contains('\\'))
                });
            }
            None => c.put(b"null"),
        }
        c.put(b"]");
        ActionPrint {
            digest: Fp::of(&scratch.canonical),
            action_arg,
        }
    }

    /// The result digest: SHA-256 over the canonical JSON of `result` (volatile keys and
    /// value patterns erased), or over the emitter's own `result_digest`.
    pub fn result(
        &self,
        result: Option<&Json>,
        given_digest: Option<&str>,
        scratch: &mut Scratch,
    ) -> ResultPrint {
        let mut c = Canon::new(scratch, &self.result_keys, None);
        c.words = Some(false);
        if let Some(d) = given_digest {
            c.put(b"digest:");
            for b in d.bytes() {
                c.put(&[b.to_ascii_lowercase()]);
            }
            // The emitter's digest stands for a result we cannot read: judged as one
            // that says something.
            c.words = Some(true);
        } else {
            c.patterns = Some(Patterns {
                builtins: &self.builtins,
                custom: &self.custom_patterns,
            });
            c.pending = self.pending.as_ref().map(|ac| (ac, PendingScan::default()));
            match result {
                Some(r) => c.document(r.as_str().as_bytes(), false),
                None => c.put(b"null"),
            }
        }
        let pending = c
            .pending
            .as_ref()
            .is_some_and(|(_, scan)| scan.status.unwrap_or(scan.any_short));
        let has_words = c.words.unwrap_or(false);
        // The shape reads the canonical text in one pass (escapes as separators).
        let mut shape = Shape::default();
        shape.json(&scratch.canonical);
        ResultPrint {
            digest: Fp::of(&scratch.canonical),
            shape: shape.finish(),
            pending,
            has_words,
        }
    }
}

impl Scratch {
    /// The lines the last result fingerprinted showed, sampled (see [`crate::content`]);
    /// its first [`CONTENT_BYTES_MAX`] bytes are read.
    pub fn content_sample(&self) -> ContentSample {
        let c = &self.canonical;
        if c.len() <= CONTENT_BYTES_MAX {
            return ContentSample::of_canonical(c);
        }
        // Cut at the last line break before the limit: a line cut short would read as
        // new wherever the cut falls.
        let head = &c[..CONTENT_BYTES_MAX];
        let end = memchr::memmem::rfind(head, b"\\n").unwrap_or(head.len());
        ContentSample::of_canonical(&head[..end])
    }
}

/// Bytes of a result's canonical text read for its content sample: what an agent reads
/// of a long output is its beginning, and the work per call stays bounded.
pub const CONTENT_BYTES_MAX: usize = 8 * 1024;

/// Whether any string value (not a key) of a JSON text says something in words.
fn words_of(s: &[u8]) -> bool {
    let mut i = 0;
    while i < s.len() {
        if s[i] != b'"' {
            i += 1;
            continue;
        }
        let (end, _) = string_end(s, i + 1);
        let is_key = s.get(Canon::ws(s, end + 1)) == Some(&b':');
        if !is_key && content_has_words(&s[i + 1..end], &mut false) {
            return true;
        }
        i = end + 1;
    }
    false
}

/// What a string's escapes are, learnt while its end is looked for.
#[derive(Debug, Clone, Copy, Default)]
struct Escapes {
    any: bool,
    /// Some escape is one canonical JSON writes otherwise (`\/`, `\u…`).
    non_canonical: bool,
    /// Some escape stands for a letter or a digit (only `\"`, `\\`, `\n`, `\r`, `\t` do
    /// not).
    non_neutral: bool,
    /// Bytes the escapes take beyond the characters they stand for.
    shrink: usize,
}

/// The closing quote of a string whose content starts at `from` (checked text), and what
/// its escapes are.
#[inline]
fn string_end(s: &[u8], from: usize) -> (usize, Escapes) {
    let mut e = Escapes::default();
    let end = string_close(s, from, |at| {
        let c = s.get(at + 1).copied().unwrap_or(0);
        let len = checked_escape_len(s, at);
        e.any = true;
        e.non_canonical |= !CANONICAL_ESCAPES.contains(&c);
        e.non_neutral |= !NEUTRAL_ESCAPES.contains(&c);
        let char_len = if c == b'u' {
            std::str::from_utf8(&s[(at + 2).min(s.len())..(at + 6).min(s.len())])
                .ok()
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .and_then(char::from_u32)
                .map_or(3, char::len_utf8)
        } else {
            1
        };
        e.shrink += len - char_len;
        Ok(len)
    })
    .unwrap_or(s.len());
    (end.min(s.len()), e)
}

/// One member of an object being written: where its key and value are.
#[derive(Debug, Clone, Copy)]
struct Member {
    /// The key's content (between its quotes) in the text, or its unescaped bytes in the
    /// scratch key buffer.
    key: (u32, u32),
    key_unescaped: bool,
    value: (u32, u32),
}

/// Writes canonical JSON into the scratch buffer, and reads what the result says.
struct Canon<'s, 'k> {
    out: &'s mut Vec<u8>,
    members: &'s mut Vec<Member>,
    keybuf: &'s mut Vec<u8>,
    text: &'s mut String,
    keys: &'k KeySet,
    extra: Option<&'k KeySet>,
    patterns: Option<Patterns<'k>>,
    pending: Option<(&'k AhoCorasick, PendingScan)>,
    /// Whether some string says something (results only).
    words: Option<bool>,
    /// Where `args.action` is in the text (its content), when a string (actions only).
    action_arg: Option<(usize, usize)>,
}

fn is_plain_number(n: &[u8]) -> bool {
    let digits = n.strip_prefix(b"-").unwrap_or(n);
    match digits {
        [b'0'] => n.len() == 1,
        [b'1'..=b'9', rest @ ..] => rest.len() <= 17 && rest.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// The escapes canonical JSON writes itself (any other is re-written).
const CANONICAL_ESCAPES: &[u8] = b"\"\\bfnrt";
/// The escapes that read as no letter and no digit, so that volatile patterns can be
/// matched on the escaped text as on the unescaped one.
const NEUTRAL_ESCAPES: &[u8] = b"\"\\nrt";

impl<'s, 'k> Canon<'s, 'k> {
    fn new(scratch: &'s mut Scratch, keys: &'k KeySet, extra: Option<&'k KeySet>) -> Canon<'s, 'k> {
        scratch.canonical.clear();
        scratch.members.clear();
        scratch.keys.clear();
        Canon {
            out: &mut scratch.canonical,
            members: &mut scratch.members,
            keybuf: &mut scratch.keys,
            text: &mut scratch.text,
            keys,
            extra,
            patterns: None,
            pending: None,
            words: None,
            action_arg: None,
        }
    }

    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.out.extend_from_slice(b);
    }

    /// Unescaped text, canonically escaped.
    fn escape_body(&mut self, s: &[u8]) {
        let mut start = 0;
        for (i, &b) in s.iter().enumerate() {
            let esc: &[u8] = match b {
                b'"' => b"\\\"",
                b'\\' => b"\\\\",
                b'\n' => b"\\n",
                b'\r' => b"\\r",
                b'\t' => b"\\t",
                0x08 => b"\\b",
                0x0c => b"\\f",
                0..=0x1f => {
                    self.put(&s[start..i]);
                    let hex = b"0123456789abcdef";
                    self.put(&[
                        b'\\',
                        b'u',
                        b'0',
                        b'0',
                        hex[(b >> 4) as usize],
                        hex[(b & 15) as usize],
                    ]);
                    start = i + 1;
                    continue;
                }
                _ => continue,
            };
            self.put(&s[start..i]);
            self.put(esc);
            start = i + 1;
        }
        self.put(&s[start..]);
    }

    fn escape_string(&mut self, s: &[u8]) {
        self.put(b"\"");
        self.escape_body(s);
        self.put(b"\"");
    }

    #[inline]
    fn ws(s: &[u8], mut i: usize) -> usize {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = s.get(i) {
            i += 1;
        }
        i
    }

    /// A whole document (the text of `args` or `result`).
    fn document(&mut self, s: &[u8], top_is_args: bool) {
        let start = Self::ws(s, 0);
        self.value(s, start, top_is_args);
    }

    /// The value at `i`; returns the position after it.
    fn value(&mut self, s: &[u8], i: usize, args_top: bool) -> usize {
        match s.get(i) {
            Some(b'"') => {
                let (end, escapes) = string_end(s, i + 1);
                self.string_value(&s[i + 1..end], escapes);
                end + 1
            }
            Some(b'{') => self.object(s, i, args_top),
            Some(b'[') => {
                self.put(b"[");
                let mut j = Self::ws(s, i + 1);
                let mut first = true;
                while let Some(&b) = s.get(j) {
                    if b == b']' {
                        j += 1;
                        break;
                    }
                    if b == b',' {
                        j = Self::ws(s, j + 1);
                        continue;
                    }
                    if !first {
                        self.put(b",");
                    }
                    first = false;
                    j = Self::ws(s, self.value(s, j, false));
                }
                self.put(b"]");
                j
            }
            Some(_) => {
                let end = skip(s, i);
                let token = &s[i..end];
                if token[0] == b'-' || token[0].is_ascii_digit() {
                    self.number(token);
                } else {
                    self.put(token); // true, false, null
                }
                end
            }
            None => {
                self.put(b"null");
                i
            }
        }
    }

    fn number(&mut self, token: &[u8]) {
        if is_plain_number(token) {
            self.put(token);
            return;
        }
        // Written as serde_json writes the number it reads (`1.50` is `1.5`).
        use std::fmt::Write as _;
        let mut buf = NumBuf::default();
        match std::str::from_utf8(token)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Number>(t).ok())
        {
            Some(n) => {
                let _ = write!(buf, "{n}");
                self.put(buf.as_bytes());
            }
            None => self.put(token),
        }
    }

    /// Reads the members of the object that opens at `open` onto `self.members` (keys
    /// with escapes unescaped into `self.keybuf`); returns where the object ends.
    fn scan_members(&mut self, s: &[u8], open: usize) -> usize {
        let mut j = Self::ws(s, open + 1);
        while let Some(&b) = s.get(j) {
            match b {
                b'}' => {
                    j += 1;
                    break;
                }
                b',' => {
                    j = Self::ws(s, j + 1);
                    continue;
                }
                b'"' => {}
                _ => {
                    j += 1;
                    continue;
                }
            }
            let (key_end, key_escapes) = string_end(s, j + 1);
            let mut key = (j as u32 + 1, key_end as u32);
            let key_unescaped = key_escapes.any;
            if key_unescaped {
                let content = std::str::from_utf8(&s[j + 1..key_end]).unwrap_or("");
                self.text.clear();
                unescape_into(content, self.text);
                let at = self.keybuf.len() as u32;
                self.keybuf.extend_from_slice(self.text.as_bytes());
                key = (at, self.keybuf.len() as u32);
            }
            let colon = Self::ws(s, key_end + 1);
            let v = Self::ws(s, colon + 1);
            let v_end = skip(s, v);
            self.members.push(Member {
                key,
                key_unescaped,
                value: (v as u32, v_end as u32),
            });
            j = Self::ws(s, v_end);
        }
        j
    }

    fn object(&mut self, s: &[u8], open: usize, args_top: bool) -> usize {
        let base = self.members.len();
        let key_base = self.keybuf.len();
        let j = self.scan_members(s, open);
        // serde_json's map: sorted by key, the last of equal keys wins.
        let keybuf = &*self.keybuf;
        let key_of = |m: &Member| -> &[u8] {
            let (a, b) = (m.key.0 as usize, m.key.1 as usize);
            if m.key_unescaped {
                &keybuf[a..b]
            } else {
                &s[a..b]
            }
        };
        self.members[base..].sort_by(|a, b| key_of(a).cmp(key_of(b)));
        let end = self.members.len();
        self.put(b"{");
        let mut first = true;
        for i in base..end {
            let m = self.members[i];
            let key_at = |m: &Member| (m.key.0 as usize, m.key.1 as usize);
            let (a, b) = key_at(&m);
            if i + 1 < end {
                let next = self.members[i + 1];
                let (na, nb) = key_at(&next);
                let same = match (m.key_unescaped, next.key_unescaped) {
                    (false, false) => s[a..b] == s[na..nb],
                    (true, true) => self.keybuf[a..b] == self.keybuf[na..nb],
                    (true, false) => self.keybuf[a..b] == s[na..nb],
                    (false, true) => s[a..b] == self.keybuf[na..nb],
                };
                if same {
                    continue; // a later duplicate replaces this one
                }
            }
            if m.key_unescaped {
                // Rare (a key with escapes): its bytes leave the scratch buffer.
                let key = self.keybuf[a..b].to_vec();
                self.member(s, &m, &key, &mut first, args_top);
            } else {
                self.member(s, &m, &s[a..b], &mut first, args_top);
            }
        }
        self.put(b"}");
        self.members.truncate(base);
        self.keybuf.truncate(key_base);
        j
    }

    fn member(&mut self, s: &[u8], m: &Member, key: &[u8], first: &mut bool, args_top: bool) {
        let (v, v_end) = (m.value.0 as usize, m.value.1 as usize);
        let is_string = s.get(v) == Some(&b'"');
        if args_top && key == b"action" && is_string {
            self.action_arg = Some((v + 1, v_end - 1));
        }
        if self.keys.contains(key) || self.extra.is_some_and(|e| e.contains(key)) {
            // Erased from the digest, but what it says still counts as words.
            if self.words == Some(false) && words_of(&s[v..v_end]) {
                self.words = Some(true);
            }
            return;
        }
        if !*first {
            self.put(b",");
        }
        *first = false;
        if m.key_unescaped {
            self.escape_string(key);
        } else {
            self.put(b"\"");
            self.put(key);
            self.put(b"\"");
        }
        self.put(b":");
        if is_string && is_status_key(key) {
            if let Some((ac, scan)) = self.pending.as_mut() {
                if scan.status.is_none() {
                    let content = &s[v + 1..v_end - 1];
                    let verdict = if memchr::memchr(b'\\', content).is_none() {
                        reads_pending(ac, content)
                    } else {
                        self.text.clear();
                        unescape_into(std::str::from_utf8(content).unwrap_or(""), self.text);
                        reads_pending(ac, self.text.as_bytes())
                    };
                    scan.status = Some(verdict);
                }
            }
        }
        self.value(s, v, false);
    }

    /// A string value's content (between its quotes, as written).
    fn string_value(&mut self, content: &[u8], escapes: Escapes) {
        let escaped = escapes.any;
        if self.words == Some(false) && content_has_words(content, &mut false) {
            self.words = Some(true);
        }
        if let Some((ac, scan)) = self.pending.as_mut() {
            // Only short strings read as a status (the unescaped length counts).
            if !scan.any_short
                && content.len().saturating_sub(escapes.shrink) <= PENDING_SCAN_MAX_BYTES
            {
                let short = if !escaped {
                    Some(content)
                } else {
                    self.text.clear();
                    unescape_into(std::str::from_utf8(content).unwrap_or(""), self.text);
                    (self.text.len() <= PENDING_SCAN_MAX_BYTES).then_some(self.text.as_bytes())
                };
                if short.is_some_and(|t| reads_pending(ac, t)) {
                    scan.any_short = true;
                }
            }
        }
        let Some(p) = self.patterns else {
            // No value patterns: the canonical form is the content itself unless it has an
            // escape canonical JSON writes otherwise.
            if !escapes.non_canonical {
                self.put(b"\"");
                self.put(content);
                self.put(b"\"");
            } else {
                self.reescape(content);
            }
            return;
        };
        if escaped && (!p.custom.is_empty() || escapes.non_neutral) {
            // Patterns are matched on the unescaped text.
            self.text.clear();
            unescape_into(std::str::from_utf8(content).unwrap_or(""), self.text);
            let text = std::mem::take(self.text);
            self.put(b"\"");
            let mut pos = 0;
            let t = text.as_bytes();
            while let Some((start, end)) = next_volatile(t, pos, p) {
                self.escape_body(&t[pos..start]);
                self.put(b"\x00");
                pos = end;
            }
            self.escape_body(&t[pos..]);
            self.put(b"\"");
            *self.text = text;
            return;
        }
        // The content's escapes read as no letter and no digit: patterns match on it as on
        // the unescaped text, and it is canonical as it is.
        self.put(b"\"");
        let mut pos = 0;
        while let Some((start, end)) = next_volatile(content, pos, p) {
            self.put(&content[pos..start]);
            self.put(b"\x00");
            pos = end;
        }
        self.put(&content[pos..]);
        self.put(b"\"");
    }

    /// A string with escapes canonical JSON writes otherwise (`\/`, `\u…`): unescaped,
    /// then escaped again.
    fn reescape(&mut self, content: &[u8]) {
        self.text.clear();
        unescape_into(std::str::from_utf8(content).unwrap_or(""), self.text);
        let text = std::mem::take(self.text);
        self.escape_string(text.as_bytes());
        *self.text = text;
    }
}

#[derive(Clone, Copy)]
struct Patterns<'a> {
    builtins: &'a [BuiltinPattern],
    custom: &'a [regex::bytes::Regex],
}

#[derive(Default)]
struct PendingScan {
    /// The verdict of a `status`/`state`/`phase` field, which beats any other text.
    status: Option<bool>,
    /// Some short string in the result reads as pending.
    any_short: bool,
}

fn is_status_key(key: &[u8]) -> bool {
    key.eq_ignore_ascii_case(b"status")
        || key.eq_ignore_ascii_case(b"state")
        || key.eq_ignore_ascii_case(b"phase")
}

fn reads_pending(ac: &AhoCorasick, s: &[u8]) -> bool {
    ac.find_iter(s).any(|m| {
        let before_ok = m.start() == 0 || !s[m.start() - 1].is_ascii_alphanumeric();
        let after_ok = m.end() == s.len() || !s[m.end()].is_ascii_alphanumeric();
        before_ok && after_ok
    })
}

/// A stack buffer for formatting a number without allocating.
struct NumBuf {
    buf: [u8; 48],
    len: usize,
}

impl Default for NumBuf {
    fn default() -> Self {
        NumBuf {
            buf: [0; 48],
            len: 0,
        }
    }
}

impl NumBuf {
    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for NumBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        if end > self.buf.len() {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// The next volatile span at or after `from`.
fn next_volatile(s: &[u8], from: usize, p: Patterns<'_>) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    if !p.builtins.is_empty() {
        best = next_builtin(s, from, p.builtins);
    }
    for re in p.custom {
        if let Some(m) = re.find_at(s, from) {
            if m.end() > m.start() && best.is_none_or(|(b, _)| m.start() < b) {
                best = Some((m.start(), m.end()));
            }
        }
    }
    best
}

fn next_builtin(s: &[u8], from: usize, builtins: &[BuiltinPattern]) -> Option<(usize, usize)> {
    let uuid = builtins.contains(&BuiltinPattern::Uuid);
    let date = builtins.contains(&BuiltinPattern::Rfc3339);
    // Both patterns contain a '-' near their start: find dashes, then check around them.
    let mut search = from;
    while let Some(off) = memchr::memchr(b'-', &s[search.min(s.len())..]) {
        let dash = search + off;
        if uuid && dash >= from + 8 {
            if let Some(end) = match_uuid(s, dash - 8) {
                return Some((dash - 8, end));
            }
        }
        if date && dash >= from + 4 {
            if let Some(end) = match_rfc3339(s, dash - 4) {
                return Some((dash - 4, end));
            }
        }
        search = dash + 1;
    }
    None
}

fn all(s: &[u8], range: std::ops::Range<usize>, f: fn(&u8) -> bool) -> bool {
    range.end <= s.len() && s[range].iter().all(f)
}

fn match_uuid(s: &[u8], at: usize) -> Option<usize> {
    if at > 0 && s[at - 1].is_ascii_hexdigit() {
        return None;
    }
    let hex = |r: std::ops::Range<usize>| all(s, r, u8::is_ascii_hexdigit);
    let ok = hex(at..at + 8)
        && s.get(at + 8) == Some(&b'-')
        && hex(at + 9..at + 13)
        && s.get(at + 13) == Some(&b'-')
        && hex(at + 14..at + 18)
        && s.get(at + 18) == Some(&b'-')
        && hex(at + 19..at + 23)
        && s.get(at + 23) == Some(&b'-')
        && hex(at + 24..at + 36)
        && s.get(at + 36).is_none_or(|b| !b.is_ascii_hexdigit());
    ok.then_some(at + 36)
}

/// `YYYY-MM-DD[Tt ]HH:MM:SS[.frac][Z|±HH:MM]`; the offset is optional because logs often
/// drop it, and such a stamp is just as volatile.
fn match_rfc3339(s: &[u8], at: usize) -> Option<usize> {
    if at > 0 && s[at - 1].is_ascii_digit() {
        return None;
    }
    let dig = |r: std::ops::Range<usize>| all(s, r, u8::is_ascii_digit);
    let ok = dig(at..at + 4)
        && s.get(at + 4) == Some(&b'-')
        && dig(at + 5..at + 7)
        && s.get(at + 7) == Some(&b'-')
        && dig(at + 8..at + 10)
        && matches!(s.get(at + 10), Some(b'T' | b't' | b' '))
        && dig(at + 11..at + 13)
        && s.get(at + 13) == Some(&b':')
        && dig(at + 14..at + 16)
        && s.get(at + 16) == Some(&b':')
        && dig(at + 17..at + 19);
    if !ok {
        return None;
    }
    let mut end = at + 19;
    if s.get(end) == Some(&b'.') && s.get(end + 1).is_some_and(u8::is_ascii_digit) {
        end += 1;
        while s.get(end).is_some_and(u8::is_ascii_digit) {
            end += 1;
        }
    }
    match s.get(end) {
        Some(b'Z' | b'z') => end += 1,
        Some(b'+' | b'-')
            if dig(end + 1..end + 3) && s.get(end + 3) == Some(&b':') && dig(end + 4..end + 6) =>
        {
            end += 6
        }
        _ => {}
    }
    Some(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn fp() -> Fingerprinter {
        Fingerprinter::default()
    }

    fn act(f: &Fingerprinter, tool: &str, args: &Value) -> Fp {
        let j = Json::of_value(args);
        f.action(tool, Some(&j), &mut Scratch::default()).digest
    }

    fn res(f: &Fingerprinter, result: &Value) -> ResultPrint {
        f.result(Some(&Json::of_value(result)), None, &mut Scratch::default())
    }

    #[test]
    fn key_sets_match_whole_keys_only() {
        let set = KeySet::new(&["abc", "ab_dd", "Request-ID"]);
        assert!(set.contains(b"ABC") && set.contains(b"a_b_c") && set.contains(b"abdd"));
        assert!(set.contains(b"request_id") && set.contains(b"requestId"));
        assert!(!set.contains(b"abcd") && !set.contains(b"ab") && !set.contains(b"abd"));
        let long = "k".repeat(70);
        assert!(KeySet::new(&[long.as_str()]).contains(format!("{long}_").as_bytes()));
        assert!(!KeySet::new(&[long.as_str()]).contains(&long.as_bytes()[1..]));
    }

    proptest::proptest! {
        /// A key is in the set when it equals one of the set's keys once `_` and `-` are
        /// dropped and letters lowercased, whatever its length (a long one included).
        #[test]
        fn key_sets_match_keys_as_normalized(
            // Two letters: keys share prefixes and lengths often.
            set in proptest::collection::vec("[abAB_-]{0,5}|[ab_]{60,70}", 0..8),
            key in "[abAB_-]{0,6}|[ab_-]{60,72}",
        ) {
            let normalized = |k: &str| normalize_key(k.as_bytes()).collect::<Vec<u8>>();
            let expected = set.iter().any(|k| normalized(k) == normalized(&key));
            proptest::prop_assert_eq!(KeySet::new(&set).contains(key.as_bytes()), expected);
        }
    }

    #[test]
    fn shapes_read_a_number_as_any_number_but_keep_the_digits_of_words() {
        let f = Fingerprinter::default();
        let shape = |s: &str| res(&f, &json!(s)).shape;
        assert_eq!(
            shape("/bin/bash: line 406: x"),
            shape("/bin/bash: line 424: x")
        );
        assert_eq!(shape("took 1.25s\n42 passed"), shape("took 0.5s\n7 passed"));
        assert_ne!(shape("dtype float32"), shape("dtype float64"));
        assert_ne!(shape("x86_64"), shape("x86_32"));
        assert_ne!(shape("line 4 ok"), shape("line 4 no"));
    }

    #[test]
    fn key_order_and_layout_do_not_matter() {
        let a = json!({"q": "loop", "page": 1});
        let b = Json::borrowed("{ \"page\" : 1 ,\n \"q\":\"lo\\u006fp\"}");
        assert_eq!(
            act(&fp(), "search", &a),
            fp().action("search", Some(&b), &mut Scratch::default())
                .digest
        );
    }

    #[test]
    fn volatile_arg_keys_are_ignored_at_every_depth_and_any_case() {
        let a = json!({"path": "/a", "Request-Id": "1", "meta": {"traceId": "x", "k": 1}});
        let b = json!({"path": "/a", "request_id": "2", "meta": {"TRACE_ID": "y", "k": 1}});
        assert_eq!(act(&fp(), "read", &a), act(&fp(), "read", &b));
        let c = json!({"path": "/a", "meta": {"k": 2}});
        assert_ne!(act(&fp(), "read", &a), act(&fp(), "read", &c));
    }

    #[test]
    fn tool_name_is_part_of_the_action() {
        let a = json!({"path": "src/main.ts"});
        assert_ne!(act(&fp(), "read_file", &a), act(&fp(), "list_files", &a));
    }

    #[test]
    fn the_action_argument_is_read_for_classes() {
        let j = Json::borrowed(r#"{"action":"po\u006cl","id":1}"#);
        let a = fp().action("process", Some(&j), &mut Scratch::default());
        assert_eq!(a.action_arg.as_deref(), Some("poll"));
        let j = Json::borrowed(r#"{"x":{"action":"poll"}}"#);
        assert_eq!(
            fp().action("process", Some(&j), &mut Scratch::default())
                .action_arg,
            None
        );
    }

    #[test]
    fn result_volatile_keys_and_patterns_are_erased_but_digits_are_not() {
        let f = fp();
        let a = json!({"status": "completed", "durationMs": 100, "cwd": "/tmp/1", "out": "done at 2026-11-18T11:06:40Z id 123e4567-e89b-12d3-a456-426614174000"});
        let b = json!({"status": "completed", "durationMs": 250, "cwd": "/tmp/2", "out": "done at 2026-11-19T01:00:00.5+02:00 id 00000000-0000-0000-0000-0000000000ff"});
        assert_eq!(res(&f, &a).digest, res(&f, &b).digest);
        let p1 = json!({"output": "[build] 35% complete"});
        let p2 = json!({"output": "[build] 60% complete"});
        assert_ne!(res(&f, &p1).digest, res(&f, &p2).digest);
    }

    #[test]
    fn result_keys_are_not_volatile_in_args() {
        // `cwd` is volatile in results only.
        let a = json!({"cwd": "/a", "command": "ls"});
        let b = json!({"cwd": "/b", "command": "ls"});
        assert_ne!(act(&fp(), "exec", &a), act(&fp(), "exec", &b));
    }

    #[test]
    fn pending_reads_status_fields_and_short_strings() {
        let f = fp();
        assert!(res(&f, &json!({"status": "running", "log": "x"})).pending);
        assert!(res(&f, &json!({"output": "{\"status\": \"queued\"}"})).pending);
        assert!(!res(&f, &json!({"status": "completed", "log": "was running"})).pending);
        assert!(!res(&f, &json!("the runningboard")).pending);
        let long = format!("{} running", "x".repeat(300));
        assert!(!res(&f, &json!(long)).pending);
    }

    #[test]
    fn words_are_letters_of_values_outside_markup() {
        let f = fp();
        assert!(
            !res(
                &f,
                &json!("<returncode>1</returncode>\n<output>\n</output>")
            )
            .has_words
        );
        assert!(!res(&f, &json!({"exit": 1, "code": "42"})).has_words);
        assert!(
            res(&f, &json!({"cwd": "/tmp/x"})).has_words,
            "volatile values count"
        );
        assert!(res(&f, &json!(["ok"])).has_words);
    }

    #[test]
    fn given_digest_replaces_the_result() {
        let f = fp();
        let x = Json::of_value(&json!("x"));
        let y = Json::of_value(&json!("y"));
        let a = f.result(Some(&x), Some("ABCD"), &mut Scratch::default());
        let b = f.result(Some(&y), Some("abcd"), &mut Scratch::default());
        assert_eq!(a.digest, b.digest);
        assert!(a.has_words);
    }

    #[test]
    fn per_tool_ignored_arg_keys() {
        let spec = FingerprintSpec {
            ignore_args: vec![("todo".to_string(), vec!["note".to_string()])],
            ..FingerprintSpec::default()
        };
        let f = Fingerprinter::new(&spec);
        let a = json!({"item": 1, "note": "thinking"});
        let b = json!({"item": 1, "note": "still thinking"});
        assert_eq!(act(&f, "todo", &a), act(&f, "todo", &b));
        assert_ne!(act(&f, "other", &a), act(&f, "other", &b));
    }

    #[test]
    fn uuid_and_date_matchers_respect_boundaries() {
        let p = Patterns {
            builtins: &[BuiltinPattern::Uuid, BuiltinPattern::Rfc3339],
            custom: &[],
        };
        assert_eq!(
            next_volatile(b"x 123e4567-e89b-12d3-a456-426614174000 y", 0, p),
            Some((2, 38))
        );
        assert_eq!(
            next_volatile(b"a1123e4567-e89b-12d3-a456-426614174000", 0, p),
            None
        );
        assert_eq!(
            next_volatile(b"on 2026-01-02T03:04:05Z.", 0, p),
            Some((3, 23))
        );
        assert_eq!(next_volatile(b"v1-2-3 and 12-34", 0, p), None);
    }

    /// The canonical JSON written by walking serde_json's tree: the definition the fast
    /// pass over the text is held to.
    mod reference {
        use super::super::*;
        use serde_json::Value;

        pub struct Out {
            pub canonical: Vec<u8>,
            pub shape: Option<Shape>,
        }

        impl Out {
            fn put(&mut self, b: &[u8]) {
                self.canonical.extend_from_slice(b);
                if let Some(s) = self.shape.as_mut() {
                    s.text(b);
                }
            }

            fn escaped(&mut self, esc: &[u8]) {
                self.canonical.extend_from_slice(esc);
                if let Some(s) = self.shape.as_mut() {
                    s.escape(esc);
                }
            }

            fn string(&mut self, s: &[u8]) {
                self.put(b"\"");
                self.body(s);
                self.put(b"\"");
            }

            fn body(&mut self, s: &[u8]) {
                let mut start = 0;
                for (i, &b) in s.iter().enumerate() {
                    let esc: Vec<u8> = match b {
                        b'"' => b"\\\"".to_vec(),
                        b'\\' => b"\\\\".to_vec(),
                        b'\n' => b"\\n".to_vec(),
                        b'\r' => b"\\r".to_vec(),
                        b'\t' => b"\\t".to_vec(),
                        0x08 => b"\\b".to_vec(),
                        0x0c => b"\\f".to_vec(),
                        0..=0x1f => format!("\\u{:04x}", b).into_bytes(),
                        _ => continue,
                    };
                    self.put(&s[start..i]);
                    self.escaped(&esc);
                    start = i + 1;
                }
                self.put(&s[start..]);
            }
        }

        pub struct Walker<'a> {
            pub out: Out,
            pub keys: &'a KeySet,
            pub extra: Option<&'a KeySet>,
            pub patterns: Option<Patterns<'a>>,
            pub pending: Option<(&'a AhoCorasick, PendingScan)>,
        }

        impl Walker<'_> {
            pub fn value(&mut self, v: &Value) {
                match v {
                    Value::Null => self.out.put(b"null"),
                    Value::Bool(b) => self.out.put(if *b { b"true" } else { b"false" }),
                    Value::Number(n) => self.out.put(n.to_string().as_bytes()),
                    Value::String(s) => {
                        if let Some((ac, scan)) = self.pending.as_mut() {
                            if !scan.any_short
                                && s.len() <= PENDING_SCAN_MAX_BYTES
                                && reads_pending(ac, s.as_bytes())
                            {
                                scan.any_short = true;
                            }
                        }
                        let Some(p) = self.patterns else {
                            self.out.string(s.as_bytes());
                            return;
                        };
                        let s = s.as_bytes();
                        self.out.put(b"\"");
                        let mut pos = 0;
                        while let Some((start, end)) = next_volatile(s, pos, p) {
                            self.out.body(&s[pos..start]);
                            self.out.put(b"\x00");
                            pos = end;
                        }
                        self.out.body(&s[pos..]);
                        self.out.put(b"\"");
                    }
                    Value::Array(items) => {
                        self.out.put(b"[");
                        for (i, item) in items.iter().enumerate() {
                            if i > 0 {
                                self.out.put(b",");
                            }
                            self.value(item);
                        }
                        self.out.put(b"]");
                    }
                    Value::Object(map) => {
                        self.out.put(b"{");
                        let mut first = true;
                        for (k, item) in map {
                            let kb = k.as_bytes();
                            if self.keys.contains(kb) || self.extra.is_some_and(|e| e.contains(kb))
                            {
                                continue;
                            }
                            if !first {
                                self.out.put(b",");
                            }
                            first = false;
                            self.out.string(kb);
                            self.out.put(b":");
                            if let (Value::String(s), Some((ac, scan))) =
                                (item, self.pending.as_mut())
                            {
                                if scan.status.is_none() && is_status_key(kb) {
                                    scan.status = Some(reads_pending(ac, s.as_bytes()));
                                }
                            }
                            self.value(item);
                        }
                        self.out.put(b"}");
                    }
                }
            }
        }

        pub fn has_words(v: &Value) -> bool {
            match v {
                Value::String(s) => crate::json::content_has_words(
                    serde_json::to_string(s)
                        .unwrap()
                        .trim_matches('"')
                        .as_bytes(),
                    &mut false,
                ),
                Value::Array(items) => items.iter().any(has_words),
                Value::Object(map) => map.values().any(has_words),
                _ => false,
            }
        }

        pub fn action(f: &Fingerprinter, tool: &str, args: &Value) -> Vec<u8> {
            let mut w = Walker {
                out: Out {
                    canonical: Vec::new(),
                    shape: None,
                },
                keys: &f.arg_keys,
                extra: f.ignore_args.get(tool),
                patterns: None,
                pending: None,
            };
            w.out.put(b"[");
            w.out.string(tool.as_bytes());
            w.out.put(b",");
            w.value(args);
            w.out.put(b"]");
            w.out.canonical
        }

        pub fn result(f: &Fingerprinter, result: &Value) -> (Vec<u8>, u32, bool, bool) {
            let mut w = Walker {
                out: Out {
                    canonical: Vec::new(),
                    shape: Some(Shape::default()),
                },
                keys: &f.result_keys,
                extra: None,
                patterns: Some(Patterns {
                    builtins: &f.builtins,
                    custom: &f.custom_patterns,
                }),
                pending: f.pending.as_ref().map(|ac| (ac, PendingScan::default())),
            };
            w.value(result);
            let pending = w
                .pending
                .as_ref()
                .is_some_and(|(_, s)| s.status.unwrap_or(s.any_short));
            (
                w.out.canonical,
                w.out.shape.unwrap().finish(),
                pending,
                has_words(result),
            )
        }
    }

    mod agreement {
        use super::super::*;
        use super::reference;
        use proptest::prelude::*;
        use serde_json::Value;

        fn leaf() -> impl Strategy<Value = Value> {
            let text = prop_oneof![
                "[a-zA-Z0-9 _:./<>\\-]{0,12}",
                Just("running".to_string()),
                Just("2026-01-02T03:04:05Z".to_string()),
                Just("123e4567-e89b-12d3-a456-426614174000".to_string()),
                Just("line 4\n\t\"q\" \\ \u{8}\u{c}\u{1}/é😀".to_string()),
                Just("<output>\n</output>".to_string()),
                Just(
                    "\nfab2026-01-02T03:04:05Z\u{c}123e4567-e89b-12d3-a456-426614174000\u{8}"
                        .to_string()
                ),
            ];
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                (-1e12f64..1e12).prop_map(Value::from),
                text.prop_map(Value::from),
            ]
        }

        fn value() -> impl Strategy<Value = Value> {
            let keys = prop_oneof![
                "[a-z_]{1,6}",
                Just("status".to_string()),
                Just("cwd".to_string()),
                Just("TraceId".to_string()),
                Just("action".to_string()),
                Just("k\"ey\n".to_string()),
            ];
            leaf().prop_recursive(4, 40, 6, move |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                    prop::collection::vec((keys.clone(), inner), 0..5)
                        .prop_map(|kv| Value::Object(kv.into_iter().collect())),
                ]
            })
        }

        /// The same value written in other ways JSON allows: spaces, `\/`, `\u` escapes
        /// of plain characters.
        fn respell(v: &Value, how: u8) -> String {
            let compact = v.to_string();
            match how {
                0 => compact,
                1 => serde_json::to_string_pretty(v).unwrap(),
                _ => {
                    let mut out = String::new();
                    let mut in_string = false;
                    let mut escaped = false;
                    for c in compact.chars() {
                        if in_string && !escaped && c == '/' {
                            out.push_str("\\/");
                        } else if in_string && !escaped && c == 'e' {
                            out.push_str("\\u0065");
                        } else {
                            out.push(c);
                        }
                        if in_string {
                            if escaped {
                                escaped = false;
                            } else if c == '\\' {
                                escaped = true;
                            } else if c == '"' {
                                in_string = false;
                            }
                        } else if c == '"' {
                            in_string = true;
                        }
                    }
                    out
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(400))]
            #[test]
            fn the_fast_pass_writes_what_the_tree_walk_writes(v in value(), how in 0u8..3) {
                let f = Fingerprinter::default();
                let text = respell(&v, how);
                // The tree as serde_json reads the text (numbers as it parses them).
                let v: Value = serde_json::from_str(&text).unwrap();
                let json = Json::borrowed(&text);
                let mut scratch = Scratch::default();
                let a = f.action("tool", Some(&json), &mut scratch);
                let expected = reference::action(&f, "tool", &v);
                prop_assert_eq!(
                    String::from_utf8_lossy(&scratch.canonical),
                    String::from_utf8_lossy(&expected)
                );
                prop_assert_eq!(a.digest, Fp::of(&expected));
                let expected_arg = v.get("action").and_then(Value::as_str).map(str::to_string);
                prop_assert_eq!(a.action_arg.map(|c| c.into_owned()), expected_arg);
                let r = f.result(Some(&json), None, &mut scratch);
                let (canonical, shape, pending, words) = reference::result(&f, &v);
                prop_assert_eq!(
                    String::from_utf8_lossy(&scratch.canonical),
                    String::from_utf8_lossy(&canonical)
                );
                prop_assert_eq!(r.shape, shape);
                prop_assert_eq!(r.pending, pending);
                prop_assert_eq!(r.has_words, words);
            }
        }
    }
}

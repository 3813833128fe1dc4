//! Fingerprints (DESIGN §2): SHA-256 over canonical JSON with volatile keys and value
//! patterns erased, so that "the same action" and "the same result" mean what a person
//! would mean.
//!
//! Guarantees: a fingerprint depends only on the value (object key order, volatile keys,
//! UUIDs and RFC 3339 timestamps inside result strings do not change it; digits elsewhere
//! do); hashing streams into the hasher without building the canonical text; no input
//! panics. Only the resulting digests leave this module.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// A 128-bit truncated SHA-256 digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Fp(pub u128);

impl Fp {
    /// The first 64 bits, which is what session state keeps: within one session's
    /// bounded window a 64-bit collision is out of reach (2^-64 per pair).
    pub fn short(self) -> u64 {
        (self.0 >> 64) as u64
    }

    fn from_hasher(h: Sha256) -> Fp {
        let d = h.finalize();
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
}

fn normalize_key(key: &str) -> impl Iterator<Item = u8> + '_ {
    key.bytes()
        .filter(|b| *b != b'_' && *b != b'-')
        .map(|b| b.to_ascii_lowercase())
}

impl KeySet {
    pub fn new<S: AsRef<str>>(keys: &[S]) -> KeySet {
        let mut normalized: Vec<Box<[u8]>> = keys
            .iter()
            .map(|k| {
                normalize_key(k.as_ref())
                    .collect::<Vec<u8>>()
                    .into_boxed_slice()
            })
            .collect();
        normalized.sort();
        normalized.dedup();
        KeySet { normalized }
    }

    pub fn is_empty(&self) -> bool {
        self.normalized.is_empty()
    }

    pub fn contains(&self, key: &str) -> bool {
        let len = normalize_key(key).count();
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

/// The digest of a result plus what its content says about waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultPrint {
    pub digest: Fp,
    /// The digest's text with every run of digits read as one: results that differ only
    /// in counters, timings or line numbers share it (not a DESIGN §2 fingerprint: it
    /// never leaves the session's state).
    pub shape: u32,
    /// The result reads as a pending state (`running`, `queued`, …).
    pub pending: bool,
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
    pub fn action(&self, tool: &str, args: Option<&Value>) -> Fp {
        let mut w = HashWriter::new();
        w.put(b"[");
        w.string(tool.as_bytes());
        w.put(b",");
        let extra = self.ignore_args.get(tool);
        let mut walker = Walker {
            w: &mut w,
            keys: &self.arg_keys,
            extra,
            patterns: None,
            pending: None,
        };
        match args {
            Some(v) => walker.value(v),
            None => walker.w.put(b"null"),
        }
        w.put(b"]");
        Fp::from_hasher(w.h)
    }

    /// The result digest: SHA-256 over the canonical JSON of `result` (volatile keys and
    /// value patterns erased), or over the emitter's own `result_digest`.
    pub fn result(&self, result: Option<&Value>, given_digest: Option<&str>) -> ResultPrint {
        let mut w = HashWriter::new();
        w.shape = Some(Shape::default());
        let mut scan = PendingScan::default();
        if let Some(d) = given_digest {
            w.put(b"digest:");
            w.put(d.to_ascii_lowercase().as_bytes());
        } else {
            let patterns = Patterns {
                builtins: &self.builtins,
                custom: &self.custom_patterns,
            };
            let mut walker = Walker {
                w: &mut w,
                keys: &self.result_keys,
                extra: None,
                patterns: Some(patterns),
                pending: self.pending.as_ref().map(|ac| (ac, &mut scan)),
            };
            match result {
                Some(v) => walker.value(v),
                None => walker.w.put(b"null"),
            }
        }
        let shape = w.shape.map_or(0, |s| s.finish());
        ResultPrint {
            digest: Fp::from_hasher(w.h),
            shape,
            pending: scan.status.unwrap_or(scan.any_short),
        }
    }
}

use crate::hash::Shape;

struct HashWriter {
    h: Sha256,
    /// Also hash the text with digit runs collapsed (results only).
    shape: Option<Shape>,
}

impl HashWriter {
    fn new() -> HashWriter {
        HashWriter {
            h: Sha256::new(),
            shape: None,
        }
    }

    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.h.update(b);
        if let Some(s) = self.shape.as_mut() {
            s.text(b);
        }
    }

    /// An escape sequence: the digest takes it as written, the shape as a separator
    /// (so that `\n42` reads as a line break and a number, not as a word `n42`).
    #[inline]
    fn escaped(&mut self, esc: &[u8]) {
        self.h.update(esc);
        if let Some(s) = self.shape.as_mut() {
            s.escape(esc);
        }
    }

    /// Writes a JSON string literal (canonical escaping).
    fn string(&mut self, s: &[u8]) {
        self.put(b"\"");
        self.string_body(s);
        self.put(b"\"");
    }

    fn string_body(&mut self, s: &[u8]) {
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
                    self.escaped(&[
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
            self.escaped(esc);
            start = i + 1;
        }
        self.put(&s[start..]);
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

struct Walker<'a, 'b> {
    w: &'a mut HashWriter,
    keys: &'a KeySet,
    extra: Option<&'a KeySet>,
    patterns: Option<Patterns<'a>>,
    pending: Option<(&'a AhoCorasick, &'b mut PendingScan)>,
}

fn is_status_key(key: &str) -> bool {
    key.eq_ignore_ascii_case("status")
        || key.eq_ignore_ascii_case("state")
        || key.eq_ignore_ascii_case("phase")
}

fn reads_pending(ac: &AhoCorasick, s: &[u8]) -> bool {
    ac.find_iter(s).any(|m| {
        let before_ok = m.start() == 0 || !s[m.start() - 1].is_ascii_alphanumeric();
        let after_ok = m.end() == s.len() || !s[m.end()].is_ascii_alphanumeric();
        before_ok && after_ok
    })
}

impl Walker<'_, '_> {
    fn value(&mut self, v: &Value) {
        match v {
            Value::Null => self.w.put(b"null"),
            Value::Bool(true) => self.w.put(b"true"),
            Value::Bool(false) => self.w.put(b"false"),
            Value::Number(n) => {
                use std::fmt::Write as _;
                let mut buf = NumBuf::default();
                let _ = write!(buf, "{n}");
                self.w.put(buf.as_bytes());
            }
            Value::String(s) => {
                if let Some((ac, scan)) = self.pending.as_mut() {
                    if !scan.any_short
                        && s.len() <= PENDING_SCAN_MAX_BYTES
                        && reads_pending(ac, s.as_bytes())
                    {
                        scan.any_short = true;
                    }
                }
                self.string_value(s.as_bytes());
            }
            Value::Array(items) => {
                self.w.put(b"[");
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.w.put(b",");
                    }
                    self.value(item);
                }
                self.w.put(b"]");
            }
            Value::Object(map) => {
                // serde_json's map is a BTreeMap: keys already come sorted.
                self.w.put(b"{");
                let mut first = true;
                for (k, item) in map {
                    if self.keys.contains(k) || self.extra.is_some_and(|e| e.contains(k)) {
                        continue;
                    }
                    if !first {
                        self.w.put(b",");
                    }
                    first = false;
                    self.w.string(k.as_bytes());
                    self.w.put(b":");
                    if let (Value::String(s), Some((ac, scan))) = (item, self.pending.as_mut()) {
                        if scan.status.is_none() && is_status_key(k) {
                            scan.status = Some(reads_pending(ac, s.as_bytes()));
                        }
                    }
                    self.value(item);
                }
                self.w.put(b"}");
            }
        }
    }

    fn string_value(&mut self, s: &[u8]) {
        let Some(p) = self.patterns else {
            self.w.string(s);
            return;
        };
        self.w.put(b"\"");
        let mut pos = 0;
        while let Some((start, end)) = next_volatile(s, pos, p) {
            self.w.string_body(&s[pos..start]);
            // A raw NUL never appears in escaped JSON text, so it cannot collide.
            self.w.put(b"\x00");
            pos = end;
        }
        self.w.string_body(&s[pos..]);
        self.w.put(b"\"");
    }
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

/// Whether a result says anything in words: a letter outside markup tags (`<output>`).
/// An empty output wrapped in a runtime's markup, or a bare exit code, says nothing, so
/// two of them are not "the same error".
pub fn has_words(result: Option<&Value>) -> bool {
    fn text_has_words(s: &str) -> bool {
        let mut in_tag = false;
        s.bytes().any(|b| match b {
            b'<' => {
                in_tag = true;
                false
            }
            b'>' => {
                in_tag = false;
                false
            }
            _ => !in_tag && b.is_ascii_alphabetic(),
        })
    }
    match result {
        None | Some(Value::Null | Value::Bool(_) | Value::Number(_)) => false,
        Some(Value::String(s)) => text_has_words(s),
        Some(Value::Array(items)) => items.iter().any(|v| has_words(Some(v))),
        Some(Value::Object(map)) => map.values().any(|v| has_words(Some(v))),
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
    use serde_json::json;

    fn fp() -> Fingerprinter {
        Fingerprinter::default()
    }

    #[test]
    fn shapes_read_a_number_as_any_number_but_keep_the_digits_of_words() {
        let f = Fingerprinter::default();
        let shape = |s: &str| f.result(Some(&json!(s)), None).shape;
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
    fn key_order_does_not_matter() {
        let a = json!({"q": "loop", "page": 1});
        let b: Value = serde_json::from_str(r#"{"page":1,"q":"loop"}"#).unwrap();
        assert_eq!(
            fp().action("search", Some(&a)),
            fp().action("search", Some(&b))
        );
    }

    #[test]
    fn volatile_arg_keys_are_ignored_at_every_depth_and_any_case() {
        let a = json!({"path": "/a", "Request-Id": "1", "meta": {"traceId": "x", "k": 1}});
        let b = json!({"path": "/a", "request_id": "2", "meta": {"TRACE_ID": "y", "k": 1}});
        assert_eq!(fp().action("read", Some(&a)), fp().action("read", Some(&b)));
        let c = json!({"path": "/a", "meta": {"k": 2}});
        assert_ne!(fp().action("read", Some(&a)), fp().action("read", Some(&c)));
    }

    #[test]
    fn tool_name_is_part_of_the_action() {
        let a = json!({"path": "src/main.ts"});
        assert_ne!(
            fp().action("read_file", Some(&a)),
            fp().action("list_files", Some(&a))
        );
    }

    #[test]
    fn result_volatile_keys_and_patterns_are_erased_but_digits_are_not() {
        let f = fp();
        let a = json!({"status": "completed", "durationMs": 100, "cwd": "/tmp/1", "out": "done at 2026-11-18T11:06:40Z id 123e4567-e89b-12d3-a456-426614174000"});
        let b = json!({"status": "completed", "durationMs": 250, "cwd": "/tmp/2", "out": "done at 2026-11-19T01:00:00.5+02:00 id 00000000-0000-0000-0000-0000000000ff"});
        assert_eq!(
            f.result(Some(&a), None).digest,
            f.result(Some(&b), None).digest
        );
        let p1 = json!({"output": "[build] 35% complete"});
        let p2 = json!({"output": "[build] 60% complete"});
        assert_ne!(
            f.result(Some(&p1), None).digest,
            f.result(Some(&p2), None).digest
        );
    }

    #[test]
    fn result_keys_are_not_volatile_in_args() {
        // `cwd` is volatile in results only.
        let a = json!({"cwd": "/a", "command": "ls"});
        let b = json!({"cwd": "/b", "command": "ls"});
        assert_ne!(fp().action("exec", Some(&a)), fp().action("exec", Some(&b)));
    }

    #[test]
    fn pending_reads_status_fields_and_short_strings() {
        let f = fp();
        assert!(
            f.result(Some(&json!({"status": "running", "log": "x"})), None)
                .pending
        );
        assert!(
            f.result(Some(&json!({"output": "{\"status\": \"queued\"}"})), None)
                .pending
        );
        assert!(
            !f.result(
                Some(&json!({"status": "completed", "log": "was running"})),
                None
            )
            .pending
        );
        assert!(!f.result(Some(&json!("the runningboard")), None).pending);
        let long = format!("{} running", "x".repeat(300));
        assert!(!f.result(Some(&json!(long)), None).pending);
    }

    #[test]
    fn given_digest_replaces_the_result() {
        let f = fp();
        let a = f.result(Some(&json!("x")), Some("ABCD"));
        let b = f.result(Some(&json!("y")), Some("abcd"));
        assert_eq!(a.digest, b.digest);
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
        assert_eq!(f.action("todo", Some(&a)), f.action("todo", Some(&b)));
        assert_ne!(f.action("other", Some(&a)), f.action("other", Some(&b)));
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
}

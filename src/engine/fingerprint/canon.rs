//! The canonical JSON writer the fingerprints hash: an object's members sorted by key,
//! strings re-escaped only when they hold escapes other than the canonical ones, volatile
//! keys dropped and volatile values (UUIDs, RFC 3339 timestamps, the configured patterns)
//! erased, pending words noted — written straight from the value's text.

use super::*;

/// Whether any string value (not a key) of a JSON text says something in words.
pub(super) fn words_of(s: &[u8]) -> bool {
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
pub(super) struct Escapes {
    pub(super) any: bool,
    /// Some escape is one canonical JSON writes otherwise (`\/`, `\u…`).
    pub(super) non_canonical: bool,
    /// Some escape stands for a letter or a digit (only `\"`, `\\`, `\n`, `\r`, `\t` do
    /// not).
    pub(super) non_neutral: bool,
    /// Bytes the escapes take beyond the characters they stand for.
    pub(super) shrink: usize,
}

/// The closing quote of a string whose content starts at `from` (checked text), and what
/// its escapes are.
#[inline]
pub(super) fn string_end(s: &[u8], from: usize) -> (usize, Escapes) {
    let mut e = Escapes::default();
    let end = string_close(s, from, |at| {
        let c = s.get(at + 1).copied().unwrap_or(0);
        let len = checked_escape_len(s, at);
        e.any = true;
        e.non_canonical |= !is_canonical_escape(c);
        e.non_neutral |= !is_neutral_escape(c);
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
pub(super) struct Member {
    /// The key's content (between its quotes) in the text, or its unescaped bytes in the
    /// scratch key buffer.
    pub(super) key: (u32, u32),
    pub(super) key_unescaped: bool,
    pub(super) value: (u32, u32),
}

/// Writes canonical JSON into the scratch buffer, and reads what the result says.
pub(super) struct Canon<'s, 'k> {
    pub(super) out: &'s mut Vec<u8>,
    pub(super) members: &'s mut Vec<Member>,
    pub(super) keybuf: &'s mut Vec<u8>,
    pub(super) text: &'s mut String,
    pub(super) keys: &'k KeySet,
    pub(super) extra: Option<&'k KeySet>,
    pub(super) patterns: Option<Patterns<'k>>,
    pub(super) pending: Option<(&'k AhoCorasick, PendingScan)>,
    /// Whether some string says something (results only).
    pub(super) words: Option<bool>,
    /// Where `args.action` is in the text (its content), when a string (actions only).
    pub(super) action_arg: Option<(usize, usize)>,
    /// A result, not an action: a string holding a JSON object or array is written as
    /// that JSON, and a key is volatile as its last words too.
    pub(super) json_text: bool,
    /// Some JSON text so read was written over lines (a line break between its tokens: a
    /// pretty-printed text, as an agent reads it line by line).
    pub(super) json_text_over_lines: bool,
    /// Buffers for the JSON text strings hold, one a level of strings in strings.
    pub(super) json_texts: &'s mut Vec<String>,
    /// JSON texts in strings the value being written is in.
    pub(super) json_levels: usize,
    /// Objects and arrays the value being written is in.
    pub(super) depth: usize,
}

pub(super) fn is_plain_number(n: &[u8]) -> bool {
    let digits = n.strip_prefix(b"-").unwrap_or(n);
    match digits {
        [b'0'] => n.len() == 1,
        [b'1'..=b'9', rest @ ..] => rest.len() <= 17 && rest.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// The escapes canonical JSON writes itself (any other is re-written).
// This set and the next are `match`es, not a slice's `contains`: that was an out-of-line
// `memchr` call for every escape of every result.
#[inline]
fn is_canonical_escape(c: u8) -> bool {
    matches!(c, b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't')
}

/// The escapes that read as no letter and no digit, so that volatile patterns can be
/// matched on the escaped text as on the unescaped one.
#[inline]
fn is_neutral_escape(c: u8) -> bool {
    matches!(c, b'"' | b'\\' | b'n' | b'r' | b't')
}

impl<'s, 'k> Canon<'s, 'k> {
    pub(super) fn new(
        scratch: &'s mut Scratch,
        keys: &'k KeySet,
        extra: Option<&'k KeySet>,
    ) -> Canon<'s, 'k> {
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
            json_text: false,
            json_text_over_lines: false,
            json_texts: &mut scratch.json_texts,
            json_levels: 0,
            depth: 0,
        }
    }

    #[inline]
    pub(super) fn put(&mut self, b: &[u8]) {
        self.out.extend_from_slice(b);
    }

    /// Unescaped text, canonically escaped.
    pub(super) fn escape_body(&mut self, s: &[u8]) {
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

    pub(super) fn escape_string(&mut self, s: &[u8]) {
        self.put(b"\"");
        self.escape_body(s);
        self.put(b"\"");
    }

    #[inline]
    pub(super) fn ws(s: &[u8], mut i: usize) -> usize {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = s.get(i) {
            i += 1;
        }
        i
    }

    /// A whole document (the text of `args` or `result`).
    pub(super) fn document(&mut self, s: &[u8], top_is_args: bool) {
        let start = Self::ws(s, 0);
        self.value(s, start, top_is_args);
    }

    /// The value at `i`; returns the position after it.
    pub(super) fn value(&mut self, s: &[u8], i: usize, args_top: bool) -> usize {
        match s.get(i) {
            Some(b'"') => {
                let (end, escapes) = string_end(s, i + 1);
                if !(self.json_text && self.json_in_string(&s[i + 1..end])) {
                    self.string_value(&s[i + 1..end], escapes);
                }
                end + 1
            }
            Some(b'{') => {
                self.depth += 1;
                let end = self.object(s, i, args_top);
                self.depth -= 1;
                end
            }
            Some(b'[') => {
                self.depth += 1;
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
                self.depth -= 1;
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

    /// Writes the JSON object or array a string's content (as written) holds, and says
    /// so; says not, writing nothing, for any other string, and for a JSON text that
    /// would take the result past [`JSON_TEXT_MAX_NESTING`] objects and arrays deep, or
    /// past [`JSON_TEXT_LEVELS`] JSON texts inside one another (the work and the stack a
    /// result can ask for stay bounded). A look at the content's ends first: most strings
    /// are not JSON, and are not unescaped.
    fn json_in_string(&mut self, content: &[u8]) -> bool {
        let budget = JSON_TEXT_MAX_NESTING.saturating_sub(self.depth);
        if self.json_levels >= JSON_TEXT_LEVELS || budget == 0 || !may_hold_json(content) {
            return false;
        }
        let mut text = self.json_texts.pop().unwrap_or_default();
        text.clear();
        unescape_into(std::str::from_utf8(content).unwrap_or(""), &mut text);
        let trimmed = text.trim_matches(JSON_WS);
        let ends = matches!(trimmed.as_bytes(), [b'{', .., b'}'] | [b'[', .., b']']);
        // Inside JSON's strings a line break is escaped: one here is between tokens (read
        // before serde's rewriting below, which writes none; and once a result has one).
        let over_lines = ends
            && !self.json_text_over_lines
            && memchr::memchr(b'\n', trimmed.as_bytes()).is_some();
        let is_json = {
            let mut scan = Scanner::new(trimmed.as_bytes(), budget);
            if !ends {
                false
            } else if scan.value().is_ok() && scan.at_end() {
                true
            } else {
                // What the scanner leaves to serde_json (a surrogate pair's escapes, as
                // Python's `json.dumps` writes any emoji; a number past its range), read
                // by it and written again.
                match serde_json::from_str::<serde_json::Value>(trimmed) {
                    Ok(v) if value_depth(&v) <= budget => {
                        text = v.to_string();
                        true
                    }
                    _ => false,
                }
            }
        };
        if is_json {
            self.json_text_over_lines |= over_lines;
            self.json_levels += 1;
            self.document(text.as_bytes(), false);
            self.json_levels -= 1;
        }
        if text.capacity() <= JSON_TEXT_KEEP_BYTES {
            self.json_texts.push(text);
        }
        is_json
    }

    pub(super) fn number(&mut self, token: &[u8]) {
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
    pub(super) fn scan_members(&mut self, s: &[u8], open: usize) -> usize {
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

    pub(super) fn object(&mut self, s: &[u8], open: usize, args_top: bool) -> usize {
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

    pub(super) fn member(
        &mut self,
        s: &[u8],
        m: &Member,
        key: &[u8],
        first: &mut bool,
        args_top: bool,
    ) {
        let (v, v_end) = (m.value.0 as usize, m.value.1 as usize);
        let is_string = s.get(v) == Some(&b'"');
        if args_top && key == b"action" && is_string {
            self.action_arg = Some((v + 1, v_end - 1));
        }
        // A result's key is volatile as its last words too (`subagent_session_id`: an id
        // made anew each call); an action's only whole (`start_ts` is a query's range).
        let volatile = if self.json_text {
            self.keys.contains_key_or_last_words(key)
        } else {
            self.keys.contains(key)
        };
        if volatile || self.extra.is_some_and(|e| e.contains(key)) {
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
        // Some status field reading pending makes the result pending (an order `confirmed`
        // whose `ticketing_status` is pending is still waited on). Results only: an
        // action's keys are not looked at (`pending` is unset for them).
        if let Some((ac, scan)) = self.pending.as_mut() {
            if is_string && scan.status != Some(true) && is_status_key(key) {
                let content = &s[v + 1..v_end - 1];
                let verdict = if memchr::memchr(b'\\', content).is_none() {
                    reads_pending(ac, content, usize::MAX)
                } else {
                    self.text.clear();
                    unescape_into(std::str::from_utf8(content).unwrap_or(""), self.text);
                    reads_pending(ac, self.text.as_bytes(), usize::MAX)
                };
                scan.status = Some(verdict);
            }
        }
        self.value(s, v, false);
    }

    /// A string value's content (between its quotes, as written).
    pub(super) fn string_value(&mut self, content: &[u8], escapes: Escapes) {
        let escaped = escapes.any;
        if self.words == Some(false) && content_has_words(content, &mut false) {
            self.words = Some(true);
        }
        if let Some((ac, scan)) = self.pending.as_mut() {
            // Only short strings read as a status (the unescaped length counts).
            if !scan.bare && content.len().saturating_sub(escapes.shrink) <= PENDING_SCAN_MAX_BYTES
            {
                let short = if !escaped {
                    Some(content)
                } else {
                    self.text.clear();
                    unescape_into(std::str::from_utf8(content).unwrap_or(""), self.text);
                    (self.text.len() <= PENDING_SCAN_MAX_BYTES).then_some(self.text.as_bytes())
                };
                if let Some(t) = short {
                    if is_pending_value(ac, t) {
                        (scan.bare, scan.any_short) = (true, true);
                    } else if !scan.any_short && reads_pending(ac, t, scan.prose_terms) {
                        scan.any_short = true;
                    }
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
    pub(super) fn reescape(&mut self, content: &[u8]) {
        self.text.clear();
        unescape_into(std::str::from_utf8(content).unwrap_or(""), self.text);
        let text = std::mem::take(self.text);
        self.escape_string(text.as_bytes());
        *self.text = text;
    }
}

#[derive(Clone, Copy)]
pub(super) struct Patterns<'a> {
    pub(super) builtins: &'a [BuiltinPattern],
    pub(super) custom: &'a [regex::bytes::Regex],
}

#[derive(Default)]
pub(super) struct PendingScan {
    /// Patterns below this index read in prose; the others only as a status.
    pub(super) prose_terms: usize,
    /// The verdict of the `status`/`state`/`phase` fields (pending where any of them
    /// reads so), which beats any other text.
    pub(super) status: Option<bool>,
    /// Some short string in the result reads as pending: a prose term in it as a word
    /// (`Job 42 is still running`), or a status term as its only word (RDS's
    /// `["creating", {}]`; `1. Data Processing` is a title, not a status).
    pub(super) any_short: bool,
    /// Some string is a pending word alone (a status as a value).
    pub(super) bare: bool,
}

impl PendingScan {
    /// Pending, read anywhere: a status field, else any short string.
    pub(super) fn pending(&self) -> bool {
        self.status.unwrap_or(self.any_short)
    }

    /// Pending as a status: a status field, else a value that is a pending word alone
    /// (prose such as a pod table's `Running` may be a service's steady state).
    pub(super) fn status_pending(&self) -> bool {
        self.status.unwrap_or(self.bare)
    }

    pub(super) fn new(prose_terms: usize) -> PendingScan {
        PendingScan {
            prose_terms,
            ..PendingScan::default()
        }
    }
}

/// A key naming a status: `status`, `state` or `phase`, alone or as the last word of the
/// key (`ticketing_status`, `job-state`, `DBInstanceStatus`, `provisioningState`), not
/// inside a word (`estate`), nor after a word naming another time (`desired_state`).
pub(super) fn is_status_key(key: &[u8]) -> bool {
    [&b"status"[..], b"state", b"phase"].iter().any(|word| {
        let Some(at) = key.len().checked_sub(word.len()) else {
            return false;
        };
        key[at..].eq_ignore_ascii_case(word)
            && (at == 0 || (starts_word(key, at) && !names_another_time(&key[..at])))
    })
}

/// Whether a word of `key` starts at `at` (> 0): after `_`, `-`, `.` or a space, or at an
/// upper-case letter after a lower-case one or a digit.
pub(super) fn starts_word(key: &[u8], at: usize) -> bool {
    matches!(key[at - 1], b'_' | b'-' | b'.' | b' ') || case_changes(key, at)
}

/// Whether a word of camel case starts at `at` (> 0): an upper-case letter after a
/// lower-case one or a digit (`requestId`, `http2Time`).
pub(super) fn case_changes(s: &[u8], at: usize) -> bool {
    s[at].is_ascii_uppercase() && (s[at - 1].is_ascii_lowercase() || s[at - 1].is_ascii_digit())
}

/// Whether the words before a status name a status other than the current one
/// (`desired_state`, `PreviousState`, `target_status`). Not `last`: ECS's `lastStatus`
/// is its task's current one.
fn names_another_time(prefix: &[u8]) -> bool {
    let prefix = prefix
        .strip_suffix(b"_")
        .or_else(|| prefix.strip_suffix(b"-"))
        .unwrap_or(prefix);
    let prefix = prefix
        .strip_suffix(b".")
        .or_else(|| prefix.strip_suffix(b" "))
        .unwrap_or(prefix);
    let start = (1..prefix.len())
        .rev()
        .find(|&at| starts_word(prefix, at))
        .unwrap_or(0);
    let word = &prefix[start..];
    [
        &b"desired"[..],
        b"target",
        b"previous",
        b"prev",
        b"prior",
        b"expected",
        b"requested",
        b"from",
        b"old",
        b"initial",
        b"original",
        b"next",
        b"goal",
    ]
    .iter()
    .any(|w| word.eq_ignore_ascii_case(w))
}

/// Some term below `terms` (by pattern index) is in `s` as a word of its own.
pub(super) fn reads_pending(ac: &AhoCorasick, s: &[u8], terms: usize) -> bool {
    ac.find_iter(s).any(|m| {
        if m.pattern().as_usize() >= terms {
            return false;
        }
        let before_ok = m.start() == 0 || !s[m.start() - 1].is_ascii_alphanumeric();
        let after_ok = m.end() == s.len() || !s[m.end()].is_ascii_alphanumeric();
        before_ok && after_ok
    })
}

/// Objects and arrays a result may nest, the JSON texts its strings hold included (the
/// event parser's default limit): a deeper text is read as the string it is.
pub(super) const JSON_TEXT_MAX_NESTING: usize = crate::contract::event::DEFAULT_MAX_NESTING;

/// JSON texts read inside one another at most (a result that is one, and one in a field
/// of it: `{"output": "{\"status\": …}"}` written as text); deeper ones are strings.
pub(super) const JSON_TEXT_LEVELS: usize = 2;

/// A pooled buffer that grew past this is let go rather than kept.
const JSON_TEXT_KEEP_BYTES: usize = 64 * 1024;

/// JSON's whitespace.
pub(super) const JSON_WS: [char; 4] = [' ', '\t', '\n', '\r'];

/// Whether a string's content, as written, may be a JSON object or array once unescaped:
/// past spaces and escaped whitespace it starts with `{`, `[` or another escape (`\u007b`),
/// and ends with `}`, `]` or what ends an escape.
fn may_hold_json(content: &[u8]) -> bool {
    let mut t = content;
    while let [b' ', rest @ ..] | [b'\\', b'n' | b't' | b'r', rest @ ..] = t {
        t = rest;
    }
    while let [rest @ .., b' '] = t {
        t = rest;
    }
    matches!(t.first(), Some(b'{' | b'[' | b'\\'))
        && matches!(t.last(), Some(b'}' | b']' | b'n' | b't' | b'r') | Some(b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F'))
}

/// Objects and arrays nested in a value (a scalar: 0).
pub(super) fn value_depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(items) => 1 + items.iter().map(value_depth).max().unwrap_or(0),
        serde_json::Value::Object(map) => 1 + map.values().map(value_depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Whether a string is a pending word and nothing else (but case, spaces and
/// punctuation around it: `Creating…`, `IN_PROGRESS`).
pub(super) fn is_pending_value(ac: &AhoCorasick, s: &[u8]) -> bool {
    let Some(start) = s.iter().position(u8::is_ascii_alphanumeric) else {
        return false;
    };
    let end = s
        .iter()
        .rposition(u8::is_ascii_alphanumeric)
        .map_or(start, |e| e + 1);
    let word = &s[start..end];
    ac.find(word)
        .is_some_and(|m| m.start() == 0 && m.end() == word.len())
}

/// A stack buffer for formatting a number without allocating.
pub(super) struct NumBuf {
    pub(super) buf: [u8; 48],
    pub(super) len: usize,
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
    pub(super) fn as_bytes(&self) -> &[u8] {
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
pub(super) fn next_volatile(s: &[u8], from: usize, p: Patterns<'_>) -> Option<(usize, usize)> {
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

pub(super) fn next_builtin(
    s: &[u8],
    from: usize,
    builtins: &[BuiltinPattern],
) -> Option<(usize, usize)> {
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

pub(super) fn all(s: &[u8], range: std::ops::Range<usize>, f: fn(&u8) -> bool) -> bool {
    range.end <= s.len() && s[range].iter().all(f)
}

pub(super) fn match_uuid(s: &[u8], at: usize) -> Option<usize> {
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
pub(super) fn match_rfc3339(s: &[u8], at: usize) -> Option<usize> {
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

    #[test]
    fn escape_sets_are_the_bytes_they_name() {
        for c in 0..=255u8 {
            assert_eq!(is_canonical_escape(c), b"\"\\bfnrt".contains(&c), "{c:#x}");
            assert_eq!(is_neutral_escape(c), b"\"\\nrt".contains(&c), "{c:#x}");
        }
    }
}

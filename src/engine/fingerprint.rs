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

use crate::engine::content::ContentSample;
use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use sha2::{Digest as _, Sha256};

use crate::contract::json::{
    checked_escape_len, content_has_words, skip, string_close, unescape_into, Json, Scanner,
};
use crate::engine::hash::Shape;

mod canon;
use canon::*;

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

/// Words that make a result read as "still waiting" only where they stand as a status: in
/// a status field, or as a value that is the word alone. A resource's lifecycle as clouds
/// and job APIs write it (RDS `creating`, Azure `Provisioning`, a payment `processing`);
/// in prose they are a log's lines (`Creating s0...`), not a status.
pub const DEFAULT_PENDING_STATUS_TERMS: &[&str] = &[
    "creating",
    "provisioning",
    "deploying",
    "initializing",
    "initialising",
    "processing",
    "building",
    "updating",
    "modifying",
    // A resource on its way down, through maintenance or waiting for capacity is as much
    // a job to wait on (EC2 `stopping`, `shutting-down`; RDS `backing-up`, `rebooting`;
    // AWS Batch `runnable`).
    // Not `restarting` (a container's crash loop) nor `submitted` (a form's answer).
    "stopping",
    "shutting-down",
    "shutting_down",
    "terminating",
    "deleting",
    "rebooting",
    "backing-up",
    "backing_up",
    "runnable",
];

/// Phrases with which a failure says it is passing (an overloaded or rate-limited
/// service): retrying the same call is what it asks for. Not a timeout: a command that
/// timed out (`EXECUTION TIMED OUT`, a test that hangs) times out again; only a gateway's
/// is the service's.
const TRANSIENT_PHRASES: &[&str] = &[
    "temporarily unavailable",
    "service unavailable",
    "too many requests",
    "rate limit",
    "rate limited",
    "throttled",
    "overloaded",
    "again later",
    "not yet ready",
    "please retry",
    "retry later",
    "retry after",
    "gateway timeout",
    "bad gateway",
];

/// Words of an `error_kind` that say the failure is passing, as a run of its words (an
/// exception's type as OpenTelemetry's `error.type` names it: `openai.RateLimitError`,
/// `ThrottlingException`, `ServiceUnavailable`; or a runtime's `rate_limited`,
/// `http_503`): not `timeout`, as for the phrases, nor `unavailable` alone (a seat, a
/// tool), but gRPC's `UNAVAILABLE` whole.
const TRANSIENT_KIND_WORDS: &[&[&str]] = &[
    &["rate", "limit"],
    &["rate", "limited"],
    &["ratelimit"],
    &["ratelimited"],
    &["throttled"],
    &["throttling"],
    &["too", "many", "requests"],
    &["service", "unavailable"],
    &["temporarily", "unavailable"],
    &["resource", "exhausted"],
    &["overloaded"],
    &["transient"],
    &["bad", "gateway"],
    &["gateway", "timeout"],
    &["429"],
    &["502"],
    &["503"],
    &["504"],
];

/// The words of an `error_kind`: its last dotted part (`openai.RateLimitError`), split
/// at `_`, `-`, spaces and case changes, lower case, a last `error` or `exception` left
/// out.
fn kind_words(kind: &str) -> Vec<String> {
    let last = kind.trim().rsplit('.').next().unwrap_or("");
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let bytes = last.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let breaks = matches!(b, b'_' | b'-' | b' ') || (i > 0 && case_changes(bytes, i));
        if breaks && !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
        if b.is_ascii_alphanumeric() {
            word.push(b.to_ascii_lowercase() as char);
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    if words.len() > 1
        && matches!(
            words.last().map(String::as_str),
            Some("error" | "exception")
        )
    {
        words.pop();
    }
    words
}

/// A failure's result longer than this is not read for a transient phrase: a service's
/// error is short; a long output (a test run naming `test_rate_limit`, a file) is
/// content.
const TRANSIENT_SCAN_MAX_BYTES: usize = 1024;

static TRANSIENT: std::sync::LazyLock<AhoCorasick> = std::sync::LazyLock::new(|| {
    AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .match_kind(MatchKind::LeftmostLongest)
        .build(TRANSIENT_PHRASES)
        .expect("fixed phrases build")
});

/// Whether a failed call says its failure is passing: by its `error_kind`, or by a phrase
/// standing as words (between spaces or punctuation, not inside a name such as
/// `test_rate_limit` or `x-ratelimit-remaining`) in a result of at most
/// [`TRANSIENT_SCAN_MAX_BYTES`] (a 503's "temporarily unavailable", a 429's "too many
/// requests"). Such a call is retried as a `retry_safe` tool's is.
pub fn reads_transient(error_kind: Option<&str>, result: Option<&Json>) -> bool {
    if let Some(kind) = error_kind {
        let words = kind_words(kind);
        let says = TRANSIENT_KIND_WORDS.iter().any(|run| {
            words
                .windows(run.len())
                .any(|w| w.iter().zip(run.iter()).all(|(a, b)| a == b))
        });
        if says || kind.trim() == "UNAVAILABLE" {
            return true;
        }
    }
    let Some(text) = result.map(|r| r.as_str().as_bytes()) else {
        return false;
    };
    if text.len() > TRANSIENT_SCAN_MAX_BYTES {
        return false;
    }
    // Before a phrase, the text's start, a separator, or an escaped line break or tab
    // (`503\nService Unavailable`, as the JSON text writes it).
    let apart = |b: u8| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'/'));
    let escaped_break =
        |at: usize| at >= 2 && text[at - 2] == b'\\' && matches!(text[at - 1], b'n' | b'r' | b't');
    TRANSIENT.find_iter(text).any(|m| {
        (m.start() == 0 || apart(text[m.start() - 1]) || escaped_break(m.start()))
            && (m.end() == text.len() || apart(text[m.end()]))
    })
}

/// How a shell command sleeps: only (`sleep 30`, a wait), or first and then checks on
/// something (`sleep 60 && tail -n 3 apply.log`: a check after its own sleep).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sleeps {
    Only,
    First,
}

/// Whether a call's arguments are a shell command that sleeps, only or first: a wait, or
/// a check after a wait, whatever the tool's name. The command is the arguments
/// themselves when they are a string, else their `command`, `cmd` or `script`: a string,
/// or an argv whose last word is the command (`["bash", "-lc", "sleep 900"]`) or which
/// is one (`["sleep", "900"]`). Arguments written as a JSON text are read as its JSON;
/// arguments over [`SLEEP_ARGS_MAX_BYTES`] are a command of their own.
pub fn sleeps(args: Option<&Json>) -> Option<Sleeps> {
    let naming_sleep = |raw: &[u8]| memchr::memmem::find(raw, b"sleep").is_some();
    read_args(args, naming_sleep).and_then(|v| sleeps_in(&v))
}

/// A call's arguments as JSON, for a rule about what they name: `None` where they are
/// over [`SLEEP_ARGS_MAX_BYTES`] or `names` finds nothing in their text (most calls:
/// they are not parsed). Arguments written as a JSON text (an object in a string) are
/// read as its JSON.
fn read_args(args: Option<&Json>, names: impl Fn(&[u8]) -> bool) -> Option<serde_json::Value> {
    let raw = args.map(|a| a.as_str())?;
    if raw.len() > SLEEP_ARGS_MAX_BYTES || !names(raw.as_bytes()) {
        return None;
    }
    match serde_json::from_str(raw).ok()? {
        serde_json::Value::String(text) if text.trim_start().starts_with('{') => {
            serde_json::from_str(&text).ok()
        }
        value => Some(value),
    }
}

/// Whether a call lasted the time its arguments let it block (`timeout_ms: 10000` and a
/// 10 s call, `WaitTimeSeconds: 20` and a 20 s one): a read that waited for something to
/// arrive (a board's serial output, a queue's message, a long poll) and timed out. Its
/// answer is what it waited on so far, so it is judged as a poll's. A top-level key
/// that names a timeout or a wait (any case) with a number: in milliseconds when it ends
/// so (`ms`, `millis`, `milliseconds`), in seconds when it ends so (`_s`, `sec`, `secs`,
/// `seconds`); one that ends in `timeout` or `wait` (`timeout`, `read_timeout`,
/// `max_wait`) in milliseconds when it is whole seconds written so (30000), else in
/// seconds (30, 1800). The call must have lasted a second at least, and 0.9 to 1.5
/// times that time (a second more for the round trip). Not a shell command (its
/// `command`, `cmd` or `script`) nor code or a query (`code`, `query`, `sql`,
/// `statement`, `expression`): a timeout there guards against a hang; nor a request
/// whose `method` is other than `GET` or `HEAD` (a change waits for no news). Arguments
/// over [`SLEEP_ARGS_MAX_BYTES`] are not read; arguments written as a JSON text are read
/// as its JSON.
pub fn waited_out_its_timeout(args: Option<&Json>, duration_ms: Option<f64>) -> bool {
    let Some(duration) = duration_ms.filter(|d| *d >= 1000.0) else {
        return false;
    };
    let names = |raw: &[u8], word: &[u8]| {
        raw.windows(word.len())
            .any(|w| w.eq_ignore_ascii_case(word))
    };
    let naming_a_wait = |raw: &[u8]| names(raw, b"timeout") || names(raw, b"wait");
    let Some(serde_json::Value::Object(keys)) = read_args(args, naming_a_wait) else {
        return false;
    };
    // A command's or a query's timeout guards against a hang (a test that deadlocks, a
    // script stuck in a loop, a search that times out, time out again), and a request
    // that changes something waits for no news. Keys in any case, as the timeout's.
    let is = |key: &str, names: &[&str]| names.iter().any(|n| key.eq_ignore_ascii_case(n));
    let changes =
        |value: &serde_json::Value| value.as_str().is_none_or(|m| !is(m, &["GET", "HEAD"]));
    let runs_or_changes = |(key, value): (&String, &serde_json::Value)| {
        is(key, &COMMAND_KEYS) || is(key, &QUERY_KEYS) || (is(key, &["method"]) && changes(value))
    };
    let a_read = !keys.iter().any(runs_or_changes);
    a_read
        && keys.iter().any(|(key, value)| {
            let limit = value.as_f64().and_then(|n| timeout_ms(key, n));
            limit.is_some_and(|t| t > 0.0 && duration >= 0.9 * t && duration <= 1.5 * t + 1000.0)
        })
}

/// Keys that name code or a query a call runs (beside [`COMMAND_KEYS`]): its timeout
/// bounds the work, it does not wait for something to arrive.
const QUERY_KEYS: [&str; 5] = ["code", "query", "sql", "statement", "expression"];

/// The milliseconds a key of a call's arguments gives it to block, if it names a
/// timeout or a wait (see [`waited_out_its_timeout`]).
fn timeout_ms(key: &str, n: f64) -> Option<f64> {
    let key = key.to_ascii_lowercase();
    if !(key.contains("timeout") || key.contains("wait")) {
        return None;
    }
    let ends = |suffixes: &[&str]| suffixes.iter().any(|s| key.ends_with(s));
    if ends(&["ms", "millis", "milliseconds"]) {
        Some(n)
    } else if ends(&["_s", "sec", "secs", "seconds"]) {
        Some(n * 1000.0)
    } else if ends(&["timeout", "wait"]) {
        // No unit: whole seconds written in milliseconds (30000, 5000) are milliseconds;
        // another number (30, 1800, 3600) is seconds.
        Some(if n >= 1000.0 && n % 1000.0 == 0.0 {
            n
        } else {
            n * 1000.0
        })
    } else {
        None
    }
}

/// Bytes of a call's arguments read for a shell `sleep` (a harness's description and
/// timeout beside the command fit).
pub const SLEEP_ARGS_MAX_BYTES: usize = 1024;

/// Keys a shell tool names its command by.
const COMMAND_KEYS: [&str; 3] = ["command", "cmd", "script"];

fn sleeps_in(args: &serde_json::Value) -> Option<Sleeps> {
    use serde_json::Value;
    let argv = |words: &[Value]| {
        let last = words.last().and_then(Value::as_str);
        last.and_then(command_sleeps).or_else(|| {
            let whole: Option<Vec<&str>> = words.iter().map(Value::as_str).collect();
            whole.and_then(|w| command_sleeps(&w.join(" ")))
        })
    };
    match args {
        Value::String(s) => command_sleeps(s),
        Value::Object(m) => COMMAND_KEYS.iter().find_map(|k| match m.get(*k) {
            Some(Value::String(s)) => command_sleeps(s),
            Some(Value::Array(words)) => argv(words),
            _ => None,
        }),
        _ => None,
    }
}

/// A command's sleeps: its first step a `sleep` (steps split at `;`, `&&`, `||` and line
/// breaks; a `cd` before it is where the command runs), and the steps after it idle too
/// (only: more sleeps, `true`, `:`, an `echo` of words: `sleep 60 || true`, `sleep 60 &&
/// echo waited`) or not (first). A command whose first step is no sleep (`make; sleep 5`)
/// does not wait before it checks, nor does one that sleeps under a second first (`sleep
/// 0.2 && make` is no wait on anything).
fn command_sleeps(command: &str) -> Option<Sleeps> {
    let mut steps = command
        .split(['\n', ';'])
        .flat_map(|s| s.split("&&"))
        .flat_map(|s| s.split("||"))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .skip_while(|s| s.split_whitespace().next() == Some("cd"));
    let slept = sleep_seconds(steps.next()?)?;
    if steps.all(|s| sleep_seconds(s).is_some() || is_idle_step(s)) {
        Some(Sleeps::Only)
    } else {
        (slept >= 1.0).then_some(Sleeps::First)
    }
}

/// A step that checks on nothing: `true`, `:`, `date` (in any format), or an `echo` of
/// words (not of a command's output: `echo $(kubectl get pods)` checks).
fn is_idle_step(step: &str) -> bool {
    let substitutes = step.contains("$(") || step.contains('`');
    match step.split_whitespace().next() {
        Some("true" | ":") => step.split_whitespace().nth(1).is_none(),
        Some("date" | "echo") => !substitutes,
        _ => false,
    }
}

/// The seconds a step sleeps when it is `sleep` and one or more durations (a number, then
/// `s`, `m`, `h` or `d`), and nothing else.
fn sleep_seconds(command: &str) -> Option<f64> {
    let mut words = command.split_whitespace();
    if words.next() != Some("sleep") {
        return None;
    }
    let mut seconds = None;
    for w in words {
        let (number, unit) = match w.strip_suffix(['s', 'm', 'h', 'd']) {
            Some(n) => (n, w.as_bytes()[w.len() - 1]),
            None => (w, b's'),
        };
        let n = number
            .parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n >= 0.0)?;
        let scale = match unit {
            b'm' => 60.0,
            b'h' => 3600.0,
            b'd' => 86_400.0,
            _ => 1.0,
        };
        seconds = Some(seconds.unwrap_or(0.0) + n * scale);
    }
    seconds
}

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
    /// The keys naming an identifier (ending in `id`), normalized: those a key may end
    /// with ([`KeySet::contains_key_or_last_words`]).
    ids: Vec<Box<[u8]>>,
    /// The longest of them, normalized: how far from its end a key is read.
    longest_id: usize,
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
        let ids: Vec<Box<[u8]>> = normalized
            .iter()
            .filter(|k| k.ends_with(b"id"))
            .cloned()
            .collect();
        let longest_id = ids.iter().map(|k| k.len()).max().unwrap_or(0);
        KeySet {
            normalized,
            lengths,
            ids,
            longest_id,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.normalized.is_empty()
    }

    /// Whether the key is in the set, or its last words are one of its identifiers:
    /// `subagent_session_id` and `subagentSessionId` end with `session_id` (an id each
    /// call makes anew). Not a measurement (`p99_latency_ms`, `query_time`: the answer of
    /// a benchmark or a query), and not after a `.` or inside a word. A word starts after
    /// `_` or `-`, or at an upper-case letter after a lower-case one or a digit. The key
    /// is read from its end, no further than the longest identifier.
    pub fn contains_key_or_last_words(&self, key: &[u8]) -> bool {
        if self.contains(key) {
            return true;
        }
        let mut normalized = 0;
        for at in (1..key.len()).rev() {
            if !matches!(key[at], b'_' | b'-') {
                normalized += 1;
            }
            if normalized > self.longest_id {
                return false;
            }
            let starts = !matches!(key[at], b'_' | b'-')
                && (matches!(key[at - 1], b'_' | b'-') || case_changes(key, at));
            if starts
                && self.ids.iter().any(|k| {
                    k.len() == normalized && k.iter().copied().eq(normalize_key(&key[at..]))
                })
            {
                return true;
            }
        }
        false
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
    /// The pending terms, then the status terms (the first `prose_terms` patterns read in
    /// prose too).
    pending: Option<AhoCorasick>,
    prose_terms: usize,
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
    pub pending_status_terms: Vec<String>,
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
            pending_status_terms: DEFAULT_PENDING_STATUS_TERMS
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
    /// It does so as a status: a status field, or a value that is a pending word alone.
    pub status_pending: bool,
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
    json_texts: Vec<String>,
}

impl Default for Fingerprinter {
    fn default() -> Self {
        Fingerprinter::new(&FingerprintSpec::default())
    }
}

impl Fingerprinter {
    pub fn new(spec: &FingerprintSpec) -> Fingerprinter {
        let terms: Vec<&String> = (spec.pending_terms.iter())
            .chain(&spec.pending_status_terms)
            .collect();
        let pending = if terms.is_empty() {
            None
        } else {
            AhoCorasickBuilder::new()
                .ascii_case_insensitive(true)
                .match_kind(MatchKind::LeftmostLongest)
                .build(&terms)
                .ok()
        };
        Fingerprinter {
            arg_keys: KeySet::new(&spec.volatile_arg_keys),
            result_keys: KeySet::new(&spec.volatile_result_keys),
            builtins: spec.builtin_patterns.clone(),
            custom_patterns: spec.custom_patterns.clone(),
            pending,
            prose_terms: spec.pending_terms.len(),
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
                    crate::contract::json::unescape(
                        &text[start..end],
                        text[start..end].contains('\\'),
                    )
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
            c.pending = (self.pending.as_ref()).map(|ac| (ac, PendingScan::new(self.prose_terms)));
            // A tool's result is often JSON written as text (MCP's text content, a
            // function tool returning `json.dumps(...)`, a shell's `curl`): read as the
            // JSON it holds, its volatile keys dropped and its status fields read.
            c.json_text = true;
            match result {
                Some(r) => c.document(r.as_str().as_bytes(), false),
                None => c.put(b"null"),
            }
        }
        let pending = c.pending.as_ref().is_some_and(|(_, scan)| scan.pending());
        let status_pending = (c.pending.as_ref()).is_some_and(|(_, scan)| scan.status_pending());
        let has_words = c.words.unwrap_or(false);
        let over_lines = c.json_text_over_lines;
        // The shape reads the canonical text in one pass (escapes as separators).
        let mut shape = Shape::default();
        shape.json(&scratch.canonical);
        let digest = Fp::of(&scratch.canonical);
        // The content sample reads a JSON text written over lines as the agent did, line
        // by line, keys and all: the JSON's values alone are too few lines to judge a
        // result by (a search's five chunks, their ids too short to be content). One
        // written on one line (`json.dumps`) would be a single line that way: its
        // values are its lines. A result without words has no sample.
        if let (true, true, Some(r)) = (over_lines, has_words, result) {
            let mut c = Canon::new(scratch, &self.result_keys, None);
            c.patterns = Some(Patterns {
                builtins: &self.builtins,
                custom: &self.custom_patterns,
            });
            c.document(r.as_str().as_bytes(), false);
        }
        ResultPrint {
            digest,
            shape: shape.finish(),
            pending,
            status_pending,
            has_words,
        }
    }
}

impl Scratch {
    /// The lines the last result fingerprinted showed, sampled (see [`crate::engine::content`]);
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
        ContentSample::of_canonical(&head[..end]).cut_short()
    }
}

/// Bytes of a result's canonical text read for its content sample: what an agent reads
/// of a long output is its beginning, and the work per call stays bounded.
pub const CONTENT_BYTES_MAX: usize = 8 * 1024;

#[cfg(test)]
mod tests;

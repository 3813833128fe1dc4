//! Driving the engine over a JSON Lines input (`replay`, `backtest`) on every core, with
//! the outputs of one thread.
//!
//! Sessions are independent, so the sessions are split over `threads` engines (shards,
//! by a hash of the session id), each applying its sessions' events in input order. What
//! ties sessions together is the stream's clock — the latest event time seen, which
//! closes idle sessions — so every event is applied at the clock the whole input had
//! reached at it, whichever shard it lands on. Each output is placed where one engine
//! over the whole input would have emitted it: an event's own outputs at the event, an
//! idle close at the first event whose clock passed the session's deadline (ties by
//! deadline, then session id, as the engine closes them), the end of input's closes by
//! session id. Merging by place gives the same bytes as one thread, for any number of
//! threads (a property test holds it).
//!
//! The input is read in batches of whole lines on a thread of its own, or, when its bytes
//! are already in memory (a mapped file), cut into batches in place. A batch is parsed
//! on every core (its events borrow from its bytes, each hashed to its shard) while the
//! batch before it is applied by the shards and, on the calling thread, the outputs of
//! the batch before that are merged and handed on (so outputs leave one batch behind the
//! reading, and the workers wait when handing them on is slower than the batch); then the
//! parsed batch's clock is computed in one short sequential pass.
//! Memory stays bounded by the batch size and the open sessions, whatever the input's
//! length (a mapped file's pages are the page cache's, read once in order: they count in
//! the resident memory, and the kernel takes them back when it needs to).

pub mod input;

use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::sync::Arc;

use rayon::prelude::*;
use rustc_hash::FxHasher;

use crate::config::Config;
use crate::engine::{event_time, CloseAt, Engine, EventMeta};
use crate::event::{parse_event, BadEvent, Event, ParseLimits};
use crate::output::{ClosedBy, Output};

/// Shards (engines) per worker thread when there is more than one thread.
const SHARDS_PER_THREAD: usize = 4;

/// Bytes read per batch by default (whole lines: a batch ends at the last line break).
pub const BATCH_BYTES: usize = 1 << 20;

/// What the driving loop read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Read {
    pub lines: u64,
    pub events: u64,
    pub bad_lines: u64,
}

/// One step of a drive, as a shard sees it.
pub enum Step<'a> {
    /// An event the shard's engine applied, whether it dropped it as an exact duplicate;
    /// the outputs are the idle closes due before it, then what it caused.
    Event {
        event: &'a Event<'a>,
        duplicate: bool,
    },
    /// Idle closes between events (at the end of a batch).
    Clock,
    /// The end of the input: every open session of the shard was closed.
    End,
}

/// Why a drive stopped early (fatal).
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    #[error("reading input failed: {0}")]
    Read(std::io::Error),
    #[error("writing output failed: {0}")]
    Write(std::io::Error),
    #[error("line {line}: {reason} (stopping: --strict)")]
    BadLine { line: u64, reason: String },
}

/// What a shard does with each step: accounting (the backtest) or nothing (replay).
pub trait Sink: Send {
    fn step(&mut self, step: Step<'_>, outputs: &[Output]);
}

impl Sink for () {
    fn step(&mut self, _: Step<'_>, _: &[Output]) {}
}

/// How a drive runs.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Engines (and worker threads); 1 runs everything on the calling thread.
    pub threads: usize,
    /// A bad line stops the drive (instead of being reported and skipped).
    pub strict: bool,
    /// Collect the outputs in order for `on_outputs` (off: only the sinks see them).
    pub ordered_outputs: bool,
    /// With `ordered_outputs`: render each output's JSON line on its shard's thread
    /// (`on_outputs` gets it beside the output; otherwise an empty string).
    pub render_json: bool,
    /// Bytes read per batch ([`BATCH_BYTES`]).
    pub batch_bytes: usize,
}

/// The cores this process may use.
pub fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS))
}

/// The most threads a drive takes: each adds shards and their containers that every
/// batch visits, so the fixed cost grows faster than the threads (at 1,000 threads an
/// empty input took seconds); far more than a replay gains from.
pub const MAX_THREADS: usize = 256;

/// Where one engine over the whole input would have emitted an output.
#[derive(Debug, Clone, Copy)]
struct Place {
    /// The input line (of the event, or of the first event whose clock closed it).
    line: u64,
    /// 0: an idle close (before the line's event is applied); 1: the event's own.
    phase: u8,
    deadline: i64,
    seq: u32,
}

fn compare(a: &(Place, Output, String), b: &(Place, Output, String)) -> Ordering {
    let (pa, pb) = (&a.0, &b.0);
    pa.line
        .cmp(&pb.line)
        .then(pa.phase.cmp(&pb.phase))
        .then(pa.deadline.cmp(&pb.deadline))
        .then_with(|| session_of(&a.1).cmp(session_of(&b.1)))
        .then(pa.seq.cmp(&pb.seq))
}

fn session_of(o: &Output) -> &str {
    match o {
        Output::Finding(f) => &f.session_id,
        Output::Summary(s) => &s.session_id,
    }
}

/// A valid event of a batch: where it is among the batch's parsed lines, its line, and
/// the stream's clock once it is applied.
struct Mark {
    index: u32,
    line: u64,
    clock: i64,
}

/// A batch's line as parsed: an event, a bad line, or nothing (an empty line).
type Parsed<'b> = Option<Result<Event<'b>, BadEvent>>;

/// A batch's line as parsed, and the shard of its event's session (hashed on the
/// parsing threads, not in the sequential pass).
struct Line<'b> {
    parsed: Parsed<'b>,
    shard: u32,
}

struct Shard<S> {
    engine: Engine,
    sink: S,
    /// This batch's events of the shard (indices into the batch's marks).
    mine: Vec<u32>,
    placed: Vec<(Place, Output, String)>,
    /// Render each output's JSON line here, on the shard's thread.
    render: bool,
    outputs: Vec<Output>,
    deadlines: Vec<CloseAt>,
}

impl<S: Sink> Shard<S> {
    fn new(engine: Engine, sink: S, render: bool) -> Shard<S> {
        Shard {
            engine,
            sink,
            mine: Vec::new(),
            placed: Vec::new(),
            render,
            outputs: Vec::new(),
            deadlines: Vec::new(),
        }
    }

    /// The line of the first event of the batch whose clock reached `clock`.
    fn line_at(marks: &[Mark], clock: i64) -> u64 {
        let i = marks.partition_point(|m| m.clock < clock);
        marks.get(i).map_or(u64::MAX, |m| m.line)
    }

    fn run(&mut self, lines: &[Line<'_>], marks: &[Mark], keep: bool) {
        let meta = EventMeta::default();
        let mine = std::mem::take(&mut self.mine);
        for &k in &mine {
            let mark = &marks[k as usize];
            let Some(Ok(event)) = &lines[mark.index as usize].parsed else {
                continue; // marks are made of events only
            };
            self.engine.advance_clock_with_deadlines(
                mark.clock,
                &mut self.outputs,
                &mut self.deadlines,
            );
            let closes = self.outputs.len();
            let before = self.engine.counters().duplicates;
            self.engine.process(event, &meta, &mut self.outputs);
            let duplicate = self.engine.counters().duplicates > before;
            self.sink
                .step(Step::Event { event, duplicate }, &self.outputs);
            self.place(marks, mark.line, closes, keep);
        }
        self.mine = mine;
        if let Some(last) = marks.last() {
            self.engine.advance_clock_with_deadlines(
                last.clock,
                &mut self.outputs,
                &mut self.deadlines,
            );
            if !self.outputs.is_empty() {
                self.sink.step(Step::Clock, &self.outputs);
                let n = self.outputs.len();
                self.place(marks, u64::MAX, n, keep);
            }
        }
    }

    /// Places the outputs of one step: the first `closes` are idle closes.
    fn place(&mut self, marks: &[Mark], line: u64, closes: usize, keep: bool) {
        if !keep {
            self.outputs.clear();
            self.deadlines.clear();
            return;
        }
        for (i, o) in self.outputs.drain(..).enumerate() {
            let place = if i < closes {
                let at = self.deadlines[i];
                Place {
                    line: Self::line_at(marks, at.clock),
                    phase: 0,
                    deadline: at.deadline,
                    seq: 0,
                }
            } else {
                Place {
                    line,
                    phase: 1,
                    deadline: 0,
                    seq: (i - closes) as u32,
                }
            };
            let json = rendered(self.render, &o);
            self.placed.push((place, o, json));
        }
        self.deadlines.clear();
    }

    fn end(&mut self, keep: bool) {
        self.engine
            .close_all(ClosedBy::EndOfInput, &mut self.outputs);
        self.sink.step(Step::End, &self.outputs);
        if keep {
            for o in self.outputs.drain(..) {
                let place = Place {
                    line: u64::MAX,
                    phase: 2,
                    deadline: 0,
                    seq: 0,
                };
                let json = rendered(self.render, &o);
                self.placed.push((place, o, json));
            }
        }
        self.outputs.clear();
    }
}

fn rendered(render: bool, o: &Output) -> String {
    if render {
        o.to_json()
    } else {
        String::new()
    }
}

fn shard_of(session: &str, shards: usize) -> usize {
    if shards == 1 {
        return 0; // one engine: no hash of the session id to pay for
    }
    let mut h = FxHasher::default();
    session.hash(&mut h);
    (h.finish() % shards as u64) as usize
}

/// What a drive reads.
pub enum Input<'a> {
    /// Read in batches on a thread of its own, each copied into a buffer (standard input,
    /// a decompressed file, OTLP mapped to events).
    Reader(&'a mut (dyn BufRead + Send)),
    /// Bytes already in memory, such as a mapped file: each batch is a slice of them, so
    /// nothing is copied (reading a file costs its copy from the page cache otherwise, a
    /// tenth of a one-thread replay's CPU, taken from the workers on a busy machine).
    Bytes(Arc<dyn AsRef<[u8]> + Send + Sync>),
}

/// A batch of whole lines: the first `len` bytes of a buffer that is handed back and
/// forth between the reader and the driver (so that it is neither allocated nor zeroed
/// again for every batch), or a slice of the input's bytes.
enum Batch {
    Buffer {
        buf: Vec<u8>,
        len: usize,
        /// The lines the reader cut short, in order.
        cut: Vec<LongLine>,
    },
    Slice {
        bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
        start: usize,
        end: usize,
    },
}

/// A line longer than an event may be, cut short by [`read_batches`]: where it starts in
/// its batch, and its length without its line break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LongLine {
    start: usize,
    size: usize,
}

impl Batch {
    fn bytes(&self) -> &[u8] {
        match self {
            Batch::Buffer { buf, len, .. } => &buf[..*len],
            Batch::Slice { bytes, start, end } => &(**bytes).as_ref()[*start..*end],
        }
    }

    fn cut(&self) -> &[LongLine] {
        match self {
            Batch::Buffer { cut, .. } => cut,
            Batch::Slice { .. } => &[],
        }
    }
}

/// Whole-line batches of bytes in memory, as [`read_batches`] cuts a read input: about
/// `batch_bytes` each, ending at the last line break (a longer line is taken whole), the
/// last one perhaps without a line break.
struct Slices {
    bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    at: usize,
    batch_bytes: usize,
}

impl Iterator for Slices {
    type Item = std::io::Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        let all = (*self.bytes).as_ref();
        let start = self.at;
        if start >= all.len() {
            return None;
        }
        let want = start.saturating_add(self.batch_bytes).min(all.len());
        let end = if want == all.len() {
            want
        } else {
            match memchr::memrchr(b'\n', &all[start..want]) {
                Some(i) => start + i + 1,
                None => memchr::memchr(b'\n', &all[want..]).map_or(all.len(), |i| want + i + 1),
            }
        };
        self.at = end;
        Some(Ok(Batch::Slice {
            bytes: self.bytes.clone(),
            start,
            end,
        }))
    }
}

/// Reads whole-line batches of `input` onto `tx` (the last one may lack a line break),
/// reusing the buffers that come back on `recycled`. A line longer than `line_limit` is
/// kept only up to its first `line_limit + 1` bytes, enough to be judged oversized, and
/// read past to its end; its length goes with the batch ([`Batch::Buffer`]'s `cut`). So
/// the memory held stays about the batch size whatever the input (`/dev/zero` too).
fn read_batches(
    input: &mut (dyn BufRead + Send),
    batch_bytes: usize,
    line_limit: usize,
    tx: mpsc::SyncSender<std::io::Result<Batch>>,
    recycled: mpsc::Receiver<Vec<u8>>,
) {
    let keep = line_limit.saturating_add(1);
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let mut buf = recycled.try_recv().unwrap_or_default();
        let want = batch_bytes.max(carry.len() + 4096);
        if buf.len() < want {
            buf.resize(want, 0);
        }
        buf[..carry.len()].copy_from_slice(&carry);
        let mut len = carry.len();
        carry.clear();
        let mut cut = Vec::new();
        // Where the line being read starts: after the last line break read (the carry
        // is the start of a line), so `line_start > 0` once the batch holds one.
        let mut line_start = 0;
        // Read up to the batch size, and on until the batch holds a line break, or the
        // input ends.
        let mut eof = false;
        while !(len >= batch_bytes && line_start > 0) {
            if len == buf.len() {
                buf.resize(len + (64 << 10), 0); // reading on for a line break
            }
            let n = match read_some(input, &mut buf[len..]) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => n,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            if let Some(i) = memchr::memrchr(b'\n', &buf[len..len + n]) {
                line_start = len + i + 1;
            }
            len += n;
            if len - line_start <= keep {
                continue;
            }
            // A line too long to be an event: its first bytes stay, the rest is read
            // past (in the buffer's free space) up to its line break.
            match cut_long_line(input, &mut buf, len, line_start, keep) {
                Ok(cut_line) => {
                    cut.push(cut_line.line);
                    (len, line_start, eof) = (cut_line.len, cut_line.line_start, cut_line.eof);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
            if eof {
                break;
            }
        }
        if !eof {
            let nl = memchr::memrchr(b'\n', &buf[..len]).expect("read on until a line break");
            carry.extend_from_slice(&buf[nl + 1..len]);
            len = nl + 1;
        }
        if len > 0 && tx.send(Ok(Batch::Buffer { buf, len, cut })).is_err() {
            return;
        }
        if eof {
            return;
        }
    }
}

/// A line cut short by [`cut_long_line`], and where the batch stands after it.
struct CutLine {
    line: LongLine,
    /// The batch's bytes: the kept start of the line, then what was read after its break.
    len: usize,
    /// Where the line being read now starts.
    line_start: usize,
    /// Whether the input ended (inside the long line, or right after it).
    eof: bool,
}

/// Keeps the first `keep` bytes of the line that starts at `line_start` of `buf[..len]`
/// and reads past the rest of it up to its line break, in the buffer's free space; the
/// line break and what was read after it follow the kept bytes.
fn cut_long_line(
    input: &mut (dyn BufRead + Send),
    buf: &mut Vec<u8>,
    len: usize,
    line_start: usize,
    keep: usize,
) -> std::io::Result<CutLine> {
    let start = line_start;
    let mut line_start = line_start;
    let mut size = len - line_start;
    // Whether the last byte read past is a carriage return (of a `\r\n` line break,
    // which is not counted, as in `parse_batch`).
    let mut cr = buf[len - 1] == b'\r';
    let mut len = line_start + keep;
    if buf.len() - len < (64 << 10) {
        buf.resize(len + (64 << 10), 0);
    }
    let mut eof = false;
    loop {
        let n = read_some(input, &mut buf[len..])?;
        if n == 0 {
            eof = true;
            break;
        }
        let Some(i) = memchr::memchr(b'\n', &buf[len..len + n]) else {
            size += n;
            cr = buf[len + n - 1] == b'\r';
            continue;
        };
        size += i;
        if i > 0 {
            cr = buf[len + i - 1] == b'\r';
        }
        // The line break and what was read after it follow the kept bytes.
        buf.copy_within(len + i..len + n, len);
        let after = len + 1;
        len += n - i;
        line_start = memchr::memrchr(b'\n', &buf[after..len]).map_or(after, |j| after + j + 1);
        break;
    }
    Ok(CutLine {
        line: LongLine {
            start,
            size: size - usize::from(cr),
        },
        len,
        line_start,
        eof,
    })
}

/// `read`, again when interrupted by a signal.
fn read_some(input: &mut (dyn BufRead + Send), buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match input.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            read => return read,
        }
    }
}

/// A line without its line break (`\n` or `\r\n`), as its size is judged.
fn unbroken(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn trim_line(line: &[u8]) -> &[u8] {
    let mut end = line.len();
    while end > 0 && matches!(line[end - 1], b'\n' | b'\r' | b' ' | b'\t') {
        end -= 1;
    }
    let mut start = 0;
    while start < end && matches!(line[start], b' ' | b'\t') {
        start += 1;
    }
    &line[start..end]
}

/// A batch's lines as parsed, borrowing from its bytes.
struct Lines<'b> {
    parsed: Vec<Line<'b>>,
}

self_cell::self_cell!(
    /// A batch of whole lines and the events parsed from it (which borrow from it), so
    /// that one batch can be parsed while the one before is applied.
    struct ParsedBatch {
        owner: Batch,
        #[covariant]
        dependent: Lines,
    }
);

/// The containers a parsed batch borrows nothing in, kept from batch to batch (a batch's
/// parsed events are ~360 bytes a line: allocated afresh, every batch would fault in its
/// pages again).
#[derive(Default)]
struct Spare {
    lines: Vec<&'static [u8]>,
    parsed: Vec<Line<'static>>,
}

/// An empty vector as one of the same type with another lifetime, keeping its
/// allocation: collecting a vector's iterator into one of the same layout reuses it in
/// place.
fn relabel<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter()
        .map(|_| unreachable!("the vector was cleared"))
        .collect()
}

fn parse_batch(
    batch: Batch,
    limits: &ParseLimits,
    shards: usize,
    pool: Option<&rayon::ThreadPool>,
    spare: &mut Spare,
) -> ParsedBatch {
    let (spare_lines, spare_parsed) = (
        std::mem::take(&mut spare.lines),
        std::mem::take(&mut spare.parsed),
    );
    ParsedBatch::new(batch, |batch| {
        let bytes = batch.bytes();
        let mut lines: Vec<&[u8]> = relabel(spare_lines);
        let mut start = 0;
        while start < bytes.len() {
            let end = memchr::memchr(b'\n', &bytes[start..]).map_or(bytes.len(), |i| start + i + 1);
            lines.push(&bytes[start..end]);
            start = end;
        }
        fn parse<'b>(line: &'b [u8], limits: &ParseLimits, shards: usize) -> Line<'b> {
            // A line's size is judged before it is trimmed, as the reader judges it when
            // it cuts one short: whatever the input, the same lines are oversized.
            let unbroken = unbroken(line);
            if unbroken.len() > limits.max_event_bytes {
                let oversized = BadEvent::Oversized {
                    size: unbroken.len(),
                    limit: limits.max_event_bytes,
                };
                return Line {
                    parsed: Some(Err(oversized)),
                    shard: 0,
                };
            }
            let t = trim_line(line);
            let parsed = (!t.is_empty()).then(|| parse_event(t, limits));
            let shard = match &parsed {
                Some(Ok(event)) => shard_of(&event.session_id, shards) as u32,
                _ => 0,
            };
            Line { parsed, shard }
        }
        let mut parsed = relabel(spare_parsed);
        match pool {
            Some(_) => lines
                .par_iter()
                .map(|l| parse(l, limits, shards))
                .collect_into_vec(&mut parsed),
            None => parsed.extend(lines.iter().map(|l| parse(l, limits, shards))),
        }
        // The lines cut short are oversized at their whole length, whatever their first
        // bytes read as (a kept part ending in `\r` is one byte shorter once its break is
        // stripped, and could read as an event).
        for long in batch.cut() {
            let at = lines
                .partition_point(|l| (l.as_ptr() as usize - bytes.as_ptr() as usize) < long.start);
            if let Some(line) = parsed.get_mut(at) {
                *line = Line {
                    parsed: Some(Err(BadEvent::Oversized {
                        size: long.size,
                        limit: limits.max_event_bytes,
                    })),
                    shard: 0,
                };
            }
        }
        spare.lines = relabel(lines);
        Lines { parsed }
    })
}

/// A parsed batch ready to apply: where its events go and at what clock.
struct Ready {
    batch: ParsedBatch,
    marks: Vec<Mark>,
    /// Per shard, its events (indices into `marks`).
    assigned: Vec<Vec<u32>>,
    /// `--strict` met a bad line: stop after this batch.
    stop: Option<DriveError>,
}

/// Runs the events of `input` through `threads` engines (see the module docs). Bad lines
/// are reported to `errors` with their line number and skipped, or are fatal with
/// `strict`. `make_sink` gives each shard its sink; with `ordered_outputs`, `on_outputs`
/// gets every output (and its JSON line, with `render_json`), batch after batch, in one
/// thread's order. Returns what was read and the shards' sinks.
pub fn drive<S: Sink>(
    config: Arc<Config>,
    input: Input<'_>,
    errors: &mut dyn Write,
    options: Options,
    make_sink: impl Fn() -> S,
    on_outputs: impl FnMut(&mut Vec<(Output, String)>) -> Result<(), DriveError>,
) -> Result<(Read, Vec<S>), DriveError> {
    let threads = options.threads.max(1);
    // More shards than threads: a shard's events run in order on one thread, so with
    // one shard per thread the batch waits for the busiest; smaller shards let the
    // threads even out (outputs are merged by place, whatever the count).
    let shard_count = if threads > 1 {
        threads * SHARDS_PER_THREAD
    } else {
        1
    };
    let pool = (threads > 1)
        .then(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("loopwarden-shard-{i}"))
                .build()
        })
        .transpose()
        .map_err(|e| DriveError::Read(std::io::Error::other(e)))?;
    let keep = options.ordered_outputs;
    let render = keep && options.render_json;
    let mut rounds = Rounds {
        pool: pool.as_ref(),
        shards: (0..shard_count)
            .map(|_| Shard::new(Engine::new(config.clone()), make_sink(), render))
            .collect(),
        handoff: Handoff {
            keep,
            merged: Vec::new(),
            outputs: Vec::new(),
            on_outputs,
        },
        spare: Spare::default(),
        limits: config.limits,
        shard_count,
    };
    let mut prepare = Prepare {
        read: Read::default(),
        clock: None,
        shard_count,
        strict: options.strict,
    };
    let batch_bytes = options.batch_bytes.max(1);
    std::thread::scope(|scope| rounds.run(scope, input, batch_bytes, &mut prepare, errors))?;
    rounds.end()?;
    let sinks = rounds.shards.into_iter().map(|s| s.sink).collect();
    Ok((prepare.read, sinks))
}

/// The one sequential pass over a parsed batch: what was read so far, and the stream's
/// clock.
struct Prepare {
    read: Read,
    clock: Option<i64>,
    shard_count: usize,
    strict: bool,
}

impl Prepare {
    /// The stream's clock at each event of a parsed batch, its bad lines reported, its
    /// events assigned to shards.
    fn prepare(&mut self, batch: ParsedBatch, errors: &mut dyn Write) -> Ready {
        let first_line = self.read.lines + 1;
        let parsed = &batch.borrow_dependent().parsed;
        self.read.lines += parsed.len() as u64;
        let mut marks: Vec<Mark> = Vec::with_capacity(parsed.len());
        let mut assigned: Vec<Vec<u32>> = vec![Vec::new(); self.shard_count];
        let mut stop = None;
        for (i, l) in parsed.iter().enumerate() {
            let line = first_line + i as u64;
            match &l.parsed {
                None => {}
                Some(Ok(event)) => {
                    self.read.events += 1;
                    // As the engine keeps it (a file's events have no message time).
                    let (_, now) = event_time(self.clock, event.timestamp_ms, None);
                    self.clock = Some(now);
                    assigned[l.shard as usize].push(marks.len() as u32);
                    marks.push(Mark {
                        index: i as u32,
                        line,
                        clock: now,
                    });
                }
                Some(Err(e)) => {
                    self.read.bad_lines += 1;
                    if self.strict {
                        stop = Some(DriveError::BadLine {
                            line,
                            reason: e.detail(),
                        });
                        break;
                    }
                    let _ = writeln!(errors, "line {line}: {} ({})", e.detail(), e.reason());
                }
            }
        }
        Ready {
            batch,
            marks,
            assigned,
            stop,
        }
    }
}

/// Where outputs go: with `keep` (`ordered_outputs`), collected from the shards, put in
/// one thread's order and handed on.
struct Handoff<F> {
    keep: bool,
    merged: Vec<(Place, Output, String)>,
    outputs: Vec<(Output, String)>,
    on_outputs: F,
}

impl<F: FnMut(&mut Vec<(Output, String)>) -> Result<(), DriveError>> Handoff<F> {
    /// Moves the shards' placed outputs to `merged`.
    fn collect<S>(&mut self, shards: &mut [Shard<S>]) {
        if self.keep {
            for s in shards.iter_mut() {
                self.merged.append(&mut s.placed);
            }
        }
    }

    /// Puts the collected outputs in one thread's order and hands them on.
    fn emit(&mut self) -> Result<(), DriveError> {
        if !self.keep || self.merged.is_empty() {
            return Ok(());
        }
        self.merged.sort_by(compare);
        let merged = self.merged.drain(..).map(|(_, o, json)| (o, json));
        self.outputs.extend(merged);
        (self.on_outputs)(&mut self.outputs)?;
        self.outputs.clear();
        Ok(())
    }
}

/// The batch loop: the shards, the pool they run on, and what goes from one round to the
/// next.
struct Rounds<'p, S, F> {
    pool: Option<&'p rayon::ThreadPool>,
    shards: Vec<Shard<S>>,
    handoff: Handoff<F>,
    spare: Spare,
    limits: ParseLimits,
    shard_count: usize,
}

impl<S: Sink, F: FnMut(&mut Vec<(Output, String)>) -> Result<(), DriveError>> Rounds<'_, S, F> {
    /// Reads, parses and applies every batch of `input`. Three batches in flight:
    /// `current` is applied by the shards while `next` is parsed and, on this thread,
    /// the outputs of the batch before are merged and handed on and its events dropped.
    /// So a batch's outputs are handed on once the batch after next has been read (or
    /// the input ends).
    fn run<'scope, 'env>(
        &mut self,
        scope: &'scope std::thread::Scope<'scope, 'env>,
        input: Input<'env>,
        batch_bytes: usize,
        prepare: &mut Prepare,
        errors: &mut dyn Write,
    ) -> Result<(), DriveError> {
        let (recycle, recycled) = mpsc::channel();
        let mut batches: Box<dyn Iterator<Item = std::io::Result<Batch>>> = match input {
            Input::Reader(input) => {
                let (tx, rx) = mpsc::sync_channel(2);
                let line_limit = self.limits.max_event_bytes;
                scope.spawn(move || read_batches(input, batch_bytes, line_limit, tx, recycled));
                Box::new(rx.into_iter())
            }
            Input::Bytes(bytes) => Box::new(Slices {
                bytes,
                at: 0,
                batch_bytes,
            }),
        };
        let mut current: Option<Ready> = None;
        let mut applied: Option<ParsedBatch> = None;
        loop {
            // A batch that stops the drive (`--strict`) is the last one read.
            let stopping = current.as_ref().is_some_and(|c| c.stop.is_some());
            let next = match (!stopping).then(|| batches.next()).flatten().transpose() {
                Ok(next) => next,
                Err(e) => {
                    // What the applied batches caused is handed on before the error.
                    self.handoff.emit()?;
                    return Err(DriveError::Read(e));
                }
            };
            if next.is_none() && current.is_none() {
                break;
            }
            let parsed_next = self.round(next, current.as_mut(), applied.take(), &recycle)?;
            if let Some(done) = current.take() {
                self.handoff.collect(&mut self.shards);
                if let Some(e) = done.stop {
                    self.handoff.emit()?;
                    return Err(e);
                }
                applied = Some(done.batch);
            }
            current = parsed_next.map(|b| prepare.prepare(b, errors));
        }
        self.handoff.emit()
    }

    /// One round, overlapped on the pool: `next` parsed, `current` applied, and the
    /// outputs of `applied` handed on and its buffers recycled. Returns `next` parsed.
    fn round(
        &mut self,
        next: Option<Batch>,
        current: Option<&mut Ready>,
        applied: Option<ParsedBatch>,
        recycle: &mpsc::Sender<Vec<u8>>,
    ) -> Result<Option<ParsedBatch>, DriveError> {
        let Rounds {
            pool,
            shards,
            handoff,
            spare,
            limits,
            shard_count,
        } = self;
        let (pool, limits, shard_count, keep) = (*pool, *limits, *shard_count, handoff.keep);
        let mut parsing = std::mem::take(spare);
        let mut parsed_next = None;
        let mut handed_on = Ok(());
        let parse = |parsed_next: &mut Option<ParsedBatch>| {
            *parsed_next = next.map(|b| parse_batch(b, &limits, shard_count, pool, &mut parsing));
        };
        let apply = |shards: &mut Vec<Shard<S>>| {
            let Some(ready) = current else { return };
            for (shard, mine) in shards.iter_mut().zip(ready.assigned.iter_mut()) {
                std::mem::swap(&mut shard.mine, mine);
            }
            let lines = &ready.batch.borrow_dependent().parsed;
            let run = |s: &mut Shard<S>| s.run(lines, &ready.marks, keep);
            match pool {
                Some(_) => shards.par_iter_mut().for_each(run),
                None => shards.iter_mut().for_each(run),
            }
        };
        let finish_applied = |handed_on: &mut Result<(), DriveError>| {
            *handed_on = handoff.emit();
            if let Some(mut batch) = applied {
                batch.with_dependent_mut(|_, lines| {
                    spare.parsed = relabel(std::mem::take(&mut lines.parsed));
                });
                if let Batch::Buffer { buf, .. } = batch.into_owner() {
                    let _ = recycle.send(buf);
                }
            }
        };
        match pool {
            Some(p) => p.in_place_scope(|s| {
                s.spawn(|_| parse(&mut parsed_next));
                s.spawn(|_| apply(shards));
                finish_applied(&mut handed_on);
            }),
            None => {
                apply(shards);
                finish_applied(&mut handed_on);
                parse(&mut parsed_next);
            }
        }
        handed_on?;
        spare.lines = parsing.lines;
        Ok(parsed_next)
    }

    /// The end of the input: every shard closes its sessions; their outputs handed on.
    fn end(&mut self) -> Result<(), DriveError> {
        let keep = self.handoff.keep;
        let finish = |s: &mut Shard<S>| s.end(keep);
        match self.pool {
            Some(p) => p.install(|| self.shards.par_iter_mut().for_each(finish)),
            None => self.shards.iter_mut().for_each(finish),
        }
        self.handoff.collect(&mut self.shards);
        self.handoff.emit()
    }
}

#[cfg(test)]
mod tests {
    use proptest::strategy::Strategy;

    use super::*;
    use crate::replay::{replay, Format, ReplayOptions};

    proptest::proptest! {
        /// In-place batches are whole lines, in order, all of the input: each ends at a
        /// line break (but the input's last), and holds at most `batch_bytes` unless it is
        /// one line longer than that.
        #[test]
        fn slices_cut_whole_lines_of_about_the_batch_size(
            lines in proptest::collection::vec("[a-z]{0,40}", 0..60),
            end_break in proptest::bool::ANY,
            batch_bytes in 1usize..120,
        ) {
            let mut text = lines.join("\n");
            if end_break {
                text.push('\n');
            }
            let bytes: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(text.clone().into_bytes());
            let slices = Slices { bytes, at: 0, batch_bytes };
            let mut joined = Vec::new();
            let mut batches = slices.map(|b| b.unwrap().bytes().to_vec()).peekable();
            while let Some(batch) = batches.next() {
                proptest::prop_assert!(!batch.is_empty());
                let last = batches.peek().is_none();
                proptest::prop_assert!(last || batch.ends_with(b"\n"), "{:?}", batch);
                let lines_in = batch.iter().filter(|&&b| b == b'\n').count();
                proptest::prop_assert!(
                    batch.len() <= batch_bytes || lines_in <= 1,
                    "{} bytes in {} lines", batch.len(), lines_in
                );
                // Not smaller than it need be: the next line would not have fitted.
                if let Some(next) = batches.peek() {
                    let next_line = memchr::memchr(b'\n', next).map_or(next.len(), |i| i + 1);
                    proptest::prop_assert!(
                        batch.len() + next_line > batch_bytes,
                        "{} bytes, then a line of {}", batch.len(), next_line
                    );
                }
                joined.extend_from_slice(&batch);
            }
            proptest::prop_assert_eq!(joined, text.into_bytes());
        }
    }

    /// Every batch `read_batches` reads from `input`, with a line limit of `limit`.
    fn read_all(
        input: &mut (dyn BufRead + Send),
        batch_bytes: usize,
        limit: usize,
    ) -> Vec<(Vec<u8>, usize, Vec<LongLine>)> {
        let (tx, rx) = mpsc::sync_channel(1);
        let (_recycle, recycled) = mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| read_batches(input, batch_bytes, limit, tx, recycled));
            rx.into_iter()
                .map(|b| match b.unwrap() {
                    Batch::Buffer { buf, len, cut } => (buf[..len].to_vec(), buf.len(), cut),
                    Batch::Slice { .. } => unreachable!("the reader fills buffers"),
                })
                .collect()
        })
    }

    proptest::proptest! {
        /// Lines longer than an event may be are cut to their first `limit + 1` bytes,
        /// their length told beside; every other byte comes through in order, in batches
        /// of whole lines; and no buffer grows past the batch, one kept line and a read.
        #[test]
        fn the_reader_cuts_lines_too_long_to_be_events(
            lines in proptest::collection::vec(
                proptest::prop_oneof![
                    "[a-z]{0,40}".prop_map(String::from),
                    (50usize..400).prop_map(|n| "y".repeat(n)),
                ],
                0..30,
            ),
            end_break in proptest::bool::ANY,
            crlf in proptest::bool::ANY,
            batch_bytes in 1usize..200,
            limit in 20usize..120,
            chunk in 1usize..64,
        ) {
            let eol = if crlf { "\r\n" } else { "\n" };
            let mut text = lines.join(eol);
            if end_break {
                text.push_str(eol);
            }
            let keep = limit + 1;
            // The input's lines, each with its line break.
            let mut expected: Vec<&[u8]> = Vec::new();
            let mut rest = text.as_bytes();
            while !rest.is_empty() {
                let line_end = memchr::memchr(b'\n', rest).map_or(rest.len(), |i| i + 1);
                expected.push(&rest[..line_end]);
                rest = &rest[line_end..];
            }
            // The lines read: as they are, or cut short (first bytes, length).
            let mut got: Vec<(Vec<u8>, Option<usize>)> = Vec::new();
            // Reads of a few bytes: long lines arrive in pieces, as from a pipe.
            let mut input = std::io::BufReader::with_capacity(1, Chunked { data: text.as_bytes(), chunk });
            let batches = read_all(&mut input, batch_bytes, limit);
            let count = batches.len();
            for (i, (bytes, capacity, cut)) in batches.into_iter().enumerate() {
                proptest::prop_assert!(i + 1 == count || bytes.ends_with(b"\n"));
                proptest::prop_assert!(
                    capacity <= batch_bytes.max(4096) + keep + (64 << 10) * 2,
                    "a buffer of {} bytes", capacity
                );
                let mut cuts = cut.into_iter().peekable();
                let mut start = 0;
                while start < bytes.len() {
                    let end = memchr::memchr(b'\n', &bytes[start..]).map_or(bytes.len(), |j| start + j + 1);
                    let size = cuts.next_if(|c| c.start == start).map(|c| c.size);
                    got.push((bytes[start..end].to_vec(), size));
                    start = end;
                }
                proptest::prop_assert!(cuts.next().is_none(), "a cut at no line's start");
            }
            proptest::prop_assert_eq!(got.len(), expected.len());
            for ((line, cut), original) in got.iter().zip(&expected) {
                match cut {
                    None => proptest::prop_assert_eq!(line.as_slice(), *original),
                    Some(size) => {
                        // Cut only when too long (a `\r` before the break counts until
                        // the break is seen), to its first `keep` bytes and its break.
                        proptest::prop_assert_eq!(*size, unbroken(original).len());
                        proptest::prop_assert!(*size > limit);
                        let kept = line.strip_suffix(b"\n").unwrap_or(line);
                        proptest::prop_assert_eq!(kept, &original[..keep]);
                        proptest::prop_assert_eq!(line.ends_with(b"\n"), original.ends_with(b"\n"));
                    }
                }
            }
        }
    }

    /// An input that gives at most `chunk` bytes a read.
    struct Chunked<'a> {
        data: &'a [u8],
        chunk: usize,
    }

    impl std::io::Read for Chunked<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.chunk).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    /// An endless line (`/dev/zero`, a stuck writer) read with memory bounded by the
    /// batch, reported as one oversized line of its real length.
    #[test]
    fn an_endless_line_is_read_past_in_bounded_memory() {
        struct Zeros(usize);
        impl std::io::Read for Zeros {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(self.0);
                buf[..n].fill(0);
                self.0 -= n;
                Ok(n)
            }
        }
        let total = 64 << 20;
        let mut input = std::io::BufReader::new(Zeros(total));
        let batches = read_all(&mut input, 1 << 20, 1 << 20);
        assert_eq!(batches.len(), 1);
        let (bytes, capacity, cut) = &batches[0];
        assert_eq!(bytes.len(), (1 << 20) + 1);
        assert!(capacity < &(3 << 20), "{capacity}");
        assert_eq!(
            cut,
            &[LongLine {
                start: 0,
                size: total
            }]
        );
        // Through the driver: one bad line, oversized at its whole length.
        let mut errors = Vec::new();
        let mut input = std::io::BufReader::new(Zeros(total));
        let report = replay(
            Arc::new(Config::default()),
            Input::Reader(&mut input),
            &mut Vec::new(),
            &mut errors,
            Format::Json,
            Default::default(),
        )
        .unwrap();
        assert_eq!((report.lines, report.bad_lines), (1, 1));
        let errors = String::from_utf8(errors).unwrap();
        assert!(
            errors.contains(&format!("message is {total} bytes")),
            "{errors}"
        );
    }

    #[test]
    fn a_line_too_long_is_oversized_on_every_input_alike() {
        let limit = Config::default().limits.max_event_bytes;
        let event = r#"{"type":"session.started","session_id":"s"}"#;
        // Too long by its padding alone: judged before it is trimmed.
        let padded = format!("{event}{}", " ".repeat(limit));
        let long = format!("{{\"type\":\"{}\"}}", "x".repeat(limit * 3));
        // An event padded to the limit, then `\r` and more: cut after the `\r`, its
        // first bytes would read as an event.
        let event_then_cr = format!(
            "{event}{}\r{}",
            " ".repeat(limit - event.len()),
            "x".repeat(100_000)
        );
        let text = format!("{event}\n{padded}\n{long}\r\n{event_then_cr}\n{event}\n");
        let run = |input: Input<'_>| {
            let mut errors = Vec::new();
            let report = replay(
                Arc::new(Config::default()),
                input,
                &mut Vec::new(),
                &mut errors,
                Format::Json,
                ReplayOptions {
                    batch_bytes: 4096,
                    ..Default::default()
                },
            )
            .unwrap();
            (report.bad_lines, String::from_utf8(errors).unwrap())
        };
        let bytes: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(text.clone().into_bytes());
        let in_place = run(Input::Bytes(bytes));
        let read = run(Input::Reader(&mut trickle(&text, false)));
        assert_eq!(in_place, read);
        // Read in pieces, so that the long lines are cut while read.
        let chunked = Chunked {
            data: text.as_bytes(),
            chunk: 4096,
        };
        let cut = run(Input::Reader(&mut std::io::BufReader::with_capacity(
            1, chunked,
        )));
        assert_eq!(in_place, cut);
        assert_eq!(in_place.0, 3, "{}", in_place.1);
        assert!(
            in_place
                .1
                .contains(&format!("line 4: message is {} bytes", event_then_cr.len())),
            "{}",
            in_place.1
        );
        assert!(
            in_place
                .1
                .contains(&format!("line 2: message is {} bytes", padded.len())),
            "{}",
            in_place.1
        );
        assert!(
            in_place
                .1
                .contains(&format!("line 3: message is {} bytes", long.len())),
            "{}",
            in_place.1
        );
    }

    /// An input that gives one line a read (so that a batch holds as few lines as its
    /// size allows), then the end or, with `fail`, an error.
    struct Trickle<'a> {
        data: &'a [u8],
        fail: bool,
    }

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.data.is_empty() && self.fail {
                return Err(std::io::Error::other("the disk went away"));
            }
            let line = memchr::memchr(b'\n', self.data).map_or(self.data.len(), |i| i + 1);
            let n = buf.len().min(line);
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn trickle(data: &str, fail: bool) -> std::io::BufReader<Trickle<'_>> {
        // A buffer smaller than the driver's reads: they go straight to the input.
        std::io::BufReader::with_capacity(
            16,
            Trickle {
                data: data.as_bytes(),
                fail,
            },
        )
    }

    /// Replays `input` with the default configuration: what was written, and how it ended.
    fn replayed(
        input: Input<'_>,
        options: ReplayOptions,
    ) -> (String, Result<crate::replay::ReplayReport, DriveError>) {
        let mut out = Vec::new();
        let ended = replay(
            Arc::new(Config::default()),
            input,
            &mut out,
            &mut std::io::sink(),
            Format::Json,
            options,
        );
        (String::from_utf8(out).unwrap(), ended)
    }

    /// Replays `input` strictly, in batches of about `batch_bytes`: what was written,
    /// and the error.
    fn strict_replay(input: &str, threads: usize, batch_bytes: usize) -> (String, String) {
        let options = ReplayOptions {
            threads,
            strict: true,
            batch_bytes,
        };
        let (out, ended) = replayed(Input::Reader(&mut trickle(input, false)), options);
        let err = ended.expect_err("a bad line under --strict");
        (out, err.to_string())
    }

    /// What the first `n` lines cause, but for the end of input's closes.
    fn caused_by_first(lines: &[&str], n: usize) -> String {
        let input = lines[..n].join("\n");
        let (out, ended) = replayed(Input::Reader(&mut input.as_bytes()), Default::default());
        ended.unwrap();
        out.lines()
            .filter(|o| !o.contains(r#""closed_by":"end_of_input""#))
            .map(|o| format!("{o}\n"))
            .collect()
    }

    #[test]
    fn strict_stops_after_the_bad_lines_batch_with_its_outputs_on_any_number_of_threads() {
        let sessions = std::fs::read_to_string("examples/sessions.jsonl").unwrap();
        let lines: Vec<&str> = sessions.lines().collect();
        // The bad line well past the first batches, so that batches before it are
        // applied, handed on and dropped while later ones are parsed.
        let at = lines.len() * 3 / 4;
        let mut input = String::new();
        for (i, line) in lines.iter().enumerate() {
            if i == at {
                input.push_str("{oops\n");
            }
            input.push_str(line);
            input.push('\n');
        }
        // What the events before the bad line cause, but for the end of input's closes.
        let before = caused_by_first(&lines, at);
        assert!(before.lines().count() >= 3, "{before}");
        let (one, err) = strict_replay(&input, 1, 600);
        assert!(err.contains(&format!("line {}", at + 1)), "{err}");
        assert_eq!(one, before);
        for threads in [2, 3] {
            let (many, many_err) = strict_replay(&input, threads, 600);
            assert_eq!(many, one, "{threads} threads");
            assert_eq!(many_err, err);
        }
    }

    #[test]
    fn a_strict_stop_reads_no_further() {
        // The bad line is the last one before the input fails: the stop is reported,
        // not the failure of a read it had no need for.
        let input = "{\"type\":\"session.started\",\"session_id\":\"s\"}\n{oops\n";
        for threads in [1, 2] {
            let options = ReplayOptions {
                threads,
                strict: true,
                batch_bytes: 1,
            };
            let (_, ended) = replayed(Input::Reader(&mut trickle(input, true)), options);
            let err = ended.expect_err("a bad line under --strict").to_string();
            assert!(
                err.starts_with("line 2:") && err.contains("--strict"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_read_error_comes_after_the_outputs_of_every_applied_batch() {
        let sessions = std::fs::read_to_string("examples/sessions.jsonl").unwrap();
        let lines: Vec<&str> = sessions.lines().collect();
        let caused = |n: usize| caused_by_first(&lines, n);
        // A line that causes an output, and one more line after it: batches of one line
        // each, then the input fails. The last batch read is parsed but never applied;
        // every batch before it was, and its outputs must be out before the error.
        let k = (2..lines.len())
            .rev()
            .find(|&k| caused(k) != caused(k - 1))
            .expect("some line causes an output");
        let input: String = lines[..=k].iter().map(|l| format!("{l}\n")).collect();
        for threads in [1, 2] {
            let options = ReplayOptions {
                threads,
                strict: false,
                batch_bytes: 1,
            };
            let (out, ended) = replayed(Input::Reader(&mut trickle(&input, true)), options);
            let err = ended.expect_err("the input failed").to_string();
            assert!(err.contains("the disk went away"), "{err}");
            assert_eq!(out, caused(k), "{threads} threads");
        }
    }
}

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
//! are already in memory (a mapped file), cut into batches in place. In each round every
//! worker applies its own shards' events of one batch (their sessions' states stay in
//! that core's caches and allocator), drops the events it parsed of the batch before
//! (freed by the thread that allocated them), then parses chunks of the next batch (its
//! events borrow from its bytes, each hashed to its shard), claiming them one at a time
//! until none is left: a worker with more of this batch's events parses less of the next.
//! Only then does a worker take another's shards not begun yet, so the workers end the
//! round together and a shard changes threads only when its worker is behind. Every
//! round needs every worker scheduled: more threads than free cores slow it down.
//! Meanwhile the batch parsed in the round before is prepared on the calling thread (its
//! clock, in the one sequential pass, once the outputs of an earlier batch are merged and
//! handed on there). So nothing every event passes through runs on the workers' path:
//! the calling thread's share (prepare, merge, hand on) runs beside them, and the
//! workers wait only when it is slower than the batch. A batch's events were parsed a
//! round before, on several threads by other cores as often as not, so a shard asks
//! memory for its next events' lines and texts a few events ahead of applying them; and
//! the outputs handed on go back to the shard that made them, to be dropped on its thread.
//! Memory stays bounded by the batch size and the open sessions, whatever the input's
//! length (a mapped file's pages are the page cache's, read once in order: they count in
//! the resident memory, and the kernel takes them back when it needs to).

mod batches;
pub mod input;

pub use batches::Input;
use batches::*;

use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use rustc_hash::FxHasher;

use crate::config::Config;
use crate::contract::event::{parse_event, BadEvent, Event, ParseLimits};
use crate::contract::output::{ClosedBy, Output};
use crate::engine::{event_time, CloseAt, Engine, EventMeta};
use crate::prefetch;

/// Bytes of a batch parsed as one piece of work when there is more than one thread: once
/// its own shards' events are applied, each worker claims the next batch's chunks one at
/// a time, so the parse evens out what the shards leave uneven.
const CHUNK_BYTES: usize = 16 << 10;

/// Shards (engines) per worker thread when there is more than one thread.
const SHARDS_PER_THREAD: usize = 4;

/// Bytes read per batch by default for two threads (whole lines: a batch ends at the
/// last line break); [`batch_bytes_for`] scales it with the threads.
pub const BATCH_BYTES: usize = 1 << 20;

/// The most bytes a batch takes by default, whatever the threads.
const MAX_BATCH_BYTES: usize = 16 << 20;

/// Bytes read per batch by default on `threads` threads: 512 KiB a thread, from 1 MiB to
/// 16 MiB. Every worker waits at a batch's end for the busiest shard, and an input of
/// whole sessions one after another (an export of trajectories) puts few sessions in a
/// batch: with 1 MiB batches on 16 threads, a model of the recorded real sessions'
/// shards (`sessions.jsonl.gz`, four shards a thread) keeps 0.36 of the threads busy,
/// with 8 MiB ones 0.96 (`benches/batch-balance`; docs/DEVELOPMENT.md). On two threads
/// larger batches only cost cache. Memory: about seven batches in flight with the
/// reader's buffers, and their parsed lines.
pub fn batch_bytes_for(threads: usize) -> usize {
    (threads.saturating_mul(512 << 10)).clamp(BATCH_BYTES, MAX_BATCH_BYTES)
}

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
    /// The input could not be read on past its `lines`th line of events (a gzip stream
    /// cut short or corrupt, a disk error): every line up to it was applied and its
    /// outputs handed on. An OTLP JSON file's lines of events are its spans' events.
    #[error("reading input failed after {lines} lines of events, all applied: {source}")]
    Read {
        lines: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the drive's threads: {0}")]
    Threads(std::io::Error),
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
    /// Bytes read per batch (default: [`batch_bytes_for`] the threads).
    pub batch_bytes: Option<usize>,
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

fn compare((pa, a): (&Place, &Output), (pb, b): (&Place, &Output)) -> Ordering {
    pa.line
        .cmp(&pb.line)
        .then(pa.phase.cmp(&pb.phase))
        .then(pa.deadline.cmp(&pb.deadline))
        .then_with(|| session_of(a).cmp(session_of(b)))
        .then(pa.seq.cmp(&pb.seq))
}

fn session_of(o: &Output) -> &str {
    match o {
        Output::Finding(f) => &f.session_id,
        Output::Summary(s) => &s.session_id,
    }
}

/// A valid event of a batch: where it is among the batch's parsed lines (its chunk, and
/// its place there), its line, and the stream's clock once it is applied.
struct Mark {
    chunk: u32,
    at: u32,
    line: u64,
    clock: i64,
}

/// Events ahead of the one applied whose mark (three times as far), parsed line (twice as
/// far) and text (this far) are asked of memory in advance, each stage reading what the
/// stage before asked for: a batch's events were parsed a round before, half of them (on
/// two threads; 15 of 16 on sixteen) by another core, so the first touch of each missed
/// every cache.
const PREFETCH_AHEAD: usize = 8;

/// The first cache lines of what the engine reads of an event's text: its session id
/// (the session table's key) and its body's strings (up to eight lines each).
#[inline(always)]
fn prefetch_event_text(event: &Event<'_>) {
    use crate::contract::event::EventBody;
    prefetch::line(event.session_id.as_ptr());
    let text = |t: &str| prefetch::span(t.as_ptr(), t.len(), 8 * 64);
    match &event.body {
        EventBody::ToolCall(c) => {
            c.args.iter().chain(&c.result).for_each(|j| text(&j.0));
        }
        EventBody::LlmCall(c) => c.text.iter().for_each(|j| text(&j.0)),
        _ => {}
    }
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
    /// Outputs handed on in an earlier round, given back to be dropped here: they were
    /// allocated on this shard's thread, a free from another thread is slower, and on the
    /// calling thread it would add to the one thread every output passes through.
    spent: Vec<(Output, String)>,
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
            spent: Vec::new(),
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

    fn run(&mut self, chunks: &[Vec<Line<'_>>], marks: &[Mark], keep: bool) {
        self.spent.clear();
        let meta = EventMeta::default();
        let mine = std::mem::take(&mut self.mine);
        let line = |k: u32| {
            let mark = &marks[k as usize];
            &chunks[mark.chunk as usize][mark.at as usize]
        };
        for (i, &k) in mine.iter().enumerate() {
            if let Some(&farther) = mine.get(i + 3 * PREFETCH_AHEAD) {
                prefetch::value(&marks[farther as usize]);
            }
            if let Some(&far) = mine.get(i + 2 * PREFETCH_AHEAD) {
                prefetch::value(line(far));
            }
            if let Some(Some(Ok(near))) = mine.get(i + PREFETCH_AHEAD).map(|&n| &line(n).parsed) {
                prefetch_event_text(near);
            }
            let mark = &marks[k as usize];
            let Some(Ok(event)) = &line(k).parsed else {
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
        self.spent.clear();
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

/// A batch's lines as parsed, borrowing from its bytes, in chunks (one when there is one
/// thread), and the worker that parsed each chunk (which drops its events too).
struct Lines<'b> {
    chunks: Vec<Vec<Line<'b>>>,
    parsers: Vec<usize>,
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
/// parsed events are 392 bytes a line: allocated afresh, every batch would fault in its
/// pages again).
#[derive(Default)]
struct Spare {
    chunks: Vec<Vec<Line<'static>>>,
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

/// Where the line that holds byte `at` of `bytes` ends (after its line break), or the
/// end of `bytes`.
fn line_end(bytes: &[u8], at: usize) -> usize {
    match bytes.get(at..) {
        Some(rest) => memchr::memchr(b'\n', rest).map_or(bytes.len(), |i| at + i + 1),
        None => bytes.len(),
    }
}

/// How a batch's lines are parsed: the limits, and the shards their events go to.
#[derive(Clone, Copy)]
struct ParseWork {
    limits: ParseLimits,
    shards: usize,
}

impl ParseWork {
    /// Parses into `out` the lines of `bytes` (a batch whose lines cut short are `cut`)
    /// that start in `from..to`, each whole (the last may run past `to`). So the
    /// workers cut a batch into lines themselves, in chunks of bytes each one claims,
    /// with nothing to find first on one thread.
    fn chunk<'b>(
        &self,
        bytes: &'b [u8],
        (from, to): (usize, usize),
        cut: &[LongLine],
        out: &mut Vec<Line<'b>>,
    ) {
        let to = to.min(bytes.len());
        // The first line to start at or after `from`: after the line break before it,
        // looked for in this chunk only (a line longer than many chunks is passed over
        // once, by the chunk it starts in, not once by every chunk it covers).
        let start = match from {
            0 => 0,
            _ => bytes
                .get(from - 1..to)
                .and_then(|range| memchr::memchr(b'\n', range))
                .map_or(to, |i| from + i),
        };
        // The lines cut short are oversized at their whole length, whatever their first
        // bytes read as (a kept part ending in `\r` is one byte shorter once its break is
        // stripped, and could read as an event).
        let mut cuts = cut[cut.partition_point(|c| c.start < start)..]
            .iter()
            .peekable();
        let mut at = start;
        while at < to {
            let end = line_end(bytes, at);
            let mut long = None;
            while let Some(c) = cuts.next_if(|c| c.start <= at) {
                long = Some(c);
            }
            out.push(match long {
                Some(long) => Line {
                    parsed: Some(Err(BadEvent::Oversized {
                        size: long.size,
                        limit: self.limits.max_event_bytes,
                    })),
                    shard: 0,
                },
                None => self.line(&bytes[at..end]),
            });
            at = end;
        }
    }

    fn line<'b>(&self, line: &'b [u8]) -> Line<'b> {
        // A line's size is judged before it is trimmed, as the reader judges it when it
        // cuts one short: whatever the input, the same lines are oversized.
        let unbroken = unbroken(line);
        if unbroken.len() > self.limits.max_event_bytes {
            let oversized = BadEvent::Oversized {
                size: unbroken.len(),
                limit: self.limits.max_event_bytes,
            };
            return Line {
                parsed: Some(Err(oversized)),
                shard: 0,
            };
        }
        let t = trim_line(line);
        let parsed = (!t.is_empty()).then(|| parse_event(t, &self.limits));
        let shard = match &parsed {
            Some(Ok(event)) => shard_of(&event.session_id, self.shards) as u32,
            _ => 0,
        };
        Line { parsed, shard }
    }
}

/// Whether a parsed batch holds a line that is no event (`--strict` stops at it).
fn has_bad_line(batch: &ParsedBatch) -> bool {
    let chunks = &batch.borrow_dependent().chunks;
    chunks
        .iter()
        .flatten()
        .any(|l| matches!(l.parsed, Some(Err(_))))
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
    on_outputs: impl FnMut(&[(Output, String)]) -> Result<(), DriveError>,
) -> Result<(Read, Vec<S>), DriveError> {
    let threads = options.threads.max(1);
    // A few shards per thread, each applied on its thread batch after batch: its
    // sessions' states stay in that core's caches (and in its allocator's heap). What a
    // batch gives the shards unevenly, the parse of the next batch evens out, and a
    // worker with nothing left to parse takes a busy one's shards not yet begun (see
    // `Overlap::run`).
    let shard_count = if threads > 1 {
        threads * SHARDS_PER_THREAD
    } else {
        1
    };
    let pool = (threads > 1)
        .then(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("lw-shard-{i}"))
                .build()
        })
        .transpose()
        .map_err(|e| DriveError::Threads(std::io::Error::other(e)))?;
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
            origins: Vec::new(),
            spent: Vec::new(),
            on_outputs,
        },
        spare: Spare::default(),
        parse: ParseWork {
            limits: config.limits,
            shards: shard_count,
        },
    };
    let mut prepare = Prepare {
        read: Read::default(),
        clock: None,
        shard_count,
        strict: options.strict,
        spare: Vec::new(),
    };
    let batch_bytes = options
        .batch_bytes
        .unwrap_or_else(|| batch_bytes_for(threads))
        .max(1);
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
    /// The marks and assignments of batches applied, kept for the next ones (allocated
    /// afresh, each batch's would fault in their pages again on this thread).
    spare: Vec<(Vec<Mark>, Vec<Vec<u32>>)>,
}

impl Prepare {
    /// The stream's clock at each event of a parsed batch, its bad lines reported, its
    /// events assigned to shards.
    fn prepare(&mut self, batch: ParsedBatch, errors: &mut dyn Write) -> Ready {
        let first_line = self.read.lines + 1;
        let chunks = &batch.borrow_dependent().chunks;
        let lines = chunks.iter().map(Vec::len).sum::<usize>();
        self.read.lines += lines as u64;
        let (mut marks, mut assigned) = self.spare.pop().unwrap_or_default();
        marks.clear();
        marks.reserve(lines);
        assigned.resize_with(self.shard_count, Vec::new);
        assigned.iter_mut().for_each(Vec::clear);
        let mut stop = None;
        let places = chunks
            .iter()
            .enumerate()
            .flat_map(|(c, chunk)| chunk.iter().enumerate().map(move |(at, l)| (c, at, l)));
        for (i, (c, at, l)) in places.enumerate() {
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
                        chunk: c as u32,
                        at: at as u32,
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
    /// The collected outputs, each with the shard it came from.
    merged: Vec<(Place, Output, String, u32)>,
    outputs: Vec<(Output, String)>,
    /// The shard each of `outputs` came from.
    origins: Vec<u32>,
    /// Per shard, its outputs handed on, to give back at the next collect.
    spent: Vec<Vec<(Output, String)>>,
    on_outputs: F,
}

impl<F: FnMut(&[(Output, String)]) -> Result<(), DriveError>> Handoff<F> {
    /// Moves the shards' placed outputs to `merged`, and gives each shard back its
    /// outputs handed on since the last collect (it drops them in its next run or end;
    /// the last batch's are dropped here when the drive ends).
    fn collect<S>(&mut self, shards: &mut [Shard<S>]) {
        if self.keep {
            self.spent.resize_with(shards.len(), Vec::new);
            for (i, (s, spent)) in shards.iter_mut().zip(&mut self.spent).enumerate() {
                let with_shard = |(p, o, json)| (p, o, json, i as u32);
                self.merged.extend(s.placed.drain(..).map(with_shard));
                // Its run emptied the shard's list: swapping hands it the outputs and
                // takes back an empty buffer.
                std::mem::swap(&mut s.spent, spent);
            }
        }
    }

    /// Puts the collected outputs in one thread's order and hands them on.
    fn emit(&mut self) -> Result<(), DriveError> {
        if !self.keep || self.merged.is_empty() {
            return Ok(());
        }
        self.merged
            .sort_by(|a, b| compare((&a.0, &a.1), (&b.0, &b.1)));
        for (_, o, json, shard) in self.merged.drain(..) {
            self.outputs.push((o, json));
            self.origins.push(shard);
        }
        let handed_on = (self.on_outputs)(&self.outputs);
        let back = self.outputs.drain(..).zip(self.origins.drain(..));
        for (output, shard) in back {
            self.spent[shard as usize].push(output);
        }
        handed_on
    }
}

/// What one round works on: the batch read for it, the batch parsed in the round
/// before (to prepare), the prepared batch (to apply) and the applied one (to hand on).
struct Work<'r> {
    next: Option<Batch>,
    parsed: Option<ParsedBatch>,
    current: Option<&'r mut Ready>,
    applied: Option<ParsedBatch>,
}

/// The batch loop: the shards, the pool they run on, and what goes from one round to the
/// next.
struct Rounds<'p, S, F> {
    pool: Option<&'p rayon::ThreadPool>,
    shards: Vec<Shard<S>>,
    handoff: Handoff<F>,
    spare: Spare,
    parse: ParseWork,
}

impl<S: Sink, F: FnMut(&[(Output, String)]) -> Result<(), DriveError>> Rounds<'_, S, F> {
    /// Reads, parses and applies every batch of `input`. Four batches in flight: in each
    /// round `current` is applied by the shards, the events of the batch before dropped
    /// and `next` parsed by the workers while, on this thread, the outputs of the batch
    /// before are merged and handed on, and the batch parsed in the round before is
    /// prepared (its clock and shards: the one sequential pass, off the workers' path).
    /// So a batch's outputs are handed on three batches behind the reading (or when the
    /// input ends).
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
                let line_limit = self.parse.limits.max_event_bytes;
                scope.spawn(move || read_batches(input, batch_bytes, line_limit, tx, recycled));
                Box::new(rx.into_iter())
            }
            Input::Bytes(bytes) => Box::new(Slices {
                bytes,
                at: 0,
                batch_bytes,
            }),
        };
        let mut parsed: Option<ParsedBatch> = None;
        let mut current: Option<Ready> = None;
        let mut applied: Option<ParsedBatch> = None;
        let mut read_error = None;
        loop {
            // A batch that stops the drive (`--strict`) is the last one prepared, and
            // nothing is read after it: once a parsed batch holds a bad line under
            // `--strict` (it will stop the drive), no more is read; nor after a read
            // failed.
            let stopping = current.as_ref().is_some_and(|c| c.stop.is_some());
            let stop_ahead = prepare.strict && parsed.as_ref().is_some_and(has_bad_line);
            let next = if stopping || stop_ahead || read_error.is_some() {
                None
            } else {
                batches.next().transpose().unwrap_or_else(|e| {
                    // Every batch read whole before the failure is still applied and
                    // handed on (the lines of the one being read are lost).
                    read_error = Some(e);
                    None
                })
            };
            if next.is_none() && parsed.is_none() && current.is_none() {
                break;
            }
            let work = Work {
                next,
                parsed: parsed.take(),
                current: current.as_mut(),
                applied: applied.take(),
            };
            let (parsed_next, prepared) = self.round(work, &recycle, prepare, errors)?;
            if let Some(done) = current.take() {
                self.handoff.collect(&mut self.shards);
                if let Some(e) = done.stop {
                    self.handoff.emit()?;
                    return Err(e);
                }
                applied = Some(done.batch);
                prepare.spare.push((done.marks, done.assigned));
            }
            current = prepared;
            parsed = parsed_next;
        }
        self.handoff.emit()?;
        let lines = prepare.read.lines;
        read_error.map_or(Ok(()), |source| Err(DriveError::Read { lines, source }))
    }

    /// One round, overlapped on the pool: `current` applied (each worker its own
    /// shards first), the events of `applied` dropped by the workers that parsed them, then
    /// `next` parsed by whichever worker is free, while on this thread the outputs of
    /// `applied` are handed on and `parsed` prepared. Returns `next` parsed and `parsed`
    /// prepared.
    fn round(
        &mut self,
        work: Work<'_>,
        recycle: &mpsc::Sender<Vec<u8>>,
        prepare: &mut Prepare,
        errors: &mut dyn Write,
    ) -> Result<(Option<ParsedBatch>, Option<Ready>), DriveError> {
        let Rounds {
            pool,
            shards,
            handoff,
            spare,
            parse,
        } = self;
        let Work {
            next,
            parsed,
            current,
            mut applied,
        } = work;
        let keep = handoff.keep;
        let mut free = std::mem::take(&mut spare.chunks);
        let mut handed_on = Ok(());
        let mut prepared = None;
        let calling = || {
            handed_on = handoff.emit();
            prepared = parsed.map(|b| prepare.prepare(b, errors));
        };
        let mut overlap = Overlap {
            pool: *pool,
            shards,
            current,
            keep,
            parse: *parse,
        };
        let round = |dropping: &mut Lines<'_>| match next {
            Some(batch) => Some(ParsedBatch::new(batch, |batch| {
                overlap.run(Some(batch), dropping, &mut free, calling)
            })),
            None => {
                overlap.run(None, dropping, &mut free, calling);
                None
            }
        };
        let parsed_next = match applied.as_mut() {
            Some(batch) => batch.with_dependent_mut(|_, lines| round(lines)),
            None => round(&mut Lines {
                chunks: Vec::new(),
                parsers: Vec::new(),
            }),
        };
        handed_on?;
        if let Some(mut batch) = applied {
            // Their events are dropped: what is left is their containers.
            batch.with_dependent_mut(|_, lines| {
                free.extend(lines.chunks.drain(..).map(relabel));
            });
            if let Batch::Buffer { buf, .. } = batch.into_owner() {
                let _ = recycle.send(buf);
            }
        }
        spare.chunks = free;
        Ok((parsed_next, prepared))
    }

    /// The end of the input: every shard closes its sessions (each worker its own
    /// shards, then any not begun); their outputs handed on.
    fn end(&mut self) -> Result<(), DriveError> {
        let keep = self.handoff.keep;
        match self.pool {
            Some(pool) => {
                let claims = Claims::new(&mut self.shards);
                pool.broadcast(|worker| claims.sweep(worker.index(), |s| s.end(keep)));
            }
            None => self.shards.iter_mut().for_each(|s| s.end(keep)),
        }
        self.handoff.collect(&mut self.shards);
        self.handoff.emit()
    }
}

/// The shards of one round on the pool, each run by the one worker that claims it: a
/// worker's own shards first, then any shard a busy worker has not begun.
struct Claims<'s, S> {
    cells: Vec<Mutex<&'s mut Shard<S>>>,
    begun: Vec<AtomicBool>,
}

impl<'s, S> Claims<'s, S> {
    fn new(shards: &'s mut [Shard<S>]) -> Self {
        Claims {
            begun: shards.iter().map(|_| AtomicBool::new(false)).collect(),
            cells: shards.iter_mut().map(Mutex::new).collect(),
        }
    }

    /// The shards of worker `worker` (it runs them first, so they stay on its core).
    fn home(worker: usize) -> std::ops::Range<usize> {
        worker * SHARDS_PER_THREAD..(worker + 1) * SHARDS_PER_THREAD
    }

    /// Runs `f` on shard `s` unless a worker has claimed it.
    fn take(&self, s: usize, f: impl FnOnce(&mut Shard<S>)) {
        if !self.begun[s].swap(true, Relaxed) {
            f(&mut locked(&self.cells[s]));
        }
    }

    /// Runs `f` on every shard no worker has claimed yet, worker `worker`'s own first.
    fn sweep(&self, worker: usize, f: impl Fn(&mut Shard<S>)) {
        let n = self.cells.len();
        let from = Self::home(worker).start;
        (0..n).for_each(|k| self.take((from + k) % n, &f));
    }
}

/// A lock that a panic elsewhere does not make unusable (a worker's panic is re-raised
/// by the pool anyway).
fn locked<T>(cell: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    cell.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the workers share in one round.
struct Overlap<'r, S> {
    pool: Option<&'r rayon::ThreadPool>,
    shards: &'r mut [Shard<S>],
    current: Option<&'r mut Ready>,
    keep: bool,
    parse: ParseWork,
}

impl<S: Sink> Overlap<'_, S> {
    /// Applies `current`, drops the events of `dropping` and parses `next` (see
    /// [`Rounds::round`]) while `calling` runs on this thread. Each worker applies its
    /// own shards first, drops what it parsed of `dropping` (freed by the thread that
    /// allocated it), then claims `next`'s chunks one at a time until none is left: a
    /// worker with more of the batch's work parses less of the next. Only then does a
    /// worker take another's shards that are not begun yet, so the workers finish the
    /// round together while a shard changes threads only when one is behind.
    fn run<'b>(
        &mut self,
        next: Option<&'b Batch>,
        dropping: &mut Lines<'_>,
        free: &mut Vec<Vec<Line<'static>>>,
        calling: impl FnOnce(),
    ) -> Lines<'b> {
        let (bytes, cut) = next.map_or((&[][..], &[][..]), |b| (b.bytes(), b.cut()));
        // One thread parses the batch as one chunk: there is no one to share it with.
        let chunk_bytes = if self.pool.is_some() {
            CHUNK_BYTES
        } else {
            bytes.len().max(1)
        };
        let slots: Vec<Mutex<(Vec<Line<'b>>, usize)>> = (0..bytes.len().div_ceil(chunk_bytes))
            .map(|_| Mutex::new((relabel(free.pop().unwrap_or_default()), 0)))
            .collect();
        if let Some(ready) = self.current.as_deref_mut() {
            for (shard, mine) in self.shards.iter_mut().zip(ready.assigned.iter_mut()) {
                std::mem::swap(&mut shard.mine, mine);
            }
        }
        let (current, keep, parse) = (self.current.as_deref(), self.keep, self.parse);
        let apply = |shard: &mut Shard<S>| {
            if let Some(ready) = current {
                shard.run(&ready.batch.borrow_dependent().chunks, &ready.marks, keep);
            }
        };
        let claimed = AtomicUsize::new(0);
        let parse_claimed = |worker: usize| loop {
            let k = claimed.fetch_add(1, Relaxed);
            let Some(slot) = slots.get(k) else { break };
            let (lines, parser) = &mut *locked(slot);
            let from = k * chunk_bytes;
            parse.chunk(bytes, (from, from.saturating_add(chunk_bytes)), cut, lines);
            *parser = worker;
        };
        match self.pool {
            Some(pool) => {
                debug_assert_eq!(
                    pool.current_num_threads() * SHARDS_PER_THREAD,
                    self.shards.len()
                );
                let claims = Claims::new(self.shards);
                let parsers = &dropping.parsers;
                let dropped: Vec<Mutex<&mut Vec<Line<'_>>>> =
                    dropping.chunks.iter_mut().map(Mutex::new).collect();
                pool.in_place_scope(|scope| {
                    scope.spawn_broadcast(|_, worker| {
                        let me = worker.index();
                        Claims::<S>::home(me).for_each(|s| claims.take(s, apply));
                        for (chunk, _) in dropped.iter().zip(parsers).filter(|(_, &p)| p == me) {
                            locked(chunk).clear();
                        }
                        parse_claimed(me);
                        // The shards a busy worker has not begun.
                        claims.sweep(me, apply);
                    });
                    calling();
                });
            }
            None => {
                self.shards.iter_mut().for_each(apply);
                calling();
                dropping.chunks.iter_mut().for_each(Vec::clear);
                parse_claimed(0);
            }
        }
        let (chunks, parsers) = slots
            .into_iter()
            .map(|slot| {
                slot.into_inner()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            })
            .unzip();
        Lines { chunks, parsers }
    }
}

#[cfg(test)]
mod tests;

//! The driver's unit tests: batches, long lines, the merge, and the same bytes on any number of threads.

use proptest::strategy::Strategy;

use super::*;
use crate::tools::replay::{replay, Format, ReplayOptions};

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

proptest::proptest! {
    /// A batch parsed in chunks of any size gives the lines parsed in one piece: each
    /// line once, whole, in order (a chunk takes the lines that start in its bytes), the
    /// lines the reader cut short oversized wherever the chunks fall.
    #[test]
    fn chunks_give_the_lines_of_one_piece(
        lines in proptest::collection::vec(
            (
                proptest::prop_oneof![
                    "s[0-9]{1,30}".prop_map(|s| {
                        format!(r#"{{"type":"session.started","session_id":"{s}"}}"#)
                    }),
                    "[a-z ]{0,12}",
                ],
                proptest::bool::ANY,
                proptest::bool::weighted(0.2),
            ),
            0..40,
        ),
        end_break in proptest::bool::ANY,
        chunk_bytes in 1usize..200,
    ) {
        // Each line, `\r\n` or `\n` ended, some of them cut short as the reader cuts
        // a line too long (a `LongLine` at its start).
        const CUT_SIZE: usize = 1 << 21;
        let mut text = String::new();
        let mut cut = Vec::new();
        for (i, (line, crlf, long)) in lines.iter().enumerate() {
            let broken = i + 1 < lines.len() || end_break;
            // (No line is there to cut at the very end.)
            if *long && (broken || !line.is_empty()) {
                cut.push(LongLine { start: text.len(), size: CUT_SIZE });
            }
            text.push_str(line);
            if broken {
                text.push_str(if *crlf { "\r\n" } else { "\n" });
            }
        }
        let bytes = text.as_bytes();
        let work = ParseWork {
            limits: ParseLimits::default(),
            shards: 3,
        };
        let mut whole = Vec::new();
        work.chunk(bytes, (0, bytes.len()), &cut, &mut whole);
        let mut chunked = Vec::new();
        for k in 0..bytes.len().div_ceil(chunk_bytes) {
            let from = k * chunk_bytes;
            work.chunk(bytes, (from, from + chunk_bytes), &cut, &mut chunked);
        }
        let shown = |lines: &[Line<'_>]| -> Vec<String> {
            lines.iter().map(|l| format!("{:?} {}", l.parsed, l.shard)).collect()
        };
        proptest::prop_assert_eq!(whole.len(), text.lines().count());
        let oversized = whole
            .iter()
            .filter(|l| matches!(l.parsed, Some(Err(BadEvent::Oversized { size: CUT_SIZE, .. }))))
            .count();
        proptest::prop_assert_eq!(oversized, cut.len());
        proptest::prop_assert_eq!(shown(&chunked), shown(&whole));
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
    let run = |input: Input<'_>, threads: usize| {
        let mut errors = Vec::new();
        let report = replay(
            Arc::new(Config::default()),
            input,
            &mut Vec::new(),
            &mut errors,
            Format::Json,
            ReplayOptions {
                batch_bytes: Some(4096),
                threads,
                ..Default::default()
            },
        )
        .unwrap();
        (report.bad_lines, String::from_utf8(errors).unwrap())
    };
    let bytes: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(text.clone().into_bytes());
    let in_place = run(Input::Bytes(bytes.clone()), 1);
    // On three threads a batch is parsed in chunks, the lines cut short among them.
    for threads in [1, 3] {
        assert_eq!(in_place, run(Input::Bytes(bytes.clone()), threads));
        let read = run(Input::Reader(&mut trickle(&text, false)), threads);
        assert_eq!(in_place, read, "{threads} threads");
        // Read in pieces, so that the long lines are cut while read.
        let chunked = Chunked {
            data: text.as_bytes(),
            chunk: 4096,
        };
        let cut = run(
            Input::Reader(&mut std::io::BufReader::with_capacity(1, chunked)),
            threads,
        );
        assert_eq!(in_place, cut, "{threads} threads");
    }
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
) -> (
    String,
    Result<crate::tools::replay::ReplayReport, DriveError>,
) {
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
        batch_bytes: Some(batch_bytes),
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
            batch_bytes: Some(1),
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
    // Batches of one line each, the last of them a line that causes an output, then
    // the input fails: every batch read before the failure is applied, and its outputs
    // are out before the error (but no end-of-input closes: the input did not end).
    let k = (1..lines.len())
        .rev()
        .find(|&k| caused(k + 1) != caused(k))
        .expect("some line causes an output");
    let input: String = lines[..=k].iter().map(|l| format!("{l}\n")).collect();
    for threads in [1, 2] {
        let options = ReplayOptions {
            threads,
            strict: false,
            batch_bytes: Some(1),
        };
        let (out, ended) = replayed(Input::Reader(&mut trickle(&input, true)), options);
        let err = ended.expect_err("the input failed").to_string();
        assert!(err.contains("the disk went away"), "{err}");
        assert_eq!(out, caused(k + 1), "{threads} threads");
    }
}

/// The outputs of `examples/sessions.jsonl` on one engine, its end of input included.
fn example_outputs() -> Vec<Output> {
    let config = Arc::new(Config::default());
    let limits = config.limits;
    let mut engine = Engine::new(config);
    let mut outputs = Vec::new();
    let text = std::fs::read_to_string("examples/sessions.jsonl").unwrap();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let event = parse_event(line.as_bytes(), &limits).unwrap();
        engine.process(&event, &EventMeta::default(), &mut outputs);
    }
    engine.close_all(ClosedBy::EndOfInput, &mut outputs);
    outputs
}

/// A place at `line`, after the line's event (phase 1).
fn place_at(line: u64) -> Place {
    Place {
        line,
        phase: 1,
        deadline: 0,
        seq: 0,
    }
}

/// The labels (`json`, a number here) of handed-on outputs, in order.
fn labels(outputs: &[(Output, String)]) -> Vec<usize> {
    let mut labels: Vec<usize> = outputs.iter().map(|(_, j)| j.parse().unwrap()).collect();
    labels.sort_unstable();
    labels
}

/// Outputs handed on go back to the shard that made them (to be freed on its thread),
/// each once, after being handed on in one thread's order, at the collect that takes the
/// next batch's; a shard's next run drops them, and so does its end.
#[test]
fn outputs_handed_on_go_back_to_the_shard_that_made_them() {
    let outputs = example_outputs();
    assert!(outputs.len() >= 6, "{}", outputs.len());
    let config = Arc::new(Config::default());
    let mut shards: Vec<Shard<()>> = (0..3)
        .map(|_| Shard::new(Engine::new(config.clone()), (), true))
        .collect();
    // Output k made by shard k % 3, placed at line (len - k): the merge reverses them.
    let n = outputs.len();
    for (k, o) in outputs.iter().enumerate() {
        let place = place_at((n - k) as u64);
        shards[k % 3]
            .placed
            .push((place, o.clone(), format!("{k}")));
    }
    let handed = std::cell::RefCell::new(Vec::new());
    let mut handoff = Handoff {
        keep: true,
        merged: Vec::new(),
        outputs: Vec::new(),
        origins: Vec::new(),
        spent: Vec::new(),
        on_outputs: |batch: &[(Output, String)]| {
            let jsons = batch.iter().map(|(_, json)| json.clone());
            handed.borrow_mut().extend(jsons);
            Ok(())
        },
    };
    handoff.collect(&mut shards);
    handoff.emit().unwrap();
    let order: Vec<String> = (0..n).rev().map(|k| format!("{k}")).collect();
    assert_eq!(*handed.borrow(), order, "handed on by place");
    // Held to be given back at the next collect, each once.
    assert_eq!(handoff.spent.iter().map(Vec::len).sum::<usize>(), n);
    // The next batch's outputs, made by other shards (k by shard (k + 1) % 3), are taken
    // by the same collect that gives the first batch's back.
    for (k, o) in outputs.iter().enumerate().take(4) {
        let place = place_at(100 + k as u64);
        shards[(k + 1) % 3]
            .placed
            .push((place, o.clone(), format!("{}", 1000 + k)));
    }
    handoff.collect(&mut shards);
    assert!(shards.iter().all(|s| s.placed.is_empty()));
    assert_eq!(handoff.merged.len(), 4);
    handoff.emit().unwrap();
    let second: Vec<String> = (1000..1004).map(|k| format!("{k}")).collect();
    assert_eq!(
        handed.borrow()[n..],
        second[..],
        "the next batch handed on by place"
    );
    for (i, shard) in shards.iter().enumerate() {
        let made: Vec<usize> = (0..n).filter(|k| k % 3 == i).collect();
        assert_eq!(labels(&shard.spent), made, "shard {i}");
        for (o, j) in &shard.spent {
            assert_eq!(o, &outputs[j.parse::<usize>().unwrap()]);
        }
    }
    // The next batch's held for its shards, to be given back at the collect after.
    for (i, spent) in handoff.spent.iter().enumerate() {
        let made: Vec<usize> = (1000..1004).filter(|k| (k - 1000 + 1) % 3 == i).collect();
        assert_eq!(labels(spent), made, "held for shard {i}");
    }
    assert!(handoff.merged.is_empty() && handoff.outputs.is_empty() && handoff.origins.is_empty());
    // A shard's next run drops what it was given back, and so does its end.
    shards[1].run(&[], &[], true);
    assert!(shards[1].spent.is_empty());
    assert!(!shards[2].spent.is_empty());
    shards[2].end(true);
    assert!(shards[2].spent.is_empty());
}

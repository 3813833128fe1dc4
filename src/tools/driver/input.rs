//! Opening the input of a file-driven command (`replay`, `backtest`, `eval`): a file or
//! standard input, decompressed when its bytes are gzip (whatever its name), OTLP JSON
//! trace exports mapped to events when its first line that is not blank is one, and a
//! plain file of events mapped into memory so that the driver reads it in place.
//!
//! Guarantees: the input is told apart by its content, never by a name alone; a FIFO or
//! a pipe is read once, never opened twice; every error names the path it is about.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use crate::bus::ingest::{looks_like_otlp_json, OtlpIngest, OtlpJsonLines};
use crate::config::Config;
use crate::tools::driver::Input;

/// What an input file holds.
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub enum InputFormat {
    /// OTLP JSON when the first line that is not blank is a trace export
    /// (`{"resourceSpans": …`), else events.
    Auto,
    /// loopwarden events, one JSON object a line.
    Events,
    /// OTLP JSON trace exports, one a line (the Collector's file exporter).
    OtlpJson,
}

/// Why an input cannot be opened (fatal: the command stops and says which file).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("cannot open {path}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// How an input is named in messages: its path, or `standard input` for `-`.
pub fn input_name(path: &Path) -> String {
    if path == Path::new("-") {
        "standard input".to_string()
    } else {
        path.display().to_string()
    }
}

/// The two bytes every gzip stream starts with (and no JSON line does).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// A file or standard input (`-`), decompressed when it is gzip: told by its first two
/// bytes, whatever its name.
pub fn open_input(path: &Path) -> Result<Box<dyn BufRead + Send>, InputError> {
    // Small: the driver reads whole batches into buffers of its own, and a read larger
    // than the buffer bypasses it (a large one would copy every byte once more).
    const BUFFER: usize = 1 << 16;
    let name = path.display();
    let mut raw: Box<dyn Read + Send> = if path == Path::new("-") {
        Box::new(std::io::stdin())
    } else {
        Box::new(
            std::fs::File::open(path).map_err(|source| InputError::Open {
                path: name.to_string(),
                source,
            })?,
        )
    };
    let mut head = Vec::with_capacity(2);
    (&mut raw)
        .take(2)
        .read_to_end(&mut head)
        .map_err(|source| InputError::Read {
            path: name.to_string(),
            source,
        })?;
    let gzip = head == GZIP_MAGIC;
    let whole = std::io::Cursor::new(head).chain(raw);
    if gzip {
        let gz = GzipMembers {
            state: Gzip::Member(Box::new(flate2::bufread::GzDecoder::new(
                BufReader::with_capacity(BUFFER, whole),
            ))),
            name: name.to_string(),
        };
        Ok(Box::new(BufReader::with_capacity(BUFFER, gz)))
    } else {
        Ok(Box::new(BufReader::with_capacity(BUFFER, whole)))
    }
}

/// The members of a gzip file one after another, as `gzip -d` reads them: bytes after the
/// last member that do not start another (zero padding, a partial copy) end the input
/// with a warning, instead of failing it after everything was read.
struct GzipMembers<R: BufRead> {
    state: Gzip<R>,
    name: String,
}

enum Gzip<R: BufRead> {
    /// Inside a member.
    Member(Box<flate2::bufread::GzDecoder<R>>),
    /// After one: another, the end, or bytes that are no member.
    Between(R),
    Done,
}

impl<R: BufRead> Read for GzipMembers<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match &mut self.state {
                Gzip::Done => return Ok(0),
                Gzip::Member(decoder) => {
                    let n = decoder.read(buf)?;
                    if n > 0 || buf.is_empty() {
                        return Ok(n);
                    }
                    let Gzip::Member(decoder) = std::mem::replace(&mut self.state, Gzip::Done)
                    else {
                        unreachable!("matched a member")
                    };
                    self.state = Gzip::Between(decoder.into_inner());
                }
                Gzip::Between(rest) => {
                    // An error here leaves the state as it is: a read again retries.
                    let head = rest.fill_buf()?;
                    let another = match head {
                        [] => None,
                        [first, more @ ..] => Some(
                            *first == GZIP_MAGIC[0]
                                && more.first().is_none_or(|&b| b == GZIP_MAGIC[1]),
                        ),
                    };
                    match another {
                        None => self.state = Gzip::Done,
                        Some(true) => {
                            let Gzip::Between(rest) =
                                std::mem::replace(&mut self.state, Gzip::Done)
                            else {
                                unreachable!("matched between members")
                            };
                            self.state =
                                Gzip::Member(Box::new(flate2::bufread::GzDecoder::new(rest)));
                        }
                        Some(false) => {
                            eprintln!(
                                "warning: {}: what follows the last gzip member is not gzip; ignored",
                                self.name
                            );
                            self.state = Gzip::Done;
                        }
                    }
                }
            }
        }
    }
}

/// The events `replay` and `backtest` read.
pub enum Events {
    Reader(Box<dyn BufRead + Send>),
    Mapped(Arc<memmap2::Mmap>),
}

impl Events {
    pub fn input(&mut self) -> Input<'_> {
        match self {
            Events::Reader(reader) => Input::Reader(&mut **reader),
            Events::Mapped(map) => Input::Bytes(map.clone()),
        }
    }
}

/// The events of `path`: a plain file of events mapped into memory when `mmap` allows
/// (read in place, no copy), anything else read (standard input, `.gz`, OTLP JSON mapped
/// to events, a pipe or FIFO, an empty file, or a file the system does not map).
pub fn open_events(
    path: &Path,
    format: InputFormat,
    config: &Config,
    mmap: bool,
) -> Result<Events, InputError> {
    let plain = path != Path::new("-") && path.extension().is_none_or(|e| e != "gz");
    // Told apart before opening: a FIFO opened twice would lose its writer's data.
    let regular = || std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() > 0);
    if mmap && plain && format != InputFormat::OtlpJson && regular() {
        let f = std::fs::File::open(path).map_err(|source| InputError::Open {
            path: path.display().to_string(),
            source,
        })?;
        // SAFETY: the map is only read, and the slices borrowed from it never outlive it
        // (the batches hold the `Arc`). What no read could do is the caller's risk, said
        // in `--no-mmap`'s help and the README: a file cut short or failing on disk while
        // mapped ends the process (SIGBUS), and one rewritten in place may change bytes
        // already checked (appending is harmless: the map ends at the size it had).
        if let Ok(map) = unsafe { memmap2::Mmap::map(&f) } {
            let _ = map.advise(memmap2::Advice::Sequential);
            let head = &map[..map.len().min(1 << 16)];
            let gzip = head.starts_with(&GZIP_MAGIC);
            if !gzip && (format == InputFormat::Events || !looks_like_otlp_json(head)) {
                return Ok(Events::Mapped(Arc::new(map)));
            }
        }
    }
    Ok(Events::Reader(events_of(
        open_input(path)?,
        path,
        format,
        config,
    )?))
}

/// The input as event lines: OTLP JSON trace exports are mapped to events (reporting
/// bad lines and a summary on stderr), events pass through.
fn events_of(
    mut input: Box<dyn BufRead + Send>,
    path: &Path,
    format: InputFormat,
    config: &Config,
) -> Result<Box<dyn BufRead + Send>, InputError> {
    let otlp = match format {
        InputFormat::Events => false,
        InputFormat::OtlpJson => true,
        InputFormat::Auto => {
            // Read ahead to the first line that is not blank (a pipe's first read may
            // hold less), then the input is read whole again.
            let mut head = Vec::new();
            loop {
                let start = head.len();
                let n = (&mut input)
                    .take(1 << 16)
                    .read_until(b'\n', &mut head)
                    .map_err(|source| InputError::Read {
                        path: input_name(path),
                        source,
                    })?;
                if n == 0 || !head[start..].trim_ascii().is_empty() || head.len() >= 1 << 16 {
                    break;
                }
            }
            let otlp = looks_like_otlp_json(&head);
            input = Box::new(BufReader::with_capacity(
                1 << 16,
                std::io::Cursor::new(head).chain(input),
            ));
            otlp
        }
    };
    if !otlp {
        return Ok(input);
    }
    let mapper = OtlpIngest::mapper(config.otlp_session_attribute.as_deref(), &config.limits);
    let lines = OtlpJsonLines::new(input, mapper, Box::new(std::io::stderr()));
    Ok(Box::new(BufReader::with_capacity(1 << 16, lines)))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn opened(path: &Path, format: InputFormat, mmap: bool) -> &'static str {
        match open_events(path, format, &Config::default(), mmap).unwrap() {
            Events::Mapped(_) => "mapped",
            Events::Reader(_) => "read",
        }
    }

    #[test]
    fn a_plain_file_of_events_is_mapped_anything_else_read() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events.jsonl");
        std::fs::write(&events, "{\"type\": \"session.started\"}\n").unwrap();
        let otlp = dir.path().join("traces.jsonl");
        std::fs::write(&otlp, "{\"resourceSpans\": []}\n").unwrap();
        let empty = dir.path().join("empty.jsonl");
        std::fs::write(&empty, "").unwrap();
        let gz = dir.path().join("events.jsonl.gz");
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), Default::default());
        encoder.write_all(b"{}\n").unwrap();
        std::fs::write(&gz, encoder.finish().unwrap()).unwrap();

        assert_eq!(opened(&events, InputFormat::Auto, true), "mapped");
        assert_eq!(opened(&events, InputFormat::Events, true), "mapped");
        assert_eq!(
            opened(&events, InputFormat::Auto, false),
            "read",
            "--no-mmap"
        );
        assert_eq!(
            opened(&otlp, InputFormat::Auto, true),
            "read",
            "OTLP is mapped to events"
        );
        assert_eq!(
            opened(&otlp, InputFormat::Events, true),
            "mapped",
            "said to be events"
        );
        assert_eq!(opened(&empty, InputFormat::Auto, true), "read");
        assert_eq!(opened(&gz, InputFormat::Auto, true), "read");
        assert!(open_events(
            &dir.path().join("missing"),
            InputFormat::Auto,
            &Config::default(),
            true
        )
        .is_err());
    }

    /// Gzip is told by its bytes, not its name (a `.log` that is gzip, or standard
    /// input), and OTLP JSON by its first line that is not blank.
    #[test]
    fn gzip_and_otlp_are_told_by_their_content() {
        let read_all = |path: &Path, mmap: bool| {
            let mut events =
                open_events(path, InputFormat::Auto, &Config::default(), mmap).unwrap();
            match events.input() {
                Input::Reader(reader) => {
                    let mut text = String::new();
                    reader.read_to_string(&mut text).unwrap();
                    text
                }
                Input::Bytes(bytes) => String::from_utf8((*bytes).as_ref().to_vec()).unwrap(),
            }
        };
        let dir = tempfile::tempdir().unwrap();
        let lines = "{\"type\": \"session.started\", \"session_id\": \"s\"}\n".repeat(3);
        let gz = dir.path().join("events.log");
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), Default::default());
        encoder.write_all(lines.as_bytes()).unwrap();
        std::fs::write(&gz, encoder.finish().unwrap()).unwrap();
        assert_eq!(opened(&gz, InputFormat::Auto, true), "read");
        assert_eq!(read_all(&gz, true), lines);
        assert_eq!(read_all(&gz, false), lines);
        // One byte, and a file that is not gzip past its first byte: read as it is.
        for text in ["x", "\u{1f}{}\n"] {
            let odd = dir.path().join("odd.jsonl");
            std::fs::write(&odd, text).unwrap();
            assert_eq!(read_all(&odd, false), text);
        }
        let otlp = dir.path().join("traces.jsonl");
        std::fs::write(&otlp, "\n  \r\n{\"resourceSpans\": []}\n").unwrap();
        assert_eq!(
            opened(&otlp, InputFormat::Auto, true),
            "read",
            "mapped to events"
        );
        assert_eq!(read_all(&otlp, false), "", "no spans, no events");
    }

    /// Gzip members are read one after another, and bytes after the last that are no
    /// member end the input (as `gzip -d` has it), where a corrupt member fails it.
    #[test]
    fn gzip_members_are_read_in_turn_and_trailing_bytes_ignored() {
        let member = |text: &str| {
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), Default::default());
            encoder.write_all(text.as_bytes()).unwrap();
            encoder.finish().unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let read_all = |bytes: &[u8]| {
            let path = dir.path().join("events.jsonl.gz");
            std::fs::write(&path, bytes).unwrap();
            let mut text = String::new();
            open_input(&path)
                .map_err(|e| e.to_string())?
                .read_to_string(&mut text)
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(text)
        };
        let two = [member("{\"a\": 1}\n"), member("{\"b\": 2}\n")].concat();
        assert_eq!(read_all(&two).unwrap(), "{\"a\": 1}\n{\"b\": 2}\n");
        for trailing in [&[0u8; 100][..], b"garbage\n"] {
            let padded = [&two[..], trailing].concat();
            assert_eq!(read_all(&padded).unwrap(), "{\"a\": 1}\n{\"b\": 2}\n");
        }
        // A second member cut short is an error, not an end.
        let cut = [&two[..], &member("{\"c\": 3}\n")[..12]].concat();
        assert!(read_all(&cut).is_err());
    }

    /// A FIFO is read, not mapped, and its writer's data all arrives (`open_events`
    /// tells it apart by `stat`, without opening it: a FIFO opened, closed and opened
    /// again may lose what its writer wrote between, or wait for a writer that has gone).
    #[test]
    fn a_fifo_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("events.fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let lines: String = (0..1000).map(|i| format!("{{\"n\": {i}}}\n")).collect();
        let writer = {
            let (fifo, lines) = (fifo.clone(), lines.clone());
            // Opening for writing waits for the reader; written, then closed.
            std::thread::spawn(move || std::fs::write(fifo, lines).unwrap())
        };
        // Read on a thread of its own, so that a read that waits for a writer that has
        // gone fails the test on the timeout instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut events = open_events(&fifo, InputFormat::Auto, &Config::default(), true)
                .expect("the FIFO opened");
            let Input::Reader(reader) = events.input() else {
                panic!("a FIFO cannot be mapped")
            };
            let mut got = String::new();
            reader.read_to_string(&mut got).expect("the FIFO read");
            let _ = tx.send(got);
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the FIFO read to its end");
        writer.join().unwrap();
        assert_eq!(got, lines);
    }
}

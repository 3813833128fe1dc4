//! The input cut into batches of whole lines: read on a thread of its own into buffers
//! (a reader), or sliced in place (bytes already in memory, a mapped file); a line longer
//! than a batch is cut and reported, never split into two events.

use super::*;

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
pub(super) enum Batch {
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
pub(super) struct LongLine {
    pub(super) start: usize,
    pub(super) size: usize,
}

impl Batch {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Batch::Buffer { buf, len, .. } => &buf[..*len],
            Batch::Slice { bytes, start, end } => &(**bytes).as_ref()[*start..*end],
        }
    }

    pub(super) fn cut(&self) -> &[LongLine] {
        match self {
            Batch::Buffer { cut, .. } => cut,
            Batch::Slice { .. } => &[],
        }
    }
}

/// Whole-line batches of bytes in memory, as [`read_batches`] cuts a read input: about
/// `batch_bytes` each, ending at the last line break (a longer line is taken whole), the
/// last one perhaps without a line break.
pub(super) struct Slices {
    pub(super) bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    pub(super) at: usize,
    pub(super) batch_bytes: usize,
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
pub(super) fn read_batches(
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
pub(super) struct CutLine {
    pub(super) line: LongLine,
    /// The batch's bytes: the kept start of the line, then what was read after its break.
    pub(super) len: usize,
    /// Where the line being read now starts.
    pub(super) line_start: usize,
    /// Whether the input ended (inside the long line, or right after it).
    pub(super) eof: bool,
}

/// Keeps the first `keep` bytes of the line that starts at `line_start` of `buf[..len]`
/// and reads past the rest of it up to its line break, in the buffer's free space; the
/// line break and what was read after it follow the kept bytes.
pub(super) fn cut_long_line(
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
    // which is not counted, as in `ParseWork::line`).
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
pub(super) fn read_some(
    input: &mut (dyn BufRead + Send),
    buf: &mut [u8],
) -> std::io::Result<usize> {
    loop {
        match input.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            read => return read,
        }
    }
}

/// A line without its line break (`\n` or `\r\n`), as its size is judged.
pub(super) fn unbroken(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

pub(super) fn trim_line(line: &[u8]) -> &[u8] {
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

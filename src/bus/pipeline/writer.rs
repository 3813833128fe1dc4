//! The store writer: a worker's thread that writes its acknowledged batches to sled (and
//! flushes the database where sled is the only record of the state), so that the worker
//! goes on polling and applying while a batch is stored. Without it a batch's end held
//! every partition still for the sled write (tens of milliseconds at ten thousand open
//! sessions and more as they grow), and the events polled meanwhile waited.
//!
//! Guarantees: batches are stored in the order they are handed over, each partition's
//! changes as one atomic sled batch; a batch is reported only once all of it is written
//! (and flushed, when asked), and reports come in hand-over order, so the worker, which
//! commits a batch's input offsets on its report, never commits offsets before their
//! state is stored. A failed write is retried with the pipeline's backoff until it
//! succeeds or shutdown's deadline passes; the report then carries the error, and no
//! later batch is written (its offsets would pass over the failed batch's events). At most
//! [`QUEUED_MAX`] batches wait for the thread: a worker that outruns its disk waits at
//! the hand-over instead of holding more states in memory. Errors other than I/O (a
//! state that cannot be written) are not retried. Dropping the writer ends the thread as
//! a kill would: the write in progress finishes (or fails, without retrying), the
//! batches still queued are not written, and the thread is joined, so the database is
//! not left open behind a worker that is gone. (Leaving a batch unwritten is always safe:
//! its offsets are not committed, and nothing after it is written.) Every
//! [`RELEASE_EVERY`] the thread hands the pages its heap freed back to the kernel, as the
//! worker does for its own: sled copies a leaf with each change to it, on this thread,
//! and mimalloc collects only the calling thread's heap.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::error;

use super::backoff::Backoff;
use super::{lock, PipelineError};
use crate::bus::kafka::c_heap;
use crate::bus::kafka::settings::KafkaSettings;
use crate::engine::store::{SledStore, StateStore, StoreBatch, StoreError};
use crate::shutdown::Shutdown;
use crate::telemetry::WriteWatch;

/// A partition's store, shared by the worker (which restores it) and its writer (which
/// writes it).
pub(super) type SharedStore = Arc<Mutex<SledStore>>;

/// Batches handed over and not yet taken by the thread, at most.
pub(super) const QUEUED_MAX: usize = 2;

/// How often the thread hands the pages its heap freed back to the kernel
/// (`c_heap::release_freed_memory`, not thorough: a few milliseconds).
const RELEASE_EVERY: Duration = Duration::from_secs(10);

/// One batch to store: each changed partition's changes, in one sled batch each.
pub(super) struct Job {
    pub batches: Vec<(i32, SharedStore, StoreBatch)>,
    /// Flush the database after the writes (sled is the only record of the state).
    pub flush: bool,
}

/// A stored batch, reported in hand-over order.
#[derive(Debug)]
pub(super) struct Stored {
    /// Whether it had anything to write (for the store stage's metrics).
    pub wrote: bool,
    /// How long the writes (and the flush) took.
    pub took: Duration,
    /// Bytes the partitions' stores put in sled for it.
    pub bytes: u64,
    pub result: Result<(), PipelineError>,
    /// The batches written, handed back so that their states, allocated on the worker's
    /// thread, are freed there once the report is taken: freed on this thread, each of
    /// them cost a free from another thread's heap, and the worker's allocator a sweep
    /// to take them back (about 3 % of the process's CPU at a million open sessions,
    /// where every event writes a state).
    pub spent: Vec<StoreBatch>,
}

/// The worker's handle on its writer thread.
pub(super) struct Writer {
    jobs: Option<SyncSender<Job>>,
    reports: Receiver<Stored>,
    thread: Option<JoinHandle<()>>,
    /// Set when the writer is dropped: the thread writes nothing more.
    closing: Arc<AtomicBool>,
    /// Batches handed over and not reported back yet.
    outstanding: usize,
}

impl Writer {
    /// Starts worker `index`'s writer thread, which writes into `db`'s trees, retries
    /// with `settings`' backoff, and shows each write in progress to `watch` (`/healthz`
    /// fails when one never ends).
    pub fn start(
        index: usize,
        db: sled::Db,
        settings: &KafkaSettings,
        shutdown: &Shutdown,
        watch: WriteWatch,
    ) -> Result<Writer, PipelineError> {
        let (jobs, taken) = sync_channel::<Job>(QUEUED_MAX);
        let (report, reports) = std::sync::mpsc::channel();
        let backoff = Backoff::new(settings, shutdown);
        let closing = Arc::new(AtomicBool::new(false));
        let closed = closing.clone();
        let thread = std::thread::Builder::new()
            .name(super::store_thread(index))
            .spawn(move || {
                let mut failed = false;
                let mut released_at = Instant::now();
                for job in taken {
                    if closed.load(Ordering::Acquire) {
                        return;
                    }
                    let stored = if failed {
                        // A later batch's offsets would pass over the failed one's
                        // events, whose states were not written: nothing more is.
                        Stored {
                            wrote: false,
                            took: Duration::ZERO,
                            bytes: 0,
                            result: Err(PipelineError::StoreAfterFailure),
                            spent: Vec::new(),
                        }
                    } else {
                        watch.during(|| write(&db, job, &mut backoff.fresh(), &closed))
                    };
                    failed |= stored.result.is_err();
                    if report.send(stored).is_err() {
                        return;
                    }
                    if released_at.elapsed() >= RELEASE_EVERY {
                        c_heap::release_freed_memory(false);
                        released_at = Instant::now();
                    }
                }
            })
            .map_err(PipelineError::Thread)?;
        Ok(Writer {
            jobs: Some(jobs),
            reports,
            thread: Some(thread),
            closing,
            outstanding: 0,
        })
    }

    /// Hands a batch over; waits while [`QUEUED_MAX`] batches wait already.
    pub fn hand(&mut self, job: Job) {
        // The thread ends before the sender is dropped only if it panicked: then the
        // batch is lost, and `next` reports it failed.
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(job);
        }
        self.outstanding += 1;
    }

    /// The next report: at once (`None`: none is ready yet), or with `block` once it
    /// comes. A thread that died (a panic in sled) reports its batches failed.
    pub fn next(&mut self, block: bool) -> Option<Stored> {
        if self.outstanding == 0 {
            return None;
        }
        let received = if block {
            self.reports.recv().map_err(|_| TryRecvError::Disconnected)
        } else {
            self.reports.try_recv()
        };
        match received {
            Ok(stored) => {
                self.outstanding -= 1;
                Some(stored)
            }
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                self.outstanding -= 1;
                Some(Stored {
                    wrote: false,
                    took: Duration::ZERO,
                    bytes: 0,
                    result: Err(PipelineError::StoreWriterEnded),
                    spent: Vec::new(),
                })
            }
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Release);
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Writes one batch: each partition's changes, retried on I/O errors until they are
/// taken, shutdown's deadline passes or the writer is dropped, then the flush if asked.
fn write(db: &sled::Db, job: Job, backoff: &mut Backoff, closing: &AtomicBool) -> Stored {
    let started = Instant::now();
    let wrote = !job.batches.is_empty();
    // A store that takes its time, for the liveness test (`FAILPOINTS=store-write=sleep(ms)`).
    #[cfg(feature = "failpoints")]
    let _ = fail::eval("store-write", |_| ());
    let mut bytes = 0;
    let result = (|| {
        for (partition, store, batch) in &job.batches {
            let mut store = lock(store);
            let before = store.written_bytes();
            loop {
                match store.commit(batch) {
                    Ok(()) => {
                        bytes += store.written_bytes() - before;
                        break;
                    }
                    Err(StoreError::Io(e)) => {
                        error!(partition, error = %e, "state store write failed; retrying");
                        if closing.load(Ordering::Acquire) || backoff.pause().is_err() {
                            return Err(StoreError::Io(e));
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        if wrote && job.flush {
            db.flush().map_err(StoreError::Io)?;
        }
        Ok(())
    })();
    Stored {
        wrote,
        took: started.elapsed(),
        bytes,
        result: result.map_err(PipelineError::from),
        spent: job.batches.into_iter().map(|(.., batch)| batch).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::engine::store::open_db_with_cache;

    fn settings() -> KafkaSettings {
        let mut settings = Config::from_toml_str("", "writer", std::iter::empty())
            .unwrap()
            .kafka
            .clone();
        settings.retry_backoff_min = Duration::from_millis(1);
        settings.retry_backoff_max = Duration::from_millis(5);
        settings
    }

    /// A watch no one reads.
    fn watch() -> WriteWatch {
        crate::telemetry::Liveness::default().store_watch()
    }

    /// A database in a temporary directory and its partition 0's store.
    fn partition_store() -> (tempfile::TempDir, sled::Db, SharedStore) {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db_with_cache(dir.path(), 8 << 20).unwrap();
        let store = Arc::new(Mutex::new(SledStore::partition(&db, 0).unwrap()));
        (dir, db, store)
    }

    /// A batch writing `session`'s state (none when `None`) and the offset of `t/0`.
    fn job(store: &SharedStore, session: Option<(&str, &[u8])>, offset: i64) -> Job {
        let batch = StoreBatch {
            puts: session
                .map(|(id, state)| (id.to_string(), state.to_vec().into()))
                .into_iter()
                .collect(),
            deltas: Vec::new(),
            deletes: Vec::new(),
            offsets: vec![("t/0".to_string(), offset)],
        };
        Job {
            batches: vec![(0, store.clone(), batch)],
            flush: true,
        }
    }

    /// The liveness watch sees a write while it is in progress, and not once it ended:
    /// here a write held at its partition's store (the test holds the store's lock).
    #[test]
    fn a_write_in_progress_is_watched_until_it_ends() {
        let (_dir, db, store) = partition_store();
        let liveness = crate::telemetry::Liveness::new(Duration::from_secs(1));
        let mut writer = Writer::start(
            0,
            db.clone(),
            &settings(),
            &Shutdown::new(),
            liveness.store_watch(),
        )
        .unwrap();
        let held = lock(&store);
        writer.hand(job(&store, Some(("s", b"state")), 1));
        let deadline = Instant::now() + Duration::from_secs(10);
        while liveness.longest_write(Instant::now()).is_none() {
            assert!(Instant::now() < deadline, "the write never showed");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(1100));
        assert!(
            liveness.stalled_write(Instant::now()).is_some(),
            "held past the bound: {:?}",
            liveness.longest_write(Instant::now())
        );
        assert!(writer.next(false).is_none(), "not reported while held");
        drop(held);
        let stored = writer.next(true).expect("reported once the store is free");
        assert!(stored.result.is_ok(), "{:?}", stored.result);
        assert_eq!(liveness.longest_write(Instant::now()), None, "ended");
    }

    /// A report hands back the batches it wrote (so the worker frees their states), and
    /// what it wrote is on disk: the session's state and the offset read back from sled.
    #[test]
    fn a_report_hands_back_the_batches_it_wrote() {
        let (_dir, db, store) = partition_store();
        let mut writer = Writer::start(0, db, &settings(), &Shutdown::new(), watch()).unwrap();
        let written = job(&store, Some(("s", b"state")), 7);
        let expected: Vec<StoreBatch> = written.batches.iter().map(|(.., b)| b.clone()).collect();
        writer.hand(written);
        let stored = writer.next(true).expect("reported");
        assert!(stored.result.is_ok(), "{:?}", stored.result);
        assert_eq!(stored.spent, expected);
        let store = lock(&store);
        assert_eq!(StateStore::offset(&*store, "t/0").unwrap(), Some(7));
        assert!(
            store.session_bytes("s").unwrap().is_some(),
            "the state is stored"
        );
    }

    /// Each worker's writer has a thread name of its own, whole in what Linux keeps of it.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_writers_thread_is_named_after_its_worker() {
        let (_dir, db, _store) = partition_store();
        let names = || -> Vec<String> {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .collect()
        };
        // A worker index no other test's writer has.
        let writer = Writer::start(37, db, &settings(), &Shutdown::new(), watch()).unwrap();
        // The new thread names itself once it runs.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = names();
        while !seen.iter().any(|n| n == "lw-store-37") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            seen = names();
        }
        assert!(
            seen.iter().any(|n| n == "lw-store-37"),
            "no thread lw-store-37 among {seen:?}"
        );
        drop(writer);
    }

    #[test]
    fn batches_are_stored_in_hand_over_order_and_a_failed_write_is_retried() {
        let (_dir, db, store) = partition_store();
        let mut writer =
            Writer::start(0, db.clone(), &settings(), &Shutdown::new(), watch()).unwrap();
        lock(&store).fail_next_write_after(0);
        let batches = [
            ("s", b"first".as_slice()),
            ("s", b"second"),
            ("t", b"third"),
        ];
        for (i, session) in batches.into_iter().enumerate() {
            writer.hand(job(&store, Some(session), i as i64 + 1));
        }
        for _ in 0..3 {
            let stored = writer.next(true).expect("a report per batch");
            assert!(stored.result.is_ok(), "{:?}", stored.result);
            assert!(stored.wrote);
        }
        assert!(writer.next(true).is_none(), "three batches, three reports");
        let store = lock(&store);
        assert_eq!(store.offset("t/0").unwrap(), Some(3), "the last batch last");
        assert_eq!(
            store.session_bytes("s").unwrap().as_deref(),
            Some(&b"second"[..]),
            "the second batch after the first"
        );
        assert_eq!(
            store.session_bytes("t").unwrap().as_deref(),
            Some(&b"third"[..])
        );
    }

    #[test]
    fn a_write_still_failing_at_the_shutdown_deadline_is_reported_failed_and_nothing_after_it_is_written(
    ) {
        let (_dir, db, store) = partition_store();
        let mut settings = settings();
        settings.shutdown_deadline = Duration::ZERO;
        let shutdown = Shutdown::new();
        shutdown.trigger();
        let mut writer = Writer::start(0, db.clone(), &settings, &shutdown, watch()).unwrap();
        lock(&store).fail_next_write_after(0);
        writer.hand(job(&store, Some(("s", b"failed")), 1));
        writer.hand(job(&store, Some(("s", b"after")), 2));
        let failed = writer.next(true).unwrap();
        assert!(
            matches!(failed.result, Err(PipelineError::Store(StoreError::Io(_)))),
            "{:?}",
            failed.result
        );
        let after = writer.next(true).unwrap();
        assert!(
            matches!(after.result, Err(PipelineError::StoreAfterFailure)),
            "{:?}",
            after.result
        );
        assert_eq!(
            lock(&store).offset("t/0").unwrap(),
            None,
            "nothing written after a failed batch"
        );
    }

    #[test]
    fn a_dropped_writer_writes_none_of_the_batches_still_queued() {
        let (_dir, db, store) = partition_store();
        let mut writer =
            Writer::start(0, db.clone(), &settings(), &Shutdown::new(), watch()).unwrap();
        // The thread waits for the store while the test holds it: the first batch taken,
        // the second queued, when the writer is dropped.
        let held = lock(&store);
        writer.hand(job(&store, None, 1));
        writer.hand(job(&store, None, 2));
        // Usually the thread has taken the first batch by then; if not, that one is not
        // written either. The second never is.
        std::thread::sleep(Duration::from_millis(50));
        let dropping = std::thread::spawn(move || drop(writer));
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        dropping.join().unwrap();
        let offset = lock(&store).offset("t/0").unwrap();
        assert_ne!(offset, Some(2), "the queued batch is not written");
        assert!(matches!(offset, None | Some(1)), "{offset:?}");
    }
}

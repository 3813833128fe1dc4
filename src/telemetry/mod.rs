//! What `loopwarden run` shows of itself: Prometheus metrics, readiness, liveness, and
//! the HTTP endpoint that serves them (`/metrics`, `/healthz`, `/readyz`).
//!
//! Guarantees: the pipeline only updates atomics here (never waits on a scrape; a
//! store watch's registration, twice per worker at its start, shares a mutex with
//! `/healthz`); the
//! HTTP server runs on its own thread, and a failing or slow scraper cannot stall
//! processing. Readiness is true only while every group member of the process (each
//! worker's consumer) holds an assignment of this generation, possibly empty, loaded
//! and restored, and the process is not shutting down: a member whose partitions were
//! revoked or lost is not ready until the group hands it its next assignment, so a
//! member that lost its partitions and cannot rejoin shows on `/readyz`. A member that
//! holds no partition when its group breaks, and a cooperative rebalance that never ends
//! while members keep their partitions, bring no callback and do not show. Liveness is
//! false once a state store write (or a worker's own call into the store: loading a
//! partition, a restore's records, the flush at a clean stop) has been in progress for
//! longer than `state.write_stall_secs`: a store that never returns (a hung disk, a
//! deadlock in the store) stops its worker for good, and only a restart, which restores
//! from the changelog and the stored offsets, brings the instance back.

pub mod http;
pub mod metrics;
pub mod spans;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

pub use metrics::Metrics;
pub use spans::Spans;

/// Shared between the pipeline (which updates it) and the HTTP server (which reads it).
#[derive(Default)]
pub struct Telemetry {
    pub metrics: Metrics,
    pub readiness: Readiness,
    pub liveness: Liveness,
    /// Span export, when configured.
    pub spans: Option<Spans>,
}

impl Telemetry {
    pub fn new() -> Telemetry {
        Telemetry::default()
    }
}

/// Whether the process is ready to be counted as a consuming member.
#[derive(Default)]
pub struct Readiness {
    /// The group members of the process and those of them awaiting an assignment.
    members: Arc<MemberCounts>,
    /// Partitions being restored from the changelog right now.
    restoring: AtomicUsize,
}

#[derive(Default)]
struct MemberCounts {
    live: AtomicUsize,
    awaiting: AtomicUsize,
}

impl Readiness {
    /// A group member (a worker's consumer) joins: it awaits its first assignment until
    /// [`GroupMember::assignment_loaded`], and counts until the handle is dropped.
    pub fn member(&self) -> GroupMember {
        self.members.live.fetch_add(1, Ordering::AcqRel);
        self.members.awaiting.fetch_add(1, Ordering::AcqRel);
        GroupMember {
            counts: self.members.clone(),
            awaiting: true,
        }
    }

    /// A partition's restore begins; the returned guard ends it when dropped.
    pub fn restoring(&self) -> RestoreGuard<'_> {
        self.restoring.fetch_add(1, Ordering::AcqRel);
        RestoreGuard(self)
    }

    pub fn is_ready(&self) -> bool {
        self.describe() == READY
    }

    /// Why not ready (for the `/readyz` body).
    pub fn describe(&self) -> &'static str {
        if self.restoring.load(Ordering::Acquire) > 0 {
            "restoring partition state from the changelog"
        } else if self.members.live.load(Ordering::Acquire) == 0
            || self.members.awaiting.load(Ordering::Acquire) > 0
        {
            "waiting for a partition assignment"
        } else {
            READY
        }
    }
}

const READY: &str = "ready";

/// One group member's part in [`Readiness`]: awaiting an assignment from its start until
/// one is loaded, and again from a revoke, a lost assignment or a rebalance error until
/// the group's next assignment (librdkafka hands every member one at the end of each
/// rebalance, an empty one included, eager and cooperative alike) is loaded.
pub struct GroupMember {
    counts: Arc<MemberCounts>,
    awaiting: bool,
}

impl GroupMember {
    /// The group's assignment is loaded (its partitions restored); empty counts too.
    pub fn assignment_loaded(&mut self) {
        if std::mem::replace(&mut self.awaiting, false) {
            self.counts.awaiting.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Partitions were taken away (revoked or lost): the member awaits the next
    /// assignment.
    pub fn awaiting_assignment(&mut self) {
        if !std::mem::replace(&mut self.awaiting, true) {
            self.counts.awaiting.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Drop for GroupMember {
    fn drop(&mut self) {
        self.assignment_loaded();
        self.counts.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether the process still makes progress, as `/healthz` tells it: every state store
/// write in progress (each worker and its store writer register a [`WriteWatch`]) and
/// how long one may last before the process counts as stuck.
pub struct Liveness {
    write_stall: Duration,
    epoch: Instant,
    writes: Mutex<Vec<Weak<AtomicU64>>>,
}

impl Default for Liveness {
    fn default() -> Liveness {
        Liveness::new(Duration::from_secs(crate::config::DEFAULT_WRITE_STALL_SECS))
    }
}

impl Liveness {
    /// Stuck once a store write lasts longer than `write_stall`.
    pub fn new(write_stall: Duration) -> Liveness {
        Liveness {
            write_stall,
            epoch: Instant::now(),
            writes: Mutex::new(Vec::new()),
        }
    }

    pub fn write_stall(&self) -> Duration {
        self.write_stall
    }

    /// A watch over one thread's calls into the store, counted while it lives.
    pub fn store_watch(&self) -> WriteWatch {
        let since = Arc::new(AtomicU64::new(IDLE));
        let mut writes = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        writes.retain(|w| w.strong_count() > 0);
        writes.push(Arc::downgrade(&since));
        WriteWatch {
            epoch: self.epoch,
            since,
        }
    }

    /// How long the longest write in progress at `now` has lasted (`None`: none is).
    pub fn longest_write(&self, now: Instant) -> Option<Duration> {
        let writes = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        writes
            .iter()
            .filter_map(Weak::upgrade)
            .map(|since| since.load(Ordering::Acquire))
            .filter(|&since| since != IDLE)
            .map(|since| {
                let began = self.epoch + Duration::from_micros(since - 1);
                now.saturating_duration_since(began)
            })
            .max()
    }

    /// The longest write in progress at `now`, when it has lasted longer than
    /// `write_stall`.
    pub fn stalled_write(&self, now: Instant) -> Option<Duration> {
        self.longest_write(now).filter(|d| *d > self.write_stall)
    }
}

/// A watch's value while no write is in progress (a write's is its start, in µs after
/// the epoch, plus one).
const IDLE: u64 = 0;

/// One thread's write in progress, as [`Liveness`] sees it.
pub struct WriteWatch {
    epoch: Instant,
    since: Arc<AtomicU64>,
}

impl WriteWatch {
    /// A write begins at `now`; it ends when the returned guard is dropped (an early
    /// return and a panic end it too). One at a time: a write begun while another is in
    /// progress replaces it.
    pub fn begin(&self, now: Instant) -> Writing<'_> {
        let micros = now.saturating_duration_since(self.epoch).as_micros();
        let since = u64::try_from(micros).unwrap_or(u64::MAX - 1) + 1;
        self.since.store(since, Ordering::Release);
        Writing(self)
    }

    /// Runs `call` as a write begun now.
    pub fn during<T>(&self, call: impl FnOnce() -> T) -> T {
        let _writing = self.begin(Instant::now());
        call()
    }
}

/// A write in progress: ends it when dropped.
pub struct Writing<'a>(&'a WriteWatch);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.since.store(IDLE, Ordering::Release);
    }
}

/// Marks a restore in progress for as long as it lives.
pub struct RestoreGuard<'a>(&'a Readiness);

impl Drop for RestoreGuard<'_> {
    fn drop(&mut self) {
        self.0.restoring.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_in_progress_longer_than_the_bound_is_a_stall_and_an_ended_one_is_not() {
        let live = Liveness::new(Duration::from_secs(60));
        let start = Instant::now();
        let (first, second) = (live.store_watch(), live.store_watch());
        assert_eq!(live.longest_write(start), None, "no write begun");
        let first_write = first.begin(start);
        let second_write = second.begin(start + Duration::from_secs(50));
        let at = |secs| start + Duration::from_secs(secs);
        // (A write's start is kept to the microsecond: whole seconds compared.)
        let secs = |d: Option<Duration>| d.map(|d| d.as_secs());
        assert_eq!(secs(live.longest_write(at(55))), Some(55));
        assert_eq!(live.stalled_write(at(59)), None, "within the bound");
        assert_eq!(secs(live.stalled_write(at(61))), Some(61));
        drop(first_write);
        assert_eq!(
            live.stalled_write(at(61)),
            None,
            "the other write began 11 s before"
        );
        assert_eq!(secs(live.longest_write(at(111))), Some(61));
        assert_eq!(secs(live.stalled_write(at(111))), Some(61));
        std::mem::forget(second_write);
        drop(second);
        assert_eq!(
            live.longest_write(at(200)),
            None,
            "a writer gone is not watched"
        );
    }

    #[test]
    fn ready_only_after_an_assignment_and_outside_restores() {
        let r = Readiness::default();
        assert!(!r.is_ready(), "no member yet");
        assert_eq!(r.describe(), "waiting for a partition assignment");
        let mut member = r.member();
        assert!(!r.is_ready());
        {
            let _restore = r.restoring();
            member.assignment_loaded();
            assert!(!r.is_ready());
            assert_eq!(r.describe(), "restoring partition state from the changelog");
        }
        assert!(r.is_ready());
        assert_eq!(r.describe(), "ready");
    }

    #[test]
    fn every_member_must_hold_an_assignment_and_one_taken_away_waits_for_the_next() {
        let r = Readiness::default();
        let (mut first, mut second) = (r.member(), r.member());
        first.assignment_loaded();
        assert!(!r.is_ready(), "the second member has none yet");
        second.assignment_loaded();
        second.assignment_loaded();
        assert!(r.is_ready(), "an assignment loaded twice counts once");
        first.awaiting_assignment();
        first.awaiting_assignment();
        assert!(!r.is_ready(), "revoked or lost: awaiting the next");
        assert_eq!(r.describe(), "waiting for a partition assignment");
        first.assignment_loaded();
        assert!(
            r.is_ready(),
            "taken away twice, one assignment ends the wait"
        );
        first.awaiting_assignment();
        drop(first);
        assert!(r.is_ready(), "a member gone awaits nothing");
        drop(second);
        assert!(!r.is_ready(), "no member left");
    }
}

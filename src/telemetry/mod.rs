//! What `loopwarden run` shows of itself: Prometheus metrics, readiness, and the HTTP
//! endpoint that serves them (`/metrics`, `/healthz`, `/readyz`).
//!
//! Guarantees: the pipeline only updates atomics here (never waits on a scrape); the
//! HTTP server runs on its own thread, and a failing or slow scraper cannot stall
//! processing. Readiness is true only while the process holds an assignment whose
//! partitions are all restored and it is not shutting down.

pub mod http;
pub mod metrics;
pub mod spans;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub use metrics::Metrics;
pub use spans::Spans;

/// Shared between the pipeline (which updates it) and the HTTP server (which reads it).
#[derive(Default)]
pub struct Telemetry {
    pub metrics: Metrics,
    pub readiness: Readiness,
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
    /// Some worker has received and loaded an assignment.
    assigned: AtomicBool,
    /// Partitions being restored from the changelog right now.
    restoring: AtomicUsize,
}

impl Readiness {
    /// A worker finished loading an assignment (its partitions are restored).
    pub fn assignment_loaded(&self) {
        self.assigned.store(true, Ordering::Release);
    }

    /// A partition's restore begins; the returned guard ends it when dropped.
    pub fn restoring(&self) -> RestoreGuard<'_> {
        self.restoring.fetch_add(1, Ordering::AcqRel);
        RestoreGuard(self)
    }

    pub fn is_ready(&self) -> bool {
        self.assigned.load(Ordering::Acquire) && self.restoring.load(Ordering::Acquire) == 0
    }

    /// Why not ready (for the `/readyz` body).
    pub fn describe(&self) -> &'static str {
        if self.restoring.load(Ordering::Acquire) > 0 {
            "restoring partition state from the changelog"
        } else if !self.assigned.load(Ordering::Acquire) {
            "waiting for a partition assignment"
        } else {
            "ready"
        }
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
    fn ready_only_after_an_assignment_and_outside_restores() {
        let r = Readiness::default();
        assert!(!r.is_ready());
        assert_eq!(r.describe(), "waiting for a partition assignment");
        {
            let _restore = r.restoring();
            r.assignment_loaded();
            assert!(!r.is_ready());
        }
        assert!(r.is_ready());
        assert_eq!(r.describe(), "ready");
    }
}

//! One retry rhythm for everything the pipeline retries (cluster metadata, deliveries,
//! transactions, the changelog restore, disk writes): waits that double from
//! `kafka.retry_backoff_min_ms` up to `kafka.retry_backoff_max_ms`, aware of shutdown.
//!
//! Guarantees: [`Backoff::sleep`] ends early when shutdown is triggered and says so, for
//! loops that stop on shutdown; [`Backoff::pause`] is for work that must finish after a
//! shutdown (the batch in hand): once shutdown is triggered it waits at most 100 ms at a
//! time and fails once `kafka.shutdown_deadline_secs` has passed, so the deadline, not
//! the backoff, bounds the retries.

use std::time::Duration;

use crate::bus::kafka::settings::KafkaSettings;
use crate::shutdown::Shutdown;

/// The shutdown deadline passed while work was still being retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlinePassed;

/// Doubling waits between retries of one operation.
pub struct Backoff {
    delay: Duration,
    min: Duration,
    max: Duration,
    shutdown: Shutdown,
    deadline: Duration,
}

impl Backoff {
    pub fn new(settings: &KafkaSettings, shutdown: &Shutdown) -> Backoff {
        Backoff {
            delay: settings.retry_backoff_min,
            min: settings.retry_backoff_min,
            max: settings.retry_backoff_max,
            shutdown: shutdown.clone(),
            deadline: settings.shutdown_deadline,
        }
    }

    /// The same rhythm from its first step (for a nested retry loop).
    pub fn fresh(&self) -> Backoff {
        Backoff {
            delay: self.min,
            min: self.min,
            max: self.max,
            shutdown: self.shutdown.clone(),
            deadline: self.deadline,
        }
    }

    /// The shutdown deadline in seconds (for errors).
    pub fn deadline_secs(&self) -> u64 {
        self.deadline.as_secs()
    }

    /// The delay in milliseconds (a log field).
    pub fn delay_ms(&self) -> u64 {
        self.delay.as_millis() as u64
    }

    /// Waits the delay, or until shutdown; returns whether shutdown came (stop retrying).
    pub fn sleep(&mut self) -> bool {
        let stopped = self.shutdown.sleep(self.delay);
        self.grow();
        stopped
    }

    /// Whether shutdown was asked for.
    pub fn stopping(&self) -> bool {
        self.shutdown.is_triggered()
    }

    /// Whether shutdown was asked for more than the shutdown deadline ago.
    pub fn past_deadline(&self) -> bool {
        self.shutdown
            .triggered_at()
            .is_some_and(|t| t.elapsed() >= self.deadline)
    }

    /// Waits before retrying work that must finish even after shutdown: the delay, cut
    /// short by shutdown; after shutdown at most 100 ms. Fails past the deadline.
    pub fn pause(&mut self) -> Result<(), DeadlinePassed> {
        if self.past_deadline() {
            return Err(DeadlinePassed);
        }
        if !self.shutdown.is_triggered() {
            self.shutdown.sleep(self.delay);
        } else {
            std::thread::sleep(self.delay.min(Duration::from_millis(100)));
        }
        self.grow();
        Ok(())
    }

    fn grow(&mut self) {
        self.delay = (self.delay * 2).min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff(shutdown: &Shutdown, min_ms: u64, max_ms: u64, deadline_ms: u64) -> Backoff {
        Backoff {
            delay: Duration::from_millis(min_ms),
            min: Duration::from_millis(min_ms),
            max: Duration::from_millis(max_ms),
            shutdown: shutdown.clone(),
            deadline: Duration::from_millis(deadline_ms),
        }
    }

    #[test]
    fn delays_double_up_to_the_max() {
        let shutdown = Shutdown::new();
        let mut b = backoff(&shutdown, 1, 5, 1000);
        let mut seen = vec![b.delay_ms()];
        for _ in 0..4 {
            assert!(!b.sleep());
            seen.push(b.delay_ms());
        }
        assert_eq!(seen, vec![1, 2, 4, 5, 5]);
    }

    #[test]
    fn sleep_says_shutdown_and_pause_runs_until_the_deadline() {
        let shutdown = Shutdown::new();
        // A deadline a stalled test thread does not pass before the asserts before it.
        let mut b = backoff(&shutdown, 60_000, 60_000, 1_000);
        shutdown.trigger();
        // A minute's delay, but shutdown came: no wait, and the caller is told.
        assert!(b.sleep());
        assert!(!b.past_deadline());
        assert_eq!(
            b.pause(),
            Ok(()),
            "after shutdown, before the deadline: retry"
        );
        std::thread::sleep(Duration::from_millis(1_100));
        assert!(b.past_deadline());
        assert_eq!(b.pause(), Err(DeadlinePassed));
    }
}

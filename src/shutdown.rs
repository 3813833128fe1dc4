//! The shutdown token handed to long-running commands (`run(config, shutdown)`): a signal
//! handler, the demo or a test triggers it; loops check it and sleeps wake on it.
//!
//! Guarantees: triggering is idempotent and remembers when it first happened, so a
//! shutdown deadline is measured from the first signal.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Default)]
pub struct Shutdown {
    inner: Arc<(Mutex<Option<Instant>>, Condvar)>,
}

impl Shutdown {
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// Asks every holder to stop; wakes sleepers.
    pub fn trigger(&self) {
        let (at, cv) = &*self.inner;
        let mut at = at.lock().unwrap_or_else(|e| e.into_inner());
        if at.is_none() {
            *at = Some(Instant::now());
        }
        cv.notify_all();
    }

    pub fn is_triggered(&self) -> bool {
        self.triggered_at().is_some()
    }

    /// When shutdown was first asked for.
    pub fn triggered_at(&self) -> Option<Instant> {
        *self.inner.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sleeps for `d` unless shutdown is triggered first; returns whether it was.
    pub fn sleep(&self, d: Duration) -> bool {
        let (at, cv) = &*self.inner;
        let guard = at.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = cv
            .wait_timeout_while(guard, d, |at| at.is_none())
            .unwrap_or_else(|e| e.into_inner());
        guard.is_some()
    }
}

/// Triggers the shutdown when dropped while its thread panics: a thread of a long-running
/// command (a worker, the OTLP ingest) that dies by a panic stops the process, instead of
/// leaving it up, live and ready, without the thread. Hold it for the thread's life.
pub struct StopOnPanic(pub Shutdown);

impl Drop for StopOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.trigger();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_panics_holding_the_guard_triggers_the_shutdown() {
        let s = Shutdown::new();
        let held = s.clone();
        std::thread::spawn(move || {
            let _stop = StopOnPanic(held);
        })
        .join()
        .unwrap();
        assert!(!s.is_triggered(), "a thread that ends well stops nothing");
        let held = s.clone();
        let died = std::thread::spawn(move || {
            let _stop = StopOnPanic(held);
            panic!("a worker's bug");
        })
        .join();
        assert!(died.is_err());
        assert!(s.is_triggered(), "the panic left the process running");
    }

    #[test]
    fn trigger_wakes_a_sleeper_and_keeps_the_first_time() {
        let s = Shutdown::new();
        assert!(!s.sleep(Duration::from_millis(1)));
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.sleep(Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(20));
        s.trigger();
        assert!(t.join().unwrap());
        let first = s.triggered_at().unwrap();
        s.trigger();
        assert_eq!(s.triggered_at(), Some(first));
    }
}

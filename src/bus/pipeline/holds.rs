//! Which worker of this process holds each input partition's state. The workers share
//! one sled database, a partition's sessions and offsets in a tree of their own; a worker
//! loads a partition's tree when it is assigned and its store writer writes it after each
//! batch. Kafka may assign a partition to a second worker while the first still holds it:
//! the first is out of the group (it did not poll within `max.poll.interval.ms`, waiting
//! on the broker's acknowledgements) and learns of it only at its next poll, after its
//! acknowledged batch is written. Two workers writing one tree would hand out the same
//! record numbers and fold each other's records.
//!
//! Guarantees: a worker takes a partition only once no other worker of the process holds
//! it; a worker gives a partition back only after the batches of it with its store writer
//! are written (its callers' order: `Worker::release`, `abandon`, `rewind`), and gives
//! back all it holds when it ends, however it ends.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use tracing::warn;

use crate::shutdown::Shutdown;

/// How long a worker waits for a partition before it says so (and again as often).
const SAY_WAITING_EVERY: Duration = Duration::from_secs(10);

/// The partitions held, by worker index; shared by the workers of one run.
#[derive(Debug, Default)]
pub struct PartitionHolds {
    held: Mutex<FxHashMap<i32, usize>>,
    given_back: Condvar,
}

/// Shutdown came while a worker waited for a partition another worker held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoppedWaiting;

impl PartitionHolds {
    /// Takes `partition` for `worker`, waiting while another worker holds it; at once
    /// when none does or `worker` already does.
    pub fn take(
        &self,
        partition: i32,
        worker: usize,
        shutdown: &Shutdown,
    ) -> Result<(), StoppedWaiting> {
        let started = Instant::now();
        let mut said = started;
        let mut held = self.lock();
        loop {
            match held.get(&partition) {
                Some(&holder) if holder != worker => {}
                _ => {
                    held.insert(partition, worker);
                    return Ok(());
                }
            }
            if shutdown.is_triggered() {
                return Err(StoppedWaiting);
            }
            if said.elapsed() >= SAY_WAITING_EVERY {
                said = Instant::now();
                warn!(
                    partition,
                    worker,
                    holder = held[&partition],
                    waited_secs = started.elapsed().as_secs(),
                    "waiting for another worker of this process to let the partition go"
                );
            }
            // Woken by a give-back; the timeout looks at the shutdown.
            held = self
                .given_back
                .wait_timeout(held, Duration::from_millis(100))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Lets `partitions` go, those `worker` holds.
    pub fn give_back(&self, partitions: impl IntoIterator<Item = i32>, worker: usize) {
        let mut held = self.lock();
        for p in partitions {
            if held.get(&p) == Some(&worker) {
                held.remove(&p);
            }
        }
        drop(held);
        self.given_back.notify_all();
    }

    /// Lets go of every partition `worker` holds.
    pub fn give_back_all(&self, worker: usize) {
        self.lock().retain(|_, holder| *holder != worker);
        self.given_back.notify_all();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<i32, usize>> {
        // A worker that panicked holding the lock left the map whole (each change is
        // one insert or remove).
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    impl PartitionHolds {
        fn holder(&self, partition: i32) -> Option<usize> {
            self.lock().get(&partition).copied()
        }
    }

    #[test]
    fn a_partition_is_taken_once_its_holder_gives_it_back() {
        let holds = Arc::new(PartitionHolds::default());
        let shutdown = Shutdown::new();
        holds.take(3, 0, &shutdown).unwrap();
        holds.take(3, 0, &shutdown).unwrap();
        holds.take(4, 1, &shutdown).unwrap();
        let waiter = {
            let (holds, shutdown) = (holds.clone(), shutdown.clone());
            std::thread::spawn(move || holds.take(3, 1, &shutdown))
        };
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !waiter.is_finished(),
            "worker 1 waits while worker 0 holds it"
        );
        assert_eq!(holds.holder(3), Some(0));
        // Another's give-back does not let it go.
        holds.give_back([3], 1);
        std::thread::sleep(Duration::from_millis(200));
        assert!(!waiter.is_finished());
        holds.give_back([3], 0);
        assert_eq!(waiter.join().unwrap(), Ok(()));
        assert_eq!(holds.holder(3), Some(1));
        holds.give_back_all(1);
        assert_eq!((holds.holder(3), holds.holder(4)), (None, None));
    }

    #[test]
    fn a_wait_ends_at_shutdown() {
        let holds = Arc::new(PartitionHolds::default());
        let shutdown = Shutdown::new();
        holds.take(0, 0, &shutdown).unwrap();
        let waiter = {
            let (holds, shutdown) = (holds.clone(), shutdown.clone());
            std::thread::spawn(move || holds.take(0, 1, &shutdown))
        };
        std::thread::sleep(Duration::from_millis(200));
        shutdown.trigger();
        assert_eq!(waiter.join().unwrap(), Err(StoppedWaiting));
        assert_eq!(holds.holder(0), Some(0));
    }
}

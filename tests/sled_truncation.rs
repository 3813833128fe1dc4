//! loopwarden's change to how sled truncates its file (`vendor/sled/LOOPWARDEN.md`),
//! held by a test that fails on the published crate: a file truncation runs while every
//! thread of sled's I/O pool is busy. In sled 0.34.7 it was queued on that pool, behind log writes
//! waiting for the lock that the truncation's waiter held, and never ran.
//!
//! A file of its own: the pool is the process's, and a test beside this one writing a
//! database would share it (and wait while this test holds its threads).

#[cfg(target_os = "linux")]
#[test]
fn a_truncation_runs_while_every_thread_of_the_io_pool_is_busy() {
    assert!(
        sled::loopwarden_truncation_completes_while_the_pool_is_busy(
            std::time::Duration::from_secs(5)
        ),
        "the truncation did not run within 5 s while the pool's threads were busy: it \
         waits for them, as in the published sled, where that deadlocked"
    );
}

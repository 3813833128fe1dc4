//! The C heap: what librdkafka allocates (fetch responses, each fetched record's
//! message, each record it sends), and OpenSSL and glibc's own allocations with it.
//!
//! It is mimalloc, the allocator of the Rust heap: the `mimalloc` crate's `override`
//! feature defines `malloc`, `free` and the rest in the binary, and glibc hands every
//! allocation of the process to a `malloc` defined so (it supports replacing its
//! allocator this way). glibc's own allocator served librdkafka before, from arenas
//! shared by threads under a lock each: a fetched record is allocated by librdkafka's
//! broker thread and freed by the worker that applied it, and a freed record went back
//! to its arena under that arena's lock, with the broker threads allocating from it.
//! mimalloc's heaps are per thread, and a block freed by another thread goes back on a
//! list without a lock. In the pipeline bench's growth phase (two workers, 32
//! partitions, the embedded broker; three alternating pairs on a 2-core VM, 2026-12-05)
//! the pipeline moved 193,000–208,000 events/s against 153,000–177,000 at 10,000 open
//! sessions and 153,000–155,000 against 131,000–144,000 at a million; there the workers
//! spent 5.03–5.09 µs of CPU an event against 5.39–5.68, and librdkafka's threads 2.62–2.70
//! against 3.18–3.84 (docs/DEVELOPMENT.md, issue 32's twenty-ninth look; the
//! twenty-third look's first try, reverted then for the soak's memory).
//!
//! mimalloc keeps a thread's freed memory with that thread until the thread allocates
//! again or ends: freed by a worker, the records a restore fetched would stay resident
//! with the changelog reader's threads, idle until the next restore. So the reader goes
//! once an assignment's restores are done (`changelog::Restorer::release`).
//!
//! Guarantees: one allocator for the whole process, so that a block allocated on either
//! side of the FFI can be freed on the other; memory it freed is given back to the kernel
//! by [`release_freed_memory`] (and by mimalloc's own purging, as for the Rust heap).

use std::ffi::c_void;

// The mimalloc crate's library: its `override` feature makes these the process's
// `malloc` and `free`, and these two are part of its C API whatever the features.
unsafe extern "C" {
    fn mi_collect(force: bool);
    fn mi_is_in_heap_region(p: *const c_void) -> bool;
}

/// Hands free pages back to the kernel, the C heap's (librdkafka's fetched records: a
/// restore's, and the input's after a backlog) with the Rust heap's: in the hour-long
/// soak each restore left 1–3 MB more resident while glibc kept the freed memory (issue
/// 28). mimalloc collects the calling thread's heap only (a block another thread
/// allocated goes back when that thread allocates again or ends), then gives back the
/// pages that are free by then, whichever thread freed them. `thorough` (after a
/// restore) also collects what mimalloc would otherwise keep for reuse a while: with a
/// heap of 333 MB of small blocks, half of them freed, that took 53 ms, and 3 ms without
/// it, so the periodic calls are not thorough (on each worker's thread and each store
/// writer's, every 10 s).
pub fn release_freed_memory(thorough: bool) {
    // SAFETY: mi_collect takes a flag and only returns free memory to the kernel.
    unsafe { mi_collect(thorough) }
}

/// Whether `address`, of a block that `malloc` returned, is in mimalloc's heap: what the
/// tests check the override by.
pub fn serves(address: usize) -> bool {
    // SAFETY: mi_is_in_heap_region only compares the address with its heap's regions; it
    // reads nothing there.
    unsafe { mi_is_in_heap_region(address as *const c_void) }
}

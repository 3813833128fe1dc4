//! `--features heap-stats` (a diagnostic build, never the default): the global allocator
//! counts the Rust heap's live bytes, and `run` logs them every 30 s, so that a soak
//! tells a heap that grows from an allocator that keeps freed memory resident.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

/// mimalloc, counting.
pub struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call goes to mimalloc unchanged; the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

/// Logs the live heap every 30 s, for the life of the process.
pub fn log_every_30_secs() {
    let spawned = std::thread::Builder::new()
        .name("lw-heap-stats".into())
        .spawn(|| loop {
            std::thread::sleep(Duration::from_secs(30));
            let live_bytes = LIVE.load(Ordering::Relaxed);
            tracing::info!(live_bytes, "heap");
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "cannot start the heap statistics thread");
    }
}

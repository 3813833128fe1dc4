//! glibc's malloc as `loopwarden run` tunes it for librdkafka
//! (`loopwarden::bus::kafka::c_heap`): after the tuning a large block is mapped on its own,
//! and so unmapped when freed, even after a larger one was freed, which otherwise raises
//! glibc's threshold past it and leaves such blocks in an arena that keeps their pages.
//!
//! The tuning is for the whole process and cannot be undone, so this binary holds one
//! test, which probes the heap before and after it: the "before" reading shows that the
//! probe can tell the difference.

// 64-bit only: on 32 bits glibc's threshold rises to at most 512 KiB, so the probe below
// cannot see the difference.
#![cfg(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64"))]

/// Whether a block of `bytes` (under 8 MiB) is mapped on its own right after an 8 MiB
/// block was freed. glibc serves a block from free memory at its arena's top before it
/// considers mapping one, and a thread's arena keeps its top: so each call asks for more
/// than the calls before it left there.
fn block_mapped_after_a_larger_one_was_freed(bytes: usize) -> bool {
    // SAFETY: plain malloc and free of blocks this function owns; mallinfo only reads.
    // (`mallinfo`, not `mallinfo2`: glibc has the latter from 2.33 only, and a count of
    // mapped blocks fits its `int`s.)
    unsafe {
        let big = libc::malloc(8 << 20);
        assert!(!big.is_null(), "malloc failed");
        libc::free(big);
        let mapped_before = libc::mallinfo().hblks;
        let block = libc::malloc(bytes);
        assert!(!block.is_null(), "malloc failed");
        let mapped = libc::mallinfo().hblks > mapped_before;
        libc::free(block);
        mapped
    }
}

#[test]
fn the_tuned_heap_maps_large_blocks_whatever_was_freed_before() {
    for name in [
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_ARENA_MAX",
        "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_TOP_PAD_",
        "MALLOC_MMAP_MAX_",
        "GLIBC_TUNABLES",
    ] {
        assert!(
            std::env::var_os(name).is_none(),
            "{name} is set: glibc's own settings change what this test probes, so it needs it unset"
        );
    }
    assert!(
        !block_mapped_after_a_larger_one_was_freed(512 << 10),
        "before the tuning, freeing an 8 MiB block raises glibc's mmap threshold past 512 KiB"
    );

    loopwarden::bus::kafka::c_heap::tune_for_librdkafka();

    assert!(
        block_mapped_after_a_larger_one_was_freed(4 << 20),
        "after the tuning, freeing a large block no longer raises glibc's mmap threshold"
    );
}

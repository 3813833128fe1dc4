//! The C heap is mimalloc (`loopwarden::bus::kafka::c_heap`): librdkafka's allocations,
//! glibc's own and a plain `malloc` are all served by it, blocks allocated by one thread
//! and freed by another (a fetched record: librdkafka's broker thread, then the worker)
//! included, and the heap still serves after a collection.

use loopwarden::bus::kafka::c_heap;

#[test]
fn librdkafka_glibc_and_malloc_allocate_from_mimalloc() {
    // SAFETY: blocks allocated and freed here, each with its own allocator's free; the
    // strings are NUL-terminated.
    unsafe {
        let plain = libc::malloc(100);
        assert!(!plain.is_null(), "malloc failed");
        assert!(c_heap::serves(plain as usize), "malloc is not mimalloc's");
        libc::free(plain);

        // librdkafka allocates with its rd_malloc, which is malloc.
        let kafka = rdkafka::bindings::rd_kafka_mem_malloc(std::ptr::null_mut(), 1000);
        assert!(!kafka.is_null(), "rd_kafka_mem_malloc failed");
        assert!(
            c_heap::serves(kafka as usize),
            "librdkafka's heap is not mimalloc's"
        );
        rdkafka::bindings::rd_kafka_mem_free(std::ptr::null_mut(), kafka);

        // glibc's own allocations (librdkafka duplicates its strings with strdup).
        let copy = libc::strdup(c"a string glibc copies".as_ptr());
        assert!(!copy.is_null(), "strdup failed");
        assert!(
            c_heap::serves(copy as usize),
            "glibc's own allocations are not mimalloc's"
        );
        libc::free(copy.cast());
    }
}

#[test]
fn blocks_of_another_thread_are_mimalloc_s_and_the_heap_serves_after_a_collection() {
    // Blocks as a broker thread allocates them, freed by this thread as a worker frees
    // the records it applied.
    let blocks: Vec<usize> = std::thread::spawn(|| {
        (0..10_000)
            // SAFETY: plain allocations, freed below.
            .map(|i| unsafe { libc::malloc(64 + i % 2000) } as usize)
            .collect()
    })
    .join()
    .unwrap();
    for &b in &blocks {
        assert!(b != 0, "malloc failed");
        assert!(
            c_heap::serves(b),
            "a block of another thread is not mimalloc's"
        );
        // SAFETY: each block allocated above, freed once.
        unsafe { libc::free(b as *mut _) };
    }
    c_heap::release_freed_memory(false);
    c_heap::release_freed_memory(true);
    // The heap still serves after a collection.
    // SAFETY: allocated and freed here.
    unsafe {
        let after = libc::malloc(4096);
        assert!(
            !after.is_null() && c_heap::serves(after as usize),
            "no block after a collection"
        );
        libc::free(after);
    }
}

//! The C heap librdkafka allocates from (glibc's malloc: fetch responses, fetched
//! records, the copy of every record it is given to produce), tuned once at start by
//! `loopwarden run` and by the pipeline bench that measures it, so that it gives back
//! what it freed.
//!
//! Guarantees: only glibc's tuning changes (`mallopt`); a setting the environment makes
//! (glibc's own variables) wins over ours; a setting glibc refuses is logged, never
//! fatal. Elsewhere than glibc it does nothing. Its caller runs it before any Kafka
//! client's threads start (an arena made before keeps what it holds).

/// Tunes glibc's malloc for librdkafka's heap (see the module's docs); call it before
/// any Kafka client starts.
///
/// - **The mmap threshold fixed at glibc's starting 128 KiB.** glibc raises it to the
///   largest block freed so far (up to 32 MiB), after which a fetch response's buffer
///   comes from a thread arena instead of its own mapping, and an arena keeps the pages
///   that small long-lived blocks pin around it: in the hour-long soak (issue 28) three
///   of librdkafka's arenas grew from 1 MB to 7.6 MB resident in 45 minutes, with
///   `malloc_trim` every 10 s, while the Rust heap grew 1 MB. Fixed, large buffers are
///   mapped and unmapped.
/// - **4 arenas** (8 per core by default: each one's free pages are kept apart).
///
/// `MALLOC_MMAP_THRESHOLD_` and `MALLOC_ARENA_MAX` in the environment, glibc's own
/// settings, win over these.
pub fn tune_for_librdkafka() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let keep = |name: &str| std::env::var_os(name).is_some();
        // SAFETY: mallopt takes two integers and changes only the allocator's tuning.
        unsafe {
            if !keep("MALLOC_MMAP_THRESHOLD_")
                && libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) != 1
            {
                tracing::warn!(
                    "cannot fix glibc's mmap threshold: librdkafka's heap may keep what it freed"
                );
            }
            if !keep("MALLOC_ARENA_MAX") && libc::mallopt(libc::M_ARENA_MAX, 4) != 1 {
                tracing::warn!(
                    "cannot bound glibc's arenas: librdkafka's heap may keep what it freed"
                );
            }
        }
    }
}

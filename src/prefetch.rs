//! Hints that ask the core to start loading memory that is about to be read: a cache
//! miss that would stall the path later overlaps with the work before it, and several
//! asked at once overlap with each other (a session's state is a dozen allocations,
//! each a miss of its own when the state has left the cache).
//!
//! Guarantees: a hint reads nothing the program sees and never faults, whatever the
//! address; no result depends on it. On targets other than x86-64 every hint is a no-op.

use std::collections::VecDeque;

/// Asks for the cache line at `p` into every level.
#[inline(always)]
pub fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch reads nothing the program sees and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Every cache line that the `len` bytes at `start` lie on, up to `max_bytes` from the
/// start of the first.
#[inline(always)]
pub fn span(start: *const u8, len: usize, max_bytes: usize) {
    let skew = start as usize % 64;
    let first = start.wrapping_sub(skew);
    for at in (0..(skew + len).min(max_bytes)).step_by(64) {
        line(first.wrapping_add(at));
    }
}

/// Every cache line that `value` lies on.
#[inline(always)]
pub fn value<T>(value: &T) {
    span(
        (value as *const T).cast(),
        std::mem::size_of::<T>(),
        usize::MAX,
    );
}

/// The cache lines of a slice's items, up to `max_bytes`.
#[inline(always)]
pub fn slice<T>(items: &[T], max_bytes: usize) {
    if !items.is_empty() {
        span(
            items.as_ptr().cast(),
            std::mem::size_of_val(items),
            max_bytes,
        );
    }
}

/// The cache lines of a ring's items (both of its parts), up to `max_bytes` each.
#[inline(always)]
pub fn deque<T>(ring: &VecDeque<T>, max_bytes: usize) {
    let (a, b) = ring.as_slices();
    slice(a, max_bytes);
    slice(b, max_bytes);
}

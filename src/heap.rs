//! The heap as the service holds it: mimalloc (the Rust heap and, through its override,
//! the C heap: `bus::kafka::c_heap`) without transparent huge pages, so that resident
//! memory follows the live heap. `loopwarden run` sets it first thing, and
//! so do the pipeline and store benches, which measure the pipeline's code as the service
//! runs it.
//!
//! Guarantees: only the use of huge pages changes, for this process and the children it
//! starts after (the kernel's flag is inherited); `MIMALLOC_ALLOW_THP` in the environment
//! wins (mimalloc's own setting); a refusal is logged, never fatal; elsewhere than Linux
//! it does nothing.

/// Turns transparent huge pages off for this process, unless `MIMALLOC_ALLOW_THP` is set.
///
/// mimalloc asks the kernel for transparent huge pages by default, and a heap spread over
/// 2 MiB pages stays resident page by page: in the soak (issue 28) the first member's
/// RSS rose from 71 MB after 5 minutes to over 100 MB within 40 minutes with huge pages,
/// its heap being about 20 MB, and stayed between 27 and 38 MB without them (20- and
/// 45-minute runs). So the service opts out (`PR_SET_THP_DISABLE`, what
/// `MIMALLOC_ALLOW_THP=0` does). The batch commands (`replay`, `backtest`) keep mimalloc's
/// default: on a 2-core VM huge pages made a replay's user CPU no smaller, but what they
/// do for many threads faulting pages in at once was not measured (docs/DEVELOPMENT.md,
/// issue 32's twenty-eighth look).
pub fn without_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes nothing but
        // this process's use of huge pages.
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if rc != 0 {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "cannot turn transparent huge pages off: resident memory may grow with the heap's spread"
            );
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn the_process_is_left_without_huge_pages_unless_mimalloc_is_told_otherwise() {
        // SAFETY: PR_GET_THP_DISABLE takes no pointer and changes nothing.
        let thp_disabled = || unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(
            thp_disabled(),
            0,
            "huge pages were off before the call (inherited from the parent process): the \
             test cannot tell what the call does"
        );
        super::without_transparent_huge_pages();
        let disabled = thp_disabled();
        let expected = i32::from(std::env::var_os("MIMALLOC_ALLOW_THP").is_none());
        assert_eq!(disabled, expected, "PR_GET_THP_DISABLE after the call");
    }
}

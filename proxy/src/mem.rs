//! Giving memory back after a full sync. A full sync at 100,000 endpoints renders tens of MiB
//! of small strings that are freed right after; glibc keeps freed heap pages mapped (the
//! process's RSS stays at the sync's peak) until asked to trim. This is the one module of the
//! crate with `unsafe`.

/// Returns the heap's free pages to the kernel (glibc `malloc_trim`); a no-op elsewhere.
pub fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: malloc_trim takes no pointers; it walks glibc's own arenas under their locks and
    // releases (madvise) pages that hold no allocation. Safe to call from any thread, any time.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

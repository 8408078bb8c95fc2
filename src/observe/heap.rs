//! Gives the system back the memory glibc keeps after sessions free it.
//!
//! glibc's allocator returns freed memory only from the top of its heap: when 2,000 clients
//! each held a read buffer, a reply channel and a processing future at the same moment, the
//! pages those occupied stay resident after every session gave them back (between the
//! sessions' own live allocations), 3.2 KiB per client of the 5.7 KiB measured by
//! `tests/many_clients.rs`. `malloc_trim(0)` walks every arena and returns each whole free
//! page (glibc 2.8 on). It is called off the runtime's threads, at most once per idle tick,
//! and only after enough sessions released memory or ended since the last call
//! (`TRIM_AFTER`), so a busy proxy whose sessions never go quiet never pays for it.
//!
//! Why this and not another allocator: mimalloc, measured the same way, cost 8.4 KiB per
//! client and a C build step (docs/performance.md, Memory per idle client).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Sessions that gave memory back (idle release) or ended since the last trim. Process-wide,
/// like the allocator it describes: every proxy in the process shares one heap.
static RELEASES: Releases = Releases(AtomicUsize::new(0));

/// A count of releases since the last trim.
struct Releases(AtomicUsize);

impl Releases {
    fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    fn due(&self) -> bool {
        self.0.load(Ordering::Relaxed) >= TRIM_AFTER && self.0.swap(0, Ordering::Relaxed) > 0
    }
}

/// Releases since the last trim that make the next idle tick trim: one session's release is a
/// 16 KiB read buffer at most, not worth a walk of the heap; 32 are half a megabyte.
const TRIM_AFTER: usize = 32;

/// Counts one session's release of its buffers, or its end.
pub(crate) fn released() {
    RELEASES.add();
}

/// Whether enough was released since the last call for a trim to pay; resets the count.
pub(crate) fn trim_due() -> bool {
    RELEASES.due()
}

/// Returns the heap's whole free pages to the system; `true` if any were. Blocks for the walk
/// of every arena (each arena locked in turn), so callers run it on a blocking thread.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(
    unsafe_code,
    reason = "an FFI call to glibc's malloc_trim: no pointers passed, nothing parsed"
)]
pub(crate) fn trim() -> bool {
    // SAFETY: `malloc_trim` takes a size and no pointers; glibc serialises it with every
    // other allocator call through the arenas' own locks (MT-Safe, malloc_trim(3)).
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Elsewhere (musl, macOS) the allocator has no such call; nothing to do.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_is_due_only_after_enough_releases_and_resets_the_count() {
        // A count of its own: sessions of other tests in this process add to the static one.
        let releases = Releases(AtomicUsize::new(0));
        for _ in 0..TRIM_AFTER - 1 {
            releases.add();
        }
        assert!(!releases.due());
        releases.add();
        assert!(releases.due());
        assert!(!releases.due(), "the count starts over after a trim");
    }
}

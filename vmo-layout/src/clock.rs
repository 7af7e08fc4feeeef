//! The one clock both sides use: `CLOCK_MONOTONIC`, in nanoseconds, fenced.
//!
//! The consistency argument (ARCHITECTURE.md, "Why a snapshot is point-in-time") orders clock
//! readings against atomic operations on the region. On x86-64 the vDSO reads the TSC after an
//! `LFENCE` (so the reading cannot move before earlier instructions); the `LFENCE` we add after
//! it keeps later loads from executing before the reading.

/// Current `CLOCK_MONOTONIC` time in nanoseconds.
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    fence_after_clock();
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Current `CLOCK_REALTIME` time in nanoseconds since the Unix epoch.
pub fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: as in `now_ns`.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[inline(always)]
fn fence_after_clock() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: LFENCE has no memory-safety preconditions; SSE2 is part of the x86-64 baseline.
    unsafe {
        core::arch::x86_64::_mm_lfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

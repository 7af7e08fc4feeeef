//! The one clock both sides use for region timestamps (`CLOCK_MONOTONIC_COARSE`, in
//! nanoseconds, see [`now_ns`]), and a precise one for durations.
//!
//! The consistency argument (ARCHITECTURE.md, "Why a snapshot is point-in-time") orders clock
//! readings against atomic operations on the region. The coarse clock is read with plain loads
//! of the vDSO's time data, which x86-64 keeps in order with the surrounding loads and locked
//! instructions; elsewhere a SeqCst fence follows the reading.

/// The region's clock: `CLOCK_MONOTONIC_COARSE`, in nanoseconds.
///
/// Every timestamp in a region (`t_alloc`, `t_free`, the leases, the snapshot time `T`) comes
/// from here, in the target and in the collector. The coarse clock is the kernel's tick-updated
/// time, read from the vDSO without reading the TSC: about 6 ns where `CLOCK_MONOTONIC` costs
/// about 36 (measured on the benchmark machine), and it is taken twice per allocation/free pair.
/// Its resolution is the tick (1–4 ms): records of one tick share a timestamp, which the
/// protocol allows (live intervals are half-open, and the reader waits until the clock has
/// moved past `T`). Monotonic across CPUs and processes.
#[inline]
pub fn now_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC_COARSE)
}

/// `CLOCK_MONOTONIC` in nanoseconds: for measuring durations and naming files, never for
/// region timestamps.
#[inline]
pub fn precise_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

#[inline(always)]
fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clocks are always supported on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
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

/// Keeps later memory accesses after the clock reading. On x86-64 the reading is a few loads
/// (the vDSO's copy of the kernel's time) and x86-64 never lets loads pass earlier loads or a
/// locked instruction, so only the compiler must be kept from moving them; elsewhere, a fence.
#[inline(always)]
fn fence_after_clock() {
    #[cfg(target_arch = "x86_64")]
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Runs `f` with the calling thread's cancellation disabled (`pthread_setcancelstate`), then
/// restores it: for work that calls glibc functions that are cancellation points (`fallocate`,
/// `open`, `read`, `write`…) from inside an allocator call, which POSIX says is no
/// cancellation point. A pending cancel is acted on at the thread's next real one.
pub fn without_cancel<R>(f: impl FnOnce() -> R) -> R {
    // Not in the `libc` crate: glibc's declaration (pthread.h), `PTHREAD_CANCEL_DISABLE` 1.
    extern "C" {
        fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
    }
    const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;
    let mut old = 0;
    // SAFETY: pthread_setcancelstate with a valid state and a writable out-parameter; it is
    // not itself a cancellation point.
    unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
    let r = f();
    // SAFETY: as above, restoring the state saved.
    unsafe { pthread_setcancelstate(old, std::ptr::null_mut()) };
    r
}

//! Small system helpers usable inside `malloc`: anonymous mappings, a spin lock, raw file reads.
//! Nothing here calls the allocator.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};

/// Maps `len` bytes of private, zeroed, lazily committed memory; null on failure.
pub fn map_anon(len: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping has no preconditions; failure is reported as
    // MAP_FAILED, which we turn into null.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p as *mut u8
    }
}

/// Unmaps memory returned by [`map_anon`].
///
/// # Safety
/// `p[..len]` must be a mapping from [`map_anon`] that nothing references any more.
pub unsafe fn unmap(p: *mut u8, len: usize) {
    // SAFETY: per the contract, the range is ours and unused.
    unsafe { libc::munmap(p as *mut libc::c_void, len) };
}

/// A test-and-test-and-set spin lock around a `T`, yielding the CPU after a short spin.
///
/// [`SpinLock::lock`] returns a [`SpinGuard`] that gives access to the `T` and releases the
/// lock when dropped, so no path can forget the release. The lock word is an `AtomicU32`
/// (0 free, 1 held) at offset 0 (`#[repr(C)]`); `SpinLock<()>` is just that word.
///
/// Used only for short, rare critical sections (a shard of the address index, the orphan thread
/// slot, the module table, the shared free-node queue); never held across a call into the
/// allocator. Nothing here allocates.
#[repr(C)]
#[derive(Default)]
pub struct SpinLock<T = ()> {
    word: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through a guard, and a guard exists for one holder of the
// lock at a time, so sharing the lock between threads shares the `T` one thread at a time.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves the `T`.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T> std::fmt::Debug for SpinLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpinLock")
            .field("held", &(self.word.load(Ordering::Relaxed) != 0))
            .finish_non_exhaustive()
    }
}

/// Access to a [`SpinLock`]'s value while the lock is held; releases it when dropped.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct SpinGuard<'a, T = ()> {
    lock: &'a SpinLock<T>,
}

impl<T> std::fmt::Debug for SpinGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpinGuard").finish_non_exhaustive()
    }
}

impl<T> SpinLock<T> {
    /// An unlocked lock around `value`.
    pub const fn new(value: T) -> Self {
        SpinLock {
            word: AtomicU32::new(0),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock (spinning, then yielding, while another thread holds it).
    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        if self
            .word
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
        SpinGuard { lock: self }
    }

    #[cold]
    fn lock_slow(&self) {
        let mut spins = 0u32;
        loop {
            while self.word.load(Ordering::Relaxed) != 0 {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                }
            }
            if self
                .word
                .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    /// Takes the lock if it is free; `None` (and nothing taken) when it is held.
    #[inline]
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        // Not `bool::then_some(SpinGuard { .. })`: its argument is built before the test, and
        // dropping that unused guard after a failed attempt released the holder's lock.
        if self
            .word
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            Some(SpinGuard { lock: self })
        } else {
            None
        }
    }

    /// Takes the lock with no guard, to hold it across `fork` (taken in the prepare handler,
    /// released by [`SpinLock::unlock_after_fork`] in the parent and in the child).
    pub fn lock_for_fork(&self) {
        std::mem::forget(self.lock());
    }

    /// Releases a lock taken by [`SpinLock::lock_for_fork`].
    ///
    /// # Safety
    /// The caller holds the lock through [`SpinLock::lock_for_fork`] (no guard exists).
    pub unsafe fn unlock_after_fork(&self) {
        self.word.store(0, Ordering::Release);
    }

    /// The value, without locking.
    ///
    /// # Safety
    /// No other thread may use the lock while the pointer is used (e.g. a forked child before
    /// it starts threads), and no guard may exist meanwhile.
    pub unsafe fn get_unlocked(&self) -> *mut T {
        self.value.get()
    }
}

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while its holder has the lock, so nobody else
        // reaches the value.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.word.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod spin_tests {
    use super::SpinLock;

    #[test]
    fn guard_releases_on_drop() {
        let l = SpinLock::new(5u32);
        {
            let mut g = l.lock();
            *g += 1;
            assert!(l.try_lock().is_none(), "held while the guard lives");
            // A failed attempt leaves the holder's lock held.
            assert!(l.try_lock().is_none(), "still held after a failed try_lock");
        }
        let g = l.try_lock().expect("free after the guard is dropped");
        assert_eq!(*g, 6);
    }

    #[test]
    fn fork_lock_is_held_until_released() {
        let l = SpinLock::new(());
        l.lock_for_fork();
        assert!(l.try_lock().is_none());
        assert!(l.try_lock().is_none(), "still held after a failed try_lock");
        // SAFETY: taken by lock_for_fork just above.
        unsafe { l.unlock_after_fork() };
        assert!(l.try_lock().is_some());
    }

    #[test]
    fn counts_exactly_across_threads() {
        let l = SpinLock::new(0u64);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        *l.lock() += 1;
                    }
                });
            }
        });
        assert_eq!(*l.lock(), 40_000);
    }

    #[test]
    fn unit_lock_is_one_word() {
        assert_eq!(std::mem::size_of::<SpinLock<()>>(), 4);
    }
}

/// Reads up to `buf.len()` bytes of the file at `path` (NUL-terminated); returns bytes read.
pub fn read_file(path: &[u8], buf: &mut [u8]) -> usize {
    debug_assert_eq!(path.last(), Some(&0));
    // SAFETY: `path` is NUL-terminated; open has no other preconditions.
    let fd = unsafe {
        libc::open(
            path.as_ptr() as *const libc::c_char,
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return 0;
    }
    let mut n = 0;
    while n < buf.len() {
        // SAFETY: the destination range lies within `buf`.
        let r = unsafe {
            libc::read(
                fd,
                buf[n..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - n,
            )
        };
        if r <= 0 {
            break;
        }
        n += r as usize;
    }
    // SAFETY: fd is an open descriptor we own.
    unsafe { libc::close(fd) };
    n
}

/// Device and inode of descriptor 2 when [`note_stderr`] ran (`STDERR_NOTED`: whether it ran,
/// and whether descriptor 2 was open then).
static STDERR_DEV: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static STDERR_INO: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// 0: not noted; 1: noted, open; 2: noted, closed (nothing is ever written).
static STDERR_NOTED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Notes which file descriptor 2 is at start-up (the stderr the user gave the program), so
/// that [`warn`] writes there only: a program that closes stderr and opens a data file as
/// descriptor 2 (a daemon) must not find the shim's warnings in it. The first call counts.
pub fn note_stderr() {
    use std::sync::atomic::Ordering;
    if STDERR_NOTED.load(Ordering::Relaxed) != 0 {
        return;
    }
    // SAFETY: a zeroed stat is valid for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // The system call itself, not glibc's `fstat`: another preloaded library's `fstat`
    // (libfaketime's) may allocate on its first call, which starts the shim's start-up again
    // from here, for ever (helper N, 2: every program crashed under libfaketime).
    // SAFETY: fstat(2) of a descriptor number into a writable `struct stat` (x86-64 and
    // aarch64: glibc's layout is the kernel's); errno is restored.
    let ok = unsafe {
        let saved = *libc::__errno_location();
        let ok = libc::syscall(
            libc::SYS_fstat,
            2 as libc::c_long,
            &mut st as *mut libc::stat,
        ) == 0;
        *libc::__errno_location() = saved;
        ok
    };
    STDERR_DEV.store(st.st_dev, Ordering::Relaxed);
    STDERR_INO.store(st.st_ino, Ordering::Relaxed);
    STDERR_NOTED.store(if ok { 1 } else { 2 }, Ordering::Relaxed);
}

/// Writes a message to stderr with one `write(2)` (no allocation, no stdio), without
/// harming the program: only when descriptor 2 is still the file it was at start-up (see
/// [`note_stderr`]), with SIGPIPE and SIGXFSZ blocked around the write (a pipe whose reader
/// is gone, a file at `ulimit -f`, would otherwise kill the program), a signal the write
/// raised taken back, and errno kept.
pub fn warn(msg: &[u8]) {
    use std::sync::atomic::Ordering;
    note_stderr();
    if STDERR_NOTED.load(Ordering::Relaxed) != 1 {
        return;
    }
    // SAFETY: plain libc calls on valid local buffers; the signal mask is restored, and only
    // a signal that became pending during our own write is taken back.
    unsafe {
        let saved = *libc::__errno_location();
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(2, &mut st) != 0
            || st.st_dev != STDERR_DEV.load(Ordering::Relaxed)
            || st.st_ino != STDERR_INO.load(Ordering::Relaxed)
        {
            *libc::__errno_location() = saved;
            return;
        }
        let mut block: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGPIPE);
        libc::sigaddset(&mut block, libc::SIGXFSZ);
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut before);
        libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len());
        let mut after: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut after);
        for sig in [libc::SIGPIPE, libc::SIGXFSZ] {
            if libc::sigismember(&after, sig) == 1 && libc::sigismember(&before, sig) != 1 {
                let mut one: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut one);
                libc::sigaddset(&mut one, sig);
                let now = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                libc::sigtimedwait(&one, std::ptr::null_mut(), &now);
            }
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        *libc::__errno_location() = saved;
    }
}

/// Formats `v` in decimal into `buf`, returning the digits.
pub fn fmt_u64(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Parses a decimal number (optionally with a K/M/G suffix, powers of 1024).
pub fn parse_size(s: &[u8]) -> Option<u64> {
    let (digits, mult) = match s.last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        b'g' | b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    if digits.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    v.checked_mul(mult)
}

/// Hints the CPU to load the cache line holding `p` (any address: a prefetch never faults).
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unused_unsafe)]
    // SAFETY: PREFETCHT0 (SSE, part of the x86-64 baseline) only hints the cache; it does not
    // access memory architecturally and cannot fault, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch(p as *const i8, core::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size(b"4096"), Some(4096));
        assert_eq!(parse_size(b"512K"), Some(512 << 10));
        assert_eq!(parse_size(b"2m"), Some(2 << 20));
        assert_eq!(parse_size(b"x"), None);
        assert_eq!(parse_size(b""), None);
    }

    #[test]
    fn numbers_format() {
        let mut b = [0u8; 20];
        assert_eq!(fmt_u64(0, &mut b), b"0");
        assert_eq!(fmt_u64(1234567, &mut b), b"1234567");
    }
}

//! The module table: which ELF objects are mapped where, with their build IDs, so the collector
//! can symbolize — also after the process died.
//!
//! Refreshed from `dl_iterate_phdr` at start-up and after every `dlopen`/`dlclose` (never from
//! inside `malloc`: the loader may hold its lock there). Executable file mappings the loader
//! does not report (V8's remapped embedded builtins, a mapped jitdump file) are added from
//! `/proc/self/maps` then, at exit, and at most once a second from the allocation path
//! ([`add_mappings`]: no allocation, no loader lock, the table's lock only tried). Writes
//! happen under a process-local lock and the region's module seqlock.

use crate::sys::SpinLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use vmo_layout::v1::{
    ModuleV1, SegmentV1, MAX_BUILD_ID, MAX_SEGMENTS, MODULE_LOADED, MODULE_PATH_BYTES,
    MODULE_UNLOADED,
};
use vmo_layout::RegionWriter;

static LOCK: SpinLock = SpinLock::new(());
const MAX_TRACKED: usize = 4096;

struct Ctx<'a> {
    table: &'a mut [ModuleV1],
    count: &'a AtomicU64,
    seen: [u64; MAX_TRACKED / 64],
    exe_path: &'a [u8],
}

/// Re-reads the loaded objects into the region's module table: new ones are appended, ones no
/// longer loaded are marked unloaded. `exe_path` names the main executable (whose `dlpi_name`
/// is empty).
pub fn refresh(w: &RegionWriter, exe_path: &[u8]) {
    // Reading /proc/self/maps calls cancellation points with the lock held (helper N, 1).
    vmo_layout::clock::without_cancel(|| refresh_locked(w, exe_path));
}

fn refresh_locked(w: &RegionWriter, exe_path: &[u8]) {
    let _held = LOCK.lock();
    // SAFETY: LOCK makes us the only writer of the module table in this process.
    unsafe {
        w.with_modules(|table, count| {
            let mut ctx = Ctx {
                table,
                count,
                seen: [0; MAX_TRACKED / 64],
                exe_path,
            };
            libc::dl_iterate_phdr(Some(callback), &mut ctx as *mut Ctx as *mut libc::c_void);
            add_unlisted_mappings(&mut ctx);
            let n = (ctx.count.load(Ordering::Relaxed) as usize).min(ctx.table.len());
            for i in 0..n.min(MAX_TRACKED) {
                if ctx.seen[i / 64] & (1 << (i % 64)) == 0 && ctx.table[i].state == MODULE_LOADED {
                    ctx.table[i].state = MODULE_UNLOADED;
                }
            }
        })
    };
}

/// Adds the executable file mappings the module table lacks (see [`add_unlisted_mappings`])
/// without asking the loader: callable from inside `malloc` (no allocation, no loader lock).
/// Does nothing when another thread is updating the table (the lock is only tried).
/// Returns whether it added any.
pub fn add_mappings(w: &RegionWriter) -> bool {
    let Some(_held) = LOCK.try_lock() else {
        return false;
    };
    // SAFETY: LOCK makes us the only writer of the module table in this process.
    unsafe {
        w.with_modules(|table, count| {
            let before = count.load(Ordering::Relaxed);
            let mut ctx = Ctx {
                table,
                count,
                seen: [0; MAX_TRACKED / 64],
                exe_path: &[],
            };
            add_unlisted_mappings(&mut ctx);
            ctx.count.load(Ordering::Relaxed) != before
        })
    }
}

/// Set when a stack walk met code in no loaded object (generated code, or a mapping the
/// loader does not report): the periodic [`maybe_add_mappings`] has something to look for.
static UNKNOWN_CODE: AtomicBool = AtomicBool::new(false);
/// Region-clock time (ns) before which [`maybe_add_mappings`] does not scan again.
static NEXT_SCAN_NS: AtomicU64 = AtomicU64::new(0);
/// Current wait between scans (ns): 1 s, doubled after each scan that found nothing, up to
/// 64 s; back to 1 s when one found something.
static SCAN_EVERY_NS: AtomicU64 = AtomicU64::new(1_000_000_000);

/// Notes that a stack walk met code in no loaded object (cheap: one relaxed store, on the
/// unwinder's cache misses only).
#[inline]
pub fn note_unknown_code() {
    if !UNKNOWN_CODE.load(Ordering::Relaxed) {
        UNKNOWN_CODE.store(true, Ordering::Relaxed);
    }
}

/// From the allocation path, every so many operations: runs [`add_mappings`] when stack
/// walks met unknown code since the last scan and the wait between scans has passed. One
/// clock read when nothing is due.
pub fn maybe_add_mappings(w: &RegionWriter) {
    if !UNKNOWN_CODE.load(Ordering::Relaxed) {
        return;
    }
    let now = vmo_layout::clock::now_ns();
    let next = NEXT_SCAN_NS.load(Ordering::Relaxed);
    if now < next {
        return;
    }
    let every = SCAN_EVERY_NS.load(Ordering::Relaxed);
    if NEXT_SCAN_NS
        .compare_exchange(next, now + every, Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    UNKNOWN_CODE.store(false, Ordering::Relaxed);
    let every = if add_mappings(w) {
        1_000_000_000
    } else {
        (every * 2).min(64_000_000_000)
    };
    SCAN_EVERY_NS.store(every, Ordering::Relaxed);
}

unsafe extern "C" fn callback(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes the context we gave it and a valid info for this call.
    let (ctx, info) = unsafe { (&mut *(data as *mut Ctx), &*info) };
    // SAFETY: dlpi_name is a NUL-terminated string (possibly empty) owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
    let base = info.dlpi_addr;
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers of a loaded object.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    // The loader keeps a path given to dlopen with a slash as it was given ("./libplug.so"):
    // relative to the working directory of that moment, useless to a collector. Such objects
    // are named by the file the kernel says is mapped at their first segment.
    let mut resolved = [0u8; MODULE_PATH_BYTES];
    let path: &[u8] = if name.is_empty() {
        ctx.exe_path
    } else if name.starts_with(b"/") {
        name
    } else {
        match phdrs.iter().find(|p| p.p_type == libc::PT_LOAD) {
            Some(p) => match mapped_path(base.wrapping_add(p.p_vaddr), &mut resolved) {
                0 => name,
                k => &resolved[..k],
            },
            None => name,
        }
    };
    let n = (ctx.count.load(Ordering::Relaxed) as usize).min(ctx.table.len());
    for i in 0..n {
        let m = &ctx.table[i];
        if m.state == MODULE_LOADED
            && m.base == base
            && &m.path[..(m.path_len as usize).min(MODULE_PATH_BYTES)] == path
        {
            if i < MAX_TRACKED {
                ctx.seen[i / 64] |= 1 << (i % 64);
            }
            return 0;
        }
    }
    if n >= ctx.table.len() {
        return 0;
    }
    let m = &mut ctx.table[n];
    m.base = base;
    let plen = path.len().min(MODULE_PATH_BYTES);
    m.path[..plen].copy_from_slice(&path[..plen]);
    m.path[plen..].fill(0);
    m.path_len = plen as u16;
    m.segment_count = 0;
    m.build_id_len = 0;
    for ph in phdrs {
        if ph.p_type == libc::PT_LOAD && (m.segment_count as usize) < MAX_SEGMENTS {
            m.segments[m.segment_count as usize] = SegmentV1 {
                vaddr: ph.p_vaddr,
                memsz: ph.p_memsz,
                offset_flags: (ph.p_offset & ((1 << 56) - 1)) | ((ph.p_flags as u64) << 56),
            };
            m.segment_count += 1;
        } else if ph.p_type == libc::PT_NOTE && m.build_id_len == 0 {
            // SAFETY: a PT_NOTE segment of a loaded object is mapped at base + p_vaddr.
            let notes = unsafe {
                std::slice::from_raw_parts((base + ph.p_vaddr) as *const u8, ph.p_memsz as usize)
            };
            if let Some(id) = find_build_id(notes) {
                let k = id.len().min(MAX_BUILD_ID);
                m.build_id[..k].copy_from_slice(&id[..k]);
                m.build_id_len = k as u8;
            }
        }
    }
    m.state = MODULE_LOADED;
    if n < MAX_TRACKED {
        ctx.seen[n / 64] |= 1 << (n % 64);
    }
    ctx.count.store(n as u64 + 1, Ordering::Relaxed);
    0
}

/// Writes into `out` the path of the file mapped at `addr`, as `/proc/self/maps` shows it
/// (absolute, symbolic links resolved); returns its length, 0 when no file is mapped there or
/// the path does not fit. Reads with raw system calls: no allocation. The caller holds
/// [`LOCK`] (see [`for_each_maps_line`]).
fn mapped_path(addr: u64, out: &mut [u8; MODULE_PATH_BYTES]) -> usize {
    let mut found = 0;
    for_each_maps_line(|line| {
        found = maps_line_path(line, addr, out);
        found > 0
    });
    found
}

/// Buffer of [`for_each_maps_line`]: static rather than on the stack, which may be a small
/// coroutine stack when the scan runs from inside `malloc`. Used only under [`LOCK`].
struct MapsBuf(std::cell::UnsafeCell<[u8; 8192]>);
// SAFETY: only used by for_each_maps_line, whose callers hold LOCK.
unsafe impl Sync for MapsBuf {}
static MAPS_BUF: MapsBuf = MapsBuf(std::cell::UnsafeCell::new([0; 8192]));

/// Calls `f` with each line of `/proc/self/maps` (without its newline) until it returns true.
/// Lines longer than the 8 KiB buffer (a path near `PATH_MAX`) are skipped. Reads with raw
/// system calls into a static buffer: no allocation, little stack; keeps errno. False when the
/// file cannot be opened. The caller must hold [`LOCK`] (the buffer is shared).
fn for_each_maps_line(f: impl FnMut(&[u8]) -> bool) -> bool {
    // SAFETY: errno is thread-local; read and restored around the system calls.
    let saved = unsafe { *libc::__errno_location() };
    // SAFETY: the caller holds LOCK, so no other thread uses the buffer, and this function
    // does not call itself.
    let r = maps_lines(unsafe { &mut *MAPS_BUF.0.get() }, f);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
    r
}

fn maps_lines(buf: &mut [u8; 8192], mut f: impl FnMut(&[u8]) -> bool) -> bool {
    // SAFETY: a NUL-terminated path; open has no other preconditions.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return false;
    }
    let (mut len, mut done, mut skipping) = (0usize, false, false);
    loop {
        // SAFETY: the destination range lies within `buf`.
        let r = unsafe {
            libc::read(
                fd,
                buf[len..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - len,
            )
        };
        let eof = r <= 0;
        if !eof {
            len += r as usize;
        }
        let mut start = 0;
        while let Some(nl) = buf[start..len].iter().position(|&c| c == b'\n') {
            if !skipping {
                done = f(&buf[start..start + nl]);
            }
            skipping = false;
            start += nl + 1;
            if done {
                break;
            }
        }
        if done {
            break;
        }
        if eof {
            if start < len && !skipping {
                f(&buf[start..len]);
            }
            break;
        }
        buf.copy_within(start..len, 0);
        len -= start;
        if len == buf.len() {
            // A line longer than the buffer: not one we can store.
            len = 0;
            skipping = true;
        }
    }
    // SAFETY: fd is an open descriptor we own.
    unsafe { libc::close(fd) };
    true
}

/// The bounds of the calling thread's stack from `/proc/self/maps`, for when glibc's
/// `pthread_getattr_np` fails (a seccomp filter refusing its `sched_getaffinity`): `[lo, tcb)`
/// where `lo` starts the readable mapping holding both `sp` and `tcb`, the thread's descriptor
/// (`pthread_self()`), which glibc keeps at the top of the thread's stack block, above every
/// frame — so the mapping found is the thread's own stack, which lives as long as the thread,
/// not a coroutine's that may be unmapped. `None` when no such mapping (or the file cannot
/// be read). No allocation; keeps errno.
pub fn thread_stack_from_maps(sp: usize, tcb: usize) -> Option<(usize, usize)> {
    if sp >= tcb {
        return None;
    }
    let _held = LOCK.lock();
    let mut found = None;
    for_each_maps_line(|line| {
        let Some((lo, hi, _, _, _)) = parse_maps_line(line) else {
            return false;
        };
        let readable = line
            .split(|&c| c == b' ')
            .nth(1)
            .is_some_and(|p| p.first() == Some(&b'r'));
        if (lo as usize) <= sp && sp < hi as usize {
            if readable && tcb < hi as usize {
                found = Some((lo as usize, tcb));
            }
            return true;
        }
        false
    });
    found
}

/// One line of `/proc/self/maps`, split: `(lo, hi, executable, file offset, path)`; `None`
/// for a line that does not parse.
fn parse_maps_line(line: &[u8]) -> Option<(u64, u64, bool, u64, &[u8])> {
    let hex = |s: &[u8]| -> Option<u64> {
        let mut v: u64 = 0;
        for &c in s {
            let d = (c as char).to_digit(16)? as u64;
            v = v.checked_mul(16)?.checked_add(d)?;
        }
        (!s.is_empty()).then_some(v)
    };
    let mut fields = line.split(|&c| c == b' ').filter(|f| !f.is_empty());
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = hex(fields.next()?)?;
    let dash = range.iter().position(|&c| c == b'-')?;
    let (lo, hi) = (hex(&range[..dash])?, hex(&range[dash + 1..])?);
    let path = match line.iter().position(|&c| c == b'/') {
        Some(i) => &line[i..],
        None => &[][..],
    };
    Some((lo, hi, perms.get(2) == Some(&b'x'), offset, path))
}

/// Adds to the module table the executable file mappings `dl_iterate_phdr` does not report:
/// a second mapping of a loaded object's file (V8 maps the part of its executable holding
/// the embedded builtins again, elsewhere, and runs them there), named by that object's file
/// with the load bias that puts the mapping's file offset at the virtual address the
/// object's segments give it; and a mapped jitdump file (`jit-PID.dump`, which JITs map so
/// that `perf` finds it), so that the collector finds it after the process is gone. Entries
/// already in the table and still mapped are marked seen.
fn add_unlisted_mappings(ctx: &mut Ctx) {
    for_each_maps_line(|line| {
        let Some((lo, hi, exec, offset, path)) = parse_maps_line(line) else {
            return false;
        };
        if !exec || path.is_empty() || hi <= lo || path.ends_with(b" (deleted)") {
            return false;
        }
        if path.len() > MODULE_PATH_BYTES {
            return false;
        }
        let n = (ctx.count.load(Ordering::Relaxed) as usize).min(ctx.table.len());
        // One pass over the entries of this file: one that already describes this mapping
        // (the object itself, as dl_iterate_phdr reported it, or an earlier scan's entry),
        // else the object's segment holding `offset`. Entries of other files are skipped on
        // their path length or first bytes.
        let mut found: Option<(usize, u64, u64)> = None;
        for i in 0..n {
            let m = &ctx.table[i];
            if m.state != MODULE_LOADED
                || m.path_len as usize != path.len()
                || m.path[..path.len()] != *path
            {
                continue;
            }
            if contains(m, lo) {
                if i < MAX_TRACKED {
                    ctx.seen[i / 64] |= 1 << (i % 64);
                }
                return false;
            }
            if found.is_none() {
                for s in &m.segments[..(m.segment_count as usize).min(MAX_SEGMENTS)] {
                    let off = s.offset_flags & ((1 << 56) - 1);
                    if offset >= off && offset < off.saturating_add(s.memsz) {
                        found = Some((i, s.vaddr + (offset - off), s.offset_flags >> 56));
                        break;
                    }
                }
            }
        }
        if n >= ctx.table.len() {
            return false;
        }
        let file_name = &path[path.iter().rposition(|&c| c == b'/').map_or(0, |i| i + 1)..];
        let is_jitdump = file_name.starts_with(b"jit-") && file_name.ends_with(b".dump");
        let (vaddr, flags, build_id) = match found {
            Some((i, vaddr, flags)) => (vaddr, flags, Some(i)),
            None if is_jitdump => (offset, libc::PF_R as u64 | libc::PF_X as u64, None),
            None => return false,
        };
        let mut id = [0u8; MAX_BUILD_ID];
        let mut id_len = 0;
        if let Some(i) = build_id {
            id_len = (ctx.table[i].build_id_len as usize).min(MAX_BUILD_ID);
            id[..id_len].copy_from_slice(&ctx.table[i].build_id[..id_len]);
        }
        let m = &mut ctx.table[n];
        m.base = lo.wrapping_sub(vaddr);
        m.path[..path.len()].copy_from_slice(path);
        m.path[path.len()..].fill(0);
        m.path_len = path.len() as u16;
        m.build_id = id;
        m.build_id_len = id_len as u8;
        m.segments[0] = SegmentV1 {
            vaddr,
            memsz: hi - lo,
            offset_flags: (offset & ((1 << 56) - 1)) | (flags << 56),
        };
        m.segment_count = 1;
        m.state = MODULE_LOADED;
        if n < MAX_TRACKED {
            ctx.seen[n / 64] |= 1 << (n % 64);
        }
        ctx.count.store(n as u64 + 1, Ordering::Relaxed);
        false
    });
}

/// Whether a segment of module `m` holds runtime address `addr`.
fn contains(m: &ModuleV1, addr: u64) -> bool {
    m.segments[..(m.segment_count as usize).min(MAX_SEGMENTS)]
        .iter()
        .any(|s| {
            let start = m.base.wrapping_add(s.vaddr);
            addr >= start && addr < start.wrapping_add(s.memsz)
        })
}

/// If the `/proc/PID/maps` line `line` ("lo-hi perms offset dev inode path") covers `addr` and
/// names an absolute path that fits, copies the path to `out` and returns its length; else 0.
fn maps_line_path(line: &[u8], addr: u64, out: &mut [u8; MODULE_PATH_BYTES]) -> usize {
    let Some((lo, hi, _, _, path)) = parse_maps_line(line) else {
        return 0;
    };
    if addr < lo || addr >= hi || path.is_empty() || path.len() > out.len() {
        return 0;
    }
    out[..path.len()].copy_from_slice(path);
    path.len()
}

/// Finds the NT_GNU_BUILD_ID descriptor in an ELF note segment.
pub fn find_build_id(mut notes: &[u8]) -> Option<&[u8]> {
    let align4 = |x: usize| (x + 3) & !3;
    while notes.len() >= 12 {
        let word =
            |i: usize| u32::from_ne_bytes([notes[i], notes[i + 1], notes[i + 2], notes[i + 3]]);
        let namesz = word(0) as usize;
        let descsz = word(4) as usize;
        let kind = word(8);
        let name_end = 12usize.checked_add(namesz)?;
        let desc_start = 12usize.checked_add(align4(namesz))?;
        let desc_end = desc_start.checked_add(descsz)?;
        if desc_end > notes.len() || name_end > notes.len() {
            return None;
        }
        if kind == 3 && &notes[12..name_end] == b"GNU\0" {
            return Some(&notes[desc_start..desc_end]);
        }
        notes = &notes[align4(desc_end).min(notes.len())..];
    }
    None
}

/// Takes the module-table lock across `fork` (see `state::fork_prepare`): a fork racing a
/// refresh would leave the child's copy locked forever.
pub(crate) fn lock_for_fork() {
    LOCK.lock_for_fork();
}

/// Releases what [`lock_for_fork`] took (in the parent, and in the child).
///
/// # Safety
/// [`lock_for_fork`] took the lock (no guard exists).
pub(crate) unsafe fn unlock_after_fork() {
    // SAFETY: per the contract.
    unsafe { LOCK.unlock_after_fork() };
}

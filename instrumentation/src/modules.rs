//! The module table: which ELF objects are mapped where, with their build IDs, so the collector
//! can symbolize — also after the process died.
//!
//! Refreshed from `dl_iterate_phdr` at start-up and after every `dlopen`/`dlclose` (never from
//! inside `malloc`: the loader may hold its lock there). Writes happen under a process-local
//! lock and the region's module seqlock.

use crate::sys::SpinLock;
use std::sync::atomic::{AtomicU64, Ordering};
use vmo_layout::v1::{
    ModuleV1, SegmentV1, MAX_BUILD_ID, MAX_SEGMENTS, MODULE_LOADED, MODULE_PATH_BYTES,
    MODULE_UNLOADED,
};
use vmo_layout::RegionWriter;

static LOCK: SpinLock = SpinLock::new();
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
    LOCK.lock();
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
            let n = (ctx.count.load(Ordering::Relaxed) as usize).min(ctx.table.len());
            for i in 0..n.min(MAX_TRACKED) {
                if ctx.seen[i / 64] & (1 << (i % 64)) == 0 && ctx.table[i].state == MODULE_LOADED {
                    ctx.table[i].state = MODULE_UNLOADED;
                }
            }
        })
    };
    LOCK.unlock();
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
/// the path does not fit. Reads with raw system calls into a stack buffer: no allocation.
fn mapped_path(addr: u64, out: &mut [u8; MODULE_PATH_BYTES]) -> usize {
    // SAFETY: a NUL-terminated path; open has no other preconditions.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return 0;
    }
    let mut buf = [0u8; 8192];
    let (mut len, mut found, mut skipping) = (0usize, 0usize, false);
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
                found = maps_line_path(&buf[start..start + nl], addr, out);
            }
            skipping = false;
            start += nl + 1;
            if found > 0 {
                break;
            }
        }
        if found > 0 {
            break;
        }
        if eof {
            if start < len && !skipping {
                found = maps_line_path(&buf[start..len], addr, out);
            }
            break;
        }
        buf.copy_within(start..len, 0);
        len -= start;
        if len == buf.len() {
            // A line longer than the buffer (a path near PATH_MAX): not one we can store.
            len = 0;
            skipping = true;
        }
    }
    // SAFETY: fd is an open descriptor we own.
    unsafe { libc::close(fd) };
    found
}

/// If the `/proc/PID/maps` line `line` ("lo-hi perms offset dev inode path") covers `addr` and
/// names an absolute path that fits, copies the path to `out` and returns its length; else 0.
fn maps_line_path(line: &[u8], addr: u64, out: &mut [u8; MODULE_PATH_BYTES]) -> usize {
    let hex = |s: &[u8]| -> Option<u64> {
        let mut v: u64 = 0;
        for &c in s {
            let d = (c as char).to_digit(16)? as u64;
            v = v.checked_mul(16)?.checked_add(d)?;
        }
        (!s.is_empty()).then_some(v)
    };
    let Some(dash) = line.iter().position(|&c| c == b'-') else {
        return 0;
    };
    let Some(sp) = line.iter().position(|&c| c == b' ') else {
        return 0;
    };
    let (Some(lo), Some(hi)) = (
        hex(&line[..dash]),
        hex(line.get(dash + 1..sp).unwrap_or(&[])),
    ) else {
        return 0;
    };
    if addr < lo || addr >= hi {
        return 0;
    }
    let Some(slash) = line.iter().position(|&c| c == b'/') else {
        return 0;
    };
    let path = &line[slash..];
    if path.len() > out.len() {
        return 0;
    }
    out[..path.len()].copy_from_slice(path);
    path.len()
}

/// Finds the NT_GNU_BUILD_ID descriptor in an ELF note segment.
pub fn find_build_id(mut notes: &[u8]) -> Option<&[u8]> {
    let align4 = |x: usize| (x + 3) & !3;
    while notes.len() >= 12 {
        let namesz = u32::from_ne_bytes(notes[0..4].try_into().unwrap()) as usize;
        let descsz = u32::from_ne_bytes(notes[4..8].try_into().unwrap()) as usize;
        let kind = u32::from_ne_bytes(notes[8..12].try_into().unwrap());
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
    LOCK.lock();
}

/// Releases what [`lock_for_fork`] took (in the parent, and in the child).
pub(crate) fn unlock_after_fork() {
    LOCK.unlock();
}

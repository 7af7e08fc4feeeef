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
    let path: &[u8] = if name.is_empty() { ctx.exe_path } else { name };
    let base = info.dlpi_addr;
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
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers of a loaded object.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
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

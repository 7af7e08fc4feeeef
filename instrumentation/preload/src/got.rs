//! Rebinding the allocation functions of libraries opened with `RTLD_DEEPBIND`.
//!
//! `dlopen(path, RTLD_DEEPBIND)` puts the library's own lookup scope (itself and its
//! dependencies, libc among them) ahead of the global one, so its references to `malloc`,
//! `free`, … bind to glibc's definitions instead of ours: blocks it frees would stay "live" in
//! the profile, blocks it allocates would be missing. After such a `dlopen` every loaded
//! object's GOT slots (`R_X86_64_JUMP_SLOT` and `R_X86_64_GLOB_DAT` relocations) for those
//! functions that hold glibc's own definition are pointed at ours, as heaptrack's injection
//! does. Slots bound anywhere else (another allocator, our functions already) are left alone.
//!
//! Runs in the `dlopen` hook, where the loader lock is not held and allocating is allowed.
//! Sources: the ELF gABI (dynamic section, `Elf64_Rela`, `Elf64_Sym`) and the x86-64 psABI
//! relocation types.

use libc::{c_char, c_int, c_void, size_t};

/// One function to rebind: its name, glibc's definition, ours.
#[derive(Debug, Clone, Copy)]
pub struct Rebind {
    /// Symbol name.
    pub name: &'static [u8],
    /// glibc's definition (the value a slot bound to glibc holds).
    pub libc: usize,
    /// Our definition.
    pub ours: usize,
}

/// `Elf64_Dyn` (gABI): a tag and a value (the `libc` crate does not define it).
#[repr(C)]
struct Elf64Dyn {
    d_tag: i64,
    d_un: u64,
}

const R_X86_64_GLOB_DAT: u32 = 6;
const R_X86_64_JUMP_SLOT: u32 = 7;

struct Ctx<'a> {
    table: &'a [Rebind],
    /// Load bias of libheapdump.so itself (skipped).
    own_base: usize,
    rebound: usize,
    /// Attached (`heapdump attach`): libc's own slots are rebound too (when preloaded they
    /// are bound to ours already), and every slot changed is kept in [`SAVED`] for the detach.
    attach: bool,
    /// Per entry of `table` (attached only): the name's first definition in the global scope
    /// is glibc's, so a slot not yet bound (lazy binding: it still points at its object's PLT)
    /// would bind to glibc's at its first call — and is rebound to ours now instead. Without
    /// this, a function the program first called after the attach was never recorded.
    lazy_to_libc: [bool; MAX_TABLE],
    /// The load range of the object being rebound (see `callback`).
    object: (usize, usize),
    /// [`bind_to_itself`]: only the object loaded at this bias is rebound, every slot of a
    /// listed name whatever it holds (`Rebind::libc` unused).
    only: Option<usize>,
}

/// Most entries of a rebinding table.
const MAX_TABLE: usize = 32;

/// A GOT slot changed at attach: where, what it held, its object's RELRO range.
#[derive(Debug, Clone, Copy)]
struct Saved {
    slot: usize,
    old: usize,
    ours: usize,
    relro: (usize, usize),
}

/// Most slots kept for the detach (about 4 per object that calls the malloc family).
const MAX_SAVED: usize = 16384;

/// The slots changed since the attach, restored by [`restore_all`]. Taken only at attach,
/// `dlopen`, `dlclose` and detach: never on the allocation path.
static SAVED: std::sync::Mutex<([Saved; MAX_SAVED], usize)> = std::sync::Mutex::new((
    [Saved {
        slot: 0,
        old: 0,
        ours: 0,
        relro: (0, 0),
    }; MAX_SAVED],
    0,
));

/// Points every loaded object's GOT slots that hold one of `table`'s glibc definitions at our
/// definition instead. Skips `libheapdump.so`, libc and the dynamic loader. Returns how many
/// slots were changed.
pub fn rebind_all(table: &[Rebind]) -> usize {
    rebind(table, false)
}

/// As [`rebind_all`] after `heapdump attach`: libc's own slots too, and every slot changed is
/// kept for [`restore_all`]. Returns how many slots were changed.
pub fn rebind_attached(table: &[Rebind]) -> usize {
    rebind(table, true)
}

/// Puts back what [`rebind_attached`] changed, in every slot that still holds our function
/// (an object unloaded since is skipped: its slot is no longer mapped, or no longer ours).
/// Returns how many slots were restored.
///
/// Errors: `Busy` when another thread holds the table (it is stopped inside a `dlopen` hook's
/// rebinding): nothing was restored; try again.
pub fn restore_all() -> Result<usize, Busy> {
    let mut saved = match SAVED.try_lock() {
        Ok(g) => g,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return Err(Busy),
    };
    let n = saved.1;
    let mut restored = 0;
    for s in saved.0[..n].iter().copied() {
        if !slot_mapped(s.slot) {
            continue;
        }
        let slot = s.slot as *mut usize;
        // SAFETY: a GOT word of a still-mapped object (checked just above), aligned.
        if unsafe { slot.read_volatile() } == s.ours {
            // SAFETY: as above; see write_slot.
            unsafe { write_slot(slot, s.old, s.relro) };
            restored += 1;
        }
    }
    saved.1 = 0;
    Ok(restored)
}

/// [`restore_all`] could not take the table of changed slots.
#[derive(Debug, Clone, Copy)]
pub struct Busy;

/// Whether the word at `a` belongs to a loaded object's writable-or-RELRO data, by asking the
/// loader which object holds it.
fn slot_mapped(a: usize) -> bool {
    let mut info: libc::Dl_info = unsafe_zeroed();
    // SAFETY: dladdr only looks the address up in the loader's list.
    unsafe { libc::dladdr(a as *const c_void, &mut info) != 0 }
}

fn rebind(table: &[Rebind], attach: bool) -> usize {
    let mut info: libc::Dl_info = unsafe_zeroed();
    // SAFETY: dladdr fills `info` for an address inside this library.
    unsafe { libc::dladdr(rebind_all as *const () as *const c_void, &mut info) };
    let mut lazy_to_libc = [false; MAX_TABLE];
    if attach {
        for (ok, rb) in lazy_to_libc.iter_mut().zip(table) {
            let mut name = [0u8; 64];
            if rb.name.len() < name.len() {
                name[..rb.name.len()].copy_from_slice(rb.name);
                // SAFETY: a NUL-terminated name; RTLD_DEFAULT looks in the global scope.
                let first =
                    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr() as *const c_char) };
                *ok = first as usize == rb.libc;
            }
        }
    }
    let mut ctx = Ctx {
        table,
        own_base: info.dli_fbase as usize,
        rebound: 0,
        attach,
        lazy_to_libc,
        object: (0, 0),
        only: None,
    };
    // SAFETY: the callback has the right signature and receives our context.
    unsafe { libc::dl_iterate_phdr(Some(callback), &mut ctx as *mut Ctx as *mut c_void) };
    ctx.rebound
}

/// Points the GOT slots of the object loaded at bias `base` for the names of `table` at that
/// object's own definitions (`Rebind::ours`), as they bind without the shim.
///
/// Why: another allocator linked into a program (jemalloc, by `-ljemalloc`) comes before libc
/// in the lookup order, so its own calls through its PLT — jemalloc's `operator delete` is a
/// jump to `free@plt` — reach its own `free`. Preloaded, the shim comes first and got
/// jemalloc's blocks, which it gave to glibc: "free(): invalid pointer", the program aborted
/// before `main` (helper T, 1). The program's calls still reach the shim (its `malloc` is
/// glibc's under the shim, as for a preloaded allocator behind it).
pub fn bind_to_itself(base: usize, table: &[Rebind]) -> usize {
    let mut info: libc::Dl_info = unsafe_zeroed();
    // SAFETY: dladdr fills `info` for an address inside this library.
    unsafe { libc::dladdr(rebind_all as *const () as *const c_void, &mut info) };
    let mut ctx = Ctx {
        table,
        own_base: info.dli_fbase as usize,
        rebound: 0,
        attach: false,
        lazy_to_libc: [false; MAX_TABLE],
        object: (0, 0),
        only: Some(base),
    };
    // SAFETY: the callback has the right signature and receives our context.
    unsafe { libc::dl_iterate_phdr(Some(callback), &mut ctx as *mut Ctx as *mut c_void) };
    ctx.rebound
}

fn unsafe_zeroed<T>() -> T {
    // SAFETY: only used for plain C structs (Dl_info) for which all-zero is valid.
    unsafe { std::mem::zeroed() }
}

unsafe extern "C" fn callback(
    info: *mut libc::dl_phdr_info,
    _size: size_t,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes our context and a valid info for this call.
    let (ctx, info) = unsafe { (&mut *(data as *mut Ctx), &*info) };
    let base = info.dlpi_addr as usize;
    // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
    let file = name.rsplit(|b| *b == b'/').next().unwrap_or(name);
    if ctx.only.is_some_and(|only| only != base) {
        return 0;
    }
    if (base == ctx.own_base && base != 0)
        || (file.starts_with(b"libc.so") && !ctx.attach)
        || file.starts_with(b"ld-linux")
        || file.starts_with(b"linux-vdso")
    {
        return 0;
    }
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers of a loaded object.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let mut dynamic = 0usize;
    let mut relro = (0usize, 0usize);
    ctx.object = (usize::MAX, 0);
    for ph in phdrs {
        match ph.p_type {
            libc::PT_LOAD => {
                let lo = base + ph.p_vaddr as usize;
                ctx.object = (
                    ctx.object.0.min(lo),
                    ctx.object.1.max(lo + ph.p_memsz as usize),
                );
            }
            libc::PT_DYNAMIC => dynamic = base + ph.p_vaddr as usize,
            libc::PT_GNU_RELRO => {
                relro = (
                    base + ph.p_vaddr as usize,
                    base + (ph.p_vaddr + ph.p_memsz) as usize,
                )
            }
            _ => {}
        }
    }
    if dynamic == 0 {
        return 0;
    }
    // SAFETY: PT_DYNAMIC of a loaded object: an array of Elf64_Dyn ended by DT_NULL.
    unsafe { rebind_object(ctx, base, dynamic as *const Elf64Dyn, relro) };
    0
}

/// # Safety
/// `dynamic` is the mapped dynamic section of a loaded object whose load bias is `base`.
unsafe fn rebind_object(
    ctx: &mut Ctx,
    base: usize,
    dynamic: *const Elf64Dyn,
    relro: (usize, usize),
) {
    let (mut symtab, mut strtab, mut strsz) = (0usize, 0usize, 0usize);
    let mut tables = [(0usize, 0usize); 2]; // (DT_JMPREL, DT_PLTRELSZ), (DT_RELA, DT_RELASZ)
    let mut relaent = std::mem::size_of::<libc::Elf64_Rela>();
    // The loader relocates most address entries in place; an unrelocated one is an offset.
    let addr = |v: u64| -> usize {
        let v = v as usize;
        if v < base {
            base + v
        } else {
            v
        }
    };
    let mut d = dynamic;
    for _ in 0..4096 {
        // SAFETY: within the dynamic array, which ends with DT_NULL.
        let e = unsafe { &*d };
        let v = e.d_un;
        match e.d_tag {
            0 => break, // DT_NULL
            5 => strtab = addr(v),
            6 => symtab = addr(v),
            10 => strsz = v as usize,
            23 => tables[0].0 = addr(v),        // DT_JMPREL
            2 => tables[0].1 = v as usize,      // DT_PLTRELSZ
            7 => tables[1].0 = addr(v),         // DT_RELA
            8 => tables[1].1 = v as usize,      // DT_RELASZ
            9 => relaent = (v as usize).max(1), // DT_RELAENT
            _ => {}
        }
        // SAFETY: the next entry exists (DT_NULL not reached yet).
        d = unsafe { d.add(1) };
    }
    if symtab == 0 || strtab == 0 {
        return;
    }
    for (start, size) in tables {
        if start == 0 {
            continue;
        }
        let mut off = 0;
        while off + std::mem::size_of::<libc::Elf64_Rela>() <= size {
            // SAFETY: inside the relocation table of a loaded object.
            let r = unsafe { &*((start + off) as *const libc::Elf64_Rela) };
            off += relaent;
            let ty = (r.r_info & 0xffff_ffff) as u32;
            if ty != R_X86_64_JUMP_SLOT && ty != R_X86_64_GLOB_DAT {
                continue;
            }
            let sym = (r.r_info >> 32) as usize;
            // SAFETY: the symbol index of a relocation is inside the object's symbol table.
            let s = unsafe { &*((symtab as *const libc::Elf64_Sym).add(sym)) };
            if s.st_name as usize >= strsz {
                continue;
            }
            let at = (strtab + s.st_name as usize) as *const c_char;
            // SAFETY: st_name is an offset into the NUL-terminated string table.
            let name = unsafe { std::ffi::CStr::from_ptr(at) }.to_bytes();
            let Some(k) = ctx.table.iter().position(|rb| rb.name == name) else {
                continue;
            };
            let rb = &ctx.table[k];
            let slot = (base + r.r_offset as usize) as *mut usize;
            // SAFETY: r_offset of a GOT relocation names a mapped, aligned word of the object.
            let old = unsafe { slot.read_volatile() };
            let lazy = ctx.attach
                && ty == R_X86_64_JUMP_SLOT
                && ctx.lazy_to_libc.get(k).copied().unwrap_or(false)
                && old >= ctx.object.0
                && old < ctx.object.1;
            if ctx.only.is_some() {
                if old == rb.ours {
                    continue;
                }
            } else if old != rb.libc && !lazy {
                continue;
            }
            if ctx.attach {
                let mut saved = SAVED.lock().unwrap_or_else(|e| e.into_inner());
                let n = saved.1;
                if n == MAX_SAVED {
                    continue; // could not be restored at the detach: left as it is
                }
                saved.0[n] = Saved {
                    slot: slot as usize,
                    old,
                    ours: rb.ours,
                    relro,
                };
                saved.1 = n + 1;
            }
            // SAFETY: as above; the slot's page is made writable first (it may lie in the
            // read-only-after-relocation range), and made read-only again if it does.
            unsafe { write_slot(slot, rb.ours, relro) };
            ctx.rebound += 1;
        }
    }
}

/// # Safety
/// `slot` is a mapped, aligned GOT word of a loaded object; `relro` its object's RELRO range.
unsafe fn write_slot(slot: *mut usize, value: usize, relro: (usize, usize)) {
    let page = slot as usize & !4095;
    let in_relro = (slot as usize) >= relro.0 && (slot as usize) < relro.1;
    // SAFETY: the page holds the GOT of a loaded object: mapped, ours to change.
    unsafe {
        libc::mprotect(
            page as *mut c_void,
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
        );
        slot.write_volatile(value);
        if in_relro {
            libc::mprotect(page as *mut c_void, 4096, libc::PROT_READ);
        }
    }
}

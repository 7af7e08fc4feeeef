//! Symbolization of return addresses with blazesym, from the module table the region recorded
//! (so it works after the process is gone, as long as the files are still on disk).
//!
//! Names are demangled here, not by blazesym: C++ names with the GNU demangler c++filt uses
//! (libiberty's, exported by libstdc++ as `__cxa_demangle`), Rust names with `rustc-demangle`.
//! blazesym's own demangling (`cpp_demangle`) gets some C++ signatures wrong, e.g. template
//! constructors lose their first parameter (`_ZN1AC2IiEEmc` as `A::A<int>(char)`).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use vmo_layout::Module;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

/// One source-level frame; a return address can expand to several (inlining).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Function name (demangled).
    pub function: String,
    /// Source file, empty when unknown.
    pub file: String,
    /// Line, 0 when unknown.
    pub line: u32,
}

/// What is known of one address.
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    /// Index into the module list, if the address lies in a module.
    pub module: Option<usize>,
    /// Frames, innermost (inlined) first; empty when not symbolized.
    pub frames: Vec<Frame>,
}

/// Whose rights the module files a region names are opened with, when not the collector's
/// own: the region's owner, when root (or another user with the capabilities) collects a
/// region someone else wrote. The region's owner chooses its module paths, and must not make
/// root's profile show the names and source lines of an ELF file the owner cannot read
/// (helper Q, 4: `/root/…/secret.so` named as a module).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadAs {
    /// File-system user id (the region file's owner).
    pub uid: u32,
    /// File-system group id (the region file's group).
    pub gid: u32,
    /// Supplementary groups (the target's, from `/proc/PID/status`, while it runs; else none).
    pub groups: Vec<u32>,
}

impl ReadAs {
    /// For a region whose file is owned by `uid`:`gid`, written by process `pid` (`alive`:
    /// still running, in this PID namespace): `None` when the collector runs as that user
    /// (its own rights are the owner's).
    pub fn for_region(uid: u32, gid: u32, pid: u32, alive: bool) -> Option<ReadAs> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == uid {
            return None;
        }
        let groups = if alive {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| {
                    let line = s.lines().find(|l| l.starts_with("Groups:"))?.to_owned();
                    Some(
                        (line["Groups:".len()..].split_whitespace())
                            .filter_map(|g| g.parse().ok())
                            .collect(),
                    )
                })
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        Some(ReadAs { uid, gid, groups })
    }
}

/// Opens `path` for reading, without blocking (a FIFO) and, with `read_as`, with the rights of
/// that user only: the open runs on a thread of its own whose file-system ids and
/// supplementary groups are set by raw system calls (Linux keeps credentials per thread;
/// glibc's wrappers would change every thread's) and which ends after the open, so the kernel
/// itself checks every directory on the way and the file's mode, as for that user. A
/// collector without the rights to change its ids (not root) opens as itself: it reads only
/// what it may read anyway.
///
/// Errors: the open's (`EACCES` when the owner may not read the file).
pub(crate) fn open_module(path: &Path, read_as: Option<&ReadAs>) -> std::io::Result<std::fs::File> {
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(path)
    };
    let Some(r) = read_as else {
        return open();
    };
    let on_thread = || -> std::io::Result<std::fs::File> {
        // SAFETY: raw system calls that change the calling thread's credentials only; the
        // group list is a valid array of `len` gid_t; the thread ends after the open below.
        let dropped = unsafe {
            libc::syscall(
                libc::SYS_setgroups,
                r.groups.len() as libc::c_long,
                r.groups.as_ptr(),
            ) == 0
        };
        if !dropped {
            // EPERM: not privileged, the collector's own rights are no more than its own.
            return open();
        }
        // SAFETY: as above; setfsgid/setfsuid return the previous id and never fail loudly:
        // checked below by asking again with an invalid id (-1 changes nothing).
        let ok = unsafe {
            libc::syscall(libc::SYS_setfsgid, r.gid as libc::c_long);
            libc::syscall(libc::SYS_setfsuid, r.uid as libc::c_long);
            libc::syscall(libc::SYS_setfsgid, -1 as libc::c_long) == r.gid as libc::c_long
                && libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long) == r.uid as libc::c_long
        };
        if !ok {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
        open()
    };
    std::thread::scope(|s| {
        s.spawn(on_thread)
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::from_raw_os_error(libc::EIO)))
    })
}

/// Index of the module whose PT_LOAD segments contain `addr`.
///
/// Several entries can contain it when a library was `dlclose`d and another one (or the same
/// one again) was later mapped over its addresses. The table does not say when each was mapped,
/// and a stack trace is interned once for every allocation made with the same return addresses
/// (whichever library they were in), so which library a frame was in cannot always be known.
/// The module still loaded is preferred (it is the only one that can be executing now, and the
/// one the addresses belong to for every stack recorded since it was mapped); among unloaded
/// ones, the one loaded last. A block allocated by an unloaded library whose addresses were
/// reused, still live, is therefore attributed to the library mapped there now.
pub fn module_of(modules: &[Module], addr: u64) -> Option<usize> {
    let contains = |m: &Module| {
        m.segments.iter().any(|s| {
            let start = m.base.wrapping_add(s.vaddr);
            addr >= start && addr < start.wrapping_add(s.memsz)
        })
    };
    let mut best: Option<usize> = None;
    for (i, m) in modules.iter().enumerate() {
        if !contains(m) {
            continue;
        }
        if m.loaded {
            return Some(i);
        }
        best = Some(i);
    }
    best
}

/// Symbolizes `addrs` (call-site addresses: return address − 1) against `modules`, and
/// addresses in no module with `jit` (generated code named in perf map or jitdump files:
/// `perfmap::JitSymbols::lookup`).
///
/// Modules whose file no longer exists, or whose build ID differs from the recorded one, are left
/// unsymbolized (their mapping keeps the build ID so pprof can symbolize later).
///
/// Each module is symbolized twice: from its DWARF (files, lines, inlined calls) and from its
/// ELF symbol table. DWARF built with `debug = "line-tables-only"` names functions without
/// their linkage name (`make_vec`, not `app::work::make_vec`); the symbol table's name of the
/// function holding the address is used instead when it is the same function, fully qualified.
pub fn symbolize(
    modules: &[Module],
    jit: &dyn Fn(u64) -> Option<Frame>,
    addrs: &[u64],
    read_as: Option<&ReadAs>,
) -> HashMap<u64, Resolved> {
    let mut by_module: HashMap<usize, Vec<u64>> = HashMap::new();
    let mut out: HashMap<u64, Resolved> = HashMap::with_capacity(addrs.len());
    for &a in addrs {
        let m = module_of(modules, a);
        out.insert(
            a,
            Resolved {
                module: m,
                frames: match m {
                    None => jit(a).into_iter().collect(),
                    Some(_) => Vec::new(),
                },
            },
        );
        if let Some(m) = m {
            by_module.entry(m).or_default().push(a);
        }
    }
    let symbolizer = Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(false)
        .build();
    let mut opened: Vec<std::fs::File> = Vec::new();
    for (m, list) in by_module {
        let module = &modules[m];
        let named = Path::new(&module.path);
        if !named.is_absolute() {
            continue;
        }
        // Opened here, once, without blocking, and used only if a regular file. A path that
        // others can change (a file or a directory of another user's: root symbolizing a
        // user's program) is then read through this descriptor (`/proc/self/fd/N` reopens the
        // same file), never by its name again: its owner could swap it for a FIFO between a
        // check and blazesym's blocking open (helper E, F4: root's snapshot hung in 12 of 30
        // tries), and its debug link is not followed (its candidates are the owner's too).
        // With the rights of the region's owner when someone else collects (`read_as`).
        let Ok(file) = open_module(named, read_as) else {
            continue;
        };
        if !file.metadata().is_ok_and(|md| md.is_file()) {
            continue;
        }
        heapdump_testhooks::symbolize_pause(named);
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        // Kept open to the end: blazesym caches what it read by path, and a descriptor number
        // closed here could name another module's file next.
        let trusted = trusted_path(named);
        let path: &Path = if trusted { named } else { &by_fd };
        if !build_id_matches(path, &module.build_id) {
            continue;
        }
        let virt: Vec<u64> = list.iter().map(|a| a.wrapping_sub(module.base)).collect();
        // DWARF only when blazesym can follow the file's debug link without opening anything
        // but regular files (see `debug_link_safe`), or, through the descriptor, when the file
        // has no debug link to follow; else its symbol table.
        let dwarf = if trusted {
            debug_link_safe(path)
        } else {
            has_no_debug_link(&file)
        };
        let path = path.to_path_buf();
        let path = path.as_path();
        opened.push(file);
        let source = if dwarf {
            Elf::new(path)
        } else {
            Elf {
                debug_syms: false,
                ..Elf::new(path)
            }
        };
        let Ok(syms) = symbolizer.symbolize(&Source::Elf(source), Input::VirtOffset(&virt)) else {
            continue;
        };
        let elf_only = Elf {
            debug_syms: false,
            ..Elf::new(path)
        };
        let table_names: Vec<Option<String>> = symbolizer
            .symbolize(&Source::Elf(elf_only), Input::VirtOffset(&virt))
            .map(|v| {
                v.into_iter()
                    .map(|s| match s {
                        Symbolized::Sym(s) => Some(s.name.into_owned()),
                        Symbolized::Unknown(_) => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        for (k, (a, s)) in list.iter().zip(syms).enumerate() {
            let Symbolized::Sym(sym) = s else { continue };
            let mut frames = Vec::with_capacity(1 + sym.inlined.len());
            // pprof wants innermost first; blazesym reports the outer function, then inlined
            // calls outermost to innermost, each with the location inside it.
            let outer = outer_name(&sym.name, table_names.get(k).and_then(|n| n.as_deref()));
            let loc = sym.code_info.as_deref().map(code_loc).unwrap_or_default();
            let mut chain = vec![(outer, loc)];
            for f in sym.inlined.iter() {
                chain.push((
                    demangle(&f.name),
                    f.code_info.as_ref().map(code_loc).unwrap_or_default(),
                ));
            }
            for (name, (file, line)) in chain.into_iter().rev() {
                frames.push(Frame {
                    function: name,
                    file,
                    line,
                });
            }
            if let Some(r) = out.get_mut(a) {
                r.frames = frames;
            }
        }
    }
    out
}

/// The demangled name of the function holding an address: DWARF's name `dwarf`, unless that
/// is a bare name (no linkage name in the DWARF, as with `debug = "line-tables-only"`) and the
/// symbol table names the same function fully: `table`, mangled, whose demangled form is that
/// bare name (generic arguments left out) under a path.
fn outer_name(dwarf: &str, table: Option<&str>) -> String {
    if is_mangled(dwarf) {
        return demangle(dwarf);
    }
    let bare = if dwarf.starts_with('<') {
        dwarf
    } else {
        dwarf.split('<').next().unwrap_or(dwarf)
    };
    match table.filter(|t| is_mangled(t)).map(demangle) {
        Some(t)
            if {
                // A C++ name is compared without its parameters and its last template
                // arguments (`std::allocator_traits<…>::allocate(…)` for DWARF's bare `allocate`:
                // GCC gives functions of templates over lambdas or local types no linkage name;
                // helper K, 4).
                // A free function keeps DWARF's name, as before (a C++ static: `outer_a`,
                // not `outer_a(int)`).
                let member = format!("::{bare}");
                t == bare || t.ends_with(&member) || cxx_core(&t).ends_with(&member)
            } =>
        {
            t
        }
        // A Rust closure or async body (`{closure#0}`, `{async_fn#0}`: DWARF's name) whose
        // symbol is its function's legacy-mangled `{{closure}}` (`tok::handle::{{closure}}`):
        // the function's path with DWARF's name (helper T, 5: every async body was
        // `{async_fn#0}`, one pprof row for all).
        Some(t)
            if (bare.starts_with("{closure#") || bare.starts_with("{async"))
                && t.ends_with("::{{closure}}") =>
        {
            format!("{}::{dwarf}", &t[..t.len() - "::{{closure}}".len()])
        }
        _ => dwarf.to_owned(),
    }
}

/// A demangled C++ name without its parameter list (from its last `(` outside template
/// arguments, with what follows: `const`, …) and without the template arguments that end it
/// (`a::b<c>::f<int>(int) const` → `a::b<c>::f`). Other names are returned as they are.
fn cxx_core(name: &str) -> &str {
    let mut depth = 0i32;
    let mut params = None;
    for (i, c) in name.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '(' if depth == 0 => params = Some(i),
            _ => {}
        }
    }
    let mut core = match params {
        Some(i) if name.ends_with(')') || name[i..].contains(')') => &name[..i],
        _ => name,
    };
    if core.ends_with('>') {
        let mut depth = 0i32;
        for (i, c) in core.char_indices().rev() {
            match c {
                '>' => depth += 1,
                '<' => {
                    depth -= 1;
                    if depth == 0 {
                        core = &core[..i];
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    core
}

fn is_mangled(name: &str) -> bool {
    name.starts_with("_Z") || name.starts_with("_R")
}

/// Demangles a symbol name: Rust (v0 `_R…`, or legacy `_ZN…17h<hash>E`, printed without the
/// hash) with `rustc-demangle`; C++ (`_Z…`) like `c++filt`; anything else unchanged.
pub fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        // A legacy Rust name ends with a hash (printed only without `#`); `_ZN3foo3barE`
        // without one is C++ (`foo::bar`), which the C++ demangler prints the same.
        let short = format!("{d:#}");
        if name.starts_with("_R") || d.to_string() != short {
            return short;
        }
    }
    if name.starts_with("_Z") {
        if let Some(d) = demangle_cpp(name) {
            return d;
        }
    }
    name.to_owned()
}

type CxaDemangle = unsafe extern "C" fn(
    mangled: *const c_char,
    buf: *mut c_char,
    len: *mut usize,
    status: *mut c_int,
) -> *mut c_char;

/// libstdc++'s `__cxa_demangle` (GCC's libiberty demangler, the one `c++filt` runs), looked up
/// once; `None` when libstdc++ is not installed.
fn cxa_demangle() -> Option<CxaDemangle> {
    static F: OnceLock<Option<usize>> = OnceLock::new();
    let f = *F.get_or_init(|| {
        // SAFETY: dlopen/dlsym with NUL-terminated names; the library is never closed, so the
        // function pointer stays valid for the life of the process. Loading libstdc++ runs its
        // initializers, which have no effect on this program.
        unsafe {
            let h = libc::dlopen(
                c"libstdc++.so.6".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            );
            if h.is_null() {
                return None;
            }
            let s = libc::dlsym(h, c"__cxa_demangle".as_ptr());
            (!s.is_null()).then_some(s as usize)
        }
    });
    // SAFETY: `f` is the address of `__cxa_demangle`, whose C ABI signature is `CxaDemangle`
    // (Itanium C++ ABI, 3.4).
    f.map(|f| unsafe { std::mem::transmute::<usize, CxaDemangle>(f) })
}

/// A C++ name demangled as `c++filt` prints it, falling back to `cpp_demangle` when libstdc++
/// cannot be loaded. `None` when it is not a valid mangled name.
///
/// `__cxa_demangle` runs libiberty's demangler with the options GDB and perf use; `c++filt`
/// adds `DMGL_VERBOSE`, which only changes how the standard abbreviations `Ss`, `Si`, `So` and
/// `Sd` print outside constructor and destructor names (`std::string` rather than
/// `std::basic_string<char, std::char_traits<char>, std::allocator<char> >`).
fn demangle_cpp(name: &str) -> Option<String> {
    let Some(f) = cxa_demangle() else {
        let sym = cpp_demangle::Symbol::new(name.as_bytes()).ok()?;
        return sym.demangle().ok();
    };
    let c = CString::new(name).ok()?;
    let mut status: c_int = 0;
    // SAFETY: `c` is NUL-terminated; a null buffer asks __cxa_demangle to malloc the result,
    // which we own and free below; `status` is a valid out-pointer.
    let p = unsafe {
        f(
            c.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut status,
        )
    };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success `p` is a NUL-terminated string allocated with malloc.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    // SAFETY: `p` came from malloc (inside __cxa_demangle) and is not used after this.
    unsafe { libc::free(p as *mut libc::c_void) };
    (status == 0).then_some(s)
}

fn code_loc(c: &blazesym::symbolize::CodeInfo<'_>) -> (String, u32) {
    (
        c.to_path().to_string_lossy().into_owned(),
        c.line.unwrap_or(0),
    )
}

/// Whether no one but the collector's user and root can change what `path` names: the file
/// and every directory above it owned by one of them, each directory writable by no one else
/// unless sticky (where others cannot rename what is not theirs).
pub(crate) fn trusted_path(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let ours = |uid: u32| uid == me || uid == 0;
    // Each directory on the way, as named and as resolved (`/lib` is a link to `usr/lib` on
    // Debian): a link can only be replaced by whoever may write the directory holding it,
    // which is checked as the component above it.
    let dirs_ok = |p: &Path| {
        p.ancestors().skip(1).all(|dir| {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            std::fs::symlink_metadata(dir).is_ok_and(|d| {
                ours(d.uid())
                    && (d.file_type().is_symlink()
                        || (d.is_dir() && (d.mode() & 0o022 == 0 || d.mode() & libc::S_ISVTX != 0)))
            })
        })
    };
    let Ok(real) = std::fs::canonicalize(path) else {
        return false;
    };
    let Ok(md) = std::fs::symlink_metadata(&real) else {
        return false;
    };
    md.is_file() && ours(md.uid()) && dirs_ok(path) && dirs_ok(&real)
}

/// Whether the ELF file `f` has no `.gnu_debuglink` (then blazesym follows nothing from it).
fn has_no_debug_link(f: &std::fs::File) -> bool {
    use object::{Object as _, ReadCache};
    let Ok(f) = f.try_clone() else {
        return false;
    };
    if !elf_bounded(&f) {
        return false;
    }
    let cache = ReadCache::new(f);
    match object::File::parse(&cache) {
        Ok(elf) => matches!(elf.gnu_debuglink(), Ok(None)),
        Err(_) => true,
    }
}

/// Whether the object `crate` may parse file `f` (through a `ReadCache`, which allocates what
/// each table and section claims to take) without more memory than the file's size, at most
/// `regions::MAX_OBJECT_BYTES`: a 64-bit little-endian ELF file whose program and section
/// header tables, and every section with contents, lie inside the file, with at most 65,536
/// sections; or anything that is not ELF (object refuses it at once). A crafted sparse file
/// whose header claimed a huge section table made root's `snapshot` of another user's process
/// allocate and zero gigabytes (helper J, 1: 2 GB in 20 s, up to 256 GiB). Reads at most the
/// header and the section table (4 MiB).
pub(crate) fn elf_bounded(f: &std::fs::File) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(len) = f.metadata().map(|m| m.len()) else {
        return false;
    };
    if len > crate::regions::MAX_OBJECT_BYTES {
        return false;
    }
    let mut h = [0u8; 64];
    if f.read_exact_at(&mut h, 0).is_err() || h[..4] != *b"\x7fELF" {
        return true;
    }
    if h[4] != 2 || h[5] != 1 {
        return false;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as u64;
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as u64;
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let within = |off: u64, size: u64| off.checked_add(size).is_some_and(|e| e <= len);
    let (phoff, shoff) = (u64_at(&h, 0x20), u64_at(&h, 0x28));
    let (phentsize, phnum) = (u16_at(&h, 0x36), u16_at(&h, 0x38));
    let (shentsize, mut shnum) = (u16_at(&h, 0x3a), u16_at(&h, 0x3c));
    if phnum != 0 && (phentsize != 56 || !within(phoff, phnum * 56)) {
        return false;
    }
    if shoff == 0 {
        return true;
    }
    if shentsize != 64 {
        return false;
    }
    let mut first = [0u8; 64];
    if !within(shoff, 64) || f.read_exact_at(&mut first, shoff).is_err() {
        return false;
    }
    if shnum == 0 {
        // Extended numbering: the count is section 0's size.
        shnum = u64_at(&first, 0x20);
    }
    if shnum > 1 << 16 || !within(shoff, shnum * 64) {
        return false;
    }
    let mut table = vec![0u8; (shnum * 64) as usize];
    if f.read_exact_at(&mut table, shoff).is_err() {
        return false;
    }
    table.chunks_exact(64).all(|s| {
        // SHT_NOBITS (8) takes no room in the file.
        u32_at(s, 4) == 8 || within(u64_at(s, 0x18), u64_at(s, 0x20))
    })
}

/// Whether every file blazesym may open to follow `path`'s `.gnu_debuglink` (blazesym 0.2's
/// `DebugFileIter`: under `/usr/lib/debug` and `/lib/debug` the build ID's file and the
/// link's name, with and without the object's directory; beside the object, and in its
/// `.debug`) is absent or a regular file: blazesym opens the first one that exists with a
/// blocking open, and the profiled program chooses both the link and what lies beside its
/// own binary (a FIFO there hung `snapshot` for ever). A link naming a path (a `/` in it) is
/// not followed. Reads only the ELF headers and the link's section.
fn debug_link_safe(path: &Path) -> bool {
    use object::{Object as _, ReadCache};
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
    else {
        return false;
    };
    if !f.metadata().is_ok_and(|m| m.is_file()) || !elf_bounded(&f) {
        return false;
    }
    let cache = ReadCache::new(f);
    let Ok(elf) = object::File::parse(&cache) else {
        return true; // not ELF: blazesym finds no link either
    };
    let link = match elf.gnu_debuglink() {
        Ok(None) => return true,
        Ok(Some((name, _crc))) => name.to_vec(),
        Err(_) => return false,
    };
    use std::os::unix::ffi::OsStrExt;
    if link.is_empty() || link.contains(&b'/') {
        return false;
    }
    let linkee = std::ffi::OsStr::from_bytes(&link);
    let object = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let dir = object.parent().unwrap_or(Path::new("/"));
    let mut candidates = vec![dir.join(linkee), dir.join(".debug").join(linkee)];
    let build_id = elf.build_id().ok().flatten().filter(|id| id.len() >= 8);
    for debug in ["/usr/lib/debug", "/lib/debug"] {
        let debug = Path::new(debug);
        candidates.push(debug.join(linkee));
        candidates.push(
            debug
                .join(dir.strip_prefix("/").unwrap_or(dir))
                .join(linkee),
        );
        if let Some(id) = build_id {
            let rest: String = id[1..].iter().map(|b| format!("{b:02x}")).collect();
            candidates.push(debug.join(format!(".build-id/{:02x}/{rest}.debug", id[0])));
        }
    }
    candidates.iter().all(|c| match std::fs::metadata(c) {
        Ok(m) => m.is_file(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    })
}

/// Whether the ELF file at `path` carries `expected` as its GNU build ID (true when none was
/// recorded or the file cannot be read as ELF: blazesym will then decide).
fn build_id_matches(path: &Path, expected: &[u8]) -> bool {
    if expected.is_empty() {
        return true;
    }
    match blazesym::helper::read_elf_build_id(path) {
        Ok(Some(id)) => id.as_ref() == expected,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};

    /// Mangled names from real symbol tables: libstdc++'s dynamic symbols and the C++ runtime
    /// pieces every C++ program links, plus the two signatures of issue 8.
    fn corpus() -> Vec<String> {
        let mut names: Vec<String> = vec![
            "_ZN1AC2IiEEmc".into(),
            "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEC2IS3_EEmcRKS3_".into(),
        ];
        for lib in [
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
            "/usr/lib/x86_64-linux-gnu/libicuuc.so.72",
        ] {
            if !Path::new(lib).exists() {
                continue;
            }
            let out = Command::new("nm")
                .args(["-D", "--defined-only", lib])
                .output()
                .expect("nm (binutils) must be installed");
            assert!(out.status.success(), "nm {lib}");
            for l in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some(n) = l.split_whitespace().nth(2) {
                    let n = n.split('@').next().unwrap_or(n);
                    if n.starts_with("_Z") {
                        names.push(n.to_owned());
                    }
                }
            }
        }
        names.sort();
        names.dedup();
        names
    }

    /// `c++filt`'s output for each name, in order.
    fn cxxfilt(names: &[String]) -> Vec<String> {
        let mut child = Command::new("c++filt")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("c++filt (binutils) must be installed");
        let mut input = child.stdin.take().unwrap();
        let all = names.join("\n") + "\n";
        let writer = std::thread::spawn(move || input.write_all(all.as_bytes()));
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The one difference `c++filt`'s `DMGL_VERBOSE` makes: the standard abbreviations `Ss`,
    /// `Si`, `So`, `Sd` print in full rather than as `std::string`, … (both sides normalized,
    /// with the space between closing angle brackets the full form brings).
    fn abbreviate(s: &str) -> String {
        s.replace(
            "std::basic_string<char, std::char_traits<char>, std::allocator<char> >",
            "std::string",
        )
        .replace(
            "std::basic_istream<char, std::char_traits<char> >",
            "std::istream",
        )
        .replace(
            "std::basic_ostream<char, std::char_traits<char> >",
            "std::ostream",
        )
        .replace(
            "std::basic_iostream<char, std::char_traits<char> >",
            "std::iostream",
        )
        // `<std::string>`, where the full form closes with `> >`.
        .replace(" >", ">")
    }

    #[test]
    fn cpp_names_demangled_like_cxxfilt() {
        assert!(
            cxa_demangle().is_some(),
            "libstdc++.so.6 must be loadable: it carries the demangler c++filt uses"
        );
        let names = corpus();
        assert!(names.len() > 3000, "only {} names", names.len());
        let expected = cxxfilt(&names);
        assert_eq!(expected.len(), names.len());
        let (mut bad, mut verbose_only) = (Vec::new(), 0);
        for (n, e) in names.iter().zip(&expected) {
            let got = demangle(n);
            if &got == e {
                continue;
            }
            if abbreviate(&got) == abbreviate(e) {
                verbose_only += 1;
                continue;
            }
            bad.push(format!("{n}\n  ours:     {got}\n  c++filt:  {e}"));
        }
        assert!(
            bad.is_empty(),
            "{} of {} differ:\n{}",
            bad.len(),
            names.len(),
            bad.join("\n")
        );
        // The two signatures cpp_demangle (blazesym's demangler) got wrong.
        assert_eq!(demangle("_ZN1AC2IiEEmc"), "A::A<int>(unsigned long, char)");
        assert_eq!(
            demangle("_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEC2IS3_EEmcRKS3_"),
            "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >\
             ::basic_string<std::allocator<char> >(unsigned long, char, std::allocator<char> const&)"
        );
        eprintln!(
            "{} names: {} as c++filt prints them, {verbose_only} with std::string/istream/ostream \
             abbreviated (c++filt's DMGL_VERBOSE)",
            names.len(),
            names.len() - verbose_only
        );
    }

    /// Helper K, 4: GCC gives functions of templates over lambdas or local types a bare DWARF
    /// name (`allocate`, `operator()`, `_M_create<…>`); the symbol table's C++ name stands in
    /// for it, compared without parameters and last template arguments.
    #[test]
    fn bare_dwarf_names_take_the_symbol_tables_cxx_name() {
        assert_eq!(
            outer_name(
                "allocate",
                Some("_ZNSt16allocator_traitsISaIZ9callbacksvE5LocalEE8allocateERS1_m")
            ),
            "std::allocator_traits<std::allocator<callbacks()::Local> >::allocate(std::allocator<callbacks()::Local>&, unsigned long)"
        );
        assert_eq!(
            outer_name("operator()", Some("_ZZ9callbacksvENKUliE_clEi")),
            "callbacks()::{lambda(int)#1}::operator()(int) const"
        );
        // Another function's symbol is not taken.
        assert_eq!(
            outer_name("allocate", Some("_ZZ9callbacksvENKUliE_clEi")),
            "allocate"
        );
        assert_eq!(cxx_core("a::b<c>::f<int>(int) const"), "a::b<c>::f");
        assert_eq!(cxx_core("plain"), "plain");
    }

    /// Helper T, 5: a Rust async body or closure is named by its function's path.
    #[test]
    fn rust_closures_and_async_bodies_take_their_functions_path() {
        let handle = "_ZN3tok6handle28_$u7b$$u7b$closure$u7d$$u7d$17h0123456789abcdefE";
        assert_eq!(
            outer_name("{async_fn#0}", Some(handle)),
            "tok::handle::{async_fn#0}"
        );
        assert_eq!(
            outer_name("{closure#1}", Some(handle)),
            "tok::handle::{closure#1}"
        );
        assert_eq!(outer_name("{async_fn#0}", None), "{async_fn#0}");
    }

    #[test]
    fn rust_names_demangled_without_hash() {
        // Legacy (with `..` in the path, as trait impls have) and v0.
        assert_eq!(
            demangle(
                "_ZN115_$LT$heapdump_instrumentation..global_alloc..HeapdumpAlloc$LT$A$GT$$u20$as\
                 $u20$core..alloc..global..GlobalAlloc$GT$5alloc17h57a7626b6c3d32b0E"
            ),
            "<heapdump_instrumentation::global_alloc::HeapdumpAlloc<A> as \
             core::alloc::global::GlobalAlloc>::alloc"
        );
        assert_eq!(
            demangle("_ZN18rust_alloc_example11alloc_small17h0123456789abcdefE.llvm.42"),
            "rust_alloc_example::alloc_small"
        );
        assert_eq!(
            demangle("_RNvCs1234_7___rustc12___rust_alloc"),
            "__rustc::__rust_alloc"
        );
        // C++ without a hash, and C names, are not Rust.
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(demangle("malloc"), "malloc");
    }
}

//! `heapdump attach` and `heapdump detach`: loading the shim into a running process and
//! starting (or stopping) recording there, through ptrace, without gdb.
//!
//! 1. Every thread is stopped ([`ptrace::Held`]). Refused, with nothing changed, for a
//!    process with no glibc mapped (static binary), one ptrace may not trace, or one that
//!    has the shim already.
//! 2. Safe point: no thread may be inside the allocator or the loader, or `dlopen` could
//!    deadlock on an arena lock or the loader lock, and the heap walk read a heap being
//!    changed. Each thread's instruction pointer must lie neither in the loader's code nor in
//!    one of libc's malloc-family functions or loader entry points ([`ALLOCATOR`], their
//!    dynamic-symbol ranges; in CPython also [`PYTHON`]), nor may any of its frames, found by
//!    unwinding it from its registers with the call frame information of its objects
//!    ([`unwind`]), be in those functions or the loader (a thread inside `_int_malloc` or
//!    waiting for an arena lock has a frame of `malloc`; one holding the loader lock, of
//!    `dlopen`, …). Where that information is missing (generated code, PLT entries), the
//!    stack from there up is searched instead: its words, at most [`STACK_SCAN`] bytes, that
//!    follow a call instruction must not point into those functions. Only real frames are
//!    looked at otherwise: a stale return address left on the stack by an earlier call (a
//!    `free` that returned long ago, below a thread blocked in `wait4`) is not one. Otherwise
//!    the threads run a few milliseconds and are stopped again, up to `--timeout`.
//! 3. Two pages are mapped in the target (one thread makes the `mmap` system calls, single
//!    stepped on a `syscall` instruction of libc: the only moments the target depends on
//!    heapdump, a few microseconds each, its registers put back right after), the stub
//!    ([`stub`]) and its data written there, and that thread pointed at the stub: it calls
//!    `dlopen(shim)` and the shim's attach entry, which walks the heap, creates the region
//!    and rebinds the GOT slots while the other threads stay stopped, then returns to where
//!    it was (a system call it was in is restarted, as the kernel would have). From the
//!    moment it runs the stub the thread needs nothing from heapdump: if heapdump is killed,
//!    the kernel detaches every thread and the stub still finishes.
//! 4. When the stub says it is done, every thread is detached, and the entry's answer shown.

mod ptrace;
mod stub;
mod unwind;

use crate::cli::AttachCmd;
use anyhow::{anyhow, bail, Context, Result};
use ptrace::Held;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vmo_layout::attach::{
    AttachArgs, ATTACH_ENTRY, DETACH_ENTRY, SHIM_ATTACHED, SHIM_DETACHED, SHIM_LOADED,
    SHIM_PRELOADED, STATE_SYMBOL, STATUS_OK,
};

/// Bytes of each thread's stack searched for return addresses into the allocator or loader,
/// from the first frame the call frame information does not describe.
const STACK_SCAN: usize = 64 * 1024;

/// Most frames of a thread unwound (a deeper stack is searched from there, as [`STACK_SCAN`]).
const MAX_FRAMES: usize = 4096;

/// libc's functions a thread must not be inside of at the safe point: the malloc family,
/// its statistics and tuning (they take the arena locks), `fork` (which holds them around
/// the system call), and the loader's entry points.
const ALLOCATOR: &[&str] = &[
    "malloc",
    "free",
    "calloc",
    "realloc",
    "reallocarray",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "malloc_trim",
    "malloc_usable_size",
    "mallinfo",
    "mallinfo2",
    "malloc_info",
    "malloc_stats",
    "mallopt",
    "__libc_malloc",
    "__libc_free",
    "__libc_calloc",
    "__libc_realloc",
    "__libc_memalign",
    "__libc_valloc",
    "__libc_pvalloc",
    "fork",
    "__libc_fork",
    "_Fork",
    // They hold the fork handlers' lock, which the entry takes to register the shim's.
    "pthread_atfork",
    "__register_atfork",
    // The loader's entry points in libc: they hold the loader lock (`dl_iterate_phdr` also
    // while its callback runs: an unwinder's, the shim's).
    "dlopen",
    "dlmopen",
    "dlclose",
    "dlsym",
    "dlvsym",
    "dladdr",
    "dladdr1",
    "dlinfo",
    "dlerror",
    "dl_iterate_phdr",
    "__libc_dlopen_mode",
    "__libc_dlsym",
    "__libc_dlvsym",
    "__libc_dlclose",
];

/// CPython's functions no thread may be inside of at the safe point: the attach entry calls
/// `PyMem_GetAllocator` (detection), which takes the allocators' lock on 3.12+; a thread
/// stopped holding it would block the entry (itself: for ever). Looked up in the executable
/// and `libpython`; missing ones are skipped.
const PYTHON: &[&str] = &[
    "PyMem_GetAllocator",
    "PyMem_SetAllocator",
    "PyMem_SetupDebugHooks",
    "PyObject_GetArenaAllocator",
    "PyObject_SetArenaAllocator",
    "_PyMem_SetupAllocators",
    "_PyMem_GetCurrentAllocatorName",
];

/// How long the stub may take (the `dlopen`, the heap walk), at most.
const STUB_TIMEOUT: Duration = Duration::from_secs(60);

/// A mapping of the target.
#[derive(Debug, Clone)]
struct Map {
    start: u64,
    end: u64,
    perms: String,
    offset: u64,
    path: String,
}

fn maps(pid: u32) -> Result<Vec<Map>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("reading /proc/{pid}/maps"))?;
    let mut v = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms), Some(off)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (_dev, _inode) = (f.next(), f.next());
        let path = f.collect::<Vec<_>>().join(" ");
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(offset)) = (
            u64::from_str_radix(a, 16),
            u64::from_str_radix(b, 16),
            u64::from_str_radix(off, 16),
        ) else {
            continue;
        };
        v.push(Map {
            start,
            end,
            perms: perms.to_owned(),
            offset,
            path,
        });
    }
    Ok(v)
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A loaded ELF object of the target: its load bias and its dynamic symbols.
struct Object {
    bias: u64,
    /// (name, address in the target, size).
    symbols: Vec<(String, u64, u64)>,
}

impl Object {
    fn load(pid: u32, maps: &[Map], path: &str) -> Result<Object> {
        let first = maps
            .iter()
            .filter(|m| m.path == path)
            .min_by_key(|m| m.start)
            .with_context(|| format!("{path} is not mapped"))?;
        // The file as the target sees it (its mount namespace).
        let file = PathBuf::from(format!("/proc/{pid}/root{path}"));
        let read = |p: &Path| crate::regions::read_regular(p, crate::regions::MAX_OBJECT_BYTES);
        let data = read(&file)
            .or_else(|_| read(Path::new(path)))
            .with_context(|| format!("reading {path}"))?;
        use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
        let elf = object::File::parse(&*data).with_context(|| format!("parsing {path}"))?;
        let low = elf.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
        let bias = first.start - first.offset - low;
        let symbols = elf
            .dynamic_symbols()
            .filter(|s| s.is_definition())
            .filter_map(|s| Some((s.name().ok()?.to_owned(), bias + s.address(), s.size())))
            .collect();
        Ok(Object { bias, symbols })
    }

    fn symbol(&self, name: &str) -> Option<u64> {
        self.symbols.iter().find(|s| s.0 == name).map(|s| s.1)
    }
}

/// What the safe point must avoid: address ranges and what they are.
struct Forbidden(Vec<(u64, u64, String)>);

impl Forbidden {
    fn find(&self, a: u64) -> Option<&str> {
        self.0
            .iter()
            .find(|r| a >= r.0 && a < r.1)
            .map(|r| r.2.as_str())
    }
}

/// The target, inspected before anything is changed.
struct Target {
    libc: Object,
    forbidden: Forbidden,
    /// The loader's code: no thread may be executing it, nor have a frame in it (where the
    /// stack is searched instead of unwound, return addresses into it are not looked for:
    /// stale ones are common, e.g. from lazy binding, and the loader's lock is taken through
    /// libc's entry points, which are in `forbidden`).
    loader: Forbidden,
    /// An address in libc's code holding the bytes of a `syscall` instruction.
    gadget: u64,
    /// Whether libheapdump.so is mapped.
    shim_loaded: bool,
    /// Its exported state byte (`vmo_layout::attach::STATE_SYMBOL`), when it is mapped.
    shim_state: Option<u8>,
    /// Its code: at a re-attach no thread may be inside it either (the entry reads the
    /// shim's address index, which a thread inside the recording path may hold).
    shim_code: Forbidden,
    /// Unwinds the threads by their objects' call frame information.
    unwinder: unwind::Unwinder,
}

fn inspect(pid: u32, held: &Held) -> Result<Target> {
    let maps = maps(pid)?;
    let libc_path = maps
        .iter()
        .find(|m| {
            let f = file_name(&m.path);
            f.starts_with("libc.so") || f.starts_with("libc-2")
        })
        .map(|m| m.path.clone())
        .ok_or_else(|| {
            anyhow!(
                "cannot attach to pid {pid}: it has no glibc mapped (a static binary, or another C \
                 library); nothing was changed"
            )
        })?;
    let libc = Object::load(pid, &maps, &libc_path)?;
    let mut forbidden = Vec::new();
    for name in ALLOCATOR {
        if let Some(s) = libc.symbols.iter().find(|s| s.0 == *name) {
            forbidden.push((s.1, s.1 + s.2.max(1), format!("libc's {name}")));
        }
    }
    // CPython: the executable (`python3.11`) or a `libpython3.11.so.1.0` exports them.
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut pythons: Vec<&str> = maps
        .iter()
        .filter(|m| m.perms.contains('x'))
        .map(|m| m.path.as_str())
        .filter(|p| {
            file_name(p).starts_with("libpython")
                || (*p == exe && file_name(p).starts_with("python"))
        })
        .collect();
    pythons.dedup();
    for p in pythons {
        if let Ok(o) = Object::load(pid, &maps, p) {
            for name in PYTHON {
                if let Some(s) = o.symbols.iter().find(|s| s.0 == *name) {
                    forbidden.push((s.1, s.1 + s.2.max(1), format!("CPython's {name}")));
                }
            }
        }
    }
    let shim_path = maps
        .iter()
        .find(|m| file_name(&m.path) == "libheapdump.so")
        .map(|m| m.path.clone());
    let shim_loaded = shim_path.is_some();
    let mut shim_state = None;
    let mut shim_code = Vec::new();
    if let Some(p) = &shim_path {
        if let Ok(o) = Object::load(pid, &maps, p) {
            if let Some(a) = o.symbol(STATE_SYMBOL) {
                let mut b = [0u8; 1];
                if held.read(a, &mut b) == 1 {
                    shim_state = Some(b[0]);
                }
            }
        }
        for m in maps
            .iter()
            .filter(|m| &m.path == p && m.perms.contains('x'))
        {
            shim_code.push((m.start, m.end, "libheapdump.so".to_owned()));
        }
    }
    let mut loader = Vec::new();
    for m in &maps {
        let f = file_name(&m.path);
        if !m.perms.contains('x') {
            continue;
        }
        if f.starts_with("ld-linux") || f.starts_with("ld-2.") || f.starts_with("ld.so") {
            loader.push((m.start, m.end, "the dynamic loader".into()));
        }
    }
    // A `syscall` instruction (0f 05) in libc's code.
    let mut gadget = 0;
    for m in maps
        .iter()
        .filter(|m| m.path == libc_path && m.perms.contains('x'))
    {
        let mut buf = vec![0u8; (m.end - m.start) as usize];
        let n = held.read(m.start, &mut buf);
        if let Some(i) = buf[..n].windows(2).position(|w| w == [0x0f, 0x05]) {
            gadget = m.start + i as u64;
            break;
        }
    }
    if gadget == 0 {
        bail!("cannot attach to pid {pid}: no system call instruction found in its libc");
    }
    Ok(Target {
        libc,
        forbidden: Forbidden(forbidden),
        loader: Forbidden(loader),
        gadget,
        shim_loaded,
        shim_state,
        shim_code: Forbidden(shim_code),
        unwinder: unwind::Unwinder::new(pid, &maps),
    })
}

/// Whether the code before `ret` (a candidate return address) ends with a call instruction.
fn after_call(held: &Held, ret: u64) -> bool {
    let mut b = [0u8; 7];
    if ret < 7 || held.read(ret - 7, &mut b) != 7 {
        return false;
    }
    // call rel32; call r/m64 (ff /2) in its 2-, 3-, 6- and 7-byte forms.
    b[2] == 0xe8
        || (b[5] == 0xff && (b[6] >> 3) & 7 == 2)
        || (b[4] == 0xff && (b[5] >> 3) & 7 == 2)
        || (b[1] == 0xff && (b[2] >> 3) & 7 == 2)
        || (b[0] == 0xff && (b[1] >> 3) & 7 == 2)
}

/// The threads found inside the allocator or the loader (or the shim, with `shim_too`), and
/// where; empty at a safe point.
fn unsafe_threads(held: &Held, t: &Target, shim_too: bool) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for th in &held.threads {
        if let Some(why) = unsafe_thread(held, th, t, shim_too) {
            out.push((th.tid, why));
        }
    }
    out
}

/// Why the thread `th` is inside the allocator or the loader (or the shim, with `shim_too`);
/// `None` when it is not. Its frames are those found by unwinding it from its registers
/// ([`unwind`]): its pc and each return address (the pc a signal interrupted, for the frame
/// below a signal handler's) must lie outside those functions and the loader's code. Where
/// the unwinding cannot go on, the rest of the stack is searched ([`scan`]).
fn unsafe_thread(held: &Held, th: &ptrace::Thread, t: &Target, shim_too: bool) -> Option<String> {
    let forbidden = |a: u64| {
        t.forbidden
            .find(a)
            .or_else(|| shim_too.then(|| t.shim_code.find(a)).flatten())
            .or_else(|| t.loader.find(a))
    };
    if let Some(what) = forbidden(th.regs.rip) {
        return Some(format!("thread {} is executing {what}", th.tid));
    }
    let mut regs = unwind::Regs::of(&th.regs);
    let mut exact = true;
    for depth in 1..MAX_FRAMES {
        match t.unwinder.step(held, &regs, exact) {
            unwind::Step::Outermost => return None,
            unwind::Step::Unknown => break,
            unwind::Step::Caller(next, signal) => {
                (regs, exact) = (next, signal);
                let pc = regs.pc();
                // A return address is looked up one byte back: the call may end its function.
                let Some(what) = forbidden(if exact { pc } else { pc.wrapping_sub(1) }) else {
                    continue;
                };
                return Some(if exact {
                    format!(
                        "thread {} is in a signal handler that interrupted {what} (at {pc:#x})",
                        th.tid
                    )
                } else {
                    format!(
                        "thread {} is inside {what} (return address {pc:#x}, frame {depth})",
                        th.tid
                    )
                });
            }
        }
    }
    scan(held, th.tid, regs.sp(), &|a| {
        t.forbidden
            .find(a)
            .or_else(|| shim_too.then(|| t.shim_code.find(a)).flatten())
    })
}

/// The stack of thread `tid` from `sp` up (at most [`STACK_SCAN`] bytes), where unwinding
/// could not go: why it is inside a function `forbidden` names when one of its words is a
/// return address into one (it points there and follows a call instruction). Conservative: a
/// stale word counts too. (The loader is left out: stale return addresses into it are
/// common, e.g. from lazy binding, and its lock is taken through libc's entry points.)
fn scan<'t>(
    held: &Held,
    tid: u32,
    sp: u64,
    forbidden: &dyn Fn(u64) -> Option<&'t str>,
) -> Option<String> {
    let mut stack = vec![0u8; STACK_SCAN];
    let n = held.read(sp, &mut stack);
    for (i, w) in stack[..n - n % 8].chunks_exact(8).enumerate() {
        let a = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        if let Some(what) = forbidden(a) {
            if after_call(held, a) {
                return Some(format!(
                    "thread {tid} may be inside {what} (return address {a:#x} at {sp:#x}+{:#x}, \
                     in code without unwind information)",
                    i * 8
                ));
            }
        }
    }
    None
}

/// Unmaps the stub's two pages once thread `tid` has left them (stopped again outside the
/// code page, its registers back as they were), so that attaching and detaching again and
/// again leaves nothing behind. Gives up after 100 tries (the pages then stay: 8 KiB).
fn unmap_stub(held: &mut Held, tid: u32, gadget: u64, pages: [u64; 2]) {
    let code = pages[1];
    for _ in 0..100 {
        if held.let_run_only(&[tid], Duration::from_millis(1)).is_err() {
            return;
        }
        let Ok(t) = held.thread(tid) else { return };
        if (code..code + 4096).contains(&t.regs.rip) {
            continue;
        }
        for p in pages {
            let _ = held.syscall(tid, gadget, libc::SYS_munmap as u64, [p, 4096, 0, 0, 0, 0]);
        }
        return;
    }
}

/// Finds the target's pid.
/// Refuses a target in another PID namespace than heapdump's (a container): the shim names
/// its region after the pid the process has there (`getpid()`, often 1), which no command
/// run here can match to the pid given, so `snapshot --by-pid` would call it not
/// instrumented and `gc` take its region for a dead process's (helper I, 1). Unknown
/// namespaces (no `/proc/PID/ns/pid` to read) are let through.
fn refuse_other_pid_namespace(pid: u32) -> Result<()> {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
    let (Some(mine), Some(theirs)) = (ns("self"), ns(&pid.to_string())) else {
        return Ok(());
    };
    if mine == theirs {
        return Ok(());
    }
    let inner = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|v| v.split_whitespace().last().map(str::to_owned))
        })
        .unwrap_or_else(|| "?".to_owned());
    bail!(
        "cannot attach to pid {pid}: it runs in another PID namespace (a container), where its \
         pid is {inner}; its region would be named after that pid, which heapdump cannot match \
         from here. Run heapdump inside its namespaces, with the same HEAPDUMP_DIR: \
         `nsenter --target {pid} --pid --mount -- heapdump attach --by-pid {inner}` (the \
         heapdump binary and libheapdump.so must be reachable there); nothing was changed"
    );
}

fn resolve(a: &AttachCmd) -> Result<u32> {
    if let Some(p) = a.by_pid {
        return Ok(p);
    }
    let name = a.by_name.as_deref().unwrap_or_default();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        if let Ok(c) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
            if c.trim_end() == name {
                found.push(pid);
            }
        }
    }
    match found.as_slice() {
        [p] => Ok(*p),
        [] => bail!("no process named {name}"),
        many => bail!(
            "{} processes are named {name} ({many:?}): use --by-pid",
            many.len()
        ),
    }
}

/// Refuses, before anything is loaded, an attach to a process of another user whose region
/// directory (the collector's `HEAPDUMP_DIR`, passed to the shim) that user cannot record
/// into: the shim's own rule (`ensure_dir` in instrumentation/src/region.rs) takes a directory
/// of the target's user that nobody else may enter, or the private subdirectory `heapdump-UID`
/// of the user's own or of a sticky directory of root's (`/tmp`). Without this, the shim was
/// loaded, could not start, and the process could never be attached again (helper U, 2: root
/// attaching to a service run as nobody with root's `HEAPDUMP_DIR`). Without `HEAPDUMP_DIR`
/// the shim records into its user's own default (`/dev/shm/heapdump-UID`).
fn refuse_unusable_region_dir(pid: u32) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Some(dir) = region_dir_setting() else {
        return Ok(());
    };
    let Some([uid, ..]) = crate::regions::proc_uids(pid) else {
        return Ok(()); // gone: `call` says so
    };
    // SAFETY: geteuid has no preconditions.
    if uid == unsafe { libc::geteuid() } {
        return Ok(());
    }
    let dir = std::path::PathBuf::from(dir);
    // (usable as is, may hold the user's private subdirectory)
    let check = |d: &Path| -> Option<(bool, bool)> {
        let md = std::fs::symlink_metadata(d).ok()?;
        if !md.is_dir() {
            return Some((false, false));
        }
        let ours = md.uid() == uid;
        let safe_parent = ours || (md.uid() == 0 && md.mode() & libc::S_ISVTX != 0);
        Some((ours && md.mode() & 0o077 == 0, safe_parent))
    };
    let usable = match check(&dir) {
        None => true, // missing: the shim creates it if it can, and says so if not
        Some((true, _)) => true,
        Some((false, true)) => check(&dir.join(format!("heapdump-{uid}"))).is_none_or(|(ok, _)| ok),
        Some((false, false)) => false,
    };
    if usable {
        return Ok(());
    }
    let owner = std::fs::symlink_metadata(&dir)
        .map(|m| m.uid())
        .unwrap_or(u32::MAX);
    bail!(
        "cannot attach to pid {pid}: it runs as {} and cannot record into HEAPDUMP_DIR={} \
         (owned by {}); unset HEAPDUMP_DIR (it then records into /dev/shm/heapdump-{uid}), or \
         name a directory of its user's or a sticky one such as /tmp; nothing was changed",
        crate::regions::user(uid),
        crate::regions::shown(&dir.display().to_string()),
        crate::regions::user(owner)
    )
}

/// The collector's `HEAPDUMP_DIR`, made absolute against the collector's working directory:
/// the shim would resolve a relative one against the target's (helper Y, 4: the refusal
/// below checked one directory and the shim used another). `None` when unset or empty.
fn region_dir_setting() -> Option<std::ffi::OsString> {
    let d = std::env::var_os("HEAPDUMP_DIR").filter(|d| !d.is_empty())?;
    let p = PathBuf::from(&d);
    if p.is_relative() {
        if let Ok(here) = std::env::current_dir() {
            return Some(here.join(p).into_os_string());
        }
    }
    Some(d)
}

/// The collector's `HEAPDUMP_*` settings, passed to the shim instead of the target's
/// environment: NUL-terminated `NAME=VALUE` entries.
fn settings_env() -> Vec<u8> {
    let mut v = Vec::new();
    for (k, val) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("HEAPDUMP_") && k != "HEAPDUMP_LIB" && !k.starts_with("HEAPDUMP_TEST_") {
            let val = if k == "HEAPDUMP_DIR" {
                region_dir_setting()
            } else {
                Some(val)
            };
            let Some(val) = val else { continue };
            v.extend_from_slice(k.as_bytes());
            v.push(b'=');
            v.extend_from_slice(val.to_string_lossy().as_bytes());
            v.push(0);
        }
    }
    v
}

/// `heapdump attach`.
pub fn attach(a: &AttachCmd) -> Result<()> {
    let pid = resolve(a)?;
    if let Some(child) = crate::regions::run_wrapper_child(pid) {
        bail!(
            "pid {pid} is `heapdump run` itself: the program it runs is its child, pid {child}, \
             which records already when it was started with the shim (`heapdump snapshot \
             --by-pid {child}`)"
        );
    }
    refuse_other_pid_namespace(pid)?;
    refuse_unusable_region_dir(pid)?;
    let shim = crate::commands::run::shim_path(a.lib.clone())?;
    let (answer, took) = call(pid, a, &shim, ATTACH_ENTRY, libc::RTLD_NOW as u64, false)?;
    let note = String::from_utf8_lossy(answer.message()).into_owned();
    if answer.status != STATUS_OK {
        bail!("cannot attach to pid {pid}: {note}");
    }
    if answer.reattached != 0 {
        println!(
            "attached again to pid {pid} in {:.3} s: {} records from before the detach still live, {} closed (freed while detached); {} blocks ({} bytes) made while detached recorded; {} GOT slots rebound",
            took.as_secs_f64(),
            answer.kept,
            answer.closed,
            answer.blocks,
            answer.bytes,
            answer.slots
        );
        println!(
            "heapdump's own blocks left out: {} ({} bytes)",
            answer.own[0], answer.own[1]
        );
    } else {
        println!(
        "attached to pid {pid} in {:.3} s: {} blocks ({} bytes) live before the attach recorded; {} GOT slots rebound",
        took.as_secs_f64(),
            answer.blocks,
            answer.bytes,
            answer.slots
        );
    }
    if answer.pymalloc[0] != 0 {
        println!(
            "CPython's pymalloc objects among them: {} ({} bytes, their size classes')",
            answer.pymalloc[0], answer.pymalloc[1]
        );
    }
    println!(
        "glibc's own count then (mallinfo2): {} bytes in chunks in use in its arenas, {} bytes in {} mmapped chunks",
        answer.mallinfo[0], answer.mallinfo[1], answer.mallinfo[2]
    );
    if !note.is_empty() {
        eprintln!("heapdump: note: {}", crate::regions::shown(&note));
    }
    Ok(())
}

/// `heapdump detach`.
pub fn detach(a: &AttachCmd) -> Result<()> {
    let pid = resolve(a)?;
    let shim = crate::commands::run::shim_path(a.lib.clone())?;
    let mode = (libc::RTLD_NOW | libc::RTLD_NOLOAD) as u64;
    let (answer, took) = call(pid, a, &shim, DETACH_ENTRY, mode, true)?;
    if answer.status != STATUS_OK {
        bail!(
            "cannot detach from pid {pid}: {}",
            String::from_utf8_lossy(answer.message())
        );
    }
    println!(
        "detached from pid {pid} in {:.3} s: {} GOT slots restored; recording stopped (the region stays readable)",
        took.as_secs_f64(),
        answer.slots
    );
    Ok(())
}

/// Stops `pid` at a safe point and makes one thread call `entry` of `shim` (opened with
/// `mode`); returns the entry's answer and how long the target was held.
fn call(
    pid: u32,
    a: &AttachCmd,
    shim: &Path,
    entry: &[u8],
    mode: u64,
    for_detach: bool,
) -> Result<(AttachArgs, Duration)> {
    let xsave = stub::xsave_size().context("this CPU has no xsave: attach is not supported")?;
    let shim_s = shim.to_str().context("the shim's path is not UTF-8")?;
    if shim_s.len() > 500 {
        bail!("the shim's path is longer than 500 bytes");
    }
    if pid == std::process::id() {
        bail!("heapdump cannot attach to itself");
    }
    let started = Instant::now();
    let mut held = Held::stop(pid)?;
    let target = inspect(pid, &held)?;
    // A shim loaded already: attached and detached before (attach again), attached now, or
    // preloaded; one too old to say is refused too.
    let mut mode = mode;
    if target.shim_loaded {
        match (for_detach, target.shim_state) {
            (false, Some(SHIM_DETACHED)) => mode = (libc::RTLD_NOW | libc::RTLD_NOLOAD) as u64,
            (false, Some(SHIM_ATTACHED)) => bail!(
                "cannot attach to pid {pid}: heapdump is attached there already; nothing was \
                 changed"
            ),
            // Loaded by an attach whose recording could not start (helper J, 3: the retry
            // said "started under heapdump"): the shim stays loaded and stopped for good.
            (false, Some(SHIM_LOADED)) => bail!(
                "cannot attach to pid {pid}: an earlier attach loaded libheapdump.so there but \
                 could not start recording (its error said why), and it cannot be attached \
                 again; restart the program under `heapdump run` (or LD_PRELOAD); nothing was \
                 changed"
            ),
            (false, _) => bail!(
                "cannot attach to pid {pid}: libheapdump.so is loaded there already (started \
                 under heapdump); nothing was changed"
            ),
            (true, Some(SHIM_ATTACHED)) => {}
            (true, Some(SHIM_PRELOADED)) => bail!(
                "heapdump is not attached to pid {pid} (it was started under heapdump: \
                 libheapdump.so is preloaded)"
            ),
            (true, Some(SHIM_LOADED)) => bail!(
                "heapdump is not attached to pid {pid} (an earlier attach could not start \
                 recording)"
            ),
            (true, _) => bail!("heapdump is not attached to pid {pid} (detached already)"),
        }
    } else if for_detach {
        bail!("heapdump is not attached to pid {pid} (libheapdump.so is not loaded there)");
    }
    // A re-attach reads the shim's address index: no thread may be inside the shim then
    // (while detached, threads leave it at once). A detach takes none of its locks: the
    // threads may be inside it (and under full-speed churn nearly always are).
    let shim_too = target.shim_loaded && !for_detach;
    let deadline = Instant::now() + Duration::from_secs_f64(a.timeout.max(0.0));
    // Only the threads inside lock or loader run on, a millisecond at a time, until each is
    // out (a thread that stopped outside stays stopped, and cannot go back in): under
    // full-speed churn, all threads at once are seldom all outside. Every 8th round all run,
    // in case one waits on a thread that is stopped outside (a lock of the program's own).
    let mut round = 0u32;
    loop {
        let inside = unsafe_threads(&held, &target, shim_too);
        let Some((_, why)) = inside.first() else {
            break;
        };
        if Instant::now() >= deadline {
            bail!(
                "cannot attach to pid {pid} safely: {why} for longer than {} s; nothing was changed",
                a.timeout
            );
        }
        round += 1;
        if round.is_multiple_of(8) {
            held.let_run(Duration::from_millis(3))?;
        } else {
            let tids: Vec<u32> = inside.iter().map(|x| x.0).collect();
            held.let_run_only(&tids, Duration::from_millis(1))?;
        }
    }
    let (Some(dlopen), Some(dlsym), Some(dlerror)) = (
        target.libc.symbol("dlopen"),
        target.libc.symbol("dlsym"),
        target.libc.symbol("dlerror"),
    ) else {
        bail!("cannot attach to pid {pid}: its libc has no dlopen (glibc older than 2.34)");
    };
    let _ = target.libc.bias;
    // The main thread when it is held (its stack is the largest), else the first.
    let tid = held
        .threads
        .iter()
        .find(|t| t.tid == pid)
        .or(held.threads.first())
        .map(|t| t.tid)
        .context("no thread held")?;
    let page = 4096u64;
    let mmap = |held: &mut Held, prot: i32| -> Result<u64> {
        let r = held.syscall(
            tid,
            target.gadget,
            libc::SYS_mmap as u64,
            [
                0,
                page,
                prot as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
                u64::MAX,
                0,
            ],
        )?;
        if r < 0 && r > -4096 {
            bail!(
                "mmap in pid {pid} failed: {}",
                std::io::Error::from_raw_os_error(-r as i32)
            );
        }
        Ok(r as u64)
    };
    let data = mmap(&mut held, libc::PROT_READ | libc::PROT_WRITE)?;
    let code = mmap(&mut held, libc::PROT_READ | libc::PROT_EXEC)?;
    // Where the thread resumes: a system call it was interrupted in is restarted (by the
    // stub's return to the `syscall` instruction with the call's number), as the kernel
    // would have restarted it.
    let regs = held.thread(tid)?.regs;
    let mut run = regs;
    let mut ret = regs.rip;
    let err = regs.rax as i64;
    if (regs.orig_rax as i64) >= 0 && matches!(err, -512 | -513 | -514 | -516) {
        ret = regs.rip - 2;
        run.rax = if err == -516 {
            libc::SYS_restart_syscall as u64
        } else {
            regs.orig_rax
        };
    }
    run.orig_rax = u64::MAX;
    run.rip = code;
    let mut page_bytes = vec![0u8; page as usize];
    page_bytes[stub::DATA_PATH..stub::DATA_PATH + shim_s.len()].copy_from_slice(shim_s.as_bytes());
    page_bytes[stub::DATA_SYMBOL..stub::DATA_SYMBOL + entry.len()].copy_from_slice(entry);
    let args = AttachArgs::new(&settings_env());
    // SAFETY: AttachArgs is a repr(C) struct of integers and byte arrays: all its bytes are
    // initialised.
    let args_bytes = unsafe {
        std::slice::from_raw_parts(
            &args as *const AttachArgs as *const u8,
            std::mem::size_of::<AttachArgs>(),
        )
    };
    page_bytes[stub::DATA_ARGS..stub::DATA_ARGS + args_bytes.len()].copy_from_slice(args_bytes);
    held.write(data, &page_bytes)?;
    held.write(
        code,
        &stub::code(&stub::Slots {
            ret,
            data,
            dlopen,
            dlsym,
            dlerror,
            xsave,
            mode,
        }),
    )?;
    held.resume(tid, &run)?;
    heapdump_testhooks::attach_pause();
    let until = Instant::now() + STUB_TIMEOUT;
    loop {
        if held.word(data + stub::DATA_DONE as u64) == Some(1) {
            break;
        }
        held.poll(tid)?;
        if Instant::now() >= until {
            bail!(
                "pid {pid} did not finish loading the shim within {} s (stage {}); it was left running",
                STUB_TIMEOUT.as_secs(),
                held.word(data + stub::DATA_STAGE as u64).unwrap_or(0)
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let stage = held.word(data + stub::DATA_STAGE as u64).unwrap_or(0);
    let mut answer = args;
    // SAFETY: as above; the bytes read back are an AttachArgs the shim wrote (plain data).
    let answer_bytes = unsafe {
        std::slice::from_raw_parts_mut(
            &mut answer as *mut AttachArgs as *mut u8,
            std::mem::size_of::<AttachArgs>(),
        )
    };
    held.read(data + stub::DATA_ARGS as u64, answer_bytes);
    let took = started.elapsed();
    unmap_stub(&mut held, tid, target.gadget, [data, code]);
    if stage != 4 {
        let msg = held
            .word(data + stub::DATA_DLERROR as u64)
            .filter(|p| *p != 0)
            .map(|p| {
                let mut b = vec![0u8; 512];
                let n = held.read(p, &mut b);
                let end = b[..n].iter().position(|c| *c == 0).unwrap_or(n);
                String::from_utf8_lossy(&b[..end]).into_owned()
            })
            .unwrap_or_default();
        drop(held);
        let what = if stage == 1 { "dlopen" } else { "dlsym" };
        bail!("cannot attach to pid {pid}: {what} failed in the process: {msg}");
    }
    drop(held);
    Ok((answer, took))
}

//! Creating, naming and removing the region file; reading the process identity and settings.
//!
//! Region files live in a per-user directory (`/dev/shm/heapdump-UID`, or `$HEAPDUMP_DIR`)
//! with mode 0700, and are named `PID-STARTTICKS-CREATEDNS.heapdump`: the pid and start time
//! tell pid reuse apart, the creation time tells the images of one process apart across `exec`
//! (which keeps both). Files are created 0600 with `O_EXCL|O_NOFOLLOW`.
//!
//! Runs inside the first `malloc` of the process, so it allocates nothing itself (buffers are on
//! the stack) and reads its settings from `/proc/self/environ` rather than relying on libc's
//! `environ` being initialized.

use crate::sys::{map_anon, parse_size, read_file, unmap, warn};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use vmo_layout::clock::precise_ns;
use vmo_layout::v1::{plan, Capacities, WARNINGS_BYTES};
use vmo_layout::writer::Backing;
use vmo_layout::{ProcessIdentity, RegionWriter};

/// Settings read from the environment.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Region directory, NUL-terminated.
    pub dir: [u8; 512],
    /// Keep the region after a clean exit (`HEAPDUMP_KEEP=1`).
    pub keep: bool,
    /// Section sizes (`HEAPDUMP_MAX_BLOCKS`, `HEAPDUMP_MAX_STACKS`, `HEAPDUMP_MAX_THREADS`).
    pub caps: Capacities,
    /// Record nothing (`HEAPDUMP_DISABLE=1`).
    pub disabled: bool,
    /// Mean sampling interval in bytes (`HEAPDUMP_SAMPLE_INTERVAL`); 0 records every block.
    pub sample_interval: u64,
    /// Unwind by CFI (`HEAPDUMP_UNWIND=dwarf`, the default) or by frame pointers only (`fp`).
    pub dwarf: bool,
    /// CFI walks reuse the outer frames of the thread's previous capture when they are
    /// provably unchanged (`HEAPDUMP_STACK_REUSE`, default on; off walks every frame).
    pub stack_reuse: bool,
    /// The preloaded shim keeps each block's record number in a 16-byte header before the
    /// block (`HEAPDUMP_BLOCK_HEADERS`, default on; off: in the private address index, as
    /// sampling and `heapdump attach` always do). See `header`.
    pub block_headers: bool,
    /// Warnings about the settings (invalid or adjusted values), lines ending in `\n`, stored
    /// in the region's header where `heapdump list` and the profile's comments show them.
    pub warnings: [u8; WARNINGS_BYTES],
    /// Bytes used in `warnings`.
    pub warnings_len: usize,
    /// Regions of processes that are gone kept in the directory at most
    /// (`HEAPDUMP_MAX_DEAD_REGIONS`); older ones are removed when a region is created.
    pub max_dead_regions: u64,
    /// Most dead records kept for named snapshots (`HEAPDUMP_NAMED_SNAPSHOT_RECORDS`).
    pub named_hold_limit: u64,
    /// Remove node's `/tmp/perf-PID.map` along with the region at a clean exit
    /// (`HEAPDUMP_REMOVE_PERF_MAP=1`, set by `heapdump run` when it added node's perf-map
    /// flags to `NODE_OPTIONS`, which node's child processes inherit; see
    /// `state::remove_node_perf_map`).
    pub remove_perf_map: bool,
}

/// Default of [`Settings::max_dead_regions`].
pub const DEFAULT_MAX_DEAD_REGIONS: u64 = 32;

/// Longest `HEAPDUMP_DIR` accepted, bytes: room for a private subdirectory and the file name.
const DIR_MAX: usize = 440;

impl Settings {
    /// Appends a warning line made of `parts`.
    pub fn warn(&mut self, parts: &[&[u8]]) {
        let mut c = Cursor {
            buf: &mut self.warnings[..],
            len: self.warnings_len,
        };
        for p in parts {
            c.push(p);
        }
        c.push(b"\n");
        self.warnings_len = c.len;
    }

    /// The warnings written so far.
    pub fn warnings(&self) -> &[u8] {
        &self.warnings[..self.warnings_len]
    }
}

/// Reads `/proc/self/environ` and returns the settings. Invalid values are ignored (the
/// default stays) with a warning in [`Settings::warnings`]; values out of range are clamped,
/// with a warning.
/// The address the main program is mapped at (its lowest `PT_LOAD`), as `dladdr` gives an
/// object's base; 0 if not found.
fn main_program_base() -> usize {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our `usize`.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut usize)) };
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let low = (phdrs.iter())
            .filter(|p| p.p_type == libc::PT_LOAD)
            .map(|p| p.p_vaddr as usize & !4095)
            .min()
            .unwrap_or(0);
        *out = info.dlpi_addr as usize + low;
        1 // the main program is the first object: stop
    }
    let mut base = 0usize;
    // SAFETY: the callback has the right signature and receives our `usize`.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut base as *mut usize as *mut libc::c_void) };
    base
}

/// Warns (in the region's warnings) when, in a process the shim is preloaded into
/// (`LD_PRELOAD` names libheapdump), the program's `malloc` or C++ `operator new` is neither
/// the shim's nor the system's: another allocator (jemalloc, tcmalloc, mimalloc) preloaded
/// ahead of the shim, or one that defines `operator new` linked in, takes those allocations,
/// which are then not recorded — a profile that looks plausible but is empty or partial.
fn note_other_allocators(s: &mut Settings) {
    fn zeroed() -> libc::Dl_info {
        // SAFETY: all-zero is a valid Dl_info (null pointers).
        unsafe { std::mem::zeroed() }
    }
    let mut info = zeroed();
    // SAFETY: dladdr only looks an address of this object up.
    unsafe {
        libc::dladdr(
            note_other_allocators as *const () as *const libc::c_void,
            &mut info,
        )
    };
    let own_base = info.dli_fbase as usize;
    let mut note = |what: &[u8], name: &std::ffi::CStr, expected: &[&[u8]], advice: &[u8]| {
        // SAFETY: a NUL-terminated name; RTLD_DEFAULT looks in the global scope.
        let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        let mut info = zeroed();
        let mut sym: *const libc::Elf64_Sym = std::ptr::null();
        // SAFETY: dladdr1 only looks the address up; RTLD_DL_SYMENT (1) stores a pointer to
        // the symbol's table entry in `sym`.
        let found = !f.is_null()
            && unsafe {
                libc::dladdr1(
                    f,
                    &mut info,
                    &mut sym as *mut *const libc::Elf64_Sym as *mut *mut libc::c_void,
                    1,
                )
            } != 0;
        if !found || info.dli_fname.is_null() {
            return false;
        }
        // An executable's PLT entry standing for the function (non-PIC code taking its
        // address: node) is not a definition: calls still reach the shim.
        // SAFETY: dladdr1 set `sym` to the loader's symbol table entry, or left it null.
        if sym.is_null() || unsafe { (*sym).st_shndx } == 0 {
            return false;
        }
        if info.dli_fbase as usize == own_base {
            return false;
        }
        // The program's own `operator new` (forwarding to malloc, as many do) is not another
        // allocator's: its objects are recorded (helper Y, 1: the warning said they were not).
        if name == c"_Znwm" && info.dli_fbase as usize == main_program_base() {
            return false;
        }
        // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
        let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_bytes();
        let file = path.rsplit(|b| *b == b'/').next().unwrap_or(path);
        if expected.iter().any(|e| file.starts_with(e)) {
            return false;
        }
        s.warn(&[what, &file[..file.len().min(80)], advice]);
        true
    };
    if !note(
        b"malloc is another allocator's, from ",
        c"malloc",
        &[b"libc.so"],
        b": those allocations are not recorded (preload libheapdump.so first, or profile \
          with that allocator's own tools)",
    ) {
        note(
            b"C++ operator new is another allocator's, from ",
            c"_Znwm",
            &[b"libstdc++.so", b"libc++.so", b"libc++abi.so"],
            b": C++ objects (new, containers) are not recorded, only malloc's blocks (profile \
              a build without it, or with that allocator's own tools)",
        );
    }
}

pub fn settings() -> Settings {
    const ENV_MAX: usize = 1 << 20;
    let mut s = Settings {
        dir: [0; 512],
        keep: false,
        caps: Capacities::default(),
        disabled: false,
        sample_interval: 0,
        dwarf: cfg!(target_arch = "x86_64"),
        stack_reuse: true,
        block_headers: true,
        warnings: [0; WARNINGS_BYTES],
        warnings_len: 0,
        max_dead_regions: DEFAULT_MAX_DEAD_REGIONS,
        named_hold_limit: vmo_layout::v1::NAMED_HOLD_DEFAULT,
        remove_perf_map: false,
    };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let mut num = [0u8; 20];
    let mut d = Cursor::new(&mut s.dir);
    d.push(b"/dev/shm/heapdump-");
    d.push(crate::sys::fmt_u64(uid as u64, &mut num));
    let buf = map_anon(ENV_MAX);
    if buf.is_null() {
        return s;
    }
    // SAFETY: `buf` is a fresh ENV_MAX-byte mapping.
    let env = unsafe { std::slice::from_raw_parts_mut(buf, ENV_MAX) };
    let n = match env_override() {
        Some(o) => {
            let n = o.len().min(ENV_MAX);
            env[..n].copy_from_slice(&o[..n]);
            n
        }
        None => read_file(b"/proc/self/environ\0", env),
    };
    let preloaded = env[..n].split(|b| *b == 0).any(|v| {
        v.starts_with(b"LD_PRELOAD=")
            && v.windows(b"libheapdump".len()).any(|w| w == b"libheapdump")
    });
    if preloaded {
        note_other_allocators(&mut s);
    }
    for var in env[..n].split(|b| *b == 0) {
        let Some(eq) = var.iter().position(|b| *b == b'=') else {
            continue;
        };
        let (k, v) = (&var[..eq], &var[eq + 1..]);
        if !k.starts_with(b"HEAPDUMP_") {
            continue;
        }
        // What the user wrote, shortened for the warning.
        let shown = &var[..var.len().min(120)];
        match k {
            b"HEAPDUMP_DIR" if v.is_empty() => {}
            b"HEAPDUMP_DIR" if v.len() > DIR_MAX || v.contains(&0) => {
                s.disabled = true;
                warn(b"heapdump: HEAPDUMP_DIR is longer than 440 bytes; not recording\n");
            }
            b"HEAPDUMP_DIR" => {
                s.dir = [0; 512];
                s.dir[..v.len()].copy_from_slice(v);
            }
            b"HEAPDUMP_KEEP" => match flag(v) {
                Some(b) => s.keep = b,
                None => s.warn(&[shown, b" is not 1/0, true/false or yes/no: ignored"]),
            },
            b"HEAPDUMP_DISABLE" => match flag(v) {
                Some(b) => s.disabled = b,
                None => s.warn(&[shown, b" is not 1/0, true/false or yes/no: ignored"]),
            },
            b"HEAPDUMP_SAMPLE_INTERVAL" => match parse_size(v) {
                Some(x) => s.sample_interval = x,
                None => s.warn(&[
                    shown,
                    b" is not a size (e.g. 512K): every allocation recorded",
                ]),
            },
            b"HEAPDUMP_UNWIND" => {
                if v.eq_ignore_ascii_case(b"dwarf") {
                    s.dwarf = cfg!(target_arch = "x86_64");
                } else if v.eq_ignore_ascii_case(b"fp") {
                    s.dwarf = false;
                } else {
                    s.warn(&[shown, b" is neither dwarf nor fp: using dwarf"]);
                }
            }
            b"HEAPDUMP_REMOVE_PERF_MAP" => match flag(v) {
                Some(b) => s.remove_perf_map = b,
                None => s.warn(&[shown, b" is not 1/0, true/false or yes/no: ignored"]),
            },
            b"HEAPDUMP_STACK_REUSE" => match flag(v) {
                Some(b) => s.stack_reuse = b,
                None => s.warn(&[shown, b" is not 1/0, true/false or yes/no: ignored"]),
            },
            b"HEAPDUMP_BLOCK_HEADERS" => match flag(v) {
                Some(b) => s.block_headers = b,
                None => s.warn(&[shown, b" is not 1/0, true/false or yes/no: ignored"]),
            },
            b"HEAPDUMP_MAX_BLOCKS" => {
                if let Some(x) = sized(&mut s, shown, v, 64, u32::MAX as u64 - 1) {
                    s.caps.nodes = x;
                }
            }
            b"HEAPDUMP_MAX_STACKS" => {
                if let Some(x) = sized(&mut s, shown, v, 16, u32::MAX as u64 - 2) {
                    s.caps.stacks = x;
                    s.caps.frames = x * 24;
                }
            }
            b"HEAPDUMP_MAX_THREADS" => {
                if let Some(x) = sized(&mut s, shown, v, 2, 1 << 20) {
                    s.caps.threads = x;
                }
            }
            b"HEAPDUMP_NAMED_SNAPSHOT_RECORDS" => {
                if let Some(x) = sized(&mut s, shown, v, 0, u64::MAX >> 1) {
                    s.named_hold_limit = x;
                }
            }
            b"HEAPDUMP_MAX_DEAD_REGIONS" => {
                if let Some(x) = sized(&mut s, shown, v, 0, u32::MAX as u64) {
                    s.max_dead_regions = x;
                }
            }
            b"HEAPDUMP_ABLATE" => match crate::ablate::parse(v) {
                #[cfg(feature = "ablation")]
                Ok(mask) => crate::ablate::set(mask),
                #[cfg(not(feature = "ablation"))]
                Ok(_) => s.warn(&[
                    shown,
                    b": ablations need a shim built with the `ablation` feature: ignored",
                ]),
                Err(name) => s.warn(&[
                    &name[..name.len().min(64)],
                    b" is not an ablation (record, stack, table): HEAPDUMP_ABLATE ignored",
                ]),
            },
            // Read by the `heapdump` command, not the shim.
            b"HEAPDUMP_LIB" => {}
            _ if k.starts_with(b"HEAPDUMP_TEST_") => {}
            _ => s.warn(&[
                &k[..k.len().min(64)],
                b" is not a heapdump setting: ignored (see the README's list)",
            ]),
        }
    }
    // SAFETY: the mapping is ours and no longer referenced (`env` ends here).
    unsafe { unmap(buf, ENV_MAX) };
    s
}

/// The settings of a process the shim was attached to (`heapdump attach`): `NAME=VALUE` entries
/// separated by NUL bytes, as in `/proc/self/environ`, given by the collector instead of the
/// process's own environment. Address and length, 0 when unset.
static ENV_OVERRIDE: (AtomicUsize, AtomicUsize) = (AtomicUsize::new(0), AtomicUsize::new(0));

/// Makes [`settings`] read `env` (NUL-separated `NAME=VALUE` entries) instead of
/// `/proc/self/environ`: the settings `heapdump attach` passes. `env` must stay valid and
/// unchanged until the next [`settings`] call returns.
pub fn set_env_override(env: &'static [u8]) {
    ENV_OVERRIDE.1.store(env.len(), Ordering::Relaxed);
    ENV_OVERRIDE
        .0
        .store(env.as_ptr() as usize, Ordering::Release);
}

fn env_override() -> Option<&'static [u8]> {
    let p = ENV_OVERRIDE.0.load(Ordering::Acquire);
    if p == 0 {
        return None;
    }
    // SAFETY: set by set_env_override from a slice its caller keeps valid.
    Some(unsafe {
        std::slice::from_raw_parts(p as *const u8, ENV_OVERRIDE.1.load(Ordering::Relaxed))
    })
}

/// `1`/`true`/`yes` or `0`/`false`/`no`/empty (any case).
fn flag(v: &[u8]) -> Option<bool> {
    let is = |w: &[u8]| v.eq_ignore_ascii_case(w);
    if is(b"1") || is(b"true") || is(b"yes") || is(b"on") {
        Some(true)
    } else if v.is_empty() || is(b"0") || is(b"false") || is(b"no") || is(b"off") {
        Some(false)
    } else {
        None
    }
}

/// A size setting in `[lo, hi]`: invalid → `None` with a warning, out of range → clamped with
/// a warning.
fn sized(s: &mut Settings, shown: &[u8], v: &[u8], lo: u64, hi: u64) -> Option<u64> {
    let Some(x) = parse_size(v) else {
        s.warn(&[shown, b" is not a count (e.g. 1M): default kept"]);
        return None;
    };
    let c = x.clamp(lo, hi);
    if c != x {
        let mut num = [0u8; 20];
        s.warn(&[
            shown,
            b" is out of range: using ",
            crate::sys::fmt_u64(c, &mut num),
        ]);
    }
    Some(c)
}

struct Cursor<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a mut [u8]) -> Self {
        let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        Cursor { buf, len }
    }
    fn push(&mut self, s: &[u8]) {
        let n = s.len().min(self.buf.len() - 1 - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
        self.buf[self.len] = 0;
    }
}

/// A created region: the writer and the file's path (NUL-terminated).
#[derive(Debug)]
pub struct Created {
    /// The writer over the mapping.
    pub writer: RegionWriter,
    /// Path of the region file, NUL-terminated.
    pub path: [u8; 640],
    /// Executable path (for the module table), NUL-padded.
    pub exe: [u8; 1024],
    /// Length of `exe`.
    pub exe_len: usize,
}

/// Process start time in clock ticks since boot (`/proc/self/stat` field 22).
pub fn start_ticks() -> u64 {
    let mut buf = [0u8; 1024];
    let n = read_file(b"/proc/self/stat\0", &mut buf);
    let stat = &buf[..n];
    let Some(close) = stat.iter().rposition(|b| *b == b')') else {
        return 0;
    };
    stat[close + 1..]
        .split(|b| *b == b' ')
        .filter(|f| !f.is_empty())
        .nth(19)
        .and_then(parse_size)
        .unwrap_or(0)
}

/// Whether the region last created had its allocations table and stack tables made smaller
/// because its file system had little free space: then a full table is the file system's
/// doing, and is reported as such ([`table_full`]).
static REDUCED_FOR_SPACE: AtomicBool = AtomicBool::new(false);

/// Called when the allocations table or the stack table has no entry left for a block or a
/// stack: when the region was made smaller for lack of free space, `heapdump list` says the
/// file system stopped the recording (`RECORDING_FS_FULL`) rather than showing dropped
/// blocks with no reason.
#[cold]
pub fn table_full(w: &RegionWriter) {
    if REDUCED_FOR_SPACE.load(Ordering::Relaxed) {
        w.raise_recording_flag(vmo_layout::v1::RECORDING_FS_FULL);
    }
}

/// Creates the region for this process; `None` (after a one-line warning) when it cannot.
/// Notes in the region's warnings that its tables were made smaller (`why`: the limit or
/// the file system that asked for it) and to what.
fn warn_reduced(settings: &mut Settings, why: &[u8], caps: &Capacities) {
    let mut num = [0u8; 20];
    let mut num2 = [0u8; 20];
    settings.warn(&[
        why,
        b": allocations table reduced to ",
        crate::sys::fmt_u64(caps.nodes, &mut num),
        b" records, stack traces to ",
        crate::sys::fmt_u64(caps.stacks, &mut num2),
    ]);
}

pub fn create(settings: &Settings) -> Option<Created> {
    let mut settings = *settings;
    let mut dir = settings.dir;
    if !ensure_dir(&mut dir) {
        warn(b"heapdump: cannot use the region directory (not a directory owned by this user, or its private subdirectory heapdump-UID is not); not recording\n");
        return None;
    }
    let dir = &dir;
    let dir_len = dir.iter().position(|b| *b == 0)?;
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let ticks = start_ticks();
    let mut exe = [0u8; 1024];
    // SAFETY: the path is NUL-terminated and the buffer has room for len - 1 bytes.
    let exe_len = unsafe {
        libc::readlink(
            c"/proc/self/exe".as_ptr(),
            exe.as_mut_ptr() as *mut libc::c_char,
            exe.len() - 1,
        )
    }
    .max(0) as usize;
    // SAFETY: a zeroed stat buffer is valid; stat fills it on success.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the path is NUL-terminated, `st` is writable.
    unsafe { libc::stat(c"/proc/self/exe".as_ptr(), &mut st) };
    let mut cmdline = [0u8; 1024];
    let cmd_len = read_file(b"/proc/self/cmdline\0", &mut cmdline);

    remove_stale(dir, pid, ticks);
    bound_dead_regions(dir, settings.max_dead_regions);

    let mut caps = settings.caps;
    let halve = |caps: &mut Capacities| {
        caps.nodes /= 2;
        caps.stacks = (caps.stacks / 2).max(caps.stacks.min(4096));
        caps.frames = caps.stacks * 24;
        caps.python_words = (caps.python_words / 2).max(caps.python_words.min(64 << 10));
    };
    // Nor more than an eighth of the address space the program may have (`ulimit -v`,
    // RLIMIT_AS): the mapping counts against it, and the program's own `malloc` would fail
    // where it would not have without the shim.
    // SAFETY: a zeroed rlimit is valid; getrlimit fills it on success.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `rl` is writable.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut rl) } == 0
        && rl.rlim_cur != libc::RLIM_INFINITY
    {
        while plan(&caps).1 > rl.rlim_cur / 8 && caps.nodes > 4096 {
            halve(&mut caps);
        }
        if caps != settings.caps {
            warn_reduced(
                &mut settings,
                b"the address-space limit (RLIMIT_AS, ulimit -v) is low",
                &caps,
            );
        }
    }
    // Nor more than the file-size limit (`ulimit -f`, RLIMIT_FSIZE): sizing the file past it
    // raises SIGXFSZ, which kills the program.
    // SAFETY: `rl` is writable.
    if unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut rl) } == 0
        && rl.rlim_cur != libc::RLIM_INFINITY
    {
        let before = caps;
        while plan(&caps).1 > rl.rlim_cur && caps.nodes > 4096 {
            halve(&mut caps);
        }
        if plan(&caps).1 > rl.rlim_cur {
            warn(b"heapdump: the file-size limit (RLIMIT_FSIZE, ulimit -f) is below the smallest region; not recording\n");
            return None;
        }
        if caps != before {
            warn_reduced(
                &mut settings,
                b"the file-size limit (RLIMIT_FSIZE, ulimit -f) is low",
                &caps,
            );
        }
    }
    let for_limit = caps;
    // Never reserve more than the file system can hold: touching a page past a full tmpfs
    // raises SIGBUS in the target.
    // SAFETY: a zeroed statvfs buffer is valid; statvfs fills it on success.
    let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is NUL-terminated.
    if unsafe { libc::statvfs(dir.as_ptr() as *const libc::c_char, &mut vfs) } == 0 {
        let avail = vfs.f_bavail as u64 * vfs.f_frsize as u64;
        while plan(&caps).1 > avail / 2 && caps.nodes > 4096 {
            halve(&mut caps);
        }
        REDUCED_FOR_SPACE.store(caps != for_limit, Ordering::Relaxed);
        if caps != for_limit {
            warn_reduced(
                &mut settings,
                b"the region's file system has little free space",
                &caps,
            );
        }
    }
    let size = plan(&caps).1;

    let mut path = [0u8; 640];
    let mut c = Cursor::new(&mut path);
    c.push(&dir[..dir_len]);
    c.push(b"/");
    let mut name = [0u8; vmo_layout::name::MAX_LEN];
    let name_len = vmo_layout::name::format(
        &vmo_layout::name::RegionName {
            pid,
            start_ticks: ticks,
            created_ns: precise_ns(),
        },
        &mut name,
    );
    c.push(&name[..name_len]);

    // SAFETY: `path` is NUL-terminated; flags create a new file, refusing symlinks.
    let fd = unsafe {
        libc::open(
            path.as_ptr() as *const libc::c_char,
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        warn(b"heapdump: cannot create the region file; not recording\n");
        return None;
    }
    // Whether the file is on a tmpfs (see `Backing::populate`).
    let shmem = {
        let mut fs: libc::statfs = unsafe_zeroed_statfs();
        // SAFETY: `fd` is our open file; `fs` is a writable statfs.
        let r = unsafe { libc::fstatfs(fd, &mut fs) };
        r == 0 && fs.f_type == libc::TMPFS_MAGIC
    };
    // SAFETY: fd is our open file.
    let p = unsafe {
        if libc::ftruncate(fd, size as libc::off_t) != 0 {
            libc::close(fd);
            libc::unlink(path.as_ptr() as *const libc::c_char);
            warn(b"heapdump: cannot size the region file; not recording\n");
            return None;
        }
        let p = libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
            fd,
            0,
        );
        // On a tmpfs the descriptor is kept to reserve pages with `fallocate` (see
        // `Backing::set_file`); it is close-on-exec.
        if p == libc::MAP_FAILED || !shmem {
            libc::close(fd);
        }
        p
    };

    if p == libc::MAP_FAILED {
        // SAFETY: `path` is NUL-terminated.
        unsafe { libc::unlink(path.as_ptr() as *const libc::c_char) };
        warn(b"heapdump: cannot map the region file; not recording\n");
        return None;
    }
    // The header is written now: its page needs storage first (the rest is reserved as the
    // region grows, see `Backing`).
    // SAFETY: `p` maps at least one page of the region.
    if !unsafe { Backing::populate(p as *mut u8, 4096, shmem) } {
        // SAFETY: the mapping and (on a tmpfs) the descriptor are ours and unused; `path` is
        // NUL-terminated.
        unsafe {
            libc::munmap(p, size as usize);
            libc::unlink(path.as_ptr() as *const libc::c_char);
            if shmem {
                libc::close(fd);
            }
        }
        warn(b"heapdump: the region directory's file system is full; not recording\n");
        return None;
    }
    let id = ProcessIdentity {
        pid,
        start_ticks: ticks,
        exe_dev: st.st_dev,
        exe_ino: st.st_ino,
        exe_path: &exe[..exe_len],
        cmdline: &cmdline[..cmd_len],
        sample_interval: settings.sample_interval,
    };
    // SAFETY: `p` is a fresh, zero-filled, page-aligned shared mapping of `size` bytes that we
    // never unmap.
    let Some(mut writer) = (unsafe { RegionWriter::create(p as *mut u8, size, &caps, &id) }) else {
        if shmem {
            // SAFETY: our descriptor, not handed to anything.
            unsafe { libc::close(fd) };
        }
        return None;
    };
    // Two reservation states, used in turn: a forked child creates its region while the
    // parent's (which it copies from) is still in use.
    static BACKINGS: [Backing; 2] = [Backing::new(), Backing::new()];
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let k = NEXT.fetch_add(1, Ordering::Relaxed) % 2;
    let backing = &BACKINGS[k];
    writer.set_backing(backing);
    // The other state is the parent's region's when this is a forked child: its file stays
    // open only in the parent.
    BACKINGS[(k + 1) % 2].release_file();
    if shmem {
        backing.set_shmem();
        if let Some((kept, dev, ino)) = keep_high(fd) {
            backing.set_file(kept, dev, ino);
        }
    }
    // SAFETY: the region is not published yet and only this thread knows the writer.
    unsafe { writer.set_warnings(settings.warnings()) };
    // SAFETY: as above.
    unsafe { writer.set_named_hold_limit(settings.named_hold_limit) };
    Some(Created {
        writer,
        path,
        exe,
        exe_len,
    })
}

/// Lowest descriptor number the region file is kept at ([`keep_high`]).
const KEPT_FD_MIN: libc::c_int = 900;

/// Moves the region file's descriptor `fd` (which this closes) out of the way of the
/// program's own, to the lowest free number from [`KEPT_FD_MIN`] on, close-on-exec: a program
/// that expects `open` to return 3, or numbers its descriptors from there, sees no
/// difference. Returns the new descriptor with the file's device and inode; `None` (nothing
/// kept) when the descriptor limit is too low for that.
fn keep_high(fd: libc::c_int) -> Option<(libc::c_int, u64, u64)> {
    // SAFETY: F_DUPFD_CLOEXEC on our own descriptor; then `fd` is ours to close.
    let high = unsafe {
        let high = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, KEPT_FD_MIN);
        libc::close(fd);
        high
    };
    if high < 0 {
        return None;
    }
    // SAFETY: an all-zero `stat` is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `high` is our descriptor; `st` is writable.
    if unsafe { libc::fstat(high, &mut st) } != 0 {
        // SAFETY: as above.
        unsafe { libc::close(high) };
        return None;
    }
    Some((high, st.st_dev, st.st_ino))
}

/// Makes `dir` (NUL-terminated) a usable region directory: a real directory owned by this
/// user that nobody else may enter (mode `& 077 == 0`). It is created 0700 if missing. The
/// mode of an existing directory is never changed (it may be the user's own, or a shared one
/// such as `/tmp`): when it is not private but is this user's own or a sticky directory of
/// root's (where nobody else can rename what we create), the private subdirectory
/// `heapdump-UID` inside it is used instead (created 0700, and it must pass the same checks),
/// and `dir` is rewritten to name it. A directory of another user's is refused. The collector makes the same choice (`regions::region_dir`). False when neither
/// can be used.
fn ensure_dir(dir: &mut [u8; 512]) -> bool {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    // (private to us, may hold a subdirectory of ours safely)
    let check = |d: &[u8; 512]| -> Option<(bool, bool)> {
        let p = d.as_ptr() as *const libc::c_char;
        // SAFETY: `d` is NUL-terminated.
        unsafe { libc::mkdir(p, 0o700) };
        // SAFETY: a zeroed stat is valid; lstat does not follow a symlink.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::lstat(p, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return None;
        }
        let ours = st.st_uid == uid;
        // Nobody else can rename or remove what we create in it: it is ours, or it is a
        // sticky directory of root's (such as /tmp).
        let safe_parent = ours || (st.st_uid == 0 && st.st_mode & libc::S_ISVTX != 0);
        Some((ours && st.st_mode & 0o077 == 0, safe_parent))
    };
    match check(dir) {
        None | Some((false, false)) => false,
        Some((true, _)) => true,
        Some((false, true)) => {
            let mut num = [0u8; 20];
            let mut c = Cursor::new(dir);
            c.push(b"/heapdump-");
            c.push(crate::sys::fmt_u64(uid as u64, &mut num));
            matches!(check(dir), Some((true, _)))
        }
    }
}

/// Keeps at most `max` regions of processes that are gone in `dir`, removing the oldest
/// (by creation time, from the name) first: a service that crash-loops would otherwise leave
/// one region per crash in RAM-backed `/dev/shm`. A region's process is gone when
/// `/proc/PID/stat` is missing or shows another start time. Also removes every region set
/// aside for an exec (`….heapdump.exec`, exec.rs) whose process is gone or no longer maps it.
/// Runs once, at start-up, as the shim's own work (it may allocate).
fn bound_dead_regions(dir: &[u8; 512], max: u64) {
    // SAFETY: `dir` is NUL-terminated.
    let d = unsafe { libc::opendir(dir.as_ptr() as *const libc::c_char) };
    if d.is_null() {
        return;
    }
    let mut dead: Vec<(u64, std::ffi::CString)> = Vec::new();
    loop {
        // SAFETY: `d` is an open directory stream.
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        let Some((pid, ticks, created)) = parse_region_name(name.to_bytes()) else {
            continue;
        };
        if name.to_bytes().ends_with(b".exec") {
            // Renamed aside for an exec (exec.rs): the exec succeeded when the process no
            // longer maps it, or the process is gone. Nobody lists it, so it goes at once.
            if !alive(pid, ticks) || !maps_name(pid, name.to_bytes()) {
                // SAFETY: `d` is open; the name is NUL-terminated and relative to it.
                unsafe { libc::unlinkat(libc::dirfd(d), (*e).d_name.as_ptr(), 0) };
            }
            continue;
        }
        if !alive(pid, ticks) {
            dead.push((created, name.to_owned()));
        }
    }
    if dead.len() as u64 > max {
        dead.sort();
        let extra = dead.len() - max as usize;
        for (_, name) in &dead[..extra] {
            // SAFETY: `d` is open; the name is NUL-terminated and relative to it.
            unsafe { libc::unlinkat(libc::dirfd(d), name.as_ptr(), 0) };
        }
    }
    // SAFETY: `d` is open.
    unsafe { libc::closedir(d) };
}

/// `PID-TICKS-NS.heapdump` → (pid, start ticks, creation ns); also a region renamed aside
/// for an `exec` (`PID-TICKS-NS.heapdump.exec`, see `exec.rs`), which a process killed during
/// its exec leaves behind. The rule is `vmo_layout::name`'s, shared with the collector.
fn parse_region_name(name: &[u8]) -> Option<(u64, u64, u64)> {
    let n = vmo_layout::name::parse_with_aside(name)?;
    Some((u64::from(n.pid), n.start_ticks, n.created_ns))
}

/// Whether process `pid` exists and started at `ticks`.
fn alive(pid: u64, ticks: u64) -> bool {
    let mut path = [0u8; 40];
    let mut num = [0u8; 20];
    let mut c = Cursor::new(&mut path);
    c.push(b"/proc/");
    c.push(crate::sys::fmt_u64(pid, &mut num));
    c.push(b"/stat");
    let len = c.len + 1;
    let mut buf = [0u8; 1024];
    let n = read_file(&path[..len], &mut buf);
    let stat = &buf[..n];
    let Some(close) = stat.iter().rposition(|b| *b == b')') else {
        return false;
    };
    stat[close + 1..]
        .split(|b| *b == b' ')
        .filter(|f| !f.is_empty())
        .nth(19)
        .and_then(parse_size)
        == Some(ticks)
}

/// Whether `/proc/PID/maps` names a file called `name` (a region set aside for an exec:
/// its name, with pid, start time and creation time, is unique). True when the list cannot be
/// read (another user's process): the file is then left to the rule for processes gone.
fn maps_name(pid: u64, name: &[u8]) -> bool {
    let mut path = [0u8; 40];
    let mut num = [0u8; 20];
    let mut c = Cursor::new(&mut path);
    c.push(b"/proc/");
    c.push(crate::sys::fmt_u64(pid, &mut num));
    c.push(b"/maps");
    // SAFETY: `path` is NUL-terminated (zeroed beyond the cursor).
    let fd = unsafe {
        libc::open(
            path.as_ptr() as *const libc::c_char,
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return true;
    }
    // A window that keeps the last `name.len() - 1` bytes of the previous read, so that a
    // name split between two reads is still found.
    let mut buf = [0u8; 4096 + 512];
    let keep = name.len().saturating_sub(1).min(512);
    let mut have = 0usize;
    let mut found = false;
    loop {
        // SAFETY: reads into the free part of `buf`.
        let n = unsafe {
            libc::read(
                fd,
                buf[have..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - have,
            )
        };
        // SAFETY: errno is this thread's.
        if n < 0 && unsafe { *libc::__errno_location() } == libc::EINTR {
            continue;
        }
        if n < 0 {
            found = true;
            break;
        }
        if n == 0 {
            break;
        }
        have += n as usize;
        if buf[..have].windows(name.len()).any(|w| w == name) {
            found = true;
            break;
        }
        let tail = have.min(keep);
        buf.copy_within(have - tail..have, 0);
        have = tail;
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    found
}

/// Removes regions left by earlier images of this same process (before an `exec`).
fn remove_stale(dir: &[u8; 512], pid: u32, ticks: u64) {
    let mut prefix = [0u8; 48];
    let mut num = [0u8; 20];
    let mut c = Cursor::new(&mut prefix);
    c.push(crate::sys::fmt_u64(pid as u64, &mut num));
    c.push(b"-");
    c.push(crate::sys::fmt_u64(ticks, &mut num));
    c.push(b"-");
    let plen = c.len;
    // SAFETY: `dir` is NUL-terminated; opendir may allocate, which the reentrancy guard routes
    // straight to glibc.
    let d = unsafe { libc::opendir(dir.as_ptr() as *const libc::c_char) };
    if d.is_null() {
        return;
    }
    loop {
        // SAFETY: `d` is an open directory stream.
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) }.to_bytes();
        if name.starts_with(&prefix[..plen])
            && (name.ends_with(b".heapdump") || name.ends_with(b".heapdump.exec"))
        {
            // SAFETY: `d` is open; unlinkat takes a NUL-terminated name relative to it.
            unsafe { libc::unlinkat(libc::dirfd(d), (*e).d_name.as_ptr(), 0) };
        }
    }
    // SAFETY: `d` is open.
    unsafe { libc::closedir(d) };
}

/// A zeroed `statfs` (plain integers: all-zero is a valid value).
fn unsafe_zeroed_statfs() -> libc::statfs {
    // SAFETY: `statfs` is a C struct of integers, for which all-zero bytes are valid.
    unsafe { std::mem::zeroed() }
}

//! CPython: every object allocation recorded, and Python frames in every stack, with no flag.
//!
//! * **Detection** ([`detect`], from the preload constructor and after each `dlopen`): the
//!   interpreter's symbols are looked up with `dlsym` (a static `python3` exports them, a
//!   shared `libpython` too); CPython 3.6 to 3.13 (not free-threaded) are supported, 3.6 to
//!   3.10 found by `Py_GetVersion()` (they have no `Py_Version`). A process without them is
//!   left alone: its allocations cost one relaxed load more.
//! * **Installation** ([`poll`], on an allocation): once `Py_IsInitialized()` and the calling
//!   thread holds the GIL (`PyGILState_Check()`), the MEM and OBJ allocator domains are wrapped
//!   (`PyMem_GetAllocator`/`PyMem_SetAllocator`, as CPython's `Doc/c-api/memory.rst` allows
//!   after initialization): each wrapper forwards to the saved original with the shim's guard
//!   held ([`crate::state::forwarding`]), so the `malloc` under a large request is not recorded
//!   twice, then records the block; realloc is a free and an allocation. Frees, and reallocs
//!   of blocks that have a record, are still recorded inside the forwarded call: they are the
//!   interpreter's own tables (pymalloc's `arenas` array, first allocated during
//!   initialization and grown by `realloc` inside an object allocation), whose old record would
//!   otherwise stay live and show as a leak. pymalloc keeps serving the program. Blocks
//!   pymalloc handed out before are unknown frees (ignored).
//! * **Frames** ([`splice`], on every recorded allocation once installed): the calling thread's
//!   frame chain (`PyGILState_GetThisThreadState()`, then `cframe->current_frame` on 3.11 and
//!   3.12, `current_frame` on 3.13 from `_Py_DebugOffsets`, `frame` on 3.6–3.10) is read and
//!   each native frame of `_PyEval_EvalFrameDefault` gets the Python frames of its run spliced
//!   in below it (3.11: up to the frame marked `is_entry`; 3.12+: up to the C-stack-owned shim
//!   frame; 3.6–3.10: one `PyFrameObject` a run, linked by `f_back`), as py-spy and memray do. A Python frame is stored as [`vmo_layout::v1::PYTHON_FRAME`]: its code
//!   record (qualified name, file, first line, line table — written to the region the first
//!   time the code object is seen, so post-mortem snapshots keep names) and the instruction
//!   executing.
//! * **Whole stacks again** ([`find_stack`], [`keep_stack`]): a capture that repeats one the
//!   thread made recently (the same native words, the same interpreter memory read in the same
//!   order) takes that capture's stack id without walking, splicing or interning; see
//!   [`StackMemo`].
//!
//! Interpreter memory is read only along the calling thread's own frame chain, which only that
//! thread changes: every pointer is checked (non-null, aligned, user-space), every code object
//! must have `PyCode_Type` as its type, strings `PyUnicode_Type`, line tables `PyBytes_Type`,
//! and every loop is bounded.

use crate::state::{self, Global, Tls};
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use vmo_layout::v1::{
    MAX_FRAMES, PYTHON_EVAL_FRAME, PYTHON_FRAME, PYTHON_RECORD_MAX_WORDS, PYTHON_RECORD_PUBLISHED,
    PYTHON_RECORD_WORDS,
};

/// [`STATE`]: not looked for yet.
const UNKNOWN: u8 = 0;
/// [`STATE`]: no supported CPython in the process (looked for again after a `dlopen`).
const ABSENT: u8 = 1;
/// [`STATE`]: CPython found, waiting for it to be initialized.
const DETECTED: u8 = 2;
/// [`STATE`]: a thread is wrapping the allocator domains.
const INSTALLING: u8 = 3;
/// [`STATE`]: the domains are wrapped; stacks get Python frames.
const ACTIVE: u8 = 4;
/// [`STATE`]: the domains are wrapped, on a CPython whose frames the shim cannot read (a 3.6–3.10
/// that exports no `PyFrame_Type`): objects are recorded with their native stacks only.
const OBJECTS_ONLY: u8 = 5;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// CPython's `PyMemAllocatorEx`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct PyMemAllocatorEx {
    pub(crate) ctx: *mut c_void,
    pub(crate) malloc: Option<unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void>,
    pub(crate) calloc: Option<unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void>,
    pub(crate) realloc:
        Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void>,
    pub(crate) free: Option<unsafe extern "C" fn(*mut c_void, *mut c_void)>,
}

/// The recording wrappers installed as each domain's allocator (in `hooks`, which records;
/// passed in so that this module does not import it). Their `ctx` is the domain's saved
/// original allocator ([`orig`]).
#[derive(Clone, Copy)]
pub(crate) struct Wrappers {
    pub(crate) malloc: unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void,
    pub(crate) calloc: unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void,
    pub(crate) realloc: unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void,
    pub(crate) free: unsafe extern "C" fn(*mut c_void, *mut c_void),
}

const PYMEM_DOMAIN_RAW: c_int = 0;
const PYMEM_DOMAIN_MEM: c_int = 1;
const PYMEM_DOMAIN_OBJ: c_int = 2;

/// Where the fields the shim reads lie, for one CPython minor version (bytes).
#[derive(Clone, Copy, Default)]
struct Offsets {
    /// 3.11/3.12: `PyThreadState.cframe`, then `_PyCFrame.current_frame`; 3.13:
    /// `PyThreadState.current_frame` directly (`cframe` is `None`).
    cframe: Option<usize>,
    current_frame: usize,
    f_code: usize,
    f_previous: usize,
    /// `prev_instr` (3.11, 3.12) or `instr_ptr` (3.13): the instruction executing.
    f_instr: usize,
    f_owner: usize,
    /// 3.11: `is_entry`; 3.12+ mark runs with a frame owned by the C stack instead.
    f_is_entry: Option<usize>,
    co_adaptive: usize,
    co_qualname: usize,
    co_filename: usize,
    co_firstlineno: usize,
    co_linetable: usize,
    /// `sizeof(PyASCIIObject)` and `sizeof(PyCompactUnicodeObject)`.
    ascii_size: usize,
    compact_size: usize,
    /// 3.6–3.10: frames are `PyFrameObject`s (`f_back`, `f_code`, `f_lasti` as an `int`), one
    /// per run of the eval loop; each is checked to be of `PyFrame_Type` (the word at 8, read
    /// where 3.11+ read `owner`) before its fields are used. `f_instr` is then `f_lasti`'s
    /// offset, `co_qualname` that of `co_name` (these versions keep no qualified name in the
    /// code object) and `co_linetable` that of `co_lnotab` (3.6–3.9) or `co_linetable` (3.10).
    frame_objects: bool,
    /// 3.6–3.9: `f_lasti` counts bytes (two a code unit); 3.10 counts code units.
    lasti_bytes: bool,
}

/// The frame and code object layouts of CPython 3.6 to 3.10 (x86-64 and aarch64, LP64): from
/// their `Include/frameobject.h`, `Include/code.h` (`Include/cpython/…` in 3.8+) and
/// `Include/cpython/pystate.h`, checked against the official builds of 3.6.15, 3.7.16,
/// 3.8.18, 3.9.18 and 3.10.13 by reading live frames and code objects with `ctypes`.
/// `PyThreadState.frame` is at 24 and `f_back`, `f_code` at 24, 32 in all of them; the
/// strings are laid out as in 3.11 (`PyASCIIObject` 48 bytes, `PyCompactUnicodeObject` 72).
fn older_offsets(minor: u8) -> Option<Offsets> {
    // (f_lasti, co_filename, co_name, co_lnotab or co_linetable, co_firstlineno)
    let (lasti, filename, name, table, first) = match minor {
        6 => (120, 96, 104, 112, 36),
        7 => (104, 96, 104, 112, 36),
        8 | 9 => (104, 104, 112, 120, 40),
        10 => (96, 104, 112, 120, 40),
        _ => return None,
    };
    Some(Offsets {
        cframe: None,
        current_frame: 24,
        f_code: 32,
        f_previous: 24,
        f_instr: lasti,
        f_owner: 8,
        f_is_entry: None,
        co_adaptive: 0,
        co_qualname: name,
        co_filename: filename,
        co_firstlineno: first,
        co_linetable: table,
        ascii_size: 48,
        compact_size: 72,
        frame_objects: true,
        lasti_bytes: minor < 10,
    })
}

/// `FRAME_OWNED_BY_CSTACK` (3.12+).
const OWNED_BY_CSTACK: u8 = 3;

/// What detection found; written once before [`STATE`] becomes [`DETECTED`] (Release).
#[derive(Clone, Copy)]
struct Py {
    minor: u8,
    get_allocator: unsafe extern "C" fn(c_int, *mut PyMemAllocatorEx),
    set_allocator: unsafe extern "C" fn(c_int, *mut PyMemAllocatorEx),
    is_initialized: unsafe extern "C" fn() -> c_int,
    gil_check: unsafe extern "C" fn() -> c_int,
    this_thread_state: unsafe extern "C" fn() -> *mut c_void,
    /// `[eval_lo, eval_hi)`: the code of `_PyEval_EvalFrameDefault`.
    eval_lo: u64,
    eval_hi: u64,
    code_type: usize,
    unicode_type: usize,
    bytes_type: usize,
    /// `PyFrame_Type` (0 when not looked for: 3.11+, whose frames are not objects).
    frame_type: usize,
    off: Offsets,
    /// Whether `off` holds the layout of this version's frames; otherwise only the allocator
    /// domains are wrapped ([`OBJECTS_ONLY`]).
    frames: bool,
    /// The RAW domain's allocator as the interpreter starts it, read at detection (before
    /// `Py_Initialize` applies `PYTHONMALLOC` or any hook): `[ctx, malloc, calloc, realloc,
    /// free]`, CPython's own `_PyMem_RawMalloc` family, which calls glibc's (see
    /// [`glibc_domain`]).
    raw_default: [usize; 5],
}

struct Cell<T>(UnsafeCell<Option<T>>);
// SAFETY: written by one thread (under the state machine: UNKNOWN/ABSENT -> DETECTED, or
// DETECTED -> INSTALLING) before a Release store of STATE; read after an Acquire load of it.
unsafe impl<T> Sync for Cell<T> {}

static PY: Cell<Py> = Cell(UnsafeCell::new(None));
/// The original allocators of the MEM and OBJ domains; our wrappers' `ctx` points at them.
static ORIG_MEM: Cell<PyMemAllocatorEx> = Cell(UnsafeCell::new(None));
static ORIG_OBJ: Cell<PyMemAllocatorEx> = Cell(UnsafeCell::new(None));

/// The object domain wrappers' `ctx` (0 before installation) and `PyCode_Type`'s address, for
/// [`note_free`].
static OBJ_CTX: AtomicUsize = AtomicUsize::new(0);
static CODE_TYPE: AtomicUsize = AtomicUsize::new(0);

/// Code objects the wrappers saw freed (see [`note_free`]): while this count stays the same,
/// a code object at a given address is the one that was there when the count was read, which
/// lets the memos of frames ([`FrameMemo`]) and stacks ([`StackMemo`]) know a code object by
/// its address without reading its identity words (four reads in its own cache lines, a
/// Python frame).
static CODE_DEATHS: AtomicU64 = AtomicU64::new(0);

/// Counts `ptr` in [`CODE_DEATHS`] if it is a code object handed to the object domain's free
/// (or moved by its realloc): called by the wrappers before they forward the call, so before
/// another object can be made at that address.
///
/// Why this sees every code object that dies once the wrappers are installed (and memos exist
/// only after that): CPython frees code objects with `PyObject_Free` (`code_dealloc`,
/// `Objects/codeobject.c`; they are not tracked by the cyclic GC, so the block starts at the
/// object), which calls the object domain's allocator, ours or a hook chained to it
/// (tracemalloc's, the debug hooks). An embedder that replaced the allocator without calling
/// ours would also hide its objects from the recording.
///
/// # Safety
/// `ptr` is null or a block handed to the wrapped object domain's free or realloc. Such blocks
/// hold at least 16 bytes on the versions the wrappers are installed for (3.11+: pymalloc's
/// 16-byte alignment, glibc's 24-byte minimum, the debug hooks' guard bytes), so the word at
/// `ptr + 8` (`ob_type` of an object) is the block's own.
#[inline(always)]
pub(crate) unsafe fn note_free(ctx: *mut c_void, ptr: *mut c_void) {
    if ctx as usize == OBJ_CTX.load(Ordering::Relaxed)
        && !ptr.is_null()
        // SAFETY: the caller's contract.
        && unsafe { rd(ptr as usize, 8) } == CODE_TYPE.load(Ordering::Relaxed)
    {
        CODE_DEATHS.fetch_add(1, Ordering::Release);
    }
}

/// [`CODE_DEATHS`] now (Acquire: a code object made at an address after a death there is
/// seen with that death counted).
#[inline(always)]
fn code_deaths() -> u64 {
    CODE_DEATHS.load(Ordering::Acquire)
}

fn py() -> Option<&'static Py> {
    if STATE.load(Ordering::Acquire) < DETECTED {
        return None;
    }
    // SAFETY: see `Cell`: written before STATE reached DETECTED, never written again.
    unsafe { (*PY.0.get()).as_ref() }
}

extern "C" {
    fn dladdr1(
        addr: *const c_void,
        info: *mut libc::Dl_info,
        extra: *mut *mut c_void,
        flags: c_int,
    ) -> c_int;
}
const RTLD_DL_SYMENT: c_int = 1;

fn sym(name: &std::ffi::CStr) -> usize {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches the global scope.
    let a = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize };
    if a == 0 {
        // A program that reads dlerror() without clearing it first must not see our lookup.
        // SAFETY: dlerror has no preconditions; it clears the thread's error state.
        unsafe { libc::dlerror() };
    }
    a
}

/// Looks for a supported CPython in the process (see the module documentation). Call where
/// the loader lock may be taken: the preload constructor, after `dlopen`. Cheap after the
/// first success.
pub fn detect() {
    let s = STATE.load(Ordering::Acquire);
    if s != UNKNOWN && s != ABSENT {
        return;
    }
    if state::global().is_none() {
        return;
    }
    // dlsym may allocate (its error string): the shim's own work.
    let found = state::internal_work(find);
    match found {
        Some(p) => {
            // SAFETY: only this thread writes PY, before the Release store below; no reader
            // looks before STATE is DETECTED (detection runs in the constructor or after a
            // dlopen, never concurrently with itself: the loader serializes both).
            unsafe { *PY.0.get() = Some(p) };
            set_state(DETECTED);
        }
        None => set_state(ABSENT),
    }
}

fn find() -> Option<Py> {
    let version = sym(c"Py_Version");
    if version == 0 {
        // Before 3.11: the allocator domains (`PyMem_SetAllocator`, 3.4+ with
        // `PyMemAllocatorEx` since 3.5), `_PyEval_EvalFrameDefault` (3.6+) and frame objects.
        let minor = older_minor()?;
        return match older_offsets(minor) {
            Some(off) => with_offsets(minor, off, true),
            None => with_offsets(minor, Offsets::default(), false),
        };
    }
    // SAFETY: `Py_Version` is CPython's `const unsigned long` (3.11+).
    let v: u64 = unsafe { *(version as *const std::ffi::c_ulong) };
    let (major, minor) = ((v >> 24) & 0xff, ((v >> 16) & 0xff) as u8);
    if major != 3 {
        return None;
    }
    let off = match minor {
        // From CPython 3.11's and 3.12's internal headers (pycore_frame.h, pycore_code.h,
        // cpython/unicodeobject.h), x86-64 and aarch64 (LP64); the same for every patch
        // release (checked against 3.11.2, 3.11.7, 3.12.1).
        11 => Offsets {
            cframe: Some(56),
            current_frame: 8,
            f_code: 32,
            f_previous: 48,
            f_instr: 56,
            f_owner: 69,
            f_is_entry: Some(68),
            co_adaptive: 184,
            co_qualname: 128,
            co_filename: 112,
            co_firstlineno: 72,
            co_linetable: 136,
            ascii_size: 48,
            compact_size: 72,
            ..Offsets::default()
        },
        12 => Offsets {
            cframe: Some(56),
            current_frame: 0,
            f_code: 0,
            f_previous: 8,
            f_instr: 56,
            f_owner: 70,
            f_is_entry: None,
            co_adaptive: 192,
            co_qualname: 128,
            co_filename: 112,
            co_firstlineno: 68,
            co_linetable: 136,
            ascii_size: 40,
            compact_size: 56,
            ..Offsets::default()
        },
        13 => debug_offsets(v)?,
        _ => return None,
    };
    with_offsets(minor, off, true)
}

/// CPython 3.6 to 3.10, from `Py_GetVersion()` (`"3.8.18 (default, …) [GCC …]"`), which only
/// formats compile-time strings into a static buffer and may be called before
/// `Py_Initialize`; `None` for anything else (no such function, 2.x, 3.5 and older, 3.11+,
/// which `Py_Version` names).
pub(crate) fn older_minor() -> Option<u8> {
    let get = sym(c"Py_GetVersion");
    if get == 0 {
        return None;
    }
    // SAFETY: `Py_GetVersion` is CPython's `const char *Py_GetVersion(void)` (every 3.x).
    let get = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn() -> *const i8>(get) };
    // SAFETY: as above: a pointer to a NUL-terminated static buffer (or null, refused).
    let text = unsafe { get() };
    if text.is_null() {
        return None;
    }
    // SAFETY: NUL-terminated (as above); read up to the first bytes that decide.
    let text = unsafe { std::ffi::CStr::from_ptr(text) }.to_bytes();
    let rest = text.strip_prefix(b"3.")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 2 || rest.get(digits) != Some(&b'.') {
        return None;
    }
    let minor: u8 = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    (6..=10).contains(&minor).then_some(minor)
}

/// The rest of [`find`] for CPython 3.`minor` with frame layout `off` (`frames`: known).
fn with_offsets(minor: u8, off: Offsets, frames: bool) -> Option<Py> {
    let f = |name: &std::ffi::CStr| Some(sym(name)).filter(|&a| a != 0);
    let eval = f(c"_PyEval_EvalFrameDefault")?;
    // SAFETY: Dl_info is plain data (pointers), valid when zeroed.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut extra: *mut c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 fills `info` and points `extra` at the ELF symbol of `eval`.
    let ok = unsafe { dladdr1(eval as *const c_void, &mut info, &mut extra, RTLD_DL_SYMENT) };
    if ok == 0 || extra.is_null() {
        return None;
    }
    // SAFETY: with RTLD_DL_SYMENT, `extra` points at the symbol's `Elf64_Sym`.
    let size = unsafe { (*(extra as *const libc::Elf64_Sym)).st_size };
    if size == 0 {
        return None;
    }
    type Allocator = unsafe extern "C" fn(c_int, *mut PyMemAllocatorEx);
    type Flag = unsafe extern "C" fn() -> c_int;
    type ThreadState = unsafe extern "C" fn() -> *mut c_void;
    // SAFETY: as below.
    let get_allocator =
        unsafe { std::mem::transmute::<usize, Allocator>(f(c"PyMem_GetAllocator")?) };
    let mut raw = PyMemAllocatorEx {
        ctx: std::ptr::null_mut(),
        malloc: None,
        calloc: None,
        realloc: None,
        free: None,
    };
    // SAFETY: PyMem_GetAllocator may be called before the interpreter is initialized (the
    // RAW domain needs no GIL; Doc/c-api/memory.rst); `raw` is a valid out-parameter.
    unsafe { get_allocator(PYMEM_DOMAIN_RAW, &mut raw) };
    let raw_default = allocator_words(&raw);
    // SAFETY: each address is the named CPython function, whose C signature is the one
    // transmuted to (Include/pymem.h, pylifecycle.h, pystate.h).
    unsafe {
        Some(Py {
            minor,
            raw_default,
            get_allocator,
            set_allocator: std::mem::transmute::<usize, Allocator>(f(c"PyMem_SetAllocator")?),
            is_initialized: std::mem::transmute::<usize, Flag>(f(c"Py_IsInitialized")?),
            gil_check: std::mem::transmute::<usize, Flag>(f(c"PyGILState_Check")?),
            this_thread_state: std::mem::transmute::<usize, ThreadState>(f(
                c"PyGILState_GetThisThreadState",
            )?),
            eval_lo: eval as u64,
            eval_hi: eval as u64 + size,
            code_type: f(c"PyCode_Type")?,
            unicode_type: f(c"PyUnicode_Type")?,
            bytes_type: f(c"PyBytes_Type")?,
            frame_type: if off.frame_objects {
                sym(c"PyFrame_Type")
            } else {
                0
            },
            off,
            // Frame objects are told by their type: without it, objects only.
            frames: frames && (!off.frame_objects || sym(c"PyFrame_Type") != 0),
        })
    }
}

/// 3.13: the offsets CPython publishes for debuggers at the start of `_PyRuntime`
/// (`_Py_DebugOffsets`, Include/internal/pycore_runtime.h), checked: cookie `xdebugpy`, the
/// same version as `Py_Version`, not free-threaded.
fn debug_offsets(version: u64) -> Option<Offsets> {
    let rt = sym(c"_PyRuntime");
    if rt == 0 {
        return None;
    }
    // SAFETY: `_PyRuntime` starts with `_Py_DebugOffsets`, 64-bit words after the 8-byte
    // cookie; the words read (up to index 45) lie within it in 3.13.
    let w = |i: usize| unsafe { *(rt as *const u64).add(i) } as usize;
    // SAFETY: as above: the cookie is the first 8 bytes.
    let cookie = unsafe { *(rt as *const [u8; 8]) };
    if &cookie != b"xdebugpy" || (w(1) as u64) >> 16 != version >> 16 || w(2) != 0 {
        return None;
    }
    let o = Offsets {
        cframe: None,
        current_frame: w(23),
        f_code: w(30),
        f_previous: w(29),
        f_instr: w(31),
        f_owner: w(33),
        f_is_entry: None,
        co_adaptive: w(43),
        co_qualname: w(37),
        co_filename: w(35),
        co_firstlineno: w(39),
        co_linetable: w(38),
        ascii_size: 40,
        compact_size: 56,
        ..Offsets::default()
    };
    // Anything beyond a few hundred bytes is not a layout this code understands.
    let all = [
        o.current_frame,
        o.f_code,
        o.f_previous,
        o.f_instr,
        o.f_owner,
        o.co_adaptive,
        o.co_qualname,
        o.co_filename,
        o.co_firstlineno,
        o.co_linetable,
    ];
    all.iter().all(|&x| x < 4096).then_some(o)
}

/// After a `dlclose`: when the interpreter's code is no longer mapped (an embedding program
/// unloaded `libpython`), stop calling into it. Call where the loader lock may be taken.
pub fn forget_if_unloaded() {
    let Some(py) = py() else { return };
    // SAFETY: a zeroed Dl_info is a valid out-parameter; dladdr only reads the loader's list.
    let mapped = unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        libc::dladdr(py.is_initialized as *const c_void, &mut info) != 0
    };
    if !mapped {
        set_state(ABSENT);
    }
}

/// Moves to state `s`, keeping the preloaded `malloc`'s sampling fast path (which does not
/// poll) off while a poll is due.
fn set_state(s: u8) {
    if s == DETECTED {
        crate::state::MALLOC_FAST.store(0, Ordering::Relaxed);
    }
    STATE.store(s, Ordering::Release);
    crate::state::update_malloc_fast();
}

/// Whether [`poll`] has work to do (the interpreter detected, its allocators not yet wrapped).
#[inline(always)]
pub(crate) fn poll_due() -> bool {
    STATE.load(Ordering::Relaxed) == DETECTED
}

/// Wraps the interpreter's allocators once it is ready (see the module documentation); a
/// relaxed load when there is nothing to do.
#[inline]
pub(crate) fn poll(wrappers: &Wrappers) {
    if STATE.load(Ordering::Relaxed) == DETECTED {
        try_install(wrappers);
    }
}

/// The `ctx` of each wrapped domain whose allocator is glibc's `malloc` family
/// (`PYTHONMALLOC=malloc`), 0 for the others: its blocks are glibc's, so the wrappers may read
/// their block trailers (see `crate::trailer`), which they may not do for pymalloc's.
static GLIBC_CTX: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Whether the wrapped domain of `ctx` hands out glibc's blocks (see [`GLIBC_CTX`]).
#[inline(always)]
pub(crate) fn glibc_backed(ctx: *mut c_void) -> bool {
    let c = ctx as usize;
    c == GLIBC_CTX[0].load(Ordering::Relaxed) || c == GLIBC_CTX[1].load(Ordering::Relaxed)
}

/// `[ctx, malloc, calloc, realloc, free]` of `a`, as addresses (0: none).
fn allocator_words(a: &PyMemAllocatorEx) -> [usize; 5] {
    [
        a.ctx as usize,
        a.malloc.map_or(0, |f| f as usize),
        a.calloc.map_or(0, |f| f as usize),
        a.realloc.map_or(0, |f| f as usize),
        a.free.map_or(0, |f| f as usize),
    ]
}

/// Whether allocator `a` of a domain hands out glibc's blocks with the shim's trailers: it is
/// the RAW domain's allocator as the interpreter started it (see `Py::raw_default`), CPython's
/// `_PyMem_RawMalloc` family, which is glibc's `malloc`, `calloc`, `realloc` and `free`
/// (`Objects/obmalloc.c`); `PYTHONMALLOC=malloc` sets the MEM and OBJ domains to it. Not
/// pymalloc, not the debug hooks, not tracemalloc's hooks, not an embedder's allocator.
/// Decided without calling any allocator or the loader: this runs inside `malloc`, maybe inside
/// an allocator hook holding its lock (tracemalloc's: a first version that made a probe block
/// here deadlocked `python3 -X tracemalloc`).
fn glibc_domain(py: &Py, a: &PyMemAllocatorEx) -> bool {
    crate::trailer::on() && py.raw_default[1] != 0 && allocator_words(a) == py.raw_default
}

#[cold]
#[inline(never)]
fn try_install(wrappers: &Wrappers) {
    let Some(py) = py() else { return };
    if state::inside_shim() {
        return;
    }
    // SAFETY: both are plain reads of interpreter state, callable from any thread at any
    // time (Py_IsInitialized reads a flag; PyGILState_Check compares thread states).
    if unsafe { (py.is_initialized)() } == 0 || unsafe { (py.gil_check)() } == 0 {
        return;
    }
    if STATE
        .compare_exchange(DETECTED, INSTALLING, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    if py.frames {
        codes_table();
    }
    for (domain, orig, wrapper) in [
        (PYMEM_DOMAIN_MEM, &ORIG_MEM, 0usize),
        (PYMEM_DOMAIN_OBJ, &ORIG_OBJ, 1),
    ] {
        let mut a = PyMemAllocatorEx {
            ctx: std::ptr::null_mut(),
            malloc: None,
            calloc: None,
            realloc: None,
            free: None,
        };
        // SAFETY: this thread holds the GIL (checked above), as PyMem_GetAllocator and
        // PyMem_SetAllocator require after initialization; `a` is a valid out-parameter.
        unsafe { (py.get_allocator)(domain, &mut a) };
        if a.malloc.is_none() || a.calloc.is_none() || a.realloc.is_none() || a.free.is_none() {
            continue;
        }
        let glibc = glibc_domain(py, &a);
        // SAFETY: see `Cell`: only the installing thread writes, before ACTIVE; the wrappers
        // read it only once set as the domain's allocator below.
        let ctx = unsafe { (*orig.0.get()).insert(a) as *mut PyMemAllocatorEx };
        if glibc {
            GLIBC_CTX[wrapper].store(ctx as usize, Ordering::Relaxed);
        }
        if domain == PYMEM_DOMAIN_OBJ {
            // Code objects' deaths matter only to the memo of Python frames.
            if py.frames {
                CODE_TYPE.store(py.code_type, Ordering::Relaxed);
            }
            OBJ_CTX.store(ctx as usize, Ordering::Relaxed);
        }
        let mut w = PyMemAllocatorEx {
            ctx: ctx as *mut c_void,
            malloc: Some(wrappers.malloc),
            calloc: Some(wrappers.calloc),
            realloc: Some(wrappers.realloc),
            free: Some(wrappers.free),
        };
        // SAFETY: as above; the wrappers forward each call to the saved original (the API's rule).
        unsafe { (py.set_allocator)(domain, &mut w) };
    }
    set_state(if py.frames { ACTIVE } else { OBJECTS_ONLY });
}

/// # Safety
/// `ctx` is the `PyMemAllocatorEx` saved by `try_install`.
#[inline(always)]
pub(crate) unsafe fn orig(ctx: *mut c_void) -> &'static PyMemAllocatorEx {
    // SAFETY: the caller's contract; the saved allocators are never freed or changed.
    unsafe { &*(ctx as *const PyMemAllocatorEx) }
}

// ---- frames ------------------------------------------------------------------------------

/// Most interpreter frames visited per capture (a cycle or a corrupt chain ends there).
const MAX_VISITS: usize = 1024;

#[inline(always)]
fn plausible(p: usize) -> bool {
    (4096..(1 << 47)).contains(&p) && p.is_multiple_of(8)
}

/// Reads a word of interpreter memory at `p + off`.
///
/// # Safety
/// `p` must point to a live interpreter structure of which `off` is a field.
#[inline(always)]
unsafe fn rd(p: usize, off: usize) -> usize {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::read_volatile((p + off) as *const usize) }
}

/// Whether [`splice`] may change a stack (CPython's frames are being recorded): while it may
/// not, a stack's id depends on its native frames only.
#[inline]
pub(crate) fn may_splice() -> bool {
    STATE.load(Ordering::Relaxed) == ACTIVE
}

/// Splices the calling thread's Python frames into `frames[..n]` (native return addresses,
/// leaf first) after each frame of `_PyEval_EvalFrameDefault`; returns the new depth (at most
/// [`MAX_FRAMES`]; the root side is cut). A no-op unless the allocators are wrapped.
#[inline]
pub(crate) fn splice(g: &Global, t: &Tls, frames: &mut [u64; MAX_FRAMES], n: usize) -> usize {
    if STATE.load(Ordering::Relaxed) != ACTIVE {
        return n;
    }
    splice_active(g, t, frames, n)
}

#[inline(never)]
fn splice_active(g: &Global, t: &Tls, frames: &mut [u64; MAX_FRAMES], n: usize) -> usize {
    let Some(py) = py() else { return n };
    // The reads are logged while the stack memo asked for it (see [`StackMemo`]).
    let log = stack_log(t);
    // Only stacks through the eval loop have Python frames.
    let n = n.min(MAX_FRAMES);
    let in_eval = |pc: u64| {
        let a = pc.wrapping_sub(1);
        a >= py.eval_lo && a < py.eval_hi
    };
    let Some(first_eval) = frames[..n].iter().position(|&pc| in_eval(pc)) else {
        return n;
    };
    // SAFETY: plain reads of interpreter state; after finalization began Py_IsInitialized is
    // 0 and the thread-state key may be gone, so nothing further is read.
    if unsafe { (py.is_initialized)() } == 0 {
        return n;
    }
    // SAFETY: reads this thread's entry of the thread-state key (pthread_getspecific).
    let ts = unsafe { (py.this_thread_state)() } as usize;
    if !plausible(ts) {
        return n;
    }
    let o = &py.off;
    // SAFETY: `ts` is this thread's live PyThreadState; the fields are those of its version.
    let mut f = unsafe {
        match o.cframe {
            Some(cf) => {
                let c = lrd(log, ts, cf);
                // The thread's `_PyCFrame`: the root one inside its thread state, or the one
                // of an eval loop on its stack. Anything else means offsets that do not fit
                // this build: no Python frames rather than a wild read.
                let on_stack = c >= t.stack_lo.get() && c < t.stack_hi.get();
                if !plausible(c) || !(on_stack || (c >= ts && c < ts + 4096)) {
                    return n;
                }
                lrd(log, c, o.current_frame)
            }
            None => lrd(log, ts, o.current_frame),
        }
    };
    // The native frames from the first eval loop on, which the spliced frames overwrite: only
    // those are copied, into storage left uninitialized (zeroing 512 bytes at every
    // allocation was 1.5% of a CPython run's time).
    let mut native = [std::mem::MaybeUninit::<u64>::uninit(); MAX_FRAMES];
    let len = n - first_eval;
    for (d, &s) in native[..len].iter_mut().zip(&frames[first_eval..n]) {
        d.write(s);
    }
    let mut out = first_eval;
    let mut visits = 0;
    // SAFETY: this thread's own memo, used by one capture at a time (inside its reentrancy
    // guard), unmapped only by the thread's exit handler.
    let mut memo = frame_memo(t).map(|p| unsafe { &mut *p });
    let deaths = code_deaths();
    for slot in &native[..len] {
        // SAFETY: the first `len` entries were written just above.
        let mut pc = unsafe { slot.assume_init() };
        if in_eval(pc) {
            let before = out;
            run_frames(
                g,
                py,
                &mut memo,
                deaths,
                log,
                &mut f,
                &mut visits,
                frames,
                &mut out,
            );
            if out > before {
                pc |= PYTHON_EVAL_FRAME;
            }
        }
        if out == MAX_FRAMES {
            break;
        }
        frames[out] = pc;
        out += 1;
    }
    // The native walk ended before the outer runs of the eval loop (at code without unwind
    // information, such as `-X perf`'s trampolines): their Python frames go on the root
    // side, without the native frames between them, as memray and py-spy do.
    if n < MAX_FRAMES {
        while out < MAX_FRAMES && plausible(f) && visits < MAX_VISITS {
            run_frames(
                g,
                py,
                &mut memo,
                deaths,
                log,
                &mut f,
                &mut visits,
                frames,
                &mut out,
            );
        }
    }
    out
}

/// Appends to `frames[..*out]` the Python frames of the run of the eval loop whose innermost
/// frame is `*f` (innermost first: they are the callees of the native frame of that run), and
/// leaves `*f` at the innermost frame of the next run out.
#[allow(clippy::too_many_arguments)]
fn run_frames(
    g: &Global,
    py: &Py,
    memo: &mut Option<&mut FrameMemo>,
    deaths: u64,
    log: *mut Log,
    f: &mut usize,
    visits: &mut usize,
    frames: &mut [u64; MAX_FRAMES],
    out: &mut usize,
) {
    let o = &py.off;
    // In locals for the loop, written back at the end.
    let (mut next, mut v, mut k) = (*f, *visits, *out);
    // 3.11 marks a run's first frame `is_entry`; 3.12+ put a frame owned by the C stack
    // under it.
    let entry_at = o.f_is_entry;
    let (owner_word, owner_mask) = frame_words(o);
    while plausible(next) && v < MAX_VISITS {
        v += 1;
        let cur = next;
        // The frame's words, logged as one record (see `Log::push_frame`).
        // SAFETY: `cur` is a frame of this thread's chain (checked plausible, so 8-aligned):
        // its fields are those of its version; the word holding `owner` is the frame's own.
        let (word, prev, code, instr) = unsafe {
            (
                rd(cur, owner_word),
                rd(cur, o.f_previous),
                rd(cur, o.f_code),
                rd(cur, o.f_instr),
            )
        };
        // SAFETY: null or the thread's own log (see `lrd`).
        if let Some(l) = unsafe { log.as_mut() } {
            l.push_frame(cur, word as u64 & owner_mask, prev, code, instr);
        }
        if o.frame_objects {
            // 3.6–3.10: a frame object, alone in its run; anything else ends the chain (a
            // layout that does not fit this build reads no further).
            next = if word == py.frame_type { prev } else { 0 };
            if word == py.frame_type && k < MAX_FRAMES {
                if let Some(x) = python_frame(g, py, memo.as_deref_mut(), deaths, log, code, instr)
                {
                    frames[k] = x;
                    k += 1;
                }
            }
            break;
        }
        let byte = |at: usize| (word >> ((at & 7) * 8)) as u8;
        let owner = byte(o.f_owner);
        let entry = match entry_at {
            Some(e) if e & !7 == owner_word => Some(byte(e)),
            // SAFETY: as above.
            Some(e) => Some(unsafe { lbyte(log, cur + e) }),
            None => None,
        };
        next = prev;
        let entry = match entry {
            Some(b) => b != 0,
            None if owner == OWNED_BY_CSTACK => break,
            None => false,
        };
        if k < MAX_FRAMES {
            if let Some(x) = python_frame(g, py, memo.as_deref_mut(), deaths, log, code, instr) {
                frames[k] = x;
                k += 1;
            }
        }
        if entry {
            break;
        }
    }
    (*f, *visits, *out) = (next, v, k);
}

/// Where a frame record ([`Log::push_frame`]) reads a frame's `owner` byte: the offset of the
/// aligned word that holds it, and the bits of `owner` and, when in the same word (3.11),
/// `is_entry`. `f_previous`, `f_code` and `f_instr` are pointers, aligned words of their own.
#[inline(always)]
fn frame_words(o: &Offsets) -> (usize, u64) {
    // 3.6–3.10: the frame object's type, whole.
    if o.frame_objects {
        return (8, u64::MAX);
    }
    let word = o.f_owner & !7;
    let byte = |at: usize| 0xffu64 << ((at & 7) * 8);
    let mask = match o.f_is_entry {
        Some(e) if e & !7 == word => byte(o.f_owner) | byte(e),
        _ => byte(o.f_owner),
    };
    (word, mask)
}

/// The [`PYTHON_FRAME`] of an interpreter frame running `code` at `instr` (its `f_code` and
/// `f_instr`, read and logged by the caller); `None` when it runs no code object.
///
/// A frame whose code object and instruction are those of a frame this thread spliced before
/// gets the value found then from `memo`: without reading the code object at all when no code
/// object died since (`deaths`, see [`CODE_DEATHS`]), else once its identity matches.
#[inline]
fn python_frame(
    g: &Global,
    py: &Py,
    memo: Option<&mut FrameMemo>,
    deaths: u64,
    log: *mut Log,
    code: usize,
    instr: usize,
) -> Option<u64> {
    let o = &py.off;
    if !plausible(code) {
        return None;
    }
    let mut slot = memo.map(|m| &mut m.slots[FrameMemo::slot(code, instr)]);
    if let Some(s) = &slot {
        // The code object this frame runs is alive (the frame holds a reference to it), and
        // was alive at this address when the entry was written (its type and identity read
        // then): with no code object freed since, it is the same object.
        if s.code == code && s.instr == instr && s.deaths == deaths {
            return Some(s.value);
        }
    }
    // SAFETY: checked plausible before reading its type (PyObject.ob_type at 8).
    if unsafe { lrd(log, code, 8) } != py.code_type {
        return None;
    }
    // SAFETY: `code` is a code object, alive while `f` runs it.
    let ident = unsafe { identity(o, code, log) };
    if let Some(s) = &mut slot {
        if s.code == code && s.instr == instr && s.ident == ident {
            s.deaths = deaths;
            return Some(s.value);
        }
    }
    let index = if o.frame_objects {
        // `f_lasti` (the low half of the word read: little-endian), -1 before the first
        // instruction: then no index (the record's first line).
        let lasti = instr as u32 as i32;
        if lasti < 0 {
            u32::MAX as u64
        } else if o.lasti_bytes {
            (lasti / 2) as u64
        } else {
            lasti as u64
        }
    } else {
        // SAFETY: a code object: `ob_size` (16) is its number of code units.
        let units = unsafe { lrd(log, code, 16) };
        let base = code + o.co_adaptive;
        if instr >= base && (instr - base) / 2 < units.min(u32::MAX as usize) {
            ((instr - base) / 2) as u64
        } else {
            u32::MAX as u64
        }
    };
    let id = code_id(g, py, code, fingerprint(&ident));
    if id == 0 && !log.is_null() {
        // No record (the code table or the region is full): a later capture may find one,
        // so this stack is not kept whole.
        // SAFETY: the thread's own log (see `stack_log`).
        unsafe { (*log).spoiled = true };
    }
    let value = PYTHON_FRAME | (id << 32) | index;
    if let Some(s) = slot {
        if id != 0 {
            *s = Seen {
                code,
                instr,
                ident,
                value,
                deaths,
            };
        }
    }
    Some(value)
}

/// One frame a thread spliced: its code object, instruction pointer and code [`identity`],
/// the [`PYTHON_FRAME`] value found for them, and [`CODE_DEATHS`] when the identity was last
/// read.
#[derive(Clone, Copy)]
struct Seen {
    code: usize,
    instr: usize,
    ident: [usize; 3],
    value: u64,
    deaths: u64,
}

/// Entries of a [`FrameMemo`] (a power of two): 14 KiB a thread.
const MEMO_SLOTS: usize = 256;

/// A thread's memo of the Python frames it spliced, by code object and instruction
/// (direct-mapped): most frames of a capture are those of the last one, still at the same
/// instruction (the callers of the innermost frame), or a loop's few allocating lines.
///
/// Why a hit is exact: a frame's value is a function of its code object's record and the
/// instruction's index in it. The index follows from the code object's address and the
/// instruction pointer, both compared. The record is the code table's for that address and
/// [`fingerprint`]: an entry matches only when the code object at that address is the one it
/// was written for — known without reading it when no code object died since ([`CODE_DEATHS`]
/// unchanged: the frame's own code object is alive now, and so it was already there then),
/// else when it has the same [`identity`] (qualified name and line table objects, first line),
/// the very words the fingerprint is made of. In an anonymous mapping of the thread's own
/// (`Tls::py_memo`), made at its first splice and unmapped at its exit.
pub(crate) struct FrameMemo {
    slots: [Seen; MEMO_SLOTS],
}

impl FrameMemo {
    #[inline(always)]
    fn slot(code: usize, instr: usize) -> usize {
        let k = (code as u64 ^ (instr as u64).rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (k >> 56) as usize & (MEMO_SLOTS - 1)
    }
}

/// Sentinel in `Tls::py_memo`: mapping the memo failed; splice without it.
const MEMO_NONE: usize = 1;

/// The calling thread's frame memo, mapped at its first use; `None` when it cannot be.
#[inline]
fn frame_memo(t: &Tls) -> Option<*mut FrameMemo> {
    let mut p = t.py_memo.get();
    if p.is_null() {
        if t.exited.get() {
            return None;
        }
        // Zero-filled: no entry matches (code 0 is never plausible).
        p = crate::sys::map_anon(std::mem::size_of::<FrameMemo>()) as *mut FrameMemo;
        if p.is_null() {
            p = MEMO_NONE as *mut FrameMemo;
        }
        t.py_memo.set(p);
        state::note_private(t);
    }
    if p as usize == MEMO_NONE {
        return None;
    }
    Some(p)
}

/// The thread's frame memo and stack memo mappings (start, bytes; (0, 0) when not mapped):
/// they keep copies of interpreter pointers, so they are not roots of the reference graph
/// (see `state::note_private`).
pub(crate) fn private_ranges(t: &Tls) -> [(u64, u64); 2] {
    let f = t.py_memo.get();
    let s = t.py_stacks.get();
    [
        if f.is_null() || f as usize == MEMO_NONE {
            (0, 0)
        } else {
            (f as u64, std::mem::size_of::<FrameMemo>() as u64)
        },
        if s.is_null() || s as usize == STACKS_NONE {
            (0, 0)
        } else {
            (s as u64, std::mem::size_of::<StackMemo>() as u64)
        },
    ]
}

/// Unmaps a thread's frame memo (its exit handler).
pub(crate) fn free_frame_memo(t: &Tls) {
    let p = t.py_memo.replace(MEMO_NONE as *mut FrameMemo);
    if !p.is_null() && p as usize != MEMO_NONE {
        // SAFETY: mapped by `frame_memo` with this size; the thread no longer splices.
        unsafe { crate::sys::unmap(p as *mut u8, std::mem::size_of::<FrameMemo>()) };
    }
}

// ---- whole stacks --------------------------------------------------------------------------

/// Words of a splice's [`Log`] (and of a [`StackEntry`]'s copy of one) at most: a frame whose
/// code object the frame memo knows takes a 5-word record, another read 3 words; 384 keep
/// stacks of about 70 Python frames.
const LOG_WORDS: usize = 384;
/// The first word of a frame record has this bit set (interpreter addresses lie below 2^47).
const FRAME_RECORD: u64 = 1 << 63;
/// Native stack words an entry keeps at most (a return-address slot and a saved-`rbp` slot a
/// frame, and the words that ended the walk).
const NATIVE_MAX: usize = 64;
/// Sets of a [`StackMemo`] (a power of two), each of [`STACK_WAYS`] entries: 128 in all. Eight
/// ways and sixteen sets: with fewer, hot stacks collided in a few sets and the cost moved
/// with the addresses the keys hold (ARCHITECTURE.md, "The memo of whole stacks").
const STACK_SETS: usize = 16;
const STACK_WAYS: usize = 8;

/// The interpreter memory one splice read, in order, as records of words:
///
/// * a read: `[address of the aligned word that holds it, which of its bits were read, their
///   value]`, so a read of any width is checked again as one word: `(word ^ value) & mask == 0`;
/// * a frame: `[frame address | FRAME_RECORD, owner word & mask, previous, code, instruction]`
///   (see [`frame_words`]): the four words of an interpreter frame the splice reads, all at
///   fixed offsets from the frame's address, checked together.
pub(crate) struct Log {
    /// Words written so far; past [`LOG_WORDS`]: too many, not kept.
    n: usize,
    /// A frame got no code record: not kept.
    spoiled: bool,
    words: [u64; LOG_WORDS],
}

impl Log {
    /// Logs a read of `width` (8 or 32) bits at `at`.
    #[inline(always)]
    fn push(&mut self, at: usize, width: u32, val: u64) {
        let shift = (at & 7) as u32 * 8;
        self.put([
            (at & !7) as u64,
            ((1u64 << width) - 1) << shift,
            val << shift,
        ]);
    }

    /// Logs a read of the aligned word at `at`.
    #[inline(always)]
    fn push_word(&mut self, at: usize, val: u64) {
        self.put([at as u64, u64::MAX, val]);
    }

    /// Logs the words of frame `f` read by `run_frames`: the word holding `owner` (masked as
    /// [`frame_words`] says), `previous`, `code` and `instr`.
    #[inline(always)]
    fn push_frame(&mut self, f: usize, owner: u64, prev: usize, code: usize, instr: usize) {
        self.put([
            f as u64 | FRAME_RECORD,
            owner,
            prev as u64,
            code as u64,
            instr as u64,
        ]);
    }

    #[inline(always)]
    fn put<const K: usize>(&mut self, r: [u64; K]) {
        let n = self.n;
        if n + K <= LOG_WORDS {
            self.words[n..n + K].copy_from_slice(&r);
            self.n = n + K;
        } else {
            self.n = LOG_WORDS + 1;
        }
    }
}

/// Reads the word at `p + off`, logged when `log` is not null.
///
/// # Safety
/// As [`rd`]; `log` is null or the thread's own log, logging this capture.
#[inline(always)]
unsafe fn lrd(log: *mut Log, p: usize, off: usize) -> usize {
    // SAFETY: the caller's contract.
    let v = unsafe { rd(p, off) };
    // SAFETY: the caller's contract: null or the thread's own log, used by this capture only.
    if let Some(l) = unsafe { log.as_mut() } {
        l.push_word(p + off, v as u64);
    }
    v
}

/// Reads the byte at `a`, logged when `log` is not null.
///
/// # Safety
/// `a` is a byte field of a live interpreter structure; `log` as in [`lrd`].
#[inline(always)]
unsafe fn lbyte(log: *mut Log, a: usize) -> u8 {
    // SAFETY: the caller's contract.
    let v = unsafe { std::ptr::read_volatile(a as *const u8) };
    // SAFETY: as in `lrd`.
    if let Some(l) = unsafe { log.as_mut() } {
        l.push(a, 8, v as u64);
    }
    v
}

/// Reads the 32-bit field at `a`, logged when `log` is not null.
///
/// # Safety
/// `a` is an aligned 32-bit field of a live interpreter structure; `log` as in [`lrd`].
#[inline(always)]
unsafe fn lu32(log: *mut Log, a: usize) -> u32 {
    // SAFETY: the caller's contract.
    let v = unsafe { std::ptr::read_volatile(a as *const u32) };
    // SAFETY: as in `lrd`.
    if let Some(l) = unsafe { log.as_mut() } {
        l.push(a, 32, v as u64);
    }
    v
}

/// One stack kept whole: what it was found from, every word its native walk and its splice
/// read, and the id it was interned as.
#[repr(C)]
struct StackEntry {
    /// The walk's start (code address or 0, `sp` or 0, `rbp`), its stack top, the thread's
    /// innermost interpreter frame and that frame's instruction pointer (0, 0 when there was
    /// none); all 0: empty.
    key: [u64; 6],
    /// The thread state the splice read from.
    ts: u64,
    /// The object list generation of the walk's rules.
    generation: u64,
    /// [`CODE_DEATHS`] before the splice: the code objects it knew by their address alone
    /// are the same only while no code object has died since.
    deaths: u64,
    /// The lowest native word's address.
    floor: u64,
    id: u32,
    natives: u32,
    /// Words of `log` in use.
    words: u32,
    native: [[u64; 2]; NATIVE_MAX],
    log: [u64; LOG_WORDS],
}

/// A thread's memo of whole stacks with CPython's frames spliced in: the native walk, the
/// splice and the interning all skipped when a capture would repeat one of them.
///
/// Why a hit is exact: a capture's frames are a function of the walk's start registers, its
/// stack top, the rules of its object list generation and the stack words the walk read (see
/// [`crate::dwarf::Cache::last_walk_words`]); then of the interpreter memory the splice read
/// from the thread state on, in order — each address computed from the values read before
/// it — and the code records of the code objects read (the same argument as [`FrameMemo`]'s:
/// a code object is known by its address and either its identity words, among the reads, or
/// [`CODE_DEATHS`] unchanged since the entry was made). An entry with the same start, stack
/// top, generation, thread state and count of code deaths, whose native words and
/// logged reads all hold the values read then (the reads replayed in order, each only once
/// those before it matched, so each reads what the splice itself would read now), gives the
/// same frames, and so the same stack id. In the thread's frame-memo mapping's neighbour: an
/// anonymous mapping of its own (`Tls::py_stacks`, about 262 KiB: 64 entries of 4,192 bytes, of
/// which a stack of a few frames touches the first 1.3 KiB; committed as used), made at
/// its first splice and unmapped at its exit.
pub(crate) struct StackMemo {
    /// Whether the splice under way logs its reads (for [`keep_stack`]).
    logging: bool,
    /// Lookups and hits in the current window of [`STACK_WINDOW`] lookups.
    window: (u32, u32),
    /// Captures left that do not use the memo (see [`STACK_WINDOW`]).
    pause: u32,
    log: Log,
    /// Per set, the way the next entry replaces (round robin: captures with the same key but
    /// other frames, such as one Python line reached through two native callers in turn, keep
    /// an entry each).
    next: [u8; STACK_SETS],
    entries: [StackEntry; STACK_SETS * STACK_WAYS],
}

/// A capture the stack memo did not find: where to keep it once interned.
pub(crate) struct Pending {
    key: [u64; 6],
    ts: u64,
    deaths: u64,
}

/// Lookups per window over which a thread's stack memo is judged: a window in which fewer than
/// an eighth were found (stacks that hardly repeat: every miss logs the splice's reads and
/// writes up to 4 KiB) leaves the memo alone for the next [`STACK_PAUSE`] captures.
const STACK_WINDOW: u32 = 256;
/// See [`STACK_WINDOW`].
const STACK_PAUSE: u32 = 16 * STACK_WINDOW;

/// Sentinel in `Tls::py_stacks`: mapping the memo failed.
const STACKS_NONE: usize = 1;

/// The calling thread's stack memo, mapped at its first use; `None` when it cannot be.
#[inline]
fn stack_memo(t: &Tls) -> Option<*mut StackMemo> {
    let mut p = t.py_stacks.get();
    if p.is_null() {
        if t.exited.get() {
            return None;
        }
        // Zero-filled: empty entries (key 0 never matches a start with a stack top), log off.
        p = crate::sys::map_anon(std::mem::size_of::<StackMemo>()) as *mut StackMemo;
        if p.is_null() {
            p = STACKS_NONE as *mut StackMemo;
        }
        t.py_stacks.set(p);
        state::note_private(t);
    }
    if p as usize == STACKS_NONE {
        return None;
    }
    Some(p)
}

/// The thread's splice log while the stack memo asked for one, else null.
#[inline(always)]
fn stack_log(t: &Tls) -> *mut Log {
    let p = t.py_stacks.get();
    if p.is_null() || p as usize == STACKS_NONE {
        return std::ptr::null_mut();
    }
    // SAFETY: the thread's own memo, mapped and alive until its exit handler.
    unsafe {
        if !(*p).logging {
            return std::ptr::null_mut();
        }
        std::ptr::addr_of_mut!((*p).log)
    }
}

/// Unmaps a thread's stack memo (its exit handler).
pub(crate) fn free_stack_memo(t: &Tls) {
    let p = t.py_stacks.replace(STACKS_NONE as *mut StackMemo);
    if !p.is_null() && p as usize != STACKS_NONE {
        // SAFETY: mapped by `stack_memo` with this size; the thread no longer splices.
        unsafe { crate::sys::unmap(p as *mut u8, std::mem::size_of::<StackMemo>()) };
    }
}

#[inline(always)]
fn stack_set(key: &[u64; 6]) -> usize {
    let h = (key[0] ^ key[1].rotate_left(11) ^ key[2].rotate_left(23) ^ key[3].rotate_left(31))
        ^ (key[4].rotate_left(41) ^ key[5].rotate_left(53));
    (h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize & (STACK_SETS - 1)
}

/// What [`find_stack`] found.
pub(crate) enum Found {
    /// The stack id of a capture from `start` now.
    Id(u32),
    /// Not found: capture, then [`keep_stack`] with this.
    Miss(Pending),
    /// No memo here (CPython's frames not being recorded, no mapping).
    Off,
}

/// Looks for the stack a capture from `start` (the walk's start registers: code address or 0,
/// `sp` or 0, `rbp`) below stack top `hi` would find, in the thread's stack memo. On a miss the
/// splice that follows logs its reads, for [`keep_stack`].
#[inline(never)]
pub(crate) fn find_stack(t: &Tls, start: [u64; 3], hi: u64) -> Found {
    if STATE.load(Ordering::Relaxed) != ACTIVE {
        return Found::Off;
    }
    let Some(py) = py() else { return Found::Off };
    let Some(m) = stack_memo(t) else {
        return Found::Off;
    };
    // SAFETY: the thread's own memo, used by one capture at a time (inside its reentrancy
    // guard), unmapped only by its exit handler.
    let m = unsafe { &mut *m };
    m.logging = false;
    if m.pause > 0 {
        m.pause -= 1;
        return Found::Off;
    }
    // The thread's innermost interpreter frame and instruction, read as the splice reads
    // them (the same checks first): the key tells apart the Python lines that reach an
    // allocation through the same native frames.
    let (mut ts, mut f, mut instr) = (0usize, 0usize, 0usize);
    // SAFETY: as in `splice_active`.
    if unsafe { (py.is_initialized)() } != 0 {
        // SAFETY: as in `splice_active`.
        ts = unsafe { (py.this_thread_state)() } as usize;
        if plausible(ts) {
            let o = &py.off;
            // SAFETY: as in `splice_active`: `ts` is this thread's live thread state.
            f = unsafe {
                match o.cframe {
                    Some(cf) => {
                        let c = rd(ts, cf);
                        let on_stack = c >= t.stack_lo.get() && c < t.stack_hi.get();
                        if plausible(c) && (on_stack || (c >= ts && c < ts + 4096)) {
                            rd(c, o.current_frame)
                        } else {
                            0
                        }
                    }
                    None => rd(ts, o.current_frame),
                }
            };
            if plausible(f) {
                // SAFETY: `f` is the thread's current frame, live while it runs; its caller's
                // frame too (null or plausible, checked).
                instr = unsafe {
                    let prev = rd(f, o.f_previous);
                    let caller = if plausible(prev) {
                        rd(prev, o.f_instr)
                    } else {
                        0
                    };
                    rd(f, o.f_instr) ^ caller.rotate_left(32)
                };
            } else {
                f = 0;
            }
        } else {
            ts = 0;
        }
    }
    // The first return address too, when the walk starts from a frame pointer: callers at
    // the same depth differ there.
    let first = if start[0] == 0 && start[2] >= start[1] && start[2] + 16 <= hi {
        // SAFETY: the exported function's frame record, on this thread's stack below its top.
        unsafe { std::ptr::read_volatile((start[2] + 8) as *const u64) }
    } else {
        0
    };
    let key = [
        start[0],
        first ^ start[1],
        start[2],
        hi,
        f as u64,
        instr as u64,
    ];
    // Every native word lies at or above the walk's first frame (its `sp`, or the exported
    // function's frame pointer): then any walk from this start reads it within its bounds.
    let base = if start[0] == 0 { start[2] } else { start[1] };
    let generation = crate::dwarf::newest_generation();
    // Read before the splice's own reading of it (so never newer than what the splice used).
    let deaths = code_deaths();
    let set = stack_set(&key);
    let found = m.entries[set * STACK_WAYS..(set + 1) * STACK_WAYS]
        .iter()
        .find(|e| {
            e.key == key
                && e.ts == ts as u64
                && e.generation == generation
                && e.deaths == deaths
                && e.floor >= base
                && holds(e, &py.off)
        })
        .map(|e| e.id);
    count(m, found.is_some());
    if let Some(id) = found {
        return Found::Id(id);
    }
    m.logging = true;
    m.log.spoiled = false;
    m.log.n = 0;
    Found::Miss(Pending {
        key,
        ts: ts as u64,
        deaths,
    })
}

/// Counts a lookup in the memo's window, pausing the memo after a window that found too few
/// (see [`STACK_WINDOW`]).
#[inline(always)]
fn count(m: &mut StackMemo, hit: bool) {
    let (n, h) = (m.window.0 + 1, m.window.1 + hit as u32);
    m.window = (n, h);
    if n == STACK_WINDOW {
        if h * 8 < n {
            m.pause = STACK_PAUSE;
        }
        m.window = (0, 0);
    }
}

/// Whether every native word and every logged read of `e` still holds its value (the reads
/// replayed in their order: see [`StackMemo`]).
#[inline(always)]
fn holds(e: &StackEntry, o: &Offsets) -> bool {
    let mut diff = 0;
    for w in &e.native[..e.natives as usize] {
        // SAFETY: a word of this thread's stack that the walk read, at or above `floor`,
        // which is at or above the walk's first frame (checked by the caller: a live frame of
        // the allocating code's callers), and below the same stack top: mapped.
        diff |= unsafe { std::ptr::read_volatile(w[0] as *const u64) } ^ w[1];
    }
    if diff != 0 {
        return false;
    }
    // In order, stopping at the first difference: a read after it may name memory freed
    // since (a frame or code object no longer there).
    let (owner_word, owner_mask) = frame_words(o);
    let log = &e.log[..(e.words as usize).min(LOG_WORDS)];
    let mut i = 0;
    while let Some(&first) = log.get(i) {
        if first & FRAME_RECORD != 0 {
            let Some(r) = log.get(i..i + 5) else {
                return false;
            };
            let f = (first & !FRAME_RECORD) as usize;
            // SAFETY: a frame the splice read, at an address read before it (the thread
            // state's current frame or the previous frame's `previous`), found unchanged: the
            // same live frame of this thread's chain the splice would read now, whose words
            // at these offsets are its own (as in `run_frames`).
            let (a, b, c, d) = unsafe {
                (
                    rd(f, owner_word),
                    rd(f, o.f_previous),
                    rd(f, o.f_code),
                    rd(f, o.f_instr),
                )
            };
            if ((a as u64 & owner_mask) ^ r[1])
                | (b as u64 ^ r[2])
                | (c as u64 ^ r[3])
                | (d as u64 ^ r[4])
                != 0
            {
                return false;
            }
            i += 5;
        } else {
            let Some(r) = log.get(i..i + 3) else {
                return false;
            };
            // SAFETY: each read is one the splice made, at an address computed from the
            // values read before it, all found unchanged: a field of the same live thread
            // state, frame or code object the splice would read now (its aligned word: the
            // same object's).
            let v = unsafe { std::ptr::read_volatile(first as *const u64) };
            if (v ^ r[2]) & r[1] != 0 {
                return false;
            }
            i += 3;
        }
    }
    true
}

/// Keeps the capture `p` was found missing for: the native words of the walk just made (from
/// `cache`), the reads the splice logged, and its stack id. Turns the log off.
pub(crate) fn keep_stack(t: &Tls, p: Pending, cache: &crate::dwarf::Cache, id: u32) {
    let Some(m) = stack_memo(t) else { return };
    // SAFETY: as in `find_stack`.
    let m = unsafe { &mut *m };
    m.logging = false;
    if m.log.spoiled || m.log.n > LOG_WORDS || id == u32::MAX {
        return;
    }
    let set = stack_set(&p.key);
    let way = m.next[set] as usize % STACK_WAYS;
    m.next[set] = ((way + 1) % STACK_WAYS) as u8;
    let e = &mut m.entries[set * STACK_WAYS + way];
    // Emptied first: a walk that cannot be kept leaves no stale entry behind.
    e.key = [0; 6];
    let Some((k, hi, generation)) = cache.last_walk_words(&mut e.native) else {
        return;
    };
    if hi != p.key[3] || generation != crate::dwarf::newest_generation() {
        return;
    }
    let floor = e.native[..k].iter().map(|w| w[0]).min().unwrap_or(u64::MAX);
    let n = m.log.n;
    e.log[..n].copy_from_slice(&m.log.words[..n]);
    e.natives = k as u32;
    e.words = n as u32;
    e.floor = floor;
    e.ts = p.ts;
    e.generation = generation;
    e.deaths = p.deaths;
    e.id = id;
    e.key = p.key;
}

// ---- code records ------------------------------------------------------------------------

/// Slots of the code table (code object → record): 16 bytes each, 4 MiB, touched lazily.
const SLOTS: usize = 1 << 18;
/// Slots probed per lookup.
const PROBES: usize = 32;

/// The code table: `SLOTS` pairs of (code object address, fingerprint << 32 | record), made
/// at installation; null when the mapping failed (frames then name no code).
static CODES: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());

fn codes_table() {
    let p = crate::sys::map_anon(SLOTS * 16) as *mut AtomicU64;
    CODES.store(p, Ordering::Release);
}

/// What tells a code object from an earlier one at the same address: the addresses of its
/// qualified name and line table, and its first line.
///
/// # Safety
/// `code` must be a live code object; `log` as in [`lrd`].
#[inline(always)]
unsafe fn identity(o: &Offsets, code: usize, log: *mut Log) -> [usize; 3] {
    // SAFETY: the caller's contract.
    unsafe {
        [
            lrd(log, code, o.co_qualname),
            lrd(log, code, o.co_linetable),
            lu32(log, code + o.co_firstlineno) as usize,
        ]
    }
}

/// The 32-bit fingerprint of an [`identity`] kept in the code table.
#[inline(always)]
fn fingerprint(id: &[usize; 3]) -> u64 {
    let h = (id[0] as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(17)
        ^ (id[1] as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ id[2] as u64;
    (h >> 32).max(1)
}

/// The record of `code` (written now if it is new), 0 when none can be written; `fp` is the
/// [`fingerprint`] of its identity.
fn code_id(g: &Global, py: &Py, code: usize, fp: u64) -> u64 {
    let t = CODES.load(Ordering::Acquire);
    if t.is_null() {
        return 0;
    }
    let h = (code as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    for i in 0..PROBES {
        let s = (h as usize + i) & (SLOTS - 1);
        // SAFETY: `s < SLOTS`: two words per slot inside the mapping.
        let (key, val) = unsafe { (&*t.add(2 * s), &*t.add(2 * s + 1)) };
        let k = key.load(Ordering::Acquire);
        if k == code as u64 {
            let v = val.load(Ordering::Acquire);
            if v != 0 && v >> 32 == fp {
                return v & 0xffff_ffff;
            }
            // A new code object where a dead one was (or the slot is being filled).
            let id = write_record(g, py, code);
            if id != 0 && v != 0 {
                val.store(fp << 32 | id, Ordering::Release);
            }
            return id;
        }
        if k == 0 {
            let id = write_record(g, py, code);
            if id != 0
                && key
                    .compare_exchange(0, code as u64, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                val.store(fp << 32 | id, Ordering::Release);
            }
            return id;
        }
    }
    0
}

/// A `str` object's characters: (kind: 1, 2 or 4 bytes per character, data, length), for the
/// compact forms CPython uses for names; `None` otherwise.
///
/// # Safety
/// `s` must be a live object (its type is checked here).
unsafe fn unicode(py: &Py, s: usize) -> Option<(usize, usize, usize)> {
    // SAFETY: the caller's contract: ob_type at 8.
    if !plausible(s) || unsafe { rd(s, 8) } != py.unicode_type {
        return None;
    }
    // SAFETY: a str: `length` at 16, `state` at 32 (bit fields: interned:2, kind:3,
    // compact:1, ascii:1).
    let (len, state) = unsafe { (rd(s, 16), *((s + 32) as *const u32)) };
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 || !matches!(kind, 1 | 2 | 4) {
        return None;
    }
    let data = s + if ascii != 0 {
        py.off.ascii_size
    } else {
        py.off.compact_size
    };
    Some((kind as usize, data, len.min(4096)))
}

/// Calls `put` with the UTF-8 bytes of a `str`'s characters.
///
/// # Safety
/// As [`unicode`]'s result: `data` holds `len` characters of `kind` bytes.
unsafe fn utf8(kind: usize, data: usize, len: usize, mut put: impl FnMut(u8)) {
    for i in 0..len {
        // SAFETY: i < len characters of `kind` bytes.
        let c = unsafe {
            match kind {
                1 => *((data + i) as *const u8) as u32,
                2 => *((data + 2 * i) as *const u16) as u32,
                _ => *((data + 4 * i) as *const u32),
            }
        };
        let mut b = [0u8; 4];
        let s = char::from_u32(c).unwrap_or('?').encode_utf8(&mut b);
        s.bytes().for_each(&mut put);
    }
}

/// Writes the code record of `code` into the region (see `PYTHON_FRAME`); its first word's
/// index, 0 when it cannot be written (section full, strings of an unknown form).
#[cold]
fn write_record(g: &Global, py: &Py, code: usize) -> u64 {
    let o = &py.off;
    // SAFETY: `code` is a live code object; its fields are those of its version.
    let (q, f, l, first_line) = unsafe {
        (
            rd(code, o.co_qualname),
            rd(code, o.co_filename),
            rd(code, o.co_linetable),
            *((code + o.co_firstlineno) as *const i32),
        )
    };
    // SAFETY: fields of a live code object; `unicode` checks their type.
    let (qs, fs) = unsafe { (unicode(py, q), unicode(py, f)) };
    let count = |s: Option<(usize, usize, usize)>, max: usize| {
        let mut n = 0;
        if let Some((k, d, len)) = s {
            // SAFETY: from `unicode`.
            unsafe { utf8(k, d, len, |_| n += 1) };
        }
        n.min(max)
    };
    let (qlen, flen) = (count(qs, 1024), count(fs, 4096));
    // SAFETY: ob_type at 8 of a field of a live code object; a bytes object's size at 16.
    let table = plausible(l) && unsafe { rd(l, 8) } == py.bytes_type;
    let full_llen = if table {
        // SAFETY: as above.
        unsafe { rd(l, 16) }
    } else {
        0
    };
    let room = (PYTHON_RECORD_MAX_WORDS - PYTHON_RECORD_WORDS) as usize * 8 - qlen - flen;
    let llen = full_llen.min(room);
    let words = PYTHON_RECORD_WORDS + (qlen + flen + llen).div_ceil(8) as u64;
    let Some(first) = g.writer.claim_python(words) else {
        return 0;
    };
    let w = &g.writer;
    let mut acc = 0u64;
    let mut nb = 0usize;
    let mut at = first + PYTHON_RECORD_WORDS;
    let mut push = |b: u8| {
        acc |= (b as u64) << (8 * (nb % 8));
        nb += 1;
        if nb.is_multiple_of(8) {
            w.python_word(at).store(acc, Ordering::Relaxed);
            at += 1;
            acc = 0;
        }
    };
    for (s, max) in [(qs, qlen), (fs, flen)] {
        if let Some((k, d, len)) = s {
            let mut left = max;
            // SAFETY: from `unicode`.
            unsafe {
                utf8(k, d, len, |b| {
                    if left > 0 {
                        left -= 1;
                        push(b);
                    }
                })
            };
        }
    }
    for i in 0..llen {
        // SAFETY: a bytes object's `ob_sval` (at 32) holds `ob_size` bytes; i < ob_size.
        push(unsafe { *((l + 32 + i) as *const u8) });
    }
    if !nb.is_multiple_of(8) {
        w.python_word(at).store(acc, Ordering::Relaxed);
    }
    w.python_word(first + 1)
        .store(code as u64, Ordering::Relaxed);
    w.python_word(first + 2).store(
        first_line.max(0) as u64 | (qlen as u64) << 32 | (flen as u64) << 48,
        Ordering::Relaxed,
    );
    w.python_word(first + 3).store(
        llen as u64 | (py.minor as u64) << 32 | ((llen < full_llen) as u64) << 40,
        Ordering::Relaxed,
    );
    w.python_word(first)
        .store(words | PYTHON_RECORD_PUBLISHED, Ordering::Release);
    first
}

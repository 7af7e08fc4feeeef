//! Allocation sites: the one frame of a stack trace that `top`, `leaks`, `retainers`, `graph`,
//! `report` and the live view name a block by.
//!
//! A stack trace's innermost frames are usually allocator wrappers (`malloc` itself,
//! `operator new`, `_PyObject_Malloc`, `Perl_safesysmalloc`, `g_malloc`, Rust's `alloc::`
//! paths): charging memory to them says nothing. The site is the first frame, from the
//! innermost, whose function name does not match the wrapper pattern: a default list of known
//! wrappers (below), plus the user's `--drop-frames REGEX` (the same flag and meaning as
//! pprof's: a frame whose name matches is dropped from the top of the stack).
//!
//! A stack with Python frames (CPython's, spliced in by the shim) is named by the Python code
//! that made the interpreter allocate, as memray and py-spy show it: the interpreter's own
//! frames inside the innermost Python frame (`PyUnicode_New`, `new_keys_object`, an extension
//! module's C code) count as wrappers, and the site is the innermost Python function, unless a
//! C library outside the interpreter allocated (a function called through `ctypes`, a library
//! an extension module links): then that library's function is the site, as in a C program.
//! See [`python_hint`].

use regex::Regex;

/// Known allocator wrappers, as one anchored pattern over demangled function names
/// (alternatives joined with `|`). Sources: glibc's malloc family and `strdup`; libstdc++'s
/// `operator new`; CPython's `Objects/obmalloc.c` and `Modules/gcmodule.c`; perl's
/// `util.c` (`Perl_safesys*`); GLib's `gmem.c`; GNU's `xmalloc.c`; Rust's `alloc` crate and
/// the `__rust_alloc` shims the compiler emits.
pub const DEFAULT_WRAPPERS: &str = concat!(
    r"(malloc|calloc|realloc|reallocarray|free|posix_memalign|aligned_alloc|memalign|valloc|pvalloc",
    r"|__libc_\w+|strdup|strndup|__strdup|__strndup|wcsdup",
    r"|operator new.*|operator new\[\].*|_Znwm|_Znam|_ZnwmRKSt9nothrow_t|_ZnamRKSt9nothrow_t",
    r"|_?PyObject_(Malloc|Calloc|Realloc)|_?PyMem_\w+|_?PyObject_GC_\w+|gc_alloc|_PyObject_New\w*",
    r"|PyObject_(New|NewVar)|_PyObject_MallocWithType|pymalloc_\w+|_PyMem_RawMalloc",
    r"|Perl_safesys\w+|g_malloc\w*|g_realloc\w*|g_try_malloc\w*|g_slice_alloc\w*|g_new\w*",
    r"|xmalloc|xcalloc|xrealloc|xstrdup|xzalloc",
    r"|__rust_alloc\w*|__rust_realloc|__rdl_\w+|__rg_\w+|alloc::.*|<alloc::.*|std::alloc::.*",
    r"|<\w+ as core::alloc::global::GlobalAlloc>::\w+)"
);

/// Where a stack trace's Python frames are, for naming its site (see the module docs):
/// indices into its frames, innermost first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PythonHint {
    /// The innermost Python frame.
    pub innermost: u32,
    /// The frames inside it (indices below `innermost`) that are the interpreter's own code.
    pub interpreter: Vec<u32>,
}

/// What a frame of a stack trace is, for [`python_hint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind<'a> {
    /// A Python function's frame (a code object run by CPython's eval loop).
    Python,
    /// Native code: the file of the loaded object it lies in, if known.
    Native(Option<&'a str>),
}

/// The [`PythonHint`] of a stack trace whose frames are of these kinds (innermost first);
/// `None` without Python frames. The interpreter's own code is that of the object holding
/// the eval loop that ran the innermost Python frame — the first native frame outside it
/// (the `python3.X` executable, or `libpython3.X.so`), whatever the files are called — and
/// CPython's extension modules (`*.cpython-*.so`, `*.abi3.so`, PEP 3149's names).
pub fn python_hint(kinds: &[FrameKind<'_>]) -> Option<PythonHint> {
    let innermost = kinds.iter().position(|k| *k == FrameKind::Python)?;
    let eval = kinds[innermost..].iter().find_map(|k| match k {
        FrameKind::Native(file) => Some(*file),
        FrameKind::Python => None,
    });
    let extension = |file: &str| {
        let name = file.rsplit('/').next().unwrap_or(file);
        name.contains(".cpython-") || name.ends_with(".abi3.so")
    };
    let interpreter = (0..innermost)
        .filter(|&i| match kinds[i] {
            FrameKind::Native(Some(file)) => eval == Some(Some(file)) || extension(file),
            _ => false,
        })
        .map(|i| i as u32)
        .collect();
    Some(PythonHint {
        innermost: innermost as u32,
        interpreter,
    })
}

/// What [`Sites::site`] returns for a stack trace with no frames.
pub const NO_STACK: &str = "(no stack trace)";

/// Names allocation sites (see the module docs).
#[derive(Debug, Clone)]
pub struct Sites {
    wrappers: Regex,
}

impl Sites {
    /// The default wrappers, plus `drop_frames` (a regular expression matched against a whole
    /// function name, as pprof's `--drop_frames` does) when given.
    ///
    /// # Errors
    /// `drop_frames` is not a regular expression.
    pub fn new(drop_frames: Option<&str>) -> Result<Self, regex::Error> {
        let pattern = match drop_frames {
            Some(extra) => format!("^(?:{DEFAULT_WRAPPERS}|(?:{extra}))$"),
            None => format!("^(?:{DEFAULT_WRAPPERS})$"),
        };
        Ok(Sites {
            wrappers: Regex::new(&pattern)?,
        })
    }

    /// Whether `function` is an allocator wrapper (by the default list or `--drop-frames`).
    pub fn is_wrapper(&self, function: &str) -> bool {
        self.wrappers.is_match(function)
    }

    /// The site of a stack trace given as function names, innermost first: its first frame that
    /// is not a wrapper; the outermost frame when every frame is one; [`NO_STACK`] when empty.
    pub fn site<'a>(&self, frames: &'a [String]) -> &'a str {
        frames
            .iter()
            .find(|f| !self.is_wrapper(f))
            .or(frames.last())
            .map_or(NO_STACK, String::as_str)
    }

    /// As [`Self::site`], for a stack trace with Python frames where `hint` says (see the
    /// module docs): the first frame inside the innermost Python frame that is neither a
    /// wrapper nor the interpreter's own code, else the innermost Python frame.
    pub fn site_hinted<'a>(&self, frames: &'a [String], hint: Option<&PythonHint>) -> &'a str {
        let Some(h) = hint.filter(|h| (h.innermost as usize) < frames.len()) else {
            return self.site(frames);
        };
        let inner = h.innermost as usize;
        (frames[..inner].iter().enumerate())
            .find(|(i, f)| !h.interpreter.contains(&(*i as u32)) && !self.is_wrapper(f))
            .map_or(frames[inner].as_str(), |(_, f)| f.as_str())
    }
}

impl Default for Sites {
    fn default() -> Self {
        Sites::new(None).expect("the default wrapper pattern is a valid regular expression")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn skips_known_wrappers() {
        let s = Sites::default();
        assert_eq!(
            s.site(&names(&["_PyObject_Malloc", "PyUnicode_New", "main"])),
            "PyUnicode_New"
        );
        assert_eq!(
            s.site(&names(&[
                "operator new(unsigned long)",
                "Allocate(unsigned long)"
            ])),
            "Allocate(unsigned long)"
        );
        assert_eq!(
            s.site(&names(&[
                "alloc::raw_vec::finish_grow",
                "alloc::raw_vec::RawVec<T,A>::grow_one",
                "app::load"
            ])),
            "app::load"
        );
        assert_eq!(
            s.site(&names(&["Perl_safesysmalloc", "Perl_newSV"])),
            "Perl_newSV"
        );
        // `mallocx_wrapper` is not `malloc`: the pattern is anchored.
        assert_eq!(
            s.site(&names(&["mallocx_wrapper", "main"])),
            "mallocx_wrapper"
        );
    }

    #[test]
    fn all_wrappers_or_empty() {
        let s = Sites::default();
        assert_eq!(s.site(&names(&["malloc", "calloc"])), "calloc");
        assert_eq!(s.site(&[]), NO_STACK);
    }

    #[test]
    fn python_stacks_named_by_their_code() {
        use FrameKind::{Native, Python};
        let s = Sites::default();
        let py = Some("/usr/bin/python3.11");
        let libc = Some("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let json = Some("/usr/lib/python3.11/lib-dynload/_json.cpython-311-x86_64-linux-gnu.so");
        let lost = Some("/tmp/liblost.so");
        // malloc, PyUnicode_New, scanstring (in _json), loads (Python), parse (Python),
        // _PyEval_EvalFrameDefault, main.
        let kinds = [
            Native(libc),
            Native(py),
            Native(json),
            Python,
            Python,
            Native(py),
            Native(py),
        ];
        let h = python_hint(&kinds).unwrap();
        assert_eq!(
            h,
            PythonHint {
                innermost: 3,
                interpreter: vec![1, 2]
            }
        );
        let frames = names(&[
            "malloc",
            "PyUnicode_New",
            "scanstring",
            "loads",
            "parse",
            "_PyEval_EvalFrameDefault",
            "main",
        ]);
        assert_eq!(s.site_hinted(&frames, Some(&h)), "loads");
        assert_eq!(s.site(&frames), "PyUnicode_New");
        // A C library called from Python (ctypes) keeps its own site.
        let kinds = [Native(libc), Native(lost), Native(py), Python, Native(py)];
        let h = python_hint(&kinds).unwrap();
        let frames = names(&["malloc", "lose_one", "_ctypes_callproc", "run", "eval"]);
        assert_eq!(s.site_hinted(&frames, Some(&h)), "lose_one");
        // No Python frame, or a hint that does not fit: as before.
        assert_eq!(python_hint(&[Native(libc), Native(py)]), None);
        assert_eq!(s.site_hinted(&names(&["malloc", "f"]), Some(&h)), "f");
    }

    #[test]
    fn drop_frames_adds_to_the_defaults() {
        let s = Sites::new(Some("my_alloc|pool_.*")).unwrap();
        assert_eq!(s.site(&names(&["malloc", "pool_get", "work"])), "work");
        assert!(Sites::new(Some("(")).is_err());
    }
}

//! Allocation sites: the one frame of a stack trace that `top`, `leaks`, `retainers`, `graph`,
//! `report` and the live view name a block by.
//!
//! A stack trace's innermost frames are usually allocator wrappers (`malloc` itself,
//! `operator new`, `_PyObject_Malloc`, `Perl_safesysmalloc`, `g_malloc`, Rust's `alloc::`
//! paths): charging memory to them says nothing. The site is the first frame, from the
//! innermost, whose function name does not match the wrapper pattern: a default list of known
//! wrappers (below), plus the user's `--drop-frames REGEX` (the same flag and meaning as
//! pprof's: a frame whose name matches is dropped from the top of the stack).

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
    fn drop_frames_adds_to_the_defaults() {
        let s = Sites::new(Some("my_alloc|pool_.*")).unwrap();
        assert_eq!(s.site(&names(&["malloc", "pool_get", "work"])), "work");
        assert!(Sites::new(Some("(")).is_err());
    }
}

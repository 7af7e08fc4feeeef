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
//! A stack with script frames — Python's (CPython's, spliced in by the shim) or JavaScript's
//! (node's, named by its perf map) — is named by the script code that made the runtime
//! allocate, as memray and py-spy, or DevTools for JavaScript, show it: the runtime's own frames
//! inside the innermost script frame (`PyUnicode_New`, `new_keys_object`, an extension
//! module's C code; V8's and node's C++, node's own JavaScript library `node:*`) count as
//! wrappers, and the site is the innermost script function, unless a C library outside the
//! runtime allocated (a function called through `ctypes`, a library an extension module or a
//! node addon links): then that library's function is the site, as in a C program. See
//! [`script_hint`].

use regex::Regex;

/// Known allocator wrappers, as one anchored pattern over demangled function names
/// (alternatives joined with `|`). Sources: glibc's malloc family and `strdup`; libstdc++'s
/// `operator new`; CPython's `Objects/obmalloc.c` and `Modules/gcmodule.c`; perl's
/// `util.c` (`Perl_safesys*`); GLib's `gmem.c`; GNU's `xmalloc.c`; OpenSSL's
/// `crypto/mem.c` (`CRYPTO_malloc`, `CRYPTO_zalloc`, …: helper S, 1, every libcrypto caller
/// was one `CRYPTO_zalloc` site); Rust's `alloc` crate and
/// the `__rust_alloc` shims the compiler emits; the C++ standard library's own functions
/// (`std::`, `__gnu_cxx::`: `std::__new_allocator<T>::allocate`, `std::vector<T>::
/// _M_realloc_insert`, `std::__cxx11::basic_string<…>::_M_create`, `std::make_shared`, …,
/// with the `void ` a demangled member template's name starts with), as Rust's `alloc::`:
/// helper G found every container's block charged to `std::__new_allocator<char>::allocate`,
/// one site for all its callers. Rust's `core::` (it never allocates by itself: its frames are
/// iterators and closures calling into the program), `hashbrown::` (std's `HashMap`), trait
/// implementations of `alloc`'s traits (`<u8 as alloc::vec::spec_from_elem::SpecFromElem>`),
/// any `GlobalAlloc` implementation, and heapdump's own `#[global_allocator]`
/// (`heapdump_instrumentation::`): helper T, 2.
pub const DEFAULT_WRAPPERS: &str = concat!(
    r"(malloc|calloc|realloc|reallocarray|free|posix_memalign|aligned_alloc|memalign|valloc|pvalloc",
    r"|__libc_\w+|strdup|strndup|__strdup|__strndup|wcsdup|__GI___strn?dup",
    r"|operator new.*|operator new\[\].*|_Znwm|_Znam|_ZnwmRKSt9nothrow_t|_ZnamRKSt9nothrow_t",
    r"|_?PyObject_(Malloc|Calloc|Realloc)|_?PyMem_\w+|_?PyObject_GC_\w+|gc_alloc|_PyObject_New\w*",
    r"|PyObject_(New|NewVar)|_PyObject_MallocWithType|pymalloc_\w+|_PyMem_RawMalloc",
    r"|Perl_safesys\w+|g_malloc\w*|g_realloc\w*|g_try_malloc\w*|g_slice_alloc\w*|g_new\w*",
    r"|xmalloc|xcalloc|xrealloc|xstrdup|xzalloc",
    r"|CRYPTO_(?:malloc|zalloc|realloc|clear_realloc|strdup|strndup|memdup|secure_malloc|secure_zalloc)",
    r"|__rust_alloc\w*|__rust_realloc|__rdl_\w+|__rg_\w+|alloc::.*|<alloc::.*|std::alloc::.*",
    r"|<.+ as (?:core::alloc|alloc)::.*|core::.*|<core::.*|hashbrown::.*|<hashbrown::.*",
    r"|heapdump_instrumentation::.*|<heapdump_instrumentation::.*|__rustc::.*|<std::.*",
    r"|(?:void )?(?:std|__gnu_cxx)::.*)"
);

/// The module path of a file of Rust's standard library as rustc's debug information names
/// it (`/rustc/HASH/library/alloc/src/raw_vec/mod.rs` → `alloc::raw_vec`; the library's own
/// dependencies, `/rust/deps/hashbrown-0.15.2/src/raw/mod.rs` → `hashbrown::raw`), and of
/// heapdump's `#[global_allocator]` (`…/instrumentation/src/global_alloc.rs`); `None` for any
/// other file.
pub fn rust_library_module(file: &str) -> Option<String> {
    // heapdump's own `#[global_allocator]` (instrumentation/src/global_alloc.rs, by path or
    // from a registry), compiled into the program: its generic `alloc<std::alloc::System>`.
    if let Some(dir) = file.strip_suffix("/src/global_alloc.rs") {
        let krate = dir.rsplit('/').next().unwrap_or(dir);
        if krate == "instrumentation" || krate.starts_with("heapdump-instrumentation") {
            return Some("heapdump_instrumentation::global_alloc".to_owned());
        }
    }
    let rest = if let Some(r) = file.strip_prefix("/rustc/") {
        r.split_once('/')?.1.strip_prefix("library/")?
    } else {
        file.strip_prefix("/rust/deps/")?
    };
    let (krate, path) = rest.split_once('/')?;
    // A dependency's directory is NAME-VERSION.
    let krate = match krate.rsplit_once('-') {
        Some((name, v)) if v.starts_with(|c: char| c.is_ascii_digit()) => name,
        _ => krate,
    };
    let path = path
        .strip_prefix("src/")
        .unwrap_or(path)
        .strip_suffix(".rs")?;
    let mut module = krate.replace('-', "_");
    let mut segs: Vec<&str> = path.split('/').collect();
    if matches!(segs.last(), Some(&"mod") | Some(&"lib")) {
        segs.pop();
    }
    for s in segs {
        module.push_str("::");
        module.push_str(s);
    }
    Some(module)
}

/// A frame's function name for naming sites: a function of Rust's standard library that its
/// debug information names without its path (`debug = "line-tables-only"`, inlined frames:
/// `alloc<std::alloc::System>`, `grow_impl_runtime`, `{closure#0}`) gets its module's path
/// from its file (`std::alloc::alloc<std::alloc::System>`), so that it is known for the
/// library code it is (helper T, 2: Rust programs' sites were `alloc`, `grow_impl_runtime`);
/// any other name as it is.
pub fn qualified_name<'a>(function: &'a str, file: &str) -> std::borrow::Cow<'a, str> {
    let head = function.split('<').next().unwrap_or(function);
    if head.contains("::") || function.starts_with('<') {
        return function.into();
    }
    match rust_library_module(file) {
        Some(m) => format!("{m}::{function}").into(),
        None => function.into(),
    }
}

/// Where a stack trace's script frames are, for naming its site (see the module docs):
/// indices into its frames, innermost first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScriptHint {
    /// The innermost script frame of the program's own code.
    pub innermost: u32,
    /// The frames inside it (indices below `innermost`, ascending) that are the runtime's own
    /// code.
    pub interpreter: Vec<u32>,
    /// The site's name when it is the innermost script frame ([`script_label`]: function and
    /// file, as py-spy and memray show Python code); empty: the frame's function name.
    pub label: String,
    /// The stack's other script frames of the program's own code, outside the innermost
    /// (indices ascending), with their labels: the site when `--drop-frames` drops the ones
    /// inside them.
    pub outer: Vec<(u32, String)>,
}

/// A script frame's name as a site: `FUNCTION (FILE)`, FILE the source file's name without
/// its directories (`build_names (app.py)`, `makeBuffers (server.js)`), with its directory for
/// a package's `__init__.py`/`__main__.py` or a JavaScript `index.*` (`<module>
/// (json/__init__.py)`): functions of the same name in different files (`__init__`,
/// `<module>`, `<lambda>`, `(anonymous)`) are different sites. Just `FUNCTION` without a file.
pub fn script_label(function: &str, file: &str) -> String {
    let file = file.strip_prefix("file://").unwrap_or(file);
    if file.is_empty() {
        return function.to_owned();
    }
    let mut parts = file.rsplit('/');
    let base = parts.next().unwrap_or(file);
    let generic = matches!(
        base,
        "__init__.py" | "__main__.py" | "index.js" | "index.mjs" | "index.cjs"
    );
    match parts.next().filter(|d| generic && !d.is_empty()) {
        Some(dir) => format!("{function} ({dir}/{base})"),
        None => format!("{function} ({base})"),
    }
}

/// What a frame of a stack trace is, for [`script_hint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind<'a> {
    /// A script function's frame: Python code run by CPython's eval loop, or JavaScript
    /// compiled by V8.
    Script,
    /// A script function of the runtime's own library (node's `node:*` JavaScript).
    Runtime,
    /// Native code: the file of the loaded object it lies in, if known.
    Native(Option<&'a str>),
}

/// The kind of a frame that a JIT's perf map or CPython's frames name `system` (CPython's
/// `py::QUALNAME:FILE`; V8's `JS:*name file:line:column`, `LazyCompile:…`, `Function:…`,
/// `Script:…`, `Eval:…`), its source file `file`; `None` for any other name (V8's `Builtin:…`,
/// other JITs).
pub fn script_kind(system: &str, file: &str) -> Option<FrameKind<'static>> {
    if system.starts_with("py::") {
        return Some(FrameKind::Script);
    }
    let js = ["JS:", "LazyCompile:", "Function:", "Script:", "Eval:"];
    if !js.iter().any(|k| system.starts_with(k)) {
        return None;
    }
    Some(if file.starts_with("node:") {
        FrameKind::Runtime
    } else {
        FrameKind::Script
    })
}

/// The [`ScriptHint`] of a stack trace whose frames are of these kinds (innermost first);
/// `None` without script frames. Its innermost frame is the first [`FrameKind::Script`] one
/// (else the first [`FrameKind::Runtime`] one). The runtime's own code inside it: the
/// [`FrameKind::Runtime`] frames, and the native code of the object that ran the innermost
/// script frame — the first native frame outside it (CPython's eval loop in `python3.X` or
/// `libpython3.X.so`, V8's entry trampoline in `node`), whatever the files are called — and of
/// CPython's extension modules (`*.cpython-*.so`, `*.abi3.so`, PEP 3149's names) and of libffi
/// (`libffi.so*`, ctypes' calls).
pub fn script_hint(kinds: &[FrameKind<'_>]) -> Option<ScriptHint> {
    let innermost = (kinds.iter().position(|k| *k == FrameKind::Script))
        .or_else(|| kinds.iter().position(|k| *k == FrameKind::Runtime))?;
    let outer = ((innermost + 1)..kinds.len())
        .filter(|&i| kinds[innermost] == FrameKind::Script && kinds[i] == FrameKind::Script)
        .map(|i| (i as u32, String::new()))
        .collect();
    // A stack cut at the frame limit (a deep recursion of Python functions, which call each
    // other with no C frame between, or of JavaScript) may hold no native frame outside the
    // innermost script frame: then the object of the nearest named native frame inside it,
    // the code the script called into (the eval loop, V8's builtins) stands for the runtime.
    let eval = kinds[innermost..]
        .iter()
        .find_map(|k| match k {
            FrameKind::Native(file) => Some(*file),
            _ => None,
        })
        .or_else(|| {
            kinds[..innermost].iter().rev().find_map(|k| match k {
                FrameKind::Native(Some(file)) => Some(Some(*file)),
                _ => None,
            })
        });
    // libffi too: ctypes' call machinery, whose unnamed trampoline was the site of every
    // block a script allocated by calling `malloc` itself through ctypes (helper O, 2: two
    // functions' leaks merged into one `libffi.so.8+0x6f79`); a library function called
    // through ctypes is innermost and keeps its site.
    let extension = |file: &str| {
        let name = file.rsplit('/').next().unwrap_or(file);
        name.contains(".cpython-") || name.ends_with(".abi3.so") || name.starts_with("libffi.so")
    };
    let interpreter = (0..innermost)
        .filter(|&i| match kinds[i] {
            FrameKind::Native(Some(file)) => eval == Some(Some(file)) || extension(file),
            FrameKind::Runtime => true,
            _ => false,
        })
        .map(|i| i as u32)
        .collect();
    Some(ScriptHint {
        innermost: innermost as u32,
        interpreter,
        label: String::new(),
        outer,
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

    /// As [`Self::site`], for a stack trace with script frames where `hint` says (see the
    /// module docs): the first frame inside the innermost script frame that is neither a
    /// wrapper nor the runtime's own code, else the innermost script frame.
    pub fn site_hinted<'a>(&self, frames: &'a [String], hint: Option<&'a ScriptHint>) -> &'a str {
        let Some(h) = hint.filter(|h| (h.innermost as usize) < frames.len()) else {
            return self.site(frames);
        };
        let inner = h.innermost as usize;
        let named = |i: usize, label: &'a str| -> &'a str {
            if label.is_empty() {
                frames[i].as_str()
            } else {
                label
            }
        };
        let native = (frames[..inner].iter().enumerate()).find(|(i, f)| {
            h.interpreter.binary_search(&(*i as u32)).is_err() && !self.is_wrapper(f)
        });
        if let Some((_, f)) = native {
            return f;
        }
        // The script frames from the innermost out, past those `--drop-frames` drops; the
        // outermost when it drops them all.
        let scripts = std::iter::once((inner, h.label.as_str()))
            .chain(h.outer.iter().map(|(i, l)| (*i as usize, l.as_str())))
            .filter(|(i, _)| *i < frames.len());
        let mut last = (inner, h.label.as_str());
        for (i, label) in scripts {
            if !self.is_wrapper(&frames[i]) {
                return named(i, label);
            }
            last = (i, label);
        }
        named(last.0, last.1)
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
    fn rust_library_frames_are_named_by_their_module() {
        let std_alloc = "/rustc/0123456789abcdef/library/std/src/alloc.rs";
        assert_eq!(
            qualified_name("alloc<std::alloc::System>", std_alloc),
            "std::alloc::alloc<std::alloc::System>"
        );
        assert_eq!(
            qualified_name(
                "grow_impl_runtime",
                "/rustc/0123456789abcdef/library/alloc/src/raw_vec/mod.rs"
            ),
            "alloc::raw_vec::grow_impl_runtime"
        );
        assert_eq!(
            rust_library_module("/rust/deps/hashbrown-0.15.2/src/raw/mod.rs").as_deref(),
            Some("hashbrown::raw")
        );
        assert_eq!(
            qualified_name("thread_work", "/home/u/app/src/main.rs"),
            "thread_work"
        );
        assert_eq!(
            qualified_name(
                "alloc<std::alloc::System>",
                "/home/u/.cargo/registry/src/x/heapdump-instrumentation-0.1.0/src/global_alloc.rs"
            ),
            "heapdump_instrumentation::global_alloc::alloc<std::alloc::System>"
        );
        assert_eq!(qualified_name("app::load", std_alloc), "app::load");
        // What the Rust programs of helper T showed as sites, and their own code.
        let s = Sites::default();
        let stack = |v: &[(&str, &str)]| -> Vec<String> {
            v.iter()
                .map(|(f, file)| qualified_name(f, file).into_owned())
                .collect()
        };
        let lib = |p: &str| format!("/rustc/0123456789abcdef/library/{p}");
        let (a, r, f) = (
            lib("std/src/alloc.rs"),
            lib("alloc/src/raw_vec/mod.rs"),
            lib("alloc/src/fmt.rs"),
        );
        for frames in [
            vec![("alloc<std::alloc::System>", a.as_str()), ("work::thread_work", "src/main.rs")],
            vec![
                ("<heapdump_instrumentation::global_alloc::HeapdumpAlloc<A> as core::alloc::global::GlobalAlloc>::alloc", ""),
                ("__rustc::__rust_alloc", ""),
                ("grow_impl_runtime", r.as_str()),
                ("work::thread_work", "src/main.rs"),
            ],
            vec![
                ("<u8 as alloc::vec::spec_from_elem::SpecFromElem>::from_elem", ""),
                ("hashbrown::raw::alloc::inner::do_alloc", ""),
                ("{closure#0}", f.as_str()),
                ("core::option::Option<T>::map_or_else", ""),
                ("work::thread_work", "src/main.rs"),
            ],
        ] {
            assert_eq!(s.site(&stack(&frames)), "work::thread_work", "{frames:?}");
        }
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
        // glibc's internal name of strdup (helper K, 5).
        assert_eq!(
            s.site(&names(&["malloc", "__GI___strdup", "build_hash"])),
            "build_hash"
        );
        // libstdc++'s layers between `operator new` and the program (helper G, 3).
        assert_eq!(
            s.site(&names(&[
                "operator new(unsigned long)",
                "std::__new_allocator<char>::allocate(unsigned long, void const*)",
                "void std::vector<char, std::allocator<char> >::_M_realloc_insert<char const&>(__gnu_cxx::__normal_iterator<char*, std::vector<char, std::allocator<char> > >, char const&)",
                "std::vector<char, std::allocator<char> >::push_back(char const&)",
                "fill_cache(int)",
                "main"
            ])),
            "fill_cache(int)"
        );
        assert_eq!(
            s.site(&names(&[
                "operator new(unsigned long)",
                "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >::_M_create(unsigned long&, unsigned long)",
                "__gnu_cxx::__aligned_buffer<int>::_M_addr()",
                "Cache::put(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&)",
            ])),
            "Cache::put(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&)"
        );
        // OpenSSL's allocator (helper S, 1).
        assert_eq!(
            s.site(&names(&["malloc", "CRYPTO_zalloc", "BN_new", "make_keys"])),
            "BN_new"
        );
        assert_eq!(
            s.site(&names(&["malloc", "CRYPTO_strndup", "make_names"])),
            "make_names"
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
    fn script_stacks_named_by_their_code() {
        use FrameKind::{Native, Runtime, Script};
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
            Script,
            Script,
            Native(py),
            Native(py),
        ];
        let h = script_hint(&kinds).unwrap();
        assert_eq!(
            h,
            ScriptHint {
                innermost: 3,
                interpreter: vec![1, 2],
                label: String::new(),
                outer: vec![(4, String::new())],
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
        let kinds = [Native(libc), Native(lost), Native(py), Script, Native(py)];
        let h = script_hint(&kinds).unwrap();
        let frames = names(&["malloc", "lose_one", "_ctypes_callproc", "run", "eval"]);
        assert_eq!(s.site_hinted(&frames, Some(&h)), "lose_one");
        // ... also in a stack cut at the frame limit, all script frames outside (helper D, 3:
        // a recursion 58 Python functions deep was named after PyByteArray_Resize).
        let kinds = [Native(libc), Native(lost), Native(py), Script, Script];
        let h = script_hint(&kinds).unwrap();
        let frames = names(&[
            "malloc",
            "lose_one",
            "_ctypes_callproc",
            "depth58",
            "depth57",
        ]);
        assert_eq!(s.site_hinted(&frames, Some(&h)), "lose_one");
        // `malloc` itself called through ctypes: libffi's unnamed frames are the runtime's,
        // the site the script's function (helper O, 2).
        let ffi = Some("/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2");
        let ctypes =
            Some("/usr/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so");
        let kinds = [
            Native(libc),
            Native(ffi),
            Native(ffi),
            Native(ctypes),
            Native(py),
            Script,
            Native(py),
        ];
        let h = script_hint(&kinds).unwrap();
        assert_eq!(h.interpreter, vec![1, 2, 3, 4]);
        let frames = names(&[
            "malloc",
            "libffi.so.8+0x6f79",
            "ffi_call",
            "_ctypes_callproc",
            "_PyEval_EvalFrameDefault",
            "c_leak",
            "main",
        ]);
        assert_eq!(s.site_hinted(&frames, Some(&h)), "c_leak");
        let kinds = [Native(libc), Native(py), Native(py), Script, Script];
        let h = script_hint(&kinds).unwrap();
        assert_eq!(h.interpreter, vec![1, 2]);
        let frames = names(&[
            "malloc",
            "PyByteArray_Resize",
            "_PyEval_EvalFrameDefault",
            "depth58",
            "depth57",
        ]);
        assert_eq!(s.site_hinted(&frames, Some(&h)), "depth58");
        // node: V8's and node's C++, and node's own JavaScript (`node:buffer`'s `alloc`), are
        // the runtime; the site is the program's function.
        let node = Some("/usr/bin/node");
        let kinds = [
            Native(libc),
            Native(node),
            Runtime,
            Runtime,
            Native(node),
            Script,
            Native(node),
        ];
        let h = script_hint(&kinds).unwrap();
        assert_eq!(h.interpreter, vec![1, 2, 3, 4]);
        let frames = names(&[
            "calloc",
            "node::NodeArrayBufferAllocator::Allocate",
            "createUnsafeBuffer",
            "alloc",
            "Builtins_InterpreterEntryTrampoline",
            "makeBuffers",
            "Builtins_JSEntryTrampoline",
        ]);
        assert_eq!(s.site_hinted(&frames, Some(&h)), "makeBuffers");
        // Only node's own JavaScript (start-up): its innermost function.
        let h = script_hint(&[Native(libc), Native(node), Runtime, Native(node)]).unwrap();
        assert_eq!(
            h,
            ScriptHint {
                innermost: 2,
                interpreter: vec![1],
                label: String::new(),
                outer: vec![],
            }
        );
        assert_eq!(
            script_kind("JS:*makeBuffers /tmp/b.js:1:21", "/tmp/b.js"),
            Some(Script)
        );
        assert_eq!(
            script_kind("JS:~alloc node:buffer:389:30", "node:buffer"),
            Some(Runtime)
        );
        assert_eq!(script_kind("py::run:app.py", "app.py"), Some(Script));
        assert_eq!(script_kind("Builtin:ArrayPrototypePush", ""), None);
        // `--drop-frames` dropping the innermost script function: its caller's.
        let d = Sites::new(Some("makeBuffers")).unwrap();
        let kinds = [
            Native(libc),
            Native(node),
            Script,
            Script,
            Native(node),
            Script,
        ];
        let mut h = script_hint(&kinds).unwrap();
        assert_eq!(h.outer, vec![(3, String::new()), (5, String::new())]);
        h.outer[0].1 = "serve (app.js)".into();
        let frames = names(&["calloc", "x", "makeBuffers", "serve", "y", "main"]);
        assert_eq!(d.site_hinted(&frames, Some(&h)), "serve (app.js)");
        let d = Sites::new(Some("makeBuffers|serve|main")).unwrap();
        assert_eq!(d.site_hinted(&frames, Some(&h)), "main");
        // With its label (function and file).
        let mut h = script_hint(&kinds).unwrap();
        h.label = script_label("makeBuffers", "file:///srv/app/server.js");
        assert_eq!(s.site_hinted(&frames, Some(&h)), "makeBuffers (server.js)");
        assert_eq!(
            script_label("<module>", "/usr/lib/python3.11/json/__init__.py"),
            "<module> (json/__init__.py)"
        );
        assert_eq!(script_label("f", "<string>"), "f (<string>)");
        assert_eq!(script_label("f", ""), "f");
        assert_eq!(script_label("g", "index.js"), "g (index.js)");
        // No script frame, or a hint that does not fit: as before.
        assert_eq!(script_hint(&[Native(libc), Native(py)]), None);
        assert_eq!(s.site_hinted(&names(&["malloc", "f"]), Some(&h)), "f");
    }

    #[test]
    fn drop_frames_adds_to_the_defaults() {
        let s = Sites::new(Some("my_alloc|pool_.*")).unwrap();
        assert_eq!(s.site(&names(&["malloc", "pool_get", "work"])), "work");
        assert!(Sites::new(Some("(")).is_err());
    }
}

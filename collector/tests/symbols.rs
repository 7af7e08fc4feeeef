//! Symbols and labels (issue 8, B3): relative `dlopen` paths, a library mapped where an
//! unloaded one was, C++ names as `c++filt` prints them, Rust programs at every debug-info
//! level, and the `bytes` label.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

const KIB: i64 = 1024;
const MIB: i64 = 1024 * 1024;

/// File names of the mappings of `profile` that hold a location through function `f`.
fn mappings_through(profile: &Path, f: &str) -> Vec<String> {
    let p = decode(profile);
    let locs = locations_of(&p, f);
    let mut names: Vec<String> = p
        .location
        .iter()
        .filter(|l| locs.contains(&l.id))
        .filter_map(|l| p.mapping.iter().find(|m| m.id == l.mapping_id))
        .map(|m| p.string_table[m.filename as usize].clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn relative_dlopen_path_is_recorded_absolute_and_symbolized() {
    // dlopen("./libplug.so") from the library's own directory: the loader keeps the path as
    // given; the module table must hold the file's absolute path.
    let lib = compile_lib("plugin.c", "libplug.so", &[]);
    let exe = compile_c("dlopener", &["-ldl"]);
    let dir = region_dir("reldlopen");
    let mut cmd = Command::new(&exe);
    cmd.arg("./libplug.so").current_dir(lib.parent().unwrap());
    let r = start(cmd, &dir, true);
    let profile = snapshot(&dir, r.pid(), &[]);
    let raw = pprof_raw(&profile);
    assert_eq!(raw.sum_with("plugin_alloc"), [100, 300_000, 100, 300_000]);
    let lib_abs = std::fs::canonicalize(&lib).unwrap();
    assert_eq!(
        mappings_through(&profile, "plugin_alloc"),
        [lib_abs.to_str().unwrap()]
    );
    assert_eq!(r.finish(), 0);
}

#[test]
fn library_mapped_where_an_unloaded_one_was_is_preferred() {
    // Library A allocates 10 × 1000 B (kept), is dlclosed; library B, built from the same
    // source, is mapped at the same address and allocates 20 × 2000 B (kept).
    let a = compile_lib("swaplib.c", "libswapa.so", &["-DLIB_ALLOC=a_alloc"]);
    let b = compile_lib("swaplib.c", "libswapb.so", &["-DLIB_ALLOC=b_alloc"]);
    let exe = compile_c("dlswap", &["-ldl"]);
    let dir = region_dir("dlswap");
    let mut cmd = Command::new(&exe);
    cmd.arg(&a).arg(&b);
    let r = start(cmd, &dir, true);
    assert_eq!(
        r.ready[1], r.ready[2],
        "the loader did not map B where A was: nothing to test"
    );
    let profile = snapshot(&dir, r.pid(), &[]);
    let raw = pprof_raw(&profile);
    // B's frames are B's. A's blocks, allocated at the same addresses before A was unloaded,
    // are attributed to B too: the region does not say when a module was mapped, and equal
    // return addresses share one stack trace (the limitation documented at `module_of`).
    assert_eq!(raw.sum_with("b_alloc")[2..], [30, 10 * 1000 + 20 * 2000]);
    assert_eq!(raw.sum_with("a_alloc"), [0, 0, 0, 0]);
    assert_eq!(mappings_through(&profile, "b_alloc"), [b.to_str().unwrap()]);
    assert_eq!(r.finish(), 0);
}

#[test]
fn cpp_constructor_templates_named_as_cxxfilt_does() {
    let exe = target_dir().join("test-bins/cpp_names");
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    let st = Command::new("g++")
        .args(["-O0", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(root().join("examples/c/cpp_names.cc"))
        .status()
        .expect("g++ must be installed");
    assert!(st.success());
    let dir = region_dir("cppnames");
    let r = start(Command::new(&exe), &dir, true);
    // Read directly: `go tool pprof -raw` prints these names shortened (with the full name in
    // parentheses).
    let p = decode(&snapshot(&dir, r.pid(), &[]));
    let cxxfilt = |m: &str| {
        let out = Command::new("c++filt").arg(m).output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let string_ctor =
        cxxfilt("_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEC2IS3_EEmcRKS3_");
    assert_eq!(
        string_ctor,
        "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >\
         ::basic_string<std::allocator<char> >(unsigned long, char, std::allocator<char> const&)"
    );
    let a_ctor = cxxfilt("_ZN1AC2IiEEmc");
    assert_eq!(a_ctor, "A::A<int>(unsigned long, char)");
    // std::string(300, 'x'): one 301-byte buffer; A(1000, 'y'): one 1000-byte block.
    assert_eq!(sum_through(&p, &string_ctor)[2..], [1, 301]);
    assert_eq!(sum_through(&p, &a_ctor)[2..], [1, 1000]);
    assert_eq!(r.finish(), 0);
}

/// Builds examples/rust-alloc with `debug = LEVEL` (and no frame pointers) into a target
/// directory of its own, runs it, and checks the profile: exact per function, fully qualified
/// names, the Rust and C `main`s apart, and no frame of the allocator path left.
fn rust_at_debug_level(level: &str) {
    let target = target_dir()
        .parent()
        .unwrap()
        .join(format!("debug-{level}"));
    let st = Command::new(env!("CARGO"))
        // Not the test's stdin: rustc's probe reads from a pipe cargo gives it, and a build
        // started with an odd stdin once failed with "couldn't read from stdin".
        .stdin(std::process::Stdio::null())
        .args(["build", "--release", "-q", "-p", "rust-alloc-example"])
        .args(["--bin", "rust-alloc-example"])
        .current_dir(root())
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_PROFILE_RELEASE_DEBUG", level)
        .env("RUSTFLAGS", "-C force-frame-pointers=no")
        .status()
        .unwrap();
    assert!(st.success(), "building the example with debug = {level}");
    let dir = region_dir(&format!("rust-debug-{level}"));
    let r = start(
        Command::new(target.join("release/rust-alloc-example")),
        &dir,
        false,
    );
    let (blocks, bytes) = r.tally();
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
    let f = |n: &str| raw.sum_with(&format!("rust_alloc_example::{n}"));
    assert_eq!(f("alloc_small")[2..], [1000, 1000 * KIB], "debug = {level}");
    assert_eq!(f("alloc_medium")[2..], [100, 6400 * KIB], "debug = {level}");
    assert_eq!(f("alloc_large")[2..], [10, 10 * MIB], "debug = {level}");
    let t = raw.total();
    assert_eq!((t[2], t[3]), (blocks, bytes), "debug = {level}");
    // Rust's main and the C main rustc generates are two frames, not one.
    let alloc_small = raw
        .samples
        .iter()
        .find(|s| s.values[2] == 1000)
        .expect("the alloc_small sample");
    let names: Vec<&str> = alloc_small
        .locations
        .iter()
        .flat_map(|l| raw.locations[l].iter())
        .map(|l| l.split(' ').next().unwrap_or(""))
        .collect();
    assert!(
        names.contains(&"main") && names.contains(&"rust_alloc_example::main"),
        "debug = {level}: {names:?}"
    );
    // The leaf of every sample is the program's, never the allocator path.
    for s in &raw.samples {
        let Some(leaf) = s.locations.first() else {
            continue;
        };
        for l in &raw.locations[leaf] {
            assert!(
                !l.contains("__rust_alloc")
                    && !l.contains("__rust_realloc")
                    && !l.contains("__rg_")
                    && !l.contains("__rdl_")
                    && !l.contains("HeapdumpAlloc")
                    && !l.contains("heapdump_instrumentation"),
                "debug = {level}: allocator frame {l:?} in {:?}",
                raw.locations[leaf]
            );
        }
    }
    assert_eq!(r.finish(), 0);
}

#[test]
fn rust_without_debug_info() {
    rust_at_debug_level("false");
}

#[test]
fn rust_with_line_tables_only() {
    rust_at_debug_level("line-tables-only");
}

#[test]
fn rust_with_full_debug_info() {
    rust_at_debug_level("true");
}

#[test]
fn bytes_label_is_the_block_size() {
    let exe = compile_c("two_sizes", &["-fno-optimize-sibling-calls"]);
    let dir = region_dir("two-sizes");
    let r = start(Command::new(&exe), &dir, true);
    let raw = pprof_raw(&snapshot(&dir, r.pid(), &[]));
    let through = |f: &str| -> Vec<(Vec<String>, [i64; 4])> {
        let mut v: Vec<_> = raw
            .samples
            .iter()
            .filter(|s| {
                s.locations.iter().any(|l| {
                    raw.locations[l]
                        .iter()
                        .any(|x| x.starts_with(&format!("{f} ")))
                })
            })
            .map(|s| {
                // `go tool pprof -raw` prints a numeric label as "VALUE UNIT".
                let bytes = s.labels.get("bytes").map(|v| {
                    assert_eq!(v.len(), 2, "one bytes label: {v:?}");
                    assert_eq!(v[1], "bytes");
                    vec![v[0].clone()]
                });
                (bytes.unwrap_or_default(), s.values)
            })
            .collect();
        v.sort();
        v
    };
    // alloc_n, called from two places in main. The first stack keeps 30 × 100 B and
    // 20 × 200 B: one sample per size, labelled with it; its cumulative counts (50
    // allocations, of both sizes) on a sample of their own, with no size. The second
    // allocated and freed 10 × 300 B: cumulative counts only.
    assert_eq!(
        through("alloc_n"),
        [
            (vec![], [10, 10 * 300, 0, 0]),
            (vec![], [50, 30 * 100 + 20 * 200, 0, 0]),
            (vec!["100".to_owned()], [0, 0, 30, 3000]),
            (vec!["200".to_owned()], [0, 0, 20, 4000]),
        ]
    );
    // alloc_fixed: every block it allocated is live and of one size: one sample.
    assert_eq!(
        through("alloc_fixed"),
        [(vec!["64".to_owned()], [5, 320, 5, 320])]
    );
    assert_eq!(r.finish(), 0);
}

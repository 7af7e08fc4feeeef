//! The shim's recording path (issue 20): its thread state found without `__tls_get_addr`
//! still loads by `dlopen`, and stacks reused from the previous capture are exactly the stacks
//! a full walk gives.

mod common;

use common::*;
use std::process::Command;

/// The shim keeps its thread-state pointer in a TLS word read through a TLS descriptor; an
/// initial-exec access would have marked the whole module `STATIC_TLS` and made `dlopen` fail
/// ("cannot allocate memory in static TLS block"). A program started without the shim loads
/// it by `dlopen` and allocates through its `malloc` from 4 threads. A `dlopen`ed shim records
/// only once `heapdump attach` starts it (tests/attach.rs): until then every call passes
/// through, none starts recording lazily (no region appears), and the program runs to its end.
#[test]
fn shim_loads_by_dlopen() {
    if !can_run("shim_loads_by_dlopen") {
        return;
    }
    let exe = compile_c("dlopen_shim", &["-fno-optimize-sibling-calls", "-ldl"]);
    let dir = region_dir("dlopen-shim");
    let mut cmd = Command::new(&exe);
    cmd.arg(shim());
    let r = start(cmd, &dir, false);
    assert_eq!(
        r.ready[1..],
        ["400", "19200"],
        "dlopen failed: {:?}",
        r.ready
    );
    let regions: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        regions.is_empty(),
        "a dlopened shim started recording by itself: {regions:?}"
    );
    assert_eq!(r.finish(), 0);
}

/// Compiles examples/c/reuse_fool.cc (C++: it throws), without frame pointers: the CFI walk
/// looks for the previous capture only at frames that keep none.
fn reuse_fool() -> std::path::PathBuf {
    let out_dir = target_dir().join("test-bins");
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join("reuse_fool");
    let tmp = out_dir.join(format!(".reuse_fool.{}", std::process::id()));
    let st = Command::new("g++")
        .args([
            "-O1",
            "-g",
            "-fomit-frame-pointer",
            "-fno-optimize-sibling-calls",
        ])
        .args(["-pthread", "-o"])
        .arg(&tmp)
        .arg(root().join("examples/c/reuse_fool.cc"))
        .status()
        .expect("g++ must be installed");
    assert!(st.success(), "compiling reuse_fool.cc");
    std::fs::rename(&tmp, &exe).unwrap();
    exe
}

/// Every live sample of `p` as (function names of its frames, leaf first; blocks; bytes),
/// sorted: what two runs of the same program must agree on (addresses differ between runs).
fn stacks_by_name(p: &heapdump_proto::Profile) -> Vec<(Vec<String>, i64, i64)> {
    let name_of = |id: u64| -> String {
        let f = p.function.iter().find(|f| f.id == id).unwrap();
        p.string_table[f.name as usize].clone()
    };
    let mut out: Vec<(Vec<String>, i64, i64)> = p
        .sample
        .iter()
        .filter(|s| s.value[2] > 0)
        .map(|s| {
            let names = s
                .location_id
                .iter()
                .flat_map(|l| {
                    let loc = p.location.iter().find(|x| x.id == *l).unwrap();
                    loc.line
                        .iter()
                        .map(|x| name_of(x.function_id))
                        .collect::<Vec<_>>()
                })
                .collect();
            (names, s.value[2], s.value[3])
        })
        .collect();
    out.sort();
    out
}

/// Stacks reused from the previous capture are exactly the stacks of full walks: allocations
/// at the same depth and call site reached through other outer frames, after `longjmp` (over
/// frames of other sizes, `alloca`), C++ exceptions, in a signal handler, on a `ucontext`
/// coroutine's stack, stacks deeper than the 64 frames kept, and in a forked child that
/// inherits the parent's capture. Each kind's
/// blocks are counted exactly through the functions they came through, and the whole profile
/// equals the one taken with reuse off (`HEAPDUMP_STACK_REUSE=0`, every frame walked).
#[test]
fn reused_stacks_are_exact() {
    if !can_run("reused_stacks_are_exact") {
        return;
    }
    let exe = reuse_fool();
    for mode in ["plain", "fork"] {
        let mut profiles = Vec::new();
        for reuse in ["1", "0"] {
            let dir = region_dir(&format!("reuse-{mode}-{reuse}"));
            let mut cmd = Command::new(&exe);
            if mode == "fork" {
                cmd.arg("fork");
            }
            cmd.env("HEAPDUMP_STACK_REUSE", reuse);
            let r = start(cmd, &dir, true);
            assert_eq!(r.tally(), (1100, 69600));
            let p = decode(&snapshot(&dir, r.pid(), &[]));
            for (f, n, size) in [
                ("outer_a", 100, 24),
                ("outer_b", 100, 24),
                ("jump_a", 100, 40),
                ("jump_b", 100, 40),
                ("throw_a", 100, 56),
                ("throw_b", 100, 56),
                ("on_signal", 200, 72),
                ("co_leaf", 100, 88),
                ("main_leaf", 100, 104),
                ("deep_alloc", 100, 120),
            ] {
                let s = sum_through(&p, f);
                assert_eq!(
                    [s[2], s[3]],
                    [n, n * size],
                    "{mode}, reuse {reuse}: blocks through {f}"
                );
            }
            // The callers' blocks never pass through the other caller.
            let both = stacks_by_name(&p)
                .into_iter()
                .filter(|(names, _, _)| {
                    names.iter().any(|n| n == "outer_a") && names.iter().any(|n| n == "outer_b")
                })
                .count();
            assert_eq!(
                both, 0,
                "{mode}, reuse {reuse}: a stack through both callers"
            );
            profiles.push(stacks_by_name(&p));
            assert_eq!(r.finish(), 0);
        }
        let only_in = |a: &Vec<(Vec<String>, i64, i64)>, b: &Vec<(Vec<String>, i64, i64)>| {
            a.iter()
                .filter(|x| !b.contains(x))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert!(
            profiles[0] == profiles[1],
            "{mode}: reused stacks differ from full walks\nonly with reuse: {:#?}\nonly without: {:#?}",
            only_in(&profiles[0], &profiles[1]),
            only_in(&profiles[1], &profiles[0])
        );
    }
}

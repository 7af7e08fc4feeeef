//! `heapdump attach` / `detach` on programs started without the shim
//! (`examples/c/attach_target.c`): the blocks live before the attach, the ones made after,
//! frees of old blocks, a leak planted before the attach, detach, refusals, and heapdump
//! killed in the middle of an attach.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

const BEFORE: &str = "heapdump_live_before_attach";
/// Usable size of the program's 10 blocks of their own mapping.
const MMAPPED_USABLE: u64 = 50 * 4096 - 16;

/// The attach target, started without the shim; `tunables` for GLIBC_TUNABLES.
fn target(dir: &Path, tunables: Option<&str>) -> Running {
    let exe = compile_c("attach_target", &["-fno-optimize-sibling-calls"]);
    let mut cmd = Command::new(exe);
    if let Some(t) = tunables {
        cmd.env("GLIBC_TUNABLES", t);
    }
    start(cmd, dir, false)
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
}

fn send(r: &mut Running, c: &str) {
    let i = r.stdin.as_mut().unwrap();
    i.write_all(c.as_bytes()).unwrap();
    i.flush().unwrap();
}

/// Per-block samples of a `--with-tags` profile: address → (bytes, functions of the leaf
/// location).
fn per_block(profile: &Path) -> BTreeMap<u64, (u64, Vec<String>)> {
    let p = decode(profile);
    let s = |i: i64| p.string_table[i as usize].clone();
    let mut out = BTreeMap::new();
    for x in &p.sample {
        let get = |k: &str| x.label.iter().find(|l| s(l.key) == k);
        let Some(a) = get("address") else { continue };
        let bytes = get("bytes").expect("bytes label").num as u64;
        let leaf: Vec<String> = x
            .location_id
            .first()
            .and_then(|id| p.location.iter().find(|l| l.id == *id))
            .map(|l| {
                l.line
                    .iter()
                    .filter_map(|ln| p.function.iter().find(|f| f.id == ln.function_id))
                    .map(|f| s(f.name))
                    .collect()
            })
            .unwrap_or_default();
        out.insert(a.num as u64, (bytes, leaf));
    }
    out
}

fn attach(dir: &Path, pid: u32) -> String {
    let (ok, so, se) = heapdump_cmd(dir, &["attach", "--by-pid", &pid.to_string()]);
    assert!(ok, "attach failed: {so}{se}");
    so
}

/// The kept blocks' addresses and usable sizes (what a block found by the walk is recorded
/// with: the program's request for the small ones, which the program chose so; a page
/// rounding more for those of their own mapping: 49 * 4096 - 16 asked, 50 pages mapped),
/// the freed blocks' addresses, and the program's mallinfo2 (uordblks, hblkhd, hblks).
fn program_blocks(r: &mut Running) -> (Vec<(u64, u64)>, Vec<u64>, [u64; 3]) {
    let mi: Vec<u64> = r
        .wait_line("mallinfo")
        .iter()
        .map(|x| x.parse().unwrap())
        .collect();
    let held: Vec<u64> = r.wait_line("held").iter().map(|x| hex(x)).collect();
    let freed: Vec<u64> = r.wait_line("freed").iter().map(|x| hex(x)).collect();
    assert_eq!(held.len(), 1110);
    assert_eq!(freed.len(), 60);
    let sizes = (0..1110u64).map(|i| {
        if i < 1100 {
            24 + 16 * (i % 40)
        } else {
            MMAPPED_USABLE
        }
    });
    (
        held.into_iter().zip(sizes).collect(),
        freed,
        [mi[0], mi[1], mi[2]],
    )
}

/// The blocks live before the attach are all there with their sizes (and none of the freed
/// ones, which sit in the per-thread caches and fastbins); the 100 made after are exact with
/// their stacks; frees of old blocks close their records; the planted leak is found.
#[test]
fn attach_sees_old_and_new_blocks() {
    if !can_run("attach_sees_old_and_new_blocks") {
        return;
    }
    let dir = region_dir("attach-old-new");
    let mut r = target(&dir, None);
    let pid = r.pid();
    let leak = hex(&r.ready[3]);
    let (held, freed, _) = program_blocks(&mut r);
    let out = attach(&dir, pid);
    assert!(out.contains("attached to pid"), "{out}");
    send(&mut r, "m");
    let more: Vec<u64> = r.wait_line("more").iter().map(|x| hex(x)).collect();
    assert_eq!(more.len(), 100);
    let prof = snapshot(&dir, pid, &["--with-tags"]);
    let blocks = per_block(&prof);
    for (a, size) in &held {
        let (b, leaf) = blocks
            .get(a)
            .unwrap_or_else(|| panic!("block {a:#x} live before the attach is missing"));
        assert_eq!(b, size, "usable size of {a:#x}");
        assert_eq!(leaf, &[BEFORE.to_owned()], "stack of {a:#x}");
    }
    // A freed block's memory may have been handed out again by the attach's own `dlopen`
    // (then it is a live block of another size): none is reported as the block it was.
    for (i, a) in freed.iter().enumerate() {
        let size = if i % 2 == 1 { 968 } else { 120 };
        if let Some(b) = blocks.get(a) {
            assert!(
                b.0 != size || b.1 != [BEFORE.to_owned()],
                "freed block {a:#x} reported live as a block from before the attach: {b:?} (in more: {})",
                more.contains(a)
            );
        }
    }
    assert_eq!(
        blocks.get(&leak).map(|b| b.0),
        Some(1000),
        "the planted leak"
    );
    for (i, a) in more.iter().enumerate() {
        let (b, leaf) = blocks
            .get(a)
            .unwrap_or_else(|| panic!("new block {a:#x} missing"));
        assert_eq!(*b, 100 + i as u64, "size of new block {i}");
        assert!(
            leaf.iter().any(|f| f == "make_more"),
            "stack of new block: {leaf:?}"
        );
    }
    let new = blocks
        .values()
        .filter(|b| !b.1.iter().any(|f| f == BEFORE))
        .count();
    assert_eq!(new, 100, "blocks recorded after the attach");

    // The leak made before the attach is found.
    let (ok, so, se) = heapdump_cmd(&dir, &["leaks", "--by-pid", &pid.to_string()]);
    assert!(ok, "leaks: {so}{se}");
    assert!(
        so.contains("Direct leak of 1000 byte(s) in 1 object(s)") && so.contains(BEFORE),
        "{so}"
    );

    // Frees of blocks allocated before the attach go to glibc and close their records.
    send(&mut r, "f");
    r.wait_line("freed10");
    let blocks = per_block(&snapshot(&dir, pid, &["--with-tags"]));
    for (a, _) in &held[..10] {
        assert!(
            !blocks.contains_key(a),
            "old block {a:#x} freed after the attach is live"
        );
    }
    for (a, _) in &held[10..] {
        assert!(blocks.contains_key(a), "old block {a:#x} missing");
    }
    send(&mut r, "q");
    assert_eq!(r.finish(), 0);
}

/// With the per-thread caches off, glibc's own count (mallinfo2, taken by the shim right
/// before the walk) is exactly the walk's: chunk bytes of the blocks found in the arenas
/// (usable size + 8) and in their own mappings (usable size + 16).
#[test]
fn attach_walk_matches_mallinfo2() {
    if !can_run("attach_walk_matches_mallinfo2") {
        return;
    }
    let dir = region_dir("attach-mallinfo");
    let mut r = target(&dir, Some("glibc.malloc.tcache_count=0"));
    let pid = r.pid();
    let (held, _, program_mi) = program_blocks(&mut r);
    let out = attach(&dir, pid);
    let line = out
        .lines()
        .find(|l| l.starts_with("glibc's own count then"))
        .unwrap_or_else(|| panic!("{out}"));
    let nums: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let [uord, hblkhd, hblks] = [nums[0], nums[1], nums[2]];
    assert_eq!((hblkhd, hblks), (program_mi[1], program_mi[2]), "{line}");
    assert_eq!(hblks, 10);
    let blocks = per_block(&snapshot(&dir, pid, &["--with-tags"]));
    let before: Vec<(u64, u64)> = blocks
        .iter()
        .filter(|(_, b)| b.1.iter().any(|f| f == BEFORE))
        .map(|(a, b)| (*a, b.0))
        .collect();
    let mmapped: Vec<&(u64, u64)> = before.iter().filter(|b| b.1 == MMAPPED_USABLE).collect();
    assert_eq!(mmapped.len() as u64, hblks);
    assert_eq!(mmapped.iter().map(|b| b.1 + 16).sum::<u64>(), hblkhd);
    let arena: u64 = before
        .iter()
        .filter(|b| b.1 != MMAPPED_USABLE)
        .map(|b| b.1 + 8)
        .sum();
    assert_eq!(
        arena, uord,
        "chunk bytes in the arenas, walked vs mallinfo2"
    );
    // The program's blocks are among them, and the attach's own `dlopen` made the rest.
    assert!(held.iter().all(|(a, _)| blocks.contains_key(a)));
    assert!(uord >= program_mi[0], "{uord} < {}", program_mi[0]);
    send(&mut r, "q");
    assert_eq!(r.finish(), 0);
}

/// Helper I, 6: a process recording into another directory than the collector's (attached,
/// or started, with another HEAPDUMP_DIR) was called "not instrumented … attach it", and
/// `attach` then answered that it already was. Helper U, 2: naming the directory still left
/// every command by pid failing. Its region is now read where it records, with a note.
#[test]
fn a_process_recording_elsewhere_is_read_where_it_records() {
    let dir = region_dir("elsewhere");
    let other = region_dir("elsewhere-collector");
    std::fs::create_dir_all(&other).unwrap();
    let exe = compile_c("attach_target", &["-fno-optimize-sibling-calls"]);
    let r = start(Command::new(exe), &dir, true);
    let out = other.join("s.pb.gz");
    let (ok, _, se) = heapdump_cmd(
        &other,
        &[
            "snapshot",
            "--by-pid",
            &r.pid().to_string(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(ok, "{se}");
    assert!(
        se.contains(&format!("records into {}", dir.display())),
        "{se}"
    );
    let kept: i64 = r.ready[1].parse().unwrap();
    let live: i64 = decode(&out).sample.iter().map(|s| s.value[2]).sum();
    assert!(live >= kept, "{live} live blocks, {kept} kept: {se}");
    assert_eq!(r.finish(), 0);
}

/// Helper U, 2: root attaching to a service run as another user with root's HEAPDUMP_DIR:
/// the shim was loaded, could not make its region there, and the process could never be
/// attached again. The attach is refused before anything is loaded, naming the user and the
/// way out; without HEAPDUMP_DIR the process records into its user's own default, and
/// root's snapshot by pid reads it there.
#[test]
fn root_attaching_to_another_users_process_is_refused_or_recorded() {
    let test = "root_attaching_to_another_users_process_is_refused_or_recorded";
    if !can_run(test) {
        return;
    }
    let setpriv = Command::new("setpriv").arg("--version").output();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !setpriv.is_ok_and(|o| o.status.success()) {
        skip_note(&format!(
            "skipped: {test}: needs root and setpriv (to run a process as nobody)"
        ));
        return;
    }
    let exe = compile_c("attach_target", &["-fno-optimize-sibling-calls"]);
    let root_dir = region_dir("attach-nobody-root");
    std::fs::create_dir_all(&root_dir).unwrap();
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe);
    let r = start(cmd, &root_dir, false);
    let pid = r.pid().to_string();
    let (ok, so, se) = heapdump_cmd(&root_dir, &["attach", "--by-pid", &pid]);
    assert!(!ok, "{so}");
    assert!(
        se.contains("runs as uid 65534")
            && se.contains("unset HEAPDUMP_DIR")
            && se.contains("nothing was changed"),
        "{se}"
    );
    // The same directory named relative to the collector's working directory (helper Y, 4:
    // the shim resolved it against the target's, and the check passed).
    let rel = Command::new(heapdump())
        .args(["attach", "--by-pid", &pid])
        .current_dir(root_dir.parent().unwrap())
        .env("HEAPDUMP_DIR", root_dir.file_name().unwrap())
        .output()
        .unwrap();
    let rel_err = String::from_utf8_lossy(&rel.stderr);
    assert!(
        !rel.status.success() && rel_err.contains("runs as uid 65534"),
        "{rel:?}"
    );
    // Nothing was loaded: without HEAPDUMP_DIR the attach works, into nobody's default.
    let out = Command::new(heapdump())
        .args(["attach", "--by-pid", &pid])
        .env_remove("HEAPDUMP_DIR")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let snap = root_dir.join("s.pb.gz");
    let (ok, _, se) = heapdump_cmd(
        &root_dir,
        &["snapshot", "--by-pid", &pid, "-o", snap.to_str().unwrap()],
    );
    assert!(ok, "{se}");
    assert!(se.contains("records into /dev/shm/heapdump-65534"), "{se}");
    let kept: i64 = r.ready[1].parse().unwrap();
    let found = sum_through(&decode(&snap), BEFORE)[2];
    assert!(
        found >= kept,
        "{found} blocks found at the attach, {kept} kept: {se}"
    );
    assert_eq!(r.finish(), 0);
}

/// Helper J, 3: an attach whose recording could not start (an unusable region directory)
/// leaves the shim loaded and stopped; the retry said the program was "started under
/// heapdump". It now says what happened and what to do.
#[test]
fn a_failed_attach_is_named_as_such_at_the_retry() {
    if !can_run("a_failed_attach_is_named_as_such_at_the_retry") {
        return;
    }
    let dir = region_dir("failed-attach");
    let r = target(&dir, None);
    let pid = r.pid().to_string();
    let bad = Path::new("/proc/nonexistent/heapdump");
    let (ok, so, se) = heapdump_cmd(bad, &["attach", "--by-pid", &pid]);
    assert!(!ok, "attach into {} succeeded: {so}", bad.display());
    for cmd in ["attach", "detach"] {
        let (ok, so, se2) = heapdump_cmd(&dir, &[cmd, "--by-pid", &pid]);
        assert!(!ok, "{cmd}: {so}");
        assert!(
            se2.contains("an earlier attach") && !se2.contains("started under heapdump"),
            "{cmd}: {se2} (first attach: {se})"
        );
    }
    assert_eq!(r.finish(), 0);
}

/// The host pid of the one child of `parent` (`unshare --fork`'s).
fn only_child(parent: u32) -> u32 {
    for _ in 0..200 {
        let c = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
            .unwrap_or_default();
        if let Some(p) = c.split_whitespace().next() {
            return p.parse().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("unshare started no child");
}

/// Helper I, 1: a process in another PID namespace (a container) names its region after its
/// pid there (1). `attach` from outside succeeded, then nothing could find the process again
/// and `gc` removed its live region. Now `attach` refuses such a target up front, saying how
/// to run heapdump inside its namespaces, and `gc` leaves a region alone while a running
/// process maps it.
#[test]
fn a_process_in_another_pid_namespace_is_refused_and_its_region_kept() {
    if !can_run("a_process_in_another_pid_namespace_is_refused_and_its_region_kept") {
        return;
    }
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        skip_note("skipped: a_process_in_another_pid_namespace_is_refused_and_its_region_kept: unshare --pid fails here (needs root)");
        return;
    }
    let exe = compile_c("attach_target", &["-fno-optimize-sibling-calls"]);
    for preload in [false, true] {
        let dir = region_dir(&format!("other-pidns-{preload}"));
        let mut cmd = Command::new("unshare");
        cmd.args(["--pid", "--fork", "--mount-proc"]).arg(&exe);
        let r = start(cmd, &dir, preload);
        assert_eq!(r.pid(), 1, "the program's pid in its namespace");
        let host = only_child(r.child.id());
        if preload {
            // Its region is named after pid 1: gc leaves it, the process mapping it.
            let before: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .collect();
            assert!(
                before.iter().any(|n| n.to_string_lossy().starts_with("1-")),
                "{before:?}"
            );
            let (ok, so, se) = heapdump_cmd(&dir, &["gc"]);
            assert!(ok, "gc: {so}{se}");
            assert!(
                se.contains(&format!(
                    "its process runs in another PID namespace (pid {host} here, 1 there)"
                )),
                "{se}"
            );
            let after: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .collect();
            assert!(
                after.iter().any(|n| n.to_string_lossy().starts_with("1-")),
                "gc removed the live region: {so}{se}"
            );
            // Helper U, 3: a snapshot by its pid here is refused with the way to take one
            // (before: read as the region of an exited pid 1, or advice that changed nothing).
            let out = dir.join("s.pb.gz");
            let (ok, so, se) = heapdump_cmd(
                &dir,
                &[
                    "snapshot",
                    "--by-pid",
                    &host.to_string(),
                    "-o",
                    out.to_str().unwrap(),
                ],
            );
            assert!(!ok, "snapshot succeeded: {so}");
            assert!(
                se.contains("another PID namespace") && se.contains("nsenter"),
                "{se}"
            );
        } else {
            let (ok, so, se) = heapdump_cmd(&dir, &["attach", "--by-pid", &host.to_string()]);
            assert!(!ok, "attach succeeded: {so}");
            assert!(
                se.contains("another PID namespace") && se.contains("nsenter"),
                "{se}"
            );
        }
        assert_eq!(r.finish(), 0);
    }
}

/// Helper I, 2: `watch --by-pid` of an attached process said "exited; no longer watched"
/// at a `heapdump detach` and ended, the process running on. It now says the process is
/// detached, keeps watching, and takes snapshots again once it is attached again.
#[test]
fn a_watch_follows_a_process_through_detach_and_attach() {
    if !can_run("a_watch_follows_a_process_through_detach_and_attach") {
        return;
    }
    let dir = region_dir("watch-detach");
    let out = dir.with_extension("out");
    let _ = std::fs::remove_dir_all(&out);
    let mut r = target(&dir, None);
    let pid = r.pid();
    program_blocks(&mut r);
    attach(&dir, pid);
    let mut watch = Command::new(heapdump())
        .args(["watch", "--by-pid", &pid.to_string(), "--every", "1s", "-o"])
        .arg(&out)
        .env("HEAPDUMP_DIR", &dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pause = || std::thread::sleep(std::time::Duration::from_millis(2500));
    pause();
    let (ok, so, se) = heapdump_cmd(&dir, &["detach", "--by-pid", &pid.to_string()]);
    assert!(ok, "detach failed: {so}{se}");
    pause();
    if let Ok(Some(st)) = watch.try_wait() {
        let o = watch.wait_with_output().unwrap();
        panic!(
            "the watch ended ({st}): {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let files_detached = std::fs::read_dir(&out).unwrap().count();
    pause();
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        files_detached,
        "snapshots were written while detached"
    );
    attach(&dir, pid);
    pause();
    // SAFETY: kill of our own child.
    unsafe { libc::kill(watch.id() as i32, libc::SIGINT) };
    let o = watch.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("detached (heapdump detach)"), "{err}");
    assert!(err.contains("attached again; watching"), "{err}");
    assert!(
        !err.contains("exited") && !err.contains("watch ends"),
        "{err}"
    );
    assert!(
        std::fs::read_dir(&out).unwrap().count() > files_detached,
        "no snapshot after the second attach: {err}"
    );
    let _ = std::fs::remove_dir_all(&out);
    assert_eq!(r.finish(), 0);
}

/// After `detach` the program's allocations are no longer recorded, the region stays
/// readable, and the program exits 0.
#[test]
fn detach_stops_recording() {
    if !can_run("detach_stops_recording") {
        return;
    }
    let dir = region_dir("attach-detach");
    let mut r = target(&dir, None);
    let pid = r.pid();
    program_blocks(&mut r);
    attach(&dir, pid);
    // The thread that ran the entry (blocked in read(2)) finds its errno as it was.
    send(&mut r, "e");
    assert_eq!(r.wait_line("errno"), ["77"], "errno after the attach");
    let (ok, so, se) = heapdump_cmd(&dir, &["detach", "--by-pid", &pid.to_string()]);
    assert!(ok, "detach failed: {so}{se}");
    send(&mut r, "e");
    assert_eq!(r.wait_line("errno"), ["77"], "errno after the detach");
    assert!(so.contains("GOT slots restored"), "{so}");
    send(&mut r, "m");
    let more: Vec<u64> = r.wait_line("more").iter().map(|x| hex(x)).collect();
    let blocks = per_block(&snapshot(&dir, pid, &["--with-tags"]));
    assert!(
        blocks.len() >= 1111,
        "the heap at the detach: {} blocks",
        blocks.len()
    );
    for a in &more {
        assert!(
            !blocks.contains_key(a),
            "block {a:#x} made after the detach was recorded"
        );
    }
    // Listed as detached, not exited; the reference graph is refused for what it is; gc
    // leaves the region of the running process (a snapshot still reads it).
    let (ok, out, _) = heapdump_cmd(&dir, &["list", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let me = (v.as_array().unwrap().iter())
        .find(|e| e["pid"] == pid)
        .expect("listed");
    assert_eq!(me["status"], "detached", "{me}");
    let (ok, _, se) = heapdump_cmd(&dir, &["leaks", "--by-pid", &pid.to_string()]);
    assert!(
        !ok && se.contains(&format!("pid {pid} is detached (heapdump detach)")),
        "{se}"
    );
    let (ok, _, se) = heapdump_cmd(&dir, &["gc"]);
    assert!(ok, "{se}");
    assert!(std::path::Path::new(me["region"].as_str().unwrap()).exists());
    assert_eq!(
        per_block(&snapshot(&dir, pid, &["--with-tags"])).len(),
        blocks.len()
    );
    // A second detach is refused, and the program is unharmed.
    let (ok, _, se) = heapdump_cmd(&dir, &["detach", "--by-pid", &pid.to_string()]);
    assert!(!ok && se.contains("not attached"), "{se}");
    send(&mut r, "q");
    assert_eq!(r.finish(), 0);
}

/// Refusals leave the program as it was: a process started under the shim already, and one
/// with no glibc (a static binary), each in one line.
#[test]
fn attach_refuses_cleanly() {
    if !can_run("attach_refuses_cleanly") {
        return;
    }
    let dir = region_dir("attach-refuse");
    // Already instrumented (preloaded).
    let exe = compile_c("attach_target", &["-fno-optimize-sibling-calls"]);
    let mut r = start(Command::new(&exe), &dir, true);
    let pid = r.pid();
    program_blocks(&mut r);
    let (ok, _, se) = heapdump_cmd(&dir, &["attach", "--by-pid", &pid.to_string()]);
    assert!(!ok, "attach to a preloaded process succeeded");
    assert!(
        se.contains("loaded there already") && se.contains("nothing was changed"),
        "{se}"
    );
    assert_eq!(se.trim_end().lines().count(), 1, "{se}");
    send(&mut r, "m");
    assert_eq!(r.wait_line("more").len(), 100);
    send(&mut r, "q");
    assert_eq!(r.finish(), 0);

    // A zombie (exited, not reaped): said so, not blamed on ptrace rights; `leaks` does not
    // suggest attaching to it. heapdump itself: refused before any ptrace call.
    let mut z = Command::new("true").spawn().unwrap();
    let stat = format!("/proc/{}/stat", z.id());
    let zombie = (0..500).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::read_to_string(&stat).is_ok_and(|s| s.contains(") Z "))
    });
    assert!(zombie, "true did not become a zombie");
    for verb in ["attach", "detach", "leaks"] {
        let (ok, _, se) = heapdump_cmd(&dir, &[verb, "--by-pid", &z.id().to_string()]);
        assert!(!ok, "{verb} of a zombie succeeded");
        assert!(se.contains("has exited (a zombie"), "{verb}: {se}");
        assert!(
            !se.contains("ptrace_scope") && !se.contains("attach --by-pid"),
            "{verb}: {se}"
        );
    }
    z.wait().unwrap();

    // A static binary.
    let src = root().join("examples/c/attach_target.c");
    let out = target_dir().join("test-bins/attach_target_static");
    let built = Command::new("cc")
        .args(["-O1", "-static", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !built {
        println!("skipped: attach_refuses_cleanly (static part): cc -static failed (no libc.a)");
        return;
    }
    let mut r = start(Command::new(&out), &dir, false);
    let pid = r.pid();
    program_blocks(&mut r);
    let (ok, _, se) = heapdump_cmd(&dir, &["attach", "--by-pid", &pid.to_string()]);
    assert!(!ok && se.contains("no glibc mapped"), "{se}");
    send(&mut r, "m");
    assert_eq!(r.wait_line("more").len(), 100);
    send(&mut r, "q");
    assert_eq!(r.finish(), 0);
}

/// heapdump killed (SIGKILL) while the target runs the stub: the program goes on as if
/// nothing happened, and exits 0.
#[test]
fn attach_killed_midway_leaves_program_running() {
    if !can_run("attach_killed_midway_leaves_program_running") {
        return;
    }
    let dir = region_dir("attach-killed");
    let mut r = target(&dir, None);
    let pid = r.pid();
    program_blocks(&mut r);
    let pause = dir.with_extension("pause");
    let _ = std::fs::remove_file(&pause);
    let mut hd = Command::new(heapdump())
        .args(["attach", "--by-pid", &pid.to_string()])
        .env("HEAPDUMP_DIR", &dir)
        .env("HEAPDUMP_TEST_ATTACH_PAUSE", &pause)
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !pause.exists() {
        assert!(
            std::time::Instant::now() < until,
            "heapdump never reached the pause"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    hd.kill().unwrap();
    hd.wait().unwrap();
    let _ = std::fs::remove_file(&pause);
    send(&mut r, "m");
    assert_eq!(r.wait_line("more").len(), 100);
    send(&mut r, "f");
    r.wait_line("freed10");
    send(&mut r, "q");
    assert_eq!(r.finish(), 0);
}

/// Kills the process `pid` if it is still running when the guard is dropped late: armed
/// around each wait on the target, so that a deadlocked target fails the test instead of
/// hanging it (a hang guard, not a time bound: the limit is far above any normal wait).
struct HangGuard {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    fired: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl HangGuard {
    fn arm(pid: u32, secs: u64) -> HangGuard {
        use std::sync::atomic::{AtomicBool, Ordering};
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let fired = std::sync::Arc::new(AtomicBool::new(false));
        let (d, f) = (done.clone(), fired.clone());
        std::thread::spawn(move || {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
            while std::time::Instant::now() < until {
                if d.load(Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            f.store(true, Ordering::Release);
            // SAFETY: kill has no memory-safety preconditions; `pid` is our child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        });
        HangGuard { done, fired }
    }

    /// Disarms the guard; panics when it fired (the target hung and was killed).
    fn disarm(self, what: &str) {
        use std::sync::atomic::Ordering;
        self.done.store(true, Ordering::Release);
        assert!(
            !self.fired.load(Ordering::Acquire),
            "{what}: the program hung (killed by the hang guard)"
        );
    }
}

/// `heapdump attach` or `detach` with a hang guard (heapdump killed after 120 s, which the
/// target survives: see `attach_killed_midway_leaves_program_running`).
fn attach_cmd(dir: &Path, verb: &str, pid: u32, what: &str) -> String {
    let t = heapdump_timeout(
        dir,
        &[verb, "--by-pid", &pid.to_string(), "--timeout", "20"],
        std::time::Duration::from_secs(120),
    );
    assert!(
        !t.timed_out,
        "{what}: heapdump {verb} hung: {}{}",
        t.stdout, t.stderr
    );
    assert_eq!(
        t.code,
        Some(0),
        "{what}: {verb} failed: {}{}",
        t.stdout,
        t.stderr
    );
    t.stdout
}

/// The numbers of the attach output's line starting with `prefix`.
fn numbers(out: &str, prefix: &str) -> Vec<u64> {
    out.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in {out}"))
        .split_whitespace()
        .filter_map(|w| w.trim_matches(|c| "(),;:".contains(c)).parse().ok())
        .collect()
}

/// 100 attach/detach cycles on one process while 4 threads churn malloc/realloc/free at full
/// speed: no deadlock (each attach finds a safe point and finishes; a hang guard kills a
/// hung program), every block keeps what was written, and the program's output and exit
/// status are those of a run without heapdump. Then, detached, the threads stop churning and
/// hold 1,000 known blocks, and a last attach must find the heap exact: the held blocks with
/// their sizes under the before-attach frame (made while detached), no block of the churn
/// (every record of a block freed while detached closed), and the chunk bytes of every block
/// in the snapshot, with heapdump's own blocks, equal glibc's count (`mallinfo2`, per-thread
/// caches off so that it counts only blocks in use). Prints the cycles per second.
#[test]
fn attach_detach_100_cycles_under_churn() {
    if !can_run("attach_detach_100_cycles_under_churn") {
        return;
    }
    let exe = compile_c("attach_churn", &[]);
    let tunables = "glibc.malloc.tcache_count=0";
    let dir = region_dir("attach-churn");
    let start_churn = || {
        let mut cmd = Command::new(&exe);
        cmd.env("GLIBC_TUNABLES", tunables);
        start(cmd, &dir, false)
    };
    let finish = |mut r: Running, what: &str| -> String {
        let g = HangGuard::arm(r.pid(), 300);
        send(&mut r, "q");
        let out = r.wait_line("sum");
        let code = r.finish();
        g.disarm(what);
        assert_eq!(code, 0, "{what}: exit status");
        out.join(" ")
    };
    // Without heapdump.
    let mut r = start_churn();
    std::thread::sleep(std::time::Duration::from_millis(200));
    send(&mut r, "h");
    r.wait_line("held");
    let expected = finish(r, "run without heapdump");
    assert!(expected.ends_with(" bad 0"), "{expected}");

    let mut r = start_churn();
    let pid = r.pid();
    let cycles = 100;
    let started = std::time::Instant::now();
    let mappings = || {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap()
            .lines()
            .count()
    };
    let mut after_first = 0;
    for cycle in 0..cycles {
        let what = format!("cycle {cycle}");
        let out = attach_cmd(&dir, "attach", pid, &what);
        let again = out.starts_with("attached again");
        assert_eq!(again, cycle > 0, "{what}: {out}");
        attach_cmd(&dir, "detach", pid, &what);
        if cycle == 0 {
            after_first = mappings();
        }
    }
    let per_s = cycles as f64 / started.elapsed().as_secs_f64();
    // The stub's pages are unmapped after each call: 99 more cycles leave (almost) nothing
    // (the shim's tables may grow by a mapping or two).
    let after = mappings();
    assert!(
        after <= after_first + 8,
        "mappings: {after_first} after the first cycle, {after} after {cycles}"
    );
    println!("attach_detach_100_cycles_under_churn: {cycles} attach/detach cycles under churn, {per_s:.1} cycles/s");

    // Detached: the threads stop churning and hold known blocks; the last attach finds them.
    let g = HangGuard::arm(pid, 300);
    send(&mut r, "h");
    let held: Vec<u64> = r.wait_line("held").iter().map(|x| hex(x)).collect();
    let program_mi = r.wait_line("mallinfo");
    g.disarm("hold");
    assert_eq!(held.len(), 1000);
    let out = attach_cmd(&dir, "attach", pid, "last attach");
    let again = numbers(&out, "attached again");
    let own = numbers(&out, "heapdump's own blocks left out");
    let mi = numbers(&out, "glibc's own count then");
    // [kept, closed, blocks, bytes, slots] after the pid and the time.
    let (kept, closed, added) = (again[1], again[2], again[3]);
    // glibc's chunk for a request of `n` bytes (a block found by a walk has its usable size,
    // whose chunk is the same).
    let chunk = |n: u64| ((n + 8 + 15) & !15).max(32);
    let blocks = per_block(&snapshot(&dir, pid, &["--with-tags"]));
    // A held block whose address and size class a churn block recorded before the detach
    // had (freed while detached, its place taken at once): its old record is kept, as the
    // heap cannot tell them apart (README, Attach).
    let mut reused = 0;
    for (i, a) in held.iter().enumerate() {
        let (b, leaf) = blocks
            .get(a)
            .unwrap_or_else(|| panic!("held block {a:#x} missing"));
        let (id, k) = (i as u64 / 250, i as u64 % 250);
        let size = 24 + 16 * ((id * 250 + k) % 40);
        if leaf.iter().any(|f| f == "round_sum") {
            assert!(
                chunk(*b).abs_diff(chunk(size)) <= 16,
                "size class of held block {i} at {a:#x}: {b} recorded, {size} asked; {out}"
            );
            reused += 1;
        } else {
            // Found by the walk: its usable size, the request's unless glibc handed out a
            // free chunk whose remainder was too small to split off (< 32 bytes).
            assert!(
                *b >= size && *b < size + 32,
                "size of held block {i}: {b} for {size} asked"
            );
            assert_eq!(leaf, &[BEFORE.to_owned()], "stack of held block {i}");
        }
    }
    // A held block may also take the place of a block an earlier attach's walk found (a
    // churn block made while detached, recorded under the before-attach frame too) that the
    // program freed while detached: its old record is kept as well, and neither `reused` nor
    // `added` counts it. Such blocks are among the kept records that are not the churn's
    // recorded ones (`kept - reused`).
    let old_before = 1000u64.saturating_sub(added + reused);
    println!("attach_detach_100_cycles_under_churn: {reused} of the 1000 held blocks took the place of a churn block of their size class freed while detached, {old_before} the place of a block an earlier attach's walk found");
    assert!(
        reused + old_before < 100,
        "{reused} + {old_before} held blocks with an old record"
    );
    assert!(
        old_before <= kept.saturating_sub(reused),
        "blocks made while detached: {added} recorded, {reused} with a churn block's record, so {old_before} held blocks with an older record, of {kept} kept: {out}"
    );
    let churn: Vec<_> = blocks
        .iter()
        .filter(|(a, b)| b.1.iter().any(|f| f == "round_sum") && !held.contains(a))
        .collect();
    assert!(
        churn.is_empty(),
        "blocks of the churn still live: {churn:?}"
    );
    assert_eq!(
        blocks.len() as u64,
        kept + added,
        "blocks in the snapshot vs the attach's count ({closed} closed): {out}"
    );
    let is_mmapped = |n: u64| (n + 16).is_multiple_of(4096) && n >= 128 * 1024;
    let mmapped: Vec<u64> = blocks
        .values()
        .filter(|b| is_mmapped(b.0))
        .map(|b| b.0)
        .collect();
    let arena: u64 = blocks
        .values()
        .filter(|b| !is_mmapped(b.0))
        .map(|b| chunk(b.0))
        .sum();
    let own_chunks = own[1] + 8 * own[0];
    // mallinfo2 counts, in the heap of each arena other than the main one, its header as in
    // use: `heap_info` (48 bytes since glibc 2.35) and `malloc_state` (2,200), up to the
    // first chunk (2,256 bytes); at most 8 arenas per core.
    // A record kept from before the detach has its request, whose chunk may be 16 bytes
    // short of the one glibc handed out (a remainder too small to split off).
    let header = 2256;
    let counted = arena + own_chunks;
    let slack = mi[0].saturating_sub(counted) % header;
    assert!(
        mi[0] >= counted
            && (mi[0] - counted) / header <= 64
            && slack.is_multiple_of(16)
            && slack <= 16 * (kept + reused),
        "chunk bytes in the arenas: the snapshot's ({arena}) and heapdump's own ({own_chunks}) vs mallinfo2 ({}, the headers of whole arenas apart); program said {program_mi:?}: {out}",
        mi[0]
    );
    println!(
        "attach_detach_100_cycles_under_churn: last attach: {} blocks, {arena} chunk bytes, {own_chunks} of heapdump's own, {slack} unsplit remainders of kept records, {} arena headers: mallinfo2's {}",
        blocks.len(),
        (mi[0] - counted) / header,
        mi[0]
    );
    assert_eq!(mmapped.iter().map(|b| b + 16).sum::<u64>(), mi[1], "{out}");
    assert_eq!(mmapped.len() as u64, mi[2], "{out}");
    attach_cmd(&dir, "detach", pid, "last detach");
    assert_eq!(finish(r, "attached 101 times"), expected, "output changed");
}

/// Attach and detach a few times with glibc's default settings (per-thread caches on) while
/// 4 threads churn: no deadlock, the output and exit status unchanged.
#[test]
fn attach_detach_cycles_default_glibc() {
    if !can_run("attach_detach_cycles_default_glibc") {
        return;
    }
    let exe = compile_c("attach_churn", &[]);
    let dir = region_dir("attach-churn-default");
    let run = |cycles: u32| -> String {
        let mut r = start(Command::new(&exe), &dir, false);
        let pid = r.pid();
        std::thread::sleep(std::time::Duration::from_millis(100));
        for cycle in 0..cycles {
            let what = format!("cycle {cycle}");
            attach_cmd(&dir, "attach", pid, &what);
            attach_cmd(&dir, "detach", pid, &what);
        }
        let g = HangGuard::arm(pid, 300);
        send(&mut r, "q");
        let out = r.wait_line("sum");
        let code = r.finish();
        g.disarm("finish");
        assert_eq!(code, 0, "exit status");
        out.join(" ")
    };
    let expected = run(0);
    assert!(expected.ends_with(" bad 0"), "{expected}");
    assert_eq!(run(10), expected, "output changed");
}

/// python3 started without the shim: attach, then objects made in a Python function are
/// recorded under that function (the shim's CPython support found the interpreter at the
/// attach), the blocks live before are there, and detach lets it exit 0.
#[test]
fn attach_to_python3() {
    let py = Path::new("/usr/bin/python3");
    if !py.exists() {
        println!("skipped: attach_to_python3: no /usr/bin/python3");
        return;
    }
    let dir = region_dir("attach-python");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("attach.py");
    std::fs::write(
        &script,
        "import os, sys\n\
         kept = [str(i) * 100 for i in range(20000)]\n\
         def big():\n    return [bytes(10000 + i % 7) for i in range(1000)]\n\
         print('ready', os.getpid(), flush=True)\n\
         for line in sys.stdin:\n\
         \x20   if line.startswith('m'):\n\
         \x20       y = big()\n\
         \x20       print('more', len(y), flush=True)\n\
         \x20   elif line.startswith('q'):\n\
         \x20       break\n\
         print('bye', len(kept), flush=True)\n",
    )
    .unwrap();
    let mut cmd = Command::new(py);
    cmd.arg(&script);
    let mut r = start(cmd, &dir, false);
    let pid = r.pid();
    let out = attach(&dir, pid);
    let before: u64 = out
        .split_whitespace()
        .skip_while(|w| *w != "s:")
        .nth(1)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(before > 1000, "blocks live before the attach: {out}");
    send(&mut r, "m\n");
    assert_eq!(r.wait_line("more"), ["1000"]);
    let p = decode(&snapshot(&dir, pid, &[]));
    let big = locations_of(&p, "big");
    let (mut n, mut bytes) = (0i64, 0i64);
    for s in &p.sample {
        if s.location_id.iter().any(|l| big.contains(l)) && s.value[3] / s.value[2].max(1) >= 10_000
        {
            n += s.value[2];
            bytes += s.value[3];
        }
    }
    // PyBytesObject: 32 bytes of header and the payload's NUL.
    let want: i64 = (0..1000).map(|i| 10_000 + i % 7 + 33).sum();
    assert_eq!(
        (n, bytes),
        (1000, want),
        "objects made in big() after the attach"
    );
    let (ok, so, se) = heapdump_cmd(&dir, &["detach", "--by-pid", &pid.to_string()]);
    assert!(ok, "detach: {so}{se}");
    send(&mut r, "q\n");
    assert_eq!(r.wait_line("bye"), ["20000"]);
    assert_eq!(r.finish(), 0);
}

/// ptrace denied (heapdump run as another user, `nobody`, against a root process): refused in
/// one line naming `kernel.yama.ptrace_scope` and `CAP_SYS_PTRACE`; the program runs on.
#[test]
fn attach_refuses_without_ptrace_rights() {
    if !can_run("attach_refuses_without_ptrace_rights") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/usr/bin/setpriv").exists() {
        println!("skipped: attach_refuses_without_ptrace_rights: needs root and setpriv");
        return;
    }
    let dir = region_dir("attach-denied");
    let mut r = target(&dir, None);
    let pid = r.pid();
    program_blocks(&mut r);
    let out = Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(heapdump())
        .args(["attach", "--by-pid", &pid.to_string()])
        .output()
        .unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "attach as nobody succeeded");
    assert!(
        se.contains("ptrace refused")
            && se.contains("kernel.yama.ptrace_scope")
            && se.contains("CAP_SYS_PTRACE")
            && se.contains("nothing was changed"),
        "{se}"
    );
    assert_eq!(se.trim_end().lines().count(), 1, "{se}");
    send(&mut r, "m");
    assert_eq!(r.wait_line("more").len(), 100);
    send(&mut r, "q");
    assert_eq!(r.finish(), 0);
}

/// A thread stuck inside the allocator (malloc_stats blocked writing to a full pipe while it
/// holds the arena lock): refused after --timeout in one line naming it; the shim is not
/// loaded and no thread is left stopped.
#[test]
fn attach_refuses_a_thread_stuck_in_the_allocator() {
    if !can_run("attach_refuses_a_thread_stuck_in_the_allocator") {
        return;
    }
    let dir = region_dir("attach-stuck");
    let exe = compile_c("attach_target", &["-fno-optimize-sibling-calls"]);
    let mut cmd = Command::new(exe);
    // stderr: a pipe nobody reads.
    let (rd, wr) = {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into the array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        (fds[0], fds[1])
    };
    // SAFETY: `wr` is a descriptor we own, given to the child as its stderr.
    cmd.stderr(unsafe { <std::process::Stdio as std::os::fd::FromRawFd>::from_raw_fd(wr) });
    cmd.env("HEAPDUMP_DIR", &dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let pid = loop {
        let l = lines.next().unwrap().unwrap();
        if let Some(rest) = l.strip_prefix("ready ") {
            break rest
                .split_whitespace()
                .next()
                .unwrap()
                .parse::<u32>()
                .unwrap();
        }
    };
    stdin.write_all(b"s").unwrap();
    stdin.flush().unwrap();
    while lines.next().unwrap().unwrap() != "stuck" {}
    let (ok, _, se) = heapdump_cmd(
        &dir,
        &["attach", "--by-pid", &pid.to_string(), "--timeout", "0.5"],
    );
    assert!(!ok, "attach succeeded with a thread stuck in the allocator");
    assert!(
        se.contains("malloc_stats") && se.contains("nothing was changed"),
        "{se}"
    );
    assert_eq!(se.trim_end().lines().count(), 1, "{se}");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(!maps.contains("libheapdump.so"), "the shim was loaded");
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let st = std::fs::read_to_string(t.path().join("stat")).unwrap();
        let state = st
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned();
        assert!(
            state != "t" && state != "T",
            "thread {:?} left stopped",
            t.file_name()
        );
    }
    let _ = child.kill();
    let _ = child.wait();
    // SAFETY: our end of the pipe, closed once.
    unsafe { libc::close(rd) };
}

/// CPython (default settings: pymalloc) holding 200,000 distinct 1-tuples made in a function
/// before the attach: pymalloc's arenas are walked at the attach, so a snapshot shows at
/// least 200,000 blocks of the tuples' size class under the before-attach frame; the
/// pymalloc objects recorded agree with `sys.getallocatedblocks()` at the attach. That
/// count also holds the objects pymalloc passed to malloc (above 512 bytes), which glibc's
/// walk records: so the pymalloc walk may find fewer, by at most the blocks above 512 bytes
/// found before the attach, and more by at most 100 (the interpreter blocked in
/// `readline` between its count and the attach allocates a few objects). Each of Debian's
/// python3 and pyenv's 3.6 to 3.13 present (arenas of 256 KiB and pools of 4 KiB before
/// 3.10); Python 2.7's layout is not recognised, which the attach says.
#[test]
fn attach_sees_pymalloc_objects_made_before() {
    let dir = region_dir("attach-pymalloc");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("hold.py");
    std::fs::write(
        &script,
        "import os, sys\n\
         def make():\n    return [(i,) for i in range(200000)]\n\
         kept = make()\n\
         print('ready', os.getpid(), sys.getallocatedblocks(), flush=True)\n\
         for line in sys.stdin:\n\
         \x20   if line.startswith('q'):\n\
         \x20       break\n\
         print('bye', len(kept), flush=True)\n",
    )
    .unwrap();
    let home = std::env::var("PYENV_ROOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| Path::new(&std::env::var("HOME").unwrap_or_default()).join(".pyenv"));
    let mut pythons = vec![std::path::PathBuf::from("/usr/bin/python3")];
    for v in [
        "3.6.15", "3.7.16", "3.8.18", "3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0",
    ] {
        pythons.push(home.join("versions").join(v).join("bin/python3"));
    }
    let mut ran = 0;
    for py in &pythons {
        if !py.exists() {
            println!(
                "skipped: attach_sees_pymalloc_objects_made_before ({}): not installed",
                py.display()
            );
            continue;
        }
        let what = py.display().to_string();
        let mut cmd = Command::new(py);
        cmd.arg(&script).env_remove("PYTHONMALLOC");
        let mut r = start(cmd, &dir, false);
        let pid = r.pid();
        let counted: u64 = r.ready[1].parse().unwrap();
        let out = attach_cmd(&dir, "attach", pid, &what);
        let py_objects = numbers(&out, "CPython's pymalloc objects among them");
        let (n, bytes) = (py_objects[0], py_objects[1]);
        let blocks = per_block(&snapshot(&dir, pid, &["--with-tags"]));
        let before = |f: &dyn Fn(u64) -> bool| {
            blocks
                .values()
                .filter(|b| b.1 == [BEFORE.to_owned()] && f(b.0))
                .count() as u64
        };
        let big = before(&|s| s > 512);
        assert!(
            n <= counted + 100 && counted <= n + big,
            "{what}: {n} pymalloc objects recorded, sys.getallocatedblocks() said {counted} ({big} blocks above 512 bytes): {out}"
        );
        assert!(bytes >= 16 * n && bytes <= 512 * n, "{what}: {out}");
        // The 1-tuples: one size class holds at least 200,000 blocks from before.
        let most = (1..=32u64).map(|c| before(&|s| s == 16 * c)).max().unwrap();
        assert!(
            most >= 200_000,
            "{what}: {most} blocks in the fullest size class: {out}"
        );
        println!(
            "attach_sees_pymalloc_objects_made_before: {what}: {n} pymalloc objects ({bytes} bytes) recorded, sys.getallocatedblocks() {counted}, {big} blocks above 512 bytes"
        );
        attach_cmd(&dir, "detach", pid, &what);
        send(&mut r, "q\n");
        assert_eq!(r.wait_line("bye"), ["200000"], "{what}");
        assert_eq!(r.finish(), 0, "{what}");
        ran += 1;
    }
    assert!(ran > 0, "no python3 found");
    // Python 2.7: the layout is not recognised, and the attach says so.
    let old = home.join("versions/2.7.18/bin/python2.7");
    if !old.exists() {
        println!(
            "skipped: attach_sees_pymalloc_objects_made_before (2.7 part): no {}",
            old.display()
        );
        return;
    }
    let script = dir.join("hold2.py");
    std::fs::write(
        &script,
        "import os, sys\n\
         kept = [(i,) for i in range(200000)]\n\
         sys.stdout.write('ready %d\\n' % os.getpid())\n\
         sys.stdout.flush()\n\
         for line in iter(sys.stdin.readline, ''):\n\
         \x20   if line.startswith('q'):\n\
         \x20       break\n\
         sys.stdout.write('bye %d\\n' % len(kept))\n\
         sys.stdout.flush()\n",
    )
    .unwrap();
    let mut cmd = Command::new(&old);
    cmd.arg(&script);
    let mut r = start(cmd, &dir, false);
    let pid = r.pid();
    let t = heapdump_timeout(
        &dir,
        &["attach", "--by-pid", &pid.to_string()],
        std::time::Duration::from_secs(120),
    );
    assert_eq!(t.code, Some(0), "{}{}", t.stdout, t.stderr);
    assert!(
        t.stderr.contains("pymalloc layout is not known"),
        "{}",
        t.stderr
    );
    assert!(
        !t.stdout.contains("CPython's pymalloc objects"),
        "{}",
        t.stdout
    );
    attach_cmd(&dir, "detach", pid, "2.7");
    send(&mut r, "q\n");
    assert_eq!(r.wait_line("bye"), ["200000"]);
    assert_eq!(r.finish(), 0);
}

/// Threads that started while attached and exited while detached (their exit handler found
/// recording off and kept their slots): the next attach frees their slots in the region, so
/// that a program starting threads while detached again and again does not fill the table.
#[test]
fn reattach_frees_slots_of_threads_gone_while_detached() {
    let py = Path::new("/usr/bin/python3");
    if !py.exists() {
        println!(
            "skipped: reattach_frees_slots_of_threads_gone_while_detached: no /usr/bin/python3"
        );
        return;
    }
    let dir = region_dir("attach-threads");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("threads.py");
    std::fs::write(
        &script,
        "import os, sys, threading\n\
         go = threading.Event()\n\
         def work(out):\n    out.append(bytearray(100000))\n    go.wait()\n\
         ts, outs = [], []\n\
         print('ready', os.getpid(), flush=True)\n\
         for line in sys.stdin:\n\
         \x20   if line.startswith('s'):\n\
         \x20       for i in range(3):\n\
         \x20           o = []\n\
         \x20           outs.append(o)\n\
         \x20           t = threading.Thread(target=work, args=(o,))\n\
         \x20           t.start()\n\
         \x20           ts.append(t)\n\
         \x20       while len([o for o in outs if o]) < 3: pass\n\
         \x20       print('started', ' '.join(str(t.native_id) for t in ts), flush=True)\n\
         \x20   elif line.startswith('e'):\n\
         \x20       go.set()\n\
         \x20       [t.join() for t in ts]\n\
         \x20       print('ended', flush=True)\n\
         \x20   elif line.startswith('q'):\n\
         \x20       break\n",
    )
    .unwrap();
    let mut cmd = Command::new(py);
    cmd.arg(&script);
    let mut r = start(cmd, &dir, false);
    let pid = r.pid();
    let running = |tids: &[u32]| -> Vec<u32> {
        // The region directory the shim chose under HEAPDUMP_DIR (which existed: the
        // script is there), or HEAPDUMP_DIR itself.
        let sub = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.is_dir())
            .unwrap_or(dir.clone());
        let bytes = std::fs::read(region_file(&sub)).unwrap();
        let region = vmo_layout::Region::from_bytes(&bytes).unwrap();
        region
            .threads()
            .into_iter()
            .filter(|t| t.running && tids.contains(&t.tid))
            .map(|t| t.tid)
            .collect()
    };
    attach_cmd(&dir, "attach", pid, "attach");
    send(&mut r, "s\n");
    let tids: Vec<u32> = r
        .wait_line("started")
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(running(&tids).len(), 3, "the threads' slots while attached");
    attach_cmd(&dir, "detach", pid, "detach");
    send(&mut r, "e\n");
    r.wait_line("ended");
    assert_eq!(
        running(&tids).len(),
        3,
        "slots kept by threads gone while detached"
    );
    attach_cmd(&dir, "attach", pid, "attach again");
    assert_eq!(
        running(&tids),
        Vec::<u32>::new(),
        "slots of gone threads after the re-attach"
    );
    attach_cmd(&dir, "detach", pid, "detach again");
    send(&mut r, "q\n");
    assert_eq!(r.finish(), 0);
}

/// A thread blocked in a system call far from the allocator, with a return address into
/// `free` left on its stack by a call that returned long ago (bash waiting for `sleep`: a
/// `free+111` word in `wait_for`'s locals), is at a safe point: its frames, unwound by their
/// call frame information, are what counts, not every word of its stack (before, attach
/// refused for ever: "inside libc's free (return address … at sp+0xa0)").
#[test]
fn attach_ignores_stale_return_addresses() {
    if !can_run("attach_ignores_stale_return_addresses") {
        return;
    }
    let dir = region_dir("attach-stale");
    let mut bash = Command::new("bash")
        .args(["-c", "sleep 3; echo done"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let pid = bash.id();
    let out = attach_cmd(&dir, "attach", pid, "bash in wait4");
    assert!(out.starts_with(&format!("attached to pid {pid}")), "{out}");
    attach_cmd(&dir, "detach", pid, "bash in wait4");
    let mut text = String::new();
    std::io::Read::read_to_string(bash.stdout.as_mut().unwrap(), &mut text).unwrap();
    assert!(bash.wait().unwrap().success());
    assert_eq!(text, "done\n");
}

/// A program whose first call of `malloc` comes after the attach (its PLT slot not yet bound:
/// lazy binding) has those blocks recorded — they were not: the slot bound to glibc's at the
/// first call — and a child it forks has a region of its own with its blocks (the fork
/// handlers were not registered: the child went unrecorded, and the parent's region said a
/// raw clone had stopped recording).
#[test]
fn attach_records_first_calls_and_forked_children() {
    if !can_run("attach_records_first_calls_and_forked_children") {
        return;
    }
    let dir = region_dir("attach-lazy");
    let exe = compile_c(
        "attach_lazy",
        &["-fno-optimize-sibling-calls", "-Wl,-z,lazy"],
    );
    let mut r = start(Command::new(&exe), &dir, false);
    let pid = r.pid();
    attach(&dir, pid);
    send(&mut r, "go\n");
    let child: u32 = r.wait_line("child")[0].parse().unwrap();
    let parent = decode(&snapshot(&dir, pid, &[]));
    let lazy = sum_through(&parent, "lazy_blocks");
    assert_eq!(
        [lazy[2], lazy[3]],
        [10, 10_000],
        "the parent's first mallocs"
    );
    let kid = decode(&snapshot(&dir, child, &[]));
    let lazy = sum_through(&kid, "lazy_blocks");
    assert_eq!(
        [lazy[2], lazy[3]],
        [10, 10_000],
        "the child's inherited blocks"
    );
    let own = sum_through(&kid, "child_blocks");
    assert_eq!([own[2], own[3]], [90, 90_000], "the child's own blocks");
    let list = heapdump_cmd(&dir, &["list"]).1;
    assert!(!list.contains("raw clone"), "{list}");
    assert_eq!(r.finish(), 0);
}

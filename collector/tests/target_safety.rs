//! The shim must never harm the program it records: no signal, no lost or wrong behaviour,
//! no change to the user's files, whatever the machine's state (issue "Trust, round 2", A).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop; `None` when this user
/// cannot mount (the test then prints that it is skipped).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(name: &str, size: &str) -> Option<Tmpfs> {
        if !is_root() {
            return None;
        }
        let d = region_dir(name);
        std::fs::create_dir_all(&d).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(&d)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        ok.then(|| Tmpfs(d))
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn list_json(dir: &Path) -> Vec<serde_json::Value> {
    let (ok, out, err) = heapdump_cmd(dir, &["list", "--json"]);
    assert!(ok, "heapdump list: {err}");
    serde_json::from_str(&out).unwrap()
}

/// A1: four processes each keeping 500,000 blocks (20 MB of records each) with their regions
/// kept, on a 64 MiB tmpfs: the file system fills up. Every program must run to completion
/// (bare glibc: all exit 0), each region must account for every block (recorded or counted
/// as dropped), `heapdump list` must say why recording stopped, and every region must still
/// be snapshotted exactly.
#[test]
fn full_tmpfs_never_kills_the_target() {
    let Some(fs) = Tmpfs::mount("fullfs", "64m") else {
        println!("skipped: full_tmpfs_never_kills_the_target needs root (to mount a tmpfs)");
        return;
    };
    let exe = compile_c("hold_many", &[]);
    const N: u64 = 500_000;
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(&exe)
                .args([N.to_string(), "24".into()])
                .env("HEAPDUMP_DIR", fs.path())
                .env("HEAPDUMP_KEEP", "1")
                .env("LD_PRELOAD", shim())
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        let st = c.wait().unwrap();
        assert_eq!(st.code(), Some(0), "a program died: {st:?}");
    }
    let list = list_json(fs.path());
    assert_eq!(list.len(), 4, "{list:?}");
    let mut stopped = 0;
    for e in &list {
        let live = e["live_blocks"].as_u64().unwrap();
        let dropped = e["dropped_blocks"].as_u64().unwrap();
        // The pointer array (calloc), N blocks, stdout's buffer.
        assert_eq!(live + dropped, N + 2, "{e}");
        let reasons = e["recording_stopped"].as_array().unwrap();
        if dropped > 0 {
            assert!(
                reasons
                    .iter()
                    .any(|r| r.as_str().unwrap().contains("file system is full")),
                "{e}"
            );
            stopped += 1;
        }
        let region = e["region"].as_str().unwrap();
        let out = fs.path().join(format!("{}.pb.gz", e["pid"]));
        // The profile goes outside the full file system.
        let out = std::env::temp_dir().join(out.file_name().unwrap());
        let (ok, _, err) = heapdump_cmd(
            fs.path(),
            &["snapshot", "--region", region, "-o", out.to_str().unwrap()],
        );
        assert!(ok, "snapshot of {region}: {err}");
        assert_eq!(decode(&out).sample.iter().map(|s| s.value[2]).sum::<i64>() as u64, live);
        let _ = std::fs::remove_file(&out);
    }
    assert!(stopped > 0, "64 MiB held 4 × 20 MB of records? {list:?}");
}

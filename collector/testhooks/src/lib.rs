//! Hooks the collector's integration tests use to act between two steps of a command (free
//! blocks, end or resume the target, truncate its region) at a known point, by a file
//! handshake: the hook creates a file and waits until the test removes it.
//!
//! Every hook is compiled to nothing unless the `enabled` feature is on: the collector's
//! dev-dependency turns it on, so `cargo test` builds the `heapdump` binary the tests run with
//! the hooks, and `cargo build` (the release binary) without them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Whether the hooks are compiled in.
pub const ENABLED: bool = cfg!(feature = "enabled");

/// With the environment variable `var` set to FILE: creates FILE and waits until it is removed
/// (at most 60 s), so that a test can act meanwhile; nothing otherwise.
fn handshake(var: &str) {
    if !ENABLED {
        return;
    }
    let Some(file) = std::env::var_os(var) else {
        return;
    };
    let file = PathBuf::from(file);
    if std::fs::write(&file, b"").is_err() {
        return;
    }
    let until = Instant::now() + Duration::from_secs(60);
    while file.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `HEAPDUMP_TEST_CONTENTS_PAUSE=FILE`: after the snapshot, before the block contents are read
/// (`--contents-dir`, and the reference graph's scan).
pub fn contents_pause() {
    handshake("HEAPDUMP_TEST_CONTENTS_PAUSE");
}

/// `HEAPDUMP_TEST_SYMBOLIZE_PAUSE=FILE` with `HEAPDUMP_TEST_SYMBOLIZE_MODULE=PATH`: the
/// symbolizer has opened module PATH, before it reads it (a test swaps the path meanwhile).
pub fn symbolize_pause(module: &std::path::Path) {
    if ENABLED && std::env::var_os("HEAPDUMP_TEST_SYMBOLIZE_MODULE").is_some_and(|m| m == module) {
        handshake("HEAPDUMP_TEST_SYMBOLIZE_PAUSE");
    }
}

/// `HEAPDUMP_TEST_GC_PAUSE=FILE`: `gc` has listed the region directory, before it removes
/// anything (a test swaps the directory meanwhile).
pub fn gc_pause() {
    handshake("HEAPDUMP_TEST_GC_PAUSE");
}

/// `HEAPDUMP_TEST_ATTACH_PAUSE=FILE`: once the target runs `heapdump attach`'s stub, so that a
/// test can kill heapdump mid-attach.
pub fn attach_pause() {
    handshake("HEAPDUMP_TEST_ATTACH_PAUSE");
}

/// What [`scan_pause`] waits for, read once per snapshot before its scan.
#[derive(Debug)]
pub struct ScanPause {
    millis: Option<Duration>,
    file: bool,
}

impl ScanPause {
    /// From the environment: `HEAPDUMP_TEST_PAUSE_MS=N` (sleep N ms) and/or
    /// `HEAPDUMP_TEST_PAUSE_FILE=FILE` (the file handshake).
    pub fn from_env() -> ScanPause {
        if !ENABLED {
            return ScanPause {
                millis: None,
                file: false,
            };
        }
        ScanPause {
            millis: std::env::var("HEAPDUMP_TEST_PAUSE_MS")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_millis),
            file: std::env::var_os("HEAPDUMP_TEST_PAUSE_FILE").is_some(),
        }
    }

    /// At the first live block of the scan, holding the region's lock and lease: pauses once
    /// as the environment said.
    pub fn at_first_block(&mut self) {
        if let Some(d) = self.millis.take() {
            std::thread::sleep(d);
        }
        if std::mem::take(&mut self.file) {
            handshake("HEAPDUMP_TEST_PAUSE_FILE");
        }
    }
}

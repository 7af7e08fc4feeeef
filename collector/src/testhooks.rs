//! Hooks the integration tests use to interleave their own steps with a command's.

use std::path::PathBuf;

/// Tests only: with `HEAPDUMP_TEST_CONTENTS_PAUSE=FILE`, creates FILE after the snapshot and
/// waits (at most 60 s) until it is removed before reading the contents (`--contents-dir`,
/// and the reference graph's scan), so that a test can free blocks, or end the target, in
/// between.
pub fn test_pause() {
    let Some(file) = std::env::var_os("HEAPDUMP_TEST_CONTENTS_PAUSE") else {
        return;
    };
    let file = PathBuf::from(file);
    if std::fs::write(&file, b"").is_err() {
        return;
    }
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while file.exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

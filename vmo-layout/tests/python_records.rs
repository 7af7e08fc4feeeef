//! Python code records in the PYTHON section: written as the shim writes them, read back by
//! `Region::python_code`, and refused when unpublished, out of bounds or inconsistent.

use std::sync::atomic::Ordering;
use vmo_layout::v1::{
    plan, Capacities, PYTHON_FRAME, PYTHON_RECORD_MAX_WORDS, PYTHON_RECORD_PUBLISHED,
    PYTHON_RECORD_WORDS,
};
use vmo_layout::{ProcessIdentity, Region, RegionWriter};

const CAPS: Capacities = Capacities {
    nodes: 64,
    stacks: 4,
    frames: 64,
    threads: 2,
    modules: 1,
    named: 4,
    python_words: 64,
};

fn region() -> (Vec<u64>, RegionWriter) {
    let (_, size) = plan(&CAPS);
    let mut buf = vec![0u64; size as usize / 8];
    let id = ProcessIdentity {
        pid: 1,
        start_ticks: 1,
        exe_dev: 0,
        exe_ino: 0,
        exe_path: b"/x",
        cmdline: b"x",
        sample_interval: 0,
    };
    // SAFETY: a zeroed, 8-aligned buffer of the planned size that nothing else touches; the
    // Vec's heap buffer does not move when the Vec is returned.
    let w = unsafe { RegionWriter::create(buf.as_mut_ptr() as *mut u8, size, &CAPS, &id) }.unwrap();
    (buf, w)
}

fn bytes(buf: &[u64]) -> &[u8] {
    // SAFETY: a u64 slice viewed as bytes, same length in bytes, read-only.
    unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, buf.len() * 8) }
}

/// Writes a record as the shim does; returns its first word (not yet published when
/// `publish` is false).
fn write(w: &RegionWriter, name: &str, file: &str, line: u32, table: &[u8], publish: bool) -> u64 {
    let body: Vec<u8> = [name.as_bytes(), file.as_bytes(), table].concat();
    let words = PYTHON_RECORD_WORDS + body.len().div_ceil(8) as u64;
    let first = w.claim_python(words).unwrap();
    for (i, chunk) in body.chunks(8).enumerate() {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        w.python_word(first + PYTHON_RECORD_WORDS + i as u64)
            .store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
    w.python_word(first + 1)
        .store(0x7f00_1234, Ordering::Relaxed);
    w.python_word(first + 2).store(
        line as u64 | (name.len() as u64) << 32 | (file.len() as u64) << 48,
        Ordering::Relaxed,
    );
    w.python_word(first + 3)
        .store(table.len() as u64 | 12 << 32, Ordering::Relaxed);
    if publish {
        w.python_word(first)
            .store(words | PYTHON_RECORD_PUBLISHED, Ordering::Release);
    }
    first
}

fn frame(first: u64, index: u32) -> u64 {
    PYTHON_FRAME | first << 32 | index as u64
}

#[test]
fn records_round_trip_and_bad_ones_are_refused() {
    let (buf, w) = region();
    assert_eq!(w.claim_python(0), None);
    assert_eq!(w.claim_python(PYTHON_RECORD_MAX_WORDS + 1), None);
    let a = write(
        &w,
        "build",
        "/srv/app.py",
        12,
        &[0x80, 0, 0, 0x89, 4, 9],
        true,
    );
    let b = write(&w, "Thread.run", "threading.py", 970, &[], false);
    assert_eq!(a, 1, "word 0 is never handed out");
    let r = Region::from_bytes(bytes(&buf)).unwrap();
    assert!(r.has_python_frames());
    let c = r.python_code(frame(a, 3)).unwrap();
    assert_eq!(
        (c.qualname.as_str(), c.filename.as_str(), c.first_line),
        ("build", "/srv/app.py", 12)
    );
    assert_eq!(
        (c.linetable.as_slice(), c.minor, c.truncated, c.address),
        (&[0x80u8, 0, 0, 0x89, 4, 9][..], 12, false, 0x7f00_1234)
    );
    // Unpublished, unknown (0), past the cursor, not a Python frame.
    assert_eq!(r.python_code(frame(b, 0)), None);
    assert_eq!(r.python_code(frame(0, 0)), None);
    assert_eq!(r.python_code(frame(60, 0)), None);
    assert_eq!(r.python_code(a << 32), None);
    // Lengths that do not fit the record's words.
    w.python_word(a + 2)
        .store(12 | 200 << 32, Ordering::Relaxed);
    let r = Region::from_bytes(bytes(&buf)).unwrap();
    assert_eq!(r.python_code(frame(a, 3)), None);
    // A record longer than the section's used words.
    w.python_word(a)
        .store(50 | PYTHON_RECORD_PUBLISHED, Ordering::Relaxed);
    let r = Region::from_bytes(bytes(&buf)).unwrap();
    assert_eq!(r.python_code(frame(a, 3)), None);
}

/// The section is full: claims fail instead of writing past it (and, as with stack frames,
/// the cursor is not given back: later claims fail too).
#[test]
fn full_section_refuses_claims() {
    let (_buf, w) = region();
    assert_eq!(w.claim_python(40), Some(1));
    assert_eq!(w.claim_python(40), None);
    assert_eq!(w.claim_python(20), None);
}

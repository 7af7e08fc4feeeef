//! Benchmark-only ablations: parts of the recording switched off, to measure what each costs
//! (bench/run.py's section "floor", issue 20's "where a goal is out of reach, the measured
//! floor and why").
//!
//! Compiled in only with the cargo feature `ablation` (`cargo build --release -p
//! heapdump-preload --features ablation --target-dir target/ablation`); in every other build
//! [`on`] is the constant `false` and the checks vanish. With the feature,
//! `HEAPDUMP_ABLATE=LIST` (comma-separated) switches off:
//!
//! - `record`: `malloc` and `free` keep their block marks (trailers, headers: the wrappers'
//!   work and glibc's larger blocks) but record nothing: no thread state, no stack, no record.
//!   `calloc` and `realloc` still record.
//! - `stack`: no stack is captured or interned (every record has no stack).
//! - `table`: the allocations table is not touched by `malloc` and `free`: no record written
//!   on allocation, none stamped freed, and a trailer's record not read to validate it (the
//!   operation window, clock, counters and record-number recycling stay).
//!
//! A profile taken with any of them is wrong by design: this is a measuring instrument.

/// `HEAPDUMP_ABLATE=record`.
pub const RECORD: u8 = 1;
/// `HEAPDUMP_ABLATE=stack`.
pub const STACK: u8 = 2;
/// `HEAPDUMP_ABLATE=table`.
pub const TABLE: u8 = 4;

#[cfg(feature = "ablation")]
static MASK: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Whether ablation `bit` is on (always false without the `ablation` feature).
#[inline(always)]
pub fn on(bit: u8) -> bool {
    #[cfg(feature = "ablation")]
    {
        MASK.load(std::sync::atomic::Ordering::Relaxed) & bit != 0
    }
    #[cfg(not(feature = "ablation"))]
    {
        let _ = bit;
        false
    }
}

/// Parses `HEAPDUMP_ABLATE`'s value (names separated by commas): the bits, or the first name
/// that is not one. Allocates nothing.
pub fn parse(v: &[u8]) -> Result<u8, &[u8]> {
    let mut mask = 0;
    for name in v.split(|&c| c == b',').filter(|n| !n.is_empty()) {
        mask |= match name {
            b"record" => RECORD,
            b"stack" => STACK,
            b"table" => TABLE,
            _ => return Err(name),
        };
    }
    Ok(mask)
}

/// Sets the ablations (start-up, from the settings; the `ablation` feature only).
#[cfg(feature = "ablation")]
pub fn set(mask: u8) {
    MASK.store(mask, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_rejects_unknown_names() {
        assert_eq!(parse(b"stack"), Ok(STACK));
        assert_eq!(parse(b"table,stack"), Ok(TABLE | STACK));
        assert_eq!(parse(b"record,"), Ok(RECORD));
        assert_eq!(parse(b"stack,tables"), Err(&b"tables"[..]));
    }
}

//! The region file's name: `PID-STARTTICKS-CREATEDNS.heapdump`, in decimal (the pid, the
//! process's start time in clock ticks since boot, `/proc/PID/stat` field 22, and the
//! creation time, `CLOCK_MONOTONIC` ns). The one rule the shim (which writes, bounds and
//! removes region files) and the collector (which lists and picks them) share. No allocation:
//! the shim calls these inside `malloc`.

/// The suffix of a region file.
pub const SUFFIX: &[u8] = b".heapdump";
/// Appended to a region's name while its process `exec`s (`….heapdump.exec`): such a file is
/// no region to list, but one a process killed during its exec may leave behind.
pub const EXEC_SUFFIX: &[u8] = b".exec";
/// The longest name [`format`] writes: three `u64` of 20 digits, two `-`, the suffix.
pub const MAX_LEN: usize = 3 * 20 + 2 + SUFFIX.len();

/// What a region file's name says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionName {
    /// The process id.
    pub pid: u32,
    /// The process's start time, clock ticks since boot.
    pub start_ticks: u64,
    /// When the region was created, `CLOCK_MONOTONIC` ns.
    pub created_ns: u64,
}

/// A decimal number of ASCII digits only (no sign, no empty string, no overflow).
fn number(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &d in s {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(v)
}

/// Parses `PID-STARTTICKS-CREATEDNS.heapdump` (exactly three decimal numbers, the pid fitting
/// a `u32`). `None` for any other name, a region set aside for an exec included.
pub fn parse(name: &[u8]) -> Option<RegionName> {
    let stem = name.strip_suffix(SUFFIX)?;
    let mut it = stem.split(|b| *b == b'-');
    let pid = u32::try_from(number(it.next()?)?).ok()?;
    let start_ticks = number(it.next()?)?;
    let created_ns = number(it.next()?)?;
    it.next().is_none().then_some(RegionName {
        pid,
        start_ticks,
        created_ns,
    })
}

/// As [`parse`], also accepting a region set aside for an exec (`….heapdump.exec`).
pub fn parse_with_aside(name: &[u8]) -> Option<RegionName> {
    parse(name.strip_suffix(EXEC_SUFFIX).unwrap_or(name))
}

/// Writes the name of `n` into `buf` and returns its length (never more than [`MAX_LEN`]).
pub fn format(n: &RegionName, buf: &mut [u8; MAX_LEN]) -> usize {
    let mut len = 0;
    let mut put = |bytes: &[u8]| {
        buf[len..len + bytes.len()].copy_from_slice(bytes);
        len += bytes.len();
    };
    let mut digits = [0u8; 20];
    for (i, v) in [u64::from(n.pid), n.start_ticks, n.created_ns]
        .into_iter()
        .enumerate()
    {
        if i > 0 {
            put(b"-");
        }
        let mut k = digits.len();
        let mut v = v;
        loop {
            k -= 1;
            digits[k] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        put(&digits[k..]);
    }
    put(SUFFIX);
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_nothing_else_parses() {
        let n = RegionName {
            pid: u32::MAX,
            start_ticks: u64::MAX,
            created_ns: 0,
        };
        let mut buf = [0u8; MAX_LEN];
        let len = format(&n, &mut buf);
        assert_eq!(
            &buf[..len],
            b"4294967295-18446744073709551615-0.heapdump".as_slice()
        );
        assert_eq!(parse(&buf[..len]), Some(n));
        let ok = |pid, start_ticks, created_ns| {
            Some(RegionName {
                pid,
                start_ticks,
                created_ns,
            })
        };
        assert_eq!(parse(b"12-34-56.heapdump"), ok(12, 34, 56));
        for bad in [
            &b"12-34.heapdump"[..],
            b"12-34-56-7.heapdump",
            b"12-34-56.txt",
            b"a-34-56.heapdump",
            b"+12-34-56.heapdump", // std's parse takes a sign
            b"12k-34-56.heapdump", // the shim's size parser took a unit
            b"12--56.heapdump",
            b"4294967296-1-1.heapdump", // pid past u32
            b"1-18446744073709551616-1.heapdump",
            b"12-34-56.heapdump.exec",
        ] {
            assert_eq!(parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(parse_with_aside(b"12-34-56.heapdump.exec"), ok(12, 34, 56));
        assert_eq!(parse_with_aside(b"12-34-56.heapdump"), ok(12, 34, 56));
        assert_eq!(parse_with_aside(b"12-34-56.exec"), None);
    }
}

//! Which moment a snapshot is of: a named snapshot the program took (`--named`), and "born
//! since" an earlier instant (`--since`: a duration, a named snapshot, or an earlier profile).
//!
//! Every instant here is on the region's clock (`CLOCK_MONOTONIC_COARSE`, ns), the clock the
//! shim stamps allocations and frees with; wall-clock times are for display only.

use crate::snapshot::Moment;
use anyhow::{anyhow, bail, Result};
use std::path::Path;
use vmo_layout::{NamedSnapshot, RegionInfo};

/// Finds the named snapshot `spec` names: `NAME` (the latest of that name) or `NAME@N` (the
/// N-th of that name, from 1). A name that itself contains `@` is found whole when no
/// `NAME@N` reading matches.
///
/// Errors: no such snapshot (the message lists the names there are).
pub fn find_named<'a>(list: &'a [NamedSnapshot], spec: &str) -> Result<&'a NamedSnapshot> {
    if let Some((name, n)) = spec.rsplit_once('@') {
        if let Ok(n) = n.parse::<usize>() {
            let same: Vec<&NamedSnapshot> = list.iter().filter(|s| s.name == name).collect();
            if n >= 1 && n <= same.len() {
                return Ok(same[n - 1]);
            }
            if !same.is_empty() {
                bail!(
                    "there {} called {name:?}: {spec:?} asks for number {n} (they are numbered \
                     from 1)",
                    match same.len() {
                        1 => "is 1 named snapshot".to_owned(),
                        k => format!("are {k} named snapshots"),
                    }
                );
            }
        }
    }
    if let Some(s) = list.iter().rev().find(|s| s.name == spec) {
        return Ok(s);
    }
    let mut names: Vec<&str> = list.iter().map(|s| s.name.as_str()).collect();
    names.dedup();
    if names.is_empty() {
        bail!(
            "no named snapshot {spec:?}: the process took none (the program calls \
             heapdump_take_named_snapshot(\"NAME\") from heapdump.h)"
        )
    }
    // At most 12 names shown, the first and the last (helper G, 5: 256 names on one line).
    let shown: Vec<String> = if names.len() <= 12 {
        names.iter().map(|n| format!("{n:?}")).collect()
    } else {
        (names[..6].iter().map(|n| format!("{n:?}")))
            .chain([format!("… {} more …", names.len() - 12)])
            .chain(names[names.len() - 6..].iter().map(|n| format!("{n:?}")))
            .collect()
    };
    // A full table refuses the calls after it (helper G, 5: a name taken after it filled
    // was "not found", with no word of why).
    let full = if list.len() as u64 >= vmo_layout::v1::Capacities::default().named {
        format!(
            "; its table of named snapshots is full ({} entries): later calls of \
             heapdump_take_named_snapshot were refused",
            list.len()
        )
    } else {
        String::new()
    };
    bail!(
        "no named snapshot {spec:?}; the process took: {}{full}",
        shown.join(", ")
    )
}

/// The instant a profile written by heapdump was taken at, if it is a snapshot of the
/// process `info` describes: its `heapdump-instant` comment.
///
/// Errors: the file is not a heapdump profile, has no instant (written by an older heapdump),
/// is of another process, or is of an exited process's end (nothing is born after it).
pub fn profile_instant(path: &Path, info: &RegionInfo) -> Result<u64> {
    let p = crate::pprof::read(path)?;
    let re = regex::Regex::new(r"^heapdump-instant pid=(\d+) start_ticks=(\d+) region_ns=(\d+)$")
        .expect("valid regex");
    let found = p.comment.iter().find_map(|&i| {
        let c = p.string_table.get(i as usize)?;
        let m = re.captures(c)?;
        Some((
            m[1].parse::<u32>().ok()?,
            m[2].parse::<u64>().ok()?,
            m[3].parse::<u64>().ok()?,
        ))
    });
    let Some((pid, ticks, t)) = found else {
        bail!(
            "{}: no snapshot instant in this profile (written by another program or an older \
             heapdump); use a duration or a named snapshot instead",
            path.display()
        );
    };
    if pid != info.pid || ticks != info.start_ticks {
        bail!(
            "{} is a profile of pid {pid}{}, not of pid {}: --since compares moments of one \
             process",
            path.display(),
            if pid == info.pid {
                " (an earlier process with the same pid)"
            } else {
                ""
            },
            info.pid
        );
    }
    if t >= vmo_layout::v1::TIME_NONE - 1 {
        bail!(
            "{} was taken after the process exited: no block is born after it",
            path.display()
        );
    }
    Ok(t)
}

/// Builds the [`Moment`] of `--named` and `--since` for the region described by `info` with
/// named snapshots `named`.
///
/// `--since SPEC` is read as, in this order: an existing file (an earlier profile), a duration
/// (`humantime`: `90s`, `10m`, `1h 30m`, `500ms`), a named snapshot.
///
/// Errors: a name that is not there, a profile of another process, a SPEC that is none of the
/// three, a `--since` instant after the `--named` one (nothing could be in both).
pub fn resolve(
    info: &RegionInfo,
    named: &[NamedSnapshot],
    at: Option<&str>,
    since: Option<&str>,
) -> Result<Moment> {
    let mut m = Moment::default();
    if let Some(spec) = at {
        let s = find_named(named, spec)?;
        m.at = Some(s.time_ns);
        m.at_realtime_ns = Some(s.realtime_ns);
        m.notes.push(format!(
            "named snapshot {:?} (#{} of the process's named snapshots), taken at {}: the \
             blocks live at that instant; alloc_space/alloc_objects count every allocation up \
             to when this profile was read",
            s.name,
            s.index + 1,
            utc(s.realtime_ns)
        ));
        if s.lost > 0 {
            m.notes.push(format!(
                "incomplete: up to {} blocks live at that instant are missing (their records \
                 were reused once the process had kept HEAPDUMP_NAMED_SNAPSHOT_RECORDS={} \
                 records for named snapshots)",
                s.lost, info.named_hold_limit
            ));
        }
    }
    if let Some(spec) = since {
        let path = Path::new(spec);
        let (t, what) = if path.is_file() {
            let t = profile_instant(path, info)?;
            (t, format!("the profile {spec}"))
        } else if let Ok(d) = humantime::parse_duration(spec) {
            let now = vmo_layout::clock::now_ns();
            (
                now.saturating_sub(d.as_nanos().min(u64::MAX as u128) as u64),
                format!("{} ago", humantime::format_duration(d)),
            )
        } else {
            let s = find_named(named, spec).map_err(|e| {
                anyhow!(
                    "--since {spec:?} is not a file, not a duration (90s, 10m, 2h) and not a \
                     named snapshot: {e}"
                )
            })?;
            (
                s.time_ns,
                format!("named snapshot {:?} ({})", s.name, utc(s.realtime_ns)),
            )
        };
        if let Some(at) = m.at {
            if t >= at {
                bail!(
                    "--since {spec:?} is not before the --named snapshot: no block live at that \
                     snapshot was allocated after it"
                );
            }
        }
        m.born_after = t.max(1);
        m.notes.push(format!(
            "born since {what}: only blocks allocated after that instant (region clock {t} ns) \
             and still live; inuse_* count those, alloc_* every allocation since start-up"
        ));
    }
    Ok(m)
}

/// `ns` since the Unix epoch as `2026-11-23T17:40:51.123Z`.
pub fn utc(ns: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns);
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(index: u32, name: &str, t: u64) -> NamedSnapshot {
        NamedSnapshot {
            index,
            name: name.into(),
            time_ns: t,
            realtime_ns: 0,
            lost: 0,
        }
    }

    #[test]
    fn names_and_numbers() {
        let l = [
            snap(0, "warm", 10),
            snap(1, "x@y", 20),
            snap(2, "warm", 30),
            snap(3, "a@2", 40),
        ];
        assert_eq!(find_named(&l, "warm").unwrap().time_ns, 30);
        assert_eq!(find_named(&l, "warm@1").unwrap().time_ns, 10);
        assert_eq!(find_named(&l, "warm@2").unwrap().time_ns, 30);
        assert!(find_named(&l, "warm@3")
            .unwrap_err()
            .to_string()
            .contains("there are 2 named snapshots called \"warm\""));
        assert!(find_named(&l, "warm@0").is_err());
        assert_eq!(
            find_named(&l, "x@y@2").unwrap_err().to_string(),
            "there is 1 named snapshot called \"x@y\": \"x@y@2\" asks for number 2 (they are \
             numbered from 1)"
        );
        assert_eq!(find_named(&l, "x@y").unwrap().time_ns, 20);
        assert_eq!(find_named(&l, "a@2").unwrap().time_ns, 40);
        let e = find_named(&l, "cold").unwrap_err().to_string();
        assert!(
            e.contains("\"warm\", \"x@y\", \"warm\", \"a@2\"") || e.contains("\"warm\""),
            "{e}"
        );
        assert!(find_named(&[], "x")
            .unwrap_err()
            .to_string()
            .contains("took none"));
    }

    #[test]
    fn since_before_named() {
        let info = RegionInfo::default();
        let l = [snap(0, "a", 100), snap(1, "b", 200)];
        let m = resolve(&info, &l, Some("b"), Some("a")).unwrap();
        assert_eq!((m.at, m.born_after), (Some(200), 100));
        assert!(resolve(&info, &l, Some("a"), Some("b")).is_err());
        assert!(resolve(&info, &l, None, Some("nonsense"))
            .unwrap_err()
            .to_string()
            .contains("not a file, not a duration"));
        let m = resolve(&info, &l, None, Some("10m")).unwrap();
        assert!(m.born_after > 0 && m.at.is_none());
    }
}

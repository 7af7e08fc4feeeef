//! `heapdump gc`: removes the regions of exited processes.

use crate::cli;
use crate::regions::{self, Liveness};
use anyhow::{bail, Result};

/// What `gc` does.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Only print what would be removed.
    pub dry_run: bool,
}

impl From<cli::GcArgs> for Options {
    fn from(a: cli::GcArgs) -> Self {
        Options { dry_run: a.dry_run }
    }
}

/// Removes (or, dry, lists) every region whose process is gone, except one still being laid out.
pub fn run(a: Options) -> Result<()> {
    let (mut removed, mut failed) = (0, 0);
    // The directory opened once, before it is listed: files are removed relative to this
    // descriptor, so a directory renamed away and replaced by a link meanwhile (its owner can,
    // when root collects in another user's directory) makes nothing outside it removed.
    let dir_path = regions::region_dir();
    let dir = if regions::check_dir(&dir_path)? {
        Some(crate::outdir::Dir::open(
            &dir_path,
            crate::outdir::Create::No,
        )?)
    } else {
        None
    };
    let entries = regions::scan()?;
    heapdump_testhooks::gc_pause();
    // Which running processes map region files, read once when something is to be removed.
    let mut mappers = None;
    for e in entries {
        // A detached process still runs, and may be attached again into its region.
        if matches!(e.liveness, Liveness::Alive | Liveness::Detached) {
            continue;
        }
        // A region whose writer is still laying it out is briefly unreadable: leave young ones.
        let young = std::fs::metadata(&e.file.path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() < 60);
        if e.info.is_none()
            && young
            && regions::proc_start_ticks(e.file.pid) == Some(e.file.start_ticks)
        {
            continue;
        }
        let what = match &e.info {
            Some(i) => format!("pid {} ({})", e.file.pid, regions::show_cmdline(&i.cmdline)),
            None => format!(
                "pid {} (unreadable: {})",
                e.file.pid,
                regions::shown(e.error.as_deref().unwrap_or(""))
            ),
        };
        // The process that wrote it may be alive in another PID namespace (a container),
        // where its pid is the one in the region's name: it still maps the file (helper I, 1:
        // gc removed the region of a live, recording process attached from outside). A forked
        // child that maps its parent's region is not that process (helper J, 2).
        if let Ok(md) = std::fs::symlink_metadata(&e.file.path) {
            let mappers = mappers.get_or_insert_with(regions::region_mappers);
            if let Some(&p) = mappers.get(&regions::maps_id(&md)) {
                if regions::innermost_pid(p) == Some(e.file.pid)
                    && regions::proc_start_ticks(p) == Some(e.file.start_ticks)
                {
                    eprintln!(
                        "heapdump: {}: its process runs in another PID namespace (pid {p} \
                         here, {} there): left alone",
                        e.file.path.display(),
                        e.file.pid
                    );
                    continue;
                }
            }
        }
        // A directory with a region's name is not a region: gc removes files only.
        if std::fs::symlink_metadata(&e.file.path).is_ok_and(|m| m.is_dir()) {
            eprintln!(
                "heapdump: {}: a directory, not a region file: left alone",
                e.file.path.display()
            );
            continue;
        }
        if a.dry_run {
            println!("would remove {}: {what}", e.file.path.display());
        } else if let Err(err) = remove(dir.as_ref(), &e.file.path) {
            // The others are still removed: one that cannot be is reported at the end.
            eprintln!("heapdump: cannot remove {}: {err:#}", e.file.path.display());
            failed += 1;
            continue;
        } else {
            println!("removed {}: {what}", e.file.path.display());
        }
        removed += 1;
    }
    // Regions set aside for an exec (the shim's exec.rs): the exec succeeded, or the process
    // died, once no process maps the file (a failed exec renames it back, still mapped). A
    // process whose mappings cannot be read (not dumpable) keeps its file while it runs.
    // Listed and examined through the directory opened above, never through its path again.
    let aside_names = dir
        .as_ref()
        .and_then(|d| d.names().ok())
        .unwrap_or_default();
    for name in aside_names {
        let Some(d) = dir.as_ref() else { break };
        let bytes = name.as_encoded_bytes();
        if !bytes.ends_with(b".heapdump.exec") {
            continue;
        }
        let Some(n) = vmo_layout::name::parse_with_aside(bytes) else {
            continue;
        };
        let Ok(Some(st)) = d.stat_at(&name) else {
            continue;
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            continue;
        }
        let mappers = mappers.get_or_insert_with(regions::region_mappers);
        if mappers.contains_key(&regions::maps_id_of(st.st_dev, st.st_ino)) {
            continue;
        }
        let (pid, ticks) = (n.pid, n.start_ticks);
        let gone = regions::proc_start_ticks(pid) != Some(ticks);
        if !gone && std::fs::File::open(format!("/proc/{pid}/maps")).is_err() {
            continue;
        }
        let what = if gone {
            format!("pid {pid} (gone during an exec)")
        } else {
            format!("pid {pid} (its image before an exec that succeeded)")
        };
        let path = d.path().join(&name);
        if a.dry_run {
            println!("would remove {}: {what}", path.display());
        } else if let Err(err) = d.remove(&name) {
            eprintln!("heapdump: cannot remove {}: {err:#}", path.display());
            failed += 1;
            continue;
        } else {
            println!("removed {}: {what}", path.display());
        }
        removed += 1;
    }
    eprintln!(
        "heapdump: {removed} region(s) of exited processes {}",
        if a.dry_run { "to remove" } else { "removed" }
    );
    if failed > 0 {
        bail!("{failed} region file(s) could not be removed (see above)");
    }
    Ok(())
}

/// Removes region file `path` (listed in the region directory) through `dir`, the descriptor
/// of that directory opened before it was listed.
fn remove(dir: Option<&crate::outdir::Dir>, path: &std::path::Path) -> Result<()> {
    let (Some(dir), Some(name)) = (dir, path.file_name()) else {
        bail!("not in the region directory opened");
    };
    dir.remove(name)
}

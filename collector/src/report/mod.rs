//! `heapdump report`: one self-contained HTML file of a process's heap over time, from the
//! profiles `watch` writes (or any heapdump profiles of one process), and `watch --report`,
//! which rewrites it after every beat.
//!
//! * [`model`] — the snapshots of each process (stack traces interned in a trie) and what the
//!   page shows: summary, timeline, growth ranking, flame-graph data, and the Leaks (a
//!   `leaks -o` profile) and Reference graph (a `graph -o` capture) sections, as JSON.
//! * [`growth`] — the growth measures (least-squares slope, R², share of growing intervals).
//! * [`page`] — the HTML: template, vendored chart libraries, the JSON.

pub mod growth;
pub mod model;
pub mod page;

use crate::sites::Sites;
use anyhow::{bail, Context, Result};
pub use model::Report;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What `heapdump report` does.
#[derive(Debug, Clone)]
pub struct ReportProps {
    /// Directories (their `*.pb.gz` and `*.hdsnap` files), profile and graph-capture files.
    pub inputs: Vec<PathBuf>,
    /// The HTML file (`-`: standard output).
    pub output: PathBuf,
    /// Only this process.
    pub pid: Option<u32>,
    /// More allocator wrappers to look past when naming sites (a regular expression).
    pub drop_frames: Option<String>,
}

impl TryFrom<crate::cli::ReportArgs> for ReportProps {
    type Error = anyhow::Error;

    fn try_from(a: crate::cli::ReportArgs) -> Result<Self> {
        Ok(ReportProps {
            inputs: a.inputs,
            output: a.output,
            pid: a.pid,
            drop_frames: a.drop_frames,
        })
    }
}

/// The files to read: each directory's `*.pb.gz` profiles and `*.hdsnap` graph captures (not
/// hidden ones: a temporary file being written, `.spool`), each file as given; sorted by
/// path, duplicates dropped. The flag: given by name.
///
/// Errors: an input does not exist or a directory cannot be listed.
fn profile_files(inputs: &[PathBuf]) -> Result<Vec<(PathBuf, bool)>> {
    let mut out = Vec::new();
    for input in inputs {
        let meta = std::fs::metadata(input).with_context(|| format!("{}", input.display()))?;
        if meta.is_dir() {
            let rd = std::fs::read_dir(input)
                .with_context(|| format!("cannot list {}", input.display()))?;
            for e in rd.flatten() {
                // By bytes: a name that is not UTF-8 is still a profile if it ends so.
                let name = e.file_name();
                let name = name.as_bytes();
                if name.starts_with(b".")
                    || !(name.ends_with(b".pb.gz") || name.ends_with(b".hdsnap"))
                {
                    continue;
                }
                match e.file_type() {
                    Ok(t) if t.is_file() => out.push((e.path(), false)),
                    // Not followed: a link in a directory of profiles may point anywhere.
                    Ok(t) => eprintln!(
                        "heapdump: warning: skipped {}: {}",
                        crate::regions::shown(&e.path().display().to_string()),
                        if t.is_symlink() {
                            "a symbolic link (not followed in a directory; name its target)"
                        } else {
                            "not a regular file"
                        }
                    ),
                    Err(err) => eprintln!(
                        "heapdump: warning: skipped {}: {err}",
                        crate::regions::shown(&e.path().display().to_string())
                    ),
                }
            }
        } else {
            out.push((input.clone(), true));
        }
    }
    out.sort();
    out.dedup_by(|a, b| a.0 == b.0);
    Ok(out)
}

/// Runs `heapdump report`: reads the profiles, writes the page, says what it holds on stderr.
///
/// Errors: an input is missing; a profile given by name cannot be read (one found in a
/// directory is skipped with a warning); no profile was read; `--pid` names no process of
/// the inputs; `--drop-frames` is not a regular expression; the output cannot be written.
pub fn run(props: ReportProps) -> Result<()> {
    let rule = Sites::new(props.drop_frames.as_deref())
        .with_context(|| format!("--drop-frames {:?}", props.drop_frames))?;
    let files = profile_files(&props.inputs)?;
    let mut report = Report::new(rule);
    for (path, named) in &files {
        let added = if crate::graph::capture::is_capture(path)
            || path.to_string_lossy().ends_with(".hdsnap")
        {
            // Its errors name the file.
            crate::graph::capture::read(path).map(|c| report.add_graph(&c, &display_name(path)))
        } else {
            crate::pprof::read(path).and_then(|p| {
                report
                    .add(&p, &display_name(path))
                    .with_context(|| path.display().to_string())
            })
        };
        match added {
            Ok(()) => {}
            Err(e) if *named => return Err(e),
            Err(e) => eprintln!(
                "heapdump: warning: skipped {}",
                crate::regions::shown(&format!("{e:#}"))
            ),
        }
    }
    if report.len() == 0 && report.sections() == 0 {
        bail!(
            "no heapdump profiles or graph captures in {} (`heapdump watch -o DIR` writes \
             profiles)",
            (props.inputs.iter())
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let procs = report.processes();
    if let Some(pid) = props.pid {
        if !procs.iter().any(|(p, _)| *p == pid) {
            bail!(
                "--pid {pid}: no profile of that process among the inputs; they hold {}",
                describe(&procs)
            );
        }
    }
    write(&report, props.pid, &props.output)?;
    let sections = match report.sections() {
        0 => String::new(),
        k => format!(" and {k} leaks/reference-graph section(s)"),
    };
    // With --pid, what the page holds: that process only (helper I, 7).
    let (count, of) = match props.pid {
        Some(pid) => (
            report.len_of(pid),
            describe(
                &procs
                    .iter()
                    .filter(|(p, _)| *p == pid)
                    .cloned()
                    .collect::<Vec<_>>(),
            ),
        ),
        None => (report.len(), describe(&procs)),
    };
    eprintln!(
        "heapdump: report of {count} snapshot(s){sections} of {of} -> {}",
        props.output.display()
    );
    Ok(())
}

/// Writes the page of `report` (only `pid`'s section when given) to `out` (`-`: standard
/// output) through a temporary file in the same directory renamed into place
/// ([`crate::output::write_bytes`]): a reader never sees half a page.
pub fn write(report: &Report, pid: Option<u32>, out: &Path) -> Result<()> {
    let data = report.json(pid);
    let procs = report.processes();
    let title = match pid {
        Some(p) => procs
            .iter()
            .find(|(q, _)| *q == p)
            .map_or(format!("pid {p}"), |(q, c)| format!("pid {q} ({c})")),
        None => describe(&procs),
    };
    let html = page::html(&title, &data);
    crate::output::write_bytes(html.as_bytes(), out)
}

/// `pid 12 (server), pid 13 (worker)`.
fn describe(procs: &[(u32, String)]) -> String {
    (procs.iter())
        .map(|(p, c)| {
            let name = c.split_whitespace().next().unwrap_or("");
            let name = name.rsplit('/').next().unwrap_or(name);
            format!("pid {p} ({name})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A file's name as the page shows it.
fn display_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

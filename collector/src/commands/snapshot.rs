//! `heapdump snapshot`: one instant of a region (or several processes') as a pprof profile,
//! an SVG flame graph, and/or a push.

use crate::cli::{SnapshotProps, Target};
use crate::regions::{self, Liveness};
use crate::{contents, moments, multi, pprof, push, snapshot};
use anyhow::{bail, Result};

/// Takes the snapshot `p` describes and writes/pushes it; prints one summary line on stderr.
pub fn run(p: SnapshotProps) -> Result<()> {
    if let Target::Many(sel) = &p.target {
        return multi::snapshot(&p, sel);
    }
    let (path, file) = regions::pick(&p.target)?;
    let regions::Usable {
        opened,
        info,
        liveness,
        ..
    } = regions::open_usable(&path, file.as_ref())?;
    // Contents are read from the running process: refuse post-mortem, and a bad directory,
    // before any work.
    if p.contents.is_some() && liveness != Liveness::Alive {
        bail!(
            "{}",
            liveness.why_no_memory(
                info.pid,
                "--contents-dir and --with-strings need a running process it records"
            )
        );
    }
    let out_dir = (p.contents.as_ref())
        .and_then(|r| r.dir.as_deref())
        .map(contents::OutDir::prepare)
        .transpose()?;
    let with_strings = p.contents.as_ref().is_some_and(|r| r.strings);
    let per_block = p.with_tags || with_strings;
    // Progress on stderr when someone watches it (large regions take seconds).
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let started = std::time::Instant::now();
    let stage = |what: &str| {
        if progress {
            eprintln!(
                "heapdump: [{:>6.2} s] {what}",
                started.elapsed().as_secs_f64()
            );
        }
    };
    stage(&format!(
        "snapshotting pid {} ({} records to scan)",
        info.pid, info.counters.allocs
    ));
    let moment = moments::resolve(
        &info,
        &opened.region()?.named_snapshots(),
        p.named.as_deref(),
        p.since.as_deref(),
    )?;
    for n in moment.notes.iter().filter(|n| n.starts_with("incomplete")) {
        eprintln!("heapdump: warning: {n}");
    }
    let mut c = snapshot::collect_at(
        &opened,
        liveness,
        per_block || p.contents.is_some(),
        p.lock_timeout,
        &moment,
    )?;
    let read = match &p.contents {
        Some(req) => {
            heapdump_testhooks::contents_pause();
            stage(&format!(
                "reading the contents of {} live blocks",
                c.meta.blocks
            ));
            let blocks = c.blocks.as_deref().unwrap_or_default();
            let mut read = contents::read(info.pid, blocks, req, out_dir.as_ref())?;
            // The process read must still be the one trusted: its pid reused meanwhile (the
            // region's owner can hold the lock while that happens), the bytes read may be
            // another process's. Nothing of them is kept, whatever fails from here.
            let discard = |read: &mut contents::Outcome, e: anyhow::Error| -> anyhow::Error {
                match read.drop_freed(&Default::default(), out_dir.as_ref()) {
                    Ok(()) => e,
                    Err(also) => e.context(format!("{also:#}")),
                }
            };
            let gone = || {
                anyhow::anyhow!(
                    "pid {} exited during the read of the blocks' contents: what was read \
                     cannot be trusted, and nothing of it was kept",
                    info.pid
                )
            };
            if !opened.still_checked_process() {
                return Err(discard(&mut read, gone()));
            }
            // A second look at the region: blocks freed since the snapshot may have been read
            // after their memory was reused.
            stage("checking which blocks were freed meanwhile");
            let again = match snapshot::collect(&opened, liveness, true, p.lock_timeout) {
                Ok(again) => again,
                Err(e) => return Err(discard(&mut read, e)),
            };
            let live: std::collections::HashSet<(u64, u64, u64)> = (again.blocks.iter().flatten())
                .map(|b| (b.address, b.t_alloc, b.size))
                .collect();
            read.drop_freed(&live, out_dir.as_ref())?;
            if !opened.still_checked_process() {
                return Err(discard(&mut read, gone()));
            }
            Some(read)
        }
        None => None,
    };
    if !per_block {
        c.blocks = None;
    }
    stage(&format!(
        "{} live blocks in {} stack traces; symbolizing",
        c.meta.blocks,
        c.stacks.len()
    ));
    for w in &c.meta.warnings {
        eprintln!("heapdump: warning: {}", regions::shown(w));
    }
    let (mut profile, mut blocks) = pprof::build(
        &c,
        pprof::Options {
            with_tags: per_block,
            symbolize: p.symbolize,
        },
    );
    if let (Some(read), Some(req)) = (&read, &p.contents) {
        if let Some(b) = blocks.as_mut() {
            b.add_strings(&mut profile, &read.strings);
        }
        for line in read.report(req, out_dir.as_ref()) {
            eprintln!("heapdump: {line}");
            pprof::add_comment(&mut profile, &line);
        }
    }
    if let Some(output) = &p.output {
        stage(&format!(
            "writing {}{}",
            output.display(),
            if per_block {
                " (one sample per block)"
            } else {
                ""
            }
        ));
        pprof::write_as(
            &mut profile,
            blocks.as_ref().as_slice(),
            output,
            p.format,
            p.sample_index,
            &format!("pid {} ({})", c.info.pid, regions::command_name(&c.info)),
        )?;
    }
    let mut sent = String::new();
    if let Some(push) = &p.push {
        stage(&format!("pushing to {}", push.url));
        let name = regions::command_name(&c.info);
        // A single push is a process's first: alloc_* go as 0 (see push::delta::for_push).
        let (pushed, _) = push::delta::for_push(&profile, None);
        let gz = pprof::encode_gz(&pushed)?;
        let client = push::client::Client::new(push)?;
        let item = client.item(&name, c.info.pid, &gz);
        client
            .send(&item)
            .map_err(|e| anyhow::anyhow!("{}", e.text))?;
        sent = format!("pushed to {}", push.url);
    }
    let what = match (&p.named, &p.since) {
        (Some(n), None) => format!(" at named snapshot {n:?}"),
        (None, Some(s)) => format!(" born since {s}"),
        (Some(n), Some(s)) => format!(" at named snapshot {n:?}, born since {s}"),
        (None, None) => String::new(),
    };
    let dest: Vec<String> = (p.output.iter().map(|o| o.display().to_string()))
        .chain((!sent.is_empty()).then_some(sent))
        .collect();
    eprintln!(
        "heapdump: pid {} ({}, {}): {} live blocks, {} bytes{what} -> {}",
        c.info.pid,
        regions::command_label(&c.info),
        liveness.as_str(),
        c.meta.blocks,
        c.meta.bytes,
        dest.join(", ")
    );
    for line in regions::incomplete_lines(&c.info) {
        eprintln!("heapdump: warning: {line}");
    }
    Ok(())
}

//! `heapdump`: the collector.
//!
//! Modules: [`cli`] (argument parsing), [`regions`] (finding and opening region files safely),
//! [`snapshot`] (reading one instant of a region), [`symbolize`] (blazesym), [`pprof`] (profile
//! building, merging and writing), [`multi`] (several processes into one profile), [`flame`]
//! (SVG flame graphs), [`contents`] (block contents: `--contents-dir`, `--with-strings`),
//! [`watch`] (snapshots every interval), [`push`] (sending profiles to Pyroscope or Parca, the
//! queue), [`parca`] (the gRPC client), [`spool`] (unsent profiles kept on disk).

mod cli;
mod contents;
mod flame;
mod frozen;
#[cfg(test)]
mod fuzz;
mod graph;
mod hugealloc;
mod live;
mod moments;
mod multi;
mod outdir;
mod parca;
mod perfmap;
mod pprof;
mod priority;
mod push;
mod python;
mod regions;
mod sites;
mod snapshot;
mod spool;
mod symbolize;
mod watch;

use anyhow::{bail, Context, Result};
use clap::Parser;
use cli::{
    Cli, Command, GcArgs, GraphArgs, LeaksArgs, ListArgs, RetainersArgs, RunArgs, SnapshotProps,
    Target, TopArgs,
};
use regions::{Liveness, RegionFile};
use std::path::PathBuf;

/// Large blocks on transparent huge pages (see `hugealloc`).
#[global_allocator]
static ALLOC: hugealloc::HugeAlloc = hugealloc::HugeAlloc;

fn main() {
    // Die quietly of SIGPIPE like other command-line tools (`heapdump list | head`), instead of
    // Rust's default of ignoring it and panicking on the failed write.
    // SAFETY: setting a signal's disposition to the default has no preconditions; no thread
    // has been started yet.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    let r = match cli.command {
        Command::List(a) => list(a),
        Command::Snapshot(a) => {
            // The whole one-shot snapshot runs raised where allowed (see `priority`).
            let _boost = priority::Boost::raise();
            SnapshotProps::try_from(a).and_then(snapshot)
        }
        Command::Run(a) => run(a),
        Command::Gc(a) => gc(a),
        Command::Watch(a) => cli::WatchProps::try_from(a).and_then(|w| watch::watch(&w)),
        Command::Leaks(a) => leaks(a),
        Command::Retainers(a) => retainers(a),
        Command::Graph(a) => graph_cmd(a),
        Command::Top(a) => top(a),
        Command::Convert(a) => convert(a),
    };
    if let Err(e) = r {
        eprintln!("heapdump: {e:#}");
        std::process::exit(1);
    }
    if snapshot::DAMAGED.load(std::sync::atomic::Ordering::Relaxed) {
        // The output was written, but from a region that cannot be true (said on stderr and
        // in the profile's comments).
        std::process::exit(snapshot::EXIT_DAMAGED);
    }
}

/// A region file with its header read.
struct Entry {
    file: RegionFile,
    info: Option<vmo_layout::RegionInfo>,
    /// Named snapshots the program took.
    named: Vec<vmo_layout::NamedSnapshot>,
    error: Option<String>,
    liveness: Liveness,
    /// Why the region is foreign ([`regions::trust`]): every command refuses it.
    foreign: Option<String>,
}

impl Entry {
    /// `list`'s STATUS: `foreign`, else its process's liveness.
    fn status(&self) -> &'static str {
        match self.foreign {
            Some(_) => "foreign",
            None => self.liveness.as_str(),
        }
    }
}

fn scan() -> Result<Vec<Entry>> {
    let dir = regions::region_dir();
    let files = regions::list_files(&dir)?;
    let mut out = Vec::new();
    for f in &files {
        let newer = regions::has_newer(&files, f);
        // A region truncated while its header is read shows zeros instead of killing us
        // (see `regions::truncation`): report it as unreadable.
        type Read = (
            vmo_layout::RegionInfo,
            Vec<vmo_layout::NamedSnapshot>,
            Option<String>,
        );
        let read = |o: regions::Opened| -> Result<Read> {
            let r = o.region()?;
            let (info, named) = (r.info(), r.named_snapshots());
            let foreign = regions::trust(&o, &info, Some(f)).err();
            match o.truncated() {
                Some(why) => bail!("{why}"),
                None => Ok((info, named, foreign)),
            }
        };
        match regions::open(&f.path).and_then(read) {
            Ok((info, named, foreign)) => {
                let liveness = regions::liveness(&info, f, newer);
                out.push(Entry {
                    file: f.clone(),
                    info: Some(info),
                    named,
                    error: None,
                    liveness,
                    foreign,
                });
            }
            Err(e) => out.push(Entry {
                file: f.clone(),
                info: None,
                named: Vec::new(),
                error: Some(format!("{e:#}")),
                liveness: Liveness::Exited,
                foreign: None,
            }),
        }
    }
    Ok(out)
}

fn list(a: ListArgs) -> Result<()> {
    let entries = scan()?;
    if a.json {
        let v: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| match &e.info {
                Some(i) => serde_json::json!({
                    "pid": e.file.pid,
                    "command": regions::command_name(i),
                    "cmdline": i.cmdline,
                    "executable": i.exe_path,
                    "status": e.status(),
                    "foreign": e.foreign,
                    "live_bytes": i.counters.live_bytes,
                    "live_blocks": i.counters.live_blocks,
                    "allocations": i.counters.allocs,
                    "frees": i.counters.frees,
                    "peak_live_bytes": i.counters.peak_live_bytes,
                    "dropped_blocks": i.counters.dropped_blocks,
                    "dropped_stacks": i.counters.dropped_stacks,
                    "threads": i.counters.threads,
                    "layout_version": i.version,
                    "region": e.file.path,
                    "recording_stopped": i.stop_reasons(),
                    "warnings": i.warnings,
                    "named_snapshots": e.named.iter().map(|s| serde_json::json!({
                        "name": s.name,
                        "number": s.index + 1,
                        "time": moments::utc(s.realtime_ns),
                        "time_unix_ns": s.realtime_ns,
                        "region_clock_ns": s.time_ns,
                        "incomplete_by_at_most": s.lost,
                    })).collect::<Vec<_>>(),
                }),
                None => serde_json::json!({
                    "pid": e.file.pid,
                    "region": e.file.path,
                    "error": e.error,
                }),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:>8}  {:<7}  {:>12}  {:>10}  {:>8}  {:>3}  COMMAND",
        "PID", "STATUS", "LIVE BYTES", "BLOCKS", "DROPPED", "VER"
    );
    for e in &entries {
        match &e.info {
            Some(i) => {
                println!(
                    "{:>8}  {:<7}  {:>12}  {:>10}  {:>8}  {:>3}  {}",
                    e.file.pid,
                    e.status(),
                    i.counters.live_bytes,
                    i.counters.live_blocks,
                    i.counters.dropped_blocks,
                    i.version,
                    i.cmdline.join(" ")
                );
                if let Some(why) = &e.foreign {
                    println!("{:>8}  {why}", "");
                }
                // Why recording stopped and start-up warnings, under the process's line.
                for r in i.stop_reasons() {
                    println!("{:>8}  recording stopped: {r}", "");
                }
                for w in &i.warnings {
                    println!("{:>8}  warning: {w}", "");
                }
                if a.snapshots {
                    // Per name, the number `--named NAME@N` takes.
                    let mut seen: std::collections::HashMap<&str, usize> = Default::default();
                    for s in &e.named {
                        let k = seen.entry(s.name.as_str()).or_default();
                        *k += 1;
                        println!(
                            "{:>8}  named snapshot {:?} (@{k}) at {}{}",
                            "",
                            s.name,
                            moments::utc(s.realtime_ns),
                            if s.lost > 0 {
                                format!(", incomplete: up to {} blocks missing", s.lost)
                            } else {
                                String::new()
                            }
                        );
                    }
                    if i.named_requested > i.named_capacity {
                        println!(
                            "{:>8}  {} more named snapshots were refused: the table holds {}",
                            "",
                            i.named_requested - i.named_capacity,
                            i.named_capacity
                        );
                    }
                }
            }
            None => println!(
                "{:>8}  {:<7}  {:>12}  {:>10}  {:>8}  {:>3}  ({})",
                e.file.pid,
                "?",
                "-",
                "-",
                "-",
                "-",
                e.error.as_deref().unwrap_or("")
            ),
        }
    }
    Ok(())
}

fn gc(a: GcArgs) -> Result<()> {
    let mut removed = 0;
    for e in scan()? {
        if e.liveness == Liveness::Alive {
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
            Some(i) => format!("pid {} ({})", e.file.pid, i.cmdline.join(" ")),
            None => format!(
                "pid {} (unreadable: {})",
                e.file.pid,
                e.error.as_deref().unwrap_or("")
            ),
        };
        if a.dry_run {
            println!("would remove {}: {what}", e.file.path.display());
        } else {
            std::fs::remove_file(&e.file.path)
                .with_context(|| format!("cannot remove {}", e.file.path.display()))?;
            println!("removed {}: {what}", e.file.path.display());
        }
        removed += 1;
    }
    eprintln!(
        "heapdump: {removed} region(s) of exited processes {}",
        if a.dry_run { "to remove" } else { "removed" }
    );
    Ok(())
}

fn pick(target: &Target) -> Result<(PathBuf, Option<RegionFile>)> {
    match target {
        Target::File(p) => Ok((p.clone(), None)),
        Target::Many(_) => bail!("this command takes one process, not --multi-process"),
        Target::Pid(pid) => {
            let files = regions::list_files(&regions::region_dir())?;
            let mut mine: Vec<&RegionFile> = files.iter().filter(|f| f.pid == *pid).collect();
            if mine.is_empty() {
                if regions::proc_start_ticks(*pid).is_some() {
                    bail!(
                        "process {pid} is not instrumented (no region in {}); start it with `heapdump run` or LD_PRELOAD=libheapdump.so",
                        regions::region_dir().display()
                    );
                }
                bail!("no such process: {pid} (and no region left by it)");
            }
            // Prefer the region of the image running now; else the newest.
            let now = regions::proc_start_ticks(*pid);
            mine.sort_by_key(|f| (Some(f.start_ticks) == now, f.created_ns));
            let f = mine.last().unwrap();
            Ok((f.path.clone(), Some((*f).clone())))
        }
        Target::Name(name) => {
            let entries = scan()?;
            let matches: Vec<&Entry> = entries
                .iter()
                .filter(|e| {
                    e.info
                        .as_ref()
                        .is_some_and(|i| regions::matches_name(i, name))
                })
                .collect();
            let alive: Vec<&&Entry> = matches
                .iter()
                .filter(|e| e.liveness == Liveness::Alive)
                .collect();
            let chosen: Vec<&Entry> = if alive.len() == 1 {
                vec![alive[0]]
            } else {
                matches.clone()
            };
            match chosen.as_slice() {
                [] => bail!("no instrumented process named {name:?} (see `heapdump list`)"),
                [one] => Ok((one.file.path.clone(), Some(one.file.clone()))),
                many => {
                    let list: Vec<String> = many
                        .iter()
                        .map(|e| {
                            format!(
                                "  pid {} ({}): {}",
                                e.file.pid,
                                e.liveness.as_str(),
                                e.info
                                    .as_ref()
                                    .map(|i| i.cmdline.join(" "))
                                    .unwrap_or_default()
                            )
                        })
                        .collect();
                    bail!(
                        "{name:?} matches {} processes; pick one with --by-pid:\n{}",
                        many.len(),
                        list.join("\n")
                    )
                }
            }
        }
    }
}

fn snapshot(p: SnapshotProps) -> Result<()> {
    if let Target::Many(sel) = &p.target {
        return multi::snapshot(&p, sel);
    }
    let (path, file) = pick(&p.target)?;
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
            "pid {} {}: a post-mortem region records blocks but not their contents, so \
             --contents-dir and --with-strings need a running process",
            info.pid,
            liveness.gone()
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
            test_pause();
            stage(&format!(
                "reading the contents of {} live blocks",
                c.meta.blocks
            ));
            let blocks = c.blocks.as_deref().unwrap_or_default();
            let mut read = contents::read(info.pid, blocks, req, out_dir.as_ref())?;
            // A second look at the region: blocks freed since the snapshot may have been read
            // after their memory was reused.
            stage("checking which blocks were freed meanwhile");
            let again = snapshot::collect(&opened, liveness, true, p.lock_timeout)?;
            let live: std::collections::HashSet<(u64, u64, u64)> = (again.blocks.iter().flatten())
                .map(|b| (b.address, b.t_alloc, b.size))
                .collect();
            read.drop_freed(&live, out_dir.as_ref())?;
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
        eprintln!("heapdump: warning: {w}");
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
        // A single push is a process's first: alloc_* go as 0 (see push::for_push).
        let (pushed, _) = push::for_push(&profile, None);
        let gz = pprof::encode_gz(&pushed)?;
        let client = push::Client::new(push)?;
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
        regions::command_name(&c.info),
        liveness.as_str(),
        c.meta.blocks,
        c.meta.bytes,
        dest.join(", ")
    );
    Ok(())
}

/// Tests only: with `HEAPDUMP_TEST_CONTENTS_PAUSE=FILE`, creates FILE after the snapshot and
/// waits (at most 60 s) until it is removed before reading the contents (`--contents-dir`,
/// and the reference graph's scan), so that a test can free blocks, or end the target, in
/// between.
fn test_pause() {
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

fn shim_path(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = explicit.or_else(|| std::env::var_os("HEAPDUMP_LIB").map(PathBuf::from)) {
        if !p.exists() {
            bail!("shim {} does not exist", p.display());
        }
        return Ok(std::fs::canonicalize(&p)?);
    }
    let exe = std::env::current_exe().context("cannot find the heapdump executable")?;
    let dir = exe
        .parent()
        .context("heapdump executable has no directory")?;
    for cand in [
        dir.join("libheapdump.so"),
        dir.join("../lib/libheapdump.so"),
        dir.join("../libheapdump.so"),
    ] {
        if cand.exists() {
            return Ok(std::fs::canonicalize(cand)?);
        }
    }
    bail!(
        "cannot find libheapdump.so next to {} (build it with `cargo build --release`, or pass --lib)",
        exe.display()
    )
}

fn run(a: RunArgs) -> Result<()> {
    let lib = shim_path(a.lib)?;
    let mut preload = lib.as_os_str().to_owned();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = std::process::Command::new(&a.command[0]);
    cmd.args(&a.command[1..]).env("LD_PRELOAD", preload);
    if a.keep {
        cmd.env("HEAPDUMP_KEEP", "1");
    }
    // Handlers first (a signal that arrives before the child exists is forwarded once it
    // does); caught dispositions are reset to the default in the child by `execve`.
    forward::install();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let (code, what) = forward::exec_failure(&a.command[0], &e);
            eprintln!("heapdump: {}: {what}", a.command[0].to_string_lossy());
            std::process::exit(code);
        }
    };
    forward::set_child(child.id());
    // `wait` retries when interrupted by a forwarded signal.
    let status = child.wait()?;
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        std::process::exit(128 + sig);
    }
    std::process::exit(status.code().unwrap_or(1));
}

/// `heapdump run`'s signal forwarding: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2
/// sent to `heapdump` are sent on to the command, and `heapdump` stays to report its status.
mod forward {
    use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

    /// The signals forwarded to the child.
    pub const SIGNALS: [libc::c_int; 6] = [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ];
    /// The child's pid, 0 before it exists.
    static CHILD: AtomicI32 = AtomicI32::new(0);
    /// Signals received before the child existed (bit = signal number).
    static PENDING: AtomicU64 = AtomicU64::new(0);

    extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // A signal the terminal generated (Ctrl-C, Ctrl-\) went to the whole foreground
        // process group, the child included: sending it again would deliver it twice.
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        if !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL {
            return;
        }
        let pid = CHILD.load(Ordering::SeqCst);
        if pid > 0 {
            // SAFETY: kill is async-signal-safe; pid is our own child (not yet reaped: we
            // reap it only after the last signal could matter).
            unsafe { libc::kill(pid, sig) };
        } else {
            PENDING.fetch_or(1 << sig, Ordering::SeqCst);
        }
    }

    /// Installs the forwarding handler for [`SIGNALS`] (SA_RESTART, SA_SIGINFO).
    pub fn install() {
        for sig in SIGNALS {
            // SAFETY: a zeroed sigaction is valid; the handler only uses async-signal-safe
            // calls and atomics.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = handler as *const () as usize;
                sa.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
    }

    /// Records the child's pid and forwards what arrived before it existed.
    pub fn set_child(pid: u32) {
        CHILD.store(pid as i32, Ordering::SeqCst);
        let pending = PENDING.swap(0, Ordering::SeqCst);
        for sig in SIGNALS {
            if pending & (1 << sig) != 0 {
                // SAFETY: sending a signal to our own child.
                unsafe { libc::kill(pid as i32, sig) };
            }
        }
    }

    /// Exit code and message for a command that could not be started, as shells report
    /// them: 127 when it does not exist, 126 when it exists but cannot be executed.
    pub fn exec_failure(cmd: &std::ffi::OsStr, e: &std::io::Error) -> (i32, String) {
        let has_slash = cmd.as_encoded_bytes().contains(&b'/');
        match e.kind() {
            std::io::ErrorKind::NotFound if has_slash => (127, "No such file or directory".into()),
            std::io::ErrorKind::NotFound => (127, "command not found".into()),
            _ if std::path::Path::new(cmd).is_dir() && has_slash => (126, "Is a directory".into()),
            std::io::ErrorKind::PermissionDenied => (126, "Permission denied".into()),
            _ => (126, e.to_string()),
        }
    }
}

/// A running process's snapshot with its reference graph.
struct Captured {
    c: snapshot::Collected,
    g: graph::Graph,
    stats: graph::scan::ScanStats,
    /// What a re-check of the leak candidates needs (absent with `--stop`: exact already).
    recheck: Option<RecheckInput>,
}

/// The region of a running process, open, and the birth time of each graph block: what
/// `leaks` needs to re-check its candidates ([`graph::recheck`]).
struct RecheckInput {
    opened: regions::Opened,
    path: PathBuf,
    lock_timeout: std::time::Duration,
    /// Birth time (region clock, ns) of each block of the graph, in its order.
    births: Vec<u64>,
}

/// A reference graph to analyse: from a running process, or from a capture file.
struct Analysis {
    /// The live snapshot (absent for a capture file).
    c: Option<snapshot::Collected>,
    g: graph::Graph,
    /// How the scan went (absent for a capture file).
    stats: Option<graph::scan::ScanStats>,
    /// For re-checking leak candidates (a running process read without `--stop`).
    recheck: Option<RecheckInput>,
    /// Function names of every stack id of the graph, innermost first.
    stacks: std::collections::HashMap<u32, Vec<String>>,
    header: graph::capture::CaptureHeader,
}

impl Analysis {
    /// Makes sure `stacks` has the names of the given stack ids (symbolizing them for a live
    /// process; a capture has them all).
    fn name_stacks(&mut self, ids: impl Iterator<Item = u32>) {
        let Some(c) = &self.c else { return };
        let mut missing: Vec<u32> = ids.filter(|s| !self.stacks.contains_key(s)).collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            let names = stack_names(c, missing.into_iter());
            self.stacks.extend(names);
        }
    }

    /// [`Self::name_stacks`] for every stack of the graph.
    fn name_all_stacks(&mut self) {
        let ids: Vec<u32> = self.g.blocks.iter().map(|b| b.stack).collect();
        self.name_stacks(ids.into_iter());
    }

    fn describe(&self) -> String {
        format!(
            "pid {} ({})",
            self.header.pid,
            self.header
                .cmdline
                .first()
                .map(|a| a.rsplit('/').next().unwrap_or(a).to_owned())
                .unwrap_or_default()
        )
    }
}

/// The graph of `t`: a capture file's, or a running process's (snapshotted, scanned and
/// symbolized now).
fn analysis(t: &cli::LiveTarget, stage: &dyn Fn(&str)) -> Result<Analysis> {
    if let Some(file) = &t.file {
        if !graph::capture::is_capture(file) {
            bail!(
                "{}: not a heapdump graph capture (write one with `heapdump graph --by-pid PID -o FILE.hdsnap`)",
                file.display()
            );
        }
        stage(&format!("reading {}", file.display()));
        let cap = graph::capture::read(file)?;
        return Ok(Analysis {
            c: None,
            g: cap.graph,
            stats: None,
            recheck: None,
            stacks: cap.stacks,
            header: cap.header,
        });
    }
    let Captured {
        c,
        g,
        stats,
        recheck,
    } = capture(t, stage)?;
    // Stacks are symbolized on demand (`Analysis::name_stacks`): `leaks` needs only the leaked
    // blocks' ones.
    let stacks = Default::default();
    let header = graph::capture::CaptureHeader {
        writer: format!("heapdump {}", env!("CARGO_PKG_VERSION")),
        pid: c.info.pid,
        cmdline: c.info.cmdline.clone(),
        executable: c.info.exe_path.clone(),
        time_unix_ns: c.time_realtime_ns,
        sample_interval: c.info.sample_interval,
        threads: c
            .threads
            .iter()
            .map(|t| heapdump_proto::hdsnap::Thread {
                tid: t.tid,
                name: t.name.clone(),
            })
            .collect(),
        modules: Vec::new(),
        warnings: c.meta.warnings.clone(),
    };
    Ok(Analysis {
        c: Some(c),
        g,
        stats: Some(stats),
        recheck,
        stacks,
        header,
    })
}

/// Snapshots `target` and builds its reference graph (`leaks`, `retainers`, `graph`).
fn capture(t: &cli::LiveTarget, stage: &dyn Fn(&str)) -> Result<Captured> {
    let (lock_timeout, stop) = (t.lock_timeout, t.stop);
    let target = match (t.by_pid, &t.by_name) {
        (Some(p), _) => Target::Pid(p),
        (_, Some(n)) => Target::Name(n.clone()),
        _ => unreachable!("clap requires a pid or a name here"),
    };
    let (path, file) = pick(&target)?;
    let regions::Usable {
        opened,
        info,
        liveness,
        ..
    } = regions::open_usable(&path, file.as_ref())?;
    if liveness != Liveness::Alive {
        bail!(
            "pid {} {}: a post-mortem region records blocks but not their contents, so \
             the reference graph can only be built for a running process",
            info.pid,
            liveness.gone()
        );
    }
    // --stop: frozen from before the snapshot until the graph is built.
    let stopped = if stop {
        stage(&format!("stopping pid {}", info.pid));
        Some(graph::stop::stop(info.pid)?)
    } else {
        None
    };
    stage(&format!("snapshotting pid {}", info.pid));
    let timeout = std::time::Duration::from_secs_f64(lock_timeout.clamp(0.0, 1e9));
    let mut c = snapshot::collect(&opened, liveness, true, timeout)?;
    test_pause();
    for w in &c.meta.warnings {
        eprintln!("heapdump: warning: {w}");
    }
    // Birth times, by address, for the re-check of leak candidates.
    let mut births: Vec<(u64, u64)> = if stop {
        Vec::new()
    } else {
        c.blocks
            .iter()
            .flatten()
            .map(|b| (b.address, b.t_alloc))
            .collect()
    };
    births.sort_unstable();
    births.dedup_by_key(|b| b.0);
    let blocks: Vec<graph::Block> = c
        .blocks
        .take()
        .unwrap_or_default()
        // By value: collected in place, in the snapshot's own allocation (both lists of 10 M
        // blocks at once were the collector's peak: 530 MiB).
        .into_iter()
        .map(|b| graph::Block {
            address: b.address,
            size: b.size,
            stack: b.stack,
            thread: b.thread,
        })
        .collect();
    let (g, stats) =
        graph::scan::build(info.pid, blocks, &c.modules, &path, stopped.as_ref(), stage)?;
    // The process checked when the region was opened must still be the one read: not gone,
    // not a zombie, its pid not reused by another.
    if regions::proc_start_ticks(info.pid) != Some(info.start_ticks)
        || matches!(regions::proc_state(info.pid), None | Some('Z' | 'X'))
    {
        bail!(
            "pid {} exited during the read: what was read cannot be trusted",
            info.pid
        );
    }
    if let Some(s) = stopped {
        let (threads, seconds) = (s.threads.len(), s.seconds());
        drop(s); // resumes the program
        eprintln!(
            "heapdump: pid {} was stopped for {:.1} ms ({threads} threads)",
            c.info.pid,
            seconds * 1e3
        );
    }
    let recheck = (!stop).then(|| {
        let births = g
            .blocks
            .iter()
            .map(|b| {
                let k = births.partition_point(|x| x.0 < b.address);
                births
                    .get(k)
                    .filter(|x| x.0 == b.address)
                    .map_or(0, |x| x.1)
            })
            .collect();
        RecheckInput {
            opened,
            path: path.clone(),
            lock_timeout: timeout,
            births,
        }
    });
    Ok(Captured {
        c,
        g,
        stats,
        recheck,
    })
}

/// Stage messages on stderr when it is a terminal.
fn stages() -> impl Fn(&str) {
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let started = std::time::Instant::now();
    move |what: &str| {
        if progress {
            eprintln!(
                "heapdump: [{:>6.2} s] {what}",
                started.elapsed().as_secs_f64()
            );
        }
    }
}

/// `heapdump leaks`: snapshot, scan the contents, report the unreachable blocks.
fn leaks(a: LeaksArgs) -> Result<()> {
    use graph::leaks::Status;
    let stage = stages();
    let mut an = analysis(&a.target, &stage)?;
    stage("finding what is reachable");
    let mut status = graph::leaks::classify(&an.g);
    // Read without --stop: the candidates are checked again before they are reported.
    let rechecked = match (&an.recheck, &an.c) {
        (Some(rc), Some(c)) => {
            stage("re-checking the leak candidates");
            let mut snap = || -> Result<Vec<graph::recheck::Born>> {
                let s = snapshot::collect(&rc.opened, Liveness::Alive, true, rc.lock_timeout)?;
                Ok(s.blocks
                    .unwrap_or_default()
                    .into_iter()
                    .map(|b| graph::recheck::Born {
                        block: graph::Block {
                            address: b.address,
                            size: b.size,
                            stack: b.stack,
                            thread: b.thread,
                        },
                        t_alloc: b.t_alloc,
                    })
                    .collect())
            };
            // A target that exits meanwhile cannot be read again: the first read's findings
            // are reported, with a warning (`recheck` changes `status` only when it succeeds).
            let mut checked = status.clone();
            match graph::recheck::recheck(
                c.info.pid,
                &an.g,
                &mut checked,
                &rc.births,
                &mut snap,
                &c.modules,
                &rc.path,
            ) {
                Ok(r) => {
                    status = checked;
                    Some(r)
                }
                Err(e) => {
                    eprintln!(
                        "heapdump: warning: the leak candidates could not be checked again \
                         ({e:#}); reported as the first read found them (a busy program may \
                         show false leaks: run again, or use --stop)"
                    );
                    None
                }
            }
        }
        _ => None,
    };
    let leaked: Vec<u32> =
        an.g.blocks
            .iter()
            .zip(&status)
            .filter(|(_, s)| **s != Status::Reachable)
            .map(|(b, _)| b.stack)
            .collect();
    stage("symbolizing");
    an.name_stacks(leaked.into_iter());
    let g = &an.g;

    // Leak groups: (status, stack) -> (blocks, bytes), largest first.
    let mut groups: std::collections::HashMap<(Status, u32), (u64, u64)> = Default::default();
    let mut inuse: std::collections::HashMap<(u32, u32, u64), (f64, f64)> = Default::default();
    for (b, s) in g.blocks.iter().zip(&status) {
        if *s == Status::Reachable {
            continue;
        }
        let e = groups.entry((*s, b.stack)).or_default();
        e.0 += 1;
        e.1 += b.size;
        let e = inuse.entry((b.stack, b.thread, b.size)).or_default();
        e.0 += 1.0;
        e.1 += b.size as f64;
    }
    let mut groups: Vec<((Status, u32), (u64, u64))> = groups.into_iter().collect();
    groups.sort_by(|x, y| (y.1 .1, y.1 .0, x.0).cmp(&(x.1 .1, x.1 .0, y.0)));
    let names = &an.stacks;
    let (direct, indirect) =
        groups
            .iter()
            .fold((0u64, 0u64), |acc, ((s, _), (_, bytes))| match s {
                Status::Direct => (acc.0 + bytes, acc.1),
                _ => (acc.0, acc.1 + bytes),
            });
    if a.json {
        let v: Vec<serde_json::Value> = groups
            .iter()
            .map(|((s, stack), (blocks, bytes))| {
                serde_json::json!({
                    "kind": s.as_str(),
                    "blocks": blocks,
                    "bytes": bytes,
                    "frames": names.get(stack).cloned().unwrap_or_default(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for ((s, stack), (blocks, bytes)) in &groups {
            let kind = if *s == Status::Direct {
                "Direct"
            } else {
                "Indirect"
            };
            println!("{kind} leak of {bytes} byte(s) in {blocks} object(s) allocated from:");
            match names.get(stack) {
                Some(f) if !f.is_empty() => {
                    for (i, n) in f.iter().enumerate() {
                        println!("    #{i} {n}");
                    }
                }
                _ => println!("    (no stack trace recorded)"),
            }
            println!();
        }
        let count = |k: Status| {
            groups
                .iter()
                .filter(|g| g.0 .0 == k)
                .map(|g| g.1 .0)
                .sum::<u64>()
        };
        let scan = match &an.stats {
            Some(st) => {
                format!(
                    "; scanned {} bytes of blocks and {} bytes of {} roots in {:.2} s{}",
                    st.bytes_read,
                    st.root_bytes,
                    g.roots.len(),
                    st.seconds,
                    if st.vanished > 0 {
                        format!("; {} blocks freed meanwhile could not be read", st.vanished)
                    } else {
                        String::new()
                    },
                ) + &match &rechecked {
                    Some(r) if r.candidates > 0 => format!(
                        "; re-checked {} candidates in {:.2} s: {} referenced, {} freed since",
                        r.candidates, r.seconds, r.referenced, r.freed
                    ),
                    _ => String::new(),
                }
            }
            None => format!("; from a capture of {}", an.describe()),
        };
        println!(
            "SUMMARY: heapdump: {} byte(s) leaked in {} allocation(s) ({} direct bytes, {} indirect) \
             of {} live blocks{scan}",
            direct + indirect,
            count(Status::Direct) + count(Status::Indirect),
            direct,
            indirect,
            g.blocks.len(),
        );
    }
    if let Some(out) = &a.output {
        let profile = match an.c {
            Some(mut c) => {
                c.inuse = inuse;
                c.alloc_totals.clear();
                pprof::build(
                    &c,
                    pprof::Options {
                        with_tags: false,
                        symbolize: true,
                    },
                )
                .0
            }
            None => {
                let mut by_stack: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
                for ((stack, _, _), (blocks, bytes)) in &inuse {
                    let e = by_stack.entry(*stack).or_default();
                    e.0 += *blocks as u64;
                    e.1 += *bytes as u64;
                }
                pprof::from_names(
                    &an.stacks,
                    by_stack.into_iter().map(|(s, (b, n))| (s, b, n)),
                    &[format!(
                        "leaked blocks of {}, from a heapdump graph capture",
                        an.describe()
                    )],
                )
            }
        };
        pprof::write(&profile, None, out)?;
    }
    Ok(())
}

/// Function names of the given stacks, innermost first, the shim's own frames left out (as in
/// the profiles).
fn stack_names(
    c: &snapshot::Collected,
    stacks: impl Iterator<Item = u32>,
) -> std::collections::HashMap<u32, Vec<String>> {
    let stacks: Vec<u32> = stacks.collect();
    let mut addrs: Vec<u64> = stacks
        .iter()
        .filter_map(|s| c.stacks.get(s))
        .flatten()
        .map(|pc| pc.wrapping_sub(1))
        .collect();
    addrs.sort_unstable();
    addrs.dedup();
    let resolved = python::resolve(&c.modules, &c.jit, &c.python, &addrs, true);
    let mut out = std::collections::HashMap::new();
    for s in stacks {
        let Some(frames) = c.stacks.get(&s) else {
            continue;
        };
        let mut names = Vec::new();
        let mut leaf = true;
        for pc in frames {
            let a = pc.wrapping_sub(1);
            let Some(r) = resolved.get(&a) else {
                names.push(format!("{a:#x}"));
                leaf = false;
                continue;
            };
            if leaf && pprof::is_shim_frame(r, &c.modules) {
                continue;
            }
            leaf = false;
            if r.frames.is_empty() {
                let m = r
                    .module
                    .map(|m| c.modules[m].path.rsplit('/').next().unwrap_or(""));
                names.push(format!("{a:#x} ({})", m.unwrap_or("?")));
            }
            names.extend(r.frames.iter().map(|f| f.function.clone()));
        }
        out.insert(s, names);
    }
    out
}

/// The allocation site of each block's stack: its first frame outside the allocator wrappers
/// ([`sites::Sites`]).
fn sites(an: &Analysis) -> std::collections::HashMap<u32, String> {
    let rule = sites::Sites::default();
    an.stacks
        .iter()
        .map(|(s, names)| (*s, rule.site(names).to_owned()))
        .collect()
}

/// The names along a chain: the root's, then each block's allocation site.
fn chain_names(
    g: &graph::Graph,
    sites: &std::collections::HashMap<u32, String>,
    chain: &[graph::paths::Step],
) -> Vec<String> {
    use graph::paths::Step;
    chain
        .iter()
        .map(|s| match *s {
            Step::Root(r) => g.roots[r].name.clone(),
            Step::Block(b) => {
                let st = g.blocks[b as usize].stack;
                sites
                    .get(&st)
                    .cloned()
                    .unwrap_or_else(|| "(no stack trace)".to_owned())
            }
        })
        .collect()
}

/// `heapdump retainers`.
fn retainers(a: RetainersArgs) -> Result<()> {
    let re = regex::Regex::new(&a.function)
        .with_context(|| format!("--function {:?} is not a regular expression", a.function))?;
    let stage = stages();
    let mut an = analysis(&a.target, &stage)?;
    an.name_all_stacks();
    let g = &an.g;
    stage("finding the shortest chains from the roots");
    let tree = graph::paths::Tree::new(g);
    let names = &an.stacks;
    let sites = sites(&an);
    let matching: std::collections::HashSet<u32> = names
        .iter()
        .filter(|(_, f)| f.iter().any(|n| re.is_match(n)))
        .map(|(s, _)| *s)
        .collect();
    if matching.is_empty() {
        bail!(
            "no live block was allocated under a function matching {:?}",
            a.function
        );
    }
    let mut chains: std::collections::HashMap<Vec<String>, (u64, u64)> = Default::default();
    let (mut unreachable, mut unreachable_bytes) = (0u64, 0u64);
    for (i, b) in g.blocks.iter().enumerate() {
        if !matching.contains(&b.stack) {
            continue;
        }
        match tree.chain(i as u32) {
            Some(ch) => {
                let e = chains.entry(chain_names(g, &sites, &ch)).or_default();
                e.0 += 1;
                e.1 += b.size;
            }
            None => {
                unreachable += 1;
                unreachable_bytes += b.size;
            }
        }
    }
    let mut chains: Vec<(Vec<String>, (u64, u64))> = chains.into_iter().collect();
    chains.sort_by(|x, y| (y.1 .1, y.1 .0, &x.0).cmp(&(x.1 .1, x.1 .0, &y.0)));
    if a.json {
        let v: Vec<serde_json::Value> = chains
            .iter()
            .take(a.top)
            .map(|(path, (blocks, bytes))| {
                serde_json::json!({"chain": path, "blocks": blocks, "bytes": bytes})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for (path, (blocks, bytes)) in chains.iter().take(a.top) {
        println!("{} → {bytes} bytes in {blocks} blocks", path.join(" → "));
    }
    if chains.len() > a.top {
        println!("({} more chains)", chains.len() - a.top);
    }
    if unreachable > 0 {
        println!(
            "(unreachable from any root, leaked: {unreachable_bytes} bytes in {unreachable} blocks)"
        );
    }
    Ok(())
}

/// `heapdump graph -o FILE.{svg,heapsnapshot,hdsnap,pb.gz}` (and `convert`).
fn graph_cmd(a: GraphArgs) -> Result<()> {
    let kind = check_output_kind(&a.output)?;
    let since = match &a.since {
        Some(_) if kind != "svg" => bail!("--since applies to the flame graph (-o FILE.svg)"),
        Some(base) => {
            let cap = graph::capture::read(base)
                .with_context(|| format!("reading the baseline {}", base.display()))?;
            let mut old: Vec<u64> = cap.graph.blocks.iter().map(|b| b.address).collect();
            old.sort_unstable();
            Some(old)
        }
        None => None,
    };
    let stage = stages();
    let mut an = analysis(&a.target, &stage)?;
    an.name_all_stacks();
    write_graph_since(&an, &a.output, since.as_deref(), &stage)
}

/// What `graph` and `convert` can write, by the output's name.
fn check_output_kind(out: &std::path::Path) -> Result<&'static str> {
    let name = out.to_string_lossy();
    for kind in ["svg", "heapsnapshot", "hdsnap", "pb.gz"] {
        if name.ends_with(&format!(".{kind}")) {
            return Ok(kind);
        }
    }
    bail!(
        "{}: the output's name says what to write: FILE.svg (an ownership flame graph), \
         FILE.heapsnapshot (Chrome DevTools: Memory panel, Load profile), FILE.hdsnap (a capture \
         to analyse later) or FILE.pb.gz (pprof)",
        out.display()
    )
}

/// Writes `an` to `out` as its name says.
fn write_graph(an: &Analysis, out: &std::path::Path, stage: &dyn Fn(&str)) -> Result<()> {
    write_graph_since(an, out, None, stage)
}

/// As [`write_graph`]; a flame graph counts only blocks whose address is not in `since`
/// (sorted addresses of a baseline), if given.
fn write_graph_since(
    an: &Analysis,
    out: &std::path::Path,
    since: Option<&[u64]>,
    stage: &dyn Fn(&str),
) -> Result<()> {
    let kind = check_output_kind(out)?;
    let g = &an.g;
    let sites = sites(an);
    let site_of = |b: &graph::Block| {
        sites
            .get(&b.stack)
            .cloned()
            .unwrap_or_else(|| "(no stack trace)".to_owned())
    };
    match kind {
        "heapsnapshot" => {
            stage("writing the DevTools heap snapshot");
            let mut layout = None;
            pprof::write_with(out, |o| {
                layout = Some(graph::heapsnapshot::write(g, &site_of, o)?);
                Ok(())
            })?;
            let layout = layout.expect("written");
            eprintln!(
                "heapdump: {}: {} nodes, {} edges ({} live blocks, {} roots) -> {}",
                an.describe(),
                layout.node_count,
                layout.edge_count,
                g.blocks.len(),
                g.roots.len(),
                out.display()
            );
        }
        "hdsnap" => {
            stage("writing the capture");
            pprof::write_with(out, |o| graph::capture::write(o, &an.header, g, &an.stacks))?;
            eprintln!(
                "heapdump: {}: {} live blocks, {} edges, {} roots -> {}",
                an.describe(),
                g.blocks.len(),
                g.targets.len(),
                g.roots.len(),
                out.display()
            );
        }
        "pb.gz" => {
            let mut by_stack: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
            for b in &g.blocks {
                let e = by_stack.entry(b.stack).or_default();
                e.0 += 1;
                e.1 += b.size;
            }
            let p = pprof::from_names(
                &an.stacks,
                by_stack.into_iter().map(|(s, (b, n))| (s, b, n)),
                &[format!(
                    "live blocks of {}, from a heapdump graph",
                    an.describe()
                )],
            );
            pprof::write(&p, None, out)?;
        }
        _ => {
            stage("finding the shortest chains from the roots");
            let tree = graph::paths::Tree::new(g);
            // Collapsed stacks, one per chain: root, then the sites along it.
            let mut folded = flame::Folded::new();
            for (i, b) in g.blocks.iter().enumerate() {
                if since.is_some_and(|old| old.binary_search(&b.address).is_ok()) {
                    continue;
                }
                let names = match tree.chain(i as u32) {
                    Some(ch) => chain_names(g, &sites, &ch),
                    None => vec!["(unreachable: leaked)".to_owned(), site_of(b)],
                };
                *folded
                    .entry(flame::key(names.iter().map(String::as_str)))
                    .or_default() += b.size.max(1);
            }
            let title = match since {
                Some(_) => format!(
                    "Ownership: who holds what is new in the heap of {}",
                    an.describe()
                ),
                None => format!("Ownership: who holds the live heap of {}", an.describe()),
            };
            flame::write_svg(&folded, &title, "bytes", out)?;
            eprintln!(
                "heapdump: {}: {} live blocks, {} roots -> {}",
                an.describe(),
                g.blocks.len(),
                g.roots.len(),
                out.display()
            );
        }
    }
    Ok(())
}

/// `heapdump convert INPUT -o OUT`: a capture, or a gzip pprof profile (told by content).
fn convert(a: cli::ConvertArgs) -> Result<()> {
    if !graph::capture::is_capture(&a.capture) {
        if pprof::is_gzip(&a.capture) {
            return convert_profile(&a);
        }
        std::fs::File::open(&a.capture)
            .with_context(|| format!("cannot open {}", a.capture.display()))?;
        bail!(
            "{}: neither a graph capture (written by `heapdump graph --by-pid PID -o \
             FILE.hdsnap`) nor a gzip-compressed pprof profile (written by `heapdump snapshot`)",
            a.capture.display()
        );
    }
    if a.sample_index.is_some() {
        bail!("--sample-index applies to a pprof profile; a capture's flame graph shows bytes");
    }
    check_output_kind(&a.output)?;
    let stage = stages();
    let t = cli::LiveTarget {
        by_pid: None,
        by_name: None,
        file: Some(a.capture.clone()),
        stop: false,
        lock_timeout: 0.0,
    };
    let an = analysis(&t, &stage)?;
    write_graph(&an, &a.output, &stage)
}

/// `heapdump convert PROFILE.pb.gz -o OUT.{svg,pb.gz}`: a flame graph of a saved profile.
fn convert_profile(a: &cli::ConvertArgs) -> Result<()> {
    let name = a.output.to_string_lossy();
    let format = if name.ends_with(".svg") {
        pprof::Format::Svg
    } else if name.ends_with(".pb.gz") || a.output.as_os_str() == "-" {
        pprof::Format::Pprof
    } else {
        bail!(
            "{}: from a pprof profile, convert writes FILE.svg (a flame graph) or FILE.pb.gz; \
             the reference graph (.heapsnapshot, .hdsnap) needs a capture \
             (`heapdump graph --by-pid PID -o FILE.hdsnap`)",
            a.output.display()
        )
    };
    let mut p = pprof::read(&a.capture)?;
    let what = a
        .capture
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    pprof::write_as(
        &mut p,
        &[],
        &a.output,
        format,
        a.sample_index.map(cli::SampleIndex::as_str),
        &what,
    )?;
    eprintln!(
        "heapdump: {}: {} samples -> {}",
        a.capture.display(),
        p.sample.len(),
        a.output.display()
    );
    Ok(())
}

/// `heapdump top --retained`: the blocks and the allocation sites that retain the most.
fn top(a: TopArgs) -> Result<()> {
    use graph::dominators::Dominator;
    if a.live {
        return live::run(&a);
    }
    if !a.retained {
        bail!("`heapdump top` ranks by retained size: pass --retained (or --live)");
    }
    let stage = stages();
    let mut an = analysis(&a.target, &stage)?;
    an.name_all_stacks();
    let g = &an.g;
    stage("computing the dominator tree");
    let d = graph::dominators::dominators(g);
    stage("ranking");
    let sites = sites(&an);
    let site_of = |b: u32| {
        sites
            .get(&g.blocks[b as usize].stack)
            .cloned()
            .unwrap_or_else(|| "(no stack trace)".to_owned())
    };
    // A site's retained size counts each dominated block once: the sum over its blocks that
    // no other block of the same site dominates. Found by walking the dominator tree from the
    // top with a count, per site, of the blocks of that site on the current path.
    let n = g.blocks.len();
    // Children lists of the dominator tree in CSR form (a vector per block cost 24 bytes per
    // block and an allocation per parent).
    let parent_of = |b: u32| match d.dominator(b) {
        Dominator::Block(p) => Some(p),
        _ => None,
    };
    let mut child_start = vec![0u32; n + 1];
    for b in 0..n as u32 {
        if let Some(p) = parent_of(b) {
            child_start[p as usize + 1] += 1;
        }
    }
    for i in 0..n {
        child_start[i + 1] += child_start[i];
    }
    let mut fill = child_start.clone();
    let mut children = vec![0u32; child_start[n] as usize];
    let mut tops: Vec<u32> = Vec::new();
    for b in 0..n as u32 {
        match parent_of(b) {
            Some(p) => {
                children[fill[p as usize] as usize] = b;
                fill[p as usize] += 1;
            }
            None => tops.push(b),
        }
    }
    drop(fill);
    // Sites by name (several stack traces can end in the same function): named once per
    // stack id, not once per block.
    let mut site_names: Vec<String> = Vec::new();
    let site_ids: Vec<u32> = {
        let mut by_name: std::collections::HashMap<String, u32> = Default::default();
        let mut by_stack: rustc_hash::FxHashMap<u32, u32> = Default::default();
        (0..n as u32)
            .map(|b| {
                *by_stack
                    .entry(g.blocks[b as usize].stack)
                    .or_insert_with(|| {
                        let name = site_of(b);
                        let k = by_name.len() as u32;
                        *by_name.entry(name.clone()).or_insert_with(|| {
                            site_names.push(name);
                            k
                        })
                    })
            })
            .collect()
    };
    let mut on_path = vec![0u32; site_names.len().max(1)];
    // Per site: (retained bytes, blocks).
    let mut site_retained = vec![(0u64, 0u64); site_names.len()];
    // (block, entering?) pairs: an explicit stack, the tree can be millions deep.
    let mut stack: Vec<(u32, bool)> = tops.iter().rev().map(|&b| (b, true)).collect();
    while let Some((b, enter)) = stack.pop() {
        let s = site_ids[b as usize] as usize;
        if !enter {
            on_path[s] -= 1;
            continue;
        }
        let e = &mut site_retained[s];
        e.1 += 1;
        if on_path[s] == 0 {
            e.0 += d.retained[b as usize];
        }
        on_path[s] += 1;
        stack.push((b, false));
        let (c0, c1) = (child_start[b as usize], child_start[b as usize + 1]);
        stack.extend(
            children[c0 as usize..c1 as usize]
                .iter()
                .map(|&c| (c, true)),
        );
    }
    drop((children, child_start, site_ids, on_path));
    let mut by_site: Vec<(String, u64, u64)> = site_retained
        .iter()
        .enumerate()
        .filter(|(_, (_, blocks))| *blocks > 0)
        .map(|(s, (ret, blocks))| (site_names[s].clone(), *ret, *blocks))
        .collect();
    by_site.sort_by(|x, y| (y.1, &x.0).cmp(&(x.1, &y.0)));
    // The `a.top` blocks retaining the most: selected, then only those sorted.
    let key = |b: &u32| (std::cmp::Reverse(d.retained[*b as usize]), *b);
    let mut blocks: Vec<u32> = (0..n as u32).collect();
    if blocks.len() > a.top {
        if a.top > 0 {
            blocks.select_nth_unstable_by_key(a.top - 1, key);
        }
        blocks.truncate(a.top);
    }
    blocks.sort_by_key(key);
    let mut roots: Vec<(usize, u64)> = d.root_retained.iter().copied().enumerate().collect();
    roots.sort_by_key(|&(r, v)| (std::cmp::Reverse(v), r));
    if a.json {
        let v = serde_json::json!({
            "sites": by_site.iter().take(a.top).map(|(s, r, b)| serde_json::json!({"site": s, "retained": r, "blocks": b})).collect::<Vec<_>>(),
            "blocks": blocks.iter().take(a.top).map(|&b| {
                let bl = &g.blocks[b as usize];
                serde_json::json!({"address": format!("{:#x}", bl.address), "size": bl.size, "retained": d.retained[b as usize], "site": site_of(b)})
            }).collect::<Vec<_>>(),
            "roots": roots.iter().take(a.top).map(|&(r, v)| serde_json::json!({"root": g.roots[r].name, "retained": v})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:>14}  {:>10}  allocation site (retained: each dominated block counted once)",
        "RETAINED", "BLOCKS"
    );
    for (s, r, b) in by_site.iter().take(a.top) {
        println!("{r:>14}  {b:>10}  {s}");
    }
    println!();
    println!(
        "{:>14}  {:>10}  {:<18}  allocation site",
        "RETAINED", "SIZE", "BLOCK"
    );
    for &b in blocks.iter().take(a.top) {
        let bl = &g.blocks[b as usize];
        println!(
            "{:>14}  {:>10}  {:<18}  {}",
            d.retained[b as usize],
            bl.size,
            format!("{:#x}", bl.address),
            site_of(b)
        );
    }
    println!();
    println!("{:>14}  root", "RETAINED");
    for &(r, v) in roots.iter().take(a.top) {
        println!("{v:>14}  {}", g.roots[r].name);
    }
    Ok(())
}

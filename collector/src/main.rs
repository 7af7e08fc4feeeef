//! `heapdump`: the collector.
//!
//! Modules: [`cli`] (argument parsing), [`commands`] (one module per command), [`analysis`]
//! (the reference graph a command reads), [`regions`] (finding, picking and opening region
//! files safely), [`snapshot`] (reading one instant of a region), [`symbolize`] (blazesym),
//! [`pprof`] (profile building, merging and writing), [`multi`] (several processes into one
//! profile), [`flame`] (SVG flame graphs), [`contents`] (block contents: `--contents-dir`,
//! `--with-strings`), [`push`] (sending profiles to Pyroscope or Parca: the clients, the
//! queue, the spool of unsent profiles), [`output`] (writing files atomically).

mod analysis;
mod attach;
mod cli;
mod commands;
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
mod output;
mod perfmap;
mod pprof;
mod priority;
mod push;
mod python;
mod regions;
mod report;
mod signals;
mod sites;
mod snapshot;
mod symbolize;

use clap::Parser;
use cli::{Cli, Command, SnapshotProps};

/// Large blocks on transparent huge pages (see `hugealloc`).
#[global_allocator]
static ALLOC: hugealloc::HugeAlloc = hugealloc::HugeAlloc;

fn main() {
    // Die quietly of SIGPIPE like other command-line tools (`heapdump list | head`), instead of
    // Rust's default of ignoring it and panicking on the failed write.
    // SAFETY: the default action runs no handler code.
    let _ = unsafe { signals::set(libc::SIGPIPE, signals::Handler::Default, 0) };
    let cli = Cli::parse();
    let r = match cli.command {
        Command::List(a) => commands::list::run(a.into()),
        Command::Snapshot(a) => {
            // The whole one-shot snapshot runs raised where allowed (see `priority`).
            let _boost = priority::Boost::raise();
            SnapshotProps::try_from(a).and_then(commands::snapshot::run)
        }
        Command::Run(a) => commands::run::run(a.into()),
        Command::Gc(a) => commands::gc::run(a.into()),
        Command::Watch(a) => cli::WatchProps::try_from(a).and_then(|w| commands::watch::watch(&w)),
        Command::Report(a) => report::ReportProps::try_from(a).and_then(report::run),
        Command::Leaks(a) => commands::leaks::run(a.into()),
        Command::Retainers(a) => commands::retainers::run(a.into()),
        Command::Graph(a) => commands::graph::run(a.into()),
        Command::Top(a) if a.live => live::run(&a),
        Command::Top(a) => commands::top::run(a.into()),
        Command::Convert(a) => commands::convert::run(a.into()),
        Command::Attach(a) => attach::attach(&a),
        Command::Detach(a) => attach::detach(&a),
    };
    if let Err(e) = r {
        // Errors embed text others chose (file names, a target's answers, a server's body):
        // control characters escaped, so none reaches the terminal raw (line breaks kept: some
        // errors list candidates a line each, their names escaped where they are built).
        eprintln!("heapdump: {}", regions::shown_lines(&format!("{e:#}")));
        std::process::exit(1);
    }
    if snapshot::DAMAGED.load(std::sync::atomic::Ordering::Relaxed) {
        // The output was written, but from a region that cannot be true (said on stderr and
        // in the profile's comments).
        std::process::exit(snapshot::EXIT_DAMAGED);
    }
}

//! Command-line parsing (clap derive), converted into plain structs the commands take.

use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

/// heapdump: a heap profiler for Linux. Records every live allocation of a program into shared
/// memory (via LD_PRELOAD or a Rust #[global_allocator]) and snapshots it, from outside and
/// without stopping the program, into a symbolized pprof profile.
#[derive(Debug, Parser)]
#[command(name = "heapdump", version, propagate_version = true)]
#[command(
    after_help = "Examples:\n  heapdump run -- ./server --port 8080\n  heapdump list\n  heapdump snapshot --by-pid 1234 -o s.pb.gz\n  go tool pprof -http=: s.pb.gz\n\nRegions live in $HEAPDUMP_DIR (default /dev/shm/heapdump-UID)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List instrumented processes (running and exited) whose regions exist.
    List(ListArgs),
    /// Snapshot the live allocations of a process into a gzip-compressed pprof profile.
    Snapshot(SnapshotArgs),
    /// Run a command with the heapdump shim preloaded; exits with the command's status.
    Run(RunArgs),
    /// Find the live blocks of a running process that no pointer chain from a root reaches
    /// (leaks), by scanning the blocks' contents, as LeakSanitizer does, without stopping it.
    Leaks(LeaksArgs),
    /// Show who keeps blocks alive: the shortest chains of references from a root to the
    /// blocks allocated under a function, aggregated and ranked by bytes.
    Retainers(RetainersArgs),
    /// Write the reference graph of a running process: an ownership flame graph (`.svg`:
    /// from each root through the allocation sites of the blocks that hold the rest; width =
    /// bytes) or a Chrome DevTools heap snapshot (`.heapsnapshot`, Memory panel > Load).
    Graph(GraphArgs),
    /// Rank what keeps the most memory alive: allocation sites, blocks and roots by retained
    /// size (the bytes that would be freed if they let go: the dominator tree of the reference
    /// graph).
    Top(TopArgs),
    /// Convert a graph capture (`.hdsnap`) into a flame graph (`.svg`), a DevTools heap
    /// snapshot (`.heapsnapshot`) or a pprof profile of its live blocks (`.pb.gz`).
    Convert(ConvertArgs),
    /// Remove the regions of processes that are gone (crashed, killed, or kept with
    /// HEAPDUMP_KEEP=1), and files in the region directory that are not readable regions.
    Gc(GcArgs),
}

/// A running process to build the reference graph of (and how), or a capture of one.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["by_pid", "by_name", "file"])))]
pub struct LiveTarget {
    /// A graph capture written by `heapdump graph -o FILE.hdsnap`, instead of a running process.
    #[arg(value_name = "CAPTURE")]
    pub file: Option<PathBuf>,
    /// Process id of the target.
    #[arg(long, value_name = "PID")]
    pub by_pid: Option<u32>,
    /// Command name of the target; must be unique.
    #[arg(long, value_name = "NAME")]
    pub by_name: Option<String>,
    /// Freeze the program while its memory is read (ptrace), so that no pointer moves
    /// meanwhile and its threads' registers count as roots: the report is exact. The program
    /// is resumed afterwards, even if heapdump is killed.
    #[arg(long)]
    pub stop: bool,
    /// Longest wait, in seconds, for another snapshot of the same region to finish.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub lock_timeout: f64,
}

/// `heapdump leaks`.
#[derive(Debug, Args)]
#[command(
    after_help = "A block is reachable when a chain of pointers leads to it from a root: a \
writable segment of a loaded module (globals), a thread's stack, a mapping the program manages \
itself. The others are leaked: \"direct\" when no other leaked block points to them, \"indirect\" \
when only leaked blocks do (LeakSanitizer's terms). Reading another process's memory needs the \
right to ptrace it (same user with ptrace_scope 0, or root). The program keeps running: a pointer \
moved while the scan runs can make a reachable block look leaked: run it twice, or use --stop."
)]
pub struct LeaksArgs {
    /// Which running process, and how.
    #[command(flatten)]
    pub target: LiveTarget,
    /// Print one JSON object per leak group instead of a report.
    #[arg(long)]
    pub json: bool,
    /// Also write the leaked blocks as a gzip-compressed pprof profile (`-` for stdout).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// `heapdump retainers`.
#[derive(Debug, Args)]
pub struct RetainersArgs {
    /// Which running process, and how.
    #[command(flatten)]
    pub target: LiveTarget,
    /// Blocks allocated under a frame whose function matches this regular expression.
    #[arg(long, value_name = "REGEX")]
    pub function: String,
    /// Print one JSON object per chain.
    #[arg(long)]
    pub json: bool,
    /// Chains to show, largest first.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub top: usize,
}

/// `heapdump top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Rank by retained size (required: the only ranking so far).
    #[arg(long)]
    pub retained: bool,
    /// Which running process, and how.
    #[command(flatten)]
    pub target: LiveTarget,
    /// Print JSON (`sites`, `blocks`, `roots`).
    #[arg(long)]
    pub json: bool,
    /// Rows per table.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub top: usize,
}

/// `heapdump graph`.
#[derive(Debug, Args)]
pub struct GraphArgs {
    /// Which running process, and how.
    #[command(flatten)]
    pub target: LiveTarget,
    /// Output: `FILE.svg` (ownership flame graph), `FILE.heapsnapshot` (Chrome DevTools),
    /// `FILE.hdsnap` (a capture: leaks, retainers, top and convert read it later) or
    /// `FILE.pb.gz` (pprof of the live blocks).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Only blocks that are new since this earlier capture (`FILE.hdsnap`) are counted in the
    /// flame graph (`.svg`): "what is new, and who holds it". A block is new if no block of the
    /// capture had its address.
    #[arg(long, value_name = "CAPTURE")]
    pub since: Option<PathBuf>,
}

/// `heapdump convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The capture, written by `heapdump graph -o FILE.hdsnap`.
    #[arg(value_name = "CAPTURE")]
    pub capture: PathBuf,
    /// Output: FILE.svg, FILE.heapsnapshot, FILE.hdsnap or FILE.pb.gz.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
}

/// `heapdump gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Only print what would be removed.
    #[arg(long)]
    pub dry_run: bool,
}

/// `heapdump list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print JSON (one array of objects) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `heapdump snapshot`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["by_pid", "by_name", "region"])))]
pub struct SnapshotArgs {
    /// Process id of the target (its current image's region).
    #[arg(long, value_name = "PID")]
    pub by_pid: Option<u32>,
    /// Command name of the target (argv[0]'s or the executable's file name); must be unique.
    #[arg(long, value_name = "NAME")]
    pub by_name: Option<String>,
    /// Read this region file directly.
    #[arg(long, value_name = "FILE")]
    pub region: Option<PathBuf>,
    /// Output file (gzip-compressed pprof).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// One sample per live block, labelled address, bytes, timestamp (ns since the epoch, tick
    /// resolution) and thread.
    #[arg(long)]
    pub with_tags: bool,
    /// Do not symbolize (pprof can still symbolize from the mappings' files and build IDs).
    #[arg(long)]
    pub no_symbolize: bool,
    /// Longest wait, in seconds, for another snapshot of the same region to finish (only one
    /// runs at a time); then fail, naming the process that holds the region's lock.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub lock_timeout: f64,
}

/// `heapdump run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Keep the region after a clean exit (HEAPDUMP_KEEP=1), to snapshot what was still live.
    #[arg(long)]
    pub keep: bool,
    /// The shim to preload (default: libheapdump.so next to this executable, or $HEAPDUMP_LIB).
    #[arg(long, value_name = "FILE")]
    pub lib: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// How to pick the region to snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// By process id.
    Pid(u32),
    /// By command name.
    Name(String),
    /// A region file.
    File(PathBuf),
}

/// What `heapdump snapshot` does.
#[derive(Debug, Clone)]
pub struct SnapshotProps {
    /// Which region.
    pub target: Target,
    /// Output path.
    pub output: PathBuf,
    /// Per-block samples.
    pub with_tags: bool,
    /// Symbolize in the collector.
    pub symbolize: bool,
    /// Longest wait for another collector's lock on the region.
    pub lock_timeout: std::time::Duration,
}

impl From<SnapshotArgs> for SnapshotProps {
    fn from(a: SnapshotArgs) -> Self {
        let target = match (a.by_pid, a.by_name, a.region) {
            (Some(p), _, _) => Target::Pid(p),
            (_, Some(n), _) => Target::Name(n),
            (_, _, Some(f)) => Target::File(f),
            _ => unreachable!("clap requires one target"),
        };
        SnapshotProps {
            target,
            output: a.output,
            with_tags: a.with_tags,
            symbolize: !a.no_symbolize,
            lock_timeout: std::time::Duration::from_secs_f64(a.lock_timeout.clamp(0.0, 1e9)),
        }
    }
}

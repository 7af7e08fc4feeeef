//! Command-line parsing (clap derive), converted into plain structs the commands take.

use anyhow::bail;
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::push::{PushFormat, PushProps};
pub use crate::regions::{Selection, Target};

/// heapdump: a heap profiler for Linux. Records every live allocation of a program into shared
/// memory (via LD_PRELOAD or a Rust #[global_allocator]) and snapshots it, from outside and
/// without stopping the program, into a symbolized pprof profile.
#[derive(Debug, Parser)]
#[command(name = "heapdump", version, propagate_version = true)]
#[command(
    after_help = "Examples:\n  heapdump run -- ./server --port 8080\n  heapdump list\n  heapdump snapshot --by-pid 1234 -o s.pb.gz\n  go tool pprof -http=: s.pb.gz\n  heapdump snapshot --by-pid 1234 -o s.svg          # flame graph, no Go needed\n\nRegions live in $HEAPDUMP_DIR (default /dev/shm/heapdump-UID).\n\nExit status: 0 done; 1 error (nothing written); 3 output written, but the region was damaged: records that cannot be true (outside the address space, larger than the process's memory, overlapping another block) were skipped, as stderr and the profile's comments say. `heapdump run` exits with its command's status."
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
    /// Snapshot the live allocations of a process (or of several: --multi-process) into a
    /// gzip-compressed pprof profile, or an SVG flame graph (-o FILE.svg).
    Snapshot(SnapshotArgs),
    /// Run a command with the heapdump shim preloaded; exits with the command's status.
    Run(RunArgs),
    /// Find the live blocks of a running process that no pointer chain from a root reaches
    /// (leaks), by scanning the blocks' contents, as LeakSanitizer does, without stopping it
    /// (but for a moment, to read the registers of threads blocked in calls a stop does not
    /// disturb, when candidates are left; --stop freezes it for the whole scan).
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
    /// graph). With --live: a live terminal view of the live heap by allocation site.
    Top(TopArgs),
    /// Convert a graph capture (`.hdsnap`) into a flame graph (`.svg`), a DevTools heap
    /// snapshot (`.heapsnapshot`) or a pprof profile of its live blocks (`.pb.gz`); or a pprof
    /// profile (`.pb.gz`) into a flame graph (`.svg`).
    Convert(ConvertArgs),
    /// Snapshot processes every interval (aligned to it) into DIR/NAME-PID-TIME.pb.gz and/or
    /// push each profile to a profiling server (Grafana Pyroscope or Parca), until stopped
    /// (SIGINT, SIGTERM) or --count snapshots.
    Watch(WatchArgs),
    /// Write one self-contained HTML report of a process's heap over time (summary, timeline
    /// stacked by allocation site, growth ranking, flame graphs) from `watch` profiles.
    Report(ReportArgs),
    /// Remove the regions of processes that are gone (crashed, killed, or kept with
    /// HEAPDUMP_KEEP=1), regions set aside for an exec that succeeded into a program without
    /// the shim, and files in the region directory that are not readable regions.
    Gc(GcArgs),
    /// Load the shim into a running process (x86-64 Linux, dynamically linked, glibc) and
    /// start recording, with the blocks already live recorded too (stack: "live before
    /// attach"). Needs ptrace rights over the process (see the README's "Attach").
    Attach(AttachCmd),
    /// Stop recording in a process `heapdump attach` attached to: the program runs on, its
    /// region stays readable as the heap at the detach.
    Detach(AttachCmd),
}

/// `heapdump attach` / `heapdump detach`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["by_pid", "by_name"])))]
pub struct AttachCmd {
    /// Process id of the target.
    #[arg(long, value_name = "PID")]
    pub by_pid: Option<u32>,
    /// Command name of the target (/proc/PID/comm); must be unique.
    #[arg(long, value_name = "NAME")]
    pub by_name: Option<String>,
    /// The shim to load (default: libheapdump.so next to this executable, or $HEAPDUMP_LIB).
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
    /// Longest wait, in seconds, for a moment when no thread is inside the allocator or the
    /// loader (then nothing is changed and heapdump exits with an error).
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub timeout: f64,
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
    /// Frames whose function name matches this regular expression (whole name) are dropped
    /// from the top of each stack, as pprof's --drop_frames does: an allocation site is named
    /// by the first frame left, after the known allocator wrappers (malloc, operator new,
    /// _PyObject_Malloc, g_malloc, ...).
    #[arg(long, value_name = "REGEX")]
    pub drop_frames: Option<String>,
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
    /// Rank by retained size (required, unless --live).
    #[arg(long)]
    pub retained: bool,
    /// A live terminal view instead, like `top` for the heap: total live bytes with a
    /// sparkline, allocation sites by live bytes with their change since start and over the
    /// last interval, refreshed every --every; keys l/s/i/b sort, q quits.
    #[arg(long, conflicts_with_all = ["retained", "json", "file", "stop"])]
    pub live: bool,
    /// With --live: time between refreshes (at least 100ms; default 1s).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, requires = "live", conflicts_with = "retained")]
    pub every: Option<Duration>,
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
    /// capture had its address. (Its former name, `since`, is still taken.)
    #[arg(long, value_name = "CAPTURE", alias = "since")]
    pub baseline: Option<PathBuf>,
}

/// `heapdump convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The input, told by its content: a graph capture (written by `heapdump graph -o
    /// FILE.hdsnap`), or a gzip-compressed pprof profile (written by `heapdump snapshot`).
    #[arg(value_name = "INPUT")]
    pub capture: PathBuf,
    /// Output. From a capture: FILE.svg (ownership flame graph), FILE.heapsnapshot,
    /// FILE.hdsnap or FILE.pb.gz. From a pprof profile: FILE.svg (flame graph of the profile's
    /// stacks) or FILE.pb.gz.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// From a pprof profile: the sample type the flame graph shows (default: the profile's
    /// default sample type, inuse_space for heapdump's).
    #[arg(long, value_enum, value_name = "TYPE")]
    pub sample_index: Option<SampleIndex>,
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
    /// Also list each process's named snapshots (name, number, time; what
    /// `snapshot --named NAME[@N]` takes).
    #[arg(long)]
    pub snapshots: bool,
}

/// `heapdump snapshot`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).multiple(true).args(["by_pid", "by_name", "region", "multi_process"])))]
#[command(
    after_help = "Examples:\n  heapdump snapshot --by-pid 1234 -o s.pb.gz\n  heapdump snapshot --by-pid 1234 -o s.svg --sample-index alloc_space\n  heapdump snapshot --multi-process --tree 1234 -o all.pb.gz\n  go tool pprof -tagroot process_name,pid -top all.pb.gz\n  heapdump snapshot --by-pid 1234 -o s.pb.gz --contents-dir blocks/ --with-strings\n  go tool pprof -tags s.pb.gz                      # the string labels\n  heapdump snapshot --by-pid 1234 --push http://pyroscope:4040 --label env=prod\n  heapdump snapshot --by-pid 1234 --push http://parca:7070 --push-format parca"
)]
pub struct SnapshotArgs {
    /// Process id of the target (its current image's region).
    #[arg(long, value_name = "PID", conflicts_with_all = ["by_name", "region", "multi_process"])]
    pub by_pid: Option<u32>,
    /// Command name of the target (argv[0]'s or the executable's file name); must be unique.
    /// With --multi-process: every running process of that name; may be given several times.
    #[arg(long, value_name = "NAME", action = clap::ArgAction::Append)]
    pub by_name: Vec<String>,
    /// Read this region file directly.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["by_name", "multi_process"])]
    pub region: Option<PathBuf>,
    /// Snapshot several running instrumented processes into one profile: all of this user's
    /// (those in the region directory), or those --by-name and/or --tree select. Every sample
    /// is labelled with the strings `process_name` and `pid`; each process keeps mappings,
    /// locations and functions of its own. A process that exits or fails meanwhile is
    /// reported on stderr (one line) and left out; fails only if none succeeded.
    #[arg(long)]
    pub multi_process: bool,
    /// With --multi-process: only process PID and its descendants (children, their
    /// children, …: parent pids from /proc/*/stat).
    #[arg(long, value_name = "PID", requires = "multi_process")]
    pub tree: Option<u32>,
    /// Output file: a gzip-compressed pprof profile, or an interactive SVG flame graph when
    /// its name ends in `.svg` (or with --format svg); `-` is standard output. Optional with
    /// --push.
    #[arg(short, long, value_name = "FILE", required_unless_present = "push")]
    pub output: Option<PathBuf>,
    /// What to write, instead of guessing from the output's name.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<FormatArg>,
    /// The sample type the flame graph shows (its widths: bytes or blocks), and the pprof
    /// profile's default one. Default: inuse_space.
    #[arg(long, value_enum, value_name = "TYPE")]
    pub sample_index: Option<SampleIndex>,
    /// One sample per live block, labelled address, bytes, timestamp (ns since the epoch, tick
    /// resolution) and thread (pprof output only).
    #[arg(long)]
    pub with_tags: bool,
    /// Write each live block's bytes to DIR/ADDRESS (hex: DIR/0x55d0c0a012a0), read from the
    /// running process (process_vm_readv; not post-mortem). DIR must be new (created mode
    /// 0700) or empty, and not a symbolic link; files are created mode 0600. Blocks freed
    /// while being read are skipped and counted on stderr and in the profile's comments.
    #[arg(long, value_name = "DIR", conflicts_with = "multi_process")]
    pub contents_dir: Option<PathBuf>,
    /// With --contents-dir: longest file, in bytes (K, M, G suffixes: powers of 1024); a larger
    /// block's file holds its first BYTES bytes. Truncations are counted on stderr. Default:
    /// 64K.
    #[arg(long, value_name = "BYTES", value_parser = parse_size, requires = "contents_dir")]
    pub contents_max_block: Option<u64>,
    /// With --contents-dir: most bytes written in all (K, M, G suffixes). Files are written in
    /// address order; the block that reaches the total is cut there and the blocks after it
    /// get no file (counted on stderr). Default: 256M.
    #[arg(long, value_name = "BYTES", value_parser = parse_size, requires = "contents_dir")]
    pub contents_max_total: Option<u64>,
    /// One sample per live block as with --with-tags, and those of blocks that start with at
    /// least 4 bytes of printable text (UTF-8, no control character) get a `string` label
    /// holding that text (at most 64 bytes; it ends at the first NUL, newline or other
    /// non-printable byte). Read from the running process, as --contents-dir.
    #[arg(long, conflicts_with = "multi_process")]
    pub with_strings: bool,
    /// Do not symbolize (pprof can still symbolize from the mappings' files and build IDs).
    #[arg(long)]
    pub no_symbolize: bool,
    /// Longest wait, in seconds, for another snapshot of the same region to finish (only one
    /// runs at a time); then fail, naming the process that holds the region's lock.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub lock_timeout: f64,
    /// The blocks live when the program called heapdump_take_named_snapshot(NAME), instead of
    /// now (also after the process exited). NAME@N picks the N-th snapshot of that name (from
    /// 1); without @N, the latest. `heapdump list --snapshots` lists them.
    #[arg(long, value_name = "NAME[@N]", conflicts_with = "multi_process")]
    pub named: Option<String>,
    /// Only the blocks allocated after SPEC (and still live): a duration before now (`90s`,
    /// `10m`, `2h`, `500ms`), a named snapshot (`NAME` or `NAME@N`), or a profile heapdump
    /// wrote earlier of the same process (its instant). A block freed and its address reused
    /// since counts as new: blocks are told apart by (address, allocation time).
    #[arg(long, value_name = "SPEC", conflicts_with = "multi_process")]
    pub since: Option<String>,
    /// Where to send the profile, besides -o.
    #[command(flatten)]
    pub push: PushArgs,
}

/// Parses a byte count: decimal digits, optionally followed by `K`, `M` or `G` (powers of
/// 1024), as the shim's environment variables take them.
fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, mult) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .filter(|_| digits.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a byte count (e.g. 65536, 64K, 256M, 1G)"))
}

/// `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    /// Gzip-compressed pprof profile.
    Pprof,
    /// Interactive SVG flame graph (click a frame to zoom, Ctrl-F to search).
    Svg,
}

/// `--sample-index`: the sample types of heapdump's profiles (those of Go's heap profiles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SampleIndex {
    /// Bytes of the blocks live at the snapshot.
    #[value(name = "inuse_space")]
    InuseSpace,
    /// Blocks live at the snapshot.
    #[value(name = "inuse_objects")]
    InuseObjects,
    /// Bytes allocated since start-up, freed or not.
    #[value(name = "alloc_space")]
    AllocSpace,
    /// Blocks allocated since start-up, freed or not.
    #[value(name = "alloc_objects")]
    AllocObjects,
}

impl SampleIndex {
    /// The sample type's name in the profile (`inuse_space`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            SampleIndex::InuseSpace => "inuse_space",
            SampleIndex::InuseObjects => "inuse_objects",
            SampleIndex::AllocSpace => "alloc_space",
            SampleIndex::AllocObjects => "alloc_objects",
        }
    }
}

/// The output format: `--format`, else `svg` for a name ending in `.svg`, else pprof.
pub fn output_format(format: Option<FormatArg>, output: &std::path::Path) -> crate::pprof::Format {
    match format {
        Some(FormatArg::Svg) => crate::pprof::Format::Svg,
        Some(FormatArg::Pprof) => crate::pprof::Format::Pprof,
        None if output.extension().is_some_and(|e| e == "svg") => crate::pprof::Format::Svg,
        None => crate::pprof::Format::Pprof,
    }
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
    /// Leave NODE_OPTIONS alone when the command is node: by default heapdump adds
    /// --perf-basic-prof --interpreted-frames-native-stack to it, so that JavaScript functions
    /// have names in the profile (node then writes /tmp/perf-PID.map, removed at a normal exit
    /// unless --keep).
    #[arg(long)]
    pub no_jit_names: bool,
    /// The command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// What `heapdump snapshot` does.
#[derive(Debug, Clone)]
pub struct SnapshotProps {
    /// Which region(s).
    pub target: Target,
    /// Output path (`None`: only pushed).
    pub output: Option<PathBuf>,
    /// What to write.
    pub format: crate::pprof::Format,
    /// The sample type to show (`None`: the profile's default, inuse_space).
    pub sample_index: Option<&'static str>,
    /// Per-block samples.
    pub with_tags: bool,
    /// Symbolize in the collector.
    pub symbolize: bool,
    /// Longest wait for another collector's lock on the region.
    pub lock_timeout: std::time::Duration,
    /// `--contents-dir`, `--with-strings`: what to read of the blocks' contents (`None`:
    /// nothing).
    pub contents: Option<crate::contents::Request>,
    /// `--named`.
    pub named: Option<String>,
    /// `--since`.
    pub since: Option<String>,
    /// `--push`: where to send the profile too.
    pub push: Option<PushProps>,
}

impl TryFrom<SnapshotArgs> for SnapshotProps {
    type Error = anyhow::Error;

    /// Errors: options that do not go together (several --by-name without --multi-process,
    /// --with-tags with a flame graph).
    fn try_from(a: SnapshotArgs) -> anyhow::Result<Self> {
        let format = match &a.output {
            Some(o) => output_format(a.format, o),
            None => crate::pprof::Format::Pprof,
        };
        let push = PushProps::from_args(a.push)?;
        if push.is_some() {
            if a.multi_process {
                bail!(
                    "--push sends one profile per process, labelled with its name and pid: \
                     for several processes use `heapdump watch --multi-process --count 1 --push URL`"
                );
            }
            if a.with_tags || a.with_strings {
                bail!(
                    "--push sends profiles aggregated by stack (servers limit the number of \
                     samples): leave out --with-tags and --with-strings"
                );
            }
            if format == crate::pprof::Format::Svg {
                bail!("--push sends a pprof profile: write the flame graph in another run");
            }
        }
        let target = if a.multi_process {
            Target::Many(Selection {
                names: a.by_name,
                tree: a.tree,
            })
        } else {
            match (a.by_pid, a.by_name.as_slice(), a.region) {
                (Some(p), _, _) => Target::Pid(p),
                (_, [n], _) => Target::Name(n.clone()),
                (_, [_, _, ..], _) => anyhow::bail!(
                    "--by-name names one process; to snapshot every process of several names \
                     into one profile, add --multi-process"
                ),
                (_, _, Some(f)) => Target::File(f),
                _ => unreachable!("clap requires one target"),
            }
        };
        if a.with_strings && format == crate::pprof::Format::Svg {
            anyhow::bail!(
                "--with-strings labels one sample per block in a pprof profile, which a flame \
                 graph does not show: leave it out, or write a .pb.gz"
            );
        }
        let contents =
            (a.contents_dir.is_some() || a.with_strings).then(|| crate::contents::Request {
                dir: a.contents_dir.clone(),
                max_block: a.contents_max_block.unwrap_or(64 << 10),
                max_total: a.contents_max_total.unwrap_or(256 << 20),
                strings: a.with_strings,
            });
        if a.named.is_some() && contents.is_some() {
            anyhow::bail!(
                "--named shows the blocks of an earlier instant, whose contents are gone: \
                 --contents-dir and --with-strings read the blocks live now"
            );
        }
        if a.with_tags && format == crate::pprof::Format::Svg {
            anyhow::bail!(
                "--with-tags writes one sample per block into a pprof profile, which a flame \
                 graph does not need: leave it out, or write a .pb.gz"
            );
        }
        Ok(SnapshotProps {
            target,
            output: a.output,
            format,
            sample_index: a.sample_index.map(SampleIndex::as_str),
            with_tags: a.with_tags,
            symbolize: !a.no_symbolize,
            lock_timeout: std::time::Duration::from_secs_f64(a.lock_timeout.clamp(0.0, 1e9)),
            contents,
            named: a.named,
            since: a.since,
            push,
        })
    }
}

/// `--push` and its options (`snapshot`, `watch`).
#[derive(Debug, Args, Clone)]
pub struct PushArgs {
    /// Send each profile to this profiling server: Grafana Pyroscope's base URL
    /// (`http://HOST:4040`; the Connect call `POST URL/push.v1.PusherService/Push`) or, with
    /// --push-format parca, Parca's gRPC address (`http://HOST:7070`: HTTP/2 without TLS;
    /// `https://…`: TLS; the call `parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw`).
    /// Labels: __name__=memory, service_name, hostname, pid, the --labels, and (Pyroscope)
    /// __delta__=false.
    /// Pushed alloc_* values are the allocations since the process's previous push in this
    /// watch (0 on its first push, so always 0 with `snapshot`); past 16,000 samples the
    /// profile is aggregated by stack and the smallest stacks folded into one "(other: N
    /// stacks trimmed)" sample. Files written with -o keep the cumulative counts.
    #[arg(long, value_name = "URL")]
    pub push: Option<String>,
    /// The server's API: pyroscope (the default) or parca.
    #[arg(long, value_enum, value_name = "FORMAT", requires = "push")]
    pub push_format: Option<PushFormat>,
    /// A label sent with every profile (repeatable), e.g. `--label env=prod`; overrides the
    /// default `service_name` (the process name), `hostname` and `pid`. Names: letters, digits
    /// and `_`, not starting with a digit; `__name__` and `__delta__` are heapdump's.
    #[arg(long = "label", value_name = "KEY=VALUE", requires = "push", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// A file holding a bearer token (`Authorization: Bearer TOKEN`, the gRPC metadata
    /// `authorization` with Parca, as Polar Signals Cloud wants; surrounding whitespace ignored).
    #[arg(
        long,
        value_name = "FILE",
        env = "HEAPDUMP_PUSH_BEARER_TOKEN_FILE",
        conflicts_with = "basic_auth_file"
    )]
    pub bearer_token_file: Option<PathBuf>,
    /// A file holding `USER:PASSWORD` on its first line (HTTP Basic authentication, as Grafana
    /// Cloud's numeric user id and token).
    #[arg(long, value_name = "FILE", env = "HEAPDUMP_PUSH_BASIC_AUTH_FILE")]
    pub basic_auth_file: Option<PathBuf>,
    /// The tenant of a multi-tenant Pyroscope (header `X-Scope-OrgID`).
    #[arg(long, value_name = "ID", env = "HEAPDUMP_PUSH_TENANT")]
    pub tenant: Option<String>,
    /// Longest time one push may take, connection included.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, default_value = "10s")]
    pub push_timeout: Duration,
}

/// Parses `KEY=VALUE` (a label name as Prometheus spells them: `[A-Za-z_][A-Za-z0-9_]*`).
fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: a label is KEY=VALUE"))?;
    let ok = k
        .bytes()
        .enumerate()
        .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()));
    if k.is_empty() || !ok {
        return Err(format!(
            "{k:?}: a label name is letters, digits and _, not starting with a digit"
        ));
    }
    if k == "__name__" || k == "__delta__" {
        return Err(format!("{k} is set by heapdump (memory, false)"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// `--push` and the options after it, converted ([`PushProps`] is `push`'s own).
impl PushProps {
    /// `None` without `--push`.
    ///
    /// Errors: a URL that is not http(s), an unreadable or empty credentials file, a basic
    /// auth file without `USER:PASSWORD`.
    pub fn from_args(a: PushArgs) -> anyhow::Result<Option<PushProps>> {
        use anyhow::Context;
        let Some(url) = a.push else { return Ok(None) };
        let format = a.push_format.unwrap_or(PushFormat::Pyroscope);
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            match format {
                PushFormat::Pyroscope => {
                    bail!("--push {url}: Pyroscope is reached over http:// or https://")
                }
                PushFormat::Parca => bail!(
                    "--push {url}: give Parca's address as http://HOST:7070 (HTTP/2 without \
                     TLS) or https://HOST (TLS)"
                ),
            }
        }
        if format == PushFormat::Parca && a.tenant.as_ref().is_some_and(|t| !t.is_empty()) {
            bail!(
                "--tenant (X-Scope-OrgID) is Pyroscope's: Parca has no tenants (unset \
                 HEAPDUMP_PUSH_TENANT)"
            );
        }
        let read = |f: &PathBuf, what: &str| -> anyhow::Result<String> {
            // Not blocking on a FIFO, and at most 1 MiB (a token is one line).
            let t = crate::regions::read_regular(f, 1 << 20)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .with_context(|| format!("cannot read the {what} file {}", f.display()))?;
            let t = t.lines().next().unwrap_or("").trim().to_owned();
            if t.is_empty() {
                bail!("the {what} file {} is empty", f.display());
            }
            Ok(t)
        };
        let authorization = match (&a.bearer_token_file, &a.basic_auth_file) {
            (Some(f), _) => Some(format!("Bearer {}", read(f, "bearer token")?)),
            (None, Some(f)) => {
                let up = read(f, "basic auth")?;
                if !up.contains(':') {
                    bail!(
                        "the basic auth file {} must hold USER:PASSWORD",
                        f.display()
                    );
                }
                Some(format!(
                    "Basic {}",
                    base64::Engine::encode(
                        &base64::engine::general_purpose::STANDARD,
                        up.as_bytes()
                    )
                ))
            }
            (None, None) => None,
        };
        Ok(Some(PushProps {
            url: url.trim_end_matches('/').to_owned(),
            format,
            labels: a.labels,
            authorization,
            tenant: a.tenant.filter(|t| !t.is_empty()),
            timeout: a.push_timeout,
        }))
    }
}

/// `heapdump watch`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).multiple(true).args(["by_pid", "by_name", "multi_process"])))]
#[command(
    after_help = "Snapshots are taken at multiples of --every (wall clock: --every 30s takes \
them at :00 and :30 of each minute), one after the other, never two at once; when a round takes \
longer than --every, the beats it overlapped are skipped with one warning line. Each process's \
profile is written to DIR/NAME-PID-YYYYMMDDTHHMMSSZ.pb.gz (the beat's UTC time) through a \
temporary file in DIR. SIGINT or SIGTERM ends the watch after the current file (a second one \
ends it at once); it then prints its own CPU time and peak memory.\n\nWith --push, a profile the \
server does not take (unreachable; HTTP 408, 429 or 5xx; gRPC UNAVAILABLE, DEADLINE_EXCEEDED, \
RESOURCE_EXHAUSTED, ...) waits and is tried again in order, 1 s after the failure, then doubling up \
to 5 min. With -o DIR it waits on disk, in DIR/.spool, up to --spool-max-bytes, and a watch \
started later on the same DIR sends what is left there first; without -o, in memory, at most 100 \
profiles and 64 MiB, and a watch that ends keeps trying them for at most 30 s more. Past the bound the oldest is \
dropped, counted on stderr. Other refusals (HTTP 400, 401, ...; gRPC INVALID_ARGUMENT, \
UNAUTHENTICATED, PERMISSION_DENIED, ...) drop the profile with one line.\n\nExamples:\n  heapdump \
watch --by-pid 1234 --every 30s -o heap/ --keep 100\n  heapdump watch --by-name server --every \
1m --push http://pyroscope:4040 --label env=prod\n  heapdump watch --multi-process --every 60s \
-o /var/lib/heapdump --push http://parca:7070 --push-format parca\n  heapdump watch \
--multi-process --every 60s --push https://profiles.example.com --basic-auth-file /etc/heapdump/auth"
)]
pub struct WatchArgs {
    /// Process id of the target; the watch ends when it exits.
    #[arg(long, value_name = "PID", conflicts_with_all = ["by_name", "multi_process"])]
    pub by_pid: Option<u32>,
    /// Every running process of this name (argv[0]'s or the executable's file name); may be
    /// given several times. Processes that start later are picked up at the next beat, those
    /// that exit are reported once and dropped.
    #[arg(long, value_name = "NAME", action = clap::ArgAction::Append)]
    pub by_name: Vec<String>,
    /// Every running instrumented process of this user (or those --by-name/--tree select),
    /// each into its own files; processes are followed as with --by-name.
    #[arg(long)]
    pub multi_process: bool,
    /// With --multi-process: only process PID and its descendants.
    #[arg(long, value_name = "PID", requires = "multi_process")]
    pub tree: Option<u32>,
    /// Interval between snapshots (`30s`, `1m`, `1h 30m`; at least 1s).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub every: Duration,
    /// Stop after this many beats, at least 1 (default: until SIGINT or SIGTERM).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Directory for the profiles (created mode 0700 if missing). Default: the current
    /// directory, or none when --push is given.
    #[arg(short, long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Keep only the newest N files of each process in DIR (older ones are removed after each
    /// new one is written).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub keep: Option<u64>,
    /// Do not symbolize (pprof can still symbolize from the mappings' files and build IDs;
    /// Pyroscope cannot).
    #[arg(long)]
    pub no_symbolize: bool,
    /// Longest wait, in seconds, for another snapshot of the same region to finish.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub lock_timeout: f64,
    /// Where to send the profiles, besides -o.
    #[command(flatten)]
    pub push: PushArgs,
    /// Also rewrite this HTML report (`heapdump report`) of every snapshot taken so far (with
    /// --keep N: the newest N of each process) after each beat (written to a temporary file
    /// renamed into place: reload the page any time).
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// With -o DIR and --push: most bytes of profiles waiting in DIR/.spool for the server
    /// (the oldest dropped first past it; 0: no spool, wait in memory only). Default: 256 MiB.
    #[arg(long, value_name = "BYTES", requires = "push")]
    pub spool_max_bytes: Option<u64>,
}

/// `heapdump report`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  heapdump watch --by-pid 1234 --every 10s -o prof/\n  heapdump report prof/ -o report.html\n  heapdump watch --by-pid 1234 --every 10s -o prof/ --report report.html   # rewritten each beat\n\nThe page needs no network: open it from disk. Snapshots are ordered by their recorded instants; several processes in the inputs get a section each (or pick one with --pid). A `leaks -o` profile and a `graph -o FILE.hdsnap` capture among the inputs get sections of their own."
)]
pub struct ReportArgs {
    /// `watch -o` directories (their *.pb.gz and *.hdsnap files), heapdump profiles (a
    /// `leaks -o` one gets a Leaks section) and graph captures (a Reference graph section).
    #[arg(value_name = "DIR|FILE", required = true)]
    pub inputs: Vec<PathBuf>,
    /// The HTML file to write (`-`: standard output).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Only the snapshots of this process.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Also look past frames whose function matches this regular expression when naming
    /// allocation sites (besides the known allocator wrappers; pprof's --drop_frames).
    #[arg(long, value_name = "REGEX")]
    pub drop_frames: Option<String>,
}

/// Which processes `watch` follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchTarget {
    /// One process, until it exits.
    Pid(u32),
    /// Every running process selected, as they come and go.
    Many(Selection),
}

/// What `heapdump watch` does.
#[derive(Debug, Clone)]
pub struct WatchProps {
    /// The processes.
    pub target: WatchTarget,
    /// The interval (≥ 1 s).
    pub every: Duration,
    /// Number of beats, if bounded.
    pub count: Option<u64>,
    /// Directory for the files (`None`: push only).
    pub dir: Option<PathBuf>,
    /// Files kept per process.
    pub keep: Option<u64>,
    /// Symbolize in the collector.
    pub symbolize: bool,
    /// Longest wait for another collector's lock on a region.
    pub lock_timeout: Duration,
    /// Where to push.
    pub push: Option<PushProps>,
    /// Bound of `DIR/.spool` (0: no spool).
    pub spool_max_bytes: u64,
    /// The HTML report rewritten after each beat.
    pub report: Option<PathBuf>,
}

impl TryFrom<WatchArgs> for WatchProps {
    type Error = anyhow::Error;

    /// Errors: --every under 1 s, --keep without a directory, bad --push options.
    fn try_from(a: WatchArgs) -> anyhow::Result<Self> {
        if a.every < Duration::from_secs(1) {
            bail!(
                "--every {}: the interval is at least 1s",
                humantime::format_duration(a.every)
            );
        }
        let push = PushProps::from_args(a.push)?;
        let dir = match (a.output, &push) {
            (Some(d), _) => Some(d),
            (None, None) => Some(PathBuf::from(".")),
            (None, Some(_)) => None,
        };
        if a.spool_max_bytes.is_some() && dir.is_none() {
            bail!("--spool-max-bytes bounds the spool in -o DIR: give -o DIR");
        }
        if a.keep.is_some() && dir.is_none() {
            bail!("--keep N keeps the newest files of -o DIR: give -o DIR");
        }
        let target = match a.by_pid {
            Some(p) => WatchTarget::Pid(p),
            None => WatchTarget::Many(Selection {
                names: a.by_name,
                tree: a.tree,
            }),
        };
        Ok(WatchProps {
            target,
            every: a.every,
            count: a.count,
            dir,
            keep: a.keep,
            symbolize: !a.no_symbolize,
            lock_timeout: Duration::from_secs_f64(a.lock_timeout.clamp(0.0, 1e9)),
            push,
            spool_max_bytes: a
                .spool_max_bytes
                .unwrap_or(crate::push::spool::DEFAULT_MAX_BYTES),
            report: a.report,
        })
    }
}

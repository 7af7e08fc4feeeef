#!/usr/bin/env python3
"""heapdump benchmark harness (issue 4): one command, `python3 bench/run.py`.

What it does, in order:

1. Builds the C workloads in bench/ with `cc -O2 -g -fno-omit-frame-pointer -pthread` into
   target/bench/ (never cargo: the release build of heapdump must already exist in
   target/release/).
2. Finds the peers to compare with, installing the missing Debian packages (heaptrack,
   libjemalloc2) with apt-get when running as root, and checks what each supports (jemalloc
   built with profiling? heapdump with HEAPDUMP_SAMPLE_INTERVAL?).
3. C workload (bench/workload.c) at 1 and 2 threads: every peer run is paired with a run of the
   bare baseline (glibc malloc) just before it, and the order of the peers rotates from round to
   round; the table gives, per peer, the median over rounds of peer/baseline for wall and CPU
   time, and the median peak RSS. Peers: heapdump (default CFI unwinding; frame pointers only
   with HEAPDUMP_UNWIND=fp; sampled at 512 KiB), heaptrack, jemalloc with and without its
   profiler. Then the thread scaling (throughput at 2 threads / at 1).
   Then the malloc/free storm (bench/storm.c: 81% malloc/free pairs of 8 B–64 KiB through 16
   call paths 2–24 frames deep, 10,000 live blocks per thread) against the same peers, with
   the operation phase's throughput; and bench/phases.c (8 threads allocating 500,000 blocks
   each without freeing, then freeing them all) for bare glibc and heapdump. Then "where the
   time goes" (section "where"): `perf record` of the storm on one thread at 100 and 10,000
   live blocks per thread, bare and under heapdump, turned into ns per malloc/free pair by
   component (CFI walk, address index, interning, record, TLS, glibc's extra misses, ...).
4. CPython workload (bench/py_workload.py, Debian's /usr/bin/python3, default pymalloc):
   baseline vs heapdump (every object with Python and native frames, no flag) vs memray
   (pip, in a venv under target/bench: `memray run --trace-python-allocators`, every object
   with Python frames only) vs heaptrack and heapdump with PYTHONMALLOC=malloc (what they
   need to see every object), same table; then baseline, heapdump and memray on the same work
   30 Python frames deeper (`py_workload.py ITERS 30`), where per-frame costs show.
5. Snapshot speed and memory: bench/hold.c holding 1 M (and with --big 10 M) small blocks under
   heapdump; `heapdump snapshot` time and peak RSS, with and without --with-tags; region bytes
   per block; the target's RSS with and without the shim.
6. Reference graph: bench/graph_hold.c holding 1 M (and with --big 10 M) blocks of 16–128 B, a
   quarter of their words pointing at random blocks (the worst case for caches); wall time and
   peak private memory (RssAnon, sampled every 10 ms: the region file the collector maps is the
   target's memory, not its own) of `graph -o FILE.hdsnap`, `leaks`, `top --retained`, `leaks
   FILE`, next to a plain `snapshot` of the same process; the target's pause with `--stop`.
7. Latency: bench/latency.c holds 1 M blocks and times each free+malloc in 2 s phases, without
   and with back-to-back snapshots (p50, p99, p99.9, max); then the fixed footprint: peak RSS of
   bench/nop.c (allocates almost nothing) with and without the shim.
   (Sections 6 and 7 are numbered in the order they run.)
8. Continuous snapshots (section "continuous", before the latency one; issue 13's goals 3 and
   4): examples/c/churn.c with 32 threads × 5,000 live 48 B blocks under `heapdump watch
   --every 1s` for --continuous-seconds (60), in the collector's session and in one of its own:
   the region's record high-water per live block, and the first vs last snapshots' lease, wait
   and wall time; then bench/latency.c with THREADS=32 over 160,000 blocks, as in 7.
9. Interleaved A/B (section "ab"), for before/after claims on a noisy host: the storm (at each
   --threads count), bench/phases.c (8 threads) and CPython with PYTHONMALLOC=malloc, bare and
   under the shim, --rounds rounds, each shim run right after a bare run of its own; per
   workload the median of the pairs' ratios and min(shim) / min(bare), CPU (user+sys) for the
   storm and CPython, the program's own phase times for phases. With --shim-b PATH a second
   shim build (e.g. an older commit's) runs in the same rounds, rows "shim B".
10. Instruction counts (section "instructions"; valgrind, apt-get installed when root unless
   --no-install): `valgrind --tool=cachegrind --cache-sim=yes` of the storm (1 thread, 200,000
   ops), `phases 4 100000` and CPython (PYTHONMALLOC=malloc, PYTHONHASHSEED=0, 2,000
   iterations, and the same 30 Python frames deeper), bare, under the shim and under --shim-b: instructions and L1 data misses,
   deterministic where timing on a shared VM is not.
11. The floor (section "floor"; issue 20's "where a goal is out of reach, the measured floor
   and why"): builds the shim with the benchmark-only cargo feature `ablation` into
   target/ablation (instrumentation/src/ablate.rs) and runs the storm on one thread bare,
   interposed with recording off, with block marks only, without stacks and/or the
   allocations table, and whole, in the same interleaved rounds; prints what each part adds
   (× bare, ns an operation) and its instructions (cachegrind, 200,000 operations).

Measurements: wall time is measured around the child with a monotonic clock; CPU time is
user+sys of the child and all the descendants it waited for, from os.wait4(); peak RSS is
wait4's ru_maxrss, the peak of the largest single process in that tree (not a sum).

The report (Markdown) goes to stdout; progress goes to stderr. Standard library only.
"""

import argparse
import datetime
import glob
import gzip
import os
import platform
import re
import resource
import select
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# --------------------------------------------------------------------------------------------
# Paths and constants
# --------------------------------------------------------------------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_SRC = os.path.join(REPO, "bench")
BUILD_DIR = os.path.join(REPO, "target", "bench")
SHIM = os.path.join(REPO, "target", "release", "libheapdump.so")
HEAPDUMP = os.path.join(REPO, "target", "release", "heapdump")
# memray's venv (made by section_python with the Python under test, `pip install memray`).
MEMRAY_VENV = os.path.join(REPO, "target", "bench", "memray-venv")
MEMRAY_PY = os.path.join(MEMRAY_VENV, "bin", "python")

CFLAGS = ["-O2", "-g", "-fno-omit-frame-pointer", "-pthread"]
SAMPLE_INTERVAL = 524288  # 512 KiB, for "heapdump sampled" and "jemalloc prof 512 KiB"
PY_DEEP = 30  # Python frames added under bench/py_workload.py's work for its "deeper" rows

# Environment variables that would change what a run measures; removed from the base env.
SCRUBBED_ENV = ("LD_PRELOAD", "MALLOC_CONF", "PYTHONMALLOC", "HEAPDUMP_DIR", "HEAPDUMP_KEEP",
                "HEAPDUMP_DISABLE", "HEAPDUMP_SAMPLE_INTERVAL", "HEAPDUMP_MAX_BLOCKS",
                "HEAPDUMP_MAX_STACKS", "HEAPDUMP_MAX_THREADS", "GLIBC_TUNABLES")


def log(msg):
    """Progress message (stderr, so that stdout is only the report)."""
    print(msg, file=sys.stderr, flush=True)


def base_env():
    env = dict(os.environ)
    for k in SCRUBBED_ENV:
        env.pop(k, None)
    return env


def find_jemalloc():
    """Path of Debian's libjemalloc.so.2 for this architecture, or None."""
    candidates = []
    try:
        multiarch = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True,
                                   timeout=10).stdout.strip()
        if multiarch:
            candidates.append(f"/usr/lib/{multiarch}/libjemalloc.so.2")
    except (OSError, subprocess.SubprocessError):
        pass
    candidates += ["/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
                   "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2"]
    candidates += glob.glob("/usr/lib/*/libjemalloc.so.2")
    for c in candidates:
        if os.path.exists(c):
            return c
    return None


def find_debian_python():
    """Debian's CPython, never a pyenv shim or a virtualenv."""
    for c in ("/usr/bin/python3.11", "/usr/bin/python3"):
        if os.path.exists(c) and os.access(c, os.X_OK):
            return c
    return None


# --------------------------------------------------------------------------------------------
# Running one measured command
# --------------------------------------------------------------------------------------------

class Result:
    """Outcome of one measured run."""

    def __init__(self):
        self.ok = False
        self.error = None      # short description when not ok
        self.wall = None       # seconds
        self.cpu = None        # seconds, user+sys of the process tree (waited-for descendants)
        self.maxrss_kib = None  # ru_maxrss: peak RSS of the largest process in the tree
        self.stdout = ""
        self.stderr = ""

    def __repr__(self):
        if not self.ok:
            return f"<failed: {self.error}>"
        return f"<wall {self.wall:.3f}s cpu {self.cpu:.3f}s rss {self.maxrss_kib / 1024:.0f}MiB>"


def _tail(text, n=300):
    """The last meaningful line(s) of a program's stderr, shortened, for an error message."""
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    if not lines:
        return ""
    s = lines[-1]
    return s if len(s) <= n else s[:n] + "…"


def run_measured(argv, env, cwd, timeout, stdin=subprocess.DEVNULL):
    """Run argv to completion and measure it.

    The child gets a session (and so a process group) of its own, so that a timeout can kill it
    together with everything it started (heaptrack's interpreter, …). Its stdout and stderr go
    to temporary files, read back afterwards.
    """
    res = Result()
    out = tempfile.TemporaryFile(mode="w+b")
    err = tempfile.TemporaryFile(mode="w+b")
    try:
        t0 = time.perf_counter()
        try:
            p = subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=out, stderr=err,
                                 start_new_session=True)
        except OSError as e:
            res.error = f"cannot start {argv[0]}: {e}"
            return res

        lock = threading.Lock()
        state = {"done": False, "timed_out": False}

        def on_timeout():
            with lock:
                if not state["done"]:
                    state["timed_out"] = True
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except OSError:
                        pass

        timer = threading.Timer(timeout, on_timeout)
        timer.daemon = True
        timer.start()
        # Wait for the exit without reaping (WNOWAIT), so the timer can never signal a recycled
        # pid; then reap with wait4 to get the resource usage of the child and its descendants.
        while True:
            try:
                os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
                break
            except InterruptedError:
                continue
        wall = time.perf_counter() - t0
        with lock:
            state["done"] = True
        timer.cancel()
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)  # keep Popen from waiting again

        out.seek(0)
        err.seek(0)
        res.stdout = out.read().decode(errors="replace")
        res.stderr = err.read().decode(errors="replace")
        res.wall = wall
        res.cpu = ru.ru_utime + ru.ru_stime
        res.maxrss_kib = ru.ru_maxrss
        if state["timed_out"]:
            res.error = f"timeout after {timeout:.0f} s"
        elif p.returncode < 0:
            try:
                name = signal.Signals(-p.returncode).name
            except ValueError:
                name = f"signal {-p.returncode}"
            res.error = f"killed by {name}" + (f" ({_tail(res.stderr)})" if _tail(res.stderr) else "")
        elif p.returncode != 0:
            res.error = f"exit status {p.returncode}" + (f": {_tail(res.stderr)}" if _tail(res.stderr) else "")
        else:
            res.ok = True
        return res
    finally:
        out.close()
        err.close()


# --------------------------------------------------------------------------------------------
# Peers: how to run a command under each profiler
# --------------------------------------------------------------------------------------------

class Peer:
    """One way of running a workload.

    `wrap(argv, env, tmpdir)` returns the (argv, env) to run; tmpdir is a fresh, empty
    directory for the peer's output (heapdump's region, heaptrack's file), removed afterwards.
    """

    def __init__(self, name, wrap, note=None):
        self.name = name
        self.wrap = wrap
        self.available = True
        self.skip_reason = None
        self.note = note  # printed under the table when set


def make_peers(jemalloc):
    def baseline(argv, env, tmp):
        return argv, env

    def heapdump(argv, env, tmp):
        e = dict(env, LD_PRELOAD=SHIM, HEAPDUMP_DIR=tmp)
        return argv, e

    def heapdump_sampled(argv, env, tmp):
        e = dict(env, LD_PRELOAD=SHIM, HEAPDUMP_DIR=tmp,
                 HEAPDUMP_SAMPLE_INTERVAL=str(SAMPLE_INTERVAL))
        return argv, e

    def heapdump_index(argv, env, tmp):
        e = dict(env, LD_PRELOAD=SHIM, HEAPDUMP_DIR=tmp, HEAPDUMP_BLOCK_HEADERS="0")
        return argv, e

    def heapdump_fp(argv, env, tmp):
        e = dict(env, LD_PRELOAD=SHIM, HEAPDUMP_DIR=tmp, HEAPDUMP_UNWIND="fp")
        return argv, e

    def heaptrack(argv, env, tmp):
        return ["heaptrack", "-o", os.path.join(tmp, "heaptrack.out")] + list(argv), env

    def jem(conf):
        def wrap(argv, env, tmp):
            e = dict(env, LD_PRELOAD=jemalloc or "libjemalloc.so.2")
            if conf:
                e["MALLOC_CONF"] = conf
            return argv, e
        return wrap

    def py_malloc(wrap):
        def w(argv, env, tmp):
            return wrap(argv, dict(env, PYTHONMALLOC="malloc"), tmp)
        return w

    def memray(argv, env, tmp):
        # argv is [python, script, args…]: the venv's interpreter runs memray on the script.
        return ([MEMRAY_PY, "-m", "memray", "run", "--trace-python-allocators", "-q", "-o",
                 os.path.join(tmp, "memray.bin")] + list(argv[1:]), env)

    return {
        "baseline": Peer("baseline (glibc)", baseline),
        "memray": Peer("memray --trace-python-allocators (Python frames only)", memray),
        "heapdump-pymalloc-off": Peer("heapdump, PYTHONMALLOC=malloc", py_malloc(heapdump)),
        "heapdump-index-pymalloc-off": Peer(
            "heapdump, address index (HEAPDUMP_BLOCK_HEADERS=0), PYTHONMALLOC=malloc",
            py_malloc(heapdump_index)),
        "heaptrack-pymalloc-off": Peer("heaptrack, PYTHONMALLOC=malloc", py_malloc(heaptrack)),
        "heapdump": Peer("heapdump", heapdump),
        "heapdump-fp": Peer("heapdump, HEAPDUMP_UNWIND=fp", heapdump_fp),
        "heapdump-index": Peer("heapdump, address index (HEAPDUMP_BLOCK_HEADERS=0)",
                               heapdump_index),
        "heapdump-sampled": Peer("heapdump sampled 512 KiB", heapdump_sampled),
        "heaptrack": Peer("heaptrack", heaptrack),
        "jemalloc": Peer("jemalloc (no profiling)", jem(None)),
        "jemalloc-prof": Peer("jemalloc prof, every allocation", jem("prof:true,lg_prof_sample:0")),
        "jemalloc-prof-512k": Peer("jemalloc prof, sampled 512 KiB",
                                   jem("prof:true,lg_prof_sample:19")),
    }


# --------------------------------------------------------------------------------------------
# Setup: build, install, check peers
# --------------------------------------------------------------------------------------------

def build(cc):
    """Compile the C workloads into target/bench/. Returns {name: path}."""
    os.makedirs(BUILD_DIR, exist_ok=True)
    out = {}
    for name in ("workload", "hold", "latency", "nop", "graph_hold", "storm", "phases"):
        src = os.path.join(BENCH_SRC, name + ".c")
        exe = os.path.join(BUILD_DIR, name)
        cmd = [cc] + CFLAGS + ["-o", exe, src]
        log("build: " + " ".join(shlex.quote(c) for c in cmd))
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"build of {src} failed:\n{r.stderr}")
        out[name] = exe
    return out


def freeze_heapdump_build():
    """Copy the release shim and collector into target/bench/ and use the copies, so that the
    whole run measures one build even if target/release/ is rebuilt meanwhile. Returns a line
    describing that build for the report."""
    global SHIM, HEAPDUMP
    frozen = os.path.join(BUILD_DIR, "heapdump-under-test")
    os.makedirs(frozen, exist_ok=True)
    desc = []
    for path in (SHIM, HEAPDUMP):
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: build heapdump first (cargo build --release)")
        st = os.stat(path)
        desc.append(f"{os.path.relpath(path, REPO)} built "
                    f"{datetime.datetime.fromtimestamp(st.st_mtime).astimezone():%Y-%m-%d %H:%M:%S %Z}")
        shutil.copy2(path, os.path.join(frozen, os.path.basename(path)))
    SHIM = os.path.join(frozen, os.path.basename(SHIM))
    HEAPDUMP = os.path.join(frozen, os.path.basename(HEAPDUMP))
    head = subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h %cI %s"],
                          capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
    commit = head.stdout.strip() if head.returncode == 0 else "unknown"
    if dirty.returncode == 0 and dirty.stdout.strip():
        commit += " (work tree has uncommitted changes)"
    return f"heapdump under test: {'; '.join(desc)} (copied at start); HEAD {commit}"


class BackgroundLoad:
    """How much CPU other processes used while the harness ran: busy time of all CPUs from
    /proc/stat minus the CPU time of the harness and its children. A busy machine makes the
    numbers unreliable (and 2-thread runs especially)."""

    def __init__(self):
        self.start = (self._busy(), self._ours(), time.monotonic())

    @staticmethod
    def _busy():
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        # user nice system idle iowait irq softirq steal …: everything but idle and iowait.
        busy = sum(fields[:8]) - fields[3] - fields[4]
        return busy / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _ours():
        s = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    def line(self):
        b0, o0, t0 = self.start
        b1, o1, t1 = self._busy(), self._ours(), time.monotonic()
        if b0 is None or b1 is None or t1 <= t0:
            return None
        other = max(0.0, (b1 - b0) - (o1 - o0))
        frac = other / (t1 - t0)
        warn = (" — WARNING: the machine was not quiet, ratios are noisy (2-thread runs most)"
                if frac > 0.1 else "")
        return (f"background load: other processes used {other:.0f} CPU-s in {t1 - t0:.0f} s "
                f"(on average {frac:.2f} of a core){warn}")


def install_missing(packages, allow):
    """apt-get install the Debian packages given, if root and allowed. Returns a message."""
    if not packages:
        return None
    if not allow:
        return "not installing " + ", ".join(packages) + " (--no-install)"
    if os.geteuid() != 0:
        return "not root: cannot install " + ", ".join(packages) + "; those peers are skipped"
    if not shutil.which("apt-get"):
        return "no apt-get: cannot install " + ", ".join(packages)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log("installing: apt-get update && apt-get install -y " + " ".join(packages))
    subprocess.run(["apt-get", "update"], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    r = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends"] + packages,
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return "apt-get install " + " ".join(packages) + " failed: " + _tail(r.stderr)
    return "installed " + ", ".join(packages)


def hold_start(hold_exe, n, env, timeout):
    """Start hold.c; wait for its "ready PID" line. Returns (Popen, seconds to ready)."""
    t0 = time.perf_counter()
    p = subprocess.Popen([hold_exe, str(n)], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    buf = b""
    deadline = t0 + timeout
    while b"\n" not in buf:
        left = deadline - time.perf_counter()
        if left <= 0:
            hold_stop(p, kill=True)
            raise RuntimeError(f"hold {n}: not ready after {timeout:.0f} s")
        r, _, _ = select.select([p.stdout], [], [], left)
        if r:
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                err = p.stderr.read().decode(errors="replace")
                p.wait()
                raise RuntimeError(f"hold {n} exited ({p.returncode}) before ready: {_tail(err)}")
            buf += chunk
    ready = time.perf_counter() - t0
    line = buf.split(b"\n", 1)[0].decode()
    if not line.startswith("ready "):
        hold_stop(p, kill=True)
        raise RuntimeError(f"hold {n}: unexpected output {line!r}")
    return p, ready


def hold_stop(p, kill=False):
    """Close hold.c's stdin so it exits (or kill it), and reap it."""
    if kill:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        p.stdin.close()
    except OSError:
        pass
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def proc_status_kib(pid, field):
    """A `kB` field of /proc/PID/status (VmRSS, VmHWM, …), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def check_sampling(hold_exe, timeout):
    """Does this heapdump honour HEAPDUMP_SAMPLE_INTERVAL? Looks at the profile's comments."""
    tmp = tempfile.mkdtemp(prefix="heapdump-bench-", dir=shm_dir())
    try:
        env = dict(base_env(), LD_PRELOAD=SHIM, HEAPDUMP_DIR=tmp,
                   HEAPDUMP_SAMPLE_INTERVAL=str(SAMPLE_INTERVAL))
        p, _ = hold_start(hold_exe, 20000, env, timeout)
        try:
            out = os.path.join(tmp, "check.pb.gz")
            r = run_measured([HEAPDUMP, "snapshot", "--by-pid", str(p.pid), "-o", out],
                             env, tmp, timeout)
            if not r.ok:
                return False, "snapshot failed: " + r.error
            with gzip.open(out) as f:
                data = f.read()
            if b"sampled: one byte in" in data:
                return True, None
            return False, "profile comments show no sampling"
        finally:
            hold_stop(p)
    except (RuntimeError, OSError) as e:
        return False, str(e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def unwind_option_in_source():
    """True if this checkout's shim reads HEAPDUMP_UNWIND (CFI vs frame-pointer unwinding)."""
    for path in glob.glob(os.path.join(REPO, "instrumentation", "src", "*.rs")):
        try:
            with open(path, errors="replace") as f:
                if "HEAPDUMP_UNWIND" in f.read():
                    return True
        except OSError:
            pass
    return False


def shm_dir():
    """Where to put region directories: tmpfs /dev/shm (as in real use) when there."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def setup_peers(args, exes):
    """Decide which peers run. Returns (peers dict, list of notes for the report)."""
    notes = []
    missing = []
    if not shutil.which("heaptrack"):
        missing.append("heaptrack")
    if not find_jemalloc():
        missing.append("libjemalloc2")
    msg = install_missing(missing, not args.no_install)
    if msg:
        notes.append(msg)
        log(msg)

    jemalloc = find_jemalloc()
    peers = make_peers(jemalloc)
    env = base_env()
    probe = [exes["workload"], "1", "2000"]

    # heaptrack
    if not shutil.which("heaptrack"):
        peers["heaptrack"].available = False
        peers["heaptrack"].skip_reason = "heaptrack not installed"
    else:
        with tempfile.TemporaryDirectory(prefix="heapdump-bench-") as tmp:
            argv, e = peers["heaptrack"].wrap(probe, env, tmp)
            r = run_measured(argv, e, tmp, args.timeout)
            if not r.ok:
                peers["heaptrack"].available = False
                peers["heaptrack"].skip_reason = "heaptrack does not work here: " + r.error

    # jemalloc, and whether it was built with profiling
    jem_keys = ("jemalloc", "jemalloc-prof", "jemalloc-prof-512k")
    if not jemalloc:
        for k in jem_keys:
            peers[k].available = False
            peers[k].skip_reason = "libjemalloc2 not installed"
    else:
        with tempfile.TemporaryDirectory(prefix="heapdump-bench-") as tmp:
            argv, e = peers["jemalloc"].wrap(probe, env, tmp)
            r = run_measured(argv, e, tmp, args.timeout)
            if not r.ok:
                for k in jem_keys:
                    peers[k].available = False
                    peers[k].skip_reason = "jemalloc does not work here: " + r.error
            else:
                argv, e = peers["jemalloc-prof"].wrap(probe, env, tmp)
                r = run_measured(argv, e, tmp, args.timeout)
                if "Invalid conf pair" in r.stderr:
                    for k in jem_keys[1:]:
                        peers[k].available = False
                        peers[k].skip_reason = "jemalloc built without profiling"
                elif not r.ok:
                    for k in jem_keys[1:]:
                        peers[k].available = False
                        peers[k].skip_reason = "jemalloc prof fails: " + r.error

    # heapdump's unwinder choice (CFI by default, frame pointers with HEAPDUMP_UNWIND=fp): the
    # shim matches variable names inline, so look for the variable in this checkout's source.
    if not unwind_option_in_source():
        peers["heapdump-fp"].available = False
        peers["heapdump-fp"].skip_reason = "this heapdump has no HEAPDUMP_UNWIND"

    # heapdump sampling: run the row anyway, but say so if the profile shows no sampling.
    ok, why = check_sampling(exes["hold"], args.timeout)
    if not ok:
        peers["heapdump-sampled"].note = (f"HEAPDUMP_SAMPLE_INTERVAL={SAMPLE_INTERVAL} seems "
                                          f"unsupported ({why}); the row was measured anyway")

    for p in peers.values():
        if not p.available:
            notes.append(f"{p.name}: skipped — {p.skip_reason}")
            log(f"skip {p.name}: {p.skip_reason}")
        if p.note:
            notes.append(f"{p.name}: {p.note}")
    return peers, notes


# --------------------------------------------------------------------------------------------
# A/B rounds and their summary
# --------------------------------------------------------------------------------------------

ELAPSED_RE = re.compile(r"threads=(\d+) ops=(\d+) elapsed=([0-9.]+)")


def measure_peer(peer, argv, args):
    """One run of argv under peer, in a fresh temporary directory."""
    tmp = tempfile.mkdtemp(prefix="heapdump-bench-", dir=shm_dir())
    try:
        a, e = peer.wrap(argv, base_env_for(argv), tmp)
        return run_measured(a, e, tmp, args.timeout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def base_env_for(argv):
    """The base environment (CPython keeps its default allocator, pymalloc)."""
    return base_env()


def ab_rounds(configs, peer_keys, peers, args, label):
    """Run every (config, peer) pair once per round, each peer run paired with a baseline run
    just before it. The peer order rotates each round so no peer always runs first.

    configs: list of (config_name, argv). Returns {(config, key): [(baseline, peer), …]}.
    """
    keys = [k for k in peer_keys if peers[k].available and k != "baseline"]
    pairs = {}
    for rnd in range(args.rounds):
        order = keys[rnd % len(keys):] + keys[:rnd % len(keys)] if keys else []
        for cfg, argv in configs:
            for k in order:
                b = measure_peer(peers["baseline"], argv, args)
                x = measure_peer(peers[k], argv, args)
                pairs.setdefault((cfg, k), []).append((b, x))
                log(f"{label} round {rnd + 1}/{args.rounds} {cfg}: {peers[k].name}: "
                    f"baseline {b!r} vs {x!r}")
    return pairs


def fmt_ratio(v):
    return f"{v:.2f}" if v is not None else "—"


def summarize(pairs, cfg, key):
    """Medians for one row: (wall ratio, cpu ratio, peak RSS MiB, error or None, n failed)."""
    runs = pairs.get((cfg, key), [])
    good = [(b, x) for b, x in runs if b.ok and x.ok]
    failed = [x.error if not x.ok else "baseline: " + b.error for b, x in runs
              if not (b.ok and x.ok)]
    if not good:
        return None, None, None, (failed[0] if failed else "not run"), len(failed)
    wall = statistics.median(x.wall / b.wall for b, x in good)
    cpu = statistics.median(x.cpu / b.cpu for b, x in good)
    rss = statistics.median(x.maxrss_kib for _, x in good) / 1024
    return wall, cpu, rss, (failed[0] if failed else None), len(failed)


def overhead_table(pairs, configs, peer_keys, peers):
    """The Markdown table | peer | threads | wall × | CPU × | peak RSS MiB |, plus notes."""
    lines = ["| peer | threads | wall × | CPU × | peak RSS MiB |",
             "|---|---|---|---|---|"]
    notes = []
    for cfg, _ in configs:
        # Baseline row: the ratio is 1 by definition; RSS from all its runs.
        base_runs = [b for k in peer_keys for b, _ in pairs.get((cfg, k), []) if b.ok]
        if base_runs:
            rss = statistics.median(b.maxrss_kib for b in base_runs) / 1024
            lines.append(f"| {peers['baseline'].name} | {cfg} | 1.00 | 1.00 | {rss:.0f} |")
            notes.append(f"baseline, {cfg} thread(s): median wall "
                         f"{statistics.median(b.wall for b in base_runs):.3f} s, CPU "
                         f"{statistics.median(b.cpu for b in base_runs):.3f} s "
                         f"({len(base_runs)} runs)")
        for k in peer_keys:
            if k == "baseline":
                continue
            p = peers[k]
            if not p.available:
                lines.append(f"| {p.name} | {cfg} | skipped: {p.skip_reason} | | |")
                continue
            wall, cpu, rss, err, nfail = summarize(pairs, cfg, k)
            if wall is None:
                lines.append(f"| {p.name} | {cfg} | failed: {err} | | |")
                continue
            lines.append(f"| {p.name} | {cfg} | {fmt_ratio(wall)} | {fmt_ratio(cpu)} | {rss:.0f} |")
            if err:
                notes.append(f"{p.name}, {cfg} thread(s): {nfail} run(s) failed: {err}")
    return lines, notes


def scaling_lines(pairs, peer_keys, peers):
    """Throughput at 2 threads / at 1 thread, from the workload's own timing of its operation
    phase (so start-up is not counted), medians over all runs."""
    def throughput(res):
        m = ELAPSED_RE.search(res.stdout) if res.ok else None
        if not m:
            return None
        t, ops, el = int(m.group(1)), int(m.group(2)), float(m.group(3))
        return t * ops / el if el > 0 else None

    def runs_of(key, cfg):
        if key == "baseline":  # every baseline run of every pair counts
            return [b for k in peer_keys for b, _ in pairs.get((cfg, k), [])]
        return [x for _, x in pairs.get((cfg, key), [])]

    lines = ["| peer | ops/s, 1 thread | ops/s, 2 threads | scaling 2 / 1 |", "|---|---|---|---|"]
    for key in peer_keys:
        if not peers[key].available:
            continue
        t1 = [t for t in map(throughput, runs_of(key, "1")) if t]
        t2 = [t for t in map(throughput, runs_of(key, "2")) if t]
        if not t1 or not t2:
            lines.append(f"| {peers[key].name} | — | — | — |")
            continue
        m1, m2 = statistics.median(t1), statistics.median(t2)
        lines.append(f"| {peers[key].name} | {m1 / 1e6:.3f} M | {m2 / 1e6:.3f} M | "
                     f"{m2 / m1:.2f} |")
    return lines


# --------------------------------------------------------------------------------------------
# Snapshot speed and memory
# --------------------------------------------------------------------------------------------

def snapshot_bench(hold_exe, sizes, args):
    """Table rows for the snapshot benchmark, one per number of blocks."""
    header = ["| blocks | snapshot s | snapshot peak RSS MiB | --with-tags s | "
              "--with-tags peak RSS MiB | region B/block | target VmHWM MiB, no shim | "
              "target VmHWM MiB, heapdump | time to allocate s, no shim / heapdump | "
              "target B per live block, heapdump / address index (HEAPDUMP_BLOCK_HEADERS=0) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    notes = []
    reps = max(1, min(args.rounds, 3))
    for n in sizes:
        label = f"{n / 1e6:g} M"
        log(f"snapshot: {label} blocks")
        try:
            # Without the shim: the target's own footprint.
            p, ready_bare = hold_start(hold_exe, n, base_env(), args.timeout)
            try:
                hwm_bare = proc_status_kib(p.pid, "VmHWM")
            finally:
                hold_stop(p)

            # The record number kept in the private address index instead of a block header
            # (issue 20's design comparison): only the target's memory.
            tmp = tempfile.mkdtemp(prefix="heapdump-bench-", dir=shm_dir())
            try:
                env = dict(base_env(), LD_PRELOAD=SHIM, HEAPDUMP_DIR=tmp,
                           HEAPDUMP_BLOCK_HEADERS="0")
                p, _ = hold_start(hold_exe, n, env, args.timeout)
                try:
                    hwm_index = proc_status_kib(p.pid, "VmHWM")
                finally:
                    hold_stop(p)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

            tmp = tempfile.mkdtemp(prefix="heapdump-bench-", dir=shm_dir())
            try:
                env = dict(base_env(), LD_PRELOAD=SHIM, HEAPDUMP_DIR=tmp)
                p, ready_hd = hold_start(hold_exe, n, env, args.timeout)
                try:
                    hwm_hd = proc_status_kib(p.pid, "VmHWM")
                    regions = glob.glob(os.path.join(tmp, f"{p.pid}-*.heapdump"))
                    if len(regions) != 1:
                        raise RuntimeError(f"expected one region for pid {p.pid}, found "
                                           f"{len(regions)}")
                    # Allocated blocks of the sparse file: the same number as `du -B1`.
                    region_bytes = os.stat(regions[0]).st_blocks * 512
                    results = {}
                    for tags in (False, True):
                        runs = []
                        for i in range(reps):
                            out = os.path.join(tmp, f"s{int(tags)}{i}.pb.gz")
                            argv = [HEAPDUMP, "snapshot", "--by-pid", str(p.pid), "-o", out]
                            if tags:
                                argv.append("--with-tags")
                            r = run_measured(argv, env_without_preload(env), tmp, args.timeout)
                            log(f"  snapshot{' --with-tags' if tags else ''}: {r!r}")
                            runs.append(r)
                            if r.ok and i == 0:
                                notes.append(f"{label} blocks: profile "
                                             f"{'with' if tags else 'without'} tags is "
                                             f"{os.path.getsize(out) / 1024:.0f} KiB")
                            if os.path.exists(out):
                                os.unlink(out)
                        results[tags] = runs
                finally:
                    hold_stop(p)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

            def cell(runs):
                good = [r for r in runs if r.ok]
                if not good:
                    return f"failed: {runs[0].error}", ""
                return (f"{statistics.median(r.wall for r in good):.2f}",
                        f"{statistics.median(r.maxrss_kib for r in good) / 1024:.0f}")

            s_t, s_m = cell(results[False])
            t_t, t_m = cell(results[True])
            rows.append(f"| {label} | {s_t} | {s_m} | {t_t} | {t_m} | {region_bytes / n:.1f} | "
                        f"{hwm_bare / 1024:.0f} | {hwm_hd / 1024:.0f} | "
                        f"{ready_bare:.2f} / {ready_hd:.2f} | "
                        f"{(hwm_hd - hwm_bare) * 1024 / n:.1f} / "
                        f"{(hwm_index - hwm_bare) * 1024 / n:.1f} |")
        except (RuntimeError, OSError) as e:
            rows.append(f"| {label} | failed: {e} | | | | | | | | |")
    return header + rows, notes


def latency_bench(exe, args, hold=None, threads=1):
    """p50/p99/p99.9 of a target's free+malloc latency in alternating phases without and with
    back-to-back snapshots: `hold` live blocks (default --latency-blocks) split among `threads`
    replacing threads (bench/latency.c's THREADS), percentiles over all threads' samples.
    Returns (table lines, notes)."""
    hold = args.latency_blocks if hold is None else hold
    seconds, rounds = 2.0, max(3, args.rounds)
    tmp = tempfile.mkdtemp(prefix="heapdump-bench-", dir=shm_dir())
    env = dict(base_env(), LD_PRELOAD=SHIM, HEAPDUMP_DIR=tmp)
    argv = [exe, str(hold), str(seconds)] + ([str(threads)] if threads != 1 else [])
    p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    phases = {"quiet": [], "snap": []}
    snaps = []

    def read_line(timeout):
        r, _, _ = select.select([p.stdout], [], [], timeout)
        return p.stdout.readline().decode() if r else None

    try:
        line = read_line(args.timeout)
        if not line or not line.startswith("ready "):
            raise RuntimeError(f"latency: not ready: {line!r}")
        for _ in range(rounds):
            for phase in ("quiet", "snap"):
                p.stdin.write(f"run {phase}\n".encode())
                p.stdin.flush()
                taken = 0
                result = None
                while result is None:
                    if phase == "snap":
                        out = os.path.join(tmp, "s.pb.gz")
                        r = subprocess.run([HEAPDUMP, "snapshot", "--by-pid", str(p.pid), "-o",
                                            out], env=env_without_preload(env),
                                           capture_output=True, timeout=args.timeout)
                        if r.returncode != 0:
                            raise RuntimeError("snapshot failed: " + _tail(r.stderr.decode()))
                        taken += 1
                        result = read_line(0)
                    else:
                        result = read_line(args.timeout)
                    if result == "":
                        raise RuntimeError("latency exited: " + _tail(p.stderr.read().decode()))
                f = dict(kv.split("=") for kv in result.split()[1:])
                phases[phase].append({k: int(v) for k, v in f.items()})
                if phase == "snap":
                    snaps.append(taken)
        p.stdin.write(b"quit\n")
        p.stdin.flush()
    finally:
        hold_stop(p)
        shutil.rmtree(tmp, ignore_errors=True)
    rows = ["| phase | replacements | p50 ns | p99 ns | p99.9 ns | max ns |", "|---|---|---|---|---|---|"]
    med = {}
    for phase, runs in phases.items():
        m = {k: statistics.median(r[k] for r in runs) for k in ("n", "p50", "p99", "p999", "max")}
        med[phase] = m
        label = "no snapshot" if phase == "quiet" else "snapshots back to back"
        rows.append(f"| {label} | {m['n']:.0f} | {m['p50']:.0f} | {m['p99']:.0f} | "
                    f"{m['p999']:.0f} | {m['max']:.0f} |")
    notes = [f"p99 during snapshots / without: {med['snap']['p99'] / med['quiet']['p99']:.2f}; "
             f"p50: {med['snap']['p50'] / med['quiet']['p50']:.2f}",
             f"snapshots taken per {seconds:g} s phase: {', '.join(map(str, snaps))}"]
    return rows, notes


def footprint_bench(nop_exe, args):
    """Peak RSS (VmHWM, KiB) of a program that allocates almost nothing, without and with the
    shim, read from /proc while it waits (wait4's ru_maxrss would include the harness's own
    pages from before exec)."""
    def hwm(env):
        vals = []
        for _ in range(max(3, args.rounds)):
            p, _ = hold_start(nop_exe, 0, env, args.timeout)
            try:
                vals.append(proc_status_kib(p.pid, "VmHWM"))
            finally:
                hold_stop(p)
        return statistics.median(vals)
    tmp = tempfile.mkdtemp(prefix="heapdump-bench-", dir=shm_dir())
    try:
        bare = hwm(base_env())
        hd = hwm(dict(base_env(), LD_PRELOAD=SHIM, HEAPDUMP_DIR=tmp))
        hd_fp = hwm(dict(base_env(), LD_PRELOAD=SHIM, HEAPDUMP_DIR=tmp, HEAPDUMP_UNWIND="fp"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return bare, hd, hd_fp


def env_without_preload(env):
    """The collector runs without the shim, but with the same HEAPDUMP_DIR."""
    e = dict(env)
    e.pop("LD_PRELOAD", None)
    e.pop("HEAPDUMP_SAMPLE_INTERVAL", None)
    return e


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def machine_lines():
    out = []
    out.append(f"- date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}")
    out.append(f"- nproc: {os.cpu_count()}; load average at start: "
               f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    out.append(f"- CPU: {cpu or platform.processor() or 'unknown'}; kernel {platform.release()}; "
               f"glibc {platform.libc_ver()[1] or '?'}")
    vers = []
    for pkg in ("heaptrack", "libjemalloc2", "python3.11"):
        r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True,
                           text=True)
        if r.returncode == 0 and r.stdout:
            vers.append(f"{pkg} {r.stdout}")
    if vers:
        out.append("- peers: " + ", ".join(vers))
    return out


def section_c(args, exes, peers, threads, c_keys):
    """The C workload at each thread count against every peer, and the thread scaling."""
    configs = [(t, [exes["workload"], t, str(args.ops)]) for t in threads]
    pairs = ab_rounds(configs, c_keys, peers, args, "C")
    table, notes = overhead_table(pairs, configs, c_keys, peers)
    out = [f"## C workload (bench/workload.c, {args.ops} ops per thread, {args.rounds} rounds)",
           "",
           "Median over rounds of peer / baseline run just before it (same round); peak RSS is "
           "wait4's ru_maxrss (largest process of the tree), median.", ""]
    out += table + [""] + [f"- {n}" for n in notes] + [""]
    if "1" in threads and "2" in threads:
        out += ["### Thread scaling (throughput of all threads, operation phase only)", ""]
        out += scaling_lines(pairs, c_keys, peers) + [""]
    return out


def setup_memray(py, peer):
    """memray in a venv of `py` (made once, `pip install memray`); marks `peer` unavailable
    with the reason when that fails."""
    try:
        if not os.path.exists(MEMRAY_PY):
            subprocess.run([py, "-m", "venv", MEMRAY_VENV], check=True, capture_output=True,
                           timeout=300)
        r = subprocess.run([MEMRAY_PY, "-m", "memray", "--version"], capture_output=True)
        if r.returncode != 0:
            subprocess.run([MEMRAY_PY, "-m", "pip", "install", "-q", "memray"], check=True,
                           capture_output=True, timeout=600)
            r = subprocess.run([MEMRAY_PY, "-m", "memray", "--version"], capture_output=True,
                               check=True)
        peer.note = "memray " + r.stdout.decode().strip()
    except (OSError, subprocess.SubprocessError) as e:
        peer.available = False
        peer.skip_reason = f"memray could not be installed in {MEMRAY_VENV}: {_tail(str(e))}"


def section_python(args, peers):
    """CPython under baseline, heapdump (CFI and frame-pointer unwinding) and heaptrack."""
    py = python_for_bench(args)
    out = [f"## CPython workload (bench/py_workload.py {args.py_iters}, "
           f"{py or 'no Debian python3'}, pymalloc unless noted, {args.rounds} rounds)", ""]
    if not py:
        return out + ["skipped: Debian's /usr/bin/python3 is missing (apt-get install python3)",
                      ""]
    setup_memray(py, peers["memray"])
    for k in ("heaptrack-pymalloc-off",):
        peers[k].available = peers["heaptrack"].available
        peers[k].skip_reason = peers["heaptrack"].skip_reason
    configs = [("1", [py, os.path.join(BENCH_SRC, "py_workload.py"), str(args.py_iters)])]
    # Default CPython (pymalloc), against the same interpreter without a profiler.
    py_keys = ["baseline", "heapdump", "memray"]
    pairs = ab_rounds(configs, py_keys, peers, args, "Python")
    table, notes = overhead_table(pairs, configs, py_keys, peers)
    out += table + [""] + [f"- {n}" for n in notes] + [""]
    # The same work PY_DEEP Python frames deeper: real programs allocate 20 to 50 frames below
    # their entry point, and a profiler's per-frame costs show there.
    deep = [("1", [py, os.path.join(BENCH_SRC, "py_workload.py"), str(args.py_iters),
                   str(PY_DEEP)])]
    pairs = ab_rounds(deep, py_keys, peers, args, f"Python, {PY_DEEP} frames deeper")
    table, notes = overhead_table(pairs, deep, py_keys, peers)
    out += [f"The same work {PY_DEEP} Python frames deeper (`py_workload.py {args.py_iters} "
            f"{PY_DEEP}`), pymalloc:", ""]
    out += table + [""] + [f"- {n}" for n in notes] + [""]
    # PYTHONMALLOC=malloc (every object through malloc): against the same interpreter, also
    # with PYTHONMALLOC=malloc, without a profiler. (Until 2026-11-25 these rows were divided
    # by the pymalloc baseline above, which charged the profiler with glibc's malloc being
    # slower than pymalloc: about 1.25x of the ratio.)
    malloc_peers = dict(peers)
    malloc_peers["baseline"] = Peer("baseline (glibc), PYTHONMALLOC=malloc",
                                    lambda argv, env, tmp: (argv, dict(env, PYTHONMALLOC="malloc")))
    malloc_keys = ["baseline", "heapdump-pymalloc-off", "heapdump-index-pymalloc-off",
                   "heaptrack-pymalloc-off"]
    pairs = ab_rounds(configs, malloc_keys, malloc_peers, args, "Python, PYTHONMALLOC=malloc")
    table, notes = overhead_table(pairs, configs, malloc_keys, malloc_peers)
    out += ["PYTHONMALLOC=malloc: every object goes through malloc; ratios to the same "
            "interpreter with PYTHONMALLOC=malloc and no profiler.", ""]
    return out + table + [""] + [f"- {n}" for n in notes] + [""]


def throughput_lines(pairs, configs, peer_keys, peers):
    """Operation-phase throughput per peer and thread count (the workload's own timing, so
    start-up is not counted), and its ratio to the baseline's: medians over all runs."""
    def tput(res):
        m = ELAPSED_RE.search(res.stdout) if res.ok else None
        if not m:
            return None
        t, ops, el = int(m.group(1)), int(m.group(2)), float(m.group(3))
        return t * ops / el if el > 0 else None

    lines = ["| peer | threads | ops/s (operation phase) | × baseline's |", "|---|---|---|---|"]
    for cfg, _ in configs:
        base = [t for k in peer_keys for b, _ in pairs.get((cfg, k), []) for t in [tput(b)] if t]
        mb = statistics.median(base) if base else None
        if mb:
            lines.append(f"| {peers['baseline'].name} | {cfg} | {mb / 1e6:.3f} M | 1.00 |")
        for k in peer_keys:
            if k == "baseline" or not peers[k].available:
                continue
            xs = [t for _, x in pairs.get((cfg, k), []) for t in [tput(x)] if t]
            if not xs:
                lines.append(f"| {peers[k].name} | {cfg} | — | — |")
                continue
            m = statistics.median(xs)
            lines.append(f"| {peers[k].name} | {cfg} | {m / 1e6:.3f} M | "
                         f"{m / mb:.2f} |" if mb else f"| {peers[k].name} | {cfg} | "
                         f"{m / 1e6:.3f} M | — |")
    return lines


def section_storm(args, exes, peers, threads, c_keys):
    """The malloc/free storm (bench/storm.c) at each thread count against every peer."""
    configs = [(t, [exes["storm"], t, str(args.storm_ops)]) for t in threads]
    pairs = ab_rounds(configs, c_keys, peers, args, "storm")
    table, notes = overhead_table(pairs, configs, c_keys, peers)
    out = [f"## Malloc/free storm (bench/storm.c, {args.storm_ops} ops per thread, 10,000 live "
           f"blocks per thread, {args.rounds} rounds)", "",
           "81% malloc/free pairs of 8 B–64 KiB (log-uniform), 2% reallocs, 17% writes, through "
           "16 call paths 2–24 frames deep. Whole-process CPU and wall as peer / baseline run "
           "just before it (goal of issue 11: CPU ≤ 1.5× at 1 and 2 threads, full CFI stacks), "
           "then the operation phase's throughput, which start-up does not count.", ""]
    out += table + [""] + [f"- {n}" for n in notes] + [""]
    out += ["### Operation-phase throughput", ""]
    out += throughput_lines(pairs, configs, c_keys, peers) + [""]
    return out


# Components of the shim's cost, by the symbol perf attributes a sample to (code inlined into a
# function counts as that function's): (component, regex over "dso symbol"), first match wins.
WHERE_COMPONENTS = [
    ("CFI walk", r"libheapdump\.so .*(dwarf::|_Unwind)"),
    ("frame-pointer walk", r"libheapdump\.so .*unwind::walk"),
    ("address index", r"libheapdump\.so .*index::"),
    ("interning (hash, cache, stack table)", r"libheapdump\.so .*(intern|stacks::|hash_frames|stack_equals|append_stack)"),
    ("record + node (insert/erase, writer, nodes)", r"libheapdump\.so .*(hooks::insert|hooks::erase|writer::|nodes::|take_node|recycle_node|retire)"),
    ("TLS access", r"(__tls_get_addr|LocalKey|tls_|_dl_tlsdesc)"),
    ("exported malloc/free (marks, guard, prefetches)",
     r"libheapdump\.so (malloc|free|realloc|calloc|cfree|posix_memalign|aligned_alloc|memalign|"
     r"heapdump::\w+)$"),
    ("rest of the shim", r"libheapdump\.so "),
]
WHERE_PERIOD_NS = 100000  # perf record -e cpu-clock -c 100000: one sample per 100 µs of CPU (a shorter period slows the run itself down: 50 kHz cost 2.5× here)
WHERE_SAMPLE_RE = re.compile(r"^\s*([0-9.]+)%\s+(\d+)\s+(\S+)\s+\[[.k]\]\s+(.*)$")


def perf_profile(argv, env, tmp):
    """perf record one run of argv (cpu-clock, fixed period). Returns ({(dso, sym): samples},
    error or None)."""
    data = os.path.join(tmp, "perf.data")
    r = run_measured(["perf", "record", "-q", "-e", "cpu-clock", "-c", str(WHERE_PERIOD_NS),
                      "-o", data, "--"] + list(argv), env, REPO, 600)
    if not r.ok:
        return None, r.error
    rep = subprocess.run(["perf", "report", "-i", data, "--no-children", "-n", "--sort", "dso,sym",
                          "--stdio"], capture_output=True, text=True, timeout=300)
    if rep.returncode != 0:
        return None, "perf report failed: " + _tail(rep.stderr)
    samples = {}
    for line in rep.stdout.splitlines():
        m = WHERE_SAMPLE_RE.match(line)
        if m:
            samples[(m.group(3), m.group(4).strip())] = int(m.group(2))
    return samples, None


def where_components(samples):
    """Samples per component (WHERE_COMPONENTS, then glibc's allocator, the kernel, the
    program and the rest)."""
    comp = {}
    shim = os.path.basename(SHIM)
    for (dso, sym), n in samples.items():
        if dso == shim:
            dso = "libheapdump.so"  # a build measured with --shim under another name
        key = None
        text = f"{dso} {sym}"
        for name, rx in WHERE_COMPONENTS:
            if re.search(rx, text):
                key = name
                break
        if key is None:
            if dso.startswith("libc.so"):
                key = "glibc"
            elif "kernel" in dso:
                key = "kernel"
            elif dso in ("storm",):
                key = "program"
            else:
                key = "other"
        comp[key] = comp.get(key, 0) + n
    return comp


def section_where(args, exes, peers):
    """Where the time goes: ns per malloc/free pair by component, from perf record on the
    storm (1 thread) at 100 and 10,000 live blocks, bare and under heapdump (CFI)."""
    title = "## Where the time goes (bench/storm.c, 1 thread, perf record)"
    if not shutil.which("perf"):
        return [title, "", "skipped: where: perf is not installed (apt-get install linux-perf)", ""]
    ops = max(args.storm_ops // 2, 1000)
    # Pairs: 81% of the operations are a free + malloc, 2% a realloc (counted as one pair).
    pairs = ops * 0.83
    lines = [title, "",
             f"Each configuration runs {ops} and {2 * ops} operations on one thread under `perf "
             f"record -e cpu-clock -c {WHERE_PERIOD_NS}`, bare and under heapdump (CFI stacks); "
             "the difference between the two lengths is the cost of "
             f"{ops} operations (≈{pairs:.0f} malloc/free pairs) without start-up, the initial "
             f"fill or exit. {args.rounds} round(s), medians. A component is the set of "
             "functions perf names (code inlined into a function counts as that function's); "
             "ns per pair = samples × period / pairs. For glibc, the kernel and the program the "
             "cell is the run under heapdump minus the bare run: what the shim's memory "
             "traffic costs them (cache misses on glibc's chunk headers, page faults). The "
             "exported functions' row holds the load of the word before the block in `free` "
             "(a header or glibc's chunk size): the cache miss that glibc's own `free` takes "
             "in the bare run, so glibc's row is net of it.", ""]
    order = [n for n, _ in WHERE_COMPONENTS] + ["glibc", "kernel", "program", "other"]
    table = {}
    for live in (100, 10000):
        per = {"baseline": [], "heapdump": []}
        for _ in range(args.rounds):
            for key in ("baseline", "heapdump"):
                runs = []
                for n in (ops, 2 * ops):
                    argv = [exes["storm"], "1", str(n), str(live)]
                    with tempfile.TemporaryDirectory(prefix="heapdump-where-") as tmp:
                        a, e = peers[key].wrap(argv, base_env(), tmp)
                        samples, err = perf_profile(a, e, tmp)
                    if samples is None:
                        return [title, "", f"skipped: where: perf record failed: {err}", ""]
                    runs.append(where_components(samples))
                short, long_ = runs
                per[key].append({c: long_.get(c, 0) - short.get(c, 0)
                                 for c in set(short) | set(long_)})

        def ns(key, comp):
            return statistics.median(c.get(comp, 0) for c in per[key]) * WHERE_PERIOD_NS / pairs
        col = {}
        for comp in order:
            if comp in ("glibc", "kernel", "program", "other"):
                col[comp] = ns("heapdump", comp) - ns("baseline", comp)
            else:
                col[comp] = ns("heapdump", comp)
        col["total added"] = (statistics.median(sum(c.values()) for c in per["heapdump"]) -
                              statistics.median(sum(c.values()) for c in per["baseline"])) \
            * WHERE_PERIOD_NS / pairs
        col["bare run (glibc + program)"] = statistics.median(
            sum(c.values()) for c in per["baseline"]) * WHERE_PERIOD_NS / pairs
        table[live] = col
    lines += ["| component | ns per pair, 100 live blocks | ns per pair, 10,000 live blocks |",
              "|---|---|---|"]
    for comp in order + ["total added", "bare run (glibc + program)"]:
        a, b = table[100].get(comp, 0.0), table[10000].get(comp, 0.0)
        if comp in ("glibc", "kernel", "program", "other", "total added"):
            lines.append(f"| {comp} | {a:+.1f} | {b:+.1f} |")
        else:
            lines.append(f"| {comp} | {a:.1f} | {b:.1f} |")
    return lines + [""]


PHASES_RE = re.compile(r"alloc=([0-9.]+) free=([0-9.]+)")


def section_phases(args, exes, peers):
    """Allocation-only then free-only phases on 8 threads (bench/phases.c)."""
    keys = ["baseline", "heapdump", "heapdump-index", "heapdump-sampled"]
    configs = [("8", [exes["phases"], "8", str(args.phase_blocks)])]
    pairs = ab_rounds(configs, keys, peers, args, "phases")

    def phase(res, i):
        m = PHASES_RE.search(res.stdout) if res.ok else None
        return float(m.group(i)) if m else None

    lines = ["| peer | allocation phase s | free phase s | throughput × baseline's | CPU × |",
             "|---|---|---|---|---|"]
    base = [b for k in keys for b, _ in pairs.get(("8", k), []) if b.ok]
    if base:
        ba = statistics.median(phase(b, 1) for b in base)
        bf = statistics.median(phase(b, 2) for b in base)
        lines.append(f"| {peers['baseline'].name} | {ba:.3f} | {bf:.3f} | 1.00 | 1.00 |")
        for k in keys[1:]:
            if not peers[k].available:
                continue
            runs = [(b, x) for b, x in pairs.get(("8", k), []) if b.ok and x.ok]
            if not runs:
                lines.append(f"| {peers[k].name} | failed | | | |")
                continue
            a = statistics.median(phase(x, 1) for _, x in runs)
            f = statistics.median(phase(x, 2) for _, x in runs)
            cpu = statistics.median(x.cpu / b.cpu for b, x in runs)
            lines.append(f"| {peers[k].name} | {a:.3f} | {f:.3f} | {(ba + bf) / (a + f):.2f} | "
                         f"{cpu:.2f} |")
    return [f"## Allocation-only phases (bench/phases.c: 8 threads × {args.phase_blocks} blocks "
            f"of 16–256 B allocated, then all freed; {args.rounds} rounds)", "",
            "Phase times from the program (first thread starting to last one done), medians; "
            "throughput = baseline's (allocation + free) time / the peer's. Goal of issue 11: "
            "≥ 0.6× (0.8×), and no lock shared by all threads on either path.", ""] + lines + [""]


def section_snapshot(args, exes):
    """Snapshot speed and memory at --blocks (and 10 M with --big)."""
    sizes = [args.blocks] + ([10_000_000] if args.big and args.blocks != 10_000_000 else [])
    table, notes = snapshot_bench(exes["hold"], sizes, args)
    out = ["## Snapshot speed and memory (bench/hold.c: 16–64 B blocks, 4 call paths)", "",
           f"Median of {max(1, min(args.rounds, 3))} snapshots of the same live process; peak "
           "RSS of the collector from wait4; region bytes = allocated blocks of the sparse "
           "region file (du -B1) / blocks; VmHWM (peak RSS) of the target read from "
           "/proc/PID/status while it waits; time to allocate = start to \"ready\".", ""]
    return out + table + [""] + [f"- {n}" for n in notes] + [""]


def run_sampled(argv, env, cwd, timeout):
    """Runs argv; returns (ok, wall s, peak RssAnon MiB sampled every 10 ms, stderr)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    peak = 0
    err = []
    reader = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    reader.start()
    while p.poll() is None:
        if time.perf_counter() - t0 > timeout:
            p.kill()
            break
        try:
            peak = max(peak, proc_status_kib(p.pid, "RssAnon") or 0)
        except OSError:
            pass
        time.sleep(0.01)
    p.wait()
    wall = time.perf_counter() - t0
    reader.join(5)
    return p.returncode == 0, wall, peak / 1024, "".join(err)


def graph_bench(exe, sizes, args):
    """Table rows for the reference-graph benchmark, one per number of blocks."""
    header = ["| blocks | heap MiB | edges | snapshot s (reference) | capture s | capture peak "
              "MiB (B/block) | file MiB | leaks s | leaks peak MiB | top --retained s | top "
              "peak MiB | leaks FILE s | --stop pause ms |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows, notes = [], []
    for n in sizes:
        label = f"{n / 1e6:g} M"
        log(f"graph: {label} blocks")
        tmp = tempfile.mkdtemp(prefix="heapdump-bench-", dir=shm_dir())
        try:
            env = dict(base_env(), LD_PRELOAD=SHIM, HEAPDUMP_DIR=tmp)
            p, _ = hold_start(exe, n, env, args.timeout)
            try:
                cenv = env_without_preload(env)
                pid = str(p.pid)
                heap = (proc_status_kib(p.pid, "RssAnon") or 0) / 1024

                def run(*a):
                    ok, wall, peak, err = run_sampled([HEAPDUMP, *a], cenv, tmp, args.timeout)
                    log(f"  {' '.join(a)}: ok={ok} {wall:.2f} s, {peak:.0f} MiB")
                    if not ok:
                        raise RuntimeError(f"{' '.join(a)} failed: {_tail(err)}")
                    return wall, peak, err

                cap = os.path.join(tmp, "g.hdsnap")
                snap, _, _ = run("snapshot", "--by-pid", pid, "-o", os.path.join(tmp, "s.pb.gz"))
                cw, cp, cerr = run("graph", "--by-pid", pid, "-o", cap)
                m = re.search(r"(\d+) edges", cerr)
                edges = int(m.group(1)) if m else 0
                lw, lp, _ = run("leaks", "--by-pid", pid)
                tw, tpk, _ = run("top", "--retained", "--by-pid", pid)
                fw, _, _ = run("leaks", cap)
                _, _, serr = run("leaks", "--stop", "--by-pid", pid)
                m = re.search(r"stopped for ([0-9.]+) ms", serr)
                pause = m.group(1) if m else "?"
                rows.append(
                    f"| {label} | {heap:.0f} | {edges / 1e6:.1f} M | {snap:.2f} | {cw:.2f} | "
                    f"{cp:.0f} ({cp * 1048576 / n:.0f}) | {os.path.getsize(cap) / 1048576:.1f} | "
                    f"{lw:.2f} | {lp:.0f} | {tw:.2f} | {tpk:.0f} | {fw:.2f} | {pause} |")
                if n <= 2_000_000:
                    hs = os.path.join(tmp, "g.heapsnapshot")
                    hw, hp, _ = run("graph", "--by-pid", pid, "-o", hs)
                    notes.append(f"{label} blocks: `graph -o FILE.heapsnapshot` {hw:.2f} s, "
                                 f"peak {hp:.0f} MiB, {os.path.getsize(hs) / 1048576:.0f} MiB")
            finally:
                hold_stop(p)
        except (RuntimeError, OSError) as e:
            rows.append(f"| {label} | failed: {e} |" + " |" * 11)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return header + rows, notes


def section_graph(args, exes):
    """The reference graph at --graph-blocks (and 10 M with --big)."""
    sizes = [args.graph_blocks] + ([10_000_000] if args.big and args.graph_blocks != 10_000_000
                                   else [])
    table, notes = graph_bench(exes["graph_hold"], sizes, args)
    out = ["## Reference graph (bench/graph_hold.c: 16–128 B blocks, a quarter of their words "
           "pointing at random blocks)", "",
           "One run each against the same live process (not stopped unless --stop). Peak MiB = "
           "the collector's private memory (RssAnon sampled every 10 ms; the region file it maps "
           "is shared with the target); B/block = that peak / blocks. Goals (issue 9): capture "
           "≤ 1 s at 1 M and ≤ 10 s at 10 M; memory ≤ 48 B per block + 8 B per edge; "
           "leaks and dominators ≤ 10 s more at 10 M.", ""]
    return out + table + [""] + [f"- {n}" for n in notes] + [""]


def section_latency(args, exes):
    """The target's allocation latency while snapshots run, and the shim's fixed footprint."""
    out = [f"## Allocation latency during snapshots (bench/latency.c, {args.latency_blocks} "
           "live blocks, 2 s phases)", "",
           "One thread replaces random live blocks (free + malloc of 16–64 B) and times each "
           "replacement; phases without snapshots alternate with phases during which the "
           "collector snapshots the process back to back. Medians over the phases.", ""]
    rows, notes = latency_bench(exes["latency"], args)
    return out + rows + [""] + [f"- {n}" for n in notes] + [""]


def section_footprint(args, exes):
    """The shim's fixed memory cost."""
    bare, hd, hd_fp = footprint_bench(exes["nop"], args)
    return ["## Fixed footprint (bench/nop.c: a program that allocates almost nothing)", "",
            "Peak RSS (VmHWM) of the waiting program, median of runs.", "",
            "| | peak RSS KiB | overhead KiB |", "|---|---|---|",
            f"| no shim | {bare:.0f} | |",
            f"| heapdump | {hd:.0f} | {hd - bare:.0f} |",
            f"| heapdump, HEAPDUMP_UNWIND=fp | {hd_fp:.0f} | {hd_fp - bare:.0f} |", ""]


def section_rust(args):
    """The #[global_allocator] path: examples/rust-alloc's bench_alloc (HeapdumpAlloc wrapping
    the system allocator). Its baseline is the same binary with HEAPDUMP_DISABLE=1, where the
    wrapper forwards straight to the system allocator."""
    exe = os.path.join(REPO, "target", "release", "bench_alloc")
    out = [f"## Rust workload (examples/rust-alloc/src/bin/bench_alloc.rs, #[global_allocator], "
           f"{args.ops} ops per thread, {args.rounds} rounds)", ""]
    if not os.path.exists(exe):
        return out + [f"skipped: {exe} is missing (cargo build --release)", ""]

    def with_env(**extra):
        def wrap(argv, env, tmp):
            return argv, dict(env, HEAPDUMP_DIR=tmp, **extra)
        return wrap

    rust_peers = {
        "baseline": Peer("baseline (HEAPDUMP_DISABLE=1)", with_env(HEAPDUMP_DISABLE="1")),
        "heapdump": Peer("heapdump", with_env()),
        "heapdump-fp": Peer("heapdump, HEAPDUMP_UNWIND=fp", with_env(HEAPDUMP_UNWIND="fp")),
        "heapdump-sampled": Peer("heapdump sampled 512 KiB",
                                 with_env(HEAPDUMP_SAMPLE_INTERVAL=str(SAMPLE_INTERVAL))),
    }
    keys = list(rust_peers)
    configs = [(t, [exe, t, str(args.ops)]) for t in ["1", "2"]]
    pairs = ab_rounds(configs, keys, rust_peers, args, "Rust")
    table, notes = overhead_table(pairs, configs, keys, rust_peers)
    return out + table + [""] + [f"- {n}" for n in notes] + [""]


def build_churn(cc):
    """Compile examples/c/churn.c (N threads each replacing K live blocks at full speed) into
    target/bench/churn. Returns its path."""
    src = os.path.join(REPO, "examples", "c", "churn.c")
    exe = os.path.join(BUILD_DIR, "churn")
    r = subprocess.run([cc] + CFLAGS + ["-o", exe, src], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"build of {src} failed: {_tail(r.stderr)}")
    return exe


def section_threads(args):
    """Snapshots of a busy and of a stopped many-threaded target (issue 13): the same 160,000
    live blocks held by 2 and by 32 churning threads, the collector privileged (root or
    CAP_SYS_NICE: it runs at nice -10 while it holds the lease) and not (CAP_SYS_NICE dropped
    with setpriv), and the 32 threads stopped with SIGSTOP (read without waiting)."""
    exe = build_churn(args.cc)
    live, size, shots = 160_000, 48, max(5, 2 * args.rounds)
    setpriv = shutil.which("setpriv")
    unpriv = ([setpriv, "--inh-caps=-sys_nice", "--bounding-set=-sys_nice"]
              if setpriv and os.geteuid() == 0 else None)

    go = shutil.which("go")

    def lease_s(profile):
        """The lease time from the profile's comments (`go tool pprof -comments`), or None."""
        if not go:
            return None
        r = subprocess.run([go, "tool", "pprof", "-comments", profile], capture_output=True,
                           text=True)
        m = re.search(r"lease held (\d+) ns", r.stdout)
        return int(m.group(1)) / 1e9 if m else None

    def snapshots(pid, tmp, env, wrap):
        """`shots` snapshots back to back: (wall s list, collector CPU s list, gave up, lease s
        list)."""
        walls, cpus, gave_up, leases = [], [], 0, []
        for i in range(shots):
            out = os.path.join(tmp, f"s{i}.pb.gz")
            t0 = time.perf_counter()
            p = subprocess.Popen(wrap + [HEAPDUMP, "snapshot", "--by-pid", str(pid), "-o", out],
                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            err = p.stderr.read().decode(errors="replace")
            _, status, ru = os.wait4(p.pid, 0)
            walls.append(time.perf_counter() - t0)
            cpus.append(ru.ru_utime + ru.ru_stime)
            if status != 0:
                raise RuntimeError(f"snapshot of pid {pid} failed: {_tail(err)}")
            gave_up += "may be missing" in err
            held = lease_s(out)
            if held is not None:
                leases.append(held)
            os.unlink(out)
        return walls, cpus, gave_up, leases

    def med(v):
        return statistics.median(v) if v else float("nan")

    rows, medians = [], {}
    # With autogroup scheduling (sched_autogroup_enabled), CPU time is first shared between
    # sessions: a target in the collector's own session competes thread for thread with it (the
    # hard case), one in a session of its own (a daemon) gets half the machine as a group.
    for own, threads in ((False, 2), (False, 32), (True, 2), (True, 32)):
        tmp = tempfile.mkdtemp(prefix="heapdump-bench-", dir=shm_dir())
        env = dict(base_env(), LD_PRELOAD=SHIM, HEAPDUMP_DIR=tmp)
        cenv = env_without_preload(env)
        p = subprocess.Popen([exe, str(threads), str(live // threads), str(size)], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=own)
        session = "own" if own else "collector's"
        try:
            line = p.stdout.readline().decode()
            if not line.startswith("ready "):
                raise RuntimeError(f"churn {threads}: unexpected output {line!r}")
            time.sleep(0.5)
            modes = [("privileged", [])] + ([("unprivileged", unpriv)] if unpriv else [])
            for mode, wrap in modes:
                log(f"threads: {threads} threads in the {session} session, {mode}")
                w, c, g, held = snapshots(p.pid, tmp, cenv, wrap)
                medians[(own, threads, mode)] = med(w)
                medians[(own, threads, mode, "lease")] = med(held)
                rows.append(f"| {session} | {threads} × {live // threads} | {mode} | {med(w):.3f} | "
                            f"{max(w):.3f} | {med(held):.3f} | {max(held, default=0):.3f} | "
                            f"{med(c):.3f} | {g}/{shots} |")
            if threads == 32:
                os.kill(p.pid, signal.SIGSTOP)
                time.sleep(0.2)
                log(f"threads: 32 threads in the {session} session, stopped")
                w, c, g, _ = snapshots(p.pid, tmp, cenv, [])
                os.kill(p.pid, signal.SIGCONT)
                medians[(own, threads, "stopped")] = med(w)
                rows.append(f"| {session} | {threads} × {live // threads} | stopped (SIGSTOP) | "
                            f"{med(w):.3f} | {max(w):.3f} | none | none | {med(c):.3f} | "
                            f"{g}/{shots} |")
        finally:
            p.stdin.close()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            shutil.rmtree(tmp, ignore_errors=True)
    notes = []
    for own in (False, True):
        session = "own" if own else "collector's"
        for mode in ("privileged", "unprivileged"):
            if (own, 32, mode) in medians and (own, 2, mode) in medians:
                lease = (medians[(own, 32, mode, "lease")] /
                         medians[(own, 2, mode, "lease")])
                notes.append(f"target in the {session} session, {mode}: 32 threads / 2 threads "
                             f"= {medians[(own, 32, mode)] / medians[(own, 2, mode)]:.1f}× for "
                             f"the whole command (goal ≤ 2×), {lease:.1f}× for the lease")
        if (own, 32, "stopped") in medians:
            notes.append(f"target in the {session} session, stopped, 32 threads: median "
                         f"{medians[(own, 32, 'stopped')]:.3f} s for the whole command (goal ≤ "
                         "0.1 s); stopped / 2 threads running = "
                         f"{medians[(own, 32, 'stopped')] / medians[(own, 2, 'privileged')]:.1f}×")
    if not unpriv:
        notes.append("unprivileged runs skipped: needs root and setpriv to drop CAP_SYS_NICE")
    out = [f"## Snapshots of many threads (examples/c/churn.c: {live} live {size} B blocks "
           "replaced at full speed)", "",
           f"{shots} `heapdump snapshot` runs back to back against one live process; wall time "
           "of the whole command (snapshot, symbolization, profile) and the collector's CPU time "
           "(wait4). Privileged: root (the collector raises its thread to nice -10 while it "
           "holds the lease); unprivileged: the same with CAP_SYS_NICE dropped (setpriv), at "
           "nice 0. Lease = how long the target could not recycle records (from the profile's "
           "comments, with `go tool pprof`). \"gave up\" = snapshots that warned of operations "
           "in flight given up on.",
           "Target's session: the collector's own (same autogroup: it competes with each of "
           "the target's threads) or one of its own (a daemon's case).",
           "", "| target's session | threads × blocks | collector | median s | max s | lease "
           "median s | lease max s | CPU s | gave up |",
           "|---|---|---|---|---|---|---|---|---|"]
    return out + rows + [""] + [f"- {n}" for n in notes] + [""]


NODE_CURSOR_OFFSET = 192  # the region header's node_cursor (layout v1): records handed out


def region_node_cursor(path):
    """Records handed out so far in a region file (its header's node_cursor, a little-endian
    u64): the high-water of the allocations table, never lowered."""
    with open(path, "rb") as f:
        f.seek(NODE_CURSOR_OFFSET)
        return int.from_bytes(f.read(8), "little")


def continuous_watch(exe, args, threads, per_thread, size, own):
    """Goal 3 of issue 13: `heapdump watch --every 1s` for --continuous-seconds against a churn
    target (threads × per_thread live blocks), in the collector's session or (own) in one of
    its own. Returns a dict of what was measured."""
    secs = args.continuous_seconds
    live = threads * per_thread
    tmp = tempfile.mkdtemp(prefix="heapdump-bench-", dir=shm_dir())
    outdir = tempfile.mkdtemp(prefix="heapdump-bench-watch-", dir=shm_dir())
    env = dict(base_env(), LD_PRELOAD=SHIM, HEAPDUMP_DIR=tmp)
    p = subprocess.Popen([exe, str(threads), str(per_thread), str(size)], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=own)
    try:
        line = p.stdout.readline().decode()
        if not line.startswith("ready "):
            raise RuntimeError(f"churn {threads}: unexpected output {line!r}")
        time.sleep(0.5)
        regions = glob.glob(os.path.join(tmp, f"{p.pid}-*.heapdump"))
        if len(regions) != 1:
            raise RuntimeError(f"expected one region for pid {p.pid}, found {len(regions)}")
        before = region_node_cursor(regions[0])
        # The watch runs in the harness's session (not run_measured's session of its own), so
        # that "the collector's session" means the same as in the threads section.
        r = subprocess.run([HEAPDUMP, "watch", "--by-pid", str(p.pid), "--every", "1s",
                            "--count", str(secs), "-o", outdir],
                           env=env_without_preload(env), capture_output=True, text=True,
                           timeout=secs + args.timeout)
        after = region_node_cursor(regions[0])
        region_bytes = os.stat(regions[0]).st_blocks * 512
        if r.returncode != 0:
            raise RuntimeError(f"watch failed: {_tail(r.stderr)}")
        # DIR/NAME-PID-YYYYMMDDTHHMMSSZ.pb.gz: the name carries the beat's time (beats are at
        # whole seconds with --every 1s) and the file is written last thing before its rename,
        # so mtime - beat = that snapshot's wall time (snapshot, symbolization, profile).
        shots = []
        for path in sorted(glob.glob(os.path.join(outdir, f"*-{p.pid}-*Z.pb.gz"))):
            m = re.search(r"-(\d{8}T\d{6})Z\.pb\.gz$", path)
            beat = datetime.datetime.strptime(m.group(1), "%Y%m%dT%H%M%S").replace(
                tzinfo=datetime.timezone.utc).timestamp()
            wall = os.stat(path).st_mtime_ns / 1e9 - beat
            with gzip.open(path) as f:
                data = f.read()  # the comments are plain strings of the string table

            def num(pattern):
                m = re.search(pattern, data)
                return int(m.group(1)) if m else None
            shots.append({"wall": wall,
                          "nodes": num(rb"(\d+) nodes scanned"),
                          "waited": num(rb"waited (\d+) ns for in-flight"),
                          "lease": num(rb"lease held (\d+) ns")})
        if not shots:
            raise RuntimeError(f"watch wrote no profiles: {_tail(r.stderr)}")
        m = re.search(r"watch ended: (\d+) beats \((\d+) skipped\), (\d+) files written, "
                      r"(\d+) failures; own CPU time ([\d.]+) s", r.stderr)
        summary = ({"beats": int(m.group(1)), "skipped": int(m.group(2)),
                    "files": int(m.group(3)), "failures": int(m.group(4)),
                    "cpu": float(m.group(5))} if m else None)
        return {"live": live, "before": before, "after": after, "region_bytes": region_bytes,
                "shots": shots, "summary": summary}
    finally:
        p.stdin.close()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(outdir, ignore_errors=True)


def section_continuous(args, exes):
    """Continuous snapshots of a many-threaded target (issue 13, goals 3 and 4): the region's
    high-water and the snapshot times under `heapdump watch --every 1s`, and the target's own
    allocation latency at 32 threads with and without back-to-back snapshots."""
    exe = build_churn(args.cc)
    threads, per_thread, size, secs = 32, 5000, 48, args.continuous_seconds
    live = threads * per_thread
    priv = "root" if os.geteuid() == 0 else "not root (nice 0 throughout)"

    def med(v):
        v = [x for x in v if x is not None]
        return statistics.median(v) if v else float("nan")

    rows, notes = [], []
    for own in (False, True):
        session = "own" if own else "collector's"
        log(f"continuous: watch --every 1s for {secs} s, {threads} threads in the {session} "
            "session")
        try:
            res = continuous_watch(exe, args, threads, per_thread, size, own)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            rows.append(f"| {session} | failed: {e} | | | | | | | | | |")
            continue
        shots = res["shots"]
        k = min(10, max(1, len(shots) // 2))  # first/last k: 10 over a minute, fewer if short
        first, last = shots[:k], shots[-k:]
        per_block = res["after"] / live
        s = res["summary"]
        beats = (f"{s['files']} ({s['skipped']} skipped, {s['failures']} failed)" if s
                 else str(len(shots)))

        def ms(v):
            return f"{v / 1e6:.0f}"
        rows.append(
            f"| {session} | {beats} | {res['before']} → {res['after']} | {per_block:.2f} | "
            f"{res['region_bytes'] / 2**20:.0f} | {shots[0]['nodes']} / {shots[-1]['nodes']} | "
            f"{ms(med(x['lease'] for x in first))} / {ms(med(x['lease'] for x in last))} | "
            f"{ms(med(x['waited'] for x in first))} / {ms(med(x['waited'] for x in last))} | "
            f"{med(x['wall'] for x in first):.3f} / {med(x['wall'] for x in last):.3f} | "
            f"{max(x['wall'] for x in shots):.3f} | "
            f"{s['cpu'] if s else float('nan'):.2f} |")
        lease_ratio = med(x["lease"] for x in last) / med(x["lease"] for x in first)
        wall_ratio = med(x["wall"] for x in last) / med(x["wall"] for x in first)
        notes.append(f"target in the {session} session: {per_block:.2f} records per live block "
                     f"after {len(shots)} snapshots (goal ≤ 2); last {k} / first {k} snapshots: "
                     f"{lease_ratio:.2f}× lease, {wall_ratio:.2f}× wall (flat = 1)")

    log(f"continuous: latency at {threads} threads, {live} live blocks")
    lat_rows, lat_notes = latency_bench(exes["latency"], args, hold=live, threads=threads)
    out = [f"## Continuous snapshots of many threads (examples/c/churn.c: {threads} threads × "
           f"{per_thread} live {size} B blocks replaced at full speed)", "",
           f"`heapdump watch --by-pid PID --every 1s --count {secs}` against one live process, "
           f"collector {priv}. Records = the region header's node_cursor (records ever handed "
           "out: the allocations table's high-water) when the target was ready and after the "
           f"watch; per live block = at the end / {live} (goal of issue 13 ≤ 2); region MiB = "
           "allocated blocks of the sparse region file at the end. From the profiles' comments: "
           "nodes scanned at the first and last snapshot, lease (how long the target could not "
           "recycle records) and the wait for in-flight operations; wall = the profile file's "
           "mtime − its beat (snapshot, symbolization and profile). first / last = medians of "
           f"the first and last 10 snapshots (fewer if under 20). Goal: flat over the minute.",
           "Target's session: the collector's own (same autogroup) or one of its own (a "
           "daemon's case).",
           "", "| target's session | snapshots | records start → end | records / live block | "
           "region MiB | nodes scanned first / last | lease ms first / last | in-flight wait "
           "ms first / last | wall s first / last | wall max s | watch CPU s |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    out += rows + [""] + [f"- {n}" for n in notes] + [""]
    out += [f"### Allocation latency at {threads} threads during snapshots (bench/latency.c, "
            f"{live} live blocks, THREADS={threads}, 2 s phases)", "",
            f"{threads} threads each replace random blocks of their own {live // threads} (free "
            "+ malloc of 16–64 B) and time each replacement; phases without snapshots alternate "
            "with phases during which `heapdump snapshot` runs back to back; percentiles over "
            "all threads' replacements, medians over the phases. Goal of issue 13: p99 during "
            "snapshots within 10% of without (ratio ≤ 1.10).", ""]
    return out + lat_rows + [""] + [f"- {n}" for n in lat_notes] + [""]


# --------------------------------------------------------------------------------------------
# Interleaved A/B (section "ab") and instruction counts (section "instructions")
# --------------------------------------------------------------------------------------------

SHIM_B = None  # --shim-b: a second shim build (e.g. an older commit's), frozen like SHIM


def freeze_shim_b(path):
    """Copy --shim-b's library into target/bench/ and use the copy (as freeze_heapdump_build
    does for SHIM). Returns a line describing it for the report."""
    global SHIM_B
    path = os.path.abspath(path)
    if not os.path.exists(path):
        sys.exit(f"--shim-b {path} does not exist")
    frozen = os.path.join(BUILD_DIR, "heapdump-under-test", "shim-b")
    os.makedirs(frozen, exist_ok=True)
    SHIM_B = os.path.join(frozen, os.path.basename(path))
    shutil.copy2(path, SHIM_B)
    built = datetime.datetime.fromtimestamp(os.stat(path).st_mtime).astimezone()
    return f"shim B (--shim-b): {path} built {built:%Y-%m-%d %H:%M:%S %Z} (copied at start)"


def shim_builds():
    """[(label, path)]: the shim under test, and --shim-b's when given."""
    return [("shim", SHIM)] + ([("shim B", SHIM_B)] if SHIM_B else [])


def run_variant(argv, extra_env, shim, args, prefix=()):
    """One run of argv with extra_env: bare (shim None) or with LD_PRELOAD=shim and a fresh
    HEAPDUMP_DIR under /dev/shm, removed afterwards. prefix puts a tool in front of argv
    (valgrind), which gets the same environment, LD_PRELOAD included."""
    tmp = tempfile.mkdtemp(prefix="heapdump-bench-", dir=shm_dir())
    try:
        env = dict(base_env(), **extra_env)
        if shim:
            env.update(LD_PRELOAD=shim, HEAPDUMP_DIR=tmp)
        return run_measured(list(prefix) + list(argv), env, tmp, args.timeout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def python_for_bench(args):
    """Debian's CPython (installed when allowed), or None."""
    py = find_debian_python()
    if not py:
        msg = install_missing(["python3"], not args.no_install)
        if msg:
            log(msg)
        py = find_debian_python()
    return py


def phase_seconds(res):
    """bench/phases.c's allocation + free phase times (the inverse of its throughput)."""
    m = PHASES_RE.search(res.stdout) if res.ok else None
    return float(m.group(1)) + float(m.group(2)) if m else None


def section_ab(args, exes, threads):
    """Interleaved A/B: each round runs, per workload, the bare program then the program under
    the shim (and again bare then under --shim-b), so every shim run has a bare run just
    before it; medians of the per-pair ratios and the ratio of the minimums, which a host
    that slows everything down for minutes at a time moves far less than single ratios."""
    py = python_for_bench(args)
    workloads = [(f"storm, {t} thread{'s' if t != '1' else ''}",
                  [exes["storm"], t, str(args.storm_ops)], {}, "CPU s", lambda r: r.cpu)
                 for t in threads]
    workloads.append(("phases, 8 threads", [exes["phases"], "8", str(args.phase_blocks)], {},
                      "phase s (alloc + free)", phase_seconds))
    if py:
        workloads.append(("CPython, PYTHONMALLOC=malloc",
                          [py, os.path.join(BENCH_SRC, "py_workload.py"), str(args.py_iters)],
                          {"PYTHONMALLOC": "malloc"}, "CPU s", lambda r: r.cpu))
    builds = shim_builds()
    # results[workload][label] = [(bare value, shim value)], one per round
    results = {w[0]: {label: [] for label, _ in builds} for w in workloads}
    errors = []
    for rnd in range(args.rounds):
        order = builds[rnd % len(builds):] + builds[:rnd % len(builds)]
        for name, argv, extra, _, value in workloads:
            for label, shim in order:
                b = run_variant(argv, extra, None, args)
                x = run_variant(argv, extra, shim, args)
                vb, vx = value(b), value(x)
                if vb and vx:
                    results[name][label].append((vb, vx))
                else:
                    errors.append(f"{name}, {label}, round {rnd + 1}: "
                                  f"{(b.error or x.error) or 'no phase times in the output'}")
                log(f"ab round {rnd + 1}/{args.rounds} {name}: bare {b!r} vs {label} {x!r}")

    lines = ["| workload | measure | run | × bare, median of pairs | × bare, min / min | "
             "pairs, lowest–highest | bare min s | bare median s |",
             "|---|---|---|---|---|---|---|---|"]
    notes = []
    for name, _, _, measure, _ in workloads:
        bares = [b for label, _ in builds for b, _ in results[name][label]]
        for label, _ in builds:
            pairs = results[name][label]
            if not pairs:
                lines.append(f"| {name} | {measure} | {label} | failed | | | | |")
                continue
            ratios = [x / b for b, x in pairs]
            lines.append(f"| {name} | {measure} | {label} | {statistics.median(ratios):.2f} | "
                         f"{min(x for _, x in pairs) / min(bares):.2f} | {min(ratios):.2f}–"
                         f"{max(ratios):.2f} | {min(bares):.3f} | "
                         f"{statistics.median(bares):.3f} |")
        if SHIM_B and all(results[name][label] for label, _ in builds):
            a, b = results[name]["shim"], results[name]["shim B"]
            per_round = [(xa / ba) / (xb / bb) for (ba, xa), (bb, xb) in zip(a, b)]
            notes.append(f"{name}: shim / shim B: median of the rounds' ratios of their pair "
                         f"ratios {statistics.median(per_round):.2f}, min / min "
                         f"{min(x for _, x in a) / min(x for _, x in b):.2f}")
    if not py:
        notes.append("CPython: skipped: Debian's /usr/bin/python3 is missing")
    notes += errors
    shims = "the shim" + (" and shim B (--shim-b)" if SHIM_B else "")
    out = [f"## Interleaved A/B (storm {args.storm_ops} ops per thread, phases 8 × "
           f"{args.phase_blocks}, py_workload.py {args.py_iters}; {args.rounds} rounds)", "",
           f"Each round runs every workload bare, then under {shims}, each shim run right after "
           "a bare run of its own (the order of the builds alternates between rounds). CPU = "
           "user + sys from wait4; phases uses the program's own allocation + free phase times "
           "(its throughput's inverse). × bare: the median over rounds of shim / the bare run "
           "just before it, and the fastest shim run / the fastest bare run (bare min and "
           "median over all bare runs of the workload). A host that slows down for minutes "
           "slows a pair's two runs together; the minimums are the runs it slowed least.", ""]
    return out + lines + [""] + [f"- {n}" for n in notes] + ([""] if notes else [])


# --------------------------------------------------------------------------------------------
# The floor (section "floor"): what each part of the recording costs on the storm
# --------------------------------------------------------------------------------------------

ABLATION_DIR = os.path.join(REPO, "target", "ablation")


def build_ablation_shim():
    """Builds the shim with the benchmark-only `ablation` feature (instrumentation/src/
    ablate.rs) into target/ablation and copies it next to the frozen shim. Returns (path, None)
    or (None, why not)."""
    cmd = ["cargo", "build", "--release", "-p", "heapdump-preload", "--features", "ablation",
           "--target-dir", ABLATION_DIR]
    log("build: " + " ".join(cmd))
    try:
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"cargo build --features ablation failed: {e}"
    built = os.path.join(ABLATION_DIR, "release", "libheapdump.so")
    if r.returncode != 0 or not os.path.exists(built):
        return None, f"cargo build --features ablation failed: {_tail(r.stderr)}"
    frozen = os.path.join(BUILD_DIR, "heapdump-under-test", "ablation")
    os.makedirs(frozen, exist_ok=True)
    path = os.path.join(frozen, "libheapdump.so")
    shutil.copy2(built, path)
    return path, None


def section_floor(args, exes):
    """The storm on one thread, bare and with parts of the recording switched off, all in the
    same interleaved rounds: the CPU each part adds, as × bare and ns per operation, and the
    instructions it adds (cachegrind, 200,000 operations)."""
    title = (f"## The floor: what each part of the recording costs (storm, 1 thread, "
             f"{args.storm_ops} ops; {args.rounds} rounds)")
    abl, why = build_ablation_shim()
    if not abl:
        return [title, "", f"skipped: floor: {why}", ""]
    argv = [exes["storm"], "1", str(args.storm_ops)]
    runs = [
        ("bare", None, {}),
        ("interposed, recording off (HEAPDUMP_DISABLE=1)", SHIM, {"HEAPDUMP_DISABLE": "1"}),
        ("block marks only (ablate record)", abl, {"HEAPDUMP_ABLATE": "record"}),
        ("no stacks, no table (ablate stack,table)", abl, {"HEAPDUMP_ABLATE": "stack,table"}),
        ("no stacks (ablate stack)", abl, {"HEAPDUMP_ABLATE": "stack"}),
        ("no table (ablate table)", abl, {"HEAPDUMP_ABLATE": "table"}),
        ("everything (ablation build)", abl, {}),
        ("everything (release build)", SHIM, {}),
    ]
    cpu = {name: [] for name, _, _ in runs}
    ratios = {name: [] for name, _, _ in runs}
    errors = []
    for rnd in range(args.rounds):
        # Forward then reverse order, so that a host slowing down within the round weighs on
        # every run alike; the round's ratio is each run's sum over the bare runs' sum.
        got = {name: 0.0 for name, _, _ in runs}
        ok = True
        for name, shim, extra in runs + runs[::-1]:
            res = run_variant(argv, extra, shim, args)
            if not res.ok or not res.cpu:
                errors.append(f"{name}, round {rnd + 1}: {res.error}")
                ok = False
                continue
            got[name] += res.cpu
            cpu[name].append(res.cpu)
            log(f"floor round {rnd + 1}/{args.rounds} {name}: {res!r}")
        if ok:
            for name in got:
                ratios[name].append(got[name] / got["bare"])
    if not ratios["bare"]:
        return [title, "", "failed: " + "; ".join(errors[:3]), ""]
    med = {name: statistics.median(r) for name, r in ratios.items() if r}
    bare_s = statistics.median(cpu["bare"])
    ns_per_op = bare_s * 1e9 / args.storm_ops

    # Instructions (deterministic), when valgrind is there.
    instr = {}
    if shutil.which("valgrind"):
        cg_argv = [exes["storm"], "1", "200000"]
        for name, shim, extra in runs:
            ir = cachegrind_run(cg_argv, extra, shim, args, cache_sim=False)[0]
            if ir:
                instr[name] = ir
            log(f"floor instructions {name}: {ir}")

    lines = ["| run | CPU × bare, median of rounds | rounds, lowest–highest | fastest run / "
             "fastest bare run | instructions (200,000 ops) |", "|---|---|---|---|---|"]
    for name, _, _ in runs:
        r = ratios[name]
        cell = (f"{med[name]:.2f} | {min(r):.2f}–{max(r):.2f} | "
                f"{min(cpu[name]) / min(cpu['bare']):.2f}" if r else "failed | |")
        ir = f"{instr[name] / 1e6:.1f} M" if name in instr else "—"
        lines.append(f"| {name} | {cell} | {ir} |")

    def part(label, hi, lo):
        if hi not in med or lo not in med:
            return None
        d = med[hi] - med[lo]
        ins = (f", {(instr[hi] - instr[lo]) / 200000:.0f} instructions an operation"
               if hi in instr and lo in instr else "")
        return (f"{label}: {d:+.2f}× bare = {d * ns_per_op:+.0f} ns an operation{ins} "
                f"(\"{hi}\" − \"{lo}\")")

    parts = [
        part("interposition alone", "interposed, recording off (HEAPDUMP_DISABLE=1)", "bare"),
        part("block marks (trailers, headers, their checks)", "block marks only (ablate record)",
             "bare"),
        part("recording without stacks or table (thread state, operation window, clock, "
             "counters, record numbers)", "no stacks, no table (ablate stack,table)",
             "block marks only (ablate record)"),
        part("the allocations table's memory traffic", "everything (ablation build)",
             "no table (ablate table)"),
        part("stack capture and interning", "everything (ablation build)",
             "no stacks (ablate stack)"),
        part("the ablation checks themselves", "everything (ablation build)",
             "everything (release build)"),
    ]
    notes = [p for p in parts if p] + errors
    out = [title, "",
           "One shim build with the benchmark-only `ablation` feature (instrumentation/src/"
           "ablate.rs: `HEAPDUMP_ABLATE=record|stack|table` switch parts of the recording off; "
           "never in a build for profiling) and the release build, every run in each round "
           "(forward then reverse order); per round, each run's CPU (user + sys) over bare's; "
           f"medians over the rounds. Bare's median CPU: {bare_s:.3f} s, {ns_per_op:.0f} ns an "
           "operation (81% of operations are a free and a malloc). The parts below are "
           "differences of medians; on a host as noisy as the one the project is developed on, "
           "where the same build's rounds spread by ±20%, only the instruction counts are "
           "exact: read the CPU parts as their order of magnitude.", ""]
    return out + lines + [""] + [f"- {n}" for n in notes] + [""]


CG_IREFS_RE = re.compile(r"I\s+refs:\s+([\d,]+)")
CG_D1_RE = re.compile(r"D1\s+misses:\s+([\d,]+)")


def cachegrind_totals(out_file, stderr):
    """(instructions, D1 misses, D1 geometry) of a cachegrind run: the out file's "summary:"
    line (events Ir, D1mr, D1mw), else the totals valgrind printed on stderr."""
    try:
        with open(out_file, errors="replace") as f:
            text = f.read()
        events = re.search(r"^events:\s+(.*)$", text, re.M).group(1).split()
        summary = [int(v) for v in re.search(r"^summary:\s+(.*)$", text, re.M).group(1).split()]
        tot = dict(zip(events, summary))
        desc = re.search(r"^desc: D1 cache:\s+(.*)$", text, re.M)
        return (tot["Ir"], tot.get("D1mr", 0) + tot.get("D1mw", 0),
                desc.group(1).strip() if desc else None)
    except (OSError, AttributeError, KeyError, ValueError):
        pass
    i, d = CG_IREFS_RE.search(stderr), CG_D1_RE.search(stderr)
    if not i:
        return None, None, None
    return (int(i.group(1).replace(",", "")),
            int(d.group(1).replace(",", "")) if d else None, None)


def cachegrind_run(argv, extra_env, shim, args, cache_sim):
    """One run of argv under `valgrind --tool=cachegrind` (bare when shim is None, else with
    LD_PRELOAD=shim, as run_variant): (instructions, D1 misses, D1 geometry, the run's
    Result); the counts are None when the run failed."""
    with tempfile.TemporaryDirectory(prefix="heapdump-cachegrind-", dir=shm_dir()) as cgdir:
        out_file = os.path.join(cgdir, "cachegrind.out")
        res = run_variant(argv, extra_env, shim, args,
                          prefix=["valgrind", "--tool=cachegrind",
                                  f"--cache-sim={'yes' if cache_sim else 'no'}",
                                  "--cachegrind-out-file=" + out_file])
        ir, d1, desc = (cachegrind_totals(out_file, res.stderr) if res.ok
                        else (None, None, None))
    return ir, d1, desc, res


def section_instructions(args, exes):
    """Instructions and L1 data misses counted by cachegrind (deterministic: the host's noise
    does not reach them), bare and under each shim build."""
    title = "## Instruction counts (valgrind --tool=cachegrind --cache-sim=yes)"
    if not shutil.which("valgrind"):
        msg = install_missing(["valgrind"], not args.no_install)
        if msg:
            log(msg)
    if not shutil.which("valgrind"):
        return [title, "", "skipped: valgrind not installed", ""]
    py = python_for_bench(args)
    workloads = [("storm, 1 thread, 200000 ops", [exes["storm"], "1", "200000"], {}),
                 ("phases 4 100000", [exes["phases"], "4", "100000"], {})]
    if py:
        workloads.append(("CPython, PYTHONMALLOC=malloc, py_workload.py 2000",
                          [py, os.path.join(BENCH_SRC, "py_workload.py"), "2000"],
                          {"PYTHONMALLOC": "malloc", "PYTHONHASHSEED": "0"}))
        workloads.append((f"CPython, PYTHONMALLOC=malloc, py_workload.py 2000 {PY_DEEP} "
                          f"({PY_DEEP} Python frames deeper)",
                          [py, os.path.join(BENCH_SRC, "py_workload.py"), "2000", str(PY_DEEP)],
                          {"PYTHONMALLOC": "malloc", "PYTHONHASHSEED": "0"}))
    lines = ["| workload | run | instructions | × bare | D1 misses | D1 misses × bare |",
             "|---|---|---|---|---|---|"]
    notes = []
    d1_desc = None
    for name, argv, extra in workloads:
        bare = None
        for label, shim in [("bare", None)] + shim_builds():
            ir, d1, desc, res = cachegrind_run(argv, extra, shim, args, cache_sim=True)
            d1_desc = d1_desc or desc
            log(f"instructions {name}: {label}: "
                f"{res.error or f'{ir} instructions, {d1} D1 misses'}")
            if ir is None:
                lines.append(f"| {name} | {label} | failed: {res.error or 'no totals'} | | | |")
                continue
            if label == "bare":
                bare = (ir, d1)
            ratio = f"{ir / bare[0]:.2f}" if bare else "—"
            d1_ratio = f"{d1 / bare[1]:.2f}" if bare and bare[1] and d1 is not None else "—"
            d1_cell = f"{d1 / 1e6:.2f} M" if d1 is not None else "—"
            lines.append(f"| {name} | {label} | {ir / 1e6:.1f} M | {ratio} | {d1_cell} | "
                         f"{d1_ratio} |")
    if not py:
        notes.append("CPython: skipped: Debian's /usr/bin/python3 is missing")
    if d1_desc:
        notes.append(f"cachegrind's simulated D1 cache: {d1_desc}")
    out = [title, "",
           "Counted by valgrind (one run each; the counts do not depend on the host's speed or "
           "load, and valgrind runs the threads one at a time): instructions executed (I refs) and L1 "
           "data misses (reads + writes) of the whole process, bare and with LD_PRELOAD set "
           "to each shim build (HEAPDUMP_DIR under /dev/shm).", ""]
    return out + lines + [""] + [f"- {n}" for n in notes] + ([""] if notes else [])


def main():
    ap = argparse.ArgumentParser(
        description="heapdump benchmark harness: overhead against heaptrack and jemalloc's "
                    "profiler on a C and a CPython workload, thread scaling, snapshot speed and "
                    "memory. Prints a Markdown report on stdout, progress on stderr.",
        epilog="Quick run: python3 bench/run.py --rounds 1 --ops 20000 --py-iters 2000")
    ap.add_argument("--rounds", type=int, default=5,
                    help="A/B rounds per peer and thread count (default 5)")
    ap.add_argument("--ops", type=int, default=300000,
                    help="operations per thread of the C workload (default 300000)")
    ap.add_argument("--storm-ops", type=int, default=2000000,
                    help="operations per thread of the malloc/free storm (default 2000000)")
    ap.add_argument("--phase-blocks", type=int, default=500000,
                    help="blocks per thread of the allocation-only phases (default 500000)")
    ap.add_argument("--threads", default="1,2",
                    help="comma-separated thread counts for the C workload (default 1,2)")
    ap.add_argument("--py-iters", type=int, default=30000,
                    help="iterations of the CPython workload (default 30000)")
    ap.add_argument("--blocks", type=int, default=1000000,
                    help="blocks held for the snapshot benchmark (default 1000000)")
    ap.add_argument("--big", action="store_true",
                    help="also run the snapshot and graph benchmarks at 10 M blocks")
    ap.add_argument("--graph-blocks", type=int, default=1000000,
                    help="blocks held for the reference-graph benchmark (default 1000000)")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds before one run is killed and reported as failed (default 600)")
    ap.add_argument("--no-install", action="store_true",
                    help="never apt-get install missing peers (heaptrack, libjemalloc2)")
    ap.add_argument("--skip", default="",
                    help="comma-separated sections to skip: c, storm, phases, where, rust, python, "
                         "snapshot, graph, threads, continuous, latency, footprint, ab, "
                         "instructions, floor")
    ap.add_argument("--continuous-seconds", type=int, default=60,
                    help="length of the continuous section's `heapdump watch --every 1s` runs "
                         "(snapshots of a 32-thread churning target; default 60)")
    ap.add_argument("--latency-blocks", type=int, default=1000000,
                    help="live blocks held by the latency benchmark's target (default 1000000)")
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"), help="C compiler (default cc)")
    ap.add_argument("--shim", default=None,
                    help="libheapdump.so to measure instead of target/release's (e.g. an older "
                         "build, for a before/after comparison)")
    ap.add_argument("--shim-b", default=None, metavar="PATH",
                    help="a second libheapdump.so (e.g. an older commit's build) run in the same "
                         "rounds as the shim by the sections ab and instructions: rows \"shim B\"")
    args = ap.parse_args()
    if args.rounds < 1 or args.ops < 0 or args.py_iters < 0 or args.blocks < 1:
        ap.error("--rounds, --ops, --py-iters and --blocks must be positive")
    if args.continuous_seconds < 1:
        ap.error("--continuous-seconds must be at least 1")
    threads = [t.strip() for t in args.threads.split(",") if t.strip()]
    if not all(t.isdigit() and int(t) > 0 for t in threads):
        ap.error("--threads takes positive integers, e.g. 1,2")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}

    os.chdir(REPO)
    if args.shim:
        global SHIM
        SHIM = os.path.abspath(args.shim)
    load = BackgroundLoad()
    machine = machine_lines()  # before anything runs: the load average at start
    build_line = freeze_heapdump_build()
    if args.shim_b:
        build_line += f"\n- {freeze_shim_b(args.shim_b)}"
    exes = build(args.cc)
    peers, setup_notes = setup_peers(args, exes)

    report = ["# heapdump benchmarks", ""] + machine + [f"- {build_line}", ""]
    if setup_notes:
        report += ["Setup:", ""] + [f"- {n}" for n in setup_notes] + [""]

    # Each section is guarded: an unexpected error in one is reported and the others still run.
    c_keys = ["baseline", "heapdump", "heapdump-index", "heapdump-fp", "heapdump-sampled",
              "heaptrack", "jemalloc", "jemalloc-prof", "jemalloc-prof-512k"]
    sections = [
        ("c", lambda: section_c(args, exes, peers, threads, c_keys)),
        ("storm", lambda: section_storm(args, exes, peers, threads, c_keys)),
        ("phases", lambda: section_phases(args, exes, peers)),
        ("where", lambda: section_where(args, exes, peers)),
        ("rust", lambda: section_rust(args)),
        ("python", lambda: section_python(args, peers)),
        ("snapshot", lambda: section_snapshot(args, exes)),
        ("graph", lambda: section_graph(args, exes)),
        ("threads", lambda: section_threads(args)),
        ("continuous", lambda: section_continuous(args, exes)),
        ("latency", lambda: section_latency(args, exes)),
        ("footprint", lambda: section_footprint(args, exes)),
        ("ab", lambda: section_ab(args, exes, threads)),
        ("instructions", lambda: section_instructions(args, exes)),
        ("floor", lambda: section_floor(args, exes)),
    ]
    for name, fn in sections:
        if name in skip:
            continue
        try:
            report += fn()
        except Exception as e:  # noqa: BLE001 — report, don't lose the other sections
            log(f"section {name} failed: {e!r}")
            report += [f"## {name}: failed: {e!r}", ""]

    bg = load.line()
    if bg:
        report += [bg, ""]
    report.append("Command: python3 " + " ".join(shlex.quote(a) for a in sys.argv))
    print("\n".join(report), flush=True)


if __name__ == "__main__":
    main()

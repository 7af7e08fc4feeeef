#!/usr/bin/env python3
"""Fleet benchmark: the cost of `--push` and of `heapdump watch --every 1s`.

    python3 bench/fleet.py [--blocks 1000000] [--seconds 30] [--rounds 3]

Needs `cargo build --release` first (target/release/heapdump and libheapdump.so) and cc.

1. Push size and time: a target holding --blocks live blocks under the shim (bench/hold.c: 4
   call paths, 16-64 B; and examples/c/many_stacks.c: one call stack per block, the worst
   case, trimmed to 16,000 samples) is snapshotted --rounds times with `-o FILE` and with
   `--push URL` to a fake Pyroscope (an HTTP server in this script that answers 200 and
   records each body's size); the push's cost is the difference of the medians.
2. The collector's cost in `heapdump watch --every 1s --push URL` over --seconds on the hold.c
   target: its own CPU time and peak RSS (what watch prints at exit), and the target's CPU
   time over the same seconds (idle target: what the collector makes it do).
3. The target's work: bench/latency.c (--blocks live blocks, replacing random ones and timing
   each replacement) for --seconds without a watch, then --seconds under the watch: the number
   of replacements and their percentiles.
"""

import argparse
import http.server
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAPDUMP = os.path.join(ROOT, "target/release/heapdump")
SHIM = os.path.join(ROOT, "target/release/libheapdump.so")


class Fake(http.server.BaseHTTPRequestHandler):
    """A fake Pyroscope: 200 to every push, body sizes recorded."""

    sizes = []

    def do_POST(self):
        n = int(self.headers["Content-Length"])
        self.rfile.read(n)
        Fake.sizes.append(n)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def build(tmp, src, name, extra=()):
    exe = os.path.join(tmp, name)
    subprocess.run(["cc", "-O2", "-g", "-fno-omit-frame-pointer", "-pthread", *extra, "-o", exe,
                    os.path.join(ROOT, src)], check=True)
    return exe


def start(argv, region_dir):
    env = dict(os.environ, LD_PRELOAD=SHIM, HEAPDUMP_DIR=region_dir)
    p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = p.stdout.readline().decode()
    assert line.startswith("ready"), line
    return p, int(line.split()[1])


def collector(args, region_dir):
    env = dict(os.environ, HEAPDUMP_DIR=region_dir)
    env.pop("LD_PRELOAD", None)
    t = time.monotonic()
    r = subprocess.run([HEAPDUMP, *args], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return time.monotonic() - t, r.stderr


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def push_cost(url, tmp, argv, rounds, what):
    region = tempfile.mkdtemp(dir=tmp)
    p, pid = start(argv, region)
    out = os.path.join(tmp, "p.pb.gz")
    files, pushes = [], []
    for _ in range(rounds):
        files.append(collector(["snapshot", "--by-pid", str(pid), "-o", out], region)[0])
        n = len(Fake.sizes)
        pushes.append(collector(["snapshot", "--by-pid", str(pid), "--push", url], region)[0])
        assert len(Fake.sizes) == n + 1
    size = Fake.sizes[-1]
    file_size = os.path.getsize(out)
    p.stdin.close()
    p.wait()
    f, q = statistics.median(files), statistics.median(pushes)
    print(f"| {what} | {size:,} | {file_size:,} | {f:.2f} | {q:.2f} | {q - f:+.2f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    for f in (HEAPDUMP, SHIM):
        if not os.path.exists(f):
            sys.exit(f"{f} is missing: run `cargo build --release` first")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        hold = build(tmp, "bench/hold.c", "hold")
        many = build(tmp, "examples/c/many_stacks.c", "many_stacks",
                     ["-fno-optimize-sibling-calls"])
        latency = build(tmp, "bench/latency.c", "latency")
        bits = max(1, (a.blocks - 1).bit_length())

        print(f"### Push size and time ({a.rounds} rounds, medians)\n")
        print("| target | push body, bytes | -o file, bytes | snapshot -o s | snapshot --push s "
              "| push cost s |")
        print("|---|---|---|---|---|---|")
        push_cost(url, tmp, [hold, str(a.blocks)], a.rounds,
                  f"bench/hold.c {a.blocks:,} blocks, 4 call paths")
        push_cost(url, tmp, [many, str(bits)], a.rounds,
                  f"many_stacks {bits}: {1 << bits:,} blocks, one stack each (trimmed to 16,000)")

        print(f"\n### `heapdump watch --every 1s --push URL`, {a.seconds} s, "
              f"bench/hold.c {a.blocks:,} blocks\n")
        region = tempfile.mkdtemp(dir=tmp)
        p, pid = start([hold, str(a.blocks)], region)
        c0 = cpu_s(pid)
        t0 = time.monotonic()
        _, err = collector(["watch", "--by-pid", str(pid), "--every", "1s", "--count",
                            str(a.seconds), "--push", url], region)
        wall = time.monotonic() - t0
        c1 = cpu_s(pid)
        p.stdin.close()
        p.wait()
        last = [l for l in err.splitlines() if "watch ended" in l][-1]
        m = re.search(r"own CPU time ([\d.]+) s .*peak RSS ([\d.]+) MiB", last)
        own, rss = float(m.group(1)), float(m.group(2))
        print(f"- {last.removeprefix('heapdump: ')}")
        print(f"- collector: {own:.2f} s CPU over {wall:.1f} s = {100 * own / wall:.1f}% of a "
              f"core; peak RSS {rss:.1f} MiB")
        print(f"- target (idle, waiting on stdin): {c1 - c0:.2f} s CPU over the watch")

        print(f"\n### The target's work under the watch (bench/latency.c {a.blocks:,} blocks, "
              f"{a.seconds} s phases)\n")
        print("| phase | replacements | p50 ns | p99 ns | p99.9 ns | max ns |")
        print("|---|---|---|---|---|---|")
        region = tempfile.mkdtemp(dir=tmp)
        p, pid = start([latency, str(a.blocks), str(a.seconds)], region)

        def phase(name):
            p.stdin.write(f"run {name}\n".encode())
            p.stdin.flush()
            line = p.stdout.readline().decode().split()
            kv = dict(w.split("=") for w in line[1:])
            print(f"| {name} | {kv['n']} | {kv['p50']} | {kv['p99']} | {kv['p999']} | "
                  f"{kv['max']} |")

        phase("quiet")
        env = dict(os.environ, HEAPDUMP_DIR=region)
        env.pop("LD_PRELOAD", None)
        w = subprocess.Popen([HEAPDUMP, "watch", "--by-pid", str(pid), "--every", "1s",
                              "--push", url], env=env, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        phase("watched")
        w.terminate()
        err = w.communicate()[1]
        phase("quiet")
        p.stdin.write(b"quit\n")
        p.stdin.flush()
        p.wait()
        last = [l for l in err.splitlines() if "watch ended" in l][-1]
        print(f"\n- {last.removeprefix('heapdump: ')}")
    srv.shutdown()


if __name__ == "__main__":
    main()

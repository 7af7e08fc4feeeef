"""bench/py_workload.py — CPython allocation churn for the heapdump benchmark harness.

    usage: PYTHONMALLOC=malloc /usr/bin/python3 py_workload.py [ITERATIONS [DEPTH]]

PYTHONMALLOC=malloc makes CPython call malloc/free for every object (bypassing pymalloc),
so every dict, str, list and int goes through the profiler under test. The work is
deterministic (fixed seed) and keeps a bounded working set: a ring of dicts, each holding
strings and lists, replaced round-robin. DEPTH (default 0) runs the same work under that many
more Python frames, as in a program whose allocations happen 20 to 50 frames below its entry
point (a web framework's request handler, a test runner).
"""
import random
import sys


def make_record(rng, i):
    """A small dict of str, list and nested containers, built from fresh objects."""
    key = "k%08d" % i
    words = [("w%d" % rng.randrange(100000)) * rng.randrange(1, 8) for _ in range(rng.randrange(2, 12))]
    return {
        "id": i,
        "key": key,
        "words": words,
        "joined": "-".join(words),
        "counts": {w[:6]: len(w) for w in words},
        "pairs": [(j, str(j)) for j in range(rng.randrange(0, 16))],
    }


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    rng = random.Random(12345)
    ring_size = 5000
    ring = [None] * ring_size
    index = {}
    total = 0
    for i in range(iters):
        slot = i % ring_size
        old = ring[slot]
        if old is not None:
            index.pop(old["key"], None)
        rec = make_record(rng, i)
        ring[slot] = rec
        index[rec["key"]] = rec
        # Some churn on top: a temporary list that grows and is sorted, string ops.
        tmp = sorted(rec["counts"].values())
        total += len(rec["joined"].upper()) + sum(tmp)
    print("iters=%d total=%d live=%d" % (iters, total, len(index)))


def under(depth):
    """main() under `depth` more Python frames."""
    if depth == 0:
        return main()
    return under(depth - 1)


if __name__ == "__main__":
    under(int(sys.argv[2]) if len(sys.argv) > 2 else 0)

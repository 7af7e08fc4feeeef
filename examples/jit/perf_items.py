"""CPython program for the JIT tests (collector/tests/jit.rs): 20,000 bytearrays of 1,000 to
1,006 bytes (20,060,000 bytes, each buffer from malloc) made in make_items, called by outer,
called by the module. Prints "ready PID", then exits when stdin closes.

`main` (default): held by the main thread. `thread`: made and held by a daemon thread, whose
frame keeps them live through interpreter shutdown (for a post-mortem snapshot).
"""
import os
import sys
import threading


def make_items(n):
    return [bytearray(1000 + i % 7) for i in range(n)]


def outer():
    return make_items(20000)


if sys.argv[1:] == ["thread"]:
    made = threading.Event()

    def holder():
        held = outer()
        made.set()
        threading.Event().wait()
        return held

    threading.Thread(target=holder, daemon=True).start()
    made.wait()
else:
    held = outer()
print("ready", os.getpid(), flush=True)
sys.stdin.read()

#!/usr/bin/env python3
"""Prints the import cycles among a crate's modules (exit 1 if any).

Usage: scripts/module-cycles.py collector/src

A module is a file (`a/b.rs` or `a/b/mod.rs` is `a::b`). Module A depends on module B when A's
non-test code names `crate::B...` (in a `use` or a path) or, inside `a/`, `super::B`. A path
names the deepest module that exists (`crate::push::queue::Queue` is `push::queue`). Declaring
a child module (`mod x;`) is not a dependency. `#[cfg(test)] mod tests { ... }` at the end of a
file is left out: tests may use anything.
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "collector/src"
mods = {}
for d, _, files in os.walk(root):
    for f in files:
        if not f.endswith(".rs"):
            continue
        rel = os.path.relpath(os.path.join(d, f), root)[:-3].split(os.sep)
        if rel[-1] == "mod":
            rel = rel[:-1]
        if rel in (["main"], ["lib"]):
            rel = []
        mods["::".join(rel)] = os.path.join(d, f)


def strip_tests(text):
    m = re.search(r"\n#\[cfg\(test\)\]\s*\nmod tests\b", text)
    return text[: m.start()] if m else text


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(l.split("//")[0] for l in text.split("\n"))


def expand_use(text):
    """crate::{a, b::{c, d}} -> crate::a, crate::b::c, crate::b::d (one level of braces)."""
    out = []
    for m in re.finditer(r"\b(crate|super)::((?:\w+::)*)\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}", text):
        head = m.group(1) + "::" + m.group(2)
        for part in re.split(r",(?![^{]*\})", m.group(3)):
            part = part.strip()
            if not part:
                continue
            inner = re.match(r"(\w+(?:::\w+)*)::\{(.*)\}", part, flags=re.S)
            if inner:
                for q in inner.group(2).split(","):
                    out.append(head + inner.group(1) + "::" + q.strip())
            else:
                out.append(head + part)
    return out


def deepest(parts):
    for n in range(len(parts), 0, -1):
        k = "::".join(parts[:n])
        if k in mods:
            return k
    return None


edges = {m: set() for m in mods}
for m, path in mods.items():
    text = strip_comments(strip_tests(open(path).read()))
    paths = expand_use(text)
    paths += re.findall(r"\b(?:crate|super)(?:::\w+)+", text)
    for p in paths:
        parts = [x.strip() for x in p.split("::")]
        parts = [x.split(" as ")[0].strip() for x in parts if x.strip()]
        if parts[0] == "crate":
            target = deepest(parts[1:])
        else:  # super:: is m's parent
            target = deepest(m.split("::")[:-1] + parts[1:])
        if target is not None and target != m and target != "":
            edges[m].add(target)

# Tarjan's strongly connected components.
index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]
sys.setrecursionlimit(10000)


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(sorted(comp))


for v in sorted(edges):
    if v not in index:
        visit(v)
print(f"{len(mods)} modules, {sum(len(e) for e in edges.values())} dependencies")
for c in sccs:
    print("cycle:", " <-> ".join(c))
    for a in c:
        print("   ", a, "->", ", ".join(sorted(b for b in edges[a] if b in c)))
sys.exit(1 if sccs else 0)

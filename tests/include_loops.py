#!/usr/bin/env python3
"""Include loops between the modules of the tree (a module: a header and its source, x.h and x.c
or x.cu): a loop is a set of modules each of which includes, through the others, itself. Prints
each loop with the includes that make it and exits 1 where there is one that KNOWN does not name
(a new loop, or a known one grown), or a known loop is gone (its entry is then removed): the loops
that exist may only shrink. Also exits 1 where a launcher/ folder includes one that its layer may
not (LAUNCHER_MAY_INCLUDE: docs/architecture.md, "Where the code lives"), or common/ or a worker
includes launcher/. Used by .ci/run."""
import os
import re
import sys

FOLDERS = ["common", "gpu_worker", "io_worker", "opt_worker", "launcher"]
EXTS = (".c", ".h", ".cu", ".cc")
# Loops that exist and are to be broken, each with why it is here.
KNOWN = set()  # none: every loop that existed is broken
# launcher/'s layers, each with the launcher/ folders it may include: the commands over the options
# over the step engine, which runs over the plan and the executors; the plan and the processes
# know nothing of each other.
LAUNCHER_MAY_INCLUDE = {
    "cmd": {"cmd", "cli", "step", "plan", "run"},
    "cli": {"cli", "step", "plan", "run"},
    "step": {"step", "plan", "run"},
    "plan": {"plan"},
    "run": {"run"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def modules(root):
    files = {}
    for top in FOLDERS:
        for d, _, names in os.walk(os.path.join(root, top)):
            for n in names:
                if n.endswith(EXTS):
                    path = os.path.relpath(os.path.join(d, n), root)
                    files[path] = os.path.splitext(path)[0]
    return files


def edges(root, files):
    out = {m: {} for m in set(files.values())}
    for path, mod in files.items():
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for inc in INCLUDE.findall(text):
            for cand in (os.path.normpath(os.path.join(os.path.dirname(path), inc)), inc):
                if cand in files:
                    to = files[cand]
                    if to != mod:
                        out[mod].setdefault(to, []).append(f"{path} -> {cand}")
                    break
    return out


def loops(graph):
    index, low, stack, on, found, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_breaches(graph):
    out = []
    for mod, tos in sorted(graph.items()):
        top, _, rest = mod.partition("/")
        for to, why in sorted(tos.items()):
            if not to.startswith("launcher/"):
                continue
            if top != "launcher":
                out.append(f"{why[0]}: only launcher/ includes launcher/")
                continue
            if to.count("/") == 1:  # launcher/'s own top (try.h): every layer's
                continue
            mine, there = rest.split("/")[0], to.split("/")[1]
            if there not in LAUNCHER_MAY_INCLUDE.get(mine, ()):
                may = ", ".join(f"{f}/" for f in sorted(LAUNCHER_MAY_INCLUDE.get(mine, ())))
                out.append(f"{why[0]}: launcher/{mine}/ includes only launcher/'s {may}")
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    files = modules(root)
    graph = edges(root, files)
    found = loops(graph)
    bad = 0
    for comp in found:
        known = comp in KNOWN
        bad += not known
        print(f"include loop{' (known: to be broken)' if known else ''}: {', '.join(sorted(comp))}")
        for m in sorted(comp):
            for to, why in sorted(graph[m].items()):
                if to in comp:
                    print(f"  {why[0]}")
    for comp in KNOWN - set(found):
        print(f"the known loop {', '.join(sorted(comp))} is gone: remove it from KNOWN")
        bad += 1
    print(f"include loops: {len(found)} among {len(graph)} modules, {bad} not known")
    breaches = layer_breaches(graph)
    for b in breaches:
        print(f"layer: {b}")
    print(f"launcher/'s layers: {len(breaches)} includes across them the wrong way")
    bad += len(breaches)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

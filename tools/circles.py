#!/usr/bin/env python3
"""circles.py [BUILD_DIR] — the library's file graph from its linked objects, and its circles.

File A points at file B when A's object uses a symbol B's object defines (`nm`: B has it
as T/D/B/R, A as U). A circle is a strongly connected component of more than one file:
files that call each other round, so none can be read, tested or moved alone. Prints each
circle with its files and, for each file, the names it takes from the others; exits 1 when
there is a circle (`--max N`: when there are more than N).

DESIGN.md's rule: a lower folder never calls a name that only a higher one defines
(src/base < codecs, cuda, formats, sources < engine); the folders' order is reported too
(not failed on). A format reading through the public API (ferry_pread, ferry_file_open,
ferry_plan_add: the names include/ferry.h declares) is the design, not an upward arrow;
those calls are counted apart. `make test-c` runs this after the build (0 circles).
--src DIR: the sources of the objects (default src; an object without its source is
skipped). --quiet: print the closing line only (and the circles, when there are any)."""
import os
import re
import subprocess
import sys
from collections import defaultdict

ORDER = {"base": 0, "codecs": 1, "cuda": 1, "formats": 2, "sources": 2, "engine": 3}


def symbols(obj):
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRVW":
            defined.add(parts[2])
    return defined, used


def sccs(nodes, edges):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
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
            out.append(comp)
    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return out


def public_names():
    """Function names include/ferry.h declares (and ferry_experimental.h)."""
    names = set()
    for h in ("include/ferry.h", "include/ferry_experimental.h"):
        if os.path.exists(h):
            names |= set(re.findall(r"\b(ferry_\w+)\s*\(", open(h).read()))
    return names


def main():
    quiet = "--quiet" in sys.argv
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    limit, src = 0, "src"
    if "--max" in sys.argv:
        limit = int(sys.argv[sys.argv.index("--max") + 1])
        args = [a for a in args if a != str(limit)]
    if "--src" in sys.argv:   # the sources the objects were built from (default: src)
        src = sys.argv[sys.argv.index("--src") + 1]
        args = [a for a in args if a != src]
    build = args[0] if args else "build"
    root = os.path.join(build, "src")
    objs = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".o")
                  and "/cli/" not in os.path.join(d, f))
    name = {o: os.path.relpath(o, root)[:-2] + ".c" for o in objs}
    # objects left behind by a source that moved or went away are not the library
    objs = [o for o in objs if os.path.exists(os.path.join(src, name[o]))]
    defs, uses = {}, {}
    for o in objs:
        defs[o], uses[o] = symbols(o)
    owner = {}
    for o in objs:
        for s in defs[o]:
            owner.setdefault(s, o)
    edges, why = defaultdict(set), defaultdict(set)
    for o in objs:
        for s in uses[o]:
            b = owner.get(s)
            if b and b != o:
                edges[o].add(b)
                why[(o, b)].add(s)
    comps = [c for c in sccs(objs, edges) if len(c) > 1]
    for c in comps:   # printed even with --quiet: the reason a check failed
        print(f"circle of {len(c)} files: " + ", ".join(sorted(name[o] for o in c)))
        for o in sorted(c, key=lambda x: name[x]):
            for b in sorted(edges[o] & set(c), key=lambda x: name[x]):
                print(f"  {name[o]} -> {name[b]}: {', '.join(sorted(why[(o, b)])[:6])}")
    upward, api = [], 0
    public = public_names()
    for o in objs:
        fa = name[o].split("/")[0]
        for b in edges[o]:
            fb = name[b].split("/")[0]
            if fa in ORDER and fb in ORDER and ORDER[fb] > ORDER[fa]:
                internal = sorted(s for s in why[(o, b)] if s not in public)
                if internal:
                    upward.append(f"  {name[o]} -> {name[b]}: {', '.join(internal[:4])}")
                else:
                    api += 1
    if upward and not quiet:
        print(f"{len(upward)} upward arrows (a lower folder calling a higher one's internal names):")
        print("\n".join(sorted(upward)))
    print(f"circles: {len(objs)} files, {len(comps)} circle(s), {len(upward)} upward arrow(s), "
          f"{api} call(s) up through the public API")
    return 1 if len(comps) > limit else 0


if __name__ == "__main__":
    sys.exit(main())

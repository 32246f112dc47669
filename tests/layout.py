#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/layout.py - the shape of the source tree, checked by `make check`:

- no source file (*.c, *.h under common, shm, kernels, engine, tools, tests) is longer than
  MAX_LINES lines;
- the include graph between the folders points one way, with no cycle:
      tests -> tools -> engine/api -> engine/serve -> engine/shard -> engine/model, engine/runtime
      -> shm, kernels -> common
  a file includes headers of its own folder or of folders below it, never above, and never of
  its siblings (engine/model and engine/runtime; shm and kernels);
- a folder's private header (*_int.h) is included only by its own folder (and by tests);
- every quoted include resolves to a file of the tree (from the root or beside the file), but
  the generated config.h.

`layout.py ROOT` checks the tree at ROOT and prints every violation (exit 1), or nothing but a
summary (exit 0). `layout.py --self-test ROOT` also shows that each rule can fail: on a copy of
the tree with one file made too long, and with one include that points up, the check must
fail. Without arguments (as `make check` runs it) it self-tests $DPSHARD_SRCDIR. Exit status 0
pass, 1 fail."""
import os
import re
import shutil
import sys
import tempfile

MAX_LINES = 800
DIRS = ["common", "shm", "kernels", "engine", "tools", "tests"]
# folder -> (level, group): a file may include a folder of lower level, or its own folder.
LEVEL = {
    "common": 0,
    "shm": 1, "kernels": 1,
    "engine/model": 2, "engine/runtime": 2,
    "engine/shard": 3,
    "engine/serve": 4,
    "engine/api": 5,
    "tools": 6,
    "tests": 7,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
COMMENT = re.compile(r'/\*.*?\*/|//[^\n]*', re.S)
GENERATED = {"config.h"}


def folder_of(path):
    """The folder of LEVEL a repository path belongs to, or None."""
    parts = path.split("/")
    if parts[0] == "engine" and len(parts) > 2:
        return "engine/" + parts[1]
    if parts[0] == "engine":
        return "engine"  # a file directly in engine/: not allowed
    return parts[0] if parts[0] in LEVEL else None


def sources(root):
    for d in DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, d)):
            for f in sorted(files):
                if f.endswith((".c", ".h")):
                    full = os.path.join(dirpath, f)
                    yield os.path.relpath(full, root), full


def resolve(root, rel, inc):
    """The repository path of a quoted include: from the root, else beside the file."""
    if os.path.exists(os.path.join(root, inc)):
        return os.path.normpath(inc)
    beside = os.path.normpath(os.path.join(os.path.dirname(rel), inc))
    if os.path.exists(os.path.join(root, beside)):
        return beside
    return None


def check(root):
    problems, n_files, n_edges = [], 0, 0
    for rel, full in sources(root):
        n_files += 1
        text = open(full, encoding="utf-8", errors="replace").read()
        lines = text.count("\n")
        if lines > MAX_LINES:
            problems.append("%s: %d lines, more than %d" % (rel, lines, MAX_LINES))
        src = folder_of(rel)
        if src not in LEVEL:
            problems.append("%s: a source file outside the layout's folders" % rel)
            continue
        for inc in INCLUDE.findall(COMMENT.sub("", text)):
            if inc in GENERATED:
                continue
            path = resolve(root, rel, inc)
            if path is None:
                problems.append("%s includes \"%s\", which is no file of the tree" % (rel, inc))
                continue
            dst = folder_of(path)
            n_edges += 1
            if dst not in LEVEL:
                problems.append("%s includes %s, outside the layout's folders" % (rel, inc))
            elif dst != src and LEVEL[dst] >= LEVEL[src]:
                problems.append("%s (%s) includes %s (%s): includes point from %s down only"
                                % (rel, src, inc, dst, src))
            elif path.endswith("_int.h") and dst != src and src != "tests":
                problems.append("%s includes %s, the private header of %s" % (rel, inc, dst))
    if not n_files:
        problems.append("%s: no source files (is it the root of the tree?)" % root)
    return problems, n_files, n_edges


def main():
    self_test = "--self-test" in sys.argv or len(sys.argv) == 1
    args = [a for a in sys.argv[1:] if a != "--self-test"]
    root = args[0] if args else os.environ.get("DPSHARD_SRCDIR", ".")
    problems, n_files, n_edges = check(root)
    for p in problems:
        print("FAIL: " + p)
    if self_test and not problems:
        tmp = tempfile.mkdtemp(prefix="dps-layout-")
        try:
            for d in DIRS:
                shutil.copytree(os.path.join(root, d), os.path.join(tmp, d))
            victim = os.path.join(tmp, "kernels", "ref.c")
            with open(victim, "a") as f:
                f.write("\n" * (MAX_LINES + 1))
            if not check(tmp)[0]:
                problems.append("self-test: a file of %d lines was not reported" % (MAX_LINES + 1))
            faults = {
                "an include pointing up": '#include "engine/serve/engine.h"\n',
                "an include of a sibling": '#include "shm/coll.h"\n',
                "an include of another folder's private header":
                    '#include "engine/shard/shard_int.h"\n',
                "an include of no file": '#include "kernels/nothing.h"\n',
            }
            for what, line in faults.items():
                with open(victim, "w") as f:
                    f.write("/* #include \"engine/api/frontend.h\" (a comment: no include) */\n")
                    f.write(line)
                if len(check(tmp)[0]) != 1:
                    problems.append("self-test: %s in kernels/ref.c was not reported alone" % what)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for p in problems:
            print("FAIL: " + p)
    if problems:
        return 1
    print("layout: %d files of at most %d lines, %d includes pointing one way%s" %
          (n_files, MAX_LINES, n_edges, ", and the checks can fail" if self_test else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

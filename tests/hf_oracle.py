#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/hf_oracle.py - dpshard against the numpy model of Hugging Face's forward pass
(tests/hf_ref.py), run by tests/hf_oracle.sh.

For every case of hf_ref.CASES it writes the checkpoint and its two sequences, computes the
reference's logits and checks that every variant of the case (a feature removed or misread)
moves them by more than hf_ref.MATTERS; then runs tests/hf_logits on every layout of LAYOUTS
(the GPT-OSS ones with expert parallelism only on the MoE cases) and compares: every logit of
every position of every replica within hf_ref.TOL, the same argmax wherever the reference's top
two are further apart than that. `dpshard generate`, on one rank and TP=2, must continue a
prompt as the reference's greedy continuation does, up to the first step whose top two are
within the tolerance. Deliberate faults must fail: the llama case's engine logits against a
reference with the default rope_theta, the qwen2 case's against one without the q bias, and
tests/hf_logits --fault-tp-rank (one bit of TP rank 1's logits flipped) must report that the
TP ranks differ. It prints a table of every check (the worst error and where) and which cases
pass.

Usage: hf_oracle.py --build BUILDDIR [--case NAME]... [--layout NAME]... [--keep DIR] [--no-e2e]
       hf_oracle.py --list          the layouts (`hf_ref.py list`: the cases)
(names may also be given as comma lists). The binaries are
BUILDDIR/tests/hf_logits and $DPSHARD or BUILDDIR/dpshard. Exit status 0 when every check
passes, 1 otherwise, 2 for a usage error."""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_ref import (CASES, MATTERS, N_LINES, N_POS, TOL, compare, forward, load,  # noqa: E402
                    make, passes, read_ids, self_test, variant)

SIZES2 = ["--attention-dp-size", "2", "--embedding-dp-size", "2", "--mlp-dp-size", "2",
          "--lm-head-dp-size", "2"]
# name: description, hf_logits flags, replicas, only for experts
LAYOUTS = [
    ("tp1", "1 rank", ["--tp", "1"], 1, False),
    ("model", "one-rank model", ["--one-rank-model"], N_LINES, False),
    ("model-ref", "one-rank model, plain-C kernels", ["--one-rank-model", "--reference"],
     N_LINES, False),
    ("tp2", "TP=2", ["--tp", "2"], 1, False),
    ("tp2dp2", "TP=2 x DP=2, sizes 2", ["--tp", "2", "--dp", "2"] + SIZES2, 2, False),
    ("ep-dp2-ag", "EP TP=1 x DP=2, allgather_reducescatter",
     ["--tp", "1", "--dp", "2", "--enable-expert-parallel", "--all2all-backend",
      "allgather_reducescatter"], 2, True),
    ("ep-dp2-a2a", "EP TP=1 x DP=2, alltoallv",
     ["--tp", "1", "--dp", "2", "--enable-expert-parallel", "--all2all-backend", "alltoallv"],
     2, True),
    ("ep-tp2dp2-ag", "EP TP=2 x DP=2, allgather_reducescatter",
     ["--tp", "2", "--dp", "2", "--enable-expert-parallel", "--all2all-backend",
      "allgather_reducescatter"], 2, True),
    ("ep-tp2dp2-a2a", "EP TP=2 x DP=2, alltoallv",
     ["--tp", "2", "--dp", "2", "--enable-expert-parallel", "--all2all-backend", "alltoallv"],
     2, True),
]
RUN_TIMEOUT = 120  # seconds for one engine run


def run(cmd, log, stdout=None):
    """Runs cmd in its own process group, so that a timeout ends all of it (stderr, and stdout
    unless given a file of its own, to log). Its exit status, or "timeout"."""
    with open(log, "w") as f, open(stdout or os.devnull, "w") as out:
        p = subprocess.Popen(cmd, stdout=out if stdout else f, stderr=f, start_new_session=True)
        try:
            return p.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            f.write("\ntimed out after %d s\n" % RUN_TIMEOUT)
            return "timeout"


def cause(path):
    """The first line of a failed run's log (the ranks' own message comes first), and the
    last when it is another."""
    with open(path, errors="replace") as f:
        lines = [l.strip() for l in f if l.strip()]
    return " | ".join(lines[:1] + lines[-1:] if len(lines) > 1 else lines) or "(no output)"


def greedy_reference(s, W, prompt, steps, ends):
    """dpshard generate's run of `steps` forward steps at temperature 0: the generated ids
    (stopping before an end id) and the reference's top-two gap at each."""
    ids, out, gaps = list(prompt), [], []
    while len(ids) <= steps:
        lg = forward(s, W, ids)[-1]
        top2 = np.sort(lg)[-2:]
        nxt = int(np.argmax(lg))  # lowest id among equals, as dpshard's greedy
        if nxt in ends:
            gaps.append(top2[1] - top2[0])
            out.append(None)
            break
        out.append(nxt)
        gaps.append(top2[1] - top2[0])
        ids.append(nxt)
    return out, gaps


def e2e(dpshard, model, s, W, line, work):
    """dpshard generate, one rank and TP=2, against the reference's greedy continuation up to
    the first step whose top two are within TOL: rows (check, ok, None, detail)."""
    results = []
    cfg, prompt, steps = s["cfg"], [int(t) for t in line[:16]], 64
    eos = cfg.get("eos_token_id")
    ends = set(eos if isinstance(eos, list) else [eos]) | {cfg.get("bos_token_id")}
    want, gaps = greedy_reference(s, W, prompt, steps, ends)
    n = next((i for i, g in enumerate(gaps) if g <= TOL), len(gaps))
    for label, extra in (("generate, 1 rank", []),
                         ("generate, TP=2", ["--tensor-parallel-size", "2"])):
        log = os.path.join(work, "generate-%d.log" % len(extra))
        cmd = [dpshard, "generate", "--model", model, "--prompt-ids", "--ids", "-n", str(steps),
               "--temperature", "0"] + extra + [" ".join(map(str, prompt))]
        rc = run(cmd, log, stdout=log + ".out")
        if rc != 0:
            results.append((label, False, None, "failed (%s): %s" % (rc, cause(log))))
            continue
        with open(log + ".out") as f:
            printed = [int(t) for t in f.read().split()]
        # It prints the id after each step's position: the prompt's but the first, then the
        # generated ones; the end id that stops it is not printed.
        gen = printed[len(prompt) - 1:] + [None]
        bad = next((i for i in range(n) if i >= len(gen) or gen[i] != want[i]), None)
        if bad is None:
            results.append((label, True, None, "%d generated ids as the reference's greedy "
                            "continuation (%d compared)" % (len(gen) - 1, n)))
        else:
            results.append((label, False, None, "generated id %d is %s, the reference's %s" %
                            (bad, gen[bad] if bad < len(gen) else "missing", want[bad])))
    return results


def engine_rows(name, cdir, model, hf_logits, layouts, s, ref, engine):
    """One row per layout: tests/hf_logits' logits against the reference's."""
    rows, ids = [], os.path.join(cdir, "ids.txt")
    for key, label, flags, replicas, moe in layouts:
        if moe and s["family"] != "gpt_oss":
            continue
        out, log = os.path.join(cdir, key + ".bin"), os.path.join(cdir, key + ".log")
        rc = run([hf_logits, "--model", model, "--ids", ids, "--out", out] + flags, log)
        if rc != 0:
            rows.append((name, label, False, None, "failed (%s): %s" % (rc, cause(log))))
            continue
        eng = np.fromfile(out, "<f4")
        if eng.size != replicas * N_POS * s["V"]:
            rows.append((name, label, False, None, "wrote %d logits, not %d" %
                         (eng.size, replicas * N_POS * s["V"])))
            continue
        eng = engine[key] = eng.reshape(replicas, N_POS, s["V"])
        err, (d, p), greedy = compare(ref[:replicas], eng)
        what = "max |diff| %.3g at replica %d position %d" % (err, d, p)
        if len(greedy):
            what += "; argmax differs at %d positions (first: replica %d position %d)" % (
                len(greedy), greedy[0][0], greedy[0][1])
        rows.append((name, label, err <= TOL and not len(greedy), err, what))
    return rows


# The deliberate faults: (case, variant) the case's 1-rank engine logits are compared with
# again, against the reference without that feature; the comparison must fail.
FAULTS = [("llama", "rope_theta"), ("qwen2", "q_bias")]


def fault_rows(name, cdir, model, hf_logits, line, engine):
    rows = []
    for case, v in FAULTS:
        if name != case:
            continue
        label, got = "fault: reference without %s" % v, engine.get("tp1")
        if got is None:
            rows.append((name, label, False, None, "not run: no 1-rank engine logits"))
            continue
        vs, vw = variant(v, model)
        vref = forward(vs, vw, line)[None]
        err, caught = compare(vref, got)[0], not passes(vref, got)
        rows.append((name, label, caught, None, ("caught (max |diff| %.3g)" if caught else
                                                 "NOT caught: max |diff| %.3g") % err))
    if name == "llama" and "tp2" in engine:  # TP ranks that differ must be reported
        log = os.path.join(cdir, "fault-tp.log")
        rc = run([hf_logits, "--model", model, "--ids", os.path.join(cdir, "ids.txt"), "--out",
                  os.path.join(cdir, "fault-tp.bin"), "--tp", "2", "--fault-tp-rank"], log)
        with open(log, errors="replace") as f:
            caught = rc == 1 and "logits differ from TP rank 0's" in f.read()
        rows.append((name, "fault: one bit of TP rank 1 flipped", caught, None,
                     ("caught: " if caught else "NOT caught (exit %s): " % rc) + cause(log)))
    return rows


def check_case(name, work, hf_logits, dpshard, layouts, no_e2e):
    """Every row of case `name`: (case, check, ok, logit error or None, detail)."""
    cdir = os.path.join(work, name)
    shutil.rmtree(cdir, ignore_errors=True)
    model = make(name, cdir)
    s, W = load(model)
    lines = read_ids(os.path.join(cdir, "ids.txt"))
    ref = np.stack([forward(s, W, line) for line in lines])
    print("== %s (%s): %s; logits std %.2f, max |logit| %.1f" %
          (name, s["family"], CASES[name][1], ref.std(), np.abs(ref).max()))
    rows = []
    if not 0.5 < ref.std() < 20:
        rows.append((name, "reference", False, None, "logits of std %.3g are not of useful "
                     "magnitude" % ref.std()))
    for v in CASES[name][5]:
        vs, vw = variant(v, model)
        moved = float(np.max(np.abs(forward(vs, vw, lines[0]) - ref[0])))
        print("   variant %-18s moves the logits by up to %.3g%s" %
              (v, moved, "" if moved > MATTERS else " -- FAIL: the feature does not matter"))
        if moved <= MATTERS:
            rows.append((name, "variant " + v, False, None, "moves the logits by %.3g only, "
                         "not more than %g" % (moved, MATTERS)))
    engine = {}
    rows += engine_rows(name, cdir, model, hf_logits, layouts, s, ref, engine)
    if not no_e2e:
        rows += [(name,) + r for r in e2e(dpshard, model, s, W, lines[0], cdir)]
    return rows, fault_rows(name, cdir, model, hf_logits, lines[0], engine)


def report(rows):
    print("\n%-14s %-42s %-6s %s" % ("case", "check", "result", "detail"))
    for name, label, ok, _, what in rows:
        print("%-14s %-42s %-6s %s" % (name, label, "ok" if ok else "FAIL", what))
    failed = [r for r in rows if not r[2]]
    passing = [n for n in dict.fromkeys(r[0] for r in rows) if n not in {r[0] for r in failed}]
    print("\nhf_oracle: %d of %d checks fail; cases whose every check passes: %s" %
          (len(failed), len(rows), " ".join(passing) or "none"))
    if failed:
        worst = {}
        for name, _, _, err, _ in rows:
            if err is not None:
                worst[name] = max(worst.get(name, 0.0), err)
        print("hf_oracle: failing cases (the largest logit error of any layout): %s" %
              ", ".join("%s (%s)" % (n, "%.3g" % worst[n] if n in worst else "no logits")
                        for n in dict.fromkeys(r[0] for r in failed)))
    return 1 if failed else 0


def check(args):
    build = args["build"]
    hf_logits = os.path.join(build, "tests", "hf_logits")
    dpshard = os.environ.get("DPSHARD") or os.path.join(build, "dpshard")
    for exe in (hf_logits, dpshard):
        if not os.access(exe, os.X_OK):
            print("FAIL: %s is not built" % exe)
            return 1
    unknown = [c for c in args["case"] if c not in CASES] + \
        [l for l in args["layout"] if l not in [k[0] for k in LAYOUTS]]
    if unknown:
        print("hf_oracle.py: no case or layout %s (cases: %s; layouts: %s)" % (
            " ".join(unknown), " ".join(CASES), " ".join(k[0] for k in LAYOUTS)),
            file=sys.stderr)
        return 2
    self_test()
    layouts = [l for l in LAYOUTS if not args["layout"] or l[0] in args["layout"]]
    work = args["keep"] or tempfile.mkdtemp(prefix="dps-hf-oracle.")
    rows, faults = [], []
    try:
        for name in args["case"] or list(CASES):
            r, f = check_case(name, work, hf_logits, dpshard, layouts, args["no_e2e"])
            rows, faults = rows + r, faults + f
    finally:
        if not args["keep"]:
            shutil.rmtree(work, ignore_errors=True)
    return report(rows + faults)


def parse(argv):
    args = {"case": [], "layout": [], "keep": None, "no_e2e": False, "build": None}
    if argv == ["--list"]:
        for key, label, _, _, moe in LAYOUTS:
            print("%-14s %s%s" % (key, label, " (MoE cases only)" if moe else ""))
        sys.exit(0)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--case", "--layout", "--keep", "--build") and i + 1 < len(argv):
            if a in ("--case", "--layout"):
                args[a[2:]] += argv[i + 1].split(",")
            else:
                args[a[2:]] = argv[i + 1]
            i += 2
        elif a == "--no-e2e":
            args["no_e2e"] = True
            i += 1
        else:
            print("hf_oracle.py: unknown argument %s\n%s" % (a, __doc__.split("Usage: ")[1]),
                  file=sys.stderr)
            sys.exit(2)
    if not args["build"]:
        print("hf_oracle.py: --build BUILDDIR is required", file=sys.stderr)
        sys.exit(2)
    return args


if __name__ == "__main__":
    sys.exit(check(parse(sys.argv[1:])))

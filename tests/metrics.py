#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/metrics.py - the whole GET /metrics of `dpshard serve` against two oracles.

Format: Prometheus' own `promtool check metrics` (Debian's `prometheus` package) reads every
scrape; its only permitted complaint is "metric names should not contain ':'", a naming
convention that vLLM's `vllm:` names break on purpose. A strict reader of the 0.0.4 text
format written here from its specification also reads it: HELP and TYPE once per family and
before its samples, families contiguous, no series twice, counters ending in _total, histogram
buckets with ascending le ending in +Inf, cumulative counts, +Inf equal to _count, a _sum; and
every counter of the second scrape at least the first's. Both are shown to fail on broken text.

Values, after N completions of known prompt lengths and max_tokens: the token histograms'
_count and _sum equal the requests' counts (the usage each response reports and the lengths
sent), each observation in the bucket vLLM's build_1_2_5_buckets(max_model_len) gives;
queue + prefill + decode add up to e2e and inference is prefill + decode; process_* equal
what /proc says of the supervisor (VmRSS, descriptors, limits, start time) and
dpshard:rank_resident_memory_bytes what it says of each rank.
Exit status: 0 pass, 1 fail, 77 skip (promtool missing, unless DPSHARD_REQUIRE_ORACLES=1).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve  # noqa: E402  (the Server class, check and fail)
from serve import Server, check, fail  # noqa: E402

DPSHARD = serve.DPSHARD
REQUIRE = os.environ.get("DPSHARD_REQUIRE_ORACLES", "0") == "1"
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
SAMPLE = re.compile(r"^(%s)(\{(?:%s)(?:,%s)*,?\}|\{\})? (\S+)(?: (-?\d+))?$" %
                    (NAME, LABEL, LABEL))


def parse(text):
    """The exposition text as {family: (type, {(name, labels): value})}; raises ValueError
    with the line and the rule it breaks."""
    fams, order, seen, cur = {}, [], set(), None
    if not text.endswith("\n"):
        raise ValueError("the text does not end with a newline")
    for no, line in enumerate(text.split("\n")[:-1], 1):
        where = "line %d (%r)" % (no, line[:80])
        m = re.match(r"^# (HELP|TYPE) (%s) ?(.*)$" % NAME, line)
        if m:
            kind, name, rest = m.groups()
            f = fams.setdefault(name, {"help": None, "type": None, "samples": {}})
            if f["samples"]:
                raise ValueError("%s: %s after the family's samples" % (where, kind))
            if f[kind.lower()] is not None:
                raise ValueError("%s: a second %s for %s" % (where, kind, name))
            if kind == "TYPE" and rest not in ("counter", "gauge", "histogram", "summary",
                                               "untyped"):
                raise ValueError("%s: unknown type %r" % (where, rest))
            f[kind.lower()] = rest
            if name not in order:
                order.append(name)
            cur = name
            continue
        if line.startswith("#") or not line:
            continue
        m = SAMPLE.match(line)
        if not m:
            raise ValueError("%s: not a sample line" % where)
        name = m.group(1)
        labels = tuple(re.findall(LABEL, m.group(2) or ""))
        rest = (line[line.rindex("}") + 1:] if m.group(2) else line[len(name):]).split()
        try:
            value = float(rest[0])
        except (ValueError, IndexError):
            raise ValueError("%s: the value is not a number" % where)
        fam = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[:-len(suffix)] in fams and \
                    fams[name[:-len(suffix)]]["type"] == "histogram":
                fam = name[:-len(suffix)]
        if fam not in fams or fams[fam]["type"] is None:
            raise ValueError("%s: %s has no TYPE before it" % (where, name))
        if fam != cur:
            raise ValueError("%s: %s is not with its family (after %s)" % (where, name, cur))
        if (name, labels) in seen:
            raise ValueError("%s: the series %s%s appears twice" % (where, name, labels))
        seen.add((name, labels))
        t = fams[fam]["type"]
        if t == "counter" and (not name.endswith("_total") or value < 0):
            raise ValueError("%s: a counter must end in _total and be >= 0" % where)
        if t == "histogram" and name == fam:
            raise ValueError("%s: a histogram sample without _bucket/_sum/_count" % where)
        fams[fam]["samples"][(name, labels)] = value
    for fam, f in fams.items():
        if f["help"] is None or f["type"] is None:
            raise ValueError("%s lacks HELP or TYPE" % fam)
        if f["type"] == "histogram":
            check_histogram(fam, f["samples"])
    return fams


def check_histogram(fam, samples):
    groups = {}
    for (name, labels), v in samples.items():
        rest = tuple(l for l in labels if l[0] != "le")
        g = groups.setdefault(rest, {"b": [], "sum": None, "count": None})
        if name == fam + "_bucket":
            le = [l[1] for l in labels if l[0] == "le"]
            if len(le) != 1:
                raise ValueError("%s_bucket%s without one le" % (fam, labels))
            g["b"].append((float("inf") if le[0] == "+Inf" else float(le[0]), v))
        elif name == fam + "_sum":
            g["sum"] = v
        else:
            g["count"] = v
    for rest, g in groups.items():
        les = [b[0] for b in g["b"]]
        if les != sorted(les) or len(set(les)) != len(les):
            raise ValueError("%s: the buckets' le are not ascending: %s" % (fam, les))
        if not les or les[-1] != float("inf"):
            raise ValueError("%s: no +Inf bucket" % fam)
        counts = [b[1] for b in g["b"]]
        if counts != sorted(counts):
            raise ValueError("%s: the bucket counts are not cumulative" % fam)
        if g["sum"] is None or g["count"] is None or g["count"] != counts[-1]:
            raise ValueError("%s: _sum or _count missing, or _count != the +Inf bucket" % fam)


def monotonic(a, b):
    """The counters (and histogram counts) of scrape b that went below scrape a's."""
    bad = []
    for fam, f in a.items():
        if f["type"] not in ("counter", "histogram"):
            continue
        for key, v in f["samples"].items():
            if key[0].endswith("_sum") and f["type"] == "histogram":
                continue
            w = b.get(fam, {"samples": {}})["samples"].get(key)
            if w is None or w < v:
                bad.append((key, v, w))
    return bad


def promtool(text):
    """None when promtool accepts the text (only the colon convention may be named), else
    its complaint."""
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    lines = [l for l in (p.stdout + p.stderr).splitlines() if l.strip()]
    other = [l for l in lines if not l.endswith("metric names should not contain ':'")]
    if p.returncode in (0, 3) and not other:
        return None
    return "exit %d: %s" % (p.returncode, "; ".join(other[:5]) or "(nothing said)")


def value(fams, fam, name=None, **labels):
    want = tuple(sorted(labels.items()))
    for (n, l), v in fams[fam]["samples"].items():
        if n == (name or fam) and tuple(sorted(x for x in l if x[0] != "model_name")) == want:
            return v
    raise KeyError("%s%s" % (name or fam, labels))


def buckets_1_2_5(top):
    out, p = [], 1
    while True:
        for m in (1, 2, 5):
            if m * p > top:
                return out
            out.append(m * p)
        p *= 10


def proc_status(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


def test_faults(text):
    """Each mutation of a good scrape must be refused by the strict reader."""
    lines = text.split("\n")
    inf = next(i for i, l in enumerate(lines) if l.startswith("vllm:request_prompt_tokens_bucket")
               and '"+Inf"' in l)
    bad = {
        "no +Inf bucket": "\n".join(lines[:inf] + lines[inf + 1:]),
        "le descending": text.replace('vllm:request_prompt_tokens_bucket{le="1"}',
                                      'vllm:request_prompt_tokens_bucket{le="9999999"}', 1),
        "a series twice": text + "dpshard:up 1\n",
        "sample before its TYPE": "x_total 1\n" + text,
        "bad label escape": text.replace('model_name="', 'model_name="\\q', 1),
    }
    for what, t in bad.items():
        try:
            parse(t)
            fail("the strict reader accepted a scrape with %s" % what)
        except ValueError:
            pass
    a = parse(text)
    dropped = re.sub(r"^(vllm:prompt_tokens_total\{[^}]*\} )\S+$", r"\g<1>0", text, flags=re.M)
    check(monotonic(a, parse(dropped)), "a counter that went down was not noticed")


def main():
    if not DPSHARD or not os.access(DPSHARD, os.X_OK):
        print("SKIP: DPSHARD must name the built binary")
        return 77
    have_promtool = shutil.which("promtool") is not None
    tmp = tempfile.mkdtemp(prefix="dps-metrics-")
    srv = None
    try:
        model = serve.st260(tmp)
        t_start = time.time()
        srv = Server(tmp, model, "--data-parallel-size", "2", "--kv-cache-memory", "32M",
                     "--max-model-len", "300")
        check(srv.wait_ready(), "the server never became ready")
        first_text = srv.get("/metrics")[1].decode()
        first = parse(first_text)
        # N requests of known prompt lengths (ids, no BOS added) and max_tokens, concurrently.
        reqs = [{"prompt": [1] + [300 + (7 * i + j) % 150 for j in range(3 + 11 * i)],
                 "max_tokens": 4 + 9 * i, "temperature": 0} for i in range(6)]
        reqs.append({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0,
                     "stop": ["named"]})
        got = [None] * len(reqs)

        def run(i):
            got[i] = srv.complete(reqs[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
        [t.start() for t in threads]
        [t.join() for t in threads]
        usage = []
        for i, g in enumerate(got):
            if check(g and g[0] == 200, "request %d: %s" % (i, g)):
                usage.append(g[1]["usage"])
        time.sleep(0.7)  # the replicas' stats (every 500 ms)
        text = srv.get("/metrics")[1].decode()
        rss_now = proc_status(srv.proc.pid, "VmRSS")
        fds_now = len(os.listdir("/proc/%d/fd" % srv.proc.pid))
        try:
            fams = parse(text)
        except ValueError as e:
            fail("the strict reader: %s" % e)
            return 1
        bad = monotonic(first, fams)
        check(not bad, "counters went down between two scrapes: %s" % bad[:3])
        if have_promtool:
            for label, t in (("first", first_text), ("second", text)):
                msg = promtool(t)
                check(msg is None, "promtool check metrics refuses the %s scrape: %s" % (label, msg))
            check(promtool(text.replace("dpshard:up 1", "dpshard:up{ 1", 1)) is not None,
                  "promtool accepted a broken line (the check cannot fail)")
        test_faults(text)

        n = len(usage)
        max_len = 300
        prompt = [u["prompt_tokens"] for u in usage]
        gen = [u["completion_tokens"] for u in usage]
        check(prompt[:6] == [len(r["prompt"]) for r in reqs[:6]],
              "usage.prompt_tokens %s are not the prompts' lengths" % prompt)
        for fam, obs in (("vllm:request_prompt_tokens", prompt),
                         ("vllm:request_generation_tokens", gen),
                         ("vllm:request_params_max_tokens", [r["max_tokens"] for r in reqs]),
                         ("vllm:request_params_n", [1] * n)):
            bounds = [1, 2, 5, 10, 20] if fam.endswith("_n") else buckets_1_2_5(max_len)
            check(value(fams, fam, fam + "_count") == n and
                  value(fams, fam, fam + "_sum") == sum(obs),
                  "%s: count %s sum %s, want %d and %d" % (fam, value(fams, fam, fam + "_count"),
                                                           value(fams, fam, fam + "_sum"), n,
                                                           sum(obs)))
            les = sorted(float(dict(l)["le"]) for (nm, l) in fams[fam]["samples"]
                         if nm.endswith("_bucket") and dict(l)["le"] != "+Inf")
            check(les == [float(b) for b in bounds], "%s: buckets %s, vLLM's %s" % (fam, les, bounds))
            for b in bounds:
                check(value(fams, fam, fam + "_bucket", le="%g" % b) ==
                      sum(1 for o in obs if o <= b), "%s: the le=%g bucket" % (fam, b))
        s = {k: value(fams, "vllm:" + k, "vllm:" + k + "_sum") for k in
             ("request_queue_time_seconds", "request_prefill_time_seconds",
              "request_decode_time_seconds", "request_inference_time_seconds",
              "e2e_request_latency_seconds")}
        c = {k: value(fams, "vllm:" + k, "vllm:" + k + "_count") for k in s}
        check(all(v == n for v in c.values()), "the phase histograms' counts %s, want %d" % (c, n))
        parts = (s["request_queue_time_seconds"] + s["request_prefill_time_seconds"] +
                 s["request_decode_time_seconds"])
        e2e = s["e2e_request_latency_seconds"]
        print("%d requests: queue %.4f + prefill %.4f + decode %.4f = %.4f s, e2e %.4f s" %
              (n, s["request_queue_time_seconds"], s["request_prefill_time_seconds"],
               s["request_decode_time_seconds"], parts, e2e))
        check(-1e-5 * n <= e2e - parts <= 0.05 * e2e + 0.005 * n,
              "queue + prefill + decode = %.6f s, e2e %.6f s" % (parts, e2e))
        check(abs(s["request_inference_time_seconds"] - s["request_prefill_time_seconds"] -
                  s["request_decode_time_seconds"]) <= 1e-5 * n,
              "inference %.6f s is not prefill + decode" % s["request_inference_time_seconds"])
        check(s["request_queue_time_seconds"] > 0 and s["request_prefill_time_seconds"] > 0,
              "queue and prefill times should be positive: %s" % s)

        # process_*: the supervisor, as /proc sees it.
        rss = value(fams, "process_resident_memory_bytes")
        check(abs(rss - rss_now) <= max(0.1 * rss_now, 2 << 20),
              "process_resident_memory_bytes %d, VmRSS of the supervisor %d" % (rss, rss_now))
        vm = value(fams, "process_virtual_memory_bytes")
        check(abs(vm - proc_status(srv.proc.pid, "VmSize")) <= 64 << 20,
              "process_virtual_memory_bytes %d is not VmSize" % vm)
        check(abs(value(fams, "process_open_fds") - fds_now) <= 3,
              "process_open_fds %d, /proc lists %d" % (value(fams, "process_open_fds"), fds_now))
        with open("/proc/%d/limits" % srv.proc.pid) as f:
            soft = [l.split()[3] for l in f if l.startswith("Max open files")][0]
        check(str(int(value(fams, "process_max_fds"))) == soft,
              "process_max_fds %d, the soft limit %s" % (value(fams, "process_max_fds"), soft))
        st = value(fams, "process_start_time_seconds")
        check(t_start - 2 <= st <= t_start + 5,
              "process_start_time_seconds %.2f, started at %.2f" % (st, t_start))
        check(value(fams, "process_cpu_seconds_total") <= time.time() - t_start + 1,
              "process_cpu_seconds_total exceeds the wall time")
        print("process_resident_memory_bytes %d, VmRSS %d" % (rss, rss_now))
        with open("/proc/%d/task/%d/children" % (srv.proc.pid, srv.proc.pid)) as f:
            kids = [int(x) for x in f.read().split()]
        ranks = {dict(l)["rank"]: v for (nm, l), v in
                 fams["dpshard:rank_resident_memory_bytes"]["samples"].items()}
        check(len(ranks) == 2 and len(kids) == 2, "ranks %s, children %s" % (ranks, kids))
        for pid in kids:
            r = proc_status(pid, "VmRSS")
            check(any(abs(v - r) <= max(0.1 * r, 2 << 20) for v in ranks.values()),
                  "no dpshard:rank_resident_memory_bytes near rank pid %d's VmRSS %d: %s" %
                  (pid, r, ranks))
        check(srv.stop() == 0, "the server did not exit 0")
        srv = None
    finally:
        if srv:
            srv.proc.kill()
            srv.proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    if serve.failures:
        print("%d failure(s)" % len(serve.failures))
        return 1
    if not have_promtool:
        if REQUIRE:
            print("FAIL: promtool is missing (Debian package prometheus; "
                  "DPSHARD_REQUIRE_ORACLES=1: it may not be skipped)")
            return 1
        print("SKIP: promtool is missing (Debian package prometheus); the strict reader passed")
        return 77
    print("metrics: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

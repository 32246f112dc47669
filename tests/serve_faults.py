#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/serve_faults.py - `dpshard serve` with a hung rank (docs/DESIGN.md sections 1 and 5).

On TP=1 x DP=2 with --rank-timeout 2: a rank stopped with SIGSTOP while requests run, and a
rank spinning in a loop (the test-only DPSHARD_FAULT=spin:RANK:STEP), must each be named in
the log with its pid as hung; a rank blocked in a real wait that nothing ever ends
(DPSHARD_FAULT=wait:RANK:STEP: it keeps beating "alive" but does no work) must be named as a
deadlock ("... made no progress for N s while waiting ...: deadlock"); in each case the requests in flight must end with an error within the timeout and a
few seconds; /health must answer 503 with the reason while the ranks restart and 200 after;
later requests must equal the oracle's tokens (`dpshard generate --requests`, as serve.py).
An idle instance, even with a rank stopped, must stay healthy for several timeouts: the
detector fires when work is pending (the two cases above) and never while idle. An unknown
DPSHARD_FAULT is refused by name. Exit status: 0 pass, 1 fail, 77 skip.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve as S  # noqa: E402  (its Server, oracle and checks)

TIMEOUT = 2  # --rank-timeout, seconds
SLACK = 4    # detection, failing and answering on a loaded 2-core machine


def alive(pid, secs=5):
    """Whether pid still exists after secs (a killed rank is a zombie until it is reaped)."""
    end = time.time() + secs
    while time.time() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.05)
    return True


def run_long(srv, n, max_tokens):
    """Starts n requests in threads; returns (threads, results, end times)."""
    out, ends = [None] * n, [None] * n
    req = {"prompt": [1, 2, 3], "max_tokens": max_tokens, "temperature": 0}

    def client(i):
        try:
            out[i] = srv.complete(req) if i % 2 else srv.stream(req)
        except Exception as e:  # noqa: BLE001
            out[i] = ("exception", repr(e))
        ends[i] = time.time()

    ts = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    return ts, out, ends


def failed(r, i):
    """Whether result r of run_long's request i ended with an error."""
    if i % 2:
        return r and r[0] == 500 and "error" in r[1]
    return r and r[0] == 200 and r[3] == "error" and r[5]


def watch_health(srv, secs):
    """Polls /health for secs; returns the (time, status, body) seen."""
    seen, end = [], time.time() + secs
    while time.time() < end:
        try:
            st, b = srv.get("/health")
            seen.append((time.time(), st, b))
        except OSError as e:
            seen.append((time.time(), -1, repr(e).encode()))
        time.sleep(0.1)
    return seen


def check_recovery(srv, label, hung_pid, t_fault, ts, out, ends, want, reqs, why="hung"):
    """The common outcome of a hang (why "hung") or a deadlock (why "deadlock"): errors in
    time, the rank named, 503 then 200, right tokens after."""
    health = watch_health(srv, 1.0)
    for t in ts:
        t.join(60)
    for i, r in enumerate(out):
        S.check(failed(r, i), "%s: request %d did not end with an error: %s" % (label, i, str(r)[:200]))
        if ends[i]:
            took = ends[i] - t_fault
            S.check(TIMEOUT - 0.5 <= took <= TIMEOUT + SLACK,
                    "%s: request %d ended %.1f s after the fault (timeout %d s)" % (label, i, took, TIMEOUT))
    log = open(srv.log_path).read()
    if why == "hung":
        named = "rank 1 (DP 1, TP 0), pid %d, made no progress" % hung_pid
    else:
        named = "rank 1 (DP 1, TP 0) made no progress for"
    S.check(named in log and why in log and (why == "hung") == ("while waiting" not in log),
            "%s: the log does not name the %s rank: %s" % (label, why, log[-1500:]))
    S.check(not alive(hung_pid), "%s: the hung rank %d is still alive" % (label, hung_pid))
    health += watch_health(srv, 0.5)
    bad = [h for h in health if h[1] == 503]
    S.check(bad and all(b"recovering" in h[2] and b"rank 1 (DP 1, TP 0)" in h[2] for h in bad),
            "%s: /health while recovering: %s" % (label, health[:3]))
    if bad:
        j = json.loads(bad[0][2])
        S.check(j.get("status") == "recovering" and why in j.get("reason", ""),
                "%s: /health's reason: %s" % (label, j))
    S.check(srv.wait_ready(60), "%s: the service did not recover" % label)
    took = [e - t_fault for e in ends if e]
    if took:  # the figures of README's "Reliability in brief"
        print("%s: %d requests failed %.1f-%.1f s after the fault (--rank-timeout %d); "
              "/health 503 on %d polls; ready again %.1f s after the fault" %
              (label, len(took), min(took), max(took), TIMEOUT, len(bad), time.time() - t_fault))
    got = []
    for r in reqs:
        st, j = srv.complete(r)
        got.append(j["choices"][0]["token_ids"] if st == 200 else None)
    S.check(S.compare(got, want, label) == 0, "%s: requests after recovery differ from the oracle" % label)
    m = srv.get("/metrics")[1].decode()
    S.check("dpshard:rank_restarts_total 1" in m, "%s: the restart is not counted" % label)


def injected(tmp, model, args, fault, says, why, want, reqs):
    """Rank 1 given DPSHARD_FAULT=FAULT:1:20 while requests run: the log says SAYS when it
    fires, and the outcome is check_recovery's for WHY."""
    env = dict(os.environ, DPSHARD_FAULT="%s:1:20" % fault)
    srv = S.Server(tmp, model, *args, env=env, name=fault)
    S.check(srv.wait_ready(), "the %s server did not become ready" % fault)
    ranks = srv.children()
    ts, out, ends = run_long(srv, 4, 3000)
    log, deadline = "", time.time() + 20
    while "DPSHARD_FAULT: " + says not in log and time.time() < deadline:
        time.sleep(0.05)
        log = open(srv.log_path).read()
    t_fault = time.time()
    S.check("rank 1: DPSHARD_FAULT: " + says in log,
            "the %s fault did not fire: %s" % (fault, log[-800:]))
    if len(ranks) == 2:
        check_recovery(srv, fault, ranks[1], t_fault, ts, out, ends, want, reqs, why=why)
    S.check(srv.stop() == 0, "the %s server did not exit 0" % fault)


def run(tmp):
    slow = os.path.join(tmp, "slow")  # long generations
    subprocess.run([S.DPSHARD, "mkmodel", "--preset", "small", "--max-position-embeddings", "4096",
                    "--out", slow], check=True, capture_output=True)
    reqs = [{"prompt": [1 + i, 2, 3], "max_tokens": 8 + 5 * i, "temperature": 0} for i in range(4)]
    want = S.oracle(tmp, slow, reqs)
    # The check can fail: a wrong oracle token is reported.
    bad = [list(w) for w in want]
    bad[1][0] ^= 1
    S.check(S.compare(want, bad, "deliberate") == 1, "the oracle comparison cannot fail")
    args = ["--data-parallel-size", "2", "--kv-cache-memory", "64M",
            "--rank-timeout", str(TIMEOUT)]

    # ---- idle, even with a rank stopped, for several timeouts: healthy, nobody killed -------
    srv = S.Server(tmp, slow, *args, name="stop")
    S.check(srv.wait_ready(), "the server did not become ready")
    ranks = srv.children()
    S.check(len(ranks) == 2, "want 2 rank processes, found %s" % ranks)
    health = watch_health(srv, 2.5 * TIMEOUT)
    if len(ranks) == 2:
        os.kill(ranks[1], signal.SIGSTOP)
        health += watch_health(srv, 2.5 * TIMEOUT)
        os.kill(ranks[1], signal.SIGCONT)
    S.check(all(h[1] == 200 for h in health), "idle: /health was not always 200: %s" %
            [h for h in health if h[1] != 200][:3])
    S.check("made no progress" not in open(srv.log_path).read(), "idle: a rank was called hung")
    S.check(srv.children() == ranks, "idle: the ranks were restarted")

    # ---- SIGSTOP of rank 1 while requests run on both replicas ------------------------------
    ts, out, ends = run_long(srv, 4, 3000)
    time.sleep(0.8)
    t_fault = time.time()
    if len(ranks) == 2:
        os.kill(ranks[1], signal.SIGSTOP)
        check_recovery(srv, "SIGSTOP", ranks[1], t_fault, ts, out, ends, want, reqs)
    S.check(srv.stop() == 0, "the server did not exit 0")

    # ---- rank 1 spins in a loop at its step 20 (DPSHARD_FAULT, test-only) --------------------
    injected(tmp, slow, args, "spin", "spinning at step 20", "hung", want, reqs)
    # ---- rank 1 waits for ever at its step 20, beating alive, doing no work: a deadlock ------
    injected(tmp, slow, args, "wait", "waiting for ever at step 20", "deadlock", want, reqs)

    # ---- a fault this build does not inject is refused by name -------------------------------
    env = dict(os.environ, DPSHARD_FAULT="hang:1")
    p = subprocess.run([S.DPSHARD, "serve", "--model", slow, "--port", "0", "--cpu-bind", "off",
                        "--kv-cache-memory", "64M"], env=env, capture_output=True, text=True,
                       timeout=120)
    S.check(p.returncode == 2 and "DPSHARD_FAULT=hang:1 is not a fault" in p.stderr,
            "an unknown fault: exit %d, %s" % (p.returncode, p.stderr[-400:]))
    return 1 if S.failures else 0


def main():
    return S.run_script(run, "dps-faults-")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/serve_disagg.py - `dpshard serve` with disaggregated prefill (docs/DESIGN.md section 3).

Decode TP=1 x DP=2 with attention, embedding and LM head sizes 2 (each decode rank holds the
decode layouts only), and one prefill replica of TP=2, over real HTTP: every request is
prefilled by the prefill replica, which samples its first token, and decoded by a decode
replica after the KV blocks moved through shared memory. Checked: the tokens of concurrent
requests, streamed or not, equal the one-rank oracle (`dpshard generate --requests`, as
serve.py); /metrics counts the hand-offs and the transfers (with bytes and seconds), names
each replica's role, and holds no block in flight once idle; a stream cancelled by its client
mid-decode ends "cancelled" and frees its blocks on both sides (KV usage 0 after); a deadline
travels with the request (a 60 s one changes nothing, a 1.5 s one ends a long request with
"timeout" on the decode side, its blocks freed); on the prefill side, a client that leaves
during a long prefill and a 5 ms deadline end the request there, freeing its blocks; a prefill
rank and a decode rank killed (SIGKILL) while requests run each fail the requests in flight
with an error, the log names the rank, and the service restarts and answers right again.
Exit status: 0 pass, 1 fail, 77 skip.
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve as S  # noqa: E402  (its Server, oracle and checks)

LAYOUT = ["--data-parallel-size", "2", "--attention-dp-size", "2", "--embedding-dp-size", "2",
          "--lm-head-dp-size", "2", "--prefill-data-parallel-size", "1",
          "--prefill-tensor-parallel-size", "2", "--kv-cache-memory", "64M"]


def metric(text, name):
    """The value of an unlabelled metric line, or None."""
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def metrics_settled(srv):
    """/metrics once the replicas' counts (sent every 500 ms) have caught up."""
    time.sleep(1.2)
    return srv.get("/metrics")[1].decode()


def stream_ids(srv, req):
    """Streams req (serve.py's client, its own connection); returns its token ids, or None."""
    st, events = srv.stream(req)[:2]
    if st != 200:
        return None
    return [t for e in events for ch in e.get("choices", []) for t in ch.get("token_ids", [])]


def concurrent(srv, reqs):
    """Runs reqs at once (odd ones streamed); returns their token ids in order."""
    got = [None] * len(reqs)

    def client(i):
        if i % 2:
            got[i] = stream_ids(srv, reqs[i])
        else:
            st, j = srv.complete(reqs[i])
            got[i] = j["choices"][0]["token_ids"] if st == 200 else None

    ts = [threading.Thread(target=client, args=(i,)) for i in range(len(reqs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return got


def long_requests(srv, n):
    """n long requests in threads; returns (threads, results)."""
    out = [None] * n
    req = {"prompt": [1, 2, 3], "max_tokens": 3000, "temperature": 0}

    def client(i):
        try:
            out[i] = srv.complete(req)
        except Exception as e:  # noqa: BLE001
            out[i] = ("exception", repr(e))

    ts = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    return ts, out


def kill_one(srv, label, victim, named, want, reqs):
    """Kills rank `victim` (SIGKILL) while long requests run: they fail, the log names the
    rank, the service comes back and answers as the oracle."""
    ranks = srv.children()
    if not S.check(len(ranks) == 4, "%s: want 4 rank processes, found %s" % (label, ranks)):
        return
    ts, out = long_requests(srv, 3)
    time.sleep(1.0)
    t_kill = time.time()
    os.kill(ranks[victim], signal.SIGKILL)
    for t in ts:
        t.join(60)
    for i, r in enumerate(out):
        S.check(r is not None and r[0] in (200, 500) and
                (r[0] == 500 or r[1]["choices"][0]["finish_reason"] == "error"),
                "%s: request %d did not end with an error: %s" % (label, i, str(r)[:200]))
    log = open(srv.log_path).read()
    S.check(named in log and "killed by signal 9" in log,
            "%s: the log does not name the killed rank: %s" % (label, log[-1200:]))
    S.check(srv.wait_ready(90), "%s: the service did not recover" % label)
    print("%s: %d requests in flight ended in error; ready again %.1f s after the kill" %
          (label, sum(1 for r in out if r and r[0] in (200, 500)), time.time() - t_kill))
    got = [srv.complete(r)[1]["choices"][0]["token_ids"] for r in reqs]
    S.check(S.compare(got, want, label) == 0, "%s: requests after recovery differ" % label)


def run(tmp):
    slow = os.path.join(tmp, "slow")  # long generations
    subprocess.run([S.DPSHARD, "mkmodel", "--preset", "small", "--max-position-embeddings", "4096",
                    "--out", slow], check=True, capture_output=True)
    reqs = [{"prompt": [1 + i, 2, 3, 4 + i], "max_tokens": 6 + 7 * i, "temperature": 0}
            for i in range(6)]
    want = S.oracle(tmp, slow, reqs)
    bad = [list(w) for w in want]
    bad[2][0] ^= 1
    S.check(S.compare(want, bad, "deliberate") == 1, "the oracle comparison cannot fail")

    shm_before = S.shm_entries()
    srv = S.Server(tmp, slow, *LAYOUT, "--verbose", name="disagg")
    S.check(srv.wait_ready(90), "the server did not become ready: " +
            open(srv.log_path).read()[-1500:])
    log = open(srv.log_path).read()
    # decode ranks hold no prefill layout of attention, embedding or LM head
    for r in (0, 1):
        line = [l for l in log.splitlines() if l.startswith("rank %d (DP %d, TP 0):" % (r, r))]
        S.check(line and "attention (prefill" not in line[0] and "embedding (prefill" not in
                line[0] and "LM head (prefill" not in line[0],
                "decode rank %d holds prefill layouts: %s" % (r, line))

    # ---- equivalence, concurrent, streamed and not -------------------------------------------
    got = concurrent(srv, reqs)
    S.check(S.compare(got, want, "disaggregated") == 0,
            "disaggregated requests differ from the oracle")
    m = metrics_settled(srv)
    print("after %d requests: %s" % (len(reqs), ", ".join(
        "%s %s" % (k, metric(m, "dpshard:" + k)) for k in (
            "kv_handoffs_total", "kv_transfers_total", "kv_transfer_bytes_total",
            "kv_transfer_seconds_total", "kv_handoffs_in_flight"))))
    S.check(metric(m, "dpshard:kv_handoffs_total") == len(reqs),
            "kv_handoffs_total: %s" % metric(m, "dpshard:kv_handoffs_total"))
    S.check(metric(m, "dpshard:kv_transfers_total") == len(reqs),
            "kv_transfers_total: %s" % metric(m, "dpshard:kv_transfers_total"))
    S.check((metric(m, "dpshard:kv_transfer_bytes_total") or 0) > 0, "no transfer bytes")
    S.check((metric(m, "dpshard:kv_transfer_seconds_total") or 0) > 0, "no transfer time")
    S.check(metric(m, "dpshard:kv_handoffs_in_flight") == 0, "blocks held after the requests")
    S.check('dpshard:replica_role{engine="2",role="prefill"} 1' in m and
            'dpshard:replica_role{engine="0",role="decode"} 1' in m, "replica roles missing")

    # ---- a stream cancelled by its client after the hand-off ----------------------------------
    c = srv.conn()
    c.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": [5, 6, 7], "max_tokens": 3000, "temperature": 0, "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    seen = b""
    while seen.count(b"data: ") < 20:
        chunk = r.read1(65536)
        if not chunk:
            break
        seen += chunk
    c.close()  # the client leaves mid-decode
    deadline, log = time.time() + 10, ""
    while "finish cancelled" not in log and time.time() < deadline:
        time.sleep(0.1)
        log = open(srv.log_path).read()
    S.check("finish cancelled" in log, "the left stream was not cancelled: " + log[-600:])
    m = metrics_settled(srv)
    S.check(metric(m, "dpshard:kv_handoffs_in_flight") == 0, "blocks held after the cancel")
    use = re.findall(r'^vllm:kv_cache_usage_perc\{[^}]*\} (\S+)$', m, re.M)
    S.check(len(use) == 3 and all(float(u) == 0 for u in use),
            "KV blocks still in use after the cancel: %s" % use)

    # ---- deadlines across the hand-off: one that must not fire, one that does ---------------
    st, j = srv.complete(dict(reqs[3], timeout_ms=60000))
    S.check(st == 200 and j["choices"][0]["token_ids"] == want[3] and
            j["choices"][0]["finish_reason"] == "length",
            "a 60 s deadline changed the request: %s" % str(j)[:300])
    t0 = time.time()
    st, j = srv.complete({"prompt": [9, 8, 7], "max_tokens": 3000, "temperature": 0,
                          "timeout_ms": 1500})
    took = time.time() - t0
    S.check(st == 200 and j["choices"][0]["finish_reason"] == "timeout" and
            0 < j["usage"]["completion_tokens"] < 3000 and 1.4 < took < 6,
            "a 1.5 s deadline on the decode side: %.1f s, %s" % (took, str(j)[:300]))
    m = metrics_settled(srv)
    S.check(metric(m, "dpshard:kv_handoffs_in_flight") == 0, "blocks held after the timeout")
    use = re.findall(r'^vllm:kv_cache_usage_perc\{[^}]*\} (\S+)$', m, re.M)
    S.check(len(use) == 3 and all(float(u) == 0 for u in use),
            "KV blocks still in use after the timeout: %s" % use)

    # ---- the prefill side: a client that leaves during a long prefill, and a deadline that
    # ends a request before its hand-off; both free their blocks -----------------------------
    long_prompt = [1 + (i * 7) % 250 for i in range(1500)]
    c = srv.conn()
    c.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": long_prompt, "max_tokens": 50, "temperature": 0, "stream": True}),
              headers={"Content-Type": "application/json"})
    c.getresponse()  # the stream's headers: the request is with the prefill replica
    c.close()  # gone before its first token
    st, j = srv.complete({"prompt": long_prompt, "max_tokens": 50, "temperature": 0,
                          "timeout_ms": 5})
    S.check(st == 200 and j["choices"][0]["finish_reason"] == "timeout" and
            j["usage"]["completion_tokens"] == 0,
            "a 5 ms deadline during the prefill: %s" % str(j)[:300])
    deadline, log = time.time() + 20, ""
    while log.count("finish cancelled") < 2 and time.time() < deadline:
        time.sleep(0.1)
        log = open(srv.log_path).read()
    S.check(log.count("finish cancelled") >= 2, "the left prefill was not cancelled: " + log[-600:])
    m = metrics_settled(srv)
    use = re.findall(r'^vllm:kv_cache_usage_perc\{[^}]*\} (\S+)$', m, re.M)
    S.check(metric(m, "dpshard:kv_handoffs_in_flight") == 0 and len(use) == 3 and
            all(float(u) == 0 for u in use),
            "blocks held after the prefill-side cancel and timeout: %s" % use)

    # ---- a killed rank on each side: requests fail, the service recovers ---------------------
    kill_one(srv, "prefill rank", 2, "rank 2 (prefill replica 0, TP 0)", want, reqs)
    kill_one(srv, "decode rank", 1, "rank 1 (DP 1, TP 0)", want, reqs)
    S.check(srv.stop() == 0, "the server did not exit 0")
    S.check(S.shm_leaks(shm_before) == [], "segments left in /dev/shm: %s" % S.shm_leaks(shm_before))
    return 1 if S.failures else 0


def main():
    return S.run_script(run, "dps-disagg-")


if __name__ == "__main__":
    sys.exit(main())

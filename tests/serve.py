#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/serve.py - `dpshard serve` end to end: the real binary on a free loopback port.

Oracle: `dpshard generate --requests` (the engine without HTTP) for the same requests: every
completion's token ids must equal its. Checked: completions streaming and not, /v1/models,
/health, /metrics; 64 concurrent clients with mixed lengths all answered whole and right;
every bad request answered with its status and a JSON error, and nothing disturbed; slow,
half-closed and vanishing clients; deadlines; the API key; SIGKILL of a rank while requests
run (they fail cleanly, the service recovers, later requests succeed, /dev/shm holds only the
live instance's segments); SIGTERM drain (running requests finish, new ones get 503, exit
0); the unit file under `systemd-analyze verify`; READY/STATUS/WATCHDOG/STOPPING on a real
notify socket. A deliberately wrong oracle token must be reported (the check can fail).
Exit status: 0 pass, 1 fail, 77 skip.
"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

DPSHARD = os.environ.get("DPSHARD", "")
SRC = os.environ.get("DPSHARD_SRCDIR", ".")
ST260 = os.path.join(SRC, "models", "stories260K")  # part of the repository
failures = []


def fail(msg):
    print("FAIL: " + msg, flush=True)
    failures.append(msg)


def check(cond, msg):
    if not cond:
        fail(msg)
    return cond


class Server:
    """One `dpshard serve` process, its port, and its log."""

    def __init__(self, tmp, model, *args, env=None, name="srv", log_file=None):
        self.log_path = os.path.join(tmp, name + ".log")
        self.log = open(self.log_path, "w")
        watch = log_file or self.log_path
        self.proc = subprocess.Popen(
            [DPSHARD, "serve"] + (["--model", model] if model else []) +
            ["--port", "0", "--cpu-bind", "off"] + list(args),
            stdout=self.log, stderr=self.log, env=env)
        self.port = None
        deadline = time.time() + 30
        while time.time() < deadline and self.port is None:
            if not os.path.exists(watch):
                time.sleep(0.05)
                continue
            with open(watch) as f:
                for line in f:
                    if "listening on http://" in line:
                        self.port = int(line.split("listening on http://")[1].split(",")[0]
                                        .rsplit(":", 1)[1])
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if self.port is None:
            raise RuntimeError("the server did not start: " + open(self.log_path).read() +
                               (open(watch).read() if os.path.exists(watch) else ""))

    def wait_ready(self, secs=60):
        deadline = time.time() + secs
        while time.time() < deadline:
            try:
                st, _ = self.get("/health")
                if st == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def get(self, path, headers=None):
        c = self.conn()
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, body

    def post(self, path, body, headers=None):
        c = self.conn()
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        c.request("POST", path, body=data, headers=headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        out = r.read()
        c.close()
        return r.status, out

    def complete(self, req, headers=None):
        st, out = self.post("/v1/completions", req, headers)
        return st, json.loads(out)

    def stream(self, req):
        """Returns (status, events, text, finish_reason, usage, saw_done)."""
        req = dict(req, stream=True)
        self.stream_ids = []
        c = self.conn()
        c.request("POST", "/v1/completions", body=json.dumps(req),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        events, text, finish, usage, done = [], "", None, None, False
        if r.status != 200:
            return r.status, [], "", None, None, False
        buf = b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                ev = ev.decode()
                if not ev.startswith("data: "):
                    continue
                payload = ev[6:]
                if payload == "[DONE]":
                    done = True
                    continue
                j = json.loads(payload)
                events.append(j)
                if j.get("usage"):
                    usage = j["usage"]
                for ch in j.get("choices", []):
                    text += ch.get("text", "")
                    self.stream_ids += ch.get("token_ids", [])
                    if ch.get("finish_reason"):
                        finish = ch["finish_reason"]
        c.close()
        return 200, events, text, finish, usage, done

    def children(self):
        try:
            out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.proc.pid)],
                                 capture_output=True, text=True).stdout.split()
            return [int(p) for p in out]
        except OSError:
            return []

    def send(self, sig):
        self.signalled = True
        self.proc.send_signal(sig)

    def stop(self, sig=signal.SIGTERM, secs=30):
        """Stops the server (unless a signal was sent already) and returns its exit status."""
        if self.proc.poll() is None and not getattr(self, "signalled", False):
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(secs)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self.log.close()


def st260(tmp, name="st260"):
    """The built-in stories260K converted into the model directory tmp/name; returns its path."""
    model = os.path.join(tmp, name)
    subprocess.run([DPSHARD, "convert", "llama2c", os.path.join(ST260, "stories260K.bin"),
                    os.path.join(ST260, "tok512.bin"), model], check=True, capture_output=True)
    return model


def oracle(tmp, model, reqs, name="oracle"):
    """Token ids of each request from `dpshard generate --requests` (no HTTP)."""
    path = os.path.join(tmp, name + ".jsonl")
    with open(path, "w") as f:
        for r in reqs:
            line = {"max_tokens": r["max_tokens"], "temperature": r.get("temperature", 0)}
            if isinstance(r["prompt"], str):
                line["prompt"] = r["prompt"]
            else:
                line["prompt_ids"] = r["prompt"]
            if "seed" in r:
                line["seed"] = r["seed"]
            f.write(json.dumps(line) + "\n")
    out = subprocess.run([DPSHARD, "generate", "--model", model, "--requests", path,
                          "--cpu-bind", "off"], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError("generate --requests failed: " + out.stderr)
    return [json.loads(l)["token_ids"] for l in out.stdout.splitlines() if l.strip()]


def shm_entries():
    return sorted(e for e in os.listdir("/dev/shm") if e.startswith("dpshard-"))


def shm_leaks(before):
    """The dpshard segments made since `before` (a shm_entries()) whose maker has exited: what
    a server left behind. A segment is named dpshard-PID-...; a running process's segments (this
    test's live server, or another test run's on the same machine) are not leaks."""
    def gone(e):
        try:
            os.kill(int(e.split("-")[1]), 0)
            return False
        except ProcessLookupError:
            return True
        except (ValueError, IndexError):
            return True
        except PermissionError:
            return False
    left = [e for e in shm_entries() if e not in before and gone(e)]
    return [e for e in left if os.path.exists(os.path.join("/dev/shm", e))]  # (still there)


def raw(port, data, shutdown_wr=False, wait=5.0):
    """Sends bytes on a fresh connection; returns what comes back before the server closes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=wait)
    s.sendall(data)
    if shutdown_wr:
        s.shutdown(socket.SHUT_WR)
    got = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
    except socket.timeout:
        got += b"<timeout>"
    s.close()
    return got


def run_script(run, prefix):
    """A test script's main: run(tmp) in a fresh scratch folder; 77 (skip) without DPSHARD."""
    if not DPSHARD or not os.access(DPSHARD, os.X_OK):
        print("SKIP: DPSHARD must name the built binary")
        return 77
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        rc = run(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASS" if rc == 0 else "FAIL: %d check(s)" % len(failures))
    return rc


def compare(results, want, label):
    """Counts the results whose token ids differ from the oracle's."""
    bad = 0
    for i, (got, exp) in enumerate(zip(results, want)):
        if got != exp:
            bad += 1
            if bad <= 3:
                print("  %s request %d: got %s, want %s" % (label, i, got, exp))
    return bad + abs(len(results) - len(want))


def main():
    if not DPSHARD or not os.access(DPSHARD, os.X_OK):
        print("SKIP: DPSHARD must name the built binary")
        return 77
    tmp = tempfile.mkdtemp(prefix="dps-serve-")
    try:
        return run(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(tmp):
    if not os.path.exists(os.path.join(ST260, "stories260K.bin")):
        fail("%s is missing from the source tree" % ST260)
        return 1
    model = st260(tmp)
    slow = os.path.join(tmp, "slow")  # long generations, for clients that leave mid-way
    subprocess.run([DPSHARD, "mkmodel", "--preset", "small", "--max-position-embeddings", "4096",
                    "--out", slow], check=True, capture_output=True)
    shm_before = shm_entries()
    # The leak check can fail: a segment whose maker has exited is one, a live maker's is not.
    ended = subprocess.Popen(["true"])
    ended.wait()
    fakes = ["dpshard-%d-1-0-selfcheck" % pid for pid in (ended.pid, os.getpid())]
    for e in fakes:
        open(os.path.join("/dev/shm", e), "w").close()
    try:
        check(shm_leaks(shm_before) == fakes[:1], "self-check: shm_leaks saw %s" % shm_leaks(shm_before))
    finally:
        for e in fakes:
            os.unlink(os.path.join("/dev/shm", e))

    # ---- completions against the oracle, on TP=1 x DP=2 ---------------------------------------
    srv = Server(tmp, model, "--data-parallel-size", "2", "--kv-cache-memory", "64M",
                 "--max-model-len", "256", "--max-body-bytes", "4096", "--header-timeout", "700",
                 name="main")
    check(srv.wait_ready(), "the server did not become ready")
    st, body = srv.get("/v1/models")
    check(st == 200 and json.loads(body)["data"][0]["id"] == "st260", "/v1/models: %d %s" % (st, body))
    prompts = ["Once upon a time", "Lily and Ben", "The cat", "One day"]
    reqs = []
    for i in range(64):
        r = {"prompt": prompts[i % len(prompts)], "max_tokens": 1 + (i * 7) % 40, "temperature": 0}
        if i % 5 == 4:
            r.update(temperature=0.8, seed=i)
        reqs.append(r)
    want = oracle(tmp, model, reqs)

    st, j = srv.complete(reqs[3])
    check(st == 200, "completion: status %d" % st)
    check(j["choices"][0]["token_ids"] == want[3], "completion differs from generate")
    check(j["usage"]["completion_tokens"] == len(want[3]) and
          j["usage"]["total_tokens"] == j["usage"]["prompt_tokens"] + len(want[3]), "usage: %s" % j)
    check(j["choices"][0]["finish_reason"] == "length", "finish_reason %s" % j["choices"][0])
    # The check can fail: a deliberately wrong oracle token is reported.
    wrong = [list(w) for w in want[:4]]
    wrong[3][0] ^= 1
    check(compare([j["choices"][0]["token_ids"]], [wrong[3]], "self-check") == 1,
          "self-check: a wrong oracle token was not reported")
    # Streaming: the same text, whole, ending in [DONE], with usage when asked.
    st, events, text, finish, usage, done = srv.stream(dict(reqs[3], stream_options={"include_usage": True}))
    check(st == 200 and done and finish == "length", "stream: %d done=%s finish=%s" % (st, done, finish))
    check(text == j["choices"][0]["text"], "stream text %r != %r" % (text, j["choices"][0]["text"]))
    check(usage and usage["completion_tokens"] == len(want[3]), "stream usage %s" % usage)

    # Keep-alive: several requests on one connection; pipelining: two in one write, two answers.
    c = srv.conn()
    answers = []
    for i in range(3):
        c.request("POST", "/v1/completions", body=json.dumps(reqs[i]),
                  headers={"Content-Type": "application/json"})
        rr = c.getresponse()
        answers.append((rr.status, json.loads(rr.read())["choices"][0]["token_ids"]))
    sock_id = c.sock.fileno() if c.sock else -1
    check(sock_id >= 0 and answers == [(200, want[i]) for i in range(3)],
          "keep-alive: three requests on one connection: %s" % answers)
    c.close()
    c = srv.conn()
    c.request("HEAD", "/health")
    rr = c.getresponse()
    check(rr.status == 200 and rr.read() == b"", "HEAD /health: a body came")
    c.request("GET", "/health")
    rr = c.getresponse()
    check(rr.status == 200 and b"ready" in rr.read(), "GET after HEAD on one connection")
    c.close()
    body = json.dumps(dict(reqs[3], stream=True)).encode()
    got = raw(srv.port, b"POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    check(got.startswith(b"HTTP/1.1 200") and b"chunked" not in got and got.endswith(b"data: [DONE]\n\n"),
          "streaming to an HTTP/1.0 client: %r" % got[-80:])
    one = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    got = raw(srv.port, one + one.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nConnection: close\r\n"))
    check(got.count(b"HTTP/1.1 200") == 2, "pipelining: %r" % got[:200])

    # ---- 64 concurrent clients, mixed lengths ---------------------------------------------------
    results = [None] * len(reqs)

    def client(i):
        try:
            if i % 3 == 0:
                s, ev, t, fin, u, d = srv.stream(dict(reqs[i], stream_options={"include_usage": True}))
                results[i] = ("stream", s, d, fin, u and u["completion_tokens"], t)
            else:
                s, jj = srv.complete(reqs[i])
                results[i] = ("plain", s, jj["choices"][0]["token_ids"], jj["choices"][0]["finish_reason"])
        except Exception as e:  # noqa: BLE001 - every failure is reported
            results[i] = ("error", repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    got_ids, bad = [], 0
    for i, r in enumerate(results):
        if r is None or r[0] == "error" or r[1] != 200:
            bad += 1
            print("  client %d: %s" % (i, r))
            got_ids.append(None)
        elif r[0] == "plain":
            got_ids.append(r[2])
        else:
            ok = r[2] and r[3] == "length" and r[4] == len(want[i])
            if not ok:
                print("  stream client %d: %s" % (i, r[:5]))
            bad += not ok
            got_ids.append(want[i])  # its tokens are compared as text below
    bad += compare([g for g in got_ids], want, "concurrent")
    check(bad == 0, "64 concurrent clients: %d wrong or incomplete answers" % bad)

    # ---- dpshard bench serve against this server: shape and sanity of its results --------------
    res = os.path.join(tmp, "bench.json")
    b = subprocess.run([DPSHARD, "bench", "serve", "--port", str(srv.port), "--num-prompts", "24",
                        "--request-rate", "300", "--max-concurrency", "8", "--random-input-len", "8",
                        "--random-output-len", "12", "--vocab-size", "500", "--seed", "3",
                        "--result-file", res], capture_output=True, text=True, timeout=120)
    check(b.returncode == 0 and "Serving Benchmark Result" in b.stdout,
          "bench serve: status %d, %s" % (b.returncode, b.stderr[-300:]))
    if os.path.exists(res):
        d = json.load(open(res))
        check(d["completed"] == 24 and d["failed"] == 0, "bench serve: %s of 24" % d["completed"])
        check(d["total_output_tokens"] == sum(d["output_lens"]) == 24 * 12,
              "bench serve: output tokens %s" % d["total_output_tokens"])
        check(d["total_input_tokens"] == sum(d["input_lens"]) == 24 * 8, "bench serve: input tokens")
        for m in ("ttft", "tpot", "itl", "e2el"):
            v = [d["%s_%s_ms" % (k, m)] for k in ("median", "p90", "p99")]
            check(v == sorted(v) and d["mean_%s_ms" % m] > 0, "bench serve: %s percentiles %s" % (m, v))
        check(d["mean_ttft_ms"] <= d["mean_e2el_ms"], "bench serve: TTFT above end-to-end")
        check(abs(d["output_throughput"] * d["duration"] - d["total_output_tokens"]) < 1e-6 * d["total_output_tokens"] + 1e-6,
              "bench serve: throughput x duration != tokens")
    # Several rates in one run: a list of results, and the latency plot when gnuplot is here.
    svg = os.path.join(tmp, "serve.svg")
    b = subprocess.run([DPSHARD, "bench", "serve", "--port", str(srv.port), "--num-prompts", "8",
                        "--request-rate", "100,400", "--random-input-len", "4", "--random-output-len",
                        "6", "--vocab-size", "500", "--result-file", res, "--plot", svg],
                       capture_output=True, text=True, timeout=120)
    d = json.load(open(res)) if os.path.exists(res) else []
    check(isinstance(d, list) and [x["request_rate"] for x in d] == [100, 400] and
          all(x["completed"] == 8 for x in d), "bench serve at two rates: %s" % str(d)[:200])
    if shutil.which("gnuplot"):
        check(b.returncode == 0 and os.path.getsize(svg) > 1000 and "<svg" in open(svg).read(),
              "bench serve --plot: no SVG (%s)" % b.stderr[-200:])
    else:
        check(b.returncode == 1 and "gnuplot is not installed" in b.stderr,
              "bench serve --plot without gnuplot: %s" % b.stderr[-200:])
    b = subprocess.run([DPSHARD, "bench", "serve", "--port", str(srv.port), "--num-prompts", "4",
                        "--request-rate", "200,inf", "--random-input-len", "4", "--random-output-len",
                        "3", "--vocab-size", "500", "--csv"], capture_output=True, text=True, timeout=120)
    import csv as csvmod
    rows = list(csvmod.DictReader(b.stdout.splitlines()))
    check(b.returncode == 0 and len(rows) == 2 and [r["completed"] for r in rows] == ["4", "4"] and
          rows[1]["request_rate"] == '"inf"'.strip('"') and rows[0]["git_commit"],
          "bench serve --csv: %r" % b.stdout[:300])
    # A dataset's lines are the requests (greedy: a sampled reply may end on its first token).
    # The last one stops on its first token, 432 (greedy after this prompt): a reply of no
    # tokens has no time to first token, and counts failed (exit status 1), as in vLLM's
    # benchmark, saying why.
    ds = os.path.join(tmp, "dataset.jsonl")
    with open(ds, "w") as f:
        for i in range(5):
            f.write(json.dumps({"prompt": prompts[i % len(prompts)], "max_tokens": 4 + i,
                                "temperature": 0}) + "\n")
        f.write(json.dumps({"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0,
                            "stop_token_ids": [432]}) + "\n")
    b = subprocess.run([DPSHARD, "bench", "serve", "--port", str(srv.port), "--dataset", ds,
                        "--num-prompts", "6", "--json"], capture_output=True, text=True, timeout=120)
    try:
        d = json.loads(b.stdout)
        check(b.returncode == 1 and d["completed"] == 5 and d["failed"] == 1 and
              [e for e in d["errors"] if e] == [e for e in d["errors"] if "no token came" in e] != [],
              "bench serve --dataset: %s" % d)
    except ValueError:
        fail("bench serve --json: not JSON: %r" % b.stdout[:200])
    # ... and it reports failures (a port nobody listens on), exiting 1.
    b = subprocess.run([DPSHARD, "bench", "serve", "--port", "1", "--num-prompts", "3", "--json"],
                       capture_output=True, text=True, timeout=60)
    try:
        d = json.loads(b.stdout)
        check(b.returncode == 1 and d["failed"] == 3 and d["completed"] == 0, "bench serve, no server: %s" % d)
    except ValueError:
        fail("bench serve, no server: not JSON: %r" % b.stdout[:200])

    # ---- bad requests: status and a JSON error, nothing disturbed -------------------------------
    def expect_error(st, body, code, label):
        ok = st == code
        try:
            ok = ok and "message" in json.loads(body)["error"]
        except ValueError:
            ok = False
        check(ok, "%s: want %d with a JSON error, got %d %r" % (label, code, st, body[:200]))

    st, b = srv.post("/v1/completions", "{not json")
    expect_error(st, b, 400, "malformed JSON")
    st, b = srv.post("/v1/completions", {"prompt": 5})
    expect_error(st, b, 400, "prompt of the wrong type")
    st, b = srv.post("/v1/completions", {"prompt": [1, 2], "max_tokens": "ten"})
    expect_error(st, b, 400, "max_tokens of the wrong type")
    st, b = srv.post("/v1/completions", {"prompt": [1] * 300})
    expect_error(st, b, 400, "prompt longer than --max-model-len")
    st, b = srv.post("/v1/completions", {"prompt": [1, 2], "max_tokens": 255})
    expect_error(st, b, 400, "prompt + max_tokens over --max-model-len")
    st, b = srv.post("/v1/completions", {"prompt": [1, 100000]})
    expect_error(st, b, 400, "token id outside the vocabulary")
    st, b = srv.post("/v1/completions", {"prompt": [1, 2], "n": 2, "best_of": 3})
    expect_error(st, b, 400, "best_of other than n")
    st, b = srv.post("/v1/completions", {"prompt": [1, 2], "model": "other"})
    expect_error(st, b, 404, "an unknown model")
    st, b = srv.post("/v1/completions", "x" * 10000)
    expect_error(st, b, 413, "a body over --max-body-bytes")
    st, b = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    expect_error(st, b, 400, "chat without a template")
    check(b"chat_template" in b, "chat without a template: the message does not say why: %r" % b)
    st, b = srv.get("/nowhere")
    expect_error(st, b, 404, "an unknown endpoint")
    st, b = srv.get("/v1/completions")
    expect_error(st, b, 405, "GET /v1/completions")
    got = raw(srv.port, b"BREW /coffee HTCPCP/1.0\r\n\r\n")
    check(got.startswith(b"HTTP/1.1 400"), "a malformed request line: %r" % got[:60])
    # A slow client: the request never completes; 408 after --header-timeout, then closed.
    t0 = time.time()
    got = raw(srv.port, b"POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"pro", wait=10)
    check(got.startswith(b"HTTP/1.1 408") and time.time() - t0 < 5, "slow client: %r" % got[:60])
    # A half-closed client: half a request, then its side closed; the server closes too.
    got = raw(srv.port, b"POST /v1/completions HTTP/1.1\r\nContent-Len", shutdown_wr=True, wait=10)
    check(b"<timeout>" not in got, "half-closed client: the connection was not closed")
    # A deadline ends a request with "timeout".
    st, j = srv.complete({"prompt": prompts[0], "max_tokens": 200, "temperature": 0, "timeout_ms": 1})
    check(st == 200 and j["choices"][0]["finish_reason"] == "timeout", "deadline: %s" % j)
    # Still serving, and right.
    st, j = srv.complete(reqs[5])
    check(st == 200 and j["choices"][0]["token_ids"] == want[5], "after the bad requests")
    st, b = srv.get("/metrics")
    m = b.decode()
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:num_preemptions_total",
                 "dpshard:dummy_batches_total", "dpshard:collective_seconds_per_step"]:
        check(name in m, "/metrics lacks %s" % name)
    check('finished_reason="timeout"} 1' in m, "/metrics does not count the timeout")
    check(srv.stop() == 0, "SIGTERM with nothing running: exit status not 0")

    # ---- /tokenize and /detokenize, as vLLM's; a long prompt delays only itself -----------------
    # The stories260K model with a chat template of ours: the user's text, trimmed; a system
    # message raises.
    chat_model = os.path.join(tmp, "st260-chat")
    shutil.copytree(model, chat_model)
    with open(os.path.join(chat_model, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "chat_template":
                   "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] | trim }}"
                   "{% elif m['role'] == 'system' %}{{ raise_exception('no system messages, "
                   "please') }}{% endif %}{% endfor %}"}, f)
    srv = Server(tmp, chat_model, "--kv-cache-memory", "16M", "--max-model-len", "256",
                 "--max-body-bytes", "8M", name="tok")
    check(srv.wait_ready(), "the tokenize server did not become ready")
    gold_prompt = [1, 403, 407, 261, 378]  # tests/golden: "Once upon a time", BOS first
    st, b = srv.post("/tokenize", {"prompt": "Once upon a time"})
    j = json.loads(b) if st == 200 else {}
    check(st == 200 and j.get("tokens") == gold_prompt and j.get("count") == 5 and
          j.get("max_model_len") == 256, "/tokenize: %d %r" % (st, b[:200]))
    st, b = srv.post("/tokenize", {"prompt": "Once upon a time", "add_special_tokens": False})
    check(st == 200 and json.loads(b)["tokens"] == gold_prompt[1:],
          "/tokenize without special tokens: %d %r" % (st, b[:200]))
    st, b = srv.post("/detokenize", {"tokens": gold_prompt[1:]})
    check(st == 200 and json.loads(b)["prompt"] == " Once upon a time",
          "/detokenize: %d %r" % (st, b[:200]))
    st, b = srv.post("/detokenize", {"tokens": [1, 99999]})
    expect_error(st, b, 400, "/detokenize of an id outside the vocabulary")
    msgs = [{"role": "user", "content": " Once upon a time "}]
    st, b = srv.post("/tokenize", {"messages": msgs})
    check(st == 200 and json.loads(b)["tokens"] == gold_prompt[1:],
          "/tokenize of messages (the template adds no BOS): %d %r" % (st, b[:200]))
    # Chat completions: the reply is the completion of the rendered prompt's ids; the stream
    # sends the role first and its deltas make the same text; a template that raises is a 400.
    st, c = srv.complete({"prompt": gold_prompt[1:], "max_tokens": 12, "temperature": 0})
    st2, b = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0})
    j = json.loads(b) if st2 == 200 else {}
    reply = j.get("choices", [{}])[0].get("message", {})
    check(st == 200 and st2 == 200 and j.get("object") == "chat.completion" and
          reply.get("role") == "assistant" and reply.get("content") == c["choices"][0]["text"] and
          j["usage"]["prompt_tokens"] == 4,
          "chat completion %d %r against completion %r" % (st2, b[:300], c["choices"][0]["text"]))
    conn = srv.conn()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(
        {"messages": msgs, "max_tokens": 12, "temperature": 0, "stream": True}),
        headers={"Content-Type": "application/json"})
    events = [l[6:] for l in conn.getresponse().read().decode().split("\n") if l.startswith("data: ")]
    conn.close()
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    check(events and events[-1] == "[DONE]" and chunks and
          chunks[0]["choices"][0]["delta"].get("role") == "assistant" and
          all(ch["object"] == "chat.completion.chunk" for ch in chunks) and
          "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks if ch["choices"])
          == reply.get("content") and chunks[-1]["choices"][0]["finish_reason"] == "length",
          "chat stream: %r" % events[:4])
    st, b = srv.post("/v1/chat/completions", {"messages": [{"role": "system", "content": "x"}]})
    expect_error(st, b, 400, "a template that raises")
    check(b"no system messages, please" in b, "the template's message is not the error's: %r" % b)
    st, b = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]})
    expect_error(st, b, 400, "an image part")
    st, b = srv.post("/tokenize", {"prompt": "x", "model": "other"})
    expect_error(st, b, 404, "/tokenize for another model")
    st, b = srv.get("/tokenize")
    expect_error(st, b, 405, "GET /tokenize")
    # Completions of id prompts use the ids exactly: no BOS is put first.
    st, j = srv.complete({"prompt": gold_prompt[1:], "max_tokens": 1, "temperature": 0})
    check(st == 200 and j["usage"]["prompt_tokens"] == 4, "id prompt: BOS added? %s" % j)
    # Near-limit prompts (4 MiB of text each, far past the context): several at once, and
    # /health answers quickly throughout; each is refused by its length.
    big = {"prompt": "Once upon a time, " * (((4 << 20) - 64) // 18), "max_tokens": 4}
    outcomes = []

    def big_client():
        outcomes.append(srv.post("/v1/completions", big))
    threads = [threading.Thread(target=big_client) for _ in range(3)]
    for t in threads:
        t.start()
    slowest = 0.0
    while any(t.is_alive() for t in threads):
        t0 = time.time()
        st, _ = srv.get("/health")
        slowest = max(slowest, time.time() - t0)
        check(st == 200, "/health during long prompts: %d" % st)
        time.sleep(0.02)
    for t in threads:
        t.join()
    check(slowest < 1.0, "/health took %.2f s while long prompts were read" % slowest)
    check(len(outcomes) == 3 and all(st == 400 and b"maximum context length" in b
                                     for st, b in outcomes),
          "long prompts: %s" % [(st, b[:120]) for st, b in outcomes])
    st, j = srv.complete(reqs[3])
    check(st == 200 and j["choices"][0]["token_ids"] == want[3], "after the long prompts")
    check(srv.stop() == 0, "the tokenize server did not exit 0")

    # ---- clients that leave, SIGKILL of a rank, SIGTERM drain: long generations -----------------
    srv = Server(tmp, slow, "--data-parallel-size", "2", "--tensor-parallel-size", "1",
                 "--kv-cache-memory", "64M", "--shutdown-timeout", "30", name="slow")
    check(srv.wait_ready(), "the second server did not become ready")
    long_req = {"prompt": [1, 2, 3], "max_tokens": 3000, "temperature": 0}
    # A model without a tokenizer streams its token ids, one event per token.
    short = {"prompt": [1, 2, 3], "max_tokens": 12, "temperature": 0}
    st, j = srv.complete(short)
    st2, events, text, finish, usage, done = srv.stream(short)
    check(st == 200 and st2 == 200 and done and srv.stream_ids == j["choices"][0]["token_ids"] and
          len([e for e in events if e["choices"] and e["choices"][0].get("token_ids")]) == 12,
          "streamed token ids %s != %s" % (srv.stream_ids, j["choices"][0]["token_ids"]))
    # A client that disconnects mid-stream: its request is cancelled and its blocks freed.
    s = socket.create_connection(("127.0.0.1", srv.port))
    body = json.dumps(dict(long_req, stream=True)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    first = s.recv(4096)
    check(first.startswith(b"HTTP/1.1 200"), "stream start: %r" % first[:40])
    s.close()
    deadline, cancelled = time.time() + 10, False
    while time.time() < deadline and not cancelled:
        time.sleep(0.1)
        m = srv.get("/metrics")[1].decode()
        cancelled = 'finished_reason="cancelled"} 1' in m
    check(cancelled, "a vanished client's request was not cancelled")
    time.sleep(0.7)  # the replicas' counts come every 500 ms
    m = srv.get("/metrics")[1].decode()
    check(all(float(l.split()[-1]) == 0 for l in m.splitlines()
              if l.startswith("vllm:kv_cache_usage_perc{")), "blocks still used after the cancel")

    # SIGKILL of a rank while requests run.
    out = [None] * 4

    def long_client(i):
        try:
            out[i] = srv.complete(long_req) if i % 2 else srv.stream(long_req)
        except Exception as e:  # noqa: BLE001
            out[i] = ("exception", repr(e))

    ts = [threading.Thread(target=long_client, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    time.sleep(0.4)
    ranks = srv.children()
    check(len(ranks) == 2, "want 2 rank processes, found %s" % ranks)
    if ranks:
        os.kill(ranks[-1], signal.SIGKILL)
    t_kill = time.time()
    for t in ts:
        t.join(60)
    for i, r in enumerate(out):
        if i % 2:
            check(r and r[0] == 500 and "error" in r[1], "after SIGKILL, completion %d: %s" % (i, str(r)[:200]))
        else:
            check(r and r[0] == 200 and r[3] == "error" and r[5], "after SIGKILL, stream %d: %s" % (i, str(r)[:200]))
    st, b = srv.get("/health")
    check(st == 503 and b"recovering" in b, "health right after the failure: %d %r" % (st, b))
    st, b = srv.post("/v1/completions", {"prompt": [1, 2], "max_tokens": 2})
    check(st == 503, "a request while recovering: %d %r" % (st, b[:100]))
    check(srv.wait_ready(60), "the service did not recover after SIGKILL of a rank")
    print("SIGKILL of a rank: 4 requests failed, ready again %.1f s after the kill" % (time.time() - t_kill))
    st, j = srv.complete({"prompt": [1, 2, 3], "max_tokens": 10, "temperature": 0})
    check(st == 200 and len(j["choices"][0]["token_ids"]) == 10, "a request after recovery: %s" % j)
    check(shm_leaks(shm_before) == [],
          "/dev/shm holds segments of dead instances: %s" % shm_leaks(shm_before))
    m = srv.get("/metrics")[1].decode()
    check("dpshard:rank_restarts_total 1" in m, "the restart is not counted")

    # SIGTERM drain: running requests finish, new ones get 503, exit 0.
    drain = [None] * 2
    ts = [threading.Thread(target=lambda i=i: drain.__setitem__(i, srv.complete(
        {"prompt": [1, 2, 3], "max_tokens": 1500, "temperature": 0}))) for i in range(2)]
    for t in ts:
        t.start()
    time.sleep(0.3)
    srv.send(signal.SIGTERM)
    time.sleep(0.1)
    try:
        st, b = srv.post("/v1/completions", {"prompt": [1, 2], "max_tokens": 2})
        check(st == 503, "a new request while draining: %d %r" % (st, b[:100]))
    except OSError as e:
        fail("a new request while draining: %r" % e)
    for t in ts:
        t.join(60)
    for r in drain:
        check(r and r[0] == 200 and r[1]["choices"][0]["finish_reason"] == "length" and
              len(r[1]["choices"][0]["token_ids"]) == 1500, "a request during the drain: %s" % str(r)[:200])
    check(srv.stop() == 0, "the drained server did not exit 0")
    check(shm_leaks(shm_before) == [], "segments left after exit: %s" % shm_leaks(shm_before))

    # ---- the API key, a config file, --log-file and SIGHUP ---------------------------------------
    conf = os.path.join(tmp, "dpshard.conf")
    logf = os.path.join(tmp, "service.log")
    with open(conf, "w") as f:
        f.write("# the service's configuration\napi-key: s3cret\nkv-cache-memory: 16M\n"
                "port: 1\nlog-file: %s\n" % logf)
    # (the command line's --port 0 overrides the file's port 1)
    srv = Server(tmp, model, "--config", conf, "--port", "0", name="key", log_file=logf)
    check(srv.wait_ready(), "the keyed server did not become ready")
    st, b = srv.post("/v1/completions", {"prompt": [1, 2], "max_tokens": 2})
    expect_error(st, b, 401, "no API key")
    st, b = srv.post("/v1/completions", {"prompt": [1, 2], "max_tokens": 2},
                     {"Authorization": "Bearer s3creT", "Content-Type": "application/json"})
    expect_error(st, b, 401, "a wrong API key")
    st, j = srv.complete({"prompt": [1, 2], "max_tokens": 2},
                         {"Authorization": "Bearer s3cret", "Content-Type": "application/json"})
    check(st == 200, "the right API key: %d" % st)
    check(srv.get("/health")[0] == 200, "/health needs no key")
    os.rename(logf, logf + ".1")
    srv.send(signal.SIGHUP)
    time.sleep(0.3)
    srv.complete({"prompt": [1, 2], "max_tokens": 2},
                 {"Authorization": "Bearer s3cret", "Content-Type": "application/json"})
    time.sleep(0.2)
    check(os.path.exists(logf) and "request cmpl-" in open(logf).read(),
          "SIGHUP did not reopen --log-file")
    srv.signalled = False
    check(srv.stop() == 0, "the keyed server did not exit 0")

    # ---- a Unix socket ---------------------------------------------------------------------------
    us = os.path.join(tmp, "dps.sock")
    log = open(os.path.join(tmp, "unix.log"), "w")
    p = subprocess.Popen([DPSHARD, "serve", "--model", model, "--unix-socket", us,
                          "--kv-cache-memory", "16M", "--cpu-bind", "off"], stdout=log, stderr=log)
    got, deadline = b"", time.time() + 30
    while time.time() < deadline and not got.startswith(b"HTTP/1.1 200"):
        time.sleep(0.05)
        try:
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(us)
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            got = c.recv(4096)
            c.close()
        except OSError:
            pass
    check(got.startswith(b"HTTP/1.1 200"), "no answer on the Unix socket: %r" % got[:60])
    p.send_signal(signal.SIGTERM)
    check(p.wait(30) == 0 and not os.path.exists(us), "the Unix socket server: exit or socket left")
    log.close()

    # ---- systemd: the unit file, and the notify protocol on a real socket ------------------------
    unit = os.path.join(SRC, "dist", "dpshard.service")
    if shutil.which("systemd-analyze"):
        u = os.path.join(tmp, "dpshard.service")
        with open(unit) as f, open(u, "w") as g:
            g.write(f.read().replace("@bindir@", os.path.dirname(DPSHARD)).replace(
                "@sysconfdir@", tmp))
        v = subprocess.run(["systemd-analyze", "verify", u], capture_output=True, text=True)
        check(v.returncode == 0 and "dpshard.service" not in v.stderr,
              "systemd-analyze verify: %s" % v.stderr.strip())
    else:
        fail("systemd-analyze is needed to verify the unit file (Debian: systemd)")
    ns = os.path.join(tmp, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(ns)
    sock.settimeout(0.2)
    env = dict(os.environ, NOTIFY_SOCKET=ns, WATCHDOG_USEC="400000")
    # (No --model: the default model, stories260K, that the build converted.)
    srv = Server(tmp, None, "--kv-cache-memory", "16M", env=env, name="notify")
    msgs, deadline = [], time.time() + 30
    while time.time() < deadline and not any("READY=1" in m for m in msgs):
        try:
            msgs.append(sock.recv(4096).decode())
        except socket.timeout:
            pass
    check(any("READY=1" in m for m in msgs), "no READY=1: %s" % msgs)
    check(srv.get("/health")[0] == 200, "READY=1 before /health says ready")
    check(any(m.startswith("STATUS=loading") for m in msgs), "no STATUS while loading: %s" % msgs)
    st, body = srv.get("/v1/models")
    check(st == 200 and json.loads(body)["data"][0]["id"] == "stories260K",
          "without --model, /v1/models: %d %s" % (st, body))
    with open(os.path.join(SRC, "tests", "golden", "stories260K", "once_upon_a_time.stdout.txt")) as f:
        gold = f.read()
    st, j = srv.complete({"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0})
    check(st == 200 and "Once upon a time" + j["choices"][0]["text"] + "\n" == gold,
          "without --model, the completion is not the golden text: %d %s" % (st, j))
    t0 = time.time()
    while time.time() - t0 < 1.0:
        try:
            msgs.append(sock.recv(4096).decode())
        except socket.timeout:
            pass
    check(sum("WATCHDOG=1" in m for m in msgs) >= 2, "no WATCHDOG=1 every 200 ms: %s" % msgs)
    srv.send(signal.SIGTERM)
    deadline = time.time() + 10
    while time.time() < deadline and not any("STOPPING=1" in m for m in msgs):
        try:
            msgs.append(sock.recv(4096).decode())
        except socket.timeout:
            pass
    check(any("STOPPING=1" in m for m in msgs), "no STOPPING=1: %s" % msgs)
    check(srv.stop() == 0, "the notify server did not exit 0")
    sock.close()

    # ---- Eagle3 speculative decoding: greedy tokens as without a draft, counted in /metrics --
    # (On the random "small" model: the self-distilled draft agrees with it often, where it
    # agrees with the trained stories260K almost never.)
    draft = os.path.join(tmp, "draft")
    subprocess.run([DPSHARD, "mkmodel", "--draft-for", slow, "--out", draft], check=True,
                   capture_output=True)
    sreqs = [{"prompt": [1, 5 + 7 * i, 9 + 3 * i], "max_tokens": 4 + 3 * i, "temperature": 0}
             for i in range(12)]
    swant = oracle(tmp, slow, sreqs, name="spec-oracle")
    srv = Server(tmp, slow, "--data-parallel-size", "2", "--draft-mlp-dp-size", "2",
                 "--speculative-model", draft, "--num-speculative-tokens", "3",
                 "--kv-cache-memory", "64M", "--max-model-len", "256", name="spec")
    check(srv.wait_ready(), "the speculative server did not become ready")
    got = [None] * len(sreqs)

    def spec_client(k):
        try:
            got[k] = srv.complete(sreqs[k])[1]["choices"][0]["token_ids"]
        except Exception as e:  # noqa: BLE001 - every failure is reported
            got[k] = repr(e)

    threads = [threading.Thread(target=spec_client, args=(k,)) for k in range(len(sreqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    check(compare(got, swant, "speculative") == 0, "speculative decoding changed greedy tokens")
    # "ignore_eos": every completion max_tokens long (the control with EOS: serve_oai.py).
    st, j = srv.complete({"prompt": [1, 2, 2], "max_tokens": 200, "temperature": 0,
                          "ignore_eos": True})
    check(st == 200 and j["usage"]["completion_tokens"] == 200,
          "ignore_eos: %d %s" % (st, j.get("usage")))
    time.sleep(1.2)  # the replicas' counts come every 500 ms
    st, body = srv.get("/metrics")
    vals = {}
    for line in body.decode().splitlines():
        if line.startswith(("vllm:spec_decode", "dpshard:spec_decode")):
            vals[line.split("{")[0]] = float(line.rsplit(" ", 1)[1])
    check(vals.get("vllm:spec_decode_num_draft_tokens_total", 0) > 0 and
          vals.get("vllm:spec_decode_num_accepted_tokens_total", 0) > 0 and
          vals.get("vllm:spec_decode_num_draft_tokens_total") ==
          3 * vals.get("vllm:spec_decode_num_drafts_total", -1) and
          0 < vals.get("dpshard:spec_decode_acceptance_rate", 0) <= 1,
          "speculative metrics: %s" % vals)
    check(srv.stop() == 0, "the speculative server did not exit 0")

    if failures:
        print("serve.py: %d check(s) failed" % len(failures))
        for name in ("main", "slow", "key", "notify", "spec"):
            p = os.path.join(tmp, name + ".log")
            if os.path.exists(p):
                print("---- %s.log (last lines)" % name)
                print("".join(open(p).readlines()[-15:]))
        return 1
    print("serve.py: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

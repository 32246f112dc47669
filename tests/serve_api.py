#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/serve_api.py - `dpshard serve` at its edges, with the helpers of serve.py:

- a start-up that fails fails once: a bad config.json, a missing model directory, a truncated
  safetensors file and a checkpoint without a tensor each end `serve` with exit status 2
  within a few seconds, their message once, no restart and no "listening" line (and the
  check rejects the old behaviour: a restart loop, exit 1, "listening" first); and systemd does
  not restart it either: dist/dpshard.service has Restart=on-failure with
  RestartPreventExitStatus=2, as README.md says (a unit without the line is reported);
- back-pressure: at --max-connections a new client gets 503 with Retry-After and a JSON
  error, then the connection closes; once a slot is free it is served again;
- the small things of the OpenAI/vLLM surface: system_fingerprint in completion and chat
  responses and chunks, "usage": null on every chunk but the usage one under include_usage,
  HEAD on every GET route (GET's headers, no body), GET /version, GET /v1/models/{id} (404
  with an error for another id), vllm:request_success_total by stop, length and abort only,
  vllm:time_per_output_token_seconds once per request of two or more tokens;
  and, with a rank killed mid-stream, an "error" object in the finish chunk before [DONE],
  the failure not counted as a success, and Retry-After on the 503s that follow.
Exit status: 0 pass, 1 fail, 77 skip.
"""
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve  # noqa: E402  (the Server class, check and fail)
from serve import Server, check, fail  # noqa: E402

DPSHARD = serve.DPSHARD


def startup_problems(status, secs, log, message):
    """What is wrong with a failed start-up: its exit status, time, and log (the message once,
    no restart, no "listening")."""
    bad = []
    if status != 2:
        bad.append("exit status %s, not 2" % status)
    if secs > 5:
        bad.append("%.1f s to fail" % secs)
    if log.count(message) != 1:
        bad.append("%r logged %d times" % (message, log.count(message)))
    if "restarting" in log:
        bad.append("the ranks were restarted")
    if "listening" in log:
        bad.append("\"listening\" was logged")
    return bad


def start_fails(tmp, model, message, label):
    t0 = time.time()
    try:
        p = subprocess.run([DPSHARD, "serve", "--model", model, "--port", "0", "--cpu-bind", "off",
                            "--kv-cache-memory", "16M"], capture_output=True, text=True,
                           timeout=60)
        status, log = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        status, log = "none (still running after 60 s)", str(e.stderr or "")
    bad = startup_problems(status, time.time() - t0, log, message)
    check(not bad, "start-up with %s: %s; log:\n%s" % (label, "; ".join(bad), log[-2000:]))


def drop_tensor(path):
    """Renames the first tensor of a safetensors file: its header still parses."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    name = sorted(k for k in hdr if k != "__metadata__")[0]
    hdr["missing." + name] = hdr.pop(name)
    new = json.dumps(hdr).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(new)) + new + data[8 + n:])
    return name


def unit_restart_problems(unit, readme):
    """What is wrong with the restart policy of the unit's text (and of README.md's account of
    it): a failure is restarted (Restart=on-failure), but not exit status 2, which a broken
    configuration or checkpoint gives again at every start."""
    bad, service, keys = [], False, {}
    for line in unit.splitlines():
        line = line.strip()
        if line.startswith("["):
            service = line == "[Service]"
        elif service and "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            keys.setdefault(k.strip(), []).extend(v.split())
    if keys.get("Restart") != ["on-failure"]:
        bad.append("Restart=%s, not on-failure" % " ".join(keys.get("Restart", [])))
    if "2" not in keys.get("RestartPreventExitStatus", []):
        bad.append("no RestartPreventExitStatus=2: a broken start-up is restarted every %ss "
                   "for ever" % " ".join(keys.get("RestartSec", ["?"])))
    if "RestartPreventExitStatus=2" not in readme:
        bad.append("README.md does not say that exit status 2 is not restarted")
    return bad


def test_unit_restart():
    with open(os.path.join(serve.SRC, "dist", "dpshard.service")) as f:
        unit = f.read()
    with open(os.path.join(serve.SRC, "README.md")) as f:
        readme = f.read()
    bad = unit_restart_problems(unit, readme)
    check(not bad, "dist/dpshard.service: %s" % "; ".join(bad))
    # The check can fail: the unit as it was (no RestartPreventExitStatus) is reported.
    old = "\n".join(l for l in unit.splitlines() if not l.startswith("RestartPreventExitStatus"))
    check(len(unit_restart_problems(old, readme)) == 1,
          "self-check: a unit that restarts exit status 2 was not reported")


def test_startup(tmp, model):
    # The check can fail: the old behaviour (exit 1 after restarts, "listening" first).
    old = ("info: listening on http://127.0.0.1:1\nrank 0: x: truncated\n"
           "info: restarting the ranks in 1 s\nrank 0: x: truncated\n")
    check(len(startup_problems(1, 15.0, old, "truncated")) == 5,
          "self-check: the old start-up was not reported on every count")

    bad = os.path.join(tmp, "badjson")
    shutil.copytree(model, bad)
    with open(os.path.join(bad, "config.json"), "w") as f:
        f.write("{\"hidden_size\": 64,")
    start_fails(tmp, bad, "not valid JSON", "a bad config.json")

    start_fails(tmp, os.path.join(tmp, "no-such-model"), "No such file or directory",
                "a missing model directory")

    short = os.path.join(tmp, "truncated")
    shutil.copytree(model, short)
    st = os.path.join(short, "model.safetensors")
    os.truncate(st, os.path.getsize(st) // 2)
    start_fails(tmp, short, "truncated", "a truncated safetensors file")

    # A header that parses but lacks a tensor: only a rank finds out, once, and no restart.
    lacking = os.path.join(tmp, "lacking")
    shutil.copytree(model, lacking)
    name = drop_tensor(os.path.join(lacking, "model.safetensors"))
    start_fails(tmp, lacking, "tensor '%s' is missing" % name, "a checkpoint without a tensor")


def read_all(s):
    got = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
    except OSError as e:
        got += ("<%s>" % e).encode()
    return got


def test_connection_cap(tmp, model):
    srv = Server(tmp, model, "--max-connections", "4", "--kv-cache-memory", "16M", name="cap")
    check(srv.wait_ready(), "the capped server did not become ready")
    held = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(4)]
    # The fourth is surely accepted once one request on it is answered.
    held[-1].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    held[-1].recv(4096)
    extra = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    extra.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 33\r\n\r\n{\"prompt\": \"Hi\", \"max_tokens\": 2}")
    t0 = time.time()
    got = read_all(extra)
    extra.close()
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    headers = dict(l.split(": ", 1) for l in lines[1:] if ": " in l)
    try:
        err = json.loads(body)["error"]
    except ValueError:
        err = {}
    check(lines[0] == "HTTP/1.1 503 Service Unavailable" and headers.get("Retry-After") == "1" and
          headers.get("Connection") == "close" and err.get("code") == 503 and
          "max-connections" in err.get("message", "") and time.time() - t0 < 3,
          "a client past --max-connections: %r" % got[:400])
    # The held connections are still served, and a freed slot serves a new client.
    held[0].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    check(held[0].recv(4096).startswith(b"HTTP/1.1 200"), "a held connection was not served")
    for s in held:
        s.close()
    time.sleep(0.3)
    st, _ = srv.get("/health")
    check(st == 200, "after the cap: /health %d" % st)
    check(srv.stop() == 0, "the capped server did not exit 0")


def http(srv, method, path, body=None):
    """(status, headers, body bytes) of one request on a fresh connection."""
    c = srv.conn()
    c.request(method, path, body=None if body is None else json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.read()
    hdrs = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    return r.status, hdrs, out


def events(srv, path, req, on_first=None):
    """The JSON events of a stream, and whether it ended in [DONE]."""
    c = srv.conn()
    c.request("POST", path, body=json.dumps(dict(req, stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    got, done, buf = [], False, b""
    while r.status == 200:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev == b"data: [DONE]":
                done = True
            elif ev.startswith(b"data: "):
                got.append(json.loads(ev[6:]))
                if len(got) == 1 and on_first:
                    on_first()
    c.close()
    return r.status, got, done


def success_counts(srv):
    m = srv.get("/metrics")[1].decode()
    return {l.split('finished_reason="')[1].split('"')[0]: float(l.split()[-1])
            for l in m.splitlines() if l.startswith("vllm:request_success_total{")}


def test_surface(tmp, model):
    chat = os.path.join(tmp, "st260chat")
    shutil.copytree(model, chat)
    with open(os.path.join(chat, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}, f)
    srv = Server(tmp, chat, "--kv-cache-memory", "16M", "--served-model-name", "org/st 260",
                 name="surface")
    check(srv.wait_ready(), "the surface server did not become ready")
    version = subprocess.run([DPSHARD, "--version"], capture_output=True,
                             text=True).stdout.split()[-1]
    st, _, b = http(srv, "GET", "/version")
    check(st == 200 and json.loads(b) == {"version": version}, "GET /version: %d %r" % (st, b))
    # HEAD: GET's status and headers, no body, on every GET route.
    for path in ["/health", "/metrics", "/v1/models", "/v1/models/org%2Fst%20260", "/version"]:
        gs, gh, gb = http(srv, "GET", path)
        hs, hh, hb = http(srv, "HEAD", path)
        check(gs == 200 and hs == 200 and hb == b"" and
              hh.get("content-type") == gh.get("content-type") and
              (path == "/metrics" or hh.get("content-length") == gh.get("content-length")),
              "HEAD %s: %d %s %r (GET: %d %s)" % (path, hs, hh, hb[:80], gs, gh))
    st, _, b = http(srv, "GET", "/v1/models/org%2Fst%20260")
    j = json.loads(b)
    check(st == 200 and j["id"] == "org/st 260" and j["object"] == "model",
          "GET /v1/models/{id}: %d %r" % (st, b))
    st, _, b = http(srv, "GET", "/v1/models/other")
    check(st == 404 and "other" in json.loads(b)["error"]["message"],
          "GET /v1/models/other: %d %r" % (st, b))

    req = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}
    # (greedy: a sampled reply could end early, on its end-of-text token, and then count as
    # "stop" below, with no time per output token)
    msgs = {"messages": [{"role": "user", "content": "Lily"}], "max_tokens": 4, "temperature": 0}
    fps = []
    for path, body in [("/v1/completions", req), ("/v1/chat/completions", msgs)]:
        st, _, b = http(srv, "POST", path, body)
        fps.append(json.loads(b).get("system_fingerprint") if st == 200 else None)
        st, evs, done = events(srv, path, dict(body, stream_options={"include_usage": True}))
        check(st == 200 and done and len(evs) >= 3, "%s stream: %d %d events" % (path, st, len(evs)))
        fps += [e.get("system_fingerprint") for e in evs]
        check(all("usage" in e and e["usage"] is None for e in evs[:-1]) and
              evs[-1]["usage"]["completion_tokens"] == body["max_tokens"] and evs[-1]["choices"] == [],
              "%s stream: usage null on every chunk but the last: %s" % (path, evs))
        st, evs, done = events(srv, path, body)
        check(all("usage" not in e for e in evs), "%s: usage without include_usage" % path)
    def stable(fps):
        return bool(fps) and str(fps[0]).startswith("dpshard-%s-" % version) and len(set(fps)) == 1
    check(stable(fps), "system_fingerprint missing or unstable: %s" % sorted(set(map(str, fps))))
    # The check can fail: one chunk without the fingerprint is seen.
    check(not stable(fps + [None]), "self-check: a missing fingerprint was not seen")

    # vLLM's reasons only: stop, length, abort; dpshard's counter keeps them all.
    http(srv, "POST", "/v1/completions", dict(req, stop_token_ids=[383]))
    n = success_counts(srv)
    check(sorted(n) == ["abort", "length", "stop"] and n["length"] >= 4 and n["stop"] == 1,
          "vllm:request_success_total: %s" % n)
    # time_per_output_token: one observation per request of two or more tokens (six here:
    # the stop id above ends its request at one), each its mean gap, between 0 and e2e's.
    m = srv.get("/metrics")[1].decode()
    val = {l.split()[0]: float(l.split()[1]) for l in m.splitlines()
           if l.startswith(("vllm:time_per_output_token_seconds_", "vllm:e2e_request_latency_seconds_"))}
    tpot_n = val.get("vllm:time_per_output_token_seconds_count")
    check(tpot_n == 6 and val.get('vllm:time_per_output_token_seconds_bucket{le="+Inf"}') == 6 and
          0 < val["vllm:time_per_output_token_seconds_sum"] < val["vllm:e2e_request_latency_seconds_sum"],
          "vllm:time_per_output_token_seconds: %s" % {k: v for k, v in val.items() if "bucket" not in k})
    check(srv.stop() == 0, "the surface server did not exit 0")


def test_failed_stream(tmp):
    slow = os.path.join(tmp, "slow")
    subprocess.run([DPSHARD, "mkmodel", "--preset", "small", "--max-position-embeddings", "4096",
                    "--out", slow], check=True, capture_output=True)
    srv = Server(tmp, slow, "--kv-cache-memory", "64M", name="failed")
    check(srv.wait_ready(), "the failing server did not become ready")
    before = success_counts(srv)

    def kill_rank():
        for pid in srv.children():
            os.kill(pid, signal.SIGKILL)

    st, evs, done = events(srv, "/v1/completions",
                           {"prompt": [1, 2, 3], "max_tokens": 4000, "ignore_eos": True,
                            "stream_options": {"include_usage": True}}, on_first=kill_rank)
    last = [e for e in evs if e.get("choices")][-1] if evs else {}
    err = last.get("error") or {}
    check(st == 200 and done and last["choices"][0]["finish_reason"] == "error" and
          err.get("code") == 500 and err.get("type") and "failed" in err.get("message", ""),
          "a stream whose rank died: %d done=%s last=%s" % (st, done, last))
    st, hdrs, _ = http(srv, "GET", "/health")
    check(st == 503 and hdrs.get("retry-after") == "1", "/health recovering: %d %s" % (st, hdrs))
    st, hdrs, b = http(srv, "POST", "/v1/completions", {"prompt": [1, 2], "max_tokens": 1})
    check(st == 503 and hdrs.get("retry-after") == "1", "a request recovering: %d %s" % (st, hdrs))
    check(srv.wait_ready(60), "the failing server did not recover")
    m = srv.get("/metrics")[1].decode()
    check(success_counts(srv) == before and
          'dpshard:requests_finished_total{model_name="slow",finished_reason="error"} 1' in m,
          "the failed request counted as a success: %s -> %s" % (before, success_counts(srv)))
    check(srv.stop() == 0, "the failing server did not exit 0")


def main():
    if not DPSHARD or not os.access(DPSHARD, os.X_OK):
        print("SKIP: DPSHARD must name the built binary")
        return 77
    tmp = tempfile.mkdtemp(prefix="dps-serve-api-")
    try:
        model = serve.st260(tmp)
        test_startup(tmp, model)
        test_unit_restart()
        test_connection_cap(tmp, model)
        test_surface(tmp, model)
        test_failed_stream(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if serve.failures:
        print("%d failure(s)" % len(serve.failures))
        return 1
    print("serve_api: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

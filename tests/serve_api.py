#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/serve_api.py - `dpshard serve` at its edges, with the helpers of serve.py:

- a start-up that fails fails once: a bad config.json, a missing model directory, a truncated
  safetensors file and a checkpoint without a tensor each end `serve` with exit status 2
  within a few seconds, their message once, no restart and no "listening" line (and the
  check rejects the old behaviour: a restart loop, exit 1, "listening" first);
- back-pressure: at --max-connections a new client gets 503 with Retry-After and a JSON
  error, then the connection closes; once a slot is free it is served again.
Exit status: 0 pass, 1 fail, 77 skip.
"""
import json
import os
import shutil
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


def main():
    if not DPSHARD or not os.access(DPSHARD, os.X_OK):
        print("SKIP: DPSHARD must name the built binary")
        return 77
    tmp = tempfile.mkdtemp(prefix="dps-serve-api-")
    try:
        model = os.path.join(tmp, "st260")
        subprocess.run([DPSHARD, "convert", "llama2c",
                        os.path.join(serve.ST260, "stories260K.bin"),
                        os.path.join(serve.ST260, "tok512.bin"), model],
                       check=True, capture_output=True)
        test_startup(tmp, model)
        test_connection_cap(tmp, model)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if serve.failures:
        print("%d failure(s)" % len(serve.failures))
        return 1
    print("serve_api: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""tests/serve_oai.py - the OpenAI surface vLLM users rely on, `dpshard serve` end to end on
TP=1 x DP=2 (stories260K), with the helpers of serve.py:

- batched prompts in /v1/completions (a list of texts, a list of id lists): one choice per
  prompt in order, each equal to the prompt sent alone and to the one-process model
  (`dpshard generate --requests`, greedy), usage summed; streamed, every chunk carries its
  choice's index and each index's tokens are the same;
- n: with temperature 1 and a seed, n distinct choices, the same in a second run (the
  choices land on either replica), and choice j equal to the one-process model run with
  seed + j (the documented derivation); with prompts x n, index = prompt * n + j; greedy
  n gives n identical choices; chat's n choices distinct too;
- logprobs: the sampled token's log-probability equals numpy's log-softmax (float64) of the
  one-process model's logits (tests/hf_logits --one-rank-model, teacher-forced on the prompt
  and the completion) within 1e-4, in completions (logprobs: 5) and chat (logprobs: true,
  top_logprobs: 3); the top entries are the oracle's k likeliest, sorted, the greedy token
  first; bytes are the token's UTF-8; streamed chunks carry their tokens' log-probabilities,
  the same as the whole response's;
- echo: the text is the prompt's (as given, or for the ids of a text that text: they are
  decoded with the special tokens left out) then the completion's, streamed too;
- echo with logprobs (lm-eval's loglikelihood), on a prompt of several prefill chunks
  (--max-num-batched-tokens 8): the first prompt token's entries null, every later one the
  oracle's log p(t_i | t_<i) and k likeliest, the completion's entries those of the same
  request without echo, tokens and text_offset over the echoed text; max_tokens 0 gives the
  prompt alone (and is refused without echo); a prompt entry read one position off is caught;
- logprobs 0: the sampled token's log-probability alone, each top_logprobs entry holding that
  token only (vLLM's answer), the same values as logprobs 5's;
- stop strings wait for min_tokens (vLLM): a stop string is looked for only once a choice has
  more than min_tokens tokens, and one that ended within the first min_tokens tokens' text does
  not count; the text, finish reason and token count equal a model of that rule applied to the
  run without the stop string (whose ids are the one-process model's), streamed too;
- ignore_eos, with a control: EOS pushed up by logit_bias ends a completion at once ("stop"),
  and with ignore_eos it runs to max_tokens ("length"); the same bias on another token does
  not stop it;
- what stays refused by name: echo with logprobs streamed, logprobs above 20, best_of other
  than n, prompt_logprobs, response_format json; guided_regex, guided_json, guided_choice,
  guided_grammar and response_format json_schema in completions and chat (and each of them
  null is accepted: the check sees a field that is not refused).
Each check is a function returning its problems; it is also run on a deliberately wrong
expectation (a shifted log-probability, a swapped choice) and must report it.
Exit status: 0 pass, 1 fail, 77 skip.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve  # noqa: E402
from serve import Server, check, fail  # noqa: E402

DPSHARD = serve.DPSHARD
BUILD = os.environ.get("DPSHARD_BUILDDIR", os.path.dirname(DPSHARD or "."))
TOL = 1e-4


def stream(srv, path, req):
    """The JSON events of a stream of req (stream forced on)."""
    c = srv.conn()
    c.request("POST", path, body=json.dumps(dict(req, stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    check(r.status == 200, "%s stream: status %d" % (path, r.status))
    evs = [e[6:] for e in data.split("\n\n") if e.startswith("data: ")]
    check(evs and evs[-1] == "[DONE]", "%s stream: no [DONE]" % path)
    return [json.loads(e) for e in evs if e != "[DONE]"]


def post(srv, path, req):
    st, out = srv.post(path, req)
    return st, json.loads(out)


def same_ids(got, want, label):
    """Problems: each choice's token_ids against want (a list, in index order)."""
    bad = []
    if len(got) != len(want):
        return ["%s: %d choices, want %d" % (label, len(got), len(want))]
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            bad.append("%s: choice %d has %s, want %s" % (label, i, g, w))
    return bad


def report(bad):
    for b in bad:
        fail(b)


def log_softmax_rows(model, ids, prefill, tmp):
    """numpy float64 log-softmax of the one-process model's logits, teacher-forced on ids."""
    import numpy as np
    path = os.path.join(tmp, "ids.txt")
    with open(path, "w") as f:
        f.write(" ".join(str(i) for i in ids) + "\n")
    out = os.path.join(tmp, "logits.bin")
    subprocess.run([os.path.join(BUILD, "tests", "hf_logits"), "--model", model, "--ids", path,
                    "--out", out, "--prefill", str(prefill), "--one-rank-model"], check=True,
                   capture_output=True, timeout=120)
    a = np.fromfile(out, dtype="<f4").reshape(len(ids), -1).astype(np.float64)
    a -= a.max(axis=1, keepdims=True)
    return a - np.log(np.exp(a).sum(axis=1, keepdims=True))


def lp_problems(chosen, tops, gen, rows, n_prompt, k, label):
    """Problems of per-token (chosen logprob, [top logprobs]) against the oracle's rows: the
    row after position n_prompt - 1 + t holds token t's distribution."""
    bad = []
    if len(chosen) != len(gen):
        return ["%s: %d logprobs for %d tokens" % (label, len(chosen), len(gen))]
    for t, tok in enumerate(gen):
        row = rows[n_prompt - 1 + t]
        if abs(chosen[t] - row[tok]) > TOL:
            bad.append("%s: token %d (%d) logprob %.7f, oracle %.7f" % (label, t, tok, chosen[t],
                                                                        row[tok]))
        want = sorted(row, reverse=True)[:k]
        if len(tops[t]) != k or any(abs(a - b) > TOL for a, b in zip(tops[t], want)):
            bad.append("%s: token %d top %s, oracle %s" % (label, t, tops[t], want))
        if tops[t] != sorted(tops[t], reverse=True):
            bad.append("%s: token %d top not sorted: %s" % (label, t, tops[t]))
        if k and abs(tops[t][0] - chosen[t]) > TOL:
            bad.append("%s: greedy token %d is not the likeliest" % (label, t))
    return bad


def test_batched(srv, tmp, model):
    texts = ["Once upon a time", "Lily and Ben", "The cat"]
    idp = [[1, 403, 407], [1, 261, 378, 432]]
    reqs = [{"prompt": p, "max_tokens": 12, "temperature": 0} for p in texts + idp]
    want = serve.oracle(tmp, model, reqs, name="batch")
    alone = [post(srv, "/v1/completions", r)[1] for r in reqs]
    report(same_ids([a["choices"][0]["token_ids"] for a in alone], want, "each prompt alone"))
    for label, ps, w, a in (("texts", texts, want[:3], alone[:3]),
                            ("id lists", idp, want[3:], alone[3:])):
        st, r = post(srv, "/v1/completions", {"prompt": ps, "max_tokens": 12, "temperature": 0})
        check(st == 200, "batched %s: %d %s" % (label, st, r))
        if st != 200:
            continue
        ch = r["choices"]
        check([c["index"] for c in ch] == list(range(len(ps))), "batched %s: indices %s" %
              (label, [c["index"] for c in ch]))
        report(same_ids([c["token_ids"] for c in ch], w, "batched " + label))
        check([c["text"] for c in ch] == [x["choices"][0]["text"] for x in a],
              "batched %s: texts differ from each prompt alone" % label)
        u = r["usage"]
        check(u["prompt_tokens"] == sum(x["usage"]["prompt_tokens"] for x in a) and
              u["completion_tokens"] == sum(len(x) for x in w),
              "batched %s: usage %s" % (label, u))
        # streamed: each chunk one choice with its index; per index the same tokens
        evs = stream(srv, "/v1/completions", {"prompt": ps, "max_tokens": 12, "temperature": 0,
                                              "stream_options": {"include_usage": True}})
        per = [[] for _ in ps]
        for e in evs:
            for c in e["choices"]:
                per[c["index"]] += c.get("token_ids", [])
            check(len(e["choices"]) <= 1, "a chunk with %d choices" % len(e["choices"]))
        report(same_ids(per, w, "streamed batched " + label))
        check(evs[-1].get("usage") == u, "streamed batched %s: usage %s, want %s" %
              (label, evs[-1].get("usage"), u))
    # the check can fail: a swapped pair of choices is reported
    check(same_ids(want[1::-1], want[:2], "fault"), "swapped choices were not reported")


def test_n(srv, tmp, model):
    req = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 1, "seed": 11,
           "n": 3}
    st, a = post(srv, "/v1/completions", req)
    check(st == 200, "n=3: %d %s" % (st, a))
    if st != 200:
        return
    ids = [c["token_ids"] for c in a["choices"]]
    check([c["index"] for c in a["choices"]] == [0, 1, 2], "n=3: indices")
    check(len({tuple(x) for x in ids}) == 3, "n=3 with temperature 1: choices not distinct: %s" %
          ids)
    runs = [[c["token_ids"] for c in post(srv, "/v1/completions", req)[1]["choices"]]
            for _ in range(3)]  # the load balancer spreads them over both replicas
    check(all(r == ids for r in runs), "n=3 with a seed: another run differs")
    want = serve.oracle(tmp, model, [{"prompt": req["prompt"], "max_tokens": 24,
                                      "temperature": 1, "seed": 11 + j} for j in range(3)],
                        name="seeds")
    report(same_ids(ids, want, "n=3: choice j against the one-process model with seed + j"))
    check(same_ids(ids, want[::-1], "fault"), "reversed seeds were not reported")
    # prompts x n: index = prompt * n + j
    st, b = post(srv, "/v1/completions", dict(req, prompt=["Lily and Ben", "Once upon a time"],
                                              n=2))
    check(st == 200 and [c["index"] for c in b["choices"]] == [0, 1, 2, 3],
          "2 prompts x n=2: %d %s" % (st, b.get("choices") if st == 200 else b))
    if st == 200:
        check(b["choices"][2]["token_ids"] == ids[0] and b["choices"][3]["token_ids"] == ids[1],
              "2 prompts x n=2: prompt 1's samples are not the seeded ones")
        n_lily = post(srv, "/tokenize", {"prompt": "Lily and Ben"})[1]["count"]
        check(b["usage"]["prompt_tokens"] == a["usage"]["prompt_tokens"] + n_lily,
              "2 prompts x n=2: prompt tokens %s (each prompt once)" % b["usage"])
    # greedy n: identical choices
    st, g = post(srv, "/v1/completions", {"prompt": "The cat", "max_tokens": 8,
                                          "temperature": 0, "n": 3})
    check(st == 200 and len({tuple(c["token_ids"]) for c in g["choices"]}) == 1 and
          len(g["choices"]) == 3, "greedy n=3: %s" % g)
    st, c = post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Lily"}],
                                               "max_tokens": 16, "temperature": 1, "seed": 3,
                                               "n": 3})
    check(st == 200 and [x["index"] for x in c["choices"]] == [0, 1, 2], "chat n=3: %s" % c)
    if st == 200:
        replies = [x["message"]["content"] for x in c["choices"]]
        check(len(set(replies)) == 3, "chat n=3 with temperature 1: replies not distinct: %s" %
              replies)
        # the check can fail: one reply twice is not three distinct ones
        check(len(set(replies[:2] + replies[:1])) < 3, "self-check: a repeated reply was not seen")


def test_logprobs(srv, tmp, model):
    prompt = [1, 403, 407, 261, 378]
    st, r = post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                          "logprobs": 5})
    check(st == 200, "logprobs: %d %s" % (st, r))
    if st != 200:
        return
    c = r["choices"][0]
    gen, lp = c["token_ids"], c["logprobs"]
    rows = log_softmax_rows(model, prompt + gen[:-1], len(prompt), tmp)
    tops = [sorted(d.values(), reverse=True) for d in lp["top_logprobs"]]
    report(lp_problems(lp["token_logprobs"], tops, gen, rows, len(prompt), 5, "completions"))
    check(lp_problems([x + 1e-3 for x in lp["token_logprobs"]], tops, gen, rows, len(prompt), 5,
                      "fault"), "a shifted logprob was not reported")
    check(len(lp["tokens"]) == len(gen) and "".join(lp["tokens"]) == c["text"],
          "completions: tokens %s do not make the text %r" % (lp["tokens"], c["text"]))
    offs, o = [], 0
    for t in lp["tokens"]:
        offs.append(o)
        o += len(t)
    check(lp["text_offset"] == offs, "text_offset %s, want %s" % (lp["text_offset"], offs))
    # streamed: the same, chunk by chunk
    evs = stream(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                          "logprobs": 5})
    s_lp, s_off = [], []
    for e in evs:
        for x in e["choices"]:
            if x.get("logprobs"):
                s_lp += x["logprobs"]["token_logprobs"]
                s_off += x["logprobs"]["text_offset"]
    check(s_lp == lp["token_logprobs"] and s_off == offs,
          "streamed logprobs %s differ from the whole response's %s" % (s_lp, lp["token_logprobs"]))
    # logprobs 0: the sampled token's alone (request_fields.c; vLLM's answer)
    zero = {}
    for k in (0, 2, None):
        body = {"prompt": prompt, "max_tokens": 8, "temperature": 0}
        if k is not None:
            body["logprobs"] = k
        st, zero[k] = post(srv, "/v1/completions", body)
        check(st == 200, "logprobs %s: %d %s" % (k, st, zero[k]))
    report(lp0_problems(zero[0]["choices"][0], c, "logprobs 0"))
    # the check can fail: logprobs 2 (two entries each) and no logprobs (null) are reported
    check(lp0_problems(zero[2]["choices"][0], c, "fault") and
          lp0_problems(zero[None]["choices"][0], c, "fault"),
          "logprobs 2 or no logprobs passed for logprobs 0")
    # chat: content[] with bytes and the k likeliest
    msgs = [{"role": "user", "content": "Once upon a time"}]
    st, tk = post(srv, "/tokenize", {"messages": msgs})
    check(st == 200, "/tokenize: %s" % tk)
    ids = tk["tokens"]
    want = post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 6, "temperature": 0})[1]
    gen = want["choices"][0]["token_ids"]
    st, ch = post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 6,
                                                "temperature": 0, "logprobs": True,
                                                "top_logprobs": 3})
    check(st == 200, "chat logprobs: %d %s" % (st, ch))
    if st != 200:
        return
    content = ch["choices"][0]["logprobs"]["content"]
    rows = log_softmax_rows(model, ids + gen[:-1], len(ids), tmp)
    report(lp_problems([x["logprob"] for x in content],
                       [[y["logprob"] for y in x["top_logprobs"]] for x in content], gen, rows,
                       len(ids), 3, "chat"))
    check("".join(x["token"] for x in content) == ch["choices"][0]["message"]["content"],
          "chat: the tokens do not make the reply")
    check(all(bytes(x["bytes"]).decode() == x["token"] and
              x["top_logprobs"][0]["token"] == x["token"] for x in content),
          "chat: bytes or the top token wrong: %s" % content[:2])
    evs = stream(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 6,
                                               "temperature": 0, "logprobs": True,
                                               "top_logprobs": 3})
    s = [y for e in evs for x in e["choices"] if x.get("logprobs")
         for y in x["logprobs"]["content"]]
    check(s == content, "chat stream: logprobs differ from the whole response's")


def lp0_problems(z, c, label):
    """Problems of choice z of logprobs 0 against choice c of logprobs 5 (checked against the
    oracle): the same tokens, log-probabilities and offsets, each top entry the token alone."""
    lp, want = z.get("logprobs"), c["logprobs"]
    if not lp:
        return ["%s: logprobs %s" % (label, lp)]
    bad = []
    if z["token_ids"] != c["token_ids"]:
        bad.append("%s: tokens %s, want %s" % (label, z["token_ids"], c["token_ids"]))
    for key in ("tokens", "token_logprobs", "text_offset"):
        if lp[key] != want[key]:
            bad.append("%s: %s %s, want %s" % (label, key, lp[key], want[key]))
    top = [{t: v} for t, v in zip(want["tokens"], want["token_logprobs"])]
    if lp["top_logprobs"] != top:
        bad.append("%s: top_logprobs %s, want %s" % (label, lp["top_logprobs"], top))
    return bad


def stop_expect(pieces, stop, min_tokens):
    """(text, completion tokens, finish reason) of a choice whose tokens have the texts pieces
    (the run without the stop string), by vLLM's rule (engine/api/choice.c, find_stop): no
    stop string is looked for while the choice has at most min_tokens tokens, and one that ends
    within the first min_tokens tokens' text does not count; the text ends before it."""
    text, floor = "", 0
    for k, p in enumerate(pieces, 1):
        text += p
        if k <= min_tokens:
            floor = len(text)
            continue
        at = text.find(stop, max(0, floor - len(stop) + 1))
        if at >= 0:
            return text[:at], k, "stop"
    return text, len(pieces), "length"


def test_stop_min_tokens(srv, tmp, model):
    req = {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0}
    want = serve.oracle(tmp, model, [req], name="stop")[0]
    st, r = post(srv, "/v1/completions", dict(req, logprobs=0))
    check(st == 200 and r["choices"][0]["token_ids"] == want,
          "the run without a stop string is not the one-process model's: %s" % r)
    if st != 200:
        return
    pieces = r["choices"][0]["logprobs"]["tokens"]
    check("".join(pieces) == r["choices"][0]["text"], "stop: the tokens do not make the text")
    got = {}
    for m in (None, 1, 29, 30, 40):
        body = dict(req, stop=[","]) if m is None else dict(req, stop=[","], min_tokens=m)
        st, x = post(srv, "/v1/completions", body)
        check(st == 200, "stop with min_tokens %s: %d %s" % (m, st, x))
        if st != 200:
            return
        c = x["choices"][0]
        got[m] = (c["text"], x["usage"]["completion_tokens"], c["finish_reason"])
        check(c["token_ids"] == want[:got[m][1]],
              "stop with min_tokens %s: ids are not the one-process model's" % m)
    for m, g in got.items():
        check(g == stop_expect(pieces, ",", m or 0), "stop \",\" with min_tokens %s: %s, want %s"
              % (m, g, stop_expect(pieces, ",", m or 0)))
    # what the cases show: the comma of the first token stops at once, min_tokens lets the
    # text run on to a later one, and min_tokens = max_tokens to the end
    check(got[None][:2] == ("", 1) and got[1][1] > 1 and got[40][2] == "length",
          "stop with min_tokens: the cases do not show the rule: %s" % got)
    # the check can fail: a rule off by one token (29 taken for 30), or without min_tokens
    check(stop_expect(pieces, ",", 30) != got[29] and stop_expect(pieces, ",", 0) != got[29],
          "self-check: a wrong min_tokens rule was not reported")
    evs = stream(srv, "/v1/completions", dict(req, stop=[","], min_tokens=29))
    text = "".join(c.get("text", "") for e in evs for c in e["choices"])
    fins = [c["finish_reason"] for e in evs for c in e["choices"] if c.get("finish_reason")]
    check((text, fins) == (got[29][0], ["stop"]), "streamed stop with min_tokens 29: %r %s"
          % (text, fins))


def test_ignore_eos(srv, model):
    """ignore_eos with a control: stories260K never samples EOS early, so EOS is pushed up by
    logit_bias; without ignore_eos the completion ends at once, with it runs to max_tokens."""
    with open(os.path.join(model, "config.json")) as f:
        eos = json.load(f)["eos_token_id"]
    check(eos == 2, "stories260K's EOS is %s, not llama2.c's 2" % eos)
    req = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
    res = {}
    for tok, ign in ((eos, False), (eos, True), (383, False)):
        st, res[tok, ign] = post(srv, "/v1/completions", dict(req, ignore_eos=ign,
                                                              logit_bias={str(tok): 100}))
        check(st == 200, "logit_bias %d, ignore_eos %s: %d %s" % (tok, ign, st, res[tok, ign]))
        if st != 200:
            return

    def ran(x, tok):
        c = x["choices"][0]
        return (c["finish_reason"] == "length" and x["usage"]["completion_tokens"] == 12 and
                c["token_ids"] == [tok] * 12)

    stopped = res[eos, False]
    check(stopped["choices"][0]["finish_reason"] == "stop" and stopped["choices"][0]["text"] == ""
          and stopped["usage"]["completion_tokens"] <= 1,
          "EOS favoured, without ignore_eos: %s (it should end at once)" % stopped)
    check(ran(res[eos, True], eos), "EOS favoured, with ignore_eos: %s" % res[eos, True])
    check(ran(res[383, False], 383), "another token favoured: %s" % res[383, False])
    # the check can fail: the run that ended at EOS is not one that ran on
    check(not ran(stopped, eos), "self-check: a completion ended by EOS passed for ignore_eos")


def prompt_lp_problems(lp, ids, rows, k, label, shift=0):
    """Problems of the echoed prompt's entries of completions' logprobs lp against the oracle:
    entry 0 null in both lists, entry i (i >= 1) log p(ids[i] | ids[:i]) from row i - 1 (row
    i - 1 + shift: a fault when shift is not 0) and the oracle's k likeliest among its top
    (which also holds the prompt token itself when it is not among them)."""
    bad = []
    tl, tops = lp["token_logprobs"], lp["top_logprobs"]
    if len(tl) < len(ids) or len(tops) < len(ids):
        return ["%s: %d entries for a prompt of %d" % (label, len(tl), len(ids))]
    if tl[0] is not None or tops[0] is not None:
        bad.append("%s: the first prompt token has %s, %s, want null" % (label, tl[0], tops[0]))
    for i in range(1, len(ids)):
        row = rows[i - 1 + shift]
        if tl[i] is None or abs(tl[i] - row[ids[i]]) > TOL:
            bad.append("%s: prompt token %d (%d) logprob %s, oracle %.7f" % (label, i, ids[i],
                                                                           tl[i], row[ids[i]]))
            continue
        got = sorted(tops[i].values(), reverse=True)
        want = sorted(row, reverse=True)[:k]
        if len(got) not in (k, k + 1) or any(abs(a - b) > TOL for a, b in zip(got[:k], want)):
            bad.append("%s: prompt token %d top %s, oracle %s" % (label, i, got, want))
        if not any(abs(v - tl[i]) <= TOL for v in got):
            bad.append("%s: prompt token %d is not in its top entries" % (label, i))
    return bad


def test_echo_logprobs(srv, tmp, model):
    """echo with logprobs (lm-eval's loglikelihood): the prompt's entries, then the completion's
    unchanged; the prompt is longer than a prefill chunk (--max-num-batched-tokens 8)."""
    text = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
            "with her big red ball.")
    ids = post(srv, "/tokenize", {"prompt": text})[1]["tokens"]
    check(len(ids) > 3 * 8, "the echo prompt (%d tokens) spans too few prefill chunks" % len(ids))
    req = {"prompt": text, "max_tokens": 4, "temperature": 0, "logprobs": 3}
    st, e = post(srv, "/v1/completions", dict(req, echo=True))
    check(st == 200, "echo with logprobs: %d %s" % (st, e))
    if st != 200:
        return
    _, p = post(srv, "/v1/completions", req)
    c, pc = e["choices"][0], p["choices"][0]
    lp, plp, n = c["logprobs"], pc["logprobs"], len(ids)
    gen = pc["token_ids"]
    rows = log_softmax_rows(model, ids + gen[:-1], n, tmp)
    report(prompt_lp_problems(lp, ids, rows, 3, "echo"))
    check(prompt_lp_problems(lp, ids, rows, 3, "fault", shift=1),
          "a prompt entry read from the wrong position was not reported")
    check(c["token_ids"] == gen and lp["token_logprobs"][n:] == plp["token_logprobs"] and
          lp["top_logprobs"][n:] == plp["top_logprobs"] and lp["tokens"][n:] == plp["tokens"],
          "echo: the completion's logprobs changed: %s, want %s" % (lp["token_logprobs"][n:],
                                                                   plp["token_logprobs"]))
    # (each prompt token's own text: BOS and the word-start spaces of a SentencePiece model
    # do not spell the prompt as given, in vLLM either)
    check(len(lp["tokens"]) == n + len(gen) and "".join(lp["tokens"][n:]) == pc["text"] and
          c["text"] == text + pc["text"] and "".join(lp["tokens"][1:n]).strip() == text,
          "echo: tokens %s do not make the text %r" % (lp["tokens"][:4], c["text"]))
    offs, o = [], 0
    for t in lp["tokens"]:
        offs.append(o)
        o += len(t)
    check(lp["text_offset"] == offs, "echo: text_offset %s, want %s" % (lp["text_offset"], offs))
    check(e["usage"]["prompt_tokens"] == n and e["usage"]["completion_tokens"] == len(gen),
          "echo: usage %s" % e["usage"])
    # max_tokens 0: the prompt alone, the same entries (bit for bit, on either replica)
    for _ in range(2):
        st, z = post(srv, "/v1/completions", dict(req, echo=True, max_tokens=0))
        check(st == 200, "echo with max_tokens 0: %d %s" % (st, z))
        if st != 200:
            return
        zc = z["choices"][0]
        check(zc["text"] == text and zc["logprobs"]["token_logprobs"] == lp["token_logprobs"][:n]
              and zc["logprobs"]["tokens"] == lp["tokens"][:n] and zc["token_ids"] == [] and
              z["usage"]["completion_tokens"] == 0 and zc["finish_reason"] == "length",
              "echo with max_tokens 0: %s" % zc)
    st, r = post(srv, "/v1/completions", dict(req, max_tokens=0))
    check(st == 400 and "\"max_tokens\" 0 needs \"echo\"" in r["error"]["message"],
          "max_tokens 0 without echo: %d %s" % (st, r))


def test_echo(srv):
    for prompt in ("Once upon a time", ["Lily and Ben", "The cat"]):
        st, e = post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 6,
                                              "temperature": 0, "echo": True})
        _, p = post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 6,
                                             "temperature": 0})
        texts = prompt if isinstance(prompt, list) else [prompt]
        check(st == 200 and [c["text"] for c in e["choices"]] ==
              [t + c["text"] for t, c in zip(texts, p["choices"])],
              "echo: %s" % (e if st != 200 else [c["text"] for c in e["choices"]]))
    # ids: the text's, decoded as a completion's text is (special tokens skipped: no BOS)
    text = "Once upon a time"
    ids = post(srv, "/tokenize", {"prompt": text})[1]["tokens"]
    _, e = post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 4, "temperature": 0,
                                         "echo": True})
    _, p = post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 4, "temperature": 0})
    check(e["choices"][0]["text"] == text + p["choices"][0]["text"],
          "echo of ids: %r, want %r" % (e["choices"][0]["text"], text + p["choices"][0]["text"]))
    ev = stream(srv, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6,
                                         "temperature": 0, "echo": True})
    check("".join(c["text"] for x in ev for c in x["choices"]).startswith("Once upon a time,"),
          "streamed echo does not start with the prompt")


def refused(st, r, key):
    """Whether a response is a 400 whose error message names the field key."""
    return st == 400 and "\"%s\"" % key in r.get("error", {}).get("message", "")


def test_refused(srv):
    for body, name in (({"echo": True, "logprobs": 1, "stream": True}, "\"stream\""),
                       ({"logprobs": 21}, "\"logprobs\""),
                       ({"best_of": 2}, "\"best_of\""),
                       ({"prompt_logprobs": 1}, "\"prompt_logprobs\""),
                       ({"response_format": {"type": "json_object"}}, "\"response_format\"")):
        st, r = post(srv, "/v1/completions", dict(body, prompt="Once", max_tokens=2))
        check(st == 400 and name in r["error"]["message"], "%s: %d %s" % (body, st, r))
    # structured output, refused by name in completions and chat (null is accepted)
    guided = {"guided_regex": "[a-z]+", "guided_json": {"type": "object"},
              "guided_choice": ["yes", "no"], "guided_grammar": "root ::= \"a\"",
              "response_format": {"type": "json_schema",
                                  "json_schema": {"name": "x", "schema": {"type": "object"}}}}
    for path, base in (("/v1/completions", {"prompt": "Once", "max_tokens": 2}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Lily"}],
                                                 "max_tokens": 2})):
        for key, val in guided.items():
            st, r = post(srv, path, dict(base, **{key: val}))
            check(refused(st, r, key), "%s with %s: %d %s" % (path, key, st, r))
            # the check can fail: the field at null is accepted, and not seen as refused
            st, r = post(srv, path, dict(base, **{key: None}))
            check(st == 200 and not refused(st, r, key), "%s with %s null: %d %s" %
                  (path, key, st, r))


def main():
    if not DPSHARD or not os.access(DPSHARD, os.X_OK):
        print("SKIP: DPSHARD must name the built binary")
        return 77
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("SKIP: numpy is needed for the log-softmax oracle (run with /usr/bin/python3)")
        return 77
    if not os.access(os.path.join(BUILD, "tests", "hf_logits"), os.X_OK):
        print("FAIL: %s/tests/hf_logits is not built" % BUILD)
        return 1
    tmp = tempfile.mkdtemp(prefix="dps-serve-oai-")
    srv = None
    try:
        model = serve.st260(tmp)
        with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
            json.dump({"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"},
                      f)
        srv = Server(tmp, model, "--data-parallel-size", "2", "--kv-cache-memory", "32M",
                     "--max-model-len", "256", "--max-num-seqs", "8",
                     "--max-num-batched-tokens", "8", name="oai")
        check(srv.wait_ready(), "the server did not become ready")
        test_batched(srv, tmp, model)
        test_n(srv, tmp, model)
        test_logprobs(srv, tmp, model)
        test_echo(srv)
        test_echo_logprobs(srv, tmp, model)
        test_stop_min_tokens(srv, tmp, model)
        test_ignore_eos(srv, model)
        test_refused(srv)
        check(srv.stop() == 0, "serve did not exit 0 on SIGTERM")
        srv = None
    finally:
        if srv:
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if serve.failures:
        print("%d failure(s)" % len(serve.failures))
        return 1
    print("serve_oai: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

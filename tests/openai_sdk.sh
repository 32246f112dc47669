#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/openai_sdk.sh - the official OpenAI Node SDK (npm `openai`, fetched at test time into
# the build tree and kept there) driving `dpshard serve` of stories260K: /v1/completions and
# /v1/chat/completions, streamed and not, models.list and models.retrieve, refused fields as
# APIError 400; texts compared with the one-process model (`dpshard generate`). The checks are
# tests/openai_sdk.js's. Stories260K has no chat template: the test gives it one that joins
# the messages' contents, so both sides render the same prompt. Skips (77) with the reason
# when Node, npm or the registry is missing, unless DPSHARD_REQUIRE_ORACLES=1 (CI).
set -u
dpshard=${DPSHARD:?DPSHARD must name the built binary}
src=${DPSHARD_SRCDIR:-.}
build=${DPSHARD_BUILDDIR:-.}
# The folder of chat_e2e.sh, which installs the same openai@4 (one install, not two).
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
if [ ! -d "$npm_dir/node_modules/openai" ]; then
	mkdir -p "$npm_dir"
	timeout 600 npm install --prefix "$npm_dir" --no-audit --no-fund --silent openai@4 \
		>"$npm_dir/install.log" 2>&1 ||
		{ tail -5 "$npm_dir/install.log"; skip "npm install failed (no registry?)"; }
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dps-sdk.XXXXXX")
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT

model=$tmp/st260
"$dpshard" convert llama2c "$src/models/stories260K/stories260K.bin" \
	"$src/models/stories260K/tok512.bin" "$model" >/dev/null || { echo "FAIL: convert"; exit 1; }
printf '%s' "{% for m in messages %}{{ m['content'] }}{% endfor %}" >"$model/chat_template.jinja"

"$dpshard" serve --model "$model" --port 0 --cpu-bind off --kv-cache-memory 32M \
	>"$tmp/serve.log" 2>&1 &
pid=$!
port=
for _ in $(seq 1 600); do
	port=$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\).*|\1|p' "$tmp/serve.log" | head -n 1)
	[ -n "$port" ] && /usr/bin/python3 -c 'import sys, urllib.request
urllib.request.urlopen("http://127.0.0.1:%s/health" % sys.argv[1], timeout=2)' "$port" 2>/dev/null && break
	kill -0 "$pid" 2>/dev/null || break
	sleep 0.1
done
if [ -z "$port" ] || ! kill -0 "$pid" 2>/dev/null; then
	echo "FAIL: the server did not start"
	tail -20 "$tmp/serve.log" | sed 's/^/    /'
	exit 1
fi
fail=0
if ! timeout 300 node "$src/tests/openai_sdk.js" "$npm_dir" "$port" "$dpshard" "$model"; then
	echo "FAIL: the OpenAI SDK checks (above)"
	tail -20 "$tmp/serve.log" | sed 's/^/    /'
	fail=1
fi
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
st=$?
pid=
[ "$st" = 0 ] || { echo "FAIL: serve exited $st after SIGTERM"; fail=1; }
exit $fail

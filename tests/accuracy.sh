#!/bin/sh
# SPDX-License-Identifier: MIT
#
# tests/accuracy.sh - `dpshard bench accuracy` on stories260K (the build tree's data/stories260K),
# the thresholds of issue 19 held in make check: BF16 weights (the sharded engine, 1 x 1) against
# the f32 model over the f32 model's own greedy text of 4096 positions give a mean KLD <= 0.001
# and >= 99.5% top-1 agreement, the same bits twice; f32 against itself gives exactly 0 and
# 100%. The check can fail: a copy of the model whose weights keep only 3 mantissa bits,
# compared with --base the original, exceeds the threshold. INT8 (--quantization int8, and the
# checkpoint of `dpshard quantize`): mean KLD <= 0.005, >= 98% top-1. Also: a --text file.
# Exit status: 0 pass, 1 fail, 77 skip.

set -u

PY=/usr/bin/python3
if [ -z "${DPSHARD:-}" ] || [ ! -x "$DPSHARD" ]; then
	echo "SKIP: DPSHARD must name the built dpshard binary (it is '${DPSHARD:-}')"
	exit 77
fi
if ! "$PY" -c 'import numpy' 2>/dev/null; then
	echo "SKIP: $PY with numpy is needed to read the JSON and perturb the weights"
	exit 77
fi
model="${DPSHARD_BUILDDIR:-$(dirname "$DPSHARD")}/data/stories260K"
if [ ! -f "$model/config.json" ]; then
	echo "SKIP: $model is missing (make converts models/stories260K there)"
	exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/accuracy-test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM
failures=0

fail() {
	echo "FAIL: $*"
	failures=$((failures + 1))
}

# run NAME ARGS...: dpshard bench accuracy ARGS, stdout in $tmp/NAME.out; sets rc.
run() {
	name=$1
	shift
	timeout -k 5 300 "$DPSHARD" bench accuracy "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" </dev/null
	rc=$?
}

# check NAME EXPR: EXPR (Python, over the JSON object j) holds for run NAME's output.
check() {
	if ! "$PY" -c "import json, sys; j = json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" \
		"$tmp/$1.out" 2>"$tmp/check.err"; then
		fail "$1: $2 does not hold for: $(cat "$tmp/$1.out" "$tmp/check.err")"
	fi
}

run bf16 --model "$model" --dtype bf16 --json
[ "$rc" -eq 0 ] || fail "bf16: exit $rc: $(cat "$tmp/bf16.err")"
check bf16 'j["positions"] >= 2000 and j["dtype"] == "bf16" and j["engine"].startswith("sharded")'
check bf16 'j["kld_mean"] <= 0.001 and j["top1_agreement"] >= 0.995'
check bf16 'j["kld_mean"] > 0 and j["weight_bytes"] < 0.6 * j["base_weight_bytes"]'
run bf16b --model "$model" --dtype bf16 --json
cmp -s "$tmp/bf16.out" "$tmp/bf16b.out" || fail "bf16: two runs differ"

run f32 --model "$model" --dtype f32 --json
[ "$rc" -eq 0 ] || fail "f32: exit $rc: $(cat "$tmp/f32.err")"
check f32 'j["kld_mean"] == 0 and j["kld_max"] == 0 and j["top1_agreement"] == 1'
check f32 'j["ppl"] == j["ppl_base"] and j["positions"] == 4096'

# The check can fail: weights with 3 mantissa bits (each float's low 20 bits cleared).
mkdir "$tmp/coarse"
cp "$model/config.json" "$model/tokenizer.bin" "$tmp/coarse/"
"$PY" - "$model/model.safetensors" "$tmp/coarse/model.safetensors" <<'EOF' || fail "perturbing the weights"
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
data = bytearray(raw[8 + n:])
for name, t in head.items():
    if name == "__metadata__" or t["dtype"] != "F32" or len(t["shape"]) != 2:
        continue
    a, b = t["data_offsets"]
    w = np.frombuffer(bytes(data[a:b]), dtype="<u4") & np.uint32(0xfff00000)
    data[a:b] = w.astype("<u4").tobytes()
open(sys.argv[2], "wb").write(raw[:8 + n] + bytes(data))
EOF
run coarse --model "$tmp/coarse" --base "$model" --dtype f32 -n 2048 --json
[ "$rc" -eq 0 ] || fail "coarse: exit $rc: $(cat "$tmp/coarse.err")"
check coarse 'not (j["kld_mean"] <= 0.001 and j["top1_agreement"] >= 0.995)'

# A text file: every token after the first is scored.
printf 'Once upon a time, there was a little dog named Max. Max liked to run in the park.\n' \
	>"$tmp/story.txt"
run text --model "$model" --text "$tmp/story.txt" --json
[ "$rc" -eq 0 ] || fail "text: exit $rc: $(cat "$tmp/text.err")"
check text 'j["text"] == "file" and 10 < j["positions"] < 100 and j["kld_mean"] < 0.01'

# Human-readable output names what it reports.
run human --model "$model" -n 600
grep -q "Mean    KLD" "$tmp/human.out" && grep -q "Same top p" "$tmp/human.out" &&
	grep -q "600 positions" "$tmp/human.out" || fail "human: $(cat "$tmp/human.out")"

# INT8 (--quantization int8, issue 19's thresholds): KLD <= 0.005, top-1 >= 98%, in less than
# half of f32's bytes, the same bits twice and from the checkpoint `dpshard quantize` writes
# (its statistics equal, with --base the original). The coarse copy above is the failing case
# of the same checks.
run int8 --model "$model" --quantization int8 --json
[ "$rc" -eq 0 ] || fail "int8: exit $rc: $(cat "$tmp/int8.err")"
check int8 'j["positions"] >= 2000 and j["dtype"] == "int8" and j["engine"].startswith("sharded")'
check int8 'j["kld_mean"] <= 0.005 and j["top1_agreement"] >= 0.98'
check int8 'j["kld_mean"] > 0 and j["weight_bytes"] < 0.5 * j["base_weight_bytes"]'
run int8b --model "$model" --quantization int8 --json
cmp -s "$tmp/int8.out" "$tmp/int8b.out" || fail "int8: two runs differ"
"$DPSHARD" quantize --quiet "$model" "$tmp/q8" >/dev/null 2>"$tmp/quantize.err" ||
	fail "quantize: $(cat "$tmp/quantize.err")"
run int8ck --model "$tmp/q8" --base "$model" --json
[ "$rc" -eq 0 ] || fail "int8 checkpoint: exit $rc: $(cat "$tmp/int8ck.err")"
"$PY" - "$tmp/int8.out" "$tmp/int8ck.out" <<'EOF' || fail "int8 checkpoint: its statistics differ"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
keys = [k for k in a if k.startswith(("kld", "top1", "ppl", "dp_"))]
sys.exit(0 if len(keys) > 4 and all(a[k] == b[k] for k in keys) else 1)
EOF
run both --model "$model" --text "$tmp/story.txt" --prompt "Once"
[ "$rc" -eq 2 ] || fail "--text with --prompt: exit $rc"

if [ "$failures" -gt 0 ]; then
	echo "$failures failure(s)"
	exit 1
fi
echo "PASS: bench accuracy"
exit 0

#!/bin/sh
# SPDX-License-Identifier: MIT
#
# tests/cli.sh - end-to-end checks of the dpshard command line. `make check` runs it with
# DPSHARD set to the built binary. It checks --help; `dpshard groups` on the reference's
# TP=8 x DP=4 example (the rank grid must match the reference's line for line, and a deliberately
# altered grid must not); rejected layouts and flags and their exit codes; `dpshard bench
# coll` on real rank processes for four collectives, where every size's result check must
# say ok; the --json output; and that no run left a dpshard-* segment in /dev/shm.
# A run still going after $RUN_TIMEOUT s (120) is killed. Exit status: 0 pass, 1 fail, 77 skip.

set -u

if [ -z "${DPSHARD:-}" ] || [ ! -x "$DPSHARD" ]; then
	echo "SKIP: DPSHARD must name the built dpshard binary (it is '${DPSHARD:-}')"
	exit 77
fi
if ! command -v python3 >/dev/null 2>&1; then
	echo "SKIP: python3 is needed to check the JSON, CSV and GGUF outputs (Debian: python3)"
	exit 77
fi
if [ ! -d /dev/shm ]; then
	echo "SKIP: no /dev/shm on this machine; dpshard needs POSIX shared memory"
	exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cli-test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

RUN_TIMEOUT=120
failures=0
pids=""   # every dpshard process this script started: its segments carry that pid

fail() {
	echo "FAIL: $*"
	failures=$((failures + 1))
}

# Prints a captured file indented, for the context of a failure.
show() {
	echo "  $1 of: $desc"
	sed -n '1,40s/^/    | /p' "$2"
}

# run ARGS...: runs $DPSHARD ARGS with stdout in $tmp/out and stderr in $tmp/err; sets rc.
# coreutils' timeout stops a run still going after $RUN_TIMEOUT s (TERM to dpshard and its
# ranks, which share its process group; KILL 5 s later): nothing outlives the run, so no
# timer of one run can fire during another. The shell writes its pid and then becomes dpshard,
# so the pid its segments carry is known.
run() {
	desc="dpshard $*"
	rm -f "$tmp/pid"
	t0=$(date +%s)
	timeout -k 5 "$RUN_TIMEOUT" sh -c 'echo $$ >"$0" && exec "$@"' "$tmp/pid" "$DPSHARD" "$@" \
		>"$tmp/out" 2>"$tmp/err" </dev/null
	rc=$?
	if [ -s "$tmp/pid" ]; then
		pids="$pids $(cat "$tmp/pid")"
	fi
	# 124: timed out and stopped by TERM; 137: KILLed, by timeout only if the time was up.
	if [ "$rc" -eq 124 ] || { [ "$rc" -eq 137 ] && [ $(( $(date +%s) - t0 )) -ge "$RUN_TIMEOUT" ]; }; then
		fail "$desc: still running after $RUN_TIMEOUT s, killed"
	fi
}

# expect_rc N: the last run exited with N.
expect_rc() {
	if [ "$rc" -ne "$1" ]; then
		fail "$desc: exit status $rc, want $1"
		show stdout "$tmp/out"
		show stderr "$tmp/err"
		return 1
	fi
	return 0
}

shm_list() {
	for e in /dev/shm/dpshard-*; do
		if [ -e "$e" ]; then
			echo "${e#/dev/shm/}"
		fi
	done | sort
}

shm_list >"$tmp/shm.before"

# ---- dpshard --help ------------------------------------------------------------------

run --help
if expect_rc 0; then
	for cmd in groups bench "bench accuracy" "bench coll" "bench decode" "bench sweep" "bench serve" \
		"bench tokenize" convert mkmodel quantize generate serve tokenize detokenize; do
		grep -q "^  $cmd " "$tmp/out" || { fail "$desc: does not list '$cmd'"; show stdout "$tmp/out"; }
	done
fi

# ---- dpshard groups: the reference's example ----------------------------------------------

# The reference's grid for TP=8, DP=4 ("Example: TP=8, DP=4, all dp_sizes=4"), byte for byte.
cat >"$tmp/grid.want" <<'EOF'
         TP rank:  0   1   2   3   4   5   6   7
         ─────────────────────────────────────────
  DP0:           [ 0   1   2   3   4   5   6   7 ]
  DP1:           [ 8   9  10  11  12  13  14  15 ]
  DP2:           [16  17  18  19  20  21  22  23 ]
  DP3:           [24  25  26  27  28  29  30  31 ]
EOF

# The header line of the grid and the five lines after it.
grid_of() {
	awk '/^         TP rank:/ { n = 6 } n > 0 { print; n-- }' "$1"
}

run groups --tensor-parallel-size 8 --data-parallel-size 4 --attention-dp-size 4 \
	--embedding-dp-size 4 --mlp-dp-size 4 --draft-mlp-dp-size 4 --lm-head-dp-size 4
if expect_rc 0; then
	grid_of "$tmp/out" >"$tmp/grid.have"
	n=$(grep -c '^         TP rank:' "$tmp/out")
	if [ "$n" -ne 1 ]; then
		fail "$desc: $n rank grids in the output, want 1"
	fi
	if ! cmp -s "$tmp/grid.want" "$tmp/grid.have"; then
		fail "$desc: the rank grid differs from the reference's (- reference, + dpshard):"
		diff -u "$tmp/grid.want" "$tmp/grid.have" | sed 's/^/    /'
	fi
	# Deliberate fault: the comparison above must notice one changed rank.
	sed 's/\[24  25/[24  26/' "$tmp/out" >"$tmp/out.bad"
	grid_of "$tmp/out.bad" >"$tmp/grid.bad"
	if cmp -s "$tmp/grid.want" "$tmp/grid.bad"; then
		fail "self-check: the grid comparison passed a grid with rank 25 changed"
	fi
	for line in '  TP0: [0, 8, 16, 24]' '  TP7: [7, 15, 23, 31]'; do
		grep -qxF -- "$line" "$tmp/out" || fail "$desc: no line '$line'"
	done
fi

# ---- disaggregated prefill: both parts, and not run yet -----------------------------------

# The reference's decode side with 16 prefill ranks: the decode grid unchanged, the prefill
# replicas numbered after it (rank (p, t) = 32 + 8p + t).
run groups --tensor-parallel-size 8 --data-parallel-size 4 --attention-dp-size 4 \
	--prefill-data-parallel-size 2
if expect_rc 0; then
	for line in 'decode part: ranks 0-31, 4 replicas; prefill part: ranks 32-47, 2 replicas of TP=8 (below)' \
		'  DP3:           [24  25  26  27  28  29  30  31 ]' \
		'  DP1:           [40  41  42  43  44  45  46  47 ]' \
		'  DP0: [32, 33, 34, 35, 36, 37, 38, 39]'; do
		grep -qxF -- "$line" "$tmp/out" || fail "$desc: no line '$line'"
	done
fi
run groups --prefill-tensor-parallel-size 2
if expect_rc 2; then
	grep -qF -- 'it needs --prefill-data-parallel-size' "$tmp/err" ||
		{ fail "$desc: stderr does not say what is missing"; show stderr "$tmp/err"; }
fi

# ---- several nodes: which groups would cross machines --------------------------------------

run groups --tensor-parallel-size 8 --data-parallel-size 4 --nodes 4
if expect_rc 0; then
	for line in 'nodes: 4, 8 ranks each; instance rank r runs on node r / 8 (node-major)' \
		'TP: every group inside one node' \
		'  group 0 [0,8,16,24] spans nodes 0,1,2,3' '  8 of 8 groups of DP cross nodes'; do
		grep -qxF -- "$line" "$tmp/out" || fail "$desc: no line '$line'"
	done
fi
run groups --tensor-parallel-size 8 --data-parallel-size 4 --nodes 3
if expect_rc 2; then
	grep -qF -- '--nodes 3 does not divide this layout'"'"'s 32 ranks' "$tmp/err" ||
		{ fail "$desc: stderr does not say why"; show stderr "$tmp/err"; }
fi

# ---- rejected layouts and flags --------------------------------------------------------

run groups --mlp-dp-size 3 --data-parallel-size 4
if expect_rc 2; then
	msg='--mlp-dp-size 3 does not divide --data-parallel-size 4'
	grep -qF -- "$msg" "$tmp/err" || { fail "$desc: stderr lacks '$msg'"; show stderr "$tmp/err"; }
fi

run groups --no-such-flag 3
if expect_rc 2; then
	grep -qF -- 'no-such-flag' "$tmp/err" ||
		{ fail "$desc: stderr does not name the unknown flag"; show stderr "$tmp/err"; }
fi

run bench coll --no-such-flag
expect_rc 2

run no-such-command
expect_rc 2

# ---- dpshard bench coll ---------------------------------------------------------------

# The last run printed one "ok" row per size, 64 B to 4 KiB.
check_bench_rows() {
	grep -v '^#' "$tmp/out" >"$tmp/rows"
	n=$(wc -l <"$tmp/rows")
	if [ "$n" -ne 7 ]; then
		fail "$desc: $n data rows, want 7"
		show stdout "$tmp/out"
		return
	fi
	sizes=$(awk '{ printf "%s ", $1 }' "$tmp/rows")
	if [ "$sizes" != "64 128 256 512 1024 2048 4096 " ]; then
		fail "$desc: sizes are '$sizes', want 64 to 4096 doubling"
	fi
	if awk '$NF != "ok" { bad = 1 } END { exit !bad }' "$tmp/rows"; then
		fail "$desc: a row's check is not ok"
		show stdout "$tmp/out"
		show stderr "$tmp/err"
	fi
}

run bench coll --ranks 3 --op allreduce --min-bytes 64 --max-bytes 4K --repeats 3
expect_rc 0 && check_bench_rows

for op in allgather reducescatter alltoall; do
	run bench coll --ranks 4 --op "$op" --dtype bf16 --min-bytes 64 --max-bytes 4K --repeats 3
	expect_rc 0 && check_bench_rows
done

# A group across 2 nodes (one process hosting both): every size checked, the rows say so.
run bench coll --ranks 4 --nodes 2 --op allreduce --min-bytes 64 --max-bytes 4K --repeats 3
if expect_rc 0; then
	check_bench_rows
	grep -v '^#' "$tmp/out" | grep -qv ' nodes ' && fail "$desc: a row not across nodes"
fi
run bench coll --ranks 4 --nodes 2 --in-place
expect_rc 2

# The MPI loop's method (each call alone after a barrier, the slowest rank's time), said in
# the header; the ping-pong floor, one row; both refused where they do not apply.
run bench coll --ranks 3 --method osu --op allreduce --min-bytes 64 --max-bytes 4K --repeats 3
if expect_rc 0; then
	check_bench_rows
	grep -q '^# .*method osu: each call alone after a barrier' "$tmp/out" ||
		fail "$desc: the header does not say the method"
fi
run bench coll --op pingpong --repeats 3
if expect_rc 0; then
	grep -v '^#' "$tmp/out" | awk 'NF && ($1 != 64 || !($4 > 0) || $NF != "ok") { bad = 1 }
		END { exit bad }' || { fail "$desc: no positive one-way time"; show stdout "$tmp/out"; }
fi
run bench coll --op pingpong --ranks 3
expect_rc 2
# The bare exchange (each rank's counter in its own line), by both methods; it needs 2 ranks.
for m in batch osu; do
	run bench coll --op exchange --method $m --repeats 3
	if expect_rc 0; then
		grep -q "^# dpshard bench coll: exchange, .*method $m" "$tmp/out" ||
			fail "$desc: the header does not say the exchange and its method"
		grep -v '^#' "$tmp/out" | awk 'NF { n++ } NF && ($1 != 8 || !($4 > 0) || $NF != "ok") {
			bad = 1 } END { exit bad || n != 1 }' ||
			{ fail "$desc: not one row with a positive time"; show stdout "$tmp/out"; }
	fi
done
run bench coll --op exchange --ranks 3
if expect_rc 2; then
	grep -qF -- '--op exchange runs between --ranks 2' "$tmp/err" ||
		{ fail "$desc: the refusal does not name the op"; show stderr "$tmp/err"; }
fi
run bench coll --method mpi
if expect_rc 2; then
	grep -qF -- '--method mpi is not one of batch, osu' "$tmp/err" ||
		{ fail "$desc: the refusal does not name the method"; show stderr "$tmp/err"; }
fi

run bench coll --json --ranks 3 --op allreduce --min-bytes 64 --max-bytes 4K --repeats 3
if expect_rc 0; then
	if ! python3 -c '
import json, sys
rows = []
for n, l in enumerate(sys.stdin, 1):
    try:
        rows.append(json.loads(l))
    except ValueError as e:
        sys.exit("line %d: %s: %s" % (n, e, l.rstrip()))
if len(rows) != 7:
    sys.exit("%d JSON lines, want 7" % len(rows))
if not all(r["check"] is True for r in rows):
    sys.exit("a row has \"check\" other than true")
' <"$tmp/out" >"$tmp/py.err" 2>&1; then
		fail "$desc: output is not one valid JSON object per size:"
		sed 's/^/    /' "$tmp/py.err"
		show stdout "$tmp/out"
	fi
fi

# ---- dpshard bench decode -------------------------------------------------------------
# The tiny preset, written to a scratch cache on first use; every test gives a positive rate
# and the machine's limits measured in the same run.

XDG_CACHE_HOME=$tmp/cache-bench
export XDG_CACHE_HOME
run bench decode --preset tiny -p 8,16 -n 4 -b 1,3 -r 2 --threads-per-rank 2
if expect_rc 0; then
	[ "$(grep -c '^| tiny-seed0 ' "$tmp/out")" -eq 4 ] || { fail "$desc: want 4 result rows"; show stdout "$tmp/out"; }
	grep -q "memory read [0-9.]* GB/s (.*), sgemm [0-9]* GFLOP/s" "$tmp/out" ||
		fail "$desc: the measured limits are missing"
	grep -q "memory read [0-9.]* GB/s (2 threads; [0-9.]* before the runs, [0-9.]* after)" \
		"$tmp/out" || fail "$desc: the bandwidth before and after the runs is missing"
fi
run bench decode --preset tiny -p 8 -n 4 -b 2 -r 1 --json
if expect_rc 0; then
	python3 -c '
import json, sys
d = json.load(sys.stdin)
r = d["results"]
assert [x["test"] for x in r] == ["pp8", "tg4"], r
assert all(x["tokens_per_s"] > 0 for x in r), r
assert d["read_bandwidth_gbs"] > 0 and d["sgemm_gflops"] > 0, d
# the bound is the faster of the bandwidth measured before the runs and after them
bb, ba = d["read_bandwidth_before_gbs"], d["read_bandwidth_after_gbs"]
assert bb > 0 and ba > 0 and abs(d["read_bandwidth_gbs"] - max(bb, ba)) < 0.011, d
assert r[1]["batch"] == 2 and r[1]["bytes_per_step"] > 0, r
assert d["version"] and d["git_commit"] and d["cpu"] and d["cpus"] >= 1 and d["numa_nodes"] >= 1, d
# the commit the binary was built from (make writes it at each build), where there is git: run
# outside make check after a new commit without rebuilding, this fails on the stale binary
assert not sys.argv[2] or d["git_commit"].split("-")[0] == sys.argv[2], (d["git_commit"], sys.argv[2])
assert r[1]["expert_threads_busy"] is None, r  # (no experts)
# the products of a decode step read every linear weight once, whatever the batch: the
# projections of each layer and the LM head (tied here), in f32, from the config
c = json.load(open(sys.argv[1]))
hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
per_layer = (c["hidden_size"] * hd * (c["num_attention_heads"] + 2 * c["num_key_value_heads"])
             + c["num_attention_heads"] * hd * c["hidden_size"]
             + 3 * c["hidden_size"] * c["intermediate_size"])
want = 4 * (c["num_hidden_layers"] * per_layer + c["vocab_size"] * c["hidden_size"])
assert r[1]["product_bytes_per_step"] == want, (r[1]["product_bytes_per_step"], want)
assert r[1]["product_read_gbs"] > 0, r
assert "BLIS" in d["blis"] or "dpshard" in d["blis"], d
' "$(find "$tmp/cache-bench" -path '*tiny-seed0/config.json' | head -n 1)" \
		"$(git -C "${DPSHARD_SRCDIR:-.}" rev-parse --short=12 HEAD 2>/dev/null)" \
		<"$tmp/out" >"$tmp/py.err" 2>&1 || { fail "$desc: bad JSON"; sed 's/^/    /' "$tmp/py.err"; }
fi
# MoE experts run as whole-expert tasks on two threads: the part of those tasks' thread time
# spent running experts is reported; on one thread no such tasks run
for t in 1 2; do
	run bench decode --preset tiny-gpt-oss -p 4 -n 8 -b 1 -r 1 -q int8 --threads-per-rank $t --json
	if expect_rc 0; then
		python3 -c '
import json, sys
r = json.load(sys.stdin)["results"][1]
busy = r["expert_threads_busy"]
assert (busy is None) if sys.argv[1] == "1" else (0 < busy <= 1), r
' $t <"$tmp/out" >"$tmp/py.err" 2>&1 || { fail "$desc: bad JSON"; sed 's/^/    /' "$tmp/py.err"; }
	fi
done
run bench decode --preset tiny -p 8 -n 4 -b 1,2 -r 1 --csv
if expect_rc 0; then
	python3 -c '
import csv, sys
rows = list(csv.DictReader(sys.stdin))
assert [r["test"] for r in rows] == ["pp8", "tg4", "tg4"], rows
assert [r["batch"] for r in rows] == ["1", "1", "2"], rows
assert all(float(r["tokens_per_s"]) > 0 and r["git_commit"] and r["blis"] for r in rows), rows
' <"$tmp/out" >"$tmp/py.err" 2>&1 || { fail "$desc: bad CSV"; sed 's/^/    /' "$tmp/py.err"; }
fi
# Across ranks: TP=1 x DP=2 with every component size 2 (the decode graph's collectives).
run bench decode --preset tiny -p 8 -n 4 -b 2 -r 1 --json --data-parallel-size 2 \
	--attention-dp-size 2 --embedding-dp-size 2 --mlp-dp-size 2 --lm-head-dp-size 2
if expect_rc 0; then
	python3 -c '
import json, sys
d = json.load(sys.stdin)
r = d["results"]
assert d["ranks"] == 2 and d["layout"].startswith("TP=1 DP=2"), d
t = r[1]
# tiny has 2 layers: 2 all-reduces per layer plus the embedding one; 2 all-to-alls per layer
assert abs(t["allreduce_per_layer"] - 2.5) < 1e-9 and abs(t["alltoall_per_layer"] - 2) < 1e-9, t
assert 0 <= t["collective_ms"] <= t["step_ms"], t
' <"$tmp/out" >"$tmp/py.err" 2>&1 || { fail "$desc: bad JSON"; sed 's/^/    /' "$tmp/py.err"; }
fi
# bench sweep: three configurations of TP=1 x DP=2 (and one the model's heads refuse), best
# first, each with its memory per rank.
run bench sweep --preset tiny --data-parallel-size 2 --tensor-parallel-size 1 -p 8 -n 4 -b 1,2 \
	-r 1 --configs "1,1,1,1;2,2,2,2;1,2,1,2;3,1,1,1" --json
if expect_rc 0; then
	python3 -c '
import json, sys
d = json.load(sys.stdin)
r = d["results"]
assert len(r) == 3 and all(x["ok"] for x in r), r
assert [x["decode_tokens_per_s"] for x in r] == sorted([x["decode_tokens_per_s"] for x in r], reverse=True), r
assert sorted((x["attention_dp_size"], x["embedding_dp_size"], x["mlp_dp_size"], x["lm_head_dp_size"]) for x in r) == [(1, 1, 1, 1), (1, 2, 1, 2), (2, 2, 2, 2)], r
assert all(x["weight_bytes_per_rank"] > 0 and x["kv_bytes_per_rank"] > 0 for x in r), r
assert d["git_commit"] and d["ranked_by"] == "tg4 b2", d
' <"$tmp/out" >"$tmp/py.err" 2>&1 || { fail "$desc: bad JSON"; sed 's/^/    /' "$tmp/py.err"; show stderr "$tmp/err"; }
	grep -q "skipping 3,1,1,1" "$tmp/err" || fail "$desc: the invalid configuration was not named"
fi
run bench sweep --preset tiny --data-parallel-size 2 -p 8 -n 4 -b 1 -r 1 --configs "1,1,1,1;2,2,2,2" --csv
if expect_rc 0; then
	python3 -c '
import csv, sys
rows = list(csv.DictReader(sys.stdin))
assert [r["rank"] for r in rows] == ["1", "2"] and all(r["ok"] == "true" for r in rows), rows
assert all(float(r["decode_tokens_per_s"]) > 0 and r["git_commit"] for r in rows), rows
' <"$tmp/out" >"$tmp/py.err" 2>&1 || { fail "$desc: bad CSV"; sed 's/^/    /' "$tmp/py.err"; }
fi
# --plot: an SVG with gnuplot, else a clear message (and exit 1); DPSHARD_GNUPLOT hides it.
run bench sweep --preset tiny --data-parallel-size 2 -p 8 -n 4 -b 1,2 -r 1 \
	--configs "1,1,1,1;2,2,2,2" --plot "$tmp/sweep.svg"
if command -v gnuplot >/dev/null 2>&1; then
	expect_rc 0 && { grep -q "<svg" "$tmp/sweep.svg" 2>/dev/null || fail "$desc: no SVG"; }
else
	fail "$desc: gnuplot is needed to check --plot (Debian: gnuplot-nox)"
fi
DPSHARD_GNUPLOT=/nonexistent/gnuplot
export DPSHARD_GNUPLOT
run bench decode --preset tiny -p 8 -n 4 -b 1,2 -r 1 --plot "$tmp/decode.svg"
unset DPSHARD_GNUPLOT
expect_rc 1
grep -q "gnuplot is not installed" "$tmp/err" || fail "$desc: no clear message without gnuplot"
grep -q '^| tiny-seed0 ' "$tmp/out" || fail "$desc: the results must still be printed"
unset XDG_CACHE_HOME
run bench decode -b 0
expect_rc 2
run bench decode --model "$tmp/nothing-here"
expect_rc 1
grep -q "config.json" "$tmp/err" || fail "$desc: the message does not name config.json"

# ---- generate stops at the model's EOS ---------------------------------------------------
# A copy of the tiny preset whose config names as EOS the token greedy decoding produces
# at some step of a seeded sampled run: the same run must end just before it.

run mkmodel --preset tiny --out "$tmp/eos" --seed 3
expect_rc 0
run generate --model "$tmp/eos" -n 24 --prompt-ids "1 7" --temperature 1 --seed 4
if expect_rc 0; then
	cp "$tmp/out" "$tmp/eos-full"
	if python3 -c '
import json, sys
ids = open(sys.argv[1]).read().split()
# the first generated id (after the prompt 7) not seen before, as EOS; print where it stops
for i in range(2, len(ids)):
    if ids[i] not in ids[:i] and ids[i] not in ("0", "1"):
        c = json.load(open(sys.argv[2]))
        c["eos_token_id"] = int(ids[i])
        json.dump(c, open(sys.argv[2], "w"))
        print(" ".join(ids[:i]))
        sys.exit(0)
sys.exit(1)
' "$tmp/eos-full" "$tmp/eos/config.json" >"$tmp/eos-want"; then
		run generate --model "$tmp/eos" -n 24 --prompt-ids "1 7" --temperature 1 --seed 4
		expect_rc 0
		cmp -s "$tmp/out" "$tmp/eos-want" || { fail "$desc: did not stop before the EOS id"; show stdout "$tmp/out"; }
		# The same id named only in generation_config.json (as a list): the same stop.
		python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
json.dump({"eos_token_id": [2, c["eos_token_id"]]}, open(sys.argv[2], "w"))
c["eos_token_id"] = 2
json.dump(c, open(sys.argv[1], "w"))' "$tmp/eos/config.json" "$tmp/eos/generation_config.json"
		run generate --model "$tmp/eos" -n 24 --prompt-ids "1 7" --temperature 1 --seed 4
		expect_rc 0
		cmp -s "$tmp/out" "$tmp/eos-want" ||
			{ fail "$desc: did not stop at generation_config.json's eos_token_id"; show stdout "$tmp/out"; }
	else
		fail "$desc: no new id in the sampled output to make EOS"
	fi
fi

# ---- --config FILE ---------------------------------------------------------------------
# Flags from a YAML-style file; the command line overrides them; bad files name the line.

cat >"$tmp/gen.yaml" <<EOF
# generate across two ranks
tensor_parallel_size: 2
steps: 12      # -n
prompt-ids: true
ids: "true"
EOF
run generate --config "$tmp/gen.yaml" --verbose "1 5 9"
if expect_rc 0; then
	[ "$(wc -w <"$tmp/out")" -eq 12 ] || { fail "$desc: want 12 ids (steps: 12)"; show stdout "$tmp/out"; }
	grep -q "rank 1 (DP 0, TP 1)" "$tmp/err" || fail "$desc: tensor_parallel_size: 2 was not applied"
fi
run generate --config "$tmp/gen.yaml" -n 6 --tensor-parallel-size 1 "1 5 9"
if expect_rc 0; then
	[ "$(wc -w <"$tmp/out")" -eq 6 ] || { fail "$desc: -n 6 did not override steps: 12"; show stdout "$tmp/out"; }
fi
printf 'steps: 12\nbogus: 1\n' >"$tmp/bad.yaml"
run generate --config "$tmp/bad.yaml"
expect_rc 2
grep -q "bad.yaml line 2: unknown key 'bogus'" "$tmp/err" || fail "$desc: the message does not name the line and key"
printf 'steps: many\n' >"$tmp/bad.yaml"
run generate --config "$tmp/bad.yaml"
expect_rc 2
grep -q "line 1" "$tmp/err" || fail "$desc: the message does not name the line"
run generate --config "$tmp/nothing.yaml"
expect_rc 2
run generate --help
grep -q -- "--config FILE" "$tmp/out" || fail "$desc: --help does not describe --config"

# ---- mixture-of-experts models on one rank ----------------------------------------------
run mkmodel --preset tiny-moe --out "$tmp/moe" --seed 1
expect_rc 0
run generate --model "$tmp/moe" -n 12 --prompt-ids "1 5 9"
if expect_rc 0; then
	[ "$(wc -w <"$tmp/out")" -eq 12 ] || { fail "$desc: want 12 ids"; show stdout "$tmp/out"; }
fi
# Sampled (a greedy random model repeats its last token): the ids depend on every logit.
run generate --model "$tmp/moe" -n 16 --temperature 1 --seed 5 --prompt-ids "1 5 9"
expect_rc 0
cp "$tmp/out" "$tmp/moe-one"
# Across ranks, with and without expert parallelism, both dispatches, and disaggregated (EP on
# the decode side; the sampler's state travels with the hand-off): the one-rank ids.
for layout in "--tensor-parallel-size 2" \
	"--tensor-parallel-size 2 --data-parallel-size 2 --enable-expert-parallel" \
	"--data-parallel-size 4 --enable-expert-parallel --all2all-backend alltoallv --mlp-dp-size 2" \
	"--data-parallel-size 2 --enable-expert-parallel --attention-dp-size 2 --prefill-data-parallel-size 1 --prefill-tensor-parallel-size 2"; do
	# shellcheck disable=SC2086 # the layout is a list of flags
	run generate --model "$tmp/moe" -n 16 --temperature 1 --seed 5 --prompt-ids $layout "1 5 9"
	if expect_rc 0; then
		cmp -s "$tmp/out" "$tmp/moe-one" ||
			{ fail "$desc: ids differ from one rank's"; show stdout "$tmp/out"; }
	fi
done
# BF16 kept as BF16 (--dtype): a BF16 checkpoint's sampled ids (they depend on every logit)
# with its weights widened to f32 on one rank are those of BF16 weights on one rank and across
# ranks (TP, DP with a component size, EP), and an unknown type is refused by name.
run mkmodel --preset tiny-moe --dtype bf16 --out "$tmp/moe16" --seed 3
run generate --model "$tmp/moe16" -n 16 --temperature 1 --seed 5 --prompt-ids --dtype f32 "1 5 9"
expect_rc 0
cp "$tmp/out" "$tmp/moe16-f32"
for layout in "--dtype bf16" "--tensor-parallel-size 2" \
	"--tensor-parallel-size 2 --data-parallel-size 2 --mlp-dp-size 2" \
	"--data-parallel-size 2 --enable-expert-parallel --dtype bf16"; do
	# shellcheck disable=SC2086 # the layout is a list of flags
	run generate --model "$tmp/moe16" -n 16 --temperature 1 --seed 5 --prompt-ids $layout "1 5 9"
	if expect_rc 0; then
		cmp -s "$tmp/out" "$tmp/moe16-f32" ||
			{ fail "$desc: BF16 ids differ from the widened f32 ones"; show stdout "$tmp/out"; }
	fi
done
run generate --model "$tmp/moe16" --prompt-ids --dtype f64 "5 9"
expect_rc 2
grep -q "dtype" "$tmp/err" || fail "$desc: the refusal does not name --dtype"
# Every rule of expert parallelism, refused with its reason.
run generate --model "$tmp/moe" --prompt-ids --data-parallel-size 2 --enable-expert-parallel \
	--mlp-dp-size 2 "5 9"
expect_rc 2
grep -q "gather them again" "$tmp/err" || fail "$desc: the refusal does not say why"
run generate --model "$tmp/moe" --prompt-ids --data-parallel-size 2 --all2all-backend alltoallv "5 9"
expect_rc 2
grep -q "needs --enable-expert-parallel" "$tmp/err" || fail "$desc: the refusal does not say why"
run generate --model "$tmp/moe" --prompt-ids --tensor-parallel-size 3 --enable-expert-parallel "5 9"
expect_rc 2
grep -q "8 does not divide by 3" "$tmp/err" || fail "$desc: the refusal does not say why"
run generate --model "$tmp/moe" --prompt-ids --enable-expert-parallel --all2all-backend deepep "5 9"
expect_rc 2
grep -q "choose one of allgather_reducescatter|alltoallv" "$tmp/err" ||
	fail "$desc: the refusal does not list the backends"
run mkmodel --preset tiny --out "$tmp/dense" --seed 1
run generate --model "$tmp/dense" --prompt-ids --data-parallel-size 2 --enable-expert-parallel "5 9"
expect_rc 2
grep -q "no experts" "$tmp/err" || fail "$desc: the refusal does not say why"

# ---- Eagle3 speculative decoding --------------------------------------------------------
run mkmodel --preset tiny-gqa --out "$tmp/gqa" --seed 3
expect_rc 0
run mkmodel --draft-for "$tmp/gqa" --out "$tmp/gqa-draft"
expect_rc 0
grep -q LlamaForCausalLMEagle3 "$tmp/gqa-draft/config.json" ||
	fail "$desc: the draft's config.json does not name LlamaForCausalLMEagle3"
run mkmodel --draft-for "$tmp/gqa" --draft-kind random --draft-vocab 200 --out "$tmp/gqa-rand"
expect_rc 0
run generate --model "$tmp/gqa" -n 40 --ids --prompt-ids "1 5 9" "1 200 7 7 3" "1 42"
expect_rc 0
cp "$tmp/out" "$tmp/gqa-plain"
# Greedy output does not change with a draft, whatever the layout, K and draft.
for spec in "--speculative-model $tmp/gqa-draft --num-speculative-tokens 3" \
	"--speculative-model $tmp/gqa-draft --num-speculative-tokens 5 --data-parallel-size 2 --draft-mlp-dp-size 2" \
	"--speculative-model $tmp/gqa-rand --num-speculative-tokens 2 --tensor-parallel-size 2"; do
	# shellcheck disable=SC2086 # a list of flags
	run generate --model "$tmp/gqa" -n 40 --ids --verbose $spec --prompt-ids "1 5 9" \
		"1 200 7 7 3" "1 42"
	if expect_rc 0; then
		cmp -s "$tmp/out" "$tmp/gqa-plain" ||
			{ fail "$desc: ids differ from those without a draft"; show stdout "$tmp/out"; }
		grep -q "drafted tokens accepted" "$tmp/err" ||
			{ fail "$desc: --verbose does not report the acceptance"; show stderr "$tmp/err"; }
	fi
done
run generate --model "$tmp/gqa" --prompt-ids --speculative-model "$tmp/gqa-draft" "1 5"
expect_rc 2
grep -q "go together" "$tmp/err" || fail "$desc: the refusal does not say why"
run generate --model "$tmp/gqa" --prompt-ids --num-speculative-tokens 2 "1 5"
expect_rc 2
run generate --model "$tmp/gqa" --prompt-ids --speculative-model "$tmp/gqa-draft" \
	--num-speculative-tokens 16 "1 5"
expect_rc 2
# A draft of another model (hidden 64 against 48), and a target as its own draft.
run mkmodel --draft-for "$tmp/dense" --out "$tmp/dense-draft"
expect_rc 0
run generate --model "$tmp/gqa" --prompt-ids --speculative-model "$tmp/dense-draft" \
	--num-speculative-tokens 2 "1 5"
expect_rc 1
grep -q "differs from the target's" "$tmp/err" || fail "$desc: the refusal does not say why"
run generate --model "$tmp/gqa" --prompt-ids --speculative-model "$tmp/gqa" \
	--num-speculative-tokens 2 "1 5"
expect_rc 1
grep -q "not an Eagle3 draft" "$tmp/err" || fail "$desc: the refusal does not say why"
run mkmodel --draft-for "$tmp/no-such-model" --out "$tmp/x-draft"
expect_rc 1
run mkmodel --draft-for "$tmp/gqa" --draft-kind trained --out "$tmp/x-draft"
expect_rc 2
run bench decode --model "$tmp/gqa" --speculative-model "$tmp/gqa-draft" \
	--num-speculative-tokens 1,2 -p 8 -n 8 -b 1,2 -r 1 --json
if expect_rc 0; then
	[ "$(grep -c '"acceptance_rate"' "$tmp/out")" -eq 6 ] ||
		{ fail "$desc: want 6 results with an acceptance rate"; show stdout "$tmp/out"; }
fi

# ---- nothing left in /dev/shm ---------------------------------------------------------

# ---- dpshard convert and generate: stories260K against the golden outputs ------------------

# Both folders are part of the repository: without them every check below fails.
st260src=${DPSHARD_SRCDIR:-.}/models/stories260K
golden=${DPSHARD_SRCDIR:-.}/tests/golden/stories260K
[ -r "$st260src/stories260K.bin" ] && [ -r "$golden/once_upon_a_time.stdout.txt" ] ||
	fail "$st260src or $golden is missing from the source tree"
desc="generate without --model: the default model, stories260K, gives the golden text"
XDG_CACHE_HOME=$tmp/cache
export XDG_CACHE_HOME
run generate -n 64 --temperature 0 "Once upon a time"
unset XDG_CACHE_HOME
expect_rc 0
cmp -s "$tmp/out" "$golden/once_upon_a_time.stdout.txt" ||
	{ fail "$desc: output differs from the golden text"; show stdout "$tmp/out"; show stderr "$tmp/err"; }
[ ! -e "$tmp/cache" ] || fail "$desc: it wrote to the cache directory"
# A binary with no model beside it and none installed says where it looked.
if [ -n "${DPSHARD_PKGDATADIR:-}" ] && [ ! -e "$DPSHARD_PKGDATADIR/stories260K/config.json" ]; then
	mkdir -p "$tmp/alone"
	cp "$DPSHARD" "$tmp/alone/dpshard"
	desc="generate without --model, no default model anywhere"
	rc=0
	timeout 60 "$tmp/alone/dpshard" generate -n 4 "Once" >"$tmp/out" 2>"$tmp/err" </dev/null || rc=$?
	expect_rc 1 && { grep -q "data/stories260K beside the binary" "$tmp/err" &&
		grep -q -- "--model DIR" "$tmp/err" ||
		{ fail "$desc: the message does not say where it looked"; show stderr "$tmp/err"; }; }
	rm -rf "$tmp/alone"
elif [ -n "${DPSHARD_PKGDATADIR:-}" ]; then
	echo "note: stories260K is installed in $DPSHARD_PKGDATADIR; the no-default-model message is not checked"
else
	echo "note: DPSHARD_PKGDATADIR is not set (make check sets it); the no-default-model message is not checked"
fi
desc="convert llama2c stories260K"
run convert llama2c "$st260src/stories260K.bin" "$st260src/tok512.bin" "$tmp/st260"
expect_rc 0
cmp -s "$tmp/st260/model.safetensors" "${DPSHARD_BUILDDIR:-.}/data/stories260K/model.safetensors" ||
	fail "$desc: the build tree's default model is not the converted stories260K"
# convert gguf: the GGUF file read back by a reader written from the format's specification,
# element by element against the checkpoint (and a corrupted element caught); refusals.
gguf_check=${DPSHARD_SRCDIR:-.}/tests/gguf_check.py
run mkmodel --preset tiny-gqa --out "$tmp/gguf-gqa"
for m in "$tmp/st260" "$tmp/gguf-gqa"; do
	desc="convert gguf $m"
	run convert gguf "$m" "$tmp/m.gguf"
	expect_rc 0 || continue
	python3 "$gguf_check" "$tmp/m.gguf" "$m" >"$tmp/py.err" 2>&1 ||
		{ fail "$desc: the GGUF file does not match the model"; cat "$tmp/py.err"; }
	if [ "$m" = "$tmp/gguf-gqa" ]; then
		# The checker can fail: one element changed is reported as a mismatch (exit 3).
		python3 "$gguf_check" --corrupt "$tmp/m.gguf" "$m" >"$tmp/py.err" 2>&1
		[ $? -eq 3 ] || { fail "gguf_check.py: a corrupted element was not reported"; cat "$tmp/py.err"; }
	fi
	rm -f "$tmp/m.gguf"
done
run convert gguf "$tmp/st260" "$tmp/x.gguf" --dtype bf16
expect_rc 2 && { [ ! -e "$tmp/x.gguf" ] || fail "$desc: a refused export wrote a file"; }
run mkmodel --preset tiny-moe --out "$tmp/gguf-moe"
run convert gguf "$tmp/gguf-moe" "$tmp/moe.gguf"
expect_rc 2 && { grep -q "mixture-of-experts" "$tmp/err" || fail "$desc: the refusal does not name MoE"; }
[ ! -e "$tmp/moe.gguf" ] || fail "$desc: a refused export left a file"
run convert gguf "$tmp/nothing-here" "$tmp/x.gguf"
expect_rc 1 && { grep -q "config.json" "$tmp/err" || fail "$desc: the message does not name config.json"; }
rm -rf "$tmp/gguf-moe" "$tmp/gguf-gqa"
desc="generate, empty prompt, 256 steps"
run generate --model "$tmp/st260"
expect_rc 0
cmp -s "$tmp/out" "$golden/empty_prompt_n256.stdout.txt" ||
	{ fail "$desc: output differs from the golden text"; show stdout "$tmp/out"; }
desc="generate -n 64 \"Once upon a time\""
run generate --model "$tmp/st260" -n 64 "Once upon a time"
expect_rc 0
cmp -s "$tmp/out" "$golden/once_upon_a_time.stdout.txt" ||
	{ fail "$desc: output differs from the golden text"; show stdout "$tmp/out"; }
# With a self-distilled Eagle3 draft across ranks: still the golden text.
run mkmodel --draft-for "$tmp/st260" --out "$tmp/st260-draft"
expect_rc 0
run generate --model "$tmp/st260" -n 64 --speculative-model "$tmp/st260-draft" \
	--num-speculative-tokens 3 --data-parallel-size 2 --draft-mlp-dp-size 2 \
	"Once upon a time"
expect_rc 0
cmp -s "$tmp/out" "$golden/once_upon_a_time.stdout.txt" ||
	{ fail "$desc: output differs from the golden text"; show stdout "$tmp/out"; }
# Disaggregated, the draft's KV travelling with the target's: still the golden text.
run generate --model "$tmp/st260" -n 64 --speculative-model "$tmp/st260-draft" \
	--num-speculative-tokens 3 --data-parallel-size 2 --draft-mlp-dp-size 2 \
	--attention-dp-size 2 --prefill-data-parallel-size 1 "Once upon a time"
expect_rc 0
cmp -s "$tmp/out" "$golden/once_upon_a_time.stdout.txt" ||
	{ fail "$desc: output differs from the golden text"; show stdout "$tmp/out"; show stderr "$tmp/err"; }
desc="generate --ids"
# Across ranks: every layout prints the golden text (TP, DP with the MLP sharded, mixed
# component sizes, and the references' 32-rank example on these 2 cores).
for layout in "--tensor-parallel-size 2" \
	"--data-parallel-size 2 --mlp-dp-size 2 --attention-dp-size 2" \
	"--tensor-parallel-size 2 --data-parallel-size 4 --attention-dp-size 2 --embedding-dp-size 4 --mlp-dp-size 4 --lm-head-dp-size 2" \
	"--tensor-parallel-size 8 --data-parallel-size 4 --embedding-dp-size 4 --mlp-dp-size 4 --lm-head-dp-size 4" \
	"--data-parallel-size 2 --attention-dp-size 2 --embedding-dp-size 2 --lm-head-dp-size 2 --prefill-data-parallel-size 1 --prefill-tensor-parallel-size 2" \
	"--tensor-parallel-size 8 --data-parallel-size 4 --embedding-dp-size 4 --mlp-dp-size 4 --lm-head-dp-size 4 --prefill-data-parallel-size 2 --prefill-tensor-parallel-size 8"; do
	# shellcheck disable=SC2086 # the layout is a list of flags
	run generate --model "$tmp/st260" -n 64 $layout "Once upon a time"
	expect_rc 0
	cmp -s "$tmp/out" "$golden/once_upon_a_time.stdout.txt" ||
		{ fail "$desc: output differs from the golden text"; show stdout "$tmp/out"; show stderr "$tmp/err"; }
done
# Across nodes without mpirun (one process hosting every node, each with its own shared
# memory; groups that cross nodes exchange through the proxy's rounds): the golden text.
for n in 2 4; do
	run generate --model "$tmp/st260" -n 64 --tensor-parallel-size 8 --data-parallel-size 4 \
		--embedding-dp-size 4 --mlp-dp-size 4 --lm-head-dp-size 4 --nodes "$n" "Once upon a time"
	expect_rc 0
	cmp -s "$tmp/out" "$golden/once_upon_a_time.stdout.txt" ||
		{ fail "$desc: --nodes $n: output differs from the golden text"; show stderr "$tmp/err"; }
done
# Disaggregated across nodes: the prefill replicas on node 1, the decode ranks pulling their KV
# through the nodes' proxies (the references' 48-rank layout).
run generate --model "$tmp/st260" -n 64 --tensor-parallel-size 8 --data-parallel-size 4 \
	--embedding-dp-size 4 --mlp-dp-size 4 --lm-head-dp-size 4 --prefill-data-parallel-size 2 \
	--prefill-tensor-parallel-size 8 --nodes 2 "Once upon a time"
expect_rc 0
cmp -s "$tmp/out" "$golden/once_upon_a_time.stdout.txt" ||
	{ fail "$desc: disaggregated across nodes: not the golden text"; show stderr "$tmp/err"; }
# TP groups across two nodes each: the replica's batch goes through the exchange too.
run generate --model "$tmp/st260" -n 64 --tensor-parallel-size 4 --data-parallel-size 2 --nodes 4 \
	"Once upon a time"
expect_rc 0
cmp -s "$tmp/out" "$golden/once_upon_a_time.stdout.txt" ||
	{ fail "$desc: TP across nodes: output differs from the golden text"; show stderr "$tmp/err"; }
run generate --model "$tmp/st260" --tensor-parallel-size 2 --data-parallel-size 2 --mlp-dp-size 2
expect_rc 0
cmp -s "$tmp/out" "$golden/empty_prompt_n256.stdout.txt" ||
	{ fail "$desc: output differs from the golden text"; show stdout "$tmp/out"; }
# Two prompts on two replicas: each completion under its prompt.
run generate --model "$tmp/st260" -n 64 --data-parallel-size 2 --verbose "Once upon a time" "Lily"
if expect_rc 0; then
	grep -q '^\[prompt 2\] Lily$' "$tmp/out" || fail "$desc: no heading for prompt 2"
	head -n 1 "$tmp/out" | grep -q '^\[prompt 1\] Once upon a time$' || fail "$desc: no heading for prompt 1"
	grep -q "rank 1 (DP 1, TP 0): .* MB of weights" "$tmp/err" || fail "$desc: --verbose does not report the shard bytes"
fi
# generate --requests: JSON lines in, one JSON result per request out, in input order.
cat >"$tmp/reqs.jsonl" <<EOF
{"prompt": "Once upon a time", "max_tokens": 20}
{"prompt": "Lily", "max_tokens": 10, "temperature": 0.8, "seed": 3}

{"prompt_ids": [1, 403, 407], "max_tokens": 5, "replica": 1}
EOF
run generate --model "$tmp/st260" --requests "$tmp/reqs.jsonl" --data-parallel-size 2
if expect_rc 0; then
	python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
gold = open(sys.argv[2]).read().split("generated_ids:")[1].split()
assert [r["index"] for r in rows] == [0, 1, 2], rows
assert [r["completion_tokens"] for r in rows] == [20, 10, 5], rows
assert all(r["finish_reason"] == "length" for r in rows), rows
assert rows[0]["token_ids"] == [int(x) for x in gold[:20]], (rows[0], gold[:20])
assert rows[0]["text"].startswith(", there was a little girl"), rows[0]
' "$tmp/out" "$golden/once_upon_a_time.ids.txt" >"$tmp/py.err" 2>&1 ||
		{ fail "$desc: wrong results"; sed 's/^/    /' "$tmp/py.err"; show stdout "$tmp/out"; }
fi
# Each request its own max_tokens, not -n's 256, within --max-model-len; finish reasons true:
# "length" at max_tokens or at the context, "stop" only at a stop id.
stop_id=$(sed -n 's/^generated_ids: //p' "$golden/once_upon_a_time.ids.txt" | cut -d' ' -f6)
cat >"$tmp/long.jsonl" <<EOF
{"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": true}
{"prompt": "Lily", "max_tokens": 600, "ignore_eos": true}
{"prompt": "Once upon a time", "max_tokens": 300, "stop_ids": [$stop_id]}
EOF
run generate --model "$tmp/st260" --requests "$tmp/long.jsonl" --max-model-len 512
if expect_rc 0; then
	python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
got = [(r["finish_reason"], r["completion_tokens"], len(r["token_ids"])) for r in rows]
rest = 512 - rows[1]["prompt_tokens"]
assert got[0] == ("length", 300, 300), got
assert got[1] == ("length", rest, rest), got
assert got[2][0] == "stop" and got[2][1] == got[2][2] and got[2][1] < 6, got
assert rows[2]["token_ids"] == rows[0]["token_ids"][:got[2][1]], rows[2]
' "$tmp/out" >"$tmp/py.err" 2>&1 ||
		{ fail "$desc: max_tokens or finish reasons wrong"; sed 's/^/    /' "$tmp/py.err"; }
fi
printf '{"prompt": "ok"}\n{"prompt": 5}\n{"bogus": 1}\n' >"$tmp/bad.jsonl"
run generate --model "$tmp/st260" --requests "$tmp/bad.jsonl"
expect_rc 2
grep -q 'bad.jsonl line 2: "prompt" must be a string' "$tmp/err" &&
	grep -q 'bad.jsonl line 3: unknown field "bogus"' "$tmp/err" ||
	{ fail "$desc: every bad line must be named"; show stderr "$tmp/err"; }
run generate --model "$tmp/st260" --data-parallel-size 4 --attention-dp-size 3
expect_rc 2
grep -q -- "--attention-dp-size 3" "$tmp/err" || fail "$desc: the message does not name the flag"
run generate --model "$tmp/st260" --tensor-parallel-size 4 --data-parallel-size 4 --attention-dp-size 4
expect_rc 2
grep -q "query heads" "$tmp/err" || fail "$desc: the message does not explain the heads rule"
run generate --model "$tmp/st260" -n 64 --ids "Once upon a time"
expect_rc 0
want=$(sed -n 's/^all_ids[^:]*: //p' "$golden/once_upon_a_time.ids.txt" |
	cut -d' ' -f2-)
[ "$(cat "$tmp/out")" = "$want" ] || fail "$desc: ids differ from the golden ids"
desc="generate with a seed is reproducible"
run generate --model "$tmp/st260" -n 30 --temperature 1.0 --seed 5 "Lily"
cp "$tmp/out" "$tmp/sampled1"
run generate --model "$tmp/st260" -n 30 --temperature 1.0 --seed 5 "Lily"
cmp -s "$tmp/out" "$tmp/sampled1" || fail "$desc: two runs with --seed 5 differ"
run generate --model "$tmp/st260" --temperature nan
expect_rc 2
desc="tokenize and detokenize"
# The golden prompt's ids (tests/golden/stories260K), with and without BOS, and back.
want=$(sed -n 's/^prompt_ids: //p' "$golden/once_upon_a_time.ids.txt")
run tokenize --model "$tmp/st260" "Once upon a time"
[ "$(cat "$tmp/out")" = "$want" ] || fail "$desc: ids differ from the golden prompt's"
run tokenize --model "$tmp/st260" --no-special "Once upon a time"
[ "$(cat "$tmp/out")" = "${want#1 }" ] || fail "$desc: --no-special kept BOS"
# shellcheck disable=SC2086 # the ids are separate arguments
run detokenize --model "$tmp/st260" ${want#1 }
[ "$(cat "$tmp/out")" = " Once upon a time" ] || { fail "$desc: detokenize"; show stdout "$tmp/out"; }
run detokenize --model "$tmp/st260" "1 403,407"
expect_rc 0
run detokenize --model "$tmp/st260" 1 99999
expect_rc 2
grep -q "below 512" "$tmp/err" || fail "$desc: an id outside the vocabulary is not named"
run tokenize --model "$tmp/st260" --chat "Hi"
expect_rc 1
grep -q "chat" "$tmp/err" || fail "$desc: --chat without a template does not say why"
run tokenize --model "$tmp/eos" "Hi"
expect_rc 1
grep -q "no tokenizer" "$tmp/err" || fail "$desc: a model without a tokenizer is not named"
run bench tokenize --model "$tmp/st260" -r 1 --write-text "$tmp"
if expect_rc 0; then
	grep -q '^| 1 MiB prompt | 1048576 |' "$tmp/out" || { fail "bench tokenize: no 1 MiB row"; show stdout "$tmp/out"; }
	[ "$(wc -c <"$tmp/prompt-1m.txt")" -eq 1048576 ] || fail "bench tokenize: --write-text"
fi
desc="generate with a missing model"
run generate --model "$tmp/nothing-here"
expect_rc 1
grep -q "config.json" "$tmp/err" || fail "$desc: the message does not name config.json"

shm_list >"$tmp/shm.after"
comm -13 "$tmp/shm.before" "$tmp/shm.after" >"$tmp/shm.new"
if [ -s "$tmp/shm.new" ]; then
	# Other programs (a parallel `make check`) create short-lived entries: count only the
	# ones still there a moment later.
	sleep 2
	shm_list | comm -12 "$tmp/shm.new" - >"$tmp/shm.kept"
	mv "$tmp/shm.kept" "$tmp/shm.new"
fi
while read -r entry; do
	owner=$(echo "$entry" | sed -n 's/^dpshard-\([0-9][0-9]*\)-.*/\1/p')
	case " $pids " in
	*" $owner "*)
		fail "/dev/shm/$entry was left behind by dpshard process $owner of this script" ;;
	*)
		# Not ours: another test or another program on a shared machine (whose processes may
		# live in another pid namespace). Their cleanup is their own tests' business.
		echo "note: /dev/shm/$entry appeared during the run; its process $owner is not one of ours" ;;
	esac
done <"$tmp/shm.new"

if [ "$failures" -ne 0 ]; then
	echo "cli.sh: $failures check(s) failed"
	exit 1
fi
echo "cli.sh: all checks passed"
exit 0

#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/xnode.sh - dpshard across nodes over Open MPI: several processes on this machine, each
# one node's supervisor with its own shared memory and its own ranks, sharing nothing but MPI.
#  - the collectives of groups that cross nodes against the serial oracle (tests/xnode_check.c)
#    on 2 and 4 nodes;
#  - `dpshard generate` with the references' TP=8 x DP=4 layout as 2 nodes of 16 ranks and 4 of
#    8 (the golden text), TP groups across nodes, disaggregated prefill with the prefill
#    replicas on other nodes than the decode ones, replicas coupled across nodes, and the MoE
#    with expert parallelism (the EP group spans the nodes), against one node's output;
#  - a rank hung on node 1, found by node 0 (--rank-timeout), and a node's supervisor killed
#    (kill -9) while `dpshard serve` has requests in flight: node 0 answers them with an error
#    within 10 s, the job exits non-zero, no process or segment is left.
# Skips (exit 77) when Open MPI was not found at configure time, unless the oracles are
# required (DPSHARD_REQUIRE_ORACLES, as CI sets), when it fails instead.
set -u
here=$(dirname "$0")
bin=$here/xnode_check
dps=${DPSHARD:-$here/../dpshard}
golden=${DPSHARD_SRCDIR:-.}/tests/golden/stories260K
model=${DPSHARD_BUILDDIR:-.}/data/stories260K
if [ ! -x "$bin" ] || ! command -v mpirun >/dev/null; then
	echo "xnode.sh: skip: Open MPI not found (apt-get install openmpi-bin libopenmpi-dev," \
		"then configure again)"
	[ -n "${DPSHARD_REQUIRE_ORACLES:-}" ] && exit 1
	exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/xnode-test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
rc=0
fail() {
	echo "xnode.sh: FAIL: $*"
	rc=1
}
# --oversubscribe: more processes than cores; vader: shared memory between the processes,
# which is only MPI's own transport: the nodes have nothing else in common.
mpi() {
	n=$1
	shift
	timeout 300 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader \
		-x DPSHARD_FAULT -np "$n" "$@"
}
export DPSHARD_FAULT=

for n in 2 4; do
	mpi "$n" "$bin" || fail "the collectives across $n nodes"
done

# The references' layout, 32 ranks, on 2 and 4 nodes: the golden text.
for n in 2 4; do
	for layout in "--tensor-parallel-size 8 --data-parallel-size 4" \
		"--tensor-parallel-size 8 --data-parallel-size 4 --embedding-dp-size 4 --mlp-dp-size 4 --lm-head-dp-size 4"; do
		# shellcheck disable=SC2086 # the layout is a list of flags
		mpi "$n" "$dps" generate --model "$model" -n 64 $layout --nodes "$n" \
			"Once upon a time" >"$tmp/out" 2>"$tmp/err" ||
			{ fail "generate $layout on $n nodes exited $?"; cat "$tmp/err"; }
		cmp -s "$tmp/out" "$golden/once_upon_a_time.stdout.txt" ||
			fail "generate $layout on $n nodes: not the golden text"
	done
done

# Disaggregated prefill across nodes: the decode ranks pull the prefill ranks' KV from another
# node (their proxies copy the blocks between the nodes' KV shares); the references' layout
# with two prefill replicas of TP=8 as 2 nodes of 24 ranks. The golden text.
for case in "2 --data-parallel-size 2 --attention-dp-size 2 --embedding-dp-size 2 --lm-head-dp-size 2 --prefill-data-parallel-size 1 --prefill-tensor-parallel-size 2" \
	"4 --data-parallel-size 2 --attention-dp-size 2 --embedding-dp-size 2 --lm-head-dp-size 2 --prefill-data-parallel-size 1 --prefill-tensor-parallel-size 2" \
	"2 --tensor-parallel-size 8 --data-parallel-size 4 --embedding-dp-size 4 --mlp-dp-size 4 --lm-head-dp-size 4 --prefill-data-parallel-size 2 --prefill-tensor-parallel-size 8"; do
	n=${case%% *}
	# shellcheck disable=SC2086
	mpi "$n" "$dps" generate --model "$model" -n 64 ${case#* } --nodes "$n" \
		"Once upon a time" >"$tmp/out" 2>"$tmp/err" ||
		{ fail "disaggregated on $n nodes exited $?"; cat "$tmp/err"; }
	cmp -s "$tmp/out" "$golden/once_upon_a_time.stdout.txt" ||
		fail "disaggregated on $n nodes (${case#* }): not the golden text"
done

# Four prompts on four replicas, coupled by attention DP (their lockstep crosses nodes): the
# same text as on one node.
layout="--tensor-parallel-size 2 --data-parallel-size 4 --attention-dp-size 2 --mlp-dp-size 4"
# shellcheck disable=SC2086
"$dps" generate --model "$model" -n 40 $layout "Once upon a time" "Lily" "The cat" "A dog" \
	>"$tmp/one" 2>"$tmp/err" || fail "generate on one node"
for n in 2 4; do
	# shellcheck disable=SC2086
	mpi "$n" "$dps" generate --model "$model" -n 40 $layout --nodes "$n" "Once upon a time" \
		"Lily" "The cat" "A dog" >"$tmp/out" 2>"$tmp/err" || fail "coupled on $n nodes"
	cmp -s "$tmp/out" "$tmp/one" || fail "coupled replicas on $n nodes: not one node's text"
done

# MoE, experts over every rank of every node (both dispatches): one rank's sampled ids.
"$dps" mkmodel --preset tiny-moe --out "$tmp/moe" --seed 1 >/dev/null 2>&1 || fail "mkmodel"
"$dps" generate --model "$tmp/moe" -n 16 --temperature 1 --seed 5 --prompt-ids "1 5 9" \
	>"$tmp/moe-one" 2>/dev/null || fail "MoE on one rank"
for layout in "--tensor-parallel-size 2 --data-parallel-size 2 --enable-expert-parallel" \
	"--data-parallel-size 4 --enable-expert-parallel --all2all-backend alltoallv --mlp-dp-size 2"; do
	for n in 2 4; do # (on 4 nodes the first layout's TP groups cross nodes too)
		# shellcheck disable=SC2086
		mpi "$n" "$dps" generate --model "$tmp/moe" -n 16 --temperature 1 --seed 5 \
			--prompt-ids $layout --nodes "$n" "1 5 9" >"$tmp/out" 2>"$tmp/err" ||
			fail "MoE $layout on $n nodes"
		cmp -s "$tmp/out" "$tmp/moe-one" || fail "MoE $layout on $n nodes: not one rank's ids"
	done
done

# TP groups across nodes (TP=4 on nodes of 2 ranks): the golden text.
mpi 4 "$dps" generate --model "$model" -n 64 --tensor-parallel-size 4 --data-parallel-size 2 \
	--mlp-dp-size 2 --nodes 4 "Once upon a time" >"$tmp/out" 2>"$tmp/err" ||
	{ fail "TP across nodes exited $?"; cat "$tmp/err"; }
cmp -s "$tmp/out" "$golden/once_upon_a_time.stdout.txt" || fail "TP across nodes: not the golden text"

# Refused by name: mpirun with another number of processes.
mpi 2 "$dps" generate --model "$model" -n 8 --data-parallel-size 4 --nodes 4 "Once" \
	>/dev/null 2>"$tmp/err" && fail "--nodes 4 ran as 2 processes"
grep -q 'mpirun started 2 processes' "$tmp/err" || fail "no reason for the process count"

# Nodes started with different options would place the rounds' bytes differently: refused.
timeout 120 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader \
	-np 1 "$dps" bench coll --ranks 4 --nodes 2 --max-bytes 4K --repeats 3 : \
	-np 1 "$dps" bench coll --ranks 4 --nodes 2 --max-bytes 4K --repeats 3 --slot-bytes 512K \
	>/dev/null 2>"$tmp/err" && fail "nodes with different slot sizes ran"
grep -q 'different layouts or options' "$tmp/err" || fail "no reason for differing nodes"

# A rank on node 1 hangs (spins without a heartbeat) with work pending: node 0 names it.
DPSHARD_FAULT=spin:2:3 mpi 2 "$dps" generate --model "$model" -n 100 --data-parallel-size 4 \
	--nodes 2 --rank-timeout 2 "Once upon a time" "Lily" "The cat" "A dog" >/dev/null \
	2>"$tmp/err" && fail "a hung rank on node 1 went unnoticed"
grep -q 'rank 2 (DP 2, TP 0), on node 1, made no progress .* it is hung' "$tmp/err" ||
	{ fail "the hung rank on node 1 was not named"; cat "$tmp/err"; }

# serve on 2 nodes; replica 2 (node 1) blocks at its 4th step, so its request stays in flight;
# then node 1's supervisor is killed.
sock=$tmp/s.sock
DPSHARD_FAULT=wait:2:3 mpi 2 "$dps" serve --model "$model" --data-parallel-size 4 --nodes 2 \
	--unix-socket "$sock" >"$tmp/serve.out" 2>&1 &
job=$!
python3 - "$sock" "$tmp" "$job" <<'EOF' || fail "a killed node: see above"
import json, os, signal, socket, subprocess, sys, threading, time
sock, tmp, job = sys.argv[1], sys.argv[2], int(sys.argv[3])

def req(path, body=None):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(sock)
    data = json.dumps(body).encode() if body is not None else b""
    m = "POST" if body is not None else "GET"
    s.sendall(f"{m} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
    return out.decode(errors="replace")

for _ in range(300):
    try:
        if "ready" in req("/health"):
            break
    except OSError:
        pass
    time.sleep(0.1)
else:
    sys.exit("xnode.sh: serve on 2 nodes never became ready")
results = {}
def one(i):
    try:
        results[i] = (req("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 200,
                                              "temperature": 0}), time.time())
    except OSError as e:
        results[i] = ("connection: %s" % e, time.time())
ts = [threading.Thread(target=one, args=(i,)) for i in range(6)]
for t in ts:
    t.start()
time.sleep(2)
# the nodes' supervisors: dpshard processes whose parent is not a dpshard (mpirun); node 1's
# has MPI rank 1
node1 = None
sups = []
for p in os.listdir("/proc"):
    if not p.isdigit():
        continue
    try:
        env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
        cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
        pcmd = open(f"/proc/{ppid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    if (cmd[0].endswith(b"dpshard") and b"serve" in cmd and not pcmd[0].endswith(b"dpshard")
            and b"OMPI_COMM_WORLD_SIZE=2" in env):
        sups.append(int(p))
        if b"OMPI_COMM_WORLD_RANK=1" in env:
            node1 = int(p)
if node1 is None:
    sys.exit("xnode.sh: node 1's supervisor not found")
in_flight = [i for i in range(6) if i not in results]
if not in_flight:
    sys.exit("xnode.sh: no request was in flight on node 1's replica")
killed = time.time()
os.kill(node1, signal.SIGKILL)
for t in ts:
    t.join(30)
for i in in_flight:
    text, when = results.get(i, ("no answer", time.time()))
    if '"error"' not in text:
        sys.exit("xnode.sh: request in flight got no error: %s" % text[:300])
    if when - killed > 10:
        sys.exit("xnode.sh: its error came %.1f s after the kill" % (when - killed))
try:
    os.waitpid(job, 0)
except ChildProcessError:
    pass
left = [f for f in os.listdir("/dev/shm") for q in sups if f.startswith("dpshard-%d-" % q)]
if left:
    sys.exit("xnode.sh: segments left in /dev/shm: %s" % left)
print("xnode.sh: killed node: %d request(s) in flight answered with an error" % len(in_flight))
EOF
wait "$job"
st=$?
[ "$st" -ne 0 ] || fail "the job exited 0 after a node was killed"
grep -q 'node 1 \(stopped answering\|has not been heard from\)' "$tmp/serve.out" ||
	{ fail "node 0 did not report node 1's loss"; cat "$tmp/serve.out"; }
sleep 1
for p in /proc/[0-9]*; do
	if { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -q "unix-socket $sock"; then
		fail "a process of the killed job is left: ${p#/proc/}"
	fi
done
exit $rc

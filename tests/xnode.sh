#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/xnode.sh - the cross-node step (engine/runtime/xnode.c) over Open MPI, several
# processes on this machine acting as separate nodes: 2 and 4 nodes (tests/xnode_check.c).
# Skips (exit 77) when Open MPI was not found at configure time, unless the oracles are
# required (DPSHARD_REQUIRE_ORACLES, as CI sets), when it fails instead.
here=$(dirname "$0")
bin=$here/xnode_check
if [ ! -x "$bin" ] || ! command -v mpirun >/dev/null; then
	echo "xnode.sh: skip: Open MPI not found (apt-get install openmpi-bin libopenmpi-dev," \
		"then configure again)"
	[ -n "$DPSHARD_REQUIRE_ORACLES" ] && exit 1
	exit 77
fi
rc=0
for n in 2 4; do
	# --oversubscribe: more processes than cores; vader: shared memory between them, which
	# is only MPI's own transport: the processes have nothing else in common.
	if ! timeout 300 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader \
		-np "$n" "$bin"; then
		echo "xnode.sh: FAIL with $n nodes"
		rc=1
	fi
done
exit $rc

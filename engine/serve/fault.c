/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/fault.c - the replica loop's test-only fault injection (DPSHARD_FAULT, see
 * replica.h), which the hung-rank tests use.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/serve/replica.h"
#include "shm/wait.h"

/*
 * Test-only fault injection (docs/DESIGN.md section 5), read once at rank start: world rank
 * RANK, about to run its step number STEP (from 0), with DPSHARD_FAULT=spin:RANK:STEP spins
 * for ever without a heartbeat, as a rank stuck in a loop would; with wait:RANK:STEP it
 * blocks in a real wait on a word nobody rings (with the abort word, so it keeps its alive
 * beat and does no work), as a lost wake-up would leave it. Any other value is refused by
 * name. Returns 0 or -EINVAL.
 */
int dps_replica_fault_parse(struct replica *R)
{
	const char *f = getenv("DPSHARD_FAULT");
	long rank, step;
	char kind[8], tail;

	R->fault_spin = R->fault_wait = -1;
	if (!f || !*f)
		return 0;
	if (sscanf(f, "%7[a-z]:%ld:%ld%c", kind, &rank, &step, &tail) != 3 || rank < 0 ||
	    step < 0 || (strcmp(kind, "spin") && strcmp(kind, "wait"))) {
		fprintf(stderr, "rank %d: DPSHARD_FAULT=%s is not a fault this build injects (the "
			"ones it knows are spin:RANK:STEP and wait:RANK:STEP)\n", R->w->rank, f);
		return -EINVAL;
	}
	if (rank == R->w->rank) {
		if (!strcmp(kind, "spin"))
			R->fault_spin = step;
		else
			R->fault_wait = step;
	}
	return 0;
}

/* The wait fault: 0 when not due, else what the wait returns (-DPS_EABORT once aborted). */
int dps_replica_fault_maybe_wait(const struct replica *R)
{
	static struct dps_wword never; /* (this process's own: nobody else can ring it) */

	if (R->fault_wait < 0 || R->st.steps != (uint64_t)R->fault_wait)
		return 0;
	fprintf(stderr, "rank %d: DPSHARD_FAULT: waiting for ever at step %ld\n", R->w->rank,
		R->fault_wait);
	return dps_wword_wait(&never, 1, &R->w->ctl->abort, 0, NULL);
}

void dps_replica_fault_maybe_spin(const struct replica *R)
{
	if (R->fault_spin < 0 || R->st.steps != (uint64_t)R->fault_spin)
		return;
	fprintf(stderr, "rank %d: DPSHARD_FAULT: spinning at step %ld\n", R->w->rank,
		R->fault_spin);
	for (volatile unsigned long spin = 0;; spin++) {
		/* no heartbeat, no abort check: only SIGKILL ends this */
	}
}

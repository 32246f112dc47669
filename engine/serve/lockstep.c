/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/lockstep.c - _get_dp_padding and the dummy batch (see lockstep.h). Called by the
 * replica loop (engine/serve/replica.c) before every step of coupled replicas, and by the
 * sharded-model tests' step loop (tests/shard_loop.h).
 */
#include <string.h>

#include "engine/serve/lockstep.h"
#include "engine/shard/shard.h"

int dps_lockstep_get_dp_padding(struct dps_comm *dp_c, int dp, int dp_rank,
				const struct dps_dp_say *mine, int *scratch, struct dps_dp_plan *plan)
{
	int rc = 0;

	/* Each replica's counts in its own slot, zeros elsewhere: the sum is an all-gather. */
	memset(scratch, 0, sizeof(int) * 4 * (size_t)dp);
	scratch[4 * dp_rank] = mine->rows;
	scratch[4 * dp_rank + 1] = mine->prefill;
	scratch[4 * dp_rank + 2] = mine->unfinished;
	scratch[4 * dp_rank + 3] = mine->stop;
	memset(plan, 0, sizeof(*plan));
	if (dp_c && dp_c->n > 1) {
		rc = dps_coll_allreduce(dp_c, scratch, scratch, 4 * (size_t)dp, DPS_I32);
		plan->reduced = 1;
	}
	if (rc)
		return rc;
	plan->all_stop = 1;
	for (int d = 0; d < dp; d++) {
		plan->max_rows = scratch[4 * d] > plan->max_rows ? scratch[4 * d] : plan->max_rows;
		plan->any_prefill |= scratch[4 * d + 1];
		plan->any_work |= scratch[4 * d + 2];
		plan->all_stop &= scratch[4 * d + 3];
	}
	return 0;
}

void dps_lockstep_pad_rows(int *tokens, int *pos, int *slot, int *tix, unsigned char *want,
			   int zero_tix, int from, int to)
{
	for (int i = from; i < to; i++) {
		tokens[i] = 0;
		pos[i] = 0;
		slot[i] = DPS_PAD_SLOT;
		want[i] = 0;
		/* A padding row reads like a real row at position 0 and writes nothing. */
		tix[i] = zero_tix;
	}
}

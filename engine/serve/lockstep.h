/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/lockstep.h - replicas that step together (the data-parallelism reference's DP
 * with EP, and component sizes above 1 here). Before every step they agree with
 * _get_dp_padding (dps_lockstep_get_dp_padding): each writes its counts into its own slot of a
 * DP-sized tensor and an all-reduce (sum) over the DP group gives every replica everyone's, so
 * all take the same graph (prefill when any prefills) and decode at the largest batch; a
 * replica with fewer rows pads them, and a replica with none runs a dummy batch
 * (execute_dummy_batch) of that size, both made by dps_lockstep_pad_rows. Uncoupled replicas
 * never call either (the reference: no padding and no dummy batches without EP).
 * Called by the replica loop (replica.c) and by the tests' step loops.
 */
#ifndef DPS_ENGINE_SERVE_LOCKSTEP_H
#define DPS_ENGINE_SERVE_LOCKSTEP_H

#include "shm/coll.h"

/* What one replica says before a step. */
struct dps_dp_say {
	int rows;       /* its rows this step (a decode batch: bucket-sized) */
	int prefill;    /* it has prompt rows */
	int unfinished; /* it has work, now or queued */
	int stop;       /* it was told to stop and has nothing left */
};

/* What they agree on. */
struct dps_dp_plan {
	int max_rows;    /* the largest batch: every decode step runs this many rows */
	int any_prefill; /* the step is a prefill step */
	int any_work;    /* someone has work (else all sleep) */
	int all_stop;    /* everyone stops */
	int reduced;     /* 1 when the agreement took an all-reduce (a DP group of more than one),
			  * for the caller's count of cross-replica collectives */
};

/*
 * The reference's _get_dp_padding over the DP group dp_c (NULL or a group of one: this replica
 * alone): scratch holds 4 * dp ints. Returns 0 or the all-reduce's error (-DPS_EABORT when a
 * peer died).
 */
int dps_lockstep_get_dp_padding(struct dps_comm *dp_c, int dp, int dp_rank,
				const struct dps_dp_say *mine, int *scratch, struct dps_dp_plan *plan);

/*
 * The padding rows [from, to) of a decode batch, and with from == 0 the whole dummy batch of
 * an idle replica: token 0 at position 0 into DPS_PAD_SLOT (its KV write goes nowhere), the
 * all-zero block table zero_tix (max_model_len / block_size columns, as a real row's), never
 * sampled. The arrays are a step's rows, as the replica publishes them.
 */
void dps_lockstep_pad_rows(int *tokens, int *pos, int *slot, int *tix, unsigned char *want,
			   int zero_tix, int from, int to);

#endif

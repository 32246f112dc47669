/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/sched_adopt.c - the decode side of the disaggregated hand-off in the scheduler
 * (sched.h, dps_sched_adopt): a request prefilled on a prefill replica queued here with what it
 * sampled there and where its positions are; dps_sched_step admits it like any other, lists it
 * in the batch's pulls and decodes it from its last token.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/sched.h"

struct dps_req *dps_sched_adopt(struct dps_sched *s, uint64_t id, const int *ids, int n_ids,
				int n_prompt, const struct dps_req_params *p,
				const struct dps_rng *rng, int plp_next, uint64_t t_scheduled,
				int src_replica, const int *src, int n_src, int *rc)
{
	struct dps_req *r;
	const int need = (n_ids - 1 + s->cfg.block_size - 1) / s->cfg.block_size;

	*rc = -EINVAL;
	if (n_prompt < 1 || n_ids <= n_prompt || n_ids > s->cfg.max_model_len || n_src < need ||
	    n_src < 1 || plp_next < 1)
		return NULL;
	/* as a prompt of n_ids tokens (every check and the penalties' prompt tokens), then
	 * what it is */
	r = dps_sched_add(s, id, ids, n_ids, p, rc);
	if (!r)
		return NULL;
	r->n_prompt = n_prompt;
	for (int i = n_prompt; i < n_ids && dps_penalties_on(&p->pen); i++)
		if (dps_seen_add(&r->seen, ids[i], 1)) {
			dps_sched_cancel(s, r); /* reported (in error) by the next update */
			r->finish = DPS_FINISH_ERROR;
			return r;
		}
	r->rng = *rng;
	r->plp_next = plp_next;
	r->t_scheduled = t_scheduled;
	r->src_blocks = malloc(sizeof(int) * (size_t)n_src);
	if (!r->src_blocks) {
		dps_sched_cancel(s, r);
		r->finish = DPS_FINISH_ERROR;
		return r;
	}
	memcpy(r->src_blocks, src, sizeof(int) * (size_t)n_src);
	r->n_src = n_src;
	r->src_replica = src_replica;
	return r;
}

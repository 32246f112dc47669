/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/handoff.c - the disaggregated hand-off's copy (see shard.h, dps_shard_kv_pull):
 * a decode rank fills its cache with a sequence's positions from the prefill replica's caches
 * in the instance's KV share, head by head as the relay plan (kv.c) says. Runs on every rank
 * of the decode replica that adopts the sequence, before the sequence's first decode step.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/shard/kv.h"
#include "engine/shard/shard.h"

int dps_shard_kv_pull(struct dps_shard *s, const char *share, size_t stride, int pr, int ptp,
		      const int *src, const int *dst, int n_pos, int draft)
{
	const struct dps_model_config *c = &s->cfg;
	const int hd = s->hd, bs = s->block_size, L = c->num_hidden_layers;
	const size_t kv = (size_t)s->nkv_t * (size_t)hd;
	struct dps_kv_relay *plan = calloc((size_t)s->nkv_t + 1, sizeof(*plan));
	int n, rc = 0;

	if (!plan)
		return -ENOMEM;
	n = dps_kv_relay_plan(c->num_attention_heads, c->num_key_value_heads, ptp, s->par.tp,
			      s->c[DPS_COMP_ATTN], s->t, plan);
	if (n != s->nkv_t)
		rc = n < 0 ? n : -DPS_EPROTO; /* the plan follows the loader's rule */
	/* runs of heads from one prefill rank's consecutive slots, copied together, layer by
	 * layer and position by position (the order both caches lay them out in) */
	for (int k = 0, len; k < n && !rc; k += len) {
		const char *base = share + (size_t)(pr * ptp + plan[k].src_rank) * stride;
		const struct dps_kv_share_hdr *h = (const struct dps_kv_share_hdr *)(const void *)base;
		const float *keys, *vals;

		if (draft) { /* the draft's cache follows its target's */
			if (h->magic != DPS_KV_SHARE_MAGIC || !h->draft_off ||
			    h->draft_off + sizeof(*h) > stride) {
				rc = -DPS_EPROTO;
				break;
			}
			base += h->draft_off;
			h = (const struct dps_kv_share_hdr *)(const void *)base;
		}

		for (len = 1; k + len < n && plan[k + len].src_rank == plan[k].src_rank &&
			      plan[k + len].src_head == plan[k].src_head + len; len++)
			;
		if (h->magic != DPS_KV_SHARE_MAGIC || h->layers != (uint32_t)L ||
		    h->block_size != (uint32_t)bs || h->width % (uint32_t)hd ||
		    (uint32_t)(plan[k].src_head + len) * (uint32_t)hd > h->width) {
			rc = -DPS_EPROTO;
			break;
		}
		keys = (const float *)(const void *)(base + h->key_off);
		vals = (const float *)(const void *)(base + h->value_off);
		for (int p = 0; p < n_pos; p++) {
			const int from = dps_kv_slot(src, bs, p), to = dps_kv_slot(dst, bs, p);

			if (from < 0 || (uint32_t)from >= h->num_blocks * h->block_size || to < 0 ||
			    to >= s->num_blocks * bs)
				rc = -DPS_EPROTO;
		}
		for (int l = 0; l < L && !rc; l++)
			for (int p = 0; p < n_pos; p++) {
				const size_t at = dps_kv_offset(l, (int)h->num_blocks, bs,
								dps_kv_slot(src, bs, p), h->width) +
						  (size_t)plan[k].src_head * (size_t)hd;
				const size_t here = dps_kv_offset(l, s->num_blocks, bs,
								  dps_kv_slot(dst, bs, p), kv) +
						    (size_t)k * (size_t)hd;
				const size_t bytes = sizeof(float) * (size_t)len * (size_t)hd;

				memcpy(s->key_cache + here, keys + at, bytes);
				memcpy(s->value_cache + here, vals + at, bytes);
			}
	}
	free(plan);
	return rc;
}

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

int dps_shard_kv_fetch(struct dps_shard *s, struct dps_world *w, int pr, int ptp, const int *src,
		       int n_src, int draft)
{
	const struct dps_groups *pg = w->lay->groups.prefill;
	const int L = s->cfg.num_hidden_layers, bs = s->block_size;
	const int me = dps_layout_node_of(w->lay, w->rank);
	int rc = 0;

	if (!pg || !w->kv_share)
		return -EINVAL;
	for (int t = 0; t < ptp && !rc; t++) {
		const int q = pr * ptp + t;
		const char *base = w->kv_share + (size_t)q * w->kv_stride;
		const struct dps_kv_share_hdr *h = (const struct dps_kv_share_hdr *)(const void *)base;
		uint64_t hr[1][2] = { { 0, sizeof(*h) } }, (*r)[2];
		size_t hoff = 0, row;
		int n = 0;

		if (dps_layout_node_of(w->lay, pg->rank_base + q) == me)
			continue; /* its share is this node's memory */
		rc = dps_world_fetch(w, q, (const uint64_t (*)[2])hr, 1);
		if (!rc && draft) { /* the draft's header, where the target's says */
			if (h->magic != DPS_KV_SHARE_MAGIC || !h->draft_off ||
			    h->draft_off > w->kv_stride - sizeof(*h))
				return -DPS_EPROTO;
			hoff = h->draft_off;
			hr[0][0] = hoff;
			rc = dps_world_fetch(w, q, (const uint64_t (*)[2])hr, 1);
			h = (const struct dps_kv_share_hdr *)(const void *)(base + hoff);
		}
		if (rc)
			break;
		if (h->magic != DPS_KV_SHARE_MAGIC || h->layers != (uint32_t)L ||
		    h->block_size != (uint32_t)bs || !h->width)
			return -DPS_EPROTO;
		row = (size_t)bs * h->width * sizeof(float); /* one block of one layer */
		r = malloc(sizeof(*r) * 2 * (size_t)L * (size_t)(n_src > 0 ? n_src : 1));
		if (!r)
			return -ENOMEM;
		for (int b = 0; b < n_src; b++)
			if (src[b] < 0 || (uint32_t)src[b] >= h->num_blocks)
				rc = -DPS_EPROTO; /* (checked before any offset is made of it) */
		for (int l = 0; l < L && !rc; l++)
			for (int b = 0; b < n_src; b++) {
				const size_t at = sizeof(float) *
						  dps_kv_offset(l, (int)h->num_blocks, bs, src[b] * bs,
								h->width);

				r[n][0] = hoff + h->key_off + at;
				r[n++][1] = row;
				r[n][0] = hoff + h->value_off + at;
				r[n++][1] = row;
			}
		if (!rc)
			rc = dps_world_fetch(w, q, (const uint64_t (*)[2])r, n);
		free(r);
	}
	return rc;
}

/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/replica_handoff.c - the replica's side of disaggregated serving (docs/DESIGN.md,
 * "Disaggregated prefill"): a prefill replica tells the client of each request it hands over
 * (its blocks held until the release); a decode replica publishes the pulls its scheduler
 * admitted with the step's rows, and every rank copies them in before it runs the step; the
 * size of each prefill rank's KV share.
 */
#include <stdio.h>
#include <string.h>

#include "common/dps.h"
#include "engine/serve/replica.h"
#include "engine/shard/kv.h"

/*
 * A prefill replica: tells the client of every request newly handed over (its blocks, in as
 * many messages as they need). A full ring leaves the rest for the next turn.
 */
int dps_replica_announce_handoffs(struct replica *R)
{
	unsigned char buf[MSG_BYTES];
	struct m_handoff *m = (struct m_handoff *)(void *)buf;
	int rc = 0;

	for (int i = 0; i < R->s.n_handoff && !rc; i++) {
		struct dps_req *r = R->s.handoff[i];

		if (r->announced)
			continue;
		dps_replica_flush_tokens(R); /* its first token before it */
		for (int first = 0; first < r->n_blocks && !rc; first += (int)HANDOFF_BLOCKS) {
			const int k = r->n_blocks - first < (int)HANDOFF_BLOCKS ? r->n_blocks - first
										: (int)HANDOFF_BLOCKS;

			*m = (struct m_handoff){ { M_HANDOFF, (uint32_t)k, (int64_t)r->id }, first,
						 r->n_blocks, r->n_ids, r->ids[r->n_ids - 1],
						 r->plp_next, 0, r->rng, r->t_scheduled,
						 r->p.deadline_ns };
			memcpy(m->blocks, r->blocks + first, sizeof(int) * (size_t)k);
			rc = dps_replica_send_up(R, m, sizeof(*m) + sizeof(int32_t) * (size_t)k);
		}
		r->announced = 1;
		R->st.handoffs++;
	}
	return rc;
}

/*
 * TP rank 0: the batch's pulls in their wire form (struct replica's pulls); each request's
 * source is then forgotten: it is pulled once.
 */
void dps_replica_pack_pulls(struct replica *R, int *hdr)
{
	const struct dps_batch *b = &R->s.b;
	int at = 0;

	for (int i = 0; i < b->n_pulls; i++) {
		struct dps_req *r = b->pulls[i];

		R->pulls[at++] = r->src_replica;
		R->pulls[at++] = r->n_ids - 1;
		R->pulls[at++] = r->n_src;
		R->pulls[at++] = r->n_blocks;
		memcpy(R->pulls + at, r->src_blocks, sizeof(int) * (size_t)r->n_src);
		at += r->n_src;
		memcpy(R->pulls + at, r->blocks, sizeof(int) * (size_t)r->n_blocks);
		at += r->n_blocks;
		r->n_src = 0;
	}
	hdr[H_PULLS] = b->n_pulls;
	hdr[H_PULLS_LEN] = at;
}

/* Every rank: copies this step's pulled positions into its cache. */
int dps_replica_run_pulls(struct replica *R, const int *hdr)
{
	const struct dps_groups *pg = R->w->lay->groups.prefill;
	int at = 0, rc = 0;

	for (int i = 0; i < hdr[H_PULLS] && !rc; i++) {
		const int *p = R->pulls + at;
		uint64_t t0 = dps_now_ns();

		/* (rank 0 checked the request when it adopted it: this is the wire's own check) */
		if (at + 4 > hdr[H_PULLS_LEN] || p[0] < 0 || p[0] >= pg->cfg.dp || p[2] < 1 ||
		    p[3] < 1 || p[2] > R->bpr || p[3] > R->bpr || p[1] < 1 ||
		    p[1] > (p[2] < p[3] ? p[2] : p[3]) * R->m.block_size ||
		    at + 4 + p[2] + p[3] > hdr[H_PULLS_LEN])
			return -EPROTO;
		if (R->w->fetch) { /* across nodes: its blocks into this node's share first */
			rc = dps_shard_kv_fetch(&R->m, R->w, p[0], pg->cfg.tp, p + 4, p[2], 0);
			if (!rc && R->spec_k)
				rc = dps_shard_kv_fetch(&R->dm, R->w, p[0], pg->cfg.tp, p + 4, p[2], 1);
		}
		if (!rc)
			rc = dps_shard_kv_pull(&R->m, R->w->kv_share, R->w->kv_stride, p[0],
					       pg->cfg.tp, p + 4, p + 4 + p[2], p[1], 0);
		if (!rc && R->spec_k) /* the draft's KV of the same positions, in the same blocks */
			rc = dps_shard_kv_pull(&R->dm, R->w->kv_share, R->w->kv_stride, p[0],
					       pg->cfg.tp, p + 4, p + 4 + p[2], p[1], 1);
		R->st.kv_pulls++;
		R->st.kv_pull_bytes += (uint64_t)p[1] * 2 * (uint64_t)R->m.cfg.num_hidden_layers *
				       (uint64_t)R->m.nkv_t * (uint64_t)R->m.hd * sizeof(float);
		R->st.kv_pull_ns += dps_now_ns() - t0;
		at += 4 + p[2] + p[3];
	}
	return rc;
}

int dps_replica_adopt_ok(const struct replica *R, int src_replica, const int *src, int n_src)
{
	const struct dps_groups *pg = R->w->lay->groups.prefill;
	const struct dps_kv_share_hdr *h;

	if (!pg || src_replica < 0 || src_replica >= pg->cfg.dp || !R->w->kv_share)
		return 0;
	if (R->w->fetch &&
	    dps_layout_node_of(R->w->lay, pg->rank_base + src_replica * pg->cfg.tp) !=
		    dps_layout_node_of(R->w->lay, R->w->rank)) {
		/* across nodes: that header into this node's share first */
		const uint64_t hr[1][2] = { { 0, sizeof(*h) } };

		if (dps_world_fetch(R->w, src_replica * pg->cfg.tp, hr, 1))
			return 0;
	}
	/* every rank of a prefill replica has the same blocks: its TP rank 0's header says */
	h = (const struct dps_kv_share_hdr *)(const void *)(R->w->kv_share +
							      (size_t)(src_replica * pg->cfg.tp) *
								      R->w->kv_stride);
	if (h->magic != DPS_KV_SHARE_MAGIC || h->block_size != (uint32_t)R->m.block_size)
		return 0;
	for (int i = 0; i < n_src; i++)
		if (src[i] < 0 || (uint32_t)src[i] >= h->num_blocks)
			return 0;
	return 1;
}

size_t dps_engine_kv_share_bytes(const struct dps_engine_opts *o, const struct dps_par_cfg *par)
{
	const int total = par->tp * par->dp + par->prefill_dp * dps_par_cfg_prefill_tp(par);

	if (!par->prefill_dp)
		return 0;
	/* a prefill rank's whole budget, and the pages of its headers (the target's and a
	 * draft's, each page-aligned: replica_init, dps_spec_load) */
	return dps_kv_budget(o->kv_cache_memory, o->kv_fraction, total) + 3 * 4096;
}

/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/coll.c - the collectives of the sharded forward pass, counted per kind and
 * group (dps_shard_stats, the trace), and the reference's _dp_transition. Called by every
 * step of every graph.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/shard/shard_int.h"


void dps_shard_count(struct dps_shard *s, enum dps_coll_kind k, int sg, size_t bytes)
{
	s->stats.calls[k][sg]++;
	s->stats.bytes[k][sg] += bytes;
	if (s->trace) {
		char where[32] = "outside the layers";

		if (s->cur_layer >= 0)
			snprintf(where, sizeof(where), "layer %d", s->cur_layer);
		fprintf(stderr, "rank %d step %llu (%s) %s: %s over the %s, %zu bytes\n",
			s->w ? s->w->rank : 0, (unsigned long long)s->steps,
			s->cur_prefill ? "prefill" : "decode", where, dps_coll_kind_name(k),
			dps_shard_group_name(sg), bytes);
	}
}

int dps_shard_allreduce(struct dps_shard *s, struct dps_comm *c, int sg, float *buf, size_t n)
{
	if (!c || c->n == 1 || !n)
		return 0;
	dps_shard_count(s, DPS_COLL_ALLREDUCE, sg, n * sizeof(float));
	return dps_coll_allreduce(c, buf, buf, n, DPS_F32);
}

int dps_shard_allgather(struct dps_shard *s, struct dps_comm *c, int sg, const void *send,
			void *recv, size_t n, enum dps_dtype t)
{
	if (!c || c->n == 1) {
		if (recv != send)
			memcpy(recv, send, n * dps_dtype_size(t));
		return 0;
	}
	if (!n) /* every member gives the same count */
		return 0;
	dps_shard_count(s, DPS_COLL_ALLGATHER, sg, n * dps_dtype_size(t) * (size_t)c->n);
	return dps_coll_allgather(c, send, recv, n, t);
}

/* ---- _dp_transition ------------------------------------------------------------------------ */

int dps_dp_transition(struct dps_shard *s, const float *x, float *out, int rows_local, int cols,
		      int from, int to, struct dps_comm *to_col, int to_sg)
{
	const size_t row = (size_t)cols, per = (size_t)rows_local * row;

	if (from == to) {
		if (out != x)
			memmove(out, x, per * (size_t)from * sizeof(float));
		return 0;
	}
	if (from > to && from % to == 0) {
		/* Down: keep this rank's target sub-group of batches (the reference's narrow). */
		const size_t start = (size_t)((s->d % from) / to) * (size_t)to * per;

		memmove(out, x + start, per * (size_t)to * sizeof(float));
		return 0;
	}
	/*
	 * Up (and down between sizes that do not nest, where the reference's slice would keep the wrong
	 * replicas): through local, then all-gather over the target column.
	 */
	return dps_shard_allgather(s, to_col, to_sg, x + (size_t)(s->d % from) * per, out, per, DPS_F32);
}


/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/load_moe.c - a rank's share of a mixture-of-experts layer (see shard.h): the
 * replicated router and the experts it holds, read from GPT-OSS's Hugging Face layout (the
 * fused gate_up_proj with gate and up interleaved, down_proj, their biases) or from their
 * MXFP4 blocks and scales, which stay MXFP4. Called by load.c for every MoE layer.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/shard/shard_int.h"

static uint8_t *alloc_bytes(struct dps_shard_loader *L, size_t n)
{
	uint8_t *p;

	if (L->rc)
		return NULL;
	p = dps_alloc_huge(n);
	if (!p) {
		snprintf(L->err, L->errlen, "rank %d: cannot allocate %zu bytes of weights",
			 L->s->w ? L->s->w->rank : 0, n);
		L->rc = -ENOMEM;
		return NULL;
	}
	L->s->bytes[DPS_PART_EXPERTS] += n;
	return p;
}

/* Expert e's slice of a 3-D or 4-D tensor (its dimension 0 at e) into a staging buffer. */
static void *expert_slice(struct dps_shard_loader *L, const char *name, int ndim,
			  const uint64_t *shape, int e, int raw)
{
	size_t n = 1;
	void *p;

	for (int i = 1; i < ndim; i++)
		n *= shape[i];
	if (L->rc)
		return NULL;
	p = malloc(n * (raw ? 1 : sizeof(float)));
	if (!p) {
		L->rc = -ENOMEM;
		snprintf(L->err, L->errlen, "out of memory loading '%s'", name);
		return NULL;
	}
	L->rc = raw ? dps_ckpt_load_range_raw(&L->ck, name, ndim, shape, 0, e, 1, p, L->err,
					      L->errlen)
		    : dps_ckpt_load_range(&L->ck, name, ndim, shape, 0, e, 1, p, L->err, L->errlen);
	if (L->rc) {
		free(p);
		return NULL;
	}
	return p;
}

/*
 * Expert e as this rank holds it (local index i): intermediate rows [i0, i0 + ime) of gate
 * and up (zero past the end) and those columns of down, from GPT-OSS's Hugging Face layout:
 * gate_up_proj (E, hidden, 2I) with gate and up interleaved along its last dimension and
 * down_proj (E, I, hidden), transposed here into (out, in) rows; or their MXFP4 blocks and
 * scales (E, 2I, hidden/32, 16) and (E, hidden, I/32, 16), whose rows are already out-major
 * (i0 and ime then multiples of 32).
 */
static void load_expert(struct dps_shard_loader *L, int l, int i, int e, int64_t i0, int q4)
{
	struct dps_shard *s = L->s;
	struct dps_shard_layer *w = &s->layers[l];
	const struct dps_model_config *c = &s->cfg;
	const uint64_t dim = (uint64_t)c->hidden_size, im = (uint64_t)c->intermediate_size;
	const uint64_t E = (uint64_t)c->num_local_experts, ime = (uint64_t)s->im_e;
	char gu[112], dn[112];

	snprintf(gu, sizeof(gu), "model.layers.%d.mlp.experts.gate_up_proj%s", l,
		 q4 ? "_blocks" : "");
	snprintf(dn, sizeof(dn), "model.layers.%d.mlp.experts.down_proj%s", l,
		 q4 ? "_blocks" : "");
	if (q4) {
		const uint64_t G = dim / 32, Gi = im / 32, Ge = ime / 32;
		const uint64_t gq[4] = { E, 2 * im, G, 16 }, gs[3] = { E, 2 * im, G };
		const uint64_t dq[4] = { E, dim, Gi, 16 }, ds[3] = { E, dim, Gi };
		uint8_t *q, *sc, *tq, *ts;
		char name[128];

		w->exp_gu_q[i] = q = alloc_bytes(L, 2 * ime * G * 16);
		w->exp_gu_s[i] = sc = alloc_bytes(L, 2 * ime * G);
		tq = expert_slice(L, gu, 4, gq, e, 1);
		snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.gate_up_proj_scales", l);
		ts = expert_slice(L, name, 3, gs, e, 1);
		/* stored row 2r is gate row r, 2r + 1 up row r: into gate rows, then up rows */
		for (uint64_t r = 0; r < ime && tq && ts && q && sc; r++)
			for (int u = 0; u < 2; u++) {
				const uint64_t from = 2 * ((uint64_t)i0 + r) + (uint64_t)u;
				const uint64_t to = (uint64_t)u * ime + r;

				if (from < 2 * im) {
					memcpy(q + to * G * 16, tq + from * G * 16, G * 16);
					memcpy(sc + to * G, ts + from * G, G);
				} else {
					memset(q + to * G * 16, 0, G * 16);
					memset(sc + to * G, 0, G);
				}
			}
		free(tq);
		free(ts);
		w->exp_dn_q[i] = q = alloc_bytes(L, dim * Ge * 16);
		w->exp_dn_s[i] = sc = alloc_bytes(L, dim * Ge);
		tq = expert_slice(L, dn, 4, dq, e, 1);
		snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.down_proj_scales", l);
		ts = expert_slice(L, name, 3, ds, e, 1);
		/* row x's blocks [i0 / 32, i0 / 32 + Ge) of the stored Gi */
		for (uint64_t x = 0; x < dim && tq && ts && q && sc; x++)
			for (uint64_t b = 0; b < Ge; b++) {
				const uint64_t from = (uint64_t)i0 / 32 + b;

				if (from < Gi) {
					memcpy(q + (x * Ge + b) * 16, tq + (x * Gi + from) * 16, 16);
					sc[x * Ge + b] = ts[x * Gi + from];
				} else {
					memset(q + (x * Ge + b) * 16, 0, 16);
					sc[x * Ge + b] = 0;
				}
			}
		free(tq);
		free(ts);
		return;
	}
	{
		const uint64_t gshape[3] = { E, dim, 2 * im }, dshape[3] = { E, im, dim };
		float *g = dps_shard_alloc_part(L, DPS_PART_EXPERTS, 2 * ime * dim);
		float *d = dps_shard_alloc_part(L, DPS_PART_EXPERTS, dim * ime);
		float *t;

		w->exp_gu[i] = g;
		w->exp_dn[i] = d;
		t = expert_slice(L, gu, 3, gshape, e, 0);
		for (uint64_t r = 0; r < ime && t && g; r++)
			for (int u = 0; u < 2; u++) {
				const uint64_t col = 2 * ((uint64_t)i0 + r) + (uint64_t)u;
				float *row = g + ((uint64_t)u * ime + r) * dim;

				for (uint64_t x = 0; x < dim; x++)
					row[x] = col < 2 * im ? t[x * 2 * im + col] : 0.0f;
			}
		free(t);
		t = expert_slice(L, dn, 3, dshape, e, 0);
		for (uint64_t x = 0; x < dim && t && d; x++)
			for (uint64_t r = 0; r < ime; r++)
				d[x * ime + r] = (uint64_t)i0 + r < im ? t[((uint64_t)i0 + r) * dim + x]
								       : 0.0f;
		free(t);
	}
}

/*
 * A MoE layer's router and bias (whole) and experts [e_lo, e_lo + e_n): with expert
 * parallelism whole, else rows [gm * im_e, (gm + 1) * im_e) of gate and up and those columns
 * of down, like the MLP (gm = j*TP + t, zero past the end); their biases likewise, the down
 * bias on the rank that adds it.
 */
void dps_shard_load_experts(struct dps_shard_loader *L, int l)
{
	struct dps_shard *s = L->s;
	struct dps_shard_layer *w = &s->layers[l];
	const struct dps_model_config *c = &s->cfg;
	const uint64_t dim = (uint64_t)c->hidden_size, im = (uint64_t)c->intermediate_size;
	const uint64_t E = (uint64_t)c->num_local_experts, ime = (uint64_t)s->im_e;
	/* Like the MLP without expert parallelism; whole (one shard, rank 0) with it. */
	const int rank = s->moe == DPS_MOE_TP ? dps_shard_comp_rank(s, DPS_COMP_MLP) : 0;
	const int64_t i0 = (int64_t)rank * (int64_t)ime;
	char n0[112], n1[112];
	float *b;
	int q4;

	snprintf(n0, sizeof(n0), "model.layers.%d.mlp.router.weight", l);
	snprintf(n1, sizeof(n1), "model.layers.%d.mlp.router.bias", l);
	w->router = dps_shard_alloc_part(L, DPS_PART_EXPERTS, E * dim);
	w->router_bias = dps_shard_alloc_part(L, DPS_PART_EXPERTS, E);
	if (w->router && w->router_bias) {
		dps_shard_load_range(L, n0, E, dim, 0, 0, E, w->router);
		dps_shard_load_whole(L, n1, E, w->router_bias);
	}
	w->exp_gu = calloc((size_t)s->e_n, sizeof(float *));
	w->exp_dn = calloc((size_t)s->e_n, sizeof(float *));
	w->exp_gu_q = calloc((size_t)s->e_n, sizeof(uint8_t *));
	w->exp_gu_s = calloc((size_t)s->e_n, sizeof(uint8_t *));
	w->exp_dn_q = calloc((size_t)s->e_n, sizeof(uint8_t *));
	w->exp_dn_s = calloc((size_t)s->e_n, sizeof(uint8_t *));
	if ((!w->exp_gu || !w->exp_dn || !w->exp_gu_q || !w->exp_gu_s || !w->exp_dn_q ||
	     !w->exp_dn_s) && !L->rc) {
		L->rc = -ENOMEM;
		snprintf(L->err, L->errlen, "out of memory");
	}
	/* MXFP4 or not, as the checkpoint stores this layer (the one-rank model decides alike) */
	snprintf(n0, sizeof(n0), "model.layers.%d.mlp.experts.gate_up_proj_blocks", l);
	q4 = dps_ckpt_find(&L->ck, n0, NULL) != NULL;
	if (q4 && !c->mxfp4 && !L->rc) {
		snprintf(L->err, L->errlen, "%s: tensor '%s' is MXFP4 but config.json has no "
			 "quantization_config", L->ck.dir, n0);
		L->rc = -EINVAL;
	}
	for (int i = 0; i < s->e_n && !L->rc; i++)
		load_expert(L, l, i, s->e_lo + i, i0, q4);
	/* Biases: gate_up_proj_bias (E, 2I) interleaved like its weight, down_proj_bias (E, hidden). */
	snprintf(n0, sizeof(n0), "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
	snprintf(n1, sizeof(n1), "model.layers.%d.mlp.experts.down_proj_bias", l);
	w->exp_gu_b = dps_shard_alloc_part(L, DPS_PART_EXPERTS, (size_t)s->e_n * 2 * ime);
	b = L->rc ? NULL : malloc(sizeof(float) * (size_t)(2 * im));
	if (!b && !L->rc) { /* never zero biases in silence */
		L->rc = -ENOMEM;
		snprintf(L->err, L->errlen, "out of memory loading '%s'", n0);
	}
	for (int i = 0; i < s->e_n && b && w->exp_gu_b && !L->rc; i++) {
		const uint64_t shape[2] = { E, 2 * im };

		L->rc = dps_ckpt_load_range(&L->ck, n0, 2, shape, 0, s->e_lo + i, 1, b, L->err,
					    L->errlen);
		for (uint64_t r = 0; r < ime && !L->rc; r++)
			for (int u = 0; u < 2; u++) {
				const uint64_t col = 2 * ((uint64_t)i0 + r) + (uint64_t)u;

				w->exp_gu_b[(size_t)i * 2 * ime + (uint64_t)u * ime + r] =
					col < 2 * im ? b[col] : 0.0f;
			}
	}
	free(b);
	if (s->moe != DPS_MOE_TP || rank == 0) {
		w->exp_dn_b = dps_shard_alloc_part(L, DPS_PART_EXPERTS, (size_t)s->e_n * dim);
		if (w->exp_dn_b)
			dps_shard_load_range(L, n1, E, dim, 0, s->e_lo, (uint64_t)s->e_n,
					     w->exp_dn_b);
	}
}

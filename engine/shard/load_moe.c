/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/load_moe.c - a rank's share of a mixture-of-experts layer (see shard.h): the
 * replicated router and the experts it holds, read by engine/model/gpt_oss.c from GPT-OSS's
 * Hugging Face layout (or their MXFP4 blocks and scales, which stay MXFP4), and the down
 * biases on the rank that adds them. Called by load.c for every MoE layer.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/gpt_oss.h"
#include "engine/shard/shard_int.h"
#include "kernels/mxfp4.h"
#include "kernels/q8.h"

static uint8_t *alloc_bytes(struct dps_shard_loader *L, size_t n)
{
	uint8_t *p;

	if (L->rc)
		return NULL;
	p = dps_shard_weights_alloc(L->s, n);
	if (!p) {
		snprintf(L->err, L->errlen, "rank %d: cannot allocate %zu bytes of weights",
			 L->s->w ? L->s->w->rank : 0, n);
		L->rc = -ENOMEM;
		return NULL;
	}
	L->s->bytes[DPS_PART_EXPERTS] += n;
	return p;
}

/* rows x k f32 values of src into dst, held as t (BF16: each rounded to nearest even; F16:
 * the F16 they were read from; INT8: quantized, kernels/q8.h). */
static void narrow(void *dst, enum dps_wtype t, const float *src, size_t rows, int k)
{
	if (t == DPS_WT_Q8) {
		dps_q8_quantize_rows(dst, k, src, rows);
		return;
	}
	for (size_t i = 0; i < rows * (size_t)k; i++) /* F16: exact, src came from F16 */
		((uint16_t *)dst)[i] = t == DPS_WT_F16 ? dps_f32_to_f16(src[i])
						       : dps_f32_to_bf16(src[i]);
}

/*
 * Expert e as this rank holds it (local index i): intermediate rows [i0, i0 + im_e). Unless
 * MXFP4, its weights are of s->wt: read as f32 (the GPT-OSS reader interleaves gate and up)
 * and, for BF16, narrowed into place - exact for a BF16 checkpoint, whose values round-trip;
 * for INT8, quantized.
 */
static void load_expert(struct dps_shard_loader *L, int l, int i, int e, int64_t i0, int q4)
{
	struct dps_shard *s = L->s;
	struct dps_shard_layer *w = &s->layers[l];
	const size_t dim = (size_t)s->cfg.hidden_size, ime = (size_t)s->im_e;
	const int narrowed = !q4 && s->wt != DPS_WT_F32;
	struct dps_gptoss_expert d = { .gu_b = w->exp_gu_b + (size_t)i * 2 * ime };

	if (q4) {
		d.gu_q = w->exp_gu_q[i] = alloc_bytes(L, 2 * ime * dim / 2);
		d.gu_s = w->exp_gu_s[i] = alloc_bytes(L, 2 * ime * dim / 32);
		d.dn_q = w->exp_dn_q[i] = alloc_bytes(L, dim * ime / 2);
		d.dn_s = w->exp_dn_s[i] = alloc_bytes(L, dim * ime / 32);
	} else {
		w->exp_gu[i] = dps_shard_alloc_w(L, DPS_PART_EXPERTS, 2 * ime, (int)dim);
		w->exp_dn[i] = dps_shard_alloc_w(L, DPS_PART_EXPERTS, dim, (int)ime);
		d.gu = narrowed ? malloc(sizeof(float) * 2 * ime * dim) : w->exp_gu[i];
		d.dn = narrowed ? malloc(sizeof(float) * dim * ime) : w->exp_dn[i];
		if ((!d.gu || !d.dn) && !L->rc) {
			L->rc = -ENOMEM;
			snprintf(L->err, L->errlen, "out of memory reading expert %d of layer %d", e, l);
		}
	}
	if (!L->rc)
		L->rc = dps_gptoss_expert_read(&L->ck, l, e, i0, (int)ime, q4, &d, L->err,
					       L->errlen);
	if (q4 && s->wt == DPS_WT_Q8 && !L->rc) {
		/* INT8: the integer form of the MXFP4 products reads its blocks re-laid */
		L->rc = dps_mxfp4_interleave(d.gu_q, 2 * ime, (int)dim);
		if (!L->rc)
			L->rc = dps_mxfp4_interleave(d.dn_q, dim, (int)ime);
		if (L->rc)
			snprintf(L->err, L->errlen, "out of memory re-laying expert %d of layer %d", e, l);
	}
	if (narrowed && !L->rc) {
		narrow(w->exp_gu[i], s->wt, d.gu, 2 * ime, (int)dim);
		narrow(w->exp_dn[i], s->wt, d.dn, dim, (int)ime);
	}
	if (narrowed) {
		free(d.gu);
		free(d.dn);
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
	const uint64_t dim = (uint64_t)c->hidden_size;
	const uint64_t E = (uint64_t)c->num_local_experts, ime = (uint64_t)s->im_e;
	/* Like the MLP without expert parallelism; whole (one shard, rank 0) with it. */
	const int rank = s->moe == DPS_MOE_TP ? dps_shard_comp_rank(s, DPS_COMP_MLP) : 0;
	const int64_t i0 = (int64_t)rank * (int64_t)ime;
	char n0[112], n1[112];
	int q4;

	snprintf(n0, sizeof(n0), "model.layers.%d.mlp.router.weight", l);
	snprintf(n1, sizeof(n1), "model.layers.%d.mlp.router.bias", l);
	w->router = dps_shard_alloc_t(L, DPS_PART_EXPERTS, E, (int)dim, s->wt_emb);
	w->router_bias = dps_shard_alloc_part(L, DPS_PART_EXPERTS, E);
	if (w->router && w->router_bias) {
		dps_shard_load_range_t(L, n0, E, dim, 0, 0, E, w->router, s->wt_emb);
		dps_shard_load_whole(L, n1, E, w->router_bias);
	}
	w->exp_gu = calloc((size_t)s->e_n, sizeof(void *));
	w->exp_dn = calloc((size_t)s->e_n, sizeof(void *));
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
	q4 = L->rc ? 0 : dps_gptoss_experts_mxfp4(&L->ck, l, L->err, L->errlen);
	if (q4 < 0)
		L->rc = q4;
	w->exp_gu_b = dps_shard_alloc_part(L, DPS_PART_EXPERTS, (size_t)s->e_n * 2 * ime);
	for (int i = 0; i < s->e_n && !L->rc; i++)
		load_expert(L, l, i, s->e_lo + i, i0, q4);
	snprintf(n1, sizeof(n1), "model.layers.%d.mlp.experts.down_proj_bias", l);
	if (s->moe != DPS_MOE_TP || rank == 0) {
		w->exp_dn_b = dps_shard_alloc_part(L, DPS_PART_EXPERTS, (size_t)s->e_n * dim);
		if (w->exp_dn_b)
			dps_shard_load_range(L, n1, E, dim, 0, s->e_lo, (uint64_t)s->e_n,
					     w->exp_dn_b);
	}
}

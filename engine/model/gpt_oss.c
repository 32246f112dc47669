/* SPDX-License-Identifier: MIT */
/*
 * engine/model/gpt_oss.c - GPT-OSS's experts from their Hugging Face layout (see gpt_oss.h).
 * Runs at load time, once per expert a process holds.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/gpt_oss.h"

int dps_gptoss_experts_mxfp4(struct dps_ckpt *ck, int l, char *err, size_t errlen)
{
	char name[112];

	snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.gate_up_proj_blocks", l);
	if (!dps_ckpt_find(ck, name, NULL))
		return 0;
	if (!ck->cfg.mxfp4) {
		snprintf(err, errlen, "%s: tensor '%s' is MXFP4 but config.json has no "
			 "quantization_config", ck->dir, name);
		return -EINVAL;
	}
	if (ck->cfg.hidden_size % 32 || ck->cfg.intermediate_size % 32) {
		snprintf(err, errlen, "%s: MXFP4 experts need hidden_size and intermediate_size "
			 "multiples of 32 (%d, %d)", ck->dir, ck->cfg.hidden_size,
			 ck->cfg.intermediate_size);
		return -EINVAL;
	}
	return 1;
}

/* Expert e's slice (dimension 0 at e) of tensor "model.layers.l.mlp.experts.<what>", staged
 * in a fresh buffer (raw bytes, or F32), or NULL with *rc set. */
static void *slice(struct dps_ckpt *ck, int l, const char *what, int ndim, const uint64_t *shape,
		   int e, int raw, int *rc, char *err, size_t errlen)
{
	char name[128];
	size_t n = 1;
	void *p;

	snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.%s", l, what);
	for (int i = 1; i < ndim; i++)
		n *= shape[i];
	p = malloc(n * (raw ? 1 : sizeof(float)));
	if (!p) {
		snprintf(err, errlen, "out of memory loading '%s'", name);
		*rc = -ENOMEM;
		return NULL;
	}
	*rc = raw ? dps_ckpt_load_range_raw(ck, name, ndim, shape, 0, e, 1, p, err, errlen)
		  : dps_ckpt_load_range(ck, name, ndim, shape, 0, e, 1, p, err, errlen);
	if (*rc) {
		free(p);
		return NULL;
	}
	return p;
}

/* MXFP4: gate/up rows 2(i0 + r) + u into row u * n + r, down's blocks [i0/32, +n/32) per row. */
static int read_mxfp4(struct dps_ckpt *ck, int l, int e, int64_t i0, int n,
		      const struct dps_gptoss_expert *d, char *err, size_t errlen)
{
	const struct dps_model_config *c = &ck->cfg;
	const uint64_t E = (uint64_t)c->num_local_experts, dim = (uint64_t)c->hidden_size;
	const uint64_t im = (uint64_t)c->intermediate_size, G = dim / 32, Gi = im / 32;
	const uint64_t Ge = (uint64_t)n / 32;
	const uint64_t gq[4] = { E, 2 * im, G, 16 }, gs[3] = { E, 2 * im, G };
	const uint64_t dq[4] = { E, dim, Gi, 16 }, ds[3] = { E, dim, Gi };
	uint8_t *tq, *ts = NULL;
	int rc;

	tq = slice(ck, l, "gate_up_proj_blocks", 4, gq, e, 1, &rc, err, errlen);
	if (tq)
		ts = slice(ck, l, "gate_up_proj_scales", 3, gs, e, 1, &rc, err, errlen);
	for (uint64_t r = 0; r < (uint64_t)n && ts; r++)
		for (int u = 0; u < 2; u++) {
			const uint64_t from = 2 * ((uint64_t)i0 + r) + (uint64_t)u;
			const uint64_t to = (uint64_t)u * (uint64_t)n + r;

			if (from < 2 * im) {
				memcpy(d->gu_q + to * G * 16, tq + from * G * 16, G * 16);
				memcpy(d->gu_s + to * G, ts + from * G, G);
			} else {
				memset(d->gu_q + to * G * 16, 0, G * 16);
				memset(d->gu_s + to * G, 0, G);
			}
		}
	free(tq);
	free(ts);
	if (rc)
		return rc;
	ts = NULL;
	tq = slice(ck, l, "down_proj_blocks", 4, dq, e, 1, &rc, err, errlen);
	if (tq)
		ts = slice(ck, l, "down_proj_scales", 3, ds, e, 1, &rc, err, errlen);
	for (uint64_t x = 0; x < dim && ts; x++)
		for (uint64_t b = 0; b < Ge; b++) {
			const uint64_t from = (uint64_t)i0 / 32 + b;

			if (from < Gi) {
				memcpy(d->dn_q + (x * Ge + b) * 16, tq + (x * Gi + from) * 16, 16);
				d->dn_s[x * Ge + b] = ts[x * Gi + from];
			} else {
				memset(d->dn_q + (x * Ge + b) * 16, 0, 16);
				d->dn_s[x * Ge + b] = 0;
			}
		}
	free(tq);
	free(ts);
	return rc;
}

/* F32: gate/up columns 2(i0 + r) + u transposed into row u * n + r, down rows transposed. */
static int read_f32(struct dps_ckpt *ck, int l, int e, int64_t i0, int n,
		    const struct dps_gptoss_expert *d, char *err, size_t errlen)
{
	const struct dps_model_config *c = &ck->cfg;
	const uint64_t E = (uint64_t)c->num_local_experts, dim = (uint64_t)c->hidden_size;
	const uint64_t im = (uint64_t)c->intermediate_size;
	const uint64_t gshape[3] = { E, dim, 2 * im }, dshape[3] = { E, im, dim };
	float *t;
	int rc;

	t = slice(ck, l, "gate_up_proj", 3, gshape, e, 0, &rc, err, errlen);
	for (uint64_t r = 0; r < (uint64_t)n && t; r++)
		for (int u = 0; u < 2; u++) {
			const uint64_t col = 2 * ((uint64_t)i0 + r) + (uint64_t)u;
			float *row = d->gu + ((uint64_t)u * (uint64_t)n + r) * dim;

			for (uint64_t x = 0; x < dim; x++)
				row[x] = col < 2 * im ? t[x * 2 * im + col] : 0.0f;
		}
	free(t);
	if (rc)
		return rc;
	t = slice(ck, l, "down_proj", 3, dshape, e, 0, &rc, err, errlen);
	for (uint64_t x = 0; x < dim && t; x++)
		for (uint64_t r = 0; r < (uint64_t)n; r++)
			d->dn[x * (uint64_t)n + r] = (uint64_t)i0 + r < im
							     ? t[((uint64_t)i0 + r) * dim + x] : 0.0f;
	free(t);
	return rc;
}

int dps_gptoss_expert_read(struct dps_ckpt *ck, int l, int e, int64_t i0, int n, int mxfp4,
			   const struct dps_gptoss_expert *dst, char *err, size_t errlen)
{
	const uint64_t E = (uint64_t)ck->cfg.num_local_experts;
	const uint64_t im = (uint64_t)ck->cfg.intermediate_size, shape[2] = { E, 2 * im };
	float *b;
	int rc = mxfp4 ? read_mxfp4(ck, l, e, i0, n, dst, err, errlen)
		       : read_f32(ck, l, e, i0, n, dst, err, errlen);

	if (rc)
		return rc;
	/* gate_up_proj_bias (E, 2I), interleaved like its weight */
	b = slice(ck, l, "gate_up_proj_bias", 2, shape, e, 0, &rc, err, errlen);
	for (uint64_t r = 0; r < (uint64_t)n && b; r++)
		for (int u = 0; u < 2; u++) {
			const uint64_t col = 2 * ((uint64_t)i0 + r) + (uint64_t)u;

			dst->gu_b[(uint64_t)u * (uint64_t)n + r] = col < 2 * im ? b[col] : 0.0f;
		}
	free(b);
	return rc;
}

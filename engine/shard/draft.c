/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/draft.c - the Eagle3 draft on the shards (see shard.h): its configuration against
 * the target's, its extra tensors (fc, hidden_norm, d2t), the target's hidden states it fuses,
 * and its sharded pass. Called by load.c, by the step and by the serving engine's speculation.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/shard/shard_int.h"
#include "kernels/kernels.h"

/*
 * An Eagle3 draft of target T: checks its config against T's and fixes what the draft's
 * shards follow (one layer, the draft vocabulary, the fused layers, the target's context).
 */
int dps_shard_draft_config(struct dps_shard *s, const struct dps_shard *T, const char *dir,
			char *err, size_t errlen)
{
	struct dps_model_config *c = &s->cfg;
	const struct dps_model_config *tc = &T->cfg;
	const int N = tc->num_hidden_layers;

	if (!c->eagle3) {
		snprintf(err, errlen, "%s: not an Eagle3 draft (its config.json names no "
			 "LlamaForCausalLMEagle3 architecture, draft_vocab_size or "
			 "eagle_aux_hidden_state_layer_ids)", dir);
		return -EINVAL;
	}
	if (c->num_local_experts || c->num_hidden_layers != 1) {
		snprintf(err, errlen, "%s: an Eagle3 draft has one dense decoder layer (this config "
			 "has %d layers%s)", dir, c->num_hidden_layers,
			 c->num_local_experts ? " and experts" : "");
		return -EINVAL;
	}
	if (c->hidden_size != tc->hidden_size) {
		snprintf(err, errlen, "%s: the draft's hidden_size %d differs from the target's %d "
			 "(the draft reads the target's token embedding)", dir, c->hidden_size,
			 tc->hidden_size);
		return -EINVAL;
	}
	if (c->draft_vocab_size)
		c->vocab_size = c->draft_vocab_size;
	if (c->vocab_size > tc->vocab_size) {
		snprintf(err, errlen, "%s: the draft vocabulary (%d) is larger than the target's (%d)",
			 dir, c->vocab_size, tc->vocab_size);
		return -EINVAL;
	}
	if (c->n_aux) {
		for (int k = 0; k < 3; k++)
			if (c->aux_layers[k] >= N) {
				snprintf(err, errlen, "%s: eagle_aux_hidden_state_layer_ids names layer "
					 "%d; the target has %d layers", dir, c->aux_layers[k], N);
				return -EINVAL;
			}
	} else {
		/* vLLM's default, (2, N/2, N-3), kept inside a small target. */
		const int def[3] = { 2, N / 2, N - 3 };

		for (int k = 0; k < 3; k++)
			c->aux_layers[k] = def[k] < 0 ? 0 : def[k] >= N ? N - 1 : def[k];
		c->n_aux = 3;
	}
	/* The fused states go to fc in layer order, as the target appends them. */
	for (int i = 1; i < 3; i++)
		for (int k = i; k > 0 && c->aux_layers[k - 1] > c->aux_layers[k]; k--) {
			const int x = c->aux_layers[k];

			c->aux_layers[k] = c->aux_layers[k - 1];
			c->aux_layers[k - 1] = x;
		}
	if (c->max_position_embeddings < tc->max_position_embeddings) {
		if (c->rope.kind == DPS_ROPE_DYNAMIC) {
			/* NTK would rescale past the draft's own context: no fixed frequencies */
			snprintf(err, errlen, "%s: the draft's dynamic rope_scaling holds for %d "
				 "positions, the target's context is %d", dir,
				 c->max_position_embeddings, tc->max_position_embeddings);
			return -DPS_ECONFIG;
		}
		c->max_position_embeddings = tc->max_position_embeddings;
	}
	s->draft = 1;
	s->target_vocab = tc->vocab_size;
	memcpy(s->aux_l, c->aux_layers, sizeof(s->aux_l));
	return 0;
}

/* The draft's fusion columns, hidden_norm and d2t (each draft id's offset to its target id). */
void dps_shard_load_draft_extras(struct dps_shard_loader *L)
{
	struct dps_shard *s = L->s;
	const uint64_t dim = (uint64_t)s->cfg.hidden_size, V = (uint64_t)s->cfg.vocab_size;
	const struct dps_st_tensor *d2t;

	s->fc_w = (int)((3 * dim + (uint64_t)s->par.tp - 1) / (uint64_t)s->par.tp);
	if (s->wt == DPS_WT_Q8) /* column shards on blocks of 32, as the MLP's (load.c) */
		s->fc_w = (s->fc_w + 31) / 32 * 32;
	s->fc = dps_shard_alloc_w(L, DPS_PART_MLP, dim, s->fc_w);
	s->hidden_norm = dps_shard_alloc_part(L, DPS_PART_NORMS, dim);
	if (s->fc && s->hidden_norm) {
		dps_shard_load_cols_of_rank(L, "fc.weight", dim, 3 * dim, s->t, s->fc_w, s->fc);
		dps_shard_load_whole(L, "midlayer.hidden_norm.weight", dim, s->hidden_norm);
	}
	s->d2t = calloc(V, sizeof(int));
	if (!s->d2t) {
		if (!L->rc) {
			L->rc = -ENOMEM;
			snprintf(L->err, L->errlen, "out of memory");
		}
		return;
	}
	d2t = dps_ckpt_find(&L->ck, "d2t", NULL);
	if (!d2t && V != (uint64_t)s->target_vocab && !L->rc) {
		snprintf(L->err, L->errlen, "%s: no 'd2t' tensor, and the draft vocabulary (%llu) is "
			 "not the target's (%d)", L->ck.dir, (unsigned long long)V, s->target_vocab);
		L->rc = -EINVAL;
	}
	if (d2t && !L->rc) {
		float *tmp = malloc(sizeof(float) * V);

		if (!tmp) {
			L->rc = -ENOMEM;
			snprintf(L->err, L->errlen, "out of memory");
			return;
		}
		dps_shard_load_whole(L, "d2t", V, tmp);
		for (uint64_t i = 0; i < V && !L->rc; i++) {
			const double t = (double)i + (double)tmp[i];

			if (!(t >= 0 && t < s->target_vocab)) {
				snprintf(L->err, L->errlen, "%s: d2t maps draft token %llu to %.0f, outside "
					 "the target's vocabulary of %d", L->ck.dir,
					 (unsigned long long)i, t, s->target_vocab);
				L->rc = -EINVAL;
			}
			s->d2t[i] = (int)tmp[i];
		}
		free(tmp);
	}
}

/* Keeps this replica's n rows x (the input of layer l) where an Eagle3 draft fuses them. */
void dps_shard_keep_aux(struct dps_shard *s, int l, const float *x, int n)
{
	const size_t dim = (size_t)s->cfg.hidden_size;

	for (int k = 0; k < s->n_aux; k++)
		if (s->aux_l[k] == l)
			for (int i = 0; i < n; i++)
				memcpy(s->aux + ((size_t)i * 3 + (size_t)k) * dim, x + (size_t)i * dim,
				       sizeof(float) * dim);
}

int dps_shard_set_aux(struct dps_shard *s, const int *aux, char *err, size_t errlen)
{
	for (int k = 0; k < 3; k++)
		if (aux[k] < 0 || aux[k] >= s->cfg.num_hidden_layers) {
			snprintf(err, errlen, "the draft fuses layer %d; the target has %d layers",
				 aux[k], s->cfg.num_hidden_layers);
			return -EINVAL;
		}
	free(s->aux);
	s->aux = calloc((size_t)s->max_rows * 3 * (size_t)s->cfg.hidden_size, sizeof(float));
	if (!s->aux) {
		s->n_aux = 0;
		snprintf(err, errlen, "out of memory for the draft's hidden states");
		return -ENOMEM;
	}
	memcpy(s->aux_l, aux, sizeof(s->aux_l));
	s->n_aux = 3;
	return 0;
}

const float *dps_shard_draft_step(struct dps_shard *d, const struct dps_shard *t,
				  const struct dps_rows *r, const float *hin, int fused,
				  float *hout, int *rcp)
{
	const int n = r->n, dim = d->cfg.hidden_size, cm = d->c[DPS_COMP_MLP];
	const struct dps_shard_layer *w = &d->layers[0];
	const float eps = (float)d->cfg.rms_norm_eps;
	struct dps_comm *col = d->col_c[DPS_COMP_MLP];
	size_t counts[DPS_MAX_WORLD];
	int R = n, first = 0, n_out = 0, rc = 0, dummy;

	if (!rcp)
		rcp = &dummy;
	*rcp = 0;
	DPS_ASSERT(d->draft && n >= 0 && n <= d->max_rows);
	for (int i = 0; i < n; i++)
		DPS_ASSERT(r->tokens[i] >= 0 && r->tokens[i] < t->cfg.vocab_size && r->pos[i] >= 0 &&
			   r->pos[i] < d->max_pos && r->slot[i] < d->num_blocks * d->block_size &&
			   (r->table[i] || r->slot[i] < 0));
	if (!n && cm == 1)
		return d->logits; /* nothing here, and no replica waits for this one */
	d->steps++;
	dps_work(); /* each draft pass is work (the supervisor's deadlock rule) */
	d->cur_prefill = 0;
	d->cur_layer = 0;
	/* The draft MLP column's row counts: replicas draft different amounts. */
	if (cm > 1) {
		int *cnt = d->ids;

		rc = dps_shard_allgather(d, col, DPS_SG_MLP_COL, &n, cnt, 1, DPS_I32);
		if (rc)
			goto fail;
		R = 0;
		for (int q = 0; q < cm; q++) {
			counts[q] = (size_t)cnt[q] * (size_t)dim;
			if (q < d->j[DPS_COMP_MLP])
				first += cnt[q];
			R += cnt[q];
		}
		DPS_ASSERT(R <= d->max_gather);
	}
	if (n) {
		/* The target's token embedding (plain TP shard) into o. */
		dps_shard_lookup(t, t->emb_p, t->t * t->v_tp, t->v_tp, r->tokens, n, d->o);
		rc = dps_shard_allreduce(d, d->tp_c, DPS_SG_TP, d->o, (size_t)n * dim);
		if (rc)
			goto fail;
		/* The residual x: fc over the three fused states (this rank's columns), or the
		 * draft's own previous state. */
		if (fused) {
			const size_t w3 = 3 * (size_t)dim, c0 = (size_t)d->t * (size_t)d->fc_w;
			const size_t cn = c0 >= w3 ? 0 : w3 - c0 < (size_t)d->fc_w ? w3 - c0
										    : (size_t)d->fc_w;

			for (int i = 0; i < n; i++) {
				float *dst = d->fcin + (size_t)i * (size_t)d->fc_w;

				memcpy(dst, hin + (size_t)i * w3 + c0, sizeof(float) * cn);
				memset(dst + cn, 0, sizeof(float) * ((size_t)d->fc_w - cn));
			}
			dps_shard_linear(d, d->x, d->fcin, d->fc, n, dim, d->fc_w);
			rc = dps_shard_allreduce(d, d->tp_c, DPS_SG_TP, d->x, (size_t)n * dim);
			if (rc)
				goto fail;
		} else {
			memcpy(d->x, hin, sizeof(float) * (size_t)n * dim);
		}
		/* Attention over [input_layernorm(embedding), hidden_norm(x)]. */
		for (int i = 0; i < n; i++) {
			float *h = d->h + (size_t)i * 2 * (size_t)dim;

			dps_rmsnorm(h, d->o + (size_t)i * dim, w->attn_norm, dim, eps);
			dps_rmsnorm(h + dim, d->x + (size_t)i * dim, d->hidden_norm, dim, eps);
		}
		dps_shard_attn_prefill(d, 0, r, d->h, d->o);
		rc = dps_shard_allreduce(d, d->tp_c, DPS_SG_TP, d->o, (size_t)n * dim);
		if (rc)
			goto fail;
		for (size_t i = 0; i < (size_t)n * dim; i++)
			d->x[i] += d->o[i];
		for (int i = 0; i < n; i++)
			dps_rmsnorm(d->o + (size_t)i * dim, d->x + (size_t)i * dim, w->ffn_norm, dim,
				    eps);
	}
	/* The MLP over TP x c_draft_mlp: gather the column's rows, reduce, keep mine. */
	if (cm > 1) {
		dps_shard_count(d, DPS_COLL_ALLGATHER, DPS_SG_MLP_COL, (size_t)R * dim * sizeof(float));
		rc = dps_coll_allgatherv(col, d->o, d->h, counts, NULL, DPS_F32);
		if (rc)
			goto fail;
	} else {
		memcpy(d->h, d->o, sizeof(float) * (size_t)n * dim);
	}
	if (R)
		dps_shard_mlp(d, 0, R, d->h, d->o);
	rc = dps_shard_allreduce(d, d->comp_c[DPS_COMP_MLP], cm > 1 ? DPS_SG_MLP_COMP : DPS_SG_TP, d->o,
				 (size_t)R * dim);
	if (rc)
		goto fail;
	for (size_t i = 0; i < (size_t)n * dim; i++)
		d->x[i] += d->o[(size_t)first * dim + i];
	d->cur_layer = -1;
	if (hout)
		memcpy(hout, d->x, sizeof(float) * (size_t)n * dim);
	for (int i = 0; i < n; i++)
		if (!r->want || r->want[i]) {
			dps_rmsnorm(d->h + (size_t)n_out * dim, d->x + (size_t)i * dim, d->final_norm,
				    dim, eps);
			n_out++;
		}
	rc = dps_shard_project(d, d->h, n_out, d->lm_p, d->v_tp, d->tp_c, DPS_SG_TP, 0, n_out, d->logits);
	if (rc)
		goto fail;
	return d->logits;
fail:
	*rcp = rc;
	return NULL;
}


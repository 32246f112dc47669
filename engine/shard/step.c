/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/step.c - one step of the sharded forward pass (see shard.h): the prefill graph
 * (plain TP, the MLP over its component group) and the decode graph of the reference (the
 * embedding and LM-head brackets, _dp_transition around attention and MLP, one all-reduce
 * each), and the pieces both share (the product, the MLP, the vocabulary lookup and
 * projection). Called by the serving engine, bench decode and the tests, every step.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/shard/kv.h"
#include "engine/shard/shard_int.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "shm/wait.h"

void dps_shard_linear_t(struct dps_shard *s, enum dps_wtype t, float *out, const float *x,
			const void *W, int m, int n, int k)
{
	const uint64_t t0 = dps_now_ns();

	dps_linear_w(out, x, W, t, m, n, k);
	dps_work(); /* each product says the rank works, so a long step never looks stalled */
	s->linear_ns += dps_now_ns() - t0;
	s->linear_flops += 2.0 * m * n * k;
	s->linear_bytes += (double)dps_wtype_bytes(t, (size_t)n, k);
}

/* A product through dps_linear_w on W of s->wt, counted in s->linear_ns and s->linear_flops. */
void dps_shard_linear(struct dps_shard *s, float *out, const float *x, const void *W, int m,
		      int n, int k)
{
	dps_shard_linear_t(s, s->wt, out, x, W, m, n, k);
}

/* ---- MLP ------------------------------------------------------------------------------------ */

/* The partial MLP of R rows h (this rank's intermediate shard) into o (R, hidden). */
void dps_shard_mlp(struct dps_shard *s, int l, int R, const float *h, float *o)
{
	const struct dps_shard_layer *w = &s->layers[l];
	const int dim = s->cfg.hidden_size, im = s->im_sh;

	dps_shard_linear(s, s->gu, h, w->w_gate_up, R, 2 * im, dim);
	if (w->b_gate_up)
		dps_add_bias(s->gu, w->b_gate_up, R, 2 * im);
	for (int i = 0; i < R; i++) {
		float *g = s->gu + (size_t)i * 2 * (size_t)im;

		dps_swiglu(g, g + im, im);
		memmove(s->gu + (size_t)i * (size_t)im, g, sizeof(float) * (size_t)im);
	}
	dps_shard_linear(s, o, s->gu, w->w_down, R, dim, im);
	if (w->b_down) /* MLP group rank 0 only: the all-reduce adds it once */
		dps_add_bias(o, w->b_down, R, dim);
}

int dps_shard_coupled(const struct dps_shard *s)
{
	int coupled = s->par.ep;

	/* The draft MLP's size couples only when a draft runs (the engine adds it then). */
	for (int k = 0; k < DPS_COMP_COUNT; k++)
		coupled |= k != DPS_COMP_DRAFT_MLP && s->c[k] > 1;
	return coupled;
}

/* ---- embedding and LM head ------------------------------------------------------------------- */

/* x (n, hidden) = rows of ids found in a vocabulary shard starting at lo (per rows), else 0. */
void dps_shard_lookup(const struct dps_shard *s, const void *table, int lo, int per,
		      const int *ids, int n, float *x)
{
	const int dim = s->cfg.hidden_size;

	for (int i = 0; i < n; i++) {
		const int v = ids[i] - lo;

		if (v >= 0 && v < per && s->wt_emb == DPS_WT_BF16) { /* one row widened, exactly */
			const uint16_t *row = dps_shard_wrow(table, DPS_WT_BF16, (size_t)v, dim);

			for (int c = 0; c < dim; c++)
				x[(size_t)i * dim + c] = dps_bf16_to_f32(row[c]);
		} else if (v >= 0 && v < per && s->wt_emb == DPS_WT_F16) {
			const uint16_t *row = dps_shard_wrow(table, DPS_WT_F16, (size_t)v, dim);

			for (int c = 0; c < dim; c++)
				x[(size_t)i * dim + c] = dps_f16_to_f32(row[c]);
		} else if (v >= 0 && v < per)
			dps_embedding(x + (size_t)i * dim, table, dim, v);
		else
			memset(x + (size_t)i * dim, 0, sizeof(float) * (size_t)dim);
	}
}

/*
 * Logits of rows h (m rows, normed) against a vocabulary shard table (per rows, shard index
 * me of size n shards gathered over comm): lg2 gets every shard for every row; rows
 * [first, first + keep) are assembled into out (keep, vocab).
 */
int dps_shard_project(struct dps_shard *s, const float *h, int m, const void *table, int per,
		      struct dps_comm *comm, int sg, int first, int keep, float *out)
   {
	const int V = s->cfg.vocab_size, nsh = comm ? comm->n : 1;
	int rc;

	dps_shard_linear(s, s->lg, h, table, m, per, s->cfg.hidden_size);
	rc = dps_shard_allgather(s, comm, sg, s->lg, s->lg2, (size_t)m * (size_t)per, DPS_F32);
	if (rc)
		return rc;
	for (int i = 0; i < keep; i++)
		for (int q = 0; q < nsh; q++) {
			const int lo = q * per, n = lo + per <= V ? per : V - lo;

			if (n > 0)
				memcpy(out + (size_t)i * (size_t)V + lo,
				       s->lg2 + ((size_t)q * (size_t)m + (size_t)(first + i)) * (size_t)per,
				       sizeof(float) * (size_t)n);
		}
	return 0;
}

/* ---- the step -------------------------------------------------------------------------------- */

/*
 * The prefill graph: attention, embedding and LM head in plain TP over the TP group (the
 * references' prefill path, which attention_dp_size, embedding_dp_size and lm_head_dp_size do
 * not change); the MLP over its component group, gathering the column's rows with counts.
 */
static const float *step_prefill(struct dps_shard *s, const struct dps_rows *r, int *rcp)
{
	const int n = r->n, *tokens = r->tokens;
	const unsigned char *want = r->want;
	const struct dps_model_config *c = &s->cfg;
	const int dim = c->hidden_size, cm = s->c[DPS_COMP_MLP];
	const float eps = (float)c->rms_norm_eps;
	struct dps_comm *col = s->col_c[DPS_COMP_MLP];
	size_t counts[DPS_MAX_WORLD];
	int R = n, first = 0, n_out = 0, rc;
	int *cnt = s->ids, *moe_cnt = NULL;

	/* The MLP column's row counts (replicas prefill different amounts). */
	if (cm > 1) {
		rc = dps_shard_allgather(s, col, DPS_SG_MLP_COL, &n, cnt, 1, DPS_I32);
		if (rc)
			goto fail;
		R = 0;
		for (int q = 0; q < cm; q++) {
			counts[q] = (size_t)cnt[q] * (size_t)dim;
			if (q < s->j[DPS_COMP_MLP])
				first += cnt[q];
			R += cnt[q];
		}
		/* Every replica must be loaded with the same max_rows (shard.h). */
		DPS_ASSERT(R <= s->max_gather);
	}
	/* The all-gather dispatch meets every replica's rows: their counts, once per step. */
	if (s->moe == DPS_MOE_EP_AG) {
		moe_cnt = s->m_pad;
		rc = dps_shard_allgather(s, s->dp_c, DPS_SG_EP, &n, moe_cnt, 1, DPS_I32);
		if (rc)
			goto fail;
	}
	dps_shard_lookup(s, s->emb_p, s->t * s->v_tp, s->v_tp, tokens, n, s->x);
	rc = dps_shard_allreduce(s, s->tp_c, DPS_SG_TP, s->x, (size_t)n * dim);
	if (rc)
		goto fail;
	for (int l = 0; l < c->num_hidden_layers; l++) {
		const struct dps_shard_layer *w = &s->layers[l];

		s->cur_layer = l;
		if (s->n_aux)
			dps_shard_keep_aux(s, l, s->x, n);
		for (int i = 0; i < n; i++)
			dps_rmsnorm(s->h + (size_t)i * dim, s->x + (size_t)i * dim, w->attn_norm, dim,
				    eps);
		if (n)
			dps_shard_attn_prefill(s, l, r, s->h, s->o);
		rc = dps_shard_allreduce(s, s->tp_c, DPS_SG_TP, s->o, (size_t)n * dim);
		if (rc)
			goto fail;
		for (size_t i = 0; i < (size_t)n * dim; i++)
			s->x[i] += s->o[i];
		if (dps_shard_moe_layer(s, l) && s->moe == DPS_MOE_EP_A2A) {
			/* The rows stay sequence parallel over TP: no MLP column gather. */
			rc = dps_shard_moe_a2a(s, l, s->tp_c, DPS_SG_TP, n, s->x, NULL, s->x);
			if (rc)
				goto fail;
			continue;
		}
		/* The MLP over TP x c_mlp: gather the column's rows, reduce, keep mine. */
		for (int i = 0; i < n; i++)
			dps_rmsnorm(s->o + (size_t)i * dim, s->x + (size_t)i * dim, w->ffn_norm, dim,
				    eps);
		if (dps_shard_moe_layer(s, l) && s->moe == DPS_MOE_EP_AG) {
			rc = dps_shard_moe_ag(s, l, n, s->o, s->h, moe_cnt, NULL);
			if (rc)
				goto fail;
			for (size_t i = 0; i < (size_t)n * dim; i++)
				s->x[i] += s->h[i];
			continue;
		}
		if (cm > 1) {
			dps_shard_count(s, DPS_COLL_ALLGATHER, DPS_SG_MLP_COL, (size_t)R * dim * sizeof(float));
			rc = dps_coll_allgatherv(col, s->o, s->h, counts, NULL, DPS_F32);
			if (rc)
				goto fail;
		} else {
			memcpy(s->h, s->o, sizeof(float) * (size_t)n * dim);
		}
		if (R && dps_shard_moe_layer(s, l))
			dps_shard_moe_tp(s, l, R, s->h, s->o);
		else if (R)
			dps_shard_mlp(s, l, R, s->h, s->o);
		rc = dps_shard_allreduce(s, s->comp_c[DPS_COMP_MLP], DPS_SG_MLP_COMP, s->o, (size_t)R * dim);
		if (rc)
			goto fail;
		for (size_t i = 0; i < (size_t)n * dim; i++)
			s->x[i] += s->o[(size_t)first * dim + i];
	}
	s->cur_layer = -1;
	for (int i = 0; i < n; i++)
		if (!want || want[i]) {
			dps_rmsnorm(s->h + (size_t)n_out * dim, s->x + (size_t)i * dim, s->final_norm,
				    dim, eps);
			n_out++;
		}
	rc = dps_shard_project(s, s->h, n_out, s->lm_p, s->v_tp, s->tp_c, DPS_SG_TP, 0, n_out, s->logits);
	if (rc)
		goto fail;
	return s->logits;
fail:
	*rcp = rc;
	return NULL;
}

/*
 * The decode graph, the references' "Full Model Flow (Decode)": the embedding bracket
 * (all-gather input_ids over the embedding column, the vocabulary shard, the reduce), then per
 * layer _dp_transition(mlp -> attn), attention with one all-reduce over the attention
 * component group, _dp_transition(attn -> mlp), the MLP with one all-reduce over its group;
 * then the LM-head bracket (local rows, all-gather over its column, the vocabulary shard).
 */
static const float *step_decode(struct dps_shard *s, const struct dps_rows *r, int *rcp)
{
	const int B = r->n, *tokens = r->tokens;
	const unsigned char *want = r->want;
	const struct dps_model_config *c = &s->cfg;
	const int dim = c->hidden_size;
	const int ce = s->c[DPS_COMP_EMB], ca = s->c[DPS_COMP_ATTN], cm = s->c[DPS_COMP_MLP];
	const int cl = s->c[DPS_COMP_LM_HEAD];
	const float eps = (float)c->rms_norm_eps;
	const int Ra = B * ca, Rm = B * cm;
	int n_out = 0, rc, cur = cm; /* the column size the residual s->x is gathered over */

	int *pad = NULL;

	DPS_ASSERT(B * ce <= s->max_gather && Ra <= s->max_gather && Rm <= s->max_gather &&
		   B * cl <= s->max_gather);
	if (s->moe == DPS_MOE_EP_AG || s->moe == DPS_MOE_EP_A2A) {
		/*
		 * Which rows are padding (a decode row that writes no KV slot): they choose no
		 * expert. The all-gather dispatch meets the rows of the DP group (their flags are
		 * gathered over it), the all-to-all one those of the attention column.
		 */
		int *mine = s->m_pad + (size_t)s->par.dp * (size_t)s->max_rows;

		for (int i = 0; i < B; i++)
			mine[i] = r->slot[i] < 0;
		pad = s->m_pad;
		if (s->moe == DPS_MOE_EP_AG)
			rc = dps_shard_allgather(s, s->dp_c, DPS_SG_EP, mine, pad, (size_t)B, DPS_I32);
		else
			rc = dps_shard_allgather(s, s->col_c[DPS_COMP_ATTN], DPS_SG_ATTN_COL, mine, pad, (size_t)B,
						 DPS_I32);
		if (rc)
			goto fail;
	}
	/* Embedding bracket: gather the ids over the column, look up the shard, reduce. */
	rc = dps_shard_allgather(s, s->col_c[DPS_COMP_EMB], DPS_SG_EMB_COL, tokens, s->ids, (size_t)B,
				 DPS_I32);
	if (rc)
		goto fail;
	dps_shard_lookup(s, s->emb_d, dps_shard_comp_rank(s, DPS_COMP_EMB) * s->v_emb, s->v_emb,
			 s->ids, B * ce, s->h);
	rc = dps_shard_allreduce(s, s->comp_c[DPS_COMP_EMB], ce > 1 ? DPS_SG_EMB_COMP : DPS_SG_TP, s->h,
				 (size_t)B * ce * dim);
	if (rc)
		goto fail;
	rc = dps_dp_transition(s, s->h, s->x, B, dim, ce, cm, s->col_c[DPS_COMP_MLP],
			       DPS_SG_MLP_COL);
	if (rc)
		goto fail;
	for (int l = 0; l < c->num_hidden_layers; l++) {
		const struct dps_shard_layer *w = &s->layers[l];
		float *xa = s->o; /* x at the attention's size */

		s->cur_layer = l;
		if (s->n_aux)
			dps_shard_keep_aux(s, l, s->x + (size_t)(s->d % cur) * (size_t)B * (size_t)dim, B);
		rc = dps_dp_transition(s, s->x, xa, B, dim, cur, ca, s->col_c[DPS_COMP_ATTN],
				       DPS_SG_ATTN_COL);
		if (rc)
			goto fail;
		for (int i = 0; i < Ra; i++)
			dps_rmsnorm(s->h + (size_t)i * dim, xa + (size_t)i * dim, w->attn_norm, dim,
				    eps);
		if (ca > 1) {
			/* xa is kept in s->o: the attention output goes to s->x as scratch. */
			rc = dps_shard_attn_decode(s, l, r, s->h, s->x);
			if (rc)
				goto fail;
		} else {
			dps_shard_attn_prefill(s, l, r, s->h, s->x);
		}
		rc = dps_shard_allreduce(s, s->comp_c[DPS_COMP_ATTN], ca > 1 ? DPS_SG_ATTN_COMP : DPS_SG_TP,
					 s->x, (size_t)Ra * dim);
		if (rc)
			goto fail;
		for (size_t i = 0; i < (size_t)Ra * dim; i++)
			xa[i] += s->x[i];
		if (dps_shard_moe_layer(s, l) && s->moe == DPS_MOE_EP_A2A) {
			/* Sequence parallel over the ranks holding these rows: no _dp_transition. */
			rc = dps_shard_moe_a2a(s, l, ca > 1 ? s->comp_c[DPS_COMP_ATTN] : s->tp_c,
					       ca > 1 ? DPS_SG_ATTN_COMP : DPS_SG_TP, Ra, xa, pad, s->x);
			if (rc)
				goto fail;
			cur = ca;
			continue;
		}
		rc = dps_dp_transition(s, xa, s->x, B, dim, ca, cm, s->col_c[DPS_COMP_MLP],
				       DPS_SG_MLP_COL);
		if (rc)
			goto fail;
		cur = cm;
		for (int i = 0; i < Rm; i++)
			dps_rmsnorm(s->h + (size_t)i * dim, s->x + (size_t)i * dim, w->ffn_norm, dim,
				    eps);
		if (dps_shard_moe_layer(s, l) && s->moe == DPS_MOE_EP_AG) {
			DPS_ASSERT(cm == 1); /* dps_par_cfg_check */
			rc = dps_shard_moe_ag(s, l, B, s->h, s->o, NULL, pad);
		} else {
			if (dps_shard_moe_layer(s, l))
				dps_shard_moe_tp(s, l, Rm, s->h, s->o);
			else
				dps_shard_mlp(s, l, Rm, s->h, s->o);
			rc = dps_shard_allreduce(s, s->comp_c[DPS_COMP_MLP], cm > 1 ? DPS_SG_MLP_COMP : DPS_SG_TP,
						 s->o, (size_t)Rm * dim);
		}
		if (rc)
			goto fail;
		for (size_t i = 0; i < (size_t)Rm * dim; i++)
			s->x[i] += s->o[i];
	}
	s->cur_layer = -1;
	/* LM head bracket: my rows, norm, gather over the column, project the shard, my rows. */
	for (int i = 0; i < B; i++)
		dps_rmsnorm(s->h + (size_t)i * dim,
			    s->x + ((size_t)(s->d % cur) * (size_t)B + (size_t)i) * dim,
			    s->final_norm, dim, eps);
	rc = dps_shard_allgather(s, s->col_c[DPS_COMP_LM_HEAD], DPS_SG_LM_COL, s->h, s->o, (size_t)B * dim,
				 DPS_F32);
	if (rc)
		goto fail;
	rc = dps_shard_project(s, s->o, B * cl, s->lm_d, s->v_lm, s->comp_c[DPS_COMP_LM_HEAD],
			       cl > 1 ? DPS_SG_LM_COMP : DPS_SG_TP, s->j[DPS_COMP_LM_HEAD] * B, B, s->logits);
	if (rc)
		goto fail;
	/* Pack the wanted rows. */
	for (int i = 0; i < B; i++)
		if (!want || want[i]) {
			if (n_out != i)
				memmove(s->logits + (size_t)n_out * c->vocab_size,
					s->logits + (size_t)i * c->vocab_size,
					sizeof(float) * (size_t)c->vocab_size);
			n_out++;
		}
	return s->logits;
fail:
	*rcp = rc;
	return NULL;
}

const float *dps_shard_step_rows(struct dps_shard *s, int prefill, const struct dps_rows *r,
				 int *rc)
{
	int dummy;

	if (!rc)
		rc = &dummy;
	*rc = 0;
	if (prefill && s->decode_only) {
		/* It holds no prefill layout (dps_shard_opts.decode_only): a caller's bug. */
		*rc = -EINVAL;
		return NULL;
	}
	DPS_ASSERT(r->n >= 0 && r->n <= s->max_rows);
	for (int i = 0; i < r->n; i++)
		DPS_ASSERT(r->tokens[i] >= 0 && r->tokens[i] < s->cfg.vocab_size && r->pos[i] >= 0 &&
			   r->pos[i] < s->max_pos &&
			   r->slot[i] < s->num_blocks * s->block_size &&
			   (r->table[i] || r->slot[i] < 0));
	s->steps++;
	s->cur_prefill = prefill;
	s->cur_layer = -1;
	return prefill ? step_prefill(s, r, rc) : step_decode(s, r, rc);
}

const float *dps_shard_step(struct dps_shard *s, int prefill, int n, const int *tokens,
			    const int *pos, const int *seq, const unsigned char *want, int *rc)
{
	struct dps_rows r = { n, tokens, pos, s->rows_slot, (const int *const *)s->rows_table, want };

	/* Sequence k owns blocks [k * bps, (k + 1) * bps): its table is that run. */
	DPS_ASSERT(n >= 0 && n <= s->max_rows);
	for (int i = 0; i < n; i++) {
		DPS_ASSERT(seq[i] < s->max_seqs && pos[i] >= 0 && pos[i] < s->max_pos);
		s->rows_table[i] = seq[i] >= 0 ? s->seq_tables + (size_t)seq[i] * (size_t)s->bps : NULL;
		s->rows_slot[i] = seq[i] >= 0 ? dps_kv_slot(s->rows_table[i], s->block_size, pos[i])
					      : DPS_PAD_SLOT;
	}
	return dps_shard_step_rows(s, prefill, &r, rc);
}

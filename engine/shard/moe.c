/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/moe.c - mixture-of-experts layers on the shards (see shard.h): routing, every
 * expert run once on the rows that chose it, and the three forms: experts sharded like the MLP,
 * expert parallelism by all-gather + reduce-scatter, and by all-to-all-v. Called by step.c
 * once per MoE layer of every step.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "common/dps.h"
#include "engine/shard/shard_int.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/mxfp4.h"
#include "kernels/pool.h"


int dps_shard_moe_layer(const struct dps_shard *s, int l)
{
	return s->moe != DPS_MOE_NONE && dps_cfg_layer_moe(&s->cfg, l);
}


/*
 * Routes n normed rows h: each row's k experts into s->m_e and their weights into s->m_w. A
 * padding row (pad[i], pad may be NULL) chooses no expert (-1): its output is never used.
 */
static void moe_route(struct dps_shard *s, const struct dps_shard_layer *w, int n, const float *h,
		      const int *pad)
{
	const int E = s->cfg.num_local_experts, k = s->cfg.num_experts_per_tok;

	if (!n)
		return;
	/* the router of s->wt_emb (never quantized, as llama.cpp's), its bias f32 */
	s->moe_bytes += dps_wtype_bytes(s->wt_emb, (size_t)E, s->cfg.hidden_size) +
			(uint64_t)E * sizeof(float);
	dps_shard_linear_t(s, s->wt_emb, s->m_lg, h, w->router, n, E, s->cfg.hidden_size);
	for (int i = 0; i < n; i++) {
		float *lg = s->m_lg + (size_t)i * (size_t)E;

		for (int e = 0; e < E; e++)
			lg[e] += w->router_bias[e];
		dps_moe_route(lg, E, k, s->m_e + (size_t)i * (size_t)k, s->m_w + (size_t)i * (size_t)k);
		if (pad && pad[i])
			for (int j = 0; j < k; j++)
				s->m_e[(size_t)i * (size_t)k + (size_t)j] = -1;
	}
}

/* Whether local expert i's gate and up are MXFP4 (its down is read by its own pointer), and
 * the bytes of its two products, as experts_run and experts_par count them. */
static int expert_mx(const struct dps_shard_layer *w, int i)
{
	return w->exp_gu_q && w->exp_gu_q[i];
}

static uint64_t expert_bytes(const struct dps_shard *s, const struct dps_shard_layer *w, int i)
{
	const int dim = s->cfg.hidden_size, im = s->im_e;

	return expert_mx(w, i) ? 3 * (uint64_t)im * (uint64_t)dim * 17 / 32
			       : dps_wtype_bytes(s->wt, 2 * (size_t)im, dim) +
					 dps_wtype_bytes(s->wt, (size_t)dim, im);
}

/*
 * The rows of the nk items (row q / k of x, stride ldx) that chose global expert e, gathered
 * into gather (rows of dim) with their item indices in ix; returns how many (at most max).
 */
static int gather_rows(const float *x, size_t ldx, const int *re, int nk, int k, int e, int dim,
		       float *gather, int *ix, int max)
{
	int cnt = 0;

	for (int q = 0; q < nk; q++)
		if (re[q] == e) {
			DPS_ASSERT(cnt < max);
			memcpy(gather + (size_t)cnt * (size_t)dim, x + (size_t)(q / k) * ldx,
			       sizeof(float) * (size_t)dim);
			ix[cnt++] = q;
		}
	return cnt;
}

/*
 * Local expert i on cnt gathered rows: gate and up, their bias, GPT-OSS's clamped SwiGLU, down
 * and its bias (on the rank that adds it, load_moe.c); y (cnt, hidden) gets the outputs, gu
 * (cnt, 2 im_e) is scratch. here: the products on the calling thread alone (a whole-expert
 * task, INT8 weights), else over the rank's pool; ns (NULL in a task) gets the products' time.
 */
static void expert_rows(struct dps_shard *s, const struct dps_shard_layer *w, int i,
			const float *gather, int cnt, float *gu, float *y, int here, uint64_t *ns)
{
	const int dim = s->cfg.hidden_size, im = s->im_e;
	uint64_t t0 = dps_now_ns();

	if (expert_mx(w, i))
		(here ? dps_linear_mxfp4_q8_here
		      : s->wt == DPS_WT_Q8 ? dps_linear_mxfp4_q8 : dps_linear_mxfp4)(
			gu, gather, w->exp_gu_q[i], w->exp_gu_s[i], cnt, 2 * im, dim);
	else if (here)
		dps_linear_q8_here(gu, gather, w->exp_gu[i], cnt, 2 * im, dim);
	else
		dps_shard_linear(s, gu, gather, w->exp_gu[i], cnt, 2 * im, dim);
	if (ns)
		*ns += dps_now_ns() - t0;
	if (w->exp_gu_b)
		dps_add_bias(gu, w->exp_gu_b + (size_t)i * 2 * (size_t)im, cnt, 2 * im);
	for (int r = 0; r < cnt; r++) {
		float *g = gu + (size_t)r * 2 * (size_t)im;

		dps_swiglu_clamped(g, g + im, im, (float)s->cfg.swiglu_limit); /* limit 7.0 */
		memmove(gu + (size_t)r * (size_t)im, g, sizeof(float) * (size_t)im);
	}
	t0 = dps_now_ns();
	if (w->exp_dn_q && w->exp_dn_q[i])
		(here ? dps_linear_mxfp4_q8_here
		      : s->wt == DPS_WT_Q8 ? dps_linear_mxfp4_q8 : dps_linear_mxfp4)(
			y, gu, w->exp_dn_q[i], w->exp_dn_s[i], cnt, dim, im);
	else if (here)
		dps_linear_q8_here(y, gu, w->exp_dn[i], cnt, dim, im);
	else
		dps_shard_linear(s, y, gu, w->exp_dn[i], cnt, dim, im);
	if (ns)
		*ns += dps_now_ns() - t0;
	if (w->exp_dn_b)
		dps_add_bias(y, w->exp_dn_b + (size_t)i * (size_t)dim, cnt, dim);
}

/* Item q's expert output y into its row of out: copied (no weights, k == 1) or added weighted. */
static void add_item(float *out, const float *y, const float *rw, int q, int k, int dim)
{
	float *o = out + (size_t)(q / k) * (size_t)dim;

	if (!rw) {
		memcpy(o, y, sizeof(float) * (size_t)dim);
		return;
	}
	for (int d = 0; d < dim; d++)
		o[d] += rw[q] * y[d];
}

/*
 * Whole-expert tasks: decode of a few rows with INT8 weights (--quantization int8; GPT-OSS's
 * experts MXFP4, others INT8), at least as many experts met as the rank has threads. Each pool thread runs whole experts
 * (gather, gate and up, bias, SwiGLU, down, bias) on its own scratch and activations, so a
 * layer's experts cost one fork and join instead of two a product, and each thread reads
 * whole matrices instead of a quarter of each (bench-gpt-oss -q int8 on two threads: 11% of
 * the samples were threads waiting at the joins). Every output is the product the split
 * gives (a row's sum does not depend on the slices), and the outputs are added to the rows
 * afterwards in experts_run's order, so the bits are those of the serial loop.
 */
#define PAR_ITEMS 16 /* (row, choice) items at most */

struct par_job {
	struct dps_shard *s;
	const struct dps_shard_layer *w;
	const float *x;
	size_t ldx;
	const int *re;
	int k, nk, nact;
	int act[PAR_ITEMS]; /* the local experts met, ascending */
	float *outs;        /* (nk, hidden): each item's expert output */
	_Atomic uint64_t *run_ns; /* the tasks' time, summed over the threads */
};

static void par_task(void *arg, int task, int tid)
{
	const struct par_job *j = arg;
	struct dps_shard *s = j->s;
	const int i = j->act[task], dim = s->cfg.hidden_size, im = s->im_e;
	float *gather = s->m_par + (size_t)tid * PAR_ITEMS * ((size_t)dim + 2 * (size_t)im);
	float *gu = gather + (size_t)PAR_ITEMS * (size_t)dim;
	const uint64_t t0 = dps_now_ns();
	int ix[PAR_ITEMS];
	const int cnt = gather_rows(j->x, j->ldx, j->re, j->nk, j->k, s->e_lo + i, dim, gather, ix,
				    PAR_ITEMS);

	/* the outputs into gather (free once gate and up are done), then each to its place */
	expert_rows(s, j->w, i, gather, cnt, gu, gather, 1, NULL);
	for (int r = 0; r < cnt; r++)
		memcpy(j->outs + (size_t)ix[r] * (size_t)dim, gather + (size_t)r * (size_t)dim,
		       sizeof(float) * (size_t)dim);
	atomic_fetch_add_explicit(j->run_ns, dps_now_ns() - t0, memory_order_relaxed);
}

/* experts_run by whole-expert tasks when they apply (see above): 1 when done, 0 when not. */
static int experts_par(struct dps_shard *s, const struct dps_shard_layer *w, int n,
		       const float *x, size_t ldx, const int *re, const float *rw, int k,
		       float *out)
{
	struct dps_pool *pool = dps_gemm_pool();
	const int nt = dps_pool_size(pool), dim = s->cfg.hidden_size, im = s->im_e;
	_Atomic uint64_t run_ns = 0;
	struct par_job j = { s, w, x, ldx, re, k, n * k, 0, { 0 }, NULL, &run_ns };
	double q8_flops = 0.0; /* of the INT8 experts, counted as dps_shard_linear counts */
	uint64_t t0;

	if (nt < 2 || n * k > PAR_ITEMS || s->wt != DPS_WT_Q8)
		return 0;
	for (int i = 0; i < s->e_n; i++) {
		int met = 0;

		for (int q = 0; q < n * k; q++)
			met += re[q] == s->e_lo + i;
		if (!met)
			continue;
		if (!expert_mx(w, i))
			q8_flops += 2.0 * met * 3.0 * im * dim;
		j.act[j.nact++] = i;
	}
	if (j.nact < nt)
		return 0; /* a thread would have no expert: the products split instead */
	if (s->m_par_nt != nt) { /* per thread of the pool as it is now */
		free(s->m_par);
		s->m_par_nt = 0;
		s->m_par = malloc(sizeof(float) * PAR_ITEMS *
				  ((size_t)nt * ((size_t)dim + 2 * (size_t)im) + (size_t)dim));
		if (!s->m_par)
			return 0;
		s->m_par_nt = nt;
	}
	j.outs = s->m_par + (size_t)nt * PAR_ITEMS * ((size_t)dim + 2 * (size_t)im);
	for (int a = 0; a < j.nact; a++) { /* counted as the serial loop counts them */
		const uint64_t eb = expert_bytes(s, w, j.act[a]);

		s->moe_bytes += eb;
		s->exp_bytes += eb;
		if (!expert_mx(w, j.act[a]))
			s->linear_bytes += (double)eb; /* (dps_shard_linear's count) */
	}
	t0 = dps_now_ns();
	dps_pool_run(pool, j.nact, par_task, &j);
	t0 = dps_now_ns() - t0;
	s->exp_ns += t0; /* (with the SwiGLU and biases between the products) */
	s->exp_thr_ns += (uint64_t)nt * t0;
	s->exp_run_ns += atomic_load_explicit(&run_ns, memory_order_relaxed);
	if (q8_flops > 0.0) {
		s->linear_ns += t0;
		s->linear_flops += q8_flops;
	}
	dps_work(); /* as every product says: the rank works */
	s->exp_par++;
	for (int a = 0; a < j.nact; a++) /* experts_run's order */
		for (int q = 0; q < n * k; q++)
			if (re[q] == s->e_lo + j.act[a])
				add_item(out, j.outs + (size_t)q * (size_t)dim, rw, q, k, dim);
	return 1;
}

/*
 * Runs this rank's experts (its im_e rows of each) on n rows x (row stride ldx), each row with
 * k choices re[i*k + j] (global expert ids; others are skipped): every expert once, on the rows
 * that chose it, in ascending order. With weights rw, out row i += rw[i*k+j] * expert(x_i);
 * without (k == 1), out row i = expert(x_i) for the rows whose expert is here.
 */
static void experts_run(struct dps_shard *s, const struct dps_shard_layer *w, int n,
			const float *x, size_t ldx, const int *re, const float *rw, int k, float *out)
{
	const int dim = s->cfg.hidden_size;

	if (experts_par(s, w, n, x, ldx, re, rw, k, out))
		return;
	for (int i = 0; i < s->e_n; i++) {
		const int cnt = gather_rows(x, ldx, re, n * k, k, s->e_lo + i, dim, s->m_gather,
					    s->m_ix, s->moe_rows);

		if (!cnt)
			continue;
		const uint64_t eb = expert_bytes(s, w, i);

		s->moe_bytes += eb;
		s->exp_bytes += eb;
		expert_rows(s, w, i, s->m_gather, cnt, s->m_gu, s->m_eout, 0, &s->exp_ns);
		for (int r = 0; r < cnt; r++)
			add_item(out, s->m_eout + (size_t)r * (size_t)dim, rw, s->m_ix[r], k, dim);
	}
}

/* Without expert parallelism: the partial MoE output (this rank's slice of every expert). */
void dps_shard_moe_tp(struct dps_shard *s, int l, int R, const float *h, float *o)
{
	const struct dps_shard_layer *w = &s->layers[l];

	DPS_ASSERT(R <= s->moe_route);
	memset(o, 0, sizeof(float) * (size_t)R * (size_t)s->cfg.hidden_size);
	moe_route(s, w, R, h, NULL);
	experts_run(s, w, R, h, (size_t)s->cfg.hidden_size, s->m_e, s->m_w,
		    s->cfg.num_experts_per_tok, o);
}

/*
 * EP, all-gather + reduce-scatter: this replica's n normed rows h (the same on every rank of
 * the replica); o (n, hidden) gets the whole MoE output of those rows. cnt: every replica's
 * row count (NULL: all n, a decode step); pad: which of the gathered rows are padding.
 */
int dps_shard_moe_ag(struct dps_shard *s, int l, int n, const float *h, float *o, const int *cnt,
		     const int *pad)
   {
	const struct dps_shard_layer *w = &s->layers[l];
	const int dim = s->cfg.hidden_size, dp = s->par.dp;
	struct dps_comm *col = s->dp_c;
	size_t counts[DPS_MAX_WORLD];
	int R = 0, rc;

	for (int q = 0; q < dp; q++) {
		const int m = cnt ? cnt[q] : n;

		counts[q] = (size_t)m * (size_t)dim;
		R += m;
	}
	DPS_ASSERT(R <= s->moe_route);
	if (dp > 1) {
		if (R) {
			dps_shard_count(s, DPS_COLL_ALLGATHER, DPS_SG_EP, (size_t)R * dim * sizeof(float));
			rc = dps_coll_allgatherv(col, h, s->m_h, counts, NULL, DPS_F32);
			if (rc)
				return rc;
		}
	} else {
		memcpy(s->m_h, h, sizeof(float) * (size_t)n * (size_t)dim);
	}
	memset(s->m_y, 0, sizeof(float) * (size_t)R * (size_t)dim);
	moe_route(s, w, R, s->m_h, pad);
	experts_run(s, w, R, s->m_h, (size_t)dim, s->m_e, s->m_w, s->cfg.num_experts_per_tok,
		    s->m_y);
	if (dp > 1) {
		if (R) {
			dps_shard_count(s, DPS_COLL_REDUCESCATTER, DPS_SG_EP, (size_t)R * dim * sizeof(float));
			rc = dps_coll_reducescatterv(col, s->m_y, o, counts, DPS_F32);
			if (rc)
				return rc;
		}
	} else {
		memcpy(o, s->m_y, sizeof(float) * (size_t)n * (size_t)dim);
	}
	return dps_shard_allreduce(s, s->tp_c, DPS_SG_TP, o, (size_t)n * (size_t)dim);
}

/*
 * EP, all-to-all-v: x (R rows, the residual, the same on every member of group G) becomes x +
 * MoE(norm(x)) in out. Member me of G takes rows [R*me/n, R*(me+1)/n), sends each of its
 * (row, choice) items to the EP rank holding the expert, gets the expert outputs back, adds
 * them in the router's order, and the members' rows are all-gathered over G.
 */
int dps_shard_moe_a2a(struct dps_shard *s, int l, struct dps_comm *G, int sg, int R, const float *x,
		      const int *pad, float *out)
   {
	const struct dps_shard_layer *w = &s->layers[l];
	const int dim = s->cfg.hidden_size, k = s->cfg.num_experts_per_tok, ep = s->ep_n;
	const int gn = G ? G->n : 1, me = G ? G->me : 0;
	const int lo = (int)((long)R * me / gn), hi = (int)((long)R * (me + 1) / gn), m = hi - lo;
	const size_t item = (size_t)dim + 1;
	struct dps_comm *world = s->w ? s->w->world_c : NULL;
	size_t sc[DPS_MAX_WORLD], rcn[DPS_MAX_WORLD], at[DPS_MAX_WORLD];
	int cnt[DPS_MAX_WORLD], cin[DPS_MAX_WORLD], items = 0, sent = 0, rc;
	float *z = s->m_y;

	DPS_ASSERT(ep >= 1 && ep <= DPS_MAX_WORLD && (!world || world->n == ep) &&
		   m <= s->moe_route);
	for (int i = 0; i < m; i++)
		dps_rmsnorm(s->m_h + (size_t)i * dim, x + (size_t)(lo + i) * dim, w->ffn_norm, dim,
			    (float)s->cfg.rms_norm_eps);
	moe_route(s, w, m, s->m_h, pad ? pad + lo : NULL);
	/* Items by destination rank, in (row, choice) order within each; padding sends none. */
	memset(cnt, 0, sizeof(int) * (size_t)ep);
	for (int q = 0; q < m * k; q++)
		if (s->m_e[q] >= 0)
			cnt[s->m_e[q] / s->e_per]++;
	for (int p = 0, a = 0; p < ep; a += cnt[p], p++)
		at[p] = (size_t)a;
	for (int q = 0; q < m * k; q++) {
		const int e = s->m_e[q];
		float *it;

		if (e < 0)
			continue;
		it = s->m_send + at[e / s->e_per] * item;
		s->m_pos[q] = (int)at[e / s->e_per]++;
		memcpy(it, s->m_h + (size_t)(q / k) * dim, sizeof(float) * (size_t)dim);
		it[dim] = (float)e;
	}
	/* How many items each rank receives from each. */
	for (int p = 0; p < ep; p++)
		sc[p] = rcn[p] = 1;
	if (world) {
		dps_shard_count(s, DPS_COLL_ALLTOALL, DPS_SG_EP, (size_t)ep * sizeof(int));
		rc = dps_coll_alltoallv(world, cnt, sc, NULL, cin, rcn, NULL, DPS_I32);
		if (rc)
			return rc;
	} else {
		cin[0] = cnt[0];
	}
	for (int p = 0; p < ep; p++) {
		sc[p] = (size_t)cnt[p] * item;
		rcn[p] = (size_t)cin[p] * item;
		items += cin[p];
		sent += cnt[p];
	}
	DPS_ASSERT(items <= s->moe_items);
	if (world) {
		dps_shard_count(s, DPS_COLL_ALLTOALL, DPS_SG_EP, (size_t)sent * item * sizeof(float));
		rc = dps_coll_alltoallv(world, s->m_send, sc, NULL, s->m_recv, rcn, NULL, DPS_F32);
		if (rc)
			return rc;
	} else {
		memcpy(s->m_recv, s->m_send, sizeof(float) * (size_t)items * item);
	}
	/* The received items, one expert each, computed and returned in arrival order. */
	for (int i = 0; i < items; i++)
		s->m_e2[i] = (int)s->m_recv[(size_t)i * item + (size_t)dim];
	experts_run(s, w, items, s->m_recv, item, s->m_e2, NULL, 1, s->m_ret);
	for (int p = 0; p < ep; p++) {
		sc[p] = (size_t)cin[p] * (size_t)dim;
		rcn[p] = (size_t)cnt[p] * (size_t)dim;
	}
	if (world) {
		dps_shard_count(s, DPS_COLL_ALLTOALL, DPS_SG_EP, (size_t)items * dim * sizeof(float));
		rc = dps_coll_alltoallv(world, s->m_ret, sc, NULL, s->m_send, rcn, NULL, DPS_F32);
		if (rc)
			return rc;
	} else {
		memcpy(s->m_send, s->m_ret, sizeof(float) * (size_t)items * (size_t)dim);
	}
	/* Combine: the residual plus the k outputs in the router's order (as on one rank). */
	for (int i = 0; i < m; i++) {
		float *zi = z + (size_t)i * dim;

		memcpy(zi, x + (size_t)(lo + i) * dim, sizeof(float) * (size_t)dim);
		for (int j = 0; j < k && s->m_e[(size_t)i * k] >= 0; j++) {
			const float wt = s->m_w[(size_t)i * k + (size_t)j];
			const float *y = s->m_send + (size_t)s->m_pos[(size_t)i * k + (size_t)j] * dim;

			for (int d = 0; d < dim; d++)
				zi[d] += wt * y[d];
		}
	}
	if (gn == 1) {
		memcpy(out, z, sizeof(float) * (size_t)m * (size_t)dim);
		return 0;
	}
	for (int q = 0; q < gn; q++)
		sc[q] = (size_t)((long)R * (q + 1) / gn - (long)R * q / gn) * (size_t)dim;
	dps_shard_count(s, DPS_COLL_ALLGATHER, sg, (size_t)R * dim * sizeof(float));
	return dps_coll_allgatherv(G, z, out, sc, NULL, DPS_F32);
}


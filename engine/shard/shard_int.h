/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/shard_int.h - what the files of engine/shard/ share and nothing outside sees
 * (as SQLite's btreeInt.h): a layer's weights, the loader with its rank-override reads, and
 * the pieces of the forward pass each file lends the others. The public face is shard.h.
 *
 *   load.c   geometry, dps_shard_load and dps_shard_free
 *   weights.c  the linear weights' type (--dtype), allocation and rank-override loaders
 *   load_moe.c  a MoE layer's router and experts (GPT-OSS's layout, MXFP4 kept)
 *   kv.c     the paged KV cache: layout, budget, blocks (kv.h, also used by engine/serve/)
 *   coll.c   the counted collectives and _dp_transition
 *   attn.c   attention, prefill and decode forms
 *   moe.c    mixture-of-experts layers and their dispatches
 *   draft.c  the Eagle3 draft
 *   step.c   the two graphs, and the product, MLP, lookup and projection they share
 */
#ifndef DPS_ENGINE_SHARD_SHARD_INT_H
#define DPS_ENGINE_SHARD_SHARD_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/ckpt.h"
#include "engine/shard/shard.h"

/* One decoder layer's weights as this rank holds them. */
struct dps_shard_layer {
	float *attn_norm, *ffn_norm; /* (hidden) each */
	/* The linear weights, of s->wt (f32, BF16 or INT8): */
	void *wqkv_p;    /* prefill (plain TP): q (hq_t heads), k and v (nkv_t heads) x qkv_in */
	void *wo_p;      /* (hidden, hq_t * hd) */
	void *wq_d;      /* decode, c_attn > 1: q of the effective rank's hq_e heads [+ k, v] */
	void *wo_d;      /* (hidden, hq_e * hd) */
	/* A decode-only rank (dps_shard_opts.decode_only) with c_attn > 1 and K/V by TP rank:
	 * the K and V rows of wqkv_p alone, which it then does not hold (nkv_t heads each). */
	void *wkv_d;     /* (2 * nkv_t * hd, hidden) */
	void *w_gate_up; /* (2 * im_sh, hidden): gate rows then up rows */
	void *w_down;    /* (hidden, im_sh) */
	/* MoE layers: router (E, hidden) of wt_emb and bias (E); expert e_lo + i: exp_gu[i]
	 * (2 * im_e, hidden) gate rows then up rows, exp_dn[i] (hidden, im_e), both of wt. */
	void *router;
	float *router_bias;
	void **exp_gu, **exp_dn;
	/*
	 * What the families add (NULL when the model has none). A bias of a row-sharded product
	 * is sharded with its rows; the bias of a product whose partial sums are all-reduced is
	 * held (and added before the reduction) by group rank 0 only, as vLLM's RowParallelLinear.
	 */
	float *bqkv_p;   /* (hq_t + 2 nkv_t) * hd: the biases of wqkv_p's rows */
	float *bq_d;     /* (hq_e + 2 nkv_e) * hd: of wq_d's rows */
	float *bkv_d;    /* 2 nkv_t * hd: of wkv_d's rows */
	float *bo_p;     /* (hidden) o_proj's bias on TP rank 0 */
	float *bo_d;     /* (hidden) on attention group rank 0 (decode, c_attn > 1) */
	float *q_norm, *k_norm; /* (hd) Qwen3's per-head norms */
	float *sinks;    /* (hq_t) this TP position's query heads' sink logits (both layouts hold
			  * heads [t * hq_t, (t + 1) * hq_t) in that order) */
	int window;      /* positions attended to (0: all) */
	float *b_gate_up; /* (2 * im_sh) gate rows' then up rows' biases */
	float *b_down;   /* (hidden) on MLP group rank 0 */
	float *exp_gu_b; /* (e_n, 2 * im_e) the experts' gate then up biases */
	float *exp_dn_b; /* (e_n, hidden) on the rank that adds them (an expert's owner with EP,
			  * MLP group rank 0 without) */
	/* MXFP4 experts (kernels/mxfp4.h), instead of exp_gu / exp_dn: */
	uint8_t **exp_gu_q, **exp_gu_s; /* (e_n) each (2 * im_e, hidden) */
	uint8_t **exp_dn_q, **exp_dn_s; /* (e_n) each (hidden, im_e) */
};

/* ---- load.c: reading a rank's shards --------------------------------------------------------- */

/* A load in progress: the checkpoint, the shard being filled, the first error (rc, err). */
struct dps_shard_loader {
	struct dps_ckpt ck;
	struct dps_shard *s;
	char *err;
	size_t errlen;
	int rc;
};

/*
 * Weights of a rank: dps_shard_weights_alloc gives bytes zeroed, on huge pages (a piece under
 * 2 MiB shares a chunk of the rank's arena); dps_shard_weights_free frees what it gave (and
 * is free() for any other pointer); dps_shard_weights_release frees the arena's chunks.
 */
void *dps_shard_weights_alloc(struct dps_shard *s, size_t bytes);
void dps_shard_weights_free(struct dps_shard *s, void *p);
void dps_shard_weights_release(struct dps_shard *s);

/* floats of weights for part (counted in s->bytes), or NULL with L->rc set. */
float *dps_shard_alloc_part(struct dps_shard_loader *L, enum dps_shard_part part, size_t floats);

/*
 * weights.c: s->wt and s->wt_emb from --dtype (auto: the checkpoint's, dps_ckpt_weights_bf16)
 * and --quantization (auto: the checkpoint's). 0 or -EINVAL with a message.
 */
int dps_shard_choose_wt(struct dps_shard_loader *L, enum dps_shard_dtype d,
			enum dps_shard_quant q);

/* n x k weights of type t for part (counted in s->bytes), or NULL with L->rc set. */
void *dps_shard_alloc_t(struct dps_shard_loader *L, enum dps_shard_part part, size_t n, int k,
			enum dps_wtype t);

/* n x k linear weights, of s->wt, for part. */
void *dps_shard_alloc_w(struct dps_shard_loader *L, enum dps_shard_part part, size_t n, int k);

/* Row r of a weight W of type t with rows of k values. */
static inline void *dps_shard_wrow(const void *W, enum dps_wtype t, size_t r, int k)
{
	return (char *)(uintptr_t)W + dps_wtype_bytes(t, r, k);
}

/*
 * Indices [first, first + n) of dimension dim of a (d0 x d1) weight into dst, of type t. INT8:
 * an INT8 tensor's values and scales as stored (a range along dimension 1 must start on a
 * block of 32), another read as f32 and quantized, kernels/q8.h.
 */
void dps_shard_load_range_t(struct dps_shard_loader *L, const char *name, uint64_t d0,
			    uint64_t d1, int dim, int64_t first, uint64_t n, void *dst,
			    enum dps_wtype t);

/* The same for a linear weight, of s->wt. */
void dps_shard_load_range_w(struct dps_shard_loader *L, const char *name, uint64_t d0,
			    uint64_t d1, int dim, int64_t first, uint64_t n, void *dst);

/* Indices [first, first + n) of dimension dim of a (d0 x d1) tensor into dst; zero past the
 * end. Does nothing once L->rc is set (every loader below behaves so). */
void dps_shard_load_range(struct dps_shard_loader *L, const char *name, uint64_t d0, uint64_t d1,
			  int dim, int64_t first, uint64_t n, float *dst);

/* A 1-D tensor of n floats, whole. */
void dps_shard_load_whole(struct dps_shard_loader *L, const char *name, uint64_t n, float *dst);

/* Elements [first, first + count) of a 1-D tensor of n floats (zero past the end). */
void dps_shard_load_vec_range(struct dps_shard_loader *L, const char *name, uint64_t n,
			      int64_t first, uint64_t count, float *dst);

/*
 * The reference's sharding_weight_loader(shard_dim, shard_size, num_shards) wrapped by
 * with_rank_override(loader, rank): shard `rank` of `per` rows (dimension 0) of a (d0 x d1)
 * tensor into dst, where rank is the rank the component shards by: its component TP group's
 * rank_in_group j*TP + t (dps_shard_comp_rank), attention's interleaved effective rank
 * j + t*c (dps_shard_attn_rank), or the plain TP rank t for the prefill layouts.
 */
void dps_shard_load_rows_of_rank(struct dps_shard_loader *L, const char *name, uint64_t d0,
				 uint64_t d1, int rank, uint64_t per, void *dst);

/* The same along dimension 1: columns [rank * per, (rank + 1) * per) of a (rows x cols) tensor
 * into dst (rows x per). Both load linear weights, into s->wt. */
void dps_shard_load_cols_of_rank(struct dps_shard_loader *L, const char *name, uint64_t rows,
				 uint64_t cols, int rank, int per, void *dst);

/* load_moe.c: layer l's router and the experts this rank holds (shard.h says which). */
void dps_shard_load_experts(struct dps_shard_loader *L, int l);

/* load_attn.c: layer l's attention biases, q/k norms, sinks and window. */
void dps_shard_load_attn_extras(struct dps_shard_loader *L, int l);

/* Layer l's tensor name: "model.layers.<l>.<suffix>", or "midlayer.<suffix>" in a draft. */
void dps_shard_lname(const struct dps_shard *s, char *buf, size_t len, int l, const char *suffix);

/* The rank component k shards its weights by: j*TP + t in its component TP group. */
static inline int dps_shard_comp_rank(const struct dps_shard *s, enum dps_comp k)
{
	return s->j[k] * s->par.tp + s->t;
}

/* Attention's decode layout: the interleaved effective rank e = j + t*c of its query heads. */
static inline int dps_shard_attn_rank(const struct dps_shard *s)
{
	return s->j[DPS_COMP_ATTN] + s->t * s->c[DPS_COMP_ATTN];
}

/* ---- coll.c: the counted collectives --------------------------------------------------------- */

/* step.c: a product on W held as t, counted in s->linear_ns and s->linear_flops. */
void dps_shard_linear_t(struct dps_shard *s, enum dps_wtype t, float *out, const float *x,
			const void *W, int m, int n, int k);

/* Counts (and traces) one collective of kind k over group set sg. */
void dps_shard_count(struct dps_shard *s, enum dps_coll_kind k, int sg, size_t bytes);
/* In-place f32 sum over c (nothing for a group of one or n == 0). 0 or a collective's code. */
int dps_shard_allreduce(struct dps_shard *s, struct dps_comm *c, int sg, float *buf, size_t n);
/* recv = every member's n elements of send, in group order (a copy for a group of one). */
int dps_shard_allgather(struct dps_shard *s, struct dps_comm *c, int sg, const void *send,
			void *recv, size_t n, enum dps_dtype t);

/* ---- step.c: what both graphs use ------------------------------------------------------------ */

/* out (m, n) = x (m, k) W (n, k)^T, timed and counted in s->linear_ns and s->linear_flops. */
void dps_shard_linear(struct dps_shard *s, float *out, const float *x, const void *W, int m,
		      int n, int k);
/* The partial MLP of R rows h (this rank's intermediate shard) into o (R, hidden). */
void dps_shard_mlp(struct dps_shard *s, int l, int R, const float *h, float *o);
/* x (n, hidden) = the rows of ids in a vocabulary shard starting at lo (per rows), else 0. */
void dps_shard_lookup(const struct dps_shard *s, const void *table, int lo, int per,
		      const int *ids, int n, float *x);
/* Logits of m normed rows h against a vocabulary shard gathered over comm; rows
 * [first, first + keep) are assembled into out (keep, vocab). */
int dps_shard_project(struct dps_shard *s, const float *h, int m, const void *table, int per,
		      struct dps_comm *comm, int sg, int first, int keep, float *out);

/* ---- attn.c ---------------------------------------------------------------------------------- */

/* Prefill attention (plain TP) of r's rows h; the partial o (n, hidden) before the all-reduce. */
void dps_shard_attn_prefill(struct dps_shard *s, int l, const struct dps_rows *r, const float *h,
			    float *o);
/* Decode attention over the attention column (c_attn > 1): o (B * c, hidden), partial. */
int dps_shard_attn_decode(struct dps_shard *s, int l, const struct dps_rows *r, const float *h,
			  float *o);

/* ---- moe.c ----------------------------------------------------------------------------------- */

/* Whether layer l runs as a mixture of experts on this shard. */
int dps_shard_moe_layer(const struct dps_shard *s, int l);
/* No expert parallelism: the partial MoE output of R rows (this rank's slice of each expert). */
void dps_shard_moe_tp(struct dps_shard *s, int l, int R, const float *h, float *o);
/* EP, all-gather + reduce-scatter over the DP group; o gets the whole output of n rows. */
int dps_shard_moe_ag(struct dps_shard *s, int l, int n, const float *h, float *o, const int *cnt,
		     const int *pad);
/* EP, all-to-all-v: out = x + MoE(norm(x)) for the R rows of group G. */
int dps_shard_moe_a2a(struct dps_shard *s, int l, struct dps_comm *G, int sg, int R,
		      const float *x, const int *pad, float *out);

/* ---- draft.c --------------------------------------------------------------------------------- */

/* An Eagle3 draft's config checked against its target T, and what its shards follow. */
int dps_shard_draft_config(struct dps_shard *s, const struct dps_shard *T, const char *dir,
			   char *err, size_t errlen);
/* The draft's fc columns, hidden_norm and d2t. */
void dps_shard_load_draft_extras(struct dps_shard_loader *L);
/* Keeps this replica's n rows x (the input of layer l) where a draft fuses them. */
void dps_shard_keep_aux(struct dps_shard *s, int l, const float *x, int n);

#endif

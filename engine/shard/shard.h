/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/shard.h - the model as one rank of a TP x DP layout holds and runs it: every
 * component sharded as the component-level DP sharding reference describes (docs/DESIGN.md
 * sections 3 and 4).
 *
 * Weights. Each component of size c is sharded over its component TP group (TP * c ranks,
 * group rank j*TP + t, j = d mod c) and loaded with that group rank in place of the TP rank:
 * embedding and LM head by vocabulary rows, MLP gate/up by intermediate rows and down by
 * intermediate columns. Attention: Q/O by the interleaved effective rank e = j + t*c (query
 * heads padded with zero heads to a multiple of TP * c); K/V by TP rank (each rank holds the KV
 * heads its TP position's query heads read, the "Q-only all-to-all" variant), or, when the KV
 * heads are a multiple of TP * c and c > 1, by effective rank with their own all-to-all. A
 * dimension that does not divide is zero-padded. Prefill uses plain TP for attention,
 * embedding and LM head, so a component with c > 1 holds both layouts (the MLP has one),
 * except on the decode ranks of a disaggregated layout, which hold the decode layout alone
 * (dps_shard_opts.decode_only).
 *
 * Steps. A step is either a prefill step (the prefill graph: some rows are prompt rows; any
 * decode rows of the same replica ride along) or a decode step (the decode graph of the reference:
 * embedding bracket, _dp_transition around attention and MLP, one all-reduce per attention
 * and per MLP over the component groups, LM head bracket). In a decode step every replica of a
 * supergroup contributes the same number of rows (the caller pads: seq < 0 marks a row that
 * writes nothing to the KV cache and whose logits are never used).
 *
 * Mixture of experts. The router is replicated. Without expert parallelism every expert is
 * sharded like the MLP (intermediate rows over TP x c_mlp) and a MoE layer is the MLP's flow
 * with each expert run once on the rows that chose it. With --enable-expert-parallel, EP rank
 * k = d*TP + t holds experts [k*E/ep, (k+1)*E/ep) whole, and a MoE layer dispatches:
 *   all-gather + reduce-scatter: gather the replica rows over the DP group (every rank of a
 *     replica holds the same rows), run the local experts on every gathered row, reduce-scatter
 *     the partial sums back to their replicas, then all-reduce over TP;
 *   all-to-all-v: the rows stay where attention left them and are split over the ranks that
 *     hold them alike (sequence parallel, no MLP _dp_transition); each (row, expert) item
 *     travels to the expert's rank and its output back; the owner adds the k outputs in the
 *     router's order and the pieces are all-gathered.
 * Prefill rows differ per replica, so the dispatch uses the -v collectives with counts.
 *
 * Every collective is counted per kind and per group set, per step (dps_shard_stats).
 */
#ifndef DPS_ENGINE_SHARD_H
#define DPS_ENGINE_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "engine/runtime/groups.h"
#include "kernels/gemm.h"
#include "engine/model/model_config.h"
#include "engine/runtime/world.h"
#include "shm/coll.h"

#define DPS_PAD_SLOT (-1)          /* the KV slot of a row that writes nothing */
#define DPS_BLOCK_SIZE_DEFAULT 32

/* --dtype: the in-memory type of the linear weights. */
enum dps_shard_dtype { DPS_SHARD_DTYPE_AUTO, DPS_SHARD_DTYPE_F32, DPS_SHARD_DTYPE_BF16 };

/* Parses "auto", "f32" or "bf16"; 0, or -EINVAL with a message naming the flag and the choices. */
int dps_shard_dtype_parse(const char *s, enum dps_shard_dtype *out, char *err, size_t errlen);

/*
 * --quantization: how the linear weights are quantized. AUTO: as the checkpoint says (INT8
 * when its config.json has dpshard's int8 quantization_config, see `dpshard quantize`; else
 * none); INT8: blocks of 32 with an F16 scale (kernels/q8.h), quantized at load from the
 * checkpoint's values.
 */
enum dps_shard_quant { DPS_SHARD_QUANT_AUTO, DPS_SHARD_QUANT_INT8 };

struct dps_shard_opts {
	int max_pos;  /* positions per sequence (0: the model's context) */
	int max_seqs; /* sequences of dps_shard_step's seq numbering (0: 1) */
	int block_size; /* positions per KV block (0: DPS_BLOCK_SIZE_DEFAULT) */
	int num_blocks; /* KV blocks (0: kv_bytes' worth, or enough for max_seqs of max_pos) */
	size_t kv_bytes; /* when num_blocks is 0: the KV cache's memory budget on this rank */
	int max_blocks;  /* and then at most this many blocks (0: no limit) */
	int max_rows; /* rows per step of any replica (0: 1); the same on every rank, since a
		       * rank gathers the rows of other replicas */
	/*
	 * How the linear weights are held: auto (BF16 when the checkpoint's are, see
	 * dps_ckpt_weights_bf16; else f32), f32 (BF16 and F16 widened, exact) or bf16 (F32 and F16
	 * rounded to nearest even). Norms, biases, sinks and other vectors stay f32.
	 */
	enum dps_shard_dtype dtype;
	/*
	 * The linear weights quantized (--quantization): every projection of attention, MLP and
	 * experts, the LM head and an Eagle3 draft's fusion are then INT8 (MXFP4 experts stay
	 * MXFP4), read as f32 from the checkpoint and quantized one matrix at a time. The
	 * embedding table and the MoE router stay as dtype says.
	 */
	enum dps_shard_quant quant;
	/*
	 * Non-NULL: dir is an Eagle3 draft of this (loaded) target, sharded as the draft is
	 * (below); num_blocks should then be the target's, so that its block tables serve both.
	 */
	const struct dps_shard *target;
	/*
	 * A decode rank of a disaggregated layout (par.prefill_dp > 0, docs/DESIGN.md): the
	 * decode graph's weights only. A component of size c > 1 then holds its decode layout
	 * alone, not the plain-TP one its prefill would read (with K/V by TP rank, attention
	 * keeps the K/V rows of its TP position, wkv_d); prefill steps are refused.
	 */
	int decode_only;
	/*
	 * Where the KV cache lives (NULL: memory of its own): a prefill rank's slice of the
	 * instance's KV share (struct dps_world's kv_share), cache_cap bytes, which then holds a
	 * struct dps_kv_share_hdr (kv.h) and the keys and values, so that the decode ranks can
	 * pull a sequence's positions (dps_shard_kv_pull).
	 */
	void *cache_mem;
	size_t cache_cap;
	/* decode_only with an Eagle3 draft: the plain-TP embedding stays, the draft reads it. */
	int with_draft;
};

/* What a layout of a component holds on this rank. */
enum dps_shard_part {
	DPS_PART_EMB_PREFILL, DPS_PART_EMB_DECODE,
	DPS_PART_ATTN_PREFILL, DPS_PART_ATTN_DECODE,
	DPS_PART_MLP,
	DPS_PART_LM_PREFILL, DPS_PART_LM_DECODE,
	DPS_PART_NORMS,
	DPS_PART_EXPERTS, /* MoE layers: the router (replicated) and the experts held here */
	DPS_PART_COUNT
};

const char *dps_shard_part_name(enum dps_shard_part p);

/* Collective counters: [kind][component of the group used]; "TP" and "DP" as extra slots. */
enum { DPS_SG_ATTN_COMP, DPS_SG_ATTN_COL, DPS_SG_EMB_COMP, DPS_SG_EMB_COL, DPS_SG_MLP_COMP,
       DPS_SG_MLP_COL, DPS_SG_LM_COMP, DPS_SG_LM_COL, DPS_SG_TP, DPS_SG_DP,
       DPS_SG_EP, /* the expert dispatch (over the DP group or the whole EP group) */
       DPS_SG_COUNT };

/* How a rank runs the MoE layers of a model. */
enum dps_moe_mode {
	DPS_MOE_NONE,  /* a dense model */
	DPS_MOE_TP,    /* no expert parallelism: every expert sharded like the MLP (TP x c_mlp) */
	DPS_MOE_EP_AG, /* EP, all-gather + reduce-scatter over the DP group */
	DPS_MOE_EP_A2A /* EP, all-to-all-v over the EP group */
};

const char *dps_shard_group_name(int sg);

struct dps_shard_stats {
	uint64_t calls[DPS_COLL_KINDS][DPS_SG_COUNT];
	uint64_t bytes[DPS_COLL_KINDS][DPS_SG_COUNT];
};

struct dps_shard_layer;
struct dps_wchunk;

struct dps_shard {
	struct dps_model_config cfg;
	struct dps_par_cfg par;
	struct dps_world *w;
	int t, d;                    /* TP rank, DP rank */
	int c[DPS_COMP_COUNT];       /* component sizes */
	int j[DPS_COMP_COUNT];       /* d mod c: place in the component's DP column */
	struct dps_comm *tp_c, *dp_c;
	struct dps_comm *comp_c[DPS_COMP_COUNT], *col_c[DPS_COMP_COUNT];

	float *inv_freq;             /* (hd / 2) the RoPE variant's frequencies */
	float rope_attn;             /* and the factor of its cos and sin */
	/* Attention geometry. */
	int hd, heads_p;             /* query heads padded to a multiple of TP * c_attn */
	int hq_t, hq_e;              /* query heads per TP position, per effective rank */
	int kv_by_eff;               /* KV sharded by effective rank (with their all-to-all) */
	int nkv_t;                   /* KV heads held for this TP position (cache heads) */
	int *kv_t;                   /* (nkv_t) their ids */
	int *q2kv;                   /* (hq_t) index in kv_t of the KV head each query head reads */
	int nkv_e;                   /* kv_by_eff: KV heads per effective rank */

	/* Vocabulary shards. */
	int v_tp, v_emb, v_lm;       /* rows per shard: plain TP, embedding, LM head decode */
	int im_sh;                   /* intermediate rows per MLP shard */

	/* Mixture of experts: this rank holds experts [e_lo, e_lo + e_n), im_e rows of each. */
	enum dps_moe_mode moe;
	int ep_n, ep_rank, e_per;    /* EP group (TP x DP, rank d*TP + t), experts per EP rank */
	/* Decode with EP: padding rows (no KV slot) choose no expert; which rows are padding is
	 * gathered once per step (m_pad) over the group whose rows the dispatch meets. */
	int e_lo, e_n, im_e;
	int moe_route, moe_rows, moe_items; /* scratch capacity: rows routed here, rows one
					     * expert meets, items received */
	float *m_lg;                 /* (moe_route, experts) router logits */
	float *m_w;                  /* (moe_route, top_k) routing weights */
	int *m_e;                    /* (moe_route, top_k) chosen experts, -1 for padding */
	float *m_h, *m_y;            /* (moe_route, hidden) gathered inputs, outputs */
	float *m_gather;             /* (moe_rows, hidden) the rows one expert meets */
	float *m_gu;                 /* (moe_rows, 2 * im_e) their gate and up */
	float *m_eout;               /* (moe_rows, hidden) their expert outputs */
	int *m_ix;                   /* (moe_rows) which (row, choice) each of them is */
	float *m_par;                /* whole-expert tasks (moe.c): per thread, PAR_ITEMS rows
				      * of hidden and of 2 * im_e; then PAR_ITEMS outputs */
	int m_par_nt;                /* the pool threads m_par was sized for (0: none) */
	int *m_pad;                  /* ((dp + 1) * max_rows) padding flags: gathered, then mine */
	/* all-to-all-v only: */
	float *m_send;               /* (max_rows * top_k, hidden + 1) items sent, expert id last */
	int *m_pos;                  /* (max_rows * top_k) where each (row, choice) was sent */
	float *m_recv;               /* (moe_items, hidden + 1) items received */
	float *m_ret;                /* (moe_items, hidden) their outputs, returned */
	int *m_e2;                   /* (moe_items) the expert of each received item */

	/*
	 * Linear weights are held as wt: f32 or BF16 (--dtype), or INT8 (--quantization). The
	 * embedding table and the MoE router as wt_emb: wt, or with INT8 the f32 or BF16 of
	 * --dtype.
	 */
	enum dps_wtype wt, wt_emb;
	void *emb_p, *emb_d;         /* (v_tp | v_emb, hidden) of wt_emb; emb_d == emb_p when c_emb == 1 */
	void *lm_p, *lm_d;           /* (v_tp | v_lm, hidden) of wt */
	float *final_norm;
	struct dps_shard_layer *layers;
	size_t bytes[DPS_PART_COUNT];
	struct dps_wchunk *wchunks;  /* the weight arena's chunks (weights.c) */

	int max_pos, max_seqs, max_rows, max_gather;
	int block_size, num_blocks, bps; /* bps: blocks of a max_pos sequence */
	int score_threads;           /* threads the attention scratch was sized for */
	float *key_cache, *value_cache; /* (layers, num_blocks, block_size, nkv_t * hd) */
	size_t cache_bytes;

	/* Activations and scratch of a step; G = max_gather rows (a column's gathered rows). */
	float *x;        /* (G, hidden) the residual stream */
	float *h;        /* (G, qkv_in) normed rows, gathered rows */
	float *o;        /* (G, hidden) a sublayer's partial output; x at the attention's size */
	float *qkv;      /* (2 G, max((hq_t + 2 nkv_t) hd, hidden)) projections; decode: mine */
	float *att;      /* (G, (hq_t + 2 nkv_t + hq_e + 2 nkv_e) hd) attention out, A2A blocks */
	float *att2;     /* the same shape: the all-to-alls' other side */
	float *gu;       /* (G, 2 im_sh) gate and up, then silu(gate) * up */
	float *scores;   /* (score_threads, max_pos) attention scores, one row per thread */
	float *cs;       /* (max_rows, hd) cos and sin of each row's position */
	float *lg;       /* (G, max(v_tp, v_lm)) logits of this rank's vocabulary shard */
	float *lg2;      /* (G * TP * max c, max(v_tp, v_lm)) every shard's, gathered */
	float *logits;   /* (max_rows, vocab) the step's wanted rows, packed */
	int *ids;        /* (2 (G + 1)) gathered token ids, row counts */
	int *rows_slot;  /* (max_rows) dps_shard_step: each row's KV slot */
	int **rows_table; /* (max_rows) dps_shard_step: each row's block table */
	int *seq_tables; /* (max_seqs, bps) dps_shard_step: sequence k owns blocks k * bps.. */

	struct dps_shard_stats stats;  /* since load */
	uint64_t moe_bytes;            /* router and expert weight bytes read, since load */
	uint64_t exp_bytes, exp_ns;    /* of which the experts' products, and their time */
	uint64_t exp_par;              /* expert layers run as whole-expert tasks (moe.c) */
	uint64_t exp_thr_ns, exp_run_ns; /* those tasks: threads x their wall time, and the part the
					  * threads ran experts (the rest: the fork and the join) */
	uint64_t linear_ns;            /* time in the matrix products, since load */
	double linear_flops;
	double linear_bytes;           /* the bytes of W those products read, since load */
	int trace;                     /* print every collective on stderr */
	uint64_t steps;                /* steps run since load */

	/*
	 * Eagle3. A target keeps the input hidden states of layers aux_l[0..2] of its own rows of
	 * every step, (rows, 3 * hidden), in aux (after dps_shard_set_aux). A draft (draft = 1):
	 * one decoder layer whose q/k/v read qkv_in = 2 * hidden inputs, fc (hidden, fc_w)
	 * columns [t * fc_w, (t + 1) * fc_w) of the (hidden, 3 * hidden) fusion (all-reduced over
	 * TP), hidden_norm, an LM head over the draft vocabulary (cfg.vocab_size) and d2t: draft
	 * id -> target id.
	 */
	int n_aux, aux_l[3];
	float *aux;                  /* (max_rows, 3, hidden) the fused layers' inputs */
	int draft, qkv_in, fc_w, target_vocab;
	void *fc;                    /* (hidden, fc_w) of wt: this rank's columns of the fusion */
	float *hidden_norm;          /* (hidden) */
	float *fcin;                 /* (max_rows, fc_w) this rank's columns of the fused states */
	int *d2t;                    /* (draft vocab) draft id -> target id offset */
	int cur_layer, cur_prefill;    /* where the current step is, for the trace */
	int decode_only;               /* dps_shard_opts.decode_only: no prefill layouts */
	int cache_shared;              /* the cache is in dps_shard_opts.cache_mem */
	int o_window;                  /* o lives in this rank's window of its TP group */
};

/*
 * The disaggregated hand-off (docs/DESIGN.md): copies positions [0, n_pos) of one sequence
 * from the caches of prefill replica pr (ptp ranks, in the KV share: prefill rank q of the part
 * at share + q * stride) into this rank's cache, every layer, each head of its cache from the
 * prefill position dps_kv_relay_plan names. src: the sequence's block table there; dst: here.
 * draft: s is an Eagle3 draft, whose cache each prefill rank keeps after its target's (the
 * target header's draft_off).
 * The caller orders it after the prefill ranks wrote those positions (the hand-off's
 * messages). Returns 0, or -DPS_EPROTO when a source cache's header disagrees with this
 * model (layers, block size, head width) or a block lies outside it.
 */
int dps_shard_kv_pull(struct dps_shard *s, const char *share, size_t stride, int pr, int ptp,
		      const int *src, const int *dst, int n_pos, int draft);

/*
 * Across nodes: when prefill replica pr's ranks are on another node, brings into this node's
 * KV share (w->kv_share) what dps_shard_kv_pull will read there for the n_src source blocks
 * src: each rank's header (the draft's with draft), then every layer's keys and values of
 * those blocks (dps_world_fetch). Nothing to do on the replica's own node. 0, -DPS_EPROTO (a
 * header that is not a share's), or dps_world_fetch's errors.
 */
int dps_shard_kv_fetch(struct dps_shard *s, struct dps_world *w, int pr, int ptp, const int *src,
		       int n_src, int draft);

/*
 * Loads rank w's shards of the checkpoint in dir. Each rank reads only its bytes. Returns 0 or
 * a negative code with a message naming the file, tensor or rule.
 */
int dps_shard_load(struct dps_shard *s, struct dps_world *w, const struct dps_par_cfg *par,
		   const char *dir, const struct dps_shard_opts *opts, char *err, size_t errlen);

/*
 * The window (shm/coll.h, dps_sup_opts.window_bytes) each TP group member needs so that the
 * ranks of this layout (both parts of a disaggregated one) compute their sublayer outputs for
 * up to max_rows rows in it and all-reduce them in place; 0 when no part has TP > 1.
 */
size_t dps_shard_window_bytes(const struct dps_model_config *c, const struct dps_par_cfg *par,
			      int max_rows);
void dps_shard_free(struct dps_shard *s);

/*
 * Checks the rules that need the model as well as the layout: TP * attention size at most the
 * query heads; expert parallelism only on a MoE model, and its experts divisible by the EP
 * degree TP * DP. 0 or -DPS_ECONFIG with a message naming the flags.
 */
int dps_shard_check(const struct dps_model_config *cfg, const struct dps_par_cfg *par, char *err,
		    size_t errlen);

/*
 * The rows of one step of this replica: row i feeds tokens[i] at position pos[i], writes its
 * K and V to KV slot slot[i] (block * block_size + offset; DPS_PAD_SLOT writes nothing) and
 * attends to positions 0..pos[i] through the block table table[i] (NULL for a padding row,
 * whose attention output is zero and whose logits mean nothing).
 */
struct dps_rows {
	int n;
	const int *tokens, *pos, *slot;
	const int *const *table;
	const unsigned char *want;  /* logits of the rows with want[i] (NULL: all) */
};

/*
 * Whether the replicas of this layout must step together (DP padding, dummy batches, the global
 * unfinished check): any component size above 1 (the draft MLP's only when a draft runs, which
 * the caller adds), or expert parallelism.
 */
int dps_shard_coupled(const struct dps_shard *s);

const float *dps_shard_step_rows(struct dps_shard *s, int prefill, const struct dps_rows *r,
				 int *rc);

/*
 * The same with a fixed block table per sequence (sequence k owns blocks [k * bps, (k + 1) *
 * bps)): one step of this replica's n rows (row i: token, position, KV sequence slot, or
 * seq < 0 for a padding row). prefill selects the graph; every rank of the supergroup (every
 * rank, when replicas are coupled) must run the same graph, and in a decode step every
 * replica the same n. Returns the logits of the rows with want[i] (NULL: all), packed (vocab floats
 * each, valid until the next step), or NULL after a failed collective (*rc says why).
 */
const float *dps_shard_step(struct dps_shard *s, int prefill, int n, const int *tokens,
			    const int *pos, const int *seq, const unsigned char *want, int *rc);

/*
 * Keeps the input hidden states of the target's layers aux[0..2] from now on (for an Eagle3
 * draft). 0 or -ENOMEM / -EINVAL (a layer out of range) with a message.
 */
int dps_shard_set_aux(struct dps_shard *s, const int *aux, char *err, size_t errlen);

/*
 * One pass of the Eagle3 draft d (loaded with opts.target = t) over this replica's rows r:
 * row i feeds target token r->tokens[i] at r->pos[i] (draft KV slot r->slot[i]) with the
 * hidden state hin row i: the target's three fused hidden states (3 * hidden floats) when
 * fused, else the draft's own previous output (hidden floats). Writes every row's output
 * hidden state (before the final norm) to hout (n, hidden) and returns the draft-vocabulary
 * logits of the rows with want[i], packed. The draft MLP runs over TP x --draft-mlp-dp-size
 * (gathering over its column with counts, so replicas may give different row counts, 0
 * included; every rank of the column must call it); attention, fc and the LM head over TP.
 */
const float *dps_shard_draft_step(struct dps_shard *d, const struct dps_shard *t,
				  const struct dps_rows *r, const float *hin, int fused,
				  float *hout, int *rc);

/*
 * The reference's _dp_transition on rows of `cols` floats: from rows gathered over a column of size
 * from (x: rows_local * from rows, this replica's block at d mod from) to one of size to. out
 * receives rows_local * to rows. d is this replica's DP rank; to_col is the column of size to.
 */
int dps_dp_transition(struct dps_shard *s, const float *x, float *out, int rows_local, int cols,
		      int from, int to, struct dps_comm *to_col, int to_sg);

#endif

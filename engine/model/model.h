/* SPDX-License-Identifier: MIT */
/*
 * engine/model/model.h - a Llama-family decoder held whole in one process, with a KV cache of
 * max_seqs sequences of max_pos positions each. One step runs any mix of rows: a prompt's
 * positions (prefill, causal) and single next tokens of other sequences (decode), the linear
 * layers as one matrix product over all rows. Evaluated with the fast kernels (BLIS and
 * kernels/fast.c, over the rank's threads) or with the plain-C references: the latter is
 * the oracle the fast path and the sharded forward pass are compared with.
 */
#ifndef DPS_ENGINE_MODEL_H
#define DPS_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/model_config.h"

struct dps_layer_weights {
	float *attn_norm;   /* (hidden) */
	float *wqkv;        /* q_proj, k_proj and v_proj stacked: (q_dim + 2 * kv_dim, hidden) */
	float *wq;          /* (heads * head_dim, hidden), inside wqkv */
	float *wk, *wv;     /* (kv_heads * head_dim, hidden), inside wqkv */
	float *wo;          /* (hidden, heads * head_dim) */
	float *ffn_norm;    /* (hidden) */
	float *w_gate_up;   /* gate_proj and up_proj stacked: (2 * intermediate, hidden) */
	float *w_gate, *w_up; /* (intermediate, hidden), inside w_gate_up */
	float *w_down;      /* (hidden, intermediate) */
	/* What the families add (NULL when the config says the layer has none): */
	float *bqkv;        /* (q_dim + 2 * kv_dim) the q, k and v biases, stacked as wqkv */
	float *bo;          /* (hidden) o_proj's bias */
	float *q_norm, *k_norm; /* (head_dim) each: Qwen3's per-head RMSNorm weights */
	float *sinks;       /* (heads) GPT-OSS's attention-sink logits */
	float *b_gate_up, *b_down; /* (2 * intermediate) gate then up, (hidden): mlp_bias */
	int window;         /* positions this layer attends to (0: all) */
	/* A mixture-of-experts layer instead (w_gate_up and w_down NULL): */
	float *router, *router_bias;  /* (experts, hidden), (experts) */
	float **exp_gate_up;          /* (experts) each (2 * intermediate, hidden), gate rows then
				       * up rows (GPT-OSS interleaves them; the loader does not) */
	float **exp_down;             /* (experts) each (hidden, intermediate) */
	float *exp_gu_bias;           /* (experts, 2 * intermediate) gate then up */
	float *exp_dn_bias;           /* (experts, hidden) */
	/* MXFP4 experts (kernels/mxfp4.h layout) instead of exp_gate_up / exp_down: */
	uint8_t **exp_gu_q, **exp_gu_s; /* (experts) each (2 * intermediate, hidden) */
	uint8_t **exp_dn_q, **exp_dn_s; /* (experts) each (hidden, intermediate) */
};

struct dps_model_opts {
	int max_pos;  /* positions per sequence (0 or more than the model's context: its context) */
	int max_seqs; /* sequences in the cache (0: 1) */
	int max_rows; /* rows per step (0: 1) */
	int max_out;  /* rows per step whose logits are wanted (0: max_rows) */
};

struct dps_model {
	struct dps_model_config cfg;
	float *inv_freq;    /* (head_dim / 2) the RoPE variant's frequencies */
	float rope_attn;    /* and the factor of its cos and sin (YaRN) */
	float *embed;       /* (vocab, hidden) */
	float *final_norm;  /* (hidden) */
	float *lm_head;     /* (vocab, hidden); the embedding when tied */
	struct dps_layer_weights *layers;
	size_t weight_bytes, cache_bytes;
	int max_pos, max_seqs, max_rows, max_out;
	float *key_cache, *value_cache; /* (layers, max_seqs, max_pos, kv_heads * head_dim) */
	/* Per-step scratch, max_rows rows each (scores: one row of max_pos per thread). */
	float *x, *xb, *qkv, *att_out, *gu, *scores, *cs, *logits;
	/* MoE scratch: router logits (rows, experts), the chosen experts and weights (rows, k),
	 * gathered rows (rows, hidden) and each (row, choice)'s expert output (rows, k, hidden) */
	float *router_lg, *route_w, *gather, *exp_out;
	int *route_e, *gather_ix;
	int score_threads;
	/* Counters of the fast step's matrix products, for benchmarks (never reset by the model). */
	uint64_t linear_ns;
	double linear_flops;
};

/*
 * Loads the checkpoint directory dir (every tensor whole, as F32). Returns 0 or a negative
 * code with a message naming the file or tensor. opts may be NULL (one sequence, one row,
 * the model's whole context).
 */
int dps_model_load(struct dps_model *m, const char *dir, const struct dps_model_opts *opts,
		   char *err, size_t errlen);
void dps_model_free(struct dps_model *m);

/*
 * One step of n rows (1 <= n <= max_rows): row i is token tokens[i] at position pos[i] of
 * sequence seq[i]. Each row attends to positions 0..pos[i] of its sequence: those before it
 * must have been fed by earlier steps or by earlier rows of this one (a prompt is any run of
 * consecutive positions). want[i] != 0 asks for row i's logits (want NULL: every row; at
 * most max_out rows); returns them packed in row order (vocab floats each, valid until the
 * next step).
 */
const float *dps_model_step(struct dps_model *m, int n, const int *tokens, const int *pos,
			    const int *seq, const unsigned char *want);

/* The same with the plain-C reference kernels, one row at a time. */
const float *dps_model_step_ref(struct dps_model *m, int n, const int *tokens, const int *pos,
				const int *seq, const unsigned char *want);

/* One token of sequence 0: dps_model_step with n = 1. */
const float *dps_model_forward(struct dps_model *m, int token, int pos);
const float *dps_model_forward_ref(struct dps_model *m, int token, int pos);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * engine/model.h - a Llama-family decoder held whole in one process, with a single-sequence
 * KV cache, evaluated with the reference kernels: the oracle the sharded forward pass is
 * compared with, and the engine of `dpshard generate` on one rank until the paged,
 * BLIS-backed path replaces it.
 */
#ifndef DPS_ENGINE_MODEL_H
#define DPS_ENGINE_MODEL_H

#include <stddef.h>

#include "engine/model_config.h"

struct dps_layer_weights {
	float *attn_norm;   /* (hidden) */
	float *wq;          /* (heads * head_dim, hidden) */
	float *wk, *wv;     /* (kv_heads * head_dim, hidden) */
	float *wo;          /* (hidden, heads * head_dim) */
	float *ffn_norm;    /* (hidden) */
	float *w_gate, *w_up; /* (intermediate, hidden) */
	float *w_down;      /* (hidden, intermediate) */
};

struct dps_model {
	struct dps_model_config cfg;
	float *embed;       /* (vocab, hidden) */
	float *final_norm;  /* (hidden) */
	float *lm_head;     /* (vocab, hidden); the embedding when tied */
	struct dps_layer_weights *layers;
	size_t weight_bytes;
	int max_pos;
	float *key_cache, *value_cache; /* (layers, max_pos, kv_heads * head_dim) */
	float *x, *xb, *xb2, *q, *att_out, *hb, *hb2, *scores, *logits;
};

/*
 * Loads the checkpoint directory dir (every tensor whole, as F32) with room for max_pos
 * positions (0, or more than the model's max_position_embeddings, means that many). Returns 0 or a negative code with a
 * message naming the file or tensor.
 */
int dps_model_load(struct dps_model *m, const char *dir, int max_pos, char *err, size_t errlen);
void dps_model_free(struct dps_model *m);

/*
 * Feeds token at position pos (0 <= pos < max_pos; positions must be fed in order) and
 * returns the logits (vocab floats, valid until the next call).
 */
const float *dps_model_forward_ref(struct dps_model *m, int token, int pos);

/* The same through the BLIS-backed products (kernels/gemm.h); logits within rounding. */
const float *dps_model_forward(struct dps_model *m, int token, int pos);

#endif

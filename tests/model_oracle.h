/* SPDX-License-Identifier: MIT */
/*
 * tests/model_oracle.h - what the sharded-model tests share: their small models, and their
 * oracle, the one-process model (engine/model/model.c, plain-C reference kernels) run greedily
 * on each prompt, its logits at every position and the token each gives kept for the ranks to
 * compare with.
 */
#ifndef DPS_TESTS_MODEL_ORACLE_H
#define DPS_TESTS_MODEL_ORACLE_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/mkmodel.h"
#include "engine/model/model.h"

struct model_oracle {
	int vocab, n, maxpos;
	int *tokens;   /* [n][maxpos + 1]: the token after each position */
	float *logits; /* [n][maxpos][vocab], by position */
};

static inline const float *model_oracle_logits(const struct model_oracle *o, int k, int pos)
{
	return o->logits + ((size_t)k * (size_t)o->maxpos + (size_t)pos) * (size_t)o->vocab;
}

static inline int model_oracle_token(const struct model_oracle *o, int k, int pos)
{
	return o->tokens[(size_t)k * (size_t)(o->maxpos + 1) + (size_t)pos];
}

/* prompts[k] (lens[k] tokens, at most 8) greedily to maxpos positions each. */
static inline void model_oracle_build(struct model_oracle *o, const char *model,
				      const int (*prompts)[8], const int *lens, int n, int maxpos)
{
	struct dps_model m;
	char err[256];

	ck_assert_msg(!dps_model_load(&m, model, &(struct dps_model_opts){ .max_pos = maxpos,
									 .max_rows = 8 },
				      err, sizeof(err)), "%s", err);
	free(o->logits);
	free(o->tokens);
	o->vocab = m.cfg.vocab_size;
	o->n = n;
	o->maxpos = maxpos;
	o->logits = calloc((size_t)n * (size_t)maxpos * (size_t)o->vocab, sizeof(float));
	o->tokens = calloc((size_t)n * (size_t)(maxpos + 1), sizeof(int));
	ck_assert(o->logits && o->tokens);
	for (int k = 0; k < n; k++) {
		int pos[8], seq[8] = { 0 }, tok;
		const float *lg;

		for (int i = 0; i < lens[k]; i++)
			pos[i] = i;
		lg = dps_model_step(&m, lens[k], prompts[k], pos, seq, NULL);
		for (int p = lens[k] - 1;; p++) {
			const float *row = lg + (p == lens[k] - 1 ? (size_t)(lens[k] - 1) * o->vocab : 0);

			memcpy((float *)model_oracle_logits(o, k, p), row, sizeof(float) * (size_t)o->vocab);
			tok = 0;
			for (int v = 1; v < o->vocab; v++)
				if (row[v] > row[tok])
					tok = v;
			o->tokens[(size_t)k * (size_t)(maxpos + 1) + (size_t)p + 1] = tok;
			if (p + 1 >= maxpos)
				break;
			lg = dps_model_forward(&m, tok, p + 1);
		}
	}
	dps_model_free(&m);
}

/* dir/sub: a model of config c (mkmodel's weights, seed 11, f32). */
static inline void test_model_make(const char *dir, const char *sub,
				   const struct dps_model_config *c)
{
	char out[128], err[256];

	snprintf(out, sizeof(out), "%s/%s", dir, sub);
	ck_assert_msg(!dps_mkmodel(c, 11, DPS_ST_F32, out, err, sizeof(err)), "%s", err);
}

/*
 * The four models of the layout tests, in dir: "gqa", 6 query heads over 2 KV heads,
 * intermediate 100, vocabulary 300 (nothing divides; K/V by TP rank); "mha", 8 heads and 8 KV
 * heads (a multiple of TP x c: the K/V all-to-all variant); "wide", 32 query heads over 8 KV
 * heads (the reference's TP=8 x attention size 4 fits); "moe", 32 experts of 40 (top 3,
 * clamped SwiGLU), layer 0 dense, 8 query heads over 4 KV heads, vocabulary 300 (EP degrees 1 to
 * 32 divide the experts, and 40 does not divide by 3: TP-sharded experts are padded).
 */
static inline void test_models_make(const char *dir)
{
	struct dps_model_config gqa = dps_mkmodel_preset("tiny-gqa")->cfg;
	struct dps_model_config mha = dps_mkmodel_preset("tiny")->cfg;
	struct dps_model_config wide = dps_mkmodel_preset("tiny-gqa")->cfg;
	struct dps_model_config moe = dps_mkmodel_preset("tiny-moe")->cfg;

	test_model_make(dir, "gqa", &gqa);
	mha.num_attention_heads = 8;
	mha.num_key_value_heads = 8;
	mha.head_dim = mha.hidden_size / 8;
	mha.intermediate_size = 96;
	test_model_make(dir, "mha", &mha);
	wide.hidden_size = 128;
	wide.num_attention_heads = 32;
	wide.num_key_value_heads = 8;
	wide.head_dim = 4;
	test_model_make(dir, "wide", &wide);
	moe.num_attention_heads = 8;
	moe.num_key_value_heads = 4;
	moe.head_dim = 8;
	moe.intermediate_size = 40;
	moe.vocab_size = 300;
	moe.num_local_experts = 32;
	moe.num_experts_per_tok = 3;
	test_model_make(dir, "moe", &moe);
}

static inline void model_oracle_free(struct model_oracle *o)
{
	free(o->logits);
	free(o->tokens);
	memset(o, 0, sizeof(*o));
}

#endif

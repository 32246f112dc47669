/* SPDX-License-Identifier: MIT */
/*
 * tests/check_batchinv.c - a request's logits do not depend on its batch: one request run
 * alone (its prompt as one prefill step, then greedy decode one row at a time, on one thread)
 * against the same request with its prompt prefilled in chunks of 1, 7 and 32 rows, and inside
 * steps of 1, 127, 129 and 256 rows (the other rows: other sequences' random tokens at random
 * positions, the request's rows at a random place) on three threads, through the real shard
 * step (dps_shard_step). Every position's logits must have the same bits. Models: a dense
 * Llama, GPT-OSS with f32 experts and with MXFP4 experts (mkmodel presets), so the products,
 * norms, attention (prefill chunk against decode), experts and LM head are all covered. A
 * changed prompt token is caught, so the comparison can fail. MoE models under --quantization
 * int8 (MXFP4 and INT8 experts), four experts a token, decode a few rows on one thread and
 * on two and three (whole-expert tasks, or split products), with the same bits.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/mkmodel.h"
#include "engine/shard/shard.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "tests/testutil.h"

enum { P = 40, G = 6, MAX_POS = 64, MAX_ROWS = 256, SEQS = MAX_ROWS + 1 };

static const char *const presets[] = { "tiny", "tiny-moe", "tiny-gpt-oss" };
static char dir[64];

struct trace {
	int tokens[P + G]; /* the prompt, then the greedy tokens */
	float *logits;     /* (P + G - 1, vocab): the logits at each position */
};

static uint32_t next_rand(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

static void load_q(struct dps_shard *sd, const char *preset, enum dps_shard_quant quant)
{
	struct dps_par_cfg par = { 0 };
	char path[128], err[512];

	par.tp = par.dp = par.attn_dp = par.emb_dp = par.mlp_dp = par.draft_mlp_dp = par.lm_head_dp = 1;
	snprintf(path, sizeof(path), "%s/%s", dir, preset);
	ck_assert_msg(!dps_shard_load(sd, NULL, &par, path,
				      &(struct dps_shard_opts){ .max_pos = MAX_POS,
								.max_seqs = SEQS,
								.max_rows = MAX_ROWS + 8,
								.quant = quant },
				      err, sizeof(err)),
		      "%s", err);
}

/*
 * One step of the request's rows [p0, p1) (sequence 0) at place `at` among n rows in all
 * (n >= p1 - p0), the others sequences 1.. at random positions with random tokens; copies the
 * request's logits into t->logits at their positions (the last position has none).
 */
static void step(struct dps_shard *sd, struct trace *t, int prefill, int p0, int p1, int n,
		 int at, uint32_t *rs)
{
	static int tok[MAX_ROWS + 8], pos[MAX_ROWS + 8], seq[MAX_ROWS + 8];
	const int V = sd->cfg.vocab_size, own = p1 - p0;
	const float *lg;
	int rc = 0;

	ck_assert(n >= own && at + own <= n && n <= MAX_ROWS + 8);
	for (int i = 0, o = 1; i < n; i++) {
		if (i >= at && i < at + own) {
			tok[i] = t->tokens[p0 + i - at];
			pos[i] = p0 + i - at;
			seq[i] = 0;
			continue;
		}
		tok[i] = (int)(next_rand(rs) % (uint32_t)V);
		pos[i] = (int)(next_rand(rs) % MAX_POS);
		seq[i] = o++;
	}
	lg = dps_shard_step(sd, prefill, n, tok, pos, seq, NULL, &rc);
	ck_assert_msg(lg != NULL, "step of %d rows: %d", n, rc);
	for (int i = 0; i < own; i++)
		if (p0 + i < P + G - 1)
			memcpy(t->logits + (size_t)(p0 + i) * (size_t)V, lg + (size_t)(at + i) * (size_t)V,
			       sizeof(float) * (size_t)V);
}

/*
 * The request through prefill chunks of `chunk` rows and decode steps, each step n rows in all
 * (n 0: only the request's rows). With greedy set, each token after the prompt is the argmax
 * of the logits before it; otherwise t->tokens are fed as they are.
 */
static void run(struct dps_shard *sd, struct trace *t, int chunk, int n, int greedy, uint32_t seed)
{
	const int V = sd->cfg.vocab_size;
	uint32_t rs = seed;

	for (int p0 = 0; p0 < P; p0 += chunk) {
		const int p1 = P - p0 < chunk ? P : p0 + chunk, rows = n > p1 - p0 ? n : p1 - p0;

		step(sd, t, 1, p0, p1, rows, (int)(next_rand(&rs) % (uint32_t)(rows - (p1 - p0) + 1)),
		     &rs);
	}
	for (int p = P; p < P + G - 1; p++) {
		const int rows = n > 1 ? n : 1;

		if (greedy)
			t->tokens[p] = dps_argmax_ref(t->logits + (size_t)(p - 1) * (size_t)V, V);
		step(sd, t, 0, p, p + 1, rows, (int)(next_rand(&rs) % (uint32_t)rows), &rs);
	}
}

/* The index of the first float whose bits differ, or -1. */
static long first_diff(const float *a, const float *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp(&a[i], &b[i], sizeof(float)))
			return (long)i;
	return -1;
}

/*
 * On one thread: loads preset (weights as quant says), a prompt of P tokens from seed rs, and
 * the request alone (its prompt as one prefill step, then greedy decode) into alone; got gets
 * logits of the same size. Returns the vocabulary size.
 */
static int start(struct dps_shard *sd, const char *preset, enum dps_shard_quant quant,
		 struct trace *alone, struct trace *got, uint32_t rs)
{
	const size_t size = (size_t)(P + G - 1);
	char msg[256];
	int V;

	ck_assert_int_eq(dps_gemm_setup("auto", 1, msg, sizeof(msg)), 0);
	load_q(sd, preset, quant);
	V = sd->cfg.vocab_size;
	alone->logits = malloc(sizeof(float) * size * (size_t)V);
	got->logits = malloc(sizeof(float) * size * (size_t)V);
	ck_assert(alone->logits && got->logits);
	for (int p = 0; p < P; p++)
		alone->tokens[p] = p ? (int)(next_rand(&rs) % (uint32_t)V) : 1;
	run(sd, alone, P, 0, 1, 5);
	return V;
}

START_TEST(test_request_alone_equals_in_batch)
{
	static const int chunks[] = { P, 1, 7, 32 };
	static const int batches[] = { 1, 127, 129, 256 };
	struct dps_shard sd;
	struct trace alone, got;
	char msg[256];
	const int V = start(&sd, presets[_i], DPS_SHARD_QUANT_AUTO, &alone, &got, 77);
	const size_t size = (size_t)(P + G - 1) * (size_t)V;

	ck_assert_int_eq(dps_gemm_setup("auto", 3, msg, sizeof(msg)), 0);
	for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++)
		for (size_t b = 0; b < sizeof(batches) / sizeof(batches[0]); b++) {
			long d;

			memcpy(got.tokens, alone.tokens, sizeof(got.tokens));
			memset(got.logits, 0, sizeof(float) * size);
			run(&sd, &got, chunks[c], batches[b], 0, 100 + (uint32_t)(c * 8 + b));
			d = first_diff(alone.logits, got.logits, size);
			ck_assert_msg(d < 0, "%s, prefill chunks of %d, steps of %d rows: position %ld "
				      "token %ld: %a alone, %a here", presets[_i], chunks[c],
				      batches[b], d / V, d % V, (double)alone.logits[d],
				      (double)got.logits[d]);
		}
	/* The check can fail: one changed prompt token changes the logits from there on. */
	memcpy(got.tokens, alone.tokens, sizeof(got.tokens));
	got.tokens[P - 3] = (got.tokens[P - 3] + 1) % V;
	run(&sd, &got, 7, 129, 0, 3);
	ck_assert_int_eq(first_diff(alone.logits, got.logits, size) / V, P - 3);
	free(alone.logits);
	free(got.logits);
	dps_shard_free(&sd);
}
END_TEST

/*
 * Experts under --quantization int8, four a token so that the order in which they are added
 * shows: GPT-OSS's MXFP4 experts, and tiny-moe's INT8 ones. Decoding on two and three
 * threads, steps of 1 and 4 rows run whole-expert tasks (moe.c; the path is seen to run),
 * steps of 7 rows have too many items and split the products as usual; every logit has the
 * bits of one thread's.
 */
static const char *const top4[] = { "gpt-oss-top4", "moe-top4" };

START_TEST(test_whole_expert_tasks)
{
	static const int threads[] = { 2, 3 };
	static const int batches[] = { 1, 4, 7 };
	struct dps_shard sd;
	struct trace alone, got;
	char msg[256];
	const int V = start(&sd, top4[_i], DPS_SHARD_QUANT_INT8, &alone, &got, 91);
	const size_t size = (size_t)(P + G - 1) * (size_t)V;
	ck_assert_uint_eq(sd.exp_par, 0);
	for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++)
		for (size_t b = 0; b < sizeof(batches) / sizeof(batches[0]); b++) {
			const uint64_t before = sd.exp_par;
			long d;

			ck_assert_int_eq(dps_gemm_setup("auto", threads[t], msg, sizeof(msg)), 0);
			memcpy(got.tokens, alone.tokens, sizeof(got.tokens));
			memset(got.logits, 0, sizeof(float) * size);
			run(&sd, &got, P, batches[b], 0, 200 + (uint32_t)(t * 8 + b));
			d = first_diff(alone.logits, got.logits, size);
			ck_assert_msg(d < 0, "%s, %d threads, steps of %d rows: position %ld token %ld: "
				      "%a alone, %a here", top4[_i], threads[t], batches[b], d / V,
				      d % V, (double)alone.logits[d], (double)got.logits[d]);
			ck_assert_msg((sd.exp_par > before) == (batches[b] < 7),
				      "%d threads, steps of %d rows: whole-expert tasks %s", threads[t],
				      batches[b], batches[b] < 7 ? "did not run" : "ran");
		}
	free(alone.logits);
	free(got.logits);
	dps_shard_free(&sd);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("batchinv");
	TCase *tc = tcase_create("batchinv");
	char err[256], path[128];
	int rc;

	snprintf(dir, sizeof(dir), "/tmp/dps-batchinv-XXXXXX");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, presets[i]);
		if (dps_mkmodel(&dps_mkmodel_preset(presets[i])->cfg, 11, DPS_ST_F32, path, err,
				sizeof(err))) {
			fprintf(stderr, "mkmodel %s: %s\n", presets[i], err);
			return 1;
		}
	}
	for (int i = 0; i < 2; i++) {
		struct dps_model_config c = dps_mkmodel_preset(i ? "tiny-moe" : "tiny-gpt-oss")->cfg;

		c.num_experts_per_tok = 4;
		snprintf(path, sizeof(path), "%s/%s", dir, top4[i]);
		if (dps_mkmodel(&c, 11, DPS_ST_F32, path, err, sizeof(err))) {
			fprintf(stderr, "mkmodel %s: %s\n", top4[i], err);
			return 1;
		}
	}
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_request_alone_equals_in_batch, 0,
			    (int)(sizeof(presets) / sizeof(presets[0])));
	tcase_add_loop_test(tc, test_whole_expert_tasks, 0, 2);
	suite_add_tcase(s, tc);
	rc = test_run_suite(s);
	snprintf(path, sizeof(path), "rm -rf '%s'", dir);
	if (system(path))
		return 1;
	return rc;
}

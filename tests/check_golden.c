/* SPDX-License-Identifier: MIT */
/*
 * tests/check_golden.c - stories260K against the outputs of an independent implementation
 * (tests/golden/stories260K, from llama2.c's run.c): the llama2.c checkpoint in
 * models/stories260K converted by dps_convert_llama2c, run by the reference decoder, must give
 * every row of logits within 1e-4, the same greedy tokens, and byte-identical text; the
 * tokenizer must encode the prompt to the same ids. Both folders are part of the repository:
 * a missing file is a failure, not a skip.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dps.h"
#include "tests/testutil.h"
#include "engine/model/convert.h"
#include "engine/model/model.h"
#include "engine/model/tok_llama2.h"
#include "kernels/kernels.h"

#define MODELS DPS_TEST_SRCDIR "/models/stories260K"
#define GOLDEN DPS_TEST_SRCDIR "/tests/golden/stories260K"

static char dir[64];
static struct dps_model model;
static struct dps_tok_llama2 tok;

static void setup(void)
{
	char err[512], path[128];

	test_tmpdir_make(dir, sizeof(dir), "golden");
	ck_assert_msg(!dps_convert_llama2c(MODELS "/stories260K.bin", MODELS "/tok512.bin", dir,
					   DPS_ST_F32, err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_model_load(&model, dir, NULL, err, sizeof(err)), "%s", err);
	snprintf(path, sizeof(path), "%s/tokenizer.bin", dir);
	ck_assert_msg(!dps_tok_llama2_load(&tok, path, &model.cfg, err, sizeof(err)), "%s", err);
}

static void teardown(void)
{
	dps_model_free(&model);
	dps_tok_llama2_free(&tok);
	test_tmpdir_remove(dir);
}

/* Reads the ids after "key:" in a golden ids file. */
static int read_ids(const char *path, const char *key, int *ids, int cap)
{
	char line[8192], *p;
	FILE *f = fopen(path, "r");
	int n = 0;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, strlen(key))) {
			p = strchr(line, ':') + 1;
			for (char *tk = strtok(p, " \n"); tk && n < cap; tk = strtok(NULL, " \n"))
				ids[n++] = atoi(tk);
			break;
		}
	fclose(f);
	return n;
}

/* Largest absolute difference between two rows; NaN counts as infinite. */
static double max_diff(const float *a, const float *b, int n)
{
	double d = 0;

	for (int i = 0; i < n; i++) {
		const double e = fabs((double)a[i] - (double)b[i]);

		if (!(e <= d))
			d = isnan(e) ? INFINITY : e;
	}
	return d;
}

START_TEST(test_config_and_tokenizer)
{
	int want[16], got[64], n;
	size_t k;

	ck_assert_int_eq(model.cfg.hidden_size, 64);
	ck_assert_int_eq(model.cfg.num_key_value_heads, 4);
	ck_assert_int_eq(model.cfg.tie_word_embeddings, 1);
	ck_assert_int_eq(tok.bos_id, 1);
	ck_assert_int_eq(tok.eos_id, 2);
	n = read_ids(GOLDEN "/once_upon_a_time.ids.txt", "prompt_ids", want, 16);
	ck_assert_int_eq(n, 5);
	ck_assert_int_eq(dps_tok_llama2_encode(&tok, "Once upon a time", 16, DPS_TOK_LLAMA2_BOS, got,
					      64, &k), 0);
	ck_assert_int_eq((int)k, n);
	for (int i = 0; i < n; i++)
		ck_assert_int_eq(got[i], want[i]);
	/* A code point in the vocabulary is one token; one outside it becomes its bytes. */
	ck_assert_int_eq(dps_tok_llama2_encode(&tok, "\xe2\x82\xac", 3, 0, got, 64, &k), 0);
	ck_assert_int_eq((int)k, 2);
	ck_assert_str_eq(tok.vocab[got[1]], "\xe2\x82\xac");
	ck_assert_int_eq(dps_tok_llama2_encode(&tok, "\xe4\xb8\xad", 3, 0, got, 64, &k), 0);
	ck_assert_int_eq((int)k, 4);
	ck_assert_int_eq(got[1], 0xe4 + 3);
	ck_assert_int_eq(got[3], 0xad + 3);
	/* ... and decodes back to the same bytes. */
	{
		char buf[8];
		size_t l;

		ck_assert_int_eq(*dps_tok_llama2_decode(&tok, got[0], got[1], buf, &l) & 0xff, 0xe4);
		ck_assert_uint_eq(l, 1);
	}
	/* Round trip of plain text through encode and decode. */
	{
		const char *text = "Lily saw a big, red ball. \"Hi!\" she said.";
		char out[256], buf[8];
		size_t l, len = 0;

		ck_assert_int_eq(dps_tok_llama2_encode(&tok, text, strlen(text), DPS_TOK_LLAMA2_BOS,
						      got, 64, &k), 0);
		for (size_t i = 1; i < k; i++) {
			const char *p = dps_tok_llama2_decode(&tok, got[i - 1], got[i], buf, &l);

			memcpy(out + len, p, l);
			len += l;
		}
		out[len] = '\0';
		ck_assert_str_eq(out, text);
	}
}
END_TEST

START_TEST(test_logits_once_upon_a_time)
{
	int all[128], n, vocab = model.cfg.vocab_size;
	float *golden = malloc(64 * (size_t)vocab * sizeof(float));
	double worst = 0;
	FILE *f;

	n = read_ids(GOLDEN "/once_upon_a_time.ids.txt", "all_ids", all, 128);
	ck_assert_int_eq(n, 65);
	f = fopen(GOLDEN "/once_upon_a_time.logits.f32", "rb");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fread(golden, sizeof(float) * (size_t)vocab, 64, f), 64);
	fclose(f);
	for (int t = 0; t < 64; t++) {
		/* _i = 0: the reference kernels; 1: the BLIS-backed products */
		const float *lg = _i ? dps_model_forward(&model, all[t], t)
				     : dps_model_forward_ref(&model, all[t], t);
		const double d = max_diff(lg, golden + (size_t)t * vocab, vocab);

		if (d > worst)
			worst = d;
		ck_assert_msg(d < 1e-4, "row %d differs by %g", t, d);
		if (t >= 4)
			ck_assert_int_eq(dps_argmax_ref(lg, vocab), all[t + 1]);
	}
	fprintf(stderr, "golden logits (%s): worst row differs by %.3g\n", _i ? "BLIS" : "reference",
		worst);
	/* The comparison can fail: a 1e-3 change of one logit is caught. */
	golden[17] += 1e-3f;
	ck_assert(max_diff(golden, golden, vocab) == 0);
	{
		float row[512];

		memcpy(row, golden, sizeof(float) * (size_t)vocab);
		row[17] -= 1e-3f;
		ck_assert(max_diff(row, golden, vocab) > 1e-4);
	}
	free(golden);
}
END_TEST

START_TEST(test_text_empty_prompt)
{
	int want[300], n, token = model.cfg.bos_token_id;
	char out[4096], golden[4096], buf[8];
	size_t len = 0, gl;
	FILE *f;

	n = read_ids(GOLDEN "/empty_prompt_n256.ids.txt", "all_ids", want, 300);
	ck_assert_int_eq(n, 257);
	for (int pos = 0; pos < 256; pos++) {
		const float *lg = dps_model_forward_ref(&model, token, pos);
		const int next = dps_argmax_ref(lg, model.cfg.vocab_size);
		size_t pl;
		const char *piece;

		ck_assert_msg(next == want[pos + 1], "position %d: %d, golden %d", pos, next,
			      want[pos + 1]);
		if (next == model.cfg.bos_token_id)
			break;
		piece = dps_tok_llama2_decode(&tok, token, next, buf, &pl);
		ck_assert_uint_lt(len + pl, sizeof(out));
		memcpy(out + len, piece, pl);
		len += pl;
		token = next;
	}
	out[len++] = '\n';
	f = fopen(GOLDEN "/empty_prompt_n256.stdout.txt", "rb");
	ck_assert_ptr_nonnull(f);
	gl = fread(golden, 1, sizeof(golden), f);
	fclose(f);
	ck_assert_uint_eq(len, gl);
	ck_assert(!memcmp(out, golden, len));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("golden");
	TCase *tc = tcase_create("golden");

	if (access(MODELS "/stories260K.bin", R_OK) || access(GOLDEN "/README.md", R_OK)) {
		printf("FAIL: %s or %s is missing from the source tree\n", MODELS "/stories260K.bin",
		       GOLDEN "/README.md");
		return 1;
	}
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_config_and_tokenizer);
	tcase_add_loop_test(tc, test_logits_once_upon_a_time, 0, 2);
	tcase_add_test(tc, test_text_empty_prompt);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

/* SPDX-License-Identifier: MIT */
/*
 * tests/check_convert.c - the llama2.c importer on checkpoints made up here: a two-layer
 * grouped-query model with an untied classifier converted to a directory and read back
 * through the checkpoint loader, every tensor against the rows it must come from (wq and wk
 * rotary-permuted, computed independently of convert.c); the config it writes loads; every
 * bad header refused with a message naming the field and the rule, before anything is
 * written. (stories260K against llama2.c's own outputs is in check_golden.c.)
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/model/ckpt.h"
#include "engine/model/convert.h"
#include "tests/testutil.h"

static char dir[64];

static void setup(void)
{
	test_tmpdir_make(dir, sizeof(dir), "convert");
}

static void teardown(void)
{
	test_tmpdir_remove(dir);
}

/* Float k of the weights: distinct and exact, so every row can be recognised. */
static float weight(size_t k)
{
	return (float)k * 0.25f - 100.0f;
}

static size_t n_floats(const int32_t h[7])
{
	const size_t dim = (size_t)h[0], hidden = (size_t)h[1], layers = (size_t)h[2];
	const size_t hd = dim / (size_t)h[3], kv_dim = (size_t)h[4] * hd;
	const size_t vocab = (size_t)(h[5] < 0 ? -h[5] : h[5]);

	return vocab * dim * (h[5] < 0 ? 2 : 1) +
	       layers * (2 * dim + 2 * dim * dim + 2 * kv_dim * dim + 3 * hidden * dim) + dim +
	       (size_t)h[6] * hd;
}

/* Writes a checkpoint of header h and extra floats beyond (or, negative, short of) its size. */
static void write_checkpoint(const char *path, const int32_t h[7], long extra)
{
	const long n = (long)n_floats(h) + extra;
	FILE *f = fopen(path, "wb");

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fwrite(h, 4, 7, f), 7);
	for (long k = 0; k < n; k++) {
		const float v = weight((size_t)k);

		ck_assert_int_eq(fwrite(&v, 4, 1, f), 1);
	}
	fclose(f);
}

/* Reads a whole tensor through the checkpoint loader; returns its values (free them). */
static float *load(struct dps_ckpt *ck, const char *name, size_t numel)
{
	float *buf = malloc(numel * sizeof(float));
	char err[512];

	ck_assert_ptr_nonnull(buf);
	ck_assert_msg(!dps_ckpt_load_shard(ck, name, 0, NULL, 0, 0, 1, buf, err, sizeof(err)),
		      "%s", err);
	return buf;
}

/*
 * Row r of a converted q or k matrix of `heads` heads of size hd is row src_row(r) of the
 * llama2.c one: Hugging Face rotates (i, i + hd/2) where llama2.c rotates (2i, 2i + 1).
 */
static size_t src_row(size_t r, size_t hd)
{
	const size_t h = r / hd, c = (r % hd) / (hd / 2), i = r % (hd / 2);

	return h * hd + 2 * i + c;
}

/* Checks rows x cols of got against the weights from float `at`, rows permuted when perm. */
static int rows_match(const float *got, size_t at, size_t rows, size_t cols, size_t hd, int perm)
{
	for (size_t r = 0; r < rows; r++)
		for (size_t c = 0; c < cols; c++)
			if (got[r * cols + c] != weight(at + (perm ? src_row(r, hd) : r) * cols + c))
				return 0;
	return 1;
}

START_TEST(test_convert_gqa_untied)
{
	/* dim 8, hidden 4, 2 layers, 2 heads of 4 (a permutation of 2 would be the identity),
	 * 1 KV head, 6 tokens untied, seq 3 */
	const int32_t h[7] = { 8, 4, 2, 2, 1, -6, 3 };
	const size_t dim = 8, hidden = 4, layers = 2, hd = 4, kv_dim = 4, vocab = 6, seq = 3;
	/* Offsets (in floats) of each block of the file, in llama2.c's order. */
	const size_t emb = 0, rms_att = emb + vocab * dim, wq = rms_att + layers * dim;
	const size_t wk = wq + layers * dim * dim, wv = wk + layers * kv_dim * dim;
	const size_t wo = wv + layers * kv_dim * dim, rms_ffn = wo + layers * dim * dim;
	const size_t w1 = rms_ffn + layers * dim, w2 = w1 + layers * hidden * dim;
	const size_t w3 = w2 + layers * dim * hidden, rms_final = w3 + layers * hidden * dim;
	const size_t wcls = rms_final + dim + seq * hd;
	char model[128], out[128], err[512], name[128];
	struct dps_model_config cfg;
	struct dps_ckpt ck;
	float *t;

	ck_assert_uint_eq(wcls + vocab * dim, n_floats(h));
	snprintf(model, sizeof(model), "%s/model.bin", dir);
	snprintf(out, sizeof(out), "%s/out", dir);
	write_checkpoint(model, h, 0);
	ck_assert_msg(!dps_convert_llama2c(model, NULL, out, DPS_ST_F32, err, sizeof(err)), "%s",
		      err);
	ck_assert_msg(!dps_model_config_load(out, &cfg, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(cfg.hidden_size, 8);
	ck_assert_int_eq(cfg.num_key_value_heads, 1);
	ck_assert_int_eq(cfg.head_dim, 4);
	ck_assert_int_eq(cfg.vocab_size, 6);
	ck_assert_int_eq(cfg.tie_word_embeddings, 0);
	ck_assert_int_eq(cfg.max_position_embeddings, 3);
	ck_assert_int_eq(cfg.bos_token_id, 1);
	ck_assert_int_eq(cfg.eos_token_id, 2);
	ck_assert_msg(!dps_ckpt_open(&ck, out, err, sizeof(err)), "%s", err);
	t = load(&ck, "model.embed_tokens.weight", vocab * dim);
	ck_assert(rows_match(t, emb, vocab, dim, hd, 0));
	free(t);
	t = load(&ck, "lm_head.weight", vocab * dim);
	ck_assert(rows_match(t, wcls, vocab, dim, hd, 0));
	free(t);
	t = load(&ck, "model.norm.weight", dim);
	ck_assert(rows_match(t, rms_final, 1, dim, hd, 0));
	free(t);
	for (size_t l = 0; l < layers; l++) {
#define LAYER(suffix) (snprintf(name, sizeof(name), "model.layers.%zu.%s", l, suffix), name)
		t = load(&ck, LAYER("self_attn.q_proj.weight"), dim * dim);
		ck_assert(rows_match(t, wq + l * dim * dim, dim, dim, hd, 1));
		/* The check can fail: the same rows unpermuted do not match. */
		ck_assert(!rows_match(t, wq + l * dim * dim, dim, dim, hd, 0));
		free(t);
		t = load(&ck, LAYER("self_attn.k_proj.weight"), kv_dim * dim);
		ck_assert(rows_match(t, wk + l * kv_dim * dim, kv_dim, dim, hd, 1));
		free(t);
		t = load(&ck, LAYER("self_attn.v_proj.weight"), kv_dim * dim);
		ck_assert(rows_match(t, wv + l * kv_dim * dim, kv_dim, dim, hd, 0));
		free(t);
		t = load(&ck, LAYER("self_attn.o_proj.weight"), dim * dim);
		ck_assert(rows_match(t, wo + l * dim * dim, dim, dim, hd, 0));
		free(t);
		t = load(&ck, LAYER("input_layernorm.weight"), dim);
		ck_assert(rows_match(t, rms_att + l * dim, 1, dim, hd, 0));
		free(t);
		t = load(&ck, LAYER("post_attention_layernorm.weight"), dim);
		ck_assert(rows_match(t, rms_ffn + l * dim, 1, dim, hd, 0));
		free(t);
		t = load(&ck, LAYER("mlp.gate_proj.weight"), hidden * dim);
		ck_assert(rows_match(t, w1 + l * hidden * dim, hidden, dim, hd, 0));
		free(t);
		t = load(&ck, LAYER("mlp.down_proj.weight"), dim * hidden);
		ck_assert(rows_match(t, w2 + l * dim * hidden, dim, hidden, hd, 0));
		free(t);
		t = load(&ck, LAYER("mlp.up_proj.weight"), hidden * dim);
		ck_assert(rows_match(t, w3 + l * hidden * dim, hidden, dim, hd, 0));
		free(t);
#undef LAYER
	}
	dps_ckpt_close(&ck);
}
END_TEST

START_TEST(test_mem_matches_file)
{
	/* The in-memory entry point sees the same tensors as the file path wrote. */
	const int32_t h[7] = { 4, 3, 1, 2, 1, 5, 2 };
	const size_t n = n_floats(h);
	uint32_t *buf = malloc(28 + n * 4);
	struct dps_convert_model m;
	char err[512];

	ck_assert_ptr_nonnull(buf);
	memcpy(buf, h, 28);
	for (size_t k = 0; k < n; k++) {
		const float v = weight(k);

		memcpy(buf + 7 + k, &v, 4);
	}
	ck_assert_msg(!dps_convert_llama2c_mem(buf, 28 + n * 4, DPS_ST_BF16, "mem", &m, err,
					       sizeof(err)), "%s", err);
	ck_assert_int_eq(m.n_tensors, 9 + 2); /* tied: no lm_head */
	ck_assert_str_eq(m.tensors[0].name, "model.embed_tokens.weight");
	ck_assert_ptr_eq(m.tensors[0].data, (float *)(buf + 7));
	ck_assert_int_eq(m.tensors[0].dtype, DPS_ST_BF16);
	ck_assert_str_eq(m.tensors[10].name, "model.norm.weight");
	ck_assert_int_eq(m.cfg.tie_word_embeddings, 1);
	dps_convert_model_free(&m);
	/* One float short: refused, with both sizes in the message. */
	ck_assert_int_eq(dps_convert_llama2c_mem(buf, 28 + n * 4 - 4, DPS_ST_F32, "mem", &m, err,
						 sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "mem: ") && strstr(err, "implies"), "%s", err);
	ck_assert_ptr_null(m.tensors);
	free(buf);
}
END_TEST

START_TEST(test_bad_headers)
{
	static const struct {
		int32_t h[7];
		int full;   /* weights of the size the header implies, plus extra floats */
		long extra;
		const char *msg;
	} bad[] = {
		{ { -4, 3, 1, 2, 1, 5, 2 }, 0, 0, "dim -4 is outside [2, 65536]" },
		{ { 4, 0, 1, 2, 1, 5, 2 }, 0, 0, "hidden_dim 0 is outside" },
		{ { 4, 3, 0, 2, 1, 5, 2 }, 0, 0, "n_layers 0 is outside" },
		{ { 4, 3, 1, -2, 1, 5, 2 }, 0, 0, "n_heads -2 is outside [1, 4]" },
		{ { 4, 3, 1, 2, 4, 5, 2 }, 0, 0, "n_kv_heads 4 is outside [1, 2]" },
		{ { 4, 3, 1, 2, 1, 5, 0 }, 0, 0, "seq_len 0 is outside" },
		{ { 6, 3, 1, 4, 1, 5, 2 }, 0, 0, "n_heads 4 does not divide dim 6" },
		{ { 8, 3, 1, 4, 3, 5, 2 }, 0, 0, "n_kv_heads 3 does not divide n_heads 4" },
		{ { 6, 3, 1, 2, 1, 5, 2 }, 0, 0, "dim / n_heads = 6 / 2 = 3 is odd" },
		{ { 4, 3, 1, 2, 1, INT32_MIN, 2 }, 0, 0, "vocab_size -2147483648" },
		{ { 4, 3, 1, 2, 1, 0, 2 }, 0, 0, "vocab_size 0" },
		{ { 4, 3, 1, 2, 1, 2, 2 }, 1, 0, "vocab_size 2 (negative" }, /* right size, too */
		{ { 4, 3, 1, 2, 1, -2, 2 }, 0, 0, "BOS and EOS" },
		{ { 4, 3, 1, 2, 1, (1 << 24) + 1, 2 }, 0, 0, "vocab_size 16777217" },
		{ { 65536, 262144, 1024, 1, 1, 1 << 24, 1 << 24 }, 0, 0, "bytes but the header" },
		{ { 4, 3, 1, 2, 1, 5, 2 }, 1, -1, "bytes but the header" },
		{ { 4, 3, 1, 2, 1, 5, 2 }, 1, 1, "bytes but the header" },
		{ { 4, 3, 1, 2, 1, 5, 2 }, 1, 0, NULL }, /* last: the right size is accepted */
	};
	char model[128], out[128], err[512];
	struct stat st;

	snprintf(model, sizeof(model), "%s/model.bin", dir);
	snprintf(out, sizeof(out), "%s/out", dir);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		FILE *f;

		/* A header that breaks a rule gets a few floats: only the header matters. */
		if (bad[i].full) {
			write_checkpoint(model, bad[i].h, bad[i].extra);
		} else {
			f = fopen(model, "wb");
			ck_assert_ptr_nonnull(f);
			ck_assert_int_eq(fwrite(bad[i].h, 4, 7, f), 7);
			ck_assert_int_eq(fwrite(bad[i].h, 4, 4, f), 4);
			fclose(f);
		}
		err[0] = '\0';
		if (!bad[i].msg) {
			/* The checker can fail: this one is good. */
			ck_assert_msg(!dps_convert_llama2c(model, NULL, out, DPS_ST_F32, err,
							   sizeof(err)), "%s", err);
			continue;
		}
		ck_assert_int_eq(dps_convert_llama2c(model, NULL, out, DPS_ST_F32, err, sizeof(err)),
				 -EINVAL);
		ck_assert_msg(strstr(err, bad[i].msg) && strstr(err, model),
			      "case %zu: '%s' lacks '%s'", i, err, bad[i].msg);
		/* Refused before anything is written. */
		ck_assert_int_ne(stat(out, &st), 0);
	}
}
END_TEST

START_TEST(test_not_a_checkpoint)
{
	char model[128], out[128], err[512];
	FILE *f;

	snprintf(model, sizeof(model), "%s/short.bin", dir);
	snprintf(out, sizeof(out), "%s/out", dir);
	f = fopen(model, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fwrite("llama", 1, 5, f), 5);
	fclose(f);
	ck_assert_int_eq(dps_convert_llama2c(model, NULL, out, DPS_ST_F32, err, sizeof(err)),
			 -EINVAL);
	ck_assert_msg(strstr(err, "no 28-byte header"), "%s", err);
	ck_assert_int_eq(dps_convert_llama2c(dir, NULL, out, DPS_ST_F32, err, sizeof(err)),
			 -EINVAL);
	ck_assert_msg(strstr(err, "not a regular file"), "%s", err);
	snprintf(model, sizeof(model), "%s/missing.bin", dir);
	ck_assert_int_eq(dps_convert_llama2c(model, NULL, out, DPS_ST_F32, err, sizeof(err)),
			 -ENOENT);
	ck_assert_msg(strstr(err, "missing.bin"), "%s", err);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("convert");
	TCase *tc = tcase_create("convert");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_convert_gqa_untied);
	tcase_add_test(tc, test_mem_matches_file);
	tcase_add_test(tc, test_bad_headers);
	tcase_add_test(tc, test_not_a_checkpoint);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

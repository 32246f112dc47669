/* SPDX-License-Identifier: MIT */
/*
 * tests/check_moe.c - the mixture-of-experts decoder (GPT-OSS) on one rank.
 *
 * Independent oracle: a GPT-OSS model D with a single expert that every token takes, and M
 * built from D's tensors with that expert copied into each of E experts and a random router.
 * Whatever the router picks, the routing weights sum to 1, so M must give D's logits; a
 * perturbed expert must not. (Against Hugging Face's own maths, tests/hf_oracle.sh.) Also: the
 * reference step over many rows equals the one-row reference bit for bit (routing is per row),
 * the fast step is within rounding of it on the tiny-moe preset, the router really spreads
 * rows over experts, and config.json round-trips the MoE fields and refuses bad ones.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "tests/testutil.h"
#include "tests/oracle.h"
#include "engine/model/ckpt.h"
#include "engine/model/mkmodel.h"
#include "engine/model/model.h"

static char dir[64];

static void setup(void)
{
	test_tmpdir_make(dir, sizeof(dir), "moe");
}

static void teardown(void)
{
	test_tmpdir_remove(dir);
}

static struct dps_model_config moe_cfg(double limit)
{
	struct dps_model_config c = dps_mkmodel_preset("tiny-moe")->cfg;

	c.swiglu_limit = limit;
	return c;
}

/*
 * Writes D, a GPT-OSS model with one expert per layer chosen by every token (top 1), and M:
 * D's tensors with that expert copied into all E experts (perturb added to expert 3's down
 * projection) and a random router with bias.
 */
static void build_pair(float perturb)
{
	struct dps_model_config dc = moe_cfg(7.0), mc = moe_cfg(7.0);
	struct dps_st_writer_tensor *t;
	struct dps_ckpt ck;
	char d[128], m[128], path[192], err[256];
	float **bufs;
	int n = 0, nb = 0;
	const int E = mc.num_local_experts, h = dc.hidden_size;

	dc.num_local_experts = dc.num_experts_per_tok = 1;
	snprintf(d, sizeof(d), "%s/dense", dir);
	snprintf(m, sizeof(m), "%s/moe", dir);
	ck_assert_msg(!dps_mkmodel(&dc, 6, DPS_ST_F32, d, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(dps_ckpt_open(&ck, d, err, sizeof(err)), 0);
	t = calloc(512, sizeof(*t));
	bufs = calloc(512, sizeof(*bufs));
	for (int f = 0; f < ck.n_files; f++)
		for (int i = 0; i < ck.files[f].n; i++) {
			const struct dps_st_tensor *src = &ck.files[f].t[i];
			const int expert = strstr(src->name, ".mlp.experts.") != NULL;
			float *b;

			if (strstr(src->name, ".mlp.router."))
				continue; /* M's own, below */
			b = malloc(sizeof(float) * src->numel * (expert ? (size_t)E : 1));
			bufs[nb++] = b;
			ck_assert_int_eq(dps_ckpt_load_range(&ck, src->name, 0, NULL, 0, 0, src->shape[0],
							     b, err, sizeof(err)), 0);
			snprintf(t[n].name, sizeof(t[n].name), "%s", src->name);
			t[n].dtype = DPS_ST_F32;
			t[n].ndim = src->ndim;
			memcpy(t[n].shape, src->shape, sizeof(t[n].shape));
			if (expert) { /* (1, ...) -> (E, ...): every expert a copy of the one */
				ck_assert_int_eq(src->shape[0], 1);
				t[n].shape[0] = (uint64_t)E;
				for (int e = 1; e < E; e++)
					memcpy(b + (size_t)e * src->numel, b, sizeof(float) * src->numel);
				if (perturb != 0 && strstr(src->name, "down_proj") &&
				    !strstr(src->name, "bias"))
					for (uint64_t q = 0; q < src->numel; q++)
						b[3 * src->numel + q] += perturb;
			}
			t[n++].data = b;
		}
	/* Random routers with bias, so rows spread over the experts. */
	for (int l = 0; l < mc.num_hidden_layers; l++) {
		float *r, *bias;

		if (!dps_cfg_layer_moe(&mc, l))
			continue;
		r = malloc(sizeof(float) * (size_t)E * h);
		bias = malloc(sizeof(float) * (size_t)E);
		for (int i = 0; i < E * h; i++)
			r[i] = oracle_f32((uint32_t)l, (uint32_t)i, 77);
		for (int e = 0; e < E; e++)
			bias[e] = 0.5f * oracle_f32((uint32_t)l, (uint32_t)e, 78);
		bufs[nb++] = r;
		bufs[nb++] = bias;
		snprintf(t[n].name, sizeof(t[n].name), "model.layers.%d.mlp.router.weight", l);
		t[n].dtype = DPS_ST_F32;
		t[n].ndim = 2;
		t[n].shape[0] = (uint64_t)E;
		t[n].shape[1] = (uint64_t)h;
		t[n++].data = r;
		snprintf(t[n].name, sizeof(t[n].name), "model.layers.%d.mlp.router.bias", l);
		t[n].dtype = DPS_ST_F32;
		t[n].ndim = 1;
		t[n].shape[0] = (uint64_t)E;
		t[n++].data = bias;
	}
	dps_ckpt_close(&ck);
	snprintf(path, sizeof(path), "mkdir -p '%s'", m);
	ck_assert_int_eq(system(path), 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", m);
	ck_assert_int_eq(dps_st_write(path, t, n), 0);
	snprintf(path, sizeof(path), "%s/config.json", m);
	ck_assert_int_eq(dps_model_config_save(&mc, path), 0);
	for (int i = 0; i < nb; i++)
		free(bufs[i]);
	free(bufs);
	free(t);
}

/* Largest |logit difference| of D and M over 16 rows of a prompt, fast or reference. */
static double compare_pair(int fast, int *spread)
{
	struct dps_model a, b;
	char d[128], m[128], err[256];
	int tok[16], pos[16], seq[16] = { 0 }, used[64] = { 0 };
	double worst = 0;
	const float *la, *lb;

	snprintf(d, sizeof(d), "%s/dense", dir);
	snprintf(m, sizeof(m), "%s/moe", dir);
	ck_assert_msg(!dps_model_load(&a, d, &(struct dps_model_opts){ .max_pos = 32, .max_rows = 16 },
				      err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_model_load(&b, m, &(struct dps_model_opts){ .max_pos = 32, .max_rows = 16 },
				      err, sizeof(err)), "%s", err);
	for (int i = 0; i < 16; i++) {
		tok[i] = (i * 37 + 11) % 256;
		pos[i] = i;
	}
	la = fast ? dps_model_step(&a, 16, tok, pos, seq, NULL)
		  : dps_model_step_ref(&a, 16, tok, pos, seq, NULL);
	lb = fast ? dps_model_step(&b, 16, tok, pos, seq, NULL)
		  : dps_model_step_ref(&b, 16, tok, pos, seq, NULL);
	for (int i = 0; i < 16 * 256; i++)
		if (fabs((double)la[i] - lb[i]) > worst)
			worst = fabs((double)la[i] - lb[i]);
	*spread = 0;
	for (int s = 0; s < 16 * b.cfg.num_experts_per_tok; s++)
		used[b.route_e[s]] = 1;
	for (int e = 0; e < 64; e++)
		*spread += used[e];
	dps_model_free(&a);
	dps_model_free(&b);
	return worst;
}

START_TEST(test_identical_experts_equal_one)
{
	int spread;
	double e;

	build_pair(0);
	e = compare_pair(0, &spread);
	ck_assert_msg(e < 2e-5, "reference: MoE of copies differs from one expert by %g", e);
	ck_assert_int_ge(spread, 4); /* the router did spread the rows */
	e = compare_pair(1, &spread);
	ck_assert_msg(e < 2e-5, "fast: MoE of copies differs from one expert by %g", e);
}
END_TEST

START_TEST(test_perturbed_expert_caught)
{
	int spread;

	build_pair(0.05f);
	ck_assert(compare_pair(0, &spread) > 1e-3);
}
END_TEST

START_TEST(test_batched_and_fast)
{
	struct dps_model_config c = moe_cfg(7.0);
	struct dps_model m;
	char p[128], err[256];
	int tok[12], pos[12], seq[12] = { 0 };
	float *ref = malloc(sizeof(float) * 12 * 256), *one = malloc(sizeof(float) * 12 * 256);
	const float *lg;
	double worst = 0;

	snprintf(p, sizeof(p), "%s/tm", dir);
	ck_assert_msg(!dps_mkmodel(&c, 8, DPS_ST_F32, p, err, sizeof(err)), "%s", err);
	for (int i = 0; i < 12; i++) {
		tok[i] = (i * 53 + 5) % 256;
		pos[i] = i;
	}
	/* Reference, all rows in one step, then one row per step: bit for bit. */
	ck_assert(!dps_model_load(&m, p, &(struct dps_model_opts){ .max_pos = 16, .max_rows = 12 },
				  err, sizeof(err)));
	memcpy(ref, dps_model_step_ref(&m, 12, tok, pos, seq, NULL), sizeof(float) * 12 * 256);
	dps_model_free(&m);
	ck_assert(!dps_model_load(&m, p, &(struct dps_model_opts){ .max_pos = 16, .max_rows = 12 },
				  err, sizeof(err)));
	for (int i = 0; i < 12; i++)
		memcpy(one + (size_t)i * 256, dps_model_forward_ref(&m, tok[i], i),
		       sizeof(float) * 256);
	ck_assert_int_eq(memcmp(ref, one, sizeof(float) * 12 * 256), 0);
	dps_model_free(&m);
	/* Fast within rounding of the reference. */
	ck_assert(!dps_model_load(&m, p, &(struct dps_model_opts){ .max_pos = 16, .max_rows = 12 },
				  err, sizeof(err)));
	lg = dps_model_step(&m, 12, tok, pos, seq, NULL);
	for (int i = 0; i < 12 * 256; i++)
		if (fabs((double)lg[i] - ref[i]) > worst)
			worst = fabs((double)lg[i] - ref[i]);
	ck_assert_msg(worst < 1e-4, "fast vs reference: %g", worst);
	dps_model_free(&m);
	free(ref);
	free(one);
}
END_TEST

START_TEST(test_config)
{
	static const struct { const char *json, *msg; } bad[] = {
		{ "\"num_local_experts\": 4, \"num_experts_per_tok\": 5", "num_experts_per_tok 5" },
		{ "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"mlp_only_layers\": [1]",
		  "'mlp_only_layers' is not read" },
		{ "\"num_local_experts\": -1", "num_local_experts" },
		{ "\"num_local_experts\": 4, \"swiglu_limit\": 0", "swiglu_limit" },
	};
	struct dps_model_config c = moe_cfg(7.0), d;
	char path[128], err[256], json[512];

	snprintf(path, sizeof(path), "%s/config.json", dir);
	ck_assert_int_eq(dps_model_config_save(&c, path), 0);
	ck_assert_msg(!dps_model_config_load(dir, &d, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(d.arch, DPS_ARCH_GPT_OSS);
	ck_assert_int_eq(d.num_local_experts, 8);
	ck_assert_int_eq(d.num_experts_per_tok, 2);
	ck_assert(d.swiglu_limit == 7.0);
	for (int l = 0; l < d.num_hidden_layers; l++)
		ck_assert(dps_cfg_layer_moe(&d, l));
	ck_assert_int_eq(d.sliding_window, c.sliding_window);
	ck_assert_int_eq(d.rope.kind, c.rope.kind);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(json, sizeof(json), "{\"architectures\": [\"GptOssForCausalLM\"], "
			 "\"hidden_size\": 64, \"intermediate_size\": 96, "
			 "\"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, "
			 "\"vocab_size\": 256, "
			 "%s}", bad[i].json);
		ck_assert_int_eq(dps_model_config_parse(json, strlen(json), &d, err, sizeof(err)),
				 -EINVAL);
		ck_assert_msg(strstr(err, bad[i].msg), "%s: %s", bad[i].json, err);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("moe");
	TCase *tc = tcase_create("moe");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_identical_experts_equal_one);
	tcase_add_test(tc, test_perturbed_expert_caught);
	tcase_add_test(tc, test_batched_and_fast);
	tcase_add_test(tc, test_config);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

/* SPDX-License-Identifier: MIT */
/*
 * tests/check_bf16.c - the linear product on BF16 weights (kernels/gemm.h). The contract: a
 * BF16 product is, bit for bit, the f32 product of the widened weights. The oracle is the f32
 * plain-C twin (dps_gemm_f32_ref) on weights widened here with a shift of our own; every BF16
 * path is held to it - the plain-C twin, AVX2 and AVX-512 (each in both its forms: dot product
 * below GEMM_TILE_M_MIN rows, register tile from there on) and dps_linear_bf16 over 1, 2 and 3
 * threads - at m = 1, 2, 47, 48, 129 with tails in k and n and signed zeros. The narrowing is
 * checked against round-to-nearest-even found by comparing neighbours in double, and two wrong
 * products are shown to be caught: the f32 weights before narrowing, and vdpbf16ps's order
 * (a pair of products added before it is accumulated).
 *
 * F16 weights likewise (test_f16_paths): every path and form is the f32 product of the weights
 * widened by the CPU's F16C, and the same weights read as BF16 are caught.
 *
 * The engine: a BF16 checkpoint (mkmodel --dtype bf16) loaded with --dtype bf16 gives, on one
 * rank, the logits of every prefill and greedy decode step bit for bit as the same checkpoint
 * widened to f32 (--dtype f32), for a dense model, f32 experts and GPT-OSS's biases and sinks,
 * in about half the bytes; an F16 checkpoint is kept F16 by --dtype auto, with the same
 * contract; the F32 checkpoint of the unrounded weights gives other logits.
 * (Sharded layouts: tests/cli.sh compares their ids.)
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "common/f16.h"
#include "engine/model/mkmodel.h"
#include "engine/shard/shard.h"
#include "kernels/gemm.h"
#include "kernels/gemm_int.h"

static const int shapes[][3] = { { 1, 67, 70 },	  { 1, 2048, 768 }, { 47, 96, 33 },
				 { 47, 21, 129 }, { 48, 96, 33 },   { 48, 37, 64 },
				 { 129, 67, 40 }, { 129, 100, 771 }, { 3, 5, 7 },
				 { 1, 9, 2063 }, { 2, 67, 70 },    { 2, 13, 17 },
				 { 1, 7, 90 },   { 1, 6, 48 } }; /* k % 32 of 16 and more */

static float frand(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* Our own widening, so that the oracle shares nothing with the kernels' helpers. */
static float widen(uint16_t h)
{
	union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };

	return v.f;
}

struct prob {
	int m, n, k;
	float *x, *w, *ww; /* x (m, k); w (n, k) f32 as drawn; ww: w narrowed then widened */
	uint16_t *wb;      /* w narrowed */
	float *want;       /* dps_gemm_f32_ref(x, ww), row stride n */
};

static void prob_make(struct prob *p, int m, int n, int k, unsigned seed)
{
	p->m = m;
	p->n = n;
	p->k = k;
	p->x = malloc(sizeof(float) * (size_t)m * k + 4);
	p->w = malloc(sizeof(float) * (size_t)n * k + 4);
	p->ww = malloc(sizeof(float) * (size_t)n * k + 4);
	p->wb = malloc(sizeof(uint16_t) * (size_t)n * k + 4);
	p->want = malloc(sizeof(float) * (size_t)m * n + 4);
	ck_assert(p->x && p->w && p->ww && p->wb && p->want);
	for (int i = 0; i < m * k; i++)
		p->x[i] = frand(&seed);
	for (int i = 0; i < n * k; i++) {
		p->w[i] = i % 29 == 3 ? -0.0f : frand(&seed);
		p->wb[i] = dps_f32_to_bf16(p->w[i]);
		p->ww[i] = widen(p->wb[i]);
	}
	dps_gemm_f32_ref(p->want, n, p->x, p->ww, m, n, k);
}

static void prob_free(struct prob *p)
{
	free(p->x);
	free(p->w);
	free(p->ww);
	free(p->wb);
	free(p->want);
}

START_TEST(test_narrowing_is_nearest_even)
{
	/* Against the two neighbouring BF16 values compared in double (ties: even mantissa). */
	unsigned seed = 7;

	for (int i = 0; i < 200000; i++) {
		union { uint32_t u; float f; } v;
		uint16_t got, lo;
		double dlo, dhi, d;

		seed = seed * 1664525u + 1013904223u;
		v.u = seed;
		if ((v.u & 0x7f800000u) == 0x7f800000u)
			continue; /* NaN and infinities below */
		got = dps_f32_to_bf16(v.f);
		lo = (uint16_t)(v.u >> 16); /* toward zero */
		dlo = widen(lo);
		dhi = widen((uint16_t)(lo + 1)); /* away from zero */
		if (isinf(dhi)) /* IEEE rounds past the largest finite value as if to 2^128 */
			dhi = copysign(ldexp(1.0, 128), dhi);
		d = v.f;
		if (fabs(d - dlo) < fabs(dhi - d))
			ck_assert_uint_eq(got, lo);
		else if (fabs(d - dlo) > fabs(dhi - d))
			ck_assert_uint_eq(got, (uint16_t)(lo + 1));
		else
			ck_assert_uint_eq(got, (lo & 1) ? (uint16_t)(lo + 1) : lo);
	}
	ck_assert(isnan(widen(dps_f32_to_bf16(NAN))));
	ck_assert_uint_eq(dps_f32_to_bf16(INFINITY), 0x7f80);
	ck_assert_uint_eq(dps_f32_to_bf16(-0.0f), 0x8000);
	ck_assert_uint_eq(dps_f32_to_bf16(1.0f + 1.0f / 256.0f), 0x3f80); /* a tie, to even */
	ck_assert_uint_eq(dps_f32_to_bf16(1.0f + 3.0f / 256.0f), 0x3f82); /* a tie, to even (up) */
}
END_TEST

typedef void bf16_fn(float *restrict out, int ldo, const float *restrict x,
		     const uint16_t *restrict W, int m, int n, int k);
static bf16_fn *paths[3];
static const char *names[3];
static int n_paths;

START_TEST(test_paths_give_f32_bits)
{
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		struct prob p;
		float *got;

		prob_make(&p, shapes[s][0], shapes[s][1], shapes[s][2], 11u + (unsigned)s);
		got = calloc((size_t)p.m * p.n, sizeof(float));
		paths[_i](got, p.n, p.x, p.wb, p.m, p.n, p.k);
		ck_assert_msg(!memcmp(got, p.want, sizeof(float) * (size_t)p.m * p.n),
			      "%s m=%d n=%d k=%d: not the f32 product of the widened weights",
			      names[_i], p.m, p.n, p.k);
		free(got);
		prob_free(&p);
	}
}
END_TEST

START_TEST(test_tile_form)
{
	/* The register-tile form by itself (the entry points may fall back to the dot form). */
	__builtin_cpu_init();
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		struct prob p;
		float *got;

		if (shapes[s][0] < GEMM_TILE_M_MIN)
			continue;
		prob_make(&p, shapes[s][0], shapes[s][1], shapes[s][2], 23u + (unsigned)s);
		got = calloc((size_t)p.m * p.n, sizeof(float));
		if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
			ck_assert_int_eq(dps_gemm_tile_bf16_avx2(got, p.n, p.x, p.wb, p.m, p.n, p.k), 0);
			ck_assert_msg(!memcmp(got, p.want, sizeof(float) * (size_t)p.m * p.n),
				      "tile avx2 m=%d n=%d k=%d", p.m, p.n, p.k);
		}
		if (__builtin_cpu_supports("avx512f")) {
			ck_assert_int_eq(dps_gemm_tile_bf16_avx512(got, p.n, p.x, p.wb, p.m, p.n, p.k), 0);
			ck_assert_msg(!memcmp(got, p.want, sizeof(float) * (size_t)p.m * p.n),
				      "tile avx512 m=%d n=%d k=%d", p.m, p.n, p.k);
		}
		free(got);
		prob_free(&p);
	}
}
END_TEST

START_TEST(test_linear_threads)
{
	/* dps_linear_bf16 and dps_linear_w on 1, 2 and 3 threads: the f32 product's bits. */
	const int threads = 1 + _i;
	char msg[256];

	ck_assert_msg(!dps_gemm_setup("auto", threads, msg, sizeof(msg)), "%s", msg);
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		struct prob p;
		float *got, *f32;

		prob_make(&p, shapes[s][0], shapes[s][1], shapes[s][2], 31u + (unsigned)s);
		got = calloc((size_t)p.m * p.n, sizeof(float));
		f32 = calloc((size_t)p.m * p.n, sizeof(float));
		dps_linear_bf16(got, p.x, p.wb, p.m, p.n, p.k);
		ck_assert_msg(!memcmp(got, p.want, sizeof(float) * (size_t)p.m * p.n),
			      "%d threads m=%d n=%d k=%d", threads, p.m, p.n, p.k);
		dps_linear_w(got, p.x, p.wb, DPS_WT_BF16, p.m, p.n, p.k);
		dps_linear_w(f32, p.x, p.ww, DPS_WT_F32, p.m, p.n, p.k);
		ck_assert(!memcmp(got, f32, sizeof(float) * (size_t)p.m * p.n));
		dps_linear_bf16_ref(got, p.x, p.wb, p.m, p.n, p.k);
		ck_assert(!memcmp(got, p.want, sizeof(float) * (size_t)p.m * p.n));
		free(got);
		free(f32);
		prob_free(&p);
	}
}
END_TEST

/* The F16 of f widened by the CPU's F16C (an oracle that shares nothing with common/f16.c). */
__attribute__((target("f16c"))) static float f16_hw(uint16_t h)
{
	return _cvtsh_ss(h);
}

START_TEST(test_f16_paths)
{
	/*
	 * F16 weights (common/f16.h): every path, both forms, and dps_linear_f16 over 1 and 3
	 * threads give the f32 twin's bits on the weights widened by F16C.
	 */
	char msg[256];

	__builtin_cpu_init();
	if (!__builtin_cpu_supports("f16c"))
		return; /* the oracle widens with F16C; main() says so */
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		struct prob p;
		const size_t nk = (size_t)shapes[s][1] * (size_t)shapes[s][2];
		uint16_t *wf = malloc(sizeof(uint16_t) * nk + 2);
		float *wh = malloc(sizeof(float) * nk + 4), *want, *got;

		prob_make(&p, shapes[s][0], shapes[s][1], shapes[s][2], 41u + (unsigned)s);
		for (size_t i = 0; i < nk; i++) {
			wf[i] = dps_f32_to_f16(p.w[i]);
			wh[i] = f16_hw(wf[i]);
		}
		want = calloc((size_t)p.m * p.n, sizeof(float));
		got = calloc((size_t)p.m * p.n, sizeof(float));
		dps_gemm_f32_ref(want, p.n, p.x, wh, p.m, p.n, p.k);
		dps_gemm_f16_ref(got, p.n, p.x, wf, p.m, p.n, p.k);
		ck_assert_msg(!memcmp(got, want, sizeof(float) * (size_t)p.m * p.n), "f16 ref");
		if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
			dps_gemm_f16_avx2(got, p.n, p.x, wf, p.m, p.n, p.k);
			ck_assert_msg(!memcmp(got, want, sizeof(float) * (size_t)p.m * p.n),
				      "f16 avx2 m=%d n=%d k=%d", p.m, p.n, p.k);
			if (p.m >= GEMM_TILE_M_MIN) {
				ck_assert_int_eq(dps_gemm_tile_f16_avx2(got, p.n, p.x, wf, p.m, p.n, p.k), 0);
				ck_assert(!memcmp(got, want, sizeof(float) * (size_t)p.m * p.n));
			}
		}
		if (__builtin_cpu_supports("avx512f")) {
			dps_gemm_f16_avx512(got, p.n, p.x, wf, p.m, p.n, p.k);
			ck_assert_msg(!memcmp(got, want, sizeof(float) * (size_t)p.m * p.n),
				      "f16 avx512 m=%d n=%d k=%d", p.m, p.n, p.k);
			if (p.m >= GEMM_TILE_M_MIN) {
				ck_assert_int_eq(dps_gemm_tile_f16_avx512(got, p.n, p.x, wf, p.m, p.n, p.k), 0);
				ck_assert(!memcmp(got, want, sizeof(float) * (size_t)p.m * p.n));
			}
		}
		for (int threads = 1; threads <= 3; threads += 2) {
			ck_assert_msg(!dps_gemm_setup("auto", threads, msg, sizeof(msg)), "%s", msg);
			dps_linear_w(got, p.x, wf, DPS_WT_F16, p.m, p.n, p.k);
			ck_assert(!memcmp(got, want, sizeof(float) * (size_t)p.m * p.n));
		}
		/* the check can fail: the same weights read as BF16 are others */
		dps_gemm_bf16_ref(got, p.n, p.x, wf, p.m, p.n, p.k);
		ck_assert(memcmp(got, want, sizeof(float) * (size_t)p.m * p.n));
		free(wf), free(wh), free(want), free(got);
		prob_free(&p);
	}
}
END_TEST

START_TEST(test_wrong_products_are_caught)
{
	/*
	 * The check can fail: the product of the unrounded f32 weights, and vdpbf16ps's order
	 * (lane l adds w0 x0 + w1 x1 of a pair of columns, rounded, to its sum), both differ
	 * from the contract's bits on this problem.
	 */
	struct prob p;
	float *got = NULL;
	int differ = 0;

	prob_make(&p, 4, 33, 771, 5);
	got = calloc((size_t)p.m * p.n, sizeof(float));
	dps_gemm_f32_ref(got, p.n, p.x, p.w, p.m, p.n, p.k);
	ck_assert(memcmp(got, p.want, sizeof(float) * (size_t)p.m * p.n));
	for (int i = 0; i < p.m; i++)
		for (int r = 0; r < p.n; r++) {
			float a[16] = { 0.0f }, h = 0.0f;

			for (int c = 0; c < p.k; c += 2) {
				const float *x = p.x + (size_t)i * p.k + c, *w = p.ww + (size_t)r * p.k + c;
				/* k is odd: the last pair's second product is the padding's, 0 (without
				 * it, every output would differ for the lost column, not the order) */
				const float second = c + 1 < p.k ? x[1] * w[1] : 0.0f;

				a[(c / 2) % 16] += x[0] * w[0] + second;
			}
			for (int l = 0; l < 16; l++)
				h += a[l];
			differ += h != p.want[(size_t)i * p.n + r];
		}
	ck_assert_int_gt(differ, 0);
	free(got);
	prob_free(&p);
}
END_TEST


static char dir[64];
static const char *const presets[] = { "tiny", "tiny-moe", "tiny-gpt-oss" };

static void shard_load(struct dps_shard *sd, const char *path, enum dps_shard_dtype dt)
{
	struct dps_par_cfg par = { 0 };
	char err[512];

	par.tp = par.dp = par.attn_dp = par.emb_dp = par.mlp_dp = par.draft_mlp_dp = par.lm_head_dp = 1;
	ck_assert_msg(!dps_shard_load(sd, NULL, &par, path,
				      &(struct dps_shard_opts){ .max_pos = 32, .max_seqs = 1,
								.max_rows = 8, .dtype = dt },
				      err, sizeof(err)),
		      "%s: %s", path, err);
}

static size_t shard_bytes(const struct dps_shard *sd)
{
	size_t n = 0;

	for (int p = 0; p < DPS_PART_COUNT; p++)
		if (p != DPS_PART_EXPERTS || !sd->cfg.mxfp4) /* MXFP4 experts stay MXFP4 */
			n += sd->bytes[p];
	return n;
}

/* A prompt of 6 tokens in one prefill step, then 8 greedy decode steps: every logit into lg. */
static void greedy(struct dps_shard *sd, float *lg)
{
	const int V = sd->cfg.vocab_size;
	int tok[8] = { 1, 5, 9, 2, 7, 3 }, pos[8], seq[8] = { 0 }, rc = 0;
	const float *out;

	for (int i = 0; i < 6; i++)
		pos[i] = i;
	out = dps_shard_step(sd, 1, 6, tok, pos, seq, NULL, &rc);
	ck_assert_msg(out != NULL, "prefill: %d", rc);
	memcpy(lg, out + (size_t)5 * V, sizeof(float) * (size_t)V);
	for (int g = 0; g < 8; g++) {
		int best = 0, p = 6 + g;

		for (int v = 1; v < V; v++)
			best = lg[(size_t)g * V + v] > lg[(size_t)g * V + best] ? v : best;
		out = dps_shard_step(sd, 0, 1, &best, &p, seq, NULL, &rc);
		ck_assert_msg(out != NULL, "decode step %d: %d", g, rc);
		memcpy(lg + (size_t)(g + 1) * V, out, sizeof(float) * (size_t)V);
	}
}

START_TEST(test_engine_bf16_is_widened_f32)
{
	struct dps_shard a, b;
	char p16[128], p32[128];
	float *la, *lb;
	size_t V;

	snprintf(p16, sizeof(p16), "%s/%s-bf16", dir, presets[_i]);
	snprintf(p32, sizeof(p32), "%s/%s-f32", dir, presets[_i]);
	shard_load(&a, p16, DPS_SHARD_DTYPE_BF16);
	ck_assert_int_eq(a.wt, DPS_WT_BF16);
	V = (size_t)a.cfg.vocab_size;
	la = malloc(sizeof(float) * 9 * V);
	lb = malloc(sizeof(float) * 9 * V);
	greedy(&a, la);
	shard_load(&b, p16, DPS_SHARD_DTYPE_F32);
	ck_assert_int_eq(b.wt, DPS_WT_F32);
	greedy(&b, lb);
	ck_assert_msg(!memcmp(la, lb, sizeof(float) * 9 * V),
		      "%s: BF16 logits differ from the widened f32 ones", presets[_i]);
	/* The expert bytes the steps read (bench decode's and /metrics' expert_bytes) are
	 * counted in the weights' type: fewer in BF16, over the same steps and routes. */
	if (a.moe)
		ck_assert_msg(a.moe_bytes < b.moe_bytes, "%s: %llu expert bytes read in BF16, %llu "
			      "in f32", presets[_i], (unsigned long long)a.moe_bytes,
			      (unsigned long long)b.moe_bytes);
	/* The linear weights are nearly all of the bytes: BF16 about halves them. */
	ck_assert_msg(shard_bytes(&a) < shard_bytes(&b) * 6 / 10, "%s: %zu bytes against %zu",
		      presets[_i], shard_bytes(&a), shard_bytes(&b));
	dps_shard_free(&b);
	/* auto keeps a BF16 checkpoint BF16 */
	shard_load(&b, p16, DPS_SHARD_DTYPE_AUTO);
	ck_assert_int_eq(b.wt, DPS_WT_BF16);
	dps_shard_free(&b);
	/* An F16 checkpoint: auto keeps it F16, and its logits are the widened f32 ones. */
	{
		char p16h[128];
		struct dps_shard c;
		float *lc = malloc(sizeof(float) * 9 * V);

		snprintf(p16h, sizeof(p16h), "%s/%s-f16", dir, presets[_i]);
		shard_load(&c, p16h, DPS_SHARD_DTYPE_AUTO);
		ck_assert_int_eq(c.wt, DPS_WT_F16);
		greedy(&c, lc);
		ck_assert_msg(shard_bytes(&c) < shard_bytes(&a) * 11 / 10, "%s: F16 %zu bytes",
			      presets[_i], shard_bytes(&c));
		dps_shard_free(&c);
		shard_load(&c, p16h, DPS_SHARD_DTYPE_F32);
		greedy(&c, lb);
		ck_assert_msg(!memcmp(lc, lb, sizeof(float) * 9 * V),
			      "%s: F16 logits differ from the widened f32 ones", presets[_i]);
		dps_shard_free(&c);
		free(lc);
	}
	/* The check can fail: the unrounded F32 checkpoint of the same seed differs. */
	shard_load(&b, p32, DPS_SHARD_DTYPE_AUTO);
	ck_assert_int_eq(b.wt, DPS_WT_F32);
	greedy(&b, lb);
	ck_assert(memcmp(la, lb, sizeof(float) * 9 * V));
	dps_shard_free(&b);
	dps_shard_free(&a);
	free(la);
	free(lb);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("bf16");
	TCase *tc = tcase_create("bf16");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_narrowing_is_nearest_even);
	paths[n_paths] = dps_gemm_bf16_ref;
	names[n_paths++] = "dps_gemm_bf16_ref";
	/* A path this CPU cannot run is not registered (so not counted as a pass). */
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
		paths[n_paths] = dps_gemm_bf16_avx2;
		names[n_paths++] = "dps_gemm_bf16_avx2";
	} else {
		printf("skipped: dps_gemm_bf16_avx2 needs AVX2 and FMA, which this CPU lacks\n");
	}
	if (__builtin_cpu_supports("avx512f")) {
		paths[n_paths] = dps_gemm_bf16_avx512;
		names[n_paths++] = "dps_gemm_bf16_avx512";
	} else {
		printf("skipped: dps_gemm_bf16_avx512 needs AVX-512F, which this CPU lacks\n");
	}
	tcase_add_loop_test(tc, test_paths_give_f32_bits, 0, n_paths);
	tcase_add_test(tc, test_tile_form);
	tcase_add_loop_test(tc, test_linear_threads, 0, 3);
	tcase_add_test(tc, test_wrong_products_are_caught);
	if (__builtin_cpu_supports("f16c"))
		tcase_add_test(tc, test_f16_paths);
	else
		printf("skipped: test_f16_paths widens with F16C, which this CPU lacks\n");
	snprintf(dir, sizeof(dir), "/tmp/dps-bf16-XXXXXX");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
		char path[128], err[256];

		for (int f = 0; f < 3; f++) {
			snprintf(path, sizeof(path), "%s/%s-%s", dir, presets[i],
				 f == 2 ? "f16" : f ? "f32" : "bf16");
			if (dps_mkmodel(&dps_mkmodel_preset(presets[i])->cfg, 11,
					f == 2 ? DPS_ST_F16 : f ? DPS_ST_F32 : DPS_ST_BF16, path, err,
					sizeof(err))) {
				fprintf(stderr, "mkmodel %s: %s\n", presets[i], err);
				return 1;
			}
		}
	}
	tcase_add_loop_test(tc, test_engine_bf16_is_widened_f32, 0,
			    (int)(sizeof(presets) / sizeof(presets[0])));
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_FORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd))
			failed++;
	}
	return failed ? 1 : 0;
}

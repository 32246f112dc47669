/* SPDX-License-Identifier: MIT */
/*
 * tests/check_kernels.c - every fast kernel (kernels/fast.c) against its plain-C twin on
 * awkward sizes (tails that are not multiples of 16, head_dim 8 to 128, one position to
 * several hundred), with a relative tolerance; attention with sliding windows and sinks by
 * each path this CPU runs, and the reference's against the formula in double precision; a
 * case showing the comparison catches a perturbed result; the bias addition, bit for bit;
 * and the thread pool: every item
 * run exactly once for any split, and a product split over 1..5 threads bit-identical to one
 * thread.
 */
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil.h"
#include "tests/oracle.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/limits.h"
#include "kernels/pool.h"

static void fill(float *x, int n, uint32_t salt, float scale)
{
	for (int i = 0; i < n; i++)
		x[i] = oracle_f32(0, (uint32_t)i, salt) * scale;
}

/* Largest |a - b| / (|b| + floor) over n values. */
static double rel_err(const float *a, const float *b, int n, double floor)
{
	double worst = 0;

	for (int i = 0; i < n; i++) {
		const double e = fabs((double)a[i] - (double)b[i]) / (fabs((double)b[i]) + floor);

		if (!(e <= worst))
			worst = isnan(e) ? INFINITY : e;
	}
	return worst;
}

static const int sizes[] = { 1, 7, 16, 17, 63, 64, 100, 768, 2049 };
#define NSIZES (int)(sizeof(sizes) / sizeof(sizes[0]))

START_TEST(test_rmsnorm)
{
	const int n = sizes[_i];
	float *x = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * n);
	float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);

	fill(x, n, 1, 3.0f);
	fill(w, n, 2, 1.0f);
	dps_rmsnorm(a, x, w, n, 1e-5f);
	dps_rmsnorm_ref(b, x, w, n, 1e-5f);
	ck_assert_msg(rel_err(a, b, n, 1e-6) < 1e-5, "n=%d: %g", n, rel_err(a, b, n, 1e-6));
	/* In place, as the model calls it for the final norm. */
	memcpy(a, x, sizeof(float) * n);
	dps_rmsnorm(a, a, w, n, 1e-5f);
	ck_assert(rel_err(a, b, n, 1e-6) < 1e-5);
	free(x);
	free(w);
	free(a);
	free(b);
}
END_TEST

START_TEST(test_softmax_swiglu)
{
	const int n = sizes[_i];
	float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
	float *u = malloc(sizeof(float) * n);

	/* Wide range, so exp is tested far from 0 in both directions. */
	fill(a, n, 3, 40.0f);
	memcpy(b, a, sizeof(float) * n);
	dps_softmax(a, n);
	dps_softmax_ref(b, n);
	ck_assert_msg(rel_err(a, b, n, 1e-30) < 2e-6 || rel_err(a, b, n, 1e-7) < 2e-6, "n=%d: %g",
		      n, rel_err(a, b, n, 1e-30));
	/* With a temperature (the sampler's): the reference divides, then softmaxes; nothing past
	 * the row is written; a NaN anywhere makes every probability NaN, as in the reference. */
	for (int t = 0; t < 4; t++) {
		const float temp = t == 0 ? 0.7f : t == 2 ? 1.9f : 1.0f;
		float *g = malloc(sizeof(float) * (size_t)(n + 16));

		ck_assert_ptr_nonnull(g);
		fill(g, n, 6 + (uint32_t)t, 20.0f);
		for (int i = n; i < n + 16; i++)
			g[i] = 12345.0f;
		if (t == 3)
			g[n / 2] = NAN;
		memcpy(b, g, sizeof(float) * n);
		dps_softmax_temp(g, n, temp);
		for (int i = 0; i < n; i++)
			b[i] /= temp;
		dps_softmax_ref(b, n);
		for (int i = n; i < n + 16; i++)
			ck_assert(g[i] == 12345.0f);
		if (t == 3)
			for (int i = 0; i < n; i++)
				ck_assert_msg(isnan(g[i]), "n=%d: a NaN row gave %g at %d", n, (double)g[i], i);
		else
			ck_assert_msg(rel_err(g, b, n, 1e-30) < 2e-6 || rel_err(g, b, n, 1e-7) < 2e-6,
				      "n=%d, T=%g: %g", n, (double)temp, rel_err(g, b, n, 1e-30));
		free(g);
	}
	fill(a, n, 4, 12.0f);
	fill(u, n, 5, 2.0f);
	memcpy(b, a, sizeof(float) * n);
	dps_swiglu(a, u, n);
	dps_swiglu_ref(b, u, n);
	ck_assert_msg(rel_err(a, b, n, 1e-6) < 2e-6, "n=%d: %g", n, rel_err(a, b, n, 1e-6));
	free(a);
	free(b);
	free(u);
}
END_TEST

START_TEST(test_swiglu_clamped)
{
	const int n = sizes[_i];
	float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
	float *u = malloc(sizeof(float) * n);

	/* Values on both sides of the limit 7 for gate and up. */
	fill(a, n, 31, 12.0f);
	fill(u, n, 32, 12.0f);
	memcpy(b, a, sizeof(float) * n);
	dps_swiglu_clamped(a, u, n, 7.0f);
	dps_swiglu_clamped_ref(b, u, n, 7.0f);
	ck_assert_msg(rel_err(a, b, n, 1e-6) < 2e-6, "n=%d: %g", n, rel_err(a, b, n, 1e-6));
	/* The clamp acts: a huge gate gives what the limit gives. */
	a[0] = 1000.0f;
	u[0] = 1000.0f;
	b[0] = 7.0f;
	dps_swiglu_clamped_ref(a, u, 1, 7.0f);
	dps_swiglu_clamped_ref(b, u, 1, 7.0f);
	ck_assert(a[0] == b[0] && a[0] > 50.0f);
	free(a);
	free(b);
	free(u);
}
END_TEST

START_TEST(test_moe_route)
{
	/* Against a brute-force choice: every pair of the chosen and the others is ordered. */
	float logits[37], w[8], sum = 0;
	int ex[8];

	for (int trial = 0; trial < 200; trial++) {
		const int n = 2 + trial % 36, k = 1 + trial % (n < 8 ? n : 8);

		fill(logits, n, 40 + (uint32_t)trial, 4.0f);
		if (trial % 3 == 0)
			logits[n - 1] = logits[0]; /* a tie: the lower expert wins */
		dps_moe_route(logits, n, k, ex, w);
		sum = 0;
		for (int j = 0; j < k; j++) {
			sum += w[j];
			if (j)
				ck_assert(logits[ex[j - 1]] > logits[ex[j]] ||
					  (logits[ex[j - 1]] == logits[ex[j]] && ex[j - 1] < ex[j]));
			for (int e = 0; e < n; e++) {
				int chosen = 0;

				for (int q = 0; q < k; q++)
					chosen |= ex[q] == e;
				if (!chosen)
					ck_assert(logits[e] < logits[ex[j]] ||
						  (logits[e] == logits[ex[j]] && e > ex[j]));
			}
		}
		ck_assert(fabsf(sum - 1.0f) < 1e-6f);
		ck_assert(k == 1 || w[0] >= w[k - 1]);
	}
}
END_TEST

START_TEST(test_softmax_extremes)
{
	/* Values exp cannot represent, and ties, give what the reference gives. */
	float a[5] = { -1000.0f, 0.0f, 88.0f, 88.0f, -87.0f }, b[5];

	memcpy(b, a, sizeof(a));
	dps_softmax(a, 5);
	dps_softmax_ref(b, 5);
	for (int i = 0; i < 5; i++)
		ck_assert_msg(fabsf(a[i] - b[i]) <= 1e-6f, "%d: %g vs %g", i, (double)a[i],
			      (double)b[i]);
}
END_TEST

START_TEST(test_rope)
{
	static const int dims[] = { 8, 16, 64, 80, 128 };
	static const int positions[] = { 0, 1, 17, 511, 4095 };

	for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++)
		for (size_t p = 0; p < sizeof(positions) / sizeof(positions[0]); p++) {
			const int hd = dims[d], heads = 3;
			float a[3 * 128], b[3 * 128], cs[128];

			fill(a, heads * hd, 6, 1.0f);
			memcpy(b, a, sizeof(a));
			dps_rope_table(cs, hd, positions[p], 500000.0f);
			dps_rope(a, heads, hd, cs);
			dps_rope_ref(b, heads, hd, cs);
			ck_assert_msg(rel_err(a, b, heads * hd, 1e-6) < 1e-6, "hd=%d pos=%d", hd,
				      positions[p]);
			/* The table's angles against double precision: the float product of pos
			 * and the frequency is off by at most about pos * 2^-24 radians. */
			for (int j = 0; j < hd / 2; j++) {
				const double ang = positions[p] * pow(500000.0, -2.0 * j / hd);

				ck_assert_msg(fabs(cs[j] - cos(ang)) < 1e-7 * positions[p] + 1e-6 &&
					      fabs(cs[hd / 2 + j] - sin(ang)) <
						      1e-7 * positions[p] + 1e-6, "hd=%d pos=%d j=%d",
					      hd, positions[p], j);
			}
		}
}
END_TEST

START_TEST(test_embedding)
{
	float table[5 * 7], a[7], b[7];

	fill(table, 35, 7, 1.0f);
	dps_embedding(a, table, 7, 3);
	dps_embedding_ref(b, table, 7, 3);
	ck_assert_int_eq(memcmp(a, b, sizeof(a)), 0);
	ck_assert_int_eq(memcmp(a, table + 21, sizeof(a)), 0);
}
END_TEST

START_TEST(test_attention)
{
	static const int dims[] = { 8, 16, 20, 64, 128 };
	static const int npos[] = { 1, 2, 15, 16, 33, 300 };
	const int hd = dims[_i];

	for (size_t p = 0; p < sizeof(npos) / sizeof(npos[0]); p++) {
		const int n = npos[p];
		const size_t stride = (size_t)hd * 3 + 5; /* keys of other heads in between */
		float *k = malloc(sizeof(float) * stride * n), *v = malloc(sizeof(float) * stride * n);
		float q[128], a[128], b[128], *s = malloc(sizeof(float) * n);

		fill(q, hd, 8, 1.0f);
		fill(k, (int)stride * n, 9, 1.0f);
		fill(v, (int)stride * n, 10, 1.0f);
		dps_attention(a, q, k, v, 0, n, hd, stride, NULL, s);
		dps_attention_ref(b, q, k, v, 0, n, hd, stride, NULL, s);
		ck_assert_msg(rel_err(a, b, hd, 1e-2) < 2e-5, "hd=%d n=%d: %g", hd, n,
			      rel_err(a, b, hd, 1e-2));
		free(k);
		free(v);
		free(s);
	}
}
END_TEST

START_TEST(test_attention_paged)
{
	/*
	 * Positions scattered over blocks in a shuffled order: the paged kernels give what the
	 * contiguous reference gives on the same keys laid out in order.
	 */
	enum { HD = 20, BS = 4, NB = 16, KVS = 2 * HD }; /* two heads' worth per position */
	const size_t bstride = (size_t)BS * KVS;
	static const int table[NB] = { 7, 2, 11, 0, 5, 13, 9, 1, 15, 3, 8, 12, 4, 14, 6, 10 };
	float *k = malloc(sizeof(float) * NB * bstride), *v = malloc(sizeof(float) * NB * bstride);
	float *kc = malloc(sizeof(float) * NB * BS * HD), *vc = malloc(sizeof(float) * NB * BS * HD);
	float q[HD], a[HD], b[HD], c[HD], s[NB * BS];

	fill(k, NB * (int)bstride, 21, 1.0f);
	fill(v, NB * (int)bstride, 22, 1.0f);
	fill(q, HD, 23, 1.0f);
	for (int n = 1; n <= NB * BS; n += 5) {
		for (int t = 0; t < n; t++) {
			const size_t at = (size_t)table[t / BS] * bstride + (size_t)(t % BS) * KVS + HD;

			memcpy(kc + (size_t)t * HD, k + at, sizeof(float) * HD);
			memcpy(vc + (size_t)t * HD, v + at, sizeof(float) * HD);
		}
		dps_attention_ref(c, q, kc, vc, 0, n, HD, HD, NULL, s);
		dps_attention_paged_ref(b, q, k + HD, v + HD, table, BS, bstride, 0, n, HD, KVS, NULL,
					s);
		dps_attention_paged(a, q, k + HD, v + HD, table, BS, bstride, 0, n, HD, KVS, NULL, s);
		ck_assert_int_eq(memcmp(b, c, sizeof(b)), 0); /* same arithmetic, same order */
		ck_assert_msg(rel_err(a, c, HD, 1e-2) < 2e-5, "n=%d: %g", n, rel_err(a, c, HD, 1e-2));
	}
	free(k);
	free(v);
	free(kc);
	free(vc);
}
END_TEST

/*
 * Several heads of a row at once (dps_attention_paged_heads, what the engine calls): each
 * head's output is, bit for bit, dps_attention_paged's for it alone - paged and shuffled
 * blocks, GQA (two query heads on one KV head), sinks, windows (first > 0), head sizes with the
 * one-pass AVX-512 form (64, 128) and without (20), one to four heads. A wrong order of the
 * value sum (the last position first) is shown to be caught.
 */
START_TEST(test_attention_heads)
{
	static const int dims[] = { 64, 128, 20 };
	enum { BS = 4, NB = 12, NKV = 3 };
	static const int table[NB] = { 7, 2, 11, 0, 5, 9, 1, 3, 8, 4, 6, 10 };
	const int hd = dims[_i];
	const size_t kvs = (size_t)NKV * (size_t)hd, bstride = (size_t)BS * kvs;
	float *k = malloc(sizeof(float) * NB * bstride), *v = malloc(sizeof(float) * NB * bstride);
	float *q = malloc(sizeof(float) * 4 * (size_t)hd), *a = malloc(sizeof(float) * 4 * (size_t)hd);
	float *b = malloc(sizeof(float) * (size_t)hd), *sc = malloc(sizeof(float) * 4 * NB * BS);
	float *s1 = malloc(sizeof(float) * NB * BS), sinks[4] = { 0.5f, -1.0f, 2.0f, 0.0f };
	static const int kvh[4] = { 2, 0, 0, 1 }; /* heads 1 and 2 share KV head 0 */

	fill(k, NB * (int)bstride, 31, 1.0f);
	fill(v, NB * (int)bstride, 32, 1.0f);
	fill(q, 4 * hd, 33, 2.0f);
	for (int nh = 1; nh <= DPS_ATTN_HEADS; nh++)
		for (int n = 1; n <= NB * BS; n += 7)
			for (int f = 0; f < 2; f++) {
				const int first = f ? n / 2 : 0;
				size_t off[4];

				for (int x = 0; x < nh; x++)
					off[x] = (size_t)kvh[x] * (size_t)hd;
				dps_attention_paged_heads(a, (size_t)hd, q, (size_t)hd, nh, off, k, v, table,
							  BS, bstride, first, n, hd, kvs, f ? sinks : NULL,
							  sc, NB * BS);
				for (int x = 0; x < nh; x++) {
					dps_attention_paged(b, q + (size_t)x * (size_t)hd, k + off[x], v + off[x],
							    table, BS, bstride, first, n, hd, kvs,
							    f ? sinks + x : NULL, s1);
					ck_assert_msg(!memcmp(a + (size_t)x * (size_t)hd, b,
							      sizeof(float) * (size_t)hd),
						      "hd=%d nh=%d n=%d first=%d head %d", hd, nh, n, first, x);
				}
			}
	{ /* the check can fail: the values summed from the last position down */
		const int n = NB * BS;
		size_t off[1] = { 0 };
		float *p = malloc(sizeof(float) * (size_t)n);
		int differ = 0;
		const int fast = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");

		dps_attention_paged_heads(a, (size_t)hd, q, (size_t)hd, 1, off, k, v, table, BS, bstride,
					  0, n, hd, kvs, NULL, sc, NB * BS);
		dps_attention_paged(b, q, k, v, table, BS, bstride, 0, n, hd, kvs, NULL, p); /* its p */
		for (int i = 0; i < hd; i++) {
			float fwd = 0.0f, back = 0.0f;

			for (int t = 0; t < n; t++) /* the kernel's order, from the same p */
				fwd = fmaf(p[t], v[(size_t)table[t / BS] * bstride + (size_t)(t % BS) * kvs +
						  (size_t)i], fwd);
			for (int t = n - 1; t >= 0; t--)
				back = fmaf(p[t], v[(size_t)table[t / BS] * bstride + (size_t)(t % BS) * kvs +
						   (size_t)i], back);
			if (fast) /* FMAs as fmaf rounds them (the plain twin may not fuse) */
				ck_assert_msg(fwd == a[i], "hd=%d value %d: %g != %g", hd, i, fwd, a[i]);
			differ |= back != a[i];
		}
		ck_assert_msg(differ, "the reversed sum went unnoticed");
		free(p);
	}
	free(k);
	free(v);
	free(q);
	free(a);
	free(b);
	free(sc);
	free(s1);
}
END_TEST

/* The paths of dps_attention_paged under test: the dispatcher, then each this CPU runs. */
typedef void (*attention_paged_fn)(float *restrict, const float *restrict, const float *restrict,
				   const float *restrict, const int *restrict, int, size_t, int, int,
				   int, size_t, const float *, float *restrict);
static attention_paged_fn attn_paths[3] = { dps_attention_paged };
static const char *attn_names[3] = { "dps_attention_paged" };
static int n_attn_paths = 1;

/* One head's attention over [first, n_pos) with the sink, in double, from the definition. */
static void attention_direct(float *out, const float *q, const float *k, const float *v,
			     int first, int n_pos, int hd, size_t stride, const float *sink)
{
	double *p = malloc(sizeof(double) * (size_t)n_pos), max = sink ? *sink : -INFINITY;
	double sum = 0;

	for (int t = first; t < n_pos; t++) {
		double d = 0;

		for (int i = 0; i < hd; i++)
			d += (double)q[i] * k[(size_t)t * stride + (size_t)i];
		p[t] = d / sqrt((double)hd);
		max = p[t] > max ? p[t] : max;
	}
	for (int t = first; t < n_pos; t++)
		sum += p[t] = exp(p[t] - max);
	if (sink)
		sum += exp(*sink - max);
	for (int i = 0; i < hd; i++) {
		double o = 0;

		for (int t = first; t < n_pos; t++)
			o += p[t] / sum * v[(size_t)t * stride + (size_t)i];
		out[i] = (float)o;
	}
	free(p);
}

START_TEST(test_attention_window_sink)
{
	/*
	 * Windows from the start, the middle and the last position, with no sink, sinks that take
	 * some of the mass, one that takes all of it (1e4) and ones that take none: the
	 * reference against the formula, and every path (contiguous and over a shuffled paged
	 * cache) against the reference. Keys and values before the window are NaN, so reading
	 * one shows.
	 */
	static const int dims[] = { 8, 20, 64, 128 };
	static const int npos[] = { 1, 2, 17, 300 };
	static const float sinks[] = { 0.5f, 3.0f, 1e4f, -1e4f, -INFINITY };
	enum { BS = 5 };
	const int hd = dims[_i];

	for (size_t p = 0; p < sizeof(npos) / sizeof(npos[0]); p++) {
		const int n = npos[p], nb = (n + BS - 1) / BS;
		const size_t stride = (size_t)hd * 2 + 3, bstride = (size_t)BS * stride;
		float *k = malloc(sizeof(float) * stride * n), *v = malloc(sizeof(float) * stride * n);
		float *kp = malloc(sizeof(float) * bstride * nb), *vp = malloc(sizeof(float) * bstride * nb);
		float *kc = malloc(sizeof(float) * stride * n), *vc = malloc(sizeof(float) * stride * n);
		float q[128], a[128], b[128], d[128], nosink[128], *s = malloc(sizeof(float) * n);
		int *table = malloc(sizeof(int) * nb);
		const int firsts[] = { 0, n / 3, n - 1 };

		fill(q, hd, 60, 1.0f);
		fill(k, (int)stride * n, 61, 1.0f);
		fill(v, (int)stride * n, 62, 1.0f);
		for (int j = 0; j < nb; j++)
			table[j] = nb - 1 - j;
		for (int f = 0; f < 3; f++) {
			const int first = firsts[f];

			/* Copies with NaN before the window: contiguous, and paged with position t
			 * in block table[t / BS], slot t % BS. */
			for (size_t i = 0; i < bstride * nb; i++)
				kp[i] = vp[i] = NAN;
			for (int t = 0; t < n; t++)
				for (int i = 0; i < (int)stride; i++) {
					const float nan_before = t < first ? NAN : 0.0f;
					const size_t c = (size_t)t * stride + (size_t)i;
					const size_t at = (size_t)table[t / BS] * bstride +
							  (size_t)(t % BS) * stride + (size_t)i;

					kc[c] = kp[at] = k[c] + nan_before;
					vc[c] = vp[at] = v[c] + nan_before;
				}
			for (int si = -1; si < (int)(sizeof(sinks) / sizeof(sinks[0])); si++) {
				const float *sink = si < 0 ? NULL : &sinks[si];

				attention_direct(d, q, kc, vc, first, n, hd, stride, sink);
				dps_attention_ref(b, q, kc, vc, first, n, hd, stride, sink, s);
				ck_assert_msg(rel_err(b, d, hd, 0.1) < 2e-5, "ref hd=%d n=%d first=%d sink %d: %g",
					      hd, n, first, si, rel_err(b, d, hd, 0.1));
				if (si < 0)
					memcpy(nosink, d, sizeof(d));
				else if (si == 1) /* the sink matters: ignoring it would be seen */
					ck_assert(rel_err(nosink, d, hd, 0.1) > 1e-3);
				dps_attention(a, q, kc, vc, first, n, hd, stride, sink, s);
				ck_assert_msg(rel_err(a, b, hd, 1e-2) < 2e-5,
					      "dps_attention hd=%d n=%d first=%d sink %d: %g", hd, n,
					      first, si, rel_err(a, b, hd, 1e-2));
				for (int pi = 0; pi < n_attn_paths; pi++) {
					attn_paths[pi](a, q, kp, vp, table, BS, bstride, first, n, hd,
						       stride, sink, s);
					ck_assert_msg(rel_err(a, b, hd, 1e-2) < 2e-5,
						      "%s hd=%d n=%d first=%d sink %d: %g", attn_names[pi],
						      hd, n, first, si, rel_err(a, b, hd, 1e-2));
				}
			}
		}
		/* The window matters: a path that started at 0 would be seen. */
		if (n > 2) {
			attention_direct(a, q, k, v, 0, n, hd, stride, NULL);
			attention_direct(d, q, k, v, n - 1, n, hd, stride, NULL);
			ck_assert(rel_err(a, d, hd, 0.1) > 1e-3);
		}
		free(k);
		free(v);
		free(kp);
		free(vp);
		free(kc);
		free(vc);
		free(s);
		free(table);
	}
}
END_TEST

START_TEST(test_add_bias)
{
	/* The same additions as a plain loop, bit for bit, and nothing written past the rows. */
	const int widths[] = { 1, 7, 16, 17, 63, 2053 };

	for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++)
		for (int n = 1; n <= 3; n++) {
			const int width = widths[w], tot = n * width;
			float *a = malloc(sizeof(float) * (size_t)(tot + 16));
			float *b = malloc(sizeof(float) * (size_t)tot);
			float *bias = malloc(sizeof(float) * (size_t)width);

			ck_assert(a && b && bias);
			fill(a, tot, 21, 3.0f);
			fill(bias, width, 22, 1.0f);
			for (int i = tot; i < tot + 16; i++)
				a[i] = 777.0f;
			memcpy(b, a, sizeof(float) * (size_t)tot);
			dps_add_bias(a, bias, n, width);
			for (int i = 0; i < n; i++)
				for (int j = 0; j < width; j++)
					b[i * width + j] += bias[j];
			ck_assert_msg(!memcmp(a, b, sizeof(float) * (size_t)tot), "width %d, %d rows",
				      width, n);
			for (int i = tot; i < tot + 16; i++)
				ck_assert(a[i] == 777.0f);
			free(a);
			free(b);
			free(bias);
		}
}
END_TEST

START_TEST(test_check_can_fail)
{
	/* The tolerance used above does catch a result that is wrong in one element. */
	float x[100], w[100], a[100], b[100];

	fill(x, 100, 11, 1.0f);
	fill(w, 100, 12, 1.0f);
	dps_rmsnorm(a, x, w, 100, 1e-5f);
	dps_rmsnorm_ref(b, x, w, 100, 1e-5f);
	a[57] *= 1.001f;
	ck_assert(rel_err(a, b, 100, 1e-6) > 1e-5);
}
END_TEST

START_TEST(test_limits_sum)
{
	/* Small integers: every partial sum exact, so the fast sum equals the twin's bit for bit;
	 * one element changed changes it (the comparison can fail). */
	const size_t n = 64 * 1000;
	float *p = aligned_alloc(64, n * sizeof(float));

	ck_assert_ptr_nonnull(p);
	for (size_t i = 0; i < n; i++)
		p[i] = (float)(i % 7);
	ck_assert(dps_limits_sum_f32(p, n) == dps_limits_sum_f32_ref(p, n));
	ck_assert(dps_limits_sum_f32(p, 64) == dps_limits_sum_f32_ref(p, 64));
	{
		const float before = dps_limits_sum_f32_ref(p, n);

		p[777] += 1.0f;
		ck_assert(dps_limits_sum_f32(p, n) == before + 1.0f);
	}
	free(p);
	ck_assert(dps_limits_read_bandwidth((size_t)8 << 20, 3) > 1e8);
}
END_TEST

/* ---- the pool ---------------------------------------------------------------------- */

struct count_job {
	int n, chunks, threads;
	_Atomic int *hits;
	_Atomic int bad_tid;
};

static void count_slice(void *arg, int chunk, int tid)
{
	struct count_job *j = arg;
	int lo, hi;

	if (tid < 0 || tid >= j->threads)
		atomic_store(&j->bad_tid, 1);
	dps_pool_split(j->n, 16, chunk, j->chunks, &lo, &hi);
	for (int i = lo; i < hi; i++)
		atomic_fetch_add(&j->hits[i], 1);
}

START_TEST(test_pool_every_item_once)
{
	for (int threads = 1; threads <= 6; threads++) {
		struct dps_pool *pool;

		ck_assert_int_eq(dps_pool_create(&pool, threads), 0);
		ck_assert_int_eq(dps_pool_size(pool), threads);
		for (int n = 0; n < 200; n += 7) {
			_Atomic int hits[200] = { 0 };
			struct count_job j = { n, 1 + n % 13, threads, hits, 0 };

			/* Many jobs back to back: the workers go from spinning to sleeping and back. */
			for (int rep = 0; rep < 20; rep++)
				dps_pool_run(pool, j.chunks, count_slice, &j);
			for (int i = 0; i < n; i++)
				ck_assert_int_eq(hits[i], 20);
			ck_assert_int_eq(j.bad_tid, 0);
		}
		dps_pool_destroy(pool);
	}
	dps_pool_run(NULL, 0, count_slice, &(struct count_job){ 0, 1, 1, NULL, 0 });
	ck_assert_int_eq(dps_pool_size(NULL), 1);
}
END_TEST

START_TEST(test_pool_more_threads_than_cores)
{
	/* 16 threads on this machine's cores: jobs still finish, and every chunk runs once. */
	struct dps_pool *pool;
	_Atomic int hits[1000] = { 0 };
	struct count_job j = { 1000, 64, 16, hits, 0 };

	ck_assert_int_eq(dps_pool_create(&pool, 16), 0);
	for (int rep = 0; rep < 200; rep++)
		dps_pool_run(pool, j.chunks, count_slice, &j);
	for (int i = 0; i < 1000; i++)
		ck_assert_int_eq(hits[i], 200);
	dps_pool_destroy(pool);
}
END_TEST

START_TEST(test_pool_split)
{
	for (int n = 0; n < 100; n++)
		for (int nt = 1; nt <= 8; nt++) {
			int next = 0;

			for (int t = 0; t < nt; t++) {
				int lo, hi;

				dps_pool_split(n, 4, t, nt, &lo, &hi);
				ck_assert_int_le(lo, hi);
				if (lo < hi) {
					ck_assert_int_eq(lo, next);
					ck_assert_int_eq(lo % 4, 0);
					next = hi;
				}
			}
			ck_assert_int_eq(next, n);
		}
}
END_TEST

START_TEST(test_linear_threads_bit_identical)
{
	static const int shapes[][3] = { { 1, 1000, 96 }, { 5, 333, 64 }, { 47, 500, 33 },
					 { 48, 500, 64 }, { 64, 200, 80 }, { 200, 1000, 64 },
					 { 8, 2048, 768 } };
	char msg[256];

	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
		float *x = malloc(sizeof(float) * m * k), *w = malloc(sizeof(float) * n * k);
		float *one = malloc(sizeof(float) * m * n), *got = malloc(sizeof(float) * m * n);

		fill(x, m * k, 13, 1.0f);
		fill(w, n * k, 14, 1.0f);
		ck_assert_int_eq(dps_gemm_setup("auto", 1, msg, sizeof(msg)), 0);
		dps_linear_f32(one, x, w, m, n, k);
		for (int t = 2; t <= 5; t++) {
			ck_assert_int_eq(dps_gemm_setup("auto", t, msg, sizeof(msg)), 0);
			ck_assert_int_eq(dps_pool_size(dps_gemm_pool()), t);
			dps_linear_f32(got, x, w, m, n, k);
			ck_assert_msg(!memcmp(one, got, sizeof(float) * m * n), "m=%d n=%d k=%d, %d threads",
				      m, n, k, t);
		}
		free(x);
		free(w);
		free(one);
		free(got);
	}
}
END_TEST

START_TEST(test_batch_invariant)
{
	/* Under auto, a row's outputs do not depend on the other rows (check_gemm goes to m = 300). */
	enum { N = 203, K = 771, M = 128 };
	float *x = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K);
	float *all = malloc(sizeof(float) * M * N), one[N];
	char msg[256];

	fill(x, M * K, 15, 1.0f);
	fill(w, N * K, 16, 1.0f);
	ck_assert_int_eq(dps_gemm_setup("auto", 1, msg, sizeof(msg)), 0);
	for (int m = 1; m <= M; m = m * 2 + 1) {
		dps_linear_f32(all, x, w, m, N, K);
		for (int i = 0; i < m; i += 3) {
			dps_linear_f32(one, x + (size_t)i * K, w, 1, N, K);
			ck_assert_msg(!memcmp(one, all + (size_t)i * N, sizeof(one)), "m=%d row %d", m, i);
		}
	}
	free(x);
	free(w);
	free(all);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kernels");
	TCase *tc = tcase_create("fast-vs-reference");

	tcase_add_loop_test(tc, test_rmsnorm, 0, NSIZES);
	tcase_add_loop_test(tc, test_softmax_swiglu, 0, NSIZES);
	tcase_add_test(tc, test_softmax_extremes);
	tcase_add_loop_test(tc, test_swiglu_clamped, 0, NSIZES);
	tcase_add_test(tc, test_moe_route);
	tcase_add_test(tc, test_rope);
	tcase_add_test(tc, test_embedding);
	tcase_add_test(tc, test_add_bias);
	tcase_add_loop_test(tc, test_attention, 0, 5);
	tcase_add_test(tc, test_attention_paged);
	tcase_add_loop_test(tc, test_attention_heads, 0, 3);
	/* A path the CPU cannot run is not registered (so not counted as a pass). */
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f")) {
		attn_paths[n_attn_paths] = dps_attention_paged_avx512;
		attn_names[n_attn_paths++] = "dps_attention_paged_avx512";
	} else {
		printf("skipped: the window and sink tests of dps_attention_paged_avx512 need "
		       "AVX-512F, which this CPU lacks\n");
	}
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
		attn_paths[n_attn_paths] = dps_attention_paged_avx2;
		attn_names[n_attn_paths++] = "dps_attention_paged_avx2";
	} else {
		printf("skipped: the window and sink tests of dps_attention_paged_avx2 need AVX2 "
		       "and FMA, which this CPU lacks\n");
	}
	tcase_add_loop_test(tc, test_attention_window_sink, 0, 4);
	tcase_add_test(tc, test_check_can_fail);
	tcase_add_test(tc, test_limits_sum);
	suite_add_tcase(s, tc);
	tc = tcase_create("pool");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_pool_every_item_once);
	tcase_add_test(tc, test_pool_more_threads_than_cores);
	tcase_add_test(tc, test_pool_split);
	tcase_add_test(tc, test_linear_threads_bit_identical);
	/* dpshard's own product, which makes small batches batch-invariant, needs AVX-512F; not
	 * registered (so not counted as a pass) without it. */
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f"))
		tcase_add_test(tc, test_batch_invariant);
	else
		printf("skipped: test_batch_invariant needs AVX-512F, which this CPU lacks\n");
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

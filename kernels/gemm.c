/* SPDX-License-Identifier: MIT */
/*
 * kernels/gemm.c - BLIS kernel selection and the linear product (see gemm.h). Called for
 * every projection of every layer; the selection runs once.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <blis.h>

#include "common/f16.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/pool.h"
#include "kernels/mxfp4.h"
#include "kernels/q8.h"

/* Below this m the skinny-matrix kernels of zen3/haswell beat skx's packed 32x12 kernel
 * (measured single-thread on Zen 5 with k = 768: the two meet at m = 40..56). */
#define SMALL_M_MAX 47

enum own_isa { OWN_NONE, OWN_REF, OWN_AVX2, OWN_AVX512 };

static struct {
	int ready;
	enum own_isa own; /* "auto": dpshard's batch-invariant kernel (gemm_dot.c); else BLIS */
	enum own_isa isa; /* dpshard's kernel this CPU runs (BF16 products take it under BLIS too) */
	enum own_isa q8;  /* the INT8 kernel this CPU runs (AVX-512 also needs BW and VNNI) */
	enum own_isa mxq8; /* the integer MXFP4 one (AVX-512 also needs VBMI) */
	int threads;
	int warned; /* the self-check's warning was printed */
	int small_m_max;
	cntx_t *big, *small;
	struct dps_pool *pool; /* the rank's threads; each runs its slice single-threaded */
	char desc[256];
} g;

struct arch_name {
	const char *name;
	arch_t id;
};

static const struct arch_name archs[] = {
	{ "skx", BLIS_ARCH_SKX },
	{ "zen3", BLIS_ARCH_ZEN3 },
	{ "haswell", BLIS_ARCH_HASWELL },
	{ "generic", BLIS_ARCH_GENERIC },
};

static int arch_lookup(const char *name, size_t len, arch_t *id)
{
	for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
		if (strlen(archs[i].name) == len && !strncmp(archs[i].name, name, len)) {
			*id = archs[i].id;
			return 0;
		}
	return -EINVAL;
}

/* Whether this CPU can execute a kernel set (BLIS does not check when told which to use). */
static int cpu_runs(arch_t id)
{
	__builtin_cpu_init();
	switch (id) {
	case BLIS_ARCH_SKX:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
		       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
	case BLIS_ARCH_ZEN3:
	case BLIS_ARCH_HASWELL:
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	case BLIS_ARCH_GENERIC:
		return 1;
	default:
		return 0;
	}
}

/* The context of a kernel set built into the (static) BLIS, or NULL. */
static cntx_t *context_of(arch_t id)
{
	/* lookup_id is NULL for sets that are not built in; nat_cntx would crash on those. */
	return bli_gks_lookup_id(id) ? bli_gks_lookup_nat_cntx(id) : NULL;
}

/* The BLIS half of dps_gemm_setup: an explicit --blis-arch. */
static int setup_blis(const char *spec, char *msg, size_t msglen)
{
	arch_t big, small;
	const char *colon = strchr(spec, ':');
	char num[16];

	if (arch_lookup(spec, colon ? (size_t)(colon - spec) : strlen(spec), &big) ||
	    (colon && arch_lookup(colon + 1, strlen(colon + 1), &small))) {
		snprintf(msg, msglen, "--blis-arch %s: expected auto, skx, zen3, haswell, "
			 "generic, or BIG:SMALL such as skx:zen3", spec);
		return -EINVAL;
	}
	if (!colon)
		small = big;
	if (!cpu_runs(big) || !cpu_runs(small)) {
		snprintf(msg, msglen, "--blis-arch %s: this CPU cannot run the '%s' kernels", spec,
			 bli_arch_string(cpu_runs(big) ? small : big));
		return -EINVAL;
	}
	/* BLIS reads its own choice once, at initialisation, and only as a number. */
	snprintf(num, sizeof(num), "%d", (int)big);
	setenv("BLIS_ARCH_TYPE", num, 1);
	bli_init();
	g.big = context_of(big);
	g.small = context_of(small);
	if (!g.big || !g.small) {
		snprintf(msg, msglen, "--blis-arch %s: the '%s' kernels are not built into this BLIS",
			 spec, bli_arch_string(g.big ? small : big));
		return -EINVAL;
	}
	g.small_m_max = small != big ? SMALL_M_MAX : 0;
	if (small != big)
		snprintf(g.desc, sizeof(g.desc), "BLIS %s: '%s' kernels, '%s' for m <= %d",
			 bli_info_get_version_str(), bli_arch_string(big), bli_arch_string(small),
			 g.small_m_max);
	else
		snprintf(g.desc, sizeof(g.desc), "BLIS %s: '%s' kernels", bli_info_get_version_str(),
			 bli_arch_string(big));
	return 0;
}

/*
 * Whether the SIMD kernel of `isa` gives the plain-C twin's bits on shapes that take both of
 * its forms (the dot form below GEMM_TILE_M_MIN rows, the tile form above), with tails in
 * every dimension and signed zeros. A wrong kernel must never compute silently: when the
 * check fails, setup falls back to a narrower kernel and says so in the description. It costs
 * a few hundred microseconds, once per process.
 */
static int own_selfcheck(enum own_isa isa)
{
	enum { M = 53, N = 21, K = 70 };
	static float x[M * K], W[N * K], Ww[N * K], Wh[N * K], got[M * N], want[M * N];
	static uint16_t Wb[N * K], Wf[N * K];
	uint32_t r = 0x9e3779b9u;

	for (int i = 0; i < M * K || i < N * K; i++) {
		r = r * 1664525u + 1013904223u;
		if (i < M * K)
			x[i] = (float)((int)(r >> 8) % 2001 - 1000) / 256.0f;
		r = r * 1664525u + 1013904223u;
		if (i < N * K)
			W[i] = (r >> 28) == 0 ? -0.0f : (float)((int)(r >> 8) % 2001 - 1000) / 512.0f;
	}
	for (int i = 0; i < N * K; i++) {
		Wb[i] = dps_f32_to_bf16(W[i]);
		Ww[i] = dps_bf16_to_f32(Wb[i]);
		Wf[i] = dps_f32_to_f16(W[i]);
		Wh[i] = dps_f16_to_f32(Wf[i]);
	}
	for (int m = 1; m <= M; m += M - 1) {
		dps_gemm_f32_ref(want, N, x, W, m, N, K);
		if (isa == OWN_AVX512)
			dps_gemm_f32_avx512(got, N, x, W, m, N, K);
		else
			dps_gemm_f32_avx2(got, N, x, W, m, N, K);
		if (memcmp(got, want, sizeof(float) * (size_t)m * N))
			return 0;
		/* BF16: the f32 twin's bits on the widened weights */
		dps_gemm_f32_ref(want, N, x, Ww, m, N, K);
		if (isa == OWN_AVX512)
			dps_gemm_bf16_avx512(got, N, x, Wb, m, N, K);
		else
			dps_gemm_bf16_avx2(got, N, x, Wb, m, N, K);
		if (memcmp(got, want, sizeof(float) * (size_t)m * N))
			return 0;
		/* F16 likewise */
		dps_gemm_f32_ref(want, N, x, Wh, m, N, K);
		if (isa == OWN_AVX512)
			dps_gemm_f16_avx512(got, N, x, Wf, m, N, K);
		else
			dps_gemm_f16_avx2(got, N, x, Wf, m, N, K);
		if (memcmp(got, want, sizeof(float) * (size_t)m * N))
			return 0;
	}
	return 1;
}

/*
 * Whether the INT8 kernel of `isa` gives its plain-C twin's bits, on one row and on many,
 * an odd number of blocks with a partial last one, and a row of W that is all zero.
 */
static int q8_selfcheck(enum own_isa isa)
{
	enum { M = 6, N = 7, K = 70 };
	static float x[M * K], W[N * K], got[M * N], want[M * N];
	static unsigned char Wq[N * 3 * 34];
	struct dps_q8_act a = { 0 };
	uint32_t r = 0x85ebca6bu;
	int ok = 1;

	for (int i = 0; i < M * K || i < N * K; i++) {
		r = r * 1664525u + 1013904223u;
		if (i < M * K)
			x[i] = (float)((int)(r >> 8) % 2001 - 1000) / 256.0f;
		r = r * 1664525u + 1013904223u;
		if (i < N * K)
			W[i] = i / K == 3 ? 0.0f : (float)((int)(r >> 8) % 2001 - 1000) / 512.0f;
	}
	dps_q8_quantize_rows(Wq, K, W, N);
	for (int m = 1; m <= M && ok; m += M - 1) {
		if (dps_q8_act_quantize(&a, x, m, K)) {
			ok = 0;
			break;
		}
		dps_gemm_q8_ref(want, N, &a, Wq, N);
		if (isa == OWN_AVX512)
			dps_gemm_q8_avx512(got, N, &a, Wq, N);
		else
			dps_gemm_q8_avx2(got, N, &a, Wq, N);
		ok = !memcmp(got, want, sizeof(float) * (size_t)m * N);
	}
	dps_q8_act_free(&a);
	return ok;
}

/* Whether the integer MXFP4 kernel of `isa` gives its plain-C twin's bits on N = 7 rows of W
 * (a whole tile and a tail) of k (at most 544), against one row of x and, mmax 6, six. */
static int mxq8_check(enum own_isa isa, int k, int mmax)
{
	enum { M = 6, N = 7, KMAX = 544 };
	static float x[M * KMAX], got[M * N], want[M * N];
	static uint8_t mb[N * KMAX / 2], ms[N * KMAX / 32];
	struct dps_q8_act a = { 0 };
	uint32_t r = 0x27d4eb2fu;
	int ok = 1;

	for (int i = 0; i < M * k; i++) {
		r = r * 1664525u + 1013904223u;
		x[i] = (float)((int)(r >> 8) % 2001 - 1000) / 256.0f;
	}
	for (int i = 0; i < N * k / 2; i++)
		mb[i] = (uint8_t)(i * 37 + 11);
	for (int i = 0; i < N * k / 32; i++)
		ms[i] = (uint8_t)(110 + i % 20);
	if (dps_mxfp4_interleave(mb, N, k))
		return 0;
	for (int m = 1; m <= mmax && ok; m += M - 1) {
		if (dps_q8_act_quantize(&a, x, m, k)) {
			ok = 0;
			break;
		}
		dps_gemm_mxfp4q8_ref(want, N, &a, mb, ms, N);
		if (isa == OWN_AVX512)
			dps_gemm_mxfp4q8_avx512(got, N, &a, mb, ms, N);
		else
			dps_gemm_mxfp4q8_avx2(got, N, &a, mb, ms, N);
		ok = !memcmp(got, want, sizeof(float) * (size_t)m * N);
	}
	dps_q8_act_free(&a);
	return ok;
}

/* k 544 (a partial group) at one and six rows of x, and k 512 (whole groups: the one-row
 * kernel's whole tile and its tail) at one. */
static int mxq8_selfcheck(enum own_isa isa)
{
	return mxq8_check(isa, 544, 6) && mxq8_check(isa, 512, 1);
}

/* The integer MXFP4 kernel for this CPU (AVX-512 also needs VBMI), checked against its twin. */
static enum own_isa choose_mxq8(const char **fallback)
{
	const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
			 __builtin_cpu_supports("f16c");
	enum own_isa q = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
				 __builtin_cpu_supports("avx512vl") &&
				 __builtin_cpu_supports("avx512vnni") &&
				 __builtin_cpu_supports("avx512vbmi") ? OWN_AVX512
		       : avx2 ? OWN_AVX2 : OWN_REF;

	if (q == OWN_AVX512 && !mxq8_selfcheck(OWN_AVX512)) {
		*fallback = "the AVX-512 integer MXFP4 kernel differs from its plain-C twin on this CPU";
		q = avx2 ? OWN_AVX2 : OWN_REF;
	}
	if (q == OWN_AVX2 && !mxq8_selfcheck(OWN_AVX2)) {
		*fallback = "the AVX2 integer MXFP4 kernel differs from its plain-C twin on this CPU";
		q = OWN_REF;
	}
	return q;
}

/* The INT8 kernel for this CPU, checked against its twin; *fallback says why a wider one was
 * not taken. */
static enum own_isa choose_q8(const char **fallback)
{
	const int f16c = __builtin_cpu_supports("f16c");
	enum own_isa q = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
				 __builtin_cpu_supports("avx512vl") &&
				 __builtin_cpu_supports("avx512vnni") && f16c ? OWN_AVX512
		       : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c
			       ? OWN_AVX2 : OWN_REF;

	if (q == OWN_AVX512 && !q8_selfcheck(OWN_AVX512)) {
		*fallback = "the AVX-512 INT8 kernel differs from its plain-C twin on this CPU";
		q = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c
			    ? OWN_AVX2 : OWN_REF;
	}
	if (q == OWN_AVX2 && !q8_selfcheck(OWN_AVX2)) {
		*fallback = "the AVX2 INT8 kernel differs from its plain-C twin on this CPU";
		q = OWN_REF;
	}
	return q;
}

int dps_gemm_setup(const char *spec, int threads, char *msg, size_t msglen)
{
	const char *fallback = "";
	const int own = !spec || !strcmp(spec, "auto");
	size_t len;
	int rc;

	g.ready = 0;
	if (!own && (rc = setup_blis(spec, msg, msglen)))
		return rc;
	g.threads = threads > 0 ? threads : 1;
	if (dps_pool_size(g.pool) != g.threads) {
		dps_pool_destroy(g.pool);
		g.pool = NULL;
		rc = dps_pool_create(&g.pool, g.threads);
		if (rc) {
			snprintf(msg, msglen, "cannot start %d threads: %s", g.threads, strerror(-rc));
			return rc;
		}
	}
	__builtin_cpu_init();
	/* (F16C too: the F16 products widen with it; every AVX2 CPU has it) */
	g.own = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c") ? OWN_AVX512
	      : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
			__builtin_cpu_supports("f16c") ? OWN_AVX2
						     : OWN_REF;
	if (g.own == OWN_AVX512 && !own_selfcheck(OWN_AVX512)) {
		fallback = "the AVX-512 kernel differs from its plain-C twin on this CPU";
		g.own = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
				__builtin_cpu_supports("f16c") ? OWN_AVX2 : OWN_REF;
	}
	if (g.own == OWN_AVX2 && !own_selfcheck(OWN_AVX2)) {
		fallback = "the AVX2 kernel differs from its plain-C twin on this CPU";
		g.own = OWN_REF;
	}
	g.isa = g.own;
	if (!own)
		g.own = OWN_NONE;
	if (*fallback && !g.warned) {
		/* Never silent, and once per process: setup runs again when the threads change. */
		fprintf(stderr, "dpshard: WARNING: %s; using the %s kernel\n", fallback,
			g.isa == OWN_AVX2 ? "AVX2" : "plain-C");
	}
	{
		const char *q8_fallback = "", *mx_fallback = "";

		g.q8 = choose_q8(&q8_fallback);
		g.mxq8 = choose_mxq8(&mx_fallback);
		if (*q8_fallback && !g.warned)
			fprintf(stderr, "dpshard: WARNING: %s; using the %s INT8 kernel\n",
				q8_fallback, g.q8 == OWN_AVX2 ? "AVX2" : "plain-C");
		if (*mx_fallback && !g.warned)
			fprintf(stderr, "dpshard: WARNING: %s; using the %s one\n", mx_fallback,
				g.mxq8 == OWN_AVX2 ? "AVX2" : "plain-C");
		g.warned |= *fallback || *q8_fallback || *mx_fallback;
	}
	if (own)
		snprintf(g.desc, sizeof(g.desc), "dpshard's batch-invariant %s kernels%s%s%s",
			 g.own == OWN_AVX512 ? "AVX-512" : g.own == OWN_AVX2 ? "AVX2" : "plain-C",
			 *fallback ? " (WARNING: " : "", fallback, *fallback ? ")" : "");
	len = strlen(g.desc);
	snprintf(g.desc + len, sizeof(g.desc) - len, ", %d thread(s)%s", g.threads,
		 own ? "" : " (not batch-invariant: a row's sums depend on the rows beside it)");
	g.ready = 1;
	snprintf(msg, msglen, "%s", g.desc);
	return 0;
}

const char *dps_gemm_describe(void)
{
	return g.ready ? g.desc : "not set up";
}

struct linear_job {
	float *out;
	const float *x, *W;
	const uint16_t *Wb; /* instead of W: BF16 weights, or F16 ones when f16 */
	int f16;
	const void *Wq;     /* instead of W: INT8 weights (q8.h), x quantized in act */
	const uint8_t *Mb, *Ms; /* or re-laid MXFP4 blocks and their scales (mxfp4.h) */
	const struct dps_q8_act *act;
	int m, n, k, chunks;
};

/*
 * Chunk `chunk` computes the output columns [lo, hi) (rows lo..hi-1 of W). Slices start at
 * multiples of SLICE_ALIGN, a multiple of every register-tile width of the BLIS kernel sets
 * (4, 6, 12, 16, 32), so under BLIS too each column falls in the same tile whatever the number
 * of chunks and threads; dpshard's kernel sums each output in one order regardless.
 */
#define SLICE_ALIGN 96

static void linear_slice(void *arg, int chunk, int tid)
{
	const struct linear_job *j = arg;
	float *out;
	const float *W;
	rntm_t rntm = BLIS_RNTM_INITIALIZER;
	float one = 1.0f, zero = 0.0f;
	int lo, hi;

	(void)tid;
	dps_pool_split(j->n, SLICE_ALIGN, chunk, j->chunks, &lo, &hi);
	if (lo >= hi)
		return;
	out = j->out + lo;
	if (j->Mb) {
		const uint8_t *b = j->Mb + (size_t)lo * (size_t)(j->k / 32) * 16;
		const uint8_t *s = j->Ms + (size_t)lo * (size_t)(j->k / 32);

		if (g.mxq8 == OWN_AVX512)
			dps_gemm_mxfp4q8_avx512(out, j->n, j->act, b, s, hi - lo);
		else if (g.mxq8 == OWN_AVX2)
			dps_gemm_mxfp4q8_avx2(out, j->n, j->act, b, s, hi - lo);
		else
			dps_gemm_mxfp4q8_ref(out, j->n, j->act, b, s, hi - lo);
		return;
	}
	if (j->Wq) {
		const void *Wq = dps_q8_row(j->Wq, (size_t)lo, j->k);

		if (g.q8 == OWN_AVX512)
			dps_gemm_q8_avx512(out, j->n, j->act, Wq, hi - lo);
		else if (g.q8 == OWN_AVX2)
			dps_gemm_q8_avx2(out, j->n, j->act, Wq, hi - lo);
		else
			dps_gemm_q8_ref(out, j->n, j->act, Wq, hi - lo);
		return;
	}
	if (j->Wb && j->f16) { /* dpshard's kernel whatever the f32 products use */
		const uint16_t *Wb = j->Wb + (size_t)lo * (size_t)j->k;

		if (g.isa == OWN_AVX512)
			dps_gemm_f16_avx512(out, j->n, j->x, Wb, j->m, hi - lo, j->k);
		else if (g.isa == OWN_AVX2)
			dps_gemm_f16_avx2(out, j->n, j->x, Wb, j->m, hi - lo, j->k);
		else
			dps_gemm_f16_ref(out, j->n, j->x, Wb, j->m, hi - lo, j->k);
		return;
	}
	if (j->Wb) { /* dpshard's kernel whatever the f32 products use */
		const uint16_t *Wb = j->Wb + (size_t)lo * (size_t)j->k;

		if (g.isa == OWN_AVX512)
			dps_gemm_bf16_avx512(out, j->n, j->x, Wb, j->m, hi - lo, j->k);
		else if (g.isa == OWN_AVX2)
			dps_gemm_bf16_avx2(out, j->n, j->x, Wb, j->m, hi - lo, j->k);
		else
			dps_gemm_bf16_ref(out, j->n, j->x, Wb, j->m, hi - lo, j->k);
		return;
	}
	W = j->W + (size_t)lo * (size_t)j->k;
	switch (g.own) {
	case OWN_AVX512:
		dps_gemm_f32_avx512(out, j->n, j->x, W, j->m, hi - lo, j->k);
		return;
	case OWN_AVX2:
		dps_gemm_f32_avx2(out, j->n, j->x, W, j->m, hi - lo, j->k);
		return;
	case OWN_REF:
		dps_gemm_f32_ref(out, j->n, j->x, W, j->m, hi - lo, j->k);
		return;
	case OWN_NONE:
		break;
	}
	bli_rntm_set_num_threads(1, &rntm);
	bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_TRANSPOSE, j->m, hi - lo, j->k, &one, (float *)j->x,
		     j->k, 1, (float *)W, j->k, 1, &zero, out, j->n, 1,
		     j->m <= g.small_m_max ? g.small : g.big, &rntm);
}

/*
 * Assumptions: x is m x k row-major (row stride k), W is n x k row-major and is read as W^T,
 * out is m x n row-major. No alignment needed.
 */
static void linear_run(struct linear_job *jp)
{
	struct linear_job j = *jp;
	int nt;

	if (!g.ready) {
		char msg[256];

		dps_gemm_setup("auto", 1, msg, sizeof(msg));
	}
	/*
	 * More chunks than threads, so a thread that is descheduled delays only its chunk; fewer
	 * for BLIS, which packs x again for every chunk, and for the MXFP4 experts, small products
	 * each chunk of which starts a stream from cold (bench-gpt-oss -q int8 at batch 1 on two
	 * Zen 5 threads, six rounds: the experts at a median 72% of the read bandwidth with four
	 * chunks a thread, 82% with two, 63% with eight).
	 */
	nt = dps_pool_size(g.pool);
	if (nt > 1)
		j.chunks = nt * (j.Mb || (g.own == OWN_NONE && !j.Wb && !j.Wq) ? 2 : 4);
	dps_pool_run(g.pool, j.chunks, linear_slice, &j);
}

void dps_linear_f32(float *out, const float *x, const float *W, int m, int n, int k)
{
	struct linear_job j = { out, x, W, NULL, 0, NULL, NULL, NULL, NULL, m, n, k, 1 };

	linear_run(&j);
}

/* Assumptions: as dps_linear_f32, W (n x k) BF16. */
void dps_linear_bf16(float *out, const float *x, const uint16_t *W, int m, int n, int k)
{
	struct linear_job j = { out, x, NULL, W, 0, NULL, NULL, NULL, NULL, m, n, k, 1 };

	linear_run(&j);
}

/* Assumptions: as dps_linear_f32, W (n x k) F16. */
void dps_linear_f16(float *out, const float *x, const uint16_t *W, int m, int n, int k)
{
	struct linear_job j = { out, x, NULL, W, 1, NULL, NULL, NULL, NULL, m, n, k, 1 };

	linear_run(&j);
}

/*
 * The calling thread's quantized activations, kept between calls (they grow to the largest
 * m x k seen). Products run from one thread per rank and the pool's threads read them; a pool
 * thread running a product of its own (the _here products) grows its own, freed when
 * the thread ends (the key's destructor; the pool is rebuilt when the thread count changes).
 */
static __thread struct dps_q8_act q8_act;
static pthread_key_t q8_act_key;
static pthread_once_t q8_act_once = PTHREAD_ONCE_INIT;

static void q8_act_release(void *a)
{
	dps_q8_act_free(a);
}

static void q8_act_key_make(void)
{
	if (pthread_key_create(&q8_act_key, q8_act_release)) {
		fprintf(stderr, "dpshard: cannot create a thread key\n");
		abort();
	}
}

int dps_linear_q8_reserve(int m, int k)
{
	struct dps_q8_act a = q8_act;
	float *zero = calloc((size_t)(m > 0 ? m : 0) * (size_t)(k > 0 ? k : 0) + 1, sizeof(float));
	int rc;

	if (!zero)
		return -ENOMEM;
	/* quantizing zeros grows every buffer to its size for m x k */
	rc = dps_q8_act_quantize(&a, zero, m, k);
	q8_act = a;
	free(zero);
	return rc;
}

/* An integer product: x quantized once into q8_act, then the slices. */
static void q8_run(struct linear_job *j)
{
	if (dps_q8_act_quantize(&q8_act, j->x, j->m, j->k)) {
		/* No memory for 1.125 bytes per activation: nothing sensible can follow. */
		fprintf(stderr, "dpshard: cannot allocate the quantized activations of a "
			"%d x %d product\n", j->m, j->k);
		abort();
	}
	linear_run(j);
}

/* Assumptions: as dps_linear_f32, W (n x k) INT8 as q8.h lays it out. */
void dps_linear_q8(float *out, const float *x, const void *W, int m, int n, int k)
{
	struct linear_job j = { out, x, NULL, NULL, 0, W, NULL, NULL, &q8_act, m, n, k, 1 };

	q8_run(&j);
}

/* Assumptions: as dps_linear_q8, W (n x k, k a multiple of 32) MXFP4 re-laid by
 * dps_mxfp4_interleave, its scales as stored. */
void dps_linear_mxfp4_q8(float *out, const float *x, const uint8_t *blocks,
			 const uint8_t *scales, int m, int n, int k)
{
	struct linear_job j = { out, x, NULL, NULL, 0, NULL, blocks, scales, &q8_act, m, n, k, 1 };

	q8_run(&j);
}

/* An integer product on the calling thread alone: x into the thread's own activations. */
static void here(struct linear_job *j)
{
	if (!g.ready) { /* set up by the rank's thread before any pool task runs */
		fprintf(stderr, "dpshard: a product on a pool thread before the pool was set up\n");
		abort();
	}
	pthread_once(&q8_act_once, q8_act_key_make);
	if (!pthread_getspecific(q8_act_key) && pthread_setspecific(q8_act_key, &q8_act)) {
		fprintf(stderr, "dpshard: cannot set a thread key\n");
		abort();
	}
	if (dps_q8_act_quantize(&q8_act, j->x, j->m, j->k)) {
		fprintf(stderr, "dpshard: cannot allocate the quantized activations of a "
			"%d x %d product\n", j->m, j->k);
		abort();
	}
	linear_slice(j, 0, 0); /* one chunk: every row */
}

void dps_linear_mxfp4_q8_here(float *out, const float *x, const uint8_t *blocks,
			      const uint8_t *scales, int m, int n, int k)
{
	struct linear_job j = { out, x, NULL, NULL, 0, NULL, blocks, scales, &q8_act, m, n, k, 1 };

	here(&j);
}

void dps_linear_q8_here(float *out, const float *x, const void *W, int m, int n, int k)
{
	struct linear_job j = { out, x, NULL, NULL, 0, W, NULL, NULL, &q8_act, m, n, k, 1 };

	here(&j);
}

void dps_linear_q8_ref(float *out, const float *x, const void *W, int m, int n, int k)
{
	struct dps_q8_act a = { 0 };

	if (dps_q8_act_quantize(&a, x, m, k)) {
		fprintf(stderr, "dpshard: cannot allocate the quantized activations of a "
			"%d x %d product\n", m, k);
		abort();
	}
	dps_gemm_q8_ref(out, n, &a, W, n);
	dps_q8_act_free(&a);
}

void dps_linear_w(float *out, const float *x, const void *W, enum dps_wtype t, int m, int n,
		  int k)
{
	if (t == DPS_WT_Q8)
		dps_linear_q8(out, x, W, m, n, k);
	else if (t == DPS_WT_F16)
		dps_linear_f16(out, x, W, m, n, k);
	else if (t == DPS_WT_BF16)
		dps_linear_bf16(out, x, W, m, n, k);
	else
		dps_linear_f32(out, x, W, m, n, k);
}

struct dps_pool *dps_gemm_pool(void)
{
	return g.pool;
}

void dps_linear_f32_ref(float *out, const float *x, const float *W, int m, int n, int k)
{
	dps_gemm_f32_ref(out, n, x, W, m, n, k);
}

void dps_linear_bf16_ref(float *out, const float *x, const uint16_t *W, int m, int n, int k)
{
	dps_gemm_bf16_ref(out, n, x, W, m, n, k);
}

void dps_linear_f16_ref(float *out, const float *x, const uint16_t *W, int m, int n, int k)
{
	dps_gemm_f16_ref(out, n, x, W, m, n, k);
}

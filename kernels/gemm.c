/* SPDX-License-Identifier: MIT */
/*
 * kernels/gemm.c - BLIS kernel selection and the linear product (see gemm.h). Called for
 * every projection of every layer; the selection runs once.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <blis.h>
#include <immintrin.h>

#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/pool.h"

/* Below this m the skinny-matrix kernels of zen3/haswell beat skx's packed 32x12 kernel
 * (measured single-thread on Zen 5 with k = 768: the two meet at m = 40..56). */
#define SMALL_M_MAX 47

/*
 * Up to this m, dpshard's own kernel (W streamed once per call, four rows of x per pass over
 * a four-row block of W) beats every BLIS set here: measured single-thread on Zen 5 with
 * 2048 x 768 weights, 30 against 27 GB/s at m = 1, 83 against 60 GFLOP/s at m = 8, 148
 * against 129 at m = 128; skx's packed kernel wins from m = 256 (159 against 144).
 */
#define OWN_M_MAX 128

static struct {
	int ready;
	int own_small; /* m <= OWN_M_MAX through dps_gemm_small_f32_avx512 instead of BLIS */
	int threads;
	int small_m_max;
	cntx_t *big, *small;
	struct dps_pool *pool; /* the rank's threads; each runs BLIS single-threaded on its slice */
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

int dps_gemm_setup(const char *spec, int threads, char *msg, size_t msglen)
{
	arch_t big, small;
	const char *colon;
	char num[16];

	if (!spec || !strcmp(spec, "auto")) {
		big = cpu_runs(BLIS_ARCH_SKX) ? BLIS_ARCH_SKX
		    : cpu_runs(BLIS_ARCH_ZEN3) ? BLIS_ARCH_ZEN3 : BLIS_ARCH_GENERIC;
		__builtin_cpu_init();
		small = big == BLIS_ARCH_SKX
				? (__builtin_cpu_is("amd") ? BLIS_ARCH_ZEN3 : BLIS_ARCH_HASWELL)
				: big;
	} else {
		colon = strchr(spec, ':');
		if (arch_lookup(spec, colon ? (size_t)(colon - spec) : strlen(spec), &big) ||
		    (colon && arch_lookup(colon + 1, strlen(colon + 1), &small))) {
			snprintf(msg, msglen, "--blis-arch %s: expected auto, skx, zen3, haswell, "
				 "generic, or BIG:SMALL such as skx:zen3", spec);
			return -EINVAL;
		}
		if (!colon)
			small = big;
	}
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
			 spec ? spec : "auto", bli_arch_string(g.big ? small : big));
		return -EINVAL;
	}
	g.threads = threads > 0 ? threads : 1;
	if (dps_pool_size(g.pool) != g.threads) {
		int rc;

		dps_pool_destroy(g.pool);
		g.pool = NULL;
		rc = dps_pool_create(&g.pool, g.threads);
		if (rc) {
			snprintf(msg, msglen, "cannot start %d threads: %s", g.threads, strerror(-rc));
			return rc;
		}
	}
	g.small_m_max = small != big ? SMALL_M_MAX : 0;
	/* With "auto", decode-sized products use our streaming kernel. */
	g.own_small = (!spec || !strcmp(spec, "auto")) && __builtin_cpu_supports("avx512f");
	if (g.own_small)
		snprintf(g.desc, sizeof(g.desc),
			 "dpshard's AVX-512 kernel for m <= %d, BLIS %s '%s' kernels above, %d thread(s)",
			 OWN_M_MAX, bli_info_get_version_str(), bli_arch_string(big), g.threads);
	else if (small != big)
		snprintf(g.desc, sizeof(g.desc), "BLIS %s: '%s' kernels, '%s' for m <= %d, %d thread(s)",
			 bli_info_get_version_str(), bli_arch_string(big), bli_arch_string(small),
			 g.small_m_max, g.threads);
	else
		snprintf(g.desc, sizeof(g.desc), "BLIS %s: '%s' kernels, %d thread(s)",
			 bli_info_get_version_str(), bli_arch_string(big), g.threads);
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
	int m, n, k, chunks;
};

/*
 * Chunk `chunk` computes the output columns [lo, hi) (rows lo..hi-1 of W). Slices start at
 * multiples of SLICE_ALIGN, a multiple of every register-tile width of the kernel sets (4,
 * 6, 12, 16, 32), so each column falls in the same tile, computed in the same order, whatever
 * the number of chunks and threads: results do not depend on them (tests/check_kernels.c).
 */
#define SLICE_ALIGN 96

static void linear_slice(void *arg, int chunk, int tid)
{
	const struct linear_job *j = arg;
	rntm_t rntm = BLIS_RNTM_INITIALIZER;
	float one = 1.0f, zero = 0.0f;
	int lo, hi;

	(void)tid;
	dps_pool_split(j->n, SLICE_ALIGN, chunk, j->chunks, &lo, &hi);
	if (lo >= hi)
		return;
	if (j->m <= OWN_M_MAX && g.own_small) {
		dps_gemm_small_f32_avx512(j->out + lo, j->n, j->x, j->W + (size_t)lo * (size_t)j->k,
					  j->m, hi - lo, j->k);
		return;
	}
	bli_rntm_set_num_threads(1, &rntm);
	bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_TRANSPOSE, j->m, hi - lo, j->k, &one, (float *)j->x,
		     j->k, 1, (float *)j->W + (size_t)lo * (size_t)j->k, j->k, 1, &zero, j->out + lo,
		     j->n, 1, j->m <= g.small_m_max ? g.small : g.big, &rntm);
}

/*
 * Assumptions: x is m x k row-major (row stride k), W is n x k row-major and is read as W^T
 * (BLIS transposes it), out is m x n row-major. No alignment needed.
 */
void dps_linear_f32(float *out, const float *x, const float *W, int m, int n, int k)
{
	struct linear_job j = { out, x, W, m, n, k, 1 };
	int nt;

	if (!g.ready) {
		char msg[256];

		dps_gemm_setup("auto", 1, msg, sizeof(msg));
	}
	/*
	 * More chunks than threads, so a thread that is descheduled delays only its chunk; fewer
	 * for BLIS, which packs x again for every chunk.
	 */
	nt = dps_pool_size(g.pool);
	if (nt > 1)
		j.chunks = nt * (m <= OWN_M_MAX && g.own_small ? 4 : 2);
	dps_pool_run(g.pool, j.chunks, linear_slice, &j);
}

struct dps_pool *dps_gemm_pool(void)
{
	return g.pool;
}

void dps_gemm_small_f32_ref(float *restrict out, int ldo, const float *restrict x,
			    const float *restrict W, int m, int n, int k)
{
	for (int i = 0; i < m; i++)
		dps_matvec_ref(out + (size_t)i * (size_t)ldo, x + (size_t)i * (size_t)k, W, n, k);
}

void dps_linear_f32_ref(float *out, const float *x, const float *W, int m, int n, int k)
{
	dps_gemm_small_f32_ref(out, n, x, W, m, n, k);
}

/* The sum of the two 256-bit halves of v (eight lanes of pairs). */
__attribute__((target("avx512f"), always_inline)) static inline __m256 half_sum(__m512 v)
{
	return _mm256_add_ps(_mm512_castps512_ps256(v),
			     _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* Sum of the 16 lanes of each of 8 vectors, in one vector: a fixed tree per input. */
__attribute__((target("avx512f"), always_inline)) static inline __m256
reduce8(__m512 v0, __m512 v1, __m512 v2, __m512 v3, __m512 v4, __m512 v5, __m512 v6, __m512 v7)
{
	const __m256 h0 = _mm256_hadd_ps(half_sum(v0), half_sum(v1));
	const __m256 h1 = _mm256_hadd_ps(half_sum(v2), half_sum(v3));
	const __m256 h2 = _mm256_hadd_ps(half_sum(v4), half_sum(v5));
	const __m256 h3 = _mm256_hadd_ps(half_sum(v6), half_sum(v7));
	const __m256 g0 = _mm256_hadd_ps(h0, h1), g1 = _mm256_hadd_ps(h2, h3);

	return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

/*
 * Four rows of W against mr (1..4, a constant where it is inlined) rows of x: out[i][r0 + q]
 * for q < nr. Each output is one 16-lane accumulator over the columns in order, then
 * reduced: the arithmetic of dps_matvec_f32_avx512, so a row's result does not depend on the
 * other rows of the batch. Inlined once per mr (block_1 .. block_4) so that the loops over
 * the rows unroll and the sixteen accumulators stay in registers.
 *
 * Assumptions: x is mr x k and W n x k row-major (stride k), out has row stride n, any
 * alignment; rows r0 + nr .. r0 + 3 of W are not read (their loads repeat row r0); the next
 * four rows of W are prefetched in step with these.
 */
__attribute__((target("avx512f"), always_inline)) static inline void
block_rows(float *restrict out, const float *restrict x, const float *restrict W, int r0, int nr,
	   int n, int k, const int mr)
{
	const int tail = k % 16;
	const __mmask16 mask = (__mmask16)((1u << tail) - 1);
	const float *w0 = W + (size_t)r0 * (size_t)k;
	const float *w1 = nr > 1 ? w0 + k : w0, *w2 = nr > 2 ? w0 + 2 * k : w0;
	const float *w3 = nr > 3 ? w0 + 3 * k : w0;
	__m512 a[4][4]; /* a[i][q]: row i of x against row r0 + q of W */
	int c = 0;

#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
		a[i][0] = a[i][1] = a[i][2] = a[i][3] = _mm512_setzero_ps();
	for (; c + 16 <= k; c += 16) {
		const __m512 w0v = _mm512_loadu_ps(w0 + c), w1v = _mm512_loadu_ps(w1 + c);
		const __m512 w2v = _mm512_loadu_ps(w2 + c), w3v = _mm512_loadu_ps(w3 + c);

		/* The next four rows, in step: their fetch overlaps this block's sums. */
		_mm_prefetch((const char *)(w0 + 4 * (size_t)k + c), _MM_HINT_T0);
		_mm_prefetch((const char *)(w0 + 5 * (size_t)k + c), _MM_HINT_T0);
		_mm_prefetch((const char *)(w0 + 6 * (size_t)k + c), _MM_HINT_T0);
		_mm_prefetch((const char *)(w0 + 7 * (size_t)k + c), _MM_HINT_T0);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			const __m512 xv = _mm512_loadu_ps(x + (size_t)i * (size_t)k + c);

			a[i][0] = _mm512_fmadd_ps(w0v, xv, a[i][0]);
			a[i][1] = _mm512_fmadd_ps(w1v, xv, a[i][1]);
			a[i][2] = _mm512_fmadd_ps(w2v, xv, a[i][2]);
			a[i][3] = _mm512_fmadd_ps(w3v, xv, a[i][3]);
		}
	}
	if (tail) {
		const __m512 w0v = _mm512_maskz_loadu_ps(mask, w0 + c);
		const __m512 w1v = _mm512_maskz_loadu_ps(mask, w1 + c);
		const __m512 w2v = _mm512_maskz_loadu_ps(mask, w2 + c);
		const __m512 w3v = _mm512_maskz_loadu_ps(mask, w3 + c);

#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			const __m512 xv = _mm512_maskz_loadu_ps(mask, x + (size_t)i * (size_t)k + c);

			a[i][0] = _mm512_fmadd_ps(w0v, xv, a[i][0]);
			a[i][1] = _mm512_fmadd_ps(w1v, xv, a[i][1]);
			a[i][2] = _mm512_fmadd_ps(w2v, xv, a[i][2]);
			a[i][3] = _mm512_fmadd_ps(w3v, xv, a[i][3]);
		}
	}
	/* Rows i and i + 1 reduced together (row i twice when it is the last). */
#pragma GCC unroll 2
	for (int i = 0; i < mr; i += 2) {
		const int j = i + 1 < mr ? i + 1 : i;
		float s[8];

		_mm256_storeu_ps(s, reduce8(a[i][0], a[i][1], a[i][2], a[i][3], a[j][0], a[j][1],
					    a[j][2], a[j][3]));
		for (int q = 0; q < nr; q++) {
			out[(size_t)i * (size_t)n + (size_t)(r0 + q)] = s[q];
			if (j != i)
				out[(size_t)j * (size_t)n + (size_t)(r0 + q)] = s[4 + q];
		}
	}
}

__attribute__((target("avx512f"))) static void block_1(float *restrict out, const float *restrict x,
							const float *restrict W, int r0, int nr,
							int n, int k)
{
	block_rows(out, x, W, r0, nr, n, k, 1);
}

__attribute__((target("avx512f"))) static void block_2(float *restrict out, const float *restrict x,
							const float *restrict W, int r0, int nr,
							int n, int k)
{
	block_rows(out, x, W, r0, nr, n, k, 2);
}

__attribute__((target("avx512f"))) static void block_3(float *restrict out, const float *restrict x,
							const float *restrict W, int r0, int nr,
							int n, int k)
{
	block_rows(out, x, W, r0, nr, n, k, 3);
}

__attribute__((target("avx512f"))) static void block_4(float *restrict out, const float *restrict x,
							const float *restrict W, int r0, int nr,
							int n, int k)
{
	block_rows(out, x, W, r0, nr, n, k, 4);
}

/*
 * Assumptions: x is m x k, W is n x k, out is m x n with row stride ldo, all row-major, any
 * alignment. For each group of four rows of W (kept in L1 while it is used, the next group
 * prefetched meanwhile), x goes by in groups of four rows.
 */
void dps_gemm_small_f32_avx512(float *restrict out, int ldo, const float *restrict x,
			       const float *restrict W, int m, int n, int k)
{
	for (int r = 0; r < n; r += 4) {
		const int nr = n - r < 4 ? n - r : 4;

		for (int i = 0; i < m; i += 4) {
			const float *xi = x + (size_t)i * (size_t)k;
			float *oi = out + (size_t)i * (size_t)ldo;

			switch (m - i < 4 ? m - i : 4) {
			case 1: block_1(oi, xi, W, r, nr, ldo, k); break;
			case 2: block_2(oi, xi, W, r, nr, ldo, k); break;
			case 3: block_3(oi, xi, W, r, nr, ldo, k); break;
			default: block_4(oi, xi, W, r, nr, ldo, k); break;
			}
		}
	}
}

void dps_matvec_f32_avx512(float *restrict out, const float *restrict x,
			   const float *restrict W, int rows, int cols)
{
	dps_gemm_small_f32_avx512(out, rows, x, W, 1, rows, cols);
}

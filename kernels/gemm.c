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

static struct {
	int ready;
	int own_matvec; /* m = 1 through dps_matvec_f32_avx512 instead of BLIS */
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
	/* With "auto", one-row products (decode at batch 1) use our streaming kernel. */
	g.own_matvec = (!spec || !strcmp(spec, "auto")) && __builtin_cpu_supports("avx512f");
	if (small != big)
		snprintf(g.desc, sizeof(g.desc),
			 "BLIS %s: '%s' kernels, '%s' for m <= %d%s, %d thread(s)",
			 bli_info_get_version_str(), bli_arch_string(big), bli_arch_string(small),
			 g.small_m_max, g.own_matvec ? ", dpshard's AVX-512 kernel for m = 1" : "",
			 g.threads);
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
	int m, n, k;
};

/*
 * Thread tid computes the output columns [lo, hi) (rows lo..hi-1 of W). Slices start at
 * multiples of SLICE_ALIGN, a multiple of every register-tile width of the kernel sets (6,
 * 12, 16, 32), so each column falls in the same tile, computed in the same order, whatever the
 * number of threads: results do not depend on it (tests/check_kernels.c).
 */
#define SLICE_ALIGN 96

static void linear_slice(void *arg, int tid, int nt)
{
	const struct linear_job *j = arg;
	rntm_t rntm = BLIS_RNTM_INITIALIZER;
	float one = 1.0f, zero = 0.0f;
	int lo, hi;

	dps_pool_split(j->n, SLICE_ALIGN, tid, nt, &lo, &hi);
	if (lo >= hi)
		return;
	if (j->m == 1 && g.own_matvec) {
		dps_matvec_f32_avx512(j->out + lo, j->x, j->W + (size_t)lo * (size_t)j->k, hi - lo,
				      j->k);
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
	struct linear_job j = { out, x, W, m, n, k };

	if (!g.ready) {
		char msg[256];

		dps_gemm_setup("auto", 1, msg, sizeof(msg));
	}
	dps_pool_run(g.pool, linear_slice, &j);
}

struct dps_pool *dps_gemm_pool(void)
{
	return g.pool;
}

void dps_linear_f32_ref(float *out, const float *x, const float *W, int m, int n, int k)
{
	for (int i = 0; i < m; i++)
		dps_matvec_ref(out + (size_t)i * (size_t)n, x + (size_t)i * (size_t)k, W, n, k);
}

/*
 * Assumptions: W is rows x cols row-major with any alignment; x has cols floats. Four rows
 * share each load of x; the weights stream through once, which is what bounds decode.
 * Sums run in a different order from dps_matvec_ref: equal within rounding.
 */
__attribute__((target("avx512f")))
void dps_matvec_f32_avx512(float *out, const float *x, const float *W, int rows, int cols)
{
	const int tail = cols % 16;
	const __mmask16 mask = (__mmask16)((1u << tail) - 1);
	int r = 0;

	for (; r + 4 <= rows; r += 4) {
		const float *w0 = W + (size_t)r * (size_t)cols, *w1 = w0 + cols;
		const float *w2 = w1 + cols, *w3 = w2 + cols;
		__m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
		int c = 0;

		for (; c + 16 <= cols; c += 16) {
			const __m512 xv = _mm512_loadu_ps(x + c);

			a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + c), xv, a0);
			a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + c), xv, a1);
			a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + c), xv, a2);
			a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + c), xv, a3);
		}
		if (tail) {
			const __m512 xv = _mm512_maskz_loadu_ps(mask, x + c);

			a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, w0 + c), xv, a0);
			a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, w1 + c), xv, a1);
			a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, w2 + c), xv, a2);
			a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, w3 + c), xv, a3);
		}
		out[r] = _mm512_reduce_add_ps(a0);
		out[r + 1] = _mm512_reduce_add_ps(a1);
		out[r + 2] = _mm512_reduce_add_ps(a2);
		out[r + 3] = _mm512_reduce_add_ps(a3);
	}
	if (r < rows)
		dps_matvec_ref(out + r, x, W + (size_t)r * (size_t)cols, rows - r, cols);
}

/* SPDX-License-Identifier: MIT */
/*
 * tools/bench_decode.c - `dpshard bench decode`: prefill (ppP) and decode (tgN at batch B)
 * throughput of one rank, llama-bench style (tokens/s, mean and sd over repetitions), each
 * beside this machine's limits measured in the same run:
 *
 * - decode reads every weight once per step plus each row's KV cache: bytes per step over the
 *   memory read bandwidth measured here (same threads) is the bandwidth-bound step time, and
 *   the result shows the fraction of that bound reached;
 * - prefill is matrix products: their GFLOP/s (timed inside the step) beside the sgemm rate
 *   of a large square product measured here with the same kernels and threads.
 *
 * The sharded configurations of the engine join this suite with the sharded forward pass.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <immintrin.h>

#include "common/dps.h"
#include "engine/mkmodel.h"
#include "engine/model.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/pool.h"
#include "tools/cmd.h"
#include "tools/flags.h"

#define MAX_LIST 16

struct result {
	char test[32];
	int batch, prompt, gen;
	double mean, sd;       /* tokens/s */
	double bytes_per_step; /* decode: weights + KV read per step */
	double gbs;            /* decode: achieved read rate; prefill: product GFLOP/s */
	double bound;          /* decode: fraction of the bandwidth bound; prefill: of the sgemm rate */
};

static int parse_list(const char *s, int *out, int lo, int hi)
{
	int n = 0;

	while (*s) {
		char *end;
		long v = strtol(s, &end, 10);

		if (end == s || v < lo || v > hi || n == MAX_LIST || (*end && *end != ','))
			return -1;
		out[n++] = (int)v;
		s = *end ? end + 1 : end;
	}
	return n ? n : -1;
}

static void stats(const double *v, int n, double *mean, double *sd)
{
	double s = 0, q = 0;

	for (int i = 0; i < n; i++)
		s += v[i];
	*mean = s / n;
	for (int i = 0; i < n; i++)
		q += (v[i] - *mean) * (v[i] - *mean);
	*sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* ---- the machine's limits ------------------------------------------------------------ */

struct read_job {
	const float *buf;
	size_t n;
	int chunks;
	float sink[64];
};

__attribute__((target("avx512f"))) static float read512(const float *p, size_t n)
{
	__m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;

	for (size_t i = 0; i + 64 <= n; i += 64) {
		a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
		a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
		a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
		a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
	}
	return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

static float read_plain(const float *p, size_t n)
{
	float acc[16] = { 0 };

	for (size_t i = 0; i + 16 <= n; i += 16)
		for (int j = 0; j < 16; j++)
			acc[j] += p[i + j];
	for (int j = 1; j < 16; j++)
		acc[0] += acc[j];
	return acc[0];
}

static void read_slice(void *arg, int chunk, int tid)
{
	struct read_job *j = arg;
	int lo, hi;

	(void)tid;
	/* In units of 64 floats (one 256-byte block), so every slice stays aligned. */
	dps_pool_split((int)(j->n / 64), 1, chunk, j->chunks, &lo, &hi);
	__builtin_cpu_init();
	j->sink[chunk % 64] += __builtin_cpu_supports("avx512f")
				    ? read512(j->buf + (size_t)lo * 64, (size_t)(hi - lo) * 64)
				    : read_plain(j->buf + (size_t)lo * 64, (size_t)(hi - lo) * 64);
}

/*
 * Read bandwidth (bytes/s) of this process's threads over a buffer far larger than the
 * caches, on huge pages like the weights: the median of reps passes.
 */
static double read_bandwidth(size_t bytes, int reps)
{
	const size_t huge = (size_t)2 << 20;
	struct read_job j = { 0 };
	double t[16];
	void *p = NULL;

	bytes = (bytes + huge - 1) / huge * huge;
	if (posix_memalign(&p, huge, bytes))
		return 0;
	(void)madvise(p, bytes, MADV_HUGEPAGE);
	memset(p, 1, bytes);
	j.buf = p;
	j.n = bytes / sizeof(float);
	j.chunks = 4 * dps_pool_size(dps_gemm_pool());
	dps_pool_run(dps_gemm_pool(), j.chunks, read_slice, &j); /* warm the TLB and the threads */
	for (int r = 0; r < reps && r < 16; r++) {
		const uint64_t t0 = dps_now_ns();

		dps_pool_run(dps_gemm_pool(), j.chunks, read_slice, &j);
		t[r] = (double)bytes / ((double)(dps_now_ns() - t0) / 1e9);
	}
	free(p);
	qsort(t, (size_t)(reps < 16 ? reps : 16), sizeof(double), cmp_double);
	return t[(reps < 16 ? reps : 16) / 2];
}

/* GFLOP/s of a square n x n x n product through dps_linear_f32: the median of reps. */
static double sgemm_rate(int n, int reps)
{
	float *a = malloc(sizeof(float) * (size_t)n * n), *b = malloc(sizeof(float) * (size_t)n * n);
	float *c = malloc(sizeof(float) * (size_t)n * n);
	double t[16];

	if (!a || !b || !c) {
		free(a);
		free(b);
		free(c);
		return 0;
	}
	for (size_t i = 0; i < (size_t)n * n; i++) {
		a[i] = (float)(i % 13) * 0.01f;
		b[i] = (float)(i % 7) * 0.02f;
	}
	dps_linear_f32(c, a, b, n, n, n);
	for (int r = 0; r < reps && r < 16; r++) {
		const uint64_t t0 = dps_now_ns();

		dps_linear_f32(c, a, b, n, n, n);
		t[r] = 2.0 * n * n * (double)n / ((double)(dps_now_ns() - t0));
	}
	free(a);
	free(b);
	free(c);
	qsort(t, (size_t)(reps < 16 ? reps : 16), sizeof(double), cmp_double);
	return t[(reps < 16 ? reps : 16) / 2];
}

static void cpu_model(char *out, size_t len)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[512];

	snprintf(out, len, "unknown CPU");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
			snprintf(out, len, "%s", strchr(line, ':') + 2);
			out[strcspn(out, "\n")] = 0;
			break;
		}
	fclose(f);
}

/* Prints s as a JSON string. */
static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		const unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

/* ---- the runs -------------------------------------------------------------------------- */

/* One prefill of p rows of sequence 0; returns seconds, adds the products' time and flops. */
static double run_prefill(struct dps_model *m, int p, int *tok, int *pos, int *seq,
			  unsigned char *want, double *flops, double *ns)
{
	const uint64_t ln0 = m->linear_ns;
	const double lf0 = m->linear_flops;
	uint64_t t0;

	for (int i = 0; i < p; i++) {
		tok[i] = (i * 131 + 7) % m->cfg.vocab_size;
		pos[i] = i;
		seq[i] = 0;
		want[i] = i == p - 1;
	}
	t0 = dps_now_ns();
	dps_model_step(m, p, tok, pos, seq, want);
	*ns += (double)(m->linear_ns - ln0);
	*flops += m->linear_flops - lf0;
	return (double)(dps_now_ns() - t0) / 1e9;
}

/* b sequences: a one-token prompt each, then g decode steps of b rows; returns seconds. */
static double run_decode(struct dps_model *m, int b, int g, int *tok, int *pos, int *seq)
{
	const float *lg;
	uint64_t t0;

	for (int i = 0; i < b; i++) {
		tok[i] = m->cfg.bos_token_id;
		pos[i] = 0;
		seq[i] = i;
	}
	lg = dps_model_step(m, b, tok, pos, seq, NULL);
	t0 = dps_now_ns();
	for (int s = 1; s <= g; s++) {
		for (int i = 0; i < b; i++) {
			tok[i] = dps_argmax_ref(lg + (size_t)i * (size_t)m->cfg.vocab_size,
						m->cfg.vocab_size);
			pos[i] = s;
		}
		lg = dps_model_step(m, b, tok, pos, seq, NULL);
	}
	return (double)(dps_now_ns() - t0) / 1e9;
}

int dps_bench_decode(int argc, char **argv)
{
	const char *model_dir = NULL, *preset = "bench-110m", *blis_arch = "auto";
	const char *prompts_s = "512", *gens_s = "128", *batches_s = "1,8";
	int reps = 3, threads = 0, json = 0, npos, rc;
	int prompts[MAX_LIST], gens[MAX_LIST], batches[MAX_LIST], np, ng, nb;
	int max_b = 1, max_p = 1, max_g = 1, nres = 0, *tok = NULL, *pos = NULL, *seq = NULL;
	unsigned char *want = NULL;
	struct result res[3 * MAX_LIST * MAX_LIST];
	char *positional[1], err[512], dir[4096], cpu[256];
	struct dps_model m;
	double bw, peak, weights_read;
	const struct dps_flag flags[] = {
		{ "model", DPS_FLAG_STR, &model_dir, "DIR", "checkpoint directory (default: --preset)" },
		{ "preset", DPS_FLAG_STR, &preset, "NAME",
		  "mkmodel preset written to the cache on first use, when no --model" },
		{ "n-prompt", DPS_FLAG_STR, &prompts_s, "P,...", "prefill tests: prompt lengths", 0, 0,
		  'p' },
		{ "n-gen", DPS_FLAG_STR, &gens_s, "N,...", "decode tests: tokens per sequence", 0, 0,
		  'n' },
		{ "batch", DPS_FLAG_STR, &batches_s, "B,...", "decode tests: sequences per step", 0, 0,
		  'b' },
		{ "repetitions", DPS_FLAG_INT, &reps, "R", "runs of each test", 1, 100, 'r' },
		{ "threads-per-rank", DPS_FLAG_INT, &threads, "N",
		  "threads of the rank; 0: the CPUs this process may run on", 0, 1024 },
		{ "blis-arch", DPS_FLAG_STR, &blis_arch, "A",
		  "BLIS kernels: auto, skx, zen3, haswell, generic or BIG:SMALL" },
		{ "json", DPS_FLAG_BOOL, &json, NULL, "print the results as JSON" },
		DPS_FLAGS_END
	};

	rc = dps_flags_parse(flags, argc, argv, "bench decode", "[--model DIR | --preset NAME] "
			     "[-p P,...] [-n N,...] [-b B,...] [OPTIONS]", positional, 0, &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	np = parse_list(prompts_s, prompts, 1, 1 << 16);
	ng = parse_list(gens_s, gens, 1, 1 << 16);
	nb = parse_list(batches_s, batches, 1, 4096);
	if (np < 0 || ng < 0 || nb < 0) {
		fprintf(stderr, "dpshard bench decode: -p, -n and -b take comma-separated positive "
				"numbers (at most %d each)\n", MAX_LIST);
		return 2;
	}
	for (int i = 0; i < np; i++)
		max_p = prompts[i] > max_p ? prompts[i] : max_p;
	for (int i = 0; i < ng; i++)
		max_g = gens[i] > max_g ? gens[i] : max_g;
	for (int i = 0; i < nb; i++)
		max_b = batches[i] > max_b ? batches[i] : max_b;
	if (!threads)
		threads = dps_cpus_allowed();
	rc = dps_gemm_setup(blis_arch, threads, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dpshard bench decode: %s\n", err);
		return 2;
	}
	if (!model_dir) {
		if (dps_cached_preset(preset, "bench decode", dir, sizeof(dir)))
			return 1;
		model_dir = dir;
	}
	fprintf(stderr, "dpshard bench decode: loading %s ...\n", model_dir);
	rc = dps_model_load(&m, model_dir,
			    &(struct dps_model_opts){ .max_pos = max_p > max_g + 1 ? max_p : max_g + 1,
						      .max_seqs = max_b,
						      .max_rows = max_p > max_b ? max_p : max_b,
						      .max_out = max_b },
			    err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dpshard bench decode: %s\n", err);
		return 1;
	}
	if (m.max_pos < (max_p > max_g + 1 ? max_p : max_g + 1)) {
		fprintf(stderr, "dpshard bench decode: the model's context is %d positions; -p and "
				"-n + 1 must fit in it\n", m.max_pos);
		dps_model_free(&m);
		return 2;
	}
	tok = calloc((size_t)m.max_rows, sizeof(int));
	pos = calloc((size_t)m.max_rows, sizeof(int));
	seq = calloc((size_t)m.max_rows, sizeof(int));
	want = calloc((size_t)m.max_rows, 1);
	if (!tok || !pos || !seq || !want) {
		fprintf(stderr, "dpshard bench decode: out of memory\n");
		rc = 1;
		goto out;
	}
	fprintf(stderr, "dpshard bench decode: measuring read bandwidth and the sgemm rate ...\n");
	bw = read_bandwidth((size_t)1 << 30, 7);
	peak = sgemm_rate(1536, 5);
	/* Each decode step reads every weight but the embedding, of which only b rows (unless tied,
	 * when the LM head reads it whole). */
	weights_read = (double)m.weight_bytes;
	if (!m.cfg.tie_word_embeddings)
		weights_read -= (double)m.cfg.vocab_size * m.cfg.hidden_size * sizeof(float);
	for (int pi = 0; pi < np; pi++) {
		struct result *r = &res[nres++];
		double v[100], flops = 0, ns = 0;

		for (int k = 0; k < reps; k++) {
			fprintf(stderr, "\rdpshard bench decode: pp%d, run %d of %d ...", prompts[pi],
				k + 1, reps);
			v[k] = prompts[pi] / run_prefill(&m, prompts[pi], tok, pos, seq, want, &flops,
							 &ns);
		}
		snprintf(r->test, sizeof(r->test), "pp%d", prompts[pi]);
		r->prompt = prompts[pi];
		r->batch = 1;
		stats(v, reps, &r->mean, &r->sd);
		r->gbs = ns > 0 ? flops / ns : 0;
		r->bound = peak > 0 ? r->gbs / peak : 0;
	}
	for (int gi = 0; gi < ng; gi++)
		for (int bi = 0; bi < nb; bi++) {
			struct result *r = &res[nres++];
			const int b = batches[bi], g = gens[gi];
			const double kv_row = 2.0 * m.cfg.num_hidden_layers * m.cfg.num_key_value_heads *
					      m.cfg.head_dim * sizeof(float);
			double v[100], secs = 0;

			for (int k = 0; k < reps; k++) {
				double t;

				fprintf(stderr, "\rdpshard bench decode: tg%d at batch %d, run %d of %d ...",
					g, b, k + 1, reps);
				t = run_decode(&m, b, g, tok, pos, seq);
				v[k] = (double)b * g / t;
				secs += t;
			}
			snprintf(r->test, sizeof(r->test), "tg%d", g);
			r->gen = g;
			r->batch = b;
			stats(v, reps, &r->mean, &r->sd);
			/* Step s reads positions 0..s of b sequences: (s + 1) rows of KV each. */
			r->bytes_per_step = weights_read + b * kv_row * (g + 3) / 2.0;
			r->gbs = r->bytes_per_step * g * reps / secs / 1e9;
			r->bound = bw > 0 ? r->gbs * 1e9 / bw : 0;
		}
	fprintf(stderr, "\r%*s\r", 70, "");
	cpu_model(cpu, sizeof(cpu));
	if (json) {
		printf("{\"version\": ");
		json_str(PACKAGE_VERSION);
		printf(", \"cpu\": ");
		json_str(cpu);
		printf(", \"blis\": ");
		json_str(dps_gemm_describe());
		printf(", \"threads\": %d,\n \"model\": ", threads);
		json_str(model_dir);
		printf(", \"weight_bytes\": %zu, \"params\": %llu,\n"
		       " \"read_bandwidth_gbs\": %.2f, \"sgemm_gflops\": %.1f,\n \"results\": [\n",
		       m.weight_bytes, (unsigned long long)dps_model_config_params(&m.cfg), bw / 1e9,
		       peak);
		for (int i = 0; i < nres; i++) {
			const struct result *r = &res[i];

			if (r->prompt)
				printf("  {\"test\": \"%s\", \"batch\": 1, \"tokens_per_s\": %.2f, "
				       "\"sd\": %.2f, \"gemm_gflops\": %.1f, \"of_sgemm\": %.3f}%s\n",
				       r->test, r->mean, r->sd, r->gbs, r->bound, i + 1 < nres ? "," : "");
			else
				printf("  {\"test\": \"%s\", \"batch\": %d, \"tokens_per_s\": %.2f, "
				       "\"sd\": %.2f, \"bytes_per_step\": %.0f, \"read_gbs\": %.2f, "
				       "\"of_bandwidth_bound\": %.3f}%s\n", r->test, r->batch, r->mean,
				       r->sd, r->bytes_per_step, r->gbs, r->bound, i + 1 < nres ? "," : "");
		}
		printf(" ]}\n");
	} else {
		printf("dpshard %s on %s, %d thread(s)\n%s\n", PACKAGE_VERSION, cpu, threads,
		       dps_gemm_describe());
		printf("measured in this run: memory read %.1f GB/s, sgemm %.0f GFLOP/s (1536^3)\n\n",
		       bw / 1e9, peak);
		printf("| %-12s | %10s | %8s | %-9s | %5s | %-10s | %16s | %-32s |\n", "model", "size",
		       "params", "config", "ranks", "test", "t/s", "limit");
		printf("|--------------|------------|----------|-----------|-------|------------|"
		       "------------------|----------------------------------|\n");
		for (int i = 0; i < nres; i++) {
			const struct result *r = &res[i];
			char test[48], lim[64], name[64];
			const char *base = strrchr(model_dir, '/');

			snprintf(name, sizeof(name), "%s", base && base[1] ? base + 1 : model_dir);
			if (r->prompt) {
				snprintf(test, sizeof(test), "%.31s", r->test);
				snprintf(lim, sizeof(lim), "products %.0f GFLOP/s = %.0f%% sgemm", r->gbs,
					 100 * r->bound);
			} else {
				snprintf(test, sizeof(test), "%.31s b%d", r->test, r->batch);
				snprintf(lim, sizeof(lim), "read %.1f GB/s = %.0f%% of bound", r->gbs,
					 100 * r->bound);
			}
			printf("| %-12.12s | %7.1f MB | %6.1f M | TP=1 DP=1 | %5d | %-10s | %7.1f ± %6.1f "
			       "| %-32s |\n", name, (double)m.weight_bytes / 1e6,
			       (double)dps_model_config_params(&m.cfg) / 1e6, 1, test, r->mean, r->sd,
			       lim);
		}
	}
	rc = 0;
out:
	free(tok);
	free(pos);
	free(seq);
	free(want);
	dps_model_free(&m);
	return rc;
}

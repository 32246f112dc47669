/* SPDX-License-Identifier: MIT */
/*
 * tools/bench_spec.c - `dpshard bench decode --speculative-model DIR`: decode tokens/s of the
 * serving engine (its scheduler, verification and draft passes, on real rank processes) with
 * and without Eagle3 speculation, in the same run.
 *
 * For every K of --num-speculative-tokens (0 first: no draft) and every batch B and length N,
 * one engine runs an untimed warm-up wave and then R timed waves of B requests per replica
 * (random prompts of P tokens, N tokens each, greedy, no stop token). A wave's decode rate is
 * its tokens after the first of each request over the time from the moment every request had
 * its first token to the last token. The table gives the median over the waves, the ratio to
 * K = 0 at the same B and N, the acceptance rate, the mean accepted length (tokens per
 * verification, the target's own token included) and the target passes per generated token.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/serve/engine.h"
#include "engine/model/model_config.h"
#include "engine/runtime/supervisor.h"
#include "kernels/gemm.h"
#include "tools/bench_spec.h"
#include "tools/machine.h"

#define MAX_WAVES 100

struct wave_run {
	const struct dps_bench_spec_opts *o;
	struct dps_engine_client *client;
	int B, G, waves;             /* requests per wave (every replica), tokens, timed waves */
	int wave, sent, done, firsts;
	int *got;                    /* per request of the wave: tokens so far */
	uint64_t t_first, gen;       /* the wave's decode start; tokens after the first ones */
	double rate[MAX_WAVES + 1];
	struct dps_engine_stats st[DPS_MAX_WORLD];
	uint32_t seed;
	int vocab, failed;
};

static uint32_t lcg(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

static void on_token(void *arg, void *user, int token)
{
	struct wave_run *w = arg;
	const int k = (int)(intptr_t)user;

	(void)token;
	/* Only tokens after every request's first count: the timer starts then. */
	if (w->got[k]++ == 0) {
		if (++w->firsts == w->B)
			w->t_first = dps_now_ns();
	} else if (w->firsts == w->B) {
		w->gen++;
	}
}

static void on_done(void *arg, void *user, enum dps_finish why, int n_gen)
{
	struct wave_run *w = arg;

	(void)user;
	(void)n_gen;
	w->failed |= why != DPS_FINISH_LENGTH;
	w->done++;
}

static void on_stats(void *arg, int replica, const struct dps_engine_stats *st, int final)
{
	struct wave_run *w = arg;

	if (final && replica >= 0 && replica < DPS_MAX_WORLD)
		w->st[replica] = *st;
}

/* Sends wave w->wave (0: the warm-up) when the previous one is done; closes after the last. */
static int tick(void *arg)
{
	struct wave_run *w = arg;
	const struct dps_bench_spec_opts *o = w->o;

	if (w->sent && w->done < w->B)
		return dps_engine_tick(w->client);
	if (w->sent) { /* a wave just ended */
		const double secs = (double)(dps_now_ns() - w->t_first) / 1e9;

		w->rate[w->wave] = secs > 0 ? (double)w->gen / secs : 0;
		w->wave++;
		w->sent = 0;
	}
	if (w->wave <= w->waves && !w->sent) {
		int *prompt = malloc(sizeof(int) * (size_t)o->prompt);

		if (!prompt) {
			w->failed = 1;
			dps_engine_close_when_idle(w->client);
			return dps_engine_tick(w->client);
		}
		w->done = w->firsts = 0;
		w->gen = 0;
		memset(w->got, 0, sizeof(int) * (size_t)w->B);
		for (int k = 0; k < w->B; k++) {
			struct dps_engine_req q = { prompt, o->prompt,
						    { .max_tokens = w->G }, k % o->par.dp,
						    (void *)(intptr_t)k };

			prompt[0] = 1;
			for (int i = 1; i < o->prompt; i++)
				prompt[i] = 3 + (int)(lcg(&w->seed) % (uint32_t)(w->vocab - 3));
			if (dps_engine_submit(w->client, &q) < 0)
				w->failed = 1;
		}
		free(prompt);
		w->sent = 1;
		if (w->wave == w->waves)
			dps_engine_close_when_idle(w->client);
	}
	return dps_engine_tick(w->client);
}

static void on_msg(int rank, const void *msg, size_t len, void *arg)
{
	dps_engine_on_msg(rank, msg, len, ((struct wave_run *)arg)->client);
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

struct spec_result {
	int k, batch, gen;
	double median, min, max;
	double accept, mean_len, passes_per_token;
	uint64_t drafted, accepted, steps, draft_steps;
};

/* One engine with K speculative tokens (0: none) for B sequences per replica of G tokens. */
static int run_one(const struct dps_bench_spec_opts *o, int K, int B, int G,
		   struct spec_result *r, char *err, size_t errlen)
{
	struct wave_run w = { .o = o, .B = B * o->par.dp, .G = G, .waves = o->reps,
			      .seed = 12345u + (uint32_t)B * 7u + (uint32_t)G, .vocab = o->vocab };
	struct dps_engine_cb cb = { on_token, on_done, on_stats, &w };
	struct dps_engine_opts eo = { .model = o->model, .blis_arch = o->blis_arch,
				      .threads = o->threads, .kv_fraction = 0.5,
				      .max_num_seqs = B, .max_model_len = o->prompt + G + K + 8,
				      .max_batched_tokens = 512 > B ? 512 : B,
				      .spec_model = K ? o->draft : NULL, .spec_k = K };
	struct dps_sup_opts so = { .par = o->par, .cpu_bind = o->cpu_bind,
				   .rank_fn = dps_engine_rank_main, .rank_arg = &eo,
				   .msg_fn = on_msg, .tick_fn = tick, .msg_arg = NULL };
	struct dps_sup_result sr;
	double v[MAX_WAVES];
	int rc;

	so.window_bytes = dps_engine_window_bytes(&eo, &o->par);
	memset(r, 0, sizeof(*r));
	w.got = calloc((size_t)w.B, sizeof(int));
	if (!w.got || dps_engine_client_new(&w.client, o->par.dp, o->par.tp, &cb)) {
		free(w.got);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	so.msg_arg = &w;
	rc = dps_sup_run(&so, &sr, err, errlen);
	dps_engine_client_free(w.client);
	free(w.got);
	if (!rc && (w.failed || w.wave <= w.waves)) {
		snprintf(err, errlen, "a request ended before its %d tokens", G);
		rc = -EIO;
	}
	if (rc)
		return rc;
	for (int i = 0; i < w.waves; i++)
		v[i] = w.rate[i + 1];
	qsort(v, (size_t)w.waves, sizeof(double), cmp_double);
	r->k = K;
	r->batch = B;
	r->gen = G;
	r->median = w.waves % 2 ? v[w.waves / 2] : (v[w.waves / 2 - 1] + v[w.waves / 2]) / 2;
	r->min = v[0];
	r->max = v[w.waves - 1];
	for (int d = 0; d < o->par.dp; d++) {
		r->drafted += w.st[d].spec_draft_tokens;
		r->accepted += w.st[d].spec_accepted;
		r->steps += w.st[d].steps;
		r->draft_steps += w.st[d].draft_steps;
		r->mean_len += (double)w.st[d].spec_drafts;
	}
	r->accept = r->drafted ? (double)r->accepted / (double)r->drafted : 0;
	r->mean_len = r->mean_len > 0 ? 1.0 + (double)r->accepted / r->mean_len : 1.0;
	/* A replica's target passes (prefill ones included) per token of one of its sequences,
	 * over every wave, warm-up included: about 1 without speculation. */
	r->passes_per_token = (double)r->steps / (double)o->par.dp /
			      ((double)(w.waves + 1) * (double)G);
	return 0;
}

int dps_bench_spec(const struct dps_bench_spec_opts *o)
{
	struct spec_result res[16 * 16 * 17];
	int nres = 0, ks[17], nk = 0, total, done = 0;
	struct dps_machine mach;
	char err[512];
	const uint64_t t0 = dps_now_ns();

	if (o->reps > MAX_WAVES) {
		fprintf(stderr, "dpshard bench decode: at most %d repetitions with speculation\n",
			MAX_WAVES);
		return 2;
	}
	ks[nk++] = 0;
	for (int i = 0; i < o->nk && nk < 17; i++)
		ks[nk++] = o->ks[i];
	total = o->ng * o->nb * nk;
	for (int gi = 0; gi < o->ng; gi++)
		for (int bi = 0; bi < o->nb; bi++)
			for (int ki = 0; ki < nk; ki++) {
				struct spec_result *r = &res[nres];
				const double el = (double)(dps_now_ns() - t0) / 1e9;

				fprintf(stderr, "\rdpshard bench decode: tg%d b%d K=%d (%d of %d done, "
					"%.0f s)   ", o->gens[gi], o->batches[bi], ks[ki], done, total,
					el);
				if (run_one(o, ks[ki], o->batches[bi], o->gens[gi], r, err,
					    sizeof(err))) {
					fprintf(stderr, "\ndpshard bench decode: K=%d b%d: %s\n", ks[ki],
						o->batches[bi], err);
					return 1;
				}
				nres++;
				done++;
			}
	fprintf(stderr, "\r%*s\r", 78, "");
	dps_gemm_setup(o->blis_arch, 1, err, sizeof(err));
	dps_machine_get(&mach);
	if (o->json) {
		printf("{");
		dps_machine_json(stdout, &mach);
		printf(", \"layout\": \"%s\", \"ranks\": %d, \"model\": \"%s\", "
		       "\"speculative_model\": \"%s\", \"prompt\": %d,\n \"results\": [\n", o->layout,
		       o->par.tp * o->par.dp, o->model, o->draft, o->prompt);
	} else if (o->csv) {
		printf("layout,ranks,test,batch,num_speculative_tokens,tokens_per_s_median,min,max,"
		       "vs_no_speculation,acceptance_rate,mean_acceptance_length,"
		       "target_passes_per_token,version,git_commit,cpu\n");
	} else {
		dps_machine_line(stdout, &mach);
		printf("%s, %d rank(s); target %s, draft %s; prompts of %d tokens, %d timed wave(s) "
		       "of B requests per replica after a warm-up\n%s\n\n", o->layout,
		       o->par.tp * o->par.dp, o->model, o->draft, o->prompt, o->reps, mach.blis);
		printf("| %-9s | %3s | %22s | %8s | %10s | %12s | %13s |\n", "test", "K",
		       "decode t/s (min-max)", "vs K=0", "acceptance", "mean length",
		       "passes/token");
		printf("|-----------|-----|------------------------|----------|------------|"
		       "--------------|---------------|\n");
	}
	for (int i = 0; i < nres; i++) {
		const struct spec_result *r = &res[i];
		const struct spec_result *base = r;
		char test[24];

		/* K = 0 of the same test is the first of its group. */
		for (int j = i; j >= 0; j--)
			if (res[j].k == 0 && res[j].batch == r->batch && res[j].gen == r->gen) {
				base = &res[j];
				break;
			}
		snprintf(test, sizeof(test), "tg%d b%d", r->gen, r->batch);
		if (o->json)
			printf("  {\"test\": \"tg%d\", \"batch\": %d, \"num_speculative_tokens\": %d, "
			       "\"tokens_per_s\": %.2f, \"min\": %.2f, \"max\": %.2f, "
			       "\"vs_no_speculation\": %.3f, \"drafted\": %llu, \"accepted\": %llu, "
			       "\"acceptance_rate\": %.4f, \"mean_acceptance_length\": %.3f, "
			       "\"target_passes_per_token\": %.3f, \"draft_passes\": %llu}%s\n", r->gen,
			       r->batch, r->k, r->median, r->min, r->max,
			       base->median > 0 ? r->median / base->median : 0,
			       (unsigned long long)r->drafted, (unsigned long long)r->accepted,
			       r->accept, r->mean_len, r->passes_per_token,
			       (unsigned long long)r->draft_steps, i + 1 < nres ? "," : "");
		else if (o->csv)
			printf("\"%s\",%d,tg%d,%d,%d,%.3f,%.3f,%.3f,%.4f,%.4f,%.4f,%.4f,%s,%s,\"%s\"\n",
			       o->layout, o->par.tp * o->par.dp, r->gen, r->batch, r->k, r->median,
			       r->min, r->max, base->median > 0 ? r->median / base->median : 0,
			       r->accept, r->mean_len, r->passes_per_token, PACKAGE_VERSION,
			       dps_git_commit, mach.cpu);
		else {
			char rate[40], acc[16] = "-", len[16] = "-";

			snprintf(rate, sizeof(rate), "%.1f (%.1f-%.1f)", r->median, r->min, r->max);
			if (r->k) {
				snprintf(acc, sizeof(acc), "%.1f%%", 100 * r->accept);
				snprintf(len, sizeof(len), "%.2f", r->mean_len);
			}
			printf("| %-9s | %3d | %22s | %7.2fx | %10s | %12s | %13.3f |\n", test, r->k,
			       rate, base->median > 0 ? r->median / base->median : 0, acc, len,
			       r->passes_per_token);
		}
	}
	if (o->json)
		printf(" ]}\n");
	else if (!o->csv)
		printf("\ndecode t/s: tokens after each request's first, every replica together, "
		       "median over the waves; mean length: tokens per verification (accepted "
		       "drafts + the target's own); passes/token: a replica's target steps (prefill included) per token of a sequence\n");
	return 0;
}

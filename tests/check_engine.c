/* SPDX-License-Identifier: MIT */
/*
 * tests/check_engine.c - the serving engine end to end: real rank processes under the
 * supervisor, requests from the client through the rings, tokens back.
 *
 * Oracle: each request's greedy tokens from the one-process model (dps_model), prompt fed
 * whole, then one token at a time. Checked: load balancing spreads 100 equal requests evenly
 * over 4 replicas and honours a named replica; uncoupled replicas make no cross-replica
 * collective and run no dummy batch; coupled replicas with very unequal loads (two idle) all
 * finish with the oracle's tokens, running dummy batches; cancellation and deadlines end
 * requests with their reason and every KV block is free at the end.
 *
 * Request streams on a mixture-of-experts model (tiny-moe: 8 experts, top 2): 40 requests
 * drawn from a fixed seed (the replica named, very skewed: most on replica 0, a few on 1,
 * fewer on 2, none ever on 3; the prompt; 1 to 20 tokens) are not submitted up front but
 * released by the supervisor's tick while the engine runs, some in bursts, some only once
 * every earlier request finished and a pause passed, so replicas sit idle for long stretches
 * (the whole engine at times) and then get work again. With expert parallelism (TP 1 x DP 4
 * on the all-gather + reduce-scatter dispatch, TP 2 x DP 2 on all-to-all-v) the replicas are
 * coupled: every request ends with exactly the oracle's tokens, the replicas step in lockstep
 * (as many steps and agreements each), idle ones run dummy batches (the counts are printed),
 * and every KV block is free at the end. Without expert parallelism and every size 1 the same
 * stream is as correct with no dummy batch and no cross-replica collective. The comparison is
 * shown to catch one wrong oracle token.
 *
 * vLLM's sampling fields end to end (TP 2 x DP 2): requests with repetition, presence and
 * frequency penalties, logit_bias, min_tokens over a stop id the model would emit at once,
 * and a seeded sample with min-p and a penalty each give the tokens of an oracle that applies
 * the same rules with this file's own code (dense counts, vLLM's formulas and order) to the
 * one-process model's logits; a request without the fields gives the plain greedy tokens.
 * Each field changes the tokens (the plain greedy oracle does not match its request: the
 * comparison can fail), and one wrong oracle token is caught.
 */
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/dps.h"
#include "kernels/sample.h"
#include "tests/greedy.h"
#include "tests/testutil.h"
#include "engine/serve/engine.h"
#include "engine/model/mkmodel.h"
#include "engine/model/model.h"
#include "engine/runtime/supervisor.h"

#define MAXREQ 128
#define GEN 12
#define NSTREAM 40    /* requests of a stream */
#define STREAM_GEN 20 /* the most tokens a request of a stream asks for */
#define NPROMPT 24    /* a stream's prompts: prompt_of(0 .. NPROMPT - 1) */

static char dir[64], moe[96]; /* the dense model, and the MoE one in dir/moe */

struct result {
	int tokens[MAXREQ][64], n[MAXREQ];
	enum dps_finish why[MAXREQ];
	int done;
	struct dps_engine_stats st[8];
	int n_stats;
	struct dps_engine_client *client;
	int cancel_first; /* cancel request 0 when its first token arrives */
};

static struct result res;

static void on_token(void *arg, void *user, int token)
{
	struct result *r = arg;
	const int k = (int)(intptr_t)user;

	if (r->n[k] < 64)
		r->tokens[k][r->n[k]++] = token;
	/* Mid-run: request 0 asks for 2000 tokens, far more than can come before this reaches
	 * its replica. */
	if (k == 0 && r->cancel_first && r->n[0] == 1)
		dps_engine_cancel(r->client, 0);
}

static void on_done(void *arg, void *user, enum dps_finish why, int n_gen)
{
	struct result *r = arg;

	(void)n_gen;
	r->why[(intptr_t)user] = why;
	r->done++;
}

static void on_stats(void *arg, int replica, const struct dps_engine_stats *st, int final)
{
	struct result *r = arg;

	if (!final) /* the periodic counts while it runs */
		return;
	if (replica >= 0 && replica < 8)
		r->st[replica] = *st;
	r->n_stats++;
}

static int prompt_of(int k, int *p)
{
	const int n = 1 + (k * 5) % 9;

	p[0] = 1;
	for (int i = 1; i < n; i++)
		p[i] = (k * 13 + i * 29) % 256;
	return n;
}

/* The one-process greedy tokens of prompt k (prompt_of) on the model in model. */
static void oracle(const char *model, int k, int *out, int n_out)
{
	int prompt[16];

	test_greedy_oracle(model, prompt, prompt_of(k, prompt), out, n_out);
}

/* A fresh client for layout par, its results in res (cancel_first kept). */
static void client_new(struct dps_par_cfg par)
{
	struct dps_engine_cb cb = { on_token, on_done, on_stats, &res };
	int cancel_first = res.cancel_first;

	memset(&res, 0, sizeof(res));
	res.cancel_first = cancel_first;
	ck_assert_int_eq(dps_engine_client_new(&res.client, par.dp, par.tp, &cb), 0);
}

/* Runs the engine on model with layout par until the client stops it; tick drives the client. */
static int launch(const char *model, struct dps_par_cfg par, int (*tick)(void *), char *err,
		  size_t len)
{
	struct dps_engine_opts eo = { .model = model, .max_num_seqs = 8, .max_model_len = 2048,
				      .max_batched_tokens = 32, .kv_cache_memory = 4u << 20 };
	struct dps_sup_opts so = { .par = par, .cpu_bind = "off", .rank_fn = dps_engine_rank_main,
				   .rank_arg = &eo, .msg_fn = dps_engine_on_msg, .tick_fn = tick,
				   .msg_arg = res.client };
	struct dps_sup_result sr;

	return dps_sup_run(&so, &sr, err, len);
}

/*
 * Runs n requests (request k on replica named[k], -1 for any), all submitted up front, on the
 * dense model with layout par; deadline_k: request index with a 1 ms deadline (-1: none).
 */
static int run(struct dps_par_cfg par, int n, const int *named, int deadline_k, char *err,
	       size_t len)
{
	client_new(par);
	for (int k = 0; k < n; k++) {
		int prompt[16];
		struct dps_engine_req q = { prompt, prompt_of(k, prompt),
					    { .max_tokens = k == deadline_k || (k == 0 && res.cancel_first)
								    ? 2000 : GEN },
					    named ? named[k] : -1, (void *)(intptr_t)k };

		if (k == deadline_k)
			q.p.deadline_ns = 1000000; /* 1 ms from its arrival at the replica */
		ck_assert_int_eq(dps_engine_submit(res.client, &q), k);
	}
	/* Cancelled before it was ever sent: it ends in the client. */
	if (res.cancel_first && n > 3)
		dps_engine_cancel(res.client, 3);
	dps_engine_close_when_idle(res.client);
	return launch(dir, par, dps_engine_tick, err, len);
}

/* ---- request streams ------------------------------------------------------------------------ */

/*
 * A stream, drawn before the run and released by stream_tick while the engine runs: request k
 * goes out once gate[k] requests (of any replica) have finished and then pause_ms[k] more
 * milliseconds have passed.
 */
static struct {
	int n, next, closed;
	int replica[NSTREAM], prompt[NSTREAM], max_tokens[NSTREAM];
	int gate[NSTREAM], pause_ms[NSTREAM];
	uint64_t open_ns; /* when the gate of request next opened (0: still shut) */
	uint64_t out_ns[NSTREAM], first_ns[NSTREAM]; /* released; its first token seen */
	int from_idle;    /* requests released while none was outstanding: the engine was idle */
} strm;

/* A 32-bit LCG (Numerical Recipes); its high bits, the low ones have short periods. */
static uint32_t lcg(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

/* Draws the stream of seed for dp replicas (a replica beyond dp - 1 folds onto replica 0). */
static void stream_make(uint32_t seed, int dp)
{
	uint32_t s = seed;

	memset(&strm, 0, sizeof(strm));
	strm.n = NSTREAM;
	for (int k = 0; k < NSTREAM; k++) {
		const uint32_t r = lcg(&s) % 100, g = lcg(&s) % 100;
		const int prev = k ? strm.gate[k - 1] : 0, d = r < 80 ? 0 : r < 94 ? 1 : 2;

		/* Replica 3 never gets a request: in a coupled engine it only ever runs dummies. */
		strm.replica[k] = d < dp ? d : 0;
		strm.prompt[k] = (int)(lcg(&s) % NPROMPT);
		strm.max_tokens[k] = 1 + (int)(lcg(&s) % STREAM_GEN);
		if (g < 50) {
			strm.gate[k] = prev; /* in the same burst as the one before */
		} else if (g < 80) {
			strm.gate[k] = k - 2 > prev ? k - 2 : prev; /* a few in flight at most */
		} else {
			/* Only once everything finished, and after a pause long enough for coupled
			 * replicas to fall asleep together: the client must wake them all. */
			strm.gate[k] = k;
			strm.pause_ms[k] = 10 + (int)(lcg(&s) % 40);
		}
	}
}

/*
 * The supervisor's tick (msg_arg the client): submits the requests whose gate opened, then
 * runs the client's own tick. The engine is told to close when idle only after the last
 * request is out: before, an idle moment between bursts would stop it.
 */
static int stream_tick(void *client)
{
	int wait = -1, rc;

	for (int k = 0; k < strm.next; k++)
		if (!strm.first_ns[k] && res.n[k])
			strm.first_ns[k] = dps_now_ns();
	while (strm.next < strm.n && res.done >= strm.gate[strm.next]) {
		const int k = strm.next;
		const uint64_t now = dps_now_ns(), pause = (uint64_t)strm.pause_ms[k] * 1000000u;
		int prompt[16];
		struct dps_engine_req q = { prompt, prompt_of(strm.prompt[k], prompt),
					    { .max_tokens = strm.max_tokens[k] }, strm.replica[k],
					    (void *)(intptr_t)k };

		if (!strm.open_ns)
			strm.open_ns = now;
		if (now - strm.open_ns < pause) {
			wait = (int)((pause - (now - strm.open_ns)) / 1000000u) + 1;
			break;
		}
		strm.from_idle += !dps_engine_outstanding(client);
		ck_assert_int_eq(dps_engine_submit(client, &q), k);
		strm.out_ns[k] = now;
		strm.next++;
		strm.open_ns = 0;
	}
	if (strm.next == strm.n && !strm.closed) {
		dps_engine_close_when_idle(client);
		strm.closed = 1;
	}
	rc = dps_engine_tick(client);
	/* A gate on finished requests opens on a message, which ends the supervisor's wait; a
	 * pause runs out on the clock alone. */
	if (wait >= 0 && (rc < 0 || wait < rc))
		rc = wait;
	return rc;
}

/* Runs the stream of seed on model with layout par. */
static int run_stream(const char *model, struct dps_par_cfg par, uint32_t seed, char *err,
		      size_t len)
{
	res.cancel_first = 0;
	client_new(par);
	stream_make(seed, par.dp);
	return launch(model, par, stream_tick, err, len);
}

/*
 * Requests of the stream that did not end as the oracle says (length, and want[prompt]'s
 * first max_tokens tokens): counted, not asserted, so a test can show a wrong one is caught.
 * The first is described on stderr when verbose.
 */
static int stream_mismatches(int (*want)[STREAM_GEN], int verbose)
{
	int bad = 0;

	for (int k = 0; k < strm.n; k++) {
		const int m = strm.max_tokens[k], *w = want[strm.prompt[k]];
		int at = 0;

		while (at < m && at < res.n[k] && res.tokens[k][at] == w[at])
			at++;
		if (res.why[k] == DPS_FINISH_LENGTH && res.n[k] == m && at == m)
			continue;
		if (!bad++ && verbose)
			fprintf(stderr, "stream request %d (replica %d, prompt %d, %d tokens): %s "
				"after %d tokens, first difference at token %d (%d, oracle %d)\n",
				k, strm.replica[k], strm.prompt[k], m, dps_finish_name(res.why[k]),
				res.n[k], at, at < res.n[k] ? res.tokens[k][at] : -1,
				at < m ? w[at] : -1);
	}
	return bad;
}

static void setup(void)
{
	char err[256];
	struct dps_model_config c = dps_mkmodel_preset("tiny")->cfg;
	struct dps_model_config m = dps_mkmodel_preset("tiny-moe")->cfg;

	test_tmpdir_make(dir, sizeof(dir), "engine");
	c.max_position_embeddings = 2048;
	ck_assert_msg(!dps_mkmodel(&c, 4, DPS_ST_F32, dir, err, sizeof(err)), "%s", err);
	snprintf(moe, sizeof(moe), "%s/moe", dir);
	m.max_position_embeddings = 2048;
	ck_assert_msg(!dps_mkmodel(&m, 5, DPS_ST_F32, moe, err, sizeof(err)), "%s", err);
}

static void teardown(void)
{
	if (res.client)
		dps_engine_client_free(res.client);
	res.client = NULL;
	test_tmpdir_remove(dir);
}

static void expect_oracle(int n)
{
	for (int k = 0; k < n; k++) {
		int want[GEN];

		oracle(dir, k, want, GEN);
		ck_assert_int_eq(res.why[k], DPS_FINISH_LENGTH);
		ck_assert_int_eq(res.n[k], GEN);
		ck_assert_msg(!memcmp(res.tokens[k], want, sizeof(want)), "request %d differs", k);
	}
}

START_TEST(test_balance)
{
	struct dps_par_cfg par = { 1, 4, 1, 1, 1, 1, 1 };
	int named[MAXREQ];
	char err[512];
	const uint64_t *sent;

	res.cancel_first = 0;
	ck_assert_msg(run(par, 100, NULL, -1, err, sizeof(err)) == 0, "%s", err);
	sent = dps_engine_sent(res.client);
	for (int d = 0; d < 4; d++)
		ck_assert_msg(sent[d] == 25, "replica %d got %llu of 100", d,
			      (unsigned long long)sent[d]);
	ck_assert_int_eq(res.done, 100);
	/* Uncoupled: no cross-replica collective, no padding, no dummy batch. */
	ck_assert_int_eq(res.n_stats, 4);
	for (int d = 0; d < 4; d++) {
		ck_assert_uint_eq(res.st[d].dp_allreduces, 0);
		ck_assert_uint_eq(res.st[d].collectives, 0); /* TP=1: none at all */
		ck_assert_uint_eq(res.st[d].dummy_steps, 0);
		/* (the scheduler's bucket padding only: no lockstep padding) */
		ck_assert_uint_eq(res.st[d].free_blocks, res.st[d].num_blocks);
	}
	expect_oracle(8);
	dps_engine_client_free(res.client);
	res.client = NULL;
	/* A named replica is honoured. */
	for (int k = 0; k < 12; k++)
		named[k] = k < 10 ? 2 : -1;
	ck_assert_msg(run(par, 12, named, -1, err, sizeof(err)) == 0, "%s", err);
	sent = dps_engine_sent(res.client);
	ck_assert_uint_ge(sent[2], 10);
	ck_assert_int_eq(res.done, 12);
}
END_TEST

START_TEST(test_coupled_unequal)
{
	/* MLP size 2 couples the replicas: 9 requests on replica 0, 1 on replica 1, none on 2
	 * and 3 (every step of 2 and 3 is a dummy batch). */
	struct dps_par_cfg par = { 1, 4, 1, 1, 2, 1, 1 };
	int named[10] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 1 };
	char err[512];

	res.cancel_first = 0;
	ck_assert_msg(run(par, 10, named, -1, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(res.done, 10);
	expect_oracle(10);
	ck_assert_uint_gt(res.st[2].dummy_steps, 0);
	ck_assert_uint_gt(res.st[0].dp_allreduces, 0);
	for (int d = 0; d < 4; d++)
		ck_assert_uint_eq(res.st[d].free_blocks, res.st[d].num_blocks);
}
END_TEST

START_TEST(test_cancel_and_deadline)
{
	struct dps_par_cfg par = { 2, 1, 1, 1, 1, 1, 1 };
	char err[512];

	res.cancel_first = 1;
	ck_assert_msg(run(par, 4, NULL, 2, err, sizeof(err)) == 0, "%s", err);
	res.cancel_first = 0;
	ck_assert_int_eq(res.done, 4);
	ck_assert_int_eq(res.why[3], DPS_FINISH_CANCELLED);
	ck_assert_int_eq(res.n[3], 0);
	ck_assert_int_eq(res.why[0], DPS_FINISH_CANCELLED);
	ck_assert_int_ge(res.n[0], 1);
	ck_assert_int_eq(res.why[1], DPS_FINISH_LENGTH);
	ck_assert_int_eq(res.why[2], DPS_FINISH_TIMEOUT);
	ck_assert_uint_eq(res.st[0].free_blocks, res.st[0].num_blocks);
}
END_TEST

/*
 * The stream layouts on the MoE model (8 experts divide by TP x DP = 4): expert parallelism on
 * each dispatch, which couples the replicas; then none, every size 1, which leaves them apart.
 */
static const struct dps_par_cfg stream_pars[] = {
	{ 1, 4, 1, 1, 1, 1, 1, 1, DPS_A2A_AG_RS },
	{ 2, 2, 1, 1, 1, 1, 1, 1, DPS_A2A_V },
	{ 1, 4, 1, 1, 1, 1, 1, 0, 0 },
};

START_TEST(test_stream)
{
	const struct dps_par_cfg par = stream_pars[_i];
	static int want[NPROMPT][STREAM_GEN];
	const int eos = dps_mkmodel_preset("tiny-moe")->cfg.eos_token_id;
	const uint64_t *sent;
	uint64_t t0, slowest = 0;
	int least = 0, drains = 0, p, g;
	char err[512];

	for (p = 0; p < NPROMPT; p++) {
		oracle(moe, p, want[p], STREAM_GEN);
		/* An end of sequence would stop a request early: the prompts avoid it. */
		for (g = 0; g < STREAM_GEN; g++)
			ck_assert_msg(want[p][g] != eos, "prompt %d ends at token %d", p, g);
	}
	t0 = dps_now_ns();
	/* (seed 2: 32 requests on replica 0, 6 on 1, 2 on 2; 9 of them only after a drain) */
	ck_assert_msg(run_stream(moe, par, 2, err, sizeof(err)) == 0, "%s", err);
	sent = dps_engine_sent(res.client);
	for (int k = 0; k < strm.n; k++)
		if (strm.first_ns[k] && strm.first_ns[k] - strm.out_ns[k] > slowest)
			slowest = strm.first_ns[k] - strm.out_ns[k];
	/* The log's report: the dummy batches, and what they came from. */
	fprintf(stderr, "stream TP=%d DP=%d ep=%d%s%s: %.2f s, %d of %d requests released on an "
			"idle engine, first token at most %.1f ms after release\n", par.tp, par.dp,
		par.ep, par.ep ? "/" : "", par.ep ? dps_a2a_name(par.a2a) : "",
		(double)(dps_now_ns() - t0) / 1e9, strm.from_idle, strm.n, (double)slowest / 1e6);
	fprintf(stderr, "  per replica: dummy batches");
	for (int d = 0; d < par.dp; d++)
		fprintf(stderr, " %llu", (unsigned long long)res.st[d].dummy_steps);
	fprintf(stderr, "; requests");
	for (int d = 0; d < par.dp; d++)
		fprintf(stderr, " %llu", (unsigned long long)sent[d]);
	fprintf(stderr, "; steps");
	for (int d = 0; d < par.dp; d++)
		fprintf(stderr, " %llu", (unsigned long long)res.st[d].steps);
	fprintf(stderr, "; DP agreements");
	for (int d = 0; d < par.dp; d++)
		fprintf(stderr, " %llu", (unsigned long long)res.st[d].dp_allreduces);
	fprintf(stderr, "\n");
	/* Every request went out, and those gated on a drain found the engine idle. */
	ck_assert_int_eq(strm.next, strm.n);
	for (int k = 0; k < strm.n; k++)
		drains += strm.gate[k] == k && k;
	ck_assert_int_ge(drains, 5);
	ck_assert_int_ge(strm.from_idle, drains);
	ck_assert_int_eq(res.done, strm.n);
	ck_assert_int_eq(stream_mismatches(want, 1), 0);
	ck_assert_int_eq(res.n_stats, par.dp);
	for (int d = 0; d < par.dp; d++) {
		ck_assert_uint_eq(res.st[d].free_blocks, res.st[d].num_blocks);
		if (sent[d] < sent[least])
			least = d;
	}
	ck_assert_uint_gt(sent[0], sent[least]);
	if (par.dp == 4)
		ck_assert_uint_eq(sent[3], 0);
	if (par.ep) {
		/* Coupled: one agreement before every step, on every replica alike; the least
		 * loaded replica (on DP 4 never given a request) pads with dummy batches. */
		ck_assert_uint_gt(res.st[least].dummy_steps, 0);
		for (int d = 0; d < par.dp; d++) {
			ck_assert_uint_gt(res.st[d].dp_allreduces, 0);
			ck_assert_uint_eq(res.st[d].dp_allreduces, res.st[0].dp_allreduces);
			ck_assert_uint_eq(res.st[d].steps, res.st[0].steps);
		}
	} else {
		for (int d = 0; d < par.dp; d++) {
			ck_assert_uint_eq(res.st[d].dummy_steps, 0);
			ck_assert_uint_eq(res.st[d].dp_allreduces, 0);
			ck_assert_uint_eq(res.st[d].collectives, 0); /* TP=1: none at all */
		}
	}
	/* The comparison can fail: one wrong oracle token is caught, in every request that
	 * reaches it (the requests of that prompt asking for as many tokens or more). */
	{
		const int k = strm.n - 1, at = strm.max_tokens[k] - 1;
		int expect = 0;

		for (int j = 0; j < strm.n; j++)
			expect += strm.prompt[j] == strm.prompt[k] && strm.max_tokens[j] > at;
		want[strm.prompt[k]][at] ^= 1;
		ck_assert_int_eq(stream_mismatches(want, 0), expect);
		want[strm.prompt[k]][at] ^= 1;
		res.why[k] = DPS_FINISH_STOP; /* and a wrong finish reason alone */
		ck_assert_int_eq(stream_mismatches(want, 0), 1);
	}
}
END_TEST

/* ---- sampling fields ------------------------------------------------------------------------ */

#define RGEN 20 /* tokens of each request with sampling fields */

/*
 * The oracle of a request with vLLM's logits processors: the one-process model's logits, then
 * this file's own rules (dense counts of the prompt and the output), then greedy (ties to
 * the lowest id) or dps_sample with the request's seed. Returns the tokens made (a stop id
 * ends it, not emitted); *why its finish reason.
 */
static int oracle_rules(const char *model, const int *prompt, int n, const struct dps_req_params *p,
			int *out, enum dps_finish *why)
{
	struct dps_model m;
	int pos[16], seq[16] = { 0 }, g;
	static int pc[4096], oc[4096], scratch[4096];
	static float row[4096];
	struct dps_rng rng;
	char err[256];
	const float *lg;

	ck_assert_msg(!dps_model_load(&m, model, &(struct dps_model_opts){ .max_pos = 64,
									   .max_rows = 16 },
				      err, sizeof(err)), "%s", err);
	ck_assert_int_le(m.cfg.vocab_size, 4096);
	memset(pc, 0, sizeof(pc));
	memset(oc, 0, sizeof(oc));
	dps_rng_seed(&rng, p->sampling.seed);
	for (int i = 0; i < n; i++) {
		pos[i] = i;
		pc[prompt[i]]++;
	}
	lg = dps_model_step(&m, n, prompt, pos, seq, NULL) + (size_t)(n - 1) * m.cfg.vocab_size;
	*why = DPS_FINISH_LENGTH;
	for (g = 0; g < p->max_tokens; g++) {
		const int V = m.cfg.vocab_size;
		const float rep = p->pen.repetition;
		int tok = 0, stop = 0;

		memcpy(row, lg, sizeof(float) * (size_t)V);
		if (g < p->min_tokens)
			for (int k = 0; k < p->n_stop; k++)
				row[p->stop[k]] = -INFINITY;
		for (int k = 0; k < p->n_bias; k++)
			row[p->bias[k].id] += p->bias[k].bias;
		for (int v = 0; v < V; v++) {
			if (rep != 0.0f && rep != 1.0f && (pc[v] || oc[v]))
				row[v] = row[v] > 0 ? row[v] / rep : row[v] * rep;
			row[v] -= p->pen.frequency * (float)oc[v];
			row[v] -= p->pen.presence * (float)(oc[v] > 0);
		}
		if (p->sampling.temperature > 0)
			tok = dps_sample(row, V, &p->sampling, &rng, scratch);
		else
			for (int v = 1; v < V; v++)
				tok = row[v] > row[tok] ? v : tok;
		for (int k = 0; k < p->n_stop; k++)
			stop |= tok == p->stop[k];
		if (stop) {
			*why = DPS_FINISH_STOP;
			break;
		}
		out[g] = tok;
		oc[tok]++;
		lg = dps_model_forward(&m, tok, n + g);
	}
	dps_model_free(&m);
	return g;
}

START_TEST(test_sampling_fields)
{
	enum { NR = 7 };
	struct dps_par_cfg par = { 2, 2, 1, 1, 1, 1, 1 };
	struct dps_req_params p[NR];
	int want[NR][RGEN], n_want[NR], plain[RGEN], prompt[16], np, j;
	enum dps_finish why[NR];
	char err[512];

	np = prompt_of(5, prompt);
	test_greedy_oracle(dir, prompt, np, plain, RGEN);
	for (int k = 0; k < NR; k++)
		p[k] = (struct dps_req_params){ .max_tokens = RGEN };
	p[0].pen.repetition = 4.0f;
	p[1].pen.presence = 1.5f;
	p[1].pen.frequency = 0.5f;
	p[2].pen.frequency = 2.0f;
	p[3].bias[0] = (struct dps_logit_bias){ plain[0], -100.0f }; /* the first token banned */
	p[3].bias[1] = (struct dps_logit_bias){ 7, 3.0f };
	p[3].n_bias = 2;
	/* The plain request's first token as a stop id: without min_tokens it would end at
	 * once (the oracle agrees below). */
	j = 0;
	p[4].stop[0] = plain[j];
	p[4].n_stop = 1;
	p[4].min_tokens = 10;
	p[5].sampling = (struct dps_sampling){ .temperature = 0.9f, .top_p = 1.0f, .seed = 11,
					       .min_p = 0.1f };
	p[5].pen.repetition = 1.3f;
	/* p[6]: none of the fields, the plain greedy tokens */
	for (int k = 0; k < NR; k++)
		n_want[k] = oracle_rules(dir, prompt, np, &p[k], want[k], &why[k]);
	ck_assert_int_eq(n_want[6], RGEN);
	ck_assert(!memcmp(want[6], plain, sizeof(plain))); /* the oracle's rules off: greedy */
	{
		struct dps_req_params s = { .max_tokens = RGEN, .stop = { plain[j] }, .n_stop = 1 };
		int t[RGEN];
		enum dps_finish w;

		ck_assert_int_eq(oracle_rules(dir, prompt, np, &s, t, &w), j); /* no min_tokens */
	}
	client_new(par);
	for (int k = 0; k < NR; k++) {
		struct dps_engine_req q = { prompt, np, p[k], -1, (void *)(intptr_t)k };

		ck_assert_int_eq(dps_engine_submit(res.client, &q), k);
	}
	dps_engine_close_when_idle(res.client);
	ck_assert_msg(launch(dir, par, dps_engine_tick, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(res.done, NR);
	for (int k = 0; k < NR; k++) {
		ck_assert_msg(res.why[k] == why[k] && res.n[k] == n_want[k] &&
			      !memcmp(res.tokens[k], want[k], sizeof(int) * (size_t)n_want[k]),
			      "request %d: %s after %d tokens, the oracle %s after %d", k,
			      dps_finish_name(res.why[k]), res.n[k], dps_finish_name(why[k]),
			      n_want[k]);
		/* Each field changed the tokens: the plain oracle would fail this request. */
		if (k < 6)
			ck_assert_msg(n_want[k] != RGEN || memcmp(want[k], plain, sizeof(plain)),
				      "request %d: the field changed nothing", k);
	}
	ck_assert_int_ge(res.n[4], 10); /* min_tokens held the stop id back */
	/* And one wrong oracle token is caught. */
	want[0][RGEN / 2] ^= 1;
	ck_assert(memcmp(res.tokens[0], want[0], sizeof(int) * (size_t)n_want[0]));
	for (int d = 0; d < par.dp; d++)
		ck_assert_uint_eq(res.st[d].free_blocks, res.st[d].num_blocks);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("engine");
	TCase *tc = tcase_create("engine");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_balance);
	tcase_add_test(tc, test_coupled_unequal);
	tcase_add_test(tc, test_cancel_and_deadline);
	tcase_add_loop_test(tc, test_stream, 0, sizeof(stream_pars) / sizeof(stream_pars[0]));
	tcase_add_test(tc, test_sampling_fields);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

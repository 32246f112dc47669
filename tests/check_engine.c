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
 */
#include <check.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/dps.h"
#include "tests/testutil.h"
#include "engine/engine.h"
#include "engine/mkmodel.h"
#include "engine/model.h"
#include "engine/supervisor.h"

#define MAXREQ 128
#define GEN 12

static char dir[64];

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

static void on_stats(void *arg, int replica, const struct dps_engine_stats *st)
{
	struct result *r = arg;

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

/* The one-process greedy tokens of request k. */
static void oracle(int k, int *out, int n_out)
{
	struct dps_model m;
	int prompt[16], pos[16], seq[16] = { 0 }, n = prompt_of(k, prompt), tok;
	char err[256];
	const float *lg;

	ck_assert_msg(!dps_model_load(&m, dir, &(struct dps_model_opts){ .max_pos = 64,
									 .max_rows = 16 },
				      err, sizeof(err)), "%s", err);
	for (int i = 0; i < n; i++)
		pos[i] = i;
	lg = dps_model_step(&m, n, prompt, pos, seq, NULL) + (size_t)(n - 1) * m.cfg.vocab_size;
	for (int g = 0; g < n_out; g++) {
		tok = 0;
		for (int v = 1; v < m.cfg.vocab_size; v++)
			if (lg[v] > lg[tok])
				tok = v;
		out[g] = tok;
		lg = dps_model_forward(&m, tok, n + g);
	}
	dps_model_free(&m);
}

/*
 * Runs n requests (request k on replica named[k], -1 for any) on layout par; deadline_k:
 * request index with a 1 ms deadline (-1: none).
 */
static int run(struct dps_par_cfg par, int n, const int *named, int deadline_k, char *err,
	       size_t len)
{
	struct dps_engine_cb cb = { on_token, on_done, on_stats, &res };
	struct dps_engine_opts eo = { .model = dir, .max_num_seqs = 8, .max_model_len = 2048,
				      .max_batched_tokens = 32, .kv_cache_memory = 4u << 20 };
	struct dps_sup_opts so = { .par = par, .cpu_bind = "off", .rank_fn = dps_engine_rank_main,
				   .rank_arg = &eo, .msg_fn = dps_engine_on_msg,
				   .tick_fn = dps_engine_tick };
	struct dps_sup_result sr;
	int cancel_first = res.cancel_first, rc;

	memset(&res, 0, sizeof(res));
	res.cancel_first = cancel_first;
	ck_assert_int_eq(dps_engine_client_new(&res.client, par.dp, par.tp, &cb), 0);
	so.msg_arg = res.client;
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
	rc = dps_sup_run(&so, &sr, err, len);
	return rc;
}

static void setup(void)
{
	char err[256];
	struct dps_model_config c = dps_mkmodel_preset("tiny")->cfg;

	test_tmpdir_make(dir, sizeof(dir), "engine");
	c.max_position_embeddings = 2048;
	ck_assert_msg(!dps_mkmodel(&c, 4, DPS_ST_F32, dir, err, sizeof(err)), "%s", err);
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

		oracle(k, want, GEN);
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

int main(void)
{
	Suite *s = suite_create("engine");
	TCase *tc = tcase_create("engine");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_balance);
	tcase_add_test(tc, test_coupled_unequal);
	tcase_add_test(tc, test_cancel_and_deadline);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

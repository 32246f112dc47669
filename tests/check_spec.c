/* SPDX-License-Identifier: MIT */
/*
 * tests/check_spec.c - Eagle3 speculative decoding end to end: real rank processes under the
 * supervisor, a target and an Eagle3 draft (made by dps_mkmodel_draft), requests from the
 * client.
 *
 * Oracle: each request's greedy tokens from the one-process target (dps_model), prompt fed
 * whole, then one token at a time: speculation must not change a single token. Checked, on a
 * dense target (3 layers, 6 heads over 2 KV heads, untied head) and a mixture-of-experts one
 * (tiny-moe: 8 experts, top 2), for every K from 1 to 5, over sharded layouts with every
 * draft-MLP size their DP allows (with expert parallelism on both dispatches for the MoE
 * target): every request ends with exactly the oracle's tokens; with the self-distilled draft
 * some drafts are accepted and the target runs fewer passes than tokens, with the random one
 * (a 200-token draft vocabulary mapped by d2t) the output is as exact. Also: requests that run
 * into --max-model-len (no verification may pass it); a KV cache small enough to preempt;
 * sampling with a seed is reproducible; and the comparison is shown to catch one wrong token.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "tests/greedy.h"
#include "tests/testutil.h"
#include "engine/serve/engine.h"
#include "engine/model/mkmodel.h"
#include "engine/model/model.h"
#include "engine/runtime/supervisor.h"

#define NREQ 8
#define GEN 24

static char dir[64], dense[96], moe[96], dense_self[96], dense_rand[96], moe_self[96],
	moe_rand[96];

struct result {
	int tokens[NREQ][GEN + 8], n[NREQ];
	enum dps_finish why[NREQ];
	struct dps_engine_stats st[8];
	struct dps_engine_client *client;
};

static struct result res;

static void on_token(void *arg, void *user, int token)
{
	struct result *r = arg;
	const int k = (int)(intptr_t)user;

	if (r->n[k] < GEN + 8)
		r->tokens[k][r->n[k]++] = token;
}

static void on_done(void *arg, void *user, enum dps_finish why, int n_gen)
{
	struct result *r = arg;

	(void)n_gen;
	r->why[(intptr_t)user] = why;
}

static void on_stats(void *arg, int replica, const struct dps_engine_stats *st, int final)
{
	struct result *r = arg;

	if (final && replica >= 0 && replica < 8)
		r->st[replica] = *st;
}

/* Prompt k: BOS and 1 to 13 more ids. */
static int prompt_of(int k, int *p)
{
	const int n = 2 + (k * 5) % 13;

	p[0] = 1;
	for (int i = 1; i < n; i++)
		p[i] = (k * 37 + i * 53) % 300;
	return n;
}

/* The one-process greedy tokens of prompt k on the target in model. */
static void oracle(const char *model, int k, int *out, int n_out)
{
	int prompt[16];

	test_greedy_oracle(model, prompt, prompt_of(k, prompt), out, n_out);
}

struct run_opts {
	const char *model, *draft; /* draft NULL: no speculation */
	int k, max_model_len;
	size_t kv;
	float temperature;
};

/* Runs NREQ requests of GEN tokens (greedy unless temperature) on layout par. */
static void run(struct dps_par_cfg par, const struct run_opts *o)
{
	struct dps_engine_cb cb = { on_token, on_done, on_stats, &res };
	struct dps_engine_opts eo = { .model = o->model, .max_num_seqs = 8,
				      .max_model_len = o->max_model_len ? o->max_model_len : 256,
				      .max_batched_tokens = 32,
				      .kv_cache_memory = o->kv ? o->kv : 4u << 20,
				      .spec_model = o->draft, .spec_k = o->draft ? o->k : 0 };
	struct dps_sup_opts so = { .par = par, .cpu_bind = "off", .rank_fn = dps_engine_rank_main,
				   .rank_arg = &eo, .msg_fn = dps_engine_on_msg,
				   .tick_fn = dps_engine_tick };
	struct dps_sup_result sr;
	char err[512];

	memset(&res, 0, sizeof(res));
	ck_assert_int_eq(dps_engine_client_new(&res.client, par.dp, par.tp, &cb), 0);
	so.msg_arg = res.client;
	if (par.prefill_dp) { /* disaggregated */
		so.roles = 1;
		so.kv_share_bytes = dps_engine_kv_share_bytes(&eo, &par);
		ck_assert_int_eq(dps_engine_client_set_prefill(res.client, par.prefill_dp,
							       dps_par_cfg_prefill_tp(&par)), 0);
	}
	for (int k = 0; k < NREQ; k++) {
		int prompt[16];
		struct dps_engine_req q = { prompt, prompt_of(k, prompt),
					    { .max_tokens = GEN,
					      .sampling = { o->temperature, 0, 1.0f, 7 + (uint64_t)k } },
					    -1, (void *)(intptr_t)k };

		ck_assert_int_eq(dps_engine_submit(res.client, &q), k);
	}
	dps_engine_close_when_idle(res.client);
	ck_assert_msg(!dps_sup_run(&so, &sr, err, sizeof(err)), "%s", err);
	dps_engine_client_free(res.client);
	res.client = NULL;
}

/* Requests whose tokens differ from want (each limited to its own length). */
static int mismatches(int (*want)[GEN], int verbose)
{
	int bad = 0;

	for (int k = 0; k < NREQ; k++) {
		int at = 0;

		while (at < res.n[k] && at < GEN && res.tokens[k][at] == want[k][at])
			at++;
		if (at == GEN && res.n[k] == GEN)
			continue;
		if (at == res.n[k] && res.why[k] == DPS_FINISH_LENGTH && res.n[k] < GEN)
			continue; /* cut by --max-model-len: a prefix of the oracle */
		bad++;
		if (verbose)
			fprintf(stderr, "request %d: %d tokens (%s), first difference at %d: %d, "
				"oracle %d\n", k, res.n[k], dps_finish_name(res.why[k]), at,
				at < res.n[k] ? res.tokens[k][at] : -1, at < GEN ? want[k][at] : -1);
	}
	return bad;
}

/* Sums of the replicas' counts. */
static struct dps_engine_stats total(int dp)
{
	struct dps_engine_stats t = { 0 };

	for (int d = 0; d < dp; d++) {
		t.steps += res.st[d].steps;
		t.decode_steps += res.st[d].decode_steps;
		t.spec_drafts += res.st[d].spec_drafts;
		t.spec_draft_tokens += res.st[d].spec_draft_tokens;
		t.spec_accepted += res.st[d].spec_accepted;
		t.free_blocks += res.st[d].free_blocks;
		t.num_blocks += res.st[d].num_blocks;
	}
	return t;
}

static void setup(void)
{
	char err[256];
	struct dps_model_config c = dps_mkmodel_preset("tiny-gqa")->cfg;
	struct dps_model_config m = dps_mkmodel_preset("tiny-moe")->cfg;

	test_tmpdir_make(dir, sizeof(dir), "spec");
	snprintf(dense, sizeof(dense), "%s/dense", dir);
	snprintf(moe, sizeof(moe), "%s/moe", dir);
	snprintf(dense_self, sizeof(dense_self), "%s/dense-self", dir);
	snprintf(dense_rand, sizeof(dense_rand), "%s/dense-rand", dir);
	snprintf(moe_self, sizeof(moe_self), "%s/moe-self", dir);
	snprintf(moe_rand, sizeof(moe_rand), "%s/moe-rand", dir);
	ck_assert_msg(!dps_mkmodel(&c, 11, DPS_ST_F32, dense, err, sizeof(err)), "%s", err);
	m.vocab_size = 300;
	m.tie_word_embeddings = 0;
	ck_assert_msg(!dps_mkmodel(&m, 12, DPS_ST_F32, moe, err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_mkmodel_draft(dense, DPS_DRAFT_SELF, 0, 1, DPS_ST_F32, dense_self, err,
					 sizeof(err)), "%s", err);
	ck_assert_msg(!dps_mkmodel_draft(dense, DPS_DRAFT_RANDOM, 200, 2, DPS_ST_F32, dense_rand,
					 err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_mkmodel_draft(moe, DPS_DRAFT_SELF, 0, 3, DPS_ST_F32, moe_self, err,
					 sizeof(err)), "%s", err);
	ck_assert_msg(!dps_mkmodel_draft(moe, DPS_DRAFT_RANDOM, 200, 4, DPS_ST_BF16, moe_rand, err,
					 sizeof(err)), "%s", err);
}

static void teardown(void)
{
	if (res.client)
		dps_engine_client_free(res.client);
	res.client = NULL;
	test_tmpdir_remove(dir);
}

static void oracle_all(const char *model, int (*want)[GEN])
{
	for (int k = 0; k < NREQ; k++)
		oracle(model, k, want[k], GEN);
}

/* ---- greedy output is the target's, for every K, layout and draft-MLP size -------------- */

struct spec_case {
	int moe, k;
	struct dps_par_cfg par; /* tp, dp, attn, emb, mlp, draft mlp, lm head, ep, a2a, and
				 * prefill replicas of TP */
};

static const struct spec_case cases[] = {
	{ 0, 1, { 1, 1, 1, 1, 1, 1, 1, 0, 0 } },
	{ 0, 2, { 2, 1, 1, 1, 1, 1, 1, 0, 0 } },
	{ 0, 3, { 1, 2, 1, 1, 1, 1, 1, 0, 0 } },
	{ 0, 4, { 1, 2, 1, 1, 1, 2, 1, 0, 0 } },
	{ 0, 5, { 2, 2, 2, 1, 2, 2, 1, 0, 0 } },
	{ 0, 2, { 3, 1, 1, 1, 1, 1, 1, 0, 0 } },
	{ 0, 1, { 1, 4, 1, 1, 1, 4, 1, 0, 0 } },
	{ 0, 3, { 1, 4, 2, 2, 2, 2, 4, 0, 0 } },
	{ 1, 1, { 1, 2, 1, 1, 1, 2, 1, 1, 0 } },
	{ 1, 2, { 1, 1, 1, 1, 1, 1, 1, 0, 0 } },
	{ 1, 3, { 2, 2, 1, 1, 2, 2, 1, 1, DPS_A2A_V } },
	{ 1, 4, { 1, 2, 1, 1, 1, 1, 1, 1, DPS_A2A_AG_RS } },
	{ 1, 5, { 1, 4, 1, 1, 1, 4, 1, 1, 0 } },
	{ 1, 4, { 2, 1, 1, 1, 1, 1, 1, 0, 0 } },
	/* disaggregated: the draft's KV travels with the target's (prefill P, T last) */
	{ 0, 3, { 1, 2, 2, 2, 1, 2, 2, 0, 0, 1, 2 } },
	{ 0, 2, { 2, 2, 1, 1, 2, 1, 1, 0, 0, 2, 1 } },
	{ 1, 2, { 1, 2, 1, 1, 1, 1, 1, 1, DPS_A2A_V, 1, 1 } },
};

START_TEST(test_greedy_identical)
{
	const struct spec_case *c = &cases[_i];
	const char *target = c->moe ? moe : dense;
	int want[NREQ][GEN];
	struct dps_engine_stats t;

	oracle_all(target, want);
	/* The self-distilled draft: the oracle's tokens, and some drafts accepted. */
	run(c->par, &(struct run_opts){ target, c->moe ? moe_self : dense_self, c->k, 0, 0, 0 });
	ck_assert_int_eq(mismatches(want, 1), 0);
	t = total(c->par.dp + c->par.prefill_dp); /* prefill replicas: every block back too */
	fprintf(stderr, "%s TP %d x DP %d (attention %d, mlp %d, draft mlp %d%s%s) K=%d: %llu of "
		"%llu drafted tokens accepted, %llu target steps for %d tokens\n",
		c->moe ? "MoE" : "dense", c->par.tp, c->par.dp, c->par.attn_dp, c->par.mlp_dp,
		c->par.draft_mlp_dp, c->par.ep ? ", EP " : "",
		c->par.ep ? dps_a2a_name(c->par.a2a) : "", c->k,
		(unsigned long long)t.spec_accepted, (unsigned long long)t.spec_draft_tokens,
		(unsigned long long)t.steps, NREQ * GEN);
	ck_assert_uint_gt(t.spec_drafts, 0);
	ck_assert_uint_eq(t.spec_draft_tokens, t.spec_drafts * (uint64_t)c->k);
	ck_assert_uint_gt(t.spec_accepted, 0);
	ck_assert_uint_eq(t.free_blocks, t.num_blocks);
	/* The random draft (d2t over 200 of the 300 ids): the same tokens. */
	run(c->par, &(struct run_opts){ target, c->moe ? moe_rand : dense_rand, c->k, 0, 0, 0 });
	ck_assert_int_eq(mismatches(want, 1), 0);
	t = total(c->par.dp);
	ck_assert_uint_gt(t.spec_drafts, 0);
	ck_assert_uint_eq(t.free_blocks, t.num_blocks);
}
END_TEST

/* The target runs fewer passes, by what was accepted; the comparison catches a wrong token. */
START_TEST(test_fewer_target_passes)
{
	const struct dps_par_cfg par = DPS_PAR_CFG_DEFAULT;
	int want[NREQ][GEN];
	struct dps_engine_stats plain, spec;

	oracle_all(dense, want);
	run(par, &(struct run_opts){ dense, NULL, 0, 0, 0, 0 });
	ck_assert_int_eq(mismatches(want, 1), 0);
	plain = total(1);
	run(par, &(struct run_opts){ dense, dense_self, 3, 0, 0, 0 });
	ck_assert_int_eq(mismatches(want, 1), 0);
	spec = total(1);
	fprintf(stderr, "K=3: %llu target decode steps without speculation, %llu with (%llu of "
		"%llu drafts accepted)\n", (unsigned long long)plain.decode_steps,
		(unsigned long long)spec.decode_steps, (unsigned long long)spec.spec_accepted,
		(unsigned long long)spec.spec_draft_tokens);
	ck_assert_uint_eq(plain.spec_drafts, 0);
	ck_assert_uint_gt(spec.spec_accepted, 0);
	ck_assert_uint_lt(spec.decode_steps, plain.decode_steps);
	/*
	 * Each verification emits 1 + its accepted drafts, so the accepted ones are the passes
	 * saved (all requests decode together here; the last steps of a request may cut some).
	 */
	ck_assert_uint_ge(spec.decode_steps + spec.spec_accepted, plain.decode_steps);
	/* The check itself: one wrong oracle token is one mismatch. */
	want[3][GEN / 2] ^= 1;
	ck_assert_int_eq(mismatches(want, 0), 1);
}
END_TEST

/* Requests that run into --max-model-len: no verification passes it, the output is exact. */
START_TEST(test_max_model_len)
{
	int want[NREQ][GEN];

	oracle_all(dense, want);
	for (int k = 1; k <= 5; k += 4) {
		run((struct dps_par_cfg){ 1, 2, 1, 1, 1, 2, 1, 0, 0 },
		    &(struct run_opts){ dense, dense_self, k, 20, 0, 0 });
		ck_assert_int_eq(mismatches(want, 1), 0);
		for (int r = 0; r < NREQ; r++) {
			int p[16];

			/* 20 positions in all: the prompt and the rest of them generated. */
			ck_assert_int_eq(res.n[r], 20 - prompt_of(r, p) < GEN ? 20 - prompt_of(r, p)
									       : GEN);
		}
	}
}
END_TEST

/* A KV cache of a few blocks: requests are preempted and recomputed, drafts and all. */
START_TEST(test_preemption)
{
	int want[NREQ][GEN];
	struct dps_engine_stats t;
	uint64_t pre = 0;

	oracle_all(dense, want);
	/*
	 * A target block is 3 layers x 2 KV heads x 8 x 2 x 4 bytes x 32 positions = 12 KiB, and
	 * the draft's 6 KV heads take as much again: 120 KiB give 5 blocks, where the 8 requests
	 * would need 16.
	 */
	run((struct dps_par_cfg)DPS_PAR_CFG_DEFAULT,
	    &(struct run_opts){ dense, dense_self, 4, 64, 120u * 1024, 0 });
	ck_assert_int_eq(mismatches(want, 1), 0);
	t = total(1);
	pre = res.st[0].preemptions;
	fprintf(stderr, "small KV cache: %llu blocks, %llu preemptions\n",
		(unsigned long long)t.num_blocks, (unsigned long long)pre);
	ck_assert_uint_gt(pre, 0);
	ck_assert_uint_eq(t.free_blocks, t.num_blocks);
}
END_TEST

/* Sampling through the rejection rule: a seeded run gives the same tokens every time. */
START_TEST(test_sampling_reproducible)
{
	int first[NREQ][GEN];
	struct dps_par_cfg par = { 2, 2, 1, 1, 1, 2, 1, 0, 0 };

	run(par, &(struct run_opts){ dense, dense_self, 3, 0, 0, 0.8f });
	for (int k = 0; k < NREQ; k++) {
		ck_assert_int_eq(res.n[k], GEN);
		memcpy(first[k], res.tokens[k], sizeof(first[k]));
	}
	ck_assert_uint_gt(total(2).spec_drafts, 0);
	run(par, &(struct run_opts){ dense, dense_self, 3, 0, 0, 0.8f });
	ck_assert_int_eq(mismatches(first, 1), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("spec");
	TCase *tc = tcase_create("spec");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_greedy_identical, 0, sizeof(cases) / sizeof(cases[0]));
	tcase_add_test(tc, test_fewer_target_passes);
	tcase_add_test(tc, test_max_model_len);
	tcase_add_test(tc, test_preemption);
	tcase_add_test(tc, test_sampling_reproducible);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

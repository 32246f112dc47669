/* SPDX-License-Identifier: MIT */
/*
 * tests/check_sched.c - the per-replica scheduler: the bucket table, block accounting through
 * cancellation, deadlines and preemption, chunked prefill never stalling decode, and batch
 * invariance: requests served together (mixed prefill and decode rows, chunked prompts,
 * preemptions with recompute, requests arriving and leaving) give the same greedy tokens as
 * each served alone, through the real paged model (one in-process rank of the sharded engine).
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "tests/testutil.h"
#include "engine/model/mkmodel.h"
#include "engine/serve/sched.h"
#include "engine/shard/shard.h"

static struct dps_sched_cfg small_cfg(int blocks, int seqs, int tokens)
{
	struct dps_sched_cfg c = { .block_size = 4, .num_blocks = blocks, .max_num_seqs = seqs,
				   .max_model_len = 40, .max_batched_tokens = tokens };
	char err[128];

	ck_assert_int_eq(dps_sched_buckets(&c, NULL, err, sizeof(err)), 0);
	return c;
}

START_TEST(test_buckets)
{
	struct dps_sched_cfg c = { .max_num_seqs = 8 };
	char err[256];

	ck_assert_int_eq(dps_sched_buckets(&c, NULL, err, sizeof(err)), 0);
	ck_assert_int_eq(c.n_buckets, 4); /* 1 2 4 8 */
	ck_assert_int_eq(dps_sched_bucket(&c, 1), 1);
	ck_assert_int_eq(dps_sched_bucket(&c, 3), 4);
	ck_assert_int_eq(dps_sched_bucket(&c, 5), 8);
	ck_assert_int_eq(dps_sched_bucket(&c, 8), 8);
	ck_assert_int_eq(dps_sched_bucket(&c, 9), 8); /* more than the largest: the largest */
	c.max_num_seqs = 6;
	ck_assert_int_eq(dps_sched_buckets(&c, NULL, err, sizeof(err)), 0);
	ck_assert_int_eq(c.buckets[c.n_buckets - 1], 6);
	ck_assert_int_eq(dps_sched_bucket(&c, 5), 6);
	ck_assert_int_eq(dps_sched_buckets(&c, "1,3,6", err, sizeof(err)), 0);
	ck_assert_int_eq(dps_sched_bucket(&c, 2), 3);
	ck_assert_int_eq(dps_sched_buckets(&c, "1,3,5", err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "must equal --max-num-seqs 6"));
	ck_assert_int_eq(dps_sched_buckets(&c, "2,1,6", err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(dps_sched_buckets(&c, "1,x", err, sizeof(err)), -EINVAL);
}
END_TEST

static const struct dps_req_params greedy = { .max_tokens = 30, .n_stop = 0 };

START_TEST(test_padding_and_prefill)
{
	struct dps_sched_cfg c = small_cfg(40, 8, 64);
	struct dps_sched s;
	char err[128];
	int rc, prompt[5] = { 1, 2, 3, 4, 5 };
	float logits[3 * 16] = { 0 };
	int scratch[16];

	ck_assert_int_eq(dps_sched_init(&s, &c, err, sizeof(err)), 0);
	for (int k = 0; k < 3; k++)
		ck_assert_ptr_nonnull(dps_sched_add(&s, (uint64_t)k, prompt, 5, &greedy, &rc));
	/* First step: three prompts, not padded. */
	ck_assert_int_eq(dps_sched_step(&s, 0), 15);
	ck_assert(s.b.prefill);
	ck_assert_int_eq(s.b.n_real, 15);
	dps_sched_update(&s, logits, 16, -1, scratch, NULL, NULL, NULL);
	/* Then decode: three rows padded to the bucket of 4, the padding writing nothing. */
	ck_assert_int_eq(dps_sched_step(&s, 0), 4);
	ck_assert(!s.b.prefill);
	ck_assert_int_eq(s.b.n_real, 3);
	ck_assert_int_eq(s.b.slot[3], DPS_PAD_SLOT);
	ck_assert_ptr_null(s.b.table[3]);
	ck_assert_int_eq(s.b.tokens[3], 0);
	ck_assert_int_eq(s.b.pos[3], 0);
	ck_assert_int_eq(s.b.want[3], 0);
	dps_sched_free(&s);
}
END_TEST

static int n_done;
static void count_done(void *arg, struct dps_req *r)
{
	(void)arg;
	(void)r;
	n_done++;
}

START_TEST(test_cancel_and_deadline_free_blocks)
{
	struct dps_sched_cfg c = small_cfg(20, 4, 64);
	struct dps_sched s;
	struct dps_req_params timed = greedy;
	struct dps_req *a, *b;
	char err[128];
	int rc, prompt[9] = { 1, 2, 3, 4, 5, 6, 7, 8, 9 }, scratch[16];
	float logits[4 * 16] = { 0 };

	ck_assert_int_eq(dps_sched_init(&s, &c, err, sizeof(err)), 0);
	timed.deadline_ns = 1000;
	a = dps_sched_add(&s, 1, prompt, 9, &greedy, &rc);
	b = dps_sched_add(&s, 2, prompt, 9, &timed, &rc);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_int_gt(dps_sched_step(&s, 10), 0);
	ck_assert_int_eq(s.kv.n_free, 20 - 6); /* 3 blocks of 4 for each 9-token prompt */
	dps_sched_update(&s, logits, 16, -1, scratch, NULL, count_done, NULL);
	dps_sched_cancel(&s, a);
	ck_assert_int_eq(s.kv.n_free, 20 - 3);
	n_done = 0;
	ck_assert_int_ge(dps_sched_step(&s, 2000), 0); /* b is past its deadline */
	dps_sched_update(&s, logits, 16, -1, scratch, NULL, count_done, NULL);
	ck_assert_int_eq(n_done, 2);
	ck_assert_int_eq(s.kv.n_free, 20);
	ck_assert_int_eq(dps_sched_pending(&s), 0);
	dps_sched_free(&s);
}
END_TEST

START_TEST(test_chunked_prefill_keeps_decoding)
{
	/* A 30-token prompt arrives while one request decodes: with 8 tokens per step, the
	 * decoding request gets its row in every step while the prompt goes in chunks. */
	struct dps_sched_cfg c = small_cfg(40, 4, 8);
	struct dps_sched s;
	char err[128];
	int rc, small[2] = { 1, 7 }, big[30], scratch[16], chunks = 0;
	float logits[8 * 16] = { 0 };
	struct dps_req *a;

	for (int i = 0; i < 30; i++)
		big[i] = i % 16;
	ck_assert_int_eq(dps_sched_init(&s, &c, err, sizeof(err)), 0);
	a = dps_sched_add(&s, 1, small, 2, &greedy, &rc);
	ck_assert_int_eq(dps_sched_step(&s, 0), 2);
	dps_sched_update(&s, logits, 16, -1, scratch, NULL, NULL, NULL);
	ck_assert_ptr_nonnull(dps_sched_add(&s, 2, big, 30, &greedy, &rc));
	for (int step = 0; step < 5; step++) {
		int mine = 0;

		ck_assert_int_gt(dps_sched_step(&s, 0), 0);
		ck_assert_int_le(s.b.n_real, 8);
		for (int i = 0; i < s.b.n; i++)
			mine += s.b.req[i] == a;
		ck_assert_int_eq(mine, 1);
		chunks += s.b.prefill;
		dps_sched_update(&s, logits, 16, -1, scratch, NULL, NULL, NULL);
	}
	ck_assert_int_ge(chunks, 4); /* 30 tokens in chunks of at most 7 */
	dps_sched_free(&s);
}
END_TEST

START_TEST(test_preempt_with_full_queue)
{
	/* 80 requests, 2 running at a time, 12 blocks: preemptions while 78 wait, and every
	 * request still finishes, every block comes back (ASan would see a queue overflow). */
	struct dps_sched_cfg c = small_cfg(12, 2, 8);
	struct dps_req_params p = greedy;
	struct dps_sched s;
	char err[128];
	int rc, prompt[9] = { 1, 2, 3, 4, 5, 6, 7, 8, 9 }, scratch[16], steps = 0;
	float logits[8 * 16];

	ck_assert_int_eq(dps_sched_init(&s, &c, err, sizeof(err)), 0);
	p.max_tokens = 20;
	for (int k = 0; k < 80; k++)
		ck_assert_ptr_nonnull(dps_sched_add(&s, (uint64_t)k, prompt, 9, &p, &rc));
	n_done = 0;
	while (dps_sched_pending(&s)) {
		for (int i = 0; i < 8 * 16; i++)
			logits[i] = (float)((i * 7) % 5);
		dps_sched_step(&s, 0);
		dps_sched_update(&s, logits, 16, -1, scratch, NULL, count_done, NULL);
		ck_assert_int_lt(++steps, 100000);
	}
	ck_assert_int_eq(n_done, 80);
	ck_assert_uint_gt(s.preemptions, 0);
	ck_assert_int_eq(s.kv.n_free, 12);
	dps_sched_free(&s);
}
END_TEST

START_TEST(test_refused_config)
{
	struct dps_sched_cfg c = small_cfg(40, 8, 4);
	struct dps_sched s;
	char err[256];

	/* Fewer tokens per step than running requests: some would never decode. */
	ck_assert_int_eq(dps_sched_init(&s, &c, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "--max-num-batched-tokens 4 is less than --max-num-seqs 8"));
	/* A KV cache that cannot hold one request of max_model_len. */
	c = small_cfg(9, 8, 64);
	ck_assert_int_eq(dps_sched_init(&s, &c, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "must hold one request"));
}
END_TEST

/* ---- batch invariance on the real model ------------------------------------------------- */

#define NREQ 6
static char dir[64];

static void model_setup(void)
{
	char err[256];

	test_tmpdir_make(dir, sizeof(dir), "sched");
	ck_assert_msg(!dps_mkmodel(&dps_mkmodel_preset("tiny-gqa")->cfg, 9, DPS_ST_F32, dir, err,
				   sizeof(err)), "%s", err);
}

static void model_teardown(void)
{
	test_tmpdir_remove(dir);
}

struct served {
	int tokens[NREQ][64], n[NREQ];
	enum dps_finish finish[NREQ];
};

static void emit_tok(void *arg, struct dps_req *r, int token)
{
	struct served *sv = arg;

	sv->tokens[r->id][sv->n[r->id]++] = token;
}

static void on_done(void *arg, struct dps_req *r)
{
	struct served *sv = arg;

	sv->finish[r->id] = r->finish;
}

static int prompt_of(int k, int *p)
{
	const int n = 2 + (k * 7) % 23; /* 2 to 24 tokens */

	p[0] = 1;
	for (int i = 1; i < n; i++)
		p[i] = (k * 31 + i * 17) % 300;
	return n;
}

/*
 * Serves the requests in mask (bit k: request k) through the scheduler and the paged model.
 * Requests arrive staggered (request k at step 2k); blocks and tokens per step are scarce
 * enough to force chunked prefills and preemptions. Returns the preemptions.
 */
static uint64_t serve(unsigned mask, int blocks, int budget, struct served *sv)
{
	struct dps_sched_cfg c = { .block_size = 4, .num_blocks = blocks, .max_num_seqs = 4,
				   .max_model_len = 48, .max_batched_tokens = budget };
	struct dps_shard m;
	struct dps_sched s;
	char err[256];
	int scratch[300], prompt[32], step = 0, added = 0, rc;
	uint64_t pre;

	ck_assert_int_eq(dps_sched_buckets(&c, NULL, err, sizeof(err)), 0);
	ck_assert_int_eq(dps_sched_init(&s, &c, err, sizeof(err)), 0);
	ck_assert_msg(!dps_shard_load(&m, NULL, &(struct dps_par_cfg)DPS_PAR_CFG_DEFAULT, dir,
				      &(struct dps_shard_opts){ .max_pos = 48, .block_size = 4,
								.num_blocks = blocks,
								.max_rows = budget + 4 },
				      err, sizeof(err)), "%s", err);
	memset(sv, 0, sizeof(*sv));
	while (added < NREQ || dps_sched_pending(&s)) {
		for (; added < NREQ && step >= 2 * added; added++)
			if (mask & (1u << added)) {
				struct dps_req_params p = greedy;
				const int n = prompt_of(added, prompt);

				p.max_tokens = 48 - n;
				ck_assert_ptr_nonnull(dps_sched_add(&s, (uint64_t)added, prompt, n, &p, &rc));
			}
		if (dps_sched_step(&s, 0)) {
			struct dps_rows r = { s.b.n, s.b.tokens, s.b.pos, s.b.slot,
					      (const int *const *)s.b.table, s.b.want };
			float *lg = (float *)dps_shard_step_rows(&m, s.b.prefill, &r, &rc);

			ck_assert_ptr_nonnull(lg);
			dps_sched_update(&s, lg, m.cfg.vocab_size, -1, scratch, emit_tok, on_done, sv);
		} else {
			dps_sched_update(&s, NULL, 0, -1, scratch, emit_tok, on_done, sv);
		}
		ck_assert_int_lt(++step, 10000);
	}
	ck_assert_int_eq(s.kv.n_free, blocks); /* every block back */
	pre = s.preemptions;
	dps_sched_free(&s);
	dps_shard_free(&m);
	return pre;
}

START_TEST(test_batch_invariance)
{
	struct served alone, together, tight;
	uint64_t pre;

	/* Each request alone, with room to spare. */
	for (int k = 0; k < NREQ; k++) {
		struct served one;

		serve(1u << k, 64, 64, &one);
		memcpy(alone.tokens[k], one.tokens[k], sizeof(one.tokens[k]));
		alone.n[k] = one.n[k];
		ck_assert_int_eq(one.finish[k], DPS_FINISH_LENGTH);
	}
	/* All together with room: mixed prefill and decode rows, buckets, arrivals. */
	serve((1u << NREQ) - 1, 64, 64, &together);
	/* All together with 20 blocks and 8 tokens per step: chunks and preemptions. */
	pre = serve((1u << NREQ) - 1, 20, 8, &tight);
	ck_assert_uint_gt(pre, 0);
	for (int k = 0; k < NREQ; k++) {
		ck_assert_int_eq(together.n[k], alone.n[k]);
		ck_assert_int_eq(tight.n[k], alone.n[k]);
		ck_assert_msg(!memcmp(together.tokens[k], alone.tokens[k], sizeof(int) * (size_t)alone.n[k]),
			      "request %d differs when batched", k);
		ck_assert_msg(!memcmp(tight.tokens[k], alone.tokens[k], sizeof(int) * (size_t)alone.n[k]),
			      "request %d differs with chunks and %llu preemptions", k,
			      (unsigned long long)pre);
	}
	/* The comparison can fail: a request with another prompt gives other tokens. */
	ck_assert(memcmp(alone.tokens[0], alone.tokens[1], sizeof(int) * 8));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("sched");
	TCase *tc = tcase_create("sched");
	TCase *tm = tcase_create("model");

	tcase_add_test(tc, test_buckets);
	tcase_add_test(tc, test_padding_and_prefill);
	tcase_add_test(tc, test_cancel_and_deadline_free_blocks);
	tcase_add_test(tc, test_chunked_prefill_keeps_decoding);
	tcase_add_test(tc, test_preempt_with_full_queue);
	tcase_add_test(tc, test_refused_config);
	suite_add_tcase(s, tc);
	tcase_add_checked_fixture(tm, model_setup, model_teardown);
	tcase_set_timeout(tm, 120);
	tcase_add_test(tm, test_batch_invariance);
	suite_add_tcase(s, tm);
	return test_run_suite(s);
}

/* SPDX-License-Identifier: MIT */
/*
 * tests/check_kv.c - Check suite for engine/shard/kv.c, the paged KV cache: the slot layout
 * (every slot of every layer its own row, none overlapping), how many blocks a budget buys
 * (floor, the cap, the refusal naming the bytes needed), the budget itself (given, or a share
 * of MemAvailable) and the draft's share, memory that reads as zero until written, and the
 * block pool (block 0 first, every block handed out once, -1 when empty, given back in any
 * order), and the disaggregated hand-off's relay plan (every geometry to 16 heads and 8 ranks a
 * side, against the KV heads each cache holds by the definitions). The oracle is the
 * arithmetic written into each case.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/shard/kv.h"
#include "tests/testutil.h"

/*
 * The oracle of the relay plan, from the definitions: a rank of TP position t among n, its
 * heads padded to a multiple of n * c, holds the KV heads its real query heads read, each
 * once; as KV head h / group only grows with h, that is the ascending list of them (or head
 * 0 alone). Writes it into out and returns the count.
 */
static int cache_heads(int heads, int kvh, int n, int c, int t, int *out)
{
	const int per = (heads + n * c - 1) / (n * c) * c; /* query heads per TP position */
	int cnt = 0;

	for (int h = t * per; h < (t + 1) * per && h < heads; h++)
		if (!cnt || out[cnt - 1] != h / (heads / kvh))
			out[cnt++] = h / (heads / kvh);
	if (!cnt)
		out[cnt++] = 0;
	return cnt;
}

/* 0 when plan (n entries) fills decode position t's cache exactly from the prefill caches. */
static int plan_wrong(int heads, int kvh, int ptp, int tp, int ca, int t,
		      const struct dps_kv_relay *plan, int n)
{
	int want[64], src[64];
	const int m = cache_heads(heads, kvh, tp, ca, t, want);

	if (n != m)
		return 1;
	for (int k = 0; k < n; k++) {
		if (plan[k].head != want[k] || plan[k].src_rank < 0 || plan[k].src_rank >= ptp)
			return 1;
		if (plan[k].src_head >= cache_heads(heads, kvh, ptp, 1, plan[k].src_rank, src) ||
		    plan[k].src_head < 0 || src[plan[k].src_head] != want[k])
			return 1;
	}
	return 0;
}

START_TEST(test_relay_plan)
{
	struct dps_kv_relay plan[64];
	int cases = 0;

	/* every geometry up to 16 heads and 8 ranks a side, both K/V variants among them (kvh a
	 * multiple of tp * ca or not), padding heads included */
	for (int heads = 1; heads <= 16; heads++)
		for (int kvh = 1; kvh <= heads; kvh++) {
			if (heads % kvh)
				continue;
			for (int ptp = 1; ptp <= 8; ptp++)
				for (int tp = 1; tp <= 8; tp++)
					for (int ca = 1; ca <= 4; ca *= 2)
						for (int t = 0; t < tp; t++) {
							const int n = dps_kv_relay_plan(heads, kvh, ptp, tp,
											ca, t, plan);

							ck_assert_int_gt(n, 0);
							ck_assert_msg(!plan_wrong(heads, kvh, ptp, tp, ca, t,
										  plan, n),
								      "heads %d kvh %d prefill TP %d decode "
								      "TP %d c %d t %d", heads, kvh, ptp,
								      tp, ca, t);
							cases++;
						}
		}
	ck_assert_int_gt(cases, 1000);
	/* the reference's TP=8 x DP=4 with attention size 4 (Llama-3-8B's 32 heads, 8 KV
	 * heads: one KV head an effective rank) from 8 prefill ranks: position 5 reads KV head
	 * 5, the only head of prefill rank 5 */
	ck_assert_int_eq(dps_kv_relay_plan(32, 8, 8, 8, 4, 5, plan), 1);
	ck_assert_int_eq(plan[0].head, 5);
	ck_assert_int_eq(plan[0].src_rank, 5);
	ck_assert_int_eq(plan[0].src_head, 0);
	/* the check can fail: a plan that reads the wrong slot of the right rank */
	ck_assert_int_eq(dps_kv_relay_plan(8, 4, 2, 1, 1, 0, plan), 4);
	ck_assert(!plan_wrong(8, 4, 2, 1, 1, 0, plan, 4));
	plan[3].src_head ^= 1;
	ck_assert(plan_wrong(8, 4, 2, 1, 1, 0, plan, 4));
	/* refused geometries */
	ck_assert_int_eq(dps_kv_relay_plan(6, 4, 1, 1, 1, 0, plan), -EINVAL);
	ck_assert_int_eq(dps_kv_relay_plan(8, 4, 0, 1, 1, 0, plan), -EINVAL);
	ck_assert_int_eq(dps_kv_relay_plan(8, 4, 1, 2, 1, 2, plan), -EINVAL);
}
END_TEST

START_TEST(test_layout)
{
	/* 3 layers, 4 blocks of 2 positions, width 5: slots are disjoint rows, layer-major. */
	enum { L = 3, NB = 4, BS = 2, W = 5 };
	unsigned char *seen = calloc(L * NB * BS * W, 1);

	for (int l = 0; l < L; l++)
		for (int slot = 0; slot < NB * BS; slot++) {
			const size_t at = dps_kv_offset(l, NB, BS, slot, W);

			ck_assert_uint_eq(at, ((size_t)l * NB * BS + (size_t)slot) * W);
			for (int i = 0; i < W; i++) {
				ck_assert_uint_lt(at + (size_t)i, (size_t)L * NB * BS * W);
				ck_assert(!seen[at + (size_t)i]);
				seen[at + (size_t)i] = 1;
			}
		}
	free(seen);
	ck_assert_uint_eq(dps_kv_block_bytes(L, BS, W), 2u * L * BS * W * sizeof(float));
}
END_TEST

START_TEST(test_blocks_for_budget)
{
	const size_t per = dps_kv_block_bytes(2, 16, 8); /* 2048 bytes */
	char err[512] = "";
	int blocks = 0;

	ck_assert_int_eq(dps_kv_blocks_for(10 * per + per / 2, per, 16, 0, 3, 48, &blocks, err,
					   sizeof(err)), 0);
	ck_assert_int_eq(blocks, 10);
	ck_assert_int_eq(dps_kv_blocks_for(10 * per, per, 16, 7, 3, 48, &blocks, err, sizeof(err)), 0);
	ck_assert_int_eq(blocks, 7);
	/* Fewer than one sequence needs: refused, naming the bytes it would take. */
	ck_assert_int_eq(dps_kv_blocks_for(2 * per, per, 16, 0, 3, 48, &blocks, err, sizeof(err)),
			 -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "--kv-cache-memory at least 6144 bytes"));
}
END_TEST

START_TEST(test_budget)
{
	ck_assert_uint_eq(dps_kv_budget(12345, 0.5, 4), 12345);
	/* A share of the free memory: something, and less for more ranks. */
	ck_assert_uint_gt(dps_kv_budget(0, 0.5, 1), 0);
	ck_assert_uint_lt(dps_kv_budget(0, 0.5, 8), dps_kv_budget(0, 0.5, 1));
	/* The draft's one layer of width 1 beside 3 target layers of width 1 (3 per position). */
	ck_assert_uint_eq(dps_kv_budget_share(4000, 3, 1), 3000);
	ck_assert_uint_eq(dps_kv_budget_share(4000, 3, 0), 4000);
}
END_TEST

START_TEST(test_memory)
{
	const size_t bytes = (size_t)8 << 20;
	float *p = dps_kv_alloc(bytes);

	ck_assert_ptr_nonnull(p);
	for (size_t i = 0; i < bytes / sizeof(float); i += 4096)
		ck_assert(p[i] == 0.0f);
	p[12345] = 1.0f;
	ck_assert(p[12345] == 1.0f);
	dps_kv_free(p, bytes);
}
END_TEST

START_TEST(test_pool)
{
	struct dps_kv_pool pool;
	int got[8], seen[8] = { 0 };

	ck_assert_int_eq(dps_kv_pool_init(&pool, 8), 0);
	for (int i = 0; i < 8; i++) {
		got[i] = dps_kv_pool_take(&pool);
		ck_assert_int_ge(got[i], 0);
		ck_assert_int_lt(got[i], 8);
		ck_assert(!seen[got[i]]++);
	}
	ck_assert_int_eq(got[0], 0); /* block 0 first, then 1, ... */
	ck_assert_int_eq(got[7], 7);
	ck_assert_int_eq(dps_kv_pool_take(&pool), -1);
	ck_assert_int_eq(pool.n_free, 0);
	dps_kv_pool_give(&pool, 5);
	dps_kv_pool_give(&pool, 2);
	ck_assert_int_eq(pool.n_free, 2);
	ck_assert_int_eq(dps_kv_pool_take(&pool), 2); /* last given, first taken */
	ck_assert_int_eq(dps_kv_pool_take(&pool), 5);
	dps_kv_pool_free(&pool);
	ck_assert_ptr_null(pool.free);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kv");
	TCase *tc = tcase_create("kv");

	tcase_add_test(tc, test_layout);
	tcase_add_test(tc, test_blocks_for_budget);
	tcase_add_test(tc, test_budget);
	tcase_add_test(tc, test_memory);
	tcase_add_test(tc, test_pool);
	tcase_add_test(tc, test_relay_plan);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

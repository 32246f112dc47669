/* SPDX-License-Identifier: MIT */
/*
 * tests/check_kv.c - Check suite for engine/shard/kv.c, the paged KV cache: the slot layout
 * (every slot of every layer its own row, none overlapping), how many blocks a budget buys
 * (floor, the cap, the refusal naming the bytes needed), the budget itself (given, or a share
 * of MemAvailable) and the draft's share, memory that reads as zero until written, and the
 * block pool (block 0 first, every block handed out once, -1 when empty, given back in any
 * order). The oracle is the arithmetic written into each case.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/shard/kv.h"
#include "tests/testutil.h"

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
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

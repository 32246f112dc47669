/* SPDX-License-Identifier: MIT */
/*
 * tests/check_disagg.c - Check suite for disaggregated prefill (docs/DESIGN.md section 3): the
 * prefill part of the groups beside an unchanged decode part, and an instance that forks both
 * parts' ranks, each rank proving its role and groups by collectives over real shared memory
 * between real processes (the sums of instance ranks, against the formulas written here), a
 * prefill rank's death named as one, and the layout refused by name where ranks cannot run it.
 */
#include <check.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/runtime/groups.h"
#include "engine/runtime/supervisor.h"
#include "tests/groups_util.h"
#include "tests/testutil.h"

/*
 * Disaggregated prefill: the decode part is exactly the layout without it (same sets, same
 * members), and the prefill part is plain TP over P replicas, rank (p, t) at TP*DP + p*T + t
 * by the formula here; the print shows both; the rules name their flags.
 */
START_TEST(test_prefill_part)
{
	struct dps_par_cfg cfg = mkcfg(8, 4, 4, 4, 4, 4, 4), plain = cfg;
	struct dps_groups g, ref;
	char err[256], *out;

	cfg.prefill_dp = 2; /* TP=8 x DP=4 decode, 2 x 8 = 16 prefill ranks */
	build_ok(&cfg, &g);
	build_ok(&plain, &ref);
	ck_assert_int_eq(g.world, 32);
	ck_assert_int_eq(dps_groups_total(&g), 48);
	ck_assert_int_eq(g.rank_base, 0);
	ck_assert_ptr_null(ref.prefill);
	ck_assert_int_eq(g.n_sizes, ref.n_sizes);
	ck_assert_mem_eq(g.world_gs.ranks, ref.world_gs.ranks, 32 * sizeof(int));
	ck_assert_mem_eq(g.dp.ranks, ref.dp.ranks, 32 * sizeof(int));
	ck_assert_mem_eq(g.comp_tp[0].ranks, ref.comp_tp[0].ranks, 32 * sizeof(int));
	ck_assert_ptr_nonnull(g.prefill);
	ck_assert_int_eq(g.prefill->rank_base, 32);
	ck_assert_int_eq(g.prefill->cfg.tp, 8);
	ck_assert_int_eq(g.prefill->cfg.dp, 2);
	ck_assert_int_eq(g.prefill->cfg.ep, 0);
	for (int k = 0; k < DPS_COMP_COUNT; k++)
		ck_assert_int_eq(dps_par_cfg_comp_size(&g.prefill->cfg, (enum dps_comp)k), 1);
	for (int p = 0; p < 2; p++)
		for (int t = 0; t < 8; t++) {
			const int r = p * 8 + t; /* in the part */

			ck_assert_int_eq(g.prefill->tp.group_of[r], p);
			ck_assert_int_eq(g.prefill->tp.rank_in_group[r], t);
			ck_assert_int_eq(g.prefill->rank_base + dps_groupset_members_of(
				&g.prefill->tp, r)[t], 32 + p * 8 + t);
		}
	out = print_to_string(&cfg);
	ck_assert_ptr_nonnull(strstr(out, "decode part: ranks 0-31, 4 replicas; prefill part: "
					  "ranks 32-47, 2 replicas of TP=8"));
	ck_assert_ptr_nonnull(strstr(out, "prefill part: TP=8 DP=2, ranks 32-47"));
	assert_line(out, "  DP1:           [40  41  42  43  44  45  46  47 ]");
	ck_assert_ptr_nonnull(strstr(out, "  DP0: [32, 33, 34, 35, 36, 37, 38, 39]"));
	ck_assert_ptr_nonnull(strstr(out, "component TP (c=4) = world")); /* the decode part's */
	free(out);
	dps_groups_free(&g);
	dps_groups_free(&ref);

	/* T differs from TP */
	cfg = mkcfg(2, 2, 2, 1, 1, 1, 1);
	cfg.prefill_dp = 3;
	cfg.prefill_tp = 1;
	build_ok(&cfg, &g);
	ck_assert_int_eq(dps_groups_total(&g), 7);
	ck_assert_int_eq(g.prefill->tp.group_size, 1);
	ck_assert_int_eq(g.prefill->world_gs.group_size, 3);
	dps_groups_free(&g);

	/* the rules */
	cfg = mkcfg(2, 2, 1, 1, 1, 1, 1);
	cfg.prefill_tp = 2;
	ck_assert_int_eq(dps_par_cfg_check(&cfg, err, sizeof(err)), -DPS_ECONFIG);
	ck_assert_ptr_nonnull(strstr(err, "--prefill-tensor-parallel-size 2 sizes the prefill "
					  "replicas: it needs --prefill-data-parallel-size"));
	cfg.prefill_dp = -1;
	ck_assert_int_eq(dps_par_cfg_check(&cfg, err, sizeof(err)), -DPS_ECONFIG);
	ck_assert_ptr_nonnull(strstr(err, "--prefill-data-parallel-size -1"));
	cfg.prefill_dp = 511; /* 4 + 1022 ranks */
	ck_assert_int_eq(dps_par_cfg_check(&cfg, err, sizeof(err)), -DPS_ECONFIG);
	ck_assert_ptr_nonnull(strstr(err, "4 decode ranks and --prefill-data-parallel-size 511 x "
					  "--prefill-tensor-parallel-size 2 = 1022 prefill ranks "
					  "exceed the limit of 1024"));
	cfg.prefill_dp = 510;
	ck_assert_int_eq(dps_par_cfg_check(&cfg, err, sizeof(err)), 0);
	cfg.prefill_dp = 1;
	cfg.prefill_tp = -2;
	ck_assert_int_eq(dps_par_cfg_check(&cfg, err, sizeof(err)), -DPS_ECONFIG);
	ck_assert_ptr_nonnull(strstr(err, "--prefill-tensor-parallel-size -2"));
}
END_TEST

/* ---- both parts' ranks in one instance ------------------------------------------------- */

/* Shared with the forked ranks (MAP_SHARED, inherited). */
struct shared {
	_Atomic int err_code[64];
	_Atomic int seen[64];
	_Atomic int bad;
};

static struct shared *sh;

static void setup(void)
{
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(sh, MAP_FAILED);
}

static void teardown(void)
{
	munmap(sh, sizeof(*sh));
}

/*
 * Every rank checks its role and place by the layout's formulas, then proves its groups by
 * collectives: the sum of the instance ranks over its part's world group, its TP group and
 * (decode) its attention component group, and rank 0 of each replica broadcasts on the
 * replica's batch ring; each rank then says who it is to the supervisor.
 */
static int part_rank(struct dps_world *w, void *arg)
{
	const int *dims = arg; /* TP, DP, attention size, T, P */
	const int nd = dims[0] * dims[1], pre = w->rank >= nd;
	const int tp = pre ? dims[3] : dims[0], lr = w->rank - (pre ? nd : 0);
	const int n = pre ? dims[3] * dims[4] : nd;
	float v = (float)w->rank, want;
	char msg[64];
	int rc, len;

	if ((int)w->role != pre || w->base != (pre ? nd : 0) || w->world != n || w->tp != tp ||
	    w->tp_rank != lr % tp || w->dp_rank != lr / tp || w->total != nd + dims[3] * dims[4])
		return -DPS_EPROTO;
	/* world group: the ranks of the part, base .. base + n - 1 */
	rc = dps_coll_allreduce(w->world_c, &v, &v, 1, DPS_F32);
	want = (float)(n * (pre ? nd : 0) + n * (n - 1) / 2);
	if (rc || v != want)
		return rc ? rc : -DPS_EPROTO;
	/* TP group: the replica's ranks */
	v = (float)w->rank;
	rc = dps_coll_allreduce(w->tp_c, &v, &v, 1, DPS_F32);
	want = (float)(tp * (w->rank - w->tp_rank) + tp * (tp - 1) / 2);
	if (rc || v != want)
		return rc ? rc : -DPS_EPROTO;
	if (!pre && dims[2] > 1) { /* attention's component group: c replicas side by side */
		const int c = dims[2], first = lr / (tp * c) * (tp * c);

		v = (float)w->rank;
		rc = dps_coll_allreduce(w->comp_tp_c[DPS_COMP_ATTN], &v, &v, 1, DPS_F32);
		want = (float)(tp * c * first + tp * c * (tp * c - 1) / 2);
		if (rc || v != want)
			return rc ? rc : -DPS_EPROTO;
	}
	if (pre && w->comp_tp_c[DPS_COMP_ATTN] != w->tp_c)
		return -DPS_EPROTO; /* every component size is 1 on the prefill part */
	if (tp > 1) {
		int got = -1;
		size_t l;

		if (w->tp_rank == 0) {
			got = w->rank;
			rc = dps_ring_push(&w->replica, &got, sizeof(got), 0);
		} else {
			rc = dps_ring_pop(&w->replica, (unsigned)w->tp_rank - 1, &got, sizeof(got), &l,
					  0);
			if (!rc && got != w->rank - w->tp_rank)
				rc = -DPS_EPROTO;
		}
		if (rc)
			return rc;
	}
	len = snprintf(msg, sizeof(msg), "%d %d", w->rank, (int)w->role);
	return dps_ring_push(&w->to_sup, msg, (size_t)len, 0);
}

static void part_msg(int rank, const void *msg, size_t len, void *arg)
{
	const int nd = *(const int *)arg;
	char want[64];
	int n = snprintf(want, sizeof(want), "%d %d", rank, rank >= nd);

	if ((size_t)n != len || memcmp(want, msg, len) || rank < 0 || rank >= 64)
		sh->bad++;
	else
		sh->seen[rank]++;
}

START_TEST(test_prefill_part_ranks)
{
	/* decode TP x DP with an attention size; then P prefill replicas of T */
	static const int layouts[][5] = { { 2, 2, 2, 1, 2 }, { 2, 2, 2, 3, 2 }, { 1, 4, 4, 2, 1 } };

	for (size_t i = 0; i < sizeof(layouts) / sizeof(layouts[0]); i++) {
		const int *d = layouts[i];
		int nd = d[0] * d[1];
		struct dps_sup_opts o = { .par = { d[0], d[1], d[2], 1, 1, 1, 1, 0, 0, d[4], d[3] },
					  .rank_fn = part_rank, .rank_arg = (void *)d,
					  .msg_fn = part_msg, .msg_arg = &nd, .roles = 1 };
		struct dps_sup_result res;
		char err[256];

		memset(sh, 0, sizeof(*sh));
		ck_assert_msg(dps_sup_run(&o, &res, err, sizeof(err)) == 0, "layout %zu: %s", i, err);
		ck_assert_int_eq(sh->bad, 0);
		for (int r = 0; r < nd + d[3] * d[4]; r++)
			ck_assert_msg(sh->seen[r] == 1, "layout %zu: rank %d said %d times", i, r,
				      sh->seen[r]);
	}
	/* the check can fail: a rank that reads the wrong part's base is caught */
	{
		static const int wrong[5] = { 2, 2, 2, 2, 1 }; /* says T = 2 ... */
		int nd = 4;
		/* ... but the instance has T = 1, P = 2 */
		struct dps_sup_opts o = { .par = { 2, 2, 2, 1, 1, 1, 1, 0, 0, 2, 1 },
					  .rank_fn = part_rank, .rank_arg = (void *)wrong,
					  .msg_fn = part_msg, .msg_arg = &nd, .roles = 1 };
		struct dps_sup_result res;
		char err[256];

		ck_assert_int_eq(dps_sup_run(&o, &res, err, sizeof(err)), -DPS_ERANK);
	}
	/* without .roles the layout is refused by name */
	{
		struct dps_sup_opts o = { .par = { 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0 },
					  .rank_fn = part_rank };
		struct dps_sup_result res;
		char err[256] = "";

		ck_assert_int_eq(dps_sup_run(&o, &res, err, sizeof(err)), -DPS_ECONFIG);
		ck_assert_msg(strstr(err, "--prefill-data-parallel-size 1"), "%s", err);
	}
}
END_TEST

/* All-reduces over its part's world group until the victim kills itself. */
static int loop_rank(struct dps_world *w, void *arg)
{
	const int victim = *(const int *)arg;
	float buf[64];

	for (int it = 0;; it++) {
		int rc;

		for (int j = 0; j < 64; j++)
			buf[j] = (float)(w->rank + j);
		if (w->rank == victim && it == 300)
			raise(SIGKILL);
		rc = dps_coll_allreduce(w->world_c, buf, buf, 64, DPS_F32);
		if (rc) {
			sh->err_code[w->rank] = rc;
			return rc;
		}
	}
}

/* A prefill rank that dies is named as one, and the decode ranks stop too. */
START_TEST(test_prefill_rank_killed)
{
	int victim = 3;
	/* decode TP=1 x DP=2; prefill 1 replica of TP=2: ranks 2 and 3 */
	struct dps_sup_opts o = { .par = { 1, 2, 1, 1, 1, 1, 1, 0, 0, 1, 2 },
				  .rank_fn = loop_rank, .rank_arg = &victim, .roles = 1 };
	struct dps_sup_result res;
	char err[256];

	memset(sh, 0, sizeof(*sh));
	ck_assert_int_eq(dps_sup_run(&o, &res, err, sizeof(err)), -DPS_ERANK);
	ck_assert_int_eq(res.failed_rank, 3);
	ck_assert_msg(strstr(err, "rank 3 (prefill replica 0, TP 1)") && strstr(err, "signal 9"),
		      "%s", err);
	for (int r = 0; r < 3; r++)
		ck_assert_int_eq(sh->err_code[r], -DPS_EABORT);
	ck_assert_int_eq(test_shm_entries_of(getpid()), 0);
}
END_TEST

static Suite *disagg_suite(void)
{
	Suite *s = suite_create("disagg");
	TCase *tc = tcase_create("groups");

	tcase_add_test(tc, test_prefill_part);
	suite_add_tcase(s, tc);
	tc = tcase_create("ranks");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_prefill_part_ranks);
	tcase_add_test(tc, test_prefill_rank_killed);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run_suite(disagg_suite());
}

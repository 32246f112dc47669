/* SPDX-License-Identifier: MIT */
/*
 * tests/check_groups.c - Check suite for engine/runtime/groups.c: the reference's TP=8 x DP=4
 * example, hand-computed mixed layouts, aliasing, the structural invariants of every set over all
 * small layouts (against the formulas of docs/DESIGN.md section 3 as an oracle), every rejected
 * configuration and its message, the printed rank grid, and a deliberate fault that proves the
 * invariant checker can fail. Pure computation: no processes, no shared memory.
 */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/groups.h"
#include "tests/groups_util.h"

/* ---- the invariant checker used by the sweep and by the deliberate fault ---- */

#define FAIL(...)                                        \
	do {                                             \
		snprintf(why, len, __VA_ARGS__);         \
		return -1;                               \
	} while (0)

/*
 * Checks one set against the partition rules and against the design table as an oracle:
 * the expected (group, rank_in_group) of every world rank is computed from d and t here,
 * independently of groups.c. Returns 0, or -1 with a reason in why.
 */
static int check_set(const struct dps_groups *g, const struct dps_groupset *gs, char *why,
		     size_t len)
{
	const int tp = g->cfg.tp, dp = g->cfg.dp, world = g->world, c = gs->c;
	int exp_groups, exp_size, r, i;
	int *seen;

	switch (gs->kind) {
	case DPS_GS_WORLD:
		exp_groups = 1, exp_size = world;
		break;
	case DPS_GS_TP:
		exp_groups = dp, exp_size = tp;
		break;
	case DPS_GS_DP:
		exp_groups = tp, exp_size = dp;
		break;
	case DPS_GS_COMP_TP:
		if (c < 1 || dp % c)
			FAIL("component TP set with c=%d for DP=%d", c, dp);
		exp_groups = dp / c, exp_size = tp * c;
		break;
	case DPS_GS_DP_COLUMN:
		if (c < 1 || dp % c)
			FAIL("DP column set with c=%d for DP=%d", c, dp);
		exp_groups = dp / c * tp, exp_size = c;
		break;
	default:
		FAIL("unknown kind %d", (int)gs->kind);
	}
	if (gs->n_groups != exp_groups || gs->group_size != exp_size)
		FAIL("kind %d c=%d: %d groups of %d, expected %d of %d", (int)gs->kind, c,
		     gs->n_groups, gs->group_size, exp_groups, exp_size);

	/* Every world rank exactly once in ranks[]. */
	seen = calloc((size_t)world, sizeof(*seen));
	ck_assert_ptr_nonnull(seen);
	for (i = 0; i < world; i++) {
		const int m = gs->ranks[i];

		if (m < 0 || m >= world || seen[m]++) {
			free(seen);
			FAIL("kind %d c=%d: ranks[%d] = %d is out of range or repeated", (int)gs->kind,
			     c, i, m);
		}
	}
	free(seen);

	for (r = 0; r < world; r++) {
		const int d = r / tp, t = r % tp;
		const int grp = gs->group_of[r], pos = gs->rank_in_group[r];
		int exp_grp, exp_pos;

		switch (gs->kind) {
		case DPS_GS_WORLD:
			exp_grp = 0, exp_pos = r;
			break;
		case DPS_GS_TP:
			exp_grp = d, exp_pos = t;
			break;
		case DPS_GS_DP:
			exp_grp = t, exp_pos = d;
			break;
		case DPS_GS_COMP_TP:
			exp_grp = d / c, exp_pos = (d % c) * tp + t;
			break;
		default: /* DPS_GS_DP_COLUMN */
			exp_grp = d / c * tp + t, exp_pos = d % c;
			break;
		}
		if (grp != exp_grp || pos != exp_pos)
			FAIL("kind %d c=%d: rank %d in group %d at %d, expected group %d at %d",
			     (int)gs->kind, c, r, grp, pos, exp_grp, exp_pos);
		if (gs->ranks[(size_t)grp * (size_t)gs->group_size + (size_t)pos] != r)
			FAIL("kind %d c=%d: ranks[group_of[%d] * size + rank_in_group[%d]] = %d",
			     (int)gs->kind, c, r, r,
			     gs->ranks[(size_t)grp * (size_t)gs->group_size + (size_t)pos]);
		if (dps_groupset_members_of(gs, r)[pos] != r)
			FAIL("kind %d c=%d: members_of(%d)[%d] != %d", (int)gs->kind, c, r, pos, r);
	}
	return 0;
}

struct visit {
	int n;
	const struct dps_groupset *sets[3 + 2 * DPS_MAX_COMP_SIZES + 1];
};

static void visit_add(const struct dps_groupset *gs, void *arg)
{
	struct visit *v = arg;

	if (v->n < (int)(sizeof(v->sets) / sizeof(v->sets[0])))
		v->sets[v->n] = gs;
	v->n++;
}

/* Checks every set of g, the distinct sizes, the aliasing and the foreach order. */
static int check_groups(const struct dps_groups *g, char *why, size_t len)
{
	struct visit v = { 0 };
	int i, k;

	if (g->world != g->cfg.tp * g->cfg.dp)
		FAIL("world %d != %d x %d", g->world, g->cfg.tp, g->cfg.dp);
	if (g->n_sizes < 1 || g->n_sizes > DPS_MAX_COMP_SIZES)
		FAIL("n_sizes %d", g->n_sizes);
	for (i = 1; i < g->n_sizes; i++)
		if (g->sizes[i - 1] >= g->sizes[i])
			FAIL("sizes not strictly ascending at %d", i);
	for (i = 0; i < g->n_sizes; i++) {
		int used = 0;

		for (k = 0; k < DPS_COMP_COUNT; k++)
			used |= dps_par_cfg_comp_size(&g->cfg, (enum dps_comp)k) == g->sizes[i];
		if (!used)
			FAIL("size %d is used by no component", g->sizes[i]);
		if (g->comp_tp[i].c != g->sizes[i] || g->dp_col[i].c != g->sizes[i])
			FAIL("sets of size index %d carry c=%d/%d", i, g->comp_tp[i].c,
			     g->dp_col[i].c);
	}
	for (k = 0; k < DPS_COMP_COUNT; k++) {
		const int c = dps_par_cfg_comp_size(&g->cfg, (enum dps_comp)k);
		int j;

		if (!g->comp_tp_of[k] || g->comp_tp_of[k]->kind != DPS_GS_COMP_TP ||
		    g->comp_tp_of[k]->c != c)
			FAIL("%s: wrong component TP set", dps_comp_name((enum dps_comp)k));
		if (!g->dp_col_of[k] || g->dp_col_of[k]->kind != DPS_GS_DP_COLUMN ||
		    g->dp_col_of[k]->c != c)
			FAIL("%s: wrong DP column set", dps_comp_name((enum dps_comp)k));
		for (j = 0; j < DPS_COMP_COUNT; j++) {
			const int cj = dps_par_cfg_comp_size(&g->cfg, (enum dps_comp)j);

			if ((c == cj) != (g->comp_tp_of[k] == g->comp_tp_of[j]) ||
			    (c == cj) != (g->dp_col_of[k] == g->dp_col_of[j]))
				FAIL("aliasing of %s and %s is wrong",
				     dps_comp_name((enum dps_comp)k), dps_comp_name((enum dps_comp)j));
		}
	}

	dps_groups_foreach_set(g, visit_add, &v);
	if (v.n != 3 + 2 * g->n_sizes)
		FAIL("foreach visited %d sets, expected %d", v.n, 3 + 2 * g->n_sizes);
	if (v.sets[0] != &g->world_gs || v.sets[1] != &g->tp || v.sets[2] != &g->dp)
		FAIL("foreach order of world, TP, DP");
	for (i = 0; i < g->n_sizes; i++)
		if (v.sets[3 + 2 * i] != &g->comp_tp[i] || v.sets[4 + 2 * i] != &g->dp_col[i])
			FAIL("foreach order at size index %d", i);
	if (g->world_gs.kind != DPS_GS_WORLD || g->tp.kind != DPS_GS_TP || g->dp.kind != DPS_GS_DP)
		FAIL("kinds of world, TP, DP");
	for (i = 0; i < v.n; i++) {
		char sub[200];

		if (check_set(g, v.sets[i], sub, sizeof(sub)))
			FAIL("TP=%d DP=%d: %s", g->cfg.tp, g->cfg.dp, sub);
	}
	return 0;
}

#undef FAIL

static void assert_group(const struct dps_groupset *gs, int grp, const int *exp, int n)
{
	int i;

	ck_assert_int_eq(gs->group_size, n);
	for (i = 0; i < n; i++)
		ck_assert_msg(gs->ranks[grp * n + i] == exp[i], "group %d position %d: %d != %d",
			      grp, i, gs->ranks[grp * n + i], exp[i]);
}

/* ---- (a) the reference's example ---- */

START_TEST(test_seed_example)
{
	const struct dps_par_cfg cfg = mkcfg(8, 4, 4, 4, 4, 4, 4);
	static const int dp_first[] = { 0, 8, 16, 24 }, dp_last[] = { 7, 15, 23, 31 };
	struct dps_groups g;
	int d, t, r;

	build_ok(&cfg, &g);
	ck_assert_int_eq(g.world, 32);
	ck_assert_int_eq(g.n_sizes, 1);
	ck_assert_int_eq(g.sizes[0], 4);

	/* TP groups [0..7], [8..15], [16..23], [24..31]. */
	ck_assert_int_eq(g.tp.n_groups, 4);
	ck_assert_int_eq(g.tp.group_size, 8);
	for (d = 0; d < 4; d++)
		for (t = 0; t < 8; t++)
			ck_assert_int_eq(g.tp.ranks[d * 8 + t], d * 8 + t);

	/* DP groups [0,8,16,24], [1,9,17,25], ..., [7,15,23,31]. */
	ck_assert_int_eq(g.dp.n_groups, 8);
	assert_group(&g.dp, 0, dp_first, 4);
	assert_group(&g.dp, 7, dp_last, 4);
	for (t = 0; t < 8; t++)
		for (d = 0; d < 4; d++)
			ck_assert_int_eq(g.dp.ranks[t * 4 + d], t + 8 * d);

	/* Component TP c=4: one group of all 32 ranks, rank_in_group j*TP + t. */
	ck_assert_int_eq(g.comp_tp[0].n_groups, 1);
	ck_assert_int_eq(g.comp_tp[0].group_size, 32);
	for (r = 0; r < 32; r++) {
		ck_assert_int_eq(g.comp_tp[0].ranks[r], r);
		ck_assert_int_eq(g.comp_tp[0].group_of[r], 0);
		ck_assert_int_eq(g.comp_tp[0].rank_in_group[r], (r / 8) * 8 + r % 8);
	}

	/* DP columns c=4: [0,8,16,24] .. [7,15,23,31], rank_in_group j = d. */
	ck_assert_int_eq(g.dp_col[0].n_groups, 8);
	assert_group(&g.dp_col[0], 0, dp_first, 4);
	assert_group(&g.dp_col[0], 7, dp_last, 4);
	for (r = 0; r < 32; r++) {
		ck_assert_int_eq(g.dp_col[0].group_of[r], r % 8);
		ck_assert_int_eq(g.dp_col[0].rank_in_group[r], r / 8);
	}
	dps_groups_free(&g);
}
END_TEST

/* ---- (b) mixed sizes, hand-computed ---- */

START_TEST(test_mixed_tp2_dp4)
{
	/* attention 2, embedding 1, mlp 4, draft-mlp 1, lm-head 1 */
	const struct dps_par_cfg cfg = mkcfg(2, 4, 2, 1, 4, 1, 1);
	static const int c2_g1[] = { 4, 5, 6, 7 }, col2_g3[] = { 5, 7 }, col2_g0[] = { 0, 2 };
	static const int col4_g1[] = { 1, 3, 5, 7 }, c1_g2[] = { 4, 5 };
	const struct dps_groupset *attn, *mlp, *emb;
	struct dps_groups g;

	build_ok(&cfg, &g);
	ck_assert_int_eq(g.n_sizes, 3);
	ck_assert_int_eq(g.sizes[0], 1);
	ck_assert_int_eq(g.sizes[1], 2);
	ck_assert_int_eq(g.sizes[2], 4);

	attn = g.comp_tp_of[DPS_COMP_ATTN];
	ck_assert_int_eq(attn->c, 2);
	ck_assert_int_eq(attn->n_groups, 2);
	ck_assert_int_eq(attn->group_size, 4);
	assert_group(attn, 1, c2_g1, 4);
	/* rank 5: d=2, t=1, g=1, j=0 -> rank_in_group 1; rank 6: d=3, t=0, j=1 -> 2 */
	ck_assert_int_eq(attn->group_of[5], 1);
	ck_assert_int_eq(attn->rank_in_group[5], 1);
	ck_assert_int_eq(attn->rank_in_group[6], 2);
	ck_assert_int_eq(attn->rank_in_group[3], 3);
	ck_assert_int_eq(dps_groupset_members_of(attn, 6)[0], 4);

	attn = g.dp_col_of[DPS_COMP_ATTN];
	ck_assert_int_eq(attn->n_groups, 4);
	assert_group(attn, 0, col2_g0, 2);
	assert_group(attn, 3, col2_g3, 2);
	ck_assert_int_eq(attn->group_of[5], 3);
	ck_assert_int_eq(attn->rank_in_group[5], 0);
	ck_assert_int_eq(attn->rank_in_group[7], 1);
	ck_assert_int_eq(attn->group_of[2], 0);
	ck_assert_int_eq(attn->rank_in_group[2], 1);

	mlp = g.comp_tp_of[DPS_COMP_MLP];
	ck_assert_int_eq(mlp->n_groups, 1);
	ck_assert_int_eq(mlp->rank_in_group[6], 6);
	mlp = g.dp_col_of[DPS_COMP_MLP];
	ck_assert_int_eq(mlp->n_groups, 2);
	assert_group(mlp, 1, col4_g1, 4);
	ck_assert_int_eq(mlp->rank_in_group[5], 2);

	emb = g.comp_tp_of[DPS_COMP_EMB];
	ck_assert_int_eq(emb->n_groups, 4);
	assert_group(emb, 2, c1_g2, 2);
	ck_assert_int_eq(emb->rank_in_group[5], 1);
	emb = g.dp_col_of[DPS_COMP_EMB];
	ck_assert_int_eq(emb->n_groups, 8);
	ck_assert_int_eq(emb->group_size, 1);
	ck_assert_int_eq(emb->group_of[5], 5);
	ck_assert_int_eq(emb->rank_in_group[5], 0);
	dps_groups_free(&g);
}
END_TEST

START_TEST(test_mixed_tp4_dp6)
{
	/* attention 3, embedding 6, mlp 2, draft-mlp 3, lm-head 1 */
	const struct dps_par_cfg cfg = mkcfg(4, 6, 3, 6, 2, 3, 1);
	static const int col3_g7[] = { 15, 19, 23 }, col2_g11[] = { 19, 23 };
	const struct dps_groupset *gs;
	struct dps_groups g;
	int i;

	build_ok(&cfg, &g);
	ck_assert_int_eq(g.n_sizes, 4);
	/* Rank 19: d=4, t=3. For c=3: g=1, j=1. */
	gs = g.comp_tp_of[DPS_COMP_ATTN];
	ck_assert_int_eq(gs->group_of[19], 1);
	ck_assert_int_eq(gs->rank_in_group[19], 1 * 4 + 3);
	for (i = 0; i < 12; i++)
		ck_assert_int_eq(dps_groupset_members_of(gs, 19)[i], 12 + i);
	gs = g.dp_col_of[DPS_COMP_ATTN];
	ck_assert_int_eq(gs->n_groups, 8);
	ck_assert_int_eq(gs->group_of[19], 1 * 4 + 3);
	ck_assert_int_eq(gs->rank_in_group[19], 1);
	assert_group(gs, 7, col3_g7, 3);
	/* For c=2: g=2, j=0. */
	gs = g.dp_col_of[DPS_COMP_MLP];
	ck_assert_int_eq(gs->group_of[19], 2 * 4 + 3);
	ck_assert_int_eq(gs->rank_in_group[19], 0);
	assert_group(gs, 11, col2_g11, 2);
	gs = g.comp_tp_of[DPS_COMP_MLP];
	ck_assert_int_eq(gs->group_of[19], 2);
	ck_assert_int_eq(gs->rank_in_group[19], 3);
	dps_groups_free(&g);
}
END_TEST

/* ---- (c) aliasing and the always-created c = 1 sets ---- */

START_TEST(test_aliasing)
{
	const struct dps_par_cfg all4 = mkcfg(8, 4, 4, 4, 4, 4, 4);
	const struct dps_par_cfg mixed = mkcfg(2, 4, 2, 1, 4, 1, 1);
	struct dps_groups g;
	int k;

	build_ok(&all4, &g);
	for (k = 1; k < DPS_COMP_COUNT; k++) {
		ck_assert_ptr_eq(g.comp_tp_of[k], g.comp_tp_of[0]);
		ck_assert_ptr_eq(g.dp_col_of[k], g.dp_col_of[0]);
	}
	ck_assert_ptr_eq(g.comp_tp_of[0], &g.comp_tp[0]);
	ck_assert_ptr_eq(g.dp_col_of[0], &g.dp_col[0]);
	dps_groups_free(&g);

	build_ok(&mixed, &g);
	ck_assert_ptr_eq(g.comp_tp_of[DPS_COMP_EMB], g.comp_tp_of[DPS_COMP_DRAFT_MLP]);
	ck_assert_ptr_eq(g.comp_tp_of[DPS_COMP_EMB], g.comp_tp_of[DPS_COMP_LM_HEAD]);
	ck_assert_ptr_eq(g.dp_col_of[DPS_COMP_EMB], g.dp_col_of[DPS_COMP_LM_HEAD]);
	ck_assert_ptr_ne(g.comp_tp_of[DPS_COMP_ATTN], g.comp_tp_of[DPS_COMP_MLP]);
	ck_assert_ptr_ne(g.comp_tp_of[DPS_COMP_ATTN], g.comp_tp_of[DPS_COMP_EMB]);
	ck_assert_ptr_ne(g.dp_col_of[DPS_COMP_ATTN], g.dp_col_of[DPS_COMP_MLP]);
	ck_assert_ptr_eq(g.comp_tp_of[DPS_COMP_ATTN], &g.comp_tp[1]);
	ck_assert_ptr_eq(g.comp_tp_of[DPS_COMP_MLP], &g.comp_tp[2]);
	ck_assert_ptr_eq(g.dp_col_of[DPS_COMP_EMB], &g.dp_col[0]);
	dps_groups_free(&g);
}
END_TEST

START_TEST(test_size_one_sets)
{
	const struct dps_par_cfg dflt = DPS_PAR_CFG_DEFAULT;
	struct dps_par_cfg cfg = mkcfg(4, 4, 1, 1, 1, 1, 1);
	struct dps_groups g;
	int r;

	build_ok(&cfg, &g);
	ck_assert_int_eq(g.n_sizes, 1);
	ck_assert_int_eq(g.sizes[0], 1);
	/* Component TP (c=1) has the members of the TP groups. */
	ck_assert_int_eq(g.comp_tp[0].n_groups, g.tp.n_groups);
	ck_assert_int_eq(g.comp_tp[0].group_size, g.tp.group_size);
	ck_assert_int_eq(memcmp(g.comp_tp[0].ranks, g.tp.ranks, 16 * sizeof(int)), 0);
	/* DP column (c=1) is a group of one: each rank alone. */
	ck_assert_int_eq(g.dp_col[0].group_size, 1);
	ck_assert_int_eq(g.dp_col[0].n_groups, 16);
	for (r = 0; r < 16; r++) {
		ck_assert_int_eq(g.dp_col[0].ranks[r], r);
		ck_assert_int_eq(g.dp_col[0].group_of[r], r);
		ck_assert_int_eq(g.dp_col[0].rank_in_group[r], 0);
	}
	dps_groups_free(&g);

	/* The default layout is one rank with every set present. */
	build_ok(&dflt, &g);
	ck_assert_int_eq(g.world, 1);
	ck_assert_int_eq(g.n_sizes, 1);
	ck_assert_int_eq(g.comp_tp[0].group_size, 1);
	ck_assert_int_eq(g.dp_col[0].group_size, 1);
	dps_groups_free(&g);
	/* Free is safe twice (the struct is zeroed). */
	dps_groups_free(&g);
}
END_TEST

/* ---- (d) invariants over every small layout ---- */

START_TEST(test_invariants_sweep)
{
	int tp, dp, n_builds = 0;

	for (tp = 1; tp <= 8; tp++) {
		for (dp = 1; dp <= 8; dp++) {
			int divs[8], nd = 0, c, combo, n_combos = 1, k;

			for (c = 1; c <= dp; c++)
				if (dp % c == 0)
					divs[nd++] = c;
			for (k = 0; k < DPS_COMP_COUNT; k++)
				n_combos *= nd;
			/* Every assignment of a divisor of DP to each of the five components. */
			for (combo = 0; combo < n_combos; combo++) {
				int sizes[DPS_COMP_COUNT], rest = combo;
				struct dps_par_cfg cfg;
				struct dps_groups g;
				char why[256];

				for (k = 0; k < DPS_COMP_COUNT; k++) {
					sizes[k] = divs[rest % nd];
					rest /= nd;
				}
				cfg = mkcfg(tp, dp, sizes[0], sizes[1], sizes[2], sizes[3], sizes[4]);
				build_ok(&cfg, &g);
				ck_assert_msg(check_groups(&g, why, sizeof(why)) == 0,
					      "attn %d emb %d mlp %d draft %d lm %d: %s", sizes[0],
					      sizes[1], sizes[2], sizes[3], sizes[4], why);
				dps_groups_free(&g);
				n_builds++;
			}
		}
	}
	ck_assert_int_eq(n_builds, 8 * (1 + 32 + 32 + 243 + 32 + 1024 + 32 + 1024));
}
END_TEST

START_TEST(test_largest_worlds)
{
	const struct dps_par_cfg cfgs[] = {
		mkcfg(1024, 1, 1, 1, 1, 1, 1),
		mkcfg(1, 1024, 1024, 512, 2, 1, 64),
		mkcfg(32, 32, 32, 16, 8, 4, 2),
	};
	size_t i;

	for (i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
		struct dps_groups g;
		char why[256];

		build_ok(&cfgs[i], &g);
		ck_assert_msg(check_groups(&g, why, sizeof(why)) == 0, "%s", why);
		dps_groups_free(&g);
	}
}
END_TEST

/* ---- (e) rejected configurations ---- */

struct bad_case {
	struct dps_par_cfg cfg;
	const char *msg[3]; /* substrings the message must contain */
};

START_TEST(test_rejected)
{
	const struct bad_case cases[] = {
		{ mkcfg(0, 4, 1, 1, 1, 1, 1), { "--tensor-parallel-size 0 must be at least 1" } },
		{ mkcfg(-3, 4, 1, 1, 1, 1, 1), { "--tensor-parallel-size -3", "at least 1" } },
		{ mkcfg(8, 0, 1, 1, 1, 1, 1), { "--data-parallel-size 0 must be at least 1" } },
		{ mkcfg(8, -1, 1, 1, 1, 1, 1), { "--data-parallel-size -1" } },
		{ mkcfg(8, 4, 0, 1, 1, 1, 1),
		  { "--attention-dp-size 0 must be a positive divisor of --data-parallel-size 4" } },
		{ mkcfg(8, 4, 1, -2, 1, 1, 1),
		  { "--embedding-dp-size -2", "positive divisor", "--data-parallel-size 4" } },
		{ mkcfg(8, 4, 1, 1, 3, 1, 1),
		  { "--mlp-dp-size 3 does not divide --data-parallel-size 4" } },
		{ mkcfg(8, 4, 1, 1, 1, 8, 1),
		  { "--draft-mlp-dp-size 8 does not divide --data-parallel-size 4" } },
		{ mkcfg(8, 4, 1, 1, 1, 1, 3),
		  { "--lm-head-dp-size 3 does not divide --data-parallel-size 4" } },
		{ mkcfg(8, 6, 4, 1, 1, 1, 1),
		  { "--attention-dp-size 4 does not divide --data-parallel-size 6" } },
		{ mkcfg(64, 32, 1, 1, 1, 1, 1),
		  { "--tensor-parallel-size 64 x --data-parallel-size 32 = 2048 ranks "
		    "exceeds the limit of 1024" } },
		{ mkcfg(1025, 1, 1, 1, 1, 1, 1),
		  { "--tensor-parallel-size 1025", "--data-parallel-size 1", "limit of 1024" } },
		{ mkcfg(INT_MAX, INT_MAX, 1, 1, 1, 1, 1),
		  { "--tensor-parallel-size 2147483647", "--data-parallel-size 2147483647",
		    "exceeds the limit of 1024" } },
		{ mkcfg(65536, 65536, 1, 1, 1, 1, 1), { "4294967296 ranks exceeds" } },
	};
	size_t i, j;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct dps_groups g;
		char err[256] = "", err2[256] = "";
		int rc;

		memset(&g, 0xa5, sizeof(g));
		rc = dps_groups_build(&cases[i].cfg, &g, err, sizeof(err));
		ck_assert_msg(rc == -DPS_ECONFIG, "case %zu: rc %d", i, rc);
		for (j = 0; j < 3 && cases[i].msg[j]; j++)
			ck_assert_msg(strstr(err, cases[i].msg[j]), "case %zu: '%s' lacks '%s'", i,
				      err, cases[i].msg[j]);
		/* The failed build leaves nothing to free and a freeable struct. */
		ck_assert_ptr_null(g.tp.ranks);
		ck_assert_ptr_null(g.comp_tp[0].ranks);
		dps_groups_free(&g);

		rc = dps_par_cfg_check(&cases[i].cfg, err2, sizeof(err2));
		ck_assert_int_eq(rc, -DPS_ECONFIG);
		ck_assert_str_eq(err, err2);
		/* No buffer, or a tiny one, is fine too. */
		ck_assert_int_eq(dps_par_cfg_check(&cases[i].cfg, NULL, 0), -DPS_ECONFIG);
		ck_assert_int_eq(dps_par_cfg_check(&cases[i].cfg, err2, 5), -DPS_ECONFIG);
		ck_assert_uint_eq(strlen(err2), 4);
	}
}
END_TEST

START_TEST(test_accepted_limits)
{
	const struct dps_par_cfg ok[] = {
		mkcfg(1024, 1, 1, 1, 1, 1, 1),
		mkcfg(1, 1024, 1024, 1024, 1024, 1024, 1024),
		mkcfg(32, 32, 32, 1, 2, 4, 8),
	};
	char err[128];
	size_t i;

	for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		ck_assert_int_eq(dps_par_cfg_check(&ok[i], err, sizeof(err)), 0);
}
END_TEST

/* ---- names ---- */

START_TEST(test_names)
{
	static const char *const names[] = { "attention", "embedding", "mlp", "draft-mlp",
					     "lm-head" };
	static const char *const flags[] = { "--attention-dp-size", "--embedding-dp-size",
					     "--mlp-dp-size", "--draft-mlp-dp-size",
					     "--lm-head-dp-size" };
	const struct dps_par_cfg cfg = mkcfg(2, 8, 1, 2, 4, 8, 2);
	static const int sizes[] = { 1, 2, 4, 8, 2 };
	struct dps_groups g;
	char buf[64];
	int k;

	for (k = 0; k < DPS_COMP_COUNT; k++) {
		ck_assert_str_eq(dps_comp_name((enum dps_comp)k), names[k]);
		ck_assert_str_eq(dps_comp_flag((enum dps_comp)k), flags[k]);
		ck_assert_int_eq(dps_par_cfg_comp_size(&cfg, (enum dps_comp)k), sizes[k]);
	}
	build_ok(&cfg, &g);
	ck_assert_str_eq(dps_groupset_name(&g.world_gs, buf, sizeof(buf)), "world");
	ck_assert_str_eq(dps_groupset_name(&g.tp, buf, sizeof(buf)), "TP");
	ck_assert_str_eq(dps_groupset_name(&g.dp, buf, sizeof(buf)), "DP");
	ck_assert_str_eq(dps_groupset_name(&g.comp_tp[2], buf, sizeof(buf)), "component TP (c=4)");
	ck_assert_str_eq(dps_groupset_name(&g.dp_col[3], buf, sizeof(buf)), "DP column (c=8)");
	dps_groups_free(&g);
}
END_TEST

/* ---- (f) the printed description ---- */

START_TEST(test_print_seed_grid)
{
	const struct dps_par_cfg cfg = mkcfg(8, 4, 4, 4, 4, 4, 4);
	char *out = print_to_string(&cfg);

	assert_line(out, "         TP rank:  0   1   2   3   4   5   6   7");
	assert_line(out, "         \u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500"
			 "\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500"
			 "\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500"
			 "\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500");
	assert_line(out, "  DP0:           [ 0   1   2   3   4   5   6   7 ]");
	assert_line(out, "  DP1:           [ 8   9  10  11  12  13  14  15 ]");
	assert_line(out, "  DP2:           [16  17  18  19  20  21  22  23 ]");
	assert_line(out, "  DP3:           [24  25  26  27  28  29  30  31 ]");
	/* The grid lines follow each other in the reference's order. */
	ck_assert_ptr_nonnull(strstr(out, "  0   1   2   3   4   5   6   7\n         \u2500"));
	ck_assert_ptr_nonnull(strstr(out, "\u2500\n  DP0:           [ 0"));
	ck_assert_ptr_nonnull(strstr(out, "7 ]\n  DP1:           [ 8"));

	ck_assert_ptr_nonnull(strstr(out, "TP=8"));
	ck_assert_ptr_nonnull(strstr(out, "DP=4"));
	ck_assert_ptr_nonnull(strstr(out, "world=32"));
	ck_assert_ptr_nonnull(strstr(out, "attention=4 embedding=4 mlp=4 draft-mlp=4 lm-head=4"));
	ck_assert_ptr_nonnull(strstr(out, "[0, 8, 16, 24]"));
	ck_assert_ptr_nonnull(strstr(out, "[7, 15, 23, 31]"));
	ck_assert_ptr_nonnull(strstr(out, "[24, 25, 26, 27, 28, 29, 30, 31]"));
	ck_assert_ptr_nonnull(strstr(out, "used by: attention, embedding, mlp, draft-mlp, lm-head"));
	ck_assert_ptr_nonnull(strstr(out, "component TP (c=4) = world"));
	ck_assert_ptr_nonnull(strstr(out, "DP column (c=4) = DP groups"));
	free(out);
}
END_TEST

START_TEST(test_print_mixed_and_wide)
{
	const struct dps_par_cfg mixed = mkcfg(2, 4, 2, 1, 4, 1, 1);
	const struct dps_par_cfg wide = mkcfg(16, 8, 1, 1, 1, 1, 1);
	char *out = print_to_string(&mixed);

	assert_line(out, "  DP3:           [ 6   7 ]");
	ck_assert_ptr_nonnull(strstr(out, "used by: embedding, draft-mlp, lm-head\n"));
	ck_assert_ptr_nonnull(strstr(out, "used by: attention\n"));
	ck_assert_ptr_nonnull(strstr(out, "used by: mlp\n"));
	ck_assert_ptr_nonnull(strstr(out, "component TP (c=1) = TP groups"));
	ck_assert_ptr_nonnull(strstr(out, "DP column (c=1): groups of one (self)"));
	ck_assert_ptr_nonnull(
		strstr(out, "embedding, draft-mlp, lm-head share one component TP (c=1)"));
	ck_assert_ptr_nonnull(strstr(out, "[0, 2]"));
	ck_assert_ptr_nonnull(strstr(out, "[5, 7]"));
	free(out);

	/* 3-digit ranks widen the cells; the rule still spans the rows. */
	out = print_to_string(&wide);
	assert_line(out, "         TP rank:   0   1   2   3   4   5   6   7   8   9  10  11  12"
			 "  13  14  15");
	assert_line(out, "  DP0:           [  0   1   2   3   4   5   6   7   8   9  10  11  12"
			 "  13  14  15 ]");
	assert_line(out, "  DP7:           [112 113 114 115 116 117 118 119 120 121 122 123 124"
			 " 125 126 127 ]");
	{
		const char *rule = strstr(out, "\n         \u2500") + 10;
		const char *row = strstr(out, "\n  DP7:") + 1;
		size_t n_rule = 0, row_len = (size_t)(strchr(row, '\n') - row);

		while (!strncmp(rule, "\u2500", 3)) {
			rule += 3;
			n_rule++;
		}
		ck_assert_uint_eq(9 + n_rule, row_len);
	}
	free(out);
}
END_TEST

/* ---- (g) the checker catches a corrupted set ---- */

START_TEST(test_checker_catches_faults)
{
	const struct dps_par_cfg cfg = mkcfg(8, 4, 4, 2, 1, 2, 4);
	struct dps_groups g;
	char why[256];
	int saved;

	build_ok(&cfg, &g);
	ck_assert_int_eq(check_groups(&g, why, sizeof(why)), 0);

	/* A repeated rank in a component TP set. */
	saved = g.comp_tp[1].ranks[5];
	g.comp_tp[1].ranks[5] = g.comp_tp[1].ranks[6];
	ck_assert_int_eq(check_set(&g, &g.comp_tp[1], why, sizeof(why)), -1);
	ck_assert_int_eq(check_groups(&g, why, sizeof(why)), -1);
	ck_assert_ptr_nonnull(strstr(why, "repeated"));
	g.comp_tp[1].ranks[5] = saved;
	ck_assert_int_eq(check_groups(&g, why, sizeof(why)), 0);

	/* Two members swapped: still a partition, but the wrong order for the oracle. */
	saved = g.dp_col[2].ranks[0];
	g.dp_col[2].ranks[0] = g.dp_col[2].ranks[1];
	g.dp_col[2].ranks[1] = saved;
	ck_assert_int_eq(check_groups(&g, why, sizeof(why)), -1);
	g.dp_col[2].ranks[1] = g.dp_col[2].ranks[0];
	g.dp_col[2].ranks[0] = saved;
	ck_assert_int_eq(check_groups(&g, why, sizeof(why)), 0);

	/* A wrong rank_in_group. */
	g.dp.rank_in_group[9]++;
	ck_assert_int_eq(check_groups(&g, why, sizeof(why)), -1);
	g.dp.rank_in_group[9]--;

	/* Broken aliasing: mlp (c=1) pointed at the c=2 set. */
	g.comp_tp_of[DPS_COMP_MLP] = &g.comp_tp[1];
	ck_assert_int_eq(check_groups(&g, why, sizeof(why)), -1);
	g.comp_tp_of[DPS_COMP_MLP] = &g.comp_tp[0];
	ck_assert_int_eq(check_groups(&g, why, sizeof(why)), 0);
	dps_groups_free(&g);
}
END_TEST

static Suite *groups_suite(void)
{
	Suite *s = suite_create("groups");
	TCase *tc;

	tc = tcase_create("layout");
	tcase_add_test(tc, test_seed_example);
	tcase_add_test(tc, test_mixed_tp2_dp4);
	tcase_add_test(tc, test_mixed_tp4_dp6);
	tcase_add_test(tc, test_aliasing);
	tcase_add_test(tc, test_size_one_sets);
	tcase_add_test(tc, test_names);
	suite_add_tcase(s, tc);

	tc = tcase_create("invariants");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_invariants_sweep);
	tcase_add_test(tc, test_largest_worlds);
	tcase_add_test(tc, test_checker_catches_faults);
	suite_add_tcase(s, tc);

	tc = tcase_create("config");
	tcase_add_test(tc, test_rejected);
	tcase_add_test(tc, test_accepted_limits);
	suite_add_tcase(s, tc);

	tc = tcase_create("print");
	tcase_add_test(tc, test_print_seed_grid);
	tcase_add_test(tc, test_print_mixed_and_wide);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(groups_suite());
	int failures;

	srunner_run_all(sr, CK_NORMAL);
	failures = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failures ? 1 : 0;
}

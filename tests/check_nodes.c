/* SPDX-License-Identifier: MIT */
/*
 * tests/check_nodes.c - the node-major numbering of engine/runtime/nodes.h: which groups of a
 * layout cross machines. Oracle: the ranks of each kind of group written out from the
 * definitions (TP group d = ranks d*TP .. d*TP + TP - 1, DP group t = t, t + TP, ...), and a
 * node's ranks as the consecutive block it runs, compared with what dps_nodes_print reports.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/groups.h"
#include "engine/runtime/nodes.h"
#include "tests/testutil.h"

/* Runs dps_nodes_print into a string (freed by the caller); *crossing gets its result. */
static char *report(const struct dps_par_cfg *cfg, int nodes, int *crossing)
{
	struct dps_groups g;
	char err[256], *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	ck_assert_ptr_nonnull(f);
	ck_assert_msg(!dps_groups_build(cfg, &g, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(dps_nodes_check(dps_groups_total(&g), nodes, err, sizeof(err)), 0);
	*crossing = dps_nodes_print(&g, nodes, f);
	dps_groups_free(&g);
	fclose(f);
	return buf;
}

/* How many groups of `size` ranks, group i holding ranks first(i) + stride * j, span more
 * than one node of `per` ranks. */
static int crossing_of(int groups, int size, int stride, int (*first)(int, int), int arg, int per)
{
	int n = 0;

	for (int i = 0; i < groups; i++) {
		const int a = first(i, arg), b = a + stride * (size - 1);

		n += a / per != b / per;
	}
	return n;
}

static int tp_first(int d, int tp)
{
	return d * tp;
}

static int dp_first(int t, int tp)
{
	(void)tp;
	return t;
}

START_TEST(test_reference_layout)
{
	/* TP=8 x DP=4, attention and MLP sizes 4: on 2 nodes of 16 and 4 of 8 the TP groups stay
	 * inside a node; the DP groups, the columns of size 4, the component group of 32 and the
	 * world cross. On 16 nodes of 2 every TP group spans 4 nodes. */
	const struct dps_par_cfg cfg = { .tp = 8, .dp = 4, .attn_dp = 4, .emb_dp = 1, .mlp_dp = 4,
					 .draft_mlp_dp = 1, .lm_head_dp = 1 };
	static const int node_counts[] = { 1, 2, 4, 16, 32 };

	for (size_t k = 0; k < sizeof(node_counts) / sizeof(node_counts[0]); k++) {
		const int nodes = node_counts[k], per = 32 / nodes;
		const int tp = crossing_of(4, 8, 1, tp_first, 8, per);
		const int dp = crossing_of(8, 4, 8, dp_first, 8, per);
		/* world + TP + DP + the c=1 sets (TP's groups and single ranks) + the c=4 sets
		 * (one group of all 32, and the DP columns) */
		const int want = (nodes > 1) + tp + dp + tp + 0 + (nodes > 1) + dp;
		int got;
		char *text = report(&cfg, nodes, &got);

		ck_assert_msg(got == want, "%d nodes: %d groups cross, expected %d\n%s", nodes, got,
			      want, text);
		if (nodes == 2 || nodes == 4)
			ck_assert_msg(strstr(text, "TP: every group inside one node"), "%s", text);
		if (nodes == 16)
			ck_assert_msg(strstr(text, "group 0 [0,1,2,3,4,5,6,7] spans nodes 0,1,2,3"),
				      "%s", text);
		free(text);
	}
}
END_TEST

START_TEST(test_prefill_part)
{
	/* TP=2 x DP=2 decoding (ranks 0-3) and 2 prefill replicas of TP 2 (ranks 4-7), on 2
	 * nodes: the decode part on node 0, the prefill part on node 1, nothing crosses; on 4
	 * nodes of 2 ranks the TP groups stay whole and the rest of each part crosses. */
	const struct dps_par_cfg cfg = { .tp = 2, .dp = 2, .attn_dp = 1, .emb_dp = 1, .mlp_dp = 1,
					 .draft_mlp_dp = 1, .lm_head_dp = 1, .prefill_dp = 2 };
	int got;
	char *text = report(&cfg, 2, &got);

	ck_assert_msg(got == 0, "%s", text);
	ck_assert_msg(strstr(text, "prefill part (instance ranks from 4)"), "%s", text);
	free(text);
	text = report(&cfg, 4, &got);
	/* each part's world group and its 2 DP groups (ranks d and d + TP, one node apart) */
	ck_assert_msg(got == 6, "%d\n%s", got, text);
	ck_assert_msg(strstr(text, "group 0 [4,5,6,7] spans nodes 2,3"), "%s", text);
	free(text);
}
END_TEST

START_TEST(test_refused)
{
	char err[256];

	ck_assert_int_eq(dps_nodes_check(32, 3, err, sizeof(err)), -DPS_ECONFIG);
	ck_assert_msg(strstr(err, "--nodes 3 does not divide"), "%s", err);
	ck_assert_int_eq(dps_nodes_check(32, 0, err, sizeof(err)), -DPS_ECONFIG);
	ck_assert_int_eq(dps_nodes_check(32, 64, err, sizeof(err)), -DPS_ECONFIG);
	ck_assert_int_eq(dps_nodes_check(32, 32, err, sizeof(err)), 0);
	ck_assert_int_eq(dps_node_of(31, 32, 4), 3);
	ck_assert_int_eq(dps_node_of(8, 32, 4), 1);
}
END_TEST

START_TEST(test_oracle_can_fail)
{
	/* The count for the wrong number of ranks per node disagrees with the report. */
	const struct dps_par_cfg cfg = { .tp = 8, .dp = 4, .attn_dp = 1, .emb_dp = 1, .mlp_dp = 1,
					 .draft_mlp_dp = 1, .lm_head_dp = 1 };
	int got;
	char *text = report(&cfg, 16, &got);

	ck_assert_int_ne(got, 1 + crossing_of(4, 8, 1, tp_first, 8, 8) +
				      crossing_of(8, 4, 8, dp_first, 8, 8));
	free(text);
}
END_TEST

static Suite *nodes_suite(void)
{
	Suite *s = suite_create("nodes");
	TCase *tc = tcase_create("numbering");

	tcase_add_test(tc, test_reference_layout);
	tcase_add_test(tc, test_prefill_part);
	tcase_add_test(tc, test_refused);
	tcase_add_test(tc, test_oracle_can_fail);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run_suite(nodes_suite());
}

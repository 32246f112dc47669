/* SPDX-License-Identifier: MIT */
/*
 * tests/check_placement.c - Check suite for engine/runtime/topo.c and engine/runtime/placement.c.
 *
 * Most tests run dps_place_compute on made-up topologies (1 node x 2 cores up to 8 nodes x
 * 8 cores) and compare against the placement the rules in placement.h predict by hand, then
 * run one invariant checker over a sweep of shapes; a deliberate-fault test proves that
 * checker fails on corrupted placements. --cpu-bind parsing and the real machine are in
 * tests/check_cpubind.c.
 */
#include <check.h>
#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/runtime/placement.h"
#include "engine/runtime/topo.h"

/* ---------------------------------------------------------------------------------------
 * Helpers
 */

/* Index in t->nodes of the node holding cpu, or -1. */
static int node_index_of_cpu(const struct dps_topo *t, int cpu)
{
	int k, i;

	for (k = 0; k < t->n_nodes; k++)
		for (i = 0; i < t->nodes[k].n_cpus; i++)
			if (t->nodes[k].cpus[i] == cpu)
				return k;
	return -1;
}

/*
 * The placement invariants: every rank has >= 1 CPU, all of them on one node of t, no CPU
 * twice in a rank, the memory node is that node's id (or -1 without NUMA), and when the
 * world fits in the CPUs no CPU is given to two ranks. Returns 0, or -1 with the reason in
 * why.
 */
static int check_invariants(const struct dps_topo *t, const struct dps_placement *p,
			    char *why, size_t len)
{
	int ncpus = dps_topo_ncpus(t), max_cpu = -1, r, i, j, k;
	int *owner = NULL;

	for (k = 0; k < t->n_nodes; k++)
		for (i = 0; i < t->nodes[k].n_cpus; i++)
			if (t->nodes[k].cpus[i] > max_cpu)
				max_cpu = t->nodes[k].cpus[i];
	owner = malloc(((size_t)max_cpu + 1) * sizeof(*owner));
	if (!owner) {
		snprintf(why, len, "out of memory");
		return -1;
	}
	for (i = 0; i <= max_cpu; i++)
		owner[i] = -1;

	for (r = 0; r < p->world; r++) {
		const struct dps_rank_place *rp = &p->ranks[r];
		int node = -1;

		if (rp->n_cpus < 1 || !rp->cpus) {
			snprintf(why, len, "rank %d has no CPU", r);
			goto fail;
		}
		for (i = 0; i < rp->n_cpus; i++) {
			k = node_index_of_cpu(t, rp->cpus[i]);
			if (k < 0) {
				snprintf(why, len, "rank %d has CPU %d not in the topology", r,
					 rp->cpus[i]);
				goto fail;
			}
			if (node >= 0 && k != node) {
				snprintf(why, len, "rank %d spans nodes %d and %d", r, node, k);
				goto fail;
			}
			node = k;
			for (j = 0; j < i; j++)
				if (rp->cpus[j] == rp->cpus[i]) {
					snprintf(why, len, "rank %d lists CPU %d twice", r,
						 rp->cpus[i]);
					goto fail;
				}
			if (p->world <= ncpus) {
				if (owner[rp->cpus[i]] >= 0) {
					snprintf(why, len, "CPU %d shared by ranks %d and %d",
						 rp->cpus[i], owner[rp->cpus[i]], r);
					goto fail;
				}
				owner[rp->cpus[i]] = r;
			}
		}
		if (rp->node != (t->numa ? t->nodes[node].id : -1)) {
			snprintf(why, len, "rank %d memory node %d, CPUs on node %d", r, rp->node,
				 t->nodes[node].id);
			goto fail;
		}
	}
	free(owner);
	return 0;
fail:
	free(owner);
	return -1;
}

/* Computes a placement on a synthetic topology and checks the invariants. */
static void place_synthetic(struct dps_topo *t, int n_nodes, int cpus, int tp, int dp,
			    struct dps_placement *p)
{
	char why[128] = "";

	ck_assert_int_eq(dps_topo_synthetic(t, n_nodes, cpus), 0);
	ck_assert_int_eq(dps_place_compute(t, tp, dp, p), 0);
	ck_assert_int_eq(p->world, tp * dp);
	ck_assert_msg(check_invariants(t, p, why, sizeof(why)) == 0, "%dx%d TP=%d DP=%d: %s",
		      n_nodes, cpus, tp, dp, why);
}

/* Asserts rank r has exactly the n CPUs first, first+1, ... on memory node `node`. */
static void assert_rank(const struct dps_placement *p, int r, int node, int first, int n)
{
	int i;

	ck_assert_int_eq(p->ranks[r].node, node);
	ck_assert_msg(p->ranks[r].n_cpus == n, "rank %d has %d CPUs, want %d", r,
		      p->ranks[r].n_cpus, n);
	for (i = 0; i < n; i++)
		ck_assert_msg(p->ranks[r].cpus[i] == first + i, "rank %d cpu[%d] = %d, want %d",
			      r, i, p->ranks[r].cpus[i], first + i);
}

/* dps_placement_print into a malloc'ed string. */
static char *print_to_string(const struct dps_placement *p, int tp)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	ck_assert_ptr_nonnull(f);
	dps_placement_print(p, tp, f);
	fclose(f);
	return buf;
}

/* ---------------------------------------------------------------------------------------
 * Synthetic topologies
 */

START_TEST(test_synthetic_topology)
{
	struct dps_topo t;

	ck_assert_int_eq(dps_topo_synthetic(&t, 3, 4), 0);
	ck_assert_int_eq(t.n_nodes, 3);
	ck_assert_int_eq(t.numa, 1);
	ck_assert_int_eq(dps_topo_ncpus(&t), 12);
	ck_assert_int_eq(t.nodes[2].id, 2);
	ck_assert_int_eq(t.nodes[2].cpus[0], 8);
	ck_assert_int_eq(t.nodes[2].cpus[3], 11);
	dps_topo_free(&t);
	dps_topo_free(&t); /* freeing twice is harmless */
	ck_assert_int_eq(dps_topo_ncpus(&t), 0);
	ck_assert_int_eq(dps_topo_synthetic(&t, 0, 4), -EINVAL);
	ck_assert_int_eq(dps_topo_synthetic(&t, 2, 0), -EINVAL);
	ck_assert_int_eq(dps_topo_synthetic(&t, 65536, 65536), -EINVAL);
}
END_TEST

START_TEST(test_compute_bad_args)
{
	struct dps_topo t, empty = { 0, NULL, 0 };
	struct dps_placement p = { 0, NULL };

	ck_assert_int_eq(dps_topo_synthetic(&t, 1, 2), 0);
	ck_assert_int_eq(dps_place_compute(&t, 0, 1, &p), -EINVAL);
	ck_assert_int_eq(dps_place_compute(&t, 1, 0, &p), -EINVAL);
	ck_assert_int_eq(dps_place_compute(&t, -2, -2, &p), -EINVAL);
	ck_assert_int_eq(dps_place_compute(&t, 65536, 65536, &p), -EINVAL);
	ck_assert_int_eq(dps_place_compute(&empty, 1, 1, &p), -EINVAL);
	ck_assert_int_eq(dps_place_compute(NULL, 1, 1, &p), -EINVAL);
	ck_assert_ptr_null(p.ranks);
	dps_topo_free(&t);
}
END_TEST

/* 1 node x 2 cores, one rank: it gets both cores. */
START_TEST(test_1x2_world1)
{
	struct dps_topo t;
	struct dps_placement p;

	place_synthetic(&t, 1, 2, 1, 1, &p);
	assert_rank(&p, 0, 0, 0, 2);
	dps_placement_free(&p);
	dps_topo_free(&t);
}
END_TEST

/* 1 node x 2 cores, two ranks (TP=2 or DP=2): one core each. */
START_TEST(test_1x2_world2)
{
	static const int shapes[][2] = { { 2, 1 }, { 1, 2 } };
	struct dps_topo t;
	struct dps_placement p;
	size_t s;

	for (s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		place_synthetic(&t, 1, 2, shapes[s][0], shapes[s][1], &p);
		assert_rank(&p, 0, 0, 0, 1);
		assert_rank(&p, 1, 0, 1, 1);
		dps_placement_free(&p);
		dps_topo_free(&t);
	}
}
END_TEST

/* 1 node x 2 cores, more ranks than cores: round-robin, one CPU each, world/2 per CPU. */
static void check_oversubscribed(int tp, int dp)
{
	struct dps_topo t;
	struct dps_placement p;
	int use[2] = { 0, 0 }, r;

	place_synthetic(&t, 1, 2, tp, dp, &p);
	for (r = 0; r < p.world; r++) {
		ck_assert_int_eq(p.ranks[r].n_cpus, 1);
		ck_assert_int_eq(p.ranks[r].cpus[0], r % 2);
		ck_assert_int_eq(p.ranks[r].node, 0);
		use[p.ranks[r].cpus[0]]++;
	}
	ck_assert_int_eq(use[0], p.world / 2);
	ck_assert_int_eq(use[1], p.world / 2);
	dps_placement_free(&p);
	dps_topo_free(&t);
}

START_TEST(test_1x2_world8)
{
	check_oversubscribed(8, 1);
	check_oversubscribed(2, 4);
	check_oversubscribed(1, 8);
}
END_TEST

START_TEST(test_1x2_world32)
{
	check_oversubscribed(8, 4);
	check_oversubscribed(32, 1);
	check_oversubscribed(4, 8);
}
END_TEST

/*
 * 2 sockets x 32 cores, TP=8 DP=4: shares 16 + 16, groups 0 and 2 on socket 0, 1 and 3 on
 * socket 1; 16 ranks on 32 cores gives 2 CPUs per rank, disjoint, memory on the socket.
 */
START_TEST(test_2x32_tp8_dp4)
{
	struct dps_topo t;
	struct dps_placement p;
	int d, i;

	place_synthetic(&t, 2, 32, 8, 4, &p);
	for (d = 0; d < 4; d++) {
		int socket = d % 2, slot = d / 2; /* slot: which of the socket's two groups */

		for (i = 0; i < 8; i++)
			assert_rank(&p, d * 8 + i, socket, socket * 32 + (slot * 8 + i) * 2, 2);
	}
	dps_placement_free(&p);
	dps_topo_free(&t);
}
END_TEST

/* 2 sockets x 32 cores, TP=4 DP=4: two whole groups per socket, 4 CPUs per rank. */
START_TEST(test_2x32_tp4_dp4)
{
	struct dps_topo t;
	struct dps_placement p;
	int d, i;

	place_synthetic(&t, 2, 32, 4, 4, &p);
	for (d = 0; d < 4; d++) {
		int socket = d % 2, slot = d / 2;

		for (i = 0; i < 4; i++)
			assert_rank(&p, d * 4 + i, socket, socket * 32 + (slot * 4 + i) * 4, 4);
	}
	dps_placement_free(&p);
	dps_topo_free(&t);
}
END_TEST

/* 2 sockets x 32 cores, TP=4 DP=2: one group per socket, 8 CPUs per rank. */
START_TEST(test_2x32_tp4_dp2)
{
	struct dps_topo t;
	struct dps_placement p;
	int d, i;

	place_synthetic(&t, 2, 32, 4, 2, &p);
	for (d = 0; d < 2; d++)
		for (i = 0; i < 4; i++)
			assert_rank(&p, d * 4 + i, d, d * 32 + i * 8, 8);
	dps_placement_free(&p);
	dps_topo_free(&t);
}
END_TEST

/*
 * 8 nodes x 8 cores, TP=8 DP=4: shares of 4 ranks per node, so each TP group is split over
 * two nodes (ranks 0-3 on node 2d, 4-7 on node 2d+1), 2 CPUs per rank.
 */
START_TEST(test_8x8_tp8_dp4)
{
	struct dps_topo t;
	struct dps_placement p;
	int d, i;

	place_synthetic(&t, 8, 8, 8, 4, &p);
	for (d = 0; d < 4; d++)
		for (i = 0; i < 8; i++) {
			int node = 2 * d + i / 4;

			assert_rank(&p, d * 8 + i, node, node * 8 + (i % 4) * 2, 2);
		}
	dps_placement_free(&p);
	dps_topo_free(&t);
}
END_TEST

/* 8 nodes x 8 cores, TP=8 DP=8: each TP group whole on its own node, 1 CPU each. */
START_TEST(test_8x8_tp8_dp8)
{
	struct dps_topo t;
	struct dps_placement p;
	int d, i;

	place_synthetic(&t, 8, 8, 8, 8, &p);
	for (d = 0; d < 8; d++)
		for (i = 0; i < 8; i++)
			assert_rank(&p, d * 8 + i, d, d * 8 + i, 1);
	dps_placement_free(&p);
	dps_topo_free(&t);
}
END_TEST

/*
 * 2 nodes x 3 cores, TP=2 DP=3: shares 3 + 3; group 0 on node 0, group 1 on node 1, group
 * 2 fits nowhere whole and is split (rank 4 on node 0, rank 5 on node 1).
 */
START_TEST(test_2x3_tp2_dp3)
{
	struct dps_topo t;
	struct dps_placement p;

	place_synthetic(&t, 2, 3, 2, 3, &p);
	assert_rank(&p, 0, 0, 0, 1);
	assert_rank(&p, 1, 0, 1, 1);
	assert_rank(&p, 4, 0, 2, 1);
	assert_rank(&p, 2, 1, 3, 1);
	assert_rank(&p, 3, 1, 4, 1);
	assert_rank(&p, 5, 1, 5, 1);
	dps_placement_free(&p);
	dps_topo_free(&t);
}
END_TEST

/*
 * Hand-made uneven topology without NUMA: node ids 0 and 3 with 4 and 2 CPUs. Three ranks
 * share out 2 + 1; memory is never bound (node -1).
 */
START_TEST(test_uneven_nodes)
{
	int cpus0[] = { 0, 1, 2, 3 }, cpus3[] = { 10, 11 };
	struct dps_topo_node nodes[] = { { 0, 4, cpus0 }, { 3, 2, cpus3 } };
	struct dps_topo t = { 2, nodes, 0 };
	struct dps_placement p;
	char why[128] = "";

	ck_assert_int_eq(dps_place_compute(&t, 1, 3, &p), 0);
	ck_assert_msg(check_invariants(&t, &p, why, sizeof(why)) == 0, "%s", why);
	assert_rank(&p, 0, -1, 0, 2);
	assert_rank(&p, 1, -1, 2, 2);
	assert_rank(&p, 2, -1, 10, 2);
	dps_placement_free(&p);

	/* TP=3 does not fit in either share (2 and 1): split 2 on node 0, 1 on node 3. */
	ck_assert_int_eq(dps_place_compute(&t, 3, 1, &p), 0);
	assert_rank(&p, 0, -1, 0, 2);
	assert_rank(&p, 1, -1, 2, 2);
	assert_rank(&p, 2, -1, 10, 2);
	dps_placement_free(&p);
}
END_TEST

/* Largest remainder with ties: 3 single-CPU nodes, 2 ranks go to nodes 0 and 1. */
START_TEST(test_remainder_tie_break)
{
	struct dps_topo t;
	struct dps_placement p;

	place_synthetic(&t, 3, 1, 1, 2, &p);
	assert_rank(&p, 0, 0, 0, 1);
	assert_rank(&p, 1, 1, 1, 1);
	dps_placement_free(&p);

	/* 1 rank on 2 x 2: it gets node 0, both CPUs. */
	dps_topo_free(&t);
	place_synthetic(&t, 2, 2, 1, 1, &p);
	assert_rank(&p, 0, 0, 0, 2);
	dps_placement_free(&p);
	dps_topo_free(&t);
}
END_TEST

/* The same input twice gives the same output; invariants hold over a sweep of shapes. */
START_TEST(test_sweep_deterministic)
{
	int nodes, cpus, tp, dp, r;

	for (nodes = 1; nodes <= 4; nodes++)
		for (cpus = 1; cpus <= 8; cpus++)
			for (tp = 1; tp <= 8; tp++)
				for (dp = 1; dp <= 6; dp++) {
					struct dps_topo t;
					struct dps_placement a, b;

					place_synthetic(&t, nodes, cpus, tp, dp, &a);
					ck_assert_int_eq(dps_place_compute(&t, tp, dp, &b), 0);
					ck_assert_int_eq(a.world, b.world);
					for (r = 0; r < a.world; r++) {
						ck_assert_int_eq(a.ranks[r].node, b.ranks[r].node);
						ck_assert_int_eq(a.ranks[r].n_cpus,
								 b.ranks[r].n_cpus);
						ck_assert(!memcmp(a.ranks[r].cpus, b.ranks[r].cpus,
								  (size_t)a.ranks[r].n_cpus *
								  sizeof(int)));
					}
					dps_placement_free(&a);
					dps_placement_free(&b);
					dps_topo_free(&t);
				}
}
END_TEST

/* The checker must catch a corrupted placement, or the tests above prove nothing. */
START_TEST(test_checker_catches_faults)
{
	struct dps_topo t;
	struct dps_placement p;
	char why[128] = "";
	int saved, saved_n;

	place_synthetic(&t, 2, 32, 4, 2, &p);

	saved = p.ranks[1].cpus[0];
	p.ranks[1].cpus[0] = p.ranks[0].cpus[0];
	ck_assert_int_eq(check_invariants(&t, &p, why, sizeof(why)), -1);
	ck_assert_msg(strstr(why, "shared"), "unexpected reason: %s", why);
	p.ranks[1].cpus[0] = saved;
	ck_assert_int_eq(check_invariants(&t, &p, why, sizeof(why)), 0);

	saved = p.ranks[0].cpus[1];
	p.ranks[0].cpus[1] = 40; /* a CPU of the other socket */
	ck_assert_int_eq(check_invariants(&t, &p, why, sizeof(why)), -1);
	ck_assert_msg(strstr(why, "spans nodes"), "unexpected reason: %s", why);
	p.ranks[0].cpus[1] = 99; /* a CPU that does not exist */
	ck_assert_int_eq(check_invariants(&t, &p, why, sizeof(why)), -1);
	p.ranks[0].cpus[1] = saved;

	p.ranks[5].node = 0; /* rank 5 runs on socket 1 */
	ck_assert_int_eq(check_invariants(&t, &p, why, sizeof(why)), -1);
	p.ranks[5].node = 1;

	saved_n = p.ranks[7].n_cpus;
	p.ranks[7].n_cpus = 0;
	ck_assert_int_eq(check_invariants(&t, &p, why, sizeof(why)), -1);
	ck_assert_msg(strstr(why, "no CPU"), "unexpected reason: %s", why);
	p.ranks[7].n_cpus = saved_n;

	ck_assert_int_eq(check_invariants(&t, &p, why, sizeof(why)), 0);
	dps_placement_free(&p);
	dps_topo_free(&t);
}
END_TEST

START_TEST(test_print)
{
	struct dps_topo t;
	struct dps_placement p;
	char *s;

	place_synthetic(&t, 2, 32, 8, 4, &p);
	s = print_to_string(&p, 8);
	ck_assert_ptr_nonnull(strstr(s, "rank 0 (DP 0, TP 0): node 0, cpus 0-1\n"));
	ck_assert_ptr_nonnull(strstr(s, "rank 3 (DP 0, TP 3): node 0, cpus 6-7\n"));
	ck_assert_ptr_nonnull(strstr(s, "rank 31 (DP 3, TP 7): node 1, cpus 62-63\n"));
	free(s);
	dps_placement_free(&p);
	dps_topo_free(&t);

	ck_assert_int_eq(dps_place_parse_bind("0-3,5,7-8,10:off", 2, NULL, &p, NULL, 0), -EINVAL);
	ck_assert_int_eq(dps_place_parse_bind("10,0-3,5,8,7:4", 2, NULL, &p, NULL, 0), 0);
	s = print_to_string(&p, 2);
	ck_assert_str_eq(s, "rank 0 (DP 0, TP 0): no memory binding, cpus 0-3,5,7-8,10\n"
			    "rank 1 (DP 0, TP 1): no memory binding, cpus 4\n");
	free(s);
	dps_placement_free(&p);

	ck_assert_int_eq(dps_place_parse_bind("off", 2, NULL, &p, NULL, 0), 0);
	s = print_to_string(&p, 1);
	ck_assert_str_eq(s, "rank 0 (DP 0, TP 0): no memory binding, not pinned\n"
			    "rank 1 (DP 1, TP 0): no memory binding, not pinned\n");
	free(s);
	dps_placement_free(&p);
}
END_TEST

static Suite *placement_suite(void)
{
	Suite *s = suite_create("placement");
	TCase *tc = tcase_create("compute");

	tcase_add_test(tc, test_synthetic_topology);
	tcase_add_test(tc, test_compute_bad_args);
	tcase_add_test(tc, test_1x2_world1);
	tcase_add_test(tc, test_1x2_world2);
	tcase_add_test(tc, test_1x2_world8);
	tcase_add_test(tc, test_1x2_world32);
	tcase_add_test(tc, test_2x32_tp8_dp4);
	tcase_add_test(tc, test_2x32_tp4_dp4);
	tcase_add_test(tc, test_2x32_tp4_dp2);
	tcase_add_test(tc, test_8x8_tp8_dp4);
	tcase_add_test(tc, test_8x8_tp8_dp8);
	tcase_add_test(tc, test_2x3_tp2_dp3);
	tcase_add_test(tc, test_uneven_nodes);
	tcase_add_test(tc, test_remainder_tie_break);
	tcase_add_test(tc, test_sweep_deterministic);
	tcase_add_test(tc, test_checker_catches_faults);
	tcase_add_test(tc, test_print);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(placement_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* SPDX-License-Identifier: MIT */
/*
 * tests/check_placement.c - Check suite for engine/runtime/topo.c and engine/runtime/placement.c.
 *
 * Most tests run dps_place_compute on made-up topologies (1 node x 2 cores up to 8 nodes x
 * 8 cores) and compare against the placement the rules in placement.h predict by hand, then
 * run one invariant checker over a sweep of shapes; a deliberate-fault test proves that
 * checker fails on corrupted placements. --cpu-bind parsing is tested on good and malformed
 * input plus a small deterministic fuzz loop. Two tests touch the real machine: a topology
 * discovery smoke test and dps_place_apply in a forked child.
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

/* ---------------------------------------------------------------------------------------
 * --cpu-bind
 */

static void assert_cpus(const struct dps_rank_place *rp, int n, const int *want)
{
	int i;

	ck_assert_int_eq(rp->node, -1);
	ck_assert_int_eq(rp->n_cpus, n);
	for (i = 0; i < n; i++)
		ck_assert_int_eq(rp->cpus[i], want[i]);
}

START_TEST(test_bind_auto_off)
{
	struct dps_placement p = { 12345, NULL };
	char err[256];
	int r;

	ck_assert_int_eq(dps_place_parse_bind("auto", 4, NULL, &p, err, sizeof(err)), 1);
	ck_assert_int_eq(p.world, 12345); /* untouched */
	ck_assert_ptr_null(p.ranks);

	ck_assert_int_eq(dps_place_parse_bind("off", 4, NULL, &p, err, sizeof(err)), 0);
	ck_assert_int_eq(p.world, 4);
	for (r = 0; r < 4; r++) {
		ck_assert_int_eq(p.ranks[r].n_cpus, 0);
		ck_assert_int_eq(p.ranks[r].node, -1);
	}
	dps_placement_free(&p);
}
END_TEST

START_TEST(test_bind_lists)
{
	static const int c01[] = { 0, 1 }, c23[] = { 2, 3 }, c02[] = { 0, 2 }, c13[] = { 1, 3 };
	static const int c0_3[] = { 0, 1, 2, 3 };
	struct dps_placement p;
	struct dps_topo t;
	char err[256];
	int r;

	ck_assert_int_eq(dps_place_parse_bind("0-1:2-3", 2, NULL, &p, err, sizeof(err)), 0);
	ck_assert_int_eq(p.world, 2);
	assert_cpus(&p.ranks[0], 2, c01);
	assert_cpus(&p.ranks[1], 2, c23);
	dps_placement_free(&p);

	ck_assert_int_eq(dps_place_parse_bind("0,2:1,3", 2, NULL, &p, err, sizeof(err)), 0);
	assert_cpus(&p.ranks[0], 2, c02);
	assert_cpus(&p.ranks[1], 2, c13);
	dps_placement_free(&p);

	/* One list for every rank. */
	ck_assert_int_eq(dps_place_parse_bind("0-3", 4, NULL, &p, err, sizeof(err)), 0);
	ck_assert_int_eq(p.world, 4);
	for (r = 0; r < 4; r++)
		assert_cpus(&p.ranks[r], 4, c0_3);
	dps_placement_free(&p);

	/* Duplicates and order do not matter; leading zeros are plain decimal. */
	ck_assert_int_eq(dps_place_parse_bind("3,1-2,0,2,003", 1, NULL, &p, err, sizeof(err)),
			 0);
	assert_cpus(&p.ranks[0], 4, c0_3);
	dps_placement_free(&p);

	/* Checked against a topology. */
	ck_assert_int_eq(dps_topo_synthetic(&t, 2, 2), 0);
	ck_assert_int_eq(dps_place_parse_bind("0,2:1,3", 2, &t, &p, err, sizeof(err)), 0);
	assert_cpus(&p.ranks[0], 2, c02);
	dps_placement_free(&p);
	dps_topo_free(&t);
}
END_TEST

struct bad_bind {
	const char *spec;
	int world;
	int with_topo; /* check against a 2 x 4 topology (CPUs 0-7) */
	const char *needle;
};

static const struct bad_bind bad_binds[] = {
	{ "", 2, 0, "empty value" },
	{ "0-1::2-3", 3, 0, "CPU list 2 is empty" },
	{ ":", 2, 0, "CPU list 1 is empty" },
	{ "0:", 2, 0, "CPU list 2 is empty" },
	{ "0,", 1, 0, "empty entry" },
	{ ",0", 1, 0, "empty entry" },
	{ "0,,1", 1, 0, "empty entry" },
	{ "a", 1, 0, "bad CPU number" },
	{ "1-", 1, 0, "bad CPU number" },
	{ "-1", 1, 0, "bad CPU number" },
	{ "1-2-3", 1, 0, "bad CPU number" },
	{ " 1", 1, 0, "bad CPU number" },
	{ "1 ", 1, 0, "bad CPU number" },
	{ "+1", 1, 0, "bad CPU number" },
	{ "0x1", 1, 0, "bad CPU number" },
	{ "1.5", 1, 0, "bad CPU number" },
	{ "AUTO", 1, 0, "bad CPU number" },
	{ "3-1", 1, 0, "reversed range" },
	{ "0:1:2", 4, 0, "--cpu-bind has 3 CPU lists for 4 ranks" },
	{ "0:1", 1, 0, "--cpu-bind has 2 CPU lists for 1 rank " },
	{ "99999999999999999999999999999", 1, 0, "too large" },
	{ "0-4294967296", 1, 0, "too large" },
	{ "8192", 1, 0, "too large" },
	{ "2147483647", 1, 0, "too large" },
	{ "8", 1, 1, "too large" },
	{ "0-1:5,9", 2, 1, "too large" },
	{ "0-1:3", 2, 2, "CPU 3 in CPU list 2 is not one this process may use (usable CPUs: "
			 "0-2,4-7)" },
};

START_TEST(test_bind_malformed)
{
	const struct bad_bind *b = &bad_binds[_i];
	struct dps_placement p = { 777, NULL };
	struct dps_topo t = { 0, NULL, 0 };
	char err[256] = "untouched";
	char small[8];
	int ret;

	ck_assert_int_eq(dps_topo_synthetic(&t, 2, 4), 0);
	if (b->with_topo == 2) {
		/* CPU 3 is not usable here (say, taskset excluded it). */
		t.nodes[0].n_cpus = 3;
	}
	ret = dps_place_parse_bind(b->spec, b->world, b->with_topo ? &t : NULL, &p, err,
				   sizeof(err));
	ck_assert_msg(ret == -EINVAL, "'%s' (world %d) gave %d", b->spec, b->world, ret);
	ck_assert_msg(strstr(err, "--cpu-bind"), "'%s': message '%s' does not name --cpu-bind",
		      b->spec, err);
	ck_assert_msg(strstr(err, b->needle), "'%s': message '%s' lacks '%s'", b->spec, err,
		      b->needle);
	ck_assert_int_eq(p.world, 777); /* out untouched on error */
	ck_assert_ptr_null(p.ranks);

	/* No message buffer, or a tiny one, must be safe too. */
	ck_assert_int_eq(dps_place_parse_bind(b->spec, b->world, b->with_topo ? &t : NULL, &p,
					      NULL, 0), -EINVAL);
	ck_assert_int_eq(dps_place_parse_bind(b->spec, b->world, b->with_topo ? &t : NULL, &p,
					      small, sizeof(small)), -EINVAL);
	ck_assert_uint_lt(strlen(small), sizeof(small));
	t.nodes[0].n_cpus = 4;
	dps_topo_free(&t);
}
END_TEST

START_TEST(test_bind_bad_world)
{
	struct dps_placement p = { 0, NULL };
	char err[128];

	ck_assert_int_eq(dps_place_parse_bind("0", 0, NULL, &p, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "--cpu-bind"));
	ck_assert_int_eq(dps_place_parse_bind(NULL, 1, NULL, &p, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "--cpu-bind"));
}
END_TEST

/* Random strings over the list alphabet: never crash; what parses is well formed. */
START_TEST(test_bind_fuzz)
{
	static const char alphabet[] = "0123456789-,:x ";
	struct dps_topo t;
	char spec[24], err[256];
	unsigned int seed = 12345;
	int iter, len, i, r, ok = 0;

	ck_assert_int_eq(dps_topo_synthetic(&t, 2, 4), 0);
	for (iter = 0; iter < 50000; iter++) {
		struct dps_placement p = { 0, NULL };
		int world = 1 + (int)(rand_r(&seed) % 3);
		int ret;

		len = (int)(rand_r(&seed) % (sizeof(spec) - 1));
		for (i = 0; i < len; i++)
			spec[i] = alphabet[rand_r(&seed) % (sizeof(alphabet) - 1)];
		spec[len] = '\0';
		ret = dps_place_parse_bind(spec, world, (iter & 1) ? &t : NULL, &p, err,
					   sizeof(err));
		if (ret != 0) {
			ck_assert_msg(ret == -EINVAL, "'%s' gave %d", spec, ret);
			ck_assert_msg(strstr(err, "--cpu-bind"), "'%s': '%s'", spec, err);
			continue;
		}
		ok++;
		ck_assert_int_eq(p.world, world);
		for (r = 0; r < world; r++) {
			ck_assert_int_ge(p.ranks[r].n_cpus, 1);
			for (i = 0; i < p.ranks[r].n_cpus; i++) {
				ck_assert_int_ge(p.ranks[r].cpus[i], 0);
				if (iter & 1)
					ck_assert_int_lt(p.ranks[r].cpus[i], 8);
				if (i)
					ck_assert_int_gt(p.ranks[r].cpus[i],
							 p.ranks[r].cpus[i - 1]);
			}
		}
		dps_placement_free(&p);
	}
	ck_assert_int_gt(ok, 0); /* the fuzzer did reach the success path */
	dps_topo_free(&t);
}
END_TEST

/* ---------------------------------------------------------------------------------------
 * This machine
 */

START_TEST(test_discover)
{
	struct dps_topo t;
	cpu_set_t set;
	int k, i, n = 0;

	ck_assert_int_eq(dps_topo_discover(&t), 0);
	ck_assert_int_ge(t.n_nodes, 1);
	ck_assert_int_ge(dps_topo_ncpus(&t), 1);
	ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
	for (k = 0; k < t.n_nodes; k++) {
		ck_assert_int_ge(t.nodes[k].n_cpus, 1);
		for (i = 0; i < t.nodes[k].n_cpus; i++) {
			int cpu = t.nodes[k].cpus[i];

			if (i)
				ck_assert_int_gt(cpu, t.nodes[k].cpus[i - 1]);
			if (cpu < CPU_SETSIZE)
				ck_assert_msg(CPU_ISSET(cpu, &set), "CPU %d not in affinity", cpu);
			n++;
		}
	}
	ck_assert_int_le(n, CPU_COUNT(&set));
	fprintf(stderr, "check_placement: %d node(s), %d CPU(s), numa %d\n", t.n_nodes,
		dps_topo_ncpus(&t), t.numa);
	dps_topo_free(&t);
}
END_TEST

/* Child side of test_apply; returns the exit status. */
static int apply_child(void)
{
	struct dps_topo t;
	struct dps_rank_place rp, none = { -1, 0, NULL };
	cpu_set_t before, after;
	int cpu, k, mode = -1;

	if (dps_topo_discover(&t) || t.n_nodes < 1)
		return 10;
	/* The last usable CPU, so the test differs from a fresh process's default. */
	k = t.n_nodes - 1;
	cpu = t.nodes[k].cpus[t.nodes[k].n_cpus - 1];
	rp.node = t.numa ? t.nodes[k].id : -1;
	rp.n_cpus = 1;
	rp.cpus = &cpu;

	/* n_cpus == 0 leaves the affinity alone. */
	if (sched_getaffinity(0, sizeof(before), &before))
		return 11;
	if (dps_place_apply(&none))
		return 12;
	if (sched_getaffinity(0, sizeof(after), &after) || !CPU_EQUAL(&before, &after))
		return 13;

	if (dps_place_apply(&rp))
		return 14;
	if (sched_getaffinity(0, sizeof(after), &after))
		return 15;
	if (CPU_COUNT(&after) != 1 || !CPU_ISSET(cpu, &after))
		return 16;
	if (rp.node >= 0) {
		if (get_mempolicy(&mode, NULL, 0, NULL, 0) || mode != MPOL_BIND)
			return 17;
	}
	{
		int bad = -1;
		struct dps_rank_place neg = { -1, 1, &bad };

		if (dps_place_apply(&neg) != -EINVAL)
			return 18;
	}
	dps_topo_free(&t);
	return 0;
}

START_TEST(test_apply)
{
	int status = -1;
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(apply_child());
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "apply child failed: status 0x%x (exit code names the step)", status);
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

	tc = tcase_create("cpu_bind");
	tcase_add_test(tc, test_bind_auto_off);
	tcase_add_test(tc, test_bind_lists);
	tcase_add_loop_test(tc, test_bind_malformed, 0,
			    (int)(sizeof(bad_binds) / sizeof(bad_binds[0])));
	tcase_add_test(tc, test_bind_bad_world);
	tcase_add_test(tc, test_bind_fuzz);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);

	tc = tcase_create("machine");
	tcase_add_test(tc, test_discover);
	tcase_add_test(tc, test_apply);
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

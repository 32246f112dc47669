/* SPDX-License-Identifier: MIT */
/*
 * tests/xnode_check.c - the collectives of groups that cross nodes over MPI
 * (engine/runtime/xnode.c), run by tests/xnode.sh as `mpirun -np N xnode_check`: each MPI
 * process is one node's supervisor, with its own segment and its own forked ranks, sharing
 * nothing with the others but MPI. For several layouts (DP groups and DP columns striding
 * across the nodes, component groups spanning them, groups on one node beside them), every
 * rank runs every operation in f32, bf16 and i32 at sizes of 0 to several pieces, compares
 * with tests/oracle.h's serial in-order result bit for bit, and reports to node 0 through the
 * supervisors (its message crosses MPI too). Node 0 requires a report from every rank of
 * every node, no mismatch, and equal all-reduce results within each group. To show the
 * comparison can fail, a last run perturbs one rank's input on the last node and must fail.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/supervisor.h"
#include "engine/runtime/xlink.h"
#include "tests/oracle.h"

struct job {
	struct dps_par_cfg par;
	int fault_rank;
};

struct report {
	int rank, fails;
	uint64_t hash;    /* of its DP group's all-reduce results, the same within the group */
	int group;        /* the first member of its DP group */
};

static struct report reports[1024];
static int n_reports;

static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
	return h;
}

static int bad(const char *op, enum dps_dtype t, size_t count, int rank)
{
	static int told;

	if (told++ < 2) /* (the perturbed run's are many) */
		fprintf(stderr, "xnode_check: rank %d: %s %s count %zu differs from the oracle\n", rank,
		op, dps_dtype_name(t), count);
	return 1;
}

/* Every operation on c; returns the mismatches; *hash gets the all-reduce results'. */
static int run_ops(struct dps_world *w, struct dps_comm *c, int fault, uint64_t *hash)
{
	const size_t sizes[] = { 0, 1, 63, 4097, 70001 }; /* the last: two rounds of 256 KiB */
	const int n = c->n;
	const size_t cap = (size_t)n * (70001 + (size_t)n) * 4;
	unsigned char *a = malloc(cap), *b = malloc(cap), *want = malloc(cap);
	size_t *cnt = malloc(sizeof(size_t) * (size_t)n), *rcnt = malloc(sizeof(size_t) * (size_t)n);
	int fails = 0;

	if (!a || !b || !want || !cnt || !rcnt)
		return 1000;
	for (int t = 0; t < DPS_DTYPE_COUNT; t++) {
		const enum dps_dtype dt = (enum dps_dtype)t;
		const size_t esz = dps_dtype_size(dt);

		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
			const size_t count = sizes[si];
			const uint32_t salt = (uint32_t)(t * 97 + si * 13 + c->ranks[0] * 7);
			size_t at = 0;

			/* all-reduce, in place */
			gen(dt, a, count, (uint32_t)c->me, 0, salt);
			if (fault && count)
				a[0] ^= 0x40;
			for (size_t j = 0; j < count; j++)
				oracle_sum(dt, want + j * esz, (uint32_t)n, (uint32_t)j, salt);
			if (dps_coll_allreduce(c, a, a, count, dt))
				return 1000;
			if (memcmp(a, want, count * esz))
				fails += bad("all-reduce", dt, count, w->rank);
			*hash = fnv(a, count * esz, *hash);
			/* all-gather-v: member m gives count + m elements (member 0 none when count 0) */
			for (int m = 0; m < n; m++) {
				cnt[m] = count ? count + (size_t)m : (size_t)m % 2;
				gen(dt, want + at * esz, cnt[m], (uint32_t)m, 0, salt + 1);
				at += cnt[m];
			}
			gen(dt, a, cnt[c->me], (uint32_t)c->me, 0, salt + 1);
			if (dps_coll_allgatherv(c, a, b, cnt, NULL, dt))
				return 1000;
			if (memcmp(b, want, at * esz))
				fails += bad("all-gather-v", dt, count, w->rank);
			/* reduce-scatter: block q (count elements) of every member summed for q */
			gen(dt, a, count * (size_t)n, (uint32_t)c->me, 0, salt + 2);
			for (size_t j = 0; j < count; j++)
				oracle_sum(dt, want + j * esz, (uint32_t)n,
					   (uint32_t)((size_t)c->me * count + j), salt + 2);
			if (dps_coll_reducescatter(c, a, b, count, dt))
				return 1000;
			if (memcmp(b, want, count * esz))
				fails += bad("reduce-scatter", dt, count, w->rank);
			/* all-to-all-v: member i sends (i + j) % 3 + count elements to member j */
			{
				size_t sat = 0, rat = 0;

				for (int j = 0; j < n; j++) {
					cnt[j] = (size_t)((c->me + j) % 3) + count;
					rcnt[j] = (size_t)((j + c->me) % 3) + count;
					/* the block for j: its elements numbered from j * 1000000 */
					gen(dt, a + sat * esz, cnt[j], (uint32_t)c->me,
					    (uint32_t)j * 1000000u, salt + 3);
					gen(dt, want + rat * esz, rcnt[j], (uint32_t)j,
					    (uint32_t)c->me * 1000000u, salt + 3);
					sat += cnt[j];
					rat += rcnt[j];
				}
				if (dps_coll_alltoallv(c, a, cnt, NULL, b, rcnt, NULL, dt))
					return 1000;
				if (memcmp(b, want, rat * esz))
					fails += bad("all-to-all-v", dt, count, w->rank);
			}
			/* broadcast from the last member */
			gen(dt, want, count, (uint32_t)n - 1, 0, salt + 4);
			if (c->me == n - 1)
				memcpy(a, want, count * esz);
			else
				memset(a, 0x5A, count * esz);
			if (dps_coll_bcast(c, a, count, dt, n - 1))
				return 1000;
			if (memcmp(a, want, count * esz))
				fails += bad("broadcast", dt, count, w->rank);
		}
	}
	if (dps_coll_barrier(c))
		return 1000;
	free(a);
	free(b);
	free(want);
	free(cnt);
	free(rcnt);
	return fails;
}

static int rank_fn(struct dps_world *w, void *arg)
{
	const struct job *j = arg;
	struct report r = { w->rank, 0, 0xcbf29ce484222325ull, w->dp_c->ranks[0] };
	struct dps_comm *cs[4] = { w->dp_c, w->world_c, w->comp_tp_c[DPS_COMP_MLP],
				   w->dp_col_c[DPS_COMP_ATTN] };

	for (int i = 0; i < 4; i++) {
		int seen = 0;

		for (int k = 0; k < i; k++)
			seen |= cs[k] == cs[i];
		if (cs[i] && cs[i]->n > 1 && !seen) {
			uint64_t h = r.hash;

			r.fails += run_ops(w, cs[i], w->rank == j->fault_rank, i ? &h : &r.hash);
		}
	}
	return dps_ring_push(&w->to_sup, &r, sizeof(r), 0);
}

static void on_msg(int rank, const void *msg, size_t len, void *arg)
{
	(void)arg;
	if (len == sizeof(struct report) && n_reports < 1024) {
		memcpy(&reports[n_reports], msg, len);
		if (reports[n_reports].rank != rank)
			reports[n_reports].fails += 1000; /* arrived as another rank's */
		n_reports++;
	}
}

/* Runs one layout; on node 0 returns the number of problems found. */
static int run(const struct job *j, int nodes)
{
	struct dps_sup_opts o = { .par = j->par, .rank_fn = rank_fn, .rank_arg = (void *)j,
				  .msg_fn = on_msg, .nodes_ok = 1, .cpu_bind = "off" };
	struct dps_sup_result res;
	char err[512];
	int rc, problems = 0, world = j->par.tp * j->par.dp;

	o.par.nodes = nodes;
	n_reports = 0;
	rc = dps_sup_run(&o, &res, err, sizeof(err));
	if (dps_sup_node() > 0)
		return 0;
	if (rc) {
		fprintf(stderr, "xnode_check: TP %d x DP %d on %d nodes: %s\n", j->par.tp, j->par.dp,
			nodes, err);
		return 1;
	}
	if (n_reports != world) {
		fprintf(stderr, "xnode_check: %d reports from %d ranks\n", n_reports, world);
		problems++;
	}
	for (int i = 0; i < n_reports; i++) {
		problems += reports[i].fails;
		for (int k = 0; k < n_reports; k++)
			if (reports[k].group == reports[i].group && reports[k].hash != reports[i].hash) {
				fprintf(stderr, "xnode_check: ranks %d and %d disagree\n",
					reports[i].rank, reports[k].rank);
				problems++;
			}
	}
	return problems;
}

int main(void)
{
	const char *size = getenv("OMPI_COMM_WORLD_SIZE");
	const int nodes = size ? atoi(size) : 0;
	const struct job jobs[] = {
		/* DP groups = the world, striding over every node */
		{ { 1, 2 * nodes, 1, 1, 1, 1, 1 }, -1 },
		/* TP groups inside nodes; DP groups, attention columns and MLP groups across */
		{ { 2, 2 * nodes, 2, 1, 2 * nodes, 1, 1 }, -1 },
	};
	struct job fault = jobs[0];
	int problems = 0;

	if (nodes < 2) {
		fprintf(stderr, "xnode_check: run under mpirun with 2 or more processes\n");
		return 2;
	}
	dps_xlink_mpi_register();
	for (size_t i = 0; i < sizeof(jobs) / sizeof(jobs[0]); i++) {
		const int p = run(&jobs[i], nodes);

		if (dps_sup_node() == 0)
			printf("xnode_check: TP %d x DP %d on %d nodes: %s\n", jobs[i].par.tp,
			       jobs[i].par.dp, nodes, p ? "FAIL" : "ok");
		problems += p;
	}
	/* the check can fail: one input perturbed on the last node is seen on node 0 */
	fault.fault_rank = 2 * nodes - 1;
	if (dps_sup_node() == 0)
		fprintf(stderr, "xnode_check: now a run with a perturbed input, which must fail:\n");
	if (run(&fault, nodes) == 0 && dps_sup_node() == 0) {
		fprintf(stderr, "xnode_check: a perturbed input went unnoticed\n");
		problems++;
	}
	if (dps_sup_node() == 0)
		printf("xnode_check: %d nodes: %s\n", nodes, problems ? "FAIL" : "ok");
	return problems ? 1 : 0;
}

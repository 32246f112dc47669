/* SPDX-License-Identifier: MIT */
/*
 * tests/check_cpubind.c - Check suite for the --cpu-bind parser of engine/runtime/placement.c
 * (good and malformed input, a world the lists do not fit, a small deterministic fuzz loop)
 * and for the real machine: a topology discovery smoke test (engine/runtime/topo.c) and
 * dps_place_apply in a forked child.
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
#include "tests/testutil.h"


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

static Suite *cpubind_suite(void)
{
	Suite *s = suite_create("cpubind");
	TCase *tc = tcase_create("cpu_bind");

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
	return test_run_suite(cpubind_suite());
}

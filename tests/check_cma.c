/* SPDX-License-Identifier: MIT */
/*
 * tests/check_cma.c - the single-copy all-gather's agreements (shm/coll_cma.c), on real rank
 * processes: a member whose reads the kernel refuses makes every member fall back to the slots
 * with correct results, for good; a member on the slots while the others take the single copy
 * makes every member fail the call alike, and the group works after it. (check_coll runs the
 * path itself against the oracle at every size.)
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/supervisor.h"
#include "shm/coll.h"
#include "tests/oracle.h"
#include "tests/testutil.h"

/*
 * The single-copy all-gather (shm/coll_cma.c) when the kernel refuses a member's reads: that
 * member (cma = 2 pretends) says so in the closing step, every member takes the slots for this
 * call and the later ones, and every result is still the oracle's.
 */
static int cma_fallback_rank(struct dps_world *w, void *arg)
{
	struct dps_comm *c = w->world_c;
	const size_t count = 30000; /* f32, 3 members: in [DPS_COLL_CMA_MIN, DPS_COLL_CMA_MAX) */
	float *in = malloc(count * sizeof(float)), *out = malloc((size_t)c->n * count * 4);
	float *want = malloc((size_t)c->n * count * sizeof(float));
	int rc = 0;

	(void)arg;
	if (!in || !out || !want)
		return -ENOMEM;
	for (int i = 0; i < c->n; i++)
		gen(DPS_F32, want + (size_t)i * count, count, (uint32_t)i, 0, 77);
	memcpy(in, want + (size_t)c->me * count, count * sizeof(float));
	if (c->me == 1)
		c->cma = 2;
	for (int round = 0; round < 2 && !rc; round++) {
		memset(out, 0xCD, (size_t)c->n * count * sizeof(float));
		rc = dps_coll_allgather(c, in, out, count, DPS_F32);
		if (!rc && memcmp(out, want, (size_t)c->n * count * sizeof(float)))
			rc = -DPS_EPROTO;
		if (!rc && (c->cma != -1 || c->stats.single_copy[DPS_COLL_ALLGATHER]))
			rc = -DPS_EPROTO; /* every member stopped trying, none counted a single copy */
	}
	free(in);
	free(out);
	free(want);
	return rc;
}

/* A member that takes the slots (its cma -1) while the others take the single copy: every
 * member fails the call alike, and the group still works. */
static int cma_mixed_rank(struct dps_world *w, void *arg)
{
	struct dps_comm *c = w->world_c;
	const size_t count = 30000;
	float *in = calloc(count, sizeof(float)), *out = calloc((size_t)c->n * count, 4);
	float one = 1.0f, sum = 0.0f;
	int rc;

	(void)arg;
	if (!in || !out)
		return -ENOMEM;
	if (c->me == 0)
		c->cma = -1;
	rc = dps_coll_allgather(c, in, out, count, DPS_F32);
	free(in);
	free(out);
	if (rc != -EINVAL)
		return -DPS_EPROTO;
	rc = dps_coll_allreduce(c, &one, &sum, 1, DPS_F32);
	return rc || sum != (float)c->n ? -DPS_EPROTO : 0;
}

START_TEST(test_cma_fallback)
{
	struct dps_sup_opts o = { .par = { 3, 1, 1, 1, 1, 1, 1 }, .rank_fn = cma_fallback_rank };
	struct dps_sup_result res;
	char err[256];

	ck_assert_msg(dps_sup_run(&o, &res, err, sizeof(err)) == 0, "%s", err);
	o.rank_fn = cma_mixed_rank;
	ck_assert_msg(dps_sup_run(&o, &res, err, sizeof(err)) == 0, "%s", err);
}
END_TEST

_Static_assert(3 * 30000 * 4 >= DPS_COLL_CMA_MIN && 3 * 30000 * 4 < DPS_COLL_CMA_MAX,
	       "the tests' all-gathers take the single copy");

static Suite *cma_suite(void)
{
	Suite *s = suite_create("cma");
	TCase *tc = tcase_create("cma");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_cma_fallback);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run_suite(cma_suite());
}

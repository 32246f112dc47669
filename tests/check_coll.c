/* SPDX-License-Identifier: MIT */
/*
 * tests/check_coll.c - every collective on real rank processes (forked by the supervisor,
 * talking through the real shared segment) against a serial oracle (tests/oracle.h): group
 * sizes 1 to 8, sub-groups of a larger world (TP, DP, component TP groups and DP columns),
 * element counts 0, 1, 63, 4097 and just over 1 MiB, fp32, bf16 and int32, both all-reduce
 * algorithms, the large messages in each write mode (auto, streamed, cached), the in-place
 * calls whose inputs lie in the TP groups' windows (and a group whose members do not all
 * call in place, which must fail on every member and stay usable), chunking through small slots. Results must match the oracle bit for bit on every
 * rank; all-reduce results are also hashed and the hashes compared across the members of each
 * group in the supervisor. A deliberate fault proves the checker fails when it should.
 */
#include <check.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/runtime/supervisor.h"
#include "shm/coll.h"
#include "shm/copy.h"
#include "tests/oracle.h"

enum which { W_WORLD, W_TP, W_DP, W_COL, W_COMP };

#define OP_BARRIER (1 << 0)
#define OP_BCAST (1 << 1)
#define OP_ALLGATHER (1 << 2)
#define OP_ALLGATHERV (1 << 3)
#define OP_ALLREDUCE (1 << 4)
#define OP_REDUCESCATTER (1 << 5)
#define OP_ALLTOALLV (1 << 6)
#define OP_ALL 0x7f

struct suite {
	struct dps_par_cfg par;
	enum which which[4];
	enum dps_comp comp[4];
	int n_which;
	size_t slot_bytes;
	int fault_rank;     /* this world rank perturbs one all-reduce input element */
	int ops;
	int big;            /* include the just-over-1-MiB count */
	size_t window_bytes; /* TP groups' windows: the in-place calls too */
};

struct report {
	int32_t group_first;
	int32_t case_id;
	uint64_t hash;
};

/* Supervisor side: all-reduce result hashes per (group, case). */
#define MAX_REPORTS 200000
static struct report *reports;
static int n_reports;

static void collect(int rank, const void *msg, size_t len, void *arg)
{
	if (len == sizeof(struct report) && n_reports < MAX_REPORTS)
		memcpy(&reports[n_reports++], msg, len);
}

static int cmp_report(const void *a, const void *b)
{
	const struct report *x = a, *y = b;

	if (x->group_first != y->group_first)
		return x->group_first < y->group_first ? -1 : 1;
	if (x->case_id != y->case_id)
		return x->case_id < y->case_id ? -1 : 1;
	return 0;
}

/* ---- rank side ------------------------------------------------------------------------------ */


static uint64_t fnv(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 1469598103934665603ull;

	while (n--)
		h = (h ^ *b++) * 1099511628211ull;
	return h;
}

struct ctx {
	struct dps_world *w;
	struct dps_comm *c;
	const struct suite *s;
	unsigned char *a, *b, *want;
	unsigned char *win; /* this member's window in x->c, or NULL */
	size_t wb;
	int fails;
};

/* Where in_window puts a member's input: an offset of its own, a multiple of every element
 * size but not of a cache line, so that members' offsets differ. */
#define WIN_OFF(me) ((size_t)12 * (size_t)((me) + 1))

/* Whether `bytes` fit every member's window at its offset (all members decide alike). */
static int cma_works; /* main: whether process_vm_readv between processes is allowed here */

static int fits_window(const struct ctx *x, size_t bytes)
{
	return x->win && bytes + WIN_OFF(x->c->n - 1) <= x->wb;
}

/* A copy of `bytes` of src in this member's window (fits_window), returned. */
static void *in_window(struct ctx *x, const void *src, size_t bytes)
{
	unsigned char *w = x->win + WIN_OFF(x->c->me);

	memcpy(w, src, bytes);
	return w;
}

/* Counts a failure unless `kind` ran in place `want` times since its count was `before`. */
static void expect_in_place(struct ctx *x, enum dps_coll_kind kind, uint64_t before, int want,
			    size_t count)
{
	if (x->c->stats.in_place[kind] - before != (uint64_t)want) {
		x->fails++;
		dps_error("%s count %zu (group of %d): %s in place", dps_coll_kind_name(kind), count,
			  x->c->n, want ? "not" : "unexpectedly");
	}
}

static void mismatch(struct ctx *x, const char *op, enum dps_dtype t, size_t count, size_t at)
{
	if (x->fails++ < 5)
		dps_error("%s %s count %zu (group of %d, member %d): mismatch at element %zu", op,
			  dps_dtype_name(t), count, x->c->n, x->c->me, at);
}

static size_t first_diff(const void *a, const void *b, size_t n, size_t esz)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp((const char *)a + i * esz, (const char *)b + i * esz, esz))
			return i;
	return n;
}

static int check(struct ctx *x, const char *op, enum dps_dtype t, size_t count,
		 const void *got, const void *want, size_t n)
{
	const size_t esz = dps_dtype_size(t);
	size_t d = first_diff(got, want, n, esz);

	if (d < n)
		mismatch(x, op, t, count, d);
	return d < n;
}

static int run_allreduce(struct ctx *x, enum dps_dtype t, size_t count, uint32_t salt, int case_id)
{
	struct dps_comm *c = x->c;
	const size_t esz = dps_dtype_size(t);
	const uint32_t n = (uint32_t)c->n;
	const int nv = fits_window(x, count * esz) ? 6 : 4;
	uint64_t hashes[6];
	int rc;

	for (size_t j = 0; j < count; j++)
		oracle_sum(t, x->want + j * esz, n, (uint32_t)j, salt);
	/* Both algorithms, each with recv == send and apart; then from the window (reduce-
	 * scatter + all-gather read in place), the sum left in the window and apart. */
	for (int v = 0; v < nv; v++) {
		const int rsag = v & 1 || v >= 4, inplace = v >= 4 ? v == 4 : v >> 1;
		void *send = x->a, *out;

		c->algo = rsag ? DPS_ALGO_RSAG : DPS_ALGO_ONESHOT;
		gen(t, x->a, count, (uint32_t)c->me, 0, salt);
		if (x->w->rank == x->s->fault_rank && count > 0)
			((unsigned char *)x->a)[0] ^= 0x40;
		if (v >= 4)
			send = in_window(x, x->a, count * esz);
		out = inplace ? send : x->b;
		memset(x->b, 0xAB, count * esz);
		const uint64_t before = c->stats.in_place[DPS_COLL_ALLREDUCE];

		rc = dps_coll_allreduce(c, send, out, count, t);
		if (rc)
			return rc;
		expect_in_place(x, DPS_COLL_ALLREDUCE, before, v >= 4 && count > 0, count);
		check(x, v >= 4 ? "all-reduce from the window" : rsag ? "all-reduce rs+ag" :
		      "all-reduce one-shot", t, count, out, x->want, count);
		hashes[v] = fnv(out, count * esz);
		/* from the window and apart: the window still holds the input */
		if (v == 5 && memcmp(send, x->a, count * esz))
			check(x, "all-reduce's window after the call", t, count, send, x->a, count);
	}
	c->algo = DPS_ALGO_AUTO;
	for (int v = 4; v < nv; v++)
		if (hashes[v] != hashes[0])
			hashes[1] = ~hashes[0];
	if (hashes[0] != hashes[1] || hashes[0] != hashes[2] || hashes[0] != hashes[3]) {
		x->fails++;
		dps_error("all-reduce %s count %zu: algorithms disagree", dps_dtype_name(t), count);
	}
	struct report r = { c->ranks[0], case_id, hashes[0] };
	return dps_ring_push(&x->w->to_sup, &r, sizeof(r), 0);
}

static int run_allgather(struct ctx *x, enum dps_dtype t, size_t count, uint32_t salt, int var)
{
	struct dps_comm *c = x->c;
	const size_t esz = dps_dtype_size(t);
	size_t counts[64], displs[64], total = 0;
	int i, rc;

	for (i = 0; i < c->n; i++) {
		counts[i] = var ? (i % 3 == 1 ? 0 : count + (size_t)i * 3) : count;
		displs[i] = total;
		total += counts[i];
	}
	gen(t, x->a, counts[c->me], (uint32_t)c->me, 0, salt);
	for (i = 0; i < c->n; i++)
		gen(t, x->want + displs[i] * esz, counts[i], (uint32_t)i, 0, salt);
	memset(x->b, 0xCD, total * esz);
	{
		const uint64_t before = c->stats.single_copy[DPS_COLL_ALLGATHER];
		/* from private memory, large: read from the peers' inputs (shm/coll_cma.c) */
		const int cma = c->n > 1 && total * esz >= DPS_COLL_CMA_MIN &&
				total * esz < DPS_COLL_CMA_MAX && !c->x && !c->cma;

		rc = var ? dps_coll_allgatherv(c, x->a, x->b, counts, NULL, t)
			 : dps_coll_allgather(c, x->a, x->b, count, t);
		if (rc)
			return rc;
		/* (where this kernel refuses the reads, main found out: none may count) */
		if (c->stats.single_copy[DPS_COLL_ALLGATHER] - before != (uint64_t)(cma && cma_works)) {
			x->fails++;
			dps_error("all-gather count %zu: the single copy %s", count,
				  before == c->stats.single_copy[DPS_COLL_ALLGATHER] ? "did not run"
										     : "ran");
		}
	}
	check(x, var ? "all-gather-v" : "all-gather", t, count, x->b, x->want, total);
	if (fits_window(x, count * esz)) { /* every member's input fits: all from the windows */
		const uint64_t before = c->stats.in_place[DPS_COLL_ALLGATHER];
		void *w = in_window(x, x->a, counts[c->me] * esz);

		memset(x->b, 0xCD, total * esz);
		rc = var ? dps_coll_allgatherv(c, w, x->b, counts, NULL, t)
			 : dps_coll_allgather(c, w, x->b, count, t);
		if (rc)
			return rc;
		check(x, var ? "all-gather-v from the window" : "all-gather from the window", t,
		      count, x->b, x->want, total);
		expect_in_place(x, DPS_COLL_ALLGATHER, before,
				total * esz >= DPS_COLL_INPLACE_MIN, count);
	}
	return 0;
}

/* var: every member's block has its own size (some 0), as dps_coll_reducescatterv takes. */
static int run_reducescatter(struct ctx *x, enum dps_dtype t, size_t count, uint32_t salt, int var)
{
	struct dps_comm *c = x->c;
	const size_t esz = dps_dtype_size(t);
	size_t counts[DPS_MAX_WORLD], total = 0, first = 0, mine;
	int rc;

	for (int i = 0; i < c->n; i++) {
		counts[i] = var ? (i % 3 == 1 ? 0 : count + (size_t)i * 3) : count;
		if (i < c->me)
			first += counts[i];
		total += counts[i];
	}
	mine = counts[c->me];
	gen(t, x->a, total, (uint32_t)c->me, 0, salt);
	for (size_t j = 0; j < mine; j++)
		oracle_sum(t, x->want + j * esz, (uint32_t)c->n, (uint32_t)(first + j), salt);
	/* Copied, then (when every member's input fits) read from the windows. */
	for (int from_win = 0; from_win < 1 + fits_window(x, total * esz); from_win++) {
		const uint64_t before = c->stats.in_place[DPS_COLL_REDUCESCATTER];
		const void *send = from_win ? in_window(x, x->a, total * esz) : x->a;

		memset(x->b, 0xEF, (mine + 1) * esz);
		rc = var ? dps_coll_reducescatterv(c, send, x->b, counts, t)
			 : dps_coll_reducescatter(c, send, x->b, count, t);
		if (rc)
			return rc;
		/* One element past the block must be untouched. */
		for (size_t b = 0; b < esz; b++)
			if (((unsigned char *)x->b)[mine * esz + b] != 0xEF)
				x->fails++;
		check(x, from_win ? "reduce-scatter from the window" :
		      var ? "reduce-scatter-v" : "reduce-scatter", t, count, x->b, x->want, mine);
		expect_in_place(x, DPS_COLL_REDUCESCATTER, before,
				from_win && total * esz >= DPS_COLL_INPLACE_MIN, count);
	}
	return 0;
}

static size_t a2a_count(int from, int to, size_t count, uint32_t salt)
{
	return (size_t)((unsigned)(from * 5 + to * 3) + salt) % 4 * count / 2;
}

static int run_alltoallv(struct ctx *x, enum dps_dtype t, size_t count, uint32_t salt)
{
	struct dps_comm *c = x->c;
	const size_t esz = dps_dtype_size(t);
	size_t sc[64], rc_[64], sd[64], rd[64], stot = 0, rtot = 0;
	int i, rc;

	for (i = 0; i < c->n; i++) {
		sc[i] = a2a_count(c->me, i, count, salt);
		rc_[i] = a2a_count(i, c->me, count, salt);
		/* Send pieces in reverse order to exercise explicit displacements. */
		rd[i] = rtot;
		rtot += rc_[i];
	}
	for (i = c->n - 1; i >= 0; i--) {
		sd[i] = stot;
		stot += sc[i];
	}
	for (i = 0; i < c->n; i++) {
		gen(t, x->a + sd[i] * esz, sc[i], (uint32_t)c->me, (uint32_t)i << 24, salt);
		gen(t, x->want + rd[i] * esz, rc_[i], (uint32_t)i, (uint32_t)c->me << 24, salt);
	}
	memset(x->b, 0x5A, rtot * esz);
	rc = dps_coll_alltoallv(c, x->a, sc, sd, x->b, rc_, rd, t);
	if (rc)
		return rc;
	check(x, "all-to-all-v", t, count, x->b, x->want, rtot);
	return 0;
}

static int run_bcast(struct ctx *x, enum dps_dtype t, size_t count, uint32_t salt)
{
	struct dps_comm *c = x->c;
	const size_t esz = dps_dtype_size(t);
	const int root = (int)(salt % (uint32_t)c->n);
	int rc;

	gen(t, x->want, count, (uint32_t)root, 0, salt);
	if (c->me == root)
		memcpy(x->b, x->want, count * esz);
	else
		memset(x->b, 0x11, count * esz);
	rc = dps_coll_bcast(c, x->b, count, t, root);
	if (rc)
		return rc;
	check(x, "broadcast", t, count, x->b, x->want, count);
	return 0;
}

static struct dps_comm *pick(struct dps_world *w, enum which wh, enum dps_comp comp)
{
	switch (wh) {
	case W_TP: return w->tp_c;
	case W_DP: return w->dp_c;
	case W_COL: return w->dp_col_c[comp];
	case W_COMP: return w->comp_tp_c[comp];
	default: return w->world_c;
	}
}

static int suite_rank(struct dps_world *w, void *arg)
{
	const struct suite *s = arg;
	const size_t small[] = { 0, 1, 63, 4097 };
	struct ctx x = { .w = w, .s = s };
	const size_t cap = (size_t)9 << 20; /* bytes per buffer: 8 members x just over 1 MiB */
	int rc = 0, case_id = 0;

	x.a = malloc(cap);
	x.b = malloc(cap);
	x.want = malloc(cap);
	if (!x.a || !x.b || !x.want)
		return -ENOMEM;
	for (int wi = 0; wi < s->n_which && !rc; wi++) {
		x.c = pick(w, s->which[wi], s->comp[wi]);
		x.win = dps_comm_window(x.c, &x.wb);
		for (int t = 0; t < DPS_DTYPE_COUNT && !rc; t++) {
			const enum dps_dtype dt = (enum dps_dtype)t;
			const size_t big = ((size_t)1 << 20) / dps_dtype_size(dt) + 1;

			/* k = 5: a whole all-gather of 192 KiB and a little more, where it takes
			 * the single copy (shm/coll_cma.c) */
			const size_t mid = ((size_t)192 << 10) / dps_dtype_size(dt) / (size_t)x.c->n + 3;

			for (int k = 0; k < 6 && !rc; k++, case_id++) {
				const size_t count = k < 4 ? small[k] : k == 4 ? big : mid;
				const uint32_t salt = (uint32_t)(case_id * 131 + x.c->ranks[0] * 7919);

				if (k == 4 && !s->big)
					continue;
				/* Large messages in each write mode (only how bytes travel). */
				x.c->copy = dt == DPS_F32 ? DPS_COPY_AUTO :
					    dt == DPS_BF16 ? DPS_COPY_STREAM : DPS_COPY_CACHED;
				if (s->ops & OP_BARRIER)
					rc = dps_coll_barrier(x.c);
				if (!rc && (s->ops & OP_ALLREDUCE))
					rc = run_allreduce(&x, dt, count, salt, case_id);
				if (!rc && (s->ops & OP_ALLGATHER))
					rc = run_allgather(&x, dt, count, salt + 1, 0);
				if (!rc && (s->ops & OP_ALLGATHERV))
					rc = run_allgather(&x, dt, count, salt + 2, 1);
				if (!rc && (s->ops & OP_REDUCESCATTER))
					rc = run_reducescatter(&x, dt, count, salt + 3, 0);
				if (!rc && (s->ops & OP_REDUCESCATTER))
					rc = run_reducescatter(&x, dt, count, salt + 6, 1);
				if (!rc && (s->ops & OP_ALLTOALLV))
					rc = run_alltoallv(&x, dt, count, salt + 4);
				if (!rc && (s->ops & OP_BCAST))
					rc = run_bcast(&x, dt, count, salt + 5);
			}
		}
	}
	free(x.a);
	free(x.b);
	free(x.want);
	if (rc)
		return rc;
	return x.fails ? -DPS_EPROTO : 0;
}

/* ---- supervisor side ------------------------------------------------------------------------ */

/* Runs the suite; returns dps_sup_run's code and checks the hashes agree within each group. */
static int run_suite(const struct suite *s, int *hash_groups)
{
	struct dps_sup_opts o = { .par = s->par, .cpu_bind = "auto", .slot_bytes = s->slot_bytes,
				  .window_bytes = s->window_bytes,
				  .rank_fn = suite_rank, .rank_arg = (void *)s, .msg_fn = collect,
				  .nodes_ok = 1 };
	struct dps_sup_result res;
	char err[512];
	int rc, i, j, groups = 0;

	reports = calloc(MAX_REPORTS, sizeof(*reports));
	ck_assert_ptr_nonnull(reports);
	n_reports = 0;
	rc = dps_sup_run(&o, &res, err, sizeof(err));
	if (rc)
		fprintf(stderr, "suite: %s\n", err);
	qsort(reports, (size_t)n_reports, sizeof(*reports), cmp_report);
	for (i = 0; i < n_reports; i = j) {
		for (j = i + 1; j < n_reports && !cmp_report(&reports[i], &reports[j]); j++)
			ck_assert_msg(reports[j].hash == reports[i].hash,
				      "group %d case %d: ranks hold different all-reduce results",
				      reports[i].group_first, reports[i].case_id);
		groups++;
	}
	free(reports);
	if (hash_groups)
		*hash_groups = groups;
	return rc;
}

START_TEST(test_group_sizes)
{
	/* _i = group size 1..8, one TP group spanning the world */
	struct suite s = { .par = DPS_PAR_CFG_DEFAULT, .n_which = 1, .which = { W_WORLD },
			   .fault_rank = -1, .ops = OP_ALL, .big = 1, .window_bytes = 9 << 20 };
	int groups;

	s.par.tp = _i;
	ck_assert_int_eq(run_suite(&s, &groups), 0);
	ck_assert_int_gt(groups, 0);
}
END_TEST

START_TEST(test_subgroups)
{
	/* TP=2 x DP=4, attention 2, MLP 4: DP groups, TP groups, columns and component groups. */
	struct suite s = { .par = { 2, 4, 2, 1, 4, 1, 1 }, .n_which = 4,
			   .which = { W_DP, W_COL, W_COMP, W_TP },
			   .comp = { 0, DPS_COMP_ATTN, DPS_COMP_ATTN, 0 },
			   .fault_rank = -1, .ops = OP_ALL, .big = 0, .window_bytes = 1 << 20 };

	ck_assert_int_eq(run_suite(&s, NULL), 0);
}
END_TEST

START_TEST(test_subgroups_big)
{
	struct suite s = { .par = { 2, 3, 3, 1, 1, 1, 1 }, .n_which = 2, .which = { W_COL, W_COMP },
			   .comp = { DPS_COMP_ATTN, DPS_COMP_MLP }, .fault_rank = -1,
			   .ops = OP_ALLREDUCE | OP_REDUCESCATTER | OP_ALLGATHERV, .big = 1 };

	ck_assert_int_eq(run_suite(&s, NULL), 0);
}
END_TEST

START_TEST(test_small_slots)
{
	/* 4 KiB slots: every size above a few hundred elements is chunked. */
	struct suite s = { .par = { 5, 1, 1, 1, 1, 1, 1 }, .n_which = 1, .which = { W_WORLD },
			   .slot_bytes = 4096, .fault_rank = -1, .ops = OP_ALL, .big = 0,
			   .window_bytes = 64 << 10 };

	ck_assert_int_eq(run_suite(&s, NULL), 0);
}
END_TEST

/* Member 1 of 3 calls from its window, the others from private memory: every member fails
 * with -EINVAL after the same single step (nobody hangs), and the group works on after. Then
 * all call in place but member 0 gives an output inside its window: all fail alike. */
static int mixed_rank(struct dps_world *w, void *arg)
{
	struct dps_comm *c = w->world_c;
	const size_t count = 30000; /* every call above the in-place limits */
	float *buf = calloc(3 * count, sizeof(float)), *out = calloc(3 * count, sizeof(float));
	size_t wb;
	float *win = dps_comm_window(c, &wb);
	int bad = !buf || !out || !win;

	for (int op = 0; op < 4 && !bad; op++) {
		/* op 3: all in place, but member 0's output overlaps its window (coll.h) */
		const void *send = c->me == 1 || op == 3 ? (const void *)win : buf;
		int rc;

		c->algo = DPS_ALGO_RSAG;
		rc = op == 0 ? dps_coll_allreduce(c, send, out, count, DPS_F32) :
		     op == 3 ? dps_coll_allreduce(c, send, c->me == 0 ? win + 4 : out, count,
						  DPS_F32) :
		     op == 1 ? dps_coll_allgather(c, send, out, count, DPS_F32) :
			       dps_coll_reducescatter(c, send, out, count, DPS_F32);
		if (rc != -EINVAL) {
			dps_error("mixed call %d: member %d got %d, not -EINVAL", op, c->me, rc);
			bad = 1;
		}
	}
	/* Afterwards, in step: a plain all-reduce of the member ids (0 + 1 + 2 everywhere). */
	for (size_t j = 0; j < count && !bad; j++)
		buf[j] = (float)c->me;
	if (!bad && dps_coll_allreduce(c, buf, out, count, DPS_F32))
		bad = 1;
	for (size_t j = 0; j < count && !bad; j++)
		bad = out[j] != 3.0f;
	free(buf);
	free(out);
	return bad ? -DPS_EPROTO : 0;
}

START_TEST(test_in_place_mixed)
{
	struct dps_sup_opts o = { .par = { 3, 1, 1, 1, 1, 1, 1 }, .cpu_bind = "auto",
				  .window_bytes = 1 << 20, .rank_fn = mixed_rank };
	struct dps_sup_result res;
	char err[512];

	ck_assert_msg(dps_sup_run(&o, &res, err, sizeof(err)) == 0, "%s", err);
}
END_TEST

START_TEST(test_fault_detected)
{
	/* Rank 1 flips a bit of its input: the oracle comparison must fail the run. */
	struct suite s = { .par = { 3, 1, 1, 1, 1, 1, 1 }, .n_which = 1, .which = { W_WORLD },
			   .fault_rank = 1, .ops = OP_ALLREDUCE, .big = 0 };

	ck_assert_int_eq(run_suite(&s, NULL), -DPS_ERANK);
}
END_TEST

/*
 * Groups that cross nodes (--nodes without mpirun: one supervisor hosting every node, each
 * with its own segment; shm/coll_x.h): every operation, size and type against the same
 * oracle, on groups whose members on one node are not contiguous in group order (DP groups
 * and columns stride across nodes). _i: 0 DP=8 on 2 nodes, 1 on 4 nodes, 2 the subgroups of
 * TP=2 x DP=4 on 2 nodes (TP groups inside a node, the rest across), 3 the same on 4 nodes,
 * 4 TP=4 x DP=2 on 4 nodes (the TP groups across two nodes each).
 */
START_TEST(test_nodes)
{
	static const struct {
		struct dps_par_cfg par;
		int nodes, big, n_which;
		enum which which[4];
		enum dps_comp comp[4];
	} cases[] = {
		{ { 1, 8, 1, 1, 1, 1, 1 }, 2, 1, 1, { W_DP }, { 0 } },
		{ { 1, 8, 1, 1, 1, 1, 1 }, 4, 1, 1, { W_DP }, { 0 } },
		{ { 2, 4, 2, 1, 4, 1, 1 }, 2, 0, 4, { W_DP, W_COL, W_COMP, W_TP },
		  { 0, DPS_COMP_ATTN, DPS_COMP_MLP, 0 } },
		{ { 2, 4, 2, 1, 4, 1, 1 }, 4, 0, 4, { W_DP, W_COL, W_COMP, W_TP },
		  { 0, DPS_COMP_ATTN, DPS_COMP_MLP, 0 } },
		{ { 4, 2, 1, 1, 2, 1, 1 }, 4, 0, 3, { W_TP, W_DP, W_COMP },
		  { 0, 0, DPS_COMP_MLP } },
	};
	struct suite s = { .par = cases[_i].par, .fault_rank = -1, .ops = OP_ALL,
			   .big = cases[_i].big, .slot_bytes = _i & 1 ? 4096 : 0,
			   .n_which = cases[_i].n_which };

	memcpy(s.which, cases[_i].which, sizeof(s.which));
	memcpy(s.comp, cases[_i].comp, sizeof(s.comp));
	s.par.nodes = cases[_i].nodes;
	ck_assert_int_eq(run_suite(&s, NULL), 0);
	/* and the comparison can fail: one member's input perturbed is caught across nodes */
	s.fault_rank = 5;
	s.ops = OP_ALLREDUCE;
	s.big = 0;
	ck_assert_int_eq(run_suite(&s, NULL), -DPS_ERANK);
}
END_TEST

START_TEST(test_reduce_kernels)
{
	/* The vectorised ordered sum equals the one-at-a-time reference, bit for bit. */
	const size_t n = 5000;
	float *src[4], out[5000], ref[5000];
	uint16_t *hs[4], hout[5000], href[5000];

	for (int i = 0; i < 4; i++) {
		src[i] = malloc(n * sizeof(float));
		hs[i] = malloc(n * sizeof(uint16_t));
		for (size_t j = 0; j < n; j++) {
			src[i][j] = oracle_f32((uint32_t)i, (uint32_t)j, 99);
			hs[i][j] = oracle_f32_to_bf16(src[i][j]);
		}
	}
	for (int k = 1; k <= 4; k++) {
		dps_reduce_sum(DPS_F32, out, (const void *const *)src, k, n);
		dps_reduce_sum_ref(DPS_F32, ref, (const void *const *)src, k, n);
		ck_assert(!memcmp(out, ref, sizeof(out)));
		dps_reduce_sum(DPS_BF16, hout, (const void *const *)hs, k, n);
		dps_reduce_sum_ref(DPS_BF16, href, (const void *const *)hs, k, n);
		ck_assert(!memcmp(hout, href, sizeof(hout)));
	}
	/* The engine's bf16 rounding agrees with the oracle's, ties and NaN included. */
	for (uint32_t u = 0; u < 0xffffffffu - 4093; u += 4093) {
		float f;

		memcpy(&f, &u, 4);
		if (isnan(f))
			continue;
		ck_assert_uint_eq(dps_f32_to_bf16(f), oracle_f32_to_bf16(f));
	}
	ck_assert_uint_eq(dps_f32_to_bf16(1.0f + 1.0f / 256.0f), 0x3f80); /* tie to even: down */
	ck_assert_uint_eq(dps_f32_to_bf16(1.0f + 3.0f / 256.0f), 0x3f82); /* tie to even: up */
	ck_assert(isnan(dps_bf16_to_f32(dps_f32_to_bf16(NAN))));
	for (int i = 0; i < 4; i++) {
		free(src[i]);
		free(hs[i]);
	}
}
END_TEST

/* ---- bad all-to-all-v counts: every member returns, nobody hangs -------------------------- */

static int bad_a2a_rank(struct dps_world *w, void *arg)
{
	struct dps_comm *c = w->world_c;
	size_t sc[4] = { 1, 1, 1, 1 }, rc_[4] = { 1, 1, 1, 1 };
	float send[4] = { 1, 2, 3, 4 }, recv[8]; /* room for the declared counts (up to 5) */
	int rc;

	/* A count no buffer can hold, sent by rank 2: every member refuses the call. */
	if (w->rank == 2)
		sc[1] = SIZE_MAX / 2;
	rc = dps_coll_alltoallv(c, send, sc, NULL, recv, rc_, NULL, DPS_F32);
	if (rc != -EINVAL)
		return -DPS_EPROTO;
	/* A receive count that disagrees with the sender: only the receiver is told. */
	sc[1] = 1;
	if (w->rank == 3)
		rc_[0] = 2;
	rc = dps_coll_alltoallv(c, send, sc, NULL, recv, rc_, NULL, DPS_F32);
	if (rc != (w->rank == 3 ? -EINVAL : 0))
		return -DPS_EPROTO;
	/* The communicator still works afterwards. */
	rc = dps_coll_allreduce(c, send, recv, 4, DPS_F32);
	if (rc || recv[0] != 4.0f || recv[3] != 16.0f)
		return -DPS_EPROTO;
	return 0;
}

/* dps_copy_stream against memcpy: every alignment of both ends, lengths around the vector
 * widths, and nothing written outside the block. */
START_TEST(test_copy_stream)
{
	const size_t big = ((size_t)1 << 20) + 3, cap = big + 256;
	unsigned char *src = malloc(cap), *dst = malloc(cap), *want = malloc(cap);

	ck_assert(src && dst && want);
	for (size_t i = 0; i < cap; i++)
		src[i] = (unsigned char)(i * 131 + 7);
	for (size_t len = 0; len <= 1100; len += len < 300 ? 1 : 61)
		for (size_t da = 0; da < 64; da += 7)
			for (size_t sa = 0; sa < 64; sa += 13) {
				memset(dst, 0x5A, len + 192);
				memcpy(want, dst, len + 192);
				memcpy(want + da, src + sa, len);
				dps_copy_stream(dst + da, src + sa, len);
				ck_assert_msg(!memcmp(dst, want, len + 192),
					      "len %zu dst+%zu src+%zu", len, da, sa);
			}
	memset(dst, 0x5A, cap);
	memcpy(want, dst, cap);
	memcpy(want + 5, src + 1, big);
	dps_copy_stream(dst + 5, src + 1, big);
	ck_assert(!memcmp(dst, want, cap));
	/* the check can fail: one byte off is seen */
	dst[big / 2] ^= 1;
	ck_assert(memcmp(dst, want, cap));
	free(src);
	free(dst);
	free(want);
}
END_TEST

START_TEST(test_alltoallv_bad_counts)
{
	/* _i 0: inside one node; 1: the group across 2 nodes (4 DP ranks, shm/coll_x.c) */
	struct dps_sup_opts o = { .par = { 4, 1, 1, 1, 1, 1, 1 }, .rank_fn = bad_a2a_rank,
				  .nodes_ok = 1 };
	struct dps_sup_result res;
	char err[256];

	if (_i) {
		o.par.tp = 1;
		o.par.dp = 4;
		o.par.nodes = 2;
	}
	ck_assert_msg(dps_sup_run(&o, &res, err, sizeof(err)) == 0, "%s", err);
}
END_TEST

static Suite *coll_suite(void)
{
	Suite *s = suite_create("coll");
	TCase *tc = tcase_create("coll");

	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_reduce_kernels);
	tcase_add_loop_test(tc, test_group_sizes, 1, 9);
	tcase_add_test(tc, test_subgroups);
	tcase_add_test(tc, test_subgroups_big);
	tcase_add_test(tc, test_small_slots);
	tcase_add_test(tc, test_fault_detected);
	tcase_add_loop_test(tc, test_alltoallv_bad_counts, 0, 2);
	tcase_add_loop_test(tc, test_nodes, 0, 5);
	tcase_add_test(tc, test_copy_stream);
	tcase_add_test(tc, test_in_place_mixed);
	suite_add_tcase(s, tc);
	return s;
}

/* Whether this kernel lets a process read a sibling's memory (process_vm_readv), asked of a
 * child once: where it does, every large all-gather from private memory must take the single
 * copy (run_allgather), so a path that always fails cannot pass as a refusing kernel. */
static int probe_cma(void)
{
	static volatile uint64_t word = 0x5eed;
	uint64_t got = 0;
	struct iovec here = { &got, sizeof(got) }, there = { (void *)&word, sizeof(got) };
	int ok;
	pid_t pid = fork();

	if (pid == 0) {
		pause();
		_exit(0);
	}
	if (pid < 0)
		return 0;
	ok = process_vm_readv(pid, &here, 1, &there, 1, 0) == (ssize_t)sizeof(got) && got == word;
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return ok;
}

int main(void)
{
	cma_works = probe_cma();
	if (!cma_works)
		fprintf(stderr, "check_coll: this kernel refuses process_vm_readv between processes: "
			"the single-copy all-gather is checked only falling back\n");
	SRunner *sr = srunner_create(coll_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}

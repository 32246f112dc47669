/* SPDX-License-Identifier: MIT */
/*
 * tools/bench_coll.c - `dpshard bench coll`: latency and bus bandwidth of one collective over
 * a range of sizes, on real rank processes, with this machine's memcpy bandwidth for the same
 * bytes measured in the same run as the yardstick.
 *
 * Sizes follow nccl-tests: for all-reduce the buffer, for all-gather the gathered output, for
 * reduce-scatter the input, for all-to-all what one rank sends. Bus bandwidth is the algorithm
 * bandwidth (bytes / time) times 2(n-1)/n for all-reduce and (n-1)/n for the others.
 *
 * Two methods. batch (the default): back-to-back calls timed together on rank 0, the median
 * of --repeats batches of about 2 ms; calls may overlap (a rank may start the next call while
 * a slow peer still reads the last one). osu: the OSU / Open MPI loop's method (the anchor
 * ../tools/mpi_coll.c in the developers' tree): each call alone after a barrier, every rank
 * timing its own call, the slowest rank's time, the median over the calls. --op pingpong is
 * the floor of both: one cache line passed back and forth between two ranks (half a round
 * trip). --op exchange is the least any collective of two ranks can cost under the chosen
 * method: each rank stores a counter in its own cache line and waits to see the other's, no
 * more (no data, no library).
 */
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/dps.h"
#include "engine/runtime/supervisor.h"
#include "engine/runtime/topo.h"
#include "shm/coll.h"
#include "tools/cmd.h"
#include "tools/flags.h"

enum op { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_ALLTOALL, OP_BCAST, OP_BARRIER,
	  OP_PINGPONG, OP_EXCHANGE };

static const char *const op_names[] = { "allreduce", "allgather", "reducescatter", "alltoall",
					"bcast", "barrier", "pingpong", "exchange" };

struct bench {
	enum op op;
	enum dps_dtype dt;
	size_t min_bytes, max_bytes;
	int repeats;
	size_t oneshot_max;
	enum dps_coll_algo algo;
	enum dps_copy_mode copy;  /* --copy */
	int no_single_copy;       /* --no-single-copy */
	int json;
	int in_place;             /* --in-place: send buffers in the group's windows */
	int world;
	int osu;                  /* --method osu */
	_Atomic uint64_t *line;   /* pingpong, exchange: a shared page (lines 0, 2 and 4 used) */
};

#define OSU_CALLS 2000 /* --method osu: calls a size, at most */

struct row { /* rank 0 -> supervisor, one per size */
	uint64_t bytes, count;
	int32_t algo;
	int32_t iters;
	double median_us, memcpy_gbs;
	int32_t check_ok;
};

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Element counts for the op at `bytes` (see the header comment). */
static size_t op_count(const struct bench *b, size_t bytes)
{
	const size_t esz = dps_dtype_size(b->dt);
	size_t count = bytes / esz;

	if (b->op == OP_ALLGATHER || b->op == OP_REDUCESCATTER || b->op == OP_ALLTOALL)
		count /= (size_t)b->world; /* per rank / per peer */
	return count ? count : 1;
}

static int run_op(const struct bench *b, struct dps_comm *c, const void *send, void *recv,
		  size_t count)
{
	switch (b->op) {
	case OP_ALLREDUCE: return dps_coll_allreduce(c, send, recv, count, b->dt);
	case OP_ALLGATHER: return dps_coll_allgather(c, send, recv, count, b->dt);
	case OP_REDUCESCATTER: return dps_coll_reducescatter(c, send, recv, count, b->dt);
	case OP_BCAST: return dps_coll_bcast(c, recv, count, b->dt, c->n - 1);
	case OP_BARRIER: return dps_coll_barrier(c);
	case OP_PINGPONG: /* their own loops: pingpong_rank, exchange_rank */
	case OP_EXCHANGE: return -EINVAL;
	case OP_ALLTOALL: {
		size_t cnt[DPS_MAX_WORLD];

		for (int i = 0; i < c->n; i++)
			cnt[i] = count;
		return dps_coll_alltoallv(c, send, cnt, NULL, recv, cnt, NULL, b->dt);
	}
	}
	return -EINVAL;
}

/* The value fill() puts at element i of rank r. */
static double fill_val(size_t i, int r)
{
	return (double)((int)((i * 7 + (size_t)r * 13) % 17) - 8);
}

static void fill(const struct bench *b, void *buf, size_t n, int rank)
{
	for (size_t i = 0; i < n; i++) {
		const float v = (float)fill_val(i, rank);

		if (b->dt == DPS_F32)
			((float *)buf)[i] = v;
		else if (b->dt == DPS_BF16)
			((uint16_t *)buf)[i] = dps_f32_to_bf16(v);
		else
			((int32_t *)buf)[i] = (int32_t)v;
	}
}

static double elem(const struct bench *b, const void *buf, size_t i)
{
	if (b->dt == DPS_F32)
		return ((const float *)buf)[i];
	if (b->dt == DPS_BF16)
		return dps_bf16_to_f32(((const uint16_t *)buf)[i]);
	return ((const int32_t *)buf)[i];
}

/* Checks a few elements of rank 0's result against the closed form of fill()'s inputs. */
static int check_result(const struct bench *b, const void *recv, size_t count, int n)
{
	if (b->op == OP_ALLTOALL) {
		/* Rank 0 receives element j of rank r's block 0 at r * count + j. */
		for (int r = 0; r < n; r++)
			for (size_t j = 0; j < count; j += 1 + count / 5)
				if (elem(b, recv, (size_t)r * count + j) != fill_val(j, r))
					return 0;
		return 1;
	}
	if (b->op == OP_BCAST) {
		/* The root is the last rank. */
		for (size_t j = 0; j < count; j += 1 + count / 7)
			if (elem(b, recv, j) != fill_val(j, n - 1))
				return 0;
		return 1;
	}
	if (b->op == OP_ALLREDUCE || b->op == OP_REDUCESCATTER) {
		/* Rank 0's reduce-scatter block is elements [0, count) of the all-reduce. */
		for (size_t i = 0; i < count; i += 1 + count / 7) {
			double want = 0;

			for (int r = 0; r < n; r++)
				want += fill_val(i, r);
			if (elem(b, recv, i) != want)
				return 0;
		}
	} else if (b->op == OP_ALLGATHER) {
		for (int r = 0; r < n; r++)
			if (elem(b, recv, (size_t)r * count) != fill_val(0, r))
				return 0;
	}
	return 1;
}

/* Waits until *v >= want; spins, then yields, and gives up when the instance aborts. */
static int wait_word(struct dps_world *w, _Atomic uint64_t *v, uint64_t want)
{
	/* (at least: in an exchange the peer may already have stored the next step) */
	for (unsigned long spin = 0; atomic_load_explicit(v, memory_order_acquire) < want; spin++) {
		if (spin % 1024 == 1023 && dps_abort_raised(&w->ctl->abort))
			return -DPS_EABORT;
		if (spin > 4096)
			sched_yield(); /* the peer may share this CPU: let it run */
		else
			__builtin_ia32_pause();
	}
	return 0;
}

/* The floor: ranks 0 and 1 pass a counter through one cache line; rank 0 reports half the
 * median round trip of --repeats batches. */
static int pingpong_rank(struct dps_world *w, const struct bench *b)
{
	_Atomic uint64_t *ping = b->line, *pong = b->line + 1;
	double *t = calloc((size_t)b->repeats, sizeof(double));
	int32_t n = 200; /* the warm-up's round trips; then batches of about 2 ms */
	uint64_t seq = 0;
	int rc = dps_coll_barrier(w->world_c);

	if (!t)
		return -ENOMEM;
	for (int rep = -1; rep < b->repeats && !rc; rep++) { /* rep -1: warm-up */
		const uint64_t t0 = dps_now_ns();

		if (rep == 0) { /* rank 0 sizes the batches for everyone */
			if (w->rank == 0)
				n = (int32_t)fmin(20000.0, fmax(10.0, 2e6 / fmax(t[0] * 2e3, 1.0)));
			rc = dps_coll_bcast(w->world_c, &n, 1, DPS_I32, 0);
		}

		for (int i = 0; i < n && !rc; i++) {
			seq++;
			if (w->rank == 0) {
				atomic_store_explicit(ping, seq, memory_order_release);
				rc = wait_word(w, pong, seq);
			} else if (w->rank == 1) {
				rc = wait_word(w, ping, seq);
				atomic_store_explicit(pong, seq, memory_order_release);
			}
		}
		/* one way, in us (the warm-up's into t[0], which rep 0 then overwrites) */
		t[rep < 0 ? 0 : rep] = (double)(dps_now_ns() - t0) / n / 2 / 1e3;
	}
	if (!rc && w->rank == 0) {
		struct row row = { .bytes = 64, .count = 1, .algo = DPS_ALGO_ONESHOT, .iters = n,
				   .check_ok = 1 };

		row.median_us = median(t, b->repeats);
		rc = dps_ring_push(&w->to_sup, &row, sizeof(row), 0);
	}
	free(t);
	return rc;
}

/*
 * The exchange: ranks 0 and 1 each store the step in their own line (bytes 128 and 256 of the
 * page: different lines and line pairs) and wait for the other's. batch: back-to-back
 * exchanges timed on rank 0, median of --repeats batches; osu: each exchange alone after a
 * barrier, the slower rank's time, median over the calls.
 */
static int exchange_rank(struct dps_world *w, const struct bench *b)
{
	_Atomic uint64_t *mine = b->line + 16 * (w->rank + 1), *peer = b->line + 16 * (2 - w->rank);
	const int calls = b->osu ? OSU_CALLS : b->repeats;
	double *t = calloc((size_t)calls, sizeof(double));
	float us[2];
	int32_t n = b->osu ? 1 : 200; /* batch: the warm-up's exchanges, then about 2 ms */
	uint64_t seq = 0;
	int rc = dps_coll_barrier(w->world_c);

	if (!t)
		return -ENOMEM;
	for (int rep = -1; rep < calls && !rc; rep++) { /* rep -1: warm-up */
		uint64_t t0;

		if (!b->osu && rep == 0) {
			if (w->rank == 0)
				n = (int32_t)fmin(20000.0, fmax(10.0, 2e6 / fmax(t[0] * 1e3, 1.0)));
			rc = dps_coll_bcast(w->world_c, &n, 1, DPS_I32, 0);
		}
		if (b->osu && !rc)
			rc = dps_coll_barrier(w->world_c);
		t0 = dps_now_ns();
		for (int i = 0; i < n && !rc; i++) {
			atomic_store_explicit(mine, ++seq, memory_order_release);
			rc = wait_word(w, peer, seq);
		}
		t[rep < 0 ? 0 : rep] = (double)(dps_now_ns() - t0) / n / 1e3;
		if (b->osu && !rc) {
			const float me = (float)t[rep < 0 ? 0 : rep];

			rc = dps_coll_allgather(w->world_c, &me, us, 1, DPS_F32);
			t[rep < 0 ? 0 : rep] = us[0] > us[1] ? us[0] : us[1];
		}
	}
	if (!rc && w->rank == 0) {
		struct row row = { .bytes = 8, .count = 1, .algo = DPS_ALGO_ONESHOT, .iters = n,
				   .check_ok = 1 };

		if (b->osu)
			row.iters = calls;
		row.median_us = median(t, calls);
		rc = dps_ring_push(&w->to_sup, &row, sizeof(row), 0);
	}
	free(t);
	return rc;
}

/* One call alone after a barrier, on every rank; the slowest rank's time (us) into *us. */
static int osu_call(const struct bench *b, struct dps_comm *c, const void *send, void *recv,
		    size_t count, float *all, double *us)
{
	float mine;
	uint64_t t0;
	int rc = dps_coll_barrier(c);

	if (rc)
		return rc;
	t0 = dps_now_ns();
	rc = run_op(b, c, send, recv, count);
	mine = (float)((double)(dps_now_ns() - t0) / 1e3);
	if (!rc)
		rc = dps_coll_allgather(c, &mine, all, 1, DPS_F32);
	*us = 0;
	for (int i = 0; i < c->n && !rc; i++)
		*us = all[i] > *us ? all[i] : *us;
	return rc;
}

static int bench_rank(struct dps_world *w, void *arg)
{
	struct bench *b = arg;
	struct dps_comm *c = w->world_c;
	const size_t esz = dps_dtype_size(b->dt);
	/* osu: up to OSU_CALLS calls a size, each its own sample */
	const int cap = b->repeats > OSU_CALLS ? b->repeats : OSU_CALLS;
	double *t = calloc((size_t)cap, sizeof(double));
	float *all = calloc((size_t)w->world, sizeof(float));
	void *send = NULL, *recv = NULL, *scratch = NULL, *own = NULL;
	size_t bytes;
	int rc = 0;

	if (b->op == OP_PINGPONG || b->op == OP_EXCHANGE) {
		free(t);
		free(all);
		return b->op == OP_PINGPONG ? pingpong_rank(w, b) : exchange_rank(w, b);
	}
	/* --oneshot-max 0: the limit the supervisor chose for these ranks on these cores */
	dps_world_set_algo(w, b->oneshot_max ? b->oneshot_max : c->oneshot_max, b->algo);
	c->copy = b->copy;
	if (b->no_single_copy)
		c->cma = -1;
	send = own = aligned_alloc(64, dps_align_up(b->max_bytes * 2 + 64, 64));
	if (b->in_place && b->op != OP_BCAST && b->op != OP_ALLTOALL) {
		size_t wb;

		send = dps_comm_window(c, &wb);
		if (!send || wb < b->max_bytes) {
			dps_error("no window of %zu bytes in the group's shared area", b->max_bytes);
			rc = -EINVAL;
			goto out;
		}
	}
	recv = aligned_alloc(64, dps_align_up(b->max_bytes * 2 + 64, 64));
	scratch = aligned_alloc(64, dps_align_up(b->max_bytes * 2 + 64, 64));
	if (!t || !all || !send || !recv || !scratch) {
		rc = -ENOMEM;
		goto out;
	}
	for (bytes = b->min_bytes; bytes <= b->max_bytes; bytes *= 2) {
		const size_t count = op_count(b, bytes);
		const size_t send_elems = (b->op == OP_REDUCESCATTER || b->op == OP_ALLTOALL) ?
						  count * (size_t)c->n : count;
		struct row row = { .bytes = bytes, .count = count };
		int32_t iters = 1;
		uint64_t t0;

		fill(b, send, send_elems, w->rank);
		fill(b, recv, count, w->rank); /* the broadcast buffer */
		/* Warm up, then time warm calls until 200 us have passed; rank 0 picks a batch
		 * size of about 2 ms for everyone. */
		for (int i = 0; i < 5 && !rc; i++)
			rc = run_op(b, c, send, recv, count);
		if (rc)
			goto out;
		{
			int32_t go = 1, done = 0;

			t0 = dps_now_ns();
			while (go && !rc) {
				rc = run_op(b, c, send, recv, count);
				done++;
				go = w->rank == 0 ? dps_now_ns() - t0 < 200000 : 0;
				if (!rc)
					rc = dps_coll_bcast(c, &go, 1, DPS_I32, 0);
			}
			if (rc)
				goto out;
			if (w->rank == 0) {
				const double per = (double)(dps_now_ns() - t0) / done;

				iters = (int32_t)fmin(100000.0, fmax(1.0, 2e6 / fmax(per, 1.0)));
			}
		}
		rc = dps_coll_bcast(c, &iters, 1, DPS_I32, 0);
		if (rc)
			goto out;
		if (b->osu) {
			/* as many calls as a batch would make, at least --repeats, at most OSU_CALLS */
			const int calls = iters < b->repeats ? b->repeats
							     : iters > OSU_CALLS ? OSU_CALLS : iters;

			for (int k = 0; k < calls && !rc; k++)
				rc = osu_call(b, c, send, recv, count, all, &t[k]);
			if (rc)
				goto out;
			row.median_us = median(t, calls);
			iters = calls;
		}
		for (int rep = 0; rep < b->repeats && !b->osu; rep++) {
			rc = dps_coll_barrier(c);
			if (rc)
				goto out;
			t0 = dps_now_ns();
			for (int i = 0; i < iters && !rc; i++)
				rc = run_op(b, c, send, recv, count);
			if (rc)
				goto out;
			t[rep] = (double)(dps_now_ns() - t0) / iters / 1e3;
		}
		if (w->rank != 0)
			continue;
		row.iters = iters;
		row.algo = b->op == OP_ALLREDUCE ? (int32_t)dps_coll_allreduce_algo(c, count * esz)
						 : DPS_ALGO_ONESHOT;
		if (!b->osu)
			row.median_us = median(t, b->repeats);
		row.check_ok = check_result(b, recv, count, c->n);
		/* memcpy of the same bytes, same process, same run, in batches of about 1 ms. */
		const int k = (int)fmin(1e6, fmax(1.0, 1e6 / fmax((double)bytes / 20.0, 1.0)));

		for (int rep = 0; rep < b->repeats; rep++) {

			t0 = dps_now_ns();
			for (int i = 0; i < k; i++) {
				memcpy(scratch, send, bytes);
				__asm__ __volatile__("" ::: "memory");
			}
			t[rep] = (double)(dps_now_ns() - t0) / k / 1e3;
		}
		row.memcpy_gbs = (double)bytes / (median(t, b->repeats) * 1e3);
		rc = dps_ring_push(&w->to_sup, &row, sizeof(row), 0);
		if (rc)
			goto out;
	}
out:
	free(t);
	free(all);
	free(own);
	free(recv);
	free(scratch);
	return rc;
}

static int bench_wrong;


static double bus_factor(const struct bench *b)
{
	const double n = b->world;

	switch (b->op) {
	case OP_ALLREDUCE: return 2.0 * (n - 1) / n;
	case OP_BCAST: return 1.0;
	case OP_BARRIER:
	case OP_PINGPONG: return 0.0;
	default: return (n - 1) / n;
	}
}

static void print_row(int rank, const void *msg, size_t len, void *arg)
{
	const struct bench *b = arg;
	const struct row *r = msg;
	double busbw;

	if (rank != 0 || len != sizeof(*r))
		return;
	busbw = (double)r->bytes / (r->median_us * 1e3) * bus_factor(b);
	const double ratio = r->memcpy_gbs > 0 ? busbw / r->memcpy_gbs : 0.0; /* 0: pingpong */
	if (b->json) {
		printf("{\"op\":\"%s\",\"dtype\":\"%s\",\"ranks\":%d,\"bytes\":%llu,\"count\":%llu,"
		       "\"algo\":\"%s\",\"iters\":%d,\"median_us\":%.3f,\"busbw_gbs\":%.3f,"
		       "\"memcpy_gbs\":%.3f,\"ratio\":%.4f,\"check\":%s}\n",
		       op_names[b->op], dps_dtype_name(b->dt), b->world,
		       (unsigned long long)r->bytes, (unsigned long long)r->count,
		       dps_coll_algo_name((enum dps_coll_algo)r->algo), r->iters, r->median_us, busbw,
		       r->memcpy_gbs, ratio, r->check_ok ? "true" : "false");
	} else {
		printf("%12llu %10llu  %-9s %11.3f %12.2f %12.2f %7.3f  %s\n",
		       (unsigned long long)r->bytes, (unsigned long long)r->count,
		       dps_coll_algo_name((enum dps_coll_algo)r->algo), r->median_us, busbw,
		       r->memcpy_gbs, ratio, r->check_ok ? "ok" : "WRONG");
	}
	fflush(stdout);
	if (!r->check_ok) {
		fprintf(stderr, "dpshard bench coll: result check failed at %llu bytes\n",
			(unsigned long long)r->bytes);
		bench_wrong = 1;
	}
}

int dps_bench_coll(int argc, char **argv)
{
	struct bench b = { .dt = DPS_F32, .min_bytes = 64, .max_bytes = 1 << 20, .repeats = 15,
			   .oneshot_max = 0 };
	struct dps_sup_opts so = { .par = DPS_PAR_CFG_DEFAULT };
	const char *op = "allreduce", *dtype = "f32", *algo = "auto", *cpu_bind = "auto";
	const char *method = "batch", *copy = "auto";
	size_t slot = DPS_COLL_SLOT_DEFAULT;
	struct dps_sup_result res;
	int ranks = 2, nodes = 1, quiet = 0, npos, rc, i;
	char err[512], *pos[1];
	const struct dps_flag flags[] = {
		{ "ranks", DPS_FLAG_INT, &ranks, "N", "rank processes in the group", 1, DPS_MAX_WORLD },
		{ "op", DPS_FLAG_STR, &op, "OP",
		  "allreduce, allgather, reducescatter, alltoall, bcast, barrier, pingpong (the "
		  "floor: one cache line between two ranks, half a round trip) or exchange (the "
		  "least a collective of two ranks costs under --method: each stores a counter in "
		  "its own cache line and waits for the other's)", 0, 0 },
		{ "method", DPS_FLAG_STR, &method, "M",
		  "batch: back-to-back calls timed together on rank 0; osu: each call alone after a "
		  "barrier, the slowest rank's time (the MPI loop's method)", 0, 0 },
		{ "dtype", DPS_FLAG_STR, &dtype, "T", "f32, bf16 or i32", 0, 0 },
		{ "min-bytes", DPS_FLAG_SIZE, &b.min_bytes, "BYTES", "smallest message", 0, 0 },
		{ "max-bytes", DPS_FLAG_SIZE, &b.max_bytes, "BYTES",
		  "largest message (sizes double from min)", 0, 0 },
		{ "repeats", DPS_FLAG_INT, &b.repeats, "N", "timed batches per size (median)", 1, 1000 },
		{ "copy", DPS_FLAG_STR, &copy, "MODE",
		  "how ranks write messages of 64 KiB and more into shared memory: auto (time both "
		  "on the calls themselves, keep the faster), cached (ordinary stores) or stream "
		  "(non-temporal stores, to memory)", 0, 0 },
		{ "algo", DPS_FLAG_STR, &algo, "A",
		  "all-reduce algorithm: auto, oneshot or rsag", 0, 0 },
		{ "oneshot-max", DPS_FLAG_SIZE, &b.oneshot_max, "BYTES",
		  "auto: one-shot all-reduce up to this size, reduce-scatter + all-gather above "
		  "(default: 64 KiB, 8 KiB when the ranks outnumber the cores)", 0, 0 },
		{ "slot-bytes", DPS_FLAG_SIZE, &slot, "BYTES", "shared-memory slot per rank", 0, 0 },
		{ "cpu-bind", DPS_FLAG_STR, &cpu_bind, "SPEC",
		  "auto, off, or per-rank CPU lists like 0-1:2-3", 0, 0 },
		{ "no-single-copy", DPS_FLAG_BOOL, &b.no_single_copy, NULL,
		  "all-gathers of 128 KiB and more through the slots, not read from the peers' "
		  "inputs (process_vm_readv)", 0, 0 },
		{ "in-place", DPS_FLAG_BOOL, &b.in_place, NULL,
		  "each rank's input in its window of the group's shared memory (as the engine's "
		  "activations are), read there by its peers instead of copied into the slots: "
		  "allreduce (above the one-shot limit), allgather, reducescatter", 0, 0 },
		{ "json", DPS_FLAG_BOOL, &b.json, NULL, "one JSON object per size instead of a table", 0, 0 },
		{ "nodes", DPS_FLAG_INT, &nodes, "N",
		  "the ranks spread over N nodes, the group crossing them (one DP group): under "
		  "mpirun, one process per node; without, one process hosting every node", 1,
		  DPS_MAX_WORLD },
		DPS_FLAGS_END
	};

	rc = dps_flags_parse(flags, argc, argv, "bench coll", "[--ranks N] [--op OP] [OPTIONS]",
			     pos, 0, &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	for (i = 0; i < (int)(sizeof(op_names) / sizeof(op_names[0])); i++)
		if (!strcmp(op, op_names[i]))
			break;
	if (i == (int)(sizeof(op_names) / sizeof(op_names[0]))) {
		fprintf(stderr, "dpshard bench coll: --op %s is not one of allreduce, allgather, "
				"reducescatter, alltoall, bcast, barrier, pingpong, exchange\n", op);
		return 2;
	}
	b.op = (enum op)i;
	if (strcmp(method, "batch") && strcmp(method, "osu")) {
		fprintf(stderr, "dpshard bench coll: --method %s is not one of batch, osu\n", method);
		return 2;
	}
	b.osu = !strcmp(method, "osu");
	if ((b.op == OP_PINGPONG || b.op == OP_EXCHANGE) && ranks != 2) {
		fprintf(stderr, "dpshard bench coll: --op %s runs between --ranks 2\n", op);
		return 2;
	}
	if (b.op == OP_PINGPONG || b.op == OP_EXCHANGE) {
		/* one line, made before the fork: every rank shares it */
		b.line = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (b.line == MAP_FAILED) {
			fprintf(stderr, "dpshard bench coll: cannot map the ping-pong line\n");
			return 1;
		}
	}
	if (dps_dtype_parse(dtype, &b.dt)) {
		fprintf(stderr, "dpshard bench coll: --dtype %s is not one of f32, bf16, i32\n", dtype);
		return 2;
	}
	if (!strcmp(algo, "auto"))
		b.algo = DPS_ALGO_AUTO;
	else if (!strcmp(algo, "oneshot"))
		b.algo = DPS_ALGO_ONESHOT;
	else if (!strcmp(algo, "rsag"))
		b.algo = DPS_ALGO_RSAG;
	else {
		fprintf(stderr, "dpshard bench coll: --algo %s is not one of auto, oneshot, rsag\n", algo);
		return 2;
	}
	if (dps_copy_mode_parse(copy, &b.copy)) {
		fprintf(stderr, "dpshard bench coll: --copy %s is not one of auto, cached, stream\n",
			copy);
		return 2;
	}
	if (b.min_bytes < 1 || b.min_bytes > b.max_bytes || b.max_bytes > (1ull << 32)) {
		fprintf(stderr, "dpshard bench coll: need 1 <= --min-bytes <= --max-bytes <= 4G\n");
		return 2;
	}
	b.world = ranks;
	so.par.tp = ranks;
	if (nodes > 1) {
		int me;

		if (b.in_place || b.op == OP_PINGPONG || b.op == OP_EXCHANGE) {
			fprintf(stderr, "dpshard bench coll: --nodes with %s: a group across nodes "
				"has no windows and no shared line\n",
				b.in_place ? "--in-place" : op);
			return 2;
		}
		/* one DP group across the nodes (a TP group must stay on one) */
		so.par.tp = 1;
		so.par.dp = ranks;
		so.par.nodes = nodes;
		so.nodes_ok = 1;
		/* another node than 0: node 0 prints the rows */
		quiet = dps_mpirun_procs(&me) && me != 0;
	}
	so.cpu_bind = cpu_bind;
	so.slot_bytes = slot;
	if (b.in_place)
		so.window_bytes = dps_align_up(b.max_bytes * 2 + 64, 4096);
	so.rank_fn = bench_rank;
	so.rank_arg = &b;
	so.msg_fn = print_row;
	so.msg_arg = &b;
	if (!b.oneshot_max) { /* the header says what the ranks will choose (supervisor.c) */
		struct dps_topo topo;

		if (!dps_topo_discover(&topo)) {
			b.oneshot_max = dps_coll_oneshot_default((unsigned)ranks,
								 (unsigned)dps_topo_ncpus(&topo));
			dps_topo_free(&topo);
		}
	}
	if (!b.json && !quiet) {
		if (nodes > 1)
			printf("# %d nodes: the group crosses them (docs/DESIGN.md, \"Several "
			       "nodes\")\n", nodes);
		if (b.op == OP_PINGPONG)
			printf("# dpshard bench coll: pingpong, one cache line between 2 ranks, half "
			       "the median round trip of %d batches\n", b.repeats);
		else if (b.op == OP_EXCHANGE)
			printf("# dpshard bench coll: exchange, 2 ranks each storing a counter in its "
			       "own cache line and waiting for the other's, method %s\n",
			       b.osu ? "osu: each exchange alone after a barrier, the slower rank's "
				       "time, median over the calls (iters)"
				     : "batch: back-to-back exchanges timed on rank 0, median of "
				       "the batches");
		else if (b.osu)
			printf("# dpshard bench coll: %s, %s, %d ranks, slot %zu bytes, one-shot "
			       "all-reduce up to %zu bytes, copy %s, method osu: each call alone "
			       "after a barrier, the slowest rank's time, median over the calls "
			       "(iters)\n", op_names[b.op], dps_dtype_name(b.dt), ranks, slot,
			       b.oneshot_max, dps_copy_mode_name(b.copy));
		else
			printf("# dpshard bench coll: %s, %s, %d ranks, slot %zu bytes, one-shot "
			       "all-reduce up to %zu bytes, copy %s, method batch: %d batches of "
			       "back-to-back calls per size, median\n", op_names[b.op],
			       dps_dtype_name(b.dt), ranks, slot, b.oneshot_max,
			       dps_copy_mode_name(b.copy), b.repeats);
		printf("# %10s %10s  %-9s %11s %12s %12s %7s  %s\n", "bytes", "count", "algo",
		       "median_us", "busbw_GB/s", "memcpy_GB/s", "ratio", "check");
		fflush(stdout);
	}
	rc = dps_sup_run(&so, &res, err, sizeof(err));
	if (b.line)
		munmap(b.line, 4096);
	if (rc) {
		fprintf(stderr, "dpshard bench coll: %s\n", err[0] ? err : dps_strerror(rc));
		return 1;
	}
	return bench_wrong ? 1 : 0;
}

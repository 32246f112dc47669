/* SPDX-License-Identifier: MIT */
/*
 * kernels/pool.c - the rank's worker threads (see pool.h).
 *
 * A job lives in one 64-bit word, state: its number (24 bits), the next chunk to claim and
 * the number of chunks (20 bits each). A thread claims a chunk by compare-and-swap on the
 * whole word, so a thread that wakes late cannot claim a chunk of a later job: the job
 * number differs. fn and arg are read only after a claim succeeds, when the job cannot end
 * before that chunk is counted done.
 *
 * Two futex words: wake, bumped by the caller for each job, and done, the chunks finished. A
 * waiter spins (the next job usually follows within microseconds), then yields, then sleeps
 * on the futex; the other side wakes sleepers only when one is registered, so a busy pool
 * makes no system calls.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/dps.h"
#include "kernels/pool.h"

enum { SPINS = 20000, YIELDS = 50 };

struct dps_pool {
	int n;
	pthread_t *threads;
	_Atomic uint64_t state;    /* job number << 40 | next chunk << 20 | chunks */
	uint32_t job;              /* the caller's job counter */
	_Atomic uint32_t wake;     /* bumped per job, futex word of the workers */
	_Atomic uint32_t done;     /* chunks finished in the current job, futex word of the caller */
	_Atomic int sleepers;      /* workers asleep (or about to be) on gen */
	_Atomic int caller_asleep; /* the caller asleep (or about to be) on done */
	_Atomic int stop;
	dps_pool_fn fn;
	void *arg;
};

struct worker {
	struct dps_pool *pool;
	int tid;
};

static void futex_wait(_Atomic uint32_t *w, uint32_t val)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Waits until *w != val; *flag counts this thread as asleep around each futex wait. */
static uint32_t wait_change(_Atomic uint32_t *w, uint32_t val, _Atomic int *flag)
{
	uint32_t now;

	for (int i = 0; i < SPINS; i++) {
		now = atomic_load_explicit(w, memory_order_acquire);
		if (now != val)
			return now;
		relax();
	}
	for (int i = 0; i < YIELDS; i++) {
		now = atomic_load_explicit(w, memory_order_acquire);
		if (now != val)
			return now;
		sched_yield();
	}
	for (;;) {
		atomic_fetch_add(flag, 1);
		/* seq_cst: the other side stores *w and then reads *flag, so one of us sees the other. */
		now = atomic_load(w);
		if (now == val)
			futex_wait(w, val);
		atomic_fetch_sub(flag, 1);
		now = atomic_load_explicit(w, memory_order_acquire);
		if (now != val)
			return now;
	}
}

#define CHUNK_BITS 20
#define CHUNK_MASK ((1u << CHUNK_BITS) - 1)

/* Claims and runs chunks of the current job until none is left. */
static void claim_loop(struct dps_pool *pool, int tid)
{
	uint64_t s = atomic_load_explicit(&pool->state, memory_order_acquire);

	for (;;) {
		const uint32_t next = (uint32_t)(s >> CHUNK_BITS) & CHUNK_MASK;
		const uint32_t total = (uint32_t)s & CHUNK_MASK;

		if (next >= total)
			return;
		if (!atomic_compare_exchange_weak(&pool->state, &s, s + ((uint64_t)1 << CHUNK_BITS)))
			continue; /* s now holds the current word */
		pool->fn(pool->arg, (int)next, tid);
		if (atomic_fetch_add(&pool->done, 1) + 1 == total && atomic_load(&pool->caller_asleep))
			futex_wake(&pool->done);
		s = atomic_load_explicit(&pool->state, memory_order_acquire);
	}
}

static void *worker_main(void *p)
{
	struct worker *wk = p;
	struct dps_pool *pool = wk->pool;
	const int tid = wk->tid;
	uint32_t seen = 0;

	free(wk);
	for (;;) {
		seen = wait_change(&pool->wake, seen, &pool->sleepers);
		if (atomic_load_explicit(&pool->stop, memory_order_acquire))
			return NULL;
		claim_loop(pool, tid);
	}
}

int dps_pool_create(struct dps_pool **out, int n)
{
	struct dps_pool *pool;
	int rc = 0;

	*out = NULL;
	if (n < 1)
		return -EINVAL;
	pool = calloc(1, sizeof(*pool));
	if (!pool)
		return -ENOMEM;
	pool->n = n;
	if (n > 1) {
		pool->threads = calloc((size_t)n, sizeof(pthread_t));
		if (!pool->threads) {
			free(pool);
			return -ENOMEM;
		}
	}
	for (int t = 1; t < n; t++) {
		struct worker *wk = malloc(sizeof(*wk));

		if (!wk) {
			rc = -ENOMEM;
		} else {
			wk->pool = pool;
			wk->tid = t;
			rc = -pthread_create(&pool->threads[t], NULL, worker_main, wk);
			if (rc)
				free(wk);
		}
		if (rc) {
			pool->n = t; /* the threads started so far */
			dps_pool_destroy(pool);
			return rc;
		}
	}
	*out = pool;
	return 0;
}

int dps_pool_size(const struct dps_pool *pool)
{
	return pool ? pool->n : 1;
}

void dps_pool_run(struct dps_pool *pool, int nchunks, dps_pool_fn fn, void *arg)
{
	uint32_t done;

	if (!pool || pool->n == 1 || nchunks <= 1) {
		for (int c = 0; c < nchunks; c++)
			fn(arg, c, 0);
		return;
	}
	DPS_ASSERT(nchunks <= (int)CHUNK_MASK);
	pool->fn = fn;
	pool->arg = arg;
	pool->job = (pool->job + 1) & 0xffffff;
	atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
	atomic_store(&pool->state, (uint64_t)pool->job << 40 | ((uint64_t)nchunks & CHUNK_MASK));
	atomic_fetch_add(&pool->wake, 1); /* seq_cst, then read sleepers */
	if (atomic_load(&pool->sleepers))
		futex_wake(&pool->wake);
	claim_loop(pool, 0);
	done = atomic_load_explicit(&pool->done, memory_order_acquire);
	while (done != (uint32_t)nchunks)
		done = wait_change(&pool->done, done, &pool->caller_asleep);
}

void dps_pool_destroy(struct dps_pool *pool)
{
	if (!pool)
		return;
	if (pool->n > 1) {
		atomic_store(&pool->stop, 1);
		atomic_fetch_add(&pool->wake, 1);
		futex_wake(&pool->wake);
		for (int t = 1; t < pool->n; t++)
			pthread_join(pool->threads[t], NULL);
	}
	free(pool->threads);
	free(pool);
}

void dps_pool_split(int n, int align, int c, int nc, int *lo, int *hi)
{
	const int chunk = ((n + nc - 1) / nc + align - 1) / align * align;
	const long a = (long)chunk * c, b = a + chunk;

	*lo = a < n ? (int)a : n;
	*hi = b < n ? (int)b : n;
}

/* SPDX-License-Identifier: MIT */
/*
 * kernels/pool.c - the rank's worker threads (see pool.h).
 *
 * Two futex words: gen, bumped by the caller for each job, and done, counted up by the
 * workers. A waiter spins (the next job usually follows within microseconds), then yields,
 * then sleeps on the futex; the other side wakes sleepers only when one is registered, so a
 * busy pool makes no system calls.
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

#include "kernels/pool.h"

enum { SPINS = 20000, YIELDS = 50 };

struct dps_pool {
	int n;
	pthread_t *threads;
	_Atomic uint32_t gen;      /* job number, futex word of the workers */
	_Atomic uint32_t done;     /* workers finished with the current job, futex word of the caller */
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

static void *worker_main(void *p)
{
	struct worker *wk = p;
	struct dps_pool *pool = wk->pool;
	const int tid = wk->tid;
	uint32_t seen = 0;

	free(wk);
	for (;;) {
		seen = wait_change(&pool->gen, seen, &pool->sleepers);
		if (atomic_load_explicit(&pool->stop, memory_order_acquire))
			return NULL;
		pool->fn(pool->arg, tid, pool->n);
		if (atomic_fetch_add(&pool->done, 1) + 1 == (uint32_t)(pool->n - 1) &&
		    atomic_load(&pool->caller_asleep))
			futex_wake(&pool->done);
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

void dps_pool_run(struct dps_pool *pool, dps_pool_fn fn, void *arg)
{
	uint32_t done;

	if (!pool || pool->n == 1) {
		fn(arg, 0, 1);
		return;
	}
	pool->fn = fn;
	pool->arg = arg;
	atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
	atomic_fetch_add(&pool->gen, 1); /* seq_cst, then read sleepers */
	if (atomic_load(&pool->sleepers))
		futex_wake(&pool->gen);
	fn(arg, 0, pool->n);
	done = atomic_load_explicit(&pool->done, memory_order_acquire);
	while (done != (uint32_t)(pool->n - 1))
		done = wait_change(&pool->done, done, &pool->caller_asleep);
}

void dps_pool_destroy(struct dps_pool *pool)
{
	if (!pool)
		return;
	if (pool->n > 1) {
		atomic_store(&pool->stop, 1);
		atomic_fetch_add(&pool->gen, 1);
		futex_wake(&pool->gen);
		for (int t = 1; t < pool->n; t++)
			pthread_join(pool->threads[t], NULL);
	}
	free(pool->threads);
	free(pool);
}

void dps_pool_split(int n, int align, int tid, int nt, int *lo, int *hi)
{
	const int chunk = ((n + nt - 1) / nt + align - 1) / align * align;
	const long a = (long)chunk * tid, b = a + chunk;

	*lo = a < n ? (int)a : n;
	*hi = b < n ? (int)b : n;
}

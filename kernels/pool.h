/* SPDX-License-Identifier: MIT */
/*
 * kernels/pool.h - the threads of one rank (--threads-per-rank). The caller is thread 0;
 * the pool keeps n - 1 more threads that wait for work, spinning briefly and then blocking
 * on a futex, so a machine with more threads than cores still makes progress.
 *
 * Work is split by the job itself from (tid, n): a job that gives each output element to
 * exactly one thread, in an order that does not depend on n, gives bit-identical results
 * whatever the number of threads.
 */
#ifndef DPS_KERNELS_POOL_H
#define DPS_KERNELS_POOL_H

struct dps_pool;

typedef void (*dps_pool_fn)(void *arg, int tid, int n);

/*
 * Starts a pool of n threads in all (n >= 1; n = 1 starts none). Returns 0 or a negative
 * errno code.
 */
int dps_pool_create(struct dps_pool **pool, int n);

/* Threads in the pool, the caller included (1 for a NULL pool). */
int dps_pool_size(const struct dps_pool *pool);

/*
 * Runs fn(arg, tid, n) on every thread, tid = 0 on the caller, and returns when all have
 * returned. A NULL pool runs fn(arg, 0, 1). Not reentrant: one caller at a time.
 */
void dps_pool_run(struct dps_pool *pool, dps_pool_fn fn, void *arg);

/* Stops and joins the threads. NULL is allowed. */
void dps_pool_destroy(struct dps_pool *pool);

/*
 * The slice [*lo, *hi) of n items that thread tid of nt takes, in chunks that are multiples
 * of align (the last slice takes the remainder; a slice may be empty).
 */
void dps_pool_split(int n, int align, int tid, int nt, int *lo, int *hi);

#endif

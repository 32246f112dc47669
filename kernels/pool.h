/* SPDX-License-Identifier: MIT */
/*
 * kernels/pool.h - the threads of one rank (--threads-per-rank). The caller is thread 0;
 * the pool keeps n - 1 more threads that wait for work, spinning briefly and then blocking
 * on a futex, so a machine with more threads than cores still makes progress.
 *
 * A job is a number of chunks that the threads claim one at a time, the caller included: a
 * thread that is descheduled (more threads than cores, or another process on its core) holds
 * up at most the one chunk it claimed, never a fixed share of the job. The work of a chunk
 * depends on its index only, not on the thread that runs it, so results are bit-identical
 * whoever runs what.
 */
#ifndef DPS_KERNELS_POOL_H
#define DPS_KERNELS_POOL_H

struct dps_pool;

/* Runs chunk `chunk` of a job; tid (0 = the caller, < dps_pool_size) is for per-thread scratch. */
typedef void (*dps_pool_fn)(void *arg, int chunk, int tid);

/*
 * Starts a pool of n threads in all (n >= 1; n = 1 starts none). Returns 0 or a negative
 * errno code.
 */
int dps_pool_create(struct dps_pool **pool, int n);

/* Threads in the pool, the caller included (1 for a NULL pool). */
int dps_pool_size(const struct dps_pool *pool);

/*
 * Runs fn(arg, c, tid) for every chunk c in [0, nchunks) (0 <= nchunks < 2^20), each once,
 * on whichever threads claim them, and returns when all have returned. A NULL pool runs them
 * in order on the caller. Not reentrant: one caller at a time.
 */
void dps_pool_run(struct dps_pool *pool, int nchunks, dps_pool_fn fn, void *arg);

/* Stops and joins the threads. NULL is allowed. */
void dps_pool_destroy(struct dps_pool *pool);

/*
 * The slice [*lo, *hi) of n items that chunk c of nc covers, slices being multiples of align
 * (the last takes the remainder; a slice may be empty).
 */
void dps_pool_split(int n, int align, int c, int nc, int *lo, int *hi);

#endif

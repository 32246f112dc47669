/* SPDX-License-Identifier: MIT */
/*
 * shm/coll_int.h - what the collectives' files share (coll.c, coll_window.c): the layout of a
 * slot, the steps and waits of coll.c's header comment, and the in-place calls of windows.
 * Private to shm/.
 */
#ifndef DPS_SHM_COLL_INT_H
#define DPS_SHM_COLL_INT_H

#include <string.h>

#include "common/dps.h"
#include "shm/coll.h"
#include "shm/copy.h"

/* ---- windows (coll.h) ---------------------------------------------------------------------- */

static inline unsigned char *window_of(const struct dps_comm *c, int member)
{
	return c->windows + (size_t)member * c->window_bytes;
}

/* Whether bytes at p lie wholly inside this member's window. */
static inline int in_window(const struct dps_comm *c, const void *p, size_t bytes)
{
	const unsigned char *w = c->windows ? window_of(c, c->me) : NULL;

	return w && (const unsigned char *)p >= w && bytes <= c->window_bytes &&
	       (size_t)((const unsigned char *)p - w) <= c->window_bytes - bytes;
}

/* ---- steps ------------------------------------------------------------------------------ */

static inline unsigned char *slot_of(const struct dps_comm *c, int member, unsigned k)
{
	return c->slots + ((size_t)member * 2 + k) * c->slot_bytes;
}

/*
 * A slot's first line holds its step flag: the step whose data the slot now holds, stored
 * (release) after the data. Readers wait on the flag rather than on the writer's posted-step
 * word, and a message of at most TINY bytes sits in the flag's own line, so a small
 * all-reduce costs one cache-line transfer per peer instead of two. Larger data starts at the
 * next line. The flag's bytes never hold data, so a stale flag is always an older step.
 */
#define SLOT_HDR DPS_CACHELINE
#define TINY (DPS_CACHELINE - sizeof(uint64_t))

static inline _Atomic uint64_t *slot_flag(const struct dps_comm *c, int member, unsigned k)
{
	return (_Atomic uint64_t *)(void *)slot_of(c, member, k);
}

static inline unsigned char *slot_data(const struct dps_comm *c, int member, unsigned k, int tiny)
{
	return slot_of(c, member, k) + (tiny ? sizeof(uint64_t) : SLOT_HDR);
}

/* Data bytes one slot carries. */
static inline size_t slot_cap(const struct dps_comm *c)
{
	return c->slot_bytes - SLOT_HDR;
}

static inline int all_posted(const struct dps_comm *c, uint64_t s)
{
	for (int i = 0; i < c->n; i++)
		if (atomic_load_explicit(&c->post[i].val, memory_order_acquire) < s)
			return 0;
	return 1;
}

/* Publishes step s of this member (see the header comment for what that promises). */
static inline void step_post(struct dps_comm *c, uint64_t s)
{
	c->seq = s;
	atomic_store_explicit(&c->post[c->me].val, s, memory_order_release);
}

/*
 * Waiters sleep on the group's bell, so whoever completes step s rings it: called by every
 * member once its own wait for step s is over (or right after posting, when it waits for
 * nobody), it rings when someone sleeps and every member has posted s. The last member to
 * post never blocks before getting here, so every sleeper is woken; doing it after the wait
 * rather than right after the post keeps the fence (which drains our stores) off the path
 * on which the peers wait for our data. The fence pairs with the one in dps_wait_pred after
 * a sleeper registers (store-buffering: one of the two sees the other).
 */
static inline void step_ring(struct dps_comm *c, uint64_t s)
{
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&c->bell->sleepers, memory_order_relaxed) && all_posted(c, s))
		dps_bell_ring(c->bell);
}

/*
 * Publishes this member's data of step s in slot k: flag first (release, so the data is
 * visible to whoever sees it), then the posted-step word that slot reuse and the bell use.
 */
static inline void step_publish(struct dps_comm *c, unsigned k, uint64_t s)
{
	atomic_store_explicit(slot_flag(c, c->me, k), s, memory_order_release);
	step_post(c, s);
}

struct wait_arg {
	const struct dps_comm *c;
	int member;  /* -1: every member */
	int flags;   /* 1: slot k's step flags, 0: posted-step words */
	unsigned k;
	uint64_t s;
};

static inline int ready(const struct dps_comm *c, int i, int flags, unsigned k, uint64_t s)
{
	const _Atomic uint64_t *w = flags ? slot_flag(c, i, k) : &c->post[i].val;

	return atomic_load_explicit(w, memory_order_acquire) >= s;
}

static inline int wait_pred(void *p)
{
	const struct wait_arg *a = p;

	if (a->member >= 0)
		return ready(a->c, a->member, a->flags, a->k, a->s);
	/* Not our own word: we wrote it before waiting, and reading back a line we have just
	 * written while the peers read it waits for our stores to land. */
	for (int i = 0; i < a->c->n; i++)
		if (i != a->c->me && !ready(a->c, i, a->flags, a->k, a->s))
			return 0;
	return 1;
}

/*
 * Waits until member j (every member for j = -1) has reached step s: posted it (flags = 0)
 * or published step-s data in slot k (flags = 1). A member that published data for step s
 * has finished reading every earlier step, exactly as if it had posted s, and the bell is
 * rung only once every member posted, after their flags, so sleeping works for both.
 */
static inline int wait_step(struct dps_comm *c, int j, int flags, unsigned k, uint64_t s)
{
	struct wait_arg a = { c, j, flags, k, s };
	int rc = 0;

	if (j < 0 && c->min_posted >= s)
		return 0;
	if (!wait_pred(&a))
		rc = dps_wait_pred(wait_pred, &a, c->bell, c->abort_word);
	if (!rc && j < 0)
		c->min_posted = s;
	return rc;
}

/* Waits until every member has posted step s. */
static inline int wait_all(struct dps_comm *c, uint64_t s)
{
	return wait_step(c, -1, 0, 0, s);
}

/* Waits until every member has published step s's data in slot k. */
static inline int wait_data(struct dps_comm *c, unsigned k, uint64_t s)
{
	return wait_step(c, -1, 1, k, s);
}

/* One exchange step: publish our data of step s in slot k, wait for everyone's, ring. */
static inline int step_sync(struct dps_comm *c, unsigned k, uint64_t s)
{
	int rc;

	step_publish(c, k, s);
	rc = wait_data(c, k, s);
	if (!rc)
		step_ring(c, s);
	return rc;
}

/* Picks the next slot and waits until every reader of its last use has moved on. */
static inline int slot_acquire(struct dps_comm *c, unsigned *k)
{
	*k = c->next_slot;
	c->next_slot ^= 1;
	if (c->slot_last[*k] == 0)
		return 0;
	return wait_all(c, c->slot_last[*k] + 1);
}

struct timer {
	uint64_t t0;
	enum dps_coll_kind kind;
};

/* Calls and bytes are always counted; time only when c->timing is set (two clock reads cost
 * about a tenth of a small all-reduce). */
#define stat_begin(c, k) ((struct timer){ (c)->timing ? dps_now_ns() : 0, (k) })

static inline int stat_end(struct dps_comm *c, struct timer t, size_t bytes, int rc)
{
	c->stats.calls[t.kind]++;
	c->stats.bytes[t.kind] += bytes;
	if (c->timing)
		c->stats.ns[t.kind] += dps_now_ns() - t.t0;
	return rc;
}

/* A step without data: every member posts it and waits until all have. */
static inline int sync_all(struct dps_comm *c)
{
	const uint64_t s = c->seq + 1;
	int rc;

	step_post(c, s);
	rc = wait_all(c, s);
	if (!rc)
		step_ring(c, s);
	return rc;
}

/*
 * Part q of a chunk of m elements, in 64-byte units so that members writing neighbouring
 * parts of one slot never share a cache line.
 */
static inline void part_range(size_t m, size_t esz, int n, int q, size_t *lo, size_t *len)
{
	const size_t unit = DPS_CACHELINE / esz;
	const size_t units = (m + unit - 1) / unit;
	size_t a = units * (size_t)q / (size_t)n * unit;
	size_t b = units * (size_t)(q + 1) / (size_t)n * unit;

	if (a > m)
		a = m;
	if (b > m)
		b = m;
	*lo = a;
	*len = b - a;
}

/* ---- write mode (coll.c): whether this call of `kind` writes its slots streamed
 * (c->stream_now), chosen for a message of `bytes` it writes (0: it writes none); pick_end
 * times the call (t0: pick_begin's value). */
uint64_t dps_coll_pick_begin(struct dps_comm *c, enum dps_coll_kind kind, size_t bytes);
void dps_coll_pick_end(struct dps_comm *c, size_t bytes, uint64_t t0, int rc);

/* Writes len bytes of this member's data into its slot, in this call's write mode. */
static inline void slot_write(const struct dps_comm *c, void *dst, const void *src, size_t len)
{
	if (c->stream_now)
		dps_copy_stream(dst, src, len);
	else
		memcpy(dst, src, len);
}

/* ---- in place (coll_window.c): called by coll.c's entry points when the input lies in the
 * caller's window, after the arguments are checked and with n > 1; return 0, -DPS_EABORT or
 * -EINVAL. */
int dps_coll_allreduce_window(struct dps_comm *c, const void *send, void *recv, size_t count,
			      enum dps_dtype t);
int dps_coll_allgatherv_window(struct dps_comm *c, const void *send, void *recv,
			       const size_t *counts, const size_t *displs, size_t esz);
int dps_coll_reducescatterv_window(struct dps_comm *c, const void *send, void *recv,
				   const size_t *counts, enum dps_dtype t);

/* Whether some member published the ready header of an in-place call of step s in slot k:
 * checked by the copying paths after their first step, so that a group whose members do not
 * all call in place fails on every member (-EINVAL) after the same single step. */
int dps_coll_peer_in_place(const struct dps_comm *c, unsigned k, uint64_t s);

/* The first word of a single-copy all-gather's headers (coll_cma.c); the second is the step. */
#define DPS_CMA_MAGIC 0x434d416864720100ull

/*
 * The single-copy all-gather (coll_cma.c): 0 done, 1 the kernel refused a read (the group
 * stops trying: the caller takes the slots), or -DPS_EABORT / -EINVAL.
 */
int dps_coll_allgatherv_cma(struct dps_comm *c, const void *send, void *recv,
			    const size_t *counts, const size_t *displs, size_t esz);

/* ---- a member's handle (coll.c) ------------------------------------------------------------ */

/* Zeroes c and sets what every handle has: 0, or -EINVAL for a bad n or me. */
int dps_comm_base(struct dps_comm *c, int n, int me, const int *ranks,
		  const _Atomic uint32_t *abort_word);
/* The calls' scratch (n entries each): 0, or -ENOMEM (c detached). */
int dps_comm_scratch(struct dps_comm *c);

/* ---- groups that cross nodes (coll_x.c) ------------------------------------------------- */

int dps_xcoll_barrier(struct dps_comm *c);
int dps_xcoll_bcast(struct dps_comm *c, void *buf, size_t bytes, int root);
int dps_xcoll_allgatherv(struct dps_comm *c, const void *send, void *recv, const size_t *counts,
			 const size_t *displs, size_t esz, size_t total);
int dps_xcoll_allreduce(struct dps_comm *c, const void *send, void *recv, size_t count,
			enum dps_dtype t);
int dps_xcoll_reducescatterv(struct dps_comm *c, const void *send, void *recv,
			     const size_t *counts, enum dps_dtype t);
int dps_xcoll_alltoallv(struct dps_comm *c, const void *send, const size_t *scounts,
			const size_t *sdispls, void *recv, const size_t *rcounts,
			const size_t *rdispls, enum dps_dtype t);

#endif

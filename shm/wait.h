/* SPDX-License-Identifier: MIT */
/*
 * shm/wait.h - waiting on a 64-bit counter in shared memory until it reaches a target.
 *
 * A dps_wword is one cache line: a monotonically increasing 64-bit value and a count of
 * processes asleep on it. A waiter spins briefly, then yields, then sleeps with FUTEX_WAIT on
 * the low 32 bits of the value; the writer calls FUTEX_WAKE only when the sleeper count is
 * non-zero, so the fast path is one store and one load. Every wait also watches the instance's
 * abort word and returns -DPS_EABORT once it is raised: sleeps are bounded (DPS_WAIT_SLICE_MS)
 * so a raised abort is seen within that time even if nobody wakes the sleeper.
 *
 * The policy (how long to spin and yield before sleeping) is per process: a rank that has a
 * core of its own spins longer; ranks that share cores go to sleep sooner so that the peer
 * they wait for can run.
 *
 * Progress. A process may name two words (dps_wait_set_beat). "Alive": every yield round and
 * every sleep slice of a wait bumps it, and so does dps_beat(). "Work": only dps_work() bumps
 * it (and alive with it), which computations call (once per layer, once per step), never a
 * wait. The supervisor reads both (docs/DESIGN.md section 1): a rank whose work stopped is
 * stalled; if its alive word stopped too it is stopped or stuck, the one to blame (its peers
 * that wait for it keep beating); if every stalled rank is still alive they all wait, on each
 * other or on something that never comes: a deadlock.
 */
#ifndef DPS_SHM_WAIT_H
#define DPS_SHM_WAIT_H

#include <stdatomic.h>
#include <stdint.h>

#include "common/dps.h"

#define DPS_WAIT_SLICE_MS 50

struct dps_wword {
	_Alignas(DPS_CACHELINE) _Atomic uint64_t val;
	_Atomic uint32_t sleepers; /* processes inside FUTEX_WAIT on val (low half) */
	char pad[DPS_CACHELINE - sizeof(uint64_t) - sizeof(uint32_t)];
};

struct dps_wait_policy {
	unsigned spins;  /* busy polls (with a pause) before yielding */
	unsigned yields; /* sched_yield() rounds before sleeping */
};

/* Process-wide policy; defaults suit a rank with a core of its own. */
void dps_wait_set_policy(const struct dps_wait_policy *p);
void dps_wait_get_policy(struct dps_wait_policy *p);
/* Picks a policy for `ranks` processes sharing `cpus` cores. */
void dps_wait_policy_for(unsigned ranks, unsigned cpus, struct dps_wait_policy *out);

/*
 * Publishes v (which must be >= the current value) and wakes sleepers if there are any.
 * Release semantics: everything written before the call is visible to a waiter that sees v.
 */
static inline void dps_wword_publish(struct dps_wword *w, uint64_t v);

/*
 * Blocks until w->val >= target. Returns 0 (acquire: the writer's prior stores are visible),
 * -DPS_EABORT when *abort_word becomes non-zero, or -ETIMEDOUT when timeout_ns (0 = none)
 * elapses. abort_word may be NULL. On success *seen (if not NULL) receives the value read.
 */
static inline int dps_wword_wait(struct dps_wword *w, uint64_t target,
				 const _Atomic uint32_t *abort_word, uint64_t timeout_ns,
				 uint64_t *seen);

/*
 * The alive and work words of this process (NULL: none, the default). They must outlive every
 * later wait of the process; in a rank they are its line of the instance's control block.
 */
void dps_wait_set_beat(_Atomic uint64_t *alive, _Atomic uint64_t *work);

extern _Atomic uint64_t *dps_wait_beat_word, *dps_wait_work_word;

/* Says "this process advanced": one relaxed increment of the heartbeat word, if any. */
static inline void dps_beat(void)
{
	/*
	 * Relaxed: the word publishes no data. The supervisor only compares the values it reads
	 * from one check to the next; a stale read delays its verdict by one check at most.
	 */
	if (dps_wait_beat_word)
		atomic_fetch_add_explicit(dps_wait_beat_word, 1, memory_order_relaxed);
}

/* Says "this process computed" (a layer, a step): one relaxed increment of the work word and
 * of the alive word. Never called by a wait. */
static inline void dps_work(void)
{
	/* Relaxed, as dps_beat: only compared from one check to the next. */
	if (dps_wait_work_word)
		atomic_fetch_add_explicit(dps_wait_work_word, 1, memory_order_relaxed);
	dps_beat();
}

/* Slow paths, in wait.c. */
int dps_wword_wait_slow(struct dps_wword *w, uint64_t target, const _Atomic uint32_t *abort_word,
			uint64_t timeout_ns, uint64_t *seen);
void dps_wword_wake(struct dps_wword *w);

static inline void dps_wword_publish(struct dps_wword *w, uint64_t v)
{
	/*
	 * seq_cst store then seq_cst load of sleepers: pairs with the waiter's seq_cst increment
	 * of sleepers followed by its load of val (Dekker), so either the waiter sees v or we see
	 * the waiter and wake it.
	 */
	atomic_store_explicit(&w->val, v, memory_order_seq_cst);
	if (atomic_load_explicit(&w->sleepers, memory_order_seq_cst))
		dps_wword_wake(w);
}

static inline int dps_wword_wait(struct dps_wword *w, uint64_t target,
				 const _Atomic uint32_t *abort_word, uint64_t timeout_ns,
				 uint64_t *seen)
{
	uint64_t v = atomic_load_explicit(&w->val, memory_order_acquire);

	if (v >= target) {
		if (seen)
			*seen = v;
		return 0;
	}
	return dps_wword_wait_slow(w, target, abort_word, timeout_ns, seen);
}

/*
 * A bell: waiters whose condition involves several words (every member of a group has
 * posted) sleep on one shared dps_wword; whoever makes the condition true rings it.
 * dps_wait_pred spins and yields while testing pred(arg), then sleeps on the bell; it returns
 * 0 once pred is true or -DPS_EABORT. The ringer must make its store visible before it loads
 * bell->sleepers (seq_cst), and must ring whenever it may have made some waiter's pred true
 * while sleepers is non-zero.
 */
int dps_wait_pred(int (*pred)(void *arg), void *arg, struct dps_wword *bell,
		  const _Atomic uint32_t *abort_word);
void dps_bell_ring(struct dps_wword *bell);

/* Raises an abort word and wakes nobody (waiters notice within DPS_WAIT_SLICE_MS). */
static inline void dps_abort_raise(_Atomic uint32_t *abort_word)
{
	atomic_store_explicit(abort_word, 1, memory_order_seq_cst);
}

static inline int dps_abort_raised(const _Atomic uint32_t *abort_word)
{
	return abort_word && atomic_load_explicit(abort_word, memory_order_relaxed);
}

#endif

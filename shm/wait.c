/* SPDX-License-Identifier: MIT */
/*
 * shm/wait.c - the slow path of dps_wword_wait: spin, yield, then FUTEX_WAIT with a bounded
 * slice so that the abort word is always re-read. Used by every collective and ring.
 */
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shm/wait.h"

static struct dps_wait_policy policy = { .spins = 4000, .yields = 50 };

_Atomic uint64_t *dps_wait_beat_word, *dps_wait_work_word;

void dps_wait_set_beat(_Atomic uint64_t *alive, _Atomic uint64_t *work)
{
	dps_wait_beat_word = alive;
	dps_wait_work_word = work;
}

void dps_wait_set_policy(const struct dps_wait_policy *p)
{
	policy = *p;
}

void dps_wait_get_policy(struct dps_wait_policy *p)
{
	*p = policy;
}

void dps_wait_policy_for(unsigned ranks, unsigned cpus, struct dps_wait_policy *out)
{
	const char *env_spins = getenv("DPS_WAIT_SPINS"), *env_yields = getenv("DPS_WAIT_YIELDS");

	if (env_spins && env_yields) {
		/* Experiments and benchmarks only: both must be given. */
		out->spins = (unsigned)strtoul(env_spins, NULL, 10);
		out->yields = (unsigned)strtoul(env_yields, NULL, 10);
		return;
	}
	if (cpus == 0)
		cpus = 1;
	if (ranks <= cpus) {
		/* Every peer runs at the same time: a cache-line round trip is ~100 ns. */
		out->spins = 20000;
		out->yields = 100;
	} else {
		/*
		 * The peer we wait for may need our core: give it up at once, sleep soon. No
		 * busy polls at all: with 8 ranks on 2 cores, 50 polls (about 0.7 us of pause)
		 * before each yield made a 64-byte all-reduce twice as slow (16 against 8 us,
		 * bench coll --method osu, 2026-12-06), and 5 yields served as well as 20.
		 */
		out->spins = 0;
		out->yields = 5;
	}
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* The futex word is the low 32 bits of val (little-endian layout). */
static inline uint32_t *futex_word(struct dps_wword *w)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return (uint32_t *)(void *)&w->val;
#else
	return (uint32_t *)(void *)&w->val + 1;
#endif
}

void dps_wword_wake(struct dps_wword *w)
{
	/* Not FUTEX_PRIVATE: the word lives in memory shared between processes. */
	syscall(SYS_futex, futex_word(w), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

int dps_wword_wait_slow(struct dps_wword *w, uint64_t target, const _Atomic uint32_t *abort_word,
			uint64_t timeout_ns, uint64_t *seen)
{
	uint64_t v, deadline = 0;
	unsigned i;

	for (i = 0; i < policy.spins; i++) {
		v = atomic_load_explicit(&w->val, memory_order_acquire);
		if (v >= target)
			goto done;
		if ((i & 63) == 63 && dps_abort_raised(abort_word))
			return -DPS_EABORT;
		cpu_relax();
	}
	if (timeout_ns)
		deadline = dps_now_ns() + timeout_ns;
	for (i = 0; i < policy.yields; i++) {
		v = atomic_load_explicit(&w->val, memory_order_acquire);
		if (v >= target)
			goto done;
		if (dps_abort_raised(abort_word))
			return -DPS_EABORT;
		/* Under load one yield can hand the CPU away for a whole time slice. */
		if (deadline && dps_now_ns() >= deadline)
			return -ETIMEDOUT;
		dps_beat();
		sched_yield();
	}
	for (;;) {
		struct timespec ts = { 0, DPS_WAIT_SLICE_MS * 1000000L };

		if (dps_abort_raised(abort_word))
			return -DPS_EABORT;
		if (deadline) {
			uint64_t now = dps_now_ns();

			if (now >= deadline)
				return -ETIMEDOUT;
			if (deadline - now < (uint64_t)ts.tv_nsec)
				ts.tv_nsec = (long)(deadline - now);
		}
		dps_beat(); /* waiting is progress: the one we wait for is the one to blame */
		/* seq_cst increment, then seq_cst load of val: see dps_wword_publish. */
		atomic_fetch_add_explicit(&w->sleepers, 1, memory_order_seq_cst);
		v = atomic_load_explicit(&w->val, memory_order_seq_cst);
		if (v >= target) {
			atomic_fetch_sub_explicit(&w->sleepers, 1, memory_order_relaxed);
			goto done;
		}
		syscall(SYS_futex, futex_word(w), FUTEX_WAIT, (uint32_t)v, &ts, NULL, 0);
		atomic_fetch_sub_explicit(&w->sleepers, 1, memory_order_relaxed);
		v = atomic_load_explicit(&w->val, memory_order_acquire);
		if (v >= target)
			goto done;
	}
done:
	if (seen)
		*seen = v;
	return 0;
}

void dps_bell_ring(struct dps_wword *bell)
{
	atomic_fetch_add_explicit(&bell->val, 1, memory_order_seq_cst);
	dps_wword_wake(bell);
}

int dps_wait_pred(int (*pred)(void *arg), void *arg, struct dps_wword *bell,
		  const _Atomic uint32_t *abort_word)
{
	unsigned i;

	for (i = 0; i < policy.spins; i++) {
		if (pred(arg))
			return 0;
		if ((i & 63) == 63 && dps_abort_raised(abort_word))
			return -DPS_EABORT;
		cpu_relax();
	}
	for (i = 0; i < policy.yields; i++) {
		if (pred(arg))
			return 0;
		if (dps_abort_raised(abort_word))
			return -DPS_EABORT;
		dps_beat();
		sched_yield();
	}
	for (;;) {
		struct timespec ts = { 0, DPS_WAIT_SLICE_MS * 1000000L };
		uint64_t b;

		if (dps_abort_raised(abort_word))
			return -DPS_EABORT;
		dps_beat();
		/* Register, read the bell, then test: the fence pairs with the ringer's fence
		 * between its stores and its load of sleepers. */
		atomic_fetch_add_explicit(&bell->sleepers, 1, memory_order_seq_cst);
		atomic_thread_fence(memory_order_seq_cst);
		b = atomic_load_explicit(&bell->val, memory_order_seq_cst);
		if (pred(arg)) {
			atomic_fetch_sub_explicit(&bell->sleepers, 1, memory_order_relaxed);
			return 0;
		}
		syscall(SYS_futex, futex_word(bell), FUTEX_WAIT, (uint32_t)b, &ts, NULL, 0);
		atomic_fetch_sub_explicit(&bell->sleepers, 1, memory_order_relaxed);
		if (pred(arg))
			return 0;
	}
}

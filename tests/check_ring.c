/* SPDX-License-Identifier: MIT */
/*
 * tests/check_ring.c - Check suite for shm/ring.c, the single-writer rings that carry
 * supervisor <-> rank traffic, and for the waiting of shm/wait.c underneath them.
 *
 * Every test puts one ring and the instance's abort word in one MAP_SHARED|MAP_ANONYMOUS
 * mapping, as the supervisor does, and forks the other side where a test needs one. Single
 * process tests cover order, lengths (0 up to slot_bytes), the -EMSGSIZE, -EAGAIN and
 * -ETIMEDOUT paths and the "every reader must release a slot" rule. Cross-process tests push
 * 100000 checksummed messages of varying length through 4 slots to 1 and 3 readers, make the
 * writer block on a stalled reader, raise the abort word under a blocked reader and a blocked
 * writer (seen asleep first), check the eventfd notification, and run 16 readers and a writer
 * on 2 CPUs, which finishes only because waiters give their CPU up; test_waits_sleep measures
 * that a wait costs little CPU. The oracle is msg_verify (sequence number, length and checksum
 * of each message); a deliberate-fault test corrupts a byte in a shared slot to prove it fails.
 */
#include <check.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/ring_util.h"

/* ---------------------------------------------------------------------------------------
 * Single process
 */

START_TEST(test_size_init_attach)
{
	struct fixture f;
	struct dps_ring r;
	size_t size;
	char mem[8192] __attribute__((aligned(64)));

	/* The last slot ends inside the memory dps_ring_shm_size asked for. */
	area_open(&f, 4, 3, 100);
	size = dps_ring_shm_size(4, 3, 100);
	ring_open(&f, &r, 7);
	ck_assert_ptr_eq(r.sh, f.ring_mem);
	ck_assert_int_eq(r.notify_fd, 7);
	ck_assert_uint_ge(r.stride, 100 + 8);
	ck_assert_uint_eq(r.stride % DPS_CACHELINE, 0);
	ck_assert_uint_eq((uintptr_t)r.tail % DPS_CACHELINE, 0);
	ck_assert_uint_eq((uintptr_t)r.slots % DPS_CACHELINE, 0);
	ck_assert(r.slots >= (unsigned char *)(r.tail + 3));
	ck_assert_uint_le((size_t)(r.slots + 4 * r.stride - (unsigned char *)f.ring_mem), size);
	ck_assert_uint_eq(dps_ring_pending(&r, 0), 0);
	area_close(&f);

	/* Sizes that overflow give 0. */
	ck_assert_uint_eq(dps_ring_shm_size(2, 1, SIZE_MAX), 0);
	ck_assert_uint_eq(dps_ring_shm_size(2, 1, SIZE_MAX - 60), 0);
	ck_assert_uint_eq(dps_ring_shm_size(0xffffffffu, 1, SIZE_MAX / 4), 0);

	memset(mem, 0, sizeof(mem));
	ck_assert_int_eq(dps_ring_init(mem, 0, 1, 8), -EINVAL);
	ck_assert_int_eq(dps_ring_init(mem, 4, 0, 8), -EINVAL);
	ck_assert_int_eq(dps_ring_init(mem, 4, DPS_RING_MAX_READERS + 1, 8), -EINVAL);
	ck_assert_int_eq(dps_ring_init(mem, 4, 1, 0), -EINVAL);
	ck_assert_uint_le(dps_ring_shm_size(1, DPS_RING_MAX_READERS, 8), sizeof(mem));
	ck_assert_int_eq(dps_ring_init(mem, 1, DPS_RING_MAX_READERS, 8), 0);
}
END_TEST

/* Byte j of test message i (single-process tests). */
static unsigned char pattern(unsigned i, size_t j)
{
	return (unsigned char)(i * 131u + (unsigned)j * 7u + 1u);
}

START_TEST(test_order_and_lengths)
{
	static const size_t edge[] = { 0, 1, 7, 8, 9, 63, 64, 65, 99, 100, 0, 100 };
	const size_t n_edge = sizeof(edge) / sizeof(edge[0]);
	unsigned char msg[100], buf[128];
	struct fixture f;
	struct dps_ring w, r;
	unsigned i, k, pushed = 0, popped = 0;
	size_t len, j;

	area_open(&f, 4, 1, 100);
	ring_open(&f, &w, -1);
	ring_open(&f, &r, -1);
	/* Edge lengths first, then 1000 more, in bursts of 1..4 so that every slot wraps. */
	while (popped < n_edge + 1000) {
		const unsigned burst = 1 + popped % 4;

		for (k = 0; k < burst && pushed < n_edge + 1000; k++, pushed++) {
			len = pushed < n_edge ? edge[pushed] : pushed % 101;
			for (j = 0; j < len; j++)
				msg[j] = pattern(pushed, j);
			ck_assert_int_eq(dps_ring_push(&w, msg, len, MS), 0);
		}
		ck_assert_uint_eq(dps_ring_pending(&r, 0), pushed - popped);
		for (; popped < pushed; popped++) {
			const size_t want = popped < n_edge ? edge[popped] : popped % 101;

			memset(buf, 0xee, sizeof(buf));
			len = 12345;
			ck_assert_int_eq(dps_ring_pop(&r, 0, buf, sizeof(buf), &len, MS), 0);
			ck_assert_uint_eq(len, want);
			for (j = 0; j < want; j++)
				if (buf[j] != pattern(popped, j))
					ck_abort_msg("message %u byte %zu: 0x%02x, want 0x%02x", popped,
						     j, buf[j], pattern(popped, j));
			/* (if + abort: a passing ck_assert costs a write to Check's pipe) */
			for (; j < sizeof(buf); j++)
				if (buf[j] != 0xee)
					ck_abort_msg("message %u wrote past its %zu bytes", popped, want);
		}
	}
	ck_assert_uint_eq(dps_ring_pending(&r, 0), 0);
	ck_assert_int_eq(dps_ring_trypop(&r, 0, buf, sizeof(buf), &len), -EAGAIN);
	/* A message exactly slot_bytes long fits into a buffer of exactly that size. */
	for (i = 0; i < 100; i++)
		msg[i] = (unsigned char)i;
	ck_assert_int_eq(dps_ring_push(&w, msg, 100, 0), 0);
	ck_assert_int_eq(dps_ring_pop(&r, 0, buf, 100, &len, 0), 0);
	ck_assert_uint_eq(len, 100);
	ck_assert_mem_eq(buf, msg, 100);
	area_close(&f);
}
END_TEST

START_TEST(test_emsgsize)
{
	unsigned char msg[101], buf[128];
	struct fixture f;
	struct dps_ring w, r;
	size_t len;
	int i;

	area_open(&f, 4, 1, 100);
	ring_open(&f, &w, -1);
	ring_open(&f, &r, -1);
	memset(msg, 0x5a, sizeof(msg));

	/* Too long to push: refused, nothing published. */
	ck_assert_int_eq(dps_ring_push(&w, msg, 101, 0), -EMSGSIZE);
	ck_assert_int_eq(dps_ring_push(&w, msg, SIZE_MAX, 0), -EMSGSIZE);
	ck_assert_uint_eq(dps_ring_pending(&r, 0), 0);
	ck_assert_int_eq(dps_ring_trypop(&r, 0, buf, sizeof(buf), &len), -EAGAIN);

	/* Too long for the reader's buffer: dropped, length reported, the next one arrives. */
	msg[0] = 'A';
	ck_assert_int_eq(dps_ring_push(&w, msg, 50, 0), 0);
	msg[0] = 'B';
	ck_assert_int_eq(dps_ring_push(&w, msg, 10, 0), 0);
	msg[0] = 'C';
	ck_assert_int_eq(dps_ring_push(&w, msg, 100, 0), 0);
	msg[0] = 'D';
	ck_assert_int_eq(dps_ring_push(&w, msg, 20, 0), 0);
	ck_assert_int_eq(dps_ring_pop(&r, 0, buf, 20, &len, MS), -EMSGSIZE);
	ck_assert_uint_eq(len, 50);
	ck_assert_uint_eq(dps_ring_pending(&r, 0), 3);
	ck_assert_int_eq(dps_ring_pop(&r, 0, buf, 20, &len, MS), 0);
	ck_assert_uint_eq(len, 10);
	ck_assert_int_eq(buf[0], 'B');
	ck_assert_int_eq(dps_ring_trypop(&r, 0, buf, 99, &len), -EMSGSIZE);
	ck_assert_uint_eq(len, 100);
	ck_assert_int_eq(dps_ring_trypop(&r, 0, buf, 20, &len), 0);
	ck_assert_uint_eq(len, 20);
	ck_assert_int_eq(buf[0], 'D');
	ck_assert_uint_eq(dps_ring_pending(&r, 0), 0);

	/* Dropped messages released their slots: four pushes fit without waiting. */
	for (i = 0; i < 4; i++)
		ck_assert_int_eq(dps_ring_push(&w, msg, 1, MS), 0);
	area_close(&f);
}
END_TEST

START_TEST(test_trypop_and_bad_reader)
{
	unsigned char buf[16];
	struct fixture f;
	struct dps_ring w, r;
	size_t len;

	area_open(&f, 4, 2, 16);
	ring_open(&f, &w, -1);
	ring_open(&f, &r, -1);
	ck_assert_int_eq(dps_ring_trypop(&r, 0, buf, sizeof(buf), &len), -EAGAIN);
	ck_assert_int_eq(dps_ring_trypop(&r, 1, buf, sizeof(buf), &len), -EAGAIN);
	ck_assert_int_eq(dps_ring_push(&w, "hello", 5, 0), 0);
	ck_assert_int_eq(dps_ring_trypop(&r, 0, buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, 5);
	ck_assert_mem_eq(buf, "hello", 5);
	ck_assert_int_eq(dps_ring_trypop(&r, 0, buf, sizeof(buf), &len), -EAGAIN);
	/* Reader 1 has its own position: the message still waits for it. */
	ck_assert_uint_eq(dps_ring_pending(&r, 1), 1);
	ck_assert_int_eq(dps_ring_trypop(&r, 1, buf, sizeof(buf), &len), 0);
	ck_assert_mem_eq(buf, "hello", 5);
	ck_assert_int_eq(dps_ring_trypop(&r, 1, buf, sizeof(buf), &len), -EAGAIN);
	/* No reader 2. */
	ck_assert_int_eq(dps_ring_trypop(&r, 2, buf, sizeof(buf), &len), -EINVAL);
	ck_assert_int_eq(dps_ring_pop(&r, 2, buf, sizeof(buf), &len, MS), -EINVAL);
	area_close(&f);
}
END_TEST

START_TEST(test_timeouts)
{
	unsigned char buf[16];
	struct fixture f;
	struct dps_ring w, r;
	uint64_t t0, dt;
	size_t len;
	int i;

	area_open(&f, 4, 1, 16);
	ring_open(&f, &w, -1);
	ring_open(&f, &r, -1);

	t0 = dps_now_ns();
	ck_assert_int_eq(dps_ring_pop(&r, 0, buf, sizeof(buf), &len, 50 * MS), -ETIMEDOUT);
	dt = dps_now_ns() - t0;
	ck_assert_msg(dt >= 50 * MS && dt < 2000 * MS, "pop timed out after %.1f ms, want 50",
		      (double)dt / 1e6);

	for (i = 0; i < 4; i++) {
		buf[0] = (unsigned char)i;
		ck_assert_int_eq(dps_ring_push(&w, buf, 1, 0), 0);
	}
	t0 = dps_now_ns();
	ck_assert_int_eq(dps_ring_push(&w, buf, 1, 50 * MS), -ETIMEDOUT);
	dt = dps_now_ns() - t0;
	ck_assert_msg(dt >= 50 * MS && dt < 2000 * MS, "push timed out after %.1f ms, want 50",
		      (double)dt / 1e6);
	/* The failed push changed nothing. */
	ck_assert_uint_eq(dps_ring_pending(&r, 0), 4);
	ck_assert_int_eq(dps_ring_pop(&r, 0, buf, sizeof(buf), &len, 0), 0);
	ck_assert_int_eq(buf[0], 0);
	buf[0] = 4;
	ck_assert_int_eq(dps_ring_push(&w, buf, 1, 50 * MS), 0);
	for (i = 1; i <= 4; i++) {
		ck_assert_int_eq(dps_ring_pop(&r, 0, buf, sizeof(buf), &len, 0), 0);
		ck_assert_int_eq(buf[0], i);
	}
	area_close(&f);
}
END_TEST

/* The writer reuses a slot only after every reader released it. */
START_TEST(test_slowest_reader_holds_slot)
{
	unsigned char buf[8];
	struct fixture f;
	struct dps_ring w, r;
	size_t len;
	int i;

	area_open(&f, 2, 2, 8);
	ring_open(&f, &w, -1);
	ring_open(&f, &r, -1);
	for (i = 0; i < 2; i++) {
		buf[0] = (unsigned char)i;
		ck_assert_int_eq(dps_ring_push(&w, buf, 1, 0), 0);
	}
	for (i = 0; i < 2; i++)
		ck_assert_int_eq(dps_ring_trypop(&r, 0, buf, sizeof(buf), &len), 0);
	ck_assert_int_eq(dps_ring_push(&w, buf, 1, 10 * MS), -ETIMEDOUT);
	ck_assert_int_eq(dps_ring_trypop(&r, 1, buf, sizeof(buf), &len), 0);
	ck_assert_int_eq(buf[0], 0);
	buf[0] = 2;
	ck_assert_int_eq(dps_ring_push(&w, buf, 1, 10 * MS), 0);
	ck_assert_int_eq(dps_ring_push(&w, buf, 1, 10 * MS), -ETIMEDOUT);
	for (i = 1; i <= 2; i++) {
		ck_assert_int_eq(dps_ring_trypop(&r, 1, buf, sizeof(buf), &len), 0);
		ck_assert_int_eq(buf[0], i);
	}
	ck_assert_int_eq(dps_ring_trypop(&r, 0, buf, sizeof(buf), &len), 0);
	ck_assert_int_eq(buf[0], 2);
	area_close(&f);
}
END_TEST

/* A wait that times out sleeps: it uses a small fraction of a CPU for its 300 ms. */
START_TEST(test_waits_sleep)
{
	unsigned char buf[16];
	struct fixture f;
	struct dps_ring w, r;
	struct timespec c0, c1;
	double cpu_ms;
	size_t len;

	area_open(&f, 1, 1, 16);
	ring_open(&f, &w, -1);
	ring_open(&f, &r, -1);
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
	ck_assert_int_eq(dps_ring_pop(&r, 0, buf, sizeof(buf), &len, 300 * MS), -ETIMEDOUT);
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
	cpu_ms = (double)(c1.tv_sec - c0.tv_sec) * 1e3 + (double)(c1.tv_nsec - c0.tv_nsec) / 1e6;
	ck_assert_msg(cpu_ms < 60, "a 300 ms pop used %.1f ms of CPU", cpu_ms);

	ck_assert_int_eq(dps_ring_push(&w, buf, 1, 0), 0); /* the one slot is taken */
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
	ck_assert_int_eq(dps_ring_push(&w, buf, 1, 300 * MS), -ETIMEDOUT);
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
	cpu_ms = (double)(c1.tv_sec - c0.tv_sec) * 1e3 + (double)(c1.tv_nsec - c0.tv_nsec) / 1e6;
	ck_assert_msg(cpu_ms < 60, "a 300 ms push used %.1f ms of CPU", cpu_ms);
	area_close(&f);
}
END_TEST

/* Deliberate fault: a byte changed in the shared slot after the push must fail the checker. */
START_TEST(test_checker_catches_corruption)
{
	unsigned char m[MAX_SLOT], buf[MAX_SLOT];
	char why[128] = "";
	struct fixture f;
	struct dps_ring w, r;
	uint64_t seq = 1, bad_len;
	unsigned char *slot;
	size_t len, mlen;

	area_open(&f, 4, 1, 200);
	ring_open(&f, &w, -1);
	ring_open(&f, &r, -1);

	/* Control: an untouched message passes. */
	ck_assert_int_eq(dps_ring_push(&w, m, msg_build(m, 0, 200), 0), 0);
	ck_assert_int_eq(dps_ring_pop(&r, 0, buf, sizeof(buf), &len, 0), 0);
	ck_assert_msg(msg_verify(buf, len, 0, 200, why, sizeof(why)) == 0, "%s", why);

	/* A message with a payload to corrupt. */
	while (msg_len(seq, 200) < MSG_HDR + 8)
		seq++;
	mlen = msg_build(m, seq, 200);
	ck_assert_int_eq(dps_ring_push(&w, m, mlen, 0), 0);
	slot = r.slots + (size_t)(1 % f.n_slots) * r.stride;
	ck_assert_mem_eq(slot + 8, m, mlen); /* found the right bytes */
	slot[8 + MSG_HDR + (mlen - MSG_HDR) / 2] ^= 0x10;
	ck_assert_int_eq(dps_ring_pop(&r, 0, buf, sizeof(buf), &len, 0), 0);
	ck_assert_uint_eq(len, mlen);
	ck_assert_msg(msg_verify(buf, len, seq, 200, why, sizeof(why)) == -1,
		      "the checker passed a corrupted payload");
	ck_assert_msg(strstr(why, "checksum"), "wrong reason: %s", why);

	/* The other faults it exists for: a lost message and a truncated one. */
	msg_build(m, seq, 200);
	ck_assert_int_eq(msg_verify(m, mlen, seq, 200, why, sizeof(why)), 0);
	ck_assert_int_eq(msg_verify(m, mlen, seq - 1, 200, why, sizeof(why)), -1);
	ck_assert_msg(strstr(why, "lost"), "wrong reason: %s", why);
	ck_assert_int_eq(msg_verify(m, mlen, seq + 1, 200, why, sizeof(why)), -1);
	ck_assert_msg(strstr(why, "duplicated"), "wrong reason: %s", why);
	ck_assert_int_eq(msg_verify(m, mlen - 1, seq, 200, why, sizeof(why)), -1);

	/* And the ring's own check: a length word beyond slot_bytes is a protocol error. */
	ck_assert_int_eq(dps_ring_push(&w, m, mlen, 0), 0);
	slot = r.slots + (size_t)(2 % f.n_slots) * r.stride;
	bad_len = 201;
	memcpy(slot, &bad_len, 8);
	ck_assert_int_eq(dps_ring_pop(&r, 0, buf, sizeof(buf), &len, 0), -DPS_EPROTO);
	ck_assert_uint_eq(dps_ring_pending(&r, 0), 0);
	area_close(&f);
}
END_TEST

/* ---------------------------------------------------------------------------------------
 * Cross-process
 */

/* CPUs this process may run on. */
static unsigned cpus_allowed(void)
{
	cpu_set_t set;

	if (sched_getaffinity(0, sizeof(set), &set))
		return 1;
	return (unsigned)CPU_COUNT(&set);
}

/*
 * Runs one writer and n_readers readers over a fresh ring; every reader must verify every
 * message. The children wait with policy pol (NULL: the default).
 */
static void run_stream(unsigned n_slots, unsigned n_readers, size_t slot_bytes,
			  uint64_t n_msgs, unsigned timeout_ms, const struct dps_wait_policy *pol)
{
	struct dps_wait_policy saved;
	pid_t pids[MAX_PROCS];
	struct fixture f;
	unsigned i;
	int bad;

	area_open(&f, n_slots, n_readers, slot_bytes);
	f.n_msgs = n_msgs;
	/* Set before fork: the children inherit it. */
	dps_wait_get_policy(&saved);
	if (pol)
		dps_wait_set_policy(pol);
	for (i = 0; i < n_readers; i++)
		pids[i] = spawn(&f, (int)i, reader_child);
	pids[n_readers] = spawn(&f, (int)n_readers, writer_child);
	bad = reap(&f, pids, (int)n_readers + 1, timeout_ms);
	dps_wait_set_policy(&saved);
	ck_assert_msg(bad == 0, "%d of %u processes failed: %s", bad, n_readers + 1,
		      first_why(&f, (int)n_readers + 1));
	for (i = 0; i <= n_readers; i++)
		ck_assert_uint_eq(f.a->res[i].count, n_msgs);
	area_close(&f);
}

static const unsigned stream_readers[] = { 1, 3 };

/*
 * 100000 messages through 4 slots. The waits spin as the engine's policy says but skip the
 * sched_yield() phase: this test is about delivery, and with yields its run time depends on
 * unrelated load (3 readers, 2 CPUs: 0.4 s idle, over 50 s beside two busy loops; without
 * yields 2.3 s and 6.5 s). The yield phase runs in test_oversubscribed.
 */
START_TEST(test_stream)
{
	const unsigned n_readers = stream_readers[_i];
	struct dps_wait_policy p;

	dps_wait_policy_for(n_readers + 1, cpus_allowed(), &p);
	p.yields = 0;
	run_stream(4, n_readers, 200, 100000, 50000, &p);
}
END_TEST

/* More processes than cores: 16 readers and a writer on (at most) 2 CPUs. */
START_TEST(test_oversubscribed)
{
	struct dps_wait_policy p;
	cpu_set_t all, two;
	unsigned ncpu = 0;
	int cpu;

	ck_assert_int_eq(sched_getaffinity(0, sizeof(all), &all), 0);
	CPU_ZERO(&two);
	for (cpu = 0; cpu < CPU_SETSIZE && ncpu < 2; cpu++)
		if (CPU_ISSET(cpu, &all)) {
			CPU_SET(cpu, &two);
			ncpu++;
		}
	ck_assert_int_eq(sched_setaffinity(0, sizeof(two), &two), 0);
	/* _i == 0: the policy the engine picks for 17 processes; 1: the default, spin long. */
	dps_wait_policy_for(17, ncpu, &p);
	run_stream(4, 16, 128, 10000, 100000, _i == 0 ? &p : NULL);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(all), &all), 0);
}
END_TEST

/* The writer blocks on a full ring while a reader stalls, and everything arrives after. */
START_TEST(test_writer_blocks_when_full)
{
	unsigned char m[MAX_SLOT];
	struct fixture f;
	struct dps_ring w;
	uint64_t seq, t0, dt;
	pid_t pid;
	int rc;

	area_open(&f, 4, 1, 64);
	f.n_msgs = 1000;
	f.pause_after = 10;
	pid = spawn(&f, 0, reader_child);
	ring_open(&f, &w, -1);
	for (seq = 0; seq < 10; seq++)
		ck_assert_int_eq(dps_ring_push(&w, m, msg_build(m, seq, 64), 0), 0);
	ck_assert_msg(wait_phase(&f.a->phase, 1, 10000) == 0, "the reader never stalled");
	/* The reader released all 10: four pushes find free slots, the fifth waits. */
	for (; seq < 14; seq++)
		ck_assert_int_eq(dps_ring_push(&w, m, msg_build(m, seq, 64), 1000 * MS), 0);
	t0 = dps_now_ns();
	rc = dps_ring_push(&w, m, msg_build(m, seq, 64), 50 * MS);
	dt = dps_now_ns() - t0;
	ck_assert_msg(rc == -ETIMEDOUT, "push into a full ring gave %d (%s)", rc, dps_strerror(rc));
	ck_assert_msg(dt >= 50 * MS, "push gave up after %.1f ms, want 50", (double)dt / 1e6);
	ck_assert_uint_eq(dps_ring_pending(&w, 0), 4);
	/* Let the reader go on after 200 ms; the same push now blocks until then. */
	atomic_store(&f.a->phase, 2);
	t0 = dps_now_ns();
	ck_assert_int_eq(dps_ring_push(&w, m, msg_build(m, seq, 64), 0), 0);
	dt = dps_now_ns() - t0;
	ck_assert_msg(dt >= 200 * MS, "push into a full ring returned after %.1f ms, before the "
		      "reader resumed", (double)dt / 1e6);
	for (seq++; seq < f.n_msgs; seq++)
		ck_assert_int_eq(dps_ring_push(&w, m, msg_build(m, seq, 64), 0), 0);
	ck_assert_msg(reap(&f, &pid, 1, 10000) == 0, "reader: %s", first_why(&f, 1));
	ck_assert_uint_eq(f.a->res[0].count, f.n_msgs);
	area_close(&f);
}
END_TEST

/*
 * A child blocked in a wait (reader on an empty ring, or writer on a full one) must return
 * -DPS_EABORT within 1 s of the abort word going up. The test first sees it asleep, so the
 * abort is noticed by the sleeping path, not by a spin.
 */
static void abort_case(child_fn fn)
{
	struct fixture f;
	uint64_t t0, t_raise;
	char st = '?';
	pid_t pid;

	area_open(&f, 4, 1, 64);
	pid = spawn(&f, 0, fn);
	ck_assert_msg(wait_phase(&f.a->phase, 1, 10000) == 0, "child never got to its wait: %s",
		      first_why(&f, 1));
	t0 = dps_now_ns();
	while (dps_now_ns() - t0 < 5000 * MS && (st = proc_state(pid)) != 'S')
		usleep(1000);
	ck_assert_msg(st == 'S', "blocked child is in state %c, not asleep", st);
	sleep_ms(100);
	t_raise = dps_now_ns();
	dps_abort_raise(&f.a->abort_word);
	ck_assert_msg(reap(&f, &pid, 1, 5000) == 0, "child: %s", first_why(&f, 1));
	ck_assert_msg(f.a->res[0].call_rc == -DPS_EABORT, "blocked call returned %d (%s)",
		      f.a->res[0].call_rc, dps_strerror(f.a->res[0].call_rc));
	ck_assert_msg(f.a->res[0].t_ret - t_raise < 1000 * MS, "abort took %.1f ms to be seen",
		      (double)(f.a->res[0].t_ret - t_raise) / 1e6);
	area_close(&f);
}

START_TEST(test_abort_blocked_reader)
{
	abort_case(blocked_reader_child);
}
END_TEST

START_TEST(test_abort_blocked_writer)
{
	abort_case(blocked_writer_child);
}
END_TEST

START_TEST(test_notify_eventfd)
{
	unsigned char m[MAX_SLOT], buf[MAX_SLOT];
	char why[96] = "";
	struct pollfd pfd;
	struct fixture f;
	struct dps_ring w, r;
	uint64_t v;
	size_t len;
	pid_t pid;
	int efd, i;

	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ck_assert_int_ge(efd, 0);
	area_open(&f, 4, 1, 64);
	ring_open(&f, &w, efd);
	ring_open(&f, &r, -1);

	/* Nothing pushed, nothing signalled; a refused push signals nothing either. */
	ck_assert_int_eq(read(efd, &v, sizeof(v)), -1);
	ck_assert_int_eq(errno, EAGAIN);
	ck_assert_int_eq(dps_ring_push(&w, m, 65, 0), -EMSGSIZE);
	ck_assert_int_eq(read(efd, &v, sizeof(v)), -1);
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(dps_ring_push(&w, m, msg_build(m, (uint64_t)i, 64), 0), 0);
	ck_assert_int_eq(read(efd, &v, sizeof(v)), sizeof(v));
	ck_assert_uint_eq(v, 3);
	ck_assert_int_eq(read(efd, &v, sizeof(v)), -1);
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(dps_ring_trypop(&r, 0, buf, sizeof(buf), &len), 0);

	/* Across processes: poll() on the eventfd wakes when another process pushes. */
	f.notify_fd = efd;
	pid = spawn(&f, 0, late_writer_child);
	pfd.fd = efd;
	pfd.events = POLLIN;
	ck_assert_int_eq(poll(&pfd, 1, 5000), 1);
	ck_assert(pfd.revents & POLLIN);
	ck_assert_int_eq(read(efd, &v, sizeof(v)), sizeof(v));
	ck_assert_uint_eq(v, 1);
	ck_assert_int_eq(dps_ring_trypop(&r, 0, buf, sizeof(buf), &len), 0);
	ck_assert_msg(msg_verify(buf, len, 0, 64, why, sizeof(why)) == 0, "%s", why);
	ck_assert_msg(reap(&f, &pid, 1, 5000) == 0, "writer: %s", first_why(&f, 1));
	close(efd);
	area_close(&f);
}
END_TEST

static Suite *ring_suite(void)
{
	Suite *s = suite_create("ring");
	TCase *tc = tcase_create("local");

	tcase_add_test(tc, test_size_init_attach);
	tcase_add_test(tc, test_order_and_lengths);
	tcase_add_test(tc, test_emsgsize);
	tcase_add_test(tc, test_trypop_and_bad_reader);
	tcase_add_test(tc, test_timeouts);
	tcase_add_test(tc, test_slowest_reader_holds_slot);
	tcase_add_test(tc, test_waits_sleep);
	tcase_add_test(tc, test_checker_catches_corruption);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);

	tc = tcase_create("processes");
	tcase_add_loop_test(tc, test_stream, 0,
			    (int)(sizeof(stream_readers) / sizeof(stream_readers[0])));
	tcase_add_test(tc, test_writer_blocks_when_full);
	tcase_add_test(tc, test_abort_blocked_reader);
	tcase_add_test(tc, test_abort_blocked_writer);
	tcase_add_test(tc, test_notify_eventfd);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);

	tc = tcase_create("oversubscribed");
	tcase_add_loop_test(tc, test_oversubscribed, 0, 2);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(ring_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

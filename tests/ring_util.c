/* SPDX-License-Identifier: MIT */
/*
 * tests/ring_util.c - the helpers of the ring suite (see ring_util.h).
 */
#include <check.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
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
 * Helpers: the shared mapping, children, timing
 */

void area_open(struct fixture *f, unsigned n_slots, unsigned n_readers, size_t slot_bytes)
{
	const size_t off = dps_align_up(sizeof(struct area), DPS_CACHELINE);
	const size_t rsz = dps_ring_shm_size(n_slots, n_readers, slot_bytes);
	void *p;

	ck_assert_uint_gt(rsz, 0);
	ck_assert_uint_le(slot_bytes, MAX_SLOT);
	memset(f, 0, sizeof(*f));
	f->map_size = off + rsz;
	p = mmap(NULL, f->map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(p, MAP_FAILED);
	f->a = p;
	f->ring_mem = (char *)p + off;
	f->n_slots = n_slots;
	f->n_readers = n_readers;
	f->slot_bytes = slot_bytes;
	f->notify_fd = -1;
	f->first_bad = -1;
	ck_assert_int_eq(dps_ring_init(f->ring_mem, n_slots, n_readers, slot_bytes), 0);
}

void area_close(struct fixture *f)
{
	munmap(f->a, f->map_size);
	f->a = NULL;
}

void ring_open(struct fixture *f, struct dps_ring *r, int notify_fd)
{
	dps_ring_attach(r, f->ring_mem, &f->a->abort_word, notify_fd);
}

void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts))
		;
}

/* Waits until *w >= want, at most timeout_ms. Returns 0 or -1 on timeout. */
int wait_phase(_Atomic uint32_t *w, uint32_t want, unsigned timeout_ms)
{
	const uint64_t deadline = dps_now_ns() + timeout_ms * MS;

	while (atomic_load(w) < want) {
		if (dps_now_ns() > deadline)
			return -1;
		usleep(500);
	}
	return 0;
}

/* Scheduler state of pid from /proc ('R' running, 'S' asleep, ...), '?' if unreadable. */
char proc_state(pid_t pid)
{
	char path[64], buf[512], *p;
	size_t n;
	FILE *fp;

	snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
	fp = fopen(path, "r");
	if (!fp)
		return '?';
	n = fread(buf, 1, sizeof(buf) - 1, fp);
	fclose(fp);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	return p && p[1] == ' ' ? p[2] : '?';
}

/* A child's body: returns 0 when it saw what it expected, else fills res->why. */

/* Forks a child running fn(f, idx); it dies with the test process whatever way that ends. */
pid_t spawn(struct fixture *f, int idx, child_fn fn)
{
	const pid_t parent = getpid();
	pid_t pid;

	ck_assert_int_lt(idx, MAX_PROCS);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent)
			_exit(3);
		_exit(fn(f, idx, &f->a->res[idx]) ? 1 : 0);
	}
	return pid;
}

/*
 * Waits for the n children in pids, at most timeout_ms. The first failure, or the deadline,
 * raises the abort word so that the others stop too; what still runs 2 s later is killed.
 * Returns the number of children that did not exit 0.
 */
int reap(struct fixture *f, const pid_t *pids, int n, unsigned timeout_ms)
{
	uint64_t deadline = dps_now_ns() + timeout_ms * MS;
	int gone[MAX_PROCS] = { 0 };
	int left = n, bad = 0, killing = 0, status, i;

	while (left) {
		for (i = 0; i < n; i++) {
			if (gone[i] || waitpid(pids[i], &status, WNOHANG) != pids[i])
				continue;
			gone[i] = 1;
			left--;
			if (!WIFEXITED(status) || WEXITSTATUS(status)) {
				bad++;
				if (f->first_bad < 0)
					f->first_bad = i;
				dps_abort_raise(&f->a->abort_word);
				if (!f->a->res[i].why[0])
					snprintf(f->a->res[i].why, sizeof(f->a->res[i].why),
						 "child %d ended with status 0x%x", i, status);
			}
		}
		if (left && dps_now_ns() > deadline) {
			if (killing) {
				for (i = 0; i < n; i++)
					if (!gone[i])
						kill(pids[i], SIGKILL);
			} else {
				/* Before the abort: what the children say after it is only "aborted". */
				for (i = 0; i < n && !f->reap_why[0]; i++)
					if (!gone[i])
						snprintf(f->reap_why, sizeof(f->reap_why),
							 "child %d still running after %u ms (it had "
							 "handled %llu messages)", i, timeout_ms,
							 (unsigned long long)f->a->res[i].count);
				dps_abort_raise(&f->a->abort_word);
				deadline = dps_now_ns() + 2000 * MS;
				killing = 1;
			}
		}
		if (left)
			usleep(1000);
	}
	return bad;
}

/* Why the first child that failed failed (the others may only have seen the abort). */
const char *first_why(const struct fixture *f, int n)
{
	if (f->reap_why[0])
		return f->reap_why;
	if (f->first_bad >= 0 && f->a->res[f->first_bad].why[0])
		return f->a->res[f->first_bad].why;
	for (int i = 0; i < n; i++)
		if (f->a->res[i].why[0])
			return f->a->res[i].why;
	return "(no reason recorded)";
}

/* ---------------------------------------------------------------------------------------
 * Test messages and their checker (the oracle)
 *
 * Message seq is MSG_HDR bytes (seq, total length, FNV-1a checksum over seq, length and
 * payload) then a payload of 0..slot_bytes-MSG_HDR bytes, length and bytes derived from seq.
 */

uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* FNV-1a: each step is a bijection of the state, so any single changed byte changes it. */
uint32_t fnv1a(const unsigned char *p, size_t n, uint32_t h)
{
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 16777619u;
	}
	return h;
}

size_t msg_len(uint64_t seq, size_t slot_bytes)
{
	return MSG_HDR + (size_t)(mix64(seq) % (slot_bytes - MSG_HDR + 1));
}

uint32_t msg_sum(const unsigned char *m, size_t len)
{
	return fnv1a(m + MSG_HDR, len - MSG_HDR, fnv1a(m, 12, 2166136261u));
}

/* Writes message seq into m (slot_bytes bytes). Returns its length. */
size_t msg_build(unsigned char *m, uint64_t seq, size_t slot_bytes)
{
	const size_t len = msg_len(seq, slot_bytes);
	const uint32_t len32 = (uint32_t)len;
	uint64_t x = seq;
	uint32_t sum;

	for (size_t i = MSG_HDR; i < len; i++) {
		if ((i - MSG_HDR) % 8 == 0)
			x = mix64(x ^ 0x5bd1e995u);
		m[i] = (unsigned char)(x >> (8 * ((i - MSG_HDR) % 8)));
	}
	memcpy(m, &seq, 8);
	memcpy(m + 8, &len32, 4);
	sum = msg_sum(m, len);
	memcpy(m + 12, &sum, 4);
	return len;
}

/* The checker: 0 when m (len bytes) is message want intact, else -1 with the reason in why. */
int msg_verify(const unsigned char *m, size_t len, uint64_t want, size_t slot_bytes,
		      char *why, size_t n)
{
	uint32_t len32, sum, have;
	uint64_t seq;

	if (len < MSG_HDR) {
		snprintf(why, n, "message %llu: %zu bytes, shorter than its header",
			 (unsigned long long)want, len);
		return -1;
	}
	memcpy(&seq, m, 8);
	memcpy(&len32, m + 8, 4);
	memcpy(&sum, m + 12, 4);
	if (seq != want) {
		snprintf(why, n, "got message %llu where %llu was due (%s)", (unsigned long long)seq,
			 (unsigned long long)want, seq < want ? "duplicated" : "lost");
		return -1;
	}
	if (len32 != len || len != msg_len(want, slot_bytes)) {
		snprintf(why, n, "message %llu: %zu bytes, header says %u, should be %zu",
			 (unsigned long long)want, len, len32, msg_len(want, slot_bytes));
		return -1;
	}
	have = msg_sum(m, len);
	if (have != sum) {
		snprintf(why, n, "message %llu: checksum 0x%08x, payload sums to 0x%08x",
			 (unsigned long long)want, sum, have);
		return -1;
	}
	return 0;
}

/* ---------------------------------------------------------------------------------------
 * Children
 */

/* Pushes messages 0..n_msgs-1, blocking as long as it takes. */
int writer_child(struct fixture *f, int idx, struct proc_result *res)
{
	unsigned char m[MAX_SLOT];
	struct dps_ring r;
	uint64_t seq;
	int rc;

	ring_open(f, &r, f->notify_fd);
	for (seq = 0; seq < f->n_msgs; seq++) {
		const size_t len = msg_build(m, seq, f->slot_bytes);

		rc = dps_ring_push(&r, m, len, 0);
		if (rc) {
			res->call_rc = rc;
			snprintf(res->why, sizeof(res->why), "writer: push of message %llu: %s",
				 (unsigned long long)seq, dps_strerror(rc));
			return -1;
		}
	}
	res->count = seq;
	return 0;
}

/*
 * Reader idx: pops and verifies messages 0..n_msgs-1 in order, then checks that nothing
 * follows. With pause_after set it stops after that many, sets phase 1, waits for the test to
 * set phase 2, sleeps 200 ms more and then reads the rest.
 */
int reader_child(struct fixture *f, int idx, struct proc_result *res)
{
	unsigned char m[MAX_SLOT];
	char why[96];
	struct dps_ring r;
	uint64_t seq;
	size_t len;
	int rc;

	ring_open(f, &r, -1);
	for (seq = 0; seq < f->n_msgs; seq++) {
		if (f->pause_after && seq == f->pause_after) {
			atomic_store(&f->a->phase, 1);
			if (wait_phase(&f->a->phase, 2, 10000)) {
				snprintf(res->why, sizeof(res->why), "reader: the writer never timed out");
				return -1;
			}
			sleep_ms(200);
		}
		rc = dps_ring_pop(&r, (unsigned)idx, m, sizeof(m), &len, 0);
		if (rc) {
			res->call_rc = rc;
			snprintf(res->why, sizeof(res->why), "reader %d: pop of message %llu: %s",
				 idx, (unsigned long long)seq, dps_strerror(rc));
			return -1;
		}
		if (msg_verify(m, len, seq, f->slot_bytes, why, sizeof(why))) {
			snprintf(res->why, sizeof(res->why), "reader %d: %s", idx, why);
			return -1;
		}
		res->count = seq + 1;
	}
	rc = dps_ring_trypop(&r, (unsigned)idx, m, sizeof(m), &len);
	if (rc != -EAGAIN) {
		snprintf(res->why, sizeof(res->why), "reader %d: after the last message trypop "
			 "gave %d, not -EAGAIN", idx, rc);
		return -1;
	}
	return 0;
}

/* Announces phase 1, then pops from an empty ring until the abort word stops it. */
int blocked_reader_child(struct fixture *f, int idx, struct proc_result *res)
{
	unsigned char m[MAX_SLOT];
	struct dps_ring r;
	size_t len;

	ring_open(f, &r, -1);
	atomic_store(&f->a->phase, 1);
	res->call_rc = dps_ring_pop(&r, 0, m, sizeof(m), &len, 0);
	res->t_ret = dps_now_ns();
	return 0;
}

/* Fills the ring (nobody reads), announces phase 1, then blocks on one more push. */
int blocked_writer_child(struct fixture *f, int idx, struct proc_result *res)
{
	unsigned char m[MAX_SLOT];
	struct dps_ring r;
	unsigned i;
	int rc;

	ring_open(f, &r, -1);
	for (i = 0; i < f->n_slots; i++) {
		rc = dps_ring_push(&r, m, msg_build(m, i, f->slot_bytes), MS * 1000);
		if (rc) {
			snprintf(res->why, sizeof(res->why), "writer: push %u into a ring with free "
				 "slots: %s", i, dps_strerror(rc));
			return -1;
		}
	}
	atomic_store(&f->a->phase, 1);
	res->call_rc = dps_ring_push(&r, m, msg_build(m, i, f->slot_bytes), 0);
	res->t_ret = dps_now_ns();
	return 0;
}

/* Sleeps 50 ms, so that the test is already in poll(), then pushes one message. */
int late_writer_child(struct fixture *f, int idx, struct proc_result *res)
{
	unsigned char m[MAX_SLOT];
	struct dps_ring r;
	int rc;

	ring_open(f, &r, f->notify_fd);
	sleep_ms(50);
	rc = dps_ring_push(&r, m, msg_build(m, 0, f->slot_bytes), 0);
	if (rc) {
		snprintf(res->why, sizeof(res->why), "writer: push: %s", dps_strerror(rc));
		return -1;
	}
	return 0;
}

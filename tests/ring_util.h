/* SPDX-License-Identifier: MIT */
/*
 * tests/ring_util.h - what the ring suite's tests share (tests/ring_util.c): the shared mapping
 * with the abort word and the children's reports, forking and reaping children, the test
 * messages (sequence number, length and checksum: the oracle) and the children's roles.
 */
#ifndef DPS_TESTS_RING_UTIL_H
#define DPS_TESTS_RING_UTIL_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/dps.h"
#include "shm/ring.h"
#include "shm/wait.h"

#define MS 1000000ull          /* nanoseconds */
#define MAX_PROCS 20           /* children of one test */
#define MAX_SLOT 1024          /* largest slot_bytes a test uses */
#define MSG_HDR 16             /* test message: seq (u64), length (u32), checksum (u32) */

/* What one child reports back through shared memory. */
struct proc_result {
	int32_t call_rc;  /* the return code of the call the test is about */
	int32_t pad;
	uint64_t count;   /* messages it pushed or verified */
	uint64_t t_ret;   /* dps_now_ns() when its blocking call returned */
	char why[128];    /* what went wrong, for the test's failure message */
};

/* The shared mapping: control words, each on its own line; the ring follows, 64-aligned. */
struct area {
	_Alignas(DPS_CACHELINE) _Atomic uint32_t abort_word;
	_Alignas(DPS_CACHELINE) _Atomic uint32_t phase; /* handshakes between test and child */
	_Alignas(DPS_CACHELINE) struct proc_result res[MAX_PROCS];
};

/* Process-local view of the mapping plus the parameters children inherit through fork. */
struct fixture {
	struct area *a;
	void *ring_mem;
	size_t map_size;
	unsigned n_slots, n_readers;
	size_t slot_bytes;
	uint64_t n_msgs;     /* stream tests: messages to push */
	uint64_t pause_after; /* stalling reader: messages before it stops */
	int notify_fd;
	int first_bad;       /* reap: index of the first child that failed, or -1 */
	char reap_why[128];  /* reap: why it gave up on the children, if it did */
};

typedef int (*child_fn)(struct fixture *f, int idx, struct proc_result *res);

void area_open(struct fixture *f, unsigned n_slots, unsigned n_readers, size_t slot_bytes);
void area_close(struct fixture *f);
void ring_open(struct fixture *f, struct dps_ring *r, int notify_fd);
void sleep_ms(unsigned ms);
int wait_phase(_Atomic uint32_t *w, uint32_t want, unsigned timeout_ms);
char proc_state(pid_t pid);
pid_t spawn(struct fixture *f, int idx, child_fn fn);
int reap(struct fixture *f, const pid_t *pids, int n, unsigned timeout_ms);
const char *first_why(const struct fixture *f, int n);
uint64_t mix64(uint64_t x);
uint32_t fnv1a(const unsigned char *p, size_t n, uint32_t h);
size_t msg_len(uint64_t seq, size_t slot_bytes);
uint32_t msg_sum(const unsigned char *m, size_t len);
size_t msg_build(unsigned char *m, uint64_t seq, size_t slot_bytes);
int msg_verify(const unsigned char *m, size_t len, uint64_t want, size_t slot_bytes,
		      char *why, size_t n);
int writer_child(struct fixture *f, int idx, struct proc_result *res);
int reader_child(struct fixture *f, int idx, struct proc_result *res);
int blocked_reader_child(struct fixture *f, int idx, struct proc_result *res);
int blocked_writer_child(struct fixture *f, int idx, struct proc_result *res);
int late_writer_child(struct fixture *f, int idx, struct proc_result *res);

#endif

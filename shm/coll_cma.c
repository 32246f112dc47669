/* SPDX-License-Identifier: MIT */
/*
 * shm/coll_cma.c - the single-copy all-gather: a large all-gather whose inputs are in the
 * members' private memory (not in windows) read straight from each peer's input with
 * process_vm_readv (Linux's cross-memory attach), one copy instead of the slots' two.
 *
 * A ready step publishes each member's process id, input address and size in its slot's flag
 * line; every member then reads every peer's part into its output and copies its own; a
 * closing step (after which a member may change its input) carries whether every read
 * succeeded. The kernel lets a process read another only where it could trace it: the ranks of
 * one instance run as one user and, without Yama's ptrace restrictions, may; under them (or in
 * a container that forbids it) a read fails with EPERM. Then every member sees the failure in
 * the closing step, the group stops trying (c->cma = -1, on every member alike) and this call
 * and the later ones take the slots. dpshard never widens who may trace the ranks
 * (PR_SET_PTRACER) to make it work.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/dps.h"
#include "shm/coll.h"
#include "shm/coll_int.h"

#define CMA_MAGIC 0x434d416864720100ull

struct cma_hdr {
	uint64_t magic, step, pid, addr, bytes;
	uint64_t ok; /* closing step: every read of this member succeeded */
};

_Static_assert(sizeof(struct cma_hdr) <= TINY, "the header fits a slot's flag line");

/* One step carrying h; afterwards every member's header of that step is in c's slots (k). */
static int cma_step(struct dps_comm *c, struct cma_hdr *h, unsigned *k)
{
	const uint64_t s = c->seq + 1;
	int rc = slot_acquire(c, k);

	if (rc)
		return rc;
	h->magic = CMA_MAGIC;
	h->step = s;
	*(struct cma_hdr *)(void *)slot_data(c, c->me, *k, 1) = *h;
	rc = step_sync(c, *k, s);
	c->slot_last[*k] = s;
	return rc;
}

static const struct cma_hdr *hdr_of(const struct dps_comm *c, int i, unsigned k)
{
	return (const struct cma_hdr *)(const void *)slot_data(c, i, k, 1);
}

/* Reads len bytes at addr of process pid into dst: 0, or -errno. */
static int read_peer(pid_t pid, void *dst, uint64_t addr, size_t len)
{
	while (len) {
		struct iovec here = { dst, len }, there = { (void *)(uintptr_t)addr, len };
		const ssize_t got = process_vm_readv(pid, &here, 1, &there, 1, 0);

		if (got <= 0)
			return got < 0 ? -errno : -EIO;
		dst = (char *)dst + got;
		addr += (uint64_t)got;
		len -= (size_t)got;
	}
	return 0;
}

int dps_coll_allgatherv_cma(struct dps_comm *c, const void *send, void *recv,
			    const size_t *counts, const size_t *displs, size_t esz)
{
	struct cma_hdr h = { 0, 0, (uint64_t)getpid(), (uint64_t)(uintptr_t)send,
			     counts[c->me] * esz, 0 };
	size_t off = 0;
	unsigned k;
	int rc, ok = 1, all_ok = 1, bad = 0;

	rc = cma_step(c, &h, &k);
	if (rc)
		return rc;
	for (int i = 0; i < c->n; i++) {
		const struct cma_hdr *p = hdr_of(c, i, k);

		/* a member that took another path (its window), or another size: every member
		 * sees the same headers and fails alike */
		if (p->magic != CMA_MAGIC || p->step != h.step || p->bytes != counts[i] * esz)
			bad = 1;
	}
	if (bad) {
		dps_error("all-gather: the members disagree on the sizes, or on where their inputs "
			  "are (in a window or not)");
		return -EINVAL;
	}
	for (int i = 0; i < c->n; off += counts[i++] * esz) {
		const struct cma_hdr *p = hdr_of(c, i, k);
		char *dst = (char *)recv + (displs ? displs[i] * esz : off);

		if (i == c->me)
			memmove(dst, send, p->bytes);
		else if (ok && p->bytes && (c->cma == 2 ||
					    read_peer((pid_t)p->pid, dst, p->addr, p->bytes)))
			ok = 0; /* (2: a test's member whose reads fail) */
	}
	h.ok = (uint64_t)ok;
	rc = cma_step(c, &h, &k);
	if (rc)
		return rc;
	for (int i = 0; i < c->n; i++)
		all_ok &= hdr_of(c, i, k)->ok == 1;
	if (!all_ok) {
		c->cma = -1; /* every member saw the same: the group stops trying */
		return 1;
	}
	c->stats.single_copy[DPS_COLL_ALLGATHER]++;
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * shm/coll_cma.c - the single-copy all-gather: a large all-gather whose inputs are in the
 * members' private memory (not in windows) read straight from each peer's input with
 * process_vm_readv (Linux's cross-memory attach), one copy instead of the slots' two.
 *
 * A ready step publishes each member's process id, input address and size, and a hash of
 * the call's counts, in its slot's flag line: a member on another path (its window, the
 * slots) or with other counts is seen by every member alike, and all fail. Every member then
 * reads each peer's header back from the peer's memory (the pid is that member's, not a
 * recycled one), then its part into its output, and copies its own; a closing step (after
 * which a member may change its input) carries each member's verdict. The kernel lets a
 * process read another only where it could trace it: the ranks of one instance run as one
 * user and, without Yama's ptrace restrictions, may; under them (or in a container that
 * forbids it) a read fails with EPERM: every member sees it, the group stops trying (c->cma
 * = -1, on every member alike) and this call and the later ones take the slots. Any other
 * failed read sends this call alone to the slots. dpshard never widens who may trace the
 * ranks (PR_SET_PTRACER) to make it work.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/dps.h"
#include "shm/coll.h"
#include "shm/coll_int.h"

/*
 * Ready step: who reads from where. sig: a hash of the call's counts and displacements (every
 * member compares every member's: a disagreement fails all alike); self: where this header's
 * own bytes are in the member's memory, which a reader reads back first to make sure the pid
 * names that member (a recycled pid, another namespace). Closing step: self carries the
 * member's verdict (CMA_OK, CMA_FAILED: this call takes the slots, CMA_REFUSED: the kernel
 * refuses, the group stops trying).
 */
struct cma_hdr {
	uint64_t magic, step, pid, addr, bytes, sig, self;
};

enum { CMA_OK = 1, CMA_FAILED = 2, CMA_REFUSED = 3 };

_Static_assert(sizeof(struct cma_hdr) <= TINY, "the header fits a slot's flag line");

/* One step carrying h; afterwards every member's header of that step is in c's slots (k). */
static int cma_step(struct dps_comm *c, struct cma_hdr *h, unsigned *k)
{
	const uint64_t s = c->seq + 1;
	int rc = slot_acquire(c, k);

	if (rc)
		return rc;
	h->magic = DPS_CMA_MAGIC;
	h->step = s;
	*(struct cma_hdr *)(void *)slot_data(c, c->me, *k, 1) = *h;
	rc = step_sync(c, *k, s);
	c->slot_last[*k] = s;
	return rc;
}

/* Member i's header of the step in slot k; ours is `mine` (a line just written is slow to
 * read back). */
static const struct cma_hdr *hdr_of(const struct dps_comm *c, int i, unsigned k,
				    const struct cma_hdr *mine)
{
	return i == c->me ? mine : (const struct cma_hdr *)(const void *)slot_data(c, i, k, 1);
}

/*
 * Reads member p's header back (into *back) and its part (into dst) with one call: 0, or
 * -errno. (A read that stops short goes on for what is left.)
 */
static int read_peer(const struct cma_hdr *p, struct cma_hdr *back, void *dst)
{
	struct iovec here[2] = { { back, sizeof(*back) }, { dst, p->bytes } };
	struct iovec there[2] = { { (void *)(uintptr_t)p->self, sizeof(*back) },
				  { (void *)(uintptr_t)p->addr, p->bytes } };
	size_t left = sizeof(*back) + p->bytes;

	while (left) {
		const int first = here[0].iov_len ? 0 : 1; /* (the header is in: the rest) */
		ssize_t got = process_vm_readv((pid_t)p->pid, here + first, (unsigned long)(2 - first),
					       there + first, (unsigned long)(2 - first), 0);

		if (got <= 0)
			return got < 0 ? -errno : -EIO;
		left -= (size_t)got;
		for (int i = first; i < 2 && got > 0; i++) { /* what came off the front */
			const size_t t = (size_t)got < here[i].iov_len ? (size_t)got : here[i].iov_len;

			here[i].iov_base = (char *)here[i].iov_base + t;
			there[i].iov_base = (char *)there[i].iov_base + t;
			here[i].iov_len -= t;
			there[i].iov_len -= t;
			got -= (ssize_t)t;
		}
	}
	return 0;
}

static uint64_t call_sig(int n, const size_t *counts, const size_t *displs, size_t esz)
{
	uint64_t h = 0xcbf29ce484222325ull ^ esz;

	for (int i = 0; i < n; i++) {
		h = (h ^ counts[i]) * 0x100000001b3ull;
		h = (h ^ (displs ? displs[i] + 1 : 0)) * 0x100000001b3ull;
	}
	return h;
}

/* Member p's part into dst, and its header read back to check that p->pid is that member:
 * CMA_OK or why not (dst is then rewritten by the slots). */
static int read_part(const struct cma_hdr *p, void *dst)
{
	struct cma_hdr back;
	const int rc = read_peer(p, &back, dst);

	if (!rc && memcmp(&back, p, sizeof(back)))
		return CMA_FAILED; /* another process under that pid */
	return !rc ? CMA_OK : rc == -EPERM || rc == -ENOSYS ? CMA_REFUSED : CMA_FAILED;
}

int dps_coll_allgatherv_cma(struct dps_comm *c, const void *send, void *recv,
			    const size_t *counts, const size_t *displs, size_t esz)
{
	/* (h stays as published until the closing step: the peers read it back) */
	struct cma_hdr h = { 0, 0, (uint64_t)getpid(), (uint64_t)(uintptr_t)send,
			     counts[c->me] * esz, call_sig(c->n, counts, displs, esz), 0 };
	struct cma_hdr close = h;
	size_t off = 0;
	unsigned k;
	int rc, verdict = CMA_OK, worst = CMA_OK, bad = 0;

	h.self = (uint64_t)(uintptr_t)&h;
	rc = cma_step(c, &h, &k);
	if (rc)
		return rc;
	for (int i = 0; i < c->n; i++) {
		const struct cma_hdr *p = hdr_of(c, i, k, &h);

		/* another path (a window, the slots), or other counts: every member sees the same
		 * headers and fails alike */
		if (p->magic != DPS_CMA_MAGIC || p->step != h.step || p->sig != hdr_of(c, 0, k, &h)->sig)
			bad = 1;
	}
	if (bad) {
		dps_error("all-gather: the members disagree on the counts, or on where their inputs "
			  "are (in a window, in private memory)");
		return -EINVAL;
	}
	for (int i = 0; i < c->n; off += counts[i++] * esz) {
		const struct cma_hdr *p = hdr_of(c, i, k, &h);
		char *dst = (char *)recv + (displs ? displs[i] * esz : off);

		if (i == c->me)
			memmove(dst, send, p->bytes);
		else if (verdict == CMA_OK)
			verdict = c->cma == 2 ? CMA_REFUSED : read_part(p, dst); /* (2: a test's) */
	}
	close.self = (uint64_t)verdict;
	rc = cma_step(c, &close, &k);
	if (rc)
		return rc;
	for (int i = 0; i < c->n; i++) {
		const uint64_t v = hdr_of(c, i, k, &close)->self;

		worst = v > (uint64_t)worst ? (int)v : worst;
	}
	if (worst == CMA_REFUSED)
		c->cma = -1; /* every member saw the same: the group stops trying */
	if (worst != CMA_OK)
		return 1;
	c->stats.single_copy[DPS_COLL_ALLGATHER]++;
	return 0;
}

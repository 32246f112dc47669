/* SPDX-License-Identifier: MIT */
/*
 * engine/api/http_rbuf.c - the receive buffers of the HTTP server (http.c): one io_uring
 * provided-buffer ring shared by every connection. A receive in flight names the group, not
 * a buffer; the kernel takes a buffer only when bytes arrive, and http.c copies them into the
 * connection's input and gives the buffer back at once. So the receive memory is the pool's,
 * whatever the number of connections: 1,000 clients in a burst, or 1,000 idle keep-alive
 * connections, no longer hold 16 KiB each. Needs Linux 5.19, as the multishot accept does.
 * The receives that found the pool empty queue here for a buffer (dps_http_rbufs_wait).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <liburing.h>

#include "engine/api/http_int.h"

struct dps_http_rbufs {
	struct io_uring *ring;
	struct io_uring_buf_ring *br; /* (n) entries, page-aligned, read by the kernel */
	char *mem;                    /* (n, size) bytes: buffer bid at mem + bid * size */
	unsigned n, size;
	int bgid;
	struct dps_http_waiter *head, *tail; /* the receives waiting for a buffer, oldest first */
};

int dps_http_rbufs_new(struct dps_http_rbufs **out, struct io_uring *ring, unsigned n,
		       unsigned size, int bgid)
{
	struct dps_http_rbufs *b;
	struct io_uring_buf_reg reg;
	int rc;

	*out = NULL;
	if (!n || n > 32768 || (n & (n - 1)) || !size)
		return -EINVAL;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->ring = ring;
	b->n = n;
	b->size = size;
	b->bgid = bgid;
	b->br = mmap(NULL, n * sizeof(struct io_uring_buf), PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	/* Outside the heap: the pool's pages are never mixed with what a burst frees. */
	b->mem = mmap(NULL, (size_t)n * size, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (b->br == MAP_FAILED || b->mem == MAP_FAILED) {
		rc = -ENOMEM;
		goto err;
	}
	memset(&reg, 0, sizeof(reg));
	reg.ring_addr = (uint64_t)(uintptr_t)b->br;
	reg.ring_entries = n;
	reg.bgid = (uint16_t)bgid;
	rc = io_uring_register_buf_ring(ring, &reg, 0);
	if (rc)
		goto err;
	io_uring_buf_ring_init(b->br);
	for (unsigned i = 0; i < n; i++)
		io_uring_buf_ring_add(b->br, b->mem + (size_t)i * size, size, (unsigned short)i,
				      io_uring_buf_ring_mask(n), (int)i);
	/* (the advance is a release store of the tail: the kernel sees the entries first) */
	io_uring_buf_ring_advance(b->br, (int)n);
	*out = b;
	return 0;
err:
	if (b->br != MAP_FAILED)
		munmap(b->br, n * sizeof(struct io_uring_buf));
	if (b->mem != MAP_FAILED)
		munmap(b->mem, (size_t)n * size);
	free(b);
	return rc;
}

const char *dps_http_rbufs_data(const struct dps_http_rbufs *b, unsigned bid)
{
	return bid < b->n ? b->mem + (size_t)bid * b->size : NULL;
}

void dps_http_rbufs_wait(struct dps_http_rbufs *b, struct dps_http_waiter *w)
{
	if (w->queued)
		return;
	w->queued = 1;
	w->next = NULL;
	w->prev = b->tail;
	if (b->tail)
		b->tail->next = w;
	else
		b->head = w;
	b->tail = w;
}

void dps_http_rbufs_leave(struct dps_http_rbufs *b, struct dps_http_waiter *w)
{
	if (!w->queued)
		return;
	if (w->prev)
		w->prev->next = w->next;
	else
		b->head = w->next;
	if (w->next)
		w->next->prev = w->prev;
	else
		b->tail = w->prev;
	w->prev = w->next = NULL;
	w->queued = 0;
}

int dps_http_rbufs_waiting(const struct dps_http_rbufs *b)
{
	return b->head != NULL;
}

struct dps_http_waiter *dps_http_rbufs_next(struct dps_http_rbufs *b)
{
	struct dps_http_waiter *w = b->head;

	if (w)
		dps_http_rbufs_leave(b, w);
	return w;
}

struct dps_http_waiter *dps_http_rbufs_put(struct dps_http_rbufs *b, unsigned bid)
{
	if (bid >= b->n)
		return NULL;
	/* (the advance is a release store of the tail: the kernel sees the entry first) */
	io_uring_buf_ring_add(b->br, b->mem + (size_t)bid * b->size, b->size, (unsigned short)bid,
			      io_uring_buf_ring_mask(b->n), 0);
	io_uring_buf_ring_advance(b->br, 1);
	return dps_http_rbufs_next(b);
}

void dps_http_rbufs_free(struct dps_http_rbufs *b, int busy)
{
	if (!b)
		return;
	/* With a receive in flight the kernel may still write into a buffer: the memory then
	 * stays mapped until the process ends (the ring goes with it). */
	if (busy)
		return;
	io_uring_unregister_buf_ring(b->ring, b->bgid);
	munmap(b->br, b->n * sizeof(struct io_uring_buf));
	munmap(b->mem, (size_t)b->n * b->size);
	free(b);
}

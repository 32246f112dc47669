/* SPDX-License-Identifier: MIT */
/*
 * shm/coll_window.c - the windows of coll.h and the collectives that read their inputs there
 * (in place). Called by coll.c when a caller's input lies in its window: the engine's prefill
 * activations at TP > 1.
 */
#include <string.h>

#include "common/dps.h"
#include "shm/coll.h"
#include "shm/coll_int.h"

void *dps_comm_window(const struct dps_comm *c, size_t *bytes)
{
	if (bytes)
		*bytes = c->windows ? c->window_bytes : 0;
	return c->windows ? window_of(c, c->me) : NULL;
}

/* ---- in place: inputs read where they lie, in the members' windows ------------------------
 *
 * A call whose input lies in the caller's window (coll.h) starts with a ready step (every
 * member publishes where its input lies in its window and how many elements it holds, in the
 * tiny part of a slot); then come the reads and sums straight from the windows, and a last
 * step after which no member reads a window any more, so that on return each may write its
 * own again.
 */
#define WIN_MAGIC 0x776f646e6977ull /* "window" */

struct win_hdr {
	uint64_t magic, step, off, count;
	uint64_t bad; /* this member's arguments break the rules of coll.h */
};

_Static_assert(sizeof(struct win_hdr) <= TINY, "the window header fits a slot's flag line");

/* Whether [p, p + len) overlaps this member's window. */
static int overlaps_window(const struct dps_comm *c, const void *p, size_t len)
{
	const unsigned char *w = window_of(c, c->me), *q = p;

	return len && q < w + c->window_bytes && q + len > w;
}

/*
 * The ready step: this member's input is `count` elements at `send` in its window; every
 * member's offset lands in c->offs. want (NULL: every member holds count) are the counts the
 * caller expects of each member; recv_bad says this member's output overlaps its window where
 * coll.h forbids it. Returns 0, -DPS_EABORT, or -EINVAL once the step is complete when some
 * member is not in place, holds another count, or broke a rule (a misaligned input, an output
 * in its window): every member sees the same headers, so all fail alike.
 */
static int window_ready(struct dps_comm *c, const void *send, int recv_bad, size_t count,
			const size_t *want, size_t esz)
{
	const uint64_t s = c->seq + 1;
	const size_t off = (size_t)((const unsigned char *)send - window_of(c, c->me));
	struct win_hdr *h, mine;
	unsigned k;
	int rc, bad = 0;

	rc = slot_acquire(c, &k);
	if (rc)
		return rc;
	mine = (struct win_hdr){ WIN_MAGIC, s, off, count, (uint64_t)(recv_bad || off % esz) };
	h = (struct win_hdr *)(void *)slot_data(c, c->me, k, 1);
	*h = mine;
	rc = step_sync(c, k, s);
	if (rc)
		return rc;
	for (int i = 0; i < c->n; i++) {
		/* (our own header from here: a line just written is slow to read back) */
		const struct win_hdr *p = i == c->me ? &mine
				       : (const struct win_hdr *)(const void *)slot_data(c, i, k, 1);
		const size_t need = want ? want[i] : count;

		if (p->magic != WIN_MAGIC || p->step != s || p->count != need ||
		    p->off > c->window_bytes || need > (c->window_bytes - p->off) / esz)
			bad |= 1;
		else if (p->bad)
			bad |= 2;
		else
			c->offs[i] = p->off;
	}
	c->slot_last[k] = s;
	if (bad & 1)
		dps_error("in-place collective: a member's input is not in its window, or the "
			  "members disagree on its size");
	if (bad & 2)
		dps_error("in-place collective: a member's input is not aligned to its elements, "
			  "or its output overlaps its window (shm/coll.h)");
	return bad ? -EINVAL : 0;
}

int dps_coll_peer_in_place(const struct dps_comm *c, unsigned k, uint64_t s)
{
	for (int i = 0; i < c->n; i++) {
		const struct win_hdr *p = (const struct win_hdr *)(const void *)slot_data(c, i, k, 1);

		/* (a peer on the window path, or on the single-copy path: DPS_CMA_MAGIC; not
		 * ourselves, who are on neither) */
		if (i != c->me && (p->magic == WIN_MAGIC || p->magic == DPS_CMA_MAGIC) && p->step == s)
			return 1;
	}
	return 0;
}

static inline const unsigned char *win_in(const struct dps_comm *c, int member)
{
	return window_of(c, member) + c->offs[member];
}

/*
 * The ordered sum of elements [at, at + len) of every member's input, a block at a time in
 * the stack, into this member's slot (streamed when the call streams: coll.c, "write mode")
 * for the peers and into its own output, so that it need not read its slot back.
 */
static void reduce_part(struct dps_comm *c, enum dps_dtype t, unsigned char *slot,
			unsigned char *out, size_t at, size_t len)
{
	const size_t esz = dps_dtype_size(t);
	_Alignas(64) unsigned char tmp[16384];
	const size_t blk = sizeof(tmp) / esz;

	for (size_t b = 0; b < len; b += blk) {
		const size_t m = len - b < blk ? len - b : blk;

		for (int i = 0; i < c->n; i++)
			c->src[i] = win_in(c, i) + (at + b) * esz;
		dps_reduce_sum(t, tmp, c->src, c->n, m);
		slot_write(c, slot + b * esz, tmp, m * esz);
		memcpy(out + b * esz, tmp, m * esz);
	}
}

/*
 * All-reduce in place: chunk by chunk, each member sums its part of the chunk from every
 * member's window, in member order, into its own slot (the inputs stay as they are), and after
 * the step copies every member's reduced part from the slots. A chunk holds n slots' worth,
 * so the parts stay in cache between the two halves. Once the last chunk's step is over no
 * member reads a window any more: no closing step is needed.
 */
int dps_coll_allreduce_window(struct dps_comm *c, const void *send, void *recv, size_t count,
			      enum dps_dtype t)
{
	const size_t esz = dps_dtype_size(t), unit = DPS_CACHELINE / esz;
	const size_t chunk = (size_t)c->n * (slot_cap(c) / DPS_CACHELINE) * unit;
	const uint64_t pk = dps_coll_pick_begin(c, DPS_COLL_ALLREDUCE, count * esz);
	int rc;

	rc = window_ready(c, send, recv != send && overlaps_window(c, recv, count * esz), count,
			  NULL, esz);
	for (size_t off = 0; off < count && !rc; off += chunk) {
		const size_t m = count - off < chunk ? count - off : chunk;
		const uint64_t s = c->seq + 1;
		size_t lo, len;
		unsigned k;

		rc = slot_acquire(c, &k);
		if (rc)
			break;
		part_range(m, esz, c->n, c->me, &lo, &len);
		/* recv may be our window: nobody reads our part of it but us */
		reduce_part(c, t, slot_data(c, c->me, k, 0), (unsigned char *)recv + (off + lo) * esz,
			    off + lo, len);
		rc = step_sync(c, k, s);
		if (rc)
			break;
		for (int i = 0; i < c->n; i++) {
			if (i == c->me)
				continue;
			part_range(m, esz, c->n, i, &lo, &len);
			memcpy((char *)recv + (off + lo) * esz, slot_data(c, i, k, 0), len * esz);
		}
		c->slot_last[k] = s;
	}
	dps_coll_pick_end(c, count * esz, pk, rc);
	c->stats.in_place[DPS_COLL_ALLREDUCE] += !rc;
	return rc;
}

int dps_coll_allgatherv_window(struct dps_comm *c, const void *send, void *recv,
			       const size_t *counts, const size_t *displs, size_t esz)
{
	size_t off = 0, end = 0;
	int rc;

	/* Every member's part copied straight from its window, then a step after which nobody
	 * reads the windows. recv's extent: the end of its last part. */
	for (int i = 0; i < c->n; i++) {
		const size_t e = ((displs ? displs[i] : off / esz) + counts[i]) * esz;

		end = e > end ? e : end;
		off += counts[i] * esz;
	}
	rc = window_ready(c, send, overlaps_window(c, recv, end), counts[c->me], counts, esz);
	off = 0;
	for (int i = 0; i < c->n && !rc; off += counts[i++] * esz)
		memcpy((char *)recv + (displs ? displs[i] * esz : off), win_in(c, i),
		       counts[i] * esz);
	if (!rc)
		rc = sync_all(c);
	c->stats.in_place[DPS_COLL_ALLGATHER] += !rc;
	return rc;
}

int dps_coll_reducescatterv_window(struct dps_comm *c, const void *send, void *recv,
				   const size_t *counts, enum dps_dtype t)
{
	const size_t esz = dps_dtype_size(t);
	size_t first = 0, total = 0;
	int rc;

	/* Our block of every member's input, summed in member order from the windows. */
	for (int q = 0; q < c->n; q++) {
		if (q < c->me)
			first += counts[q];
		total += counts[q];
	}
	rc = window_ready(c, send, overlaps_window(c, recv, counts[c->me] * esz), total, NULL,
			  esz);
	if (rc)
		return rc;
	for (int i = 0; i < c->n; i++)
		c->src[i] = win_in(c, i) + first * esz;
	dps_reduce_sum(t, recv, c->src, c->n, counts[c->me]);
	rc = sync_all(c);
	c->stats.in_place[DPS_COLL_REDUCESCATTER] += !rc;
	return rc;
}

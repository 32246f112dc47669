/* SPDX-License-Identifier: MIT */
/*
 * shm/coll_x.c - the members' side of a group that crosses nodes (coll_x.h): rounds of one
 * raw exchange, and every operation of coll.h built on them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "shm/coll.h"
#include "shm/coll_int.h"
#include "shm/coll_x.h"
#include "shm/reduce.h"

static size_t hdr_size(int n)
{
	return dps_align_up(sizeof(struct dps_xarea) + (size_t)n * sizeof(struct dps_xmember), 4096);
}

size_t dps_xarea_size(int n, size_t piece)
{
	size_t b, total;

	if (n < 2 || piece % DPS_CACHELINE || !piece ||
	    dps_size_mul((size_t)n * 2, piece, &b) || dps_size_add(hdr_size(n), b, &total))
		return 0;
	return total;
}

void dps_xarea_init(void *mem, int n, size_t piece)
{
	struct dps_xarea *a = mem;

	memset(mem, 0, hdr_size(n));
	a->n = (uint32_t)n;
	a->piece = piece;
}

unsigned char *dps_xarea_in(struct dps_xarea *a, int g)
{
	return (unsigned char *)a + hdr_size((int)a->n) + (size_t)g * a->piece;
}

unsigned char *dps_xarea_out(struct dps_xarea *a, int g)
{
	return (unsigned char *)a + hdr_size((int)a->n) + ((size_t)a->n + (size_t)g) * a->piece;
}

int dps_xarea_ready(struct dps_xarea *a, const int *local, int n_local, uint64_t s)
{
	for (int i = 0; i < n_local; i++)
		if (atomic_load_explicit(&a->m[local[i]].post, memory_order_acquire) < s)
			return 0;
	return 1;
}

int dps_comm_attach_x(struct dps_comm *c, void *mem, int n, int me, const int *ranks,
		      const _Atomic uint32_t *abort_word, struct dps_wword *bell)
{
	struct dps_xarea *a = mem;

	if (dps_comm_base(c, n, me, ranks, abort_word) || n < 2 || !mem ||
	    a->n != (uint32_t)n || !a->piece)
		return -EINVAL;
	c->x = a;
	c->xbell = bell;
	return dps_comm_scratch(c);
}

/*
 * One round: this member's piece (len bytes, more: its payload goes on) in, every member's
 * piece out (c->src[g], c->counts[g] bytes; valid until the next round). *any_more: some
 * member's payload goes on.
 */
static int xround(struct dps_comm *c, const void *piece, size_t len, int more, int *any_more)
{
	struct dps_xarea *a = c->x;
	const uint64_t s = ++c->xseq;
	int rc;

	DPS_ASSERT(len <= a->piece);
	if (len)
		memcpy(dps_xarea_in(a, c->me), piece, len);
	a->m[c->me].len = len | (more ? DPS_X_MORE : 0);
	atomic_store_explicit(&a->m[c->me].post, s, memory_order_release);
	dps_bell_ring(c->xbell);
	rc = dps_wword_wait(&a->done, s, c->abort_word, 0, NULL);
	if (rc)
		return rc;
	*any_more = 0;
	for (int g = 0; g < c->n; g++) {
		const uint64_t l = a->m[g].out_len;

		c->src[g] = dps_xarea_out(a, g);
		c->counts[g] = (size_t)(l & ~DPS_X_MORE);
		*any_more |= !!(l & DPS_X_MORE);
		if (c->counts[g] > a->piece)
			return -EPROTO;
	}
	return 0;
}

/*
 * Streams this member's payload (bytes at p) through rounds; after each round, fn(arg, off)
 * with c->src / c->counts holding every member's bytes [off, off + piece) of its payload.
 */
static int xstream(struct dps_comm *c, const void *p, size_t bytes,
		   int (*fn)(struct dps_comm *c, size_t off, void *arg), void *arg)
{
	const size_t piece = c->x->piece;
	size_t off = 0;
	int more, rc;

	do {
		const size_t len = off < bytes ? (bytes - off < piece ? bytes - off : piece) : 0;

		rc = xround(c, (const char *)p + off, len, off + len < bytes, &more);
		if (!rc)
			rc = fn(c, off, arg);
		if (rc)
			return rc;
		off += piece;
	} while (more);
	return 0;
}

/* A call's statistics (coll.h's): t0 its start when timing, else 0. */
static int xdone(struct dps_comm *c, enum dps_coll_kind k, size_t bytes, int rc, uint64_t t0)
{
	if (!rc) {
		c->stats.calls[k]++;
		c->stats.bytes[k] += bytes;
		if (t0)
			c->stats.ns[k] += dps_now_ns() - t0;
	}
	return rc;
}

static uint64_t xbegin(const struct dps_comm *c)
{
	return c->timing ? dps_now_ns() : 0;
}

static int nothing(struct dps_comm *c, size_t off, void *arg)
{
	(void)c, (void)off, (void)arg;
	return 0;
}

int dps_xcoll_barrier(struct dps_comm *c)
{
	const uint64_t t0 = xbegin(c);

	return xdone(c, DPS_COLL_BARRIER, 0, xstream(c, NULL, 0, nothing, NULL), t0);
}

struct bc { char *buf; size_t bytes; int root, bad; };

/* (what a member's call says it expects bounds what it takes: more is an error at the end of
 * the call, on every member that sees it, after every round) */
static int bcast_fn(struct dps_comm *c, size_t off, void *arg)
{
	struct bc *b = arg;
	const size_t n = c->counts[b->root];

	if (n && (off > b->bytes || n > b->bytes - off))
		b->bad = 1;
	else if (c->me != b->root && n)
		memcpy(b->buf + off, c->src[b->root], n);
	return 0;
}

int dps_xcoll_bcast(struct dps_comm *c, void *buf, size_t bytes, int root)
{
	const uint64_t t0 = xbegin(c);
	struct bc b = { buf, bytes, root, 0 };
	int rc = xstream(c, buf, c->me == root ? bytes : 0, bcast_fn, &b);

	return xdone(c, DPS_COLL_BCAST, bytes, rc ? rc : b.bad ? -EPROTO : 0, t0);
}

struct bv { char *buf; size_t cap, got; int root, over; };

static int bvar_fn(struct dps_comm *c, size_t off, void *arg)
{
	struct bv *b = arg;
	const size_t n = c->counts[b->root];

	if (!n)
		return 0;
	if (off > b->cap || n > b->cap - off) {
		b->over = 1; /* keeps taking part; the caller is told */
		return 0;
	}
	if (c->me != b->root)
		memcpy(b->buf + off, c->src[b->root], n);
	b->got = off + n;
	return 0;
}

int dps_coll_bcast_bytes(struct dps_comm *c, void *buf, size_t len, size_t cap, int root,
			 size_t *got)
{
	const uint64_t t0 = xbegin(c);
	struct bv b = { buf, cap, 0, root, 0 };
	int rc;

	*got = 0;
	if (root < 0 || root >= c->n || !c->x)
		return -EINVAL;
	rc = xstream(c, buf, c->me == root ? len : 0, bvar_fn, &b);
	*got = b.got;
	if (!rc && b.over)
		rc = -EMSGSIZE;
	return xdone(c, DPS_COLL_BCAST, b.got, rc, t0);
}

struct ag { char *recv; const size_t *counts, *displs; size_t esz; int bad; };

static int ag_fn(struct dps_comm *c, size_t off, void *arg)
{
	struct ag *a = arg;
	size_t at = 0;

	for (int g = 0; g < c->n; g++) {
		const size_t dst = (a->displs ? a->displs[g] * a->esz : at) + off;
		const size_t want = a->counts[g] * a->esz;

		if (c->counts[g] && (off > want || c->counts[g] > want - off))
			a->bad = 1; /* member g sent more than this one's counts say */
		else if (c->counts[g])
			memmove(a->recv + dst, c->src[g], c->counts[g]);
		at += want;
	}
	return 0;
}

int dps_xcoll_allgatherv(struct dps_comm *c, const void *send, void *recv, const size_t *counts,
			 const size_t *displs, size_t esz, size_t total)
{
	const uint64_t t0 = xbegin(c);
	const size_t mine = counts[c->me] * esz;
	struct ag a = { recv, c->offs, displs, esz, 0 };
	size_t end = 0, at = 0;
	const void *from = send;
	void *copy = NULL;
	int rc;

	/* c->counts is the rounds' scratch, and the caller's counts may be that very array:
	 * they are kept in c->offs (unused by groups across nodes) */
	memmove(c->offs, counts, sizeof(size_t) * (size_t)c->n);
	for (int i = 0; i < c->n; at += c->offs[i++]) {
		const size_t e = (displs ? displs[i] : at) + c->offs[i];

		end = e > end ? e : end;
	}
	/* send inside recv (in place): the rounds would read it while recv fills */
	if (mine && (const char *)send < (char *)recv + end * esz &&
	    (const char *)send + mine > (char *)recv) {
		copy = malloc(mine);
		if (!copy) /* (a call that fails on one member only stops the others at the abort) */
			return -ENOMEM;
		from = memcpy(copy, send, mine);
	}
	rc = xstream(c, from, mine, ag_fn, &a);
	if (!rc && a.bad)
		rc = -EPROTO;
	free(copy);
	return xdone(c, DPS_COLL_ALLGATHER, total, rc, t0);
}

struct ar { char *recv; enum dps_dtype t; size_t esz; size_t lo, hi; const void **src; };

/* Sums, in group order, the elements of this round that fall in [lo, hi) of the payload
 * into recv (which starts at payload byte lo). */
static int sum_fn(struct dps_comm *c, size_t off, void *arg)
{
	const struct ar *r = arg;
	const size_t n = c->counts[0];
	size_t a = off > r->lo ? off : r->lo, b = off + n < r->hi ? off + n : r->hi;

	for (int g = 1; g < c->n; g++)
		if (c->counts[g] != n)
			return -EPROTO; /* every member's payload is the same length */
	if (a >= b)
		return 0;
	for (int g = 0; g < c->n; g++)
		r->src[g] = (const char *)c->src[g] + (a - off);
	dps_reduce_sum(r->t, r->recv + (a - r->lo), r->src, c->n, (b - a) / r->esz);
	return 0;
}

static int xsum(struct dps_comm *c, const void *send, void *recv, size_t bytes, size_t lo,
		size_t hi, enum dps_dtype t)
{
	struct ar r = { recv, t, dps_dtype_size(t), lo, hi, NULL };
	int rc;

	/* piece is a multiple of 64: no element straddles two rounds */
	r.src = malloc(sizeof(void *) * (size_t)c->n);
	if (!r.src)
		return -ENOMEM;
	rc = xstream(c, send, bytes, sum_fn, &r);
	free(r.src);
	return rc;
}

int dps_xcoll_allreduce(struct dps_comm *c, const void *send, void *recv, size_t count,
			enum dps_dtype t)
{
	const size_t bytes = count * dps_dtype_size(t);
	const uint64_t t0 = xbegin(c);

	return xdone(c, DPS_COLL_ALLREDUCE, bytes, xsum(c, send, recv, bytes, 0, bytes, t), t0);
}

int dps_xcoll_reducescatterv(struct dps_comm *c, const void *send, void *recv,
			     const size_t *counts, enum dps_dtype t)
{
	const size_t esz = dps_dtype_size(t);
	const uint64_t t0 = xbegin(c);
	size_t lo = 0, total = 0;

	for (int g = 0; g < c->n; g++) {
		if (g == c->me)
			lo = total * esz;
		total += counts[g];
	}
	return xdone(c, DPS_COLL_REDUCESCATTER, total * esz,
		     xsum(c, send, recv, total * esz, lo, lo + counts[c->me] * esz, t), t0);
}

/*
 * All-to-all: each member's payload is its n send counts, then its n blocks in group order.
 * Every member sees every header: a count no buffer can hold (sent by any member) makes every
 * member return -EINVAL; a receive count that disagrees with its sender's only the receiver.
 */
struct a2a {
	char *recv;
	const size_t *rcounts, *rdispls;
	size_t esz, hdr;
	uint64_t *sc;     /* (n * n) every member's send counts */
	size_t *blk;      /* (n) where block me starts in member j's payload */
	int bad, mismatch;
};

static int a2a_fn(struct dps_comm *c, size_t off, void *arg)
{
	struct a2a *x = arg;
	const int n = c->n;
	const size_t limit = SIZE_MAX / 4 / x->esz / (size_t)n;

	if (off == 0) {
		for (int j = 0; j < n; j++) {
			const uint64_t *row = x->sc + (size_t)j * (size_t)n;
			size_t at = 0;

			if (c->counts[j] < x->hdr)
				return -EPROTO;
			memcpy(x->sc + (size_t)j * (size_t)n, c->src[j], x->hdr);
			for (int q = 0; q < n; q++) {
				if (row[q] > limit)
					x->bad = 1;
				if (q == c->me)
					x->blk[j] = x->hdr + at * x->esz;
				at += row[q];
			}
			if (row[c->me] != x->rcounts[j])
				x->mismatch = 1;
		}
	}
	if (x->bad || x->mismatch)
		return 0;
	for (int j = 0; j < n; j++) {
		const size_t a0 = x->blk[j], b0 = a0 + x->rcounts[j] * x->esz;
		const size_t a = off > a0 ? off : a0;
		const size_t b = off + c->counts[j] < b0 ? off + c->counts[j] : b0;

		if (a < b)
			memcpy(x->recv + x->rdispls[j] * x->esz + (a - a0),
			       (const char *)c->src[j] + (a - off), b - a);
	}
	return 0;
}

int dps_xcoll_alltoallv(struct dps_comm *c, const void *send, const size_t *scounts,
			const size_t *sdispls, void *recv, const size_t *rcounts,
			const size_t *rdispls, enum dps_dtype t)
{
	const int n = c->n;
	const size_t esz = dps_dtype_size(t);
	const size_t limit = SIZE_MAX / 4 / esz / (size_t)n;
	const uint64_t t0 = xbegin(c);
	struct a2a x = { recv, rcounts, NULL, esz, sizeof(uint64_t) * (size_t)n, NULL, NULL, 0, 0 };
	size_t total = 0, at = 0, *rd = NULL;
	unsigned char *pay = NULL;
	int rc = -ENOMEM, bad = 0;

	for (int q = 0; q < n; q++) {
		if (scounts[q] > limit || rcounts[q] > limit)
			bad = 1;
		else
			total += scounts[q];
	}
	x.sc = malloc(sizeof(uint64_t) * (size_t)n * (size_t)n);
	x.blk = malloc(sizeof(size_t) * (size_t)n);
	rd = malloc(sizeof(size_t) * (size_t)n);
	pay = malloc(x.hdr + (bad ? 0 : total * esz));
	if (!x.sc || !x.blk || !rd || !pay)
		goto out;
	for (int q = 0; q < n; q++) {
		/* a member with bad counts still takes part: its header makes everyone refuse */
		((uint64_t *)(void *)pay)[q] = bad ? UINT64_MAX / 2 : scounts[q];
		if (bad)
			continue;
		memcpy(pay + x.hdr + at * esz,
		       (const char *)send + (sdispls ? sdispls[q] : at) * esz, scounts[q] * esz);
		at += scounts[q];
	}
	at = 0;
	for (int j = 0; j < n; j++) { /* packed in group order when no displacements are given */
		rd[j] = rdispls ? rdispls[j] : at;
		at += rcounts[j] <= limit ? rcounts[j] : 0;
	}
	x.rdispls = rd;
	rc = xstream(c, pay, x.hdr + (bad ? 0 : total * esz), a2a_fn, &x);
	if (!rc && (x.bad || x.mismatch))
		rc = -EINVAL;
out:
	free(x.sc);
	free(x.blk);
	free(rd);
	free(pay);
	return xdone(c, DPS_COLL_ALLTOALL, total * esz, rc, t0);
}

/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/xnode_fetch.c - the MPI thread's part in disaggregated prefill across nodes
 * (docs/DESIGN.md, "Several nodes"): a rank's fetch of a prefill rank's KV share bytes is
 * asked of that rank's node (T_READ), served there from its share, and the answer (T_DATA)
 * written into this node's share at the same offsets.
 */
#include <errno.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/xnode_int.h"

static void fetch_publish(struct dps_xlink *x, int r, uint64_t seq, int rc)
{
	struct dps_fetch *f = dps_layout_fetch(&x->s->lay, x->s->segs[x->s->node].base, r);

	f->rc = rc;
	x->fserved[r] = seq;
	x->fwait[r] = 0;
	dps_wword_publish(&f->done, seq);
}

/* This node's ranks' new fetches: asked of the prefill rank's node (T_READ). */
int dps_xmpi_fetch_step(struct dps_xlink *x)
{
	const struct dps_layout *l = &x->s->lay;
	int moved = 0;

	for (int r = x->s->lo; l->fetch_off && r < x->s->hi; r++) {
		struct dps_fetch *f = dps_layout_fetch(l, x->s->segs[x->s->node].base, r);
		const uint64_t s = atomic_load_explicit(&f->post, memory_order_acquire);
		const size_t rb = sizeof(f->range[0]) * (size_t)(f->n > 0 ? f->n : 0);
		struct qmsg *m;
		int rc, from;

		if (s <= x->fserved[r] || x->fwait[r] == s)
			continue;
		moved = 1;
		rc = dps_sup_fetch_check(x->s, f->q, (const uint64_t (*)[2])f->range, f->n);
		from = rc ? -1 : dps_layout_node_of(l, l->groups.prefill->rank_base + f->q);
		if (rc || from == x->s->node) { /* (on this node the share is already here) */
			fetch_publish(x, r, s, rc);
			continue;
		}
		m = dps_xmpi_msg(T_READ, from, x->run, r, x->s->node, f->q, NULL, 8 + rb);
		if (!m) {
			fetch_publish(x, r, s, -ENOMEM);
			continue;
		}
		memcpy(m->buf + sizeof(struct wire), &s, 8);
		memcpy(m->buf + sizeof(struct wire) + 8, f->range, rb);
		x->fwait[r] = s;
		dps_xmpi_send(x, m);
	}
	return moved;
}

/* Another node's rank asks for bytes of a prefill rank here: they go back (T_DATA). */
void dps_xmpi_fetch_serve(struct dps_xlink *x, const struct qmsg *m, int src)
{
	struct wire w;
	const uint64_t (*range)[2] = (const void *)(m->buf + sizeof(w) + 8);
	const size_t rb = m->len - sizeof(w) - 8;
	const int n = (int)(rb / sizeof(range[0]));
	size_t total = 0;
	struct qmsg *out;
	int rc;

	memcpy(&w, m->buf, sizeof(w));
	rc = m->len < sizeof(w) + 8 || rb % sizeof(range[0]) ? -EPROTO
		: dps_sup_fetch_check(x->s, w.status, range, n);
	for (int i = 0; !rc && i < n; i++)
		total += range[i][1];
	out = dps_xmpi_msg(T_DATA, src, x->run, w.rank, x->s->node, rc, NULL, 8 + (rc ? 0 : total));
	if (!out)
		return; /* (its rank waits; the run's end or the abort frees it) */
	memcpy(out->buf + sizeof(w), m->buf + sizeof(w), 8); /* the request's number */
	if (!rc) {
		const char *slice = dps_sup_share_slice(x->s, x->s->node, w.status);
		size_t at = sizeof(w) + 8;

		for (int i = 0; i < n; i++, at += range[i - 1][1])
			memcpy(out->buf + at, slice + range[i][0], range[i][1]);
	}
	dps_xmpi_send(x, out);
}

/* The bytes a rank here asked for: into this node's share, at the same offsets. */
void dps_xmpi_fetch_done(struct dps_xlink *x, const struct qmsg *m)
{
	struct wire w;
	struct dps_fetch *f;
	uint64_t seq;
	size_t at = sizeof(w) + 8, total = 0;
	int rc;

	memcpy(&w, m->buf, sizeof(w));
	if (m->len < sizeof(w) + 8 || !sup_hosts(x->s, w.rank))
		return;
	memcpy(&seq, m->buf + sizeof(w), 8);
	if (seq != x->fwait[w.rank])
		return; /* not the request it waits for */
	f = dps_layout_fetch(&x->s->lay, x->s->segs[x->s->node].base, w.rank);
	rc = w.status;
	for (int i = 0; !rc && i < f->n; i++)
		total += f->range[i][1];
	if (!rc && m->len - at != total)
		rc = -EPROTO;
	if (!rc) {
		char *slice = dps_sup_share_slice(x->s, x->s->node, f->q);

		for (int i = 0; i < f->n; at += f->range[i][1], i++)
			memcpy(slice + f->range[i][0], m->buf + at, f->range[i][1]);
	}
	fetch_publish(x, w.rank, seq, rc);
}


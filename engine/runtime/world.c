/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/world.c - segment layout and per-rank communicator handles (see world.h). Runs
 * once per instance in the supervisor and once per rank after the fork.
 */
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/nodes.h"
#include "engine/runtime/world.h"
#include "shm/coll_x.h"

#define RING_SLOTS 16
#define RING_SLOT_BYTES 4096

struct collect {
	struct dps_layout *l;
	int base; /* instance rank of the part's rank 0 */
	int rc;
};

static int find_comm(const struct dps_layout *l, const int *ranks, int n)
{
	for (int i = 0; i < l->n_comms; i++)
		if (l->comms[i].n == n && !memcmp(l->comms[i].ranks, ranks, sizeof(int) * (size_t)n))
			return i;
	return -1;
}

static void collect_set(const struct dps_groupset *gs, void *arg)
{
	struct collect *c = arg;
	struct dps_layout *l = c->l;
	int g, *map;

	if (c->rc)
		return;
	map = calloc((size_t)gs->n_groups, sizeof(int));
	if (!map) {
		c->rc = -ENOMEM;
		return;
	}
	DPS_ASSERT(l->n_sets < DPS_SETS_MAX);
	l->sets[l->n_sets] = gs;
	l->set_base[l->n_sets] = c->base;
	l->set_comm[l->n_sets++] = map;
	for (g = 0; g < gs->n_groups; g++) {
		const int *ranks = gs->ranks + (size_t)g * (size_t)gs->group_size;
		int idx;

		if (c->base) { /* the prefill part: its members in instance ranks */
			int **no = realloc(l->owned, sizeof(*no) * (size_t)(l->n_owned + 1));
			int *shifted = malloc(sizeof(int) * (size_t)gs->group_size);

			if (no)
				l->owned = no;
			if (!no || !shifted) {
				free(shifted);
				c->rc = -ENOMEM;
				return;
			}
			for (int i = 0; i < gs->group_size; i++)
				shifted[i] = ranks[i] + c->base;
			l->owned[l->n_owned++] = shifted;
			ranks = shifted;
		}
		idx = find_comm(l, ranks, gs->group_size);

		if (idx < 0) {
			struct dps_layout_comm *nc =
				realloc(l->comms, sizeof(*nc) * (size_t)(l->n_comms + 1));

			if (!nc) {
				c->rc = -ENOMEM;
				return;
			}
			l->comms = nc;
			idx = l->n_comms++;
			nc[idx].n = gs->group_size;
			nc[idx].ranks = ranks;
			nc[idx].off = 0;
			nc[idx].window = 0;
			nc[idx].cross = 0;
		}
		/* TP groups (either part) carry the windows, also where another set aliases them */
		if (gs == &l->groups.tp || (l->groups.prefill && gs == &l->groups.prefill->tp))
			l->comms[idx].window = l->window_bytes;
		map[g] = idx;
	}
}

int dps_layout_build(struct dps_layout *l, const struct dps_par_cfg *cfg, size_t slot_bytes,
		     size_t window_bytes, char *err, size_t errlen)
{
	struct collect col = { l, 0, 0 };
	const struct dps_groups *pg;
	size_t off, sz;
	int i, rc;

	memset(l, 0, sizeof(*l));
	rc = dps_groups_build(cfg, &l->groups, err, errlen);
	if (rc)
		return rc;
	pg = l->groups.prefill;
	l->world = dps_groups_total(&l->groups);
	l->nodes = cfg->nodes > 1 ? cfg->nodes : 1;
	if (l->nodes > 1) {
		rc = dps_nodes_check(l->world, l->nodes, err, errlen);
		if (rc) {
			dps_groups_free(&l->groups);
			return rc;
		}
	}
	if (slot_bytes < (size_t)DPS_CACHELINE * ((size_t)l->world + 1))
		slot_bytes = (size_t)DPS_CACHELINE * ((size_t)l->world + 1);
	l->slot_bytes = dps_align_up(slot_bytes, 4096);
	l->window_bytes = dps_align_up(window_bytes, 4096);
	l->ring_slots = RING_SLOTS;
	l->ring_slot_bytes = RING_SLOT_BYTES;
	dps_groups_foreach_set(&l->groups, collect_set, &col);
	if (pg && !col.rc) {
		col.base = pg->rank_base;
		dps_groups_foreach_set(pg, collect_set, &col);
	}
	if (col.rc) {
		rc = col.rc;
		goto err;
	}
	off = dps_align_up(sizeof(struct dps_ctl) + sizeof(struct dps_beat) * (size_t)l->world, 4096);
	for (i = 0; i < l->n_comms; i++) {
		struct dps_layout_comm *lc = &l->comms[i];

		for (int k = 1; k < lc->n && l->nodes > 1; k++)
			if (dps_layout_node_of(l, lc->ranks[k]) != dps_layout_node_of(l, lc->ranks[0]))
				lc->cross = 1;
		if (lc->cross)
			lc->window = 0; /* the windows are one node's memory */
		sz = lc->cross ? dps_xarea_size(lc->n, l->slot_bytes)
			       : dps_comm_shm_size(lc->n, l->slot_bytes, lc->window);
		if (l->comms[i].n > 1 && sz == 0)
			goto toobig;
		l->comms[i].off = off;
		if (dps_size_add(off, dps_align_up(sz, 4096), &off))
			goto toobig;
	}
	l->ring_off = off;
	l->ring_bytes = dps_align_up(dps_ring_shm_size(l->ring_slots, 1, l->ring_slot_bytes), 4096);
	if (dps_size_mul(l->ring_bytes, (size_t)l->world * 2, &sz) || dps_size_add(off, sz, &off))
		goto toobig;
	l->rep_ring_off = off;
	l->rep_ring_bytes = 0;
	if (l->groups.cfg.tp > 1) {
		l->rep_ring_bytes = dps_align_up(dps_ring_shm_size(l->ring_slots,
								   (unsigned)l->groups.cfg.tp - 1,
								   l->ring_slot_bytes), 4096);
		if (dps_size_mul(l->rep_ring_bytes, (size_t)l->groups.cfg.dp, &sz) ||
		    dps_size_add(off, sz, &off))
			goto toobig;
	}
	l->prep_ring_off = off;
	l->prep_ring_bytes = 0;
	if (pg && pg->cfg.tp > 1) {
		l->prep_ring_bytes = dps_align_up(dps_ring_shm_size(l->ring_slots,
								    (unsigned)pg->cfg.tp - 1,
								    l->ring_slot_bytes), 4096);
		if (dps_size_mul(l->prep_ring_bytes, (size_t)pg->cfg.dp, &sz) ||
		    dps_size_add(off, sz, &off))
			goto toobig;
	}
	l->fetch_off = 0;
	if (l->nodes > 1 && pg) {
		l->fetch_off = dps_align_up(off, 4096);
		if (dps_size_mul(sizeof(struct dps_fetch), (size_t)l->world, &sz) ||
		    dps_size_add(l->fetch_off, sz, &off))
			goto toobig;
	}
	l->total = off;
	return 0;
toobig:
	snprintf(err, errlen, "shared memory layout for %d ranks with %zu-byte slots is too large",
		 l->world, l->slot_bytes);
	rc = -DPS_ETOOBIG;
err:
	dps_layout_free(l);
	return rc;
}

void dps_layout_free(struct dps_layout *l)
{
	for (int i = 0; i < l->n_sets; i++)
		free(l->set_comm[i]);
	free(l->comms);
	for (int i = 0; i < l->n_owned; i++)
		free(l->owned[i]);
	free(l->owned);
	dps_groups_free(&l->groups);
	memset(l, 0, sizeof(*l));
}

void *dps_layout_ring_to_sup(const struct dps_layout *l, void *base, int r)
{
	return (char *)base + l->ring_off + (size_t)r * 2 * l->ring_bytes;
}

void *dps_layout_ring_from_sup(const struct dps_layout *l, void *base, int r)
{
	return (char *)base + l->ring_off + ((size_t)r * 2 + 1) * l->ring_bytes;
}

void *dps_layout_ring_replica(const struct dps_layout *l, void *base, int prefill, int d)
{
	if (prefill)
		return (char *)base + l->prep_ring_off + (size_t)d * l->prep_ring_bytes;
	return (char *)base + l->rep_ring_off + (size_t)d * l->rep_ring_bytes;
}

void dps_layout_init_shm(const struct dps_layout *l, void *base)
{
	memset(base, 0, sizeof(struct dps_ctl) + sizeof(struct dps_beat) * (size_t)l->world);
	for (int i = 0; i < l->n_comms; i++)
		if (l->comms[i].cross)
			dps_xarea_init((char *)base + l->comms[i].off, l->comms[i].n, l->slot_bytes);
		else
			dps_comm_shm_init((char *)base + l->comms[i].off, l->comms[i].n,
					  l->slot_bytes, l->comms[i].window);
	for (int r = 0; r < l->world; r++) {
		dps_ring_init(dps_layout_ring_to_sup(l, base, r), l->ring_slots, 1,
			      l->ring_slot_bytes);
		dps_ring_init(dps_layout_ring_from_sup(l, base, r), l->ring_slots, 1,
			      l->ring_slot_bytes);
	}
	if (l->rep_ring_bytes)
		for (int d = 0; d < l->groups.cfg.dp; d++)
			dps_ring_init(dps_layout_ring_replica(l, base, 0, d), l->ring_slots,
				      (unsigned)l->groups.cfg.tp - 1, l->ring_slot_bytes);
	if (l->prep_ring_bytes)
		for (int p = 0; p < l->groups.prefill->cfg.dp; p++)
			dps_ring_init(dps_layout_ring_replica(l, base, 1, p), l->ring_slots,
				      (unsigned)l->groups.prefill->cfg.tp - 1, l->ring_slot_bytes);
}

static int member_index(const int *ranks, int n, int r)
{
	for (int i = 0; i < n; i++)
		if (ranks[i] == r)
			return i;
	return -1;
}

int dps_world_attach(struct dps_world *w, const struct dps_layout *l, void *base, int r,
		     int notify_fd)
{
	int i, rc;

	const struct dps_groups *part;

	memset(w, 0, sizeof(*w));
	if (r < 0 || r >= l->world)
		return -EINVAL;
	part = r < l->groups.world ? &l->groups : l->groups.prefill;
	w->rank = r;
	w->role = part == &l->groups ? DPS_ROLE_DECODE : DPS_ROLE_PREFILL;
	w->part = part;
	w->base = part->rank_base;
	w->total = l->world;
	w->world = part->world;
	w->tp = part->cfg.tp;
	w->dp = part->cfg.dp;
	w->tp_rank = (r - w->base) % w->tp;
	w->dp_rank = (r - w->base) / w->tp;
	w->lay = l;
	w->ctl = base;
	w->beat = &w->ctl->beat[r];
	w->xbell = &w->ctl->xbell;
	if (l->fetch_off)
		w->fetch = dps_layout_fetch(l, base, r);
	w->comms = calloc((size_t)l->n_comms, sizeof(*w->comms));
	if (!w->comms)
		return -ENOMEM;
	for (i = 0; i < l->n_comms; i++) {
		const struct dps_layout_comm *lc = &l->comms[i];
		int me = member_index(lc->ranks, lc->n, r);

		if (me < 0)
			continue;
		if (lc->cross)
			rc = dps_comm_attach_x(&w->comms[i], (char *)base + lc->off, lc->n, me,
					       lc->ranks, &w->ctl->abort, &w->ctl->xbell);
		else
			rc = dps_comm_attach(&w->comms[i], lc->n > 1 ? (char *)base + lc->off : NULL,
					     lc->n, me, lc->ranks, l->slot_bytes, &w->ctl->abort);
		if (rc)
			goto err;
	}
	w->world_c = dps_world_comm(w, &part->world_gs);
	w->tp_c = dps_world_comm(w, &part->tp);
	w->dp_c = dps_world_comm(w, &part->dp);
	for (i = 0; i < DPS_COMP_COUNT; i++) {
		w->comp_tp_c[i] = dps_world_comm(w, part->comp_tp_of[i]);
		w->dp_col_c[i] = dps_world_comm(w, part->dp_col_of[i]);
	}
	dps_ring_attach(&w->to_sup, dps_layout_ring_to_sup(l, base, r), &w->ctl->abort, notify_fd);
	dps_ring_attach(&w->from_sup, dps_layout_ring_from_sup(l, base, r), &w->ctl->abort, -1);
	if (w->tp > 1)
		dps_ring_attach(&w->replica, dps_layout_ring_replica(l, base, w->role ==
								     DPS_ROLE_PREFILL, w->dp_rank),
				&w->ctl->abort, -1);
	return 0;
err:
	dps_world_detach(w);
	return rc;
}

int dps_world_fetch(struct dps_world *w, int q, const uint64_t (*ranges)[2], int n)
{
	struct dps_fetch *f = w->fetch;
	int rc = 0;

	if (!f || !w->kv_share || q < 0 || !w->lay->groups.prefill ||
	    q >= w->lay->groups.prefill->world)
		return -EINVAL;
	for (int at = 0; at < n && !rc; at += DPS_FETCH_MAX) {
		const int k = n - at < DPS_FETCH_MAX ? n - at : DPS_FETCH_MAX;
		const uint64_t s = ++w->fetch_seq;

		f->q = q;
		f->n = k;
		f->rc = 0;
		memcpy(f->range, ranges + at, sizeof(f->range[0]) * (size_t)k);
		atomic_store_explicit(&f->post, s, memory_order_release);
		dps_bell_ring(w->xbell);
		rc = dps_wword_wait(&f->done, s, &w->ctl->abort, 0, NULL);
		if (!rc)
			rc = f->rc;
	}
	return rc;
}

void dps_world_detach(struct dps_world *w)
{
	if (w->comms)
		for (int i = 0; i < w->lay->n_comms; i++)
			dps_comm_detach(&w->comms[i]);
	free(w->comms);
	memset(w, 0, sizeof(*w));
}

struct dps_comm *dps_world_comm(struct dps_world *w, const struct dps_groupset *gs)
{
	const struct dps_layout *l = w->lay;

	for (int i = 0; i < l->n_sets; i++)
		if (l->sets[i] == gs) {
			const int r = w->rank - l->set_base[i];

			/* a set of the other part holds no group of this rank */
			if (r < 0 || r >= gs->n_groups * gs->group_size)
				return NULL;
			return &w->comms[l->set_comm[i][gs->group_of[r]]];
		}
	return NULL;
}

void dps_world_set_algo(struct dps_world *w, size_t oneshot_max, enum dps_coll_algo algo)
{
	for (int i = 0; i < w->lay->n_comms; i++) {
		w->comms[i].oneshot_max = oneshot_max;
		w->comms[i].algo = algo;
	}
}

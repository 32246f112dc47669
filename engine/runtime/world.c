/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/world.c - segment layout and per-rank communicator handles (see world.h). Runs
 * once per instance in the supervisor and once per rank after the fork.
 */
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/world.h"

#define RING_SLOTS 16
#define RING_SLOT_BYTES 4096

struct collect {
	struct dps_layout *l;
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
	l->sets[l->n_sets] = gs;
	l->set_comm[l->n_sets++] = map;
	for (g = 0; g < gs->n_groups; g++) {
		const int *ranks = gs->ranks + (size_t)g * (size_t)gs->group_size;
		int idx = find_comm(l, ranks, gs->group_size);

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
		}
		map[g] = idx;
	}
}

int dps_layout_build(struct dps_layout *l, const struct dps_par_cfg *cfg, size_t slot_bytes,
		     char *err, size_t errlen)
{
	struct collect col = { l, 0 };
	size_t off, sz;
	int i, rc;

	memset(l, 0, sizeof(*l));
	if (cfg->prefill_dp) {
		/* The groups are built (`dpshard groups`); the ranks' roles, the role-aware loading
		 * and the KV hand-off are not, so no instance runs such a layout yet. */
		snprintf(err, errlen, "--prefill-data-parallel-size %d: disaggregated prefill is "
			 "not implemented in running instances yet (`dpshard groups` shows the "
			 "layout); leave it unset to run prefill and decode on every rank",
			 cfg->prefill_dp);
		return -DPS_ECONFIG;
	}
	rc = dps_groups_build(cfg, &l->groups, err, errlen);
	if (rc)
		return rc;
	l->world = l->groups.world;
	if (slot_bytes < (size_t)DPS_CACHELINE * ((size_t)l->world + 1))
		slot_bytes = (size_t)DPS_CACHELINE * ((size_t)l->world + 1);
	l->slot_bytes = dps_align_up(slot_bytes, 4096);
	l->ring_slots = RING_SLOTS;
	l->ring_slot_bytes = RING_SLOT_BYTES;
	dps_groups_foreach_set(&l->groups, collect_set, &col);
	if (col.rc) {
		rc = col.rc;
		goto err;
	}
	off = dps_align_up(sizeof(struct dps_ctl) + sizeof(struct dps_beat) * (size_t)l->world, 4096);
	for (i = 0; i < l->n_comms; i++) {
		sz = dps_comm_shm_size(l->comms[i].n, l->slot_bytes);
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

void *dps_layout_ring_replica(const struct dps_layout *l, void *base, int d)
{
	return (char *)base + l->rep_ring_off + (size_t)d * l->rep_ring_bytes;
}

void dps_layout_init_shm(const struct dps_layout *l, void *base)
{
	memset(base, 0, sizeof(struct dps_ctl) + sizeof(struct dps_beat) * (size_t)l->world);
	for (int i = 0; i < l->n_comms; i++)
		dps_comm_shm_init((char *)base + l->comms[i].off, l->comms[i].n, l->slot_bytes);
	for (int r = 0; r < l->world; r++) {
		dps_ring_init(dps_layout_ring_to_sup(l, base, r), l->ring_slots, 1,
			      l->ring_slot_bytes);
		dps_ring_init(dps_layout_ring_from_sup(l, base, r), l->ring_slots, 1,
			      l->ring_slot_bytes);
	}
	if (l->rep_ring_bytes)
		for (int d = 0; d < l->groups.cfg.dp; d++)
			dps_ring_init(dps_layout_ring_replica(l, base, d), l->ring_slots,
				      (unsigned)l->groups.cfg.tp - 1, l->ring_slot_bytes);
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

	memset(w, 0, sizeof(*w));
	if (r < 0 || r >= l->world)
		return -EINVAL;
	w->rank = r;
	w->world = l->world;
	w->tp = l->groups.cfg.tp;
	w->dp = l->groups.cfg.dp;
	w->tp_rank = r % w->tp;
	w->dp_rank = r / w->tp;
	w->lay = l;
	w->ctl = base;
	w->beat = &w->ctl->beat[r];
	w->comms = calloc((size_t)l->n_comms, sizeof(*w->comms));
	if (!w->comms)
		return -ENOMEM;
	for (i = 0; i < l->n_comms; i++) {
		const struct dps_layout_comm *lc = &l->comms[i];
		int me = member_index(lc->ranks, lc->n, r);

		if (me < 0)
			continue;
		rc = dps_comm_attach(&w->comms[i], lc->n > 1 ? (char *)base + lc->off : NULL,
				     lc->n, me, lc->ranks, l->slot_bytes, &w->ctl->abort);
		if (rc)
			goto err;
	}
	w->world_c = dps_world_comm(w, &l->groups.world_gs);
	w->tp_c = dps_world_comm(w, &l->groups.tp);
	w->dp_c = dps_world_comm(w, &l->groups.dp);
	for (i = 0; i < DPS_COMP_COUNT; i++) {
		w->comp_tp_c[i] = dps_world_comm(w, l->groups.comp_tp_of[i]);
		w->dp_col_c[i] = dps_world_comm(w, l->groups.dp_col_of[i]);
	}
	dps_ring_attach(&w->to_sup, dps_layout_ring_to_sup(l, base, r), &w->ctl->abort, notify_fd);
	dps_ring_attach(&w->from_sup, dps_layout_ring_from_sup(l, base, r), &w->ctl->abort, -1);
	if (l->rep_ring_bytes)
		dps_ring_attach(&w->replica, dps_layout_ring_replica(l, base, w->dp_rank),
				&w->ctl->abort, -1);
	return 0;
err:
	dps_world_detach(w);
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
		if (l->sets[i] == gs)
			return &w->comms[l->set_comm[i][gs->group_of[w->rank]]];
	return NULL;
}

void dps_world_set_algo(struct dps_world *w, size_t oneshot_max, enum dps_coll_algo algo)
{
	for (int i = 0; i < w->lay->n_comms; i++) {
		w->comms[i].oneshot_max = oneshot_max;
		w->comms[i].algo = algo;
	}
}

/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/sup_nodes.c - which node a supervisor is (xlink.h), and the loopback
 * exchange: one supervisor hosting every node of `--nodes N` (no mpirun), each node with its
 * own segment as on separate machines, and a thread of the supervisor that does for the
 * groups crossing nodes what the proxies do over MPI: waits until every member of a group,
 * on every node, has posted a round, copies every member's piece into every node's area in
 * group order, and publishes the round on each. The ranks run exactly the code they run
 * under mpirun; only the transport of the rounds differs.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/sup_int.h"
#include "engine/runtime/xlink.h"
#include "shm/coll_x.h"

const struct dps_xlink_ops *dps_xlink_mpi;

int dps_mpirun_procs(int *rank)
{
	const char *r = getenv("OMPI_COMM_WORLD_RANK"), *n = getenv("OMPI_COMM_WORLD_SIZE");

	*rank = r && n ? atoi(r) : 0;
	return r && n ? atoi(n) : 0;
}

int dps_xlink_identity(int nodes, int *node, const struct dps_xlink_ops **ops, char *err,
		       size_t errlen)
{
	static int told;
	int rank;
	const int procs = dps_mpirun_procs(&rank);

	if (!procs) {
		*node = -1;
		*ops = &dps_xlink_loopback;
		if (!told++)
			dps_info("--nodes %d without mpirun: this process hosts all %d nodes, each "
				 "with its own shared memory, and groups that cross nodes exchange "
				 "through it as they would over MPI", nodes, nodes);
		return 0;
	}
	if (!dps_xlink_mpi) {
		snprintf(err, errlen, "--nodes %d under mpirun: this dpshard was built without "
			 "Open MPI (install libopenmpi-dev and run configure again)", nodes);
		return -DPS_ECONFIG;
	}
	if (procs != nodes) {
		snprintf(err, errlen, "--nodes %d, but mpirun started %d processes: start one "
			 "per node (mpirun -np %d --map-by node dpshard ... --nodes %d)", nodes, procs,
			 nodes, nodes);
		return -DPS_ECONFIG;
	}
	*node = rank;
	*ops = dps_xlink_mpi;
	return 0;
}

int dps_sup_fetch_check(const struct sup *s, int q, const uint64_t (*range)[2], int n)
{
	const struct dps_groups *pg = s->lay.groups.prefill;
	const uint64_t stride = s->o->kv_share_bytes;

	if (!pg || q < 0 || q >= pg->world || n < 0 || n > DPS_FETCH_MAX || !s->kv_shares)
		return -EINVAL;
	for (int i = 0; i < n; i++)
		if (range[i][0] > stride || range[i][1] > stride - range[i][0])
			return -EFAULT;
	return 0;
}

char *dps_sup_share_slice(const struct sup *s, int k, int q)
{
	if (!s->kv_shares || k < 0 || k >= s->lay.nodes || !s->kv_shares[k])
		return NULL;
	return s->kv_shares[k] + (size_t)q * s->o->kv_share_bytes;
}

/* ---- loopback -------------------------------------------------------------------------- */

struct lb_group {
	int n;
	const int *ranks;
	uint64_t done;
	struct dps_xarea **area;  /* (nodes) the group's area on each node, NULL: no member */
	int **local;              /* (nodes) that node's members, in group order */
	int *n_local;             /* (nodes) */
};

struct dps_xlink {
	struct sup *s;
	pthread_t th;
	int started;
	_Atomic int stop;
	struct dps_wword *bell;   /* node 0's: every rank rings it here */
	int n;
	struct lb_group *g;
	uint64_t *served;         /* (world) each rank's last fetch served */
};

/* Serves the ranks' fetches: copies from the prefill rank's node's share into theirs. */
static int lb_fetches(struct dps_xlink *x)
{
	const struct dps_layout *l = &x->s->lay;
	int moved = 0;

	for (int r = 0; l->fetch_off && r < l->world; r++) {
		const int k = dps_layout_node_of(l, r);
		struct dps_fetch *f = dps_layout_fetch(l, x->s->segs[k].base, r);
		const uint64_t s = atomic_load_explicit(&f->post, memory_order_acquire);
		int rc;

		if (s <= x->served[r])
			continue;
		rc = dps_sup_fetch_check(x->s, f->q, (const uint64_t (*)[2])f->range, f->n);
		if (!rc) {
			const int from = dps_layout_node_of(l, l->groups.prefill->rank_base + f->q);
			const char *src = dps_sup_share_slice(x->s, from, f->q);
			char *dst = dps_sup_share_slice(x->s, k, f->q);

			for (int i = 0; i < f->n && src != dst; i++)
				memcpy(dst + f->range[i][0], src + f->range[i][0], f->range[i][1]);
		}
		f->rc = rc;
		x->served[r] = s;
		dps_wword_publish(&f->done, s);
		moved = 1;
	}
	return moved;
}

static int lb_round(struct dps_xlink *x, struct lb_group *g)
{
	const struct dps_layout *l = &x->s->lay;
	const uint64_t s = g->done + 1;

	for (int k = 0; k < l->nodes; k++)
		if (g->area[k] && !dps_xarea_ready(g->area[k], g->local[k], g->n_local[k], s))
			return 0;
	for (int k = 0; k < l->nodes; k++) {
		if (!g->area[k])
			continue;
		for (int m = 0; m < g->n; m++) {
			struct dps_xarea *from = g->area[dps_layout_node_of(l, g->ranks[m])];
			const uint64_t len = from->m[m].len;

			memcpy(dps_xarea_out(g->area[k], m), dps_xarea_in(from, m),
			       (size_t)(len & ~DPS_X_MORE));
			g->area[k]->m[m].out_len = len;
		}
	}
	for (int k = 0; k < l->nodes; k++)
		if (g->area[k])
			dps_wword_publish(&g->area[k]->done, s);
	g->done = s;
	return 1;
}

static void *lb_main(void *arg)
{
	struct dps_xlink *x = arg;
	uint64_t idle_since = dps_now_ns();
	const struct dps_wait_policy sleepy = { 0, 0 }; /* (the bell: the ranks need the cores) */

	dps_wait_set_policy(&sleepy);
	while (!atomic_load(&x->stop)) {
		const uint64_t rung = atomic_load(&x->bell->val);
		int progress = 0;

		for (int i = 0; i < x->n; i++)
			while (lb_round(x, &x->g[i]))
				progress = 1;
		progress |= lb_fetches(x);
		if (progress) {
			idle_since = dps_now_ns();
		} else if (dps_now_ns() - idle_since < 200000) {
			sched_yield(); /* a next round usually follows at once */
		} else {
			/* sleeps until a member posts (it rings the bell) */
			(void)dps_wword_wait(x->bell, rung + 1, NULL, 50000000ull, NULL);
		}
	}
	return NULL;
}

static void lb_free(struct dps_xlink *x)
{
	for (int i = 0; x->g && i < x->n; i++) {
		for (int k = 0; k < x->s->lay.nodes && x->g[i].local; k++)
			free(x->g[i].local[k]);
		free(x->g[i].area);
		free(x->g[i].local);
		free(x->g[i].n_local);
	}
	free(x->g);
	free(x->served);
	free(x);
}

static int lb_start(struct sup *s, struct dps_xlink **out, char *err, size_t errlen)
{
	const struct dps_layout *l = &s->lay;
	struct dps_xlink *x = calloc(1, sizeof(*x));
	int rc;

	if (!x)
		return -ENOMEM;
	x->s = s;
	x->bell = &s->ctls[0]->xbell;
	for (int i = 0; i < l->n_comms; i++)
		x->n += l->comms[i].cross;
	x->g = calloc((size_t)x->n ? (size_t)x->n : 1, sizeof(*x->g));
	x->served = calloc((size_t)l->world, sizeof(*x->served));
	if (!x->g || !x->served)
		goto nomem;
	for (int i = 0, j = 0; i < l->n_comms; i++) {
		const struct dps_layout_comm *lc = &l->comms[i];
		struct lb_group *g;

		if (!lc->cross)
			continue;
		g = &x->g[j++];
		g->n = lc->n;
		g->ranks = lc->ranks;
		g->area = calloc((size_t)l->nodes, sizeof(*g->area));
		g->local = calloc((size_t)l->nodes, sizeof(*g->local));
		g->n_local = calloc((size_t)l->nodes, sizeof(*g->n_local));
		if (!g->area || !g->local || !g->n_local)
			goto nomem;
		for (int m = 0; m < lc->n; m++) {
			const int k = dps_layout_node_of(l, lc->ranks[m]);

			if (!g->local[k]) {
				g->local[k] = malloc(sizeof(int) * (size_t)lc->n);
				if (!g->local[k])
					goto nomem;
				g->area[k] = (struct dps_xarea *)(void *)((char *)s->segs[k].base +
									  lc->off);
			}
			g->local[k][g->n_local[k]++] = m;
		}
	}
	rc = pthread_create(&x->th, NULL, lb_main, x);
	if (rc) {
		snprintf(err, errlen, "cannot start the exchange between nodes: %s", strerror(rc));
		lb_free(x);
		return -rc;
	}
	x->started = 1;
	*out = x;
	return 0;
nomem:
	lb_free(x);
	return -ENOMEM;
}

static void lb_stop(struct dps_xlink *x, int status)
{
	(void)status;
	atomic_store(&x->stop, 1);
	dps_bell_ring(x->bell);
	if (x->started)
		pthread_join(x->th, NULL);
	lb_free(x);
}

/* One supervisor hosts every rank: no messages, failures or ends to carry. */
static int lb_none(struct dps_xlink *x, int r, const void *msg, size_t len)
{
	(void)x, (void)r, (void)msg, (void)len;
	return -ESRCH;
}

static void lb_fail(struct dps_xlink *x, int r, const char *why)
{
	(void)x, (void)r, (void)why;
}

static int lb_next(struct dps_xlink *x, struct dps_xevent *ev)
{
	(void)x, (void)ev;
	return -EAGAIN;
}

static int lb_lost(struct dps_xlink *x, unsigned ms)
{
	(void)x, (void)ms;
	return -1;
}

static int lb_beat(struct dps_xlink *x, int r, uint64_t *work, uint64_t *alive, uint32_t *busy)
{
	(void)x, (void)r, (void)work, (void)alive, (void)busy;
	return -ENOENT;
}

static void lb_kill(struct dps_xlink *x, int r)
{
	(void)x, (void)r;
}

const struct dps_xlink_ops dps_xlink_loopback = {
	"loopback", lb_start, lb_none, lb_none, lb_fail, lb_next, lb_lost, lb_beat, lb_kill,
	lb_stop
};

/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/xnode.c - the exchange between nodes over MPI (xlink.h), under mpirun: one
 * dpshard process per node, its supervisor. Built when configure finds Open MPI.
 *
 * One thread of the process makes every MPI call (MPI_THREAD_FUNNELED): it initialises MPI
 * after the first run's ranks are forked (no rank ever holds MPI state) and lives until the
 * process exits. During a run it is the node's proxy:
 *  - for each group that crosses nodes, one MPI communicator of the nodes holding members,
 *    and a round (shm/coll_x.h) as two non-blocking all-gathers: the pieces' lengths, then
 *    the pieces, put back in group order on every node. Several groups progress at once
 *    (a node's members may be in one group's call while another node's are in another's);
 *  - messages between node 0's supervisor, which runs the caller's logic for every rank,
 *    and the ranks elsewhere: down (node 0 to a rank's ring on its node) and up (a rank's
 *    message to node 0), failures (a node tells every other), and each node's end.
 * Every message carries the run's number: one a node sent in an earlier run is dropped.
 */
#include <errno.h>
#include <stddef.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/runtime/xnode_int.h"

struct dps_xmpi M = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER };

static int mpi_err(int rc, const char *what)
{
	char msg[MPI_MAX_ERROR_STRING];
	int len = 0;

	MPI_Error_string(rc, msg, &len);
	dps_error("between nodes: %s: %.*s", what, len, msg);
	return -EIO;
}

/* ---- set-up and tear-down of a run (MPI thread) ---------------------------------------------- */

static void group_free(struct xgroup *g)
{
	if (g->comm != MPI_COMM_NULL)
		MPI_Comm_free(&g->comm);
	free(g->local);
	free(g->node_cnt);
	free(g->order);
	free(g->cnt);
	free(g->disp);
	free(g->head_send);
	free(g->head_recv);
	free(g->lens);
	free(g->send);
	free(g->recv);
}

static int group_setup(struct dps_xlink *x, struct xgroup *g, const struct dps_layout_comm *lc)
{
	const struct dps_layout *l = &x->s->lay;
	const int node = x->s->node;
	int *of = calloc((size_t)l->nodes, sizeof(int)), has, k, rc;
	size_t piece;

	g->comm = MPI_COMM_NULL;
	if (!of)
		return -ENOMEM;
	for (int m = 0; m < lc->n; m++)
		of[dps_layout_node_of(l, lc->ranks[m])]++;
	has = of[node] > 0;
	/* every node calls, in layout order: the nodes without members get no communicator */
	rc = MPI_Comm_split(x->ctl, has ? 0 : MPI_UNDEFINED, node, &g->comm);
	if (rc != MPI_SUCCESS) {
		free(of);
		return mpi_err(rc, "cannot make a group's communicator");
	}
	if (!has) {
		free(of);
		return 0;
	}
	MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
	g->n = lc->n;
	g->area = (struct dps_xarea *)(void *)((char *)x->s->segs[node].base + lc->off);
	piece = g->area->piece;
	g->local = malloc(sizeof(int) * (size_t)lc->n);
	g->order = malloc(sizeof(int) * (size_t)lc->n);
	g->node_cnt = calloc((size_t)l->nodes, sizeof(int));
	g->cnt = calloc((size_t)l->nodes, sizeof(int));
	g->disp = calloc((size_t)l->nodes, sizeof(int));
	g->inl = XINL_MIN;
	g->head_send = malloc((8 + XINL_MAX) * (size_t)of[node]);
	g->head_recv = malloc((8 + XINL_MAX) * (size_t)lc->n);
	g->lens = malloc(sizeof(uint64_t) * (size_t)lc->n);
	g->send = malloc(piece * (size_t)of[node]);
	g->recv = malloc(piece * (size_t)lc->n);
	if (!g->local || !g->order || !g->node_cnt || !g->cnt || !g->disp || !g->head_send ||
	    !g->head_recv || (8 + XINL_MAX) * (size_t)lc->n > INT_MAX ||
	    !g->lens || !g->send || !g->recv || piece * (size_t)lc->n > INT_MAX) {
		free(of);
		return -ENOMEM;
	}
	for (k = 0; k < l->nodes; k++)
		if (of[k]) {
			if (k == node)
				g->me_node = g->n_nodes;
			g->node_cnt[g->n_nodes++] = of[k];
		}
	/* members node by node (in node order), each node's in group order: MPI's order */
	for (k = 0, rc = 0; k < l->nodes; k++)
		for (int m = 0; m < lc->n; m++)
			if (dps_layout_node_of(l, lc->ranks[m]) == k) {
				g->order[rc++] = m;
				if (k == node)
					g->local[g->n_local++] = m;
			}
	free(of);
	return 0;
}

/* What every node must agree on: the layout and the sizes its areas were built with. */
static uint64_t layout_hash(const struct sup *s)
{
	const struct dps_layout *l = &s->lay;
	uint64_t h = 0xcbf29ce484222325ull;
	/* (not the prefill ranks' KV share size: it follows each machine's free memory, and a
	 * fetch's ranges are checked against it on both nodes) */
	const uint64_t v[] = { (uint64_t)l->world, (uint64_t)l->nodes, l->slot_bytes,
			       l->window_bytes, l->total, (uint64_t)l->n_comms, l->fetch_off };

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		h = (h ^ v[i]) * 0x100000001b3ull;
	for (int i = 0; i < l->n_comms; i++) {
		h = (h ^ l->comms[i].off) * 0x100000001b3ull;
		h = (h ^ (uint64_t)l->comms[i].n) * 0x100000001b3ull;
	}
	return h;
}

static int run_setup(struct dps_xlink *x, char *err, size_t errlen)
{
	const struct dps_layout *l = &x->s->lay;
	uint64_t mine = layout_hash(x->s), lo, hi;
	int rc;

	rc = MPI_Comm_dup(MPI_COMM_WORLD, &x->ctl);
	if (rc != MPI_SUCCESS)
		return mpi_err(rc, "cannot make the run's communicator");
	MPI_Comm_set_errhandler(x->ctl, MPI_ERRORS_RETURN);
	/* A node started with other options (--slot-bytes, a --config file) would place the
	 * rounds' bytes elsewhere: refused, on every node. */
	if (MPI_Allreduce(&mine, &lo, 1, MPI_UINT64_T, MPI_MIN, x->ctl) != MPI_SUCCESS ||
	    MPI_Allreduce(&mine, &hi, 1, MPI_UINT64_T, MPI_MAX, x->ctl) != MPI_SUCCESS)
		return mpi_err(MPI_ERR_OTHER, "cannot compare the nodes' layouts");
	if (lo != hi) {
		snprintf(err, errlen, "the nodes were started with different layouts or options "
			 "(every node must run the same command line)");
		return -DPS_ECONFIG;
	}
	x->heard = calloc((size_t)l->nodes, sizeof(*x->heard));
	x->shadow = calloc((size_t)l->world, sizeof(*x->shadow));
	x->fserved = calloc((size_t)l->world, sizeof(*x->fserved));
	x->blocked = calloc((size_t)l->world, 1);
	if (!x->blocked)
		return -ENOMEM;
	x->fwait = calloc((size_t)l->world, sizeof(*x->fwait));
	if (!x->fserved || !x->fwait)
		return -ENOMEM;
	x->known = calloc((size_t)l->world, 1);
	if (!x->heard || !x->shadow || !x->known)
		return -ENOMEM;
	for (int k = 1; k < l->nodes; k++)
		atomic_store(&x->heard[k], dps_now_ns());
	for (int i = 0; i < l->n_comms; i++)
		x->n_groups += l->comms[i].cross;
	x->g = calloc((size_t)x->n_groups + 1, sizeof(*x->g));
	if (!x->g)
		return -ENOMEM;
	for (int i = 0; i < x->n_groups; i++)
		x->g[i].comm = MPI_COMM_NULL;
	for (int i = 0, j = 0; i < l->n_comms; i++)
		if (l->comms[i].cross) {
			rc = group_setup(x, &x->g[j++], &l->comms[i]);
			if (rc)
				return rc;
		}
	return 0;
}

static void free_list(struct qmsg *m)
{
	while (m) {
		struct qmsg *next = m->next;

		free(m);
		m = next;
	}
}

void dps_xmpi_run_free(struct dps_xlink *x)
{
	for (int i = 0; x->g && i < x->n_groups; i++) {
		if (x->g[i].phase > 0) {
			/* A round still in flight (the run failed): MPI may yet write into its
			 * buffers, and its request cannot be freed. They are left as they are, and
			 * this process starts no other run between nodes. */
			M.poisoned = 1;
			continue;
		}
		group_free(&x->g[i]);
	}
	free(x->g);
	free(x->heard);
	free(x->shadow);
	free(x->known);
	free(x->fserved);
	free(x->blocked);
	x->blocked = NULL;
	free(x->fwait);
	x->fserved = x->fwait = NULL;
	x->heard = NULL;
	x->shadow = NULL;
	x->known = NULL;
	free_list(x->out);
	free_list(x->in);
	free_list(x->held);
	/* Sends still in flight (node 0's downs to nodes whose ranks are gone) keep their
	 * buffers: MPI may still read them. */
	for (struct qmsg *m = x->sent, *next; m; m = next) {
		next = m->next;
		MPI_Request_free(&m->req);
	}
	x->out = x->in = x->held = x->sent = NULL;
	if (x->ctl != MPI_COMM_NULL)
		MPI_Comm_free(&x->ctl);
}

/* ---- rounds (MPI thread) --------------------------------------------------------------------- */

/* The round is complete: every member's piece into the area in group order, published. */
static void group_publish(struct xgroup *g, int second)
{
	const size_t slot = 8 + g->inl;
	size_t at = 0;

	for (int i = 0; i < g->n; i++) {
		const int m = g->order[i];
		const size_t len = (size_t)(g->lens[i] & ~DPS_X_MORE);
		const size_t head = len < g->inl ? len : g->inl;
		unsigned char *out = dps_xarea_out(g->area, m);

		memcpy(out, g->head_recv + (size_t)i * slot + 8, head);
		if (second && len > head) {
			memcpy(out + head, g->recv + at, len - head);
			at += len - head;
		}
		g->area->m[m].out_len = g->lens[i];
	}
	g->done++;
	g->phase = 0;
	dps_wword_publish(&g->area->done, g->done);
}

static void wake_main(struct dps_xlink *x);

/* A group's round failed (reported): the run fails as a rank's failure would. */
static void group_failed(struct dps_xlink *x)
{
	const char why[] = "a collective between the nodes failed (see the error above)";
	struct qmsg *m = dps_xmpi_msg(T_FAIL, 0, x->run, x->s->lo, x->s->node, 0, why, sizeof(why));

	atomic_store(&M.failed, 1);
	if (!m)
		return;
	pthread_mutex_lock(&M.mu);
	dps_xmpi_push(&x->in, &x->in_tail, m);
	pthread_mutex_unlock(&M.mu);
	wake_main(x);
}

/* Advances one group's round; 1 when something moved, -1 on an error. */
static int group_step(struct dps_xlink *x, struct xgroup *g)
{
	const size_t piece = g->area ? g->area->piece : 0;
	const size_t slot = 8 + g->inl;
	int flag = 0, rc;

	(void)x;
	if (g->comm == MPI_COMM_NULL)
		return 0;
	if (g->phase == 0) {
		if (!dps_xarea_ready(g->area, g->local, g->n_local, g->done + 1))
			return 0;
		/* each member's length and the first inl bytes of its piece */
		for (int i = 0; i < g->n_local; i++) {
			const uint64_t l = g->area->m[g->local[i]].len;
			const size_t len = (size_t)(l & ~DPS_X_MORE);
			unsigned char *h = g->head_send + (size_t)i * slot;

			memcpy(h, &l, 8);
			memcpy(h + 8, dps_xarea_in(g->area, g->local[i]), len < g->inl ? len : g->inl);
		}
		for (int k = 0, at = 0; k < g->n_nodes; k++) {
			g->cnt[k] = g->node_cnt[k] * (int)slot;
			g->disp[k] = at;
			at += g->cnt[k];
		}
		rc = MPI_Iallgatherv(g->head_send, g->n_local * (int)slot, MPI_BYTE, g->head_recv,
				     g->cnt, g->disp, MPI_BYTE, g->comm, &g->req);
		if (rc != MPI_SUCCESS)
			return mpi_err(rc, "a round between nodes"), -1;
		g->phase = 1;
		return 1;
	}
	rc = MPI_Test(&g->req, &flag, MPI_STATUS_IGNORE);
	if (rc != MPI_SUCCESS)
		return mpi_err(rc, "a round between nodes"), -1;
	if (!flag)
		return 0;
	if (g->phase == 1) {
		size_t at = 0, mine = 0, longest = 0;
		int i = 0;

		/* the lengths, and what is left of the longer pieces, node by node */
		for (int k = 0; k < g->n_nodes; k++) {
			size_t b = 0;

			for (int j = 0; j < g->node_cnt[k]; j++, i++) {
				size_t len;

				memcpy(&g->lens[i], g->head_recv + (size_t)i * slot, 8);
				len = (size_t)(g->lens[i] & ~DPS_X_MORE);
				if (len > piece)
					return dps_error("between nodes: a piece of %zu bytes", len), -1;
				longest = len > longest ? len : longest;
				b += len > g->inl ? len - g->inl : 0;
			}
			g->cnt[k] = (int)b;
			g->disp[k] = (int)at;
			at += b;
		}
		if (!at) {
			group_publish(g, 0);
		} else {
			for (i = 0; i < g->n_local; i++) {
				const size_t len = (size_t)(g->area->m[g->local[i]].len & ~DPS_X_MORE);

				if (len > g->inl) {
					memcpy(g->send + mine,
					       dps_xarea_in(g->area, g->local[i]) + g->inl,
					       len - g->inl);
					mine += len - g->inl;
				}
			}
			rc = MPI_Iallgatherv(g->send, (int)mine, MPI_BYTE, g->recv, g->cnt, g->disp,
					     MPI_BYTE, g->comm, &g->req);
			if (rc != MPI_SUCCESS)
				return mpi_err(rc, "a round between nodes"), -1;
			g->phase = 2;
		}
		/* every node saw the same lengths: the same inl next round everywhere */
		longest = (longest + 7) / 8 * 8;
		g->next_inl = longest < XINL_MIN ? XINL_MIN : longest > XINL_MAX ? XINL_MAX : longest;
		if (!g->phase)
			g->inl = g->next_inl;
		return 1;
	}
	group_publish(g, 1);
	g->inl = g->next_inl;
	return 1;
}

/* ---- messages (MPI thread) ------------------------------------------------------------------- */

struct qmsg *dps_xmpi_msg(int tag, int dest, uint32_t run, int rank, int node, int status,
			     const void *data, size_t len)
{
	struct qmsg *m = malloc(sizeof(*m) + sizeof(struct wire) + len);
	const struct wire w = { run, rank, node, status };

	if (!m)
		return NULL;
	m->next = NULL;
	m->tag = tag;
	m->dest = dest;
	m->len = sizeof(w) + len;
	memcpy(m->buf, &w, sizeof(w));
	if (len && data) /* (NULL: the caller fills it) */
		memcpy(m->buf + sizeof(w), data, len);
	return m;
}

void dps_xmpi_push(struct qmsg **head, struct qmsg **tail, struct qmsg *m)
{
	m->next = NULL;
	if (*tail)
		(*tail)->next = m;
	else
		*head = m;
	*tail = m;
}

/* A down message into its rank's ring; 0, or -EAGAIN when the ring is full. */
static int deliver_down(struct dps_xlink *x, struct qmsg *m)
{
	struct wire w;
	int rc;

	memcpy(&w, m->buf, sizeof(w));
	if (!sup_hosts(x->s, w.rank))
		return 0;
	rc = dps_ring_push(&x->s->from_sup[w.rank], m->buf + sizeof(w), m->len - sizeof(w), 1);
	if (rc && rc != -ETIMEDOUT)
		dps_warn("a message for rank %d from node 0 was dropped: %s", w.rank,
			 dps_strerror(rc));
	return rc == -ETIMEDOUT ? -EAGAIN : 0;
}

/* Wakes the supervisor's loop: an event waits. */
static void wake_main(struct dps_xlink *x)
{
	const uint64_t one = 1;

	if (write(x->s->evfd, &one, sizeof(one)) < 0) {
		/* the counter is full: the loop is awake anyway */
	}
}

int dps_xmpi_lost(struct dps_xlink *x, uint64_t ns)
{
	const uint64_t now = dps_now_ns();

	for (int k = 1; x->heard && k < x->s->lay.nodes; k++) {
		const uint64_t t = atomic_load(&x->heard[k]);

		if (t && now > t && now - t > ns)
			return k;
	}
	return -1;
}

void dps_xmpi_send(struct dps_xlink *x, struct qmsg *m)
{
	if (MPI_Isend(m->buf, (int)m->len, MPI_BYTE, m->dest, m->tag, x->ctl, &m->req) !=
	    MPI_SUCCESS) {
		free(m);
		return;
	}
	m->next = x->sent;
	x->sent = m;
}

static int messages_step(struct dps_xlink *x)
{
	struct qmsg *m, **pp;
	MPI_Status st;
	int flag, moved = 0, rc;

	/* downs held back by a full ring: each rank's in order, a full ring holding back only
	 * its own rank's */
	if (x->held) {
		for (int r = 0; r < x->s->lay.world; r++)
			x->blocked[r] = 0;
		for (pp = &x->held; (m = *pp);) {
			struct wire w;

			memcpy(&w, m->buf, sizeof(w));
			if (x->blocked[w.rank] || deliver_down(x, m)) {
				x->blocked[w.rank] = 1;
				pp = &m->next;
				continue;
			}
			*pp = m->next;
			free(m);
			moved = 1;
		}
	}
	/* sends the main thread queued */
	pthread_mutex_lock(&M.mu);
	m = x->out;
	x->out = x->out_tail = NULL;
	pthread_mutex_unlock(&M.mu);
	while (m) {
		struct qmsg *next = m->next;

		rc = MPI_Isend(m->buf, (int)m->len, MPI_BYTE, m->dest, m->tag, x->ctl, &m->req);
		if (rc != MPI_SUCCESS) {
			mpi_err(rc, "a message to another node");
			free(m);
		} else {
			m->next = x->sent;
			x->sent = m;
		}
		m = next;
		moved = 1;
	}
	for (pp = &x->sent; *pp;) {
		m = *pp;
		if (MPI_Test(&m->req, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag) {
			pp = &m->next;
			continue;
		}
		*pp = m->next;
		free(m);
	}
	/* what came in */
	for (;;) {
		struct wire w;
		int count;

		rc = MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, x->ctl, &flag, &st);
		if (rc != MPI_SUCCESS || !flag)
			break;
		MPI_Get_count(&st, MPI_BYTE, &count);
		m = malloc(sizeof(*m) + (size_t)count);
		if (!m)
			break;
		rc = MPI_Recv(m->buf, count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, x->ctl,
			      MPI_STATUS_IGNORE);
		moved = 1;
		m->len = (size_t)count;
		m->tag = st.MPI_TAG;
		m->next = NULL;
		if (rc != MPI_SUCCESS || m->len < sizeof(w)) {
			if (rc != MPI_SUCCESS)
				mpi_err(rc, "a message from another node was lost");
			free(m);
			continue;
		}
		memcpy(&w, m->buf, sizeof(w));
		if (w.run != x->run || w.rank < 0 || w.rank >= x->s->lay.world) {
			free(m); /* an earlier run's */
			continue;
		}
		if (x->s->node == 0 && st.MPI_SOURCE > 0 && st.MPI_SOURCE < x->s->lay.nodes &&
		    atomic_load(&x->heard[st.MPI_SOURCE]))
			atomic_store(&x->heard[st.MPI_SOURCE], m->tag == T_DONE ? 0 : dps_now_ns());
		if (m->tag == T_READ || m->tag == T_DATA) {
			if (m->tag == T_READ)
				dps_xmpi_fetch_serve(x, m, st.MPI_SOURCE);
			else
				dps_xmpi_fetch_done(x, m);
			free(m);
			continue;
		}
		if (m->tag == T_BEAT) { /* the node's ranks' progress words */
			const size_t n = (m->len - sizeof(w)) / sizeof(x->shadow[0]);

			pthread_mutex_lock(&M.mu);
			for (size_t i = 0; x->shadow && i < n &&
					   (size_t)w.rank + i < (size_t)x->s->lay.world; i++) {
				memcpy(x->shadow[w.rank + (int)i],
				       m->buf + sizeof(w) + i * sizeof(x->shadow[0]),
				       sizeof(x->shadow[0]));
				x->known[w.rank + (int)i] = 1;
			}
			pthread_mutex_unlock(&M.mu);
			free(m);
			continue;
		}
		if (m->tag == T_DOWN) {
			int waiting = 0; /* (after the ones its rank already waits with) */

			for (struct qmsg *h = x->held; h && !waiting; h = h->next)
				waiting = !memcmp(h->buf + offsetof(struct wire, rank), &w.rank,
						  sizeof(w.rank));
			if (waiting || deliver_down(x, m)) {
				struct qmsg **t = &x->held;

				while (*t)
					t = &(*t)->next;
				*t = m;
			} else {
				free(m);
			}
			continue;
		}
		if (m->tag == T_FAIL) /* this node's ranks stop now, whatever its main thread does */
			for (int k = 0; k < x->s->lay.nodes; k++)
				if (x->s->ctls[k])
					dps_abort_raise(&x->s->ctls[k]->abort);
		pthread_mutex_lock(&M.mu);
		dps_xmpi_push(&x->in, &x->in_tail, m);
		pthread_mutex_unlock(&M.mu);
		wake_main(x);
	}
	/* another node: "still here", to node 0 */
	if (x->s->node > 0 && dps_now_ns() - x->beat_ns > BEAT_NS && !x->stop_ns) {
		const int n = x->s->hi - x->s->lo;
		uint64_t words[n > 0 ? n : 1][3];

		for (int i = 0; i < n; i++) {
			const struct dps_beat *b = &x->s->ctls[x->s->node]->beat[x->s->lo + i];

			words[i][0] = atomic_load_explicit(&b->work, memory_order_relaxed);
			words[i][1] = atomic_load_explicit(&b->count, memory_order_relaxed);
			words[i][2] = atomic_load_explicit(&b->busy, memory_order_relaxed);
		}
		m = dps_xmpi_msg(T_BEAT, 0, x->run, x->s->lo, x->s->node, 0, words,
			     sizeof(words[0]) * (size_t)n);
		x->beat_ns = dps_now_ns();
		if (m && MPI_Isend(m->buf, (int)m->len, MPI_BYTE, 0, T_BEAT, x->ctl, &m->req) ==
				 MPI_SUCCESS) {
			m->next = x->sent;
			x->sent = m;
		} else {
			free(m);
		}
	}
	/* node 0: a node silent for too long has failed (its supervisor died or hangs) */
	if (x->s->node == 0 && !x->lost_told) {
		const int k = dps_xmpi_lost(x, LOST_NS);

		if (k > 0) {
			char why[160];

			x->lost_told = 1;
			snprintf(why, sizeof(why), "node %d has not been heard from for %.1f s: its "
				 "supervisor died or hangs", k, (double)LOST_NS / 1e9);
			m = dps_xmpi_msg(T_FAIL, 0, x->run, k * (x->s->lay.world / x->s->lay.nodes), k, 0,
				     why, strlen(why) + 1);
			if (m) {
				m->tag = T_FAIL;
				pthread_mutex_lock(&M.mu);
				dps_xmpi_push(&x->in, &x->in_tail, m);
				pthread_mutex_unlock(&M.mu);
				wake_main(x);
			}
		}
	}
	return moved;
}

/* ---- the MPI thread ---------------------------------------------------------------------------- */

static int mpi_init(char *err, size_t errlen)
{
	int provided, rc;

	rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
	if (rc != MPI_SUCCESS) {
		snprintf(err, errlen, "MPI_Init_thread failed (%d)", rc);
		return -EIO;
	}
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	M.inited = 1;
	return 0;
}

void *dps_xmpi_main(void *arg)
{
	uint64_t idle_since = 0, rung;
	/* this thread's waits (the bell) sleep at once: the ranks need the cores */
	const struct dps_wait_policy sleepy = { 0, 0 };

	dps_wait_set_policy(&sleepy);

	(void)arg;
	pthread_mutex_lock(&M.mu);
	for (;;) {
		struct dps_xlink *x = M.run;
		int moved = 0, busy = 0;

		if (M.cmd == 1) { /* start a run */
			M.cmd_rc = M.inited ? 0 : mpi_init(M.cmd_err, M.cmd_errlen);
			if (!M.cmd_rc) {
				pthread_mutex_unlock(&M.mu);
				M.cmd_rc = run_setup(x, M.cmd_err, M.cmd_errlen);
				pthread_mutex_lock(&M.mu);
				if (M.cmd_rc && !M.cmd_err[0])
					snprintf(M.cmd_err, M.cmd_errlen, "cannot connect the nodes: %s",
						 dps_strerror(M.cmd_rc));
			}
			if (M.cmd_rc) { /* (here: the MPI calls of the clean-up are this thread's) */
				if (M.inited)
					dps_xmpi_run_free(x);
				M.run = NULL;
				atomic_store(&M.failed, 1);
			}
			M.cmd = 0;
			pthread_cond_broadcast(&M.cv);
			continue;
		}
		if (M.cmd == 3) {
			if (M.inited && !M.failed)
				MPI_Finalize();
			M.cmd = 0;
			pthread_cond_broadcast(&M.cv);
			break;
		}
		if (!x) {
			pthread_cond_wait(&M.cv, &M.mu);
			continue;
		}
		pthread_mutex_unlock(&M.mu);
		/* (read before looking: a post after it wakes the sleep below) */
		rung = atomic_load(&x->s->ctls[x->s->node]->xbell.val);
		for (int i = 0; i < x->n_groups; i++) {
			const int r = x->g[i].phase < 0 ? 0 : group_step(x, &x->g[i]);

			if (r < 0) { /* this group is done for: the run fails, every node told */
				x->g[i].phase = -1;
				group_failed(x);
			}
			moved |= r > 0;
			busy |= x->g[i].phase > 0;
		}
		moved |= messages_step(x);
		moved |= dps_xmpi_fetch_step(x);
		for (int r = x->s->lo; r < x->s->hi && x->fwait; r++)
			busy |= x->fwait[r] != 0;
		busy |= x->sent != NULL;
		pthread_mutex_lock(&M.mu);
		if (M.cmd == 2) { /* the run ends: its last messages go first */
			/* another node waits for this one's end: at most 10 s */
			if (x->out || (x->sent && x->s->node > 0 &&
				       dps_now_ns() - x->stop_ns < 10000000000ull)) {
				pthread_mutex_unlock(&M.mu);
				sched_yield();
				pthread_mutex_lock(&M.mu);
				continue;
			}
			pthread_mutex_unlock(&M.mu);
			dps_xmpi_run_free(x);
			pthread_mutex_lock(&M.mu);
			M.run = NULL;
			M.cmd = 0;
			pthread_cond_broadcast(&M.cv);
			continue;
		}
		pthread_mutex_unlock(&M.mu);
		if (moved) {
			idle_since = dps_now_ns();
		} else if (dps_now_ns() - idle_since < (busy ? 2000000u : 200000u)) {
			sched_yield(); /* a round in flight: its end comes soon */
		} else {
			/* Members ring the bell when they post; messages from other nodes have no
			 * descriptor to wake us, so the sleep is short. */
			(void)dps_wword_wait(&x->s->ctls[x->s->node]->xbell, rung + 1, NULL,
					     busy ? 100000ull : 1000000ull, NULL);
		}
		pthread_mutex_lock(&M.mu);
	}
	pthread_mutex_unlock(&M.mu);
	return NULL;
}

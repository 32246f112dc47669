/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/xnode_link.c - the supervisor's side of the MPI exchange (xlink.h): it hands
 * each run to the MPI thread of xnode.c and back, queues the messages that thread sends, and
 * takes the events it receives.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/xnode_int.h"

/* Runs command cmd on the MPI thread and waits for it. */
static int mpi_cmd(int cmd, char *err, size_t errlen)
{
	pthread_mutex_lock(&M.mu);
	M.cmd = cmd;
	M.cmd_err = err;
	M.cmd_errlen = errlen;
	pthread_cond_broadcast(&M.cv);
	while (M.cmd)
		pthread_cond_wait(&M.cv, &M.mu);
	pthread_mutex_unlock(&M.mu);
	return M.cmd_rc;
}

static void mpi_atexit(void)
{
	char err[8];

	if (M.up) {
		mpi_cmd(3, err, sizeof(err));
		pthread_join(M.th, NULL);
		M.up = 0;
	}
}

/* ---- the supervisor's side (main thread) ------------------------------------------------------- */

static int x_start(struct sup *s, struct dps_xlink **out, char *err, size_t errlen)
{
	struct dps_xlink *x = calloc(1, sizeof(*x));
	int rc;

	if (!x)
		return -ENOMEM;
	x->s = s;
	x->ctl = MPI_COMM_NULL;
	err[0] = '\0';
	if (!M.up) {
		rc = pthread_create(&M.th, NULL, dps_xmpi_main, NULL);
		if (rc) {
			free(x);
			snprintf(err, errlen, "cannot start the MPI thread: %s", strerror(rc));
			return -rc;
		}
		M.up = 1;
		atexit(mpi_atexit);
	}
	if (M.poisoned) {
		free(x);
		snprintf(err, errlen, "an earlier run between the nodes ended with a round in flight: "
			 "start the job again");
		return -EIO;
	}
	/* the run and the command together: the thread never sees one without the other */
	pthread_mutex_lock(&M.mu);
	x->run = ++M.runs;
	M.run = x;
	M.cmd = 1;
	M.cmd_err = err;
	M.cmd_errlen = errlen;
	pthread_cond_broadcast(&M.cv);
	while (M.cmd)
		pthread_cond_wait(&M.cv, &M.mu);
	rc = M.cmd_rc;
	pthread_mutex_unlock(&M.mu);
	if (rc) { /* (the MPI thread freed what the run had made) */
		free(x);
		return rc;
	}
	*out = x;
	return 0;
}

static int x_send(struct dps_xlink *x, int tag, int dest, int rank, int status, const void *msg,
		  size_t len)
{
	struct qmsg *m = dps_xmpi_msg(tag, dest, x->run, rank, x->s->node, status, msg, len);

	if (!m)
		return -ENOMEM;
	pthread_mutex_lock(&M.mu);
	dps_xmpi_push(&x->out, &x->out_tail, m);
	pthread_mutex_unlock(&M.mu);
	dps_bell_ring(&x->s->ctls[x->s->node]->xbell);
	return 0;
}

static int x_down(struct dps_xlink *x, int r, const void *msg, size_t len)
{
	return x_send(x, T_DOWN, dps_layout_node_of(&x->s->lay, r), r, 0, msg, len);
}

static int x_up(struct dps_xlink *x, int r, const void *msg, size_t len)
{
	return x_send(x, T_UP, 0, r, 0, msg, len);
}

static void x_fail(struct dps_xlink *x, int r, const char *why)
{
	for (int k = 0; k < x->s->lay.nodes; k++)
		if (k != x->s->node)
			x_send(x, T_FAIL, k, r, 0, why, strlen(why) + 1);
}

static int x_next(struct dps_xlink *x, struct dps_xevent *ev)
{
	struct qmsg *m;
	struct wire w;

	pthread_mutex_lock(&M.mu);
	m = x->in;
	if (m) {
		x->in = m->next;
		if (!x->in)
			x->in_tail = NULL;
	}
	pthread_mutex_unlock(&M.mu);
	if (!m)
		return -EAGAIN;
	memcpy(&w, m->buf, sizeof(w));
	ev->kind = m->tag == T_UP ? DPS_XEV_MSG : m->tag == T_FAIL ? DPS_XEV_FAIL :
		   m->tag == T_KILL ? DPS_XEV_KILL : DPS_XEV_DONE;
	ev->rank = w.rank;
	ev->node = w.node;
	ev->status = w.status;
	ev->len = m->len - sizeof(w);
	/* the payload, moved to its own block so that the taker frees it alone */
	ev->data = malloc(ev->len + 1);
	if (ev->data) {
		memcpy(ev->data, m->buf + sizeof(w), ev->len);
		ev->data[ev->len] = '\0';
	}
	free(m);
	return 0;
}

static void x_stop(struct dps_xlink *x, int status)
{
	char err[8];

	pthread_mutex_lock(&M.mu);
	x->stop_ns = dps_now_ns();
	pthread_mutex_unlock(&M.mu);
	if (x->s->node > 0)
		x_send(x, T_DONE, 0, x->s->lo, status, NULL, 0);
	if (status)
		atomic_store(&M.failed, 1); /* no MPI_Finalize: mpirun ends the job on our
					     * non-zero exit */
	mpi_cmd(2, err, sizeof(err));
	free(x);
}

static int x_lost(struct dps_xlink *x, unsigned ms)
{
	return dps_xmpi_lost(x, (uint64_t)ms * 1000000ull);
}

static int x_beat(struct dps_xlink *x, int r, uint64_t *work, uint64_t *alive, uint32_t *busy)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&M.mu);
	if (x->known && x->known[r]) {
		*work = x->shadow[r][0];
		*alive = x->shadow[r][1];
		*busy = (uint32_t)x->shadow[r][2];
		rc = 0;
	}
	pthread_mutex_unlock(&M.mu);
	return rc;
}

static void x_kill(struct dps_xlink *x, int r)
{
	x_send(x, T_KILL, dps_layout_node_of(&x->s->lay, r), r, 0, NULL, 0);
}

static const struct dps_xlink_ops mpi_ops = {
	"mpi", x_start, x_down, x_up, x_fail, x_next, x_lost, x_beat, x_kill, x_stop
};

void dps_xlink_mpi_register(void)
{
	dps_xlink_mpi = &mpi_ops;
}

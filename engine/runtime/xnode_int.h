/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/xnode_int.h - what the two halves of the MPI exchange share: the MPI thread
 * (xnode.c) and the supervisor's side of it (xnode_link.c). Private to them.
 */
#ifndef DPS_ENGINE_XNODE_INT_H
#define DPS_ENGINE_XNODE_INT_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "engine/runtime/sup_int.h"
#include "engine/runtime/xlink.h"
#include "shm/coll_x.h"

enum { T_DOWN = 1, T_UP, T_FAIL, T_DONE, T_BEAT, T_KILL, T_READ, T_DATA };

/* Another node's supervisor says it is there this often; node 0 gives up on one after: */
#define BEAT_NS 100000000ull
#define LOST_NS 3000000000ull

struct wire {          /* every message's head */
	uint32_t run;
	int32_t rank, node, status;
};

struct qmsg {
	struct qmsg *next;
	int tag, dest;
	MPI_Request req;
	size_t len;        /* bytes of buf: a wire head, then the payload */
	unsigned char buf[];
};

struct xgroup {
	MPI_Comm comm;     /* the nodes holding members, in node order */
	struct dps_xarea *area;
	int n, n_nodes, me_node;
	int *local, n_local;        /* this node's members, group order */
	int *node_cnt;              /* (n_nodes) members per node */
	int *order;                 /* (n) members node by node, each node's in group order */
	int *cnt, *disp;            /* (n_nodes) MPI counts and displacements */
	uint64_t done;
	int phase;                  /* 0 idle, 1 heads in flight, 2 the rest in flight, -1
				     * failed (no more rounds) */
	MPI_Request req;
	/* A round's first exchange carries every member's length and its piece's first inl
	 * bytes; a second one only the rest of longer pieces. Every node sees every length, so
	 * every node sets the next round's inl alike: the longest piece of this round (within
	 * [XINL_MIN, XINL_MAX]). */
	size_t inl, next_inl;
	uint64_t *lens;             /* (n) this round's lengths, in MPI's order */
	unsigned char *head_send, *head_recv; /* (n_local / n, 8 + XINL_MAX) */
	unsigned char *send, *recv; /* (n_local / n, piece) */
};

#define XINL_MIN 56
#define XINL_MAX 65536

struct dps_xlink {
	struct sup *s;
	uint32_t run;
	MPI_Comm ctl;
	struct xgroup *g;
	int n_groups;
	struct qmsg *out, *out_tail;  /* to send (main thread -> MPI thread) */
	struct qmsg *sent;            /* sends in flight */
	struct qmsg *in, *in_tail;    /* events for the main thread */
	struct qmsg *held;            /* downs whose ring was full, to push again */
	uint64_t stop_ns;             /* when the run's end was asked */
	uint64_t beat_ns;             /* another node: when it last told node 0 it is there */
	_Atomic uint64_t *heard;      /* node 0: (nodes) when each node was last heard from, 0
				       * once it has ended */
	int lost_told;
	uint64_t (*shadow)[3];        /* node 0: (world) the other nodes' ranks' work, alive and
				       * busy words, as last sent (under M.mu) */
	unsigned char *known;         /* (world) whether a rank's words came */
	unsigned char *blocked;       /* (world) scratch: a rank whose ring is full */
	uint64_t *fserved, *fwait;    /* (world) each rank's last fetch served, and the one
				       * asked of another node (0: none) */
};

/* The MPI thread and its hand-over with the main thread. */
struct dps_xmpi {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t th;
	int up, inited;
	_Atomic int failed;          /* no MPI_Finalize at exit */
	int poisoned;                /* a run ended with a round in flight: no more runs */
	int cmd;                     /* 1 start, 2 stop, 3 quit */
	int cmd_rc;
	char *cmd_err;
	size_t cmd_errlen;
	struct dps_xlink *run;       /* the run in progress */
	uint32_t runs;
};

extern struct dps_xmpi M;

struct qmsg *dps_xmpi_msg(int tag, int dest, uint32_t run, int rank, int node, int status,
			  const void *data, size_t len);
void dps_xmpi_push(struct qmsg **head, struct qmsg **tail, struct qmsg *m);
/* The first node other than 0, still running, not heard from for more than ns; or -1. */
int dps_xmpi_lost(struct dps_xlink *x, uint64_t ns);
void dps_xmpi_run_free(struct dps_xlink *x);
/* Sends m (MPI_Isend; kept until it completes). */
void dps_xmpi_send(struct dps_xlink *x, struct qmsg *m);
/* xnode_fetch.c: this node's ranks' new fetches asked of other nodes (1 when one moved), a
 * fetch served here for another node's rank, and the answer to one of ours */
int dps_xmpi_fetch_step(struct dps_xlink *x);
void dps_xmpi_fetch_serve(struct dps_xlink *x, const struct qmsg *m, int src);
void dps_xmpi_fetch_done(struct dps_xlink *x, const struct qmsg *m);
/* The MPI thread's body (pthread_create). */
void *dps_xmpi_main(void *arg);

#endif

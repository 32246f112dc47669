/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/xlink.h - what a supervisor needs from the exchange between nodes
 * (docs/DESIGN.md, "Several nodes"). Two kinds exist: the loopback (sup_nodes.c), where one
 * supervisor hosts every node of `--nodes N` run without mpirun and moves the crossing groups'
 * rounds between its own segments, and MPI (xnode.c, under mpirun: one supervisor per node,
 * built when configure finds Open MPI), which also carries the messages between node 0's
 * supervisor, which runs the caller's logic for every rank, and the ranks on other nodes.
 */
#ifndef DPS_ENGINE_XLINK_H
#define DPS_ENGINE_XLINK_H

#include <stddef.h>
#include <stdint.h>

struct sup;
struct dps_xlink;

enum dps_xevent_kind {
	DPS_XEV_MSG,  /* node 0: a message of rank `rank` (on another node) */
	DPS_XEV_FAIL, /* rank `rank` on another node failed; data: the sentence */
	DPS_XEV_DONE, /* node `node` has no rank left; status: 0 when they all exited 0 */
	DPS_XEV_KILL, /* node 0 found this node's rank `rank` hung: kill it */
};

struct dps_xevent {
	enum dps_xevent_kind kind;
	int rank, node, status;
	size_t len;
	unsigned char *data; /* malloc'd, the taker frees it */
};

struct dps_xlink_ops {
	const char *name;
	/* Starts the exchange of one run (after the forks). 0, or a negative code with err. */
	int (*start)(struct sup *s, struct dps_xlink **out, char *err, size_t errlen);
	/* Node 0: a message for rank r on another node. 0 or -ENOMEM. */
	int (*down)(struct dps_xlink *x, int r, const void *msg, size_t len);
	/* Another node: a message of its rank r for node 0's caller. 0 or -ENOMEM. */
	int (*up)(struct dps_xlink *x, int r, const void *msg, size_t len);
	/* Rank r of this node failed as why says: every other node is told. */
	void (*fail)(struct dps_xlink *x, int r, const char *why);
	/* The supervisor's loop takes the next event: 0, or -EAGAIN when there is none. */
	int (*next)(struct dps_xlink *x, struct dps_xevent *ev);
	/* Node 0: the first other node not heard from for more than ms (its supervisor sends
	 * every 100 ms while its ranks run), or -1. */
	int (*lost)(struct dps_xlink *x, unsigned ms);
	/* Node 0: the progress words (struct dps_beat) of rank r on another node as its node last
	 * sent them (every 100 ms): 0, or -ENOENT when none came yet. */
	int (*beat)(struct dps_xlink *x, int r, uint64_t *work, uint64_t *alive, uint32_t *busy);
	/* Node 0: rank r on another node is hung; its node's supervisor kills it. */
	void (*kill)(struct dps_xlink *x, int r);
	/* This node's ranks have all exited (status 0 when cleanly): node 0 is told, and the
	 * run's exchange ends. */
	void (*stop)(struct dps_xlink *x, int status);
};

/* Under mpirun (Open MPI's environment): the MPI exchange, NULL when not built with it. */
extern const struct dps_xlink_ops *dps_xlink_mpi;
/* Called by main when built with Open MPI: sets dps_xlink_mpi. */
void dps_xlink_mpi_register(void);
/* One supervisor for every node. */
extern const struct dps_xlink_ops dps_xlink_loopback;

/*
 * Which node this process is for an instance of `nodes` nodes: under mpirun its MPI rank
 * (*node), else -1 (it hosts every node). Returns 0, or -DPS_ECONFIG with err (mpirun with
 * another number of processes, or the MPI exchange not built).
 */
int dps_xlink_identity(int nodes, int *node, const struct dps_xlink_ops **ops, char *err,
		       size_t errlen);

#endif

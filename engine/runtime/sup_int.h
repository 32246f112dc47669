/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/sup_int.h - the supervisor's state (supervisor.c), shared with its other
 * files: the progress check (sup_hang.c) and the nodes (sup_nodes.c). Private to them.
 */
#ifndef DPS_ENGINE_SUP_INT_H
#define DPS_ENGINE_SUP_INT_H

#include <liburing.h>
#include <signal.h>

#include "engine/runtime/placement.h"
#include "engine/runtime/supervisor.h"
#include "engine/runtime/topo.h"
#include "shm/seg.h"

#include "engine/runtime/xlink.h"

struct sup {
	const struct dps_sup_opts *o;
	struct dps_sup_result *res;
	struct dps_layout lay;
	struct dps_placement place;
	struct dps_topo topo;
	struct dps_seg *segs;    /* (lay.nodes) the segment of each node this process hosts */
	struct dps_ctl **ctls;   /* (lay.nodes) their control blocks, NULL for a node elsewhere */
	char **kv_shares;        /* (lay.nodes) opts.kv_share_bytes for each prefill rank, on
				  * each node this process hosts; NULL without */
	size_t kv_share_len;
	struct dps_ring *to_sup; /* (world) supervisor's reader handles */
	struct dps_ring *from_sup; /* (world) supervisor's writer handles */
	pid_t *pids;             /* (world), 0 once reaped */
	int *pidfds;             /* (world) */
	int evfd, sigfd;
	sigset_t oldmask;
	int alive;
	uint64_t abort_deadline; /* 0 until the abort is raised */
	uint64_t early_deadline; /* a rank exited 0 while others ran: they must follow by then */
	int early_rank;          /* that rank */
	int kill_sent;
	unsigned ncpus;
	struct io_uring own, *ring;  /* the loop's ring: the caller's or own */
	unsigned char *armed;        /* (world + 2): a poll is in flight for evfd, sigfd, pidfd r */
	int n_armed;
	uint64_t gen;                /* this run's number, in the user_data of its polls */
	struct dps_hang_watch *hang; /* (world) each rank's work word */
	struct dps_hang_watch *beats; /* (world) each rank's alive word */
	unsigned char *stalled;      /* (world) at the last check: 0 not expected to progress, 1
				      * progressing, 2 stalled (work stopped for the timeout), 3
				      * stalled and deadlocked */
	uint64_t *ran_ns;            /* (world) a silent rank's CPU time when its silence was
				      * first long enough to judge, plus one (0: not sampled) */
	uint64_t hang_checked;       /* when the heartbeats were last checked (0: never) */
	int hung_rank;               /* the rank killed for hanging, or -1 */
	/* Nodes (docs/DESIGN.md, "Several nodes"). node: the one this process is (under mpirun),
	 * or -1 when it hosts them all (--nodes without mpirun); [lo, hi) the instance ranks it
	 * forks. */
	int node, lo, hi;
	const struct dps_xlink_ops *xops; /* the exchange between nodes (NULL on one node) */
	struct dps_xlink *link;      /* its state for this run */
	int remote_alive;            /* node 0 under mpirun: other nodes whose ranks still run */
	char why[256];               /* the first failure's sentence */
};

/* The control block that rank r's waits read (on its node). */
static inline struct dps_ctl *sup_ctl(const struct sup *s, int r)
{
	return s->ctls[dps_layout_node_of(&s->lay, r)];
}

/* Whether this process runs rank r. */
static inline int sup_hosts(const struct sup *s, int r)
{
	return r >= s->lo && r < s->hi;
}

/* sup_nodes.c: checks a fetch of prefill rank q's share (n ranges): 0 or -EFAULT / -EINVAL;
 * the bytes of rank q's slice on node k, or NULL when this process does not hold it */
int dps_sup_fetch_check(const struct sup *s, int q, const uint64_t (*range)[2], int n);
char *dps_sup_share_slice(const struct sup *s, int k, int q);

/* sup_hang.c */
void dps_sup_describe_rank(const struct sup *s, int r, char *buf, size_t len);
int dps_sup_check_hung(struct sup *s, char *err, size_t errlen);
/* supervisor.c: rank r failed as err says (r may be on another node) */
void dps_sup_fail(struct sup *s, int r, const char *err);

#endif

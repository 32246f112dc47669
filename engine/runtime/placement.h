/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/placement.h - which CPUs and which NUMA node each rank runs on.
 *
 * dps_place_compute is a pure function of (topology, TP, DP): ranks are shared out over the
 * NUMA nodes in proportion to their CPUs, the ranks of one TP group are kept on one node when
 * they fit in its share, and each node's CPUs are divided evenly among the ranks placed on it
 * (contiguous blocks of equal size; with more ranks than CPUs, rank i of the node gets CPU
 * i mod n_cpus, so ranks share cores). Memory of a rank is bound to its node.
 *
 * The supervisor calls compute (or parse_bind for --cpu-bind) before it forks and each rank
 * calls dps_place_apply on itself right after the fork.
 */
#ifndef DPS_ENGINE_PLACEMENT_H
#define DPS_ENGINE_PLACEMENT_H

#include <stddef.h>
#include <stdio.h>

#include "engine/runtime/topo.h"

struct dps_rank_place {
	int node;    /* NUMA node to bind memory to, -1 for no binding */
	int n_cpus;  /* 0 means no CPU pinning */
	int *cpus;   /* (n_cpus) */
};

struct dps_placement {
	int world;
	struct dps_rank_place *ranks; /* (world), world rank r = d*TP + t */
};

/*
 * Computes the placement of TP*DP ranks on t. Returns 0, -EINVAL (empty topology or bad
 * sizes) or -ENOMEM. Free with dps_placement_free.
 */
int dps_place_compute(const struct dps_topo *t, int tp, int dp, struct dps_placement *out);

/*
 * Parses a --cpu-bind value for `world` ranks:
 *   "auto"  -> returns 1 and leaves out untouched (the caller then uses dps_place_compute);
 *   "off"   -> no pinning and no memory binding for any rank;
 *   "L0:L1:...:L{world-1}" -> rank r is pinned to CPU list Lr, e.g. "0-1:2-3" or "0,2:1,3";
 *            a single list applies to every rank. Node is -1 (no memory binding).
 * Returns 0 (or 1 for auto) on success; on a malformed value writes a message naming it into
 * err and returns -EINVAL. CPUs not in the topology are rejected when t is not NULL.
 */
int dps_place_parse_bind(const char *spec, int world, const struct dps_topo *t,
			 struct dps_placement *out, char *err, size_t errlen);

/*
 * With pdp prefill replicas of ptp ranks (0: none, as dps_place_compute): the decode part's
 * placement (tp, dp), then the prefill part's (ptp, pdp) after it, each computed alone, so
 * both parts spread over the whole machine and share its CPUs.
 */
int dps_place_compute_parts(const struct dps_topo *t, int tp, int dp, int ptp, int pdp,
			    struct dps_placement *out);

void dps_placement_free(struct dps_placement *p);

/*
 * Applies p to the calling process: sched_setaffinity to its CPUs and, when node >= 0 and
 * libnuma is usable, binds its memory to that node. Returns 0 or -errno.
 */
int dps_place_apply(const struct dps_rank_place *p);

/* Prints one line per rank: "rank 3 (DP 0, TP 3): node 0, cpus 6-7". */
void dps_placement_print(const struct dps_placement *p, int tp, FILE *f);
/* The same, ranks from n_decode on named as prefill replicas of ptp ranks. */
void dps_placement_print_parts(const struct dps_placement *p, int tp, int n_decode, int ptp,
			       FILE *f);

#endif

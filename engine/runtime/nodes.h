/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/nodes.h - an instance's ranks over several machines ("nodes"), numbered
 * node-major: with T ranks in all (both parts of a disaggregated layout) on N nodes, each node
 * runs T / N consecutive instance ranks, so rank r runs on node r / (T / N). Because TP ranks
 * are the fastest-moving index, a TP group stays inside one node whenever the node's ranks
 * divide into whole TP groups: today's placement rule (keep TP groups on one NUMA node),
 * lifted to machines. This is the layout of the multi-node design (docs/DESIGN.md,
 * "Several nodes"); `dpshard groups --nodes N` prints it, and --nodes N runs it.
 */
#ifndef DPS_RUNTIME_NODES_H
#define DPS_RUNTIME_NODES_H

#include <stddef.h>
#include <stdio.h>

#include "engine/runtime/groups.h"

/* 0 when `nodes` machines can share the instance's `total` ranks evenly, else -DPS_ECONFIG
 * with the reason in err. */
int dps_nodes_check(int total, int nodes, char *err, size_t errlen);

/* The node of instance rank r (dps_nodes_check passed). */
static inline int dps_node_of(int r, int total, int nodes)
{
	return r / (total / nodes);
}

/*
 * Prints, for every group set of g (and of its prefill part), how many groups cross nodes and
 * which nodes each of those spans. Returns the number of groups that cross.
 */
int dps_nodes_print(const struct dps_groups *g, int nodes, FILE *f);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/topo.h - the machine's CPU and NUMA topology as the placement sees it: NUMA nodes,
 * each with the CPUs this process may run on. Discovered with libnuma intersected with the
 * process's affinity mask (so cgroups and taskset are respected), or made up by tests.
 */
#ifndef DPS_ENGINE_TOPO_H
#define DPS_ENGINE_TOPO_H

#include <stddef.h>

struct dps_topo_node {
	int id;      /* NUMA node number */
	int n_cpus;
	int *cpus;   /* (n_cpus) ascending CPU numbers */
};

struct dps_topo {
	int n_nodes;
	struct dps_topo_node *nodes; /* (n_nodes), nodes without usable CPUs are left out */
	int numa;    /* 1 when libnuma is usable (memory can be bound), else 0 */
};

/* Fills t from this machine. Returns 0, or -errno. Free with dps_topo_free. */
int dps_topo_discover(struct dps_topo *t);

/*
 * Builds a made-up topology of n_nodes nodes with cpus_per_node CPUs each, numbered
 * consecutively (node k holds CPUs k*cpus_per_node ..). For tests. Returns 0 or -ENOMEM.
 */
int dps_topo_synthetic(struct dps_topo *t, int n_nodes, int cpus_per_node);

void dps_topo_free(struct dps_topo *t);

/* Total CPUs over all nodes. */
int dps_topo_ncpus(const struct dps_topo *t);

#endif

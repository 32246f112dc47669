/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/topo.c - discovers the NUMA nodes and the CPUs this process may use on each, or
 * makes a topology up for tests. The supervisor calls dps_topo_discover once before it
 * computes the placement; nothing here runs on a hot path.
 *
 * A CPU counts only when it is both in a node's cpumap and in sched_getaffinity(0), so a
 * cgroup cpuset or `taskset` narrows what the placement hands out. Without libnuma (or when
 * the kernel refuses the NUMA system calls) the machine is one node 0 holding the affinity
 * CPUs, and memory is not bound.
 */
#include <limits.h>
#include <numa.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/topo.h"

/* Upper bound on the affinity mask we try; far above any Linux NR_CPUS. */
#define TOPO_MAX_CPUS (1 << 20)

/*
 * Reads the calling process's affinity into a freshly allocated set, growing it until the
 * kernel's mask fits. On success *setp, *sizep and *nbitsp describe the set (free it
 * with CPU_FREE).
 */
static int topo_get_affinity(cpu_set_t **setp, size_t *sizep, int *nbitsp)
{
	int nbits = 1024;

	for (;;) {
		cpu_set_t *set = CPU_ALLOC(nbits);
		size_t size = CPU_ALLOC_SIZE(nbits);
		int e;

		if (!set)
			return -ENOMEM;
		CPU_ZERO_S(size, set);
		if (sched_getaffinity(0, size, set) == 0) {
			*setp = set;
			*sizep = size;
			*nbitsp = (int)(size * CHAR_BIT);
			return 0;
		}
		e = errno;
		CPU_FREE(set);
		/* EINVAL: the kernel's mask is wider than ours. */
		if (e != EINVAL || nbits >= TOPO_MAX_CPUS)
			return -e;
		nbits *= 2;
	}
}

/*
 * Fills node with the CPUs of the affinity set that are also in mask (mask NULL: all of
 * them). Leaves node->n_cpus 0 and cpus NULL when there are none.
 */
static int topo_fill_node(struct dps_topo_node *node, int id, const cpu_set_t *set,
			  size_t size, int nbits, struct bitmask *mask)
{
	int cpu, n = 0;

	node->id = id;
	node->n_cpus = 0;
	node->cpus = NULL;
	for (cpu = 0; cpu < nbits; cpu++)
		if (CPU_ISSET_S(cpu, size, set) &&
		    (!mask || numa_bitmask_isbitset(mask, (unsigned int)cpu)))
			n++;
	if (n == 0)
		return 0;
	node->cpus = calloc((size_t)n, sizeof(*node->cpus));
	if (!node->cpus)
		return -ENOMEM;
	for (cpu = 0; cpu < nbits; cpu++)
		if (CPU_ISSET_S(cpu, size, set) &&
		    (!mask || numa_bitmask_isbitset(mask, (unsigned int)cpu)))
			node->cpus[node->n_cpus++] = cpu;
	return 0;
}

/* Collects every configured NUMA node with usable CPUs into t (t->nodes preallocated). */
static int topo_scan_numa(struct dps_topo *t, int max_node, const cpu_set_t *set,
			  size_t size, int nbits)
{
	struct bitmask *mask = numa_allocate_cpumask();
	int node, ret = 0;

	if (!mask)
		return -ENOMEM;
	for (node = 0; node <= max_node; node++) {
		struct dps_topo_node *slot = &t->nodes[t->n_nodes];

		/* Asking libnuma about a node that does not exist makes it print warnings. */
		if (!numa_bitmask_isbitset(numa_nodes_ptr, (unsigned int)node))
			continue;
		numa_bitmask_clearall(mask);
		if (numa_node_to_cpus(node, mask) < 0)
			continue;
		ret = topo_fill_node(slot, node, set, size, nbits, mask);
		if (ret)
			goto err;
		if (slot->n_cpus > 0)
			t->n_nodes++;
	}
err:
	numa_bitmask_free(mask);
	return ret;
}

/*
 * Memory can only be bound to nodes the cpuset allows; if some node we would place ranks on
 * is outside mems_allowed, binding would fail in the rank, so turn binding off instead.
 */
static void topo_check_mems(struct dps_topo *t)
{
	struct bitmask *mems = numa_get_mems_allowed();
	int i;

	if (!mems) {
		t->numa = 0;
		return;
	}
	for (i = 0; i < t->n_nodes; i++) {
		if (!numa_bitmask_isbitset(mems, (unsigned int)t->nodes[i].id)) {
			dps_warn("NUMA node %d has usable CPUs but its memory is not allowed; "
				 "memory will not be bound", t->nodes[i].id);
			t->numa = 0;
			break;
		}
	}
	numa_bitmask_free(mems);
}

int dps_topo_discover(struct dps_topo *t)
{
	cpu_set_t *set = NULL;
	size_t size = 0;
	int nbits = 0, max_node, ret;

	memset(t, 0, sizeof(*t));
	ret = topo_get_affinity(&set, &size, &nbits);
	if (ret)
		return ret;

	max_node = numa_available() < 0 ? -1 : numa_max_node();
	if (max_node >= 0) {
		t->nodes = calloc((size_t)max_node + 1, sizeof(*t->nodes));
		if (!t->nodes) {
			ret = -ENOMEM;
			goto err;
		}
		t->numa = 1;
		ret = topo_scan_numa(t, max_node, set, size, nbits);
		if (ret)
			goto err;
		if (t->n_nodes > 0) {
			topo_check_mems(t);
			CPU_FREE(set);
			return 0;
		}
		/* No node holds an allowed CPU (odd sysfs): fall through to one plain node. */
		free(t->nodes);
		t->nodes = NULL;
	}

	t->numa = 0;
	t->nodes = calloc(1, sizeof(*t->nodes));
	if (!t->nodes) {
		ret = -ENOMEM;
		goto err;
	}
	ret = topo_fill_node(&t->nodes[0], 0, set, size, nbits, NULL);
	if (ret)
		goto err;
	if (t->nodes[0].n_cpus == 0) {
		ret = -ENODEV; /* an empty affinity mask cannot happen for a running process */
		goto err;
	}
	t->n_nodes = 1;
	CPU_FREE(set);
	return 0;
err:
	CPU_FREE(set);
	dps_topo_free(t);
	return ret;
}

int dps_topo_synthetic(struct dps_topo *t, int n_nodes, int cpus_per_node)
{
	int k, i;

	memset(t, 0, sizeof(*t));
	if (n_nodes < 1 || cpus_per_node < 1 || n_nodes > INT_MAX / cpus_per_node)
		return -EINVAL;
	t->nodes = calloc((size_t)n_nodes, sizeof(*t->nodes));
	if (!t->nodes)
		return -ENOMEM;
	t->n_nodes = n_nodes;
	t->numa = 1;
	for (k = 0; k < n_nodes; k++) {
		struct dps_topo_node *node = &t->nodes[k];

		node->id = k;
		node->cpus = calloc((size_t)cpus_per_node, sizeof(*node->cpus));
		if (!node->cpus)
			goto err;
		node->n_cpus = cpus_per_node;
		for (i = 0; i < cpus_per_node; i++)
			node->cpus[i] = k * cpus_per_node + i;
	}
	return 0;
err:
	dps_topo_free(t);
	return -ENOMEM;
}

void dps_topo_free(struct dps_topo *t)
{
	int k;

	if (!t)
		return;
	if (t->nodes)
		for (k = 0; k < t->n_nodes; k++)
			free(t->nodes[k].cpus);
	free(t->nodes);
	memset(t, 0, sizeof(*t));
}

int dps_topo_ncpus(const struct dps_topo *t)
{
	long n = 0;
	int k;

	if (!t || !t->nodes)
		return 0;
	for (k = 0; k < t->n_nodes; k++)
		n += t->nodes[k].n_cpus > 0 ? t->nodes[k].n_cpus : 0;
	return n > INT_MAX ? INT_MAX : (int)n;
}

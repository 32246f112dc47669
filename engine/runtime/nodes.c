/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/nodes.c - the node-major numbering of nodes.h and its report. Called by
 * `dpshard groups --nodes`.
 */
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/nodes.h"

int dps_nodes_check(int total, int nodes, char *err, size_t errlen)
{
	if (nodes < 1 || nodes > total) {
		snprintf(err, errlen, "--nodes %d: need 1 to %d nodes for this layout's %d ranks",
			 nodes, total, total);
		return -DPS_ECONFIG;
	}
	if (total % nodes) {
		snprintf(err, errlen, "--nodes %d does not divide this layout's %d ranks: every node "
			 "runs the same number of ranks", nodes, total);
		return -DPS_ECONFIG;
	}
	return 0;
}

struct nodes_ctx {
	FILE *f;
	int nodes, total, base, crossing;
	unsigned char *seen; /* (nodes) */
};

/* Prints one set: its crossing groups, each with the nodes it spans. */
static void print_set(const struct dps_groupset *gs, void *arg)
{
	struct nodes_ctx *x = arg;
	char name[48];
	int cross = 0;

	dps_groupset_name(gs, name, sizeof(name));
	for (int g = 0; g < gs->n_groups; g++) {
		const int *m = gs->ranks + (size_t)g * (size_t)gs->group_size;
		int spans = 0;

		memset(x->seen, 0, (size_t)x->nodes);
		for (int i = 0; i < gs->group_size; i++) {
			const int node = dps_node_of(x->base + m[i], x->total, x->nodes);

			spans += !x->seen[node];
			x->seen[node] = 1;
		}
		if (spans < 2)
			continue;
		if (!cross++)
			fprintf(x->f, "%s:\n", name);
		fprintf(x->f, "  group %d [", g);
		for (int i = 0; i < gs->group_size; i++)
			fprintf(x->f, "%s%d", i ? "," : "", x->base + m[i]);
		fprintf(x->f, "] spans nodes");
		for (int k = 0, first = 1; k < x->nodes; k++)
			if (x->seen[k]) {
				fprintf(x->f, "%s%d", first ? " " : ",", k);
				first = 0;
			}
		fputc('\n', x->f);
	}
	if (cross)
		fprintf(x->f, "  %d of %d group%s of %s cross nodes\n", cross, gs->n_groups,
			gs->n_groups == 1 ? "" : "s", name);
	else
		fprintf(x->f, "%s: every group inside one node\n", name);
	x->crossing += cross;
}

int dps_nodes_print(const struct dps_groups *g, int nodes, FILE *f)
{
	const int total = dps_groups_total(g);
	struct nodes_ctx x = { f, nodes, total, 0, 0, calloc((size_t)nodes, 1) };

	if (!x.seen)
		return -ENOMEM;
	fprintf(f, "nodes: %d, %d rank%s each; instance rank r runs on node r / %d "
		"(node-major)\n", nodes, total / nodes, total / nodes == 1 ? "" : "s",
		total / nodes);
	dps_groups_foreach_set(g, print_set, &x);
	if (g->prefill) {
		x.base = g->prefill->rank_base;
		fprintf(f, "prefill part (instance ranks from %d):\n", x.base);
		dps_groups_foreach_set(g->prefill, print_set, &x);
	}
	free(x.seen);
	return x.crossing;
}

/* SPDX-License-Identifier: MIT */
/*
 * tests/xnode_check.c - the cross-node step of engine/runtime/xnode.h, one MPI process per
 * simulated node (tests/xnode.sh runs it under mpirun with 2 and 4 processes on this machine;
 * the processes share nothing but MPI). Groups whose members are spread over the nodes as a
 * DP column strides them, in blocks, unevenly (some nodes without members) and on one node;
 * f32, bf16 and i32; 1, 63 and 4097 elements. Oracle: tests/oracle.h's serial in-order sum,
 * compared bit for bit on every node, and the gathered raw contributions compared with the
 * generated ones. To show the comparison can fail, the sum a per-node-partial-sums scheme
 * would give (each node adding its own members first) must differ from the oracle somewhere.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/xnode.h"
#include "tests/oracle.h"

static int fails;

static void fail(const char *what, int layout, enum dps_dtype t, size_t count, size_t at)
{
	if (fails++ < 10)
		fprintf(stderr, "xnode_check: %s: layout %d %s count %zu: element %zu\n", what,
			layout, dps_dtype_name(t), count, at);
}

/* Member i's node under layout L for `nodes` nodes; *n gets the group size. */
static int layout_node(int L, int nodes, int i)
{
	switch (L) {
	case 0: return i % nodes;                   /* a DP column: strided */
	case 1: return i / 2 % nodes;               /* blocks of 2 */
	case 2: return i % 3 ? nodes - 1 : 0;     /* uneven: the middle nodes have none */
	default: return nodes - 1;                  /* all on the last node */
	}
}

int main(int argc, char **argv)
{
	static const size_t counts[] = { 1, 63, 4097 };
	struct dps_xnode x;
	char err[256];
	int partial_differs = 0;

	if (dps_xnode_init(&x, &argc, &argv, err, sizeof(err))) {
		fprintf(stderr, "xnode_check: %s\n", err);
		return 1;
	}
	for (int L = 0; L < 4; L++) {
		const int n = L == 2 ? 7 : 2 * x.nodes;
		int node_of[64];

		for (int i = 0; i < n; i++)
			node_of[i] = layout_node(L, x.nodes, i);
		for (int ti = 0; ti < DPS_DTYPE_COUNT; ti++) {
			const enum dps_dtype t = (enum dps_dtype)ti;
			const size_t esz = dps_dtype_size(t);

			for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
				const size_t count = counts[ci];
				const uint32_t salt = (uint32_t)(L * 97 + ti * 13 + (int)ci);
				unsigned char *local = malloc((size_t)n * count * esz);
				unsigned char *all = malloc((size_t)n * count * esz);
				unsigned char *want = malloc(count * esz), *out = malloc(count * esz);
				unsigned char *one = malloc(count * esz);
				int mine = 0, rc;

				if (!local || !all || !want || !out || !one)
					return 1;
				for (int i = 0; i < n; i++)
					if (node_of[i] == x.node)
						gen(t, local + (size_t)mine++ * count * esz, count,
						    (uint32_t)i, 0, salt);
				rc = dps_xnode_gather(&x, node_of, n, local, count * esz, all);
				for (int i = 0; i < n && !rc; i++) {
					gen(t, one, count, (uint32_t)i, 0, salt);
					if (memcmp(one, all + (size_t)i * count * esz, count * esz))
						fail("gathered contribution differs", L, t, count,
						     (size_t)i);
				}
				if (!rc)
					rc = dps_xnode_allreduce(&x, node_of, n, local, out, all, count,
								 t);
				if (rc) {
					fprintf(stderr, "xnode_check: node %d: error %d\n", x.node, rc);
					return 1;
				}
				for (size_t j = 0; j < count; j++) {
					oracle_sum(t, want + j * esz, (uint32_t)n, (uint32_t)j, salt);
					if (memcmp(want + j * esz, out + j * esz, esz))
						fail("sum differs from the serial oracle", L, t, count, j);
				}
				/* The scheme the design rules out: each node's members summed
				 * first, the node sums then added in node order. */
				if (t == DPS_F32 && L == 0 && x.nodes > 1)
					for (size_t j = 0; j < count && !partial_differs; j++) {
						float acc = 0;

						for (int k = 0; k < x.nodes; k++) {
							float part = 0;
							int first = 1;

							for (int i = 0; i < n; i++)
								if (node_of[i] == k) {
									const float v = oracle_f32(
										(uint32_t)i,
										(uint32_t)j, salt);

									part = first ? v : part + v;
									first = 0;
								}
							acc = k ? acc + part : part;
						}
						partial_differs = memcmp(&acc, want + j * esz, 4) != 0;
					}
				free(local);
				free(all);
				free(want);
				free(out);
				free(one);
			}
		}
	}
	if (x.nodes > 1 && !partial_differs) {
		fprintf(stderr, "xnode_check: self-check: per-node partial sums matched the serial "
			"sum everywhere, so the comparison could not tell the orders apart\n");
		fails++;
	}
	{
		int all_fails = 0;

		MPI_Allreduce(&fails, &all_fails, 1, MPI_INT, MPI_SUM, x.comm);
		if (x.node == 0)
			printf("xnode_check: %d nodes, 4 layouts x 3 types x 3 sizes: %s\n", x.nodes,
			       all_fails ? "FAILED" : "every node equals the serial sum bit for bit");
		dps_xnode_fini(&x);
		return all_fails ? 1 : 0;
	}
}

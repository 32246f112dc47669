/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/xnode.h - the step of a collective that crosses machines, over MPI between one
 * process per node (in the design of docs/DESIGN.md "Several nodes", the node's supervisor,
 * never a forked rank). A group whose members sit on several nodes is not contiguous per node
 * (a DP column strides across them), so adding per-node partial sums would change the order of
 * the additions: instead every node sends its members' raw contributions, every node then
 * holds all n in group order, and the sum is taken in group order (shm/reduce.h's contract):
 * bit-identical on every node and to the serial sum. Built only when Open MPI is found
 * (configure: HAVE_MPI).
 */
#ifndef DPS_RUNTIME_XNODE_H
#define DPS_RUNTIME_XNODE_H

#include <stddef.h>

#include <mpi.h>

#include "shm/reduce.h"

struct dps_xnode {
	MPI_Comm comm; /* every node, in node order */
	int node;      /* this process's node */
	int nodes;
};

/*
 * Initialises MPI (one thread calls it) and x. Calls on the communicator return errors rather
 * than end the job (MPI_ERRORS_RETURN). Returns 0, or -EIO with the reason in err.
 */
int dps_xnode_init(struct dps_xnode *x, int *argc, char ***argv, char *err, size_t errlen);
void dps_xnode_fini(struct dps_xnode *x);

/*
 * A group of n members in group order, member i on node node_of[i]. local holds the
 * contributions of this node's members, `bytes` each, in group order; on return all (n *
 * bytes) holds every member's in group order, on every node. Every node calls, with the same
 * node_of, n and bytes (a node without members contributes nothing). Returns 0, -EINVAL, or
 * -EIO (an MPI error, reported).
 */
int dps_xnode_gather(struct dps_xnode *x, const int *node_of, int n, const void *local,
		     size_t bytes, void *all);

/*
 * The ordered all-reduce over such a group: out (count elements) = the sum over members, in
 * group order, of their contributions; local holds this node's members' (count each, group
 * order), scratch n * count elements. Same returns.
 */
int dps_xnode_allreduce(struct dps_xnode *x, const int *node_of, int n, const void *local,
			void *out, void *scratch, size_t count, enum dps_dtype t);

#endif

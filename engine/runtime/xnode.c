/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/xnode.c - the cross-node step of xnode.h over MPI. Called by the node's one
 * MPI process; its tests run several processes on one machine as separate nodes
 * (tests/xnode.sh).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/xnode.h"

static int mpi_fail(int rc, const char *what)
{
	char msg[MPI_MAX_ERROR_STRING];
	int len = 0;

	MPI_Error_string(rc, msg, &len);
	dps_error("%s: %.*s", what, len, msg);
	return -EIO;
}

int dps_xnode_init(struct dps_xnode *x, int *argc, char ***argv, char *err, size_t errlen)
{
	int provided, rc;

	memset(x, 0, sizeof(*x));
	rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
	if (rc != MPI_SUCCESS) {
		snprintf(err, errlen, "MPI_Init_thread failed (%d)", rc);
		return -EIO;
	}
	if (MPI_Comm_dup(MPI_COMM_WORLD, &x->comm) != MPI_SUCCESS ||
	    MPI_Comm_set_errhandler(x->comm, MPI_ERRORS_RETURN) != MPI_SUCCESS ||
	    MPI_Comm_rank(x->comm, &x->node) != MPI_SUCCESS ||
	    MPI_Comm_size(x->comm, &x->nodes) != MPI_SUCCESS) {
		snprintf(err, errlen, "cannot set up the nodes' communicator");
		return -EIO;
	}
	return 0;
}

void dps_xnode_fini(struct dps_xnode *x)
{
	MPI_Comm_free(&x->comm);
	MPI_Finalize();
}

int dps_xnode_gather(struct dps_xnode *x, const int *node_of, int n, const void *local,
		     size_t bytes, void *all)
{
	int *cnt = calloc((size_t)x->nodes, sizeof(int)), *disp = calloc((size_t)x->nodes,
									     sizeof(int));
	size_t *cur = calloc((size_t)x->nodes, sizeof(size_t));
	unsigned char *packed = NULL;
	size_t total = 0;
	int rc = 0;

	if (!cnt || !disp || !cur) {
		rc = -ENOMEM;
		goto out;
	}
	/* The node-major layout MPI fills: node k's members (in group order) at disp[k]. */
	for (int i = 0; i < n; i++) {
		if (node_of[i] < 0 || node_of[i] >= x->nodes) {
			rc = -EINVAL;
			goto out;
		}
		if (bytes > (size_t)INT_MAX - (size_t)cnt[node_of[i]]) {
			rc = -EINVAL; /* MPI counts are ints */
			goto out;
		}
		cnt[node_of[i]] += (int)bytes;
	}
	for (int k = 0; k < x->nodes; k++) {
		if (total > (size_t)INT_MAX) {
			rc = -EINVAL;
			goto out;
		}
		disp[k] = (int)total;
		total += (size_t)cnt[k];
	}
	packed = malloc(total ? total : 1);
	if (!packed) {
		rc = -ENOMEM;
		goto out;
	}
	rc = MPI_Allgatherv(local, cnt[x->node], MPI_BYTE, packed, cnt, disp, MPI_BYTE, x->comm);
	if (rc != MPI_SUCCESS) {
		rc = mpi_fail(rc, "cross-node all-gather");
		goto out;
	}
	rc = 0;
	/* Back to group order: the j-th member of node k in group order is node k's j-th block. */
	for (int i = 0; i < n; i++) {
		const int k = node_of[i];

		memcpy((unsigned char *)all + (size_t)i * bytes, packed + (size_t)disp[k] + cur[k],
		       bytes);
		cur[k] += bytes;
	}
out:
	free(packed);
	free(cnt);
	free(disp);
	free(cur);
	return rc;
}

int dps_xnode_allreduce(struct dps_xnode *x, const int *node_of, int n, const void *local,
			void *out, void *scratch, size_t count, enum dps_dtype t)
{
	const size_t esz = dps_dtype_size(t);
	const void **src;
	int rc;

	if (n < 1 || count > SIZE_MAX / esz)
		return -EINVAL;
	src = calloc((size_t)n, sizeof(*src));
	if (!src)
		return -ENOMEM;
	rc = dps_xnode_gather(x, node_of, n, local, count * esz, scratch);
	if (!rc) {
		for (int i = 0; i < n; i++)
			src[i] = (const unsigned char *)scratch + (size_t)i * count * esz;
		dps_reduce_sum(t, out, src, n, count);
	}
	free(src);
	return rc;
}

/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/replica_wire.c - a step's batch from a replica's TP rank 0 to its peers
 * (replica.h): through the replica's batch ring when the TP group is on one node, through the
 * group's exchange between nodes when it crosses them (shm/coll_x.h).
 */
#include <errno.h>
#include <string.h>

#include "common/dps.h"
#include "engine/serve/msg.h"
#include "engine/serve/replica.h"

int dps_replica_wire_push(struct replica *R, size_t total)
{
	const uint32_t t = (uint32_t)total;
	int rc = 0;

	memcpy(R->wire, &t, sizeof(t));
	if (R->w->tp_c->x) { /* the TP group crosses nodes: through them, not the ring */
		size_t got;

		return dps_coll_bcast_bytes(R->w->tp_c, R->wire, total, R->wire_cap, 0, &got);
	}
	for (size_t at = 0; at < total && !rc; at += MSG_BYTES)
		rc = dps_ring_push(&R->w->replica, R->wire + at,
				   total - at < MSG_BYTES ? total - at : MSG_BYTES, 0);
	return rc;
}

int dps_replica_wire_pop(struct replica *R, size_t min, uint32_t *total)
{
	const unsigned me = (unsigned)R->w->tp_rank - 1;
	size_t len;
	int rc;

	if (R->w->tp_c->x) { /* the TP group crosses nodes (dps_replica_wire_push) */
		rc = dps_coll_bcast_bytes(R->w->tp_c, R->wire, 0, R->wire_cap, 0, &len);
		if (rc)
			return rc;
		memcpy(total, R->wire, sizeof(*total));
		return *total < min || *total > len ? -EPROTO : 0;
	}
	rc = dps_ring_pop(&R->w->replica, me, R->wire, MSG_BYTES, &len, 0);
	if (rc)
		return rc;
	memcpy(total, R->wire, sizeof(*total));
	if (*total < min || *total > R->wire_cap)
		return -EPROTO;
	for (size_t at = len; at < *total && !rc; at += len)
		rc = dps_ring_pop(&R->w->replica, me, R->wire + at, MSG_BYTES, &len, 0);
	return rc;
}


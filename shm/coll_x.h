/* SPDX-License-Identifier: MIT */
/*
 * shm/coll_x.h - the collectives of a group whose members sit on several nodes (docs/DESIGN.md,
 * "Several nodes").
 *
 * Every node has its own segment, and in it one area per crossing group. The members of the
 * group on that node and the node's proxy (a thread of its supervisor, the only part of the
 * node that talks to other nodes) share the area. Every call is a sequence of rounds; in a
 * round each member hands in one piece of its payload (at most `piece` bytes, flagged when
 * more follows), the proxies of the group's nodes exchange the pieces, and every member then
 * sees every member's piece of that round, in group order. A call continues while any
 * member's piece said "more". On top of that one exchange (an all-gather of raw bytes), each
 * operation computes its result on every member from every member's contribution: an
 * all-reduce sums in group order (shm/reduce.h), so the result is the serial sum's bits on
 * every member of every node, whatever the nodes. Bytes moved are not minimal (a reduce-scatter
 * moves whole vectors); order and bits are what this path keeps.
 *
 * A round: member g copies its piece into in[g], stores its length in len[g] and then the
 * round's number in post[g] (release), and rings the node's bell. The proxy starts a round
 * when every member of the node has posted it, exchanges, fills out[] and out_len[] for every
 * member, and publishes the round in done, which the members wait on. A member posts round s
 * + 1 only after it has read round s, so in[] and out[] are reused without further steps.
 */
#ifndef DPS_SHM_COLL_X_H
#define DPS_SHM_COLL_X_H

#include <stddef.h>
#include <stdint.h>

#include "shm/wait.h"

/* In a piece length: more of this member's payload follows in later rounds. */
#define DPS_X_MORE (1ull << 63)

struct dps_xmember {
	_Alignas(DPS_CACHELINE) _Atomic uint64_t post; /* last round this member posted */
	uint64_t len;      /* its piece of that round, bytes | DPS_X_MORE */
	uint64_t out_len;  /* the proxy's copy of every member's length for the round done */
	char pad[DPS_CACHELINE - 3 * sizeof(uint64_t)];
};

struct dps_xarea {
	struct dps_wword done;  /* last round whose out[] is complete */
	_Alignas(DPS_CACHELINE) uint32_t n;
	uint32_t pad0;
	uint64_t piece;         /* bytes of one piece */
	char pad[DPS_CACHELINE - 16];
	struct dps_xmember m[]; /* (n), then in (n * piece) and out (n * piece) on pages */
};

/* Bytes of the area of a crossing group of n members with pieces of `piece` bytes (a
 * multiple of 64); 0 on overflow. */
size_t dps_xarea_size(int n, size_t piece);
void dps_xarea_init(void *mem, int n, size_t piece);
unsigned char *dps_xarea_in(struct dps_xarea *a, int g);
unsigned char *dps_xarea_out(struct dps_xarea *a, int g);

/*
 * The proxy's side of one round (after every local member posted round s): local[] are the
 * node's members in group order. dps_xarea_ready says whether they all posted s.
 */
int dps_xarea_ready(struct dps_xarea *a, const int *local, int n_local, uint64_t s);

#endif

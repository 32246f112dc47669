/* SPDX-License-Identifier: MIT */
/*
 * shm/coll.h - collectives over a group of rank processes, through shared memory.
 *
 * A communicator is a group of n processes (listed by world rank, in group-rank order) and a
 * shared area: for each member a posted-step word (dps_wword, own cache line) and two payload
 * slots of slot_bytes each. Every collective is a sequence of steps; in a step each member
 * writes its part into its own slot, publishes the step number, waits for the members it reads
 * from, and reads. Posting step s also tells every peer "I have finished reading everything
 * of steps < s", which is how a writer knows a slot is free again: slot k, last read at step
 * x, may be rewritten once every member has posted a step > x. The two slots alternate, so
 * the next step's writes overlap the peers' reads of the previous one. Any message size works
 * with bounded memory: large messages are cut into slot-sized chunks.
 *
 * Every member must call the same collectives on a communicator in the same order with
 * matching arguments (as with MPI). Calls are not thread-safe on one communicator.
 *
 * Algorithms: all-reduce is one-shot (every member sums every chunk) up to oneshot_max bytes
 * and reduce-scatter + all-gather above. Both sum each element in group-rank order in fp32 and
 * round once (reduce.h), so the results are bit-identical on every rank and on both sides of
 * the switch (and in place or not, below). Errors: -DPS_EABORT when the abort word is raised
 * (a peer died), -EINVAL for inconsistent arguments.
 *
 * Windows. A group's area may also hold one window per member (window_bytes each, 0 = none): a
 * region of shared memory its owner writes and every member can read. A caller that builds a
 * collective's input in its window (an activation computed straight into it) saves the copy
 * into the slots and back out: the all-reduce above the one-shot limit, the all-gather and the
 * reduce-scatter then read every member's input where it lies ("in place"). Every member must
 * call in place or none (the input of each in its own window, at any offset that is a multiple
 * of the element size; a member with nothing to give still passes a pointer into its window),
 * and an output may lie in the caller's window only as an all-reduce's recv == send. A call
 * that breaks these rules fails with -EINVAL on every member after one step and leaves the
 * group usable. An in-place call returns once no member reads any window any more, so each
 * may write its own again; it leaves the input as it was (unless recv == send).
 */
#ifndef DPS_SHM_COLL_H
#define DPS_SHM_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "shm/reduce.h"
#include "shm/wait.h"

enum dps_coll_kind {
	DPS_COLL_BARRIER,
	DPS_COLL_BCAST,
	DPS_COLL_ALLGATHER,
	DPS_COLL_ALLREDUCE,
	DPS_COLL_REDUCESCATTER,
	DPS_COLL_ALLTOALL,
	DPS_COLL_KINDS
};

/* DPS_ALGO_NODES: what a group that crosses nodes does (shm/coll_x.h); reported, never forced. */
enum dps_coll_algo { DPS_ALGO_AUTO, DPS_ALGO_ONESHOT, DPS_ALGO_RSAG, DPS_ALGO_NODES };

/*
 * How a member writes a large message into its slots: with ordinary stores (the data stays in
 * its cache, where a reader on a nearby core finds it fastest) or streamed to memory
 * (shm/copy.h; faster for a reader far away, for whom the writer's cache is slower than
 * memory). Which is faster depends on where the cores are, which a virtual machine's host may
 * change while we run: AUTO measures both on the communicator's own calls and keeps the
 * faster (see coll.c, "write mode"). Messages under DPS_COLL_STREAM_MIN always use ordinary
 * stores. The mode never changes a result, only how bytes travel.
 */
enum dps_copy_mode { DPS_COPY_AUTO, DPS_COPY_CACHED, DPS_COPY_STREAM };

#define DPS_COLL_STREAM_MIN (64u << 10)

/* All-gathers and reduce-scatters of fewer bytes (the whole output, the whole input) copy even
 * from a window: below, the in-place call's extra step costs more than the copy it saves. */
#define DPS_COLL_INPLACE_MIN (64u << 10)

/* All-gathers (the whole output) from private memory read the peers' inputs directly from
 * DPS_COLL_CMA_MIN bytes up to below DPS_COLL_CMA_MAX (see dps_comm.cma); above, the slots
 * in the faster write mode are at least as fast on this project's machine in both of its
 * placements (README, "Performance of the collectives"). */
#define DPS_COLL_CMA_MIN (128u << 10)
#define DPS_COLL_CMA_MAX (512u << 10)
/* Write modes (AUTO): each mode's latest call times kept, the median of them compared. */
#define DPS_PICK_SAMPLES 5

#define DPS_COLL_SLOT_DEFAULT (256u << 10)
#define DPS_COLL_ONESHOT_DEFAULT (64u << 10)
#define DPS_COLL_ONESHOT_OVERSUB (8u << 10)

struct dps_coll_stats {
	uint64_t calls[DPS_COLL_KINDS];
	uint64_t bytes[DPS_COLL_KINDS]; /* payload bytes this member contributed or received */
	uint64_t ns[DPS_COLL_KINDS];    /* wall time inside the calls, when timing is on */
	uint64_t in_place[DPS_COLL_KINDS]; /* calls that read their inputs in the windows */
	uint64_t single_copy[DPS_COLL_KINDS]; /* calls that read the peers' inputs directly
					       * (shm/coll_cma.c) */
};

struct dps_comm {
	int n;                     /* members */
	int me;                    /* this process's rank in the group */
	const int *ranks;          /* (n) world ranks, borrowed */
	struct dps_wword *post;    /* (n) posted step of each member; NULL when n == 1 */
	struct dps_wword *bell;    /* rung when a step completes and someone sleeps */
	unsigned char *slots;      /* (n, 2, slot_bytes) */
	size_t slot_bytes;
	uint64_t seq;              /* last step this member posted */
	uint64_t slot_last[2];     /* step at which each slot was last read (0 = never) */
	uint64_t min_posted;       /* every other member is known to have posted at least this */
	unsigned next_slot;
	size_t oneshot_max;        /* all-reduce: one-shot up to this many bytes */
	enum dps_coll_algo algo;   /* forced algorithm for tests and benchmarks */
	enum dps_copy_mode copy;   /* write mode for large messages; AUTO by default */
	int stream_now;            /* this call writes its slots streamed */
	struct dps_copy_pick {     /* AUTO, per kind and size class (64 KiB, ..., 8 MiB and up) */
		uint64_t calls;
		float ns[2][DPS_PICK_SAMPLES]; /* the latest ns per KiB, cached / streamed */
		uint8_t n[2], at[2];       /* samples held (0: none yet), where the next goes */
	} pick[DPS_COLL_KINDS][8];
	struct dps_copy_pick *pick_now; /* this call's class when it is timed, else NULL */
	int pick_trial;            /* this call tries the mode that is not the faster */
	const _Atomic uint32_t *abort_word;
	int timing;                /* also measure the time spent in each kind of call */
	const void **src;          /* (n) scratch: reduction sources */
	size_t *counts;            /* (n) scratch: all-gather counts */
	size_t *offs;              /* (n) scratch: where each member's input lies in its window */
	unsigned char *windows;    /* (n, window_bytes), or NULL */
	size_t window_bytes;
	int window_used;           /* this process has lent its window to a buffer (the engine's) */
	struct dps_coll_stats stats;
	/* A group that crosses nodes (shm/coll_x.h): its area and the node's proxy bell; NULL
	 * for a group inside one node. Every call then goes through the proxy. */
	struct dps_xarea *x;
	struct dps_wword *xbell;
	uint64_t xseq;             /* last round this member posted */
	/* All-gathers from private memory of DPS_COLL_CMA_MIN bytes and more read the peers'
	 * inputs with process_vm_readv (shm/coll_cma.c): 0 yes, -1 no (the kernel refused once;
	 * or a caller's choice), 2 a test's member that pretends its reads fail. */
	int cma;
};

/* Bytes of shared memory a communicator of n members needs, with a window of window_bytes (a
 * multiple of 4096, 0 = none) per member (0 on overflow or a bad window size). */
size_t dps_comm_shm_size(int n, size_t slot_bytes, size_t window_bytes);

/* Initialises the shared area (zeroed memory, 64-byte aligned) before the members attach. */
void dps_comm_shm_init(void *mem, int n, size_t slot_bytes, size_t window_bytes);

/* This member's window (its size into *bytes), or NULL when the group has none. */
void *dps_comm_window(const struct dps_comm *c, size_t *bytes);

/*
 * Binds member `me` of an n-member group to its shared area (mem may be NULL when n == 1).
 * ranks is borrowed and must outlive c. slot_bytes must be a multiple of 64 and at least
 * 64 * (n + 1) (one line of step flag, then data). Returns 0, -EINVAL or -ENOMEM; release
 * with dps_comm_detach.
 */
int dps_comm_attach(struct dps_comm *c, void *mem, int n, int me, const int *ranks,
		    size_t slot_bytes, const _Atomic uint32_t *abort_word);

/*
 * Binds member `me` of a group that crosses nodes to its area on this node (shm/coll_x.h,
 * dps_xarea_init); bell is the node's proxy bell. Same returns; every call of coll.h then
 * exchanges through the proxy.
 */
int dps_comm_attach_x(struct dps_comm *c, void *mem, int n, int me, const int *ranks,
		      const _Atomic uint32_t *abort_word, struct dps_wword *bell);

/*
 * A group that crosses nodes only: member root's len bytes at buf reach buf of every member,
 * whose capacity is cap (the others need not know len); *got = the bytes received. Returns 0,
 * -EMSGSIZE (more than cap came; every member stays in step), or the errors of a call.
 */
int dps_coll_bcast_bytes(struct dps_comm *c, void *buf, size_t len, size_t cap, int root,
			 size_t *got);

/* Frees what dps_comm_attach allocated. */
void dps_comm_detach(struct dps_comm *c);

/* Every member waits until all have arrived. */
int dps_coll_barrier(struct dps_comm *c);

/* buf (count elements) of member root is copied into buf of every member. */
int dps_coll_bcast(struct dps_comm *c, void *buf, size_t count, enum dps_dtype t, int root);

/* recv (n * count) = concatenation of every member's send (count), in group order. In place
 * from DPS_COLL_INPLACE_MIN bytes of recv when send lies in the caller's window (recv must not
 * overlap a window then). */
int dps_coll_allgather(struct dps_comm *c, const void *send, void *recv, size_t count,
		       enum dps_dtype t);

/*
 * Variable sizes: member i contributes counts[i] elements (0 allowed); they land at
 * recv + displs[i] (displs NULL = packed in group order). send holds counts[me] elements.
 */
int dps_coll_allgatherv(struct dps_comm *c, const void *send, void *recv, const size_t *counts,
			const size_t *displs, enum dps_dtype t);

/* recv[j] = sum over members of send[j], j < count. send == recv is allowed. In place above
 * the one-shot limit when send lies in the caller's window (recv == send, or recv outside
 * every window). */
int dps_coll_allreduce(struct dps_comm *c, const void *send, void *recv, size_t count,
		       enum dps_dtype t);

/*
 * send holds n blocks of count elements (block q is for member q); recv (count) of member q =
 * sum over members of their block q. In place from DPS_COLL_INPLACE_MIN bytes of send when
 * send lies in the caller's window (recv outside every window).
 */
int dps_coll_reducescatter(struct dps_comm *c, const void *send, void *recv, size_t count,
			   enum dps_dtype t);

/*
 * Variable sizes: send holds n blocks packed in group order, block q of counts[q] elements
 * (0 allowed) for member q; recv (counts[me]) = sum over members of their block me. Every
 * member passes the same counts.
 */
int dps_coll_reducescatterv(struct dps_comm *c, const void *send, void *recv, const size_t *counts,
			    enum dps_dtype t);

/*
 * Member i sends scounts[j] elements from send + sdispls[j] to member j, which receives them
 * at recv + rdispls[i]; rcounts[i] must equal member i's scounts[me]. NULL displacements mean
 * packed in group order. Returns -EINVAL (after completing the exchange) on a count mismatch.
 */
int dps_coll_alltoallv(struct dps_comm *c, const void *send, const size_t *scounts,
		       const size_t *sdispls, void *recv, const size_t *rcounts,
		       const size_t *rdispls, enum dps_dtype t);

/*
 * The one-shot limit for a process of a group of `ranks` processes sharing `cpus` cores:
 * DPS_COLL_ONESHOT_DEFAULT when every rank has a core, DPS_COLL_ONESHOT_OVERSUB when they
 * share. One-shot makes every member sum the whole message (n times the work of
 * reduce-scatter + all-gather in all); with a core each that costs nothing up to the default,
 * but on shared cores the work adds up: at 4 and 8 ranks on 2 cores reduce-scatter +
 * all-gather is the faster from about 8 KiB (bench coll --method osu --algo, 2026-12-06).
 */
size_t dps_coll_oneshot_default(unsigned ranks, unsigned cpus);

/* The algorithm dps_coll_allreduce uses for a message of `bytes`. */
enum dps_coll_algo dps_coll_allreduce_algo(const struct dps_comm *c, size_t bytes);

/* "auto", "cached", "stream"; and the parser (0 or -EINVAL). */
const char *dps_copy_mode_name(enum dps_copy_mode m);
int dps_copy_mode_parse(const char *s, enum dps_copy_mode *out);

const char *dps_coll_kind_name(enum dps_coll_kind k);
const char *dps_coll_algo_name(enum dps_coll_algo a);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/world.h - the shared-memory layout of one engine instance and each rank's view of
 * it.
 *
 * The supervisor computes a dps_layout before it forks: the instance control block (abort
 * word), one collective area for every distinct group of ranks (a TP group, a DP group, a
 * component TP group or DP column whose member list equals another's shares its area, so the
 * aliases of docs/DESIGN.md section 3 are one communicator), and two message rings per rank
 * (rank -> supervisor, supervisor -> rank). It lives in one segment. Each rank process then
 * builds its dps_world: one dps_comm handle for every area it is a member of.
 */
#ifndef DPS_ENGINE_WORLD_H
#define DPS_ENGINE_WORLD_H

#include <stdatomic.h>
#include <stddef.h>

#include "engine/runtime/groups.h"
#include "shm/coll.h"
#include "shm/ring.h"
#include "shm/seg.h"

/*
 * A rank's heartbeat, on a cache line of its own (its rank writes it often, the supervisor
 * reads it once per check: no other rank's line may share it). Every atomic here is relaxed
 * on both sides: no data is published through them, the supervisor only compares what it
 * reads from one check to the next (docs/DESIGN.md section 1, "hung ranks").
 */
struct dps_beat {
	/* "Alive": bumped at every turn of the rank's loop, every layer and step, and every
	 * slice of a wait (dps_beat(), shm/wait.h); only ever increases. */
	_Alignas(DPS_CACHELINE) _Atomic uint64_t count;
	/* "Work": bumped by every layer of a step and every completed step (dps_work()), never
	 * by a wait; only ever increases. */
	_Atomic uint64_t work;
	/* Set by a rank that must progress whatever the supervisor's caller knows (a benchmark's
	 * loop of steps); 0 otherwise. */
	_Atomic uint32_t busy;
	char pad[DPS_CACHELINE - 2 * sizeof(uint64_t) - sizeof(uint32_t)];
};

/* Instance control block, at offset 0 of the segment: the abort word, then one heartbeat
 * line per world rank. */
struct dps_ctl {
	_Alignas(DPS_CACHELINE) _Atomic uint32_t abort; /* raised by the supervisor; read by every wait */
	char pad[DPS_CACHELINE - sizeof(uint32_t)];
	/* Rung by a member of a group that crosses nodes when it posts a round (shm/coll_x.h):
	 * the node's proxy sleeps on it. */
	struct dps_wword xbell;
	struct dps_beat beat[]; /* (world) */
};

_Static_assert(sizeof(struct dps_beat) == DPS_CACHELINE, "one heartbeat per cache line");

/*
 * A rank's request for bytes of a prefill rank's KV share that lives on another node
 * (disaggregated prefill across nodes, docs/DESIGN.md "Several nodes"): the node's proxy
 * copies them from that node's share into this node's, at the same offsets.
 */
#define DPS_FETCH_MAX 1024
struct dps_fetch {
	struct dps_wword done;   /* last request served */
	_Alignas(DPS_CACHELINE) _Atomic uint64_t post; /* last request posted */
	int32_t q;               /* the prefill rank, in its part */
	int32_t n;               /* ranges */
	int32_t rc;              /* the request's result: 0 or a negative code */
	int32_t pad;
	uint64_t range[DPS_FETCH_MAX][2]; /* offset and bytes in the prefill rank's slice */
};

/* Group sets of one part; an instance with prefill replicas has two parts. */
#define DPS_SETS_MAX (2 * (3 + 2 * DPS_MAX_COMP_SIZES))

struct dps_layout_comm {
	int n;
	const int *ranks;  /* (n), borrowed from the group set that first produced it */
	size_t off;        /* offset of its area in the segment (unused when n == 1) */
	size_t window;     /* bytes of each member's window (coll.h): TP groups only, else 0 */
	int cross;         /* its members sit on more than one node: a shm/coll_x.h area */
};

struct dps_layout {
	struct dps_groups groups; /* the decode part's, and groups.prefill the prefill part's */
	int world;                /* every rank of the instance (both parts) */
	int nodes;                /* machines (1: this one); node-major, world / nodes each */
	size_t slot_bytes;        /* collective slot size */
	size_t window_bytes;      /* each TP group member's window (0: none) */
	unsigned ring_slots;
	size_t ring_slot_bytes;
	int n_sets;
	/* In dps_groups_foreach_set order, the decode part's sets and then the prefill part's;
	 * set_base[i] is the instance rank of the set's rank 0 (0, or the prefill part's
	 * rank_base). */
	const struct dps_groupset *sets[DPS_SETS_MAX];
	int set_base[DPS_SETS_MAX];
	int *set_comm[DPS_SETS_MAX];                   /* (n_groups of set): index into comms */
	int n_comms;
	struct dps_layout_comm *comms;
	int n_owned;
	int **owned;              /* member lists in instance ranks, for the prefill part's comms */
	size_t ring_off;          /* rings: rank r's to-supervisor ring at ring_off + 2r*ring_bytes */
	size_t ring_bytes;
	/* Replica d's batch ring (TP rank 0 -> its peers), for replicas of more than one rank:
	 * decode replica d at rep_ring_off + d * rep_ring_bytes; prefill replica p at
	 * prep_ring_off + p * prep_ring_bytes. */
	size_t rep_ring_off, rep_ring_bytes;
	size_t prep_ring_off, prep_ring_bytes;
	size_t fetch_off;         /* each rank's struct dps_fetch (across nodes with prefill
				   * replicas), else 0 */
	size_t total;             /* segment size */
};

/*
 * Builds the layout for cfg. Returns 0, -DPS_ECONFIG (message in err) or -ENOMEM.
 * slot_bytes is rounded up to a multiple of 4096 and to at least 64 * (world + 1);
 * window_bytes (0: none) to a multiple of 4096, and every member of a TP group gets a window
 * of that size in its group's area.
 */
int dps_layout_build(struct dps_layout *l, const struct dps_par_cfg *cfg, size_t slot_bytes,
		     size_t window_bytes, char *err, size_t errlen);
void dps_layout_free(struct dps_layout *l);

/* Initialises a zeroed segment of l->total bytes (control block, every area and ring). */
void dps_layout_init_shm(const struct dps_layout *l, void *base);

/* The node of instance rank r. */
static inline int dps_layout_node_of(const struct dps_layout *l, int r)
{
	return r / (l->world / l->nodes);
}

/* Rings of rank r inside the segment. */
void *dps_layout_ring_to_sup(const struct dps_layout *l, void *base, int r);
void *dps_layout_ring_from_sup(const struct dps_layout *l, void *base, int r);
/* The batch ring of decode replica d (TP > 1 only), or of prefill replica d when prefill is
 * 1 (its TP > 1): written by its TP rank 0, read by the others. */
void *dps_layout_ring_replica(const struct dps_layout *l, void *base, int prefill, int d);

/* Rank r's fetch area (l->fetch_off != 0). */
static inline struct dps_fetch *dps_layout_fetch(const struct dps_layout *l, void *base, int r)
{
	return (struct dps_fetch *)(void *)((char *)base + l->fetch_off +
					    (size_t)r * sizeof(struct dps_fetch));
}

/* Which graph a rank runs: both (no prefill replicas) or decode, or prefill. */
enum dps_role { DPS_ROLE_DECODE, DPS_ROLE_PREFILL };

struct dps_world {
	/*
	 * rank: in the instance. world, tp, dp, tp_rank and dp_rank: in the rank's part (the
	 * decode part, which is every rank without prefill replicas, or the prefill part), whose
	 * groups are *part and whose first rank is base; total: every rank of the instance.
	 */
	int rank, world, tp, dp, tp_rank, dp_rank;
	enum dps_role role;
	int base, total;
	const struct dps_groups *part;
	const struct dps_layout *lay;
	struct dps_ctl *ctl;
	struct dps_comm *comms;   /* (lay->n_comms); only those containing rank are attached */
	struct dps_comm *world_c, *tp_c, *dp_c;
	struct dps_comm *comp_tp_c[DPS_COMP_COUNT], *dp_col_c[DPS_COMP_COUNT];
	struct dps_ring to_sup, from_sup;
	struct dps_ring replica;  /* TP > 1: the batch ring of this rank's replica (reader tp_rank-1) */
	struct dps_beat *beat;    /* this rank's heartbeat, &ctl->beat[rank] */
	/* The prefill ranks' KV caches (dps_sup_opts.kv_share_bytes), readable by every rank:
	 * prefill rank q of its part at kv_share + q * kv_stride; NULL without. */
	char *kv_share;
	size_t kv_stride;
	unsigned ncpus;           /* CPUs this rank may use */
	struct dps_fetch *fetch;  /* this rank's (lay->fetch_off), else NULL */
	struct dps_wword *xbell;  /* the node's proxy bell */
	uint64_t fetch_seq;
};

/*
 * Copies n ranges (offset, bytes) of prefill rank q's KV share slice (q in the prefill part)
 * from the node that holds it into this rank's kv_share, at the same offsets, through the
 * node's proxy. Returns 0, -EINVAL (no such thing to fetch), -DPS_EABORT, or the error the
 * other node's proxy met (-EFAULT: a range outside the slice).
 */
int dps_world_fetch(struct dps_world *w, int q, const uint64_t (*ranges)[2], int n);

/*
 * Builds rank r's view of the segment at base. notify_fd is the eventfd the supervisor
 * sleeps on (-1 for none). Returns 0 or -ENOMEM / -EINVAL.
 */
int dps_world_attach(struct dps_world *w, const struct dps_layout *l, void *base, int r,
		     int notify_fd);
void dps_world_detach(struct dps_world *w);

/* The communicator of rank w->rank's group in set gs (a set of w->lay->groups). */
struct dps_comm *dps_world_comm(struct dps_world *w, const struct dps_groupset *gs);

/* Marks this rank as one that must progress now (busy 1) or not (0); see struct dps_beat. */
static inline void dps_world_set_busy(struct dps_world *w, int busy)
{
	atomic_store_explicit(&w->beat->busy, (uint32_t)(busy != 0), memory_order_relaxed);
}

/* Sets the all-reduce switch point and the forced algorithm on every communicator. */
void dps_world_set_algo(struct dps_world *w, size_t oneshot_max, enum dps_coll_algo algo);

#endif

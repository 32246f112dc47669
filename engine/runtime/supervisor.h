/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/supervisor.h - forks, pins and watches the rank processes of one instance.
 *
 * dps_sup_run sweeps stale segments of dead instances, builds the layout, creates the one
 * shared segment, forks TP x DP ranks, and the prefill replicas' after them when the layout
 * has any (each pinned by the placement and killed if the
 * supervisor dies, PR_SET_PDEATHSIG), and waits on the ranks' pidfds, an eventfd the ranks
 * signal when they post a message, and a signalfd for SIGTERM/SIGINT/SIGHUP, all as polls on
 * one io_uring, which a caller may share (opts.ring) to run its own I/O in the same loop: the
 * supervisor's completions carry DPS_SUP_UDATA in their user_data, every other completion goes
 * to opts.cqe_fn. When a rank dies
 * (signal, or an exit status other than 0) the supervisor raises the abort word, so every
 * peer's pending collective returns -DPS_EABORT within DPS_WAIT_SLICE_MS, names the dead rank
 * and how it died, gives the others a grace period to exit, kills what is left, and returns.
 * A rank that is expected to progress and does not (its work word, struct dps_beat, has not
 * moved for opts.rank_timeout_ms) has stalled: if its alive word stopped too (and it is
 * stopped, asleep outside dpshard's waits, or ran on a CPU meanwhile: a rank that is merely
 * starved of CPU is not blamed) it has failed the same way (named, killed at once, the others stopped as for a death); if every stalled
 * rank is still alive, waiting, they are deadlocked: named together and stopped the same way.
 */
#ifndef DPS_ENGINE_SUPERVISOR_H
#define DPS_ENGINE_SUPERVISOR_H

#include <stddef.h>
#include <stdint.h>

#include "engine/runtime/groups.h"
#include "engine/runtime/world.h"

struct io_uring;
struct io_uring_cqe;

/* The user_data bit of the supervisor's own requests on a shared ring. */
#define DPS_SUP_UDATA (1ull << 63)

/* Exit status of a rank whose function returned -DPS_EABORT (it stopped because of a peer). */
#define DPS_EXIT_ABORTED 3

/*
 * Runs in each rank process after placement. Returns 0 on success or a negative code; the
 * process exits 0, DPS_EXIT_ABORTED (for -DPS_EABORT) or 1.
 */
typedef int (*dps_rank_fn)(struct dps_world *w, void *arg);

/* Runs in the supervisor for each message a rank pushed onto its to-supervisor ring. */
typedef void (*dps_sup_msg_fn)(int rank, const void *msg, size_t len, void *arg);

struct dps_sup_opts {
	struct dps_par_cfg par;
	const char *cpu_bind;      /* "auto" (NULL), "off" or explicit lists, see placement.h */
	size_t slot_bytes;         /* collective slot size (0 = default) */
	size_t window_bytes;       /* each TP group member's window (shm/coll.h; 0 = none) */
	dps_rank_fn rank_fn;
	void *rank_arg;
	dps_sup_msg_fn msg_fn;     /* may be NULL */
	void *msg_arg;
	/*
	 * May be NULL. Called (with msg_arg) in the supervisor before each wait of its loop, once
	 * the ranks run; returns how long the loop may sleep before calling it again, in ms (-1:
	 * until something happens). It may send messages with dps_sup_send.
	 */
	int (*tick_fn)(void *arg);
	unsigned grace_ms;         /* after an abort, how long ranks get to exit (0 = 3000) */
	int verbose;               /* print the placement */
	/*
	 * Sharing the loop (all may be NULL). ring: the io_uring the loop waits on (NULL: its
	 * own), which outlives the call; cqe_fn(cqe, msg_arg): every completion on it without
	 * DPS_SUP_UDATA; child_fn(msg_arg): in each rank right after fork (close the caller's
	 * descriptors there); signal_fn(signo, msg_arg): SIGTERM, SIGINT and SIGHUP first go here,
	 * and a return of 1 means handled (else TERM and INT stop the instance, HUP is ignored).
	 */
	struct io_uring *ring;
	void (*cqe_fn)(struct io_uring_cqe *cqe, void *arg);
	void (*child_fn)(void *arg);
	int (*signal_fn)(int signo, void *arg);
	/* fail_fn(why, msg_arg): the moment a rank failure is seen (the run then winds down). */
	void (*fail_fn)(const char *why, void *arg);
	/*
	 * Hung ranks (docs/DESIGN.md section 1). A rank is expected to progress while
	 * pending_fn(rank, msg_arg) returns non-zero (work the caller gave it is not done; NULL:
	 * never) or while its own busy flag is set (dps_world_set_busy). Only that time counts:
	 * a rank whose work word has not moved for rank_timeout_ms of it has stalled (0: never
	 * checked), and fails as hung (its alive word stopped too) or with the other stalled
	 * ranks as deadlocked (all still alive: waiting). The loop checks on its wait timeout, every rank_timeout_ms / 8 (at least
	 * 20 ms, at most 1 s).
	 */
	unsigned rank_timeout_ms;
	int (*pending_fn)(int rank, void *arg);
	/*
	 * coupled_fn(msg_arg): whether ranks of different replicas wait for each other (they step
	 * together). A stalled rank that still waits is deadlocked only when no rank of its
	 * domain works: every rank when coupled (or coupled_fn is NULL), else its replica's.
	 */
	int (*coupled_fn)(void *arg);
	/*
	 * Whether rank_fn runs the ranks of both parts of a layout with prefill replicas
	 * (par.prefill_dp > 0; struct dps_world's role says which part a rank is in). Without
	 * it such a layout is refused by name.
	 */
	int roles;
	/*
	 * With prefill replicas: bytes of KV cache each prefill rank keeps where the decode ranks
	 * can read it (0: none). The supervisor maps that much a prefill rank, shared and
	 * untouched (memory is taken as the caches are written), before it forks; every rank sees
	 * it as struct dps_world's kv_share (prefill rank q of the part at q * kv_stride).
	 */
	size_t kv_share_bytes;
	/*
	 * Whether the caller runs across nodes (par.nodes > 1; docs/DESIGN.md, "Several
	 * nodes"): under mpirun, this process is one node's supervisor, forks that node's ranks
	 * only, and on nodes other than 0 runs none of the caller's functions (msg_fn, tick_fn,
	 * pending_fn, fail_fn): node 0's run them for every rank. Without it --nodes is refused.
	 */
	int nodes_ok;
};

struct dps_sup_result {
	int failed_rank;           /* first rank that failed, or -1 */
	int failed_signal;         /* its signal, or 0 */
	int failed_status;         /* its exit status when it exited, or -1 */
	uint64_t failed_ns;        /* dps_now_ns() when the supervisor saw it fail */
	int stop_signal;           /* SIGTERM/SIGINT that stopped the instance, or 0 */
	int killed;                /* ranks killed after the grace period */
	uint64_t hung_ms;          /* the failed rank hung (made no progress) this long, or 0 */
	int deadlock;              /* ranks that all waited without progress (failed_rank the
				    * first), or 0 */
};

/*
 * What the supervisor remembers of one rank's heartbeat between two checks. Zero it to
 * start.
 */
struct dps_hang_watch {
	uint64_t count;            /* the heartbeat last read */
	uint64_t since_ns;         /* since when it is expected and unmoved (0: not expected) */
};

/*
 * One check of one rank at time now_ns: count is its heartbeat now, expected whether it must
 * progress now. Returns for how long (ns) it has been expected without its heartbeat moving;
 * 0 when it moved, or is not expected (time while not expected never counts, however long).
 */
uint64_t dps_hang_watch_check(struct dps_hang_watch *h, uint64_t count, int expected,
			      uint64_t now_ns);

/*
 * Runs an instance to completion. Returns 0 when every rank exited 0; -DPS_ERANK when a rank
 * failed (res says which; err has a sentence such as "rank 3 (DP 0, TP 3) was killed by
 * signal 9 (Killed)"); -DPS_EABORT when stopped by a signal; -DPS_ECONFIG / -DPS_ENOSHM /
 * -errno when the instance could not start (err says why).
 */
int dps_sup_run(const struct dps_sup_opts *o, struct dps_sup_result *res, char *err,
		size_t errlen);

/*
 * From the supervisor (msg_fn or tick_fn, while dps_sup_run runs): pushes a message onto
 * rank's from-supervisor ring without waiting. Returns 0, -EAGAIN when the ring is full (try
 * again on a later tick), -EMSGSIZE, or -ESRCH outside dps_sup_run.
 */
int dps_sup_send(int rank, const void *msg, size_t len);

/*
 * From the supervisor, while dps_sup_run runs: the process ids of the first max ranks in
 * pids (0 for a rank already reaped). Returns the ranks written, 0 outside dps_sup_run.
 */
int dps_sup_rank_pids(int *pids, int max);

/* How many processes mpirun started, this one's rank among them in *rank (Open MPI's
 * environment); 0 (and *rank 0) when mpirun did not start this process. */
int dps_mpirun_procs(int *rank);

/* The node this process was in its last dps_sup_run: 0 on one node, on node 0 and when it
 * hosts every node; the caller prints results only on node 0. */
int dps_sup_node(void);

/*
 * From the supervisor, while dps_sup_run runs: stops the instance as signal signo would
 * (the ranks are aborted; dps_sup_run returns -DPS_EABORT with res.stop_signal = signo).
 */
void dps_sup_stop(int signo);

#endif

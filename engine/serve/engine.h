/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/engine.h - the serving engine (docs/DESIGN.md section 5; the data-parallelism
 * reference): every DP replica runs a scheduler on its TP rank 0 and a busy loop on all its
 * ranks; the supervisor side (the client) balances requests over the replicas and collects
 * their tokens.
 *
 * Messages. The client sends a replica's TP rank 0, through its ring, requests (a header
 * and the prompt, in as many messages as the ring's slots need), cancellations, wake-ups and
 * the final stop. Rank 0 answers with every token as it is sampled and a done message with the
 * finish reason and the time of the request's first step, and the counts of its scheduler at exit.
 *
 * The loop of a replica. TP rank 0 takes the messages, asks the scheduler for a batch and
 * publishes it to the replica's other ranks through the replica's batch ring (one writer, a
 * reader per peer); all ranks run the step. Uncoupled replicas (every component size 1, no
 * expert parallelism) never wait for each other: an idle replica sleeps on its ring. Coupled
 * replicas (any component size above 1, or --enable-expert-parallel) agree before every step
 * with the _get_dp_padding all-reduce over the DP group (each writes its row count, whether it
 * prefills, whether it has unfinished requests and whether it was told to stop into its own
 * slot; sum): the prefill graph when any replica prefills, else the decode graph on the
 * largest (bucket-sized) batch, smaller ones padded; a replica with nothing to do runs a dummy
 * batch of that size; when no replica has work they all sleep on their rings until the client
 * wakes every replica, which it does whenever it sends a request.
 */
#ifndef DPS_ENGINE_ENGINE_H
#define DPS_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/serve/sched.h"
#include "engine/shard/shard.h"
#include "engine/runtime/world.h"

struct dps_engine_opts {
	const char *model;
	const char *blis_arch;
	enum dps_shard_dtype dtype;  /* --dtype: the linear weights' type in memory */
	enum dps_shard_quant quant;  /* --quantization */
	int threads;                 /* per rank; 0: the CPUs its placement gave it */
	int block_size;              /* --block-size */
	size_t kv_cache_memory;      /* bytes of KV cache per rank (0: kv_fraction of free memory) */
	double kv_fraction;          /* of MemAvailable, shared by the ranks (default 0.5) */
	int max_num_seqs, max_model_len, max_batched_tokens;
	const char *decode_buckets;  /* NULL: powers of two */
	int verbose, trace;
	/* Eagle3 speculative decoding: the draft's directory (NULL: none) and the tokens it
	 * proposes per step (--num-speculative-tokens). */
	const char *spec_model;
	int spec_k;
};

/* The rank side: run with dps_sup_run, arg a struct dps_engine_opts. */
int dps_engine_rank_main(struct dps_world *w, void *arg);

/* Rows a replica's forward pass takes at once under o: a prefill chunk
 * (--max-num-batched-tokens) and every sequence's decode rows with a draft's proposals. */
int dps_engine_max_rows(const struct dps_engine_opts *o);

/* For dps_sup_opts.window_bytes: the TP groups' windows in which the ranks compute the
 * sublayer outputs they all-reduce, read there in place (shm/coll.h); 0 without TP > 1. */
size_t dps_engine_window_bytes(const struct dps_engine_opts *o, const struct dps_par_cfg *par);

/*
 * For dps_sup_opts.kv_share_bytes: what a prefill rank of par keeps in the instance's KV
 * share under o's budget (0 without prefill replicas). The ranks of a disaggregated layout
 * also need dps_sup_opts.roles set, and the client dps_engine_client_set_prefill.
 */
size_t dps_engine_kv_share_bytes(const struct dps_engine_opts *o, const struct dps_par_cfg *par);

/* ---- the client (in the supervisor) ------------------------------------------------------ */

struct dps_engine_req {
	const int *prompt;
	int n_prompt;
	struct dps_req_params p;     /* deadline_ns: a timeout counted from the request's arrival
				      * at its replica (0: none) */
	int replica;                 /* -1: the least loaded */
	void *user;
};

#define DPS_ENGINE_GROUPS 12     /* group sets reported in the stats, at most */

struct dps_engine_stats {
	uint64_t steps, dummy_steps, padded_rows, preemptions, prefill_steps, decode_steps;
	uint64_t dp_allreduces;      /* cross-replica collectives (the agreement) */
	uint64_t num_blocks, free_blocks; /* the scheduler's (free: now, or at exit) */
	uint64_t collectives;        /* every collective of the step, rank 0 of the replica */
	uint64_t running, waiting;   /* the scheduler's requests now */
	uint64_t expert_bytes;       /* MoE router and expert weights read, rank 0 of the replica */
	/* Disaggregated: a decode replica's pulls (requests, KV bytes rank 0 copied, time); a
	 * prefill replica's hand-offs (in all, and those whose blocks it still holds). */
	uint64_t kv_pulls, kv_pull_bytes, kv_pull_ns;
	uint64_t handoffs, handoff_held;
	/* Speculative decoding: verifications, tokens drafted and accepted (in all, and at each
	 * draft position), draft passes. */
	uint64_t spec_drafts, spec_draft_tokens, spec_accepted, draft_steps;
	uint64_t spec_accepted_pos[DPS_MAX_SPEC];
	int spec_k;
	/* Time rank 0 of the replica spent in collectives, per group set it belongs to: names
	 * as dps_groupset_name gives them; sets sharing a communicator count it once. */
	int n_groups;
	char group[DPS_ENGINE_GROUPS][32];
	uint64_t group_ns[DPS_ENGINE_GROUPS];
};

struct dps_engine_client;

/*
 * Callbacks of the client, in the supervisor. stats: a replica's counts, every
 * DPS_ENGINE_STATS_MS while it runs (final 0) and once at exit (final 1); ready: every rank
 * has loaded the model; scheduled (may be NULL): just before done, the dps_now_ns() at which
 * the replica's scheduler first put the request in a batch, when it ever did (vLLM's
 * scheduled_ts: the end of its queue time and the start of its prefill).
 */
struct dps_engine_cb {
	void (*token)(void *arg, void *user, int token);
	void (*done)(void *arg, void *user, enum dps_finish why, int n_gen);
	void (*stats)(void *arg, int replica, const struct dps_engine_stats *st, int final);
	void *arg;
	void (*ready)(void *arg);
	void (*scheduled)(void *arg, void *user, uint64_t t_ns);
	/* A token of a request with want_logprobs, with them (NULL: token is called instead);
	 * with prompt_logprobs first one call per prompt position from 1, lp->prompt set. */
	void (*token_lp)(void *arg, void *user, const struct dps_token_logprobs *lp);
};

#define DPS_ENGINE_STATS_MS 500

int dps_engine_client_new(struct dps_engine_client **c, int dp, int tp,
			  const struct dps_engine_cb *cb);
void dps_engine_client_free(struct dps_engine_client *c);

/*
 * Disaggregated serving (--prefill-data-parallel-size): the client also drives pdp prefill
 * replicas of ptp ranks (world ranks after the decode replicas'), replicas dp .. dp + pdp - 1
 * in its counts. New requests go to the least loaded prefill replica; a request handed over
 * goes to the least loaded decode replica, and its blocks are released on the prefill
 * replica once pulled (or once it ended). 0 or -ENOMEM.
 */
int dps_engine_client_set_prefill(struct dps_engine_client *c, int pdp, int ptp);

/* Replicas the client counts (decode, then prefill). */
int dps_engine_replicas(const struct dps_engine_client *c);

/*
 * Queues a request on the replica it names, or on the least loaded one (the load balancer of
 * the data-parallelism reference's "client requests (load balanced)": 4 x waiting + running,
 * ties broken by a rotating start); returns its id (>= 0) or a negative code. The prompt is
 * copied.
 */
int64_t dps_engine_submit(struct dps_engine_client *c, const struct dps_engine_req *r);

/* Cancels request id (its done callback follows with "cancelled"). */
void dps_engine_cancel(struct dps_engine_client *c, int64_t id);

/* After the last request finishes, tells every replica to stop. */
void dps_engine_close_when_idle(struct dps_engine_client *c);

/* Requests queued or running. */
int dps_engine_outstanding(const struct dps_engine_client *c);

/* Requests waiting (not started) and running on replica d, as the load balancer counts them. */
void dps_engine_load(const struct dps_engine_client *c, int d, int *waiting, int *running);

/* Whether every rank has reported that it loaded the model. */
int dps_engine_ready(const struct dps_engine_client *c);

/*
 * Ends every outstanding request with why (DPS_FINISH_ERROR when the ranks died), calling
 * the done callback for each.
 */
void dps_engine_fail_all(struct dps_engine_client *c, enum dps_finish why);

/* Requests sent to each replica so far (dp entries). */
const uint64_t *dps_engine_sent(const struct dps_engine_client *c);

/* For dps_sup_opts: msg_fn, tick_fn and pending_fn with msg_arg = the client. */
void dps_engine_on_msg(int rank, const void *msg, size_t len, void *client);
int dps_engine_tick(void *client);
/*
 * Whether world rank `rank` has work of this client to do now: every rank is loaded and its
 * replica has requests queued or running (any replica, when the replicas are coupled). The
 * hung-rank rule of the supervisor counts only that time.
 */
int dps_engine_rank_pending(int rank, void *client);
/* For dps_sup_opts.coupled_fn: whether the replicas step together (a rank said so). */
int dps_engine_coupled(void *client);

#endif

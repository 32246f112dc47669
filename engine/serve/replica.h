/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/replica.h - what replica.c and spec.c share: a replica as each of its ranks
 * holds it (the shard, TP rank 0's scheduler, this step's rows, the wire to the peers, the
 * draft's state), and the header of a published step.
 */
#ifndef DPS_ENGINE_SERVE_REPLICA_H
#define DPS_ENGINE_SERVE_REPLICA_H

#include <stddef.h>
#include <stdint.h>

#include "engine/serve/engine.h"
#include "engine/serve/msg.h"
#include "engine/serve/sched.h"
#include "engine/shard/shard.h"

struct pending { /* a request whose prompt is still arriving */
	int64_t id;
	struct dps_req_params p;
	int *ids, n, have;
	/* M_ADOPT: ids holds n_ids tokens then n_src source blocks (n = n_ids + n_src) */
	int adopt, n_ids, n_prompt, n_src, src_replica, plp_next;
	struct dps_rng rng;
	uint64_t t_scheduled;
};

struct replica {
	struct dps_world *w;
	const struct dps_engine_opts *o;
	struct dps_shard m;
	struct dps_sched s;          /* TP rank 0 only */
	int tp0, coupled, stop, bpr; /* bpr: block-table columns (ceil(max_model_len / bs)) */
	/* Disaggregated: prefill (a prefill replica: hands its requests over), decode_only (a
	 * decode replica: holds the decode graph alone, pulls adopted requests' positions);
	 * replica: its index among all (decode replicas first, then the prefill ones). */
	int prefill, decode_only, replica;
	int *pulls;                  /* this step's pulls as every rank holds them (wire form) */
	int n_pulls, pulls_len;
	int zero_table;              /* index of the all-zero table of padding rows */
	unsigned took;               /* messages taken since the last agreement */
	long fault_spin;             /* test-only (DPSHARD_FAULT): spin at this step, or -1 */
	long fault_wait;             /* test-only: wait for ever at this step, or -1 */
	struct pending pend;
	struct dps_engine_stats st;
	/* this step's rows, as every rank of the replica holds them */
	int *tokens, *pos, *slot, *tix, *tables;
	unsigned char *want;
	const int **table;
	int rows_cap;
	struct m_tokens *out;        /* tokens to send */
	struct m_tokens_lp *out_lp;  /* tokens with log-probabilities to send */
	unsigned char *wire;         /* a published batch */
	size_t wire_cap;
	int *scratch;
	/* Speculative decoding (spec_k > 0): the draft, its catch-up rows as every rank holds
	 * them, and the proposals of the requests it drafts for. */
	struct dps_shard dm;
	int spec_k;
	int n_cu, n_prop;
	int *cu_tok, *cu_pos, *cu_slot, *cu_tix, *cu_src, *cu_tables;
	unsigned char *cu_want;
	const int **cu_table;
	int *p_pos, *p_tix, *p_tok;  /* per proposing request: last row's position, table, drafts */
	struct dps_req **p_req;      /* TP rank 0: whose */
	float *hin, *hprev, *hout;
	int *d_tok, *d_pos, *d_slot; /* a recurrent pass's rows */
	const int **d_table;
};

/*
 * Header of a step, published by TP rank 0: command (0 run, 1 idle, 2 stop), rows, real rows,
 * prefill, distinct block tables, unfinished requests, pulls and the ints they take (each:
 * source replica, positions, n_src, n_dst, then the source and destination blocks).
 */
enum { H_CMD, H_ROWS, H_REAL, H_PREFILL, H_TABLES, H_UNFINISHED, H_PULLS, H_PULLS_LEN, H_LEN };

/* ---- replica.c ------------------------------------------------------------------------------- */

/* Request r's block table as row nt of tables (bpr columns, zero past its blocks). */
void dps_replica_put_table(const struct replica *R, int *tables, int nt, const struct dps_req *r);
/* TP rank 0: sends the first total bytes of R->wire (its length first) to the replica's peers. */
int dps_replica_wire_push(struct replica *R, size_t total);
/* A peer: receives what wire_push sent into R->wire (at least min bytes); its length in *total. */
int dps_replica_wire_pop(struct replica *R, size_t min, uint32_t *total);
/* TP rank 0: a message to the client; the tokens collected so far to the client. */
int dps_replica_send_up(struct replica *R, const void *msg, size_t len);
int dps_replica_flush_tokens(struct replica *R);

/* ---- handoff.c: disaggregated serving ------------------------------------------------------ */

/* A prefill replica's TP rank 0: tells the client of each request newly handed over. */
int dps_replica_announce_handoffs(struct replica *R);
/* A decode replica's TP rank 0: the batch's pulls into R->pulls, their count into hdr. */
void dps_replica_pack_pulls(struct replica *R, int *hdr);
/* Every rank of a decode replica: copies this step's pulled positions into its cache. */
int dps_replica_run_pulls(struct replica *R, const int *hdr);
/* A decode replica's TP rank 0: whether an adoption's source blocks lie in its prefill
 * replica's cache (1) or not (0: the request is refused, not the instance). */
int dps_replica_adopt_ok(const struct replica *R, int src_replica, const int *src, int n_src);

/* ---- fault.c: test-only fault injection ---------------------------------------------------- */

/*
 * DPSHARD_FAULT, read once at rank start: world rank RANK, about to run its step number STEP
 * (from 0), with spin:RANK:STEP spins for ever without a heartbeat; with wait:RANK:STEP it
 * blocks in a real wait nobody rings. Any other value is refused by name: 0 or -EINVAL.
 */
int dps_replica_fault_parse(struct replica *R);
/* The wait fault: 0 when not due, else what the wait returns (-DPS_EABORT once aborted). */
int dps_replica_fault_maybe_wait(const struct replica *R);
void dps_replica_fault_maybe_spin(const struct replica *R);

/* One line per rank on stderr: its weight bytes per component and layout, and its KV cache. */
void dps_replica_describe(const struct dps_shard *s, const struct dps_world *w);

/* ---- spec.c: speculative decoding ------------------------------------------------------------ */

/*
 * Loads the Eagle3 draft of o->spec_model beside the target R->m (its KV in the target's
 * blocks) and tells the target which hidden states to keep. 0 or a code after a message.
 */
int dps_spec_load(struct replica *R, int max_len, int rows, int block_size);
/* The draft's per-step arrays for rows rows and ns requests. 0 or -ENOMEM. */
int dps_spec_alloc(struct replica *R, int rows, int ns);
void dps_spec_free(struct replica *R);
/*
 * After a target step: the draft's catch-up pass over the positions the step kept, then
 * spec_k - 1 recurrent passes; the proposals go to the requests (TP rank 0). 0 or a code.
 */
int dps_spec_draft_passes(struct replica *R);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/msg.h - the messages between the engine client (in the supervisor) and a
 * replica's TP rank 0, through the rank's rings (engine/runtime/world.h). Down: a request (its
 * header and the prompt, in as many messages as the ring's slots need), a cancellation, a
 * wake-up, the final stop. Up: the sampled tokens (with their log-probabilities for a request
 * that asks for them, M_TOKENS_LP: a request's tokens all go one way, so each request's order
 * holds), a request's end with its finish reason and the time of its first step, the
 * replica's counts (every DPS_ENGINE_STATS_MS and at exit), and "loaded" from every rank.
 * Every field is checked by its reader before use.
 */
#ifndef DPS_ENGINE_SERVE_MSG_H
#define DPS_ENGINE_SERVE_MSG_H

#include <stdint.h>

#include "engine/serve/engine.h"

enum {
	M_REQ = 1, M_REQ_MORE, M_CANCEL, M_WAKE, M_STOP, M_TOKENS, M_DONE, M_STATS, M_READY,
	M_TOKENS_LP,
	/* Disaggregated serving: a prefill replica's request ready to decode (up, its blocks
	 * in as many messages as they need), the client's adoption of it by a decode replica
	 * (down, M_REQ_MORE carrying the rest of its ids then its source blocks), the decode
	 * replica's word that it pulled the positions (up), and the release of the blocks at the
	 * prefill replica (down; also when the request ended before the pull). */
	M_HANDOFF, M_ADOPT, M_PULLED, M_RELEASE
};

#define MSG_BYTES 4096 /* the rings' slot size (engine/runtime/world.c) */

struct m_hdr {
	uint32_t type, count;
	int64_t id;
};

struct m_req {
	struct m_hdr h;        /* count: ids in this message */
	struct dps_req_params p;
	int32_t n_prompt;
	int32_t ids[];
};

struct m_more {
	struct m_hdr h;        /* count: ids in this message */
	int32_t ids[];
};

struct m_tok {
	int64_t id;
	int32_t token, pad;
};

struct m_tokens {
	struct m_hdr h;        /* count: tokens */
	struct m_tok t[];
};

/* A sampled token with its log-probabilities (n_top of top used). */
struct m_tok_lp {
	int64_t id;
	struct dps_token_logprobs lp;
};

struct m_tokens_lp {
	struct m_hdr h;        /* count: tokens */
	struct m_tok_lp t[];
};

struct m_done {
	struct m_hdr h;
	int32_t finish, n_gen;
	uint64_t t_scheduled;  /* CLOCK_MONOTONIC ns of its first step on the replica (0: none);
				* one clock for every process of the machine */
};

struct m_handoff {
	struct m_hdr h;        /* count: blocks in this message */
	int32_t first, total;  /* these are blocks [first, first + count) of total */
	int32_t n_ids, last;   /* the request's tokens now (prompt + 1), the last one sampled */
	int32_t plp_next, pad;
	struct dps_rng rng;
	uint64_t t_scheduled;
	uint64_t deadline_ns;  /* as the prefill replica made it on arrival (absolute; 0: none) */
	int32_t blocks[];
};

struct m_adopt {
	struct m_hdr h;        /* count: ints in this message (ids, then source blocks) */
	struct dps_req_params p; /* deadline_ns: as the prefill replica made it (absolute) */
	int32_t n_ids, n_prompt, n_src, src_replica; /* src_replica: among the prefill ones */
	int32_t plp_next, pad;
	struct dps_rng rng;
	uint64_t t_scheduled;
	int32_t ids[];
};

struct m_stats {
	struct m_hdr h;        /* count: 1 for the final stats */
	int32_t replica, pad;
	struct dps_engine_stats st;
};

_Static_assert(sizeof(struct m_stats) <= MSG_BYTES, "stats fit one ring slot");

#define REQ_IDS ((MSG_BYTES - sizeof(struct m_req)) / sizeof(int32_t))
#define MORE_IDS ((MSG_BYTES - sizeof(struct m_more)) / sizeof(int32_t))
#define TOKS ((MSG_BYTES - sizeof(struct m_tokens)) / sizeof(struct m_tok))
#define TOKS_LP ((MSG_BYTES - sizeof(struct m_tokens_lp)) / sizeof(struct m_tok_lp))
#define HANDOFF_BLOCKS ((MSG_BYTES - sizeof(struct m_handoff)) / sizeof(int32_t))
#define ADOPT_INTS ((MSG_BYTES - sizeof(struct m_adopt)) / sizeof(int32_t))

_Static_assert(TOKS_LP >= 1, "a token with DPS_MAX_LOGPROBS alternatives fits one ring slot");

#endif

/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/sched.h - the scheduler of one DP replica (run by its TP rank 0): requests, the
 * paged KV cache's blocks, continuous batching with chunked prefill, preemption by recompute, and
 * decode buckets. Pure bookkeeping, no I/O: the runner turns each batch into a model step.
 *
 * A step (dps_sched_step) takes, in order: one row for every running request that is
 * decoding, the next chunk of every running request still prefilling, then new requests from
 * the waiting queue (FIFO) while there is room (--max-num-seqs, --max-num-batched-tokens,
 * free blocks). When a running request needs a block and none is free, the newest running
 * request is preempted: its blocks are freed and it goes back to the front of the waiting
 * queue, to be recomputed from its prompt and the tokens it had produced, which it keeps. A
 * batch with no prompt rows is a decode batch, padded to the smallest bucket that holds it
 * (rows feeding token 0 at position 0 into DPS_PAD_SLOT, never sampled); a batch with prompt
 * rows is not padded.
 */
#ifndef DPS_ENGINE_SCHED_H
#define DPS_ENGINE_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "engine/shard/kv.h"
#include "kernels/logits.h"
#include "kernels/logprobs.h"
#include "kernels/sample.h"

#define DPS_MAX_STOP 16 /* 6 of the request, up to 8 of the model (its end ids), and room */
#define DPS_MAX_BUCKETS 32
#define DPS_MAX_SPEC 15 /* --num-speculative-tokens at most */
#define DPS_MAX_BIAS 128 /* logit_bias entries of a request */

/* HANDOFF: prefilled on a prefill replica, its blocks held until the decode side pulls them. */
enum dps_req_state { DPS_REQ_WAITING, DPS_REQ_RUNNING, DPS_REQ_FINISHED, DPS_REQ_HANDOFF };

enum dps_finish {
	DPS_FINISH_NONE, DPS_FINISH_STOP, DPS_FINISH_LENGTH, DPS_FINISH_TIMEOUT,
	DPS_FINISH_CANCELLED, DPS_FINISH_ERROR
};

const char *dps_finish_name(enum dps_finish f);

struct dps_req_params {
	int max_tokens;                 /* tokens to generate at most (>= 1; 0 with
					 * prompt_logprobs or echo: the prefill alone, then "length") */
	int stop[DPS_MAX_STOP], n_stop; /* token ids that end the request (not emitted) */
	struct dps_sampling sampling;   /* seed: the request's own */
	uint64_t deadline_ns;           /* dps_now_ns() after which it ends with "timeout" (0: none) */
	/* vLLM's logits processors (kernels/logits.h), all off when 0: */
	int min_tokens;                 /* the stop ids cannot be sampled before this many tokens */
	struct dps_penalties pen;
	struct dps_logit_bias bias[DPS_MAX_BIAS];
	int n_bias;
	/* Log-probabilities of each sampled token (0: none), and of the top_logprobs likeliest
	 * tokens (0 to DPS_MAX_LOGPROBS): the raw model output's (kernels/logits.h). */
	int want_logprobs, top_logprobs;
	/* With want_logprobs: every prompt token's log-probability after the tokens before it
	 * (positions 1 .. n_prompt - 1) and the top_logprobs likeliest there, sent before the
	 * first sampled token (completions' "echo" with "logprobs"). */
	int prompt_logprobs;
};

struct dps_req {
	uint64_t id;
	struct dps_req_params p;
	int *ids, n_prompt, n_ids;  /* prompt then generated tokens */
	int computed;               /* positions whose K/V are in the cache */
	int *blocks, n_blocks;      /* block table */
	enum dps_req_state state;
	enum dps_finish finish;
	int preempted;              /* times preempted */
	struct dps_rng rng;
	uint64_t seq;               /* admission order, for "newest" */
	uint64_t t_scheduled;       /* dps_now_ns() of its first admission (0: never yet), kept
				     * across preemption: vLLM's scheduled_ts */
	int draft[DPS_MAX_SPEC];    /* target ids the draft proposed after the last token */
	int n_draft;                /* 0, or spec_k when the next step verifies them */
	struct dps_seen seen;       /* with penalties: the tokens of ids, counted */
	struct dps_token_logprobs lp; /* with want_logprobs: the last sampled token's (or, with
				       * lp.prompt set, a prompt token's) */
	int plp_next;               /* with prompt_logprobs: the next prompt position whose entry
				     * is due (from 1), kept across preemption: a recomputed
				     * prefill sends none twice */
	/* Adopted from a prefill replica (dps_sched_adopt): its positions [0, n_ids - 1) are
	 * pulled from that replica's blocks src_blocks[0..n_src) when it is admitted; n_src is
	 * 0 once pulled (a preempted request recomputes, as any other). */
	int src_replica, n_src, *src_blocks;
	int announced;              /* HANDOFF: the replica has told the client */
};

struct dps_sched_cfg {
	int block_size, num_blocks;
	int max_num_seqs, max_model_len, max_batched_tokens;
	int buckets[DPS_MAX_BUCKETS], n_buckets; /* ascending; the last equals max_num_seqs */
	int spec_k;                 /* speculative tokens per decode step (0: no speculation) */
	/* A prefill replica of a disaggregated instance: a request whose prompt is computed and
	 * that sampled its first token goes to HANDOFF instead of decoding here. */
	int handoff;
};

/* One step's rows, as the model takes them (struct dps_rows), plus whose they are. */
struct dps_batch {
	int n, n_real, prefill;
	int *tokens, *pos, *slot;
	const int **table;
	unsigned char *want;
	struct dps_req **req;       /* (n) the request of each row, NULL for padding */
	/*
	 * Speculation: verify[i] marks the first of the 1 + spec_k rows of a request that verifies
	 * its draft (its last token, then the drafted ones; every row wanted). A decoding request
	 * without a draft has 1 row and spec_k padding rows, so a decode batch is always
	 * requests x (1 + spec_k) rows.
	 */
	unsigned char *verify;
	/* Requests admitted this step whose positions must be pulled first (dps_sched_adopt):
	 * every rank of the replica copies them before it runs the rows. */
	struct dps_req **pulls;
	int n_pulls;
};

/* Counts of speculative decoding (vLLM's spec_decode metrics). */
struct dps_spec_stats {
	uint64_t drafts;            /* verifications run */
	uint64_t draft_tokens;      /* tokens drafted and verified */
	uint64_t accepted;          /* of those, accepted */
	uint64_t accepted_pos[DPS_MAX_SPEC]; /* accepted at draft position j */
};

/*
 * Speculation: what the draft runs after a step (dps_sched_update fills it). Catch-up rows:
 * for every request still running, each position the step fed and kept, with the token that
 * follows it (the draft at position p reads the target's hidden state at p and token p + 1);
 * row[k] is the step's row whose hidden states it reads. want[k] marks a request's last row
 * when the request is decoding and may be drafted (dps_sched_reserve_draft): its output
 * starts the draft's spec_k proposals.
 */
struct dps_catchup {
	int n, n_prop;
	int *row, *token, *pos, *slot;
	unsigned char *want;
	struct dps_req **req;
};

struct dps_sched {
	struct dps_sched_cfg cfg;
	struct dps_kv_pool kv;      /* the KV cache's free blocks */
	struct dps_req **waiting, **running;
	int n_waiting, n_running, cap;
	uint64_t admitted;
	uint64_t preemptions;
	struct dps_batch b;
	struct dps_spec_stats spec;
	struct dps_catchup cu;
	float *raw;                 /* (raw_cap) a row's logits before processing, for logprobs */
	int raw_cap;
	/* HANDOFF requests (cfg.handoff), their blocks held until dps_sched_release. */
	struct dps_req **handoff;
	int n_handoff, cap_handoff;
};

/*
 * Default buckets: powers of two below max_num_seqs, then max_num_seqs. spec (may be NULL or
 * "") is a comma list such as "1,2,4,8"; it must ascend and end at max_num_seqs. Returns 0 or
 * -EINVAL with a message.
 */
int dps_sched_buckets(struct dps_sched_cfg *cfg, const char *spec, char *err, size_t errlen);

/* The bucket a decode batch of n rows is padded to (vLLM's get_decode_padded_batch_size). */
int dps_sched_bucket(const struct dps_sched_cfg *cfg, int n);

int dps_sched_init(struct dps_sched *s, const struct dps_sched_cfg *cfg, char *err, size_t errlen);
void dps_sched_free(struct dps_sched *s);

/*
 * Queues a request (prompt of n tokens, copied). Returns it, or NULL with -EINVAL (a prompt
 * that is empty or does not leave room to generate within max_model_len, or a bad
 * parameter) or -ENOMEM in *rc.
 */
struct dps_req *dps_sched_add(struct dps_sched *s, uint64_t id, const int *prompt, int n,
			      const struct dps_req_params *p, int *rc);

/* Ends a request now (cancel): frees its blocks. It is reported by the next dps_sched_step. */
void dps_sched_cancel(struct dps_sched *s, struct dps_req *r);

/*
 * Builds the next batch (s->b) at time now_ns: requests past their deadline end with
 * "timeout". Returns the number of rows (0: nothing to run).
 */
int dps_sched_step(struct dps_sched *s, uint64_t now_ns);

/*
 * After the model ran s->b: samples the next token of every wanted row from logits (packed,
 * vocab floats per wanted row; modified) after the request's logits processors (min_tokens,
 * logit_bias, penalties: vLLM's order), appends it, and ends requests that hit a stop
 * token, max_tokens or max_model_len. eos (< 0: none) ends a request like a stop token.
 * A request with want_logprobs gets, before emit, req->lp: the log-softmax of the row as the
 * model gave it (vLLM V1's raw_logprobs) at the token and its top_logprobs likeliest.
 * For every sampled token calls emit(arg, req, token) (not for stop tokens); with
 * prompt_logprobs, first emit(arg, req, prompt token) with req->lp.prompt set for every prompt
 * position from 1 on, in order, each once (such a token is not appended); and for every
 * request that ended (including cancelled and timed-out ones) done(arg, req); the request is
 * freed after done returns. scratch: vocab ints.
 */
void dps_sched_update(struct dps_sched *s, float *logits, int vocab, int eos, int *scratch,
		      void (*emit)(void *arg, struct dps_req *r, int token),
		      void (*done)(void *arg, struct dps_req *r), void *arg);

/*
 * Speculation, after dps_sched_update: whether request r (running, decoding) may be drafted
 * for the next step: its verification must stay inside max_model_len; the blocks for it are
 * reserved now (0: yes, blocks held; -1: no, the next step decodes it plainly).
 */
int dps_sched_reserve_draft(struct dps_sched *s, struct dps_req *r);

/*
 * Disaggregated serving, the decode side: queues a request prefilled elsewhere: ids[0..n_ids)
 * (its prompt of n_prompt, then the tokens it sampled there, at least one), its sampler's
 * state, the prompt-logprob position due next and its first admission time, and where its
 * positions [0, n_ids - 1) are: prefill replica src_replica's blocks src[0..n_src). When it
 * is admitted the batch lists it in pulls (the runner copies them), and it decodes from
 * there. Returns it, or NULL with *rc as dps_sched_add's.
 */
struct dps_req *dps_sched_adopt(struct dps_sched *s, uint64_t id, const int *ids, int n_ids,
				int n_prompt, const struct dps_req_params *p,
				const struct dps_rng *rng, int plp_next, uint64_t t_scheduled,
				int src_replica, const int *src, int n_src, int *rc);

/* The prefill side: request id in HANDOFF (NULL: none such). */
struct dps_req *dps_sched_handoff_find(struct dps_sched *s, uint64_t id);

/* The prefill side: frees a HANDOFF request and its blocks (the decode side has them, or
 * the request ended). */
void dps_sched_release(struct dps_sched *s, struct dps_req *r);

/* Requests waiting or running. */
static inline int dps_sched_pending(const struct dps_sched *s)
{
	return s->n_waiting + s->n_running;
}

#endif

/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/sched.c - the per-replica scheduler (see sched.h). Called by the replica loop
 * (replica.c) on a replica's TP rank 0, once per step, and by tests/check_sched.c.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/serve/sched.h"
#include "engine/shard/shard.h"

static const char *const finish_names[] = { "", "stop", "length", "timeout", "cancelled",
					    "error" };

const char *dps_finish_name(enum dps_finish f)
{
	return (unsigned)f < sizeof(finish_names) / sizeof(finish_names[0]) ? finish_names[f] : "?";
}

int dps_sched_buckets(struct dps_sched_cfg *cfg, const char *spec, char *err, size_t errlen)
{
	cfg->n_buckets = 0;
	if (!spec || !*spec) {
		for (int b = 1; b < cfg->max_num_seqs && cfg->n_buckets < DPS_MAX_BUCKETS - 1; b *= 2)
			cfg->buckets[cfg->n_buckets++] = b;
		cfg->buckets[cfg->n_buckets++] = cfg->max_num_seqs;
		return 0;
	}
	while (*spec) {
		char *end;
		long v = strtol(spec, &end, 10);

		if (end == spec || v < 1 || v > cfg->max_num_seqs || (*end && *end != ',') ||
		    cfg->n_buckets == DPS_MAX_BUCKETS ||
		    (cfg->n_buckets && v <= cfg->buckets[cfg->n_buckets - 1])) {
			snprintf(err, errlen, "--decode-buckets: expected ascending sizes from 1 to "
				 "--max-num-seqs %d, at most %d of them", cfg->max_num_seqs,
				 DPS_MAX_BUCKETS);
			return -EINVAL;
		}
		cfg->buckets[cfg->n_buckets++] = (int)v;
		spec = *end ? end + 1 : end;
	}
	if (!cfg->n_buckets || cfg->buckets[cfg->n_buckets - 1] != cfg->max_num_seqs) {
		snprintf(err, errlen, "--decode-buckets: the largest bucket must equal --max-num-seqs "
			 "%d", cfg->max_num_seqs);
		return -EINVAL;
	}
	return 0;
}

int dps_sched_bucket(const struct dps_sched_cfg *cfg, int n)
{
	for (int i = 0; i < cfg->n_buckets; i++)
		if (cfg->buckets[i] >= n)
			return cfg->buckets[i];
	return cfg->buckets[cfg->n_buckets - 1];
}

int dps_sched_init(struct dps_sched *s, const struct dps_sched_cfg *cfg, char *err, size_t errlen)
{
	const int rows = cfg->max_batched_tokens + cfg->max_num_seqs * (1 + cfg->spec_k);
	int rc;

	memset(s, 0, sizeof(*s));
	s->cfg = *cfg;
	if (cfg->block_size < 1 || cfg->num_blocks < 1 || cfg->max_num_seqs < 1 ||
	    cfg->max_model_len < 2 || cfg->max_batched_tokens < 1 || cfg->n_buckets < 1 ||
	    (long)cfg->num_blocks * cfg->block_size < cfg->max_model_len ||
	    cfg->max_batched_tokens < cfg->max_num_seqs || cfg->spec_k < 0 ||
	    cfg->spec_k > DPS_MAX_SPEC) {
		if (cfg->spec_k < 0 || cfg->spec_k > DPS_MAX_SPEC) {
			snprintf(err, errlen, "--num-speculative-tokens %d is outside [0, %d]",
				 cfg->spec_k, DPS_MAX_SPEC);
			return -EINVAL;
		}
		if (cfg->max_batched_tokens < cfg->max_num_seqs && cfg->max_batched_tokens >= 1) {
			snprintf(err, errlen, "--max-num-batched-tokens %d is less than --max-num-seqs "
				 "%d: some running requests would get no decode row in a step",
				 cfg->max_batched_tokens, cfg->max_num_seqs);
			return -EINVAL;
		}
		snprintf(err, errlen, "the KV cache (%d blocks of %d positions) must hold one request "
			 "of --max-model-len %d", cfg->num_blocks, cfg->block_size,
			 cfg->max_model_len);
		return -EINVAL;
	}
	s->cap = cfg->max_num_seqs + 64;
	rc = dps_kv_pool_init(&s->kv, cfg->num_blocks);
	s->waiting = malloc(sizeof(*s->waiting) * (size_t)s->cap);
	s->running = malloc(sizeof(*s->running) * (size_t)cfg->max_num_seqs);
	s->b.tokens = calloc((size_t)rows, sizeof(int));
	s->b.pos = calloc((size_t)rows, sizeof(int));
	s->b.slot = calloc((size_t)rows, sizeof(int));
	s->b.table = calloc((size_t)rows, sizeof(*s->b.table));
	s->b.want = calloc((size_t)rows, 1);
	s->b.req = calloc((size_t)rows, sizeof(*s->b.req));
	s->b.verify = calloc((size_t)rows, 1);
	s->b.pulls = calloc((size_t)cfg->max_num_seqs, sizeof(*s->b.pulls));
	if (cfg->spec_k) {
		s->cu.row = calloc((size_t)rows, sizeof(int));
		s->cu.token = calloc((size_t)rows, sizeof(int));
		s->cu.pos = calloc((size_t)rows, sizeof(int));
		s->cu.slot = calloc((size_t)rows, sizeof(int));
		s->cu.want = calloc((size_t)rows, 1);
		s->cu.req = calloc((size_t)rows, sizeof(*s->cu.req));
		if (!s->cu.row || !s->cu.token || !s->cu.pos || !s->cu.slot || !s->cu.want ||
		    !s->cu.req)
			s->b.verify = (free(s->b.verify), NULL);
	}
	if (rc || !s->waiting || !s->running || !s->b.tokens || !s->b.pos || !s->b.pulls ||
	    !s->b.slot || !s->b.table || !s->b.want || !s->b.req || !s->b.verify) {
		dps_sched_free(s);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

static void req_free(struct dps_req *r)
{
	dps_seen_free(&r->seen);
	free(r->src_blocks);
	free(r->ids);
	free(r->blocks);
	free(r);
}

void dps_sched_free(struct dps_sched *s)
{
	for (int i = 0; i < s->n_waiting; i++)
		req_free(s->waiting[i]);
	for (int i = 0; i < s->n_running; i++)
		req_free(s->running[i]);
	for (int i = 0; i < s->n_handoff; i++)
		req_free(s->handoff[i]);
	free(s->handoff);
	free(s->b.pulls);
	dps_kv_pool_free(&s->kv);
	free(s->raw);
	free(s->waiting);
	free(s->running);
	free(s->b.tokens);
	free(s->b.pos);
	free(s->b.slot);
	free(s->b.table);
	free(s->b.want);
	free(s->b.req);
	free(s->b.verify);
	free(s->cu.row);
	free(s->cu.token);
	free(s->cu.pos);
	free(s->cu.slot);
	free(s->cu.want);
	free(s->cu.req);
	memset(s, 0, sizeof(*s));
}

struct dps_req *dps_sched_add(struct dps_sched *s, uint64_t id, const int *prompt, int n,
			      const struct dps_req_params *p, int *rc)
{
	struct dps_req *r;

	*rc = -EINVAL;
	if (n < 1 || n >= s->cfg.max_model_len || p->max_tokens < 0 || p->n_stop < 0 ||
	    (p->prompt_logprobs && !p->want_logprobs) ||
	    p->n_stop > DPS_MAX_STOP || p->min_tokens < 0 || p->n_bias < 0 ||
	    p->n_bias > DPS_MAX_BIAS || !(p->pen.repetition >= 0.0f) ||
	    !(fabsf(p->pen.presence) <= 2.0f) || !(fabsf(p->pen.frequency) <= 2.0f) ||
	    !(p->sampling.min_p >= 0.0f && p->sampling.min_p <= 1.0f))
		return NULL;
	/* Room for every running request to be preempted back into the queue as well. */
	if (s->n_waiting + s->cfg.max_num_seqs + 1 >= s->cap) {
		struct dps_req **w = realloc(s->waiting, sizeof(*w) * (size_t)s->cap * 2);

		*rc = -ENOMEM;
		if (!w)
			return NULL;
		s->waiting = w;
		s->cap *= 2;
	}
	r = calloc(1, sizeof(*r));
	*rc = -ENOMEM;
	if (!r)
		return NULL;
	r->ids = malloc(sizeof(int) * ((size_t)s->cfg.max_model_len + 1));
	r->blocks = malloc(sizeof(int) * ((size_t)s->cfg.max_model_len / (size_t)s->cfg.block_size + 2));
	if (!r->ids || !r->blocks) {
		req_free(r);
		return NULL;
	}
	r->id = id;
	r->p = *p;
	/* The repetition penalty reads the prompt's tokens too. */
	for (int i = 0; i < n && dps_penalties_on(&p->pen); i++)
		if (dps_seen_add(&r->seen, prompt[i], 0)) {
			req_free(r);
			return NULL;
		}
	memcpy(r->ids, prompt, sizeof(int) * (size_t)n);
	r->n_prompt = r->n_ids = n;
	r->plp_next = 1;
	r->state = DPS_REQ_WAITING;
	dps_rng_seed(&r->rng, p->sampling.seed);
	s->waiting[s->n_waiting++] = r;
	*rc = 0;
	return r;
}

static void release_blocks(struct dps_sched *s, struct dps_req *r)
{
	for (int i = 0; i < r->n_blocks; i++)
		dps_kv_pool_give(&s->kv, r->blocks[i]);
	r->n_blocks = 0;
	r->computed = 0;
	r->n_draft = 0;
}

static void remove_from(struct dps_req **list, int *n, struct dps_req *r)
{
	for (int i = 0; i < *n; i++)
		if (list[i] == r) {
			memmove(list + i, list + i + 1, sizeof(*list) * (size_t)(*n - i - 1));
			(*n)--;
			return;
		}
}

/* Finished requests stay in their list, marked, until dps_sched_update reports them. */
static void finish(struct dps_sched *s, struct dps_req *r, enum dps_finish why)
{
	if (r->state == DPS_REQ_FINISHED)
		return;
	release_blocks(s, r);
	r->finish = why;
	r->state = DPS_REQ_FINISHED;
}

void dps_sched_cancel(struct dps_sched *s, struct dps_req *r)
{
	finish(s, r, DPS_FINISH_CANCELLED);
}

/* Moves the newest running request back to the front of the waiting queue. */
static void preempt_newest(struct dps_sched *s)
{
	struct dps_req *r = NULL;

	for (int i = 0; i < s->n_running; i++)
		if (s->running[i]->state == DPS_REQ_RUNNING && (!r || s->running[i]->seq > r->seq))
			r = s->running[i];
	if (!r)
		return;
	release_blocks(s, r);
	remove_from(s->running, &s->n_running, r);
	r->state = DPS_REQ_WAITING;
	r->preempted++;
	s->preemptions++;
	DPS_ASSERT(s->n_waiting < s->cap); /* dps_sched_add keeps max_num_seqs slots spare */
	memmove(s->waiting + 1, s->waiting, sizeof(*s->waiting) * (size_t)s->n_waiting);
	s->waiting[0] = r;
	s->n_waiting++;
}

/* Gives r blocks for positions [0, upto); 0, or -1 when none are free. */
static int grow(struct dps_sched *s, struct dps_req *r, int upto)
{
	const int need = (upto + s->cfg.block_size - 1) / s->cfg.block_size;

	while (r->n_blocks < need) {
		const int b = dps_kv_pool_take(&s->kv);

		if (b < 0)
			return -1;
		r->blocks[r->n_blocks++] = b;
	}
	return 0;
}

/* A row that writes nothing and is never sampled. */
static void pad_row(struct dps_batch *b)
{
	b->tokens[b->n] = 0;
	b->pos[b->n] = 0;
	b->slot[b->n] = DPS_PAD_SLOT;
	b->table[b->n] = NULL;
	b->want[b->n] = 0;
	b->req[b->n] = NULL;
	b->verify[b->n] = 0;
	b->n++;
}

/*
 * A decoding request with speculation: its last token then its spec_k drafted tokens (every
 * row wanted, the first marked verify), or its last token and spec_k padding rows.
 */
static void add_spec_rows(struct dps_sched *s, struct dps_req *r)
{
	struct dps_batch *b = &s->b;
	const int bs = s->cfg.block_size, K = s->cfg.spec_k, p0 = r->computed;
	const int drafted = r->n_draft == K && grow(s, r, p0 + 1 + K) == 0;

	r->n_draft = 0;
	b->tokens[b->n] = r->ids[p0];
	b->pos[b->n] = p0;
	b->slot[b->n] = dps_kv_slot(r->blocks, bs, p0);
	b->table[b->n] = r->blocks;
	b->want[b->n] = 1;
	b->req[b->n] = r;
	b->verify[b->n] = (unsigned char)drafted;
	b->n++;
	for (int j = 1; j <= K; j++) {
		const int p = p0 + j;

		if (!drafted) {
			pad_row(b);
			continue;
		}
		b->tokens[b->n] = r->draft[j - 1];
		b->pos[b->n] = p;
		b->slot[b->n] = dps_kv_slot(r->blocks, bs, p);
		b->table[b->n] = r->blocks;
		b->want[b->n] = 1;
		b->req[b->n] = r;
		b->verify[b->n] = 0;
		b->n++;
	}
	r->computed = p0 + 1;
}

/*
 * Whether the logits of r's row at position p are wanted: the last one's to sample from, and
 * with prompt_logprobs those of every prompt position whose next token's entry is still due
 * (not again after a preemption: plp_next only grows).
 */
static int row_wanted(const struct dps_req *r, int p)
{
	return p == r->n_ids - 1 ||
	       (r->p.prompt_logprobs && p + 1 < r->n_prompt && p + 1 >= r->plp_next);
}

/* Appends rows for r's positions [computed, computed + take). */
static void add_rows(struct dps_sched *s, struct dps_req *r, int take)
{
	struct dps_batch *b = &s->b;
	const int bs = s->cfg.block_size;

	for (int t = 0; t < take; t++) {
		const int p = r->computed + t;

		b->tokens[b->n] = r->ids[p];
		b->pos[b->n] = p;
		b->slot[b->n] = dps_kv_slot(r->blocks, bs, p);
		b->table[b->n] = r->blocks;
		b->want[b->n] = (unsigned char)row_wanted(r, p);
		b->req[b->n] = r;
		b->verify[b->n] = 0;
		/* A row before the last is a prompt (or recomputed) row, wanted or not. */
		if (p != r->n_ids - 1)
			b->prefill = 1;
		b->n++;
	}
	r->computed += take;
}

int dps_sched_step(struct dps_sched *s, uint64_t now_ns)
{
	struct dps_batch *b = &s->b;
	int budget = s->cfg.max_batched_tokens;
	const uint64_t preempted_before = s->preemptions;

	b->n = b->n_real = b->prefill = b->n_pulls = 0;
	for (int i = 0; i < s->n_running; i++)
		if (s->running[i]->p.deadline_ns && now_ns > s->running[i]->p.deadline_ns)
			finish(s, s->running[i], DPS_FINISH_TIMEOUT);
	for (int i = 0; i < s->n_waiting; i++)
		if (s->waiting[i]->p.deadline_ns && now_ns > s->waiting[i]->p.deadline_ns)
			finish(s, s->waiting[i], DPS_FINISH_TIMEOUT);
	/* Running requests, oldest first: decode rows, then the next chunk of prompts. */
	for (int i = 0; i < s->n_running && budget > 0; i++) {
		struct dps_req *r = s->running[i];
		int need, take;

		if (r->state != DPS_REQ_RUNNING)
			continue;
		need = r->n_ids - r->computed;
		take = need < budget ? need : budget;
		while (take > 0 && grow(s, r, r->computed + take)) {
			/* No block: preempt the newest running request (perhaps r itself). */
			const uint64_t mine = r->seq;
			int newest = 1;

			for (int k = 0; k < s->n_running; k++)
				if (s->running[k]->state == DPS_REQ_RUNNING && s->running[k]->seq > mine)
					newest = 0;
			preempt_newest(s);
			if (newest) {
				take = 0;
				i--; /* r left the running list */
			}
		}
		if (take <= 0)
			continue;
		if (s->cfg.spec_k && need == 1)
			add_spec_rows(s, r); /* the spec_k extra rows are not counted in the budget */
		else
			add_rows(s, r, take);
		budget -= take;
	}
	/* Then new requests, first come first served, while they fit; none in a step that had to
	 * preempt (the blocks are short: readmitting would only recompute and preempt again). */
	for (int j = 0; j < s->n_waiting && budget > 0 && s->n_running < s->cfg.max_num_seqs &&
			s->preemptions == preempted_before;) {
		struct dps_req *r = s->waiting[j];
		int take;

		if (r->state == DPS_REQ_FINISHED) { /* reported and removed by dps_sched_update */
			j++;
			continue;
		}
		/* adopted: its positions arrive by the pull, it decodes at once */
		take = r->n_src ? 1 : r->n_ids < budget ? r->n_ids : budget;
		if (grow(s, r, r->n_src ? r->n_ids : take)) {
			release_blocks(s, r);
			break;
		}
		if (r->n_src) {
			r->computed = r->n_ids - 1;
			b->pulls[b->n_pulls++] = r;
		}
		remove_from(s->waiting, &s->n_waiting, r);
		r->state = DPS_REQ_RUNNING;
		r->seq = ++s->admitted;
		if (!r->t_scheduled) /* one clock read per request, not per step */
			r->t_scheduled = dps_now_ns();
		s->running[s->n_running++] = r;
		add_rows(s, r, take);
		budget -= take;
	}
	b->n_real = b->n;
	if (b->n && b->prefill && s->cfg.spec_k) {
		/* The prefill graph is not bucketed: drop the padding rows of undrafted requests. */
		int m = 0;

		for (int i = 0; i < b->n; i++)
			if (b->req[i]) {
				b->tokens[m] = b->tokens[i];
				b->pos[m] = b->pos[i];
				b->slot[m] = b->slot[i];
				b->table[m] = b->table[i];
				b->want[m] = b->want[i];
				b->req[m] = b->req[i];
				b->verify[m] = b->verify[i];
				m++;
			}
		b->n = b->n_real = m;
	}
	if (b->n && !b->prefill) {
		/* Buckets count requests; with speculation each has 1 + spec_k rows (a one-token
		 * prompt's first row has 1: round up). */
		const int per = 1 + s->cfg.spec_k;
		const int bucket = dps_sched_bucket(&s->cfg, (b->n + per - 1) / per) * per;

		while (b->n < bucket)
			pad_row(b);
	}
	return b->n;
}

/* The draft's catch-up rows after a step (struct dps_catchup). */
static void catch_up(struct dps_sched *s)
{
	const struct dps_batch *b = &s->b;
	struct dps_catchup *cu = &s->cu;

	for (int i = 0; i < b->n;) {
		struct dps_req *r = b->req[i];
		const int i0 = i;

		if (!r) {
			i++;
			continue;
		}
		while (i < b->n && b->req[i] == r) /* a request's rows follow each other */
			i++;
		if (r->state != DPS_REQ_RUNNING)
			continue;
		for (int p = b->pos[i0]; p < r->computed && i0 + p - b->pos[i0] < i; p++) {
			const int k = cu->n++;

			cu->row[k] = i0 + p - b->pos[i0];
			cu->token[k] = r->ids[p + 1];
			cu->pos[k] = p;
			cu->slot[k] = b->slot[cu->row[k]];
			cu->req[k] = r;
			cu->want[k] = 0;
		}
		if (cu->n && cu->req[cu->n - 1] == r && dps_sched_reserve_draft(s, r) == 0) {
			cu->want[cu->n - 1] = 1;
			cu->n_prop++;
		}
	}
}

int dps_sched_reserve_draft(struct dps_sched *s, struct dps_req *r)
{
	const int K = s->cfg.spec_k;

	r->n_draft = 0;
	/* (a prefill replica proposes nothing: its requests leave after their first token, which
	 * a verification would outrun; its draft still catches up, for the decode side) */
	if (!K || s->cfg.handoff || r->state != DPS_REQ_RUNNING || r->computed != r->n_ids - 1)
		return -1;
	/* The verification feeds positions computed .. computed + K. */
	if (r->computed + K >= s->cfg.max_model_len)
		return -1;
	return grow(s, r, r->computed + 1 + K);
}

static void reap(struct dps_sched *s, struct dps_req **list, int *n,
		 void (*done)(void *, struct dps_req *), void *arg)
{
	for (int i = 0; i < *n;) {
		struct dps_req *r = list[i];

		if (r->state != DPS_REQ_FINISHED) {
			i++;
			continue;
		}
		remove_from(list, n, r);
		if (done)
			done(arg, r);
		req_free(r);
	}
	(void)s;
}

/* Appends a sampled token to r (or ends r on a stop token); 1 while r keeps running. */
static int append(struct dps_sched *s, struct dps_req *r, int token, int eos,
		  void (*emit)(void *arg, struct dps_req *r, int token), void *arg)
{
	int stop = token == eos;

	for (int k = 0; k < r->p.n_stop; k++)
		stop |= token == r->p.stop[k];
	if (stop) {
		finish(s, r, DPS_FINISH_STOP);
		return 0;
	}
	if (dps_penalties_on(&r->p.pen) && dps_seen_add(&r->seen, token, 1)) {
		finish(s, r, DPS_FINISH_ERROR); /* out of memory: the penalties would be wrong */
		return 0;
	}
	r->ids[r->n_ids++] = token;
	if (emit)
		emit(arg, r, token);
	if (r->n_ids - r->n_prompt >= r->p.max_tokens || r->n_ids >= s->cfg.max_model_len) {
		finish(s, r, DPS_FINISH_LENGTH);
		return 0;
	}
	return 1;
}

/*
 * vLLM's logits processors on the row r samples from next, in its order (sampler.py): the stop
 * ids (and eos) masked while fewer than min_tokens were generated, logit_bias, the penalties.
 * A request without them is not touched: its tokens stay what they were before these existed.
 */
static void process(const struct dps_req *r, float *row, int vocab, int eos)
{
	const struct dps_req_params *p = &r->p;

	if (p->min_tokens && r->n_ids - r->n_prompt < p->min_tokens) {
		dps_logits_mask(row, vocab, p->stop, p->n_stop);
		dps_logits_mask(row, vocab, &eos, 1);
	}
	if (p->n_bias)
		dps_logits_bias(row, vocab, p->bias, p->n_bias);
	if (dps_penalties_on(&p->pen))
		dps_logits_penalize(row, vocab, &p->pen, &r->seen);
}

/*
 * With want_logprobs, keeps row (vocab floats) as the model gave it, before the logits
 * processors and the sampler change it in place: 0, or -ENOMEM (the request then fails).
 */
static int keep_raw(struct dps_sched *s, const struct dps_req *r, const float *row, int vocab)
{
	if (!r->p.want_logprobs)
		return 0;
	if (s->raw_cap < vocab) {
		float *p = realloc(s->raw, sizeof(float) * (size_t)vocab);

		if (!p)
			return -ENOMEM;
		s->raw = p;
		s->raw_cap = vocab;
	}
	memcpy(s->raw, row, sizeof(float) * (size_t)vocab);
	return 0;
}

/* r->lp for token, from the row keep_raw kept. */
static void raw_logprobs(struct dps_sched *s, struct dps_req *r, int vocab, int token)
{
	if (r->p.want_logprobs)
		dps_logprobs(s->raw, vocab, token, r->p.top_logprobs, &r->lp);
}

/*
 * The 1 + K logits rows of a verification: row j is the target's distribution after the
 * request's last token and drafts 1..j. Drafts are accepted in order while the target agrees
 * (dps_sample_verify); the first disagreement emits the target's own token there, and when
 * all K agree row K gives a bonus token. The positions of rejected drafts become free again:
 * computed stops after the last accepted one, and the next step overwrites them.
 */
static void verify(struct dps_sched *s, struct dps_req *r, float *lg, int vocab, int eos,
		   int *scratch, void (*emit)(void *arg, struct dps_req *r, int token), void *arg)
{
	const int K = s->cfg.spec_k, p0 = r->computed - 1;
	int token, j;

	s->spec.drafts++;
	s->spec.draft_tokens += (uint64_t)K;
	for (j = 0; j <= K; j++) {
		float *row = lg + (size_t)j * (size_t)vocab;
		int ok = 0;

		/* Row j follows the accepted drafts 1..j, appended (and counted) already. */
		if (keep_raw(s, r, row, vocab)) {
			finish(s, r, DPS_FINISH_ERROR);
			return;
		}
		process(r, row, vocab, eos);
		if (j < K) {
			ok = dps_sample_verify(row, vocab, &r->p.sampling, &r->rng, r->draft[j],
					       scratch, &token);
			if (ok) {
				s->spec.accepted++;
				s->spec.accepted_pos[j]++;
			}
		} else {
			token = dps_sample(row, vocab, &r->p.sampling, &r->rng, scratch);
		}
		raw_logprobs(s, r, vocab, token);
		if (!append(s, r, token, eos, emit, arg))
			return;
		if (!ok)
			break;
	}
	/* Positions p0 .. p0 + accepted hold tokens of the sequence now. */
	r->computed = p0 + 1 + j;
}

/* r into the HANDOFF list; 0, or -ENOMEM. */
static int handoff_push(struct dps_sched *s, struct dps_req *r)
{
	if (s->n_handoff == s->cap_handoff) {
		const int cap = s->cap_handoff ? 2 * s->cap_handoff : 16;
		struct dps_req **h = realloc(s->handoff, sizeof(*h) * (size_t)cap);

		if (!h)
			return -ENOMEM;
		s->handoff = h;
		s->cap_handoff = cap;
	}
	r->state = DPS_REQ_HANDOFF;
	r->announced = 0;
	s->handoff[s->n_handoff++] = r;
	return 0;
}

struct dps_req *dps_sched_handoff_find(struct dps_sched *s, uint64_t id)
{
	for (int i = 0; i < s->n_handoff; i++)
		if (s->handoff[i]->id == id)
			return s->handoff[i];
	return NULL;
}

void dps_sched_release(struct dps_sched *s, struct dps_req *r)
{
	release_blocks(s, r);
	remove_from(s->handoff, &s->n_handoff, r);
	req_free(r);
}

void dps_sched_update(struct dps_sched *s, float *logits, int vocab, int eos, int *scratch,
		      void (*emit)(void *arg, struct dps_req *r, int token),
		      void (*done)(void *arg, struct dps_req *r), void *arg)
{
	struct dps_batch *b = &s->b;

	for (int i = 0, o = 0; i < b->n && logits; i++) {
		struct dps_req *r = b->req[i];
		float *row;
		int token;

		if (!b->want[i])
			continue;
		o++;
		if (!r || r->state != DPS_REQ_RUNNING)
			continue;
		if (b->verify[i]) {
			verify(s, r, logits + (size_t)(o - 1) * (size_t)vocab, vocab, eos, scratch,
			       emit, arg);
			i += s->cfg.spec_k;
			o += s->cfg.spec_k;
			continue;
		}
		row = logits + (size_t)(o - 1) * (size_t)vocab;
		if (b->pos[i] != r->n_ids - 1) {
			/* A prompt position's row: the next prompt token's entry, from the raw row. */
			const int p = b->pos[i];

			DPS_ASSERT(r->p.prompt_logprobs && p + 1 == r->plp_next);
			dps_logprobs(row, vocab, r->ids[p + 1], r->p.top_logprobs, &r->lp);
			r->lp.prompt = 1;
			r->plp_next = p + 2;
			if (emit)
				emit(arg, r, r->ids[p + 1]);
			continue;
		}
		if (r->p.max_tokens == 0) { /* the prompt alone ("echo" with "max_tokens": 0) */
			finish(s, r, DPS_FINISH_LENGTH);
			continue;
		}
		if (keep_raw(s, r, row, vocab)) {
			finish(s, r, DPS_FINISH_ERROR);
			continue;
		}
		process(r, row, vocab, eos);
		token = dps_sample(row, vocab, &r->p.sampling, &r->rng, scratch);
		raw_logprobs(s, r, vocab, token);
		append(s, r, token, eos, emit, arg);
	}
	s->cu.n = s->cu.n_prop = 0;
	if (s->cfg.spec_k && logits)
		catch_up(s);
	b->n = 0;
	/* A prefill replica hands every request that is ready to decode over (its blocks held). */
	for (int i = 0; s->cfg.handoff && i < s->n_running;) {
		struct dps_req *r = s->running[i];

		if (r->state != DPS_REQ_RUNNING || r->computed != r->n_ids - 1 ||
		    r->n_ids == r->n_prompt) {
			i++;
			continue;
		}
		if (handoff_push(s, r)) { /* out of memory: it ends in error, reported below */
			finish(s, r, DPS_FINISH_ERROR);
			i++;
			continue;
		}
		remove_from(s->running, &s->n_running, r);
	}
	reap(s, s->running, &s->n_running, done, arg);
	reap(s, s->waiting, &s->n_waiting, done, arg);
}

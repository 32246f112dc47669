/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/client.c - the engine client in the supervisor (see engine.h): the load
 * balancer, requests sent whole to their replica's ring, tokens and ends coming back, and the
 * stop once the client is closed and idle. Called by generate and serve from the supervisor's
 * loop (its message and tick hooks).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/supervisor.h"
#include "engine/serve/msg.h"

struct creq {
	int64_t id;
	int replica, started, finished, sent_all;
	int *prompt, n_prompt, sent;   /* prompt ids sent so far */
	struct dps_req_params p;
	void *user;
	int n_gen;
	/* Disaggregated: the hand-off as the prefill replica told it (blocks gathered over its
	 * messages), the adoption being sent (adopting; ints of it sent so far), whether the
	 * prefill replica prefill_rep still holds the blocks (held: a release is due), and
	 * whether a cancellation went to the prefill side. */
	int *hblocks, n_hblocks, hand_total, hand_last, hand_nids, plp_next;
	struct dps_rng rng;
	uint64_t t_scheduled;
	int adopting, adopt_sent, held, prefill_rep, cancel_sent;
	int decode_rep;                /* the decode replica the request named (-1: any) */
};

struct release { /* an M_RELEASE due */
	int64_t id;
	int replica;
};

struct dps_engine_client {
	int dp, tp;
	int pdp, ptp, n_rep;       /* prefill replicas (0: none) and their TP; dp + pdp */
	int64_t *adopt_q;          /* requests whose adoption is due, in order */
	int n_adopt, cap_adopt;
	struct release *rel;       /* releases due */
	int n_rel, cap_rel;
	struct dps_engine_cb cb;
	struct creq *reqs;
	int n, cap;
	int64_t next_id;
	int *waiting, *running;    /* per replica */
	uint64_t *sent;
	int rotate, closing, stopped, outstanding;
	int64_t *cancels;
	int n_cancels, cap_cancels;
	int *wake;                 /* replicas to wake (coupled engines sleep together) */
	unsigned char *blocked;    /* per replica, this tick: its ring was full */
	int first_unsent;          /* requests before it are all sent or finished */
	int64_t base;              /* the id of reqs[0]: finished requests are dropped in front */
	int n_ready;               /* ranks that reported the model loaded */
	int coupled;               /* the replicas step together (a rank said so when loaded) */
};

int dps_engine_client_new(struct dps_engine_client **out, int dp, int tp,
			  const struct dps_engine_cb *cb)
{
	struct dps_engine_client *c = calloc(1, sizeof(*c));

	*out = NULL;
	if (!c)
		return -ENOMEM;
	c->dp = dp;
	c->tp = tp;
	c->n_rep = dp;
	c->cb = *cb;
	c->waiting = calloc((size_t)dp, sizeof(int));
	c->running = calloc((size_t)dp, sizeof(int));
	c->sent = calloc((size_t)dp, sizeof(uint64_t));
	c->wake = calloc((size_t)dp, sizeof(int));
	c->blocked = calloc((size_t)dp, 1);
	if (!c->waiting || !c->running || !c->sent || !c->wake || !c->blocked) {
		dps_engine_client_free(c);
		return -ENOMEM;
	}
	*out = c;
	return 0;
}

int dps_engine_client_set_prefill(struct dps_engine_client *c, int pdp, int ptp)
{
	const int n = c->dp + pdp;
	int *w = realloc(c->waiting, sizeof(int) * (size_t)n);
	int *r = w ? realloc(c->running, sizeof(int) * (size_t)n) : NULL;
	uint64_t *s;
	int *k;
	unsigned char *b;

	if (w)
		c->waiting = w;
	if (r)
		c->running = r;
	s = r ? realloc(c->sent, sizeof(uint64_t) * (size_t)n) : NULL;
	if (s)
		c->sent = s;
	k = s ? realloc(c->wake, sizeof(int) * (size_t)n) : NULL;
	if (k)
		c->wake = k;
	b = k ? realloc(c->blocked, (size_t)n) : NULL;
	if (!b)
		return -ENOMEM;
	c->blocked = b;
	for (int d = c->n_rep; d < n; d++) {
		c->waiting[d] = c->running[d] = c->wake[d] = 0;
		c->sent[d] = 0;
		c->blocked[d] = 0;
	}
	c->pdp = pdp;
	c->ptp = ptp;
	c->n_rep = n;
	return 0;
}

/* The world rank of replica d's TP rank 0 (decode replicas first, then the prefill ones). */
static int rep_rank(const struct dps_engine_client *c, int d)
{
	return d < c->dp ? d * c->tp : c->dp * c->tp + (d - c->dp) * c->ptp;
}

/* The least loaded of replicas [lo, hi): 4 x waiting + running, rotating ties. */
static int least_loaded(struct dps_engine_client *c, int lo, int hi)
{
	int best = -1;

	for (int k = 0; k < hi - lo; k++) {
		const int d = lo + (c->rotate + k) % (hi - lo);

		if (best < 0 || 4 * c->waiting[d] + c->running[d] <
				     4 * c->waiting[best] + c->running[best])
			best = d;
	}
	c->rotate = (c->rotate + 1) & 0x3fffffff; /* (never overflows) */
	return best;
}

void dps_engine_client_free(struct dps_engine_client *c)
{
	if (!c)
		return;
	for (int i = 0; i < c->n; i++) {
		free(c->reqs[i].prompt);
		free(c->reqs[i].hblocks);
	}
	free(c->adopt_q);
	free(c->rel);
	free(c->reqs);
	free(c->waiting);
	free(c->running);
	free(c->sent);
	free(c->wake);
	free(c->blocked);
	free(c->cancels);
	free(c);
}

static struct creq *creq_find(struct dps_engine_client *c, int64_t id)
{
	/* ids are dense from 0; reqs[0] is request base */
	return id >= c->base && id - c->base < c->n ? &c->reqs[id - c->base] : NULL;
}

/* An M_RELEASE of q's blocks to its prefill replica, sent by the next tick. */
static void queue_release(struct dps_engine_client *c, const struct creq *q)
{
	if (c->n_rel == c->cap_rel) {
		const int cap = c->cap_rel ? 2 * c->cap_rel : 16;
		struct release *n = realloc(c->rel, sizeof(*n) * (size_t)cap);

		if (!n) { /* the blocks stay held until the instance restarts: said, not hidden */
			dps_warn("out of memory: request %lld's KV blocks stay held on its prefill "
				 "replica", (long long)q->id);
			return;
		}
		c->rel = n;
		c->cap_rel = cap;
	}
	c->rel[c->n_rel++] = (struct release){ q->id, q->prefill_rep };
}

/* Request q ends in the client (its counts, its prompt) and its done callback runs. */
static void creq_end(struct dps_engine_client *c, struct creq *q, enum dps_finish why, int n_gen)
{
	q->finished = 1;
	q->sent_all = 1;
	if (q->started)
		c->running[q->replica]--;
	else
		c->waiting[q->replica]--;
	c->outstanding--;
	free(q->prompt);
	q->prompt = NULL;
	free(q->hblocks);
	q->hblocks = NULL;
	q->adopting = 0;
	if (q->held) { /* the decode side ended it, or never had it: the prefill blocks go back */
		queue_release(c, q);
		q->held = 0;
	}
	if (c->cb.done)
		c->cb.done(c->cb.arg, q->user, why, n_gen);
}

/* A long-running client: drops the finished requests at the front once they are many. */
static void compact(struct dps_engine_client *c)
{
	int head = 0;

	while (head < c->n && c->reqs[head].finished && head < c->first_unsent)
		head++;
	if (head < 1024 || head < c->n / 2)
		return;
	memmove(c->reqs, c->reqs + head, sizeof(*c->reqs) * (size_t)(c->n - head));
	c->n -= head;
	c->base += head;
	c->first_unsent -= head;
}

int64_t dps_engine_submit(struct dps_engine_client *c, const struct dps_engine_req *r)
{
	struct creq *q;
	int best = -1;

	if (r->n_prompt < 1 || r->replica >= c->dp)
		return -EINVAL;
	if (c->n == c->cap) {
		struct creq *n = realloc(c->reqs, sizeof(*n) * (size_t)(c->cap ? 2 * c->cap : 64));

		if (!n)
			return -ENOMEM;
		c->reqs = n;
		c->cap = c->cap ? 2 * c->cap : 64;
	}
	q = &c->reqs[c->n];
	memset(q, 0, sizeof(*q));
	q->prompt = malloc(sizeof(int) * (size_t)r->n_prompt);
	if (!q->prompt)
		return -ENOMEM;
	memcpy(q->prompt, r->prompt, sizeof(int) * (size_t)r->n_prompt);
	q->n_prompt = r->n_prompt;
	q->p = r->p;
	q->user = r->user;
	q->id = c->base + c->n++;
	/* The named replica, or the least loaded: score 4 x waiting + running, rotating ties;
	 * disaggregated, a prefill replica (a named one is a decode replica, where the request
	 * goes once prefilled). */
	if (r->replica >= 0 && !c->pdp)
		best = r->replica;
	else if (c->pdp)
		best = least_loaded(c, c->dp, c->n_rep);
	else
		best = least_loaded(c, 0, c->dp);
	q->replica = best;
	q->decode_rep = c->pdp ? r->replica : -1;
	c->waiting[best]++;
	c->sent[best]++;
	c->outstanding++;
	for (int d = 0; d < c->dp && !c->pdp; d++)
		c->wake[d] = d != best;
	return q->id;
}

void dps_engine_cancel(struct dps_engine_client *c, int64_t id)
{
	struct creq *q = creq_find(c, id);
	int64_t *n;

	if (!q || q->finished)
		return;
	if (c->n_cancels == c->cap_cancels) {
		n = realloc(c->cancels, sizeof(*n) * (size_t)(c->cap_cancels ? 2 * c->cap_cancels : 16));
		if (!n)
			return;
		c->cancels = n;
		c->cap_cancels = c->cap_cancels ? 2 * c->cap_cancels : 16;
	}
	c->cancels[c->n_cancels++] = id;
}

void dps_engine_close_when_idle(struct dps_engine_client *c)
{
	c->closing = 1;
}

int dps_engine_outstanding(const struct dps_engine_client *c)
{
	return c->outstanding;
}

const uint64_t *dps_engine_sent(const struct dps_engine_client *c)
{
	return c->sent;
}

/* A token of request id (with its log-probabilities, or NULL) to the callbacks. */
static void deliver(struct dps_engine_client *c, int64_t id, int token,
		    const struct dps_token_logprobs *lp)
{
	struct creq *q = creq_find(c, id);

	if (!q || q->finished)
		return;
	if (!q->started) {
		q->started = 1;
		c->waiting[q->replica]--;
		c->running[q->replica]++;
	}
	if (!lp || !lp->prompt) /* a prompt token's entry is not a generated token */
		q->n_gen++;
	if (lp && c->cb.token_lp)
		c->cb.token_lp(c->cb.arg, q->user, lp);
	else if (c->cb.token)
		c->cb.token(c->cb.arg, q->user, token);
}

static int ranks_of(const struct dps_engine_client *c)
{
	return c->dp * c->tp + c->pdp * c->ptp;
}

/* A hand-off that cannot go on: the request fails, and its prefill blocks go back. */
static void fail_handoff(struct dps_engine_client *c, struct creq *q)
{
	q->prefill_rep = q->replica;
	q->held = 1;
	creq_end(c, q, DPS_FINISH_ERROR, q->n_gen);
}

/*
 * A prefill replica's M_HANDOFF: gathers the blocks; once they are all here the request
 * moves to the least loaded decode replica, whose adoption the next tick sends. A request the
 * client cancelled on the prefill side meanwhile was released there: it ends, cancelled.
 */
static void on_handoff(struct dps_engine_client *c, const struct m_handoff *m)
{
	struct creq *q = creq_find(c, m->h.id);
	const int k = (int)m->h.count;

	if (!q || q->finished || q->replica < c->dp || m->total < 1 || m->first < 0 ||
	    m->first + k > m->total || m->n_ids != q->n_prompt + 1 || m->plp_next < 1) {
		if (q && !q->finished && q->replica >= c->dp) /* a bad hand-off: the request fails */
			fail_handoff(c, q);
		return;
	}
	if (q->cancel_sent) {
		creq_end(c, q, DPS_FINISH_CANCELLED, q->n_gen);
		return;
	}
	if (!q->hblocks) {
		q->hblocks = malloc(sizeof(int) * (size_t)m->total);
		if (!q->hblocks) {
			fail_handoff(c, q);
			return;
		}
		q->hand_total = m->total;
		q->n_hblocks = 0;
	}
	if (m->total != q->hand_total || m->first != q->n_hblocks) {
		fail_handoff(c, q);
		return;
	}
	memcpy(q->hblocks + m->first, m->blocks, sizeof(int) * (size_t)k);
	q->n_hblocks += k;
	q->hand_last = m->last;
	q->hand_nids = m->n_ids;
	q->plp_next = m->plp_next;
	q->rng = m->rng;
	q->t_scheduled = m->t_scheduled;
	q->p.deadline_ns = m->deadline_ns; /* absolute now, the decode side adds nothing */
	if (q->n_hblocks < q->hand_total)
		return;
	if (c->n_adopt == c->cap_adopt) {
		const int cap = c->cap_adopt ? 2 * c->cap_adopt : 16;
		int64_t *n = realloc(c->adopt_q, sizeof(*n) * (size_t)cap);

		if (!n) {
			fail_handoff(c, q);
			return;
		}
		c->adopt_q = n;
		c->cap_adopt = cap;
	}
	/* From the prefill replica to a decode replica; the blocks stay held until pulled. */
	q->prefill_rep = q->replica;
	q->held = 1;
	if (q->started)
		c->running[q->replica]--;
	else
		c->waiting[q->replica]--;
	q->started = 1;
	q->replica = q->decode_rep >= 0 ? q->decode_rep : least_loaded(c, 0, c->dp);
	c->running[q->replica]++;
	c->sent[q->replica]++;
	q->adopting = 1;
	q->adopt_sent = 0;
	c->adopt_q[c->n_adopt++] = q->id;
	for (int d = 0; d < c->dp && c->coupled; d++) /* coupled decode replicas sleep together */
		c->wake[d] = d != q->replica;
}

void dps_engine_on_msg(int rank, const void *msg, size_t len, void *client)
{
	struct dps_engine_client *c = client;
	struct m_hdr h;

	if (len < sizeof(h))
		return;
	memcpy(&h, msg, sizeof(h));
	if (h.type == M_TOKENS && len >= sizeof(struct m_tokens) + h.count * sizeof(struct m_tok)) {
		const struct m_tokens *m = msg;

		for (uint32_t i = 0; i < h.count; i++)
			deliver(c, m->t[i].id, m->t[i].token, NULL);
	} else if (h.type == M_TOKENS_LP && h.count <= TOKS_LP &&
		   len >= sizeof(struct m_tokens_lp) + h.count * sizeof(struct m_tok_lp)) {
		const struct m_tokens_lp *m = msg;

		for (uint32_t i = 0; i < h.count; i++) {
			struct dps_token_logprobs lp = m->t[i].lp;

			if (lp.n_top < 0 || lp.n_top > DPS_MAX_LOGPROBS)
				lp.n_top = 0; /* checked before use, as every field */
			lp.prompt = lp.prompt != 0;
			deliver(c, m->t[i].id, lp.token, &lp);
		}
	} else if (h.type == M_DONE && len >= sizeof(struct m_done)) {
		const struct m_done *m = msg;
		struct creq *q = creq_find(c, h.id);

		if (!q || q->finished)
			return;
		if (m->t_scheduled && c->cb.scheduled)
			c->cb.scheduled(c->cb.arg, q->user, m->t_scheduled);
		creq_end(c, q, (enum dps_finish)m->finish, m->n_gen);
	} else if (h.type == M_STATS && len >= sizeof(struct m_stats)) {
		const struct m_stats *m = msg;

		if (c->cb.stats && m->replica >= 0 && m->replica < c->n_rep)
			c->cb.stats(c->cb.arg, m->replica, &m->st, (int)h.count);
	} else if (h.type == M_READY) {
		/* (prefill replicas never step with the decode ones) */
		c->coupled |= h.count != 0 && rank < c->dp * c->tp;
		if (++c->n_ready == ranks_of(c) && c->cb.ready)
			c->cb.ready(c->cb.arg);
	} else if (h.type == M_HANDOFF && h.count <= HANDOFF_BLOCKS &&
		   len >= sizeof(struct m_handoff) + h.count * sizeof(int32_t)) {
		on_handoff(c, msg);
	} else if (h.type == M_PULLED) {
		struct creq *q = creq_find(c, h.id);

		if (q && q->held) {
			queue_release(c, q);
			q->held = 0;
		}
	}
}

void dps_engine_load(const struct dps_engine_client *c, int d, int *waiting, int *running)
{
	*waiting = d >= 0 && d < c->n_rep ? c->waiting[d] : 0;
	*running = d >= 0 && d < c->n_rep ? c->running[d] : 0;
}

int dps_engine_replicas(const struct dps_engine_client *c)
{
	return c->n_rep;
}

int dps_engine_ready(const struct dps_engine_client *c)
{
	return c->n_ready >= ranks_of(c);
}

int dps_engine_rank_pending(int rank, void *client)
{
	const struct dps_engine_client *c = client;
	const int d = rank < c->dp * c->tp ? rank / c->tp
					    : c->dp + (rank - c->dp * c->tp) / (c->ptp ? c->ptp : 1);
	int busy = 0;

	/* Loading is not stepping: until every rank is ready, nothing is expected of any. */
	if (!dps_engine_ready(c) || d < 0 || d >= c->n_rep)
		return 0;
	/* Coupled (decode) replicas all run every step (an idle one its dummy batch). */
	if (!c->coupled || d >= c->dp)
		return c->waiting[d] + c->running[d] > 0;
	for (int k = 0; k < c->dp; k++)
		busy |= c->waiting[k] + c->running[k] > 0;
	return busy;
}

int dps_engine_coupled(void *client)
{
	const struct dps_engine_client *c = client;

	return c->coupled;
}

void dps_engine_fail_all(struct dps_engine_client *c, enum dps_finish why)
{
	for (int i = 0; i < c->n; i++) {
		struct creq *q = &c->reqs[i];

		q->held = 0; /* the instance is gone: nothing holds blocks any more */
		if (!q->finished)
			creq_end(c, q, why, q->n_gen);
	}
	c->n_cancels = 0;
	c->n_adopt = 0;
	c->n_rel = 0;
}

/* Sends what it can of request q; 0 when all of it is out, -EAGAIN when the ring is full. */
static int send_req(struct dps_engine_client *c, struct creq *q)
{
	unsigned char buf[MSG_BYTES];
	const int rank = rep_rank(c, q->replica);
	int rc;

	while (q->sent < q->n_prompt || !q->sent) {
		if (!q->sent) {
			struct m_req *m = (struct m_req *)(void *)buf;
			const int k = q->n_prompt < (int)REQ_IDS ? q->n_prompt : (int)REQ_IDS;

			m->h = (struct m_hdr){ M_REQ, (uint32_t)k, q->id };
			m->p = q->p;
			m->n_prompt = q->n_prompt;
			memcpy(m->ids, q->prompt, sizeof(int) * (size_t)k);
			rc = dps_sup_send(rank, m, sizeof(*m) + sizeof(int32_t) * (size_t)k);
			if (rc)
				return rc;
			q->sent = k;
		} else {
			struct m_more *m = (struct m_more *)(void *)buf;
			const int left = q->n_prompt - q->sent;
			const int k = left < (int)MORE_IDS ? left : (int)MORE_IDS;

			m->h = (struct m_hdr){ M_REQ_MORE, (uint32_t)k, q->id };
			memcpy(m->ids, q->prompt + q->sent, sizeof(int) * (size_t)k);
			rc = dps_sup_send(rank, m, sizeof(*m) + sizeof(int32_t) * (size_t)k);
			if (rc)
				return rc;
			q->sent += k;
		}
	}
	q->sent_all = 1;
	return 0;
}

/*
 * Sends what it can of q's adoption to its decode replica: its prompt and the token the
 * prefill sampled, then the prefill replica's blocks; 0 when all is out, -EAGAIN when the
 * ring is full.
 */
static int send_adopt(struct dps_engine_client *c, struct creq *q)
{
	unsigned char buf[MSG_BYTES];
	const int n_ids = q->n_prompt + 1, total = n_ids + q->n_hblocks;
	int rc;

	while (q->adopt_sent < total) {
		const int left = total - q->adopt_sent;
		int32_t *dst;
		size_t head;
		int k;

		if (!q->adopt_sent) {
			struct m_adopt *m = (struct m_adopt *)(void *)buf;

			k = left < (int)ADOPT_INTS ? left : (int)ADOPT_INTS;
			*m = (struct m_adopt){ { M_ADOPT, (uint32_t)k, q->id }, q->p, n_ids,
					       q->n_prompt, q->n_hblocks, q->prefill_rep - c->dp,
					       q->plp_next, 0, q->rng, q->t_scheduled };
			dst = m->ids;
			head = sizeof(*m);
		} else {
			struct m_more *m = (struct m_more *)(void *)buf;

			k = left < (int)MORE_IDS ? left : (int)MORE_IDS;
			m->h = (struct m_hdr){ M_REQ_MORE, (uint32_t)k, q->id };
			dst = m->ids;
			head = sizeof(*m);
		}
		for (int i = 0; i < k; i++) {
			const int at = q->adopt_sent + i;

			dst[i] = at < q->n_prompt ? q->prompt[at] : at == q->n_prompt
								      ? q->hand_last
								      : q->hblocks[at - n_ids];
		}
		rc = dps_sup_send(rep_rank(c, q->replica), buf, head + sizeof(int32_t) * (size_t)k);
		if (rc)
			return rc;
		q->adopt_sent += k;
	}
	q->adopting = 0;
	return 0;
}

/* The disaggregated instance's adoptions and releases due, in order; 1 while some wait. */
static int tick_handoffs(struct dps_engine_client *c)
{
	int keep = 0, busy = 0;

	for (int i = 0; i < c->n_adopt; i++) {
		struct creq *q = creq_find(c, c->adopt_q[i]);

		if (!q || q->finished || !q->adopting)
			continue;
		/* one request at a time a ring; a full one holds back its own */
		if (c->blocked[q->replica] || send_adopt(c, q)) {
			c->blocked[q->replica] = 1;
			c->adopt_q[keep++] = c->adopt_q[i];
			busy = 1;
		}
	}
	c->n_adopt = keep;
	keep = 0;
	for (int i = 0; i < c->n_rel; i++) {
		const struct m_hdr m = { M_RELEASE, 0, c->rel[i].id };
		const int d = c->rel[i].replica;

		if (c->blocked[d] || dps_sup_send(rep_rank(c, d), &m, sizeof(m))) {
			c->blocked[d] = 1;
			c->rel[keep++] = c->rel[i];
			busy = 1;
		}
	}
	c->n_rel = keep;
	return busy;
}

int dps_engine_tick(void *client)
{
	struct dps_engine_client *c = client;
	int busy = 0, keep = 0;

	compact(c);
	/*
	 * Requests in order per replica (each receives its requests one after another, whole);
	 * a replica whose ring is full holds back only its own.
	 */
	memset(c->blocked, 0, (size_t)c->n_rep);
	for (int i = c->first_unsent; i < c->n; i++) {
		struct creq *q = &c->reqs[i];

		if (q->finished || q->sent_all) {
			if (i == c->first_unsent)
				c->first_unsent++;
			continue;
		}
		if (c->blocked[q->replica])
			continue;
		if (send_req(c, q)) {
			c->blocked[q->replica] = 1;
			busy = 1;
		}
	}
	busy |= tick_handoffs(c);
	for (int d = 0; d < c->n_rep; d++) {
		const struct m_hdr w = { M_WAKE, 0, 0 };

		if (c->wake[d] && !c->blocked[d] && dps_sup_send(rep_rank(c, d), &w, sizeof(w)) == 0)
			c->wake[d] = 0;
		busy |= c->wake[d];
	}
	for (int i = 0; i < c->n_cancels; i++) {
		struct creq *q = creq_find(c, c->cancels[i]);
		const struct m_hdr m = { M_CANCEL, 0, c->cancels[i] };

		if (!q || q->finished)
			continue;
		if (!q->sent || (q->adopting && !q->adopt_sent)) {
			/* Never sent (to its decode replica): it ends here (its prefill blocks are
			 * released). */
			creq_end(c, q, DPS_FINISH_CANCELLED, q->n_gen);
			continue;
		}
		/* After the whole request (or adoption), through the same ring. */
		if (!q->sent_all || q->adopting || c->blocked[q->replica] ||
		    dps_sup_send(rep_rank(c, q->replica), &m, sizeof(m))) {
			c->blocked[q->replica] = 1;
			c->cancels[keep++] = c->cancels[i];
			busy = 1;
		} else if (q->replica >= c->dp) {
			q->cancel_sent = 1; /* a hand-off already on its way ends it, cancelled */
		}
	}
	c->n_cancels = keep;
	if (!busy && c->closing && !c->outstanding && !c->stopped) {
		const struct m_hdr m = { M_STOP, 0, 0 };
		int all = 1;

		for (int d = 0; d < c->n_rep; d++)
			all &= dps_sup_send(rep_rank(c, d), &m, sizeof(m)) == 0;
		c->stopped = all; /* (a replica whose ring was full gets it again next tick) */
		busy = !all;
	}
	return busy ? 5 : -1;
}

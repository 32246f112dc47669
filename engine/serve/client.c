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
};

struct dps_engine_client {
	int dp, tp;
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

void dps_engine_client_free(struct dps_engine_client *c)
{
	if (!c)
		return;
	for (int i = 0; i < c->n; i++)
		free(c->reqs[i].prompt);
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

	if (r->n_prompt < 1 || (r->replica >= c->dp))
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
	/* The named replica, or the least loaded: score 4 x waiting + running, rotating ties. */
	if (r->replica >= 0) {
		best = r->replica;
	} else {
		for (int k = 0; k < c->dp; k++) {
			const int d = (c->rotate + k) % c->dp;

			if (best < 0 || 4 * c->waiting[d] + c->running[d] <
					     4 * c->waiting[best] + c->running[best])
				best = d;
		}
		c->rotate = (c->rotate + 1) % c->dp;
	}
	q->replica = best;
	c->waiting[best]++;
	c->sent[best]++;
	c->outstanding++;
	for (int d = 0; d < c->dp; d++)
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

void dps_engine_on_msg(int rank, const void *msg, size_t len, void *client)
{
	struct dps_engine_client *c = client;
	struct m_hdr h;

	(void)rank;
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

		if (c->cb.stats && m->replica >= 0 && m->replica < c->dp)
			c->cb.stats(c->cb.arg, m->replica, &m->st, (int)h.count);
	} else if (h.type == M_READY) {
		c->coupled |= h.count != 0;
		if (++c->n_ready == c->dp * c->tp && c->cb.ready)
			c->cb.ready(c->cb.arg);
	}
}

void dps_engine_load(const struct dps_engine_client *c, int d, int *waiting, int *running)
{
	*waiting = d >= 0 && d < c->dp ? c->waiting[d] : 0;
	*running = d >= 0 && d < c->dp ? c->running[d] : 0;
}

int dps_engine_ready(const struct dps_engine_client *c)
{
	return c->n_ready >= c->dp * c->tp;
}

int dps_engine_rank_pending(int rank, void *client)
{
	const struct dps_engine_client *c = client;
	const int d = rank / c->tp;

	/* Loading is not stepping: until every rank is ready, nothing is expected of any. */
	if (!dps_engine_ready(c) || d < 0 || d >= c->dp)
		return 0;
	/* Coupled replicas all run every step (an idle one its dummy batch). */
	return c->coupled ? c->outstanding > 0 : c->waiting[d] + c->running[d] > 0;
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

		if (!q->finished)
			creq_end(c, q, why, q->n_gen);
	}
	c->n_cancels = 0;
}

/* Sends what it can of request q; 0 when all of it is out, -EAGAIN when the ring is full. */
static int send_req(struct dps_engine_client *c, struct creq *q)
{
	unsigned char buf[MSG_BYTES];
	const int rank = q->replica * c->tp;
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

int dps_engine_tick(void *client)
{
	struct dps_engine_client *c = client;
	int busy = 0, keep = 0;

	compact(c);
	/*
	 * Requests in order per replica (each receives its requests one after another, whole);
	 * a replica whose ring is full holds back only its own.
	 */
	memset(c->blocked, 0, (size_t)c->dp);
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
	for (int d = 0; d < c->dp; d++) {
		const struct m_hdr w = { M_WAKE, 0, 0 };

		if (c->wake[d] && !c->blocked[d] && dps_sup_send(d * c->tp, &w, sizeof(w)) == 0)
			c->wake[d] = 0;
		busy |= c->wake[d];
	}
	for (int i = 0; i < c->n_cancels; i++) {
		struct creq *q = creq_find(c, c->cancels[i]);
		const struct m_hdr m = { M_CANCEL, 0, c->cancels[i] };

		if (!q || q->finished)
			continue;
		if (!q->sent) {
			/* Never sent: it ends here. */
			creq_end(c, q, DPS_FINISH_CANCELLED, 0);
			continue;
		}
		/* After the whole request, through the same ring. */
		if (!q->sent_all || c->blocked[q->replica] ||
		    dps_sup_send(q->replica * c->tp, &m, sizeof(m))) {
			c->blocked[q->replica] = 1;
			c->cancels[keep++] = c->cancels[i];
			busy = 1;
		}
	}
	c->n_cancels = keep;
	if (!busy && c->closing && !c->outstanding && !c->stopped) {
		const struct m_hdr m = { M_STOP, 0, 0 };
		int all = 1;

		for (int d = 0; d < c->dp; d++)
			all &= dps_sup_send(d * c->tp, &m, sizeof(m)) == 0;
		c->stopped = all; /* (a replica whose ring was full gets it again next tick) */
		busy = !all;
	}
	return busy ? 5 : -1;
}

/* SPDX-License-Identifier: MIT */
/*
 * engine/api/choice.c - the requests in flight of the OpenAI-compatible API (frontend.h): an
 * HTTP request becomes one choice per prompt and sample ("n"), each its own engine request
 * (fe_req), possibly on different replicas, grouped by a fe_group that answers once every
 * choice finished (a whole body) or ends the stream after the last one. Each choice turns its
 * tokens into text, finds the stop strings in it and keeps the log-probabilities asked for.
 * Called on the supervisor's loop thread: by frontend.c for a parsed request, by the engine
 * client's callbacks for tokens and ends.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dps.h"
#include "engine/api/frontend_int.h"

static void list_add(struct dps_frontend *f, struct fe_req *r)
{
	r->next = f->head;
	if (f->head)
		f->head->prev = r;
	f->head = r;
	f->active++;
}

static void group_unref(struct fe_group *g)
{
	if (--g->n_refs)
		return;
	for (int i = 0; i < g->n_choices; i++)
		free(g->body[i]);
	free(g->body);
	free(g->body_len);
	free(g);
}

void dps_fe_req_free(struct dps_frontend *f, struct fe_req *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		f->head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	f->active--;
	for (int i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	dps_tok_stream_free(r->ts);
	free(r->gen);
	free(r->lps);
	free(r->plps);
	free(r->text);
	if (r->g)
		group_unref(r->g);
	free(r);
}

static int text_add(struct fe_req *r, const char *s, size_t n)
{
	if (r->len + n + 1 > r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 256;
		char *p;

		while (cap < r->len + n + 1)
			cap *= 2;
		p = realloc(r->text, cap);
		if (!p)
			return -ENOMEM;
		r->text = p;
		r->cap = cap;
	}
	memcpy(r->text + r->len, s, n);
	r->len += n;
	r->text[r->len] = '\0';
	return 0;
}

/* Bytes of text[0..len) that may be shown: not a possible start of a stop string (the text is
 * whole UTF-8: the stream decoder never ends a piece inside a character). */
static size_t showable(const struct fe_req *r)
{
	size_t n = r->len;

	if (r->n_stop && r->max_stop > 1) {
		/* The longest tail that is a prefix of some stop string is held back. */
		for (size_t k = r->max_stop - 1; k > 0; k--) {
			int prefix = 0;

			if (k > r->len)
				continue;
			for (int i = 0; i < r->n_stop && !prefix; i++)
				prefix = r->stop_len[i] > k &&
					 !memcmp(r->text + r->len - k, r->stop[i], k);
			if (prefix) {
				n = r->len - k;
				break;
			}
		}
	}
	return n < r->emitted ? r->emitted : n;
}

static const char *finish_name(enum dps_finish why)
{
	return dps_finish_name(why);
}

static void log_request(struct dps_frontend *f, const struct fe_req *r, const char *finish)
{
	const uint64_t now = dps_now_ns();

	if (!f->o.log_requests)
		return;
	dps_info("request %s: %s, %d prompt + %d completion tokens, finish %s, first token %.1f ms, "
		 "total %.1f ms", r->id, r->stream ? "stream" : "completion", r->n_prompt, r->n_gen,
		 finish, r->t_first ? (double)(r->t_first - r->t_arrive) / 1e6 : 0.0,
		 (double)(now - r->t_arrive) / 1e6);
}

/* The earliest stop string in the text from `from` on that ends after stop_floor, or -1. */
static long find_stop(const struct fe_req *r, size_t from)
{
	long best = -1;

	if (from < r->text0)
		from = r->text0; /* in the completion, not the prompt echoed before it */

	for (int i = 0; i < r->n_stop; i++) {
		const char *hit = memmem(r->text + from, r->len - from, r->stop[i], r->stop_len[i]);

		/* (a stop string made while min_tokens held them back does not count, as in vLLM) */
		while (hit && (size_t)(hit - r->text) + r->stop_len[i] <= r->stop_floor)
			hit = memmem(hit + 1, r->len - (size_t)(hit + 1 - r->text), r->stop[i],
				     r->stop_len[i]);

		if (hit && (best < 0 || hit - r->text < best))
			best = hit - r->text;
	}
	return best;
}

void dps_fe_cancel_siblings(struct dps_frontend *f, const struct fe_req *r)
{
	if (!f->client || r->g->n_open == 0)
		return;
	for (const struct fe_req *o = f->head; o; o = o->next)
		if (o != r && o->g == r->g && !o->answered)
			dps_engine_cancel(f->client, o->eid);
}

/* The end of a request: its response (unless the client is gone), metrics, the log line. */
void dps_fe_finish(struct dps_frontend *f, struct fe_req *r, enum dps_finish why)
{
	const char *fin = finish_name(why);
	const uint64_t now = dps_now_ns();

	if (r->answered)
		return;
	if (r->ts) {
		/* What the stream held back (an incomplete character at the very end). */
		const char *rest;
		size_t l;
		long at;

		if (!dps_tok_stream_flush(r->ts, &rest, &l) && l) {
			const size_t from = r->len > r->max_stop ? r->len - r->max_stop : 0;

			text_add(r, rest, l);
			if (r->n_stop && r->n_gen > r->min_tokens && (at = find_stop(r, from)) >= 0) {
				r->len = (size_t)at;
				r->text[at] = '\0';
				why = DPS_FINISH_STOP;
			}
		}
	}
	r->answered = 1;
	r->g->n_open--;
	r->g->gen_tokens += r->n_gen;
	f->requests[why < 8 ? why : 7]++;
	dps_fe_metrics_finished(f, r, now);
	log_request(f, r, fin);
	if (r->conn_gone)
		return;
	/* A whole body waits for every choice; one that failed makes it a 500, so the others
	 * stop at once instead of running to their end for an answer nobody will read (their
	 * "cancelled" ends count down n_open; the last one sends the 500). */
	if (!r->stream && why == DPS_FINISH_ERROR && !r->g->failed)
		dps_fe_cancel_siblings(f, r);
	r->g->failed |= why == DPS_FINISH_ERROR;
	if (!r->stream && r->g->failed) {
		if (!r->g->n_open)
			dps_fe_send_error(f, r->conn, 500, "internal_error", DPS_FE_FAILED_MSG);
		return;
	}
	dps_fe_respond_final(f, r, fin);
}

/* Room for one more generated token (and its log-probabilities): 0 or -ENOMEM. */
static int gen_room(struct fe_req *r)
{
	const int cap = r->cap_gen ? 2 * r->cap_gen : 64;
	int *p;

	if (r->n_gen < r->cap_gen)
		return 0;
	p = realloc(r->gen, sizeof(int) * (size_t)cap);
	if (!p)
		return -ENOMEM;
	r->gen = p;
	if (r->want_lp) {
		struct dps_token_logprobs *lp = realloc(r->lps, sizeof(*lp) * (size_t)cap);

		if (!lp)
			return -ENOMEM;
		r->lps = lp;
	}
	r->cap_gen = cap;
	return 0;
}

/* A token of choice r (with its log-probabilities when the choice asked for them). */
static void take_token(struct dps_frontend *f, struct fe_req *r, int token,
		       const struct dps_token_logprobs *lp)
{
	const uint64_t now = dps_now_ns();
	size_t l, from;
	const char *piece;
	long at;

	if (r->answered)
		return;
	if (gen_room(r)) {
		/* Out of memory for the token: the choice cannot go on without it (its text and
		 * usage would be wrong), so it stops and ends with an error. */
		dps_warn("request %s: no memory for token %d of choice %d: failing it", r->id,
			 r->n_gen, r->index);
		if (f->client)
			dps_engine_cancel(f->client, r->eid);
		dps_fe_finish(f, r, DPS_FINISH_ERROR);
		return;
	}
	if (r->want_lp) {
		if (lp)
			r->lps[r->n_gen] = *lp;
		else
			r->lps[r->n_gen] = (struct dps_token_logprobs){ .token = token };
	}
	r->gen[r->n_gen++] = token;
	f->gen_tokens++;
	if (!r->t_first) {
		r->t_first = now;
		dps_fe_hist_add(&f->ttft, (double)(now - r->t_arrive) / 1e9);
	} else {
		dps_fe_hist_add(&f->itl, (double)(now - r->t_last) / 1e9);
	}
	r->t_last = now;
	from = r->len > r->max_stop ? r->len - r->max_stop : 0;
	if (r->ts && !dps_tok_stream_step(r->ts, token, &piece, &l) && l)
		text_add(r, piece, l);
	if (r->n_gen <= r->min_tokens)
		r->stop_floor = r->len;
	else if (r->n_stop && r->text && (at = find_stop(r, from)) >= 0) {
		/* A stop string: the text ends before it, and the engine stops the request. */
		r->len = (size_t)at;
		r->text[at] = '\0';
		if (f->client)
			dps_engine_cancel(f->client, r->eid);
		dps_fe_finish(f, r, DPS_FINISH_STOP);
		return;
	}
	if (r->stream)
		dps_fe_stream_text(f, r, showable(r));
}

static void on_token(void *arg, void *user, int token)
{
	take_token(arg, user, token, NULL);
}

static void on_token_lp(void *arg, void *user, const struct dps_token_logprobs *lp)
{
	struct fe_req *r = user;

	if (lp->prompt) { /* a prompt token's entry: kept for the echoed prompt's logprobs */
		if (r->plps && r->n_plps < r->n_prompt)
			r->plps[r->n_plps++] = *lp;
		return;
	}
	take_token(arg, user, lp->token, lp);
}

static void on_done(void *arg, void *user, enum dps_finish why, int n_gen)
{
	struct dps_frontend *f = arg;
	struct fe_req *r = user;

	(void)n_gen;
	dps_fe_finish(f, r, why);
	if (r->t_sched && r->t_first)
		dps_fe_metrics_phases(f, r);
	dps_fe_req_free(f, r);
}

static void on_scheduled(void *arg, void *user, uint64_t t_ns)
{
	struct fe_req *r = user;

	(void)arg;
	r->t_sched = t_ns;
}

static void on_stats(void *arg, int replica, const struct dps_engine_stats *st, int final)
{
	struct dps_frontend *f = arg;

	(void)final;
	if (replica >= 0 && replica < f->o.dp)
		f->rep[replica] = *st;
}

static void on_ready(void *arg)
{
	struct dps_frontend *f = arg;

	if (f->state == DPS_FE_LOADING || f->state == DPS_FE_RECOVERING) {
		f->state = DPS_FE_READY;
		dps_info("the model is loaded on every rank: serving");
	}
}

const struct dps_engine_cb dps_frontend_engine_cb = { on_token, on_done, on_stats, NULL,
						       on_ready, on_scheduled, on_token_lp };


/* A choice choice_new made that was never queued (nor listed): what it holds, and it. */
static void choice_discard(struct fe_req *r)
{
	free(r->plps);
	for (int i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	dps_tok_stream_free(r->ts);
	free(r->text);
	free(r);
}

/* Choice c of the request job parsed (prompt c / n, sample c % n): a new fe_req. */
static struct fe_req *choice_new(struct dps_frontend *f, struct dps_prep_job *job,
				 struct fe_group *g, int c)
{
	const struct dps_request *q = &job->req;
	const struct dps_req_prompt *pr = &q->prompts[c / q->n];
	struct fe_req *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	r->f = f;
	r->g = g;
	r->index = c;
	if (f->o.lim.tok) {
		r->ts = job->ts[c]; /* primed by the worker */
		job->ts[c] = NULL;
	}
	r->conn = job->conn;
	r->stream = q->stream;
	r->include_usage = q->include_usage;
	r->chat = q->chat;
	r->created = g->created;
	memcpy(r->id, g->id, sizeof(r->id));
	r->n_prompt = pr->n;
	r->t_arrive = job->t_arrive;
	r->max_tokens = q->p.max_tokens;
	r->min_tokens = q->p.min_tokens;
	r->want_lp = q->p.want_logprobs;
	if (q->p.prompt_logprobs) {
		r->plps = calloc((size_t)pr->n, sizeof(*r->plps));
		if (!r->plps)
			goto err;
		/* The first prompt token follows nothing: null in both lists, as vLLM gives it. */
		r->plps[0] = (struct dps_token_logprobs){ .token = pr->ids[0], .n_top = -1,
							  .prompt = 1 };
		r->n_plps = 1;
	}
	for (int i = 0; i < q->n_stop; i++) {
		const size_t l = strlen(q->stop[i]);

		r->stop[i] = strdup(q->stop[i]);
		if (!r->stop[i])
			goto err;
		r->n_stop++;
		r->stop_len[i] = l;
		r->max_stop = l > r->max_stop ? l : r->max_stop;
	}
	/* echo: the choice's text starts with its prompt's */
	if (q->echo && pr->text && text_add(r, pr->text, pr->text_len))
		goto err;
	r->text0 = r->len;
	return r;
err:
	choice_discard(r);
	return NULL;
}

int dps_fe_submit(struct dps_frontend *f, struct dps_prep_job *job)
{
	struct dps_request *q = &job->req;
	const int n = q->n_prompts * q->n;
	struct fe_group *g = calloc(1, sizeof(*g));
	struct fe_req **rs = calloc((size_t)n, sizeof(*rs));
	uint64_t seed = q->p.sampling.seed;
	int made = 0, sent = 0;

	if (!g || !rs)
		goto err;
	g->n_choices = g->n_open = n;
	g->n = q->n;
	g->body = calloc((size_t)n, sizeof(*g->body));
	g->body_len = calloc((size_t)n, sizeof(*g->body_len));
	if (!g->body || !g->body_len)
		goto err;
	g->created = (long)time(NULL);
	snprintf(g->id, sizeof(g->id), "%s-%llx%06llx", q->chat ? "chatcmpl" : "cmpl",
		 (unsigned long long)f->started, (unsigned long long)++f->seq);
	for (int i = 0; i < q->n_prompts; i++)
		g->prompt_tokens += q->prompts[i].n;
	for (made = 0; made < n; made++) {
		rs[made] = choice_new(f, job, g, made);
		if (!rs[made])
			goto err;
	}
	/*
	 * Seeds: an unseeded request draws its own; sample j of every prompt runs with seed + j,
	 * as vLLM seeds its n child requests, so a seeded request gives the same choices on any
	 * replica and run, and its n samples differ.
	 */
	if (!q->has_seed)
		seed = (uint64_t)dps_now_ns() ^ (f->seq * 0x9E3779B97F4A7C15ull);
	for (sent = 0; sent < n; sent++) {
		const struct dps_req_prompt *pr = &q->prompts[sent / q->n];
		struct dps_engine_req er = { pr->ids, pr->n, q->p, -1, rs[sent] };

		er.p.sampling.seed = seed + (uint64_t)(sent % q->n);
		rs[sent]->eid = dps_engine_submit(f->client, &er);
		if (rs[sent]->eid < 0)
			goto err;
		g->n_refs++;
		f->prompt_tokens += (uint64_t)pr->n;
		list_add(f, rs[sent]);
	}
	if (q->stream)
		for (int c = 0; c < n; c++)
			dps_fe_stream_begin(f, rs[c]);
	free(rs);
	return 0;
err:
	/* The choices queued already end unanswered; the rest were never queued. */
	for (int c = 0; c < sent; c++) {
		rs[c]->conn_gone = 1;
		dps_engine_cancel(f->client, rs[c]->eid);
	}
	for (int c = sent; c < made; c++)
		choice_discard(rs[c]);
	if (g && !sent) {
		free(g->body);
		free(g->body_len);
		free(g);
	}
	free(rs);
	return -ENOMEM;
}

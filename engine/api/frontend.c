/* SPDX-License-Identifier: MIT */
/*
 * engine/api/frontend.c - the OpenAI-compatible API of frontend.h, on the HTTP server and the
 * engine client, in the supervisor's loop.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/dps.h"
#include "common/json.h"
#include "engine/api/frontend_int.h"
#include "engine/runtime/supervisor.h"

/* ---- requests -------------------------------------------------------------------------------- */

static void send_error(struct dps_frontend *f, uint64_t conn, int status, const char *type,
		       const char *msg)
{
	char *body = NULL;
	size_t n = 0;
	FILE *o = open_memstream(&body, &n);

	if (!o)
		return;
	fprintf(o, "{\"error\": {\"message\": ");
	dps_json_string(o, msg, strlen(msg));
	fprintf(o, ", \"type\": \"%s\", \"code\": %d}}\n", type, status);
	fclose(o);
	dps_http_respond(f->http, conn, status, "application/json", body, n,
			 status == 401 ? "WWW-Authenticate: Bearer\r\n" : NULL, 0);
	f->http_errors++;
	free(body);
}

static void list_add(struct dps_frontend *f, struct fe_req *r)
{
	r->next = f->head;
	if (f->head)
		f->head->prev = r;
	f->head = r;
	f->active++;
}

static void req_free(struct dps_frontend *f, struct fe_req *r)
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
	free(r->gen);
	free(r->text);
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

/* Bytes of text[0..len) that may be shown: not a possible start of a stop string, whole UTF-8. */
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
	/* An incomplete UTF-8 sequence at the end waits for its next bytes. */
	for (size_t back = 1; back <= 3 && back <= n; back++) {
		const unsigned char ch = (unsigned char)r->text[n - back];

		if ((ch & 0xc0) == 0x80)
			continue; /* a continuation byte: look further back */
		if (ch >= 0xc0) {
			const size_t need = ch >= 0xf0 ? 4 : ch >= 0xe0 ? 3 : 2;

			if (back < need)
				n -= back;
		}
		break;
	}
	return n < r->emitted ? r->emitted : n;
}

static void chunk_head(FILE *o, const struct fe_req *r, const char *model)
{
	fprintf(o, "data: {\"id\": \"%s\", \"object\": \"text_completion\", \"created\": %ld, "
		   "\"model\": ", r->id, r->created);
	dps_json_string(o, model, strlen(model));
}

/*
 * Streams text[emitted .. upto) and the token ids not streamed yet as one event (the text may
 * be empty: held back, or a model without a tokenizer).
 */
static void stream_text(struct dps_frontend *f, struct fe_req *r, size_t upto)
{
	char *ev = NULL;
	size_t n = 0;
	FILE *o;

	if (upto < r->emitted)
		upto = r->emitted;
	if ((upto == r->emitted && r->ids_emitted == r->n_gen) || r->conn_gone)
		return;
	o = open_memstream(&ev, &n);
	if (!o)
		return;
	chunk_head(o, r, f->o.model_name);
	fprintf(o, ", \"choices\": [{\"index\": 0, \"text\": ");
	dps_json_text(o, r->text ? r->text + r->emitted : "", upto - r->emitted);
	fprintf(o, ", \"logprobs\": null, \"finish_reason\": null, \"token_ids\": [");
	for (int i = r->ids_emitted; i < r->n_gen; i++)
		fprintf(o, "%s%d", i > r->ids_emitted ? ", " : "", r->gen[i]);
	fprintf(o, "]}]}\n\n");
	fclose(o);
	dps_http_stream_write(f->http, r->conn, ev, n);
	free(ev);
	r->emitted = upto;
	r->ids_emitted = r->n_gen;
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

/* The end of a request: its response (unless the client is gone), metrics, the log line. */
static void finish(struct dps_frontend *f, struct fe_req *r, enum dps_finish why)
{
	const char *fin = finish_name(why);
	const uint64_t now = dps_now_ns();
	char *body = NULL;
	size_t n = 0;
	FILE *o;

	if (r->answered)
		return;
	r->answered = 1;
	f->requests[why < 8 ? why : 7]++;
	dps_fe_hist_add(&f->e2e, (double)(now - r->t_arrive) / 1e9);
	log_request(f, r, fin);
	if (r->conn_gone)
		return;
	if (!r->stream && why == DPS_FINISH_ERROR) {
		send_error(f, r->conn, 500, "internal_error",
			   "the engine failed while running this request (a rank died); it was not "
			   "completed: send it again");
		return;
	}
	o = open_memstream(&body, &n);
	if (!o)
		return;
	if (r->stream) {
		stream_text(f, r, r->len);
		chunk_head(o, r, f->o.model_name);
		fprintf(o, ", \"choices\": [{\"index\": 0, \"text\": \"\", \"logprobs\": null, "
			   "\"finish_reason\": \"%s\"}]}\n\n", fin);
		if (r->include_usage) {
			chunk_head(o, r, f->o.model_name);
			fprintf(o, ", \"choices\": [], \"usage\": {\"prompt_tokens\": %d, "
				   "\"completion_tokens\": %d, \"total_tokens\": %d}}\n\n",
				r->n_prompt, r->n_gen, r->n_prompt + r->n_gen);
		}
		fprintf(o, "data: [DONE]\n\n");
		fclose(o);
		dps_http_stream_write(f->http, r->conn, body, n);
		dps_http_stream_end(f->http, r->conn);
	} else {
		fprintf(o, "{\"id\": \"%s\", \"object\": \"text_completion\", \"created\": %ld, "
			   "\"model\": ", r->id, r->created);
		dps_json_string(o, f->o.model_name, strlen(f->o.model_name));
		fprintf(o, ", \"choices\": [{\"index\": 0, \"text\": ");
		dps_json_text(o, r->text ? r->text : "", r->len);
		fprintf(o, ", \"logprobs\": null, \"finish_reason\": \"%s\", \"token_ids\": [", fin);
		for (int i = 0; i < r->n_gen; i++)
			fprintf(o, "%s%d", i ? ", " : "", r->gen[i]);
		fprintf(o, "]}], \"usage\": {\"prompt_tokens\": %d, \"completion_tokens\": %d, "
			   "\"total_tokens\": %d}}\n", r->n_prompt, r->n_gen, r->n_prompt + r->n_gen);
		fclose(o);
		dps_http_respond(f->http, r->conn, 200, "application/json", body, n, NULL, 0);
	}
	free(body);
}

/* The earliest stop string in the text from `from` on, or -1. */
static long find_stop(const struct fe_req *r, size_t from)
{
	long best = -1;

	for (int i = 0; i < r->n_stop; i++) {
		const char *hit = memmem(r->text + from, r->len - from, r->stop[i], r->stop_len[i]);

		if (hit && (best < 0 || hit - r->text < best))
			best = hit - r->text;
	}
	return best;
}

static void on_token(void *arg, void *user, int token)
{
	struct dps_frontend *f = arg;
	struct fe_req *r = user;
	const uint64_t now = dps_now_ns();
	char buf[8];
	size_t l, from;
	const char *piece;
	long at;

	if (r->answered)
		return;
	if (r->n_gen == r->cap_gen) {
		int *p = realloc(r->gen, sizeof(int) * (size_t)(r->cap_gen ? 2 * r->cap_gen : 64));

		if (!p)
			return;
		r->gen = p;
		r->cap_gen = r->cap_gen ? 2 * r->cap_gen : 64;
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
	if (f->o.lim.tok) {
		piece = dps_tok_llama2_decode(f->o.lim.tok, r->last, token, buf, &l);
		text_add(r, piece, l);
	}
	r->last = token;
	if (r->n_stop && r->text && (at = find_stop(r, from)) >= 0) {
		/* A stop string: the text ends before it, and the engine stops the request. */
		r->len = (size_t)at;
		r->text[at] = '\0';
		if (f->client)
			dps_engine_cancel(f->client, r->eid);
		finish(f, r, DPS_FINISH_STOP);
		return;
	}
	if (r->stream)
		stream_text(f, r, showable(r));
}

static void on_done(void *arg, void *user, enum dps_finish why, int n_gen)
{
	struct dps_frontend *f = arg;
	struct fe_req *r = user;

	(void)n_gen;
	finish(f, r, why);
	req_free(f, r);
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
						       on_ready };

/* ---- endpoints ------------------------------------------------------------------------------- */

static int authorized(const struct dps_frontend *f, const char *auth)
{
	const char *key = f->o.api_key;
	size_t kl, al;
	unsigned char diff = 0;

	if (!key || !*key)
		return 1;
	if (!auth || strncasecmp(auth, "Bearer ", 7))
		return 0;
	auth += 7;
	kl = strlen(key);
	al = strlen(auth);
	/* Constant time in the key: every byte of it is compared, whatever matched before. */
	for (size_t i = 0; i < kl; i++)
		diff |= (unsigned char)(key[i] ^ (i < al ? auth[i] : 0));
	return !diff && al == kl;
}

static const char *unavailable(const struct dps_frontend *f)
{
	switch (f->state) {
	case DPS_FE_LOADING: return "the model is loading: try again shortly";
	case DPS_FE_DRAINING: return "the server is shutting down and takes no new requests";
	case DPS_FE_RECOVERING: return "a rank failed; the engine is restarting: try again shortly";
	default: return NULL;
	}
}

static void completions(struct dps_frontend *f, const struct dps_http_req *hr)
{
	struct dps_request q;
	struct fe_req *r;
	char err[512];
	const char *why = unavailable(f);
	int rc;

	if (why || !f->client) {
		send_error(f, hr->conn, 503, "service_unavailable", why ? why : "not ready");
		return;
	}
	rc = dps_request_parse(hr->body, hr->body_len, DPS_REQ_COMPLETIONS, &f->o.lim, &q, err,
			       sizeof(err));
	if (!rc && q.model[0] && strcmp(q.model, f->o.model_name)) {
		snprintf(err, sizeof(err), "the model '%.100s' does not exist here (this server has "
			 "'%.100s')", q.model, f->o.model_name);
		dps_request_free(&q);
		send_error(f, hr->conn, 404, "not_found_error", err);
		return;
	}
	if (rc) {
		dps_request_free(&q);
		if (rc == -EINVAL)
			send_error(f, hr->conn, 400, "invalid_request_error", err);
		else
			send_error(f, hr->conn, 500, "internal_error", "out of memory");
		return;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		dps_request_free(&q);
		send_error(f, hr->conn, 500, "internal_error", "out of memory");
		return;
	}
	r->f = f;
	r->conn = hr->conn;
	r->stream = q.stream;
	r->include_usage = q.include_usage;
	r->created = (long)time(NULL);
	snprintf(r->id, sizeof(r->id), "cmpl-%llx%06llx", (unsigned long long)f->started,
		 (unsigned long long)++f->seq);
	r->n_prompt = q.n_prompt;
	r->last = q.prompt[q.n_prompt - 1];
	r->t_arrive = dps_now_ns();
	for (int i = 0; i < q.n_stop; i++) {
		const size_t l = strlen(q.stop[i]);

		r->stop[i] = q.stop[i];
		r->stop_len[i] = l;
		q.stop[i] = NULL;
		r->max_stop = l > r->max_stop ? l : r->max_stop;
	}
	r->n_stop = q.n_stop;
	q.n_stop = 0;
	if (!q.has_seed) /* an unseeded request draws its own sequence */
		q.p.sampling.seed = (uint64_t)dps_now_ns() ^ (f->seq * 0x9E3779B97F4A7C15ull);
	{
		struct dps_engine_req er = { q.prompt, q.n_prompt, q.p, -1, r };

		r->eid = dps_engine_submit(f->client, &er);
	}
	dps_request_free(&q);
	if (r->eid < 0) {
		send_error(f, hr->conn, 500, "internal_error", "cannot queue the request");
		for (int i = 0; i < r->n_stop; i++)
			free(r->stop[i]);
		free(r);
		return;
	}
	f->prompt_tokens += (uint64_t)r->n_prompt;
	list_add(f, r);
	if (r->stream)
		dps_http_stream_start(f->http, r->conn, 200, "text/event-stream");
}

static void models(struct dps_frontend *f, uint64_t conn)
{
	char *body = NULL;
	size_t n = 0;
	FILE *o = open_memstream(&body, &n);

	if (!o)
		return;
	fprintf(o, "{\"object\": \"list\", \"data\": [{\"id\": ");
	dps_json_string(o, f->o.model_name, strlen(f->o.model_name));
	fprintf(o, ", \"object\": \"model\", \"created\": %ld, \"owned_by\": \"dpshard\", "
		   "\"root\": ", f->started);
	dps_json_string(o, f->o.model_name, strlen(f->o.model_name));
	fprintf(o, ", \"max_model_len\": %d}]}\n", f->o.lim.max_model_len);
	fclose(o);
	dps_http_respond(f->http, conn, 200, "application/json", body, n, NULL, 0);
	free(body);
}

static const char *state_name(enum dps_fe_state s)
{
	static const char *const n[] = { "loading", "ready", "draining", "recovering" };

	return s <= DPS_FE_RECOVERING ? n[s] : "?";
}

static void health(struct dps_frontend *f, uint64_t conn)
{
	char body[128];
	const int ok = f->state == DPS_FE_READY;
	const int n = snprintf(body, sizeof(body), "{\"status\": \"%s\"}\n", state_name(f->state));

	dps_http_respond(f->http, conn, ok ? 200 : 503, "application/json", body, (size_t)n, NULL,
			 0);
}

void dps_frontend_on_request(void *arg, const struct dps_http_req *r)
{
	struct dps_frontend *f = arg;
	const int get = !strcmp(r->method, "GET"), post = !strcmp(r->method, "POST");

	if (!strcmp(r->path, "/health")) {
		if (get || !strcmp(r->method, "HEAD"))
			health(f, r->conn);
		else
			send_error(f, r->conn, 405, "invalid_request_error", "use GET /health");
		return;
	}
	if (!strcmp(r->path, "/metrics")) {
		if (get)
			dps_fe_metrics_page(f, r->conn);
		else
			send_error(f, r->conn, 405, "invalid_request_error", "use GET /metrics");
		return;
	}
	if (!strncmp(r->path, "/v1/", 4) && !authorized(f, r->authorization)) {
		send_error(f, r->conn, 401, "authentication_error",
			   "a valid API key is needed: Authorization: Bearer KEY");
		return;
	}
	if (!strcmp(r->path, "/v1/models")) {
		if (get)
			models(f, r->conn);
		else
			send_error(f, r->conn, 405, "invalid_request_error", "use GET /v1/models");
	} else if (!strcmp(r->path, "/v1/completions")) {
		if (post)
			completions(f, r);
		else
			send_error(f, r->conn, 405, "invalid_request_error",
				   "use POST /v1/completions");
	} else if (!strcmp(r->path, "/v1/chat/completions")) {
		send_error(f, r->conn, 400, "invalid_request_error",
			   "this model has no chat template, so /v1/chat/completions cannot format "
			   "its messages: use /v1/completions with a prompt");
	} else {
		char msg[192];

		snprintf(msg, sizeof(msg), "no such endpoint: %.64s %.64s", r->method, r->path);
		send_error(f, r->conn, 404, "not_found_error", msg);
	}
}

void dps_frontend_on_close(void *arg, uint64_t conn)
{
	struct dps_frontend *f = arg;

	for (struct fe_req *r = f->head; r; r = r->next)
		if (r->conn == conn && !r->conn_gone) {
			r->conn_gone = 1;
			if (!r->answered && f->client) {
				/* The client went away: its request stops and frees its blocks. */
				dps_engine_cancel(f->client, r->eid);
			}
		}
}

/* ---- life ------------------------------------------------------------------------------------ */

int dps_frontend_new(struct dps_frontend **out, const struct dps_frontend_opts *o)
{
	struct dps_frontend *f = calloc(1, sizeof(*f));

	*out = NULL;
	if (!f)
		return -ENOMEM;
	f->o = *o;
	f->rep = calloc((size_t)o->dp, sizeof(*f->rep));
	if (!f->rep) {
		free(f);
		return -ENOMEM;
	}
	dps_fe_metrics_init(f);
	f->started = (long)time(NULL);
	*out = f;
	return 0;
}

void dps_frontend_free(struct dps_frontend *f)
{
	if (!f)
		return;
	while (f->head)
		req_free(f, f->head);
	free(f->rep);
	free(f);
}

void dps_frontend_set_http(struct dps_frontend *f, struct dps_http *h)
{
	f->http = h;
}

void dps_frontend_set_client(struct dps_frontend *f, struct dps_engine_client *c)
{
	f->client = c;
}

void dps_frontend_set_state(struct dps_frontend *f, enum dps_fe_state s)
{
	f->state = s;
}

enum dps_fe_state dps_frontend_state(const struct dps_frontend *f)
{
	return f->state;
}

int dps_frontend_active(const struct dps_frontend *f)
{
	return f->active;
}

void dps_frontend_fail_all(struct dps_frontend *f, const char *why, int restart)
{
	if (f->client)
		dps_engine_fail_all(f->client, DPS_FINISH_ERROR);
	/* Anything the client did not know (never reached it) ends too. */
	while (f->head) {
		finish(f, f->head, DPS_FINISH_ERROR);
		req_free(f, f->head);
	}
	for (int d = 0; d < f->o.dp; d++) {
		f->base.preemptions += f->rep[d].preemptions;
		f->base.dummy_steps += f->rep[d].dummy_steps;
		f->base.steps += f->rep[d].steps;
		f->base.spec_drafts += f->rep[d].spec_drafts;
		f->base.spec_draft_tokens += f->rep[d].spec_draft_tokens;
		f->base.spec_accepted += f->rep[d].spec_accepted;
		for (int j = 0; j < DPS_MAX_SPEC; j++)
			f->base.spec_accepted_pos[j] += f->rep[d].spec_accepted_pos[j];
		if (f->rep[d].spec_k)
			f->base.spec_k = f->rep[d].spec_k;
		memset(&f->rep[d], 0, sizeof(f->rep[d]));
	}
	f->restarts += restart != 0;
	if (f->active || restart)
		dps_warn("%s: the requests in flight end with an error", why);
}

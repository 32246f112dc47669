/* SPDX-License-Identifier: MIT */
/*
 * engine/api/frontend.c - the OpenAI-compatible API of frontend.h, on the HTTP server and the
 * engine client, in the supervisor's loop.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/dps.h"
#include "common/json.h"
#include <liburing.h>
#include <poll.h>

#include "engine/api/frontend_int.h"
#include "engine/runtime/supervisor.h"

/* Worker threads that parse and encode requests (prep.h). */
#define PREP_THREADS 2

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

/* Answers a job whose parse failed. */
static void job_error(struct dps_frontend *f, const struct dps_prep_job *job)
{
	if (job->rc == -EINVAL)
		dps_fe_send_error(f, job->conn, 400, "invalid_request_error", job->err);
	else if (job->rc == -ENOENT)
		dps_fe_send_error(f, job->conn, 404, "not_found_error", job->err);
	else
		dps_fe_send_error(f, job->conn, 500, "internal_error", "out of memory");
}

/* A completions or chat request the worker parsed: to the engine. */
static void start_request(struct dps_frontend *f, struct dps_prep_job *job)
{
	struct dps_request *q = &job->req;
	char err[512];
	const char *why = unavailable(f);

	/* A request that arrived before SIGTERM is served during the drain, as when it was
	 * parsed at once. */
	if (why && job->while_ready && f->state == DPS_FE_DRAINING)
		why = NULL;
	if (why || !f->client) {
		dps_fe_send_error(f, job->conn, 503, "service_unavailable", why ? why : "not ready");
		return;
	}
	if (job->rc) {
		job_error(f, job);
		return;
	}
	if (q->model[0] && strcmp(q->model, f->o.model_name)) {
		snprintf(err, sizeof(err), "the model '%.100s' does not exist here (this server has "
			 "'%.100s')", q->model, f->o.model_name);
		dps_fe_send_error(f, job->conn, 404, "not_found_error", err);
		return;
	}
	if (dps_fe_submit(f, job))
		dps_fe_send_error(f, job->conn, 500, "internal_error", "out of memory");
}

static void job_unlink(struct dps_frontend *f, struct dps_prep_job *job)
{
	if (job->fprev)
		job->fprev->fnext = job->fnext;
	else
		f->jobs = job->fnext;
	if (job->fnext)
		job->fnext->fprev = job->fprev;
	f->n_jobs--;
}

/* A job the workers finished, on the loop thread. */
static void job_done(struct dps_frontend *f, struct dps_prep_job *job)
{
	job_unlink(f, job);
	if (job->conn_gone) {
		dps_prep_job_free(job);
		return;
	}
	switch (job->kind) {
	case DPS_PREP_COMPLETIONS:
	case DPS_PREP_CHAT:
		start_request(f, job);
		break;
	case DPS_PREP_TOKENIZE:
	case DPS_PREP_DETOKENIZE:
		if (job->rc)
			job_error(f, job);
		else
			dps_http_respond(f->http, job->conn, 200, "application/json", job->resp,
					 job->resp_len, NULL, 0);
		break;
	}
	dps_prep_job_free(job);
}

/* The poll on the workers' eventfd (one at a time, armed again after each completion). */
static void arm_poll(struct dps_frontend *f)
{
	struct io_uring_sqe *sqe;

	if (!f->ring || !f->prep || f->poll_armed)
		return;
	sqe = io_uring_get_sqe(f->ring);
	if (!sqe) {
		io_uring_submit(f->ring);
		sqe = io_uring_get_sqe(f->ring);
	}
	if (!sqe)
		return; /* tried again at the next completion or job */
	io_uring_prep_poll_add(sqe, dps_prep_fd(f->prep), POLLIN);
	io_uring_sqe_set_data64(sqe, DPS_FE_UDATA);
	f->poll_armed = 1;
}

void dps_frontend_cqe(struct dps_frontend *f, const struct io_uring_cqe *cqe)
{
	struct dps_prep_job *job, *next;

	(void)cqe;
	f->poll_armed = 0;
	if (!f->prep)
		return;
	for (job = dps_prep_take(f->prep); job; job = next) {
		next = job->next;
		job_done(f, job);
	}
	arm_poll(f);
}

void dps_frontend_tick(struct dps_frontend *f)
{
	arm_poll(f); /* when no submission entry was free the last time */
}

int dps_frontend_start_workers(struct dps_frontend *f, struct io_uring *ring)
{
	int rc = dps_prep_new(&f->prep, PREP_THREADS, &f->o.lim, f->o.model_name);

	if (rc)
		return rc;
	f->ring = ring;
	arm_poll(f);
	return 0;
}

/* Hands a body to the workers: parsing, templates and encoding never run on the loop. */
static void submit_job(struct dps_frontend *f, const struct dps_http_req *hr,
		       enum dps_prep_kind kind)
{
	struct dps_prep_job *job;
	const char *why = unavailable(f);

	if ((kind == DPS_PREP_COMPLETIONS || kind == DPS_PREP_CHAT) && (why || !f->client)) {
		dps_fe_send_error(f, hr->conn, 503, "service_unavailable", why ? why : "not ready");
		return;
	}
	job = calloc(1, sizeof(*job));
	if (job)
		job->body = malloc(hr->body_len ? hr->body_len : 1);
	if (!job || !job->body || !f->prep) {
		if (job)
			free(job->body);
		free(job);
		dps_fe_send_error(f, hr->conn, 500, "internal_error",
				  f->prep ? "out of memory" : "the workers are not running");
		return;
	}
	memcpy(job->body, hr->body, hr->body_len);
	job->len = hr->body_len;
	job->kind = kind;
	job->conn = hr->conn;
	job->t_arrive = dps_now_ns();
	job->while_ready = f->state == DPS_FE_READY;
	if (dps_prep_submit(f->prep, job)) {
		dps_prep_job_free(job);
		dps_fe_send_error(f, hr->conn, 503, "service_unavailable",
				  "too many requests are waiting to be read: try again shortly");
		return;
	}
	job->fnext = f->jobs;
	if (f->jobs)
		f->jobs->fprev = job;
	f->jobs = job;
	f->n_jobs++;
	arm_poll(f);
}

/* GET /v1/models (one: 0, the list) and /v1/models/{id} (one: 1, the model object). */
static void models(struct dps_frontend *f, uint64_t conn, int one)
{
	char *body = NULL;
	size_t n = 0;
	FILE *o = open_memstream(&body, &n);

	if (!o)
		return;
	fprintf(o, one ? "{\"id\": " : "{\"object\": \"list\", \"data\": [{\"id\": ");
	dps_json_string(o, f->o.model_name, strlen(f->o.model_name));
	fprintf(o, ", \"object\": \"model\", \"created\": %ld, \"owned_by\": \"dpshard\", "
		   "\"root\": ", f->started);
	dps_json_string(o, f->o.model_name, strlen(f->o.model_name));
	fprintf(o, ", \"max_model_len\": %d}%s\n", f->o.lim.max_model_len, one ? "" : "]}");
	fclose(o);
	dps_http_respond(f->http, conn, 200, "application/json", body, n, NULL, 0);
	free(body);
}

/* Whether the (percent-encoded) id of /v1/models/{id} names the served model. */
static int model_id_is(const char *id, const char *name)
{
	for (;; name++) {
		int c = (unsigned char)*id++;

		if (c == '%' && isxdigit((unsigned char)id[0]) && isxdigit((unsigned char)id[1])) {
			const char h[3] = { id[0], id[1], '\0' };

			c = (int)strtol(h, NULL, 16);
			id += 2;
		}
		if (c != (unsigned char)*name)
			return 0;
		if (!c)
			return 1;
	}
}

static void version(struct dps_frontend *f, uint64_t conn)
{
	char body[96];
	const int n = snprintf(body, sizeof(body), "{\"version\": \"%.64s\"}\n",
			       f->o.version ? f->o.version : "unknown");

	dps_http_respond(f->http, conn, 200, "application/json", body, (size_t)n, NULL, 0);
}

static const char *state_name(enum dps_fe_state s)
{
	static const char *const n[] = { "loading", "ready", "draining", "recovering" };

	return s <= DPS_FE_RECOVERING ? n[s] : "?";
}

/* 200 {"status": "ready"} when serving; else 503 with the state, and while recovering the
 * failure that caused it ("reason"). */
static void health(struct dps_frontend *f, uint64_t conn)
{
	const int ok = f->state == DPS_FE_READY;
	char *body = NULL;
	size_t n = 0;
	FILE *o = open_memstream(&body, &n);

	if (!o) { /* out of memory: the state alone, still an answer */
		char small[64];
		const int k = snprintf(small, sizeof(small), "{\"status\": \"%s\"}\n",
				       state_name(f->state));

		dps_http_respond(f->http, conn, ok ? 200 : 503, "application/json", small,
				 (size_t)k, NULL, 0);
		return;
	}
	fprintf(o, "{\"status\": \"%s\"", state_name(f->state));
	if (f->state == DPS_FE_RECOVERING && f->reason[0]) {
		fprintf(o, ", \"reason\": ");
		dps_json_string(o, f->reason, strlen(f->reason));
	}
	fprintf(o, "}\n");
	fclose(o);
	dps_http_respond(f->http, conn, ok ? 200 : 503, "application/json", body, n, NULL, 0);
	free(body);
}

void dps_frontend_on_request(void *arg, const struct dps_http_req *r)
{
	struct dps_frontend *f = arg;
	/* HEAD is GET without the body (the HTTP server leaves it out): every GET route. */
	const int get = !strcmp(r->method, "GET") || !strcmp(r->method, "HEAD");
	const int post = !strcmp(r->method, "POST");

	if (!strcmp(r->path, "/health")) {
		if (get)
			health(f, r->conn);
		else
			dps_fe_send_error(f, r->conn, 405, "invalid_request_error", "use GET /health");
		return;
	}
	if (!strcmp(r->path, "/metrics")) {
		if (get)
			dps_fe_metrics_page(f, r->conn);
		else
			dps_fe_send_error(f, r->conn, 405, "invalid_request_error", "use GET /metrics");
		return;
	}
	if (!strcmp(r->path, "/version")) {
		if (get)
			version(f, r->conn);
		else
			dps_fe_send_error(f, r->conn, 405, "invalid_request_error", "use GET /version");
		return;
	}
	if ((!strncmp(r->path, "/v1/", 4) || !strcmp(r->path, "/tokenize") ||
	     !strcmp(r->path, "/detokenize")) && !authorized(f, r->authorization)) {
		dps_fe_send_error(f, r->conn, 401, "authentication_error",
			   "a valid API key is needed: Authorization: Bearer KEY");
		return;
	}
	if (!strcmp(r->path, "/v1/models")) {
		if (get)
			models(f, r->conn, 0);
		else
			dps_fe_send_error(f, r->conn, 405, "invalid_request_error", "use GET /v1/models");
	} else if (!strncmp(r->path, "/v1/models/", 11)) {
		char msg[192];

		snprintf(msg, sizeof(msg), "the model '%.100s' does not exist", r->path + 11);
		if (!get)
			dps_fe_send_error(f, r->conn, 405, "invalid_request_error",
					  "use GET /v1/models/{id}");
		else if (model_id_is(r->path + 11, f->o.model_name))
			models(f, r->conn, 1);
		else
			dps_fe_send_error(f, r->conn, 404, "not_found_error", msg);
	} else if (!strcmp(r->path, "/v1/completions") || !strcmp(r->path, "/v1/chat/completions")) {
		const int chat = r->path[4] == 'c' && r->path[5] == 'h';

		if (post)
			submit_job(f, r, chat ? DPS_PREP_CHAT : DPS_PREP_COMPLETIONS);
		else
			dps_fe_send_error(f, r->conn, 405, "invalid_request_error",
					  chat ? "use POST /v1/chat/completions"
					       : "use POST /v1/completions");
	} else if (!strcmp(r->path, "/tokenize") || !strcmp(r->path, "/detokenize")) {
		const int detok = r->path[1] == 'd';

		if (post)
			submit_job(f, r, detok ? DPS_PREP_DETOKENIZE : DPS_PREP_TOKENIZE);
		else
			dps_fe_send_error(f, r->conn, 405, "invalid_request_error",
					  detok ? "use POST /detokenize" : "use POST /tokenize");
	} else {
		char msg[192];

		snprintf(msg, sizeof(msg), "no such endpoint: %.64s %.64s", r->method, r->path);
		dps_fe_send_error(f, r->conn, 404, "not_found_error", msg);
	}
}

void dps_frontend_on_close(void *arg, uint64_t conn)
{
	struct dps_frontend *f = arg;

	for (struct dps_prep_job *j = f->jobs, *next; j; j = next) {
		next = j->fnext;
		if (j->conn != conn)
			continue;
		if (dps_prep_cancel(f->prep, j)) { /* not started: never read */
			job_unlink(f, j);
			dps_prep_job_free(j);
		} else {
			j->conn_gone = 1; /* its answer is dropped when the workers give it back */
		}
	}

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
		dps_fe_req_free(f, f->head);
	dps_prep_free(f->prep); /* the jobs still in flight go with it */
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
	return f->active + f->n_jobs;
}

void dps_frontend_fail_all(struct dps_frontend *f, const char *why, int restart)
{
	if (f->client)
		dps_engine_fail_all(f->client, DPS_FINISH_ERROR);
	/* Anything the client did not know (never reached it) ends too. */
	while (f->head) {
		dps_fe_finish(f, f->head, DPS_FINISH_ERROR);
		dps_fe_req_free(f, f->head);
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
	if (restart)
		snprintf(f->reason, sizeof(f->reason), "%s", why);
	if (f->active || restart)
		dps_warn("%s: the requests in flight end with an error", why);
}

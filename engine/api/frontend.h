/* SPDX-License-Identifier: MIT */
/*
 * engine/api/frontend.h - the OpenAI-compatible HTTP API of `dpshard serve` (docs/DESIGN.md
 * section 5), in the supervisor: it validates requests, hands them to the engine client (which
 * balances them over the replicas), and streams the tokens back.
 *
 * Endpoints: POST /v1/completions and POST /v1/chat/completions (request.h; "stream":
 * server-sent events ending in "data: [DONE]"; chat needs the model's chat template), POST
 * /tokenize and POST /detokenize (as vLLM's), GET /v1/models, GET /health (200 when every rank has loaded the model and the service takes
 * requests; 503 while loading, draining or recovering), GET /metrics (Prometheus text).
 * With an API key, the /v1 endpoints want "Authorization: Bearer KEY" (compared in constant
 * time). Every error is a JSON object {"error": {"message", "type", "code"}}.
 *
 * A completion's text is the tokenizer's pieces; "stop" strings end it (the text stops before
 * the stop string, which streaming never shows: text that may begin one is held back). A client
 * that goes away cancels its request; a request's deadline ends it with "timeout".
 */
#ifndef DPS_ENGINE_FRONTEND_H
#define DPS_ENGINE_FRONTEND_H

#include <stdint.h>
#include <stdio.h>

#include "engine/serve/engine.h"
#include "engine/api/http.h"
#include "engine/api/request.h"

enum dps_fe_state { DPS_FE_LOADING, DPS_FE_READY, DPS_FE_DRAINING, DPS_FE_RECOVERING };

struct dps_frontend_opts {
	const char *model_name;       /* as /v1/models lists it and requests name it */
	const char *version;          /* GET /version's (NULL: "unknown") */
	const char *fingerprint;      /* the responses' system_fingerprint (NULL: none) */
	const char *api_key;          /* NULL: none */
	struct dps_req_limits lim;
	int dp, tp;
	int prefill;  /* of the dp replicas, the last `prefill` are prefill replicas (0: none) */
	int log_requests;             /* a log line per request */
};

struct dps_frontend;

int dps_frontend_new(struct dps_frontend **out, const struct dps_frontend_opts *o);
void dps_frontend_free(struct dps_frontend *f);

/* Completions on the shared ring with this bit in their user_data are the frontend's. */
#define DPS_FE_UDATA (1ull << 62)

struct io_uring;
struct io_uring_cqe;
/*
 * Starts the worker threads that parse, render and encode requests (prep.h) and the poll of
 * their eventfd on ring. Returns 0 or a negative code.
 */
int dps_frontend_start_workers(struct dps_frontend *f, struct io_uring *ring);
/* Handles a completion carrying DPS_FE_UDATA. */
void dps_frontend_cqe(struct dps_frontend *f, const struct io_uring_cqe *cqe);
/* Before each wait of the loop: arms the workers' poll again if it could not be armed. */
void dps_frontend_tick(struct dps_frontend *f);

/* The HTTP server's callbacks (dps_http_opts.on_request / on_close, arg = the frontend). */
void dps_frontend_on_request(void *f, const struct dps_http_req *r);
void dps_frontend_on_close(void *f, uint64_t conn);
void dps_frontend_set_http(struct dps_frontend *f, struct dps_http *h);

/* The engine client's callbacks, and the client of the current run (NULL between runs). */
extern const struct dps_engine_cb dps_frontend_engine_cb; /* arg: set to the frontend */
void dps_frontend_set_client(struct dps_frontend *f, struct dps_engine_client *c);

void dps_frontend_set_state(struct dps_frontend *f, enum dps_fe_state s);
enum dps_fe_state dps_frontend_state(const struct dps_frontend *f);

/* Requests accepted and not yet answered in full (those the workers still read included). */
int dps_frontend_active(const struct dps_frontend *f);

/*
 * Ends every request in flight with finish_reason "error" (the ranks died, or the service
 * stops; the client's requests are gone with them); restart: count a restart of the ranks.
 */
void dps_frontend_fail_all(struct dps_frontend *f, const char *why, int restart);

/* Writes /metrics' text to out (for tests and the endpoint). */
void dps_frontend_metrics(struct dps_frontend *f, FILE *out);

#endif

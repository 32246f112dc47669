/* SPDX-License-Identifier: MIT */
/*
 * engine/api/frontend_int.h - what frontend.c and metrics.c share: a request in flight, the
 * frontend's state and counters, and the histograms of /metrics.
 */
#ifndef DPS_ENGINE_API_FRONTEND_INT_H
#define DPS_ENGINE_API_FRONTEND_INT_H

#include <stdint.h>
#include <stdio.h>

#include "engine/api/frontend.h"
#include "engine/api/prep.h"
#include "engine/model/tok.h"

/* A Prometheus histogram: cumulative counts at the bucket bounds b[0..n-1], and +Inf. */
struct hist {
	const double *b;
	int n;                 /* at most 31 */
	uint64_t count[32];    /* count[i]: observations <= b[i]; count[n]: all */
	double sum;
	double own[31];        /* b, when the bounds are computed (the token counts') */
};


/* The message of a request the engine failed (500, or the error object of a stream). */
#define DPS_FE_FAILED_MSG \
	"the engine failed while running this request (a rank died, or the service stopped); " \
	"it was not completed: send it again"

/* The message of an answer the frontend had no memory to write (a plain literal: no escapes). */
#define DPS_FE_OOM_MSG "the server ran out of memory while writing this response: send it again"

/* An HTTP request of the API: its choices (one fe_req each) and what they share. */
struct fe_group {
	int n_choices, n_open;        /* choices; those not finished yet */
	int n;                        /* the request's "n": choices per prompt */
	int n_refs;                   /* choices not freed yet */
	int failed;                   /* a choice failed: a whole body becomes a 500 */
	int stream_started;
	char id[40];
	long created;
	long prompt_tokens;           /* usage: each prompt once */
	long gen_tokens;              /* usage: every choice's */
	char **body;                  /* (n_choices) each finished choice's JSON object (a whole
				       * body), malloc'd */
	size_t *body_len;
};

struct fe_req {
	struct dps_frontend *f;
	struct fe_group *g;           /* the HTTP request this choice is of */
	int index;                    /* the choice's "index": prompt i's sample j is i * n + j */
	struct fe_req *prev, *next;   /* the list of requests in flight */
	uint64_t conn;
	int conn_gone;
	int64_t eid;                  /* the engine's id */
	int stream, include_usage;
	char id[40];
	long created;
	int n_prompt;                 /* prompt length */
	size_t text0;                 /* bytes of text that are the prompt echoed ("echo") */
	int want_lp;                  /* "logprobs": lps holds every generated token's */
	struct dps_token_logprobs *lps; /* (cap_gen) */
	long lp_offset;               /* completions: the next token's text_offset */
	/* "echo" with "logprobs": an entry per prompt token (the first has none: n_top -1), in
	 * order as the engine sends them before the first generated token */
	struct dps_token_logprobs *plps; /* (n_prompt) */
	int n_plps;
	int chat;                     /* answered as chat.completion(.chunk) */
	struct dps_tok_stream *ts;    /* the text of the tokens (NULL: no tokenizer) */
	int *gen, n_gen, cap_gen;
	char *text;                   /* the completion's text so far */
	size_t len, cap, emitted;     /* bytes of text; bytes already streamed */
	int ids_emitted;              /* token ids already streamed */
	char *stop[DPS_REQ_MAX_STOP];
	size_t stop_len[DPS_REQ_MAX_STOP];
	int n_stop;
	size_t max_stop;
	int min_tokens;               /* no stop string counts before this many tokens (vLLM) */
	size_t stop_floor;            /* and none that ends within text[0 .. stop_floor) */
	int answered;                 /* the response is complete (or the client is gone) */
	int max_tokens;               /* the request's limit (given, or the default) */
	uint64_t t_arrive, t_first, t_last;
	uint64_t t_sched;             /* its first step on the replica (0: unknown) */
};

struct dps_frontend {
	struct dps_frontend_opts o;
	struct dps_http *http;
	struct dps_engine_client *client;
	enum dps_fe_state state;
	char reason[512];             /* why the last failure happened, for /health (or "") */
	struct fe_req *head;
	int active;
	long started;
	uint64_t seq;
	/* counters */
	uint64_t prompt_tokens, gen_tokens, requests[8], http_errors, restarts;
	struct hist ttft, itl, e2e, tpot;
	/* per request, at its end: the phases (queue, prefill, decode, inference) and the sizes */
	struct hist queue, prefill, decode, infer;
	struct hist prompt_len, gen_len, n_param, max_tokens;
	/* the replicas' latest counts, and what earlier runs (before a restart) added */
	struct dps_engine_stats *rep, base;
	uint64_t *base_group_ns;      /* (dp * DPS_ENGINE_GROUPS) */
	/* the worker threads, and the jobs submitted to them not yet taken back */
	struct io_uring *ring;
	struct dps_prep *prep;
	struct dps_prep_job *jobs;
	int n_jobs;                   /* on that list */
	int poll_armed;
};

/* ---- choice.c -------------------------------------------------------------------------------- */

/* A request the worker parsed (job->req): its choices to the engine. 0 or -ENOMEM (the caller
 * answers 500). */
int dps_fe_submit(struct dps_frontend *f, struct dps_prep_job *job);
/* The end of choice r: its part of the response (unless the client is gone), metrics, the log
 * line; once per choice. */
void dps_fe_finish(struct dps_frontend *f, struct fe_req *r, enum dps_finish why);
/* Cancels the engine requests of r's group still running (r itself has ended). */
void dps_fe_cancel_siblings(struct dps_frontend *f, const struct fe_req *r);
void dps_fe_req_free(struct dps_frontend *f, struct fe_req *r);

/* ---- respond.c ------------------------------------------------------------------------------- */

/* A JSON error response: {"error": {"message", "type", "code"}}. */
void dps_fe_send_error(struct dps_frontend *f, uint64_t conn, int status, const char *type,
		       const char *msg);
/* Starts r's event stream (a chat stream with the assistant's role). */
void dps_fe_stream_begin(struct dps_frontend *f, struct fe_req *r);
/* Streams text[emitted .. upto) (and, for completions, the ids not streamed yet) as one event;
 * nothing when there is nothing new. */
void dps_fe_stream_text(struct dps_frontend *f, struct fe_req *r, size_t upto);
/* The end of r's response: the rest of its stream, or its whole body. */
void dps_fe_respond_final(struct dps_frontend *f, struct fe_req *r, const char *fin);

/* ---- metrics.c ------------------------------------------------------------------------------- */

/* The histograms' buckets (vLLM's). */
void dps_fe_metrics_init(struct dps_frontend *f);
/* Counts one observation of v. */
void dps_fe_hist_add(struct hist *h, double v);
/* Request r ended at now (any reason): its e2e latency, time per output token, sizes. */
void dps_fe_metrics_finished(struct dps_frontend *f, const struct fe_req *r, uint64_t now);
/* The engine's done for r, which produced a token and whose first step is known: its queue,
 * prefill, decode and inference times. */
void dps_fe_metrics_phases(struct dps_frontend *f, const struct fe_req *r);
/* GET /metrics on connection conn. */
void dps_fe_metrics_page(struct dps_frontend *f, uint64_t conn);

/* ---- metrics_proc.c -------------------------------------------------------------------------- */

/* Prometheus' process_* series of this process (the supervisor), and each rank's memory and
 * CPU time by rank label. */
void dps_fe_metrics_process(struct dps_frontend *f, FILE *o);

#endif

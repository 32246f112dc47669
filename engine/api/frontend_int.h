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

/* A Prometheus histogram: cumulative counts at the bucket bounds b[0..n-1], and +Inf. */
struct hist {
	const double *b;
	int n;
	uint64_t count[32];    /* count[i]: observations <= b[i]; count[n]: all */
	double sum;
};


struct fe_req {
	struct dps_frontend *f;
	struct fe_req *prev, *next;   /* the list of requests in flight */
	uint64_t conn;
	int conn_gone;
	int64_t eid;                  /* the engine's id */
	int stream, include_usage;
	char id[40];
	long created;
	int n_prompt, last;           /* prompt length; the last token (for the next piece) */
	int *gen, n_gen, cap_gen;
	char *text;                   /* the completion's text so far */
	size_t len, cap, emitted;     /* bytes of text; bytes already streamed */
	int ids_emitted;              /* token ids already streamed */
	char *stop[DPS_REQ_MAX_STOP];
	size_t stop_len[DPS_REQ_MAX_STOP];
	int n_stop;
	size_t max_stop;
	int answered;                 /* the response is complete (or the client is gone) */
	uint64_t t_arrive, t_first, t_last;
};

struct dps_frontend {
	struct dps_frontend_opts o;
	struct dps_http *http;
	struct dps_engine_client *client;
	enum dps_fe_state state;
	struct fe_req *head;
	int active;
	long started;
	uint64_t seq;
	/* counters */
	uint64_t prompt_tokens, gen_tokens, requests[8], http_errors, restarts;
	struct hist ttft, itl, e2e;
	/* the replicas' latest counts, and what earlier runs (before a restart) added */
	struct dps_engine_stats *rep, base;
	uint64_t *base_group_ns;      /* (dp * DPS_ENGINE_GROUPS) */
};

/* A JSON error response: {"error": {"message", "type", "code"}}. */

/* ---- metrics.c ------------------------------------------------------------------------------- */

/* The histograms' buckets (vLLM's). */
void dps_fe_metrics_init(struct dps_frontend *f);
/* Counts one observation of v. */
void dps_fe_hist_add(struct hist *h, double v);
/* GET /metrics on connection conn. */
void dps_fe_metrics_page(struct dps_frontend *f, uint64_t conn);

#endif

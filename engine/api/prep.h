/* SPDX-License-Identifier: MIT */
/*
 * engine/api/prep.h - the HTTP frontend's worker threads: what may take long for one request
 * (parsing its body, rendering a chat template, encoding a long prompt, answering /tokenize
 * and /detokenize) runs here, off the supervisor's event loop, so that /health, the other
 * requests, the engine's tokens and SIGTERM never wait for it. The loop submits a job and is
 * woken through an eventfd (dps_prep_fd) when jobs are done; it then takes them back in the
 * order they finished. Jobs share nothing but the read-only limits (tokenizer, template).
 */
#ifndef DPS_ENGINE_API_PREP_H
#define DPS_ENGINE_API_PREP_H

#include <stddef.h>
#include <stdint.h>

#include "engine/api/request.h"

enum dps_prep_kind {
	DPS_PREP_COMPLETIONS, /* POST /v1/completions: a dps_request */
	DPS_PREP_CHAT,        /* POST /v1/chat/completions: a dps_request */
	DPS_PREP_TOKENIZE,    /* POST /tokenize: a whole response */
	DPS_PREP_DETOKENIZE,  /* POST /detokenize: a whole response */
};

struct dps_prep_job {
	struct dps_prep_job *next;    /* the prep's queues (owned by it while submitted) */
	struct dps_prep_job *fprev, *fnext; /* the frontend's list of jobs in flight */
	enum dps_prep_kind kind;
	uint64_t conn;
	int conn_gone;                /* set by the frontend (loop thread only) */
	int while_ready;              /* submitted while the service took requests (loop only) */
	uint64_t t_arrive;
	char *body;                   /* len bytes, malloc'd, freed with the job */
	size_t len;
	/* results: rc 0 or a negative code with err (-EINVAL: a 400) */
	int rc;
	char err[512];
	struct dps_request req;       /* COMPLETIONS, CHAT */
	struct dps_tok_stream **ts;   /* (n_ts) COMPLETIONS, CHAT with a tokenizer: each choice's,
				       * primed with its prompt */
	int n_ts;
	char *resp;                   /* TOKENIZE, DETOKENIZE: the JSON body (malloc'd) */
	size_t resp_len;
};

struct dps_prep;

/*
 * Starts n worker threads (1 to 16) over the limits lim (which must outlive the prep). Returns
 * 0, -ENOMEM or -errno (threads, eventfd).
 */
int dps_prep_new(struct dps_prep **out, int n, const struct dps_req_limits *lim,
		 const char *model_name);
/* The eventfd that becomes readable when jobs are done. */
int dps_prep_fd(const struct dps_prep *p);
/* Queues job (the prep owns it until dps_prep_take returns it). 0 or -EAGAIN (too many jobs,
 * or too many bytes of bodies, wait). */
int dps_prep_submit(struct dps_prep *p, struct dps_prep_job *job);
/* Takes job back if no worker has started it (1: the caller owns it again), else 0 (it is
 * worked on or done, and comes back through dps_prep_take). */
int dps_prep_cancel(struct dps_prep *p, struct dps_prep_job *job);
/* Takes the jobs done so far (a list through ->next, oldest first), or NULL. Clears the fd. */
struct dps_prep_job *dps_prep_take(struct dps_prep *p);
/* Stops the threads (a job being worked on finishes first) and frees every job left. */
void dps_prep_free(struct dps_prep *p);
/* Frees one job and what it holds. */
void dps_prep_job_free(struct dps_prep_job *job);

/* The work of a job, run on the calling thread (the workers call it; so do tests). */
void dps_prep_run(const struct dps_req_limits *lim, const char *model_name,
		  struct dps_prep_job *job);

/*
 * POST /tokenize (detok 0) and POST /detokenize (detok 1), as vLLM answers them:
 *   {"prompt": "text", "add_special_tokens": true} or {"messages": [...],
 *   "add_generation_prompt": true, "add_special_tokens": false, ...}
 *     -> {"count": N, "max_model_len": M, "tokens": [...], "token_strs": null}
 *   {"tokens": [ids]} -> {"prompt": "text"}
 * Returns 0 with *resp (malloc'd JSON) or -EINVAL (err: the 400's message) / -ENOMEM.
 */
int dps_tokenize_answer(const char *body, size_t len, const struct dps_req_limits *lim,
			const char *model_name, int detok, char **resp, size_t *resp_len,
			char *err, size_t errlen);

#endif

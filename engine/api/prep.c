/* SPDX-License-Identifier: MIT */
/*
 * engine/api/prep.c - the frontend's worker threads (see prep.h): a queue of jobs under one
 * mutex, a condition variable the workers sleep on, and an eventfd that wakes the event loop
 * when a job is done. Workers block while there is nothing to do: no thread spins.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/api/prep.h"

#define MAX_QUEUED 4096
#define MAX_QUEUED_BYTES (256ull << 20) /* of request bodies waiting or being read */

struct dps_prep {
	const struct dps_req_limits *lim;
	char model[128];
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct dps_prep_job *waiting, *waiting_tail; /* FIFO */
	struct dps_prep_job *done, *done_tail; /* FIFO */
	int queued, stop, n;
	unsigned long long bytes;   /* of the bodies of the jobs queued */
	int efd;
	pthread_t th[16];
};

void dps_prep_job_free(struct dps_prep_job *job)
{
	if (!job)
		return;
	dps_request_free(&job->req);
	for (int i = 0; i < job->n_ts; i++)
		dps_tok_stream_free(job->ts[i]);
	free(job->ts);
	free(job->body);
	free(job->resp);
	free(job);
}

void dps_prep_run(const struct dps_req_limits *lim, const char *model_name,
		  struct dps_prep_job *job)
{
	job->err[0] = '\0';
	switch (job->kind) {
	case DPS_PREP_COMPLETIONS:
	case DPS_PREP_CHAT:
		job->rc = dps_request_parse(job->body, job->len,
					    job->kind == DPS_PREP_CHAT ? DPS_REQ_CHAT
								       : DPS_REQ_COMPLETIONS,
					    lim, &job->req, job->err, sizeof(job->err));
		/* Each choice's text decoder, primed with its prompt here, off the loop too: choice
		 * c is prompt c / n's. */
		if (!job->rc && lim->tok) {
			const int n = job->req.n_prompts * job->req.n;

			job->ts = calloc((size_t)n, sizeof(*job->ts));
			job->rc = job->ts ? 0 : -ENOMEM;
			for (int c = 0; c < n && !job->rc; c++, job->n_ts++) {
				const struct dps_req_prompt *pr = &job->req.prompts[c / job->req.n];

				job->rc = dps_tok_stream_new(&job->ts[c], lim->tok, pr->ids,
							     (size_t)pr->n, DPS_TOK_SKIP_SPECIAL);
			}
		}
		if (job->rc == -ENOMEM)
			snprintf(job->err, sizeof(job->err), "out of memory");
		break;
	case DPS_PREP_TOKENIZE:
	case DPS_PREP_DETOKENIZE:
		job->rc = dps_tokenize_answer(job->body, job->len, lim, model_name,
					      job->kind == DPS_PREP_DETOKENIZE, &job->resp,
					      &job->resp_len, job->err, sizeof(job->err));
		break;
	}
}

static void *worker(void *arg)
{
	struct dps_prep *p = arg;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		struct dps_prep_job *job;
		const uint64_t one = 1;

		while (!p->waiting && !p->stop)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->stop)
			break;
		job = p->waiting;
		p->waiting = job->next;
		if (!p->waiting)
			p->waiting_tail = NULL;
		pthread_mutex_unlock(&p->mu);
		dps_prep_run(p->lim, p->model, job);
		pthread_mutex_lock(&p->mu);
		job->next = NULL;
		if (p->done_tail)
			p->done_tail->next = job;
		else
			p->done = job;
		p->done_tail = job;
		/* The loop reads the counter back to 0 in dps_prep_take; a write cannot fail
		 * short of 2^64 - 1 unread wakes. */
		if (write(p->efd, &one, sizeof(one)) < 0)
			dps_warn("prep: cannot wake the event loop: %s", strerror(errno));
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int dps_prep_new(struct dps_prep **out, int n, const struct dps_req_limits *lim,
		 const char *model_name)
{
	struct dps_prep *p = calloc(1, sizeof(*p));
	int rc;

	*out = NULL;
	if (!p)
		return -ENOMEM;
	if (n < 1)
		n = 1;
	if (n > 16)
		n = 16;
	p->lim = lim;
	snprintf(p->model, sizeof(p->model), "%s", model_name ? model_name : "");
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (p->efd < 0) {
		rc = -errno;
		free(p);
		return rc;
	}
	for (p->n = 0; p->n < n; p->n++) {
		rc = pthread_create(&p->th[p->n], NULL, worker, p);
		if (rc) {
			dps_prep_free(p);
			return -rc;
		}
	}
	*out = p;
	return 0;
}

int dps_prep_fd(const struct dps_prep *p)
{
	return p->efd;
}

int dps_prep_submit(struct dps_prep *p, struct dps_prep_job *job)
{
	pthread_mutex_lock(&p->mu);
	if (p->queued >= MAX_QUEUED || p->bytes + job->len > MAX_QUEUED_BYTES) {
		pthread_mutex_unlock(&p->mu);
		return -EAGAIN;
	}
	p->bytes += job->len;
	job->next = NULL;
	if (p->waiting_tail)
		p->waiting_tail->next = job;
	else
		p->waiting = job;
	p->waiting_tail = job;
	p->queued++;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
	return 0;
}

struct dps_prep_job *dps_prep_take(struct dps_prep *p)
{
	struct dps_prep_job *list;
	uint64_t v;

	if (read(p->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		dps_warn("prep: reading the eventfd: %s", strerror(errno));
	pthread_mutex_lock(&p->mu);
	list = p->done;
	p->done = p->done_tail = NULL;
	for (struct dps_prep_job *j = list; j; j = j->next) {
		p->queued--;
		p->bytes -= j->len;
	}
	pthread_mutex_unlock(&p->mu);
	return list;
}

int dps_prep_cancel(struct dps_prep *p, struct dps_prep_job *job)
{
	struct dps_prep_job **pp, *prev = NULL;
	int found = 0;

	pthread_mutex_lock(&p->mu);
	for (pp = &p->waiting; *pp; prev = *pp, pp = &(*pp)->next)
		if (*pp == job) {
			*pp = job->next;
			if (p->waiting_tail == job)
				p->waiting_tail = prev;
			p->queued--;
			p->bytes -= job->len;
			found = 1;
			break;
		}
	pthread_mutex_unlock(&p->mu);
	return found;
}

void dps_prep_free(struct dps_prep *p)
{
	struct dps_prep_job *j, *next;

	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = 1;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (int i = 0; i < p->n; i++)
		pthread_join(p->th[i], NULL);
	for (j = p->waiting; j; j = next) {
		next = j->next;
		dps_prep_job_free(j);
	}
	for (j = p->done; j; j = next) {
		next = j->next;
		dps_prep_job_free(j);
	}
	close(p->efd);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p);
}

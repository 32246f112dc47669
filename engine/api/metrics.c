/* SPDX-License-Identifier: MIT */
/*
 * engine/api/metrics.c - GET /metrics of `dpshard serve`: Prometheus text with vLLM's metric
 * names (requests running and waiting per replica, KV-cache usage, tokens, finished requests
 * by reason, preemptions, the latency histograms, speculative decoding) and dpshard's own
 * (steps, dummy batches, errors, restarts, time in each group set's collectives); the
 * request histograms are filled by frontend.c through dps_fe_metrics_finished and _phases,
 * the process_* series by metrics_proc.c.
 */
#include <stdio.h>
#include <stdlib.h>

#include "engine/api/frontend_int.h"

static const double ttft_b[] = { 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
				 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0 };
static const double itl_b[] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
				0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0 };
static const double e2e_b[] = { 0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
				15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0 };
static const double tpot_b[] = { 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
				 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0 };
/* vLLM's request_latency_buckets: the queue, prefill, decode and inference times */
static const double phase_b[] = { 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
				  40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0 };
static const double n_b[] = { 1, 2, 5, 10, 20 };
#define NB(a) (int)(sizeof(a) / sizeof(a[0]))

/* vLLM's build_1_2_5_buckets(max): 1, 2, 5, 10, 20, 50, ... while <= max, into h->own. */
static void hist_1_2_5(struct hist *h, long max)
{
	static const int m[3] = { 1, 2, 5 };
	double p = 1.0;

	*h = (struct hist){ .n = 0 };
	for (; h->n < NB(h->own); p *= 10.0)
		for (int i = 0; i < 3 && h->n < NB(h->own); i++) {
			if (m[i] * p > (double)max)
				goto out;
			h->own[h->n++] = m[i] * p;
		}
out:
	h->b = h->own;
}

void dps_fe_metrics_init(struct dps_frontend *f)
{
	/* (without a context limit, the token counts' buckets stop at a million) */
	const long len = f->o.lim.max_model_len > 0 ? f->o.lim.max_model_len : 1000000;

	f->ttft = (struct hist){ .b = ttft_b, .n = NB(ttft_b) };
	f->itl = (struct hist){ .b = itl_b, .n = NB(itl_b) };
	f->e2e = (struct hist){ .b = e2e_b, .n = NB(e2e_b) };
	f->tpot = (struct hist){ .b = tpot_b, .n = NB(tpot_b) };
	f->queue = (struct hist){ .b = phase_b, .n = NB(phase_b) };
	f->prefill = f->decode = f->infer = f->queue;
	f->n_param = (struct hist){ .b = n_b, .n = NB(n_b) };
	hist_1_2_5(&f->prompt_len, len);
	hist_1_2_5(&f->gen_len, len);
	hist_1_2_5(&f->max_tokens, len);
}

static double seconds_between(uint64_t from, uint64_t to)
{
	return to > from ? (double)(to - from) / 1e9 : 0.0;
}

void dps_fe_metrics_finished(struct dps_frontend *f, const struct fe_req *r, uint64_t now)
{
	dps_fe_hist_add(&f->e2e, seconds_between(r->t_arrive, now));
	if (r->n_gen > 1)
		dps_fe_hist_add(&f->tpot, seconds_between(r->t_first, r->t_last) / (r->n_gen - 1));
	dps_fe_hist_add(&f->prompt_len, r->n_prompt);
	dps_fe_hist_add(&f->gen_len, r->n_gen);
	/* Once per prompt, with its "n": vLLM makes each prompt of a batch its own request with
	 * the body's n (choice i * n is prompt i's first sample). */
	if (!r->g || r->index % r->g->n == 0)
		dps_fe_hist_add(&f->n_param, r->g ? r->g->n : 1);
	dps_fe_hist_add(&f->max_tokens, r->max_tokens);
}

/* vLLM's phases of a finished request: queue, arrival to the first step; prefill, first step
 * to first token; decode, first token to last; inference, first step to last token. Times are
 * the supervisor's for arrival and tokens, the replica's for the first step (one clock). */
void dps_fe_metrics_phases(struct dps_frontend *f, const struct fe_req *r)
{
	dps_fe_hist_add(&f->queue, seconds_between(r->t_arrive, r->t_sched));
	dps_fe_hist_add(&f->prefill, seconds_between(r->t_sched, r->t_first));
	dps_fe_hist_add(&f->decode, seconds_between(r->t_first, r->t_last));
	dps_fe_hist_add(&f->infer, seconds_between(r->t_sched, r->t_last));
}

void dps_fe_hist_add(struct hist *h, double v)
{
	for (int i = 0; i < h->n; i++)
		if (v <= h->b[i])
			h->count[i]++;
	h->count[h->n]++;
	h->sum += v;
}

static void hist_print(FILE *o, const char *name, const char *help, const struct hist *h)
{
	fprintf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	for (int i = 0; i < h->n; i++)
		fprintf(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->b[i],
			(unsigned long long)h->count[i]);
	fprintf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
		(unsigned long long)h->count[h->n], name, h->sum, name,
		(unsigned long long)h->count[h->n]);
}


/* s as a Prometheus label value (backslash, quote and newline escaped), in buf. */
static const char *label(const char *s, char *buf, size_t len)
{
	size_t n = 0;

	for (; *s && n + 3 < len; s++) {
		if (*s == '\\' || *s == '"' || *s == '\n') {
			buf[n++] = '\\';
			buf[n++] = *s == '\n' ? 'n' : *s;
		} else {
			buf[n++] = *s;
		}
	}
	buf[n] = '\0';
	return buf;
}

/*
 * Disaggregated serving: each replica's role (its queue is vllm:num_requests_waiting of its
 * engine), the prefill replicas' hand-offs and the blocks they still hold, the decode
 * replicas' pulls (this run).
 */
static void handoff_metrics(struct dps_frontend *f, FILE *o)
{
	uint64_t handoffs = 0, held = 0, pulls = 0, bytes = 0, ns = 0;

	fprintf(o, "# HELP dpshard:replica_role 1 for each replica's role (decode or prefill).\n"
		   "# TYPE dpshard:replica_role gauge\n");
	for (int d = 0; d < f->o.dp; d++) {
		const struct dps_engine_stats *s = &f->rep[d];

		fprintf(o, "dpshard:replica_role{engine=\"%d\",role=\"%s\"} 1\n", d,
			d >= f->o.dp - f->o.prefill ? "prefill" : "decode");
		handoffs += s->handoffs;
		held += s->handoff_held;
		pulls += s->kv_pulls;
		bytes += s->kv_pull_bytes;
		ns += s->kv_pull_ns;
	}
	fprintf(o, "# HELP dpshard:kv_handoffs_total Requests the prefill replicas handed to a "
		   "decode replica (this run).\n# TYPE dpshard:kv_handoffs_total counter\n"
		   "dpshard:kv_handoffs_total %llu\n"
		   "# HELP dpshard:kv_handoffs_in_flight Handed-over requests whose KV blocks a "
		   "prefill replica still holds (not yet pulled).\n"
		   "# TYPE dpshard:kv_handoffs_in_flight gauge\ndpshard:kv_handoffs_in_flight %llu\n"
		   "# HELP dpshard:kv_transfers_total KV transfers the decode replicas pulled (this "
		   "run).\n# TYPE dpshard:kv_transfers_total counter\n"
		   "dpshard:kv_transfers_total %llu\n"
		   "# HELP dpshard:kv_transfer_bytes_total KV bytes TP rank 0 of the decode replicas "
		   "copied in (this run).\n# TYPE dpshard:kv_transfer_bytes_total counter\n"
		   "dpshard:kv_transfer_bytes_total %llu\n"
		   "# HELP dpshard:kv_transfer_seconds_total Time TP rank 0 of the decode replicas "
		   "spent copying (this run).\n# TYPE dpshard:kv_transfer_seconds_total counter\n"
		   "dpshard:kv_transfer_seconds_total %.9f\n",
		(unsigned long long)handoffs, (unsigned long long)held, (unsigned long long)pulls,
		(unsigned long long)bytes, (double)ns / 1e9);
}

/* Speculative decoding, when a draft runs: vLLM's spec_decode counters and two ratios. */
static void spec_metrics(struct dps_frontend *f, FILE *o, const char *name)
{
	struct dps_engine_stats t = f->base;

	for (int d = 0; d < f->o.dp; d++) {
		const struct dps_engine_stats *s = &f->rep[d];

		t.spec_drafts += s->spec_drafts;
		t.spec_draft_tokens += s->spec_draft_tokens;
		t.spec_accepted += s->spec_accepted;
		for (int j = 0; j < DPS_MAX_SPEC; j++)
			t.spec_accepted_pos[j] += s->spec_accepted_pos[j];
		if (s->spec_k)
			t.spec_k = s->spec_k;
	}
	if (!t.spec_k)
		return;
	fprintf(o, "# HELP vllm:spec_decode_num_drafts_total Verifications of a draft.\n"
		   "# TYPE vllm:spec_decode_num_drafts_total counter\n"
		   "vllm:spec_decode_num_drafts_total{model_name=\"%s\"} %llu\n"
		   "# HELP vllm:spec_decode_num_draft_tokens_total Draft tokens verified.\n"
		   "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
		   "vllm:spec_decode_num_draft_tokens_total{model_name=\"%s\"} %llu\n"
		   "# HELP vllm:spec_decode_num_accepted_tokens_total Draft tokens accepted.\n"
		   "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
		   "vllm:spec_decode_num_accepted_tokens_total{model_name=\"%s\"} %llu\n",
		name, (unsigned long long)t.spec_drafts, name,
		(unsigned long long)t.spec_draft_tokens, name, (unsigned long long)t.spec_accepted);
	fprintf(o, "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Draft tokens "
		   "accepted at each draft position.\n"
		   "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n");
	for (int j = 0; j < t.spec_k && j < DPS_MAX_SPEC; j++)
		fprintf(o, "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"%s\","
			   "position=\"%d\"} %llu\n", name, j,
			(unsigned long long)t.spec_accepted_pos[j]);
	fprintf(o, "# HELP dpshard:spec_decode_acceptance_rate Accepted over drafted tokens.\n"
		   "# TYPE dpshard:spec_decode_acceptance_rate gauge\n"
		   "dpshard:spec_decode_acceptance_rate{model_name=\"%s\"} %.6f\n"
		   "# HELP dpshard:spec_decode_mean_acceptance_length Tokens per verification: 1 + "
		   "accepted drafts (the target's own token included).\n"
		   "# TYPE dpshard:spec_decode_mean_acceptance_length gauge\n"
		   "dpshard:spec_decode_mean_acceptance_length{model_name=\"%s\"} %.6f\n",
		name, t.spec_draft_tokens ? (double)t.spec_accepted / (double)t.spec_draft_tokens : 0.0,
		name, t.spec_drafts ? 1.0 + (double)t.spec_accepted / (double)t.spec_drafts : 0.0);
}

void dps_frontend_metrics(struct dps_frontend *f, FILE *o)
{
	char nbuf[300], gbuf[80];
	const char *name = label(f->o.model_name, nbuf, sizeof(nbuf));
	uint64_t pre = f->base.preemptions, dummy = f->base.dummy_steps, steps = f->base.steps;

	fprintf(o, "# HELP vllm:num_requests_running Requests running on a replica.\n"
		   "# TYPE vllm:num_requests_running gauge\n");
	for (int d = 0; d < f->o.dp; d++) {
		int w = 0, run = 0;

		if (f->client)
			dps_engine_load(f->client, d, &w, &run);
		fprintf(o, "vllm:num_requests_running{model_name=\"%s\",engine=\"%d\"} %d\n", name, d,
			run);
	}
	fprintf(o, "# HELP vllm:num_requests_waiting Requests waiting for a replica.\n"
		   "# TYPE vllm:num_requests_waiting gauge\n");
	for (int d = 0; d < f->o.dp; d++) {
		int w = 0, run = 0;

		if (f->client)
			dps_engine_load(f->client, d, &w, &run);
		fprintf(o, "vllm:num_requests_waiting{model_name=\"%s\",engine=\"%d\"} %d\n", name, d,
			w);
	}
	fprintf(o, "# HELP vllm:kv_cache_usage_perc Fraction of the KV-cache blocks in use.\n"
		   "# TYPE vllm:kv_cache_usage_perc gauge\n");
	for (int d = 0; d < f->o.dp; d++) {
		const struct dps_engine_stats *s = &f->rep[d];
		const double use = s->num_blocks ? 1.0 - (double)s->free_blocks / (double)s->num_blocks
						 : 0.0;

		fprintf(o, "vllm:kv_cache_usage_perc{model_name=\"%s\",engine=\"%d\"} %.6f\n", name,
			d, use);
		pre += s->preemptions;
		dummy += s->dummy_steps;
		steps += s->steps;
	}
	fprintf(o, "# HELP vllm:prompt_tokens_total Prompt tokens received.\n"
		   "# TYPE vllm:prompt_tokens_total counter\n"
		   "vllm:prompt_tokens_total{model_name=\"%s\"} %llu\n", name,
		(unsigned long long)f->prompt_tokens);
	fprintf(o, "# HELP vllm:generation_tokens_total Tokens generated.\n"
		   "# TYPE vllm:generation_tokens_total counter\n"
		   "vllm:generation_tokens_total{model_name=\"%s\"} %llu\n", name,
		(unsigned long long)f->gen_tokens);
	/* vLLM's reasons: stop, length, abort (a deadline or a client that left); a request the
	 * engine failed is no success. dpshard's counter keeps every reason apart. */
	fprintf(o, "# HELP vllm:request_success_total Requests finished, by finish reason.\n"
		   "# TYPE vllm:request_success_total counter\n"
		   "vllm:request_success_total{model_name=\"%s\",finished_reason=\"stop\"} %llu\n"
		   "vllm:request_success_total{model_name=\"%s\",finished_reason=\"length\"} %llu\n"
		   "vllm:request_success_total{model_name=\"%s\",finished_reason=\"abort\"} %llu\n",
		name, (unsigned long long)f->requests[DPS_FINISH_STOP], name,
		(unsigned long long)f->requests[DPS_FINISH_LENGTH], name,
		(unsigned long long)(f->requests[DPS_FINISH_TIMEOUT] +
				     f->requests[DPS_FINISH_CANCELLED]));
	fprintf(o, "# HELP dpshard:requests_finished_total Requests ended, by dpshard's finish "
		   "reason (error: the engine failed them).\n"
		   "# TYPE dpshard:requests_finished_total counter\n");
	for (int i = DPS_FINISH_STOP; i <= DPS_FINISH_ERROR; i++)
		fprintf(o, "dpshard:requests_finished_total{model_name=\"%s\",finished_reason=\"%s\"} "
			   "%llu\n", name, dps_finish_name((enum dps_finish)i),
			(unsigned long long)f->requests[i]);
	fprintf(o, "# HELP vllm:num_preemptions_total Requests preempted (recomputed later).\n"
		   "# TYPE vllm:num_preemptions_total counter\n"
		   "vllm:num_preemptions_total{model_name=\"%s\"} %llu\n", name,
		(unsigned long long)pre);
	hist_print(o, "vllm:time_to_first_token_seconds", "Time to the first token.", &f->ttft);
	hist_print(o, "vllm:inter_token_latency_seconds", "Time between two tokens of a request.",
		   &f->itl);
	hist_print(o, "vllm:time_per_output_token_seconds",
		   "Per request of two or more tokens: the mean time between its output tokens.",
		   &f->tpot);
	hist_print(o, "vllm:e2e_request_latency_seconds", "Time from arrival to the last token.",
		   &f->e2e);
	hist_print(o, "vllm:request_queue_time_seconds", "Time from arrival to the request's "
		   "first step on its replica (requests that produced a token).", &f->queue);
	hist_print(o, "vllm:request_prefill_time_seconds", "Time from the first step to the first "
		   "token.", &f->prefill);
	hist_print(o, "vllm:request_decode_time_seconds", "Time from the first token to the last.",
		   &f->decode);
	hist_print(o, "vllm:request_inference_time_seconds", "Time from the first step to the last "
		   "token.", &f->infer);
	hist_print(o, "vllm:request_prompt_tokens", "Prompt tokens of each finished request.",
		   &f->prompt_len);
	hist_print(o, "vllm:request_generation_tokens", "Tokens generated for each finished "
		   "request.", &f->gen_len);
	hist_print(o, "vllm:request_params_n", "The n parameter of each finished request.",
		   &f->n_param);
	hist_print(o, "vllm:request_params_max_tokens", "The max_tokens of each finished request "
		   "(given, or the default).", &f->max_tokens);
	fprintf(o, "# HELP dpshard:engine_steps_total Steps run (replica 0 and every other).\n"
		   "# TYPE dpshard:engine_steps_total counter\n"
		   "dpshard:engine_steps_total %llu\n", (unsigned long long)steps);
	fprintf(o, "# HELP dpshard:dummy_batches_total Dummy batches run by idle coupled replicas.\n"
		   "# TYPE dpshard:dummy_batches_total counter\n"
		   "dpshard:dummy_batches_total %llu\n", (unsigned long long)dummy);
	fprintf(o, "# HELP dpshard:http_errors_total Requests answered with an error status.\n"
		   "# TYPE dpshard:http_errors_total counter\n"
		   "dpshard:http_errors_total %llu\n", (unsigned long long)f->http_errors);
	fprintf(o, "# HELP dpshard:http_receive_rearms_total Receives armed again after they "
		   "found every shared receive buffer taken.\n"
		   "# TYPE dpshard:http_receive_rearms_total counter\n"
		   "dpshard:http_receive_rearms_total %llu\n",
		   (unsigned long long)(f->http ? dps_http_receive_rearms(f->http) : 0));
	fprintf(o, "# HELP dpshard:rank_restarts_total Times the ranks were restarted after a "
		   "failure.\n# TYPE dpshard:rank_restarts_total counter\n"
		   "dpshard:rank_restarts_total %llu\n", (unsigned long long)f->restarts);
	fprintf(o, "# HELP dpshard:collective_seconds_per_step Time TP rank 0 of a replica spent "
		   "in the collectives of a group set, per step (this run).\n"
		   "# TYPE dpshard:collective_seconds_per_step gauge\n");
	for (int d = 0; d < f->o.dp; d++)
		for (int g = 0; g < f->rep[d].n_groups && g < DPS_ENGINE_GROUPS; g++)
			fprintf(o, "dpshard:collective_seconds_per_step{engine=\"%d\",group=\"%s\"} "
				   "%.9f\n", d, label(f->rep[d].group[g], gbuf, sizeof(gbuf)),
				f->rep[d].steps ? (double)f->rep[d].group_ns[g] / 1e9 /
							 (double)f->rep[d].steps : 0.0);
	fprintf(o, "# HELP dpshard:collective_seconds_total Time TP rank 0 of a replica spent in "
		   "the collectives of a group set (this run).\n"
		   "# TYPE dpshard:collective_seconds_total counter\n");
	for (int d = 0; d < f->o.dp; d++)
		for (int g = 0; g < f->rep[d].n_groups && g < DPS_ENGINE_GROUPS; g++)
			fprintf(o, "dpshard:collective_seconds_total{engine=\"%d\",group=\"%s\"} "
				   "%.9f\n", d, label(f->rep[d].group[g], gbuf, sizeof(gbuf)),
				(double)f->rep[d].group_ns[g] / 1e9);
	spec_metrics(f, o, name);
	if (f->o.prefill)
		handoff_metrics(f, o);
	fprintf(o, "# HELP dpshard:up 1 when every rank serves, 0 while loading, draining or "
		   "recovering.\n# TYPE dpshard:up gauge\ndpshard:up %d\n",
		f->state == DPS_FE_READY);
	dps_fe_metrics_process(f, o);
}

void dps_fe_metrics_page(struct dps_frontend *f, uint64_t conn)
{
	char *body = NULL;
	size_t n = 0;
	FILE *o = open_memstream(&body, &n);

	if (!o)
		return;
	dps_frontend_metrics(f, o);
	fclose(o);
	dps_http_respond(f->http, conn, 200, "text/plain; version=0.0.4; charset=utf-8", body, n,
			 NULL, 0);
	free(body);
}


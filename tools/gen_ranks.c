/* SPDX-License-Identifier: MIT */
/*
 * tools/gen_ranks.c - `dpshard generate` across TP x DP rank processes, on the serving engine
 * (engine/serve/engine.h): the supervisor encodes the prompts and submits them all at once, the
 * load balancer shares them out over the replicas, and every completion is printed under its
 * prompt when all are done.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "common/json.h"
#include "engine/serve/engine.h"
#include "engine/shard/shard.h"
#include "engine/runtime/supervisor.h"
#include "kernels/gemm.h"
#include "tools/gen_ranks.h"
#include "tools/text.h"

struct run {
	const struct dps_gen_ranks_opts *o;
	int **out;      /* (n_prompts) generated tokens, (cap[k]) each */
	int *n_out, *cap;
	enum dps_finish *why;
	uint64_t t_start;
};

static void on_token(void *arg, void *user, int token)
{
	struct run *r = arg;
	const int k = (int)(intptr_t)user;

	if (r->n_out[k] < r->cap[k])
		r->out[k][r->n_out[k]++] = token;
}

static void on_done(void *arg, void *user, enum dps_finish why, int n_gen)
{
	struct run *r = arg;

	(void)n_gen;
	r->why[(intptr_t)user] = why;
}

static void on_stats(void *arg, int replica, const struct dps_engine_stats *st, int final)
{
	struct run *r = arg;

	if (!final) /* the periodic counts while it runs */
		return;
	if (r->o->verbose)
		fprintf(stderr, "replica %d: %llu steps (%llu prefill, %llu decode, %llu dummy, %llu "
				"padding rows), %llu preemptions, %llu DP all-reduces, %llu collectives "
				"on TP rank 0\n", replica, (unsigned long long)st->steps,
			(unsigned long long)st->prefill_steps, (unsigned long long)st->decode_steps,
			(unsigned long long)st->dummy_steps, (unsigned long long)st->padded_rows,
			(unsigned long long)st->preemptions, (unsigned long long)st->dp_allreduces,
			(unsigned long long)st->collectives);
	if (r->o->verbose && st->spec_k)
		fprintf(stderr, "replica %d: speculative decoding: %llu of %llu drafted tokens "
				"accepted (%.1f%%), mean accepted length %.2f, %llu draft passes\n",
			replica, (unsigned long long)st->spec_accepted,
			(unsigned long long)st->spec_draft_tokens,
			st->spec_draft_tokens ? 100.0 * (double)st->spec_accepted /
							(double)st->spec_draft_tokens : 0.0,
			st->spec_drafts ? 1.0 + (double)st->spec_accepted / (double)st->spec_drafts
					: 0.0,
			(unsigned long long)st->draft_steps);
}

int dps_generate_ranks(const struct dps_gen_ranks_opts *o)
{
	struct run r = { .o = o };
	struct dps_engine_cb cb = { on_token, on_done, on_stats, &r };
	struct dps_engine_client *client = NULL;
	/* Every prompt at once: -n counts positions fed, so a request holds steps + 1 tokens. */
	struct dps_engine_opts eo = { .model = o->model, .blis_arch = o->blis_arch,
				      .dtype = o->dtype, .quant = o->quant, .threads = o->threads,
				      .block_size = o->block_size,
				      .kv_cache_memory = o->kv_cache_memory,
				      .max_num_seqs = o->max_num_seqs ? o->max_num_seqs
								      : (o->n_prompts < 256 ? o->n_prompts
											   : 256),
				      .max_model_len = o->max_model_len ? o->max_model_len
									: o->steps + 1,
				      .max_batched_tokens = o->max_batched_tokens,
				      .decode_buckets = o->decode_buckets, .kv_fraction = 0.5,
				      .verbose = o->verbose, .trace = o->trace,
				      .spec_model = o->spec_model, .spec_k = o->spec_k };
	struct dps_sup_opts so = { .par = o->par, .cpu_bind = o->cpu_bind,
				   .rank_fn = dps_engine_rank_main, .rank_arg = &eo,
				   .msg_fn = dps_engine_on_msg, .tick_fn = dps_engine_tick,
				   .pending_fn = dps_engine_rank_pending,
				   .coupled_fn = dps_engine_coupled,
				   .rank_timeout_ms = (unsigned)o->rank_timeout * 1000u,
				   .verbose = o->verbose, .nodes_ok = 1 };
	struct dps_sup_result res;
	char err[512];
	int rc;

	r.out = calloc((size_t)o->n_prompts, sizeof(int *));
	r.n_out = calloc((size_t)o->n_prompts, sizeof(int));
	r.cap = calloc((size_t)o->n_prompts, sizeof(int));
	r.why = calloc((size_t)o->n_prompts, sizeof(*r.why));
	if (!r.out || !r.n_out || !r.cap || !r.why ||
	    dps_engine_client_new(&client, o->par.dp, o->par.tp, &cb) ||
	    /* disaggregated: the client drives the prefill replicas too */
	    (o->par.prefill_dp &&
	     dps_engine_client_set_prefill(client, o->par.prefill_dp,
					   dps_par_cfg_prefill_tp(&o->par)))) {
		dps_engine_client_free(client);
		free(r.out);
		free(r.n_out);
		free(r.cap);
		free(r.why);
		return -ENOMEM;
	}
	so.msg_arg = client;
	so.window_bytes = dps_engine_window_bytes(&eo, &o->par);
	if (o->par.prefill_dp) { /* disaggregated: both parts' ranks, the prefill KV shared */
		so.roles = 1;
		so.kv_share_bytes = dps_engine_kv_share_bytes(&eo, &o->par);
	}
	for (int k = 0; k < o->n_prompts; k++) {
		struct dps_engine_req q = { o->prompts[k], o->n_prompt[k],
					    { .max_tokens = o->steps - o->n_prompt[k] + 1,
					      .sampling = o->sampling },
					    -1, (void *)(intptr_t)k };

		for (int i = 0; i < o->n_end && i < DPS_MAX_STOP; i++)
			q.p.stop[q.p.n_stop++] = o->end[i];

		if (o->params) {
			/* --requests: the request's own parameters (its max_tokens, not -n; the
			 * engine ends it at the context too); the deadline counts from now. */
			q.p = o->params[k];
			q.replica = o->replica[k];
		} else {
			/* Each prompt its own seed: seed + its index, as on one rank with that seed. */
			q.p.sampling.seed = o->sampling.seed + (uint64_t)k;
		}
		/* The tokens it may get: its max_tokens within the context. */
		r.cap[k] = eo.max_model_len - o->n_prompt[k];
		if (q.p.max_tokens < r.cap[k])
			r.cap[k] = q.p.max_tokens;
		if (r.cap[k] < 0)
			r.cap[k] = 0;
		if (dps_engine_submit(client, &q) < 0) {
			dps_engine_client_free(client);
			free(r.out);
			free(r.n_out);
			free(r.cap);
			free(r.why);
			return -ENOMEM;
		}
	}
	dps_engine_close_when_idle(client);
	/* Long prompts go in chunks; the step never grows with them. */
	if (!eo.max_batched_tokens)
		eo.max_batched_tokens = 512 > eo.max_num_seqs ? 512 : eo.max_num_seqs;
	for (int k = 0; k < o->n_prompts; k++) {
		r.out[k] = calloc((size_t)r.cap[k] + 1, sizeof(int));
		if (!r.out[k]) {
			rc = -ENOMEM;
			goto out;
		}
	}
	r.t_start = dps_now_ns();
	rc = dps_sup_run(&so, &res, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dpshard generate: %s\n", err);
		goto out;
	}
	if (dps_sup_node() > 0)
		goto out; /* node 0 has every completion and prints them */
	for (int k = 0; k < o->n_prompts && o->jsonl; k++) {
		/* One JSON object per request, in input order. */
		printf("{\"index\": %d, \"finish_reason\": \"%s\", \"prompt_tokens\": %d, "
		       "\"completion_tokens\": %d, \"token_ids\": [", k, dps_finish_name(r.why[k]),
		       o->n_prompt[k], r.n_out[k]);
		for (int i = 0; i < r.n_out[k]; i++)
			printf("%s%d", i ? ", " : "", r.out[k][i]);
		printf("]");
		if (o->tok) {
			char *text;
			size_t l;

			rc = dps_tok_stream_text(o->tok, o->prompts[k], (size_t)o->n_prompt[k], r.out[k],
						 (size_t)r.n_out[k], DPS_TOK_SKIP_SPECIAL, &text, &l);
			if (rc)
				goto out;
			printf(", \"text\": \"");
			dps_json_escape(stdout, text, l);
			printf("\"");
			free(text);
		}
		printf("}\n");
	}
	for (int k = 0; k < o->n_prompts && !o->jsonl; k++) {
		if (o->n_prompts > 1)
			printf("%s[prompt %d] %s\n", k ? "\n" : "", k + 1, o->texts[k] ? o->texts[k] : "");
		if (o->ids_out || !o->tok) {
			/* As the one-rank generate: every id fed after the first (llama2.c's run.c
			 * prints what follows BOS), then the completion's. */
			const int from = o->completion_only ? o->n_prompt[k] : 1;

			for (int i = from; i < o->n_prompt[k] + r.n_out[k]; i++)
				printf("%s%d", i > from ? " " : "",
				       i < o->n_prompt[k] ? o->prompts[k][i] : r.out[k][i - o->n_prompt[k]]);
		} else {
			/* The prompt as the tokenizer gives it back, then the completion (special
			 * tokens left out). */
			const size_t n = (size_t)(o->n_prompt[k] + r.n_out[k]);
			int *all = malloc(n * sizeof(int));

			if (!all) {
				rc = -ENOMEM;
				goto out;
			}
			memcpy(all, o->prompts[k], (size_t)o->n_prompt[k] * sizeof(int));
			memcpy(all + o->n_prompt[k], r.out[k], (size_t)r.n_out[k] * sizeof(int));
			if (o->completion_only) {
				char *text;
				size_t l;

				rc = dps_tok_stream_text(o->tok, o->prompts[k], (size_t)o->n_prompt[k], r.out[k],
						 (size_t)r.n_out[k], DPS_TOK_SKIP_SPECIAL, &text, &l);
				if (!rc) {
					fwrite(text, 1, l, stdout);
					free(text);
				}
			} else {
				rc = dps_tool_print_text(stdout, o->tok, all, n);
			}
			free(all);
			if (rc)
				goto out;
		}
		printf("\n");
	}
	if (o->verbose)
		fprintf(stderr, "dpshard generate: %d prompt(s) on %d rank(s) in %.3f s\n",
			o->n_prompts, o->par.tp * o->par.dp,
			(double)(dps_now_ns() - r.t_start) / 1e9);
out:
	for (int k = 0; k < o->n_prompts; k++)
		free(r.out[k]);
	free(r.out);
	free(r.n_out);
	free(r.cap);
	free(r.why);
	dps_engine_client_free(client);
	return rc;
}

/* SPDX-License-Identifier: MIT */
/*
 * tools/gen_ranks.c - `dpshard generate` across TP x DP rank processes: the supervisor encodes
 * the prompts, forks the ranks, and prints every completion under its prompt; each rank loads
 * its shards and generates its replica's prompts (prompt i on replica i mod DP). TP rank 0 of
 * each replica sends the tokens to the supervisor through its ring.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/shard.h"
#include "engine/shard_gen.h"
#include "engine/supervisor.h"
#include "engine/tokenizer.h"
#include "kernels/gemm.h"
#include "tools/gen_ranks.h"

struct tok_msg {
	int32_t prompt, token;
};

struct run {
	const struct dps_gen_ranks_opts *o;
	int **out;      /* (n_prompts) generated tokens */
	int *n_out;
	int lost;       /* tokens that did not fit (never expected) */
	struct dps_world *w;
	uint64_t t_start;
};

static int on_token(void *arg, int index, int pos, int token, const float *logits, int vocab)
{
	struct run *r = arg;
	const struct dps_gen_ranks_opts *o = r->o;
	struct tok_msg m = { index, token };

	(void)pos;
	(void)logits;
	(void)vocab;
	/* BOS ends a story (llama2.c), EOS ends it in Hugging Face models; neither is printed. */
	if (token == o->bos || token == o->eos)
		return 1;
	if (r->w->tp_rank == 0 && dps_ring_push(&r->w->to_sup, &m, sizeof(m), 0))
		return 1;
	return 0;
}

static void describe_rank(const struct dps_shard *s, const struct dps_world *w)
{
	char line[1024];
	size_t len = 0, total = 0;

	for (int p = 0; p < DPS_PART_COUNT; p++)
		total += s->bytes[p];
	len += (size_t)snprintf(line + len, sizeof(line) - len, "rank %d (DP %d, TP %d): %.2f MB "
				"of weights:", w->rank, w->dp_rank, w->tp_rank, (double)total / 1e6);
	for (int p = 0; p < DPS_PART_COUNT && len < sizeof(line); p++)
		if (s->bytes[p])
			len += (size_t)snprintf(line + len, sizeof(line) - len, " %s %.2f MB;",
						dps_shard_part_name((enum dps_shard_part)p),
						(double)s->bytes[p] / 1e6);
	if (len < sizeof(line))
		snprintf(line + len, sizeof(line) - len, " KV cache %.2f MB", (double)s->cache_bytes / 1e6);
	fprintf(stderr, "%s\n", line);
}

static void print_stats(const struct dps_shard *s, const struct dps_world *w,
			const struct dps_gen_stats *st)
{
	fprintf(stderr, "rank %d: %llu steps (%llu dummy, %llu padding rows); collectives:",
		w->rank, (unsigned long long)st->steps, (unsigned long long)st->dummy_steps,
		(unsigned long long)st->padded_rows);
	for (int k = 0; k < DPS_COLL_KINDS; k++)
		for (int g = 0; g < DPS_SG_COUNT; g++)
			if (s->stats.calls[k][g])
				fprintf(stderr, " %s/%s %llu", dps_coll_kind_name((enum dps_coll_kind)k),
					dps_shard_group_name(g),
					(unsigned long long)s->stats.calls[k][g]);
	fprintf(stderr, "\n");
}

static int rank_main(struct dps_world *w, void *arg)
{
	struct run *r = arg;
	const struct dps_gen_ranks_opts *o = r->o;
	struct dps_gen_req *reqs = calloc((size_t)o->n_prompts, sizeof(*reqs));
	struct dps_gen_stats st = { 0 };
	struct dps_shard s;
	char err[512];
	int n = 0, coupled = 0, rc, max_rows = 1, max_seqs = 1;

	if (!reqs)
		return -ENOMEM;
	r->w = w;
	rc = dps_gemm_setup(o->blis_arch, o->threads ? o->threads : (int)w->ncpus, err,
			    sizeof(err));
	if (rc) {
		fprintf(stderr, "rank %d: %s\n", w->rank, err);
		free(reqs);
		return rc;
	}
	for (int k = w->dp_rank; k < o->n_prompts; k += w->dp) {
		reqs[n].prompt = o->prompts[k];
		reqs[n].n_prompt = o->n_prompt[k];
		reqs[n].max_pos = o->steps;
		reqs[n].index = k;
		n++;
	}
	/* Every rank sizes for the largest replica: the MLP gathers other replicas' rows. */
	for (int d = 0; d < w->dp; d++) {
		int rows = 0, seqs = 0;

		for (int k = d; k < o->n_prompts; k += w->dp) {
			rows += o->n_prompt[k];
			seqs++;
		}
		max_rows = rows > max_rows ? rows : max_rows;
		max_seqs = seqs > max_seqs ? seqs : max_seqs;
	}
	rc = dps_shard_load(&s, w, &w->lay->groups.cfg, o->model,
			    &(struct dps_shard_opts){ .max_pos = o->steps, .max_seqs = max_seqs,
						      .max_rows = max_rows },
			    err, sizeof(err));
	if (rc) {
		fprintf(stderr, "rank %d: %s\n", w->rank, err);
		free(reqs);
		return rc;
	}
	if (o->verbose)
		describe_rank(&s, w);
	s.trace = o->trace;
	for (int k = 0; k < DPS_COMP_COUNT; k++)
		coupled |= s.c[k] > 1;
	rc = dps_shard_generate(&s, reqs, n, coupled, &o->sampling, on_token, r, &st);
	if (o->verbose || o->trace)
		print_stats(&s, w, &st);
	dps_shard_free(&s);
	free(reqs);
	return rc;
}

static void on_msg(int rank, const void *msg, size_t len, void *arg)
{
	struct run *r = arg;
	struct tok_msg m;

	(void)rank;
	if (len != sizeof(m))
		return;
	memcpy(&m, msg, sizeof(m));
	if (m.prompt < 0 || m.prompt >= r->o->n_prompts || r->n_out[m.prompt] >= r->o->steps) {
		r->lost++;
		return;
	}
	r->out[m.prompt][r->n_out[m.prompt]++] = m.token;
}

int dps_generate_ranks(const struct dps_gen_ranks_opts *o)
{
	struct run r = { .o = o };
	struct dps_sup_opts so = { .par = o->par, .cpu_bind = o->cpu_bind, .rank_fn = rank_main,
				   .rank_arg = &r, .msg_fn = on_msg, .msg_arg = &r,
				   .verbose = o->verbose };
	struct dps_sup_result res;
	char err[512];
	int rc;

	r.out = calloc((size_t)o->n_prompts, sizeof(int *));
	r.n_out = calloc((size_t)o->n_prompts, sizeof(int));
	if (!r.out || !r.n_out) {
		free(r.out);
		free(r.n_out);
		return -ENOMEM;
	}
	for (int k = 0; k < o->n_prompts; k++) {
		r.out[k] = calloc((size_t)o->steps + 1, sizeof(int));
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
	for (int k = 0; k < o->n_prompts; k++) {
		if (o->n_prompts > 1)
			printf("%s[prompt %d] %s\n", k ? "\n" : "", k + 1, o->texts[k] ? o->texts[k] : "");
		if (o->ids_out || !o->tok) {
			/* As the one-rank generate: every id fed after BOS, then the completion. */
			for (int i = 1; i < o->n_prompt[k] + r.n_out[k]; i++)
				printf("%s%d", i > 1 ? " " : "",
				       i < o->n_prompt[k] ? o->prompts[k][i] : r.out[k][i - o->n_prompt[k]]);
		} else {
			/* The prompt as the tokenizer gives it back, then the completion. */
			for (int i = 1; i < o->n_prompt[k] + r.n_out[k]; i++) {
				const int cur = i < o->n_prompt[k] ? o->prompts[k][i]
								   : r.out[k][i - o->n_prompt[k]];
				const int before = i - 1 < o->n_prompt[k]
							   ? o->prompts[k][i - 1]
							   : r.out[k][i - 1 - o->n_prompt[k]];
				char buf[8];
				size_t l;
				const char *piece = dps_tokenizer_decode(o->tok, before, cur, buf, &l);

				fwrite(piece, 1, l, stdout);
			}
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
	return rc;
}

/* SPDX-License-Identifier: MIT */
/*
 * tests/shard_loop.h - the step loop of the sharded-model tests: a replica's prompts generated
 * to completion on a dps_shard with the serving engine's lockstep, without its scheduler, so
 * that a test sees every step's logits. Each step feeds every prompt still to be fed (up to
 * the shard's max_rows) and one decode row per sequence that has sampled its next token;
 * coupled replicas agree through dps_lockstep_get_dp_padding and pad their rows (or run a
 * dummy batch) with dps_lockstep_pad_rows, as engine/serve/replica.c does. Sequence k owns
 * blocks [k * bps, (k + 1) * bps) of the shard's KV cache; the all-zero table of the padding
 * rows comes after the n sequences' tables. Included by tests/check_shard.c.
 */
#ifndef DPS_TESTS_SHARD_LOOP_H
#define DPS_TESTS_SHARD_LOOP_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/lockstep.h"
#include "engine/shard/kv.h"
#include "engine/shard/shard.h"
#include "kernels/sample.h"

struct loop_req {
	const int *prompt; /* token ids, BOS included */
	int n_prompt;      /* >= 1 */
	int max_pos;       /* positions in all, prompt included (as generate's -n) */
	int index;         /* the caller's id of the request (seeds its sampler: seed + index) */
	/* Nonzero: the prompt's positions are in the cache already (a disaggregated hand-off)
	 * and `first` is the token its last position gave. */
	int prefed, first;
};

/*
 * Called for every sampled token: request index, the position whose logits gave it, the token,
 * those logits (vocab floats). Returns nonzero to end the request.
 */
typedef int (*loop_cb)(void *arg, int index, int pos, int token, const float *logits, int vocab);

/* Set by a test: feed the prompts through the decode graph too (a decode-only shard, which
 * refuses prefill steps), each step a prompt's remaining tokens as decode rows. */
static int loop_decode_only;

struct loop_stats {
	uint64_t steps, dummy_steps, padded_rows;
};

struct loop_seq {
	int *ids;      /* prompt, then generated tokens */
	int n_ids;     /* tokens known */
	int fed;       /* positions fed through the model */
	int limit;     /* positions in all */
	int done;
	struct dps_rng rng;
};

/* Row i of sequence k (block table tables + k * bps) at position p: token t, its KV slot. */
static void loop_row(const struct dps_shard *s, const int *tables, int *tok, int *pos, int *slot,
		     int *tix, unsigned char *want, int i, int k, int p, int t, int wanted)
{
	tok[i] = t;
	pos[i] = p;
	slot[i] = dps_kv_slot(tables + (size_t)k * (size_t)s->bps, s->block_size, p);
	tix[i] = k;
	want[i] = (unsigned char)wanted;
}

/*
 * Generates reqs[0..n-1] (n <= the shard's max_seqs) to completion. Coupled replicas (any that
 * share a collective) step together. Returns 0 or the first error of a collective.
 */
static int loop_generate(struct dps_shard *s, const struct loop_req *reqs, int n,
			 const struct dps_sampling *sp, loop_cb cb, void *arg, struct loop_stats *st)
{
	const int V = s->cfg.vocab_size, R = s->max_rows, DP = s->par.dp, bps = s->bps;
	const int coupled = dps_shard_coupled(s);
	struct loop_seq *q = calloc((size_t)(n ? n : 1), sizeof(*q));
	int *tok = calloc((size_t)R, sizeof(int)), *pos = calloc((size_t)R, sizeof(int));
	int *slot = calloc((size_t)R, sizeof(int)), *tix = calloc((size_t)R, sizeof(int));
	int *scratch = calloc((size_t)V, sizeof(int)), *agree = calloc(4 * (size_t)DP, sizeof(int));
	int *owner = calloc((size_t)R, sizeof(int));
	int *tables = calloc(((size_t)n + 1) * (size_t)bps, sizeof(int));
	const int **table = calloc((size_t)R, sizeof(*table));
	unsigned char *want = calloc((size_t)R, 1);
	int rc = 0;

	if (!q || !tok || !pos || !slot || !tix || !scratch || !agree || !owner || !tables ||
	    !table || !want) {
		rc = -ENOMEM;
		goto out;
	}
	if (n > s->max_seqs || (long)n * bps > s->num_blocks) { /* sequence k owns k * bps.. */
		rc = -EINVAL;
		goto out;
	}
	for (int k = 0; k < n; k++)
		for (int b = 0; b < bps; b++)
			tables[(size_t)k * (size_t)bps + (size_t)b] = k * bps + b;
	for (int k = 0; k < n; k++) {
		if (reqs[k].n_prompt < 1 || reqs[k].n_prompt > reqs[k].max_pos ||
		    reqs[k].n_prompt > s->max_pos) {
			/* (A replica that stops here makes its peers' collectives fail, not hang.) */
			rc = -EINVAL;
			goto out;
		}
		q[k].ids = calloc((size_t)reqs[k].max_pos + 1, sizeof(int));
		if (!q[k].ids) {
			rc = -ENOMEM;
			goto out;
		}
		memcpy(q[k].ids, reqs[k].prompt, sizeof(int) * (size_t)reqs[k].n_prompt);
		q[k].n_ids = reqs[k].n_prompt;
		q[k].limit = reqs[k].max_pos < s->max_pos ? reqs[k].max_pos : s->max_pos;
		if (reqs[k].prefed) {
			q[k].fed = reqs[k].n_prompt;
			q[k].ids[q[k].n_ids++] = reqs[k].first;
			q[k].done = q[k].fed >= q[k].limit;
		}
		dps_rng_seed(&q[k].rng, sp->seed + (uint64_t)reqs[k].index);
	}
	for (;;) {
		int rows = 0, prefill_rows = 0, prefill, unfinished = 0;
		struct dps_rows r;
		const float *lg;

		/* This replica's rows: every prompt still to feed (up to R rows), then decode rows. */
		for (int k = 0; k < n && rows < R; k++) {
			if (q[k].done)
				continue;
			unfinished = 1;
			if (q[k].fed + 1 < q[k].n_ids)
				while (q[k].fed < q[k].n_ids && rows < R) {
					loop_row(s, tables, tok, pos, slot, tix, want, rows, k, q[k].fed,
						 q[k].ids[q[k].fed], q[k].fed == q[k].n_ids - 1);
					owner[rows++] = k;
					q[k].fed++;
					prefill_rows++;
				}
		}
		/* Sequences with one token to feed (the last one sampled) decode. */
		for (int k = 0; k < n && rows < R; k++)
			if (!q[k].done && q[k].fed + 1 == q[k].n_ids && q[k].fed < q[k].limit) {
				loop_row(s, tables, tok, pos, slot, tix, want, rows, k, q[k].fed,
					 q[k].ids[q[k].fed], 1);
				owner[rows++] = k;
				q[k].fed++;
			}
		prefill = prefill_rows > 0 && !loop_decode_only;
		if (coupled) {
			const struct dps_dp_say say = { rows, prefill, unfinished, 0 };
			struct dps_dp_plan plan;

			rc = dps_lockstep_get_dp_padding(s->dp_c, DP, s->d, &say, agree, &plan);
			/* Counted with the step's collectives, as the tests compare them. */
			s->stats.calls[DPS_COLL_ALLREDUCE][DPS_SG_DP] += (uint64_t)plan.reduced;
			s->stats.bytes[DPS_COLL_ALLREDUCE][DPS_SG_DP] +=
				(uint64_t)plan.reduced * 4 * (size_t)DP * sizeof(int);
			if (rc)
				goto out;
			if (!plan.any_work)
				break;
			prefill = plan.any_prefill;
			if (!prefill) {
				if (plan.max_rows > R) { /* replicas agree on max_rows at load */
					rc = -EINVAL;
					goto out;
				}
				if (!rows && st)
					st->dummy_steps++;
				if (st)
					st->padded_rows += (uint64_t)(plan.max_rows - rows);
				dps_lockstep_pad_rows(tok, pos, slot, tix, want, n, rows, plan.max_rows);
				for (int i = rows; i < plan.max_rows; i++)
					owner[i] = -1;
				rows = plan.max_rows;
			}
		} else if (!rows) {
			break;
		}
		for (int i = 0; i < rows; i++)
			table[i] = tables + (size_t)tix[i] * (size_t)bps;
		r = (struct dps_rows){ rows, tok, pos, slot, (const int *const *)table, want };
		lg = dps_shard_step_rows(s, prefill, &r, &rc);
		if (!lg)
			goto out;
		if (st)
			st->steps++;
		for (int i = 0, o = 0; i < rows; i++) {
			struct loop_seq *z;
			int next, k = owner[i];

			if (!want[i])
				continue;
			z = &q[k];
			next = dps_sample((float *)lg + (size_t)o * (size_t)V, V, sp, &z->rng, scratch);
			if (cb && cb(arg, reqs[k].index, pos[i], next, lg + (size_t)o * (size_t)V, V))
				z->done = 1;
			o++;
			z->ids[z->n_ids++] = next;
			if (z->fed >= z->limit)
				z->done = 1;
		}
	}
out:
	if (q)
		for (int k = 0; k < n; k++)
			free(q[k].ids);
	free(q);
	free(tok);
	free(pos);
	free(slot);
	free(tix);
	free(scratch);
	free(agree);
	free(owner);
	free(tables);
	free(table);
	free(want);
	return rc;
}

#endif

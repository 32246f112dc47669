/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/shard_gen.c - generation of a replica's prompts on the sharded model (see
 * shard_gen.h): the step loop of `dpshard generate` across ranks and of the equivalence tests,
 * with the lockstep of coupled replicas.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/shard/shard_gen.h"
#include "kernels/sample.h"

struct seq {
	int *ids;      /* prompt, then generated tokens */
	int n_ids;     /* tokens known */
	int fed;       /* positions fed through the model */
	int limit;     /* positions in all */
	int done;
	struct dps_rng rng;
};

int dps_shard_generate(struct dps_shard *s, const struct dps_gen_req *reqs, int n, int coupled,
		       const struct dps_sampling *sp, dps_gen_cb cb, void *arg,
		       struct dps_gen_stats *st)
{
	const int V = s->cfg.vocab_size, R = s->max_rows, DP = s->par.dp;
	struct seq *q = calloc((size_t)(n ? n : 1), sizeof(*q));
	int *tok = calloc((size_t)R, sizeof(int)), *pos = calloc((size_t)R, sizeof(int));
	int *seq = calloc((size_t)R, sizeof(int)), *scratch = calloc((size_t)V, sizeof(int));
	int *agree = calloc(3 * (size_t)DP, sizeof(int)), *owner = calloc((size_t)R, sizeof(int));
	unsigned char *want = calloc((size_t)R, 1);
	int rc = 0;

	if (!q || !tok || !pos || !seq || !scratch || !agree || !owner || !want) {
		rc = -ENOMEM;
		goto out;
	}
	DPS_ASSERT(n <= s->max_seqs);
	/* Replicas that share any collective must step together, whatever the caller says. */
	coupled |= dps_shard_coupled(s);
	for (int k = 0; k < n; k++)
		if (reqs[k].n_prompt < 1 || reqs[k].n_prompt > reqs[k].max_pos ||
		    reqs[k].n_prompt > s->max_pos) {
			/* (A replica that stops here makes its peers' collectives fail, not hang.) */
			rc = -EINVAL;
			goto out;
		}
	for (int k = 0; k < n; k++) {
		q[k].ids = calloc((size_t)reqs[k].max_pos + 1, sizeof(int));
		if (!q[k].ids) {
			rc = -ENOMEM;
			goto out;
		}
		memcpy(q[k].ids, reqs[k].prompt, sizeof(int) * (size_t)reqs[k].n_prompt);
		q[k].n_ids = reqs[k].n_prompt;
		q[k].limit = reqs[k].max_pos < s->max_pos ? reqs[k].max_pos : s->max_pos;
		q[k].done = q[k].n_ids < 1 || q[k].limit < 1;
		dps_rng_seed(&q[k].rng, sp->seed + (uint64_t)reqs[k].index);
	}
	for (;;) {
		int rows = 0, prefill_rows = 0, prefill, unfinished = 0;
		const float *lg;

		/* This replica's rows: every prompt still to feed (up to R rows), then decode rows. */
		for (int k = 0; k < n && rows < R; k++) {
			if (q[k].done)
				continue;
			unfinished = 1;
			if (q[k].fed + 1 < q[k].n_ids)
				while (q[k].fed < q[k].n_ids && rows < R) {
					tok[rows] = q[k].ids[q[k].fed];
					pos[rows] = q[k].fed;
					seq[rows] = k;
					owner[rows] = k;
					want[rows] = q[k].fed == q[k].n_ids - 1;
					q[k].fed++;
					rows++;
					prefill_rows++;
				}
		}
		/* Sequences with one token to feed (the last one sampled) decode. */
		for (int k = 0; k < n && rows < R; k++)
			if (!q[k].done && q[k].fed + 1 == q[k].n_ids && q[k].fed < q[k].limit) {
				tok[rows] = q[k].ids[q[k].fed];
				pos[rows] = q[k].fed;
				seq[rows] = k;
				owner[rows] = k;
				want[rows] = 1;
				q[k].fed++;
				rows++;
			}
		prefill = prefill_rows > 0;
		if (coupled) {
			/* _get_dp_padding: each replica writes its counts into its own slot, sum, max. */
			int max_b = 0, any_prefill = 0, any_left = 0;

			memset(agree, 0, sizeof(int) * 3 * (size_t)DP);
			agree[3 * s->d] = rows;
			agree[3 * s->d + 1] = prefill;
			agree[3 * s->d + 2] = unfinished;
			if (s->dp_c && s->dp_c->n > 1) {
				s->stats.calls[DPS_COLL_ALLREDUCE][DPS_SG_DP]++;
				s->stats.bytes[DPS_COLL_ALLREDUCE][DPS_SG_DP] += 3 * (size_t)DP * 4;
				if (s->trace)
					fprintf(stderr, "rank %d before step %llu: all-reduce over the DP "
							"(_get_dp_padding), %zu bytes\n",
						s->w ? s->w->rank : 0, (unsigned long long)s->steps + 1,
						3 * (size_t)DP * 4);
				rc = dps_coll_allreduce(s->dp_c, agree, agree, 3 * (size_t)DP, DPS_I32);
				if (rc)
					goto out;
			}
			for (int r = 0; r < DP; r++) {
				max_b = agree[3 * r] > max_b ? agree[3 * r] : max_b;
				any_prefill |= agree[3 * r + 1];
				any_left |= agree[3 * r + 2];
			}
			if (!any_left)
				break;
			prefill = any_prefill;
			if (!prefill) {
				if (max_b > R) { /* cannot happen: replicas agree on max_rows at load */
					rc = -EINVAL;
					goto out;
				}
				/* Pad to the agreed batch: token 0 at position 0, writing nothing. */
				if (!rows && st)
					st->dummy_steps++;
				for (; rows < max_b; rows++) {
					tok[rows] = 0;
					pos[rows] = 0;
					seq[rows] = -1;
					owner[rows] = -1;
					want[rows] = 0;
					if (st)
						st->padded_rows++;
				}
			}
		} else if (!rows) {
			break;
		}
		lg = dps_shard_step(s, prefill, rows, tok, pos, seq, want, &rc);
		if (!lg)
			goto out;
		if (st)
			st->steps++;
		for (int i = 0, o = 0; i < rows; i++) {
			struct seq *z;
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
	free(seq);
	free(scratch);
	free(agree);
	free(owner);
	free(want);
	return rc;
}

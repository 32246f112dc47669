/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/spec.c - Eagle3 speculative decoding in the replica loop (see replica.h): the
 * draft's loading and arrays, the catch-up rows TP rank 0 publishes to its peers, and the
 * draft passes after every target step whose proposals the next step verifies.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/serve/replica.h"
#include "engine/shard/kv.h"
#include "kernels/kernels.h"

int dps_spec_load(struct replica *R, int max_len, int rows, int block_size)
{
	struct dps_world *w = R->w;
	const struct dps_engine_opts *o = R->o;
	char err[512];
	/* A prefill rank keeps the draft's cache in its KV share after the target's: the
	 * decode ranks pull both. */
	char *slice = R->prefill ? w->kv_share + (size_t)(w->rank - w->base) * w->kv_stride : NULL;
	const size_t doff = dps_align_up(4096 + R->m.cache_bytes, 4096);
	int rc;

	if (slice && doff + 4096 >= w->kv_stride) {
		fprintf(stderr, "rank %d: no room for the draft's KV cache in the KV share\n",
			w->rank);
		return -ENOMEM;
	}
	rc = dps_shard_load(&R->dm, w, &w->part->cfg, o->spec_model,
			    &(struct dps_shard_opts){ .max_pos = max_len, .max_seqs = 1,
						      .max_rows = rows, .block_size = block_size,
						      .num_blocks = R->m.num_blocks,
						      /* the draft is held as its target is */
						      .dtype = R->m.wt_emb == DPS_WT_BF16
								       ? DPS_SHARD_DTYPE_BF16
								       : R->m.wt_emb == DPS_WT_F16
									 ? DPS_SHARD_DTYPE_AUTO
									 : DPS_SHARD_DTYPE_F32,
						      .quant = R->m.wt == DPS_WT_Q8 ? DPS_SHARD_QUANT_INT8
										    : DPS_SHARD_QUANT_AUTO,
						      .target = &R->m,
						      .cache_mem = slice ? slice + doff : NULL,
						      .cache_cap = slice ? w->kv_stride - doff : 0 },
			    err, sizeof(err));
	if (!rc && slice)
		((struct dps_kv_share_hdr *)(void *)slice)->draft_off = doff;
	if (!rc)
		rc = dps_shard_set_aux(&R->m, R->dm.aux_l, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "rank %d: --speculative-model: %s\n", w->rank, err);
		return rc;
	}
	R->dm.trace = o->trace;
	if (o->verbose)
		dps_replica_describe(&R->dm, w);
	if (w->rank == 0)
		fprintf(stderr, "Eagle3 draft %s: %d tokens per step, vocabulary %d, fusing "
			"target layers %d, %d, %d; its MLP over TP x %d\n", o->spec_model,
			R->spec_k, R->dm.cfg.vocab_size, R->dm.aux_l[0], R->dm.aux_l[1],
			R->dm.aux_l[2], R->dm.c[DPS_COMP_MLP]);
	return 0;
}

int dps_spec_alloc(struct replica *R, int rows, int n_seqs)
{
	const size_t dim = (size_t)R->m.cfg.hidden_size, ns = (size_t)n_seqs;


	R->cu_tok = calloc((size_t)rows, sizeof(int));
	R->cu_pos = calloc((size_t)rows, sizeof(int));
	R->cu_slot = calloc((size_t)rows, sizeof(int));
	R->cu_tix = calloc((size_t)rows, sizeof(int));
	R->cu_src = calloc((size_t)rows, sizeof(int));
	R->cu_want = calloc((size_t)rows, 1);
	R->cu_table = calloc((size_t)rows, sizeof(*R->cu_table));
	R->cu_tables = calloc((ns + 1) * (size_t)R->bpr, sizeof(int));
	R->p_pos = calloc(ns, sizeof(int));
	R->p_tix = calloc(ns, sizeof(int));
	R->p_tok = calloc(ns * (size_t)R->spec_k, sizeof(int));
	R->p_req = calloc(ns, sizeof(*R->p_req));
	R->hin = calloc((size_t)rows * 3 * dim, sizeof(float));
	R->hout = calloc((size_t)rows * dim, sizeof(float));
	R->hprev = calloc(ns * dim, sizeof(float));
	R->d_tok = calloc(ns, sizeof(int));
	R->d_pos = calloc(ns, sizeof(int));
	R->d_slot = calloc(ns, sizeof(int));
	R->d_table = calloc(ns, sizeof(*R->d_table));
	if (!R->cu_tok || !R->cu_pos || !R->cu_slot || !R->cu_tix || !R->cu_src ||
	    !R->cu_want || !R->cu_table || !R->cu_tables || !R->p_pos || !R->p_tix ||
	    !R->p_tok || !R->p_req || !R->hin || !R->hout || !R->hprev || !R->d_tok ||
	    !R->d_pos || !R->d_slot || !R->d_table)
		return -ENOMEM;
	return 0;
}

void dps_spec_free(struct replica *R)
{
	if (R->spec_k)
		dps_shard_free(&R->dm);
	free(R->cu_tok);
	free(R->cu_pos);
	free(R->cu_slot);
	free(R->cu_tix);
	free(R->cu_src);
	free(R->cu_want);
	free(R->cu_table);
	free(R->cu_tables);
	free(R->p_pos);
	free(R->p_tix);
	free(R->p_tok);
	free(R->p_req);
	free(R->hin);
	free(R->hout);
	free(R->hprev);
	free(R->d_tok);
	free(R->d_pos);
	free(R->d_slot);
	free(R->d_table);
}

/*
 * Publishes the draft's catch-up rows (TP rank 0 from the scheduler; the peers read them):
 * [length][n, n_prop][tokens][pos][slot][table index][source row][want][tables].
 */
static int publish_catchup(struct replica *R)
{
	struct dps_world *w = R->w;
	int hdr[3] = { 0 };
	uint32_t total;
	size_t off = sizeof(uint32_t);
	int rc = 0;

	if (R->tp0) {
		const struct dps_catchup *cu = &R->s.cu;
		int nt = 0;

		R->n_cu = cu->n;
		R->n_prop = cu->n_prop;
		for (int k = 0, p = 0; k < cu->n; k++) {
			R->cu_tok[k] = cu->token[k];
			R->cu_pos[k] = cu->pos[k];
			R->cu_slot[k] = cu->slot[k];
			R->cu_src[k] = cu->row[k];
			R->cu_want[k] = cu->want[k];
			if (!k || cu->req[k] != cu->req[k - 1])
				dps_replica_put_table(R, R->cu_tables, nt++, cu->req[k]);
			R->cu_tix[k] = nt - 1;
			if (cu->want[k])
				R->p_req[p++] = cu->req[k];
		}
		hdr[2] = nt;
	}
	if (w->tp == 1)
		return 0;
	if (R->tp0) {
		const size_t n = (size_t)R->n_cu;

		hdr[0] = R->n_cu;
		hdr[1] = R->n_prop;
#define PUT(p, bytes) (memcpy(R->wire + off, (p), (bytes)), off += (bytes))
		PUT(hdr, sizeof(hdr));
		PUT(R->cu_tok, sizeof(int) * n);
		PUT(R->cu_pos, sizeof(int) * n);
		PUT(R->cu_slot, sizeof(int) * n);
		PUT(R->cu_tix, sizeof(int) * n);
		PUT(R->cu_src, sizeof(int) * n);
		PUT(R->cu_want, n);
		PUT(R->cu_tables, sizeof(int) * (size_t)hdr[2] * (size_t)R->bpr);
#undef PUT
		return dps_replica_wire_push(R, off);
	}
	rc = dps_replica_wire_pop(R, sizeof(uint32_t) + sizeof(hdr), &total);
	if (rc)
		return rc;
#define GET(p, bytes) (memcpy((p), R->wire + off, (bytes)), off += (bytes))
	GET(hdr, sizeof(hdr));
	if (hdr[0] < 0 || hdr[0] > R->rows_cap || hdr[1] < 0 || hdr[1] > hdr[0] ||
	    hdr[1] > R->zero_table || hdr[2] < 0 || hdr[2] > R->zero_table + 1 ||
	    off + (size_t)hdr[0] * (5 * sizeof(int) + 1) +
			    sizeof(int) * (size_t)hdr[2] * (size_t)R->bpr > total)
		return -EPROTO;
	R->n_cu = hdr[0];
	R->n_prop = hdr[1];
	GET(R->cu_tok, sizeof(int) * (size_t)R->n_cu);
	GET(R->cu_pos, sizeof(int) * (size_t)R->n_cu);
	GET(R->cu_slot, sizeof(int) * (size_t)R->n_cu);
	GET(R->cu_tix, sizeof(int) * (size_t)R->n_cu);
	GET(R->cu_src, sizeof(int) * (size_t)R->n_cu);
	GET(R->cu_want, (size_t)R->n_cu);
	GET(R->cu_tables, sizeof(int) * (size_t)hdr[2] * (size_t)R->bpr);
#undef GET
	return 0;
}

/* The draft's token: its argmax over the draft vocabulary, as a target id. */
static int draft_token(const struct dps_shard *dm, const float *lg)
{
	const int best = dps_argmax(lg, dm->cfg.vocab_size);

	return best + dm->d2t[best];
}

/*
 * After a target step: the draft catches up on the positions the step kept (reading the
 * target's hidden states of those rows), and proposes spec_k tokens for every request that
 * may be drafted, recurrently on its own hidden state. Every rank of the replica runs the
 * same passes; with --draft-mlp-dp-size > 1 every replica runs all spec_k of them, rows or not.
 */
int dps_spec_draft_passes(struct replica *R)
{
	struct dps_shard *dm = &R->dm;
	const size_t dim = (size_t)dm->cfg.hidden_size, V = (size_t)dm->cfg.vocab_size;
	const int K = R->spec_k, bs = dm->block_size;
	struct dps_rows rows;
	const float *lg;
	int rc = publish_catchup(R);

	if (rc)
		return rc;
	for (int k = 0, wants = 0; k < R->n_cu; k++) {
		/* What rank 0 published, checked before anything indexes with it. */
		if (R->cu_src[k] < 0 || R->cu_src[k] >= R->rows_cap || R->cu_tix[k] < 0 ||
		    R->cu_tix[k] > R->zero_table || R->cu_pos[k] < 0 ||
		    R->cu_pos[k] + (R->cu_want[k] ? K - 1 : 0) >= dm->max_pos || R->cu_tok[k] < 0 ||
		    R->cu_tok[k] >= R->m.cfg.vocab_size || R->cu_slot[k] < 0 ||
		    R->cu_slot[k] >= dm->num_blocks * bs || (wants += R->cu_want[k] != 0) > R->n_prop)
			return -EPROTO;
		if (k + 1 == R->n_cu && wants != R->n_prop)
			return -EPROTO;
		memcpy(R->hin + (size_t)k * 3 * dim, R->m.aux + (size_t)R->cu_src[k] * 3 * dim,
		       sizeof(float) * 3 * dim);
		R->cu_table[k] = R->cu_tables + (size_t)R->cu_tix[k] * (size_t)R->bpr;
	}
	for (int k = 0; k < R->n_cu; k++)
		for (int b = 0; b <= (R->cu_pos[k] + (R->cu_want[k] ? K - 1 : 0)) / bs &&
				b < R->bpr; b++)
			if (R->cu_table[k][b] < 0 || R->cu_table[k][b] >= dm->num_blocks)
				return -EPROTO;
	rows = (struct dps_rows){ R->n_cu, R->cu_tok, R->cu_pos, R->cu_slot,
				  (const int *const *)R->cu_table, R->cu_want };
	lg = dps_shard_draft_step(dm, &R->m, &rows, R->hin, 1, R->hout, &rc);
	if (!lg)
		return rc;
	R->st.draft_steps += R->n_cu > 0;
	for (int k = 0, p = 0; k < R->n_cu; k++)
		if (R->cu_want[k]) {
			R->p_pos[p] = R->cu_pos[k];
			R->p_tix[p] = R->cu_tix[k];
			R->p_tok[(size_t)p * K] = draft_token(dm, lg + (size_t)p * V);
			memcpy(R->hprev + (size_t)p * dim, R->hout + (size_t)k * dim,
			       sizeof(float) * dim);
			p++;
		}
	for (int j = 1; j < K; j++) {
		const int n = R->n_prop;

		for (int p = 0; p < n; p++) {
			const int pos = R->p_pos[p] + j;
			const int *table = R->cu_tables + (size_t)R->p_tix[p] * (size_t)R->bpr;

			R->d_tok[p] = R->p_tok[(size_t)p * K + (size_t)(j - 1)];
			R->d_pos[p] = pos;
			R->d_slot[p] = dps_kv_slot(table, bs, pos);
			R->d_table[p] = table;
		}
		rows = (struct dps_rows){ n, R->d_tok, R->d_pos, R->d_slot,
					  (const int *const *)R->d_table, NULL };
		lg = dps_shard_draft_step(dm, &R->m, &rows, R->hprev, 0, R->hout, &rc);
		if (!lg)
			return rc;
		R->st.draft_steps += n > 0;
		for (int p = 0; p < n; p++)
			R->p_tok[(size_t)p * K + (size_t)j] = draft_token(dm, lg + (size_t)p * V);
		memcpy(R->hprev, R->hout, sizeof(float) * (size_t)n * dim);
	}
	if (R->tp0)
		for (int p = 0; p < R->n_prop; p++) {
			struct dps_req *r = R->p_req[p];

			memcpy(r->draft, R->p_tok + (size_t)p * K, sizeof(int) * (size_t)K);
			r->n_draft = K;
		}
	return 0;
}

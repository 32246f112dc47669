/* SPDX-License-Identifier: MIT */
/*
 * tests/hf_logits.c - dpshard's teacher-forced logits of a checkpoint, for the comparison with
 * the numpy reference of Hugging Face's forward pass (tests/hf_ref.py, run by
 * tests/hf_oracle.sh).
 *
 * The ids file holds one line of space-separated token ids per sequence, all of the same
 * length N. Across ranks (the default) replica d feeds line d (the file needs at least DP
 * lines; later lines are ignored): positions 0..P-1 in one prefill step with every row's
 * logits wanted, then each later position as a decode step of one row, the given next id
 * rather than a sampled one, so both graphs run. Every replica has that same schedule, so
 * coupled replicas (dps_shard_coupled) step together; they still agree before every step
 * through dps_lockstep_get_dp_padding, as the serving engine does, and the agreement must
 * call for no padding. Every rank writes its logits into a shared mapping; once the ranks are
 * done the driver checks that the TP ranks of each replica agree bit for bit, and writes
 * those of TP rank 0. With --one-rank-model the whole model runs in this process instead
 * (dps_model_load, dps_model_step or with --reference dps_model_step_ref), every line of the
 * file a sequence of its own: one step of all the lines' first P positions, then steps of one
 * row per line.
 *
 * Output: for each replica (or line) in order, N x vocab float32 logits, little-endian, row p
 * the logits after position p.
 *
 * Usage: hf_logits --model DIR --ids FILE --out FILE [--prefill P] [--tp N] [--dp N]
 *        [--attention-dp-size N] [--embedding-dp-size N] [--mlp-dp-size N]
 *        [--lm-head-dp-size N] [--enable-expert-parallel]
 *        [--all2all-backend allgather_reducescatter|alltoallv] [--one-rank-model] [--reference]
 *        [--fault-tp-rank]
 * --fault-tp-rank flips one bit of the last TP rank's logits before the ranks are compared, to
 * show that the comparison fails when they differ.
 * Exit status: 0, 1 for a failure (a message on stderr), 2 for a usage error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/dps.h"
#include "engine/model/model.h"
#include "engine/runtime/supervisor.h"
#include "engine/serve/lockstep.h"
#include "engine/shard/shard.h"
#include "kernels/gemm.h"
#include "tools/flags.h"

#define MAX_LINES 64

struct seqs {
	int n_lines, n;   /* lines, positions per line */
	int *ids;         /* (n_lines, n) */
};

struct run {
	const char *model;
	const struct seqs *q;
	int prefill;
	int vocab;
	float *out;       /* shared: (world, n, vocab) logits, rank d * TP + t at slot d * TP + t */
};

/* Reads the ids file: lines of ids, blank lines skipped, all of one length. 0 or -1. */
static int read_ids(const char *path, struct seqs *q)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0, have = 0;
	int rc = -1;

	memset(q, 0, sizeof(*q));
	if (!f) {
		fprintf(stderr, "hf_logits: %s: %s\n", path, strerror(errno));
		return -1;
	}
	while (getline(&line, &cap, f) > 0) {
		int n = 0;
		char *p = line, *end;

		for (;;) {
			long v = strtol(p, &end, 10);

			if (end == p)
				break;
			if (v < 0 || v >= DPS_CFG_MAX_VOCAB) {
				fprintf(stderr, "hf_logits: %s: id %ld is not a token id\n", path, v);
				goto out;
			}
			if ((size_t)n + 1 + (size_t)q->n_lines * (size_t)q->n > have) {
				int *grown;

				have = have ? 2 * have : 1024;
				grown = realloc(q->ids, have * sizeof(int));
				if (!grown) {
					fprintf(stderr, "hf_logits: %s: out of memory\n", path);
					goto out;
				}
				q->ids = grown;
			}
			q->ids[(size_t)q->n_lines * (size_t)q->n + (size_t)n++] = (int)v;
			p = end;
		}
		while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
			p++;
		if (*p) {
			fprintf(stderr, "hf_logits: %s line %d: not a list of ids\n", path,
				q->n_lines + 1);
			goto out;
		}
		if (!n)
			continue;
		if (q->n_lines && n != q->n) {
			fprintf(stderr, "hf_logits: %s line %d has %d ids, the first line %d\n", path,
				q->n_lines + 1, n, q->n);
			goto out;
		}
		if (q->n_lines == MAX_LINES) {
			fprintf(stderr, "hf_logits: %s: more than %d lines\n", path, MAX_LINES);
			goto out;
		}
		q->n = n;
		q->n_lines++;
	}
	rc = q->n_lines ? 0 : -1;
	if (rc)
		fprintf(stderr, "hf_logits: %s holds no ids\n", path);
out:
	free(line);
	fclose(f);
	return rc;
}

/* This replica's agreement before a step; the schedule is the same everywhere, so no padding. */
static int agree(struct dps_shard *s, int rows, int prefill, int unfinished, int *scratch)
{
	const struct dps_dp_say say = { rows, prefill, unfinished, 0 };
	struct dps_dp_plan plan;
	int rc = dps_lockstep_get_dp_padding(s->dp_c, s->par.dp, s->d, &say, scratch, &plan);

	if (rc)
		return rc;
	if (plan.any_work != unfinished || (unfinished && (plan.any_prefill != prefill ||
							  plan.max_rows != rows))) {
		fprintf(stderr, "hf_logits: replica %d: the replicas disagree on a step of %d rows "
			"(prefill %d): %d rows, prefill %d\n", s->d, rows, prefill, plan.max_rows,
			plan.any_prefill);
		return -EPROTO;
	}
	return 0;
}

static int rank_main(struct dps_world *w, void *argp)
{
	const struct run *a = argp;
	const struct seqs *q = a->q;
	const int N = q->n, P = a->prefill, *ids = q->ids + (size_t)w->dp_rank * (size_t)N;
	float *mine = a->out + (size_t)(w->dp_rank * w->tp + w->tp_rank) * (size_t)N *
				       (size_t)a->vocab;
	int *pos = calloc((size_t)P, sizeof(int)), *seq = calloc((size_t)P, sizeof(int));
	int scratch[4 * DPS_MAX_WORLD];
	struct dps_shard s;
	char err[512];
	int rc, coupled;

	if (!pos || !seq) {
		rc = -ENOMEM;
		goto out;
	}
	dps_gemm_setup("auto", 1, err, sizeof(err));
	rc = dps_shard_load(&s, w, &w->lay->groups.cfg, a->model,
			    &(struct dps_shard_opts){ .max_pos = N, .max_seqs = 1, .max_rows = P },
			    err, sizeof(err));
	if (rc) {
		fprintf(stderr, "hf_logits: rank %d: %s\n", w->rank, err);
		goto out;
	}
	if (s.cfg.vocab_size != a->vocab) {
		fprintf(stderr, "hf_logits: rank %d: vocabulary %d, the driver's %d\n", w->rank,
			s.cfg.vocab_size, a->vocab);
		rc = -EINVAL;
		goto free;
	}
	coupled = dps_shard_coupled(&s);
	for (int p = 0; p < N;) {
		const int prefill = p == 0, rows = prefill ? P : 1;
		const float *lg;

		for (int i = 0; i < rows; i++)
			pos[i] = p + i;
		if (coupled && (rc = agree(&s, rows, prefill, 1, scratch)))
			goto free;
		lg = dps_shard_step(&s, prefill, rows, ids + p, pos, seq, NULL, &rc);
		if (!lg) {
			fprintf(stderr, "hf_logits: rank %d: step at position %d: %s\n", w->rank, p,
				dps_strerror(rc));
			goto free;
		}
		memcpy(mine + (size_t)p * (size_t)a->vocab, lg,
		       sizeof(float) * (size_t)rows * (size_t)a->vocab);
		p += rows;
	}
	if (coupled) /* the engine's last agreement: nobody has work left */
		rc = agree(&s, 0, 0, 0, scratch);
free:
	dps_shard_free(&s);
out:
	free(pos);
	free(seq);
	return rc;
}

/* Every line of q through the one-rank model with the same schedule; logits into out. */
static int run_one_rank(const char *model, const struct seqs *q, int P, int reference,
			float *out, int vocab)
{
	const int L = q->n_lines, N = q->n, R = L * P;
	int *tok = calloc((size_t)R, sizeof(int)), *pos = calloc((size_t)R, sizeof(int));
	int *seq = calloc((size_t)R, sizeof(int));
	struct dps_model m;
	char err[512];
	int rc = -ENOMEM;

	if (!tok || !pos || !seq)
		goto out;
	if (!reference)
		dps_gemm_setup("auto", 1, err, sizeof(err));
	rc = dps_model_load(&m, model, &(struct dps_model_opts){ .max_pos = N, .max_seqs = L,
								 .max_rows = R, .max_out = R },
			    err, sizeof(err));
	if (rc) {
		fprintf(stderr, "hf_logits: %s\n", err);
		goto out;
	}
	rc = -EINVAL;
	if (m.cfg.vocab_size != vocab) {
		fprintf(stderr, "hf_logits: vocabulary %d, config.json's %d\n", m.cfg.vocab_size,
			vocab);
		goto free;
	}
	for (int p = 0; p < N;) {
		const int rows = p == 0 ? P : 1;
		const float *lg;
		int n = 0;

		for (int k = 0; k < L; k++)
			for (int i = 0; i < rows; i++, n++) {
				tok[n] = q->ids[(size_t)k * (size_t)N + (size_t)(p + i)];
				pos[n] = p + i;
				seq[n] = k;
			}
		lg = reference ? dps_model_step_ref(&m, n, tok, pos, seq, NULL)
			       : dps_model_step(&m, n, tok, pos, seq, NULL);
		for (int k = 0; k < L; k++)
			memcpy(out + ((size_t)k * (size_t)N + (size_t)p) * (size_t)vocab,
			       lg + (size_t)k * (size_t)rows * (size_t)vocab,
			       sizeof(float) * (size_t)rows * (size_t)vocab);
		p += rows;
	}
	rc = 0;
free:
	dps_model_free(&m);
out:
	free(tok);
	free(pos);
	free(seq);
	return rc;
}

/* The first position where the logits of TP rank t differ from TP rank 0's, or -1. */
static int first_difference(const float *a, const float *b, int n, int vocab)
{
	for (int p = 0; p < n; p++)
		if (memcmp(a + (size_t)p * (size_t)vocab, b + (size_t)p * (size_t)vocab,
			   sizeof(float) * (size_t)vocab))
			return p;
	return -1;
}

static int write_out(const char *path, const float *x, size_t n)
{
	FILE *f = fopen(path, "wb");
	int ok;

	if (!f) {
		fprintf(stderr, "hf_logits: %s: %s\n", path, strerror(errno));
		return -1;
	}
	/* The machines dpshard runs on are little-endian: the floats go out as they are. */
	ok = fwrite(x, sizeof(float), n, f) == n;
	ok &= fclose(f) == 0;
	if (!ok)
		fprintf(stderr, "hf_logits: %s: write failed\n", path);
	return ok ? 0 : -1;
}

/* Checks the ids against the model, runs them and writes the logits: an exit status. */
static int run_all(const char *model, const struct seqs *q, const struct dps_par_cfg *par,
		   int prefill, int one_rank, int reference, int fault, const char *ids_path,
		   const char *out_path)
{
	struct dps_model_config cfg;
	size_t floats, one;
	char err[512];
	int status = 1;
	float *out;

	if (!prefill)
		prefill = q->n / 2 ? q->n / 2 : 1;
	if (prefill > q->n) {
		fprintf(stderr, "hf_logits: --prefill %d is longer than the %d ids of a line\n",
			prefill, q->n);
		return 2;
	}
	if (!one_rank && q->n_lines < par->dp) {
		fprintf(stderr, "hf_logits: %s has %d lines for %d replicas\n", ids_path,
			q->n_lines, par->dp);
		return 2;
	}
	if (dps_model_config_load(model, &cfg, err, sizeof(err))) {
		fprintf(stderr, "hf_logits: %s\n", err);
		return 1;
	}
	for (size_t i = 0; i < (size_t)q->n_lines * (size_t)q->n; i++)
		if (q->ids[i] >= cfg.vocab_size) {
			fprintf(stderr, "hf_logits: id %d is outside the vocabulary of %d\n", q->ids[i],
				cfg.vocab_size);
			return 2;
		}
	one = (size_t)q->n * (size_t)cfg.vocab_size; /* the logits of one sequence */
	floats = (size_t)(one_rank ? q->n_lines : par->tp * par->dp) * one;
	out = mmap(NULL, floats * sizeof(float), PROT_READ | PROT_WRITE,
		   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (out == MAP_FAILED) {
		fprintf(stderr, "hf_logits: mmap of %zu logits: %s\n", floats, strerror(errno));
		return 1;
	}
	if (one_rank) {
		if (!run_one_rank(model, q, prefill, reference, out, cfg.vocab_size))
			status = write_out(out_path, out, floats) ? 1 : 0;
		goto unmap;
	}
	{
		struct run a = { model, q, prefill, cfg.vocab_size, out };
		struct dps_sup_opts o = { .par = *par, .rank_fn = rank_main, .rank_arg = &a,
					  .cpu_bind = "off" };
		struct dps_sup_result res;

		if (dps_sup_run(&o, &res, err, sizeof(err))) {
			fprintf(stderr, "hf_logits: %s\n", err);
			goto unmap;
		}
	}
	if (fault && par->tp > 1) /* the last byte of replica 0's last TP rank's logits */
		((unsigned char *)(out + (size_t)par->tp * one))[-1] ^= 1;
	/* The TP ranks of a replica hold the same rows: their logits must be the same bits. */
	for (int d = 0; d < par->dp; d++)
		for (int t = 1; t < par->tp; t++) {
			const int p = first_difference(out + (size_t)(d * par->tp) * one,
						       out + (size_t)(d * par->tp + t) * one, q->n,
						       cfg.vocab_size);

			if (p >= 0) {
				fprintf(stderr, "hf_logits: replica %d: TP rank %d's logits differ from "
					"TP rank 0's at position %d\n", d, t, p);
				goto unmap;
			}
		}
	/* TP rank 0 of each replica, in replica order. */
	for (int d = 1; d < par->dp; d++)
		memmove(out + (size_t)d * one, out + (size_t)(d * par->tp) * one,
			sizeof(float) * one);
	status = write_out(out_path, out, (size_t)par->dp * one) ? 1 : 0;
unmap:
	munmap(out, floats * sizeof(float));
	return status;
}

int main(int argc, char **argv)
{
	struct dps_par_cfg par = DPS_PAR_CFG_DEFAULT;
	const char *model = NULL, *ids_path = NULL, *out_path = NULL;
	int prefill = 0, one_rank = 0, reference = 0, fault = 0, rc, npos, status;
	struct dps_flag flags[] = {
		{ "model", DPS_FLAG_STR, &model, "DIR", "checkpoint directory", 0, 0, 0 },
		{ "ids", DPS_FLAG_STR, &ids_path, "FILE", "one line of token ids per replica", 0, 0,
		  0 },
		{ "out", DPS_FLAG_STR, &out_path, "FILE", "float32 logits, replica after replica", 0,
		  0, 0 },
		{ "prefill", DPS_FLAG_INT, &prefill, "P", "positions of the prefill step (0: N / 2)",
		  0, 1 << 24, 0 },
		{ "tp", DPS_FLAG_INT, &par.tp, "N", "tensor-parallel size", 1, DPS_MAX_WORLD, 0 },
		{ "dp", DPS_FLAG_INT, &par.dp, "N", "data-parallel size (replicas)", 1,
		  DPS_MAX_WORLD, 0 },
		{ "attention-dp-size", DPS_FLAG_INT, &par.attn_dp, "N", "attention's DP size", 1,
		  DPS_MAX_WORLD, 0 },
		{ "embedding-dp-size", DPS_FLAG_INT, &par.emb_dp, "N", "embedding's DP size", 1,
		  DPS_MAX_WORLD, 0 },
		{ "mlp-dp-size", DPS_FLAG_INT, &par.mlp_dp, "N", "MLP's DP size", 1, DPS_MAX_WORLD,
		  0 },
		{ "lm-head-dp-size", DPS_FLAG_INT, &par.lm_head_dp, "N", "LM head's DP size", 1,
		  DPS_MAX_WORLD, 0 },
		{ "enable-expert-parallel", DPS_FLAG_BOOL, &par.ep, NULL,
		  "experts over the TP x DP ranks", 0, 0, 0 },
		/* The choice's 1 + index is enum dps_a2a's value. */
		{ "all2all-backend", DPS_FLAG_CHOICE, &par.a2a, "allgather_reducescatter|alltoallv",
		  "the expert dispatch", 0, 0, 0 },
		{ "one-rank-model", DPS_FLAG_BOOL, &one_rank, NULL,
		  "the one-rank model in this process, every line a sequence", 0, 0, 0 },
		{ "reference", DPS_FLAG_BOOL, &reference, NULL,
		  "with --one-rank-model: the plain-C reference kernels", 0, 0, 0 },
		{ "fault-tp-rank", DPS_FLAG_BOOL, &fault, NULL,
		  "the deliberate fault: one bit of the last TP rank's logits flipped", 0, 0, 0 },
		DPS_FLAGS_END
	};
	struct seqs q;
	char err[512];

	rc = dps_flags_parse(flags, argc - 1, argv + 1, "hf_logits",
			     "--model DIR --ids FILE --out FILE [OPTIONS]", NULL, 0, &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (!model || !ids_path || !out_path) {
		fprintf(stderr, "hf_logits: --model, --ids and --out are required\n");
		return 2;
	}
	if (reference && !one_rank) {
		fprintf(stderr, "hf_logits: --reference is a kernel choice of --one-rank-model\n");
		return 2;
	}
	if (dps_par_cfg_check(&par, err, sizeof(err))) {
		fprintf(stderr, "hf_logits: %s\n", err);
		return 2;
	}
	if (read_ids(ids_path, &q)) {
		free(q.ids);
		return 1;
	}
	status = run_all(model, &q, &par, prefill, one_rank, reference, fault, ids_path, out_path);
	free(q.ids);
	return status;
}

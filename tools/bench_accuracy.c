/* SPDX-License-Identifier: MIT */
/*
 * tools/bench_accuracy.c - `dpshard bench accuracy`: how far a model held in a cheaper format
 * (--dtype bf16, --quantization int8) is from the f32 model, measured as llama.cpp's
 * perplexity tool does with --kl-divergence (kernels/kld.h: mean KL(P_f32 || Q) with its
 * standard error, top-1 agreement, both perplexities) over a few thousand positions of text.
 *
 * The text is a token stream: a file's (--text, encoded with BOS), or, by default, the f32
 * model's own greedy continuation of a prompt (--prompt; default: BOS alone, generate's
 * default). It is cut into windows of --ctx tokens; each window is a fresh sequence from
 * position 0, and every row of it is scored against the stream's next token (the last row of
 * a window predicts the first token of the next one), so N positions are N + 1 tokens. The
 * greedy text is made with the same windows, one row at a time, so that it is exactly what
 * the f32 model predicts where it is scored.
 *
 * Each model runs the engine generate would use for it: f32 the one-rank model
 * (engine/model/model.c), BF16 and INT8 the sharded engine on a 1 x 1 layout in this process
 * (INT8: every linear weight and the LM head quantized, the embedding table as loaded). Both are
 * loaded side by side and go through each window in the same chunks of rows (prefill, as the
 * engine does); the statistics are summed chunk by chunk from the two models' logits, so the
 * memory is the two models plus two chunks of logits, whatever the number of positions (the
 * full f32 distributions of 4096 positions of a 32000-token vocabulary would be 1 GB in
 * double). Same input, same bits: everything is serial in id order after the forwards.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "common/json.h"
#include "engine/model/ckpt.h"
#include "engine/model/model.h"
#include "engine/model/tok.h"
#include "engine/shard/shard.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/kld.h"
#include "tools/cmd.h"
#include "tools/flags.h"
#include "tools/text.h"

#define CHUNK_ROWS 512 /* rows per forward step (generate's prefill chunk) */

/* The model under test: the one-rank f32 model or the sharded engine (BF16). */
struct qmodel {
	int sharded;
	struct dps_model m;
	struct dps_shard s;
};

static const float *q_step(struct qmodel *q, int n, const int *tok, const int *pos,
			   const int *seq, int *rc)
{
	if (q->sharded)
		return dps_shard_step(&q->s, 1, n, tok, pos, seq, NULL, rc);
	*rc = 0;
	return dps_model_step(&q->m, n, tok, pos, seq, NULL);
}

/* Reads the whole file into a malloc'd buffer; 0 or -errno. */
static int read_file(const char *path, char **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	size_t cap = 1 << 16, n = 0;
	char *b = NULL;

	if (!f)
		return -errno;
	for (;;) {
		char *nb = realloc(b, cap);

		if (!nb) {
			free(b);
			fclose(f);
			return -ENOMEM;
		}
		b = nb;
		n += fread(b + n, 1, cap - n, f);
		if (n < cap)
			break;
		cap *= 2;
	}
	if (ferror(f)) {
		free(b);
		fclose(f);
		return -EIO;
	}
	fclose(f);
	*buf = b;
	*len = n;
	return 0;
}

/*
 * The f32 model's greedy text: t[0..np) given, t[np..n_tok) its argmax, window by window as
 * the evaluation cuts them. 0 or a negative code.
 */
static int greedy_text(struct dps_model *m, int *t, int np, int n_tok, int win)
{
	const int V = m->cfg.vocab_size, seq = 0;

	for (int j = 0; j + 1 < n_tok; j++) {
		const int pos = j % win;
		const float *lg = dps_model_step(m, 1, t + j, &pos, &seq, NULL);

		if (!lg)
			return -EIO;
		if (j + 1 >= np)
			t[j + 1] = dps_argmax(lg, V);
	}
	return 0;
}

/* Both models over the stream t[0..n_tok), window by window, chunk by chunk, into a. */
static int evaluate(struct dps_model *p, struct qmodel *q, const int *t, int n_tok, int win,
		    int chunk, struct dps_kld *a)
{
	const int V = p->cfg.vocab_size;
	int *pos = malloc(sizeof(int) * (size_t)chunk), *seq = calloc((size_t)chunk, sizeof(int));
	int rc = 0;

	if (!pos || !seq) {
		rc = -ENOMEM;
		goto out;
	}
	for (int w0 = 0; w0 + 1 < n_tok; w0 += win) {
		const int rows = n_tok - 1 - w0 < win ? n_tok - 1 - w0 : win;

		for (int c0 = 0; c0 < rows; c0 += chunk) {
			const int n = rows - c0 < chunk ? rows - c0 : chunk;
			const float *lp, *lq;

			for (int i = 0; i < n; i++)
				pos[i] = c0 + i;
			lp = dps_model_step(p, n, t + w0 + c0, pos, seq, NULL);
			lq = q_step(q, n, t + w0 + c0, pos, seq, &rc);
			if (!lp || !lq) {
				rc = rc ? rc : -EIO;
				goto out;
			}
			for (int i = 0; i < n && !rc; i++)
				rc = dps_kld_add(a, lp + (size_t)i * V, lq + (size_t)i * V, V,
						 t[w0 + c0 + i + 1]);
			if (rc)
				goto out;
		}
	}
out:
	free(pos);
	free(seq);
	return rc;
}

static void print_json(const char *model, const char *base, const char *dtype,
		       const char *engine, const char *text, int win,
		       const struct dps_kld_summary *s, size_t qbytes, size_t pbytes)
{
	printf("{\"model\": ");
	dps_json_string(stdout, model, strlen(model));
	printf(", \"base\": ");
	dps_json_string(stdout, base, strlen(base));
	printf(", \"dtype\": \"%s\", \"engine\": \"%s\", \"text\": \"%s\", \"window\": %d, "
	       "\"positions\": %llu,\n", dtype, engine, text, win, (unsigned long long)s->count);
	printf(" \"kld_mean\": %.9g, \"kld_se\": %.9g, \"kld_max\": %.9g,\n", s->kld, s->kld_se,
	       s->kld_max);
	printf(" \"top1_agreement\": %.9g, \"top1_agreement_se\": %.9g,\n", s->top1, s->top1_se);
	printf(" \"ppl_base\": %.9g, \"ppl_base_se\": %.9g, \"ppl\": %.9g, \"ppl_se\": %.9g,\n",
	       s->ppl_p, s->ppl_p_se, s->ppl_q, s->ppl_q_se);
	printf(" \"ln_ppl_ratio\": %.9g, \"ln_ppl_ratio_se\": %.9g, \"dp_mean\": %.9g, "
	       "\"dp_rms\": %.9g,\n", s->ln_ratio, s->ln_ratio_se, s->dp_mean, s->dp_rms);
	printf(" \"weight_bytes\": %zu, \"base_weight_bytes\": %zu}\n", qbytes, pbytes);
}

static void print_human(const char *model, const char *base, const char *dtype,
			const char *engine, const char *text, int win,
			const struct dps_kld_summary *s, size_t qbytes, size_t pbytes)
{
	printf("bench accuracy: %s as %s (%s, %.2f MB of weights) against f32 %s (%.2f MB)\n",
	       model, dtype, engine, (double)qbytes / 1e6, base, (double)pbytes / 1e6);
	printf("text: %s, %llu positions in windows of %d\n", text,
	       (unsigned long long)s->count, win);
	printf("Mean    KLD: %12.6g +/- %.6g   (KL(P_f32 || Q), nats)\n", s->kld, s->kld_se);
	printf("Maximum KLD: %12.6g\n", s->kld_max);
	printf("Same top p : %12.3f +/- %.3f %%\n", 100.0 * s->top1, 100.0 * s->top1_se);
	printf("PPL(f32)   : %12.6f +/- %.6f\n", s->ppl_p, s->ppl_p_se);
	printf("PPL(%-4s)  : %12.6f +/- %.6f\n", dtype, s->ppl_q, s->ppl_q_se);
	printf("ln(PPL(%s)/PPL(f32)): %.6g +/- %.6g\n", dtype, s->ln_ratio, s->ln_ratio_se);
	printf("Mean dp    : %12.6g %%   RMS dp: %.6g %%   (p of the text's token, Q - P)\n",
	       100.0 * s->dp_mean, 100.0 * s->dp_rms);
}

int dps_bench_accuracy(int argc, char **argv)
{
	const char *model = NULL, *base = NULL, *text_file = NULL, *prompt = NULL;
	const char *blis_arch = "auto";
	int dtype = 0, quant = 0, n_pos = 4096, ctx = 0, threads = 0, json = 0, npos, rc, bf16;
	int int8 = 0, f16 = 0;
	int *t = NULL, n_tok = 0, np = 0, win, chunk;
	char defdir[4096], err[512];
	struct dps_model p = { 0 };
	struct qmodel q = { 0 };
	struct dps_tool_text tt = { 0 };
	struct dps_kld acc = { 0 };
	struct dps_kld_summary sum;
	size_t qbytes = 0;
	const struct dps_flag flags[] = {
		{ "model", DPS_FLAG_STR, &model, "DIR",
		  "checkpoint directory of the model under test (default: stories260K)" },
		{ "base", DPS_FLAG_STR, &base, "DIR",
		  "the f32 model P is taken from (default: --model itself, in f32)" },
		dps_flag_dtype(&dtype),
		dps_flag_quantization(&quant),
		{ "positions", DPS_FLAG_INT, &n_pos, "N",
		  "positions scored (a --text file may have fewer)", 1, 1 << 24, 'n' },
		{ "text", DPS_FLAG_STR, &text_file, "FILE",
		  "score this file's text (default: the f32 model's greedy text)" },
		{ "prompt", DPS_FLAG_STR, &prompt, "TEXT",
		  "the greedy text continues this prompt (default: BOS alone, as generate)" },
		{ "ctx", DPS_FLAG_INT, &ctx, "N",
		  "tokens per window, each a fresh sequence (0: the model's context)", 0, 1 << 24 },
		{ "threads-per-rank", DPS_FLAG_INT, &threads, "N",
		  "threads of the products (0: the CPUs the process may run on)", 0, 1024 },
		{ "blis-arch", DPS_FLAG_STR, &blis_arch, "A",
		  "auto (batch-invariant kernels) or a BLIS configuration, as generate" },
		{ "json", DPS_FLAG_BOOL, &json, NULL, "print one JSON object" },
		DPS_FLAGS_END
	};

	rc = dps_flags_parse(flags, argc, argv, "bench accuracy",
			     "[--model DIR] [--dtype bf16 | --quantization int8] [-n POSITIONS] "
			     "[--text FILE | --prompt "
			     "TEXT] [OPTIONS]", NULL, 0, &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (text_file && prompt) {
		fprintf(stderr, "dpshard bench accuracy: give --text or --prompt, not both\n");
		return 2;
	}
	if (!model) {
		if (dps_default_model("bench accuracy", defdir, sizeof(defdir)))
			return 1;
		model = defdir;
	}
	if (!base)
		base = model;
	/* --dtype: bf16 unless asked otherwise (f32 against itself is 0 by construction); auto
	 * follows the checkpoint as generate does. --quantization int8: INT8 linear weights,
	 * the embedding as --dtype says (unset: the checkpoint's). An INT8 checkpoint is INT8
	 * unless --dtype f32. */
	bf16 = !quant && (dtype == 0 || dtype == 1 + DPS_SHARD_DTYPE_BF16);
	int8 = quant;
	if (dtype == 1 + DPS_SHARD_DTYPE_AUTO || (!quant && dtype != 1 + DPS_SHARD_DTYPE_F32)) {
		struct dps_ckpt ck;

		if (dps_ckpt_open(&ck, model, err, sizeof(err))) {
			fprintf(stderr, "dpshard bench accuracy: %s\n", err);
			return 1;
		}
		if (ck.cfg.int8 && !quant)
			int8 = 1, bf16 = 0;
		else if (!quant && dtype == 1 + DPS_SHARD_DTYPE_AUTO)
			bf16 = dps_ckpt_weights_bf16(&ck), f16 = dps_ckpt_weights_f16(&ck);
		dps_ckpt_close(&ck);
	}
	if (!threads)
		threads = dps_cpus_allowed();
	if (dps_gemm_setup(blis_arch, threads, err, sizeof(err))) {
		fprintf(stderr, "dpshard bench accuracy: %s\n", err);
		return 2;
	}
	{
		struct dps_model_config cfg;

		if (dps_model_config_load(base, &cfg, err, sizeof(err))) {
			fprintf(stderr, "dpshard bench accuracy: %s\n", err);
			return 1;
		}
		win = ctx && ctx < cfg.max_position_embeddings ? ctx : cfg.max_position_embeddings;
		win = win < n_pos ? win : n_pos; /* no KV cache beyond the positions scored */
	}
	chunk = win < CHUNK_ROWS ? win : CHUNK_ROWS;
	rc = dps_model_load(&p, base,
			    &(struct dps_model_opts){ .max_pos = win, .max_seqs = 1,
						      .max_rows = chunk, .max_out = chunk },
			    err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dpshard bench accuracy: %s\n", err);
		return 1;
	}
	win = p.max_pos < win ? p.max_pos : win;
	if (dps_tool_text_open(&tt, "bench accuracy", base, &p.cfg)) {
		rc = -EINVAL;
		goto out;
	}

	/* The text: n_pos + 1 tokens (fewer from a short file). */
	t = malloc(sizeof(int) * ((size_t)n_pos + 1));
	if (!t) {
		rc = -ENOMEM;
		goto out;
	}
	if (text_file || prompt) {
		char *buf = NULL;
		size_t len = 0, n = 0;
		int *ids = NULL;

		if (!tt.tok) {
			fprintf(stderr, "dpshard bench accuracy: %s has no tokenizer for --%s\n", base,
				text_file ? "text" : "prompt");
			rc = -EINVAL;
			goto out;
		}
		if (text_file) {
			rc = read_file(text_file, &buf, &len);
			if (rc) {
				fprintf(stderr, "dpshard bench accuracy: --text %s: %s\n", text_file,
					dps_strerror(rc));
				goto out;
			}
		}
		rc = dps_tok_encode(tt.tok, text_file ? buf : prompt, text_file ? len : strlen(prompt),
				    DPS_TOK_ADD_SPECIAL, 0, &ids, &n);
		free(buf);
		if (rc) {
			fprintf(stderr, "dpshard bench accuracy: cannot encode the %s: %s\n",
				text_file ? "text" : "prompt", dps_strerror(rc));
			goto out;
		}
		np = n > (size_t)n_pos + 1 ? n_pos + 1 : (int)n;
		memcpy(t, ids, sizeof(int) * (size_t)np);
		free(ids);
		if (text_file && np < 2) {
			fprintf(stderr, "dpshard bench accuracy: --text %s has %d token(s); scoring "
					"needs at least 2\n", text_file, np);
			rc = -EINVAL;
			goto out;
		}
	} else {
		t[0] = p.cfg.bos_token_id;
		np = 1;
	}
	n_tok = text_file ? np : n_pos + 1;
	if (!text_file) {
		rc = greedy_text(&p, t, np, n_tok, win);
		if (rc)
			goto out;
	}

	/* The model under test, beside the base. */
	if (bf16 || f16 || int8) {
		struct dps_par_cfg par = DPS_PAR_CFG_DEFAULT;

		q.sharded = 1;
		rc = dps_shard_load(&q.s, NULL, &par, model,
				    &(struct dps_shard_opts){ .max_pos = win, .max_seqs = 1,
							      .max_rows = chunk,
							      .dtype = int8 && dtype
									       ? (enum dps_shard_dtype)(dtype - 1)
									       : int8 || f16 ? DPS_SHARD_DTYPE_AUTO
											     : DPS_SHARD_DTYPE_BF16,
							      .quant = (enum dps_shard_quant)quant },
				    err, sizeof(err));
		for (int k = 0; !rc && k < DPS_PART_COUNT; k++)
			qbytes += q.s.bytes[k];
	} else {
		rc = dps_model_load(&q.m, model,
				    &(struct dps_model_opts){ .max_pos = win, .max_seqs = 1,
							      .max_rows = chunk, .max_out = chunk },
				    err, sizeof(err));
		qbytes = q.m.weight_bytes;
	}
	if (rc) {
		fprintf(stderr, "dpshard bench accuracy: %s\n", err);
		q.sharded = -1; /* nothing to free */
		goto out;
	}
	if (q.sharded ? q.s.cfg.vocab_size != p.cfg.vocab_size
		      : q.m.cfg.vocab_size != p.cfg.vocab_size) {
		fprintf(stderr, "dpshard bench accuracy: --model %s and --base %s have different "
				"vocabularies\n", model, base);
		rc = -EINVAL;
		goto out;
	}
	rc = evaluate(&p, &q, t, n_tok, win, chunk, &acc);
	if (rc) {
		fprintf(stderr, "dpshard bench accuracy: %s\n",
			rc == -EDOM ? "a model gave a logit that is not finite" : dps_strerror(rc));
		goto out;
	}
	dps_kld_summarize(&acc, &sum);
	{
		const char *dt = int8 ? "int8" : bf16 ? "bf16" : f16 ? "f16" : "f32";
		const char *engine = int8 || bf16 || f16 ? "sharded engine, 1 x 1" : "one-rank model";
		const char *what = text_file ? "file" : prompt ? "greedy f32 from the prompt"
							       : "greedy f32 from BOS";

		if (json)
			print_json(model, base, dt, engine, text_file ? "file" : "greedy", win, &sum,
				   qbytes, p.weight_bytes);
		else
			print_human(model, base, dt, engine, what, win, &sum, qbytes,
				    p.weight_bytes);
	}
out:
	if (q.sharded == 1)
		dps_shard_free(&q.s);
	else if (!q.sharded && q.m.layers)
		dps_model_free(&q.m);
	free(t);
	dps_tool_text_close(&tt);
	dps_model_free(&p);
	return rc ? 1 : 0;
}

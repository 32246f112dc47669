/* SPDX-License-Identifier: MIT */
/*
 * tools/cmd_generate.c - `dpshard generate`: text or ids from a prompt, in one process (the
 * one-rank model, as llama2.c's run.c) or across ranks on the serving engine
 * (tools/gen_ranks.c), and many requests at once from a JSON-lines file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/api/request.h"
#include "engine/model/model.h"
#include "engine/model/ckpt.h"
#include "engine/shard/shard.h"
#include "kernels/gemm.h"
#include "kernels/sample.h"
#include "tools/cmd.h"
#include "tools/flags.h"
#include "tools/gen_ranks.h"
#include "tools/text.h"

/* Rows per prefill step of generate (a longer prompt goes through in several). */
#define PREFILL_ROWS 512
/* Prompts one generate takes (each a positional argument). */
#define MAX_PROMPTS 64

/* Loads the model's config and checks the layout against it; 0, or the exit status after a
 * message. */
/*
 * Whether the model's linear weights are held as BF16, F16 or INT8, which only the sharded
 * engine does: 1 when asked (--dtype bf16, --quantization) or when --dtype auto finds them
 * BF16, F16 or INT8 in the checkpoint, else 0 (also when it cannot be opened: the load that follows says
 * why).
 */
static int weights_narrow(const char *dir, int asked)
{
	struct dps_ckpt ck;
	char err[512];
	int rc;

	if (asked)
		return 1;
	if (dps_ckpt_open(&ck, dir, err, sizeof(err)))
		return 0;
	rc = dps_ckpt_weights_bf16(&ck) || dps_ckpt_weights_f16(&ck) || ck.cfg.int8;
	dps_ckpt_close(&ck);
	return rc;
}

static int check_layout(const struct dps_gen_ranks_opts *o, struct dps_model_config *cfg)
{
	char err[512];
	int rc = dps_model_config_load(o->model, cfg, err, sizeof(err));

	if (!rc)
		rc = dps_par_cfg_check(&o->par, err, sizeof(err));
	if (!rc)
		rc = dps_shard_check(cfg, &o->par, err, sizeof(err));
	if (rc)
		fprintf(stderr, "dpshard generate: %s\n", err);
	return rc == -DPS_ECONFIG ? 2 : rc ? 1 : 0;
}

/*
 * The ids of one prompt (into *ids, malloc'd; *n): --prompt-ids exactly as given; text through
 * the tokenizer with its special tokens (BOS for llama2.c's); --chat the text as a user message
 * through the chat template; no prompt at all, BOS alone (llama2.c's empty prompt). 0, or the
 * exit status after a message.
 */
static int prompt_of(const struct dps_tool_text *tt, const struct dps_model_config *cfg,
		     const char *model, const char *text, int given, int prompt_ids, int chat,
		     int **ids, size_t *n)
{
	char err[512];
	int rc;

	*ids = NULL;
	*n = 0;
	if (prompt_ids) {
		const size_t cap = strlen(text) / 2 + 2;
		int m;

		*ids = malloc(cap * sizeof(int));
		if (!*ids)
			return 1;
		m = dps_flags_int_list(text, *ids, (int)cap, 0, cfg->vocab_size - 1);
		if (m <= 0) {
			fprintf(stderr, "dpshard generate: --prompt-ids: '%s' is not a list of ids "
					"below %d\n", text, cfg->vocab_size);
			return 2;
		}
		*n = (size_t)m;
		return 0;
	}
	if (!given && !chat) {
		*ids = malloc(sizeof(int));
		if (!*ids)
			return 1;
		(*ids)[0] = cfg->bos_token_id;
		*n = 1;
		return 0;
	}
	if (!tt->tok) {
		fprintf(stderr, "dpshard generate: %s has no tokenizer (tokenizer.json or "
				"tokenizer.bin); give the prompts as token ids with --prompt-ids\n",
			model);
		return 2;
	}
	if (chat) {
		json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", text);
		char *rendered = NULL;
		size_t len = 0;

		if (!tt->chat) {
			fprintf(stderr, "dpshard generate: --chat: %s\n", tt->chat_err);
			json_decref(msgs);
			return 2;
		}
		rc = msgs ? dps_chat_render(tt->chat, msgs, NULL, 1, NULL, (long long)time(NULL),
					    &rendered, &len, err, sizeof(err)) : -ENOMEM;
		json_decref(msgs);
		if (rc) {
			fprintf(stderr, "dpshard generate: --chat: the chat template: %s\n",
				rc == -ENOMEM ? "out of memory" : err);
			return 1;
		}
		rc = dps_tok_encode(tt->tok, rendered, len, 0, 0, ids, n);
		free(rendered);
	} else {
		rc = dps_tok_encode(tt->tok, text, strlen(text), DPS_TOK_ADD_SPECIAL, 0, ids, n);
	}
	if (!rc && !*n)
		rc = -EINVAL;
	if (rc) {
		fprintf(stderr, "dpshard generate: cannot encode the prompt: %s\n",
			rc == -EINVAL ? "it encodes to no tokens" : dps_strerror(rc));
		return 1;
	}
	return 0;
}

/*
 * generate across ranks: checks the layout against the model, encodes every prompt here in
 * the supervisor, and hands over to dps_generate_ranks.
 */
static int generate_ranks(struct dps_gen_ranks_opts *o, char **texts, int n, int prompt_ids,
			  int chat)
{
	struct dps_model_config cfg;
	struct dps_tool_text tt;
	int **ids = calloc((size_t)(n ? n : 1), sizeof(int *));
	int *lens = calloc((size_t)(n ? n : 1), sizeof(int)), rc;
	const char *empty = "";
	const int given = n > 0;

	if (!ids || !lens) {
		free(ids);
		free(lens);
		return 1;
	}
	rc = check_layout(o, &cfg);
	if (!rc)
		rc = dps_tool_text_open(&tt, "generate", o->model, &cfg);
	if (rc) {
		free(ids);
		free(lens);
		return rc;
	}
	if (o->steps > cfg.max_position_embeddings)
		o->steps = cfg.max_position_embeddings;
	if (!n) { /* no prompt: one generation from BOS, as on one rank */
		texts = (char **)&empty;
		n = 1;
	}
	for (int k = 0; k < n && !rc; k++) {
		size_t got = 0;

		rc = prompt_of(&tt, &cfg, o->model, texts[k], given, prompt_ids, chat, &ids[k], &got);
		if (!rc && (int)got >= o->steps) {
			fprintf(stderr, "dpshard generate: prompt %d has %zu tokens; -n %d leaves no room "
					"to generate\n", k + 1, got, o->steps);
			rc = 2;
		}
		lens[k] = (int)got;
	}
	if (rc)
		goto out;
	o->n_prompts = n;
	o->prompts = (const int *const *)ids;
	o->n_prompt = lens;
	o->texts = (const char *const *)texts;
	o->end = tt.end;
	o->n_end = tt.n_end;
	o->tok = tt.tok;
	o->completion_only = chat;
	rc = dps_generate_ranks(o) ? 1 : 0;
out:
	for (int k = 0; k < n; k++)
		free(ids[k]);
	free(ids);
	free(lens);
	dps_tool_text_close(&tt);
	return rc;
}

/*
 * generate --requests FILE: every line a JSON request (engine/api/request.h). Every line is
 * checked before anything runs; a bad line is reported with its number.
 */
static int generate_requests(struct dps_gen_ranks_opts *o, const char *file)
{
	struct dps_model_config cfg;
	struct dps_tool_text tt;
	struct dps_request *reqs = NULL;
	struct dps_req_params *params = NULL;
	struct dps_req_limits lim;
	int *replica = NULL, *lens = NULL, n = 0, cap = 0, bad = 0, lineno = 0, rc;
	int **ids = NULL;
	char err[512], *line = NULL;
	size_t linecap = 0;
	ssize_t len;
	FILE *f;

	rc = check_layout(o, &cfg);
	if (!rc)
		rc = dps_tool_text_open(&tt, "generate", o->model, &cfg);
	if (rc)
		return rc;
	lim = (struct dps_req_limits){ .vocab = cfg.vocab_size, .default_max_tokens = o->steps };
	dps_tool_text_limits(&tt, &lim);
	/* generate's own sampling default is greedy, whatever generation_config.json says */
	lim.default_temperature = 0.0f;
	lim.default_top_p = 1.0f;
	lim.default_top_k = 0;
	f = fopen(file, "r");
	if (!f) {
		fprintf(stderr, "dpshard generate: --requests %s: %s\n", file, strerror(errno));
		dps_tool_text_close(&tt);
		return 2;
	}
	while ((len = getline(&line, &linecap, f)) >= 0) {
		size_t l = (size_t)len;

		lineno++;
		while (l && (line[l - 1] == '\n' || line[l - 1] == '\r' || line[l - 1] == ' '))
			l--;
		if (!l)
			continue;
		if (n == cap) {
			struct dps_request *nr = realloc(reqs, sizeof(*nr) * (size_t)(cap ? 2 * cap : 64));

			if (!nr) {
				bad = 1;
				break;
			}
			reqs = nr;
			cap = cap ? 2 * cap : 64;
		}
		if (dps_request_parse(line, l, DPS_REQ_LINE, &lim, &reqs[n], err, sizeof(err))) {
			fprintf(stderr, "dpshard generate: %s line %d: %s\n", file, lineno, err);
			dps_request_free(&reqs[n]);
			bad = 1;
			continue;
		}
		if (reqs[n].replica >= o->par.dp) {
			fprintf(stderr, "dpshard generate: %s line %d: \"replica\" %d, but "
					"--data-parallel-size is %d\n", file, lineno, reqs[n].replica,
				o->par.dp);
			dps_request_free(&reqs[n]);
			bad = 1;
			continue;
		}
		n++;
	}
	free(line);
	fclose(f);
	if (!bad && !n) {
		fprintf(stderr, "dpshard generate: %s holds no request\n", file);
		bad = 1;
	}
	/* The longest request sets the model length unless --max-model-len does. */
	for (int k = 0; k < n && !bad; k++) {
		const int need = reqs[k].n_prompt + reqs[k].p.max_tokens;

		if (!o->max_model_len && need > o->steps + 1)
			o->steps = need - 1;
	}
	if (!o->max_model_len && o->steps + 1 > cfg.max_position_embeddings)
		o->steps = cfg.max_position_embeddings - 1;
	params = calloc((size_t)(n ? n : 1), sizeof(*params));
	replica = calloc((size_t)(n ? n : 1), sizeof(int));
	lens = calloc((size_t)(n ? n : 1), sizeof(int));
	ids = calloc((size_t)(n ? n : 1), sizeof(int *));
	if (!bad && (!params || !replica || !lens || !ids))
		bad = 1;
	for (int k = 0; k < n && !bad; k++) {
		params[k] = reqs[k].p; /* the end ids among its stop ids, unless "ignore_eos" */
		replica[k] = reqs[k].replica;
		ids[k] = reqs[k].prompt;
		lens[k] = reqs[k].n_prompt;
	}
	if (!bad) {
		o->n_prompts = n;
		o->prompts = (const int *const *)ids;
		o->n_prompt = lens;
		o->params = params;
		o->replica = replica;
		o->jsonl = 1;
		o->end = tt.end;
		o->n_end = tt.n_end;
		o->tok = tt.tok;
		rc = dps_generate_ranks(o);
	}
	for (int k = 0; k < n; k++)
		dps_request_free(&reqs[k]);
	free(reqs);
	free(params);
	free(replica);
	free(lens);
	free(ids);
	dps_tool_text_close(&tt);
	return bad ? 2 : rc ? 1 : 0;
}

int dps_cmd_generate(int argc, char **argv)
{
	struct dps_sampling sp = { .temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0 };
	const char *model_dir = NULL;
	double temperature = 0.0, top_p = 1.0;
	int steps = 256, ids_out = 0, prompt_ids = 0, top_k = 0, seed = 0, npos, rc;
	struct dps_tool_text tt = { 0 };
	struct dps_tok_stream *stream = NULL;
	struct dps_model m;
	struct dps_rng rng;
	int *prompt = NULL, *scratch = NULL, n_prompt = 0, chat = 0;
	int *given = NULL;
	size_t n_given = 0;
	const char *blis_arch = "auto", *cpu_bind = "auto", *requests = NULL, *buckets = NULL;
	int dtype = 0; /* --dtype: 1 + the choice, 0 unset (auto) */
	int quant = 0; /* --quantization: 1 int8, 0 unset (the checkpoint's) */
	int bf16 = 0;  /* the weights are held as BF16 or INT8: only the sharded engine does */
	int threads = 0, reference = 0, verbose = 0, trace = 0, rank_timeout = 30;
	int block_size = 0, max_num_seqs = 0, max_model_len = 0, max_batched = 0, spec_k = 0;
	const char *spec_model = NULL;
	size_t kv_mem = 0;
	struct dps_par_cfg par = DPS_PAR_CFG_DEFAULT;
	uint64_t t0;
	char *pos[MAX_PROMPTS], err[512], defdir[4096];
	struct dps_flag flags[48];
	const struct dps_flag base[] = {
		{ "model", DPS_FLAG_STR, &model_dir, "DIR",
		  "checkpoint directory (config.json + *.safetensors); default: stories260K, "
		  "the small trained model that comes with dpshard" },
		{ "steps", DPS_FLAG_INT, &steps, "N",
		  "forward steps, counting the prompt's positions (as llama2.c's -n)", 1, 1 << 24, 'n' },
		{ "temperature", DPS_FLAG_DOUBLE, &temperature, "T",
		  "0 to 2; 0 = greedy (ties to the lowest id)" },
		{ "top-k", DPS_FLAG_INT, &top_k, "K",
		  "sample from the K most likely tokens (0 or -1 = all)" },
		{ "top-p", DPS_FLAG_DOUBLE, &top_p, "P", "sample from the smallest set of mass P" },
		{ "seed", DPS_FLAG_INT, &seed, "S", "seed of the sampler (same seed, same output)" },
		{ "ids", DPS_FLAG_BOOL, &ids_out, NULL, "print token ids instead of text" },
		{ "prompt-ids", DPS_FLAG_BOOL, &prompt_ids, NULL,
		  "the prompt is a list of token ids, used exactly as given (no BOS is added)" },
		{ "chat", DPS_FLAG_BOOL, &chat, NULL,
		  "the prompt is a user message, formatted by the model's chat template; only the "
		  "reply is printed" },
		dps_flag_dtype(&dtype),
		dps_flag_quantization(&quant),
		{ "blis-arch", DPS_FLAG_STR, &blis_arch, "A",
		  "auto (batch-invariant kernels) or BLIS: skx, zen3, haswell, generic or BIG:SMALL (skx:zen3); WARNING: BLIS is not batch-invariant (tokens may depend on the batch)" },
		{ "threads-per-rank", DPS_FLAG_INT, &threads, "N",
		  "threads of each rank, for BLIS and dpshard's kernels; 0: the CPUs the process may "
		  "run on (across ranks: the CPUs its placement gave it)", 0, 1024 },
		{ "reference", DPS_FLAG_BOOL, &reference, NULL,
		  "use the plain-C reference kernels instead of BLIS" },
		{ "verbose", DPS_FLAG_BOOL, &verbose, NULL,
		  "print the kernels chosen, the speed, and across ranks each rank's shard bytes "
		  "and collectives" },
		{ "cpu-bind", DPS_FLAG_STR, &cpu_bind, "SPEC",
		  "across ranks: where ranks run (auto, off, or lists; see dpshard groups --help)" },
		{ "trace-collectives", DPS_FLAG_BOOL, &trace, NULL,
		  "across ranks: print every collective of every rank on stderr" },
		{ "rank-timeout", DPS_FLAG_INT, &rank_timeout, "S",
		  "across ranks: a rank with requests that makes no progress for this long is hung "
		  "and the run fails, naming it (0: never)", 0, 86400 },
		{ "requests", DPS_FLAG_STR, &requests, "FILE",
		  "submit every request of FILE (JSON lines) and print one JSON result per request" },
		{ "block-size", DPS_FLAG_INT, &block_size, "N",
		  "positions per KV-cache block (0: 32)", 0, 1 << 16 },
		{ "kv-cache-memory", DPS_FLAG_SIZE, &kv_mem, "BYTES",
		  "KV cache per rank, e.g. 2G (0: half the free memory, shared by the ranks)" },
		{ "max-num-seqs", DPS_FLAG_INT, &max_num_seqs, "N",
		  "requests a replica runs at once (0: every request given, at most 256)", 0, 1 << 16 },
		{ "max-model-len", DPS_FLAG_INT, &max_model_len, "N",
		  "tokens per request, prompt included (0: -n + 1, within the model's context)", 0,
		  1 << 24 },
		{ "max-num-batched-tokens", DPS_FLAG_INT, &max_batched, "N",
		  "rows per step: longer prompts are prefilled in chunks (0: 512 or the longest "
		  "prompt)", 0, 1 << 20 },
		{ "decode-buckets", DPS_FLAG_STR, &buckets, "B,...",
		  "decode batch sizes, ascending, ending at --max-num-seqs (default: powers of two)" },
		{ "speculative-model", DPS_FLAG_STR, &spec_model, "DIR",
		  "speculative decoding with this Eagle3 draft (needs --num-speculative-tokens)" },
		{ "num-speculative-tokens", DPS_FLAG_INT, &spec_k, "K",
		  "tokens the draft proposes per step, verified in one target pass", 0, DPS_MAX_SPEC },
	};
	size_t nf = sizeof(base) / sizeof(base[0]);

	memcpy(flags, base, sizeof(base));
	dps_flags_parallel(&par, flags + nf);
	nf += DPS_PAR_FLAGS;
	flags[nf] = (struct dps_flag)DPS_FLAGS_END;
	rc = dps_flags_parse(flags, argc, argv, "generate",
			     "[--model DIR] [-n N] [OPTIONS] [PROMPT ...]", pos, MAX_PROMPTS, &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (!model_dir) {
		if (dps_default_model("generate", defdir, sizeof(defdir)))
			return 1;
		model_dir = defdir;
	}
	/* The request rules of engine/api/request.h. */
	if (!(temperature >= 0 && temperature <= 2) || !(top_p > 0 && top_p <= 1) || top_k < -1) {
		fprintf(stderr, "dpshard generate: need 0 <= --temperature <= 2, 0 < --top-p <= 1, "
				"--top-k >= -1\n");
		return 2;
	}
	if (top_k < 0)
		top_k = 0; /* -1 (vLLM's) and 0 both mean every token */
	if (chat && prompt_ids) {
		fprintf(stderr, "dpshard generate: --chat takes a text prompt, not --prompt-ids\n");
		return 2;
	}
	if (!spec_model != !spec_k) {
		fprintf(stderr, "dpshard generate: --speculative-model and --num-speculative-tokens "
				"go together\n");
		return 2;
	}
	if ((dtype == 1 + DPS_SHARD_DTYPE_BF16 || quant) && reference) {
		fprintf(stderr, "dpshard generate: --reference evaluates f32 weights; %s is not "
				"implemented there\n", quant ? "--quantization" : "--dtype bf16");
		return 2;
	}
	if (!reference && model_dir && (quant || dtype != 1 + DPS_SHARD_DTYPE_F32))
		bf16 = weights_narrow(model_dir, dtype == 1 + DPS_SHARD_DTYPE_BF16 || quant);
	if (bf16 || npos > 1 || requests || spec_model || par.tp * par.dp > 1 || par.attn_dp > 1 ||
	    par.prefill_dp ||
	    par.emb_dp > 1 ||
	    par.mlp_dp > 1 || par.lm_head_dp > 1 || par.draft_mlp_dp > 1 || par.ep || par.a2a ||
	    par.nodes > 1) {
		struct dps_gen_ranks_opts o = { .par = par, .model = model_dir, .cpu_bind = cpu_bind,
						.dtype = dtype ? (enum dps_shard_dtype)(dtype - 1)
							       : DPS_SHARD_DTYPE_AUTO,
						.quant = (enum dps_shard_quant)quant,
						.blis_arch = blis_arch, .threads = threads,
						.steps = steps, .ids_out = ids_out,
						.verbose = verbose, .trace = trace,
						.rank_timeout = rank_timeout,
						.block_size = block_size, .kv_cache_memory = kv_mem,
						.max_num_seqs = max_num_seqs,
						.max_model_len = max_model_len,
						.max_batched_tokens = max_batched,
						.decode_buckets = buckets,
						.spec_model = spec_model, .spec_k = spec_k };

		if (reference) {
			fprintf(stderr, "dpshard generate: --reference runs on one rank only, with one "
					"prompt\n");
			return 2;
		}
		o.sampling = (struct dps_sampling){ (float)temperature, top_k, (float)top_p,
						    (uint64_t)seed };
		if (requests && npos) {
			fprintf(stderr, "dpshard generate: give prompts or --requests, not both\n");
			return 2;
		}
		if (requests && (chat || prompt_ids)) {
			fprintf(stderr, "dpshard generate: --requests takes neither --chat nor "
					"--prompt-ids (each line says what its prompt is)\n");
			return 2;
		}
		return requests ? generate_requests(&o, requests) : generate_ranks(&o, pos, npos,
										      prompt_ids, chat);
	}
	if (!threads)
		threads = dps_cpus_allowed();
	if (!reference) {
		rc = dps_gemm_setup(blis_arch, threads, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "dpshard generate: %s\n", err);
			return 2;
		}
		if (verbose)
			fprintf(stderr, "dpshard generate: %s\n", dps_gemm_describe());
	}
	sp.temperature = (float)temperature;
	sp.top_k = top_k;
	sp.top_p = (float)top_p;
	dps_rng_seed(&rng, (uint64_t)seed);
	/* Size the KV cache for this run, not for the model's whole context; the prompt goes
	 * through in steps of up to PREFILL_ROWS rows, and only the last row's logits are used. */
	rc = dps_model_load(&m, model_dir,
			    &(struct dps_model_opts){ .max_pos = steps, .max_seqs = 1,
						      .max_rows = steps < PREFILL_ROWS ? steps
										: PREFILL_ROWS,
						      .max_out = 1 },
			    err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dpshard generate: %s\n", err);
		return 1;
	}
	if (steps > m.max_pos)
		steps = m.max_pos;
	if (dps_tool_text_open(&tt, "generate", model_dir, &m.cfg)) {
		dps_model_free(&m);
		return 1;
	}
	rc = prompt_of(&tt, &m.cfg, model_dir, npos ? pos[0] : "", npos > 0, prompt_ids, chat,
		       &given, &n_given);
	if (rc) {
		rc = -EINVAL;
		goto out;
	}
	if (n_given >= (size_t)steps) {
		fprintf(stderr, "dpshard generate: the prompt has %zu tokens; -n %d leaves no room to "
				"generate\n", n_given, steps);
		rc = -EINVAL;
		goto out;
	}
	prompt = calloc((size_t)steps + 1, sizeof(int));
	scratch = calloc((size_t)m.cfg.vocab_size, sizeof(int));
	if (!prompt || !scratch) {
		rc = -ENOMEM;
		goto out;
	}
	memcpy(prompt, given, n_given * sizeof(int));
	n_prompt = (int)n_given;
	/* Text is printed as it comes: the prompt after its first id, then the completion (with
	 * --chat, the completion alone). */
	if (tt.tok && !ids_out) {
		rc = dps_tok_stream_new(&stream, tt.tok, prompt, chat ? (size_t)n_prompt : 1,
					DPS_TOK_SKIP_SPECIAL);
		if (rc)
			goto out;
	}
	{
		int p, fed = 0;
		uint64_t t_prefill = 0;
		const char *piece_end;
		size_t l_end;
		const float *lg = NULL;

		t0 = dps_now_ns();
		for (p = 0; p < steps; p++) {
			int next;
			const char *piece;
			size_t l;

			if (p >= fed) {
				/* Feed the prompt's remaining positions (or the one new token) as one step. */
				int rows = p + 1 < n_prompt ? n_prompt - p : 1, idx[PREFILL_ROWS];
				unsigned char want[PREFILL_ROWS] = { 0 };
				const int seq[PREFILL_ROWS] = { 0 };

				if (rows > m.max_rows)
					rows = m.max_rows;
				if (rows > steps - p)
					rows = steps - p;
				for (int i = 0; i < rows; i++)
					idx[i] = p + i;
				want[rows - 1] = 1;
				lg = reference ? dps_model_step_ref(&m, rows, prompt + p, idx, seq, want)
					       : dps_model_step(&m, rows, prompt + p, idx, seq, want);
				fed = p + rows;
				if (fed >= n_prompt && !t_prefill)
					t_prefill = dps_now_ns() - t0;
			}
			next = p + 1 < n_prompt ? prompt[p + 1]
						: dps_sample((float *)lg, m.cfg.vocab_size, &sp, &rng, scratch);
			/* The model's end ids (BOS too for llama2.c's) end the story. */
			if (p + 1 >= n_prompt && dps_tool_text_is_end(&tt, next))
				break;
			if (!stream) {
				if (!chat || p + 1 >= n_prompt)
					printf("%s%d", p && (!chat || p + 1 > n_prompt) ? " " : "",
					       next);
			} else if (!chat || p + 1 >= n_prompt) {
				if (dps_tok_stream_step(stream, next, &piece, &l)) {
					rc = -ENOMEM;
					goto out;
				}
				fwrite(piece, 1, l, stdout);
			}
			fflush(stdout);
			if (p + 1 >= n_prompt)
				prompt[p + 1] = next; /* the next step feeds it */
		}
		if (stream && !dps_tok_stream_flush(stream, &piece_end, &l_end))
			fwrite(piece_end, 1, l_end, stdout);
		printf("\n");
		if (verbose) {
			const double total = (double)(dps_now_ns() - t0) / 1e9;
			const double pf = (double)t_prefill / 1e9;
			const int gen = p > n_prompt - 1 ? p - (n_prompt - 1) : 0;

			fprintf(stderr, "dpshard generate: prompt %d tokens in %.3f s (%.1f tokens/s); "
					"%d generated in %.3f s (%.1f tokens/s); %.1f MB of weights, "
					"%d thread(s)\n", n_prompt, pf, n_prompt / (pf > 0 ? pf : 1e-9),
				gen, total - pf, gen / (total - pf > 0 ? total - pf : 1e-9),
				(double)m.weight_bytes / 1e6, threads);
		}
	}
	rc = 0;
out:
	free(prompt);
	free(given);
	free(scratch);
	dps_tok_stream_free(stream);
	dps_tool_text_close(&tt);
	dps_model_free(&m);
	return rc ? 1 : 0;
}


/* SPDX-License-Identifier: MIT */
/*
 * tools/bench_sweep.c - `dpshard bench sweep`: `bench decode` over a list of configurations of
 * one TP x DP (every valid combination of the attention, embedding, MLP and LM-head sizes, or
 * the ones given), side by side, best first, with the memory each needs per rank.
 *
 * Each configuration runs as its own `dpshard bench decode --json` process (this binary), so
 * one configuration that fails (too little memory, a rule) is reported and the others go on;
 * the results are read back with jansson.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "common/dps.h"
#include "common/json.h"
#include "engine/runtime/groups.h"
#include "engine/model/model_config.h"
#include "engine/shard/shard.h"
#include "tools/cmd.h"
#include "tools/flags.h"
#include "tools/machine.h"
#include "tools/plot.h"

#define MAX_CFG 256

struct cfg_result {
	int sizes[4];                 /* attention, embedding, MLP, LM head */
	int ok;
	double tg, tg_sd, pp, weights, kv, step_ms, coll_ms;
	int nb;                       /* decode tokens/s at every batch size, for --plot */
	double bx[16], by[16];
	char err[200];
};

static int cmp_res(const void *a, const void *b)
{
	const struct cfg_result *x = a, *y = b;

	if (x->ok != y->ok)
		return y->ok - x->ok;
	return x->tg < y->tg ? 1 : x->tg > y->tg ? -1 : 0;
}

/* Runs `self bench decode ... --json` for one configuration and reads its result. */
static void run_cfg(const char *self, char **base, int nbase, struct cfg_result *r, int tp,
		    int dp, int last_batch)
{
	char *argv[64], sz[4][16], tps[16], dps[16];
	int p[2], n = 0, st;
	pid_t pid;
	FILE *f;
	json_t *j;
	json_error_t je;

	snprintf(tps, sizeof(tps), "%d", tp);
	snprintf(dps, sizeof(dps), "%d", dp);
	argv[n++] = (char *)self;
	argv[n++] = "bench";
	argv[n++] = "decode";
	for (int i = 0; i < nbase && n < 44; i++)
		argv[n++] = base[i];
	argv[n++] = "--tensor-parallel-size";
	argv[n++] = tps;
	argv[n++] = "--data-parallel-size";
	argv[n++] = dps;
	{
		static const char *const fl[4] = { "--attention-dp-size", "--embedding-dp-size",
						   "--mlp-dp-size", "--lm-head-dp-size" };

		for (int k = 0; k < 4; k++) {
			snprintf(sz[k], sizeof(sz[k]), "%d", r->sizes[k]);
			argv[n++] = (char *)fl[k];
			argv[n++] = sz[k];
		}
	}
	argv[n++] = "--json";
	argv[n] = NULL;
	if (pipe(p)) {
		snprintf(r->err, sizeof(r->err), "pipe: %s", strerror(errno));
		return;
	}
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		dup2(p[1], STDOUT_FILENO);
		close(p[0]);
		close(p[1]);
		execv(self, argv);
		_exit(127);
	}
	close(p[1]);
	if (pid < 0) {
		close(p[0]);
		snprintf(r->err, sizeof(r->err), "fork: %s", strerror(errno));
		return;
	}
	f = fdopen(p[0], "r");
	j = f ? json_loadf(f, 0, &je) : NULL;
	if (f)
		fclose(f);
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) || !j) {
		snprintf(r->err, sizeof(r->err), "bench decode failed (exit %d)",
			 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
		json_decref(j);
		return;
	}
	r->weights = json_number_value(json_object_get(j, "weight_bytes_per_rank"));
	r->kv = json_number_value(json_object_get(j, "kv_bytes_per_rank"));
	{
		json_t *res = json_object_get(j, "results"), *x;
		size_t i;

		json_array_foreach(res, i, x) {
			const char *t = json_string_value(json_object_get(x, "test"));

			if (t && !strncmp(t, "pp", 2))
				r->pp = json_number_value(json_object_get(x, "tokens_per_s"));
			if (t && !strncmp(t, "tg", 2) && r->nb < 16) {
				r->bx[r->nb] = (double)json_integer_value(json_object_get(x, "batch"));
				r->by[r->nb++] = json_number_value(json_object_get(x, "tokens_per_s"));
			}
			if (t && !strncmp(t, "tg", 2) &&
			    json_integer_value(json_object_get(x, "batch")) == last_batch) {
				r->tg = json_number_value(json_object_get(x, "tokens_per_s"));
				r->tg_sd = json_number_value(json_object_get(x, "sd"));
				r->step_ms = json_number_value(json_object_get(x, "step_ms"));
				r->coll_ms = json_number_value(json_object_get(x, "collective_ms"));
			}
		}
	}
	r->ok = r->tg > 0;
	if (!r->ok)
		snprintf(r->err, sizeof(r->err), "no decode result");
	json_decref(j);
}

int dps_bench_sweep(int argc, char **argv)
{
	const char *model = NULL, *preset = "bench-110m", *configs = NULL, *prompts = "128";
	const char *gens = "32", *batches = "1,8", *plot = NULL;
	char *model_buf = NULL;
	int tp = 1, dp = 2, reps = 2, json = 0, csv = 0, npos, rc, n = 0, last_batch = 1;
	char *pos[1], self[4096], *base[16];
	struct cfg_result *res = calloc(MAX_CFG, sizeof(*res));
	struct dps_machine mach;
	int nb = 0;
	const struct dps_flag flags[] = {
		{ "model", DPS_FLAG_STR, &model, "DIR", "checkpoint directory (default: --preset)" },
		{ "preset", DPS_FLAG_STR, &preset, "NAME", "mkmodel preset, written to the cache" },
		{ "tensor-parallel-size", DPS_FLAG_INT, &tp, "N", "TP of every configuration", 1,
		  DPS_MAX_WORLD },
		{ "data-parallel-size", DPS_FLAG_INT, &dp, "N", "DP of every configuration", 1,
		  DPS_MAX_WORLD },
		{ "configs", DPS_FLAG_STR, &configs, "A,E,M,L;...",
		  "the component sizes to run (attention, embedding, MLP, LM head); default: every "
		  "valid combination" },
		{ "n-prompt", DPS_FLAG_STR, &prompts, "P", "the prefill test", 0, 0, 'p' },
		{ "n-gen", DPS_FLAG_STR, &gens, "N", "the decode test: tokens per sequence", 0, 0, 'n' },
		{ "batch", DPS_FLAG_STR, &batches, "B,...",
		  "decode batch sizes; the configurations are ranked by the last", 0, 0, 'b' },
		{ "repetitions", DPS_FLAG_INT, &reps, "R", "runs of each test", 1, 100, 'r' },
		{ "json", DPS_FLAG_BOOL, &json, NULL, "print the results as JSON" },
		{ "csv", DPS_FLAG_BOOL, &csv, NULL, "print the results as CSV (a header line first)" },
		{ "plot", DPS_FLAG_STR, &plot, "FILE.svg",
		  "draw decode tokens/s against the batch size per configuration (needs gnuplot)" },
		DPS_FLAGS_END,
	};

	if (!res)
		return 1;
	rc = dps_flags_parse(flags, argc, argv, "bench sweep", "[--model DIR | --preset NAME] "
			     "[--tensor-parallel-size T] [--data-parallel-size D] [OPTIONS]", pos, 0,
			     &npos);
	if (rc) {
		free(res);
		return rc > 0 ? 0 : 2;
	}
	{
		const char *c = strrchr(batches, ',');

		last_batch = atoi(c ? c + 1 : batches);
	}
	if (configs) {
		const char *c = configs;

		while (*c && n < MAX_CFG) {
			int a, e, m, l, used;

			if (sscanf(c, "%d,%d,%d,%d%n", &a, &e, &m, &l, &used) != 4) {
				fprintf(stderr, "dpshard bench sweep: --configs wants A,E,M,L;... (got "
						"'%s')\n", c);
				free(res);
				return 2;
			}
			res[n++] = (struct cfg_result){ { a, e, m, l } };
			c += used;
			if (*c == ';')
				c++;
		}
	} else {
		/* Every divisor of DP for each size; the model's rules are checked below. */
		for (int a = 1; a <= dp; a++)
			for (int e = 1; e <= dp; e++)
				for (int m = 1; m <= dp; m++)
					for (int l = 1; l <= dp && n < MAX_CFG; l++)
						if (!(dp % a) && !(dp % e) && !(dp % m) && !(dp % l))
							res[n++] = (struct cfg_result){ { a, e, m, l } };
	}
	/* Refuse what the model refuses before running anything. */
	{
		struct dps_model_config cfg;
		char err[512], dir[4096];
		int keep = 0;

		if (!model) {
			if (dps_cached_preset(preset, "bench sweep", dir, sizeof(dir))) {
				free(res);
				return 1;
			}
			model = model_buf = strdup(dir);
			if (!model) {
				free(res);
				return 1;
			}
		}
		if (dps_model_config_load(model, &cfg, err, sizeof(err))) {
			fprintf(stderr, "dpshard bench sweep: %s\n", err);
			free(res);
			free(model_buf);
			return 1;
		}
		for (int i = 0; i < n; i++) {
			struct dps_par_cfg par = { tp, dp, res[i].sizes[0], res[i].sizes[1],
						   res[i].sizes[2], 1, res[i].sizes[3], 0, 0 };

			if (dps_par_cfg_check(&par, err, sizeof(err)) ||
			    dps_shard_check(&cfg, &par, err, sizeof(err))) {
				fprintf(stderr, "dpshard bench sweep: skipping %d,%d,%d,%d: %s\n",
					res[i].sizes[0], res[i].sizes[1], res[i].sizes[2], res[i].sizes[3],
					err);
				continue;
			}
			res[keep++] = res[i];
		}
		n = keep;
	}
	if (!n) {
		fprintf(stderr, "dpshard bench sweep: no configuration to run\n");
		free(res);
		free(model_buf);
		return 2;
	}
	{
		const ssize_t l = readlink("/proc/self/exe", self, sizeof(self) - 1);

		if (l <= 0) {
			fprintf(stderr, "dpshard bench sweep: cannot find this program\n");
			free(res);
			free(model_buf);
			return 1;
		}
		self[l] = '\0';
	}
	base[nb++] = "--model";
	base[nb++] = (char *)model;
	base[nb++] = "-p";
	base[nb++] = (char *)prompts;
	base[nb++] = "-n";
	base[nb++] = (char *)gens;
	base[nb++] = "-b";
	base[nb++] = (char *)batches;
	{
		static char r[16];

		snprintf(r, sizeof(r), "%d", reps);
		base[nb++] = "-r";
		base[nb++] = r;
	}
	{
		const uint64_t t0 = dps_now_ns();

		for (int i = 0; i < n; i++) {
			const double el = (double)(dps_now_ns() - t0) / 1e9;

			fprintf(stderr, "dpshard bench sweep: configuration %d of %d (attention %d, "
					"embedding %d, MLP %d, LM head %d)%s", i + 1, n, res[i].sizes[0],
				res[i].sizes[1], res[i].sizes[2], res[i].sizes[3], i ? "" : "\n");
			if (i)
				fprintf(stderr, ", about %.0f s left\n", el / i * (n - i));
			run_cfg(self, base, nb, &res[i], tp, dp, last_batch);
			if (!res[i].ok)
				fprintf(stderr, "dpshard bench sweep: %s\n", res[i].err);
		}
	}
	qsort(res, (size_t)n, sizeof(*res), cmp_res);
	dps_machine_get(&mach);
	if (csv) {
		printf("rank,tensor_parallel_size,data_parallel_size,attention_dp_size,"
		       "embedding_dp_size,mlp_dp_size,lm_head_dp_size,ok,decode_tokens_per_s,sd,"
		       "prefill_tokens_per_s,step_ms,collective_ms,weight_bytes_per_rank,"
		       "kv_bytes_per_rank,version,git_commit,cpu,cpus,numa_nodes,blis\n");
		for (int i = 0; i < n; i++) {
			const struct cfg_result *r = &res[i];

			printf("%d,%d,%d,%d,%d,%d,%d,%s,%.3f,%.3f,%.3f,%.4f,%.4f,%.0f,%.0f,%s,%s,\"%s\",%d,"
			       "%d,\"%s\"\n", r->ok ? i + 1 : 0, tp, dp, r->sizes[0], r->sizes[1],
			       r->sizes[2], r->sizes[3], r->ok ? "true" : "false", r->tg, r->tg_sd, r->pp,
			       r->step_ms, r->coll_ms, r->weights, r->kv, PACKAGE_VERSION, dps_git_commit,
			       mach.cpu, mach.cpus, mach.nodes, mach.blis);
		}
	} else if (json) {
		printf("{");
		dps_machine_json(stdout, &mach);
		printf(", \"tensor_parallel_size\": %d, \"data_parallel_size\": %d, \"model\": ", tp,
		       dp);
		putchar('"');
		dps_json_escape(stdout, model, strlen(model));
		printf("\", \"ranked_by\": \"tg%s b%d\", \"results\": [\n", gens, last_batch);
		for (int i = 0; i < n; i++) {
			const struct cfg_result *r = &res[i];

			printf("  {\"attention_dp_size\": %d, \"embedding_dp_size\": %d, \"mlp_dp_size\": %d, "
			       "\"lm_head_dp_size\": %d, \"ok\": %s, \"decode_tokens_per_s\": %.2f, "
			       "\"sd\": %.2f, \"prefill_tokens_per_s\": %.2f, \"step_ms\": %.3f, "
			       "\"collective_ms\": %.3f, \"weight_bytes_per_rank\": %.0f, "
			       "\"kv_bytes_per_rank\": %.0f}%s\n", r->sizes[0], r->sizes[1], r->sizes[2],
			       r->sizes[3], r->ok ? "true" : "false", r->tg, r->tg_sd, r->pp, r->step_ms,
			       r->coll_ms, r->weights, r->kv, i + 1 < n ? "," : "");
		}
		printf(" ]}\n");
	} else {
		dps_machine_line(stdout, &mach);
		printf("TP=%d DP=%d, ranked by tg%s at batch %d per replica (tokens/s of every "
		       "replica)\n\n", tp, dp, gens, last_batch);
		printf("| rank | attn | emb | mlp | lm | %18s | %9s | %9s | %10s | %12s | %10s |\n",
		       "decode t/s", "step ms", "coll ms", "pp t/s", "weights/rank", "KV/rank");
		printf("|------|------|-----|-----|----|--------------------|-----------|-----------|"
		       "------------|--------------|------------|\n");
		for (int i = 0; i < n; i++) {
			const struct cfg_result *r = &res[i];

			if (!r->ok) {
				printf("| %4s | %4d | %3d | %3d | %2d | %-82.82s |\n", "-", r->sizes[0],
				       r->sizes[1], r->sizes[2], r->sizes[3], r->err);
				continue;
			}
			printf("| %4d | %4d | %3d | %3d | %2d | %8.1f ± %7.1f | %9.3f | %9.3f | %10.1f | "
			       "%9.1f MB | %7.1f MB |\n", i + 1, r->sizes[0], r->sizes[1], r->sizes[2],
			       r->sizes[3], r->tg, r->tg_sd, r->step_ms, r->coll_ms, r->pp,
			       r->weights / 1e6, r->kv / 1e6);
		}
	}
	rc = 0;
	for (int i = 0; i < n; i++)
		rc |= !res[i].ok;
	if (plot) {
		struct dps_series *sr = calloc((size_t)n, sizeof(*sr));
		int ns = 0;
		char title[128];

		for (int i = 0; sr && i < n; i++) {
			if (!res[i].ok)
				continue;
			snprintf(sr[ns].name, sizeof(sr[ns].name), "attn %d emb %d mlp %d lm %d",
				 res[i].sizes[0], res[i].sizes[1], res[i].sizes[2], res[i].sizes[3]);
			sr[ns].n = res[i].nb;
			memcpy(sr[ns].x, res[i].bx, sizeof(double) * (size_t)res[i].nb);
			memcpy(sr[ns].y, res[i].by, sizeof(double) * (size_t)res[i].nb);
			ns++;
		}
		snprintf(title, sizeof(title), "dpshard bench sweep: TP=%d DP=%d, tg%s", tp, dp, gens);
		if (!sr || dps_plot_svg(plot, title, "sequences per step, per replica",
					"decode tokens/s (every replica)", sr, ns, 1))
			rc = 1;
		free(sr);
	}
	free(res);
	free(model_buf);
	return rc;
}

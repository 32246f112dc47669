/* SPDX-License-Identifier: MIT */
/* tools/bench_decode_table.c - bench decode's human-readable output: the machine and layout,
 * a table of llama-bench's columns beside dpshard's (step time, collectives, the limit each
 * test meets), and the rates at which the decode products and MoE experts read their bytes;
 * and each result as JSON for --json. */
#include <stdio.h>
#include <string.h>

#include "engine/model/mkmodel.h"
#include "kernels/gemm.h"
#include "tools/bench_decode.h"

/*
 * One line under the table: what a decode test's products (what: "products" or "experts") read
 * while they run, a rank's mean, against the measured bandwidth on one rank.
 */
static void read_rate(const struct bench_table *t, const struct result *r, const char *what,
		      const char *verb, const char *whose, double gbs)
{
	if (r->prompt || gbs <= 0)
		return;
	printf("%s, %s b%d: %s %.1f GB/s on a rank while they run", what, r->test, r->batch, verb,
	       gbs);
	if (t->bw <= 0)
		printf("\n");
	else if (t->world == 1)
		printf(" = %.0f%% of the measured read bandwidth\n", 100 * gbs * 1e9 / t->bw);
	else
		printf(" (every rank's%s bytes over their time; the measured %.1f GB/s is every "
		       "rank's together)\n", whose, t->bw / 1e9);
}

void dps_bench_decode_table(const struct bench_table *t)
{
	const char *base_name = strrchr(t->model_dir, '/');
	char name[64], size_s[32], params_s[32];

	snprintf(name, sizeof(name), "%s", base_name && base_name[1] ? base_name + 1 : t->model_dir);
	dps_machine_line(stdout, t->mach);
	printf("%s, %d rank(s) x %d thread(s)\n%s\n", t->lname, t->world, t->threads, t->mach->blis);
	printf("measured in this run: memory read %.1f GB/s (%d threads; %.1f before the runs, %.1f "
	       "after), sgemm %.0f GFLOP/s (1536^3, %d thread(s))\n", t->bw / 1e9, t->bw_threads,
	       t->bw0 / 1e9, t->bw1 / 1e9, t->peak, t->threads);
	if (t->bw0 > 0 && t->bw1 > 0 && (t->bw0 > 1.2 * t->bw1 || t->bw1 > 1.2 * t->bw0))
		printf("warning: the memory read %.0f%% faster at one end of the run than at the other; "
		       "the fractions below are of the faster, and the runs may have met either\n",
		       100 * ((t->bw0 > t->bw1 ? t->bw0 / t->bw1 : t->bw1 / t->bw0) - 1));
	printf("per rank (rank 0): %.1f MB of weights (%s), %.1f MB of KV cache\n", t->rank0_bytes
	       / 1e6, dps_wtype_name((enum dps_wtype)t->rank0_wt), t->rank0_kv / 1e6);
	if (t->load_given) {
		printf("decode load per replica (percent of the batch):");
		for (int d = 0; d < t->dp; d++)
			printf(" %d", t->load[d]);
		printf("\n");
	}
	/* llama-bench's first columns: model, size (every weight once, in the linear
	 * weights' type; MXFP4 experts at 17 bytes per 32), params. */
	{
		const double params = (double)dps_model_config_params(t->cfg);
		const double per = (double)dps_wtype_bytes((enum dps_wtype)t->rank0_wt, 1, 32) / 32;
		double expert = 0, bytes;

		if (t->cfg->mxfp4)
			for (int l = 0; l < t->cfg->num_hidden_layers; l++)
				if (dps_cfg_layer_moe(t->cfg, l))
					expert += 3.0 * t->cfg->num_local_experts *
						  t->cfg->intermediate_size * t->cfg->hidden_size;
		bytes = (params - expert) * per + expert * 17 / 32;

		if (bytes >= 1024.0 * 1024.0 * 1024.0)
			snprintf(size_s, sizeof(size_s), "%.2f GiB", bytes / (1 << 30));
		else
			snprintf(size_s, sizeof(size_s), "%.2f MiB", bytes / (1 << 20));
		snprintf(params_s, sizeof(params_s), params >= 1e9 ? "%.2f B" : "%.2f M",
			 params >= 1e9 ? params / 1e9 : params / 1e6);
	}
	printf("\n| %-16s | %9s | %8s | %-22s | %5s | %-9s | %16s | %9s | %9s | %-15s | %9s "
	       "| %-34s |\n", "model", "size", "params", "layout", "ranks", "test", "t/s",
	       "step ms", "coll ms", "AR/AG/RS/A2A", "disp KB", "limit");
	printf("|------------------|-----------|----------|------------------------|-------|"
	       "-----------|------------------|-----------|-----------|-----------------|"
	       "-----------|------------------------------------|\n");
	for (int i = 0; i < t->nres; i++) {
		const struct result *r = &t->res[i];
		char test[48], lim[64], calls[32] = "", disp[24] = "";

		if (r->prompt) {
			snprintf(test, sizeof(test), "%.31s", r->test);
			snprintf(lim, sizeof(lim), "products %.0f GFLOP/s = %.0f%% sgemm", r->gbs,
				 100 * r->bound);
		} else {
			snprintf(test, sizeof(test), "%.31s b%d", r->test, r->batch);
			snprintf(lim, sizeof(lim), "read %.1f GB/s = %.0f%% of bound", r->gbs,
				 100 * r->bound);
			snprintf(calls, sizeof(calls), "%.1f/%.1f/%.1f/%.1f",
				 r->calls_per_layer[DPS_COLL_ALLREDUCE],
				 r->calls_per_layer[DPS_COLL_ALLGATHER],
				 r->calls_per_layer[DPS_COLL_REDUCESCATTER],
				 r->calls_per_layer[DPS_COLL_ALLTOALL]);
			if (t->cfg->num_local_experts)
				snprintf(disp, sizeof(disp), "%.1f", r->dispatch_bytes / 1e3);
			if (t->load_given)
				snprintf(test, sizeof(test), "%.31s b%d:%d", r->test, r->batch,
					 r->real);
		}
		printf("| %-16.16s | %9s | %8s | %-22.22s | %5d | %-9s | %7.1f ± %6.1f | %9.3f "
		       "| %9.3f | %-15s | %9s | %-34s |\n", name, size_s, params_s, t->lname, t->world,
		       test, r->mean, r->sd, r->step_ms, r->coll_ms, calls, disp, lim);
	}
	printf("\nAR/AG/RS/A2A: all-reduces, all-gathers, reduce-scatters and all-to-alls per "
	       "layer of a decode step on rank 0; disp KB: what the expert dispatch moves per step, every rank "
	       "together%s\n", t->load_given ? "; bB:S: batch B per replica, S sequences in all" : "");
	for (int i = 0; i < t->nres; i++)
		read_rate(t, &t->res[i], "products", "they read W at", "", t->res[i].product_gbs);
	for (int i = 0; i < t->nres; i++)
		read_rate(t, &t->res[i], "experts", "their products read", " expert",
			  t->res[i].expert_gbs);
	for (int i = 0; i < t->nres; i++)
		if (!t->res[i].prompt && t->res[i].expert_busy >= 0)
			printf("experts, %s b%d: run as whole-expert tasks, the pool's threads ran "
			       "experts %.0f%% of those tasks' time (the rest: starting, and waiting at "
			       "the join for the last expert)\n",
			       t->res[i].test, t->res[i].batch, 100 * t->res[i].expert_busy);
}

/* One result as a JSON object of --json's "results", with a comma after it unless last. */
void dps_bench_decode_json_result(const struct result *r, int last)
{
	char busy[32] = "null"; /* (no whole-expert tasks ran) */

	if (r->expert_busy >= 0)
		snprintf(busy, sizeof(busy), "%.3f", r->expert_busy);
	if (r->prompt)
		printf("  {\"test\": \"%s\", \"batch\": 1, \"tokens_per_s\": %.2f, "
		       "\"sd\": %.2f, \"step_ms\": %.3f, \"collective_ms\": %.3f, \"compute_ms\""
		       ": %.3f, \"gemm_gflops\": %.1f, \"of_sgemm\": %.3f}%s\n", r->test, r->mean,
		       r->sd, r->step_ms, r->coll_ms, r->step_ms - r->coll_ms, r->gbs, r->bound,
		       last ? "" : ",");
	else
		printf("  {\"test\": \"%s\", \"batch\": %d, \"tokens_per_s\": %.2f, "
		       "\"sd\": %.2f, \"step_ms\": %.3f, \"collective_ms\": %.3f, \"compute_ms\""
		       ": %.3f, \"allreduce_per_layer\": %.2f, \"allgather_per_layer\": %.2f, "
		       "\"alltoall_per_layer\": %.2f, \"reducescatter_per_layer\": %.2f, "
		       "\"bytes_per_step\": %.0f, \"expert_bytes_per_step\": %.0f, "
		       "\"dispatch_bytes_per_step\": %.0f, \"sequences\": %d, "
		       "\"read_gbs\": %.2f, \"of_bandwidth_bound\": %.3f, "
		       "\"expert_read_gbs\": %.2f, \"expert_threads_busy\": %s, "
		       "\"product_read_gbs\": %.2f, "
		       "\"product_bytes_per_step\": %.0f}%s\n", r->test,
		       r->batch, r->mean, r->sd, r->step_ms, r->coll_ms,
		       r->step_ms - r->coll_ms, r->calls_per_layer[DPS_COLL_ALLREDUCE],
		       r->calls_per_layer[DPS_COLL_ALLGATHER],
		       r->calls_per_layer[DPS_COLL_ALLTOALL],
		       r->calls_per_layer[DPS_COLL_REDUCESCATTER], r->bytes_per_step,
		       r->expert_bytes, r->dispatch_bytes, r->real, r->gbs,
		       r->bound, r->expert_gbs, busy, r->product_gbs,
		       r->product_bytes,
		       last ? "" : ",");
}

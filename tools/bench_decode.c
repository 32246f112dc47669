/* SPDX-License-Identifier: MIT */
/*
 * tools/bench_decode.c - `dpshard bench decode`: prefill (ppP) and decode (tgN at batch B)
 * throughput of one TP x DP layout on real rank processes, llama-bench style (tokens/s, mean
 * and sd over repetitions), each beside this machine's limits measured in the same run:
 *
 * - decode reads every weight of the decode layouts once per step on every rank, plus each
 *   row's KV cache: those bytes over the memory read bandwidth (measured with as many threads
 *   as the ranks use) give the bandwidth-bound step time, and the result shows the fraction of
 *   that bound reached;
 * - prefill is matrix products: rank 0's GFLOP/s in them (timed inside the step) beside the
 *   sgemm rate of a large square product with the same kernels and threads per rank.
 *
 * Per layout it also reports the step time split into compute and collectives, the
 * collectives per layer of a decode step, and the weight and KV bytes per rank. Every replica
 * runs the same tests at once (pp: one prompt each; tg: B sequences each; tokens/s count all
 * replicas); the limits are measured after the ranks have exited, and the read bandwidth also
 * before they start (read_bw_before): the larger of the two is the bound, and a warning says
 * when they differ by more than a fifth (some machines' memory changes speed minute to minute,
 * and the fractions then say more of that than of the engine).
 *
 * --load gives each replica its share of the B sequences of a decode test (unbalanced
 * loads): coupled replicas (component sizes above 1, expert parallelism) still step at B rows,
 * padded, and a replica with none runs dummy batches, as the engine does; uncoupled replicas
 * run only their own rows. MoE: the expert weights read are counted as used (the experts a
 * batch's rows chose), and the bytes the dispatch moves per step, summed over the ranks.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "common/json.h"
#include "engine/model/mkmodel.h"
#include "engine/serve/lockstep.h"
#include "engine/serve/sched.h"
#include "engine/shard/kv.h"
#include "engine/shard/shard.h"
#include "engine/runtime/supervisor.h"
#include "kernels/gemm.h"
#include "kernels/limits.h"
#include "kernels/kernels.h"
#include "kernels/pool.h"
#include "tools/bench_decode.h"
#include "tools/bench_spec.h"
#include "tools/cmd.h"
#include "tools/flags.h"
#include "tools/machine.h"
#include "tools/plot.h"

#define MAX_LIST 16


/* A comma list of integers in [lo, hi]: its count, or -1 (also for an empty list). */
static int parse_list(const char *s, int *out, int lo, int hi)
{
	const int n = dps_flags_int_list(s, out, MAX_LIST, lo, hi);

	return n > 0 ? n : -1;
}

static void stats(const double *v, int n, double *mean, double *sd)
{
	double s = 0, q = 0;

	for (int i = 0; i < n; i++)
		s += v[i];
	*mean = s / n;
	for (int i = 0; i < n; i++)
		q += (v[i] - *mean) * (v[i] - *mean);
	*sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

/* ---- the ranks ------------------------------------------------------------------------- */

enum { MSG_RESULT = 1, MSG_BYTES = 2, MSG_MOE = 3 };

struct bmsg {
	int32_t type, rank, test, p, b, g, rep, gi, bi, wt; /* wt: MSG_BYTES, the weights' type */
	double moe_bytes, ep_bytes; /* MSG_MOE: this rank's, over the G steps of one run */
	double exp_bytes, exp_secs; /* MSG_MOE: of which the expert products, and their time */
	double exp_thr_s, exp_run_s; /* MSG_MOE: whole-expert tasks: threads x time, time running */
	double prod_bytes, prod_secs; /* MSG_MOE: the products' W bytes and time (every model) */
	double secs, coll_s, lin_s, lin_flops, steps;
	double decode_bytes, all_bytes, kv_bytes;
	double calls_per_layer[DPS_COLL_KINDS];
};

struct bench {
	const char *model, *blis_arch;
	enum dps_shard_dtype dtype; enum dps_shard_quant quant; int rank0_wt; /* rank 0's wtype */
	int threads, reps, np, ng, nb;
	const int *prompts, *gens, *batches;
	int max_p, max_g, max_b;
	int load[DPS_MAX_WORLD];   /* per replica: percent of the batch (100: all) */
	double moe_sum[MAX_LIST][MAX_LIST], ep_sum[MAX_LIST][MAX_LIST]; /* [gi][bi], all ranks */
	double exp_bytes[MAX_LIST][MAX_LIST], exp_secs[MAX_LIST][MAX_LIST];
	double exp_thr[MAX_LIST][MAX_LIST], exp_run[MAX_LIST][MAX_LIST];
	double prod_bytes[MAX_LIST][MAX_LIST], prod_secs[MAX_LIST][MAX_LIST];
	/* collected by the supervisor */
	struct bmsg *rows;
	int nrows, cap;
	double decode_bytes, all_bytes, kv_bytes, rank0_bytes, rank0_kv;
	double rep_decode_bytes[DPS_MAX_WORLD]; /* per replica: decode weights of its ranks */
	uint64_t t0;               /* when the ranks started */
	int tp;
	struct dps_model_config cfg;
	int failed;
};

static uint64_t coll_ns(struct dps_world *w)
{
	uint64_t ns = 0;

	for (int i = 0; i < w->lay->n_comms; i++)
		if (w->comms[i].n > 1 && (w->comms[i].post || w->comms[i].x))
			for (int k = 0; k < DPS_COLL_KINDS; k++)
				ns += w->comms[i].stats.ns[k];
	return ns;
}

static int barrier(struct dps_world *w)
{
	return w->world > 1 ? dps_coll_barrier(w->world_c) : 0;
}

/* Replica d's real sequences of a batch of B under load percentages (at least 1 when above 0). */
static int real_rows(const struct bench *b, int d, int B)
{
	const int r = B * b->load[d] / 100;

	return b->load[d] == 0 ? 0 : r < 1 ? 1 : r;
}

static uint64_t dispatch_bytes(const struct dps_shard *s)
{
	uint64_t n = 0;

	for (int k = 0; k < DPS_COLL_KINDS; k++)
		n += s->stats.bytes[k][DPS_SG_EP];
	return n;
}

/*
 * A decode step of the test's rows as the serving engine builds them: rows [0, real) decode
 * sequences 0..real-1 at pos[i], rows [real, n) are the padding rows coupled replicas add
 * (dps_lockstep_pad_rows, with the all-zero table zero). Returns the logits of every row.
 */
static const float *decode_step(struct dps_shard *s, int n, int real, int *tok, int *pos,
				int *slot, int *tix, unsigned char *want, const int **table,
				const int *zero, int *rc)
{
	for (int i = 0; i < real; i++) {
		tix[i] = i;
		slot[i] = dps_kv_slot(s->seq_tables + (size_t)i * (size_t)s->bps, s->block_size,
				      pos[i]);
		want[i] = 1;
	}
	dps_lockstep_pad_rows(tok, pos, slot, tix, want, -1, real, n);
	for (int i = 0; i < n; i++)
		table[i] = tix[i] >= 0 ? s->seq_tables + (size_t)tix[i] * (size_t)s->bps : zero;
	/* want is the padding's business only: every row's logits come back (NULL). */
	return dps_shard_step_rows(s, 0, &(struct dps_rows){ n, tok, pos, slot, table, NULL }, rc);
}

static int rank_main(struct dps_world *w, void *arg)
{
	struct bench *b = arg;
	const int R = b->max_p > b->max_b ? b->max_p : b->max_b;
	int *tok = calloc((size_t)R, sizeof(int)), *pos = calloc((size_t)R, sizeof(int));
	int *seq = calloc((size_t)R, sizeof(int)), *slot = calloc((size_t)R, sizeof(int));
	int *tix = calloc((size_t)R, sizeof(int));
	const int **table = calloc((size_t)R, sizeof(*table));
	unsigned char *want = calloc((size_t)R, 1);
	int *zero = NULL;
	struct dps_shard s;
	struct bmsg m = { 0 };
	char err[512];
	int rc;

	if (!tok || !pos || !seq || !slot || !tix || !table || !want) {
		rc = -ENOMEM;
		goto out0;
	}
	rc = dps_gemm_setup(b->blis_arch, b->threads ? b->threads : (int)w->ncpus, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "rank %d: %s\n", w->rank, err);
		goto out0;
	}
	rc = dps_shard_load(&s, w, &w->lay->groups.cfg, b->model,
			    &(struct dps_shard_opts){ .max_pos = b->max_p > b->max_g + 1 ? b->max_p
											 : b->max_g + 1,
						      .max_seqs = b->max_b, .max_rows = R, .dtype = b->dtype, .quant = b->quant },
			    err, sizeof(err));
	if (rc) {
		fprintf(stderr, "rank %d: %s\n", w->rank, err);
		goto out0;
	}
	zero = calloc((size_t)s.bps, sizeof(int)); /* the padding rows' block table */
	if (!zero) {
		rc = -ENOMEM;
		goto out;
	}
	if (s.max_pos < (b->max_p > b->max_g + 1 ? b->max_p : b->max_g + 1)) {
		if (w->rank == 0)
			fprintf(stderr, "dpshard bench decode: the model's context is %d positions; -p "
					"and -n + 1 must fit in it\n", s.max_pos);
		rc = -EINVAL;
		goto out;
	}
	for (int i = 0; i < w->lay->n_comms; i++)
		w->comms[i].timing = 1;
	m.type = MSG_BYTES;
	m.rank = w->rank;
	for (int p = 0; p < DPS_PART_COUNT; p++)
		m.all_bytes += (double)s.bytes[p];
	m.decode_bytes = (double)(s.bytes[s.c[DPS_COMP_ATTN] > 1 ? DPS_PART_ATTN_DECODE
								 : DPS_PART_ATTN_PREFILL] +
				  s.bytes[DPS_PART_MLP] + s.bytes[DPS_PART_NORMS] +
				  s.bytes[s.c[DPS_COMP_LM_HEAD] > 1 ? DPS_PART_LM_DECODE
								    : DPS_PART_LM_PREFILL]);
	m.kv_bytes = (double)s.cache_bytes, m.wt = (int32_t)s.wt;
	rc = dps_ring_push(&w->to_sup, &m, sizeof(m), 0);
	m.type = MSG_RESULT;
	/* Loaded: from here every rank steps or waits until the end, so the supervisor may call a
	 * rank whose heartbeat stops hung (docs/DESIGN.md section 1). */
	dps_world_set_busy(w, 1);
	/* Warm-up, untimed (as llama-bench): the first touch of the scratch and the cache. */
	for (int i = 0; i < R; i++) {
		tok[i] = (i * 131 + 7) % s.cfg.vocab_size;
		pos[i] = i % s.max_pos;
		seq[i] = i / s.max_pos < b->max_b ? i / s.max_pos : -1;
		want[i] = 0;
	}
	want[R - 1] = 1;
	if (!rc && !dps_shard_step(&s, 1, R, tok, pos, seq, want, &rc) && !rc)
		rc = -EIO;
	if (!rc)
		rc = barrier(w);
	for (int pi = 0; pi < b->np && !rc; pi++)
		for (int r = 0; r < b->reps && !rc; r++) {
			const int P = b->prompts[pi];
			const uint64_t c0 = coll_ns(w), l0 = s.linear_ns;
			const double f0 = s.linear_flops;
			uint64_t t0;

			for (int i = 0; i < P; i++) {
				tok[i] = (i * 131 + 7 + w->dp_rank) % s.cfg.vocab_size;
				pos[i] = i;
				seq[i] = 0;
				want[i] = i == P - 1;
			}
			rc = barrier(w);
			t0 = dps_now_ns();
			if (!rc && !dps_shard_step(&s, 1, P, tok, pos, seq, want, &rc))
				break;
			if (!rc)
				rc = barrier(w);
			m.secs = (double)(dps_now_ns() - t0) / 1e9;
			m.coll_s = (double)(coll_ns(w) - c0) / 1e9;
			m.lin_s = (double)(s.linear_ns - l0) / 1e9;
			m.lin_flops = s.linear_flops - f0;
			m.test = 0;
			m.p = P;
			m.b = 1;
			m.rep = r;
			m.steps = 1;
			if (!rc && w->rank == 0)
				rc = dps_ring_push(&w->to_sup, &m, sizeof(m), 0);
		}
	for (int gi = 0; gi < b->ng && !rc; gi++)
		for (int bi = 0; bi < b->nb && !rc; bi++)
			for (int r = 0; r < b->reps && !rc; r++) {
				const int G = b->gens[gi], B = b->batches[bi], V = s.cfg.vocab_size;
				const int real = real_rows(b, w->dp_rank, B);
				/* Coupled replicas step at B rows, padded; others run their own rows. */
				const int rows = dps_shard_coupled(&s) ? B : real;
				struct dps_shard_stats st0;
				uint64_t t0, c0, moe0, ep0, xb0, xt0, xthr0, xrun0, pt0;
				double pb0;
				const float *lg = NULL;

				for (int i = 0; i < real; i++) {
					tok[i] = s.cfg.bos_token_id;
					pos[i] = 0;
				}
				/* Expected to progress only while it has rows (not in --load 0's
				 * or a fast replica's barrier waits: the supervisor's stall rule). */
				dps_world_set_busy(w, rows > 0);
				/* Position 0 of every sequence, then G decode steps, timed. */
				if (rows)
					lg = decode_step(&s, rows, real, tok, pos, slot, tix, want, table,
							 zero, &rc);
				if (!rc)
					rc = barrier(w);
				st0 = s.stats;
				c0 = coll_ns(w);
				moe0 = s.moe_bytes;
				xb0 = s.exp_bytes;
				xt0 = s.exp_ns;
				xthr0 = s.exp_thr_ns;
				xrun0 = s.exp_run_ns;
				pb0 = s.linear_bytes;
				pt0 = s.linear_ns;
				ep0 = dispatch_bytes(&s);
				t0 = dps_now_ns();
				for (int g = 1; g <= G && lg && !rc; g++) {
					for (int i = 0; i < real; i++) {
						tok[i] = dps_argmax(lg + (size_t)i * (size_t)V, V);
						pos[i] = g;
					}
					lg = decode_step(&s, rows, real, tok, pos, slot, tix, want,
							 table, zero, &rc);
				}
				dps_world_set_busy(w, 0);
				if (!rc)
					rc = barrier(w);
				dps_world_set_busy(w, 1);
				m.secs = (double)(dps_now_ns() - t0) / 1e9;
				m.coll_s = (double)(coll_ns(w) - c0) / 1e9;
				for (int k = 0; k < DPS_COLL_KINDS; k++) {
					uint64_t calls = 0;

					for (int gr = 0; gr < DPS_SG_COUNT; gr++)
						calls += s.stats.calls[k][gr] - st0.calls[k][gr];
					m.calls_per_layer[k] = (double)calls / G / s.cfg.num_hidden_layers;
				}
				m.test = 1;
				m.p = 0;
				m.b = B;
				m.g = G;
				m.gi = gi;
				m.bi = bi;
				m.rep = r;
				m.steps = G;
				if (!rc && w->rank == 0)
					rc = dps_ring_push(&w->to_sup, &m, sizeof(m), 0);
				if (!rc) { /* the MoE counts (zero without) and the products' */
					struct bmsg e = m;

					e.type = MSG_MOE;
					e.rank = w->rank;
					e.moe_bytes = (double)(s.moe_bytes - moe0);
					e.ep_bytes = (double)(dispatch_bytes(&s) - ep0);
					e.exp_bytes = (double)(s.exp_bytes - xb0);
					e.exp_secs = (double)(s.exp_ns - xt0) / 1e9;
					e.exp_thr_s = (double)(s.exp_thr_ns - xthr0) / 1e9;
					e.exp_run_s = (double)(s.exp_run_ns - xrun0) / 1e9;
					e.prod_bytes = s.linear_bytes - pb0;
					e.prod_secs = (double)(s.linear_ns - pt0) / 1e9;
					rc = dps_ring_push(&w->to_sup, &e, sizeof(e), 0);
				}
			}
out:
	dps_shard_free(&s);
out0:
	free(tok);
	free(pos);
	free(seq);
	free(slot);
	free(tix);
	free(table);
	free(zero);
	free(want);
	return rc;
}

static void on_msg(int rank, const void *msg, size_t len, void *arg)
{
	struct bench *b = arg;
	struct bmsg m;

	(void)rank;
	if (len != sizeof(m))
		return;
	memcpy(&m, msg, sizeof(m));
	if (m.type == MSG_MOE) {
		if (m.gi >= 0 && m.gi < MAX_LIST && m.bi >= 0 && m.bi < MAX_LIST) {
			b->moe_sum[m.gi][m.bi] += m.moe_bytes;
			b->ep_sum[m.gi][m.bi] += m.ep_bytes;
			b->exp_bytes[m.gi][m.bi] += m.exp_bytes;
			b->exp_secs[m.gi][m.bi] += m.exp_secs;
			b->exp_thr[m.gi][m.bi] += m.exp_thr_s;
			b->exp_run[m.gi][m.bi] += m.exp_run_s;
			b->prod_bytes[m.gi][m.bi] += m.prod_bytes;
			b->prod_secs[m.gi][m.bi] += m.prod_secs;
		}
		return;
	}
	if (m.type == MSG_BYTES) {
		b->decode_bytes += m.decode_bytes;
		if (b->tp > 0 && m.rank / b->tp < DPS_MAX_WORLD)
			b->rep_decode_bytes[m.rank / b->tp] += m.decode_bytes;
		b->all_bytes += m.all_bytes;
		b->kv_bytes += m.kv_bytes;
		if (m.rank == 0) {
			b->rank0_bytes = m.all_bytes, b->rank0_wt = m.wt;
			b->rank0_kv = m.kv_bytes;
		}
		return;
	}
	if (b->nrows == b->cap) {
		struct bmsg *n = realloc(b->rows, sizeof(*n) * (size_t)(b->cap ? 2 * b->cap : 64));

		if (!n) {
			b->failed = 1;
			return;
		}
		b->rows = n;
		b->cap = b->cap ? 2 * b->cap : 64;
	}
	b->rows[b->nrows++] = m;
	{
		/* Time left: what the runs so far took, per run, times the runs to go. */
		const double el = (double)(dps_now_ns() - b->t0) / 1e9;
		const int total = b->reps * (b->np + b->ng * b->nb);

		fprintf(stderr, "\rdpshard bench decode: %s%d%s%.0d, run %d of %d done (%d of %d in "
				"all, about %.0f s left) ...     ", m.test ? "tg" : "pp",
			m.test ? m.g : m.p, m.test ? " at batch " : "", m.test ? m.b : 0, m.rep + 1,
			b->reps, b->nrows, total, b->nrows ? el / b->nrows * (total - b->nrows) : 0.0);
	}
}

static void layout_name(const struct dps_par_cfg *p, char *buf, size_t len)
{
	int n = snprintf(buf, len, "TP=%d DP=%d", p->tp, p->dp);

	if (p->attn_dp > 1 || p->emb_dp > 1 || p->mlp_dp > 1 || p->lm_head_dp > 1)
		n += snprintf(buf + n, len - (size_t)n, " a%d e%d m%d l%d", p->attn_dp, p->emb_dp,
			      p->mlp_dp, p->lm_head_dp);
	if (p->ep && n < (int)len)
		n += snprintf(buf + n, len - (size_t)n, " EP %s", p->a2a == DPS_A2A_V ? "a2a" : "ag");
	if (p->nodes > 1 && n < (int)len)
		snprintf(buf + n, len - (size_t)n, " on %d nodes", p->nodes);
}

/*
 * The read bandwidth (bytes/s, 0 when the pool cannot be set up) with the threads the ranks
 * will use, before they are forked: the pool is left at one thread, so the supervisor forks
 * from a process with no other thread alive.
 */
/* The threads of a rank (threads, or 0: the CPUs shared out) and, in *all, of every rank
 * together (at most the CPUs): what the limits are measured with. */
static int limit_threads(int world, int threads, int *all)
{
	const int ncpu = dps_cpus_allowed();
	const int per = threads ? threads : (ncpu / world > 0 ? ncpu / world : 1);

	*all = world * per < ncpu ? world * per : ncpu;
	return per;
}

static double read_bw_before(const char *blis_arch, int world, int threads)
{
	char msg[256];
	double bw = 0;
	int all;

	limit_threads(world, threads, &all);
	fprintf(stderr, "dpshard bench decode: measuring read bandwidth before the runs ...\n");
	if (!dps_gemm_setup(blis_arch, all, msg, sizeof(msg)))
		bw = dps_limits_read_bandwidth((size_t)1 << 30, 7);
	dps_gemm_setup(blis_arch, 1, msg, sizeof(msg));
	return bw;
}

int dps_bench_decode(int argc, char **argv)
{
	const char *model_dir = NULL, *preset = "bench-110m", *blis_arch = "auto";
	const char *prompts_s = "512", *gens_s = "128", *batches_s = "1,8", *cpu_bind = "auto";
	const char *load_s = NULL, *plot = NULL, *spec_model = NULL, *spec_s = NULL;
	int dtype = 0 /* --dtype */, quant = 0 /* --quantization */, reps = 3, threads = 0, json = 0, csv = 0, npos, rc, world, all;
	struct dps_machine mach;
	int prompts[MAX_LIST], gens[MAX_LIST], batches[MAX_LIST], ks[MAX_LIST], np, ng, nb, nk = 0;
	struct result res[3 * MAX_LIST * MAX_LIST];
	struct dps_par_cfg par = DPS_PAR_CFG_DEFAULT;
	struct bench b = { 0 };
	char *positional[1], err[512], dir[4096], lname[96];
	double bw, bw0, bw1, peak;
	int nres = 0;
	struct dps_flag flags[32];
	const struct dps_flag base[] = {
		{ "model", DPS_FLAG_STR, &model_dir, "DIR", "checkpoint directory (default: --preset)" },
		{ "preset", DPS_FLAG_STR, &preset, "NAME",
		  "mkmodel preset written to the cache on first use, when no --model" },
		{ "n-prompt", DPS_FLAG_STR, &prompts_s, "P,...", "prefill tests: prompt lengths", 0, 0,
		  'p' },
		{ "n-gen", DPS_FLAG_STR, &gens_s, "N,...", "decode tests: tokens per sequence", 0, 0,
		  'n' },
		{ "batch", DPS_FLAG_STR, &batches_s, "B,...",
		  "decode tests: sequences per step, per replica", 0, 0, 'b' },
		{ "load", DPS_FLAG_STR, &load_s, "PCT,...",
		  "decode tests: each replica's share of the batch in percent, one per replica "
		  "(unbalanced loads; default 100 each)" },
		{ "repetitions", DPS_FLAG_INT, &reps, "R", "runs of each test", 1, 100, 'r' },
		{ "threads-per-rank", DPS_FLAG_INT, &threads, "N",
		  "threads of each rank; 0: the CPUs its placement gave it", 0, 1024 },
		dps_flag_dtype(&dtype),
		dps_flag_quantization(&quant),
		{ "blis-arch", DPS_FLAG_STR, &blis_arch, "A",
		  "auto (batch-invariant kernels) or BLIS: skx, zen3, haswell, generic or BIG:SMALL; WARNING: BLIS is not batch-invariant (tokens may depend on the batch)" },
		{ "cpu-bind", DPS_FLAG_STR, &cpu_bind, "SPEC",
		  "where ranks run (auto, off, or lists; see dpshard groups --help)" },
		{ "json", DPS_FLAG_BOOL, &json, NULL, "print the results as JSON" },
		{ "csv", DPS_FLAG_BOOL, &csv, NULL, "print the results as CSV (a header line first)" },
		{ "plot", DPS_FLAG_STR, &plot, "FILE.svg",
		  "draw decode tokens/s against the batch size (needs gnuplot)" },
		{ "speculative-model", DPS_FLAG_STR, &spec_model, "DIR",
		  "compare decode with and without this Eagle3 draft, through the serving engine "
		  "(prompt length: the first -p; --load, --plot do not apply)" },
		{ "num-speculative-tokens", DPS_FLAG_STR, &spec_s, "K,...",
		  "with --speculative-model: the K values to compare with no speculation "
		  "(default 3)" },
	};
	size_t nf = sizeof(base) / sizeof(base[0]);

	memcpy(flags, base, sizeof(base));
	dps_flags_parallel(&par, flags + nf);
	nf += DPS_PAR_FLAGS;
	flags[nf] = (struct dps_flag)DPS_FLAGS_END;
	rc = dps_flags_parse(flags, argc, argv, "bench decode", "[--model DIR | --preset NAME] "
			     "[-p P,...] [-n N,...] [-b B,...] [LAYOUT FLAGS] [OPTIONS]", positional,
			     0, &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	np = parse_list(prompts_s, prompts, 1, 1 << 16);
	ng = parse_list(gens_s, gens, 1, 1 << 16);
	nb = parse_list(batches_s, batches, 1, 4096);
	if (np < 0 || ng < 0 || nb < 0) {
		fprintf(stderr, "dpshard bench decode: -p, -n and -b take comma-separated positive "
				"numbers (at most %d each)\n", MAX_LIST);
		return 2;
	}
	for (int d = 0; d < DPS_MAX_WORLD; d++)
		b.load[d] = 100;
	if (load_s) {
		const int nl = dps_flags_int_list(load_s, b.load, DPS_MAX_WORLD, 0, 100);
		int any = 0;

		for (int d = 0; d < nl; d++)
			any |= b.load[d] > 0;
		if (nl != par.dp || !any) {
			fprintf(stderr, "dpshard bench decode: --load takes one percentage (0 to 100) per "
					"replica, %d of them, not all 0; got '%s'\n", par.dp, load_s);
			return 2;
		}
	}
	if ((spec_model || spec_s) &&
	    (!spec_model || (nk = parse_list(spec_s ? spec_s : "3", ks, 1, DPS_MAX_SPEC)) < 0 ||
	     load_s || plot)) {
		fprintf(stderr, "dpshard bench decode: --num-speculative-tokens takes K,... (1 to %d) "
				"with --speculative-model, which takes no --load or --plot\n",
			DPS_MAX_SPEC);
		return 2;
	}
	b.max_p = b.max_g = b.max_b = 1;
	for (int i = 0; i < np; i++)
		b.max_p = prompts[i] > b.max_p ? prompts[i] : b.max_p;
	for (int i = 0; i < ng; i++)
		b.max_g = gens[i] > b.max_g ? gens[i] : b.max_g;
	for (int i = 0; i < nb; i++)
		b.max_b = batches[i] > b.max_b ? batches[i] : b.max_b;
	if (!model_dir) {
		if (dps_cached_preset(preset, "bench decode", dir, sizeof(dir)))
			return 1;
		model_dir = dir;
	}
	rc = dps_model_config_load(model_dir, &b.cfg, err, sizeof(err));
	if (!rc)
		rc = dps_par_cfg_check(&par, err, sizeof(err));
	if (!rc)
		rc = dps_shard_check(&b.cfg, &par, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dpshard bench decode: %s\n", err);
		return rc == -DPS_ECONFIG ? 2 : 1;
	}
	layout_name(&par, lname, sizeof(lname));
	if (spec_model)
		return dps_bench_spec(&(struct dps_bench_spec_opts){
			.model = model_dir, .draft = spec_model, .blis_arch = blis_arch,
			.cpu_bind = cpu_bind, .layout = lname, .par = par, .prompt = prompts[0],
			.threads = threads, .reps = reps, .vocab = b.cfg.vocab_size, .gens = gens,
			.batches = batches, .ks = ks, .ng = ng, .nb = nb, .nk = nk, .json = json,
			.csv = csv });
	b.model = model_dir;
	b.tp = par.tp;
	b.blis_arch = blis_arch, b.dtype = dtype ? (enum dps_shard_dtype)(dtype - 1) : 0;
	b.quant = (enum dps_shard_quant)quant, b.threads = threads, b.reps = reps;
	b.np = np;
	b.ng = ng;
	b.nb = nb;
	b.prompts = prompts;
	b.gens = gens;
	b.batches = batches;
	world = par.tp * par.dp;
	bw0 = read_bw_before(blis_arch, world, threads);
	fprintf(stderr, "dpshard bench decode: %s on %d rank(s), model %s ...\n", lname, world,
		model_dir);
	{
		/* A rank that stops stepping (its busy flag is set once loaded) for 30 s fails the
		 * run, as serve's default --rank-timeout would. */
		struct dps_sup_opts so = { .par = par, .cpu_bind = cpu_bind, .rank_fn = rank_main,
					   .rank_arg = &b, .msg_fn = on_msg, .msg_arg = &b,
					   .rank_timeout_ms = 30000, .nodes_ok = 1 };
		struct dps_sup_result sr;

		/* rank_main's rows: the longest prompt or the largest batch */
		so.window_bytes = dps_shard_window_bytes(&b.cfg, &par,
							 b.max_p > b.max_b ? b.max_p : b.max_b);
		b.t0 = dps_now_ns();
		rc = dps_sup_run(&so, &sr, err, sizeof(err));
	}
	fprintf(stderr, "\r%*s\r", 70, "");
	if (!rc && dps_sup_node() > 0) { /* node 0 has every rank's figures and prints them */
		free(b.rows);
		return 0;
	}
	if (rc || b.failed) {
		fprintf(stderr, "dpshard bench decode: %s\n", rc ? err : "out of memory");
		free(b.rows);
		return 1;
	}
	/* The machine's limits, now that the ranks are gone: as many threads as they used. */
	fprintf(stderr, "dpshard bench decode: measuring read bandwidth and the sgemm rate ...\n");
	{
		const int per = limit_threads(world, threads, &all);
		char msg[256];

		if (dps_gemm_setup(blis_arch, all, msg, sizeof(msg))) {
			fprintf(stderr, "dpshard bench decode: %s\n", msg);
			free(b.rows);
			return 1;
		}
		bw1 = dps_limits_read_bandwidth((size_t)1 << 30, 7);
		bw = bw0 > bw1 ? bw0 : bw1; /* the bound: what the memory did at its faster end */
		dps_gemm_setup(blis_arch, per, msg, sizeof(msg));
		peak = dps_limits_sgemm_rate(1536, 5);
		threads = per;
	}
	for (int pi = 0; pi < np; pi++) {
		struct result *r = &res[nres++];
		double v[100], flops = 0, lin = 0, secs = 0, coll = 0;
		int k = 0;

		for (int i = 0; i < b.nrows; i++)
			if (b.rows[i].test == 0 && b.rows[i].p == prompts[pi] && k < 100) {
				v[k++] = (double)par.dp * prompts[pi] / b.rows[i].secs;
				flops += b.rows[i].lin_flops;
				lin += b.rows[i].lin_s;
				secs += b.rows[i].secs;
				coll += b.rows[i].coll_s;
			}
		snprintf(r->test, sizeof(r->test), "pp%d", prompts[pi]);
		r->prompt = prompts[pi];
		r->batch = 1;
		stats(v, k ? k : 1, &r->mean, &r->sd);
		r->step_ms = k ? secs / k * 1e3 : 0;
		r->coll_ms = k ? coll / k * 1e3 : 0;
		r->gbs = lin > 0 ? flops / lin / 1e9 : 0;
		r->bound = peak > 0 ? r->gbs / peak : 0;
	}
	for (int gi = 0; gi < ng; gi++)
		for (int bi = 0; bi < nb; bi++) {
			struct result *r = &res[nres++];
			const int B = batches[bi], G = gens[gi];
			const double kv_row = 2.0 * b.cfg.num_hidden_layers *
					      b.cfg.num_key_value_heads * b.cfg.head_dim * sizeof(float);
			const int coupled = par.ep || par.attn_dp > 1 || par.emb_dp > 1 ||
					    par.mlp_dp > 1 || par.lm_head_dp > 1;
			double v[100], secs = 0, coll = 0, weights = 0;
			int k = 0, real = 0;

			memset(r, 0, sizeof(*r));
			for (int d = 0; d < par.dp; d++) {
				real += real_rows(&b, d, B);
				/* An uncoupled replica with no rows runs no step and reads nothing. */
				if (coupled || real_rows(&b, d, B))
					weights += b.rep_decode_bytes[d];
			}
			r->real = real;
			for (int i = 0; i < b.nrows; i++)
				if (b.rows[i].test == 1 && b.rows[i].b == B && b.rows[i].g == G &&
				    k < 100) {
					v[k++] = (double)real * G / b.rows[i].secs;
					secs += b.rows[i].secs;
					coll += b.rows[i].coll_s;
					memcpy(r->calls_per_layer, b.rows[i].calls_per_layer,
					       sizeof(r->calls_per_layer));
				}
			snprintf(r->test, sizeof(r->test), "tg%d", G);
			r->gen = G;
			r->batch = B;
			stats(v, k ? k : 1, &r->mean, &r->sd);
			r->step_ms = k ? secs / k / G * 1e3 : 0;
			r->coll_ms = k ? coll / k / G * 1e3 : 0;
			/* Every rank reads its decode weights (MoE: the router and the experts its rows
			 * chose, as counted); step s reads s + 1 positions of KV for each real sequence
			 * (over the TP ranks, which split the KV heads). */
			r->expert_bytes = k ? b.moe_sum[gi][bi] / k / G : 0;
			r->dispatch_bytes = k ? b.ep_sum[gi][bi] / k / G : 0;
			r->expert_gbs = b.exp_secs[gi][bi] > 0
						? b.exp_bytes[gi][bi] / b.exp_secs[gi][bi] / 1e9 : 0;
			r->expert_busy = b.exp_thr[gi][bi] > 0 ? b.exp_run[gi][bi] / b.exp_thr[gi][bi] : -1;
			r->product_gbs = b.prod_secs[gi][bi] > 0
						 ? b.prod_bytes[gi][bi] / b.prod_secs[gi][bi] / 1e9 : 0;
			r->product_bytes = k ? b.prod_bytes[gi][bi] / k / G : 0;
			r->bytes_per_step = weights + r->expert_bytes + (double)real * kv_row * (G + 3) / 2.0;
			r->gbs = r->step_ms > 0 ? r->bytes_per_step / (r->step_ms / 1e3) / 1e9 : 0;
			r->bound = bw > 0 ? r->gbs * 1e9 / bw : 0;
		}
	dps_machine_get(&mach);
	if (csv) {
		printf("model,layout,ranks,test,batch,sequences,tokens_per_s,sd,step_ms,collective_ms,"
		       "bytes_per_step,read_gbs_or_gflops,of_bound,dispatch_bytes_per_step,"
		       "weight_bytes_per_rank,kv_bytes_per_rank,version,git_commit,cpu,cpus,"
		       "numa_nodes,blis\n");
		for (int i = 0; i < nres; i++) {
			const struct result *r = &res[i];
			const char *bn = strrchr(model_dir, '/');

			printf("\"%s\",\"%s\",%d,%s,%d,%d,%.3f,%.3f,%.4f,%.4f,%.0f,%.3f,%.4f,%.0f,%.0f,"
			       "%.0f,%s,%s,\"%s\",%d,%d,\"%s\"\n",
			       bn && bn[1] ? bn + 1 : model_dir, lname, world, r->test, r->batch,
			       r->prompt ? par.dp : r->real, r->mean, r->sd, r->step_ms, r->coll_ms,
			       r->bytes_per_step, r->gbs, r->bound, r->dispatch_bytes, b.rank0_bytes,
			       b.rank0_kv, PACKAGE_VERSION, dps_git_commit, mach.cpu, mach.cpus,
			       mach.nodes, mach.blis);
		}
	} else if (json) {
		printf("{");
		dps_machine_json(stdout, &mach);
		printf(", \"layout\": ");
		dps_json_string(stdout, lname, strlen(lname));
		printf(", \"ranks\": %d, \"threads_per_rank\": %d, \"expert_parallel\": %s, "
		       "\"all2all_backend\": ", world, threads, par.ep ? "true" : "false");
		dps_json_string(stdout, par.ep ? dps_a2a_name(par.a2a) : "",
				strlen(par.ep ? dps_a2a_name(par.a2a) : ""));
		printf(", \"load_percent\": [");
		for (int d = 0; d < par.dp; d++)
			printf("%s%d", d ? ", " : "", b.load[d]);
		printf("],\n \"model\": ");
		dps_json_string(stdout, model_dir, strlen(model_dir));
		printf(", \"weight_dtype\": \"%s\", \"weight_bytes_per_rank\": %.0f, "
		       "\"kv_bytes_per_rank\": %.0f, \"params\": %llu,\n \"read_bandwidth_gbs\": %.2f, "
		       "\"read_bandwidth_before_gbs\": %.2f, \"read_bandwidth_after_gbs\": %.2f, "
		       "\"sgemm_gflops\": %.1f,\n"
		       " \"results\": [\n", dps_wtype_name((enum dps_wtype)b.rank0_wt), b.rank0_bytes, b.rank0_kv,
		       (unsigned long long)dps_model_config_params(&b.cfg), bw / 1e9, bw0 / 1e9,
		       bw1 / 1e9, peak);
		for (int i = 0; i < nres; i++)
			dps_bench_decode_json_result(&res[i], i + 1 == nres);
		printf(" ]}\n");
	} else {
		const struct bench_table t = { res, nres, model_dir, lname, world, threads,
					       all, &mach,
					       bw, bw0, bw1, peak, b.rank0_bytes, b.rank0_wt, b.rank0_kv,
					       load_s != NULL, b.load, par.dp, &b.cfg };

		dps_bench_decode_table(&t);
	}
	free(b.rows);
	if (plot) {
		struct dps_series sr = { .n = 0 };
		char title[160];

		snprintf(sr.name, sizeof(sr.name), "%.60s", lname);
		for (int i = 0; i < nres && sr.n < 32; i++)
			if (!res[i].prompt && res[i].gen == gens[0]) {
				sr.x[sr.n] = res[i].batch;
				sr.y[sr.n++] = res[i].mean;
			}
		snprintf(title, sizeof(title), "dpshard bench decode: tg%d, %s", gens[0], lname);
		if (dps_plot_svg(plot, title, "sequences per step, per replica",
				 "decode tokens/s (every replica)", &sr, 1, 1))
			return 1;
	}
	return 0;
}

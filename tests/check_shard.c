/* SPDX-License-Identifier: MIT */
/*
 * tests/check_shard.c - the sharded forward pass against the single-rank model.
 *
 * Oracle: dps_model (one process, whole weights) generating each prompt greedily alone. Each
 * configuration runs as real rank processes under the supervisor; every rank generates its
 * replica's prompts (prompt i goes to replica i mod DP) with the step loop of
 * tests/shard_loop.h (the serving engine's lockstep, without its scheduler) and compares,
 * at every step, the token with the oracle's and every logit within 1e-4 of it. Models: a
 * GQA model whose dimensions divide by nothing (6 query heads over 2 KV heads, intermediate
 * 100, vocabulary 300), a multi-head model whose KV heads are a multiple of TP x attention
 * size (the KV all-to-all variant), and stories260K (models/stories260K). Configurations:
 * every layout up to 8 ranks with a spread of component sizes, and the references' TP=8 x DP=4 with
 * all sizes 4 (on a model with 32 query heads) and with mixed sizes (32 ranks on 2 cores).
 * Every rank of a replica must also produce bit-identical logits (a hash per step, compared
 * across ranks). Also: the exact collective counts of the graphs, weight bytes falling by
 * each component's factor, a perturbed oracle being caught, and layouts whose sublayer
 * outputs live in the TP groups' windows with every all-reduce read in place. _dp_transition on
 * hand-built rows, the shard rows against the full tensors and dummy batches are in
 * tests/check_shard_units.c.
 */
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/dps.h"
#include "tests/testutil.h"
#include "engine/model/convert.h"
#include "engine/model/mkmodel.h"
#include "engine/model/model.h"
#include "engine/shard/shard.h"
#include "engine/runtime/supervisor.h"
#include "kernels/gemm.h"
#include "tests/model_oracle.h"
#include "tests/shard_loop.h"

#define NPROMPT 5
#define MAXPOS 40
static const int prompts[NPROMPT][8] = {
	{ 1, 5, 9, 13 }, { 1 }, { 1, 200, 3, 4, 5, 6, 7 }, { 1, 42 }, { 1, 17, 18 },
};
static const int prompt_len[NPROMPT] = { 4, 1, 7, 2, 3 };

static char dir[64];


/* Shared with the forked ranks. */
struct shared {
	_Atomic uint64_t hash[NPROMPT][MAXPOS]; /* of each step's logits, first rank to get there */
	_Atomic int mismatches, checked, dummy_steps, steps;
	char first[256];
	_Atomic int first_taken;
	uint64_t calls[DPS_COLL_KINDS][DPS_SG_COUNT]; /* rank 0's, after its run */
	uint64_t layers;
	size_t bytes[DPS_PART_COUNT];                 /* rank 0's */
	_Atomic int o_window;                         /* ranks whose o lives in a window */
};

static struct shared *sh;
static int window_runs; /* run_config: TP windows, all-reduces in place (test_in_place) */
static struct model_oracle orc;
static float perturb; /* added to one oracle logit, to show a mismatch is caught */

static void build_oracle(const char *model)
{
	model_oracle_build(&orc, model, prompts, prompt_len, NPROMPT, MAXPOS);
}

struct run_arg {
	const char *model;
	int check_cache_untouched;
	int decode_only;
};

static void note(const char *fmt, int a, int b, int c, double d)
{
	int expected = 0;

	sh->mismatches++;
	if (atomic_compare_exchange_strong(&sh->first_taken, &expected, 1))
		snprintf(sh->first, sizeof(sh->first), fmt, a, b, c, d);
}

static int compare(void *arg, int index, int pos, int token, const float *logits, int vocab)
{
	const float *want = model_oracle_logits(&orc, index, pos);
	double worst = 0;

	(void)arg;
	for (int v = 0; v < vocab; v++) {
		const double d = fabs((double)logits[v] - (double)want[v] -
				      (v == 3 && index == 0 && pos == 5 ? (double)perturb : 0.0));

		if (!(d <= worst))
			worst = isnan(d) ? INFINITY : d;
	}
	{
		/* Every rank holding this row must have the very same logits. */
		uint64_t h = 1469598103934665603ull, expected = 0;
		const unsigned char *b = (const unsigned char *)logits;

		for (size_t i = 0; i < sizeof(float) * (size_t)vocab; i++)
			h = (h ^ b[i]) * 1099511628211ull;
		h |= 1;
		if (!atomic_compare_exchange_strong(&sh->hash[index][pos], &expected, h) &&
		    expected != h)
			note("prompt %d position %d: ranks disagree (token %d) %g", index, pos, token,
			     0.0);
	}
	if (worst > 1e-4)
		note("prompt %d position %d: logits differ by %g (token %d)", index, pos, token, worst);
	else if (token != model_oracle_token(&orc, index, pos + 1))
		note("prompt %d position %d: token %d, oracle %d", index, pos, token,
		     model_oracle_token(&orc, index, pos + 1));
	sh->checked++;
	return 0;
}

static int rank_main(struct dps_world *w, void *argp)
{
	const struct run_arg *a = argp;
	struct dps_shard s;
	struct loop_req reqs[NPROMPT] = { 0 };
	struct dps_sampling sp = { 0.0f, 0, 1.0f, 0 };
	struct loop_stats st = { 0 };
	char err[512], msg[256];
	int n = 0, rc;

	dps_gemm_setup("auto", 1, msg, sizeof(msg));
	if (window_runs) /* every all-reduce above 0 bytes as reduce-scatter + all-gather */
		dps_world_set_algo(w, 0, DPS_ALGO_AUTO);
	rc = dps_shard_load(&s, w, &w->lay->groups.cfg, a->model,
			    &(struct dps_shard_opts){ .max_pos = MAXPOS, .max_seqs = NPROMPT,
						      .max_rows = 16, .decode_only = a->decode_only },
			    err, sizeof(err));
	if (rc) {
		fprintf(stderr, "rank %d: %s\n", w->rank, err);
		return rc;
	}
	loop_decode_only = a->decode_only;
	sh->o_window += s.o_window;
	for (int k = w->dp_rank; k < NPROMPT; k += w->dp) {
		reqs[n].prompt = prompts[k];
		reqs[n].n_prompt = prompt_len[k];
		reqs[n].max_pos = MAXPOS;
		reqs[n].index = k;
		n++;
	}
	rc = loop_generate(&s, reqs, n, &sp, compare, NULL, &st);
	if (w->rank == 0) {
		memcpy(sh->calls, s.stats.calls, sizeof(sh->calls));
		memcpy(sh->bytes, s.bytes, sizeof(sh->bytes));
		sh->layers = (uint64_t)s.cfg.num_hidden_layers;
	}
	if (w->tp_rank == 0)
		sh->dummy_steps += (int)st.dummy_steps;
	if (w->rank == 0)
		sh->steps = (int)st.steps;
	dps_shard_free(&s);
	return rc;
}

/* Runs one configuration; returns the supervisor's code, with its message in err. */
static int decode_only_runs; /* run_config's ranks load the decode graph alone */

static int run_config(const char *model, struct dps_par_cfg par, char *err, size_t len)
{
	struct run_arg a = { model, 0, decode_only_runs };
	struct dps_sup_opts o = { .par = par, .rank_fn = rank_main, .rank_arg = &a,
				  .cpu_bind = "off", .window_bytes = window_runs ? 1 << 20 : 0 };
	struct dps_sup_result res;

	memset(sh, 0, sizeof(*sh));
	return dps_sup_run(&o, &res, err, len);
}

static void expect_equal(const char *model, struct dps_par_cfg par)
{
	char err[512];
	int rc = run_config(model, par, err, sizeof(err));

	ck_assert_msg(rc == 0, "TP=%d DP=%d attn=%d emb=%d mlp=%d lm=%d ep=%d/%s: %s", par.tp,
		      par.dp, par.attn_dp, par.emb_dp, par.mlp_dp, par.lm_head_dp, par.ep,
		      dps_a2a_name(par.a2a), err);
	ck_assert_msg(sh->mismatches == 0, "TP=%d DP=%d attn=%d emb=%d mlp=%d lm=%d ep=%d/%s: %d "
		      "mismatches, first: %s", par.tp, par.dp, par.attn_dp, par.emb_dp, par.mlp_dp,
		      par.lm_head_dp, par.ep, dps_a2a_name(par.a2a), sh->mismatches, sh->first);
	ck_assert_int_gt(sh->checked, 0);
	if (getenv("SHARD_VERBOSE")) /* the configurations and what each checked */
		fprintf(stderr, "TP=%d DP=%d attn=%d emb=%d mlp=%d lm=%d ep=%d/%s: %d checked, "
			"%d dummy\n", par.tp, par.dp, par.attn_dp, par.emb_dp, par.mlp_dp,
			par.lm_head_dp, par.ep, dps_a2a_name(par.a2a), (int)sh->checked,
			(int)sh->dummy_steps);
}

static void setup(void)
{
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(sh, MAP_FAILED);
	test_tmpdir_make(dir, sizeof(dir), "shard");
	test_models_make(dir);
}

static void teardown(void)
{
	test_tmpdir_remove(dir);
	munmap(sh, sizeof(*sh));
	model_oracle_free(&orc);
}

static char *model_path(const char *sub)
{
	static char p[128];

	snprintf(p, sizeof(p), "%s/%s", dir, sub);
	return p;
}

/* TP, DP, attention, embedding, MLP, LM head (draft MLP 1). */
static const int configs[][6] = {
	{ 1, 1, 1, 1, 1, 1 }, { 2, 1, 1, 1, 1, 1 }, { 1, 2, 1, 1, 1, 1 }, { 4, 1, 1, 1, 1, 1 },
	{ 3, 1, 1, 1, 1, 1 }, { 2, 2, 1, 1, 1, 1 }, { 1, 2, 2, 2, 2, 2 }, { 2, 2, 2, 2, 2, 2 },
	{ 1, 2, 2, 1, 1, 1 }, { 1, 2, 1, 2, 1, 1 }, { 1, 2, 1, 1, 2, 1 }, { 1, 2, 1, 1, 1, 2 },
	{ 2, 2, 1, 2, 2, 1 }, { 2, 2, 2, 1, 1, 2 }, { 1, 4, 4, 4, 4, 4 }, { 1, 4, 2, 4, 1, 2 },
	{ 2, 4, 4, 2, 1, 4 }, { 1, 4, 1, 2, 4, 2 }, { 1, 8, 2, 4, 8, 1 }, { 2, 3, 3, 1, 3, 3 },
	{ 1, 6, 3, 2, 6, 1 },
};
#define NCONFIGS (int)(sizeof(configs) / sizeof(configs[0]))

static struct dps_par_cfg par_of(const int *c)
{
	struct dps_par_cfg p = { c[0], c[1], c[2], c[3], c[4], 1, c[5] };

	return p;
}

/* The configurations the GQA model takes: TP x attention size may not exceed its 6 query
 * heads (main registers only these). */
static int gqa_idx[NCONFIGS], n_gqa;

START_TEST(test_gqa_configs)
{
	const struct dps_par_cfg par = par_of(configs[gqa_idx[_i]]);

	build_oracle(model_path("gqa"));
	expect_equal(model_path("gqa"), par);
}
END_TEST

START_TEST(test_mha_configs)
{
	const struct dps_par_cfg par = par_of(configs[_i]);

	build_oracle(model_path("mha"));
	expect_equal(model_path("mha"), par);
}
END_TEST

START_TEST(test_32_ranks)
{
	/* The references' example: TP=8 x DP=4, all sizes 4 and mixed sizes; 32 ranks on 2 cores. */
	static const int big[][6] = { { 8, 4, 4, 4, 4, 4 }, { 8, 4, 2, 1, 4, 2 } };

	build_oracle(model_path("wide"));
	expect_equal(model_path("wide"), par_of(big[_i]));
}
END_TEST

START_TEST(test_in_place)
{
	/* The sublayer outputs in the TP groups' windows, every all-reduce read in place. */
	static const int cfgs[][6] = { { 2, 1, 1, 1, 1, 1 }, { 3, 2, 2, 1, 2, 1 },
				       { 2, 4, 2, 4, 1, 2 } };
	const struct dps_par_cfg par = par_of(cfgs[_i]);

	build_oracle(model_path("gqa"));
	window_runs = 1;
	expect_equal(model_path("gqa"), par);
	window_runs = 0;
	ck_assert_int_eq(sh->o_window, par.tp * par.dp);
}
END_TEST

START_TEST(test_stories260k)
{
	static const int cfgs[][6] = { { 2, 2, 2, 2, 2, 2 }, { 4, 1, 1, 1, 1, 1 },
				       { 2, 4, 2, 4, 1, 2 }, { 1, 4, 4, 1, 2, 4 } };
	char model[128], err[256];

	snprintf(model, sizeof(model), "%s/st260", dir);
	if (access(model, R_OK))
		ck_assert_msg(!dps_convert_llama2c(DPS_TEST_SRCDIR "/models/stories260K/stories260K.bin",
						   DPS_TEST_SRCDIR "/models/stories260K/tok512.bin",
						   model, DPS_ST_F32, err, sizeof(err)), "%s", err);
	build_oracle(model);
	expect_equal(model, par_of(cfgs[_i]));
}
END_TEST

START_TEST(test_draft_mlp_size_changes_nothing)
{
	/* --draft-mlp-dp-size shards only the Eagle3 draft: the target is unchanged. */
	struct dps_par_cfg par = par_of((int[]){ 1, 4, 2, 1, 2, 1 });

	par.draft_mlp_dp = 4;
	build_oracle(model_path("gqa"));
	expect_equal(model_path("gqa"), par);
}
END_TEST

START_TEST(test_mismatch_caught)
{
	/* A logit moved by 1e-3 in the oracle is reported: the comparison can fail. */
	build_oracle(model_path("gqa"));
	perturb = 1e-3f;
	{
		char err[512];
		int rc = run_config(model_path("gqa"), par_of(configs[7]), err, sizeof(err));

		perturb = 0;
		ck_assert_int_eq(rc, 0);
		ck_assert_int_gt(sh->mismatches, 0);
		ck_assert_ptr_nonnull(strstr(sh->first, "logits differ"));
	}
}
END_TEST

START_TEST(test_collective_counts)
{
	/*
	 * All sizes 2 on TP=2 x DP=2, one prefill step then decode steps: each decode layer issues
	 * one all-reduce over the attention group, one over the MLP group and the two attention
	 * all-to-alls, and no transition gathers; the prefill layers reduce attention over TP and
	 * gather the MLP column's rows once.
	 */
	char err[512];
	uint64_t L, steps, decode;

	build_oracle(model_path("mha"));
	ck_assert_int_eq(run_config(model_path("mha"), par_of((int[]){ 2, 2, 2, 2, 2, 2 }), err,
				    sizeof(err)), 0);
	L = sh->layers;
	steps = (uint64_t)sh->steps;
	decode = steps - 1;
	ck_assert_uint_gt(decode, 30);
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLREDUCE][DPS_SG_ATTN_COMP], L * decode);
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLREDUCE][DPS_SG_MLP_COMP], L * steps);
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLTOALL][DPS_SG_ATTN_COL], 2 * L * decode);
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLGATHER][DPS_SG_ATTN_COL], 0);
	/* prefill: one all-reduce per layer over TP (attention) plus the embedding's */
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLREDUCE][DPS_SG_TP], L + 1);
	/* prefill: the row counts once, then the rows once per layer */
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLGATHER][DPS_SG_MLP_COL], L + 1);
	/* decode: the embedding's ids and reduction, the LM head's rows and logits, per step */
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLGATHER][DPS_SG_EMB_COL], decode);
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLREDUCE][DPS_SG_EMB_COMP], decode);
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLGATHER][DPS_SG_LM_COL], decode);
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLGATHER][DPS_SG_LM_COMP], decode);
	/* the _get_dp_padding agreement before every step, and once more to end */
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLREDUCE][DPS_SG_DP], steps + 1);
	/* Mixed sizes: attention 1, MLP 2: two transitions per layer, one of them a gather. */
	ck_assert_int_eq(run_config(model_path("mha"), par_of((int[]){ 2, 2, 1, 2, 2, 2 }), err,
				    sizeof(err)), 0);
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLGATHER][DPS_SG_MLP_COL],
			  L * (uint64_t)(sh->steps - 1) + L + 1);
}
END_TEST

START_TEST(test_bytes_fall)
{
	/* The MLP held per rank falls by mlp_dp: TP=1 x DP=2 with mlp 2 against mlp 1. */
	char err[512];
	size_t one, two;

	build_oracle(model_path("mha"));
	ck_assert_int_eq(run_config(model_path("mha"), par_of((int[]){ 1, 2, 1, 1, 1, 1 }), err,
				    sizeof(err)), 0);
	one = sh->bytes[DPS_PART_MLP];
	ck_assert_int_eq(run_config(model_path("mha"), par_of((int[]){ 1, 2, 1, 1, 2, 1 }), err,
				    sizeof(err)), 0);
	two = sh->bytes[DPS_PART_MLP];
	ck_assert_uint_eq(two * 2, one);
	ck_assert_uint_eq(sh->bytes[DPS_PART_EMB_DECODE], 0);
	ck_assert_int_eq(run_config(model_path("mha"), par_of((int[]){ 1, 2, 1, 2, 1, 2 }), err,
				    sizeof(err)), 0);
	ck_assert_uint_eq(sh->bytes[DPS_PART_EMB_DECODE] * 2, sh->bytes[DPS_PART_EMB_PREFILL]);
	ck_assert_uint_eq(sh->bytes[DPS_PART_LM_DECODE] * 2, sh->bytes[DPS_PART_LM_PREFILL]);
}
END_TEST

/*
 * The decode ranks of a disaggregated layout (dps_shard_opts.decode_only): every component of
 * size c > 1 holds its decode layout alone (no plain-TP attention, embedding or LM head
 * bytes), and the prompts fed through the decode graph still give the one-process model's
 * greedy tokens and logits; attention's bytes fall by its factor c against the plain-TP
 * layout a co-located rank keeps for prefill.
 */
static const int decode_only_configs[][6] = {
	{ 1, 2, 2, 2, 2, 2 }, { 2, 2, 2, 2, 2, 2 }, { 1, 4, 4, 4, 4, 4 }, { 2, 4, 4, 2, 1, 4 },
	{ 1, 2, 2, 1, 1, 1 }, { 2, 2, 1, 2, 1, 2 },
};

START_TEST(test_decode_only)
{
	const int *c = decode_only_configs[_i % 6];
	const char *model = model_path(_i < 6 ? "mha" : "gqa");
	size_t both[DPS_PART_COUNT];
	char err[512];

	if (_i >= 6 && c[0] * c[2] > 6)
		return; /* more attention ranks than the GQA model's 6 heads */
	build_oracle(model);
	ck_assert_int_eq(run_config(model, par_of(c), err, sizeof(err)), 0);
	memcpy(both, sh->bytes, sizeof(both));
	decode_only_runs = 1;
	expect_equal(model, par_of(c));
	decode_only_runs = 0;
	ck_assert_uint_eq(sh->bytes[DPS_PART_ATTN_PREFILL] != 0, c[2] == 1);
	ck_assert_uint_eq(sh->bytes[DPS_PART_EMB_PREFILL] != 0, c[3] == 1);
	ck_assert_uint_eq(sh->bytes[DPS_PART_LM_PREFILL] != 0, c[5] == 1);
	ck_assert_uint_eq(sh->bytes[DPS_PART_MLP], both[DPS_PART_MLP]);
	ck_assert_uint_eq(sh->bytes[DPS_PART_EMB_DECODE], both[DPS_PART_EMB_DECODE]);
	if (c[2] > 1) {
		/* Q and O by the effective rank (a c-th of TP's), plus K/V rows of the TP
		 * position (by TP rank), or by the effective rank (the K/V all-to-all variant) */
		const size_t att_d = sh->bytes[DPS_PART_ATTN_DECODE];

		ck_assert_uint_lt(att_d, both[DPS_PART_ATTN_PREFILL]);
		ck_assert_uint_ge(att_d, both[DPS_PART_ATTN_DECODE]);
		if (_i < 6) /* mha: 8 KV heads, a multiple of TP x c: K/V by effective rank */
			ck_assert_uint_eq(att_d * (size_t)c[2], both[DPS_PART_ATTN_PREFILL]);
	}
	{
		size_t a = 0, b = 0;

		for (int k = 0; k < DPS_PART_COUNT; k++) {
			a += sh->bytes[k];
			b += both[k];
		}
		ck_assert_uint_lt(a, b);
	}
}
END_TEST

/* ---- mixture of experts ------------------------------------------------------------------- */

/* TP, DP, attention, embedding, MLP, LM head, expert parallel, backend (enum dps_a2a). */
static const int moe_configs[][8] = {
	/* no expert parallelism: every expert sharded like the MLP */
	{ 2, 1, 1, 1, 1, 1, 0, 0 }, { 3, 1, 1, 1, 1, 1, 0, 0 }, { 1, 2, 1, 1, 2, 1, 0, 0 },
	{ 2, 2, 2, 2, 2, 2, 0, 0 },
	/* all-gather + reduce-scatter */
	{ 1, 1, 1, 1, 1, 1, 1, 1 }, { 2, 1, 1, 1, 1, 1, 1, 1 }, { 1, 2, 1, 1, 1, 1, 1, 1 },
	{ 2, 2, 1, 1, 1, 1, 1, 1 }, { 4, 2, 1, 1, 1, 1, 1, 1 }, { 2, 4, 2, 2, 1, 2, 1, 1 },
	{ 1, 8, 4, 2, 1, 8, 1, 1 }, { 1, 4, 4, 4, 1, 4, 1, 0 },
	/* all-to-all-v, MLP sizes above 1 allowed */
	{ 1, 2, 1, 1, 1, 1, 1, 2 }, { 2, 1, 1, 1, 1, 1, 1, 2 }, { 2, 2, 1, 1, 1, 1, 1, 2 },
	{ 2, 2, 2, 2, 2, 2, 1, 2 }, { 1, 4, 2, 1, 4, 2, 1, 2 }, { 2, 4, 4, 2, 2, 1, 1, 2 },
	{ 1, 8, 2, 4, 8, 1, 1, 2 }, { 4, 2, 2, 1, 1, 2, 1, 2 },
};
#define NMOE (int)(sizeof(moe_configs) / sizeof(moe_configs[0]))

static struct dps_par_cfg moe_par(const int *c)
{
	struct dps_par_cfg p = { c[0], c[1], c[2], c[3], c[4], 1, c[5], c[6], c[7] };

	return p;
}

START_TEST(test_moe_configs)
{
	const struct dps_par_cfg par = moe_par(moe_configs[_i]);

	build_oracle(model_path("moe"));
	expect_equal(model_path("moe"), par);
	/* 5 prompts of unequal lengths: coupled replicas idle at times and run dummy batches. */
	if (par.ep && par.dp > 1)
		ck_assert_int_gt(sh->dummy_steps, 0);
	/* Uncoupled (no EP, every size 1): never. */
	if (!par.ep && par.attn_dp == 1 && par.emb_dp == 1 && par.mlp_dp == 1 &&
	    par.lm_head_dp == 1)
		ck_assert_int_eq(sh->dummy_steps, 0);
}
END_TEST

START_TEST(test_moe_32_ranks)
{
	/* The references' 32 ranks (TP=8 x DP=4 and TP=4 x DP=8), one expert per rank. */
	static const int big[][8] = { { 8, 4, 1, 4, 4, 4, 1, 2 }, { 4, 8, 2, 2, 1, 2, 1, 1 } };

	build_oracle(model_path("moe"));
	expect_equal(model_path("moe"), moe_par(big[_i]));
}
END_TEST

START_TEST(test_moe_dispatch_counts)
{
	/*
	 * TP=2 x DP=2, 3 MoE layers (GPT-OSS: every layer): all-gather + reduce-scatter moves each MoE layer's rows
	 * with one all-gather and one reduce-scatter over the DP column (plus the row counts in
	 * prefill) and reduces over TP; all-to-all-v sends the counts, the items and the outputs
	 * over the EP group and gathers the rows over TP. Experts held per rank fall by 4.
	 */
	char err[512];
	uint64_t steps;
	size_t tp_bytes;
	const uint64_t M = 3;

	build_oracle(model_path("moe"));
	ck_assert_int_eq(run_config(model_path("moe"), moe_par((int[]){ 2, 2, 1, 1, 1, 1, 0, 0 }),
				    err, sizeof(err)), 0);
	tp_bytes = sh->bytes[DPS_PART_EXPERTS];
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLGATHER][DPS_SG_EP], 0);
	ck_assert_int_eq(run_config(model_path("moe"), moe_par((int[]){ 2, 2, 1, 1, 1, 1, 1, 1 }),
				    err, sizeof(err)), 0);
	steps = (uint64_t)sh->steps;
	/* the row counts once per prefill step, the rows once per MoE layer of every step, and
	 * once per decode step which rows are padding */
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLGATHER][DPS_SG_EP], M * steps + steps);
	ck_assert_uint_eq(sh->calls[DPS_COLL_REDUCESCATTER][DPS_SG_EP], M * steps);
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLTOALL][DPS_SG_EP], 0);
	ck_assert_int_eq(run_config(model_path("moe"), moe_par((int[]){ 2, 2, 1, 1, 1, 1, 1, 2 }),
				    err, sizeof(err)), 0);
	steps = (uint64_t)sh->steps;
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLTOALL][DPS_SG_EP], 3 * M * steps);
	/* (attention size 1: the padding flags are this replica's own, nothing gathered) */
	ck_assert_uint_eq(sh->calls[DPS_COLL_ALLGATHER][DPS_SG_EP], 0);
	ck_assert_uint_eq(sh->calls[DPS_COLL_REDUCESCATTER][DPS_SG_EP], 0);
	ck_assert_uint_gt(sh->bytes[DPS_PART_EXPERTS], 0);
	/* router (whole on every rank) + 8 of 32 experts whole, against 32 halves */
	ck_assert_uint_lt(sh->bytes[DPS_PART_EXPERTS], tp_bytes);
}
END_TEST

START_TEST(test_moe_padding_reads_no_expert)
{
	/*
	 * A padding row as the engine builds it (KV slot PAD, but a block table, token 0 at
	 * position 0) chooses no expert on either dispatch: a decode step with one real row and
	 * one padding row reads the same expert bytes as the real row alone, and gives it the
	 * same logits. Without the skip the padding row's experts would be read too.
	 */
	for (int a2a = DPS_A2A_AG_RS; a2a <= DPS_A2A_V; a2a++) {
		struct dps_par_cfg par = moe_par((int[]){ 1, 1, 1, 1, 1, 1, 1, a2a });
		struct dps_shard sd;
		char err[512];
		const int prompt[3] = { 1, 17, 42 }, pos3[3] = { 0, 1, 2 }, seq3[3] = { 0, 0, 0 };
		const float *lg;
		float *one;
		uint64_t b0, alone, padded;
		int rc, tok[2] = { 7, 0 }, pos[2] = { 3, 0 }, slot[2];
		const int *tab[2];

		ck_assert_msg(!dps_shard_load(&sd, NULL, &par, model_path("moe"),
					      &(struct dps_shard_opts){ .max_pos = 16, .max_rows = 4 },
					      err, sizeof(err)), "%s", err);
		ck_assert_ptr_nonnull(dps_shard_step(&sd, 1, 3, prompt, pos3, seq3, NULL, &rc));
		tab[0] = tab[1] = sd.seq_tables; /* sequence 0's blocks */
		slot[0] = 3;
		slot[1] = DPS_PAD_SLOT;
		b0 = sd.moe_bytes;
		lg = dps_shard_step_rows(&sd, 0, &(struct dps_rows){ 1, tok, pos, slot, tab, NULL },
					 &rc);
		ck_assert_ptr_nonnull(lg);
		alone = sd.moe_bytes - b0;
		one = malloc(sizeof(float) * (size_t)sd.cfg.vocab_size);
		memcpy(one, lg, sizeof(float) * (size_t)sd.cfg.vocab_size);
		b0 = sd.moe_bytes;
		lg = dps_shard_step_rows(&sd, 0, &(struct dps_rows){ 2, tok, pos, slot, tab, NULL },
					 &rc);
		ck_assert_ptr_nonnull(lg);
		padded = sd.moe_bytes - b0;
		ck_assert_uint_gt(alone, 0);
		ck_assert_uint_eq(padded, alone);
		ck_assert(!memcmp(one, lg, sizeof(float) * (size_t)sd.cfg.vocab_size));
		free(one);
		dps_shard_free(&sd);
	}
}
END_TEST

START_TEST(test_moe_rules)
{
	struct dps_model_config moe = { 0 }, dense = { 0 };
	char err[1024];
	struct dps_par_cfg p;

	ck_assert(!dps_model_config_load(model_path("moe"), &moe, err, sizeof(err)));
	ck_assert(!dps_model_config_load(model_path("gqa"), &dense, err, sizeof(err)));
	/* EP on a dense model */
	p = moe_par((int[]){ 1, 2, 1, 1, 1, 1, 1, 0 });
	ck_assert_int_eq(dps_shard_check(&dense, &p, err, sizeof(err)), -DPS_ECONFIG);
	ck_assert_ptr_nonnull(strstr(err, "has no experts"));
	/* 32 experts over TP=3 x DP=2 = 6 ranks */
	p = moe_par((int[]){ 3, 2, 1, 1, 1, 1, 1, 0 });
	ck_assert_int_eq(dps_shard_check(&moe, &p, err, sizeof(err)), -DPS_ECONFIG);
	ck_assert_ptr_nonnull(strstr(err, "32 does not divide by 6"));
	p.ep = 0; /* without EP the experts are sharded like the MLP: fine */
	ck_assert_int_eq(dps_shard_check(&moe, &p, err, sizeof(err)), 0);
	/* --mlp-dp-size 2 with EP on the all-gather dispatch, given or by default */
	for (int a2a = 0; a2a < 2; a2a++) {
		p = moe_par((int[]){ 1, 2, 1, 1, 2, 1, 1, a2a });
		ck_assert_int_eq(dps_par_cfg_check(&p, err, sizeof(err)), -DPS_ECONFIG);
		ck_assert_ptr_nonnull(strstr(err, "--mlp-dp-size 2"));
		ck_assert_ptr_nonnull(strstr(err, "gather them again"));
	}
	/* ... allowed with all-to-all-v; --draft-mlp-dp-size allowed with either */
	p = moe_par((int[]){ 1, 2, 1, 1, 2, 1, 1, 2 });
	ck_assert_int_eq(dps_par_cfg_check(&p, err, sizeof(err)), 0);
	p = moe_par((int[]){ 1, 2, 1, 1, 1, 1, 1, 1 });
	p.draft_mlp_dp = 2;
	ck_assert_int_eq(dps_par_cfg_check(&p, err, sizeof(err)), 0);
	ck_assert_int_eq(dps_shard_check(&moe, &p, err, sizeof(err)), 0);
	/* a backend without EP */
	p = moe_par((int[]){ 1, 2, 1, 1, 1, 1, 0, 2 });
	ck_assert_int_eq(dps_par_cfg_check(&p, err, sizeof(err)), -DPS_ECONFIG);
	ck_assert_ptr_nonnull(strstr(err, "needs --enable-expert-parallel"));
	/* and the load itself refuses (a rank started with a bad layout) */
	{
		struct dps_shard sd;

		p = moe_par((int[]){ 1, 1, 1, 1, 1, 1, 1, 0 });
		ck_assert_int_eq(dps_shard_load(&sd, NULL, &p, model_path("gqa"), NULL, err,
						sizeof(err)), -DPS_ECONFIG);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("shard");
	TCase *tc = tcase_create("equivalence");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	for (int i = 0; i < NCONFIGS; i++)
		if (configs[i][0] * configs[i][2] <= 6)
			gqa_idx[n_gqa++] = i;
	tcase_add_loop_test(tc, test_gqa_configs, 0, n_gqa);
	tcase_add_loop_test(tc, test_mha_configs, 0, NCONFIGS);
	tcase_add_loop_test(tc, test_32_ranks, 0, 2);
	tcase_add_loop_test(tc, test_stories260k, 0, 4);
	tcase_add_loop_test(tc, test_in_place, 0, 3);
	tcase_add_test(tc, test_draft_mlp_size_changes_nothing);
	tcase_add_test(tc, test_mismatch_caught);
	tcase_add_test(tc, test_collective_counts);
	tcase_add_test(tc, test_bytes_fall);
	tcase_add_loop_test(tc, test_decode_only, 0, 12);
	suite_add_tcase(s, tc);
	tc = tcase_create("moe");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_moe_configs, 0, NMOE);
	tcase_add_loop_test(tc, test_moe_32_ranks, 0, 2);
	tcase_add_test(tc, test_moe_dispatch_counts);
	tcase_add_test(tc, test_moe_padding_reads_no_expert);
	tcase_add_test(tc, test_moe_rules);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

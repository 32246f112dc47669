/* SPDX-License-Identifier: MIT */
/*
 * tests/check_shard_units.c - the pieces of engine/shard/shard.c one at a time, each against a hand
 * computation, as real rank processes under the supervisor (--cpu-bind off).
 *
 * - dps_dp_transition on rows whose values encode (TP position, replica, row, column): down
 *   (4->2, 4->1, 6->3, 6->2), up (1->2, 2->4, 1->4, 3->6, ...), sizes that do not nest (3->2
 *   and 2->3 at DP=6), no-ops, and round trips that must give back the input bit for bit.
 *   Every rank checks its output rows, and that nothing past them was written. Fault: the
 *   reference's plain narrow applied to 3->2 keeps the wrong replicas and is reported.
 * - Loaders: each rank's embedding and LM-head shards (prefill by TP rank, decode by group
 *   rank j*TP + t, j = d mod c) against the rows of the full tensors read in the test process,
 *   zero past the vocabulary, with a vocabulary (300) and intermediate size (100) that do not
 *   divide and a 10-token vocabulary where whole shards lie past its end; and the weight bytes
 *   of every part against the sizes of docs/DESIGN.md section 3. The layer weights live in a struct
 *   private to shard.c, so the MLP and attention are checked by their byte counts only (their
 *   rows are covered end to end by tests/check_shard.c). Fault: expecting the decode shards at
 *   the plain TP rank is reported.
 * - A decode step of padding rows (seq < 0) leaves the KV cache byte for byte unchanged, on
 *   one rank and with replicas coupled by the MLP, the attention (both K/V variants) or both;
 *   the control, a real row, changes exactly its own slot in every layer.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/dps.h"
#include "tests/testutil.h"
#include "engine/model/ckpt.h"
#include "engine/model/mkmodel.h"
#include "engine/shard/shard.h"
#include "engine/runtime/supervisor.h"
#include "kernels/gemm.h"

/* Shared with the forked ranks. */
struct shared {
	_Atomic int mismatches, checked, first_taken;
	char first[512];
};

static struct shared *sh;
static char dir[64];

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void note(const char *fmt, ...)
{
	int expected = 0;
	va_list ap;

	sh->mismatches++;
	if (atomic_compare_exchange_strong(&sh->first_taken, &expected, 1)) {
		va_start(ap, fmt);
		vsnprintf(sh->first, sizeof(sh->first), fmt, ap);
		va_end(ap);
	}
}

static void setup(void)
{
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(sh, MAP_FAILED);
	test_tmpdir_make(dir, sizeof(dir), "shard-units");
}

static void teardown(void)
{
	test_tmpdir_remove(dir);
	munmap(sh, sizeof(*sh));
}

/* Runs fn on every rank of par; fails the test when the instance does not finish cleanly. */
static void run(struct dps_par_cfg par, dps_rank_fn fn, void *arg)
{
	struct dps_sup_opts o = { .par = par, .rank_fn = fn, .rank_arg = arg, .cpu_bind = "off" };
	struct dps_sup_result res;
	char err[512] = "";
	int rc;

	memset(sh, 0, sizeof(*sh));
	rc = dps_sup_run(&o, &res, err, sizeof(err));
	ck_assert_msg(rc == 0, "TP=%d DP=%d attn=%d emb=%d mlp=%d lm=%d: %s (first note: %s)",
		      par.tp, par.dp, par.attn_dp, par.emb_dp, par.mlp_dp, par.lm_head_dp, err,
		      sh->first);
}

static void expect_clean(struct dps_par_cfg par)
{
	ck_assert_msg(sh->mismatches == 0,
		      "TP=%d DP=%d attn=%d emb=%d mlp=%d lm=%d: %d mismatches, first: %s", par.tp,
		      par.dp, par.attn_dp, par.emb_dp, par.mlp_dp, par.lm_head_dp,
		      (int)sh->mismatches, sh->first);
	ck_assert_int_gt(sh->checked, 0);
}

/* TP, DP, attention, embedding, MLP, LM head (draft MLP 1). */
static struct dps_par_cfg par_of(const int *c)
{
	struct dps_par_cfg p = { c[0], c[1], c[2], c[3], c[4], 1, c[5] };

	return p;
}

/* ---- _dp_transition ------------------------------------------------------------------------ */

/*
 * A row value names where it came from: TP position t, replica, row of that replica, column.
 * Exact in float (below 2^24) for t < 16 and replica, row, column < 100.
 */
static float enc(int t, int replica, int row, int col)
{
	return (float)(t * 1000000 + replica * 10000 + row * 100 + col);
}

/* buf = the rows gathered over the column of size c that holds replica d (block j from
 * replica (d / c) * c + j), as the decode graph holds them at TP position t. */
static void fill_gathered(float *buf, int t, int d, int c, int rows, int cols)
{
	for (int j = 0; j < c; j++)
		for (int i = 0; i < rows; i++)
			for (int k = 0; k < cols; k++)
				buf[((size_t)j * rows + (size_t)i) * cols + (size_t)k] =
					enc(t, d / c * c + j, i, k);
}

#define SENTINEL (-12345.0f)

/* Checks out against the gathered rows of size c, and the sentinel in the `spare` rows after. */
static void check_gathered(const float *out, int t, int d, int c, int rows, int cols, int spare,
			   int rank, const char *what)
{
	const size_t n = (size_t)c * (size_t)rows * (size_t)cols;

	for (size_t q = 0; q < n; q++) {
		const int j = (int)(q / ((size_t)rows * cols)), i = (int)(q / cols % rows);
		const int k = (int)(q % cols), replica = d / c * c + j;

		if (out[q] != enc(t, replica, i, k)) {
			note("rank %d (DP %d, TP %d) %s: block %d row %d col %d is %.0f, want %.0f "
			     "(replica %d)", rank, d, t, what, j, i, k, (double)out[q],
			     (double)enc(t, replica, i, k), replica);
			return;
		}
	}
	for (size_t q = n; q < n + (size_t)spare * cols; q++)
		if (out[q] != SENTINEL) {
			note("rank %d %s: wrote past its %d rows", rank, what, c * rows);
			return;
		}
	sh->checked++;
}

struct tr_case {
	int from, to, rows, cols;
	int back; /* then transition back to from: must give the input bit for bit */
};

struct tr_arg {
	const struct tr_case *cases;
	int n;
	int ref_narrow; /* fault: the reference's narrow for every down transition, nested or not */
};

/* The column of size c this rank is in (that of a component of that size), or NULL. */
static struct dps_comm *col_of_size(struct dps_world *w, int c)
{
	for (int k = 0; k < DPS_COMP_COUNT; k++)
		if (dps_par_cfg_comp_size(&w->lay->groups.cfg, (enum dps_comp)k) == c)
			return w->dp_col_c[k];
	return NULL;
}

/* The reference's slice, with rank_in_group d mod from, clipped to the input (zero beyond). */
static void ref_narrow(const float *x, float *out, int d, int rows, int cols, int from, int to)
{
	const size_t per = (size_t)rows * cols, total = per * (size_t)from;
	const size_t start = (size_t)((d % from) / to) * (size_t)to * per;

	for (size_t q = 0; q < per * (size_t)to; q++)
		out[q] = start + q < total ? x[start + q] : 0.0f;
}

static int transition(struct dps_shard *s, const struct tr_arg *a, const float *x, float *out,
		      int rows, int cols, int from, int to, int *rc)
{
	struct dps_comm *to_col = col_of_size(s->w, to);

	if (!to_col || to_col->n != to) {
		note("rank %d: no DP column of size %d", s->w->rank, to);
		return -1;
	}
	if (a->ref_narrow && from > to) {
		ref_narrow(x, out, s->d, rows, cols, from, to);
		return 0;
	}
	*rc = dps_dp_transition(s, x, out, rows, cols, from, to, to_col, DPS_SG_DP);
	return *rc ? -1 : 0;
}

/* One case on this rank: the transition, its check, and the way back when asked. */
static int tr_case_run(struct dps_shard *s, const struct tr_arg *a, const struct tr_case *tc)
{
	const int big = tc->from > tc->to ? tc->from : tc->to, spare = 2 * tc->rows;
	const int rank = s->w->rank, rows = tc->rows, cols = tc->cols;
	const size_t n = (size_t)(big + 2) * (size_t)rows * (size_t)cols;
	float *x = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
	float *back = malloc(n * sizeof(float));
	char what[64];
	int rc = 0;

	if (!x || !out || !back) {
		rc = -ENOMEM;
		goto out;
	}
	fill_gathered(x, s->t, s->d, tc->from, rows, cols);
	for (size_t q = 0; q < n; q++)
		out[q] = back[q] = SENTINEL;
	snprintf(what, sizeof(what), "%d->%d (%d rows)", tc->from, tc->to, rows);
	if (!transition(s, a, x, out, rows, cols, tc->from, tc->to, &rc))
		check_gathered(out, s->t, s->d, tc->to, rows, cols, spare, rank, what);
	if (rc || !tc->back)
		goto out;
	snprintf(what, sizeof(what), "%d->%d->%d (%d rows)", tc->from, tc->to, tc->from, rows);
	if (transition(s, a, out, back, rows, cols, tc->to, tc->from, &rc))
		goto out;
	if (memcmp(back, x, sizeof(float) * (size_t)tc->from * (size_t)rows * (size_t)cols))
		note("rank %d (DP %d) %s: not the input", rank, s->d, what);
	else
		sh->checked++;
out:
	free(x);
	free(out);
	free(back);
	return rc;
}

static int tr_rank(struct dps_world *w, void *argp)
{
	const struct tr_arg *a = argp;
	struct dps_shard s;
	int rc = 0;

	memset(&s, 0, sizeof(s));
	s.w = w;
	s.t = w->tp_rank;
	s.d = w->dp_rank;
	for (int k = 0; k < a->n && !rc; k++)
		rc = tr_case_run(&s, a, &a->cases[k]);
	return rc;
}

/* TP=2 x DP=4 with columns of 4 (attention), 2 (embedding) and 1 (the rest). */
static const struct tr_case tr_nested[] = {
	{ 4, 2, 3, 5, 0 }, { 4, 1, 3, 5, 0 }, { 2, 1, 3, 5, 0 }, { 1, 2, 3, 5, 0 },
	{ 2, 4, 3, 5, 0 }, { 1, 4, 3, 5, 0 }, { 2, 2, 3, 5, 0 }, { 4, 4, 1, 7, 0 },
	{ 4, 2, 3, 5, 1 }, { 4, 1, 2, 4, 1 }, { 2, 1, 1, 6, 1 }, { 4, 2, 1, 1, 1 },
};

/* DP=6 with columns of 3 (attention), 2 (embedding), 6 (MLP) and 1 (the rest). */
static const struct tr_case tr_dp6[] = {
	{ 3, 2, 3, 5, 0 }, { 2, 3, 3, 5, 0 }, { 6, 3, 2, 4, 0 }, { 6, 2, 2, 4, 0 },
	{ 3, 6, 2, 4, 0 }, { 2, 6, 2, 4, 0 }, { 3, 1, 3, 5, 0 }, { 1, 3, 3, 5, 0 },
	{ 6, 1, 1, 3, 0 }, { 1, 6, 1, 3, 0 },
	{ 3, 2, 3, 5, 1 }, { 2, 3, 3, 5, 1 }, { 6, 2, 2, 4, 1 }, { 6, 3, 1, 2, 1 },
};

#define NELEM(a) (int)(sizeof(a) / sizeof((a)[0]))

START_TEST(test_transition_nested)
{
	const struct dps_par_cfg par = { 2, 4, 4, 2, 1, 1, 1 };
	struct tr_arg a = { tr_nested, NELEM(tr_nested), 0 };

	run(par, tr_rank, &a);
	expect_clean(par);
	/* Every rank checked every case, and every round trip once more. */
	ck_assert_int_eq(sh->checked, 8 * (NELEM(tr_nested) + 4));
}
END_TEST

START_TEST(test_transition_dp6)
{
	/* DP=6: 3 and 2 do not nest; TP 1 and 2 (the columns are per TP position). */
	const struct dps_par_cfg par = { 1 + _i, 6, 3, 2, 6, 1, 1 };
	struct tr_arg a = { tr_dp6, NELEM(tr_dp6), 0 };

	run(par, tr_rank, &a);
	expect_clean(par);
	ck_assert_int_eq(sh->checked, 6 * par.tp * (NELEM(tr_dp6) + 4));
}
END_TEST

START_TEST(test_transition_fault_caught)
{
	/* The reference's narrow on 3 -> 2 keeps replicas of the wrong column: the check sees it. */
	static const struct tr_case cases[] = { { 3, 2, 3, 5, 0 } };
	const struct dps_par_cfg par = { 1, 6, 3, 2, 1, 1, 1 };
	struct tr_arg a = { cases, 1, 1 };

	run(par, tr_rank, &a);
	ck_assert_int_gt(sh->mismatches, 0);
	ck_assert_ptr_nonnull(strstr(sh->first, "3->2"));
	/* The nested 4 -> 2 is the same under the reference's narrow, so it passes the same check. */
	{
		static const struct tr_case nested[] = { { 4, 2, 3, 5, 0 }, { 4, 1, 3, 5, 0 } };
		struct tr_arg b = { nested, 2, 1 };

		run((struct dps_par_cfg){ 2, 4, 4, 2, 1, 1, 1 }, tr_rank, &b);
		ck_assert_int_eq(sh->mismatches, 0);
		ck_assert_int_eq(sh->checked, 16);
	}
}
END_TEST

/* ---- loaders ------------------------------------------------------------------------------- */

/* The full tensors, read in the test process before the ranks fork. */
static struct {
	struct dps_model_config cfg;
	float *emb, *lm; /* (vocab, hidden) */
} full;

static void load_full(const char *model)
{
	struct dps_ckpt ck;
	char err[256];
	const struct dps_model_config *c;
	uint64_t shape[2];

	ck_assert_msg(!dps_ckpt_open(&ck, model, err, sizeof(err)), "%s", err);
	c = &ck.cfg;
	full.cfg = *c;
	shape[0] = (uint64_t)c->vocab_size;
	shape[1] = (uint64_t)c->hidden_size;
	full.emb = calloc(shape[0] * shape[1], sizeof(float));
	full.lm = calloc(shape[0] * shape[1], sizeof(float));
	ck_assert(full.emb && full.lm);
	ck_assert_msg(!dps_ckpt_load_range(&ck, "model.embed_tokens.weight", 2, shape, 0, 0,
					   shape[0], full.emb, err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_ckpt_load_range(&ck, c->tie_word_embeddings ? "model.embed_tokens.weight"
									: "lm_head.weight",
					   2, shape, 0, 0, shape[0], full.lm, err, sizeof(err)),
		      "%s", err);
	dps_ckpt_close(&ck);
}

static void free_full(void)
{
	free(full.emb);
	free(full.lm);
	memset(&full, 0, sizeof(full));
}

struct load_arg {
	const char *model;
	int fault; /* expect the decode shards at the plain TP rank */
};

static int ceil_div(int a, int b)
{
	return (a + b - 1) / b;
}

/* shard (n, hidden) must be rows [first, first + n) of tensor (vocab, hidden), zero past it. */
static void check_rows(const float *shard, const float *tensor, int first, int n, int rank,
		       const char *what)
{
	const int V = full.cfg.vocab_size, dim = full.cfg.hidden_size;

	for (int r = 0; r < n; r++) {
		const int src = first + r;

		for (int k = 0; k < dim; k++) {
			const float got = shard[(size_t)r * dim + (size_t)k];
			const float want = src < V ? tensor[(size_t)src * dim + (size_t)k] : 0.0f;

			if (memcmp(&got, &want, sizeof(float))) {
				note("rank %d %s: row %d (vocabulary %d) col %d is %g, want %g",
				     rank, what, r, src, k, (double)got, (double)want);
				return;
			}
		}
	}
	sh->checked++;
}

/* KV heads read by the real query heads of TP position t (hq_t heads each), at least 1. */
static int kv_heads_read(const struct dps_model_config *c, int t, int hq_t)
{
	const int group = c->num_attention_heads / c->num_key_value_heads;
	int n = 0, last = -1;

	for (int h = t * hq_t; h < (t + 1) * hq_t && h < c->num_attention_heads; h++)
		if (h / group != last) { /* consecutive heads share a KV head in order */
			last = h / group;
			n++;
		}
	return n ? n : 1;
}

static void check_bytes(const struct dps_shard *s, int rank)
{
	const struct dps_model_config *c = &full.cfg;
	const size_t f = sizeof(float), dim = (size_t)c->hidden_size, hd = (size_t)c->head_dim;
	const size_t L = (size_t)c->num_hidden_layers;
	const int tp = s->par.tp, ca = s->par.attn_dp, ce = s->par.emb_dp;
	const int cm = s->par.mlp_dp, cl = s->par.lm_head_dp;
	const int hq_t = ceil_div(c->num_attention_heads, tp * ca) * ca, hq_e = hq_t / ca;
	const int kv_eff = ca > 1 && c->num_key_value_heads % (tp * ca) == 0;
	const size_t nkv_t = (size_t)kv_heads_read(c, s->t, hq_t);
	const size_t nkv_e = kv_eff ? (size_t)(c->num_key_value_heads / (tp * ca)) : 0;
	size_t want[DPS_PART_COUNT] = { 0 };

	want[DPS_PART_EMB_PREFILL] = (size_t)ceil_div(c->vocab_size, tp) * dim * f;
	want[DPS_PART_EMB_DECODE] = ce > 1 ? (size_t)ceil_div(c->vocab_size, tp * ce) * dim * f : 0;
	want[DPS_PART_LM_PREFILL] = want[DPS_PART_EMB_PREFILL];
	want[DPS_PART_LM_DECODE] = cl > 1 ? (size_t)ceil_div(c->vocab_size, tp * cl) * dim * f : 0;
	want[DPS_PART_MLP] = L * 3 * (size_t)ceil_div(c->intermediate_size, tp * cm) * dim * f;
	want[DPS_PART_NORMS] = (2 * L + 1) * dim * f;
	want[DPS_PART_ATTN_PREFILL] =
		L * (((size_t)hq_t + 2 * nkv_t) * hd * dim + dim * (size_t)hq_t * hd) * f;
	if (ca > 1)
		want[DPS_PART_ATTN_DECODE] =
			L * (((size_t)hq_e + 2 * nkv_e) * hd * dim + dim * (size_t)hq_e * hd) * f;
	for (int p = 0; p < DPS_PART_COUNT; p++)
		if (s->bytes[p] != want[p]) {
			note("rank %d: %s holds %zu bytes, want %zu", rank,
			     dps_shard_part_name((enum dps_shard_part)p), s->bytes[p], want[p]);
			return;
		}
	sh->checked++;
}

static int load_rank(struct dps_world *w, void *argp)
{
	const struct load_arg *a = argp;
	const struct dps_par_cfg *par = &w->lay->groups.cfg;
	const int V = full.cfg.vocab_size, tp = par->tp, t = w->tp_rank, d = w->dp_rank;
	const int ce = par->emb_dp, cl = par->lm_head_dp;
	const int v_tp = ceil_div(V, tp), v_emb = ceil_div(V, tp * ce), v_lm = ceil_div(V, tp * cl);
	const int im_sh = ceil_div(full.cfg.intermediate_size, tp * par->mlp_dp);
	/* Group ranks: j*TP + t with j = d mod c (the fault: the plain TP rank). */
	const int g_emb = a->fault ? t : d % ce * tp + t, g_lm = a->fault ? t : d % cl * tp + t;
	struct dps_shard s;
	char err[512], msg[256];
	int rc;

	dps_gemm_setup("auto", 1, msg, sizeof(msg));
	rc = dps_shard_load(&s, w, par, a->model,
			    &(struct dps_shard_opts){ .max_pos = 8, .max_seqs = 1, .max_rows = 2 },
			    err, sizeof(err));
	if (rc) {
		note("rank %d: %s", w->rank, err);
		return rc;
	}
	if (s.v_tp != v_tp || s.v_emb != v_emb || s.v_lm != v_lm || s.im_sh != im_sh)
		note("rank %d: rows per shard %d %d %d %d, want %d %d %d %d (TP, emb, LM, MLP)",
		     w->rank, s.v_tp, s.v_emb, s.v_lm, s.im_sh, v_tp, v_emb, v_lm, im_sh);
	if ((ce == 1 && s.emb_d != s.emb_p) || (cl == 1 && s.lm_d != s.lm_p))
		note("rank %d: a component of size 1 holds a second copy of its shard", w->rank);
	check_rows(s.emb_p, full.emb, t * v_tp, v_tp, w->rank, "embedding (prefill)");
	check_rows(s.emb_d, full.emb, g_emb * v_emb, v_emb, w->rank, "embedding (decode)");
	check_rows(s.lm_p, full.lm, t * v_tp, v_tp, w->rank, "LM head (prefill)");
	check_rows(s.lm_d, full.lm, g_lm * v_lm, v_lm, w->rank, "LM head (decode)");
	check_bytes(&s, w->rank);
	dps_shard_free(&s);
	return 0;
}

static char *model_path(const char *sub)
{
	static char p[128];

	snprintf(p, sizeof(p), "%s/%s", dir, sub);
	return p;
}

static void make_model(const char *sub, const struct dps_model_config *c)
{
	char err[256];

	ck_assert_msg(!dps_mkmodel(c, 3, DPS_ST_F32, model_path(sub), err, sizeof(err)), "%s", err);
}

/* TP, DP, attention, embedding, MLP, LM head: on tiny-gqa (vocabulary 300, intermediate 100). */
static const int load_cfgs[][6] = {
	{ 1, 1, 1, 1, 1, 1 }, { 2, 2, 1, 2, 2, 2 }, /* everything divides */
	{ 4, 2, 1, 2, 1, 2 }, /* 300 over 8: 38 rows, the last shard 34 and 4 zero rows */
	{ 3, 2, 2, 2, 2, 1 }, /* 100 over 6: 17 rows, the last 15 */
	{ 1, 6, 3, 6, 3, 2 }, /* 100 over 3: 34 rows; embedding over 6, LM head over 2 */
	{ 2, 4, 1, 4, 4, 4 }, /* 300 over 8 and 100 over 8 */
	{ 1, 4, 2, 4, 1, 2 }, { 2, 3, 3, 1, 3, 3 }, { 3, 1, 1, 1, 1, 1 },
};

START_TEST(test_load_shards)
{
	const struct dps_par_cfg par = par_of(load_cfgs[_i]);
	struct load_arg a = { model_path("gqa"), 0 };

	make_model("gqa", &dps_mkmodel_preset("tiny-gqa")->cfg);
	load_full(a.model);
	run(par, load_rank, &a);
	expect_clean(par);
	ck_assert_int_eq(sh->checked, 5 * par.tp * par.dp);
	free_full();
}
END_TEST

/*
 * A 10-token vocabulary. TP 2 x embedding 4: 8 decode shards of 2 rows, shards 5, 6 and 7
 * wholly past its end. TP 3: prefill shards of 4 rows, the last with 2 zero rows; embedding 2
 * makes 6 shards of 2 rows, the last past the end. TP 4: prefill shards of 3 rows.
 */
static const int v10_cfgs[][6] = { { 2, 4, 1, 4, 4, 4 }, { 3, 2, 1, 2, 1, 2 },
				   { 4, 2, 1, 2, 2, 1 } };

START_TEST(test_load_past_vocabulary)
{
	struct dps_model_config c = dps_mkmodel_preset("tiny-gqa")->cfg;
	const struct dps_par_cfg par = par_of(v10_cfgs[_i]);
	struct load_arg a = { model_path("v10"), 0 };

	c.vocab_size = 10;
	make_model("v10", &c);
	load_full(a.model);
	run(par, load_rank, &a);
	expect_clean(par);
	ck_assert_int_eq(sh->checked, 5 * par.tp * par.dp);
	free_full();
}
END_TEST

START_TEST(test_load_fault_caught)
{
	/* Expecting the decode shards at the TP rank (no group rank) is wrong wherever j > 0. */
	const struct dps_par_cfg par = par_of((int[]){ 2, 2, 1, 2, 1, 2 });
	struct load_arg a = { model_path("gqa"), 1 };

	make_model("gqa", &dps_mkmodel_preset("tiny-gqa")->cfg);
	load_full(a.model);
	run(par, load_rank, &a);
	ck_assert_int_gt(sh->mismatches, 0);
	ck_assert_ptr_nonnull(strstr(sh->first, "(decode)"));
	free_full();
}
END_TEST

/* ---- a dummy batch and the KV cache -------------------------------------------------------- */

#define PROMPT_LEN 4
#define KV_MAXPOS 12
#define KV_SEQS 2

struct kv_arg {
	const char *model;
};

/*
 * The first float of either cache that differs from its snapshot, skipping floats
 * [skip, skip + len) of every layer; n (the cache size) when there is none.
 */
static size_t cache_diff(const struct dps_shard *s, const float *key0, const float *val0,
			 size_t skip, size_t len)
{
	const size_t n = s->cache_bytes / 2 / sizeof(float);
	/* The cache is (layers, blocks, block_size, kv): a layer is num_blocks * block_size slots. */
	const size_t layer = (size_t)s->num_blocks * (size_t)s->block_size * (size_t)s->nkv_t * s->hd;

	for (size_t q = 0; q < n; q++) {
		if (q % layer - skip < len) /* unsigned: false below skip */
			continue;
		if (memcmp(&s->key_cache[q], &key0[q], sizeof(float)) ||
		    memcmp(&s->value_cache[q], &val0[q], sizeof(float)))
			return q;
	}
	return n;
}

/*
 * Compares the caches with their snapshot. A padding step must leave them equal; a real row
 * (seq 0, position pos) must change its slot in every layer and nothing else.
 */
static void check_cache(const struct dps_shard *s, const float *key0, const float *val0,
			int real, int pos, int rank, const char *what)
{
	/* dps_shard_step's sequence k owns blocks [k * bps, (k + 1) * bps). */
	const size_t kv = (size_t)s->nkv_t * (size_t)s->hd;
	const size_t seq = (size_t)s->bps * (size_t)s->block_size * kv;
	const size_t layer = (size_t)s->num_blocks * (size_t)s->block_size * kv;
	const size_t n = s->cache_bytes / 2 / sizeof(float);
	const size_t slot = (size_t)pos * kv; /* seq 0 */
	size_t q;

	if (!real) {
		q = cache_diff(s, key0, val0, 0, 0);
		if (q < n)
			note("rank %d %s: padding rows wrote the KV cache at layer %zu seq %zu "
			     "position %zu", rank, what, q / layer, q % layer / seq, q % seq / kv);
		else
			sh->checked++;
		return;
	}
	for (size_t l = 0; l < (size_t)s->cfg.num_hidden_layers; l++)
		if (!memcmp(s->key_cache + l * layer + slot, key0 + l * layer + slot,
			    kv * sizeof(float)) ||
		    !memcmp(s->value_cache + l * layer + slot, val0 + l * layer + slot,
			    kv * sizeof(float))) {
			note("rank %d %s: the real row left layer %zu unchanged", rank, what, l);
			return;
		}
	q = cache_diff(s, key0, val0, slot, kv);
	if (q < n)
		note("rank %d %s: the real row also wrote layer %zu seq %zu position %zu", rank,
		     what, q / layer, q % layer / seq, q % seq / kv);
	else
		sh->checked++;
}

static int kv_rank(struct dps_world *w, void *argp)
{
	const struct kv_arg *a = argp;
	static const int prompt[2][PROMPT_LEN] = { { 1, 5, 9, 13 }, { 1, 200, 3, 4 } };
	const int d = w->dp_rank;
	struct dps_shard s;
	char err[512], msg[256];
	int rc, pos[PROMPT_LEN], seq[PROMPT_LEN] = { 0 };
	float *key0 = NULL, *val0 = NULL;

	dps_gemm_setup("auto", 1, msg, sizeof(msg));
	rc = dps_shard_load(&s, w, &w->lay->groups.cfg, a->model,
			    &(struct dps_shard_opts){ .max_pos = KV_MAXPOS, .max_seqs = KV_SEQS,
						      .max_rows = PROMPT_LEN },
			    err, sizeof(err));
	if (rc) {
		note("rank %d: %s", w->rank, err);
		return rc;
	}
	for (int i = 0; i < PROMPT_LEN; i++)
		pos[i] = i;
	if (!dps_shard_step(&s, 1, PROMPT_LEN, prompt[d % 2], pos, seq, NULL, &rc))
		goto out;
	key0 = malloc(s.cache_bytes / 2);
	val0 = malloc(s.cache_bytes / 2);
	if (!key0 || !val0) {
		rc = -ENOMEM;
		goto out;
	}
	/*
	 * Two decode steps of 2 rows. In step k replica d runs a dummy batch when k + d is even
	 * (both rows padding, at the position a real row would write and at position 0, over
	 * data), else a real batch (row 0 of sequence 0 at the next position, row 1 padding).
	 */
	for (int k = 0, reals = 0; k < 2; k++) {
		const int dummy = (k + d) % 2 == 0, next = PROMPT_LEN + reals;
		const int tok[2] = { 7 + k, 11 }, p[2] = { next, 0 };
		const int sq[2] = { dummy ? -1 : 0, -1 };
		const float *lg;

		memcpy(key0, s.key_cache, s.cache_bytes / 2);
		memcpy(val0, s.value_cache, s.cache_bytes / 2);
		lg = dps_shard_step(&s, 0, 2, tok, p, sq, NULL, &rc);
		if (!lg)
			goto out;
		if (!dummy && !isfinite(lg[0]))
			note("rank %d: the real row's logits are not finite", w->rank);
		check_cache(&s, key0, val0, !dummy, next, w->rank,
			    dummy ? "dummy step" : "real step");
		reals += !dummy;
	}
out:
	if (rc)
		note("rank %d: a step failed (%d)", w->rank, rc);
	free(key0);
	free(val0);
	dps_shard_free(&s);
	return rc;
}

/* TP, DP, attention, embedding, MLP, LM head. */
static const int kv_cfgs[][6] = {
	{ 1, 1, 1, 1, 1, 1 }, /* one rank */
	{ 1, 2, 1, 1, 2, 1 }, /* coupled by the MLP */
	{ 1, 2, 2, 2, 2, 2 }, /* attention over 2 with K/V by effective rank (2 KV heads over 2) */
	{ 2, 2, 2, 1, 2, 1 }, /* attention over TP x 2 with K/V by TP rank */
};

START_TEST(test_dummy_batch_cache)
{
	const struct dps_par_cfg par = par_of(kv_cfgs[_i]);
	struct kv_arg a = { model_path("gqa") };

	make_model("gqa", &dps_mkmodel_preset("tiny-gqa")->cfg);
	run(par, kv_rank, &a);
	expect_clean(par);
	/* Every rank checked one dummy and one real step. */
	ck_assert_int_eq(sh->checked, 2 * par.tp * par.dp);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("shard_units");
	TCase *tr = tcase_create("dp_transition");
	TCase *ld = tcase_create("loaders");
	TCase *kv = tcase_create("dummy_batch");

	tcase_add_checked_fixture(tr, setup, teardown);
	tcase_set_timeout(tr, 120);
	tcase_add_test(tr, test_transition_nested);
	tcase_add_loop_test(tr, test_transition_dp6, 0, 2);
	tcase_add_test(tr, test_transition_fault_caught);
	suite_add_tcase(s, tr);

	tcase_add_checked_fixture(ld, setup, teardown);
	tcase_set_timeout(ld, 120);
	tcase_add_loop_test(ld, test_load_shards, 0, NELEM(load_cfgs));
	tcase_add_loop_test(ld, test_load_past_vocabulary, 0, NELEM(v10_cfgs));
	tcase_add_test(ld, test_load_fault_caught);
	suite_add_tcase(s, ld);

	tcase_add_checked_fixture(kv, setup, teardown);
	tcase_set_timeout(kv, 120);
	tcase_add_loop_test(kv, test_dummy_batch_cache, 0, NELEM(kv_cfgs));
	suite_add_tcase(s, kv);
	return test_run_suite(s);
}

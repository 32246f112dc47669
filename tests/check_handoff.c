/* SPDX-License-Identifier: MIT */
/*
 * tests/check_handoff.c - Check suite for the disaggregated hand-off (docs/DESIGN.md section 3,
 * "Disaggregated prefill"): one instance forks a decode part (any TP x DP with component sizes
 * and expert parallelism) and prefill replicas of plain TP; the prefill ranks prefill every
 * prompt into their caches, which live in the instance's KV share, real shared memory between
 * real processes; the decode ranks, holding the decode layouts only, pull each prompt's
 * positions head by head (dps_shard_kv_pull) and decode from the prefill's first token. The
 * oracle is the one-process model: the prefill's logits and first token, and every decode
 * position's, must match it (logits within 1e-4, the same greedy tokens), with no
 * recomputation on the decode side. A pull from the wrong heads is caught.
 */
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/runtime/supervisor.h"
#include "engine/model/mkmodel.h"
#include "engine/shard/kv.h"
#include "engine/shard/shard.h"
#include "kernels/gemm.h"
#include "tests/model_oracle.h"
#include "tests/shard_loop.h"
#include "tests/testutil.h"

#define NPROMPT 5
#define MAXPOS 24
static const int prompts[NPROMPT][8] = {
	{ 1, 5, 9, 13 }, { 1 }, { 1, 200, 3, 4, 5, 6, 7 }, { 1, 42 }, { 1, 17, 18 },
};
static const int prompt_len[NPROMPT] = { 4, 1, 7, 2, 3 };

static char dir[64];
static struct model_oracle orc;

/* Shared with the forked ranks. */
struct shared {
	_Atomic int mismatches, checked, pulled;
	_Atomic int prefill_done, decode_done;  /* ranks of each part finished */
	_Atomic int first[NPROMPT];             /* the prefill's token of each prompt */
	_Atomic int first_taken;
	char first_note[256];
	_Atomic int draft_checked, draft_bad; /* draft KV values compared, and differing */
	double draft_worst;
};

static struct shared *sh;
static int corrupt_pull; /* the decode ranks pull from the wrong replica: must be caught */
static int skip_draft_pull; /* the decode ranks leave the draft's KV unpulled: caught */
static char draft_dir[128]; /* set: the draft test (an Eagle3 draft beside the target) */

static void note(const char *what, int k, int pos, double d)
{
	int expected = 0;

	sh->mismatches++;
	if (atomic_compare_exchange_strong(&sh->first_taken, &expected, 1))
		snprintf(sh->first_note, sizeof(sh->first_note), "%s: prompt %d position %d (%g)",
			 what, k, pos, d);
}

/* logits (vocab) of prompt k at pos against the oracle; returns the greedy token. */
static int check_row(int k, int pos, const float *logits, int vocab)
{
	const float *want = model_oracle_logits(&orc, k, pos);
	double worst = 0;
	int tok = 0;

	for (int v = 0; v < vocab; v++) {
		const double d = fabs((double)logits[v] - (double)want[v]);

		if (!(d <= worst))
			worst = isnan(d) ? INFINITY : d;
		if (logits[v] > logits[tok])
			tok = v;
	}
	if (worst > 1e-4)
		note("logits differ", k, pos, worst);
	else if (tok != model_oracle_token(&orc, k, pos + 1))
		note("token differs", k, pos, tok);
	sh->checked++;
	return tok;
}

static int decode_cb(void *arg, int index, int pos, int token, const float *logits, int vocab)
{
	(void)arg;
	(void)token;
	check_row(index, pos, logits, vocab);
	return 0;
}

/* Waits (polling, as a test may) until *v reaches want, or the instance aborts. */
static int wait_for(struct dps_world *w, _Atomic int *v, int want)
{
	while (atomic_load(v) < want) {
		if (atomic_load(&w->ctl->abort))
			return -DPS_EABORT;
		usleep(500);
	}
	return 0;
}

/* A prefill rank: each of its replica's prompts in one prefill step, into the shared cache. */
static int prefill_rank(struct dps_world *w, const char *model)
{
	const int P = w->dp, ndec = w->total - w->world;
	const size_t stride = w->kv_stride;
	struct dps_shard s;
	char err[512];
	int rc;

	rc = dps_shard_load(&s, w, &w->part->cfg, model,
			    &(struct dps_shard_opts){ .max_pos = MAXPOS, .max_seqs = NPROMPT,
						      .max_rows = 16,
						      .cache_mem = w->kv_share +
								   (size_t)(w->rank - w->base) * stride,
						      .cache_cap = stride },
			    err, sizeof(err));
	if (rc) {
		fprintf(stderr, "rank %d: %s\n", w->rank, err);
		return rc;
	}
	for (int k = w->dp_rank; k < NPROMPT && !rc; k += P) {
		const int n = prompt_len[k], *table = s.seq_tables + (size_t)(k / P) * s.bps;
		int pos[8], slot[8];
		const int *tables[8];
		unsigned char want[8] = { 0 };
		const float *lg;

		for (int i = 0; i < n; i++) {
			pos[i] = i;
			slot[i] = dps_kv_slot(table, s.block_size, i);
			tables[i] = table;
		}
		want[n - 1] = 1;
		lg = dps_shard_step_rows(&s, 1, &(struct dps_rows){ n, prompts[k], pos, slot,
								   tables, want }, &rc);
		if (lg && w->tp_rank == 0)
			sh->first[k] = check_row(k, n - 1, lg, s.cfg.vocab_size);
	}
	sh->prefill_done++;
	/* the caches must outlive the decode ranks' pulls */
	if (!rc)
		rc = wait_for(w, &sh->decode_done, ndec);
	dps_shard_free(&s);
	return rc;
}

/* A decode rank: the decode layouts only; pulls its replica's prompts and decodes them. */
static int decode_rank(struct dps_world *w, const char *model)
{
	const struct dps_groups *pg = w->lay->groups.prefill;
	const int P = pg->cfg.dp, T = pg->cfg.tp;
	struct dps_sampling sp = { 0.0f, 0, 1.0f, 0 };
	struct loop_req reqs[NPROMPT];
	struct dps_shard s;
	char err[512];
	int n = 0, rc;

	rc = dps_shard_load(&s, w, &w->part->cfg, model,
			    &(struct dps_shard_opts){ .max_pos = MAXPOS, .max_seqs = NPROMPT,
						      .max_rows = 16, .decode_only = 1 },
			    err, sizeof(err));
	if (rc) {
		fprintf(stderr, "rank %d: %s\n", w->rank, err);
		return rc;
	}
	rc = wait_for(w, &sh->prefill_done, pg->world);
	for (int k = w->dp_rank; k < NPROMPT && !rc; k += w->dp) {
		/* the prefill replica's table of prompt k, and this replica's of its n-th */
		int src[8], dst[8];
		const int pr = corrupt_pull ? (k + 1) % P : k % P;

		for (int b = 0; b < s.bps && b < 8; b++) {
			src[b] = (k / P) * s.bps + b;
			dst[b] = n * s.bps + b;
		}
		rc = dps_shard_kv_pull(&s, w->kv_share, w->kv_stride, pr, T, src, dst,
				       prompt_len[k], 0);
		if (!rc && w->rank == 0)
			sh->pulled++;
		reqs[n++] = (struct loop_req){ prompts[k], prompt_len[k], MAXPOS, k, 1, sh->first[k] };
	}
	if (!rc) {
		loop_decode_only = 1;
		rc = loop_generate(&s, reqs, n, &sp, decode_cb, NULL, NULL);
	}
	dps_shard_free(&s);
	sh->decode_done++;
	return rc;
}

/*
 * The draft test. Both sides: target s (its hidden states kept for the draft) and draft d, the
 * draft's cache after the target's in a prefill rank's share slice. A draft catch-up over a
 * prompt's positions 0..n-1 (token p + 1 after position p, the last the sampled one), reading
 * the target's hidden states of the step's rows.
 */
static int load_pair(struct dps_world *w, const char *model, struct dps_shard *s,
		     struct dps_shard *d)
{
	char *slice = w->role == DPS_ROLE_PREFILL
			      ? w->kv_share + (size_t)(w->rank - w->base) * w->kv_stride : NULL;
	char err[512];
	size_t doff;
	int rc = dps_shard_load(s, w, &w->part->cfg, model,
				&(struct dps_shard_opts){ .max_pos = MAXPOS, .max_seqs = 2 * NPROMPT,
							  .max_rows = 16, .cache_mem = slice,
							  .cache_cap = slice ? w->kv_stride : 0 },
				err, sizeof(err));

	if (rc) {
		fprintf(stderr, "rank %d: %s\n", w->rank, err);
		return rc;
	}
	doff = dps_align_up(4096 + s->cache_bytes, 4096);
	rc = dps_shard_load(d, w, &w->part->cfg, draft_dir,
			    &(struct dps_shard_opts){ .max_pos = MAXPOS, .max_seqs = 2 * NPROMPT,
						      .max_rows = 16, .num_blocks = s->num_blocks,
						      .target = s, .cache_mem = slice ? slice + doff : NULL,
						      .cache_cap = slice ? w->kv_stride - doff : 0 },
			    err, sizeof(err));
	if (!rc)
		rc = dps_shard_set_aux(s, d->aux_l, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "rank %d: %s\n", w->rank, err);
		dps_shard_free(s);
		return rc;
	}
	if (slice)
		((struct dps_kv_share_hdr *)(void *)slice)->draft_off = doff;
	return 0;
}

/* Prompt k through target and draft into sequence seq's blocks (the prefill graph or, on a
 * decode rank, the decode graph); returns the greedy first token, or -1. */
static int prompt_through(struct dps_shard *s, struct dps_shard *d, int k, int seq, int prefill)
{
	const int n = prompt_len[k], *table = s->seq_tables + (size_t)seq * s->bps;
	const size_t dim = (size_t)s->cfg.hidden_size;
	int pos[8], slot[8], tok[8], first = 0, rc;
	const int *tables[8];
	unsigned char want[8] = { 0 };
	float hin[8 * 3 * 128], hout[8 * 128];
	const float *lg;

	if (dim > 128)
		return -1;
	for (int i = 0; i < n; i++) {
		pos[i] = i;
		slot[i] = dps_kv_slot(table, s->block_size, i);
		tables[i] = table;
	}
	want[n - 1] = 1;
	lg = dps_shard_step_rows(s, prefill, &(struct dps_rows){ n, prompts[k], pos, slot, tables,
								want }, &rc);
	if (!lg)
		return -1;
	for (int v = 1; v < s->cfg.vocab_size; v++)
		if (lg[v] > lg[first])
			first = v;
	for (int i = 0; i < n; i++)
		tok[i] = i + 1 < n ? prompts[k][i + 1] : first;
	memcpy(hin, s->aux, sizeof(float) * (size_t)n * 3 * dim);
	if (!dps_shard_draft_step(d, s, &(struct dps_rows){ n, tok, pos, slot, tables, NULL }, hin,
				  1, hout, &rc))
		return -1;
	return first;
}

static int draft_prefill_rank(struct dps_world *w, const char *model)
{
	struct dps_shard s, d;
	int rc = load_pair(w, model, &s, &d);

	for (int k = w->dp_rank; k < NPROMPT && !rc; k += w->dp)
		if (prompt_through(&s, &d, k, k / w->dp, 1) < 0)
			rc = -EIO;
	sh->prefill_done++;
	if (!rc)
		rc = wait_for(w, &sh->decode_done, w->total - w->world);
	dps_shard_free(&d);
	dps_shard_free(&s);
	return rc;
}

/*
 * A decode rank (uncoupled: one replica computes every prompt itself): pulls each prompt's
 * target and draft KV into sequence k's blocks, computes the same positions itself into
 * sequence NPROMPT + k's, and compares the draft's (and the target's) caches there.
 */
static int draft_decode_rank(struct dps_world *w, const char *model)
{
	const struct dps_groups *pg = w->lay->groups.prefill;
	const int P = pg->cfg.dp, T = pg->cfg.tp;
	struct dps_shard s, d;
	int rc = load_pair(w, model, &s, &d);

	if (!rc)
		rc = wait_for(w, &sh->prefill_done, pg->world);
	for (int k = 0; k < NPROMPT && !rc; k++) {
		const int *src = s.seq_tables + (size_t)(k / P) * s.bps;
		const int *got = s.seq_tables + (size_t)k * s.bps;
		const int *own = s.seq_tables + (size_t)(NPROMPT + k) * s.bps;

		rc = dps_shard_kv_pull(&s, w->kv_share, w->kv_stride, k % P, T, src, got,
				       prompt_len[k], 0);
		if (!rc && !skip_draft_pull)
			rc = dps_shard_kv_pull(&d, w->kv_share, w->kv_stride, k % P, T, src, got,
					       prompt_len[k], 1);
		if (!rc && prompt_through(&s, &d, k, NPROMPT + k, 0) < 0)
			rc = -EIO;
		for (int p = 0; p < prompt_len[k] && !rc; p++)
			for (int c = 0; c < 2; c++) {
				const struct dps_shard *x = c ? &d : &s;
				const size_t wd = (size_t)x->nkv_t * (size_t)x->hd;
				const float *kc = x->key_cache, *vc = x->value_cache;
				/* the draft's one layer; the target's last */
				const int l = c ? 0 : x->cfg.num_hidden_layers - 1;
				const size_t a = dps_kv_offset(l, x->num_blocks, x->block_size,
							       dps_kv_slot(got, x->block_size, p), wd);
				const size_t b = dps_kv_offset(l, x->num_blocks, x->block_size,
							       dps_kv_slot(own, x->block_size, p), wd);

				for (size_t i = 0; i < wd; i++) {
					const double e = fmax(fabs((double)kc[a + i] - kc[b + i]),
							      fabs((double)vc[a + i] - vc[b + i]));

					if (!(e <= 1e-4))
						sh->draft_bad++;
					if (c && e > sh->draft_worst)
						sh->draft_worst = e;
					sh->draft_checked++;
				}
			}
	}
	sh->decode_done++;
	dps_shard_free(&d);
	dps_shard_free(&s);
	return rc;
}

static int rank_main(struct dps_world *w, void *arg)
{
	char msg[256];

	dps_gemm_setup("auto", 1, msg, sizeof(msg));
	if (draft_dir[0])
		return w->role == DPS_ROLE_PREFILL ? draft_prefill_rank(w, arg)
						   : draft_decode_rank(w, arg);
	return w->role == DPS_ROLE_PREFILL ? prefill_rank(w, arg) : decode_rank(w, arg);
}

static void setup(void)
{
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(sh, MAP_FAILED);
	test_tmpdir_make(dir, sizeof(dir), "handoff");
	test_models_make(dir);
}

static void teardown(void)
{
	test_tmpdir_remove(dir);
	munmap(sh, sizeof(*sh));
	model_oracle_free(&orc);
}

/* model; decode TP, DP, attention, embedding, MLP, LM head, EP, a2a; prefill P, T */
struct layout {
	const char *model;
	int c[8], P, T;
};

static const struct layout layouts[] = {
	{ "gqa", { 2, 2, 2, 2, 2, 2, 0, 0 }, 1, 3 },  /* K/V by TP rank, 3 prefill positions */
	{ "gqa", { 1, 2, 1, 1, 1, 1, 0, 0 }, 1, 2 },  /* no component sizes */
	{ "mha", { 2, 2, 2, 2, 2, 2, 0, 0 }, 2, 1 },  /* K/V by effective rank, 2 replicas */
	{ "mha", { 1, 4, 4, 4, 4, 4, 0, 0 }, 1, 2 },
	{ "mha", { 2, 4, 4, 2, 1, 4, 0, 0 }, 2, 4 },
	{ "moe", { 2, 2, 1, 1, 1, 1, 1, 2 }, 1, 2 },  /* EP all-to-all-v on the decode side */
	{ "moe", { 1, 4, 2, 1, 1, 2, 1, 1 }, 2, 1 },  /* EP all-gather, attention size 2 */
	{ "wide", { 8, 4, 4, 4, 4, 4, 0, 0 }, 1, 8 }, /* the reference's TP=8 x DP=4: 8 ... */
	{ "wide", { 8, 4, 4, 4, 4, 4, 0, 0 }, 2, 8 }, /* ... and 16 prefill ranks */
};

static int run_layout(const struct layout *l, char *err, size_t len)
{
	char model[128];
	const int *c = l->c;
	struct dps_sup_opts o = { .par = { c[0], c[1], c[2], c[3], c[4], 1, c[5], c[6], c[7],
					   l->P, l->T },
				  .rank_fn = rank_main, .rank_arg = model, .cpu_bind = "off",
				  .roles = 1, .kv_share_bytes = (size_t)4 << 20 };
	struct dps_sup_result res;

	snprintf(model, sizeof(model), "%s/%s", dir, l->model);
	model_oracle_build(&orc, model, prompts, prompt_len, NPROMPT, MAXPOS);
	memset(sh, 0, sizeof(*sh));
	return dps_sup_run(&o, &res, err, len);
}

START_TEST(test_handoff_equals_one_process)
{
	const struct layout *l = &layouts[_i];
	char err[512];

	ck_assert_msg(run_layout(l, err, sizeof(err)) == 0, "%s decode TP=%d DP=%d, P=%d T=%d: %s",
		      l->model, l->c[0], l->c[1], l->P, l->T, err);
	ck_assert_msg(sh->mismatches == 0, "%s decode TP=%d DP=%d, P=%d T=%d: %d mismatches, "
		      "first: %s", l->model, l->c[0], l->c[1], l->P, l->T, sh->mismatches,
		      sh->first_note);
	ck_assert_int_eq(sh->pulled, (NPROMPT + l->c[1] - 1) / l->c[1]);
	/* every prompt's prefill row and every decode position after it, once a replica */
	ck_assert_int_ge(sh->checked, NPROMPT * (MAXPOS - 7));
	if (getenv("SHARD_VERBOSE"))
		fprintf(stderr, "%s decode TP=%d DP=%d, P=%d T=%d: %d checked, %d pulled\n",
			l->model, l->c[0], l->c[1], l->P, l->T, (int)sh->checked, (int)sh->pulled);
}
END_TEST

START_TEST(test_wrong_pull_caught)
{
	char err[512];

	corrupt_pull = 1; /* prompts' KV from the other prefill replica */
	ck_assert_int_eq(run_layout(&layouts[2], err, sizeof(err)), 0);
	corrupt_pull = 0;
	ck_assert_int_gt(sh->mismatches, 0);
}
END_TEST

/*
 * Eagle3: the draft's KV of the prompt positions travels with the target's: what a decode rank
 * pulled equals what it computes itself from the same prompt (1e-4: the two graphs order their
 * sums differently), for prefill and decode TP sizes that differ; and leaving the draft's KV
 * behind is caught.
 */
static const struct layout draft_layouts[] = {
	{ "gqa", { 2, 1, 1, 1, 1, 1, 0, 0 }, 1, 3 },
	{ "gqa", { 3, 1, 1, 1, 1, 1, 0, 0 }, 2, 2 },
	{ "mha", { 1, 1, 1, 1, 1, 1, 0, 0 }, 1, 2 },
};

START_TEST(test_draft_kv_travels)
{
	const struct layout *l = &draft_layouts[_i % 3];
	char model[128], err[512];

	snprintf(model, sizeof(model), "%s/%s", dir, l->model);
	snprintf(draft_dir, sizeof(draft_dir), "%s/%s-draft", dir, l->model);
	ck_assert_msg(!dps_mkmodel_draft(model, DPS_DRAFT_SELF, 0, 5, DPS_ST_F32, draft_dir, err,
					 sizeof(err)), "%s", err);
	skip_draft_pull = _i >= 3;
	ck_assert_msg(run_layout(l, err, sizeof(err)) == 0, "%s TP=%d, P=%d T=%d: %s", l->model,
		      l->c[0], l->P, l->T, err);
	ck_assert_int_gt(sh->draft_checked, 0);
	if (skip_draft_pull)
		ck_assert_int_gt(sh->draft_bad, 0);
	else
		ck_assert_msg(sh->draft_bad == 0, "%s TP=%d, P=%d T=%d: %d of %d KV values differ "
			      "(draft worst %g)", l->model, l->c[0], l->P, l->T, (int)sh->draft_bad,
			      (int)sh->draft_checked, sh->draft_worst);
	if (getenv("SHARD_VERBOSE"))
		fprintf(stderr, "draft %s TP=%d, P=%d T=%d%s: %d KV values compared, %d differ, "
			"draft worst %g\n", l->model, l->c[0], l->P, l->T,
			skip_draft_pull ? " (draft not pulled)" : "", (int)sh->draft_checked,
			(int)sh->draft_bad, sh->draft_worst);
	skip_draft_pull = 0;
	draft_dir[0] = 0;
}
END_TEST

static Suite *handoff_suite(void)
{
	Suite *s = suite_create("handoff");
	TCase *tc = tcase_create("equivalence");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 600);
	tcase_add_loop_test(tc, test_handoff_equals_one_process, 0,
			    (int)(sizeof(layouts) / sizeof(layouts[0])));
	tcase_add_test(tc, test_wrong_pull_caught);
	tcase_add_loop_test(tc, test_draft_kv_travels, 0, 4);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run_suite(handoff_suite());
}

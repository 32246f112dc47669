/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/groups.c - builds the process groups of docs/DESIGN.md section 3 (see groups.h)
 * and describes them for `dpshard groups`.
 *
 * Called once by the supervisor before it forks, by `dpshard groups` and by the tests. The
 * world holds at most DPS_MAX_WORLD ranks and at most 3 + 2 * DPS_COMP_COUNT sets, so every
 * set is built by evaluating the membership formula of the design table for each (group,
 * position) and then inverted into group_of / rank_in_group; the inversion asserts that the
 * formula really is a partition of the world.
 */
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/groups.h"

/* Every set the engine creates: world, TP, DP and a component TP and DP column per size. */
#define GROUPS_MAX_SETS (3 + 2 * DPS_MAX_COMP_SIZES)

static const char *const comp_names[DPS_COMP_COUNT] = {
	[DPS_COMP_ATTN] = "attention",
	[DPS_COMP_EMB] = "embedding",
	[DPS_COMP_MLP] = "mlp",
	[DPS_COMP_DRAFT_MLP] = "draft-mlp",
	[DPS_COMP_LM_HEAD] = "lm-head",
};

static const char *const comp_flags[DPS_COMP_COUNT] = {
	[DPS_COMP_ATTN] = "--attention-dp-size",
	[DPS_COMP_EMB] = "--embedding-dp-size",
	[DPS_COMP_MLP] = "--mlp-dp-size",
	[DPS_COMP_DRAFT_MLP] = "--draft-mlp-dp-size",
	[DPS_COMP_LM_HEAD] = "--lm-head-dp-size",
};

const char *dps_comp_name(enum dps_comp c)
{
	if ((unsigned)c >= DPS_COMP_COUNT)
		return "unknown component";
	return comp_names[c];
}

const char *dps_comp_flag(enum dps_comp c)
{
	if ((unsigned)c >= DPS_COMP_COUNT)
		return "--unknown-dp-size";
	return comp_flags[c];
}

int dps_par_cfg_comp_size(const struct dps_par_cfg *cfg, enum dps_comp c)
{
	switch (c) {
	case DPS_COMP_ATTN:
		return cfg->attn_dp;
	case DPS_COMP_EMB:
		return cfg->emb_dp;
	case DPS_COMP_MLP:
		return cfg->mlp_dp;
	case DPS_COMP_DRAFT_MLP:
		return cfg->draft_mlp_dp;
	case DPS_COMP_LM_HEAD:
		return cfg->lm_head_dp;
	default:
		DPS_ASSERT(!"unknown component");
		return 0;
	}
}

/* Writes the message (when the caller gave a buffer) and returns -DPS_ECONFIG. */
static int cfg_fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int cfg_fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -DPS_ECONFIG;
}

int dps_par_cfg_check(const struct dps_par_cfg *cfg, char *err, size_t errlen)
{
	long long world;
	int k;

	if (cfg->tp < 1)
		return cfg_fail(err, errlen, "--tensor-parallel-size %d must be at least 1", cfg->tp);
	if (cfg->dp < 1)
		return cfg_fail(err, errlen, "--data-parallel-size %d must be at least 1", cfg->dp);
	/* Both factors are positive ints, so the product of their long long widening fits. */
	if (__builtin_mul_overflow((long long)cfg->tp, (long long)cfg->dp, &world) ||
	    world > DPS_MAX_WORLD)
		return cfg_fail(err, errlen,
				"--tensor-parallel-size %d x --data-parallel-size %d = %lld ranks exceeds the limit of %d",
				cfg->tp, cfg->dp, world, DPS_MAX_WORLD);
	for (k = 0; k < DPS_COMP_COUNT; k++) {
		int c = dps_par_cfg_comp_size(cfg, (enum dps_comp)k);

		if (c < 1)
			return cfg_fail(err, errlen,
					"%s %d must be a positive divisor of --data-parallel-size %d",
					comp_flags[k], c, cfg->dp);
		if (cfg->dp % c)
			return cfg_fail(err, errlen, "%s %d does not divide --data-parallel-size %d",
					comp_flags[k], c, cfg->dp);
	}
	if (cfg->prefill_dp < 0)
		return cfg_fail(err, errlen, "--prefill-data-parallel-size %d must be 0 (no "
				"prefill replicas) or more", cfg->prefill_dp);
	if (cfg->prefill_tp < 0)
		return cfg_fail(err, errlen, "--prefill-tensor-parallel-size %d must be at least 1",
				cfg->prefill_tp);
	if (cfg->prefill_tp && !cfg->prefill_dp)
		return cfg_fail(err, errlen, "--prefill-tensor-parallel-size %d sizes the prefill "
				"replicas: it needs --prefill-data-parallel-size", cfg->prefill_tp);
	if (cfg->prefill_dp) {
		const long long pw = (long long)cfg->prefill_dp * dps_par_cfg_prefill_tp(cfg);

		if (pw > DPS_MAX_WORLD || world + pw > DPS_MAX_WORLD)
			return cfg_fail(err, errlen,
					"%lld decode ranks and --prefill-data-parallel-size %d x "
					"--prefill-tensor-parallel-size %d = %lld prefill ranks exceed "
					"the limit of %d", world, cfg->prefill_dp,
					dps_par_cfg_prefill_tp(cfg), pw, DPS_MAX_WORLD);
	}
	if (cfg->a2a < DPS_A2A_UNSET || cfg->a2a > DPS_A2A_V)
		return cfg_fail(err, errlen, "unknown --all2all-backend %d", cfg->a2a);
	if (cfg->a2a != DPS_A2A_UNSET && !cfg->ep)
		return cfg_fail(err, errlen, "--all2all-backend %s chooses the dispatch of expert "
				"parallelism: it needs --enable-expert-parallel", dps_a2a_name(cfg->a2a));
	if (cfg->ep && cfg->a2a != DPS_A2A_V && cfg->mlp_dp > 1)
		return cfg_fail(err, errlen,
				"--mlp-dp-size %d cannot be used with --enable-expert-parallel on the "
				"all-gather dispatch (--all2all-backend allgather_reducescatter): the "
				"decoder layer would all-gather the rows over the MLP DP column and the "
				"dispatch would gather them again over the same ranks, so every expert "
				"would compute %d identical copies of each row; keep --mlp-dp-size 1, "
				"or use --all2all-backend alltoallv, which keeps the rows sequence "
				"parallel (--draft-mlp-dp-size is allowed either way)",
				cfg->mlp_dp, cfg->mlp_dp);
	return 0;
}

const char *dps_a2a_name(int a2a)
{
	return a2a == DPS_A2A_V ? "alltoallv" : "allgather_reducescatter";
}

/*
 * The world rank at position pos of group grp of a set: the membership column of the table
 * in docs/DESIGN.md section 3, written out once so that every set follows it literally.
 */
static int gs_member(int tp, enum dps_gs_kind kind, int c, int grp, int pos)
{
	switch (kind) {
	case DPS_GS_WORLD:
		return pos;
	case DPS_GS_TP: /* grp = d, pos = t */
		return grp * tp + pos;
	case DPS_GS_DP: /* grp = t, pos = d */
		return pos * tp + grp;
	case DPS_GS_COMP_TP: { /* grp = g, pos = j*TP + t */
		const int j = pos / tp, t = pos % tp;

		return (grp * c + j) * tp + t;
	}
	case DPS_GS_DP_COLUMN: { /* grp = g*TP + t, pos = j */
		const int sg = grp / tp, t = grp % tp;

		return (sg * c + pos) * tp + t;
	}
	}
	DPS_ASSERT(!"unknown group set kind");
	return -1;
}

/*
 * Allocates gs for a world of `world` ranks split into n_groups groups of group_size, fills
 * ranks from gs_member and inverts it. Returns 0 or -ENOMEM (gs may then hold some arrays;
 * dps_groups_free releases them). The caller guarantees n_groups * group_size == world.
 */
static int gs_build(struct dps_groupset *gs, int tp, int world, enum dps_gs_kind kind, int c,
		    int n_groups, int group_size)
{
	size_t n, i;
	int grp, pos;

	if (dps_size_mul((size_t)n_groups, (size_t)group_size, &n))
		return -DPS_ETOOBIG;
	DPS_ASSERT(n == (size_t)world);
	gs->kind = kind;
	gs->c = c;
	gs->n_groups = n_groups;
	gs->group_size = group_size;
	/* calloc checks n * sizeof(int) for overflow itself. */
	gs->ranks = calloc(n, sizeof(*gs->ranks));
	gs->group_of = calloc(n, sizeof(*gs->group_of));
	gs->rank_in_group = calloc(n, sizeof(*gs->rank_in_group));
	if (!gs->ranks || !gs->group_of || !gs->rank_in_group)
		return -ENOMEM;

	for (i = 0; i < n; i++)
		gs->group_of[i] = -1;
	for (grp = 0; grp < n_groups; grp++) {
		for (pos = 0; pos < group_size; pos++) {
			const int r = gs_member(tp, kind, c, grp, pos);

			/* A rank outside the world or seen twice means the formula is no partition. */
			DPS_ASSERT(r >= 0 && r < world && gs->group_of[r] == -1);
			gs->ranks[(size_t)grp * (size_t)group_size + (size_t)pos] = r;
			gs->group_of[r] = grp;
			gs->rank_in_group[r] = pos;
		}
	}
	return 0;
}

static void gs_free(struct dps_groupset *gs)
{
	free(gs->ranks);
	free(gs->group_of);
	free(gs->rank_in_group);
	memset(gs, 0, sizeof(*gs));
}

/* Index of c in g->sizes[]; the caller guarantees it is there. */
static int groups_size_index(const struct dps_groups *g, int c)
{
	int i;

	for (i = 0; i < g->n_sizes; i++)
		if (g->sizes[i] == c)
			return i;
	DPS_ASSERT(!"component size missing from sizes[]");
	return -1;
}

/* Collects the distinct component sizes of g->cfg into g->sizes[], ascending. */
static void groups_collect_sizes(struct dps_groups *g)
{
	int k, i;

	g->n_sizes = 0;
	for (k = 0; k < DPS_COMP_COUNT; k++) {
		const int c = dps_par_cfg_comp_size(&g->cfg, (enum dps_comp)k);

		i = 0;
		while (i < g->n_sizes && g->sizes[i] < c)
			i++;
		if (i < g->n_sizes && g->sizes[i] == c)
			continue;
		memmove(&g->sizes[i + 1], &g->sizes[i], (size_t)(g->n_sizes - i) * sizeof(g->sizes[0]));
		g->sizes[i] = c;
		g->n_sizes++;
	}
}

int dps_groups_build(const struct dps_par_cfg *cfg, struct dps_groups *g, char *err, size_t errlen)
{
	int rc, i, k, tp, dp;

	memset(g, 0, sizeof(*g));
	rc = dps_par_cfg_check(cfg, err, errlen);
	if (rc)
		return rc;
	g->cfg = *cfg;
	tp = cfg->tp;
	dp = cfg->dp;
	g->world = tp * dp; /* checked against DPS_MAX_WORLD above */
	groups_collect_sizes(g);

	rc = gs_build(&g->world_gs, tp, g->world, DPS_GS_WORLD, 0, 1, g->world);
	if (rc)
		goto err;
	rc = gs_build(&g->tp, tp, g->world, DPS_GS_TP, 0, dp, tp);
	if (rc)
		goto err;
	rc = gs_build(&g->dp, tp, g->world, DPS_GS_DP, 0, tp, dp);
	if (rc)
		goto err;
	for (i = 0; i < g->n_sizes; i++) {
		const int c = g->sizes[i];

		rc = gs_build(&g->comp_tp[i], tp, g->world, DPS_GS_COMP_TP, c, dp / c, tp * c);
		if (rc)
			goto err;
		rc = gs_build(&g->dp_col[i], tp, g->world, DPS_GS_DP_COLUMN, c, dp / c * tp, c);
		if (rc)
			goto err;
	}
	/* Aliasing: one object per distinct size, shared by every component of that size. */
	for (k = 0; k < DPS_COMP_COUNT; k++) {
		i = groups_size_index(g, dps_par_cfg_comp_size(cfg, (enum dps_comp)k));
		g->comp_tp_of[k] = &g->comp_tp[i];
		g->dp_col_of[k] = &g->dp_col[i];
	}
	if (cfg->prefill_dp) {
		struct dps_par_cfg pc = DPS_PAR_CFG_DEFAULT;

		pc.tp = dps_par_cfg_prefill_tp(cfg);
		pc.dp = cfg->prefill_dp;
		g->prefill = calloc(1, sizeof(*g->prefill));
		rc = g->prefill ? dps_groups_build(&pc, g->prefill, err, errlen) : -ENOMEM;
		if (rc) {
			free(g->prefill);
			g->prefill = NULL;
			goto err;
		}
		g->prefill->rank_base = g->world;
	}
	return 0;

err:
	dps_groups_free(g);
	if (err && errlen)
		snprintf(err, errlen, "building the process groups of %d x %d ranks: %s", tp, dp,
			 dps_strerror(rc));
	return rc;
}

void dps_groups_free(struct dps_groups *g)
{
	int i;

	if (g->prefill) {
		dps_groups_free(g->prefill);
		free(g->prefill);
	}
	gs_free(&g->world_gs);
	gs_free(&g->tp);
	gs_free(&g->dp);
	for (i = 0; i < DPS_MAX_COMP_SIZES; i++) {
		gs_free(&g->comp_tp[i]);
		gs_free(&g->dp_col[i]);
	}
	memset(g, 0, sizeof(*g));
}

const char *dps_groupset_name(const struct dps_groupset *gs, char *buf, size_t len)
{
	switch (gs->kind) {
	case DPS_GS_WORLD:
		snprintf(buf, len, "world");
		break;
	case DPS_GS_TP:
		snprintf(buf, len, "TP");
		break;
	case DPS_GS_DP:
		snprintf(buf, len, "DP");
		break;
	case DPS_GS_COMP_TP:
		snprintf(buf, len, "component TP (c=%d)", gs->c);
		break;
	case DPS_GS_DP_COLUMN:
		snprintf(buf, len, "DP column (c=%d)", gs->c);
		break;
	default:
		snprintf(buf, len, "unknown");
		break;
	}
	return buf;
}

void dps_groups_foreach_set(const struct dps_groups *g,
			    void (*fn)(const struct dps_groupset *gs, void *arg), void *arg)
{
	int i;

	fn(&g->world_gs, arg);
	fn(&g->tp, arg);
	fn(&g->dp, arg);
	for (i = 0; i < g->n_sizes; i++) {
		fn(&g->comp_tp[i], arg);
		fn(&g->dp_col[i], arg);
	}
}

/* ---- dps_groups_print: the description shown by `dpshard groups` ---- */

struct set_list {
	int n;
	const struct dps_groupset *sets[GROUPS_MAX_SETS];
};

static void set_list_add(const struct dps_groupset *gs, void *arg)
{
	struct set_list *l = arg;

	DPS_ASSERT(l->n < GROUPS_MAX_SETS);
	l->sets[l->n++] = gs;
}

/* Same groups, same members, same order: the sets are interchangeable communicators. */
static int gs_same_members(const struct dps_groupset *a, const struct dps_groupset *b)
{
	return a->n_groups == b->n_groups && a->group_size == b->group_size &&
	       !memcmp(a->ranks, b->ranks,
		       (size_t)a->n_groups * (size_t)a->group_size * sizeof(*a->ranks));
}

/* How the alias notes refer to a set: "world", "TP groups", "component TP (c=2)". */
static const char *gs_ref(const struct dps_groupset *gs, char *buf, size_t len)
{
	if (gs->kind == DPS_GS_TP)
		snprintf(buf, len, "TP groups");
	else if (gs->kind == DPS_GS_DP)
		snprintf(buf, len, "DP groups");
	else
		dps_groupset_name(gs, buf, len);
	return buf;
}

static int decimal_width(int v)
{
	int w = 1;

	while (v >= 10) {
		v /= 10;
		w++;
	}
	return w;
}

/*
 * The rank grid of the component reference: one row per DP rank, one column per TP rank. Cells are two
 * characters wide, four apart (the reference's layout); with 3+ digit ranks a cell is as wide as
 * the largest rank and one space apart.
 */
static void groups_print_grid(const struct dps_groups *g, FILE *f)
{
	const int tp = g->cfg.tp, dp = g->cfg.dp;
	const int top = g->rank_base + g->world - 1;
	const int w = decimal_width(top) < 2 ? 2 : decimal_width(top);
	const int pitch = w + 1 < 4 ? 4 : w + 1;
	/* "  DPd:" padded to 17 columns, "[", the cells, " ]"; the rule starts at column 9. */
	const int row_len = 17 + 1 + w + (tp - 1) * pitch + 2;
	int t, d, i;

	fprintf(f, "         TP rank: ");
	for (t = 0; t < tp; t++)
		fprintf(f, "%*d", t ? pitch : w, t);
	fprintf(f, "\n         ");
	for (i = 9; i < row_len; i++)
		fputs("\u2500", f);
	fputc('\n', f);
	for (d = 0; d < dp; d++) {
		char label[24];

		snprintf(label, sizeof(label), "  DP%d:", d);
		fprintf(f, "%-17s[", label);
		for (t = 0; t < tp; t++)
			fprintf(f, "%*d", t ? pitch : w, g->rank_base + d * tp + t);
		fprintf(f, " ]\n");
	}
}

/* The label of group grp: which DP ranks (replicas) and TP positions it spans. */
static void gs_group_label(const struct dps_groups *g, const struct dps_groupset *gs, int grp,
			   char *buf, size_t len)
{
	const int tp = g->cfg.tp;

	switch (gs->kind) {
	case DPS_GS_TP:
		snprintf(buf, len, "DP%d", grp);
		break;
	case DPS_GS_DP:
		snprintf(buf, len, "TP%d", grp);
		break;
	case DPS_GS_COMP_TP:
		if (gs->c == 1)
			snprintf(buf, len, "DP%d", grp);
		else
			snprintf(buf, len, "DP%d-%d", grp * gs->c, grp * gs->c + gs->c - 1);
		break;
	case DPS_GS_DP_COLUMN: {
		const int sg = grp / tp, t = grp % tp;

		if (gs->c == 1)
			snprintf(buf, len, "DP%d TP%d", sg, t);
		else
			snprintf(buf, len, "DP%d-%d TP%d", sg * gs->c, sg * gs->c + gs->c - 1, t);
		break;
	}
	default:
		snprintf(buf, len, "all");
		break;
	}
}

static const char *gs_rank_rule(enum dps_gs_kind kind)
{
	switch (kind) {
	case DPS_GS_WORLD:
		return "rank_in_group = world rank";
	case DPS_GS_TP:
		return "one per DP rank d; rank_in_group = t";
	case DPS_GS_DP:
		return "one per TP rank t; rank_in_group = d";
	case DPS_GS_COMP_TP:
		return "rank_in_group = j*TP + t";
	case DPS_GS_DP_COLUMN:
		return "rank_in_group = j";
	default:
		return "";
	}
}

/* "used by: attention, mlp" for a component set; nothing for the others. */
static void gs_print_users(const struct dps_groups *g, const struct dps_groupset *gs, FILE *f)
{
	const struct dps_groupset *const *of;
	int k, n = 0;

	if (gs->kind == DPS_GS_COMP_TP)
		of = g->comp_tp_of;
	else if (gs->kind == DPS_GS_DP_COLUMN)
		of = g->dp_col_of;
	else
		return;
	fprintf(f, "  used by:");
	for (k = 0; k < DPS_COMP_COUNT; k++)
		if (of[k] == gs)
			fprintf(f, "%s %s", n++ ? "," : "", comp_names[k]);
	fputc('\n', f);
}

/* Groups of up to GS_PRINT_ONE_LINE ranks print on one line, larger ones GS_PRINT_WRAP a line. */
#define GS_PRINT_ONE_LINE 32
#define GS_PRINT_WRAP 16

static void gs_print(const struct dps_groups *g, const struct dps_groupset *gs, FILE *f)
{
	char name[48], label[48];
	int grp, pos, lw;

	fprintf(f, "%s: %d group%s of %d rank%s (%s)\n", dps_groupset_name(gs, name, sizeof(name)),
		gs->n_groups, gs->n_groups == 1 ? "" : "s", gs->group_size,
		gs->group_size == 1 ? "" : "s", gs_rank_rule(gs->kind));
	gs_print_users(g, gs, f);
	/* The last group carries the largest numbers, hence the longest label. */
	gs_group_label(g, gs, gs->n_groups - 1, label, sizeof(label));
	lw = (int)strlen(label) + 1;
	for (grp = 0; grp < gs->n_groups; grp++) {
		const int *m = gs->ranks + (size_t)grp * (size_t)gs->group_size;

		gs_group_label(g, gs, grp, label, sizeof(label));
		strcat(label, ":");
		fprintf(f, "  %-*s [", lw, label);
		for (pos = 0; pos < gs->group_size; pos++) {
			/* Large groups wrap, aligned after the "[". */
			if (pos % GS_PRINT_WRAP == 0 && pos && gs->group_size > GS_PRINT_ONE_LINE)
				fprintf(f, ",\n  %*s  ", lw, "");
			else if (pos)
				fprintf(f, ", ");
			fprintf(f, "%d", g->rank_base + m[pos]);
		}
		fprintf(f, "]\n");
	}
}

static void groups_print_aliases(const struct dps_groups *g, const struct set_list *l, FILE *f)
{
	char a[48], b[48];
	int i, j, k;

	fprintf(f, "aliases:\n");
	/* Which components share one set object. */
	for (i = 0; i < g->n_sizes; i++) {
		int n = 0;

		fprintf(f, "  c=%d:", g->sizes[i]);
		for (k = 0; k < DPS_COMP_COUNT; k++)
			if (g->comp_tp_of[k] == &g->comp_tp[i])
				fprintf(f, "%s %s", n++ ? "," : "", comp_names[k]);
		fprintf(f, " %s one component TP (c=%d) object and one DP column (c=%d) object\n",
			n == 1 ? "uses" : "share", g->sizes[i], g->sizes[i]);
	}
	/* Which sets have the members of an earlier one. */
	for (i = 0; i < l->n; i++) {
		const struct dps_groupset *gs = l->sets[i];
		int same = 0;

		dps_groupset_name(gs, a, sizeof(a));
		if (gs->group_size == 1 && g->world > 1)
			fprintf(f, "  %s: groups of one (self)\n", a);
		for (j = 0; j < i; j++) {
			if (!gs_same_members(gs, l->sets[j]))
				continue;
			if (!same++)
				fprintf(f, "  %s", a);
			fprintf(f, " = %s", gs_ref(l->sets[j], b, sizeof(b)));
		}
		if (same)
			fprintf(f, " (same member lists)\n");
	}
}

void dps_groups_print(const struct dps_groups *g, FILE *f)
{
	struct set_list l = { 0 };
	int k, i;

	if (g->prefill)
		fprintf(f, "decode part: ranks 0-%d, %d replica%s; prefill part: ranks %d-%d, %d "
			"replica%s of TP=%d (below)\n", g->world - 1, g->cfg.dp,
			g->cfg.dp == 1 ? "" : "s", g->world, dps_groups_total(g) - 1,
			g->prefill->cfg.dp, g->prefill->cfg.dp == 1 ? "" : "s", g->prefill->cfg.tp);
	if (g->rank_base)
		fprintf(f, "prefill part: TP=%d DP=%d, ranks %d-%d (plain TP: every component size "
			"1, no expert parallelism; its DP ranks are the prefill replicas)\n\n",
			g->cfg.tp, g->cfg.dp, g->rank_base, g->rank_base + g->world - 1);
	else {
		fprintf(f, "TP=%d DP=%d world=%d; component sizes:", g->cfg.tp, g->cfg.dp,
			g->world);
		for (k = 0; k < DPS_COMP_COUNT; k++)
			fprintf(f, " %s=%d", comp_names[k],
				dps_par_cfg_comp_size(&g->cfg, (enum dps_comp)k));
		fprintf(f, "\n\n");
	}
	groups_print_grid(g, f);

	dps_groups_foreach_set(g, set_list_add, &l);
	for (i = 0; i < l.n; i++) {
		fputc('\n', f);
		gs_print(g, l.sets[i], f);
	}
	fputc('\n', f);
	groups_print_aliases(g, &l, f);
	if (g->prefill) {
		fputc('\n', f);
		dps_groups_print(g->prefill, f);
	}
}

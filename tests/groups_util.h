/* SPDX-License-Identifier: MIT */
/*
 * tests/groups_util.h - what the suites of the process groups share: a layout from its sizes,
 * a build that must succeed, the printed description as a string, and a whole-line search.
 */
#ifndef DPS_TESTS_GROUPS_UTIL_H
#define DPS_TESTS_GROUPS_UTIL_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/runtime/groups.h"

static inline struct dps_par_cfg mkcfg(int tp, int dp, int attn, int emb, int mlp, int draft, int lm)
{
	struct dps_par_cfg cfg = { tp, dp, attn, emb, mlp, draft, lm };

	return cfg;
}

static inline void build_ok(const struct dps_par_cfg *cfg, struct dps_groups *g)
{
	char err[256] = "";
	int rc = dps_groups_build(cfg, g, err, sizeof(err));

	ck_assert_msg(rc == 0, "build TP=%d DP=%d failed: %d (%s)", cfg->tp, cfg->dp, rc, err);
}

static inline char *print_to_string(const struct dps_par_cfg *cfg)
{
	struct dps_groups g;
	char *out = NULL;
	size_t len = 0;
	FILE *f;

	build_ok(cfg, &g);
	f = open_memstream(&out, &len);
	ck_assert_ptr_nonnull(f);
	dps_groups_print(&g, f);
	ck_assert_int_eq(fclose(f), 0);
	dps_groups_free(&g);
	return out;
}

/* line must appear in out as one whole line. */
static inline void assert_line(const char *out, const char *line)
{
	const char *p = out;
	size_t n = strlen(line);

	while ((p = strstr(p, line))) {
		if ((p == out || p[-1] == '\n') && (p[n] == '\n' || p[n] == '\0'))
			return;
		p++;
	}
	ck_abort_msg("line not found: '%s' in:\n%s", line, out);
}

#endif

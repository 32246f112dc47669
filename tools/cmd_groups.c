/* SPDX-License-Identifier: MIT */
/*
 * tools/cmd_groups.c - `dpshard groups`: checks a parallel layout given by the vLLM-style
 * flags and prints its rank grid and every process group the engine would create. Runs no
 * rank processes; it is the quick way to see what a set of --*-dp-size flags means.
 */
#include <stdio.h>

#include "common/dps.h"
#include "engine/groups.h"
#include "tools/cmd.h"
#include "tools/flags.h"

#define GROUPS_SYNOPSIS                                                                     \
	"[--tensor-parallel-size N] [--data-parallel-size N] [--attention-dp-size N] "       \
	"[--embedding-dp-size N] [--mlp-dp-size N] [--draft-mlp-dp-size N] "                 \
	"[--lm-head-dp-size N]"

int dps_cmd_groups(int argc, char **argv)
{
	struct dps_par_cfg cfg = DPS_PAR_CFG_DEFAULT;
	struct dps_flag flags[DPS_PAR_FLAGS + 1];
	const struct dps_flag end = DPS_FLAGS_END;
	struct dps_groups g;
	char err[256] = "";
	char *pos[1];
	int npos, rc;

	dps_flags_parallel(&cfg, flags);
	flags[DPS_PAR_FLAGS] = end;
	rc = dps_flags_parse(flags, argc, argv, "groups", GROUPS_SYNOPSIS, pos, 0, &npos);
	if (rc == 1)
		return 0; /* --help */
	if (rc)
		return 2; /* the parser named the bad flag */

	rc = dps_groups_build(&cfg, &g, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dpshard groups: %s\n", err[0] ? err : dps_strerror(rc));
		return rc == -DPS_ECONFIG ? 2 : 1;
	}
	dps_groups_print(&g, stdout);
	dps_groups_free(&g);
	if (fflush(stdout) || ferror(stdout)) {
		fprintf(stderr, "dpshard groups: writing to stdout failed\n");
		return 1;
	}
	return 0;
}

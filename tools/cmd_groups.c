/* SPDX-License-Identifier: MIT */
/*
 * tools/cmd_groups.c - `dpshard groups`: checks a parallel layout given by the vLLM-style
 * flags and prints its rank grid and every process group the engine would create. Runs no
 * rank processes; it is the quick way to see what a set of --*-dp-size flags means.
 */
#include <stdio.h>

#include "common/dps.h"
#include "engine/runtime/groups.h"
#include "engine/runtime/nodes.h"
#include "engine/runtime/placement.h"
#include "engine/runtime/topo.h"
#include "tools/cmd.h"
#include "tools/flags.h"

#define GROUPS_SYNOPSIS                                                                     \
	"[--tensor-parallel-size N] [--data-parallel-size N] [--attention-dp-size N] "       \
	"[--embedding-dp-size N] [--mlp-dp-size N] [--draft-mlp-dp-size N] "                 \
	"[--lm-head-dp-size N] [--enable-expert-parallel] [--all2all-backend B] "             \
	"[--prefill-data-parallel-size P [--prefill-tensor-parallel-size T]] [--placement] "   \
	"[--cpu-bind SPEC] [--nodes N]"

int dps_cmd_groups(int argc, char **argv)
{
	struct dps_par_cfg cfg = DPS_PAR_CFG_DEFAULT;
	struct dps_flag flags[DPS_PAR_FLAGS + 3];
	const struct dps_flag end = DPS_FLAGS_END;
	const char *cpu_bind = "auto";
	int show_place = 0, nodes;
	struct dps_groups g;
	char err[256] = "";
	char *pos[1];
	int npos, rc;

	dps_flags_parallel(&cfg, flags);
	flags[DPS_PAR_FLAGS] = (struct dps_flag){ "placement", DPS_FLAG_BOOL, &show_place, NULL,
		"also print where each rank would run on this machine", 0, 0 };
	flags[DPS_PAR_FLAGS + 1] = (struct dps_flag){ "cpu-bind", DPS_FLAG_STR, &cpu_bind, "SPEC",
		"with --placement: auto, off, or per-rank CPU lists like 0-1:2-3", 0, 0 };
	flags[DPS_PAR_FLAGS + 2] = end;
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
	nodes = cfg.nodes > 1 ? cfg.nodes : 1;
	if (nodes > 1) {
		rc = dps_nodes_check(dps_groups_total(&g), nodes, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "dpshard groups: %s\n", err);
			dps_groups_free(&g);
			return 2;
		}
		putchar('\n');
		rc = dps_nodes_print(&g, nodes, stdout);
		if (rc < 0) {
			fprintf(stderr, "dpshard groups: %s\n", dps_strerror(rc));
			dps_groups_free(&g);
			return 1;
		}
	}
	dps_groups_free(&g);
	if (cfg.ep) {
		const int ep = cfg.tp * cfg.dp;

		printf("\nexpert parallel: EP group = the world group (EP degree TP x DP = %d); EP rank "
		       "k = d*TP + t holds experts [k*E/%d, (k+1)*E/%d) of a model's E experts\n",
		       ep, ep, ep);
		if (cfg.a2a == DPS_A2A_V)
			printf("  dispatch alltoallv: items to the experts' ranks and back over the "
			       "world group, rows gathered over the group that holds them\n");
		else
			printf("  dispatch allgather_reducescatter: rows gathered and partial sums "
			       "reduce-scattered over the DP groups, then all-reduced over TP\n");
		printf("  the replicas are coupled (padding and dummy batches)\n");
	}
	if (show_place) {
		struct dps_placement p = { 0 };
		struct dps_topo t;

		rc = dps_topo_discover(&t);
		if (rc) {
			fprintf(stderr, "dpshard groups: cannot read the CPU topology: %s\n",
				dps_strerror(rc));
			return 1;
		}
		const int ptp = dps_par_cfg_prefill_tp(&cfg);

		rc = dps_place_parse_bind(cpu_bind, cfg.tp * cfg.dp + cfg.prefill_dp * ptp, &t, &p,
					  err, sizeof(err));
		if (rc == 1)
			rc = dps_place_compute_parts(&t, cfg.tp, cfg.dp, ptp, cfg.prefill_dp, &p);
		if (rc < 0) {
			fprintf(stderr, "dpshard groups: %s\n", err[0] ? err : dps_strerror(rc));
			dps_topo_free(&t);
			return 2;
		}
		printf("\nplacement on this machine (%d NUMA node(s), %d CPU(s)):\n", t.n_nodes,
		       dps_topo_ncpus(&t));
		dps_placement_print_parts(&p, cfg.tp, cfg.tp * cfg.dp, ptp, stdout);
		dps_placement_free(&p);
		dps_topo_free(&t);
	}
	if (fflush(stdout) || ferror(stdout)) {
		fprintf(stderr, "dpshard groups: writing to stdout failed\n");
		return 1;
	}
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * tools/machine.h - what every benchmark result records about where it ran: the dpshard
 * version and git commit, the CPU model, the CPUs and NUMA nodes this process may use, and the
 * BLIS kernels in use.
 */
#ifndef DPS_TOOLS_MACHINE_H
#define DPS_TOOLS_MACHINE_H

#include <stdio.h>

/* The commit dpshard was built from (at least 12 hex digits, "-dirty" with uncommitted changes
 * to tracked files), written by make at each build; "unknown" where there is no git. */
extern const char dps_git_commit[];

struct dps_machine {
	char cpu[160];
	int cpus, nodes;
	char blis[200];
};

/* Fills m (the BLIS line is dps_gemm_describe's at the time of the call). */
void dps_machine_get(struct dps_machine *m);

/* The fields as JSON members, without braces: "version": ..., "git_commit": ..., ... */
void dps_machine_json(FILE *o, const struct dps_machine *m);

/* One human line: "dpshard 0.1.0 (commit ...) on CPU, N CPUs in M NUMA node(s)". */
void dps_machine_line(FILE *o, const struct dps_machine *m);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * tools/machine.c - the machine description of machine.h.
 */
#include <stdio.h>
#include <string.h>

#include "common/dps.h"
#include "common/json.h"
#include "engine/runtime/topo.h"
#include "kernels/gemm.h"
#include "tools/machine.h"

void dps_machine_get(struct dps_machine *m)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[512];
	struct dps_topo t;

	memset(m, 0, sizeof(*m));
	snprintf(m->cpu, sizeof(m->cpu), "unknown CPU");
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
			snprintf(m->cpu, sizeof(m->cpu), "%s", strchr(line, ':') + 2);
			m->cpu[strcspn(m->cpu, "\n")] = 0;
			break;
		}
	if (f)
		fclose(f);
	m->cpus = dps_cpus_allowed();
	if (!dps_topo_discover(&t)) {
		m->nodes = t.n_nodes;
		dps_topo_free(&t);
	}
	/* A process that runs no product (bench serve) describes what the engine would pick. */
	if (!strcmp(dps_gemm_describe(), "not set up")) {
		char msg[256];

		dps_gemm_setup("auto", 1, msg, sizeof(msg));
	}
	snprintf(m->blis, sizeof(m->blis), "%s", dps_gemm_describe());
}

static void str(FILE *o, const char *key, const char *v)
{
	fprintf(o, "\"%s\": \"", key);
	dps_json_escape(o, v, strlen(v));
	fputc('"', o);
}

void dps_machine_json(FILE *o, const struct dps_machine *m)
{
	str(o, "version", PACKAGE_VERSION);
	fputs(", ", o);
	str(o, "git_commit", dps_git_commit);
	fputs(", ", o);
	str(o, "cpu", m->cpu);
	fprintf(o, ", \"cpus\": %d, \"numa_nodes\": %d, ", m->cpus, m->nodes);
	str(o, "blis", m->blis);
}

void dps_machine_line(FILE *o, const struct dps_machine *m)
{
	fprintf(o, "dpshard %s (commit %s) on %s, %d CPU(s) in %d NUMA node(s)\n", PACKAGE_VERSION,
		dps_git_commit, m->cpu, m->cpus, m->nodes);
}

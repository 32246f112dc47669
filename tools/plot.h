/* SPDX-License-Identifier: MIT */
/*
 * tools/plot.h - --plot FILE.svg of the benchmarks, drawn by gnuplot (when installed; else a
 * clear message). Each series is a line of points (x ascending).
 */
#ifndef DPS_TOOLS_PLOT_H
#define DPS_TOOLS_PLOT_H

#include <stddef.h>

struct dps_series {
	char name[64];
	int n;
	double x[32], y[32];
};

/*
 * Writes an SVG line plot to path. logx: a logarithmic x axis. Returns 0, or -1 after a
 * message on stderr (gnuplot missing or failing, path not writable).
 */
int dps_plot_svg(const char *path, const char *title, const char *xlabel, const char *ylabel,
		 const struct dps_series *s, int ns, int logx);

#endif

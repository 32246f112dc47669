/* SPDX-License-Identifier: MIT */
/*
 * tools/plot.c - SVG plots through gnuplot (see plot.h): the data and the script go to a
 * scratch directory, gnuplot runs as a child process, and the result is checked.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/plot.h"

/* s with the characters gnuplot's double-quoted strings treat specially escaped. */
static void quoted(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\' || *s == '@' || *s == '_' || *s == '^' || *s == '&')
			fputc('\\', f);
		fputc(*s, f);
	}
	fputc('"', f);
}

int dps_plot_svg(const char *path, const char *title, const char *xlabel, const char *ylabel,
		 const struct dps_series *s, int ns, int logx)
{
	const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	char dir[4096], data[4200], script[4200];
	const char *gp = getenv("DPSHARD_GNUPLOT") ? getenv("DPSHARD_GNUPLOT") : "gnuplot";
	FILE *f;
	pid_t pid;
	int st, rc = -1;
	struct stat sb;

	snprintf(dir, sizeof(dir), "%s/dps-plot.XXXXXX", tmp);
	if (!mkdtemp(dir)) {
		fprintf(stderr, "dpshard: --plot: %s\n", strerror(errno));
		return -1;
	}
	snprintf(data, sizeof(data), "%s/data", dir);
	snprintf(script, sizeof(script), "%s/plot.gp", dir);
	f = fopen(data, "w");
	if (!f)
		goto out;
	for (int k = 0; k < ns; k++) {
		for (int i = 0; i < s[k].n; i++)
			fprintf(f, "%.9g %.9g\n", s[k].x[i], s[k].y[i]);
		fprintf(f, "\n\n"); /* a data block per series */
	}
	fclose(f);
	f = fopen(script, "w");
	if (!f)
		goto out;
	fprintf(f, "set terminal svg size 900,560 dynamic enhanced font 'sans,12'\nset output ");
	quoted(f, path);
	fprintf(f, "\nset title ");
	quoted(f, title);
	fprintf(f, "\nset xlabel ");
	quoted(f, xlabel);
	fprintf(f, "\nset ylabel ");
	quoted(f, ylabel);
	fprintf(f, "\nset grid\nset key outside right\nset yrange [0:*]\n%s",
		logx ? "set logscale x 2\n" : "");
	fprintf(f, "plot ");
	for (int k = 0; k < ns; k++) {
		fprintf(f, "%s'%s' index %d with linespoints lw 2 title ", k ? ", " : "", data, k);
		quoted(f, s[k].name);
	}
	fprintf(f, "\n");
	fclose(f);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		execlp(gp, gp, script, (char *)NULL);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid) {
		fprintf(stderr, "dpshard: --plot: cannot run gnuplot: %s\n", strerror(errno));
		goto out;
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) == 127) {
		fprintf(stderr, "dpshard: --plot %s: gnuplot is not installed (apt-get install "
				"gnuplot-nox); the results above are complete, only the plot is missing\n",
			path);
		goto out;
	}
	if (!WIFEXITED(st) || WEXITSTATUS(st) || stat(path, &sb) || !sb.st_size) {
		fprintf(stderr, "dpshard: --plot %s: gnuplot failed (exit %d)\n", path,
			WIFEXITED(st) ? WEXITSTATUS(st) : -1);
		goto out;
	}
	fprintf(stderr, "dpshard: wrote %s\n", path);
	rc = 0;
out:
	unlink(data);
	unlink(script);
	rmdir(dir);
	return rc;
}

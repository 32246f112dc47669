/* SPDX-License-Identifier: MIT */
/*
 * engine/api/metrics_proc.c - the process_* series of /metrics that dashboards read (as the
 * Prometheus client libraries write them: CPU seconds, resident and virtual memory, start time,
 * open and maximum descriptors), for the process that answers /metrics: the supervisor. The
 * ranks are other processes; their memory and CPU time are written per rank under dpshard's
 * names rather than summed into process_*, because a sum would count every page of the shared
 * segment once per rank that touched it. Read from /proc at each scrape; called by metrics.c.
 */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "engine/api/frontend_int.h"
#include "engine/runtime/supervisor.h"

struct proc_stat {
	double cpu_s;            /* utime + stime */
	double start_ticks;      /* since boot */
	unsigned long long vsize, rss_pages;
};

/*
 * /proc/<pid>/stat ("self" for pid 0), the fields proc(5) numbers 14, 15, 22, 23 and 24.
 * Returns 0, or -1 when the process is gone or the line is not as proc(5) says.
 */
static int proc_stat_read(int pid, struct proc_stat *ps)
{
	char path[64], line[1024];
	unsigned long long utime, stime, start;
	const char *p;
	FILE *fp;
	size_t n;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	else
		snprintf(path, sizeof(path), "/proc/self/stat");
	fp = fopen(path, "re");
	if (!fp)
		return -1;
	n = fread(line, 1, sizeof(line) - 1, fp);
	fclose(fp);
	line[n] = '\0';
	/* The command name (field 2) is in parentheses and may hold spaces or ')': the fields
	 * start after the last ')'. */
	p = strrchr(line, ')');
	if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d "
			    "%*d %*d %*d %*d %llu %llu %llu", &utime, &stime, &start, &ps->vsize,
			 &ps->rss_pages) != 5)
		return -1;
	ps->cpu_s = (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
	ps->start_ticks = (double)start;
	return 0;
}

/* The boot time in seconds since the epoch (/proc/stat's btime), or 0. */
static double boot_time(void)
{
	char line[256];
	unsigned long long bt = 0;
	FILE *fp = fopen("/proc/stat", "re");

	if (!fp)
		return 0.0;
	while (fgets(line, sizeof(line), fp))
		if (sscanf(line, "btime %llu", &bt) == 1)
			break;
	fclose(fp);
	return (double)bt;
}

/* Descriptors open in this process, the one that lists them left out; -1 when unreadable. */
static long open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	const struct dirent *e;
	long n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1;
}

void dps_fe_metrics_process(struct dps_frontend *f, FILE *o)
{
	const double page = (double)sysconf(_SC_PAGESIZE), tick = (double)sysconf(_SC_CLK_TCK);
	static struct proc_stat rs[1024]; /* (world) (static: 32 KB; only the loop thread scrapes) */
	int pids[1024];
	const int world = dps_sup_rank_pids(pids, (int)(sizeof(pids) / sizeof(pids[0])));
	const int tp = f->o.tp > 0 ? f->o.tp : 1;
	struct proc_stat ps;
	struct rlimit rl;
	const long fds = open_fds();

	if (!proc_stat_read(0, &ps)) {
		fprintf(o, "# HELP process_cpu_seconds_total User and system CPU time of the "
			   "supervisor (the process serving /metrics; the ranks are "
			   "dpshard:rank_cpu_seconds_total).\n"
			   "# TYPE process_cpu_seconds_total counter\n"
			   "process_cpu_seconds_total %.2f\n", ps.cpu_s);
		fprintf(o, "# HELP process_virtual_memory_bytes Virtual memory of the supervisor.\n"
			   "# TYPE process_virtual_memory_bytes gauge\n"
			   "process_virtual_memory_bytes %llu\n", ps.vsize);
		fprintf(o, "# HELP process_resident_memory_bytes Resident memory of the supervisor "
			   "(the ranks are dpshard:rank_resident_memory_bytes).\n"
			   "# TYPE process_resident_memory_bytes gauge\n"
			   "process_resident_memory_bytes %.0f\n", (double)ps.rss_pages * page);
		fprintf(o, "# HELP process_start_time_seconds Start of the supervisor, in seconds "
			   "since the epoch.\n# TYPE process_start_time_seconds gauge\n"
			   "process_start_time_seconds %.2f\n", boot_time() + ps.start_ticks / tick);
	}
	if (fds >= 0)
		fprintf(o, "# HELP process_open_fds Descriptors open in the supervisor.\n"
			   "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n", fds);
	if (!getrlimit(RLIMIT_NOFILE, &rl))
		fprintf(o, "# HELP process_max_fds The supervisor's descriptor limit.\n"
			   "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n",
			(unsigned long long)(rl.rlim_cur == RLIM_INFINITY ? (rlim_t)-1 : rl.rlim_cur));
	/* Each rank by itself: its private weights and KV cache, and the pages of the shared
	 * segment it touched (which every rank that touched them also counts). */
	/* Each rank's stat read once per scrape (pids[r] = 0 after: gone, left out of both). */
	for (int r = 0; r < world; r++)
		if (pids[r] > 0 && proc_stat_read(pids[r], &rs[r]))
			pids[r] = 0;
	fprintf(o, "# HELP dpshard:rank_resident_memory_bytes Resident memory of a rank (shared "
		   "pages counted by each rank that touched them: do not sum for a total).\n"
		   "# TYPE dpshard:rank_resident_memory_bytes gauge\n");
	for (int r = 0; r < world; r++)
		if (pids[r] > 0)
			fprintf(o, "dpshard:rank_resident_memory_bytes{rank=\"%d\",engine=\"%d\"} "
				   "%.0f\n", r, r / tp, (double)rs[r].rss_pages * page);
	fprintf(o, "# HELP dpshard:rank_cpu_seconds_total User and system CPU time of a rank "
		   "(since it last started).\n# TYPE dpshard:rank_cpu_seconds_total counter\n");
	for (int r = 0; r < world; r++)
		if (pids[r] > 0)
			fprintf(o, "dpshard:rank_cpu_seconds_total{rank=\"%d\",engine=\"%d\"} %.2f\n",
				r, r / tp, rs[r].cpu_s);
}

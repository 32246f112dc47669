/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/hang.c - how long a rank's watched word stood still, and whether its silence
 * is its own (see hang.h). Called by the supervisor's progress check.
 */
#include <stdio.h>
#include <string.h>

#include "engine/runtime/hang.h"
#include "engine/runtime/supervisor.h"

uint64_t dps_hang_watch_check(struct dps_hang_watch *h, uint64_t count, int expected,
			      uint64_t now_ns)
{
	if (!expected) {
		h->since_ns = 0;
		h->count = count;
		return 0;
	}
	if (!h->since_ns || count != h->count) {
		/* Just became expected, or moved: the clock starts now. */
		h->since_ns = now_ns ? now_ns : 1;
		h->count = count;
		return 0;
	}
	return now_ns - h->since_ns;
}

/* See hang.h. */
int dps_rank_silence_is_its_own(pid_t pid, uint64_t *ran)
{
	char path[64], buf[512], *p;
	unsigned long long run_ns = 0;
	FILE *f;
	size_t n;
	char state;

	snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
	if (!(f = fopen(path, "re")))
		return 1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	/* "pid (comm) S ...": comm may hold spaces and parentheses, the last ')' ends it. */
	if (!(p = strrchr(buf, ')')) || p[1] != ' ')
		return 1;
	state = p[2];
	if (state != 'R')
		return 1;
	/* The main thread's time on a CPU, in ns (proc(5) schedstat): the thread that beats. */
	snprintf(path, sizeof(path), "/proc/%ld/schedstat", (long)pid);
	if (!(f = fopen(path, "re")))
		return 1;
	n = fscanf(f, "%llu", &run_ns) == 1;
	fclose(f);
	if (!n)
		return 1;
	if (!*ran) {
		*ran = (uint64_t)run_ns + 1;
		return 0;
	}
	/* More than a millisecond on a CPU without one beat: not a wait of ours. */
	return (uint64_t)run_ns + 1 > *ran + 1000000ull;
}

/* SPDX-License-Identifier: MIT */
/*
 * common/util.c - clock, number parsing and formatting shared by the command line and the
 * engine. Parsers here read user input, so they reject trailing junk and overflow.
 */
#include <ctype.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/mman.h>

#include "common/dps.h"

uint64_t dps_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void *dps_alloc_huge(size_t bytes)
{
	const size_t huge = (size_t)2 << 20;
	void *p = NULL;

	if (bytes >= huge) {
		const size_t r = (bytes + huge - 1) / huge * huge;

		if (posix_memalign(&p, huge, r))
			return NULL;
		(void)madvise(p, r, MADV_HUGEPAGE);
		memset(p, 0, bytes);
		return p;
	}
	return calloc(1, bytes ? bytes : 1);
}

int dps_cpus_allowed(void)
{
	cpu_set_t set;
	int n;

	if (sched_getaffinity(0, sizeof(set), &set))
		return 1;
	n = CPU_COUNT(&set);
	return n > 0 ? n : 1;
}

int dps_parse_size(const char *s, size_t *out)
{
	unsigned long long v;
	size_t mult = 1;
	char *end;

	if (!s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -DPS_ETOOBIG;
	if (*end) {
		switch (toupper((unsigned char)*end)) {
		case 'K': mult = 1ull << 10; break;
		case 'M': mult = 1ull << 20; break;
		case 'G': mult = 1ull << 30; break;
		case 'T': mult = 1ull << 40; break;
		case 'B': mult = 1; end--; break;
		default: return -EINVAL;
		}
		end++;
		if (!strcasecmp(end, "iB") || !strcasecmp(end, "B"))
			end += strlen(end);
		if (*end)
			return -EINVAL;
	}
	if (v > SIZE_MAX || dps_size_mul((size_t)v, mult, out))
		return -DPS_ETOOBIG;
	return 0;
}

int dps_parse_int(const char *s, long lo, long hi, long *out)
{
	long v;
	char *end;

	if (!s || !*s)
		return -EINVAL;
	errno = 0;
	v = strtol(s, &end, 10);
	if (*end || end == s)
		return -EINVAL;
	if (errno || v < lo || v > hi)
		return -ERANGE;
	*out = v;
	return 0;
}

const char *dps_fmt_bytes(size_t n, char *buf, size_t len)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)n;
	int u = 0;

	while (v >= 1024.0 && u < 4) {
		v /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%zu B", n);
	else
		snprintf(buf, len, "%.1f %s", v, unit[u]);
	return buf;
}

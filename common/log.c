/* SPDX-License-Identifier: MIT */
/*
 * common/log.c - one line per event on stderr: "dpshard[role] LEVEL: message". journald
 * reads stderr when run as a service; each line is written with a single write(2) so lines
 * from different rank processes do not interleave.
 */
#include <string.h>
#include <unistd.h>

#include "common/dps.h"

static enum dps_log_level log_level = DPS_LOG_INFO;
static char log_role[32] = "dpshard";

void dps_log_set_level(enum dps_log_level lvl)
{
	log_level = lvl;
}

void dps_log_set_role(const char *role)
{
	snprintf(log_role, sizeof(log_role), "%s", role);
}

void dps_log(enum dps_log_level lvl, const char *fmt, ...)
{
	static const char *const names[] = { "debug", "info", "warning", "error" };
	char line[1024];
	va_list ap;
	int n;

	if (lvl < log_level)
		return;
	n = snprintf(line, sizeof(line), "dpshard[%s] %s: ", log_role, names[lvl]);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, (size_t)n) < 0) {
		/* nothing sensible to do when stderr is gone */
	}
}

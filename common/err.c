/* SPDX-License-Identifier: MIT */
/*
 * common/err.c - error words and the assertion handler. Called from everywhere; cheap and
 * async-signal-unsafe only in dps_assert_fail (which aborts anyway).
 */
#include <string.h>

#include "common/dps.h"

const char *dps_strerror(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case 0:
		return "success";
	case DPS_EABORT:
		return "aborted: a peer rank died or the instance is shutting down";
	case DPS_ECONFIG:
		return "invalid configuration";
	case DPS_ENOSHM:
		return "not enough space in /dev/shm";
	case DPS_ETOOBIG:
		return "size too large";
	case DPS_EPROTO:
		return "malformed message";
	case DPS_ERANK:
		return "a rank process failed";
	default:
		if (err < DPS_EABORT)
			return strerror(err);
		return "unknown error";
	}
}

void dps_assert_fail(const char *expr, const char *file, int line, const char *func)
{
	fprintf(stderr, "dpshard: assertion failed: %s (%s:%d, %s)\n", expr, file, line, func);
	fflush(stderr);
	abort();
}

/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_conf.c - fuzz target for the --config file parser: any input is refused
 * with a message or gives entries, on increasing lines, whose keys are non-empty runs of
 * [A-Za-z0-9-] and whose values are shorter than a line and hold no newline.
 */
#include <stdint.h>
#include <string.h>

#include "common/conf.h"
#include "common/dps.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int check(void *arg, const char *key, const char *value, int line)
{
	int *last = arg;

	DPS_ASSERT(*key && line > *last);
	*last = line;
	for (const char *p = key; *p; p++)
		DPS_ASSERT((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
			   (*p >= '0' && *p <= '9') || *p == '-');
	DPS_ASSERT(strlen(value) < DPS_CONF_MAX_LINE && !strchr(value, '\n'));
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256] = "";
	int last = 0;

	if (dps_conf_parse((const char *)data, size, check, &last, err, sizeof(err)))
		DPS_ASSERT(err[0]);
	return 0;
}

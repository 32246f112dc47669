/* SPDX-License-Identifier: MIT */
/*
 * tools/cmd_quantize.c - `dpshard quantize IN OUT`: an INT8 checkpoint of a model directory
 * (engine/model/quantize.h), so that a large model is quantized once.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/quantize.h"
#include "tools/cmd.h"
#include "tools/flags.h"

int dps_cmd_quantize(int argc, char **argv)
{
	char *pos[2], err[1024];
	int npos, rc, quiet = 0;
	const struct dps_flag flags[] = {
		{ "quiet", DPS_FLAG_BOOL, &quiet, NULL, "no progress line per tensor" },
		DPS_FLAGS_END
	};

	rc = dps_flags_parse(flags, argc, argv, "quantize", "IN_DIR OUT_DIR [--quiet]\n"
			     "  writes OUT_DIR (new) with IN_DIR's linear weights and LM head as "
			     "INT8 blocks of 32\n  with F16 scales (34 bytes per 32 weights), the "
			     "rest copied; dpshard loads it as INT8", pos, 2, &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (npos != 2) {
		fprintf(stderr, "dpshard quantize: expected IN_DIR OUT_DIR\n");
		return 2;
	}
	rc = dps_quantize_dir(pos[0], pos[1], !quiet, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dpshard quantize: %s\n", err);
		return rc == -DPS_ECONFIG || rc == -EEXIST || rc == -ENOENT ? 2 : 1;
	}
	printf("wrote %s (INT8 linear weights, quantization_config dpshard_int8)\n", pos[1]);
	return 0;
}

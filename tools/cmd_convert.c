/* SPDX-License-Identifier: MIT */
/*
 * tools/cmd_convert.c - `dpshard convert`: llama2.c checkpoints in (engine/model/convert.c), GGUF
 * out (engine/model/gguf.c).
 */
#include <stdio.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/convert.h"
#include "engine/model/gguf.h"
#include "tools/cmd.h"
#include "tools/flags.h"

int dps_cmd_convert(int argc, char **argv)
{
	const char *dtype = "f32";
	char *pos[4], err[512];
	enum dps_st_dtype dt;
	int npos, rc;
	const struct dps_flag flags[] = {
		{ "dtype", DPS_FLAG_STR, &dtype, "T",
		  "llama2c: tensor type written, f32, bf16 or f16 (gguf writes f32)" },
		DPS_FLAGS_END
	};

	rc = dps_flags_parse(flags, argc, argv, "convert",
			     "llama2c MODEL.bin TOKENIZER.bin OUTDIR [--dtype f32|bf16|f16]\n"
			     "       dpshard convert gguf MODEL_DIR OUT.gguf", pos, 4, &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (npos == 3 && !strcmp(pos[0], "gguf")) {
		/* Export, for llama.cpp: the same weights in its format. */
		if (strcmp(dtype, "f32")) {
			fprintf(stderr, "dpshard convert gguf writes F32 only (--dtype %s); make other "
					"types from it with llama.cpp's llama-quantize\n", dtype);
			return 2;
		}
		rc = dps_gguf_export(pos[1], pos[2], err, sizeof(err));
		if (rc) {
			fprintf(stderr, "dpshard convert: %s\n", err);
			return rc == -DPS_ECONFIG ? 2 : 1;
		}
		printf("wrote %s (GGUF, F32, llama.cpp's llama architecture)\n", pos[2]);
		return 0;
	}
	if (npos != 4 || strcmp(pos[0], "llama2c")) {
		fprintf(stderr, "dpshard convert: expected `llama2c MODEL.bin TOKENIZER.bin OUTDIR` "
				"(import) or `gguf MODEL_DIR OUT.gguf` (export)\n");
		return 2;
	}
	if (dps_tool_parse_dtype("convert", dtype, &dt))
		return 2;
	rc = dps_convert_llama2c(pos[1], pos[2], pos[3], dt, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dpshard convert: %s\n", err);
		return 1;
	}
	printf("wrote %s (config.json, model.safetensors, tokenizer.bin)\n", pos[3]);
	return 0;
}


/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_safetensors.c - fuzz target for the safetensors header parser. Input: 8
 * bytes giving the size of the data area, then the JSON header. Whatever the input, the parser
 * must either refuse it with a message or return tensors whose byte ranges lie inside the data
 * area, match dtype x shape, do not overlap, and are sorted by name. Built with libFuzzer when
 * clang has it (tests/fuzz.sh), and always with the replay driver (tests/fuzz/replay.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dps_st_file f;
	char err[512] = "";
	uint64_t ds;

	if (size < 8)
		return 0;
	memcpy(&ds, data, 8);
	ds %= 1ull << 40;
	if (dps_st_parse_header((const char *)data + 8, size - 8, ds, &f, err, sizeof(err))) {
		DPS_ASSERT(err[0]);
		return 0;
	}
	for (int i = 0; i < f.n; i++) {
		const struct dps_st_tensor *t = &f.t[i];

		DPS_ASSERT(t->begin >= f.data_off && t->begin <= t->end);
		DPS_ASSERT(t->end <= f.data_off + ds);
		DPS_ASSERT(t->end - t->begin == t->numel * dps_st_dtype_size(t->dtype));
		DPS_ASSERT(i == 0 || strcmp(f.t[i - 1].name, t->name) < 0);
		DPS_ASSERT(dps_st_find(&f, t->name) == t);
		for (int j = 0; j < i; j++)
			DPS_ASSERT(t->begin == t->end || f.t[j].begin == f.t[j].end ||
				   t->end <= f.t[j].begin || f.t[j].end <= t->begin);
	}
	dps_st_free(&f);
	return 0;
}

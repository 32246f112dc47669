/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_request.c - fuzz target for the JSON request parser (generate --requests,
 * later the HTTP bodies): any input is refused with a message, or gives a request whose ids
 * are in the vocabulary, BOS first, with sane parameters.
 */
#include <stdint.h>
#include <string.h>

#include "common/dps.h"
#include "engine/api/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dps_parsed_req r;
	char err[256] = "";

	if (dps_request_parse((const char *)data, size, NULL, 512, 1, 16, &r, err, sizeof(err))) {
		DPS_ASSERT(err[0]);
		return 0;
	}
	DPS_ASSERT(r.n_prompt >= 1 && r.prompt[0] == 1);
	for (int i = 0; i < r.n_prompt; i++)
		DPS_ASSERT(r.prompt[i] >= 0 && r.prompt[i] < 512);
	DPS_ASSERT(r.p.max_tokens >= 1 && r.p.n_stop >= 0 && r.p.n_stop <= DPS_MAX_STOP);
	DPS_ASSERT(r.p.sampling.top_p > 0 && r.p.sampling.top_p <= 1);
	DPS_ASSERT(r.p.sampling.temperature >= 0);
	dps_parsed_req_free(&r);
	return 0;
}

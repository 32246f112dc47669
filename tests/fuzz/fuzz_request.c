/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_request.c - fuzz target for the request parser on a line of generate
 * --requests (fuzz_http.c fuzzes it on completions bodies): any input is refused with a message, or gives a request whose ids
 * are in the vocabulary (as given), with sane parameters.
 */
#include <stdint.h>
#include <string.h>

#include "common/dps.h"
#include "engine/api/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct dps_req_limits lim = { .tok = NULL, .vocab = 512, .end = { 1, 2 }, .n_end = 2,
					    .default_max_tokens = 16 };
	struct dps_request r;
	char err[256] = "";

	if (dps_request_parse((const char *)data, size, DPS_REQ_LINE, &lim, &r, err, sizeof(err))) {
		DPS_ASSERT(err[0]);
		dps_request_free(&r);
		return 0;
	}
	DPS_ASSERT(r.n_prompt >= 1);
	for (int i = 0; i < r.n_prompt; i++)
		DPS_ASSERT(r.prompt[i] >= 0 && r.prompt[i] < 512);
	DPS_ASSERT(r.p.max_tokens >= 1 && r.p.n_stop >= 0 && r.p.n_stop <= DPS_MAX_STOP);
	DPS_ASSERT(r.p.sampling.top_p > 0 && r.p.sampling.top_p <= 1);
	DPS_ASSERT(r.p.sampling.temperature >= 0 && r.p.sampling.temperature <= 2);
	DPS_ASSERT(r.p.sampling.top_k >= 0 && r.n_stop == 0);
	DPS_ASSERT(r.p.sampling.min_p >= 0 && r.p.sampling.min_p <= 1);
	DPS_ASSERT(r.p.pen.repetition == 0 || r.p.pen.repetition > 0);
	DPS_ASSERT(r.p.pen.presence >= -2 && r.p.pen.presence <= 2);
	DPS_ASSERT(r.p.pen.frequency >= -2 && r.p.pen.frequency <= 2);
	DPS_ASSERT(r.p.min_tokens >= 0 && r.p.min_tokens <= r.p.max_tokens);
	DPS_ASSERT(r.p.n_bias >= 0 && r.p.n_bias <= DPS_MAX_BIAS);
	for (int i = 0; i < r.p.n_bias; i++)
		DPS_ASSERT(r.p.bias[i].id >= 0 && r.p.bias[i].id < 512 && r.p.bias[i].bias >= -100 &&
			   r.p.bias[i].bias <= 100);
	dps_request_free(&r);
	return 0;
}

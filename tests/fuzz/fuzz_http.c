/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_http.c - fuzz target for the HTTP request path of `dpshard serve`: the
 * request parser under the server's limits (any input is an error status, incomplete, or one
 * request whose body fits the limit), then the request parser on the body as a completions
 * body (refused with a message, or a request whose ids are in the vocabulary, as given,
 * the end ids among the stop ids, within the context).
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "common/dps.h"
#include "engine/api/http.h"
#include "engine/api/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void body(const char *b, size_t n)
{
	const struct dps_req_limits lim = { .tok = NULL, .vocab = 512, .end = { 1, 2 }, .n_end = 2,
					    .max_model_len = 256, .default_max_tokens = 16,
					    .default_temperature = 1.0f };
	struct dps_request r;
	char err[256] = "";
	const int rc = dps_request_parse(b, n, DPS_REQ_COMPLETIONS, &lim, &r, err, sizeof(err));

	if (rc) {
		DPS_ASSERT(rc == -ENOMEM || (rc == -EINVAL && err[0]));
		dps_request_free(&r);
		return;
	}
	DPS_ASSERT(r.n_prompt >= 1);
	for (int i = 0; i < r.n_prompt; i++)
		DPS_ASSERT(r.prompt[i] >= 0 && r.prompt[i] < 512);
	DPS_ASSERT(r.p.max_tokens >= 1 && r.n_prompt + r.p.max_tokens <= 256);
	{
		int bos = 0;

		DPS_ASSERT(r.p.n_stop >= 0 && r.p.n_stop <= DPS_MAX_STOP);
		for (int i = 0; i < r.p.n_stop; i++)
			bos |= r.p.stop[i] == 1;
		/* a completion ends at the end ids (1 here), unless it asked for "ignore_eos" */
		DPS_ASSERT(bos || memmem(b, n, "ignore_eos", 10));
	}
	DPS_ASSERT(r.p.sampling.top_p > 0 && r.p.sampling.top_p <= 1);
	DPS_ASSERT(r.p.sampling.temperature >= 0 && r.p.sampling.temperature <= 2);
	DPS_ASSERT(r.n_stop >= 0 && r.n_stop <= DPS_REQ_MAX_STOP);
	for (int i = 0; i < r.n_stop; i++)
		DPS_ASSERT(r.stop[i] && strlen(r.stop[i]) >= 1);
	dps_request_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char method[16], path[256];
	size_t blen = 0;
	const int st = dps_http_parse_probe((const char *)data, size, 4096, method, sizeof(method),
					    path, sizeof(path), &blen);
	const char *sep;

	DPS_ASSERT(st == 0 || st == 100 || (st >= 400 && st < 500));
	if (st == 0)
		DPS_ASSERT(blen <= 4096 && method[0]);
	/* The body parser on what follows the headers (or on everything). */
	sep = size >= 4 ? memmem(data, size, "\r\n\r\n", 4) : NULL;
	if (sep)
		body(sep + 4, size - (size_t)(sep + 4 - (const char *)data));
	else
		body((const char *)data, size);
	return 0;
}

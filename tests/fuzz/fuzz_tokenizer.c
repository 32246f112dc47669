/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_tokenizer.c - fuzz target for the llama2.c tokenizer loader, encoder and
 * decoder. Input: 2 bytes of vocabulary size, then a tokenizer.bin. A file that loads must
 * encode a few prompts (every id inside the vocabulary) and decode every id without fault.
 */
#include <stdint.h>
#include <string.h>

#include "common/dps.h"
#include "engine/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const prompts[] = { "", "Once upon a time", "a\xc3\xa9\xe4\xb8\xad\xff z",
					       "\x80\x80" };
	struct dps_tokenizer t;
	char err[256] = "", buf[8];
	int ids[256], vocab;
	size_t n, l;

	if (size < 2)
		return 0;
	vocab = 1 + (data[0] | data[1] << 8) % 600;
	if (dps_tokenizer_load_mem(&t, data + 2, size - 2, vocab, err, sizeof(err))) {
		DPS_ASSERT(err[0]);
		return 0;
	}
	for (size_t p = 0; p < sizeof(prompts) / sizeof(prompts[0]); p++) {
		if (dps_tokenizer_encode(&t, prompts[p], strlen(prompts[p]), 1, ids, 256, &n))
			continue;
		for (size_t i = 0; i < n; i++)
			DPS_ASSERT(ids[i] >= 0 && ids[i] < vocab);
	}
	for (int id = -1; id <= vocab; id++) {
		const char *piece = dps_tokenizer_decode(&t, 1, id, buf, &l);

		DPS_ASSERT(piece && l <= t.max_token_length);
	}
	dps_tokenizer_free(&t);
	return 0;
}

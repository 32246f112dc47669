/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_tokenizer.c - fuzz target for the llama2.c tokenizer loader, encoder and
 * decoder. Input: 2 bytes of vocabulary size, a signed byte each of BOS and EOS id, then a
 * tokenizer.bin. A file that loads must encode a few prompts with and without BOS and EOS
 * (every id inside the vocabulary, BOS first and EOS last when asked) and decode every id
 * without fault.
 */
#include <stdint.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/tok_llama2.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const prompts[] = { "", "Once upon a time", "a\xc3\xa9\xe4\xb8\xad\xff z",
					       "\x80\x80" };
	struct dps_model_config cfg = { 0 };
	struct dps_tok_llama2 t;
	char err[256] = "", buf[8];
	int ids[256], vocab;
	size_t n, l;

	if (size < 4)
		return 0;
	vocab = 1 + (data[0] | data[1] << 8) % 600;
	cfg.vocab_size = vocab;
	cfg.bos_token_id = (int8_t)data[2];
	cfg.eos_token_id = (int8_t)data[3];
	if (dps_tok_llama2_load_mem(&t, data + 4, size - 4, &cfg, err, sizeof(err))) {
		DPS_ASSERT(err[0]);
		return 0;
	}
	DPS_ASSERT(t.bos_id == cfg.bos_token_id && t.eos_id == cfg.eos_token_id);
	for (size_t p = 0; p < sizeof(prompts) / sizeof(prompts[0]); p++) {
		for (unsigned flags = 0; flags < 4; flags++) {
			if (dps_tok_llama2_encode(&t, prompts[p], strlen(prompts[p]), flags, ids, 256,
						 &n))
				continue;
			for (size_t i = 0; i < n; i++)
				DPS_ASSERT(ids[i] >= 0 && ids[i] < vocab);
			if (flags & DPS_TOK_LLAMA2_BOS)
				DPS_ASSERT(n >= 1 && ids[0] == t.bos_id);
			if (flags & DPS_TOK_LLAMA2_EOS)
				DPS_ASSERT(n >= 1 && ids[n - 1] == t.eos_id);
		}
	}
	for (int id = -1; id <= vocab; id++) {
		const char *piece = dps_tok_llama2_decode(&t, t.bos_id, id, buf, &l);

		DPS_ASSERT(piece && l <= t.max_token_length);
	}
	dps_tok_llama2_free(&t);
	return 0;
}

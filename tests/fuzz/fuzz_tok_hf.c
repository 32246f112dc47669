/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_tok_hf.c - fuzz target for the tokenizer.json backend: load, encode, decode.
 * Input: a tokenizer.json, optionally followed by a NUL byte and a tokenizer_config.json. A
 * file that loads must encode a few prompts (and the input itself, made valid UTF-8) with and
 * without special tokens, every id inside the vocabulary, the same ids again under a limit of
 * exactly that many and -E2BIG under one fewer; and decode them, any out-of-range id and every
 * id of the vocabulary, always to valid NUL-terminated UTF-8. A file that does not load must
 * say why.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "common/utf8.h"
#include "engine/model/tok.h"
#include "engine/model/tok_hf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_decode(const struct dps_tok_hf *t, const int *ids, size_t n)
{
	for (unsigned flags = 0; flags <= DPS_TOK_SKIP_SPECIAL; flags += DPS_TOK_SKIP_SPECIAL) {
		char *text;
		size_t len;

		if (dps_tok_hf_decode(t, ids, n, flags, &text, &len))
			continue; /* out of memory only */
		DPS_ASSERT(text[len] == '\0');
		DPS_ASSERT(dps_utf8_valid(text, len));
		free(text);
	}
}

static void check_encode(const struct dps_tok_hf *t, const char *s, size_t len)
{
	const int vocab = dps_tok_hf_vocab_size(t);

	for (unsigned flags = 0; flags <= DPS_TOK_ADD_SPECIAL; flags += DPS_TOK_ADD_SPECIAL) {
		int *ids, *again;
		size_t n, m;

		if (dps_tok_hf_encode(t, s, len, flags, 0, &ids, &n))
			continue;
		for (size_t i = 0; i < n; i++)
			DPS_ASSERT(ids[i] >= 0 && ids[i] < vocab);
		if (n && !dps_tok_hf_encode(t, s, len, flags, n, &again, &m)) {
			DPS_ASSERT(m == n && !memcmp(ids, again, n * sizeof(*ids)));
			free(again);
		}
		if (n > 1)
			DPS_ASSERT(dps_tok_hf_encode(t, s, len, flags, n - 1, &again, &m) == -E2BIG);
		check_decode(t, ids, n);
		free(ids);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const prompts[] = {
		"", " ", "Hello world! It's 2024.", "  two\n\nlines\r\n\tend ", "<s></s><|im_start|>",
		"caf\xc3\xa9 cafe\xcc\x81 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80", "\xe2\x96\x81x",
	};
	const int odd[] = { -1, 0, 1, 2, 1 << 30 };
	const uint8_t *nul = memchr(data, 0, size);
	const size_t jlen = nul ? (size_t)(nul - data) : size;
	struct dps_tok_hf *t;
	char err[256] = "";
	char *text;
	size_t tlen;

	if (dps_tok_hf_load_mem(&t, (const char *)data, jlen, nul ? (const char *)nul + 1 : NULL,
				nul ? size - jlen - 1 : 0, err, sizeof(err))) {
		DPS_ASSERT(err[0]);
		return 0;
	}
	DPS_ASSERT(dps_tok_hf_vocab_size(t) >= 0);
	for (size_t p = 0; p < sizeof(prompts) / sizeof(prompts[0]); p++)
		check_encode(t, prompts[p], strlen(prompts[p]));
	text = dps_utf8_lossy((const char *)data, size < 4096 ? size : 4096, &tlen);
	if (text) {
		check_encode(t, text, tlen);
		free(text);
	}
	check_decode(t, odd, sizeof(odd) / sizeof(odd[0]));
	for (int id = 0; id < dps_tok_hf_vocab_size(t) && id < 4096; id++) {
		check_decode(t, &id, 1);
		(void)dps_tok_hf_is_special(t, id);
	}
	dps_tok_hf_free(t);
	return 0;
}

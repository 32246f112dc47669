/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_llama2c.c - fuzz target for the llama2.c checkpoint importer
 * (dps_convert_llama2c_mem, the step of `dpshard convert llama2c` that reads the file).
 * Input: a whole checkpoint, 28-byte header then float32 weights.
 *
 * An independent oracle computes from the header alone whether the shape is one the importer
 * must accept, and the file size it implies. The importer must accept the input exactly when
 * the oracle does and the size matches; a failure must leave a message. When the oracle
 * accepts the shape but the input has another size, the header is imported again over weights
 * of the implied size (the input repeated, up to 256 KiB), so that every shape the fuzzer
 * reaches is laid out, not only the sizes it happens to hit. Every import that succeeds must
 * give tensors inside the weights that cover them all but the two rope tables, a config the
 * model loader accepts, and must only move 32-bit words around (the rotary permutation).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/convert.h"

#define SHAPE_CAP (256u << 10)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The file size the header implies, or 0 when a field breaks a rule of convert.h's format. */
static uint64_t oracle_bytes(const int32_t h[7], int64_t *rope_floats)
{
	const int64_t dim = h[0], hidden = h[1], layers = h[2], heads = h[3], kv = h[4];
	const int64_t seq = h[6], vocab = h[5] < 0 ? -(int64_t)h[5] : h[5];
	int64_t hd, n;

	if (dim < 2 || dim > 65536 || hidden < 1 || hidden > 262144 || layers < 1 ||
	    layers > 1024 || heads < 1 || kv < 1 || seq < 1 || seq > (1 << 24) || vocab < 3 ||
	    vocab > (1 << 24))
		return 0;
	if (dim % heads || heads % kv || (dim / heads) % 2)
		return 0;
	hd = dim / heads;
	n = vocab * dim * (h[5] > 0 ? 1 : 2) +
	    layers * (2 * dim + 2 * dim * dim + 2 * kv * hd * dim + 3 * hidden * dim) + dim +
	    seq * hd;
	*rope_floats = seq * hd;
	return 28 + 4 * (uint64_t)n;
}

static uint32_t xor_words(const uint32_t *w, size_t n)
{
	uint32_t x = 0;

	for (size_t i = 0; i < n; i++)
		x ^= w[i];
	return x;
}

/* Imports buf (len bytes, aligned), which the oracle says is valid, and checks the result. */
static void import_valid(uint32_t *buf, size_t len, int64_t rope_floats)
{
	const int32_t *h = (const int32_t *)buf;
	const uint32_t before = xor_words(buf, len / 4);
	const float *lo = (const float *)buf + 7, *hi = (const float *)buf + len / 4;
	struct dps_convert_model m;
	char err[512] = "";
	uint64_t covered = 0;
	int rc;

	rc = dps_convert_llama2c_mem(buf, len, DPS_ST_F32, "fuzz", &m, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "fuzz_llama2c: a valid checkpoint was refused: %s\n", err);
		DPS_ASSERT(rc == 0);
	}
	DPS_ASSERT(m.n_tensors == 9 * h[2] + 2 + (h[5] < 0));
	for (int i = 0; i < m.n_tensors; i++) {
		const struct dps_st_writer_tensor *t = &m.tensors[i];
		const uint64_t numel = t->ndim == 1 ? t->shape[0] : t->shape[0] * t->shape[1];

		DPS_ASSERT(t->ndim == 1 || t->ndim == 2);
		DPS_ASSERT(t->name[0] && t->dtype == DPS_ST_F32 && numel > 0);
		DPS_ASSERT(t->data >= lo && t->data <= hi && numel <= (uint64_t)(hi - t->data));
		covered += numel;
	}
	/* Everything but the rope tables, each float once. */
	DPS_ASSERT(covered + (uint64_t)rope_floats == (uint64_t)(hi - lo));
	/* What dps_model_config_parse requires of a config. */
	DPS_ASSERT(m.cfg.hidden_size == h[0] && m.cfg.intermediate_size == h[1] &&
		   m.cfg.num_hidden_layers == h[2] && m.cfg.num_attention_heads == h[3] &&
		   m.cfg.num_key_value_heads == h[4] && m.cfg.max_position_embeddings == h[6]);
	DPS_ASSERT(m.cfg.head_dim % 2 == 0 &&
		   m.cfg.num_attention_heads * m.cfg.head_dim == m.cfg.hidden_size &&
		   m.cfg.num_attention_heads % m.cfg.num_key_value_heads == 0);
	DPS_ASSERT(m.cfg.vocab_size >= 3 && m.cfg.bos_token_id >= 0 &&
		   m.cfg.bos_token_id < m.cfg.vocab_size && m.cfg.eos_token_id >= 0 &&
		   m.cfg.eos_token_id < m.cfg.vocab_size);
	DPS_ASSERT(m.cfg.tie_word_embeddings == (h[5] > 0));
	/* The permutation moves rows: the words are the same, in another order. */
	DPS_ASSERT(xor_words(buf, len / 4) == before);
	dps_convert_model_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dps_convert_model m;
	char err[512] = "";
	int32_t h[7];
	int64_t rope = 0;
	uint64_t want;
	uint32_t *buf;
	int rc;

	if (size < DPS_LLAMA2C_HEADER_BYTES) {
		rc = dps_convert_llama2c_mem((void *)data, size, DPS_ST_F32, "fuzz", &m, err,
					     sizeof(err));
		DPS_ASSERT(rc == -EINVAL && err[0] && !m.tensors);
		return 0;
	}
	memcpy(h, data, sizeof(h));
	want = oracle_bytes(h, &rope);
	/* An aligned, writable copy, as from mmap or malloc. */
	buf = malloc(size + 4);
	if (!buf)
		return 0;
	memcpy(buf, data, size);
	if (want == size) {
		import_valid(buf, size, rope);
	} else {
		rc = dps_convert_llama2c_mem(buf, size, DPS_ST_F32, "fuzz", &m, err, sizeof(err));
		if (rc == 0)
			fprintf(stderr, "fuzz_llama2c: accepted, the oracle says %llu bytes for %zu\n",
				(unsigned long long)want, size);
		DPS_ASSERT(rc == -EINVAL && err[0] && !m.tensors);
	}
	free(buf);
	/* The same header over weights of the size it implies. */
	if (want && want != size && want <= SHAPE_CAP) {
		unsigned char *b = malloc((size_t)want);

		if (!b)
			return 0;
		memcpy(b, data, DPS_LLAMA2C_HEADER_BYTES);
		for (size_t i = DPS_LLAMA2C_HEADER_BYTES, j = 0; i < want; i++, j++)
			b[i] = data[j % size];
		import_valid((uint32_t *)b, (size_t)want, rope);
		free(b);
	}
	return 0;
}

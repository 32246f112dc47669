/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_llama2.c - the llama2.c tokenizer (see tok_llama2.h). Reads outside input: every
 * length in the file is checked against the file size before it is used.
 */
#include <string.h>

#include "common/dps.h"
#include "engine/model/tok_llama2.h"

/*
 * Orders ids by piece, then by id, so that pieces repeated in a file sort the same way on
 * every C library (glibc's qsort is a merge sort today, not a promise). The vocabulary comes
 * through qsort_r's argument rather than a global, so threads can load tokenizers at once.
 */
static int cmp_piece(const void *a, const void *b, void *vocab)
{
	const int x = *(const int *)a, y = *(const int *)b;
	char *const *const v = vocab;
	const int c = strcmp(v[x], v[y]);

	if (c)
		return c;
	return (x > y) - (x < y);
}

/* Reads a tokenizer from f (size bytes); path names it in messages. Closes f. */
static int load_stream(struct dps_tok_llama2 *t, FILE *f, const char *path,
		       const struct dps_model_config *cfg, char *err, size_t errlen)
{
	const int vocab_size = cfg->vocab_size;
	int rc = -EINVAL, i;
	long size;

	memset(t, 0, sizeof(*t));
	if (vocab_size < 1) {
		/* id 0 (<unk>) stands for a byte that has no token */
		snprintf(err, errlen, "%s: a vocabulary of %d tokens cannot hold <unk>", path,
			 vocab_size);
		goto err;
	}
	/* encode emits both and decode compares with BOS: they must name tokens */
	if (cfg->bos_token_id < 0 || cfg->bos_token_id >= vocab_size ||
	    cfg->eos_token_id < 0 || cfg->eos_token_id >= vocab_size) {
		snprintf(err, errlen, "%s: bos_token_id %d and eos_token_id %d must be tokens of the "
			 "vocabulary of %d", path, cfg->bos_token_id, cfg->eos_token_id, vocab_size);
		goto err;
	}
	if (fseek(f, 0, SEEK_END) || (size = ftell(f)) < 4 || fseek(f, 0, SEEK_SET)) {
		snprintf(err, errlen, "%s: truncated", path);
		goto err;
	}
	if ((size_t)size < 4 + 8 * (size_t)vocab_size) {
		snprintf(err, errlen, "%s: %ld bytes cannot hold %d tokens", path, size, vocab_size);
		goto err;
	}
	t->vocab_size = vocab_size;
	t->bos_id = cfg->bos_token_id;
	t->eos_id = cfg->eos_token_id;
	t->vocab = calloc((size_t)vocab_size, sizeof(*t->vocab));
	t->vocab_len = calloc((size_t)vocab_size, sizeof(*t->vocab_len));
	t->scores = calloc((size_t)vocab_size, sizeof(*t->scores));
	t->sorted = calloc((size_t)vocab_size, sizeof(*t->sorted));
	if (!t->vocab || !t->vocab_len || !t->scores || !t->sorted) {
		snprintf(err, errlen, "%s: out of memory", path);
		rc = -ENOMEM;
		goto err;
	}
	if (fread(&t->max_token_length, 4, 1, f) != 1 || t->max_token_length > 4096) {
		snprintf(err, errlen, "%s: bad max_token_length", path);
		goto err;
	}
	for (i = 0; i < vocab_size; i++) {
		int32_t len;

		if (fread(&t->scores[i], 4, 1, f) != 1 || fread(&len, 4, 1, f) != 1) {
			snprintf(err, errlen, "%s: truncated at token %d of %d", path, i, vocab_size);
			goto err;
		}
		if (len < 0 || len > (int32_t)t->max_token_length || len > size) {
			snprintf(err, errlen, "%s: token %d has length %d (max %u)", path, i, len,
				 t->max_token_length);
			goto err;
		}
		t->vocab[i] = malloc((size_t)len + 1);
		if (!t->vocab[i]) {
			snprintf(err, errlen, "%s: out of memory", path);
			rc = -ENOMEM;
			goto err;
		}
		if (len && fread(t->vocab[i], (size_t)len, 1, f) != 1) {
			snprintf(err, errlen, "%s: truncated at token %d of %d", path, i, vocab_size);
			goto err;
		}
		t->vocab[i][len] = '\0';
		t->vocab_len[i] = (uint32_t)len;
		t->sorted[i] = i;
	}
	fclose(f);
	qsort_r(t->sorted, (size_t)vocab_size, sizeof(int), cmp_piece, t->vocab);
	t->byte_fallback = vocab_size > 258 && !strcmp(t->vocab[3], "<0x00>") &&
			   !strcmp(t->vocab[258], "<0xFF>");
	return 0;
err:
	fclose(f);
	dps_tok_llama2_free(t);
	return rc;
}

int dps_tok_llama2_load(struct dps_tok_llama2 *t, const char *path,
		       const struct dps_model_config *cfg, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	int rc;

	if (!f) {
		rc = -errno;
		memset(t, 0, sizeof(*t));
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return rc;
	}
	return load_stream(t, f, path, cfg, err, errlen);
}

int dps_tok_llama2_load_mem(struct dps_tok_llama2 *t, const void *buf, size_t len,
			   const struct dps_model_config *cfg, char *err, size_t errlen)
{
	FILE *f = len ? fmemopen((void *)buf, len, "rb") : NULL;

	if (!f) {
		memset(t, 0, sizeof(*t));
		snprintf(err, errlen, "tokenizer: empty or unreadable buffer");
		return -EINVAL;
	}
	return load_stream(t, f, "tokenizer", cfg, err, errlen);
}

void dps_tok_llama2_free(struct dps_tok_llama2 *t)
{
	if (t->vocab)
		for (int i = 0; i < t->vocab_size; i++)
			free(t->vocab[i]);
	free(t->vocab);
	free(t->vocab_len);
	free(t->scores);
	free(t->sorted);
	memset(t, 0, sizeof(*t));
}

int dps_tok_llama2_lookup(const struct dps_tok_llama2 *t, const char *piece, size_t len)
{
	int lo = 0, hi = t->vocab_size - 1;

	while (lo <= hi) {
		const int mid = (lo + hi) / 2, id = t->sorted[mid];
		int c = strncmp(t->vocab[id], piece, len);

		if (c == 0 && t->vocab_len[id] != len)
			c = t->vocab_len[id] < len ? -1 : 1;
		if (c == 0)
			return id;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return -1;
}

int dps_tok_llama2_encode(const struct dps_tok_llama2 *t, const char *text, size_t len,
			 unsigned flags, int *ids, size_t cap, size_t *n)
{
	const int bos = (flags & DPS_TOK_LLAMA2_BOS) != 0;
	char *buf = malloc(2 * (size_t)t->max_token_length + 8);
	size_t k = 0, i;

	if (!buf)
		return -ENOMEM;
#define PUSH(id)                                    \
	do {                                        \
		if (k >= cap) {                     \
			free(buf);                  \
			return -ENOSPC;             \
		}                                   \
		ids[k++] = (id);                    \
	} while (0)
	if (bos)
		PUSH(t->bos_id);
	if (len) {
		const int sp = dps_tok_llama2_lookup(t, " ", 1);

		if (sp >= 0)
			PUSH(sp);
	}
	/* One token per code point, or its bytes. */
	for (i = 0; i < len;) {
		size_t cl = 1;
		int id;

		while (i + cl < len && cl < 4 && ((unsigned char)text[i + cl] & 0xC0) == 0x80)
			cl++;
		id = dps_tok_llama2_lookup(t, text + i, cl);
		if (id >= 0) {
			PUSH(id);
		} else {
			for (size_t b = 0; b < cl; b++)
				PUSH(t->byte_fallback ? (unsigned char)text[i + b] + 3 : 0);
		}
		i += cl;
	}
	/* Greedy merges: the best-scoring adjacent pair, leftmost on ties. */
	for (;;) {
		float best = -1e30f;
		long best_at = -1;
		int best_id = -1;

		for (size_t j = (bos ? 1 : 0); j + 1 < k; j++) {
			const size_t l1 = t->vocab_len[ids[j]], l2 = t->vocab_len[ids[j + 1]];
			int id;

			if (l1 + l2 > 2 * (size_t)t->max_token_length + 4)
				continue;
			memcpy(buf, t->vocab[ids[j]], l1);
			memcpy(buf + l1, t->vocab[ids[j + 1]], l2);
			id = dps_tok_llama2_lookup(t, buf, l1 + l2);
			if (id >= 0 && t->scores[id] > best) {
				best = t->scores[id];
				best_at = (long)j;
				best_id = id;
			}
		}
		if (best_at < 0)
			break;
		ids[best_at] = best_id;
		memmove(ids + best_at + 1, ids + best_at + 2, (k - (size_t)best_at - 2) * sizeof(int));
		k--;
	}
	if (flags & DPS_TOK_LLAMA2_EOS)
		PUSH(t->eos_id);
#undef PUSH
	free(buf);
	*n = k;
	return 0;
}

const char *dps_tok_llama2_decode(const struct dps_tok_llama2 *t, int prev, int id, char *buf,
				 size_t *len)
{
	const char *p;
	unsigned b;

	if (id < 0 || id >= t->vocab_size) {
		*len = 0;
		return "";
	}
	p = t->vocab[id];
	*len = t->vocab_len[id];
	if (prev == t->bos_id && p[0] == ' ') {
		p++;
		(*len)--;
	}
	if (t->byte_fallback && id >= 3 && id <= 258 && *len == 6 && sscanf(p, "<0x%02X>", &b) == 1) {
		buf[0] = (char)b;
		buf[1] = '\0';
		*len = 1;
		return buf;
	}
	return p;
}

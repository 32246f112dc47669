/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok.c - one tokenizer interface over tokenizer.json and tokenizer.bin (see
 * tok.h): which file a model directory uses, the lossy reading of invalid UTF-8, the bound on
 * a prompt's ids, and the streaming decoder both formats share.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/utf8.h"
#include "engine/model/tok.h"
#include "engine/model/tok_hf.h"
#include "engine/model/tok_llama2.h"

struct dps_tok {
	enum dps_tok_kind kind;
	struct dps_tok_llama2 l2; /* DPS_TOK_LLAMA2 */
	struct dps_tok_hf *hf;    /* DPS_TOK_HF */
};

int dps_tok_open(struct dps_tok **out, const char *dir, const struct dps_model_config *cfg,
		 char *err, size_t errlen)
{
	char json[4096], conf[4096], bin[4096];
	struct dps_tok *t;
	int rc;

	*out = NULL;
	if ((size_t)snprintf(json, sizeof(json), "%s/tokenizer.json", dir) >= sizeof(json) ||
	    (size_t)snprintf(conf, sizeof(conf), "%s/tokenizer_config.json", dir) >= sizeof(conf) ||
	    (size_t)snprintf(bin, sizeof(bin), "%s/tokenizer.bin", dir) >= sizeof(bin)) {
		snprintf(err, errlen, "%s: path too long", dir);
		return -ENAMETOOLONG;
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	if (!access(json, F_OK)) {
		t->kind = DPS_TOK_HF;
		rc = dps_tok_hf_load(&t->hf, json, access(conf, F_OK) ? NULL : conf, err, errlen);
	} else if (!access(bin, F_OK)) {
		t->kind = DPS_TOK_LLAMA2;
		rc = dps_tok_llama2_load(&t->l2, bin, cfg, err, errlen);
	} else {
		snprintf(err, errlen, "%s has no tokenizer (neither tokenizer.json nor tokenizer.bin)",
			 dir);
		rc = -ENOENT;
	}
	if (!rc && dps_tok_vocab_size(t) > cfg->vocab_size) {
		snprintf(err, errlen, "%s: the tokenizer has ids up to %d, but the model's vocab_size "
			 "is %d", t->kind == DPS_TOK_HF ? json : bin, dps_tok_vocab_size(t) - 1,
			 cfg->vocab_size);
		rc = -EINVAL;
	}
	if (rc) {
		dps_tok_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

int dps_tok_open_hf(struct dps_tok **out, const char *json_path, const char *config_path,
		    char *err, size_t errlen)
{
	struct dps_tok *t = calloc(1, sizeof(*t));
	int rc;

	*out = NULL;
	if (!t)
		return -ENOMEM;
	t->kind = DPS_TOK_HF;
	rc = dps_tok_hf_load(&t->hf, json_path, config_path, err, errlen);
	if (rc) {
		dps_tok_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

void dps_tok_free(struct dps_tok *t)
{
	if (!t)
		return;
	if (t->kind == DPS_TOK_HF)
		dps_tok_hf_free(t->hf);
	else
		dps_tok_llama2_free(&t->l2);
	free(t);
}

enum dps_tok_kind dps_tok_kind(const struct dps_tok *t)
{
	return t->kind;
}

int dps_tok_vocab_size(const struct dps_tok *t)
{
	return t->kind == DPS_TOK_HF ? dps_tok_hf_vocab_size(t->hf) : t->l2.vocab_size;
}

size_t dps_tok_max_piece(const struct dps_tok *t)
{
	return t->kind == DPS_TOK_HF ? dps_tok_hf_max_piece(t->hf) : t->l2.max_token_length;
}

int dps_tok_token_id(const struct dps_tok *t, const char *piece, size_t len)
{
	return t->kind == DPS_TOK_HF ? dps_tok_hf_token_id(t->hf, piece, len)
				     : dps_tok_llama2_lookup(&t->l2, piece, len);
}

int dps_tok_is_special(const struct dps_tok *t, int id)
{
	if (t->kind == DPS_TOK_HF)
		return dps_tok_hf_is_special(t->hf, id);
	return id == t->l2.bos_id || id == t->l2.eos_id;
}

/*
 * llama2.c: BOS, the dummy-prefix space and at least one id per max_token_length bytes, so a
 * text longer than that bound allows is refused before any merging.
 */
static int encode_llama2(const struct dps_tok_llama2 *t, const char *text, size_t len,
			 unsigned flags, size_t max_ids, int **ids, size_t *n)
{
	const size_t bos = (flags & DPS_TOK_ADD_SPECIAL) ? 1 : 0;
	const size_t piece = t->max_token_length ? t->max_token_length : 1;
	/* the dummy prefix is there only when the vocabulary has " " */
	const size_t sp = len && dps_tok_llama2_lookup(t, " ", 1) >= 0;
	size_t cap;
	int rc;

	if (max_ids && len && bos + (len + sp + piece - 1) / piece > max_ids)
		return -E2BIG;
	if (len > ((size_t)-1) / sizeof(int) - 3)
		return -ENOMEM;
	cap = len + 3; /* at most one id per byte, the space and BOS */
	*ids = malloc(cap * sizeof(int));
	if (!*ids)
		return -ENOMEM;
	rc = dps_tok_llama2_encode(t, text, len, bos ? DPS_TOK_LLAMA2_BOS : 0, *ids, cap, n);
	if (!rc && max_ids && *n > max_ids)
		rc = -E2BIG;
	if (rc) {
		free(*ids);
		*ids = NULL;
	}
	return rc;
}

int dps_tok_encode(const struct dps_tok *t, const char *text, size_t len, unsigned flags,
		   size_t max_ids, int **ids, size_t *n)
{
	char *fixed = NULL;
	int rc;

	*ids = NULL;
	*n = 0;
	if (!dps_utf8_valid(text, len)) {
		fixed = dps_utf8_lossy(text, len, &len);
		if (!fixed)
			return -ENOMEM;
		text = fixed;
	}
	if (t->kind == DPS_TOK_HF)
		rc = dps_tok_hf_encode(t->hf, text, len, flags, max_ids, ids, n);
	else
		rc = encode_llama2(&t->l2, text, len, flags, max_ids, ids, n);
	free(fixed);
	return rc;
}

/* llama2.c: each id's piece after the one before it, as run.c prints them. */
static int decode_llama2(const struct dps_tok_llama2 *t, const int *ids, size_t n,
			 unsigned flags, char **text, size_t *len)
{
	size_t cap = 64, k = 0;
	char *buf = malloc(cap), *fixed;
	int prev = -1;

	if (!buf)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		char one[8];
		size_t l;
		const char *p;

		if ((flags & DPS_TOK_SKIP_SPECIAL) && (ids[i] == t->bos_id || ids[i] == t->eos_id)) {
			prev = ids[i];
			continue;
		}
		p = dps_tok_llama2_decode(t, prev, ids[i], one, &l);
		prev = ids[i];
		if (k + l + 1 > cap) {
			char *nb;

			while (k + l + 1 > cap)
				cap *= 2;
			nb = realloc(buf, cap);
			if (!nb) {
				free(buf);
				return -ENOMEM;
			}
			buf = nb;
		}
		memcpy(buf + k, p, l);
		k += l;
	}
	buf[k] = '\0';
	if (dps_utf8_valid(buf, k)) {
		*text = buf;
		*len = k;
		return 0;
	}
	fixed = dps_utf8_lossy(buf, k, len);
	free(buf);
	if (!fixed)
		return -ENOMEM;
	*text = fixed;
	return 0;
}

int dps_tok_decode(const struct dps_tok *t, const int *ids, size_t n, unsigned flags,
		   char **text, size_t *len)
{
	*text = NULL;
	*len = 0;
	if (t->kind == DPS_TOK_HF)
		return dps_tok_hf_decode(t->hf, ids, n, flags, text, len);
	return decode_llama2(&t->l2, ids, n, flags, text, len);
}

/* ---- streaming ----------------------------------------------------------------------------- */

/*
 * The algorithm of the `tokenizers` library's DecodeStream: ids holds the tokens from the
 * start of the text already emitted ("prefix", the decode of ids[0..prefix_index)) on; a new
 * id is emitted when the decode of ids grows past the prefix and does not end in U+FFFD (an
 * incomplete character); then the window moves up to the old prefix_index. The window stays
 * a few tokens long, so each step costs the decode of a few tokens.
 */
/* A window that has not emitted for this many ids emits anyway (U+FFFD and all): a run of
 * ids that never completes a character must not make every step decode a growing window. */
#define STREAM_MAX_WINDOW 64
/* The prompt ids a stream is primed with, at most (vLLM would take the whole prompt when no
 * suffix of 4 to 23 ids decodes whole; the primed text is never shown). */
#define STREAM_MAX_PRIME 24

struct dps_tok_stream {
	const struct dps_tok *t;
	unsigned flags;
	int *ids;                   /* (cap) the window */
	size_t n, cap, prefix_index;
	char *prefix;               /* the decode of ids[0..prefix_index), malloc'd */
	size_t prefix_len;
	char *out;                  /* the last step's text, malloc'd */
};

static int ends_in_fffd(const char *s, size_t len)
{
	return len >= 3 && !memcmp(s + len - 3, "\xEF\xBF\xBD", 3);
}

static int push_id(struct dps_tok_stream *s, int id)
{
	if (s->n == s->cap) {
		const size_t cap = s->cap ? 2 * s->cap : 16;
		int *ids = realloc(s->ids, cap * sizeof(int));

		if (!ids)
			return -ENOMEM;
		s->ids = ids;
		s->cap = cap;
	}
	s->ids[s->n++] = id;
	return 0;
}

int dps_tok_stream_step(struct dps_tok_stream *s, int id, const char **text, size_t *len)
{
	char *str = NULL;
	size_t sl;
	int rc;

	*text = "";
	*len = 0;
	free(s->out);
	s->out = NULL;
	if (!s->prefix_len && s->n) {
		char *p;
		size_t pl;

		rc = dps_tok_decode(s->t, s->ids, s->n, s->flags, &p, &pl);
		if (rc)
			return rc;
		if (!ends_in_fffd(p, pl)) {
			free(s->prefix);
			s->prefix = p;
			s->prefix_len = pl;
			s->prefix_index = s->n;
		} else {
			free(p);
		}
	}
	rc = push_id(s, id);
	if (rc)
		return rc;
	rc = dps_tok_decode(s->t, s->ids, s->n, s->flags, &str, &sl);
	if (rc)
		return rc;
	if (sl > s->prefix_len &&
	    (!ends_in_fffd(str, sl) || s->n - s->prefix_index > STREAM_MAX_WINDOW)) {
		const size_t new_index = s->n - s->prefix_index;

		/* The decode of a window starts with its prefix for every decoder of both
		 * formats; the library reports an error when it does not, and so do we. */
		if (memcmp(str, s->prefix ? s->prefix : "", s->prefix_len)) {
			free(str);
			return -EILSEQ;
		}
		memmove(str, str + s->prefix_len, sl - s->prefix_len + 1);
		s->out = str;
		*text = str;
		*len = sl - s->prefix_len;
		memmove(s->ids, s->ids + s->prefix_index, (s->n - s->prefix_index) * sizeof(int));
		s->n -= s->prefix_index;
		free(s->prefix);
		s->prefix = NULL;
		s->prefix_len = 0;
		rc = dps_tok_decode(s->t, s->ids, s->n, s->flags, &s->prefix, &s->prefix_len);
		if (rc)
			return rc;
		s->prefix_index = new_index;
		return 0;
	}
	free(str);
	return 0;
}

int dps_tok_stream_flush(struct dps_tok_stream *s, const char **text, size_t *len)
{
	char *str;
	size_t sl;
	int rc;

	*text = "";
	*len = 0;
	free(s->out);
	s->out = NULL;
	rc = dps_tok_decode(s->t, s->ids, s->n, s->flags, &str, &sl);
	if (rc)
		return rc;
	if (sl > s->prefix_len) {
		memmove(str, str + s->prefix_len, sl - s->prefix_len + 1);
		*len = sl - s->prefix_len;
		*text = str;
		s->out = str;
		/* nothing is held back any more */
		free(s->prefix);
		s->prefix = NULL;
		s->prefix_len = 0;
		s->prefix_index = 0;
		s->n = 0;
		return 0;
	}
	free(str);
	return 0;
}

/* Whether the decode of ids has a U+FFFD anywhere. */
static int has_fffd(const struct dps_tok *t, const int *ids, size_t n, unsigned flags, int *rc)
{
	char *s;
	size_t l;
	int found;

	*rc = dps_tok_decode(t, ids, n, flags, &s, &l);
	if (*rc)
		return 0;
	found = l >= 3 && memmem(s, l, "\xEF\xBF\xBD", 3) != NULL;
	free(s);
	return found;
}

int dps_tok_stream_new(struct dps_tok_stream **out, const struct dps_tok *t, const int *prompt,
		       size_t n_prompt, unsigned flags)
{
	struct dps_tok_stream *s = calloc(1, sizeof(*s));
	size_t from = 0;
	int rc = 0;

	*out = NULL;
	if (!s)
		return -ENOMEM;
	s->t = t;
	s->flags = flags;
	/* Primed as vLLM primes its detokenizer: with the shortest suffix of at least 4 of the
	 * prompt's last 23 ids whose decode is whole (no U+FFFD), else (where vLLM takes the
	 * whole prompt) the last STREAM_MAX_PRIME ids. */
	if (n_prompt > STREAM_MAX_PRIME)
		from = n_prompt - STREAM_MAX_PRIME;
	if (n_prompt > 4) {
		for (size_t i = 4; i <= n_prompt && i < 24; i++) {
			if (!has_fffd(t, prompt + n_prompt - i, i, flags, &rc)) {
				from = n_prompt - i;
				break;
			}
			if (rc)
				goto err;
		}
		if (rc)
			goto err;
	}
	for (size_t i = from; i < n_prompt; i++) {
		const char *p;
		size_t l;

		rc = dps_tok_stream_step(s, prompt[i], &p, &l);
		if (rc)
			goto err;
	}
	*out = s;
	return 0;
err:
	dps_tok_stream_free(s);
	return rc;
}

void dps_tok_stream_free(struct dps_tok_stream *s)
{
	if (!s)
		return;
	free(s->ids);
	free(s->prefix);
	free(s->out);
	free(s);
}

int dps_tok_stream_text(const struct dps_tok *t, const int *prompt, size_t n_prompt,
			const int *ids, size_t n, unsigned flags, char **text, size_t *len)
{
	struct dps_tok_stream *st;
	const char *p;
	size_t l;
	FILE *o;
	int rc;

	*text = NULL;
	*len = 0;
	rc = dps_tok_stream_new(&st, t, prompt, n_prompt, flags);
	if (rc)
		return rc;
	o = open_memstream(text, len);
	if (!o) {
		dps_tok_stream_free(st);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n && !rc; i++)
		if (!(rc = dps_tok_stream_step(st, ids[i], &p, &l)))
			fwrite(p, 1, l, o);
	if (!rc && !(rc = dps_tok_stream_flush(st, &p, &l)))
		fwrite(p, 1, l, o);
	fclose(o);
	dps_tok_stream_free(st);
	if (rc) {
		free(*text);
		*text = NULL;
		*len = 0;
	}
	return rc;
}

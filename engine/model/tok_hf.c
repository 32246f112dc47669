/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_hf.c - Hugging Face's tokenizer.json (see tok_hf.h): loading the file and
 * tokenizer_config.json, the lookups, and the encode driver that runs the pipeline of the
 * `tokenizers` library on a prompt. Called through engine/model/tok.h by the request parser,
 * `generate` and the tokenize commands; an encode is one pass over the prompt, whatever its
 * size (prompts of megabytes are expected), and allocates only in its own context.
 *
 * Loading reads every part with the rules of the library's deserializers: the model, the
 * normalizer, then the added tokens (whose ids and normalized forms depend on both), the
 * pre-tokenizer, the post-processor and the decoder; truncation and padding must be null;
 * what this implementation lacks is refused by name. tokenizer_config.json changes only the
 * post-processor, and only for the tokenizer classes whose transformers class rebuilds it
 * (tok_hf_decode.c, hf_post_config).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/dps.h"
#include "common/utf8.h"
#include "engine/model/tok_hf_int.h"

static int null_field(json_t *root, const char *field, char *err, size_t errlen)
{
	json_t *v = json_object_get(root, field);

	if (v && !json_is_null(v))
		return hf_fail(err, errlen, "%s is set; only null is supported (dpshard does not "
			       "truncate or pad)", field);
	return 0;
}

/* The lookups that need every part. */
static int finish(struct dps_tok_hf *t, char *err, size_t errlen)
{
	t->n_ids = t->bpe.n_ids;
	t->max_piece = t->bpe.max_len;
	for (size_t i = 0; i < t->n_added; i++) {
		const struct hf_added_tok *a = &t->added[i];

		if (a->id >= t->n_ids)
			t->n_ids = a->id + 1;
		if (a->len > t->max_piece)
			t->max_piece = a->len;
		if (a->pattern_len > t->max_piece)
			t->max_piece = a->pattern_len;
	}
	/* The library adds a template's ids as written; one that is no token would make an id
	 * past the vocabulary (and decode to nothing). */
	for (size_t i = 0; i < t->n_post; i++)
		for (size_t k = 0; k < t->post[i].n; k++)
			if (t->post[i].ids[k] >= t->n_ids)
				return hf_fail(err, errlen, "post_processor: special token id %d is "
					       "not a token (the vocabulary and added tokens end at "
					       "%d)", t->post[i].ids[k], t->n_ids - 1);
	t->added_of_id = malloc(((size_t)t->n_ids + 1) * sizeof(*t->added_of_id));
	t->special_id = calloc((size_t)t->n_ids + 1, 1);
	if (!t->added_of_id || !t->special_id)
		return -ENOMEM;
	for (int32_t i = 0; i < t->n_ids; i++)
		t->added_of_id[i] = -1;
	for (size_t i = 0; i < t->n_added; i++)
		t->added_of_id[t->added[i].id] = (int32_t)i;
	for (int32_t i = 0; i < t->n_ids; i++) {
		size_t len;
		const char *s = hf_id_token(t, i, &len);

		t->special_id[i] = s && hf_map_get(&t->special, s, len) >= 0;
	}
	return 0;
}

static int parse(json_t **out, const char *what, const char *s, size_t len, size_t flags,
		 char *err, size_t errlen)
{
	json_error_t je;

	*out = json_loadb(s, len, JSON_ALLOW_NUL | flags, &je);
	if (!*out) {
		snprintf(err, errlen, "%s: line %d column %d: %s", what, je.line, je.column, je.text);
		return -EINVAL;
	}
	return 0;
}

int dps_tok_hf_load_mem(struct dps_tok_hf **out, const char *json, size_t len,
			const char *config, size_t config_len, char *err, size_t errlen)
{
	struct dps_tok_hf *t = calloc(1, sizeof(*t));
	json_t *root = NULL, *cfg = NULL, *v;
	int rc;

	*out = NULL;
	if (!t)
		return -ENOMEM;
	hf_byte_table_init();
	if ((rc = parse(&root, "tokenizer.json", json, len, 0, err, errlen)))
		goto err;
	if (!json_is_object(root)) {
		rc = hf_fail(err, errlen, "the file is %s, not an object", hf_json_type(root));
		goto err;
	}
	v = json_object_get(root, "version");
	if (v && !(json_is_string(v) && !strcmp(json_string_value(v), "1.0"))) {
		rc = hf_fail(err, errlen, "version is not \"1.0\" (the only version the library "
			     "reads)");
		goto err;
	}
	if ((rc = null_field(root, "truncation", err, errlen)) ||
	    (rc = null_field(root, "padding", err, errlen)))
		goto err;
	if (!json_object_get(root, "model")) {
		rc = hf_fail(err, errlen, "model is missing");
		goto err;
	}
	if ((rc = hf_bpe_load(&t->bpe, json_object_get(root, "model"), err, errlen)))
		goto err;
	v = json_object_get(root, "normalizer");
	if (v && !json_is_null(v)) {
		t->has_normalizer = 1;
		if ((rc = hf_norm_load(t, v, 0, err, errlen)))
			goto err;
	}
	v = json_object_get(root, "pre_tokenizer");
	if (v && !json_is_null(v) && (rc = hf_pre_load(t, v, 0, err, errlen)))
		goto err;
	if ((rc = hf_added_load(t, json_object_get(root, "added_tokens"), err, errlen)))
		goto err;
	v = json_object_get(root, "post_processor");
	if (v && !json_is_null(v) && (rc = hf_post_load(t, v, 0, err, errlen)))
		goto err;
	v = json_object_get(root, "decoder");
	if (v && !json_is_null(v)) {
		t->has_decoder = 1;
		if ((rc = hf_dec_load(t, v, 0, err, errlen)))
			goto err;
	}
	if ((rc = finish(t, err, errlen)))
		goto err;
	if (config) {
		/* Its model_max_length is often 1e30, written as an integer: read numbers as reals
		 * (only its booleans and strings are used). */
		if ((rc = parse(&cfg, "tokenizer_config.json", config, config_len,
				JSON_DECODE_INT_AS_REAL, err, errlen)) ||
		    (rc = hf_post_config(t, cfg, err, errlen)))
			goto err;
	}
	json_decref(root);
	json_decref(cfg);
	*out = t;
	return 0;
err:
	if (rc == -ENOMEM)
		snprintf(err, errlen, "tokenizer.json: out of memory");
	json_decref(root);
	json_decref(cfg);
	dps_tok_hf_free(t);
	return rc;
}

static int slurp(const char *path, char **buf, size_t *len, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	long n;
	int rc = 0;

	*buf = NULL;
	if (!f) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", path, dps_strerror(rc));
		return rc;
	}
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
		rc = -EIO;
	} else if (!(*buf = malloc((size_t)n + 1))) {
		rc = -ENOMEM;
	} else if (fread(*buf, 1, (size_t)n, f) != (size_t)n) {
		rc = -EIO;
	}
	fclose(f);
	if (rc) {
		free(*buf);
		*buf = NULL;
		snprintf(err, errlen, "%s: %s", path, dps_strerror(rc));
		return rc == -EIO ? -EINVAL : rc;
	}
	*len = (size_t)n;
	return 0;
}

int dps_tok_hf_load(struct dps_tok_hf **out, const char *json_path, const char *config_path,
		    char *err, size_t errlen)
{
	char *json = NULL, *cfg = NULL;
	size_t len = 0, clen = 0;
	int rc;

	*out = NULL;
	rc = slurp(json_path, &json, &len, err, errlen);
	if (!rc && config_path)
		rc = slurp(config_path, &cfg, &clen, err, errlen);
	if (!rc) {
		rc = dps_tok_hf_load_mem(out, json, len, cfg, clen, err, errlen);
		if (rc == -EINVAL && config_path && !strncmp(err, "tokenizer_config.json", 21)) {
			/* messages name the file; give its path */
			char tmp[512];

			snprintf(tmp, sizeof(tmp), "%s%s", config_path, err + 21);
			snprintf(err, errlen, "%s", tmp);
		} else if (rc == -EINVAL && !strncmp(err, "tokenizer.json", 14)) {
			char tmp[512];

			snprintf(tmp, sizeof(tmp), "%s%s", json_path, err + 14);
			snprintf(err, errlen, "%s", tmp);
		}
	}
	free(json);
	free(cfg);
	return rc;
}

void hf_parts_free(struct dps_tok_hf *t)
{
	for (size_t i = 0; i < t->n_norm; i++) {
		free(t->norm[i].str);
		hf_regex_free(&t->norm[i].re);
	}
	for (size_t i = 0; i < t->n_pre; i++)
		hf_regex_free(&t->pre[i].re);
	for (size_t i = 0; i < t->n_dec; i++) {
		free(t->dec[i].str);
		hf_regex_free(&t->dec[i].re);
	}
	for (size_t i = 0; i < t->n_post; i++)
		free(t->post[i].ids);
	for (size_t i = 0; i < t->n_added; i++) {
		free(t->added[i].content);
		free(t->added[i].pattern);
	}
	free(t->added);
	free(t->trie_raw.node);
	free(t->trie_norm.node);
	hf_map_free(&t->added_by_content);
	hf_map_free(&t->special);
}

void dps_tok_hf_free(struct dps_tok_hf *t)
{
	if (!t)
		return;
	hf_parts_free(t);
	hf_bpe_free(&t->bpe);
	free(t->added_of_id);
	free(t->special_id);
	free(t);
}

int dps_tok_hf_vocab_size(const struct dps_tok_hf *t)
{
	return t->n_ids;
}

size_t dps_tok_hf_max_piece(const struct dps_tok_hf *t)
{
	return t->max_piece;
}

int dps_tok_hf_token_id(const struct dps_tok_hf *t, const char *piece, size_t len)
{
	const int32_t id = hf_map_get(&t->added_by_content, piece, len);

	return id >= 0 ? id : hf_map_get(&t->bpe.vocab, piece, len);
}

int dps_tok_hf_is_special(const struct dps_tok_hf *t, int id)
{
	return id >= 0 && id < t->n_ids && t->special_id[id];
}

const char *hf_id_token(const struct dps_tok_hf *t, int32_t id, size_t *len)
{
	if (id < 0 || id >= t->n_ids)
		return NULL;
	if (t->added_of_id && t->added_of_id[id] >= 0) {
		const struct hf_added_tok *a = &t->added[t->added_of_id[id]];

		*len = a->pattern ? a->pattern_len : a->len;
		return a->pattern ? a->pattern : a->content;
	}
	if (id >= t->bpe.n_ids || !t->bpe.id_str[id])
		return NULL;
	*len = t->bpe.id_len[id];
	return t->bpe.id_str[id];
}

/* ---- encoding ---- */

int hf_ctx_emit(struct hf_ctx *c, int32_t id)
{
	if (c->n >= c->limit)
		return -E2BIG;
	if (c->n == c->cap) {
		const size_t cap = c->cap ? 2 * c->cap : 256;
		int32_t *ids = realloc(c->ids, cap * sizeof(*ids));

		if (!ids)
			return -ENOMEM;
		c->ids = ids;
		c->cap = cap;
	}
	c->ids[c->n++] = id;
	return 0;
}

void hf_ctx_free(struct hf_ctx *c)
{
	free(c->ids);
	if (c->md)
		pcre2_match_data_free(c->md);
	pcre2_match_context_free(c->mctx);
	pcre2_jit_stack_free(c->jit);
	for (int i = 0; i < 2; i++) {
		hf_buf_free(&c->norm[i]);
		free(c->added_spans[i].v);
	}
	for (size_t i = 0; i < HF_MAX_OPS; i++) {
		hf_buf_free(&c->lvl[i].buf);
		hf_buf_free(&c->lvl[i].buf2);
		free(c->lvl[i].spans.v);
		free(c->lvl[i].out.v);
	}
	free(c->sym);
	free(c->heap);
	hf_buf_free(&c->word);
	hf_map_free(&c->cache);
	free(c->cache_at);
	hf_buf_free(&c->cache_ids);
}

/* One piece between the raw text's added tokens: normalized, searched for the normalized
 * added tokens, and pre-tokenized part by part. */
static int encode_piece(struct hf_ctx *c, const struct hf_piece *raw)
{
	const struct dps_tok_hf *t = c->t;
	struct hf_spans *sp = &c->added_spans[1];
	struct hf_piece np = *raw;
	int rc;

	if (t->has_normalizer && (rc = hf_norm_apply(c, raw, &np)))
		return rc;
	if (!np.len)
		return 0;
	sp->n = 0;
	if (t->has_trie_norm) {
		if ((rc = hf_added_find(t, &t->trie_norm, np.s, np.len, sp)))
			return rc;
	} else if (hf_spans_add(sp, 0, np.len, 0)) {
		return -ENOMEM;
	}
	for (size_t i = 0; i < sp->n; i++) {
		const struct hf_span s = sp->v[i];
		struct hf_piece q = { .s = np.s + s.start, .len = s.end - s.start };

		if (s.match) {
			if ((rc = hf_ctx_emit(c, t->added[s.match - 1].id)))
				return rc;
			continue;
		}
		if (!q.len)
			continue;
		if (np.first && s.start < np.zero) {
			q.first = 1;
			q.zero = (np.zero < s.end ? np.zero : s.end) - s.start;
		}
		if ((rc = hf_pre_run(c, 0, &q)))
			return rc;
	}
	return 0;
}

static int encode_text(struct hf_ctx *c, const char *text, size_t len)
{
	const struct dps_tok_hf *t = c->t;
	struct hf_spans *sp = &c->added_spans[0];
	int rc;

	if (t->has_trie_raw) {
		if ((rc = hf_added_find(t, &t->trie_raw, text, len, sp)))
			return rc;
	} else if (len && hf_spans_add(sp, 0, len, 0)) {
		return -ENOMEM;
	}
	for (size_t i = 0; i < sp->n; i++) {
		const struct hf_span s = sp->v[i];
		struct hf_piece p = { .s = text + s.start, .len = s.end - s.start };

		if (s.match) {
			rc = hf_ctx_emit(c, t->added[s.match - 1].id);
		} else if (p.len) {
			if (s.start == 0) {
				p.first = 1;
				(void)hf_utf8_next(p.s, &p.zero);
			}
			rc = encode_piece(c, &p);
		} else {
			rc = 0;
		}
		if (rc)
			return rc;
	}
	return 0;
}

int dps_tok_hf_encode(const struct dps_tok_hf *t, const char *text, size_t len, unsigned flags,
		      size_t max_ids, int **ids, size_t *n)
{
	struct hf_ctx c = { .t = t, .limit = (size_t)-1 };
	size_t times, specials;
	char *valid = NULL;
	int rc = 0;

	*ids = NULL;
	*n = 0;
	if (!dps_utf8_valid(text, len)) {
		/* The caller should have (tok.c does): read it as from_utf8_lossy would. */
		valid = dps_utf8_lossy(text, len, &len);
		if (!valid)
			return -ENOMEM;
		text = valid;
	}
	hf_post_counts(t, flags, &times, &specials);
	if (max_ids && specials > max_ids)
		return -E2BIG;
	if (max_ids && times)
		c.limit = (max_ids - specials) / times;
	if (times)
		rc = encode_text(&c, text, len);
	if (!rc)
		rc = hf_post_apply(t, flags, c.ids, c.n, max_ids, ids, n);
	hf_ctx_free(&c);
	free(valid);
	return rc == -EIO ? -ENOMEM : rc;
}

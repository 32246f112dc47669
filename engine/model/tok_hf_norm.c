/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_hf_norm.c - the normalizers of tokenizer.json, as the `tokenizers` library's
 * normalizers: NFC, NFD, NFKC, NFKD (utf8proc), Lowercase (char::to_lowercase), Strip,
 * StripAccents, Prepend, Replace and Sequence (flattened at load). Loaded by tok_hf.c
 * (hf_norm_load); applied to each piece of a prompt between the added tokens, and to the
 * content of every normalized added token at load (hf_norm_apply).
 *
 * Besides the text, a piece carries how many of its leading bytes the library would align with
 * the original's first character (struct hf_piece.zero, for Metaspace's "first" scheme after a
 * split): Prepend's text and a Lowercase or byte expansion of those bytes stay aligned with it,
 * a Replace's content takes the alignment of the last byte it replaces, Strip's removed bytes
 * leave it; for the Unicode normal forms the piece's aligned prefix normalized alone is taken
 * when the whole output starts with it, else the first output character.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <utf8proc.h>

#include "common/dps.h"
#include "engine/model/tok_hf_int.h"

static int add_op(struct dps_tok_hf *t, struct hf_norm **op, char *err, size_t errlen)
{
	if (t->n_norm == HF_MAX_OPS)
		return hf_fail(err, errlen, "normalizer: more than %d normalizers", HF_MAX_OPS);
	*op = &t->norm[t->n_norm++];
	memset(*op, 0, sizeof(**op));
	return 0;
}

static int dup_str(const char *s, size_t len, char **out)
{
	*out = malloc(len + 1);
	if (!*out)
		return -ENOMEM;
	memcpy(*out, s, len);
	(*out)[len] = '\0';
	return 0;
}

int hf_norm_load(struct dps_tok_hf *t, json_t *v, int depth, char *err, size_t errlen)
{
	static const struct {
		const char *name;
		enum hf_norm_kind kind;
	} plain[] = {
		{ "NFC", HF_NORM_NFC },           { "NFD", HF_NORM_NFD },
		{ "NFKC", HF_NORM_NFKC },         { "NFKD", HF_NORM_NFKD },
		{ "Lowercase", HF_NORM_LOWERCASE }, { "StripAccents", HF_NORM_STRIP_ACCENTS },
	};
	struct hf_norm *op = NULL;
	const char *type, *s;
	size_t len;
	int rc;

	if (depth > HF_MAX_DEPTH)
		return hf_fail(err, errlen, "normalizer: Sequences nested deeper than %d",
			       HF_MAX_DEPTH);
	if (!json_is_object(v))
		return hf_fail(err, errlen, "normalizer is %s, not an object", hf_json_type(v));
	if ((rc = hf_json_str(v, "normalizer", "type", 0, &type, &len, err, errlen)))
		return rc;
	if (!strcmp(type, "Sequence")) {
		json_t *list = json_object_get(v, "normalizers");

		if (!json_is_array(list))
			return hf_fail(err, errlen, "normalizer Sequence: \"normalizers\" is %s, not "
				       "an array", hf_json_type(list));
		for (size_t i = 0; i < json_array_size(list); i++)
			if ((rc = hf_norm_load(t, json_array_get(list, i), depth + 1, err, errlen)))
				return rc;
		return 0;
	}
	for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++) {
		if (!strcmp(type, plain[i].name)) {
			if ((rc = add_op(t, &op, err, errlen)))
				return rc;
			op->kind = plain[i].kind;
			return 0;
		}
	}
	if (!strcmp(type, "Strip")) {
		if ((rc = add_op(t, &op, err, errlen)))
			return rc;
		op->kind = HF_NORM_STRIP;
		if ((rc = hf_json_bool(v, "normalizer Strip", "strip_left", -1, &op->left, err,
				       errlen)))
			return rc;
		return hf_json_bool(v, "normalizer Strip", "strip_right", -1, &op->right, err,
				    errlen);
	}
	if (!strcmp(type, "Prepend")) {
		if ((rc = add_op(t, &op, err, errlen)))
			return rc;
		op->kind = HF_NORM_PREPEND;
		if ((rc = hf_json_str(v, "normalizer Prepend", "prepend", 0, &s, &len, err, errlen)))
			return rc;
		op->str_len = len;
		return dup_str(s, len, &op->str);
	}
	if (!strcmp(type, "Replace")) {
		if ((rc = add_op(t, &op, err, errlen)))
			return rc;
		op->kind = HF_NORM_REPLACE;
		if ((rc = hf_json_str(v, "normalizer Replace", "content", 0, &s, &len, err, errlen)))
			return rc;
		op->str_len = len;
		if ((rc = dup_str(s, len, &op->str)))
			return rc;
		return hf_regex_load(t, &op->re, json_object_get(v, "pattern"),
				     "normalizer Replace.pattern", err, errlen);
	}
	return hf_fail(err, errlen, "normalizer type \"%s\" is not supported", type);
}

/* ---- applying ---- */

static int unicode_form(const struct hf_norm *op, const struct hf_piece *in, struct hf_buf *o,
			size_t *zero)
{
	static const utf8proc_option_t forms[] = {
		[HF_NORM_NFC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE,
		[HF_NORM_NFD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
		[HF_NORM_NFKC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
		[HF_NORM_NFKD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
	};
	utf8proc_uint8_t *res = NULL;
	utf8proc_ssize_t n;
	int rc;

	if ((utf8proc_ssize_t)in->len < 0)
		return -ENOMEM;
	n = utf8proc_map((const utf8proc_uint8_t *)in->s, (utf8proc_ssize_t)in->len, &res,
			 forms[op->kind]);
	if (n < 0)
		return -ENOMEM; /* the text is valid: only memory can fail */
	rc = hf_buf_add(o, res, (size_t)n);
	free(res);
	if (rc || !*zero)
		return rc;
	n = utf8proc_map((const utf8proc_uint8_t *)in->s, (utf8proc_ssize_t)*zero, &res,
			 forms[op->kind]);
	if (n < 0)
		return -ENOMEM;
	if ((size_t)n <= o->len && !memcmp(o->p, res, (size_t)n) && n > 0) {
		*zero = (size_t)n;
	} else {
		size_t cl = 0;

		if (o->len)
			(void)hf_utf8_next(o->p, &cl);
		*zero = cl;
	}
	free(res);
	return 0;
}

static int lowercase(const struct hf_piece *in, struct hf_buf *o, size_t *zero, int accents)
{
	size_t z = 0;

	if (hf_buf_reserve(o, in->len * 3 / 2 + 8))
		return -ENOMEM;
	for (size_t i = 0; i < in->len;) {
		size_t cl;
		const uint32_t cp = hf_utf8_next(in->s + i, &cl);
		char enc[8];
		size_t el = 0;

		if (accents) {
			const utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);

			if (cat != UTF8PROC_CATEGORY_MN && cat != UTF8PROC_CATEGORY_MC &&
			    cat != UTF8PROC_CATEGORY_ME)
				el = hf_utf8_put(enc, cp);
		} else if (cp == 0x130) {
			/* The one unconditional multi-character lowercase of SpecialCasing. */
			memcpy(enc, "i\xcc\x87", 3);
			el = 3;
		} else {
			el = hf_utf8_put(enc, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
		}
		if (hf_buf_add(o, enc, el))
			return -ENOMEM;
		if (i < *zero)
			z += el;
		i += cl;
	}
	*zero = z;
	return 0;
}

static int strip(const struct hf_norm *op, const struct hf_piece *in, struct hf_buf *o,
		 size_t *zero)
{
	size_t a = 0, b = in->len;

	while (op->left && a < b) {
		size_t cl;

		if (!hf_is_whitespace(hf_utf8_next(in->s + a, &cl)))
			break;
		a += cl;
	}
	while (op->right && b > a) {
		size_t k = b - 1, cl;

		while (k > a && ((unsigned char)in->s[k] & 0xc0) == 0x80)
			k--;
		if (!hf_is_whitespace(hf_utf8_next(in->s + k, &cl)))
			break;
		b = k;
	}
	*zero = *zero > a ? (*zero < b ? *zero : b) - a : 0;
	return hf_buf_add(o, in->s + a, b - a);
}

static int prepend(const struct hf_norm *op, const struct hf_piece *in, struct hf_buf *o,
		   size_t *zero)
{
	if (!in->len)
		return 0;
	if (*zero)
		*zero += op->str_len;
	if (hf_buf_add(o, op->str, op->str_len))
		return -ENOMEM;
	return hf_buf_add(o, in->s, in->len);
}

/* NormalizedString::replace with a pattern: every match becomes content. */
static int replace(struct hf_ctx *c, const struct hf_regex *re, const char *content,
		    size_t content_len, const struct hf_piece *in, struct hf_buf *o, size_t *zero,
		    struct hf_spans *m)
{
	size_t last = 0, z = 0;
	int zeroes = 1, rc;

	m->n = 0;
	if (in->len && (rc = hf_regex_find(c, re, in->s, in->len, m)))
		return rc;
	for (size_t k = 0; k <= m->n; k++) {
		const size_t ms = k < m->n ? m->v[k].start : in->len;
		const size_t me = k < m->n ? m->v[k].end : in->len;

		if (hf_buf_add(o, in->s + last, ms - last))
			return -ENOMEM;
		if (zeroes) {
			const size_t keep = *zero > last ? (*zero < ms ? *zero : ms) - last : 0;

			z += keep;
			zeroes = keep == ms - last;
		}
		if (k == m->n)
			break;
		if (hf_buf_add(o, content, content_len))
			return -ENOMEM;
		if (zeroes) {
			zeroes = me == 0 || me - 1 < *zero;
			if (zeroes)
				z += content_len;
		}
		last = me;
	}
	*zero = z;
	return 0;
}

int hf_norm_apply(struct hf_ctx *c, const struct hf_piece *p, struct hf_piece *out)
{
	const struct dps_tok_hf *t = c->t;
	struct hf_piece cur = *p;
	int rc = 0;

	for (size_t i = 0; i < t->n_norm; i++) {
		const struct hf_norm *op = &t->norm[i];
		struct hf_buf *o = &c->norm[i & 1];
		size_t zero = cur.zero;

		o->len = 0;
		switch (op->kind) {
		case HF_NORM_NFC:
		case HF_NORM_NFD:
		case HF_NORM_NFKC:
		case HF_NORM_NFKD:
			rc = unicode_form(op, &cur, o, &zero);
			break;
		case HF_NORM_LOWERCASE:
		case HF_NORM_STRIP_ACCENTS:
			rc = lowercase(&cur, o, &zero, op->kind == HF_NORM_STRIP_ACCENTS);
			break;
		case HF_NORM_STRIP:
			rc = strip(op, &cur, o, &zero);
			break;
		case HF_NORM_PREPEND:
			rc = prepend(op, &cur, o, &zero);
			break;
		case HF_NORM_REPLACE: {
			struct hf_spans *m = &c->added_spans[1];

			rc = replace(c, &op->re, op->str, op->str_len, &cur, o, &zero, m);
			break;
		}
		}
		if (rc)
			return rc;
		cur = (struct hf_piece){ .s = o->p ? o->p : "", .len = o->len, .zero = zero,
					 .first = cur.first };
	}
	*out = cur;
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_hf_pretok.c - the pre-tokenizers of tokenizer.json, as the `tokenizers`
 * library's pre_tokenizers: ByteLevel (prefix space, GPT-2's pattern, bytes as the GPT-2
 * alphabet), Split (a pattern and one of five behaviours, inverted or not), Metaspace (spaces
 * as the replacement character, prepended always, first or never, split before each),
 * Digits, Whitespace, WhitespaceSplit and Sequence (flattened at load). Loaded by tok_hf.c
 * (hf_pre_load); run on every piece between the added tokens (hf_pre_run, called by the encode
 * driver of tok_hf.c), each level splitting its piece and handing every part down to the next
 * level, the last one to the BPE model.
 *
 * The splits follow NormalizedString::split: the pattern's matches and the gaps between them
 * cover the piece; Isolated keeps them all, Removed drops the matches, Contiguous joins runs of
 * equal kind, MergedWithPrevious joins a match to what precedes it and MergedWithNext to what
 * follows; empty parts are dropped.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <utf8proc.h>

#include "common/dps.h"
#include "engine/model/tok_hf_int.h"

#define GPT2_PATTERN \
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* The regex crate's \w+|[^\w\s]+ (Whitespace); \p{_RWord} is our name for its \w. */
#define WHITESPACE_PATTERN "[\\p{_RWord}]+|[^\\p{_RWord}\\s]+"

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the 68 others for
 * U+0100.. in byte order. The UTF-8 of each byte's character, and the reverse map. */
static char byte_char[256][3];
static uint8_t byte_char_len[256];
static int16_t char_byte[256 + 68];

static int byte_is_self(int b)
{
	return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
}

static void byte_tables(void)
{
	uint32_t n = 0;

	for (int b = 0; b < 256; b++) {
		const uint32_t cp = byte_is_self(b) ? (uint32_t)b : 256 + n++;
		char tmp[4];
		const size_t l = hf_utf8_put(tmp, cp);

		memcpy(byte_char[b], tmp, l);
		byte_char_len[b] = (uint8_t)l;
	}
	for (uint32_t cp = 0; cp < 256 + 68; cp++)
		char_byte[cp] = -1;
	n = 0;
	for (int b = 0; b < 256; b++)
		char_byte[byte_is_self(b) ? (uint32_t)b : 256 + n++] = (int16_t)b;
}

void hf_byte_table_init(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, byte_tables);
}

int hf_byte_of_char(uint32_t cp)
{
	return cp < 256 + 68 ? char_byte[cp] : -1;
}

static int add_op(struct dps_tok_hf *t, struct hf_pre **op, char *err, size_t errlen)
{
	if (t->n_pre == HF_MAX_OPS)
		return hf_fail(err, errlen, "pre_tokenizer: more than %d pre-tokenizers",
			       HF_MAX_OPS);
	*op = &t->pre[t->n_pre++];
	memset(*op, 0, sizeof(**op));
	return 0;
}

static int load_split(struct dps_tok_hf *t, struct hf_pre *op, json_t *v, char *err,
		      size_t errlen)
{
	static const char *const names[] = { [HF_REMOVED] = "Removed",
					     [HF_ISOLATED] = "Isolated",
					     [HF_MERGED_PREV] = "MergedWithPrevious",
					     [HF_MERGED_NEXT] = "MergedWithNext",
					     [HF_CONTIGUOUS] = "Contiguous" };
	const char *b;
	size_t len;
	int rc;

	op->kind = HF_PRE_SPLIT;
	if ((rc = hf_json_str(v, "pre_tokenizer Split", "behavior", 0, &b, &len, err, errlen)) ||
	    (rc = hf_json_bool(v, "pre_tokenizer Split", "invert", -1, &op->invert, err, errlen)))
		return rc;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (!strcmp(b, names[i])) {
			op->behavior = (enum hf_behavior)i;
			return hf_regex_load(t, &op->re, json_object_get(v, "pattern"),
					     "pre_tokenizer Split.pattern", err, errlen);
		}
	}
	return hf_fail(err, errlen, "pre_tokenizer Split.behavior \"%s\" is not one of Removed, "
		       "Isolated, MergedWithPrevious, MergedWithNext, Contiguous", b);
}

/* Metaspace's prepend_scheme and the older add_prefix_space, as the library reads them. */
int hf_prepend_scheme(json_t *v, const char *path, enum hf_prepend *out, char *err,
		      size_t errlen)
{
	const char *s;
	size_t len;
	int aps, rc;

	*out = HF_PREPEND_ALWAYS;
	if ((rc = hf_json_str(v, path, "prepend_scheme", 1, &s, &len, err, errlen)) ||
	    (rc = hf_json_bool(v, path, "add_prefix_space", 1, &aps, err, errlen)))
		return rc;
	if (s && !strcmp(s, "first"))
		*out = HF_PREPEND_FIRST;
	else if (s && !strcmp(s, "never"))
		*out = HF_PREPEND_NEVER;
	else if (s && strcmp(s, "always"))
		return hf_fail(err, errlen, "%s.prepend_scheme \"%s\" is not first, never or always",
			       path, s);
	if (!aps) {
		if (*out != HF_PREPEND_NEVER)
			return hf_fail(err, errlen, "%s: add_prefix_space false does not match "
				       "prepend_scheme (the library refuses it)", path);
	}
	return 0;
}

int hf_pre_load(struct dps_tok_hf *t, json_t *v, int depth, char *err, size_t errlen)
{
	struct hf_pre *op = NULL;
	const char *type;
	size_t len;
	int rc;

	if (depth > HF_MAX_DEPTH)
		return hf_fail(err, errlen, "pre_tokenizer: Sequences nested deeper than %d",
			       HF_MAX_DEPTH);
	if (!json_is_object(v))
		return hf_fail(err, errlen, "pre_tokenizer is %s, not an object", hf_json_type(v));
	if ((rc = hf_json_str(v, "pre_tokenizer", "type", 0, &type, &len, err, errlen)))
		return rc;
	if (!strcmp(type, "Sequence")) {
		json_t *list = json_object_get(v, "pretokenizers");

		if (!json_is_array(list))
			return hf_fail(err, errlen, "pre_tokenizer Sequence: \"pretokenizers\" is %s, "
				       "not an array", hf_json_type(list));
		for (size_t i = 0; i < json_array_size(list); i++)
			if ((rc = hf_pre_load(t, json_array_get(list, i), depth + 1, err, errlen)))
				return rc;
		return 0;
	}
	if ((rc = add_op(t, &op, err, errlen)))
		return rc;
	if (!strcmp(type, "ByteLevel")) {
		op->kind = HF_PRE_BYTELEVEL;
		hf_byte_table_init();
		if ((rc = hf_json_bool(v, "pre_tokenizer ByteLevel", "add_prefix_space", -1,
				       &op->add_prefix_space, err, errlen)) ||
		    (rc = hf_json_bool(v, "pre_tokenizer ByteLevel", "use_regex", 1, &op->use_regex,
				       err, errlen)))
			return rc;
		if (!op->use_regex)
			return 0;
		return hf_regex_compile(&op->re, GPT2_PATTERN, strlen(GPT2_PATTERN), HF_RE_ONIG,
					"pre_tokenizer ByteLevel", err, errlen);
	}
	if (!strcmp(type, "Split"))
		return load_split(t, op, v, err, errlen);
	if (!strcmp(type, "Metaspace")) {
		op->kind = HF_PRE_METASPACE;
		if ((rc = hf_json_char(v, "pre_tokenizer Metaspace", "replacement", op->repl,
				       &op->repl_len, &op->repl_cp, err, errlen)) ||
		    (rc = hf_prepend_scheme(v, "pre_tokenizer Metaspace", &op->scheme, err,
					    errlen)))
			return rc;
		return hf_json_bool(v, "pre_tokenizer Metaspace", "split", 1, &op->split, err,
				    errlen);
	}
	if (!strcmp(type, "Digits")) {
		op->kind = HF_PRE_DIGITS;
		return hf_json_bool(v, "pre_tokenizer Digits", "individual_digits", -1,
				    &op->individual, err, errlen);
	}
	if (!strcmp(type, "Whitespace")) {
		op->kind = HF_PRE_WHITESPACE;
		return hf_regex_compile(&op->re, WHITESPACE_PATTERN, strlen(WHITESPACE_PATTERN),
					HF_RE_ONIG, "pre_tokenizer Whitespace", err, errlen);
	}
	if (!strcmp(type, "WhitespaceSplit")) {
		op->kind = HF_PRE_WHITESPACE_SPLIT;
		return 0;
	}
	t->n_pre--;
	return hf_fail(err, errlen, "pre_tokenizer type \"%s\" is not supported", type);
}

/* ---- splitting ---- */

/* The matches of m (ordered, from a pattern) and the gaps between them, covering len. */
static int cover(const struct hf_spans *m, size_t len, int invert, struct hf_spans *out)
{
	size_t prev = 0;

	out->n = 0;
	for (size_t i = 0; i < m->n; i++) {
		if (prev != m->v[i].start && hf_spans_add(out, prev, m->v[i].start, invert))
			return -ENOMEM;
		if (hf_spans_add(out, m->v[i].start, m->v[i].end, !invert))
			return -ENOMEM;
		prev = m->v[i].end;
	}
	if (prev != len && hf_spans_add(out, prev, len, invert))
		return -ENOMEM;
	return 0;
}

/* Each character for which pred holds is a match (the library's Pattern for Fn(char)). */
static int char_matches(const char *s, size_t len, int (*pred)(uint32_t, uint32_t), uint32_t arg,
			struct hf_spans *m)
{
	m->n = 0;
	for (size_t i = 0; i < len;) {
		size_t cl;

		if (pred(hf_utf8_next(s + i, &cl), arg) && hf_spans_add(m, i, i + cl, 1))
			return -ENOMEM;
		i += cl;
	}
	return 0;
}

static int is_char(uint32_t cp, uint32_t want)
{
	return cp == want;
}

static int is_numeric(uint32_t cp, uint32_t unused)
{
	const utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);

	(void)unused;
	return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL ||
	       cat == UTF8PROC_CATEGORY_NO;
}

static int is_space(uint32_t cp, uint32_t unused)
{
	(void)unused;
	return hf_is_whitespace(cp);
}

/* NormalizedString::split's behaviours on the covering spans in (rewritten in place). */
static void behave(struct hf_spans *sp, enum hf_behavior b)
{
	size_t n = 0;
	int prev_match = 0;

	switch (b) {
	case HF_ISOLATED:
		return;
	case HF_REMOVED:
		for (size_t i = 0; i < sp->n; i++)
			if (!sp->v[i].match)
				sp->v[n++] = sp->v[i];
		break;
	case HF_CONTIGUOUS:
	case HF_MERGED_PREV:
		for (size_t i = 0; i < sp->n; i++) {
			const int m = sp->v[i].match;
			const int join = b == HF_CONTIGUOUS ? m == prev_match : m && !prev_match;

			if (join && n)
				sp->v[n - 1].end = sp->v[i].end;
			else
				sp->v[n++] = sp->v[i];
			prev_match = m;
		}
		break;
	case HF_MERGED_NEXT: {
		/* Folded from the end: a match joins the part after it. */
		size_t k = sp->n;

		for (size_t i = sp->n; i-- > 0;) {
			const int m = sp->v[i].match;

			if (m && !prev_match && k < sp->n)
				sp->v[k].start = sp->v[i].start;
			else
				sp->v[--k] = sp->v[i];
			prev_match = m;
		}
		memmove(sp->v, sp->v + k, (sp->n - k) * sizeof(*sp->v));
		n = sp->n - k;
		break;
	}
	}
	sp->n = n;
}

/* Runs the next level on each non-empty part of p given by sp. */
static int run_parts(struct hf_ctx *c, size_t level, const struct hf_piece *p,
		     const struct hf_spans *sp)
{
	for (size_t i = 0; i < sp->n; i++) {
		const size_t a = sp->v[i].start, b = sp->v[i].end;
		struct hf_piece q = { .s = p->s + a, .len = b - a };
		int rc;

		if (a == b)
			continue;
		if (p->first && a < p->zero) {
			q.first = 1;
			q.zero = (p->zero < b ? p->zero : b) - a;
		}
		if ((rc = hf_pre_run(c, level + 1, &q)))
			return rc;
	}
	return 0;
}

static int bytelevel(struct hf_ctx *c, size_t level, const struct hf_pre *op,
		     const struct hf_piece *p)
{
	struct hf_level *L = &c->lvl[level];
	struct hf_piece cur = *p;
	int rc;

	if (op->add_prefix_space && !(p->len && p->s[0] == ' ')) {
		L->buf.len = 0;
		if (hf_buf_add(&L->buf, " ", 1) || hf_buf_add(&L->buf, p->s, p->len))
			return -ENOMEM;
		cur.s = L->buf.p;
		cur.len = L->buf.len;
		cur.zero = p->zero ? p->zero + 1 : 0;
	}
	L->out.n = 0;
	if (op->use_regex) {
		if ((rc = hf_regex_find(c, &op->re, cur.s, cur.len, &L->spans)) ||
		    (rc = cover(&L->spans, cur.len, 0, &L->out)))
			return rc;
		L->spans.n = 0;
	} else if (hf_spans_add(&L->out, 0, cur.len, 0)) {
		return -ENOMEM;
	}
	for (size_t i = 0; i < L->out.n; i++) {
		const size_t a = L->out.v[i].start, b = L->out.v[i].end;
		struct hf_piece q = { 0 };
		size_t z = 0;

		if (a == b)
			continue;
		if (hf_buf_reserve(&L->buf2, 2 * (b - a)))
			return -ENOMEM;
		L->buf2.len = 0;
		for (size_t k = a; k < b; k++) {
			const unsigned char byte = (unsigned char)cur.s[k];

			memcpy(L->buf2.p + L->buf2.len, byte_char[byte], byte_char_len[byte]);
			L->buf2.len += byte_char_len[byte];
			if (k < cur.zero)
				z += byte_char_len[byte];
		}
		q.s = L->buf2.p;
		q.len = L->buf2.len;
		if (cur.first && a < cur.zero) {
			q.first = 1;
			q.zero = z;
		}
		if ((rc = hf_pre_run(c, level + 1, &q)))
			return rc;
	}
	return 0;
}

static int metaspace(struct hf_ctx *c, size_t level, const struct hf_pre *op,
		     const struct hf_piece *p)
{
	struct hf_level *L = &c->lvl[level];
	struct hf_piece cur = *p;
	size_t z = 0;
	int rc;

	L->buf.len = 0;
	if (hf_buf_reserve(&L->buf, p->len * 3 + 8))
		return -ENOMEM;
	for (size_t i = 0; i < p->len; i++) {
		const int sp = p->s[i] == ' ';

		if (hf_buf_add(&L->buf, sp ? op->repl : p->s + i, sp ? op->repl_len : 1))
			return -ENOMEM;
		if (i < p->zero)
			z += sp ? op->repl_len : 1;
	}
	cur.zero = z;
	if ((op->scheme == HF_PREPEND_ALWAYS || (op->scheme == HF_PREPEND_FIRST && p->first)) &&
	    !(L->buf.len >= op->repl_len && !memcmp(L->buf.p, op->repl, op->repl_len))) {
		if (hf_buf_reserve(&L->buf, op->repl_len))
			return -ENOMEM;
		memmove(L->buf.p + op->repl_len, L->buf.p, L->buf.len);
		memcpy(L->buf.p, op->repl, op->repl_len);
		L->buf.len += op->repl_len;
		if (cur.zero)
			cur.zero += op->repl_len;
	}
	cur.s = L->buf.p;
	cur.len = L->buf.len;
	L->out.n = 0;
	if (!op->split)
		return hf_pre_run(c, level + 1, &cur);
	if ((rc = char_matches(cur.s, cur.len, is_char, op->repl_cp, &L->spans)) ||
	    (rc = cover(&L->spans, cur.len, 0, &L->out)))
		return rc;
	behave(&L->out, HF_MERGED_NEXT);
	return run_parts(c, level, &cur, &L->out);
}

int hf_pre_run(struct hf_ctx *c, size_t level, const struct hf_piece *p)
{
	const struct hf_pre *op;
	struct hf_level *L;
	int rc = 0;

	if (level == c->t->n_pre)
		return hf_bpe_word(c, p->s, p->len);
	op = &c->t->pre[level];
	L = &c->lvl[level];
	L->spans.n = 0;
	switch (op->kind) {
	case HF_PRE_BYTELEVEL:
		return bytelevel(c, level, op, p);
	case HF_PRE_METASPACE:
		return metaspace(c, level, op, p);
	case HF_PRE_SPLIT:
		rc = hf_regex_find(c, &op->re, p->s, p->len, &L->spans);
		if (!rc)
			rc = cover(&L->spans, p->len, op->invert, &L->out);
		if (!rc)
			behave(&L->out, op->behavior);
		break;
	case HF_PRE_DIGITS:
		rc = char_matches(p->s, p->len, is_numeric, 0, &L->spans);
		if (!rc)
			rc = cover(&L->spans, p->len, 0, &L->out);
		if (!rc)
			behave(&L->out, op->individual ? HF_ISOLATED : HF_CONTIGUOUS);
		break;
	case HF_PRE_WHITESPACE:
		rc = hf_regex_find(c, &op->re, p->s, p->len, &L->spans);
		if (!rc)
			rc = cover(&L->spans, p->len, 1, &L->out);
		if (!rc)
			behave(&L->out, HF_REMOVED);
		break;
	case HF_PRE_WHITESPACE_SPLIT:
		rc = char_matches(p->s, p->len, is_space, 0, &L->spans);
		if (!rc)
			rc = cover(&L->spans, p->len, 0, &L->out);
		if (!rc)
			behave(&L->out, HF_REMOVED);
		break;
	}
	if (rc)
		return rc;
	return run_parts(c, level, p, &L->out);
}

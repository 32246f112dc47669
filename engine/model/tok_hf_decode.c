/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_hf_decode.c - the decoders and the post-processor of tokenizer.json, as the
 * `tokenizers` library's decoders and processors. Loaded by tok_hf.c (hf_dec_load,
 * hf_post_load, hf_post_config); dps_tok_hf_decode runs on every decode and streaming step,
 * hf_post_apply on every encode with or without special tokens.
 *
 * Decoding: each id becomes its token string (an added token's, else the vocabulary's; an
 * unknown id nothing; with DPS_TOK_SKIP_SPECIAL a string in the special set nothing), the
 * decoders rewrite the list of strings in turn (ByteLevel: GPT-2's alphabet back to bytes, all
 * strings joined and read with from_utf8_lossy; ByteFallback: runs of "<0xXX>" back to text, one
 * U+FFFD per byte of a run that is not UTF-8; Metaspace, Fuse, Strip, Replace), and the result
 * is their concatenation; without a decoder the strings are joined with spaces.
 *
 * Post-processing of one sequence: TemplateProcessing's single template (special tokens only
 * with DPS_TOK_ADD_SPECIAL; the sequence as often as the template names it either way),
 * RobertaProcessing and BertProcessing (cls, sequence, sep), ByteLevel (nothing for ids) and
 * Sequence of those (at most one that adds tokens). tokenizer_config.json replaces it for the
 * Llama and Gemma tokenizer classes, as transformers' update_post_processor does.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/dps.h"
#include "common/utf8.h"
#include "engine/model/tok_hf_int.h"

static int add_dec(struct dps_tok_hf *t, struct hf_dec **op, char *err, size_t errlen)
{
	if (t->n_dec == HF_MAX_OPS)
		return hf_fail(err, errlen, "decoder: more than %d decoders", HF_MAX_OPS);
	*op = &t->dec[t->n_dec++];
	memset(*op, 0, sizeof(**op));
	return 0;
}

static int dec_size(json_t *v, const char *field, size_t *out, char *err, size_t errlen)
{
	json_t *n = json_object_get(v, field);

	if (!json_is_integer(n) || json_integer_value(n) < 0)
		return hf_fail(err, errlen, "decoder Strip.%s is not a non-negative integer", field);
	*out = (size_t)json_integer_value(n);
	return 0;
}

int hf_dec_load(struct dps_tok_hf *t, json_t *v, int depth, char *err, size_t errlen)
{
	struct hf_dec *op = NULL;
	const char *type, *s;
	size_t len;
	char buf[4];
	int rc;

	if (depth > HF_MAX_DEPTH)
		return hf_fail(err, errlen, "decoder: Sequences nested deeper than %d", HF_MAX_DEPTH);
	if (!json_is_object(v))
		return hf_fail(err, errlen, "decoder is %s, not an object", hf_json_type(v));
	if ((rc = hf_json_str(v, "decoder", "type", 0, &type, &len, err, errlen)))
		return rc;
	if (!strcmp(type, "Sequence")) {
		json_t *list = json_object_get(v, "decoders");

		if (!json_is_array(list))
			return hf_fail(err, errlen, "decoder Sequence: \"decoders\" is %s, not an "
				       "array", hf_json_type(list));
		for (size_t i = 0; i < json_array_size(list); i++)
			if ((rc = hf_dec_load(t, json_array_get(list, i), depth + 1, err, errlen)))
				return rc;
		return 0;
	}
	if ((rc = add_dec(t, &op, err, errlen)))
		return rc;
	if (!strcmp(type, "ByteLevel")) {
		op->kind = HF_DEC_BYTELEVEL;
		return 0;
	}
	if (!strcmp(type, "ByteFallback")) {
		op->kind = HF_DEC_BYTEFALLBACK;
		return 0;
	}
	if (!strcmp(type, "Fuse")) {
		op->kind = HF_DEC_FUSE;
		return 0;
	}
	if (!strcmp(type, "Metaspace")) {
		op->kind = HF_DEC_METASPACE;
		if ((rc = hf_json_char(v, "decoder Metaspace", "replacement", buf, &len, &op->cp, err,
				       errlen)))
			return rc;
		return hf_prepend_scheme(v, "decoder Metaspace", &op->scheme, err, errlen);
	}
	if (!strcmp(type, "Strip")) {
		op->kind = HF_DEC_STRIP;
		if ((rc = hf_json_char(v, "decoder Strip", "content", buf, &len, &op->cp, err,
				       errlen)) ||
		    (rc = dec_size(v, "start", &op->start, err, errlen)))
			return rc;
		return dec_size(v, "stop", &op->stop, err, errlen);
	}
	if (!strcmp(type, "Replace")) {
		op->kind = HF_DEC_REPLACE;
		if ((rc = hf_json_str(v, "decoder Replace", "content", 0, &s, &len, err, errlen)))
			return rc;
		op->str = malloc(len + 1);
		if (!op->str)
			return -ENOMEM;
		memcpy(op->str, s, len);
		op->str[len] = '\0';
		op->str_len = len;
		return hf_regex_load(t, &op->re, json_object_get(v, "pattern"),
				     "decoder Replace.pattern", err, errlen);
	}
	t->n_dec--;
	return hf_fail(err, errlen, "decoder type \"%s\" is not supported", type);
}

/* ---- the post-processor ---- */

static int add_item(struct dps_tok_hf *t, int is_seq, const int32_t *ids, size_t n, char *err,
		    size_t errlen)
{
	struct hf_post_item *it;

	if (t->n_post == HF_MAX_OPS)
		return hf_fail(err, errlen, "post_processor: a template of more than %d pieces",
			       HF_MAX_OPS);
	it = &t->post[t->n_post++];
	*it = (struct hf_post_item){ .is_seq = is_seq, .n = n };
	if (n) {
		it->ids = malloc(n * sizeof(*ids));
		if (!it->ids)
			return -ENOMEM;
		memcpy(it->ids, ids, n * sizeof(*ids));
	}
	return 0;
}

static int id_of(json_t *v, const char *what, int32_t *out, char *err, size_t errlen)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    json_integer_value(v) > INT32_MAX - 1)
		return hf_fail(err, errlen, "post_processor: %s is not an id in [0, %d]", what,
			       INT32_MAX - 1);
	*out = (int32_t)json_integer_value(v);
	return 0;
}

static int load_template(struct dps_tok_hf *t, json_t *v, char *err, size_t errlen)
{
	json_t *single = json_object_get(v, "single"), *sp = json_object_get(v, "special_tokens");
	int rc;

	if (!json_is_array(single) || !json_is_array(json_object_get(v, "pair")) ||
	    !json_is_object(sp))
		return hf_fail(err, errlen, "post_processor TemplateProcessing needs arrays "
			       "\"single\" and \"pair\" and an object \"special_tokens\"");
	t->post_plain = 0;
	for (size_t i = 0; i < json_array_size(single); i++) {
		json_t *p = json_array_get(single, i), *seq = json_object_get(p, "Sequence"),
		       *tok = json_object_get(p, "SpecialToken");
		json_t *id = json_object_get(seq ? seq : tok, "id");

		if (!json_is_object(p) || json_object_size(p) != 1 || !json_is_object(seq ? seq : tok)
		    || !json_is_string(id))
			return hf_fail(err, errlen, "post_processor TemplateProcessing.single[%zu] is "
				       "not {\"Sequence\": {\"id\": ..}} or {\"SpecialToken\": "
				       "{\"id\": ..}}", i);
		if (seq) {
			if (strcmp(json_string_value(id), "A"))
				return hf_fail(err, errlen, "post_processor TemplateProcessing.single "
					       "uses sequence \"%s\" (a single sequence is A)",
					       json_string_value(id));
			t->post_plain++;
			rc = add_item(t, 1, NULL, 0, err, errlen);
		} else {
			json_t *st = json_object_get(sp, json_string_value(id));
			json_t *ids = json_object_get(st, "ids");
			int32_t buf[HF_MAX_OPS];
			size_t n = json_array_size(ids);

			if (!json_is_array(ids) || n > HF_MAX_OPS)
				return hf_fail(err, errlen, "post_processor TemplateProcessing: special "
					       "token \"%.60s\" has no list \"ids\" in special_tokens "
					       "(of at most %d)", json_string_value(id), HF_MAX_OPS);
			for (size_t k = 0; k < n; k++)
				if ((rc = id_of(json_array_get(ids, k), "a special token's id",
						&buf[k], err, errlen)))
					return rc;
			rc = add_item(t, 0, buf, n, err, errlen);
		}
		if (rc)
			return rc;
	}
	return 0;
}

static int load_cls_sep(struct dps_tok_hf *t, json_t *v, const char *type, char *err,
			size_t errlen)
{
	json_t *cls = json_object_get(v, "cls"), *sep = json_object_get(v, "sep");
	int32_t a, b;
	int rc;

	if (!json_is_array(cls) || json_array_size(cls) != 2 || !json_is_array(sep) ||
	    json_array_size(sep) != 2)
		return hf_fail(err, errlen, "post_processor %s needs \"cls\" and \"sep\" as [token, "
			       "id]", type);
	if ((rc = id_of(json_array_get(cls, 1), "cls", &a, err, errlen)) ||
	    (rc = id_of(json_array_get(sep, 1), "sep", &b, err, errlen)) ||
	    (rc = add_item(t, 0, &a, 1, err, errlen)) || (rc = add_item(t, 1, NULL, 0, err, errlen)))
		return rc;
	t->post_plain = 1;
	return add_item(t, 0, &b, 1, err, errlen);
}

int hf_post_load(struct dps_tok_hf *t, json_t *v, int depth, char *err, size_t errlen)
{
	const char *type;
	size_t len;
	int rc;

	if (depth > HF_MAX_DEPTH)
		return hf_fail(err, errlen, "post_processor: Sequences nested deeper than %d",
			       HF_MAX_DEPTH);
	if (!json_is_object(v))
		return hf_fail(err, errlen, "post_processor is %s, not an object", hf_json_type(v));
	if ((rc = hf_json_str(v, "post_processor", "type", 0, &type, &len, err, errlen)))
		return rc;
	if (!strcmp(type, "ByteLevel"))
		return 0;
	if (!strcmp(type, "Sequence")) {
		json_t *list = json_object_get(v, "processors");

		if (!json_is_array(list))
			return hf_fail(err, errlen, "post_processor Sequence: \"processors\" is %s, "
				       "not an array", hf_json_type(list));
		for (size_t i = 0; i < json_array_size(list); i++)
			if ((rc = hf_post_load(t, json_array_get(list, i), depth + 1, err, errlen)))
				return rc;
		return 0;
	}
	if (strcmp(type, "TemplateProcessing") && strcmp(type, "RobertaProcessing") &&
	    strcmp(type, "BertProcessing"))
		return hf_fail(err, errlen, "post_processor type \"%s\" is not supported", type);
	if (t->has_post)
		return hf_fail(err, errlen, "post_processor: a Sequence with more than one processor "
			       "that adds tokens is not supported");
	t->has_post = 1;
	if (!strcmp(type, "TemplateProcessing"))
		return load_template(t, v, err, errlen);
	return load_cls_sep(t, v, type, err, errlen);
}

/* bos_token / eos_token of tokenizer_config.json: a string or an AddedToken object. */
static int config_token(struct dps_tok_hf *t, json_t *cfg, const char *field, const char *def,
			int32_t *id, char *err, size_t errlen)
{
	json_t *v = json_object_get(cfg, field);
	const char *s = def;
	size_t len = strlen(def);

	if (json_is_object(v))
		v = json_object_get(v, "content");
	if (json_is_string(v)) {
		s = json_string_value(v);
		len = json_string_length(v);
	} else if (v && !json_is_null(v)) {
		return hf_fail(err, errlen, "tokenizer_config.json: %s is %s, not a string or a token",
			       field, hf_json_type(v));
	} else if (v) {
		return hf_fail(err, errlen, "tokenizer_config.json: add_%s is true but %s is null",
			       field, field);
	}
	*id = dps_tok_hf_token_id(t, s, len);
	if (*id < 0)
		return hf_fail(err, errlen, "tokenizer_config.json: %s \"%.60s\" is not a token",
			       field, s);
	return 0;
}

int hf_post_config(struct dps_tok_hf *t, json_t *cfg, char *err, size_t errlen)
{
	static const char *const classes[] = { "LlamaTokenizer", "LlamaTokenizerFast",
					       "CodeLlamaTokenizer", "CodeLlamaTokenizerFast",
					       "GemmaTokenizer", "GemmaTokenizerFast" };
	json_t *cls = json_object_get(cfg, "tokenizer_class");
	int bos = 1, eos = 0, known = 0, gemma, rc;
	int32_t bos_id = -1, eos_id = -1;

	if (!json_is_object(cfg))
		return hf_fail(err, errlen, "tokenizer_config.json is %s, not an object",
			       hf_json_type(cfg));
	if (!json_is_string(cls))
		return 0;
	for (size_t i = 0; i < sizeof(classes) / sizeof(classes[0]); i++)
		known |= !strcmp(json_string_value(cls), classes[i]);
	if (!known)
		return 0;
	gemma = !strncmp(json_string_value(cls), "Gemma", 5);
	if ((rc = hf_json_bool(cfg, "tokenizer_config.json", "add_bos_token", 1, &bos, err,
			       errlen)) ||
	    (rc = hf_json_bool(cfg, "tokenizer_config.json", "add_eos_token", 0, &eos, err,
			       errlen)) ||
	    (bos && (rc = config_token(t, cfg, "bos_token", gemma ? "<bos>" : "<s>", &bos_id, err,
				       errlen))) ||
	    (eos && (rc = config_token(t, cfg, "eos_token", gemma ? "<eos>" : "</s>", &eos_id, err,
				       errlen))))
		return rc;
	for (size_t i = 0; i < t->n_post; i++)
		free(t->post[i].ids);
	t->n_post = 0;
	t->has_post = 1;
	t->post_plain = 1;
	if ((bos && (rc = add_item(t, 0, &bos_id, 1, err, errlen))) ||
	    (rc = add_item(t, 1, NULL, 0, err, errlen)) ||
	    (eos && (rc = add_item(t, 0, &eos_id, 1, err, errlen))))
		return rc;
	return 0;
}

void hf_post_counts(const struct dps_tok_hf *t, unsigned flags, size_t *seq_times,
		    size_t *specials)
{
	*seq_times = t->has_post ? t->post_plain : 1;
	*specials = 0;
	if (t->has_post && (flags & DPS_TOK_ADD_SPECIAL))
		for (size_t i = 0; i < t->n_post; i++)
			*specials += t->post[i].n;
}

int hf_post_apply(const struct dps_tok_hf *t, unsigned flags, const int32_t *ids, size_t n,
		  size_t max_ids, int **out, size_t *out_n)
{
	size_t times, specials, total, k = 0;
	int *o;

	hf_post_counts(t, flags, &times, &specials);
	if (dps_size_mul(n, times, &total) || dps_size_add(total, specials, &total))
		return -ENOMEM;
	if (max_ids && total > max_ids)
		return -E2BIG;
	o = malloc((total ? total : 1) * sizeof(*o));
	if (!o)
		return -ENOMEM;
	if (!t->has_post && n) {
		memcpy(o, ids, n * sizeof(*o));
		k = n;
	}
	for (size_t i = 0; t->has_post && i < t->n_post; i++) {
		const struct hf_post_item *it = &t->post[i];

		if (it->is_seq) {
			if (n)
				memcpy(o + k, ids, n * sizeof(*o));
			k += n;
		} else if (flags & DPS_TOK_ADD_SPECIAL) {
			memcpy(o + k, it->ids, it->n * sizeof(*o));
			k += it->n;
		}
	}
	*out = o;
	*out_n = k;
	return 0;
}

/* ---- decoding ---- */

/* A list of strings: token i is text[at[i] .. at[i + 1]). */
struct strs {
	struct hf_buf text;
	size_t *at;
	size_t n, cap;
};

static int strs_init(struct strs *l)
{
	l->cap = 64;
	l->at = malloc(l->cap * sizeof(*l->at));
	if (!l->at)
		return -ENOMEM;
	l->at[0] = 0;
	return 0;
}

/* Ends the current string at the end of the text. */
static int strs_end(struct strs *l)
{
	if (l->n + 2 > l->cap) {
		const size_t cap = 2 * l->cap;
		size_t *a = realloc(l->at, cap * sizeof(*a));

		if (!a)
			return -ENOMEM;
		l->at = a;
		l->cap = cap;
	}
	l->at[++l->n] = l->text.len;
	return 0;
}

static int strs_add(struct strs *l, const char *s, size_t n)
{
	return hf_buf_add(&l->text, s, n) ? -ENOMEM : strs_end(l);
}

static void strs_reset(struct strs *l)
{
	l->text.len = 0;
	l->n = 0;
}

#define TOK(l, i) ((l)->text.p + (l)->at[i])
#define TOKLEN(l, i) ((l)->at[(i) + 1] - (l)->at[i])

static int dec_bytelevel(const struct strs *in, struct strs *out)
{
	struct hf_buf bytes = { 0 };
	char *lossy;
	size_t len;
	int rc = 0;

	for (size_t i = 0; !rc && i < in->n; i++) {
		const char *s = TOK(in, i);
		const size_t n = TOKLEN(in, i);
		size_t k = 0, mark = bytes.len;

		while (k < n) {
			size_t cl;
			const int b = hf_byte_of_char(hf_utf8_next(s + k, &cl));
			const char c = (char)b;

			if (b < 0)
				break;
			if ((rc = hf_buf_add(&bytes, &c, 1)))
				break;
			k += cl;
		}
		if (!rc && k < n) { /* a character outside the alphabet: the string as it is */
			bytes.len = mark;
			rc = hf_buf_add(&bytes, s, n);
		}
	}
	if (rc)
		goto err;
	lossy = dps_utf8_lossy(bytes.p ? bytes.p : "", bytes.len, &len);
	if (!lossy) {
		rc = -ENOMEM;
		goto err;
	}
	rc = strs_add(out, lossy, len);
	free(lossy);
err:
	hf_buf_free(&bytes);
	return rc;
}

/* Rust's u8::from_str_radix(s, 16) on two bytes: two hex digits, or '+' and one. */
static int hex_byte(const char *s)
{
	int v = 0;

	for (int i = s[0] == '+' ? 1 : 0; i < 2; i++) {
		const char c = s[i];

		if (c >= '0' && c <= '9')
			v = v * 16 + (c - '0');
		else if (c >= 'a' && c <= 'f')
			v = v * 16 + (c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v = v * 16 + (c - 'A' + 10);
		else
			return -1;
	}
	return v;
}

static int flush_bytes(struct hf_buf *run, struct strs *out)
{
	int rc = 0;

	if (!run->len)
		return 0;
	if (dps_utf8_valid(run->p, run->len))
		rc = strs_add(out, run->p, run->len);
	else
		for (size_t k = 0; !rc && k < run->len; k++)
			rc = strs_add(out, "\xef\xbf\xbd", 3);
	run->len = 0;
	return rc;
}

static int dec_bytefallback(const struct strs *in, struct strs *out)
{
	struct hf_buf run = { 0 };
	int rc = 0;

	for (size_t i = 0; !rc && i < in->n; i++) {
		const char *s = TOK(in, i);
		const size_t n = TOKLEN(in, i);
		const int b = n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' ? hex_byte(s + 3) : -1;

		if (b >= 0) {
			const char c = (char)b;

			rc = hf_buf_add(&run, &c, 1);
		} else if (!(rc = flush_bytes(&run, out))) {
			rc = strs_add(out, s, n);
		}
	}
	if (!rc)
		rc = flush_bytes(&run, out);
	hf_buf_free(&run);
	return rc;
}

/* Per-string decoders: Metaspace, Strip, Replace. */
static int dec_each(struct hf_ctx *c, const struct hf_dec *op, const struct strs *in,
		    struct strs *out)
{
	struct hf_spans m = { 0 };
	int rc = 0;

	for (size_t i = 0; !rc && i < in->n; i++) {
		const char *s = TOK(in, i);
		const size_t n = TOKLEN(in, i);

		if (op->kind == HF_DEC_METASPACE) {
			for (size_t k = 0; !rc && k < n;) {
				size_t cl;
				const uint32_t cp = hf_utf8_next(s + k, &cl);

				if (cp != op->cp)
					rc = hf_buf_add(&out->text, s + k, cl);
				else if (i != 0 || op->scheme == HF_PREPEND_NEVER)
					rc = hf_buf_add(&out->text, " ", 1);
				k += cl;
			}
		} else if (op->kind == HF_DEC_STRIP) {
			size_t a = 0, b = n, k;

			/* The library panics where stop passes the start of the string or the
			 * cuts cross; here the cuts stop there. */
			for (k = 0; k < op->start && a < n; k++) {
				size_t cl;

				if (hf_utf8_next(s + a, &cl) != op->cp)
					break;
				a += cl;
			}
			for (k = 0; k < op->stop && b > a; k++) {
				size_t j = b - 1, cl;

				while (j > 0 && ((unsigned char)s[j] & 0xc0) == 0x80)
					j--;
				if (hf_utf8_next(s + j, &cl) != op->cp)
					break;
				b = j;
			}
			rc = hf_buf_add(&out->text, s + a, b - a);
		} else {
			size_t last = 0;

			m.n = 0;
			if (n)
				rc = hf_regex_find(c, &op->re, s, n, &m);
			for (size_t k = 0; !rc && k < m.n; k++) {
				if (!(rc = hf_buf_add(&out->text, s + last, m.v[k].start - last)))
					rc = hf_buf_add(&out->text, op->str, op->str_len);
				last = m.v[k].end;
			}
			if (!rc)
				rc = hf_buf_add(&out->text, s + last, n - last);
		}
		if (!rc)
			rc = strs_end(out);
	}
	free(m.v);
	return rc;
}

static int dec_join(const struct strs *in, struct strs *out, const char *sep)
{
	int rc = 0;

	for (size_t i = 0; !rc && i < in->n; i++)
		if (!(rc = i && *sep ? hf_buf_add(&out->text, sep, strlen(sep)) : 0))
			rc = hf_buf_add(&out->text, TOK(in, i), TOKLEN(in, i));
	return rc ? rc : strs_end(out);
}

int dps_tok_hf_decode(const struct dps_tok_hf *t, const int *ids, size_t n, unsigned flags,
		      char **text, size_t *len)
{
	struct strs l[2] = { 0 };
	struct hf_ctx c = { .t = t };
	int cur = 0, rc = 0;

	*text = NULL;
	*len = 0;
	if (strs_init(&l[0]) || strs_init(&l[1])) {
		rc = -ENOMEM;
		goto err;
	}
	for (size_t i = 0; !rc && i < n; i++) {
		size_t tl;
		const char *s = hf_id_token(t, ids[i], &tl);

		/* special_id holds whether the string is in the special set, as the library
		 * tests it. */
		if (!s || ((flags & DPS_TOK_SKIP_SPECIAL) && t->special_id[ids[i]]))
			continue;
		rc = strs_add(&l[0], s, tl);
	}
	for (size_t d = 0; !rc && d < t->n_dec; d++) {
		const struct hf_dec *op = &t->dec[d];
		struct strs *in = &l[cur], *out = &l[!cur];

		strs_reset(out);
		switch (op->kind) {
		case HF_DEC_BYTELEVEL:
			rc = dec_bytelevel(in, out);
			break;
		case HF_DEC_BYTEFALLBACK:
			rc = dec_bytefallback(in, out);
			break;
		case HF_DEC_FUSE:
			rc = dec_join(in, out, "");
			break;
		default:
			rc = dec_each(&c, op, in, out);
			break;
		}
		cur = !cur;
	}
	if (!rc) {
		struct strs *in = &l[cur], *out = &l[!cur];

		strs_reset(out);
		rc = dec_join(in, out, t->has_decoder ? "" : " ");
		cur = !cur;
	}
	if (!rc && !(rc = hf_buf_add(&l[cur].text, "", 1))) {
		*len = l[cur].text.len - 1;
		*text = l[cur].text.p;
		l[cur].text.p = NULL;
	}
err:
	for (int i = 0; i < 2; i++) {
		hf_buf_free(&l[i].text);
		free(l[i].at);
	}
	hf_ctx_free(&c);
	return rc;
}

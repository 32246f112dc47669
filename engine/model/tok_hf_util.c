/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_hf_util.c - the small containers and readers the tokenizer.json backend
 * shares (tok_hf_int.h): growable buffers, a byte-string hash map (the vocabulary, the added
 * tokens, the per-call word cache), span lists, error messages, typed JSON field readers that
 * name the field and the rule, and UTF-8 helpers for text known to be valid. Called by every
 * tok_hf*.c file, at load and on every encode.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/dps.h"
#include "engine/model/tok_hf_int.h"

int hf_buf_reserve(struct hf_buf *b, size_t extra)
{
	size_t cap;
	char *p;

	if (extra <= b->cap - b->len)
		return 0;
	if (dps_size_add(b->len, extra, &cap))
		return -ENOMEM;
	cap = cap < 64 ? 64 : cap;
	if (cap < 2 * b->cap)
		cap = 2 * b->cap;
	p = realloc(b->p, cap);
	if (!p)
		return -ENOMEM;
	b->p = p;
	b->cap = cap;
	return 0;
}

int hf_buf_add(struct hf_buf *b, const void *s, size_t n)
{
	if (hf_buf_reserve(b, n))
		return -ENOMEM;
	if (n)
		memcpy(b->p + b->len, s, n);
	b->len += n;
	return 0;
}

void hf_buf_free(struct hf_buf *b)
{
	free(b->p);
	*b = (struct hf_buf){ 0 };
}

/* FNV-1a folded with a final mix: cheap on the short keys of a vocabulary. */
uint32_t hf_hash(const char *s, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < len; i++) {
		h ^= (unsigned char)s[i];
		h *= 0x100000001b3ull;
	}
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 32;
	return (uint32_t)h;
}

static int map_grow(struct hf_map *m)
{
	const size_t cap = m->mask ? 2 * (m->mask + 1) : 64;
	uint32_t *slot = calloc(cap, sizeof(*slot));

	if (!slot)
		return -ENOMEM;
	for (size_t i = 0; i < m->n; i++) {
		size_t j = m->ent[i].hash & (cap - 1);

		while (slot[j])
			j = (j + 1) & (cap - 1);
		slot[j] = (uint32_t)i + 1;
	}
	free(m->slot);
	m->slot = slot;
	m->mask = cap - 1;
	return 0;
}

static long map_find(const struct hf_map *m, const char *key, size_t len, uint32_t h)
{
	if (!m->mask)
		return -1;
	for (size_t j = h & m->mask;; j = (j + 1) & m->mask) {
		const uint32_t s = m->slot[j];
		const struct hf_map_ent *e;

		if (!s)
			return -(long)j - 2;
		e = &m->ent[s - 1];
		if (e->hash == h && e->len == len && !memcmp(m->keys.p + e->off, key, len))
			return (long)s - 1;
	}
}

int hf_map_put(struct hf_map *m, const char *key, size_t len, int32_t val)
{
	const uint32_t h = hf_hash(key, len);
	long f = map_find(m, key, len, h);
	size_t j;

	if (f >= 0) {
		m->ent[f].val = val;
		return 0;
	}
	if (len > UINT32_MAX || m->n >= UINT32_MAX - 1)
		return -ENOMEM;
	if (2 * (m->n + 1) > m->mask + 1) {
		if (map_grow(m))
			return -ENOMEM;
		f = map_find(m, key, len, h);
	}
	if (m->n == m->ent_cap) {
		const size_t cap = m->ent_cap ? 2 * m->ent_cap : 64;
		struct hf_map_ent *e = realloc(m->ent, cap * sizeof(*e));

		if (!e)
			return -ENOMEM;
		m->ent = e;
		m->ent_cap = cap;
	}
	j = (size_t)(-f - 2);
	m->ent[m->n] = (struct hf_map_ent){ .off = m->keys.len, .len = (uint32_t)len, .hash = h,
					    .val = val };
	if (hf_buf_add(&m->keys, key, len))
		return -ENOMEM;
	m->slot[j] = (uint32_t)++m->n;
	return 0;
}

int32_t hf_map_get(const struct hf_map *m, const char *key, size_t len)
{
	const long f = map_find(m, key, len, hf_hash(key, len));

	return f >= 0 ? m->ent[f].val : -1;
}

void hf_map_free(struct hf_map *m)
{
	free(m->slot);
	free(m->ent);
	hf_buf_free(&m->keys);
	*m = (struct hf_map){ 0 };
}

int hf_spans_add(struct hf_spans *s, size_t start, size_t end, int match)
{
	if (s->n == s->cap) {
		const size_t cap = s->cap ? 2 * s->cap : 16;
		struct hf_span *v = realloc(s->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = (struct hf_span){ .start = start, .end = end, .match = match };
	return 0;
}

int hf_fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	int k;

	if (!err || !errlen)
		return -EINVAL;
	k = snprintf(err, errlen, "tokenizer.json: ");
	if (k < 0 || (size_t)k >= errlen)
		return -EINVAL;
	va_start(ap, fmt);
	vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

const char *hf_json_type(json_t *v)
{
	switch (v ? json_typeof(v) : JSON_NULL) {
	case JSON_OBJECT:
		return "an object";
	case JSON_ARRAY:
		return "an array";
	case JSON_STRING:
		return "a string";
	case JSON_INTEGER:
	case JSON_REAL:
		return "a number";
	case JSON_TRUE:
	case JSON_FALSE:
		return "a boolean";
	default:
		return "null";
	}
}

int hf_json_bool(json_t *obj, const char *path, const char *field, int def, int *out,
		 char *err, size_t errlen)
{
	json_t *v = json_object_get(obj, field);

	if (!v || json_is_null(v)) {
		if (def < 0)
			return hf_fail(err, errlen, "%s.%s is missing (a boolean)", path, field);
		*out = def;
		return 0;
	}
	if (!json_is_boolean(v))
		return hf_fail(err, errlen, "%s.%s is %s, not a boolean", path, field,
			       hf_json_type(v));
	*out = json_is_true(v);
	return 0;
}

int hf_json_str(json_t *obj, const char *path, const char *field, int nullable, const char **s,
		size_t *len, char *err, size_t errlen)
{
	json_t *v = json_object_get(obj, field);

	*s = NULL;
	*len = 0;
	if (!v || json_is_null(v)) {
		if (nullable)
			return 0;
		return hf_fail(err, errlen, "%s.%s is missing (a string)", path, field);
	}
	if (!json_is_string(v))
		return hf_fail(err, errlen, "%s.%s is %s, not a string", path, field,
			       hf_json_type(v));
	*s = json_string_value(v);
	*len = json_string_length(v);
	return 0;
}

int hf_json_char(json_t *obj, const char *path, const char *field, char *buf, size_t *len,
		 uint32_t *cp, char *err, size_t errlen)
{
	const char *s;
	size_t l, cl;
	int rc = hf_json_str(obj, path, field, 0, &s, &l, err, errlen);

	if (rc)
		return rc;
	if (!l || (*cp = hf_utf8_next(s, &cl), cl != l))
		return hf_fail(err, errlen, "%s.%s must be one character", path, field);
	memcpy(buf, s, l);
	*len = l;
	return 0;
}

size_t hf_utf8_put(char *o, uint32_t cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xc0 | cp >> 6);
		o[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xe0 | cp >> 12);
		o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		o[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | cp >> 18);
	o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	o[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

int hf_is_whitespace(uint32_t cp)
{
	return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 ||
	       cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
	       cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

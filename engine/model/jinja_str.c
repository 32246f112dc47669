/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja_str.c - Python's str semantics on UTF-8 text for the Jinja2 renderer:
 * what counts as whitespace (str.isspace), strip, split and splitlines, case mappings (with
 * utf8proc, plus the special casings Python applies), replace, find, indexing and slicing by
 * code point, HTML escaping. The filters, the methods and the printer call it; the strings
 * are valid UTF-8 (the lexer and jansson check).
 */
#include <errno.h>
#include <string.h>

#include <utf8proc.h>

#include "common/dps.h"
#include "engine/model/jinja_int.h"

/* The code point at p (n bytes left, valid UTF-8); its length in *l. */
uint32_t jstr_cp_at(const char *p, size_t n, size_t *l)
{
	const unsigned char *s = (const unsigned char *)p;

	if (s[0] < 0x80 || n < 2) {
		*l = 1;
		return s[0];
	}
	if (s[0] < 0xe0) {
		*l = 2;
		return (uint32_t)(s[0] & 31) << 6 | (s[1] & 63);
	}
	if (s[0] < 0xf0 || n < 4) {
		*l = n < 3 ? n : 3;
		return n < 3 ? 0xfffd : (uint32_t)(s[0] & 15) << 12 | (uint32_t)(s[1] & 63) << 6 |
						(s[2] & 63);
	}
	*l = 4;
	return (uint32_t)(s[0] & 7) << 18 | (uint32_t)(s[1] & 63) << 12 |
	       (uint32_t)(s[2] & 63) << 6 | (s[3] & 63);
}

int jstr_put_cp(char *o, uint32_t cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xc0 | cp >> 6);
		o[1] = (char)(0x80 | (cp & 63));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xe0 | cp >> 12);
		o[1] = (char)(0x80 | (cp >> 6 & 63));
		o[2] = (char)(0x80 | (cp & 63));
		return 3;
	}
	o[0] = (char)(0xf0 | cp >> 18);
	o[1] = (char)(0x80 | (cp >> 12 & 63));
	o[2] = (char)(0x80 | (cp >> 6 & 63));
	o[3] = (char)(0x80 | (cp & 63));
	return 4;
}

int jstr_valid_utf8(const char *p, size_t n)
{
	const unsigned char *s = (const unsigned char *)p;

	for (size_t i = 0; i < n;) {
		size_t l;
		uint32_t cp, min;

		if (s[i] < 0x80) {
			i++;
			continue;
		}
		if (s[i] >= 0xc2 && s[i] <= 0xdf) {
			l = 2;
			min = 0x80;
		} else if (s[i] >= 0xe0 && s[i] <= 0xef) {
			l = 3;
			min = 0x800;
		} else if (s[i] >= 0xf0 && s[i] <= 0xf4) {
			l = 4;
			min = 0x10000;
		} else {
			return 0;
		}
		if (i + l > n)
			return 0;
		for (size_t j = 1; j < l; j++)
			if ((s[i + j] & 0xc0) != 0x80)
				return 0;
		cp = jstr_cp_at(p + i, n - i, &l);
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
		i += l;
	}
	return 1;
}

static int cp_isspace(uint32_t c)
{
	return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
	       c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
	       c == 0x202f || c == 0x205f || c == 0x3000;
}

int jstr_isspace_at(const char *p, size_t n, size_t *clen)
{
	uint32_t c;

	if (!n)
		return 0;
	if ((unsigned char)p[0] < 0x80) {
		*clen = 1;
		return cp_isspace((unsigned char)p[0]);
	}
	c = jstr_cp_at(p, n, clen);
	return cp_isspace(c);
}

size_t jstr_cplen(struct jstr s)
{
	size_t k = 0;

	for (size_t i = 0; i < s.n; i++)
		k += ((unsigned char)s.p[i] & 0xc0) != 0x80;
	return k;
}

/* Python's str.isprintable for one code point (what repr keeps unescaped). */
int jstr_isprintable(uint32_t c)
{
	utf8proc_category_t cat;

	if (c == ' ')
		return 1;
	if (c < 0x7f)
		return c > 0x20;
	cat = utf8proc_category((utf8proc_int32_t)c);
	return !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
		 cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
		 cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
		 cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
}

/* Python's \w: letters, digits of every kind and the underscore. */
int jstr_isword(uint32_t c)
{
	utf8proc_category_t cat;

	if (c < 0x80)
		return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		       c == '_';
	cat = utf8proc_category((utf8proc_int32_t)c);
	return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
	       (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

static int in_chars(uint32_t c, const struct jstr *chars)
{
	if (!chars)
		return cp_isspace(c);
	for (size_t i = 0; i < chars->n;) {
		size_t l;

		if (jstr_cp_at(chars->p + i, chars->n - i, &l) == c)
			return 1;
		i += l;
	}
	return 0;
}

int jstr_strip(struct jarena *a, struct jstr s, const struct jstr *chars, int left, int right,
	       struct jstr *out)
{
	size_t b = 0, e = s.n, l;

	(void)a;
	if (left)
		while (b < e && in_chars(jstr_cp_at(s.p + b, e - b, &l), chars))
			b += l;
	if (right)
		while (e > b) {
			size_t q = e - 1;

			while (q > b && ((unsigned char)s.p[q] & 0xc0) == 0x80)
				q--;
			if (!in_chars(jstr_cp_at(s.p + q, e - q, &l), chars))
				break;
			e = q;
		}
	out->p = s.p + b;
	out->n = e - b;
	return 0;
}

static int cp_cased(uint32_t c)
{
	utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);

	return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
	       cat == UTF8PROC_CATEGORY_LT || utf8proc_toupper((utf8proc_int32_t)c) != (int)c ||
	       utf8proc_tolower((utf8proc_int32_t)c) != (int)c;
}

/* Writes the mapping of c (mode: 0 upper, 1 lower, 2 title) with Python's special casings. */
static size_t map_cp(char *o, uint32_t c, int mode, int final_sigma)
{
	static const struct {
		uint32_t c;
		const char *up, *title;
	} special[] = {
		{ 0xdf, "SS", "Ss" }, { 0xfb00, "FF", "Ff" }, { 0xfb01, "FI", "Fi" },
		{ 0xfb02, "FL", "Fl" }, { 0xfb03, "FFI", "Ffi" }, { 0xfb04, "FFL", "Ffl" },
		{ 0xfb05, "ST", "St" }, { 0xfb06, "ST", "St" }, { 0x149, "\xca\xbcN", "\xca\xbcN" },
	};

	if (mode != 1) {
		for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++)
			if (special[i].c == c) {
				const char *m = mode == 0 ? special[i].up : special[i].title;

				memcpy(o, m, strlen(m));
				return strlen(m);
			}
		return (size_t)jstr_put_cp(o, (uint32_t)(mode == 0 ?
			utf8proc_toupper((utf8proc_int32_t)c) : utf8proc_totitle((utf8proc_int32_t)c)));
	}
	if (c == 0x130) {
		memcpy(o, "i\xcc\x87", 3);
		return 3;
	}
	if (c == 0x3a3 && final_sigma)
		return (size_t)jstr_put_cp(o, 0x3c2);
	return (size_t)jstr_put_cp(o, (uint32_t)utf8proc_tolower((utf8proc_int32_t)c));
}

int jstr_case(struct jarena *a, struct jstr s, int mode, struct jstr *out)
{
	char *o = jarena_alloc(a, s.n * 3 + 1);
	size_t k = 0, l;
	int prev_cased = 0, word_start = 1;

	if (!o)
		return -ENOMEM;
	for (size_t i = 0; i < s.n; i += l) {
		uint32_t c = jstr_cp_at(s.p + i, s.n - i, &l);
		int m = 0, sigma = 0;

		switch (mode) {
		case JCASE_UPPER: m = 0; break;
		case JCASE_LOWER: m = 1; break;
		case JCASE_TITLE: m = prev_cased ? 1 : 2; break;
		case JCASE_CAPITALIZE: m = i == 0 ? 2 : 1; break;
		case JCASE_JTITLE: m = word_start ? 0 : 1; break;
		}
		if (m == 1 && c == 0x3a3) {
			/* Final sigma: after a cased letter, not before one. */
			size_t l2;

			sigma = i > 0 && prev_cased &&
				!(i + l < s.n && cp_cased(jstr_cp_at(s.p + i + l, s.n - i - l, &l2)));
		}
		k += map_cp(o + k, c, m, sigma);
		prev_cased = cp_cased(c);
		if (mode == JCASE_JTITLE)
			word_start = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' ||
				     cp_isspace(c);
	}
	o[k] = 0;
	out->p = o;
	out->n = k;
	return 0;
}

long long jstr_find(struct jstr s, struct jstr sub, size_t from)
{
	if (sub.n == 0)
		return from <= s.n ? (long long)from : -1;
	for (size_t i = from; i + sub.n <= s.n; i++)
		if (s.p[i] == sub.p[0] && !memcmp(s.p + i, sub.p, sub.n))
			return (long long)i;
	return -1;
}

int jstr_replace(struct jarena *a, struct jstr s, struct jstr old, struct jstr new_,
		 long long count, struct jstr *out)
{
	size_t cap = s.n + 1, k = 0, i = 0;
	long long done = 0, hits = 0;
	char *o;

	/* count the replacements first, for the size */
	if (old.n == 0)
		hits = (long long)jstr_cplen(s) + 1;
	else
		for (long long f = jstr_find(s, old, 0); f >= 0; f = jstr_find(s, old, (size_t)f + old.n))
			hits++;
	if (count >= 0 && hits > count)
		hits = count;
	if (new_.n > old.n) {
		size_t extra;

		if (dps_size_mul((size_t)hits, new_.n - old.n, &extra) ||
		    dps_size_add(cap, extra, &cap))
			return -ENOMEM;
	}
	o = jarena_alloc(a, cap);
	if (!o)
		return -ENOMEM;
	if (old.n == 0) {
		for (;;) {
			size_t l;

			if (done < hits) {
				memcpy(o + k, new_.p, new_.n);
				k += new_.n;
				done++;
			}
			if (i >= s.n)
				break;
			jstr_cp_at(s.p + i, s.n - i, &l);
			memcpy(o + k, s.p + i, l);
			k += l;
			i += l;
		}
	} else {
		while (i < s.n) {
			long long f = done < hits ? jstr_find(s, old, i) : -1;

			if (f < 0) {
				memcpy(o + k, s.p + i, s.n - i);
				k += s.n - i;
				break;
			}
			memcpy(o + k, s.p + i, (size_t)f - i);
			k += (size_t)f - i;
			memcpy(o + k, new_.p, new_.n);
			k += new_.n;
			i = (size_t)f + old.n;
			done++;
		}
	}
	o[k] = 0;
	out->p = o;
	out->n = k;
	return 0;
}

long long jslice(long long len, const long long *start, const long long *stop, long long step,
		 long long *first)
{
	long long b, e;

	if (step > 0) {
		b = start ? *start : 0;
		e = stop ? *stop : len;
		if (b < 0)
			b = b + len < 0 ? 0 : b + len;
		if (b > len)
			b = len;
		if (e < 0)
			e = e + len < 0 ? 0 : e + len;
		if (e > len)
			e = len;
		*first = b;
		return e > b ? (e - b + step - 1) / step : 0;
	}
	b = start ? *start : len - 1;
	e = stop ? *stop : -1;
	if (start) {
		if (b < 0)
			b = b + len < 0 ? -1 : b + len;
		if (b >= len)
			b = len - 1;
	}
	if (stop) {
		if (e < 0)
			e = e + len < 0 ? -1 : e + len;
		if (e >= len)
			e = len - 1;
	}
	*first = b;
	return b > e ? (b - e + (-step) - 1) / (-step) : 0;
}

/* Byte offsets of every code point of s, and s.n at the end. */
static size_t *cp_offsets(struct jarena *a, struct jstr s, size_t *count)
{
	size_t n = jstr_cplen(s), k = 0;
	size_t *off = jarena_alloc(a, (n + 1) * sizeof(*off));

	if (!off)
		return NULL;
	for (size_t i = 0; i < s.n; i++)
		if (((unsigned char)s.p[i] & 0xc0) != 0x80)
			off[k++] = i;
	off[k] = s.n;
	*count = n;
	return off;
}

struct jv jstr_index(struct jstr s, long long i, int *ok)
{
	long long k = 0;
	size_t n = jstr_cplen(s), l;

	*ok = 0;
	if (i < 0)
		i += (long long)n;
	if (i < 0 || i >= (long long)n)
		return jv_undef();
	for (size_t p = 0; p < s.n; p += l, k++) {
		jstr_cp_at(s.p + p, s.n - p, &l);
		if (k == i) {
			*ok = 1;
			return jv_str(s.p + p, l);
		}
	}
	return jv_undef();
}

int jstr_slice(struct jarena *a, struct jstr s, long long *start, long long *stop,
	       long long step, struct jstr *out)
{
	size_t n, k = 0;
	size_t *off = cp_offsets(a, s, &n);
	long long first, cnt;
	char *o;

	if (!off)
		return -ENOMEM;
	cnt = jslice((long long)n, start, stop, step, &first);
	if (step == 1) {
		out->p = s.p + off[first];
		out->n = off[first + cnt] - off[first];
		return 0;
	}
	o = jarena_alloc(a, s.n + 1);
	if (!o)
		return -ENOMEM;
	for (long long j = 0, i = first; j < cnt; j++, i += step) {
		memcpy(o + k, s.p + off[i], off[i + 1] - off[i]);
		k += off[i + 1] - off[i];
	}
	out->p = o;
	out->n = k;
	return 0;
}

static int push_str(struct jarena *a, struct jlist *l, const char *p, size_t n)
{
	return jlist_push(a, l, jv_str(p, n));
}

/* str.split / str.rsplit. sep NULL: runs of whitespace. */
int jstr_split(struct jarena *a, struct jstr s, const struct jstr *sep, long long maxsplit,
	       int right, struct jlist **out)
{
	struct jlist *l = jlist_new(a, 4, JL_LIST);
	int rc = 0;

	if (!l)
		return -ENOMEM;
	if (maxsplit < 0)
		maxsplit = -1;
	if (sep && !right) {
		size_t i = 0;

		while (maxsplit != 0) {
			long long f = jstr_find(s, *sep, i);

			if (f < 0)
				break;
			if ((rc = push_str(a, l, s.p + i, (size_t)f - i)))
				return rc;
			i = (size_t)f + sep->n;
			if (maxsplit > 0)
				maxsplit--;
		}
		if ((rc = push_str(a, l, s.p + i, s.n - i)))
			return rc;
	} else if (sep) {
		size_t e = s.n;
		struct jlist *r;

		while (maxsplit != 0 && e >= sep->n) {
			long long f = -1;

			for (size_t i = e - sep->n + 1; i-- > 0;)
				if (!memcmp(s.p + i, sep->p, sep->n)) {
					f = (long long)i;
					break;
				}
			if (f < 0)
				break;
			if ((rc = push_str(a, l, s.p + f + sep->n, e - (size_t)f - sep->n)))
				return rc;
			e = (size_t)f;
			if (maxsplit > 0)
				maxsplit--;
		}
		if ((rc = push_str(a, l, s.p, e)))
			return rc;
		r = jlist_new(a, l->n, JL_LIST);
		if (!r)
			return -ENOMEM;
		for (size_t i = l->n; i-- > 0;)
			if ((rc = jlist_push(a, r, l->v[i])))
				return rc;
		l = r;
	} else if (!right) {
		size_t i = 0, w;

		for (;;) {
			size_t b;

			while (i < s.n && jstr_isspace_at(s.p + i, s.n - i, &w))
				i += w;
			if (i >= s.n)
				break;
			if (maxsplit == 0) {
				struct jstr rest;

				jstr_strip(a, jv_str(s.p + i, s.n - i).s, NULL, 0, 1, &rest);
				(void)rest;
				if ((rc = push_str(a, l, s.p + i, s.n - i)))
					return rc;
				break;
			}
			b = i;
			while (i < s.n && !jstr_isspace_at(s.p + i, s.n - i, &w))
				i += ((unsigned char)s.p[i] < 0x80) ? 1 : w;
			if ((rc = push_str(a, l, s.p + b, i - b)))
				return rc;
			if (maxsplit > 0)
				maxsplit--;
		}
	} else {
		/* rsplit on whitespace: split the reversed problem from the end */
		struct jlist *r;
		size_t e = s.n;

		for (;;) {
			size_t b;
			struct jstr t;

			jstr_strip(a, jv_str(s.p, e).s, NULL, 0, 1, &t);
			e = t.n;
			if (e == 0)
				break;
			if (maxsplit == 0) {
				if ((rc = push_str(a, l, s.p, e)))
					return rc;
				break;
			}
			b = e;
			while (b > 0) {
				size_t q = b - 1, w;

				while (q > 0 && ((unsigned char)s.p[q] & 0xc0) == 0x80)
					q--;
				if (jstr_isspace_at(s.p + q, b - q, &w))
					break;
				b = q;
			}
			if ((rc = push_str(a, l, s.p + b, e - b)))
				return rc;
			e = b;
			if (maxsplit > 0)
				maxsplit--;
		}
		r = jlist_new(a, l->n, JL_LIST);
		if (!r)
			return -ENOMEM;
		for (size_t i = l->n; i-- > 0;)
			if ((rc = jlist_push(a, r, l->v[i])))
				return rc;
		l = r;
	}
	*out = l;
	return 0;
}

/* Length of the line boundary at p (str.splitlines' list), else 0. */
static size_t line_break_at(const char *p, size_t n)
{
	size_t l;
	uint32_t c = jstr_cp_at(p, n, &l);

	if (c == '\r' && n > 1 && p[1] == '\n')
		return 2;
	if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
	    c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029)
		return l;
	return 0;
}

int jstr_splitlines(struct jarena *a, struct jstr s, int keepends, struct jlist **out)
{
	struct jlist *l = jlist_new(a, 4, JL_LIST);
	size_t b = 0, i = 0;
	int rc;

	if (!l)
		return -ENOMEM;
	while (i < s.n) {
		size_t k = line_break_at(s.p + i, s.n - i), w;

		if (!k) {
			jstr_cp_at(s.p + i, s.n - i, &w);
			i += w;
			continue;
		}
		if ((rc = push_str(a, l, s.p + b, i - b + (keepends ? k : 0))))
			return rc;
		i += k;
		b = i;
	}
	if (b < s.n && (rc = push_str(a, l, s.p + b, s.n - b)))
		return rc;
	*out = l;
	return 0;
}

int jstr_escape_html(struct jarena *a, struct jstr s, struct jstr *out)
{
	char *o = jarena_alloc(a, s.n * 5 + 1);
	size_t k = 0;

	if (!o)
		return -ENOMEM;
	for (size_t i = 0; i < s.n; i++) {
		const char *r = NULL;

		switch (s.p[i]) {
		case '&': r = "&amp;"; break;
		case '<': r = "&lt;"; break;
		case '>': r = "&gt;"; break;
		case '"': r = "&#34;"; break;
		case '\'': r = "&#39;"; break;
		}
		if (r) {
			memcpy(o + k, r, strlen(r));
			k += strlen(r);
		} else {
			o[k++] = s.p[i];
		}
	}
	o[k] = 0;
	out->p = o;
	out->n = k;
	return 0;
}

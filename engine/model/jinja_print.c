/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja_print.c - values of the Jinja2 renderer printed as Python prints them:
 * str() and repr() (None, True, 1.0, 1e-05, ['a', 1], ('a',), {'k': 'v'}, dict_items([...]),
 * strings quoted and escaped as repr does), and json.dumps as transformers' tojson calls it
 * (ensure_ascii, indent, separators, sort_keys). Called for every {{ }} and by the filters.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/jinja_int.h"

static int jbuf_puts(struct jbuf *b, const char *s)
{
	return jbuf_put(b, s, strlen(s));
}

/* Python's repr(float) (shortest round trip), or JSON's spelling of the specials. */
static void float_repr(double x, char *out, int json)
{
	char buf[40], digits[24];
	int exp, nd = 0, prec;

	if (isnan(x)) {
		strcpy(out, json ? "NaN" : "nan");
		return;
	}
	if (isinf(x)) {
		strcpy(out, x < 0 ? (json ? "-Infinity" : "-inf") : (json ? "Infinity" : "inf"));
		return;
	}
	for (prec = 1; prec <= 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*e", prec - 1, x);
		if (strtod(buf, NULL) == x)
			break;
	}
	{
		const char *p = buf + (buf[0] == '-');
		char *e = strchr(buf, 'e');

		for (; p < e; p++)
			if (*p != '.')
				digits[nd++] = *p;
		exp = atoi(e + 1);
	}
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	digits[nd] = 0;
	if (signbit(x))
		*out++ = '-';
	if (exp >= -5 + 1 && exp < 16) {
		int decpt = exp + 1;

		if (decpt <= 0) {
			out += sprintf(out, "0.");
			for (int i = 0; i < -decpt; i++)
				*out++ = '0';
			strcpy(out, digits);
		} else if (decpt >= nd) {
			out += sprintf(out, "%s", digits);
			for (int i = nd; i < decpt; i++)
				*out++ = '0';
			strcpy(out, ".0");
		} else {
			memcpy(out, digits, (size_t)decpt);
			out[decpt] = '.';
			strcpy(out + decpt + 1, digits + decpt);
		}
		return;
	}
	*out++ = digits[0];
	if (nd > 1) {
		*out++ = '.';
		memcpy(out, digits + 1, (size_t)nd - 1);
		out += nd - 1;
	}
	sprintf(out, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
}

static int repr_str(struct jbuf *b, struct jstr s)
{
	int q = '\'';
	int rc = 0;

	if (memchr(s.p, '\'', s.n) && !memchr(s.p, '"', s.n))
		q = '"';
	if ((rc = jbuf_put(b, (const char *)&q, 1)))
		return rc;
	for (size_t i = 0; i < s.n && !rc;) {
		size_t l;
		uint32_t c = jstr_cp_at(s.p + i, s.n - i, &l);
		char esc[16];

		if (c == (uint32_t)q || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			rc = jbuf_put(b, esc, 2);
		} else if (c == '\n') {
			rc = jbuf_puts(b, "\\n");
		} else if (c == '\r') {
			rc = jbuf_puts(b, "\\r");
		} else if (c == '\t') {
			rc = jbuf_puts(b, "\\t");
		} else if (!jstr_isprintable(c)) {
			snprintf(esc, sizeof(esc), c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" :
				 "\\U%08x", c);
			rc = jbuf_puts(b, esc);
		} else {
			rc = jbuf_put(b, s.p + i, l);
		}
		i += l;
	}
	return rc ? rc : jbuf_put(b, (const char *)&q, 1);
}

int jv_print(struct jrender *r, struct jbuf *b, struct jv v, int repr)
{
	char num[48];
	int rc = 0;

	if (++r->steps > r->max_steps)
		return jv_fail(r, 0, "the template runs too long");
	switch (v.t) {
	case JV_UNDEF: return repr ? jbuf_puts(b, "Undefined") : 0;
	case JV_NONE: return jbuf_puts(b, "None");
	case JV_BOOL: return jbuf_puts(b, v.i ? "True" : "False");
	case JV_INT:
		snprintf(num, sizeof(num), "%lld", v.i);
		return jbuf_puts(b, num);
	case JV_FLOAT:
		float_repr(v.f, num, 0);
		return jbuf_puts(b, num);
	case JV_STR:
		if (!repr)
			return jbuf_put(b, v.s.p, v.s.n);
		if (v.safe && (rc = jbuf_puts(b, "Markup(")))
			return rc;
		if ((rc = repr_str(b, v.s)))
			return rc;
		return v.safe ? jbuf_puts(b, ")") : 0;
	case JV_LIST: case JV_TUPLE: {
		static const char *const open[] = { "[", "dict_items([", "dict_keys([",
						    "dict_values([" };
		int tuple = v.t == JV_TUPLE;

		if (v.l->kind == JL_GEN)
			return jv_fail(r, 0, "cannot print a generator (add |list)");
		if (v.l->kind == JL_RANGE) {
			if (v.l->rs == 1)
				snprintf(num, sizeof(num), "range(%lld, %lld)", v.l->r0, v.l->r1);
			else
				snprintf(num, sizeof(num), "range(%lld, %lld, %lld)", v.l->r0,
					 v.l->r1, v.l->rs);
			return jbuf_puts(b, num);
		}
		if ((rc = jbuf_puts(b, tuple ? "(" : open[v.l->kind])))
			return rc;
		for (size_t i = 0; i < v.l->n; i++) {
			if (i && (rc = jbuf_puts(b, ", ")))
				return rc;
			if ((rc = jv_print(r, b, v.l->v[i], 1)))
				return rc;
		}
		if (tuple && v.l->n == 1 && (rc = jbuf_puts(b, ",")))
			return rc;
		return jbuf_puts(b, tuple ? ")" : v.l->kind == JL_LIST ? "]" : "])");
	}
	case JV_DICT: case JV_NS:
		if (v.t == JV_NS && (rc = jbuf_puts(b, "<Namespace ")))
			return rc;
		if ((rc = jbuf_puts(b, "{")))
			return rc;
		for (size_t i = 0; i < v.d->n; i++) {
			if ((i && (rc = jbuf_puts(b, ", "))) ||
			    (rc = jv_print(r, b, v.d->k[i], 1)) || (rc = jbuf_puts(b, ": ")) ||
			    (rc = jv_print(r, b, v.d->v[i], 1)))
				return rc;
		}
		return jbuf_puts(b, v.t == JV_NS ? "}>" : "}");
	case JV_LOOP:
		snprintf(num, sizeof(num), "<LoopContext %zu/%zu>", v.loop->i + 1,
			 v.loop->items->n);
		return jbuf_puts(b, num);
	case JV_MACRO:
		if ((rc = jbuf_puts(b, "<Macro ")))
			return rc;
		if (v.m->def->kind == JN_MACRO)
			rc = repr_str(b, v.m->def->name);
		else
			rc = jbuf_puts(b, "'caller'");
		return rc ? rc : jbuf_puts(b, ">");
	default:
		return jv_fail(r, 0, "cannot print a %s object", jv_type_name(v));
	}
}

int jv_to_str(struct jrender *r, struct jv v, struct jstr *out)
{
	struct jbuf b = { .max = r->max_out };
	char *p;
	int rc;

	if (v.t == JV_STR) {
		*out = v.s;
		return 0;
	}
	if ((rc = jv_print(r, &b, v, 0))) {
		free(b.p);
		return rc;
	}
	p = jarena_alloc(r->a, b.n + 1);
	if (!p) {
		free(b.p);
		return -ENOMEM;
	}
	if (b.n)
		memcpy(p, b.p, b.n);
	p[b.n] = 0;
	free(b.p);
	out->p = p;
	out->n = b.n;
	return 0;
}

static int json_str(struct jbuf *b, struct jstr s, int ascii)
{
	int rc = jbuf_puts(b, "\"");
	size_t from = 0;

	for (size_t i = 0; i < s.n && !rc; i++) {
		unsigned char c = (unsigned char)s.p[i];
		char esc[16];

		if (c >= 0x80 && ascii) {
			size_t l;
			uint32_t cp = jstr_cp_at(s.p + i, s.n - i, &l);

			if ((rc = jbuf_put(b, s.p + from, i - from)))
				return rc;
			if (cp >= 0x10000)
				snprintf(esc, sizeof(esc), "\\u%04x\\u%04x",
					 0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff));
			else
				snprintf(esc, sizeof(esc), "\\u%04x", cp);
			if ((rc = jbuf_puts(b, esc)))
				return rc;
			i += l - 1;
			from = i + 1;
			continue;
		}
		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		if ((rc = jbuf_put(b, s.p + from, i - from)))
			return rc;
		from = i + 1;
		switch (c) {
		case '"': rc = jbuf_puts(b, "\\\""); break;
		case '\\': rc = jbuf_puts(b, "\\\\"); break;
		case '\n': rc = jbuf_puts(b, "\\n"); break;
		case '\r': rc = jbuf_puts(b, "\\r"); break;
		case '\t': rc = jbuf_puts(b, "\\t"); break;
		case '\b': rc = jbuf_puts(b, "\\b"); break;
		case '\f': rc = jbuf_puts(b, "\\f"); break;
		default:
			snprintf(esc, sizeof(esc), "\\u%04x", c);
			rc = jbuf_puts(b, esc);
		}
	}
	if (!rc)
		rc = jbuf_put(b, s.p + from, s.n - from);
	return rc ? rc : jbuf_puts(b, "\"");
}

static int json_newline(struct jbuf *b, struct jv indent, int level)
{
	int rc = jbuf_puts(b, "\n");

	for (int i = 0; i < level && !rc; i++) {
		if (indent.t == JV_STR) {
			rc = jbuf_put(b, indent.s.p, indent.s.n);
		} else {
			for (long long k = 0; k < indent.i && !rc; k++)
				rc = jbuf_puts(b, " ");
		}
	}
	return rc;
}

/* A dict key as json.dumps converts it. */
static int json_key(struct jrender *r, struct jv k, struct jstr *out)
{
	char num[48];
	char *p;

	switch (k.t) {
	case JV_STR: *out = k.s; return 0;
	case JV_NONE: *out = jv_cstr("null").s; return 0;
	case JV_BOOL: *out = jv_cstr(k.i ? "true" : "false").s; return 0;
	case JV_INT: snprintf(num, sizeof(num), "%lld", k.i); break;
	case JV_FLOAT: float_repr(k.f, num, 1); break;
	default:
		return jv_fail(r, 0, "keys must be str, int, float, bool or None, not %s",
			       jv_type_name(k));
	}
	p = jarena_alloc(r->a, strlen(num) + 1);
	if (!p)
		return -ENOMEM;
	strcpy(p, num);
	*out = jv_cstr(p).s;
	return 0;
}

int jv_tojson(struct jrender *r, struct jbuf *b, struct jv v, struct jv indent,
	      struct jstr item_sep, struct jstr key_sep, int sort_keys, int level)
{
	char num[48];
	int rc = 0, ind = indent.t != JV_NONE;

	if (++r->steps > r->max_steps)
		return jv_fail(r, 0, "the template runs too long");
	if (level > 500)
		return jv_fail(r, 0, "tojson: the value is nested too deeply");
	switch (v.t) {
	case JV_NONE: return jbuf_puts(b, "null");
	case JV_BOOL: return jbuf_puts(b, v.i ? "true" : "false");
	case JV_INT:
		snprintf(num, sizeof(num), "%lld", v.i);
		return jbuf_puts(b, num);
	case JV_FLOAT:
		float_repr(v.f, num, 1);
		return jbuf_puts(b, num);
	case JV_STR: return json_str(b, v.s, r->json_ascii);
	case JV_LIST: case JV_TUPLE:
		if (v.l->kind != JL_LIST)
			break;
		if (!v.l->n)
			return jbuf_puts(b, "[]");
		if ((rc = jbuf_puts(b, "[")))
			return rc;
		for (size_t i = 0; i < v.l->n; i++) {
			if (i && (rc = jbuf_put(b, item_sep.p, item_sep.n)))
				return rc;
			if (ind && (rc = json_newline(b, indent, level + 1)))
				return rc;
			if ((rc = jv_tojson(r, b, v.l->v[i], indent, item_sep, key_sep, sort_keys,
					    level + 1)))
				return rc;
		}
		if (ind && (rc = json_newline(b, indent, level)))
			return rc;
		return jbuf_puts(b, "]");
	case JV_DICT: {
		size_t n = v.d->n, *order;
		struct jstr *keys;

		if (!n)
			return jbuf_puts(b, "{}");
		keys = jarena_alloc(r->a, n * sizeof(*keys));
		order = jarena_alloc(r->a, n * sizeof(*order));
		if (!keys || !order)
			return -ENOMEM;
		for (size_t i = 0; i < n; i++) {
			if (sort_keys && v.d->k[i].t != JV_STR)
				return jv_fail(r, 0, "tojson: sort_keys needs string keys");
			if ((rc = json_key(r, v.d->k[i], &keys[i])))
				return rc;
			order[i] = i;
		}
		if (sort_keys) /* insertion sort: stable, and dicts are small */
			for (size_t i = 1; i < n; i++)
				for (size_t j = i; j > 0; j--) {
					struct jv x = jv_str(keys[order[j - 1]].p, keys[order[j - 1]].n);
					struct jv y = jv_str(keys[order[j]].p, keys[order[j]].n);
					size_t t;

					if (jv_cmp(x, y) <= 0)
						break;
					t = order[j];
					order[j] = order[j - 1];
					order[j - 1] = t;
				}
		if ((rc = jbuf_puts(b, "{")))
			return rc;
		for (size_t k = 0; k < n; k++) {
			size_t i = order[k];

			if (k && (rc = jbuf_put(b, item_sep.p, item_sep.n)))
				return rc;
			if ((ind && (rc = json_newline(b, indent, level + 1))) ||
			    (rc = json_str(b, keys[i], r->json_ascii)) ||
			    (rc = jbuf_put(b, key_sep.p, key_sep.n)) ||
			    (rc = jv_tojson(r, b, v.d->v[i], indent, item_sep, key_sep, sort_keys,
					    level + 1)))
				return rc;
		}
		if (ind && (rc = json_newline(b, indent, level)))
			return rc;
		return jbuf_puts(b, "}");
	}
	default:
		break;
	}
	return jv_fail(r, 0, "Object of type %s is not JSON serializable", jv_type_name(v));
}


/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja_methods.c - the methods templates call on values, as Python has them:
 * str (strip, split, startswith, replace, find, join, format, ...), dict (items, keys,
 * values, get), list and tuple (index, count, pop, clear), the loop (cycle, changed) and
 * cycler objects. ImmutableSandboxedEnvironment refuses the methods that modify lists and
 * dicts (append, update, ...); so does this file, with the sandbox's message. A method Python
 * has but this file does not fails when called, never silently. Called by jinja_expr.c.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/jinja_int.h"

enum jmeth {
	/* str */
	M_CAPITALIZE, M_COUNT, M_ENDSWITH, M_FIND, M_FORMAT, M_INDEX, M_ISALPHA, M_ISDIGIT,
	M_ISLOWER, M_ISSPACE, M_ISUPPER, M_JOIN, M_LOWER, M_LSTRIP, M_REMOVEPREFIX,
	M_REMOVESUFFIX, M_REPLACE, M_RFIND, M_RSPLIT, M_RSTRIP, M_SPLIT, M_SPLITLINES,
	M_STARTSWITH, M_STRIP, M_TITLE, M_UPPER, M_STR_OTHER,
	/* dict */
	M_ITEMS, M_KEYS, M_VALUES, M_GET, M_COPY,
	/* list, tuple */
	M_L_COUNT, M_L_INDEX, M_L_POP, M_L_CLEAR, M_L_COPY,
	/* loop, cycler */
	M_CYCLE, M_CHANGED, M_NEXT, M_RESET,
};

static const char *const str_methods[] = {
	"capitalize", "count", "endswith", "find", "format", "index", "isalpha", "isdigit",
	"islower", "isspace", "isupper", "join", "lower", "lstrip", "removeprefix",
	"removesuffix", "replace", "rfind", "rsplit", "rstrip", "split", "splitlines",
	"startswith", "strip", "title", "upper", NULL,
};
static const char *const str_other[] = {
	"casefold", "center", "encode", "expandtabs", "format_map", "isalnum", "isascii",
	"isdecimal", "isidentifier", "isnumeric", "isprintable", "istitle", "ljust", "maketrans",
	"partition", "rindex", "rjust", "rpartition", "swapcase", "translate", "zfill", NULL,
};
static const char *const dict_unsafe[] = { "clear", "pop", "popitem", "setdefault", "update",
					   NULL };
static const char *const list_unsafe[] = { "append", "reverse", "insert", "sort", "extend",
					   "remove", NULL };

static int lookup(const char *const *names, struct jstr n)
{
	for (int i = 0; names[i]; i++)
		if (strlen(names[i]) == n.n && !memcmp(names[i], n.p, n.n))
			return i;
	return -1;
}

static int is(struct jstr n, const char *s)
{
	return strlen(s) == n.n && !memcmp(s, n.p, n.n);
}

static int method(struct jarena *a, struct jv obj, int id, struct jv *out)
{
	struct jmethod *m = jarena_alloc(a, sizeof(*m));

	if (!m) {
		*out = jv_undef();
		return 1;
	}
	m->self = obj;
	m->id = id;
	*out = (struct jv){ .t = JV_METHOD, .meth = m };
	return 1;
}

static int unsafe(struct jarena *a, struct jv obj, struct jstr name, struct jv *out)
{
	char *msg = jarena_alloc(a, name.n + 80);

	if (msg)
		snprintf(msg, name.n + 80, "access to attribute '%.*s' of '%s' object is unsafe.",
			 (int)name.n, name.p, jv_type_name(obj));
	*out = jv_undef_hint(a, msg ? msg : "access to an attribute is unsafe.", 1);
	return 1;
}

int jinja_method_find(struct jarena *a, struct jv obj, struct jstr name, struct jv *out)
{
	int k;

	switch (obj.t) {
	case JV_STR:
		if ((k = lookup(str_methods, name)) >= 0)
			return method(a, obj, k, out);
		if (lookup(str_other, name) >= 0)
			return method(a, obj, M_STR_OTHER, out);
		return 0;
	case JV_DICT:
		if (is(name, "items")) return method(a, obj, M_ITEMS, out);
		if (is(name, "keys")) return method(a, obj, M_KEYS, out);
		if (is(name, "values")) return method(a, obj, M_VALUES, out);
		if (is(name, "get")) return method(a, obj, M_GET, out);
		if (is(name, "copy")) return method(a, obj, M_COPY, out);
		if (is(name, "fromkeys")) return method(a, obj, M_STR_OTHER, out);
		if (lookup(dict_unsafe, name) >= 0)
			return unsafe(a, obj, name, out);
		return 0;
	case JV_LIST: case JV_TUPLE:
		if (obj.l->kind != JL_LIST && obj.l->kind != JL_RANGE)
			return 0;
		if (is(name, "count")) return method(a, obj, M_L_COUNT, out);
		if (is(name, "index")) return method(a, obj, M_L_INDEX, out);
		if (obj.t == JV_TUPLE || obj.l->kind != JL_LIST)
			return 0;
		if (is(name, "pop")) return method(a, obj, M_L_POP, out);
		if (is(name, "clear")) return method(a, obj, M_L_CLEAR, out);
		if (is(name, "copy")) return method(a, obj, M_L_COPY, out);
		if (lookup(list_unsafe, name) >= 0)
			return unsafe(a, obj, name, out);
		return 0;
	case JV_LOOP:
		if (is(name, "cycle")) return method(a, obj, M_CYCLE, out);
		if (is(name, "changed")) return method(a, obj, M_CHANGED, out);
		return 0;
	case JV_CYCLER:
		if (!obj.cy->items)
			return 0;
		if (is(name, "next")) return method(a, obj, M_NEXT, out);
		if (is(name, "reset")) return method(a, obj, M_RESET, out);
		if (is(name, "current")) {
			*out = obj.cy->items->v[obj.cy->pos];
			return 1;
		}
		return 0;
	default:
		return 0;
	}
}

/* An optional [start[, end]] pair of code point indexes: s cut to it. */
static int cut(struct jrender *r, int line, struct jstr s, struct jv *args, size_t nargs,
	       size_t at, struct jstr *out, long long *base)
{
	long long b, e, *pb = NULL, *pe = NULL, first;
	size_t cps = jstr_cplen(s);

	*out = s;
	*base = 0;
	if (nargs <= at)
		return 0;
	for (size_t i = at; i < nargs && i < at + 2; i++)
		if (args[i].t != JV_INT && args[i].t != JV_BOOL && args[i].t != JV_NONE)
			return jv_fail(r, line, "slice indices must be integers or None");
	if (args[at].t != JV_NONE) {
		b = args[at].i;
		pb = &b;
	}
	if (nargs > at + 1 && args[at + 1].t != JV_NONE) {
		e = args[at + 1].i;
		pe = &e;
	}
	jslice((long long)cps, pb, pe, 1, &first);
	*base = first;
	return jstr_slice(r->a, s, pb, pe, 1, out);
}

/* The code point index of byte offset off in s. */
static long long cp_index(struct jstr s, long long off)
{
	return off < 0 ? -1 : (long long)jstr_cplen((struct jstr){ s.p, (size_t)off });
}

static int affix(struct jrender *r, int line, struct jstr s, struct jv pre, int end, int *out)
{
	if (pre.t == JV_TUPLE) {
		*out = 0;
		for (size_t i = 0; i < pre.l->n && !*out; i++) {
			int rc = affix(r, line, s, pre.l->v[i], end, out);

			if (rc)
				return rc;
		}
		return 0;
	}
	if (pre.t != JV_STR)
		return jv_fail(r, line, "%s first arg must be str or a tuple of str, not %s",
			       end ? "endswith" : "startswith", jv_type_name(pre));
	*out = pre.s.n <= s.n && !memcmp(end ? s.p + s.n - pre.s.n : s.p, pre.s.p, pre.s.n);
	return 0;
}

/* str.format with {}, {0}, {name}, {{ and }}; no conversions or format specs. */
static int str_format(struct jrender *r, int line, struct jstr f, struct jv *args, size_t nargs,
		      const struct jstr *kwn, struct jv *kwv, size_t nkw, struct jv *out)
{
	struct jbuf b = { .max = r->max_out };
	size_t auto_i = 0;
	char *p;
	int rc = 0;

	for (size_t i = 0; i < f.n && !rc; i++) {
		char c = f.p[i];
		size_t j;
		struct jv v;

		if ((c == '{' || c == '}') && i + 1 < f.n && f.p[i + 1] == c) {
			rc = jbuf_put(&b, &c, 1);
			i++;
			continue;
		}
		if (c == '}') {
			rc = jv_fail(r, line, "Single '}' encountered in format string");
			break;
		}
		if (c != '{') {
			rc = jbuf_put(&b, &c, 1);
			continue;
		}
		for (j = i + 1; j < f.n && f.p[j] != '}'; j++)
			if (f.p[j] == ':' || f.p[j] == '!' || f.p[j] == '.' || f.p[j] == '[' ||
			    f.p[j] == '{')
				break;
		if (j >= f.n || f.p[j] != '}') {
			rc = jv_fail(r, line, "str.format: only {}, {N} and {name} are supported");
			break;
		}
		if (j == i + 1) {
			if (auto_i >= nargs) {
				rc = jv_fail(r, line, "Replacement index %zu out of range for "
					     "positional args tuple", auto_i);
				break;
			}
			v = args[auto_i++];
		} else if (f.p[i + 1] >= '0' && f.p[i + 1] <= '9') {
			size_t k = 0;

			for (size_t q = i + 1; q < j; q++)
				k = k * 10 + (size_t)(f.p[q] - '0');
			if (k >= nargs) {
				rc = jv_fail(r, line, "Replacement index %zu out of range for "
					     "positional args tuple", k);
				break;
			}
			v = args[k];
		} else {
			size_t k;

			for (k = 0; k < nkw; k++)
				if (kwn[k].n == j - i - 1 && !memcmp(kwn[k].p, f.p + i + 1, kwn[k].n))
					break;
			if (k == nkw) {
				rc = jv_fail(r, line, "'%.*s'", (int)(j - i - 1), f.p + i + 1);
				break;
			}
			v = kwv[k];
		}
		rc = jv_print(r, &b, v, 0);
		i = j;
	}
	if (!rc) {
		p = jarena_alloc(r->a, b.n + 1);
		if (!p)
			rc = -ENOMEM;
		else {
			if (b.n)
				memcpy(p, b.p, b.n);
			*out = jv_str(p, b.n);
		}
	}
	free(b.p);
	return rc;
}

static int str_pred(struct jrender *r, struct jstr s, int id, struct jv *out)
{
	int all = s.n > 0, rc, c;
	struct jv t;

	if (id == M_ISLOWER || id == M_ISUPPER)
		return (rc = jinja_test_by_name(r, r->line, jv_cstr(id == M_ISLOWER ? "lower" :
							"upper"), jv_str(s.p, s.n), NULL, 0, &c)) ? rc :
			(*out = jv_bool(c), 0);
	for (size_t i = 0; i < s.n && all;) {
		size_t l;
		uint32_t cp = jstr_cp_at(s.p + i, s.n - i, &l);

		if (id == M_ISSPACE)
			all = jstr_isspace_at(s.p + i, s.n - i, &l);
		else if (id == M_ISDIGIT)
			all = cp >= '0' && cp <= '9';
		else
			all = jstr_isword(cp) && cp != '_' && !(cp >= '0' && cp <= '9');
		i += l;
	}
	(void)t;
	*out = jv_bool(all);
	return 0;
}

static int str_method(struct jrender *r, int line, struct jstr s, int id, struct jv *args,
		      size_t nargs, const struct jstr *kwn, struct jv *kwv, size_t nkw,
		      struct jv *out)
{
	static const char *const p_split[] = { "sep", "maxsplit", NULL };
	static const char *const p_lines[] = { "keepends", NULL };
	struct jstr t, cs;
	struct jlist *l;
	struct jv b[3];
	long long base;
	int rc, res;

	if (nkw && id != M_SPLIT && id != M_RSPLIT && id != M_SPLITLINES && id != M_FORMAT)
		return jv_fail(r, line, "str.%s() takes no keyword arguments", str_methods[id]);
	switch (id) {
	case M_SPLIT: case M_RSPLIT:
		if ((rc = jinja_bind(r, line, str_methods[id], p_split, args, nargs, kwn, kwv, nkw, b)))
			return rc;
		if (b[0].t != JV_MISSING && b[0].t != JV_NONE && b[0].t != JV_STR)
			return jv_fail(r, line, "must be str or None, not %s", jv_type_name(b[0]));
		if (b[0].t == JV_STR && !b[0].s.n)
			return jv_fail(r, line, "empty separator");
		if (b[1].t != JV_MISSING && b[1].t != JV_INT && b[1].t != JV_BOOL)
			return jv_fail(r, line, "'%s' object cannot be interpreted as an integer",
				       jv_type_name(b[1]));
		if ((rc = jstr_split(r->a, s, b[0].t == JV_STR ? &b[0].s : NULL,
				     b[1].t == JV_MISSING ? -1 : b[1].i, id == M_RSPLIT, &l)))
			return rc;
		*out = jv_list(l, 0);
		return 0;
	case M_SPLITLINES:
		if ((rc = jinja_bind(r, line, "splitlines", p_lines, args, nargs, kwn, kwv, nkw, b)) ||
		    (rc = jstr_splitlines(r->a, s, b[0].t != JV_MISSING && jv_truthy(b[0]), &l)))
			return rc;
		*out = jv_list(l, 0);
		return 0;
	case M_FORMAT:
		return str_format(r, line, s, args, nargs, kwn, kwv, nkw, out);
	case M_STRIP: case M_LSTRIP: case M_RSTRIP:
		if (nargs > 1 || (nargs && args[0].t != JV_NONE && args[0].t != JV_STR))
			return jv_fail(r, line, "%s arg must be None or str", str_methods[id]);
		jstr_strip(r->a, s, nargs && args[0].t == JV_STR ? &args[0].s : NULL,
			   id != M_RSTRIP, id != M_LSTRIP, &t);
		*out = jv_str(t.p, t.n);
		return 0;
	case M_LOWER: case M_UPPER: case M_TITLE: case M_CAPITALIZE:
		if (nargs)
			return jv_fail(r, line, "str.%s() takes no arguments", str_methods[id]);
		if ((rc = jstr_case(r->a, s, id == M_LOWER ? JCASE_LOWER : id == M_UPPER ?
				    JCASE_UPPER : id == M_TITLE ? JCASE_TITLE : JCASE_CAPITALIZE, &t)))
			return rc;
		*out = jv_str(t.p, t.n);
		return 0;
	case M_ISALPHA: case M_ISDIGIT: case M_ISLOWER: case M_ISSPACE: case M_ISUPPER:
		if (nargs)
			return jv_fail(r, line, "str.%s() takes no arguments", str_methods[id]);
		return str_pred(r, s, id, out);
	case M_STARTSWITH: case M_ENDSWITH:
		if (nargs < 1 || nargs > 3)
			return jv_fail(r, line, "%s() takes 1 to 3 arguments", str_methods[id]);
		if ((rc = cut(r, line, s, args, nargs, 1, &cs, &base)) ||
		    (rc = affix(r, line, cs, args[0], id == M_ENDSWITH, &res)))
			return rc;
		*out = jv_bool(res);
		return 0;
	case M_FIND: case M_RFIND: case M_INDEX: case M_COUNT: {
		long long f = -1, n = 0;

		if (nargs < 1 || nargs > 3 || args[0].t != JV_STR)
			return jv_fail(r, line, "%s() takes a str and an optional start and end",
				       str_methods[id]);
		if ((rc = cut(r, line, s, args, nargs, 1, &cs, &base)))
			return rc;
		if (id == M_COUNT) {
			if (!args[0].s.n) {
				*out = jv_int((long long)jstr_cplen(cs) + 1);
				return 0;
			}
			for (long long k = jstr_find(cs, args[0].s, 0); k >= 0;
			     k = jstr_find(cs, args[0].s, (size_t)k + args[0].s.n))
				n++;
			*out = jv_int(n);
			return 0;
		}
		if (id == M_RFIND) {
			for (long long k = jstr_find(cs, args[0].s, 0); k >= 0;
			     k = k < (long long)cs.n ? jstr_find(cs, args[0].s, (size_t)k + 1) : -1)
				f = k;
		} else {
			f = jstr_find(cs, args[0].s, 0);
		}
		if (f < 0 && id == M_INDEX)
			return jv_fail(r, line, "substring not found");
		*out = jv_int(f < 0 ? -1 : base + cp_index(cs, f));
		return 0;
	}
	case M_REPLACE:
		if (nargs < 2 || nargs > 3 || args[0].t != JV_STR || args[1].t != JV_STR ||
		    (nargs == 3 && args[2].t != JV_INT))
			return jv_fail(r, line, "replace() takes two str and an optional count");
		if ((rc = jstr_replace(r->a, s, args[0].s, args[1].s, nargs == 3 ? args[2].i : -1, &t)))
			return rc;
		*out = jv_str(t.p, t.n);
		return 0;
	case M_REMOVEPREFIX: case M_REMOVESUFFIX:
		if (nargs != 1 || args[0].t != JV_STR)
			return jv_fail(r, line, "%s() takes one str", str_methods[id]);
		if ((rc = affix(r, line, s, args[0], id == M_REMOVESUFFIX, &res)))
			return rc;
		*out = jv_str(s.p + (res && id == M_REMOVEPREFIX ? args[0].s.n : 0),
			      s.n - (res ? args[0].s.n : 0));
		return 0;
	case M_JOIN: {
		struct jbuf o = { .max = r->max_out };
		char *p;

		if (nargs != 1)
			return jv_fail(r, line, "join() takes exactly one argument");
		if ((rc = jv_iterate(r, args[0], &l)))
			return rc;
		for (size_t i = 0; i < l->n; i++) {
			if (l->v[i].t != JV_STR) {
				free(o.p);
				return jv_fail(r, line, "sequence item %zu: expected str instance, %s "
					       "found", i, jv_type_name(l->v[i]));
			}
			if ((i && (rc = jbuf_put(&o, s.p, s.n))) ||
			    (rc = jbuf_put(&o, l->v[i].s.p, l->v[i].s.n))) {
				free(o.p);
				return rc;
			}
		}
		p = jarena_alloc(r->a, o.n + 1);
		if (p && o.n)
			memcpy(p, o.p, o.n);
		free(o.p);
		if (!p)
			return -ENOMEM;
		*out = jv_str(p, o.n);
		return 0;
	}
	}
	return jv_fail(r, line, "this str method is not supported");
}

int jinja_method_call(struct jrender *r, int line, struct jmethod *m, struct jv *args,
		      size_t nargs, const struct jstr *kwn, struct jv *kwv, size_t nkw,
		      struct jv *out)
{
	struct jv self = m->self;
	int rc;

	if (m->id < M_STR_OTHER)
		return str_method(r, line, self.s, m->id, args, nargs, kwn, kwv, nkw, out);
	if (m->id == M_STR_OTHER)
		return jv_fail(r, line, "this %s method is not supported", jv_type_name(self));
	if (nkw)
		return jv_fail(r, line, "%s methods take no keyword arguments", jv_type_name(self));
	switch (m->id) {
	case M_ITEMS: case M_KEYS: case M_VALUES: case M_COPY: {
		struct jlist *l = jlist_new(r->a, self.d->n, m->id == M_ITEMS ? JL_ITEMS :
					    m->id == M_KEYS ? JL_KEYS : JL_VALUES);
		struct jdict *d;

		if (nargs)
			return jv_fail(r, line, "dict methods items, keys, values and copy take no "
				       "arguments");
		if (m->id == M_COPY) {
			if (!(d = jdict_new(r->a)))
				return -ENOMEM;
			for (size_t i = 0; i < self.d->n; i++)
				if ((rc = jdict_set(r->a, d, self.d->k[i], self.d->v[i])))
					return rc;
			*out = (struct jv){ .t = JV_DICT, .d = d };
			return 0;
		}
		if (!l)
			return -ENOMEM;
		for (size_t i = 0; i < self.d->n; i++) {
			if (m->id == M_ITEMS) {
				struct jlist *pair = jlist_new(r->a, 2, JL_LIST);

				if (!pair)
					return -ENOMEM;
				pair->v[0] = self.d->k[i];
				pair->v[1] = self.d->v[i];
				pair->n = 2;
				l->v[l->n++] = jv_list(pair, 1);
			} else {
				l->v[l->n++] = m->id == M_KEYS ? self.d->k[i] : self.d->v[i];
			}
		}
		*out = jv_list(l, 0);
		return 0;
	}
	case M_GET: {
		struct jv *v;

		if (nargs < 1 || nargs > 2)
			return jv_fail(r, line, "get expected 1 or 2 arguments, got %zu", nargs);
		v = jdict_get(self.d, args[0]);
		*out = v ? *v : nargs == 2 ? args[1] : jv_none();
		return 0;
	}
	case M_L_COUNT: case M_L_INDEX: {
		long long n = 0, at = -1;

		if (nargs != 1)
			return jv_fail(r, line, "%s() takes exactly one argument",
				       m->id == M_L_COUNT ? "count" : "index");
		for (size_t i = 0; i < self.l->n; i++)
			if (jv_equal(self.l->v[i], args[0])) {
				n++;
				if (at < 0)
					at = (long long)i;
			}
		if (m->id == M_L_INDEX && at < 0)
			return jv_fail(r, line, "%s.index(x): x not in %s", jv_type_name(self),
				       jv_type_name(self));
		*out = jv_int(m->id == M_L_COUNT ? n : at);
		return 0;
	}
	case M_L_POP: {
		long long i = nargs ? args[0].i : -1;

		if (nargs > 1 || (nargs && args[0].t != JV_INT && args[0].t != JV_BOOL))
			return jv_fail(r, line, "pop() takes an optional integer index");
		if (!self.l->n)
			return jv_fail(r, line, "pop from empty list");
		if (i < 0)
			i += (long long)self.l->n;
		if (i < 0 || i >= (long long)self.l->n)
			return jv_fail(r, line, "pop index out of range");
		*out = self.l->v[i];
		memmove(self.l->v + i, self.l->v + i + 1,
			(self.l->n - (size_t)i - 1) * sizeof(*self.l->v));
		self.l->n--;
		return 0;
	}
	case M_L_CLEAR:
		self.l->n = 0;
		*out = jv_none();
		return 0;
	case M_L_COPY: {
		struct jlist *l = jlist_new(r->a, self.l->n, JL_LIST);

		if (!l)
			return -ENOMEM;
		if (self.l->n)
			memcpy(l->v, self.l->v, self.l->n * sizeof(*l->v));
		l->n = self.l->n;
		*out = jv_list(l, 0);
		return 0;
	}
	case M_CYCLE:
		if (!nargs)
			return jv_fail(r, line, "no items for cycling given");
		*out = args[self.loop->i % nargs];
		return 0;
	case M_CHANGED: {
		struct jlist *l = jlist_new(r->a, nargs, JL_LIST);
		struct jv now;

		if (!l)
			return -ENOMEM;
		for (size_t i = 0; i < nargs; i++)
			l->v[l->n++] = args[i];
		now = jv_list(l, 0);
		if (self.loop->changed_set && jv_equal(self.loop->changed.v[0], now)) {
			*out = jv_bool(0);
			return 0;
		}
		self.loop->changed.n = 0;
		if ((rc = jdict_set(r->a, &self.loop->changed, jv_int(0), now)))
			return rc;
		self.loop->changed_set = 1;
		*out = jv_bool(1);
		return 0;
	}
	case M_NEXT:
		*out = self.cy->items->v[self.cy->pos];
		self.cy->pos = (self.cy->pos + 1) % self.cy->items->n;
		return 0;
	case M_RESET:
		self.cy->pos = 0;
		*out = jv_none();
		return 0;
	}
	return jv_fail(r, line, "unknown method");
}

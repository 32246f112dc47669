/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja_value.c - the values of the Jinja2 renderer as Python has them: the
 * arena they live in, lists and insertion-ordered dicts, conversion from jansson, truth,
 * equality and order, len() and iteration, and the messages of Jinja2's Undefined (printing
 * is in jinja_print.c). Every other file of the renderer calls it.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/jinja_int.h"

struct jchunk {
	struct jchunk *next;
	size_t used, size;
	max_align_t data[];
};

void *jarena_alloc(struct jarena *a, size_t n)
{
	struct jchunk *c = a->head;

	n = (n + 15) & ~(size_t)15;
	if (!n)
		n = 16;
	if (!c || c->size - c->used < n) {
		size_t size = n > 65536 ? n : 65536;

		if (a->used + size > a->cap || size > a->cap) {
			a->over = 1;
			return NULL;
		}
		c = malloc(sizeof(*c) + size);
		if (!c)
			return NULL;
		c->used = 0;
		c->size = size;
		c->next = a->head;
		a->head = c;
		a->used += size;
	}
	c->used += n;
	return (char *)c->data + c->used - n;
}

void jarena_free(struct jarena *a)
{
	while (a->head) {
		struct jchunk *c = a->head;

		a->head = c->next;
		free(c);
	}
	a->used = 0;
}

struct jv jv_undef(void) { return (struct jv){ .t = JV_UNDEF }; }
struct jv jv_none(void) { return (struct jv){ .t = JV_NONE }; }
struct jv jv_bool(int b) { return (struct jv){ .t = JV_BOOL, .i = !!b }; }
struct jv jv_int(long long i) { return (struct jv){ .t = JV_INT, .i = i }; }
struct jv jv_float(double f) { return (struct jv){ .t = JV_FLOAT, .f = f }; }
struct jv jv_str(const char *p, size_t n) { return (struct jv){ .t = JV_STR, .s = { p, n } }; }
struct jv jv_cstr(const char *s) { return jv_str(s, strlen(s)); }

struct jlist *jlist_new(struct jarena *a, size_t cap, int kind)
{
	struct jlist *l = jarena_alloc(a, sizeof(*l));

	if (!l)
		return NULL;
	memset(l, 0, sizeof(*l));
	l->kind = (uint8_t)kind;
	if (cap) {
		l->v = jarena_alloc(a, cap * sizeof(*l->v));
		if (!l->v)
			return NULL;
		l->cap = cap;
	}
	return l;
}

int jlist_push(struct jarena *a, struct jlist *l, struct jv v)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 4;
		struct jv *nv = jarena_alloc(a, cap * sizeof(*nv));

		if (!nv)
			return -ENOMEM;
		if (l->n)
			memcpy(nv, l->v, l->n * sizeof(*nv));
		l->v = nv;
		l->cap = cap;
	}
	l->v[l->n++] = v;
	return 0;
}

struct jv jv_list(struct jlist *l, int tuple)
{
	return (struct jv){ .t = (uint8_t)(tuple ? JV_TUPLE : JV_LIST), .l = l };
}

struct jdict *jdict_new(struct jarena *a)
{
	struct jdict *d = jarena_alloc(a, sizeof(*d));

	if (d)
		memset(d, 0, sizeof(*d));
	return d;
}

struct jv *jdict_get(const struct jdict *d, struct jv k)
{
	for (size_t i = 0; i < d->n; i++)
		if (jv_equal(d->k[i], k))
			return &d->v[i];
	return NULL;
}

struct jv *jdict_gets(const struct jdict *d, const char *p, size_t n)
{
	for (size_t i = 0; i < d->n; i++)
		if (d->k[i].t == JV_STR && d->k[i].s.n == n && !memcmp(d->k[i].s.p, p, n))
			return &d->v[i];
	return NULL;
}

int jdict_set(struct jarena *a, struct jdict *d, struct jv k, struct jv v)
{
	struct jv *old = jdict_get(d, k);

	if (old) {
		*old = v;
		return 0;
	}
	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 4;
		struct jv *nk = jarena_alloc(a, cap * sizeof(*nk)), *nv;

		nv = nk ? jarena_alloc(a, cap * sizeof(*nv)) : NULL;
		if (!nv)
			return -ENOMEM;
		if (d->n) {
			memcpy(nk, d->k, d->n * sizeof(*nk));
			memcpy(nv, d->v, d->n * sizeof(*nv));
		}
		d->k = nk;
		d->v = nv;
		d->cap = cap;
	}
	d->k[d->n] = k;
	d->v[d->n++] = v;
	return 0;
}

int jv_from_json(struct jarena *a, json_t *j, struct jv *out, int depth)
{
	int rc;

	if (depth > 512)
		return -E2BIG;
	switch (json_typeof(j)) {
	case JSON_NULL: *out = jv_none(); return 0;
	case JSON_TRUE: *out = jv_bool(1); return 0;
	case JSON_FALSE: *out = jv_bool(0); return 0;
	case JSON_INTEGER: *out = jv_int(json_integer_value(j)); return 0;
	case JSON_REAL: *out = jv_float(json_real_value(j)); return 0;
	case JSON_STRING:
		*out = jv_str(json_string_value(j), json_string_length(j));
		return 0;
	case JSON_ARRAY: {
		struct jlist *l = jlist_new(a, json_array_size(j), JL_LIST);

		if (!l)
			return -ENOMEM;
		for (size_t i = 0; i < json_array_size(j); i++)
			if ((rc = jv_from_json(a, json_array_get(j, i), &l->v[l->n++], depth + 1)))
				return rc;
		*out = jv_list(l, 0);
		return 0;
	}
	case JSON_OBJECT: {
		struct jdict *d = jdict_new(a);
		const char *k;
		json_t *v;

		if (!d)
			return -ENOMEM;
		json_object_foreach(j, k, v) {
			struct jv x;

			if ((rc = jv_from_json(a, v, &x, depth + 1)) ||
			    (rc = jdict_set(a, d, jv_cstr(k), x)))
				return rc;
		}
		*out = (struct jv){ .t = JV_DICT, .d = d };
		return 0;
	}
	}
	return -EINVAL;
}

int jv_truthy(struct jv v)
{
	switch (v.t) {
	case JV_UNDEF: case JV_NONE: return 0;
	case JV_BOOL: case JV_INT: return v.i != 0;
	case JV_FLOAT: return v.f != 0;
	case JV_STR: return v.s.n != 0;
	case JV_LIST: case JV_TUPLE: return v.l->kind == JL_GEN || v.l->n != 0;
	case JV_DICT: return v.d->n != 0;
	default: return 1;
	}
}

int jv_is_num(struct jv v)
{
	return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT;
}

double jv_num(struct jv v)
{
	return v.t == JV_FLOAT ? v.f : (double)v.i;
}

/* -1, 0, 1 for two numbers, exact between integers and floats; 2 with a NaN. */
static int num_cmp(struct jv x, struct jv y)
{
	if (x.t != JV_FLOAT && y.t != JV_FLOAT)
		return x.i < y.i ? -1 : x.i > y.i;
	if (isnan(jv_num(x)) || isnan(jv_num(y)))
		return 2;
	if (x.t != JV_FLOAT || y.t != JV_FLOAT) {
		/* an integer against a float: compare as Python does, exactly */
		long long i = x.t == JV_FLOAT ? y.i : x.i;
		double f = x.t == JV_FLOAT ? x.f : y.f, fl = floor(f);
		int c;

		if (f >= 9.3e18)
			c = -1;
		else if (f <= -9.3e18)
			c = 1;
		else if ((long long)fl != i)
			c = i < (long long)fl ? -1 : 1;
		else
			c = fl == f ? 0 : -1;
		return x.t == JV_FLOAT ? -c : c;
	}
	return x.f < y.f ? -1 : x.f > y.f;
}

int jv_equal(struct jv x, struct jv y)
{
	if (jv_is_num(x) && jv_is_num(y))
		return num_cmp(x, y) == 0;
	if (x.t != y.t)
		return 0;
	switch (x.t) {
	case JV_UNDEF: case JV_NONE: return 1;
	case JV_STR: return x.s.n == y.s.n && !memcmp(x.s.p, y.s.p, x.s.n);
	case JV_LIST: case JV_TUPLE:
		if (x.l == y.l)
			return 1;
		if (x.l->kind != y.l->kind || x.l->kind == JL_GEN || x.l->n != y.l->n)
			return 0;
		for (size_t i = 0; i < x.l->n; i++)
			if (!jv_equal(x.l->v[i], y.l->v[i]))
				return 0;
		return 1;
	case JV_DICT:
		if (x.d->n != y.d->n)
			return 0;
		for (size_t i = 0; i < x.d->n; i++) {
			struct jv *o = jdict_get(y.d, x.d->k[i]);

			if (!o || !jv_equal(x.d->v[i], *o))
				return 0;
		}
		return 1;
	case JV_FUNC: return x.i == y.i;
	default: return x.d == y.d;
	}
}

int jv_cmp(struct jv x, struct jv y)
{
	if (jv_is_num(x) && jv_is_num(y)) {
		int c = num_cmp(x, y);

		return c == 2 ? 3 : c; /* 3: NaN, every comparison false */
	}
	if (x.t == JV_STR && y.t == JV_STR) {
		size_t n = x.s.n < y.s.n ? x.s.n : y.s.n;
		int c = memcmp(x.s.p, y.s.p, n);

		if (c)
			return c < 0 ? -1 : 1;
		return x.s.n < y.s.n ? -1 : x.s.n > y.s.n;
	}
	if ((x.t == JV_LIST || x.t == JV_TUPLE) && x.t == y.t && x.l->kind == JL_LIST &&
	    y.l->kind == JL_LIST) {
		for (size_t i = 0; i < x.l->n && i < y.l->n; i++)
			if (!jv_equal(x.l->v[i], y.l->v[i]))
				return jv_cmp(x.l->v[i], y.l->v[i]);
		return x.l->n < y.l->n ? -1 : x.l->n > y.l->n;
	}
	return -2;
}

const char *jv_type_name(struct jv v)
{
	static const char *const names[] = { "Undefined", "NoneType", "bool", "int", "float", "str",
					     "list", "tuple", "dict", "Namespace", "LoopContext",
					     "Macro", "builtin_function_or_method",
					     "builtin_function_or_method", "Cycler" };

	if ((v.t == JV_LIST || v.t == JV_TUPLE) && v.l->kind != JL_LIST) {
		static const char *const kinds[] = { "list", "dict_items", "dict_keys",
						     "dict_values", "generator", "range" };

		return kinds[v.l->kind];
	}
	if (v.t == JV_STR && v.safe)
		return "Markup";
	return v.t < sizeof(names) / sizeof(names[0]) ? names[v.t] : "object";
}

int jbuf_put(struct jbuf *b, const char *p, size_t n)
{
	if (n > b->max || b->n > b->max - n)
		return -E2BIG;
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		char *np;

		while (cap < b->n + n + 1)
			cap *= 2;
		np = realloc(b->p, cap);
		if (!np)
			return -ENOMEM;
		b->p = np;
		b->cap = cap;
	}
	memcpy(b->p + b->n, p, n);
	b->n += n;
	b->p[b->n] = 0;
	return 0;
}

int jv_fail(struct jrender *r, int line, const char *fmt, ...)
{
	va_list ap;
	int k;

	if (line <= 0)
		line = r->line;
	k = line > 0 ? snprintf(r->err, r->errlen, "line %d: ", line) : 0;

	va_start(ap, fmt);
	if (k >= 0 && (size_t)k < r->errlen)
		vsnprintf(r->err + k, r->errlen - (size_t)k, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

int jv_iterate(struct jrender *r, struct jv v, struct jlist **out)
{
	struct jlist *l;
	int rc;

	switch (v.t) {
	case JV_UNDEF:
		*out = jlist_new(r->a, 0, JL_LIST);
		return *out ? 0 : -ENOMEM;
	case JV_LIST: case JV_TUPLE:
		if (v.l->kind == JL_GEN) {
			if (v.l->used) {
				*out = jlist_new(r->a, 0, JL_LIST);
				return *out ? 0 : -ENOMEM;
			}
			v.l->used = 1;
		}
		*out = v.l;
		return 0;
	case JV_DICT:
		l = jlist_new(r->a, v.d->n, JL_LIST);
		if (!l)
			return -ENOMEM;
		for (size_t i = 0; i < v.d->n; i++)
			l->v[l->n++] = v.d->k[i];
		*out = l;
		return 0;
	case JV_STR:
		l = jlist_new(r->a, v.s.n, JL_LIST);
		if (!l)
			return -ENOMEM;
		for (size_t i = 0; i < v.s.n;) {
			size_t cl;

			jstr_cp_at(v.s.p + i, v.s.n - i, &cl);
			if ((rc = jlist_push(r->a, l, jv_str(v.s.p + i, cl))))
				return rc;
			i += cl;
		}
		*out = l;
		return 0;
	default:
		return jv_fail(r, 0, "'%s' object is not iterable", jv_type_name(v));
	}
}

int jv_len(struct jrender *r, struct jv v, long long *out)
{
	switch (v.t) {
	case JV_UNDEF: *out = 0; return 0;
	case JV_STR: *out = (long long)jstr_cplen(v.s); return 0;
	case JV_LIST: case JV_TUPLE:
		if (v.l->kind == JL_GEN)
			break;
		*out = (long long)v.l->n;
		return 0;
	case JV_DICT: *out = (long long)v.d->n; return 0;
	default: break;
	}
	return jv_fail(r, 0, "object of type '%s' has no len()", jv_type_name(v));
}

static const char *obj_name(struct jv obj)
{
	static const char *const names[] = { "Undefined", "None", "bool object", "int object",
					     "float object", "str object", "list object",
					     "tuple object", "dict object",
					     "jinja2.utils.Namespace object",
					     "jinja2.runtime.LoopContext object",
					     "jinja2.runtime.Macro object", "builtin_function_or_method object",
					     "builtin_function_or_method object", "jinja2.utils.Cycler object" };

	if ((obj.t == JV_LIST || obj.t == JV_TUPLE) && obj.l->kind != JL_LIST) {
		static const char *const kinds[] = { "list object", "dict_items object",
						     "dict_keys object", "dict_values object",
						     "generator object", "range object" };

		return kinds[obj.l->kind];
	}
	if (obj.t == JV_STR && obj.safe)
		return "markupsafe.Markup object";
	return obj.t < sizeof(names) / sizeof(names[0]) ? names[obj.t] : "object";
}

struct jv jv_undef_attr(struct jarena *a, struct jv obj, struct jv key)
{
	struct jundef *u = jarena_alloc(a, sizeof(*u));
	struct jv v = jv_undef();

	if (!u)
		return v; /* a plain undefined: only its message is lost */
	memset(u, 0, sizeof(*u));
	u->key = key;
	u->objname = obj_name(obj);
	v.u = u;
	return v;
}

struct jv jv_undef_var(struct jarena *a, struct jstr name)
{
	struct jundef *u = jarena_alloc(a, sizeof(*u));
	struct jv v = jv_undef();

	if (!u)
		return v;
	memset(u, 0, sizeof(*u));
	u->key = jv_str(name.p, name.n);
	v.u = u;
	return v;
}

struct jv jv_undef_hint(struct jarena *a, const char *hint, int security)
{
	struct jundef *u = jarena_alloc(a, sizeof(*u));
	struct jv v = jv_undef();

	if (!u)
		return v;
	memset(u, 0, sizeof(*u));
	u->hint = hint;
	u->security = (uint8_t)security;
	v.u = u;
	return v;
}

int jv_undef_fail(struct jrender *r, int line, struct jv u)
{
	struct jbuf b = { .max = 4096 };
	int rc;

	if (!u.u)
		return jv_fail(r, line, "a value is undefined");
	if (u.u->hint)
		return jv_fail(r, line, "%s", u.u->hint);
	if ((rc = jv_print(r, &b, u.u->key, 1)) || !b.p) {
		free(b.p);
		return rc ? rc : jv_fail(r, line, "a value is undefined");
	}
	if (!u.u->objname)
		rc = jv_fail(r, line, "%s is undefined", b.p);
	else if (u.u->key.t == JV_STR)
		rc = jv_fail(r, line, "'%s' has no attribute %s", u.u->objname, b.p);
	else
		rc = jv_fail(r, line, "%s has no element %s", u.u->objname, b.p);
	free(b.p);
	return rc;
}

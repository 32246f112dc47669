/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja_call.c - calls in the Jinja2 renderer: macros (jinja_eval.c), methods
 * (jinja_methods.c), and the globals: range (the sandbox's, at most 100000 items), dict,
 * namespace, cycler, joiner, and transformers' raise_exception (its message becomes the
 * render's error, exactly) and strftime_now (the render's time, UTC). Called by jinja_expr.c.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/dps.h"
#include "engine/model/jinja_int.h"

/* strftime_now: the time now (UTC) as Python's datetime.strftime formats a naive datetime. */
static int strftime_now(struct jrender *r, int line, struct jv fmt, struct jv *out)
{
	struct tm tm;
	time_t t = (time_t)r->now;
	char f[512], *o;
	size_t k = 0, n;

	if (fmt.t != JV_STR)
		return jv_fail(r, line, "strftime() argument 1 must be str, not %s",
			       jv_type_name(fmt));
	if (!gmtime_r(&t, &tm))
		return jv_fail(r, line, "strftime_now: the time is out of range");
	for (size_t i = 0; i < fmt.s.n && k + 8 < sizeof(f); i++) {
		if (fmt.s.p[i] == '%' && i + 1 < fmt.s.n) {
			char c = fmt.s.p[i + 1];

			if (c == 'f') {
				memcpy(f + k, "000000", 6);
				k += 6;
				i++;
				continue;
			}
			if (c == 'z' || c == 'Z') {
				i++;
				continue;
			}
			f[k++] = '%';
			f[k++] = c;
			i++;
			continue;
		}
		if (!fmt.s.p[i])
			return jv_fail(r, line, "embedded null character");
		f[k++] = fmt.s.p[i];
	}
	f[k] = 0;
	o = jarena_alloc(r->a, 4096);
	if (!o)
		return -ENOMEM;
	n = k ? strftime(o, 4096, f, &tm) : 0;
	*out = jv_str(o, n);
	return 0;
}

static int call_func(struct jrender *r, int line, int id, struct jv *args, size_t nargs,
		     const struct jstr *kwn, struct jv *kwv, size_t nkw, struct jv *out)
{
	int rc;

	switch (id) {
	case JF_RAISE: {
		struct jstr m;

		if (nargs < 1)
			return jv_fail(r, line, "raise_exception() missing 1 required positional "
				       "argument: 'message'");
		if ((rc = jv_to_str(r, args[0], &m)))
			return rc;
		snprintf(r->err, r->errlen, "%.*s", (int)m.n, m.p);
		r->raised = 1;
		return -EINVAL;
	}
	case JF_STRFTIME:
		if (nargs != 1 || nkw)
			return jv_fail(r, line, "strftime_now() takes exactly one argument");
		return strftime_now(r, line, args[0], out);
	case JF_RANGE: {
		long long a = 0, b, st = 1, first, cnt;
		struct jlist *l;

		if (nkw || nargs < 1 || nargs > 3)
			return jv_fail(r, line, "range expected 1 to 3 arguments, got %zu", nargs);
		for (size_t i = 0; i < nargs; i++)
			if (args[i].t != JV_INT && args[i].t != JV_BOOL)
				return jv_fail(r, line, "'%s' object cannot be interpreted as an "
					       "integer", jv_type_name(args[i]));
		b = args[nargs == 1 ? 0 : 1].i;
		if (nargs > 1)
			a = args[0].i;
		if (nargs == 3)
			st = args[2].i;
		if (st == 0)
			return jv_fail(r, line, "range() arg 3 must not be zero");
		if (st > 0)
			cnt = b > a ? (b - a + st - 1) / st : 0;
		else
			cnt = a > b ? (a - b - st - 1) / -st : 0;
		if (cnt > 100000)
			return jv_fail(r, line, "Range too big. The sandbox blocks ranges larger "
				       "than MAX_RANGE (100000).");
		l = jlist_new(r->a, (size_t)cnt, JL_RANGE);
		if (!l)
			return -ENOMEM;
		first = a;
		for (long long i = 0; i < cnt; i++)
			l->v[l->n++] = jv_int(first + i * st);
		l->r0 = a;
		l->r1 = b;
		l->rs = st;
		*out = jv_list(l, 0);
		return 0;
	}
	case JF_DICT: case JF_NAMESPACE: {
		struct jdict *d = jdict_new(r->a);

		if (!d)
			return -ENOMEM;
		if (nargs > 1)
			return jv_fail(r, line, "%s expected at most 1 argument, got %zu",
				       id == JF_DICT ? "dict" : "namespace", nargs);
		if (nargs == 1) {
			if (args[0].t != JV_DICT)
				return jv_fail(r, line, "%s() takes a dict as its positional "
					       "argument here", id == JF_DICT ? "dict" : "namespace");
			for (size_t i = 0; i < args[0].d->n; i++)
				if ((rc = jdict_set(r->a, d, args[0].d->k[i], args[0].d->v[i])))
					return rc;
		}
		for (size_t i = 0; i < nkw; i++)
			if ((rc = jdict_set(r->a, d, jv_str(kwn[i].p, kwn[i].n), kwv[i])))
				return rc;
		*out = (struct jv){ .t = (uint8_t)(id == JF_DICT ? JV_DICT : JV_NS), .d = d };
		return 0;
	}
	case JF_CYCLER: case JF_JOINER: {
		struct jcycler *c = jarena_alloc(r->a, sizeof(*c));

		if (!c)
			return -ENOMEM;
		memset(c, 0, sizeof(*c));
		if (id == JF_CYCLER) {
			if (nkw)
				return jv_fail(r, line, "cycler() takes no keyword arguments");
			if (!(c->items = jlist_new(r->a, nargs, JL_LIST)))
				return -ENOMEM;
			for (size_t i = 0; i < nargs; i++)
				c->items->v[c->items->n++] = args[i];
			if (!nargs)
				return jv_fail(r, line, "at least one item has to be provided");
		} else {
			struct jv sep = jv_cstr(", ");

			if (nargs + nkw > 1)
				return jv_fail(r, line, "joiner() takes at most 1 argument");
			if (nargs)
				sep = args[0];
			else if (nkw)
				sep = kwv[0];
			if ((rc = jv_to_str(r, sep, &c->sep)))
				return rc;
		}
		*out = (struct jv){ .t = JV_CYCLER, .cy = c };
		return 0;
	}
	}
	return jv_fail(r, line, "unknown function");
}

int jinja_call_value(struct jrender *r, int line, struct jv fn, struct jv *args, size_t nargs,
		     const struct jstr *kwn, struct jv *kwv, size_t nkw, struct jv *out)
{
	switch (fn.t) {
	case JV_UNDEF: return jv_undef_fail(r, line, fn);
	case JV_MACRO: return jinja_call_macro(r, line, fn.m, args, nargs, kwn, kwv, nkw, out);
	case JV_FUNC: return call_func(r, line, (int)fn.i, args, nargs, kwn, kwv, nkw, out);
	case JV_METHOD: return jinja_method_call(r, line, fn.meth, args, nargs, kwn, kwv, nkw, out);
	case JV_CYCLER:
		if (!fn.cy->items) {
			*out = fn.cy->used ? jv_str(fn.cy->sep.p, fn.cy->sep.n) : jv_str("", 0);
			fn.cy->used = 1;
			return 0;
		}
		break;
	default: break;
	}
	return jv_fail(r, line, "'%s' object is not callable", jv_type_name(fn));
}

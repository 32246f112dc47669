/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja_filters.c - the filters and tests of the Jinja2 renderer: the names the
 * parser accepts (every other is refused at parse time), argument binding as Python binds
 * them, and the filters on single values (strings, numbers, tojson as transformers overrides
 * it: json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)) and every test. The
 * filters over sequences are in jinja_seq.c. Called by the evaluator (jinja_expr.c).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/jinja_int.h"

enum filt {
	F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_COUNT, F_D, F_DEFAULT, F_DICTSORT, F_E, F_ESCAPE,
	F_FIRST, F_FLOAT, F_FORCEESCAPE, F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH,
	F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE,
	F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON,
	F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT, F_N
};

static const char *const filter_names[F_N] = {
	"abs", "attr", "batch", "capitalize", "count", "d", "default", "dictsort", "e", "escape",
	"first", "float", "forceescape", "indent", "int", "items", "join", "last", "length",
	"list", "lower", "map", "max", "min", "reject", "rejectattr", "replace", "reverse",
	"round", "safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson",
	"trim", "unique", "upper", "wordcount",
};

enum test {
	T_BOOLEAN, T_CALLABLE, T_DEFINED, T_DIVISIBLEBY, T_EQ, T_EQUALTO, T_ESCAPED, T_EVEN,
	T_FALSE, T_FILTER, T_FLOAT, T_GE, T_GT, T_GREATERTHAN, T_IN, T_INTEGER, T_ITERABLE, T_LE,
	T_LESSTHAN, T_LOWER, T_LT, T_MAPPING, T_NE, T_NONE, T_NUMBER, T_ODD, T_SAMEAS, T_SEQUENCE,
	T_STRING, T_TEST, T_TRUE, T_UNDEFINED, T_UPPER, T_SYM_EQ, T_SYM_NE, T_SYM_LT, T_SYM_LE,
	T_SYM_GT, T_SYM_GE, T_N
};

static const char *const test_names[T_N] = {
	"boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
	"false", "filter", "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le",
	"lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas", "sequence",
	"string", "test", "true", "undefined", "upper", "==", "!=", "<", "<=", ">", ">=",
};

static int find(const char *const *names, int n, const char *s, size_t len)
{
	for (int i = 0; i < n; i++)
		if (strlen(names[i]) == len && !memcmp(names[i], s, len))
			return i;
	return -1;
}

int jinja_filter_find(const char *name, size_t n)
{
	return find(filter_names, F_N, name, n);
}

int jinja_test_find(const char *name, size_t n)
{
	return find(test_names, T_N, name, n);
}

int jinja_bind(struct jrender *r, int line, const char *what, const char *const *params,
	       struct jv *args, size_t nargs, const struct jstr *kwn, struct jv *kwv, size_t nkw,
	       struct jv *bound)
{
	size_t np = 0;

	while (params[np])
		np++;
	if (nargs > np)
		return jv_fail(r, line, "%s() takes at most %zu arguments (%zu given)", what, np,
			       nargs);
	for (size_t i = 0; i < np; i++)
		bound[i] = i < nargs ? args[i] : (struct jv){ .t = JV_MISSING };
	for (size_t k = 0; k < nkw; k++) {
		size_t i;

		for (i = 0; i < np; i++)
			if (strlen(params[i]) == kwn[k].n && !memcmp(params[i], kwn[k].p, kwn[k].n))
				break;
		if (i == np)
			return jv_fail(r, line, "%s() got an unexpected keyword argument '%.*s'", what,
				       (int)kwn[k].n, kwn[k].p);
		if (bound[i].t != JV_MISSING)
			return jv_fail(r, line, "%s() got multiple values for argument '%s'", what,
				       params[i]);
		bound[i] = kwv[k];
	}
	return 0;
}

static struct jv or_default(struct jv v, struct jv d)
{
	return v.t == JV_MISSING ? d : v;
}

/* Python's float(str): whitespace around, underscores between digits, inf and nan. */
static int parse_float(struct jrender *r, struct jstr s, double *out)
{
	struct jstr t;
	char *buf, *end;
	size_t k = 0;

	jstr_strip(r->a, s, NULL, 1, 1, &t);
	if (!t.n || !(buf = jarena_alloc(r->a, t.n + 1)))
		return -1;
	for (size_t i = 0; i < t.n; i++) {
		char c = t.p[i];

		if (c == '_') {
			if (!i || i + 1 >= t.n || !(t.p[i - 1] >= '0' && t.p[i - 1] <= '9') ||
			    !(t.p[i + 1] >= '0' && t.p[i + 1] <= '9'))
				return -1;
			continue;
		}
		if (c == 'x' || c == 'X' || c == '(' || c == 'p' || c == 'P' || !c)
			return -1;
		buf[k++] = c;
	}
	buf[k] = 0;
	*out = strtod(buf, &end);
	return *end ? -1 : 0;
}

/* Python's int(str, base 10). */
static int parse_int(struct jrender *r, struct jstr s, long long *out)
{
	struct jstr t;
	unsigned long long v = 0;
	size_t i = 0;
	int neg = 0, digits = 0;

	jstr_strip(r->a, s, NULL, 1, 1, &t);
	if (i < t.n && (t.p[i] == '+' || t.p[i] == '-'))
		neg = t.p[i++] == '-';
	for (; i < t.n; i++) {
		if (t.p[i] == '_' && digits && i + 1 < t.n && t.p[i + 1] >= '0' && t.p[i + 1] <= '9')
			continue;
		if (t.p[i] < '0' || t.p[i] > '9')
			return -1;
		if (v > 922337203685477580ULL)
			return -2;
		v = v * 10 + (unsigned)(t.p[i] - '0');
		digits++;
	}
	if (!digits || v > 9223372036854775807ULL)
		return digits ? -2 : -1;
	*out = neg ? -(long long)v : (long long)v;
	return 0;
}

static int filter_int(struct jrender *r, int line, struct jv v, struct jv *b, struct jv *out)
{
	struct jv dflt = or_default(b[0], jv_int(0));
	double f;
	long long i;
	int rc;

	if (b[1].t != JV_MISSING && !(b[1].t == JV_INT && b[1].i == 10))
		return jv_fail(r, line, "int(): only base 10 is supported");
	if (v.t == JV_INT || v.t == JV_BOOL) {
		*out = jv_int(v.i);
		return 0;
	}
	if (v.t == JV_STR && (rc = parse_int(r, v.s, &i)) != -1) {
		if (rc)
			return jv_fail(r, line, "int(): the number is too large");
		*out = jv_int(i);
		return 0;
	}
	if (v.t == JV_FLOAT)
		f = v.f;
	else if (v.t != JV_STR || parse_float(r, v.s, &f)) {
		*out = dflt;
		return 0;
	}
	if (isnan(f)) {
		*out = dflt;
		return 0;
	}
	if (isinf(f) || fabs(f) >= 9.2e18)
		return jv_fail(r, line, "cannot convert float infinity or a huge float to integer");
	*out = jv_int((long long)f);
	return 0;
}

/* Python's round(x, ndigits) for a float: correctly rounded, ties to even. */
static int round_float(struct jrender *r, int line, double x, long long nd, double *out)
{
	char buf[512];

	if (nd < 0)
		return jv_fail(r, line, "round: a negative precision is not supported");
	if (nd > 320 || !isfinite(x)) {
		*out = x;
		return 0;
	}
	if (fabs(x) >= 1e150) {
		*out = x;
		return 0;
	}
	snprintf(buf, sizeof(buf), "%.*f", (int)nd, x);
	*out = strtod(buf, NULL);
	return 0;
}

static int filter_round(struct jrender *r, int line, struct jv v, struct jv *b, struct jv *out)
{
	struct jv prec = or_default(b[0], jv_int(0)), meth = or_default(b[1], jv_cstr("common"));
	int common = meth.t == JV_STR && meth.s.n == 6 && !memcmp(meth.s.p, "common", 6);
	int ceil_ = meth.t == JV_STR && meth.s.n == 4 && !memcmp(meth.s.p, "ceil", 4);
	int floor_ = meth.t == JV_STR && meth.s.n == 5 && !memcmp(meth.s.p, "floor", 5);
	double f = 0;
	int rc;

	if (!common && !ceil_ && !floor_)
		return jv_fail(r, line, "method must be common, ceil or floor");
	if (!jv_is_num(v))
		return jv_fail(r, line, "type %s doesn't define __round__ method", jv_type_name(v));
	if (prec.t != JV_INT && prec.t != JV_BOOL)
		return jv_fail(r, line, "'%s' object cannot be interpreted as an integer",
			       jv_type_name(prec));
	if (common) {
		if (v.t != JV_FLOAT) {
			if (prec.i < 0)
				return jv_fail(r, line, "round: a negative precision is not supported");
			*out = jv_int(v.i);
			return 0;
		}
		if ((rc = round_float(r, line, v.f, prec.i, &f)))
			return rc;
		*out = jv_float(f);
		return 0;
	}
	if (prec.i < 0 || prec.i > 300)
		return jv_fail(r, line, "round: the precision is out of range");
	{
		double scale = pow(10, (double)prec.i), x = jv_num(v) * scale;

		*out = jv_float((ceil_ ? ceil(x) : floor(x)) / scale);
	}
	return 0;
}

static int filter_indent(struct jrender *r, int line, struct jv v, struct jv *b, struct jv *out)
{
	struct jv width = or_default(b[0], jv_int(4));
	int first = jv_truthy(or_default(b[1], jv_bool(0)));
	int blank = jv_truthy(or_default(b[2], jv_bool(0)));
	struct jstr s, ind;
	struct jbuf o = { .max = r->max_out };
	struct jlist *lines;
	char *p;
	int rc;

	if ((rc = jv_to_str(r, v, &s)))
		return rc;
	if (width.t == JV_STR) {
		ind = width.s;
	} else if (width.t == JV_INT || width.t == JV_BOOL) {
		long long w = width.i < 0 ? 0 : width.i;

		if ((size_t)w > r->max_out)
			return jv_fail(r, line, "indent: the width is too large");
		p = jarena_alloc(r->a, (size_t)w + 1);
		if (!p)
			return -ENOMEM;
		memset(p, ' ', (size_t)w);
		ind = jv_str(p, (size_t)w).s;
	} else {
		return jv_fail(r, line, "indent: width must be an int or a str");
	}
	p = jarena_alloc(r->a, s.n + 2);
	if (!p)
		return -ENOMEM;
	memcpy(p, s.p, s.n);
	p[s.n] = '\n';
	if ((rc = jstr_splitlines(r->a, jv_str(p, s.n + 1).s, 0, &lines)))
		return rc;
	if (first && (rc = jbuf_put(&o, ind.p, ind.n)))
		goto err;
	for (size_t i = 0; i < lines->n; i++) {
		struct jstr l = lines->v[i].s;

		if (i && (rc = jbuf_put(&o, "\n", 1)))
			goto err;
		if (i && (blank || l.n) && (rc = jbuf_put(&o, ind.p, ind.n)))
			goto err;
		if ((rc = jbuf_put(&o, l.p, l.n)))
			goto err;
	}
	p = jarena_alloc(r->a, o.n + 1);
	if (!p) {
		rc = -ENOMEM;
		goto err;
	}
	if (o.n)
		memcpy(p, o.p, o.n);
	*out = jv_str(p, o.n);
	rc = 0;
err:
	free(o.p);
	return rc;
}

static int filter_tojson(struct jrender *r, int line, struct jv v, struct jv *b, struct jv *out)
{
	struct jv indent = or_default(b[1], jv_none()), seps = or_default(b[2], jv_none());
	struct jstr item = jv_cstr(indent.t == JV_NONE ? ", " : ",").s, key = jv_cstr(": ").s;
	struct jbuf o = { .max = r->max_out };
	char *p;
	int rc;

	if (indent.t == JV_BOOL)
		indent = jv_int(indent.i);
	if (indent.t == JV_INT && indent.i > 10000)
		return jv_fail(r, line, "tojson: the indent is too large");
	if (indent.t != JV_NONE && indent.t != JV_INT && indent.t != JV_STR)
		return jv_fail(r, line, "tojson: indent must be None, an int or a str");
	if (seps.t != JV_NONE) {
		if ((seps.t != JV_LIST && seps.t != JV_TUPLE) || seps.l->n != 2 ||
		    seps.l->v[0].t != JV_STR || seps.l->v[1].t != JV_STR)
			return jv_fail(r, line, "tojson: separators must be a pair of strings");
		item = seps.l->v[0].s;
		key = seps.l->v[1].s;
	}
	r->json_ascii = jv_truthy(or_default(b[0], jv_bool(0)));
	rc = jv_tojson(r, &o, v, indent, item, key, jv_truthy(or_default(b[3], jv_bool(0))), 0);
	r->json_ascii = 0;
	if (!rc) {
		p = jarena_alloc(r->a, o.n + 1);
		if (!p) {
			rc = -ENOMEM;
		} else {
			if (o.n)
				memcpy(p, o.p, o.n);
			*out = jv_str(p, o.n);
		}
	}
	free(o.p);
	return rc;
}

static int filter_wordcount(struct jrender *r, struct jv v, struct jv *out)
{
	struct jstr s;
	long long n = 0;
	int in = 0, rc;

	if ((rc = jv_to_str(r, v, &s)))
		return rc;
	for (size_t i = 0; i < s.n;) {
		size_t l;
		int w = jstr_isword(jstr_cp_at(s.p + i, s.n - i, &l));

		n += w && !in;
		in = w;
		i += l;
	}
	*out = jv_int(n);
	return 0;
}

int jinja_filter_apply(struct jrender *r, int line, int id, struct jv v, struct jv *args,
		       size_t nargs, const struct jstr *kwn, struct jv *kwv, size_t nkw,
		       struct jv *out)
{
	static const char *const p_none[] = { NULL };
	static const char *const p_default[] = { "default_value", "boolean", NULL };
	static const char *const p_int[] = { "default", "base", NULL };
	static const char *const p_float[] = { "default", NULL };
	static const char *const p_round[] = { "precision", "method", NULL };
	static const char *const p_indent[] = { "width", "first", "blank", NULL };
	static const char *const p_replace[] = { "old", "new", "count", NULL };
	static const char *const p_trim[] = { "chars", NULL };
	static const char *const p_attr[] = { "name", NULL };
	static const char *const p_tojson[] = { "ensure_ascii", "indent", "separators",
						"sort_keys", NULL };
	const char *name = filter_names[id];
	struct jv b[8];
	struct jstr s, t;
	int rc, handled = 0;

	if ((rc = jinja_seq_filter(r, line, name, v, args, nargs, kwn, kwv, nkw, out, &handled)) ||
	    handled)
		return rc;
	switch (id) {
	case F_D: case F_DEFAULT:
		if ((rc = jinja_bind(r, line, name, p_default, args, nargs, kwn, kwv, nkw, b)))
			return rc;
		if (v.t == JV_UNDEF || (jv_truthy(or_default(b[1], jv_bool(0))) && !jv_truthy(v)))
			*out = or_default(b[0], jv_str("", 0));
		else
			*out = v;
		return 0;
	case F_INT:
		if ((rc = jinja_bind(r, line, name, p_int, args, nargs, kwn, kwv, nkw, b)))
			return rc;
		return filter_int(r, line, v, b, out);
	case F_FLOAT: {
		double f;

		if ((rc = jinja_bind(r, line, name, p_float, args, nargs, kwn, kwv, nkw, b)))
			return rc;
		if (jv_is_num(v))
			*out = jv_float(jv_num(v));
		else if (v.t == JV_STR && !parse_float(r, v.s, &f))
			*out = jv_float(f);
		else
			*out = or_default(b[0], jv_float(0));
		return 0;
	}
	case F_ROUND:
		if ((rc = jinja_bind(r, line, name, p_round, args, nargs, kwn, kwv, nkw, b)))
			return rc;
		return filter_round(r, line, v, b, out);
	case F_INDENT:
		if ((rc = jinja_bind(r, line, name, p_indent, args, nargs, kwn, kwv, nkw, b)))
			return rc;
		return filter_indent(r, line, v, b, out);
	case F_TOJSON:
		if ((rc = jinja_bind(r, line, name, p_tojson, args, nargs, kwn, kwv, nkw, b)))
			return rc;
		return filter_tojson(r, line, v, b, out);
	case F_ATTR:
		if ((rc = jinja_bind(r, line, name, p_attr, args, nargs, kwn, kwv, nkw, b)))
			return rc;
		if (b[0].t != JV_STR)
			return jv_fail(r, line, "attribute name must be a string");
		return jinja_getattr(r, line, v, b[0].s, out);
	case F_REPLACE: {
		struct jstr o, n;

		if ((rc = jinja_bind(r, line, name, p_replace, args, nargs, kwn, kwv, nkw, b)))
			return rc;
		if (b[0].t == JV_MISSING || b[1].t == JV_MISSING)
			return jv_fail(r, line, "replace() needs the old and the new string");
		if (b[2].t != JV_MISSING && b[2].t != JV_NONE && b[2].t != JV_INT)
			return jv_fail(r, line, "replace(): count must be an integer");
		if ((rc = jv_to_str(r, v, &s)) || (rc = jv_to_str(r, b[0], &o)) ||
		    (rc = jv_to_str(r, b[1], &n)) ||
		    (rc = jstr_replace(r->a, s, o, n, b[2].t == JV_INT && b[2].i ? b[2].i : -1, &t)))
			return rc;
		*out = jv_str(t.p, t.n);
		return 0;
	}
	case F_TRIM:
		if ((rc = jinja_bind(r, line, name, p_trim, args, nargs, kwn, kwv, nkw, b)))
			return rc;
		if (b[0].t != JV_MISSING && b[0].t != JV_NONE && b[0].t != JV_STR)
			return jv_fail(r, line, "strip arg must be None or str");
		if ((rc = jv_to_str(r, v, &s)))
			return rc;
		jstr_strip(r->a, s, b[0].t == JV_STR ? &b[0].s : NULL, 1, 1, &t);
		*out = jv_str(t.p, t.n);
		out->safe = v.t == JV_STR && v.safe;
		return 0;
	default:
		break;
	}
	if ((rc = jinja_bind(r, line, name, p_none, args, nargs, kwn, kwv, nkw, b)))
		return rc;
	switch (id) {
	case F_ABS:
		if (v.t == JV_FLOAT)
			*out = jv_float(fabs(v.f));
		else if ((v.t == JV_INT || v.t == JV_BOOL) && v.i != -9223372036854775807LL - 1)
			*out = jv_int(v.i < 0 ? -v.i : v.i);
		else
			return jv_fail(r, line, "bad operand type for abs(): '%s'", jv_type_name(v));
		return 0;
	case F_CAPITALIZE: case F_LOWER: case F_UPPER: case F_TITLE: {
		int mode = id == F_CAPITALIZE ? JCASE_CAPITALIZE : id == F_LOWER ? JCASE_LOWER :
			   id == F_UPPER ? JCASE_UPPER : JCASE_JTITLE;

		if ((rc = jv_to_str(r, v, &s)) || (rc = jstr_case(r->a, s, mode, &t)))
			return rc;
		*out = jv_str(t.p, t.n);
		return 0;
	}
	case F_COUNT: case F_LENGTH: {
		long long n;

		if ((rc = jv_len(r, v, &n)))
			return rc;
		*out = jv_int(n);
		return 0;
	}
	case F_E: case F_ESCAPE: case F_FORCEESCAPE:
		if (v.t == JV_STR && v.safe && id != F_FORCEESCAPE) {
			*out = v;
			return 0;
		}
		if ((rc = jv_to_str(r, v, &s)) || (rc = jstr_escape_html(r->a, s, &t)))
			return rc;
		*out = jv_str(t.p, t.n);
		out->safe = 1;
		return 0;
	case F_SAFE:
		if ((rc = jv_to_str(r, v, &s)))
			return rc;
		*out = jv_str(s.p, s.n);
		out->safe = 1;
		return 0;
	case F_STRING:
		if ((rc = jv_to_str(r, v, &s)))
			return rc;
		*out = jv_str(s.p, s.n);
		out->safe = v.t == JV_STR && v.safe;
		return 0;
	case F_WORDCOUNT:
		return filter_wordcount(r, v, out);
	}
	return jv_fail(r, line, "filter '%s' is not implemented", name);
}

int jinja_filter_by_name(struct jrender *r, int line, struct jv name, struct jv v,
			 struct jv *args, size_t nargs, const struct jstr *kwn, struct jv *kwv,
			 size_t nkw, struct jv *out)
{
	int id = name.t == JV_STR ? jinja_filter_find(name.s.p, name.s.n) : -1;

	if (id < 0)
		return jv_fail(r, line, "No filter named '%.*s'.", name.t == JV_STR ? (int)name.s.n : 0,
			       name.t == JV_STR ? name.s.p : "");
	return jinja_filter_apply(r, line, id, v, args, nargs, kwn, kwv, nkw, out);
}

static int is_cased_str(struct jrender *r, struct jv v, int upper, int *out)
{
	struct jstr s, t;
	int rc, cased = 0;

	if ((rc = jv_to_str(r, v, &s)) || (rc = jstr_case(r->a, s, upper ? JCASE_LOWER :
							     JCASE_UPPER, &t)))
		return rc;
	/* islower: some cased character and none upper; approximated by the case mappings */
	{
		struct jstr same;

		if ((rc = jstr_case(r->a, s, upper ? JCASE_UPPER : JCASE_LOWER, &same)))
			return rc;
		cased = !(t.n == s.n && !memcmp(t.p, s.p, s.n));
		*out = cased && same.n == s.n && !memcmp(same.p, s.p, s.n);
	}
	return 0;
}

int jinja_test_apply(struct jrender *r, int line, int id, struct jv v, struct jv *args,
		     size_t nargs, int *out)
{
	struct jv x, arg = nargs ? args[0] : (struct jv){ .t = JV_MISSING };
	int rc, needs = id == T_DIVISIBLEBY || id == T_EQ || id == T_EQUALTO || id == T_GE ||
			id == T_GT || id == T_GREATERTHAN || id == T_IN || id == T_LE ||
			id == T_LESSTHAN || id == T_LT || id == T_NE || id == T_SAMEAS ||
			id == T_FILTER || id == T_TEST || id >= T_SYM_EQ;

	if (nargs > (size_t)needs)
		return jv_fail(r, line, "test '%s' takes %d argument(s)", test_names[id], needs);
	if (needs && !nargs)
		return jv_fail(r, line, "test '%s' needs an argument", test_names[id]);
	switch (id) {
	case T_BOOLEAN: *out = v.t == JV_BOOL; return 0;
	case T_CALLABLE:
		*out = v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_METHOD || v.t == JV_LOOP ||
		       (v.t == JV_CYCLER && !v.cy->items);
		return 0;
	case T_DEFINED: *out = v.t != JV_UNDEF; return 0;
	case T_UNDEFINED: *out = v.t == JV_UNDEF; return 0;
	case T_NONE: *out = v.t == JV_NONE; return 0;
	case T_TRUE: *out = v.t == JV_BOOL && v.i; return 0;
	case T_FALSE: *out = v.t == JV_BOOL && !v.i; return 0;
	case T_INTEGER: *out = v.t == JV_INT; return 0;
	case T_FLOAT: *out = v.t == JV_FLOAT; return 0;
	case T_NUMBER: *out = jv_is_num(v); return 0;
	case T_STRING: *out = v.t == JV_STR; return 0;
	case T_MAPPING: *out = v.t == JV_DICT; return 0;
	case T_ESCAPED: *out = v.t == JV_STR && v.safe; return 0;
	case T_ITERABLE:
		*out = v.t == JV_UNDEF || v.t == JV_STR || v.t == JV_LIST || v.t == JV_TUPLE ||
		       v.t == JV_DICT || v.t == JV_LOOP;
		return 0;
	case T_SEQUENCE:
		*out = v.t == JV_UNDEF || v.t == JV_STR || v.t == JV_DICT ||
		       ((v.t == JV_LIST || v.t == JV_TUPLE) &&
			(v.l->kind == JL_LIST || v.l->kind == JL_RANGE));
		return 0;
	case T_LOWER: return is_cased_str(r, v, 0, out);
	case T_UPPER: return is_cased_str(r, v, 1, out);
	case T_EVEN: case T_ODD: case T_DIVISIBLEBY:
		if ((rc = jinja_binop(r, line, JT_MOD, v, id == T_DIVISIBLEBY ? arg : jv_int(2), &x)))
			return rc;
		*out = jv_equal(x, jv_int(id == T_ODD ? 1 : 0));
		return 0;
	case T_EQ: case T_EQUALTO: case T_SYM_EQ: *out = jv_equal(v, arg); return 0;
	case T_NE: case T_SYM_NE: *out = !jv_equal(v, arg); return 0;
	case T_IN: return jinja_contains(r, line, arg, v, out);
	case T_SAMEAS:
		if (v.t != arg.t)
			*out = 0;
		else if (v.t == JV_INT)
			*out = v.i == arg.i && v.i >= -5 && v.i <= 256;
		else if (v.t == JV_NONE || v.t == JV_BOOL || v.t == JV_UNDEF)
			*out = jv_equal(v, arg) && (v.t != JV_UNDEF || v.u == arg.u);
		else if (v.t == JV_STR || v.t == JV_FLOAT)
			*out = 0;
		else
			*out = v.d == arg.d;
		return 0;
	case T_FILTER:
		*out = arg.t == JV_STR && jinja_filter_find(arg.s.p, arg.s.n) >= 0;
		return 0;
	case T_TEST:
		*out = arg.t == JV_STR && jinja_test_find(arg.s.p, arg.s.n) >= 0;
		return 0;
	}
	{
		static const int ops[] = { [T_GE] = JT_GTEQ, [T_GT] = JT_GT, [T_GREATERTHAN] = JT_GT,
					   [T_LE] = JT_LTEQ, [T_LESSTHAN] = JT_LT, [T_LT] = JT_LT,
					   [T_SYM_LT] = JT_LT, [T_SYM_LE] = JT_LTEQ,
					   [T_SYM_GT] = JT_GT, [T_SYM_GE] = JT_GTEQ };
		int c;

		if (v.t == JV_UNDEF)
			return jv_undef_fail(r, line, v);
		if (arg.t == JV_UNDEF)
			return jv_undef_fail(r, line, arg);
		c = jv_cmp(v, arg);
		if (c == -2)
			return jv_fail(r, line, "comparison not supported between instances of '%s' "
				       "and '%s'", jv_type_name(v), jv_type_name(arg));
		switch (ops[id]) {
		case JT_GTEQ: *out = c == 0 || c == 1; break;
		case JT_GT: *out = c == 1; break;
		case JT_LTEQ: *out = c == 0 || c == -1; break;
		default: *out = c == -1; break;
		}
	}
	return 0;
}

int jinja_test_by_name(struct jrender *r, int line, struct jv name, struct jv v,
		       struct jv *args, size_t nargs, int *out)
{
	int id = name.t == JV_STR ? jinja_test_find(name.s.p, name.s.n) : -1;

	if (id < 0)
		return jv_fail(r, line, "No test named '%.*s'.", name.t == JV_STR ? (int)name.s.n : 0,
			       name.t == JV_STR ? name.s.p : "");
	return jinja_test_apply(r, line, id, v, args, nargs, out);
}

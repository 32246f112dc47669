/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja_expr.c - expressions of the Jinja2 renderer, evaluated as the compiled
 * Python of Jinja2's ImmutableSandboxedEnvironment evaluates them: names through the scopes,
 * the render variables and the globals (range, dict, namespace, cycler, joiner, and
 * transformers' raise_exception and strftime_now); attributes before items for a.b and items
 * before attributes for a[b], a missing one being Undefined; Python's arithmetic on ints and
 * floats, str and list concatenation, comparisons, membership, and/or returning an operand.
 * Statements (jinja_eval.c) and the filters call it.
 */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "common/dps.h"
#include "engine/model/jinja_int.h"

static const struct {
	const char *name;
	int id;
} globals[] = {
	{ "range", JF_RANGE }, { "dict", JF_DICT }, { "namespace", JF_NAMESPACE },
	{ "cycler", JF_CYCLER }, { "joiner", JF_JOINER }, { "raise_exception", JF_RAISE },
	{ "strftime_now", JF_STRFTIME },
};

int jinja_lookup(struct jrender *r, struct jscope *s, struct jstr name, struct jv *out)
{
	struct jv *v;

	for (; s; s = s->parent)
		if ((v = jdict_gets(&s->vars, name.p, name.n))) {
			*out = *v;
			return 0;
		}
	if ((v = jdict_gets(r->vars, name.p, name.n))) {
		*out = *v;
		return 0;
	}
	for (size_t i = 0; i < sizeof(globals) / sizeof(globals[0]); i++)
		if (strlen(globals[i].name) == name.n && !memcmp(globals[i].name, name.p, name.n)) {
			*out = (struct jv){ .t = JV_FUNC, .i = globals[i].id };
			return 0;
		}
	*out = jv_undef_var(r->a, name);
	return 0;
}

static int loop_attr(struct jrender *r, struct jloop *l, struct jstr name, struct jv *out)
{
	static const char *const attrs[] = { "index", "index0", "revindex", "revindex0", "first",
					     "last", "length", "previtem", "nextitem", "depth",
					     "depth0", NULL };
	long long i = (long long)l->i, n = (long long)l->items->n;
	int k;

	for (k = 0; attrs[k]; k++)
		if (strlen(attrs[k]) == name.n && !memcmp(attrs[k], name.p, name.n))
			break;
	switch (k) {
	case 0: *out = jv_int(i + 1); return 1;
	case 1: *out = jv_int(i); return 1;
	case 2: *out = jv_int(n - i); return 1;
	case 3: *out = jv_int(n - i - 1); return 1;
	case 4: *out = jv_bool(i == 0); return 1;
	case 5: *out = jv_bool(i == n - 1); return 1;
	case 6: *out = jv_int(n); return 1;
	case 7:
		*out = i > 0 ? l->items->v[i - 1] :
			       jv_undef_hint(r->a, "there is no previous item", 0);
		return 1;
	case 8:
		*out = i + 1 < n ? l->items->v[i + 1] :
				   jv_undef_hint(r->a, "there is no next item", 0);
		return 1;
	case 9: *out = jv_int(l->depth); return 1;
	case 10: *out = jv_int(l->depth - 1); return 1;
	}
	return 0;
}

static int unsafe_name(struct jstr name)
{
	return name.n >= 2 && name.p[0] == '_' && name.p[1] == '_';
}

static struct jv unsafe_attr(struct jrender *r, struct jv obj, struct jstr name)
{
	char *msg = jarena_alloc(r->a, name.n + 96);

	if (!msg)
		return jv_undef();
	snprintf(msg, name.n + 96, "access to attribute '%.*s' of '%s' object is unsafe.",
		 (int)name.n, name.p, jv_type_name(obj));
	return jv_undef_hint(r->a, msg, 1);
}

int jinja_getattr(struct jrender *r, int line, struct jv obj, struct jstr name, struct jv *out)
{
	struct jv *v;

	if (obj.t == JV_UNDEF)
		return jv_undef_fail(r, line, obj);
	if (unsafe_name(name)) {
		*out = unsafe_attr(r, obj, name);
		return 0;
	}
	if (jinja_method_find(r->a, obj, name, out))
		return 0;
	if (obj.t == JV_DICT || obj.t == JV_NS) {
		if ((v = jdict_gets(obj.d, name.p, name.n))) {
			*out = *v;
			return 0;
		}
	} else if (obj.t == JV_LOOP && loop_attr(r, obj.loop, name, out)) {
		return 0;
	}
	*out = jv_undef_attr(r->a, obj, jv_str(name.p, name.n));
	return 0;
}

static int slice_bound(struct jrender *r, const struct jnode *n, struct jscope *s, long long *v,
		       long long **p, int *bad)
{
	struct jv x;
	int rc;

	*p = NULL;
	if (!n)
		return 0;
	if ((rc = jinja_eval(r, n, s, &x)))
		return rc;
	if (x.t == JV_NONE)
		return 0;
	if (x.t != JV_INT && x.t != JV_BOOL) {
		*bad = 1;
		return 0;
	}
	*v = x.i;
	*p = v;
	return 0;
}

static int eval_slice(struct jrender *r, const struct jnode *n, struct jscope *s, struct jv obj,
		      struct jv *out)
{
	long long b, e, st = 1, *pb, *pe, *ps, first, cnt;
	int rc, bad = 0;

	if ((rc = slice_bound(r, n->a, s, &b, &pb, &bad)) ||
	    (rc = slice_bound(r, n->b, s, &e, &pe, &bad)) ||
	    (rc = slice_bound(r, n->c, s, &st, &ps, &bad)))
		return rc;
	if (obj.t == JV_UNDEF)
		return jv_undef_fail(r, n->line, obj);
	if (!bad && ps && st == 0)
		return jv_fail(r, n->line, "slice step cannot be zero");
	if (!ps)
		st = 1;
	if (!bad && obj.t == JV_STR) {
		struct jstr o;

		if ((rc = jstr_slice(r->a, obj.s, pb, pe, st, &o)))
			return rc;
		*out = jv_str(o.p, o.n);
		return 0;
	}
	if (!bad && (obj.t == JV_LIST || obj.t == JV_TUPLE) &&
	    (obj.l->kind == JL_LIST || obj.l->kind == JL_RANGE)) {
		struct jlist *l;

		cnt = jslice((long long)obj.l->n, pb, pe, st, &first);
		l = jlist_new(r->a, (size_t)cnt, JL_LIST);
		if (!l)
			return -ENOMEM;
		for (long long i = 0, k = first; i < cnt; i++, k += st)
			l->v[l->n++] = obj.l->v[k];
		*out = jv_list(l, obj.t == JV_TUPLE);
		return 0;
	}
	*out = jv_undef_attr(r->a, obj, jv_cstr("slice"));
	return 0;
}

int jinja_getitem(struct jrender *r, int line, struct jv obj, struct jv key, struct jv *out)
{
	struct jv *v;

	if (obj.t == JV_UNDEF)
		return jv_undef_fail(r, line, obj);
	if (obj.t == JV_DICT && (v = jdict_get(obj.d, key))) {
		*out = *v;
		return 0;
	}
	if ((key.t == JV_INT || key.t == JV_BOOL) && (obj.t == JV_LIST || obj.t == JV_TUPLE) &&
	    (obj.l->kind == JL_LIST || obj.l->kind == JL_RANGE)) {
		long long i = key.i < 0 ? key.i + (long long)obj.l->n : key.i;

		if (i >= 0 && i < (long long)obj.l->n) {
			*out = obj.l->v[i];
			return 0;
		}
	}
	if ((key.t == JV_INT || key.t == JV_BOOL) && obj.t == JV_STR) {
		int ok;

		*out = jstr_index(obj.s, key.i, &ok);
		if (ok)
			return 0;
	}
	if (key.t == JV_STR && obj.t != JV_DICT)
		return jinja_getattr(r, line, obj, key.s, out);
	if (key.t == JV_STR && jinja_method_find(r->a, obj, key.s, out))
		return 0;
	*out = jv_undef_attr(r->a, obj, key);
	return 0;
}

static int type_error(struct jrender *r, int line, const char *op, struct jv x, struct jv y)
{
	return jv_fail(r, line, "unsupported operand type(s) for %s: '%s' and '%s'", op,
		       jv_type_name(x), jv_type_name(y));
}

static int concat_lists(struct jrender *r, struct jv x, struct jv y, struct jv *out)
{
	struct jlist *l = jlist_new(r->a, x.l->n + y.l->n, JL_LIST);

	if (!l)
		return -ENOMEM;
	if (x.l->n)
		memcpy(l->v, x.l->v, x.l->n * sizeof(*l->v));
	if (y.l->n)
		memcpy(l->v + x.l->n, y.l->v, y.l->n * sizeof(*l->v));
	l->n = x.l->n + y.l->n;
	*out = jv_list(l, x.t == JV_TUPLE);
	return 0;
}

static int repeat(struct jrender *r, struct jv seq, long long times, struct jv *out)
{
	size_t unit = seq.t == JV_STR ? seq.s.n : seq.l->n, total;

	if (times < 0)
		times = 0;
	if (dps_size_mul(unit, (size_t)times, &total) || total > r->max_out)
		return jv_fail(r, 0, "a repetition makes a value too large");
	if (seq.t == JV_STR) {
		char *p = jarena_alloc(r->a, total + 1);

		if (!p)
			return -ENOMEM;
		for (long long i = 0; i < times; i++)
			memcpy(p + (size_t)i * unit, seq.s.p, unit);
		*out = jv_str(p, total);
	} else {
		struct jlist *l = jlist_new(r->a, total, JL_LIST);

		if (!l)
			return -ENOMEM;
		for (long long i = 0; i < times && unit; i++)
			memcpy(l->v + (size_t)i * unit, seq.l->v, unit * sizeof(*l->v));
		l->n = total;
		*out = jv_list(l, seq.t == JV_TUPLE);
	}
	return 0;
}

/* Python's float floor division and modulo (Objects/floatobject.c's rules). */
static void float_divmod(double vx, double wx, double *floordiv, double *mod)
{
	double div;

	*mod = fmod(vx, wx);
	div = (vx - *mod) / wx;
	if (*mod) {
		if ((wx < 0) != (*mod < 0)) {
			*mod += wx;
			div -= 1.0;
		}
	} else {
		*mod = copysign(0.0, wx);
	}
	if (div) {
		*floordiv = floor(div);
		if (div - *floordiv > 0.5)
			*floordiv += 1.0;
	} else {
		*floordiv = copysign(0.0, vx / wx);
	}
}

int jinja_binop(struct jrender *r, int line, int op, struct jv x, struct jv y, struct jv *out)
{
	static const char *const names[] = { [JT_ADD] = "+", [JT_SUB] = "-", [JT_MUL] = "*",
					     [JT_DIV] = "/", [JT_FLOORDIV] = "//", [JT_MOD] = "%",
					     [JT_POW] = "** or pow()" };
	int num = jv_is_num(x) && jv_is_num(y), ints = num && x.t != JV_FLOAT && y.t != JV_FLOAT;
	long long ri;

	if (x.t == JV_UNDEF)
		return jv_undef_fail(r, line, x);
	if (y.t == JV_UNDEF)
		return jv_undef_fail(r, line, y);
	switch (op) {
	case JT_ADD:
		if (ints) {
			if (__builtin_add_overflow(x.i, y.i, &ri))
				return jv_fail(r, line, "integer overflow");
			*out = jv_int(ri);
			return 0;
		}
		if (num) {
			*out = jv_float(jv_num(x) + jv_num(y));
			return 0;
		}
		if (x.t == JV_STR && y.t == JV_STR) {
			struct jstr a = x.s, b = y.s;
			char *p;
			int rc;

			if (x.safe != y.safe &&
			    (rc = jstr_escape_html(r->a, x.safe ? b : a, x.safe ? &b : &a)))
				return rc;
			p = jarena_alloc(r->a, a.n + b.n + 1);
			if (!p)
				return -ENOMEM;
			memcpy(p, a.p, a.n);
			memcpy(p + a.n, b.p, b.n);
			*out = jv_str(p, a.n + b.n);
			out->safe = x.safe | y.safe;
			return 0;
		}
		if ((x.t == JV_LIST || x.t == JV_TUPLE) && x.t == y.t && x.l->kind == JL_LIST &&
		    y.l->kind == JL_LIST)
			return concat_lists(r, x, y, out);
		if (x.t == JV_STR || x.t == JV_LIST || x.t == JV_TUPLE)
			return jv_fail(r, line, "can only concatenate %s (not \"%s\") to %s",
				       jv_type_name(x), jv_type_name(y), jv_type_name(x));
		return type_error(r, line, "+", x, y);
	case JT_SUB:
		if (ints) {
			if (__builtin_sub_overflow(x.i, y.i, &ri))
				return jv_fail(r, line, "integer overflow");
			*out = jv_int(ri);
			return 0;
		}
		if (num) {
			*out = jv_float(jv_num(x) - jv_num(y));
			return 0;
		}
		return type_error(r, line, "-", x, y);
	case JT_MUL:
		if (ints) {
			if (__builtin_mul_overflow(x.i, y.i, &ri))
				return jv_fail(r, line, "integer overflow");
			*out = jv_int(ri);
			return 0;
		}
		if (num) {
			*out = jv_float(jv_num(x) * jv_num(y));
			return 0;
		}
		if ((x.t == JV_STR || ((x.t == JV_LIST || x.t == JV_TUPLE) && x.l->kind == JL_LIST)) &&
		    (y.t == JV_INT || y.t == JV_BOOL))
			return repeat(r, x, y.i, out);
		if ((y.t == JV_STR || ((y.t == JV_LIST || y.t == JV_TUPLE) && y.l->kind == JL_LIST)) &&
		    (x.t == JV_INT || x.t == JV_BOOL))
			return repeat(r, y, x.i, out);
		return jv_fail(r, line, "can't multiply sequence by non-int of type '%s'",
			       jv_type_name(x.t == JV_STR || x.t == JV_LIST ? y : x));
	case JT_DIV:
		if (!num)
			return type_error(r, line, "/", x, y);
		if (jv_num(y) == 0)
			return jv_fail(r, line, "division by zero");
		*out = jv_float(jv_num(x) / jv_num(y));
		return 0;
	case JT_FLOORDIV: case JT_MOD:
		if (!num) {
			if (op == JT_MOD && x.t == JV_STR)
				return jv_fail(r, line, "printf-style formatting with %% is not "
					       "supported");
			return type_error(r, line, names[op], x, y);
		}
		if (ints) {
			long long q, m;

			if (y.i == 0)
				return jv_fail(r, line, op == JT_MOD ? "integer modulo by zero" :
					       "integer division or modulo by zero");
			if (x.i == -9223372036854775807LL - 1 && y.i == -1)
				return jv_fail(r, line, "integer overflow");
			q = x.i / y.i;
			m = x.i % y.i;
			if (m && ((m < 0) != (y.i < 0))) {
				m += y.i;
				q--;
			}
			*out = jv_int(op == JT_MOD ? m : q);
			return 0;
		}
		if (jv_num(y) == 0)
			return jv_fail(r, line, op == JT_MOD ? "float modulo" :
				       "float floor division by zero");
		{
			double fd, md;

			float_divmod(jv_num(x), jv_num(y), &fd, &md);
			*out = jv_float(op == JT_MOD ? md : fd);
		}
		return 0;
	case JT_POW:
		if (!num)
			return type_error(r, line, names[op], x, y);
		if (ints && y.i >= 0) {
			long long acc = 1, base = x.i, e = y.i;

			while (e) {
				if ((e & 1) && __builtin_mul_overflow(acc, base, &acc))
					return jv_fail(r, line, "integer overflow");
				e >>= 1;
				if (e && __builtin_mul_overflow(base, base, &base))
					return jv_fail(r, line, "integer overflow");
			}
			*out = jv_int(acc);
			return 0;
		}
		if (jv_num(x) == 0 && jv_num(y) < 0)
			return jv_fail(r, line, "0.0 cannot be raised to a negative power");
		if (jv_num(x) < 0 && jv_num(y) != floor(jv_num(y)))
			return jv_fail(r, line, "complex results are not supported");
		*out = jv_float(pow(jv_num(x), jv_num(y)));
		return 0;
	}
	return jv_fail(r, line, "unknown operator");
}

int jinja_contains(struct jrender *r, int line, struct jv hay, struct jv needle, int *out)
{
	struct jlist *l;
	int rc;

	*out = 0;
	switch (hay.t) {
	case JV_STR:
		if (needle.t != JV_STR)
			return jv_fail(r, line, "'in <string>' requires string as left operand, "
				       "not %s", jv_type_name(needle));
		*out = jstr_find(hay.s, needle.s, 0) >= 0;
		return 0;
	case JV_DICT:
		if (needle.t == JV_LIST || needle.t == JV_DICT || needle.t == JV_NS)
			return jv_fail(r, line, "unhashable type: '%s'", jv_type_name(needle));
		*out = jdict_get(hay.d, needle) != NULL;
		return 0;
	case JV_UNDEF: case JV_LIST: case JV_TUPLE:
		if ((rc = jv_iterate(r, hay, &l)))
			return rc;
		for (size_t i = 0; i < l->n && !*out; i++)
			*out = jv_equal(l->v[i], needle);
		return 0;
	default:
		return jv_fail(r, line, "argument of type '%s' is not iterable", jv_type_name(hay));
	}
}

static int compare(struct jrender *r, int line, int op, struct jv x, struct jv y, int *res)
{
	static const char *const sym[] = { [JT_LT] = "<", [JT_LTEQ] = "<=", [JT_GT] = ">",
					   [JT_GTEQ] = ">=" };
	int c;

	switch (op) {
	case JT_EQ: *res = jv_equal(x, y); return 0;
	case JT_NE: *res = !jv_equal(x, y); return 0;
	case 100: return jinja_contains(r, line, y, x, res);
	case 101:
		c = jinja_contains(r, line, y, x, res);
		*res = !*res;
		return c;
	}
	if (x.t == JV_UNDEF)
		return jv_undef_fail(r, line, x);
	if (y.t == JV_UNDEF)
		return jv_undef_fail(r, line, y);
	c = jv_cmp(x, y);
	if (c == -2)
		return jv_fail(r, line, "'%s' not supported between instances of '%s' and '%s'",
			       sym[op], jv_type_name(x), jv_type_name(y));
	if (c == 3) {
		*res = 0;
		return 0;
	}
	*res = op == JT_LT ? c < 0 : op == JT_LTEQ ? c <= 0 : op == JT_GT ? c > 0 : c >= 0;
	return 0;
}

/* Evaluates the arguments of a call, filter or test node. */
static int eval_args(struct jrender *r, const struct jnode *n, struct jscope *s, struct jv **args,
		     struct jv **kwv)
{
	int rc;

	*args = jarena_alloc(r->a, (n->args.n + 1) * sizeof(**args));
	*kwv = jarena_alloc(r->a, (n->kw.n + 1) * sizeof(**kwv));
	if (!*args || !*kwv)
		return -ENOMEM;
	for (size_t i = 0; i < n->args.n; i++)
		if ((rc = jinja_eval(r, n->args.v[i], s, &(*args)[i])))
			return rc;
	for (size_t i = 0; i < n->kw.n; i++)
		if ((rc = jinja_eval(r, n->kw.v[i], s, &(*kwv)[i])))
			return rc;
	return 0;
}

static int eval_collection(struct jrender *r, const struct jnode *n, struct jscope *s,
			   struct jv *out)
{
	int rc;

	if (n->kind == JN_DICT) {
		struct jdict *d = jdict_new(r->a);

		if (!d)
			return -ENOMEM;
		for (size_t i = 0; i < n->args.n; i++) {
			struct jv k, v;

			if ((rc = jinja_eval(r, n->args.v[i], s, &k)) ||
			    (rc = jinja_eval(r, n->kw.v[i], s, &v)))
				return rc;
			if (k.t == JV_LIST || k.t == JV_DICT || k.t == JV_NS)
				return jv_fail(r, n->line, "unhashable type: '%s'", jv_type_name(k));
			if ((rc = jdict_set(r->a, d, k, v)))
				return rc;
		}
		*out = (struct jv){ .t = JV_DICT, .d = d };
		return 0;
	}
	{
		struct jlist *l = jlist_new(r->a, n->args.n, JL_LIST);

		if (!l)
			return -ENOMEM;
		for (size_t i = 0; i < n->args.n; i++)
			if ((rc = jinja_eval(r, n->args.v[i], s, &l->v[l->n++])))
				return rc;
		*out = jv_list(l, n->kind == JN_TUPLE);
	}
	return 0;
}

int jinja_eval(struct jrender *r, const struct jnode *n, struct jscope *s, struct jv *out)
{
	struct jv x, y, *args, *kwv;
	int rc, res;

	if (++r->steps > r->max_steps)
		return jv_fail(r, n->line, "the template runs too long");
	r->line = n->line;
	switch (n->kind) {
	case JN_CONST: *out = n->val; return 0;
	case JN_NAME: return jinja_lookup(r, s, n->name, out);
	case JN_GETATTR:
		if ((rc = jinja_eval(r, n->a, s, &x)))
			return rc;
		return jinja_getattr(r, n->line, x, n->name, out);
	case JN_GETITEM:
		if ((rc = jinja_eval(r, n->a, s, &x)))
			return rc;
		if (n->b->kind == JN_SLICE)
			return eval_slice(r, n->b, s, x, out);
		if ((rc = jinja_eval(r, n->b, s, &y)))
			return rc;
		return jinja_getitem(r, n->line, x, y, out);
	case JN_CALL:
		if ((rc = jinja_eval(r, n->a, s, &x)) || (rc = eval_args(r, n, s, &args, &kwv)))
			return rc;
		r->line = n->line;
		return jinja_call_value(r, n->line, x, args, n->args.n, n->kwnames, kwv, n->kw.n,
					out);
	case JN_FILTER:
		if (!n->a)
			return jv_fail(r, n->line, "a filter without a value");
		if ((rc = jinja_eval(r, n->a, s, &x)) || (rc = eval_args(r, n, s, &args, &kwv)))
			return rc;
		r->line = n->line;
		return jinja_filter_apply(r, n->line, n->op, x, args, n->args.n, n->kwnames, kwv,
					  n->kw.n, out);
	case JN_TEST:
		if ((rc = jinja_eval(r, n->a, s, &x)) || (rc = eval_args(r, n, s, &args, &kwv)))
			return rc;
		if (n->kw.n)
			return jv_fail(r, n->line, "tests take no keyword arguments here");
		r->line = n->line;
		if ((rc = jinja_test_apply(r, n->line, n->op, x, args, n->args.n, &res)))
			return rc;
		*out = jv_bool(res);
		return 0;
	case JN_NEG: case JN_POS:
		if ((rc = jinja_eval(r, n->a, s, &x)))
			return rc;
		if (x.t == JV_UNDEF)
			return jv_undef_fail(r, n->line, x);
		if (!jv_is_num(x))
			return jv_fail(r, n->line, "bad operand type for unary %c: '%s'",
				       n->kind == JN_NEG ? '-' : '+', jv_type_name(x));
		if (n->kind == JN_POS)
			*out = x.t == JV_BOOL ? jv_int(x.i) : x;
		else if (x.t == JV_FLOAT)
			*out = jv_float(-x.f);
		else if (x.i == -9223372036854775807LL - 1)
			return jv_fail(r, n->line, "integer overflow");
		else
			*out = jv_int(-x.i);
		return 0;
	case JN_NOT:
		if ((rc = jinja_eval(r, n->a, s, &x)))
			return rc;
		*out = jv_bool(!jv_truthy(x));
		return 0;
	case JN_BINOP:
		if ((rc = jinja_eval(r, n->a, s, &x)) || (rc = jinja_eval(r, n->b, s, &y)))
			return rc;
		return jinja_binop(r, n->line, n->op, x, y, out);
	case JN_AND: case JN_OR:
		if ((rc = jinja_eval(r, n->a, s, &x)))
			return rc;
		if (jv_truthy(x) == (n->kind == JN_OR)) {
			*out = x;
			return 0;
		}
		return jinja_eval(r, n->b, s, out);
	case JN_CONCAT: {
		struct jbuf b = { .max = r->max_out };

		for (size_t i = 0; i < n->args.n; i++) {
			if ((rc = jinja_eval(r, n->args.v[i], s, &x)) ||
			    (rc = jv_print(r, &b, x, 0))) {
				free(b.p);
				return rc;
			}
		}
		{
			char *p = jarena_alloc(r->a, b.n + 1);

			if (!p) {
				free(b.p);
				return -ENOMEM;
			}
			if (b.n)
				memcpy(p, b.p, b.n);
			free(b.p);
			*out = jv_str(p, b.n);
		}
		return 0;
	}
	case JN_COMPARE:
		if ((rc = jinja_eval(r, n->a, s, &x)))
			return rc;
		for (size_t i = 0; i < n->args.n; i++) {
			if ((rc = jinja_eval(r, n->args.v[i], s, &y)) ||
			    (rc = compare(r, n->line, n->ops[i], x, y, &res)))
				return rc;
			if (!res) {
				*out = jv_bool(0);
				return 0;
			}
			x = y;
		}
		*out = jv_bool(1);
		return 0;
	case JN_COND:
		if ((rc = jinja_eval(r, n->a, s, &x)))
			return rc;
		if (jv_truthy(x))
			return jinja_eval(r, n->b, s, out);
		if (n->c)
			return jinja_eval(r, n->c, s, out);
		*out = jv_undef_hint(r->a, "the inline if-expression evaluated to false and no "
				     "else section was defined.", 0);
		return 0;
	case JN_LIST: case JN_TUPLE: case JN_DICT:
		return eval_collection(r, n, s, out);
	}
	return jv_fail(r, n->line, "not an expression");
}


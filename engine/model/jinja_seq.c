/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja_seq.c - the filters of the Jinja2 renderer that walk sequences: map,
 * select, reject, selectattr, rejectattr, unique (generators in Jinja2, so they print and
 * count as generators do: not at all), sort, dictsort, min, max, sum, join, list, first,
 * last, reverse, items, batch; with Jinja2's attribute getter ("a.b.0") and its
 * case-insensitive keys. Called by jinja_filter_apply (jinja_filters.c).
 */
#include <errno.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/jinja_int.h"

int jinja_attrgetter(struct jrender *r, int line, struct jv obj, struct jv attr, struct jv dflt,
		     struct jv *out)
{
	int rc;

	if (attr.t != JV_STR) {
		if ((rc = jinja_getitem(r, line, obj, attr, out)))
			return rc;
	} else {
		size_t b = 0;

		for (size_t i = 0; i <= attr.s.n; i++) {
			struct jv part;
			int digits = 1;

			if (i < attr.s.n && attr.s.p[i] != '.')
				continue;
			part = jv_str(attr.s.p + b, i - b);
			for (size_t k = 0; k < part.s.n; k++)
				digits &= part.s.p[k] >= '0' && part.s.p[k] <= '9';
			if (digits && part.s.n && part.s.n < 18) {
				long long v = 0;

				for (size_t k = 0; k < part.s.n; k++)
					v = v * 10 + (part.s.p[k] - '0');
				part = jv_int(v);
			}
			if ((rc = jinja_getitem(r, line, obj, part, &obj)))
				return rc;
			b = i + 1;
		}
		*out = obj;
	}
	if (dflt.t != JV_MISSING && out->t == JV_UNDEF)
		*out = dflt;
	return 0;
}

static struct jv or_missing_false(struct jv v)
{
	return v.t == JV_MISSING ? jv_bool(0) : v;
}

static int lower_key(struct jrender *r, struct jv v, struct jv *out)
{
	struct jstr s;
	int rc;

	if (v.t != JV_STR) {
		*out = v;
		return 0;
	}
	if ((rc = jstr_case(r->a, v.s, JCASE_LOWER, &s)))
		return rc;
	*out = jv_str(s.p, s.n);
	return 0;
}

/* The sort key of v: attributes (comma-separated) then lowered unless case_sensitive. */
static int sort_key(struct jrender *r, int line, struct jv v, struct jv attr, int cs,
		    struct jv *out)
{
	int rc;

	if (attr.t == JV_MISSING || attr.t == JV_NONE)
		return cs ? (*out = v, 0) : lower_key(r, v, out);
	if (attr.t == JV_STR && memchr(attr.s.p, ',', attr.s.n)) {
		struct jlist *parts, *keys;
		struct jstr comma = { ",", 1 };

		if ((rc = jstr_split(r->a, attr.s, &comma, -1, 0, &parts)))
			return rc;
		if (!(keys = jlist_new(r->a, parts->n, JL_LIST)))
			return -ENOMEM;
		for (size_t i = 0; i < parts->n; i++) {
			struct jv k;

			if ((rc = jinja_attrgetter(r, line, v, parts->v[i], (struct jv){ .t = JV_MISSING },
						   &k)) || (!cs && (rc = lower_key(r, k, &k))))
				return rc;
			keys->v[keys->n++] = k;
		}
		*out = jv_list(keys, 0);
		return 0;
	}
	if ((rc = jinja_attrgetter(r, line, v, attr, (struct jv){ .t = JV_MISSING }, out)))
		return rc;
	return cs ? 0 : lower_key(r, *out, out);
}

static int key_cmp(struct jrender *r, int line, struct jv a, struct jv b, int *c)
{
	if (a.t == JV_UNDEF || b.t == JV_UNDEF)
		return jv_undef_fail(r, line, a.t == JV_UNDEF ? a : b);
	*c = jv_cmp(a, b);
	if (*c == -2)
		return jv_fail(r, line, "'<' not supported between instances of '%s' and '%s'",
			       jv_type_name(a), jv_type_name(b));
	if (*c == 3)
		*c = 0;
	return 0;
}

/* Stable merge sort of items by keys (both n long), descending when rev. */
static int merge_sort(struct jrender *r, int line, struct jv *items, struct jv *keys, size_t n,
		      int rev)
{
	struct jv *ti, *tk;
	int rc;

	if (n < 2)
		return 0;
	ti = jarena_alloc(r->a, n * sizeof(*ti));
	tk = jarena_alloc(r->a, n * sizeof(*tk));
	if (!ti || !tk)
		return -ENOMEM;
	for (size_t w = 1; w < n; w *= 2) {
		for (size_t lo = 0; lo < n; lo += 2 * w) {
			size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
			size_t i = lo, j = mid, k = lo;

			while (i < mid || j < hi) {
				int c = 0, take_right;

				if (i < mid && j < hi && (rc = key_cmp(r, line, keys[i], keys[j], &c)))
					return rc;
				take_right = i >= mid || (j < hi && (rev ? c < 0 : c > 0));
				ti[k] = take_right ? items[j] : items[i];
				tk[k++] = take_right ? keys[j++] : keys[i++];
			}
		}
		memcpy(items, ti, n * sizeof(*ti));
		memcpy(keys, tk, n * sizeof(*tk));
		if (++r->steps > r->max_steps)
			return jv_fail(r, line, "the template runs too long");
	}
	return 0;
}

static int copy_list(struct jrender *r, struct jlist *in, int kind, struct jlist **out)
{
	*out = jlist_new(r->a, in->n, kind);
	if (!*out)
		return -ENOMEM;
	if (in->n)
		memcpy((*out)->v, in->v, in->n * sizeof(*in->v));
	(*out)->n = in->n;
	return 0;
}

static int select_filter(struct jrender *r, int line, const char *name, struct jlist *items,
			 struct jv *args, size_t nargs, const struct jstr *kwn, struct jv *kwv,
			 size_t nkw, struct jv *out)
{
	int attr = name[strlen(name) - 1] == 'r', reject = name[0] == 'r', rc;
	struct jlist *l = jlist_new(r->a, items->n, JL_GEN);

	if (!l)
		return -ENOMEM;
	if (nkw)
		return jv_fail(r, line, "%s() takes no keyword arguments", name);
	if (attr && !nargs)
		return jv_fail(r, line, "Missing parameter for attribute name");
	for (size_t i = 0; i < items->n; i++) {
		struct jv v = items->v[i];
		size_t t = attr ? 1 : 0;
		int ok;

		if (attr && (rc = jinja_attrgetter(r, line, v, args[0], (struct jv){ .t = JV_MISSING },
						   &v)))
			return rc;
		if (nargs > t) {
			if ((rc = jinja_test_by_name(r, line, args[t], v, args + t + 1, nargs - t - 1,
						     &ok)))
				return rc;
		} else {
			ok = jv_truthy(v);
		}
		if (ok != reject)
			l->v[l->n++] = items->v[i];
	}
	*out = jv_list(l, 0);
	return 0;
}

static int map_filter(struct jrender *r, int line, struct jlist *items, struct jv *args,
		      size_t nargs, const struct jstr *kwn, struct jv *kwv, size_t nkw,
		      struct jv *out)
{
	struct jlist *l = jlist_new(r->a, items->n, JL_GEN);
	struct jv attr = { .t = JV_MISSING }, dflt = { .t = JV_MISSING };
	int rc;

	if (!l)
		return -ENOMEM;
	if (!nargs) {
		for (size_t k = 0; k < nkw; k++) {
			if (kwn[k].n == 9 && !memcmp(kwn[k].p, "attribute", 9))
				attr = kwv[k];
			else if (kwn[k].n == 7 && !memcmp(kwn[k].p, "default", 7))
				dflt = kwv[k];
			else
				return jv_fail(r, line, "Unexpected keyword argument '%.*s'",
					       (int)kwn[k].n, kwn[k].p);
		}
		if (attr.t == JV_MISSING)
			return jv_fail(r, line, "map requires a filter argument");
	}
	for (size_t i = 0; i < items->n; i++) {
		struct jv v;

		if (nargs)
			rc = jinja_filter_by_name(r, line, args[0], items->v[i], args + 1, nargs - 1,
						  kwn, kwv, nkw, &v);
		else
			rc = jinja_attrgetter(r, line, items->v[i], attr, dflt, &v);
		if (rc)
			return rc;
		l->v[l->n++] = v;
	}
	*out = jv_list(l, 0);
	return 0;
}

int jinja_seq_filter(struct jrender *r, int line, const char *name, struct jv v, struct jv *args,
		     size_t nargs, const struct jstr *kwn, struct jv *kwv, size_t nkw,
		     struct jv *out, int *handled)
{
	static const char *const p_sort[] = { "reverse", "case_sensitive", "attribute", NULL };
	static const char *const p_uniq[] = { "case_sensitive", "attribute", NULL };
	static const char *const p_dictsort[] = { "case_sensitive", "by", "reverse", NULL };
	static const char *const p_join[] = { "d", "attribute", NULL };
	static const char *const p_sum[] = { "attribute", "start", NULL };
	static const char *const p_batch[] = { "linecount", "fill_with", NULL };
	static const char *const p_none[] = { NULL };
	struct jlist *items, *l;
	struct jv b[4];
	int rc;

	*handled = 1;
	if (!strcmp(name, "map") || !strcmp(name, "select") || !strcmp(name, "reject") ||
	    !strcmp(name, "selectattr") || !strcmp(name, "rejectattr")) {
		if ((rc = jv_iterate(r, v, &items)))
			return rc;
		if (name[1] == 'a')
			return map_filter(r, line, items, args, nargs, kwn, kwv, nkw, out);
		return select_filter(r, line, name, items, args, nargs, kwn, kwv, nkw, out);
	}
	if (!strcmp(name, "sort") || !strcmp(name, "unique") || !strcmp(name, "min") ||
	    !strcmp(name, "max")) {
		int sort = name[0] == 's', cs;
		struct jv *keys, attr;

		if ((rc = jinja_bind(r, line, name, sort ? p_sort : p_uniq, args, nargs, kwn, kwv, nkw,
				     b)) || (rc = jv_iterate(r, v, &items)) ||
		    (rc = copy_list(r, items, JL_LIST, &l)))
			return rc;
		cs = jv_truthy(b[sort ? 1 : 0].t == JV_MISSING ? jv_bool(0) : b[sort ? 1 : 0]);
		attr = b[sort ? 2 : 1];
		keys = jarena_alloc(r->a, (l->n + 1) * sizeof(*keys));
		if (!keys)
			return -ENOMEM;
		for (size_t i = 0; i < l->n; i++)
			if ((rc = sort_key(r, line, l->v[i], attr, cs, &keys[i])))
				return rc;
		if (sort) {
			if ((rc = merge_sort(r, line, l->v, keys, l->n,
					     b[0].t != JV_MISSING && jv_truthy(b[0]))))
				return rc;
			*out = jv_list(l, 0);
			return 0;
		}
		if (name[0] == 'u') {
			struct jlist *u = jlist_new(r->a, l->n, JL_GEN);

			if (!u)
				return -ENOMEM;
			for (size_t i = 0; i < l->n; i++) {
				size_t j;

				for (j = 0; j < i; j++)
					if (jv_equal(keys[j], keys[i]))
						break;
				if (j == i)
					u->v[u->n++] = l->v[i];
			}
			*out = jv_list(u, 0);
			return 0;
		}
		if (!l->n) {
			*out = jv_undef_hint(r->a, name[1] == 'i' ? "No smallest item, sequence was "
					     "empty." : "No largest item, sequence was empty.", 0);
			return 0;
		}
		{
			size_t best = 0;

			for (size_t i = 1; i < l->n; i++) {
				int c;

				if ((rc = key_cmp(r, line, keys[i], keys[best], &c)))
					return rc;
				if (name[1] == 'i' ? c < 0 : c > 0)
					best = i;
			}
			*out = l->v[best];
		}
		return 0;
	}
	if (!strcmp(name, "dictsort")) {
		struct jv *keys;
		int byval;

		if ((rc = jinja_bind(r, line, name, p_dictsort, args, nargs, kwn, kwv, nkw, b)))
			return rc;
		if (v.t != JV_DICT)
			return jv_fail(r, line, "dictsort: the value is not a mapping");
		byval = b[1].t == JV_STR && b[1].s.n == 5 && !memcmp(b[1].s.p, "value", 5);
		if (b[1].t != JV_MISSING && !byval &&
		    !(b[1].t == JV_STR && b[1].s.n == 3 && !memcmp(b[1].s.p, "key", 3)))
			return jv_fail(r, line, "You can only sort by either \"key\" or \"value\"");
		l = jlist_new(r->a, v.d->n, JL_LIST);
		keys = jarena_alloc(r->a, (v.d->n + 1) * sizeof(*keys));
		if (!l || !keys)
			return -ENOMEM;
		for (size_t i = 0; i < v.d->n; i++) {
			struct jlist *pair = jlist_new(r->a, 2, JL_LIST);

			if (!pair)
				return -ENOMEM;
			pair->v[0] = v.d->k[i];
			pair->v[1] = v.d->v[i];
			pair->n = 2;
			l->v[l->n++] = jv_list(pair, 1);
			keys[i] = byval ? v.d->v[i] : v.d->k[i];
			if (!jv_truthy(or_missing_false(b[0])) && (rc = lower_key(r, keys[i], &keys[i])))
				return rc;
		}
		if ((rc = merge_sort(r, line, l->v, keys, l->n, jv_truthy(or_missing_false(b[2])))))
			return rc;
		*out = jv_list(l, 0);
		return 0;
	}
	if (!strcmp(name, "join")) {
		struct jv sep;
		struct jbuf o = { .max = r->max_out };
		char *p;

		if ((rc = jinja_bind(r, line, name, p_join, args, nargs, kwn, kwv, nkw, b)) ||
		    (rc = jv_iterate(r, v, &items)))
			return rc;
		sep = b[0].t == JV_MISSING ? jv_str("", 0) : b[0];
		for (size_t i = 0; i < items->n; i++) {
			struct jv x = items->v[i];

			if ((b[1].t != JV_MISSING && b[1].t != JV_NONE &&
			     (rc = jinja_attrgetter(r, line, x, b[1], (struct jv){ .t = JV_MISSING }, &x))) ||
			    (i && (rc = jv_print(r, &o, sep, 0))) || (rc = jv_print(r, &o, x, 0))) {
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
	if (!strcmp(name, "sum")) {
		struct jv acc;

		if ((rc = jinja_bind(r, line, name, p_sum, args, nargs, kwn, kwv, nkw, b)) ||
		    (rc = jv_iterate(r, v, &items)))
			return rc;
		acc = b[1].t == JV_MISSING ? jv_int(0) : b[1];
		for (size_t i = 0; i < items->n; i++) {
			struct jv x = items->v[i];

			if ((b[0].t != JV_MISSING && b[0].t != JV_NONE &&
			     (rc = jinja_attrgetter(r, line, x, b[0], (struct jv){ .t = JV_MISSING }, &x))) ||
			    (rc = jinja_binop(r, line, JT_ADD, acc, x, &acc)))
				return rc;
		}
		*out = acc;
		return 0;
	}
	if (!strcmp(name, "batch")) {
		struct jlist *cur = NULL;
		long long n;

		if ((rc = jinja_bind(r, line, name, p_batch, args, nargs, kwn, kwv, nkw, b)))
			return rc;
		if (b[0].t != JV_INT || b[0].i < 1)
			return jv_fail(r, line, "batch: linecount must be a positive integer");
		n = b[0].i;
		if ((rc = jv_iterate(r, v, &items)) || !(l = jlist_new(r->a, 0, JL_GEN)))
			return rc ? rc : -ENOMEM;
		for (size_t i = 0; i < items->n; i++) {
			if (!cur && !(cur = jlist_new(r->a, (size_t)(n < 64 ? n : 64), JL_LIST)))
				return -ENOMEM;
			if ((rc = jlist_push(r->a, cur, items->v[i])))
				return rc;
			if ((long long)cur->n == n) {
				if ((rc = jlist_push(r->a, l, jv_list(cur, 0))))
					return rc;
				cur = NULL;
			}
		}
		if (cur) {
			if (b[1].t != JV_MISSING && b[1].t != JV_NONE)
				while ((long long)cur->n < n)
					if ((rc = jlist_push(r->a, cur, b[1])))
						return rc;
			if ((rc = jlist_push(r->a, l, jv_list(cur, 0))))
				return rc;
		}
		*out = jv_list(l, 0);
		return 0;
	}
	if (strcmp(name, "list") && strcmp(name, "first") && strcmp(name, "last") &&
	    strcmp(name, "reverse") && strcmp(name, "items")) {
		*handled = 0;
		return 0;
	}
	if ((rc = jinja_bind(r, line, name, p_none, args, nargs, kwn, kwv, nkw, b)))
		return rc;
	if (!strcmp(name, "items")) {
		if (v.t == JV_UNDEF) {
			l = jlist_new(r->a, 0, JL_GEN);
		} else if (v.t != JV_DICT) {
			return jv_fail(r, line, "Can only get item pairs from a mapping.");
		} else if ((l = jlist_new(r->a, v.d->n, JL_GEN))) {
			for (size_t i = 0; i < v.d->n; i++) {
				struct jlist *pair = jlist_new(r->a, 2, JL_LIST);

				if (!pair)
					return -ENOMEM;
				pair->v[0] = v.d->k[i];
				pair->v[1] = v.d->v[i];
				pair->n = 2;
				l->v[l->n++] = jv_list(pair, 1);
			}
		}
		if (!l)
			return -ENOMEM;
		*out = jv_list(l, 0);
		return 0;
	}
	if (!strcmp(name, "reverse") && v.t == JV_STR) {
		char *p = jarena_alloc(r->a, v.s.n + 1);
		size_t k = v.s.n;

		if (!p)
			return -ENOMEM;
		for (size_t i = 0; i < v.s.n;) {
			size_t cl;

			jstr_cp_at(v.s.p + i, v.s.n - i, &cl);
			k -= cl;
			memcpy(p + k, v.s.p + i, cl);
			i += cl;
		}
		*out = jv_str(p, v.s.n);
		return 0;
	}
	if (!strcmp(name, "last") && (v.t == JV_LIST || v.t == JV_TUPLE) && v.l->kind == JL_GEN)
		return jv_fail(r, line, "'generator' object is not reversible");
	if ((rc = jv_iterate(r, v, &items)))
		return rc;
	if (!strcmp(name, "first") || !strcmp(name, "last")) {
		if (!items->n)
			*out = jv_undef_hint(r->a, name[0] == 'f' ? "No first item, sequence was "
					     "empty." : "No last item, sequence was empty.", 0);
		else
			*out = items->v[name[0] == 'f' ? 0 : items->n - 1];
		return 0;
	}
	if ((rc = copy_list(r, items, JL_LIST, &l)))
		return rc;
	if (!strcmp(name, "reverse")) {
		for (size_t i = 0; i < l->n / 2; i++) {
			struct jv t = l->v[i];

			l->v[i] = l->v[l->n - 1 - i];
			l->v[l->n - 1 - i] = t;
		}
		/* reversed() of a sequence is an iterator; of a generator, list() reversed */
		if (!((v.t == JV_LIST || v.t == JV_TUPLE) && v.l->kind == JL_GEN))
			l->kind = JL_GEN;
	}
	*out = jv_list(l, 0);
	return 0;
}

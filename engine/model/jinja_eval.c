/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja_eval.c - the statements of the Jinja2 renderer and its public face
 * (engine/model/jinja.h): parse (lexer, then parser), render, free. Scoping follows Jinja2's:
 * a for loop's body gets a fresh scope each iteration (so a set inside it is lost at the next
 * one, which is why templates use namespace()), macros and call blocks run in a scope whose
 * parent is where they were defined, if blocks share their surroundings. Limits guard the
 * renderer against the templates of downloaded checkpoints: output size, memory, steps,
 * nesting of macro calls. Called by engine/model/chat.c and the tests.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/jinja.h"
#include "common/dps.h"
#include "engine/model/jinja_int.h"

#define MAX_CALL_DEPTH 100

struct dps_jinja {
	struct jarena a;
	struct jnode *root;
	size_t max_out, max_mem;
	long long max_steps;
};

struct jscope *jinja_scope_new(struct jrender *r, struct jscope *parent)
{
	struct jscope *s = jarena_alloc(r->a, sizeof(*s));

	if (s) {
		memset(s, 0, sizeof(*s));
		s->parent = parent;
	}
	return s;
}

int jinja_scope_set(struct jrender *r, struct jscope *s, struct jstr name, struct jv v)
{
	return jdict_set(r->a, &s->vars, jv_str(name.p, name.n), v);
}

/* Assigns v to a name or unpacks it over a tuple of names. */
static int assign(struct jrender *r, const struct jnode *target, struct jscope *s, struct jv v)
{
	struct jlist *l;
	int rc;

	if (target->kind == JN_NAME)
		return jinja_scope_set(r, s, target->name, v);
	if ((rc = jv_iterate(r, v, &l)))
		return rc;
	if (l->n != target->args.n)
		return jv_fail(r, target->line, l->n > target->args.n ?
			       "too many values to unpack (expected %zu)" :
			       "not enough values to unpack (expected %zu, got %zu)",
			       target->args.n, l->n);
	for (size_t i = 0; i < l->n; i++)
		if ((rc = jinja_scope_set(r, s, target->args.v[i]->name, l->v[i])))
			return rc;
	return 0;
}

/* Runs body with its output captured into a string of the arena. */
static int capture(struct jrender *r, const struct jnlist *body, struct jscope *s,
		   struct jv *out)
{
	struct jbuf b = { .max = r->max_out }, *saved = r->out;
	char *p;
	int rc;

	r->out = &b;
	rc = jinja_exec(r, body, s);
	r->out = saved;
	if (!rc) {
		p = jarena_alloc(r->a, b.n + 1);
		if (!p) {
			rc = -ENOMEM;
		} else {
			if (b.n)
				memcpy(p, b.p, b.n);
			p[b.n] = 0;
			*out = jv_str(p, b.n);
		}
	}
	free(b.p);
	return rc;
}

/* The chain of filters f (innermost a == NULL) applied to v. */
static int apply_filters(struct jrender *r, const struct jnode *f, struct jscope *s, struct jv v,
			 struct jv *out)
{
	struct jv x = v, *args, *kwv;
	int rc;

	if (!f) {
		*out = v;
		return 0;
	}
	if (f->a && (rc = apply_filters(r, f->a, s, v, &x)))
		return rc;
	args = jarena_alloc(r->a, (f->args.n + 1) * sizeof(*args));
	kwv = jarena_alloc(r->a, (f->kw.n + 1) * sizeof(*kwv));
	if (!args || !kwv)
		return -ENOMEM;
	for (size_t i = 0; i < f->args.n; i++)
		if ((rc = jinja_eval(r, f->args.v[i], s, &args[i])))
			return rc;
	for (size_t i = 0; i < f->kw.n; i++)
		if ((rc = jinja_eval(r, f->kw.v[i], s, &kwv[i])))
			return rc;
	return jinja_filter_apply(r, f->line, f->op, x, args, f->args.n, f->kwnames, kwv, f->kw.n,
				  out);
}

static int exec_for(struct jrender *r, const struct jnode *n, struct jscope *s)
{
	struct jlist *items, *kept;
	struct jloop *loop;
	struct jv it;
	int rc, depth = 1; /* recursive loops, the only deeper ones, are refused at parse */

	if ((rc = jinja_eval(r, n->b, s, &it)) || (rc = jv_iterate(r, it, &items)))
		return rc;
	kept = items;
	if (n->c) {
		kept = jlist_new(r->a, items->n, JL_LIST);
		if (!kept)
			return -ENOMEM;
		for (size_t i = 0; i < items->n; i++) {
			struct jscope *fs = jinja_scope_new(r, s);
			struct jv c;

			if (!fs)
				return -ENOMEM;
			if ((rc = assign(r, n->a, fs, items->v[i])) ||
			    (rc = jinja_eval(r, n->c, fs, &c)))
				return rc;
			if (jv_truthy(c))
				kept->v[kept->n++] = items->v[i];
		}
	}
	loop = jarena_alloc(r->a, sizeof(*loop));
	if (!loop)
		return -ENOMEM;
	memset(loop, 0, sizeof(*loop));
	loop->items = kept;
	loop->depth = depth;
	for (size_t i = 0; i < kept->n; i++) {
		struct jscope *is = jinja_scope_new(r, s);

		if (!is)
			return -ENOMEM;
		loop->i = i;
		if ((rc = assign(r, n->a, is, kept->v[i])) ||
		    (rc = jinja_scope_set(r, is, jv_cstr("loop").s,
					  (struct jv){ .t = JV_LOOP, .loop = loop })) ||
		    (rc = jinja_exec(r, &n->body, is)))
			return rc;
		if (r->loop_ctl == 1) {
			r->loop_ctl = 0;
			break;
		}
		r->loop_ctl = 0;
	}
	if (!kept->n && n->orelse.n) {
		struct jscope *es = jinja_scope_new(r, s);

		if (!es)
			return -ENOMEM;
		return jinja_exec(r, &n->orelse, es);
	}
	return 0;
}

static int exec_set(struct jrender *r, const struct jnode *n, struct jscope *s)
{
	struct jv v, ns;
	int rc;

	if (n->kind == JN_SETBLOCK) {
		struct jscope *bs = jinja_scope_new(r, s);

		if (!bs)
			return -ENOMEM;
		if ((rc = capture(r, &n->body, bs, &v)) ||
		    (rc = apply_filters(r, n->c, s, v, &v)))
			return rc;
	} else if ((rc = jinja_eval(r, n->b, s, &v))) {
		return rc;
	}
	if (!n->name.p)
		return assign(r, n->a, s, v);
	if ((rc = jinja_lookup(r, s, n->a->name, &ns)))
		return rc;
	if (ns.t != JV_NS)
		return jv_fail(r, n->line, "cannot assign attribute on non-namespace object");
	return jdict_set(r->a, ns.d, jv_str(n->name.p, n->name.n), v);
}

static struct jv new_macro(struct jrender *r, const struct jnode *def, struct jscope *s)
{
	struct jmacro *m = jarena_alloc(r->a, sizeof(*m));

	if (!m)
		return jv_none();
	m->def = def;
	m->scope = s;
	m->caller = jv_undef();
	return (struct jv){ .t = JV_MACRO, .m = m };
}

int jinja_call_macro(struct jrender *r, int line, struct jmacro *m, struct jv *args,
		     size_t nargs, const struct jstr *kwn, struct jv *kwv, size_t nkw,
		     struct jv *out)
{
	const struct jnode *d = m->def;
	struct jscope *ms;
	size_t np = d->kw.n;
	int rc, ctl = r->loop_ctl;
	const char *name = d->kind == JN_MACRO ? "" : "caller";
	int nl = d->kind == JN_MACRO ? (int)d->name.n : 6;

	if (d->kind == JN_MACRO)
		name = d->name.p;
	if (r->depth >= MAX_CALL_DEPTH)
		return jv_fail(r, line, "macro calls nested too deeply");
	if (nargs > np)
		return jv_fail(r, line, "macro '%.*s' takes not more than %zu argument(s)", nl, name,
			       np);
	ms = jinja_scope_new(r, m->scope);
	if (!ms)
		return -ENOMEM;
	for (size_t i = 0; i < nkw; i++) {
		size_t k;

		for (k = 0; k < np; k++)
			if (d->kwnames[k].n == kwn[i].n && !memcmp(d->kwnames[k].p, kwn[i].p, kwn[i].n))
				break;
		if (k == np)
			return jv_fail(r, line, "macro '%.*s' takes no keyword argument '%.*s'", nl,
				       name, (int)kwn[i].n, kwn[i].p);
		if (k < nargs)
			return jv_fail(r, line, "macro '%.*s' got multiple values for argument "
				       "'%.*s'", nl, name, (int)kwn[i].n, kwn[i].p);
	}
	for (size_t k = 0; k < np; k++) {
		struct jv v;
		int have = 0;

		if (k < nargs) {
			v = args[k];
			have = 1;
		}
		for (size_t i = 0; i < nkw && !have; i++)
			if (d->kwnames[k].n == kwn[i].n && !memcmp(d->kwnames[k].p, kwn[i].p, kwn[i].n)) {
				v = kwv[i];
				have = 1;
			}
		if (!have && d->kw.v[k]) {
			if ((rc = jinja_eval(r, d->kw.v[k], ms, &v)))
				return rc;
			have = 1;
		}
		if (!have) {
			char *hint = jarena_alloc(r->a, d->kwnames[k].n + 40);

			if (!hint)
				return -ENOMEM;
			snprintf(hint, d->kwnames[k].n + 40, "parameter '%.*s' was not provided",
				 (int)d->kwnames[k].n, d->kwnames[k].p);
			v = jv_undef_hint(r->a, hint, 0);
		}
		if ((rc = jinja_scope_set(r, ms, d->kwnames[k], v)))
			return rc;
	}
	if (m->caller.t == JV_MACRO && (rc = jinja_scope_set(r, ms, jv_cstr("caller").s, m->caller)))
		return rc;
	r->depth++;
	rc = capture(r, &d->body, ms, out);
	r->depth--;
	r->loop_ctl = ctl;
	return rc;
}

static int exec_callblock(struct jrender *r, const struct jnode *n, struct jscope *s)
{
	const struct jnode *call = n->b;
	struct jv fn, *args, *kwv, res;
	struct jmacro m;
	int rc;

	if ((rc = jinja_eval(r, call->a, s, &fn)))
		return rc;
	if (fn.t != JV_MACRO)
		return jv_fail(r, n->line, "a call block needs a macro, not %s", jv_type_name(fn));
	args = jarena_alloc(r->a, (call->args.n + 1) * sizeof(*args));
	kwv = jarena_alloc(r->a, (call->kw.n + 1) * sizeof(*kwv));
	if (!args || !kwv)
		return -ENOMEM;
	for (size_t i = 0; i < call->args.n; i++)
		if ((rc = jinja_eval(r, call->args.v[i], s, &args[i])))
			return rc;
	for (size_t i = 0; i < call->kw.n; i++)
		if ((rc = jinja_eval(r, call->kw.v[i], s, &kwv[i])))
			return rc;
	m = *fn.m;
	m.caller = new_macro(r, n, s);
	if (m.caller.t != JV_MACRO)
		return -ENOMEM;
	if ((rc = jinja_call_macro(r, n->line, &m, args, call->args.n, call->kwnames, kwv,
				   call->kw.n, &res)))
		return rc;
	return jv_print(r, r->out, res, 0);
}

static int exec_one(struct jrender *r, const struct jnode *n, struct jscope *s)
{
	struct jv v;
	int rc;

	if (++r->steps > r->max_steps)
		return jv_fail(r, n->line, "the template runs too long");
	r->line = n->line;
	switch (n->kind) {
	case JN_DATA: return jbuf_put(r->out, n->name.p, n->name.n);
	case JN_OUTPUT:
		for (size_t i = 0; i < n->args.n; i++)
			if ((rc = jinja_eval(r, n->args.v[i], s, &v)) ||
			    (rc = jv_print(r, r->out, v, 0)))
				return rc;
		return 0;
	case JN_IF:
		if ((rc = jinja_eval(r, n->a, s, &v)))
			return rc;
		return jinja_exec(r, jv_truthy(v) ? &n->body : &n->orelse, s);
	case JN_FOR: return exec_for(r, n, s);
	case JN_SET: case JN_SETBLOCK: return exec_set(r, n, s);
	case JN_MACRO:
		v = new_macro(r, n, s);
		if (v.t != JV_MACRO)
			return -ENOMEM;
		return jinja_scope_set(r, s, n->name, v);
	case JN_CALLBLOCK: return exec_callblock(r, n, s);
	case JN_FILTERBLOCK: {
		struct jscope *fs = jinja_scope_new(r, s);

		if (!fs)
			return -ENOMEM;
		if ((rc = capture(r, &n->body, fs, &v)) || (rc = apply_filters(r, n->c, s, v, &v)))
			return rc;
		return jv_print(r, r->out, v, 0);
	}
	case JN_WITH: {
		struct jscope *ws = jinja_scope_new(r, s);

		if (!ws)
			return -ENOMEM;
		for (size_t i = 0; i < n->kw.n; i++)
			if ((rc = jinja_eval(r, n->kw.v[i], s, &v)) ||
			    (rc = jinja_scope_set(r, ws, n->kwnames[i], v)))
				return rc;
		return jinja_exec(r, &n->body, ws);
	}
	case JN_BODY: return jinja_exec(r, &n->body, s);
	case JN_BREAK: r->loop_ctl = 1; return 0;
	case JN_CONTINUE: r->loop_ctl = 2; return 0;
	}
	return jv_fail(r, n->line, "not a statement");
}

int jinja_exec(struct jrender *r, const struct jnlist *body, struct jscope *s)
{
	for (size_t i = 0; i < body->n; i++) {
		int rc = exec_one(r, body->v[i], s);

		if (rc)
			return rc;
		if (r->loop_ctl)
			return 0;
	}
	return 0;
}

int dps_jinja_parse(struct dps_jinja **out, const char *src, size_t len, char *err,
		    size_t errlen)
{
	struct dps_jinja *t = calloc(1, sizeof(*t));
	struct jtoken *toks;
	size_t n;
	int rc;

	*out = NULL;
	if (!t)
		return -ENOMEM;
	t->max_out = 64u << 20;
	t->max_mem = 1024u << 20;
	t->max_steps = 200000000LL;
	t->a.cap = len > (SIZE_MAX - (256u << 20)) / 32 ? SIZE_MAX : 32 * len + (256u << 20);
	if ((rc = jinja_lex(&t->a, src, len, &toks, &n, err, errlen)) ||
	    (rc = jinja_parse_tokens(&t->a, toks, n, &t->root, err, errlen))) {
		if (rc == -ENOMEM && t->a.over) {
			snprintf(err, errlen, "line 1: the template is too large");
			rc = -EINVAL;
		}
		dps_jinja_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

void dps_jinja_set_limits(struct dps_jinja *t, size_t max_out, size_t max_mem,
			  long long max_steps)
{
	t->max_out = max_out;
	t->max_mem = max_mem;
	t->max_steps = max_steps;
}

int dps_jinja_render(const struct dps_jinja *t, json_t *vars, long long now, char **out,
		     size_t *len, char *err, size_t errlen)
{
	struct jarena a = { .cap = t->max_mem };
	struct jbuf b = { .max = t->max_out };
	struct jrender r = { .a = &a, .vars_json = vars, .now = now, .err = err, .errlen = errlen,
			     .max_steps = t->max_steps, .max_out = t->max_out, .out = &b };
	struct jscope *root;
	struct jv v;
	int rc;

	*out = NULL;
	*len = 0;
	if (errlen)
		err[0] = 0;
	if (!json_is_object(vars)) {
		snprintf(err, errlen, "the template variables must be a JSON object");
		return -EINVAL;
	}
	rc = jv_from_json(&a, vars, &v, 0);
	if (rc == -E2BIG) {
		snprintf(err, errlen, "the template variables are nested too deeply");
		rc = -EINVAL;
		goto err;
	}
	if (rc)
		goto err;
	r.vars = v.d;
	root = jinja_scope_new(&r, NULL);
	if (!root) {
		rc = -ENOMEM;
		goto err;
	}
	if ((rc = jinja_exec(&r, &t->root->body, root)))
		goto err;
	if (!b.p && (rc = jbuf_put(&b, "", 0)))
		goto err;
	jarena_free(&a);
	*out = b.p;
	*len = b.n;
	return 0;
err:
	if (rc == -E2BIG) {
		snprintf(err, errlen, "line %d: the output exceeds %zu bytes", r.line, t->max_out);
		rc = -EINVAL;
	} else if (rc == -ENOMEM && a.over) {
		snprintf(err, errlen, "line %d: the template needs more than %zu bytes of memory",
			 r.line, t->max_mem);
		rc = -EINVAL;
	} else if (rc == -ENOMEM) {
		snprintf(err, errlen, "out of memory");
	}
	jarena_free(&a);
	free(b.p);
	return rc;
}

void dps_jinja_free(struct dps_jinja *t)
{
	if (!t)
		return;
	jarena_free(&t->a);
	free(t);
}

/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja_parse.c - the expressions of the Jinja2 parser: tokens to a syntax tree
 * with Jinja2's grammar and precedence (conditional expressions, or, and, not, comparisons,
 * + -, ~, * / // %, **, unary signs, then postfix: attributes, subscripts, slices, calls,
 * filters and tests), and the helpers jinja_stmt.c parses the statements with. Every filter
 * and test is looked up here, so a template that names one this renderer does not have
 * fails at parse time with its line.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/jinja_int.h"

int jp_fail(struct jparser *P, int line, const char *fmt, ...)
{
	va_list ap;
	int k = snprintf(P->err, P->errlen, "line %d: ", line);

	va_start(ap, fmt);
	if (k >= 0 && (size_t)k < P->errlen)
		vsnprintf(P->err + k, P->errlen - (size_t)k, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

const char *jp_desc(const struct jtoken *t)
{
	static char buf[64];

	switch (t->type) {
	case JT_EOF: return "end of template";
	case JT_DATA: return "template data";
	case JT_VAR_BEGIN: return "begin of print statement";
	case JT_VAR_END: return "end of print statement";
	case JT_BLOCK_BEGIN: return "begin of statement block";
	case JT_BLOCK_END: return "end of statement block";
	case JT_STRING: return "string";
	case JT_INT: return "integer";
	case JT_FLOAT: return "float";
	case JT_NAME:
		snprintf(buf, sizeof(buf), "'%.*s'", (int)(t->s.n < 40 ? t->s.n : 40), t->s.p);
		return buf;
	default: return "operator";
	}
}

int jp_expect(struct jparser *P, int type, const char *what)
{
	if (jp_cur(P)->type != type)
		return jp_fail(P, jp_cur(P)->line, "expected %s, got %s", what, jp_desc(jp_cur(P)));
	jp_next(P);
	return 0;
}

int jp_expect_name(struct jparser *P, const char *name)
{
	if (!jp_is_name(jp_cur(P), name))
		return jp_fail(P, jp_cur(P)->line, "expected '%s', got %s", name, jp_desc(jp_cur(P)));
	jp_next(P);
	return 0;
}

struct jnode *jp_node(struct jparser *P, int kind, int line)
{
	struct jnode *n = jarena_alloc(P->a, sizeof(*n));

	if (n) {
		memset(n, 0, sizeof(*n));
		n->kind = (uint8_t)kind;
		n->line = line;
	}
	return n;
}

int jp_push(struct jparser *P, struct jnbuild *b, struct jnode *n, struct jstr name)
{
	if (b->l.n == b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 4;
		struct jnode **v = jarena_alloc(P->a, cap * sizeof(*v));
		struct jstr *nm = jarena_alloc(P->a, cap * sizeof(*nm));

		if (!v || !nm)
			return -ENOMEM;
		if (b->l.n) {
			memcpy(v, b->l.v, b->l.n * sizeof(*v));
			memcpy(nm, b->names, b->l.n * sizeof(*nm));
		}
		b->l.v = v;
		b->names = nm;
		b->cap = cap;
	}
	b->names[b->l.n] = name;
	b->l.v[b->l.n++] = n;
	return 0;
}

static int parse_unary(struct jparser *P, int with_filter, struct jnode **out);
static int parse_postfix(struct jparser *P, struct jnode **n);

int jp_enter(struct jparser *P)
{
	if (++P->depth > JP_MAX_DEPTH)
		return jp_fail(P, jp_cur(P)->line, "the template is nested too deeply");
	return 0;
}

static int parse_condexpr(struct jparser *P, struct jnode **out)
{
	struct jnode *e1, *c;
	int rc;

	if ((rc = jp_expression(P, 0, &e1)))
		return rc;
	while (jp_is_name(jp_cur(P), "if")) {
		int line = jp_cur(P)->line;

		jp_next(P);
		c = jp_node(P, JN_COND, line);
		if (!c)
			return -ENOMEM;
		c->b = e1;
		if ((rc = jp_expression(P, 0, &c->a)))
			return rc;
		if (jp_is_name(jp_cur(P), "else")) {
			jp_next(P);
			if ((rc = jp_enter(P)) || (rc = parse_condexpr(P, &c->c)))
				return rc;
			P->depth--;
		}
		e1 = c;
	}
	*out = e1;
	return 0;
}

static int parse_compare(struct jparser *P, struct jnode **out);

static int parse_not(struct jparser *P, struct jnode **out)
{
	int rc;

	if (jp_is_name(jp_cur(P), "not")) {
		struct jnode *n = jp_node(P, JN_NOT, jp_cur(P)->line);

		if (!n)
			return -ENOMEM;
		jp_next(P);
		if ((rc = jp_enter(P)) || (rc = parse_not(P, &n->a)))
			return rc;
		P->depth--;
		*out = n;
		return 0;
	}
	return parse_compare(P, out);
}

/* A left-associative chain of operand (op operand)*: "and" over not, "or" over "and". */
static int parse_chain(struct jparser *P, const char *op, int kind,
		       int (*operand)(struct jparser *, struct jnode **), struct jnode **out)
{
	struct jnode *l;
	int rc = operand(P, &l);

	while (!rc && jp_is_name(jp_cur(P), op)) {
		struct jnode *n = jp_node(P, kind, jp_cur(P)->line);

		if (!n)
			return -ENOMEM;
		jp_next(P);
		n->a = l;
		rc = operand(P, &n->b);
		l = n;
	}
	*out = l;
	return rc;
}

static int parse_and(struct jparser *P, struct jnode **out)
{
	return parse_chain(P, "and", JN_AND, parse_not, out);
}

static int parse_or(struct jparser *P, struct jnode **out)
{
	return parse_chain(P, "or", JN_OR, parse_and, out);
}

int jp_expression(struct jparser *P, int condexpr, struct jnode **out)
{
	int rc;

	if ((rc = jp_enter(P)))
		return rc;
	rc = condexpr ? parse_condexpr(P, out) : parse_or(P, out);
	P->depth--;
	return rc;
}

/* The binary levels below comparisons, from loosest to tightest. */
static int parse_level(struct jparser *P, int level, struct jnode **out)
{
	static const int ops[4][5] = {
		{ JT_ADD, JT_SUB, 0 }, { JT_TILDE, 0 }, { JT_MUL, JT_DIV, JT_FLOORDIV, JT_MOD, 0 },
		{ JT_POW, 0 },
	};
	struct jnode *l, *n;
	int rc;

	if (level == 4)
		return parse_unary(P, 1, out);
	if ((rc = parse_level(P, level + 1, &l)))
		return rc;
	if (level == 1 && jp_cur(P)->type == JT_TILDE) {
		struct jnbuild b = { 0 };

		n = jp_node(P, JN_CONCAT, jp_cur(P)->line);
		if (!n || jp_push(P, &b, l, (struct jstr){ 0 }))
			return -ENOMEM;
		while (jp_cur(P)->type == JT_TILDE) {
			jp_next(P);
			if ((rc = parse_level(P, 2, &l)))
				return rc;
			if (jp_push(P, &b, l, (struct jstr){ 0 }))
				return -ENOMEM;
		}
		n->args = b.l;
		*out = n;
		return 0;
	}
	for (;;) {
		int t = jp_cur(P)->type, hit = 0;

		for (int k = 0; ops[level][k]; k++)
			hit |= ops[level][k] == t;
		if (!hit)
			break;
		n = jp_node(P, JN_BINOP, jp_cur(P)->line);
		if (!n)
			return -ENOMEM;
		n->op = t;
		jp_next(P);
		n->a = l;
		if ((rc = parse_level(P, level + 1, &n->b)))
			return rc;
		l = n;
	}
	*out = l;
	return 0;
}

enum { OP_IN = 100, OP_NOTIN = 101 };

static int parse_compare(struct jparser *P, struct jnode **out)
{
	struct jnode *e, *n = NULL;
	struct jnbuild b = { 0 };
	int rc, *ops = NULL;
	size_t opcap = 0;

	if ((rc = parse_level(P, 0, &e)))
		return rc;
	for (;;) {
		int t = jp_cur(P)->type, op;
		struct jnode *rhs;

		if (t == JT_EQ || t == JT_NE || t == JT_LT || t == JT_LTEQ || t == JT_GT ||
		    t == JT_GTEQ) {
			op = t;
			jp_next(P);
		} else if (jp_is_name(jp_cur(P), "in")) {
			op = OP_IN;
			jp_next(P);
		} else if (jp_is_name(jp_cur(P), "not") && jp_is_name(jp_look(P), "in")) {
			op = OP_NOTIN;
			jp_next(P);
			jp_next(P);
		} else {
			break;
		}
		if (!n && !(n = jp_node(P, JN_COMPARE, jp_cur(P)->line)))
			return -ENOMEM;
		if ((rc = parse_level(P, 0, &rhs)))
			return rc;
		if (b.l.n == opcap) {
			int *no = jarena_alloc(P->a, (opcap ? opcap * 2 : 4) * sizeof(*no));

			if (!no)
				return -ENOMEM;
			if (opcap)
				memcpy(no, ops, opcap * sizeof(*no));
			ops = no;
			opcap = opcap ? opcap * 2 : 4;
		}
		ops[b.l.n] = op;
		if (jp_push(P, &b, rhs, (struct jstr){ 0 }))
			return -ENOMEM;
	}
	if (!n) {
		*out = e;
		return 0;
	}
	n->a = e;
	n->args = b.l;
	n->ops = ops;
	*out = n;
	return 0;
}

/* ( args, name=kw ) into n->args, n->kw, n->kwnames. */
static int parse_call_args(struct jparser *P, struct jnode *n)
{
	struct jnbuild args = { 0 }, kw = { 0 };
	int line = jp_cur(P)->line, rc;

	if ((rc = jp_expect(P, JT_LPAREN, "'('")))
		return rc;
	while (jp_cur(P)->type != JT_RPAREN) {
		struct jnode *e;

		if (args.l.n || kw.l.n) {
			if ((rc = jp_expect(P, JT_COMMA, "','")))
				return rc;
			if (jp_cur(P)->type == JT_RPAREN)
				break;
		}
		if (jp_cur(P)->type == JT_MUL || jp_cur(P)->type == JT_POW)
			return jp_fail(P, jp_cur(P)->line, "*args and **kwargs are not supported");
		if (jp_cur(P)->type == JT_NAME && jp_look(P)->type == JT_ASSIGN) {
			struct jstr name = jp_cur(P)->s;

			jp_next(P);
			jp_next(P);
			if ((rc = jp_expression(P, 1, &e)))
				return rc;
			if (jp_push(P, &kw, e, name))
				return -ENOMEM;
		} else {
			if (kw.l.n)
				return jp_fail(P, line, "invalid syntax for function call expression");
			if ((rc = jp_expression(P, 1, &e)))
				return rc;
			if (jp_push(P, &args, e, (struct jstr){ 0 }))
				return -ENOMEM;
		}
	}
	jp_next(P);
	n->args = args.l;
	n->kw = kw.l;
	n->kwnames = kw.names;
	return 0;
}

/* A constant string argument naming a filter or test must name one we have. */
static int check_name_arg(struct jparser *P, struct jnode *f, size_t idx, int test)
{
	struct jnode *a;

	if (idx >= f->args.n)
		return 0;
	a = f->args.v[idx];
	if (a->kind != JN_CONST || a->val.t != JV_STR)
		return 0;
	if (test ? jinja_test_find(a->val.s.p, a->val.s.n) < 0 :
		   jinja_filter_find(a->val.s.p, a->val.s.n) < 0)
		return jp_fail(P, a->line, "unknown %s '%.*s'", test ? "test" : "filter",
			     (int)a->val.s.n, a->val.s.p);
	return 0;
}

/* Filters after a pipe (or the first one of a filter block: inline). */
int jp_filter(struct jparser *P, struct jnode **n, int inline_first)
{
	int rc;

	while (jp_cur(P)->type == JT_PIPE || inline_first) {
		struct jnode *f;
		const struct jtoken *t;
		char name[64];

		if (!inline_first)
			jp_next(P);
		inline_first = 0;
		t = jp_cur(P);
		if (t->type != JT_NAME)
			return jp_fail(P, t->line, "expected a filter name, got %s", jp_desc(t));
		jp_next(P);
		if (jp_cur(P)->type == JT_DOT || jinja_filter_find(t->s.p, t->s.n) < 0) {
			snprintf(name, sizeof(name), "%.*s", (int)(t->s.n < 40 ? t->s.n : 40), t->s.p);
			return jp_fail(P, t->line, "unknown filter '%s'", name);
		}
		f = jp_node(P, JN_FILTER, t->line);
		if (!f)
			return -ENOMEM;
		f->op = jinja_filter_find(t->s.p, t->s.n);
		f->name = t->s;
		f->a = *n;
		if (jp_cur(P)->type == JT_LPAREN && (rc = parse_call_args(P, f)))
			return rc;
		if (jp_is_name(t, "map") && (rc = check_name_arg(P, f, 0, 0)))
			return rc;
		if ((jp_is_name(t, "select") || jp_is_name(t, "reject")) &&
		    (rc = check_name_arg(P, f, 0, 1)))
			return rc;
		if ((jp_is_name(t, "selectattr") || jp_is_name(t, "rejectattr")) &&
		    (rc = check_name_arg(P, f, 1, 1)))
			return rc;
		*n = f;
	}
	return 0;
}

static int parse_test(struct jparser *P, struct jnode **n)
{
	int line = jp_cur(P)->line, negated = 0, rc;
	const struct jtoken *t;
	struct jnode *x;

	jp_next(P); /* is */
	if (jp_is_name(jp_cur(P), "not")) {
		negated = 1;
		jp_next(P);
	}
	t = jp_cur(P);
	if (t->type != JT_NAME)
		return jp_fail(P, t->line, "expected a test name, got %s", jp_desc(t));
	jp_next(P);
	if (jp_cur(P)->type == JT_DOT || jinja_test_find(t->s.p, t->s.n) < 0)
		return jp_fail(P, t->line, "unknown test '%.*s'", (int)(t->s.n < 40 ? t->s.n : 40),
			     t->s.p);
	x = jp_node(P, JN_TEST, line);
	if (!x)
		return -ENOMEM;
	x->op = jinja_test_find(t->s.p, t->s.n);
	x->name = t->s;
	x->a = *n;
	if (jp_cur(P)->type == JT_LPAREN) {
		if ((rc = parse_call_args(P, x)))
			return rc;
	} else {
		int ty = jp_cur(P)->type;

		if ((ty == JT_NAME || ty == JT_STRING || ty == JT_INT || ty == JT_FLOAT ||
		     ty == JT_LPAREN || ty == JT_LBRACKET || ty == JT_LBRACE) &&
		    !jp_is_name(jp_cur(P), "else") && !jp_is_name(jp_cur(P), "or") && !jp_is_name(jp_cur(P), "and")) {
			struct jnbuild b = { 0 };
			struct jnode *arg;

			if (jp_is_name(jp_cur(P), "is"))
				return jp_fail(P, jp_cur(P)->line, "You cannot chain multiple tests with is");
			if ((rc = jp_primary(P, &arg)) || (rc = parse_postfix(P, &arg)))
				return rc;
			if (jp_push(P, &b, arg, (struct jstr){ 0 }))
				return -ENOMEM;
			x->args = b.l;
		}
	}
	if (negated) {
		struct jnode *no = jp_node(P, JN_NOT, line);

		if (!no)
			return -ENOMEM;
		no->a = x;
		x = no;
	}
	*n = x;
	return 0;
}

static int parse_subscribed(struct jparser *P, struct jnode **out)
{
	struct jnode *s, *e = NULL;
	int line = jp_cur(P)->line, rc;

	if (jp_cur(P)->type != JT_COLON) {
		if ((rc = jp_expression(P, 1, &e)))
			return rc;
		if (jp_cur(P)->type != JT_COLON) {
			*out = e;
			return 0;
		}
	}
	jp_next(P);
	s = jp_node(P, JN_SLICE, line);
	if (!s)
		return -ENOMEM;
	s->a = e;
	if (jp_cur(P)->type != JT_COLON && jp_cur(P)->type != JT_RBRACKET && jp_cur(P)->type != JT_COMMA &&
	    (rc = jp_expression(P, 1, &s->b)))
		return rc;
	if (jp_cur(P)->type == JT_COLON) {
		jp_next(P);
		if (jp_cur(P)->type != JT_RBRACKET && jp_cur(P)->type != JT_COMMA &&
		    (rc = jp_expression(P, 1, &s->c)))
			return rc;
	}
	*out = s;
	return 0;
}

static int parse_postfix(struct jparser *P, struct jnode **n)
{
	int rc;

	for (;;) {
		const struct jtoken *t = jp_cur(P);
		struct jnode *x;

		if (t->type == JT_DOT) {
			jp_next(P);
			if (jp_cur(P)->type == JT_NAME) {
				x = jp_node(P, JN_GETATTR, t->line);
				if (!x)
					return -ENOMEM;
				x->name = jp_cur(P)->s;
			} else if (jp_cur(P)->type == JT_INT) {
				x = jp_node(P, JN_GETITEM, t->line);
				if (!x || !(x->b = jp_node(P, JN_CONST, t->line)))
					return -ENOMEM;
				x->b->val = jv_int(jp_cur(P)->i);
			} else {
				return jp_fail(P, jp_cur(P)->line, "expected name or number");
			}
			jp_next(P);
			x->a = *n;
		} else if (t->type == JT_LBRACKET) {
			struct jnbuild b = { 0 };

			jp_next(P);
			while (jp_cur(P)->type != JT_RBRACKET) {
				struct jnode *s;

				if (b.l.n && (rc = jp_expect(P, JT_COMMA, "','")))
					return rc;
				if ((rc = parse_subscribed(P, &s)))
					return rc;
				if (jp_push(P, &b, s, (struct jstr){ 0 }))
					return -ENOMEM;
			}
			jp_next(P);
			if (!b.l.n)
				return jp_fail(P, t->line, "expected subscript expression");
			x = jp_node(P, JN_GETITEM, t->line);
			if (!x)
				return -ENOMEM;
			x->a = *n;
			if (b.l.n == 1) {
				x->b = b.l.v[0];
			} else {
				if (!(x->b = jp_node(P, JN_TUPLE, t->line)))
					return -ENOMEM;
				x->b->args = b.l;
			}
		} else if (t->type == JT_LPAREN) {
			x = jp_node(P, JN_CALL, t->line);
			if (!x)
				return -ENOMEM;
			x->a = *n;
			if ((rc = parse_call_args(P, x)))
				return rc;
		} else {
			return 0;
		}
		*n = x;
	}
}

static int parse_filter_expr(struct jparser *P, struct jnode **n)
{
	int rc;

	for (;;) {
		if (jp_cur(P)->type == JT_PIPE) {
			if ((rc = jp_filter(P, n, 0)))
				return rc;
		} else if (jp_is_name(jp_cur(P), "is")) {
			if ((rc = parse_test(P, n)))
				return rc;
		} else if (jp_cur(P)->type == JT_LPAREN) {
			struct jnode *x = jp_node(P, JN_CALL, jp_cur(P)->line);

			if (!x)
				return -ENOMEM;
			x->a = *n;
			if ((rc = parse_call_args(P, x)))
				return rc;
			*n = x;
		} else {
			return 0;
		}
	}
}

static int parse_unary(struct jparser *P, int with_filter, struct jnode **out)
{
	const struct jtoken *t = jp_cur(P);
	struct jnode *n;
	int rc;

	if ((rc = jp_enter(P)))
		return rc;
	if (t->type == JT_SUB || t->type == JT_ADD) {
		n = jp_node(P, t->type == JT_SUB ? JN_NEG : JN_POS, t->line);
		if (!n)
			return -ENOMEM;
		jp_next(P);
		if ((rc = parse_unary(P, 0, &n->a)))
			return rc;
	} else if ((rc = jp_primary(P, &n))) {
		return rc;
	}
	if ((rc = parse_postfix(P, &n)))
		return rc;
	if (with_filter && (rc = parse_filter_expr(P, &n)))
		return rc;
	P->depth--;
	*out = n;
	return 0;
}

int jp_primary(struct jparser *P, struct jnode **out)
{
	const struct jtoken *t = jp_cur(P);
	struct jnode *n;
	int rc;

	if ((rc = jp_enter(P)))
		return rc;
	switch (t->type) {
	case JT_NAME:
		n = jp_node(P, JN_CONST, t->line);
		if (!n)
			return -ENOMEM;
		if (jp_is_name(t, "true") || jp_is_name(t, "True")) {
			n->val = jv_bool(1);
		} else if (jp_is_name(t, "false") || jp_is_name(t, "False")) {
			n->val = jv_bool(0);
		} else if (jp_is_name(t, "none") || jp_is_name(t, "None")) {
			n->val = jv_none();
		} else {
			n->kind = JN_NAME;
			n->name = t->s;
		}
		jp_next(P);
		break;
	case JT_STRING: {
		size_t len = 0, k = 0;
		char *p;

		for (size_t j = P->i; P->t[j].type == JT_STRING; j++)
			len += P->t[j].s.n;
		p = jarena_alloc(P->a, len + 1);
		n = jp_node(P, JN_CONST, t->line);
		if (!p || !n)
			return -ENOMEM;
		while (jp_cur(P)->type == JT_STRING) {
			memcpy(p + k, jp_cur(P)->s.p, jp_cur(P)->s.n);
			k += jp_cur(P)->s.n;
			jp_next(P);
		}
		p[k] = 0;
		n->val = jv_str(p, k);
		break;
	}
	case JT_INT: case JT_FLOAT:
		n = jp_node(P, JN_CONST, t->line);
		if (!n)
			return -ENOMEM;
		n->val = t->type == JT_INT ? jv_int(t->i) : jv_float(t->f);
		jp_next(P);
		break;
	case JT_LPAREN:
		jp_next(P);
		if ((rc = jp_tuple(P, 0, 1, NULL, 1, &n)) || (rc = jp_expect(P, JT_RPAREN, "')'")))
			return rc;
		break;
	case JT_LBRACKET: case JT_LBRACE: {
		struct jnbuild items = { 0 }, vals = { 0 };
		int close = t->type == JT_LBRACKET ? JT_RBRACKET : JT_RBRACE;

		n = jp_node(P, t->type == JT_LBRACKET ? JN_LIST : JN_DICT, t->line);
		if (!n)
			return -ENOMEM;
		jp_next(P);
		while (jp_cur(P)->type != close) {
			struct jnode *e;

			if (items.l.n && (rc = jp_expect(P, JT_COMMA, "','")))
				return rc;
			if (jp_cur(P)->type == close)
				break;
			if ((rc = jp_expression(P, 1, &e)))
				return rc;
			if (jp_push(P, &items, e, (struct jstr){ 0 }))
				return -ENOMEM;
			if (close == JT_RBRACE) {
				if ((rc = jp_expect(P, JT_COLON, "':'")) || (rc = jp_expression(P, 1, &e)))
					return rc;
				if (jp_push(P, &vals, e, (struct jstr){ 0 }))
					return -ENOMEM;
			}
		}
		jp_next(P);
		n->args = items.l;
		n->kw = vals.l;
		break;
	}
	default:
		return jp_fail(P, t->line, "unexpected %s", jp_desc(t));
	}
	P->depth--;
	*out = n;
	return 0;
}

static int tuple_end(struct jparser *P, const char *extra_end)
{
	int t = jp_cur(P)->type;

	return t == JT_VAR_END || t == JT_BLOCK_END || t == JT_RPAREN ||
	       (extra_end && jp_is_name(jp_cur(P), extra_end));
}

int jp_tuple(struct jparser *P, int simplified, int condexpr, const char *extra_end,
		       int explicit_parens, struct jnode **out)
{
	struct jnbuild b = { 0 };
	int line = jp_cur(P)->line, is_tuple = 0, rc;
	struct jnode *n;

	for (;;) {
		struct jnode *e;

		if (b.l.n && (rc = jp_expect(P, JT_COMMA, "','")))
			return rc;
		if (tuple_end(P, extra_end))
			break;
		rc = simplified ? jp_primary(P, &e) : jp_expression(P, condexpr, &e);
		if (rc)
			return rc;
		if (jp_push(P, &b, e, (struct jstr){ 0 }))
			return -ENOMEM;
		if (jp_cur(P)->type != JT_COMMA)
			break;
		is_tuple = 1;
	}
	if (!is_tuple) {
		if (b.l.n) {
			*out = b.l.v[0];
			return 0;
		}
		if (!explicit_parens)
			return jp_fail(P, jp_cur(P)->line, "expected an expression, got %s",
				     jp_desc(jp_cur(P)));
	}
	n = jp_node(P, JN_TUPLE, line);
	if (!n)
		return -ENOMEM;
	n->args = b.l;
	*out = n;
	return 0;
}


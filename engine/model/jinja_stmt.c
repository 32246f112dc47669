/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja_stmt.c - the statements of the Jinja2 parser (jinja_parse.c parses the
 * expressions): if/elif/else, for with an else and a filter, set and block set (with
 * namespace attributes), macro, call, filter blocks, with, print, break and continue, and
 * transformers' generation block; Jinja2's statements that chat templates do not use
 * (extends, include, import, block, ...) and unknown ones fail naming the line. The body of
 * the template, and the entry point jinja_parse_tokens, called by dps_jinja_parse.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/jinja_int.h"

static int jp_subparse(struct jparser *P, const char *const *end, struct jnlist *body);

/* A target of set, for or with: a name or a tuple of names. */
static int parse_target(struct jparser *P, const char *extra_end, struct jnode **out)
{
	struct jnode *t;
	int rc = jp_tuple(P, 1, 0, extra_end, 0, &t);

	if (rc)
		return rc;
	if (t->kind == JN_TUPLE) {
		for (size_t i = 0; i < t->args.n; i++)
			if (t->args.v[i]->kind != JN_NAME)
				return jp_fail(P, t->line, "can't assign to this expression");
	} else if (t->kind != JN_NAME) {
		return jp_fail(P, t->line, "can't assign to this expression");
	}
	*out = t;
	return 0;
}

/* Statements between here and one of the names of end (NULL-terminated); the cursor is left
 * on the end name. */
static int parse_body(struct jparser *P, const char *const *end, struct jnlist *body)
{
	int rc;

	if (jp_cur(P)->type == JT_COLON)
		jp_next(P);
	if ((rc = jp_expect(P, JT_BLOCK_END, "end of statement block")))
		return rc;
	return jp_subparse(P, end, body);
}

static int parse_signature(struct jparser *P, struct jnode *n)
{
	struct jnbuild params = { 0 }, defs = { 0 };
	int rc;

	if ((rc = jp_expect(P, JT_LPAREN, "'('")))
		return rc;
	while (jp_cur(P)->type != JT_RPAREN) {
		struct jnode *d = NULL;
		struct jstr name;

		if (params.l.n && (rc = jp_expect(P, JT_COMMA, "','")))
			return rc;
		if (jp_cur(P)->type != JT_NAME)
			return jp_fail(P, jp_cur(P)->line, "expected a parameter name");
		name = jp_cur(P)->s;
		jp_next(P);
		if (jp_cur(P)->type == JT_ASSIGN) {
			jp_next(P);
			if ((rc = jp_expression(P, 1, &d)))
				return rc;
		} else if (defs.l.n && defs.l.v[defs.l.n - 1]) {
			return jp_fail(P, jp_cur(P)->line, "non-default argument follows default argument");
		}
		if (jp_push(P, &params, NULL, name) || jp_push(P, &defs, d, name))
			return -ENOMEM;
	}
	jp_next(P);
	n->kwnames = params.names;
	n->kw = defs.l;
	return 0;
}

static int parse_statement(struct jparser *P, struct jnode **out)
{
	static const char *const end_for[] = { "endfor", "else", NULL };
	static const char *const end_for2[] = { "endfor", NULL };
	static const char *const end_if[] = { "elif", "else", "endif", NULL };
	static const char *const end_if2[] = { "endif", NULL };
	static const char *const unsupported[] = { "block", "extends", "include", "import", "from",
						   "autoescape", "do", "trans", "pluralize", NULL };
	const struct jtoken *t = jp_cur(P);
	struct jnode *n;
	int rc, line = t->line;

	if (t->type != JT_NAME)
		return jp_fail(P, line, "tag name expected");
	for (int i = 0; unsupported[i]; i++)
		if (jp_is_name(t, unsupported[i]))
			return jp_fail(P, line, "unsupported statement '%s'", unsupported[i]);
	n = jp_node(P, JN_BODY, line);
	if (!n)
		return -ENOMEM;
	*out = n;
	if (jp_is_name(t, "for")) {
		n->kind = JN_FOR;
		jp_next(P);
		if ((rc = parse_target(P, "in", &n->a)) || (rc = jp_expect_name(P, "in")) ||
		    (rc = jp_tuple(P, 0, 0, "recursive", 0, &n->b)))
			return rc;
		if (jp_is_name(jp_cur(P), "if")) {
			jp_next(P);
			if ((rc = jp_expression(P, 1, &n->c)))
				return rc;
		}
		if (jp_is_name(jp_cur(P), "recursive"))
			return jp_fail(P, line, "recursive for loops are not supported");
		P->loops++;
		rc = parse_body(P, end_for, &n->body);
		P->loops--;
		if (rc)
			return rc;
		if (jp_is_name(jp_cur(P), "else")) {
			jp_next(P);
			if ((rc = parse_body(P, end_for2, &n->orelse)))
				return rc;
		}
		jp_next(P);
		return 0;
	}
	if (jp_is_name(t, "if")) {
		struct jnode *cond = n;

		n->kind = JN_IF;
		jp_next(P);
		for (;;) {
			if ((rc = jp_tuple(P, 0, 0, NULL, 0, &cond->a)) ||
			    (rc = parse_body(P, end_if, &cond->body)))
				return rc;
			if (jp_is_name(jp_cur(P), "elif")) {
				struct jnode *e = jp_node(P, JN_IF, jp_cur(P)->line);
				struct jnode **v = jarena_alloc(P->a, sizeof(*v));

				if (!e || !v)
					return -ENOMEM;
				jp_next(P);
				v[0] = e;
				cond->orelse.v = v;
				cond->orelse.n = 1;
				cond = e;
				continue;
			}
			if (jp_is_name(jp_cur(P), "else")) {
				jp_next(P);
				if ((rc = parse_body(P, end_if2, &cond->orelse)))
					return rc;
			}
			jp_next(P);
			return 0;
		}
	}
	if (jp_is_name(t, "set")) {
		static const char *const end_set[] = { "endset", NULL };

		n->kind = JN_SET;
		jp_next(P);
		if (jp_cur(P)->type == JT_NAME && jp_look(P)->type == JT_DOT) {
			if (!(n->a = jp_node(P, JN_NAME, jp_cur(P)->line)))
				return -ENOMEM;
			n->a->name = jp_cur(P)->s;
			jp_next(P);
			jp_next(P);
			if (jp_cur(P)->type != JT_NAME)
				return jp_fail(P, jp_cur(P)->line, "expected an attribute name");
			n->name = jp_cur(P)->s;
			jp_next(P);
		} else if ((rc = parse_target(P, NULL, &n->a))) {
			return rc;
		}
		if (jp_cur(P)->type == JT_ASSIGN) {
			jp_next(P);
			return jp_tuple(P, 0, 1, NULL, 0, &n->b);
		}
		n->kind = JN_SETBLOCK;
		if ((rc = jp_filter(P, &n->c, 0)) || (rc = parse_body(P, end_set, &n->body)))
			return rc;
		jp_next(P);
		return 0;
	}
	if (jp_is_name(t, "macro") || jp_is_name(t, "call")) {
		static const char *const end_macro[] = { "endmacro", NULL };
		static const char *const end_call[] = { "endcall", NULL };
		int macro = jp_is_name(t, "macro"), loops = P->loops;

		jp_next(P);
		n->kind = macro ? JN_MACRO : JN_CALLBLOCK;
		if (macro) {
			if (jp_cur(P)->type != JT_NAME)
				return jp_fail(P, jp_cur(P)->line, "expected a macro name");
			n->name = jp_cur(P)->s;
			jp_next(P);
		}
		if ((macro || jp_cur(P)->type == JT_LPAREN) && (rc = parse_signature(P, n)))
			return rc;
		if (!macro) {
			if ((rc = jp_expression(P, 1, &n->b)))
				return rc;
			if (n->b->kind != JN_CALL)
				return jp_fail(P, line, "expected call");
		}
		P->loops = 0;
		rc = parse_body(P, macro ? end_macro : end_call, &n->body);
		P->loops = loops;
		if (rc)
			return rc;
		jp_next(P);
		return 0;
	}
	if (jp_is_name(t, "filter")) {
		static const char *const end_filter[] = { "endfilter", NULL };

		n->kind = JN_FILTERBLOCK;
		jp_next(P);
		if ((rc = jp_filter(P, &n->c, 1)) || (rc = parse_body(P, end_filter, &n->body)))
			return rc;
		jp_next(P);
		return 0;
	}
	if (jp_is_name(t, "with")) {
		static const char *const end_with[] = { "endwith", NULL };
		struct jnbuild b = { 0 };

		n->kind = JN_WITH;
		jp_next(P);
		while (jp_cur(P)->type != JT_BLOCK_END) {
			struct jnode *e;
			struct jstr name;

			if (b.l.n && (rc = jp_expect(P, JT_COMMA, "','")))
				return rc;
			if (jp_cur(P)->type != JT_NAME)
				return jp_fail(P, jp_cur(P)->line, "expected a name");
			name = jp_cur(P)->s;
			jp_next(P);
			if ((rc = jp_expect(P, JT_ASSIGN, "'='")) || (rc = jp_expression(P, 1, &e)))
				return rc;
			if (jp_push(P, &b, e, name))
				return -ENOMEM;
		}
		n->kw = b.l;
		n->kwnames = b.names;
		if ((rc = parse_body(P, end_with, &n->body)))
			return rc;
		jp_next(P);
		return 0;
	}
	if (jp_is_name(t, "generation")) {
		static const char *const end_gen[] = { "endgeneration", NULL };

		jp_next(P);
		if ((rc = parse_body(P, end_gen, &n->body)))
			return rc;
		jp_next(P);
		return 0;
	}
	if (jp_is_name(t, "print")) {
		struct jnbuild b = { 0 };

		n->kind = JN_OUTPUT;
		jp_next(P);
		while (jp_cur(P)->type != JT_BLOCK_END) {
			struct jnode *e;

			if (b.l.n && (rc = jp_expect(P, JT_COMMA, "','")))
				return rc;
			if ((rc = jp_expression(P, 1, &e)))
				return rc;
			if (jp_push(P, &b, e, (struct jstr){ 0 }))
				return -ENOMEM;
		}
		n->args = b.l;
		return 0;
	}
	if (jp_is_name(t, "break") || jp_is_name(t, "continue")) {
		if (!P->loops)
			return jp_fail(P, line, "'%.*s' outside of a for loop", (int)t->s.n, t->s.p);
		n->kind = jp_is_name(t, "break") ? JN_BREAK : JN_CONTINUE;
		jp_next(P);
		return 0;
	}
	return jp_fail(P, line, "unknown statement '%.*s'", (int)(t->s.n < 40 ? t->s.n : 40), t->s.p);
}

static int jp_subparse(struct jparser *P, const char *const *end, struct jnlist *body)
{
	struct jnbuild b = { 0 };
	int rc;

	if ((rc = jp_enter(P)))
		return rc;
	for (;;) {
		const struct jtoken *t = jp_cur(P);
		struct jnode *n = NULL;

		if (t->type == JT_EOF) {
			if (end)
				return jp_fail(P, t->line, "unexpected end of template, expected '%s'",
					     end[0]);
			break;
		}
		if (t->type == JT_DATA) {
			if (!(n = jp_node(P, JN_DATA, t->line)))
				return -ENOMEM;
			n->name = t->s;
			jp_next(P);
		} else if (t->type == JT_VAR_BEGIN) {
			jp_next(P);
			if (!(n = jp_node(P, JN_OUTPUT, t->line)) || jp_push(P, &b, n, (struct jstr){ 0 }))
				return -ENOMEM;
			if (!(n->args.v = jarena_alloc(P->a, sizeof(*n->args.v))))
				return -ENOMEM;
			n->args.n = 1;
			if ((rc = jp_tuple(P, 0, 1, NULL, 0, &n->args.v[0])) ||
			    (rc = jp_expect(P, JT_VAR_END, "end of print statement")))
				return rc;
			continue;
		} else if (t->type == JT_BLOCK_BEGIN) {
			jp_next(P);
			if (end)
				for (int i = 0; end[i]; i++)
					if (jp_is_name(jp_cur(P), end[i])) {
						body->v = b.l.v;
						body->n = b.l.n;
						P->depth--;
						return 0;
					}
			if (jp_cur(P)->type == JT_NAME) {
				static const char *const enders[] = {
					"endfor", "endif", "elif", "else", "endset", "endmacro",
					"endcall", "endfilter", "endwith", "endgeneration", NULL };

				for (int i = 0; enders[i]; i++)
					if (jp_is_name(jp_cur(P), enders[i]))
						return jp_fail(P, jp_cur(P)->line, "unexpected '%s'",
							     enders[i]);
			}
			if ((rc = parse_statement(P, &n)) ||
			    (rc = jp_expect(P, JT_BLOCK_END, "end of statement block")))
				return rc;
		} else {
			return jp_fail(P, t->line, "unexpected %s", jp_desc(t));
		}
		if (jp_push(P, &b, n, (struct jstr){ 0 }))
			return -ENOMEM;
	}
	body->v = b.l.v;
	body->n = b.l.n;
	P->depth--;
	return 0;
}

int jinja_parse_tokens(struct jarena *a, const struct jtoken *toks, size_t n,
		       struct jnode **root, char *err, size_t errlen)
{
	struct jparser P = { .a = a, .t = toks, .n = n, .err = err, .errlen = errlen };
	struct jnode *r = jp_node(&P, JN_BODY, 1);

	if (!r)
		return -ENOMEM;
	*root = r;
	return jp_subparse(&P, NULL, &r->body);
}

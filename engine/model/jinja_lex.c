/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja_lex.c - the lexer of the Jinja2 renderer: template source to tokens, with
 * Jinja2's rules for the environment transformers uses (trim_blocks and lstrip_blocks on,
 * keep_trailing_newline off): newlines normalised to "\n" and one trailing newline dropped;
 * "-" and "+" at a tag's edges; a block or comment tag alone on its line takes its indent
 * and its newline with it; string literals decoded as Python's unicode-escape does.
 * Called by dps_jinja_parse (jinja_parse.c) only.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/jinja_int.h"

struct lexer {
	struct jarena *a;
	const char *s;
	size_t n, pos;
	int line;        /* line of pos */
	size_t line_pos; /* the position line was computed for */
	int line_starting;
	struct jtoken *t;
	size_t nt, cap;
	char *err;
	size_t errlen;
	int balance;
	char stack[256]; /* the closing brackets expected */
};

static int lex_fail(struct lexer *L, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int lex_fail(struct lexer *L, int line, const char *fmt, ...)
{
	va_list ap;
	int k = snprintf(L->err, L->errlen, "line %d: ", line);

	va_start(ap, fmt);
	if (k >= 0 && (size_t)k < L->errlen)
		vsnprintf(L->err + k, L->errlen - (size_t)k, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static int line_of(struct lexer *L, size_t pos)
{
	for (; L->line_pos < pos; L->line_pos++)
		if (L->s[L->line_pos] == '\n')
			L->line++;
	return L->line;
}

static int emit(struct lexer *L, int type, size_t at, struct jtoken **out)
{
	if (L->nt == L->cap) {
		size_t cap = L->cap ? L->cap * 2 : 256;
		struct jtoken *t = jarena_alloc(L->a, cap * sizeof(*t));

		if (!t)
			return -ENOMEM;
		if (L->nt)
			memcpy(t, L->t, L->nt * sizeof(*t));
		L->t = t;
		L->cap = cap;
	}
	*out = &L->t[L->nt++];
	memset(*out, 0, sizeof(**out));
	(*out)->type = (uint8_t)type;
	(*out)->line = line_of(L, at);
	return 0;
}

/* Length of the whitespace character at p (Python's str.isspace), else 0. */
static size_t ws_at(struct lexer *L, size_t p)
{
	size_t l;

	if (p >= L->n)
		return 0;
	return jstr_isspace_at(L->s + p, L->n - p, &l) ? l : 0;
}

static size_t skip_ws(struct lexer *L, size_t p)
{
	size_t l;

	while ((l = ws_at(L, p)))
		p += l;
	return p;
}

/* Python's text.rstrip(): the end of s[from, to) without its trailing whitespace. */
static size_t rstrip_end(struct lexer *L, size_t from, size_t to)
{
	while (to > from) {
		size_t b = to - 1, l;

		while (b > from && ((unsigned char)L->s[b] & 0xc0) == 0x80)
			b--;
		if (!jstr_isspace_at(L->s + b, to - b, &l) || b + l != to)
			break;
		to = b;
	}
	return to;
}

/* Whether s[from, to) is one or more whitespace characters. */
static int all_ws(struct lexer *L, size_t from, size_t to)
{
	size_t l;

	if (from >= to)
		return 0;
	while (from < to) {
		if (!jstr_isspace_at(L->s + from, to - from, &l))
			return 0;
		from += l;
	}
	return 1;
}

/*
 * The text s[from, to) before a tag opened with sign (0, '-', '+'), lstrip telling whether
 * lstrip_blocks applies to the tag (a block or a comment): emitted as data, stripped as
 * Jinja2's lexer strips it.
 */
static int emit_text(struct lexer *L, size_t from, size_t to, int sign, int lstrip)
{
	struct jtoken *t;
	int rc;

	if (sign == '-') {
		to = rstrip_end(L, from, to);
	} else if (sign != '+' && lstrip) {
		size_t l = to;

		while (l > from && L->s[l - 1] != '\n')
			l--;
		if ((l > from || L->line_starting) && all_ws(L, l, to))
			to = l;
	}
	if (to == from)
		return 0;
	if ((rc = emit(L, JT_DATA, from, &t)))
		return rc;
	t->s.p = L->s + from;
	t->s.n = to - from;
	return 0;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Decodes the body of a string literal as .encode("ascii", "backslashreplace")
 * .decode("unicode-escape") does. */
static int decode_string(struct lexer *L, int line, const char *p, size_t n, struct jstr *out)
{
	char *o = jarena_alloc(L->a, n * 4 + 1);
	size_t k = 0;

	if (!o)
		return -ENOMEM;
	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)p[i];
		uint32_t cp;
		int digits, base;

		if (c != '\\') {
			o[k++] = (char)c;
			i++;
			continue;
		}
		if (i + 1 >= n)
			return lex_fail(L, line, "\\ at end of string");
		c = (unsigned char)p[i + 1];
		i += 2;
		switch (c) {
		case '\n': continue;
		case '\\': o[k++] = '\\'; continue;
		case '\'': o[k++] = '\''; continue;
		case '"': o[k++] = '"'; continue;
		case 'a': o[k++] = '\a'; continue;
		case 'b': o[k++] = '\b'; continue;
		case 'f': o[k++] = '\f'; continue;
		case 'n': o[k++] = '\n'; continue;
		case 'r': o[k++] = '\r'; continue;
		case 't': o[k++] = '\t'; continue;
		case 'v': o[k++] = '\v'; continue;
		case 'x': digits = 2; base = 16; break;
		case 'u': digits = 4; base = 16; break;
		case 'U': digits = 8; base = 16; break;
		case 'N':
			return lex_fail(L, line, "\\N{...} escapes are not supported");
		default:
			if (c >= '0' && c <= '7') {
				digits = 3;
				base = 8;
				i--;
				break;
			}
			if (c >= 0x80) {
				/* backslashreplace turned the character into \xhh, \uhhhh or
				 * \Uhhhhhhhh after the backslash, which "\\" then keeps. */
				size_t l = 0;

				cp = 0;
				if (c >= 0xf0) {
					cp = c & 7;
					l = 3;
				} else if (c >= 0xe0) {
					cp = c & 15;
					l = 2;
				} else {
					cp = c & 31;
					l = 1;
				}
				for (size_t j = 0; j < l && i < n; j++)
					cp = cp << 6 | ((unsigned char)p[i++] & 63);
				k += (size_t)sprintf(o + k, cp < 0x100 ? "\\x%02x" :
						     cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp);
				continue;
			}
			o[k++] = '\\';
			o[k++] = (char)c;
			continue;
		}
		cp = 0;
		{
			int got = 0;

			while (got < digits && i < n) {
				int h = hexval((unsigned char)p[i]);

				if (h < 0 || h >= base)
					break;
				cp = cp * (uint32_t)base + (uint32_t)h;
				got++;
				i++;
			}
			if (base == 16 && got < digits)
				return lex_fail(L, line, "truncated \\%c escape in a string", c);
		}
		if (cp > 0x10ffff)
			return lex_fail(L, line, "illegal Unicode character in a string");
		if (cp >= 0xd800 && cp <= 0xdfff)
			return lex_fail(L, line, "a lone surrogate in a string");
		k += (size_t)jstr_put_cp(o + k, cp);
	}
	o[k] = 0;
	out->p = o;
	out->n = k;
	return 0;
}

static int is_digit(int c)
{
	return c >= '0' && c <= '9';
}

/* (\d+_)*\d+ at p: its end, or p when there is none. */
static size_t digits_end(struct lexer *L, size_t p)
{
	size_t q = p;

	while (q < L->n && is_digit(L->s[q])) {
		while (q < L->n && is_digit(L->s[q]))
			q++;
		if (q + 1 < L->n && L->s[q] == '_' && is_digit(L->s[q + 1]))
			q++;
	}
	return q;
}

static size_t float_end(struct lexer *L, size_t p)
{
	size_t q = digits_end(L, p), e, f;

	if (q == p || (p > 0 && L->s[p - 1] == '.'))
		return p;
	/* the fraction, then an exponent; or just the fraction */
	f = q;
	if (f + 1 < L->n && L->s[f] == '.' && is_digit(L->s[f + 1]))
		f = digits_end(L, f + 1);
	e = f;
	if (e < L->n && (L->s[e] == 'e' || L->s[e] == 'E')) {
		size_t x = e + 1;

		if (x < L->n && (L->s[x] == '+' || L->s[x] == '-'))
			x++;
		if (x < L->n && is_digit(L->s[x]))
			return digits_end(L, x);
	}
	return f > q ? f : p;
}

static size_t int_end(struct lexer *L, size_t p, int *base)
{
	const char *s = L->s;
	size_t q;

	*base = 10;
	if (s[p] == '0' && p + 1 < L->n && strchr("bBoOxX", s[p + 1]) && s[p + 1]) {
		int b = (s[p + 1] | 0x20) == 'b' ? 2 : (s[p + 1] | 0x20) == 'o' ? 8 : 16;

		q = p + 2;
		for (;;) {
			size_t r = q < L->n && s[q] == '_' ? q + 1 : q;
			int h = r < L->n ? hexval((unsigned char)s[r]) : -1;

			if (h < 0 || h >= b)
				break;
			q = r + 1;
		}
		if (q > p + 2) {
			*base = b;
			return q;
		}
	}
	if (!is_digit(s[p]))
		return p;
	q = p + 1;
	for (;;) {
		size_t r = q < L->n && s[q] == '_' ? q + 1 : q;

		if (r >= L->n || !is_digit(s[r]) || (s[p] == '0' && s[r] != '0'))
			break;
		q = r + 1;
	}
	return q;
}

static const struct {
	const char *op;
	int tok;
} ops[] = {
	{ "//", JT_FLOORDIV }, { "**", JT_POW }, { "==", JT_EQ }, { "!=", JT_NE },
	{ ">=", JT_GTEQ }, { "<=", JT_LTEQ }, { "+", JT_ADD }, { "-", JT_SUB }, { "/", JT_DIV },
	{ "*", JT_MUL }, { "%", JT_MOD }, { "~", JT_TILDE }, { "[", JT_LBRACKET },
	{ "]", JT_RBRACKET }, { "(", JT_LPAREN }, { ")", JT_RPAREN }, { "{", JT_LBRACE },
	{ "}", JT_RBRACE }, { ">", JT_GT }, { "<", JT_LT }, { "=", JT_ASSIGN }, { ".", JT_DOT },
	{ ":", JT_COLON }, { "|", JT_PIPE }, { ",", JT_COMMA }, { ";", JT_SEMICOLON },
};

/* One token inside a tag at L->pos (not its end). */
static int lex_tag_token(struct lexer *L)
{
	const char *s = L->s;
	size_t p = L->pos, q;
	struct jtoken *t;
	int rc, base, line = line_of(L, p);

	if ((q = float_end(L, p)) > p) {
		char buf[128];
		size_t k = 0;

		for (size_t i = p; i < q && k + 1 < sizeof(buf); i++)
			if (s[i] != '_')
				buf[k++] = s[i];
		buf[k] = 0;
		if ((rc = emit(L, JT_FLOAT, p, &t)))
			return rc;
		t->f = strtod(buf, NULL);
		L->pos = q;
		return 0;
	}
	if ((q = int_end(L, p, &base)) > p) {
		unsigned long long v = 0;

		for (size_t i = p + (base == 10 ? 0 : 2); i < q; i++) {
			int h = hexval((unsigned char)s[i]);

			if (s[i] == '_')
				continue;
			if (v > (unsigned long long)(9223372036854775807LL - h) / (unsigned)base)
				return lex_fail(L, line, "integer literal too large");
			v = v * (unsigned)base + (unsigned)h;
		}
		if ((rc = emit(L, JT_INT, p, &t)))
			return rc;
		t->i = (long long)v;
		L->pos = q;
		return 0;
	}
	if ((s[p] >= 'a' && s[p] <= 'z') || (s[p] >= 'A' && s[p] <= 'Z') || s[p] == '_') {
		q = p + 1;
		while (q < L->n && ((s[q] >= 'a' && s[q] <= 'z') || (s[q] >= 'A' && s[q] <= 'Z') ||
				    s[q] == '_' || is_digit(s[q])))
			q++;
		if ((rc = emit(L, JT_NAME, p, &t)))
			return rc;
		t->s.p = s + p;
		t->s.n = q - p;
		L->pos = q;
		return 0;
	}
	if (s[p] == '\'' || s[p] == '"') {
		q = p + 1;
		while (q < L->n && s[q] != s[p])
			q += s[q] == '\\' ? 2 : 1;
		if (q >= L->n)
			return lex_fail(L, line, "unexpected char '%c' (an unterminated string)",
					s[p]);
		if ((rc = emit(L, JT_STRING, p, &t)))
			return rc;
		if ((rc = decode_string(L, line, s + p + 1, q - p - 1, &t->s)))
			return rc;
		L->pos = q + 1;
		return 0;
	}
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		size_t l = strlen(ops[i].op);

		if (p + l > L->n || memcmp(s + p, ops[i].op, l))
			continue;
		if (ops[i].tok == JT_LPAREN || ops[i].tok == JT_LBRACKET || ops[i].tok == JT_LBRACE) {
			if (L->balance == (int)sizeof(L->stack))
				return lex_fail(L, line, "brackets nested too deeply");
			L->stack[L->balance++] = ops[i].tok == JT_LPAREN ? ')' :
						 ops[i].tok == JT_LBRACKET ? ']' : '}';
		} else if (ops[i].tok == JT_RPAREN || ops[i].tok == JT_RBRACKET ||
			   ops[i].tok == JT_RBRACE) {
			if (!L->balance)
				return lex_fail(L, line, "unexpected '%c'", s[p]);
			if (L->stack[--L->balance] != s[p])
				return lex_fail(L, line, "unexpected '%c', expected '%c'", s[p],
						L->stack[L->balance]);
		}
		if ((rc = emit(L, ops[i].tok, p, &t)))
			return rc;
		L->pos = p + l;
		return 0;
	}
	if ((unsigned char)s[p] >= 0x80)
		return lex_fail(L, line, "unexpected non-ASCII character outside a string");
	return lex_fail(L, line, "unexpected char '%c'", s[p]);
}

/* The tokens of a {% %} (block) or {{ }} tag from L->pos to its end. */
static int lex_tag(struct lexer *L, int block, int start_line)
{
	const char *s = L->s;
	struct jtoken *t;
	int rc;

	for (;;) {
		size_t p = L->pos;

		if (p >= L->n)
			return lex_fail(L, start_line, "unexpected end of template: the tag is "
					"not closed");
		if (!L->balance) {
			size_t end = 0;
			int trim = 0, strip = 0;

			if (block && p + 3 <= L->n && !memcmp(s + p, "+%}", 3)) {
				end = p + 3;
			} else if (p + 3 <= L->n && !memcmp(s + p, block ? "-%}" : "-}}", 3)) {
				end = p + 3;
				strip = 1;
			} else if (p + 2 <= L->n && !memcmp(s + p, block ? "%}" : "}}", 2)) {
				end = p + 2;
				trim = block;
			}
			if (end) {
				if ((rc = emit(L, block ? JT_BLOCK_END : JT_VAR_END, p, &t)))
					return rc;
				if (strip)
					end = skip_ws(L, end);
				else if (trim && end < L->n && s[end] == '\n')
					end++;
				L->line_starting = s[end - 1] == '\n';
				L->pos = end;
				return 0;
			}
		}
		if (ws_at(L, p)) {
			L->pos = skip_ws(L, p);
			continue;
		}
		if ((rc = lex_tag_token(L)))
			return rc;
	}
}

/* {% raw %} at p (sign already skipped to q): the end of the opening tag, or 0. */
static size_t raw_begin_end(struct lexer *L, size_t q)
{
	q = skip_ws(L, q);
	if (q + 3 > L->n || memcmp(L->s + q, "raw", 3))
		return 0;
	q = skip_ws(L, q + 3);
	if (q + 3 <= L->n && !memcmp(L->s + q, "-%}", 3))
		return skip_ws(L, q + 3);
	if (q + 2 <= L->n && !memcmp(L->s + q, "%}", 2))
		return q + 2;
	return 0;
}

static int lex_raw(struct lexer *L, int line)
{
	for (size_t i = L->pos; i + 1 < L->n; i++) {
		size_t q, end = 0;
		int sign = 0;

		if (L->s[i] != '{' || L->s[i + 1] != '%')
			continue;
		q = i + 2;
		if (q < L->n && (L->s[q] == '-' || L->s[q] == '+'))
			sign = L->s[q++];
		q = skip_ws(L, q);
		if (q + 6 > L->n || memcmp(L->s + q, "endraw", 6))
			continue;
		q = skip_ws(L, q + 6);
		if (q + 3 <= L->n && !memcmp(L->s + q, "+%}", 3))
			end = q + 3;
		else if (q + 3 <= L->n && !memcmp(L->s + q, "-%}", 3))
			end = skip_ws(L, q + 3);
		else if (q + 2 <= L->n && !memcmp(L->s + q, "%}", 2))
			end = q + 2 + (q + 2 < L->n && L->s[q + 2] == '\n');
		if (!end)
			continue;
		{
			int rc = emit_text(L, L->pos, i, sign, 1);

			if (rc)
				return rc;
		}
		L->line_starting = L->s[end - 1] == '\n';
		L->pos = end;
		return 0;
	}
	return lex_fail(L, line, "missing end of raw directive");
}

static int lex_comment(struct lexer *L, int line)
{
	for (size_t i = L->pos; i < L->n; i++) {
		size_t end;

		if (i + 3 <= L->n && L->s[i] == '+' && !memcmp(L->s + i + 1, "#}", 2)) {
			end = i + 3;
		} else if (i + 3 <= L->n && L->s[i] == '-' && !memcmp(L->s + i + 1, "#}", 2)) {
			end = skip_ws(L, i + 3);
		} else if (i + 2 <= L->n && !memcmp(L->s + i, "#}", 2)) {
			end = i + 2 + (i + 2 < L->n && L->s[i + 2] == '\n');
		} else {
			continue;
		}
		L->line_starting = L->s[end - 1] == '\n';
		L->pos = end;
		return 0;
	}
	return lex_fail(L, line, "missing end of comment tag");
}

int jinja_lex(struct jarena *a, const char *src, size_t len, struct jtoken **toks, size_t *n,
	      char *err, size_t errlen)
{
	struct lexer L = { .a = a, .line = 1, .line_starting = 1, .err = err, .errlen = errlen };
	struct jtoken *t;
	char *s;
	size_t k = 0;
	int rc;

	if (!jstr_valid_utf8(src, len)) {
		snprintf(err, errlen, "line 1: the template is not valid UTF-8");
		return -EINVAL;
	}
	/* Newlines normalised, one trailing newline dropped (keep_trailing_newline off). */
	s = jarena_alloc(a, len + 1);
	if (!s)
		return -ENOMEM;
	for (size_t i = 0; i < len; i++) {
		if (src[i] == '\r') {
			s[k++] = '\n';
			if (i + 1 < len && src[i + 1] == '\n')
				i++;
		} else {
			s[k++] = src[i];
		}
	}
	if (k && s[k - 1] == '\n')
		k--;
	s[k] = 0;
	L.s = s;
	L.n = k;
	while (L.pos < L.n) {
		size_t q = L.pos, p;
		int kind, sign = 0, line;

		while (q + 1 < L.n && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' ||
							 s[q + 1] == '#')))
			q++;
		if (q + 1 >= L.n) {
			if ((rc = emit_text(&L, L.pos, L.n, '+', 0)))
				return rc;
			break;
		}
		kind = s[q + 1];
		p = q + 2;
		if (p < L.n && (s[p] == '-' || s[p] == '+'))
			sign = s[p++];
		if ((rc = emit_text(&L, L.pos, q, sign, kind != '{')))
			return rc;
		line = line_of(&L, q);
		L.line_starting = 0;
		if (kind == '%') {
			size_t r = raw_begin_end(&L, p);

			if (r) {
				L.line_starting = s[r - 1] == '\n';
				L.pos = r;
				if ((rc = lex_raw(&L, line)))
					return rc;
				continue;
			}
		}
		L.pos = p;
		if (kind == '#') {
			if ((rc = lex_comment(&L, line)))
				return rc;
			continue;
		}
		if ((rc = emit(&L, kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, q, &t)))
			return rc;
		L.balance = 0;
		if ((rc = lex_tag(&L, kind == '%', line)))
			return rc;
	}
	if ((rc = emit(&L, JT_EOF, L.n, &t)))
		return rc;
	*toks = L.t;
	*n = L.nt;
	return 0;
}

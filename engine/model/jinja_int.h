/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja_int.h - what the files of the Jinja2 renderer share: the arena every
 * allocation of a parse or a render comes from, the tokens of jinja_lex.c, the syntax tree of
 * jinja_parse.c, the values of jinja_value.c (Python's types as Jinja2 sees them: None, bool,
 * int, float, str, list, tuple, dict, Undefined, and the objects of the runtime), the
 * evaluator of jinja_eval.c and jinja_expr.c, the filters and tests of jinja_filters.c and the
 * methods of jinja_methods.c. Only those files include it.
 */
#ifndef DPS_ENGINE_JINJA_INT_H
#define DPS_ENGINE_JINJA_INT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* ---- arena -------------------------------------------------------------------------- */

/* Bump allocator; everything is freed at once. cap bounds the bytes it may hold. */
struct jarena {
	struct jchunk *head;
	size_t used, cap;
	int over; /* an allocation failed for cap, not for the system */
};
void *jarena_alloc(struct jarena *a, size_t n);
void jarena_free(struct jarena *a);

struct jstr {
	const char *p;
	size_t n;
};

/* ---- values ------------------------------------------------------------------------- */

enum jv_type {
	JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_TUPLE, JV_DICT,
	JV_NS,     /* namespace(): a dict whose attributes may be assigned */
	JV_LOOP,   /* the loop variable of a for loop */
	JV_MACRO,  /* a macro, or the caller of a call block */
	JV_FUNC,   /* a global function (range, namespace, raise_exception, ...) */
	JV_METHOD, /* a bound method of a str, list, dict or loop */
	JV_CYCLER, /* cycler() and joiner() objects */
};

/* How a list prints and behaves: Python has several iterables that Jinja hands around. */
enum jlist_kind {
	JL_LIST,   /* list (or tuple, by the value's type) */
	JL_ITEMS,  /* dict_items, dict_keys, dict_values: printable views with a length */
	JL_KEYS,
	JL_VALUES,
	JL_GEN,    /* a generator (map, select, reverse...): no len, always true, one pass */
	JL_RANGE,  /* range(): like a list, but prints as range(a, b) */
};

struct jv {
	uint8_t t;    /* enum jv_type */
	uint8_t safe; /* JV_STR: Markup (|safe, |escape) */
	union {
		long long i; /* JV_BOOL, JV_INT, JV_FUNC (enum jfunc) */
		double f;
		struct jstr s;
		struct jlist *l;
		struct jdict *d; /* JV_DICT, JV_NS */
		struct jloop *loop;
		struct jmacro *m;
		struct jmethod *meth;
		struct jundef *u; /* NULL: a plain undefined */
		struct jcycler *cy;
	};
};

struct jlist {
	size_t n, cap;
	struct jv *v;
	uint8_t kind; /* enum jlist_kind */
	uint8_t used; /* JL_GEN: already iterated */
	long long r0, r1, rs; /* JL_RANGE: start, stop, step */
};

struct jdict {
	size_t n, cap;
	struct jv *k, *v;
};

/* Why a value is undefined: for Jinja's messages ("'dict object' has no attribute 'x'"). */
struct jundef {
	struct jv key;      /* the variable, attribute or key */
	const char *hint;   /* a full message instead, or NULL */
	const char *objname; /* "dict object", "None", ...; NULL: a missing variable */
	uint8_t security;   /* an unsafe attribute of the sandbox */
};

struct jloop {
	struct jlist *items;
	size_t i;
	int depth;
	struct jdict changed; /* loop.changed: the last arguments, as a 1-entry dict */
	int changed_set;
};

struct jmethod {
	struct jv self;
	int id; /* enum jmeth */
};

struct jcycler {
	struct jlist *items; /* cycler(); NULL for joiner() */
	size_t pos;
	struct jstr sep;     /* joiner() */
	int used;
};

struct jnode;
struct jscope;
struct jmacro {
	const struct jnode *def; /* JN_MACRO or the JN_CALLBLOCK (caller) */
	struct jscope *scope;    /* where it was defined */
	struct jv caller;        /* the caller() of a call block, JV_UNDEF otherwise */
};

enum jfunc { JF_RANGE, JF_DICT, JF_NAMESPACE, JF_CYCLER, JF_JOINER, JF_RAISE, JF_STRFTIME };

/* ---- tokens ------------------------------------------------------------------------- */

enum jtok {
	JT_EOF, JT_DATA, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
	JT_NAME, JT_STRING, JT_INT, JT_FLOAT,
	/* operators */
	JT_ADD, JT_SUB, JT_DIV, JT_FLOORDIV, JT_MUL, JT_MOD, JT_POW, JT_TILDE, JT_LBRACKET,
	JT_RBRACKET, JT_LPAREN, JT_RPAREN, JT_LBRACE, JT_RBRACE, JT_EQ, JT_NE, JT_GT, JT_GTEQ,
	JT_LT, JT_LTEQ, JT_ASSIGN, JT_DOT, JT_COLON, JT_PIPE, JT_COMMA, JT_SEMICOLON,
};

struct jtoken {
	uint8_t type;
	int line;
	struct jstr s; /* name, decoded string, data */
	long long i;
	double f;
};

/* Tokenizes src into *toks (arena); the last token is JT_EOF. 0 or -EINVAL / -ENOMEM. */
int jinja_lex(struct jarena *a, const char *src, size_t len, struct jtoken **toks, size_t *n,
	      char *err, size_t errlen);

/* ---- syntax tree -------------------------------------------------------------------- */

enum jnode_kind {
	/* expressions */
	JN_CONST, JN_NAME, JN_GETATTR, JN_GETITEM, JN_SLICE, JN_CALL, JN_FILTER, JN_TEST,
	JN_NEG, JN_POS, JN_NOT, JN_BINOP, JN_AND, JN_OR, JN_CONCAT, JN_COMPARE, JN_COND,
	JN_LIST, JN_TUPLE, JN_DICT,
	/* statements */
	JN_DATA, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_CALLBLOCK,
	JN_FILTERBLOCK, JN_BREAK, JN_CONTINUE, JN_WITH, JN_BODY,
};

struct jnlist {
	struct jnode **v;
	size_t n;
};

/*
 * One node. Fields by kind:
 *   CONST: val. NAME: name. GETATTR: a.name. GETITEM: a[b]. SLICE: a:b:c (any NULL).
 *   CALL: a(args, kwnames=kwargs). FILTER/TEST: a|op(args, kw) (a NULL in a filter block).
 *   NEG/POS/NOT: a. BINOP: a op b (op: the JT_ token). AND/OR: a, b. CONCAT: args.
 *   COMPARE: a, then args[i] with ops[i] (JT_EQ... or JT_NAME for in, JT_NOT.. see parse).
 *   COND: b if a else c. LIST/TUPLE: args. DICT: args (keys) and kw (values).
 *   DATA: name (the text). OUTPUT: args. IF: a, body, orelse. FOR: target a, iter b, filter c,
 *   body, orelse. SET: target a = b (name: the attribute of a namespace target). SETBLOCK:
 *   target a, filter chain c (a FILTER with a NULL innermost), body. MACRO: name, params
 *   kwnames, defaults kw (NULL entries for none), body. CALLBLOCK: the CALL b, params, body.
 *   FILTERBLOCK: c, body. WITH: kwnames = kw, body. BODY: body.
 */
struct jnode {
	uint8_t kind;
	int op;
	int line;
	struct jstr name;
	struct jv val;
	struct jnode *a, *b, *c;
	struct jnlist args, kw, body, orelse;
	struct jstr *kwnames;
	int *ops;
};

/* Parses the tokens into the body of the template. 0 or -EINVAL ("line N: ...")/-ENOMEM. */
int jinja_parse_tokens(struct jarena *a, const struct jtoken *toks, size_t n,
		       struct jnode **root, char *err, size_t errlen);

/* The parser's state, shared by jinja_parse.c (expressions) and jinja_stmt.c (statements). */
#define JP_MAX_DEPTH 200
struct jparser {
	struct jarena *a;
	const struct jtoken *t;
	size_t n, i;
	char *err;
	size_t errlen;
	int depth;
	int loops; /* for loops around the current statement (break/continue) */
};

/* A growable node list with keyword names, in the arena. */
struct jnbuild {
	struct jnlist l;
	struct jstr *names;
	size_t cap;
};

static inline const struct jtoken *jp_cur(struct jparser *P)
{
	return &P->t[P->i];
}

static inline const struct jtoken *jp_look(struct jparser *P)
{
	return &P->t[P->i + 1 < P->n ? P->i + 1 : P->i];
}

static inline void jp_next(struct jparser *P)
{
	if (P->i + 1 < P->n)
		P->i++;
}

static inline int jp_is_name(const struct jtoken *t, const char *s)
{
	size_t n = 0;

	while (s[n])
		n++;
	return t->type == JT_NAME && t->s.n == n && !__builtin_memcmp(t->s.p, s, n);
}

int jp_fail(struct jparser *P, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
const char *jp_desc(const struct jtoken *t);
int jp_expect(struct jparser *P, int type, const char *what);
int jp_expect_name(struct jparser *P, const char *name);
struct jnode *jp_node(struct jparser *P, int kind, int line);
int jp_push(struct jparser *P, struct jnbuild *b, struct jnode *n, struct jstr name);
int jp_enter(struct jparser *P);
int jp_expression(struct jparser *P, int condexpr, struct jnode **out);
int jp_tuple(struct jparser *P, int simplified, int condexpr, const char *extra_end,
	     int explicit_parens, struct jnode **out);
int jp_filter(struct jparser *P, struct jnode **n, int inline_first);
int jp_primary(struct jparser *P, struct jnode **out);

/* ---- filters, tests, methods: names known statically -------------------------------- */

int jinja_filter_find(const char *name, size_t n); /* id or -1 */
int jinja_test_find(const char *name, size_t n);   /* id or -1 */

/* ---- rendering ---------------------------------------------------------------------- */

struct jbuf {
	char *p;
	size_t n, cap, max;
};

struct jrender {
	struct jarena *a;
	json_t *vars_json;
	struct jdict *vars;
	long long now;
	char *err;
	size_t errlen;
	int raised;     /* err holds a raise_exception message, exactly */
	int depth;      /* macro / call nesting */
	long long steps;
	long long max_steps;
	size_t max_out;
	int loop_ctl;   /* 1 break, 2 continue */
	int line;       /* of the node being evaluated, for messages without one */
	int json_ascii; /* tojson(ensure_ascii=True) in progress */
	struct jbuf *out;
};

struct jscope {
	struct jscope *parent;
	struct jdict vars;
};

/* jinja_value.c */
struct jv jv_undef(void);
struct jv jv_none(void);
struct jv jv_bool(int b);
struct jv jv_int(long long i);
struct jv jv_float(double f);
struct jv jv_str(const char *p, size_t n);
struct jv jv_cstr(const char *s);
struct jlist *jlist_new(struct jarena *a, size_t cap, int kind);
int jlist_push(struct jarena *a, struct jlist *l, struct jv v);
struct jv jv_list(struct jlist *l, int tuple);
struct jdict *jdict_new(struct jarena *a);
int jdict_set(struct jarena *a, struct jdict *d, struct jv k, struct jv v);
struct jv *jdict_get(const struct jdict *d, struct jv k);
struct jv *jdict_gets(const struct jdict *d, const char *p, size_t n);
int jv_from_json(struct jarena *a, json_t *j, struct jv *out, int depth);
int jv_truthy(struct jv v);
int jv_is_num(struct jv v); /* bool, int or float */
double jv_num(struct jv v);
int jv_equal(struct jv x, struct jv y);
/* -2 when not comparable (a TypeError), else -1, 0, 1. */
int jv_cmp(struct jv x, struct jv y);
const char *jv_type_name(struct jv v);
int jbuf_put(struct jbuf *b, const char *p, size_t n);
/* Python's str(v) (repr: repr(v)) appended to b. -EINVAL for what cannot be printed. */
int jv_print(struct jrender *r, struct jbuf *b, struct jv v, int repr);
/* str(v) as a string of the arena. */
int jv_to_str(struct jrender *r, struct jv v, struct jstr *out);
int jv_tojson(struct jrender *r, struct jbuf *b, struct jv v, struct jv indent,
	      struct jstr item_sep, struct jstr key_sep, int sort_keys, int level);
/* The items a for loop walks (dict: keys, str: characters). -EINVAL when not iterable. */
int jv_iterate(struct jrender *r, struct jv v, struct jlist **out);
int jv_len(struct jrender *r, struct jv v, long long *out);
int jv_fail(struct jrender *r, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* The UndefinedError of using u: "'x' is undefined" and the like. */
int jv_undef_fail(struct jrender *r, int line, struct jv u);
struct jv jv_undef_attr(struct jarena *a, struct jv obj, struct jv key);
struct jv jv_undef_var(struct jarena *a, struct jstr name);
struct jv jv_undef_hint(struct jarena *a, const char *hint, int security);

/* jinja_str.c: Python's str semantics on UTF-8 */
uint32_t jstr_cp_at(const char *p, size_t n, size_t *l);
int jstr_isprintable(uint32_t c);
int jstr_isword(uint32_t c);
/* Python's slice of a sequence of len items: the first index, and the count returned. */
long long jslice(long long len, const long long *start, const long long *stop, long long step,
		 long long *first);
int jstr_isspace_at(const char *p, size_t n, size_t *clen);
size_t jstr_cplen(struct jstr s);
int jstr_strip(struct jarena *a, struct jstr s, const struct jstr *chars, int left, int right,
	       struct jstr *out);
int jstr_case(struct jarena *a, struct jstr s, int mode, struct jstr *out);
enum { JCASE_UPPER, JCASE_LOWER, JCASE_TITLE, JCASE_CAPITALIZE, JCASE_JTITLE, JCASE_SWAP };
int jstr_replace(struct jarena *a, struct jstr s, struct jstr old, struct jstr new_,
		 long long count, struct jstr *out);
long long jstr_find(struct jstr s, struct jstr sub, size_t from);
struct jv jstr_index(struct jstr s, long long i, int *ok);
int jstr_slice(struct jarena *a, struct jstr s, long long *start, long long *stop,
	       long long step, struct jstr *out);
int jstr_split(struct jarena *a, struct jstr s, const struct jstr *sep, long long maxsplit,
	       int right, struct jlist **out);
int jstr_splitlines(struct jarena *a, struct jstr s, int keepends, struct jlist **out);
int jstr_escape_html(struct jarena *a, struct jstr s, struct jstr *out);
int jstr_valid_utf8(const char *p, size_t n);
int jstr_put_cp(char *out, uint32_t cp);

/* jinja_expr.c */
int jinja_eval(struct jrender *r, const struct jnode *n, struct jscope *s, struct jv *out);
int jinja_lookup(struct jrender *r, struct jscope *s, struct jstr name, struct jv *out);
int jinja_getattr(struct jrender *r, int line, struct jv obj, struct jstr name, struct jv *out);
int jinja_getitem(struct jrender *r, int line, struct jv obj, struct jv key, struct jv *out);
int jinja_call_value(struct jrender *r, int line, struct jv fn, struct jv *args, size_t nargs,
		     const struct jstr *kwn, struct jv *kwv, size_t nkw, struct jv *out);
int jinja_binop(struct jrender *r, int line, int op, struct jv x, struct jv y, struct jv *out);
int jinja_contains(struct jrender *r, int line, struct jv hay, struct jv needle, int *out);

/* jinja_eval.c */
int jinja_exec(struct jrender *r, const struct jnlist *body, struct jscope *s);
int jinja_call_macro(struct jrender *r, int line, struct jmacro *m, struct jv *args,
		     size_t nargs, const struct jstr *kwn, struct jv *kwv, size_t nkw,
		     struct jv *out);
struct jscope *jinja_scope_new(struct jrender *r, struct jscope *parent);
int jinja_scope_set(struct jrender *r, struct jscope *s, struct jstr name, struct jv v);

/* jinja_filters.c */
int jinja_filter_apply(struct jrender *r, int line, int id, struct jv v, struct jv *args,
		       size_t nargs, const struct jstr *kwn, struct jv *kwv, size_t nkw,
		       struct jv *out);
int jinja_test_apply(struct jrender *r, int line, int id, struct jv v, struct jv *args,
		     size_t nargs, int *out);
/* Binds positional and keyword arguments to the parameters named in params (a NULL-ended
 * list); missing ones get type 0xff. */
int jinja_bind(struct jrender *r, int line, const char *what, const char *const *params,
	       struct jv *args, size_t nargs, const struct jstr *kwn, struct jv *kwv,
	       size_t nkw, struct jv *bound);
#define JV_MISSING 0xff

/* jinja_seq.c: the filters over sequences */
int jinja_seq_filter(struct jrender *r, int line, const char *name, struct jv v, struct jv *args,
		     size_t nargs, const struct jstr *kwn, struct jv *kwv, size_t nkw,
		     struct jv *out, int *handled);
/* Jinja2's make_attrgetter: "a.b.0" walked with getitem; dflt (or JV_MISSING) for undefined. */
int jinja_attrgetter(struct jrender *r, int line, struct jv obj, struct jv attr, struct jv dflt,
		     struct jv *out);
int jinja_filter_by_name(struct jrender *r, int line, struct jv name, struct jv v,
			 struct jv *args, size_t nargs, const struct jstr *kwn, struct jv *kwv,
			 size_t nkw, struct jv *out);
int jinja_test_by_name(struct jrender *r, int line, struct jv name, struct jv v,
		       struct jv *args, size_t nargs, int *out);

/* jinja_methods.c */
/* The bound method obj.name, when obj has one of that name (1), else 0. */
int jinja_method_find(struct jarena *a, struct jv obj, struct jstr name, struct jv *out);
int jinja_method_call(struct jrender *r, int line, struct jmethod *m, struct jv *args,
		      size_t nargs, const struct jstr *kwn, struct jv *kwv, size_t nkw,
		      struct jv *out);

#endif

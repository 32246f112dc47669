/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_hf_regex.c - the patterns of tokenizer.json (Split, Replace and the
 * ByteLevel pre-tokenizer's GPT-2 pattern), run with PCRE2 as the `tokenizers` library runs
 * them with Oniguruma (Ruby syntax, UTF-8). Compiled at load by the normalizer, pre-tokenizer
 * and decoder loaders; matched on every piece of every prompt, so JIT-compiled when PCRE2 can.
 *
 * Both engines are backtracking, leftmost-first, with the same syntax for what the models'
 * patterns use (alternation, classes, \p{..}, look-arounds, (?i:..), {n,m}). Where the two read
 * the same text differently, the pattern is translated before PCRE2 sees it:
 *   \s \S    Oniguruma: the White_Space property; PCRE2 adds U+180E    -> \p{White_Space}
 *   \d \D    Unicode decimal digits in both                             -> \p{Nd}
 *   \w \W    Oniguruma: Alphabetic, marks, decimal digits, connectors (and
 *            outside a class ² ³ ¹ ¼ ½ ¾); PCRE2: letters, numbers, '_'   -> [\p{Alphabetic}..]
 *   \b \B    boundaries of that \w                                      -> look-arounds
 *   \h \H    Oniguruma: a hexadecimal digit; PCRE2: horizontal space    -> [0-9a-fA-F]
 *   \v       Oniguruma: vertical tab only                               -> \x0b
 *   \uHHHH   Oniguruma's code point escape                              -> \x{HHHH}
 *   \p{Han}  Oniguruma: the Script; PCRE2: Script_Extensions           -> \p{sc:Han}
 *   (?m)     Ruby's m is "dot matches newline"                          -> (?s)
 *   x{,n}    Oniguruma: {0,n}; PCRE2: literal text                      -> x{0,n}
 *   ^ $      Ruby's anchors are always at line boundaries               -> PCRE2_MULTILINE
 *   (?i)ß    Oniguruma folds to several characters ("ss"), PCRE2 to one -> refused
 * and what has no translation is refused by name: POSIX brackets, nested classes and class
 * intersections, negated sets inside a class where the tables differ, \Q..\E.
 *
 * The Unicode tables differ too: the library's Oniguruma has Unicode 16.0, Debian 12's PCRE2
 * Unicode 14.0, which counts the characters assigned in between as unassigned. Every class
 * (\p{..}, \w, \d, \b) is widened by the runs of tok_hf_ucd.c that its Unicode 16.0 members
 * form around them, and C and Cn narrowed, so a newer letter stays a letter.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <utf8proc.h>

#include "common/dps.h"
#include "engine/model/tok_hf_int.h"

/* Oniguruma's \w: Alphabetic, marks, decimal digits and connectors; on its own (and for \W, \b,
 * \B) also the Latin-1 digits ² ³ ¹ ¼ ½ ¾, which its single-byte tables count as word
 * characters, but not inside a class, which reads the Unicode tables. And the regex crate's
 * (with the joiners). As class bodies. */
#define ONIG_WORD_IN_CLASS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}"
#define ONIG_WORD ONIG_WORD_IN_CLASS "\\x{b2}\\x{b3}\\x{b9}\\x{bc}-\\x{be}"
#define RUST_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}"

/* General categories by short and long name (compared without case, spaces, '_' or '-'). */
static const char *const gc_names[][2] = {
	{ "L", "letter" },           { "Lu", "uppercaseletter" }, { "Ll", "lowercaseletter" },
	{ "Lt", "titlecaseletter" }, { "Lm", "modifierletter" },  { "Lo", "otherletter" },
	{ "M", "mark" },             { "Mn", "nonspacingmark" },  { "Mc", "spacingmark" },
	{ "Me", "enclosingmark" },   { "N", "number" },           { "Nd", "decimalnumber" },
	{ "Nl", "letternumber" },    { "No", "othernumber" },     { "P", "punctuation" },
	{ "Pc", "connectorpunctuation" }, { "Pd", "dashpunctuation" },
	{ "Ps", "openpunctuation" }, { "Pe", "closepunctuation" }, { "Pi", "initialpunctuation" },
	{ "Pf", "finalpunctuation" }, { "Po", "otherpunctuation" }, { "S", "symbol" },
	{ "Sm", "mathsymbol" },      { "Sc", "currencysymbol" },  { "Sk", "modifiersymbol" },
	{ "So", "othersymbol" },     { "Z", "separator" },        { "Zs", "spaceseparator" },
	{ "Zl", "lineseparator" },   { "Zp", "paragraphseparator" }, { "C", "other" },
	{ "Cc", "control" },         { "Cf", "format" },          { "Co", "privateuse" },
	{ "Cs", "surrogate" },       { "Cn", "unassigned" },
};
/* Scripts the models' patterns name (Oniguruma reads them as the Script property). */
static const char *const scripts[] = {
	"Han", "Hiragana", "Katakana", "Hangul", "Latin", "Greek", "Cyrillic", "Arabic",
	"Hebrew", "Thai", "Devanagari", "Bengali", "Tamil", "Telugu", "Armenian", "Georgian",
	"Ethiopic", "Khmer", "Lao", "Myanmar", "Tibetan", "Common", "Inherited",
};

static void squash(const char *s, size_t n, char *o, size_t cap)
{
	size_t k = 0;

	for (size_t i = 0; i < n && k + 1 < cap; i++)
		if (s[i] != ' ' && s[i] != '_' && s[i] != '-')
			o[k++] = (char)tolower((unsigned char)s[i]);
	o[k] = '\0';
}

static int refuse(const char *where, const char *what, char *err, size_t errlen)
{
	return hf_fail(err, errlen, "%s: %s is not supported (it means something else to the "
		       "library's Oniguruma than to PCRE2)", where, what);
}

/* The class body of the runs of key in tok_hf_ucd.c (empty when none). */
static int ucd_ranges(struct hf_buf *o, const char *key)
{
	for (size_t i = 0; i < hf_ucd_n_runs; i++) {
		char t[40];

		if (strcmp(hf_ucd_runs[i].key, key))
			continue;
		snprintf(t, sizeof(t), "\\x{%x}-\\x{%x}", hf_ucd_runs[i].lo, hf_ucd_runs[i].hi);
		if (hf_buf_add(o, t, strlen(t)))
			return -ENOMEM;
	}
	return 0;
}

static int add_str(struct hf_buf *o, const char *s)
{
	return hf_buf_add(o, s, strlen(s));
}

/*
 * A class of characters as Oniguruma's Unicode 16.0 has it: base (PCRE2 class items; single:
 * one \p{..}) plus the runs of key that PCRE2's tables lack, minus (for C and Cn) the
 * characters assigned since. neg for its complement; in_class to splice it into a class.
 */
static int emit_set(struct hf_buf *o, const char *base, int single, const char *key, int neg,
		    int in_class, const char *where, char *err, size_t errlen)
{
	struct hf_buf add = { 0 }, rem = { 0 };
	char rkey[8];
	int rc;

	snprintf(rkey, sizeof(rkey), "-%s", key);
	if ((rc = ucd_ranges(&add, key)) || (rc = ucd_ranges(&rem, rkey)))
		goto err;
	if (!neg) {
		if (in_class) {
			if (rem.len) {
				rc = refuse(where, "\\p{C} or \\p{Cn} inside a character class", err,
					    errlen);
				goto err;
			}
			rc = add_str(o, base) || hf_buf_add(o, add.p, add.len) ? -ENOMEM : 0;
		} else if (rem.len) {
			rc = add_str(o, "(?:(?![") || hf_buf_add(o, rem.p, rem.len) ||
			     add_str(o, "])[") || add_str(o, base) || add_str(o, "])") ? -ENOMEM : 0;
		} else if (single && !add.len) {
			rc = add_str(o, base) ? -ENOMEM : 0;
		} else {
			rc = add_str(o, "[") || add_str(o, base) || hf_buf_add(o, add.p, add.len) ||
			     add_str(o, "]") ? -ENOMEM : 0;
		}
	} else if (in_class) {
		if (add.len || !single) {
			rc = refuse(where, "this negated class inside a character class", err, errlen);
			goto err;
		}
		rc = add_str(o, "\\P") || add_str(o, base + 2) || hf_buf_add(o, rem.p, rem.len) ?
		     -ENOMEM : 0;
	} else {
		rc = add_str(o, "(?:") ? -ENOMEM : 0;
		if (!rc && add.len)
			rc = add_str(o, "(?![") || hf_buf_add(o, add.p, add.len) || add_str(o, "])") ?
			     -ENOMEM : 0;
		if (!rc)
			rc = add_str(o, "[^") || add_str(o, base) || add_str(o, "]") ? -ENOMEM : 0;
		if (!rc && rem.len)
			rc = add_str(o, "|[") || hf_buf_add(o, rem.p, rem.len) || add_str(o, "]") ?
			     -ENOMEM : 0;
		if (!rc)
			rc = add_str(o, ")") ? -ENOMEM : 0;
	}
err:
	hf_buf_free(&add);
	hf_buf_free(&rem);
	return rc;
}

/* \p{name} or \P{name} (neg). */
static int property(struct hf_buf *o, const char *name, size_t n, int neg, int in_class,
		    const char *where, char *err, size_t errlen)
{
	char key[48], cand[48], base[48];

	if (n && name[0] == '^') {
		neg = !neg;
		name++;
		n--;
	}
	if (n == 6 && !memcmp(name, "_RWord", 6)) /* our own name for the regex crate's \w */
		return emit_set(o, RUST_WORD, 0, "RWord", neg, in_class, where, err, errlen);
	squash(name, n, key, sizeof(key));
	for (size_t i = 0; i < sizeof(gc_names) / sizeof(gc_names[0]); i++) {
		squash(gc_names[i][0], strlen(gc_names[i][0]), cand, sizeof(cand));
		if (!strcmp(key, cand) || !strcmp(key, gc_names[i][1])) {
			snprintf(base, sizeof(base), "\\p{%s}", gc_names[i][0]);
			return emit_set(o, base, 1, gc_names[i][0], neg, in_class, where, err,
					errlen);
		}
	}
	for (size_t i = 0; i < sizeof(scripts) / sizeof(scripts[0]); i++) {
		squash(scripts[i], strlen(scripts[i]), cand, sizeof(cand));
		if (!strcmp(key, cand)) {
			char k[40];

			snprintf(base, sizeof(base), "\\p{sc:%s}", scripts[i]);
			snprintf(k, sizeof(k), "sc:%s", scripts[i]);
			return emit_set(o, base, 1, k, neg, in_class, where, err, errlen);
		}
	}
	return hf_fail(err, errlen, "%s: the property \\p{%.*s} is not supported", where, (int)n,
		       name);
}

/* Oniguruma's \b (neg: \B) with its \w. */
static int boundary(struct hf_buf *o, int neg, const char *where, char *err, size_t errlen)
{
	struct hf_buf w = { 0 };
	int rc = emit_set(&w, ONIG_WORD, 0, "Word", 0, 0, where, err, errlen);

	if (!rc && hf_buf_add(&w, "", 1))
		rc = -ENOMEM;
	if (!rc) {
		const char *f = neg ? "(?:(?<=%s)(?=%s)|(?<!%s)(?!%s))"
				    : "(?:(?<=%s)(?!%s)|(?<!%s)(?=%s))";
		const size_t len = strlen(f) + 4 * w.len;
		char *t = malloc(len);

		if (!t) {
			rc = -ENOMEM;
		} else {
			snprintf(t, len, f, w.p, w.p, w.p, w.p);
			rc = add_str(o, t) ? -ENOMEM : 0;
			free(t);
		}
	}
	hf_buf_free(&w);
	return rc;
}

/* One escape at p[i] == '\\'; *i is moved past it. */
static int escape(struct hf_buf *o, const char *p, size_t len, size_t *i, int in_class,
		  const char *where, char *err, size_t errlen)
{
	const char e = *i + 1 < len ? p[*i + 1] : '\0';
	const char *add = NULL;

	if (*i + 1 >= len)
		return hf_fail(err, errlen, "%s: the pattern ends with a backslash", where);
	*i += 2;
	switch (e) {
	case 'p':
	case 'P': {
		const char *close, *name;

		if (*i >= len || p[*i] != '{' || !(close = memchr(p + *i, '}', len - *i)))
			return hf_fail(err, errlen, "%s: \\%c without {name}", where, e);
		name = p + *i + 1;
		*i = (size_t)(close - p) + 1;
		return property(o, name, (size_t)(close - name), e == 'P', in_class, where, err,
				errlen);
	}
	case 's':
		add = "\\p{White_Space}";
		break;
	case 'S':
		add = "\\P{White_Space}";
		break;
	case 'd':
	case 'D':
		return emit_set(o, "\\p{Nd}", 1, "Nd", e == 'D', in_class, where, err, errlen);
	case 'w':
	case 'W':
		return emit_set(o, in_class ? ONIG_WORD_IN_CLASS : ONIG_WORD, 0, "Word", e == 'W',
				in_class, where, err, errlen);
	case 'h':
		add = in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
		break;
	case 'H':
		if (in_class)
			return refuse(where, "\\H inside a character class", err, errlen);
		add = "[^0-9a-fA-F]";
		break;
	case 'v':
		add = "\\x0b";
		break;
	case 'b':
		if (in_class) {
			add = "\\x08";
			break;
		}
		return boundary(o, 0, where, err, errlen);
	case 'B':
		if (in_class)
			return refuse(where, "\\B inside a character class", err, errlen);
		return boundary(o, 1, where, err, errlen);
	case 'u': {
		char t[16];
		size_t k = 0;

		while (k < 4 && *i + k < len && isxdigit((unsigned char)p[*i + k]))
			k++;
		if (k != 4)
			return hf_fail(err, errlen, "%s: \\u needs four hexadecimal digits", where);
		snprintf(t, sizeof(t), "\\x{%.4s}", p + *i);
		*i += 4;
		return hf_buf_add(o, t, strlen(t));
	}
	case 'Q':
		return refuse(where, "\\Q", err, errlen);
	default: {
		/* Everything else reads the same: copy the escape and its whole character. */
		size_t cl = 1;

		if ((unsigned char)e >= 0x80)
			(void)hf_utf8_next(p + *i - 1, &cl);
		if (hf_buf_add(o, "\\", 1) || hf_buf_add(o, p + *i - 1, cl))
			return -ENOMEM;
		*i += cl - 1;
		return 0;
	}
	}
	return hf_buf_add(o, add, strlen(add));
}

/* Ruby's (?imx-imx) and (?imx-imx:..): m becomes s. */
static int options(struct hf_buf *o, const char *p, size_t len, size_t *i)
{
	size_t k = *i + 2;

	while (k < len && (p[k] == 'i' || p[k] == 'm' || p[k] == 'x' || p[k] == '-'))
		k++;
	if (k == *i + 2 || k >= len || (p[k] != ')' && p[k] != ':'))
		return 1; /* not an option group: copied as it is */
	for (size_t j = *i; j <= k; j++)
		if (hf_buf_add(o, p[j] == 'm' && j >= *i + 2 ? "s" : p + j, 1))
			return -ENOMEM;
	*i = k + 1;
	return 0;
}

/* Oniguruma folds case to several characters (ß matches "ss" under (?i)), PCRE2 to one: a
 * caseless pattern holding such a character is refused. */
static int caseless_multi(const char *p, size_t len, const char *where, char *err,
			  size_t errlen)
{
	int caseless = 0;

	for (size_t i = 0; i + 2 < len && !caseless; i++) {
		if (p[i] == '(' && p[i + 1] == '?' && (i == 0 || p[i - 1] != '\\')) {
			for (size_t k = i + 2; k < len && p[k] != ')' && p[k] != ':' && p[k] != '-';
			     k++)
				caseless |= p[k] == 'i';
		}
	}
	for (size_t i = 0; caseless && i < len;) {
		size_t cl;
		const uint32_t cp = hf_utf8_next(p + i, &cl);
		utf8proc_int32_t dst[8];
		int last = 0;

		if (cp >= 0x80 &&
		    utf8proc_decompose_char((utf8proc_int32_t)cp, dst, 8, UTF8PROC_CASEFOLD, &last) > 1)
			return hf_fail(err, errlen, "%s: a caseless pattern with \"%.*s\", whose case "
				       "folding is several characters, is not supported (Oniguruma "
				       "matches the characters, PCRE2 does not)", where, (int)cl,
				       p + i);
		i += cl;
	}
	return 0;
}

static int translate(struct hf_buf *o, const char *p, size_t len, const char *where, char *err,
		     size_t errlen)
{
	int in_class = 0, rc;
	size_t i = 0, class_at = 0;

	if ((rc = caseless_multi(p, len, where, err, errlen)))
		return rc;

	while (i < len) {
		const char ch = p[i];

		if (ch == '\\') {
			rc = escape(o, p, len, &i, in_class, where, err, errlen);
			if (rc)
				return rc;
			continue;
		}
		if (in_class) {
			if (ch == '[')
				return refuse(where, i + 1 < len && p[i + 1] == ':' ?
					      "a POSIX bracket class" : "a nested character class",
					      err, errlen);
			if (ch == '&' && i + 1 < len && p[i + 1] == '&')
				return refuse(where, "a class intersection (&&)", err, errlen);
			if (ch == ']' && i > class_at)
				in_class = 0;
		} else if (ch == '[') {
			in_class = 1;
			class_at = i + 1;
			if (class_at < len && p[class_at] == '^')
				class_at++;
			/* a ']' right after '[' or '[^' is a literal in both */
		} else if (ch == '(' && i + 2 < len && p[i + 1] == '?') {
			rc = options(o, p, len, &i);
			if (rc <= 0) {
				if (rc)
					return rc;
				continue;
			}
		} else if (ch == '{' && i + 1 < len && p[i + 1] == ',') {
			size_t k = i + 2;

			while (k < len && isdigit((unsigned char)p[k]))
				k++;
			if (k > i + 2 && k < len && p[k] == '}') {
				if (hf_buf_add(o, "{0", 2))
					return -ENOMEM;
				i++;
				continue;
			}
		}
		if (hf_buf_add(o, &p[i], 1))
			return -ENOMEM;
		i++;
	}
	return hf_buf_add(o, "", 1); /* NUL-terminated for messages */
}

int hf_regex_compile(struct hf_regex *r, const char *pattern, size_t len, int syntax,
		     const char *where, char *err, size_t errlen)
{
	struct hf_buf o = { 0 };
	pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
	uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
	PCRE2_SIZE eoff;
	int ecode, rc = 0;

	r->re = NULL;
	if (!cc)
		return -ENOMEM;
	pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
	pcre2_set_bsr(cc, PCRE2_BSR_UNICODE);
	if (syntax == HF_RE_LITERAL) {
		opts = PCRE2_UTF | PCRE2_NO_UTF_CHECK | PCRE2_LITERAL;
		rc = hf_buf_add(&o, pattern, len);
	} else if (syntax == HF_RE_PCRE2) {
		rc = hf_buf_add(&o, pattern, len);
	} else {
		opts |= PCRE2_MULTILINE;
		rc = translate(&o, pattern, len, where, err, errlen);
		if (!rc)
			o.len--; /* the NUL */
	}
	if (rc)
		goto err;
	r->re = pcre2_compile((PCRE2_SPTR)o.p, o.len, opts, &ecode, &eoff, cc);
	if (!r->re) {
		PCRE2_UCHAR msg[160];

		pcre2_get_error_message(ecode, msg, sizeof(msg));
		rc = hf_fail(err, errlen, "%s: pattern \"%.80s\" does not compile (%s)", where,
			     pattern, (const char *)msg);
		goto err;
	}
	(void)pcre2_jit_compile(r->re, PCRE2_JIT_COMPLETE); /* the interpreter when it cannot */
	pcre2_pattern_info(r->re, PCRE2_INFO_CAPTURECOUNT, &r->captures);
err:
	pcre2_compile_context_free(cc);
	hf_buf_free(&o);
	return rc;
}

void hf_regex_free(struct hf_regex *r)
{
	pcre2_code_free(r->re);
	r->re = NULL;
}

static int match_at(struct hf_ctx *c, const struct hf_regex *r, const char *s, size_t len,
		    size_t at)
{
	int rc;

	if (!c->md) {
		c->md = pcre2_match_data_create(c->t->max_captures + 1, NULL);
		c->mctx = pcre2_match_context_create(NULL);
		c->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
		if (!c->md || !c->mctx)
			return -ENOMEM;
		if (c->jit)
			pcre2_jit_stack_assign(c->mctx, NULL, c->jit);
	}
	rc = pcre2_match(r->re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
	if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
		rc = pcre2_match(r->re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
				 c->md, c->mctx);
	return rc;
}

int hf_regex_find(struct hf_ctx *c, const struct hf_regex *r, const char *s, size_t len,
		  struct hf_spans *out)
{
	size_t last_end = 0, last_match_end = 0;
	int have_last = 0;

	while (last_end <= len) {
		const int rc = match_at(c, r, s, len, last_end);
		const PCRE2_SIZE *ov;

		if (rc == PCRE2_ERROR_NOMATCH)
			return 0;
		if (rc == -ENOMEM)
			return rc;
		if (rc < 0)
			return -EIO;
		ov = pcre2_get_ovector_pointer(c->md);
		if (ov[0] == ov[1] && have_last && last_match_end == ov[1]) {
			/* An empty match right after the previous match: step one character. */
			size_t cl = 1;

			if (last_end < len)
				(void)hf_utf8_next(s + last_end, &cl);
			last_end += cl;
			continue;
		}
		last_end = ov[1];
		last_match_end = ov[1];
		have_last = 1;
		if (hf_spans_add(out, ov[0], ov[1], 1))
			return -ENOMEM;
	}
	return 0;
}

int hf_regex_load(struct dps_tok_hf *t, struct hf_regex *r, struct json_t *pattern,
		  const char *path, char *err, size_t errlen)
{
	json_t *s = json_object_get(pattern, "String"), *x = json_object_get(pattern, "Regex");
	int rc;

	if (!json_is_object(pattern) || json_object_size(pattern) != 1 ||
	    !json_is_string(s ? s : x))
		return hf_fail(err, errlen, "%s must be {\"String\": ...} or {\"Regex\": ...}", path);
	rc = hf_regex_compile(r, json_string_value(s ? s : x), json_string_length(s ? s : x),
			      s ? HF_RE_LITERAL : HF_RE_ONIG, path, err, errlen);
	if (!rc && r->captures > t->max_captures)
		t->max_captures = r->captures;
	return rc;
}

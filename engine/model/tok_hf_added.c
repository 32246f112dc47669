/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_hf_added.c - the added tokens of tokenizer.json ("added_tokens"), as the
 * `tokenizers` library's AddedVocabulary: loaded after the model and the normalizer
 * (hf_added_load, called by tok_hf.c), and matched in every prompt before the model runs
 * (hf_added_find, called by the encode driver of tok_hf.c: first the tokens with normalized =
 * false on the raw text, then those with normalized = true on each normalized piece).
 *
 * Ids: the library ignores the "id" written in the file. A token takes the id its content
 * already has (an earlier added token, else the model's vocabulary), or else the next new id,
 * counted from the number of vocabulary entries. A later token of the same content replaces the
 * earlier one's flags; the special set only grows. Matching is leftmost-longest over one byte
 * trie per set; a single_word token is dropped when a word character (the regex crate's \w)
 * touches it; lstrip and rstrip take in the whitespace before and after the token (lstrip never
 * before the end of the previous match). A dropped match is not searched again for shorter
 * tokens, as the library's automaton does not.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/dps.h"
#include "engine/model/tok_hf_int.h"

static int trie_node(struct hf_trie *tr, uint8_t byte, uint32_t *out)
{
	if (tr->n == tr->cap) {
		const size_t cap = tr->cap ? 2 * tr->cap : 64;
		struct hf_trie_node *n = realloc(tr->node, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		tr->node = n;
		tr->cap = cap;
		if (tr->n == 0)
			tr->node[tr->n++] = (struct hf_trie_node){ .tok = -1 }; /* the root */
	}
	tr->node[tr->n] = (struct hf_trie_node){ .tok = -1, .byte = byte };
	*out = (uint32_t)tr->n++;
	return 0;
}

/* Adds pattern p (len >= 1) for token index tok; -EEXIST when another token has it. */
static int trie_add(struct hf_trie *tr, const char *p, size_t len, int32_t tok)
{
	uint32_t nd;
	int rc;

	if (!tr->root[(uint8_t)p[0]]) {
		if ((rc = trie_node(tr, (uint8_t)p[0], &nd)))
			return rc;
		tr->root[(uint8_t)p[0]] = nd;
	}
	nd = tr->root[(uint8_t)p[0]];
	for (size_t i = 1; i < len; i++) {
		uint32_t ch = tr->node[nd].child;

		while (ch && tr->node[ch].byte != (uint8_t)p[i])
			ch = tr->node[ch].sib;
		if (!ch) {
			if ((rc = trie_node(tr, (uint8_t)p[i], &ch)))
				return rc;
			tr->node[ch].sib = tr->node[nd].child;
			tr->node[nd].child = ch;
		}
		nd = ch;
	}
	if (tr->node[nd].tok >= 0)
		return -EEXIST;
	tr->node[nd].tok = tok;
	return 0;
}

/* The longest pattern starting at s[i]: its token index (end in *end), or -1. */
static int32_t trie_longest(const struct hf_trie *tr, const char *s, size_t len, size_t i,
			    size_t *end)
{
	uint32_t nd = tr->root[(uint8_t)s[i]];
	int32_t best = -1;

	while (nd) {
		uint32_t ch;

		i++;
		if (tr->node[nd].tok >= 0) {
			best = tr->node[nd].tok;
			*end = i;
		}
		if (i >= len)
			break;
		for (ch = tr->node[nd].child; ch && tr->node[ch].byte != (uint8_t)s[i];
		     ch = tr->node[ch].sib)
			;
		nd = ch;
	}
	return best;
}

static int parse_token(json_t *o, size_t i, struct hf_added_tok *tk, char *err, size_t errlen)
{
	static const char *const flags[] = { "single_word", "lstrip", "rstrip", "normalized",
					     "special" };
	char path[40];
	const char *s;
	size_t len;
	json_t *id;
	int v[5], rc;

	snprintf(path, sizeof(path), "added_tokens[%zu]", i);
	if (!json_is_object(o))
		return hf_fail(err, errlen, "%s is %s, not an object", path, hf_json_type(o));
	id = json_object_get(o, "id");
	if (!json_is_integer(id) || json_integer_value(id) < 0 ||
	    json_integer_value(id) > INT32_MAX - 1)
		return hf_fail(err, errlen, "%s.id is not an integer id in [0, %d]", path,
			       INT32_MAX - 1);
	rc = hf_json_str(o, path, "content", 0, &s, &len, err, errlen);
	for (int k = 0; !rc && k < 5; k++)
		rc = hf_json_bool(o, path, flags[k], -1, &v[k], err, errlen);
	if (rc)
		return rc;
	if (len > UINT32_MAX / 2)
		return hf_fail(err, errlen, "%s.content is too long", path);
	tk->content = (char *)s; /* copied by the caller */
	tk->len = (uint32_t)len;
	tk->single_word = (uint8_t)v[0];
	tk->lstrip = (uint8_t)v[1];
	tk->rstrip = (uint8_t)v[2];
	tk->normalized = (uint8_t)v[3];
	tk->special = (uint8_t)v[4];
	return 0;
}

static int same_token(const struct hf_added_tok *a, const struct hf_added_tok *b)
{
	return a->len == b->len && !memcmp(a->content, b->content, a->len) &&
	       a->single_word == b->single_word && a->lstrip == b->lstrip &&
	       a->rstrip == b->rstrip && a->normalized == b->normalized && a->special == b->special;
}

/* The normalized form of a normalized token (the library normalizes its content alone). */
static int normalize_content(const struct dps_tok_hf *t, struct hf_added_tok *tk)
{
	struct hf_ctx c = { .t = t };
	struct hf_piece in = { .s = tk->content, .len = tk->len, .first = 1 }, out;
	int rc = hf_norm_apply(&c, &in, &out);

	if (!rc && (out.len != tk->len || memcmp(out.s, tk->content, tk->len))) {
		tk->pattern = malloc(out.len + 1);
		if (!tk->pattern)
			rc = -ENOMEM;
		else {
			memcpy(tk->pattern, out.s, out.len);
			tk->pattern[out.len] = '\0';
			tk->pattern_len = (uint32_t)out.len;
		}
	}
	hf_ctx_free(&c);
	return rc;
}

/* Puts tk (content not yet owned) at id: a new entry, or the replacement of id's entry. */
static int put_token(struct dps_tok_hf *t, struct hf_added_tok *tk, int32_t id)
{
	struct hf_added_tok *slot = NULL;
	char *content = malloc(tk->len + 1);

	if (!content)
		return -ENOMEM;
	memcpy(content, tk->content, tk->len);
	content[tk->len] = '\0';
	tk->content = content;
	tk->id = id;
	for (size_t i = 0; i < t->n_added; i++)
		if (t->added[i].id == id)
			slot = &t->added[i];
	if (slot) {
		free(slot->content);
		free(slot->pattern);
	} else {
		struct hf_added_tok *a = realloc(t->added, (t->n_added + 1) * sizeof(*a));

		if (!a) {
			free(content);
			return -ENOMEM;
		}
		t->added = a;
		slot = &t->added[t->n_added++];
	}
	*slot = *tk;
	return 0;
}

static int build_tries(struct dps_tok_hf *t, char *err, size_t errlen)
{
	for (size_t i = 0; i < t->n_added; i++) {
		struct hf_added_tok *tk = &t->added[i];
		struct hf_trie *tr = tk->normalized ? &t->trie_norm : &t->trie_raw;
		const char *p = tk->pattern ? tk->pattern : tk->content;
		const size_t len = tk->pattern ? tk->pattern_len : tk->len;
		int rc;

		if (!len)
			continue; /* normalized to nothing: the library's matcher never finds it */
		rc = trie_add(tr, p, len, (int32_t)i);
		if (rc == -EEXIST)
			return hf_fail(err, errlen, "two added tokens match \"%.60s\" (which one the "
				       "library finds depends on its hash order)", p);
		if (rc)
			return rc;
		if (tk->normalized)
			t->has_trie_norm = 1;
		else
			t->has_trie_raw = 1;
	}
	return 0;
}

int hf_added_load(struct dps_tok_hf *t, json_t *arr, char *err, size_t errlen)
{
	int32_t next_id;
	int rc = 0;

	if (!arr || json_is_null(arr))
		return 0;
	if (!json_is_array(arr))
		return hf_fail(err, errlen, "added_tokens is %s, not an array", hf_json_type(arr));
	if (t->bpe.vocab.n > INT32_MAX - json_array_size(arr) - 1)
		return hf_fail(err, errlen, "added_tokens: too many ids");
	next_id = (int32_t)t->bpe.vocab.n;
	for (size_t i = 0; i < json_array_size(arr); i++) {
		struct hf_added_tok tk = { 0 };
		int32_t id;

		rc = parse_token(json_array_get(arr, i), i, &tk, err, errlen);
		if (rc)
			return rc;
		if (!tk.len)
			continue;
		id = hf_map_get(&t->added_by_content, tk.content, tk.len);
		if (id >= 0) {
			size_t k = 0;

			while (t->added[k].id != id)
				k++;
			if (same_token(&t->added[k], &tk))
				continue;
		} else {
			id = hf_map_get(&t->bpe.vocab, tk.content, tk.len);
		}
		if (id < 0)
			id = next_id++;
		if (tk.normalized && t->has_normalizer && (rc = normalize_content(t, &tk)))
			return rc;
		if ((rc = hf_map_put(&t->added_by_content, tk.content, tk.len, id)) ||
		    (tk.special && (rc = hf_map_put(&t->special, tk.content, tk.len, 0)))) {
			free(tk.pattern);
			return rc;
		}
		rc = put_token(t, &tk, id);
		if (rc) {
			free(tk.pattern);
			return rc;
		}
	}
	return build_tries(t, err, errlen);
}

/* The regex crate's \w (Alphabetic, marks, decimal digits, connectors, joiners), compiled
 * once for every tokenizer. */
static struct hf_regex word_re;

static void word_re_compile(void)
{
	static const char pattern[] = "[\\p{_RWord}]";
	char err[160];

	if (hf_regex_compile(&word_re, pattern, sizeof(pattern) - 1, HF_RE_ONIG, "\\w", err,
			     sizeof(err)))
		word_re.re = NULL;
}

static int word_char(const char *s, size_t n)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pcre2_match_data *md;
	int rc;

	pthread_once(&once, word_re_compile);
	if (!word_re.re || !(md = pcre2_match_data_create(1, NULL)))
		return 0;
	rc = pcre2_match(word_re.re, (PCRE2_SPTR)s, n, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, md,
			 NULL);
	pcre2_match_data_free(md);
	return rc >= 0;
}

/* Whether the character ending at s[end] (end > 0) is a word character. */
static int word_before(const char *s, size_t end)
{
	size_t b = end - 1, cl;

	while (b > 0 && ((unsigned char)s[b] & 0xc0) == 0x80)
		b--;
	(void)hf_utf8_next(s + b, &cl);
	return word_char(s + b, cl);
}

static int word_after(const char *s, size_t len, size_t at)
{
	size_t cl;

	(void)hf_utf8_next(s + at, &cl);
	return cl <= len - at && word_char(s + at, cl);
}

int hf_added_find(const struct dps_tok_hf *t, const struct hf_trie *trie, const char *s,
		  size_t len, struct hf_spans *out)
{
	size_t start_offset = 0, i = 0;

	out->n = 0;
	while (i < len) {
		size_t start = i, stop = 0;
		const int32_t k = trie_longest(trie, s, len, i, &stop);
		const struct hf_added_tok *tk;

		if (k < 0) {
			i++;
			continue;
		}
		tk = &t->added[k];
		i = stop; /* the automaton goes on after the match, whatever rstrip takes */
		if (tk->single_word && ((start > 0 && word_before(s, start)) ||
					(stop < len && word_after(s, len, stop))))
			continue;
		if (tk->lstrip) {
			size_t ns = start;

			while (ns > 0) {
				size_t b = ns - 1, cl;

				while (b > 0 && ((unsigned char)s[b] & 0xc0) == 0x80)
					b--;
				if (!hf_is_whitespace(hf_utf8_next(s + b, &cl)))
					break;
				ns = b;
			}
			start = ns > start_offset ? ns : start_offset;
		}
		if (tk->rstrip) {
			size_t cl;

			while (stop < len && hf_is_whitespace(hf_utf8_next(s + stop, &cl)))
				stop += cl;
		}
		if (start_offset < start && hf_spans_add(out, start_offset, start, 0))
			return -ENOMEM;
		if (hf_spans_add(out, start, stop, k + 1))
			return -ENOMEM;
		start_offset = stop;
	}
	if (start_offset != len && hf_spans_add(out, start_offset, len, 0))
		return -ENOMEM;
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_hf_bpe.c - the BPE model of tokenizer.json, as the `tokenizers` library's
 * models::bpe: the vocabulary and merges at load (hf_bpe_load, called by tok_hf.c), and one
 * pre-tokenized word at a time at encode (hf_bpe_word, called by the pre-tokenizer chain of
 * tok_hf_pretok.c, once per word of every prompt).
 *
 * A word starts as one symbol per character (continuing_subword_prefix before every character
 * but the first, end_of_word_suffix after the last; a character outside the vocabulary becomes
 * its "<0xXX>" byte tokens with byte_fallback, else unk_token, fused with the unknown before it
 * when fuse_unk, else nothing). Then the merges apply as Word::merge_all does: a min-heap of
 * (rank, position) over the pairs of neighbouring symbols of a linked list; the popped pair
 * merges unless its left symbol was merged away, has no right neighbour, or the pair there now
 * merges into another token (the library checks only the new id, and so do we); each merge
 * pushes the pairs it forms with its neighbours. O(n log n) in the word's length. With
 * ignore_merges a word that is a token is that token. Words below 256 bytes are cached for the
 * rest of the encode call.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/dps.h"
#include "engine/model/tok_hf_int.h"

#define EMPTY_KEY UINT64_MAX

/* splitmix64's finalizer: every bit of both ids reaches the slot's bits. */
static size_t merge_slot(const struct hf_bpe *b, uint64_t key)
{
	uint64_t h = key;

	h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
	h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
	h ^= h >> 31;
	return (size_t)h & b->merge_mask;
}

/* The merge of pair (a, b): its slot, or -1. */
static long merge_find(const struct hf_bpe *b, int32_t x, int32_t y)
{
	const uint64_t key = (uint64_t)(uint32_t)x << 32 | (uint32_t)y;
	size_t i;

	if (!b->n_merges)
		return -1;
	for (i = merge_slot(b, key);; i = (i + 1) & b->merge_mask) {
		if (b->merges[i].key == key)
			return (long)i;
		if (b->merges[i].key == EMPTY_KEY)
			return -1;
	}
}

/* Records a merge; a pair merged twice keeps the later rank (the library collects the merges
 * into a map in file order). */
static void merge_put(struct hf_bpe *b, int32_t x, int32_t y, uint32_t rank, int32_t new_id)
{
	const uint64_t key = (uint64_t)(uint32_t)x << 32 | (uint32_t)y;
	size_t i;

	for (i = merge_slot(b, key); b->merges[i].key != EMPTY_KEY && b->merges[i].key != key;
	     i = (i + 1) & b->merge_mask)
		;
	if (b->merges[i].key == EMPTY_KEY)
		b->n_merges++;
	b->merges[i].key = key;
	b->merges[i].rank = rank;
	b->merges[i].new_id = new_id;
}

/* One merge entry: "a b" or ["a", "b"] into its two parts. */
static int merge_parts(json_t *m, size_t i, const char **a, size_t *alen, const char **bb,
		       size_t *blen, char *err, size_t errlen)
{
	if (json_is_string(m)) {
		const char *s = json_string_value(m);
		const size_t len = json_string_length(m);
		const char *sp = memchr(s, ' ', len);

		if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp - s) - 1))
			return hf_fail(err, errlen,
				       "model.merges[%zu] is not two tokens separated by one space",
				       i);
		*a = s;
		*alen = (size_t)(sp - s);
		*bb = sp + 1;
		*blen = len - *alen - 1;
		return 0;
	}
	if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
	    json_is_string(json_array_get(m, 1))) {
		*a = json_string_value(json_array_get(m, 0));
		*alen = json_string_length(json_array_get(m, 0));
		*bb = json_string_value(json_array_get(m, 1));
		*blen = json_string_length(json_array_get(m, 1));
		return 0;
	}
	return hf_fail(err, errlen, "model.merges[%zu] is neither a string nor a pair of strings",
		       i);
}

static int load_vocab(struct hf_bpe *b, json_t *vocab, char *err, size_t errlen)
{
	const char *key;
	json_t *v;
	void *iter;
	int32_t max_id = -1;
	int rc;

	if (!json_is_object(vocab))
		return hf_fail(err, errlen, "model.vocab is %s, not an object", hf_json_type(vocab));
	for (iter = json_object_iter(vocab); iter; iter = json_object_iter_next(vocab, iter)) {
		json_int_t id;
		size_t klen;

		key = json_object_iter_key(iter);
		klen = json_object_iter_key_len(iter);
		v = json_object_iter_value(iter);
		if (!json_is_integer(v) || (id = json_integer_value(v)) < 0 || id > HF_MAX_ID)
			return hf_fail(err, errlen,
				       "model.vocab[\"%.40s\"] is not an integer id in [0, %d] (ids "
				       "index tables of the vocabulary's size)", key, HF_MAX_ID);
		rc = hf_map_put(&b->vocab, key, klen, (int32_t)id);
		if (rc)
			return rc;
		if (id > max_id)
			max_id = (int32_t)id;
		if (klen > b->max_len)
			b->max_len = klen;
	}
	b->n_ids = max_id + 1;
	b->id_str = calloc((size_t)b->n_ids + 1, sizeof(*b->id_str));
	b->id_len = calloc((size_t)b->n_ids + 1, sizeof(*b->id_len));
	if (!b->id_str || !b->id_len)
		return -ENOMEM;
	for (size_t i = 0; i < b->vocab.n; i++) {
		const struct hf_map_ent *e = &b->vocab.ent[i];
		const char *s = b->vocab.keys.p + e->off;

		if (b->id_str[e->val])
			return hf_fail(err, errlen,
				       "model.vocab gives id %d to both \"%.*s\" and \"%.*s\" "
				       "(which one decodes is undefined in the library)",
				       e->val, (int)(b->id_len[e->val] > 40 ? 40 : b->id_len[e->val]),
				       b->id_str[e->val], (int)(e->len > 40 ? 40 : e->len), s);
		b->id_str[e->val] = s;
		b->id_len[e->val] = e->len;
	}
	for (int i = 0; i < 256; i++) {
		char name[8];

		snprintf(name, sizeof(name), "<0x%02X>", i);
		b->byte_id[i] = hf_map_get(&b->vocab, name, 6);
	}
	return 0;
}

static int load_merges(struct hf_bpe *b, json_t *merges, char *err, size_t errlen)
{
	const size_t n = json_array_size(merges);
	size_t cap = 16, rank = 0;
	char *buf = NULL;
	int rc = 0;

	if (!json_is_array(merges))
		return hf_fail(err, errlen, "model.merges is %s, not an array",
			       hf_json_type(merges));
	if (n > UINT32_MAX / 4)
		return hf_fail(err, errlen, "model.merges has more than %u entries",
			       UINT32_MAX / 4);
	while (cap < 2 * n)
		cap <<= 1;
	b->merge_mask = cap - 1;
	b->merges = malloc(cap * sizeof(*b->merges));
	buf = malloc(2 * b->max_len + 1);
	if (!b->merges || !buf) {
		rc = -ENOMEM;
		goto err;
	}
	for (size_t i = 0; i < cap; i++)
		b->merges[i].key = EMPTY_KEY;
	for (size_t i = 0; i < n; i++) {
		json_t *m = json_array_get(merges, i);
		const char *x = NULL, *y = NULL;
		size_t xl = 0, yl = 0;
		int32_t xi, yi, ni;

		if (json_is_string(m) != json_is_string(json_array_get(merges, 0))) {
			rc = hf_fail(err, errlen, "model.merges mixes strings and pairs (entry %zu)",
				     i);
			goto err;
		}
		/* The text format's header line is no merge (and takes no rank). */
		if (json_is_string(m) && json_string_length(m) >= 8 &&
		    !memcmp(json_string_value(m), "#version", 8))
			continue;
		rc = merge_parts(m, i, &x, &xl, &y, &yl, err, errlen);
		if (rc)
			goto err;
		xi = hf_map_get(&b->vocab, x, xl);
		yi = hf_map_get(&b->vocab, y, yl);
		if (xi < 0 || yi < 0) {
			rc = hf_fail(err, errlen, "model.merges[%zu]: token \"%.*s\" is not in "
				     "model.vocab", i, (int)((xi < 0 ? xl : yl) > 60 ? 60 :
							     (xi < 0 ? xl : yl)), xi < 0 ? x : y);
			goto err;
		}
		if (yl < b->prefix_len || (b->prefix_len && memcmp(y, b->prefix, b->prefix_len))) {
			rc = hf_fail(err, errlen, "model.merges[%zu]: \"%.*s\" does not start with "
				     "model.continuing_subword_prefix", i, (int)(yl > 60 ? 60 : yl),
				     y);
			goto err;
		}
		memcpy(buf, x, xl);
		memcpy(buf + xl, y + b->prefix_len, yl - b->prefix_len);
		ni = hf_map_get(&b->vocab, buf, xl + yl - b->prefix_len);
		if (ni < 0) {
			rc = hf_fail(err, errlen, "model.merges[%zu]: the merged token \"%.*s\" is not "
				     "in model.vocab", i, (int)(xl + yl - b->prefix_len > 60 ? 60 :
								xl + yl - b->prefix_len), buf);
			goto err;
		}
		merge_put(b, xi, yi, (uint32_t)rank++, ni);
	}
err:
	free(buf);
	return rc;
}

static int dup_opt(json_t *model, const char *field, char **out, size_t *len, char *err,
		   size_t errlen)
{
	const char *s;
	int rc = hf_json_str(model, "model", field, 1, &s, len, err, errlen);

	/* An empty prefix or suffix changes no string: the same as none. */
	if (rc || !s || !*len)
		return rc;
	*out = malloc(*len + 1);
	if (!*out)
		return -ENOMEM;
	memcpy(*out, s, *len);
	(*out)[*len] = '\0';
	return 0;
}

int hf_bpe_load(struct hf_bpe *b, json_t *model, char *err, size_t errlen)
{
	const char *type = NULL, *unk;
	size_t len;
	json_t *drop;
	int rc;

	memset(b->byte_id, 0xff, sizeof(b->byte_id));
	b->unk_id = -1;
	if (!json_is_object(model))
		return hf_fail(err, errlen, "model is %s, not an object", hf_json_type(model));
	if (json_object_get(model, "type")) {
		rc = hf_json_str(model, "model", "type", 0, &type, &len, err, errlen);
		if (rc)
			return rc;
		if (strcmp(type, "BPE"))
			return hf_fail(err, errlen, "model type \"%s\" is not supported (only BPE)",
				       type);
	} else if (!json_object_get(model, "merges")) {
		return hf_fail(err, errlen, "model has no \"type\" and no \"merges\" (only BPE is "
			       "supported)");
	}
	drop = json_object_get(model, "dropout");
	if (drop && !json_is_null(drop) && !(json_is_number(drop) && json_number_value(drop) == 0))
		return hf_fail(err, errlen, "model.dropout must be null (BPE dropout is random, so "
			       "its results cannot be reproduced)");
	if ((rc = hf_json_bool(model, "model", "fuse_unk", 0, &b->fuse_unk, err, errlen)) ||
	    (rc = hf_json_bool(model, "model", "byte_fallback", 0, &b->byte_fallback, err,
			       errlen)) ||
	    (rc = hf_json_bool(model, "model", "ignore_merges", 0, &b->ignore_merges, err,
			       errlen)) ||
	    (rc = dup_opt(model, "continuing_subword_prefix", &b->prefix, &b->prefix_len, err,
			  errlen)) ||
	    (rc = dup_opt(model, "end_of_word_suffix", &b->suffix, &b->suffix_len, err, errlen)))
		return rc;
	if (!json_object_get(model, "vocab") || !json_object_get(model, "merges"))
		return hf_fail(err, errlen, "model needs both \"vocab\" and \"merges\"");
	rc = load_vocab(b, json_object_get(model, "vocab"), err, errlen);
	if (!rc)
		rc = load_merges(b, json_object_get(model, "merges"), err, errlen);
	if (rc)
		return rc;
	rc = hf_json_str(model, "model", "unk_token", 1, &unk, &len, err, errlen);
	if (rc)
		return rc;
	if (unk) {
		b->unk_id = hf_map_get(&b->vocab, unk, len);
		if (b->unk_id < 0)
			return hf_fail(err, errlen, "model.unk_token \"%.60s\" is not in model.vocab",
				       unk);
	}
	hf_bpe_plan_split(b);
	return 0;
}

void hf_bpe_free(struct hf_bpe *b)
{
	hf_map_free(&b->vocab);
	free(b->id_str);
	free(b->id_len);
	free(b->merges);
	free(b->prefix);
	free(b->suffix);
}

/* ---- encoding ---- */

static int sym_add(struct hf_ctx *c, size_t *n, int32_t id, uint32_t len)
{
	if (*n == c->sym_cap) {
		const size_t cap = c->sym_cap ? 2 * c->sym_cap : 64;
		struct hf_sym *s = realloc(c->sym, cap * sizeof(*s));

		if (!s)
			return -ENOMEM;
		c->sym = s;
		c->sym_cap = cap;
	}
	c->sym[*n] = (struct hf_sym){ .c = id, .prev = (int32_t)*n - 1, .next = -1, .len = len };
	if (*n)
		c->sym[*n - 1].next = (int32_t)*n;
	(*n)++;
	return 0;
}

/*
 * The merge queue: a 4-ary min-heap on (rank, pos) packed in one 64-bit key (a shallower heap
 * with one comparison per step: the queue of a long word is most of its encode). Equal keys
 * are the same pair at the same place, so their order does not matter.
 */
static int heap_grow(struct hf_ctx *c, size_t n)
{
	if (n <= c->heap_cap)
		return 0;
	{
		size_t cap = c->heap_cap ? c->heap_cap : 64;
		struct hf_merge *h;

		while (cap < n)
			cap *= 2;
		h = realloc(c->heap, cap * sizeof(*h));
		if (!h)
			return -ENOMEM;
		c->heap = h;
		c->heap_cap = cap;
	}
	return 0;
}

static void sift_down(struct hf_merge *h, size_t n, size_t i, struct hf_merge m)
{
	for (;;) {
		const size_t k0 = 4 * i + 1;
		size_t k = k0;

		if (k0 >= n)
			break;
		for (size_t j = k0 + 1; j < k0 + 4 && j < n; j++)
			if (h[j].key < h[k].key)
				k = j;
		if (h[k].key >= m.key)
			break;
		h[i] = h[k];
		i = k;
	}
	h[i] = m;
}

static int heap_push(struct hf_ctx *c, size_t *n, struct hf_merge m)
{
	size_t i;
	int rc = heap_grow(c, *n + 1);

	if (rc)
		return rc;
	for (i = (*n)++; i > 0; i = (i - 1) / 4) {
		const size_t up = (i - 1) / 4;

		if (m.key >= c->heap[up].key)
			break;
		c->heap[i] = c->heap[up];
	}
	c->heap[i] = m;
	return 0;
}

static struct hf_merge heap_pop(struct hf_ctx *c, size_t *n)
{
	const struct hf_merge top = c->heap[0];

	if (--(*n))
		sift_down(c->heap, *n, 0, c->heap[*n]);
	return top;
}

/* The merge of the pair starting at symbol pos into *m; 0 when there is none. */
static int pair_at(const struct hf_ctx *c, int32_t pos, struct hf_merge *m)
{
	const struct hf_bpe *b = &c->t->bpe;
	const struct hf_sym *s = &c->sym[pos];
	long slot;

	if (s->next < 0)
		return 0;
	slot = merge_find(b, s->c, c->sym[s->next].c);
	if (slot < 0)
		return 0;
	m->key = (uint64_t)b->merges[slot].rank << 32 | (uint32_t)pos;
	m->new_id = b->merges[slot].new_id;
	return 1;
}

/* Pushes the merge of the pair starting at symbol pos, if there is one. */
static int push_pair(struct hf_ctx *c, size_t *hn, int32_t pos)
{
	struct hf_merge m;

	return pair_at(c, pos, &m) ? heap_push(c, hn, m) : 0;
}

/* Word::merge_all: the same merges in the same order as the library's binary heap. */
static int merge_all(struct hf_ctx *c, size_t n)
{
	const struct hf_bpe *b = &c->t->bpe;
	size_t hn = 0;
	int rc;

	/* The word's pairs, heapified at once (O(n)). */
	if ((rc = heap_grow(c, n)))
		return rc;
	for (size_t i = 0; i + 1 < n; i++)
		hn += (size_t)pair_at(c, (int32_t)i, &c->heap[hn]);
	for (size_t i = hn / 4 + 1; i-- > 0;)
		if (i < hn)
			sift_down(c->heap, hn, i, c->heap[i]);
	while (hn) {
		const struct hf_merge top = heap_pop(c, &hn);
		const uint32_t pos = (uint32_t)top.key;
		struct hf_sym *s = &c->sym[pos];
		struct hf_sym right;
		long slot;

		if (s->len == 0 || s->next < 0)
			continue;
		right = c->sym[s->next];
		slot = merge_find(b, s->c, right.c);
		if (slot < 0 || b->merges[slot].new_id != top.new_id)
			continue; /* an expired entry */
		c->sym[s->next].len = 0;
		s->c = top.new_id;
		s->len += right.len;
		s->next = right.next;
		if (right.next >= 0)
			c->sym[right.next].prev = (int32_t)pos;
		if (s->prev >= 0 && (rc = push_pair(c, &hn, s->prev)))
			return rc;
		if ((rc = push_pair(c, &hn, (int32_t)pos)))
			return rc;
	}
	return 0;
}

/* The vocabulary id of character ch (chl bytes) at its place in the word, with prefix and
 * suffix; the looked-up string in *s / *sl for the byte fallback. */
static int32_t char_id(struct hf_ctx *c, const char *ch, size_t chl, int first, int last,
		       const char **s, size_t *sl)
{
	const struct hf_bpe *b = &c->t->bpe;
	const int pre = !first && b->prefix, suf = last && b->suffix;

	if (!pre && !suf) {
		*s = ch;
		*sl = chl;
		return hf_map_get(&b->vocab, ch, chl);
	}
	c->word.len = 0;
	if ((pre && hf_buf_add(&c->word, b->prefix, b->prefix_len)) ||
	    hf_buf_add(&c->word, ch, chl) || (suf && hf_buf_add(&c->word, b->suffix, b->suffix_len)))
		return -2;
	*s = c->word.p;
	*sl = c->word.len;
	return hf_map_get(&b->vocab, c->word.p, c->word.len);
}

/* BPE::merge_word up to the merges: the word's first symbols. */
static int initial_symbols(struct hf_ctx *c, const char *w, size_t len, size_t *n)
{
	const struct hf_bpe *b = &c->t->bpe;
	int32_t unk = -1;
	uint32_t unk_len = 0;
	int rc;

	*n = 0;
	for (size_t i = 0; i < len;) {
		size_t chl, sl;
		const char *s;
		int32_t id;

		(void)hf_utf8_next(w + i, &chl);
		id = char_id(c, w + i, chl, i == 0, i + chl == len, &s, &sl);
		if (id == -2)
			return -ENOMEM;
		if (id >= 0) {
			if (unk >= 0 && (rc = sym_add(c, n, unk, unk_len)))
				return rc;
			unk = -1;
			if ((rc = sym_add(c, n, id, (uint32_t)chl)))
				return rc;
		} else {
			size_t k = 0;

			if (b->byte_fallback) {
				while (k < sl && b->byte_id[(unsigned char)s[k]] >= 0)
					k++;
			}
			if (b->byte_fallback && k == sl) {
				/* As the library: the pending unknown is not added first. */
				for (k = 0; k < sl; k++)
					if ((rc = sym_add(c, n, b->byte_id[(unsigned char)s[k]], 1)))
						return rc;
			} else if (b->unk_id >= 0) {
				if (unk >= 0 && b->fuse_unk) {
					unk_len += (uint32_t)chl;
				} else {
					if (unk >= 0 && (rc = sym_add(c, n, unk, unk_len)))
						return rc;
					unk = b->unk_id;
					unk_len = (uint32_t)chl;
				}
			}
		}
		i += chl;
	}
	if (unk >= 0)
		return sym_add(c, n, unk, unk_len);
	return 0;
}

static int cache_put(struct hf_ctx *c, const char *w, size_t len, size_t from)
{
	const size_t k = c->cache.n;
	int rc;

	if (k + 2 > c->cache_at_cap) {
		const size_t cap = c->cache_at_cap ? 2 * c->cache_at_cap : 256;
		size_t *a = realloc(c->cache_at, cap * sizeof(*a));

		if (!a)
			return -ENOMEM;
		c->cache_at = a;
		c->cache_at_cap = cap;
	}
	if (k == 0)
		c->cache_at[0] = 0;
	rc = hf_buf_add(&c->cache_ids, c->ids + from, (c->n - from) * sizeof(int32_t));
	if (rc)
		return rc;
	c->cache_at[k + 1] = c->cache_ids.len / sizeof(int32_t);
	return hf_map_put(&c->cache, w, len, (int32_t)k);
}

static int bpe_piece(struct hf_ctx *c, const char *w, size_t len);

#define METASPACE "\xe2\x96\x81"

/* Whether a merge can join across the start of w[at] (see split_metaspace). */
static int joinable_at(const char *w, size_t at)
{
	return memcmp(w + at, METASPACE, 3) || (at >= 3 && !memcmp(w + at - 3, METASPACE, 3));
}

/* split_metaspace: whether any token has a "▁" after another character than "▁". */
static int metaspace_inside(const struct hf_bpe *b)
{
	for (int32_t id = 0; id < b->n_ids; id++) {
		const char *s = b->id_str[id];
		const size_t l = b->id_len[id];

		for (size_t i = 1; s && i + 3 <= l; i++)
			if (!joinable_at(s, i))
				return 1;
	}
	return 0;
}

void hf_bpe_plan_split(struct hf_bpe *b)
{
	b->split_metaspace = !b->prefix && !b->suffix && !b->ignore_merges &&
			     hf_map_get(&b->vocab, METASPACE, 3) >= 0 && !metaspace_inside(b);
}

int hf_bpe_word(struct hf_ctx *c, const char *w, size_t len)
{
	size_t start = 0;
	int rc;

	if (!c->t->bpe.split_metaspace || len < HF_CACHE_MAX_WORD)
		return bpe_piece(c, w, len);
	for (size_t at = 1; at + 3 <= len; at++) {
		if (((unsigned char)w[at] & 0xC0) == 0x80 || joinable_at(w, at))
			continue;
		if ((rc = bpe_piece(c, w + start, at - start)))
			return rc;
		start = at;
	}
	return bpe_piece(c, w + start, len - start);
}

/* One word, or one piece of a word that no merge crosses. */
static int bpe_piece(struct hf_ctx *c, const char *w, size_t len)
{
	const struct hf_bpe *b = &c->t->bpe;
	const size_t from = c->n;
	size_t n;
	int32_t hit;
	int rc;

	if (!len)
		return 0;
	if (b->ignore_merges && (hit = hf_map_get(&b->vocab, w, len)) >= 0)
		return hf_ctx_emit(c, hit);
	if (len < HF_CACHE_MAX_WORD && (hit = hf_map_get(&c->cache, w, len)) >= 0) {
		const int32_t *ids = (const int32_t *)c->cache_ids.p;

		for (size_t i = c->cache_at[hit]; i < c->cache_at[hit + 1]; i++)
			if ((rc = hf_ctx_emit(c, ids[i])))
				return rc;
		return 0;
	}
	rc = initial_symbols(c, w, len, &n);
	if (!rc)
		rc = merge_all(c, n);
	for (size_t i = 0; !rc && i < n; i++)
		if (c->sym[i].len)
			rc = hf_ctx_emit(c, c->sym[i].c);
	if (!rc && len < HF_CACHE_MAX_WORD && c->cache.n < (1u << 20))
		rc = cache_put(c, w, len, from);
	return rc;
}

/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_llama2.c - the llama2.c tokenizer (see tok_llama2.h). Reads outside input: every
 * length in the file is checked against the file size before it is used.
 */
#include <string.h>

#include "common/dps.h"
#include "engine/model/tok_llama2.h"

/*
 * Orders ids by piece, then by id, so that pieces repeated in a file sort the same way on
 * every C library (glibc's qsort is a merge sort today, not a promise). The vocabulary comes
 * through qsort_r's argument rather than a global, so threads can load tokenizers at once.
 */
static int cmp_piece(const void *a, const void *b, void *vocab)
{
	const int x = *(const int *)a, y = *(const int *)b;
	char *const *const v = vocab;
	const int c = strcmp(v[x], v[y]);

	if (c)
		return c;
	return (x > y) - (x < y);
}

/* Reads a tokenizer from f (size bytes); path names it in messages. Closes f. */
static int load_stream(struct dps_tok_llama2 *t, FILE *f, const char *path,
		       const struct dps_model_config *cfg, char *err, size_t errlen)
{
	const int vocab_size = cfg->vocab_size;
	int rc = -EINVAL, i;
	long size;

	memset(t, 0, sizeof(*t));
	if (vocab_size < 1) {
		/* id 0 (<unk>) stands for a byte that has no token */
		snprintf(err, errlen, "%s: a vocabulary of %d tokens cannot hold <unk>", path,
			 vocab_size);
		goto err;
	}
	/* encode emits both and decode compares with BOS: they must name tokens */
	if (cfg->bos_token_id < 0 || cfg->bos_token_id >= vocab_size ||
	    cfg->eos_token_id < 0 || cfg->eos_token_id >= vocab_size) {
		snprintf(err, errlen, "%s: bos_token_id %d and eos_token_id %d must be tokens of the "
			 "vocabulary of %d", path, cfg->bos_token_id, cfg->eos_token_id, vocab_size);
		goto err;
	}
	if (fseek(f, 0, SEEK_END) || (size = ftell(f)) < 4 || fseek(f, 0, SEEK_SET)) {
		snprintf(err, errlen, "%s: truncated", path);
		goto err;
	}
	if ((size_t)size < 4 + 8 * (size_t)vocab_size) {
		snprintf(err, errlen, "%s: %ld bytes cannot hold %d tokens", path, size, vocab_size);
		goto err;
	}
	t->vocab_size = vocab_size;
	t->bos_id = cfg->bos_token_id;
	t->eos_id = cfg->eos_token_id;
	t->vocab = calloc((size_t)vocab_size, sizeof(*t->vocab));
	t->vocab_len = calloc((size_t)vocab_size, sizeof(*t->vocab_len));
	t->scores = calloc((size_t)vocab_size, sizeof(*t->scores));
	t->sorted = calloc((size_t)vocab_size, sizeof(*t->sorted));
	if (!t->vocab || !t->vocab_len || !t->scores || !t->sorted) {
		snprintf(err, errlen, "%s: out of memory", path);
		rc = -ENOMEM;
		goto err;
	}
	if (fread(&t->max_token_length, 4, 1, f) != 1 || t->max_token_length > 4096) {
		snprintf(err, errlen, "%s: bad max_token_length", path);
		goto err;
	}
	for (i = 0; i < vocab_size; i++) {
		int32_t len;

		if (fread(&t->scores[i], 4, 1, f) != 1 || fread(&len, 4, 1, f) != 1) {
			snprintf(err, errlen, "%s: truncated at token %d of %d", path, i, vocab_size);
			goto err;
		}
		if (len < 0 || len > (int32_t)t->max_token_length || len > size) {
			snprintf(err, errlen, "%s: token %d has length %d (max %u)", path, i, len,
				 t->max_token_length);
			goto err;
		}
		t->vocab[i] = malloc((size_t)len + 1);
		if (!t->vocab[i]) {
			snprintf(err, errlen, "%s: out of memory", path);
			rc = -ENOMEM;
			goto err;
		}
		if (len && fread(t->vocab[i], (size_t)len, 1, f) != 1) {
			snprintf(err, errlen, "%s: truncated at token %d of %d", path, i, vocab_size);
			goto err;
		}
		t->vocab[i][len] = '\0';
		t->vocab_len[i] = (uint32_t)len;
		t->sorted[i] = i;
	}
	fclose(f);
	qsort_r(t->sorted, (size_t)vocab_size, sizeof(int), cmp_piece, t->vocab);
	t->byte_fallback = vocab_size > 258 && !strcmp(t->vocab[3], "<0x00>") &&
			   !strcmp(t->vocab[258], "<0xFF>");
	return 0;
err:
	fclose(f);
	dps_tok_llama2_free(t);
	return rc;
}

int dps_tok_llama2_load(struct dps_tok_llama2 *t, const char *path,
		       const struct dps_model_config *cfg, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	int rc;

	if (!f) {
		rc = -errno;
		memset(t, 0, sizeof(*t));
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return rc;
	}
	return load_stream(t, f, path, cfg, err, errlen);
}

int dps_tok_llama2_load_mem(struct dps_tok_llama2 *t, const void *buf, size_t len,
			   const struct dps_model_config *cfg, char *err, size_t errlen)
{
	FILE *f = len ? fmemopen((void *)buf, len, "rb") : NULL;

	if (!f) {
		memset(t, 0, sizeof(*t));
		snprintf(err, errlen, "tokenizer: empty or unreadable buffer");
		return -EINVAL;
	}
	return load_stream(t, f, "tokenizer", cfg, err, errlen);
}

void dps_tok_llama2_free(struct dps_tok_llama2 *t)
{
	if (t->vocab)
		for (int i = 0; i < t->vocab_size; i++)
			free(t->vocab[i]);
	free(t->vocab);
	free(t->vocab_len);
	free(t->scores);
	free(t->sorted);
	memset(t, 0, sizeof(*t));
}

int dps_tok_llama2_lookup(const struct dps_tok_llama2 *t, const char *piece, size_t len)
{
	int lo = 0, hi = t->vocab_size - 1;

	while (lo <= hi) {
		const int mid = (lo + hi) / 2, id = t->sorted[mid];
		int c = strncmp(t->vocab[id], piece, len);

		if (c == 0 && t->vocab_len[id] != len)
			c = t->vocab_len[id] < len ? -1 : 1;
		if (c == 0)
			return id;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return -1;
}

/*
 * The merge phase, in O(k log k) for k initial symbols: a max-heap of the adjacent pairs whose
 * concatenation is a token, ordered by that token's score and then by position (the pair's
 * left symbol; symbols keep the position of their first initial symbol, so positions grow
 * along the list). Popping the best valid pair each time merges exactly what llama2.c's
 * quadratic loop merges, in the same order: the highest score, the leftmost on ties. A
 * popped pair whose symbols have changed since it was pushed is stale and skipped.
 */
struct pair {
	float score;
	int left, right;      /* symbol positions */
	int left_id, right_id; /* their ids when pushed */
	int id;               /* the merged token */
};

struct merger {
	const struct dps_tok_llama2 *t;
	int *ids, *prev, *next; /* (k) the symbol list; ids[i] < 0: merged away */
	struct pair *heap;
	size_t n_heap, cap_heap;
	char *buf;              /* 2 * max_token_length */
};

static int pair_before(const struct pair *a, const struct pair *b)
{
	if (a->score != b->score)
		return a->score > b->score;
	return a->left < b->left;
}

static int heap_push(struct merger *m, const struct pair *p)
{
	size_t i;

	if (m->n_heap == m->cap_heap) {
		const size_t cap = m->cap_heap ? 2 * m->cap_heap : 64;
		struct pair *h = realloc(m->heap, cap * sizeof(*h));

		if (!h)
			return -ENOMEM;
		m->heap = h;
		m->cap_heap = cap;
	}
	i = m->n_heap++;
	while (i && pair_before(p, &m->heap[(i - 1) / 2])) {
		m->heap[i] = m->heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	m->heap[i] = *p;
	return 0;
}

static struct pair heap_pop(struct merger *m)
{
	const struct pair top = m->heap[0], last = m->heap[--m->n_heap];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= m->n_heap)
			break;
		if (c + 1 < m->n_heap && pair_before(&m->heap[c + 1], &m->heap[c]))
			c++;
		if (!pair_before(&m->heap[c], &last))
			break;
		m->heap[i] = m->heap[c];
		i = c;
	}
	if (m->n_heap)
		m->heap[i] = last;
	return top;
}

/* Pushes the pair (left, right) when its concatenation is a token. */
static int consider(struct merger *m, int left, int right)
{
	const struct dps_tok_llama2 *t = m->t;
	const int a = m->ids[left], b = m->ids[right];
	const size_t l1 = t->vocab_len[a], l2 = t->vocab_len[b];
	struct pair p;

	if (l1 + l2 > t->max_token_length)
		return 0; /* longer than any token */
	memcpy(m->buf, t->vocab[a], l1);
	memcpy(m->buf + l1, t->vocab[b], l2);
	p.id = dps_tok_llama2_lookup(t, m->buf, l1 + l2);
	/* run.c merges only scores above its starting best of -1e10 (NaN never) */
	if (p.id < 0 || !(t->scores[p.id] > -1e10f))
		return 0;
	p.score = t->scores[p.id];
	p.left = left;
	p.right = right;
	p.left_id = a;
	p.right_id = b;
	return heap_push(m, &p);
}

/* Merges ids[from..k) in place; returns the new count of ids (or -ENOMEM). */
static long merge_all(const struct dps_tok_llama2 *t, int *ids, size_t from, size_t k)
{
	struct merger m = { .t = t };
	const size_t n = k - from;
	long rc = -ENOMEM;
	size_t out = from;

	if (n < 2)
		return (long)k;
	m.ids = ids + from;
	m.prev = malloc(n * sizeof(int));
	m.next = malloc(n * sizeof(int));
	m.buf = malloc(2 * (size_t)t->max_token_length + 8);
	if (!m.prev || !m.next || !m.buf)
		goto out;
	for (size_t i = 0; i < n; i++) {
		m.prev[i] = (int)i - 1;
		m.next[i] = i + 1 < n ? (int)i + 1 : -1;
	}
	for (size_t i = 0; i + 1 < n; i++)
		if (consider(&m, (int)i, (int)i + 1))
			goto out;
	while (m.n_heap) {
		const struct pair p = heap_pop(&m);
		int nx;

		if (m.ids[p.left] != p.left_id || m.ids[p.right] != p.right_id ||
		    m.next[p.left] != p.right)
			continue; /* stale */
		m.ids[p.left] = p.id;
		m.ids[p.right] = -1;
		nx = m.next[p.right];
		m.next[p.left] = nx;
		if (nx >= 0)
			m.prev[nx] = p.left;
		if ((m.prev[p.left] >= 0 && consider(&m, m.prev[p.left], p.left)) ||
		    (nx >= 0 && consider(&m, p.left, nx)))
			goto out;
	}
	for (size_t i = 0; i < n; i++)
		if (m.ids[i] >= 0)
			ids[out++] = m.ids[i];
	rc = (long)out;
out:
	free(m.prev);
	free(m.next);
	free(m.buf);
	free(m.heap);
	return rc;
}

int dps_tok_llama2_encode(const struct dps_tok_llama2 *t, const char *text, size_t len,
			 unsigned flags, int *ids, size_t cap, size_t *n)
{
	const int bos = (flags & DPS_TOK_LLAMA2_BOS) != 0;
	size_t k = 0, i;
	long merged;

#define PUSH(id)                                    \
	do {                                        \
		if (k >= cap)                       \
			return -ENOSPC;             \
		ids[k++] = (id);                    \
	} while (0)
	if (bos)
		PUSH(t->bos_id);
	if (len) {
		const int sp = dps_tok_llama2_lookup(t, " ", 1);

		if (sp >= 0)
			PUSH(sp);
	}
	/* One token per code point, or its bytes. */
	for (i = 0; i < len;) {
		size_t cl = 1;
		int id;

		while (i + cl < len && cl < 4 && ((unsigned char)text[i + cl] & 0xC0) == 0x80)
			cl++;
		id = dps_tok_llama2_lookup(t, text + i, cl);
		if (id >= 0) {
			PUSH(id);
		} else {
			for (size_t b = 0; b < cl; b++)
				PUSH(t->byte_fallback ? (unsigned char)text[i + b] + 3 : 0);
		}
		i += cl;
	}
	merged = merge_all(t, ids, bos ? 1 : 0, k);
	if (merged < 0)
		return (int)merged;
	k = (size_t)merged;
	if (flags & DPS_TOK_LLAMA2_EOS)
		PUSH(t->eos_id);
#undef PUSH
	*n = k;
	return 0;
}

const char *dps_tok_llama2_decode(const struct dps_tok_llama2 *t, int prev, int id, char *buf,
				 size_t *len)
{
	const char *p;
	unsigned b;

	if (id < 0 || id >= t->vocab_size) {
		*len = 0;
		return "";
	}
	p = t->vocab[id];
	*len = t->vocab_len[id];
	if (prev == t->bos_id && p[0] == ' ') {
		p++;
		(*len)--;
	}
	if (t->byte_fallback && id >= 3 && id <= 258 && *len == 6 && sscanf(p, "<0x%02X>", &b) == 1) {
		buf[0] = (char)b;
		buf[1] = '\0';
		*len = 1;
		return buf;
	}
	return p;
}

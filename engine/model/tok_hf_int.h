/* SPDX-License-Identifier: MIT */
/*
 * engine/model/tok_hf_int.h - what the files of the tokenizer.json backend share (private to
 * engine/model/tok_hf*.c): the loaded tokenizer, its parts (BPE model, added vocabulary,
 * normalizers, pre-tokenizers, post-processor, decoders), and the per-call encoding context.
 *
 * The pipeline is the `tokenizers` library's, run depth-first: the added tokens are found in
 * the raw text (tok_hf_added.c); each other piece is normalized (tok_hf_norm.c), searched for
 * the normalized added tokens, split by each pre-tokenizer in turn (tok_hf_pretok.c), and
 * handed to the BPE model (tok_hf_bpe.c); the post-processor and the decoders are in
 * tok_hf_decode.c; tok_hf.c loads and dispatches; tok_hf_regex.c runs the patterns with PCRE2
 * read as the library's Oniguruma reads them. The library splits every piece by one step before
 * the next step starts; since no step looks at two pieces, splitting one piece all the way down
 * before the next gives the same pieces in the same order without lists of the whole text.
 *
 * A loaded tokenizer is read-only; everything an encode call writes is in its struct hf_ctx.
 */
#ifndef DPS_ENGINE_TOK_HF_INT_H
#define DPS_ENGINE_TOK_HF_INT_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/model/tok.h"
#include "engine/model/tok_hf.h"

struct json_t;

/* Operations of one kind in one file, nested Sequences flattened; and Sequence nesting. */
#define HF_MAX_OPS 32
#define HF_MAX_DEPTH 8
/* The largest id a vocabulary may give (the largest real ones are near 2^18). */
#define HF_MAX_ID ((1 << 24) - 1)
/* The longest word the BPE cache of an encode call keeps (the library's MAX_LENGTH). */
#define HF_CACHE_MAX_WORD 256

/* ---- small containers (tok_hf.c) ---- */

/* A growable byte buffer. */
struct hf_buf {
	char *p;
	size_t len, cap;
};
int hf_buf_reserve(struct hf_buf *b, size_t extra);
int hf_buf_add(struct hf_buf *b, const void *s, size_t n);
void hf_buf_free(struct hf_buf *b);

/* Byte strings to non-negative int32 values: open addressing over entries kept in order. */
struct hf_map {
	uint32_t *slot; /* (mask + 1) 1 + entry index, 0 when empty */
	size_t mask;
	struct hf_map_ent {
		size_t off;    /* in keys */
		uint32_t len;  /* of the key */
		uint32_t hash;
		int32_t val;
	} *ent;        /* (n) in insertion order */
	size_t n, ent_cap;
	struct hf_buf keys;
};
uint32_t hf_hash(const char *s, size_t len);
/* Sets key's value (replacing an old one). Returns 0 or -ENOMEM. */
int hf_map_put(struct hf_map *m, const char *key, size_t len, int32_t val);
/* The value of key, or -1. */
int32_t hf_map_get(const struct hf_map *m, const char *key, size_t len);
void hf_map_free(struct hf_map *m);

/* A range of a piece, and whether a pattern matched it. */
struct hf_span {
	size_t start, end;
	int match;
};
struct hf_spans {
	struct hf_span *v;
	size_t n, cap;
};
int hf_spans_add(struct hf_spans *s, size_t start, size_t end, int match);

/* Error message helper: "tokenizer.json: " + formatted text. Returns -EINVAL. */
int hf_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* JSON field readers: each fails with a message naming path.field and the rule. */
int hf_json_bool(struct json_t *obj, const char *path, const char *field, int def, int *out,
		 char *err, size_t errlen);
int hf_json_str(struct json_t *obj, const char *path, const char *field, int nullable,
		const char **s, size_t *len, char *err, size_t errlen);
int hf_json_char(struct json_t *obj, const char *path, const char *field, char *buf,
		 size_t *len, uint32_t *cp, char *err, size_t errlen);
const char *hf_json_type(struct json_t *obj);

/* ---- UTF-8 of valid text ---- */

/* The code point at s (valid UTF-8, n >= 1 bytes left) and its length in *len. */
static inline uint32_t hf_utf8_next(const char *s, size_t *len)
{
	const unsigned char *p = (const unsigned char *)s;

	if (p[0] < 0x80) {
		*len = 1;
		return p[0];
	}
	if (p[0] < 0xe0) {
		*len = 2;
		return (uint32_t)(p[0] & 0x1f) << 6 | (p[1] & 0x3f);
	}
	if (p[0] < 0xf0) {
		*len = 3;
		return (uint32_t)(p[0] & 0x0f) << 12 | (uint32_t)(p[1] & 0x3f) << 6 | (p[2] & 0x3f);
	}
	*len = 4;
	return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3f) << 12 |
	       (uint32_t)(p[2] & 0x3f) << 6 | (p[3] & 0x3f);
}
/* Writes code point cp (<= U+10FFFF, no surrogate) at o; returns its length. */
size_t hf_utf8_put(char *o, uint32_t cp);
/* Rust's char::is_whitespace (the White_Space property). */
int hf_is_whitespace(uint32_t cp);

/* ---- regular expressions (tok_hf_regex.c) ---- */

struct hf_regex {
	pcre2_code *re;
	uint32_t captures;
};
enum { HF_RE_ONIG, HF_RE_LITERAL, HF_RE_PCRE2 };
/*
 * Compiles pattern (len bytes) as the library's Oniguruma (Ruby syntax, UTF-8) reads it
 * (HF_RE_ONIG), as a literal string (HF_RE_LITERAL), or as PCRE2 syntax (HF_RE_PCRE2, for our
 * own patterns). where names the field for messages. Returns 0 or -EINVAL (a construct
 * whose meaning differs between the two engines and that has no translation, or a pattern
 * PCRE2 refuses) or -ENOMEM.
 */
int hf_regex_compile(struct hf_regex *r, const char *pattern, size_t len, int syntax,
		     const char *where, char *err, size_t errlen);
void hf_regex_free(struct hf_regex *r);
struct dps_tok_hf;
/* A pattern field {"String": s} or {"Regex": r} at path; raises t->max_captures. */
int hf_regex_load(struct dps_tok_hf *t, struct hf_regex *r, struct json_t *pattern,
		  const char *path, char *err, size_t errlen);
struct hf_ctx;
/* Every match in s as the library's find_iter yields them (an empty match right after the
 * previous one is skipped), appended to out with match = 1. Returns 0, -ENOMEM or -EIO (the
 * engine ran out of its limits). */
int hf_regex_find(struct hf_ctx *c, const struct hf_regex *r, const char *s, size_t len,
		  struct hf_spans *out);

/* Characters Oniguruma's Unicode tables class and PCRE2's do not (tok_hf_ucd.c, generated). */
struct hf_ucd_run {
	const char *key;  /* a general category, "Word", "RWord", "sc:" + a script, "-C", "-Cn" */
	uint32_t lo, hi;
};
extern const struct hf_ucd_run hf_ucd_runs[];
extern const size_t hf_ucd_n_runs;

/* ---- the BPE model (tok_hf_bpe.c) ---- */

struct hf_bpe {
	struct hf_map vocab;     /* token -> id */
	const char **id_str;     /* (n_ids) token of each id, NULL for an id no token has */
	uint32_t *id_len;        /* (n_ids) */
	int32_t n_ids;           /* largest id + 1 */
	struct hf_merge_ent {
		uint64_t key;    /* the pair (a << 32 | b), UINT64_MAX when empty */
		uint32_t rank;   /* the merge's place in the file */
		int32_t new_id;  /* the merged token */
	} *merges;               /* (merge_mask + 1) open addressing */
	size_t merge_mask, n_merges;
	int32_t unk_id;          /* -1 without unk_token */
	int fuse_unk, byte_fallback, ignore_merges;
	int32_t byte_id[256];    /* id of "<0xXX>", -1 when absent */
	char *prefix, *suffix;   /* continuing_subword_prefix, end_of_word_suffix; NULL for null */
	size_t prefix_len, suffix_len;
	size_t max_len;          /* longest token in bytes */
	/* 1 when no token has a "▁" right after another character than "▁" (and there is no
	 * prefix, suffix or ignore_merges): then no merge joins across such a place, and a long
	 * word (a Llama-2 text, which has no pre-tokenizer) is merged piece by piece between
	 * them, with the same result and the cache. */
	int split_metaspace;
};
int hf_bpe_load(struct hf_bpe *b, struct json_t *model, char *err, size_t errlen);
/* Sets split_metaspace (after the model is loaded). */
void hf_bpe_plan_split(struct hf_bpe *b);
void hf_bpe_free(struct hf_bpe *b);
/* Tokenizes one pre-tokenized piece, appending its ids to the context. Returns 0, -E2BIG or
 * -ENOMEM. */
int hf_bpe_word(struct hf_ctx *c, const char *w, size_t len);

/* ---- added tokens (tok_hf_added.c) ---- */

struct hf_added_tok {
	int32_t id;
	char *content;          /* as written */
	char *pattern;          /* what is matched: the normalized content for normalized tokens */
	uint32_t len, pattern_len;
	uint8_t single_word, lstrip, rstrip, normalized, special;
};
/* A byte trie of the patterns of one set; node 0 is the root. */
struct hf_trie {
	struct hf_trie_node {
		uint32_t child;  /* first child, 0 for none */
		uint32_t sib;    /* next sibling, 0 for none */
		int32_t tok;     /* index in added[] of the pattern ending here, or -1 */
		uint8_t byte;
	} *node;
	size_t n, cap;
	uint32_t root[256]; /* child of the root for each first byte, 0 for none */
};

/* ---- normalizers (tok_hf_norm.c) ---- */

enum hf_norm_kind {
	HF_NORM_NFC,
	HF_NORM_NFD,
	HF_NORM_NFKC,
	HF_NORM_NFKD,
	HF_NORM_LOWERCASE,
	HF_NORM_STRIP,
	HF_NORM_PREPEND,
	HF_NORM_REPLACE,
	HF_NORM_STRIP_ACCENTS,
};
struct hf_norm {
	enum hf_norm_kind kind;
	int left, right;        /* Strip */
	char *str;              /* Prepend's prepend, Replace's content */
	size_t str_len;
	struct hf_regex re;     /* Replace */
};

/* ---- pre-tokenizers (tok_hf_pretok.c) ---- */

enum hf_pre_kind {
	HF_PRE_BYTELEVEL,
	HF_PRE_SPLIT,
	HF_PRE_METASPACE,
	HF_PRE_DIGITS,
	HF_PRE_WHITESPACE,
	HF_PRE_WHITESPACE_SPLIT,
};
enum hf_behavior {
	HF_REMOVED,
	HF_ISOLATED,
	HF_MERGED_PREV,
	HF_MERGED_NEXT,
	HF_CONTIGUOUS,
};
enum hf_prepend { HF_PREPEND_ALWAYS, HF_PREPEND_FIRST, HF_PREPEND_NEVER };
struct hf_pre {
	enum hf_pre_kind kind;
	int add_prefix_space, use_regex;      /* ByteLevel */
	struct hf_regex re;                   /* ByteLevel (GPT-2's), Split, Whitespace */
	enum hf_behavior behavior;            /* Split */
	int invert;                           /* Split */
	char repl[4];                         /* Metaspace's replacement */
	size_t repl_len;
	uint32_t repl_cp;
	enum hf_prepend scheme;               /* Metaspace */
	int split;                            /* Metaspace */
	int individual;                       /* Digits */
};

/* ---- decoders (tok_hf_decode.c) ---- */

enum hf_dec_kind {
	HF_DEC_BYTELEVEL,
	HF_DEC_BYTEFALLBACK,
	HF_DEC_METASPACE,
	HF_DEC_FUSE,
	HF_DEC_STRIP,
	HF_DEC_REPLACE,
};
struct hf_dec {
	enum hf_dec_kind kind;
	uint32_t cp;             /* Metaspace's replacement, Strip's content */
	enum hf_prepend scheme;  /* Metaspace */
	size_t start, stop;      /* Strip */
	char *str;               /* Replace's content */
	size_t str_len;
	struct hf_regex re;      /* Replace */
};

/* The post-processor's single-sequence template: items that are either the sequence or a
 * special token's ids. */
struct hf_post_item {
	int is_seq;
	int32_t *ids;
	size_t n;
};

struct dps_tok_hf {
	struct hf_bpe bpe;
	/* Added vocabulary: one entry per id (the library's added_tokens_map_r), by content. */
	struct hf_added_tok *added;
	size_t n_added;
	struct hf_map added_by_content;  /* content -> id */
	struct hf_map special;           /* contents of the special tokens (values unused) */
	int32_t *added_of_id;            /* (n_ids) index in added[] or -1 */
	struct hf_trie trie_raw, trie_norm;
	int has_trie_raw, has_trie_norm;

	int has_normalizer;
	struct hf_norm norm[HF_MAX_OPS];
	size_t n_norm;
	struct hf_pre pre[HF_MAX_OPS];
	size_t n_pre;
	int has_decoder;
	struct hf_dec dec[HF_MAX_OPS];
	size_t n_dec;
	int has_post;                    /* a template (which may be empty) applies */
	struct hf_post_item post[HF_MAX_OPS];
	size_t n_post;
	size_t post_plain;               /* copies of the sequence without special tokens */

	int32_t n_ids;                   /* largest id + 1 over the model and added tokens */
	uint8_t *special_id;             /* (n_ids) 1 for special tokens */
	size_t max_piece;
	uint32_t max_captures;           /* over every regex, for the match data */
};

/* GPT-2's byte alphabet: the tables, made by every load (before any thread shares the
 * tokenizer; later calls only read a flag), and the byte character cp stands for, or -1. */
void hf_byte_table_init(void);
int hf_byte_of_char(uint32_t cp);
/* Metaspace's prepend_scheme (and the older add_prefix_space) of object v at path. */
int hf_prepend_scheme(struct json_t *v, const char *path, enum hf_prepend *out, char *err,
		      size_t errlen);

/* Loaders of the parts (each names the field it refuses). */
int hf_added_load(struct dps_tok_hf *t, struct json_t *arr, char *err, size_t errlen);
int hf_norm_load(struct dps_tok_hf *t, struct json_t *v, int depth, char *err, size_t errlen);
int hf_pre_load(struct dps_tok_hf *t, struct json_t *v, int depth, char *err, size_t errlen);
int hf_dec_load(struct dps_tok_hf *t, struct json_t *v, int depth, char *err, size_t errlen);
int hf_post_load(struct dps_tok_hf *t, struct json_t *v, int depth, char *err, size_t errlen);
int hf_post_config(struct dps_tok_hf *t, struct json_t *cfg, char *err, size_t errlen);
void hf_parts_free(struct dps_tok_hf *t);

/* ---- one encode call ---- */

/* A piece of text on its way through the pipeline. first: the piece starts at offset 0 of the
 * original text (the library's offsets_original().0 == 0, which Metaspace's "first" scheme
 * reads); zero: how many of its leading bytes are aligned with the original's first
 * character (so a split at one of them still starts at offset 0). */
struct hf_piece {
	const char *s;
	size_t len;
	size_t zero;
	int first;
};

struct hf_ctx {
	const struct dps_tok_hf *t;
	int32_t *ids;
	size_t n, cap;
	size_t limit;                    /* -E2BIG past this many ids */
	pcre2_match_data *md;
	pcre2_match_context *mctx;
	pcre2_jit_stack *jit;
	struct hf_buf norm[2];           /* normalizer ping-pong */
	struct hf_spans added_spans[2];  /* raw and normalized added-token matches */
	struct hf_level {
		struct hf_buf buf;       /* the piece as this pre-tokenizer rewrote it */
		struct hf_buf buf2;      /* ByteLevel: one part in GPT-2's alphabet */
		struct hf_spans spans;   /* its matches, then its splits */
		struct hf_spans out;
	} lvl[HF_MAX_OPS];
	/* BPE scratch */
	struct hf_sym {
		int32_t c;
		int32_t prev, next;
		uint32_t len;
	} *sym;
	size_t sym_cap;
	struct hf_merge {
		uint64_t key;            /* rank << 32 | pos: the order, in one comparison */
		int32_t new_id;
	} *heap;
	size_t heap_cap;
	struct hf_buf word;              /* a character with prefix / suffix */
	struct hf_map cache;             /* word -> index in cache_at */
	size_t *cache_at;                /* (cache.n + 1) offsets in cache_ids */
	size_t cache_at_cap;
	struct hf_buf cache_ids;         /* int32 ids of the cached words */
};
/* Frees what a context holds (the context itself is the caller's). */
void hf_ctx_free(struct hf_ctx *c);
/* Appends id; -E2BIG past the limit. */
int hf_ctx_emit(struct hf_ctx *c, int32_t id);

/* Normalizes p into c->norm (the result is *out). Returns 0 or -ENOMEM. */
int hf_norm_apply(struct hf_ctx *c, const struct hf_piece *p, struct hf_piece *out);
/* Finds the added tokens of trie in s as the library's find_matches: spans covering s, match
 * holding the added token's index + 1 for a token. Returns 0 or -ENOMEM. */
int hf_added_find(const struct dps_tok_hf *t, const struct hf_trie *trie, const char *s,
		  size_t len, struct hf_spans *out);
/* Runs pre-tokenizers level.. on p, then the model. Returns 0, -E2BIG, -ENOMEM or -EIO. */
int hf_pre_run(struct hf_ctx *c, size_t level, const struct hf_piece *p);

/* The post-processor: the ids of the sequence (ids, n) with the template applied. */
int hf_post_apply(const struct dps_tok_hf *t, unsigned flags, const int32_t *ids, size_t n,
		  size_t max_ids, int **out, size_t *out_n);
/* How the template repeats the sequence and how many ids it adds (for the limit). */
void hf_post_counts(const struct dps_tok_hf *t, unsigned flags, size_t *seq_times,
		    size_t *specials);
/* The token string of id for decoding (an added token's pattern or content, else the
 * vocabulary's), or NULL. */
const char *hf_id_token(const struct dps_tok_hf *t, int32_t id, size_t *len);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * tests/check_tokenizer.c - the llama2.c tokenizer on small vocabularies built in memory:
 * BOS and EOS are the model's ids (llama2.c's 1 and 2, or any others), emitted by encode and
 * recognised by decode; ids outside the vocabulary are refused at load; repeated pieces sort
 * by id; two threads loading at once get what they get one after the other. The stories260K
 * tokenizer against llama2.c's own output is in check_golden.c.
 */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/tok_llama2.h"
#include "tests/testutil.h"

/* Writes a tokenizer.bin of n pieces (score of piece i: -i, so earlier pieces merge first). */
static size_t build(unsigned char *buf, size_t cap, const char *const *pieces, int n)
{
	uint32_t max = 0;
	size_t k = 4;

	for (int i = 0; i < n; i++) {
		const int32_t len = (int32_t)strlen(pieces[i]);
		const float score = -(float)i;

		ck_assert_uint_le(k + 8 + (size_t)len, cap);
		memcpy(buf + k, &score, 4);
		memcpy(buf + k + 4, &len, 4);
		memcpy(buf + k + 8, pieces[i], (size_t)len);
		k += 8 + (size_t)len;
		if ((uint32_t)len > max)
			max = (uint32_t)len;
	}
	memcpy(buf, &max, 4);
	return k;
}

/* " ab" and "ab" merge before anything else; ids 9 and 10 are another model's BOS and EOS. */
static const char *const small[] = { "<unk>", "<s>", "</s>", " ab", "ab", " ", "a", "b", "c",
				     "<|begin|>", "<|end|>" };
#define SMALL_N 11

static void load_small(struct dps_tok_llama2 *t, int bos, int eos)
{
	struct dps_model_config cfg = { .vocab_size = SMALL_N, .bos_token_id = bos,
					.eos_token_id = eos };
	unsigned char buf[512];
	const size_t len = build(buf, sizeof(buf), small, SMALL_N);
	char err[256];

	ck_assert_msg(!dps_tok_llama2_load_mem(t, buf, len, &cfg, err, sizeof(err)), "%s", err);
}

START_TEST(test_llama2c_ids)
{
	struct dps_tok_llama2 t;
	int ids[16];
	size_t n, l;
	char buf[8];
	const char *p;

	load_small(&t, 1, 2);
	ck_assert_int_eq(dps_tok_llama2_encode(&t, "ab", 2, DPS_TOK_LLAMA2_BOS, ids, 16, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_int_eq(ids[0], 1);
	ck_assert_int_eq(ids[1], 3); /* " " a b -> " " ab -> " ab" */
	/* 1 is also what an old caller passes: it still means BOS. */
	ck_assert_int_eq(dps_tok_llama2_encode(&t, "abc", 3, 1, ids, 16, &n), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert_int_eq(ids[0], 1);
	ck_assert_int_eq(ids[2], 8);
	ck_assert_int_eq(dps_tok_llama2_encode(&t, "ab", 2, DPS_TOK_LLAMA2_BOS | DPS_TOK_LLAMA2_EOS,
					      ids, 16, &n), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert_int_eq(ids[2], 2);
	ck_assert_int_eq(dps_tok_llama2_encode(&t, "ab", 2, 0, ids, 16, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(ids[0], 3);
	/* EOS needs room like any other id. */
	ck_assert_int_eq(dps_tok_llama2_encode(&t, "ab", 2, DPS_TOK_LLAMA2_BOS | DPS_TOK_LLAMA2_EOS,
					      ids, 2, &n), -ENOSPC);
	/* After BOS the dummy-prefix space is dropped; after anything else it is kept. */
	p = dps_tok_llama2_decode(&t, 1, 3, buf, &l);
	ck_assert_uint_eq(l, 2);
	ck_assert(!memcmp(p, "ab", 2));
	p = dps_tok_llama2_decode(&t, 9, 3, buf, &l);
	ck_assert_uint_eq(l, 3);
	ck_assert(!memcmp(p, " ab", 3));
	dps_tok_llama2_free(&t);
}
END_TEST

START_TEST(test_model_ids)
{
	struct dps_tok_llama2 t;
	int ids[16];
	size_t n, l;
	char buf[8];
	const char *p;

	load_small(&t, 9, 10);
	ck_assert_int_eq(t.bos_id, 9);
	ck_assert_int_eq(t.eos_id, 10);
	ck_assert_int_eq(dps_tok_llama2_encode(&t, "ab", 2, DPS_TOK_LLAMA2_BOS | DPS_TOK_LLAMA2_EOS,
					      ids, 16, &n), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert_int_eq(ids[0], 9);
	ck_assert_int_eq(ids[1], 3);
	ck_assert_int_eq(ids[2], 10);
	p = dps_tok_llama2_decode(&t, 9, 3, buf, &l);
	ck_assert_uint_eq(l, 2);
	ck_assert(!memcmp(p, "ab", 2));
	/* 1 is an ordinary token for this model: the space stays. */
	p = dps_tok_llama2_decode(&t, 1, 3, buf, &l);
	ck_assert_uint_eq(l, 3);
	ck_assert(!memcmp(p, " ab", 3));
	dps_tok_llama2_free(&t);
}
END_TEST

START_TEST(test_bad_ids)
{
	static const struct {
		int vocab, bos, eos;
		const char *msg;
	} bad[] = {
		{ SMALL_N, -1, 2, "bos_token_id -1" },
		{ SMALL_N, SMALL_N, 2, "bos_token_id 11" },
		{ SMALL_N, 1, SMALL_N, "eos_token_id 11" },
		{ SMALL_N, 1, -7, "eos_token_id -7" },
		{ 0, 0, 0, "vocabulary of 0 tokens" },
		{ 2, 1, 2, "eos_token_id 2" },
	};
	unsigned char buf[512];
	const size_t len = build(buf, sizeof(buf), small, SMALL_N);

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct dps_model_config cfg = { .vocab_size = bad[i].vocab,
						.bos_token_id = bad[i].bos,
						.eos_token_id = bad[i].eos };
		struct dps_tok_llama2 t;
		char err[256] = "";

		ck_assert_int_eq(dps_tok_llama2_load_mem(&t, buf, len, &cfg, err, sizeof(err)),
				 -EINVAL);
		ck_assert_msg(strstr(err, bad[i].msg), "case %zu: '%s' lacks '%s'", i, err,
			      bad[i].msg);
		ck_assert_ptr_null(t.vocab);
	}
	/* A vocabulary of one or two tokens is fine when BOS and EOS are among them. */
	{
		struct dps_model_config cfg = { .vocab_size = 2, .bos_token_id = 1,
						.eos_token_id = 0 };
		struct dps_tok_llama2 t;
		char err[256];
		int ids[4];
		size_t n;

		ck_assert_msg(!dps_tok_llama2_load_mem(&t, buf, len, &cfg, err, sizeof(err)), "%s",
			      err);
		ck_assert_int_eq(dps_tok_llama2_encode(&t, "z", 1, 3, ids, 4, &n), 0);
		ck_assert_uint_eq(n, 3); /* BOS, <unk> for the byte, EOS */
		ck_assert_int_eq(ids[0], 1);
		ck_assert_int_eq(ids[1], 0);
		ck_assert_int_eq(ids[2], 0);
		dps_tok_llama2_free(&t);
	}
}
END_TEST

/*
 * The merge loop as llama2.c's run.c writes it (quadratic: the best pair of the whole list
 * each round, leftmost on ties), the oracle of the heap-based merger.
 */
static size_t encode_ref(const struct dps_tok_llama2 *t, const char *text, size_t len, int *ids)
{
	char buf[64];
	size_t k = 0;

	ids[k++] = t->bos_id;
	if (len)
		ids[k++] = dps_tok_llama2_lookup(t, " ", 1);
	for (size_t i = 0; i < len;) {
		size_t cl = 1;
		int id;

		while (i + cl < len && cl < 4 && ((unsigned char)text[i + cl] & 0xC0) == 0x80)
			cl++;
		id = dps_tok_llama2_lookup(t, text + i, cl);
		if (id >= 0)
			ids[k++] = id;
		else
			for (size_t b = 0; b < cl; b++)
				ids[k++] = (unsigned char)text[i + b] + 3;
		i += cl;
	}
	for (;;) {
		float best = -1e10f; /* run.c's starting best */
		long at = -1;
		int best_id = -1;

		for (size_t j = 1; j + 1 < k; j++) {
			const size_t l1 = t->vocab_len[ids[j]], l2 = t->vocab_len[ids[j + 1]];
			int id;

			ck_assert_uint_lt(l1 + l2, sizeof(buf));
			memcpy(buf, t->vocab[ids[j]], l1);
			memcpy(buf + l1, t->vocab[ids[j + 1]], l2);
			id = dps_tok_llama2_lookup(t, buf, l1 + l2);
			if (id >= 0 && t->scores[id] > best) {
				best = t->scores[id];
				at = (long)j;
				best_id = id;
			}
		}
		if (at < 0)
			break;
		ids[at] = best_id;
		memmove(ids + at + 1, ids + at + 2, (k - (size_t)at - 2) * sizeof(int));
		k--;
	}
	return k;
}

/* stories260K's tokenizer: the heap merger gives llama2.c's ids on random texts of words,
 * spaces, punctuation, UTF-8 and stray bytes; a changed score makes them differ. */
START_TEST(test_heap_merges_as_llama2c)
{
	struct dps_model_config cfg = { .vocab_size = 512, .bos_token_id = 1, .eos_token_id = 2 };
	static const char *const words[] = { "Once", " upon", " a", " time", ",", " the", "ball",
		"  ", "\n", "Lily", "\xc3\xa9t\xc3\xa9", "\xe4\xb8\xad\xe6\x96\x87", "!!", "'s",
		"\xf0\x9f\x98\x80", "\xff", "ing", "ed", " was", "aaaa" };
	struct dps_tok_llama2 t;
	char err[256], text[2048];
	int got[4096], want[4096];
	unsigned s = 7;
	int differ = 0;

	ck_assert_msg(!dps_tok_llama2_load(&t, DPS_TEST_SRCDIR "/models/stories260K/tok512.bin",
					   &cfg, err, sizeof(err)), "%s", err);
	for (int round = 0; round < 120; round++) {
		size_t len = 0, n, m;
		const int nw = 1 + round % 61;

		for (int w = 0; w < nw; w++) {
			const char *p = words[((s = s * 1103515245u + 12345u) >> 16) % 20];

			memcpy(text + len, p, strlen(p));
			len += strlen(p);
		}
		m = encode_ref(&t, text, len, want);
		ck_assert_int_eq(dps_tok_llama2_encode(&t, text, len, DPS_TOK_LLAMA2_BOS, got, 4096,
						       &n), 0);
		ck_assert_uint_eq(n, m);
		ck_assert(!memcmp(got, want, n * sizeof(int)));
	}
	/* The check can fail: merge in the opposite order of scores, and the ids differ. */
	{
		static const char story[] = "Lily wanted to play with the ball, but it was "
					    "too high. She was sad and asked her mom.";
		const size_t len = sizeof(story) - 1;
		size_t n, m;

		ck_assert_int_eq(dps_tok_llama2_encode(&t, story, len, DPS_TOK_LLAMA2_BOS, got,
						       4096, &n), 0);
		for (int i = 0; i < t.vocab_size; i++)
			t.scores[i] = -t.scores[i];
		m = encode_ref(&t, story, len, want);
		differ = n != m || memcmp(got, want, n * sizeof(int));
		ck_assert(differ);
	}
	dps_tok_llama2_free(&t);
}
END_TEST

/* A vocabulary of 3000 pieces with many repeats, different for each seed. */
static size_t build_big(unsigned char **out, unsigned seed)
{
	static char pieces[3000][8];
	const char *ptr[3000];
	unsigned s = seed;
	size_t len;

	for (int i = 0; i < 3000; i++) {
		int l = 1 + (int)((s = s * 1103515245u + 12345u) >> 16) % 3;

		for (int c = 0; c < l; c++)
			pieces[i][c] = (char)('a' + ((s = s * 1103515245u + 12345u) >> 16) % 6);
		pieces[i][l] = '\0';
		ptr[i] = pieces[i];
	}
	*out = malloc(3000 * 16 + 4);
	ck_assert_ptr_nonnull(*out);
	len = build(*out, 3000 * 16 + 4, ptr, 3000);
	return len;
}

START_TEST(test_repeats_sort_by_id)
{
	struct dps_model_config cfg = { .vocab_size = 3000, .bos_token_id = 1, .eos_token_id = 2 };
	struct dps_tok_llama2 t;
	unsigned char *buf;
	const size_t len = build_big(&buf, 1);
	char err[256];
	int repeats = 0;

	ck_assert_msg(!dps_tok_llama2_load_mem(&t, buf, len, &cfg, err, sizeof(err)), "%s", err);
	for (int i = 1; i < 3000; i++) {
		const int a = t.sorted[i - 1], b = t.sorted[i], c = strcmp(t.vocab[a], t.vocab[b]);

		ck_assert_int_le(c, 0);
		if (c == 0) {
			ck_assert_int_lt(a, b);
			repeats++;
		}
	}
	ck_assert_int_gt(repeats, 1000); /* 258 distinct pieces of at most 3 of 6 letters */
	free(buf);
	dps_tok_llama2_free(&t);
}
END_TEST

struct load_job {
	const unsigned char *buf;
	size_t len;
	int sorted[3000];
	int fails;
};

static void *load_many(void *arg)
{
	struct load_job *j = arg;
	struct dps_model_config cfg = { .vocab_size = 3000, .bos_token_id = 1, .eos_token_id = 2 };
	char err[256];

	for (int r = 0; r < 20; r++) {
		struct dps_tok_llama2 t;

		if (dps_tok_llama2_load_mem(&t, j->buf, j->len, &cfg, err, sizeof(err))) {
			j->fails++;
			continue;
		}
		if (memcmp(t.sorted, j->sorted, sizeof(j->sorted)))
			j->fails++;
		dps_tok_llama2_free(&t);
	}
	return NULL;
}

START_TEST(test_threads)
{
	static struct load_job j[2];
	struct dps_model_config cfg = { .vocab_size = 3000, .bos_token_id = 1, .eos_token_id = 2 };
	unsigned char *buf[2];
	pthread_t th[2];
	char err[256];

	for (int i = 0; i < 2; i++) {
		struct dps_tok_llama2 t;

		j[i].len = build_big(&buf[i], 7 + (unsigned)i);
		j[i].buf = buf[i];
		ck_assert_msg(!dps_tok_llama2_load_mem(&t, buf[i], j[i].len, &cfg, err, sizeof(err)),
			      "%s", err);
		memcpy(j[i].sorted, t.sorted, sizeof(j[i].sorted));
		dps_tok_llama2_free(&t);
	}
	/* The two vocabularies sort differently, so mixing them up would show. */
	ck_assert(memcmp(j[0].sorted, j[1].sorted, sizeof(j[0].sorted)));
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, load_many, &j[i]), 0);
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_join(th[i], NULL), 0);
	for (int i = 0; i < 2; i++) {
		ck_assert_msg(j[i].fails == 0, "thread %d: %d of 20 loads differ from the serial one",
			      i, j[i].fails);
		free(buf[i]);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("tokenizer");
	TCase *tc = tcase_create("tokenizer");

	tcase_add_test(tc, test_llama2c_ids);
	tcase_add_test(tc, test_model_ids);
	tcase_add_test(tc, test_bad_ids);
	tcase_add_test(tc, test_repeats_sort_by_id);
	tcase_add_test(tc, test_heap_merges_as_llama2c);
	tcase_add_test(tc, test_threads);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

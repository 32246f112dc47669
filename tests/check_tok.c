/* SPDX-License-Identifier: MIT */
/*
 * tests/check_tok.c - the tokenizer interface (engine/model/tok.c) on the stories260K
 * tokenizer: which file a directory uses, invalid UTF-8 read as Rust's from_utf8_lossy reads it
 * (the oracle: the same text with each maximal invalid subsequence written as U+FFFD by hand),
 * a text that cannot fit max_ids refused, and the streaming decoder: its pieces concatenate to
 * the whole decode (the oracle), never split a character across byte-fallback tokens, and a
 * stream that drops a piece is caught by the same comparison.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "engine/model/convert.h"
#include "engine/model/model_config.h"
#include "engine/model/tok.h"
#include "tests/testutil.h"

static char dir[64];
static struct dps_tok *tok;

static void setup(void)
{
	struct dps_model_config cfg;
	char err[512];

	test_tmpdir_make(dir, sizeof(dir), "tok");
	ck_assert_msg(!dps_convert_llama2c(DPS_TEST_SRCDIR "/models/stories260K/stories260K.bin",
					   DPS_TEST_SRCDIR "/models/stories260K/tok512.bin", dir,
					   DPS_ST_F32, err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_model_config_load(dir, &cfg, err, sizeof(err)), "%s", err);
	ck_assert_msg(!dps_tok_open(&tok, dir, &cfg, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(dps_tok_kind(tok), DPS_TOK_LLAMA2);
}

static void teardown(void)
{
	dps_tok_free(tok);
	test_tmpdir_remove(dir);
}

/* The text of a stream over ids[from..n) primed with ids[0..from), flushed at the end;
 * drop >= 0 leaves that step's piece out (the fault the check must catch). */
static char *streamed(const int *ids, size_t from, size_t n, int drop)
{
	struct dps_tok_stream *s;
	char *out = calloc(1, 4096);
	size_t k = 0, l;
	const char *p;

	ck_assert_ptr_nonnull(out);
	ck_assert_int_eq(dps_tok_stream_new(&s, tok, ids, from, DPS_TOK_SKIP_SPECIAL), 0);
	for (size_t i = from; i < n; i++) {
		ck_assert_int_eq(dps_tok_stream_step(s, ids[i], &p, &l), 0);
		/* every piece is whole UTF-8 */
		ck_assert(dps_utf8_valid(p, l));
		if ((int)i != drop) {
			ck_assert_uint_lt(k + l, 4096);
			memcpy(out + k, p, l);
			k += l;
		}
	}
	ck_assert_int_eq(dps_tok_stream_flush(s, &p, &l), 0);
	memcpy(out + k, p, l);
	out[k + l] = '\0';
	dps_tok_stream_free(s);
	return out;
}

START_TEST(test_stream_concatenates)
{
	static const char *const texts[] = {
		"Once upon a time, there was a little girl named Lily.",
		"\xe4\xb8\xad\xe6\x96\x87 caf\xc3\xa9 \xf0\x9f\x98\x80 done", /* byte fallback */
		"  two  spaces\nand a newline",
	};

	for (size_t t = 0; t < sizeof(texts) / sizeof(texts[0]); t++) {
		int *ids;
		size_t n, len, plen;
		char *whole, *prefix, *got;

		ck_assert_int_eq(dps_tok_encode(tok, texts[t], strlen(texts[t]), DPS_TOK_ADD_SPECIAL,
						0, &ids, &n), 0);
		ck_assert_int_eq(dps_tok_decode(tok, ids, n, DPS_TOK_SKIP_SPECIAL, &whole, &len), 0);
		ck_assert_str_eq(whole, texts[t]);
		/* From the first id on, and after a prompt of 4 or more ids whose text is whole
		 * (a prompt that ends inside a character has no text to follow). */
		for (size_t from = 0; from < n; from = from ? from + 1 : 4) {
			ck_assert_int_eq(dps_tok_decode(tok, ids, from, DPS_TOK_SKIP_SPECIAL, &prefix, &plen),
					 0);
			if (memmem(prefix, plen, "\xef\xbf\xbd", 3)) {
				free(prefix);
				continue;
			}
			got = streamed(ids, from, n, -1);
			ck_assert_msg(strlen(got) + plen == len && !memcmp(got, whole + plen, len - plen),
				      "text %zu from %zu: streamed '%s', whole '%s'", t, from, got,
				      whole);
			free(got);
			/* The check can fail: a dropped piece makes the texts differ. */
			got = streamed(ids, from, n, (int)n - 3);
			ck_assert(strlen(got) + plen != len || memcmp(got, whole + plen, len - plen));
			free(got);
			free(prefix);
			if (from)
				break;
		}
		free(whole);
		free(ids);
	}
}
END_TEST

START_TEST(test_lossy_input)
{
	/* "a", an invalid lead byte, "b", a truncated 3-byte sequence, "c", a surrogate. */
	static const char bad[] = "a\xff" "b\xe4\xb8" "c\xed\xa0\x80";
	static const char fixed[] = "a\xef\xbf\xbd" "b\xef\xbf\xbd" "c\xef\xbf\xbd\xef\xbf\xbd"
				    "\xef\xbf\xbd";
	int *a, *b;
	size_t na, nb, l;
	char *s;

	s = dps_utf8_lossy(bad, sizeof(bad) - 1, &l);
	ck_assert_ptr_nonnull(s);
	ck_assert_uint_eq(l, sizeof(fixed) - 1);
	ck_assert(!memcmp(s, fixed, l));
	free(s);
	ck_assert(!dps_utf8_valid(bad, sizeof(bad) - 1));
	ck_assert(dps_utf8_valid(fixed, sizeof(fixed) - 1));
	ck_assert_int_eq(dps_tok_encode(tok, bad, sizeof(bad) - 1, 0, 0, &a, &na), 0);
	ck_assert_int_eq(dps_tok_encode(tok, fixed, sizeof(fixed) - 1, 0, 0, &b, &nb), 0);
	ck_assert_uint_eq(na, nb);
	ck_assert(!memcmp(a, b, na * sizeof(int)));
	free(a);
	free(b);
}
END_TEST

START_TEST(test_bound)
{
	const size_t len = 1u << 20;
	char *text = malloc(len);
	int *ids;
	size_t n;

	ck_assert_ptr_nonnull(text);
	for (size_t i = 0; i < len; i++)
		text[i] = "Lily was happy. "[i % 16];
	ck_assert_int_eq(dps_tok_encode(tok, text, len, DPS_TOK_ADD_SPECIAL, 1000, &ids, &n),
			 -E2BIG);
	ck_assert_ptr_null(ids);
	/* Within the bound the same text encodes, and the count decides. */
	ck_assert_int_eq(dps_tok_encode(tok, text, 160, DPS_TOK_ADD_SPECIAL, 1000, &ids, &n), 0);
	ck_assert_uint_gt(n, 10);
	free(ids);
	ck_assert_int_eq(dps_tok_encode(tok, text, 160, DPS_TOK_ADD_SPECIAL, 10, &ids, &n), -E2BIG);
	free(text);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("tok");
	TCase *tc = tcase_create("llama2c");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_stream_concatenates);
	tcase_add_test(tc, test_lossy_input);
	tcase_add_test(tc, test_bound);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

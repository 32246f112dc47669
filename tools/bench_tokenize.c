/* SPDX-License-Identifier: MIT */
/*
 * tools/bench_tokenize.c - `dpshard bench tokenize`: encode speed of a model's tokenizer on a
 * long document and on a 1 MiB prompt, median MB/s over rounds. The texts are a file given
 * with --file, or a seeded pseudo-English document (words, numbers, punctuation, accents and
 * newlines); --write-text DIR writes both texts so that another tokenizer (the npm
 * `tokenizers` library, say) can encode the same bytes in the same minutes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "tools/cmd.h"
#include "tools/flags.h"
#include "tools/text.h"

#define DOC_BYTES (256u << 10)
#define PROMPT_BYTES (1u << 20)

/* A seeded document of at least n bytes (NUL-terminated; *len its length). */
static char *make_doc(size_t n, size_t *len)
{
	static const char *const words[] = {
		"the", "of", "and", "a", "to", "in", "is", "was", "that", "for", "it", "with",
		"as", "his", "on", "be", "at", "by", "I", "this", "had", "not", "are", "but",
		"from", "or", "have", "an", "they", "which", "one", "you", "were", "her", "all",
		"she", "there", "would", "their", "we", "him", "been", "has", "when", "who",
		"will", "more", "no", "if", "out", "so", "said", "what", "up", "its", "about",
		"into", "than", "them", "can", "only", "other", "new", "some", "could", "time",
		"these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like",
		"our", "over", "man", "me", "even", "most", "made", "after", "also", "did", "many",
		"tokenizer", "processing", "distributed", "bandwidth", "Trainium", "café",
		"naïve", "résumé", "don't", "it's", "we'll", "they're", "2026", "3.14159",
		"1,000,000", "(see", "above)", "—", "“quoted”", "e.g.", "x=42;", "Zürich",
	};
	const size_t nw = sizeof(words) / sizeof(words[0]);
	char *s = malloc(n + 64);
	uint64_t x = 0x9E3779B97F4A7C15ull;
	size_t k = 0, in_sentence = 0;

	if (!s)
		return NULL;
	while (k < n) {
		const char *w;
		size_t l;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		w = words[x % nw];
		l = strlen(w);
		if (k + l + 4 > n + 60)
			break;
		if (in_sentence)
			s[k++] = ' ';
		memcpy(s + k, w, l);
		if (!in_sentence && s[k] >= 'a' && s[k] <= 'z')
			s[k] = (char)(s[k] - 'a' + 'A');
		k += l;
		in_sentence++;
		if (in_sentence > 6 + (x >> 40) % 14) {
			s[k++] = (x >> 20) % 5 ? '.' : '?';
			s[k++] = (x >> 30) % 4 ? ' ' : '\n';
			in_sentence = 0;
		}
	}
	s[k] = '\0';
	*len = k;
	return s;
}

static char *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *s;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) ||
	    !(s = malloc((size_t)n + 1))) {
		fclose(f);
		return NULL;
	}
	if (n && fread(s, (size_t)n, 1, f) != 1) {
		free(s);
		fclose(f);
		return NULL;
	}
	fclose(f);
	s[n] = '\0';
	*len = (size_t)n;
	return s;
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Median MB/s of rounds encodes of text; *ids gets the count. 0 or a negative code. */
static int measure(const struct dps_tok *tok, const char *text, size_t len, int rounds,
		   double *mbs, size_t *ids)
{
	double t[64];

	for (int r = 0; r < rounds; r++) {
		const uint64_t t0 = dps_now_ns();
		int *out;
		size_t n;
		const int rc = dps_tok_encode(tok, text, len, DPS_TOK_ADD_SPECIAL, 0, &out, &n);

		if (rc)
			return rc;
		t[r] = (double)len / 1e6 / ((double)(dps_now_ns() - t0) / 1e9);
		free(out);
		*ids = n;
	}
	qsort(t, (size_t)rounds, sizeof(double), cmp_double);
	*mbs = rounds % 2 ? t[rounds / 2] : (t[rounds / 2 - 1] + t[rounds / 2]) / 2;
	return 0;
}

static int write_text(const char *dir, const char *name, const char *s, size_t len)
{
	char path[4200];
	FILE *f;
	int ok;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (!f)
		return -errno;
	ok = fwrite(s, 1, len, f) == len;
	return fclose(f) || !ok ? -EIO : 0;
}

int dps_bench_tokenize(int argc, char **argv)
{
	const char *model = NULL, *file = NULL, *out_dir = NULL;
	int rounds = 5, npos, rc;
	char *pos[1], defdir[4096];
	struct dps_flag flags[] = {
		{ "model", DPS_FLAG_STR, &model, "DIR",
		  "model directory (default: stories260K, the model that comes with dpshard)" },
		{ "file", DPS_FLAG_STR, &file, "FILE",
		  "the document to encode (default: a seeded 256 KiB pseudo-English text)" },
		{ "rounds", DPS_FLAG_INT, &rounds, "R", "encodes of each text; the median counts",
		  1, 63, 'r' },
		{ "write-text", DPS_FLAG_STR, &out_dir, "DIR",
		  "also write the two texts to DIR/document.txt and DIR/prompt-1m.txt" },
		DPS_FLAGS_END,
	};
	struct dps_model_config cfg;
	struct dps_tool_text tt;
	char *doc, *prompt;
	size_t doc_len, n_doc = 0, n_prompt = 0;
	double mb_doc = 0, mb_prompt = 0;

	rc = dps_flags_parse(flags, argc, argv, "bench tokenize",
			     "[--model DIR] [--file FILE] [-r R] [--write-text DIR]", pos, 0, &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (dps_tool_text_open_model(&tt, "bench tokenize", &model, defdir, sizeof(defdir), &cfg))
		return 1;
	doc = file ? read_file(file, &doc_len) : make_doc(DOC_BYTES, &doc_len);
	prompt = malloc(PROMPT_BYTES + 1);
	if (!doc || !prompt || !doc_len) {
		fprintf(stderr, "dpshard bench tokenize: %s\n",
			file && !doc ? "cannot read --file" : "empty document or out of memory");
		free(doc);
		free(prompt);
		dps_tool_text_close(&tt);
		return 1;
	}
	/* The 1 MiB prompt: the document repeated, cut at a character boundary. */
	{
		size_t k = 0;

		while (k < PROMPT_BYTES) {
			const size_t l = doc_len < PROMPT_BYTES - k ? doc_len : PROMPT_BYTES - k;

			memcpy(prompt + k, doc, l);
			k += l;
		}
		while (k && ((unsigned char)prompt[k - 1] & 0xC0) == 0x80)
			k--;
		if (k && (unsigned char)prompt[k - 1] >= 0xC0)
			k--;
		prompt[k] = '\0';
	}
	if (out_dir && (write_text(out_dir, "document.txt", doc, doc_len) ||
			write_text(out_dir, "prompt-1m.txt", prompt, strlen(prompt)))) {
		fprintf(stderr, "dpshard bench tokenize: cannot write into %s\n", out_dir);
		rc = 1;
	}
	if (!rc)
		rc = measure(tt.tok, doc, doc_len, rounds, &mb_doc, &n_doc);
	if (!rc)
		rc = measure(tt.tok, prompt, strlen(prompt), rounds, &mb_prompt, &n_prompt);
	if (rc) {
		fprintf(stderr, "dpshard bench tokenize: %s\n", dps_strerror(rc));
	} else {
		printf("tokenizer: %s (%s), %d rounds, median\n", model,
		       dps_tok_kind(tt.tok) == DPS_TOK_HF ? "tokenizer.json" : "tokenizer.bin",
		       rounds);
		printf("| text | bytes | tokens | MB/s |\n|---|---|---|---|\n");
		printf("| document | %zu | %zu | %.2f |\n", doc_len, n_doc, mb_doc);
		printf("| 1 MiB prompt | %zu | %zu | %.2f |\n", strlen(prompt), n_prompt, mb_prompt);
	}
	free(doc);
	free(prompt);
	dps_tool_text_close(&tt);
	return rc ? 1 : 0;
}

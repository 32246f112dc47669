/* SPDX-License-Identifier: MIT */
/*
 * tests/tok_dump.c - the tokenizer.json backend's view of a corpus, for the comparison with
 * Hugging Face's own library (tests/tok_oracle.sh, against tests/tok_oracle.js): loads
 * tokenizer.json (and tokenizer_config.json when given) and, for each line of a JSON-lines
 * corpus (each line a JSON string), prints one JSON line with the ids without and with special
 * tokens and the decoding of the latter with and without skipping special tokens, and the
 * text the streaming decoder (engine/model/tok.c) gives for those ids, from the start
 * ("stream") and after a prompt of their first half ("stream_after"; null when that half's
 * text ends inside a character), special tokens skipped. With --bench
 * it encodes a file's whole text instead and prints the time and rate.
 *
 * Usage: tok_dump [--config CONFIG] TOKENIZER_JSON CORPUS_JSONL
 *        tok_dump --bench TOKENIZER_JSON TEXT_FILE [REPEAT]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/dps.h"
#include "common/json.h"
#include "engine/model/tok.h"
#include "engine/model/tok_hf.h"

static void print_ids(const int *ids, size_t n)
{
	putchar('[');
	for (size_t i = 0; i < n; i++)
		printf(i ? ",%d" : "%d", ids[i]);
	putchar(']');
}

/* The text of ids[from..n) streamed after a prompt of ids[0..from), and the flush. */
static char *streamed(const struct dps_tok *tok, const int *ids, size_t from, size_t n,
		      size_t *len)
{
	char *out;

	return dps_tok_stream_text(tok, ids, from, ids + from, n - from, DPS_TOK_SKIP_SPECIAL,
				   &out, len) ? NULL : out;
}

static int dump_line(const struct dps_tok_hf *t, const struct dps_tok *tok, const char *s,
		     size_t len)
{
	int *plain = NULL, *sp = NULL;
	size_t np, ns, dl, dsl;
	char *dec = NULL, *dec_skip = NULL;
	int rc;

	rc = dps_tok_hf_encode(t, s, len, 0, 0, &plain, &np);
	if (!rc)
		rc = dps_tok_hf_encode(t, s, len, DPS_TOK_ADD_SPECIAL, 0, &sp, &ns);
	if (!rc)
		rc = dps_tok_hf_decode(t, sp, ns, 0, &dec, &dl);
	if (!rc)
		rc = dps_tok_hf_decode(t, sp, ns, DPS_TOK_SKIP_SPECIAL, &dec_skip, &dsl);
	if (!rc) {
		size_t sl, al, hl;
		char *str = streamed(tok, sp, 0, ns, &sl), *after = NULL, *half = NULL;

		if (!str)
			rc = -ENOMEM;
		if (!rc && (rc = dps_tok_decode(tok, sp, ns / 2, DPS_TOK_SKIP_SPECIAL, &half, &hl)))
			;
		else if (!rc && !memmem(half, hl, "\xef\xbf\xbd", 3) &&
			 !(after = streamed(tok, sp, ns / 2, ns, &al)))
			rc = -ENOMEM;
		if (rc) {
			free(str);
			free(half);
			goto out;
		}
		printf("{\"ids\":");
		print_ids(plain, np);
		printf(",\"ids_special\":");
		print_ids(sp, ns);
		printf(",\"decode\":");
		dps_json_string(stdout, dec, dl);
		printf(",\"decode_skip\":");
		dps_json_string(stdout, dec_skip, dsl);
		printf(",\"stream\":");
		dps_json_string(stdout, str, sl);
		printf(",\"stream_after\":");
		if (after)
			dps_json_string(stdout, after, al);
		else
			printf("null");
		printf("}\n");
		free(str);
		free(after);
		free(half);
	}
out:
	free(plain);
	free(sp);
	free(dec);
	free(dec_skip);
	return rc;
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
		buf[n] = '\0';
		*len = (size_t)n;
	} else {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	return buf;
}

static int bench(const struct dps_tok_hf *t, const char *path, int repeat)
{
	size_t len, n = 0;
	char *text = slurp(path, &len);
	uint64_t best = UINT64_MAX;

	if (!text) {
		fprintf(stderr, "tok_dump: cannot read %s\n", path);
		return 1;
	}
	for (int r = 0; r < repeat; r++) {
		int *ids;
		const uint64_t t0 = dps_now_ns();
		const int rc = dps_tok_hf_encode(t, text, len, DPS_TOK_ADD_SPECIAL, 0, &ids, &n);
		const uint64_t dt = dps_now_ns() - t0;

		if (rc) {
			fprintf(stderr, "tok_dump: encode: %s\n", dps_strerror(rc));
			free(text);
			return 1;
		}
		free(ids);
		if (dt < best)
			best = dt;
	}
	printf("{\"bytes\":%zu,\"ids\":%zu,\"seconds\":%.6f,\"mb_per_s\":%.3f}\n", len, n,
	       (double)best / 1e9, (double)len / 1e6 / ((double)best / 1e9));
	free(text);
	return 0;
}

int main(int argc, char **argv)
{
	struct dps_tok_hf *t;
	struct dps_tok *tok = NULL;
	const char *config = NULL;
	char err[512];
	int a = 1, is_bench = 0, rc;
	FILE *f;
	long lineno = 0;

	if (a < argc && !strcmp(argv[a], "--bench")) {
		is_bench = 1;
		a++;
	}
	if (a + 1 < argc && !strcmp(argv[a], "--config")) {
		config = argv[a + 1];
		a += 2;
	}
	if (argc - a < 2) {
		fprintf(stderr, "usage: tok_dump [--config CONFIG] TOKENIZER_JSON CORPUS_JSONL\n"
				"       tok_dump --bench TOKENIZER_JSON TEXT_FILE [REPEAT]\n");
		return 2;
	}
	{
		const uint64_t t0 = dps_now_ns();

		rc = dps_tok_hf_load(&t, argv[a], config, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "tok_dump: %s\n", err);
			return 1;
		}
		if (is_bench)
			fprintf(stderr, "tok_dump: loaded in %.3f s\n",
				(double)(dps_now_ns() - t0) / 1e9);
	}
	if (is_bench) {
		rc = bench(t, argv[a + 1], a + 2 < argc ? atoi(argv[a + 2]) : 5);
		dps_tok_hf_free(t);
		return rc;
	}
	f = fopen(argv[a + 1], "r");
	if (!f || dps_tok_open_hf(&tok, argv[a], config, err, sizeof(err))) {
		fprintf(stderr, "tok_dump: cannot open %s or %s\n", argv[a + 1], argv[a]);
		if (f)
			fclose(f);
		dps_tok_hf_free(t);
		return 1;
	}
	rc = 0;
	{
		char *buf = NULL;
		size_t cap = 0;
		ssize_t got;

		while ((got = getline(&buf, &cap, f)) > 0) {
			json_error_t je;
			json_t *v;

			lineno++;
			v = json_loadb(buf, (size_t)got, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
			if (!json_is_string(v)) {
				fprintf(stderr, "tok_dump: %s:%ld: not a JSON string\n", argv[a + 1],
					lineno);
				json_decref(v);
				rc = 1;
				break;
			}
			if (dump_line(t, tok, json_string_value(v), json_string_length(v))) {
				fprintf(stderr, "tok_dump: line %ld: encode failed\n", lineno);
				rc = 1;
			}
			json_decref(v);
			if (rc)
				break;
		}
		free(buf);
	}
	fclose(f);
	dps_tok_free(tok);
	dps_tok_hf_free(t);
	return rc;
}

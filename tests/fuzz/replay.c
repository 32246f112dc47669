/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/replay.c - a driver for the fuzz targets that needs no libFuzzer: runs every
 * corpus file given on the command line, then a deterministic stream of mutations of them
 * (bit flips, byte changes, insertions, deletions, truncations, splices of two inputs).
 * `make check` runs it with every compiler (and under ASan/UBSan in the sanitizer build);
 * tests/fuzz.sh also runs the coverage-guided libFuzzer build when clang provides one.
 * Usage: replay [-n MUTATIONS] FILE...
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rng = 88172645463325252ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static unsigned char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	unsigned char *buf = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
		buf = malloc((size_t)n + 1);
		if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
			free(buf);
			buf = NULL;
		}
		*len = (size_t)n;
	}
	fclose(f);
	return buf;
}

int main(int argc, char **argv)
{
	unsigned char *in[256], *m;
	size_t len[256], cap = 1 << 16;
	long mutations = 20000;
	int n = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-n") && i + 1 < argc) {
			mutations = atol(argv[++i]);
			continue;
		}
		if (n == 256)
			break;
		in[n] = slurp(argv[i], &len[n]);
		if (!in[n]) {
			fprintf(stderr, "replay: cannot read %s\n", argv[i]);
			return 2;
		}
		LLVMFuzzerTestOneInput(in[n], len[n]);
		n++;
	}
	if (n == 0) {
		fprintf(stderr, "replay: no corpus files\n");
		return 2;
	}
	m = malloc(cap);
	if (!m)
		return 2;
	for (long it = 0; it < mutations; it++) {
		const int a = (int)(next() % (uint64_t)n);
		size_t l = len[a] < cap ? len[a] : cap;
		const int edits = 1 + (int)(next() % 4);

		memcpy(m, in[a], l);
		for (int e = 0; e < edits; e++) {
			const size_t pos = l ? next() % l : 0;

			switch (next() % 6) {
			case 0: /* bit flip */
				if (l)
					m[pos] ^= (unsigned char)(1u << (next() % 8));
				break;
			case 1: /* interesting byte */
				if (l)
					m[pos] = "\0\"{}[],:-9eE\\\xff"[next() % 15];
				break;
			case 2: /* insert */
				if (l + 1 < cap) {
					memmove(m + pos + 1, m + pos, l - pos);
					m[pos] = (unsigned char)next();
					l++;
				}
				break;
			case 3: /* delete */
				if (l) {
					memmove(m + pos, m + pos + 1, l - pos - 1);
					l--;
				}
				break;
			case 4: /* truncate */
				l = pos;
				break;
			default: { /* splice another input's tail */
				const int b = (int)(next() % (uint64_t)n);
				const size_t from = len[b] ? next() % len[b] : 0;
				size_t take = len[b] - from;

				if (pos + take > cap)
					take = cap - pos;
				memcpy(m + pos, in[b] + from, take);
				l = pos + take;
			}
			}
		}
		LLVMFuzzerTestOneInput(m, l);
	}
	printf("replay: %d corpus files and %ld mutations, no failure\n", n, mutations);
	free(m);
	for (int i = 0; i < n; i++)
		free(in[i]);
	return 0;
}

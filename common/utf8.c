/* SPDX-License-Identifier: MIT */
/*
 * common/utf8.c - UTF-8 validation and lossy conversion (see utf8.h), for the tokenizers'
 * input and output.
 */
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"

/*
 * The length of the valid sequence at s (at most n bytes), or 0 when it is not one; *sub gets
 * the length of its maximal valid prefix (at least 1: the bytes one U+FFFD replaces).
 */
static size_t seq_len(const unsigned char *s, size_t n, size_t *sub)
{
	const unsigned c = s[0];
	unsigned lo = 0x80, hi = 0xBF;
	size_t need, i;

	*sub = 1;
	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF)
		need = 2;
	else if (c >= 0xE0 && c <= 0xEF)
		need = 3;
	else if (c >= 0xF0 && c <= 0xF4)
		need = 4;
	else
		return 0;
	if (c == 0xE0)
		lo = 0xA0;
	else if (c == 0xED)
		hi = 0x9F; /* no surrogates */
	else if (c == 0xF0)
		lo = 0x90;
	else if (c == 0xF4)
		hi = 0x8F; /* nothing above U+10FFFF */
	for (i = 1; i < need; i++) {
		if (i >= n || s[i] < lo || s[i] > hi) {
			*sub = i;
			return 0;
		}
		lo = 0x80;
		hi = 0xBF;
	}
	return need;
}

int dps_utf8_valid(const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, sub;

	while (i < len) {
		const size_t l = seq_len(p + i, len - i, &sub);

		if (!l)
			return 0;
		i += l;
	}
	return 1;
}

char *dps_utf8_lossy(const char *s, size_t len, size_t *out_len)
{
	const unsigned char *p = (const unsigned char *)s;
	char *out;
	size_t i = 0, k = 0, sub;

	/* every invalid byte at most becomes 3 bytes */
	if (len > (((size_t)-1) - 1) / 3)
		return NULL;
	out = malloc(3 * len + 1);
	if (!out)
		return NULL;
	while (i < len) {
		const size_t l = seq_len(p + i, len - i, &sub);

		if (l) {
			memcpy(out + k, p + i, l);
			k += l;
			i += l;
		} else {
			memcpy(out + k, "\xEF\xBF\xBD", 3);
			k += 3;
			i += sub;
		}
	}
	out[k] = '\0';
	*out_len = k;
	return out;
}

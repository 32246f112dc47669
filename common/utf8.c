/* SPDX-License-Identifier: MIT */
/*
 * common/utf8.c - UTF-8 validation and Rust's String::from_utf8_lossy (see utf8.h). Called by the
 * tokenizers (engine/model/tok*.c: text handed in is made valid before encoding, and byte-level
 * pieces are made valid after decoding) and by the HTTP frontend. Inputs are prompts and decoded
 * texts, from a few bytes to megabytes; both functions are one pass.
 *
 * The well-formed sequences are those of Unicode's table 3-7: the second byte's range depends on
 * the first (E0 A0-BF, ED 80-9F, F0 90-BF, F4 80-8F; 80-BF otherwise), which excludes overlong
 * forms, surrogates and code points above U+10FFFF. An ill-formed sequence is replaced by
 * U+FFFD once per "maximal subpart": a lead byte followed by as many bytes as still fit a
 * well-formed sequence (a truncated character is one U+FFFD), or else a single byte (a lone
 * continuation byte, C0, C1, F5-FF, or the lead of a sequence whose second byte does not fit).
 */
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"

/* The range of the second byte of a sequence led by b, and the sequence's length; 0 when b
 * leads none. */
static size_t lead_info(unsigned char b, unsigned char *lo, unsigned char *hi)
{
	*lo = 0x80;
	*hi = 0xbf;
	if (b >= 0xc2 && b <= 0xdf)
		return 2;
	if (b >= 0xe0 && b <= 0xef) {
		if (b == 0xe0)
			*lo = 0xa0;
		else if (b == 0xed)
			*hi = 0x9f;
		return 3;
	}
	if (b >= 0xf0 && b <= 0xf4) {
		if (b == 0xf0)
			*lo = 0x90;
		else if (b == 0xf4)
			*hi = 0x8f;
		return 4;
	}
	return 0;
}

/*
 * At s (n >= 1 bytes left): the length of the well-formed sequence there, or 0 with *bad set to
 * the length of the maximal ill-formed subpart (>= 1).
 */
static size_t seq_len(const unsigned char *s, size_t n, size_t *bad)
{
	unsigned char lo, hi;
	size_t need, i;

	if (s[0] < 0x80)
		return 1;
	need = lead_info(s[0], &lo, &hi);
	if (!need) {
		*bad = 1;
		return 0;
	}
	for (i = 1; i < need; i++) {
		if (i >= n || s[i] < lo || s[i] > hi) {
			*bad = i;
			return 0;
		}
		lo = 0x80;
		hi = 0xbf;
	}
	return need;
}

int dps_utf8_valid(const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, bad;

	while (i < len) {
		size_t l;

		if (p[i] < 0x80) {
			i++;
			continue;
		}
		l = seq_len(p + i, len - i, &bad);
		if (!l)
			return 0;
		i += l;
	}
	return 1;
}

char *dps_utf8_lossy(const char *s, size_t len, size_t *out_len)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, o = 0, cap, bad;
	char *out;

	/* Every replaced subpart is at least one byte and becomes three: 3 * len + 1 is enough. */
	if (len > (((size_t)-1) - 1) / 3)
		return NULL;
	cap = 3 * len + 1;
	out = malloc(cap);
	if (!out)
		return NULL;
	while (i < len) {
		const size_t l = p[i] < 0x80 ? 1 : seq_len(p + i, len - i, &bad);

		if (l) {
			memcpy(out + o, p + i, l);
			o += l;
			i += l;
		} else {
			memcpy(out + o, "\xef\xbf\xbd", 3);
			o += 3;
			i += bad;
		}
	}
	out[o] = '\0';
	*out_len = o;
	return out;
}

size_t dps_utf8_len(const unsigned char *s, size_t n)
{
	size_t bad;

	return seq_len(s, n, &bad);
}

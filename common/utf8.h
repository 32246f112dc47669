/* SPDX-License-Identifier: MIT */
/*
 * common/utf8.h - UTF-8 as the tokenizers and the HTTP frontend need it.
 */
#ifndef DPS_COMMON_UTF8_H
#define DPS_COMMON_UTF8_H

#include <stddef.h>

/* 1 when the len bytes at s are valid UTF-8 (no surrogates, no overlongs, <= U+10FFFF). */
int dps_utf8_valid(const char *s, size_t len);

/* Length of the well-formed UTF-8 sequence at s (n bytes left, n >= 1), or 0 when it is none. */
size_t dps_utf8_len(const unsigned char *s, size_t n);

/*
 * Converts len bytes to valid UTF-8 as Rust's String::from_utf8_lossy does: each maximal
 * invalid subsequence (Unicode's "substitution of maximal subparts") becomes U+FFFD. Returns a
 * malloc'd NUL-terminated copy with its length in *out_len, or NULL when out of memory.
 */
char *dps_utf8_lossy(const char *s, size_t len, size_t *out_len);

#endif

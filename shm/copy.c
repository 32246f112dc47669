/* SPDX-License-Identifier: MIT */
/*
 * shm/copy.c - dps_copy_stream (copy.h): AVX-512 or SSE2 streaming stores on x86-64.
 */
#include <stdint.h>
#include <string.h>

#include "shm/copy.h"

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx512f"))) static void stream_avx512(char *d, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i += 256) {
		__m512i a = _mm512_loadu_si512(s + i), b = _mm512_loadu_si512(s + i + 64);
		__m512i c = _mm512_loadu_si512(s + i + 128), e = _mm512_loadu_si512(s + i + 192);

		_mm512_stream_si512((void *)(d + i), a);
		_mm512_stream_si512((void *)(d + i + 64), b);
		_mm512_stream_si512((void *)(d + i + 128), c);
		_mm512_stream_si512((void *)(d + i + 192), e);
	}
}

static void stream_sse2(char *d, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
		__m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 48));

		_mm_stream_si128((__m128i *)(void *)(d + i), a);
		_mm_stream_si128((__m128i *)(void *)(d + i + 16), b);
		_mm_stream_si128((__m128i *)(void *)(d + i + 32), c);
		_mm_stream_si128((__m128i *)(void *)(d + i + 48), e);
	}
}

void dps_copy_stream(void *dst, const void *src, size_t n)
{
	const int avx512 = __builtin_cpu_supports("avx512f");
	char *d = dst;
	const char *s = src;
	size_t head = (64 - ((uintptr_t)d & 63)) & 63, body;

	if (head > n)
		head = n;
	memcpy(d, s, head); /* up to the first 64-byte line of dst */
	d += head;
	s += head;
	n -= head;
	body = avx512 ? n / 256 * 256 : n / 64 * 64;
	if (avx512)
		stream_avx512(d, s, body);
	else
		stream_sse2(d, s, body);
	memcpy(d + body, s + body, n - body);
	_mm_sfence(); /* the streamed lines before any later store */
}
#else
void dps_copy_stream(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}
#endif

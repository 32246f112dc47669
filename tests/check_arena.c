/* SPDX-License-Identifier: MIT */
/*
 * tests/check_arena.c - a rank's weight arena (engine/shard/weights.c): every piece zeroed,
 * on ARENA_ALIGN bytes, apart from every other, and (where the kernel offers transparent huge
 * pages) on huge pages whatever its size; freeing a piece leaves the others, and releasing the
 * arena frees its chunks (the sanitizer build's leak check holds that).
 *
 * Oracle: each piece is filled with its own byte after every allocation, and all are read back
 * at the end, so any two that overlap, or a chunk handed out twice, fail; the kernel's own
 * account of the mapping (/proc/self/smaps, AnonHugePages) says whether it is on huge pages.
 * The check can fail: the same account of memory that refuses huge pages (MADV_NOHUGEPAGE)
 * shows none. The chunks are made to come from heap memory written before, so that a piece
 * handed out unzeroed fails; under AddressSanitizer a read past a piece must kill the run.
 */
#include <check.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/dps.h"
#include "engine/shard/shard.h"
#include "engine/shard/shard_int.h"
#include "tests/testutil.h"

#define PIECES 96

/* Whether the kernel gives huge pages to a region that asks for them. */
static int thp_offered(void)
{
	char line[128] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");

	if (!f)
		return 0;
	if (!fgets(line, sizeof(line), f))
		line[0] = 0;
	fclose(f);
	return strstr(line, "[always]") || strstr(line, "[madvise]");
}

/* kB of AnonHugePages in the mapping that holds p, or -1 if no mapping does. */
static long huge_kb_at(const void *p)
{
	char line[512];
	FILE *f = fopen("/proc/self/smaps", "r");
	long kb = -1;
	int in = 0;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
			continue;
		}
		if (in && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1)
			break;
	}
	fclose(f);
	return kb;
}

static size_t piece_size(int i)
{
	/* small ones of every size class, a few just under and over 2 MiB */
	static const size_t big[] = { ((size_t)2 << 20) - 1, (size_t)2 << 20, (size_t)5 << 20 };

	if (i % 16 == 15)
		return big[(i / 16) % 3];
	return (size_t)1 + ((size_t)i * 2654435761u) % ((size_t)1 << 20);
}

START_TEST(test_pieces_apart_zeroed_aligned)
{
	struct dps_shard s;
	uint8_t *p[PIECES], *dirt[2];

	/* chunks from heap memory written before (glibc serves them from the heap below its
	 * mmap threshold and keeps freed memory below its trim threshold), so that a piece
	 * handed out without zeroing shows (under the sanitizers the heap is theirs) */
	(void)mallopt(M_MMAP_THRESHOLD, 32 << 20);
	(void)mallopt(M_TRIM_THRESHOLD, 512 << 20);
	for (int i = 0; i < 2; i++) {
		dirt[i] = malloc((size_t)30 << 20);
		ck_assert_ptr_nonnull(dirt[i]);
		memset(dirt[i], 0xa5, (size_t)30 << 20);
	}
	free(dirt[1]);
	free(dirt[0]);
	memset(&s, 0, sizeof(s));
	for (int i = 0; i < PIECES; i++) {
		const size_t n = piece_size(i);

		p[i] = dps_shard_weights_alloc(&s, n);
		ck_assert_ptr_nonnull(p[i]);
		ck_assert_uint_eq((uintptr_t)p[i] % 256, 0);
		for (size_t b = 0; b < n; b++)
			if (p[i][b])
				ck_abort_msg("piece %d (%zu bytes): byte %zu not zero", i, n, b);
		memset(p[i], i + 1, n);
	}
	for (int i = 0; i < PIECES; i++)
		for (size_t b = 0; b < piece_size(i); b++)
			if (p[i][b] != (uint8_t)(i + 1))
				ck_abort_msg("piece %d overwritten at byte %zu", i, b);
	/* freeing some pieces leaves the others as they were */
	for (int i = 0; i < PIECES; i += 2)
		dps_shard_weights_free(&s, p[i]);
	for (int i = 1; i < PIECES; i += 2)
		for (size_t b = 0; b < piece_size(i); b++)
			if (p[i][b] != (uint8_t)(i + 1))
				ck_abort_msg("piece %d changed by freeing others, byte %zu", i, b);
	for (int i = 1; i < PIECES; i += 2)
		dps_shard_weights_free(&s, p[i]);
	dps_shard_weights_release(&s);
	ck_assert_ptr_null(s.wchunks);
}
END_TEST

START_TEST(test_small_pieces_on_huge_pages)
{
	struct dps_shard s;
	uint8_t *small[8], *plain;

	if (!thp_offered()) {
		fprintf(stderr, "check_arena: transparent huge pages are off here; not checked\n");
		return;
	}
	memset(&s, 0, sizeof(s));
	for (int i = 0; i < 8; i++) {
		small[i] = dps_shard_weights_alloc(&s, (size_t)1 << 20); /* alone: 4 KiB pages */
		ck_assert_ptr_nonnull(small[i]);
		memset(small[i], 1, (size_t)1 << 20);
	}
	for (int i = 0; i < 8; i++)
		ck_assert_msg(huge_kb_at(small[i]) > 0, "piece %d of 1 MiB is not on huge pages", i);
	/* the check can fail: the same bytes where huge pages are refused read as none */
	plain = mmap(NULL, (size_t)4 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		     -1, 0);
	ck_assert_ptr_ne(plain, MAP_FAILED);
	ck_assert_int_eq(madvise(plain, (size_t)4 << 20, MADV_NOHUGEPAGE), 0);
	memset(plain, 1, (size_t)4 << 20);
	ck_assert_int_eq(huge_kb_at(plain + ((size_t)2 << 20)), 0);
	munmap(plain, (size_t)4 << 20);
	dps_shard_weights_release(&s);
}
END_TEST

#if defined(__SANITIZE_ADDRESS__)
/* Under AddressSanitizer a read just past a piece lands in its red zone: the run dies (1;
 * the sanitizer's report in the log is this test's). */
START_TEST(test_overrun_caught)
{
	struct dps_shard s;
	volatile uint8_t *a, *b;

	memset(&s, 0, sizeof(s));
	a = dps_shard_weights_alloc(&s, 512);
	b = dps_shard_weights_alloc(&s, 512);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	(void)a[512];
	dps_shard_weights_release(&s);
}
END_TEST
#endif

int main(void)
{
	Suite *su = suite_create("arena");
	TCase *tc = tcase_create("arena");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_pieces_apart_zeroed_aligned);
	tcase_add_test(tc, test_small_pieces_on_huge_pages);
#if defined(__SANITIZE_ADDRESS__)
	tcase_add_exit_test(tc, test_overrun_caught, 1);
#endif
	suite_add_tcase(su, tc);
	return test_run_suite(su);
}

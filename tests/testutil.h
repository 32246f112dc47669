/* SPDX-License-Identifier: MIT */
/*
 * tests/testutil.h - what the Check suites share: running a suite to an exit status, a
 * scratch directory per test, and counting an instance's segments left in /dev/shm.
 *
 * Scratch directories live under one directory per run of a suite, which test_run_suite makes
 * before the tests and removes after them: a test that fails never reaches its teardown (Check
 * ends the forked test with _exit), and its directory goes with the run's.
 */
#ifndef DPS_TESTS_TESTUTIL_H
#define DPS_TESTS_TESTUTIL_H

#include <check.h>
#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static char test_tmp_base[256]; /* this run's directory of scratch directories, or "" */

/* $TMPDIR, or /tmp. */
static inline const char *test_tmp_root(void)
{
	const char *t = getenv("TMPDIR");

	return t && *t ? t : "/tmp";
}

static inline int test_rm_one(const char *path, const struct stat *st, int flag, struct FTW *f)
{
	(void)st, (void)flag, (void)f;
	return remove(path);
}

/* Removes dir and everything in it: 0, or -1. */
static inline int test_rm_tree(const char *dir)
{
	return nftw(dir, test_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Runs every test of s (forked, Check's default) and returns the process exit status. */
static inline int test_run_suite(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	snprintf(test_tmp_base, sizeof(test_tmp_base), "%s/dps-run-XXXXXX", test_tmp_root());
	if (!mkdtemp(test_tmp_base))
		test_tmp_base[0] = '\0'; /* scratch directories straight in $TMPDIR then */
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	if (test_tmp_base[0] && test_rm_tree(test_tmp_base))
		fprintf(stderr, "could not remove %s\n", test_tmp_base);
	return failed ? 1 : 0;
}

/* Number of /dev/shm entries belonging to process pid (its segments, shm/seg.h). */
static inline int test_shm_entries_of(pid_t pid)
{
	char prefix[64];
	struct dirent *de;
	int n = 0;
	DIR *d = opendir("/dev/shm");

	snprintf(prefix, sizeof(prefix), "dpshard-%ld-", (long)pid);
	if (!d)
		return 0;
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, prefix, strlen(prefix)))
			n++;
	closedir(d);
	return n;
}

/* Creates a fresh directory TAG-XXXXXX in the run's directory (or $TMPDIR/dps-TAG-XXXXXX)
 * into buf (64 bytes hold it under /tmp; a long $TMPDIR needs more, or mkdtemp fails). */
static inline void test_tmpdir_make(char *buf, size_t len, const char *tag)
{
	if (test_tmp_base[0])
		snprintf(buf, len, "%s/%s-XXXXXX", test_tmp_base, tag);
	else
		snprintf(buf, len, "%s/dps-%s-XXXXXX", test_tmp_root(), tag);
	ck_assert_ptr_nonnull(mkdtemp(buf));
}

/* Removes a directory made by test_tmpdir_make, with everything in it. */
static inline void test_tmpdir_remove(const char *dir)
{
	ck_assert_int_eq(test_rm_tree(dir), 0);
}

#endif

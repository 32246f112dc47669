/* SPDX-License-Identifier: MIT */
/*
 * tests/check_seg.c - Check suite for shm/seg.c: the shared-memory segments the supervisor
 * creates before it forks the ranks.
 *
 * The tests run dps_seg_create for real against /dev/shm: the mapping must be zero filled,
 * writable and shared with a forked child, and its name must be gone from /dev/shm as soon as
 * create returns. A request larger than all of /dev/shm must fail up front with -DPS_ENOSHM
 * and a message naming /dev/shm and the size (the request never fits, so nothing is ever
 * allocated). dps_seg_sweep must remove a segment of a dead instance and one whose pid was
 * reused, and keep a live instance's segment and names it cannot parse. The oracle for "is
 * it in /dev/shm" is a plain directory scan; a deliberate-fault test proves that scan does
 * see a present name. Every name a test creates ends in "ck<runner pid>", and a fixture in
 * the runner removes any such name a failed test may have left, so /dev/shm stays clean.
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/dps.h"
#include "shm/seg.h"

#define SHM_DIR "/dev/shm"

/* The Check runner's pid: names made by the tests carry it so leftovers can be found. */
static pid_t runner_pid;

/* ---------------------------------------------------------------------------------------
 * Helpers
 */

/*
 * The oracle: 1 when /dev/shm holds an entry called exactly `name` (a segment name with or
 * without its leading '/'), 0 when not, -1 when /dev/shm cannot be read.
 */
static int shm_present(const char *name)
{
	struct dirent *de;
	int found = 0;
	DIR *d;

	if (name[0] == '/')
		name++;
	d = opendir(SHM_DIR);
	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (!strcmp(de->d_name, name))
			found = 1;
	closedir(d);
	return found;
}

/* The suffix that marks names made by this run: "ck<runner pid>" (letters and digits). */
static void test_tag(char *buf, size_t len)
{
	snprintf(buf, len, "ck%ld", (long)runner_pid);
}

/* Creates an empty /dev/shm entry called name (leading '/'). Returns 0 or -errno. */
static int shm_make(const char *name)
{
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);

	if (fd < 0)
		return -errno;
	close(fd);
	return 0;
}

/* Removes every /dev/shm entry ending in this run's tag. Returns how many it removed. */
static int shm_remove_tagged(void)
{
	char tag[32], path[300];
	struct dirent *de;
	size_t tl, nl;
	int n = 0;
	DIR *d;

	test_tag(tag, sizeof(tag));
	tl = strlen(tag);
	d = opendir(SHM_DIR);
	if (!d)
		return 0;
	while ((de = readdir(d))) {
		nl = strlen(de->d_name);
		if (nl <= tl || strcmp(de->d_name + nl - tl, tag))
			continue;
		snprintf(path, sizeof(path), "/%s", de->d_name);
		if (shm_unlink(path) == 0)
			n++;
	}
	closedir(d);
	return n;
}

/* Unchecked teardown: runs in the runner after each test case, even when a test failed. */
static void cleanup_tagged(void)
{
	int n = shm_remove_tagged();

	if (n)
		fprintf(stderr, "check_seg: removed %d /dev/shm entr%s left by a failed test\n", n,
			n == 1 ? "y" : "ies");
}

/* A pid that certainly exited: a child we forked and reaped. */
static pid_t dead_pid(void)
{
	pid_t pid = fork();
	int status;

	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(0);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	return pid;
}

/* ---------------------------------------------------------------------------------------
 * dps_seg_create / dps_seg_destroy
 */

START_TEST(test_create_shared_zeroed_unlinked)
{
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	const size_t want = 3 * page + 5;
	char err[256] = "", prefix[64], tag[32], suffix[40];
	struct dps_seg seg;
	unsigned char *p;
	pid_t pid;
	int status, rc;
	size_t i;

	test_tag(tag, sizeof(tag));
	rc = dps_seg_create(&seg, tag, want, err, sizeof(err));
	ck_assert_msg(rc == 0, "dps_seg_create: %s (%s)", dps_strerror(rc), err);
	ck_assert_ptr_nonnull(seg.base);
	ck_assert_uint_eq((uintptr_t)seg.base % page, 0);
	ck_assert_uint_eq(seg.size, 4 * page);

	/* The name it had: "/<this process's prefix><n>-<tag>". */
	dps_seg_prefix(prefix, sizeof(prefix));
	snprintf(suffix, sizeof(suffix), "-%s", tag);
	ck_assert_int_eq(seg.name[0], '/');
	ck_assert_msg(!strncmp(seg.name + 1, prefix, strlen(prefix)),
		      "name %s does not start with /%s", seg.name, prefix);
	ck_assert_msg(strlen(seg.name) > strlen(suffix) &&
			      !strcmp(seg.name + strlen(seg.name) - strlen(suffix), suffix),
		      "name %s does not end with %s", seg.name, suffix);
	ck_assert_int_eq(shm_present(seg.name), 0);

	p = seg.base;
	for (i = 0; i < seg.size; i++)
		if (p[i])
			ck_abort_msg("byte %zu of a new segment is 0x%02x, not zero", i, p[i]);

	/* MAP_SHARED: what a child writes after fork, the parent reads. */
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		for (i = 0; i < seg.size; i++)
			p[i] = (unsigned char)(i * 31 + 7);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x", status);
	for (i = 0; i < seg.size; i++)
		if (p[i] != (unsigned char)(i * 31 + 7))
			ck_abort_msg("byte %zu: parent reads 0x%02x after the child wrote 0x%02x", i,
				     p[i], (unsigned char)(i * 31 + 7));

	dps_seg_destroy(&seg);
	ck_assert_ptr_null(seg.base);
	ck_assert_uint_eq(seg.size, 0);
	dps_seg_destroy(&seg); /* twice is harmless */
}
END_TEST

START_TEST(test_create_names_unique_and_size0)
{
	struct dps_seg a, b, zero;
	char err[256] = "", tag[32];
	int rc;

	test_tag(tag, sizeof(tag));
	rc = dps_seg_create(&a, tag, 0, err, sizeof(err));
	ck_assert_msg(rc == 0, "dps_seg_create size 0: %s (%s)", dps_strerror(rc), err);
	ck_assert_uint_eq(a.size, (size_t)sysconf(_SC_PAGESIZE));
	rc = dps_seg_create(&b, tag, 1, err, sizeof(err));
	ck_assert_msg(rc == 0, "dps_seg_create: %s (%s)", dps_strerror(rc), err);
	ck_assert_str_ne(a.name, b.name);
	ck_assert_ptr_ne(a.base, b.base);
	ck_assert_int_eq(shm_present(a.name), 0);
	ck_assert_int_eq(shm_present(b.name), 0);
	/* Separate segments: writing one leaves the other alone. */
	memset(a.base, 0xab, a.size);
	ck_assert_int_eq(((unsigned char *)b.base)[0], 0);
	dps_seg_destroy(&a);
	dps_seg_destroy(&b);

	memset(&zero, 0, sizeof(zero));
	dps_seg_destroy(&zero); /* safe on a zeroed struct */
}
END_TEST

START_TEST(test_create_too_big)
{
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	char err[512] = "", need[32], tag[32];
	struct statvfs vfs;
	struct dps_seg seg;
	size_t total, size;
	int rc;

	test_tag(tag, sizeof(tag));
	ck_assert_int_eq(statvfs(SHM_DIR, &vfs), 0);
	total = (size_t)vfs.f_blocks * vfs.f_frsize;
	size = total + ((size_t)1 << 30); /* more than /dev/shm holds, even empty */
	rc = dps_seg_create(&seg, tag, size, err, sizeof(err));
	ck_assert_msg(rc == -DPS_ENOSHM, "got %d (%s), want -DPS_ENOSHM; err: %s", rc,
		      dps_strerror(rc), err);
	ck_assert_ptr_null(seg.base);
	ck_assert_msg(strstr(err, SHM_DIR), "message does not mention " SHM_DIR ": %s", err);
	dps_fmt_bytes(dps_align_up(size, page), need, sizeof(need));
	ck_assert_msg(strstr(err, need), "message does not give the needed %s: %s", need, err);
	ck_assert_msg(strstr(err, seg.name + 1), "message does not name segment %s: %s",
		      seg.name, err);
	ck_assert_int_eq(shm_present(seg.name), 0);
}
END_TEST

/* ---------------------------------------------------------------------------------------
 * dps_seg_sweep
 */

START_TEST(test_sweep_dead_and_live)
{
	char tag[32], prefix[64], stale[128], live[128], reused[128], odd[128];
	unsigned long long my_start;
	int rc;

	test_tag(tag, sizeof(tag));
	dps_seg_prefix(prefix, sizeof(prefix));
	ck_assert_int_eq(sscanf(prefix, "dpshard-%*d-%llu-", &my_start), 1);

	/* A dead instance: a reaped child's pid. */
	snprintf(stale, sizeof(stale), "/dpshard-%ld-12345-0-x%s", (long)dead_pid(), tag);
	/* A live pid with another start time: the pid was reused, the instance is gone. */
	snprintf(reused, sizeof(reused), "/dpshard-%ld-%llu-0-x%s", (long)getpid(),
		 my_start == 12345 ? 12346ull : 12345ull, tag);
	/* This process: alive. */
	snprintf(live, sizeof(live), "/%s0-x%s", prefix, tag);
	/* Not a name sweep understands: left alone. */
	snprintf(odd, sizeof(odd), "/dpshard-x-12345-0-x%s", tag);

	ck_assert_int_eq(shm_make(stale), 0);
	ck_assert_int_eq(shm_make(reused), 0);
	ck_assert_int_eq(shm_make(live), 0);
	ck_assert_int_eq(shm_make(odd), 0);
	ck_assert_int_eq(shm_present(stale), 1);

	/*
	 * The count is not checked against 2: any dpshard starting meanwhile (a parallel
	 * `make check` runs cli.sh) sweeps too and may remove ours first.
	 */
	rc = dps_seg_sweep();
	ck_assert_msg(rc >= 0, "dps_seg_sweep: %s", dps_strerror(rc));
	ck_assert_msg(shm_present(stale) == 0, "%s of a dead pid survived the sweep", stale);
	ck_assert_msg(shm_present(reused) == 0, "%s of a reused pid survived the sweep", reused);
	ck_assert_msg(shm_present(live) == 1, "%s of this live process was swept", live);
	ck_assert_msg(shm_present(odd) == 1, "%s (unparsable) was swept", odd);

	/* A second sweep finds nothing of ours. */
	rc = dps_seg_sweep();
	ck_assert_int_ge(rc, 0);
	ck_assert_int_eq(shm_present(live), 1);

	ck_assert_int_eq(shm_unlink(live), 0);
	ck_assert_int_eq(shm_unlink(odd), 0);
	ck_assert_int_eq(shm_remove_tagged(), 0);
}
END_TEST

/* Deliberate fault: the oracle must see a name that is there, so a pass above means absent. */
START_TEST(test_oracle_sees_present_name)
{
	char tag[32], name[128], prefix_only[128];

	test_tag(tag, sizeof(tag));
	snprintf(name, sizeof(name), "/dpshard-oracle-%s", tag);
	ck_assert_int_eq(shm_present(name), 0);
	ck_assert_int_eq(shm_make(name), 0);
	ck_assert_msg(shm_present(name) == 1, "the /dev/shm scan missed %s", name);
	ck_assert_int_eq(shm_present(name + 1), 1); /* with or without the '/' */
	/* Exact names only: a prefix of a present name is not present. */
	snprintf(prefix_only, sizeof(prefix_only), "%.*s", (int)strlen(name) - 1, name);
	ck_assert_int_eq(shm_present(prefix_only), 0);
	ck_assert_int_eq(shm_unlink(name), 0);
	ck_assert_int_eq(shm_present(name), 0);
}
END_TEST

static Suite *seg_suite(void)
{
	Suite *s = suite_create("seg");
	TCase *tc = tcase_create("create");

	tcase_add_unchecked_fixture(tc, NULL, cleanup_tagged);
	tcase_add_test(tc, test_create_shared_zeroed_unlinked);
	tcase_add_test(tc, test_create_names_unique_and_size0);
	tcase_add_test(tc, test_create_too_big);
	suite_add_tcase(s, tc);

	tc = tcase_create("sweep");
	tcase_add_unchecked_fixture(tc, NULL, cleanup_tagged);
	tcase_add_test(tc, test_sweep_dead_and_live);
	tcase_add_test(tc, test_oracle_sees_present_name);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	struct stat st;
	SRunner *sr;
	int failed;

	if (stat(SHM_DIR, &st) || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "check_seg: SKIP: %s is not a directory on this machine\n", SHM_DIR);
		return 77;
	}
	runner_pid = getpid();
	sr = srunner_create(seg_suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

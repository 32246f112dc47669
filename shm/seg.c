/* SPDX-License-Identifier: MIT */
/*
 * shm/seg.c - creation, reservation and sweeping of shared-memory segments (see seg.h).
 * Called by the supervisor at start-up only; nothing here is on a hot path.
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/dps.h"
#include "shm/seg.h"

#define SHM_DIR "/dev/shm"
#define SEG_PREFIX "dpshard-"

/* Start time of process pid in clock ticks since boot (field 22 of /proc/pid/stat), 0 if gone. */
static unsigned long long proc_start_time(long pid)
{
	char path[64], buf[1024], *p;
	unsigned long long start = 0;
	ssize_t n;
	int fd, field;

	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* The command name may hold spaces and parentheses: count fields after the last ')'. */
	p = strrchr(buf, ')');
	if (!p)
		return 0;
	for (field = 2; *p && field < 22; p++)
		if (*p == ' ')
			field++;
	if (field == 22)
		start = strtoull(p, NULL, 10);
	return start;
}

void dps_seg_prefix(char *buf, size_t len)
{
	long pid = (long)getpid();

	snprintf(buf, len, SEG_PREFIX "%ld-%llu-", pid, proc_start_time(pid));
}

int dps_seg_create(struct dps_seg *seg, const char *tag, size_t size, char *err, size_t errlen)
{
	static atomic_uint counter;
	char prefix[64], need[32], have[32];
	struct statvfs vfs;
	int fd, rc;
	void *p;

	memset(seg, 0, sizeof(*seg));
	if (size == 0)
		size = 1;
	size = dps_align_up(size, (size_t)sysconf(_SC_PAGESIZE));
	dps_seg_prefix(prefix, sizeof(prefix));
	snprintf(seg->name, sizeof(seg->name), "/%s%u-%s", prefix,
		 atomic_fetch_add(&counter, 1), tag);

	/* Fail early, without touching memory, when /dev/shm plainly cannot hold it. */
	if (statvfs(SHM_DIR, &vfs) == 0 &&
	    (unsigned long long)vfs.f_bavail * vfs.f_frsize < (unsigned long long)size) {
		snprintf(err, errlen,
			 "shared memory segment %s needs %s but " SHM_DIR " has only %s free; "
			 "enlarge it (mount -o remount,size=...) or use fewer ranks or smaller buffers",
			 seg->name, dps_fmt_bytes(size, need, sizeof(need)),
			 dps_fmt_bytes((size_t)vfs.f_bavail * vfs.f_frsize, have, sizeof(have)));
		return -DPS_ENOSHM;
	}

	fd = shm_open(seg->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "shm_open %s: %s", seg->name, strerror(-rc));
		return rc;
	}
	rc = posix_fallocate(fd, 0, (off_t)size);
	if (rc) {
		if (rc == ENOSPC || rc == EFBIG) {
			snprintf(err, errlen,
				 "shared memory segment %s needs %s but " SHM_DIR " ran out of "
				 "space reserving it; enlarge " SHM_DIR " or use fewer ranks",
				 seg->name, dps_fmt_bytes(size, need, sizeof(need)));
			rc = -DPS_ENOSHM;
		} else {
			snprintf(err, errlen, "fallocate %s: %s", seg->name, strerror(rc));
			rc = -rc;
		}
		goto err;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		rc = -errno;
		snprintf(err, errlen, "mmap %s: %s", seg->name, strerror(-rc));
		goto err;
	}
	shm_unlink(seg->name);
	close(fd);
	seg->base = p;
	seg->size = size;
	return 0;
err:
	shm_unlink(seg->name);
	close(fd);
	return rc;
}

void dps_seg_destroy(struct dps_seg *seg)
{
	if (seg->base)
		munmap(seg->base, seg->size);
	seg->base = NULL;
	seg->size = 0;
}

int dps_seg_sweep(void)
{
	struct dirent *de;
	int removed = 0;
	DIR *d;

	d = opendir(SHM_DIR);
	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		unsigned long long start, now;
		char *end, path[300];
		long pid;

		if (strncmp(de->d_name, SEG_PREFIX, strlen(SEG_PREFIX)))
			continue;
		pid = strtol(de->d_name + strlen(SEG_PREFIX), &end, 10);
		if (pid <= 0 || *end != '-')
			continue;
		start = strtoull(end + 1, &end, 10);
		if (*end != '-')
			continue;
		now = proc_start_time(pid);
		if (now != 0 && now == start)
			continue; /* its instance is alive */
		snprintf(path, sizeof(path), "/%s", de->d_name);
		if (shm_unlink(path) == 0) {
			removed++;
			dps_info("removed stale shared memory segment %s of a dead instance (pid %ld)",
				 de->d_name, pid);
		}
	}
	closedir(d);
	return removed;
}

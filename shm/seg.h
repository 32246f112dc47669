/* SPDX-License-Identifier: MIT */
/*
 * shm/seg.h - POSIX shared-memory segments of one engine instance.
 *
 * The supervisor creates every segment before it forks the ranks: shm_open(O_CREAT|O_EXCL,
 * 0600) under a name unique to the instance ("/dpshard-<pid>-<start time>-<n>-<tag>"),
 * reserved with fallocate so a /dev/shm that is too small fails here, with a message saying
 * how much is needed, instead of SIGBUS later. The ranks inherit the mapping through fork(),
 * so the name is unlinked as soon as the supervisor has mapped it (dps_seg_create does it):
 * every rank of this instance, present or restarted, has the mapping, and nothing is left in
 * /dev/shm whatever way the instance ends. Segments of a crashed earlier instance (killed in
 * the few instructions between create and unlink) are removed by dps_seg_sweep.
 */
#ifndef DPS_SHM_SEG_H
#define DPS_SHM_SEG_H

#include <stddef.h>

struct dps_seg {
	void *base;     /* MAP_SHARED mapping, page aligned, zero filled */
	size_t size;
	char name[96];  /* the name it had in /dev/shm (already unlinked) */
};

/*
 * Creates, reserves, maps and unlinks a segment of `size` bytes tagged `tag` (letters and
 * digits). Returns 0, -DPS_ENOSHM when /dev/shm cannot hold it (err then says how much is
 * needed and how much is free), or -errno; err gets a message naming the segment.
 */
int dps_seg_create(struct dps_seg *seg, const char *tag, size_t size, char *err, size_t errlen);

/* Unmaps the segment. Safe on a zeroed struct. */
void dps_seg_destroy(struct dps_seg *seg);

/*
 * Removes every /dev/shm entry named "dpshard-<pid>-<start>-..." whose process no longer
 * exists (or is another process that reused the pid). Returns the number removed, or -errno.
 */
int dps_seg_sweep(void);

/* The name prefix of this process's segments, "dpshard-<pid>-<start time>-". */
void dps_seg_prefix(char *buf, size_t len);

#endif

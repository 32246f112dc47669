/* SPDX-License-Identifier: MIT */
/*
 * shm/copy.h - copying into shared memory that another core will read.
 *
 * A large block written with ordinary stores stays in the writer's cache, and a reader on
 * another core then fetches it line by line from that cache; when the two cores are far apart
 * (another core complex, another socket) that is slower than reading memory. dps_copy_stream
 * writes with non-temporal stores, which go to memory and leave no copy in the writer's
 * cache, and ends with a store fence so that a release store after it (a step flag) orders
 * after the data. For small blocks, which the reader wants in cache, use memcpy.
 */
#ifndef DPS_SHM_COPY_H
#define DPS_SHM_COPY_H

#include <stddef.h>

/* dst[0..n) = src[0..n); non-temporal where the CPU has the stores, memcpy elsewhere. */
void dps_copy_stream(void *dst, const void *src, size_t n);

#endif

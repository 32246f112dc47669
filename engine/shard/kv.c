/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/kv.c - the paged KV cache (see kv.h): sizing from a budget, the memory, and the
 * block pool. Called at start-up by every rank (dps_shard_load, the engine's replica) and by
 * the scheduler whenever a request gains or loses blocks.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "engine/shard/kv.h"

int dps_kv_blocks_for(size_t budget, size_t block_bytes, int block_size, int max_blocks, int need,
		      int need_pos, int *blocks, char *err, size_t errlen)
{
	const size_t n = budget / block_bytes;

	*blocks = n > (size_t)INT32_MAX / (size_t)block_size ? INT32_MAX / block_size : (int)n;
	if (max_blocks > 0 && *blocks > max_blocks)
		*blocks = max_blocks;
	if (*blocks < need) {
		snprintf(err, errlen, "a KV cache of %zu bytes holds %d blocks of %d positions "
			 "(%zu bytes each); one sequence of %d positions needs %d: give "
			 "--kv-cache-memory at least %zu bytes or a smaller --max-model-len", budget,
			 *blocks, block_size, block_bytes, need_pos, need, block_bytes * (size_t)need);
		return -EINVAL;
	}
	return 0;
}

int dps_kv_heads_of(int heads, int kvh, int tp, int ca, int t, int *out)
{
	int heads_p, hq_t, n = 0;

	if (heads < 1 || kvh < 1 || heads % kvh || tp < 1 || ca < 1 || t < 0 || t >= tp)
		return -EINVAL;
	heads_p = (heads + tp * ca - 1) / (tp * ca) * (tp * ca);
	hq_t = heads_p / tp;
	for (int i = 0; i < hq_t; i++) {
		const int h = t * hq_t + i, g = h / (heads / kvh);
		int k = 0;

		if (h >= heads)
			continue;
		while (k < n && out[k] != g)
			k++;
		if (k == n)
			out[n++] = g;
	}
	if (!n)
		out[n++] = 0;
	return n;
}

int dps_kv_relay_plan(int heads, int kvh, int ptp, int tp, int ca, int t,
		      struct dps_kv_relay *out)
{
	int *mine, *theirs, n, rc = 0;

	if (heads < 1 || ptp < 1 || tp < 1 || ca < 1 || heads > INT32_MAX / 2 - tp * ca - ptp)
		return -EINVAL;
	/* room for heads_p / tp + 1 <= heads + tp * ca heads on either side */
	mine = malloc(sizeof(int) * (size_t)(heads + tp * ca + 1));
	theirs = malloc(sizeof(int) * (size_t)(heads + ptp + 1));
	if (!mine || !theirs) {
		free(mine);
		free(theirs);
		return -ENOMEM;
	}
	n = dps_kv_heads_of(heads, kvh, tp, ca, t, mine);
	for (int k = 0; k < n; k++)
		out[k].src_rank = -1;
	for (int p = 0; p < ptp && n > 0 && !rc; p++) {
		const int m = dps_kv_heads_of(heads, kvh, ptp, 1, p, theirs);

		if (m < 0)
			rc = m;
		for (int k = 0; k < n; k++)
			for (int j = 0; j < m && out[k].src_rank < 0; j++)
				if (theirs[j] == mine[k])
					out[k] = (struct dps_kv_relay){ p, j, mine[k] };
	}
	for (int k = 0; k < n && !rc; k++)
		if (out[k].src_rank < 0) /* cannot be: every KV head is some prefill rank's */
			rc = -EINVAL;
	free(mine);
	free(theirs);
	return rc ? rc : n;
}

/* The kernel's MemAvailable, in bytes (0 when unknown). */
static long mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	long kb = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb * 1024;
}

size_t dps_kv_budget(size_t kv_cache_memory, double fraction, int ranks)
{
	if (kv_cache_memory)
		return kv_cache_memory;
	return (size_t)((double)mem_available() * (fraction > 0 ? fraction : 0.5) /
			(double)(ranks > 0 ? ranks : 1));
}

size_t dps_kv_budget_share(size_t budget, size_t target_width, size_t draft_width)
{
	return (size_t)((double)budget * (double)target_width /
			(double)(target_width + draft_width ? target_width + draft_width : 1));
}

float *dps_kv_alloc(size_t bytes)
{
	void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	(void)madvise(p, bytes, MADV_HUGEPAGE); /* attention streams it */
	return p;
}

void dps_kv_free(float *p, size_t bytes)
{
	if (p)
		munmap(p, bytes ? bytes : 1);
}

int dps_kv_pool_init(struct dps_kv_pool *p, int num_blocks)
{
	p->free = malloc(sizeof(int) * (size_t)(num_blocks > 0 ? num_blocks : 1));
	p->num_blocks = num_blocks;
	p->n_free = 0;
	if (!p->free)
		return -ENOMEM;
	/* A stack: block 0 is handed out first. */
	for (int b = 0; b < num_blocks; b++)
		p->free[b] = num_blocks - 1 - b;
	p->n_free = num_blocks;
	return 0;
}

void dps_kv_pool_free(struct dps_kv_pool *p)
{
	free(p->free);
	p->free = NULL;
	p->n_free = p->num_blocks = 0;
}

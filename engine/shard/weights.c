/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/weights.c - how a rank holds its linear weights (see shard.h, --dtype and
 * --quantization): the type chosen at load (f32, BF16 at half the bytes, or INT8 blocks at
 * 34 bytes per 32, quantized as they are read, or taken as stored from an INT8 checkpoint),
 * their allocation, and the rank-override loaders that read a component's rows or columns of
 * a tensor. Called by load.c,
 * load_moe.c and draft.c, once per rank at start-up.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/dps.h"
#include "engine/shard/shard_int.h"
#include "kernels/q8.h"

/*
 * The rank's weight arena. A piece of 2 MiB or more gets an allocation of its own on
 * transparent huge pages (dps_alloc_huge); a smaller one (an INT8 model's attention and down
 * matrices, a BF16 model's output projection, the MXFP4 experts of a model the size of
 * bench-gpt-oss and every expert's scales, every norm and bias) is carved from a chunk of
 * ARENA_CHUNK bytes that is on huge pages too. Alone, each went to calloc on 4 KiB pages,
 * where a streamed matrix costs a TLB walk every 4 KiB and the hardware prefetcher stops at
 * every page (one thread summing 140 MB on 4 KiB pages: 21-23 GB/s, on 2 MiB pages 25-29
 * GB/s; bench-gpt-oss -q int8 on one thread, the experts at 74-83% -> 88-90% of the measured
 * bandwidth, 2026-12-06). Pieces start on ARENA_ALIGN bytes. The chunks go with the shard
 * (dps_shard_weights_release).
 */
#define ARENA_CHUNK ((size_t)16 << 20)
#define ARENA_ALIGN ((size_t)256)
#define HUGE_PAGE ((size_t)2 << 20)

/*
 * Under AddressSanitizer each piece is followed by ARENA_ALIGN poisoned bytes, and a chunk's
 * free space is poisoned, so that reading or writing past a weight is still caught there as
 * it was when each weight was an allocation of its own.
 */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ARENA_REDZONE ARENA_ALIGN
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define ARENA_REDZONE ((size_t)0)
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

struct dps_wchunk {
	struct dps_wchunk *next;
	uint8_t *base;
	size_t used;
};

void *dps_shard_weights_alloc(struct dps_shard *s, size_t bytes)
{
	struct dps_wchunk *c;
	size_t need;
	uint8_t *p;

	if (bytes >= HUGE_PAGE)
		return dps_alloc_huge(bytes);
	need = dps_align_up((bytes ? bytes : 1) + ARENA_REDZONE, ARENA_ALIGN);
	for (c = s->wchunks; c && ARENA_CHUNK - c->used < need; c = c->next)
		;
	if (!c) {
		void *base;

		/* not dps_alloc_huge, which zeroes (and so faults in) the whole chunk at once: a
		 * small model's rank would hold 16 MiB instead of the pages its pieces touch */
		c = calloc(1, sizeof(*c));
		if (!c || posix_memalign(&base, HUGE_PAGE, ARENA_CHUNK)) {
			free(c);
			return NULL;
		}
		(void)madvise(base, ARENA_CHUNK, MADV_HUGEPAGE);
		POISON(base, ARENA_CHUNK);
		c->base = base;
		c->next = s->wchunks;
		s->wchunks = c;
	}
	p = c->base + c->used;
	c->used += need;
	UNPOISON(p, bytes);
	memset(p, 0, bytes);
	return p;
}

void dps_shard_weights_free(struct dps_shard *s, void *p)
{
	for (const struct dps_wchunk *c = s->wchunks; c; c = c->next)
		if ((uintptr_t)p - (uintptr_t)c->base < ARENA_CHUNK)
			return; /* the chunk goes as a whole */
	free(p);
}

void dps_shard_weights_release(struct dps_shard *s)
{
	while (s->wchunks) {
		struct dps_wchunk *c = s->wchunks;

		s->wchunks = c->next;
		UNPOISON(c->base, ARENA_CHUNK);
		free(c->base);
		free(c);
	}
}

int dps_shard_dtype_parse(const char *s, enum dps_shard_dtype *out, char *err, size_t errlen)
{
	if (s && !strcmp(s, "auto"))
		*out = DPS_SHARD_DTYPE_AUTO;
	else if (s && !strcmp(s, "f32"))
		*out = DPS_SHARD_DTYPE_F32;
	else if (s && !strcmp(s, "bf16"))
		*out = DPS_SHARD_DTYPE_BF16;
	else {
		snprintf(err, errlen, "--dtype %s: expected auto, f32 or bf16", s ? s : "(none)");
		return -EINVAL;
	}
	return 0;
}

int dps_shard_choose_wt(struct dps_shard_loader *L, enum dps_shard_dtype d,
			enum dps_shard_quant q)
{
	struct dps_shard *s = L->s;
	const int int8_ckpt = L->ck.cfg.int8;
	enum dps_wtype t;

	switch (d) {
	case DPS_SHARD_DTYPE_AUTO:
		t = dps_ckpt_weights_bf16(&L->ck) ? DPS_WT_BF16
		    : dps_ckpt_weights_f16(&L->ck) ? DPS_WT_F16 : DPS_WT_F32;
		break;
	case DPS_SHARD_DTYPE_F32:
		t = DPS_WT_F32;
		break;
	case DPS_SHARD_DTYPE_BF16:
		t = DPS_WT_BF16;
		break;
	default:
		snprintf(L->err, L->errlen, "--dtype: unknown choice %d", (int)d);
		return -EINVAL;
	}
	s->wt = s->wt_emb = t;
	if (q == DPS_SHARD_QUANT_INT8 || (int8_ckpt && d != DPS_SHARD_DTYPE_F32)) {
		/*
		 * The linear weights INT8; --dtype says how the embedding and the router are held.
		 * An INT8 checkpoint's weights with --dtype bf16 would be rounded: refused.
		 */
		if (int8_ckpt && q != DPS_SHARD_QUANT_INT8 && d == DPS_SHARD_DTYPE_BF16) {
			snprintf(L->err, L->errlen, "%s: its linear weights are INT8 (dpshard_int8); "
				 "they are held as INT8, or as f32 with --dtype f32, not as BF16",
				 L->ck.dir);
			return -EINVAL;
		}
		s->wt = DPS_WT_Q8;
	}
	return 0;
}

void *dps_shard_alloc_t(struct dps_shard_loader *L, enum dps_shard_part part, size_t n, int k,
			enum dps_wtype t)
{
	size_t bytes;
	void *p;

	if (L->rc)
		return NULL;
	if (k < 0 || (k && n > SIZE_MAX / 8 / (size_t)k)) {
		snprintf(L->err, L->errlen, "rank %d: %zu x %d weights of %s overflow a size",
			 L->s->w ? L->s->w->rank : 0, n, k, dps_wtype_name(t));
		L->rc = -ENOMEM;
		return NULL;
	}
	bytes = dps_wtype_bytes(t, n, k);
	p = dps_shard_weights_alloc(L->s, bytes);
	if (!p) {
		snprintf(L->err, L->errlen, "rank %d: cannot allocate %zu bytes of weights",
			 L->s->w ? L->s->w->rank : 0, bytes);
		L->rc = -ENOMEM;
		return NULL;
	}
	L->s->bytes[part] += bytes;
	return p;
}

void *dps_shard_alloc_w(struct dps_shard_loader *L, enum dps_shard_part part, size_t n, int k)
{
	return dps_shard_alloc_t(L, part, n, k, L->s->wt);
}

/* Rows of f32 read and quantized at a time (the staging buffer is this many rows of k). */
#define Q8_STAGE_ROWS 1024

/*
 * dps_shard_load_range_t into INT8: rows x k (the range's shape) of tensor name. An INT8
 * tensor is taken as stored; another is read as f32, Q8_STAGE_ROWS rows at a time along
 * dimension 0 (a column range comes whole), and quantized.
 */
static void load_range_q8(struct dps_shard_loader *L, const char *name, const uint64_t shape[2],
			  int dim, int64_t first, uint64_t n, void *dst)
{
	const struct dps_st_tensor *t = dps_ckpt_find(&L->ck, name, NULL);
	const uint64_t rows = dim == 0 ? n : shape[0];
	const int k = (int)(dim == 0 ? shape[1] : n);
	const size_t kb = dps_q8_blocks(k);
	const uint64_t step = dim == 0 ? Q8_STAGE_ROWS : rows;

	if (t && t->dtype == DPS_ST_I8) {
		int8_t *q = malloc(rows * (uint64_t)k + 1);
		uint16_t *d = malloc(sizeof(uint16_t) * (rows * kb + 1));

		if (!q || !d) {
			L->rc = -ENOMEM;
			snprintf(L->err, L->errlen, "out of memory reading '%s'", name);
		} else {
			L->rc = dps_ckpt_load_range_int8(&L->ck, name, shape, dim, first, n, q, d,
							 L->err, L->errlen);
		}
		if (!L->rc)
			dps_q8_import_rows(dst, k, q, d, rows);
		free(q);
		free(d);
		return;
	}
	for (uint64_t r0 = 0; r0 < rows && !L->rc; r0 += step) {
		const uint64_t m = rows - r0 < step ? rows - r0 : step;
		float *f = malloc(sizeof(float) * (m * (uint64_t)k + 1));

		if (!f) {
			L->rc = -ENOMEM;
			snprintf(L->err, L->errlen, "out of memory reading '%s'", name);
			return;
		}
		L->rc = dps_ckpt_load_range(&L->ck, name, 2, shape, dim,
					    dim == 0 ? first + (int64_t)r0 : first, dim == 0 ? m : n, f,
					    L->err, L->errlen);
		if (!L->rc)
			dps_q8_quantize_rows(dps_shard_wrow(dst, DPS_WT_Q8, r0, k), k, f, m);
		free(f);
	}
}

void dps_shard_load_range_t(struct dps_shard_loader *L, const char *name, uint64_t d0,
			    uint64_t d1, int dim, int64_t first, uint64_t n, void *dst,
			    enum dps_wtype t)
{
	const uint64_t shape[2] = { d0, d1 };

	if (L->rc)
		return;
	if (t == DPS_WT_Q8)
		load_range_q8(L, name, shape, dim, first, n, dst);
	else if (t == DPS_WT_BF16)
		L->rc = dps_ckpt_load_range_bf16(&L->ck, name, 2, shape, dim, first, n, dst, L->err,
						 L->errlen);
	else if (t == DPS_WT_F16)
		L->rc = dps_ckpt_load_range_f16(&L->ck, name, 2, shape, dim, first, n, dst, L->err,
						L->errlen);
	else
		L->rc = dps_ckpt_load_range(&L->ck, name, 2, shape, dim, first, n, dst, L->err,
					    L->errlen);
}

void dps_shard_load_range_w(struct dps_shard_loader *L, const char *name, uint64_t d0,
			    uint64_t d1, int dim, int64_t first, uint64_t n, void *dst)
{
	dps_shard_load_range_t(L, name, d0, d1, dim, first, n, dst, L->s->wt);
}

/* ---- the rank-override loaders -------------------------------------------------------------- */

void dps_shard_load_rows_of_rank(struct dps_shard_loader *L, const char *name, uint64_t d0,
				 uint64_t d1, int rank, uint64_t per, void *dst)
{
	dps_shard_load_range_w(L, name, d0, d1, 0, (int64_t)rank * (int64_t)per, per, dst);
}

void dps_shard_load_cols_of_rank(struct dps_shard_loader *L, const char *name, uint64_t rows,
				 uint64_t cols, int rank, int per, void *dst)
{
	dps_shard_load_range_w(L, name, rows, cols, 1, (int64_t)rank * per, (uint64_t)per, dst);
}

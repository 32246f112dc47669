/* SPDX-License-Identifier: MIT */
/*
 * engine/model/ckpt.h - a Hugging Face-style checkpoint directory (config.json + *.safetensors,
 * sharded with model.safetensors.index.json or not) and the shard loader.
 *
 * dps_ckpt_load_shard reads only the bytes of one shard of one tensor, with io_uring and many
 * reads in flight, straight into the destination when the file holds F32 and through a
 * staging buffer converted to F32 otherwise. A dimension that does not divide by the shard
 * count is split in ceil(dim / count) pieces and the last shard's missing part is zero-filled,
 * so every shard has the same shape (padding never changes a product).
 *
 * Writing the format (dps_st_write) is safetensors.h's, for mkmodel and convert.
 */
#ifndef DPS_ENGINE_CKPT_H
#define DPS_ENGINE_CKPT_H

#include <liburing.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

struct dps_ckpt {
	char *dir;
	struct dps_model_config cfg;
	int n_files;
	struct dps_st_file *files; /* (n_files) */
	struct io_uring ring;
	int ring_ok;
	uint64_t bytes_read;       /* tensor bytes read so far */
};

/*
 * Opens dir: config.json, then model.safetensors.index.json (every file it names, and every
 * tensor of its weight_map must be in the file it names) or else every *.safetensors file of
 * dir. Returns 0 or a negative code with a message naming the file and the problem.
 */
int dps_ckpt_open(struct dps_ckpt *ck, const char *dir, char *err, size_t errlen);
void dps_ckpt_close(struct dps_ckpt *ck);

/* The tensor called name (and the index of its file), or NULL. */
const struct dps_st_tensor *dps_ckpt_find(const struct dps_ckpt *ck, const char *name, int *file);

/*
 * Loads shard `idx` of `count` of tensor name split along dimension dim into dst (F32,
 * row-major, the shard's shape: the tensor's shape with dimension dim replaced by
 * ceil(shape[dim] / count)). want_shape/want_ndim, when want_ndim > 0, must equal the
 * tensor's full shape (a wrong shape is an error naming the tensor). Returns 0 or a negative
 * code with a message in err.
 */
int dps_ckpt_load_shard(struct dps_ckpt *ck, const char *name, int want_ndim,
			const uint64_t *want_shape, int dim, int idx, int count, float *dst,
			char *err, size_t errlen);

/*
 * Loads indices [first, first + per) of dimension dim of tensor name into dst, the shape of the
 * tensor with dimension dim replaced by per; indices past the end of the dimension are zero.
 * dps_ckpt_load_shard is this with first = idx * ceil(shape[dim] / count), per = that ceiling.
 */
int dps_ckpt_load_range(struct dps_ckpt *ck, const char *name, int want_ndim,
			const uint64_t *want_shape, int dim, int64_t first, uint64_t per, float *dst,
			char *err, size_t errlen);

/*
 * The same into BF16 (common/bf16.h), for linear weights kept as BF16: a BF16 tensor's bytes
 * as stored, an F32 or F16 one rounded to nearest even (F16 -> BF16 loses three bits of
 * mantissa and gains range). An integer or byte tensor is refused with -EINVAL.
 */
int dps_ckpt_load_range_bf16(struct dps_ckpt *ck, const char *name, int want_ndim,
			     const uint64_t *want_shape, int dim, int64_t first, uint64_t per,
			     uint16_t *dst, char *err, size_t errlen);

/*
 * An INT8 tensor name (`dpshard quantize`: signed values, n x K, and name_scale, F16 scales of
 * each block of 32 columns, n x ceil(K / 32)) as stored: indices [first, first + per) of
 * dimension dim (0 or 1) into q (the range's shape, zero past the end) and their blocks' scales
 * into d (rows x ceil(cols / 32), zero past the end). Along dimension 1 the range must start
 * on a block of 32 (a block's one scale cannot be cut): otherwise -EINVAL with a message
 * naming the tensor and the column. want_shape (n, K) as for dps_ckpt_load_range. A tensor
 * that is not INT8 is refused with -EINVAL.
 */
int dps_ckpt_load_range_int8(struct dps_ckpt *ck, const char *name, const uint64_t *want_shape,
			     int dim, int64_t first, uint64_t per, int8_t *q, uint16_t *d,
			     char *err, size_t errlen);

/*
 * Whether --dtype auto keeps this checkpoint's linear weights as BF16: 1 when every floating
 * tensor of two or more dimensions is BF16 (and there is one), else 0 (a checkpoint that mixes
 * types stays F32).
 */
int dps_ckpt_weights_bf16(const struct dps_ckpt *ck);

/* The same for F16: 1 when every such tensor is F16 (kept as F16 by --dtype auto). */
int dps_ckpt_weights_f16(const struct dps_ckpt *ck);

/*
 * An F16 tensor's values as stored (two bytes each), for weights kept as F16: as
 * dps_ckpt_load_range, into dst; a tensor of another type is refused with -EINVAL.
 */
int dps_ckpt_load_range_f16(struct dps_ckpt *ck, const char *name, int want_ndim,
			    const uint64_t *want_shape, int dim, int64_t first, uint64_t per,
			    uint16_t *dst, char *err, size_t errlen);

/*
 * The same without conversion: the tensor's own bytes, one per element (zero bytes past the
 * end), for tensors kept as stored (MXFP4 blocks and scales). A tensor that is not U8 is
 * refused with -EINVAL: dst holds one byte an element.
 */
int dps_ckpt_load_range_raw(struct dps_ckpt *ck, const char *name, int want_ndim,
			    const uint64_t *want_shape, int dim, int64_t first, uint64_t per,
			    void *dst, char *err, size_t errlen);

#endif

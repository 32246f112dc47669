/* SPDX-License-Identifier: MIT */
/*
 * engine/model/safetensors.h - the safetensors file format: an 8-byte little-endian header length,
 * a JSON header mapping each tensor name to {dtype, shape, data_offsets}, then the tensor
 * bytes. This module parses and validates headers (dps_st_parse_header is pure and fuzzed)
 * and opens files; the loader reads tensor bytes with io_uring.
 *
 * A header is refused, with a message naming the file and the problem, when it is not a JSON
 * object, when it is larger than DPS_ST_MAX_HEADER, when a tensor has an unsupported dtype,
 * a malformed or too-deep shape, offsets that are reversed, outside the data area or that
 * disagree with dtype x shape, or when two tensors' byte ranges overlap.
 */
#ifndef DPS_ENGINE_SAFETENSORS_H
#define DPS_ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/f16.h" /* dps_f16_to_f32, dps_f32_to_f16: the reader and writer convert F16 */

#define DPS_ST_MAX_HEADER (100u << 20) /* bytes of JSON header accepted */
#define DPS_ST_MAX_DIMS 8

enum dps_st_dtype { DPS_ST_F32, DPS_ST_BF16, DPS_ST_F16,
		   DPS_ST_I64, /* integer tensors (an Eagle3 draft's d2t), read as F32 */
		   DPS_ST_U8,  /* bytes kept as stored (GPT-OSS's MXFP4 *_blocks and *_scales) */
		   DPS_ST_I8   /* INT8 weights (`dpshard quantize`), with an F16 X_scale beside */ };

struct dps_st_tensor {
	char *name;
	enum dps_st_dtype dtype;
	int ndim;
	uint64_t shape[DPS_ST_MAX_DIMS];
	uint64_t numel;
	uint64_t begin, end; /* byte offsets from the start of the file */
};

struct dps_st_file {
	char *path;
	int fd;                       /* -1 when parsed from memory */
	uint64_t size;                /* file size */
	uint64_t data_off;            /* 8 + header length */
	int n;
	struct dps_st_tensor *t;      /* (n), sorted by name */
};

/* "F32", "BF16", "F16", "I64", "U8", "I8"; bytes per element. */
const char *dps_st_dtype_name(enum dps_st_dtype t);
size_t dps_st_dtype_size(enum dps_st_dtype t);

/*
 * Parses the JSON header hdr (len bytes) of a file whose data area, after the header, is
 * data_size bytes long. data_off is 8 + len. Offsets in the result are absolute (data_off
 * added). Returns 0, -EINVAL with a message in err, or -ENOMEM. Free with dps_st_free.
 */
int dps_st_parse_header(const char *hdr, size_t len, uint64_t data_size, struct dps_st_file *f,
			char *err, size_t errlen);

/*
 * Opens path, reads and validates its header. Returns 0 or a negative code with a message
 * in err naming the file (missing, truncated, header too large, invalid header).
 */
int dps_st_open(const char *path, struct dps_st_file *f, char *err, size_t errlen);

void dps_st_free(struct dps_st_file *f);

/* The tensor called name, or NULL. */
const struct dps_st_tensor *dps_st_find(const struct dps_st_file *f, const char *name);

/* ---- writing -------------------------------------------------------------------------- */

struct dps_st_writer_tensor {
	char name[256];
	enum dps_st_dtype dtype;
	int ndim;
	uint64_t shape[DPS_ST_MAX_DIMS];
	const float *data; /* numel F32 values, converted to dtype when written, or NULL: */
	/* then gen fills dst with elements [start, start + count) of the tensor, in chunks */
	void (*gen)(float *dst, uint64_t start, uint64_t count, void *arg);
	void *gen_arg;
	/*
	 * A U8 tensor is written as bytes, not from floats: its numel bytes, or NULL: then
	 * gen_u8 fills dst with bytes [start, start + count) of it (with gen_arg), in chunks.
	 */
	const uint8_t *bytes;
	void (*gen_u8)(uint8_t *dst, uint64_t start, uint64_t count, void *arg);
	/*
	 * Or, for a tensor of any dtype: gen_raw fills dst with bytes [start, start + count) of
	 * its data as stored (numel times the dtype's size in all), with gen_arg. 0, or a
	 * negative code that stops the writer.
	 */
	int (*gen_raw)(void *dst, uint64_t start, uint64_t count, void *arg);
};

/*
 * Writes tensors t[0..n-1] to path as one safetensors file (F32 input converted to each
 * tensor's dtype, round to nearest even; U8 tensors from bytes or gen_u8; any tensor from
 * gen_raw). Returns 0, -EINVAL (a U8 tensor with elements but neither bytes, gen_u8 nor
 * gen_raw, another one without data, gen or gen_raw; no file is written then), gen_raw's
 * code, or -errno / -ENOMEM.
 */
int dps_st_write(const char *path, const struct dps_st_writer_tensor *t, int n);


#endif

/* SPDX-License-Identifier: MIT */
/*
 * tests/check_ckpt.c - checkpoint directories and the io_uring shard loader: tensors written
 * with dps_st_write in F32, BF16 and F16 are read back whole and as shards along every
 * dimension and shard count, with zero padding where a dimension does not divide, and compared
 * with values computed independently; sharded checkpoints with an index; every bad directory
 * refused with a message; f16 conversion checked over every half value. I64 tensors (an Eagle3
 * draft's d2t): written from floats rounded to the nearest integer, the bytes on disk checked
 * as little-endian int64, and read back as floats whole, as shards and as ranges, negative
 * values and +-2^24 included.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dps.h"
#include "tests/testutil.h"
#include "engine/model/ckpt.h"
#include "engine/model/convert.h"

static char dir[64];

static void setup(void)
{
	test_tmpdir_make(dir, sizeof(dir), "ckpt");
}

static void teardown(void)
{
	test_tmpdir_remove(dir);
}

static void write_config(void)
{
	struct dps_model_config c = { .hidden_size = 8, .intermediate_size = 16,
				      .num_hidden_layers = 1, .num_attention_heads = 2,
				      .num_key_value_heads = 2, .head_dim = 4, .vocab_size = 10,
				      .rms_norm_eps = 1e-5, .rope_theta = 10000,
				      .max_position_embeddings = 64, .bos_token_id = 1,
				      .eos_token_id = 2 };
	char path[128];

	snprintf(path, sizeof(path), "%s/config.json", dir);
	ck_assert_int_eq(dps_model_config_save(&c, path), 0);
}

/* Element (i, j) of the test matrices: exact in bf16 and f16 (small integers and halves). */
static float val(uint64_t i, uint64_t j)
{
	return (float)(int)(i * 8 + j) * 0.5f - 20.0f;
}

static float w[10 * 6], b[7], h[5 * 3];

static void write_model(const char *file)
{
	struct dps_st_writer_tensor t[3] = {
		{ "w", DPS_ST_F32, 2, { 10, 6 }, w },
		{ "b", DPS_ST_BF16, 1, { 7 }, b },
		{ "h", DPS_ST_F16, 2, { 5, 3 }, h },
	};
	char path[128];

	for (int i = 0; i < 10; i++)
		for (int j = 0; j < 6; j++)
			w[i * 6 + j] = val((uint64_t)i, (uint64_t)j);
	for (int i = 0; i < 7; i++)
		b[i] = val(0, (uint64_t)i);
	for (int i = 0; i < 5; i++)
		for (int j = 0; j < 3; j++)
			h[i * 3 + j] = val((uint64_t)i, (uint64_t)j);
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	ck_assert_int_eq(dps_st_write(path, t, 3), 0);
}

/* Checks a shard against val(): rows/cols outside the tensor must be zero. */
static void check_shard(const float *got, uint64_t rows, uint64_t cols, int dim, int idx,
			int count)
{
	const uint64_t d = dim == 0 ? rows : cols;
	const uint64_t per = (d + (uint64_t)count - 1) / (uint64_t)count;
	const uint64_t srows = dim == 0 ? per : rows, scols = dim == 1 ? per : cols;

	for (uint64_t i = 0; i < srows; i++)
		for (uint64_t j = 0; j < scols; j++) {
			const uint64_t gi = dim == 0 ? per * (uint64_t)idx + i : i;
			const uint64_t gj = dim == 1 ? per * (uint64_t)idx + j : j;
			const float want = gi < rows && gj < cols ? val(gi, gj) : 0.0f;

			ck_assert_msg(got[i * scols + j] == want,
				      "dim %d shard %d/%d (%llu,%llu): %g != %g", dim, idx, count,
				      (unsigned long long)i, (unsigned long long)j,
				      (double)got[i * scols + j], (double)want);
		}
}

START_TEST(test_shards)
{
	struct dps_ckpt ck;
	float buf[128];
	char err[512];

	write_config();
	write_model("model.safetensors");
	ck_assert_msg(!dps_ckpt_open(&ck, dir, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(ck.cfg.hidden_size, 8);
	for (int count = 1; count <= 7; count++)
		for (int idx = 0; idx < count; idx++)
			for (int dim = 0; dim < 2; dim++) {
				memset(buf, 0x7f, sizeof(buf));
				ck_assert_msg(!dps_ckpt_load_shard(&ck, "w", 2, (uint64_t[]){ 10, 6 }, dim,
								   idx, count, buf, err, sizeof(err)),
					      "%s", err);
				check_shard(buf, 10, 6, dim, idx, count);
				memset(buf, 0x7f, sizeof(buf));
				ck_assert_msg(!dps_ckpt_load_shard(&ck, "h", 0, NULL, dim, idx, count, buf,
								   err, sizeof(err)), "%s", err);
				check_shard(buf, 5, 3, dim, idx, count);
			}
	ck_assert(!dps_ckpt_load_shard(&ck, "b", 1, (uint64_t[]){ 7 }, 0, 1, 2, buf, err,
				       sizeof(err)));
	for (int i = 0; i < 4; i++)
		ck_assert(buf[i] == (i + 4 < 7 ? val(0, (uint64_t)(i + 4)) : 0.0f));
	ck_assert_uint_gt(ck.bytes_read, 0);
	/* Errors: a missing tensor, a wrong shape, a bad shard request. */
	ck_assert_int_eq(dps_ckpt_load_shard(&ck, "nope", 0, NULL, 0, 0, 1, buf, err, sizeof(err)),
			 -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "'nope' is missing"));
	ck_assert_int_eq(dps_ckpt_load_shard(&ck, "w", 2, (uint64_t[]){ 6, 10 }, 0, 0, 1, buf, err,
					     sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "has shape 10x6, expected 6x10"), "%s", err);
	ck_assert_int_eq(dps_ckpt_load_shard(&ck, "w", 0, NULL, 2, 0, 1, buf, err, sizeof(err)),
			 -EINVAL);
	/* Raw bytes are read from U8 tensors only: the caller sized for one byte an element. */
	{
		unsigned char bytes[64 + 16];

		memset(bytes, 0xa5, sizeof(bytes));
		ck_assert_int_eq(dps_ckpt_load_range_raw(&ck, "w", 2, (uint64_t[]){ 10, 6 }, 0, 0,
							 10, bytes, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, "'w' is F32"), "%s", err);
		for (size_t i = 0; i < sizeof(bytes); i++)
			ck_assert_uint_eq(bytes[i], 0xa5);
	}
	dps_ckpt_close(&ck);
}
END_TEST

START_TEST(test_index)
{
	struct dps_st_writer_tensor t1[1] = { { "w", DPS_ST_F32, 2, { 10, 6 }, w } };
	struct dps_st_writer_tensor t2[1] = { { "b", DPS_ST_BF16, 1, { 7 }, b } };
	struct dps_ckpt ck;
	char path[256], err[512];
	float buf[64];
	FILE *f;

	write_config();
	write_model("unused-name-to-fill-arrays.tmp");
	snprintf(path, sizeof(path), "%s/model-00001-of-00002.safetensors", dir);
	ck_assert_int_eq(dps_st_write(path, t1, 1), 0);
	snprintf(path, sizeof(path), "%s/model-00002-of-00002.safetensors", dir);
	ck_assert_int_eq(dps_st_write(path, t2, 1), 0);
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
	f = fopen(path, "w");
	fputs("{\"metadata\":{},\"weight_map\":{\"w\":\"model-00001-of-00002.safetensors\","
	      "\"b\":\"model-00002-of-00002.safetensors\"}}", f);
	fclose(f);
	ck_assert_msg(!dps_ckpt_open(&ck, dir, err, sizeof(err)), "%s", err);
	ck_assert_int_eq(ck.n_files, 2);
	ck_assert(!dps_ckpt_load_shard(&ck, "w", 0, NULL, 1, 1, 3, buf, err, sizeof(err)));
	check_shard(buf, 10, 6, 1, 1, 3);
	dps_ckpt_close(&ck);

	/* The index names a tensor its file does not hold. */
	f = fopen(path, "w");
	fputs("{\"weight_map\":{\"w\":\"model-00002-of-00002.safetensors\"}}", f);
	fclose(f);
	ck_assert_int_lt(dps_ckpt_open(&ck, dir, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "'w' is listed in model-00002-of-00002.safetensors but not found"),
		      "%s", err);
	/* The index points outside the directory. */
	f = fopen(path, "w");
	fputs("{\"weight_map\":{\"w\":\"../model.safetensors\"}}", f);
	fclose(f);
	ck_assert_int_lt(dps_ckpt_open(&ck, dir, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "not a plain file name"), "%s", err);
	/* No weight_map. */
	f = fopen(path, "w");
	fputs("{}", f);
	fclose(f);
	ck_assert_int_lt(dps_ckpt_open(&ck, dir, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "weight_map"), "%s", err);
	/* Without an index, the same tensor in two files is refused. */
	unlink(path);
	snprintf(path, sizeof(path), "%s/model-00003.safetensors", dir);
	ck_assert_int_eq(dps_st_write(path, t1, 1), 0);
	ck_assert_int_lt(dps_ckpt_open(&ck, dir, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "appears in both"), "%s", err);
}
END_TEST

START_TEST(test_bad_dirs)
{
	struct dps_ckpt ck;
	char err[512], path[256];
	FILE *f;

	ck_assert_int_lt(dps_ckpt_open(&ck, dir, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "config.json"), "%s", err);
	write_config();
	ck_assert_int_eq(dps_ckpt_open(&ck, dir, err, sizeof(err)), -ENOENT);
	ck_assert_msg(strstr(err, "no .safetensors file"), "%s", err);
	/* A truncated data area: the header promises more bytes than the file has. */
	write_model("model.safetensors");
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	f = fopen(path, "r+");
	ck_assert_int_eq(ftruncate(fileno(f), 100), 0);
	fclose(f);
	ck_assert_int_lt(dps_ckpt_open(&ck, dir, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "model.safetensors") &&
		      (strstr(err, "outside") || strstr(err, "truncated")), "%s", err);
}
END_TEST

/* The I64 test tensor, as written (floats) and as it must be stored (integers). */
static const float i64_src[3 * 4] = { 0.0f, 1.0f, -1.0f, 7.0f,
				      -16777216.0f, 16777216.0f, 299.0f, -300.0f,
				      2.6f, -2.5f, 123456.0f, -42.4f };
static const int64_t i64_want[3 * 4] = { 0, 1, -1, 7, -16777216, 16777216, 299, -300,
					  3, -3, 123456, -42 };

START_TEST(test_i64)
{
	const float d2t[5] = { 0.0f, 3.0f, -2.0f, 250.0f, -4.0f };
	struct dps_st_writer_tensor t[3] = {
		{ "w", DPS_ST_F32, 2, { 10, 6 }, w },
		{ "ids", DPS_ST_I64, 2, { 3, 4 }, i64_src },
		{ "d2t", DPS_ST_I64, 1, { 5 }, d2t },
	};
	const struct dps_st_tensor *st;
	unsigned char raw[3 * 4 * 8];
	struct dps_ckpt ck;
	char path[128], err[512];
	float buf[64];
	int file;
	FILE *f;

	write_config();
	write_model("unused.tmp"); /* fills w */
	snprintf(path, sizeof(path), "%s/unused.tmp", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	ck_assert_int_eq(dps_st_write(path, t, 3), 0);
	ck_assert_msg(!dps_ckpt_open(&ck, dir, err, sizeof(err)), "%s", err);

	/* On disk: I64, 8 bytes an element, little-endian two's complement. */
	st = dps_ckpt_find(&ck, "ids", &file);
	ck_assert_ptr_nonnull(st);
	ck_assert_int_eq(st->dtype, DPS_ST_I64);
	ck_assert_str_eq(dps_st_dtype_name(st->dtype), "I64");
	ck_assert_uint_eq(dps_st_dtype_size(st->dtype), 8);
	ck_assert_uint_eq(st->end - st->begin, sizeof(raw));
	f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fseek(f, (long)st->begin, SEEK_SET), 0);
	ck_assert_uint_eq(fread(raw, 1, sizeof(raw), f), sizeof(raw));
	fclose(f);
	for (int i = 0; i < 12; i++) {
		uint64_t u = 0;

		for (int k = 7; k >= 0; k--)
			u = u << 8 | raw[i * 8 + k];
		ck_assert_msg((int64_t)u == i64_want[i], "element %d stored as %lld, want %lld", i,
			      (long long)(int64_t)u, (long long)i64_want[i]);
	}

	/* Whole. */
	memset(buf, 0x7f, sizeof(buf));
	ck_assert_msg(!dps_ckpt_load_shard(&ck, "ids", 2, (uint64_t[]){ 3, 4 }, 0, 0, 1, buf, err,
					   sizeof(err)), "%s", err);
	for (int i = 0; i < 12; i++)
		ck_assert_msg(buf[i] == (float)i64_want[i], "element %d: %g", i, (double)buf[i]);
	/* Shards along dimension 1 (2 columns each of 3: the last one all padding) and 0. */
	for (int idx = 0; idx < 3; idx++) {
		memset(buf, 0x7f, sizeof(buf));
		ck_assert_msg(!dps_ckpt_load_shard(&ck, "ids", 0, NULL, 1, idx, 3, buf, err,
						   sizeof(err)), "%s", err);
		for (int r = 0; r < 3; r++)
			for (int j = 0; j < 2; j++) {
				const int col = idx * 2 + j;
				const float want = col < 4 ? (float)i64_want[r * 4 + col] : 0.0f;

				ck_assert_msg(buf[r * 2 + j] == want, "shard %d (%d,%d): %g != %g", idx,
					      r, j, (double)buf[r * 2 + j], (double)want);
			}
	}
	memset(buf, 0x7f, sizeof(buf));
	ck_assert(!dps_ckpt_load_shard(&ck, "ids", 0, NULL, 0, 1, 2, buf, err, sizeof(err)));
	for (int j = 0; j < 8; j++)
		ck_assert(buf[j] == (j < 4 ? (float)i64_want[8 + j] : 0.0f));
	/* Ranges: columns 1..2, then column 3 and one past the end. */
	memset(buf, 0x7f, sizeof(buf));
	ck_assert_msg(!dps_ckpt_load_range(&ck, "ids", 2, (uint64_t[]){ 3, 4 }, 1, 1, 2, buf, err,
					   sizeof(err)), "%s", err);
	for (int r = 0; r < 3; r++)
		for (int j = 0; j < 2; j++)
			ck_assert(buf[r * 2 + j] == (float)i64_want[r * 4 + 1 + j]);
	memset(buf, 0x7f, sizeof(buf));
	ck_assert(!dps_ckpt_load_range(&ck, "ids", 0, NULL, 1, 3, 2, buf, err, sizeof(err)));
	for (int r = 0; r < 3; r++) {
		ck_assert(buf[r * 2] == (float)i64_want[r * 4 + 3]);
		ck_assert(buf[r * 2 + 1] == 0.0f);
	}
	/* A 1-D offsets table, and the F32 tensor before it in the same file, unaffected. */
	memset(buf, 0x7f, sizeof(buf));
	ck_assert(!dps_ckpt_load_shard(&ck, "d2t", 1, (uint64_t[]){ 5 }, 0, 0, 1, buf, err,
				       sizeof(err)));
	for (int i = 0; i < 5; i++)
		ck_assert(buf[i] == d2t[i]);
	ck_assert(!dps_ckpt_load_range(&ck, "d2t", 0, NULL, 0, 2, 2, buf, err, sizeof(err)));
	ck_assert(buf[0] == -2.0f && buf[1] == 250.0f);
	ck_assert(!dps_ckpt_load_shard(&ck, "w", 0, NULL, 0, 0, 1, buf, err, sizeof(err)));
	check_shard(buf, 10, 6, 0, 0, 1);
	dps_ckpt_close(&ck);
}
END_TEST

START_TEST(test_convert_bad_header)
{
	/* A llama2.c header whose vocab field is INT32_MIN (a negated size that cannot be). */
	int32_t hdr[7] = { 8, 16, 1, 2, 2, INT32_MIN, 4 };
	char path[128], out[128], err[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/bad.bin", dir);
	snprintf(out, sizeof(out), "%s/out", dir);
	f = fopen(path, "wb");
	fwrite(hdr, sizeof(hdr), 1, f);
	fclose(f);
	ck_assert_int_lt(dps_convert_llama2c(path, NULL, out, DPS_ST_F32, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "implausible header"), "%s", err);
}
END_TEST

START_TEST(test_f16)
{
	/* Every non-NaN half survives f16 -> f32 -> f16. */
	for (uint32_t u = 0; u < 0x10000; u++) {
		const float f = dps_f16_to_f32((uint16_t)u);

		if (isnan(f))
			continue;
		ck_assert_uint_eq(dps_f32_to_f16(f), u);
	}
	/* f32 -> f16 is the nearest half (ties to even), checked in double precision. */
	for (uint32_t k = 0; k < 2000000; k++) {
		uint32_t bits = k * 2654435761u;
		float f;
		uint16_t hh;
		double e, lo, hi;

		memcpy(&f, &bits, 4);
		if (!isfinite(f) || fabsf(f) > 65504.0f)
			continue;
		hh = dps_f32_to_f16(f);
		e = fabs((double)dps_f16_to_f32(hh) - (double)f);
		lo = fabs((double)dps_f16_to_f32((uint16_t)(hh - 1)) - (double)f);
		hi = fabs((double)dps_f16_to_f32((uint16_t)(hh + 1)) - (double)f);
		if ((hh & 0x7fff) != 0 && (hh & 0x7c00) != 0x7c00)
			ck_assert_msg(e <= lo && e <= hi, "%a -> %04x", (double)f, hh);
	}
	ck_assert_uint_eq(dps_f32_to_f16(1.0f), 0x3c00);
	ck_assert_uint_eq(dps_f32_to_f16(65520.0f), 0x7c00); /* rounds to inf */
	ck_assert_uint_eq(dps_f32_to_f16(5.96046448e-8f), 0x0001);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("ckpt");
	TCase *tc = tcase_create("ckpt");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_shards);
	tcase_add_test(tc, test_index);
	tcase_add_test(tc, test_bad_dirs);
	tcase_add_test(tc, test_f16);
	tcase_add_test(tc, test_convert_bad_header);
	tcase_add_test(tc, test_i64);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

/* SPDX-License-Identifier: MIT */
/*
 * tests/check_safetensors.c - the safetensors header parser and file opener: a valid file
 * with F32, BF16 and F16 tensors, one with I64 tensors (8 bytes an element), one with U8 tensors
 * (1 byte an element, MXFP4's blocks and scales), U8 tensors written from bytes and from a
 * byte generator and read back, then every kind of bad file (missing, truncated, header
 * longer than the file or than the limit, malformed JSON, wrong types, unsupported dtype,
 * shapes that overflow, offsets reversed or outside the data, sizes that disagree with the
 * shape, overlapping tensors, duplicate names), each refused with a message naming the file
 * and the problem.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dps.h"
#include "tests/testutil.h"
#include "engine/model/safetensors.h"

static char dir[64];

static void setup(void)
{
	test_tmpdir_make(dir, sizeof(dir), "st");
}

static void teardown(void)
{
	test_tmpdir_remove(dir);
}

/* Writes a file: 8-byte length of hdr (or hlen_override when not ~0), hdr, data_len bytes. */
static const char *write_file(const char *name, const char *hdr, uint64_t hlen_override,
			      size_t data_len)
{
	static char path[128];
	uint64_t hlen = hlen_override != ~0ull ? hlen_override : strlen(hdr);
	unsigned char lenb[8];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	for (int i = 0; i < 8; i++)
		lenb[i] = (unsigned char)(hlen >> (8 * i));
	fwrite(lenb, 1, 8, f);
	fwrite(hdr, 1, strlen(hdr), f);
	for (size_t i = 0; i < data_len; i++)
		fputc((int)(i & 0xff), f);
	fclose(f);
	return path;
}

START_TEST(test_valid)
{
	const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
			  "\"b.weight\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
			  "\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
			  "\"c\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[32,36]}}";
	const char *path = write_file("ok.safetensors", hdr, ~0ull, 36);
	const struct dps_st_tensor *t;
	struct dps_st_file f;
	char err[256];

	ck_assert_msg(dps_st_open(path, &f, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(f.n, 3);
	ck_assert_uint_eq(f.data_off, 8 + strlen(hdr));
	t = dps_st_find(&f, "a.weight");
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(t->dtype, DPS_ST_F32);
	ck_assert_int_eq(t->ndim, 2);
	ck_assert_uint_eq(t->shape[0], 2);
	ck_assert_uint_eq(t->shape[1], 3);
	ck_assert_uint_eq(t->numel, 6);
	ck_assert_uint_eq(t->begin, f.data_off);
	ck_assert_uint_eq(t->end, f.data_off + 24);
	t = dps_st_find(&f, "b.weight");
	ck_assert_int_eq(t->dtype, DPS_ST_BF16);
	ck_assert_uint_eq(t->begin, f.data_off + 24);
	ck_assert_int_eq(dps_st_find(&f, "c")->dtype, DPS_ST_F16);
	ck_assert_ptr_null(dps_st_find(&f, "missing"));
	ck_assert_int_ge(f.fd, 0);
	dps_st_free(&f);
}
END_TEST

struct bad {
	const char *hdr;
	uint64_t hlen;   /* ~0 = the real length */
	size_t data;
	const char *want; /* substring of the message */
};

static const struct bad bad_cases[] = {
	{ "{", ~0ull, 0, "not valid JSON" },
	{ "[1,2]", ~0ull, 0, "not a JSON object" },
	{ "{\"a\":5}", ~0ull, 0, "not an object" },
	{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", ~0ull, 4, "data_offsets" },
	{ "{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", ~0ull, 4,
	  "unsupported dtype" },
	{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", ~0ull, 4, "shape" },
	{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
	  "\"data_offsets\":[0,4]}}", ~0ull, 4, "shape" },
	{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", ~0ull,
	  4, "dimensions" },
	{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", ~0ull, 4, "outside" },
	{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", ~0ull, 4, "outside" },
	{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", ~0ull, 8,
	  "needs 12 bytes" },
	{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", ~0ull, 12, "overlap" },
	{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
	  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", ~0ull, 8, "JSON" },
	{ "{\"__metadata__\":3}", ~0ull, 0, "__metadata__" },
	{ "{}", 1000, 0, "truncated" },
	{ "{}", (uint64_t)DPS_ST_MAX_HEADER + 1, 0, "exceeds the limit" },
	{ "{}", ~0ull >> 1, 0, "exceeds the limit" },
	/* I64 is 8 bytes an element, not 4. */
	{ "{\"a\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,8]}}", ~0ull, 8,
	  "I64 x 2 elements needs 16 bytes but data_offsets give 8" },
	{ "{\"a\":{\"dtype\":\"i64\",\"shape\":[1],\"data_offsets\":[0,8]}}", ~0ull, 8,
	  "unsupported dtype 'i64'" },
	{ "{\"a\":{\"dtype\":\"U64\",\"shape\":[1],\"data_offsets\":[0,8]}}", ~0ull, 8,
	  "unsupported dtype 'U64'" },
	/* U8 is 1 byte an element. */
	{ "{\"a\":{\"dtype\":\"U8\",\"shape\":[2,16],\"data_offsets\":[0,64]}}", ~0ull, 64,
	  "U8 x 32 elements needs 32 bytes but data_offsets give 64" },
	{ "{\"a\":{\"dtype\":\"u8\",\"shape\":[1],\"data_offsets\":[0,1]}}", ~0ull, 1,
	  "unsupported dtype 'u8'" },
	{ "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
	  "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}", ~0ull, 5, "overlap" },
};

START_TEST(test_bad)
{
	const struct bad *b = &bad_cases[_i];
	const char *path = write_file("bad.safetensors", b->hdr, b->hlen, b->data);
	struct dps_st_file f;
	char err[512] = "";

	ck_assert_int_lt(dps_st_open(path, &f, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "bad.safetensors"), "case %d: no file name in '%s'", _i, err);
	ck_assert_msg(strstr(err, b->want), "case %d: '%s' lacks '%s'", _i, err, b->want);
}
END_TEST

START_TEST(test_i64)
{
	const char *hdr = "{\"d2t\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[8,32]},"
			  "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			  "\"m\":{\"dtype\":\"I64\",\"shape\":[2,2],\"data_offsets\":[32,64]}}";
	const char *path = write_file("i64.safetensors", hdr, ~0ull, 64);
	const struct dps_st_tensor *t;
	struct dps_st_file f;
	char err[256];

	ck_assert_str_eq(dps_st_dtype_name(DPS_ST_I64), "I64");
	ck_assert_uint_eq(dps_st_dtype_size(DPS_ST_I64), 8);
	ck_assert_msg(dps_st_open(path, &f, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(f.n, 3);
	t = dps_st_find(&f, "d2t");
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(t->dtype, DPS_ST_I64);
	ck_assert_int_eq(t->ndim, 1);
	ck_assert_uint_eq(t->numel, 3);
	ck_assert_uint_eq(t->begin, f.data_off + 8);
	ck_assert_uint_eq(t->end, f.data_off + 32);
	t = dps_st_find(&f, "m");
	ck_assert_int_eq(t->dtype, DPS_ST_I64);
	ck_assert_uint_eq(t->numel, 4);
	ck_assert_uint_eq(t->end - t->begin, 32);
	ck_assert_int_eq(dps_st_find(&f, "w")->dtype, DPS_ST_F32);
	dps_st_free(&f);
}
END_TEST

START_TEST(test_u8)
{
	/* GPT-OSS's layout: blocks (E, rows, k / 32, 16) and scales (E, rows, k / 32), U8. */
	const char *hdr = "{\"m.blocks\":{\"dtype\":\"U8\",\"shape\":[2,3,1,16],"
			  "\"data_offsets\":[8,104]},"
			  "\"m.scales\":{\"dtype\":\"U8\",\"shape\":[2,3,1],\"data_offsets\":[104,110]},"
			  "\"m.bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
	const char *path = write_file("u8.safetensors", hdr, ~0ull, 110);
	const struct dps_st_tensor *t;
	struct dps_st_file f;
	char err[256];

	ck_assert_str_eq(dps_st_dtype_name(DPS_ST_U8), "U8");
	ck_assert_uint_eq(dps_st_dtype_size(DPS_ST_U8), 1);
	ck_assert_msg(dps_st_open(path, &f, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(f.n, 3);
	t = dps_st_find(&f, "m.blocks");
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(t->dtype, DPS_ST_U8);
	ck_assert_int_eq(t->ndim, 4);
	ck_assert_uint_eq(t->shape[3], 16);
	ck_assert_uint_eq(t->numel, 96);
	ck_assert_uint_eq(t->begin, f.data_off + 8);
	ck_assert_uint_eq(t->end, f.data_off + 104);
	t = dps_st_find(&f, "m.scales");
	ck_assert_int_eq(t->dtype, DPS_ST_U8);
	ck_assert_uint_eq(t->numel, 6);
	ck_assert_uint_eq(t->end - t->begin, 6);
	ck_assert_int_eq(dps_st_find(&f, "m.bias")->dtype, DPS_ST_F32);
	dps_st_free(&f);
}
END_TEST

/* Byte i of a generated U8 tensor. */
static uint8_t gen_byte(uint64_t i)
{
	return (uint8_t)(i * 37 + (i >> 8) + 5);
}

static void gen_bytes(uint8_t *dst, uint64_t start, uint64_t count, void *arg)
{
	(*(int *)arg)++;
	for (uint64_t i = 0; i < count; i++)
		dst[i] = gen_byte(start + i);
}

START_TEST(test_write_u8)
{
	/* A U8 tensor from bytes, one from the generator (larger than the writer's chunk), and an
	 * F32 one between them: read back byte for byte at the offsets of the header. */
	enum { NB = 200000 };
	static const uint8_t given[5] = { 0, 1, 0x7f, 0x80, 0xff };
	const float w[3] = { 1.5f, -2.0f, 0.25f };
	struct dps_st_writer_tensor t[3];
	const struct dps_st_tensor *s;
	struct dps_st_file f;
	char path[128], err[256];
	uint8_t *back;
	float wb[3];
	int calls = 0;

	memset(t, 0, sizeof(t));
	snprintf(t[0].name, sizeof(t[0].name), "given");
	t[0].dtype = DPS_ST_U8;
	t[0].ndim = 1;
	t[0].shape[0] = 5;
	t[0].bytes = given;
	snprintf(t[1].name, sizeof(t[1].name), "w");
	t[1].dtype = DPS_ST_F32;
	t[1].ndim = 1;
	t[1].shape[0] = 3;
	t[1].data = w;
	snprintf(t[2].name, sizeof(t[2].name), "made");
	t[2].dtype = DPS_ST_U8;
	t[2].ndim = 3;
	t[2].shape[0] = 2;
	t[2].shape[1] = NB / 2 / 16;
	t[2].shape[2] = 16;
	t[2].gen_u8 = gen_bytes;
	t[2].gen_arg = &calls;
	snprintf(path, sizeof(path), "%s/w.safetensors", dir);
	ck_assert_int_eq(dps_st_write(path, t, 3), 0);
	ck_assert_int_gt(calls, 1); /* in chunks */
	ck_assert_msg(dps_st_open(path, &f, err, sizeof(err)) == 0, "%s", err);
	s = dps_st_find(&f, "given");
	ck_assert_int_eq(s->dtype, DPS_ST_U8);
	back = malloc(NB);
	ck_assert_ptr_nonnull(back);
	ck_assert_int_eq(pread(f.fd, back, 5, (off_t)s->begin), 5);
	ck_assert(!memcmp(back, given, 5));
	s = dps_st_find(&f, "w");
	ck_assert_int_eq(pread(f.fd, wb, sizeof(wb), (off_t)s->begin), (ssize_t)sizeof(wb));
	ck_assert(!memcmp(wb, w, sizeof(w)));
	s = dps_st_find(&f, "made");
	ck_assert_int_eq(s->dtype, DPS_ST_U8);
	ck_assert_uint_eq(s->numel, NB);
	ck_assert_int_eq(pread(f.fd, back, NB, (off_t)s->begin), NB);
	for (uint64_t i = 0; i < NB; i++)
		ck_assert_msg(back[i] == gen_byte(i), "byte %llu is %u, want %u",
			      (unsigned long long)i, back[i], gen_byte(i));
	free(back);
	dps_st_free(&f);
	/* A U8 tensor with neither bytes nor a generator: refused before anything is written. */
	t[0].bytes = NULL;
	snprintf(path, sizeof(path), "%s/none.safetensors", dir);
	ck_assert_int_eq(dps_st_write(path, t, 3), -EINVAL);
	ck_assert_int_ne(access(path, F_OK), 0);
}
END_TEST

START_TEST(test_empty_tensor_any_order)
{
	/* An empty tensor at the offset of a non-empty one occupies no bytes, in either order. */
	const char *hdrs[2] = {
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		"\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}",
		"{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
		"\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
	};
	for (int i = 0; i < 2; i++) {
		struct dps_st_file f;
		char err[256];

		ck_assert_msg(!dps_st_parse_header(hdrs[i], strlen(hdrs[i]), 8, &f, err, sizeof(err)),
			      "order %d: %s", i, err);
		ck_assert_int_eq(f.n, 2);
		dps_st_free(&f);
	}
}
END_TEST

START_TEST(test_missing_and_tiny)
{
	struct dps_st_file f;
	char err[512], path[128];
	FILE *fp;

	snprintf(path, sizeof(path), "%s/none.safetensors", dir);
	ck_assert_int_eq(dps_st_open(path, &f, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "none.safetensors"));
	snprintf(path, sizeof(path), "%s/tiny.safetensors", dir);
	fp = fopen(path, "wb");
	fwrite("abc", 1, 3, fp);
	fclose(fp);
	ck_assert_int_lt(dps_st_open(path, &f, err, sizeof(err)), 0);
	ck_assert_ptr_nonnull(strstr(err, "truncated"));
}
END_TEST

START_TEST(test_checker_can_fail)
{
	/* The test above would catch a parser that accepts an overlap: prove it by asking the
	 * message for a word it does not contain. */
	const char *path = write_file("x.safetensors", bad_cases[11].hdr, ~0ull, 12);
	struct dps_st_file f;
	char err[512] = "";

	ck_assert_int_lt(dps_st_open(path, &f, err, sizeof(err)), 0);
	ck_assert_ptr_null(strstr(err, "unsupported dtype"));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("safetensors");
	TCase *tc = tcase_create("safetensors");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_valid);
	tcase_add_test(tc, test_i64);
	tcase_add_test(tc, test_u8);
	tcase_add_test(tc, test_write_u8);
	tcase_add_loop_test(tc, test_bad, 0, (int)(sizeof(bad_cases) / sizeof(bad_cases[0])));
	tcase_add_test(tc, test_missing_and_tiny);
	tcase_add_test(tc, test_empty_tensor_any_order);
	tcase_add_test(tc, test_checker_can_fail);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

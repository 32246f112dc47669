/* SPDX-License-Identifier: MIT */
/*
 * engine/model/safetensors.c - the safetensors format (see safetensors.h): header parsing and
 * validation, run once per checkpoint file at load time (every field comes from outside and
 * is checked before it is used, every size computation is overflow-checked); the f16 and bf16
 * conversions; and the writer mkmodel and convert use.
 */
#include <fcntl.h>
#include <math.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/model/safetensors.h"

const char *dps_st_dtype_name(enum dps_st_dtype t)
{
	switch (t) {
	case DPS_ST_F32: return "F32";
	case DPS_ST_BF16: return "BF16";
	case DPS_ST_F16: return "F16";
	case DPS_ST_I64: return "I64";
	case DPS_ST_U8: return "U8";
	case DPS_ST_I8: return "I8";
	}
	return "?";
}

size_t dps_st_dtype_size(enum dps_st_dtype t)
{
	switch (t) {
	case DPS_ST_I64: return 8;
	case DPS_ST_F32: return 4;
	case DPS_ST_BF16:
	case DPS_ST_F16: return 2;
	case DPS_ST_U8:
	case DPS_ST_I8: return 1;
	}
	return 0;
}

static int parse_dtype(const char *s, enum dps_st_dtype *t)
{
	if (!strcmp(s, "F32"))
		*t = DPS_ST_F32;
	else if (!strcmp(s, "BF16"))
		*t = DPS_ST_BF16;
	else if (!strcmp(s, "F16"))
		*t = DPS_ST_F16;
	else if (!strcmp(s, "I64"))
		*t = DPS_ST_I64;
	else if (!strcmp(s, "U8"))
		*t = DPS_ST_U8;
	else if (!strcmp(s, "I8"))
		*t = DPS_ST_I8;
	else
		return -EINVAL;
	return 0;
}

static int cmp_begin(const void *a, const void *b)
{
	const struct dps_st_tensor *x = *(const struct dps_st_tensor *const *)a;
	const struct dps_st_tensor *y = *(const struct dps_st_tensor *const *)b;

	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(((const struct dps_st_tensor *)a)->name,
		      ((const struct dps_st_tensor *)b)->name);
}

/* Reads a non-negative JSON integer. */
static int json_u64(const json_t *v, uint64_t *out)
{
	json_int_t i;

	if (!json_is_integer(v))
		return -EINVAL;
	i = json_integer_value(v);
	if (i < 0)
		return -EINVAL;
	*out = (uint64_t)i;
	return 0;
}

static int parse_tensor(const char *name, const json_t *v, uint64_t data_off, uint64_t data_size,
			struct dps_st_tensor *t, char *err, size_t errlen)
{
	const json_t *dt, *shape, *offs;
	uint64_t bytes, b, e;
	size_t i;

	if (!json_is_object(v)) {
		snprintf(err, errlen, "tensor '%s': entry is not an object", name);
		return -EINVAL;
	}
	dt = json_object_get(v, "dtype");
	shape = json_object_get(v, "shape");
	offs = json_object_get(v, "data_offsets");
	if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs)) {
		snprintf(err, errlen, "tensor '%s': needs string dtype, array shape and array data_offsets",
			 name);
		return -EINVAL;
	}
	if (parse_dtype(json_string_value(dt), &t->dtype)) {
		snprintf(err, errlen, "tensor '%s': unsupported dtype '%.16s' (F32, BF16, F16, I64 and "
			 "U8 are)",
			 name, json_string_value(dt));
		return -EINVAL;
	}
	if (json_array_size(shape) > DPS_ST_MAX_DIMS) {
		snprintf(err, errlen, "tensor '%s': %zu dimensions, at most %d supported", name,
			 json_array_size(shape), DPS_ST_MAX_DIMS);
		return -EINVAL;
	}
	t->ndim = (int)json_array_size(shape);
	t->numel = 1;
	for (i = 0; i < json_array_size(shape); i++) {
		if (json_u64(json_array_get(shape, i), &t->shape[i]) ||
		    __builtin_mul_overflow(t->numel, t->shape[i], &t->numel)) {
			snprintf(err, errlen, "tensor '%s': shape entry %zu is not a valid size", name, i);
			return -EINVAL;
		}
	}
	if (json_array_size(offs) != 2 || json_u64(json_array_get(offs, 0), &b) ||
	    json_u64(json_array_get(offs, 1), &e)) {
		snprintf(err, errlen, "tensor '%s': data_offsets must be two non-negative integers", name);
		return -EINVAL;
	}
	if (b > e || e > data_size) {
		snprintf(err, errlen,
			 "tensor '%s': data_offsets [%llu, %llu] lie outside the %llu bytes of data",
			 name, (unsigned long long)b, (unsigned long long)e,
			 (unsigned long long)data_size);
		return -EINVAL;
	}
	if (__builtin_mul_overflow(t->numel, (uint64_t)dps_st_dtype_size(t->dtype), &bytes) ||
	    bytes != e - b) {
		snprintf(err, errlen,
			 "tensor '%s': %s x %llu elements needs %llu bytes but data_offsets give %llu",
			 name, dps_st_dtype_name(t->dtype), (unsigned long long)t->numel,
			 (unsigned long long)(t->numel * dps_st_dtype_size(t->dtype)),
			 (unsigned long long)(e - b));
		return -EINVAL;
	}
	t->begin = data_off + b;
	t->end = data_off + e;
	t->name = strdup(name);
	return t->name ? 0 : -ENOMEM;
}

int dps_st_parse_header(const char *hdr, size_t len, uint64_t data_size, struct dps_st_file *f,
			char *err, size_t errlen)
{
	struct dps_st_tensor **order = NULL;
	const char *name;
	json_error_t jerr;
	json_t *root, *v;
	size_t n = 0;
	int rc = 0, i;

	memset(f, 0, sizeof(*f));
	f->fd = -1;
	f->data_off = 8 + (uint64_t)len;
	if (len > DPS_ST_MAX_HEADER) {
		snprintf(err, errlen, "header of %zu bytes exceeds the limit of %u", len,
			 DPS_ST_MAX_HEADER);
		return -EINVAL;
	}
	root = json_loadb(hdr, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		snprintf(err, errlen, "header is not valid JSON: %s (line %d, column %d)", jerr.text,
			 jerr.line, jerr.column);
		return -EINVAL;
	}
	if (!json_is_object(root)) {
		snprintf(err, errlen, "header is not a JSON object");
		rc = -EINVAL;
		goto out;
	}
	f->t = calloc(json_object_size(root) + 1, sizeof(*f->t));
	if (!f->t) {
		rc = -ENOMEM;
		goto out;
	}
	json_object_foreach(root, name, v) {
		if (!strcmp(name, "__metadata__")) {
			if (!json_is_object(v)) {
				snprintf(err, errlen, "__metadata__ is not an object");
				rc = -EINVAL;
				goto out;
			}
			continue;
		}
		if (!name[0] || strlen(name) > 4096) {
			snprintf(err, errlen, "a tensor name is empty or too long");
			rc = -EINVAL;
			goto out;
		}
		rc = parse_tensor(name, v, f->data_off, data_size, &f->t[n], err, errlen);
		if (rc)
			goto out;
		n++;
		f->n = (int)n;
	}
	/* No two tensors may share bytes. */
	order = malloc(sizeof(*order) * (n + 1));
	if (!order) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t j = 0; j < n; j++)
		order[j] = &f->t[j];
	qsort(order, n, sizeof(*order), cmp_begin);
	{
		/* Against the furthest end so far; empty tensors occupy no bytes. */
		const struct dps_st_tensor *last = NULL;

		for (size_t j = 0; j < n; j++) {
			if (order[j]->begin == order[j]->end)
				continue;
			if (last && order[j]->begin < last->end) {
				snprintf(err, errlen, "tensors '%s' and '%s' overlap", last->name,
					 order[j]->name);
				rc = -EINVAL;
				goto out;
			}
			if (!last || order[j]->end > last->end)
				last = order[j];
		}
	}
	qsort(f->t, n, sizeof(*f->t), cmp_name);
out:
	free(order);
	json_decref(root);
	if (rc) {
		for (i = 0; i < f->n; i++)
			free(f->t[i].name);
		free(f->t);
		f->t = NULL;
		f->n = 0;
	}
	return rc;
}

int dps_st_open(const char *path, struct dps_st_file *f, char *err, size_t errlen)
{
	unsigned char lenbuf[8];
	char *hdr = NULL, msg[400];
	uint64_t hlen = 0;
	struct stat st;
	int fd, rc;

	memset(f, 0, sizeof(*f));
	f->fd = -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return rc;
	}
	if (fstat(fd, &st) || st.st_size < 8) {
		snprintf(err, errlen, "%s: truncated: %lld bytes, not even a header length", path,
			 (long long)st.st_size);
		rc = -EINVAL;
		goto err;
	}
	if (pread(fd, lenbuf, 8, 0) != 8) {
		rc = -EIO;
		snprintf(err, errlen, "%s: cannot read the header length", path);
		goto err;
	}
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | lenbuf[i];
	if (hlen > DPS_ST_MAX_HEADER) {
		snprintf(err, errlen, "%s: header length %llu exceeds the limit of %u bytes", path,
			 (unsigned long long)hlen, DPS_ST_MAX_HEADER);
		rc = -EINVAL;
		goto err;
	}
	if (hlen > (uint64_t)st.st_size - 8) {
		snprintf(err, errlen, "%s: truncated: header of %llu bytes but the file has %lld",
			 path, (unsigned long long)hlen, (long long)st.st_size);
		rc = -EINVAL;
		goto err;
	}
	hdr = malloc(hlen + 1);
	if (!hdr) {
		rc = -ENOMEM;
		goto err;
	}
	if (pread(fd, hdr, hlen, 8) != (ssize_t)hlen) {
		rc = -EIO;
		snprintf(err, errlen, "%s: cannot read the header", path);
		goto err;
	}
	rc = dps_st_parse_header(hdr, hlen, (uint64_t)st.st_size - 8 - hlen, f, msg, sizeof(msg));
	if (rc) {
		snprintf(err, errlen, "%s: %s", path, msg);
		goto err;
	}
	free(hdr);
	f->fd = fd;
	f->size = (uint64_t)st.st_size;
	f->path = strdup(path);
	if (!f->path) {
		dps_st_free(f);
		return -ENOMEM;
	}
	return 0;
err:
	free(hdr);
	close(fd);
	return rc;
}

void dps_st_free(struct dps_st_file *f)
{
	for (int i = 0; i < f->n; i++)
		free(f->t[i].name);
	free(f->t);
	free(f->path);
	if (f->fd >= 0)
		close(f->fd);
	memset(f, 0, sizeof(*f));
	f->fd = -1;
}

const struct dps_st_tensor *dps_st_find(const struct dps_st_file *f, const char *name)
{
	struct dps_st_tensor key = { .name = (char *)name };

	if (!f->n)
		return NULL;
	return bsearch(&key, f->t, (size_t)f->n, sizeof(*f->t), cmp_name);
}

/* ---- the writer ----------------------------------------------------------------------------- */

static uint16_t to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

int dps_st_write(const char *path, const struct dps_st_writer_tensor *t, int n)
{
	json_t *root = json_object();
	uint64_t off = 0;
	char *hdr = NULL;
	size_t hlen, padded;
	FILE *f = NULL;
	int rc = 0;

	if (!root)
		return -ENOMEM;
	/* Every tensor with elements has its source before anything is written. */
	for (int i = 0; i < n; i++) {
		uint64_t numel = 1;

		for (int k = 0; k < t[i].ndim; k++)
			numel *= t[i].shape[k];
		if (numel && !t[i].gen_raw &&
		    (t[i].dtype == DPS_ST_U8 ? !t[i].bytes && !t[i].gen_u8
					     : t[i].dtype == DPS_ST_I8 || (!t[i].data && !t[i].gen))) {
			rc = -EINVAL;
			goto out;
		}
	}
	for (int i = 0; i < n; i++) {
		uint64_t numel = 1, bytes;
		json_t *shape = json_array(), *e;

		for (int k = 0; k < t[i].ndim; k++) {
			numel *= t[i].shape[k];
			json_array_append_new(shape, json_integer((json_int_t)t[i].shape[k]));
		}
		bytes = numel * dps_st_dtype_size(t[i].dtype);
		e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", dps_st_dtype_name(t[i].dtype), "shape",
			      shape, "data_offsets", (json_int_t)off, (json_int_t)(off + bytes));
		if (!e || json_object_set_new(root, t[i].name, e)) {
			rc = -ENOMEM;
			goto out;
		}
		off += bytes;
	}
	hdr = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
	if (!hdr) {
		rc = -ENOMEM;
		goto out;
	}
	hlen = strlen(hdr);
	padded = dps_align_up(hlen, 8); /* the data area starts 8-byte aligned */
	f = fopen(path, "wb");
	if (!f) {
		rc = -errno;
		goto out;
	}
	{
		unsigned char lenb[8];

		for (int i = 0; i < 8; i++)
			lenb[i] = (unsigned char)((uint64_t)padded >> (8 * i));
		fwrite(lenb, 1, 8, f);
		fwrite(hdr, 1, hlen, f);
		for (size_t i = hlen; i < padded; i++)
			fputc(' ', f);
	}
	/* Data in the order of the offsets assigned above (input order), in chunks. */
	{
		enum { CHUNK = 1 << 16 };
		float *fbuf = malloc(CHUNK * sizeof(float));
		uint16_t *hbuf = malloc(CHUNK * sizeof(uint16_t));
		uint8_t *bbuf = malloc(CHUNK);

		if (!fbuf || !hbuf || !bbuf) {
			free(fbuf);
			free(hbuf);
			free(bbuf);
			rc = -ENOMEM;
			goto out;
		}
		for (int i = 0; i < n && !rc; i++) {
			uint64_t numel = 1;

			for (int k = 0; k < t[i].ndim; k++)
				numel *= t[i].shape[k];
			if (t[i].gen_raw) {
				const uint64_t total = numel * dps_st_dtype_size(t[i].dtype);

				for (uint64_t j = 0; j < total && !rc; j += CHUNK) {
					const uint64_t m = total - j < CHUNK ? total - j : CHUNK;

					rc = t[i].gen_raw(bbuf, j, m, t[i].gen_arg);
					if (!rc && fwrite(bbuf, 1, m, f) != m)
						rc = -EIO;
				}
				continue;
			}
			for (uint64_t j = 0; j < numel; j += CHUNK) {
				const uint64_t m = numel - j < CHUNK ? numel - j : CHUNK;
				const float *src = t[i].data ? t[i].data + j : fbuf;

				if (t[i].dtype == DPS_ST_U8) {
					const uint8_t *b = t[i].bytes ? t[i].bytes + j : bbuf;

					if (!t[i].bytes)
						t[i].gen_u8(bbuf, j, m, t[i].gen_arg);
					if (fwrite(b, 1, m, f) != m) {
						rc = -EIO;
						break;
					}
					continue;
				}
				if (!t[i].data)
					t[i].gen(fbuf, j, m, t[i].gen_arg);
				if (t[i].dtype == DPS_ST_F32) {
					if (fwrite(src, 4, m, f) != m) {
						rc = -EIO;
						break;
					}
					continue;
				}
				if (t[i].dtype == DPS_ST_I64) {
					for (uint64_t q = 0; q < m && !rc; q++) {
						const int64_t v = (int64_t)llroundf(src[q]);

						if (fwrite(&v, 8, 1, f) != 1)
							rc = -EIO;
					}
					if (rc)
						break;
					continue;
				}
				for (uint64_t q = 0; q < m; q++)
					hbuf[q] = t[i].dtype == DPS_ST_BF16 ? to_bf16(src[q])
									    : dps_f32_to_f16(src[q]);
				if (fwrite(hbuf, 2, m, f) != m) {
					rc = -EIO; /* a full disk: stop, do not generate the rest */
					break;
				}
			}
		}
		free(fbuf);
		free(hbuf);
		free(bbuf);
	}
	if (ferror(f))
		rc = -EIO;
out:
	if (f && fclose(f) && !rc)
		rc = -EIO;
	free(hdr);
	json_decref(root);
	return rc;
}

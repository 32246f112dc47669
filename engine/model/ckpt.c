/* SPDX-License-Identifier: MIT */
/*
 * engine/model/ckpt.c - checkpoint directories and the io_uring shard loader (see ckpt.h).
 * Runs at load time in every rank (each reads only its own shards) and in mkmodel/convert.
 */
#include <dirent.h>
#include <math.h>
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "common/bf16.h"
#include "common/dps.h"
#include "engine/model/ckpt.h"

#define QUEUE_DEPTH 64
#define MAX_READ (64u << 20) /* bytes per read request */
#define PIECE (4u << 20)     /* a large contiguous range is read as pieces of this, in parallel */

/* ---- opening -------------------------------------------------------------------------------- */

static int add_file(struct dps_ckpt *ck, const char *name, char *err, size_t errlen)
{
	struct dps_st_file *nf;
	char path[4096];

	for (int i = 0; i < ck->n_files; i++) {
		const char *base = strrchr(ck->files[i].path, '/');

		if (base && !strcmp(base + 1, name))
			return 0;
	}
	if (!name[0] || strchr(name, '/') || !strcmp(name, "..")) {
		snprintf(err, errlen, "%s/model.safetensors.index.json: file name '%.200s' is not a "
			 "plain file name in the checkpoint directory", ck->dir, name);
		return -EINVAL;
	}
	nf = realloc(ck->files, sizeof(*nf) * (size_t)(ck->n_files + 1));
	if (!nf)
		return -ENOMEM;
	ck->files = nf;
	snprintf(path, sizeof(path), "%s/%s", ck->dir, name);
	{
		int rc = dps_st_open(path, &ck->files[ck->n_files], err, errlen);

		if (rc)
			return rc;
	}
	ck->n_files++;
	return 0;
}

static int open_index(struct dps_ckpt *ck, const char *path, char *err, size_t errlen)
{
	json_error_t jerr;
	const json_t *map, *v;
	const char *name;
	json_t *root;
	int rc = 0;

	root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		snprintf(err, errlen, "%s: not valid JSON: %s (line %d)", path, jerr.text, jerr.line);
		return -EINVAL;
	}
	map = json_object_get(root, "weight_map");
	if (!json_is_object(map)) {
		snprintf(err, errlen, "%s: no 'weight_map' object", path);
		rc = -EINVAL;
		goto out;
	}
	json_object_foreach((json_t *)map, name, v) {
		int file;

		if (!json_is_string(v)) {
			snprintf(err, errlen, "%s: weight_map entry '%s' is not a file name", path, name);
			rc = -EINVAL;
			goto out;
		}
		rc = add_file(ck, json_string_value(v), err, errlen);
		if (rc)
			goto out;
		if (!dps_ckpt_find(ck, name, &file) ||
		    strcmp(strrchr(ck->files[file].path, '/') + 1, json_string_value(v))) {
			snprintf(err, errlen, "%s: tensor '%s' is listed in %s but not found there", path,
				 name, json_string_value(v));
			rc = -EINVAL;
			goto out;
		}
	}
out:
	json_decref(root);
	return rc;
}

static int is_safetensors(const struct dirent *de)
{
	const size_t n = strlen(de->d_name);

	return n > 12 && !strcmp(de->d_name + n - 12, ".safetensors");
}

int dps_ckpt_open(struct dps_ckpt *ck, const char *dir, char *err, size_t errlen)
{
	struct dirent **names = NULL;
	char path[4096];
	int rc, n, i, j;

	memset(ck, 0, sizeof(*ck));
	ck->dir = strdup(dir);
	if (!ck->dir)
		return -ENOMEM;
	rc = dps_model_config_load(dir, &ck->cfg, err, errlen);
	if (rc)
		goto err;
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
	if (access(path, F_OK) == 0) {
		rc = open_index(ck, path, err, errlen);
		if (rc)
			goto err;
	} else {
		n = scandir(dir, &names, is_safetensors, alphasort);
		if (n < 0) {
			rc = -errno;
			snprintf(err, errlen, "%s: %s", dir, strerror(errno));
			goto err;
		}
		for (i = 0; i < n && !rc; i++)
			rc = add_file(ck, names[i]->d_name, err, errlen);
		for (i = 0; i < n; i++)
			free(names[i]);
		free(names);
		if (rc)
			goto err;
	}
	if (ck->n_files == 0) {
		snprintf(err, errlen, "%s: no .safetensors file", dir);
		rc = -ENOENT;
		goto err;
	}
	/* A tensor name may appear in one file only. */
	for (i = 0; i < ck->n_files; i++)
		for (j = i + 1; j < ck->n_files; j++)
			for (int t = 0; t < ck->files[i].n; t++)
				if (dps_st_find(&ck->files[j], ck->files[i].t[t].name)) {
					snprintf(err, errlen, "%s: tensor '%s' appears in both %s and %s",
						 dir, ck->files[i].t[t].name, ck->files[i].path,
						 ck->files[j].path);
					rc = -EINVAL;
					goto err;
				}
	rc = io_uring_queue_init(QUEUE_DEPTH, &ck->ring, 0);
	if (rc) {
		snprintf(err, errlen, "io_uring_queue_init: %s", strerror(-rc));
		goto err;
	}
	ck->ring_ok = 1;
	return 0;
err:
	dps_ckpt_close(ck);
	return rc;
}

void dps_ckpt_close(struct dps_ckpt *ck)
{
	for (int i = 0; i < ck->n_files; i++)
		dps_st_free(&ck->files[i]);
	free(ck->files);
	free(ck->dir);
	if (ck->ring_ok)
		io_uring_queue_exit(&ck->ring);
	memset(ck, 0, sizeof(*ck));
}

const struct dps_st_tensor *dps_ckpt_find(const struct dps_ckpt *ck, const char *name, int *file)
{
	for (int i = 0; i < ck->n_files; i++) {
		const struct dps_st_tensor *t = dps_st_find(&ck->files[i], name);

		if (t) {
			if (file)
				*file = i;
			return t;
		}
	}
	return NULL;
}

/* ---- the loader ----------------------------------------------------------------------------- */

struct rd {
	int fd;
	uint64_t off;
	unsigned char *dst;
	size_t len;
};

/*
 * After an error: submit whatever is queued and wait for every read still in flight, so that
 * none completes later into memory the caller has freed, or is found by the next call.
 */
static void uring_drain(struct dps_ckpt *ck, size_t inflight)
{
	struct io_uring_cqe *cqe;

	io_uring_submit(&ck->ring);
	while (inflight && io_uring_wait_cqe(&ck->ring, &cqe) == 0) {
		io_uring_cqe_seen(&ck->ring, cqe);
		inflight--;
	}
}

/* Reads every request in flight, QUEUE_DEPTH at a time, finishing short reads. */
static int uring_read_all(struct dps_ckpt *ck, struct rd *r, size_t n, const char *path,
			  char *err, size_t errlen)
{
	size_t next = 0, inflight = 0;

	while (next < n || inflight) {
		struct io_uring_cqe *cqe;
		int rc;

		while (next < n && inflight < QUEUE_DEPTH) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ck->ring);

			if (!sqe)
				break;
			io_uring_prep_read(sqe, r[next].fd, r[next].dst,
					   (unsigned)(r[next].len < MAX_READ ? r[next].len : MAX_READ),
					   r[next].off);
			io_uring_sqe_set_data(sqe, &r[next]);
			next++;
			inflight++;
		}
		rc = io_uring_submit_and_wait(&ck->ring, 1);
		if (rc < 0 && rc != -EINTR) {
			snprintf(err, errlen, "%s: io_uring: %s", path, strerror(-rc));
			uring_drain(ck, inflight);
			return rc;
		}
		while (io_uring_peek_cqe(&ck->ring, &cqe) == 0) {
			struct rd *d = io_uring_cqe_get_data(cqe);
			const int res = cqe->res;

			io_uring_cqe_seen(&ck->ring, cqe);
			inflight--;
			if (res <= 0) {
				snprintf(err, errlen, "%s: read at offset %llu: %s", path,
					 (unsigned long long)d->off,
					 res ? strerror(-res) : "unexpected end of file");
				uring_drain(ck, inflight);
				return res ? res : -EIO;
			}
			ck->bytes_read += (uint64_t)res;
			d->off += (uint64_t)res;
			d->dst += res;
			d->len -= (size_t)res;
			if (d->len) {
				/* Short read or a piece larger than MAX_READ: queue the rest. */
				struct io_uring_sqe *sqe = io_uring_get_sqe(&ck->ring);

				if (!sqe) {
					snprintf(err, errlen, "%s: io_uring queue full", path);
					uring_drain(ck, inflight);
					return -EBUSY;
				}
				io_uring_prep_read(sqe, d->fd, d->dst,
						   (unsigned)(d->len < MAX_READ ? d->len : MAX_READ),
						   d->off);
				io_uring_sqe_set_data(sqe, d);
				inflight++;
			}
		}
	}
	return 0;
}

int dps_ckpt_load_shard(struct dps_ckpt *ck, const char *name, int want_ndim,
			const uint64_t *want_shape, int dim, int idx, int count, float *dst,
			char *err, size_t errlen)
{
	const struct dps_st_tensor *t = dps_ckpt_find(ck, name, NULL);
	uint64_t per;

	if (!t || dim < 0 || dim >= t->ndim || count < 1 || idx < 0 || idx >= count)
		return dps_ckpt_load_range(ck, name, want_ndim, want_shape, dim, t ? -1 : 0, 0, dst,
					   err, errlen);
	per = (t->shape[dim] + (uint64_t)count - 1) / (uint64_t)count;
	return dps_ckpt_load_range(ck, name, want_ndim, want_shape, dim, (int64_t)(per * (uint64_t)idx),
				   per, dst, err, errlen);
}

/* What load_range writes to dst (OUT_I8: an INT8 tensor's bytes; OUT_F16: an F16 tensor's
 * halves as stored; both for dps_ckpt_load_range_int8). */
enum { OUT_F32, OUT_RAW, OUT_BF16, OUT_I8, OUT_F16 };

/*
 * dps_ckpt_load_range (out OUT_F32: converted to F32), dps_ckpt_load_range_raw (OUT_RAW) and
 * dps_ckpt_load_range_bf16 (OUT_BF16: BF16 copied, F32 and F16 rounded to nearest even).
 */
static int load_range(struct dps_ckpt *ck, const char *name, int want_ndim,
		      const uint64_t *want_shape, int dim, int64_t first, uint64_t per, void *dst,
		      int out, char *err, size_t errlen)
{
	const int raw = out == OUT_RAW || out == OUT_I8 || out == OUT_F16;
	const enum dps_st_dtype own = out == OUT_BF16 ? DPS_ST_BF16 : DPS_ST_F32;
	const struct dps_st_tensor *t;
	uint64_t outer = 1, inner = 1, d, lo, hi, valid;
	unsigned char *stage = NULL;
	struct rd *reqs = NULL;
	size_t esz, dsz, nreq;
	unsigned char *dstb = dst;
	int file, rc = 0;

	t = dps_ckpt_find(ck, name, &file);
	if (!t) {
		snprintf(err, errlen, "%s: tensor '%s' is missing", ck->dir, name);
		return -ENOENT;
	}
	if (want_ndim > 0 && (want_ndim != t->ndim ||
			      memcmp(want_shape, t->shape, sizeof(uint64_t) * (size_t)t->ndim))) {
		char got[128] = "", want[128] = "";

		for (int i = 0; i < t->ndim; i++)
			snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%llu", i ? "x" : "",
				 (unsigned long long)t->shape[i]);
		for (int i = 0; i < want_ndim; i++)
			snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%llu",
				 i ? "x" : "", (unsigned long long)want_shape[i]);
		snprintf(err, errlen, "%s: tensor '%s' has shape %s, expected %s",
			 ck->files[file].path, name, got, want);
		return -EINVAL;
	}
	if (!dst || t->ndim < 1 || dim < 0 || dim >= t->ndim || first < 0 || per < 1 ||
	    per > ((uint64_t)1 << 40)) {
		snprintf(err, errlen, "tensor '%s': bad shard request (dimension %d, %lld + %llu)",
			 name, dim, (long long)first, (unsigned long long)per);
		return -EINVAL;
	}
	for (int i = 0; i < dim; i++)
		outer *= t->shape[i];
	for (int i = dim + 1; i < t->ndim; i++)
		inner *= t->shape[i];
	d = t->shape[dim];
	lo = (uint64_t)first < d ? (uint64_t)first : d;
	hi = lo + per < d ? lo + per : d;
	valid = hi > lo ? hi - lo : 0;
	esz = dps_st_dtype_size(t->dtype);
	dsz = raw ? esz : out == OUT_BF16 ? sizeof(uint16_t) : sizeof(float);
	if (out == OUT_BF16 && t->dtype == DPS_ST_I64) {
		snprintf(err, errlen, "%s: tensor '%s' holds integers (I64), not weights to keep as "
			 "BF16", ck->files[file].path, name);
		return -EINVAL;
	}
	if (!raw && esz == 1) {
		snprintf(err, errlen, "%s: tensor '%s' holds bytes (%s), not numbers",
			 ck->files[file].path, name, dps_st_dtype_name(t->dtype));
		return -EINVAL;
	}
	if (t->dtype == DPS_ST_I8 && !raw) {
		snprintf(err, errlen, "%s: tensor '%s' is INT8 (dpshard_int8): its weights are "
			 "read as f32 or INT8, not as BF16", ck->files[file].path, name);
		return -EINVAL;
	}
	/* The callers size dst for one byte an element: anything wider would overrun it. */
	if ((out == OUT_RAW && t->dtype != DPS_ST_U8) || (out == OUT_I8 && t->dtype != DPS_ST_I8) ||
	    (out == OUT_F16 && t->dtype != DPS_ST_F16)) {
		snprintf(err, errlen, "%s: tensor '%s' is %s; its bytes are read as stored only "
			 "when it is %s", ck->files[file].path, name, dps_st_dtype_name(t->dtype),
			 out == OUT_I8 ? "I8" : out == OUT_F16 ? "F16" : "U8");
		return -EINVAL;
	}

	/* Padding first: rows past the end of the dimension are zero. */
	if (valid < per)
		for (uint64_t o = 0; o < outer; o++)
			memset(dstb + ((o * per + valid) * inner) * dsz, 0, (per - valid) * inner * dsz);
	if (!valid || !outer || !inner)
		return 0;
	if (!raw && t->dtype != own) {
		stage = malloc(outer * valid * inner * esz);
		if (!stage)
			return -ENOMEM;
	}
	/*
	 * One range per outer row; ranges that follow each other both in the file and in the
	 * destination (a shard that is whole rows, or dimension 0) merge, and the result is cut
	 * into PIECE-sized reads so that many are in flight.
	 */
	nreq = outer + (outer * valid * inner * esz) / PIECE + 1;
	reqs = calloc(nreq, sizeof(*reqs));
	if (!reqs) {
		rc = -ENOMEM;
		goto out;
	}
	nreq = 0;
	for (uint64_t o = 0; o < outer;) {
		uint64_t off = t->begin + ((o * d + lo) * inner) * esz;
		unsigned char *to = stage ? stage + o * valid * inner * esz
					  : dstb + (o * per * inner) * dsz;
		uint64_t len = valid * inner * esz;

		/* Whole rows are contiguous in the file, and in the destination unless padded. */
		for (o++; o < outer && valid == d && per == d; o++)
			len += valid * inner * esz;
		while (len) {
			const uint64_t piece = len < PIECE ? len : PIECE;

			reqs[nreq].fd = ck->files[file].fd;
			reqs[nreq].off = off;
			reqs[nreq].dst = to;
			reqs[nreq].len = (size_t)piece;
			nreq++;
			off += piece;
			to += piece;
			len -= piece;
		}
	}
	rc = uring_read_all(ck, reqs, nreq, ck->files[file].path, err, errlen);
	if (rc || !stage)
		goto out;
	for (uint64_t o = 0; o < outer && out == OUT_BF16; o++) {
		const unsigned char *s = stage + o * valid * inner * esz;
		uint16_t *q = (uint16_t *)dst + o * per * inner;

		for (uint64_t i = 0; i < valid * inner; i++) {
			float f;
			uint16_t h;

			if (t->dtype == DPS_ST_F32) {
				memcpy(&f, s + i * 4, 4);
			} else { /* F16: exact in f32, then rounded once */
				memcpy(&h, s + i * 2, 2);
				f = dps_f16_to_f32(h);
			}
			q[i] = dps_f32_to_bf16(f);
		}
	}
	for (uint64_t o = 0; o < outer && out == OUT_F32; o++) {
		const uint16_t *s = (const uint16_t *)(void *)(stage + o * valid * inner * esz);
		float *q = (float *)dst + o * per * inner;

		for (uint64_t i = 0; i < valid * inner; i++) {
			if (t->dtype == DPS_ST_I64) {
				int64_t v;

				/* Exact below 2^24: token ids and offsets are. */
				memcpy(&v, stage + (o * valid * inner + i) * 8, 8);
				q[i] = (float)v;
			} else if (t->dtype == DPS_ST_BF16) {
				const uint32_t u = (uint32_t)s[i] << 16;

				memcpy(&q[i], &u, 4);
			} else {
				q[i] = dps_f16_to_f32(s[i]);
			}
		}
	}
out:
	free(reqs);
	free(stage);
	return rc;
}

int dps_ckpt_load_range_int8(struct dps_ckpt *ck, const char *name, const uint64_t *want_shape,
			     int dim, int64_t first, uint64_t per, int8_t *q, uint16_t *d,
			     char *err, size_t errlen)
{
	const struct dps_st_tensor *t = dps_ckpt_find(ck, name, NULL);
	uint64_t n, K, kb, sshape[2];
	char sname[272];
	int rc;

	if (!t || t->dtype != DPS_ST_I8 || t->ndim != 2 || (dim != 0 && dim != 1) || first < 0)
		return load_range(ck, name, 2, want_shape, dim, first, per, q, OUT_I8, err, errlen);
	n = t->shape[0], K = t->shape[1], kb = (K + 31) / 32;
	if (dim == 1 && first % 32 && (uint64_t)first < K) {
		snprintf(err, errlen, "%s: tensor '%s' is INT8 in blocks of 32 columns, and this "
			 "rank's columns start at %lld, inside a block: use a layout whose column "
			 "shards are multiples of 32 wide, or load the unquantized checkpoint with "
			 "--quantization int8", ck->dir, name, (long long)first);
		return -EINVAL;
	}
	if (snprintf(sname, sizeof(sname), "%s_scale", name) >= (int)sizeof(sname))
		return -ENAMETOOLONG;
	sshape[0] = n, sshape[1] = kb;
	rc = load_range(ck, name, 2, want_shape, dim, first, per, q, OUT_I8, err, errlen);
	if (rc)
		return rc;
	if (!dps_ckpt_find(ck, sname, NULL)) {
		snprintf(err, errlen, "%s: INT8 tensor '%s' has no '%s' beside it", ck->dir, name,
			 sname);
		return -EINVAL;
	}
	return load_range(ck, sname, 2, sshape, dim, dim == 0 ? first : first / 32,
			  dim == 0 ? per : (per + 31) / 32, d, OUT_F16, err, errlen);
}

/*
 * dps_ckpt_load_range of an INT8 tensor: its values times their blocks' scales, exact in f32
 * (dps_ckpt_load_range_int8 says what may be asked).
 */
static int load_int8(struct dps_ckpt *ck, const struct dps_st_tensor *t, const char *name,
		     int dim, int64_t first, uint64_t per, float *dst, char *err, size_t errlen)
{
	const uint64_t rows = dim == 0 ? per : t->shape[0];
	const uint64_t cols = dim == 0 ? t->shape[1] : per, kb = (cols + 31) / 32;
	int8_t *q = malloc(rows * cols + 1);
	uint16_t *d = malloc(sizeof(uint16_t) * (rows * kb + 1));
	int rc = -ENOMEM;

	if (q && d)
		rc = dps_ckpt_load_range_int8(ck, name, t->shape, dim, first, per, q, d, err,
					      errlen);
	/* Column c's block among the loaded scales is c / 32 (a range starts on a block). */
	for (uint64_t r = 0; !rc && r < rows; r++)
		for (uint64_t c = 0; c < cols; c++)
			dst[r * cols + c] = (float)q[r * cols + c] * dps_f16_to_f32(d[r * kb + c / 32]);
	free(q);
	free(d);
	return rc;
}

int dps_ckpt_load_range(struct dps_ckpt *ck, const char *name, int want_ndim,
			const uint64_t *want_shape, int dim, int64_t first, uint64_t per, float *dst,
			char *err, size_t errlen)
{
	const struct dps_st_tensor *t = dps_ckpt_find(ck, name, NULL);

	if (t && t->dtype == DPS_ST_I8 && per > 0 && per <= ((uint64_t)1 << 40) && dst &&
	    (dim == 0 || dim == 1)) {
		/* the shape check of load_range first, with its message */
		if (want_ndim > 0 && (want_ndim != t->ndim ||
				      memcmp(want_shape, t->shape, sizeof(uint64_t) * (size_t)t->ndim)))
			return load_range(ck, name, want_ndim, want_shape, dim, first, per, dst,
					  OUT_F32, err, errlen);
		if (first < 0)
			return load_range(ck, name, want_ndim, want_shape, dim, first, per, dst,
					  OUT_F32, err, errlen);
		return load_int8(ck, t, name, dim, first, per, dst, err, errlen);
	}
	return load_range(ck, name, want_ndim, want_shape, dim, first, per, dst, OUT_F32, err,
			  errlen);
}

int dps_ckpt_load_range_bf16(struct dps_ckpt *ck, const char *name, int want_ndim,
			     const uint64_t *want_shape, int dim, int64_t first, uint64_t per,
			     uint16_t *dst, char *err, size_t errlen)
{
	return load_range(ck, name, want_ndim, want_shape, dim, first, per, dst, OUT_BF16, err,
			  errlen);
}

/* Whether every floating tensor of two or more dimensions (INT8 weights, their scales, bytes
 * and integers aside) is of type dt, and there is one. */
static int weights_all(const struct dps_ckpt *ck, enum dps_st_dtype dt)
{
	int found = 0;

	for (int f = 0; f < ck->n_files; f++)
		for (int i = 0; i < ck->files[f].n; i++) {
			const struct dps_st_tensor *t = &ck->files[f].t[i];
			const size_t len = strlen(t->name);

			/* bytes, integers, and INT8 weights with their F16 scales say nothing */
			if (t->ndim < 2 || t->dtype == DPS_ST_U8 || t->dtype == DPS_ST_I64 ||
			    t->dtype == DPS_ST_I8 ||
			    (len > 6 && !strcmp(t->name + len - 6, "_scale") &&
			     t->dtype == DPS_ST_F16))
				continue;
			if (t->dtype != dt)
				return 0;
			found = 1;
		}
	return found;
}

int dps_ckpt_weights_bf16(const struct dps_ckpt *ck)
{
	return weights_all(ck, DPS_ST_BF16);
}

int dps_ckpt_weights_f16(const struct dps_ckpt *ck)
{
	return weights_all(ck, DPS_ST_F16);
}

int dps_ckpt_load_range_f16(struct dps_ckpt *ck, const char *name, int want_ndim,
			    const uint64_t *want_shape, int dim, int64_t first, uint64_t per,
			    uint16_t *dst, char *err, size_t errlen)
{
	return load_range(ck, name, want_ndim, want_shape, dim, first, per, dst, OUT_F16, err,
			  errlen);
}

int dps_ckpt_load_range_raw(struct dps_ckpt *ck, const char *name, int want_ndim,
			    const uint64_t *want_shape, int dim, int64_t first, uint64_t per,
			    void *dst, char *err, size_t errlen)
{
	return load_range(ck, name, want_ndim, want_shape, dim, first, per, dst, OUT_RAW, err,
			  errlen);
}

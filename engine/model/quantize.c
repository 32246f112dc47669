/* SPDX-License-Identifier: MIT */
/*
 * engine/model/quantize.c - `dpshard quantize IN OUT`: a checkpoint's linear weights written
 * as INT8 (kernels/q8.h), so that a large model is quantized once and its ranks read a
 * quarter of its f32 bytes at every start. See quantize.h for the format.
 *
 * The output is written tensor by tensor (a quantized tensor is read and quantized 1024 rows
 * at a time, the others copied byte for byte), so the memory it needs is a few MB whatever
 * the model's size, plus the scales of the largest tensor: a tensor's staging buffers are
 * allocated when its first rows are read and freed after its last values are written, its
 * scales after they are written (the writer goes through the tensors in order, the values
 * of a weight just before its scales). Files are written under temporary names and renamed
 * when whole; config.json comes last, so a directory without it is an interrupted run, never
 * a checkpoint that loads. A run that fails removes the directory it created.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/model/ckpt.h"
#include "engine/model/quantize.h"
#include "kernels/q8.h"

/* The tensors the engine multiplies as linear weights, by the end of their names. */
static const char *const linear_suffixes[] = {
	".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight",
	".gate_proj.weight", ".up_proj.weight", ".down_proj.weight", NULL
};

int dps_quantize_is_linear(const char *name, int ndim)
{
	const size_t len = strlen(name);

	if (ndim != 2)
		return 0;
	if (!strcmp(name, "lm_head.weight") || !strcmp(name, "fc.weight"))
		return 1;
	for (const char *const *s = linear_suffixes; *s; s++) {
		const size_t n = strlen(*s);

		if (len > n && !strcmp(name + len - n, *s))
			return 1;
	}
	return 0;
}

#define STAGE_ROWS 1024

/* One tensor of the output and where its bytes come from. */
struct out_tensor {
	struct quant *qs;
	const struct dps_st_tensor *src; /* the input tensor */
	int file;                        /* its file in the input */
	int role;                        /* 0 copied, 1 INT8 values, 2 their scales */
	struct q8_job *job;              /* roles 1 and 2 */
};

/* A tensor being quantized: its rows STAGE_ROWS at a time, its scales whole. */
struct q8_job {
	const char *name;
	uint64_t n, k, kb;
	uint64_t r0, r1;    /* rows held in vals */
	int8_t *vals;       /* (STAGE_ROWS, k) signed values in column order */
	uint16_t *scales;   /* (n, kb) every row's, filled as the values are written */
	float *f;           /* (STAGE_ROWS, k) staging */
	void *q;            /* (STAGE_ROWS) rows of INT8 weights */
};

struct quant {
	struct dps_ckpt ck;
	int done, total;    /* tensors written, for the progress line */
	int verbose;
	char *err;
	size_t errlen;
};

static void job_drop_stage(struct q8_job *j)
{
	free(j->vals);
	free(j->f);
	free(j->q);
	j->vals = NULL, j->f = NULL, j->q = NULL;
	j->r0 = j->r1 = 0;
}

static int job_fill(struct quant *qs, struct q8_job *j, uint64_t r0)
{
	const uint64_t m = j->n - r0 < STAGE_ROWS ? j->n - r0 : STAGE_ROWS;
	const uint64_t shape[2] = { j->n, j->k };
	int rc;

	if (!j->vals) {
		j->vals = malloc(STAGE_ROWS * j->k + 1);
		j->f = malloc(sizeof(float) * STAGE_ROWS * j->k + 1);
		j->q = malloc(dps_q8_bytes(STAGE_ROWS, (int)j->k) + 1);
	}
	if (!j->scales)
		j->scales = malloc(sizeof(uint16_t) * j->n * j->kb + 1);
	if (!j->vals || !j->f || !j->q || !j->scales) {
		snprintf(qs->err, qs->errlen, "out of memory for tensor '%s'", j->name);
		return -ENOMEM;
	}
	rc = dps_ckpt_load_range(&qs->ck, j->name, 2, shape, 0, (int64_t)r0, m, j->f, qs->err,
				 qs->errlen);
	if (rc)
		return rc;
	dps_q8_quantize_rows(j->q, (int)j->k, j->f, m);
	for (uint64_t i = 0; i < m; i++)
		dps_q8_export_row(j->vals + i * j->k, j->scales + (r0 + i) * j->kb, j->q, (int)j->k,
				  i);
	j->r0 = r0;
	j->r1 = r0 + m;
	return 0;
}

static void progress(struct quant *qs, const struct out_tensor *o)
{
	qs->done++;
	if (qs->verbose)
		fprintf(stderr, "quantize: %d/%d %s %s\n", qs->done, qs->total,
			o->role == 1 ? "int8" : o->role == 2 ? "scale" : "copy", o->src->name);
}

/* The writer's gen_raw: bytes [start, start + count) of output tensor arg. */
static int gen(void *dst, uint64_t start, uint64_t count, void *arg)
{
	struct out_tensor *o = arg;
	struct quant *qs = o->qs;
	struct q8_job *j = o->job;
	unsigned char *d = dst;

	if (!start)
		progress(qs, o);
	if (o->role == 0) {
		const struct dps_st_file *f = &qs->ck.files[o->file];

		while (count) {
			const ssize_t got = pread(f->fd, d, count, (off_t)(o->src->begin + start));

			if (got <= 0) {
				snprintf(qs->err, qs->errlen, "%s: cannot read tensor '%s': %s", f->path,
					 o->src->name, got ? strerror(errno) : "file truncated");
				return got ? -errno : -EIO;
			}
			d += got, start += (uint64_t)got, count -= (uint64_t)got;
		}
		return 0;
	}
	if (o->role == 2) {
		if (!j->scales) { /* the writer's order is values then scales, once each */
			snprintf(qs->err, qs->errlen, "the scales of '%s' were asked for out of order",
				 j->name);
			return -EIO;
		}
		memcpy(d, (const unsigned char *)j->scales + start, count);
		if (start + count == sizeof(uint16_t) * j->n * j->kb) {
			free(j->scales);
			j->scales = NULL;
		}
		return 0;
	}
	while (count) {
		const uint64_t row = start / j->k, col = start % j->k;
		uint64_t take;
		int rc;

		if (row < j->r0 || row >= j->r1) {
			rc = job_fill(qs, j, row);
			if (rc)
				return rc;
		}
		take = (j->r1 - row) * j->k - col;
		take = take < count ? take : count;
		memcpy(d, j->vals + (row - j->r0) * j->k + col, take);
		d += take, start += take, count -= take;
	}
	if (start == j->n * j->k) /* the last values: the scales are all filled */
		job_drop_stage(j);
	return 0;
}

/* Copies file name of dir in to out (under a temporary name, then renamed). */
static int copy_file(const char *in, const char *out, const char *name, char *err,
		     size_t errlen)
{
	char src[4096], dst[4096], tmp[4200], buf[1 << 16];
	int fi, fo, rc = 0;
	ssize_t n;

	snprintf(src, sizeof(src), "%s/%s", in, name);
	snprintf(dst, sizeof(dst), "%s/%s", out, name);
	snprintf(tmp, sizeof(tmp), "%s.tmp", dst);
	fi = open(src, O_RDONLY | O_CLOEXEC);
	if (fi < 0) {
		snprintf(err, errlen, "%s: %s", src, strerror(errno));
		return -errno;
	}
	fo = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fo < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
		close(fi);
		return rc;
	}
	while ((n = read(fi, buf, sizeof(buf))) > 0)
		if (write(fo, buf, (size_t)n) != n) {
			rc = -EIO;
			break;
		}
	if (n < 0)
		rc = -errno;
	if (close(fo) && !rc)
		rc = -errno;
	close(fi);
	if (!rc && rename(tmp, dst))
		rc = -errno;
	if (rc) {
		snprintf(err, errlen, "cannot copy %s to %s: %s", src, dst, strerror(-rc));
		unlink(tmp);
	}
	return rc;
}

/* The input's config.json with quantization_config set for dpshard_int8. */
static int write_config(struct quant *qs, const char *in, const char *out)
{
	char src[4096], dst[4096], tmp[4200];
	json_error_t je;
	json_t *root, *q;
	int rc = 0;

	snprintf(src, sizeof(src), "%s/config.json", in);
	snprintf(dst, sizeof(dst), "%s/config.json", out);
	snprintf(tmp, sizeof(tmp), "%s.tmp", dst);
	root = json_load_file(src, 0, &je);
	if (!root) {
		snprintf(qs->err, qs->errlen, "%s: %s", src, je.text);
		return -EINVAL;
	}
	q = json_pack("{s:s, s:i, s:s}", "quant_method", "dpshard_int8", "block_size", 32,
		      "scale_dtype", "float16");
	if (q && qs->ck.cfg.mxfp4)
		json_object_set_new(q, "mxfp4_experts", json_true());
	if (!q || json_object_set_new(root, "quantization_config", q) ||
	    json_dump_file(root, tmp, JSON_INDENT(2) | JSON_PRESERVE_ORDER)) {
		snprintf(qs->err, qs->errlen, "cannot write %s", tmp);
		rc = -EIO;
	}
	json_decref(root);
	if (!rc && rename(tmp, dst)) {
		rc = -errno;
		snprintf(qs->err, qs->errlen, "cannot write %s: %s", dst, strerror(errno));
	}
	if (rc)
		unlink(tmp);
	return rc;
}

/* Whether file name of the input is copied beside the new weights. */
static int copied(const char *name)
{
	const size_t len = strlen(name);

	if (name[0] == '.' || !strcmp(name, "config.json") ||
	    !strcmp(name, "model.safetensors.index.json"))
		return 0;
	return !(len > 12 && !strcmp(name + len - 12, ".safetensors"));
}

/* Removes directory dir, which this run created, and the files it wrote there. */
static void remove_made(const char *dir)
{
	char path[4200];
	DIR *d = opendir(dir);

	if (d) {
		for (struct dirent *e; (e = readdir(d));)
			if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
				snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
				(void)unlink(path);
			}
		closedir(d);
	}
	(void)rmdir(dir);
}

int dps_quantize_dir(const char *in, const char *out, int verbose, char *err, size_t errlen)
{
	struct quant qs = { .verbose = verbose, .err = err, .errlen = errlen };
	struct dps_st_writer_tensor *wt = NULL;
	struct out_tensor *ot = NULL;
	struct q8_job *jobs = NULL;
	char path[4096], tmp[4200];
	int n_in = 0, n_out = 0, n_jobs = 0, made = 0, rc;
	struct stat st;
	DIR *dir;

	rc = dps_ckpt_open(&qs.ck, in, err, errlen);
	if (rc)
		return rc;
	if (qs.ck.cfg.int8) {
		snprintf(err, errlen, "%s: its linear weights are INT8 already", in);
		rc = -DPS_ECONFIG;
		goto out;
	}
	if (!stat(out, &st)) {
		snprintf(err, errlen, "%s exists: dpshard quantize writes a new directory and never "
			 "overwrites one", out);
		rc = -EEXIST;
		goto out;
	}
	for (int f = 0; f < qs.ck.n_files; f++)
		n_in += qs.ck.files[f].n;
	wt = calloc((size_t)n_in * 2 + 1, sizeof(*wt));
	ot = calloc((size_t)n_in * 2 + 1, sizeof(*ot));
	jobs = calloc((size_t)n_in + 1, sizeof(*jobs));
	if (!wt || !ot || !jobs) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	for (int f = 0; f < qs.ck.n_files; f++)
		for (int i = 0; i < qs.ck.files[f].n; i++) {
			const struct dps_st_tensor *t = &qs.ck.files[f].t[i];
			const int lin = dps_quantize_is_linear(t->name, t->ndim) &&
					(t->dtype == DPS_ST_F32 || t->dtype == DPS_ST_BF16 ||
					 t->dtype == DPS_ST_F16);

			for (int role = lin ? 1 : 0; role <= (lin ? 2 : 0); role++) {
				struct dps_st_writer_tensor *w = &wt[n_out];
				struct out_tensor *o = &ot[n_out++];

				o->qs = &qs, o->src = t, o->file = f, o->role = role;
				w->gen_raw = gen, w->gen_arg = o;
				w->ndim = t->ndim;
				memcpy(w->shape, t->shape, sizeof(w->shape));
				w->dtype = role == 1 ? DPS_ST_I8 : role == 2 ? DPS_ST_F16 : t->dtype;
				if (snprintf(w->name, sizeof(w->name), "%s%s", t->name,
					     role == 2 ? "_scale" : "") >= (int)sizeof(w->name)) {
					snprintf(err, errlen, "tensor name '%s' is too long", t->name);
					rc = -ENAMETOOLONG;
					goto out;
				}
				if (role == 0)
					continue;
				if (role == 1) {
					struct q8_job *j = &jobs[n_jobs++];

					j->name = t->name, j->n = t->shape[0], j->k = t->shape[1];
					j->kb = (j->k + 31) / 32; /* buffers: job_fill */
				}
				o->job = &jobs[n_jobs - 1];
				w->shape[1] = role == 2 ? o->job->kb : w->shape[1];
			}
		}
	qs.total = n_out;
	if (mkdir(out, 0755)) {
		rc = -errno;
		snprintf(err, errlen, "cannot create %s: %s", out, strerror(errno));
		goto out;
	}
	made = 1;
	snprintf(path, sizeof(path), "%s/model.safetensors", out);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	err[0] = 0;
	rc = dps_st_write(tmp, wt, n_out);
	if (rc) {
		if (!err[0])
			snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(-rc));
		unlink(tmp);
		goto out;
	}
	if (rename(tmp, path)) {
		rc = -errno;
		snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
		goto out;
	}
	dir = opendir(in);
	if (!dir) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", in, strerror(errno));
		goto out;
	}
	for (struct dirent *e; !rc && (e = readdir(dir));) {
		snprintf(path, sizeof(path), "%s/%s", in, e->d_name);
		if (copied(e->d_name) && !stat(path, &st) && S_ISREG(st.st_mode))
			rc = copy_file(in, out, e->d_name, err, errlen);
	}
	closedir(dir);
	if (!rc)
		rc = write_config(&qs, in, out);
out:
	if (rc && made) /* no half-written checkpoint left to refuse the next run */
		remove_made(out);
	for (int i = 0; i < n_jobs; i++) {
		free(jobs[i].vals);
		free(jobs[i].f);
		free(jobs[i].q);
		free(jobs[i].scales);
	}
	free(jobs);
	free(ot);
	free(wt);
	dps_ckpt_close(&qs.ck);
	return rc;
}

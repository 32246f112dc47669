/* SPDX-License-Identifier: MIT */
/*
 * engine/model/convert.c - the llama2.c importer (see convert.h). Runs once per conversion, from
 * `dpshard convert llama2c`. The checkpoint is outside input: its header is checked field by
 * field, and against the file's size, before anything is sized from it (fuzzed by
 * tests/fuzz/fuzz_llama2c.c through dps_convert_llama2c_mem).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/model/ckpt.h"
#include "engine/model/convert.h"
#include "engine/model/model_config.h"

/*
 * llama2.c rotates adjacent pairs (2i, 2i+1) of each head; Hugging Face rotates (i, i + hd/2).
 * Row h*hd + c*hd/2 + i of the result is row h*hd + 2i + c of the input, c in {0, 1}.
 */
static void permute_rows(float *dst, const float *src, int heads, int hd, int cols)
{
	for (int h = 0; h < heads; h++)
		for (int c = 0; c < 2; c++)
			for (int i = 0; i < hd / 2; i++)
				memcpy(dst + ((size_t)h * hd + (size_t)c * (hd / 2) + i) * cols,
				       src + ((size_t)h * hd + 2 * (size_t)i + c) * cols,
				       sizeof(float) * (size_t)cols);
}

static int copy_file(const char *from, const char *to)
{
	char buf[65536];
	FILE *in = fopen(from, "rb"), *out;
	size_t n;
	int rc = 0;

	if (!in)
		return -errno;
	out = fopen(to, "wb");
	if (!out) {
		rc = -errno;
		fclose(in);
		return rc;
	}
	while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
		if (fwrite(buf, 1, n, out) != n)
			rc = -EIO;
	if (ferror(in))
		rc = -EIO;
	fclose(in);
	if (fclose(out))
		rc = -EIO;
	return rc;
}

/* The header and what follows from it. */
struct llama2c_shape {
	int dim, hidden, layers, heads, kv_heads, vocab, seq;
	int tied; /* vocab_size was positive: the classifier is the embedding */
	int hd, kv_dim;
	size_t n_floats; /* float32 values after the header */
};

/* Checks one field against [lo, hi]; names it in the message. */
static int check_field(const char *name, const char *field, long long v, long long lo,
		       long long hi, char *err, size_t errlen)
{
	if (v >= lo && v <= hi)
		return 0;
	snprintf(err, errlen, "%s: implausible header: %s %lld is outside [%lld, %lld]", name, field,
		 v, lo, hi);
	return -EINVAL;
}

/*
 * Parses the header at hdr (DPS_LLAMA2C_HEADER_BYTES) of a checkpoint of file_size bytes into
 * s. The bounds keep every size below far from overflow (the largest, n_floats, stays under
 * 2^50) and match what dps_model_config_parse accepts of the config written from them.
 */
static int parse_header(const unsigned char *hdr, uint64_t file_size, const char *name,
			struct llama2c_shape *s, char *err, size_t errlen)
{
	int32_t h[7];

	memcpy(h, hdr, sizeof(h));
	memset(s, 0, sizeof(*s));
	s->dim = h[0], s->hidden = h[1], s->layers = h[2], s->heads = h[3], s->kv_heads = h[4];
	s->seq = h[6];
	if (check_field(name, "dim", h[0], 2, 65536, err, errlen) ||
	    check_field(name, "hidden_dim", h[1], 1, 262144, err, errlen) ||
	    check_field(name, "n_layers", h[2], 1, 1024, err, errlen) ||
	    check_field(name, "n_heads", h[3], 1, h[0], err, errlen) ||
	    check_field(name, "n_kv_heads", h[4], 1, h[3], err, errlen) ||
	    check_field(name, "seq_len", h[6], 1, 1 << 24, err, errlen))
		return -EINVAL;
	/*
	 * Negated for an untied classifier (-INT32_MIN does not exist: compare in 64 bits). At
	 * least 3: llama2.c's ids 0, 1 and 2 are <unk>, BOS and EOS, and the config says so.
	 */
	if (h[5] == INT32_MIN || abs(h[5]) < 3 || abs(h[5]) > (1 << 24)) {
		snprintf(err, errlen, "%s: implausible header: vocab_size %d (negative when the "
			 "classifier is untied) must be 3 to %d tokens in size, <unk>, BOS and EOS "
			 "included", name, h[5], 1 << 24);
		return -EINVAL;
	}
	s->tied = h[5] > 0;
	s->vocab = s->tied ? h[5] : -h[5];
	if (s->dim % s->heads) {
		snprintf(err, errlen, "%s: implausible header: n_heads %d does not divide dim %d",
			 name, s->heads, s->dim);
		return -EINVAL;
	}
	if (s->heads % s->kv_heads) {
		snprintf(err, errlen, "%s: implausible header: n_kv_heads %d does not divide n_heads "
			 "%d", name, s->kv_heads, s->heads);
		return -EINVAL;
	}
	s->hd = s->dim / s->heads;
	if (s->hd % 2) {
		snprintf(err, errlen, "%s: implausible header: the head size dim / n_heads = %d / %d "
			 "= %d is odd (rotary embedding rotates pairs)", name, s->dim, s->heads, s->hd);
		return -EINVAL;
	}
	s->kv_dim = s->kv_heads * s->hd;
	/* Floats: embedding, per layer norms and projections, final norm, two rope tables. */
	s->n_floats = (size_t)s->vocab * s->dim +
		      (size_t)s->layers * ((size_t)2 * s->dim + (size_t)s->dim * s->dim * 2 +
					   (size_t)s->kv_dim * s->dim * 2 +
					   (size_t)s->hidden * s->dim * 3) +
		      s->dim + (size_t)s->seq * s->hd;
	if (!s->tied)
		s->n_floats += (size_t)s->vocab * s->dim;
	if (file_size != DPS_LLAMA2C_HEADER_BYTES + (uint64_t)s->n_floats * 4) {
		snprintf(err, errlen, "%s: %llu bytes but the header (dim %d, hidden_dim %d, n_layers "
			 "%d, n_heads %d, n_kv_heads %d, vocab_size %d, seq_len %d) implies %llu",
			 name, (unsigned long long)file_size, s->dim, s->hidden, s->layers, s->heads,
			 s->kv_heads, h[5], s->seq,
			 (unsigned long long)(DPS_LLAMA2C_HEADER_BYTES + (uint64_t)s->n_floats * 4));
		return -EINVAL;
	}
	return 0;
}

void dps_convert_model_free(struct dps_convert_model *m)
{
	free(m->tensors);
	memset(m, 0, sizeof(*m));
}

int dps_convert_llama2c_mem(void *buf, size_t len, enum dps_st_dtype dt, const char *name,
			    struct dps_convert_model *m, char *err, size_t errlen)
{
	struct dps_st_writer_tensor *t;
	struct llama2c_shape s;
	float *perm;
	int rc, nt = 0;

	memset(m, 0, sizeof(*m));
	if (len < DPS_LLAMA2C_HEADER_BYTES) {
		snprintf(err, errlen, "%s: not a llama2.c checkpoint (%zu bytes, no %d-byte header)",
			 name, len, DPS_LLAMA2C_HEADER_BYTES);
		return -EINVAL;
	}
	DPS_ASSERT(((uintptr_t)buf & 3) == 0);
	rc = parse_header(buf, len, name, &s, err, errlen);
	if (rc)
		return rc;
	perm = malloc((size_t)s.dim * s.dim * sizeof(float));
	t = calloc((size_t)s.layers * 9 + 3, sizeof(*t)); /* + embedding, norm, classifier */
	if (!perm || !t) {
		snprintf(err, errlen, "%s: out of memory for the tensor table", name);
		free(perm);
		free(t);
		return -ENOMEM;
	}

#define TENSOR(nm, p, nd, d0, d1)                                                      \
	do {                                                                           \
		snprintf(t[nt].name, sizeof(t[nt].name), "%s", nm);                    \
		t[nt].dtype = dt;                                                      \
		t[nt].ndim = nd;                                                       \
		t[nt].shape[0] = (uint64_t)(d0);                                       \
		t[nt].shape[1] = (uint64_t)(d1);                                       \
		t[nt].data = (p);                                                      \
		nt++;                                                                  \
	} while (0)
	{
		const int dim = s.dim, hidden = s.hidden, layers = s.layers, kv_dim = s.kv_dim;
		const float *emb = (const float *)((char *)buf + DPS_LLAMA2C_HEADER_BYTES);
		const float *rms_att = emb + (size_t)s.vocab * dim;
		float *wq = (float *)rms_att + (size_t)layers * dim;
		float *wk = wq + (size_t)layers * dim * dim;
		const float *wv = wk + (size_t)layers * kv_dim * dim;
		const float *wo = wv + (size_t)layers * kv_dim * dim;
		const float *rms_ffn = wo + (size_t)layers * dim * dim;
		const float *w1 = rms_ffn + (size_t)layers * dim;
		const float *w2 = w1 + (size_t)layers * hidden * dim;
		const float *w3 = w2 + (size_t)layers * dim * hidden;
		const float *rms_final = w3 + (size_t)layers * hidden * dim;
		const float *wcls = rms_final + dim + (size_t)s.seq * s.hd;
		char nm[128];

		TENSOR("model.embed_tokens.weight", emb, 2, s.vocab, dim);
		for (int l = 0; l < layers; l++) {
			float *q = wq + (size_t)l * dim * dim, *k = wk + (size_t)l * kv_dim * dim;

			/* Permute in place through the scratch buffer. */
			permute_rows(perm, q, s.heads, s.hd, dim);
			memcpy(q, perm, (size_t)dim * dim * sizeof(float));
			permute_rows(perm, k, s.kv_heads, s.hd, dim);
			memcpy(k, perm, (size_t)kv_dim * dim * sizeof(float));
#define LAYER(suffix, p, nd, d0, d1)                                                   \
	do {                                                                           \
		snprintf(nm, sizeof(nm), "model.layers.%d.%s", l, suffix);             \
		TENSOR(nm, p, nd, d0, d1);                                             \
	} while (0)
			LAYER("input_layernorm.weight", rms_att + (size_t)l * dim, 1, dim, 0);
			LAYER("self_attn.q_proj.weight", q, 2, dim, dim);
			LAYER("self_attn.k_proj.weight", k, 2, kv_dim, dim);
			LAYER("self_attn.v_proj.weight", wv + (size_t)l * kv_dim * dim, 2, kv_dim, dim);
			LAYER("self_attn.o_proj.weight", wo + (size_t)l * dim * dim, 2, dim, dim);
			LAYER("post_attention_layernorm.weight", rms_ffn + (size_t)l * dim, 1, dim, 0);
			LAYER("mlp.gate_proj.weight", w1 + (size_t)l * hidden * dim, 2, hidden, dim);
			LAYER("mlp.down_proj.weight", w2 + (size_t)l * dim * hidden, 2, dim, hidden);
			LAYER("mlp.up_proj.weight", w3 + (size_t)l * hidden * dim, 2, hidden, dim);
#undef LAYER
		}
		TENSOR("model.norm.weight", rms_final, 1, dim, 0);
		if (!s.tied)
			TENSOR("lm_head.weight", wcls, 2, s.vocab, dim);
	}
#undef TENSOR
	free(perm);
	m->tensors = t;
	m->n_tensors = nt;
	m->cfg.hidden_size = s.dim;
	m->cfg.intermediate_size = s.hidden;
	m->cfg.num_hidden_layers = s.layers;
	m->cfg.num_attention_heads = s.heads;
	m->cfg.num_key_value_heads = s.kv_heads;
	m->cfg.head_dim = s.hd;
	m->cfg.vocab_size = s.vocab;
	m->cfg.rms_norm_eps = 1e-5;
	m->cfg.rope_theta = 10000.0;
	m->cfg.max_position_embeddings = s.seq;
	m->cfg.tie_word_embeddings = s.tied;
	m->cfg.bos_token_id = 1; /* llama2.c's run.c; parse_header ensures vocab_size >= 3 */
	m->cfg.eos_token_id = 2;
	return 0;
}

int dps_convert_llama2c(const char *model_path, const char *tokenizer_path, const char *outdir,
			enum dps_st_dtype dt, char *err, size_t errlen)
{
	unsigned char hdr[DPS_LLAMA2C_HEADER_BYTES];
	struct dps_convert_model m = { 0 };
	struct llama2c_shape s;
	void *map = MAP_FAILED;
	char path[4096];
	struct stat st;
	int fd, rc;

	fd = open(model_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", model_path, strerror(errno));
		return rc;
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		rc = -EINVAL;
		snprintf(err, errlen, "%s: not a regular file", model_path);
		goto out;
	}
	if (pread(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr)) {
		rc = -EINVAL;
		snprintf(err, errlen, "%s: not a llama2.c checkpoint (no %d-byte header)", model_path,
			 DPS_LLAMA2C_HEADER_BYTES);
		goto out;
	}
	/* Refuse a bad header before mapping anything it sizes. */
	rc = parse_header(hdr, (uint64_t)st.st_size, model_path, &s, err, errlen);
	if (rc)
		goto out;
	/*
	 * A private writable mapping: the permutation of wq and wk copies only their pages, the
	 * rest is read from the page cache as the writer streams it, so a checkpoint larger than
	 * memory converts. The file must not shrink meanwhile (that would be SIGBUS).
	 */
	map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		rc = -errno;
		snprintf(err, errlen, "%s: cannot map %llu bytes: %s", model_path,
			 (unsigned long long)st.st_size, strerror(errno));
		goto out;
	}
	rc = dps_convert_llama2c_mem(map, (size_t)st.st_size, dt, model_path, &m, err, errlen);
	if (rc)
		goto out;
	if (mkdir(outdir, 0755) && errno != EEXIST) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", outdir, strerror(errno));
		goto out;
	}
	snprintf(path, sizeof(path), "%s/model.safetensors", outdir);
	rc = dps_st_write(path, m.tensors, m.n_tensors);
	if (rc) {
		snprintf(err, errlen, "%s: %s", path, dps_strerror(rc));
		goto out;
	}
	snprintf(path, sizeof(path), "%s/config.json", outdir);
	rc = dps_model_config_save(&m.cfg, path);
	if (rc) {
		snprintf(err, errlen, "%s: %s", path, dps_strerror(rc));
		goto out;
	}
	if (tokenizer_path) {
		snprintf(path, sizeof(path), "%s/tokenizer.bin", outdir);
		rc = copy_file(tokenizer_path, path);
		if (rc)
			snprintf(err, errlen, "copying %s to %s: %s", tokenizer_path, path,
				 dps_strerror(rc));
	}
out:
	dps_convert_model_free(&m);
	if (map != MAP_FAILED)
		munmap(map, (size_t)st.st_size);
	close(fd);
	return rc;
}

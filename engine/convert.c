/* SPDX-License-Identifier: MIT */
/*
 * engine/convert.c - the llama2.c importer (see convert.h).
 */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "common/dps.h"
#include "engine/ckpt.h"
#include "engine/convert.h"
#include "engine/model_config.h"

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

int dps_convert_llama2c(const char *model_path, const char *tokenizer_path, const char *outdir,
			enum dps_st_dtype dt, char *err, size_t errlen)
{
	int32_t h[7];
	int dim, hidden, layers, heads, kv_heads, vocab, seq, tied, hd, kv_dim;
	struct dps_model_config cfg = { 0 };
	struct dps_st_writer_tensor *t = NULL;
	float *w = NULL, *perm = NULL;
	size_t expect, nt = 0;
	char path[4096];
	long size;
	FILE *f;
	int rc = -EINVAL;

	f = fopen(model_path, "rb");
	if (!f) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", model_path, strerror(errno));
		return rc;
	}
	if (fread(h, sizeof(h), 1, f) != 1 || fseek(f, 0, SEEK_END) || (size = ftell(f)) < 28) {
		snprintf(err, errlen, "%s: not a llama2.c checkpoint (no 28-byte header)", model_path);
		goto out;
	}
	dim = h[0], hidden = h[1], layers = h[2], heads = h[3], kv_heads = h[4], seq = h[6];
	tied = h[5] > 0;
	vocab = tied ? h[5] : h[5] == INT32_MIN ? 0 : -h[5];
	if (dim < 2 || dim > 65536 || hidden < 1 || hidden > 262144 || layers < 1 || layers > 1024 ||
	    heads < 1 || kv_heads < 1 || heads % kv_heads || dim % heads || (dim / heads) % 2 ||
	    vocab < 1 || vocab > (1 << 24) || seq < 1 || seq > (1 << 24)) {
		snprintf(err, errlen, "%s: implausible header (dim %d, hidden %d, layers %d, heads %d, "
			 "kv heads %d, vocab %d, seq %d)", model_path, dim, hidden, layers, heads,
			 kv_heads, vocab, seq);
		goto out;
	}
	hd = dim / heads;
	kv_dim = kv_heads * hd;
	/* Floats: embedding, per layer norms and projections, final norm, two rope tables. */
	expect = (size_t)vocab * dim + (size_t)layers * ((size_t)2 * dim + (size_t)dim * dim * 2 +
	       (size_t)kv_dim * dim * 2 + (size_t)hidden * dim * 3) + dim + (size_t)seq * hd;
	if (!tied)
		expect += (size_t)vocab * dim;
	if ((size_t)size != 28 + expect * 4) {
		snprintf(err, errlen, "%s: %ld bytes but the header implies %zu", model_path, size,
			 28 + expect * 4);
		goto out;
	}
	w = malloc(expect * sizeof(float));
	perm = malloc((size_t)dim * dim * sizeof(float));
	t = calloc((size_t)layers * 9 + 3, sizeof(*t));
	if (!w || !perm || !t) {
		rc = -ENOMEM;
		goto out;
	}
	if (fseek(f, 28, SEEK_SET) || fread(w, sizeof(float), expect, f) != expect) {
		snprintf(err, errlen, "%s: read failed", model_path);
		rc = -EIO;
		goto out;
	}
	if (mkdir(outdir, 0755) && errno != EEXIST) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", outdir, strerror(errno));
		goto out;
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
		const float *emb = w;
		const float *rms_att = emb + (size_t)vocab * dim;
		float *wq = (float *)rms_att + (size_t)layers * dim;
		float *wk = wq + (size_t)layers * dim * dim;
		const float *wv = wk + (size_t)layers * kv_dim * dim;
		const float *wo = wv + (size_t)layers * kv_dim * dim;
		const float *rms_ffn = wo + (size_t)layers * dim * dim;
		const float *w1 = rms_ffn + (size_t)layers * dim;
		const float *w2 = w1 + (size_t)layers * hidden * dim;
		const float *w3 = w2 + (size_t)layers * dim * hidden;
		const float *rms_final = w3 + (size_t)layers * hidden * dim;
		const float *wcls = rms_final + dim + (size_t)seq * hd;
		char nm[128];

		TENSOR("model.embed_tokens.weight", emb, 2, vocab, dim);
		for (int l = 0; l < layers; l++) {
			float *q = wq + (size_t)l * dim * dim, *k = wk + (size_t)l * kv_dim * dim;

			/* Permute in place through the scratch buffer. */
			permute_rows(perm, q, heads, hd, dim);
			memcpy(q, perm, (size_t)dim * dim * sizeof(float));
			permute_rows(perm, k, kv_heads, hd, dim);
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
		if (!tied)
			TENSOR("lm_head.weight", wcls, 2, vocab, dim);
	}
#undef TENSOR
	snprintf(path, sizeof(path), "%s/model.safetensors", outdir);
	rc = dps_st_write(path, t, (int)nt);
	if (rc) {
		snprintf(err, errlen, "%s: %s", path, dps_strerror(rc));
		goto out;
	}
	cfg.hidden_size = dim;
	cfg.intermediate_size = hidden;
	cfg.num_hidden_layers = layers;
	cfg.num_attention_heads = heads;
	cfg.num_key_value_heads = kv_heads;
	cfg.head_dim = hd;
	cfg.vocab_size = vocab;
	cfg.rms_norm_eps = 1e-5;
	cfg.rope_theta = 10000.0;
	cfg.max_position_embeddings = seq;
	cfg.tie_word_embeddings = tied;
	cfg.bos_token_id = 1;
	cfg.eos_token_id = vocab > 2 ? 2 : 0;
	snprintf(path, sizeof(path), "%s/config.json", outdir);
	rc = dps_model_config_save(&cfg, path);
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
	fclose(f);
	free(w);
	free(perm);
	free(t);
	return rc;
}

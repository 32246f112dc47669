/* SPDX-License-Identifier: MIT */
/*
 * engine/model/gguf.c - the GGUF exporter (see gguf.h). The layout written, from the GGUF v3
 * specification: "GGUF", u32 version 3, i64 tensor count, i64 key-value count; the key-value
 * pairs (u64-length string key, i32 type, value; arrays: i32 element type, u64 count,
 * elements); the tensor infos (name, u32 dims, i64 extent of each dimension fastest first,
 * i32 ggml type, u64 offset into the data); zero padding to 32 bytes; the data, every tensor
 * starting on a multiple of 32. Little-endian throughout (the machines this runs on are).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/model/ckpt.h"
#include "engine/model/gguf.h"
#include "engine/model/tok_llama2.h"

#define GGUF_ALIGN 32
enum { GT_U32 = 4, GT_I32 = 5, GT_F32 = 6, GT_BOOL = 7, GT_STRING = 8, GT_ARRAY = 9 };
enum { GGML_F32 = 0 };
/* llama.cpp's token types. */
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_BYTE = 6 };

/* One tensor to write: its GGUF name, its checkpoint name and shape (rows, cols; cols 0 for a
 * vector), and the heads whose rows are permuted (0: none). */
struct item {
	char name[64], src[128];
	uint64_t rows, cols;
	int permute_heads;
};

struct out {
	FILE *f;
	int rc;
	uint64_t n_kv;   /* key-value pairs written */
};

static void put(struct out *o, const void *p, size_t n)
{
	if (!o->rc && fwrite(p, 1, n, o->f) != n)
		o->rc = -EIO;
}

static void put_u32(struct out *o, uint32_t v) { put(o, &v, 4); }
static void put_i32(struct out *o, int32_t v) { put(o, &v, 4); }
static void put_u64(struct out *o, uint64_t v) { put(o, &v, 8); }
static void put_f32(struct out *o, float v) { put(o, &v, 4); }

static void put_str(struct out *o, const char *s, size_t n)
{
	put_u64(o, n);
	put(o, s, n);
}

static void key(struct out *o, const char *k, int type)
{
	o->n_kv++;
	put_str(o, k, strlen(k));
	put_i32(o, type);
}

static void kv_u32(struct out *o, const char *k, uint32_t v)
{
	key(o, k, GT_U32);
	put_u32(o, v);
}

static void kv_f32(struct out *o, const char *k, float v)
{
	key(o, k, GT_F32);
	put_f32(o, v);
}

static void kv_bool(struct out *o, const char *k, int v)
{
	const uint8_t b = v != 0;

	key(o, k, GT_BOOL);
	put(o, &b, 1);
}

static void kv_str(struct out *o, const char *k, const char *v)
{
	key(o, k, GT_STRING);
	put_str(o, v, strlen(v));
}

static void kv_array(struct out *o, const char *k, int elem, uint64_t n)
{
	key(o, k, GT_ARRAY);
	put_i32(o, elem);
	put_u64(o, n);
}

/* The GGUF text of token id of t: "▁" for each space, llama.cpp's names for the specials. */
static char *token_text(const struct dps_tok_llama2 *t, int id, size_t *n)
{
	const char *p = t->vocab[id];
	const size_t len = t->vocab_len[id];
	char *s;
	size_t k = 0;

	if (id == t->bos_id)
		p = "<s>";
	else if (id == t->eos_id)
		p = "</s>";
	if (p != t->vocab[id]) {
		*n = strlen(p);
		return strdup(p);
	}
	s = malloc(3 * len + 1);
	if (!s)
		return NULL;
	for (size_t i = 0; i < len; i++) {
		if (p[i] == ' ') {
			memcpy(s + k, "\xe2\x96\x81", 3);
			k += 3;
		} else {
			s[k++] = p[i];
		}
	}
	s[k] = '\0';
	*n = k;
	return s;
}

static int token_type(const struct dps_tok_llama2 *t, int id)
{
	if (id == t->bos_id || id == t->eos_id)
		return TOK_CONTROL;
	if (id == 0 && !strcmp(t->vocab[0], "<unk>"))
		return TOK_UNKNOWN;
	if (t->byte_fallback && id >= 3 && id < 3 + 256)
		return TOK_BYTE;
	return TOK_NORMAL;
}

static void put_vocab(struct out *o, const struct dps_tok_llama2 *t,
		      const struct dps_model_config *c)
{
	kv_str(o, "tokenizer.ggml.model", "llama");
	kv_array(o, "tokenizer.ggml.tokens", GT_STRING, (uint64_t)c->vocab_size);
	for (int i = 0; i < c->vocab_size && !o->rc; i++) {
		size_t n;
		char *s = token_text(t, i, &n);

		if (!s) {
			o->rc = -ENOMEM;
			break;
		}
		put_str(o, s, n);
		free(s);
	}
	kv_array(o, "tokenizer.ggml.scores", GT_F32, (uint64_t)c->vocab_size);
	for (int i = 0; i < c->vocab_size; i++)
		put_f32(o, t->scores[i]);
	kv_array(o, "tokenizer.ggml.token_type", GT_I32, (uint64_t)c->vocab_size);
	for (int i = 0; i < c->vocab_size; i++)
		put_i32(o, token_type(t, i));
	kv_u32(o, "tokenizer.ggml.bos_token_id", (uint32_t)t->bos_id);
	kv_u32(o, "tokenizer.ggml.eos_token_id", (uint32_t)t->eos_id);
	kv_u32(o, "tokenizer.ggml.unknown_token_id", 0);
	kv_bool(o, "tokenizer.ggml.add_bos_token", 1);
	kv_bool(o, "tokenizer.ggml.add_eos_token", 0);
}

static void add(struct item *it, int *n, const char *name, const char *src, uint64_t rows,
		uint64_t cols, int permute_heads)
{
	snprintf(it[*n].name, sizeof(it[*n].name), "%s", name);
	snprintf(it[*n].src, sizeof(it[*n].src), "%s", src);
	it[*n].rows = rows;
	it[*n].cols = cols;
	it[*n].permute_heads = permute_heads;
	(*n)++;
}

/* The tensors of a dense Llama, in llama.cpp's names. Returns how many (it has room). */
static int items_of(const struct dps_model_config *c, struct item *it)
{
	const uint64_t dim = (uint64_t)c->hidden_size, im = (uint64_t)c->intermediate_size;
	const uint64_t qd = (uint64_t)c->num_attention_heads * (uint64_t)c->head_dim;
	const uint64_t kvd = (uint64_t)c->num_key_value_heads * (uint64_t)c->head_dim;
	char g[64], s[128];
	int n = 0;

	add(it, &n, "token_embd.weight", "model.embed_tokens.weight", (uint64_t)c->vocab_size, dim, 0);
	add(it, &n, "output_norm.weight", "model.norm.weight", dim, 0, 0);
	if (!c->tie_word_embeddings)
		add(it, &n, "output.weight", "lm_head.weight", (uint64_t)c->vocab_size, dim, 0);
	for (int l = 0; l < c->num_hidden_layers; l++) {
		static const struct {
			const char *gg, *hf;
		} map[] = {
			{ "attn_norm", "input_layernorm" }, { "attn_q", "self_attn.q_proj" },
			{ "attn_k", "self_attn.k_proj" }, { "attn_v", "self_attn.v_proj" },
			{ "attn_output", "self_attn.o_proj" }, { "ffn_norm", "post_attention_layernorm" },
			{ "ffn_gate", "mlp.gate_proj" }, { "ffn_up", "mlp.up_proj" },
			{ "ffn_down", "mlp.down_proj" },
		};
		const uint64_t rows[] = { dim, qd, kvd, kvd, dim, dim, im, im, dim };
		const uint64_t cols[] = { 0, dim, dim, dim, qd, 0, dim, dim, im };
		const int heads[] = { 0, c->num_attention_heads, c->num_key_value_heads, 0, 0, 0, 0, 0, 0 };

		for (size_t k = 0; k < sizeof(map) / sizeof(map[0]); k++) {
			snprintf(g, sizeof(g), "blk.%d.%s.weight", l, map[k].gg);
			snprintf(s, sizeof(s), "model.layers.%d.%s.weight", l, map[k].hf);
			add(it, &n, g, s, rows[k], cols[k], heads[k]);
		}
	}
	return n;
}

static uint64_t item_bytes(const struct item *it)
{
	return it->rows * (it->cols ? it->cols : 1) * sizeof(float);
}

static uint64_t align_up(uint64_t v)
{
	return (v + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
}

static void pad_to(struct out *o, uint64_t at)
{
	static const char zero[GGUF_ALIGN];
	long here = ftell(o->f);

	if (here < 0) {
		o->rc = -EIO;
		return;
	}
	if ((uint64_t)here < at)
		put(o, zero, (size_t)(at - (uint64_t)here));
}

/* Hugging Face's half-split rows back to adjacent pairs: row h*hd + 2i + c of dst is row
 * h*hd + c*hd/2 + i of src (the inverse of convert.c's permutation). */
static void unpermute_rows(float *dst, const float *src, int heads, int hd, uint64_t cols)
{
	for (int h = 0; h < heads; h++)
		for (int c = 0; c < 2; c++)
			for (int i = 0; i < hd / 2; i++)
				memcpy(dst + ((size_t)h * hd + 2 * (size_t)i + c) * cols,
				       src + ((size_t)h * hd + (size_t)c * (hd / 2) + i) * cols,
				       sizeof(float) * cols);
}

int dps_gguf_export(const char *dir, const char *path, char *err, size_t errlen)
{
	struct dps_ckpt ck;
	struct dps_tok_llama2 tok;
	struct dps_model_config *c = &ck.cfg;
	struct out o = { 0 };
	struct item *it = NULL;
	float *buf = NULL, *tmp = NULL;
	char tpath[4200];
	uint64_t off = 0, biggest = 0, data_at;
	int n, rc, have_tok = 0;
	const char *base;

	rc = dps_ckpt_open(&ck, dir, err, errlen);
	if (rc)
		return rc;
	if (c->num_local_experts) {
		snprintf(err, errlen, "%s: a mixture-of-experts model (num_local_experts %d) has no "
			 "GGUF export here; only dense Llama models do", dir, c->num_local_experts);
		rc = -DPS_ECONFIG;
		goto out;
	}
	if (c->eagle3) {
		snprintf(err, errlen, "%s: an Eagle3 draft has no GGUF export (llama.cpp runs no "
			 "Eagle3 drafts)", dir);
		rc = -DPS_ECONFIG;
		goto out;
	}
	/* The export writes a plain Llama; anything a plain Llama does not compute is refused. */
	if (c->arch != DPS_ARCH_LLAMA || c->qkv_bias || c->o_bias || c->mlp_bias ||
	    c->rope.kind != DPS_ROPE_DEFAULT || c->sliding_window) {
		snprintf(err, errlen, "%s: only a plain Llama (no biases, windows or rope_scaling) "
			 "has a GGUF export here; this is %s%s%s%s", dir, dps_arch_name(c->arch),
			 c->qkv_bias || c->o_bias || c->mlp_bias ? " with biases" : "",
			 c->rope.kind != DPS_ROPE_DEFAULT ? " with rope_scaling" : "",
			 c->sliding_window ? " with a sliding window" : "");
		rc = -DPS_ECONFIG;
		goto out;
	}
	snprintf(tpath, sizeof(tpath), "%s/tokenizer.bin", dir);
	if (!access(tpath, R_OK)) {
		rc = dps_tok_llama2_load(&tok, tpath, c, err, errlen);
		if (rc)
			goto out;
		have_tok = 1;
	}
	it = calloc(3 + 9 * (size_t)c->num_hidden_layers, sizeof(*it));
	if (!it) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	n = items_of(c, it);
	o.f = fopen(path, "wb");
	if (!o.f) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		goto out;
	}
	base = strrchr(dir, '/');
	base = base && base[1] ? base + 1 : dir;
	put(&o, "GGUF", 4);
	put_u32(&o, 3);
	put_u64(&o, (uint64_t)n);
	put_u64(&o, 0); /* the key-value count, written once they are */
	kv_str(&o, "general.architecture", "llama");
	kv_str(&o, "general.name", base);
	kv_u32(&o, "general.file_type", 0); /* all F32 */
	kv_u32(&o, "llama.context_length", (uint32_t)c->max_position_embeddings);
	kv_u32(&o, "llama.embedding_length", (uint32_t)c->hidden_size);
	kv_u32(&o, "llama.block_count", (uint32_t)c->num_hidden_layers);
	kv_u32(&o, "llama.feed_forward_length", (uint32_t)c->intermediate_size);
	kv_u32(&o, "llama.attention.head_count", (uint32_t)c->num_attention_heads);
	kv_u32(&o, "llama.attention.head_count_kv", (uint32_t)c->num_key_value_heads);
	kv_u32(&o, "llama.rope.dimension_count", (uint32_t)c->head_dim);
	kv_f32(&o, "llama.rope.freq_base", (float)c->rope_theta);
	kv_f32(&o, "llama.attention.layer_norm_rms_epsilon", (float)c->rms_norm_eps);
	kv_u32(&o, "llama.vocab_size", (uint32_t)c->vocab_size);
	if (c->head_dim * c->num_attention_heads != c->hidden_size) {
		kv_u32(&o, "llama.attention.key_length", (uint32_t)c->head_dim);
		kv_u32(&o, "llama.attention.value_length", (uint32_t)c->head_dim);
	}
	if (have_tok)
		put_vocab(&o, &tok, c);
	else
		kv_str(&o, "tokenizer.ggml.model", "no_vocab");
	/* The key-value count, now that they are written. */
	if (!o.rc && fseek(o.f, 16, SEEK_SET))
		o.rc = -EIO;
	put_u64(&o, o.n_kv);
	if (!o.rc && fseek(o.f, 0, SEEK_END))
		o.rc = -EIO;
	for (int i = 0; i < n; i++) {
		/* Dimensions fastest first: a (rows, cols) matrix is {cols, rows}. */
		put_str(&o, it[i].name, strlen(it[i].name));
		put_u32(&o, it[i].cols ? 2 : 1);
		if (it[i].cols)
			put_u64(&o, it[i].cols);
		put_u64(&o, it[i].rows);
		put_i32(&o, GGML_F32);
		put_u64(&o, off);
		off = align_up(off + item_bytes(&it[i]));
		if (item_bytes(&it[i]) > biggest)
			biggest = item_bytes(&it[i]);
	}
	if (o.rc)
		goto io;
	{
		const long here = ftell(o.f);

		data_at = align_up(here < 0 ? 0 : (uint64_t)here);
	}
	pad_to(&o, data_at);
	buf = malloc(biggest ? biggest : 1);
	tmp = malloc(biggest ? biggest : 1);
	if (!buf || !tmp) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory (%llu bytes for one tensor)",
			 (unsigned long long)biggest);
		goto out;
	}
	off = 0;
	for (int i = 0; i < n && !o.rc; i++) {
		const uint64_t shape[2] = { it[i].rows, it[i].cols };
		const int nd = it[i].cols ? 2 : 1;

		rc = dps_ckpt_load_range(&ck, it[i].src, nd, shape, 0, 0, it[i].rows,
					 it[i].permute_heads ? tmp : buf, err, errlen);
		if (rc)
			goto out;
		if (it[i].permute_heads)
			unpermute_rows(buf, tmp, it[i].permute_heads, c->head_dim, it[i].cols);
		pad_to(&o, data_at + off);
		put(&o, buf, (size_t)item_bytes(&it[i]));
		off = align_up(off + item_bytes(&it[i]));
	}
io:
	if (!o.rc && fflush(o.f))
		o.rc = -EIO;
	rc = o.rc;
	if (rc)
		snprintf(err, errlen, "%s: %s", path, dps_strerror(rc));
out:
	if (o.f && fclose(o.f) && !rc) {
		rc = -EIO;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
	}
	if (rc && o.f)
		unlink(path);
	free(buf);
	free(tmp);
	free(it);
	if (have_tok)
		dps_tok_llama2_free(&tok);
	dps_ckpt_close(&ck);
	return rc;
}

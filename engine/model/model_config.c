/* SPDX-License-Identifier: MIT */
/*
 * engine/model/model_config.c - config.json parsing, validation and writing (see model_config.h).
 */
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/model/model_config.h"

/* Reads integer field name into *out; a missing optional field keeps *out. */
static int get_int(const json_t *root, const char *name, int required, long lo, long hi, int *out,
		   char *err, size_t errlen)
{
	const json_t *v = json_object_get(root, name);
	json_int_t i;

	if (!v || json_is_null(v)) {
		if (!required)
			return 0;
		snprintf(err, errlen, "config.json: missing field '%s'", name);
		return -EINVAL;
	}
	if (!json_is_integer(v)) {
		snprintf(err, errlen, "config.json: '%s' must be an integer", name);
		return -EINVAL;
	}
	i = json_integer_value(v);
	if (i < lo || i > hi) {
		snprintf(err, errlen, "config.json: '%s' = %lld is outside [%ld, %ld]", name,
			 (long long)i, lo, hi);
		return -EINVAL;
	}
	*out = (int)i;
	return 0;
}

/*
 * eos_token_id: one id or a list of them (Llama 3.x, GPT-OSS), in file (named in messages).
 * ids gets at most DPS_CFG_MAX_EOS, *n their count (0 when absent or null).
 */
int dps_cfg_get_eos(const json_t *root, const char *file, int *ids, int *n, char *err,
		    size_t errlen)
{
	const json_t *v = json_object_get(root, "eos_token_id"), *e;
	size_t i;

	*n = 0;
	if (!v || json_is_null(v))
		return 0;
	if (json_is_integer(v)) {
		v = json_pack("[O]", v);
		if (!v)
			return -ENOMEM;
	} else if (json_is_array(v)) {
		json_incref((json_t *)v);
	} else {
		snprintf(err, errlen, "%s: 'eos_token_id' must be an integer or a list of them", file);
		return -EINVAL;
	}
	if (!json_array_size(v) || json_array_size(v) > DPS_CFG_MAX_EOS) {
		snprintf(err, errlen, "%s: 'eos_token_id' must list 1 to %d ids", file,
			 DPS_CFG_MAX_EOS);
		json_decref((json_t *)v);
		return -EINVAL;
	}
	json_array_foreach(v, i, e) {
		if (!json_is_integer(e) || json_integer_value(e) < 0 ||
		    json_integer_value(e) >= DPS_CFG_MAX_VOCAB) {
			snprintf(err, errlen, "%s: 'eos_token_id'[%zu] must be a token id", file, i);
			json_decref((json_t *)v);
			return -EINVAL;
		}
		ids[(*n)++] = (int)json_integer_value(e);
	}
	json_decref((json_t *)v);
	return 0;
}

static int get_real(const json_t *root, const char *name, double lo, double hi, double *out,
		    char *err, size_t errlen)
{
	const json_t *v = json_object_get(root, name);

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v)) {
		snprintf(err, errlen, "config.json: '%s' must be a number", name);
		return -EINVAL;
	}
	*out = json_number_value(v);
	if (!(*out >= lo && *out <= hi)) {
		snprintf(err, errlen, "config.json: '%s' = %g is outside [%g, %g]", name, *out, lo, hi);
		return -EINVAL;
	}
	return 0;
}

int dps_model_config_parse(const char *buf, size_t len, struct dps_model_config *c, char *err,
			   size_t errlen)
{
	json_error_t jerr;
	const json_t *v;
	json_t *root;
	int rc = -EINVAL;

	memset(c, 0, sizeof(*c));
	c->bos_token_id = 1;
	c->eos_token_id = 2;
	c->num_key_value_heads = -1;
	c->head_dim = -1;
	root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		snprintf(err, errlen, "config.json: not valid JSON: %s (line %d, column %d)", jerr.text,
			 jerr.line, jerr.column);
		return -EINVAL;
	}
	if (!json_is_object(root)) {
		snprintf(err, errlen, "config.json: not a JSON object");
		goto out;
	}
	if (dps_arch_select(root, c, err, errlen))
		goto out;
	if (get_int(root, "hidden_size", 1, 1, DPS_CFG_MAX_DIM, &c->hidden_size, err, errlen) ||
	    get_int(root, "intermediate_size", 1, 1, DPS_CFG_MAX_DIM, &c->intermediate_size, err,
		    errlen) ||
	    get_int(root, "num_hidden_layers", 1, 1, DPS_CFG_MAX_LAYERS, &c->num_hidden_layers, err,
		    errlen) ||
	    get_int(root, "num_attention_heads", 1, 1, DPS_CFG_MAX_DIM, &c->num_attention_heads,
		    err, errlen) ||
	    get_int(root, "num_key_value_heads", 0, 1, DPS_CFG_MAX_DIM, &c->num_key_value_heads,
		    err, errlen) ||
	    get_int(root, "head_dim", 0, 2, DPS_CFG_MAX_DIM, &c->head_dim, err, errlen) ||
	    get_int(root, "vocab_size", 1, 1, DPS_CFG_MAX_VOCAB, &c->vocab_size, err, errlen) ||
	    get_int(root, "max_position_embeddings", 0, 1, DPS_CFG_MAX_POS,
		    &c->max_position_embeddings, err, errlen) ||
	    get_int(root, "bos_token_id", 0, 0, DPS_CFG_MAX_VOCAB, &c->bos_token_id, err, errlen) ||
	    dps_cfg_get_eos(root, "config.json", c->eos_ids, &c->n_eos, err, errlen) ||
	    get_real(root, "rms_norm_eps", 1e-30, 1.0, &c->rms_norm_eps, err, errlen) ||
	    get_real(root, "rope_theta", 1.0, 1e12, &c->rope_theta, err, errlen))
		goto out;
	if (get_int(root, "draft_vocab_size", 0, 1, DPS_CFG_MAX_VOCAB, &c->draft_vocab_size, err,
		    errlen))
		goto out;
	v = json_object_get(root, "eagle_aux_hidden_state_layer_ids");
	if (!v && json_is_object(json_object_get(root, "eagle_config")))
		v = json_object_get(json_object_get(root, "eagle_config"),
				    "eagle_aux_hidden_state_layer_ids");
	if (v && !json_is_null(v)) {
		size_t i;
		json_t *e;

		if (!json_is_array(v) || json_array_size(v) != 3) {
			snprintf(err, errlen, "config.json: 'eagle_aux_hidden_state_layer_ids' must be "
				 "a list of three target layer indices");
			goto out;
		}
		json_array_foreach(v, i, e) {
			json_int_t l = json_is_integer(e) ? json_integer_value(e) : -1;

			if (l < 0 || l >= DPS_CFG_MAX_LAYERS) {
				snprintf(err, errlen, "config.json: 'eagle_aux_hidden_state_layer_ids' "
					 "entry %zu is not a layer index", i);
				goto out;
			}
			c->aux_layers[i] = (int)l;
		}
		c->n_aux = 3;
		c->eagle3 = 1;
	}
	if (c->draft_vocab_size > c->vocab_size) {
		snprintf(err, errlen, "config.json: draft_vocab_size %d is larger than vocab_size %d",
			 c->draft_vocab_size, c->vocab_size);
		goto out;
	}
	v = json_object_get(root, "tie_word_embeddings");
	if (v && !json_is_null(v)) {
		if (!json_is_boolean(v)) {
			snprintf(err, errlen, "config.json: 'tie_word_embeddings' must be true or false");
			goto out;
		}
		c->tie_word_embeddings = json_is_true(v);
	}
	dps_arch_shape_defaults(c);
	if (c->head_dim < 0) {
		if (c->hidden_size % c->num_attention_heads) {
			snprintf(err, errlen,
				 "config.json: hidden_size %d is not a multiple of num_attention_heads "
				 "%d and no head_dim is given", c->hidden_size, c->num_attention_heads);
			goto out;
		}
		c->head_dim = c->hidden_size / c->num_attention_heads;
	}
	if (c->num_attention_heads % c->num_key_value_heads) {
		snprintf(err, errlen,
			 "config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d",
			 c->num_attention_heads, c->num_key_value_heads);
		goto out;
	}
	if (c->head_dim % 2) {
		snprintf(err, errlen, "config.json: head_dim %d must be even (rotary embedding)",
			 c->head_dim);
		goto out;
	}
	if ((long long)c->num_attention_heads * c->head_dim > DPS_CFG_MAX_DIM) {
		snprintf(err, errlen, "config.json: num_attention_heads x head_dim is too large");
		goto out;
	}
	if (dps_arch_read(root, c, err, errlen))
		goto out;
	if (c->n_eos)
		c->eos_token_id = c->eos_ids[0];
	else if (c->arch == DPS_ARCH_LLAMA || c->arch == DPS_ARCH_MISTRAL ||
		 c->arch == DPS_ARCH_EAGLE3)
		c->eos_ids[c->n_eos++] = c->eos_token_id; /* their classes' default, 2 */
	else
		c->eos_token_id = -1; /* Qwen's and GPT-OSS's classes have none: the end ids
				       * come from generation_config.json then */
	for (int i = 0; i < c->n_eos; i++)
		if (c->eos_ids[i] >= c->vocab_size)
			c->bos_token_id = c->vocab_size; /* reported below */
	if (c->bos_token_id >= c->vocab_size || c->eos_token_id >= c->vocab_size) {
		snprintf(err, errlen, "config.json: bos/eos token ids must be below vocab_size %d",
			 c->vocab_size);
		goto out;
	}
	rc = 0;
out:
	json_decref(root);
	return rc;
}

int dps_model_config_load(const char *dir, struct dps_model_config *c, char *err, size_t errlen)
{
	char path[4096], *buf = NULL;
	long n;
	FILE *f;
	int rc;

	snprintf(path, sizeof(path), "%s/config.json", dir);
	f = fopen(path, "rb");
	if (!f) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return rc;
	}
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || n > (1 << 20) || fseek(f, 0, SEEK_SET)) {
		fclose(f);
		snprintf(err, errlen, "%s: unreadable or larger than 1 MiB", path);
		return -EINVAL;
	}
	buf = malloc((size_t)n + 1);
	if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		fclose(f);
		snprintf(err, errlen, "%s: read failed", path);
		return -EIO;
	}
	fclose(f);
	rc = dps_model_config_parse(buf, (size_t)n, c, err, errlen);
	free(buf);
	if (rc) {
		/* The parser's messages start with "config.json: "; name the directory too. */
		char msg[512];

		snprintf(msg, sizeof(msg), "%s/%s", dir, err);
		snprintf(err, errlen, "%s", msg);
	}
	return rc;
}

int dps_gen_config_load(const char *dir, struct dps_gen_config *g, char *err, size_t errlen)
{
	char path[4096];
	json_error_t je;
	json_t *root, *v;
	int rc = -EINVAL;

	memset(g, 0, sizeof(*g));
	if ((size_t)snprintf(path, sizeof(path), "%s/generation_config.json", dir) >= sizeof(path))
		return 0;
	if (access(path, F_OK))
		return 0;
	root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!root || !json_is_object(root)) {
		snprintf(err, errlen, "%s: not a JSON object%s%s", path, root ? "" : ": ",
			 root ? "" : je.text);
		json_decref(root);
		return -EINVAL;
	}
	if (dps_cfg_get_eos(root, path, g->eos_ids, &g->n_eos, err, errlen))
		goto out;
	if ((v = json_object_get(root, "temperature")) && !json_is_null(v)) {
		if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 100) {
			snprintf(err, errlen, "%s: 'temperature' must be a number from 0", path);
			goto out;
		}
		g->temperature = json_number_value(v);
		g->has_temperature = 1;
	}
	if ((v = json_object_get(root, "top_p")) && !json_is_null(v)) {
		if (!json_is_number(v) || json_number_value(v) <= 0 || json_number_value(v) > 1) {
			snprintf(err, errlen, "%s: 'top_p' must be a number in (0, 1]", path);
			goto out;
		}
		g->top_p = json_number_value(v);
		g->has_top_p = 1;
	}
	if ((v = json_object_get(root, "top_k")) && !json_is_null(v)) {
		if (!json_is_integer(v) || json_integer_value(v) < -1 ||
		    json_integer_value(v) > DPS_CFG_MAX_VOCAB) {
			snprintf(err, errlen, "%s: 'top_k' must be an integer from -1", path);
			goto out;
		}
		g->top_k = json_integer_value(v) < 0 ? 0 : (int)json_integer_value(v);
		g->has_top_k = 1;
	}
	rc = 0;
out:
	json_decref(root);
	return rc;
}

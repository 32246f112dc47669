/* SPDX-License-Identifier: MIT */
/*
 * engine/model/chat.c - a model's chat template, loaded and rendered as transformers'
 * apply_chat_template does: the template of tokenizer_config.json (one string, or a list of
 * {"name", "template"}; a chat_template.jinja beside it wins), the variables messages, tools
 * and documents (None when not given), add_generation_prompt, the special tokens of the
 * config as strings (an AddedToken dict gives its "content"), and the caller's keyword
 * arguments over all of them. Called by the frontend's chat requests and the tests.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/model/chat.h"
#include "engine/model/jinja.h"

struct chat_tpl {
	char *name; /* "default" for a single template */
	struct dps_jinja *t;
};

struct dps_chat {
	struct chat_tpl *tpl;
	size_t n;
	json_t *tokens; /* the special tokens, as strings */
};

static const char *const special_tokens[] = { "bos_token", "eos_token", "unk_token",
					      "sep_token", "pad_token", "cls_token",
					      "mask_token", NULL };

void dps_chat_free(struct dps_chat *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->n; i++) {
		free(c->tpl[i].name);
		dps_jinja_free(c->tpl[i].t);
	}
	free(c->tpl);
	json_decref(c->tokens);
	free(c);
}

static int add_template(struct dps_chat *c, const char *name, const char *src, size_t len,
			const char *where, char *err, size_t errlen)
{
	struct chat_tpl *n = realloc(c->tpl, (c->n + 1) * sizeof(*n));
	char msg[512];
	int rc;

	if (!n)
		return -ENOMEM;
	c->tpl = n;
	n = &c->tpl[c->n];
	n->name = strdup(name);
	if (!n->name)
		return -ENOMEM;
	rc = dps_jinja_parse(&n->t, src, len, msg, sizeof(msg));
	if (rc) {
		free(n->name);
		if (rc == -EINVAL)
			snprintf(err, errlen, "%s: chat template '%s': %s", where, name, msg);
		return rc;
	}
	c->n++;
	return 0;
}

/* The special tokens of the config: strings, or AddedToken dicts with their content. */
static int read_tokens(struct dps_chat *c, json_t *cfg, const char *where, char *err,
		       size_t errlen)
{
	c->tokens = json_object();
	if (!c->tokens)
		return -ENOMEM;
	for (int i = 0; special_tokens[i]; i++) {
		json_t *v = json_object_get(cfg, special_tokens[i]);

		if (json_is_object(v))
			v = json_object_get(v, "content");
		if (!v || json_is_null(v))
			continue;
		if (!json_is_string(v)) {
			snprintf(err, errlen, "%s: %s must be a string or an object with a string "
				 "\"content\"", where, special_tokens[i]);
			return -EINVAL;
		}
		if (json_object_set(c->tokens, special_tokens[i], v))
			return -ENOMEM;
	}
	return 0;
}

/* Loads cfg's templates, or the text of jinja (len bytes) when it is not NULL. */
static int load(struct dps_chat **out, json_t *cfg, const char *jinja, size_t jlen,
		const char *where, char *err, size_t errlen)
{
	struct dps_chat *c = calloc(1, sizeof(*c));
	json_t *t = json_object_get(cfg, "chat_template");
	int rc;

	*out = NULL;
	if (!c)
		return -ENOMEM;
	if ((rc = read_tokens(c, cfg, where, err, errlen)))
		goto err;
	if (jinja) {
		rc = add_template(c, "default", jinja, jlen, where, err, errlen);
	} else if (json_is_string(t)) {
		rc = add_template(c, "default", json_string_value(t), json_string_length(t), where,
				  err, errlen);
	} else if (json_is_array(t)) {
		size_t i;
		json_t *e;

		json_array_foreach(t, i, e) {
			json_t *name = json_object_get(e, "name"), *src = json_object_get(e, "template");

			if (!json_is_string(name) || !json_is_string(src)) {
				snprintf(err, errlen, "%s: chat_template[%zu] needs a string \"name\" "
					 "and \"template\"", where, i);
				rc = -EINVAL;
				goto err;
			}
			if ((rc = add_template(c, json_string_value(name), json_string_value(src),
					       json_string_length(src), where, err, errlen)))
				goto err;
		}
		if (!c->n) {
			snprintf(err, errlen, "%s: chat_template is an empty list", where);
			rc = -ENOENT;
		}
	} else if (!t || json_is_null(t)) {
		snprintf(err, errlen, "%s has no chat_template", where);
		rc = -ENOENT;
	} else {
		snprintf(err, errlen, "%s: chat_template must be a string or a list", where);
		rc = -EINVAL;
	}
	if (rc)
		goto err;
	*out = c;
	return 0;
err:
	dps_chat_free(c);
	return rc;
}

int dps_chat_load_mem(struct dps_chat **out, const char *config, size_t len, char *err,
		      size_t errlen)
{
	json_error_t je;
	json_t *cfg = json_loadb(config, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
	int rc;

	*out = NULL;
	if (!cfg || !json_is_object(cfg)) {
		snprintf(err, errlen, "tokenizer_config.json: %s", cfg ? "not a JSON object" :
			 je.text);
		json_decref(cfg);
		return -EINVAL;
	}
	rc = load(out, cfg, NULL, 0, "tokenizer_config.json", err, errlen);
	json_decref(cfg);
	return rc;
}

static char *slurp(const char *path, size_t *len, int *rc)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	*rc = -errno;
	if (!f)
		return NULL;
	*rc = -EIO;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
		buf = malloc((size_t)n + 1);
		*rc = -ENOMEM;
		if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
			buf[n] = 0;
			*len = (size_t)n;
			*rc = 0;
		} else if (buf) {
			free(buf);
			buf = NULL;
			*rc = -EIO;
		}
	}
	fclose(f);
	return buf;
}

int dps_chat_load(struct dps_chat **out, const char *dir, char *err, size_t errlen)
{
	char cfg_path[4096], jinja_path[4096];
	json_error_t je;
	json_t *cfg;
	char *jinja;
	size_t jlen = 0;
	int rc;

	*out = NULL;
	snprintf(cfg_path, sizeof(cfg_path), "%s/tokenizer_config.json", dir);
	snprintf(jinja_path, sizeof(jinja_path), "%s/chat_template.jinja", dir);
	if (access(cfg_path, F_OK) != 0) {
		if (access(jinja_path, F_OK) != 0) {
			snprintf(err, errlen, "no chat template: neither %s nor %s exists",
				 jinja_path, cfg_path);
			return -ENOENT;
		}
		cfg = json_object(); /* a chat_template.jinja alone: no special tokens */
	} else {
		/* model_max_length is often 1e30 written as an integer: reals keep it */
		cfg = json_load_file(cfg_path, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
		if (!cfg) {
			snprintf(err, errlen, "%s: line %d: %s", cfg_path, je.line, je.text);
			return -EINVAL;
		}
	}
	if (!json_is_object(cfg)) {
		snprintf(err, errlen, "%s: not a JSON object", cfg_path);
		json_decref(cfg);
		return -EINVAL;
	}
	jinja = slurp(jinja_path, &jlen, &rc);
	if (!jinja && rc != -ENOENT) {
		snprintf(err, errlen, "%s: %s", jinja_path, dps_strerror(rc));
		json_decref(cfg);
		return rc;
	}
	rc = load(out, cfg, jinja, jlen, jinja ? jinja_path : cfg_path, err, errlen);
	if (rc == -ENOENT)
		snprintf(err, errlen, "no chat template: %s has no chat_template and %s does not "
			 "exist", cfg_path, jinja_path);
	free(jinja);
	json_decref(cfg);
	return rc;
}

static const struct chat_tpl *find(const struct dps_chat *c, const char *name)
{
	for (size_t i = 0; i < c->n; i++)
		if (!strcmp(c->tpl[i].name, name))
			return &c->tpl[i];
	return NULL;
}

int dps_chat_render_template(const struct dps_chat *c, const char *name, json_t *messages,
			     json_t *tools, int add_generation_prompt, json_t *extra,
			     long long now, char **out, size_t *len, char *err, size_t errlen)
{
	const struct chat_tpl *t;
	json_t *vars;
	int rc;

	*out = NULL;
	*len = 0;
	if (name)
		t = find(c, name);
	else if (tools && (t = find(c, "tool_use")))
		;
	else
		t = find(c, "default");
	if (!t) {
		if (name)
			snprintf(err, errlen, "the model has no chat template named '%s'", name);
		else
			snprintf(err, errlen, "the model has several chat templates and none is "
				 "named 'default'");
		return -EINVAL;
	}
	if (!json_is_array(messages) || (tools && !json_is_array(tools)) ||
	    (extra && !json_is_object(extra))) {
		snprintf(err, errlen, "messages and tools must be arrays, extra an object");
		return -EINVAL;
	}
	vars = json_deep_copy(c->tokens);
	if (!vars || json_object_set(vars, "messages", messages) ||
	    json_object_set_new(vars, "tools", tools ? json_incref(tools) : json_null()) ||
	    json_object_set_new(vars, "documents", json_null()) ||
	    json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt)) ||
	    (extra && json_object_update(vars, extra))) {
		json_decref(vars);
		return -ENOMEM;
	}
	rc = dps_jinja_render(t->t, vars, now, out, len, err, errlen);
	json_decref(vars);
	return rc;
}

int dps_chat_render(const struct dps_chat *c, json_t *messages, json_t *tools,
		    int add_generation_prompt, json_t *extra, long long now, char **out,
		    size_t *len, char *err, size_t errlen)
{
	return dps_chat_render_template(c, NULL, messages, tools, add_generation_prompt, extra,
					now, out, len, err, errlen);
}

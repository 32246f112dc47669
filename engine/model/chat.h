/* SPDX-License-Identifier: MIT */
/*
 * engine/model/chat.h - a model's chat template (tokenizer_config.json's chat_template: one
 * string, or a list of {"name", "template"}), rendered as transformers' apply_chat_template
 * renders it: messages, tools, add_generation_prompt, the special tokens of the config
 * (bos_token, eos_token, ... as strings) and the caller's extra keyword arguments.
 */
#ifndef DPS_ENGINE_CHAT_H
#define DPS_ENGINE_CHAT_H

#include <stddef.h>

#include <jansson.h>

struct dps_chat;

/*
 * Loads the chat template of model directory dir (tokenizer_config.json; a chat_template.jinja
 * file beside it, as newer checkpoints ship, takes precedence). Returns 0; -ENOENT when there
 * is no template (err says where it looked); -EINVAL for a template that does not parse (err
 * names the file and the line); -ENOMEM.
 */
int dps_chat_load(struct dps_chat **out, const char *dir, char *err, size_t errlen);
/* The same from the text of a tokenizer_config.json (for tests and fuzzing). */
int dps_chat_load_mem(struct dps_chat **out, const char *config, size_t len, char *err,
		      size_t errlen);
void dps_chat_free(struct dps_chat *c);

/*
 * Renders messages (a JSON array of message objects) with tools (an array, or NULL), the
 * add_generation_prompt flag and extra (an object of further variables, or NULL) at time now.
 * With tools and a template list holding "tool_use", that template is used, else "default"
 * (transformers' choice). Returns 0, -EINVAL (err: the template's error, or its
 * raise_exception message) or -ENOMEM.
 */
int dps_chat_render(const struct dps_chat *c, json_t *messages, json_t *tools,
		    int add_generation_prompt, json_t *extra, long long now, char **out,
		    size_t *len, char *err, size_t errlen);
/* The same with the template of that name (NULL: transformers' choice, as above). */
int dps_chat_render_template(const struct dps_chat *c, const char *name, json_t *messages,
			     json_t *tools, int add_generation_prompt, json_t *extra,
			     long long now, char **out, size_t *len, char *err, size_t errlen);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * tests/chat_render.c - renders a model's chat template (engine/model/chat.c) for every
 * conversation of a JSON file, one JSON line per conversation on stdout:
 * {"name": ..., "ok": true, "text": ...} or {"name": ..., "ok": false, "error": ...}.
 * tests/chat_oracle.py prints the same lines from Python's Jinja2 configured as transformers
 * configures it, and tests/chat_oracle.sh compares the two.
 * Usage: chat_render MODEL_DIR CONVERSATIONS.json [TEMPLATE_NAME]
 * A conversation: {"name", "messages", "tools"?, "add_generation_prompt"?, "extra"?, "now"?}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/model/chat.h"

int main(int argc, char **argv)
{
	struct dps_chat *c;
	json_error_t je;
	json_t *convs, *conv;
	char err[4096];
	size_t i;
	int rc;

	if (argc < 3 || argc > 4) {
		fprintf(stderr, "usage: chat_render MODEL_DIR CONVERSATIONS.json [TEMPLATE_NAME]\n");
		return 2;
	}
	if ((rc = dps_chat_load(&c, argv[1], err, sizeof(err)))) {
		fprintf(stderr, "chat_render: %s\n", err);
		return 1;
	}
	convs = json_load_file(argv[2], 0, &je);
	if (!json_is_array(convs)) {
		fprintf(stderr, "chat_render: %s: %s\n", argv[2], convs ? "not an array" : je.text);
		return 1;
	}
	json_array_foreach(convs, i, conv) {
		json_t *tools = json_object_get(conv, "tools"), *line;
		json_t *agp = json_object_get(conv, "add_generation_prompt");
		json_t *now = json_object_get(conv, "now");
		char *out = NULL, *text;
		size_t len = 0;

		rc = dps_chat_render_template(c, argc == 4 ? argv[3] : NULL,
					      json_object_get(conv, "messages"),
					      json_is_null(tools) ? NULL : tools, json_is_true(agp),
					      json_object_get(conv, "extra"),
					      now ? json_integer_value(now) : 1700000000, &out, &len,
					      err, sizeof(err));
		line = json_object();
		json_object_set(line, "name", json_object_get(conv, "name"));
		json_object_set_new(line, "ok", json_boolean(!rc));
		if (rc)
			json_object_set_new(line, "error", json_string(err));
		else
			json_object_set_new(line, "text", json_stringn(out, len));
		text = json_dumps(line, JSON_COMPACT | JSON_ENSURE_ASCII);
		printf("%s\n", text);
		free(text);
		free(out);
		json_decref(line);
	}
	json_decref(convs);
	dps_chat_free(c);
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_jinja.c - fuzz target for the Jinja2 renderer (engine/model/jinja*.c) and
 * the chat template loader (engine/model/chat.c). Input: a template, then optionally a NUL
 * byte and a tokenizer_config.json. The template is parsed and, when it parses, rendered with
 * small limits over a fixed conversation with tools; either must return 0 or -EINVAL with a
 * message (never crash, leak or run away). The config after the NUL goes through
 * dps_chat_load_mem and, when it loads, dps_chat_render.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/model/chat.h"
#include "engine/model/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *vars(void)
{
	static const char conv[] =
		"{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
		" {\"role\": \"user\", \"content\": \"Hi {{ x }} \\u00e9\\u65e5 \\ud83c\\udf89\"},"
		" {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call12345\","
		" \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1.5}}}]},"
		" {\"role\": \"tool\", \"content\": \"ok\"}, {\"role\": \"user\", \"content\": \"  bye \"}],"
		" \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\","
		" \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"number\"}}}}}],"
		" \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

	return json_loads(conv, 0, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *nul = memchr(data, 0, size);
	size_t tlen = nul ? (size_t)(nul - (const char *)data) : size;
	struct dps_jinja *t;
	struct dps_chat *c;
	char err[512] = "", *out;
	json_t *v = vars();
	size_t len;
	int rc;

	DPS_ASSERT(v);
	rc = dps_jinja_parse(&t, (const char *)data, tlen, err, sizeof(err));
	DPS_ASSERT(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
	DPS_ASSERT(rc == 0 || rc == -ENOMEM || err[0]);
	if (!rc) {
		dps_jinja_set_limits(t, 1 << 16, 16 << 20, 200000);
		err[0] = 0;
		rc = dps_jinja_render(t, v, 1700000000, &out, &len, err, sizeof(err));
		DPS_ASSERT(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
		if (!rc) {
			DPS_ASSERT(out && strlen(out) <= len && len <= (1 << 16));
			free(out);
		}
		dps_jinja_free(t);
	}
	if (nul) {
		const char *cfg = nul + 1;
		size_t clen = size - tlen - 1;

		rc = dps_chat_load_mem(&c, cfg, clen, err, sizeof(err));
		DPS_ASSERT(rc == 0 || rc == -EINVAL || rc == -ENOENT || rc == -ENOMEM);
		if (!rc) {
			rc = dps_chat_render(c, json_object_get(v, "messages"),
					     json_object_get(v, "tools"), 1, NULL, 0, &out, &len, err,
					     sizeof(err));
			DPS_ASSERT(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
			if (!rc)
				free(out);
			dps_chat_free(c);
		}
	}
	json_decref(v);
	return 0;
}

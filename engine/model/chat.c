/* SPDX-License-Identifier: MIT */
/*
 * engine/model/chat.c - chat templates (see chat.h). This build does not render them yet: a
 * model directory's template is refused by name at load, so /v1/chat/completions says so.
 */
#include <errno.h>
#include <stdio.h>

#include "engine/model/chat.h"

int dps_chat_load(struct dps_chat **out, const char *dir, char *err, size_t errlen)
{
	*out = NULL;
	snprintf(err, errlen, "%s: chat templates are not supported by this build", dir);
	return -ENOENT;
}

int dps_chat_load_mem(struct dps_chat **out, const char *config, size_t len, char *err,
		      size_t errlen)
{
	*out = NULL;
	snprintf(err, errlen, "chat templates are not supported by this build");
	return -ENOENT;
}

void dps_chat_free(struct dps_chat *c)
{
}

int dps_chat_render(const struct dps_chat *c, json_t *messages, json_t *tools,
		    int add_generation_prompt, json_t *extra, long long now, char **out,
		    size_t *len, char *err, size_t errlen)
{
	snprintf(err, errlen, "chat templates are not supported by this build");
	return -EINVAL;
}

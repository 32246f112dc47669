/* SPDX-License-Identifier: MIT */
/*
 * engine/model/jinja.h - the Jinja2 templates of chat templates, rendered as Jinja2 renders them
 * with the environment Hugging Face's transformers sets up for apply_chat_template
 * (trim_blocks, lstrip_blocks, the loopcontrols extension, raise_exception, strftime_now, tojson
 * as transformers defines it). A construct this implementation does not have is an error at
 * parse time naming the template's line, never a wrong prompt. Values are jansson's.
 */
#ifndef DPS_ENGINE_JINJA_H
#define DPS_ENGINE_JINJA_H

#include <stddef.h>

#include <jansson.h>

struct dps_jinja;

/* Parses len bytes of template source. Returns 0, -EINVAL (err: "line N: ...") or -ENOMEM. */
int dps_jinja_parse(struct dps_jinja **out, const char *src, size_t len, char *err,
		    size_t errlen);
/*
 * Renders t with the variables of object vars (not modified); now (seconds since the epoch,
 * UTC) is what strftime_now formats. *out is malloc'd and NUL-terminated. Returns 0, -EINVAL
 * (a runtime error, or raise_exception: err holds its message exactly) or -ENOMEM.
 */
int dps_jinja_render(const struct dps_jinja *t, json_t *vars, long long now, char **out,
		     size_t *len, char *err, size_t errlen);
void dps_jinja_free(struct dps_jinja *t);
/*
 * Changes the limits of later renders of t: the bytes of output (default 64 MiB), the bytes of
 * memory a render may use (1 GiB) and the evaluation steps (2e8). A render past one fails with
 * -EINVAL naming it. For the fuzzer and the tests.
 */
void dps_jinja_set_limits(struct dps_jinja *t, size_t max_out, size_t max_mem,
			  long long max_steps);

#endif

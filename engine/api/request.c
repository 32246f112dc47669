/* SPDX-License-Identifier: MIT */
/*
 * engine/api/request.c - the JSON request parser (see request.h). Outside input: every field is
 * type- and range-checked, sizes are bounded before anything is allocated from them.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/api/request.h"

#define MAX_PROMPT_IDS (1 << 20)
#define MAX_TEXT (4u << 20)

int dps_json_int(json_t *v, const char *name, long lo, long hi, long *out, char *err,
		 size_t errlen)
{
	json_int_t i;

	if (!json_is_integer(v)) {
		snprintf(err, errlen, "\"%s\" must be an integer", name);
		return -EINVAL;
	}
	i = json_integer_value(v);
	if (i < lo || i > hi) {
		snprintf(err, errlen, "\"%s\" must be between %ld and %ld", name, lo, hi);
		return -EINVAL;
	}
	*out = (long)i;
	return 0;
}

int dps_json_num(json_t *v, const char *name, double lo, double hi, double *out, char *err,
		 size_t errlen)
{
	double d;

	if (!json_is_number(v)) {
		snprintf(err, errlen, "\"%s\" must be a number", name);
		return -EINVAL;
	}
	d = json_number_value(v);
	if (!(d >= lo && d <= hi)) {
		snprintf(err, errlen, "\"%s\" must be between %g and %g", name, lo, hi);
		return -EINVAL;
	}
	*out = d;
	return 0;
}

int dps_request_parse(const char *json, size_t len, const struct dps_tokenizer *tok, int vocab,
		      int bos, int def_max_tokens, struct dps_parsed_req *out, char *err,
		      size_t errlen)
{
	json_error_t je;
	json_t *root, *v;
	const char *key;
	long l;
	double d;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	out->replica = -1;
	out->p.max_tokens = def_max_tokens;
	out->p.sampling.top_p = 1.0f;
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		snprintf(err, errlen, "not JSON: %s (column %d)", je.text, je.column);
		return -EINVAL;
	}
	if (!json_is_object(root)) {
		snprintf(err, errlen, "expected a JSON object");
		json_decref(root);
		return -EINVAL;
	}
	json_object_foreach(root, key, v) {
		if (!strcmp(key, "prompt")) {
			const char *text = json_string_value(v);
			size_t n = json_string_length(v), got = 0;

			if (!json_is_string(v)) {
				snprintf(err, errlen, "\"prompt\" must be a string (or use \"prompt_ids\")");
				rc = -EINVAL;
			} else if (!tok) {
				snprintf(err, errlen, "\"prompt\" is text but the model has no tokenizer: "
					 "give \"prompt_ids\"");
				rc = -EINVAL;
			} else if (out->prompt) {
				snprintf(err, errlen, "give \"prompt\" or \"prompt_ids\", not both");
				rc = -EINVAL;
			} else if (n > MAX_TEXT) {
				snprintf(err, errlen, "\"prompt\" is longer than %u bytes", MAX_TEXT);
				rc = -EINVAL;
			} else if (!(out->prompt = malloc(sizeof(int) * (n * 2 + 8)))) {
				rc = -ENOMEM;
			} else {
				rc = dps_tokenizer_encode(tok, text, n, DPS_TOKENIZER_BOS, out->prompt,
							  n * 2 + 8, &got);
				if (rc)
					snprintf(err, errlen, "cannot encode \"prompt\"");
				out->n_prompt = (int)got;
			}
		} else if (!strcmp(key, "prompt_ids")) {
			size_t n = json_array_size(v), i;
			int first;

			if (!json_is_array(v) || !n || n > MAX_PROMPT_IDS) {
				snprintf(err, errlen, "\"prompt_ids\" must be a list of 1 to %d token ids",
					 MAX_PROMPT_IDS);
				rc = -EINVAL;
			} else if (out->prompt) {
				snprintf(err, errlen, "give \"prompt\" or \"prompt_ids\", not both");
				rc = -EINVAL;
			} else if (!(out->prompt = malloc(sizeof(int) * (n + 1)))) {
				rc = -ENOMEM;
			} else {
				first = json_is_integer(json_array_get(v, 0)) &&
					json_integer_value(json_array_get(v, 0)) == bos;
				out->n_prompt = 0;
				if (!first)
					out->prompt[out->n_prompt++] = bos;
				for (i = 0; i < n && !rc; i++) {
					rc = dps_json_int(json_array_get(v, i), "prompt_ids", 0, vocab - 1, &l,
						     err, errlen);
					out->prompt[out->n_prompt++] = (int)l;
				}
			}
		} else if (!strcmp(key, "max_tokens")) {
			rc = dps_json_int(v, key, 1, 1 << 24, &l, err, errlen);
			out->p.max_tokens = (int)l;
		} else if (!strcmp(key, "temperature")) {
			rc = dps_json_num(v, key, 0, 100, &d, err, errlen);
			out->p.sampling.temperature = (float)d;
		} else if (!strcmp(key, "top_p")) {
			rc = dps_json_num(v, key, 1e-9, 1, &d, err, errlen);
			out->p.sampling.top_p = (float)d;
		} else if (!strcmp(key, "top_k")) {
			rc = dps_json_int(v, key, 0, 1 << 24, &l, err, errlen);
			out->p.sampling.top_k = (int)l;
		} else if (!strcmp(key, "seed")) {
			rc = dps_json_int(v, key, 0, (long)INT32_MAX, &l, err, errlen);
			out->p.sampling.seed = (uint64_t)l;
		} else if (!strcmp(key, "replica")) {
			rc = dps_json_int(v, key, 0, 1 << 20, &l, err, errlen);
			out->replica = (int)l;
		} else if (!strcmp(key, "timeout_ms")) {
			rc = dps_json_int(v, key, 1, 1L << 40, &l, err, errlen);
			out->p.deadline_ns = (uint64_t)l * 1000000ull;
		} else if (!strcmp(key, "stop_ids")) {
			size_t n = json_array_size(v);

			if (!json_is_array(v) || n > DPS_MAX_STOP - 2) {
				snprintf(err, errlen, "\"stop_ids\" must be a list of at most %d token ids",
					 DPS_MAX_STOP - 2);
				rc = -EINVAL;
			}
			for (size_t i = 0; i < n && !rc; i++) {
				rc = dps_json_int(json_array_get(v, i), "stop_ids", 0, vocab - 1, &l, err,
					     errlen);
				out->p.stop[out->p.n_stop++] = (int)l;
			}
		} else {
			snprintf(err, errlen, "unknown field \"%.64s\"", key);
			rc = -EINVAL;
		}
		if (rc)
			break;
	}
	json_decref(root);
	if (!rc && !out->prompt) {
		snprintf(err, errlen, "no \"prompt\" or \"prompt_ids\"");
		rc = -EINVAL;
	}
	if (rc)
		dps_parsed_req_free(out);
	return rc;
}

void dps_parsed_req_free(struct dps_parsed_req *r)
{
	free(r->prompt);
	r->prompt = NULL;
	r->n_prompt = 0;
}

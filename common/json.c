/* SPDX-License-Identifier: MIT */
/*
 * common/json.c - JSON output and typed field reading (see json.h). Called by the request parser
 * and the HTTP frontend for every request, and by the command line's JSON output.
 */
#include <errno.h>
#include <stdio.h>

#include <jansson.h>

#include "common/json.h"
#include "common/utf8.h"

void dps_json_escape(FILE *f, const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		const unsigned char ch = (unsigned char)s[i];

		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
}

void dps_json_string(FILE *f, const char *s, size_t len)
{
	fputc('"', f);
	dps_json_escape(f, s, len);
	fputc('"', f);
}

void dps_json_text(FILE *f, const char *s, size_t n)
{
	size_t i = 0, run = 0;

	fputc('"', f);
	while (i < n) {
		const size_t l = dps_utf8_len((const unsigned char *)s + i, n - i);

		if (l) {
			i += l;
			continue;
		}
		dps_json_escape(f, s + run, i - run);
		fputs("\\ufffd", f);
		run = ++i;
	}
	dps_json_escape(f, s + run, n - run);
	fputc('"', f);
}

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

int dps_json_load_object(const char *buf, size_t len, json_t **out, char *err, size_t errlen)
{
	json_error_t je;
	json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);

	*out = NULL;
	if (!root) {
		snprintf(err, errlen, "not JSON: %s (line %d, column %d)", je.text, je.line,
			 je.column);
		return -EINVAL;
	}
	if (!json_is_object(root)) {
		json_decref(root);
		snprintf(err, errlen, "the request must be a JSON object");
		return -EINVAL;
	}
	*out = root;
	return 0;
}

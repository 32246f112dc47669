/* SPDX-License-Identifier: MIT */
/*
 * common/json.c - JSON output and typed field reading (see json.h). Called by the request parser
 * and the HTTP frontend for every request, and by the command line's JSON output.
 */
#include <errno.h>
#include <stdio.h>

#include <jansson.h>

#include "common/json.h"

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

size_t dps_utf8_len(const unsigned char *s, size_t n)
{
	size_t need;

	if (s[0] < 0x80)
		return 1;
	need = s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3
		: s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
	if (!need || need > n)
		return 0;
	for (size_t i = 1; i < need; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] > 0x9f) ||
	    (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] > 0x8f))
		return 0; /* overlong, surrogate, or beyond U+10FFFF */
	return need;
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

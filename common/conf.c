/* SPDX-License-Identifier: MIT */
/*
 * common/conf.c - the flat YAML-subset config file parser (see conf.h). Reads user input:
 * every line is bounded, every byte checked.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/conf.h"

static int is_key_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '_';
}

static int is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\r';
}

/* Parses one line (no newline) of n bytes; calls fn for an entry. */
static int parse_line(const char *s, size_t n, int line,
		      int (*fn)(void *, const char *, const char *, int), void *arg, char *err,
		      size_t errlen)
{
	char key[DPS_CONF_MAX_LINE], val[DPS_CONF_MAX_LINE];
	size_t i = 0, k = 0, v = 0;
	char quote = 0;

	while (i < n && is_space(s[i]))
		i++;
	if (i == n || s[i] == '#')
		return 0;
	while (i < n && is_key_char(s[i]))
		key[k++] = s[i] == '_' ? '-' : s[i], i++;
	key[k] = 0;
	while (i < n && is_space(s[i]))
		i++;
	if (!k || i == n || s[i] != ':') {
		snprintf(err, errlen, "line %d: expected 'key: value' (keys are letters, digits, "
			 "'-' and '_')", line);
		return -EINVAL;
	}
	for (i++; i < n && is_space(s[i]); i++)
		;
	if (i < n && (s[i] == '"' || s[i] == '\'')) {
		quote = s[i++];
		while (i < n && s[i] != quote)
			val[v++] = s[i++];
		if (i == n) {
			snprintf(err, errlen, "line %d: unterminated %c quote", line, quote);
			return -EINVAL;
		}
		for (i++; i < n && is_space(s[i]); i++)
			;
		if (i < n && s[i] != '#') {
			snprintf(err, errlen, "line %d: text after the closing quote", line);
			return -EINVAL;
		}
	} else {
		while (i < n && s[i] != '#')
			val[v++] = s[i++];
		while (v && is_space(val[v - 1]))
			v--;
	}
	val[v] = 0;
	if (!v && !quote) {
		snprintf(err, errlen, "line %d: '%s' has no value", line, key);
		return -EINVAL;
	}
	return fn(arg, key, val, line);
}

int dps_conf_parse(const char *text, size_t len,
		   int (*fn)(void *arg, const char *key, const char *value, int line), void *arg,
		   char *err, size_t errlen)
{
	size_t start = 0;
	int line = 1, rc;

	if (len > DPS_CONF_MAX_BYTES) {
		snprintf(err, errlen, "%zu bytes: larger than %u", len, DPS_CONF_MAX_BYTES);
		return -EINVAL;
	}
	while (start < len) {
		size_t end = start;

		while (end < len && text[end] != '\n') {
			if (text[end] == '\0') {
				snprintf(err, errlen, "line %d: a NUL byte", line);
				return -EINVAL;
			}
			end++;
		}
		if (end - start >= DPS_CONF_MAX_LINE) {
			snprintf(err, errlen, "line %d: longer than %d bytes", line,
				 DPS_CONF_MAX_LINE - 1);
			return -EINVAL;
		}
		rc = parse_line(text + start, end - start, line, fn, arg, err, errlen);
		if (rc)
			return rc;
		start = end + 1;
		line++;
	}
	return 0;
}

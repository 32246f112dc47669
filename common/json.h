/* SPDX-License-Identifier: MIT */
/*
 * common/json.h - JSON, both ways, in one place: writing strings (escaped, or model text made
 * valid UTF-8) for the command line's and the server's output, and reading typed, range-checked
 * fields out of jansson values for every parser of outside input (engine/api/request.c, the
 * command line's JSON files). Reading fails with a message naming the field.
 */
#ifndef DPS_COMMON_JSON_H
#define DPS_COMMON_JSON_H

#include <stddef.h>
#include <stdio.h>

/* s (len bytes) as the body of a JSON string: quotes, backslashes and control bytes escaped,
 * no surrounding quotes. */
void dps_json_escape(FILE *f, const char *s, size_t len);

/* s (len bytes) as a quoted JSON string. */
void dps_json_string(FILE *f, const char *s, size_t len);

/* Model text as a quoted JSON string: a byte that is not part of valid UTF-8 becomes U+FFFD. */
void dps_json_text(FILE *f, const char *s, size_t len);


/*
 * A field v named name: an integer in [lo, hi] into *out, or a number in [lo, hi]; else
 * -EINVAL with a message naming the field and the rule.
 */
struct json_t;
int dps_json_int(struct json_t *v, const char *name, long lo, long hi, long *out, char *err,
		 size_t errlen);
int dps_json_num(struct json_t *v, const char *name, double lo, double hi, double *out,
		 char *err, size_t errlen);

/*
 * Parses len bytes of a request body that must be one JSON object (duplicate keys refused)
 * into *out (the caller's reference). Returns 0 or -EINVAL with "not JSON: ..." (the parser's
 * words, line and column) or "the request must be a JSON object" in err.
 */
int dps_json_load_object(const char *buf, size_t len, struct json_t **out, char *err,
			 size_t errlen);

#endif

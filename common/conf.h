/* SPDX-License-Identifier: MIT */
/*
 * common/conf.h - the config file of `dpshard ... --config FILE`: one flag per line, in the
 * subset of YAML that vLLM's --config files use for flat options:
 *
 *     # comment
 *     tensor-parallel-size: 2        # or tensor_parallel_size
 *     model: "/srv/models/llama 3"   # quotes are optional and removed
 *     verbose: true
 *
 * Keys are letters, digits, '-' and '_' ('_' reads as '-'); a value runs to the end of the line
 * or to a '#' outside quotes. No nesting, lists or escapes: a line that is anything else is an
 * error naming its number.
 */
#ifndef DPS_COMMON_CONF_H
#define DPS_COMMON_CONF_H

#include <stddef.h>

#define DPS_CONF_MAX_BYTES (1u << 20) /* larger files are refused */
#define DPS_CONF_MAX_LINE 4096

/*
 * Calls fn(arg, key, value, line) for every entry of text (len bytes, need not be
 * NUL-terminated), in order; key and value are NUL-terminated copies valid during the call.
 * Stops at the first error of fn (its code returned). Returns 0, -EINVAL with "line N: ..."
 * in err for malformed input, or fn's error.
 */
int dps_conf_parse(const char *text, size_t len,
		   int (*fn)(void *arg, const char *key, const char *value, int line), void *arg,
		   char *err, size_t errlen);

#endif

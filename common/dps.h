/* SPDX-License-Identifier: MIT */
/*
 * common/dps.h - what every module of dpshard shares: error codes, assertions, logging and a
 * few checked-arithmetic and parsing helpers. shm/, kernels/, engine/ and tools/ all include
 * it; it includes nothing of theirs.
 *
 * Library code returns 0 or a negative code: -errno for system failures, -DPS_E* for our own.
 * dps_strerror() turns either into words.
 */
#ifndef DPS_COMMON_H
#define DPS_COMMON_H

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define DPS_CACHELINE 64

/* Our own error codes; returned negated. They start far above every errno value. */
enum dps_err {
	DPS_EABORT = 10000, /* the instance's abort word was raised (a peer died or shutdown) */
	DPS_ECONFIG,        /* a configuration breaks a rule; the caller's message says which */
	DPS_ENOSHM,         /* /dev/shm cannot hold the segment */
	DPS_ETOOBIG,        /* a size computation overflowed or exceeds a limit */
	DPS_EPROTO,         /* malformed message on a ring */
	DPS_ERANK,          /* a rank process failed */
	DPS_ERR_END
};

/* Returns a static string for a 0, -errno or -DPS_E* code (sign ignored). */
const char *dps_strerror(int err);

/* Invariant check that is never compiled out: prints file and line, then aborts. */
#define DPS_ASSERT(cond)                                                              \
	do {                                                                          \
		if (__builtin_expect(!(cond), 0))                                      \
			dps_assert_fail(#cond, __FILE__, __LINE__, __func__);          \
	} while (0)
void dps_assert_fail(const char *expr, const char *file, int line, const char *func)
	__attribute__((noreturn));

/* Logging to stderr, one line per event, with a level and the process role. */
enum dps_log_level { DPS_LOG_DEBUG, DPS_LOG_INFO, DPS_LOG_WARN, DPS_LOG_ERROR };
void dps_log_set_level(enum dps_log_level lvl);
/* Role shown in each line ("supervisor", "rank 3"); copied. */
void dps_log_set_role(const char *role);
void dps_log(enum dps_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define dps_debug(...) dps_log(DPS_LOG_DEBUG, __VA_ARGS__)
#define dps_info(...) dps_log(DPS_LOG_INFO, __VA_ARGS__)
#define dps_warn(...) dps_log(DPS_LOG_WARN, __VA_ARGS__)
#define dps_error(...) dps_log(DPS_LOG_ERROR, __VA_ARGS__)

/* Checked size arithmetic: return 0 and store the result, or -DPS_ETOOBIG on overflow. */
static inline int dps_size_mul(size_t a, size_t b, size_t *out)
{
	return __builtin_mul_overflow(a, b, out) ? -DPS_ETOOBIG : 0;
}
static inline int dps_size_add(size_t a, size_t b, size_t *out)
{
	return __builtin_add_overflow(a, b, out) ? -DPS_ETOOBIG : 0;
}
static inline size_t dps_align_up(size_t x, size_t a)
{
	return (x + a - 1) / a * a;
}

/* Monotonic clock in nanoseconds. */
uint64_t dps_now_ns(void);

/*
 * Zeroed memory for large arrays that are streamed (weights, KV caches, benchmark buffers):
 * 2 MiB-aligned and advised for transparent huge pages from 2 MiB up, since with 4 KiB pages
 * the hardware prefetcher stops at every page boundary. Free with free(). NULL when out of
 * memory.
 */
void *dps_alloc_huge(size_t bytes);

/* CPUs this process may run on (its affinity mask), at least 1. */
int dps_cpus_allowed(void);

/*
 * Parse a byte size such as "4096", "64K", "1M", "1MiB", "2G" (binary multiples).
 * Returns 0 or -EINVAL (malformed) / -DPS_ETOOBIG (overflow).
 */
int dps_parse_size(const char *s, size_t *out);
/* Parse a decimal int in [lo, hi]. Returns 0, -EINVAL or -ERANGE. */
int dps_parse_int(const char *s, long lo, long hi, long *out);
/* Format a byte count as "1.5 MiB" into buf; returns buf. */
const char *dps_fmt_bytes(size_t n, char *buf, size_t len);

#endif /* DPS_COMMON_H */

/* SPDX-License-Identifier: MIT */
/*
 * tests/check_util.c - the parsers of command-line input (byte sizes, integers, the flag table)
 * and the error words: exact cases at every edge, then a seeded fuzz loop of random strings
 * and random argv vectors that must never crash and must either be refused or give a value
 * that an independent re-parse agrees with.
 */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <string.h>

#include "common/conf.h"
#include "common/dps.h"
#include "engine/runtime/groups.h"
#include "tools/flags.h"
#include "tests/testutil.h"

START_TEST(test_parse_size_cases)
{
	static const struct { const char *s; int ok; size_t v; } cases[] = {
		{ "0", 1, 0 }, { "4096", 1, 4096 }, { "64K", 1, 65536 }, { "64k", 1, 65536 },
		{ "1M", 1, 1 << 20 }, { "1MiB", 1, 1 << 20 }, { "1mib", 1, 1 << 20 },
		{ "1MB", 1, 1 << 20 }, { "2G", 1, 2ull << 30 }, { "3T", 1, 3ull << 40 },
		{ "12B", 1, 12 }, { "", 0, 0 }, { "K", 0, 0 }, { "-1", 0, 0 }, { " 1", 0, 0 },
		{ "1 ", 0, 0 }, { "1X", 0, 0 }, { "1KK", 0, 0 }, { "1Kx", 0, 0 }, { "0x10", 0, 0 },
		{ "18446744073709551615", 1, SIZE_MAX }, { "18446744073709551616", 0, 0 },
		{ "17179869184G", 0, 0 }, { "16777216T", 0, 0 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		size_t v = 12345;
		int rc = dps_parse_size(cases[i].s, &v);

		ck_assert_msg((rc == 0) == cases[i].ok, "'%s': rc %d", cases[i].s, rc);
		if (cases[i].ok)
			ck_assert_msg(v == cases[i].v, "'%s': %zu", cases[i].s, v);
	}
	ck_assert_int_ne(dps_parse_size(NULL, &(size_t){ 0 }), 0);
}
END_TEST

START_TEST(test_parse_int_cases)
{
	long v;

	ck_assert_int_eq(dps_parse_int("7", 1, 8, &v), 0);
	ck_assert_int_eq(v, 7);
	ck_assert_int_eq(dps_parse_int("-3", -5, 5, &v), 0);
	ck_assert_int_eq(v, -3);
	ck_assert_int_eq(dps_parse_int("9", 1, 8, &v), -ERANGE);
	ck_assert_int_eq(dps_parse_int("0", 1, 8, &v), -ERANGE);
	ck_assert_int_eq(dps_parse_int("99999999999999999999", 0, LONG_MAX, &v), -ERANGE);
	ck_assert_int_eq(dps_parse_int("", 0, 9, &v), -EINVAL);
	ck_assert_int_eq(dps_parse_int("4x", 0, 9, &v), -EINVAL);
	ck_assert_int_eq(dps_parse_int("x4", 0, 9, &v), -EINVAL);
	ck_assert_int_eq(dps_parse_int(NULL, 0, 9, &v), -EINVAL);
}
END_TEST

/* Independent re-parse of a size the parser accepted: digits, then an optional unit. */
static int reparse_size(const char *s, size_t *out)
{
	unsigned __int128 v = 0, mult = 1;
	const char *p = s;

	while (*p >= '0' && *p <= '9')
		v = v * 10 + (unsigned)(*p++ - '0');
	switch (*p | 0x20) {
	case 'k': mult = 1ull << 10; break;
	case 'm': mult = 1ull << 20; break;
	case 'g': mult = 1ull << 30; break;
	case 't': mult = 1ull << 40; break;
	default: break;
	}
	v *= mult;
	if (v > SIZE_MAX)
		return -1;
	*out = (size_t)v;
	return 0;
}

START_TEST(test_parse_fuzz)
{
	static const char alphabet[] = "0123456789KkMmGgTtBbiIx -+. ";
	uint32_t seed = 12345;
	char buf[32];

	for (int it = 0; it < 200000; it++) {
		const int len = (int)((seed = seed * 1103515245u + 12345u) >> 16) % 24;
		size_t v, w;
		long l;

		for (int j = 0; j < len; j++) {
			seed = seed * 1103515245u + 12345u;
			buf[j] = alphabet[(seed >> 16) % (sizeof(alphabet) - 1)];
		}
		buf[len] = '\0';
		if (dps_parse_size(buf, &v) == 0) {
			ck_assert_msg(reparse_size(buf, &w) == 0 && v == w, "'%s' -> %zu", buf, v);
		}
		if (dps_parse_int(buf, -1000, 1000, &l) == 0)
			ck_assert_msg(l >= -1000 && l <= 1000 && l == strtol(buf, NULL, 10), "'%s'", buf);
	}
}
END_TEST

START_TEST(test_flags_parse)
{
	struct dps_par_cfg cfg = DPS_PAR_CFG_DEFAULT;
	struct dps_flag flags[DPS_PAR_FLAGS + 3];
	const struct dps_flag end = DPS_FLAGS_END;
	size_t bytes = 0;
	int on = 0, npos;
	char *pos[2];

	dps_flags_parallel(&cfg, flags);
	flags[DPS_PAR_FLAGS] = (struct dps_flag){ "bytes", DPS_FLAG_SIZE, &bytes, "B", "b", 0, 0 };
	flags[DPS_PAR_FLAGS + 1] = (struct dps_flag){ "on", DPS_FLAG_BOOL, &on, NULL, "b", 0, 0 };
	flags[DPS_PAR_FLAGS + 2] = end;
	{
		char *argv[] = { "--tensor-parallel-size", "8", "--data-parallel-size=4",
				 "--mlp-dp-size", "4", "--bytes=64K", "--on", "p1", "--", "--p2" };

		ck_assert_int_eq(dps_flags_parse(flags, 10, argv, "t", "", pos, 2, &npos), 0);
		ck_assert_int_eq(cfg.tp, 8);
		ck_assert_int_eq(cfg.dp, 4);
		ck_assert_int_eq(cfg.mlp_dp, 4);
		ck_assert_uint_eq(bytes, 65536);
		ck_assert_int_eq(on, 1);
		ck_assert_int_eq(npos, 2);
		ck_assert_str_eq(pos[1], "--p2");
	}
	{
		char *bad[][2] = { { "--tensor-parallel-size", "0" }, { "--tensor-parallel-size", "x" },
				   { "--data-parallel-size", "2000" }, { "--bytes", "1Q" },
				   { "--nope", "1" }, { "--on=1", "" }, { "-x", "" } };

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
			ck_assert_int_eq(dps_flags_parse(flags, bad[i][1][0] ? 2 : 1, bad[i], "t", "",
							 pos, 0, &npos), -1);
		char *missing[] = { "--mlp-dp-size" };
		ck_assert_int_eq(dps_flags_parse(flags, 1, missing, "t", "", pos, 0, &npos), -1);
		char *extra[] = { "p1" };
		ck_assert_int_eq(dps_flags_parse(flags, 1, extra, "t", "", pos, 0, &npos), -1);
	}
}
END_TEST

START_TEST(test_flags_fuzz)
{
	static const char *const words[] = { "--tensor-parallel-size", "--data-parallel-size=",
					     "--mlp-dp-size", "--bytes", "--on", "--", "-", "1", "0",
					     "64K", "x", "--on=", "=", "--bytes=1M", "999999999999" };
	struct dps_par_cfg cfg = DPS_PAR_CFG_DEFAULT;
	struct dps_flag flags[DPS_PAR_FLAGS + 3];
	const struct dps_flag end = DPS_FLAGS_END;
	size_t bytes = 0;
	int on = 0, npos;
	uint32_t seed = 777;
	char *argv[8], *pos[4];
	FILE *devnull = freopen("/dev/null", "w", stderr);

	ck_assert_ptr_nonnull(devnull);
	dps_flags_parallel(&cfg, flags);
	flags[DPS_PAR_FLAGS] = (struct dps_flag){ "bytes", DPS_FLAG_SIZE, &bytes, "B", "b", 0, 0 };
	flags[DPS_PAR_FLAGS + 1] = (struct dps_flag){ "on", DPS_FLAG_BOOL, &on, NULL, "b", 0, 0 };
	flags[DPS_PAR_FLAGS + 2] = end;
	for (int it = 0; it < 50000; it++) {
		const int argc = (int)((seed = seed * 1103515245u + 12345u) >> 16) % 8;
		int rc;

		for (int j = 0; j < argc; j++) {
			seed = seed * 1103515245u + 12345u;
			argv[j] = (char *)words[(seed >> 16) % (sizeof(words) / sizeof(words[0]))];
		}
		rc = dps_flags_parse(flags, argc, argv, "t", "", pos, 4, &npos);
		ck_assert(rc == 0 || rc == -1);
		ck_assert(cfg.tp >= 1 && cfg.tp <= DPS_MAX_WORLD && cfg.dp >= 1 && cfg.mlp_dp >= 1);
		ck_assert(npos >= 0 && npos <= 4);
	}
}
END_TEST

START_TEST(test_strerror)
{
	ck_assert_str_eq(dps_strerror(0), "success");
	ck_assert_ptr_nonnull(strstr(dps_strerror(-DPS_EABORT), "peer"));
	ck_assert_str_eq(dps_strerror(-ENOENT), dps_strerror(ENOENT));
	for (int e = DPS_EABORT; e < DPS_ERR_END; e++)
		ck_assert_str_ne(dps_strerror(-e), "unknown error");
	ck_assert_str_eq(dps_strerror(-DPS_ERR_END), "unknown error");
}
END_TEST

struct conf_seen {
	char text[1024];
	int lines[16], n;
};

static int conf_collect(void *arg, const char *key, const char *value, int line)
{
	struct conf_seen *c = arg;
	size_t l = strlen(c->text);

	snprintf(c->text + l, sizeof(c->text) - l, "%s=%s;", key, value);
	if (c->n < 16)
		c->lines[c->n++] = line;
	return 0;
}

START_TEST(test_conf_parse)
{
	static const char good[] = "# a config\n\ntensor_parallel_size: 2\n  data-parallel-size:4  "
				   "# replicas\nmodel: \"/srv/a b # c\"\nname: 'x'\nempty: \"\"\n"
				   "trailing: value with spaces   \r\n";
	static const struct { const char *text; const char *msg; } bad[] = {
		{ "key value\n", "line 1: expected 'key: value'" },
		{ "ok: 1\n: x\n", "line 2: expected" },
		{ "k:\n", "line 1: 'k' has no value" },
		{ "k: \"open\n", "line 1: unterminated \" quote" },
		{ "k: 'a' b\n", "line 1: text after the closing quote" },
		{ "ke y: 1\n", "line 1: expected" },
		{ "k.x: 1\n", "line 1: expected" },
		{ "- item\n", "line 1: expected" },
	};
	struct conf_seen c = { "", { 0 }, 0 };
	char err[256], nul[] = "a: 1\nb: 2\0\n", big[DPS_CONF_MAX_LINE + 8];

	ck_assert_int_eq(dps_conf_parse(good, strlen(good), conf_collect, &c, err, sizeof(err)), 0);
	ck_assert_str_eq(c.text, "tensor-parallel-size=2;data-parallel-size=4;model=/srv/a b # c;"
				 "name=x;empty=;trailing=value with spaces;");
	ck_assert_int_eq(c.n, 6);
	ck_assert_int_eq(c.lines[0], 3);
	ck_assert_int_eq(c.lines[5], 8);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&c, 0, sizeof(c));
		err[0] = 0;
		ck_assert_int_eq(dps_conf_parse(bad[i].text, strlen(bad[i].text), conf_collect, &c,
						err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, bad[i].msg), "'%s': got '%s', want '%s'", bad[i].text, err,
			      bad[i].msg);
	}
	ck_assert_int_eq(dps_conf_parse(nul, sizeof(nul) - 1, conf_collect, &c, err, sizeof(err)),
			 -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "line 2: a NUL byte"));
	memset(big, 'a', sizeof(big));
	big[1] = ':';
	ck_assert_int_eq(dps_conf_parse(big, sizeof(big), conf_collect, &c, err, sizeof(err)),
			 -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "longer than"));
	/* Without a trailing newline the last line still counts. */
	memset(&c, 0, sizeof(c));
	ck_assert_int_eq(dps_conf_parse("a: 1\nb: 2", 9, conf_collect, &c, err, sizeof(err)), 0);
	ck_assert_str_eq(c.text, "a=1;b=2;");
}
END_TEST

START_TEST(test_int_list)
{
	int v[4];

	ck_assert_int_eq(dps_flags_int_list("1,8,32", v, 4, 1, 64), 3);
	ck_assert_int_eq(v[2], 32);
	ck_assert_int_eq(dps_flags_int_list(" 1 403, 407 ", v, 4, 0, 511), 3);
	ck_assert_int_eq(v[1], 403);
	ck_assert_int_eq(dps_flags_int_list("", v, 4, 0, 9), 0);
	ck_assert_int_eq(dps_flags_int_list("1,2,3,4,5", v, 4, 0, 9), -1); /* more than cap */
	ck_assert_int_eq(dps_flags_int_list("1,10", v, 4, 0, 9), -1);      /* out of range */
	ck_assert_int_eq(dps_flags_int_list("1,x", v, 4, 0, 9), -1);
	ck_assert_int_eq(dps_flags_int_list("1;2", v, 4, 0, 9), -1);
	ck_assert_int_eq(dps_flags_int_list("-1", v, 4, -1, 9), 1);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("util");
	TCase *tc = tcase_create("util");

	tcase_add_test(tc, test_parse_size_cases);
	tcase_add_test(tc, test_parse_int_cases);
	tcase_add_test(tc, test_parse_fuzz);
	tcase_add_test(tc, test_flags_parse);
	tcase_add_test(tc, test_flags_fuzz);
	tcase_add_test(tc, test_int_list);
	tcase_add_test(tc, test_strerror);
	tcase_add_test(tc, test_conf_parse);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

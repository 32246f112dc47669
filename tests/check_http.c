/* SPDX-License-Identifier: MIT */
/*
 * tests/check_http.c - Check suite for engine/api/http_parse.c, the HTTP server's request
 * parser: a GET and a POST with their method, path (without the query), body and
 * Authorization; keep-alive by the HTTP/1.0 and 1.1 rules; "Expect: 100-continue"; two
 * pipelined requests taken one at a time; a request cut anywhere is incomplete, not wrong;
 * and every limit answered with its status (414 request line, 431 headers, 413 body, 400
 * malformed). The oracle is RFC 9112 as written into each case; a case with a body one byte
 * over the limit shows that the limit check is not a formality.
 */
#include <check.h>
#include <string.h>

#include "engine/api/http_int.h"
#include "tests/testutil.h"

/* Feeds all of s to a fresh request; returns the status (-1: incomplete) and keeps q. */
static int feed(struct preq *q, const char *s, size_t max_body, size_t *used)
{
	int status;
	size_t n;

	memset(q, 0, sizeof(*q));
	dps_http_preq_init(q, max_body);
	n = dps_http_preq_feed(q, s, strlen(s), &status);
	if (used)
		*used = n;
	return status ? status : q->complete ? 0 : -1;
}

START_TEST(test_get_and_post)
{
	struct preq q;
	const char *post = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: h\r\n"
			   "Authorization: Bearer k3y\r\nContent-Length: 5\r\n\r\nhello";

	ck_assert_int_eq(feed(&q, "GET /health HTTP/1.1\r\nHost: h\r\n\r\n", 100, NULL), 0);
	ck_assert_int_eq(q.p.method, HTTP_GET);
	ck_assert_str_eq(q.url.p, "/health");
	ck_assert_uint_eq(q.body.len, 0);
	ck_assert(q.keep_alive);
	dps_http_preq_free(&q);

	ck_assert_int_eq(feed(&q, post, 100, NULL), 0);
	ck_assert_int_eq(q.p.method, HTTP_POST);
	ck_assert_str_eq(q.auth.p, "Bearer k3y");
	ck_assert_uint_eq(q.body.len, 5);
	ck_assert(!memcmp(q.body.p, "hello", 5));
	dps_http_preq_free(&q);
	{
		char method[16], path[64];
		size_t blen = 99;

		/* The probe: the path without its query. */
		ck_assert_int_eq(dps_http_parse_probe(post, strlen(post), 100, method,
						      sizeof(method), path, sizeof(path), &blen),
				 0);
		ck_assert_str_eq(method, "POST");
		ck_assert_str_eq(path, "/v1/completions");
		ck_assert_uint_eq(blen, 5);
	}
}
END_TEST

START_TEST(test_keep_alive_rules)
{
	struct preq q;

	ck_assert_int_eq(feed(&q, "GET / HTTP/1.1\r\nConnection: close\r\n\r\n", 10, NULL), 0);
	ck_assert(!q.keep_alive);
	dps_http_preq_free(&q);
	ck_assert_int_eq(feed(&q, "GET / HTTP/1.0\r\n\r\n", 10, NULL), 0);
	ck_assert(!q.keep_alive);
	dps_http_preq_free(&q);
	ck_assert_int_eq(feed(&q, "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 10, NULL), 0);
	ck_assert(q.keep_alive);
	dps_http_preq_free(&q);
}
END_TEST

START_TEST(test_expect_continue)
{
	struct preq q;

	/* Headers only so far: incomplete, and the 100 Continue is wanted. */
	ck_assert_int_eq(feed(&q, "POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3"
				  "\r\n\r\n", 10, NULL), -1);
	ck_assert(q.want_continue);
	dps_http_preq_free(&q);
	/* Not from an HTTP/1.0 client. */
	ck_assert_int_eq(feed(&q, "POST /x HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3"
				  "\r\n\r\n", 10, NULL), -1);
	ck_assert(!q.want_continue);
	dps_http_preq_free(&q);
}
END_TEST

START_TEST(test_pipelined_one_at_a_time)
{
	const char *two = "GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
	struct preq q;
	size_t used;
	int status;

	ck_assert_int_eq(feed(&q, two, 10, &used), 0);
	ck_assert_str_eq(q.url.p, "/a");
	ck_assert_uint_eq(used, strlen("GET /a HTTP/1.1\r\n\r\n"));
	/* The next request from where the first ended. */
	dps_http_preq_free(&q);
	dps_http_preq_init(&q, 10);
	dps_http_preq_feed(&q, two + used, strlen(two) - used, &status);
	ck_assert_int_eq(status, 0);
	ck_assert(q.complete);
	ck_assert_str_eq(q.url.p, "/b");
	dps_http_preq_free(&q);
}
END_TEST

START_TEST(test_cut_anywhere_is_incomplete)
{
	const char *r = "POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nabcd";
	char buf[128];

	for (size_t cut = 1; cut < strlen(r); cut++) {
		struct preq q;

		memcpy(buf, r, cut);
		buf[cut] = '\0';
		ck_assert_msg(feed(&q, buf, 10, NULL) == -1, "cut at %zu", cut);
		dps_http_preq_free(&q);
	}
}
END_TEST

START_TEST(test_limits)
{
	struct preq q;
	static char big[40000];
	int n;

	/* Request line over 8 KiB: 414. */
	n = snprintf(big, sizeof(big), "GET /%0*d HTTP/1.1\r\n\r\n", 9000, 0);
	ck_assert_int_gt(n, 9000);
	ck_assert_int_eq(feed(&q, big, 10, NULL), 414);
	dps_http_preq_free(&q);
	/* Headers over 16 KiB: 431. */
	n = snprintf(big, sizeof(big), "GET / HTTP/1.1\r\nX-Long: %0*d\r\n\r\n", 17000, 0);
	ck_assert_int_eq(feed(&q, big, 10, NULL), 431);
	dps_http_preq_free(&q);
	/* A body at the limit passes, one byte over is 413. */
	ck_assert_int_eq(feed(&q, "POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd", 4, NULL), 0);
	dps_http_preq_free(&q);
	ck_assert_int_eq(feed(&q, "POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nabcde", 4, NULL), 413);
	dps_http_preq_free(&q);
	/* Malformed: 400. */
	ck_assert_int_eq(feed(&q, "GET / HTTP/1.1\r\nBad Header\r\n\r\n", 10, NULL), 400);
	dps_http_preq_free(&q);
	ck_assert_int_eq(feed(&q, "\x01\x02\x03 / HTTP/1.1\r\n\r\n", 10, NULL), 400);
	dps_http_preq_free(&q);
	ck_assert_str_eq(dps_http_reason(413), "Payload Too Large");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("http");
	TCase *tc = tcase_create("parser");

	tcase_add_test(tc, test_get_and_post);
	tcase_add_test(tc, test_keep_alive_rules);
	tcase_add_test(tc, test_expect_continue);
	tcase_add_test(tc, test_pipelined_one_at_a_time);
	tcase_add_test(tc, test_cut_anywhere_is_incomplete);
	tcase_add_test(tc, test_limits);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}

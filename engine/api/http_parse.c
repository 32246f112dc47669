/* SPDX-License-Identifier: MIT */
/*
 * engine/api/http_parse.c - the request parser of the HTTP server (see http.h): http-parser's
 * callbacks, with the limits of the request line (414), the headers (431) and the body (413),
 * "Expect: 100-continue", keep-alive, and one request at a time (the parser pauses after
 * each). Called by http.c for every received chunk; dps_http_parse_probe runs it alone for the
 * fuzzer and the tests.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/dps.h"
#include "engine/api/http_int.h"

static http_parser_settings settings;

/* ---- small buffers ----------------------------------------------------------------------- */

int dps_http_buf_add(struct buf *b, const char *d, size_t n, size_t limit)
{
	if (b->len + n > limit)
		return -E2BIG;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		char *p;

		while (cap < b->len + n + 1)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p)
			return -ENOMEM;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, d, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

void dps_http_buf_free(struct buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

/* ---- parsing --------------------------------------------------------------------------------- */

static int cb_begin(http_parser *p)
{
	struct preq *q = p->data;

	q->url.len = q->auth.len = q->body.len = 0;
	q->field_len = q->hdr_bytes = q->expect_len = 0;
	q->in_value = q->field_over = q->expect_continue = q->complete = q->want_continue = 0;
	q->status = 0;
	q->started = 1;
	return 0;
}

static int cb_url(http_parser *p, const char *at, size_t n)
{
	struct preq *q = p->data;

	if (dps_http_buf_add(&q->url, at, n, URL_MAX)) {
		q->status = 414;
		return 1;
	}
	return 0;
}

static int cb_field(http_parser *p, const char *at, size_t n)
{
	struct preq *q = p->data;

	if ((q->hdr_bytes += n) > HDR_MAX) {
		q->status = 431;
		return 1;
	}
	if (q->in_value) { /* a new header begins */
		q->in_value = 0;
		q->field_len = 0;
		q->field_over = 0;
	}
	for (size_t i = 0; i < n; i++) {
		if (q->field_len + 1 >= sizeof(q->field)) {
			q->field_over = 1;
			break;
		}
		q->field[q->field_len++] = (char)(at[i] >= 'A' && at[i] <= 'Z' ? at[i] + 32 : at[i]);
	}
	q->field[q->field_len] = '\0';
	return 0;
}

static int cb_value(http_parser *p, const char *at, size_t n)
{
	struct preq *q = p->data;

	if ((q->hdr_bytes += n) > HDR_MAX) {
		q->status = 431;
		return 1;
	}
	q->in_value = 1;
	if (q->field_over)
		return 0;
	if (!strcmp(q->field, "authorization")) {
		if (dps_http_buf_add(&q->auth, at, n, HDR_MAX)) {
			q->status = 431;
			return 1;
		}
	} else if (!strcmp(q->field, "expect")) {
		/* (the value may come in pieces) */
		for (size_t i = 0; i < n && q->expect_len + 1 < sizeof(q->expect); i++)
			q->expect[q->expect_len++] = at[i];
		q->expect[q->expect_len] = '\0';
		q->expect_continue = q->expect_len == 12 && !strncasecmp(q->expect, "100-continue", 12);
	}
	return 0;
}

static int cb_headers_done(http_parser *p)
{
	struct preq *q = p->data;

	if (!(p->flags & F_CHUNKED) && p->content_length != ULLONG_MAX &&
	    p->content_length > q->max_body) {
		q->status = 413;
		return 3; /* (1 and 2 mean "no body" and "upgrade" here: any other value fails) */
	}
	/* HTTP/1.0 clients do not know 100 Continue. */
	q->want_continue = q->expect_continue && (p->http_major > 1 || p->http_minor >= 1);
	return 0;
}

static int cb_body(http_parser *p, const char *at, size_t n)
{
	struct preq *q = p->data;
	const int rc = dps_http_buf_add(&q->body, at, n, q->max_body);

	if (rc) {
		q->status = rc == -E2BIG ? 413 : 503;
		return 1;
	}
	return 0;
}

static int cb_done(http_parser *p)
{
	struct preq *q = p->data;

	q->complete = 1;
	/* An Upgrade request is answered like any other, then the connection closes. */
	q->keep_alive = http_should_keep_alive(p) && !p->upgrade;
	http_parser_pause(p, 1); /* one request at a time */
	return 0;
}

static void settings_init(void)
{
	if (settings.on_message_complete)
		return;
	http_parser_settings_init(&settings);
	settings.on_message_begin = cb_begin;
	settings.on_url = cb_url;
	settings.on_header_field = cb_field;
	settings.on_header_value = cb_value;
	settings.on_headers_complete = cb_headers_done;
	settings.on_body = cb_body;
	settings.on_message_complete = cb_done;
}

void dps_http_preq_init(struct preq *q, size_t max_body)
{
	settings_init();
	http_parser_init(&q->p, HTTP_REQUEST);
	q->p.data = q;
	q->max_body = max_body;
	q->started = q->complete = 0;
}

void dps_http_preq_free(struct preq *q)
{
	dps_http_buf_free(&q->url);
	dps_http_buf_free(&q->auth);
	dps_http_buf_free(&q->body);
}

/*
 * Feeds data to the parser. Returns the bytes consumed; *status: 0 (more needed or a request
 * completed: q->complete) or the error status to answer.
 */
size_t dps_http_preq_feed(struct preq *q, const char *data, size_t len, int *status)
{
	size_t n;
	enum http_errno e;

	*status = 0;
	if (q->complete)
		return 0;
	n = http_parser_execute(&q->p, &settings, data, len);
	e = HTTP_PARSER_ERRNO(&q->p);
	if (e == HPE_PAUSED) {
		http_parser_pause(&q->p, 0);
		return n;
	}
	if (e != HPE_OK)
		*status = q->status ? q->status : 400;
	return n;
}

int dps_http_parse_probe(const char *data, size_t len, size_t max_body, char *method,
			 size_t mlen, char *path, size_t plen, size_t *body_len)
{
	struct preq q;
	int status;

	memset(&q, 0, sizeof(q));
	dps_http_preq_init(&q, max_body ? max_body : (1u << 20));
	dps_http_preq_feed(&q, data, len, &status);
	if (!status && q.complete) {
		snprintf(method, mlen, "%s", http_method_str((enum http_method)q.p.method));
		snprintf(path, plen, "%.*s", (int)strcspn(q.url.p ? q.url.p : "", "?"),
			 q.url.p ? q.url.p : "");
		*body_len = q.body.len;
	} else if (!status) {
		status = 100;
	}
	dps_http_preq_free(&q);
	return status;
}

const char *dps_http_reason(int status)
{
	switch (status) {
	case 100: return "Continue";
	case 200: return "OK";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 413: return "Payload Too Large";
	case 414: return "URI Too Long";
	case 415: return "Unsupported Media Type";
	case 422: return "Unprocessable Entity";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 503: return "Service Unavailable";
	default: return "Unknown";
	}
}

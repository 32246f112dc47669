/* SPDX-License-Identifier: MIT */
/*
 * engine/api/http_respond.c - the responses of http.h, queued on a connection of http.c: a
 * whole response with its Content-Length, or a chunked stream (plain bytes up to the close for
 * an HTTP/1.0 client). Called by the frontend on the loop thread, and by http.c for the errors
 * it answers itself.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/dps.h"
#include "engine/api/http_int.h"

int dps_http_conn_queue(struct conn *c, const char *d, size_t n)
{
	return dps_http_buf_add(&c->out, d, n, OUT_MAX);
}

int dps_http_conn_queue_head(struct conn *c, int status, const char *ctype, const char *len_or_chunked,
		      const char *extra, int close)
{
	char head[512];
	/* Every 503 says when to come back (a client's back-off, and what vLLM's proxies read). */
	char retry[32] = "";
	int n;

	if (status == 503 && !(extra && strcasestr(extra, "Retry-After:")))
		snprintf(retry, sizeof(retry), "Retry-After: %d\r\n", RETRY_AFTER_S);
	n = snprintf(head, sizeof(head),
		     "HTTP/1.1 %d %s\r\nServer: dpshard\r\nContent-Type: %s\r\n%s%s"
		     "Connection: %s\r\n", status, dps_http_reason(status), ctype, len_or_chunked,
		     retry, close ? "close" : "keep-alive");

	if (n < 0 || (size_t)n >= sizeof(head))
		return -EINVAL;
	if (dps_http_conn_queue(c, head, (size_t)n) || (extra && dps_http_conn_queue(c, extra, strlen(extra))) ||
	    dps_http_conn_queue(c, "\r\n", 2))
		return -ENOBUFS;
	return 0;
}

int dps_http_respond(struct dps_http *h, uint64_t conn, int status, const char *content_type,
		     const char *body, size_t len, const char *extra, int close)
{
	struct conn *c = dps_http_conn_of(h, conn);
	char cl[48];

	if (!c || !c->serving || c->streaming || c->resp_done)
		return -ENOTCONN;
	c->close_after |= close;
	snprintf(cl, sizeof(cl), "Content-Length: %zu\r\n", len);
	if (dps_http_conn_queue_head(c, status, content_type, cl, extra, c->close_after) ||
	    (len && !c->head && dps_http_conn_queue(c, body, len))) {
		dps_http_conn_gone(h, c);
		return -ENOTCONN;
	}
	dps_http_conn_done(h, c);
	return 0;
}

int dps_http_stream_start(struct dps_http *h, uint64_t conn, int status,
			  const char *content_type)
{
	struct conn *c = dps_http_conn_of(h, conn);

	if (!c || !c->serving || c->streaming || c->resp_done)
		return -ENOTCONN;
	/* HTTP/1.0 knows no chunks: the body runs until the connection closes. */
	if (c->http10)
		c->close_after = 1;
	if (dps_http_conn_queue_head(c, status, content_type, c->http10 ? "" : "Transfer-Encoding: chunked\r\n",
		       "Cache-Control: no-cache\r\n", c->close_after)) {
		dps_http_conn_gone(h, c);
		return -ENOTCONN;
	}
	c->streaming = 1;
	dps_http_conn_kick_send(h, c);
	return 0;
}

int dps_http_stream_write(struct dps_http *h, uint64_t conn, const char *data, size_t len)
{
	struct conn *c = dps_http_conn_of(h, conn);
	char sz[24];
	const int n = snprintf(sz, sizeof(sz), "%zx\r\n", len);

	if (!c || !c->streaming || c->resp_done)
		return -ENOTCONN;
	if (!len || c->head)
		return 0;
	if ((!c->http10 && dps_http_conn_queue(c, sz, (size_t)n)) || dps_http_conn_queue(c, data, len) ||
	    (!c->http10 && dps_http_conn_queue(c, "\r\n", 2))) {
		dps_warn("dropping a client that lets %u MiB of its stream queue up", OUT_MAX >> 20);
		dps_http_conn_gone(h, c);
		return -ENOTCONN;
	}
	dps_http_conn_kick_send(h, c);
	return 0;
}

int dps_http_stream_end(struct dps_http *h, uint64_t conn)
{
	struct conn *c = dps_http_conn_of(h, conn);

	if (!c || !c->streaming || c->resp_done)
		return -ENOTCONN;
	if (!c->http10 && !c->head && dps_http_conn_queue(c, "0\r\n\r\n", 5)) {
		dps_http_conn_gone(h, c);
		return -ENOTCONN;
	}
	dps_http_conn_done(h, c);
	return 0;
}

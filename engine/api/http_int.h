/* SPDX-License-Identifier: MIT */
/*
 * engine/api/http_int.h - what http.c (connections) and http_parse.c (the request parser)
 * share: growable buffers with a limit, and the parse state of one request.
 */
#ifndef DPS_ENGINE_API_HTTP_INT_H
#define DPS_ENGINE_API_HTTP_INT_H

#include <stddef.h>

#include <http_parser.h>

#include "engine/api/http.h"

#define URL_MAX 8192
#define HDR_MAX 16384

struct buf {
	char *p;
	size_t len, cap;
};

/* The parse state of one request (also used alone by dps_http_parse_probe). */
struct preq {
	http_parser p;
	size_t max_body;
	struct buf url, auth, body;
	char field[32], expect[16];
	size_t field_len, hdr_bytes, expect_len;
	int in_value, field_over, expect_continue, complete, status, keep_alive, started;
	int want_continue; /* headers done with Expect: 100-continue: answer it */
};

/* Appends n bytes of d to b (kept NUL-terminated): 0, -E2BIG past limit, or -ENOMEM. */
int dps_http_buf_add(struct buf *b, const char *d, size_t n, size_t limit);
void dps_http_buf_free(struct buf *b);

/* A fresh request of at most max_body body bytes. */
void dps_http_preq_init(struct preq *q, size_t max_body);
void dps_http_preq_free(struct preq *q);
/*
 * Parses up to len bytes of data into q; returns how many it consumed (it stops after one
 * complete request). *status: 0, or the error status to answer (400, 413, 414, 431).
 */
size_t dps_http_preq_feed(struct preq *q, const char *data, size_t len, int *status);

/*
 * The receive buffers (http_rbuf.c): n buffers of size bytes (n a power of two) registered
 * on ring as provided-buffer group bgid, for receives with IOSQE_BUFFER_SELECT. new: 0,
 * -EINVAL, -ENOMEM, or -errno of the registration (a kernel before 5.19). data: buffer bid's
 * bytes; put: gives buffer bid back to the kernel once its bytes are copied. free(busy): busy
 * when a receive may still be in flight (the memory then stays mapped).
 */
struct dps_http_rbufs;
int dps_http_rbufs_new(struct dps_http_rbufs **out, struct io_uring *ring, unsigned n,
		       unsigned size, int bgid);
const char *dps_http_rbufs_data(const struct dps_http_rbufs *b, unsigned bid);
void dps_http_rbufs_put(struct dps_http_rbufs *b, unsigned bid);
void dps_http_rbufs_free(struct dps_http_rbufs *b, int busy);

/*
 * The listener (http_listen.c): a TCP socket bound to host:port (0: any free port, *bound
 * says which), or a Unix socket at path (its path copied to bound). Each returns 0 with *lfd
 * listening, or -errno with err naming the address.
 */
int dps_http_listen_tcp(const char *host, int port, int *lfd, int *bound, char *err,
			size_t errlen);
int dps_http_listen_unix(const char *path, int *lfd, char *bound, size_t bound_len, char *err,
			 size_t errlen);

#endif

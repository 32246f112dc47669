/* SPDX-License-Identifier: MIT */
/*
 * engine/api/http_int.h - what the files of the HTTP server share: http.c (connections),
 * http_respond.c (responses), http_parse.c (the parser), http_rbuf.c (receive buffers),
 * http_listen.c (the listener): growable buffers with a limit, the parse state of a request,
 * the connections.
 */
#ifndef DPS_ENGINE_API_HTTP_INT_H
#define DPS_ENGINE_API_HTTP_INT_H

#include <stddef.h>
#include <stdint.h>

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
void dps_http_rbufs_free(struct dps_http_rbufs *b, int busy);

/*
 * The receives that found every buffer taken (-ENOBUFS) wait for one in FIFO order, each on
 * its connection's link (intrusive: nothing is allocated). Arming them again at once would
 * fail again while the pool is empty, and never let the event loop block. wait: queues link
 * (once). leave: takes it off (a connection that closes). put: gives buffer bid back once its
 * bytes are copied, and returns the oldest waiter, now off the queue, to arm again (NULL:
 * none); one buffer, one waiter. next: the oldest waiter, off the queue, for the loop's tick.
 */
struct dps_http_waiter {
	struct dps_http_waiter *prev, *next;
	int queued;
};
void dps_http_rbufs_wait(struct dps_http_rbufs *b, struct dps_http_waiter *w);
void dps_http_rbufs_leave(struct dps_http_rbufs *b, struct dps_http_waiter *w);
struct dps_http_waiter *dps_http_rbufs_put(struct dps_http_rbufs *b, unsigned bid);
struct dps_http_waiter *dps_http_rbufs_next(struct dps_http_rbufs *b);
int dps_http_rbufs_waiting(const struct dps_http_rbufs *b); /* 1: a receive waits */

/*
 * The listener (http_listen.c): a TCP socket bound to host:port (0: any free port, *bound
 * says which), or a Unix socket at path (its path copied to bound). Each returns 0 with *lfd
 * listening, or -errno with err naming the address.
 */
int dps_http_listen_tcp(const char *host, int port, int *lfd, int *bound, char *err,
			size_t errlen);
int dps_http_listen_unix(const char *path, int *lfd, char *bound, size_t bound_len, char *err,
			 size_t errlen);

/*
 * The connections (http.c) and the responses queued on them (http_respond.c).
 */
#define OUT_MAX (16u << 20)   /* response bytes a slow reader may let queue up */
#define RETRY_AFTER_S 1

struct conn {
	int used, fd;
	uint32_t gen;
	struct preq q;
	struct buf in;             /* received, not yet parsed */
	struct buf out, sending;   /* queued response bytes; the bytes of the send in flight */
	size_t sent;               /* of sending */
	int recv_inflight, send_inflight;
	int serving;               /* a request went to the handler; its response is not done */
	int streaming, resp_done, close_after;
	int head;                  /* the request is HEAD: headers only */
	int http10;                /* an HTTP/1.0 client: no chunked encoding */
	int closing, lingering, gone_told;
	int refused;               /* a spare slot: answered 503 at once, nothing parsed */
	struct dps_http_waiter wait; /* its receive waits for a buffer (http_rbuf.c) */
	uint64_t t_first, t_active, t_progress, t_linger;
};

struct dps_http {
	struct io_uring *ring;
	struct dps_http_opts o;
	int lfd, port, accept_armed;
	uint64_t accept_retry;     /* accepting failed (descriptors out): try again then */
	uint64_t accept_warned, refuse_warned;
	struct conn *c;            /* (n_slots): max_conns, then SPARE_CONNS */
	struct dps_http_rbufs *rbufs;
	int n_slots, n_used, n_refused;
	int peak;                  /* connections open at most since the last trim */
	uint64_t rearms;           /* receives armed again after they found no buffer */
	int put_rearmed;           /* a buffer given back armed a waiter since the last tick */
	char unix_path[108];
};

/* The live connection of a handle, or NULL. */
struct conn *dps_http_conn_of(struct dps_http *h, uint64_t handle);
/* The connection ends now (client gone, error, or done): the frontend is told once. */
void dps_http_conn_gone(struct dps_http *h, struct conn *c);
/* Sends what is queued, unless a send is in flight. */
void dps_http_conn_kick_send(struct dps_http *h, struct conn *c);
/* The response of the request being served is complete (all queued). */
void dps_http_conn_done(struct dps_http *h, struct conn *c);
/* Queues n bytes of d on c's output: 0, or -E2BIG past OUT_MAX, or -ENOMEM. */
int dps_http_conn_queue(struct conn *c, const char *d, size_t n);
/* Queues a response's head (status line, headers, extra lines, the blank line): 0, -EINVAL
 * (too long), -ENOBUFS (the output is full). */
int dps_http_conn_queue_head(struct conn *c, int status, const char *ctype,
			     const char *len_or_chunked, const char *extra, int close);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * engine/api/http.h - the HTTP/1.1 server of `dpshard serve`, on the supervisor's io_uring.
 *
 * Accept (multishot), receive and send are io_uring requests on the ring the supervisor's loop
 * waits on; their completions come back through dps_http_cqe (user_data below bit 62, tagged
 * with the operation, the connection slot and the slot's generation; bit 62 is the frontend's,
 * DPS_FE_UDATA, and bit 63 the supervisor's). Requests are parsed by
 * http-parser (the Node.js parser, Debian's libhttp-parser). One request per connection is
 * served at a time (bytes a client pipelines wait in its buffer); keep-alive by the HTTP/1.1
 * rules; "Expect: 100-continue" answered.
 *
 * Limits, each answered with its status and the connection closed: a request line over 8 KiB
 * (414), headers over 16 KiB (431), a body over max_body (413), a malformed request (400), a
 * request not complete within header_timeout_ms of its first byte (408). An idle keep-alive
 * connection is closed after idle_timeout_ms; a client that does not read its response within
 * send_timeout_ms, or lets more than 16 MiB queue up, is dropped. A client that closes or
 * half-closes its side is gone: on_close tells the frontend, which cancels its request.
 * When a burst of connections drains, the free pages of the heap go back to the kernel
 * (malloc_trim), so that bursts do not leave the supervisor's memory higher each time.
 *
 * Connections are named by a handle (slot and generation), so a late response to a closed
 * connection is refused (-ENOTCONN) instead of reaching the next client of the slot.
 */
#ifndef DPS_ENGINE_HTTP_H
#define DPS_ENGINE_HTTP_H

#include <stddef.h>
#include <stdint.h>

struct io_uring;
struct io_uring_cqe;
struct dps_http;

struct dps_http_req {
	uint64_t conn;            /* the connection's handle */
	const char *method;       /* "GET", "POST", ... */
	const char *path;         /* the request target without its query */
	const char *authorization; /* the header's value, or NULL */
	const char *body;         /* body_len bytes (not NUL-terminated) */
	size_t body_len;
};

struct dps_http_opts {
	const char *host;         /* TCP host (NULL: 127.0.0.1) ... */
	int port;                 /* ... and port (0: any free one; dps_http_port says which) */
	const char *unix_path;    /* or a Unix socket (then host and port are not used) */
	size_t max_body;          /* bytes (0: 1 MiB) */
	int max_conns;            /* at once (0: 1024); more get 503 (64 at a time), then close */
	unsigned header_timeout_ms, idle_timeout_ms, send_timeout_ms; /* 0: 30 s, 75 s, 60 s */
	void (*on_request)(void *arg, const struct dps_http_req *r);
	void (*on_close)(void *arg, uint64_t conn); /* the connection is gone (any reason) */
	void *arg;
};

/* Binds and listens; accepting starts on the ring. 0, or -errno with err naming the address. */
int dps_http_start(struct dps_http **out, struct io_uring *ring, const struct dps_http_opts *o,
		   char *err, size_t errlen);
/* The port listened on (TCP), or 0. */
int dps_http_port(const struct dps_http *h);
/* Handles a completion of the server (any user_data without bits 62 and 63 belongs to it). */
void dps_http_cqe(struct dps_http *h, const struct io_uring_cqe *cqe);
/* Applies the timeouts; returns the ms until the next one is due (-1: none). */
int dps_http_tick(struct dps_http *h);
/* In a forked child: closes every descriptor of the server, touching nothing else. */
void dps_http_close_fds(struct dps_http *h);
/* Connections open now; connections with response bytes not yet sent. */
int dps_http_conns(const struct dps_http *h);
int dps_http_unsent(const struct dps_http *h);
/* Receives armed again after they found every shared buffer taken (-ENOBUFS), since start. */
uint64_t dps_http_receive_rearms(const struct dps_http *h);
/* Closes the listener (at shutdown: connections already open are still served). */
void dps_http_stop_accepting(struct dps_http *h);
/* Closes every connection and the listener, and frees the server. */
void dps_http_free(struct dps_http *h);

/*
 * Responses, for the request of conn being served: a whole response (extra: more header
 * lines, each ending in CRLF, or NULL), or a chunked stream (start, writes, end). close: the
 * connection closes after it. Each returns 0 or -ENOTCONN when the connection is gone.
 */
int dps_http_respond(struct dps_http *h, uint64_t conn, int status, const char *content_type,
		     const char *body, size_t len, const char *extra, int close);
int dps_http_stream_start(struct dps_http *h, uint64_t conn, int status,
			  const char *content_type);
int dps_http_stream_write(struct dps_http *h, uint64_t conn, const char *data, size_t len);
int dps_http_stream_end(struct dps_http *h, uint64_t conn);

/* "OK", "Not Found", ... */
const char *dps_http_reason(int status);

/*
 * For the fuzz target: feeds bytes to a fresh parser under the server's limits and returns
 * the status the server would answer with before any handler runs (0: a complete request was
 * parsed, with its method, path and body length in the out parameters; 100: incomplete).
 */
int dps_http_parse_probe(const char *data, size_t len, size_t max_body, char *method,
			 size_t mlen, char *path, size_t plen, size_t *body_len);

#endif

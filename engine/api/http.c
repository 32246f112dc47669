/* SPDX-License-Identifier: MIT */
/*
 * engine/api/http.c - the HTTP/1.1 server of http.h: the listener and the connections on
 * io_uring (accept, receive, send, timeouts, keep-alive), the responses; requests are parsed
 * by http_parse.c. Outside input: every size is bounded before it is stored.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <http_parser.h>
#include <liburing.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "common/dps.h"
#include "engine/api/http_int.h"

enum { OP_ACCEPT = 1, OP_RECV, OP_SEND };

#define RECV_CHUNK 16384
/* The receive buffers all connections share (http_rbuf.c): a receive holds one only from the
 * arrival of its bytes until they are copied, so a few cover any number of connections. */
#define RECV_BUFS 64
#define RECV_BGID 0x4854 /* the buffer group's id on the shared ring */
/* With receives waiting for a buffer and none given back since, the tick arms a pool's worth
 * of them at least this often (ms). */
#define RECV_WAIT_MS 10
#define IN_MAX (256u << 10)   /* unparsed bytes kept while a request is served */
#define LINGER_MS 2000
/* Slots beyond --max-connections, for the clients that come when all are taken: each gets a
 * 503 with Retry-After and the lingering close of any response (a bare close would read as a
 * crash). Only when these are taken too is a client closed without an answer. */
#define SPARE_CONNS 64
/* A burst of at least this many connections that drains to an eighth of it gives the heap's
 * free pages back (conn_trim). */
#define TRIM_PEAK 64

/* ---- connections ------------------------------------------------------------------------------ */

static uint64_t udata(int op, int slot, uint32_t gen)
{
	return (uint64_t)op | ((uint64_t)(unsigned)slot << 8) | ((uint64_t)(gen & 0x3fffffffu) << 32);
}

static uint64_t handle_of(const struct dps_http *h, const struct conn *c)
{
	return ((uint64_t)c->gen << 32) | (uint64_t)(c - h->c);
}

/* The live connection of a handle, or NULL. */
struct conn *dps_http_conn_of(struct dps_http *h, uint64_t handle)
{
	const uint32_t slot = (uint32_t)handle;
	struct conn *c;

	if (slot >= (uint32_t)h->n_slots)
		return NULL;
	c = &h->c[slot];
	return c->used && !c->closing && c->gen == (uint32_t)(handle >> 32) ? c : NULL;
}

/* A submission entry; when the queue is full, what is queued is submitted first (mid-batch:
 * so every receive buffer of a completion handled is given back before anything is armed). */
static struct io_uring_sqe *sqe_get(struct dps_http *h)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(h->ring);

	if (!sqe) {
		io_uring_submit(h->ring);
		sqe = io_uring_get_sqe(h->ring);
	}
	return sqe;
}

static void arm_accept(struct dps_http *h)
{
	struct io_uring_sqe *sqe;

	if (h->accept_armed || h->lfd < 0 || !(sqe = sqe_get(h)))
		return;
	io_uring_prep_multishot_accept(sqe, h->lfd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data64(sqe, udata(OP_ACCEPT, 0, 0));
	h->accept_armed = 1;
}

static void arm_recv(struct dps_http *h, struct conn *c)
{
	struct io_uring_sqe *sqe;

	if (c->recv_inflight || c->wait.queued || (c->closing && !c->lingering) ||
	    c->in.len >= IN_MAX || !(sqe = sqe_get(h)))
		return;
	io_uring_prep_recv(sqe, c->fd, NULL, RECV_CHUNK, 0);
	sqe->flags |= IOSQE_BUFFER_SELECT;
	sqe->buf_group = RECV_BGID;
	io_uring_sqe_set_data64(sqe, udata(OP_RECV, (int)(c - h->c), c->gen));
	c->recv_inflight = 1;
}

void dps_http_conn_kick_send(struct dps_http *h, struct conn *c)
{
	struct io_uring_sqe *sqe;
	struct buf t;

	if (c->send_inflight || c->closing)
		return;
	if (c->sent == c->sending.len) {
		if (!c->out.len)
			return;
		/* The queued bytes become the send in flight; new ones queue in a fresh buffer. */
		t = c->sending;
		c->sending = c->out;
		c->out = t;
		c->out.len = 0;
		c->sent = 0;
	}
	if (!(sqe = sqe_get(h)))
		return;
	io_uring_prep_send(sqe, c->fd, c->sending.p + c->sent, c->sending.len - c->sent,
			   MSG_NOSIGNAL);
	io_uring_sqe_set_data64(sqe, udata(OP_SEND, (int)(c - h->c), c->gen));
	c->send_inflight = 1;
	if (!c->t_progress)
		c->t_progress = dps_now_ns();
}

/*
 * After a burst has drained: gives the free pages of the heap back to the kernel. A burst of N
 * connections frees N sets of buffers (the input's and the parser's, the request's job and
 * state), but glibc returns memory to the kernel only from the top of the heap, and the few
 * chunks that outlive a burst pin it: without this, each burst left the pages it had touched
 * resident, and the supervisor's RSS crept up by hundreds of KB per burst of 1,000 until the
 * whole high-water heap was resident. malloc_trim(0) releases the free pages anywhere in every
 * arena (the prep workers' too). Once per drained burst, never per connection: a trim walks
 * the free lists, and pages given back are faulted in again by the next burst.
 */
static void conn_trim(struct dps_http *h)
{
	if (h->peak < TRIM_PEAK || h->n_used > h->peak / 8)
		return;
	h->peak = h->n_used;
#ifdef __GLIBC__
	malloc_trim(0);
#endif
}

/* Frees the slot once no request of it is in flight. */
static void conn_reap(struct dps_http *h, struct conn *c)
{
	if (c->closing && !c->lingering)
		dps_http_rbufs_leave(h->rbufs, &c->wait); /* it reads no more */
	if (!c->used || !c->closing || c->recv_inflight || c->send_inflight)
		return;
	if (c->lingering)
		return;
	close(c->fd);
	dps_http_preq_free(&c->q);
	dps_http_buf_free(&c->in);
	dps_http_buf_free(&c->out);
	dps_http_buf_free(&c->sending);
	c->used = 0;
	c->fd = -1;
	c->gen = (c->gen + 1) & 0x7fffffffu;
	h->n_used--;
	h->n_refused -= c->refused;
	conn_trim(h);
}

/* The connection ends now (client gone, error, or done): tell the frontend once. */
void dps_http_conn_gone(struct dps_http *h, struct conn *c)
{
	const uint64_t handle = handle_of(h, c);

	if (!c->closing) {
		c->closing = 1;
		c->lingering = 0;
		shutdown(c->fd, SHUT_RDWR);
	}
	if (!c->gone_told) {
		c->gone_told = 1;
		if (h->o.on_close)
			h->o.on_close(h->o.arg, handle);
	}
	conn_reap(h, c);
}

/*
 * After the last response of a connection: stop sending, read and drop what the client still
 * sends until it closes (or LINGER_MS), so that a reset cannot destroy the response in flight.
 */
static void conn_linger(struct dps_http *h, struct conn *c)
{
	const uint64_t handle = handle_of(h, c);

	shutdown(c->fd, SHUT_WR);
	c->closing = 1;
	c->lingering = 1;
	c->t_linger = dps_now_ns() + (uint64_t)LINGER_MS * 1000000ull;
	if (!c->gone_told) {
		c->gone_told = 1;
		if (h->o.on_close)
			h->o.on_close(h->o.arg, handle);
	}
	arm_recv(h, c);
}

static void process(struct dps_http *h, struct conn *c);

/* The response of the request being served is complete (all queued). */
void dps_http_conn_done(struct dps_http *h, struct conn *c)
{
	c->resp_done = 1;
	dps_http_conn_kick_send(h, c);
}

/* Called when everything queued has been sent. */
static void sent_all(struct dps_http *h, struct conn *c)
{
	c->t_progress = 0;
	if (!c->resp_done)
		return;
	c->resp_done = 0;
	c->serving = 0;
	c->streaming = 0;
	if (c->close_after) {
		conn_linger(h, c);
		return;
	}
	c->q.started = 0;
	c->t_first = 0;
	c->t_active = dps_now_ns();
	process(h, c);
	arm_recv(h, c);
}

/* Answers an error before any handler ran (why: its message, NULL: the status's reason), and
 * closes the connection after it. */
static void fail_request(struct dps_http *h, struct conn *c, int status, const char *why)
{
	char body[256], cl[48];
	const int n = snprintf(body, sizeof(body),
			       "{\"error\": {\"message\": \"%s\", \"type\": \"%s\", "
			       "\"code\": %d}}\n", why ? why : dps_http_reason(status),
			       status == 503 ? "service_unavailable" : "invalid_request_error", status);

	c->serving = 1;
	c->close_after = 1;
	c->out.len = 0;
	snprintf(cl, sizeof(cl), "Content-Length: %d\r\n", n);
	if (dps_http_conn_queue_head(c, status, "application/json", cl, NULL, 1) || dps_http_conn_queue(c, body, (size_t)n)) {
		dps_http_conn_gone(h, c);
		return;
	}
	dps_http_conn_done(h, c);
}

/* Parses what was received; hands a complete request to the handler. */
static void process(struct dps_http *h, struct conn *c)
{
	while (!c->serving && !c->closing && c->in.len) {
		int status;
		const size_t n = dps_http_preq_feed(&c->q, c->in.p, c->in.len, &status);

		if (c->q.started && !c->t_first)
			c->t_first = dps_now_ns();
		memmove(c->in.p, c->in.p + n, c->in.len - n);
		c->in.len -= n;
		if (status) {
			fail_request(h, c, status, NULL);
			return;
		}
		if (c->q.want_continue) {
			c->q.want_continue = 0;
			if (!dps_http_conn_queue(c, "HTTP/1.1 100 Continue\r\n\r\n", 25))
				dps_http_conn_kick_send(h, c);
		}
		if (!c->q.complete) {
			if (!n)
				break;
			continue;
		}
		c->q.complete = 0;
		c->serving = 1;
		c->close_after = !c->q.keep_alive;
		c->head = c->q.p.method == HTTP_HEAD;
		c->http10 = c->q.p.http_major == 1 && c->q.p.http_minor == 0;
		{
			struct dps_http_req r = { 0 };
			char method[16], path[URL_MAX + 1];
			const char *url = c->q.url.p ? c->q.url.p : "";

			snprintf(method, sizeof(method), "%s",
				 http_method_str((enum http_method)c->q.p.method));
			snprintf(path, sizeof(path), "%.*s", (int)strcspn(url, "?"), url);
			r.conn = handle_of(h, c);
			r.method = method;
			r.path = path;
			r.authorization = c->q.auth.len ? c->q.auth.p : NULL;
			r.body = c->q.body.p ? c->q.body.p : "";
			r.body_len = c->q.body.len;
			h->o.on_request(h->o.arg, &r);
		}
	}
}

static void on_accept(struct dps_http *h, const struct io_uring_cqe *cqe)
{
	const int fd = cqe->res;
	struct conn *c = NULL;
	int one = 1;

	if (!(cqe->flags & IORING_CQE_F_MORE))
		h->accept_armed = 0;
	if (fd < 0) {
		/* Out of descriptors or memory: accepting again at once would spin; the tick does
		 * it in a moment (and the warning comes at most once a minute). */
		const uint64_t now = dps_now_ns();

		if (fd != -ECANCELED && now - h->accept_warned > 60000000000ull) {
			dps_warn("accept: %s (retrying every 100 ms)", strerror(-fd));
			h->accept_warned = now;
		}
		h->accept_retry = now + 100000000ull;
		return;
	}
	/* A slot of the first max_conns while fewer are taken, else a spare one to refuse in. */
	for (int i = 0; i < h->n_slots && !c; i++)
		if (!h->c[i].used && (i >= h->o.max_conns) == (h->n_used - h->n_refused >=
								 h->o.max_conns))
			c = &h->c[i];
	if (!c) {
		const uint64_t now = dps_now_ns();

		if (now - h->refuse_warned > 10000000000ull) {
			dps_warn("%d connections open and %d refusals in flight: closing another",
				 h->o.max_conns, SPARE_CONNS);
			h->refuse_warned = now;
		}
		close(fd);
		arm_accept(h);
		return;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); /* (fails on Unix sockets) */
	{
		const uint32_t gen = c->gen;

		memset(c, 0, sizeof(*c));
		c->gen = gen;
	}
	c->used = 1;
	c->fd = fd;
	dps_http_preq_init(&c->q, h->o.max_body);
	c->t_active = dps_now_ns();
	h->n_used++;
	h->peak = h->n_used > h->peak ? h->n_used : h->peak;
	if (c >= h->c + h->o.max_conns) {
		c->refused = 1;
		h->n_refused++;
	}
	if (c->refused) {
		char why[96];
		const uint64_t now = dps_now_ns();

		if (now - h->refuse_warned > 10000000000ull) {
			dps_warn("%d connections open (--max-connections): new clients get 503",
				 h->o.max_conns);
			h->refuse_warned = now;
		}

		snprintf(why, sizeof(why), "%d connections open (--max-connections): try again later",
			 h->o.max_conns);
		fail_request(h, c, 503, why); /* its lingering close drops what the client sends */
	} else {
		arm_recv(h, c);
	}
	arm_accept(h);
}

/* Arms the receive of a connection that waited for a buffer. */
static void arm_waiter(struct dps_http *h, struct dps_http_waiter *w)
{
	h->rearms++;
	arm_recv(h, (struct conn *)(void *)((char *)w - offsetof(struct conn, wait)));
}

/* Gives buffer bid back (-1: none), and with it a turn to the oldest receive waiting. */
static void rbuf_give_back(struct dps_http *h, int bid)
{
	struct dps_http_waiter *w;

	if (bid < 0 || !(w = dps_http_rbufs_put(h->rbufs, (unsigned)bid)))
		return;
	h->put_rearmed = 1;
	arm_waiter(h, w);
}

/* A receive of c completed with res (bytes, or -errno), into buffer bid (-1: none). */
static void on_recv(struct dps_http *h, struct conn *c, int res, int bid)
{
	const char *data = bid >= 0 ? dps_http_rbufs_data(h->rbufs, (unsigned)bid) : NULL;
	int lost = 0;

	c->recv_inflight = 0;
	if (res == -ENOBUFS) {
		/*
		 * Every shared buffer was taken when the bytes came. Asking again at once would
		 * fail again while the pool is empty (and the loop would never block): the
		 * receive waits in line, and each buffer given back arms the oldest (the tick
		 * the rest, so that none starves).
		 */
		if (c->closing && !c->lingering)
			conn_reap(h, c);
		else
			dps_http_rbufs_wait(h->rbufs, &c->wait);
		return;
	}
	if (res > 0 && data && !c->closing) {
		c->t_active = dps_now_ns();
		lost = dps_http_buf_add(&c->in, data, (size_t)res, IN_MAX + RECV_CHUNK) != 0;
	}
	/* Copied: the buffer goes back before anything is armed, so before any submit. */
	rbuf_give_back(h, bid);
	if (res <= 0 || !data) {
		/* The client closed (or half-closed) its side, or the socket failed. */
		c->lingering = 0;
		dps_http_conn_gone(h, c);
		return;
	}
	if (c->lingering) { /* dropped */
		arm_recv(h, c);
		return;
	}
	if (c->closing) {
		conn_reap(h, c);
		return;
	}
	if (lost) {
		dps_http_conn_gone(h, c);
		return;
	}
	process(h, c);
	arm_recv(h, c);
}

void dps_http_cqe(struct dps_http *h, const struct io_uring_cqe *cqe)
{
	const uint64_t u = io_uring_cqe_get_data64(cqe);
	const int op = (int)(u & 0xff), slot = (int)((u >> 8) & 0xffffff);
	const uint32_t gen = (uint32_t)(u >> 32);
	struct conn *c;

	if (op == OP_ACCEPT) {
		on_accept(h, cqe);
		return;
	}
	if (op == OP_RECV && (cqe->flags & IORING_CQE_F_BUFFER)) {
		const unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;

		if (slot < h->n_slots && h->c[slot].used && (h->c[slot].gen & 0x3fffffffu) == gen)
			on_recv(h, &h->c[slot], cqe->res, (int)bid);
		else
			rbuf_give_back(h, (int)bid);
		return;
	}
	if (slot >= h->n_slots)
		return;
	c = &h->c[slot];
	if (!c->used || (c->gen & 0x3fffffffu) != gen)
		return;
	if (op == OP_RECV) {
		on_recv(h, c, cqe->res, -1);
	} else if (op == OP_SEND) {
		c->send_inflight = 0;
		if (cqe->res <= 0) {
			dps_http_conn_gone(h, c);
			return;
		}
		if (c->closing) {
			conn_reap(h, c);
			return;
		}
		c->sent += (size_t)cqe->res;
		c->t_progress = dps_now_ns();
		if (c->sent < c->sending.len || c->out.len) {
			dps_http_conn_kick_send(h, c);
			return;
		}
		sent_all(h, c);
	}
}

int dps_http_tick(struct dps_http *h)
{
	const uint64_t now = dps_now_ns();
	const uint64_t hdr = (uint64_t)h->o.header_timeout_ms * 1000000ull;
	const uint64_t idle = (uint64_t)h->o.idle_timeout_ms * 1000000ull;
	const uint64_t snd = (uint64_t)h->o.send_timeout_ms * 1000000ull;
	uint64_t next = UINT64_MAX;

	if (!h->accept_armed && h->lfd >= 0) {
		if (now >= h->accept_retry)
			arm_accept(h);
		else
			next = h->accept_retry;
	}
	for (int i = 0; i < h->n_slots; i++) {
		struct conn *c = &h->c[i];
		uint64_t due;

		if (!c->used)
			continue;
		/* An operation that found no submission slot is tried again here. */
		if (!c->closing && !c->send_inflight && (c->sent < c->sending.len || c->out.len))
			dps_http_conn_kick_send(h, c);
		if (!c->recv_inflight && (!c->closing || c->lingering) && c->in.len < IN_MAX)
			arm_recv(h, c);
		if (c->lingering) {
			if (now >= c->t_linger) {
				c->lingering = 0;
				shutdown(c->fd, SHUT_RDWR);
				conn_reap(h, c);
			} else if (c->t_linger < next) {
				next = c->t_linger;
			}
			continue;
		}
		if (c->closing)
			continue;
		if (c->send_inflight && c->t_progress) {
			due = c->t_progress + snd;
			if (now >= due) {
				dps_warn("dropping a client that reads nothing for %u ms",
					 h->o.send_timeout_ms);
				dps_http_conn_gone(h, c);
				continue;
			}
			next = due < next ? due : next;
		}
		if (c->serving)
			continue;
		if (c->t_first) {
			due = c->t_first + hdr;
			if (now >= due) {
				fail_request(h, c, 408, NULL);
				continue;
			}
		} else {
			due = c->t_active + idle;
			if (now >= due) {
				dps_http_conn_gone(h, c);
				continue;
			}
		}
		next = due < next ? due : next;
	}
	/* Receives still waiting that no given-back buffer armed since the last tick (those it
	 * armed had nothing to read yet): a pool's worth more, since more would only fail. */
	if (!h->put_rearmed) {
		struct dps_http_waiter *w;

		for (int k = 0; k < RECV_BUFS && (w = dps_http_rbufs_next(h->rbufs)); k++)
			arm_waiter(h, w);
	}
	h->put_rearmed = 0;
	if (dps_http_rbufs_waiting(h->rbufs) && now + RECV_WAIT_MS * 1000000ull < next)
		next = now + RECV_WAIT_MS * 1000000ull;
	if (next == UINT64_MAX)
		return -1;
	return next <= now ? 0 : (int)((next - now) / 1000000ull) + 1;
}

int dps_http_start(struct dps_http **out, struct io_uring *ring, const struct dps_http_opts *o,
		   char *err, size_t errlen)
{
	struct dps_http *h = calloc(1, sizeof(*h));
	int rc;

	*out = NULL;
	if (!h)
		return -ENOMEM;
	h->ring = ring;
	h->o = *o;
	h->lfd = -1;
	if (!h->o.max_body)
		h->o.max_body = 1u << 20;
	if (h->o.max_conns <= 0 || h->o.max_conns > 0xffffff - SPARE_CONNS)
		h->o.max_conns = 1024;
	if (!h->o.header_timeout_ms)
		h->o.header_timeout_ms = 30000;
	if (!h->o.idle_timeout_ms)
		h->o.idle_timeout_ms = 75000;
	if (!h->o.send_timeout_ms)
		h->o.send_timeout_ms = 60000;
	h->n_slots = h->o.max_conns + SPARE_CONNS;
	h->c = calloc((size_t)h->n_slots, sizeof(*h->c));
	if (!h->c) {
		free(h);
		return -ENOMEM;
	}
	for (int i = 0; i < h->n_slots; i++)
		h->c[i].fd = -1;
	rc = dps_http_rbufs_new(&h->rbufs, ring, RECV_BUFS, RECV_CHUNK, RECV_BGID);
	if (rc) {
		snprintf(err, errlen, "cannot register %d receive buffers on the io_uring (provided "
			 "buffer rings need Linux 5.19): %s", RECV_BUFS, strerror(-rc));
		free(h->c);
		free(h);
		return rc;
	}
	rc = h->o.unix_path ? dps_http_listen_unix(h->o.unix_path, &h->lfd, h->unix_path,
						    sizeof(h->unix_path), err, errlen)
			     : dps_http_listen_tcp(h->o.host ? h->o.host : "127.0.0.1", h->o.port,
						   &h->lfd, &h->port, err, errlen);
	if (rc) {
		dps_http_rbufs_free(h->rbufs, 0);
		free(h->c);
		free(h);
		return rc;
	}
	arm_accept(h);
	io_uring_submit(ring);
	*out = h;
	return 0;
}

int dps_http_port(const struct dps_http *h)
{
	return h->port;
}

int dps_http_conns(const struct dps_http *h)
{
	return h->n_used - h->n_refused;
}

uint64_t dps_http_receive_rearms(const struct dps_http *h)
{
	return h->rearms;
}

int dps_http_unsent(const struct dps_http *h)
{
	int n = 0;

	for (int i = 0; i < h->n_slots; i++) {
		const struct conn *c = &h->c[i];

		n += c->used && !c->closing && (c->send_inflight || c->out.len ||
						c->sent < c->sending.len);
	}
	return n;
}

void dps_http_stop_accepting(struct dps_http *h)
{
	if (h->lfd >= 0) {
		shutdown(h->lfd, SHUT_RDWR); /* ends the multishot accept */
		close(h->lfd);
		h->lfd = -1;
	}
}

void dps_http_close_fds(struct dps_http *h)
{
	if (!h)
		return;
	if (h->lfd >= 0)
		close(h->lfd);
	for (int i = 0; i < h->n_slots; i++)
		if (h->c[i].used && h->c[i].fd >= 0)
			close(h->c[i].fd);
}

void dps_http_free(struct dps_http *h)
{
	int busy = 0;

	if (!h)
		return;
	if (h->lfd >= 0)
		close(h->lfd);
	if (h->unix_path[0])
		unlink(h->unix_path);
	for (int i = 0; i < h->n_slots; i++) {
		struct conn *c = &h->c[i];

		if (!c->used)
			continue;
		close(c->fd);
		dps_http_preq_free(&c->q);
		dps_http_buf_free(&c->in);
		dps_http_buf_free(&c->out);
		dps_http_buf_free(&c->sending);
		busy |= c->recv_inflight;
	}
	/* a receive in flight may still write into a buffer: the ring goes with us */
	dps_http_rbufs_free(h->rbufs, busy);
	free(h->c);
	free(h);
}

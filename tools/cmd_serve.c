/* SPDX-License-Identifier: MIT */
/*
 * tools/cmd_serve.c - `dpshard serve`: the engine as a long-running service with the
 * OpenAI-compatible HTTP API (engine/api/frontend.h), for systemd (Type=notify) or a terminal.
 *
 * One io_uring in the supervisor carries everything: the HTTP server's accepts, receives and
 * sends, and the supervisor's polls of the ranks' eventfd (their token rings), pidfds and the
 * signalfd; timers are the loop's wait timeout. Life cycle:
 *   checking   before any rank starts: config.json and the safetensors headers of the model
 *              (and of a draft) are read once here; a bad one ends the service, exit 2
 *   loading    the ranks load the model; /health answers 503, requests 503
 *   ready      "listening" logged, READY=1 to systemd; requests served. A first start that
 *              never becomes ready (a rank refused the checkpoint, or died loading it) ends
 *              the service with one message: exit 2 when the rank exited with an error
 *              (what a load refuses is the checkpoint's or the options' fault), 1 when it
 *              was killed; it is not retried
 *   draining   SIGTERM/SIGINT: STOPPING=1; new requests 503; running ones finish, for at
 *              most --shutdown-timeout s; then the ranks stop, the segments go, exit 0
 *   recovering a rank died, or hung (--rank-timeout: it made no progress with work pending):
 *              its requests end with an error, /health 503 with the reason, the ranks are started
 *              again and reload the model (after 1 s, then longer after repeated failures);
 *              a restart that never becomes ready, repeated, ends the service (exit 1)
 * A second SIGTERM/SIGINT stops at once. SIGHUP reopens --log-file. WATCHDOG=1 is sent from
 * the loop when systemd asks for it.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "common/dps.h"
#include "engine/serve/engine.h"
#include "engine/api/frontend.h"
#include "engine/api/http.h"
#include "engine/model/ckpt.h"
#include "engine/model/model_config.h"
#include "engine/shard/shard.h"
#include "engine/runtime/supervisor.h"
#include "engine/runtime/xlink.h"
#include "tools/cmd.h"
#include "tools/text.h"
#include "tools/flags.h"

struct serve {
	struct io_uring ring;
	int remote;                   /* --nodes under mpirun, a node other than 0: no frontend */
	struct dps_http *http;
	struct dps_frontend *fe;
	struct dps_engine_client *client;
	const char *log_file;
	int shutdown_timeout;
	uint64_t drain_deadline, hard_deadline, watchdog_ns, watchdog_last;
	int draining, stop_now, ready_sent, closing_sent;
	int ever_ready;               /* the ranks have loaded the model once: failures restart */
	char listening[4352];         /* the line logged when the service is first ready */
	int sigfd;                    /* TERM, INT and HUP, blocked for the whole service */
	enum dps_fe_state told;       /* the state last announced (STATUS=) */
};

static struct serve *S;

static void reopen_log(const char *path)
{
	int fd;

	if (!path)
		return;
	fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
	if (fd < 0) {
		dps_warn("--log-file %s: %s", path, strerror(errno));
		return;
	}
	dup2(fd, STDERR_FILENO);
	close(fd);
}

/* Every completion of the shared ring that is not the supervisor's: the frontend's workers'
 * wake-up, or the HTTP server's. */
static void on_cqe(struct io_uring_cqe *cqe, void *arg)
{
	(void)arg;
	if (io_uring_cqe_get_data64(cqe) & DPS_FE_UDATA)
		dps_frontend_cqe(S->fe, cqe);
	else
		dps_http_cqe(S->http, cqe);
}

static void on_msg(int rank, const void *msg, size_t len, void *arg)
{
	(void)arg;
	if (S->client)
		dps_engine_on_msg(rank, msg, len, S->client);
}

static void in_child(void *arg)
{
	(void)arg;
	/* The rank keeps nothing of the frontend: no sockets, not the ring. */
	if (S->http)
		dps_http_close_fds(S->http);
	io_uring_queue_exit(&S->ring);
	if (S->sigfd >= 0)
		close(S->sigfd);
}

static int on_signal(int signo, void *arg)
{
	(void)arg;
	if (S->remote) /* mpirun sends it to every node: node 0 drains and ends the ranks */
		return 1;
	if (signo == SIGHUP) {
		reopen_log(S->log_file);
		dps_info("SIGHUP: log reopened");
		return 1;
	}
	if (S->draining) { /* a second one: now */
		dps_warn("%s again: stopping now", strsignal(signo));
		S->stop_now = 1;
		dps_sup_stop(signo);
		return 1;
	}
	S->draining = 1;
	S->drain_deadline = dps_now_ns() + (uint64_t)S->shutdown_timeout * 1000000000ull;
	dps_frontend_set_state(S->fe, DPS_FE_DRAINING);
	sd_notify(0, "STOPPING=1\nSTATUS=draining: finishing the requests in flight");
	dps_info("%s: draining (%d request(s) in flight, at most %d s)", strsignal(signo),
		 dps_frontend_active(S->fe), S->shutdown_timeout);
	return 1;
}

/* A rank failed: from this moment the service answers 503 and its requests end. (Before
 * the first start succeeded there is nothing to recover: the service ends.) */
static void on_fail(const char *why, void *arg)
{
	(void)arg;
	if (S->draining || !S->ever_ready)
		return;
	dps_frontend_set_state(S->fe, DPS_FE_RECOVERING);
	dps_frontend_fail_all(S->fe, why, 1);
}

static int on_pending(int rank, void *arg)
{
	(void)arg;
	return S->client ? dps_engine_rank_pending(rank, S->client) : 0;
}

static int on_coupled(void *arg)
{
	(void)arg;
	return S->client ? dps_engine_coupled(S->client) : 1;
}

/* Signals that arrive while no ranks run (the supervisor reads them while they do). */
static void poll_signals(void)
{
	struct signalfd_siginfo si;

	while (S->sigfd >= 0 && read(S->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
		on_signal((int)si.ssi_signo, NULL);
}

static void announce(void)
{
	const enum dps_fe_state st = dps_frontend_state(S->fe);
	char msg[160];

	if (st == S->told)
		return;
	S->told = st;
	switch (st) {
	case DPS_FE_READY:
		if (!S->ready_sent)
			dps_info("%s", S->listening);
		snprintf(msg, sizeof(msg), "%sSTATUS=serving", S->ready_sent ? "" : "READY=1\n");
		S->ready_sent = 1;
		S->ever_ready = 1;
		break;
	case DPS_FE_LOADING:
		snprintf(msg, sizeof(msg), "STATUS=loading the model on every rank");
		break;
	case DPS_FE_RECOVERING:
		snprintf(msg, sizeof(msg), "STATUS=recovering: restarting the ranks after a failure");
		break;
	default:
		return;
	}
	sd_notify(0, msg);
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
	return h;
}

/*
 * Reads dir's config.json and the headers of its safetensors files (dps_ckpt_open checks that
 * each file holds the bytes its header names). Returns 0 or a negative code with err. When
 * hash is given, folds into it what names the model: config.json's bytes, each file's name
 * and size (not the weights: reading them is the ranks' work).
 */
static int check_ckpt(const char *dir, uint64_t *hash, char *err, size_t errlen)
{
	struct dps_ckpt ck;
	int rc = dps_ckpt_open(&ck, dir, err, errlen);

	if (rc)
		return rc;
	if (hash) {
		char path[4096], buf[4096];
		FILE *f;
		size_t n;

		snprintf(path, sizeof(path), "%s/config.json", dir);
		if ((f = fopen(path, "rb"))) {
			while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
				*hash = fnv1a(*hash, buf, n);
			fclose(f);
		}
		for (int i = 0; i < ck.n_files; i++) {
			const char *base = strrchr(ck.files[i].path, '/');

			base = base ? base + 1 : ck.files[i].path;
			*hash = fnv1a(*hash, base, strlen(base) + 1);
			*hash = fnv1a(*hash, &ck.files[i].size, sizeof(ck.files[i].size));
		}
	}
	dps_ckpt_close(&ck);
	return 0;
}

static int tick(void *arg)
{
	const uint64_t now = dps_now_ns();
	int t = dps_http_tick(S->http), e;

	(void)arg;
	dps_frontend_tick(S->fe);
	announce();
	if (S->watchdog_ns && now - S->watchdog_last >= S->watchdog_ns / 2) {
		sd_notify(0, "WATCHDOG=1");
		S->watchdog_last = now;
	}
	if (S->watchdog_ns) {
		const int w = (int)(S->watchdog_ns / 2000000ull) + 1;

		t = t < 0 || w < t ? w : t;
	}
	if (S->draining && S->client && !S->closing_sent) {
		if (!dps_frontend_active(S->fe)) {
			/* Drained: the ranks stop once told (they have nothing left to run). */
			dps_engine_close_when_idle(S->client);
			S->closing_sent = 1;
			S->hard_deadline = now + 10000000000ull;
		} else if (now >= S->drain_deadline) {
			dps_warn("--shutdown-timeout: %d request(s) still running end with an error",
				 dps_frontend_active(S->fe));
			dps_frontend_fail_all(S->fe, "shutting down", 0);
			S->closing_sent = 1;
			dps_sup_stop(SIGTERM);
		} else {
			const int w = (int)((S->drain_deadline - now) / 1000000ull) + 1;

			t = t < 0 || w < t ? w : t;
		}
	}
	if (S->hard_deadline && now >= S->hard_deadline) {
		dps_warn("the ranks did not stop in 10 s: stopping them");
		S->hard_deadline = 0;
		dps_sup_stop(SIGTERM);
	}
	if (!S->client)
		return t;
	e = dps_engine_tick(S->client);
	return e >= 0 && (t < 0 || e < t) ? e : t;
}

/* Serves HTTP (health checks, 503s) for ms while no ranks run. */
static void wait_between_runs(int ms)
{
	if (S->draining)
		return;
	const uint64_t end = dps_now_ns() + (uint64_t)ms * 1000000ull;

	while (dps_now_ns() < end && !S->draining) {
		struct __kernel_timespec ts = { 0, 50000000 };
		struct io_uring_cqe *cqe;

		poll_signals();
		tick(NULL);
		if (io_uring_submit_and_wait_timeout(&S->ring, &cqe, 1, &ts, NULL) < 0 &&
		    io_uring_peek_cqe(&S->ring, &cqe))
			continue;
		while (io_uring_peek_cqe(&S->ring, &cqe) == 0) {
			struct io_uring_cqe c = *cqe;

			io_uring_cqe_seen(&S->ring, cqe);
			if (!(io_uring_cqe_get_data64(&c) & DPS_SUP_UDATA))
				on_cqe(&c, NULL);
		}
	}
}

/* At exit: no new connections; the responses already queued go out (at most 2 s). */
static void flush_responses(void)
{
	const uint64_t end = dps_now_ns() + 2000000000ull;

	dps_http_stop_accepting(S->http);
	while (dps_http_unsent(S->http) && dps_now_ns() < end) {
		struct __kernel_timespec ts = { 0, 20000000 };
		struct io_uring_cqe *cqe;

		dps_http_tick(S->http);
		io_uring_submit_and_wait_timeout(&S->ring, &cqe, 1, &ts, NULL);
		while (io_uring_peek_cqe(&S->ring, &cqe) == 0) {
			struct io_uring_cqe c = *cqe;

			io_uring_cqe_seen(&S->ring, cqe);
			if (!(io_uring_cqe_get_data64(&c) & DPS_SUP_UDATA))
				on_cqe(&c, NULL);
		}
	}
}

int dps_cmd_serve(int argc, char **argv)
{
	const char *model_dir = NULL, *name = NULL, *host = "127.0.0.1", *unix_path = NULL;
	const char *api_key = NULL, *blis_arch = "auto", *cpu_bind = "auto", *buckets = NULL;
	const char *log_file = NULL;
	int port = 8000, threads = 0, block_size = 0, max_num_seqs = 256, max_model_len = 0;
	int spec_k = 0;
	const char *spec_model = NULL;
	int dtype = 0; /* --dtype: 1 + the choice, 0 unset (auto) */
	int quant = 0; /* --quantization: 1 int8, 0 unset (the checkpoint's) */
	int max_batched = 0, verbose = 0, no_log_requests = 0, shutdown_timeout = 30;
	int max_conns = 1024, request_timeout = 0, max_tokens = 16, header_timeout = 30000;
	int idle_timeout = 75000, rank_timeout = 30, ranks = 1;
	size_t kv_mem = 0, max_body = 8u << 20;
	struct dps_par_cfg par = DPS_PAR_CFG_DEFAULT;
	struct dps_model_config cfg;
	struct dps_tool_text tt = { 0 };
	struct serve s = { 0 };
	char *pos[1], err[512], defdir[4096], nm[4096], *base, *name_buf = NULL;
	int npos, rc, have_text = 0, failures = 0, status = 0;
	uint64_t model_hash = 0xcbf29ce484222325ull; /* FNV-1a's offset basis */
	char fingerprint[64];
	struct dps_flag flags[64];
	const struct dps_flag fl[] = {
		{ "model", DPS_FLAG_STR, &model_dir, "DIR",
		  "checkpoint directory (config.json + *.safetensors); default: stories260K, "
		  "the small trained model that comes with dpshard" },
		{ "served-model-name", DPS_FLAG_STR, &name, "NAME",
		  "the model's name in the API (default: the directory's name)" },
		{ "host", DPS_FLAG_STR, &host, "HOST", "address to listen on" },
		{ "port", DPS_FLAG_INT, &port, "PORT", "TCP port (0: any free one, logged)", 0, 65535 },
		{ "unix-socket", DPS_FLAG_STR, &unix_path, "PATH",
		  "listen on a Unix socket instead of TCP" },
		{ "api-key", DPS_FLAG_STR, &api_key, "KEY",
		  "require 'Authorization: Bearer KEY' on /v1 (or set DPSHARD_API_KEY)" },
		{ "max-body-bytes", DPS_FLAG_SIZE, &max_body, "BYTES",
		  "largest request body; larger ones get 413" },
		{ "max-connections", DPS_FLAG_INT, &max_conns, "N", "connections open at once", 1,
		  1 << 20 },
		{ "header-timeout", DPS_FLAG_INT, &header_timeout, "MS",
		  "a request must arrive whole within this of its first byte (else 408)", 1,
		  1 << 30 },
		{ "keep-alive-timeout", DPS_FLAG_INT, &idle_timeout, "MS",
		  "an idle keep-alive connection is closed after this", 1, 1 << 30 },
		{ "request-timeout", DPS_FLAG_INT, &request_timeout, "MS",
		  "a request's deadline when it gives no \"timeout_ms\" (0: none)", 0, 1 << 30 },
		{ "rank-timeout", DPS_FLAG_INT, &rank_timeout, "S",
		  "a rank with work pending that makes no progress for this long is hung: its "
		  "requests fail and the ranks restart (0: never)", 0, 86400 },
		{ "default-max-tokens", DPS_FLAG_INT, &max_tokens, "N",
		  "tokens a completion may have when it gives no \"max_tokens\"", 1, 1 << 24 },
		{ "shutdown-timeout", DPS_FLAG_INT, &shutdown_timeout, "S",
		  "on SIGTERM, how long running requests may take to finish", 0, 86400 },
		{ "log-file", DPS_FLAG_STR, &log_file, "FILE",
		  "log to FILE instead of stderr (reopened on SIGHUP)" },
		{ "disable-log-requests", DPS_FLAG_BOOL, &no_log_requests, NULL,
		  "no log line per request" },
		dps_flag_dtype(&dtype),
		dps_flag_quantization(&quant),
		{ "blis-arch", DPS_FLAG_STR, &blis_arch, "A",
		  "auto (batch-invariant kernels) or BLIS: skx, zen3, haswell, generic or BIG:SMALL; WARNING: BLIS is not batch-invariant (tokens may depend on the batch)" },
		{ "threads-per-rank", DPS_FLAG_INT, &threads, "N",
		  "threads of each rank; 0: the CPUs its placement gave it", 0, 1024 },
		{ "cpu-bind", DPS_FLAG_STR, &cpu_bind, "SPEC",
		  "where ranks run (auto, off, or lists; see dpshard groups --help)" },
		{ "block-size", DPS_FLAG_INT, &block_size, "N", "positions per KV-cache block (0: 32)",
		  0, 1 << 16 },
		{ "kv-cache-memory", DPS_FLAG_SIZE, &kv_mem, "BYTES",
		  "KV cache per rank, e.g. 2G (0: half the free memory, shared by the ranks)" },
		{ "max-num-seqs", DPS_FLAG_INT, &max_num_seqs, "N", "requests a replica runs at once",
		  1, 1 << 16 },
		{ "max-model-len", DPS_FLAG_INT, &max_model_len, "N",
		  "tokens per request, prompt included (0: the model's context)", 0, 1 << 24 },
		{ "max-num-batched-tokens", DPS_FLAG_INT, &max_batched, "N",
		  "rows per step; longer prompts are prefilled in chunks (0: 512)", 0, 1 << 20 },
		{ "decode-buckets", DPS_FLAG_STR, &buckets, "B,...",
		  "decode batch sizes, ascending, ending at --max-num-seqs (default: powers of two)" },
		{ "speculative-model", DPS_FLAG_STR, &spec_model, "DIR",
		  "speculative decoding with this Eagle3 draft (needs --num-speculative-tokens)" },
		{ "num-speculative-tokens", DPS_FLAG_INT, &spec_k, "K",
		  "tokens the draft proposes per step, verified in one target pass", 0, DPS_MAX_SPEC },
		{ "verbose", DPS_FLAG_BOOL, &verbose, NULL, "print each rank's shard bytes" },
	};
	size_t nf = sizeof(fl) / sizeof(fl[0]);

	memcpy(flags, fl, sizeof(fl));
	dps_flags_parallel(&par, flags + nf);
	nf += DPS_PAR_FLAGS;
	flags[nf] = (struct dps_flag)DPS_FLAGS_END;
	rc = dps_flags_parse(flags, argc, argv, "serve", "[--model DIR] [--config FILE] [OPTIONS]",
			     pos, 0, &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (!spec_model != !spec_k) {
		fprintf(stderr, "dpshard serve: --speculative-model and --num-speculative-tokens go "
				"together\n");
		return 2;
	}
	if (!api_key)
		api_key = getenv("DPSHARD_API_KEY");
	if (log_file)
		reopen_log(log_file);
	if (!model_dir) {
		if (dps_default_model("serve", defdir, sizeof(defdir)))
			return 1;
		model_dir = defdir;
	}
	/* What every rank would refuse is refused here, once, before a rank starts: a missing
	 * directory, a bad config.json, a layout that does not fit it, safetensors files whose
	 * headers do not parse or that are shorter than their headers say. (Each rank would
	 * print the same message, and the service would start them in vain.) */
	rc = dps_model_config_load(model_dir, &cfg, err, sizeof(err));
	if (!rc)
		rc = dps_par_cfg_check(&par, err, sizeof(err));
	ranks = par.tp * par.dp + par.prefill_dp * dps_par_cfg_prefill_tp(&par);
	if (!rc)
		rc = dps_shard_check(&cfg, &par, err, sizeof(err));
	if (!rc)
		rc = check_ckpt(model_dir, &model_hash, err, sizeof(err));
	if (!rc && spec_model)
		rc = check_ckpt(spec_model, NULL, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dpshard serve: %s\n", err);
		return 2;
	}
	if (!max_model_len || max_model_len > cfg.max_position_embeddings)
		max_model_len = cfg.max_position_embeddings;
	if (dps_tool_text_open(&tt, "serve", model_dir, &cfg))
		return 2;
	have_text = 1;
	if (!name) {
		snprintf(nm, sizeof(nm), "%s", model_dir);
		while ((base = strrchr(nm, '/')) && !base[1] && base != nm)
			*base = '\0'; /* trailing slashes */
		base = strrchr(nm, '/');
		name = name_buf = strdup(base ? base + 1 : nm);
		if (!name)
			return 1;
	}
	/* Stable while the version and the checkpoint are: OpenAI's "backend configuration". */
	snprintf(fingerprint, sizeof(fingerprint), "dpshard-%s-%012llx", PACKAGE_VERSION,
		 (unsigned long long)(model_hash & 0xffffffffffffull));
	if (par.nodes > 1) {
		const struct dps_xlink_ops *xo;
		int node;

		if (dps_xlink_identity(par.nodes, &node, &xo, err, sizeof(err))) {
			fprintf(stderr, "dpshard serve: %s\n", err);
			return 2;
		}
		s.remote = node > 0;
	}
	signal(SIGPIPE, SIG_IGN);
	S = &s;
	s.sigfd = -1;
	{
		/* Blocked for the whole service: read from a signalfd between runs, and by the
		 * supervisor's during them, so no signal falls to its default action. */
		sigset_t m;

		sigemptyset(&m);
		sigaddset(&m, SIGTERM);
		sigaddset(&m, SIGINT);
		sigaddset(&m, SIGHUP);
		sigprocmask(SIG_BLOCK, &m, NULL);
		s.sigfd = signalfd(-1, &m, SFD_CLOEXEC | SFD_NONBLOCK);
	}
	{
		/* One descriptor per connection: take what the hard limit allows. */
		struct rlimit rl;

		if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
			rl.rlim_cur = rl.rlim_max;
			setrlimit(RLIMIT_NOFILE, &rl);
		}
		if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY &&
		    (rlim_t)max_conns + 64 + 4 * (rlim_t)ranks > rl.rlim_cur) {
			const long fit = (long)rl.rlim_cur - 64 - 4L * ranks;

			max_conns = fit > 16 ? (int)fit : 16;
			dps_warn("--max-connections lowered to %d: the process may open %llu files",
				 max_conns, (unsigned long long)rl.rlim_cur);
		}
	}
	s.log_file = log_file;
	s.shutdown_timeout = shutdown_timeout;
	s.told = (enum dps_fe_state)-1;
	{
		uint64_t usec = 0;

		if (sd_watchdog_enabled(0, &usec) > 0)
			s.watchdog_ns = usec * 1000ull;
	}
	{
		/* Completions in flight at most: two per connection, the accept, the polls. */
		struct io_uring_params ip = { .flags = IORING_SETUP_CQSIZE };
		unsigned cq = 1024;

		while (cq < 2u * (unsigned)max_conns + 4u * (unsigned)ranks + 256u)
			cq *= 2;
		ip.cq_entries = cq;
		rc = io_uring_queue_init_params(512 + 2 * (unsigned)ranks, &s.ring, &ip);
	}
	if (rc) {
		fprintf(stderr, "dpshard serve: cannot set up an io_uring: %s\n", strerror(-rc));
		return 1;
	}
	if (!s.remote) {
		const struct dps_frontend_opts fo = {
			.model_name = name, .api_key = api_key, .version = PACKAGE_VERSION,
			.fingerprint = fingerprint,
			.lim = { .vocab = cfg.vocab_size,
				 .max_model_len = max_model_len, .default_max_tokens = max_tokens,
				 .default_temperature = 1.0f, /* as OpenAI */
				 .default_timeout_ms = (unsigned)request_timeout },
			.dp = par.dp + par.prefill_dp, .tp = par.tp, .prefill = par.prefill_dp,
			.log_requests = !no_log_requests };
		const struct dps_http_opts ho = { .host = host, .port = port, .unix_path = unix_path,
						  .max_body = max_body, .max_conns = max_conns,
						  .header_timeout_ms = (unsigned)header_timeout,
						  .idle_timeout_ms = (unsigned)idle_timeout,
						  .on_request = dps_frontend_on_request,
						  .on_close = dps_frontend_on_close };

		struct dps_frontend_opts fo2 = fo;

		/* generation_config.json's defaults over OpenAI's, as vLLM */
		dps_tool_text_limits(&tt, &fo2.lim);
		rc = dps_frontend_new(&s.fe, &fo2);
		if (!rc) {
			struct dps_http_opts h2 = ho;

			h2.arg = s.fe;
			rc = dps_http_start(&s.http, &s.ring, &h2, err, sizeof(err));
			if (rc)
				fprintf(stderr, "dpshard serve: %s\n", err);
		}
		if (rc) {
			status = 1;
			goto out;
		}
		dps_frontend_set_http(s.fe, s.http);
		rc = dps_frontend_start_workers(s.fe, &s.ring);
		if (rc) {
			fprintf(stderr, "dpshard serve: cannot start the request workers: %s\n",
				dps_strerror(rc));
			status = 1;
			goto out;
		}
	}
	/* Logged when the ranks have loaded the model (announce): not before it is true. */
	if (s.remote)
		snprintf(s.listening, sizeof(s.listening), "node ready");
	else if (unix_path)
		snprintf(s.listening, sizeof(s.listening),
			 "listening on unix:%s, model '%s' on %d rank(s)", unix_path, name,
			 ranks);
	else
		snprintf(s.listening, sizeof(s.listening),
			 "listening on http://%s:%d, model '%s' on %d rank(s)", host,
			 dps_http_port(s.http), name, ranks);
	dps_info("loading the model on %d rank(s)", ranks);
	for (;;) {
		struct dps_engine_cb cb = dps_frontend_engine_cb;
		struct dps_engine_opts eo = { .model = model_dir, .blis_arch = blis_arch,
					      .dtype = dtype ? (enum dps_shard_dtype)(dtype - 1)
							     : DPS_SHARD_DTYPE_AUTO,
					      .quant = (enum dps_shard_quant)quant,
					      .threads = threads, .block_size = block_size,
					      .kv_cache_memory = kv_mem, .kv_fraction = 0.5,
					      .max_num_seqs = max_num_seqs,
					      .max_model_len = max_model_len,
					      .max_batched_tokens = max_batched
								    ? max_batched
								    : (512 > max_num_seqs ? 512
											  : max_num_seqs),
					      .decode_buckets = buckets, .verbose = verbose,
					      .spec_model = spec_model, .spec_k = spec_k };
		struct dps_sup_opts so = { .par = par, .cpu_bind = cpu_bind,
					   .rank_fn = dps_engine_rank_main, .rank_arg = &eo,
					   .msg_fn = on_msg, .tick_fn = tick, .ring = &s.ring,
					   .cqe_fn = on_cqe, .child_fn = in_child,
					   .signal_fn = on_signal, .fail_fn = on_fail,
					   .rank_timeout_ms = (unsigned)rank_timeout * 1000u,
					   .pending_fn = on_pending, .coupled_fn = on_coupled,
					   .verbose = verbose, .nodes_ok = 1 };
		struct dps_sup_result res;
		int was_ready;

		cb.arg = s.fe;
		so.window_bytes = dps_engine_window_bytes(&eo, &par);
		if (s.remote) {
			/* Another node's supervisor: its ranks only. Node 0 runs the frontend, the
			 * load balancer and the ranks' life; a failure anywhere ends the job. */
			so.cqe_fn = NULL;
			so.ring = NULL;
			rc = dps_sup_run(&so, &res, err, sizeof(err));
			if (rc && rc != -DPS_EABORT)
				dps_error("%s", err);
			status = rc ? 1 : 0;
			break;
		}
		rc = dps_engine_client_new(&s.client, par.dp, par.tp, &cb);
		if (!rc && par.prefill_dp) { /* disaggregated: both parts, the prefill KV shared */
			so.roles = 1;
			so.kv_share_bytes = dps_engine_kv_share_bytes(&eo, &par);
			rc = dps_engine_client_set_prefill(s.client, par.prefill_dp,
							   dps_par_cfg_prefill_tp(&par));
		}
		if (rc) {
			status = 1;
			break;
		}
		dps_frontend_set_client(s.fe, s.client);
		if (dps_frontend_state(s.fe) != DPS_FE_RECOVERING)
			dps_frontend_set_state(s.fe, DPS_FE_LOADING);
		s.closing_sent = 0;
		poll_signals(); /* (one that came while no ranks ran) */
		if (s.draining) {
			dps_engine_client_free(s.client);
			s.client = NULL;
			dps_frontend_set_client(s.fe, NULL);
			break;
		}
		rc = dps_sup_run(&so, &res, err, sizeof(err));
		/* A test's injected fault (DPSHARD_FAULT, docs/DESIGN.md section 5) is for the first
		 * start only: the restarted ranks must show the recovery. */
		unsetenv("DPSHARD_FAULT");
		was_ready = dps_engine_ready(s.client);
		if (s.draining || s.stop_now) {
			dps_frontend_fail_all(s.fe, "the service stopped", 0);
			dps_frontend_set_client(s.fe, NULL);
			dps_engine_client_free(s.client);
			s.client = NULL;
			status = rc && rc != -DPS_EABORT && !s.closing_sent ? 1 : 0;
			break;
		}
		if (!rc) { /* the ranks ended on their own: not expected of a service */
			snprintf(err, sizeof(err), "the ranks stopped");
			rc = -DPS_ERANK;
		}
		if (par.nodes > 1) {
			/* Across nodes the ranks are not restarted: every node's supervisor would
			 * have to start again together. The job ends; restart it. */
			dps_frontend_fail_all(s.fe, "a rank or a node of the job failed", 0);
			dps_frontend_set_client(s.fe, NULL);
			dps_engine_client_free(s.client);
			s.client = NULL;
			dps_error("%s; across nodes the ranks are not restarted: restart the job", err);
			status = 1;
			break;
		}
		if (s.ever_ready || was_ready)
			dps_frontend_set_state(s.fe, DPS_FE_RECOVERING);
		dps_frontend_fail_all(s.fe, "the ranks failed", 0);
		dps_frontend_set_client(s.fe, NULL);
		dps_engine_client_free(s.client);
		s.client = NULL;
		if (!s.ever_ready && !was_ready) {
			/* The first start failed: the ranks said why (above); no restart. */
			if (rc == -DPS_ERANK)
				dps_error("the model could not be loaded (%s): giving up", err);
			else
				dps_error("%s", err);
			status = rc == -DPS_ERANK && !res.failed_signal ? 2 : 1;
			break;
		}
		dps_error("%s", err);
		announce();
		if (rc != -DPS_ERANK) { /* could not start at all (memory, segments): not a rank */
			status = 1;
			break;
		}
		failures = was_ready ? 1 : failures + 1;
		if (failures > 5) {
			dps_error("the ranks failed %d times in a row before the model was loaded: "
				  "giving up", failures);
			status = 1;
			break;
		}
		dps_info("restarting the ranks in %d s", failures);
		wait_between_runs(1000 * failures);
		if (s.draining)
			break;
	}
out:
	sd_notify(0, "STOPPING=1\nSTATUS=stopped");
	if (s.http)
		flush_responses();
	/* The ring first: no send in flight may outlive the buffers the server frees. */
	io_uring_queue_exit(&s.ring);
	dps_http_free(s.http);
	dps_frontend_free(s.fe);
	if (s.sigfd >= 0)
		close(s.sigfd);
	free(name_buf);
	if (have_text)
		dps_tool_text_close(&tt);
	S = NULL;
	if (!status)
		dps_info("stopped");
	return status;
}

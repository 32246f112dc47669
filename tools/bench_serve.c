/* SPDX-License-Identifier: MIT */
/*
 * tools/bench_serve.c - `dpshard bench serve`: a load generator against a running
 * `dpshard serve` (or any OpenAI-compatible completions server), as `vllm bench serve`:
 * requests arrive as a Poisson process at --request-rate (or all at once), at most
 * --max-concurrency in flight, each streamed; prompts and output lengths come from a random
 * distribution (token ids) or a JSONL file. It reports completed and failed requests,
 * request and token throughput, and TTFT, TPOT, ITL and end-to-end latency (mean, median,
 * p90, p99) with vLLM's definitions and field names:
 *   TTFT  from sending the request to the first streamed token;
 *   TPOT  (end-to-end - TTFT) / (output tokens - 1), per request with more than one token;
 *   ITL   the time between two streamed chunks, over every chunk of every request;
 *   E2EL  from sending the request to its last byte.
 * One thread per request in flight, blocking sockets: the generator's own cost is small next
 * to a model step, and it never shares the server's loop.
 */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/dps.h"
#include "tools/cmd.h"
#include "tools/flags.h"
#include "tools/machine.h"
#include "tools/plot.h"

struct breq {
	char *body;               /* the request's JSON */
	int input_len, max_tokens;
	/* results */
	int ok, output_len, usage; /* usage: the stream's usage chunk was seen (0 tokens too) */
	double ttft, e2el;        /* seconds */
	double *itl;              /* (n_itl) */
	int n_itl, cap_itl;
	char err[160];
};

struct bench {
	const char *host, *api_key;
	int port;
	struct breq *r;
	int n;
	sem_t slots;              /* --max-concurrency */
	int done;
	pthread_mutex_t mu;
};

static double now_s(void)
{
	return (double)dps_now_ns() / 1e9;
}

static int connect_to(const char *host, int port)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai, *a;
	char p[16];
	int fd = -1;

	snprintf(p, sizeof(p), "%d", port);
	if (getaddrinfo(host, p, &hints, &ai))
		return -1;
	for (a = ai; a; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
		if (fd >= 0 && !connect(fd, a->ai_addr, a->ai_addrlen))
			break;
		if (fd >= 0)
			close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	return fd;
}

static void add_itl(struct breq *q, double v)
{
	if (q->n_itl == q->cap_itl) {
		double *p = realloc(q->itl, sizeof(double) * (size_t)(q->cap_itl ? 2 * q->cap_itl : 64));

		if (!p)
			return;
		q->itl = p;
		q->cap_itl = q->cap_itl ? 2 * q->cap_itl : 64;
	}
	q->itl[q->n_itl++] = v;
}

/* One server-sent event (the text after "data: "). */
static void on_event(struct breq *q, const char *ev, size_t n, double t0, double *last)
{
	json_t *j, *ch, *u;
	const double t = now_s();

	if (n == 6 && !memcmp(ev, "[DONE]", 6))
		return;
	j = json_loadb(ev, n, 0, NULL);
	if (!j)
		return;
	ch = json_array_get(json_object_get(j, "choices"), 0);
	/* A chunk that carries text or token ids is a token event (vLLM: text). */
	if (ch && (json_string_length(json_object_get(ch, "text")) ||
		   json_array_size(json_object_get(ch, "token_ids")))) {
		if (q->ttft == 0)
			q->ttft = t - t0;
		else
			add_itl(q, t - *last);
		*last = t;
	}
	u = json_object_get(j, "usage");
	if (u && json_is_integer(json_object_get(u, "completion_tokens"))) {
		q->output_len = (int)json_integer_value(json_object_get(u, "completion_tokens"));
		q->usage = 1;
	}
	if (ch && json_is_string(json_object_get(ch, "finish_reason")) &&
	    strcmp(json_string_value(json_object_get(ch, "finish_reason")), "length") &&
	    strcmp(json_string_value(json_object_get(ch, "finish_reason")), "stop"))
		snprintf(q->err, sizeof(q->err), "finish_reason %s",
			 json_string_value(json_object_get(ch, "finish_reason")));
	json_decref(j);
}

/* Sends the request and reads its stream (chunked transfer, SSE events). */
static void run_one(struct bench *b, struct breq *q)
{
	char head[512], *buf = NULL;
	size_t len = 0, cap = 0, pos = 0, ev_start = 0, body_start = 0;
	double t0, last = 0;
	int fd, n, status = 0, chunked = 0;
	char *stream = NULL;      /* the de-chunked body */
	size_t slen = 0, scap = 0;

	fd = connect_to(b->host, b->port);
	if (fd < 0) {
		snprintf(q->err, sizeof(q->err), "cannot connect: %s", strerror(errno));
		return;
	}
	n = snprintf(head, sizeof(head), "POST /v1/completions HTTP/1.1\r\nHost: %s\r\n"
			 "Content-Type: application/json\r\nContent-Length: %zu\r\n%s%s%s"
			 "Connection: close\r\n\r\n", b->host, strlen(q->body),
		     b->api_key ? "Authorization: Bearer " : "", b->api_key ? b->api_key : "",
		     b->api_key ? "\r\n" : "");
	t0 = now_s();
	if (write(fd, head, (size_t)n) != n ||
	    write(fd, q->body, strlen(q->body)) != (ssize_t)strlen(q->body)) {
		snprintf(q->err, sizeof(q->err), "cannot send: %s", strerror(errno));
		close(fd);
		return;
	}
	for (;;) {
		ssize_t got;

		if (cap - len < 65536) {
			char *p = realloc(buf, cap ? 2 * cap : 131072);

			if (!p)
				break;
			buf = p;
			cap = cap ? 2 * cap : 131072;
		}
		got = read(fd, buf + len, cap - len - 1);
		if (got <= 0)
			break;
		len += (size_t)got;
		buf[len] = '\0';
		if (!body_start) {
			char *e = strstr(buf, "\r\n\r\n");

			if (!e)
				continue;
			body_start = (size_t)(e + 4 - buf);
			status = atoi(buf + 9);
			chunked = strcasestr(buf, "Transfer-Encoding: chunked") &&
				  strcasestr(buf, "Transfer-Encoding: chunked") < e;
			pos = body_start;
		}
		/* De-chunk what has arrived into stream, then cut events. */
		for (;;) {
			size_t csz, hl;
			char *nl;

			if (!chunked) {
				if (pos < len) {
					if (slen + (len - pos) + 1 > scap) {
						scap = (slen + (len - pos) + 1) * 2;
						stream = realloc(stream, scap);
						if (!stream)
							goto out;
					}
					memcpy(stream + slen, buf + pos, len - pos);
					slen += len - pos;
					pos = len;
				}
				break;
			}
			nl = memmem(buf + pos, len - pos, "\r\n", 2);
			if (!nl)
				break;
			csz = strtoul(buf + pos, NULL, 16);
			hl = (size_t)(nl - (buf + pos)) + 2;
			if (pos + hl + csz + 2 > len)
				break;
			if (slen + csz + 1 > scap) {
				scap = (slen + csz + 1) * 2;
				stream = realloc(stream, scap);
				if (!stream)
					goto out;
			}
			memcpy(stream + slen, buf + pos + hl, csz);
			slen += csz;
			pos += hl + csz + 2;
			if (!csz)
				break;
		}
		if (stream) {
			char *e;

			stream[slen] = '\0';
			while ((e = memmem(stream + ev_start, slen - ev_start, "\n\n", 2))) {
				const char *ev = stream + ev_start;

				if (!strncmp(ev, "data: ", 6))
					on_event(q, ev + 6, (size_t)(e - ev) - 6, t0, &last);
				ev_start = (size_t)(e + 2 - stream);
			}
		}
	}
	q->e2el = now_s() - t0;
	if (status != 200) {
		if (!q->err[0])
			snprintf(q->err, sizeof(q->err), "HTTP status %d", status);
	} else if (!q->err[0] && q->output_len > 0) {
		q->ok = 1;
	} else if (!q->err[0] && q->usage) { /* (a reply that ended on its first token) */
		snprintf(q->err, sizeof(q->err), "no token came, so no time to first token (counted "
			 "failed, as vLLM's benchmark counts it)");
	} else if (!q->err[0]) {
		snprintf(q->err, sizeof(q->err), "no usage in the stream");
	}
out:
	free(stream);
	free(buf);
	close(fd);
}

struct job {
	struct bench *b;
	int i;
};

static void *worker(void *arg)
{
	struct job *j = arg;

	run_one(j->b, &j->b->r[j->i]);
	pthread_mutex_lock(&j->b->mu);
	j->b->done++;
	pthread_mutex_unlock(&j->b->mu);
	sem_post(&j->b->slots);
	free(j);
	return NULL;
}

static int cmp_d(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Mean, median, p90, p99 (ms) of v (sorted here); zeros when empty. */
static void stats(double *v, int n, double out[4])
{
	double s = 0;

	memset(out, 0, 4 * sizeof(double));
	if (n <= 0)
		return;
	qsort(v, (size_t)n, sizeof(double), cmp_d);
	for (int i = 0; i < n; i++)
		s += v[i];
	out[0] = s / n * 1e3;
	out[1] = (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2) * 1e3;
	/* linear interpolation between closest ranks, as numpy.percentile */
	for (int k = 0; k < 2; k++) {
		const double p = k ? 0.99 : 0.90, x = p * (n - 1);
		const int lo = (int)x;
		const double f = x - lo;

		out[2 + k] = (lo + 1 < n ? v[lo] + f * (v[lo + 1] - v[lo]) : v[lo]) * 1e3;
	}
}

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s)
{
	return (double)(rng_next(s) >> 11) / 9007199254740992.0;
}

/* Requests from a JSONL file: {"prompt": ..., "max_tokens": N} per line. */
static int load_dataset(const char *path, int want, const char *model, struct breq **out,
			int *n_out)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	int n = 0, lineno = 0;
	struct breq *r = calloc((size_t)want, sizeof(*r));

	if (!f || !r) {
		fprintf(stderr, "dpshard bench serve: --dataset %s: %s\n", path, strerror(errno));
		free(r);
		if (f)
			fclose(f);
		return -1;
	}
	while (n < want && (len = getline(&line, &cap, f)) > 0) {
		json_error_t je;
		json_t *j;

		lineno++;
		if (len <= 1)
			continue;
		j = json_loadb(line, (size_t)len, 0, &je);
		if (!j || !json_object_get(j, "prompt")) {
			fprintf(stderr, "dpshard bench serve: %s line %d: want a JSON object with "
					"\"prompt\"%s%s\n", path, lineno, j ? "" : ": ", j ? "" : je.text);
			json_decref(j);
			free(line);
			fclose(f);
			for (int i = 0; i < n; i++)
				free(r[i].body);
			free(r);
			return -1;
		}
		if (!json_object_get(j, "max_tokens"))
			json_object_set_new(j, "max_tokens", json_integer(16));
		r[n].max_tokens = (int)json_integer_value(json_object_get(j, "max_tokens"));
		r[n].input_len = json_is_array(json_object_get(j, "prompt"))
					 ? (int)json_array_size(json_object_get(j, "prompt"))
					 : (int)json_string_length(json_object_get(j, "prompt")) / 4 + 1;
		json_object_set_new(j, "stream", json_true());
		json_object_set_new(j, "stream_options", json_pack("{s:b}", "include_usage", 1));
		if (model)
			json_object_set_new(j, "model", json_string(model));
		r[n].body = json_dumps(j, JSON_COMPACT);
		json_decref(j);
		n++;
	}
	free(line);
	fclose(f);
	if (!n) {
		fprintf(stderr, "dpshard bench serve: --dataset %s holds no request\n", path);
		free(r);
		return -1;
	}
	*out = r;
	*n_out = n;
	return 0;
}

struct sopts {
	const char *host, *api_key, *dataset, *model;
	int port, num, conc, in_len, out_len, seed, vocab, json, csv;
	double ratio;
};

/* One run at one request rate (0: all at once); the result (vLLM's fields) into *out. */
static int run_rate(const struct sopts *o, double rate, json_t **out)
{
	const char *host = o->host, *api_key = o->api_key, *dataset = o->dataset;
	const char *model = o->model;
	const int port = o->port, num = o->num, conc = o->conc, in_len = o->in_len;
	const int out_len = o->out_len, vocab = o->vocab, json_out = o->json || o->csv;
	const double ratio = o->ratio;
	struct bench b = { 0 };
	uint64_t rs;
	double t_start, dur;
	int seed = o->seed;

	*out = NULL;
	b.host = host;
	b.port = port;
	b.api_key = api_key ? api_key : getenv("DPSHARD_API_KEY");
	rs = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
	if (dataset) {
		if (load_dataset(dataset, num, model, &b.r, &b.n))
			return 2;
	} else {
		b.r = calloc((size_t)num, sizeof(*b.r));
		if (!b.r)
			return 1;
		b.n = num;
		for (int i = 0; i < num; i++) {
			const int il = (int)lround(in_len * (1 - ratio + 2 * ratio * rng_unit(&rs)));
			const int ol = (int)lround(out_len * (1 - ratio + 2 * ratio * rng_unit(&rs)));
			json_t *j = json_object(), *ids = json_array();

			for (int k = 0; k < (il > 0 ? il : 1); k++)
				json_array_append_new(ids, json_integer(k ? 3 + (long)(rng_next(&rs) %
									(uint64_t)(vocab - 3)) : 1));
			json_object_set_new(j, "prompt", ids);
			json_object_set_new(j, "max_tokens", json_integer(ol > 0 ? ol : 1));
			json_object_set_new(j, "temperature", json_real(0));
			json_object_set_new(j, "ignore_eos", json_true());
			json_object_set_new(j, "stream", json_true());
			json_object_set_new(j, "stream_options", json_pack("{s:b}", "include_usage", 1));
			if (model)
				json_object_set_new(j, "model", json_string(model));
			b.r[i].body = json_dumps(j, JSON_COMPACT);
			b.r[i].input_len = il > 0 ? il : 1;
			b.r[i].max_tokens = ol > 0 ? ol : 1;
			json_decref(j);
		}
	}
	sem_init(&b.slots, 0, conc > 0 ? (unsigned)conc : (unsigned)b.n);
	pthread_mutex_init(&b.mu, NULL);
	fprintf(stderr, "dpshard bench serve: %d requests to %s:%d, %s, at most %d in flight\n", b.n,
		host, port, rate > 0 ? "Poisson arrivals" : "all at once", conc > 0 ? conc : b.n);
	t_start = now_s();
	{
		double next = t_start;
		pthread_t *th = calloc((size_t)b.n, sizeof(*th));

		if (!th)
			return 1;
		for (int i = 0; i < b.n; i++) {
			struct job *j = malloc(sizeof(*j));

			if (rate > 0) {
				const double wait = next - now_s();

				if (wait > 0) {
					struct timespec ts = { (time_t)wait,
							       (long)((wait - (double)(time_t)wait) * 1e9) };

					nanosleep(&ts, NULL);
				}
				next += -log(1.0 - rng_unit(&rs)) / rate;
			}
			sem_wait(&b.slots);
			j->b = &b;
			j->i = i;
			if (pthread_create(&th[i], NULL, worker, j)) {
				snprintf(b.r[i].err, sizeof(b.r[i].err), "cannot start a thread");
				sem_post(&b.slots);
				free(j);
				th[i] = 0;
			}
			if (i % 10 == 9 || i + 1 == b.n)
				fprintf(stderr, "\rdpshard bench serve: %d of %d sent, %d done, %.1f s ...  ",
					i + 1, b.n, b.done, now_s() - t_start);
		}
		for (int i = 0; i < b.n; i++)
			if (th[i])
				pthread_join(th[i], NULL);
		free(th);
		fprintf(stderr, "\r%*s\r", 70, "");
	}
	dur = now_s() - t_start;
	{
		int ok = 0, fails = 0, n_itl = 0, n_tpot = 0;
		long in_tok = 0, out_tok = 0;
		double *ttft = calloc((size_t)b.n, sizeof(double)), *e2e = calloc((size_t)b.n,
										 sizeof(double));
		double *tpot = calloc((size_t)b.n, sizeof(double)), *itl, st[4][4];
		const char *names[4] = { "ttft", "tpot", "itl", "e2el" };
		json_t *res = json_object(), *a;
		char date[32];
		time_t tnow = time(NULL);

		for (int i = 0; i < b.n; i++)
			n_itl += b.r[i].n_itl;
		itl = calloc((size_t)n_itl + 1, sizeof(double));
		if (!ttft || !e2e || !tpot || !itl || !res)
			return 1;
		n_itl = 0;
		for (int i = 0; i < b.n; i++) {
			const struct breq *q = &b.r[i];

			if (!q->ok) {
				fails++;
				if (fails <= 3)
					fprintf(stderr, "dpshard bench serve: request %d failed: %s\n", i,
						q->err);
				continue;
			}
			ttft[ok] = q->ttft;
			e2e[ok] = q->e2el;
			if (q->output_len > 1)
				tpot[n_tpot++] = (q->e2el - q->ttft) / (q->output_len - 1);
			ok++;
			in_tok += q->input_len;
			out_tok += q->output_len;
			for (int k = 0; k < q->n_itl; k++)
				itl[n_itl++] = q->itl[k];
		}
		strftime(date, sizeof(date), "%Y%m%d-%H%M%S", localtime(&tnow));
		json_object_set_new(res, "date", json_string(date));
		json_object_set_new(res, "backend", json_string("dpshard"));
		json_object_set_new(res, "model_id", json_string(model ? model : ""));
		{
			struct dps_machine mach;

			dps_machine_get(&mach);
			json_object_set_new(res, "version", json_string(PACKAGE_VERSION));
			json_object_set_new(res, "git_commit", json_string(dps_git_commit));
			json_object_set_new(res, "cpu", json_string(mach.cpu));
			json_object_set_new(res, "cpus", json_integer(mach.cpus));
			json_object_set_new(res, "numa_nodes", json_integer(mach.nodes));
			json_object_set_new(res, "blis", json_string(mach.blis));
		}
		json_object_set_new(res, "num_prompts", json_integer(b.n));
		json_object_set_new(res, "request_rate", rate > 0 ? json_real(rate)
								  : json_string("inf"));
		json_object_set_new(res, "max_concurrency", conc > 0 ? json_integer(conc) : json_null());
		json_object_set_new(res, "duration", json_real(dur));
		json_object_set_new(res, "completed", json_integer(ok));
		json_object_set_new(res, "failed", json_integer(fails));
		json_object_set_new(res, "total_input_tokens", json_integer(in_tok));
		json_object_set_new(res, "total_output_tokens", json_integer(out_tok));
		json_object_set_new(res, "request_throughput", json_real(ok / dur));
		json_object_set_new(res, "output_throughput", json_real((double)out_tok / dur));
		json_object_set_new(res, "total_token_throughput",
				    json_real((double)(in_tok + out_tok) / dur));
		stats(ttft, ok, st[0]);
		stats(tpot, n_tpot, st[1]);
		stats(itl, n_itl, st[2]);
		stats(e2e, ok, st[3]);
		for (int m = 0; m < 4; m++) {
			static const char *const what[4] = { "mean", "median", "p90", "p99" };

			for (int k = 0; k < 4; k++) {
				char key[32];

				snprintf(key, sizeof(key), "%s_%s_ms", what[k], names[m]);
				json_object_set_new(res, key, json_real(st[m][k]));
			}
		}
		a = json_array();
		for (int i = 0; i < b.n; i++)
			json_array_append_new(a, json_integer(b.r[i].input_len));
		json_object_set_new(res, "input_lens", a);
		a = json_array();
		for (int i = 0; i < b.n; i++)
			json_array_append_new(a, json_integer(b.r[i].ok ? b.r[i].output_len : 0));
		json_object_set_new(res, "output_lens", a);
		a = json_array();
		for (int i = 0; i < b.n; i++)
			json_array_append_new(a, json_real(b.r[i].ok ? b.r[i].ttft : 0));
		json_object_set_new(res, "ttfts", a);
		a = json_array();
		for (int i = 0; i < b.n; i++)
			json_array_append_new(a, json_string(b.r[i].ok ? "" : b.r[i].err));
		json_object_set_new(res, "errors", a);
		if (!json_out) {
			printf("============ Serving Benchmark Result ============\n");
			printf("%-40s %10d\n%-40s %10d\n", "Successful requests:", ok,
			       "Failed requests:", fails);
			if (conc > 0)
				printf("%-40s %10d\n", "Maximum request concurrency:", conc);
			printf("%-40s %10.2f\n%-40s %10ld\n%-40s %10ld\n", "Benchmark duration (s):", dur,
			       "Total input tokens:", in_tok, "Total generated tokens:", out_tok);
			printf("%-40s %10.2f\n%-40s %10.2f\n%-40s %10.2f\n", "Request throughput (req/s):",
			       ok / dur, "Output token throughput (tok/s):", (double)out_tok / dur,
			       "Total Token throughput (tok/s):", (double)(in_tok + out_tok) / dur);
			for (int m = 0; m < 4; m++) {
				printf("%s\n", m == 0 ? "---------------Time to First Token----------------"
					       : m == 1 ? "-----Time per Output Token (excl. 1st token)------"
					       : m == 2 ? "---------------Inter-token Latency----------------"
							: "----------------End-to-end Latency----------------");
				printf("%-40s %10.2f\n%-40s %10.2f\n%-40s %10.2f\n%-40s %10.2f\n",
				       "Mean (ms):", st[m][0], "Median (ms):", st[m][1], "P90 (ms):",
				       st[m][2], "P99 (ms):", st[m][3]);
			}
			printf("==================================================\n");
		}
		*out = res;
		free(ttft);
		free(e2e);
		free(tpot);
		free(itl);
		for (int i = 0; i < b.n; i++) {
			free(b.r[i].body);
			free(b.r[i].itl);
		}
		free(b.r);
		sem_destroy(&b.slots);
		pthread_mutex_destroy(&b.mu);
		return fails ? 1 : 0;
	}
}

int dps_bench_serve(int argc, char **argv)
{
	struct sopts o = { .host = "127.0.0.1", .port = 8000, .num = 100, .in_len = 32,
			   .out_len = 32, .vocab = 256 };
	const char *rates_s = "inf", *result_file = NULL, *plot = NULL;
	double rates[32];
	int n_rates = 0, npos, rc, status = 0;
	char *pos[1];
	json_t *all = json_array();
	struct dps_series sr[6];
	const struct dps_flag flags[] = {
		{ "host", DPS_FLAG_STR, &o.host, "HOST", "the server" },
		{ "port", DPS_FLAG_INT, &o.port, "PORT", "its port", 1, 65535 },
		{ "api-key", DPS_FLAG_STR, &o.api_key, "KEY", "sent as 'Authorization: Bearer KEY'" },
		{ "model", DPS_FLAG_STR, &o.model, "NAME",
		  "the model to ask for (default: the server's)" },
		{ "num-prompts", DPS_FLAG_INT, &o.num, "N", "requests to send (per rate)", 1, 1 << 20 },
		{ "request-rate", DPS_FLAG_STR, &rates_s, "R,...",
		  "requests per second, Poisson arrivals; inf: all at once; a list runs each rate" },
		{ "max-concurrency", DPS_FLAG_INT, &o.conc, "N",
		  "requests in flight at most (0: no limit)", 0, 1 << 16 },
		{ "dataset", DPS_FLAG_STR, &o.dataset, "FILE",
		  "requests from JSON lines ({\"prompt\": ..., \"max_tokens\": N}) instead of random" },
		{ "random-input-len", DPS_FLAG_INT, &o.in_len, "N", "random prompts: token ids each", 1,
		  1 << 20 },
		{ "random-output-len", DPS_FLAG_INT, &o.out_len, "N", "random prompts: max_tokens", 1,
		  1 << 20 },
		{ "random-range-ratio", DPS_FLAG_DOUBLE, &o.ratio, "F",
		  "random lengths drawn from [len * (1 - F), len * (1 + F)]" },
		{ "vocab-size", DPS_FLAG_INT, &o.vocab, "V", "random prompts: ids below this", 2,
		  1 << 24 },
		{ "seed", DPS_FLAG_INT, &o.seed, "S", "of the lengths, prompts and arrivals" },
		{ "result-file", DPS_FLAG_STR, &result_file, "FILE",
		  "save the result as JSON (vllm bench serve's field names; a list for several rates)" },
		{ "json", DPS_FLAG_BOOL, &o.json, NULL, "print the JSON result instead of the table" },
		{ "csv", DPS_FLAG_BOOL, &o.csv, NULL,
		  "print a CSV line per request rate instead of the table (a header line first)" },
		{ "plot", DPS_FLAG_STR, &plot, "FILE.svg",
		  "draw the latency percentiles against the request rate (needs gnuplot)" },
		DPS_FLAGS_END,
	};

	rc = dps_flags_parse(flags, argc, argv, "bench serve", "[--host H] [--port P] [OPTIONS]",
			     pos, 0, &npos);
	if (rc) {
		json_decref(all);
		return rc > 0 ? 0 : 2;
	}
	for (const char *c = rates_s; *c && n_rates < 32;) {
		char *end;
		double r = !strncmp(c, "inf", 3) ? (end = (char *)c + 3, 0.0) : strtod(c, &end);

		if (end == c || !(r >= 0) || !isfinite(r) || (*end && *end != ',')) {
			fprintf(stderr, "dpshard bench serve: --request-rate takes positive numbers or "
					"inf, separated by commas (got '%s')\n", rates_s);
			json_decref(all);
			return 2;
		}
		rates[n_rates++] = r;
		c = *end ? end + 1 : end;
	}
	if (!n_rates || !(o.ratio >= 0 && o.ratio < 1)) {
		fprintf(stderr, "dpshard bench serve: need a --request-rate and 0 <= "
				"--random-range-ratio < 1\n");
		json_decref(all);
		return 2;
	}
	memset(sr, 0, sizeof(sr));
	for (int k = 0; k < 6; k++)
		snprintf(sr[k].name, sizeof(sr[k].name), "%s %s", k < 3 ? "TTFT" : "end-to-end",
			 k % 3 == 0 ? "median" : k % 3 == 1 ? "p90" : "p99");
	for (int i = 0; i < n_rates; i++) {
		json_t *res = NULL;

		if (n_rates > 1 && rates[i] > 0)
			fprintf(stderr, "dpshard bench serve: rate %d of %d: %g requests/s\n", i + 1,
				n_rates, rates[i]);
		else if (n_rates > 1)
			fprintf(stderr, "dpshard bench serve: rate %d of %d: all at once\n", i + 1,
				n_rates);
		rc = run_rate(&o, rates[i], &res);
		status |= rc;
		if (!res)
			break;
		if (rates[i] > 0 && sr[0].n < 32) {
			static const char *const keys[6] = { "median_ttft_ms", "p90_ttft_ms",
							     "p99_ttft_ms", "median_e2el_ms",
							     "p90_e2el_ms", "p99_e2el_ms" };

			for (int k = 0; k < 6; k++) {
				sr[k].x[sr[k].n] = rates[i];
				sr[k].y[sr[k].n++] = json_number_value(json_object_get(res, keys[k]));
			}
		}
		json_array_append_new(all, res);
	}
	{
		json_t *out = n_rates == 1 ? json_array_get(all, 0) : all;

		if (out && result_file && json_dump_file(out, result_file, JSON_INDENT(1))) {
			fprintf(stderr, "dpshard bench serve: cannot write %s\n", result_file);
			status = 1;
		}
		if (out && o.json) {
			json_dumpf(out, stdout, JSON_INDENT(1));
			printf("\n");
		}
		if (o.csv) {
			static const char *const cols[] = {
				"request_rate", "max_concurrency", "num_prompts", "completed", "failed",
				"duration", "total_input_tokens", "total_output_tokens",
				"request_throughput", "output_throughput", "total_token_throughput",
				"mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
				"mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms",
				"mean_itl_ms", "median_itl_ms", "p90_itl_ms", "p99_itl_ms",
				"mean_e2el_ms", "median_e2el_ms", "p90_e2el_ms", "p99_e2el_ms",
				"version", "git_commit", "cpu", "cpus", "numa_nodes", "blis" };
			const size_t nc = sizeof(cols) / sizeof(cols[0]);
			size_t i;
			json_t *r;

			for (size_t c = 0; c < nc; c++)
				printf("%s%s", c ? "," : "", cols[c]);
			printf("\n");
			json_array_foreach(all, i, r) {
				for (size_t c = 0; c < nc; c++) {
					json_t *v = json_object_get(r, cols[c]);

					printf("%s", c ? "," : "");
					if (json_is_string(v))
						printf("\"%s\"", json_string_value(v));
					else if (json_is_integer(v))
						printf("%lld", (long long)json_integer_value(v));
					else if (json_is_number(v))
						printf("%.6f", json_number_value(v));
				}
				printf("\n");
			}
		}
	}
	if (plot) {
		if (sr[0].n < 1) {
			fprintf(stderr, "dpshard bench serve: --plot needs finite request rates\n");
			status = 1;
		} else if (dps_plot_svg(plot, "dpshard bench serve: latency against request rate",
					"requests per second", "ms", sr, 6, 0)) {
			status = 1;
		}
	}
	json_decref(all);
	return status ? 1 : 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * engine/api/respond.c - the bodies the frontend sends, as the OpenAI API and vLLM shape them:
 * errors, text_completion and chat.completion responses, and their server-sent event streams
 * (a chat stream opens with the assistant's role, then content deltas, then the finish
 * reason, the usage when asked, and "data: [DONE]"). Every response and chunk carries the
 * server's system_fingerprint; under stream_options.include_usage every chunk but the last has
 * "usage": null, as OpenAI's; the finish chunk of a stream the engine failed carries an
 * "error" object, since its status (200) went out long before. A request of several choices
 * (prompts x n) streams each choice's chunks with its "index" as they come, and ends the stream
 * (usage, [DONE]) after the last choice finished; its whole body waits for every choice. With
 * "logprobs", each chunk and choice carries its tokens' log-probabilities: completions'
 * {tokens, token_logprobs, top_logprobs, text_offset}, chat's {content: [{token, logprob,
 * bytes, top_logprobs}]}. Called by choice.c on the loop thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "engine/model/tok.h"
#include "engine/api/frontend_int.h"

void dps_fe_send_error(struct dps_frontend *f, uint64_t conn, int status, const char *type,
		       const char *msg)
{
	char *body = NULL;
	size_t n = 0;
	FILE *o = open_memstream(&body, &n);
	char fixed[256];

	f->http_errors++;
	if (o) {
		fprintf(o, "{\"error\": {\"message\": ");
		dps_json_string(o, msg, strlen(msg));
		fprintf(o, ", \"type\": \"%s\", \"code\": %d}}\n", type, status);
	}
	if (!o || fclose(o) || !body) {
		/* No memory for the message: the same status with a fixed one, from the stack, so
		 * that the client still gets an answer now rather than at the idle timeout. */
		free(body);
		body = NULL;
		n = (size_t)snprintf(fixed, sizeof(fixed), "{\"error\": {\"message\": \"%s\", "
				     "\"type\": \"%s\", \"code\": %d}}\n", DPS_FE_OOM_MSG, type,
				     status);
	}
	dps_http_respond(f->http, conn, status, "application/json", body ? body : fixed, n,
			 status == 401 ? "WWW-Authenticate: Bearer\r\n" : NULL, 0);
	free(body);
}

/* Ends r's stream without memory to write its end: a fixed error event, then [DONE]. */
static void stream_fail_fixed(struct dps_frontend *f, const struct fe_req *r)
{
	static const char ev[] = "data: {\"error\": {\"message\": \"" DPS_FE_OOM_MSG "\", "
				 "\"type\": \"internal_error\", \"code\": 500}}\n\n"
				 "data: [DONE]\n\n";

	f->http_errors++;
	dps_http_stream_write(f->http, r->conn, ev, sizeof(ev) - 1);
	dps_http_stream_end(f->http, r->conn);
}

/*
 * Choice r had no memory to write its end: a stream ends now with the fixed error; a whole
 * body becomes a 500, sent by the last choice (now, if this one is it). Either way the other
 * choices stop, as for an engine error (dps_fe_finish): nobody will read their answers.
 */
static void final_fail_oom(struct dps_frontend *f, struct fe_req *r)
{
	if (!r->g->failed)
		dps_fe_cancel_siblings(f, r);
	r->g->failed = 1;
	if (r->stream)
		stream_fail_fixed(f, r);
	else if (!r->g->n_open)
		dps_fe_send_error(f, r->conn, 500, "internal_error", DPS_FE_OOM_MSG);
}

static void fingerprint(FILE *o, const struct dps_frontend *f)
{
	if (!f->o.fingerprint)
		return;
	fprintf(o, ", \"system_fingerprint\": ");
	dps_json_string(o, f->o.fingerprint, strlen(f->o.fingerprint));
}

/* The fields every event of r's stream starts with; usage_null: not the usage chunk. */
static void chunk_head(FILE *o, const struct dps_frontend *f, const struct fe_req *r,
		       int usage_null)
{
	fprintf(o, "data: {\"id\": \"%s\", \"object\": \"%s\", \"created\": %ld, \"model\": ", r->id,
		r->chat ? "chat.completion.chunk" : "text_completion", r->created);
	dps_json_string(o, f->o.model_name, strlen(f->o.model_name));
	fingerprint(o, f);
	if (usage_null && r->include_usage)
		fprintf(o, ", \"usage\": null");
}

static void send_event(struct dps_frontend *f, struct fe_req *r, char *ev, size_t n)
{
	dps_http_stream_write(f->http, r->conn, ev, n);
	free(ev);
}

/*
 * The text of token id by itself, as vLLM decodes each logprob's token (malloc'd; NULL when out
 * of memory); without a tokenizer "token_id:ID", vLLM's form for tokens as ids.
 */
static char *token_text(const struct dps_frontend *f, int id, size_t *len)
{
	char *s = NULL;

	if (f->o.lim.tok)
		return dps_tok_decode(f->o.lim.tok, &id, 1, 0, &s, len) ? NULL : s;
	s = malloc(32);
	if (s)
		*len = (size_t)snprintf(s, 32, "token_id:%d", id);
	return s;
}

/* A log-probability as JSON: -inf (and NaN) as -9999.0, as vLLM and OpenAI write it. */
static void lp_num(FILE *o, float x)
{
	if (x > -9999.0f)
		fprintf(o, "%.9g", (double)x);
	else
		fprintf(o, "-9999.0");
}

/* Characters (UTF-8 lead bytes) of s, for text_offset. */
static long code_points(const char *s, size_t n)
{
	long c = 0;

	for (size_t i = 0; i < n; i++)
		c += ((unsigned char)s[i] & 0xC0) != 0x80;
	return c;
}

/* Completions' top_logprobs entry of one position: the sampled token, then the top k (a
 * token already written, by its text, is not written twice: its JSON key would repeat). */
static void lp_top_dict(FILE *o, const struct dps_frontend *f, const struct dps_token_logprobs *t)
{
	char *seen[DPS_MAX_LOGPROBS + 1];
	size_t seen_len[DPS_MAX_LOGPROBS + 1];
	int n_seen = 0;

	fprintf(o, "{");
	for (int j = -1; j < t->n_top; j++) {
		const int id = j < 0 ? t->token : t->top[j].id;
		size_t l = 0;
		char *s;
		int dup = 0;

		if (j >= 0 && id == t->token)
			continue;
		s = token_text(f, id, &l);
		if (!s)
			continue;
		for (int k = 0; k < n_seen && !dup; k++)
			dup = seen_len[k] == l && !memcmp(seen[k], s, l);
		if (dup) {
			free(s);
			continue;
		}
		fprintf(o, "%s", n_seen ? ", " : "");
		dps_json_text(o, s, l);
		fprintf(o, ": ");
		lp_num(o, j < 0 ? t->logprob : t->top[j].logprob);
		seen[n_seen] = s;
		seen_len[n_seen++] = l;
	}
	fprintf(o, "}");
	for (int k = 0; k < n_seen; k++)
		free(seen[k]);
}

/* Entry i of completions' logprobs list: the echoed prompt's n_plps first, then r's tokens
 * from a on (the caller gives the prompt's only with the whole body). */
static const struct dps_token_logprobs *lp_entry(const struct fe_req *r, int np, int a, int i)
{
	return i < np ? &r->plps[i] : &r->lps[a + i - np];
}

/*
 * Completions' logprobs of r's tokens [a, b), after the echoed prompt's entries when a is 0
 * and the choice has them (the first prompt token's null): text_offset continues from
 * r->lp_offset, through the prompt's tokens first.
 */
static void lp_completions(FILE *o, const struct dps_frontend *f, struct fe_req *r, int a, int b)
{
	const int np = a == 0 && !r->stream ? r->n_plps : 0, n = np + (b > a ? b - a : 0);
	long *off = malloc(sizeof(long) * (size_t)(n ? n : 1));

	fprintf(o, "{\"tokens\": [");
	for (int i = 0; i < n; i++) {
		size_t l = 0;
		char *s = token_text(f, lp_entry(r, np, a, i)->token, &l);

		fprintf(o, "%s", i ? ", " : "");
		dps_json_text(o, s ? s : "", s ? l : 0);
		if (off)
			off[i] = r->lp_offset;
		r->lp_offset += s ? code_points(s, l) : 0;
		free(s);
	}
	fprintf(o, "], \"token_logprobs\": [");
	for (int i = 0; i < n; i++) {
		const struct dps_token_logprobs *t = lp_entry(r, np, a, i);

		fprintf(o, "%s", i ? ", " : "");
		if (t->n_top < 0)
			fprintf(o, "null");
		else
			lp_num(o, t->logprob);
	}
	fprintf(o, "], \"top_logprobs\": [");
	for (int i = 0; i < n; i++) {
		const struct dps_token_logprobs *t = lp_entry(r, np, a, i);

		fprintf(o, "%s", i ? ", " : "");
		if (t->n_top < 0)
			fprintf(o, "null");
		else
			lp_top_dict(o, f, t);
	}
	fprintf(o, "], \"text_offset\": [");
	for (int i = 0; i < n && off; i++)
		fprintf(o, "%s%ld", i ? ", " : "", off[i]);
	fprintf(o, "]}");
	free(off);
}

/* One {"token", "logprob", "bytes"} of chat (the bytes: the token's own, as OpenAI's). */
static void lp_chat_token(FILE *o, const struct dps_frontend *f, int id, float lp)
{
	size_t l = 0;
	char *s = token_text(f, id, &l);

	fprintf(o, "\"token\": ");
	dps_json_text(o, s ? s : "", s ? l : 0);
	fprintf(o, ", \"logprob\": ");
	lp_num(o, lp);
	fprintf(o, ", \"bytes\": [");
	for (size_t i = 0; s && i < l; i++)
		fprintf(o, "%s%u", i ? ", " : "", (unsigned)(unsigned char)s[i]);
	fprintf(o, "]");
	free(s);
}

/* Chat's logprobs of r's tokens [a, b): top_logprobs the k likeliest, likeliest first. */
static void lp_chat(FILE *o, const struct dps_frontend *f, const struct fe_req *r, int a, int b)
{
	fprintf(o, "{\"content\": [");
	for (int i = a; i < b; i++) {
		const struct dps_token_logprobs *t = &r->lps[i];

		fprintf(o, "%s{", i > a ? ", " : "");
		lp_chat_token(o, f, t->token, t->logprob);
		fprintf(o, ", \"top_logprobs\": [");
		for (int j = 0; j < t->n_top; j++) {
			fprintf(o, "%s{", j ? ", " : "");
			lp_chat_token(o, f, t->top[j].id, t->top[j].logprob);
			fprintf(o, "}");
		}
		fprintf(o, "]}");
	}
	fprintf(o, "]}");
}

/* "logprobs": of r's tokens [a, b), or null when r did not ask for them. */
static void logprobs(FILE *o, const struct dps_frontend *f, struct fe_req *r, int a, int b)
{
	fprintf(o, ", \"logprobs\": ");
	if (!r->want_lp)
		fprintf(o, "null");
	else if (r->chat)
		lp_chat(o, f, r, a, b);
	else
		lp_completions(o, f, r, a, b);
}

void dps_fe_stream_begin(struct dps_frontend *f, struct fe_req *r)
{
	char *ev = NULL;
	size_t n = 0;
	FILE *o;

	if (!r->g->stream_started) {
		dps_http_stream_start(f->http, r->conn, 200, "text/event-stream");
		r->g->stream_started = 1;
	}
	if (!r->chat)
		return;
	o = open_memstream(&ev, &n);
	if (!o)
		return;
	chunk_head(o, f, r, 1);
	fprintf(o, ", \"choices\": [{\"index\": %d, \"delta\": {\"role\": \"assistant\", "
		   "\"content\": \"\"}, \"logprobs\": null, \"finish_reason\": null}]}\n\n", r->index);
	fclose(o);
	send_event(f, r, ev, n);
}

void dps_fe_stream_text(struct dps_frontend *f, struct fe_req *r, size_t upto)
{
	const int new_ids = r->ids_emitted < r->n_gen;
	char *ev = NULL;
	size_t n = 0;
	FILE *o;

	if (upto < r->emitted)
		upto = r->emitted;
	if (r->conn_gone || (upto == r->emitted && (r->chat ? !(r->want_lp && new_ids) : !new_ids)))
		return;
	o = open_memstream(&ev, &n);
	if (!o)
		return;
	chunk_head(o, f, r, 1);
	if (r->chat) {
		fprintf(o, ", \"choices\": [{\"index\": %d, \"delta\": {\"content\": ", r->index);
		dps_json_text(o, r->text ? r->text + r->emitted : "", upto - r->emitted);
		fprintf(o, "}");
		logprobs(o, f, r, r->ids_emitted, r->n_gen);
		fprintf(o, ", \"finish_reason\": null}]}\n\n");
	} else {
		fprintf(o, ", \"choices\": [{\"index\": %d, \"text\": ", r->index);
		dps_json_text(o, r->text ? r->text + r->emitted : "", upto - r->emitted);
		logprobs(o, f, r, r->ids_emitted, r->n_gen);
		fprintf(o, ", \"finish_reason\": null, \"token_ids\": [");
		for (int i = r->ids_emitted; i < r->n_gen; i++)
			fprintf(o, "%s%d", i > r->ids_emitted ? ", " : "", r->gen[i]);
		fprintf(o, "]}]}\n\n");
	}
	fclose(o);
	send_event(f, r, ev, n);
	r->emitted = upto;
	r->ids_emitted = r->n_gen;
}

static void usage(FILE *o, const struct fe_group *g)
{
	fprintf(o, "\"usage\": {\"prompt_tokens\": %ld, \"completion_tokens\": %ld, "
		   "\"total_tokens\": %ld}", g->prompt_tokens, g->gen_tokens,
		g->prompt_tokens + g->gen_tokens);
}

/* The stream's end after its last choice: the usage when asked, [DONE]. */
static void stream_end(struct dps_frontend *f, struct fe_req *r)
{
	char *body = NULL;
	size_t n = 0;
	FILE *o = open_memstream(&body, &n);

	if (!o) {
		stream_fail_fixed(f, r);
		return;
	}
	if (r->include_usage) {
		chunk_head(o, f, r, 0);
		fprintf(o, ", \"choices\": [], ");
		usage(o, r->g);
		fprintf(o, "}\n\n");
	}
	fprintf(o, "data: [DONE]\n\n");
	if (fclose(o) || !body) {
		free(body);
		stream_fail_fixed(f, r);
		return;
	}
	dps_http_stream_write(f->http, r->conn, body, n);
	dps_http_stream_end(f->http, r->conn);
	free(body);
}

/* The whole body after the last choice: every choice's object in index order, the usage. */
static void body_end(struct dps_frontend *f, struct fe_req *r)
{
	const struct fe_group *g = r->g;
	const char *model = f->o.model_name;
	char *body = NULL;
	size_t n = 0;
	FILE *o = open_memstream(&body, &n);

	if (!o) {
		dps_fe_send_error(f, r->conn, 500, "internal_error", DPS_FE_OOM_MSG);
		return;
	}
	fprintf(o, "{\"id\": \"%s\", \"object\": \"%s\", \"created\": %ld, \"model\": ", r->id,
		r->chat ? "chat.completion" : "text_completion", r->created);
	dps_json_string(o, model, strlen(model));
	fingerprint(o, f);
	fprintf(o, ", \"choices\": [");
	for (int c = 0; c < g->n_choices; c++) {
		fprintf(o, "%s", c ? ", " : "");
		if (g->body[c])
			fwrite(g->body[c], 1, g->body_len[c], o);
	}
	fprintf(o, "], ");
	usage(o, g);
	fprintf(o, "}\n");
	if (fclose(o) || !body) {
		free(body);
		dps_fe_send_error(f, r->conn, 500, "internal_error", DPS_FE_OOM_MSG);
		return;
	}
	dps_http_respond(f->http, r->conn, 200, "application/json", body, n, NULL, 0);
	free(body);
}

void dps_fe_respond_final(struct dps_frontend *f, struct fe_req *r, const char *fin)
{
	char *body = NULL;
	size_t n = 0;
	FILE *o;

	if (r->stream)
		dps_fe_stream_text(f, r, r->len);
	o = open_memstream(&body, &n);
	if (!o) {
		final_fail_oom(f, r);
		return;
	}
	if (r->stream) {
		chunk_head(o, f, r, 1);
		if (r->chat)
			fprintf(o, ", \"choices\": [{\"index\": %d, \"delta\": {}, \"logprobs\": null, "
				   "\"finish_reason\": \"%s\"}]", r->index, fin);
		else
			fprintf(o, ", \"choices\": [{\"index\": %d, \"text\": \"\", \"logprobs\": "
				   "null, \"finish_reason\": \"%s\"}]", r->index, fin);
		if (!strcmp(fin, "error"))
			fprintf(o, ", \"error\": {\"message\": \"%s\", \"type\": \"internal_error\", "
				   "\"code\": 500}", DPS_FE_FAILED_MSG);
		fprintf(o, "}\n\n");
		if (fclose(o) || !body) {
			free(body);
			final_fail_oom(f, r);
			return;
		}
		dps_http_stream_write(f->http, r->conn, body, n);
		free(body);
		if (!r->g->n_open)
			stream_end(f, r);
		return;
	}
	if (r->chat) {
		fprintf(o, "{\"index\": %d, \"message\": {\"role\": \"assistant\", \"content\": ",
			r->index);
		dps_json_text(o, r->text ? r->text : "", r->len);
		fprintf(o, "}");
		logprobs(o, f, r, 0, r->n_gen);
		fprintf(o, ", \"finish_reason\": \"%s\"}", fin);
	} else {
		fprintf(o, "{\"index\": %d, \"text\": ", r->index);
		dps_json_text(o, r->text ? r->text : "", r->len);
		logprobs(o, f, r, 0, r->n_gen);
		fprintf(o, ", \"finish_reason\": \"%s\", \"token_ids\": [", fin);
		for (int i = 0; i < r->n_gen; i++)
			fprintf(o, "%s%d", i ? ", " : "", r->gen[i]);
		fprintf(o, "]}");
	}
	if (fclose(o) || !body) {
		free(body);
		final_fail_oom(f, r);
		return;
	}
	free(r->g->body[r->index]);
	r->g->body[r->index] = body;
	r->g->body_len[r->index] = n;
	if (!r->g->n_open)
		body_end(f, r);
}

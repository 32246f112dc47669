/* SPDX-License-Identifier: MIT */
/*
 * engine/api/respond.c - the bodies the frontend sends, as the OpenAI API and vLLM shape them:
 * errors, text_completion and chat.completion responses, and their server-sent event streams
 * (a chat stream opens with the assistant's role, then content deltas, then the finish
 * reason, the usage when asked, and "data: [DONE]"). Every response and chunk carries the
 * server's system_fingerprint; under stream_options.include_usage every chunk but the last has
 * "usage": null, as OpenAI's; the finish chunk of a stream the engine failed carries an
 * "error" object, since its status (200) went out long before. Called by frontend.c on the
 * loop thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "engine/api/frontend_int.h"

void dps_fe_send_error(struct dps_frontend *f, uint64_t conn, int status, const char *type,
		       const char *msg)
{
	char *body = NULL;
	size_t n = 0;
	FILE *o = open_memstream(&body, &n);

	if (!o)
		return;
	fprintf(o, "{\"error\": {\"message\": ");
	dps_json_string(o, msg, strlen(msg));
	fprintf(o, ", \"type\": \"%s\", \"code\": %d}}\n", type, status);
	fclose(o);
	dps_http_respond(f->http, conn, status, "application/json", body, n,
			 status == 401 ? "WWW-Authenticate: Bearer\r\n" : NULL, 0);
	f->http_errors++;
	free(body);
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

void dps_fe_stream_begin(struct dps_frontend *f, struct fe_req *r)
{
	char *ev = NULL;
	size_t n = 0;
	FILE *o;

	dps_http_stream_start(f->http, r->conn, 200, "text/event-stream");
	if (!r->chat)
		return;
	o = open_memstream(&ev, &n);
	if (!o)
		return;
	chunk_head(o, f, r, 1);
	fprintf(o, ", \"choices\": [{\"index\": 0, \"delta\": {\"role\": \"assistant\", "
		   "\"content\": \"\"}, \"logprobs\": null, \"finish_reason\": null}]}\n\n");
	fclose(o);
	send_event(f, r, ev, n);
}

void dps_fe_stream_text(struct dps_frontend *f, struct fe_req *r, size_t upto)
{
	char *ev = NULL;
	size_t n = 0;
	FILE *o;

	if (upto < r->emitted)
		upto = r->emitted;
	if (r->conn_gone || (upto == r->emitted && (r->chat || r->ids_emitted == r->n_gen)))
		return;
	o = open_memstream(&ev, &n);
	if (!o)
		return;
	chunk_head(o, f, r, 1);
	if (r->chat) {
		fprintf(o, ", \"choices\": [{\"index\": 0, \"delta\": {\"content\": ");
		dps_json_text(o, r->text ? r->text + r->emitted : "", upto - r->emitted);
		fprintf(o, "}, \"logprobs\": null, \"finish_reason\": null}]}\n\n");
	} else {
		fprintf(o, ", \"choices\": [{\"index\": 0, \"text\": ");
		dps_json_text(o, r->text ? r->text + r->emitted : "", upto - r->emitted);
		fprintf(o, ", \"logprobs\": null, \"finish_reason\": null, \"token_ids\": [");
		for (int i = r->ids_emitted; i < r->n_gen; i++)
			fprintf(o, "%s%d", i > r->ids_emitted ? ", " : "", r->gen[i]);
		fprintf(o, "]}]}\n\n");
	}
	fclose(o);
	send_event(f, r, ev, n);
	r->emitted = upto;
	r->ids_emitted = r->n_gen;
}

static void usage(FILE *o, const struct fe_req *r)
{
	fprintf(o, "\"usage\": {\"prompt_tokens\": %d, \"completion_tokens\": %d, "
		   "\"total_tokens\": %d}", r->n_prompt, r->n_gen, r->n_prompt + r->n_gen);
}

void dps_fe_respond_final(struct dps_frontend *f, struct fe_req *r, const char *fin)
{
	const char *model = f->o.model_name;
	char *body = NULL;
	size_t n = 0;
	FILE *o;

	if (r->stream)
		dps_fe_stream_text(f, r, r->len);
	o = open_memstream(&body, &n);
	if (!o)
		return;
	if (r->stream) {
		chunk_head(o, f, r, 1);
		if (r->chat)
			fprintf(o, ", \"choices\": [{\"index\": 0, \"delta\": {}, \"logprobs\": null, "
				   "\"finish_reason\": \"%s\"}]", fin);
		else
			fprintf(o, ", \"choices\": [{\"index\": 0, \"text\": \"\", \"logprobs\": "
				   "null, \"finish_reason\": \"%s\"}]", fin);
		if (!strcmp(fin, "error"))
			fprintf(o, ", \"error\": {\"message\": \"%s\", \"type\": \"internal_error\", "
				   "\"code\": 500}", DPS_FE_FAILED_MSG);
		fprintf(o, "}\n\n");
		if (r->include_usage) {
			chunk_head(o, f, r, 0);
			fprintf(o, ", \"choices\": [], ");
			usage(o, r);
			fprintf(o, "}\n\n");
		}
		fprintf(o, "data: [DONE]\n\n");
		fclose(o);
		dps_http_stream_write(f->http, r->conn, body, n);
		dps_http_stream_end(f->http, r->conn);
		free(body);
		return;
	}
	fprintf(o, "{\"id\": \"%s\", \"object\": \"%s\", \"created\": %ld, \"model\": ", r->id,
		r->chat ? "chat.completion" : "text_completion", r->created);
	dps_json_string(o, model, strlen(model));
	fingerprint(o, f);
	if (r->chat) {
		fprintf(o, ", \"choices\": [{\"index\": 0, \"message\": {\"role\": \"assistant\", "
			   "\"content\": ");
		dps_json_text(o, r->text ? r->text : "", r->len);
		fprintf(o, "}, \"logprobs\": null, \"finish_reason\": \"%s\"}], ", fin);
	} else {
		fprintf(o, ", \"choices\": [{\"index\": 0, \"text\": ");
		dps_json_text(o, r->text ? r->text : "", r->len);
		fprintf(o, ", \"logprobs\": null, \"finish_reason\": \"%s\", \"token_ids\": [", fin);
		for (int i = 0; i < r->n_gen; i++)
			fprintf(o, "%s%d", i ? ", " : "", r->gen[i]);
		fprintf(o, "]}], ");
	}
	usage(o, r);
	fprintf(o, "}\n");
	fclose(o);
	dps_http_respond(f->http, r->conn, 200, "application/json", body, n, NULL, 0);
	free(body);
}

/* SPDX-License-Identifier: MIT */
/*
 * tools/cmd_tokenize.c - `dpshard tokenize` (text to ids, as POST /tokenize) and `dpshard
 * detokenize` (ids to text, as POST /detokenize), with the model directory's tokenizer
 * (tokenizer.json or tokenizer.bin) and, for tokenize --chat, its chat template.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "common/dps.h"
#include "tools/cmd.h"
#include "tools/flags.h"
#include "tools/text.h"

int dps_cmd_tokenize(int argc, char **argv)
{
	const char *model = NULL;
	int no_special = 0, chat = 0, npos, rc;
	char *pos[1], defdir[4096], err[512];
	struct dps_model_config cfg;
	struct dps_tool_text tt;
	struct dps_flag flags[] = {
		{ "model", DPS_FLAG_STR, &model, "DIR",
		  "model directory (default: stories260K, the model that comes with dpshard)" },
		{ "no-special", DPS_FLAG_BOOL, &no_special, NULL,
		  "leave out the special tokens the tokenizer adds (BOS, its post-processor's "
		  "template)" },
		{ "chat", DPS_FLAG_BOOL, &chat, NULL,
		  "TEXT is a user message, rendered by the model's chat template (with the "
		  "generation prompt); special tokens come from the template alone" },
		DPS_FLAGS_END,
	};
	char *rendered = NULL;
	const char *text;
	size_t len, n = 0;
	int *ids = NULL;

	rc = dps_flags_parse(flags, argc, argv, "tokenize", "[--model DIR] [--no-special] TEXT",
			     pos, 1, &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (npos != 1) {
		fprintf(stderr, "dpshard tokenize: give one TEXT (quote it)\n");
		return 2;
	}
	rc = dps_tool_text_open_model(&tt, "tokenize", &model, defdir, sizeof(defdir), &cfg);
	if (rc)
		return rc;
	text = pos[0];
	len = strlen(text);
	if (chat) {
		json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", text);

		if (!tt.chat) {
			fprintf(stderr, "dpshard tokenize: --chat: %s\n", tt.chat_err);
			json_decref(msgs);
			dps_tool_text_close(&tt);
			return 1;
		}
		rc = msgs ? dps_chat_render(tt.chat, msgs, NULL, 1, NULL, (long long)time(NULL),
					    &rendered, &len, err, sizeof(err)) : -ENOMEM;
		json_decref(msgs);
		if (rc) {
			fprintf(stderr, "dpshard tokenize: the chat template: %s\n",
				rc == -ENOMEM ? "out of memory" : err);
			dps_tool_text_close(&tt);
			return 1;
		}
		text = rendered;
	}
	rc = dps_tok_encode(tt.tok, text, len, no_special || chat ? 0 : DPS_TOK_ADD_SPECIAL, 0,
			    &ids, &n);
	if (rc) {
		fprintf(stderr, "dpshard tokenize: %s\n", dps_strerror(rc));
	} else {
		for (size_t i = 0; i < n; i++)
			printf("%s%d", i ? " " : "", ids[i]);
		printf("\n");
	}
	free(ids);
	free(rendered);
	dps_tool_text_close(&tt);
	return rc ? 1 : 0;
}

int dps_cmd_detokenize(int argc, char **argv)
{
	const char *model = NULL;
	int skip = 0, npos, rc;
	char *pos[4096], defdir[4096];
	struct dps_model_config cfg;
	struct dps_tool_text tt;
	struct dps_flag flags[] = {
		{ "model", DPS_FLAG_STR, &model, "DIR",
		  "model directory (default: stories260K, the model that comes with dpshard)" },
		{ "skip-special", DPS_FLAG_BOOL, &skip, NULL, "leave the special tokens out" },
		DPS_FLAGS_END,
	};
	int *ids = NULL, n = 0;
	size_t cap = 0, len;
	char *text;

	rc = dps_flags_parse(flags, argc, argv, "detokenize", "[--model DIR] IDS...", pos, 4096,
			     &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (!npos) {
		fprintf(stderr, "dpshard detokenize: give the token ids (as arguments, or one "
				"quoted list)\n");
		return 2;
	}
	rc = dps_tool_text_open_model(&tt, "detokenize", &model, defdir, sizeof(defdir), &cfg);
	if (rc)
		return rc;
	for (int i = 0; i < npos; i++)
		cap += strlen(pos[i]) / 2 + 1;
	ids = malloc(cap * sizeof(int));
	if (!ids) {
		dps_tool_text_close(&tt);
		return 1;
	}
	for (int i = 0; i < npos; i++) {
		const int m = dps_flags_int_list(pos[i], ids + n, (int)(cap - (size_t)n), 0,
						 dps_tok_vocab_size(tt.tok) - 1);

		if (m < 0) {
			fprintf(stderr, "dpshard detokenize: '%s' is not a list of token ids below "
					"%d\n", pos[i], dps_tok_vocab_size(tt.tok));
			free(ids);
			dps_tool_text_close(&tt);
			return 2;
		}
		n += m;
	}
	rc = dps_tok_decode(tt.tok, ids, (size_t)n, skip ? DPS_TOK_SKIP_SPECIAL : 0, &text, &len);
	if (!rc) {
		fwrite(text, 1, len, stdout);
		printf("\n");
		free(text);
	}
	free(ids);
	dps_tool_text_close(&tt);
	return rc ? 1 : 0;
}

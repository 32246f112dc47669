/* SPDX-License-Identifier: MIT */
/*
 * tools/cmd_mkmodel.c - `dpshard mkmodel`: seeded random models of any shape, presets, and Eagle3
 * drafts of a model (engine/model/mkmodel.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/model/mkmodel.h"
#include "engine/model/model_config.h"
#include "tools/cmd.h"
#include "tools/flags.h"

/* One line a preset: its name, its parameters and what it is. */
static void print_presets(FILE *out)
{
	for (const struct dps_mkmodel_preset *p = dps_mkmodel_presets; p->name; p++)
		fprintf(out, "  %-14s %7.1fM parameters  %s\n", p->name,
			(double)dps_model_config_params(&p->cfg) / 1e6, p->what);
}

int dps_cmd_mkmodel(int argc, char **argv)
{
	const char *preset = NULL, *out = NULL, *dtype = "f32", *draft_for = NULL;
	const char *draft_kind = "self";
	int draft_vocab = 0;
	struct dps_model_config c, check;
	int seed = 0, list = 0, tie = -1, npos, rc;
	int hidden = 0, inter = 0, layers = 0, heads = 0, kv = 0, hd = 0, vocab = 0, maxpos = 0;
	enum dps_st_dtype dt;
	char *pos[1], err[512] = "cannot write config.json", path[4200];
	const struct dps_flag flags[] = {
		{ "preset", DPS_FLAG_STR, &preset, "NAME", "start from a preset (--list-presets)" },
		{ "out", DPS_FLAG_STR, &out, "DIR", "output directory (created)" },
		{ "seed", DPS_FLAG_INT, &seed, "S", "random seed; the same seed gives the same bytes" },
		{ "dtype", DPS_FLAG_STR, &dtype, "T", "tensor type: f32, bf16 or f16" },
		{ "hidden-size", DPS_FLAG_INT, &hidden, "N", "override: hidden size" },
		{ "intermediate-size", DPS_FLAG_INT, &inter, "N", "override: MLP intermediate size" },
		{ "num-hidden-layers", DPS_FLAG_INT, &layers, "N", "override: decoder layers" },
		{ "num-attention-heads", DPS_FLAG_INT, &heads, "N", "override: query heads" },
		{ "num-key-value-heads", DPS_FLAG_INT, &kv, "N", "override: KV heads" },
		{ "head-dim", DPS_FLAG_INT, &hd, "N", "override: head size (default hidden / heads)" },
		{ "vocab-size", DPS_FLAG_INT, &vocab, "N", "override: vocabulary size" },
		{ "max-position-embeddings", DPS_FLAG_INT, &maxpos, "N", "override: context length" },
		{ "tie-word-embeddings", DPS_FLAG_INT, &tie, "0|1", "override: tie the LM head", -1, 1 },
		{ "list-presets", DPS_FLAG_BOOL, &list, NULL, "print the presets and exit" },
		{ "draft-for", DPS_FLAG_STR, &draft_for, "DIR",
		  "write an Eagle3 draft of the model in DIR instead (shape flags do not apply)" },
		{ "draft-kind", DPS_FLAG_STR, &draft_kind, "self|random",
		  "self: built from the target's weights, no training (default); random: seeded "
		  "random weights" },
		{ "draft-vocab", DPS_FLAG_INT, &draft_vocab, "N",
		  "draft vocabulary size (default: the target's)" },
		DPS_FLAGS_END
	};

	rc = dps_flags_parse(flags, argc, argv, "mkmodel",
			     "(--preset NAME | --hidden-size N ... | --draft-for DIR) --out DIR [--seed S]", pos, 0, &npos);
	if (rc > 0) { /* --help: the presets too */
		printf("\npresets (--preset NAME):\n");
		print_presets(stdout);
		return 0;
	}
	if (rc)
		return 2;
	if (list) {
		print_presets(stdout);
		return 0;
	}
	if (!out) {
		fprintf(stderr, "dpshard mkmodel: --out DIR is required\n");
		return 2;
	}
	if (draft_for) {
		enum dps_draft_kind kind;

		if (!strcmp(draft_kind, "self"))
			kind = DPS_DRAFT_SELF;
		else if (!strcmp(draft_kind, "random"))
			kind = DPS_DRAFT_RANDOM;
		else {
			fprintf(stderr, "dpshard mkmodel: --draft-kind must be self or random, not "
				"'%s'\n", draft_kind);
			return 2;
		}
		if (draft_vocab < 0) {
			fprintf(stderr, "dpshard mkmodel: --draft-vocab must be positive\n");
			return 2;
		}
		if (dps_tool_parse_dtype("mkmodel", dtype, &dt))
			return 2;
		fprintf(stderr, "dpshard mkmodel: writing a %s Eagle3 draft of %s to %s ...\n",
			kind == DPS_DRAFT_SELF ? "self-distilled" : "random", draft_for, out);
		rc = dps_mkmodel_draft(draft_for, kind, draft_vocab, (uint64_t)seed, dt, out, err,
				       sizeof(err));
		if (rc) {
			fprintf(stderr, "dpshard mkmodel: %s\n", err);
			return 1;
		}
		printf("wrote %s\n", out);
		return 0;
	}
	if (preset && !dps_mkmodel_preset(preset)) {
		fprintf(stderr, "dpshard mkmodel: unknown preset '%s' (see --list-presets)\n", preset);
		return 2;
	}
	c = dps_mkmodel_preset(preset ? preset : "tiny")->cfg;
	if (hidden) c.hidden_size = hidden;
	if (inter) c.intermediate_size = inter;
	if (layers) c.num_hidden_layers = layers;
	if (heads) c.num_attention_heads = heads;
	if (kv) c.num_key_value_heads = kv;
	else if (heads) c.num_key_value_heads = heads;
	if (hd) c.head_dim = hd;
	else if (hidden || heads) c.head_dim = c.num_attention_heads ? c.hidden_size / c.num_attention_heads : 0;
	if (vocab) c.vocab_size = vocab;
	if (maxpos) c.max_position_embeddings = maxpos;
	if (tie >= 0) c.tie_word_embeddings = tie;
	if (dps_tool_parse_dtype("mkmodel", dtype, &dt))
		return 2;
	/* Validate the shape with the same rules as any config.json, before writing weights. */
	if (mkdir(out, 0755) && errno != EEXIST) {
		fprintf(stderr, "dpshard mkmodel: %s: %s\n", out, strerror(errno));
		return 1;
	}
	snprintf(path, sizeof(path), "%s/config.json", out);
	if (dps_model_config_check_save(&c, err, sizeof(err)) ||
	    dps_model_config_save(&c, path) ||
	    dps_model_config_load(out, &check, err, sizeof(err))) {
		fprintf(stderr, "dpshard mkmodel: invalid shape: %s\n", err);
		unlink(path);
		return 2;
	}
	fprintf(stderr, "dpshard mkmodel: writing %.1fM parameters to %s ...\n",
		(double)dps_model_config_params(&c) / 1e6, out);
	rc = dps_mkmodel(&c, (uint64_t)seed, dt, out, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dpshard mkmodel: %s\n", err);
		if (rc != -EINVAL)
			return 1;
		unlink(path); /* a shape mkmodel cannot write (MXFP4 blocks): no model left */
		return 2;
	}
	printf("wrote %s\n", out);
	return 0;
}


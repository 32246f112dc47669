/* SPDX-License-Identifier: MIT */
/*
 * tools/flags.c - the flag parser and help printer of every dpshard subcommand (see
 * flags.h). Reads user input, so every value is range-checked and every message names the
 * flag and the value it refused.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/conf.h"
#include "common/dps.h"
#include "engine/runtime/groups.h"
#include "tools/flags.h"

void dps_flags_parallel(struct dps_par_cfg *cfg, struct dps_flag *out)
{
	const struct dps_flag f[DPS_PAR_FLAGS] = {
		{ "tensor-parallel-size", DPS_FLAG_INT, &cfg->tp, "N",
		  "ranks per model replica (TP)", 1, DPS_MAX_WORLD },
		{ "data-parallel-size", DPS_FLAG_INT, &cfg->dp, "N",
		  "number of model replicas (DP)", 1, DPS_MAX_WORLD },
		{ "attention-dp-size", DPS_FLAG_INT, &cfg->attn_dp, "N",
		  "shard attention Q/O (and K/V) over TP x N ranks; N divides DP", 1, DPS_MAX_WORLD },
		{ "embedding-dp-size", DPS_FLAG_INT, &cfg->emb_dp, "N",
		  "shard the embedding vocabulary over TP x N ranks; N divides DP", 1, DPS_MAX_WORLD },
		{ "mlp-dp-size", DPS_FLAG_INT, &cfg->mlp_dp, "N",
		  "shard the target MLP over TP x N ranks; N divides DP", 1, DPS_MAX_WORLD },
		{ "draft-mlp-dp-size", DPS_FLAG_INT, &cfg->draft_mlp_dp, "N",
		  "shard the Eagle3 draft MLP over TP x N ranks; N divides DP", 1, DPS_MAX_WORLD },
		{ "lm-head-dp-size", DPS_FLAG_INT, &cfg->lm_head_dp, "N",
		  "shard the LM head vocabulary over TP x N ranks; N divides DP", 1, DPS_MAX_WORLD },
		{ "enable-expert-parallel", DPS_FLAG_BOOL, &cfg->ep, NULL,
		  "MoE models: place the experts in contiguous blocks over all TP x DP ranks "
		  "(couples the replicas)", 0, 0 },
		{ "all2all-backend", DPS_FLAG_CHOICE, &cfg->a2a, "allgather_reducescatter|alltoallv",
		  "the expert dispatch with --enable-expert-parallel (default "
		  "allgather_reducescatter)", 0, 0 },
		{ "prefill-data-parallel-size", DPS_FLAG_INT, &cfg->prefill_dp, "P",
		  "disaggregated prefill: P prefill replicas of plain TP beside the decode "
		  "replicas the flags above describe (0: none; every rank runs both graphs)", 0,
		  DPS_MAX_WORLD },
		{ "prefill-tensor-parallel-size", DPS_FLAG_INT, &cfg->prefill_tp, "T",
		  "ranks per prefill replica (default: --tensor-parallel-size)", 1, DPS_MAX_WORLD },
		{ "nodes", DPS_FLAG_INT, &cfg->nodes, "N",
		  "spread the ranks over N machines, numbered node-major: start one dpshard per "
		  "node with `mpirun -np N --map-by node dpshard ... --nodes N` (default 1)", 1,
		  DPS_MAX_WORLD },
	};
	memcpy(out, f, sizeof(f));
}

static const struct dps_flag *flag_find(const struct dps_flag *flags, const char *name, size_t len)
{
	for (; flags->type != DPS_FLAG_END; flags++)
		if (strlen(flags->name) == len && !strncmp(flags->name, name, len))
			return flags;
	return NULL;
}

static int flag_set(const struct dps_flag *f, const char *cmd, const char *val)
{
	long v;
	size_t sz;
	char *end;
	double d;
	int rc;

	switch (f->type) {
	case DPS_FLAG_INT: {
		long lo = f->lo, hi = f->hi;

		if (lo == 0 && hi == 0)
			hi = INT_MAX;
		rc = dps_parse_int(val, lo, hi, &v);
		if (rc == -ERANGE) {
			fprintf(stderr, "dpshard %s: --%s %s is out of range [%ld, %ld]\n", cmd,
				f->name, val, lo, hi);
			return -1;
		}
		if (rc) {
			fprintf(stderr, "dpshard %s: --%s expects an integer, got '%s'\n", cmd,
				f->name, val);
			return -1;
		}
		*(int *)f->ptr = (int)v;
		return 0;
	}
	case DPS_FLAG_SIZE:
		if (dps_parse_size(val, &sz)) {
			fprintf(stderr,
				"dpshard %s: --%s expects a byte size like 4096, 64K or 1M, got '%s'\n",
				cmd, f->name, val);
			return -1;
		}
		*(size_t *)f->ptr = sz;
		return 0;
	case DPS_FLAG_STR:
		*(const char **)f->ptr = val;
		return 0;
	case DPS_FLAG_CHOICE: {
		const char *m = f->metavar;

		for (int k = 1; m && *m; k++) {
			const size_t n = strcspn(m, "|");

			if (strlen(val) == n && !strncmp(m, val, n)) {
				*(int *)f->ptr = k;
				return 0;
			}
			m += n + (m[n] == '|');
		}
		fprintf(stderr, "dpshard %s: --%s %s: choose one of %s\n", cmd, f->name, val,
			f->metavar);
		return -1;
	}
	case DPS_FLAG_DOUBLE:
		errno = 0;
		d = strtod(val, &end);
		if (errno || end == val || *end) {
			fprintf(stderr, "dpshard %s: --%s expects a number, got '%s'\n", cmd,
				f->name, val);
			return -1;
		}
		*(double *)f->ptr = d;
		return 0;
	default:
		return -1;
	}
}

/* The config file's string values, kept for the life of the process and freed at exit. */
static char **kept;
static size_t n_kept;

static void free_kept(void)
{
	for (size_t i = 0; i < n_kept; i++)
		free(kept[i]);
	free(kept);
	kept = NULL;
	n_kept = 0;
}

static int keep(char *s)
{
	char **k = realloc(kept, sizeof(*k) * (n_kept + 1));

	if (!k)
		return -ENOMEM;
	if (!kept)
		atexit(free_kept);
	kept = k;
	kept[n_kept++] = s;
	return 0;
}

struct conf_ctx {
	const struct dps_flag *flags;
	const char *cmd, *path;
};

static int conf_entry(void *arg, const char *key, const char *value, int line)
{
	const struct conf_ctx *c = arg;
	const struct dps_flag *f = flag_find(c->flags, key, strlen(key));
	char *copy;

	if (!f) {
		fprintf(stderr, "dpshard %s: %s line %d: unknown key '%s' (dpshard %s --help lists "
				"them)\n", c->cmd, c->path, line, key, c->cmd);
		return -EINVAL;
	}
	if (f->type == DPS_FLAG_BOOL) {
		if (!strcmp(value, "true") || !strcmp(value, "yes") || !strcmp(value, "on") ||
		    !strcmp(value, "1"))
			*(int *)f->ptr = 1;
		else if (!strcmp(value, "false") || !strcmp(value, "no") || !strcmp(value, "off") ||
			 !strcmp(value, "0"))
			*(int *)f->ptr = 0;
		else {
			fprintf(stderr, "dpshard %s: %s line %d: '%s' takes true or false, not '%s'\n",
				c->cmd, c->path, line, key, value);
			return -EINVAL;
		}
		return 0;
	}
	/* String flags borrow their value for the life of the process: keep a copy. */
	copy = strdup(value);
	if (!copy)
		return -ENOMEM;
	if (flag_set(f, c->cmd, copy)) {
		fprintf(stderr, "dpshard %s: (from %s line %d)\n", c->cmd, c->path, line);
		free(copy);
		return -EINVAL;
	}
	if (f->type != DPS_FLAG_STR)
		free(copy);
	else if (keep(copy)) {
		free(copy);
		return -ENOMEM;
	}
	return 0;
}

/* Applies the entries of config file path as flags (the command line then overrides them). */
static int load_config(const struct dps_flag *flags, const char *cmd, const char *path)
{
	struct conf_ctx c = { flags, cmd, path };
	FILE *f = fopen(path, "rb");
	char *buf, err[256];
	size_t n;
	int rc;

	if (!f) {
		fprintf(stderr, "dpshard %s: --config %s: %s\n", cmd, path, strerror(errno));
		return -1;
	}
	buf = malloc(DPS_CONF_MAX_BYTES + 1);
	if (!buf) {
		fclose(f);
		fprintf(stderr, "dpshard %s: out of memory\n", cmd);
		return -1;
	}
	n = fread(buf, 1, DPS_CONF_MAX_BYTES + 1, f);
	rc = ferror(f) ? -EIO : 0;
	fclose(f);
	if (rc) {
		fprintf(stderr, "dpshard %s: --config %s: cannot read it\n", cmd, path);
	} else {
		rc = dps_conf_parse(buf, n, conf_entry, &c, err, sizeof(err));
		if (rc == -EINVAL && err[0])
			fprintf(stderr, "dpshard %s: --config %s: %s\n", cmd, path, err);
	}
	free(buf);
	return rc ? -1 : 0;
}

int dps_flags_parse(const struct dps_flag *flags, int argc, char **argv, const char *cmd,
		    const char *synopsis, char **pos, int max_pos, int *npos)
{
	int i, only_pos = 0;

	*npos = 0;
	/* --config FILE first, wherever it is: the other flags override what it sets. */
	for (i = 0; i < argc && strcmp(argv[i], "--"); i++) {
		const char *path = NULL;

		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			break;
		if (!strcmp(argv[i], "--config")) {
			if (i + 1 >= argc) {
				fprintf(stderr, "dpshard %s: --config needs a value\n", cmd);
				return -1;
			}
			path = argv[i + 1];
		} else if (!strncmp(argv[i], "--config=", 9)) {
			path = argv[i] + 9;
		}
		if (path && load_config(flags, cmd, path))
			return -1;
	}
	for (i = 0; i < argc; i++) {
		const char *a = argv[i], *name, *eq, *val;
		const struct dps_flag *f;
		size_t len;

		if (only_pos || a[0] != '-' || a[1] == '\0') {
			if (*npos >= max_pos) {
				fprintf(stderr, "dpshard %s: unexpected argument '%s' (try --help)\n",
					cmd, a);
				return -1;
			}
			pos[(*npos)++] = argv[i];
			continue;
		}
		if (!strcmp(a, "--")) {
			only_pos = 1;
			continue;
		}
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			dps_flags_usage(stdout, cmd, synopsis, flags);
			return 1;
		}
		if (!strcmp(a, "--config")) { /* applied above */
			i++;
			continue;
		}
		if (!strncmp(a, "--config=", 9))
			continue;
		if (a[1] != '-') {
			f = NULL;
			if (a[2] == '\0')
				for (const struct dps_flag *g = flags; g->type != DPS_FLAG_END; g++)
					if (g->short_name && g->short_name == a[1])
						f = g;
			if (!f) {
				fprintf(stderr, "dpshard %s: unknown option '%s' (try --help)\n", cmd, a);
				return -1;
			}
			name = f->name;
			eq = NULL;
			len = strlen(name);
		} else {
			name = a + 2;
			eq = strchr(name, '=');
			len = eq ? (size_t)(eq - name) : strlen(name);
			f = flag_find(flags, name, len);
		}
		if (!f) {
			fprintf(stderr, "dpshard %s: unknown option '--%.*s' (try --help)\n", cmd,
				(int)len, name);
			return -1;
		}
		if (f->type == DPS_FLAG_BOOL) {
			if (eq) {
				fprintf(stderr, "dpshard %s: --%s takes no value\n", cmd, f->name);
				return -1;
			}
			*(int *)f->ptr = 1;
			continue;
		}
		if (eq) {
			val = eq + 1;
		} else {
			if (i + 1 >= argc) {
				fprintf(stderr, "dpshard %s: --%s needs a value\n", cmd, f->name);
				return -1;
			}
			val = argv[++i];
		}
		if (flag_set(f, cmd, val))
			return -1;
	}
	return 0;
}

static void flag_default(const struct dps_flag *f, char *buf, size_t len)
{
	buf[0] = '\0';
	switch (f->type) {
	case DPS_FLAG_INT:
		snprintf(buf, len, "%d", *(int *)f->ptr);
		break;
	case DPS_FLAG_SIZE:
		snprintf(buf, len, "%zu", *(size_t *)f->ptr);
		break;
	case DPS_FLAG_STR:
		if (*(const char **)f->ptr)
			snprintf(buf, len, "%s", *(const char **)f->ptr);
		break;
	case DPS_FLAG_DOUBLE:
		snprintf(buf, len, "%g", *(double *)f->ptr);
		break;
	case DPS_FLAG_CHOICE: {
		const char *m = f->metavar;

		for (int k = 1; m && *m; k++) {
			const size_t n = strcspn(m, "|");

			if (k == *(int *)f->ptr)
				snprintf(buf, len, "%.*s", (int)n, m);
			m += n + (m[n] == '|');
		}
		break;
	}
	default:
		break;
	}
}

void dps_flags_usage(FILE *out, const char *cmd, const char *synopsis,
		     const struct dps_flag *flags)
{
	const struct dps_flag *f;

	fprintf(out, "usage: dpshard %s %s\n\noptions:\n", cmd, synopsis);
	for (f = flags; f->type != DPS_FLAG_END; f++) {
		char left[64], def[128];

		if (f->metavar && f->short_name)
			snprintf(left, sizeof(left), "-%c, --%s %s", f->short_name, f->name,
				 f->metavar);
		else if (f->metavar)
			snprintf(left, sizeof(left), "--%s %s", f->name, f->metavar);
		else
			snprintf(left, sizeof(left), "--%s", f->name);
		flag_default(f, def, sizeof(def));
		if (def[0] && !strstr(f->help, "(default")) /* a help may say it better itself */
			fprintf(out, "  %-28s %s (default: %s)\n", left, f->help, def);
		else
			fprintf(out, "  %-28s %s\n", left, f->help);
	}
	fprintf(out, "  %-28s %s\n", "--config FILE",
		"read flags from FILE, one 'flag: value' per line (YAML; '#' comments); flags on "
		"the command line override it");
	fprintf(out, "  %-28s %s\n", "--help", "show this help and exit");
}

int dps_flags_int_list(const char *s, int *out, int cap, long lo, long hi)
{
	int n = 0;

	for (;;) {
		char *end;
		long v;

		while (*s == ' ' || *s == ',')
			s++;
		if (!*s)
			return n;
		v = strtol(s, &end, 10);
		if (end == s || v < lo || v > hi || n >= cap || (*end && *end != ',' && *end != ' '))
			return -1;
		out[n++] = (int)v;
		s = end;
	}
}

struct dps_flag dps_flag_quantization(int *choice)
{
	return (struct dps_flag){ "quantization", DPS_FLAG_CHOICE, choice, "int8",
				  "quantize the linear weights and the LM head at load: int8, blocks "
				  "of 32 with an F16 scale (34 bytes per 32 weights; MXFP4 experts "
				  "stay MXFP4 and multiply INT8 activations, at batch 1 about 3x "
				  "as fast as their exact f32 products); unset: as the checkpoint is "
				  "(dpshard quantize writes INT8 checkpoints)",
				  0, 0, 'q' };
}

struct dps_flag dps_flag_dtype(int *choice)
{
	return (struct dps_flag){ "dtype", DPS_FLAG_CHOICE, choice, "auto|f32|bf16",
				  "the linear weights in memory: auto (the checkpoint's: BF16 kept "
				  "as BF16, F16 as F16), f32 (widened, exact), bf16 (F32 and F16 "
				  "rounded to nearest even); BF16 and F16 are half the bytes, and one "
				  "rank too runs the sharded engine then", 0, 0, 0 };
}

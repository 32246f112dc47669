/* SPDX-License-Identifier: MIT */
/*
 * tools/models.c - where the command line finds its models: the default model (stories260K, beside
 * the binary or installed), mkmodel presets written to the user's cache on first use, and the
 * --dtype flag of convert and mkmodel. Called by generate, serve, bench and mkmodel.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/model/mkmodel.h"
#include "tools/cmd.h"

int dps_tool_parse_dtype(const char *cmd, const char *s, enum dps_st_dtype *dt)
{
	if (!strcmp(s, "f32"))
		*dt = DPS_ST_F32;
	else if (!strcmp(s, "bf16"))
		*dt = DPS_ST_BF16;
	else if (!strcmp(s, "f16"))
		*dt = DPS_ST_F16;
	else {
		fprintf(stderr, "dpshard %s: --dtype %s is not one of f32, bf16, f16\n", cmd, s);
		return -1;
	}
	return 0;
}


/*
 * A preset model with seed 0 (random weights, no tokenizer), written on first use to
 * $XDG_CACHE_HOME/dpshard/vN/PRESET-seed0 (or ~/.cache/dpshard/...; N is DPS_MKMODEL_FORMAT,
 * so a cache of an older layout is never read), so a generation or a
 * benchmark runs on a fresh machine with nothing downloaded.
 */
int dps_cached_preset(const char *preset, const char *who, char *dir, size_t len)
{
	const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
	const struct dps_mkmodel_preset *p = dps_mkmodel_preset(preset);
	char base[3900], cfg[4200], err[512];
	uint64_t t0;
	int rc;

	if (!p) {
		fprintf(stderr, "dpshard %s: no preset '%s' (dpshard mkmodel --list-presets shows them)\n", who,
			preset);
		return -EINVAL;
	}
	if (xdg && *xdg)
		snprintf(base, sizeof(base), "%s", xdg);
	else
		snprintf(base, sizeof(base), "%s/.cache", home && *home ? home : "/tmp");
	snprintf(dir, len, "%s/dpshard/v%d/%s-seed0", base, DPS_MKMODEL_FORMAT, preset);
	snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
	if (access(cfg, R_OK) == 0)
		return 0;
	snprintf(cfg, sizeof(cfg), "%s/dpshard", base);
	if ((mkdir(base, 0755) && errno != EEXIST) || (mkdir(cfg, 0755) && errno != EEXIST)) {
		fprintf(stderr, "dpshard %s: cannot create %s: %s\n", who, cfg, strerror(errno));
		return -errno;
	}
	snprintf(cfg, sizeof(cfg), "%s/dpshard/v%d", base, DPS_MKMODEL_FORMAT);
	if (mkdir(cfg, 0755) && errno != EEXIST) {
		fprintf(stderr, "dpshard %s: cannot create %s: %s\n", who, cfg, strerror(errno));
		return -errno;
	}
	fprintf(stderr, "dpshard %s: writing the '%s' model (%.1fM parameters, random weights, "
			"prompts as token ids) to %s ...\n", who, preset,
		(double)dps_model_config_params(&p->cfg) / 1e6, dir);
	t0 = dps_now_ns();
	rc = dps_mkmodel(&p->cfg, 0, DPS_ST_F32, dir, err, sizeof(err));
	if (rc)
		fprintf(stderr, "dpshard %s: %s\n", who, err);
	else
		fprintf(stderr, "dpshard %s: done in %.1f s\n", who,
			(double)(dps_now_ns() - t0) / 1e9);
	return rc;
}

/*
 * The default model, stories260K: the copy `make` converts into the build tree beside the
 * running binary (data/stories260K), else the one `make install` put into the package data
 * folder. A directory counts when it has a config.json.
 */
int dps_default_model(const char *who, char *dir, size_t len)
{
	char exe[4096], cfg[4300], *slash;
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	if (n > 0 && (size_t)n < sizeof(exe) - 1) {
		exe[n] = '\0';
		slash = strrchr(exe, '/');
		if (slash) {
			*slash = '\0';
			snprintf(cfg, sizeof(cfg), "%s/data/stories260K/config.json", exe);
			if (!access(cfg, R_OK) &&
			    (size_t)snprintf(dir, len, "%s/data/stories260K", exe) < len)
				return 0;
		}
	}
	snprintf(cfg, sizeof(cfg), "%s/stories260K/config.json", DPS_PKGDATADIR);
	if (!access(cfg, R_OK) && (size_t)snprintf(dir, len, "%s/stories260K", DPS_PKGDATADIR) < len)
		return 0;
	fprintf(stderr, "dpshard %s: no --model given, and the default model stories260K is neither "
			"in the build tree (data/stories260K beside the binary: run make) nor installed "
			"(%s/stories260K: run make install); give --model DIR, or make a random one with "
			"dpshard mkmodel --out DIR\n", who, DPS_PKGDATADIR);
	return -ENOENT;
}


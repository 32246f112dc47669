/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/window.c - how many rows a replica's forward pass takes at once, and the TP
 * groups' windows that this asks of the supervisor (engine.h). Called by the tools before
 * they start the ranks and by each replica as it loads.
 */
#include "engine/model/model_config.h"
#include "engine/serve/engine.h"
#include "engine/shard/shard.h"

int dps_engine_max_rows(const struct dps_engine_opts *o)
{
	const int batched = o->max_batched_tokens > 0 ? o->max_batched_tokens : 512;
	const int seqs = o->max_num_seqs > 0 ? o->max_num_seqs : 64;

	return batched + seqs * (1 + (o->spec_model ? o->spec_k : 0));
}

size_t dps_engine_window_bytes(const struct dps_engine_opts *o, const struct dps_par_cfg *par)
{
	struct dps_model_config cfg;
	char err[256];

	/* An unreadable model gets no window: the ranks report it as they load. */
	if (dps_model_config_load(o->model, &cfg, err, sizeof(err)))
		return 0;
	return dps_shard_window_bytes(&cfg, par, dps_engine_max_rows(o));
}

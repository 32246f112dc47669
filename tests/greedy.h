/* SPDX-License-Identifier: MIT */
/*
 * tests/greedy.h - the engine tests' oracle: a prompt's greedy tokens from the one-process
 * model (dps_model), the prompt fed whole, then one token at a time (ties to the lowest id).
 */
#ifndef DPS_TESTS_GREEDY_H
#define DPS_TESTS_GREEDY_H

#include <check.h>

#include "engine/model/model.h"

/* The n_out greedy tokens after prompt (n <= 16 ids) on the model in dir; 64 positions at most. */
static inline void test_greedy_oracle(const char *dir, const int *prompt, int n, int *out,
				      int n_out)
{
	struct dps_model m;
	int pos[16], seq[16] = { 0 }, tok;
	char err[256];
	const float *lg;

	ck_assert_int_le(n, 16);
	ck_assert_msg(!dps_model_load(&m, dir, &(struct dps_model_opts){ .max_pos = 64,
									 .max_rows = 16 },
				      err, sizeof(err)), "%s", err);
	for (int i = 0; i < n; i++)
		pos[i] = i;
	lg = dps_model_step(&m, n, prompt, pos, seq, NULL) + (size_t)(n - 1) * m.cfg.vocab_size;
	for (int g = 0; g < n_out; g++) {
		tok = 0;
		for (int v = 1; v < m.cfg.vocab_size; v++)
			if (lg[v] > lg[tok])
				tok = v;
		out[g] = tok;
		lg = dps_model_forward(&m, tok, n + g);
	}
	dps_model_free(&m);
}

#endif

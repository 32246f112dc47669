/* SPDX-License-Identifier: MIT */
/*
 * kernels/logits.c - the logits processors before sampling (see logits.h). A request that
 * uses them pays per step for the tokens it has seen; one that does not never gets here.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/logits.h"

static uint32_t slot_of(uint32_t id, uint32_t cap)
{
	return (id * 0x9E3779B1u) & (cap - 1); /* Fibonacci hashing; cap is a power of two */
}

static struct dps_seen_slot *probe(struct dps_seen_slot *slot, uint32_t cap, int id)
{
	uint32_t i = slot_of((uint32_t)id, cap);

	while (slot[i].id != id && slot[i].id >= 0)
		i = (i + 1) & (cap - 1);
	return &slot[i];
}

static int grow(struct dps_seen *s)
{
	const uint32_t cap = s->cap ? s->cap * 2 : 64;
	struct dps_seen_slot *slot;

	if (cap < s->cap)
		return -ENOMEM;
	slot = malloc(sizeof(*slot) * cap);
	if (!slot)
		return -ENOMEM;
	for (uint32_t i = 0; i < cap; i++)
		slot[i].id = -1;
	for (uint32_t i = 0; i < s->cap; i++)
		if (s->slot[i].id >= 0)
			*probe(slot, cap, s->slot[i].id) = s->slot[i];
	free(s->slot);
	s->slot = slot;
	s->cap = cap;
	return 0;
}

int dps_seen_add(struct dps_seen *s, int id, int output)
{
	struct dps_seen_slot *e;

	if (id < 0)
		return -EINVAL;
	if (2 * (s->n + 1) > s->cap && grow(s))
		return -ENOMEM;
	e = probe(s->slot, s->cap, id);
	if (e->id < 0) {
		e->id = id;
		e->out = 0;
		e->prompt = 0;
		s->n++;
	}
	if (output)
		e->out++;
	else
		e->prompt = 1;
	return 0;
}

const struct dps_seen_slot *dps_seen_find(const struct dps_seen *s, int id)
{
	const struct dps_seen_slot *e;

	if (!s->cap || id < 0)
		return NULL;
	e = probe(s->slot, s->cap, id);
	return e->id == id ? e : NULL;
}

void dps_seen_free(struct dps_seen *s)
{
	free(s->slot);
	s->slot = NULL;
	s->cap = s->n = 0;
}

void dps_logits_mask(float *logits, int n, const int *ids, int n_ids)
{
	for (int i = 0; i < n_ids; i++)
		if (ids[i] >= 0 && ids[i] < n)
			logits[ids[i]] = -INFINITY;
}

void dps_logits_bias(float *logits, int n, const struct dps_logit_bias *b, int n_bias)
{
	for (int i = 0; i < n_bias; i++)
		if (b[i].id >= 0 && b[i].id < n)
			logits[b[i].id] += b[i].bias;
}

void dps_logits_penalize(float *logits, int n, const struct dps_penalties *p,
			 const struct dps_seen *s)
{
	const int rep = p->repetition != 0.0f && p->repetition != 1.0f;

	/* vLLM: repetition (prompt or output), then frequency, then presence (output). */
	for (uint32_t i = 0; i < s->cap; i++) {
		const struct dps_seen_slot *e = &s->slot[i];
		float *l;

		if (e->id < 0 || e->id >= n)
			continue;
		l = &logits[e->id];
		if (rep)
			*l = *l > 0.0f ? *l / p->repetition : *l * p->repetition;
		if (e->out) {
			*l -= p->frequency * (float)e->out;
			*l -= p->presence;
		}
	}
}

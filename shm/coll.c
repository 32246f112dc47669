/* SPDX-License-Identifier: MIT */
/*
 * shm/coll.c - the collectives of coll.h. Called by every rank for every TP, DP, component
 * and column group: small all-reduces (a few KiB of activations per decode step) dominate, so
 * the fast path of a small all-reduce is: copy into our slot, publish, wait, sum.
 */
#include <string.h>

#include "common/dps.h"
#include "shm/coll.h"
#include "shm/coll_int.h"
#include "shm/copy.h"

struct comm_hdr {
	uint32_t n;
	uint32_t pad0;
	uint64_t slot_bytes;
	uint64_t window_bytes;
	char pad[DPS_CACHELINE - 24];
};

static size_t hdr_bytes(int n)
{
	/* header, bell, then one posted-step word per member */
	return sizeof(struct comm_hdr) + ((size_t)n + 1) * sizeof(struct dps_wword);
}

/* Offset of the windows in the area: after the header and the slots, on a page. */
static size_t windows_off(int n, size_t slot_bytes)
{
	return dps_align_up(dps_align_up(hdr_bytes(n), 4096) + (size_t)n * 2 * slot_bytes, 4096);
}

size_t dps_comm_shm_size(int n, size_t slot_bytes, size_t window_bytes)
{
	size_t slots, total, win;

	if (n <= 1)
		return 0;
	if (window_bytes % 4096 || dps_size_mul((size_t)n * 2, slot_bytes, &slots) ||
	    dps_size_add(dps_align_up(hdr_bytes(n), 4096), slots, &total) ||
	    dps_size_mul((size_t)n, window_bytes, &win) ||
	    dps_size_add(dps_align_up(total, 4096), win, &total))
		return 0;
	return total;
}

void dps_comm_shm_init(void *mem, int n, size_t slot_bytes, size_t window_bytes)
{
	struct comm_hdr *h = mem;

	if (n <= 1)
		return;
	memset(mem, 0, hdr_bytes(n));
	h->n = (uint32_t)n;
	h->slot_bytes = slot_bytes;
	h->window_bytes = window_bytes;
	/* Step flags must start below every step, also when the memory is reused. */
	for (size_t i = 0; i < (size_t)n * 2; i++)
		memset((char *)mem + dps_align_up(hdr_bytes(n), 4096) + i * slot_bytes, 0,
		       DPS_CACHELINE);
}

int dps_comm_base(struct dps_comm *c, int n, int me, const int *ranks,
		  const _Atomic uint32_t *abort_word)
{
	memset(c, 0, sizeof(*c));
	if (n < 1 || me < 0 || me >= n)
		return -EINVAL;
	c->n = n;
	c->me = me;
	c->ranks = ranks;
	c->abort_word = abort_word;
	c->oneshot_max = DPS_COLL_ONESHOT_DEFAULT;
	return 0;
}

int dps_comm_scratch(struct dps_comm *c)
{
	/* Scratch for the calls, allocated here so that no call can fail on one member only. */
	c->src = calloc((size_t)c->n, sizeof(*c->src));
	c->counts = calloc((size_t)c->n, sizeof(*c->counts));
	c->offs = calloc((size_t)c->n, sizeof(*c->offs));
	if (!c->src || !c->counts || !c->offs) {
		dps_comm_detach(c);
		return -ENOMEM;
	}
	return 0;
}

int dps_comm_attach(struct dps_comm *c, void *mem, int n, int me, const int *ranks,
		    size_t slot_bytes, const _Atomic uint32_t *abort_word)
{
	struct comm_hdr *h = mem;

	if (dps_comm_base(c, n, me, ranks, abort_word))
		return -EINVAL;
	c->slot_bytes = slot_bytes;
	if (n == 1)
		return 0;
	if (!mem || slot_bytes % DPS_CACHELINE ||
	    slot_bytes < (size_t)DPS_CACHELINE * ((size_t)n + 1) ||
	    h->n != (uint32_t)n || h->slot_bytes != slot_bytes)
		return -EINVAL;
	c->bell = (struct dps_wword *)(h + 1);
	c->post = c->bell + 1;
	if (dps_comm_scratch(c))
		return -ENOMEM;
	c->slots = (unsigned char *)mem + dps_align_up(hdr_bytes(n), 4096);
	c->window_bytes = h->window_bytes;
	if (c->window_bytes)
		c->windows = (unsigned char *)mem + windows_off(n, slot_bytes);
	return 0;
}

void dps_comm_detach(struct dps_comm *c)
{
	free(c->src);
	free(c->counts);
	free(c->offs);
	c->offs = NULL;
	c->src = NULL;
	c->counts = NULL;
}

const char *dps_coll_kind_name(enum dps_coll_kind k)
{
	static const char *const names[DPS_COLL_KINDS] = {
		"barrier", "broadcast", "all-gather", "all-reduce", "reduce-scatter", "all-to-all"
	};
	return k < DPS_COLL_KINDS ? names[k] : "?";
}

const char *dps_coll_algo_name(enum dps_coll_algo a)
{
	switch (a) {
	case DPS_ALGO_ONESHOT: return "one-shot";
	case DPS_ALGO_RSAG: return "rs+ag";
	case DPS_ALGO_NODES: return "nodes";
	default: return "auto";
	}
}

const char *dps_copy_mode_name(enum dps_copy_mode m)
{
	return m == DPS_COPY_CACHED ? "cached" : m == DPS_COPY_STREAM ? "stream" : "auto";
}

int dps_copy_mode_parse(const char *s, enum dps_copy_mode *out)
{
	for (int m = DPS_COPY_AUTO; m <= DPS_COPY_STREAM; m++)
		if (!strcmp(s, dps_copy_mode_name((enum dps_copy_mode)m))) {
			*out = (enum dps_copy_mode)m;
			return 0;
		}
	return -EINVAL;
}

/* ---- write mode ----------------------------------------------------------------------------
 *
 * On this project's 2-core virtual machine the two vCPUs sit, from one minute to the next,
 * either close together (a cache line passes in 16-35 ns) or far apart (160 ns).
 * A 1 MiB all-gather on 2 ranks took 43 us with ordinary stores and 71 us streamed in the
 * first state, 306 us and 91 us in the second (bench coll --method osu --copy, 2026-12-06).
 * So in AUTO each member times its own large calls (ns per KiB), keeps each mode's latest
 * DPS_PICK_SAMPLES and uses the mode whose median is lower (after PICK_FIRST calls in each
 * mode, in turn); it tries the other every PICK_EXPLORE-th call, so that a change of placement
 * is noticed (a trial's time replaces what was known of its mode, which may be stale). A
 * median, not an average: one slow call (a preempted peer, the host moving a vCPU for a
 * moment) must not send the next PICK_EXPLORE calls to the slower mode, as an average that
 * weighed the latest call a quarter did (2 ranks, 1 MiB all-gathers through the slots, osu
 * method, near placement: AUTO 45-82 us against 44-47 with cached stores forced). Each member
 * decides alone: modes need not agree, since they only change how bytes travel.
 */
#define PICK_EXPLORE 32
#define PICK_FIRST 3

/* The median of mode m's samples (0 with none). */
static float pick_est(const struct dps_copy_pick *p, int m)
{
	float v[DPS_PICK_SAMPLES], t;
	int n = p->n[m];

	memcpy(v, p->ns[m], sizeof(v));
	for (int i = 1; i < n; i++) /* insertion sort of at most five */
		for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
			t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return n ? (n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2])) : 0.0f;
}

uint64_t dps_coll_pick_begin(struct dps_comm *c, enum dps_coll_kind kind, size_t bytes)
{
	struct dps_copy_pick *p;
	int cls = 0, best;

	c->stream_now = 0;
	c->pick_now = NULL;
	if (bytes < DPS_COLL_STREAM_MIN || c->copy == DPS_COPY_CACHED)
		return 0;
	if (c->copy == DPS_COPY_STREAM) {
		c->stream_now = 1;
		return 0;
	}
	while (cls < 7 && bytes >= (size_t)DPS_COLL_STREAM_MIN << (cls + 1))
		cls++;
	p = &c->pick[kind][cls];
	if (++p->calls == 1) /* the first call of a class faults its pages in: not a sample */
		return 0;
	if (p->calls <= 1 + 2 * PICK_FIRST) { /* PICK_FIRST samples of each first, in turn */
		c->stream_now = (int)(p->calls & 1);
		c->pick_trial = 0;
	} else {
		best = pick_est(p, 1) < pick_est(p, 0);
		c->pick_trial = p->calls % PICK_EXPLORE == 0;
		c->stream_now = best ^ c->pick_trial;
	}
	c->pick_now = p;
	return dps_now_ns();
}

void dps_coll_pick_end(struct dps_comm *c, size_t bytes, uint64_t t0, int rc)
{
	struct dps_copy_pick *p = c->pick_now;
	const int m = c->stream_now;

	if (!p || rc)
		return;
	if (c->pick_trial) /* a trial stands alone: what was known of its mode may be stale */
		p->n[m] = p->at[m] = 0;
	p->ns[m][p->at[m]] = (float)((double)(dps_now_ns() - t0) * 1024.0 / (double)bytes);
	p->at[m] = (uint8_t)((p->at[m] + 1) % DPS_PICK_SAMPLES);
	if (p->n[m] < DPS_PICK_SAMPLES)
		p->n[m]++;
	c->pick_now = NULL;
}

/*
 * The wait of step_sync for a copying call, after step_publish; `first` says this is its
 * first step and its size is one at which a member could have called in place (coll.h's
 * limits, alike on every member). Then a member that did makes the call fail on every member,
 * the step complete and its slot read.
 */
static int step_wait_copying(struct dps_comm *c, unsigned k, uint64_t s, int first)
{
	int rc = wait_data(c, k, s);

	if (!rc)
		step_ring(c, s);
	if (!rc && first && dps_coll_peer_in_place(c, k, s)) {
		c->slot_last[k] = s;
		rc = -EINVAL;
	}
	return rc;
}

/* step_sync for a copying call (step_wait_copying). */
static int step_sync_copying(struct dps_comm *c, unsigned k, uint64_t s, int first)
{
	step_publish(c, k, s);
	return step_wait_copying(c, k, s, first);
}

/* ---- barrier and broadcast ---------------------------------------------------------------- */

int dps_coll_barrier(struct dps_comm *c)
{
	struct timer t = stat_begin(c, DPS_COLL_BARRIER);

	if (c->n == 1)
		return stat_end(c, t, 0, 0);
	if (c->x)
		return dps_xcoll_barrier(c);
	return stat_end(c, t, 0, sync_all(c));
}

int dps_coll_bcast(struct dps_comm *c, void *buf, size_t count, enum dps_dtype t, int root)
{
	struct timer tm = stat_begin(c, DPS_COLL_BCAST);
	const size_t esz = dps_dtype_size(t);
	size_t bytes, off;
	uint64_t pk;
	int rc = 0;

	if (root < 0 || root >= c->n || dps_size_mul(count, esz, &bytes))
		return -EINVAL;
	if (c->n == 1)
		return stat_end(c, tm, bytes, 0);
	if (c->x)
		return dps_xcoll_bcast(c, buf, bytes, root);
	pk = dps_coll_pick_begin(c, DPS_COLL_BCAST, c->me == root ? bytes : 0);
	for (off = 0; off < bytes; off += slot_cap(c)) {
		const size_t len = bytes - off < slot_cap(c) ? bytes - off : slot_cap(c);
		const uint64_t s = c->seq + 1;
		const int tiny = len <= TINY;
		unsigned k;

		rc = slot_acquire(c, &k);
		if (rc)
			break;
		if (c->me == root) {
			slot_write(c, slot_data(c, root, k, tiny), (char *)buf + off, len);
			step_publish(c, k, s);
			step_ring(c, s);
		} else {
			step_post(c, s);
			rc = wait_step(c, root, 1, k, s);
			if (rc)
				break;
			step_ring(c, s);
			memcpy((char *)buf + off, slot_data(c, root, k, tiny), len);
		}
		c->slot_last[k] = s;
	}
	dps_coll_pick_end(c, bytes, pk, rc);
	return stat_end(c, tm, bytes, rc);
}

/* ---- all-gather ------------------------------------------------------------------------------ */

int dps_coll_allgatherv(struct dps_comm *c, const void *send, void *recv, const size_t *counts,
			const size_t *displs, enum dps_dtype t)
{
	struct timer tm = stat_begin(c, DPS_COLL_ALLGATHER);
	const size_t esz = dps_dtype_size(t);
	size_t maxb = 0, total = 0, mine = 0, off, b;
	uint64_t pk;
	int i, rc = 0;

	for (i = 0; i < c->n; i++) {
		if (dps_size_mul(counts[i], esz, &b) || dps_size_add(total, b, &total))
			return -EINVAL;
		if (b > maxb)
			maxb = b;
	}
	if (c->n == 1) {
		memmove((char *)recv + (displs ? displs[0] * esz : 0), send, counts[0] * esz);
		return stat_end(c, tm, total, 0);
	}
	if (c->x)
		return dps_xcoll_allgatherv(c, send, recv, counts, displs, esz, total);
	if (total >= DPS_COLL_INPLACE_MIN && in_window(c, send, counts[c->me] * esz))
		return stat_end(c, tm, total, dps_coll_allgatherv_window(c, send, recv, counts,
									 displs, esz));
	if (total >= DPS_COLL_CMA_MIN && total < DPS_COLL_CMA_MAX && c->cma >= 0) {
		rc = dps_coll_allgatherv_cma(c, send, recv, counts, displs, esz);
		if (rc <= 0)
			return stat_end(c, tm, total, rc);
		rc = 0; /* the kernel refused: the slots, now and from now on */
	}
	for (i = 0; i < c->me; i++) /* where our own part goes */
		mine += counts[i] * esz;
	if (displs)
		mine = displs[c->me] * esz;
	pk = dps_coll_pick_begin(c, DPS_COLL_ALLGATHER, total);
	for (off = 0; off < maxb; off += slot_cap(c)) {
		const uint64_t s = c->seq + 1;
		const size_t cap = slot_cap(c);
		const int tiny = maxb - off <= TINY; /* every member decides alike */
		size_t pos = 0, len;
		unsigned k;

		rc = slot_acquire(c, &k);
		if (rc)
			break;
		b = counts[c->me] * esz;
		len = b > off ? (b - off < cap ? b - off : cap) : 0;
		if (len)
			slot_write(c, slot_data(c, c->me, k, tiny), (const char *)send + off, len);
		/* Published, then our own part copied from send while the peers may still be
		 * writing theirs (before the flag it would hold the flag back behind its
		 * stores): send is in our cache, the slot may not be, and send may be that very
		 * part of recv, as MPI_IN_PLACE callers pass it. */
		step_publish(c, k, s);
		if (len)
			memmove((char *)recv + mine + off, (const char *)send + off, len);
		rc = step_wait_copying(c, k, s, off == 0 && total >= DPS_COLL_INPLACE_MIN);
		if (rc)
			break;
		for (i = 0; i < c->n; i++) {
			const size_t bi = counts[i] * esz;
			const size_t dst = displs ? displs[i] * esz : pos;

			if (bi > off && i != c->me)
				memcpy((char *)recv + dst + off, slot_data(c, i, k, tiny),
				       bi - off < cap ? bi - off : cap);
			pos += bi;
		}
		c->slot_last[k] = s;
	}
	dps_coll_pick_end(c, total, pk, rc);
	return stat_end(c, tm, total, rc);
}

int dps_coll_allgather(struct dps_comm *c, const void *send, void *recv, size_t count,
		       enum dps_dtype t)
{
	size_t one = count;
	int i;

	if (c->n == 1)
		return dps_coll_allgatherv(c, send, recv, &one, NULL, t);
	for (i = 0; i < c->n; i++)
		c->counts[i] = count;
	return dps_coll_allgatherv(c, send, recv, c->counts, NULL, t);
}

/* ---- all-reduce -------------------------------------------------------------------------------- */

size_t dps_coll_oneshot_default(unsigned ranks, unsigned cpus)
{
	return ranks > (cpus ? cpus : 1) ? DPS_COLL_ONESHOT_OVERSUB : DPS_COLL_ONESHOT_DEFAULT;
}

enum dps_coll_algo dps_coll_allreduce_algo(const struct dps_comm *c, size_t bytes)
{
	if (c->x)
		return DPS_ALGO_NODES;
	if (c->algo != DPS_ALGO_AUTO)
		return c->algo;
	return bytes <= c->oneshot_max ? DPS_ALGO_ONESHOT : DPS_ALGO_RSAG;
}

int dps_coll_allreduce(struct dps_comm *c, const void *send, void *recv, size_t count,
		       enum dps_dtype t)
{
	struct timer tm = stat_begin(c, DPS_COLL_ALLREDUCE);
	const size_t esz = dps_dtype_size(t);
	const void **src = c->src;
	const size_t chunk = slot_cap(c) / esz;
	enum dps_coll_algo algo;
	size_t bytes, off;
	uint64_t pk;
	int i, rc = 0;

	if (dps_size_mul(count, esz, &bytes))
		return -EINVAL;
	if (c->n == 1) {
		if (recv != send)
			memmove(recv, send, bytes);
		return stat_end(c, tm, bytes, 0);
	}
	if (c->x)
		return dps_xcoll_allreduce(c, send, recv, count, t);
	algo = dps_coll_allreduce_algo(c, bytes);
	if (algo == DPS_ALGO_RSAG && bytes && in_window(c, send, bytes))
		return stat_end(c, tm, bytes, dps_coll_allreduce_window(c, send, recv, count, t));
	pk = dps_coll_pick_begin(c, DPS_COLL_ALLREDUCE, bytes);
	for (off = 0; off < count; off += chunk) {
		const size_t m = count - off < chunk ? count - off : chunk;
		const uint64_t s = c->seq + 1;
		const int tiny = m * esz <= TINY;
		unsigned k;

		rc = slot_acquire(c, &k);
		if (rc)
			break;
		if (algo == DPS_ALGO_ONESHOT) {
			slot_write(c, slot_data(c, c->me, k, tiny), (const char *)send + off * esz,
				   m * esz);
		} else {
			/* Peers read only their own parts of our slot: our part stays in send. */
			for (i = 0; i < c->n; i++) {
				size_t lo, len;

				if (i == c->me)
					continue;
				part_range(m, esz, c->n, i, &lo, &len);
				slot_write(c, slot_data(c, c->me, k, tiny) + lo * esz,
					   (const char *)send + (off + lo) * esz, len * esz);
			}
		}
		rc = step_sync_copying(c, k, s, off == 0 && algo == DPS_ALGO_RSAG);
		if (rc)
			break;
		if (algo == DPS_ALGO_ONESHOT) {
			/* our own part from send, not from our slot: reading back a line we have
			 * just written while a peer reads it waits for our stores to land (2 ranks
			 * in this VM's far state: 0.50 us against 0.34 for a 16-byte exchange) */
			for (i = 0; i < c->n; i++)
				src[i] = i == c->me ? (const char *)send + off * esz
						    : (const char *)slot_data(c, i, k, tiny);
			dps_reduce_sum(t, (char *)recv + off * esz, src, c->n, m);
			c->slot_last[k] = s;
			continue;
		}
		/*
		 * Reduce-scatter: sum our part of every member's contribution (ours from send)
		 * straight into recv (send == recv is fine: each block is read before it is
		 * written), then publish it in our own slot for the all-gather.
		 */
		size_t lo, len;
		char *mine_out;

		part_range(m, esz, c->n, c->me, &lo, &len);
		for (i = 0; i < c->n; i++)
			src[i] = i == c->me ? (const char *)send + (off + lo) * esz
					    : (const void *)(slot_data(c, i, k, tiny) + lo * esz);
		mine_out = (char *)recv + (off + lo) * esz;
		dps_reduce_sum(t, mine_out, src, c->n, len);
		slot_write(c, slot_data(c, c->me, k, tiny) + lo * esz, mine_out, len * esz);
		/* All-gather: every other member's reduced part. */
		rc = step_sync(c, k, s + 1);
		if (rc)
			break;
		for (i = 0; i < c->n; i++) {
			if (i == c->me)
				continue;
			part_range(m, esz, c->n, i, &lo, &len);
			memcpy((char *)recv + (off + lo) * esz, slot_data(c, i, k, tiny) + lo * esz,
			       len * esz);
		}
		c->slot_last[k] = s + 1;
	}
	dps_coll_pick_end(c, bytes, pk, rc);
	return stat_end(c, tm, bytes, rc);
}

/* ---- reduce-scatter ------------------------------------------------------------------------------ */

int dps_coll_reducescatterv(struct dps_comm *c, const void *send, void *recv, const size_t *counts,
			    enum dps_dtype t)
{
	struct timer tm = stat_begin(c, DPS_COLL_REDUCESCATTER);
	const size_t esz = dps_dtype_size(t);
	const void **src = c->src;
	size_t total = 0, maxc = 0, w, off, b;
	uint64_t pk;
	int i, q, rc = 0;

	for (q = 0; q < c->n; q++) {
		if (dps_size_mul(counts[q], esz, &b) || dps_size_add(total, b, &total))
			return -EINVAL;
		if (counts[q] > maxc)
			maxc = counts[q];
	}
	if (c->n == 1) {
		if (recv != send)
			memmove(recv, send, total);
		return stat_end(c, tm, total, 0);
	}
	if (c->x)
		return dps_xcoll_reducescatterv(c, send, recv, counts, t);
	if (total >= DPS_COLL_INPLACE_MIN && in_window(c, send, total))
		return stat_end(c, tm, total, dps_coll_reducescatterv_window(c, send, recv, counts, t));
	/* Window of w elements of every block per step, w a multiple of 64 bytes. */
	w = slot_cap(c) / ((size_t)c->n * DPS_CACHELINE) * (DPS_CACHELINE / esz);
	pk = dps_coll_pick_begin(c, DPS_COLL_REDUCESCATTER, total);
	for (off = 0; off < maxc; off += w) {
		const uint64_t s = c->seq + 1;
		size_t pos = 0, mine = 0, m;
		unsigned k;

		rc = slot_acquire(c, &k);
		if (rc)
			break;
		for (q = 0; q < c->n; q++) {
			if (q == c->me)
				mine = pos; /* our own block is read from send (see the all-reduce) */
			else if (counts[q] > off) {
				m = counts[q] - off < w ? counts[q] - off : w;
				slot_write(c, slot_data(c, c->me, k, 0) + (size_t)q * w * esz,
					   (const char *)send + (pos + off) * esz, m * esz);
			}
			pos += counts[q];
		}
		rc = step_sync_copying(c, k, s, off == 0 && total >= DPS_COLL_INPLACE_MIN);
		if (rc)
			break;
		if (counts[c->me] > off) {
			m = counts[c->me] - off < w ? counts[c->me] - off : w;
			for (i = 0; i < c->n; i++)
				src[i] = i == c->me ? (const char *)send + (mine + off) * esz
						    : (const char *)slot_data(c, i, k, 0) +
							      (size_t)c->me * w * esz;
			dps_reduce_sum(t, (char *)recv + off * esz, src, c->n, m);
		}
		c->slot_last[k] = s;
	}
	dps_coll_pick_end(c, total, pk, rc);
	return stat_end(c, tm, total, rc);
}

int dps_coll_reducescatter(struct dps_comm *c, const void *send, void *recv, size_t count,
			   enum dps_dtype t)
{
	size_t one = count;

	if (c->n == 1)
		return dps_coll_reducescatterv(c, send, recv, &one, t);
	for (int i = 0; i < c->n; i++)
		c->counts[i] = count;
	return dps_coll_reducescatterv(c, send, recv, c->counts, t);
}

/* ---- all-to-all-v -------------------------------------------------------------------------------- */

int dps_coll_alltoallv(struct dps_comm *c, const void *send, const size_t *scounts,
		       const size_t *sdispls, void *recv, const size_t *rcounts,
		       const size_t *rdispls, enum dps_dtype t)
{
	struct timer tm = stat_begin(c, DPS_COLL_ALLTOALL);
	const size_t esz = dps_dtype_size(t);
	const size_t hdr = dps_align_up((size_t)c->n * sizeof(uint64_t), DPS_CACHELINE);
	/* Counts above this are refused: n of them, in bytes, cannot overflow. */
	const size_t big = SIZE_MAX / 4 / esz / (size_t)c->n;
	size_t win, maxb = 0, off, moved = 0;
	int i, j, rc = 0, mismatch = 0, local_bad = 0, global_bad = 0;
	uint64_t step;

	if (c->n == 1) {
		if (scounts[0] != rcounts[0])
			return -EINVAL;
		memmove((char *)recv + (rdispls ? rdispls[0] * esz : 0),
			(const char *)send + (sdispls ? sdispls[0] * esz : 0), scounts[0] * esz);
		return stat_end(c, tm, scounts[0] * esz, 0);
	}
	if (c->x)
		return dps_xcoll_alltoallv(c, send, scounts, sdispls, recv, rcounts, rdispls, t);
	/*
	 * Bad counts must not make one member leave early: a member whose own counts are bad
	 * still takes part (its header shows its send counts to everyone) but copies nothing.
	 */
	for (j = 0; j < c->n; j++)
		if (scounts[j] > big || rcounts[j] > big)
			local_bad = 1;
	/* Per-pair window: 64-byte multiples when the slot allows, else element multiples. */
	win = (slot_cap(c) - hdr) / (size_t)c->n;
	win = win >= DPS_CACHELINE ? win / DPS_CACHELINE * DPS_CACHELINE : win / esz * esz;
	DPS_ASSERT(win >= esz);

	for (step = 0, off = 0;; step++, off += win) {
		const uint64_t s = c->seq + 1;
		const char *self = NULL;
		unsigned char *mine;
		size_t spos = 0, rpos;
		unsigned k;

		rc = slot_acquire(c, &k);
		if (rc)
			break;
		mine = slot_data(c, c->me, k, 0);
		if (step == 0)
			for (j = 0; j < c->n; j++)
				((uint64_t *)mine)[j] = scounts[j];
		for (j = 0; j < c->n && !local_bad; j++) {
			const size_t bj = scounts[j] * esz;
			const size_t src = sdispls ? sdispls[j] * esz : spos;

			if (j == c->me) /* our block to ourselves: read from send below */
				self = (const char *)send + src;
			else if (bj > off)
				memcpy(mine + hdr + (size_t)j * win, (const char *)send + src + off,
				       bj - off < win ? bj - off : win);
			spos += bj;
		}
		rc = step_sync(c, k, s);
		if (rc)
			break;
		if (step == 0) {
			/* Every member reads every header, so all agree on the number of steps. */
			for (i = 0; i < c->n; i++) {
				const uint64_t *h = (const uint64_t *)(void *)slot_data(c, i, k, 0);
				uint64_t hj;

				/* (our own header from scounts: it is what we wrote) */
				for (j = 0; j < c->n; j++) {
					hj = i == c->me ? (uint64_t)scounts[j] : h[j];
					if (hj > big)
						global_bad = 1;
					else if (hj * esz > maxb)
						maxb = hj * esz;
				}
				hj = i == c->me ? (uint64_t)scounts[i] : h[c->me];
				if (hj != rcounts[i])
					mismatch = 1;
				/* Never copy more than was sent or than the caller has room for. */
				c->counts[i] = hj < rcounts[i] ? hj : rcounts[i];
			}
			if (global_bad) {
				/* Every member read the same headers: all stop here together. */
				c->slot_last[k] = s;
				rc = -EINVAL;
				break;
			}
		}
		for (i = 0, rpos = 0; i < c->n && !local_bad; i++) {
			const size_t bi = c->counts[i] * esz;
			const size_t dst = rdispls ? rdispls[i] * esz : rpos;

			if (bi > off) {
				const size_t len = bi - off < win ? bi - off : win;

				/* (memmove: our own block may lie where it goes) */
				memmove((char *)recv + dst + off,
					i == c->me ? self + off
						   : (const char *)slot_data(c, i, k, 0) + hdr +
							     (size_t)c->me * win,
					len);
				moved += len;
			}
			rpos += rcounts[i] * esz;
		}
		c->slot_last[k] = s;
		if (off + win >= maxb)
			break;
	}
	if (!rc && (mismatch || local_bad))
		rc = -EINVAL;
	return stat_end(c, tm, moved, rc);
}

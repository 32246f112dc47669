/* SPDX-License-Identifier: MIT */
/*
 * shm/ring.c - the single-writer ring of ring.h. Message traffic between supervisor and ranks
 * is a few messages per decode step, so clarity wins over the last nanosecond here.
 */
#include <string.h>
#include <unistd.h>

#include "common/dps.h"
#include "shm/ring.h"

#define HDR 8 /* per-slot length word */

size_t dps_ring_shm_size(unsigned n_slots, unsigned n_readers, size_t slot_bytes)
{
	size_t stride, slots, total;

	stride = dps_align_up(slot_bytes + HDR, DPS_CACHELINE);
	if (stride < slot_bytes || dps_size_mul(stride, n_slots, &slots))
		return 0;
	total = sizeof(struct dps_ring_shm) + (size_t)n_readers * sizeof(struct dps_wword);
	if (dps_size_add(total, slots, &total))
		return 0;
	return total;
}

int dps_ring_init(void *mem, unsigned n_slots, unsigned n_readers, size_t slot_bytes)
{
	struct dps_ring_shm *sh = mem;

	if (n_slots < 1 || n_readers < 1 || n_readers > DPS_RING_MAX_READERS || slot_bytes < 1)
		return -EINVAL;
	memset(sh, 0, sizeof(*sh) + n_readers * sizeof(struct dps_wword));
	sh->n_slots = n_slots;
	sh->n_readers = n_readers;
	sh->slot_bytes = slot_bytes;
	return 0;
}

void dps_ring_attach(struct dps_ring *r, void *mem, const _Atomic uint32_t *abort_word,
		     int notify_fd)
{
	r->sh = mem;
	r->tail = (struct dps_wword *)(r->sh + 1);
	r->slots = (unsigned char *)(r->tail + r->sh->n_readers);
	r->stride = dps_align_up(r->sh->slot_bytes + HDR, DPS_CACHELINE);
	r->abort_word = abort_word;
	r->notify_fd = notify_fd;
	r->head_cache = 0;
}

int dps_ring_push(struct dps_ring *r, const void *msg, size_t len, uint64_t timeout_ns)
{
	struct dps_ring_shm *sh = r->sh;
	uint64_t seq = atomic_load_explicit(&sh->head.val, memory_order_relaxed);
	unsigned char *slot;
	unsigned i;
	int rc;

	if (len > sh->slot_bytes)
		return -EMSGSIZE;
	/* Slot seq % n is free once every reader released message seq - n. */
	if (seq >= sh->n_slots) {
		/* One deadline for the whole push, however many readers we wait for. */
		const uint64_t deadline = timeout_ns ? dps_now_ns() + timeout_ns : 0;

		for (i = 0; i < sh->n_readers; i++) {
			uint64_t left = 0; /* 0 = no timeout */

			if (deadline) {
				const uint64_t now = dps_now_ns();

				left = now < deadline ? deadline - now : 1;
			}
			rc = dps_wword_wait(&r->tail[i], seq - sh->n_slots + 1, r->abort_word,
					    left, NULL);
			if (rc)
				return rc;
		}
	}
	slot = r->slots + (size_t)(seq % sh->n_slots) * r->stride;
	memcpy(slot, &(uint64_t){ len }, HDR);
	memcpy(slot + HDR, msg, len);
	/* Release: the payload above is visible to a reader that sees head > seq. */
	dps_wword_publish(&sh->head, seq + 1);
	if (r->notify_fd >= 0) {
		uint64_t one = 1;

		if (write(r->notify_fd, &one, sizeof(one)) < 0) {
			/* eventfd counter saturated: the reader is already due to wake */
		}
	}
	return 0;
}

static int ring_take(struct dps_ring *r, unsigned reader, uint64_t seq, void *buf, size_t cap,
		     size_t *len)
{
	const unsigned char *slot = r->slots + (size_t)(seq % r->sh->n_slots) * r->stride;
	uint64_t l;
	int rc = 0;

	memcpy(&l, slot, HDR);
	if (l > r->sh->slot_bytes)
		rc = -DPS_EPROTO;
	else if (l > cap)
		rc = -EMSGSIZE;
	else
		memcpy(buf, slot + HDR, l);
	*len = (size_t)l;
	/* Release the slot: our reads above happen before the writer may reuse it. */
	dps_wword_publish(&r->tail[reader], seq + 1);
	return rc;
}

int dps_ring_pop(struct dps_ring *r, unsigned reader, void *buf, size_t cap, size_t *len,
		 uint64_t timeout_ns)
{
	uint64_t seq;
	int rc;

	if (reader >= r->sh->n_readers)
		return -EINVAL;
	seq = atomic_load_explicit(&r->tail[reader].val, memory_order_relaxed);
	rc = dps_wword_wait(&r->sh->head, seq + 1, r->abort_word, timeout_ns, NULL);
	if (rc)
		return rc;
	return ring_take(r, reader, seq, buf, cap, len);
}

int dps_ring_trypop(struct dps_ring *r, unsigned reader, void *buf, size_t cap, size_t *len)
{
	uint64_t seq, head;

	if (reader >= r->sh->n_readers)
		return -EINVAL;
	seq = atomic_load_explicit(&r->tail[reader].val, memory_order_relaxed);
	head = atomic_load_explicit(&r->sh->head.val, memory_order_acquire);
	if (head <= seq)
		return -EAGAIN;
	return ring_take(r, reader, seq, buf, cap, len);
}

uint64_t dps_ring_pending(const struct dps_ring *r, unsigned reader)
{
	return atomic_load_explicit(&r->sh->head.val, memory_order_acquire) -
	       atomic_load_explicit(&r->tail[reader].val, memory_order_acquire);
}

/* SPDX-License-Identifier: MIT */
/*
 * shm/ring.h - single-writer message rings in shared memory.
 *
 * One process writes, up to DPS_RING_MAX_READERS processes read every message. Sequence
 * numbers are 64-bit and only grow: head counts messages published, tail[i] counts messages
 * reader i has released. Message k lives in slot k % n_slots; the writer reuses a slot only
 * after every reader has released it (min tail > k - n_slots). Control words sit on their own
 * cache lines. Used for supervisor <-> rank traffic (commands, requests, tokens, results);
 * the collectives use their own two-slot channels built on the same waiting (coll.h).
 *
 * Optionally the writer also signals an eventfd after each message, so that a reader that
 * sleeps in poll()/io_uring (the supervisor) can wait on many rings and on process fds at once.
 */
#ifndef DPS_SHM_RING_H
#define DPS_SHM_RING_H

#include <stddef.h>
#include <stdint.h>

#include "shm/wait.h"

#define DPS_RING_MAX_READERS 64

struct dps_ring_shm {
	struct dps_wword head;   /* messages published */
	uint32_t n_slots, n_readers;
	uint64_t slot_bytes;     /* payload capacity of one slot */
	char pad[DPS_CACHELINE - 16];
	/* struct dps_wword tail[n_readers]; then n_slots x (uint64 length + payload) */
};

struct dps_ring {
	struct dps_ring_shm *sh;
	struct dps_wword *tail;  /* (n_readers) */
	unsigned char *slots;    /* (n_slots, 8 + slot_bytes) */
	size_t stride;
	const _Atomic uint32_t *abort_word;
	int notify_fd;           /* eventfd written after each push, or -1 */
	uint64_t head_cache;     /* writer: next sequence; reader: messages known available */
};

/* Bytes of shared memory a ring needs. Returns 0 on overflow. */
size_t dps_ring_shm_size(unsigned n_slots, unsigned n_readers, size_t slot_bytes);

/* Initialises a ring in zeroed shared memory mem (64-byte aligned). Returns 0 or -EINVAL. */
int dps_ring_init(void *mem, unsigned n_slots, unsigned n_readers, size_t slot_bytes);

/* Binds a process-local handle to an initialised ring. notify_fd may be -1. */
void dps_ring_attach(struct dps_ring *r, void *mem, const _Atomic uint32_t *abort_word,
		     int notify_fd);

/*
 * Writer: copies len bytes (<= slot_bytes) into the next slot and publishes it, waiting for a
 * free slot up to timeout_ns (0 = forever). Returns 0, -EMSGSIZE, -ETIMEDOUT or -DPS_EABORT.
 */
int dps_ring_push(struct dps_ring *r, const void *msg, size_t len, uint64_t timeout_ns);

/*
 * Reader `reader`: waits up to timeout_ns (0 = forever) for the next message, copies it into
 * buf (cap bytes), stores its length and releases the slot. A message longer than cap is
 * dropped and -EMSGSIZE returned (with *len set to its size). Returns 0, -ETIMEDOUT, -EMSGSIZE
 * or -DPS_EABORT.
 */
int dps_ring_pop(struct dps_ring *r, unsigned reader, void *buf, size_t cap, size_t *len,
		 uint64_t timeout_ns);

/* Non-blocking pop: returns -EAGAIN when no message is waiting. */
int dps_ring_trypop(struct dps_ring *r, unsigned reader, void *buf, size_t cap, size_t *len);

/* Messages published and not yet released by reader. */
uint64_t dps_ring_pending(const struct dps_ring *r, unsigned reader);

#endif

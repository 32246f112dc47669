/* SPDX-License-Identifier: MIT */
/*
 * engine/shard/kv.h - the paged KV cache of a rank, in one module: its layout (K and V of every
 * layer in blocks of block_size positions, each position the rank's KV heads x head_dim
 * floats), its budget (how many blocks a byte budget buys, and the share of the free memory
 * that budget is), and its blocks (the free list a replica's scheduler hands out and takes
 * back). The shard (load.c, attn.c) holds the memory and reads it; the serving engine
 * (engine/serve/) sizes it and owns the blocks. vLLM's PAD_SLOT_ID is DPS_PAD_SLOT (shard.h).
 *
 * Layout: float key[layers][num_blocks][block_size][width], value likewise; slot
 * b * block_size + i is position i of block b.
 */
#ifndef DPS_ENGINE_SHARD_KV_H
#define DPS_ENGINE_SHARD_KV_H

#include <stddef.h>
#include <stdint.h>

/* Offset, in floats, of slot `slot` of layer `layer` in a cache of num_blocks blocks. */
static inline size_t dps_kv_offset(int layer, int num_blocks, int block_size, int slot,
				   size_t width)
{
	return ((size_t)layer * (size_t)num_blocks * (size_t)block_size + (size_t)slot) * width;
}

/* The slot of position pos of a sequence whose block table is blocks. */
static inline int dps_kv_slot(const int *blocks, int block_size, int pos)
{
	return blocks[pos / block_size] * block_size + pos % block_size;
}

/* Bytes of one block across the layers, K and V. */
static inline size_t dps_kv_block_bytes(int layers, int block_size, size_t width)
{
	return 2 * (size_t)layers * (size_t)block_size * width * sizeof(float);
}

/*
 * The blocks a budget of `budget` bytes buys (at most max_blocks; 0: no limit) into *blocks.
 * Returns 0, or -EINVAL with a message when they are fewer than `need` (the blocks of one
 * sequence of need_pos positions).
 */
int dps_kv_blocks_for(size_t budget, size_t block_bytes, int block_size, int max_blocks, int need,
		      int need_pos, int *blocks, char *err, size_t errlen);

/*
 * The KV budget of one rank: kv_cache_memory when given, else `fraction` (0: 0.5) of the
 * machine's available memory (MemAvailable) shared by `ranks` ranks.
 */
size_t dps_kv_budget(size_t kv_cache_memory, double fraction, int ranks);

/*
 * The target's part of a budget shared with an Eagle3 draft whose one layer keeps its KV in
 * the same blocks: in proportion to the floats each keeps per position (target_width over
 * all its layers, draft_width for its one).
 */
size_t dps_kv_budget_share(size_t budget, size_t target_width, size_t draft_width);

/* Anonymous memory for a cache of bytes, untouched (so free) until written; huge pages. NULL
 * when it cannot be mapped. */
float *dps_kv_alloc(size_t bytes);
void dps_kv_free(float *p, size_t bytes);

/*
 * Which KV heads a rank's cache holds. The query heads are padded to a multiple of tp * ca
 * (tp: the TP size; ca: the attention component size, 1 on a prefill rank) and TP position t
 * takes heads_p / tp of them in order; its cache holds the KV heads those query heads read
 * (head h reads KV head h / (heads / kvh)), each once, in the order first read, or KV head 0
 * alone when every one of them is padding. Writes them into out (room for heads_p / tp + 1)
 * and returns how many. Both K/V variants of the decode graph keep this order.
 */
int dps_kv_heads_of(int heads, int kvh, int tp, int ca, int t, int *out);

/*
 * The disaggregated hand-off (docs/DESIGN.md, "Disaggregated prefill and decode"): how decode
 * TP position t (of tp, attention component size ca) fills its cache from the caches of a
 * prefill replica of ptp ranks. One entry per head of its cache, in its order: the prefill TP
 * position that holds that KV head and where in its cache (the first such position, when
 * several do). Returns the entries written (room for heads_p / tp + 1), or -EINVAL for a
 * geometry dps_kv_heads_of refuses.
 */
struct dps_kv_relay {
	int src_rank;  /* prefill TP position */
	int src_head;  /* the head's index in that rank's cache */
	int head;      /* the KV head (global id) */
};

int dps_kv_relay_plan(int heads, int kvh, int ptp, int tp, int ca, int t,
		      struct dps_kv_relay *out);

/*
 * A prefill rank's cache where the decode ranks read it (dps_sup_opts.kv_share_bytes): this
 * header, written once the cache is laid out, then keys at key_off and values at value_off
 * (bytes from the header), each in dps_kv_offset's layout.
 */
#define DPS_KV_SHARE_MAGIC 0x4853564bu /* "KVSH" */

struct dps_kv_share_hdr {
	uint32_t magic, layers, num_blocks, block_size, width, pad;
	uint64_t key_off, value_off;
	uint64_t draft_off;  /* a target's: where its Eagle3 draft's header is (0: none) */
};

/* The free blocks of a replica: a stack, block 0 handed out first. */
struct dps_kv_pool {
	int *free;   /* (num_blocks) */
	int n_free, num_blocks;
};

/* 0 or -ENOMEM. */
int dps_kv_pool_init(struct dps_kv_pool *p, int num_blocks);
void dps_kv_pool_free(struct dps_kv_pool *p);

/* A free block, or -1 when none is. */
static inline int dps_kv_pool_take(struct dps_kv_pool *p)
{
	return p->n_free ? p->free[--p->n_free] : -1;
}

/* Gives block b back (it must have been taken). */
static inline void dps_kv_pool_give(struct dps_kv_pool *p, int b)
{
	p->free[p->n_free++] = b;
}

#endif

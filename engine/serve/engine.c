/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/engine.c - the serving engine: the replica loop on the ranks and the client in the
 * supervisor (see engine.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/serve/engine.h"
#include "engine/shard/kv.h"
#include "engine/shard/shard.h"
#include "engine/runtime/supervisor.h"
#include "kernels/gemm.h"

/* ---- messages ----------------------------------------------------------------------------- */

enum { M_REQ = 1, M_REQ_MORE, M_CANCEL, M_WAKE, M_STOP, M_TOKENS, M_DONE, M_STATS, M_READY };

#define MSG_BYTES 4096 /* the rings' slot size (engine/runtime/world.c) */

struct m_hdr {
	uint32_t type, count;
	int64_t id;
};

struct m_req {
	struct m_hdr h;        /* count: ids in this message */
	struct dps_req_params p;
	int32_t n_prompt;
	int32_t ids[];
};

struct m_more {
	struct m_hdr h;        /* count: ids in this message */
	int32_t ids[];
};

struct m_tok {
	int64_t id;
	int32_t token, pad;
};

struct m_tokens {
	struct m_hdr h;        /* count: tokens */
	struct m_tok t[];
};

struct m_done {
	struct m_hdr h;
	int32_t finish, n_gen;
};

struct m_stats {
	struct m_hdr h;        /* count: 1 for the final stats */
	int32_t replica, pad;
	struct dps_engine_stats st;
};

_Static_assert(sizeof(struct m_stats) <= MSG_BYTES, "stats fit one ring slot");

#define REQ_IDS ((MSG_BYTES - sizeof(struct m_req)) / sizeof(int32_t))
#define MORE_IDS ((MSG_BYTES - sizeof(struct m_more)) / sizeof(int32_t))
#define TOKS ((MSG_BYTES - sizeof(struct m_tokens)) / sizeof(struct m_tok))

/* ---- the replica (ranks) -------------------------------------------------------------------- */

struct pending { /* a request whose prompt is still arriving */
	int64_t id;
	struct dps_req_params p;
	int *ids, n, have;
};

struct replica {
	struct dps_world *w;
	const struct dps_engine_opts *o;
	struct dps_shard m;
	struct dps_sched s;          /* TP rank 0 only */
	int tp0, coupled, stop, bpr; /* bpr: block-table columns (ceil(max_model_len / bs)) */
	int zero_table;              /* index of the all-zero table of padding rows */
	unsigned took;               /* messages taken since the last agreement */
	struct pending pend;
	struct dps_engine_stats st;
	/* this step's rows, as every rank of the replica holds them */
	int *tokens, *pos, *slot, *tix, *tables;
	unsigned char *want;
	const int **table;
	int rows_cap;
	struct m_tokens *out;        /* tokens to send */
	unsigned char *wire;         /* a published batch */
	size_t wire_cap;
	int *scratch;
	/* Speculative decoding (spec_k > 0): the draft, its catch-up rows as every rank holds
	 * them, and the proposals of the requests it drafts for. */
	struct dps_shard dm;
	int spec_k;
	int n_cu, n_prop;
	int *cu_tok, *cu_pos, *cu_slot, *cu_tix, *cu_src, *cu_tables;
	unsigned char *cu_want;
	const int **cu_table;
	int *p_pos, *p_tix, *p_tok;  /* per proposing request: last row's position, table, drafts */
	struct dps_req **p_req;      /* TP rank 0: whose */
	float *hin, *hprev, *hout;
	int *d_tok, *d_pos, *d_slot; /* a recurrent pass's rows */
	const int **d_table;
};

static int send_up(struct replica *R, const void *msg, size_t len)
{
	return dps_ring_push(&R->w->to_sup, msg, len, 0);
}

static int flush_tokens(struct replica *R)
{
	int rc = 0;

	if (R->out->h.count) {
		R->out->h.type = M_TOKENS;
		rc = send_up(R, R->out, sizeof(*R->out) + R->out->h.count * sizeof(struct m_tok));
		R->out->h.count = 0;
	}
	return rc;
}

static void on_emit(void *arg, struct dps_req *r, int token)
{
	struct replica *R = arg;

	if (R->out->h.count == TOKS)
		flush_tokens(R);
	R->out->t[R->out->h.count].id = (int64_t)r->id;
	R->out->t[R->out->h.count].token = token;
	R->out->h.count++;
}

static void on_done(void *arg, struct dps_req *r)
{
	struct replica *R = arg;
	struct m_done d = { { M_DONE, 0, (int64_t)r->id }, (int32_t)r->finish,
			    r->n_ids - r->n_prompt };

	flush_tokens(R);
	send_up(R, &d, sizeof(d));
}

static struct dps_req *find_req(struct dps_sched *s, int64_t id)
{
	for (int i = 0; i < s->n_running; i++)
		if ((int64_t)s->running[i]->id == id)
			return s->running[i];
	for (int i = 0; i < s->n_waiting; i++)
		if ((int64_t)s->waiting[i]->id == id)
			return s->waiting[i];
	return NULL;
}

static void reject(struct replica *R, int64_t id)
{
	struct m_done d = { { M_DONE, 0, id }, DPS_FINISH_ERROR, 0 };

	send_up(R, &d, sizeof(d));
}

/* Takes one message from the client (TP rank 0). */
static void take(struct replica *R, const void *buf, size_t len)
{
	struct m_hdr h;
	int rc;

	if (len < sizeof(h))
		return;
	memcpy(&h, buf, sizeof(h));
	R->took++;
	switch (h.type) {
	case M_REQ: {
		const struct m_req *m = buf;

		if (R->pend.ids) /* a request left unfinished: it ends in error, not in silence */
			reject(R, R->pend.id);
		free(R->pend.ids);
		memset(&R->pend, 0, sizeof(R->pend));
		if (len < sizeof(*m) || m->n_prompt < 1 || h.count > REQ_IDS ||
		    (int)h.count > m->n_prompt || len < sizeof(*m) + h.count * sizeof(int32_t)) {
			reject(R, h.id);
			return;
		}
		R->pend.ids = malloc(sizeof(int) * (size_t)m->n_prompt);
		if (!R->pend.ids) {
			reject(R, h.id);
			return;
		}
		R->pend.id = h.id;
		R->pend.p = m->p;
		/* The client's timeout counts from the request's arrival here. */
		if (R->pend.p.deadline_ns)
			R->pend.p.deadline_ns += dps_now_ns();
		R->pend.n = m->n_prompt;
		memcpy(R->pend.ids, m->ids, sizeof(int) * h.count);
		R->pend.have = (int)h.count;
		break;
	}
	case M_REQ_MORE: {
		const struct m_more *m = buf;

		if (!R->pend.ids || h.id != R->pend.id || h.count > MORE_IDS ||
		    R->pend.have + (int)h.count > R->pend.n ||
		    len < sizeof(*m) + h.count * sizeof(int32_t)) {
			reject(R, h.id);
			return;
		}
		memcpy(R->pend.ids + R->pend.have, m->ids, sizeof(int) * h.count);
		R->pend.have += (int)h.count;
		break;
	}
	case M_CANCEL: {
		struct dps_req *r = find_req(&R->s, h.id);

		if (r)
			dps_sched_cancel(&R->s, r);
		return;
	}
	case M_STOP:
		R->stop = 1;
		return;
	default: /* M_WAKE: nothing to do but run the loop */
		return;
	}
	if (R->pend.ids && R->pend.have == R->pend.n) {
		int bad = 0;

		for (int i = 0; i < R->pend.n; i++)
			bad |= R->pend.ids[i] < 0 || R->pend.ids[i] >= R->m.cfg.vocab_size;
		if (bad || !dps_sched_add(&R->s, (uint64_t)R->pend.id, R->pend.ids, R->pend.n,
					  &R->pend.p, &rc))
			reject(R, R->pend.id);
		free(R->pend.ids);
		memset(&R->pend, 0, sizeof(R->pend));
	}
}

/* The replica's counts now, for the client (rank 0 of the replica). */
static void fill_stats(struct replica *R, struct m_stats *m, int final)
{
	struct dps_world *w = R->w;
	const struct dps_layout *lay = w->lay;
	unsigned char seen[64] = { 0 };

	memset(m, 0, sizeof(*m));
	m->h.type = M_STATS;
	m->h.count = (uint32_t)final;
	m->replica = w->dp_rank;
	m->st = R->st;
	m->st.preemptions = R->s.preemptions;
	m->st.free_blocks = (uint64_t)R->s.kv.n_free;
	m->st.running = (uint64_t)R->s.n_running;
	m->st.waiting = (uint64_t)R->s.n_waiting;
	m->st.expert_bytes = R->m.moe_bytes;
	m->st.spec_k = R->spec_k;
	m->st.spec_drafts = R->s.spec.drafts;
	m->st.spec_draft_tokens = R->s.spec.draft_tokens;
	m->st.spec_accepted = R->s.spec.accepted;
	memcpy(m->st.spec_accepted_pos, R->s.spec.accepted_pos, sizeof(m->st.spec_accepted_pos));
	for (int k = 0; k < DPS_COLL_KINDS; k++)
		for (int g = 0; g < DPS_SG_COUNT; g++)
			m->st.collectives += R->m.stats.calls[k][g] +
					     (R->spec_k ? R->dm.stats.calls[k][g] : 0);
	/* Each communicator of this rank once, named by the first group set that makes it. */
	for (int si = 0; si < lay->n_sets && m->st.n_groups < DPS_ENGINE_GROUPS; si++) {
		const struct dps_groupset *gs = lay->sets[si];
		const int ci = lay->set_comm[si][gs->group_of[w->rank]];
		uint64_t ns = 0;

		if (ci < 0 || ci >= lay->n_comms || w->comms[ci].n < 2 || (ci < 64 && seen[ci]))
			continue;
		if (ci < 64)
			seen[ci] = 1;
		for (int k = 0; k < DPS_COLL_KINDS; k++)
			ns += w->comms[ci].stats.ns[k];
		dps_groupset_name(gs, m->st.group[m->st.n_groups], sizeof(m->st.group[0]));
		m->st.group_ns[m->st.n_groups++] = ns;
	}
}

/* Drains the ring; waits up to wait_ns for the first message when asked to (0: no wait). */
static int poll_client(struct replica *R, uint64_t wait_ns)
{
	unsigned char buf[MSG_BYTES];
	size_t len;
	int rc;

	if (wait_ns) {
		rc = dps_ring_pop(&R->w->from_sup, 0, buf, sizeof(buf), &len, wait_ns);
		if (rc == -ETIMEDOUT)
			return 0;
		if (rc)
			return rc;
		take(R, buf, len);
	}
	while ((rc = dps_ring_trypop(&R->w->from_sup, 0, buf, sizeof(buf), &len)) != -EAGAIN) {
		if (rc)
			return rc;
		take(R, buf, len);
	}
	return 0;
}

/*
 * Header of a step, published by TP rank 0: command (0 run, 1 idle, 2 stop), rows, real rows,
 * prefill, distinct block tables, unfinished requests.
 */
enum { H_CMD, H_ROWS, H_REAL, H_PREFILL, H_TABLES, H_UNFINISHED, H_LEN };

/* Request r's block table as row nt of tables (bpr columns, zero past its blocks). */
static void put_table(const struct replica *R, int *tables, int nt, const struct dps_req *r)
{
	int *row = tables + (size_t)nt * (size_t)R->bpr;

	memset(row, 0, sizeof(int) * (size_t)R->bpr);
	memcpy(row, r->blocks, sizeof(int) * (size_t)r->n_blocks);
}

/* TP rank 0: the scheduler's batch into the replica's row arrays; fills hdr. */
static void pack(struct replica *R, int *hdr)
{
	const struct dps_batch *b = &R->s.b;
	int nt = 0;

	hdr[H_ROWS] = b->n;
	hdr[H_REAL] = b->n_real;
	hdr[H_PREFILL] = b->prefill;
	for (int i = 0; i < b->n; i++) {
		R->tokens[i] = b->tokens[i];
		R->pos[i] = b->pos[i];
		R->slot[i] = b->slot[i];
		R->want[i] = b->want[i];
		R->tix[i] = R->zero_table;
		if (!b->table[i])
			continue;
		/* A request's rows are consecutive: one table each. */
		if (i && b->table[i] == b->table[i - 1]) {
			R->tix[i] = R->tix[i - 1];
			continue;
		}
		put_table(R, R->tables, nt, b->req[i]);
		R->tix[i] = nt++;
	}
	hdr[H_TABLES] = nt;
}

/* Pads this replica's rows to n with rows that write nothing and are never sampled. */
static void pad_rows(struct replica *R, int from, int n)
{
	for (int i = from; i < n; i++) {
		R->tokens[i] = 0;
		R->pos[i] = 0;
		R->slot[i] = DPS_PAD_SLOT;
		R->want[i] = 0;
		/* A block table of max_model_len / block_size columns, all block 0: a padding row
		 * reads like a real row at position 0 and writes nothing. */
		R->tix[i] = R->zero_table;
	}
}

/* TP rank 0: sends the first total bytes of R->wire (its length first) to the replica's peers. */
static int wire_push(struct replica *R, size_t total)
{
	const uint32_t t = (uint32_t)total;
	int rc = 0;

	memcpy(R->wire, &t, sizeof(t));
	for (size_t at = 0; at < total && !rc; at += MSG_BYTES)
		rc = dps_ring_push(&R->w->replica, R->wire + at,
				   total - at < MSG_BYTES ? total - at : MSG_BYTES, 0);
	return rc;
}

/* A peer: receives what wire_push sent into R->wire (at least min bytes); its length in *total. */
static int wire_pop(struct replica *R, size_t min, uint32_t *total)
{
	const unsigned me = (unsigned)R->w->tp_rank - 1;
	size_t len;
	int rc = dps_ring_pop(&R->w->replica, me, R->wire, MSG_BYTES, &len, 0);

	if (rc)
		return rc;
	memcpy(total, R->wire, sizeof(*total));
	if (*total < min || *total > R->wire_cap)
		return -EPROTO;
	for (size_t at = len; at < *total && !rc; at += len)
		rc = dps_ring_pop(&R->w->replica, me, R->wire + at, MSG_BYTES, &len, 0);
	return rc;
}

/*
 * Publishes this step's header and rows to the replica's other ranks through its batch ring
 * (TP rank 0 writes, the peers read): one buffer, [length][header][tokens][pos][slot][table
 * index][want][tables], cut into ring-slot messages. The peers block on the ring meanwhile.
 */
static int publish_rows(struct replica *R, int *hdr)
{
	struct dps_world *w = R->w;
	const size_t n = (size_t)hdr[H_ROWS];
	uint32_t total;
	size_t off = sizeof(uint32_t);
	int rc = 0;

	if (w->tp == 1)
		return 0;
	if (R->tp0) {
#define PUT(p, bytes) (memcpy(R->wire + off, (p), (bytes)), off += (bytes))
		PUT(hdr, sizeof(int) * H_LEN);
		if (hdr[H_CMD] == 0 && n) {
			PUT(R->tokens, sizeof(int) * n);
			PUT(R->pos, sizeof(int) * n);
			PUT(R->slot, sizeof(int) * n);
			PUT(R->tix, sizeof(int) * n);
			PUT(R->want, n);
			PUT(R->tables, sizeof(int) * (size_t)hdr[H_TABLES] * (size_t)R->bpr);
		}
#undef PUT
		return wire_push(R, off);
	}
	/* A peer: the first message says how many bytes follow. */
	rc = wire_pop(R, sizeof(uint32_t) + sizeof(int) * H_LEN, &total);
	if (rc)
		return rc;
#define GET(p, bytes) (memcpy((p), R->wire + off, (bytes)), off += (bytes))
	GET(hdr, sizeof(int) * H_LEN);
	if (hdr[H_CMD] == 0 && hdr[H_ROWS]) {
		const size_t m = (size_t)hdr[H_ROWS];

		GET(R->tokens, sizeof(int) * m);
		GET(R->pos, sizeof(int) * m);
		GET(R->slot, sizeof(int) * m);
		GET(R->tix, sizeof(int) * m);
		GET(R->want, m);
		GET(R->tables, sizeof(int) * (size_t)hdr[H_TABLES] * (size_t)R->bpr);
	}
#undef GET
	return 0;
}

static int run_rows(struct replica *R, int prefill, int n, float **logits)
{
	struct dps_rows rows;
	int rc = 0;

	for (int i = 0; i < n; i++)
		R->table[i] = R->tix[i] >= 0 ? R->tables + (size_t)R->tix[i] * (size_t)R->bpr : NULL;
	rows = (struct dps_rows){ n, R->tokens, R->pos, R->slot, (const int *const *)R->table,
				  R->want };
	*logits = (float *)dps_shard_step_rows(&R->m, prefill, &rows, &rc);
	R->st.steps++;
	if (prefill)
		R->st.prefill_steps++;
	else
		R->st.decode_steps++;
	return *logits ? 0 : rc;
}

/*
 * Publishes the draft's catch-up rows (TP rank 0 from the scheduler; the peers read them):
 * [length][n, n_prop][tokens][pos][slot][table index][source row][want][tables].
 */
static int publish_catchup(struct replica *R)
{
	struct dps_world *w = R->w;
	int hdr[3] = { 0 };
	uint32_t total;
	size_t off = sizeof(uint32_t);
	int rc = 0;

	if (R->tp0) {
		const struct dps_catchup *cu = &R->s.cu;
		int nt = 0;

		R->n_cu = cu->n;
		R->n_prop = cu->n_prop;
		for (int k = 0, p = 0; k < cu->n; k++) {
			R->cu_tok[k] = cu->token[k];
			R->cu_pos[k] = cu->pos[k];
			R->cu_slot[k] = cu->slot[k];
			R->cu_src[k] = cu->row[k];
			R->cu_want[k] = cu->want[k];
			if (!k || cu->req[k] != cu->req[k - 1])
				put_table(R, R->cu_tables, nt++, cu->req[k]);
			R->cu_tix[k] = nt - 1;
			if (cu->want[k])
				R->p_req[p++] = cu->req[k];
		}
		hdr[2] = nt;
	}
	if (w->tp == 1)
		return 0;
	if (R->tp0) {
		const size_t n = (size_t)R->n_cu;

		hdr[0] = R->n_cu;
		hdr[1] = R->n_prop;
#define PUT(p, bytes) (memcpy(R->wire + off, (p), (bytes)), off += (bytes))
		PUT(hdr, sizeof(hdr));
		PUT(R->cu_tok, sizeof(int) * n);
		PUT(R->cu_pos, sizeof(int) * n);
		PUT(R->cu_slot, sizeof(int) * n);
		PUT(R->cu_tix, sizeof(int) * n);
		PUT(R->cu_src, sizeof(int) * n);
		PUT(R->cu_want, n);
		PUT(R->cu_tables, sizeof(int) * (size_t)hdr[2] * (size_t)R->bpr);
#undef PUT
		return wire_push(R, off);
	}
	rc = wire_pop(R, sizeof(uint32_t) + sizeof(hdr), &total);
	if (rc)
		return rc;
#define GET(p, bytes) (memcpy((p), R->wire + off, (bytes)), off += (bytes))
	GET(hdr, sizeof(hdr));
	if (hdr[0] < 0 || hdr[0] > R->rows_cap || hdr[1] < 0 || hdr[1] > hdr[0] ||
	    hdr[1] > R->zero_table || hdr[2] < 0 || hdr[2] > R->zero_table + 1 ||
	    off + (size_t)hdr[0] * (5 * sizeof(int) + 1) +
			    sizeof(int) * (size_t)hdr[2] * (size_t)R->bpr > total)
		return -EPROTO;
	R->n_cu = hdr[0];
	R->n_prop = hdr[1];
	GET(R->cu_tok, sizeof(int) * (size_t)R->n_cu);
	GET(R->cu_pos, sizeof(int) * (size_t)R->n_cu);
	GET(R->cu_slot, sizeof(int) * (size_t)R->n_cu);
	GET(R->cu_tix, sizeof(int) * (size_t)R->n_cu);
	GET(R->cu_src, sizeof(int) * (size_t)R->n_cu);
	GET(R->cu_want, (size_t)R->n_cu);
	GET(R->cu_tables, sizeof(int) * (size_t)hdr[2] * (size_t)R->bpr);
#undef GET
	return 0;
}

/* The draft's token: its argmax over the draft vocabulary, as a target id. */
static int draft_token(const struct dps_shard *dm, const float *lg)
{
	const int V = dm->cfg.vocab_size;
	int best = 0;

	for (int v = 1; v < V; v++)
		if (lg[v] > lg[best])
			best = v;
	return best + dm->d2t[best];
}

/*
 * After a target step: the draft catches up on the positions the step kept (reading the
 * target's hidden states of those rows), and proposes spec_k tokens for every request that
 * may be drafted, recurrently on its own hidden state. Every rank of the replica runs the
 * same passes; with --draft-mlp-dp-size > 1 every replica runs all spec_k of them, rows or not.
 */
static int draft_passes(struct replica *R)
{
	struct dps_shard *dm = &R->dm;
	const size_t dim = (size_t)dm->cfg.hidden_size, V = (size_t)dm->cfg.vocab_size;
	const int K = R->spec_k, bs = dm->block_size;
	struct dps_rows rows;
	const float *lg;
	int rc = publish_catchup(R);

	if (rc)
		return rc;
	for (int k = 0, wants = 0; k < R->n_cu; k++) {
		/* What rank 0 published, checked before anything indexes with it. */
		if (R->cu_src[k] < 0 || R->cu_src[k] >= R->rows_cap || R->cu_tix[k] < 0 ||
		    R->cu_tix[k] > R->zero_table || R->cu_pos[k] < 0 ||
		    R->cu_pos[k] + (R->cu_want[k] ? K - 1 : 0) >= dm->max_pos || R->cu_tok[k] < 0 ||
		    R->cu_tok[k] >= R->m.cfg.vocab_size || R->cu_slot[k] < 0 ||
		    R->cu_slot[k] >= dm->num_blocks * bs || (wants += R->cu_want[k] != 0) > R->n_prop)
			return -EPROTO;
		if (k + 1 == R->n_cu && wants != R->n_prop)
			return -EPROTO;
		memcpy(R->hin + (size_t)k * 3 * dim, R->m.aux + (size_t)R->cu_src[k] * 3 * dim,
		       sizeof(float) * 3 * dim);
		R->cu_table[k] = R->cu_tables + (size_t)R->cu_tix[k] * (size_t)R->bpr;
	}
	for (int k = 0; k < R->n_cu; k++)
		for (int b = 0; b <= (R->cu_pos[k] + (R->cu_want[k] ? K - 1 : 0)) / bs &&
				b < R->bpr; b++)
			if (R->cu_table[k][b] < 0 || R->cu_table[k][b] >= dm->num_blocks)
				return -EPROTO;
	rows = (struct dps_rows){ R->n_cu, R->cu_tok, R->cu_pos, R->cu_slot,
				  (const int *const *)R->cu_table, R->cu_want };
	lg = dps_shard_draft_step(dm, &R->m, &rows, R->hin, 1, R->hout, &rc);
	if (!lg)
		return rc;
	R->st.draft_steps += R->n_cu > 0;
	for (int k = 0, p = 0; k < R->n_cu; k++)
		if (R->cu_want[k]) {
			R->p_pos[p] = R->cu_pos[k];
			R->p_tix[p] = R->cu_tix[k];
			R->p_tok[(size_t)p * K] = draft_token(dm, lg + (size_t)p * V);
			memcpy(R->hprev + (size_t)p * dim, R->hout + (size_t)k * dim,
			       sizeof(float) * dim);
			p++;
		}
	for (int j = 1; j < K; j++) {
		const int n = R->n_prop;

		for (int p = 0; p < n; p++) {
			const int pos = R->p_pos[p] + j;
			const int *table = R->cu_tables + (size_t)R->p_tix[p] * (size_t)R->bpr;

			R->d_tok[p] = R->p_tok[(size_t)p * K + (size_t)(j - 1)];
			R->d_pos[p] = pos;
			R->d_slot[p] = table[pos / bs] * bs + pos % bs;
			R->d_table[p] = table;
		}
		rows = (struct dps_rows){ n, R->d_tok, R->d_pos, R->d_slot,
					  (const int *const *)R->d_table, NULL };
		lg = dps_shard_draft_step(dm, &R->m, &rows, R->hprev, 0, R->hout, &rc);
		if (!lg)
			return rc;
		R->st.draft_steps += n > 0;
		for (int p = 0; p < n; p++)
			R->p_tok[(size_t)p * K + (size_t)j] = draft_token(dm, lg + (size_t)p * V);
		memcpy(R->hprev, R->hout, sizeof(float) * (size_t)n * dim);
	}
	if (R->tp0)
		for (int p = 0; p < R->n_prop; p++) {
			struct dps_req *r = R->p_req[p];

			memcpy(r->draft, R->p_tok + (size_t)p * K, sizeof(int) * (size_t)K);
			r->n_draft = K;
		}
	return 0;
}

/* One line per rank: its weight bytes per component and layout, and its KV cache. */
static void describe_rank(const struct dps_shard *s, const struct dps_world *w)
{
	char line[1024];
	size_t len = 0, total = 0;

	for (int p = 0; p < DPS_PART_COUNT; p++)
		total += s->bytes[p];
	len += (size_t)snprintf(line + len, sizeof(line) - len, "rank %d (DP %d, TP %d): %.2f MB "
				"of weights:", w->rank, w->dp_rank, w->tp_rank, (double)total / 1e6);
	for (int p = 0; p < DPS_PART_COUNT && len < sizeof(line); p++)
		if (s->bytes[p])
			len += (size_t)snprintf(line + len, sizeof(line) - len, " %s %.2f MB;",
						dps_shard_part_name((enum dps_shard_part)p),
						(double)s->bytes[p] / 1e6);
	if (len < sizeof(line))
		snprintf(line + len, sizeof(line) - len, " KV cache %.2f MB",
			 (double)s->cache_bytes / 1e6);
	fprintf(stderr, "%s\n", line);
}

static int replica_init(struct replica *R, struct dps_world *w, const struct dps_engine_opts *o)
{
	struct dps_sched_cfg sc = { 0 };
	struct dps_model_config cfg;
	char err[512];
	size_t budget;
	int rc, rows, max_len;

	R->w = w;
	R->o = o;
	R->tp0 = w->tp_rank == 0;
	rc = dps_gemm_setup(o->blis_arch ? o->blis_arch : "auto",
			    o->threads ? o->threads : (int)w->ncpus, err, sizeof(err));
	if (!rc)
		rc = dps_model_config_load(o->model, &cfg, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "rank %d: %s\n", w->rank, err);
		return rc;
	}
	max_len = o->max_model_len > 0 && o->max_model_len < cfg.max_position_embeddings
			  ? o->max_model_len : cfg.max_position_embeddings;
	sc.block_size = o->block_size > 0 ? o->block_size : DPS_BLOCK_SIZE_DEFAULT;
	sc.max_num_seqs = o->max_num_seqs > 0 ? o->max_num_seqs : 64;
	sc.max_model_len = max_len;
	sc.max_batched_tokens = o->max_batched_tokens > 0 ? o->max_batched_tokens : 512;
	rc = dps_sched_buckets(&sc, o->decode_buckets, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "rank %d: %s\n", w->rank, err);
		return rc;
	}
	budget = dps_kv_budget(o->kv_cache_memory, o->kv_fraction, w->world);
	R->spec_k = o->spec_model ? o->spec_k : 0;
	sc.spec_k = R->spec_k;
	if (R->spec_k < 0 || R->spec_k > DPS_MAX_SPEC || (o->spec_model && !R->spec_k)) {
		fprintf(stderr, "rank %d: --num-speculative-tokens must be between 1 and %d with "
			"--speculative-model\n", w->rank, DPS_MAX_SPEC);
		return -EINVAL;
	}
	if (R->spec_k) {
		/* The draft's one layer keeps its own KV in the same blocks: share the budget in
		 * proportion to the KV heads of every layer. */
		struct dps_model_config dc;
		double tkv, dkv;

		rc = dps_model_config_load(o->spec_model, &dc, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "rank %d: --speculative-model: %s\n", w->rank, err);
			return rc;
		}
		/* Per rank: a TP position holds ceil(KV heads / TP) of each (at least one). */
		tkv = (double)cfg.num_hidden_layers * cfg.head_dim *
		      (double)((cfg.num_key_value_heads + w->tp - 1) / w->tp);
		dkv = (double)dc.head_dim *
		      (double)((dc.num_key_value_heads + w->tp - 1) / w->tp);
		budget = (size_t)((double)budget * tkv / (tkv + dkv));
	}
	rows = sc.max_batched_tokens + sc.max_num_seqs * (1 + R->spec_k);
	rc = dps_shard_load(&R->m, w, &w->lay->groups.cfg, o->model,
			    &(struct dps_shard_opts){ .max_pos = max_len, .max_seqs = 1,
						      .max_rows = rows, .block_size = sc.block_size,
						      .kv_bytes = budget,
						      /* more than every sequence at full length is never used */
						      .max_blocks = sc.max_num_seqs *
								    ((max_len + sc.block_size - 1) /
								     sc.block_size) },
			    err, sizeof(err));
	if (rc) {
		fprintf(stderr, "rank %d: %s\n", w->rank, err);
		return rc;
	}
	R->m.trace = o->trace;
	if (o->verbose)
		describe_rank(&R->m, w);
	if (R->spec_k) {
		rc = dps_shard_load(&R->dm, w, &w->lay->groups.cfg, o->spec_model,
				    &(struct dps_shard_opts){ .max_pos = max_len, .max_seqs = 1,
							      .max_rows = rows,
							      .block_size = sc.block_size,
							      .num_blocks = R->m.num_blocks,
							      .target = &R->m },
				    err, sizeof(err));
		if (!rc)
			rc = dps_shard_set_aux(&R->m, R->dm.aux_l, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "rank %d: --speculative-model: %s\n", w->rank, err);
			return rc;
		}
		R->dm.trace = o->trace;
		if (o->verbose)
			describe_rank(&R->dm, w);
		if (w->rank == 0)
			fprintf(stderr, "Eagle3 draft %s: %d tokens per step, vocabulary %d, fusing "
				"target layers %d, %d, %d; its MLP over TP x %d\n", o->spec_model,
				R->spec_k, R->dm.cfg.vocab_size, R->dm.aux_l[0], R->dm.aux_l[1],
				R->dm.aux_l[2], R->dm.c[DPS_COMP_MLP]);
	}
	/* Component sizes above 1 (the draft MLP's when a draft runs), or expert parallelism. */
	R->coupled = dps_shard_coupled(&R->m) ||
		     (R->spec_k && R->m.c[DPS_COMP_DRAFT_MLP] > 1);
	/* Every rank of the replica must hold the blocks rank 0 hands out: take the smallest. */
	sc.num_blocks = R->m.num_blocks;
	if (w->tp > 1) {
		int *all = calloc((size_t)w->tp, sizeof(int));

		if (!all)
			return -ENOMEM;
		rc = dps_coll_allgather(w->tp_c, &sc.num_blocks, all, 1, DPS_I32);
		for (int t = 0; t < w->tp; t++)
			sc.num_blocks = all[t] < sc.num_blocks ? all[t] : sc.num_blocks;
		free(all);
		if (rc)
			return rc;
	}
	R->st.num_blocks = (uint64_t)sc.num_blocks;
	R->bpr = (max_len + sc.block_size - 1) / sc.block_size;
	if (R->tp0) {
		rc = dps_sched_init(&R->s, &sc, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "replica %d: %s (--kv-cache-memory gives %zu bytes per rank)\n",
				w->dp_rank, err, budget);
			return rc;
		}
		if (o->verbose || w->dp_rank == 0)
			fprintf(stderr, "replica %d: %d KV blocks of %d positions (%.1f MB per rank), "
					"max %d sequences, %d tokens per step, buckets up to %d\n",
				w->dp_rank, sc.num_blocks, sc.block_size,
				(double)R->m.cache_bytes / 1e6, sc.max_num_seqs,
				sc.max_batched_tokens, sc.buckets[sc.n_buckets - 1]);
	}
	R->rows_cap = rows;
	R->tokens = calloc((size_t)rows, sizeof(int));
	R->pos = calloc((size_t)rows, sizeof(int));
	R->slot = calloc((size_t)rows, sizeof(int));
	R->tix = calloc((size_t)rows, sizeof(int));
	R->want = calloc((size_t)rows + 4, 1);
	R->table = calloc((size_t)rows, sizeof(*R->table));
	/* max_num_seqs tables of requests, then the zero table of padding rows (never written) */
	R->zero_table = sc.max_num_seqs;
	R->tables = calloc((size_t)(sc.max_num_seqs + 1) * (size_t)R->bpr, sizeof(int));
	R->out = calloc(1, MSG_BYTES);
	/* A step's rows or the draft's catch-up rows (one more int each). */
	R->wire_cap = sizeof(uint32_t) + sizeof(int) * (H_LEN + 3) +
		      (size_t)rows * (5 * sizeof(int) + 1) +
		      sizeof(int) * (size_t)(sc.max_num_seqs + 1) * (size_t)R->bpr;
	R->wire = malloc(R->wire_cap + MSG_BYTES);
	R->scratch = calloc((size_t)R->m.cfg.vocab_size, sizeof(int));
	if (!R->tokens || !R->pos || !R->slot || !R->tix || !R->want || !R->table || !R->tables ||
	    !R->out || !R->scratch || !R->wire)
		return -ENOMEM;
	if (R->spec_k) {
		const size_t dim = (size_t)R->m.cfg.hidden_size, ns = (size_t)sc.max_num_seqs;

		R->cu_tok = calloc((size_t)rows, sizeof(int));
		R->cu_pos = calloc((size_t)rows, sizeof(int));
		R->cu_slot = calloc((size_t)rows, sizeof(int));
		R->cu_tix = calloc((size_t)rows, sizeof(int));
		R->cu_src = calloc((size_t)rows, sizeof(int));
		R->cu_want = calloc((size_t)rows, 1);
		R->cu_table = calloc((size_t)rows, sizeof(*R->cu_table));
		R->cu_tables = calloc((ns + 1) * (size_t)R->bpr, sizeof(int));
		R->p_pos = calloc(ns, sizeof(int));
		R->p_tix = calloc(ns, sizeof(int));
		R->p_tok = calloc(ns * (size_t)R->spec_k, sizeof(int));
		R->p_req = calloc(ns, sizeof(*R->p_req));
		R->hin = calloc((size_t)rows * 3 * dim, sizeof(float));
		R->hout = calloc((size_t)rows * dim, sizeof(float));
		R->hprev = calloc(ns * dim, sizeof(float));
		R->d_tok = calloc(ns, sizeof(int));
		R->d_pos = calloc(ns, sizeof(int));
		R->d_slot = calloc(ns, sizeof(int));
		R->d_table = calloc(ns, sizeof(*R->d_table));
		if (!R->cu_tok || !R->cu_pos || !R->cu_slot || !R->cu_tix || !R->cu_src ||
		    !R->cu_want || !R->cu_table || !R->cu_tables || !R->p_pos || !R->p_tix ||
		    !R->p_tok || !R->p_req || !R->hin || !R->hout || !R->hprev || !R->d_tok ||
		    !R->d_pos || !R->d_slot || !R->d_table)
			return -ENOMEM;
	}
	return 0;
}

static void replica_free(struct replica *R)
{
	if (R->tp0)
		dps_sched_free(&R->s);
	dps_shard_free(&R->m);
	if (R->spec_k)
		dps_shard_free(&R->dm);
	free(R->cu_tok);
	free(R->cu_pos);
	free(R->cu_slot);
	free(R->cu_tix);
	free(R->cu_src);
	free(R->cu_want);
	free(R->cu_table);
	free(R->cu_tables);
	free(R->p_pos);
	free(R->p_tix);
	free(R->p_tok);
	free(R->p_req);
	free(R->hin);
	free(R->hout);
	free(R->hprev);
	free(R->d_tok);
	free(R->d_pos);
	free(R->d_slot);
	free(R->d_table);
	free(R->pend.ids);
	free(R->tokens);
	free(R->pos);
	free(R->slot);
	free(R->tix);
	free(R->want);
	free(R->table);
	free(R->tables);
	free(R->out);
	free(R->wire);
	free(R->scratch);
}

int dps_engine_rank_main(struct dps_world *w, void *arg)
{
	const struct dps_engine_opts *o = arg;
	struct replica R;
	uint64_t last_stats = dps_now_ns();
	int rc, *agree = calloc(4 * (size_t)w->dp, sizeof(int));

	memset(&R, 0, sizeof(R));
	if (!agree)
		return -ENOMEM;
	rc = replica_init(&R, w, o);
	if (!rc) {
		/* Loaded: every rank says so (the service is ready when all have). */
		const struct m_hdr m = { M_READY, 0, w->rank };

		for (int i = 0; i < w->lay->n_comms; i++)
			w->comms[i].timing = 1;
		rc = send_up(&R, &m, sizeof(m));
	}
	while (!rc) {
		int hdr[H_LEN] = { 0 }, prefill, n;
		float *logits = NULL;

		if (R.tp0) {
			const uint64_t now = dps_now_ns();

			if (now - last_stats >= (uint64_t)DPS_ENGINE_STATS_MS * 1000000ull) {
				struct m_stats m;

				last_stats = now;
				fill_stats(&R, &m, 0);
				rc = send_up(&R, &m, sizeof(m));
				if (rc)
					break;
			}
			rc = poll_client(&R, 0);
			if (rc)
				break;
			if (!R.coupled && !dps_sched_pending(&R.s) && !R.stop) {
				/* Uncoupled and idle: sleep on the ring (peers sleep in the broadcast). */
				rc = poll_client(&R, 200000000ull);
				if (rc)
					break;
			}
			n = dps_sched_step(&R.s, dps_now_ns());
			hdr[H_CMD] = R.stop && !dps_sched_pending(&R.s) ? 2 : n ? 0 : 1;
			hdr[H_UNFINISHED] = dps_sched_pending(&R.s) > 0;
			if (n)
				pack(&R, hdr);
		}
		rc = publish_rows(&R, hdr);
		if (rc)
			break;
		prefill = hdr[H_PREFILL];
		n = hdr[H_ROWS];
		if (R.coupled) {
			/* _get_dp_padding: each replica's counts in its own slot, summed over DP. */
			int max_rows = 0, any_prefill = 0, any_work = 0, all_stop = 1;

			memset(agree, 0, sizeof(int) * 4 * (size_t)w->dp);
			agree[4 * w->dp_rank] = n;
			agree[4 * w->dp_rank + 1] = prefill;
			agree[4 * w->dp_rank + 2] = hdr[H_UNFINISHED] || n;
			agree[4 * w->dp_rank + 3] = hdr[H_CMD] == 2;
			if (w->dp > 1) {
				rc = dps_coll_allreduce(w->dp_c, agree, agree, 4 * (size_t)w->dp, DPS_I32);
				R.st.dp_allreduces++;
				if (rc)
					break;
			}
			for (int d = 0; d < w->dp; d++) {
				max_rows = agree[4 * d] > max_rows ? agree[4 * d] : max_rows;
				any_prefill |= agree[4 * d + 1];
				any_work |= agree[4 * d + 2];
				all_stop &= agree[4 * d + 3];
			}
			if (all_stop)
				break;
			if (!any_work) {
				/* Everything idle: sleep until the client wakes every replica, unless a
				 * message (a wake-up) came in since this agreement began. */
				if (R.tp0 && !R.took)
					rc = poll_client(&R, 200000000ull);
				R.took = 0;
				continue;
			}
			R.took = 0;
			prefill = any_prefill;
			if (prefill)
				n = hdr[H_REAL]; /* prefill is not bucketed: drop the bucket's padding */
			if (!prefill) {
				/* The decode graph on the largest batch; an idle replica's is a dummy. */
				if (!n && max_rows)
					R.st.dummy_steps++;
				R.st.padded_rows += (uint64_t)(max_rows - hdr[H_REAL]);
				pad_rows(&R, n, max_rows);
				n = max_rows;
			}
		} else {
			if (hdr[H_CMD] == 2)
				break;
		}
		if (!n && !prefill) {
			/* Nothing to run: still report requests that ended (cancelled, timed out). */
			if (R.tp0) {
				dps_sched_update(&R.s, NULL, 0, -1, R.scratch, on_emit, on_done, &R);
				rc = flush_tokens(&R);
			}
			continue;
		}
		if (!R.coupled && !prefill)
			R.st.padded_rows += (uint64_t)(n - hdr[H_REAL]);
		rc = run_rows(&R, prefill, n, &logits);
		if (rc)
			break;
		if (R.tp0 && hdr[H_ROWS])
			/* EOS ends a request through its stop ids only (which the clients add, but
			 * not for "ignore_eos"). */
			dps_sched_update(&R.s, logits, R.m.cfg.vocab_size, -1,
					 R.scratch, on_emit, on_done, &R);
		else if (R.tp0)
			dps_sched_update(&R.s, NULL, 0, -1, R.scratch, on_emit, on_done, &R);
		if (R.tp0)
			rc = flush_tokens(&R);
		if (!rc && R.spec_k)
			rc = draft_passes(&R);
	}
	if (R.tp0 && !rc) {
		struct m_stats m;

		fill_stats(&R, &m, 1);
		send_up(&R, &m, sizeof(m));
	}
	replica_free(&R);
	free(agree);
	return rc;
}

/* ---- the client ------------------------------------------------------------------------------ */

struct creq {
	int64_t id;
	int replica, started, finished, sent_all;
	int *prompt, n_prompt, sent;   /* prompt ids sent so far */
	struct dps_req_params p;
	void *user;
	int n_gen;
};

struct dps_engine_client {
	int dp, tp;
	struct dps_engine_cb cb;
	struct creq *reqs;
	int n, cap;
	int64_t next_id;
	int *waiting, *running;    /* per replica */
	uint64_t *sent;
	int rotate, closing, stopped, outstanding;
	int64_t *cancels;
	int n_cancels, cap_cancels;
	int *wake;                 /* replicas to wake (coupled engines sleep together) */
	unsigned char *blocked;    /* per replica, this tick: its ring was full */
	int first_unsent;          /* requests before it are all sent or finished */
	int64_t base;              /* the id of reqs[0]: finished requests are dropped in front */
	int n_ready;               /* ranks that reported the model loaded */
};

int dps_engine_client_new(struct dps_engine_client **out, int dp, int tp,
			  const struct dps_engine_cb *cb)
{
	struct dps_engine_client *c = calloc(1, sizeof(*c));

	*out = NULL;
	if (!c)
		return -ENOMEM;
	c->dp = dp;
	c->tp = tp;
	c->cb = *cb;
	c->waiting = calloc((size_t)dp, sizeof(int));
	c->running = calloc((size_t)dp, sizeof(int));
	c->sent = calloc((size_t)dp, sizeof(uint64_t));
	c->wake = calloc((size_t)dp, sizeof(int));
	c->blocked = calloc((size_t)dp, 1);
	if (!c->waiting || !c->running || !c->sent || !c->wake || !c->blocked) {
		dps_engine_client_free(c);
		return -ENOMEM;
	}
	*out = c;
	return 0;
}

void dps_engine_client_free(struct dps_engine_client *c)
{
	if (!c)
		return;
	for (int i = 0; i < c->n; i++)
		free(c->reqs[i].prompt);
	free(c->reqs);
	free(c->waiting);
	free(c->running);
	free(c->sent);
	free(c->wake);
	free(c->blocked);
	free(c->cancels);
	free(c);
}

static struct creq *creq_find(struct dps_engine_client *c, int64_t id)
{
	/* ids are dense from 0; reqs[0] is request base */
	return id >= c->base && id - c->base < c->n ? &c->reqs[id - c->base] : NULL;
}

/* Request q ends in the client (its counts, its prompt) and its done callback runs. */
static void creq_end(struct dps_engine_client *c, struct creq *q, enum dps_finish why, int n_gen)
{
	q->finished = 1;
	q->sent_all = 1;
	if (q->started)
		c->running[q->replica]--;
	else
		c->waiting[q->replica]--;
	c->outstanding--;
	free(q->prompt);
	q->prompt = NULL;
	if (c->cb.done)
		c->cb.done(c->cb.arg, q->user, why, n_gen);
}

/* A long-running client: drops the finished requests at the front once they are many. */
static void compact(struct dps_engine_client *c)
{
	int head = 0;

	while (head < c->n && c->reqs[head].finished && head < c->first_unsent)
		head++;
	if (head < 1024 || head < c->n / 2)
		return;
	memmove(c->reqs, c->reqs + head, sizeof(*c->reqs) * (size_t)(c->n - head));
	c->n -= head;
	c->base += head;
	c->first_unsent -= head;
}

int64_t dps_engine_submit(struct dps_engine_client *c, const struct dps_engine_req *r)
{
	struct creq *q;
	int best = -1;

	if (r->n_prompt < 1 || (r->replica >= c->dp))
		return -EINVAL;
	if (c->n == c->cap) {
		struct creq *n = realloc(c->reqs, sizeof(*n) * (size_t)(c->cap ? 2 * c->cap : 64));

		if (!n)
			return -ENOMEM;
		c->reqs = n;
		c->cap = c->cap ? 2 * c->cap : 64;
	}
	q = &c->reqs[c->n];
	memset(q, 0, sizeof(*q));
	q->prompt = malloc(sizeof(int) * (size_t)r->n_prompt);
	if (!q->prompt)
		return -ENOMEM;
	memcpy(q->prompt, r->prompt, sizeof(int) * (size_t)r->n_prompt);
	q->n_prompt = r->n_prompt;
	q->p = r->p;
	q->user = r->user;
	q->id = c->base + c->n++;
	/* The named replica, or the least loaded: score 4 x waiting + running, rotating ties. */
	if (r->replica >= 0) {
		best = r->replica;
	} else {
		for (int k = 0; k < c->dp; k++) {
			const int d = (c->rotate + k) % c->dp;

			if (best < 0 || 4 * c->waiting[d] + c->running[d] <
					     4 * c->waiting[best] + c->running[best])
				best = d;
		}
		c->rotate = (c->rotate + 1) % c->dp;
	}
	q->replica = best;
	c->waiting[best]++;
	c->sent[best]++;
	c->outstanding++;
	for (int d = 0; d < c->dp; d++)
		c->wake[d] = d != best;
	return q->id;
}

void dps_engine_cancel(struct dps_engine_client *c, int64_t id)
{
	struct creq *q = creq_find(c, id);
	int64_t *n;

	if (!q || q->finished)
		return;
	if (c->n_cancels == c->cap_cancels) {
		n = realloc(c->cancels, sizeof(*n) * (size_t)(c->cap_cancels ? 2 * c->cap_cancels : 16));
		if (!n)
			return;
		c->cancels = n;
		c->cap_cancels = c->cap_cancels ? 2 * c->cap_cancels : 16;
	}
	c->cancels[c->n_cancels++] = id;
}

void dps_engine_close_when_idle(struct dps_engine_client *c)
{
	c->closing = 1;
}

int dps_engine_outstanding(const struct dps_engine_client *c)
{
	return c->outstanding;
}

const uint64_t *dps_engine_sent(const struct dps_engine_client *c)
{
	return c->sent;
}

void dps_engine_on_msg(int rank, const void *msg, size_t len, void *client)
{
	struct dps_engine_client *c = client;
	struct m_hdr h;

	(void)rank;
	if (len < sizeof(h))
		return;
	memcpy(&h, msg, sizeof(h));
	if (h.type == M_TOKENS && len >= sizeof(struct m_tokens) + h.count * sizeof(struct m_tok)) {
		const struct m_tokens *m = msg;

		for (uint32_t i = 0; i < h.count; i++) {
			struct creq *q = creq_find(c, m->t[i].id);

			if (!q || q->finished)
				continue;
			if (!q->started) {
				q->started = 1;
				c->waiting[q->replica]--;
				c->running[q->replica]++;
			}
			q->n_gen++;
			if (c->cb.token)
				c->cb.token(c->cb.arg, q->user, m->t[i].token);
		}
	} else if (h.type == M_DONE && len >= sizeof(struct m_done)) {
		const struct m_done *m = msg;
		struct creq *q = creq_find(c, h.id);

		if (!q || q->finished)
			return;
		creq_end(c, q, (enum dps_finish)m->finish, m->n_gen);
	} else if (h.type == M_STATS && len >= sizeof(struct m_stats)) {
		const struct m_stats *m = msg;

		if (c->cb.stats && m->replica >= 0 && m->replica < c->dp)
			c->cb.stats(c->cb.arg, m->replica, &m->st, (int)h.count);
	} else if (h.type == M_READY) {
		if (++c->n_ready == c->dp * c->tp && c->cb.ready)
			c->cb.ready(c->cb.arg);
	}
}

void dps_engine_load(const struct dps_engine_client *c, int d, int *waiting, int *running)
{
	*waiting = d >= 0 && d < c->dp ? c->waiting[d] : 0;
	*running = d >= 0 && d < c->dp ? c->running[d] : 0;
}

int dps_engine_ready(const struct dps_engine_client *c)
{
	return c->n_ready >= c->dp * c->tp;
}

void dps_engine_fail_all(struct dps_engine_client *c, enum dps_finish why)
{
	for (int i = 0; i < c->n; i++) {
		struct creq *q = &c->reqs[i];

		if (!q->finished)
			creq_end(c, q, why, q->n_gen);
	}
	c->n_cancels = 0;
}

/* Sends what it can of request q; 0 when all of it is out, -EAGAIN when the ring is full. */
static int send_req(struct dps_engine_client *c, struct creq *q)
{
	unsigned char buf[MSG_BYTES];
	const int rank = q->replica * c->tp;
	int rc;

	while (q->sent < q->n_prompt || !q->sent) {
		if (!q->sent) {
			struct m_req *m = (struct m_req *)(void *)buf;
			const int k = q->n_prompt < (int)REQ_IDS ? q->n_prompt : (int)REQ_IDS;

			m->h = (struct m_hdr){ M_REQ, (uint32_t)k, q->id };
			m->p = q->p;
			m->n_prompt = q->n_prompt;
			memcpy(m->ids, q->prompt, sizeof(int) * (size_t)k);
			rc = dps_sup_send(rank, m, sizeof(*m) + sizeof(int32_t) * (size_t)k);
			if (rc)
				return rc;
			q->sent = k;
		} else {
			struct m_more *m = (struct m_more *)(void *)buf;
			const int left = q->n_prompt - q->sent;
			const int k = left < (int)MORE_IDS ? left : (int)MORE_IDS;

			m->h = (struct m_hdr){ M_REQ_MORE, (uint32_t)k, q->id };
			memcpy(m->ids, q->prompt + q->sent, sizeof(int) * (size_t)k);
			rc = dps_sup_send(rank, m, sizeof(*m) + sizeof(int32_t) * (size_t)k);
			if (rc)
				return rc;
			q->sent += k;
		}
	}
	q->sent_all = 1;
	return 0;
}

int dps_engine_tick(void *client)
{
	struct dps_engine_client *c = client;
	int busy = 0, keep = 0;

	compact(c);
	/*
	 * Requests in order per replica (each receives its requests one after another, whole);
	 * a replica whose ring is full holds back only its own.
	 */
	memset(c->blocked, 0, (size_t)c->dp);
	for (int i = c->first_unsent; i < c->n; i++) {
		struct creq *q = &c->reqs[i];

		if (q->finished || q->sent_all) {
			if (i == c->first_unsent)
				c->first_unsent++;
			continue;
		}
		if (c->blocked[q->replica])
			continue;
		if (send_req(c, q)) {
			c->blocked[q->replica] = 1;
			busy = 1;
		}
	}
	for (int d = 0; d < c->dp; d++) {
		const struct m_hdr w = { M_WAKE, 0, 0 };

		if (c->wake[d] && !c->blocked[d] && dps_sup_send(d * c->tp, &w, sizeof(w)) == 0)
			c->wake[d] = 0;
		busy |= c->wake[d];
	}
	for (int i = 0; i < c->n_cancels; i++) {
		struct creq *q = creq_find(c, c->cancels[i]);
		const struct m_hdr m = { M_CANCEL, 0, c->cancels[i] };

		if (!q || q->finished)
			continue;
		if (!q->sent) {
			/* Never sent: it ends here. */
			creq_end(c, q, DPS_FINISH_CANCELLED, 0);
			continue;
		}
		/* After the whole request, through the same ring. */
		if (!q->sent_all || c->blocked[q->replica] ||
		    dps_sup_send(q->replica * c->tp, &m, sizeof(m))) {
			c->blocked[q->replica] = 1;
			c->cancels[keep++] = c->cancels[i];
			busy = 1;
		}
	}
	c->n_cancels = keep;
	if (!busy && c->closing && !c->outstanding && !c->stopped) {
		const struct m_hdr m = { M_STOP, 0, 0 };
		int all = 1;

		for (int d = 0; d < c->dp; d++)
			all &= dps_sup_send(d * c->tp, &m, sizeof(m)) == 0;
		c->stopped = all; /* (a replica whose ring was full gets it again next tick) */
		busy = !all;
	}
	return busy ? 5 : -1;
}

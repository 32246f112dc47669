/* SPDX-License-Identifier: MIT */
/*
 * engine/serve/replica.c - the replica loop on every rank (dps_engine_rank_main, the
 * reference's run_busy_loop): TP rank 0 takes the client's messages, asks its scheduler for a
 * batch and publishes it to the replica's peers; coupled replicas agree through the lockstep
 * (lockstep.h); every rank runs the step; TP rank 0 samples and sends the tokens up; a draft
 * proposes the next step's tokens (spec.c). Also the replica's start-up: the model, the KV
 * cache sized from its budget, the scheduler.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/serve/lockstep.h"
#include "engine/serve/replica.h"
#include "engine/shard/kv.h"
#include "kernels/gemm.h"

int dps_replica_send_up(struct replica *R, const void *msg, size_t len)
{
	return dps_ring_push(&R->w->to_sup, msg, len, 0);
}

int dps_replica_flush_tokens(struct replica *R)
{
	int rc = 0;

	if (R->out->h.count) {
		R->out->h.type = M_TOKENS;
		rc = dps_replica_send_up(R, R->out, sizeof(*R->out) + R->out->h.count * sizeof(struct m_tok));
		R->out->h.count = 0;
	}
	if (R->out_lp->h.count) {
		int lp_rc;

		R->out_lp->h.type = M_TOKENS_LP;
		lp_rc = dps_replica_send_up(R, R->out_lp, sizeof(*R->out_lp) +
					      R->out_lp->h.count * sizeof(struct m_tok_lp));
		/* Sent even when the first failed; the first error is the one returned (OR-ing
		 * two -errno values makes a code that is neither). */
		rc = rc ? rc : lp_rc;
		R->out_lp->h.count = 0;
	}
	return rc;
}

static void on_emit(void *arg, struct dps_req *r, int token)
{
	struct replica *R = arg;

	if (r->p.want_logprobs) {
		if (R->out_lp->h.count == TOKS_LP)
			dps_replica_flush_tokens(R);
		R->out_lp->t[R->out_lp->h.count].id = (int64_t)r->id;
		R->out_lp->t[R->out_lp->h.count].lp = r->lp;
		R->out_lp->h.count++;
		return;
	}
	if (R->out->h.count == TOKS)
		dps_replica_flush_tokens(R);
	R->out->t[R->out->h.count].id = (int64_t)r->id;
	R->out->t[R->out->h.count].token = token;
	R->out->h.count++;
}

static void on_done(void *arg, struct dps_req *r)
{
	struct replica *R = arg;
	struct m_done d = { { M_DONE, 0, (int64_t)r->id }, (int32_t)r->finish,
			    r->n_ids - r->n_prompt, r->t_scheduled };

	dps_replica_flush_tokens(R);
	dps_replica_send_up(R, &d, sizeof(d));
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
	struct m_done d = { { M_DONE, 0, id }, DPS_FINISH_ERROR, 0, 0 };

	dps_replica_send_up(R, &d, sizeof(d));
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
	case M_CANCEL:
	case M_RELEASE: {
		struct dps_req *r = find_req(&R->s, h.id);

		if (r && h.type == M_CANCEL)
			dps_sched_cancel(&R->s, r);
		else if ((r = dps_sched_handoff_find(&R->s, (uint64_t)h.id)))
			dps_sched_release(&R->s, r); /* adopted, or ended before its pull */
		return;
	}
	case M_ADOPT: {
		const struct m_adopt *m = buf;

		if (R->pend.ids)
			reject(R, R->pend.id);
		free(R->pend.ids);
		memset(&R->pend, 0, sizeof(R->pend));
		if (len < sizeof(*m) || !R->decode_only || m->n_ids < 2 || m->n_src < 1 ||
		    m->n_ids > R->s.cfg.max_model_len || m->n_src > R->bpr || h.count > ADOPT_INTS ||
		    (int)h.count > m->n_ids + m->n_src ||
		    len < sizeof(*m) + h.count * sizeof(int32_t)) {
			reject(R, h.id);
			return;
		}
		R->pend.ids = malloc(sizeof(int) * (size_t)(m->n_ids + m->n_src));
		if (!R->pend.ids) {
			reject(R, h.id);
			return;
		}
		R->pend = (struct pending){ h.id, m->p, R->pend.ids, m->n_ids + m->n_src,
					    (int)h.count, 1, m->n_ids, m->n_prompt, m->n_src,
					    m->src_replica, m->plp_next, m->rng, m->t_scheduled };
		memcpy(R->pend.ids, m->ids, sizeof(int) * h.count);
		break;
	}
	case M_STOP:
		R->stop = 1;
		return;
	default: /* M_WAKE: nothing to do but run the loop */
		return;
	}
	if (R->pend.ids && R->pend.have == R->pend.n) {
		int bad = 0;

		const int n_tok = R->pend.adopt ? R->pend.n_ids : R->pend.n;

		for (int i = 0; i < n_tok; i++)
			bad |= R->pend.ids[i] < 0 || R->pend.ids[i] >= R->m.cfg.vocab_size;
		for (int i = n_tok; i < R->pend.n; i++) /* source blocks: checked by the pull */
			bad |= R->pend.ids[i] < 0;
		for (int i = 0; i < R->pend.p.n_bias && i < DPS_MAX_BIAS; i++)
			bad |= R->pend.p.bias[i].id < 0 || R->pend.p.bias[i].id >= R->m.cfg.vocab_size;
		if (R->pend.adopt) {
			bad |= !dps_replica_adopt_ok(R, R->pend.src_replica, R->pend.ids + n_tok,
						     R->pend.n_src);
			if (bad || !dps_sched_adopt(&R->s, (uint64_t)R->pend.id, R->pend.ids, n_tok,
						    R->pend.n_prompt, &R->pend.p, &R->pend.rng,
						    R->pend.plp_next, R->pend.t_scheduled,
						    R->pend.src_replica, R->pend.ids + n_tok,
						    R->pend.n_src, &rc))
				reject(R, R->pend.id);
		} else if (bad || !dps_sched_add(&R->s, (uint64_t)R->pend.id, R->pend.ids,
						 R->pend.n, &R->pend.p, &rc)) {
			reject(R, R->pend.id);
		}
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
	m->replica = R->replica;
	m->st = R->st;
	m->st.preemptions = R->s.preemptions;
	m->st.free_blocks = (uint64_t)R->s.kv.n_free;
	m->st.running = (uint64_t)R->s.n_running;
	m->st.waiting = (uint64_t)R->s.n_waiting;
	m->st.handoff_held = (uint64_t)R->s.n_handoff;
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
		const int lr = w->rank - lay->set_base[si]; /* in the set's part */
		const int ci = lr >= 0 && lr < w->world && lay->set_base[si] == w->base
				       ? lay->set_comm[si][gs->group_of[lr]] : -1;
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

void dps_replica_put_table(const struct replica *R, int *tables, int nt, const struct dps_req *r)
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
		dps_replica_put_table(R, R->tables, nt, b->req[i]);
		R->tix[i] = nt++;
	}
	hdr[H_TABLES] = nt;
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
			PUT(R->pulls, sizeof(int) * (size_t)hdr[H_PULLS_LEN]);
		}
#undef PUT
		return dps_replica_wire_push(R, off);
	}
	/* A peer: the first message says how many bytes follow. */
	rc = dps_replica_wire_pop(R, sizeof(uint32_t) + sizeof(int) * H_LEN, &total);
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
		if (hdr[H_PULLS_LEN] < 0 || hdr[H_PULLS_LEN] > R->pulls_len)
			return -EPROTO;
		GET(R->pulls, sizeof(int) * (size_t)hdr[H_PULLS_LEN]);
	}
#undef GET
	return 0;
}

static int run_rows(struct replica *R, int prefill, int n, float **logits)
{
	struct dps_rows rows;
	int rc = 0;

	dps_replica_fault_maybe_spin(R);
	rc = dps_replica_fault_maybe_wait(R);
	if (rc)
		return rc;
	for (int i = 0; i < n; i++)
		R->table[i] = R->tix[i] >= 0 ? R->tables + (size_t)R->tix[i] * (size_t)R->bpr : NULL;
	rows = (struct dps_rows){ n, R->tokens, R->pos, R->slot, (const int *const *)R->table,
				  R->want };
	*logits = (float *)dps_shard_step_rows(&R->m, prefill, &rows, &rc);
	dps_work(); /* a step done (also one with no layer: the supervisor's stall rule) */
	R->st.steps++;
	if (prefill)
		R->st.prefill_steps++;
	else
		R->st.decode_steps++;
	return *logits ? 0 : rc;
}

void dps_replica_describe(const struct dps_shard *s, const struct dps_world *w)
{
	char line[1024];
	size_t len = 0, total = 0;

	for (int p = 0; p < DPS_PART_COUNT; p++)
		total += s->bytes[p];
	len += (size_t)snprintf(line + len, sizeof(line) - len, "rank %d (%s %d, TP %d): %.2f MB "
				"of weights (linear weights %s):", w->rank,
				w->role == DPS_ROLE_PREFILL ? "prefill replica" : "DP", w->dp_rank,
				w->tp_rank, (double)total / 1e6, dps_wtype_name(s->wt));
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
	R->prefill = w->role == DPS_ROLE_PREFILL;
	R->decode_only = w->role == DPS_ROLE_DECODE && w->lay->groups.prefill;
	R->replica = R->prefill ? w->lay->groups.cfg.dp + w->dp_rank : w->dp_rank;
	if (R->prefill && !w->kv_share) {
		fprintf(stderr, "rank %d: a prefill rank without the instance's KV share\n",
			w->rank);
		return -EINVAL;
	}
	rc = dps_replica_fault_parse(R);
	if (rc)
		return rc;
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
	budget = dps_kv_budget(o->kv_cache_memory, o->kv_fraction, w->total);
	if (R->prefill && budget > w->kv_stride - 3 * 4096) /* its caches live in the KV share */
		budget = w->kv_stride - 3 * 4096;
	sc.handoff = R->prefill;
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
		size_t tkv, dkv;

		rc = dps_model_config_load(o->spec_model, &dc, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "rank %d: --speculative-model: %s\n", w->rank, err);
			return rc;
		}
		/* Per rank: a TP position holds ceil(KV heads / TP) of each (at least one). */
		tkv = (size_t)cfg.num_hidden_layers * (size_t)cfg.head_dim *
		      (size_t)((cfg.num_key_value_heads + w->tp - 1) / w->tp);
		dkv = (size_t)dc.head_dim * (size_t)((dc.num_key_value_heads + w->tp - 1) / w->tp);
		budget = dps_kv_budget_share(budget, tkv, dkv);
	}
	rows = dps_engine_max_rows(o); /* as dps_engine_window_bytes sized the windows */
	rc = dps_shard_load(&R->m, w, &w->part->cfg, o->model,
			    &(struct dps_shard_opts){ .max_pos = max_len, .max_seqs = 1,
						      .max_rows = rows, .block_size = sc.block_size,
						      .dtype = o->dtype, .quant = o->quant,
						      .kv_bytes = budget,
						      .decode_only = R->decode_only,
						      .with_draft = o->spec_model != NULL,
						      .cache_mem = R->prefill
								   ? w->kv_share + (size_t)(w->rank - w->base) *
										   w->kv_stride
								   : NULL,
						      .cache_cap = R->prefill ? w->kv_stride : 0,
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
		dps_replica_describe(&R->m, w);
	if (R->spec_k) {
		rc = dps_spec_load(R, max_len, rows, sc.block_size);
		if (rc)
			return rc;
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
			fprintf(stderr, "%sreplica %d: %d KV blocks of %d positions (%.1f MB per rank), "
					"max %d sequences, %d tokens per step, buckets up to %d\n",
				R->prefill ? "prefill " : "", w->dp_rank, sc.num_blocks, sc.block_size,
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
	R->out_lp = calloc(1, MSG_BYTES);
	/* A step's rows or the draft's catch-up rows (one more int each). */
	/* a step's pulls: at most one a sequence, 4 ints and two tables each */
	R->pulls_len = R->decode_only ? sc.max_num_seqs * (4 + 2 * R->bpr) : 0;
	R->pulls = calloc((size_t)R->pulls_len + 1, sizeof(int));
	R->wire_cap = sizeof(uint32_t) + sizeof(int) * (H_LEN + 3) +
		      (size_t)rows * (5 * sizeof(int) + 1) +
		      sizeof(int) * (size_t)(sc.max_num_seqs + 1) * (size_t)R->bpr +
		      sizeof(int) * (size_t)R->pulls_len;
	R->wire = malloc(R->wire_cap + MSG_BYTES);
	R->scratch = calloc((size_t)R->m.cfg.vocab_size, sizeof(int));
	if (!R->tokens || !R->pos || !R->slot || !R->tix || !R->want || !R->table || !R->tables ||
	    !R->pulls ||
	    !R->out || !R->out_lp || !R->scratch || !R->wire)
		return -ENOMEM;
	if (R->spec_k && dps_spec_alloc(R, rows, sc.max_num_seqs))
		return -ENOMEM;
	return 0;
}

static void replica_free(struct replica *R)
{
	if (R->tp0)
		dps_sched_free(&R->s);
	dps_shard_free(&R->m);
	dps_spec_free(R);
	free(R->pend.ids);
	free(R->tokens);
	free(R->pos);
	free(R->slot);
	free(R->tix);
	free(R->want);
	free(R->table);
	free(R->tables);
	free(R->out);
	free(R->out_lp);
	free(R->wire);
	free(R->scratch);
	free(R->pulls);
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
		/* (count: whether the replicas step together, for the client's hung-rank rule) */
		const struct m_hdr m = { M_READY, (uint32_t)R.coupled, w->rank };

		for (int i = 0; i < w->lay->n_comms; i++)
			w->comms[i].timing = 1;
		rc = dps_replica_send_up(&R, &m, sizeof(m));
	}
	while (!rc) {
		int hdr[H_LEN] = { 0 }, prefill, n;
		float *logits = NULL;

		dps_beat(); /* each turn says it is alive; only steps are work (shm/wait.h) */
		/* A busy uncoupled replica may never wait: it must see a peer's failure here, or it
		 * runs on until the supervisor's grace period ends and it is killed. */
		if (dps_abort_raised(&w->ctl->abort)) {
			rc = -DPS_EABORT;
			break;
		}
		if (R.tp0) {
			const uint64_t now = dps_now_ns();

			if (now - last_stats >= (uint64_t)DPS_ENGINE_STATS_MS * 1000000ull) {
				struct m_stats m;

				last_stats = now;
				fill_stats(&R, &m, 0);
				rc = dps_replica_send_up(&R, &m, sizeof(m));
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
			if (n) {
				pack(&R, hdr);
				dps_replica_pack_pulls(&R, hdr);
			}
		}
		rc = publish_rows(&R, hdr);
		if (!rc && hdr[H_PULLS])
			rc = dps_replica_run_pulls(&R, hdr);
		if (rc)
			break;
		/* a decode-only replica runs every step, recomputation too, on the decode graph */
		prefill = hdr[H_PREFILL] && !R.decode_only;
		n = hdr[H_ROWS];
		if (R.coupled) {
			const struct dps_dp_say say = { n, prefill, hdr[H_UNFINISHED] || n,
							hdr[H_CMD] == 2 };
			struct dps_dp_plan plan;

			rc = dps_lockstep_get_dp_padding(w->dp_c, w->dp, w->dp_rank, &say, agree,
							 &plan);
			R.st.dp_allreduces += (uint64_t)plan.reduced;
			if (rc)
				break;
			if (plan.all_stop)
				break;
			if (!plan.any_work) {
				/* Everything idle: sleep until the client wakes every replica, unless a
				 * message (a wake-up) came in since this agreement began. */
				if (R.tp0 && !R.took)
					rc = poll_client(&R, 200000000ull);
				R.took = 0;
				continue;
			}
			R.took = 0;
			prefill = plan.any_prefill;
			if (prefill)
				n = hdr[H_REAL]; /* prefill is not bucketed: drop the bucket's padding */
			if (!prefill) {
				/* The decode graph on the largest batch; an idle replica's is a dummy. */
				if (!n && plan.max_rows)
					R.st.dummy_steps++;
				R.st.padded_rows += (uint64_t)(plan.max_rows - hdr[H_REAL]);
				dps_lockstep_pad_rows(R.tokens, R.pos, R.slot, R.tix, R.want,
						      R.zero_table, n, plan.max_rows);
				n = plan.max_rows;
			}
		} else {
			if (hdr[H_CMD] == 2)
				break;
		}
		if (!n && !prefill) {
			/* Nothing to run: still report requests that ended (cancelled, timed out). */
			if (R.tp0) {
				dps_sched_update(&R.s, NULL, 0, -1, R.scratch, on_emit, on_done, &R);
				rc = dps_replica_flush_tokens(&R);
			}
			if (!rc && R.tp0 && !R.coupled && R.s.n_handoff && dps_sched_pending(&R.s)) {
				/* A prefill replica whose blocks all wait for the decode side to pull
				 * them: it waits for a release on its ring rather than spinning, and
				 * that wait is the protocol's progress, not a hang (the decode side is
				 * watched on its own). */
				rc = poll_client(&R, 20000000ull);
				dps_work();
			}
			continue;
		}
		if (!R.coupled && !prefill)
			R.st.padded_rows += (uint64_t)(n - hdr[H_REAL]);
		rc = run_rows(&R, prefill, n, &logits);
		if (rc)
			break;
		/* The step's collectives came after every peer's pulls: the prefill replica may
		 * have the blocks back. */
		for (int i = 0; R.tp0 && i < hdr[H_PULLS] && !rc; i++) {
			const struct m_hdr m = { M_PULLED, 0, (int64_t)R.s.b.pulls[i]->id };

			rc = dps_replica_send_up(&R, &m, sizeof(m));
		}
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
			rc = dps_replica_flush_tokens(&R);
		if (!rc && R.spec_k)
			rc = dps_spec_draft_passes(&R);
		/* (after the draft's catch-up: its KV of the handed-over positions goes too) */
		if (!rc && R.tp0 && R.prefill)
			rc = dps_replica_announce_handoffs(&R);
	}
	if (R.tp0 && !rc) {
		struct m_stats m;

		fill_stats(&R, &m, 1);
		dps_replica_send_up(&R, &m, sizeof(m));
	}
	replica_free(&R);
	free(agree);
	return rc;
}

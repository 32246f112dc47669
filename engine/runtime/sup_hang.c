/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/sup_hang.c - the supervisor's progress check (supervisor.h, "hung ranks";
 * docs/DESIGN.md section 1) and how it names ranks.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/hang.h"
#include "engine/runtime/sup_int.h"

void dps_sup_describe_rank(const struct sup *s, int r, char *buf, size_t len)
{
	const struct dps_groups *g = &s->lay.groups;

	if (r >= g->world) {
		const int q = r - g->world, ptp = g->prefill->cfg.tp;

		snprintf(buf, len, "rank %d (prefill replica %d, TP %d)", r, q / ptp, q % ptp);
		return;
	}
	snprintf(buf, len, "rank %d (DP %d, TP %d)", r, r / g->cfg.tp, r % g->cfg.tp);
}

/*
 * The ranks a stalled rank r may wait for, [*lo, *hi): its replica's, or every decode rank's
 * when the decode replicas step together (a prefill replica never waits for another).
 */
static void rank_domain(const struct sup *s, int r, int all, int *lo, int *hi)
{
	const struct dps_groups *g = &s->lay.groups;

	if (r >= g->world) {
		const int ptp = g->prefill->cfg.tp;

		*lo = g->world + (r - g->world) / ptp * ptp;
		*hi = *lo + ptp;
	} else if (all) {
		*lo = 0;
		*hi = g->world;
	} else {
		*lo = r / g->cfg.tp * g->cfg.tp;
		*hi = *lo + g->cfg.tp;
	}
}

/*
 * The progress check (on the loop's timer), over two words per rank (struct dps_beat). A rank
 * expected to progress whose work word has not moved for rank_timeout_ms is stalled. Among
 * the stalled, one whose alive word stopped too (for a quarter of the timeout, at least 4 wait
 * slices: a waiting rank beats every slice) is stopped or stuck: it fails like a dead rank,
 * killed at once (SIGKILL also ends a stopped process; a spinning one would never notice the
 * abort). When every stalled rank is still alive they all wait, for each other or for
 * something that never comes (a lost wake-up, mismatched collectives): a deadlock, named with
 * every stalled rank, and failed the same way (the abort word ends their waits). Returns the
 * ms until the next check.
 */
int dps_sup_check_hung(struct sup *s, char *err, size_t errlen)
{
	const uint64_t limit = (uint64_t)s->o->rank_timeout_ms * 1000000ull;
	const uint64_t slices = 4ull * DPS_WAIT_SLICE_MS * 1000000ull;
	const uint64_t alive_limit = limit / 4 > slices ? limit / 4 : slices;
	const uint64_t now = dps_now_ns();
	unsigned period = s->o->rank_timeout_ms / 8;
	int first = -1, n_stalled = 0;
	uint64_t stalled_for = 0;
	size_t len;

	period = period < 20 ? 20 : period > 1000 ? 1000 : period;
	/*
	 * Only time the supervisor watched counts: after a gap in its own loop (it was stopped,
	 * or starved of CPU) every clock starts again rather than blaming the ranks for it.
	 */
	if (s->hang_checked && now - s->hang_checked > limit / 2)
		for (int r = 0; r < s->lay.world; r++)
			s->hang[r].since_ns = s->beats[r].since_ns = 0;
	s->hang_checked = now;
	/* This process's ranks; on node 0 under mpirun every rank, the others' from the words
	 * their nodes send (the caller's pending_fn, which says who must progress, is here). */
	for (int r = 0; r < s->lay.world; r++) {
		const int here = sup_hosts(s, r);
		uint64_t work, alive;
		uint32_t busy;
		int expected;

		if (here) {
			const struct dps_beat *b = &sup_ctl(s, r)->beat[r];

			work = atomic_load_explicit(&b->work, memory_order_relaxed);
			alive = atomic_load_explicit(&b->count, memory_order_relaxed);
			busy = atomic_load_explicit(&b->busy, memory_order_relaxed);
		} else if (!s->link || s->node != 0 ||
			   s->xops->beat(s->link, r, &work, &alive, &busy)) {
			continue;
		}
		expected = (here ? s->pids[r] > 0 : 1) &&
			   (busy || (s->o->pending_fn && s->node <= 0 &&
				     s->o->pending_fn(r, s->o->msg_arg)));
		const uint64_t stuck = dps_hang_watch_check(&s->hang[r], work, expected, now);
		const uint64_t silent = dps_hang_watch_check(&s->beats[r], alive, expected, now);
		char who[64];

		s->stalled[r] = !expected ? 0 : stuck < limit ? 1 : 2;
		if (s->stalled[r] != 2 || silent < alive_limit) {
			s->ran_ns[r] = 0;
			continue;
		}
		/* (a rank on another node: its CPU time is not known here) */
		if (here && !dps_rank_silence_is_its_own(s->pids[r], &s->ran_ns[r])) {
			/* Starved of CPU (or not yet known): judged again at the next check,
			 * and until then counted as working, which no one waiting for it is
			 * blamed for. */
			s->stalled[r] = 1;
			continue;
		}
		dps_sup_describe_rank(s, r, who, sizeof(who));
		{
			char where[48];

			if (here)
				snprintf(where, sizeof(where), "pid %ld", (long)s->pids[r]);
			else
				snprintf(where, sizeof(where), "on node %d",
					 dps_layout_node_of(&s->lay, r));
			snprintf(err, errlen, "%s, %s, made no progress for %.1f s with work "
				 "pending (the rank timeout is %.1f s): it is hung", who, where,
				 (double)stuck / 1e9, (double)s->o->rank_timeout_ms / 1e3);
		}
		s->res->hung_ms = stuck / 1000000ull;
		s->hung_rank = r;
		if (here)
			kill(s->pids[r], SIGKILL);
		else
			s->xops->kill(s->link, r);
		dps_sup_fail(s, r, err);
		return (int)period;
	}
	/*
	 * Every stalled rank still beats: they wait. For a working peer they may (a replica in
	 * lockstep behind another one's long prefill): a stalled rank whose domain (every rank
	 * when the replicas step together, else its replica) holds a rank that works is left
	 * alone. The rest wait for each other, or for something that never comes.
	 */
	for (int r = 0; r < s->lay.world; r++) {
		const int all = !s->o->coupled_fn || s->o->coupled_fn(s->o->msg_arg);
		const uint64_t stuck = s->hang[r].since_ns ? now - s->hang[r].since_ns : 0;
		int working = 0, lo, hi;

		rank_domain(s, r, all, &lo, &hi);
		if (s->stalled[r] != 2)
			continue;
		/* (a node other than 0 does not see the other nodes' ranks work: node 0 judges
		 * a domain that spans nodes) */
		if (s->node > 0 && (lo < s->lo || hi > s->hi))
			continue;
		for (int q = lo; q < hi && !working; q++)
			working = s->stalled[q] == 1;
		if (working)
			continue;
		s->stalled[r] = 3; /* one of the deadlocked */
		if (first < 0)
			first = r;
		n_stalled++;
		stalled_for = stuck > stalled_for ? stuck : stalled_for;
	}
	if (first < 0)
		return (int)period;
	len = (size_t)snprintf(err, errlen, "rank%s", n_stalled > 1 ? "s" : "");
	for (int r = first, k = 0; r < s->lay.world && len < errlen; r++) {
		char who[64];

		if (s->stalled[r] != 3)
			continue;
		dps_sup_describe_rank(s, r, who, sizeof(who));
		len += (size_t)snprintf(err + len, errlen - len, "%s %s", k++ ? "," : "",
					who + strlen("rank "));
	}
	if (len < errlen)
		snprintf(err + len, errlen - len, " made no progress for %.1f s while waiting, with "
			 "work pending (the rank timeout is %.1f s): deadlock",
			 (double)stalled_for / 1e9, (double)s->o->rank_timeout_ms / 1e3);
	s->res->hung_ms = stalled_for / 1000000ull;
	s->res->deadlock = n_stalled;
	dps_sup_fail(s, first, err);
	return (int)period;
}


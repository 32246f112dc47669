/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/supervisor.c - the rank supervisor of supervisor.h. One call per instance: set-up,
 * fork, an io_uring loop over polls of the pidfds, the eventfd and the signalfd (and whatever
 * else the caller runs on the ring), and tear-down; on the loop's timer, the check of the
 * ranks' heartbeats. Only this file and main() decide that processes end.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/runtime/hang.h"
#include "engine/runtime/placement.h"
#include "engine/runtime/supervisor.h"
#include "engine/runtime/topo.h"
#include "shm/seg.h"

struct sup {
	const struct dps_sup_opts *o;
	struct dps_sup_result *res;
	struct dps_layout lay;
	struct dps_placement place;
	struct dps_topo topo;
	struct dps_seg seg;
	char *kv_share;          /* opts.kv_share_bytes for each prefill rank, or NULL */
	size_t kv_share_len;
	struct dps_ctl *ctl;
	struct dps_ring *to_sup; /* (world) supervisor's reader handles */
	struct dps_ring *from_sup; /* (world) supervisor's writer handles */
	pid_t *pids;             /* (world), 0 once reaped */
	int *pidfds;             /* (world) */
	int evfd, sigfd;
	sigset_t oldmask;
	int alive;
	uint64_t abort_deadline; /* 0 until the abort is raised */
	uint64_t early_deadline; /* a rank exited 0 while others ran: they must follow by then */
	int early_rank;          /* that rank */
	int kill_sent;
	unsigned ncpus;
	struct io_uring own, *ring;  /* the loop's ring: the caller's or own */
	unsigned char *armed;        /* (world + 2): a poll is in flight for evfd, sigfd, pidfd r */
	int n_armed;
	uint64_t gen;                /* this run's number, in the user_data of its polls */
	struct dps_hang_watch *hang; /* (world) each rank's work word */
	struct dps_hang_watch *beats; /* (world) each rank's alive word */
	unsigned char *stalled;      /* (world) at the last check: 0 not expected to progress, 1
				      * progressing, 2 stalled (work stopped for the timeout), 3
				      * stalled and deadlocked */
	uint64_t *ran_ns;            /* (world) a silent rank's CPU time when its silence was
				      * first long enough to judge, plus one (0: not sampled) */
	uint64_t hang_checked;       /* when the heartbeats were last checked (0: never) */
	int hung_rank;               /* the rank killed for hanging, or -1 */
};

/* The instance this process supervises, for dps_sup_send (one at a time per process). */
static struct sup *active;

int dps_sup_send(int rank, const void *msg, size_t len)
{
	int rc;

	if (!active || rank < 0 || rank >= active->lay.world)
		return -ESRCH;
	rc = dps_ring_push(&active->from_sup[rank], msg, len, 1);
	return rc == -ETIMEDOUT ? -EAGAIN : rc;
}

int dps_sup_rank_pids(int *pids, int max)
{
	int n = 0;

	for (; active && n < max && n < active->lay.world; n++)
		pids[n] = (int)active->pids[n];
	return n;
}

void dps_sup_stop(int signo)
{
	if (!active)
		return;
	if (!active->res->stop_signal && active->res->failed_rank < 0) {
		active->res->stop_signal = signo;
		dps_info("stopping the ranks (%s)", strsignal(signo));
	}
	if (!active->abort_deadline) {
		unsigned grace = active->o->grace_ms ? active->o->grace_ms : 3000;

		dps_abort_raise(&active->ctl->abort);
		active->abort_deadline = dps_now_ns() + (uint64_t)grace * 1000000ull;
	}
}

static int pidfd_open_compat(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

static void describe_rank(const struct sup *s, int r, char *buf, size_t len)
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

/* ---- the rank side ------------------------------------------------------------------------ */

static void __attribute__((noreturn)) rank_main(struct sup *s, int r, pid_t sup_pid)
{
	struct dps_wait_policy pol;
	struct dps_world w;
	char role[32];
	int rc;

	/* Never outlive the supervisor; close the race where it died before prctl. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != sup_pid)
		_exit(DPS_EXIT_ABORTED);
	/* Ctrl-C reaches the whole process group: the supervisor alone decides. */
	signal(SIGINT, SIG_IGN);
	sigprocmask(SIG_SETMASK, &s->oldmask, NULL);
	{
		/* (the caller may have blocked them for itself: a rank takes TERM and HUP) */
		sigset_t m;

		sigemptyset(&m);
		sigaddset(&m, SIGTERM);
		sigaddset(&m, SIGHUP);
		sigaddset(&m, SIGINT);
		sigprocmask(SIG_UNBLOCK, &m, NULL);
	}
	close(s->sigfd);
	for (int i = 0; i < r; i++)
		close(s->pidfds[i]);
	/* The caller's descriptors (listening sockets, connections) are not the rank's. */
	if (s->o->child_fn)
		s->o->child_fn(s->o->msg_arg);
	if (s->ring == &s->own)
		io_uring_queue_exit(&s->own);
	snprintf(role, sizeof(role), "rank %d", r);
	dps_log_set_role(role);

	rc = dps_place_apply(&s->place.ranks[r]);
	if (rc)
		dps_warn("could not apply placement: %s (running unpinned)", dps_strerror(rc));
	dps_wait_policy_for((unsigned)s->lay.world, s->ncpus, &pol);
	dps_wait_set_policy(&pol);

	rc = dps_world_attach(&w, &s->lay, s->seg.base, r, s->evfd);
	if (rc) {
		dps_error("cannot attach to the instance: %s", dps_strerror(rc));
		_exit(1);
	}
	w.ncpus = s->place.ranks[r].n_cpus ? (unsigned)s->place.ranks[r].n_cpus : s->ncpus;
	/* Where all-reduce leaves one-shot depends on whether the ranks share cores. */
	dps_world_set_algo(&w, dps_coll_oneshot_default((unsigned)s->lay.world, s->ncpus),
			   DPS_ALGO_AUTO);
	w.kv_share = s->kv_share;
	w.kv_stride = s->kv_share ? s->o->kv_share_bytes : 0;
	/* Every wait of this process from now on says that it is alive (shm/wait.h). */
	dps_wait_set_beat(&w.beat->count, &w.beat->work);
	rc = s->o->rank_fn(&w, s->o->rank_arg);
	dps_world_detach(&w);
	fflush(NULL);
	if (rc == -DPS_EABORT)
		_exit(DPS_EXIT_ABORTED);
	if (rc)
		dps_error("failed: %s", dps_strerror(rc));
	_exit(rc ? 1 : 0);
}

/* ---- the supervisor side ------------------------------------------------------------------ */

static void sup_raise_abort(struct sup *s)
{
	unsigned grace = s->o->grace_ms ? s->o->grace_ms : 3000;

	if (s->abort_deadline)
		return;
	dps_abort_raise(&s->ctl->abort);
	s->abort_deadline = dps_now_ns() + (uint64_t)grace * 1000000ull;
}

/*
 * Rank r failed as err says (the first failure of the run): recorded, logged, the others
 * aborted, the caller told. Every kind of failure (death, early exit, hang) goes through here.
 */
static void sup_fail(struct sup *s, int r, const char *err)
{
	s->res->failed_rank = r;
	s->res->failed_ns = dps_now_ns();
	dps_error("%s; stopping the other ranks", err);
	sup_raise_abort(s);
	if (s->o->fail_fn)
		s->o->fail_fn(err, s->o->msg_arg);
}

static void sup_drain(struct sup *s)
{
	unsigned char buf[4096];
	uint64_t cnt;
	size_t len;

	if (read(s->evfd, &cnt, sizeof(cnt)) < 0) {
		/* EAGAIN: nothing signalled; the rings are drained anyway */
	}
	for (int r = 0; r < s->lay.world; r++) {
		int rc;

		while ((rc = dps_ring_trypop(&s->to_sup[r], 0, buf, sizeof(buf), &len)) != -EAGAIN) {
			if (rc) {
				dps_warn("dropped a message from rank %d: %s", r, dps_strerror(rc));
				continue;
			}
			if (s->o->msg_fn)
				s->o->msg_fn(r, buf, len, s->o->msg_arg);
		}
	}
}

static void sup_reap(struct sup *s, int r, char *err, size_t errlen)
{
	char who[64];
	int st;

	if (waitpid(s->pids[r], &st, WNOHANG) != s->pids[r])
		return;
	s->pids[r] = 0;
	close(s->pidfds[r]);
	s->pidfds[r] = -1;
	s->alive--;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		/*
		 * A clean exit is normal when every rank finishes; the others must follow soon,
		 * or they are waiting for it in a collective that can never complete.
		 */
		if (s->alive > 0 && !s->early_deadline) {
			unsigned grace = s->o->grace_ms ? s->o->grace_ms : 3000;

			s->early_deadline = dps_now_ns() + (uint64_t)grace * 1000000ull;
			s->early_rank = r;
		}
		return;
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) == DPS_EXIT_ABORTED && s->abort_deadline)
		return; /* stopped because we asked it to */
	if (r == s->hung_rank)
		return; /* killed by us for hanging: already reported */
	describe_rank(s, r, who, sizeof(who));
	if (s->res->failed_rank < 0 && !s->res->stop_signal) {
		if (WIFSIGNALED(st)) {
			s->res->failed_signal = WTERMSIG(st);
			snprintf(err, errlen, "%s was killed by signal %d (%s)", who, WTERMSIG(st),
				 strsignal(WTERMSIG(st)));
		} else {
			s->res->failed_status = WEXITSTATUS(st);
			snprintf(err, errlen, "%s exited with status %d", who, WEXITSTATUS(st));
		}
		sup_fail(s, r, err);
	} else if (WIFSIGNALED(st)) {
		dps_warn("%s was killed by signal %d (%s)", who, WTERMSIG(st), strsignal(WTERMSIG(st)));
	}
}

static void sup_kill_all(struct sup *s)
{
	if (s->kill_sent)
		return;
	s->kill_sent = 1;
	for (int r = 0; r < s->lay.world; r++)
		if (s->pids[r] > 0) {
			kill(s->pids[r], SIGKILL);
			s->res->killed++;
		}
}

/* The ranks still running long after one exited cleanly: name it and stop them. */
static void sup_check_early(struct sup *s, char *err, size_t errlen)
{
	char who[64];

	if (!s->early_deadline || s->abort_deadline || dps_now_ns() < s->early_deadline)
		return;
	describe_rank(s, s->early_rank, who, sizeof(who));
	s->res->failed_status = 0;
	snprintf(err, errlen, "%s exited while %d other rank(s) kept running", who, s->alive);
	sup_fail(s, s->early_rank, err);
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
static int sup_check_hung(struct sup *s, char *err, size_t errlen)
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
	for (int r = 0; r < s->lay.world; r++) {
		const struct dps_beat *b = &s->ctl->beat[r];
		const uint64_t work = atomic_load_explicit(&b->work, memory_order_relaxed);
		const uint64_t alive = atomic_load_explicit(&b->count, memory_order_relaxed);
		const int expected = s->pids[r] > 0 &&
				     (atomic_load_explicit(&b->busy, memory_order_relaxed) ||
				      (s->o->pending_fn && s->o->pending_fn(r, s->o->msg_arg)));
		const uint64_t stuck = dps_hang_watch_check(&s->hang[r], work, expected, now);
		const uint64_t silent = dps_hang_watch_check(&s->beats[r], alive, expected, now);
		char who[64];

		s->stalled[r] = !expected ? 0 : stuck < limit ? 1 : 2;
		if (s->stalled[r] != 2 || silent < alive_limit) {
			s->ran_ns[r] = 0;
			continue;
		}
		if (!dps_rank_silence_is_its_own(s->pids[r], &s->ran_ns[r])) {
			/* Starved of CPU (or not yet known): judged again at the next check,
			 * and until then counted as working, which no one waiting for it is
			 * blamed for. */
			s->stalled[r] = 1;
			continue;
		}
		describe_rank(s, r, who, sizeof(who));
		snprintf(err, errlen, "%s, pid %ld, made no progress for %.1f s with work pending "
			 "(the rank timeout is %.1f s): it is hung", who, (long)s->pids[r],
			 (double)stuck / 1e9, (double)s->o->rank_timeout_ms / 1e3);
		s->res->hung_ms = stuck / 1000000ull;
		s->hung_rank = r;
		kill(s->pids[r], SIGKILL);
		sup_fail(s, r, err);
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
		describe_rank(s, r, who, sizeof(who));
		len += (size_t)snprintf(err + len, errlen - len, "%s %s", k++ ? "," : "",
					who + strlen("rank "));
	}
	if (len < errlen)
		snprintf(err + len, errlen - len, " made no progress for %.1f s while waiting, with "
			 "work pending (the rank timeout is %.1f s): deadlock",
			 (double)stalled_for / 1e9, (double)s->o->rank_timeout_ms / 1e3);
	s->res->hung_ms = stalled_for / 1000000ull;
	s->res->deadlock = n_stalled;
	sup_fail(s, first, err);
	return (int)period;
}

/* The descriptor of poll slot i: 0 the eventfd, 1 the signalfd, 2 + r rank r's pidfd. */
static int slot_fd(const struct sup *s, int i)
{
	return i == 0 ? s->evfd : i == 1 ? s->sigfd : s->pidfds[i - 2];
}

static uint64_t slot_udata(const struct sup *s, int i)
{
	return DPS_SUP_UDATA | (s->gen << 32) | (uint64_t)(unsigned)i;
}

static struct io_uring_sqe *get_sqe(struct io_uring *ring)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

	if (!sqe) { /* full: hand what is queued to the kernel, then there is room */
		io_uring_submit(ring);
		sqe = io_uring_get_sqe(ring);
	}
	return sqe;
}

/* Arms a one-shot poll on slot i unless one is in flight or its descriptor is gone. */
static void arm(struct sup *s, int i)
{
	struct io_uring_sqe *sqe;

	if (s->armed[i] || slot_fd(s, i) < 0)
		return;
	sqe = get_sqe(s->ring);
	if (!sqe)
		return; /* retried on the next turn of the loop */
	io_uring_prep_poll_add(sqe, slot_fd(s, i), POLLIN);
	io_uring_sqe_set_data64(sqe, slot_udata(s, i));
	s->armed[i] = 1;
	s->n_armed++;
}

static void on_signal(struct sup *s)
{
	struct signalfd_siginfo si;

	while (read(s->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		const int signo = (int)si.ssi_signo;

		if (s->o->signal_fn && s->o->signal_fn(signo, s->o->msg_arg))
			continue;
		if (signo == SIGHUP)
			continue;
		if (!s->res->stop_signal && s->res->failed_rank < 0) {
			s->res->stop_signal = signo;
			dps_info("received %s, stopping the ranks", strsignal(signo));
		}
		sup_raise_abort(s);
	}
}

/* Handles one completion: the supervisor's (of this run) or the caller's. */
static void on_cqe(struct sup *s, struct io_uring_cqe *cqe, char *err, size_t errlen)
{
	const uint64_t u = io_uring_cqe_get_data64(cqe);
	int i;

	if (!(u & DPS_SUP_UDATA)) {
		if (s->o->cqe_fn)
			s->o->cqe_fn(cqe, s->o->msg_arg);
		return;
	}
	if (((u >> 32) & 0x7fffffffu) != (s->gen & 0x7fffffffu))
		return; /* a poll of an earlier run, cancelled */
	i = (int)(u & 0xffffffffu);
	if (i < 0 || i >= s->lay.world + 2 || !s->armed[i])
		return;
	s->armed[i] = 0;
	s->n_armed--;
	if (i == 0)
		sup_drain(s);
	else if (i == 1)
		on_signal(s);
	else if (s->pidfds[i - 2] >= 0)
		sup_reap(s, i - 2, err, errlen);
}

/* Waits up to timeout ms (-1: no limit) for completions and handles them all. */
static int sup_wait(struct sup *s, int timeout, char *err, size_t errlen)
{
	struct __kernel_timespec ts = { timeout / 1000, (long long)(timeout % 1000) * 1000000 };
	struct io_uring_cqe *cqe;
	int rc;

	rc = io_uring_submit_and_wait_timeout(s->ring, &cqe, 1, timeout >= 0 ? &ts : NULL, NULL);
	if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
		return rc;
	while (io_uring_peek_cqe(s->ring, &cqe) == 0) {
		/* Copied first: a handler may queue more work on the ring. */
		struct io_uring_cqe c = *cqe;

		io_uring_cqe_seen(s->ring, cqe);
		on_cqe(s, &c, err, errlen);
	}
	return 0;
}

static int sup_loop(struct sup *s, char *err, size_t errlen)
{
	const int world = s->lay.world;
	int i, timeout, rc;

	while (s->alive > 0) {
		timeout = -1;
		if (s->o->tick_fn && !s->abort_deadline)
			timeout = s->o->tick_fn(s->o->msg_arg);
		sup_check_early(s, err, errlen);
		/* Once a rank has exited cleanly the run winds down, and the others must follow
		 * by early_deadline: the progress rule no longer applies to them. */
		if (s->o->rank_timeout_ms && !s->abort_deadline && !s->early_deadline &&
		    s->res->failed_rank < 0) {
			const int t = sup_check_hung(s, err, errlen);

			if (!s->abort_deadline)
				timeout = timeout < 0 || t < timeout ? t : timeout;
		}
		if (s->early_deadline && !s->abort_deadline) {
			uint64_t now = dps_now_ns();

			const int t = now >= s->early_deadline
					      ? 0 : (int)((s->early_deadline - now) / 1000000ull) + 1;

			timeout = timeout < 0 || t < timeout ? t : timeout;
		}
		if (s->abort_deadline) {
			uint64_t now = dps_now_ns();

			if (now >= s->abort_deadline) {
				sup_kill_all(s);
				timeout = 100;
			} else {
				timeout = (int)((s->abort_deadline - now) / 1000000ull) + 1;
			}
		}
		for (i = 0; i < world + 2; i++)
			arm(s, i);
		rc = sup_wait(s, timeout, err, errlen);
		if (rc)
			return rc;
	}
	sup_drain(s);
	/* Cancel the polls still in flight (eventfd, signalfd) and wait for their completions. */
	for (i = 0; i < world + 2; i++)
		if (s->armed[i]) {
			struct io_uring_sqe *sqe = get_sqe(s->ring);

			if (sqe) {
				io_uring_prep_poll_remove(sqe, slot_udata(s, i));
				io_uring_sqe_set_data64(sqe, DPS_SUP_UDATA | (s->gen << 32) |
							     0xffffffffu);
			}
		}
	for (int spins = 0; s->n_armed > 0 && spins < 100; spins++)
		if (sup_wait(s, 10, err, errlen))
			break;
	return 0;
}

static int sup_setup(struct sup *s, char *err, size_t errlen)
{
	const struct dps_sup_opts *o = s->o;
	sigset_t mask;
	int rc;

	dps_seg_sweep();
	if (o->par.prefill_dp && !o->roles) {
		/* Its groups are built (`dpshard groups`), the caller's ranks cannot run it. */
		snprintf(err, errlen, "--prefill-data-parallel-size %d: disaggregated prefill is "
			 "not implemented here yet (`dpshard groups` shows the layout); leave it "
			 "unset to run prefill and decode on every rank", o->par.prefill_dp);
		return -DPS_ECONFIG;
	}
	rc = dps_layout_build(&s->lay, &o->par, o->slot_bytes ? o->slot_bytes : DPS_COLL_SLOT_DEFAULT,
			      o->window_bytes, err, errlen);
	if (rc)
		return rc;
	rc = dps_topo_discover(&s->topo);
	if (rc) {
		snprintf(err, errlen, "cannot read the CPU topology: %s", dps_strerror(rc));
		return rc;
	}
	s->ncpus = (unsigned)dps_topo_ncpus(&s->topo);
	rc = dps_place_parse_bind(o->cpu_bind ? o->cpu_bind : "auto", s->lay.world, &s->topo,
				  &s->place, err, errlen);
	if (rc == 1)
		rc = dps_place_compute_parts(&s->topo, o->par.tp, o->par.dp,
					     dps_par_cfg_prefill_tp(&o->par), o->par.prefill_dp,
					     &s->place);
	if (rc < 0) {
		if (!err[0])
			snprintf(err, errlen, "cannot place the ranks: %s", dps_strerror(rc));
		return rc;
	}
	if (o->verbose)
		dps_placement_print_parts(&s->place, o->par.tp, s->lay.groups.world,
					  dps_par_cfg_prefill_tp(&o->par), stderr);
	rc = dps_seg_create(&s->seg, "inst", s->lay.total, err, errlen);
	if (rc)
		return rc;
	dps_layout_init_shm(&s->lay, s->seg.base);
	s->ctl = s->seg.base;
	if (o->kv_share_bytes && s->lay.groups.prefill) {
		const size_t n = (size_t)s->lay.groups.prefill->world;

		/* Anonymous and shared: inherited by the forks, gone with the last of them, and
		 * taken from memory only as the caches are written (as dps_kv_alloc's are). */
		if (dps_size_mul(n, o->kv_share_bytes, &s->kv_share_len)) {
			snprintf(err, errlen, "%zu prefill ranks' KV caches of %zu bytes are too "
				 "large", n, o->kv_share_bytes);
			return -DPS_ETOOBIG;
		}
		s->kv_share = mmap(NULL, s->kv_share_len, PROT_READ | PROT_WRITE,
				   MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (s->kv_share == MAP_FAILED) {
			rc = -errno;
			s->kv_share = NULL;
			snprintf(err, errlen, "cannot map %zu bytes for the prefill ranks' KV caches: "
				 "%s", s->kv_share_len, strerror(-rc));
			return rc;
		}
	}

	s->to_sup = calloc((size_t)s->lay.world, sizeof(*s->to_sup));
	s->from_sup = calloc((size_t)s->lay.world, sizeof(*s->from_sup));
	s->pids = calloc((size_t)s->lay.world, sizeof(*s->pids));
	s->pidfds = malloc(sizeof(*s->pidfds) * (size_t)s->lay.world);
	if (!s->to_sup || !s->from_sup || !s->pids || !s->pidfds)
		return -ENOMEM;
	for (int r = 0; r < s->lay.world; r++) {
		s->pidfds[r] = -1;
		dps_ring_attach(&s->to_sup[r], dps_layout_ring_to_sup(&s->lay, s->seg.base, r),
				&s->ctl->abort, -1);
		dps_ring_attach(&s->from_sup[r], dps_layout_ring_from_sup(&s->lay, s->seg.base, r),
				&s->ctl->abort, -1);
	}
	s->armed = calloc((size_t)s->lay.world + 2, 1);
	s->hang = calloc((size_t)s->lay.world, sizeof(*s->hang));
	s->beats = calloc((size_t)s->lay.world, sizeof(*s->beats));
	s->ran_ns = calloc((size_t)s->lay.world, sizeof(*s->ran_ns));
	s->stalled = calloc((size_t)s->lay.world, 1);
	if (!s->armed || !s->hang || !s->beats || !s->ran_ns || !s->stalled)
		return -ENOMEM;
	if (o->ring) {
		s->ring = o->ring;
	} else {
		rc = io_uring_queue_init((unsigned)(2 * s->lay.world + 64), &s->own, 0);
		if (rc) {
			snprintf(err, errlen, "cannot set up an io_uring: %s", strerror(-rc));
			return rc;
		}
		s->ring = &s->own;
	}
	{
		static uint64_t runs;

		s->gen = ++runs & 0x7fffffffu;
	}
	s->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigprocmask(SIG_BLOCK, &mask, &s->oldmask);
	s->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (s->evfd < 0 || s->sigfd < 0) {
		rc = -errno;
		snprintf(err, errlen, "cannot create event descriptors: %s", strerror(errno));
		return rc;
	}
	return 0;
}

static void sup_teardown(struct sup *s)
{
	if (s->pidfds)
		for (int r = 0; r < s->lay.world; r++)
			if (s->pidfds[r] >= 0)
				close(s->pidfds[r]);
	if (s->sigfd >= 0) {
		close(s->sigfd);
		sigprocmask(SIG_SETMASK, &s->oldmask, NULL);
	}
	if (s->evfd >= 0)
		close(s->evfd);
	if (s->ring == &s->own)
		io_uring_queue_exit(&s->own);
	free(s->armed);
	free(s->hang);
	free(s->beats);
	free(s->ran_ns);
	free(s->stalled);
	free(s->to_sup);
	free(s->from_sup);
	free(s->pids);
	free(s->pidfds);
	dps_seg_destroy(&s->seg);
	if (s->kv_share)
		munmap(s->kv_share, s->kv_share_len);
	s->kv_share = NULL;
	dps_placement_free(&s->place);
	dps_topo_free(&s->topo);
	dps_layout_free(&s->lay);
}

int dps_sup_run(const struct dps_sup_opts *o, struct dps_sup_result *res, char *err,
		size_t errlen)
{
	struct sup s = { .o = o, .res = res, .evfd = -1, .sigfd = -1, .hung_rank = -1 };
	const pid_t me = getpid();
	int rc, r;

	memset(res, 0, sizeof(*res));
	res->failed_rank = -1;
	res->failed_status = -1;
	err[0] = '\0';
	rc = sup_setup(&s, err, errlen);
	if (rc)
		goto out;
	fflush(NULL); /* children must not repeat buffered output */
	for (r = 0; r < s.lay.world; r++) {
		pid_t pid = fork();

		if (pid == 0)
			rank_main(&s, r, me);
		if (pid < 0 || (s.pidfds[r] = pidfd_open_compat(pid)) < 0) {
			rc = -errno;
			snprintf(err, errlen, "cannot start rank %d: %s", r, strerror(errno));
			if (pid > 0) {
				kill(pid, SIGKILL);
				waitpid(pid, NULL, 0);
			}
			sup_raise_abort(&s);
			sup_kill_all(&s);
			for (int i = 0; i < r; i++)
				waitpid(s.pids[i], NULL, 0);
			goto out;
		}
		s.pids[r] = pid;
		s.alive++;
	}
	active = &s;
	rc = sup_loop(&s, err, errlen);
	active = NULL;
	if (!rc) {
		if (res->failed_rank >= 0)
			rc = -DPS_ERANK;
		else if (res->stop_signal)
			rc = -DPS_EABORT;
	}
out:
	sup_teardown(&s);
	return rc;
}

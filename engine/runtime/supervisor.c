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
#include <stdlib.h>
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
#include "engine/runtime/sup_int.h"
#include "engine/runtime/topo.h"
#include "shm/seg.h"

/* The instance this process supervises, for dps_sup_send (one at a time per process). */
static struct sup *active;
/* The node this process was in its last run (0 on one node or hosting them all). */
static int last_node;

int dps_sup_node(void)
{
	return last_node;
}

/* Raises the abort word of every node this process hosts. */
static void sup_abort_hosted(struct sup *s)
{
	for (int k = 0; k < s->lay.nodes; k++)
		if (s->ctls && s->ctls[k])
			dps_abort_raise(&s->ctls[k]->abort);
}

int dps_sup_send(int rank, const void *msg, size_t len)
{
	int rc;

	if (!active || rank < 0 || rank >= active->lay.world)
		return -ESRCH;
	if (!sup_hosts(active, rank))
		return active->link ? active->xops->down(active->link, rank, msg, len) : -ESRCH;
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

/* When the grace period (opts.grace_ms) that starts now ends. */
static uint64_t sup_grace_end(const struct sup *s)
{
	return dps_now_ns() + (uint64_t)(s->o->grace_ms ? s->o->grace_ms : 3000) * 1000000ull;
}

static void sup_raise_abort(struct sup *s)
{
	if (s->abort_deadline)
		return;
	sup_abort_hosted(s);
	s->abort_deadline = sup_grace_end(s);
}

/*
 * Rank r (or, on node 0, the ranks of r's node) ended cleanly while others run: normal when
 * every rank finishes, so the others must follow within the grace period, or they wait for
 * it in a collective that can never complete (sup_check_early).
 */
static void sup_ended_early(struct sup *s, int r)
{
	if ((s->alive > 0 || s->remote_alive > 0) && !s->early_deadline) {
		s->early_deadline = sup_grace_end(s);
		s->early_rank = r;
	}
}

void dps_sup_stop(int signo)
{
	if (!active)
		return;
	if (!active->res->stop_signal && active->res->failed_rank < 0) {
		active->res->stop_signal = signo;
		dps_info("stopping the ranks (%s)", strsignal(signo));
	}
	sup_raise_abort(active);
}

static int pidfd_open_compat(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
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

	rc = dps_world_attach(&w, &s->lay, s->segs[dps_layout_node_of(&s->lay, r)].base, r,
			      s->evfd);
	if (rc) {
		dps_error("cannot attach to the instance: %s", dps_strerror(rc));
		_exit(1);
	}
	if (s->node < 0 && s->lay.nodes > 1) {
		/* one supervisor for every node: it sleeps on node 0's bell alone */
		for (int i = 0; i < s->lay.n_comms; i++)
			if (w.comms[i].x)
				w.comms[i].xbell = &s->ctls[0]->xbell;
		w.xbell = &s->ctls[0]->xbell;
	}
	w.ncpus = s->place.ranks[r].n_cpus ? (unsigned)s->place.ranks[r].n_cpus : s->ncpus;
	/* Where all-reduce leaves one-shot depends on whether the ranks share cores. */
	dps_world_set_algo(&w, dps_coll_oneshot_default((unsigned)s->lay.world, s->ncpus),
			   DPS_ALGO_AUTO);
	w.kv_share = s->kv_shares ? s->kv_shares[dps_layout_node_of(&s->lay, r)] : NULL;
	w.kv_stride = w.kv_share ? s->o->kv_share_bytes : 0;
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

/*
 * Rank r failed as err says (the first failure of the run): recorded, logged, the others
 * aborted, the caller told. Every kind of failure (death, early exit, hang) goes through here.
 */
void dps_sup_fail(struct sup *s, int r, const char *err)
{
	s->res->failed_rank = r;
	s->res->failed_ns = dps_now_ns();
	if (!s->why[0])
		snprintf(s->why, sizeof(s->why), "%s", err);
	dps_error("%s; stopping the other ranks", err);
	sup_raise_abort(s);
	if (s->link && (sup_hosts(s, r) || s->node == 0))
		s->xops->fail(s->link, r, err); /* every other node stops too */
	if (s->o->fail_fn && s->node <= 0)
		s->o->fail_fn(err, s->o->msg_arg);
}

/* What the other nodes said: their ranks' messages (node 0), failures, ends. */
static void sup_link_events(struct sup *s)
{
	struct dps_xevent ev;

	while (s->xops->next(s->link, &ev) == 0) {
		if (!ev.data) { /* (out of memory taking it) */
			dps_warn("an event from another node was lost: out of memory");
			continue;
		}
		if (ev.kind == DPS_XEV_MSG && s->o->msg_fn)
			s->o->msg_fn(ev.rank, ev.data, ev.len, s->o->msg_arg);
		if (ev.kind == DPS_XEV_FAIL && s->res->failed_rank < 0 && !s->res->stop_signal)
			dps_sup_fail(s, ev.rank, (const char *)ev.data);
		if (ev.kind == DPS_XEV_KILL && sup_hosts(s, ev.rank) && s->pids[ev.rank] > 0) {
			s->hung_rank = ev.rank; /* node 0 reported it */
			kill(s->pids[ev.rank], SIGKILL);
		}
		if (ev.kind == DPS_XEV_DONE) {
			s->remote_alive--;
			if (!ev.status)
				sup_ended_early(s, ev.node * (s->lay.world / s->lay.nodes));
			if (ev.status && s->res->failed_rank < 0 && !s->res->stop_signal) {
				char why[96];

				snprintf(why, sizeof(why), "the ranks of node %d did not all exit "
					 "cleanly", ev.node);
				dps_sup_fail(s, ev.node * (s->lay.world / s->lay.nodes), why);
			}
		}
		free(ev.data);
	}
}

static void sup_drain(struct sup *s)
{
	unsigned char buf[4096];
	uint64_t cnt;
	size_t len;

	if (read(s->evfd, &cnt, sizeof(cnt)) < 0) {
		/* EAGAIN: nothing signalled; the rings are drained anyway */
	}
	for (int r = s->lo; r < s->hi; r++) {
		int rc;

		while ((rc = dps_ring_trypop(&s->to_sup[r], 0, buf, sizeof(buf), &len)) != -EAGAIN) {
			if (rc) {
				dps_warn("dropped a message from rank %d: %s", r, dps_strerror(rc));
				continue;
			}
			if (s->node > 0) /* the caller runs on node 0 */
				rc = s->xops->up(s->link, r, buf, len);
			else if (s->o->msg_fn)
				s->o->msg_fn(r, buf, len, s->o->msg_arg);
			if (rc)
				dps_warn("dropped a message from rank %d: %s", r, dps_strerror(rc));
		}
	}
	if (s->link)
		sup_link_events(s);
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
		sup_ended_early(s, r);
		return;
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) == DPS_EXIT_ABORTED && s->abort_deadline)
		return; /* stopped because we asked it to */
	if (r == s->hung_rank)
		return; /* killed by us for hanging: already reported */
	dps_sup_describe_rank(s, r, who, sizeof(who));
	if (s->res->failed_rank < 0 && !s->res->stop_signal) {
		if (WIFSIGNALED(st)) {
			s->res->failed_signal = WTERMSIG(st);
			snprintf(err, errlen, "%s was killed by signal %d (%s)", who, WTERMSIG(st),
				 strsignal(WTERMSIG(st)));
		} else {
			s->res->failed_status = WEXITSTATUS(st);
			snprintf(err, errlen, "%s exited with status %d", who, WEXITSTATUS(st));
		}
		dps_sup_fail(s, r, err);
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
	dps_sup_describe_rank(s, s->early_rank, who, sizeof(who));
	s->res->failed_status = 0;
	if (!sup_hosts(s, s->early_rank))
		snprintf(err, errlen, "the ranks of node %d ended while %d rank(s) here and %d "
			 "other node(s) kept running", dps_layout_node_of(&s->lay, s->early_rank),
			 s->alive, s->remote_alive);
	else
		snprintf(err, errlen, "%s exited while %d other rank(s)%s kept running", who,
			 s->alive, s->remote_alive ? " and other nodes" : "");
	dps_sup_fail(s, s->early_rank, err);
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

		/* Under mpirun a node that dies is followed by mpirun's SIGTERM to the others,
		 * and its SIGKILL a second later: node 0 must see the loss first, so that its
		 * caller answers what was in flight. */
		if (s->link && s->node == 0 && signo != SIGHUP && s->res->failed_rank < 0) {
			const int k = s->xops->lost(s->link, 300);

			if (k > 0) {
				char why[160];

				snprintf(why, sizeof(why), "node %d stopped answering (nothing from it for "
					 "over 0.3 s when %s came): its supervisor died or hangs", k,
					 strsignal(signo));
				dps_sup_fail(s, k * (s->lay.world / s->lay.nodes), why);
			}
		}
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

	while (s->alive > 0 || s->remote_alive > 0) {
		timeout = -1;
		if (s->alive == 0 && s->abort_deadline &&
		    dps_now_ns() > s->abort_deadline + 10000000000ull) {
			dps_warn("%d other node(s) did not report the end of their ranks; not waiting "
				 "for them any longer", s->remote_alive);
			break;
		}
		if (s->o->tick_fn && !s->abort_deadline && s->node <= 0)
			timeout = s->o->tick_fn(s->o->msg_arg);
		sup_check_early(s, err, errlen);
		/* Once a rank has exited cleanly the run winds down, and the others must follow
		 * by early_deadline: the progress rule no longer applies to them. */
		if (s->o->rank_timeout_ms && !s->abort_deadline && !s->early_deadline &&
		    s->res->failed_rank < 0) {
			const int t = dps_sup_check_hung(s, err, errlen);

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
	/* Nodes: which this process is, and so which ranks it forks and which segments it
	 * makes (one per node it hosts: all of them without mpirun). */
	s->lo = 0;
	s->hi = s->lay.world;
	if (s->lay.nodes > 1) {
		const int per = s->lay.world / s->lay.nodes;

		if (!o->nodes_ok) {
			snprintf(err, errlen, "--nodes %d: this command does not run across nodes "
				 "yet", s->lay.nodes);
			return -DPS_ECONFIG;
		}
		rc = dps_xlink_identity(s->lay.nodes, &s->node, &s->xops, err, errlen);
		if (rc)
			return rc;
		if (s->node >= 0) {
			s->lo = s->node * per;
			s->hi = s->lo + per;
		}
		s->remote_alive = s->node == 0 ? s->lay.nodes - 1 : 0;
	}
	if (s->lay.nodes == 1) {
		static int told;
		int me;
		const int procs = dps_mpirun_procs(&me);

		if (procs > 1 && !told++)
			dps_warn("started by mpirun with %d processes but without --nodes: each runs "
				 "an instance of its own (give --nodes %d to run one across them)",
				 procs, procs);
	}
	s->segs = calloc((size_t)s->lay.nodes, sizeof(*s->segs));
	s->ctls = calloc((size_t)s->lay.nodes, sizeof(*s->ctls));
	if (!s->segs || !s->ctls)
		return -ENOMEM;
	for (int k = 0; k < s->lay.nodes; k++) {
		if (s->node >= 0 && k != s->node)
			continue;
		rc = dps_seg_create(&s->segs[k], "inst", s->lay.total, err, errlen);
		if (rc)
			return rc;
		dps_layout_init_shm(&s->lay, s->segs[k].base);
		s->ctls[k] = s->segs[k].base;
	}
	if (o->kv_share_bytes && s->lay.groups.prefill) {
		const size_t n = (size_t)s->lay.groups.prefill->world;

		/* Anonymous and shared: inherited by the forks, gone with the last of them, and
		 * taken from memory only as the caches are written (as dps_kv_alloc's are). */
		if (dps_size_mul(n, o->kv_share_bytes, &s->kv_share_len)) {
			snprintf(err, errlen, "%zu prefill ranks' KV caches of %zu bytes are too "
				 "large", n, o->kv_share_bytes);
			return -DPS_ETOOBIG;
		}
		/* one per node this process hosts: across nodes each has its own (the proxies
		 * copy what a pull needs from the prefill rank's node) */
		s->kv_shares = calloc((size_t)s->lay.nodes, sizeof(*s->kv_shares));
		if (!s->kv_shares)
			return -ENOMEM;
		for (int k = 0; k < s->lay.nodes; k++) {
			char *m;

			if (!s->ctls[k])
				continue;
			m = mmap(NULL, s->kv_share_len, PROT_READ | PROT_WRITE,
				 MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
			if (m == MAP_FAILED) {
				rc = -errno;
				snprintf(err, errlen, "cannot map %zu bytes for the prefill ranks' KV "
					 "caches: %s", s->kv_share_len, strerror(-rc));
				return rc;
			}
			s->kv_shares[k] = m;
		}
	}

	s->to_sup = calloc((size_t)s->lay.world, sizeof(*s->to_sup));
	s->from_sup = calloc((size_t)s->lay.world, sizeof(*s->from_sup));
	s->pids = calloc((size_t)s->lay.world, sizeof(*s->pids));
	s->pidfds = malloc(sizeof(*s->pidfds) * (size_t)s->lay.world);
	if (!s->to_sup || !s->from_sup || !s->pids || !s->pidfds)
		return -ENOMEM;
	for (int r = 0; r < s->lay.world; r++) {
		void *base = s->segs[dps_layout_node_of(&s->lay, r)].base;

		s->pidfds[r] = -1;
		if (!sup_hosts(s, r))
			continue;
		dps_ring_attach(&s->to_sup[r], dps_layout_ring_to_sup(&s->lay, base, r),
				&sup_ctl(s, r)->abort, -1);
		dps_ring_attach(&s->from_sup[r], dps_layout_ring_from_sup(&s->lay, base, r),
				&sup_ctl(s, r)->abort, -1);
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
	for (int k = 0; s->segs && k < s->lay.nodes; k++)
		dps_seg_destroy(&s->segs[k]);
	free(s->segs);
	free(s->ctls);
	for (int k = 0; s->kv_shares && k < s->lay.nodes; k++)
		if (s->kv_shares[k])
			munmap(s->kv_shares[k], s->kv_share_len);
	free(s->kv_shares);
	s->kv_shares = NULL;
	dps_placement_free(&s->place);
	dps_topo_free(&s->topo);
	dps_layout_free(&s->lay);
}

int dps_sup_run(const struct dps_sup_opts *o, struct dps_sup_result *res, char *err,
		size_t errlen)
{
	struct sup s = { .o = o, .res = res, .evfd = -1, .sigfd = -1, .hung_rank = -1,
			 .node = -1 };
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
	for (r = s.lo; r < s.hi; r++) {
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
			for (int i = s.lo; i < r; i++)
				waitpid(s.pids[i], NULL, 0);
			goto out;
		}
		s.pids[r] = pid;
		s.alive++;
	}
	last_node = s.node > 0 ? s.node : 0;
	if (s.xops) {
		/* After the forks: the ranks never inherit what the exchange starts (MPI). */
		rc = s.xops->start(&s, &s.link, err, errlen);
		if (rc) {
			sup_raise_abort(&s);
			sup_kill_all(&s);
			for (int i = s.lo; i < s.hi; i++)
				waitpid(s.pids[i], NULL, 0);
			goto out;
		}
	}
	active = &s;
	rc = sup_loop(&s, err, errlen);
	active = NULL;
	if (s.link) {
		s.xops->stop(s.link, rc || res->failed_rank >= 0 || res->stop_signal);
		s.link = NULL;
	}
	if (!rc) {
		if (res->failed_rank >= 0)
			rc = -DPS_ERANK;
		else if (res->stop_signal)
			rc = -DPS_EABORT;
	}
out:
	if (rc && !err[0] && s.why[0]) /* (a failure another node reported) */
		snprintf(err, errlen, "%s", s.why);
	sup_teardown(&s);
	return rc;
}

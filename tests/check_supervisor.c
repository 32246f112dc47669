/* SPDX-License-Identifier: MIT */
/*
 * tests/check_supervisor.c - the rank supervisor with real processes: a rank killed with
 * SIGKILL in the middle of a loop of collectives (the others get an error within a second,
 * the dead rank is named, nothing is left in /dev/shm), a rank that exits non-zero, SIGTERM
 * to the supervisor, SIGKILL of the supervisor (ranks die with it), 32 ranks on the two cores
 * running a thousand all-reduces, placement and messages from ranks, and bad configurations.
 * Hung ranks: the heartbeat rule alone on a made-up clock, a rank spinning and a rank stopped
 * while work is pending (each named, killed, the others aborted), a peer waiting for the hung
 * rank not blamed, and ranks silent for many timeouts while nothing is pending left alone.
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/dps.h"
#include "engine/runtime/supervisor.h"
#include "shm/seg.h"
#include "tests/testutil.h"

/* Shared between the test process and the ranks it forks (MAP_SHARED, inherited). */
struct shared {
	_Atomic uint64_t err_ns[64];   /* when each rank saw its collective fail */
	_Atomic int err_code[64];
	_Atomic int pid[64];
	_Atomic int iters[64];
	_Atomic int cpu0[64];          /* first CPU of each rank's affinity */
	_Atomic int ncpu[64];
};

static struct shared *sh;

static void setup(void)
{
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(sh, MAP_FAILED);
}

static void teardown(void)
{
	munmap(sh, sizeof(*sh));
}

static int run(struct dps_sup_opts *o, struct dps_sup_result *res, char *err, size_t len)
{
	return dps_sup_run(o, res, err, len);
}

/* ---- a rank killed in a loop of collectives ---------------------------------------------- */

struct kill_arg {
	int victim;
	int how; /* 0 = SIGKILL itself, 1 = exit(1) via error return */
};

static int loop_rank(struct dps_world *w, void *arg)
{
	const struct kill_arg *k = arg;
	float buf[64];
	int rc;

	sh->pid[w->rank] = getpid();
	for (int it = 0;; it++) {
		for (int j = 0; j < 64; j++)
			buf[j] = (float)(w->rank + j);
		if (w->rank == k->victim && it == 300) {
			if (k->how == 0)
				raise(SIGKILL);
			return -EIO;
		}
		rc = dps_coll_allreduce(w->world_c, buf, buf, 64, DPS_F32);
		if (rc) {
			sh->err_ns[w->rank] = dps_now_ns();
			sh->err_code[w->rank] = rc;
			return rc;
		}
		sh->iters[w->rank] = it;
	}
}

START_TEST(test_rank_sigkill)
{
	struct kill_arg k = { .victim = 2, .how = 0 };
	struct dps_sup_opts o = { .par = { 4, 1, 1, 1, 1, 1, 1 }, .rank_fn = loop_rank,
				  .rank_arg = &k };
	struct dps_sup_result res;
	char err[256];
	int rc;

	rc = run(&o, &res, err, sizeof(err));
	ck_assert_int_eq(rc, -DPS_ERANK);
	ck_assert_int_eq(res.failed_rank, 2);
	ck_assert_int_eq(res.failed_signal, SIGKILL);
	ck_assert_msg(strstr(err, "rank 2 (DP 0, TP 2)") && strstr(err, "signal 9"), "%s", err);
	ck_assert_int_eq(res.killed, 0);
	for (int r = 0; r < 4; r++) {
		if (r == 2)
			continue;
		ck_assert_int_eq(sh->err_code[r], -DPS_EABORT);
		/* The error came within a second of the supervisor seeing the death. */
		ck_assert_msg(sh->err_ns[r] >= res.failed_ns - 1000000000ull &&
			      sh->err_ns[r] - res.failed_ns < 1000000000ull,
			      "rank %d got its error %.3f s after the death", r,
			      ((double)sh->err_ns[r] - (double)res.failed_ns) / 1e9);
	}
	ck_assert_int_eq(test_shm_entries_of(getpid()), 0);
}
END_TEST

START_TEST(test_rank_exit_status)
{
	struct kill_arg k = { .victim = 1, .how = 1 };
	struct dps_sup_opts o = { .par = { 2, 2, 1, 1, 1, 1, 1 }, .rank_fn = loop_rank,
				  .rank_arg = &k };
	struct dps_sup_result res;
	char err[256];

	ck_assert_int_eq(run(&o, &res, err, sizeof(err)), -DPS_ERANK);
	ck_assert_int_eq(res.failed_rank, 1);
	ck_assert_int_eq(res.failed_status, 1);
	ck_assert_msg(strstr(err, "rank 1 (DP 0, TP 1) exited with status 1"), "%s", err);
	ck_assert_int_eq(test_shm_entries_of(getpid()), 0);
}
END_TEST

/* ---- SIGTERM to the supervisor ------------------------------------------------------------ */

static int term_rank(struct dps_world *w, void *arg)
{
	int rc;

	if (w->rank == 0)
		kill(getppid(), SIGTERM);
	for (;;) {
		rc = dps_coll_barrier(w->world_c);
		if (rc)
			return rc;
	}
}

START_TEST(test_sigterm)
{
	struct dps_sup_opts o = { .par = { 3, 1, 1, 1, 1, 1, 1 }, .rank_fn = term_rank };
	struct dps_sup_result res;
	char err[256];

	ck_assert_int_eq(run(&o, &res, err, sizeof(err)), -DPS_EABORT);
	ck_assert_int_eq(res.stop_signal, SIGTERM);
	ck_assert_int_eq(res.failed_rank, -1);
	ck_assert_int_eq(res.killed, 0);
	ck_assert_int_eq(test_shm_entries_of(getpid()), 0);
}
END_TEST

/* ---- SIGKILL of the supervisor ------------------------------------------------------------ */

static int forever_rank(struct dps_world *w, void *arg)
{
	sh->pid[w->rank] = getpid();
	for (;;) {
		int rc = dps_coll_barrier(w->world_c);

		if (rc)
			return rc;
	}
}

static int proc_alive(pid_t pid)
{
	char path[64], buf[512], *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

START_TEST(test_supervisor_sigkill)
{
	pid_t sup = fork();
	uint64_t t0;
	int alive;

	ck_assert_int_ge(sup, 0);
	if (sup == 0) {
		struct dps_sup_opts o = { .par = { 2, 2, 1, 1, 1, 1, 1 }, .rank_fn = forever_rank };
		struct dps_sup_result res;
		char err[256];

		_exit(dps_sup_run(&o, &res, err, sizeof(err)) ? 1 : 0);
	}
	t0 = dps_now_ns();
	while (!(sh->pid[0] && sh->pid[1] && sh->pid[2] && sh->pid[3]))
		ck_assert_msg(dps_now_ns() - t0 < 10000000000ull, "ranks did not start");
	kill(sup, SIGKILL);
	waitpid(sup, NULL, 0);
	/* PR_SET_PDEATHSIG: every rank dies with its supervisor. */
	t0 = dps_now_ns();
	do {
		alive = 0;
		for (int r = 0; r < 4; r++)
			alive += proc_alive(sh->pid[r]);
		if (alive)
			usleep(10000);
	} while (alive && dps_now_ns() - t0 < 2000000000ull);
	ck_assert_int_eq(alive, 0);
	ck_assert_int_eq(test_shm_entries_of(sup), 0);
}
END_TEST

/* ---- many ranks on few cores -------------------------------------------------------------- */

static int many_rank(struct dps_world *w, void *arg)
{
	float buf[16];

	for (int it = 0; it < 1000; it++) {
		int rc;

		for (int j = 0; j < 16; j++)
			buf[j] = (float)(w->rank * 16 + j + it);
		rc = dps_coll_allreduce(w->world_c, buf, buf, 16, DPS_F32);
		if (rc)
			return rc;
		for (int j = 0; j < 16; j++) {
			/* sum over r of (16 r + j + it) = 16 * W(W-1)/2 + W (j + it), exact in fp32 */
			const float want = (float)(16 * w->world * (w->world - 1) / 2 +
						   w->world * (j + it));

			if (buf[j] != want)
				return -DPS_EPROTO;
		}
	}
	return 0;
}

START_TEST(test_32_ranks)
{
	struct dps_sup_opts o = { .par = { 8, 4, 1, 1, 1, 1, 1 }, .rank_fn = many_rank };
	struct dps_sup_result res;
	char err[256];

	ck_assert_msg(run(&o, &res, err, sizeof(err)) == 0, "%s", err);
}
END_TEST

/* ---- placement and messages --------------------------------------------------------------- */

static int place_rank(struct dps_world *w, void *arg)
{
	cpu_set_t set;
	char msg[32];

	CPU_ZERO(&set);
	sched_getaffinity(0, sizeof(set), &set);
	sh->ncpu[w->rank] = CPU_COUNT(&set);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &set)) {
			sh->cpu0[w->rank] = c;
			break;
		}
	for (int i = 0; i < 100; i++) {
		int n = snprintf(msg, sizeof(msg), "%d:%d", w->rank, i);
		int rc = dps_ring_push(&w->to_sup, msg, (size_t)n, 0);

		if (rc)
			return rc;
	}
	return 0;
}

static int msg_next[8], msg_bad;

static void on_msg(int rank, const void *msg, size_t len, void *arg)
{
	char want[32];
	int n = snprintf(want, sizeof(want), "%d:%d", rank, msg_next[rank]++);

	if ((size_t)n != len || memcmp(want, msg, len))
		msg_bad++;
}

START_TEST(test_placement_and_messages)
{
	struct dps_sup_opts o = { .par = { 2, 1, 1, 1, 1, 1, 1 }, .rank_fn = place_rank,
				  .msg_fn = on_msg };
	struct dps_sup_result res;
	char err[256];

	o.cpu_bind = "1:0";
	ck_assert_msg(run(&o, &res, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(sh->ncpu[0], 1);
	ck_assert_int_eq(sh->cpu0[0], 1);
	ck_assert_int_eq(sh->ncpu[1], 1);
	ck_assert_int_eq(sh->cpu0[1], 0);
	ck_assert_int_eq(msg_next[0], 100);
	ck_assert_int_eq(msg_next[1], 100);
	ck_assert_int_eq(msg_bad, 0);
}
END_TEST

START_TEST(test_bad_config)
{
	struct dps_sup_opts o = { .par = { 2, 4, 1, 1, 3, 1, 1 }, .rank_fn = place_rank };
	struct dps_sup_result res;
	char err[256];

	ck_assert_int_eq(run(&o, &res, err, sizeof(err)), -DPS_ECONFIG);
	ck_assert_msg(strstr(err, "--mlp-dp-size 3 does not divide --data-parallel-size 4"), "%s", err);
	o.par.mlp_dp = 1;
	o.cpu_bind = "0-1:x";
	ck_assert_int_lt(run(&o, &res, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "--cpu-bind"), "%s", err);
}
END_TEST

START_TEST(test_sweep_on_start)
{
	/* A segment of a dead instance is removed when a new instance starts. */
	pid_t dead = fork();
	char name[128];
	int fd;

	if (dead == 0)
		_exit(0);
	waitpid(dead, NULL, 0);
	snprintf(name, sizeof(name), "/dpshard-%ld-12345-0-inst", (long)dead);
	fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(test_shm_entries_of(dead), 1);

	struct dps_sup_opts o = { .par = { 1, 1, 1, 1, 1, 1, 1 }, .rank_fn = place_rank };
	struct dps_sup_result res;
	char err[256];

	ck_assert_msg(run(&o, &res, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(test_shm_entries_of(dead), 0);
}
END_TEST

/* ---- a rank that leaves early, and ranks that ignore the abort ------------------------------- */

static int early_rank(struct dps_world *w, void *arg)
{
	int rc;

	if (w->rank == 1)
		return 0; /* leaves while the others wait for it in a barrier */
	rc = dps_coll_barrier(w->world_c);
	sh->err_code[w->rank] = rc;
	return rc;
}

START_TEST(test_rank_leaves_early)
{
	struct dps_sup_opts o = { .par = { 3, 1, 1, 1, 1, 1, 1 }, .rank_fn = early_rank,
				  .grace_ms = 300 };
	struct dps_sup_result res;
	char err[256];

	ck_assert_int_eq(run(&o, &res, err, sizeof(err)), -DPS_ERANK);
	ck_assert_int_eq(res.failed_rank, 1);
	ck_assert_int_eq(res.failed_status, 0);
	ck_assert_msg(strstr(err, "rank 1 (DP 0, TP 1) exited while 2 other rank(s) kept running"),
		      "%s", err);
	ck_assert_int_eq(sh->err_code[0], -DPS_EABORT);
	ck_assert_int_eq(sh->err_code[2], -DPS_EABORT);
	ck_assert_int_eq(res.killed, 0);
}
END_TEST

static int stubborn_rank(struct dps_world *w, void *arg)
{
	if (w->rank == 0)
		return -EIO;
	for (;;)
		pause(); /* ignores the abort word: only SIGKILL ends it */
}

START_TEST(test_stragglers_killed_once)
{
	struct dps_sup_opts o = { .par = { 2, 2, 1, 1, 1, 1, 1 }, .rank_fn = stubborn_rank,
				  .grace_ms = 200 };
	struct dps_sup_result res;
	char err[256];

	ck_assert_int_eq(run(&o, &res, err, sizeof(err)), -DPS_ERANK);
	ck_assert_int_eq(res.failed_rank, 0);
	ck_assert_int_eq(res.killed, 3);
	ck_assert_int_eq(test_shm_entries_of(getpid()), 0);
}
END_TEST

/* ---- hung ranks ----------------------------------------------------------------------------- */

START_TEST(test_hang_watch_rule)
{
	const uint64_t s1 = 1000000000ull;
	struct dps_hang_watch h = { 0 };

	/* Not expected: silent for 100 s, never counted. */
	for (uint64_t t = 1; t <= 100; t++)
		ck_assert_uint_eq(dps_hang_watch_check(&h, 7, 0, t * s1), 0);
	/* Expected from 100 s on: the clock starts at the first check that sees it so. */
	ck_assert_uint_eq(dps_hang_watch_check(&h, 7, 1, 100 * s1), 0);
	ck_assert_uint_eq(dps_hang_watch_check(&h, 7, 1, 101 * s1), s1);
	ck_assert_uint_eq(dps_hang_watch_check(&h, 7, 1, 103 * s1), 3 * s1);
	/* It moved: the clock starts again. */
	ck_assert_uint_eq(dps_hang_watch_check(&h, 8, 1, 104 * s1), 0);
	ck_assert_uint_eq(dps_hang_watch_check(&h, 8, 1, 106 * s1), 2 * s1);
	/* Idle in between: what came before does not count after. */
	ck_assert_uint_eq(dps_hang_watch_check(&h, 8, 0, 107 * s1), 0);
	ck_assert_uint_eq(dps_hang_watch_check(&h, 8, 1, 200 * s1), 0);
	ck_assert_uint_eq(dps_hang_watch_check(&h, 8, 1, 201 * s1), s1);
	/* Any change counts as progress, also a wrap of the counter. */
	h.count = UINT64_MAX;
	ck_assert_uint_eq(dps_hang_watch_check(&h, 0, 1, 202 * s1), 0);
}
END_TEST

struct hang_arg {
	int victim;     /* the rank that hangs */
	int how;        /* 0: spins, busy; 1: stops itself (SIGSTOP); 2: sleeps 1.5 s, then works;
			 * 3: waits for a word nobody rings (alive, no work) */
	int pending;    /* what pending_fn answers for every rank */
};

static int hang_pending(int rank, void *arg)
{
	(void)rank;
	return ((const struct hang_arg *)arg)->pending;
}

static int hang_rank(struct dps_world *w, void *arg)
{
	const struct hang_arg *h = arg;
	int rc;

	sh->pid[w->rank] = getpid();
	if (w->rank == h->victim) {
		sh->err_ns[w->rank] = dps_now_ns();
		if (h->how == 0) {
			dps_world_set_busy(w, 1);
			for (volatile unsigned long spin = 0;; spin++) {
				/* no heartbeat */
			}
		}
		if (h->how == 1)
			raise(SIGSTOP);
		if (h->how == 2) {
			struct timespec ts = { 1, 500000000 };

			nanosleep(&ts, NULL); /* silent, and nothing asked of it */
		}
		if (h->how == 4) {
			/* Works for three timeouts (a long step) while its peers wait for it. */
			const uint64_t end = dps_now_ns() + 1200000000ull;

			dps_world_set_busy(w, 1);
			while (dps_now_ns() < end) {
				struct timespec ts = { 0, 20000000 };

				nanosleep(&ts, NULL);
				dps_work();
			}
		}
		if (h->how == 3) {
			static struct dps_wword never; /* this process's own: nobody rings it */

			rc = dps_wword_wait(&never, 1, &w->ctl->abort, 0, NULL);
			sh->err_code[w->rank] = rc;
			return rc;
		}
	}
	/* The others wait for it in a barrier, which beats while it waits. */
	rc = dps_coll_barrier(w->world_c);
	sh->err_code[w->rank] = rc;
	return rc;
}

static void check_hung(int how, int pending)
{
	struct hang_arg h = { .victim = 1, .how = how, .pending = pending };
	struct dps_sup_opts o = { .par = { 3, 1, 1, 1, 1, 1, 1 }, .rank_fn = hang_rank,
				  .rank_arg = &h, .msg_arg = &h, .pending_fn = hang_pending,
				  .rank_timeout_ms = 400, .grace_ms = 500 };
	struct dps_sup_result res;
	char err[256], want[64];
	double after;
	int rc;

	rc = run(&o, &res, err, sizeof(err));
	ck_assert_msg(rc == -DPS_ERANK, "rc %d: %s", rc, err);
	ck_assert_int_eq(res.failed_rank, 1);
	snprintf(want, sizeof(want), "rank 1 (DP 0, TP 1), pid %d, made no progress", sh->pid[1]);
	ck_assert_msg(strstr(err, want) && strstr(err, "rank timeout is 0.4 s"), "%s", err);
	/* Its waiting peers beat: the silent one is blamed, not a deadlock. */
	ck_assert_msg(!strstr(err, "deadlock") && !res.deadlock, "%s", err);
	ck_assert_uint_ge(res.hung_ms, 400);
	/* Named within the timeout and a few checks (50 ms each) of going silent, with slack
	 * for a loaded machine. (Never before the timeout: hung_ms above. Its last beat came
	 * before err_ns, so the time from err_ns may be a little shorter.) */
	after = ((double)res.failed_ns - (double)sh->err_ns[1]) / 1e9;
	ck_assert_msg(after > 0.2 && after < 2.5, "hang seen %.3f s after it began", after);
	/* The peers waiting for it were not blamed: they were aborted. */
	ck_assert_int_eq(sh->err_code[0], -DPS_EABORT);
	ck_assert_int_eq(sh->err_code[2], -DPS_EABORT);
	ck_assert_int_eq(res.killed, 0);
	ck_assert_int_eq(test_shm_entries_of(getpid()), 0);
}

START_TEST(test_hung_rank_spinning)
{
	check_hung(0, 0); /* its own busy flag makes it expected */
}
END_TEST

START_TEST(test_hung_rank_stopped)
{
	check_hung(1, 1); /* the caller's pending work makes it expected */
}
END_TEST

START_TEST(test_idle_rank_not_hung)
{
	/* Silent for almost four timeouts with nothing pending: not hung, the run ends well. */
	struct hang_arg h = { .victim = 1, .how = 2, .pending = 0 };
	struct dps_sup_opts o = { .par = { 3, 1, 1, 1, 1, 1, 1 }, .rank_fn = hang_rank,
				  .rank_arg = &h, .msg_arg = &h, .pending_fn = hang_pending,
				  .rank_timeout_ms = 400 };
	struct dps_sup_result res;
	char err[256];

	ck_assert_msg(run(&o, &res, err, sizeof(err)) == 0, "%s", err);
	for (int r = 0; r < 3; r++)
		ck_assert_int_eq(sh->err_code[r], 0);
	/* The check can fail: the same silence with work pending is a hang. */
	h.pending = 1;
	ck_assert_int_eq(run(&o, &res, err, sizeof(err)), -DPS_ERANK);
	ck_assert_msg(res.failed_rank == 1 && strstr(err, "made no progress"), "%s", err);
	/* And with the check off (0) nothing is ever hung. */
	o.rank_timeout_ms = 0;
	ck_assert_msg(run(&o, &res, err, sizeof(err)) == 0, "%s", err);
}
END_TEST

START_TEST(test_deadlock)
{
	/* Rank 1 waits for ever on a word nobody rings, the others for it in a barrier: every
	 * rank beats alive and none works. A deadlock, naming them all; nobody is killed. */
	struct hang_arg h = { .victim = 1, .how = 3, .pending = 1 };
	struct dps_sup_opts o = { .par = { 3, 1, 1, 1, 1, 1, 1 }, .rank_fn = hang_rank,
				  .rank_arg = &h, .msg_arg = &h, .pending_fn = hang_pending,
				  .rank_timeout_ms = 400, .grace_ms = 500 };
	struct dps_sup_result res;
	char err[512];
	const uint64_t t0 = dps_now_ns();
	double after;

	ck_assert_int_eq(run(&o, &res, err, sizeof(err)), -DPS_ERANK);
	ck_assert_msg(strstr(err, "ranks 0 (DP 0, TP 0), 1 (DP 0, TP 1), 2 (DP 0, TP 2) made no "
				  "progress for ") && strstr(err, "while waiting") &&
		      strstr(err, ": deadlock") && !strstr(err, "hung"), "%s", err);
	ck_assert_int_eq(res.deadlock, 3);
	ck_assert_int_eq(res.failed_rank, 0);
	ck_assert_uint_ge(res.hung_ms, 400);
	after = ((double)res.failed_ns - (double)t0) / 1e9;
	ck_assert_msg(after >= 0.4 && after < 3.0, "deadlock seen %.3f s after the start", after);
	for (int r = 0; r < 3; r++)
		ck_assert_int_eq(sh->err_code[r], -DPS_EABORT);
	ck_assert_int_eq(res.killed, 0);
	/* (The check can fail: check_hung's stopped and spinning ranks, whose peers wait the
	 * same way, must not be called a deadlock.) */
	ck_assert_int_eq(test_shm_entries_of(getpid()), 0);
}
END_TEST

START_TEST(test_waiting_for_a_worker)
{
	/* Rank 1 works for three timeouts while its peers wait for it in a barrier, alive and
	 * not working: they wait for a rank that works, which is no deadlock, and the run ends
	 * well. (The check can fail: test_deadlock, where nobody works.) */
	struct hang_arg h = { .victim = 1, .how = 4, .pending = 1 };
	struct dps_sup_opts o = { .par = { 3, 1, 1, 1, 1, 1, 1 }, .rank_fn = hang_rank,
				  .rank_arg = &h, .msg_arg = &h, .pending_fn = hang_pending,
				  .rank_timeout_ms = 400, .grace_ms = 500 };
	struct dps_sup_result res;
	char err[512];

	ck_assert_msg(run(&o, &res, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(res.deadlock, 0);
	for (int r = 0; r < 3; r++)
		ck_assert_int_eq(sh->err_code[r], 0);
}
END_TEST

static Suite *sup_suite(void)
{
	Suite *s = suite_create("supervisor");
	TCase *tc = tcase_create("supervisor");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_rank_sigkill);
	tcase_add_test(tc, test_rank_exit_status);
	tcase_add_test(tc, test_sigterm);
	tcase_add_test(tc, test_supervisor_sigkill);
	tcase_add_test(tc, test_32_ranks);
	{
		/* Pins rank 0 to CPU 1 and rank 1 to CPU 0: not registered (so not counted as a
		 * pass) where this process may not run on both. */
		cpu_set_t set;

		if (!sched_getaffinity(0, sizeof(set), &set) && CPU_ISSET(0, &set) &&
		    CPU_ISSET(1, &set))
			tcase_add_test(tc, test_placement_and_messages);
		else
			printf("skipped: test_placement_and_messages needs CPUs 0 and 1\n");
	}
	tcase_add_test(tc, test_bad_config);
	tcase_add_test(tc, test_sweep_on_start);
	tcase_add_test(tc, test_rank_leaves_early);
	tcase_add_test(tc, test_stragglers_killed_once);
	tcase_add_test(tc, test_hang_watch_rule);
	tcase_add_test(tc, test_hung_rank_spinning);
	tcase_add_test(tc, test_hung_rank_stopped);
	tcase_add_test(tc, test_idle_rank_not_hung);
	tcase_add_test(tc, test_deadlock);
	tcase_add_test(tc, test_waiting_for_a_worker);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(sup_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/hang.h - the supervisor's two judgements of a silent rank (see supervisor.h,
 * "Hung ranks"): how long a watched word has stood still while the rank was expected to
 * progress (dps_hang_watch_check, declared in supervisor.h), and whether a rank whose alive
 * word stopped is at fault or merely starved of CPU.
 */
#ifndef DPS_ENGINE_HANG_H
#define DPS_ENGINE_HANG_H

#include <stdint.h>
#include <sys/types.h>

/*
 * Whether rank pid's silence (its alive word unmoved for long enough to judge) is its own
 * doing. A rank waiting in shm/wait.c beats every time it runs, so a silent rank that is
 * stopped (T), asleep outside those waits (S, D), or that ran on a CPU without beating is
 * stopped or stuck. A silent rank that is runnable (R) but got no CPU since *ran (its CPU
 * time at the first such check, plus one; 0: none yet) is starved by a loaded machine, not
 * hung: it is judged again at the next check. A rank whose /proc entries cannot be read is
 * judged by its silence alone.
 */
int dps_rank_silence_is_its_own(pid_t pid, uint64_t *ran);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/groups.h - the parallel layout of docs/DESIGN.md section 3: from TP, DP and the
 * five component sizes, every process group the engine uses, as lists of world ranks.
 *
 * World rank r = d*TP + t (d = DP rank, t = TP rank). A "group set" is one partition of the
 * world into equal groups, the analogue of a vLLM GroupCoordinator: every rank belongs to
 * exactly one group of each set. Sets:
 *   world            one group of every rank
 *   TP               DP groups; group d = { d*TP + t : t }            rank_in_group t
 *   DP               TP groups; group t = { d*TP + t : d }            rank_in_group d
 *   component TP (c) one per distinct component size c; DP/c groups;
 *                    group g = { (g*c + j)*TP + t : j, t }            rank_in_group j*TP + t
 *   DP column (c)    one per distinct c; (DP/c)*TP groups; group g*TP + t = { (g*c + j)*TP + t : j }
 *                    rank_in_group j
 * Component and column sets are built for every size in use, even c = 1 (then the component
 * group has the members of the TP group and the column is a group of one). Components with
 * the same size share one set object (aliasing).
 *
 * Pure computation, no I/O: called by the supervisor before it forks, by `dpshard groups`,
 * and by the tests.
 */
#ifndef DPS_ENGINE_GROUPS_H
#define DPS_ENGINE_GROUPS_H

#include <stddef.h>
#include <stdio.h>

/* Parallel configuration, as given by the vLLM-style flags. Sizes default to 1, flags to 0. */
struct dps_par_cfg {
	int tp;           /* --tensor-parallel-size */
	int dp;           /* --data-parallel-size */
	int attn_dp;      /* --attention-dp-size */
	int emb_dp;       /* --embedding-dp-size */
	int mlp_dp;       /* --mlp-dp-size */
	int draft_mlp_dp; /* --draft-mlp-dp-size */
	int lm_head_dp;   /* --lm-head-dp-size */
	int ep;           /* --enable-expert-parallel: experts over the EP group (TP x DP ranks) */
	int a2a;          /* --all2all-backend: enum dps_a2a (0: not given) */
	/*
	 * Disaggregated prefill (docs/DESIGN.md, "Disaggregated prefill and decode"): P prefill
	 * replicas of plain TP (--prefill-data-parallel-size, 0: none, every rank runs both
	 * graphs) of prefill_tp ranks each (--prefill-tensor-parallel-size, 0: tp). The fields
	 * above then describe the decode replicas alone.
	 */
	int prefill_dp;
	int prefill_tp;
	/*
	 * --nodes: the machines the instance spans (0 or 1: this one), ranks numbered node-major
	 * (engine/runtime/nodes.h). Groups never change with it; only where ranks run does.
	 */
	int nodes;
};

/*
 * The MoE dispatch under expert parallelism (--all2all-backend). DPS_A2A_UNSET: not given,
 * which means all-gather + reduce-scatter.
 */
enum dps_a2a { DPS_A2A_UNSET, DPS_A2A_AG_RS, DPS_A2A_V };
/* "allgather_reducescatter", "alltoallv" */
const char *dps_a2a_name(int a2a);

#define DPS_PAR_CFG_DEFAULT { 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0 }
/* Largest world the engine accepts (TP * DP, plus the prefill ranks). */
#define DPS_MAX_WORLD 1024

enum dps_comp {
	DPS_COMP_ATTN,
	DPS_COMP_EMB,
	DPS_COMP_MLP,
	DPS_COMP_DRAFT_MLP,
	DPS_COMP_LM_HEAD,
	DPS_COMP_COUNT
};

/* "attention", "embedding", "mlp", "draft-mlp", "lm-head" */
const char *dps_comp_name(enum dps_comp c);
/* The flag that sets the component's size, e.g. "--mlp-dp-size". */
const char *dps_comp_flag(enum dps_comp c);
/* The component's size in cfg. */
int dps_par_cfg_comp_size(const struct dps_par_cfg *cfg, enum dps_comp c);

/*
 * Checks every rule of the references that the layout alone decides: TP >= 1, DP >= 1,
 * TP*DP <= DPS_MAX_WORLD, each component size a positive divisor of DP; --all2all-backend only
 * with --enable-expert-parallel; --mlp-dp-size 1 with expert parallelism on the all-gather
 * dispatch (the model's rules, such as the experts dividing by the EP degree, are
 * dps_shard_check's). On failure writes a
 * message naming the flag and values (e.g. "--mlp-dp-size 3 does not divide
 * --data-parallel-size 4") into err and returns -DPS_ECONFIG; otherwise 0.
 */
int dps_par_cfg_check(const struct dps_par_cfg *cfg, char *err, size_t errlen);

enum dps_gs_kind { DPS_GS_WORLD, DPS_GS_TP, DPS_GS_DP, DPS_GS_COMP_TP, DPS_GS_DP_COLUMN };

struct dps_groupset {
	enum dps_gs_kind kind;
	int c;             /* component size for COMP_TP and DP_COLUMN, else 0 */
	int n_groups;
	int group_size;
	int *ranks;        /* (n_groups, group_size): world ranks, in rank_in_group order */
	int *group_of;     /* (world): index of the group holding each world rank */
	int *rank_in_group;/* (world): position of each world rank inside its group */
};

#define DPS_MAX_COMP_SIZES DPS_COMP_COUNT

struct dps_groups {
	struct dps_par_cfg cfg;
	int world;                  /* TP * DP: the ranks of this part */
	/*
	 * With disaggregated prefill, the prefill part: the groups of P replicas of plain TP
	 * (cfg tp = prefill_tp, dp = P, every component size 1, no expert parallelism), its ranks
	 * numbered from 0 in its sets and from rank_base (the decode part's world) in the
	 * instance. NULL without; rank_base is 0 in the decode part.
	 */
	struct dps_groups *prefill;
	int rank_base;
	struct dps_groupset world_gs;
	struct dps_groupset tp;
	struct dps_groupset dp;
	int n_sizes;                /* distinct component sizes, ascending */
	int sizes[DPS_MAX_COMP_SIZES];
	struct dps_groupset comp_tp[DPS_MAX_COMP_SIZES]; /* indexed like sizes[] */
	struct dps_groupset dp_col[DPS_MAX_COMP_SIZES];
	/* Aliases: the set each component uses; components of equal size point at one object. */
	const struct dps_groupset *comp_tp_of[DPS_COMP_COUNT];
	const struct dps_groupset *dp_col_of[DPS_COMP_COUNT];
};

/*
 * Builds every group set for cfg (which must pass dps_par_cfg_check; the check is repeated and
 * its message returned in err). Returns 0, -DPS_ECONFIG or -ENOMEM. Free with dps_groups_free.
 */
int dps_groups_build(const struct dps_par_cfg *cfg, struct dps_groups *g, char *err, size_t errlen);
void dps_groups_free(struct dps_groups *g);

/* The ranks of the whole instance: the decode part's, plus the prefill part's when it has one. */
static inline int dps_groups_total(const struct dps_groups *g)
{
	return g->world + (g->prefill ? g->prefill->world : 0);
}

/* The prefill TP size of cfg: prefill_tp, or tp when it is 0. */
static inline int dps_par_cfg_prefill_tp(const struct dps_par_cfg *cfg)
{
	return cfg->prefill_tp ? cfg->prefill_tp : cfg->tp;
}

/* Members of the group of set gs that holds world rank r (group_size entries). */
static inline const int *dps_groupset_members_of(const struct dps_groupset *gs, int r)
{
	return gs->ranks + (size_t)gs->group_of[r] * (size_t)gs->group_size;
}

/* A short human name for a set: "TP", "DP", "world", "component TP (c=4)", "DP column (c=4)". */
const char *dps_groupset_name(const struct dps_groupset *gs, char *buf, size_t len);

/*
 * Calls fn once for every group set the engine creates, in a fixed order (world, TP, DP,
 * then comp_tp[i], dp_col[i] for each distinct size). Used to create the communicators.
 */
void dps_groups_foreach_set(const struct dps_groups *g,
			    void (*fn)(const struct dps_groupset *gs, void *arg), void *arg);

/*
 * Writes the human description printed by `dpshard groups` (grid, every group set with its
 * groups, which components use it, and which sets are aliases of which) to f; with a prefill
 * part, the same for it after, its ranks numbered in the instance.
 */
void dps_groups_print(const struct dps_groups *g, FILE *f);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * engine/runtime/placement.c - decides, and applies, which CPUs and which NUMA node each rank uses.
 *
 * The supervisor calls dps_place_compute (or dps_place_parse_bind for --cpu-bind) once
 * before it forks, prints the result with dps_placement_print, and every rank calls
 * dps_place_apply on itself right after the fork. Worlds are small (tens to a few thousand
 * ranks) and topologies have a handful of nodes, so the simple O(world * nodes) loops here
 * cost nothing next to loading weights.
 *
 * dps_place_compute is a pure function of (topology, TP, DP): the same input always gives
 * the same placement, so every process that recomputes it agrees with the supervisor.
 */
#include <limits.h>
#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dps.h"
#include "engine/runtime/placement.h"

/*
 * Highest CPU number --cpu-bind accepts when there is no topology to check against:
 * Linux's largest NR_CPUS is 8192. Also bounds what one parsed list can allocate.
 */
#define PLACE_MAX_CPU 8191
/* Highest CPU number dps_place_apply will build a cpu_set for. */
#define PLACE_MAX_APPLY_CPU ((1 << 22) - 1)
/* Longest piece of user input quoted back in an error message. */
#define PLACE_QUOTE_MAX 32
#define PLACE_BITS_PER_LONG (sizeof(unsigned long) * CHAR_BIT)

/* ---------------------------------------------------------------------------------------
 * Computing a placement
 */

/* Index of the node with the largest value; the lowest index wins ties. */
static int place_argmax(const long long *v, int n)
{
	int k, best = 0;

	for (k = 1; k < n; k++)
		if (v[k] > v[best])
			best = k;
	return best;
}

/*
 * Shares `world` ranks out over the nodes in proportion to their CPUs: node k gets
 * floor(world * c_k / C), and the ranks left over go one each to the nodes with the largest
 * remainders (lowest node index first on equal remainders). The shares sum to world.
 */
static void place_shares(const struct dps_topo *t, int world, long long total,
			 long long *share, long long *rem)
{
	long long assigned = 0;
	int k;

	for (k = 0; k < t->n_nodes; k++) {
		long long prod = (long long)world * t->nodes[k].n_cpus;

		share[k] = prod / total;
		rem[k] = prod % total;
		assigned += share[k];
	}
	/* Fewer than n_nodes ranks are left, since each remainder loses less than one rank. */
	while (assigned < world) {
		k = place_argmax(rem, t->n_nodes);
		share[k]++;
		rem[k] = -1;
		assigned++;
	}
}

/*
 * Puts each rank on a node. A TP group goes whole onto the node with the most remaining
 * share when it fits there; otherwise its ranks fill nodes one after another, each time
 * taking the node with the most remaining share, so a split group spans as few nodes as
 * the greedy choice allows.
 */
static void place_assign_nodes(int n_nodes, int tp, int dp, long long *remaining,
			       int *node_of)
{
	int d, i;

	for (d = 0; d < dp; d++) {
		int best = place_argmax(remaining, n_nodes);
		int cur = -1;

		if (remaining[best] >= tp) {
			for (i = 0; i < tp; i++)
				node_of[d * tp + i] = best;
			remaining[best] -= tp;
			continue;
		}
		for (i = 0; i < tp; i++) {
			if (cur < 0 || remaining[cur] == 0)
				cur = place_argmax(remaining, n_nodes);
			/* Shares sum to world, so some node always has room left. */
			DPS_ASSERT(remaining[cur] > 0);
			node_of[d * tp + i] = cur;
			remaining[cur]--;
		}
	}
}

/*
 * Gives each rank on node k its CPUs: ranks in world order take contiguous blocks of
 * n_cpus / n_ranks CPUs, or, with more ranks than CPUs, CPU (i mod n_cpus).
 */
static int place_assign_cpus(const struct dps_topo *t, const int *node_of, int world,
			     const long long *count, long long *pos, struct dps_placement *p)
{
	int r, j;

	for (r = 0; r < world; r++) {
		const struct dps_topo_node *node = &t->nodes[node_of[r]];
		struct dps_rank_place *rp = &p->ranks[r];
		long long n_ranks = count[node_of[r]];
		long long i = pos[node_of[r]]++;

		rp->node = t->numa ? node->id : -1;
		if (n_ranks <= node->n_cpus) {
			int per = (int)(node->n_cpus / n_ranks);

			rp->cpus = calloc((size_t)per, sizeof(*rp->cpus));
			if (!rp->cpus)
				return -ENOMEM;
			for (j = 0; j < per; j++)
				rp->cpus[j] = node->cpus[i * per + j];
			rp->n_cpus = per;
		} else {
			rp->cpus = calloc(1, sizeof(*rp->cpus));
			if (!rp->cpus)
				return -ENOMEM;
			rp->cpus[0] = node->cpus[i % node->n_cpus];
			rp->n_cpus = 1;
		}
	}
	return 0;
}

int dps_place_compute(const struct dps_topo *t, int tp, int dp, struct dps_placement *out)
{
	struct dps_placement p = { 0, NULL };
	long long *share = NULL, *rem = NULL, *count = NULL, *pos = NULL;
	int *node_of = NULL;
	long long total = 0;
	int world, k, r, ret;

	if (!t || !out || t->n_nodes < 1 || !t->nodes || tp < 1 || dp < 1)
		return -EINVAL;
	if (__builtin_mul_overflow(tp, dp, &world))
		return -EINVAL;
	for (k = 0; k < t->n_nodes; k++) {
		if (t->nodes[k].n_cpus < 1 || !t->nodes[k].cpus)
			return -EINVAL;
		total += t->nodes[k].n_cpus;
	}

	ret = -ENOMEM;
	share = calloc((size_t)t->n_nodes, sizeof(*share));
	rem = calloc((size_t)t->n_nodes, sizeof(*rem));
	count = calloc((size_t)t->n_nodes, sizeof(*count));
	pos = calloc((size_t)t->n_nodes, sizeof(*pos));
	node_of = calloc((size_t)world, sizeof(*node_of));
	p.ranks = calloc((size_t)world, sizeof(*p.ranks));
	if (!share || !rem || !count || !pos || !node_of || !p.ranks)
		goto err;
	p.world = world;

	place_shares(t, world, total, share, rem);
	/* share[] becomes the remaining share as ranks are put on nodes. */
	place_assign_nodes(t->n_nodes, tp, dp, share, node_of);
	for (r = 0; r < world; r++)
		count[node_of[r]]++;
	ret = place_assign_cpus(t, node_of, world, count, pos, &p);
	if (ret)
		goto err;

	*out = p;
	p.ranks = NULL;
	p.world = 0;
	ret = 0;
err:
	dps_placement_free(&p);
	free(share);
	free(rem);
	free(count);
	free(pos);
	free(node_of);
	return ret;
}

int dps_place_compute_parts(const struct dps_topo *t, int tp, int dp, int ptp, int pdp,
			    struct dps_placement *out)
{
	struct dps_placement d = { 0, NULL }, p = { 0, NULL };
	struct dps_rank_place *all;
	int rc;

	if (!pdp)
		return dps_place_compute(t, tp, dp, out);
	rc = dps_place_compute(t, tp, dp, &d);
	if (!rc)
		rc = dps_place_compute(t, ptp, pdp, &p);
	all = rc ? NULL : realloc(d.ranks, sizeof(*all) * ((size_t)d.world + (size_t)p.world));
	if (!rc && !all)
		rc = -ENOMEM;
	if (rc) {
		dps_placement_free(&d);
		dps_placement_free(&p);
		return rc;
	}
	memcpy(all + d.world, p.ranks, sizeof(*all) * (size_t)p.world);
	free(p.ranks); /* the CPU lists moved */
	out->ranks = all;
	out->world = d.world + p.world;
	return 0;
}

void dps_placement_free(struct dps_placement *p)
{
	int r;

	if (!p)
		return;
	if (p->ranks)
		for (r = 0; r < p->world; r++)
			free(p->ranks[r].cpus);
	free(p->ranks);
	p->ranks = NULL;
	p->world = 0;
}

/* ---------------------------------------------------------------------------------------
 * Formatting CPU lists as "0-3,8,10-11"
 */

/* From index *i of an ascending list, the next run of consecutive CPUs [*a, *b]. */
static void place_next_run(const int *cpus, int n, int *i, int *a, int *b)
{
	*a = cpus[*i];
	*b = *a;
	(*i)++;
	while (*i < n && *b < INT_MAX && cpus[*i] == *b + 1) {
		*b = cpus[*i];
		(*i)++;
	}
}

static void place_print_cpus(FILE *f, const int *cpus, int n)
{
	int i = 0, a, b;

	while (i < n) {
		const char *sep = i ? "," : "";

		place_next_run(cpus, n, &i, &a, &b);
		fprintf(f, "%s%d", sep, a);
		if (b > a)
			fprintf(f, "-%d", b);
	}
}

/*
 * Writes the CPUs set in bitmap (nbits long) as ranges into buf, ending in "..." when it
 * does not fit.
 */
static void place_fmt_bitmap(const unsigned char *bitmap, int nbits, char *buf, size_t len)
{
	size_t used = 0;
	int c = 0;

	if (len == 0)
		return;
	buf[0] = '\0';
	while (c < nbits) {
		int a, b, w;

		if (!bitmap[c]) {
			c++;
			continue;
		}
		a = c;
		while (c + 1 < nbits && bitmap[c + 1])
			c++;
		b = c++;
		if (b > a)
			w = snprintf(buf + used, len - used, "%s%d-%d", used ? "," : "", a, b);
		else
			w = snprintf(buf + used, len - used, "%s%d", used ? "," : "", a);
		if (w < 0 || (size_t)w >= len - used) {
			if (len > 4)
				strcpy(buf + len - 4, "...");
			return;
		}
		used += (size_t)w;
	}
}

void dps_placement_print(const struct dps_placement *p, int tp, FILE *f)
{
	dps_placement_print_parts(p, tp, p ? p->world : 0, 1, f);
}

void dps_placement_print_parts(const struct dps_placement *p, int tp, int n_decode, int ptp,
			       FILE *f)
{
	int r;

	if (!p || !f)
		return;
	for (r = 0; r < p->world; r++) {
		const struct dps_rank_place *rp = &p->ranks[r];

		if (tp >= 1 && r >= n_decode)
			fprintf(f, "rank %d (prefill replica %d, TP %d): ", r, (r - n_decode) / ptp,
				(r - n_decode) % ptp);
		else if (tp >= 1)
			fprintf(f, "rank %d (DP %d, TP %d): ", r, r / tp, r % tp);
		else
			fprintf(f, "rank %d: ", r);
		if (rp->node >= 0)
			fprintf(f, "node %d, ", rp->node);
		else
			fprintf(f, "no memory binding, ");
		if (rp->n_cpus > 0 && rp->cpus) {
			fprintf(f, "cpus ");
			place_print_cpus(f, rp->cpus, rp->n_cpus);
			fputc('\n', f);
		} else {
			fprintf(f, "not pinned\n");
		}
	}
}

/* ---------------------------------------------------------------------------------------
 * Parsing --cpu-bind
 */

struct place_parser {
	int max_cpu;             /* highest acceptable CPU number */
	unsigned char *usable;   /* (max_cpu + 1) 1 for CPUs of the topology; NULL: any */
	unsigned char *seen;     /* (max_cpu + 1) CPUs of the list being parsed */
	size_t n_lists;
	char *err;
	size_t errlen;
};

static void place_err(struct place_parser *ps, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void place_err(struct place_parser *ps, const char *fmt, ...)
{
	va_list ap;

	if (!ps->err || ps->errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(ps->err, ps->errlen, fmt, ap);
	va_end(ap);
}

/* Quoting helpers: at most PLACE_QUOTE_MAX characters of s[0..len), and "..." if cut. */
static int place_qlen(size_t len)
{
	return len > PLACE_QUOTE_MAX ? PLACE_QUOTE_MAX : (int)len;
}

static const char *place_qdots(size_t len)
{
	return len > PLACE_QUOTE_MAX ? "..." : "";
}

/* Names list idx for messages: "CPU list 2" when there are several, else "the CPU list". */
static void place_list_name(const struct place_parser *ps, size_t idx, char *buf, size_t len)
{
	if (ps->n_lists > 1)
		snprintf(buf, len, "CPU list %zu", idx + 1);
	else
		snprintf(buf, len, "the CPU list");
}

/*
 * Parses the decimal digits at s[*i..len) into *v, saturating at INT_MAX so huge numbers
 * never overflow. Returns 0, or -EINVAL when there is no digit.
 */
static int place_parse_num(const char *s, size_t len, size_t *i, long long *v)
{
	size_t start = *i;

	*v = 0;
	while (*i < len && s[*i] >= '0' && s[*i] <= '9') {
		if (*v <= INT_MAX)
			*v = *v * 10 + (s[*i] - '0');
		(*i)++;
	}
	return *i > start ? 0 : -EINVAL;
}

/* Parses one item ("5" or "2-7") of list idx and marks its CPUs in ps->seen. */
static int place_parse_item(struct place_parser *ps, const char *s, size_t len, size_t idx)
{
	char name[32];
	long long a, b, c;
	size_t i = 0;

	place_list_name(ps, idx, name, sizeof(name));
	if (place_parse_num(s, len, &i, &a))
		goto bad;
	b = a;
	if (i < len && s[i] == '-') {
		i++;
		if (place_parse_num(s, len, &i, &b))
			goto bad;
	}
	if (i != len)
		goto bad;
	if (a > ps->max_cpu || b > ps->max_cpu) {
		place_err(ps, "--cpu-bind: CPU number in '%.*s%s' (%s) is too large; the highest "
			  "%s is %d", place_qlen(len), s, place_qdots(len), name,
			  ps->usable ? "usable CPU" : "CPU number accepted", ps->max_cpu);
		return -EINVAL;
	}
	if (a > b) {
		place_err(ps, "--cpu-bind: reversed range '%.*s%s' in %s (write %lld-%lld)",
			  place_qlen(len), s, place_qdots(len), name, b, a);
		return -EINVAL;
	}
	for (c = a; c <= b; c++) {
		if (ps->usable && !ps->usable[c]) {
			char avail[128];

			place_fmt_bitmap(ps->usable, ps->max_cpu + 1, avail, sizeof(avail));
			place_err(ps, "--cpu-bind: CPU %lld in %s is not one this process may use "
				  "(usable CPUs: %s)", c, name, avail);
			return -EINVAL;
		}
		ps->seen[c] = 1;
	}
	return 0;
bad:
	place_err(ps, "--cpu-bind: bad CPU number or range '%.*s%s' in %s (expected N or N-M)",
		  place_qlen(len), s, place_qdots(len), name);
	return -EINVAL;
}

/* Parses the comma-separated list s[0..len), the idx-th of the spec, into rp. */
static int place_parse_list(struct place_parser *ps, const char *s, size_t len, size_t idx,
			    struct dps_rank_place *rp)
{
	char name[32];
	size_t start = 0, i;
	int c, n = 0, ret;

	place_list_name(ps, idx, name, sizeof(name));
	if (len == 0) {
		place_err(ps, "--cpu-bind: %s is empty", name);
		return -EINVAL;
	}
	memset(ps->seen, 0, (size_t)ps->max_cpu + 1);
	for (i = 0; i <= len; i++) {
		if (i < len && s[i] != ',')
			continue;
		if (i == start) {
			place_err(ps, "--cpu-bind: empty entry in %s '%.*s%s'", name,
				  place_qlen(len), s, place_qdots(len));
			return -EINVAL;
		}
		ret = place_parse_item(ps, s + start, i - start, idx);
		if (ret)
			return ret;
		start = i + 1;
	}
	for (c = 0; c <= ps->max_cpu; c++)
		n += ps->seen[c];
	rp->node = -1;
	rp->cpus = calloc((size_t)n, sizeof(*rp->cpus));
	if (!rp->cpus)
		return -ENOMEM;
	rp->n_cpus = 0;
	for (c = 0; c <= ps->max_cpu; c++)
		if (ps->seen[c])
			rp->cpus[rp->n_cpus++] = c;
	return 0;
}

/* Sets up the CPU bounds and the usable-CPU map from t (or the fixed limit without t). */
static int place_parser_init(struct place_parser *ps, const struct dps_topo *t)
{
	int k, i;

	ps->max_cpu = PLACE_MAX_CPU;
	if (t) {
		if (t->n_nodes > 0 && !t->nodes) {
			place_err(ps, "--cpu-bind: the CPU topology is empty or invalid");
			return -EINVAL;
		}
		ps->max_cpu = -1;
		for (k = 0; k < t->n_nodes; k++)
			for (i = 0; i < t->nodes[k].n_cpus; i++)
				if (t->nodes[k].cpus[i] > ps->max_cpu)
					ps->max_cpu = t->nodes[k].cpus[i];
		if (ps->max_cpu < 0 || ps->max_cpu == INT_MAX) {
			place_err(ps, "--cpu-bind: the CPU topology is empty or invalid");
			return -EINVAL;
		}
		ps->usable = calloc((size_t)ps->max_cpu + 1, 1);
		if (!ps->usable)
			return -ENOMEM;
		for (k = 0; k < t->n_nodes; k++)
			for (i = 0; i < t->nodes[k].n_cpus; i++)
				if (t->nodes[k].cpus[i] >= 0)
					ps->usable[t->nodes[k].cpus[i]] = 1;
	}
	ps->seen = calloc((size_t)ps->max_cpu + 1, 1);
	return ps->seen ? 0 : -ENOMEM;
}

int dps_place_parse_bind(const char *spec, int world, const struct dps_topo *t,
			 struct dps_placement *out, char *err, size_t errlen)
{
	struct place_parser ps = { 0, NULL, NULL, 1, err, errlen };
	struct dps_placement p = { 0, NULL };
	const char *s;
	size_t idx, r;
	int ret;

	if (err && errlen)
		err[0] = '\0';
	if (!spec || !*spec) {
		place_err(&ps, "--cpu-bind: empty value (use auto, off, or CPU lists such as "
			  "0-1:2-3)");
		return -EINVAL;
	}
	if (world < 1 || !out) {
		place_err(&ps, "--cpu-bind: invalid number of ranks %d", world);
		return -EINVAL;
	}
	if (!strcmp(spec, "auto"))
		return 1;

	p.ranks = calloc((size_t)world, sizeof(*p.ranks));
	if (!p.ranks) {
		place_err(&ps, "--cpu-bind: out of memory");
		return -ENOMEM;
	}
	p.world = world;
	for (r = 0; r < (size_t)world; r++)
		p.ranks[r].node = -1;
	if (!strcmp(spec, "off"))
		goto done;

	for (s = spec; *s; s++)
		ps.n_lists += *s == ':';
	if (ps.n_lists != 1 && ps.n_lists != (size_t)world) {
		place_err(&ps, "--cpu-bind has %zu CPU lists for %d rank%s (give one list, or "
			  "one per rank separated by ':')", ps.n_lists, world,
			  world == 1 ? "" : "s");
		ret = -EINVAL;
		goto err;
	}
	ret = place_parser_init(&ps, t);
	if (ret)
		goto err;

	s = spec;
	for (idx = 0; idx < ps.n_lists; idx++) {
		const char *end = strchr(s, ':');
		size_t len = end ? (size_t)(end - s) : strlen(s);

		ret = place_parse_list(&ps, s, len, idx, &p.ranks[idx]);
		if (ret)
			goto err;
		s += len + (end ? 1 : 0);
	}
	/* One list for everybody: copy it to the other ranks. */
	for (r = ps.n_lists; r < (size_t)world; r++) {
		const struct dps_rank_place *src = &p.ranks[0];
		struct dps_rank_place *dst = &p.ranks[r];

		dst->cpus = malloc((size_t)src->n_cpus * sizeof(*dst->cpus));
		if (!dst->cpus) {
			ret = -ENOMEM;
			goto err;
		}
		memcpy(dst->cpus, src->cpus, (size_t)src->n_cpus * sizeof(*dst->cpus));
		dst->n_cpus = src->n_cpus;
		dst->node = -1;
	}
done:
	free(ps.usable);
	free(ps.seen);
	*out = p;
	return 0;
err:
	if (ret == -ENOMEM)
		place_err(&ps, "--cpu-bind: out of memory");
	free(ps.usable);
	free(ps.seen);
	dps_placement_free(&p);
	return ret;
}

/* ---------------------------------------------------------------------------------------
 * Applying a placement to the calling process
 */

/* Binds the caller's future allocations to NUMA node `node` (MPOL_BIND). */
static int place_bind_memory(int node)
{
	size_t words = (size_t)node / PLACE_BITS_PER_LONG + 1;
	unsigned long *mask;
	int ret = 0;

	if (node > numa_max_possible_node())
		return -EINVAL;
	mask = calloc(words, sizeof(*mask));
	if (!mask)
		return -ENOMEM;
	mask[(size_t)node / PLACE_BITS_PER_LONG] |= 1UL << ((size_t)node % PLACE_BITS_PER_LONG);
	/* The kernel reads maxnode - 1 bits, hence the + 1. */
	if (set_mempolicy(MPOL_BIND, mask, words * PLACE_BITS_PER_LONG + 1) < 0)
		ret = -errno;
	free(mask);
	return ret;
}

static int place_set_affinity(const int *cpus, int n)
{
	cpu_set_t *set;
	size_t size;
	int i, max = 0, ret = 0;

	for (i = 0; i < n; i++) {
		if (cpus[i] < 0 || cpus[i] > PLACE_MAX_APPLY_CPU)
			return -EINVAL;
		if (cpus[i] > max)
			max = cpus[i];
	}
	set = CPU_ALLOC(max + 1);
	if (!set)
		return -ENOMEM;
	size = CPU_ALLOC_SIZE(max + 1);
	CPU_ZERO_S(size, set);
	for (i = 0; i < n; i++)
		CPU_SET_S(cpus[i], size, set);
	if (sched_setaffinity(0, size, set) < 0)
		ret = -errno;
	CPU_FREE(set);
	return ret;
}

int dps_place_apply(const struct dps_rank_place *p)
{
	int ret;

	if (!p || p->n_cpus < 0 || (p->n_cpus > 0 && !p->cpus))
		return -EINVAL;
	/* Pin first so whatever is allocated from here on is touched from the right node. */
	if (p->n_cpus > 0) {
		ret = place_set_affinity(p->cpus, p->n_cpus);
		if (ret)
			return ret;
	}
	if (p->node >= 0 && numa_available() >= 0) {
		ret = place_bind_memory(p->node);
		if (ret)
			return ret;
	}
	return 0;
}

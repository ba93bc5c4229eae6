#include "threads.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int popcount_mask(const uint64_t *m) {
    int n = 0;
    for (int w = 0; w < DT_CPU_WORDS; w++) n += __builtin_popcountll(m[w]);
    return n;
}

static int overlaps(const uint64_t *a, const uint64_t *b) {
    for (int w = 0; w < DT_CPU_WORDS; w++)
        if (a[w] & b[w]) return 1;
    return 0;
}

/* A rank's threads: its request, else its CPUs shared with the ranks overlapping them,
 * and no more than its share of the node's quota. */
static int rank_threads(const dt_rank_cpus *ranks, int n, int i, int quota) {
    if (ranks[i].requested > 0) return ranks[i].requested;
    int sharing = 0;
    for (int j = 0; j < n; j++) sharing += overlaps(ranks[i].mask, ranks[j].mask);
    int cpus = popcount_mask(ranks[i].mask);
    int t = sharing > 0 ? cpus / sharing : cpus;
    if (quota > 0 && t > quota / n) t = quota / n;
    return t < 1 ? 1 : t;
}

void dt_threads_plan_node(const dt_rank_cpus *ranks, int n, int me, int quota, dt_threads_plan *out) {
    memset(out, 0, sizeof *out);
    uint64_t all[DT_CPU_WORDS] = {0};
    for (int j = 0; j < n; j++) {
        for (int w = 0; w < DT_CPU_WORDS; w++) all[w] |= ranks[j].mask[w];
        out->sharing += overlaps(ranks[me].mask, ranks[j].mask);
        out->node_threads += rank_threads(ranks, n, j, quota);
    }
    out->node_ranks = n;
    out->node_cpus = popcount_mask(all);
    if (quota > 0 && quota < out->node_cpus) out->node_cpus = quota;
    out->cpus = popcount_mask(ranks[me].mask);
    out->threads = rank_threads(ranks, n, me, quota);
    out->source = ranks[me].requested > 0 ? ranks[me].source : DT_THREADS_AUTO;
    /* ranks alone outnumbering the CPUs is the user's -np, not a thread setting */
    int forced = 0;
    for (int j = 0; j < n; j++) forced |= ranks[j].requested > 1;
    out->forced_over = forced && out->node_threads > out->node_cpus && out->node_threads > n;
}

/* cgroup v2's "quota period" in cpu.max, rounded up to whole CPUs; 0 without a limit. */
static int cgroup_quota(void) {
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (!f) return 0;
    char q[32] = "";
    long long period = 0;
    int got = fscanf(f, "%31s %lld", q, &period);
    fclose(f);
    if (got != 2 || !strcmp(q, "max") || period <= 0) return 0;
    long long quota = atoll(q);
    return quota > 0 ? (int)((quota + period - 1) / period) : 0;
}

/* OMP_NUM_THREADS's first level ("4" or "4,2"), 0 when unset or not a positive count. */
static int env_threads(void) {
    const char *e = getenv("OMP_NUM_THREADS");
    if (!e || !*e) return 0;
    char *end;
    long v = strtol(e, &end, 10);
    return (end != e && (*end == 0 || *end == ',') && v > 0 && v <= 4096) ? (int)v : 0;
}

dt_status dt_threads_choose(dt_comm *world, int requested, dt_threads_plan *out) {
    dt_rank_cpus me;
    memset(&me, 0, sizeof me);
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        for (int cpu = 0; cpu < CPU_SETSIZE && cpu < 64 * DT_CPU_WORDS; cpu++)
            if (CPU_ISSET(cpu, &set)) me.mask[cpu / 64] |= 1ull << (cpu % 64);
    }
    if (popcount_mask(me.mask) == 0) me.mask[0] = 1; /* unknown: one CPU */
    if (requested > 0) {
        me.requested = requested;
        me.source = DT_THREADS_CONFIG;
    } else if (env_threads() > 0) {
        me.requested = env_threads();
        me.source = DT_THREADS_ENV;
    }
    int n = dt_comm_local_size(world);
    dt_rank_cpus *all = calloc((size_t)n, sizeof *all);
    /* agreed first: a rank that cannot take part must not leave the others in the exchange */
    dt_status s = dt_comm_agree(world, all ? DT_OK : dt_fail(DT_ERUNTIME, "threads: out of memory"), NULL);
    if (s == DT_OK) s = dt_comm_node_allgather(world, &me, all, sizeof me);
    if (s == DT_OK) dt_threads_plan_node(all, n, dt_comm_local_rank(world), cgroup_quota(), out);
    free(all);
    return s;
}

void dt_threads_describe(const dt_threads_plan *p, char *buf, size_t cap) {
    if (p->source == DT_THREADS_CONFIG)
        snprintf(buf, cap, "%d per rank (threads=%d)", p->threads, p->threads);
    else if (p->source == DT_THREADS_ENV)
        snprintf(buf, cap, "%d per rank (OMP_NUM_THREADS)", p->threads);
    else if (p->node_ranks > p->node_cpus)
        snprintf(buf, cap, "%d per rank (automatic: %d ranks on this node's %d CPU%s, ranks share cores)", p->threads,
                 p->node_ranks, p->node_cpus, p->node_cpus == 1 ? "" : "s");
    else
        snprintf(buf, cap, "%d per rank (automatic: %d CPU%s shared by %d rank%s)", p->threads, p->cpus,
                 p->cpus == 1 ? "" : "s", p->sharing, p->sharing == 1 ? "" : "s");
}

void dt_threads_warning(const dt_threads_plan *p, char *buf, size_t cap) {
    buf[0] = 0;
    if (!p->forced_over) return;
    /* OpenMP's threads spin between parallel regions unless told to sleep: oversubscribed,
     * they spin on the cores the other ranks need (a dp 2 x cp 2 run on 2 threads per rank
     * on 2 CPUs: 47 s spinning, 1.1 s passive) */
    const char *wait = getenv("OMP_WAIT_POLICY");
    int passive = wait && (!strcmp(wait, "passive") || !strcmp(wait, "PASSIVE"));
    snprintf(buf, cap,
             "dtrain: warning: %d rank%s with %d threads in all (%d on this rank, %s) on this node's %d CPU%s: "
             "oversubscribed, the ranks wait for each other's cores (often many times slower); leave threads at 0 "
             "(automatic) and OMP_NUM_THREADS unset, or lower them%s",
             p->node_ranks, p->node_ranks == 1 ? "" : "s", p->node_threads, p->threads,
             p->source == DT_THREADS_ENV ? "OMP_NUM_THREADS" : "threads", p->node_cpus, p->node_cpus == 1 ? "" : "s",
             passive ? "" : ", or set OMP_WAIT_POLICY=passive so that idle threads sleep instead of spinning");
}

/* Threads per rank. OpenMP's default is every core for every process, so N ranks on a
 * node of C cores run N x C threads and wait on each other (169x slower seen for 4 ranks
 * on 2 cores). As torchrun sets OMP_NUM_THREADS=1 for several processes, dtrain shares a
 * node's CPUs among the ranks that run on it: a rank gets the CPUs it may run on (its
 * affinity mask, so mpirun's --bind-to is honoured) divided by the ranks of the node whose
 * masks overlap it, capped by the node's cgroup CPU quota, at least 1. `threads` > 0 or
 * OMP_NUM_THREADS override it; a forced count that oversubscribes the node is warned of. */
#ifndef DT_THREADS_H
#define DT_THREADS_H
#include <stddef.h>
#include <stdint.h>

#include "../comm/comm.h"
#include "../core/status.h"

#define DT_CPU_WORDS 16 /* 1024 CPUs, cpu_set_t's size */

typedef enum { DT_THREADS_AUTO, DT_THREADS_CONFIG, DT_THREADS_ENV } dt_threads_source;

/* What one rank of a node brings to the choice (exchanged within the node). */
typedef struct {
    uint64_t mask[DT_CPU_WORDS]; /* CPUs it may run on */
    int32_t requested;           /* threads > 0 from config or OMP_NUM_THREADS, else 0 */
    int32_t source;              /* dt_threads_source of `requested` */
} dt_rank_cpus;

typedef struct {
    int threads;     /* this rank's OpenMP and BLAS threads */
    int source;      /* dt_threads_source */
    int cpus;        /* CPUs this rank may run on */
    int sharing;     /* ranks of the node whose CPUs overlap this rank's, itself included */
    int node_ranks;  /* ranks on this node */
    int node_cpus;   /* CPUs the node's ranks may use together (union of masks, cgroup quota) */
    int node_threads;/* threads of every rank of the node together */
    int forced_over; /* a requested count makes node_threads exceed node_cpus */
} dt_threads_plan;

/* Pure: rank `me`'s plan among the n ranks of its node; quota = the cgroup's CPU limit
 * (0: none). */
void dt_threads_plan_node(const dt_rank_cpus *ranks, int n, int me, int quota, dt_threads_plan *out);
/* Reads this rank's affinity, OMP_NUM_THREADS and the cgroup quota, exchanges them within
 * the node (collective over world) and plans; `requested` is config `threads`. */
dt_status dt_threads_choose(dt_comm *world, int requested, dt_threads_plan *out);
/* "1 per rank (automatic: 4 ranks share this node's 2 CPUs)" and the like. */
void dt_threads_describe(const dt_threads_plan *p, char *buf, size_t cap);
/* The one-line warning for a forced oversubscription, or "" when there is none. */
void dt_threads_warning(const dt_threads_plan *p, char *buf, size_t cap);

#endif

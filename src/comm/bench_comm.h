/* `dtrain bench comm`: bandwidth of each collective under each algorithm (ours and
 * MPI's) across message sizes, printed as a table by rank 0. */
#ifndef DT_BENCH_COMM_H
#define DT_BENCH_COMM_H
#include "../core/status.h"
#include "comm.h"

/* argv holds the options only (argv[0] is the first option):
 *   --sizes MIN:MAX   bytes, with K/M/G suffixes (default 4K:256M); sizes are 4 KiB·4^k
 *   --ops LIST        allreduce,reduce_scatter,allgather (default all three)
 *   --algos LIST      mpi,ring,rhd,tree,shm (default all; each op runs those that implement it)
 *   --iters N         timed iterations per point (default adaptive, >= 3)
 *   --group K         the collectives in groups of K consecutive ranks, all at once
 *   --between US      US microseconds of computation before each call, less from its time
 * The world's algorithm choices are restored afterwards. */
dt_status dt_bench_comm(dt_comm *world, int argc, char **argv);

#endif

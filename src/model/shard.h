/* Shard specs: how a rank's piece of a tensor sits in the unsharded ("global") tensor.
 * Every parameter carries one; checkpoints, initialisation, the digest, ZeRO and the
 * estimator read it, so they work for any layout without knowing the strategy.
 *
 * A tensor is 2-D [rows, cols] (1-D tensors are [1, n]). It is replicated (dim = -1) or
 * split along dim 0 (rows) or dim 1 (cols) into `pieces` nearly equal pieces, this rank
 * holding piece `index`. `parts` > 1 splits a fused tensor part by part: c_attn's columns
 * are q | k | v, and tensor parallelism gives each rank its slice of each of q, k and v
 * (so the local tensor is [q_i | k_i | v_i]). Rows beyond `real_rows` (the padded
 * vocabulary) exist in memory but not in the model: zero, never saved, never digested.
 * Pieces are equal-sized: the split extent (per part) must divide by `pieces`, which the
 * model guarantees by its shape checks (n_head % tp, padded vocabulary).
 *
 * A split piece may be held by `replicas` ranks (Llama's key/value heads under a tp above
 * n_kv_head: n_kv_head pieces, tp / n_kv_head ranks each), this rank being replica
 * `replica` of its piece; their values are the same. What counts each element once (the
 * gradient norm, checkpoints, the digest) takes replica 0's; what reads a piece (loading,
 * initialisation by global index) does so on every replica. A tensor of one piece is held
 * whole by every rank anyway: replicas 1. */
#ifndef DT_SHARD_H
#define DT_SHARD_H
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"

typedef struct {
    int64_t rows, cols; /* global shape, padding rows included */
    int64_t real_rows;  /* rows that belong to the model (<= rows) */
    int dim;            /* -1 replicated, 0 rows, 1 columns */
    int pieces, index;  /* split into `pieces`; this rank holds piece `index` */
    int parts;          /* fused parts split separately along dim (1 = none) */
    int replicas;       /* ranks holding piece `index` (1 = this one alone) */
    int replica;        /* which of them this rank is, 0 .. replicas-1 */
} dt_shard;

/* A replicated spec of a [rows, cols] tensor of which real_rows are real. */
dt_shard dt_shard_full(int64_t rows, int64_t cols, int64_t real_rows);
/* The same tensor split along dim into pieces (parts fused parts), piece index. Fails
 * (DT_EINPUT, naming what) if the extent per part is not divisible by pieces. */
dt_status dt_shard_split(dt_shard *s, int dim, int pieces, int index, int parts, const char *what);
/* A split over `ranks` ranks of which this is `rank`, each piece held by `replicas` of
 * them (ranks / replicas pieces, this rank holding piece rank / replicas as replica
 * rank % replicas; replicas 1: dt_shard_split). Fails (DT_EINPUT) as dt_shard_split does,
 * or if replicas does not divide ranks. */
dt_status dt_shard_split_replicated(dt_shard *s, int dim, int ranks, int rank, int replicas, int parts,
                                    const char *what);

/* The local (held) shape, padding rows included. */
void dt_shard_local_shape(const dt_shard *s, int64_t *rows, int64_t *cols);
int64_t dt_shard_local_numel(const dt_shard *s);
/* Global row-major index of local element (r, c). */
int64_t dt_shard_global_index(const dt_shard *s, int64_t r, int64_t c);
/* Whether local row r is a real (not padding) row of the model. */
int dt_shard_row_is_real(const dt_shard *s, int64_t r);

/* The local tensor as contiguous runs of the global one: run k copies `len` elements
 * from local offset `local` to global offset `global`. Padding rows are left out.
 * Returns the number of runs (at most dt_shard_max_runs), writing min(that, cap). */
typedef struct {
    int64_t local, global, len;
} dt_shard_run;
int64_t dt_shard_max_runs(const dt_shard *s);
int64_t dt_shard_runs(const dt_shard *s, dt_shard_run *runs, int64_t cap);

#endif

/* Bitwise-reproducible gradient reduction (parallel.determinism = bitwise).
 *
 * The gradient of a step is defined as one fixed binary tree over the step's M global
 * micro-batches, leaves in order j = 0..M-1, adjacent pairs first. Micro-step k of
 * data-parallel rank r computes leaf j = k·N + r, so the N leaves of micro-step k form
 * an aligned subtree: its levels are summed across ranks by a recursive-halving
 * exchange that pairs ranks at distance 1, 2, 4, ... (tree_allreduce), and the upper
 * levels over k by a binary counter on each rank (the fold stack). Floating-point
 * addition is commutative, so every node has the same value whichever rank computes
 * it, and the weights after K steps are bitwise identical for any N and any mode.
 * Needs N and M powers of two.
 *
 * bitwise.c applies it per unit (each unit's gradient of a micro-batch is a leaf), and
 * defines the tied wte's gradient as the head's fold plus the embedding's fold.
 *
 * The gradient norm is exact (bitwise.c: an integer sum of truncated squares, the same
 * for any split of the elements). ZeRO's units are padded to DT_CANON_CHUNK elements. */
#ifndef DT_CANONICAL_H
#define DT_CANONICAL_H
#include <stddef.h>

#include "../../comm/comm.h"
#include "../../core/status.h"

#define DT_CANON_CHUNK 1024

/* In place over ranks (N a power of two); tmp holds count/2 + 1 floats. */
dt_status dt_tree_allreduce(dt_comm *c, float *buf, size_t count, float *tmp);
/* ... each node rounded to bf16 (fp32 values bf16 holds exactly: bf16 storage's sums,
 * each addition in fp32 then rounded, as the bf16 backend's add). */
dt_status dt_tree_allreduce_bf16(dt_comm *c, float *buf, size_t count, float *tmp);

/* Binary-counter fold of leaves into tree nodes, over buffers of n floats cut into parts
 * (element ranges) that fold independently: a part's leaves arrive in order, but parts
 * may be at different leaves at one time (a pipeline stage finishes one unit's gradient
 * of micro-batch k while another unit is still at k - 1). Each part's nodes are exactly
 * those of a fold over its range alone; after the same number of leaves every part's root
 * is in the same buffer. */
typedef struct {
    size_t n;
    int cap;
    float **buf;  /* cap + 1 physical buffers */
    int nparts;
    size_t *off, *len;
    int *perm;    /* per part, cap + 1: logical slot -> buffer (slot cap: the next leaf) */
    int *height;  /* per part, cap + 1 */
    int *sp;      /* per part: stack depth */
    int *count;   /* per part: leaves pushed since the reset */
    int leaves;   /* leaves per step */
} dt_fold;

/* nparts ranges [off[i], off[i] + len[i]) of n floats (nparts 0: one part, all n). */
dt_status dt_fold_create(dt_fold *f, size_t n, int leaves, int nparts, const size_t *off, const size_t *len);
void dt_fold_destroy(dt_fold *f);
/* Buffer holding part's next leaf (its range zeroed; the part lives at buffer + off). */
float *dt_fold_next(dt_fold *f, int part);
/* The part's leaf written there is complete: merge equal-height nodes of the part. */
void dt_fold_push(dt_fold *f, int part);
/* After all leaves: the buffer holding every non-empty part's root, NULL unless every
 * non-empty part received exactly `leaves` leaves (a power of two: one node). */
float *dt_fold_root(dt_fold *f);
void dt_fold_reset(dt_fold *f);
size_t dt_fold_bytes(const dt_fold *f);

#endif

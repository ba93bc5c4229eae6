/* Per-rank state that no other layout could reassemble: each local-SGD replica's own
 * weights and inner moments between synchronisations, the delayed mode's queued
 * gradients (parallel.sync, parallel.staleness). One safetensors file per world rank,
 *   DIR/rank_state/step_%08lld/rank-%05d.safetensors
 * written by every rank before the step's checkpoint commits (a committed step always
 * has its files; a save that fails before its commit leaves files that the next commit's
 * prune removes), and read at resume by the same layout: each file records the layout it
 * belongs to ("... | world W dp D": what must match, then the world), and another is
 * refused (DT_EINPUT, one line) unless the mode can take another rank's state
 * (dt_rank_state_open_from). A run in a mode without such state reads the checkpoint
 * alone, as any checkpoint. */
#ifndef DT_RANK_STATE_H
#define DT_RANK_STATE_H
#include "../core/status.h"
#include "safetensors.h"

/* Writes this rank's file for step `step` of the checkpoint directory dir (atomically);
 * layout: a one-line description that a resume must match. */
dt_status dt_rank_state_save(const char *dir, long long step, int rank, const char *layout, const st_tensor_ref *t,
                             int n);
/* Opens this rank's file for the step directory step_dir (DIR/step_N[.vK]) and checks its
 * layout; st_close it after use. */
dt_status dt_rank_state_open(const char *step_dir, long long step, int rank, const char *layout, st_file *f);
/* The file rank `from` wrote for the step, whatever its layout (*layout: it, in f's
 * metadata): a mode that can take another rank's state (local SGD at a synchronisation,
 * onto fewer or more replicas). */
dt_status dt_rank_state_open_from(const char *step_dir, long long step, int from, st_file *f, const char **layout);
/* Whether the checkpoint of step_dir has rank state for the step at all (a mode that can
 * start afresh reads a checkpoint of another mode as any). */
int dt_rank_state_present(const char *step_dir, long long step);
/* Reads tensor `name` of n fp32 values into dst (its size checked, NaN/Inf refused); _f64:
 * of n fp64 values. */
dt_status dt_rank_state_read(st_file *f, const char *name, float *dst, size_t n);
dt_status dt_rank_state_read_f64(st_file *f, const char *name, double *dst, size_t n);
/* Rank 0 before a save's files are written (then every rank agrees): removes the step's
 * files of an earlier save of the same step, so none of another run or world stays. */
void dt_rank_state_clear(const char *dir, long long step);
/* Rank 0 after a commit: removes the files of steps below the newest committed one that
 * have no step directory (a step above it may be a save under way). */
void dt_rank_state_prune(const char *dir);

#endif

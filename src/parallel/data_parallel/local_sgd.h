/* Local SGD and DiLoCo (parallel.sync; docs/parallelism.md, "Local SGD and DiLoCo"): the
 * data-parallel replicas train apart and meet every H = parallel.sync_every steps. Each
 * replica (its model-parallel ranks, and its context-parallel ranks, which still reduce
 * their gradients every step) runs its own inner optimizer, AdamW, on its share of every
 * global batch, with no communication between replicas. At a synchronisation the
 * replicas average their change since the last one, delta = theta_sync - theta_r, and an
 * outer step moves the synchronised weights:
 *   - local SGD: theta_sync -= mean delta (the replicas' weights averaged);
 *   - DiLoCo (Douillard et al. 2023): a Nesterov step, m = mu m + delta,
 *     theta_sync -= lr (delta + mu m), with parallel.outer_lr and parallel.outer_momentum.
 * Every replica then goes on from theta_sync, its inner optimizer state its own. One
 * all-reduce of the parameters every H steps instead of one of the gradients every step.
 * The last step of the run synchronises too, so the run ends with one model. */
#ifndef DT_LOCAL_SGD_H
#define DT_LOCAL_SGD_H
#include "../../comm/comm.h"
#include "../layout/layout.h"
#include "data_parallel.h"

typedef struct dt_local_sgd dt_local_sgd;

/* The layouts these modes run (checked with the others, dt_layout_check): several
 * replicas, DDP inside each, no checkpoints yet. */
dt_status dt_local_sgd_check(const dt_layout *L);
/* The synchronisation of the inner engine's weights over the replicas' group (this
 * rank's peers holding the same piece of the model; n: the parameters of this rank's
 * model); host buffers allocated once. group: the replica's own ranks when it has
 * several (parallel.dp_shard; DDP inside, so they hold the same weights), which split
 * the synchronisation into slices and gather them after; NULL for one.
 * last_step: the run's last step (train.steps). Replicas as separate jobs (L->jobs.n > 1):
 * this rank connects to the outer server for `slot` (its rank in its job). */
dt_status dt_local_sgd_create(dt_local_sgd **out, const dt_layout *L, dt_comm *replicas, dt_comm *group, dt_dp *inner,
                              size_t n, long long last_step, int slot);
void dt_local_sgd_free(dt_local_sgd *s);
/* Replicas as separate jobs, before the first step (after the weights are initialised or
 * loaded at `step`): replica 0 gives the outer server its weights if it has none yet;
 * every replica takes the server's synchronised weights (and DiLoCo's momentum), which are
 * at step *at >= step: a replica that joins late goes on from there. Otherwise *at = step. */
dt_status dt_local_sgd_join(dt_local_sgd *s, long long step, long long *at);
/* The outer step on n values from the replicas' changes summed over `count` replicas:
 * local SGD (mom NULL: theta -= sum / count) or DiLoCo's Nesterov step. The outer server
 * (src/launch/outer_server.c) runs this one too, so it and the replicas hold the same bits. */
void dt_outer_step(float *theta, float *mom, const float *sum, size_t n, int count, float lr, float mu);
/* Before a step: the first one takes the weights as the synchronised ones. */
dt_status dt_local_sgd_before_step(dt_local_sgd *s);
/* After step `step` (1-based): at a synchronisation, the outer step; collective over the
 * replicas then, nothing otherwise. */
dt_status dt_local_sgd_after_step(dt_local_sgd *s, long long step);
/* Whether step `step` ends with a synchronisation. */
int dt_local_sgd_syncs_at(const dt_local_sgd *s, long long step);
/* This rank's state after `step` steps (the replica's own weights and inner moments, the
 * synchronised weights, DiLoCo's momentum) as its checkpoint state (ckpt/rank_state.h),
 * and back (after the checkpoint's own load). */
dt_status dt_local_sgd_save(dt_local_sgd *s, const char *dir, long long step, int rank, const char *layout);
dt_status dt_local_sgd_load(dt_local_sgd *s, const char *step_dir, long long step, int rank, const char *layout);
/* Host bytes it holds (0 for NULL). */
size_t dt_local_sgd_bytes(const dt_local_sgd *s);
/* So far: seconds in the synchronisations' all-reduce, and the parameter bytes this rank
 * sent for it (a ring's 2 (R-1)/R of the model's). */
void dt_local_sgd_stats(const dt_local_sgd *s, double *seconds, double *sent);

#endif

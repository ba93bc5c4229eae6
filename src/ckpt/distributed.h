/* Checkpoints and the digest of a distributed training state: who writes what, the
 * whole-tensor assembly and the stage writers' commit (whole_model.h, stage_save.h), and
 * the asynchronous save's job (async_save.h). The state's owner (the data-parallel
 * engine: its strategy holds the optimizer state) only hands over its pieces
 * (dt_ckpt_pieces); everything a save decides is here. Implemented by distributed.c.
 *
 * Who does what (dt_ckpt_roles_of, the one place that says it):
 *   - no model parallelism: data-parallel rank 0 writes the files alone, from the full
 *     state (open_full), or, where the strategy streams (ZeRO: source_open) and the save
 *     is synchronous, one piece whole at a time while every rank makes the same gathers;
 *     an asynchronous save's child writes from a snapshot of the full state (fork);
 *   - tensor/pipeline parallelism: the first replica (data-parallel rank 0 of each
 *     model-parallel group) assembles each stage's whole tensors at the stage's first
 *     tensor-parallel rank, which writes its stage's files; the first stage's commits
 *     (stage_save.h). The digest's whole model is assembled at the first stage's root.
 *   - a load has no roles: every rank reads its own pieces out of the files' whole
 *     tensors by their shard specs (checkpoint.h dt_ckpt_load_*), so any layout reads
 *     any checkpoint; the strategy's load does it. */
#ifndef DT_CKPT_DISTRIBUTED_H
#define DT_CKPT_DISTRIBUTED_H
#include "../comm/comm.h"
#include "async_save.h"
#include "checkpoint.h"
#include "whole_model.h"

/* The ranks a checkpoint spans. */
typedef struct {
    dt_comm *dp;        /* the data-parallel group: replicas, or ZeRO's shards */
    dt_whole_groups mp; /* the model-parallel groups the model's tensors are split over */
    dt_comm *replicas;  /* HSDP: the other shard groups holding the same state (NULL: none); only the first writes */
} dt_ckpt_groups;

typedef struct {
    int split;    /* the tensors are split over model-parallel groups: assembled before writing */
    int replica0; /* data-parallel rank 0: reads the full state; with split, assembles and writes */
    int writer;   /* writes files: all of them (not split), or its stage's (its stage's root) */
    int root;     /* split: holds the whole model the digest is of */
} dt_ckpt_roles;
dt_ckpt_roles dt_ckpt_roles_of(const dt_ckpt_groups *g);

/* What the state's owner hands over (ctx: its own), collective over the data-parallel
 * group where its state is sharded:
 *   open_full: the full fp32 weights as the model's unit views in host memory and, with
 *     moments, the optimizer moments as unit views (*mv, *vv), on the ranks where reader
 *     is set (the others only take part in the gathers); snapshot: in private memory (a
 *     fork sees no later change). close_full undoes it.
 *   source_open (NULL: none): a streamed source, one piece whole at a time (checkpoint.h
 *     dt_ckpt_source); source_close frees it. */
typedef struct {
    void *ctx;
    dt_status (*open_full)(void *ctx, int moments, int snapshot, int reader, float ***mv, float ***vv);
    dt_status (*close_full)(void *ctx, float **mv, float **vv);
    dt_status (*source_open)(void *ctx, int moments, int reader, dt_ckpt_source *src);
    void (*source_close)(void *ctx, dt_ckpt_source *src);
} dt_ckpt_pieces;

typedef struct {
    dt_ckpt_groups g;
    const gpt_model *m; /* this rank's model, whose unit views open_full points at the full weights */
    dt_ckpt_pieces pieces;
    int async;         /* checkpoint.async: the writer's files written by a child */
    dt_ckpt_async job; /* the save in flight */
} dt_ckpt_dist;

void dt_ckpt_dist_init(dt_ckpt_dist *c, const dt_ckpt_groups *g, const gpt_model *m, const dt_ckpt_pieces *p);
/* checkpoint.async: later saves return once the state is gathered, the writer's files
 * written by a child (async_save.h). Only where rank 0 writes alone (not split: the
 * stage writers commit together and save synchronously). Returns whether saves are. */
int dt_ckpt_dist_set_async(dt_ckpt_dist *c, int on);
/* Collective: the checkpoint of step st->step in dir (files: checkpoint.h; shard_mb:
 * checkpoint.shard_mb), written as the roles say; every rank gets the status. */
dt_status dt_ckpt_save_distributed(dt_ckpt_dist *c, const char *dir, const dt_train_state *st,
                                   const char *config_json, double shard_mb);
/* Collective over the data-parallel group: the save in flight finished, its status on
 * every rank (DT_OK when none). */
dt_status dt_ckpt_save_wait(dt_ckpt_dist *c);
/* Collective: the digest of the whole weights (checkpoint.h dt_weights_digest); every
 * rank gets it, except with split tensors: the root only (hex "" elsewhere). */
dt_status dt_ckpt_digest_distributed(dt_ckpt_dist *c, char hex[65]);
/* At the end of a run, failed or not: a started save finishes (it commits or not). */
void dt_ckpt_dist_finish(dt_ckpt_dist *c);

#endif

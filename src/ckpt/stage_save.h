/* A checkpoint written by several writers at once, one per pipeline stage, each holding
 * its stage's whole tensors (whole_model.h): each writes its own files, the first
 * stage's writer also the indexes and trainer_state.json, and commits once every stage's
 * files are complete (checkpoint.h: dt_ckpt_begin ... dt_ckpt_commit). Implemented by
 * stage_save.c. */
#ifndef DT_STAGE_SAVE_H
#define DT_STAGE_SAVE_H
#include "checkpoint.h"
#include "whole_model.h"

/* Collective over the pipeline group of the stage writers (pp: NULL or one rank, a
 * single writer); s: this rank's status so far (any failure anywhere: nothing is
 * committed and the step's temporary directory is removed). */
dt_status dt_ckpt_save_stages(dt_comm *pp, const dt_whole_model *w, dt_status s, const char *dir,
                              const dt_train_state *st, const char *config_json, double shard_mb);

#endif

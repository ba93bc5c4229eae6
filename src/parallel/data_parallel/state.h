/* The training state across the model-parallel layout. The data-parallel strategies
 * (data_parallel.c: ps, DDP; zero.c: ZeRO 1-3) store, reduce, shard and update whatever
 * tensors this rank's model holds, over the data-parallel group only; this module says how
 * those tensors add up to the whole model, reading their shard specs: which partial sums
 * make the global gradient norm, and how whole tensors are assembled for checkpoints and
 * the digest. Tensor parallelism is here now; pipeline stages (tied embeddings) and
 * context parallelism extend this file, not the strategies. */
#ifndef DT_STATE_H
#define DT_STATE_H
#include "../../ckpt/checkpoint.h"
#include "../../comm/comm.h"
#include "../../model/gpt.h"

/* The model-parallel groups a rank's state spans (NULL: a group of one). */
typedef struct {
    dt_comm *tp;  /* tensor parallelism: split tensors' pieces */
    dt_comm *pp;  /* pipeline parallelism: each stage holds its blocks */
    dt_comm *emb; /* the first and the last stage, which both hold the tied wte (NULL elsewhere) */
} dt_model_groups;

/* The gradient norm's partial sums: squares of split tensors (each rank holds a piece, so
 * they are summed over the group) and of replicated ones (the same on every rank of the
 * group, counted once); both summed over the pipeline stages. A tied copy (wte on the last
 * stage: the first stage's counts) is in no class (-1). */
enum { DT_NORM_SPLIT, DT_NORM_REPLICATED, DT_NORM_NCLASSES };
int dt_state_norm_class(const gpt_model *m, const gpt_tensor *t);
/* Sums the gradients of tied tensors over the stages holding them (wte's, over emb), so
 * both copies take the same update. grads: the model's flat gradient buffer; in device
 * memory, host (wte's size, dt_state_tie_bytes) stages the sum (MPI reduces host memory). */
dt_status dt_state_tie_grads(const dt_model_groups *g, const gpt_model *m, float *grads, float *host);
/* Bytes of host staging dt_state_tie_grads needs for a device model (0: none). */
size_t dt_state_tie_bytes(const dt_model_groups *g, const gpt_model *m);
/* Whether any model-parallel group has more than one rank. */
int dt_state_model_parallel(const dt_model_groups *g);
/* The global norm from this rank's partial sums of squares (already complete over the
 * data-parallel group). Collective over the model-parallel groups. */
dt_status dt_state_norm(const dt_model_groups *g, const double part[DT_NORM_NCLASSES], double *norm);

/* Whether this rank is where whole tensors are assembled (first of its model-parallel
 * groups: tensor-parallel rank 0 of the first stage). */
int dt_state_is_root(const dt_model_groups *g);
/* The whole model (fp32 host memory; moments too when mv, vv are given) assembled at the
 * root from every rank's pieces (unit views: parameters the model's, moments mv and vv).
 * Collective over the model-parallel groups; w is only filled at the root. */
typedef struct {
    gpt_model full;
    float *mom[2];
    float **view[2]; /* unit views of mom */
} dt_whole_model;
dt_status dt_state_gather_whole(const dt_model_groups *g, const gpt_model *m, float *const *mv, float *const *vv,
                                dt_whole_model *w);
void dt_whole_free(dt_whole_model *w);
/* Whether this rank writes its pipeline stage's checkpoint files (its stage's first
 * tensor-parallel rank). */
int dt_state_is_stage_root(const dt_model_groups *g);
/* The whole tensors of this rank's stage (tp = 1; the tensor-parallel pieces assembled,
 * moments too when mv, vv are given) at each stage root; collective over the
 * tensor-parallel group. w is only filled at the stage roots. */
dt_status dt_state_gather_stage(const dt_model_groups *g, const gpt_model *m, float *const *mv, float *const *vv,
                                dt_whole_model *w);
/* A checkpoint save by the stage roots, in parallel: each writes its stage's files (w,
 * from dt_state_gather_stage), the first stage's root the indexes and commits once every
 * stage's files are complete (checkpoint.h: dt_ckpt_begin ... dt_ckpt_commit). Collective
 * over the pipeline group of the stage roots; s: this rank's status so far (any failure
 * anywhere: nothing is committed and the step's temporary directory is removed). */
dt_status dt_state_save_stages(const dt_model_groups *g, const dt_whole_model *w, dt_status s, const char *dir,
                               const dt_train_state *st, const char *config_json, double shard_mb);
/* Every rank of the model-parallel groups learns whether any failed (first error wins). */
dt_status dt_state_agree(const dt_model_groups *g, dt_status s);

#endif

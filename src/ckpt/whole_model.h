/* The host copy of the state a checkpoint or the digest writes: whole (unsharded) fp32
 * tensors assembled from every rank's pieces across the model-parallel groups, made at
 * save time only. Tensor-parallel pieces are placed by their shard specs (model/shard.h,
 * the inverse of what a load reads, ckpt_read.c); a pipeline stage's tensors are its own
 * (the first stage's root can collect every stage's for the digest). Implemented by
 * whole_model.c. */
#ifndef DT_WHOLE_MODEL_H
#define DT_WHOLE_MODEL_H
#include "../comm/comm.h"
#include "../model/gpt.h"

/* The groups a rank's pieces are split over (NULL or a group of one: not split). */
typedef struct {
    dt_comm *tp; /* tensor parallelism: split tensors' pieces */
    dt_comm *pp; /* pipeline parallelism: each stage holds its blocks */
} dt_whole_groups;

/* A whole model or stage in fp32 host memory, the moments too when asked for. */
typedef struct {
    gpt_model full;
    float *mom[2];
    float **view[2]; /* unit views of mom */
} dt_whole_model;

/* Whether the groups split the model (either has more than one rank). */
int dt_whole_split(const dt_whole_groups *g);
/* Whether this rank assembles its stage's tensors (its stage's first tensor-parallel rank). */
int dt_whole_is_stage_root(const dt_whole_groups *g);
/* Whether this rank assembles the whole model (the stage root of the first stage). */
int dt_whole_is_root(const dt_whole_groups *g);
/* Every rank of the groups learns whether any failed (first error wins). */
dt_status dt_whole_agree(const dt_whole_groups *g, dt_status s);

/* The whole model (moments too when mv, vv are given) at the root, from every rank's
 * pieces (unit views: parameters the model's, moments mv and vv). Collective over the
 * groups; w is only filled at the root. */
dt_status dt_whole_gather(const dt_whole_groups *g, const gpt_model *m, float *const *mv, float *const *vv,
                          dt_whole_model *w);
/* The whole tensors of this rank's stage (tp = 1) at each stage root; collective over the
 * tensor-parallel group. w is only filled at the stage roots. */
dt_status dt_whole_gather_stage(const dt_whole_groups *g, const gpt_model *m, float *const *mv, float *const *vv,
                                dt_whole_model *w);
/* A whole (tp = 1) model of a stage's blocks (lay; NULL: all) in fp32 host memory: with
 * state (and moments) to be filled (alloc), or the tensor table alone. */
dt_status dt_whole_of(const gpt_model *m, const gpt_layout *lay, int alloc, dt_whole_model *w, int moments);
void dt_whole_free(dt_whole_model *w);

/* A stage's blocks as a message of DT_WHOLE_LAYOUT doubles (chunks, first_layer,
 * n_layers, the chunks' firsts and counts), so another stage can rebuild its table. */
enum { DT_WHOLE_LAYOUT = 3 + 2 * GPT_MAX_CHUNKS };
void dt_whole_pack_layout(const gpt_model *m, double *h);
gpt_layout dt_whole_unpack_layout(const double *h);

#endif

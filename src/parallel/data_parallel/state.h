/* The training state across the model-parallel layout. The data-parallel strategies
 * (strategy.h: ps, DDP, ZeRO 1-3) store, reduce, shard and update whatever tensors this
 * rank's model holds, over the data-parallel group only; this module says how those
 * tensors add up in training, reading their shard specs: which partial sums make the
 * global gradient norm, and the tied embedding's gradient shared by the end stages. How
 * whole tensors are assembled for checkpoints and the digest is the checkpoint's
 * (src/ckpt/distributed.h). Implemented by state.c. */
#ifndef DT_STATE_H
#define DT_STATE_H
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
 * stage: the first stage's counts) and a piece's replica other than the first (Llama's
 * key/value heads over a larger tp: replica 0's counts) are in no class (-1). */
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

#endif

/* Tensor parallelism (Megatron: column-parallel then row-parallel, one all-reduce per
 * block half forward and one backward) and sequence parallelism (each all-reduce becomes
 * a reduce-scatter into the sequence-split LayerNorm/residual region and an all-gather
 * out of it); docs/parallelism.md, "Tensor parallelism". The model holds its pieces
 * (gpt_create_layout, its split plan in src/model/tensor_plan.c) and calls the paired
 * functions (gpt_tp_comm); this module gives it the tensor-parallel group's collectives,
 * and says which layouts run so far. */
#ifndef DT_TENSOR_PARALLEL_H
#define DT_TENSOR_PARALLEL_H
#include "../../comm/comm.h"
#include "../../core/config.h"
#include "../../model/gpt.h"
#include "../layout/layout.h"

/* Connects the model's paired functions to the tensor-parallel communicator (a group
 * of one leaves them identities); the sequence-parallel pair when the model has sp; the
 * key/value replicas' sum (kv_sum, over a group split from tp_comm: collective over it)
 * when the model replicates Llama's key/value heads (gpt_kv_replicas).
 * The group and its host staging live in a context the model holds (gpt_tp_comm.ctx, as
 * context parallelism's ring): dt_tp_detach frees it, before gpt_destroy. */
dt_status dt_tp_attach(gpt_model *m, dt_comm *tp_comm);
void dt_tp_detach(gpt_model *m);
/* Seconds the model's tensor/sequence-parallel collectives took (inside forward and
 * backward: none of it overlaps computation); 0 without tensor parallelism. */
double dt_tp_comm_seconds(const gpt_model *m);
/* Layouts that tensor parallelism does not run yet fail here, before any work, with
 * one line (DT_EINPUT). */
dt_status dt_tp_check(const dt_layout *L);

#endif

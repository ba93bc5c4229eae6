/* Tensor parallelism (Megatron, seed 000: column-parallel then row-parallel, one
 * all-reduce per block half forward and one backward). The model holds its pieces
 * (gpt_create_tp) and calls the paired functions (gpt_tp_comm); this module gives it
 * the tensor-parallel group's all-reduce, and says which layouts run so far. */
#ifndef DT_TENSOR_PARALLEL_H
#define DT_TENSOR_PARALLEL_H
#include "../comm/comm.h"
#include "../core/config.h"
#include "../model/gpt.h"

/* Connects the model's paired functions to the tensor-parallel communicator (a group
 * of one leaves them identities). */
void dt_tp_attach(gpt_model *m, dt_comm *tp_comm);
/* Layouts that tensor parallelism does not run yet fail here, before any work, with
 * one line (DT_EINPUT). */
dt_status dt_tp_check(const dt_config *c);

#endif

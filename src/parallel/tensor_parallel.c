#include "tensor_parallel.h"

#include <string.h>

static dt_status tp_allreduce(void *ctx, float *x, size_t n, int max) {
    return dt_allreduce((dt_comm *)ctx, x, n, DT_F32, max ? DT_MAX : DT_SUM);
}

void dt_tp_attach(gpt_model *m, dt_comm *tp_comm) {
    if (dt_comm_size(tp_comm) > 1) m->tp_comm = (gpt_tp_comm){tp_allreduce, tp_comm};
}

dt_status dt_tp_check(const dt_config *c) {
    if (c->parallel.tp <= 1) return DT_OK;
    if (c->model.n_head % c->parallel.tp != 0)
        return dt_fail(DT_EINPUT, "parallel.tp %d must divide model.n_head %d (attention heads are split across "
                       "tensor-parallel ranks)", c->parallel.tp, c->model.n_head);
    const char *what = NULL;
    if (strcmp(c->backend, "cpu") != 0) what = "backend cuda";
    else if (strcmp(c->precision, "fp32") != 0) what = "precision bf16";
    else if (c->parallel.zero > 0) what = "parallel.zero > 0";
    else if (!strcmp(c->parallel.dp_mode, "ps")) what = "parallel.dp_mode ps";
    else if (!strcmp(c->parallel.determinism, "bitwise")) what = "parallel.determinism bitwise";
    else if (c->checkpoint.dir[0] || c->checkpoint.resume[0] || c->train.init_from[0])
        what = "checkpoints (checkpoint.dir, --resume, train.init_from)";
    else if (c->log.digest) what = "log.digest";
    else if (c->log.sample_tokens > 0) what = "the final sample (log.sample_tokens > 0; set it to 0)";
    if (what)
        return dt_fail(DT_EINPUT, "parallel.tp %d: %s is not implemented with tensor parallelism yet (so far it runs "
                       "with DDP, fp32, on the CPU)", c->parallel.tp, what);
    return DT_OK;
}

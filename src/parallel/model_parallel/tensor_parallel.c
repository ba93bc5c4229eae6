#include "tensor_parallel.h"

#include <stdlib.h>
#include <string.h>

#include "../../core/timer.h"
#include "../data_parallel/canonical.h"
#include "../data_parallel/staging.h"

/* The model's tensor-parallel context (gpt_tp_comm.ctx): the group, the key/value
 * replica group (replicated key/value heads: the tp ranks holding this rank's head; else
 * NULL), and for a model in device memory a host buffer the collectives run in (MPI here
 * works on host memory; grown to the largest message, then reused). */
typedef struct {
    dt_comm *comm, *kv;
    const dt_ops *ops;
    void *host;
    size_t cap;    /* bytes */
    int canon;     /* the model's canonical chunks: sums by the canonical tree (recursive halving) */
    float *tree_tmp; /* its exchange buffer, grown to half the largest sum */
    size_t tree_cap; /* floats */
    double comm_s; /* wall time in the paired functions' collectives */
} tp_ctx;

/* Host staging for a device model: at least `bytes` (grown to the largest message on the
 * first step, then reused). */
static dt_status host_buffer(tp_ctx *x, size_t bytes) {
    if (bytes <= x->cap) return DT_OK;
    void *h = realloc(x->host, bytes);
    if (!h) return dt_fail(DT_ERUNTIME, "out of memory (tensor-parallel host staging)");
    x->host = h;
    x->cap = bytes;
    return DT_OK;
}

enum { TP_SUM, TP_MAX, TP_ALLGATHER, TP_REDUCE_SCATTER };

static dt_status run_coll(dt_comm *c, int op, dt_dtype t, const void *in, void *out, size_t n) {
    switch (op) {
    case TP_SUM:
    case TP_MAX: return dt_allreduce(c, out, n, t, op == TP_MAX ? DT_MAX : DT_SUM); /* in == out */
    case TP_ALLGATHER: return dt_allgather(c, in, out, n, t);
    default: return dt_reduce_scatter(c, in, out, n, t, DT_SUM);
    }
}

/* One collective of group c (the tensor-parallel group or the key/value replicas) from
 * in (n_in elements of type t) to out (n_out; in == out for the in-place all-reduce), n
 * per rank as the collective counts it. bf16 activations are reduced as DT_BF16 (each
 * addition in fp32, rounded). A model in device memory goes through the host buffer
 * ([in | out], or one part in place): MPI works on host memory. The wall time is charged
 * to the context's counter. */
static dt_status tp_coll(tp_ctx *x, dt_comm *c, int op, dt_dtype t, const float *in, size_t n_in, float *out,
                         size_t n_out, size_t n) {
    double t0 = dt_now();
    size_t e = t == DT_BF16 ? 2 : 4;
    dt_status s;
    if (!x->ops->on_device) {
        s = run_coll(c, op, t, in, out, n);
    } else {
        size_t at = in == out ? 0 : n_in * e; /* where the result lies in the host buffer (bytes) */
        DT_TRY(host_buffer(x, at + n_out * e));
        char *h = x->host;
        x->ops->download(h, in, n_in * e);
        s = run_coll(c, op, t, h, h + at, n);
        if (s == DT_OK) x->ops->upload(out, h + at, n_out * e);
    }
    x->comm_s += dt_now() - t0;
    return s;
}

static dt_dtype storage(const tp_ctx *x) { return x->ops->bf16 ? DT_BF16 : DT_F32; }

/* Bitwise mode's sum (tp_chunks.c): the canonical tree's levels above the ranks' own
 * chunks, in fp32 host memory (bf16: widened, each node rounded to bf16, narrowed back:
 * exact, its values being bf16's). */
/* The tree over group c (the tensor-parallel group or the key/value replicas) of n
 * elements of in, elements [off, off + m) of the sum written to out (in place when in is
 * out, whole, fp32 host memory). */
static dt_status tp_tree_into(tp_ctx *x, dt_comm *c, const float *in, size_t n, float *out, size_t off, size_t m,
                              int bf16) {
    double t0 = dt_now();
    if (n / 2 + 1 > x->tree_cap) {
        float *t2 = realloc(x->tree_tmp, (n / 2 + 1) * sizeof(float));
        if (!t2) return dt_fail(DT_ERUNTIME, "out of memory (tensor-parallel tree)");
        x->tree_tmp = t2;
        x->tree_cap = n / 2 + 1;
    }
    float *h = out;
    if (bf16 || x->ops->on_device || in != out || off || m != n) {
        DT_TRY(host_buffer(x, n * sizeof(float)));
        h = x->host;
        if (bf16) dt_stage_widen(x->ops, h, in, n);
        else if (x->ops->on_device) x->ops->download(h, in, n * sizeof(float));
        else memcpy(h, in, n * sizeof(float));
    }
    dt_status s = bf16 ? dt_tree_allreduce_bf16(c, h, n, x->tree_tmp) : dt_tree_allreduce(c, h, n, x->tree_tmp);
    if (s == DT_OK && bf16) dt_stage_narrow(x->ops, out, h + off, m);
    else if (s == DT_OK && x->ops->on_device) x->ops->upload(out, h + off, m * sizeof(float));
    else if (s == DT_OK && h != out) memcpy(out, h + off, m * sizeof(float));
    x->comm_s += dt_now() - t0;
    return s;
}
static dt_status tp_tree(tp_ctx *x, float *v, size_t n, int bf16) {
    return tp_tree_into(x, x->comm, v, n, v, 0, n, bf16);
}

static dt_status tp_allreduce(void *ctx, float *x, size_t n, int op) {
    tp_ctx *c = ctx;
    if (op == GPT_TP_MAX_F32) return tp_coll(c, c->comm, TP_MAX, DT_F32, x, n, x, n, n);
    if (c->canon) return tp_tree(c, x, n, op == GPT_TP_SUM && c->ops->bf16);
    return tp_coll(c, c->comm, TP_SUM, op == GPT_TP_SUM_F32 ? DT_F32 : storage(c), x, n, x, n, n);
}

/* Replicated key/value heads' gradients over their replicas (storage precision; bitwise
 * mode: the canonical tree's levels above the replicas' query heads, attention.c). */
static dt_status tp_kv_sum(void *ctx, float *x, size_t n) {
    tp_ctx *c = ctx;
    if (c->canon) return tp_tree_into(c, c->kv, x, n, x, 0, n, c->ops->bf16);
    return tp_coll(c, c->kv, TP_SUM, storage(c), x, n, x, n, n);
}

/* Sequence parallelism's pair (n: this rank's elements; the group holds tp·n). */
static dt_status tp_allgather(void *ctx, float *full, const float *local, size_t n) {
    tp_ctx *c = ctx;
    return tp_coll(c, c->comm, TP_ALLGATHER, storage(c), local, n, full, n * (size_t)dt_comm_size(c->comm), n);
}

static dt_status tp_reduce_scatter(void *ctx, float *local, const float *full, size_t n) {
    tp_ctx *c = ctx;
    size_t all = n * (size_t)dt_comm_size(c->comm);
    if (c->canon) /* bitwise: the canonical tree over the whole sum, then this rank's rows of it */
        return tp_tree_into(c, c->comm, full, all, local, n * (size_t)dt_comm_rank(c->comm), n, c->ops->bf16);
    return tp_coll(c, c->comm, TP_REDUCE_SCATTER, storage(c), full, n * (size_t)dt_comm_size(c->comm), local, n, n);
}

double dt_tp_comm_seconds(const gpt_model *m) {
    const tp_ctx *x = m->tp_comm.ctx;
    return x ? x->comm_s : 0.0;
}

dt_status dt_tp_attach(gpt_model *m, dt_comm *tp_comm) {
    if (dt_comm_size(tp_comm) <= 1) return DT_OK;
    tp_ctx *x = calloc(1, sizeof *x);
    if (!x) return dt_fail(DT_ERUNTIME, "out of memory (tensor-parallel context)");
    x->comm = tp_comm;
    x->ops = m->ops;
    x->canon = m->canon;
    /* replicated key/value heads: the group of the ranks holding this rank's head (they
     * are consecutive: rank t holds head t / r); collective over the tensor-parallel group */
    int tp = dt_comm_size(tp_comm), t = dt_comm_rank(tp_comm), r = gpt_kv_replicas(&m->shape, tp);
    if (r > 1) {
        dt_status s = dt_comm_split(tp_comm, t / r, t, &x->kv);
        if (s != DT_OK) {
            free(x);
            return s;
        }
        dt_comm_set_name(x->kv, "kv");
    }
    m->tp_comm = (gpt_tp_comm){tp_allreduce, m->sp ? tp_allgather : NULL, m->sp ? tp_reduce_scatter : NULL,
                               x->kv ? tp_kv_sum : NULL, x};
    return DT_OK;
}

void dt_tp_detach(gpt_model *m) {
    tp_ctx *x = m->tp_comm.ctx;
    if (!x) return;
    if (x->kv) dt_comm_free(x->kv);
    free(x->host);
    free(x->tree_tmp);
    free(x);
    memset(&m->tp_comm, 0, sizeof m->tp_comm);
}

dt_status dt_tp_check(const dt_layout *L) {
    int tp = L->tp;
    if (L->sp && tp <= 1)
        return dt_fail(DT_EINPUT, "parallel.sp needs parallel.tp > 1 (sequence parallelism splits the tensor-parallel "
                       "group's LayerNorm and residual rows)");
    if (tp <= 1) return DT_OK;
    if (!gpt_tp_splits_heads(&L->shape, tp) && L->shape.family == GPT_FAMILY_LLAMA)
        return dt_fail(DT_EINPUT, "parallel.tp %d must divide model.n_head %d and model.intermediate_size %d, and "
                       "divide model.n_kv_head %d or be a multiple of it (heads and MLP columns are split; key/value "
                       "heads are split, or replicated over tp / n_kv_head ranks)", tp, L->shape.n_head,
                       L->shape.intermediate, L->shape.n_kv_head);
    if (!gpt_tp_splits_heads(&L->shape, tp))
        return dt_fail(DT_EINPUT, "parallel.tp %d must divide model.n_head %d (attention heads are split across "
                       "tensor-parallel ranks)", tp, L->shape.n_head);
    if (L->sp && ((long long)L->micro * L->Tl) % tp != 0) /* a rank's rows (cp: T/cp) */
        return dt_fail(DT_EINPUT, "parallel.sp: the micro-batch's %d x %d tokens do not split into parallel.tp %d "
                       "sequence pieces", L->micro, L->Tl, tp);
    const char *what = NULL;
    int canon = dt_layout_canon(L); /* bitwise mode's chunks of the sums (0: none, or it cannot cut them) */
    if (canon && canon % tp)
        return dt_fail(DT_EINPUT, "parallel.tp %d: bitwise mode cuts the tensor-parallel sums into %d canonical "
                       "chunks, which tp must divide", tp, canon);
    if (dt_layout_bitwise(L) && !canon)
        what = !gpt_kv_tree_splits(&L->shape, tp)
                   ? "parallel.determinism bitwise with Llama key/value heads replicated over tp and a number of "
                     "query heads per rank (n_head / tp) that is not a power of two (a group's tree would not split "
                     "at the replicas)"
                   : "parallel.determinism bitwise with parallel.tp_chunks 1, or a width (Llama: key/value and MLP "
                     "widths too) not a multiple of parallel.tp_chunks";
    else if (L->cfg.log.sample_tokens > 0 && L->sp)
        what = "the final sample with sequence parallelism (log.sample_tokens > 0; set it to 0)";
    if (what) return dt_fail(DT_EINPUT, "parallel.tp %d: %s is not implemented with tensor parallelism yet", tp, what);
    return DT_OK;
}

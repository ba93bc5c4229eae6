/* The norm building block of both families: GPT-2's LayerNorm (weight and bias, mean
 * and 1/std kept) or Llama's RMSNorm (weight only, 1/rms kept; its eps from the shape).
 * A block's two norms and the final one all come through here. */
#include "gpt_internal.h"

void gpt_norm_fwd(gpt_model *m, float *out, float *mean, float *rstd, const float *in, const float *w, const float *b,
                  int N) {
    int C = m->shape.n_embd;
    if (llama(m)) m->ops->rmsnorm_fwd(out, rstd, in, w, N, C, m->shape.norm_eps);
    else m->ops->layernorm_fwd(out, mean, rstd, in, w, b, N, C);
}

/* Sequence parallelism in bitwise mode: the weight (and bias) gradients over every piece's
 * rows, gathered in order, on every tensor-parallel rank (the one process's sum, whole on
 * each: nothing left to sum over tp); the input gradient of this rank's rows. */
static dt_status norm_bwd_sp(gpt_model *m, float *din, float *dw, float *db, const float *dout, const float *in,
                             const float *w, const float *mean, const float *rstd, int Nl) {
    const dt_ops *o = m->ops;
    gpt_acts *a = m->acts;
    int C = m->shape.n_embd, N = Nl * m->tp, ll = llama(m);
    size_t stat = (size_t)Nl * sizeof(float) / m->esz; /* an fp32 row statistic in storage elements */
    const float *gd = a->lnrows, *gi = S(m, a->lnrows, (size_t)N * C), *gm = a->lnstat, *gr = a->lnstat + N;
    if (din && ll) o->rmsnorm_bwd(din, NULL, dout, in, w, rstd, Nl, C);
    else if (din) o->layernorm_bwd(din, NULL, NULL, dout, in, w, mean, rstd, Nl, C);
    DT_TRY(m->tp_comm.allgather(m->tp_comm.ctx, a->lnrows, dout, (size_t)Nl * C));
    DT_TRY(m->tp_comm.allgather(m->tp_comm.ctx, S(m, a->lnrows, (size_t)N * C), in, (size_t)Nl * C));
    if (!ll) DT_TRY(m->tp_comm.allgather(m->tp_comm.ctx, a->lnstat, mean, stat));
    DT_TRY(m->tp_comm.allgather(m->tp_comm.ctx, a->lnstat + N, rstd, stat));
    if (m->cp_comm.gather && m->cp_comm.size > 1) { /* and over the cp ranks' rows: cp rank 0's (cp_chunks.c) */
        const void *all[4] = {gd, gi, gm, gr};
        for (int k = 0; k < 4; k++)
            if (!(ll && k == 2))
                DT_TRY(m->cp_comm.gather(m->cp_comm.ctx, all[k], N, (k < 2 ? (size_t)C : 1) * sizeof(float), k, &all[k]));
        if (m->cp_comm.rank != 0) return DT_OK;
        gd = all[0], gi = all[1], gm = all[2], gr = all[3];
        N *= m->cp_comm.size;
    }
    if (ll) o->rmsnorm_bwd(NULL, dw, gd, gi, w, gr, N, C);
    else o->layernorm_bwd(NULL, dw, db, gd, gi, w, gm, gr, N, C);
    return DT_OK;
}

/* With cp_chunks.c's gather the weight and bias gradients are cp rank 0's, over every
 * rank's rows in sequence order (the one process's sum); the input gradient is per row. */
dt_status gpt_norm_bwd(gpt_model *m, float *din, float *dw, float *db, const float *dout, const float *in,
                       const float *w, const float *mean, const float *rstd, int N) {
    int C = m->shape.n_embd;
    if (dw && m->sp && m->canon) return norm_bwd_sp(m, din, dw, db, dout, in, w, mean, rstd, N);
    int ll = llama(m);
    if (!dw || !m->cp_comm.gather || m->cp_comm.size == 1) {
        if (ll) m->ops->rmsnorm_bwd(din, dw, dout, in, w, rstd, N, C);
        else m->ops->layernorm_bwd(din, dw, db, dout, in, w, mean, rstd, N, C);
        return DT_OK;
    }
    if (din && ll) m->ops->rmsnorm_bwd(din, NULL, dout, in, w, rstd, N, C);
    else if (din) m->ops->layernorm_bwd(din, NULL, NULL, dout, in, w, mean, rstd, N, C);
    const void *all[4] = {NULL, NULL, NULL, NULL};
    const void *src[4] = {dout, in, mean, rstd};
    for (int k = 0; k < 4; k++)
        if (!(ll && k == 2)) /* RMSNorm: no mean */
            DT_TRY(m->cp_comm.gather(m->cp_comm.ctx, src[k], N, (k < 2 ? (size_t)C : 1) * sizeof(float), k, &all[k]));
    if (m->cp_comm.rank == 0 && ll) m->ops->rmsnorm_bwd(NULL, dw, all[0], all[1], w, all[3], N * m->cp_comm.size, C);
    else if (m->cp_comm.rank == 0)
        m->ops->layernorm_bwd(NULL, dw, db, all[0], all[1], w, all[2], all[3], N * m->cp_comm.size, C);
    return DT_OK;
}

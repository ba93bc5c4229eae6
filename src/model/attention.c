/* The attention half of a block: c_attn (column-parallel: this rank's heads' q, k, v),
 * causal attention (the backend's, or context parallelism's ring), c_proj (row-parallel:
 * partial sums completed over the tensor-parallel group, its bias added by piece 0
 * alone). With sp its input is gathered over the sequence pieces first. */
#include "gpt_internal.h"

dt_status gpt_attention_forward(gpt_model *m, const gpt_slot *a, const block_acts *b, int j, float **out) {
    const dt_ops *o = m->ops;
    float *proj = m->acts->proj, *in;
    int B = a->B, T = a->T, C = m->shape.n_embd, Cl = C / m->tp, NHl = m->shape.n_head / m->tp, N = B * T;
    int bias_here = m->tp_rank == 0;
    DT_TRY(gpt_seq_gather(m, b->ln1, N, &in));
    o->linear_fwd(b->qkv, in, P(m, j, T_QKVW), P(m, j, T_QKVB), N, C, 3 * Cl);
    if (m->cp_comm.attention_fwd)
        DT_TRY(m->cp_comm.attention_fwd(m->cp_comm.ctx, b->atty, b->lse, b->qkv, a->docs ? a->seg_host : NULL, B, T,
                                        Cl, NHl));
    else o->attention_fwd(b->atty, b->lse, b->qkv, a->docs ? a->seg : NULL, B, T, Cl, NHl);
    o->linear_fwd(proj, b->atty, P(m, j, T_APW), bias_here ? P(m, j, T_APB) : NULL, N, Cl, C);
    return gpt_tp_complete(m, proj, m->acts->rows, N, out);
}

/* The c_proj bias's gradient is computed on every tensor-parallel rank from the same
 * (replicated, with sp gathered) output gradient, so the replicated bias stays the same
 * everywhere. With sp, dres holds this rank's rows and is gathered before the
 * row-parallel layer's backward (the conjugate of its forward reduce-scatter); the
 * LayerNorm output is gathered again for the column-parallel weight gradient rather than
 * kept whole (Megatron-SP's trade: memory for a second all-gather). */
dt_status gpt_attention_backward(gpt_model *m, gpt_slot *s, const block_acts *b, const block_douts *k, int j,
                                 int split, float **dln) {
    const dt_ops *o = m->ops;
    gpt_acts *a = m->acts;
    int B = s->B, T = s->T, C = m->shape.n_embd, Cl = C / m->tp, NHl = m->shape.n_head / m->tp, N = B * T;
    size_t NC = (size_t)N * C * m->esz;
    float *dout, *in = NULL;
    DT_TRY(gpt_seq_gather(m, s->dres, N, &dout));
    if (split) o->copy(k->ap, dout, NC);
    o->linear_bwd(a->dsmall, WG(m, j, T_APW, split), WG(m, j, T_APB, split), dout, b->atty, P(m, j, T_APW), N, Cl, C,
                  0);
    if (m->cp_comm.attention_bwd)
        DT_TRY(m->cp_comm.attention_bwd(m->cp_comm.ctx, k->qkv, a->dsmall, b->qkv, b->atty, b->lse,
                                        s->docs ? s->seg_host : NULL, B, T, Cl, NHl));
    else o->attention_bwd(k->qkv, a->dsmall, b->qkv, b->atty, b->lse, s->docs ? s->seg : NULL, B, T, Cl, NHl);
    if (!split) DT_TRY(gpt_seq_gather(m, b->ln1, N, &in));
    o->linear_bwd(a->dsmall, WG(m, j, T_QKVW, split), WG(m, j, T_QKVB, split), k->qkv, in, P(m, j, T_QKVW), N, C,
                  3 * Cl, 0);
    return gpt_tp_complete(m, a->dsmall, a->rows, N, dln);
}

dt_status gpt_attention_weight(gpt_model *m, const gpt_slot *s, const block_acts *b, const block_douts *k, int j) {
    const dt_ops *o = m->ops;
    int C = m->shape.n_embd, Cl = C / m->tp, N = s->B * s->T;
    float *in;
    o->linear_bwd(NULL, G(m, j, T_APW), G(m, j, T_APB), k->ap, b->atty, NULL, N, Cl, C, 0);
    DT_TRY(gpt_seq_gather(m, b->ln1, N, &in));
    o->linear_bwd(NULL, G(m, j, T_QKVW), G(m, j, T_QKVB), k->qkv, in, NULL, N, C, 3 * Cl, 0);
    return DT_OK;
}

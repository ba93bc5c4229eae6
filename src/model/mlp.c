/* The MLP half of a block: c_fc (column-parallel: this rank's 4C/tp columns) with GELU
 * (tanh), then c_proj (row-parallel: partial sums completed over the tensor-parallel
 * group, its bias added by piece 0 alone). With sp its input is gathered over the
 * sequence pieces first (see attention.c for the backward's gathers). */
#include "gpt_internal.h"

dt_status gpt_mlp_forward(gpt_model *m, const gpt_slot *a, const block_acts *b, int j, float **out) {
    const dt_ops *o = m->ops;
    float *proj = m->acts->proj, *in;
    int C = m->shape.n_embd, Cl = C / m->tp, N = a->B * a->T, bias_here = m->tp_rank == 0;
    DT_TRY(gpt_seq_gather(m, b->ln2, N, &in));
    dt_linear_gelu_fwd(o, b->fcg, b->fch, in, P(m, j, T_FCW), P(m, j, T_FCB), N, C, 4 * Cl);
    o->linear_fwd(proj, b->fcg, P(m, j, T_MPW), bias_here ? P(m, j, T_MPB) : NULL, N, 4 * Cl, C);
    return gpt_tp_complete(m, proj, m->acts->rows, N, out);
}

dt_status gpt_mlp_backward(gpt_model *m, gpt_slot *s, const block_acts *b, const block_douts *k, int j, int split,
                           float **dln) {
    const dt_ops *o = m->ops;
    gpt_acts *a = m->acts;
    int C = m->shape.n_embd, Cl = C / m->tp, N = s->B * s->T;
    size_t NC = (size_t)N * C * m->esz;
    float *dout, *in = NULL;
    DT_TRY(gpt_seq_gather(m, s->dres, N, &dout));
    if (split) o->copy(k->mp, dout, NC);
    if (!split) o->linear_bwd(NULL, G(m, j, T_MPW), G(m, j, T_MPB), dout, b->fcg, P(m, j, T_MPW), N, 4 * Cl, C, 0);
    dt_linear_dgelu_bwd(o, k->fc, dout, P(m, j, T_MPW), b->fch, N, 4 * Cl, C);
    if (!split) DT_TRY(gpt_seq_gather(m, b->ln2, N, &in));
    o->linear_bwd(a->dsmall, WG(m, j, T_FCW, split), WG(m, j, T_FCB, split), k->fc, in, P(m, j, T_FCW), N, C, 4 * Cl,
                  0);
    return gpt_tp_complete(m, a->dsmall, a->rows, N, dln);
}

dt_status gpt_mlp_weight(gpt_model *m, const gpt_slot *s, const block_acts *b, const block_douts *k, int j) {
    const dt_ops *o = m->ops;
    int C = m->shape.n_embd, Cl = C / m->tp, N = s->B * s->T;
    float *in;
    o->linear_bwd(NULL, G(m, j, T_MPW), G(m, j, T_MPB), k->mp, b->fcg, NULL, N, 4 * Cl, C, 0);
    DT_TRY(gpt_seq_gather(m, b->ln2, N, &in));
    o->linear_bwd(NULL, G(m, j, T_FCW), G(m, j, T_FCB), k->fc, in, NULL, N, C, 4 * Cl, 0);
    return DT_OK;
}

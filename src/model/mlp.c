/* The MLP half of a block. GPT-2: c_fc (column-parallel: this rank's 4C/tp columns) with
 * GELU (tanh), then c_proj (row-parallel: partial sums completed over the tensor-parallel
 * group, its bias added by piece 0 alone). Llama: SwiGLU, silu(gate)·up (gate and up
 * column-parallel, I/tp columns each, no biases), then down (row-parallel). With sp the
 * input is gathered over the sequence pieces first (see attention.c for the backward's
 * gathers). */
#include "gpt_internal.h"

dt_status gpt_mlp_forward(gpt_model *m, const gpt_slot *a, const block_acts *b, int j, float **out) {
    const dt_ops *o = m->ops;
    float *proj = m->acts->proj, *in;
    int C = m->shape.n_embd, Il = m->shape.intermediate / m->tp, N = a->B * a->T, bias_here = m->tp_rank == 0;
    DT_TRY(gpt_seq_gather(m, b->ln2, N, &in));
    if (llama(m)) { /* fch: gate | up */
        float *gate = b->fch, *up = S(m, b->fch, (size_t)N * Il);
        if (m->canon) { /* the canonical blocks (tp_chunks.c) */
            gpt_colt_fwd(m, gate, in, P(m, j, T_FCW), NULL, N, C, Il, 0);
            gpt_colt_fwd(m, up, in, P(m, j, T_UPW), NULL, N, C, Il, 0);
        } else {
            gpt_linear_t_fwd(m, gate, in, P(m, j, T_FCW), NULL, N, C, Il);
            gpt_linear_t_fwd(m, up, in, P(m, j, T_UPW), NULL, N, C, Il);
        }
        o->swiglu_fwd(b->fcg, gate, up, (size_t)N * Il);
        if (m->canon) gpt_rowt_fwd(m, proj, b->fcg, P(m, j, T_MPW), N, Il, C);
        else gpt_linear_t_fwd(m, proj, b->fcg, P(m, j, T_MPW), NULL, N, Il, C);
    } else if (m->canon) { /* the canonical chunks (tp_chunks.c); the bias added to the completed sum */
        gpt_col_fwd(m, b->fch, in, P(m, j, T_FCW), P(m, j, T_FCB), N, C, Il, 1);
        o->gelu_fwd(b->fcg, b->fch, (size_t)N * Il);
        gpt_row_fwd(m, proj, b->fcg, P(m, j, T_MPW), N, Il, C);
        DT_TRY(gpt_tp_complete(m, proj, m->acts->rows, N, out));
        gpt_add_bias(m, *out, P(m, j, T_MPB), N, C);
        return DT_OK;
    } else {
        dt_linear_gelu_fwd(o, b->fcg, b->fch, in, P(m, j, T_FCW), P(m, j, T_FCB), N, C, Il);
        o->linear_fwd(proj, b->fcg, P(m, j, T_MPW), bias_here ? P(m, j, T_MPB) : NULL, N, Il, C);
    }
    return gpt_tp_complete(m, proj, m->acts->rows, N, out);
}

/* Llama's backward through down and SwiGLU: k->fc receives dgate | dup */
static dt_status swiglu_bwd(gpt_model *m, const block_acts *b, const block_douts *k, const float *dout, int j,
                            int split, int N) {
    int C = m->shape.n_embd, Il = m->shape.intermediate / m->tp;
    float *dact = split ? m->acts->dbig : S(m, m->acts->dbig, 2 * (size_t)N * Il); /* d(silu(gate)·up) */
    if (m->canon) {
        DT_TRY(gpt_rowt_bwd(m, dact, split ? NULL : G(m, j, T_MPW), dout, b->fcg, P(m, j, T_MPW), N, Il, C));
    } else {
        if (!split) gpt_linear_t_bwd(m, NULL, G(m, j, T_MPW), NULL, dout, b->fcg, NULL, N, Il, C, 0);
        gpt_linear_t_bwd(m, dact, NULL, NULL, dout, NULL, P(m, j, T_MPW), N, Il, C, 0);
    }
    m->ops->swiglu_bwd(k->fc, S(m, k->fc, (size_t)N * Il), dact, b->fch, S(m, b->fch, (size_t)N * Il), (size_t)N * Il);
    return DT_OK;
}

dt_status gpt_mlp_backward(gpt_model *m, gpt_slot *s, const block_acts *b, const block_douts *k, int j, int split,
                           float **dln) {
    const dt_ops *o = m->ops;
    gpt_acts *a = m->acts;
    int C = m->shape.n_embd, Il = m->shape.intermediate / m->tp, N = s->B * s->T;
    size_t NC = (size_t)N * C * m->esz;
    float *dout, *in = NULL;
    DT_TRY(gpt_seq_gather(m, s->dres, N, &dout));
    if (split) o->copy(k->mp, dout, NC);
    if (llama(m)) {
        DT_TRY(swiglu_bwd(m, b, k, dout, j, split, N));
        if (!split) DT_TRY(gpt_seq_gather(m, b->ln2, N, &in));
        if (m->canon) { /* gate's and up's canonical leaves, then their tree */
            float *leaf[64];
            gpt_canon_leaves(m, a->dsmall, (size_t)N * C, leaf);
            DT_TRY(gpt_colt_bwd(m, leaf, 0, WG(m, j, T_FCW, split), NULL, k->fc, in, P(m, j, T_FCW), N, C, Il, 0));
            DT_TRY(gpt_colt_bwd(m, leaf, 1, WG(m, j, T_UPW, split), NULL, S(m, k->fc, (size_t)N * Il), in, P(m, j, T_UPW), N,
                         C, Il, 0));
            gpt_canon_tree(m, leaf, m->canon / m->tp, (size_t)N * C);
            return gpt_tp_complete(m, a->dsmall, a->rows, N, dln);
        }
        gpt_linear_t_bwd(m, a->dsmall, WG(m, j, T_FCW, split), NULL, k->fc, in, P(m, j, T_FCW), N, C, Il, 0);
        gpt_linear_t_bwd(m, a->dsmall, WG(m, j, T_UPW, split), NULL, S(m, k->fc, (size_t)N * Il), in, P(m, j, T_UPW),
                         N, C, Il, 1);
        return gpt_tp_complete(m, a->dsmall, a->rows, N, dln);
    }
    if (m->canon) {
        if (!split) DT_TRY(gpt_row_bwd(m, NULL, G(m, j, T_MPW), G(m, j, T_MPB), dout, b->fcg, NULL, N, Il, C));
        DT_TRY(gpt_row_bwd(m, k->fc, NULL, NULL, dout, NULL, P(m, j, T_MPW), N, Il, C));
        o->gelu_bwd(k->fc, b->fch, k->fc, (size_t)N * Il);
        if (!split) DT_TRY(gpt_seq_gather(m, b->ln2, N, &in));
        DT_TRY(gpt_col_bwd(m, a->dsmall, WG(m, j, T_FCW, split), WG(m, j, T_FCB, split), k->fc, in, P(m, j, T_FCW), N, C, Il, 1));
        return gpt_tp_complete(m, a->dsmall, a->rows, N, dln);
    }
    if (!split) o->linear_bwd(NULL, G(m, j, T_MPW), G(m, j, T_MPB), dout, b->fcg, P(m, j, T_MPW), N, Il, C, 0);
    dt_linear_dgelu_bwd(o, k->fc, dout, P(m, j, T_MPW), b->fch, N, Il, C);
    if (!split) DT_TRY(gpt_seq_gather(m, b->ln2, N, &in));
    o->linear_bwd(a->dsmall, WG(m, j, T_FCW, split), WG(m, j, T_FCB, split), k->fc, in, P(m, j, T_FCW), N, C, Il, 0);
    return gpt_tp_complete(m, a->dsmall, a->rows, N, dln);
}

dt_status gpt_mlp_weight(gpt_model *m, const gpt_slot *s, const block_acts *b, const block_douts *k, int j) {
    const dt_ops *o = m->ops;
    int C = m->shape.n_embd, Il = m->shape.intermediate / m->tp, N = s->B * s->T;
    float *in;
    if (llama(m) && m->canon) DT_TRY(gpt_rowt_bwd(m, NULL, G(m, j, T_MPW), k->mp, b->fcg, NULL, N, Il, C));
    else if (llama(m)) gpt_linear_t_bwd(m, NULL, G(m, j, T_MPW), NULL, k->mp, b->fcg, NULL, N, Il, C, 0);
    else if (m->canon) DT_TRY(gpt_row_bwd(m, NULL, G(m, j, T_MPW), G(m, j, T_MPB), k->mp, b->fcg, NULL, N, Il, C));
    else o->linear_bwd(NULL, G(m, j, T_MPW), G(m, j, T_MPB), k->mp, b->fcg, NULL, N, Il, C, 0);
    DT_TRY(gpt_seq_gather(m, b->ln2, N, &in));
    if (llama(m) && m->canon) {
        DT_TRY(gpt_colt_bwd(m, NULL, 0, G(m, j, T_FCW), NULL, k->fc, in, NULL, N, C, Il, 0));
        DT_TRY(gpt_colt_bwd(m, NULL, 0, G(m, j, T_UPW), NULL, S(m, k->fc, (size_t)N * Il), in, NULL, N, C, Il, 0));
    } else if (llama(m)) {
        gpt_linear_t_bwd(m, NULL, G(m, j, T_FCW), NULL, k->fc, in, NULL, N, C, Il, 0);
        gpt_linear_t_bwd(m, NULL, G(m, j, T_UPW), NULL, S(m, k->fc, (size_t)N * Il), in, NULL, N, C, Il, 0);
    } else if (m->canon) {
        DT_TRY(gpt_col_bwd(m, NULL, G(m, j, T_FCW), G(m, j, T_FCB), k->fc, in, NULL, N, C, Il, 1));
    } else {
        o->linear_bwd(NULL, G(m, j, T_FCW), G(m, j, T_FCB), k->fc, in, NULL, N, C, Il, 0);
    }
    return DT_OK;
}

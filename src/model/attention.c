/* The attention half of a block. GPT-2: c_attn (column-parallel: this rank's heads' q, k,
 * v in one GEMM), causal attention, c_proj (row-parallel: partial sums completed over the
 * tensor-parallel group, its bias added by piece 0 alone). Llama: q, k and v projections
 * of their own (k and v of n_kv_head heads; biases optional), rotary embeddings and the
 * key/value heads repeated for their query groups (the backend's rope_qkv) into the same
 * qkv layout, the same attention, o_proj without bias. With sp the input is gathered over
 * the sequence pieces first. The attention is the backend's, or context parallelism's ring. */
#include "gpt_internal.h"

/* This rank's widths: query heads and their width; key/value heads and their width */
typedef struct {
    int NHl, Cl, NKVl, Ckv, HS;
} widths;
static widths widths_of(const gpt_model *m) {
    int HS = m->shape.n_embd / m->shape.n_head, NHl = m->shape.n_head / m->tp;
    int NKVl = gpt_kv_heads_local(&m->shape, m->tp); /* with replicas: the one its query heads use */
    return (widths){NHl, NHl * HS, NKVl, NKVl * HS, HS};
}

static dt_status attend_fwd(gpt_model *m, const gpt_slot *a, const block_acts *b, widths w) {
    if (m->cp_comm.attention_fwd)
        return m->cp_comm.attention_fwd(m->cp_comm.ctx, b->atty, b->lse, b->qkv, a->docs ? a->seg_host : NULL, a->B,
                                        a->T, w.Cl, w.NHl);
    m->ops->attention_fwd(b->atty, b->lse, b->qkv, a->docs ? a->seg : NULL, a->B, a->T, w.Cl, w.NHl);
    return DT_OK;
}

dt_status gpt_attention_forward(gpt_model *m, const gpt_slot *a, const block_acts *b, int j, float **out) {
    const dt_ops *o = m->ops;
    float *proj = m->acts->proj, *in;
    int C = m->shape.n_embd, N = a->B * a->T, bias_here = m->tp_rank == 0;
    widths w = widths_of(m);
    DT_TRY(gpt_seq_gather(m, b->ln1, N, &in));
    if (llama(m)) { /* q, k, v (scratch), then rotated and grouped into qkv */
        float *q = m->acts->dbig, *k = S(m, q, (size_t)N * w.Cl), *v = S(m, k, (size_t)N * w.Ckv);
        if (m->canon) { /* the canonical blocks (tp_chunks.c) */
            gpt_colt_fwd(m, q, in, P(m, j, T_QW), P(m, j, T_QB), N, C, w.Cl, 0);
            gpt_colt_fwd(m, k, in, P(m, j, T_KW), P(m, j, T_KB), N, C, w.Ckv, 1);
            gpt_colt_fwd(m, v, in, P(m, j, T_VW), P(m, j, T_VB), N, C, w.Ckv, 1);
        } else {
            gpt_linear_t_fwd(m, q, in, P(m, j, T_QW), P(m, j, T_QB), N, C, w.Cl);
            gpt_linear_t_fwd(m, k, in, P(m, j, T_KW), P(m, j, T_KB), N, C, w.Ckv);
            gpt_linear_t_fwd(m, v, in, P(m, j, T_VW), P(m, j, T_VB), N, C, w.Ckv);
        }
        o->rope_qkv_fwd(b->qkv, q, k, v, a->pos, m->acts->inv_freq, N, w.NHl, w.NKVl, w.HS);
        DT_TRY(attend_fwd(m, a, b, w));
        if (m->canon) gpt_rowt_fwd(m, proj, b->atty, P(m, j, T_APW), N, w.Cl, C);
        else gpt_linear_t_fwd(m, proj, b->atty, P(m, j, T_APW), NULL, N, w.Cl, C);
    } else if (m->canon) { /* the canonical chunks (tp_chunks.c); the bias added to the completed sum */
        gpt_col_fwd(m, b->qkv, in, P(m, j, T_QKVW), P(m, j, T_QKVB), N, C, 3 * w.Cl, 3);
        DT_TRY(attend_fwd(m, a, b, w));
        gpt_row_fwd(m, proj, b->atty, P(m, j, T_APW), N, w.Cl, C);
        DT_TRY(gpt_tp_complete(m, proj, m->acts->rows, N, out));
        gpt_add_bias(m, *out, P(m, j, T_APB), N, C);
        return DT_OK;
    } else {
        o->linear_fwd(b->qkv, in, P(m, j, T_QKVW), P(m, j, T_QKVB), N, C, 3 * w.Cl);
        DT_TRY(attend_fwd(m, a, b, w));
        o->linear_fwd(proj, b->atty, P(m, j, T_APW), bias_here ? P(m, j, T_APB) : NULL, N, w.Cl, C);
    }
    return gpt_tp_complete(m, proj, m->acts->rows, N, out);
}

/* Bitwise mode's rotary backward (canonical: the same sums in every layout): each query
 * head's dk and dv taken back on its own (rope_qkv_bwd with a key/value head per query
 * head, into the leaves' scratch), then a group's heads summed by one binary tree in head
 * order (gpt_canon_tree's: adjacent pairs first; each node rounded to storage precision),
 * whose upper levels, with replicated key/value heads, are the replicas' (qkv_t_bwd's kv
 * sum: a tree over them). Each group's G heads here are then a power of two
 * (dt_layout_canon), so the levels split at the ranks. */
static void rope_canon_bwd(gpt_model *m, float *raw, const float *dqkv, const int *pos, int N, widths w) {
    const dt_ops *o = m->ops;
    float *dk = S(m, raw, (size_t)N * w.Cl), *dv = S(m, dk, (size_t)N * w.Ckv);
    float *hk = m->acts->leaves, *hv = S(m, hk, (size_t)N * w.Cl); /* [N, Cl] each */
    o->rope_qkv_bwd(raw, hk, hv, dqkv, pos, m->acts->inv_freq, N, w.NHl, w.NHl, w.HS);
    int G = w.NHl / w.NKVl, HS = w.HS;
    for (int g = 0; g < w.NKVl; g++) {
        for (int s = 1; s < G; s *= 2)
            for (int i = 0; i + s < G; i += 2 * s) {
                size_t at = (size_t)(g * G + i) * HS, by = (size_t)s * HS;
                o->add_rows(S(m, hk, at), w.Cl, S(m, hk, at), w.Cl, S(m, hk, at + by), w.Cl, N, HS);
                o->add_rows(S(m, hv, at), w.Cl, S(m, hv, at), w.Cl, S(m, hv, at + by), w.Cl, N, HS);
            }
        size_t root = (size_t)g * G * HS, to = (size_t)g * HS;
        o->add_rows(S(m, dk, to), w.Ckv, S(m, hk, root), w.Cl, NULL, 0, N, HS);
        o->add_rows(S(m, dv, to), w.Ckv, S(m, hv, root), w.Cl, NULL, 0, N, HS);
    }
}

/* Llama's q, k, v weight gradients (and biases') from their output gradients raw (dq | dk
 * | dv); dx (NULL: none) receives the input gradient. With replicated key/value heads
 * (tp above n_kv_head) this rank's dk, dv are its own query heads' share: the input
 * gradient takes them as they are (the tensor-parallel sum of dx then counts each share
 * once), then they are summed over the head's replicas in place, in the pass that computes
 * dx (a split backward's weight pass reads raw summed), so every replica's k and v weight
 * gradients are the whole ones, the same on each. Bitwise mode sums the replicas first
 * (their tree), and each replica's leaves take the blocks of the head its query chunks
 * pair with (tp_chunks.c), so each block is counted once. */
static dt_status qkv_t_bwd(gpt_model *m, float *dx, float *raw, const float *in, int j, int split, int N, widths w) {
    int C = m->shape.n_embd;
    float *dq = raw, *dk = S(m, raw, (size_t)N * w.Cl), *dv = S(m, dk, (size_t)N * w.Ckv);
    if (dx && m->canon) { /* the three projections' canonical leaves, then their tree */
        float *leaf[64];
        DT_TRY(gpt_kv_sum(m, dk, 2 * (size_t)N * w.Ckv)); /* dk | dv */
        gpt_canon_leaves(m, dx, (size_t)N * C, leaf);
        DT_TRY(gpt_colt_bwd(m, leaf, 0, NULL, NULL, dq, NULL, P(m, j, T_QW), N, C, w.Cl, 0));
        DT_TRY(gpt_colt_bwd(m, leaf, 1, NULL, NULL, dk, NULL, P(m, j, T_KW), N, C, w.Ckv, 1));
        DT_TRY(gpt_colt_bwd(m, leaf, 1, NULL, NULL, dv, NULL, P(m, j, T_VW), N, C, w.Ckv, 1));
        gpt_canon_tree(m, leaf, m->canon / m->tp, (size_t)N * C);
    } else if (dx) {
        gpt_linear_t_bwd(m, dx, NULL, NULL, dq, NULL, P(m, j, T_QW), N, C, w.Cl, 0);
        gpt_linear_t_bwd(m, dx, NULL, NULL, dk, NULL, P(m, j, T_KW), N, C, w.Ckv, 1);
        gpt_linear_t_bwd(m, dx, NULL, NULL, dv, NULL, P(m, j, T_VW), N, C, w.Ckv, 1);
        DT_TRY(gpt_kv_sum(m, dk, 2 * (size_t)N * w.Ckv)); /* dk | dv */
    }
    if (split && dx) return DT_OK; /* the weight gradients in the split's weight pass */
    if (m->canon) {
        DT_TRY(gpt_colt_bwd(m, NULL, 0, G(m, j, T_QW), G(m, j, T_QB), dq, in, NULL, N, C, w.Cl, 0));
        DT_TRY(gpt_colt_bwd(m, NULL, 0, G(m, j, T_KW), G(m, j, T_KB), dk, in, NULL, N, C, w.Ckv, 1));
        DT_TRY(gpt_colt_bwd(m, NULL, 0, G(m, j, T_VW), G(m, j, T_VB), dv, in, NULL, N, C, w.Ckv, 1));
        return DT_OK;
    }
    gpt_linear_t_bwd(m, NULL, G(m, j, T_QW), G(m, j, T_QB), dq, in, NULL, N, C, w.Cl, 0);
    gpt_linear_t_bwd(m, NULL, G(m, j, T_KW), G(m, j, T_KB), dk, in, NULL, N, C, w.Ckv, 0);
    gpt_linear_t_bwd(m, NULL, G(m, j, T_VW), G(m, j, T_VB), dv, in, NULL, N, C, w.Ckv, 0);
    return DT_OK;
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
    int B = s->B, T = s->T, C = m->shape.n_embd, N = B * T, ll = llama(m);
    widths w = widths_of(m);
    size_t NC = (size_t)N * C * m->esz;
    float *dout, *in = NULL;
    /* the attention's input gradient (Llama: the grouped, rotated layout, then the q, k, v
     * projections' own: kept for the weight pass when split) */
    float *dqkv = ll ? a->dbig : k->qkv, *raw = !ll ? NULL : split ? k->qkv : S(m, a->dbig, (size_t)N * 3 * w.Cl);
    DT_TRY(gpt_seq_gather(m, s->dres, N, &dout));
    if (split) o->copy(k->ap, dout, NC);
    if (ll && m->canon) DT_TRY(gpt_rowt_bwd(m, a->dsmall, WG(m, j, T_APW, split), dout, b->atty, P(m, j, T_APW), N, w.Cl, C));
    else if (ll) gpt_linear_t_bwd(m, a->dsmall, WG(m, j, T_APW, split), NULL, dout, b->atty, P(m, j, T_APW), N, w.Cl, C, 0);
    else if (m->canon)
        DT_TRY(gpt_row_bwd(m, a->dsmall, WG(m, j, T_APW, split), WG(m, j, T_APB, split), dout, b->atty, P(m, j, T_APW), N,
                    w.Cl, C));
    else o->linear_bwd(a->dsmall, WG(m, j, T_APW, split), WG(m, j, T_APB, split), dout, b->atty, P(m, j, T_APW), N,
                       w.Cl, C, 0);
    if (m->cp_comm.attention_bwd)
        DT_TRY(m->cp_comm.attention_bwd(m->cp_comm.ctx, dqkv, a->dsmall, b->qkv, b->atty, b->lse,
                                        s->docs ? s->seg_host : NULL, B, T, w.Cl, w.NHl));
    else o->attention_bwd(dqkv, a->dsmall, b->qkv, b->atty, b->lse, s->docs ? s->seg : NULL, B, T, w.Cl, w.NHl);
    if (!split) DT_TRY(gpt_seq_gather(m, b->ln1, N, &in));
    if (ll) {
        float *dk = S(m, raw, (size_t)N * w.Cl), *dv = S(m, dk, (size_t)N * w.Ckv);
        if (m->canon) rope_canon_bwd(m, raw, dqkv, s->pos, N, w);
        else o->rope_qkv_bwd(raw, dk, dv, dqkv, s->pos, a->inv_freq, N, w.NHl, w.NKVl, w.HS);
        DT_TRY(qkv_t_bwd(m, a->dsmall, raw, in, j, split, N, w));
    } else if (m->canon) {
        DT_TRY(gpt_col_bwd(m, a->dsmall, WG(m, j, T_QKVW, split), WG(m, j, T_QKVB, split), k->qkv, in, P(m, j, T_QKVW), N, C,
                    3 * w.Cl, 3));
    } else {
        o->linear_bwd(a->dsmall, WG(m, j, T_QKVW, split), WG(m, j, T_QKVB, split), k->qkv, in, P(m, j, T_QKVW), N, C,
                      3 * w.Cl, 0);
    }
    return gpt_tp_complete(m, a->dsmall, a->rows, N, dln);
}

dt_status gpt_attention_weight(gpt_model *m, const gpt_slot *s, const block_acts *b, const block_douts *k, int j) {
    const dt_ops *o = m->ops;
    int C = m->shape.n_embd, N = s->B * s->T;
    widths w = widths_of(m);
    float *in;
    if (llama(m) && m->canon) DT_TRY(gpt_rowt_bwd(m, NULL, G(m, j, T_APW), k->ap, b->atty, NULL, N, w.Cl, C));
    else if (llama(m)) gpt_linear_t_bwd(m, NULL, G(m, j, T_APW), NULL, k->ap, b->atty, NULL, N, w.Cl, C, 0);
    else if (m->canon) DT_TRY(gpt_row_bwd(m, NULL, G(m, j, T_APW), G(m, j, T_APB), k->ap, b->atty, NULL, N, w.Cl, C));
    else o->linear_bwd(NULL, G(m, j, T_APW), G(m, j, T_APB), k->ap, b->atty, NULL, N, w.Cl, C, 0);
    DT_TRY(gpt_seq_gather(m, b->ln1, N, &in));
    if (llama(m)) DT_TRY(qkv_t_bwd(m, NULL, k->qkv, in, j, 1, N, w));
    else if (m->canon) DT_TRY(gpt_col_bwd(m, NULL, G(m, j, T_QKVW), G(m, j, T_QKVB), k->qkv, in, NULL, N, C, 3 * w.Cl, 3));
    else o->linear_bwd(NULL, G(m, j, T_QKVW), G(m, j, T_QKVB), k->qkv, in, NULL, N, C, 3 * w.Cl, 0);
    return DT_OK;
}

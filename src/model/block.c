/* A transformer block, pre-norm in both families: x + attention(norm_1(x)), then the same
 * with the MLP and norm_2 (GPT-2's ln_1/ln_2, Llama's input/post_attention_layernorm).
 * With tensor parallelism (tp ranks) this rank holds NH/tp heads (Cl =
 * C/tp of the attention width) and 4C/tp MLP columns (attention.c, mlp.c); with sp the
 * LayerNorms and residual adds run on this rank's Nl rows, and the replicated LayerNorms'
 * gradients are summed over the group (tp_regions.c). */
#include "gpt_internal.h"

dt_status gpt_block_forward(gpt_model *m, const gpt_slot *a, int j) {
    const dt_ops *o = m->ops;
    float *p;
    int C = m->shape.n_embd, Nl = local_rows(m, a->B * a->T);
    block_acts b = gpt_block_acts(m, a, j);
    gpt_norm_fwd(m, b.ln1, b.ln1_mean, b.ln1_rstd, b.x, P(m, j, T_LN1W), P(m, j, T_LN1B), Nl);
    DT_TRY(gpt_attention_forward(m, a, &b, j, &p));
    o->add(b.res2, b.x, p, (size_t)Nl * C);
    if (m->block_units > 1) { /* the attention half's unit done, the MLP half's next */
        HOOK(after_forward, gpt_block_unit(m, j));
        HOOK(before_forward, gpt_mlp_unit(m, j));
    }
    gpt_norm_fwd(m, b.ln2, b.ln2_mean, b.ln2_rstd, b.res2, P(m, j, T_LN2W), P(m, j, T_LN2B), Nl);
    DT_TRY(gpt_mlp_forward(m, a, &b, j, &p));
    o->add(b.res3, b.res2, p, (size_t)Nl * C);
    return DT_OK;
}

/* Block j's two norms' gradient targets (gpt_norm_grads: NULL where frozen). */
static void block_norm_grads(gpt_model *m, int j, ln_grads *n2, ln_grads *n1) {
    *n2 = gpt_norm_grads(m, TI(m, j, T_LN2W), TI(m, j, T_LN2B));
    *n1 = gpt_norm_grads(m, TI(m, j, T_LN1W), TI(m, j, T_LN1B));
}

/* The norms' gradients completed (summed over tp with sp), a frozen half of a pair undone. */
static dt_status block_norm_finish(gpt_model *m, int j, const ln_grads *n2, const ln_grads *n1) {
    const ln_grads g[2] = {*n2, *n1};
    DT_TRY(gpt_ln_grad_finish(m, g, 2));
    if (n2->w) gpt_zero_frozen(m, TI(m, j, T_LN2W), NULL), gpt_zero_frozen(m, TI(m, j, T_LN2B), NULL);
    if (n1->w) gpt_zero_frozen(m, TI(m, j, T_LN1W), NULL), gpt_zero_frozen(m, TI(m, j, T_LN1B), NULL);
    return DT_OK;
}

/* One norm's gradients completed alone (a split block's: each half's unit is final apart). */
static dt_status norm_finish_one(gpt_model *m, int j, const ln_grads *n, int wrole, int brole) {
    DT_TRY(gpt_ln_grad_finish(m, n, 1));
    if (n->w) gpt_zero_frozen(m, TI(m, j, wrole), NULL), gpt_zero_frozen(m, TI(m, j, brole), NULL);
    return DT_OK;
}

/* The input gradient of block j; its weight gradients too unless split, else the output
 * gradients of its linears and LayerNorms kept for gpt_block_weight (so every weight
 * gradient of a block is written by one call: a sharding wrapper reduces a unit once per
 * micro-batch, and the bitwise mode folds it per micro-batch). Frozen tensors get none. */
dt_status gpt_block_backward(gpt_model *m, gpt_slot *s, int j, int split) {
    const dt_ops *o = m->ops;
    gpt_acts *a = m->acts;
    int C = m->shape.n_embd, Nl = local_rows(m, s->B * s->T);
    block_acts b = gpt_block_acts(m, s, j);
    block_douts k = split ? gpt_block_douts(m, s, j) : (block_douts){NULL, a->dbig, NULL, a->dbig, NULL, NULL};
    size_t RCb = (size_t)Nl * C * m->esz;
    float *dln;
    /* MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))) */
    DT_TRY(gpt_mlp_backward(m, s, &b, &k, j, split, &dln));
    ln_grads n2, n1;
    block_norm_grads(m, j, &n2, &n1);
    ln_grads ln2 = gpt_ln_grad_target(m, n2.w, n2.b, 0);
    ln_grads ln1 = gpt_ln_grad_target(m, n1.w, n1.b, 1);
    if (split) {
        ln2 = ln1 = (ln_grads){NULL, NULL};
        o->copy(k.ln2, dln, RCb);
    }
    if (m->sp && !split) o->zero(a->lngrad, 4 * (size_t)C * m->esz);
    DT_TRY(gpt_norm_bwd(m, s->dres, ln2.w, ln2.b, dln, b.res2, P(m, j, T_LN2W), b.ln2_mean, b.ln2_rstd, Nl));
    if (m->block_units > 1) { /* the MLP half's gradients final (norm_2's summed alone), then the attention half */
        DT_TRY(norm_finish_one(m, j, &n2, T_LN2W, T_LN2B));
        HOOK(after_backward, gpt_mlp_unit(m, j));
        HOOK(before_backward, gpt_block_unit(m, j));
        block_norm_grads(m, j, &n2, &n1); /* norm_1's gradient where the hook points its unit now */
        ln1 = gpt_ln_grad_target(m, n1.w, n1.b, 0); /* its sum over tp in the first part, now free */
        if (m->sp) o->zero(a->lngrad, 2 * (size_t)C * m->esz);
    }
    /* attention: res2 = x + c_proj(attn(c_attn(ln_1(x)))) */
    DT_TRY(gpt_attention_backward(m, s, &b, &k, j, split, &dln));
    if (split) o->copy(k.ln1, dln, RCb);
    DT_TRY(gpt_norm_bwd(m, s->dres, ln1.w, ln1.b, dln, b.x, P(m, j, T_LN1W), b.ln1_mean, b.ln1_rstd, Nl));
    if (split) return DT_OK;
    if (m->block_units > 1) return norm_finish_one(m, j, &n1, T_LN1W, T_LN1B);
    return block_norm_finish(m, j, &n2, &n1);
}

/* Block j's LayerNorm weight gradients from their kept output gradients (split W). */
static dt_status block_ln_weight(gpt_model *m, gpt_slot *s, int j) {
    const dt_ops *o = m->ops;
    int C = m->shape.n_embd, Nl = local_rows(m, s->B * s->T);
    block_acts b = gpt_block_acts(m, s, j);
    block_douts k = gpt_block_douts(m, s, j);
    ln_grads n2, n1;
    block_norm_grads(m, j, &n2, &n1);
    ln_grads ln2 = gpt_ln_grad_target(m, n2.w, n2.b, 0);
    ln_grads ln1 = gpt_ln_grad_target(m, n1.w, n1.b, 1);
    if (m->sp) o->zero(m->acts->lngrad, 4 * (size_t)C * m->esz);
    if (ln2.w) DT_TRY(gpt_norm_bwd(m, NULL, ln2.w, ln2.b, k.ln2, b.res2, P(m, j, T_LN2W), b.ln2_mean, b.ln2_rstd, Nl));
    if (ln1.w) DT_TRY(gpt_norm_bwd(m, NULL, ln1.w, ln1.b, k.ln1, b.x, P(m, j, T_LN1W), b.ln1_mean, b.ln1_rstd, Nl));
    return block_norm_finish(m, j, &n2, &n1);
}

dt_status gpt_block_weight(gpt_model *m, gpt_slot *s, int j) {
    block_acts b = gpt_block_acts(m, s, j);
    block_douts k = gpt_block_douts(m, s, j);
    DT_TRY(gpt_mlp_weight(m, s, &b, &k, j));
    DT_TRY(gpt_attention_weight(m, s, &b, &k, j));
    return block_ln_weight(m, s, j);
}

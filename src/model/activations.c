/* The activation arena: one allocation per model, laid out for its layout (slots of
 * per-block activations, the recompute block, scratch shared by all), and the views of
 * one slot's block. Its size by region is what the estimator reports. */
#include <string.h>

#include "gpt_internal.h"

size_t gpt_act_layout(const gpt_shape *s, int max_B, int max_T, size_t esz, const gpt_layout *lay, gpt_acts *a,
                      size_t *regions) {
    gpt_stage_info st = gpt_stage_of(s, lay);
    size_t LL = (size_t)st.maxc, BT = (size_t)max_B * max_T, C = (size_t)s->n_embd, Vp = (size_t)s->padded_vocab;
    size_t tp = (size_t)lay->tp, sp = lay->sp && tp > 1, head = (size_t)st.head, first = (size_t)st.embed;
    size_t split = lay->split_backward != 0, docs = lay->documents != 0;
    size_t rc = lay->recompute != 0, LI = rc ? 0 : LL; /* blocks of inner activations per slot */
    size_t NH = (size_t)s->n_head / tp, Cl = C / tp; /* this rank's heads and width */
    size_t R = sp ? BT / tp : BT;                     /* rows of the residual stream held here */
    size_t FC = gpt_fc_width(s, (int)tp), FG = gpt_fcg_width(s, (int)tp), DB = gpt_dbig_width(s, (int)tp);
    size_t ll = s->family == GPT_FAMILY_LLAMA, bias = ll && s->qkv_bias, half = (size_t)(s->n_embd / s->n_head) / 2;
    size_t L = lay->canon > 1 ? (size_t)lay->canon / tp : 0; /* canonical chunks of this rank (tp_chunks.c) */
    /* their leaves' scratch: L - 1 rows of C; Llama's rotary backward's per-head dk, dv too */
    size_t LW = L ? (L - 1) * C > 2 * ll * Cl ? (L - 1) * C : 2 * ll * Cl : 0;
    /* The head is computed in row chunks so the logits need not exist for all rows at once;
     * chunks are large (up to 512 MB of logits) because every chunk re-reads and re-writes
     * the whole dwte in its GEMM, and BLAS is faster with a deeper K. */
    size_t head_rows = gpt_head_rows(Vp, BT, lay->row_block);
    gpt_acts dummy;
    gpt_slot dummy_slot;
    if (!a) {
        memset(&dummy, 0, sizeof dummy);
        a = &dummy;
    }
    a->head_rows = (int)head_rows;
    enum { F32 = 4, TOK = sizeof(dt_token) };
    enum { SEQ = GPT_ACT_SEQUENCE, TPR = GPT_ACT_TENSOR, OTH = GPT_ACT_OTHER };
    const size_t E = esz;
    typedef struct { float **p; size_t n, bytes; int region; } part;
    size_t total = 0; /* bytes, each part 64-byte aligned */
    char *p = a->arena;
    if (regions) memset(regions, 0, GPT_ACT_NREGIONS * sizeof *regions);
#define LAY(list)                                                             \
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {               \
        if (p) *list[i].p = (float *)(p + total);                            \
        size_t bytes_ = (list[i].n * list[i].bytes + 63) / 64 * 64;          \
        total += bytes_;                                                      \
        if (regions) regions[list[i].region] += bytes_;                       \
    }
    for (int k = 0; k < st.slots; k++) {
        gpt_slot *b = p ? &a->slot[k] : &dummy_slot;
        part per_slot[] = {
            {&b->encoded, R * C, E, SEQ},            {&b->ln1, LI * R * C, E, SEQ},         {&b->ln1_mean, LI * R, F32, SEQ},
            {&b->ln1_rstd, LI * R, F32, SEQ},         {&b->qkv, LI * BT * 3 * Cl, E, TPR},   {&b->atty, LI * BT * Cl, E, TPR},
            {&b->lse, LI * BT * NH, F32, TPR},        {&b->res2, LI * R * C, E, SEQ},        {&b->ln2, LI * R * C, E, SEQ},
            {&b->ln2_mean, LI * R, F32, SEQ},         {&b->ln2_rstd, LI * R, F32, SEQ},      {&b->fch, LI * BT * FC, E, TPR},
            {&b->fch_gelu, LI * BT * FG, E, TPR},     {&b->res3, LL * R * C, E, SEQ},        {&b->lnf, head * R * C, E, SEQ},
            {&b->lnf_mean, head * R, F32, SEQ},      {&b->lnf_rstd, head * R, F32, SEQ},    {&b->dres, R * C, E, SEQ},
            {(float **)&b->tok, first * BT, TOK, OTH},   {(float **)&b->seg, docs * BT, sizeof(int), OTH},
            {&b->wd_mp, split * LL * BT * C, E, OTH},    {&b->wd_fc, split * LL * BT * FC, E, TPR},
            {&b->wd_ap, split * LL * BT * C, E, OTH},    {&b->wd_qkv, split * LL * BT * 3 * Cl, E, TPR},
            {&b->wd_ln2, split * LL * R * C, E, SEQ},    {&b->wd_ln1, split * LL * R * C, E, SEQ},
            {(float **)&b->pos, ll * BT, sizeof(int), OTH},
        };
        LAY(per_slot)
    }
    gpt_slot *q = p ? &a->rc : &dummy_slot; /* recompute: one block's inner activations for all */
    part inner[] = {
        {&q->ln1, rc * R * C, E, SEQ},         {&q->ln1_mean, rc * R, F32, SEQ},      {&q->ln1_rstd, rc * R, F32, SEQ},
        {&q->qkv, rc * BT * 3 * Cl, E, TPR},   {&q->atty, rc * BT * Cl, E, TPR},      {&q->lse, rc * BT * NH, F32, TPR},
        {&q->res2, rc * R * C, E, SEQ},        {&q->ln2, rc * R * C, E, SEQ},         {&q->ln2_mean, rc * R, F32, SEQ},
        {&q->ln2_rstd, rc * R, F32, SEQ},      {&q->fch, rc * BT * FC, E, TPR},       {&q->fch_gelu, rc * BT * FG, E, TPR},
    };
    LAY(inner)
    part shared[] = {
        {&a->logits, head * head_rows * Vp, E, OTH}, {&a->losses, head * BT, F32, OTH},  {&a->proj, BT * C, E, OTH},
        {&a->dsmall, BT * C, E, OTH},                {&a->dbig, BT * DB, E, TPR},         {(float **)&a->tgt, head * BT, TOK, OTH},
        {&a->xstat, head * (3 + 2 * L) * head_rows, F32, OTH}, {&a->full, sp * BT * C, E, OTH},
        {&a->rows, sp * R * C, E, SEQ},              {&a->lngrad, sp * 4 * C, E, OTH},
        {&a->lnrows, (sp && L) * 2 * BT * C, E, OTH}, {&a->lnstat, (sp && L) * 2 * BT, F32, OTH},    {&a->inv_freq, ll * half, F32, OTH},
        {&a->ones, (bias || L) * BT, E, OTH},       {&a->leaves, LW * BT, E, OTH},
    };
    LAY(shared)
#undef LAY
    return total;
}

size_t gpt_head_rows(size_t Vp, size_t BT, int row_block) {
    size_t r = (128u << 20) / Vp;
    if (r < 64) r = 64;
    if (r > BT) r = BT;
    if (row_block > 0) r = r < (size_t)row_block ? (size_t)row_block : r / (size_t)row_block * (size_t)row_block;
    return r;
}

size_t gpt_activation_bytes(const gpt_shape *s, int B, int T, size_t elem_bytes) {
    return gpt_act_layout(s, B, T, elem_bytes, &gpt_one_rank, NULL, NULL);
}

size_t gpt_activation_bytes_layout(const gpt_shape *s, int B, int T, size_t elem_bytes, const gpt_layout *layout,
                                   size_t *regions) {
    return gpt_act_layout(s, B, T, elem_bytes, layout ? layout : &gpt_one_rank, NULL, regions);
}

size_t gpt_fc_width(const gpt_shape *s, int tp) {
    return (size_t)(s->family == GPT_FAMILY_LLAMA ? 2 : 1) * (size_t)s->intermediate / (size_t)tp;
}
size_t gpt_fcg_width(const gpt_shape *s, int tp) { return (size_t)s->intermediate / (size_t)tp; }
size_t gpt_dbig_width(const gpt_shape *s, int tp) {
    size_t C = (size_t)s->n_embd, I = (size_t)s->intermediate, t = (size_t)tp;
    if (s->family != GPT_FAMILY_LLAMA) return 4 * C / t; /* c_fc's output gradient (c_attn's: 3C) */
    size_t kv = (size_t)gpt_kv_heads_local(s, tp) * (C / (size_t)s->n_head); /* this rank's k (v) width */
    size_t mlp = 3 * I / t, att = 4 * C / t + 2 * kv; /* d(silu·up) | dgate | dup; dqkv | dq | dk | dv */
    return mlp > att ? mlp : att;
}

block_acts gpt_block_acts(const gpt_model *m, const gpt_slot *a, int j) {
    size_t BT = (size_t)m->max_B * m->max_T, BTCl = BT * (size_t)m->shape.n_embd / (size_t)m->tp;
    size_t FC = BT * gpt_fc_width(&m->shape, m->tp), FG = BT * gpt_fcg_width(&m->shape, m->tp);
    size_t R = max_local_rows(m), RC = R * (size_t)m->shape.n_embd;
    int i = j - m->chunk_block0[a->chunk]; /* the block's index in its chunk */
    size_t L = (size_t)i; /* storage-precision buffers step through S(); statistics are fp32 */
    /* inner activations: the slot's own per block, or with recompute the one shared block's */
    const gpt_slot *n = m->recompute ? &m->acts->rc : a;
    size_t I = m->recompute ? 0 : L;
    return (block_acts){layer_in(m, a, i),            S(m, n->ln1, I * RC),       n->ln1_mean + I * R,
                        n->ln1_rstd + I * R,          S(m, n->qkv, I * 3 * BTCl), S(m, n->atty, I * BTCl),
                        n->lse + I * BT * (size_t)(m->shape.n_head / m->tp),      S(m, n->res2, I * RC),
                        S(m, n->ln2, I * RC),         n->ln2_mean + I * R,        n->ln2_rstd + I * R,
                        S(m, n->fch, I * FC),         S(m, n->fch_gelu, I * FG),  S(m, a->res3, L * RC)};
}

block_douts gpt_block_douts(const gpt_model *m, const gpt_slot *s, int j) {
    size_t BTC = (size_t)m->max_B * m->max_T * (size_t)m->shape.n_embd, BTCl = BTC / (size_t)m->tp;
    size_t RC = max_local_rows(m) * (size_t)m->shape.n_embd, L = (size_t)(j - m->chunk_block0[s->chunk]);
    size_t FC = (size_t)m->max_B * m->max_T * gpt_fc_width(&m->shape, m->tp);
    return (block_douts){S(m, s->wd_mp, L * BTC), S(m, s->wd_fc, L * FC), S(m, s->wd_ap, L * BTC),
                         S(m, s->wd_qkv, L * 3 * BTCl), S(m, s->wd_ln2, L * RC), S(m, s->wd_ln1, L * RC)};
}

int gpt_slot_count(const gpt_model *m) { return m->acts->nslots; }
float *gpt_slot_input(gpt_model *m, int slot) { return slot_at(m, slot)->encoded; }
float *gpt_slot_output(gpt_model *m, int slot) { return slot_out(m, slot_at(m, slot)); }
float *gpt_slot_grad(gpt_model *m, int slot) { return slot_at(m, slot)->dres; }

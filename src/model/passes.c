/* The passes over a stage's chunks that the schedules run: forward (embeddings, blocks,
 * ln_f), backward (whole, or split into its input and weight halves), and the whole-model
 * drivers built on them; the hooks around each unit are called here (gpt.h gives their
 * order). */
#include <string.h>

#include "gpt_internal.h"

dt_status gpt_check_slot(const gpt_model *m, int slot) {
    if (slot < 0 || slot >= m->acts->nslots)
        return dt_fail(DT_EINPUT, "model: activation slot %d of %d", slot, m->acts->nslots);
    return DT_OK;
}

void gpt_set_documents(gpt_model *m, int slot, const int *seg, int B, int T) {
    if (slot < 0 || slot >= m->acts->nslots) return; /* gpt_forward refuses the slot */
    gpt_slot *a = slot_at(m, slot);
    size_t n = (size_t)B * (size_t)T;
    a->docs = seg && m->documents && B > 0 && T > 0 && n <= (size_t)m->max_B * m->max_T;
    if (!a->docs) return;
    memcpy(a->seg_host, seg, n * sizeof(int));
    m->ops->upload(a->seg, seg, n * sizeof(int));
}

/* The rotary position of each of the slot's tokens: its place in the sequence (context
 * parallelism: this rank's positions), from its document's start (documents). */
static void rotary_positions(gpt_model *m, gpt_slot *a) {
    const int *cpos = m->cp_comm.positions;
    int *pos = m->acts->pos_host;
    for (int b = 0; b < a->B; b++)
        for (int t = 0; t < a->T; t++) {
            size_t i = (size_t)b * a->T + t;
            pos[i] = a->pos0 + (cpos ? cpos[t] : t) - (a->docs ? a->seg_host[i] : 0);
        }
    m->ops->upload(a->pos, pos, (size_t)a->B * a->T * sizeof(int));
}

dt_status gpt_forward(gpt_model *m, int slot, const dt_token *tokens, int B, int T, int pos0) {
    return gpt_forward_chunk(m, slot, 0, tokens, B, T, pos0);
}

dt_status gpt_forward_chunk(gpt_model *m, int slot, int chunk, const dt_token *tokens, int B, int T, int pos0) {
    DT_TRY(gpt_check_slot(m, slot));
    if (chunk < 0 || chunk >= m->nchunks)
        return dt_fail(DT_EINPUT, "model: chunk %d of %d", chunk, m->nchunks);
    gpt_slot *a = slot_at(m, slot);
    int N = B * T, Nl = local_rows(m, N);
    const int *cpos = m->cp_comm.positions;
    if (B < 1 || T < 1 || B > m->max_B || T > m->max_T || pos0 < 0 ||
        (cpos ? pos0 != 0 || cpos[T - 1] >= m->shape.seq_len : pos0 + T > m->shape.seq_len))
        return dt_fail(DT_EINPUT, "model: a %d x %d micro-batch at position %d does not fit %d x %d (positions %d)", B,
                       T, pos0, m->max_B, m->max_T, m->shape.seq_len);
    if (m->cp_comm.row_block > 0 && N % m->cp_comm.row_block) /* a shorter last block would change the bits */
        return dt_fail(DT_EINPUT, "model: a %d x %d micro-batch does not cut into the canonical row blocks of %d "
                       "(parallel.cp_chunks)", B, T, m->cp_comm.row_block);
    if (m->sp && N % m->tp != 0)
        return dt_fail(DT_EINPUT, "parallel.sp: %d x %d tokens do not split into parallel.tp %d pieces", B, T, m->tp);
    if (a->docs && pos0 != 0) return dt_fail(DT_EINPUT, "model: documents in a micro-batch at position %d", pos0);
    a->B = B;
    a->T = T;
    a->pos0 = pos0;
    a->chunk = chunk;
    if (llama(m)) rotary_positions(m, a);
    if (embeds(m, chunk)) DT_TRY(gpt_embed_forward(m, a, tokens, B, T, pos0));
    for (int j = m->chunk_block0[chunk]; j < m->chunk_block0[chunk + 1]; j++) {
        if (j % m->unit_blocks == 0) HOOK(before_forward, gpt_block_unit(m, j)); /* its unit's first block */
        DT_TRY(gpt_block_forward(m, a, j));
        if ((j + 1) % m->unit_blocks == 0) HOOK(after_forward, gpt_mlp_unit(m, j));
    }
    if (heads(m, chunk)) {
        int lnf_unit = gpt_lnf_unit(m);
        HOOK(before_forward, lnf_unit);
        gpt_norm_fwd(m, a->lnf, a->lnf_mean, a->lnf_rstd, slot_out(m, a), tp(m, m->t_norm_w),
                     m->t_norm_b >= 0 ? tp(m, m->t_norm_b) : NULL, Nl);
        if (m->shape.tie) HOOK(after_forward, lnf_unit); /* else the head's weight is in it: gpt_loss closes it */
    }
    return DT_OK;
}

/* A whole model in one stage (gpt_forward_backward and friends): refuses stage models. */
static dt_status check_whole(const gpt_model *m) {
    if (!m->has_embed || !m->has_head || m->nblocks != m->shape.n_layer)
        return dt_fail(DT_EINPUT, "model: blocks [%d, %d) are a pipeline stage; this pass needs the whole model",
                       m->first_layer, m->first_layer + m->nblocks);
    return DT_OK;
}

dt_status gpt_eval_loss(gpt_model *m, const dt_token *tokens, const dt_token *targets, int B, int T, double *loss) {
    DT_TRY(check_whole(m));
    DT_TRY(gpt_forward(m, 0, tokens, B, T, 0));
    DT_TRY(gpt_loss(m, 0, targets, 0.0f, loss));
    HOOK(after_forward, 0);
    return DT_OK;
}

dt_status gpt_next_logits(gpt_model *m, const dt_token *tokens, int T, float *logits) {
    if (m->sp) return dt_fail(DT_EINPUT, "sampling with sequence parallelism is not implemented");
    DT_TRY(check_whole(m));
    gpt_set_documents(m, 0, NULL, 1, T); /* one plain sequence */
    DT_TRY(gpt_forward(m, 0, tokens, 1, T, 0));
    return gpt_last_logits(m, 0, logits);
}

static dt_status check_split(const gpt_model *m, int slot, int want) {
    DT_TRY(gpt_check_slot(m, slot));
    if (m->split != want)
        return dt_fail(DT_EINPUT, "model: a split backward needs a layout with split_backward (and gpt_backward "
                       "one without)");
    return DT_OK;
}

/* The embeddings' backward where the slot's chunk holds them and something trains there
 * (wte or wpe; else only its hooks: gpt_embed_backward). */
static dt_status embed_backward(gpt_model *m, gpt_slot *s) {
    return embeds(m, s->chunk) ? gpt_embed_backward(m, s) : DT_OK;
}

/* Below the lowest trainable tensor of the model nothing is computed, input gradients
 * included (gpt_block_skipped; the hooks still run, so a strategy sees every unit). */
dt_status gpt_backward(gpt_model *m, int slot) {
    DT_TRY(gpt_check_slot(m, slot));
    if (m->split) { /* both halves, one after the other */
        DT_TRY(gpt_backward_input(m, slot));
        return gpt_backward_weight(m, slot);
    }
    gpt_slot *s = slot_at(m, slot);
    for (int j = m->chunk_block0[s->chunk + 1] - 1; j >= m->chunk_block0[s->chunk]; j--) {
        /* a unit of several blocks: before its last block's backward, after its first's */
        if ((j + 1) % m->unit_blocks == 0) HOOK(before_backward, gpt_mlp_unit(m, j));
        gpt_count_skipped(m, j);
        if (!gpt_block_skipped(m, j)) {
            /* recompute: the block's inner activations again, from its kept input (the same
             * kernels on the same inputs: the same bits; with tp or cp the same collectives) */
            if (m->recompute) DT_TRY(gpt_block_forward(m, s, j));
            DT_TRY(gpt_block_backward(m, s, j, 0)); /* a split block's hooks between its halves there */
        } else if (m->block_units > 1) {
            HOOK(after_backward, gpt_mlp_unit(m, j));
            HOOK(before_backward, gpt_block_unit(m, j));
        }
        if (j % m->unit_blocks == 0) HOOK(after_backward, gpt_block_unit(m, j));
    }
    return embed_backward(m, s);
}

dt_status gpt_backward_input(gpt_model *m, int slot) {
    DT_TRY(check_split(m, slot, 1));
    gpt_slot *s = slot_at(m, slot);
    for (int j = m->chunk_block0[s->chunk + 1] - 1; j >= m->chunk_block0[s->chunk]; j--) {
        HOOK(before_backward, gpt_block_unit(m, j)); /* one block per unit here (gpt_layout.unit_blocks) */
        if (!gpt_block_skipped(m, j)) DT_TRY(gpt_block_backward(m, s, j, 1));
    }
    return DT_OK;
}

dt_status gpt_backward_weight(gpt_model *m, int slot) {
    DT_TRY(check_split(m, slot, 1));
    gpt_slot *s = slot_at(m, slot);
    for (int j = m->chunk_block0[s->chunk + 1] - 1; j >= m->chunk_block0[s->chunk]; j--) {
        HOOK(before_backward, 1 + j); /* again: its gradients are written now */
        gpt_count_skipped(m, j);
        if (!gpt_block_skipped(m, j) && !gpt_unit_frozen(m, 1 + j)) DT_TRY(gpt_block_weight(m, s, j));
        HOOK(after_backward, 1 + j);
    }
    return embed_backward(m, s);
}

dt_status gpt_forward_backward(gpt_model *m, const dt_token *tokens, const dt_token *targets, int B, int T,
                               float grad_scale, double *loss) {
    DT_TRY(check_whole(m));
    DT_TRY(gpt_forward(m, 0, tokens, B, T, 0));
    DT_TRY(gpt_loss(m, 0, targets, grad_scale, loss));
    return gpt_backward(m, 0);
}

/* The LM head (last stage): the final norm's output times the head's weight (the tied
 * token embedding, or Llama's lm_head.weight of its own), softmax cross-entropy and
 * its backward, computed in row chunks so the logits never exist for all rows at once.
 * With tensor parallelism the vocabulary is split: each rank holds its rows of wte and
 * its columns of the logits, and the cross-entropy completes its row statistics over the
 * group (no rank holds a whole row of logits). */
#include <stdlib.h>
#include <string.h>

#include "../core/bf16.h"
#include "gpt_internal.h"

/* Vocabulary-parallel cross-entropy over R rows of local logits (columns [v0, v0 + Vl)):
 * the row max and then the sum of exponentials and the target's logit are completed over
 * the tensor-parallel group, so no rank ever holds a whole row of logits. */
static dt_status xent_tp(gpt_model *m, int R, int r0, const dt_token *targets, float grad_scale) {
    const dt_ops *o = m->ops;
    gpt_acts *a = m->acts;
    int Vl = m->shape.padded_vocab / m->tp, v0 = m->tp_rank * Vl;
    int real = m->shape.vocab_size - v0 < 0 ? 0 : m->shape.vocab_size - v0 > Vl ? Vl : m->shape.vocab_size - v0;
    float *mx = a->xstat, *st = a->xstat + a->head_rows;
    o->xent_rowmax(a->logits, mx, R, Vl, real);
    DT_TRY(m->tp_comm.allreduce(m->tp_comm.ctx, mx, (size_t)R, GPT_TP_MAX_F32));
    o->xent_rowsum(a->logits, mx, targets + r0, st, R, Vl, real, v0);
    DT_TRY(m->tp_comm.allreduce(m->tp_comm.ctx, st, 2 * (size_t)R, GPT_TP_SUM_F32));
    o->xent_finish(a->logits, a->losses + r0, mx, st, targets + r0, R, Vl, real, v0, grad_scale);
    return DT_OK;
}

/* The same in the canonical chunks (tp_chunks.c): the row max over the whole local row
 * (a maximum is exact in any order), the sums of exponentials and target logits per
 * vocabulary chunk, summed by the tree, then over the group. */
static dt_status xent_canon(gpt_model *m, int R, int r0, const dt_token *targets, float grad_scale) {
    const dt_ops *o = m->ops;
    gpt_acts *a = m->acts;
    int V = m->shape.vocab_size, Vl = m->shape.padded_vocab / m->tp, v0 = m->tp_rank * Vl, L = m->canon / m->tp;
    int vb = Vl / L, real = V - v0 < 0 ? 0 : V - v0 > Vl ? Vl : V - v0;
    float *mx = a->xstat, *leaf[64] = {a->xstat + a->head_rows};
    for (int l = 1; l < L; l++) leaf[l] = a->xstat + (size_t)a->head_rows * (l ? 1 + 2 * (size_t)l : 1);
    o->xent_rowmax(a->logits, mx, R, Vl, real);
    if (m->tp_comm.allreduce) DT_TRY(m->tp_comm.allreduce(m->tp_comm.ctx, mx, (size_t)R, GPT_TP_MAX_F32));
    for (int l = 0; l < L; l++) {
        int c0 = v0 + l * vb, rl = V - c0 < 0 ? 0 : V - c0 > vb ? vb : V - c0;
        o->xent_rowsum(S(m, a->logits, (size_t)l * vb), mx, targets + r0, leaf[l], R, Vl, rl, c0);
    }
    if (L > 1) { /* fp32 statistics: their tree on the host (the backend's add is the storage's) */
        float *h = a->xstat_host;
        size_t n = 2 * (size_t)R;
        for (int l = 0; l < L; l++) o->download(h + l * n, leaf[l], n * sizeof(float));
        for (int w = 1; w < L; w *= 2)
            for (int i = 0; i + w < L; i += 2 * w)
                for (size_t e = 0; e < n; e++) h[i * n + e] += h[(i + w) * n + e];
        o->upload(leaf[0], h, n * sizeof(float));
    }
    if (m->tp_comm.allreduce) DT_TRY(m->tp_comm.allreduce(m->tp_comm.ctx, leaf[0], 2 * (size_t)R, GPT_TP_SUM_F32));
    o->xent_finish(a->logits, a->losses + r0, mx, leaf[0], targets + r0, R, Vl, real, v0, grad_scale);
    return DT_OK;
}

/* Bitwise mode with parallel.cp_chunks: the canonical row blocks of R rows; else all R. */
static int row_block(const gpt_model *m, int R) {
    int r = m->cp_comm.row_block;
    return r > 0 && r < R ? r : R;
}

/* The head's GEMMs of one row chunk in the canonical chunks: logits per vocabulary block,
 * dlnf's leaves summed by the tree, dwte per block of rows. */
static dt_status head_canon(gpt_model *m, const float *x, const float *wte, float *dwte, int R, int r0,
                            const dt_token *targets, float grad_scale) {
    const dt_ops *o = m->ops;
    gpt_acts *a = m->acts;
    int C = m->shape.n_embd, Vl = m->shape.padded_vocab / m->tp, L = m->canon / m->tp, vb = Vl / L;
    const float *in[64], *w[64];
    float *lg[64], *out[64]; /* lg: the logits' blocks, then their gradients */
    int RB = row_block(m, R); /* the logits' and dlnf's GEMMs per canonical row block (cp_chunks.c) */
    for (int r = 0; r < R; r += RB) {
        for (int l = 0; l < L; l++)
            in[l] = x + (size_t)r * C, w[l] = S(m, wte, (size_t)l * vb * C), lg[l] = S(m, a->logits, (size_t)r * Vl + l * vb);
        dt_gemm_blocks(o, 0, 1, RB, vb, C, 1.0f, in, C, w, C, 0.0f, lg, Vl, L, m->canon);
    }
    DT_TRY(xent_canon(m, R, r0, targets, grad_scale));
    if (grad_scale == 0.0f) return DT_OK;
    float *leaf[64], *lr[64];
    leaf[0] = S(m, a->dsmall, (size_t)r0 * C);
    for (int l = 1; l < L; l++) leaf[l] = S(m, a->leaves, (size_t)(l - 1) * R * C);
    for (int r = 0; r < R; r += RB) {
        for (int l = 0; l < L; l++) lg[l] = S(m, a->logits, (size_t)r * Vl + l * vb), lr[l] = S(m, leaf[l], (size_t)r * C);
        dt_gemm_blocks(o, 0, 0, RB, C, vb, 1.0f, (const float *const *)lg, Vl, w, C, 0.0f, lr, C, L, m->canon);
    }
    if (dwte) {
        for (int l = 0; l < L; l++) in[l] = x, lg[l] = S(m, a->logits, (size_t)l * vb), out[l] = S(m, dwte, (size_t)l * vb * C);
        dt_gemm_blocks(o, 1, 0, vb, C, R, 1.0f, (const float *const *)lg, Vl, in, C, 1.0f, out, C, L, m->canon);
    }
    gpt_canon_tree(m, leaf, L, (size_t)R * C);
    return DT_OK;
}

/* Context parallelism's canonical chunks (cp_chunks.c, more than one rank): the head's wte
 * gradient is computed per vocabulary block by the block's cp rank over every rank's rows,
 * in the one process's row chunks: the logits of its blocks recomputed from the gathered
 * final-norm rows, their gradients from the gathered row statistics (mx, then sum and
 * target logit: cp scratch) by the same elementwise finish. */
static int cp_head(const gpt_model *m) { return m->canon && m->cp_comm.gather && m->cp_comm.size > 1; }

static dt_status head_cp_dwte(gpt_model *m, const float *lnf, const float *wte, float *dwte, int N,
                              const dt_token *targets, float grad_scale) {
    const dt_ops *o = m->ops;
    gpt_acts *a = m->acts;
    int C = m->shape.n_embd, Vl = m->shape.padded_vocab / m->tp, L = m->canon / m->tp, vb = Vl / L;
    int n = m->cp_comm.size, per = L / n, first = m->cp_comm.rank * per, NT = N * n, W = per * vb;
    int R = (int)gpt_head_rows((size_t)m->shape.padded_vocab, (size_t)NT, m->cp_comm.row_block), RB = row_block(m, R);
    if ((size_t)R * W > (size_t)a->head_rows * m->shape.padded_vocab)
        return dt_fail(DT_ERUNTIME, "context parallelism: the head's chunk of %d rows does not fit its logits", R);
    int c0 = m->tp_rank * Vl + first * vb, V = m->shape.vocab_size, real = V - c0 < 0 ? 0 : V - c0 > W ? W : V - c0;
    float *mx = m->cp_comm.scratch, *st = mx + N, *junk = st + 2 * (size_t)N;
    const void *x, *amx, *ast, *atg;
    DT_TRY(m->cp_comm.gather(m->cp_comm.ctx, lnf, N, (size_t)C * sizeof(float), 0, &x));
    DT_TRY(m->cp_comm.gather(m->cp_comm.ctx, mx, N, sizeof(float), 2, &amx));
    DT_TRY(m->cp_comm.gather(m->cp_comm.ctx, st, N, 2 * sizeof(float), 3, &ast));
    DT_TRY(m->cp_comm.gather(m->cp_comm.ctx, targets, N, sizeof(dt_token), 4, &atg));
    const float *in[64], *w[64];
    float *lg[64], *out[64];
    for (int r0 = 0; r0 < NT; r0 += R) { /* the one process's chunks, its row blocks within them */
        int Rc = NT - r0 < R ? NT - r0 : R;
        for (int r = 0; r < Rc; r += RB) {
            for (int i = 0; i < per; i++) {
                in[i] = (const float *)x + (size_t)(r0 + r) * C, w[i] = S(m, wte, (size_t)(first + i) * vb * C);
                lg[i] = S(m, a->logits, (size_t)r * W + i * vb);
            }
            dt_gemm_blocks(o, 0, 1, RB, vb, C, 1.0f, in, C, w, C, 0.0f, lg, W, per, m->canon);
        }
        o->xent_finish(a->logits, junk, (const float *)amx + r0, (const float *)ast + 2 * (size_t)r0,
                       (const dt_token *)atg + r0, Rc, W, real, c0, grad_scale);
        for (int i = 0; i < per; i++) {
            in[i] = (const float *)x + (size_t)r0 * C;
            lg[i] = S(m, a->logits, (size_t)i * vb), out[i] = S(m, dwte, (size_t)(first + i) * vb * C);
        }
        dt_gemm_blocks(o, 1, 0, vb, C, Rc, 1.0f, (const float *const *)lg, W, in, C, 1.0f, out, C, per, m->canon);
    }
    return DT_OK;
}

/* LM head over row chunks of all N rows of slot b: logits = lnf·wteᵀ, softmax
 * cross-entropy, and when grad_scale != 0 its backward (dwte +=) while the chunk is hot;
 * *dlnf receives this rank's rows of the gradient of lnf. */
static dt_status head(gpt_model *m, gpt_slot *b, const dt_token *targets, float grad_scale, double *loss,
                      float **dlnf) {
    const dt_ops *o = m->ops;
    gpt_acts *a = m->acts;
    int N = b->B * b->T, C = m->shape.n_embd, V = m->shape.vocab_size, Vl = m->shape.padded_vocab / m->tp;
    const float *wte = tp(m, m->t_head); /* this rank's vocabulary rows */
    int vocab_parallel = m->tp_comm.allreduce != NULL;
    /* a frozen head: no weight gradient (its GEMM skipped) */
    float *lnf, *dwte = m->tensors[m->t_head].frozen ? NULL : m->head_grad && m->shape.tie ? m->head_grad : tg(m, m->t_head);
    DT_TRY(gpt_seq_gather(m, b->lnf, N, &lnf));
    o->upload(a->tgt, targets, (size_t)N * sizeof(dt_token));
    targets = a->tgt;
    for (int r0 = 0; r0 < N; r0 += a->head_rows) {
        int R = N - r0 < a->head_rows ? N - r0 : a->head_rows;
        const float *x = S(m, lnf, (size_t)r0 * C);
        if (m->canon) {
            DT_TRY(head_canon(m, x, wte, cp_head(m) ? NULL : dwte, R, r0, targets, grad_scale));
            if (cp_head(m)) { /* the chunk's row statistics, for head_cp_dwte */
                memcpy(m->cp_comm.scratch + r0, a->xstat, (size_t)R * sizeof(float));
                memcpy(m->cp_comm.scratch + N + 2 * (size_t)r0, a->xstat + a->head_rows, 2 * (size_t)R * sizeof(float));
            }
            continue;
        }
        o->gemm(0, 1, R, Vl, C, 1.0f, x, C, wte, C, 0.0f, a->logits, Vl);
        if (vocab_parallel) DT_TRY(xent_tp(m, R, r0, targets, grad_scale));
        else o->softmax_xent(a->logits, a->losses + r0, targets + r0, R, V, Vl, grad_scale);
        if (grad_scale != 0.0f) { /* dlnf: a partial sum over the vocabulary pieces (completed below) */
            o->gemm(0, 0, R, C, Vl, 1.0f, a->logits, Vl, wte, C, 0.0f, S(m, a->dsmall, (size_t)r0 * C), C);
            if (dwte) o->gemm(1, 0, Vl, C, R, 1.0f, a->logits, Vl, x, C, 1.0f, dwte, C);
        }
    }
    if (grad_scale != 0.0f && dwte && cp_head(m)) DT_TRY(head_cp_dwte(m, lnf, wte, dwte, N, targets, grad_scale));
    if (grad_scale != 0.0f && !dwte) m->dw_skipped++;
    if (grad_scale != 0.0f) DT_TRY(gpt_tp_complete(m, a->dsmall, a->rows, N, dlnf));
    *loss = o->sum(a->losses, (size_t)N);
    return DT_OK;
}

dt_status gpt_loss(gpt_model *m, int slot, const dt_token *targets, float grad_scale, double *loss_out) {
    DT_TRY(gpt_check_slot(m, slot));
    const dt_ops *o = m->ops;
    gpt_slot *b = slot_at(m, slot);
    if (!heads(m, b->chunk)) return dt_fail(DT_EINPUT, "model: the loss is computed on the last stage only");
    int C = m->shape.n_embd, Nl = local_rows(m, b->B * b->T), lnf_unit = gpt_lnf_unit(m), tied = m->shape.tie;
    /* an untied head's weight is in the last unit, which the forward left open */
    if (grad_scale == 0.0f) {
        DT_TRY(head(m, b, targets, 0.0f, loss_out, NULL));
        if (!tied) HOOK(after_forward, lnf_unit);
        return DT_OK;
    }
    if (tied) HOOK(before_backward, 0);
    if (tied && m->head_grad) HOOK(before_backward, GPT_HEAD_PART);
    if (!tied) {
        HOOK(after_forward, lnf_unit);
        HOOK(before_backward, lnf_unit);
    }
    double loss;
    float *dlnf;
    DT_TRY(head(m, b, targets, grad_scale, &loss, &dlnf));
    if (tied && m->head_grad) HOOK(after_backward, GPT_HEAD_PART);
    int lnw = m->t_norm_w, lnb = m->t_norm_b;
    o->zero(b->dres, (size_t)Nl * C * m->esz);
    if (tied) HOOK(before_backward, lnf_unit);
    ln_grads g = gpt_norm_grads(m, lnw, lnb); /* NULL: frozen */
    ln_grads lnf = gpt_ln_grad_target(m, g.w, g.b, 0);
    if (m->sp) o->zero(m->acts->lngrad, 2 * (size_t)C * m->esz);
    DT_TRY(gpt_norm_bwd(m, b->dres, lnf.w, lnf.b, dlnf, slot_out(m, b), tp(m, lnw), b->lnf_mean, b->lnf_rstd, Nl));
    DT_TRY(gpt_ln_grad_finish(m, &g, 1));
    if (g.w) gpt_zero_frozen(m, lnw, NULL), gpt_zero_frozen(m, lnb, NULL);
    HOOK(after_backward, lnf_unit);
    if (!m->has_embed && tied) HOOK(after_backward, 0); /* a last stage's wte: the head alone adds to it */
    *loss_out = loss;
    return DT_OK;
}

dt_status gpt_last_logits(gpt_model *m, int slot, float *logits) {
    if (m->sp) return dt_fail(DT_EINPUT, "sampling with sequence parallelism is not implemented");
    DT_TRY(gpt_check_slot(m, slot));
    gpt_slot *a = slot_at(m, slot);
    if (!heads(m, a->chunk)) return dt_fail(DT_EINPUT, "model: the logits are computed on the last stage only");
    int T = a->T, C = m->shape.n_embd, Vp = m->shape.padded_vocab, Vl = Vp / m->tp;
    float *row = m->acts->logits; /* vocabulary-parallel: each rank its columns, the rest zero, summed over tp */
    if (m->tp > 1) m->ops->zero(row, (size_t)Vp * m->esz);
    m->ops->gemm(0, 1, 1, Vl, C, 1.0f, S(m, a->lnf, (size_t)(a->B * T - 1) * C), C, tp(m, m->t_head), C, 0.0f,
                 S(m, row, (size_t)m->tp_rank * Vl), Vl);
    DT_TRY(gpt_tp_sum(m, row, (size_t)Vp));
    HOOK(after_forward, m->shape.tie ? 0 : gpt_lnf_unit(m));
    size_t V = (size_t)m->shape.vocab_size;
    if (!m->ops->bf16) {
        m->ops->download(logits, m->acts->logits, V * sizeof(float));
    } else { /* bf16 logits, widened on the host (sampling, not training: a small allocation is fine) */
        uint16_t *h = malloc(V * sizeof(uint16_t));
        if (!h) return dt_fail(DT_ERUNTIME, "out of memory (logits)");
        m->ops->download(h, m->acts->logits, V * sizeof(uint16_t));
        for (size_t i = 0; i < V; i++) logits[i] = dt_bf16_to_f32(h[i]);
        free(h);
    }
    return DT_OK;
}

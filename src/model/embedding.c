/* The embeddings (first stage): token rows of wte plus (GPT-2) positions of wpe, vocabulary-
 * parallel (each rank embeds the tokens in its rows, piece 0 adds the positions, the sum
 * completed over the tensor-parallel group); with context parallelism this rank's
 * positions come in runs (context_parallel.h). */
#include "gpt_internal.h"

/* Rows whose positions come in runs: context parallelism (this rank's positions of the
 * sequence) or documents (positions restart at each document). Else one call for all. */
static int in_runs(const gpt_model *m, const gpt_slot *a) {
    return m->t_wpe >= 0 && (m->cp_comm.positions || a->docs); /* Llama: no position table (rotary positions) */
}

/* Token t's place in the row (context parallelism: in the whole sequence). */
static int place(const gpt_model *m, int t) { return m->cp_comm.positions ? m->cp_comm.positions[t] : t; }

/* A row's run from t0 over T columns: consecutive places (places NULL: t) in one document
 * (seg: the row's document starts; NULL: none); its end. */
static int run_end_of(const int *places, const int *seg, int T, int t0) {
    int t1 = t0 + 1;
    while (t1 < T && (!places || places[t1] == places[t1 - 1] + 1) && (!seg || seg[t1] == seg[t0])) t1++;
    return t1;
}
static int run_end(const gpt_model *m, const gpt_slot *a, int b, int t0) {
    return run_end_of(m->cp_comm.positions, a->docs ? a->seg_host + (size_t)b * a->T : NULL, a->T, t0);
}

/* The position (wpe row) of row b's token t0: its place, from its document's start. */
static size_t run_position(const gpt_model *m, const gpt_slot *a, int b, int t0) {
    return (size_t)(a->pos0 + place(m, t0) - (a->docs ? a->seg_host[(size_t)b * a->T + t0] : 0));
}

dt_status gpt_embed_forward(gpt_model *m, gpt_slot *a, const dt_token *tokens, int B, int T, int pos0) {
    const dt_ops *o = m->ops;
    int C = m->shape.n_embd, N = B * T;
    HOOK(before_forward, 0);
    o->upload(a->tok, tokens, (size_t)N * sizeof(dt_token));
    int Vl = m->shape.padded_vocab / m->tp;
    float *emb = m->sp ? m->acts->proj : a->encoded, *done;
    const float *wpe = m->tp_rank == 0 && m->t_wpe >= 0 ? tp(m, m->t_wpe) : NULL;
    if (!in_runs(m, a)) {
        o->embed_fwd(emb, a->tok, tp(m, 0), wpe ? S(m, wpe, (size_t)pos0 * C) : NULL, B, T, C, m->tp_rank * Vl, Vl);
    } else { /* each run of consecutive positions of each row */
        for (int b = 0; b < B; b++)
            for (int t0 = 0, t1; t0 < T; t0 = t1) {
                t1 = run_end(m, a, b, t0);
                size_t r = (size_t)b * T + t0;
                o->embed_fwd(S(m, emb, r * C), a->tok + r, tp(m, 0), wpe ? S(m, wpe, run_position(m, a, b, t0) * C) : NULL,
                             1, t1 - t0, C, m->tp_rank * Vl, Vl);
            }
    }
    return gpt_tp_complete(m, emb, a->encoded, N, &done);
}

/* The embeddings' gradients (first stage) from the residual stream's gradient; none when
 * both are frozen (a frozen wte under a trainable wpe: computed by the one kernel, undone). */
dt_status gpt_embed_backward(gpt_model *m, gpt_slot *s) {
    int C = m->shape.n_embd, N = s->B * s->T;
    if (!m->has_head || !m->shape.tie) HOOK(before_backward, 0); /* else the head asked for it */
    if (m->tensors[0].frozen && (m->t_wpe < 0 || m->tensors[m->t_wpe].frozen)) {
        HOOK(after_backward, 0);
        return DT_OK;
    }
    int Vl = m->shape.padded_vocab / m->tp;     /* dwpe on every rank: dres is replicated (or gathered) */
    float *dall;
    DT_TRY(gpt_seq_gather(m, s->dres, N, &dall));
    float *wpe_g = m->t_wpe >= 0 ? tgt(m, m->t_wpe) : NULL;
    if (m->cp_comm.gather && m->cp_comm.size > 1) { /* cp_chunks.c: cp rank 0's, over the whole sequence */
        const void *d, *tok, *sg = NULL;
        int T = s->T * m->cp_comm.size;
        DT_TRY(m->cp_comm.gather(m->cp_comm.ctx, dall, N, (size_t)C * sizeof(float), 0, &d));
        DT_TRY(m->cp_comm.gather(m->cp_comm.ctx, s->tok, N, sizeof(dt_token), 4, &tok));
        if (s->docs) DT_TRY(m->cp_comm.gather(m->cp_comm.ctx, s->seg_host, N, sizeof(int), 2, &sg));
        if (m->cp_comm.rank == 0 && (!sg || !wpe_g)) {
            m->ops->embed_bwd(tg(m, 0), wpe_g ? S(m, wpe_g, (size_t)s->pos0 * C) : NULL, d, tok, s->B, T, C,
                              m->tp_rank * Vl, Vl);
        } else if (m->cp_comm.rank == 0) { /* documents: the one process's runs, positions from each start */
            for (int b = 0; b < s->B; b++)
                for (int t0 = 0, t1; t0 < T; t0 = t1) {
                    const int *seg = (const int *)sg + (size_t)b * T;
                    t1 = run_end_of(NULL, seg, T, t0);
                    size_t r = (size_t)b * T + t0;
                    m->ops->embed_bwd(tg(m, 0), S(m, wpe_g, (size_t)(s->pos0 + t0 - seg[t0]) * C),
                                      (const float *)d + r * C, (const dt_token *)tok + r, 1, t1 - t0, C,
                                      m->tp_rank * Vl, Vl);
                }
        }
    } else if (!in_runs(m, s)) {
        float *dwpe = wpe_g ? S(m, wpe_g, (size_t)s->pos0 * C) : NULL;
        m->ops->embed_bwd(tg(m, 0), dwpe, dall, s->tok, s->B, s->T, C, m->tp_rank * Vl, Vl);
    } else {
        for (int b = 0; b < s->B; b++) /* as in the forward, run by run */
            for (int t0 = 0, t1; t0 < s->T; t0 = t1) {
                t1 = run_end(m, s, b, t0);
                size_t r = (size_t)b * s->T + t0;
                m->ops->embed_bwd(tg(m, 0), wpe_g ? S(m, wpe_g, run_position(m, s, b, t0) * C) : NULL,
                                  S(m, dall, r * C), s->tok + r, 1, t1 - t0, C, m->tp_rank * Vl, Vl);
            }
    }
    gpt_zero_frozen(m, 0, NULL);
    HOOK(after_backward, 0);
    return DT_OK;
}

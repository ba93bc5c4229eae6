#include "whole_model.h"

#include <stdlib.h>
#include <string.h>

#include "../backend/ops.h"

static int has(const dt_comm *c) { return c && dt_comm_size((dt_comm *)c) > 1; }

int dt_whole_split(const dt_whole_groups *g) { return has(g->tp) || has(g->pp); }

int dt_whole_is_stage_root(const dt_whole_groups *g) { return !has(g->tp) || dt_comm_rank(g->tp) == 0; }

int dt_whole_is_root(const dt_whole_groups *g) {
    return dt_whole_is_stage_root(g) && (!has(g->pp) || dt_comm_rank(g->pp) == 0);
}

dt_status dt_whole_agree(const dt_whole_groups *g, dt_status s) {
    if (has(g->tp)) s = dt_comm_agree(g->tp, s, NULL);
    if (has(g->pp)) s = dt_comm_agree(g->pp, s, NULL);
    return s;
}

void dt_whole_free(dt_whole_model *w) {
    gpt_destroy(&w->full);
    for (int k = 0; k < 2; k++) {
        free(w->mom[k]);
        free(w->view[k]);
    }
    memset(w, 0, sizeof *w);
}

dt_status dt_whole_of(const gpt_model *m, const gpt_layout *lay, int alloc, dt_whole_model *w, int moments) {
    DT_TRY(gpt_create_layout(&w->full, &m->shape, dt_ops_cpu(), 1, 1, alloc, lay));
    for (int k = 0; k < (moments ? 2 : 0); k++) {
        w->mom[k] = calloc(w->full.nparams, sizeof(float));
        if (!w->mom[k]) return dt_fail(DT_ERUNTIME, "out of memory (whole optimizer state for the checkpoint)");
        DT_TRY(gpt_unit_views(&w->full, w->mom[k], &w->view[k]));
    }
    return DT_OK;
}

void dt_whole_pack_layout(const gpt_model *m, double *h) {
    gpt_layout lay;
    gpt_stage_layout(m, &lay);
    h[0] = lay.chunks;
    h[1] = lay.first_layer;
    h[2] = lay.n_layers;
    for (int c = 0; c < GPT_MAX_CHUNKS; c++) {
        h[3 + c] = lay.chunk_first[c];
        h[3 + GPT_MAX_CHUNKS + c] = lay.chunk_layers[c];
    }
}

gpt_layout dt_whole_unpack_layout(const double *h) {
    gpt_layout lay = {.tp = 1, .chunks = (int)h[0], .first_layer = (int)h[1], .n_layers = (int)h[2]};
    for (int c = 0; c < GPT_MAX_CHUNKS; c++) {
        lay.chunk_first[c] = (int)h[3 + c];
        lay.chunk_layers[c] = (int)h[3 + GPT_MAX_CHUNKS + c];
    }
    return lay;
}

/* Tensor t's pieces (local: this rank's, t->numel floats) assembled into the unsharded
 * tensor at the group's index 0: full receives [rows, cols] in the global layout (padding
 * rows untouched); scratch holds tp·numel floats there. Collective over tp. A piece held
 * by several ranks (replicas: tp rank q holds piece q / replicas) is taken from its first. */
static dt_status gather_pieces(dt_comm *tp, const gpt_tensor *t, const float *local, float *full, float *scratch) {
    int root = dt_comm_rank(tp) == 0;
    if (t->shard.pieces <= 1) { /* replicated: every rank has it whole */
        if (root) memcpy(full, local, t->numel * sizeof(float));
        return DT_OK;
    }
    DT_TRY(dt_gather(tp, local, scratch, t->numel, DT_F32, 0));
    if (!root) return DT_OK;
    int64_t cap = dt_shard_max_runs(&t->shard);
    dt_shard_run *runs = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *runs);
    if (!runs) return dt_fail(DT_ERUNTIME, "out of memory (shard runs)");
    for (int p = 0; p < t->shard.pieces; p++) {
        dt_shard s = t->shard;
        s.index = p;
        size_t q = (size_t)p * (size_t)t->shard.replicas; /* the tp rank of its first replica */
        int64_t n = dt_shard_runs(&s, runs, cap);
        for (int64_t k = 0; k < n; k++)
            memcpy(full + runs[k].global, scratch + q * t->numel + runs[k].local, (size_t)runs[k].len * sizeof(float));
    }
    free(runs);
    return DT_OK;
}

/* A later stage's copy of a tied tensor (wte on the last stage) is not sent: the first
 * stage's is the same. */
static int tied_copy(const gpt_model *m, const gpt_tensor *t) { return t->unit == 0 && !m->has_embed; }

/* The stage roots' whole tensors to the pipeline's first rank: each later stage sends
 * its blocks, then its tensors in table order (parameters, then the moments). */
static dt_status stages_to_root(const dt_whole_groups *g, const gpt_model *m, dt_whole_model *w, int moments) {
    int p = dt_comm_size(g->pp), me = dt_comm_rank(g->pp), nsets = moments ? 3 : 1;
    if (me > 0) {
        double hdr[DT_WHOLE_LAYOUT];
        dt_whole_pack_layout(m, hdr);
        DT_TRY(dt_send(g->pp, hdr, DT_WHOLE_LAYOUT, DT_F64, 0, 0));
        for (int k = 0; k < nsets; k++)
            for (int i = 0; i < w->full.ntensors; i++) {
                const gpt_tensor *t = &w->full.tensors[i];
                if (tied_copy(&w->full, t)) continue;
                DT_TRY(dt_send(g->pp, (k == 0 ? w->full.params : w->mom[k - 1]) + t->offset, t->numel, DT_F32, 0, 1));
            }
        return DT_OK;
    }
    for (int q = 1; q < p; q++) {
        double hdr[DT_WHOLE_LAYOUT];
        DT_TRY(dt_recv(g->pp, hdr, DT_WHOLE_LAYOUT, DT_F64, q, 0));
        dt_whole_model st;
        memset(&st, 0, sizeof st);
        gpt_layout lay = dt_whole_unpack_layout(hdr);
        dt_status s = dt_whole_of(m, &lay, 0, &st, 0); /* its table: names and sizes, in its order */
        for (int k = 0; s == DT_OK && k < nsets; k++)
            for (int i = 0; s == DT_OK && i < st.full.ntensors; i++) {
                const gpt_tensor *t = &st.full.tensors[i], *wt = gpt_find(&w->full, t->name);
                if (tied_copy(&st.full, t)) continue;
                if (!wt || wt->numel != t->numel)
                    s = dt_fail(DT_ERUNTIME, "checkpoint gather: stage %d's tensor %s does not fit", q, t->name);
                else
                    s = dt_recv(g->pp, (k == 0 ? w->full.params : w->mom[k - 1]) + wt->offset, t->numel, DT_F32, q, 1);
            }
        dt_whole_free(&st);
        DT_TRY(s);
    }
    return DT_OK;
}

/* per_stage: each stage root keeps its stage; else the whole model goes to the root. */
static dt_status gather(const dt_whole_groups *g, const gpt_model *m, float *const *mv, float *const *vv,
                        dt_whole_model *w, int per_stage) {
    int moments = mv != NULL, tp = has(g->tp) ? dt_comm_size(g->tp) : 1;
    int stage_root = dt_whole_is_stage_root(g), root = dt_whole_is_root(g) && !per_stage;
    memset(w, 0, sizeof *w);
    size_t maxn = 0;
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].numel > maxn) maxn = m->tensors[i].numel;
    float *scratch = NULL;
    dt_status s = DT_OK;
    if (stage_root) { /* the whole model at the root, the whole stage at a later stage's first tp rank */
        gpt_layout mine;
        gpt_stage_layout(m, &mine);
        s = dt_whole_of(m, root ? NULL : &mine, 1, w, moments);
        scratch = s == DT_OK ? malloc((size_t)tp * maxn * sizeof(float)) : NULL;
        if (s == DT_OK && !scratch) s = dt_fail(DT_ERUNTIME, "out of memory (gathering tensor pieces)");
    }
    if (has(g->tp)) s = dt_comm_agree(g->tp, s, NULL);
    float *const *src[3] = {m->unit_params, mv, vv};
    for (int k = 0; s == DT_OK && k < (moments ? 3 : 1); k++)
        for (int i = 0; s == DT_OK && i < m->ntensors; i++) {
            const gpt_tensor *t = &m->tensors[i];
            const gpt_tensor *wt = stage_root ? gpt_find(&w->full, t->name) : NULL; /* by name: any cut */
            float *dst = wt ? (k == 0 ? w->full.params : w->mom[k - 1]) + wt->offset : NULL;
            const float *piece = src[k][t->unit] + (t->offset - m->units[t->unit].offset);
            if (has(g->tp)) s = gather_pieces(g->tp, t, piece, dst, scratch);
            else if (dst) memcpy(dst, piece, t->numel * sizeof(float));
        }
    free(scratch);
    if (has(g->pp) && stage_root && !per_stage) {
        s = dt_comm_agree(g->pp, s, NULL);
        if (s == DT_OK) s = stages_to_root(g, m, w, moments);
        if (!root) dt_whole_free(w); /* only the root keeps a whole model */
    }
    return s;
}

dt_status dt_whole_gather(const dt_whole_groups *g, const gpt_model *m, float *const *mv, float *const *vv,
                          dt_whole_model *w) {
    return gather(g, m, mv, vv, w, 0);
}

dt_status dt_whole_gather_stage(const dt_whole_groups *g, const gpt_model *m, float *const *mv, float *const *vv,
                                dt_whole_model *w) {
    return gather(g, m, mv, vv, w, 1);
}

#include "state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../ckpt/ckpt_dir.h"
#include "../model_parallel/tensor_parallel.h"

static int has(const dt_comm *c) { return c && dt_comm_size((dt_comm *)c) > 1; }

int dt_state_model_parallel(const dt_model_groups *g) { return has(g->tp) || has(g->pp); }

int dt_state_norm_class(const gpt_model *m, const gpt_tensor *t) {
    if (t->unit == 0 && !m->has_embed) return -1; /* the last stage's copy of wte */
    return t->shard.pieces > 1 ? DT_NORM_SPLIT : DT_NORM_REPLICATED;
}

dt_status dt_state_norm(const dt_model_groups *g, const double part[DT_NORM_NCLASSES], double *norm) {
    double split = part[DT_NORM_SPLIT];
    if (has(g->tp)) DT_TRY(dt_allreduce(g->tp, &split, 1, DT_F64, DT_SUM));
    double total = split + part[DT_NORM_REPLICATED];
    if (has(g->pp)) DT_TRY(dt_allreduce(g->pp, &total, 1, DT_F64, DT_SUM));
    *norm = sqrt(total);
    return DT_OK;
}

size_t dt_state_tie_bytes(const dt_model_groups *g, const gpt_model *m) {
    return has(g->pp) && g->emb && m->ops->on_device ? m->tensors[0].numel * dt_elem_bytes(m->ops) : 0;
}

/* bf16 gradients are summed as bf16 (DT_BF16 adds in fp32 and rounds): over the two end
 * stages that is one rounding of the fp32 sum, the fp32 reduction's result. */
dt_status dt_state_tie_grads(const dt_model_groups *g, const gpt_model *m, float *grads, float *host) {
    if (!has(g->pp) || !g->emb) return DT_OK;
    const gpt_tensor *wte = &m->tensors[0]; /* unit 0 on both ends starts with wte */
    size_t esz = dt_elem_bytes(m->ops), bytes = wte->numel * esz;
    dt_dtype t = m->ops->bf16 ? DT_BF16 : DT_F32;
    void *x = (char *)grads + wte->offset * esz;
    if (!m->ops->on_device) return dt_allreduce(g->emb, x, wte->numel, t, DT_SUM);
    if (!host) return dt_fail(DT_ERUNTIME, "tied embedding: no host staging for a device model");
    m->ops->download(host, x, bytes);
    DT_TRY(dt_allreduce(g->emb, host, wte->numel, t, DT_SUM));
    m->ops->upload(x, host, bytes);
    return m->ops->sync();
}

int dt_state_is_root(const dt_model_groups *g) {
    return (!has(g->tp) || dt_comm_rank(g->tp) == 0) && (!has(g->pp) || dt_comm_rank(g->pp) == 0);
}

void dt_whole_free(dt_whole_model *w) {
    gpt_destroy(&w->full);
    for (int k = 0; k < 2; k++) {
        free(w->mom[k]);
        free(w->view[k]);
    }
    memset(w, 0, sizeof *w);
}

/* A whole (tp = 1) model of a stage's blocks (lay; NULL: all), fp32 host memory: with
 * state (and moments) to be filled, or the tensor table alone. */
static dt_status whole_of(const gpt_model *m, const gpt_layout *lay, int alloc, dt_whole_model *w, int moments) {
    DT_TRY(gpt_create_layout(&w->full, &m->shape, dt_ops_cpu(), 1, 1, alloc, lay));
    for (int k = 0; k < (moments ? 2 : 0); k++) {
        w->mom[k] = calloc(w->full.nparams, sizeof(float));
        if (!w->mom[k]) return dt_fail(DT_ERUNTIME, "out of memory (whole optimizer state for the checkpoint)");
        DT_TRY(gpt_unit_views(&w->full, w->mom[k], &w->view[k]));
    }
    return DT_OK;
}

/* A later stage's copy of a tied tensor (wte on the last stage) is not sent: the first
 * stage's is the same. */
static int tied_copy(const gpt_model *m, const gpt_tensor *t) { return t->unit == 0 && !m->has_embed; }

/* A stage's blocks as a message: chunks, first_layer, n_layers, the chunks' firsts and counts. */
enum { HDR = 3 + 2 * GPT_MAX_CHUNKS };
static void pack_layout(const gpt_model *m, double *h) {
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
static gpt_layout unpack_layout(const double *h) {
    gpt_layout lay = {.tp = 1, .chunks = (int)h[0], .first_layer = (int)h[1], .n_layers = (int)h[2]};
    for (int c = 0; c < GPT_MAX_CHUNKS; c++) {
        lay.chunk_first[c] = (int)h[3 + c];
        lay.chunk_layers[c] = (int)h[3 + GPT_MAX_CHUNKS + c];
    }
    return lay;
}

/* The stage roots' whole tensors to the pipeline's first rank: each later stage sends
 * its blocks, then its tensors in table order (parameters, then the moments). */
static dt_status stages_to_root(const dt_model_groups *g, const gpt_model *m, dt_whole_model *w, int moments) {
    int p = dt_comm_size(g->pp), me = dt_comm_rank(g->pp), nsets = moments ? 3 : 1;
    if (me > 0) {
        double hdr[HDR];
        pack_layout(m, hdr);
        DT_TRY(dt_send(g->pp, hdr, HDR, DT_F64, 0, 0));
        for (int k = 0; k < nsets; k++)
            for (int i = 0; i < w->full.ntensors; i++) {
                const gpt_tensor *t = &w->full.tensors[i];
                if (tied_copy(&w->full, t)) continue;
                DT_TRY(dt_send(g->pp, (k == 0 ? w->full.params : w->mom[k - 1]) + t->offset, t->numel, DT_F32, 0, 1));
            }
        return DT_OK;
    }
    for (int q = 1; q < p; q++) {
        double hdr[HDR];
        DT_TRY(dt_recv(g->pp, hdr, HDR, DT_F64, q, 0));
        dt_whole_model st;
        memset(&st, 0, sizeof st);
        gpt_layout lay = unpack_layout(hdr);
        dt_status s = whole_of(m, &lay, 0, &st, 0); /* its table: names and sizes, in its order */
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
static dt_status gather(const dt_model_groups *g, const gpt_model *m, float *const *mv, float *const *vv,
                        dt_whole_model *w, int per_stage) {
    int moments = mv != NULL, tp = has(g->tp) ? dt_comm_size(g->tp) : 1;
    int stage_root = !has(g->tp) || dt_comm_rank(g->tp) == 0, root = dt_state_is_root(g) && !per_stage;
    memset(w, 0, sizeof *w);
    size_t maxn = 0;
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].numel > maxn) maxn = m->tensors[i].numel;
    float *scratch = NULL;
    dt_status s = DT_OK;
    if (stage_root) { /* the whole model at the root, the whole stage at a later stage's first tp rank */
        gpt_layout mine;
        gpt_stage_layout(m, &mine);
        s = whole_of(m, root ? NULL : &mine, 1, w, moments);
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
            if (has(g->tp)) s = dt_tp_gather_tensor(g->tp, t, piece, dst, scratch);
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

dt_status dt_state_gather_whole(const dt_model_groups *g, const gpt_model *m, float *const *mv, float *const *vv,
                                dt_whole_model *w) {
    return gather(g, m, mv, vv, w, 0);
}

dt_status dt_state_gather_stage(const dt_model_groups *g, const gpt_model *m, float *const *mv, float *const *vv,
                                dt_whole_model *w) {
    return gather(g, m, mv, vv, w, 1);
}

int dt_state_is_stage_root(const dt_model_groups *g) { return !has(g->tp) || dt_comm_rank(g->tp) == 0; }

/* The first stage's root writes the indexes: every stage's tensor table, rebuilt from the
 * layouts the stages sent (info rows: files, pid, moments, layout). */
enum { INFO = 3 + HDR };
static dt_status write_indexes(const dt_whole_model *w, const double *info, int pp, const int *first, int total,
                               const char *tmp, double shard_mb) {
    dt_whole_model *tabs = calloc((size_t)pp, sizeof *tabs);
    const gpt_model **stages = calloc((size_t)pp, sizeof *stages);
    dt_status s = tabs && stages ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (checkpoint index)");
    for (int q = 0; s == DT_OK && q < pp; q++) {
        if (q == 0) {
            stages[q] = &w->full;
            continue;
        }
        gpt_layout lay = unpack_layout(info + (size_t)q * INFO + 3);
        s = whole_of(&w->full, &lay, 0, &tabs[q], 0); /* its table: names and sizes, in its order */
        stages[q] = &tabs[q].full;
    }
    if (s == DT_OK) s = dt_ckpt_write_index(tmp, stages, first, pp, total, shard_mb, w->mom[0] != NULL);
    for (int q = 0; tabs && q < pp; q++) dt_whole_free(&tabs[q]);
    free(tabs);
    free(stages);
    return s;
}

dt_status dt_state_save_stages(const dt_model_groups *g, const dt_whole_model *w, dt_status s, const char *dir,
                               const dt_train_state *st, const char *config_json, double shard_mb) {
    int pp = has(g->pp) ? dt_comm_size(g->pp) : 1, me = has(g->pp) ? dt_comm_rank(g->pp) : 0, made = 0;
    char tmp[1024] = "";
    if (me == 0 && s == DT_OK) { /* the step's temporary directory, named by the root's pid */
        s = dt_ckpt_begin(dir, st->step, (int)getpid(), tmp, sizeof tmp);
        made = s == DT_OK;
    }
    double *info = s == DT_OK ? calloc((size_t)pp * INFO, sizeof(double)) : NULL;
    int *first = s == DT_OK ? calloc((size_t)pp + 1, sizeof(int)) : NULL;
    if (s == DT_OK && (!info || !first)) s = dt_fail(DT_ERUNTIME, "out of memory (checkpoint)");
    if (pp > 1) s = dt_comm_agree(g->pp, s, NULL);
    int total = 0;
    if (s == DT_OK) { /* every stage's file count, the root's pid, whether moments are saved, its blocks */
        double *mine = info + (size_t)me * INFO;
        mine[0] = dt_ckpt_count_files(&w->full, shard_mb);
        mine[1] = (double)getpid();
        mine[2] = w->mom[0] != NULL;
        pack_layout(&w->full, mine + 3);
        if (pp > 1) s = dt_allgather(g->pp, mine, info, INFO, DT_F64);
    }
    if (s == DT_OK) { /* the same on every stage root: no agreement needed */
        for (int q = 0; q < pp; q++) {
            first[q] = total;
            total += (int)info[(size_t)q * INFO];
            if (info[(size_t)q * INFO + 2] != info[2])
                s = dt_fail(DT_ERUNTIME, "checkpoint: pipeline stage %d %s optimizer state, stage 0 %s", q,
                            info[(size_t)q * INFO + 2] ? "has" : "has no", info[2] ? "has" : "has none");
        }
        dt_ckpt_tmp_name(dir, st->step, (int)info[1], tmp, sizeof tmp);
    }
    if (s == DT_OK) s = dt_ckpt_write_files(tmp, &w->full, w->view[0], w->view[1], first[me], total, shard_mb);
    if (s == DT_OK && me > 0) { /* a kill or a failure here: another stage's files may be missing */
        dt_ckpt_test_crash("shard", st->step);
        if (dt_ckpt_test_fail("shard", st->step))
            s = dt_fail(DT_ERUNTIME, "checkpoint '%s': stage %d's files could not be written (test hook "
                        "DT_TEST_FAIL_AT)", tmp, me);
    }
    if (s == DT_OK && me == 0 && total > 1) s = write_indexes(w, info, pp, first, total, tmp, shard_mb);
    if (pp > 1) s = dt_comm_agree(g->pp, s, NULL); /* every stage's files complete and fsynced */
    if (me == 0 && s == DT_OK && pp > 1) s = dt_ckpt_check_files(tmp, total, w->view[0] != NULL);
    if (me == 0 && s == DT_OK) s = dt_ckpt_commit(dir, tmp, st, config_json);
    else if (me == 0 && made) dt_ckpt_abort(tmp);
    free(info);
    free(first);
    return s;
}

dt_status dt_state_agree(const dt_model_groups *g, dt_status s) {
    if (has(g->tp)) s = dt_comm_agree(g->tp, s, NULL);
    if (has(g->pp)) s = dt_comm_agree(g->pp, s, NULL);
    return s;
}

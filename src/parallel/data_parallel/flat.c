#include "flat.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/mem.h"
#include "staging.h"

static dt_status flat_source_open(dt_dp *d, int moments, int reader, dt_ckpt_source *src);
static void flat_source_close(dt_dp *d, dt_ckpt_source *src);

dt_status dt_flat_setup(dt_dp *d, int moments) {
    dt_flat *f = calloc(1, sizeof *f);
    if (!f) return dt_fail(DT_ERUNTIME, "out of memory (data parallel)");
    d->priv = f;
    gpt_model *m = d->m;
    size_t n = m->nparams, e = dt_elem_bytes(d->ops);
    if (d->ops->on_device) {
        dt_status s = d->ops->alloc((void **)&f->params, n * e, "parameters");
        if (s == DT_OK) s = d->ops->alloc((void **)&f->grads, n * e, "gradients");
        /* several ranks (DDP: the trainer checks): MPI reduces a node-shared fp32 host
         * copy, allocated collectively, so every rank must get there */
        /* bf16 gradients on the device communicator: reduced in fp32, a bucket at a time */
        if (s == DT_OK && d->N > 1 && d->o.dcomm && d->ops->bf16) {
            size_t b = d->o.bucket_bytes / sizeof(float) + 1;
            f->bucket32_bytes = (b < n ? b : n) * sizeof(float);
            s = d->ops->alloc((void **)&f->bucket32, f->bucket32_bytes, "fp32 gradient bucket");
        }
        DT_TRY(dt_comm_agree(d->comm, s, NULL));
        if (d->N > 1 && !d->o.dcomm)
            DT_TRY(dt_comm_alloc_shared(d->comm, n * sizeof(float), "gradients (host staging)", (void **)&f->grads_host));
        size_t tie = dt_state_tie_bytes(&d->o.groups, m);
        if (tie && !(f->tie_host = malloc(tie)))
            return dt_fail(DT_ERUNTIME, "out of memory (tied embedding host staging)");
    } else {
        /* the node-shared buffer below is collective: every rank must get there */
        DT_TRY(dt_comm_agree(d->comm, dt_alloc((void **)&f->params, n * e, "parameters"), NULL));
        /* node-shared: DDP's bucket all-reduces read peers' gradients where they lie */
        DT_TRY(dt_comm_alloc_shared(d->comm, n * e, "gradients", (void **)&f->grads));
        /* bf16 gradients are reduced in fp32: widened into this, reduced, rounded back */
        if (d->ops->bf16 && d->N > 1)
            DT_TRY(dt_comm_alloc_shared(d->comm, n * sizeof(float), "gradients (fp32 for the reduction)",
                                        (void **)&f->grads_host));
    }
    m->params = f->params;
    m->grads = f->grads;
    for (int u = 0; u < m->nunits; u++) {
        m->unit_params[u] = dt_dp_at(d, f->params, m->units[u].offset);
        m->unit_grads[u] = dt_dp_at(d, f->grads, m->units[u].offset);
    }
    f->norm_parts = calloc((size_t)d->N, sizeof(double));
    f->pieces = calloc((size_t)m->ntensors, sizeof *f->pieces);
    if (!f->norm_parts || !f->pieces) return dt_fail(DT_ERUNTIME, "out of memory (gradient norm)");
    dt_optimizer_offload off = d->o.offload;
    off.grads_early = 1; /* DDP hands them over as they become final (ddp.c) */
    /* frozen tensors get no moments (the optimizer's order skips them) */
    dt_opt_range *frozen = malloc((size_t)m->ntensors * sizeof *frozen + 1);
    if (!frozen) return dt_fail(DT_ERUNTIME, "out of memory (frozen ranges)");
    int nf = 0;
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].frozen) frozen[nf++] = (dt_opt_range){m->tensors[i].offset, m->tensors[i].numel};
    dt_status s = dt_optimizer_create(&f->opt, d->ops, &d->hp, n, moments, "", &off, frozen, nf);
    free(frozen);
    DT_TRY(s);
    d->opt = &f->opt;
    /* in memory, none frozen: the views for saves are the state itself (else host copies, host_open) */
    if (f->opt.m && !f->opt.nfrozen) {
        DT_TRY(gpt_unit_views(m, f->opt.m, &f->m_view));
        DT_TRY(gpt_unit_views(m, f->opt.v, &f->v_view));
    }
    if (f->opt.store) { /* offloaded: saves and digests stream from the store, a tensor at a time */
        d->st.source_open = flat_source_open;
        d->st.source_close = flat_source_close;
    }
    return DT_OK;
}

void dt_flat_free(dt_dp *d) {
    dt_flat *f = dt_flat_of(d);
    if (!f) return;
    if (d->ops->on_device) {
        d->ops->free(f->params);
        d->ops->free(f->grads);
        if (f->grads_host) dt_comm_free_shared(d->comm, f->grads_host);
        free(f->tie_host);
    } else {
        dt_free(f->params);
        dt_comm_free_shared(d->comm, f->grads);
        if (f->grads_host) dt_comm_free_shared(d->comm, f->grads_host);
    }
    dt_optimizer_free(&f->opt);
    d->ops->free(f->bucket32);
    free(f->m_view);
    free(f->norm_parts);
    free(f->pieces);
    free(f->v_view);
    free(f);
    d->priv = NULL;
}

void dt_flat_begin_step(dt_dp *d) { d->ops->zero(dt_flat_of(d)->grads, d->m->nparams * dt_elem_bytes(d->ops)); }

void dt_flat_grads_to_host(dt_dp *d) {
    dt_flat *f = dt_flat_of(d);
    dt_stage_widen(d->ops, f->grads_host, f->grads, d->m->nparams);
}
void dt_flat_grads_from_host(dt_dp *d) {
    dt_flat *f = dt_flat_of(d);
    dt_stage_narrow(d->ops, f->grads, f->grads_host, d->m->nparams);
}

dt_status dt_flat_layout_norm(dt_dp *d, double *norm) {
    dt_flat *f = dt_flat_of(d);
    const gpt_model *m = d->m;
    DT_TRY(dt_state_tie_grads(&d->o.groups, m, f->grads, f->tie_host));
    dt_grad_piece *p = f->pieces;
    for (int i = 0; i < m->ntensors; i++) { /* each tensor in its class (state.h) */
        const gpt_tensor *t = &m->tensors[i];
        p[i] = (dt_grad_piece){dt_dp_at(d, f->grads, t->offset), t->numel, dt_state_norm_class(m, t)};
    }
    return dt_grad_norm_of(d->ops, p, m->ntensors, DT_NORM_NCLASSES, dt_dp_norm_over_model(d), norm);
}

dt_status dt_flat_local_norm(dt_dp *d, double *norm) {
    if (dt_state_model_parallel(&d->o.groups)) return dt_flat_layout_norm(d, norm);
    *norm = dt_grad_norm(d->ops, dt_flat_of(d)->grads, d->m->nparams);
    return DT_OK;
}

dt_status dt_flat_update(dt_dp *d, double lr, double norm) {
    return dt_optimizer_step_model(&dt_flat_of(d)->opt, d->step + 1, d->m, lr, dt_clip_coef(norm, d->hp.grad_clip));
}

/* ---- state seen from the host ----
 * Checkpoint and digest code read and write fp32 host memory. With the state on a device,
 * in bf16 or offloaded they work on a host copy, made at save/load time only (never per
 * step): the model's unit views (and the moment views) point at it in between. */

static int host_copy_needed(const dt_dp *d) {
    const dt_flat *f = dt_flat_of(d);
    return dt_stage_needed(d->ops) || f->opt.store || f->opt.fmaster || f->opt.nfrozen;
}

static dt_status host_open(dt_dp *d, int moments, int fetch, dt_flat_host *h) {
    memset(h, 0, sizeof *h);
    if (!host_copy_needed(d)) return DT_OK;
    dt_flat *f = dt_flat_of(d);
    gpt_model *m = d->m;
    size_t n = m->nparams, bytes = n * sizeof(float);
    int nm = moments && f->opt.moments ? 2 : 0;
    float ***views[2] = {&f->m_view, &f->v_view};
    h->p = malloc(bytes);
    if (!h->p) return dt_fail(DT_ERUNTIME, "out of memory (host copy of the parameters)");
    for (int k = 0; k < nm; k++) {
        h->mom[k] = malloc(bytes);
        if (!h->mom[k]) return dt_fail(DT_ERUNTIME, "out of memory (host copy of the optimizer state)");
        DT_TRY(gpt_unit_views(m, h->mom[k], &h->mom_view[k]));
        if (fetch) DT_TRY(dt_optimizer_get_moments(&f->opt, k, 0, n, h->mom[k]));
        float **state_view = *views[k]; /* the state's own views (NULL: offloaded) */
        *views[k] = h->mom_view[k];
        h->mom_view[k] = state_view;
        h->swapped[k] = 1;
    }
    if (fetch) DT_TRY(dt_optimizer_get_weights(&f->opt, 0, n, f->params, h->p)); /* fp32 weights */
    DT_TRY(dt_dp_views_push(d, &h->views, h->p, NULL, sizeof(float)));
    return d->ops->sync();
}

/* Points the views back at the state; push: copies the host copy there first. */
static dt_status host_close(dt_dp *d, int push, dt_flat_host *h) {
    if (!host_copy_needed(d)) return DT_OK;
    dt_flat *f = dt_flat_of(d);
    gpt_model *m = d->m;
    size_t n = m->nparams;
    float ***views[2] = {&f->m_view, &f->v_view};
    dt_status s = DT_OK;
    if (h->views.saved) {
        if (push) s = dt_optimizer_set_weights(&f->opt, 0, n, h->p, f->params); /* and the model's compute copy */
        dt_dp_views_pop(d, &h->views);
    }
    for (int k = 0; k < 2; k++) {
        if (!h->mom[k]) continue;
        if (push && s == DT_OK) s = dt_optimizer_set_moments(&f->opt, k, 0, n, h->mom[k]);
        if (h->swapped[k]) {
            free(*views[k]); /* the host view made by host_open */
            *views[k] = h->mom_view[k];
        } else {
            free(h->mom_view[k]);
        }
    }
    dt_status y = d->ops->sync(); /* the uploads have read the host copy */
    free(h->p);
    free(h->mom[0]);
    free(h->mom[1]);
    memset(h, 0, sizeof *h);
    return s != DT_OK ? s : y;
}

/* ---- streamed saves and digests of an offloaded state: one tensor at a time ----
 * Every rank holds the whole state, so a tensor comes from this rank's store (no
 * collective); a host copy of the whole state would undo what offload saved. */

typedef struct {
    dt_dp *d;
    float *buf; /* the largest tensor */
    int reader; /* else nothing is read: the pieces are not used here */
} flat_stream;

static dt_status stream_get(void *ctx, int set, int i, const float **data) {
    flat_stream *fs = ctx;
    dt_flat *f = dt_flat_of(fs->d);
    const gpt_tensor *t = &fs->d->m->tensors[i];
    size_t k = t->offset;
    *data = fs->buf;
    if (!fs->reader) return DT_OK;
    dt_status s = set == 0 ? dt_optimizer_get_weights(&f->opt, k, t->numel, dt_dp_at(fs->d, f->params, k), fs->buf)
                           : dt_optimizer_get_moments(&f->opt, set - 1, k, t->numel, fs->buf);
    return s;
}

static dt_status flat_source_open(dt_dp *d, int moments, int reader, dt_ckpt_source *src) {
    flat_stream *fs = calloc(1, sizeof *fs);
    *src = (dt_ckpt_source){.get = stream_get, .ctx = fs, .moments = moments};
    if (!fs) return dt_fail(DT_ERUNTIME, "out of memory (save buffer)");
    fs->d = d;
    fs->reader = reader;
    size_t most = 0;
    for (int i = 0; i < d->m->ntensors; i++) most = d->m->tensors[i].numel > most ? d->m->tensors[i].numel : most;
    if (!reader) most = 0; /* a buffer still, so data is never NULL */
    return dt_alloc((void **)&fs->buf, most * sizeof(float) + 1, "save buffer (one tensor)");
}

static void flat_source_close(dt_dp *d, dt_ckpt_source *src) {
    (void)d;
    flat_stream *fs = src->ctx;
    if (!fs) return;
    dt_free(fs->buf);
    free(fs);
    src->ctx = NULL;
}

/* Nothing to gather: the reader's host copy (a device's state) or the state itself. */
dt_status dt_flat_open_full(dt_dp *d, int moments, int snapshot, int reader, float ***mv, float ***vv) {
    (void)snapshot; /* the state is private memory already */
    dt_flat *f = dt_flat_of(d);
    *mv = *vv = NULL;
    if (!reader) return DT_OK;
    DT_TRY(host_open(d, moments, 1, &f->host));
    *mv = f->m_view;
    *vv = f->v_view;
    return DT_OK;
}

dt_status dt_flat_close_full(dt_dp *d, float **mv, float **vv) {
    (void)mv;
    (void)vv;
    return host_close(d, 0, &dt_flat_of(d)->host);
}

/* Unit u from dt_dp_by_unit: the weights (the master weights and the parameters' copy, or
 * the parameters) and the moments, at the unit's flat offsets. */
static dt_status put_unit(dt_dp *d, void *ctx, int u, float *const *sets, int nsets) {
    dt_flat *f = dt_flat_of(d);
    size_t k = d->m->units[u].offset, n = d->m->units[u].count;
    (void)ctx;
    DT_TRY(dt_optimizer_set_weights(&f->opt, k, n, sets[0], dt_dp_at(d, f->params, k)));
    for (int j = 1; j < nsets; j++) DT_TRY(dt_optimizer_set_moments(&f->opt, j - 1, k, n, sets[j]));
    return DT_OK;
}

dt_status dt_flat_init_weights(dt_dp *d, uint64_t seed, const char *init_from) {
    /* offloaded: through a unit's buffer, not a host copy of the whole state */
    if (dt_flat_of(d)->opt.store) return dt_dp_by_unit(d, seed, init_from && *init_from ? init_from : NULL, 0, NULL, put_unit, NULL);
    dt_flat_host h;
    dt_status s = host_open(d, 0, 0, &h);
    if (s == DT_OK && (!init_from || !*init_from)) gpt_init(d->m, seed);
    else if (s == DT_OK) s = dt_ckpt_load_weights(init_from, d->m);
    dt_status c = host_close(d, s == DT_OK, &h);
    return s != DT_OK ? s : c;
}

dt_status dt_flat_load(dt_dp *d, const char *step_dir) {
    dt_flat *f = dt_flat_of(d);
    if (f->opt.store) return dt_dp_by_unit(d, 0, step_dir, f->opt.moments, NULL, put_unit, NULL);
    dt_flat_host h;
    dt_status s = host_open(d, 1, 0, &h);
    if (s == DT_OK) s = dt_ckpt_load_weights(step_dir, d->m); /* model.safetensors or its index */
    if (s == DT_OK && f->opt.moments) s = dt_ckpt_load_optimizer(step_dir, d->m, f->m_view, f->v_view);
    dt_status c = host_close(d, s == DT_OK, &h);
    return s != DT_OK ? s : c;
}

void dt_flat_memory(const dt_dp *d, dt_mem_report *r) {
    dt_flat *f = dt_flat_of(d);
    size_t n = d->m->nparams * sizeof(float), e = d->m->nparams * dt_elem_bytes(d->ops);
    r->params = e + (f->opt.master ? n : 0); /* bf16: the compute copy and the fp32 master */
    r->grads = e;
    r->optim = f->opt.store || f->opt.fmaster ? 0 : dt_optimizer_moment_bytes(&f->opt); /* offloaded: elsewhere */
    r->workspace = d->workspace_bytes + f->bucket32_bytes; /* bitwise mode's folds; bf16's fp32 bucket */
    dt_optimizer_offload_bytes(&f->opt, &r->offload_host, &r->offload_file);
    if (f->grads_host && !d->ops->on_device) r->workspace += n; /* bf16's fp32 gradients for the reduction */
}

void dt_flat_estimate(const dt_dp_stage *s, double *state, double *work) {
    const dt_layout *L = s->L;
    double fz = dt_dp_frozen_flat(s); /* frozen: no moments */
    *state = 16 * s->psi - 8 * fz;
    /* optimizer offload: the moments and bf16's fp32 master copy leave the device (fp32's
     * parameters are the model's weights and stay; the store keeps its own master copy) */
    if (L->offload_optimizer != DT_OFFLOAD_NONE) {
        *state -= 8 * (s->psi - fz) + (dt_layout_bf16(L) ? 4 * s->psi : 0);
        if (s->off) s->off->optim_n = s->psi - fz, s->off->optim_frozen = fz;
        if (s->off) s->off->optim_fields = dt_layout_offload_master(L) ? 3 : 2;
        if (s->off) s->off->grads_early = 1;
    }
    /* the reduction's fp32 copy; the device's is host memory, which the estimate of device
     * memory leaves out, as the memory report does. (ps with parallel.zero set: not
     * counted, as the estimator always had it.) */
    int copy = dt_layout_bf16(L) && s->shards > 1 && L->zero == 0;
    if (copy && L->backend == DT_BACKEND_CPU) *work += 4 * s->psi;
    /* with device collectives bf16 DDP widens one bucket at a time into an fp32 device copy */
    if (copy && dt_layout_nccl(L)) *work += 4 * fmin(floor(L->cfg.parallel.bucket_mb * 1024.0 * 1024.0 / 4) + 1, s->psi);
}

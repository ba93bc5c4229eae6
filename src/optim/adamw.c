#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/bf16.h"

#include "optimizer_internal.h"

void dt_adamw_range(const dt_adamw_hparams *hp, const dt_ops *ops, long long step, int decay, double lr, float gscale,
                    float *p, float *p_store, const float *g, float *m, float *v, size_t n) {
    float bc1 = (float)(1.0 - pow(hp->beta1, (double)step)), bc2 = (float)(1.0 - pow(hp->beta2, (double)step));
    ops->adamw(p, p_store, g, m, v, n, (float)lr, (float)hp->beta1, (float)hp->beta2, (float)hp->eps,
               decay ? (float)hp->weight_decay : 0.0f, bc1, bc2, gscale);
}

/* The host's AdamW for offloaded state: the CPU backend's fp32 kernel, the one the CPU,
 * the emulated device and (after widening) bf16 run, so the bits are the same. */
static const dt_ops *host_ops(void) { return dt_ops_cpu(); }

/* Where the parameters are not fp32 host memory the host needs chunks of gradients in
 * fp32 and of parameters in storage precision to move them. */
static int needs_staging(const dt_ops *ops) { return ops->on_device || ops->bf16; }

/* ---- frozen elements: no moments ---- */

/* Frozen owned elements below k. */
static size_t frozen_below(const dt_optimizer *o, size_t k) {
    size_t f = 0;
    for (int i = 0; i < o->nfrozen && o->frozen[i].k < k; i++) {
        size_t e = o->frozen[i].k + o->frozen[i].n;
        f += (e < k ? e : k) - o->frozen[i].k;
    }
    return f;
}
/* Where trainable element k's moments (and offloaded state) are. */
static size_t mom_at(const dt_optimizer *o, size_t k) { return k - frozen_below(o, k); }
/* The run of [k, k + n) from k that is all frozen (*frozen) or all trainable: its length. */
static size_t run_from(const dt_optimizer *o, size_t k, size_t n, int *frozen) {
    *frozen = 0;
    for (int i = 0; i < o->nfrozen; i++) {
        const dt_opt_range *r = &o->frozen[i];
        if (r->k + r->n <= k) continue;
        size_t e = r->k <= k ? r->k + r->n - k : r->k - k;
        *frozen = r->k <= k;
        return e < n ? e : n;
    }
    return n;
}

static dt_status note_frozen(dt_optimizer *o, const dt_opt_range *frozen, int nfrozen) {
    o->nt = o->n;
    if (!o->moments || nfrozen <= 0) return DT_OK;
    o->frozen = malloc((size_t)nfrozen * sizeof *frozen);
    if (!o->frozen) return dt_fail(DT_ERUNTIME, "out of memory (frozen ranges)");
    for (int i = 0; i < nfrozen; i++) {
        if (frozen[i].n == 0) continue;
        o->frozen[o->nfrozen++] = frozen[i];
        o->nt -= frozen[i].n;
    }
    return DT_OK;
}

dt_status dt_optimizer_create(dt_optimizer *o, const dt_ops *ops, const dt_adamw_hparams *hp, size_t n, int moments,
                              const char *what, const dt_optimizer_offload *off, const dt_opt_range *frozen,
                              int nfrozen) {
    memset(o, 0, sizeof *o);
    o->hp = *hp;
    o->ops = ops;
    o->n = n;
    o->moments = moments;
    o->f_master = o->f_m = o->f_v = -1;
    DT_TRY(note_frozen(o, frozen, nfrozen));
    char name[96];
    if (off && off->store.kind) {
        /* the host holds fp32 weights whenever the parameters are not fp32 host memory
         * (or are offloaded themselves, in storage precision) */
        o->params_host = off->params_host;
        o->has_master = needs_staging(ops) || off->params_host;
        int nf = 0;
        if (o->has_master) o->f_master = nf++;
        if (moments) {
            o->f_m = nf++;
            o->f_v = nf++;
        }
        if (!nf) return DT_OK;
        if (o->has_master && o->nt < n) { /* frozen weights: never updated, so not streamed */
            snprintf(name, sizeof name, "frozen master weights%s", what);
            DT_TRY(dt_optimizer_host_alloc(o, &off->store, (void **)&o->fmaster, (n - o->nt) * sizeof(float), name));
        }
        snprintf(name, sizeof name, "optimizer state%s", what);
        dt_store_opts so = off->store;
        so.block_bytes = dt_store_block_for(&so, o->nt, sizeof(float));
        if (o->nt) DT_TRY(dt_store_open(&o->store, o->nt, nf, sizeof(float), &so, name));
        size_t blk = off->store.kind == DT_STORE_NVME ? off->store.block_bytes / sizeof(float) : (size_t)1 << 18;
        o->chunk = blk < n ? blk : n;
        if (o->chunk == 0) o->chunk = 1;
        if (needs_staging(ops)) {
            snprintf(name, sizeof name, "offload staging%s", what);
            DT_TRY(dt_optimizer_host_alloc(o, &off->store, (void **)&o->gbuf, o->chunk * sizeof(float), name));
            DT_TRY(dt_optimizer_host_alloc(o, &off->store, &o->pbuf, o->chunk * sizeof(float), name));
        }
        if (off->delayed && moments && !off->params_host) DT_TRY(dt_delayed_create(o, &off->store));
        if (off->grads_early && moments && needs_staging(ops)) {
            snprintf(name, sizeof name, "gradients on the host%s", what);
            DT_TRY(dt_optimizer_host_alloc(o, &off->store, &o->ghost, n * dt_elem_bytes(ops), name));
        }
        return DT_OK;
    }
    if (moments && o->nt) {
        snprintf(name, sizeof name, "AdamW first moments%s", what);
        DT_TRY(ops->alloc((void **)&o->m, o->nt * sizeof(float), name));
        snprintf(name, sizeof name, "AdamW second moments%s", what);
        DT_TRY(ops->alloc((void **)&o->v, o->nt * sizeof(float), name));
    }
    if (ops->bf16) {
        o->has_master = 1;
        snprintf(name, sizeof name, "fp32 master weights%s", what);
        DT_TRY(ops->alloc((void **)&o->master, n * sizeof(float), name));
    }
    return DT_OK;
}

void dt_optimizer_free(dt_optimizer *o) {
    if (!o->ops) return;
    dt_delayed_free(o); /* its thread first: it may be using the store */
    o->ops->free(o->m);
    o->ops->free(o->v);
    o->ops->free(o->master);
    dt_store_close(o->store);
    dt_optimizer_host_free(o, o->gbuf);
    dt_optimizer_host_free(o, o->pbuf);
    dt_optimizer_host_free(o, o->ghost);
    dt_optimizer_host_free(o, o->fmaster);
    free(o->frozen);
    o->frozen = NULL;
    o->nfrozen = 0;
    o->fmaster = NULL;
    o->ghost = NULL;
    o->m = o->v = o->master = o->gbuf = NULL;
    o->pbuf = NULL;
    o->store = NULL;
}

dt_status dt_optimizer_host_alloc(dt_optimizer *o, const dt_store_opts *so, void **p, size_t bytes, const char *what) {
    *p = NULL;
    if (so->host_alloc) {
        o->host_free = so->host_free;
        return so->host_alloc(p, bytes, what);
    }
    if (posix_memalign(p, 4096, bytes + 1) != 0) {
        *p = NULL;
        return dt_fail(DT_ERUNTIME, "out of host memory (%s, %zu bytes)", what, bytes);
    }
    memset(*p, 0, bytes + 1);
    return DT_OK;
}

void dt_optimizer_host_free(const dt_optimizer *o, void *p) {
    if (!p) return;
    if (o->host_free) o->host_free(p);
    else free(p);
}

void dt_optimizer_delay_next(dt_optimizer *o, int allow) { o->delay_next = allow; }

dt_status dt_optimizer_settle(dt_optimizer *o) { return dt_delayed_settle(o); }

int dt_optimizer_pending(const dt_optimizer *o) { return dt_delayed_pending(o); }

void dt_optimizer_grads_ready(dt_optimizer *o, size_t k, const float *g, size_t n) {
    if (!o->ghost || k > o->n || n > o->n - k) return;
    size_t e = dt_elem_bytes(o->ops);
    void *dst = (char *)o->ghost + k * e;
    if (o->ops->download_async) o->ops->download_async(dst, g, n * e);
    else o->ops->download(dst, g, n * e);
    o->ghost_n += n;
}

void dt_optimizer_grads_ready_host(dt_optimizer *o, size_t k, const void *host, size_t n) {
    if (!o->ghost || k > o->n || n > o->n - k) return;
    size_t e = dt_elem_bytes(o->ops);
    memcpy((char *)o->ghost + k * e, host, n * e);
    o->ghost_n += n;
}

void dt_optimizer_backward_done(dt_optimizer *o) { o->ghost_backward_n = o->ghost_n; }

/* The pass reads the handed-over gradients: every owned element was handed over. */
static int ghost_complete(const dt_optimizer *o) { return o->ghost && o->ghost_n == o->n; }

/* every optimizer's passes that read handed-over gradients, for the step metrics */
static double g_early_bytes, g_backward_bytes;
double dt_optimizer_grads_early_bytes(void) { return g_early_bytes; }
double dt_optimizer_grads_backward_bytes(void) { return g_backward_bytes; }

dt_status dt_optimizer_begin(dt_optimizer *o) {
    if (!o->store || o->in_pass) return DT_OK;
    DT_TRY(dt_delayed_settle(o)); /* the previous update's weights, before this one reads them */
    if (ghost_complete(o)) {
        DT_TRY(o->ops->sync()); /* the copies have landed */
        g_early_bytes += (double)(o->n * dt_elem_bytes(o->ops));
        g_backward_bytes += (double)(o->ghost_backward_n * dt_elem_bytes(o->ops));
    }
    o->in_pass = 1;
    o->delaying = o->delayed && o->delay_next;
    o->delay_next = 0;
    if (o->delaying) {
        dt_delayed_start(o);
        return DT_OK;
    }
    return dt_store_pass_begin(o->store);
}

dt_status dt_optimizer_end(dt_optimizer *o) {
    if (!o->store || !o->in_pass) return DT_OK;
    o->in_pass = 0;
    o->ghost_n = o->ghost_backward_n = 0; /* the next step hands its gradients over again */
    if (o->delaying) {
        o->delaying = 0;
        return dt_delayed_launch(o);
    }
    return dt_store_pass_end(o->store);
}

/* n storage-precision elements at src (the backend's memory) as fp32 in host memory dst;
 * the chunk buffer pbuf carries a device's bf16 on the way. */
void dt_optimizer_to_host_f32(const dt_optimizer *o, float *dst, const void *src, size_t n) {
    const dt_ops *ops = o->ops;
    if (!ops->bf16) {
        ops->download(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t *h = src;
    if (ops->on_device) {
        ops->download(o->pbuf, src, n * sizeof(uint16_t));
        h = o->pbuf;
    }
    for (size_t i = 0; i < n; i++) dst[i] = dt_bf16_to_f32(h[i]);
}

dt_status dt_optimizer_put_params(const dt_optimizer *o, void *dst, const float *src, size_t n) {
    const dt_ops *ops = o->ops;
    if (o->params_host) { /* an offloaded shard's host copy */
        if (!ops->bf16) memcpy(dst, src, n * sizeof(float));
        else for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = dt_f32_to_bf16(src[i]);
        return DT_OK;
    }
    if (!ops->bf16) {
        ops->upload(dst, src, n * sizeof(float));
    } else {
        uint16_t *h = ops->on_device ? o->pbuf : dst;
        for (size_t i = 0; i < n; i++) h[i] = dt_f32_to_bf16(src[i]);
        if (ops->on_device) ops->upload(dst, h, n * sizeof(uint16_t));
    }
    /* the next chunk reuses pbuf: a device's asynchronous upload must have read it */
    return ops->on_device ? ops->sync() : DT_OK;
}

/* k: the owned elements' index (the handed-over gradients'), c: the store's */
static dt_status step_offloaded(dt_optimizer *o, long long step, int decay, double lr, float gscale, size_t k,
                                size_t c0, float *param, const float *g, size_t n) {
    size_t e = dt_elem_bytes(o->ops);
    int staged = needs_staging(o->ops);
    for (size_t i = 0; i < n;) {
        void *f[3];
        size_t got;
        /* the store hands out a block (nvme) or the whole range (cpu), used whole before the
         * next range is asked: a pass only moves forward */
        DT_TRY(dt_store_pass_range(o->store, c0 + i, n - i, f, &got));
        for (size_t j = 0; j < got;) {
            size_t c = got - j < o->chunk || !staged ? got - j : o->chunk, at = i + j;
            const float *gi = (const float *)((const char *)g + at * e);
            if (staged && ghost_complete(o)) { /* handed over during backward: host memory already */
                const void *h = (const char *)o->ghost + (k + at) * e;
                if (o->ops->bf16) {
                    for (size_t x = 0; x < c; x++) o->gbuf[x] = dt_bf16_to_f32(((const uint16_t *)h)[x]);
                    gi = o->gbuf;
                } else {
                    gi = h;
                }
            } else if (staged) {
                dt_optimizer_to_host_f32(o, o->gbuf, gi, c);
                gi = o->gbuf;
            }
            float *w = o->has_master ? (float *)f[o->f_master] + j : (float *)((char *)param + at * e);
            dt_adamw_range(&o->hp, host_ops(), step, decay, lr, gscale, w, NULL, gi, (float *)f[o->f_m] + j,
                           (float *)f[o->f_v] + j, c);
            if (o->has_master) DT_TRY(dt_optimizer_put_params(o, (char *)param + at * e, w, c));
            j += c;
        }
        i += got;
    }
    return DT_OK;
}

dt_status dt_optimizer_step_range(dt_optimizer *o, long long step, int decay, double lr, float gscale, size_t k,
                                  float *param, const float *g, size_t n) {
    size_t c = mom_at(o, k); /* the moments skip the frozen elements below */
    if (o->delaying) return dt_delayed_record(o, step, decay, lr, gscale, c, param, g, n);
    if (o->store) return step_offloaded(o, step, decay, lr, gscale, k, c, param, g, n);
    float *p = o->master ? o->master + k : param, *store = o->master ? param : NULL;
    dt_adamw_range(&o->hp, o->ops, step, decay, lr, gscale, p, store, g, o->m + c, o->v + c, n);
    return DT_OK;
}

dt_status dt_optimizer_step_model(dt_optimizer *o, long long step, const gpt_model *m, double lr, float gscale) {
    size_t e = dt_elem_bytes(o->ops);
    DT_TRY(dt_optimizer_begin(o));
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        if (t->frozen) continue;
        size_t k = t->offset;
        DT_TRY(dt_optimizer_step_range(o, step, t->decay, lr, gscale, k, (float *)((char *)m->params + k * e),
                                       (const float *)((const char *)m->grads + k * e), t->numel));
    }
    return dt_optimizer_end(o);
}

/* ---- random access ---- */

/* Owned elements [k, k + n) piece by piece, each all frozen or all trainable. */
#define EACH_RUN(o, k, n, i, len, fz) \
    for (size_t i = 0, len = 0; i < (n); i += len) \
        if ((len = run_from((o), (k) + i, (n) - i, &(fz))) > 0)

dt_status dt_optimizer_get_weights(dt_optimizer *o, size_t k, size_t n, const float *param, float *dst) {
    DT_TRY(dt_delayed_settle(o));
    int fz;
    EACH_RUN(o, k, n, i, len, fz) {
        if (fz && o->fmaster) memcpy(dst + i, o->fmaster + frozen_below(o, k + i), len * sizeof(float));
        else if (o->store && o->has_master) DT_TRY(dt_store_read(o->store, o->f_master, mom_at(o, k + i), len, dst + i));
        else if (o->master) o->ops->download(dst + i, o->master + k + i, len * sizeof(float));
        else o->ops->download(dst + i, param + i, len * sizeof(float)); /* the parameters are the fp32 weights */
    }
    return DT_OK;
}

dt_status dt_optimizer_set_weights(dt_optimizer *o, size_t k, size_t n, const float *src, float *param) {
    const dt_ops *ops = o->ops;
    DT_TRY(dt_delayed_settle(o));
    if (o->store || o->fmaster) {
        int fz;
        EACH_RUN(o, k, n, i, len, fz) {
            if (fz && o->fmaster) memcpy(o->fmaster + frozen_below(o, k + i), src + i, len * sizeof(float));
            else if (!fz && o->has_master) DT_TRY(dt_store_write(o->store, o->f_master, mom_at(o, k + i), len, src + i));
        }
    }
    if ((o->store || o->fmaster) && o->has_master) {
        if (!param) return DT_OK;
        for (size_t i = 0; i < n; i += o->chunk) {
            size_t c = n - i < o->chunk ? n - i : o->chunk;
            DT_TRY(dt_optimizer_put_params(o, (char *)param + i * dt_elem_bytes(ops), src + i, c));
        }
        return DT_OK;
    }
    if (o->master) {
        ops->upload(o->master + k, src, n * sizeof(float));
        if (param) ops->to_bf16(param, o->master + k, n); /* the model's compute copy */
    } else if (param) {
        ops->upload(param, src, n * sizeof(float));
    }
    return ops->sync(); /* the uploads have read src */
}

static float *moment_in_memory(const dt_optimizer *o, int which) { return which ? o->v : o->m; }

dt_status dt_optimizer_get_moments(dt_optimizer *o, int which, size_t k, size_t n, float *dst) {
    DT_TRY(dt_delayed_settle(o));
    int fz;
    EACH_RUN(o, k, n, i, len, fz) {
        if (fz) memset(dst + i, 0, len * sizeof(float)); /* a frozen tensor's moments: zero, as never updated */
        else if (o->store) DT_TRY(dt_store_read(o->store, which ? o->f_v : o->f_m, mom_at(o, k + i), len, dst + i));
        else o->ops->download(dst + i, moment_in_memory(o, which) + mom_at(o, k + i), len * sizeof(float));
    }
    return DT_OK;
}

dt_status dt_optimizer_set_moments(dt_optimizer *o, int which, size_t k, size_t n, const float *src) {
    DT_TRY(dt_delayed_settle(o));
    int fz;
    EACH_RUN(o, k, n, i, len, fz) {
        if (fz) continue; /* none kept */
        if (o->store) DT_TRY(dt_store_write(o->store, which ? o->f_v : o->f_m, mom_at(o, k + i), len, src + i));
        else o->ops->upload(moment_in_memory(o, which) + mom_at(o, k + i), src + i, len * sizeof(float));
    }
    return o->store ? DT_OK : o->ops->sync();
}

void dt_optimizer_offload_bytes(const dt_optimizer *o, size_t *host, size_t *file) {
    int off = o->store || o->fmaster;
    *host = off ? (o->store ? dt_store_host_bytes(o->store) : 0) + (o->gbuf ? 2 * o->chunk * sizeof(float) : 0) +
                      dt_delayed_host_bytes(o) + (o->ghost ? o->n * dt_elem_bytes(o->ops) : 0) +
                      (o->fmaster ? (o->n - o->nt) * sizeof(float) : 0)
                : 0;
    *file = o->store ? dt_store_file_bytes(o->store) : 0;
}

size_t dt_optimizer_moment_bytes(const dt_optimizer *o) { return o->moments ? 2 * o->nt * sizeof(float) : 0; }

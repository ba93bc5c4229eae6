#include "data_parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/mem.h"
#include "dp_internal.h"
#include "staging.h"
#include "../model_parallel/tensor_parallel.h"

static int is_zero(const dt_dp *d) { return !d->o.ps && d->o.zero > 0; }

size_t dt_dp_align(const dt_dp *d) { return d->o.bitwise ? DT_CANON_CHUNK : DT_SHARD_ALIGN; }

/* ---- DDP buckets ---- */

dt_status dt_dp_inflight_slot(dt_dp *d, dt_request ***slot) {
    if (d->ninflight == MAX_INFLIGHT) { /* bounded: finish the oldest before starting more */
        dt_status s;
        DP_COMM(d, s = dt_wait(d->inflight[0]));
        memmove(d->inflight, d->inflight + 1, (MAX_INFLIGHT - 1) * sizeof(dt_request *));
        d->ninflight--;
        DT_TRY(s);
    }
    *slot = &d->inflight[d->ninflight];
    return DT_OK;
}

dt_status dt_dp_inflight_wait(dt_dp *d) {
    dt_status s = DT_OK;
    double t0 = dt_now();
    for (int i = 0; i < d->ninflight; i++) {
        dt_status w = dt_wait(d->inflight[i]);
        if (s == DT_OK) s = w;
    }
    d->ninflight = 0;
    d->comm_s += dt_now() - t0;
    return s;
}

static float *elems(const dt_dp *d, float *base, size_t n) { /* base + n storage-precision elements */
    return (float *)((char *)base + n * dt_elem_bytes(d->ops));
}

static dt_status launch_bucket(dt_dp *d) {
    if (d->bucket_hi <= d->bucket_lo) return DT_OK;
    if (d->o.dcomm) { /* queued on the device communicator's stream; end_step joins */
        size_t n = d->bucket_hi - d->bucket_lo;
        float *g = elems(d, d->grads, d->bucket_lo);
        d->bucket_lo = d->bucket_hi = 0;
        if (!d->bucket32) return dt_dcomm_allreduce(d->o.dcomm, g, n, DT_F32, DT_SUM);
        /* bf16: widened into the fp32 bucket, reduced there, rounded back */
        d->ops->from_bf16(d->bucket32, g, n);
        DT_TRY(dt_dcomm_allreduce(d->o.dcomm, d->bucket32, n, DT_F32, DT_SUM));
        DT_TRY(dt_dcomm_join(d->o.dcomm));
        d->ops->to_bf16(g, d->bucket32, n);
        return DT_OK;
    }
    dt_request **slot;
    DT_TRY(dt_dp_inflight_slot(d, &slot));
    float *g = d->grads_host ? d->grads_host : d->grads; /* host staging for device gradients */
    DT_TRY(dt_iallreduce(d->comm, g + d->bucket_lo, d->bucket_hi - d->bucket_lo, DT_F32, DT_SUM, slot));
    d->ninflight++;
    d->bucket_lo = d->bucket_hi = 0;
    return DT_OK;
}

/* Gradient norm of the all-reduced (identical) gradients, each rank summing squares over
 * its 1/N of them; the partials are gathered and added in rank order on every rank, so
 * every replica gets the same bits and applies the same clipping. */
static dt_status ddp_norm(dt_dp *d, double *norm) {
    size_t n = d->m->nparams, lo = n * (size_t)d->rank / (size_t)d->N, hi = n * (size_t)(d->rank + 1) / (size_t)d->N;
    double mine = d->ops->sumsq(elems(d, d->grads, lo), hi - lo), sum = 0.0;
    DT_TRY(dt_allgather(d->comm, &mine, d->norm_parts, 1, DT_F64));
    for (int q = 0; q < d->N; q++) sum += d->norm_parts[q];
    *norm = sqrt(sum);
    return DT_OK;
}

/* The gradient norm of a model-parallel rank's (complete) gradients: each tensor's squares
 * in its class (state.h), in table order, then combined over the model-parallel groups. */
static dt_status layout_norm(dt_dp *d, double *norm) {
    const gpt_model *m = d->m;
    double part[DT_NORM_NCLASSES] = {0.0, 0.0};
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        int c = dt_state_norm_class(m, t);
        if (c >= 0) part[c] += d->ops->sumsq(elems(d, d->grads, t->offset), t->numel);
    }
    return dt_state_norm(&d->o.groups, part, norm);
}

/* Unit u's gradients are final for this micro-step. Units arrive in descending
 * offset order, so the bucket stays one contiguous range. */
static dt_status ddp_after_backward(dt_dp *d, int u) {
    /* device gradients are staged to the host once, after backward (end_step), and bf16
     * ones on the device communicator share one fp32 copy; without overlap everything is
     * reduced there */
    if (!d->last_micro || d->N == 1 || d->o.bitwise || d->grads_host || !d->o.overlap || d->bucket32) return DT_OK;
    const gpt_unit *un = &d->m->units[u];
    if (un->count == 0) return DT_OK;
    /* a unit below a gap (a pipeline's last stage finishes ln_f and wte in its loss, its
     * blocks later) sends the bucket so far first */
    if (d->bucket_hi > d->bucket_lo && un->offset + un->count != d->bucket_lo) DT_TRY(launch_bucket(d));
    if (d->bucket_hi <= d->bucket_lo) d->bucket_hi = un->offset + un->count;
    d->bucket_lo = un->offset;
    if ((d->bucket_hi - d->bucket_lo) * sizeof(float) >= d->o.bucket_bytes) return launch_bucket(d);
    return DT_OK;
}

/* ---- hooks: dispatch by mode ---- */

static dt_status h_before_forward(void *ctx, int u) {
    dt_dp *d = ctx;
    return is_zero(d) ? dt_zero_before_forward(d, u) : DT_OK;
}
static dt_status h_after_forward(void *ctx, int u) {
    (void)ctx;
    (void)u; /* ZeRO-3's gathered buffers are reused by the block two ahead: nothing to free */
    return DT_OK;
}
static dt_status h_before_backward(void *ctx, int u) {
    dt_dp *d = ctx;
    if (u != GPT_HEAD_PART && is_zero(d)) DT_TRY(dt_zero_before_backward(d, u));
    return d->o.bitwise ? dt_bw_before_backward(d, u) : DT_OK;
}
static dt_status h_after_backward(void *ctx, int u) {
    dt_dp *d = ctx;
    if (d->o.bitwise) return dt_bw_after_backward(d, u);
    if (is_zero(d)) return dt_zero_after_backward(d, u);
    return d->o.ps ? DT_OK : ddp_after_backward(d, u);
}

/* ---- engine ---- */

static dt_status setup_plain(dt_dp *d) {
    gpt_model *m = d->m;
    size_t n = m->nparams, e = dt_elem_bytes(d->ops);
    if (d->ops->on_device) {
        dt_status s = d->ops->alloc((void **)&d->params, n * e, "parameters");
        if (s == DT_OK) s = d->ops->alloc((void **)&d->grads, n * e, "gradients");
        /* several ranks (DDP: the trainer checks): MPI reduces a node-shared fp32 host
         * copy, allocated collectively, so every rank must get there */
        /* bf16 gradients on the device communicator: reduced in fp32, a bucket at a time */
        if (s == DT_OK && d->N > 1 && d->o.dcomm && d->ops->bf16) {
            size_t b = d->o.bucket_bytes / sizeof(float) + 1;
            d->bucket32_bytes = (b < n ? b : n) * sizeof(float);
            s = d->ops->alloc((void **)&d->bucket32, d->bucket32_bytes, "fp32 gradient bucket");
        }
        DT_TRY(dt_comm_agree(d->comm, s, NULL));
        if (d->N > 1 && !d->o.dcomm)
            DT_TRY(dt_comm_alloc_shared(d->comm, n * sizeof(float), "gradients (host staging)", (void **)&d->grads_host));
        size_t tie = dt_state_tie_bytes(&d->o.groups, m);
        if (tie && !(d->tie_host = malloc(tie)))
            return dt_fail(DT_ERUNTIME, "out of memory (tied embedding host staging)");
    } else {
        /* the node-shared buffer below is collective: every rank must get there */
        DT_TRY(dt_comm_agree(d->comm, dt_alloc((void **)&d->params, n * e, "parameters"), NULL));
        /* node-shared: DDP's bucket all-reduces read peers' gradients where they lie */
        DT_TRY(dt_comm_alloc_shared(d->comm, n * e, "gradients", (void **)&d->grads));
        /* bf16 gradients are reduced in fp32: widened into this, reduced, rounded back */
        if (d->ops->bf16 && d->N > 1)
            DT_TRY(dt_comm_alloc_shared(d->comm, n * sizeof(float), "gradients (fp32 for the reduction)",
                                        (void **)&d->grads_host));
    }
    if (d->ops->bf16) DT_TRY(d->ops->alloc((void **)&d->master, n * sizeof(float), "fp32 master weights"));
    m->params = d->params;
    m->grads = d->grads;
    for (int u = 0; u < m->nunits; u++) {
        m->unit_params[u] = elems(d, d->params, m->units[u].offset);
        m->unit_grads[u] = elems(d, d->grads, m->units[u].offset);
    }
    d->norm_parts = calloc((size_t)d->N, sizeof(double));
    if (!d->norm_parts) return dt_fail(DT_ERUNTIME, "out of memory (gradient norm)");
    if (!d->o.ps || d->rank == 0) { /* ps: only the central rank keeps optimizer state */
        DT_TRY(d->ops->alloc((void **)&d->exp_avg, n * sizeof(float), "AdamW first moments"));
        DT_TRY(d->ops->alloc((void **)&d->exp_avg_sq, n * sizeof(float), "AdamW second moments"));
        DT_TRY(gpt_unit_views(m, d->exp_avg, &d->m_view));
        DT_TRY(gpt_unit_views(m, d->exp_avg_sq, &d->v_view));
    }
    return DT_OK;
}

dt_status dt_dp_check_config(const dt_config *c) {
    /* bf16 and a device's state reduce through fp32 host copies (staging.h) in DDP, the
     * central rank and ZeRO; bitwise mode's folds still assume fp32 host gradients (cp
     * refuses bf16 and devices itself) */
    if (!strcmp(c->parallel.determinism, "bitwise") && (!strcmp(c->precision, "bf16") || strcmp(c->backend, "cpu")))
        return dt_fail(DT_EINPUT, "parallel.determinism=bitwise runs on the CPU backend in fp32 only (backend %s, "
                       "precision %s)", c->backend, c->precision);
    if (strcmp(c->comm.backend, "nccl")) return DT_OK;
    /* device collectives carry the data-parallel group of DDP and ZeRO so far */
    if (!strcmp(c->backend, "cpu"))
        return dt_fail(DT_EINPUT, "comm.backend nccl needs a device backend (cuda, or emulated to test it)");
    if (c->parallel.tp > 1 || c->parallel.pp > 1 || c->parallel.cp > 1)
        return dt_fail(DT_EINPUT, "comm.backend nccl carries data parallelism only so far (tp %d, pp %d, cp %d): "
                       "use comm.backend mpi", c->parallel.tp, c->parallel.pp, c->parallel.cp);
    if (!strcmp(c->parallel.dp_mode, "ps") || !strcmp(c->parallel.determinism, "bitwise"))
        return dt_fail(DT_EINPUT, "comm.backend nccl runs DDP and ZeRO (not dp_mode ps or bitwise mode)");
    return DT_OK;
}

dt_status dt_dp_create(dt_dp **out, dt_comm *comm, gpt_model *m, const dt_adamw_hparams *hp, const dt_dp_opts *o) {
    dt_dp *d = calloc(1, sizeof *d);
    if (!d) return dt_fail(DT_ERUNTIME, "out of memory (data parallel)");
    *out = d;
    d->comm = comm;
    d->N = dt_comm_size(comm);
    d->rank = dt_comm_rank(comm);
    d->m = m;
    d->ops = m->ops;
    d->hp = *hp;
    d->o = *o;
    m->hooks = (gpt_hooks){h_before_forward, h_after_forward, h_before_backward, h_after_backward, d};
    if (d->o.bitwise && (d->N & (d->N - 1)))
        return dt_fail(DT_EINPUT, "parallel.determinism=bitwise needs a power-of-two data-parallel size (got %d)",
                       d->N);
    if (d->o.bitwise && (d->o.leaves < 1 || (d->o.leaves & (d->o.leaves - 1))))
        return dt_fail(DT_EINPUT,
                       "parallel.determinism=bitwise needs a power-of-two number of accumulation steps (got %d)",
                       d->o.leaves);
    dt_status s = is_zero(d) ? dt_zero_setup(d) : setup_plain(d);
    if (s == DT_OK) s = dt_bw_setup(d);
    return dt_comm_agree(d->comm, s, NULL); /* what follows communicates */
}

int dt_dp_set_async_save(dt_dp *d, int on) { return d->async_save = on && !dt_state_model_parallel(&d->o.groups); }

dt_status dt_dp_save_wait(dt_dp *d) {
    return dt_comm_agree(d->comm, d->rank == 0 ? dt_ckpt_async_wait(&d->save_job) : DT_OK, NULL);
}

void dt_dp_destroy(dt_dp *d) {
    if (!d) return;
    if (d->save_job.pid > 0) { /* a failed run still lets a started save finish (it commits or not) */
        dt_status s = dt_ckpt_async_wait(&d->save_job);
        (void)s;
    }
    for (int i = 0; i < d->ninflight; i++) dt_wait(d->inflight[i]);
    if (is_zero(d)) dt_zero_free(d);
    if (d->o.bitwise) dt_bw_free(d);
    if (d->ops->on_device) {
        d->ops->free(d->params);
        d->ops->free(d->grads);
        if (d->grads_host) dt_comm_free_shared(d->comm, d->grads_host);
        free(d->tie_host);
    } else {
        dt_free(d->params);
        dt_comm_free_shared(d->comm, d->grads);
        if (d->grads_host) dt_comm_free_shared(d->comm, d->grads_host);
    }
    d->ops->free(d->exp_avg);
    d->ops->free(d->exp_avg_sq);
    d->ops->free(d->master);
    d->ops->free(d->bucket32);
    free(d->m_view);
    free(d->norm_parts);
    free(d->v_view);
    d->m->params = d->m->grads = NULL;
    memset(&d->m->hooks, 0, sizeof d->m->hooks);
    free(d);
}

/* ---- device state seen from the host ----
 * Checkpoint and digest code read and write host memory. With the state on a device
 * they work on a host copy, made at save/load time only (never per step): the model's
 * unit views (and the moment views) point at it in between. */
typedef struct {
    float *p, *mom[2];
    float **params_view, **mom_view[2]; /* the device views, restored at close */
    int swapped;                        /* unit_params point at p */
} host_copy;

/* ZeRO makes its own host views (dt_zero_gather_full) */
static int needs_host_copy(const dt_dp *d) { return dt_stage_needed(d->ops) && !is_zero(d); }

static dt_status host_open(dt_dp *d, int moments, int fetch, host_copy *h) {
    memset(h, 0, sizeof *h);
    if (!needs_host_copy(d)) return DT_OK;
    gpt_model *m = d->m;
    size_t n = m->nparams, bytes = n * sizeof(float);
    int nm = moments && d->m_view ? 2 : 0;
    float *dev_mom[2] = {d->exp_avg, d->exp_avg_sq};
    float ***views[2] = {&d->m_view, &d->v_view};
    h->p = malloc(bytes);
    h->params_view = malloc((size_t)m->nunits * sizeof(float *));
    if (!h->p || !h->params_view) return dt_fail(DT_ERUNTIME, "out of memory (host copy of the parameters)");
    for (int k = 0; k < nm; k++) {
        h->mom[k] = malloc(bytes);
        if (!h->mom[k]) return dt_fail(DT_ERUNTIME, "out of memory (host copy of the optimizer state)");
        DT_TRY(gpt_unit_views(m, h->mom[k], &h->mom_view[k]));
        if (fetch) d->ops->download(h->mom[k], dev_mom[k], bytes);
        float **dev_view = *views[k];
        *views[k] = h->mom_view[k];
        h->mom_view[k] = dev_view;
    }
    if (fetch) d->ops->download(h->p, d->master ? d->master : d->params, bytes); /* fp32 weights */
    for (int u = 0; u < m->nunits; u++) {
        h->params_view[u] = m->unit_params[u];
        m->unit_params[u] = h->p + m->units[u].offset;
    }
    h->swapped = 1;
    return d->ops->sync();
}

/* Points the views back at the device; push: copies the host copy there first. */
static dt_status host_close(dt_dp *d, int push, host_copy *h) {
    if (!needs_host_copy(d)) return DT_OK;
    gpt_model *m = d->m;
    size_t bytes = m->nparams * sizeof(float);
    float *dev_mom[2] = {d->exp_avg, d->exp_avg_sq};
    float ***views[2] = {&d->m_view, &d->v_view};
    if (h->swapped) {
        if (push && d->master) {
            d->ops->upload(d->master, h->p, bytes);
            d->ops->to_bf16(d->params, d->master, m->nparams); /* the model's compute copy */
        } else if (push) {
            d->ops->upload(d->params, h->p, bytes);
        }
        for (int u = 0; u < m->nunits; u++) m->unit_params[u] = h->params_view[u];
    }
    for (int k = 0; k < 2; k++) {
        if (!h->mom[k]) continue;
        if (push) d->ops->upload(dev_mom[k], h->mom[k], bytes);
        if (h->mom_view[k]) {
            free(*views[k]); /* the host view made by host_open */
            *views[k] = h->mom_view[k];
        }
    }
    dt_status s = d->ops->sync(); /* the uploads have read the host copy */
    free(h->p);
    free(h->params_view);
    free(h->mom[0]);
    free(h->mom[1]);
    return s;
}

/* Checkpoints and the digest are of whole tensors: with model parallelism the digest's
 * are assembled at one rank, a checkpoint's at each pipeline stage's first rank, which
 * writes its stage's files (state.h, a host copy made at save time only); a load reads this
 * rank's pieces out of the file's whole tensors by their shard specs (checkpoint.c), so
 * any layout, with any ZeRO stage, reads any checkpoint. */

dt_status dt_dp_init_weights(dt_dp *d, uint64_t seed, const char *init_from) {
    if (is_zero(d)) return dt_zero_init_weights(d, seed, init_from);
    host_copy h;
    dt_status s = host_open(d, 0, 0, &h);
    if (s == DT_OK && (!init_from || !*init_from)) gpt_init(d->m, seed);
    else if (s == DT_OK) s = dt_ckpt_load_weights(init_from, d->m);
    dt_status c = host_close(d, s == DT_OK, &h);
    return s != DT_OK ? s : c;
}

dt_status dt_dp_load(dt_dp *d, const char *step_dir, long long step) {
    d->step = step;
    if (is_zero(d)) return dt_zero_load(d, step_dir);
    host_copy h;
    dt_status s = host_open(d, 1, 0, &h);
    if (s == DT_OK) s = dt_ckpt_load_weights(step_dir, d->m); /* model.safetensors or its index */
    if (s == DT_OK && d->m_view) s = dt_ckpt_load_optimizer(step_dir, d->m, d->m_view, d->v_view);
    dt_status c = host_close(d, s == DT_OK, &h);
    return s != DT_OK ? s : c;
}

void dt_dp_begin_step(dt_dp *d) {
    if (d->o.bitwise) dt_bw_begin_step(d);
    else if (is_zero(d)) dt_zero_begin_step(d);
    else d->ops->zero(d->grads, d->m->nparams * dt_elem_bytes(d->ops));
}

void dt_dp_begin_micro(dt_dp *d, int last) {
    d->last_micro = last;
}

/* AdamW over the whole flat buffer (ps root, DDP). */
static void full_update(dt_dp *d, double lr, double norm) {
    dt_adamw o = {.hp = d->hp, .m = d->exp_avg, .v = d->exp_avg_sq, .master = d->master, .step = d->step};
    dt_adamw_step(&o, d->ops, d->m, lr, dt_clip_coef(norm, d->hp.grad_clip));
}

/* The gradients into the fp32 host buffer the collectives reduce, and back (staging.h). */
static void grads_to_host(dt_dp *d) { dt_stage_widen(d->ops, d->grads_host, d->grads, d->m->nparams); }
static void grads_from_host(dt_dp *d) { dt_stage_narrow(d->ops, d->grads, d->grads_host, d->m->nparams); }

dt_status dt_dp_end_step(dt_dp *d, double lr, double *grad_norm) {
    dt_status s = DT_OK;
    if (is_zero(d)) {
        s = dt_zero_end_step(d, lr, grad_norm);
    } else if (d->o.bitwise) {
        /* the folds' roots are the canonical sum, already identical on every rank */
        s = dt_bw_finish(d, grad_norm);
        if (s == DT_OK && (!d->o.ps || d->rank == 0)) full_update(d, lr, *grad_norm);
        if (s == DT_OK && d->o.ps && d->N > 1) s = dt_bcast(d->comm, d->params, d->m->nparams, DT_F32, 0);
    } else if (d->o.ps && d->N > 1) {
        /* central rank: reduce to rank 0, update there, broadcast the parameters (device
         * or bf16 state through the fp32 host copy, in and out; bf16: the root's fp32
         * master weights stay there, the others get the model's bf16 copy) */
        double norm = 0.0;
        size_t n = d->m->nparams;
        float *g = d->grads_host ? d->grads_host : d->grads;
        if (d->grads_host) DP_COMM(d, grads_to_host(d));
        DP_COMM(d, s = dt_reduce(d->comm, g, n, DT_F32, DT_SUM, 0));
        if (s == DT_OK && d->rank == 0 && d->grads_host) grads_from_host(d);
        if (s == DT_OK && d->rank == 0) { /* the roots of the model-parallel groups are such groups themselves */
            if (dt_state_model_parallel(&d->o.groups)) {
                s = dt_state_tie_grads(&d->o.groups, d->m, d->grads, d->tie_host);
                if (s == DT_OK) s = layout_norm(d, &norm);
            } else {
                norm = dt_grad_norm(d->ops, d->grads, d->m->nparams);
            }
            if (s == DT_OK) full_update(d, lr, norm);
        }
        if (s == DT_OK && d->grads_host) { /* the updated parameters, from the root's device */
            size_t bytes = n * dt_elem_bytes(d->ops);
            if (d->rank == 0) d->ops->download(d->grads_host, d->params, bytes);
            DP_COMM(d, s = dt_bcast(d->comm, d->grads_host, n, d->ops->bf16 ? DT_BF16 : DT_F32, 0));
            if (s == DT_OK && d->rank != 0) d->ops->upload(d->params, d->grads_host, bytes);
        } else if (s == DT_OK) {
            DP_COMM(d, s = dt_bcast(d->comm, d->params, n, DT_F32, 0));
        }
        if (s == DT_OK) s = dt_bcast(d->comm, &norm, 1, DT_F64, 0);
        *grad_norm = norm;
    } else {
        if (d->N > 1) {
            if (d->grads_host) { /* device or bf16 gradients: to fp32 host memory, reduced there, back below */
                d->bucket_lo = 0;
                d->bucket_hi = d->m->nparams;
                DP_COMM(d, grads_to_host(d));
            }
            if (!d->o.overlap || d->bucket32) {
                d->bucket_lo = 0;
                d->bucket_hi = d->m->nparams;
            }
            if (!d->o.overlap || d->grads_host || d->bucket32) { /* everything at the end, in buckets of the same size */
                size_t lo = d->bucket_lo, hi = d->bucket_hi, step = d->o.bucket_bytes / sizeof(float) + 1;
                for (size_t top = hi; top > lo && s == DT_OK;) {
                    d->bucket_hi = top;
                    d->bucket_lo = top - lo > step ? top - step : lo;
                    top = d->bucket_lo;
                    s = launch_bucket(d);
                }
            } else {
                s = launch_bucket(d);
            }
            dt_status w = dt_dp_inflight_wait(d);
            if (s == DT_OK) s = w;
            if (s == DT_OK && d->o.dcomm) DP_COMM(d, s = dt_dcomm_join(d->o.dcomm));
            if (s == DT_OK && d->grads_host) {
                grads_from_host(d);
                s = d->ops->sync();
            }
            if (s == DT_OK && dt_state_model_parallel(&d->o.groups)) {
                s = dt_state_tie_grads(&d->o.groups, d->m, d->grads, d->tie_host);
                if (s == DT_OK) s = layout_norm(d, grad_norm);
            } else if (s == DT_OK) {
                s = ddp_norm(d, grad_norm);
            }
        } else if (dt_state_model_parallel(&d->o.groups)) {
            s = dt_state_tie_grads(&d->o.groups, d->m, d->grads, d->tie_host);
            if (s == DT_OK) s = layout_norm(d, grad_norm);
        } else {
            *grad_norm = dt_grad_norm(d->ops, d->grads, d->m->nparams);
        }
        if (s == DT_OK) full_update(d, lr, *grad_norm);
    }
    d->step++;
    return s;
}

dt_status dt_dp_gather_full(dt_dp *d) { return is_zero(d) ? dt_zero_gather_full(d, 0) : DT_OK; }
/* The fp32 weights whole in host memory for the digest (ZeRO's; the others: host_open). */
static dt_status gather_host(dt_dp *d) { return is_zero(d) ? dt_zero_gather_full(d, 1) : DT_OK; }
void dt_dp_release_full(dt_dp *d) {
    if (is_zero(d)) dt_zero_release_full(d);
}

dt_status dt_dp_save(dt_dp *d, const char *dir, const dt_train_state *st, const char *config_json, double shard_mb) {
    float **mv = d->m_view, **vv = d->v_view;
    dt_status s = DT_OK;
    if (dt_state_model_parallel(&d->o.groups)) { /* whole tensors, each stage's at its first tensor-parallel rank */
        dt_whole_model f;
        memset(&f, 0, sizeof f);
        host_copy h = {0};
        /* the first replica's model-parallel groups write the files (a group's ranks share
         * their data-parallel rank); the other replicas take part in ZeRO's gathers only */
        int writer = d->rank == 0;
        if (is_zero(d)) { /* this rank's pieces whole over the data-parallel group first */
            s = dt_zero_gather_full(d, 2);
            if (s == DT_OK) s = dt_zero_full_moments(d, &mv, &vv);
        } else if (writer) { /* a device's state: its pieces gathered from a host copy */
            s = host_open(d, 1, 1, &h);
            if (s == DT_OK) mv = d->m_view, vv = d->v_view;
        }
        if (writer) {
            s = dt_state_agree(&d->o.groups, s); /* what follows is collective over the groups */
            if (s == DT_OK) s = dt_state_gather_stage(&d->o.groups, d->m, mv, vv, &f);
        }
        /* each pipeline stage's files written by its own root, in parallel (state.c) */
        if (writer && dt_state_is_stage_root(&d->o.groups))
            s = dt_state_save_stages(&d->o.groups, &f, s, dir, st, config_json, shard_mb);
        dt_whole_free(&f);
        if (is_zero(d)) {
            dt_zero_free_views(mv, vv);
            dt_zero_release_full(d);
        } else {
            dt_status c = host_close(d, 0, &h);
            if (s == DT_OK) s = c;
        }
        s = dt_state_agree(&d->o.groups, s);
        return dt_comm_agree(d->comm, s, NULL);
    }
    if (is_zero(d) && !d->async_save) { /* streamed: one unit whole at a time, written as it comes */
        dt_zero_stream z;
        dt_ckpt_source src;
        s = dt_zero_stream_open(d, &z, &src, 1);
        if (s == DT_OK) s = dt_ckpt_save_stream(dir, d->m, &src, d->rank == 0, st, config_json, shard_mb);
        dt_zero_stream_close(&z);
        return dt_comm_agree(d->comm, s, NULL);
    }
    if (is_zero(d)) { /* asynchronous: the child writes from a snapshot of the whole state (fork) */
        s = dt_zero_gather_full(d, 2);
        if (s == DT_OK) s = dt_zero_full_moments(d, &mv, &vv);
    }
    if (s == DT_OK && d->rank == 0) {
        host_copy h;
        s = host_open(d, 1, 1, &h);
        if (s == DT_OK && !is_zero(d)) mv = d->m_view, vv = d->v_view; /* the host views, on a device */
        if (s == DT_OK)
            s = d->async_save ? dt_ckpt_save_async(&d->save_job, dir, d->m, mv, vv, st, config_json, shard_mb)
                              : dt_ckpt_save(dir, d->m, mv, vv, st, config_json, shard_mb);
        dt_status c = host_close(d, 0, &h);
        if (s == DT_OK) s = c;
    }
    if (is_zero(d)) {
        dt_zero_free_views(mv, vv);
        dt_zero_release_full(d);
    }
    return dt_comm_agree(d->comm, s, NULL);
}

dt_status dt_dp_digest(dt_dp *d, char hex[65]) {
    if (dt_state_model_parallel(&d->o.groups)) { /* of the whole model, at the groups' first rank */
        dt_whole_model f;
        memset(&f, 0, sizeof f);
        host_copy h = {0};
        int writer = d->rank == 0; /* the first replica's groups (as in dt_dp_save) */
        dt_status s = gather_host(d);
        if (s == DT_OK && writer && !is_zero(d)) s = host_open(d, 0, 1, &h); /* a device's weights, from a host copy */
        if (writer) {
            s = dt_state_agree(&d->o.groups, s);
            if (s == DT_OK) s = dt_state_gather_whole(&d->o.groups, d->m, NULL, NULL, &f);
        }
        hex[0] = 0;
        if (s == DT_OK && writer && dt_state_is_root(&d->o.groups)) dt_weights_digest(&f.full, hex);
        dt_whole_free(&f);
        if (!is_zero(d)) {
            dt_status c = host_close(d, 0, &h);
            if (s == DT_OK) s = c;
        }
        dt_dp_release_full(d);
        return dt_state_agree(&d->o.groups, s);
    }
    if (is_zero(d)) { /* streamed as a save is (every rank gets the digest) */
        dt_zero_stream z;
        dt_ckpt_source src;
        dt_status s = dt_zero_stream_open(d, &z, &src, 0);
        if (s == DT_OK) s = dt_weights_digest_stream(d->m, &src, hex);
        dt_zero_stream_close(&z);
        return s;
    }
    dt_status s = DT_OK;
    host_copy h;
    if (s == DT_OK) s = host_open(d, 0, 1, &h);
    if (s == DT_OK) dt_weights_digest(d->m, hex);
    dt_status c = host_close(d, 0, &h);
    dt_dp_release_full(d);
    return s != DT_OK ? s : c;
}

double dt_dp_comm_seconds(const dt_dp *d) { return d->comm_s; }

void dt_dp_memory(const dt_dp *d, dt_mem_report *r) {
    memset(r, 0, sizeof *r);
    if (is_zero(d)) {
        dt_zero_memory(d, r);
        return;
    }
    size_t n = d->m->nparams * sizeof(float), e = d->m->nparams * dt_elem_bytes(d->ops);
    r->params = e + (d->master ? n : 0); /* bf16: the compute copy and the fp32 master */
    r->grads = e;
    r->optim = d->exp_avg ? 2 * n : 0;
    r->workspace = d->workspace_bytes + d->bucket32_bytes; /* bitwise mode's folds; bf16's fp32 bucket */
    if (d->grads_host && !d->ops->on_device) r->workspace += n; /* bf16's fp32 gradients for the reduction */
}

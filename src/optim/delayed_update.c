/* ZeRO-Offload's one-step delayed parameter update (DPU, the paper's section 5.2;
 * docs/offload.md): step s's AdamW pass over the offloaded state runs on a host thread
 * while step s+1 computes its forward and backward with the weights that do not include
 * it yet; the weights it produced replace the parameters when the next update begins. The
 * optimizer (adamw.c) records the pass's pieces here instead of running them, and settles
 * (waits for and applies) the pass in flight before anything else reads or writes its state.
 *
 * The thread works on copies only: the step's gradients widened to fp32 host memory (the
 * next backward overwrites the originals) and the updated weights in fp32 host memory
 * (the parameters stay as they are until the settle), so the model never sees a half-done
 * update. */
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer_internal.h"

typedef struct {
    long long step;
    int decay;
    double lr;
    float gscale;
    size_t k, n;
    void *param; /* where the weights go at the settle (the parameters' storage) */
} piece;

typedef struct dt_delayed {
    float *grads;   /* fp32 host: the recorded gradients, at their moments' offsets (frozen ones skipped) */
    float *weights; /* fp32 host: the updated weights (without master weights: the weights the pass updates) */
    piece *pieces;
    int npieces, cap;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running, busy, quit, unapplied;
    int threads; /* the caller's OpenMP threads, for the pass's AdamW */
    dt_status result;
    char msg[1024]; /* the pass's error message, raised again by the settle on the caller's thread */
} dt_delayed;

static dt_status run_pass(dt_optimizer *o) {
    dt_delayed *dl = o->delayed;
    const dt_ops *cpu = dt_ops_cpu();
    DT_TRY(dt_store_pass_begin(o->store));
    for (int p = 0; p < dl->npieces; p++) {
        const piece *q = &dl->pieces[p];
        for (size_t i = 0, got = 0; i < q->n; i += got) {
            void *f[3];
            DT_TRY(dt_store_pass_range(o->store, q->k + i, q->n - i, f, &got));
            float *w = o->has_master ? (float *)f[o->f_master] : dl->weights + q->k + i;
            dt_adamw_range(&o->hp, cpu, q->step, q->decay, q->lr, q->gscale, w, NULL, dl->grads + q->k + i,
                           (float *)f[o->f_m], (float *)f[o->f_v], got);
            if (o->has_master) memcpy(dl->weights + q->k + i, w, got * sizeof(float));
        }
    }
    return dt_store_pass_end(o->store);
}

static void *worker(void *arg) {
    dt_optimizer *o = arg;
    dt_delayed *dl = o->delayed;
    pthread_mutex_lock(&dl->mu);
    omp_set_num_threads(dl->threads);
    for (;;) {
        while (!dl->busy && !dl->quit) pthread_cond_wait(&dl->cv, &dl->mu);
        if (dl->quit) break;
        omp_set_num_threads(dl->threads);
        pthread_mutex_unlock(&dl->mu);
        dt_status s = run_pass(o);
        if (s != DT_OK) snprintf(dl->msg, sizeof dl->msg, "%s", dt_error_message());
        pthread_mutex_lock(&dl->mu);
        dl->result = s;
        dl->busy = 0;
        pthread_cond_broadcast(&dl->cv);
    }
    pthread_mutex_unlock(&dl->mu);
    return NULL;
}

dt_status dt_delayed_create(dt_optimizer *o, const dt_store_opts *so) {
    dt_delayed *dl = calloc(1, sizeof *dl);
    if (!dl) return dt_fail(DT_ERUNTIME, "out of memory (delayed update)");
    o->delayed = dl;
    pthread_mutex_init(&dl->mu, NULL);
    pthread_cond_init(&dl->cv, NULL);
    /* two fp32 copies of the owned elements: what the thread reads and what it writes
     * (page-locked for a device with offload.pin_memory: they cross to and from it) */
    DT_TRY(dt_optimizer_host_alloc(o, so, (void **)&dl->grads, o->nt * sizeof(float), "delayed update: gradients"));
    return dt_optimizer_host_alloc(o, so, (void **)&dl->weights, o->nt * sizeof(float), "delayed update: weights");
}

void dt_delayed_free(dt_optimizer *o) {
    dt_delayed *dl = o->delayed;
    if (!dl) return;
    if (dl->running) {
        pthread_mutex_lock(&dl->mu);
        dl->quit = 1;
        pthread_cond_broadcast(&dl->cv);
        pthread_mutex_unlock(&dl->mu);
        pthread_join(dl->thread, NULL); /* after the pass in flight, if any */
    }
    pthread_mutex_destroy(&dl->mu);
    pthread_cond_destroy(&dl->cv);
    dt_optimizer_host_free(o, dl->grads);
    dt_optimizer_host_free(o, dl->weights);
    free(dl->pieces);
    free(dl);
    o->delayed = NULL;
}

void dt_delayed_start(dt_optimizer *o) { o->delayed->npieces = 0; }

dt_status dt_delayed_record(dt_optimizer *o, long long step, int decay, double lr, float gscale, size_t k,
                            float *param, const float *g, size_t n) {
    dt_delayed *dl = o->delayed;
    if (dl->npieces == dl->cap) { /* grows during the first delayed step only: the pieces repeat */
        int cap = dl->cap ? 2 * dl->cap : 64;
        piece *p = realloc(dl->pieces, (size_t)cap * sizeof *p);
        if (!p) return dt_fail(DT_ERUNTIME, "out of memory (delayed update)");
        dl->pieces = p;
        dl->cap = cap;
    }
    dl->pieces[dl->npieces++] = (piece){step, decay, lr, gscale, k, n, param};
    size_t e = dt_elem_bytes(o->ops);
    for (size_t i = 0; i < n; i += o->chunk) { /* a chunk at a time: a device's bf16 crosses through pbuf */
        size_t c = n - i < o->chunk ? n - i : o->chunk;
        dt_optimizer_to_host_f32(o, dl->grads + k + i, (const char *)g + i * e, c);
    }
    /* without master weights the parameters are the fp32 host weights: the pass updates a copy */
    if (!o->has_master) memcpy(dl->weights + k, param, n * sizeof(float));
    return DT_OK;
}

dt_status dt_delayed_launch(dt_optimizer *o) {
    dt_delayed *dl = o->delayed;
    dl->threads = omp_get_max_threads();
    if (!dl->running) { /* signals stay with the training thread (signals.c): blocked in this one */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int r = pthread_create(&dl->thread, NULL, worker, o);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (r != 0) return dt_fail(DT_ERUNTIME, "delayed update: pthread_create failed");
        dl->running = 1;
    }
    pthread_mutex_lock(&dl->mu);
    dl->busy = 1;
    dl->unapplied = 1;
    dl->result = DT_OK;
    pthread_cond_broadcast(&dl->cv);
    pthread_mutex_unlock(&dl->mu);
    return DT_OK;
}

dt_status dt_delayed_settle(dt_optimizer *o) {
    dt_delayed *dl = o->delayed;
    if (!dl || !dl->unapplied) return DT_OK;
    pthread_mutex_lock(&dl->mu);
    while (dl->busy) pthread_cond_wait(&dl->cv, &dl->mu);
    dt_status s = dl->result;
    pthread_mutex_unlock(&dl->mu);
    dl->unapplied = 0;
    if (s != DT_OK) return dt_fail(s, "%s", dl->msg); /* the thread's message (first failure wins) */
    for (int p = 0; p < dl->npieces; p++) { /* the weights the pass produced become the parameters */
        const piece *q = &dl->pieces[p];
        if (!o->has_master) {
            memcpy(q->param, dl->weights + q->k, q->n * sizeof(float));
            continue;
        }
        size_t e = dt_elem_bytes(o->ops);
        for (size_t i = 0; i < q->n; i += o->chunk) {
            size_t c = q->n - i < o->chunk ? q->n - i : o->chunk;
            DT_TRY(dt_optimizer_put_params(o, (char *)q->param + i * e, dl->weights + q->k + i, c));
        }
    }
    return DT_OK;
}

int dt_delayed_pending(const dt_optimizer *o) { return o->delayed && o->delayed->unapplied; }

size_t dt_delayed_host_bytes(const dt_optimizer *o) {
    return o->delayed ? 2 * o->nt * sizeof(float) : 0; /* the trainable elements (adamw.c's moment order) */
}

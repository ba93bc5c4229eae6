/* AdamW with decoupled weight decay on 2-D weights only, global-norm gradient
 * clipping and the learning-rate schedule (linear warmup, cosine decay to min_lr).
 * The optimizer is an object over the elements a data-parallel strategy owns (the whole
 * flat model, or a ZeRO shard): the strategy drives it piece by piece, and computes the
 * global norm with dt_grad_norm_of over the pieces it holds and a reduction over the
 * groups that hold the others. */
#ifndef DT_OPTIMIZER_H
#define DT_OPTIMIZER_H
#include <stddef.h>

#include "../backend/ops.h"
#include "../core/status.h"
#include "../model/gpt.h"
#include "../offload/store.h"

typedef struct {
    double lr, min_lr, beta1, beta2, eps, weight_decay, grad_clip;
    int warmup_steps, total_steps;
} dt_adamw_hparams;

/* AdamW state over n owned elements: the moments (and fp32 master weights where the
 * parameters are not fp32 host memory) in the backend's memory, or offloaded (ZeRO-Offload,
 * ZeRO-Infinity: docs/offload.md) to a store in host memory or on NVMe (offload/store.h),
 * where the update runs on the host, streamed block by block, with the same arithmetic
 * (the CPU's AdamW kernel), so a run with offload has the same bits as one without (fp32
 * on the CPU and the emulated device; bf16 widened and rounded as the bf16 kernels do). */
/* A range [k, k + n) of an optimizer's owned elements. */
typedef struct {
    size_t k, n;
} dt_opt_range;

typedef struct {
    dt_adamw_hparams hp;
    const dt_ops *ops;
    size_t n;
    int moments;    /* this rank updates (ps's peers keep no moments) */
    /* Frozen elements (train.freeze): no moments. The moments (and an offload store's
     * fields) hold the nt others in order, element k at k minus the frozen ones below it;
     * an offloaded state's frozen master weights are apart, in fmaster (host fp32, in
     * order). */
    size_t nt;
    dt_opt_range *frozen; /* sorted, disjoint (nfrozen of them) */
    int nfrozen;
    float *fmaster;
    int has_master; /* fp32 master weights apart from the parameters */
    float *m, *v;   /* first and second moments in the backend's memory (NULL: offloaded or none) */
    float *master;  /* fp32 master weights in the backend's memory (NULL: offloaded, or the parameters are the weights) */
    /* offloaded (store != NULL): fields of the store, -1 where absent */
    dt_store *store;
    int f_master, f_m, f_v;
    size_t chunk;   /* elements the host handles at a time (a block, at most) */
    float *gbuf;    /* host fp32: a chunk's gradients (a device's, or widened from bf16) */
    void (*host_free)(void *p); /* what the host buffers (gbuf, pbuf, the delayed update's) came from (NULL: free) */
    void *ghost;    /* gradients handed over during backward (grads_early): n in storage precision, host */
    size_t ghost_n; /* elements handed over for the coming pass (all n: the pass reads ghost) */
    size_t ghost_backward_n; /* of those, handed over before backward ended (dt_optimizer_backward_done) */
    void *pbuf;     /* host: a chunk's updated parameters in storage precision, for the upload */
    int params_host; /* the parameters the update writes are host memory (an offloaded ZeRO-3 shard) */
    int in_pass;
    struct dt_delayed *delayed; /* the delayed update (offloaded, asked for; delayed_update.c), else NULL */
    int delaying;               /* the update under way is delayed (recorded, run by the thread) */
    int delay_next;             /* the next update may be delayed (dt_optimizer_delay_next) */
} dt_optimizer;

/* Where an optimizer keeps its state: store.kind 0 = the backend's memory; params_host:
 * the parameters are offloaded too (they live in host memory or NVMe: the strategy hands
 * the update host pointers), so fp32 master weights are kept whatever the precision. */
typedef struct {
    dt_store_opts store;
    int params_host;
    int delayed; /* ZeRO-Offload's delayed parameter update (needs a store, not params_host) */
    int grads_early; /* the strategy hands the gradients over as they become final (dt_optimizer_grads_ready) */
} dt_optimizer_offload;

/* moments: this rank updates (else only the master weights, which bf16 keeps on every
 * rank); what: appended to the buffers' names (" (shard)"); off: where the state lives
 * (NULL or store kind 0: the backend's memory); frozen (nfrozen ranges, sorted and
 * disjoint; NULL: none): owned elements of frozen tensors, which get no moments (their
 * weights are kept; updates never touch them, and their moments read as zeros). Zero-filled;
 * on failure dt_optimizer_free releases what was allocated. */
dt_status dt_optimizer_create(dt_optimizer *o, const dt_ops *ops, const dt_adamw_hparams *hp, size_t n, int moments,
                              const char *what, const dt_optimizer_offload *off, const dt_opt_range *frozen,
                              int nfrozen);
void dt_optimizer_free(dt_optimizer *o);
/* An update is a pass over owned elements in ascending order: begin, step_range or
 * step_model calls, end (offloaded: the blocks are read ahead and written back; nothing
 * in memory). With the delayed update (docs/offload.md) begin first settles the previous
 * update (waits for it, and its weights replace the parameters), and an update allowed to
 * be delayed only records its gradients: end hands the pass to a host thread, and the
 * parameters keep their values until the next begin. Every other access to the state
 * (get/set below) settles first. */
dt_status dt_optimizer_begin(dt_optimizer *o);
dt_status dt_optimizer_end(dt_optimizer *o);
/* Gradients of owned elements [k, k + n) (storage precision, the backend's memory) are
 * final for this step: with an offloaded state on a device (or in bf16) created with
 * grads_early, they start their way to host memory now (a device's copy overlaps the
 * compute queued after it), and when every owned element has been handed over the pass
 * reads them there instead of downloading a chunk at a time. Nothing to do otherwise. */
void dt_optimizer_grads_ready(dt_optimizer *o, size_t k, const float *g, size_t n);
/* The same for gradients whose final values (storage precision) are in host memory
 * already, at host: a staging buffer the reduction left them in, so nothing is copied off
 * the device again. */
void dt_optimizer_grads_ready_host(dt_optimizer *o, size_t k, const void *host, size_t n);
/* Backward has ended (the engine, before the strategy's reduction): what was handed over
 * so far was handed over during backward, overlapping it. */
void dt_optimizer_backward_done(dt_optimizer *o);
/* Bytes of gradients the updates so far read where they were handed over (every owned
 * element handed over before the pass), all optimizers of the process together. */
double dt_optimizer_grads_early_bytes(void);
/* Of those, the bytes handed over during backward. */
double dt_optimizer_grads_backward_bytes(void);
/* Whether the next update may be delayed (no effect without a delayed update); an update
 * after which the state is read (a checkpoint, the last step) runs at once. */
void dt_optimizer_delay_next(dt_optimizer *o, int allow);
/* Waits for a delayed update in flight and applies it (nothing to do without one). */
dt_status dt_optimizer_settle(dt_optimizer *o);
/* A delayed update has been handed to the thread and not applied yet. */
int dt_optimizer_pending(const dt_optimizer *o);
/* One AdamW step at 1-based step `step` on owned elements [k, k + n), none of them frozen (decay: a 2-D
 * weight), gradient g·gscale (storage precision, the backend's memory): the weights are
 * the master weights' [k, k + n) with param their copy in storage precision, or param
 * itself (fp32). */
dt_status dt_optimizer_step_range(dt_optimizer *o, long long step, int decay, double lr, float gscale, size_t k,
                                  float *param, const float *g, size_t n);
/* The step over every tensor of a model whose flat layout the state spans (k = the
 * tensor's offset; m->params and m->grads), begin and end included. */
dt_status dt_optimizer_step_model(dt_optimizer *o, long long step, const gpt_model *m, double lr, float gscale);

/* Random access outside an update (init, load, saves, the digest), host fp32 on the
 * caller's side: the weights of owned elements [k, k + n) (the master weights, or the
 * parameters at param, fp32 in the backend's memory); set writes the master weights (if
 * any) and, param not NULL, the parameters' copy in storage precision there. */
dt_status dt_optimizer_get_weights(dt_optimizer *o, size_t k, size_t n, const float *param, float *dst);
dt_status dt_optimizer_set_weights(dt_optimizer *o, size_t k, size_t n, const float *src, float *param);
/* n fp32 host values as the parameters' copy in storage precision at param (the backend's
 * memory, or host memory with params_host). */
dt_status dt_optimizer_put_params(const dt_optimizer *o, void *param, const float *src, size_t n);
/* Moment which (0: first, 1: second) of owned elements [k, k + n), to or from host fp32. */
dt_status dt_optimizer_get_moments(dt_optimizer *o, int which, size_t k, size_t n, float *dst);
dt_status dt_optimizer_set_moments(dt_optimizer *o, int which, size_t k, size_t n, const float *src);
/* Bytes of the offloaded state in host memory (the state, or NVMe's buffers, the staging
 * of a chunk, the delayed update's copies, the frozen master weights) and in the offload
 * file (0, 0: not offloaded). */
void dt_optimizer_offload_bytes(const dt_optimizer *o, size_t *host, size_t *file);
/* Bytes of the moments (in the backend's memory or offloaded). */
size_t dt_optimizer_moment_bytes(const dt_optimizer *o);

/* Learning rate for 0-based step s. */
double dt_lr_at(const dt_adamw_hparams *hp, long long s);

/* One piece of the gradient a rank holds: n storage-precision elements at x, its squares
 * added to partial sum cls (< 0: not counted, a tied copy counted elsewhere). */
typedef struct {
    const float *x;
    size_t n;
    int cls;
} dt_grad_piece;
/* Combines this rank's partial sums of squares over the groups that hold the other
 * pieces into the global norm (fn NULL: this rank holds all of it). */
typedef struct {
    dt_status (*fn)(void *ctx, double *part, int nparts, double *norm);
    void *ctx;
} dt_norm_reduce;
enum { DT_NORM_MAX_PARTS = 4 };
/* The global gradient norm: each piece's sum of squares added, in order, to its partial
 * (nparts of them, from 0.0), then reduced (or the square root of part[0]). */
dt_status dt_grad_norm_of(const dt_ops *ops, const dt_grad_piece *pieces, int npieces, int nparts, dt_norm_reduce r,
                          double *norm);
/* Global L2 norm of n gradients this rank holds whole. */
double dt_grad_norm(const dt_ops *ops, const float *grads, size_t n);
/* The factor that brings the gradient norm to at most clip (torch's clip_grad_norm_ rule:
 * clip / (norm + 1e-6) when that is below 1; 1 otherwise or when clip <= 0). The update
 * applies it to each gradient element as it reads it. */
float dt_clip_coef(double norm, double clip);
/* AdamW on n elements of one tensor (decay: it is a 2-D weight) at 1-based step `step`,
 * with gradient g·gscale: the one place the update and its bias correction are spelled out.
 * p_store: where the bf16 copy of p goes (NULL in fp32). */
void dt_adamw_range(const dt_adamw_hparams *hp, const dt_ops *ops, long long step, int decay, double lr, float gscale,
                    float *p, float *p_store, const float *g, float *m, float *v, size_t n);

#endif

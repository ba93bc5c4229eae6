/* AdamW with decoupled weight decay on 2-D weights only, global-norm gradient
 * clipping and the learning-rate schedule (linear warmup, cosine decay to min_lr).
 * The optimizer works on a flat range of the parameter buffer, so a ZeRO wrapper can
 * hand it just the shard a rank owns. */
#ifndef DT_OPTIMIZER_H
#define DT_OPTIMIZER_H
#include <stddef.h>

#include "../backend/ops.h"
#include "../core/status.h"
#include "../model/gpt.h"

typedef struct {
    double lr, min_lr, beta1, beta2, eps, weight_decay, grad_clip;
    int warmup_steps, total_steps;
} dt_adamw_hparams;

typedef struct {
    dt_adamw_hparams hp;
    size_t n;        /* elements covered (the whole parameter buffer here) */
    float *m, *v;    /* first and second moments */
    long long step;  /* optimizer steps taken */
} dt_adamw;

dt_status dt_adamw_create(dt_adamw *o, const dt_adamw_hparams *hp, size_t n);
void dt_adamw_destroy(dt_adamw *o);
/* Learning rate for 0-based step s. */
double dt_lr_at(const dt_adamw_hparams *hp, long long s);
/* Global L2 norm of the gradient. */
double dt_grad_norm(const dt_ops *ops, const float *grads, size_t n);
/* Scales gradients so their norm is at most clip (torch's clip_grad_norm_ rule). */
void dt_clip_grads(const dt_ops *ops, float *grads, size_t n, double norm, double clip);
/* One AdamW step over every tensor of the model at learning rate lr. */
void dt_adamw_step(dt_adamw *o, const dt_ops *ops, const gpt_model *m, double lr);

#endif

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

/* Moments over the model's flat layout; their storage belongs to the caller (the
 * data-parallel engine, which also shards them for ZeRO). */
typedef struct {
    dt_adamw_hparams hp;
    float *m, *v;    /* first and second moments */
    float *master;   /* fp32 master weights when the model's are bf16 (NULL: the model's own) */
    long long step;  /* optimizer steps taken */
} dt_adamw;
/* Learning rate for 0-based step s. */
double dt_lr_at(const dt_adamw_hparams *hp, long long s);
/* Global L2 norm of the gradient. */
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
/* One AdamW step over every tensor of the model at learning rate lr, gradients times gscale. */
void dt_adamw_step(dt_adamw *o, const dt_ops *ops, const gpt_model *m, double lr, float gscale);

#endif

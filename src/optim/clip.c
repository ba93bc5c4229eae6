#include <math.h>

#include "optimizer.h"

double dt_grad_norm(const dt_ops *ops, const float *grads, size_t n) { return sqrt(ops->sumsq(grads, n)); }

void dt_clip_grads(const dt_ops *ops, float *grads, size_t n, double norm, double clip) {
    if (clip <= 0.0) return;
    double coef = clip / (norm + 1e-6);
    if (coef < 1.0) ops->scale(grads, (float)coef, n);
}

#include <math.h>

#include "optimizer.h"

double dt_grad_norm(const dt_ops *ops, const float *grads, size_t n) { return sqrt(ops->sumsq(grads, n)); }

float dt_clip_coef(double norm, double clip) {
    if (clip <= 0.0) return 1.0f;
    double coef = clip / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}

#include <math.h>

#include "optimizer.h"

dt_status dt_grad_norm_of(const dt_ops *ops, const dt_grad_piece *pieces, int npieces, int nparts, dt_norm_reduce r,
                          double *norm) {
    double part[DT_NORM_MAX_PARTS] = {0.0};
    if (nparts < 1 || nparts > DT_NORM_MAX_PARTS) return dt_fail(DT_ERUNTIME, "gradient norm: %d partial sums", nparts);
    for (int i = 0; i < npieces; i++)
        if (pieces[i].cls >= 0 && pieces[i].cls < nparts) part[pieces[i].cls] += ops->sumsq(pieces[i].x, pieces[i].n);
    if (r.fn) return r.fn(r.ctx, part, nparts, norm);
    *norm = sqrt(part[0]);
    return DT_OK;
}

double dt_grad_norm(const dt_ops *ops, const float *grads, size_t n) {
    dt_grad_piece p = {grads, n, 0};
    double norm = 0.0;
    dt_status s = dt_grad_norm_of(ops, &p, 1, 1, (dt_norm_reduce){NULL, NULL}, &norm);
    (void)s; /* one partial, no reduction: cannot fail */
    return norm;
}

float dt_clip_coef(double norm, double clip) {
    if (clip <= 0.0) return 1.0f;
    double coef = clip / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}

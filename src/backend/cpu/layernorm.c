#include <math.h>

#include "cpu.h"

void cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N,
                       int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float s = 0.0f;
        for (int c = 0; c < C; c++) s += x[c];
        float m = s / C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            v += d * d;
        }
        float r = 1.0f / sqrtf(v / C + 1e-5f);
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + b[c];
        mean[i] = m;
        rstd[i] = r;
    }
}

void cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                       const float *mean, const float *rstd, int N, int C) {
    if (dinp) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        float m = mean[i], r = rstd[i];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float n = (x[c] - m) * r;
            float dn = w[c] * dy[c];
            dnorm_mean += dn;
            dnorm_norm_mean += dn * n;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        float *dx = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) {
            float n = (x[c] - m) * r;
            float dn = w[c] * dy[c];
            dx[c] += (dn - dnorm_mean - n * dnorm_norm_mean) * r;
        }
    }
    }
    if (!dw) return; /* a split backward's input half */
    /* weight/bias gradients: by column block, so the summation order is fixed */
    enum { CB = 64 };
    int nb = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nb; blk++) {
        int c0 = blk * CB, c1 = c0 + CB < C ? c0 + CB : C;
        float aw[CB], ab[CB];
        for (int c = c0; c < c1; c++) aw[c - c0] = ab[c - c0] = 0.0f;
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
            float m = mean[i], r = rstd[i];
            for (int c = c0; c < c1; c++) {
                aw[c - c0] += (x[c] - m) * r * dy[c];
                ab[c - c0] += dy[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dw[c] += aw[c - c0];
            db[c] += ab[c - c0];
        }
    }
}

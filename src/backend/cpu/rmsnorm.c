/* RMSNorm (Llama): y = x / sqrt(mean(x²) + eps) · w, no mean subtracted, no bias. The
 * row's 1/rms is kept for the backward; the weight gradient is summed by column block in
 * row order, so its summation order does not depend on the thread count. */
#include <math.h>

#include "cpu.h"

void cpu_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float ss = 0.0f;
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        float r = 1.0f / sqrtf(ss / C + eps);
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = x[c] * r * w[c];
        rstd[i] = r;
    }
}

void cpu_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                     int N, int C) {
    if (dinp) {
        /* dx = r·(w∘dy) - x·r³·mean(x·w∘dy) */
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
            float r = rstd[i], dot = 0.0f;
            for (int c = 0; c < C; c++) dot += x[c] * w[c] * dy[c];
            float k = dot / C * r * r * r;
            float *dx = dinp + (size_t)i * C;
            for (int c = 0; c < C; c++) dx[c] += w[c] * dy[c] * r - x[c] * k;
        }
    }
    if (!dw) return;
    enum { CB = 64 };
    int nb = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nb; blk++) {
        int c0 = blk * CB, c1 = c0 + CB < C ? c0 + CB : C;
        float aw[CB];
        for (int c = c0; c < c1; c++) aw[c - c0] = 0.0f;
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
            float r = rstd[i];
            for (int c = c0; c < c1; c++) aw[c - c0] += x[c] * r * dy[c];
        }
        for (int c = c0; c < c1; c++) dw[c] += aw[c - c0];
    }
}

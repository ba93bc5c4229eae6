#include <math.h>

#include "cpu.h"
#include "fastmath.h"

void cpu_softmax_xent(float *logits, float *losses, const uint16_t *targets, int N, int V, int Vp, float scale) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *x = logits + (size_t)i * Vp;
        int t = targets[i];
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
        float xt = x[t];
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < V; j++) {
            float e = dt_expf(x[j] - mx);
            x[j] = e;
            sum += e;
        }
        losses[i] = logf(sum) + mx - xt;
        if (scale != 0.0f) {
            float inv = scale / sum;
#pragma omp simd
            for (int j = 0; j < V; j++) x[j] *= inv;
            x[t] -= scale;
            for (int j = V; j < Vp; j++) x[j] = 0.0f;
        }
    }
}

#include <math.h>

#include "cpu.h"
#include "fastmath.h"

void cpu_softmax_xent(float *logits, float *losses, const dt_token *targets, int N, int V, int Vp, float scale) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *x = logits + (size_t)i * Vp;
        int t = targets[i];
        if (t < 0) { /* DT_IGNORE: not in the loss */
            losses[i] = 0.0f;
            if (scale != 0.0f)
                for (int j = 0; j < Vp; j++) x[j] = 0.0f;
            continue;
        }
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

void cpu_xent_rowmax(const float *logits, float *mx, int N, int Vl, int real) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * Vl;
        float m = -INFINITY;
        for (int j = 0; j < real; j++) m = x[j] > m ? x[j] : m;
        mx[i] = m;
    }
}

void cpu_xent_rowsum(const float *logits, const float *mx, const dt_token *targets, float *st, int N, int Vl, int real,
                     int v0) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * Vl;
        float m = mx[i], sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < real; j++) sum += dt_expf(x[j] - m);
        int t = targets[i] - v0;
        st[2 * i] = sum;
        st[2 * i + 1] = t >= 0 && t < real ? x[t] : 0.0f;
    }
}

void cpu_xent_finish(float *logits, float *losses, const float *mx, const float *st, const dt_token *targets, int N,
                     int Vl, int real, int v0, float scale) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *x = logits + (size_t)i * Vl;
        float m = mx[i], sum = st[2 * i];
        if (targets[i] < 0) { /* DT_IGNORE: not in the loss */
            losses[i] = 0.0f;
            if (scale != 0.0f)
                for (int j = 0; j < Vl; j++) x[j] = 0.0f;
            continue;
        }
        losses[i] = logf(sum) + m - st[2 * i + 1];
        if (scale == 0.0f) continue;
        float inv = scale / sum;
#pragma omp simd
        for (int j = 0; j < real; j++) x[j] = dt_expf(x[j] - m) * inv;
        for (int j = real; j < Vl; j++) x[j] = 0.0f;
        int t = targets[i] - v0;
        if (t >= 0 && t < real) x[t] -= scale;
    }
}

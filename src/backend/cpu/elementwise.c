/* Embedding, GELU, residual add, norms and scaling. Reductions are split by fixed
 * chunks (never by thread) so results do not depend on the thread count. */
#include <math.h>
#include <stdlib.h>

#include "../../core/bf16.h"
#include "cpu.h"
#include "fastmath.h"

void cpu_embed_fwd(float *out, const dt_token *tok, const float *wte, const float *wpe, int B, int T, int C, int v0,
                   int rows) {
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int id = tok[bt] - v0;
        const float *e = id >= 0 && id < rows ? wte + (size_t)id * C : NULL;
        const float *p = wpe ? wpe + (size_t)(bt % T) * C : NULL;
        float *o = out + (size_t)bt * C;
        if (e && p)
            for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
        else
            for (int c = 0; c < C; c++) o[c] = e ? e[c] : p ? p[c] : 0.0f;
    }
}

void cpu_embed_bwd(float *dwte, float *dwpe, const float *dout, const dt_token *tok, int B, int T, int C, int v0,
                   int rows) {
    /* channel blocks per thread: tokens repeat, so rows cannot be split without races */
    enum { CB = 32 };
    int nb = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nb; blk++) {
        int c0 = blk * CB, c1 = c0 + CB < C ? c0 + CB : C;
        for (int bt = 0; bt < B * T; bt++) {
            const float *d = dout + (size_t)bt * C;
            int id = tok[bt] - v0;
            if (id >= 0 && id < rows) {
                float *e = dwte + (size_t)id * C;
                for (int c = c0; c < c1; c++) e[c] += d[c];
            }
            if (dwpe) {
                float *p = dwpe + (size_t)(bt % T) * C;
                for (int c = c0; c < c1; c++) p[c] += d[c];
            }
        }
    }
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

void cpu_gelu_fwd(float *out, const float *inp, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + dt_tanhf(u));
    }
}

void cpu_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + 0.044715f * x * x * x);
        float th = dt_tanhf(u);
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = g * dout[i];
    }
}

/* SwiGLU (Llama's MLP): out = silu(gate)·up, silu(g) = g·sigmoid(g) */
void cpu_swiglu_fwd(float *out, const float *gate, const float *up, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void cpu_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], sg = 1.0f / (1.0f + expf(-g)), d = dout[i];
        float u = up[i]; /* everything read before anything is written: dgate or dup may be dout */
        dup[i] = d * g * sg;
        dgate[i] = d * u * sg * (1.0f + g * (1.0f - sg));
    }
}

void cpu_add(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_add_rows(float *out, int ldo, const float *a, int lda, const float *b, int ldb, int rows, int n) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < rows; i++) {
        float *o = out + (size_t)i * ldo;
        const float *x = a + (size_t)i * lda, *y = b ? b + (size_t)i * ldb : NULL;
        for (int j = 0; j < n; j++) o[j] = y ? x[j] + y[j] : x[j];
    }
}

double cpu_sumsq(const float *x, size_t n) {
    enum { CHUNK = 1 << 16 };
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
    double stackbuf[256];
    double *part = nchunks <= 256 ? stackbuf : malloc(nchunks * sizeof(double));
    if (!part) { /* tiny allocation; fall back to a serial sum rather than fail */
        double s = 0;
        for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
        return s;
    }
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < nchunks; k++) {
        size_t i0 = k * CHUNK, i1 = i0 + CHUNK < n ? i0 + CHUNK : n;
        /* 16 independent partial sums: one chain of dependent adds ran at a sixth of the
         * memory bandwidth */
        double s[16] = {0};
        size_t i = i0;
        for (; i + 16 <= i1; i += 16)
            for (int j = 0; j < 16; j++) s[j] += (double)x[i + j] * x[i + j];
        for (; i < i1; i++) s[0] += (double)x[i] * x[i];
        for (int w = 8; w > 0; w /= 2)
            for (int j = 0; j < w; j++) s[j] += s[j + w];
        part[k] = s[0];
    }
    double s = 0;
    for (size_t k = 0; k < nchunks; k++) s += part[k];
    if (part != stackbuf) free(part);
    return s;
}

double cpu_sum(const float *x, size_t n) { /* in index order: the loss digest depends on it */
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += x[i];
    return s;
}

void cpu_adamw(float *p, float *p_store, const float *g, float *m, float *v, size_t n, float lr, float beta1,
               float beta2, float eps, float wd, float bc1, float bc2, float gscale) {
    uint16_t *p16 = (uint16_t *)p_store; /* the bf16 copy, when there is one */
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gscale; /* rounded like a separate clipping pass: same bits */
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
        if (p16) p16[i] = dt_f32_to_bf16(p[i]);
    }
}

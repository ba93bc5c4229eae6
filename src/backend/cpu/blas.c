/* GEMM and linear layers through CBLAS (Debian's OpenBLAS, OpenMP build: inside an
 * OpenMP parallel region it runs single-threaded, so kernels may call it per head). */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu.h"

extern char *openblas_get_config(void);
extern char *openblas_get_corename(void);
extern void openblas_set_num_threads(int);

void cpu_gemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc) {
    if (M == 0 || N == 0) return;
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, M, N, K, alpha,
                A, lda, B, ldb, beta, C, ldc);
}

void cpu_linear_fwd_by(cpu_gemm_fn *gemm, float *out, const float *inp, const float *w, const float *bias, int N,
                       int IC, int OC) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++)
            for (int o = 0; o < OC; o++) out[(size_t)i * OC + o] = bias[o];
        beta = 1.0f;
    }
    gemm(0, 0, N, OC, IC, 1.0f, inp, IC, w, OC, beta, out, OC);
}

void cpu_linear_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC) {
    cpu_linear_fwd_by(cpu_gemm, out, inp, w, bias, N, IC, OC);
}

void cpu_linear_bwd_by(cpu_gemm_fn *gemm, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                       const float *w, int N, int IC, int OC, int acc_dinp) {
    if (dinp) gemm(0, 1, N, IC, OC, 1.0f, dout, OC, w, OC, acc_dinp ? 1.0f : 0.0f, dinp, IC);
    if (dw) gemm(1, 0, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dw, OC);
    if (dbias) cpu_colsum_acc(dbias, dout, N, OC);
}

void cpu_linear_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w, int N,
                    int IC, int OC, int acc_dinp) {
    cpu_linear_bwd_by(cpu_gemm, dinp, dw, dbias, dout, inp, w, N, IC, OC, acc_dinp);
}

/* dst[c] += sum_i src[i][c]; split by columns so the order of additions does not
 * depend on the thread count */
void cpu_colsum_acc(float *dst, const float *src, int N, int C) {
    enum { CB = 64 };
    int nb = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < nb; b++) {
        float acc[CB];
        int c0 = b * CB, c1 = c0 + CB < C ? c0 + CB : C;
        for (int c = c0; c < c1; c++) acc[c - c0] = 0.0f;
        for (int i = 0; i < N; i++) {
            const float *row = src + (size_t)i * C;
            for (int c = c0; c < c1; c++) acc[c - c0] += row[c];
        }
        for (int c = c0; c < c1; c++) dst[c] += acc[c - c0];
    }
}

void dt_cpu_set_threads(int n) {
    if (n <= 0) return;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

const char *dt_cpu_blas_info(void) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s, kernel %s", openblas_get_config(), openblas_get_corename());
    return buf;
}

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double dt_cpu_sgemm_peak(double seconds) {
    enum { N = 512 };
    float *a = malloc(3 * sizeof(float) * N * N);
    if (!a) return 0.0;
    float *b = a + N * N, *c = b + N * N;
    for (size_t i = 0; i < 2 * (size_t)N * N; i++) a[i] = (float)(i % 7) * 0.125f - 0.375f;
    double best = 0.0, start = wall();
    /* the first product pays for first touch and thread start-up: never the best */
    for (int k = 0; k < 3 || wall() - start < seconds; k++) {
        double t0 = wall();
        cpu_gemm(0, 0, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
        double dt = wall() - t0, rate = dt > 0 ? 2.0 * N * N * N / dt : 0.0;
        if (k > 0 && rate > best) best = rate;
        if (k > 1000) break;
    }
    free(a);
    return best;
}

/* GEMM and linear layers through CBLAS (Debian's OpenBLAS, OpenMP build: inside an
 * OpenMP parallel region it runs single-threaded, so kernels may call it per head). */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

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

void cpu_linear_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++)
            for (int o = 0; o < OC; o++) out[(size_t)i * OC + o] = bias[o];
        beta = 1.0f;
    }
    cpu_gemm(0, 0, N, OC, IC, 1.0f, inp, IC, w, OC, beta, out, OC);
}

void cpu_linear_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w, int N,
                    int IC, int OC, int acc_dinp) {
    if (dinp) cpu_gemm(0, 1, N, IC, OC, 1.0f, dout, OC, w, OC, acc_dinp ? 1.0f : 0.0f, dinp, IC);
    if (dw) cpu_gemm(1, 0, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dw, OC);
    if (dbias) cpu_colsum_acc(dbias, dout, N, OC);
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

int dt_cpu_threads(void) { return omp_get_max_threads(); }

const char *dt_cpu_blas_info(void) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s, kernel %s", openblas_get_config(), openblas_get_corename());
    return buf;
}

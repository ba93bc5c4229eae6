/* GEMM whose bits do not depend on the thread count (parallel.determinism bitwise).
 *
 * OpenBLAS's threaded driver splits K into blocks otherwise than its serial one once K
 * passes its block size (GEMM_Q, 320 floats here): with K = 360, one thread sums
 * 192 + 168 and two threads 180 + 180, so the same product gave other bits with other
 * threads. Here C is cut into tiles of a fixed size, set by the shape alone, and each
 * tile is one single-threaded BLAS call (inside an OpenMP region OpenBLAS runs on the
 * calling thread) over the whole of K: the threads only choose who computes a tile,
 * never how. tests/test_fixed_kernels.c checks it for 1, 2 and 3 threads. */
#include "cpu.h"

/* The tiles of an M x N output: at most TILES of them, none narrower than MIN_SIDE (a small
 * product is one tile), and among the splits with TILES tiles the one that packs least.
 * Each tile packs its own rows of A and columns of B (K x (rows + columns) floats), so a
 * split into pm x pn tiles packs K x (pn·M + pm·N) where OpenBLAS alone packs K x (M + N):
 * a wide output (the head's logits) is cut along N only, a square one into 4 x 4. Set by
 * the shape alone, never by the thread count; TILES bounds the threads a product uses. */
enum { TILES = 16, MIN_SIDE = 64, ALIGN = 16 };

static int side(int n, int parts) { return ((n + parts - 1) / parts + ALIGN - 1) / ALIGN * ALIGN; }

static void split(int M, int N, int tiles, int *tm, int *tn) {
    double best = -1.0;
    *tm = M, *tn = N;
    for (int pm = 1; pm <= tiles; pm *= 2) {
        int pn = tiles / pm, sm = side(M, pm), sn = side(N, pn);
        if ((pm > 1 && sm < MIN_SIDE) || (pn > 1 && sn < MIN_SIDE)) continue;
        double packed = (double)pn * M + (double)pm * N;
        if (best < 0 || packed < best) best = packed, *tm = sm, *tn = sn;
    }
    if (best < 0) { /* too small for the tiles asked: fewer, along the longer side */
        if (M >= N) *tm = M / MIN_SIDE > 1 ? side(M, M / MIN_SIDE) : M;
        else *tn = N / MIN_SIDE > 1 ? side(N, N / MIN_SIDE) : N;
    }
}

void cpu_gemm_tiled(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc) {
    if (M == 0 || N == 0) return;
    cpu_gemm_blocks_tiled(transA, transB, M, N, K, alpha, &A, lda, &B, ldb, beta, &C, ldc, 1, 1);
}

/* The blocks of a product that bitwise mode cuts into canon blocks: TILES over the
 * product, so TILES / canon per block (at least one), whichever of them this rank runs:
 * the blocks themselves are the parallel work, and each block packs its inputs fewer times
 * than split into TILES (GPT-2 small's c_attn: 12 blocks of 192 columns, each one tile
 * instead of 16). */
void cpu_gemm_blocks_tiled(int transA, int transB, int M, int N, int K, float alpha, const float *const *A, int lda,
                           const float *const *B, int ldb, float beta, float *const *C, int ldc, int count, int canon) {
    if (M == 0 || N == 0 || count <= 0) return;
    int TM, TN;
    split(M, N, canon < TILES ? TILES / (canon > 0 ? canon : 1) : 1, &TM, &TN);
    int tm = (M + TM - 1) / TM, tn = (N + TN - 1) / TN, per = tm * tn;
    /* always a parallel region, one tile or many: outside one, OpenBLAS would thread the call */
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < per * count; t++) {
        int blk = t / per, i0 = t % per / tn * TM, j0 = t % tn * TN;
        int m = M - i0 < TM ? M - i0 : TM, n = N - j0 < TN ? N - j0 : TN;
        const float *a = transA ? A[blk] + i0 : A[blk] + (size_t)i0 * lda;
        const float *b = transB ? B[blk] + (size_t)j0 * ldb : B[blk] + j0;
        cpu_gemm(transA, transB, m, n, K, alpha, a, lda, b, ldb, beta, C[blk] + (size_t)i0 * ldc + j0, ldc);
    }
}

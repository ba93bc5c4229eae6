/* CPU AdamW throughput against memory bandwidth, for bench_offload.sh (issue 26, bench a).
 * usage: adamw_bench N THREADS [REPS] [STEP]
 *   N elements per array (p, g, m, v fp32; the bf16 copy 2 bytes), THREADS OpenMP threads,
 *   REPS timed repetitions of each kernel (interleaved, so a load change hits every kernel alike;
 *   best and median kept), STEP the optimizer step whose bias corrections the update uses
 *   (default 1000: bc1 is then 1.0f, as it is from step 165 on with beta1 = 0.9).
 * Prints one tab-separated "row" line per kernel: name, bytes per element, best GB/s, median GB/s
 * (GB = 1e9 bytes counted as STREAM counts them: each array read or written once per element);
 * then "incache" lines (the same kernels on arrays that fit L2: the compute ceiling) and "check"
 * lines (the bench's own kernels against the library's, bit for bit).
 *
 * Kernels (every one over the same arrays, first-touched by the same threads, same schedule):
 *   triad        STREAM triad a = b + s·c on p, g, m: 12 B/elem as STREAM counts (its store
 *                also costs a read for ownership the count leaves out: the real traffic is 16 B)
 *   stream7      AdamW's memory pattern with no arithmetic to speak of: p, m, v += s·g, i.e. 4
 *                arrays read, 3 written back in place = 28 B/elem, all of it real traffic (the
 *                written lines were read anyway). The fair reference for AdamW: same arrays,
 *                same read/write mix, same count; the triad is printed beside it.
 *   stream7_bf16 stream7 plus a 2-byte store per element (the bf16 copy): 30 B/elem
 *   adamw        dt_ops_cpu()->adamw, the library's kernel, p_store NULL: 28 B/elem
 *   adamw_bf16   the same with the bf16 copy written: 30 B/elem
 *   adamw_unitbc a candidate change (not in the library): the same update with the division
 *                by a bias correction skipped where it is exactly 1.0f (x / 1.0f == x in IEEE
 *                for every x, so the bits cannot change); checked bitwise below. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/ops.h"
#include "core/bf16.h"
#include "core/timer.h"

typedef struct {
    float *p, *g, *m, *v;
    uint16_t *p16;
    size_t n;
} arrays;

/* hyper-parameters as src/optim/adamw.c passes them */
static const float LR = 1e-4f, B1 = 0.9f, B2 = 0.999f, EPS = 1e-8f, WD = 0.1f, GSCALE = 0.5f;
static float bc1, bc2;

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* First touch with the kernels' partition (static schedule), so each page sits where the
 * thread that streams it runs; values: g > 0 keeps m, v positive and every value normal
 * (no denormal slow paths) however many kernels run over them. */
static void fill(arrays *a) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < a->n; i++) {
        float u = (float)((i * 2654435761u) % 1000u) / 1000.0f;
        a->p[i] = 0.02f * (u - 0.5f);
        a->g[i] = 1e-3f * (u + 0.1f);
        a->m[i] = 1e-4f * (u + 0.1f);
        a->v[i] = 1e-7f * (u + 0.1f);
        a->p16[i] = 0;
    }
}

static void triad(arrays *a) {
    float *x = a->p;
    const float *y = a->g, *z = a->m;
    const float s = 1e-3f;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < a->n; i++) x[i] = y[i] + s * z[i];
}

static void stream7(arrays *a, int bf16) {
    float *p = a->p, *m = a->m, *v = a->v;
    const float *g = a->g;
    uint16_t *p16 = bf16 ? a->p16 : NULL;
    const float s = 1e-6f;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < a->n; i++) {
        float d = s * g[i];
        p[i] += d;
        m[i] += d;
        v[i] += d;
        if (p16) p16[i] = (uint16_t)0; /* a store of the same width, without the rounding's arithmetic */
    }
}

static void adamw_lib(arrays *a, int bf16) {
    dt_ops_cpu()->adamw(a->p, bf16 ? (float *)(void *)a->p16 : NULL, a->g, a->m, a->v, a->n, LR, B1, B2, EPS, WD,
                        bc1, bc2, GSCALE);
}

/* src/backend/cpu/elementwise.c's cpu_adamw with the division by a unit bias correction
 * dropped (one loop per case, so the test is outside the vector loop). */
#define ADAMW_LOOP(MHAT, VHAT)                                         \
    {                                                                  \
        _Pragma("omp parallel for simd schedule(static)")              \
        for (size_t i = 0; i < n; i++) {                               \
            float gi = g[i] * gscale;                                  \
            float mi = beta1 * m[i] + (1.0f - beta1) * gi;             \
            float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;        \
            m[i] = mi;                                                 \
            v[i] = vi;                                                 \
            float mhat = MHAT, vhat = VHAT;                            \
            p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);     \
            if (p16) p16[i] = dt_f32_to_bf16(p[i]);                    \
        }                                                              \
    }
static void adamw_unitbc_k(float *p, float *p_store, const float *g, float *m, float *v, size_t n, float lr,
                           float beta1, float beta2, float eps, float wd, float c1, float c2, float gscale) {
    uint16_t *p16 = (uint16_t *)p_store;
    if (c1 == 1.0f && c2 == 1.0f)
        ADAMW_LOOP(mi, vi)
    else if (c1 == 1.0f)
        ADAMW_LOOP(mi, vi / c2)
    else
        ADAMW_LOOP(mi / c1, vi / c2)
}

static void adamw_unitbc(arrays *a, int bf16) {
    adamw_unitbc_k(a->p, bf16 ? (float *)(void *)a->p16 : NULL, a->g, a->m, a->v, a->n, LR, B1, B2, EPS, WD, bc1,
                   bc2, GSCALE);
}

enum { K_TRIAD, K_S7, K_S7B, K_ADAMW, K_ADAMWB, K_UNITBC, NK };
static const char *NAMES[NK] = {"triad", "stream7", "stream7_bf16", "adamw", "adamw_bf16", "adamw_unitbc"};
static const int BYTES[NK] = {12, 28, 30, 28, 30, 28};

static void run_kernel(int k, arrays *a) {
    switch (k) {
    case K_TRIAD: triad(a); break;
    case K_S7: stream7(a, 0); break;
    case K_S7B: stream7(a, 1); break;
    case K_ADAMW: adamw_lib(a, 0); break;
    case K_ADAMWB: adamw_lib(a, 1); break;
    default: adamw_unitbc(a, 0); break;
    }
}

static int alloc_arrays(arrays *a, size_t n) {
    a->n = n;
    a->p = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
    a->g = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
    a->m = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
    a->v = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
    a->p16 = aligned_alloc(64, (n * 2 + 63) / 64 * 64);
    return a->p && a->g && a->m && a->v && a->p16;
}

static void free_arrays(arrays *a) {
    free(a->p);
    free(a->g);
    free(a->m);
    free(a->v);
    free(a->p16);
}

/* rates[k][r]: GB/s of repetition r of kernel k, the kernels interleaved within a repetition */
static void measure(arrays *a, int reps, double rates[NK][100]) {
    for (int k = 0; k < NK; k++) run_kernel(k, a); /* warm-up: page tables, thread pool, code */
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < NK; k++) {
            double t0 = dt_now();
            run_kernel(k, a);
            rates[k][r] = (double)BYTES[k] * (double)a->n / (dt_now() - t0) / 1e9;
        }
}

/* The bench's kernels against the library's on random signed values: same bits? */
static void check(size_t n, int step) {
    arrays x, y;
    if (!alloc_arrays(&x, n) || !alloc_arrays(&y, n)) {
        printf("check\tskipped (out of memory)\n");
        return;
    }
    unsigned s = 12345u + (unsigned)step;
    for (size_t i = 0; i < n; i++) {
        float r[4];
        for (int j = 0; j < 4; j++) {
            s = s * 1103515245u + 12345u;
            r[j] = (float)((s >> 8) & 0xffffff) / 16777216.0f - 0.5f;
        }
        x.p[i] = 0.1f * r[0];
        x.g[i] = r[1];
        x.m[i] = 0.1f * r[2];
        x.v[i] = 0.01f * r[3] * r[3];
    }
    memcpy(y.p, x.p, n * 4);
    memcpy(y.g, x.g, n * 4);
    memcpy(y.m, x.m, n * 4);
    memcpy(y.v, x.v, n * 4);
    adamw_lib(&x, 1);
    adamw_unitbc(&y, 1);
    int same = !memcmp(x.p, y.p, n * 4) && !memcmp(x.m, y.m, n * 4) && !memcmp(x.v, y.v, n * 4) &&
               !memcmp(x.p16, y.p16, n * 2);
    printf("check\tadamw_unitbc vs library at step %d (bc1 %.9g, bc2 %.9g): %s\n", step, (double)bc1, (double)bc2,
           same ? "bitwise identical" : "DIFFERENT BITS");
    free_arrays(&x);
    free_arrays(&y);
}

static void set_step(int step) {
    bc1 = (float)(1.0 - pow(B1, (double)step)); /* as src/optim/adamw.c computes them */
    bc2 = (float)(1.0 - pow(B2, (double)step));
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s N THREADS [REPS] [STEP]\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)atoll(argv[1]);
    int threads = atoi(argv[2]), reps = argc > 3 ? atoi(argv[3]) : 5, step = argc > 4 ? atoi(argv[4]) : 1000;
    if (n < 1024 || threads <= 0 || reps <= 0 || reps > 100 || step <= 0) {
        fprintf(stderr, "adamw_bench: N >= 1024, THREADS >= 1, 1 <= REPS <= 100, STEP >= 1\n");
        return 2;
    }
    omp_set_num_threads(threads);
    set_step(step);
    static double rates[NK][100];
    arrays a;
    if (!alloc_arrays(&a, n)) {
        fprintf(stderr, "adamw_bench: cannot allocate %zu elements (%.2f GiB)\n", n, 18.0 * (double)n / (1 << 30));
        return 1;
    }
    fill(&a);
    measure(&a, reps, rates);
    for (int k = 0; k < NK; k++) {
        qsort(rates[k], (size_t)reps, sizeof(double), cmp);
        printf("row\t%s\t%d\t%.2f\t%.2f\n", NAMES[k], BYTES[k], rates[k][reps - 1], rates[k][reps / 2]);
    }
    free_arrays(&a);

    /* The compute ceiling: the same kernels on arrays that stay in this core's share of L2
     * (32K elements a thread: 576 KiB of the 5 arrays), many passes per timing. */
    size_t nc = 32768 * (size_t)threads;
    if (alloc_arrays(&a, nc)) {
        fill(&a);
        for (int k = K_S7; k < NK; k++) {
            double best = 0;
            for (int r = 0; r < 5; r++) {
                int passes = 200;
                double t0 = dt_now();
                for (int j = 0; j < passes; j++) run_kernel(k, &a);
                double gbs = (double)BYTES[k] * (double)nc * passes / (dt_now() - t0) / 1e9;
                if (gbs > best) best = gbs;
            }
            printf("incache\t%s\t%d\t%.2f\t%.3f\n", NAMES[k], BYTES[k], best, BYTES[k] / best); /* GB/s, ns/elem */
        }
        free_arrays(&a);
    }
    check(n < (1u << 20) ? n : (1u << 20), step);
    set_step(1);
    check(n < (1u << 20) ? n : (1u << 20), 1);
    return 0;
}

/* sgemm rate of the OpenBLAS dtrain links (the OpenMP build), for bench_train.sh.
 * usage: sgemm_bench N THREADS [REPS]   -> one line: "sgemm N^3 threads T: best X GFLOP/s, median Y GFLOP/s, core Z"
 * Row-major C = A·B with A, B, C N x N (the layout dtrain's linear layers use). */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

extern void openblas_set_num_threads(int);
extern char *openblas_get_corename(void);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s N THREADS [REPS]\n", argv[0]);
        return 2;
    }
    int n = atoi(argv[1]), threads = atoi(argv[2]), reps = argc > 3 ? atoi(argv[3]) : 5;
    if (n <= 0 || threads <= 0 || reps <= 0 || reps > 100) return 2;
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    size_t nn = (size_t)n * n;
    float *a = malloc(nn * sizeof(float)), *b = malloc(nn * sizeof(float)), *c = malloc(nn * sizeof(float));
    if (!a || !b || !c) return 1;
    unsigned s = 12345;
    for (size_t i = 0; i < nn; i++) {
        s = s * 1103515245u + 12345u;
        a[i] = (float)((s >> 9) & 1023) / 1024.0f - 0.5f;
        s = s * 1103515245u + 12345u;
        b[i] = (float)((s >> 9) & 1023) / 1024.0f - 0.5f;
        c[i] = 0.0f;
    }
    double flop = 2.0 * n * (double)n * n, rate[100];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        rate[r] = flop / (now() - t0) / 1e9;
    }
    qsort(rate, (size_t)reps, sizeof(double), cmp);
    printf("sgemm %d^3 threads %d: best %.1f GFLOP/s, median %.1f GFLOP/s, core %s (check %g)\n", n, threads,
           rate[reps - 1], rate[reps / 2], openblas_get_corename(), (double)c[nn / 2]);
    free(a);
    free(b);
    free(c);
    return 0;
}

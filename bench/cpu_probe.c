/* CPU-share probe for bench_train.sh: how much of a second core this process really gets.
 * Runs a dependent integer chain on one thread, then the same chain on two threads at once;
 * prints the throughput ratio (2 threads / 1 thread). About 2.0 on two idle cores; below
 * 1.6 the machine is shared with other work and timings taken now are unreliable. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long iters = 200000000LL;
static volatile uint64_t sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *chain(void *arg) {
    uint64_t x = (uint64_t)(uintptr_t)arg + 1;
    for (long long i = 0; i < iters; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL; /* dependent */
    sink = x;
    return NULL;
}

static double run(int nthreads) {
    pthread_t t[2];
    double t0 = now();
    for (int i = 0; i < nthreads; i++) pthread_create(&t[i], NULL, chain, (void *)(uintptr_t)i);
    for (int i = 0; i < nthreads; i++) pthread_join(t[i], NULL);
    return now() - t0;
}

int main(int argc, char **argv) {
    if (argc > 1) iters = atoll(argv[1]);
    double t1 = run(1), t2 = run(2), t1b = run(1);
    double one = t1 < t1b ? t1 : t1b; /* the better single-thread time: a conservative ratio */
    double ratio = 2.0 * one / t2;
    printf("cpu-share probe: 2 threads / 1 thread = %.2f%s\n", ratio, ratio < 1.6 ? " (UNRELIABLE: < 1.6)" : "");
    return 0;
}

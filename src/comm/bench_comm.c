/* Collective bandwidth per algorithm and message size (nccl-tests conventions): bytes is
 * the full buffer (all-reduce: the buffer; reduce-scatter: the send buffer; all-gather:
 * the receive buffer), algbw = bytes / time, busbw = algbw · 2(N-1)/N for all-reduce and
 * algbw · (N-1)/N for reduce-scatter and all-gather. f32 data; all-reduce uses DT_AVG on
 * ones so values stay finite and normal however many iterations run. The shm algorithm
 * runs twice: on ordinary buffers ("shm") and on node-shared ones from
 * dt_comm_alloc_shared ("shm-reg", as DDP's gradient buckets and ZeRO's buffers are).
 * --group K runs the collectives in groups of K consecutive ranks, all groups at once: a
 * link measured under the load a layout puts on it (every rank of an oversubscribed node
 * busy, as in a hybrid-sharded step), not on an idle machine. --between US puts US
 * microseconds of computation (as timed with every rank computing at once) before each
 * call and reports the call's time as the loop's less the computation's alone: on a node
 * with more ranks than cores the ranks then reach each collective at different times and
 * the early ones' polling takes CPU from the late ones, as in a training step, which a
 * loop of back-to-back collectives never shows. */
#include "bench_comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/mem.h"
#include "../core/timer.h"

#define MAX_SIZES 40
static const dt_coll g_ops[3] = {DT_COLL_ALLREDUCE, DT_COLL_REDUCE_SCATTER, DT_COLL_ALLGATHER};

static dt_status parse_bytes(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mul = 1024.0 * 1024 * 1024, end++;
    if (*end == 'i') end++;
    if (*end == 'B') end++;
    if (end == s || *end || v <= 0 || v * mul > 64.0 * 1024 * 1024 * 1024)
        return dt_fail(DT_EINPUT, "bench comm: bad size '%s' (expected e.g. 4K, 16M, 1G)", s);
    *out = (size_t)(v * mul);
    return DT_OK;
}

static void fmt_bytes(char *out, size_t n, size_t b) {
    if (b >= (1u << 30) && b % (1u << 30) == 0) snprintf(out, n, "%zu GiB", b >> 30);
    else if (b >= (1u << 20) && b % (1u << 20) == 0) snprintf(out, n, "%zu MiB", b >> 20);
    else if (b >= 1024 && b % 1024 == 0) snprintf(out, n, "%zu KiB", b >> 10);
    else snprintf(out, n, "%zu B", b);
}

/* Parses a comma list of names; sel[i] = 1 for each name found at names[i]. */
static dt_status parse_list(const char *opt, const char *arg, const char *const *names, int n, int *sel) {
    memset(sel, 0, sizeof(int) * (size_t)n);
    const char *p = arg;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int found = 0;
        for (int i = 0; i < n; i++)
            if (strlen(names[i]) == len && strncmp(names[i], p, len) == 0) sel[i] = found = 1;
        if (!found) return dt_fail(DT_EINPUT, "bench comm: %s: unknown name '%.*s'", opt, (int)len, p);
        p = e ? e + 1 : p + len;
    }
    return DT_OK;
}

static dt_status run_once(dt_comm *c, dt_coll op, float *a, float *b, size_t count) {
    int r = dt_comm_rank(c);
    switch (op) {
    case DT_COLL_ALLREDUCE: return dt_allreduce(c, a, count, DT_F32, DT_AVG);
    case DT_COLL_REDUCE_SCATTER: return dt_reduce_scatter(c, a, b, count, DT_F32, DT_AVG);
    default: return dt_allgather(c, a + (size_t)r * count, a, count, DT_F32);
    }
}

/* Fixed work standing in for a layer's computation: FMAs over a buffer that stays in
 * cache, the same count on every rank. */
static float g_sink;
static void work(long reps) {
    float x[1024];
    for (int i = 0; i < 1024; i++) x[i] = (float)i * 1e-3f;
    for (long r = 0; r < reps; r++)
        for (int i = 0; i < 1024; i++) x[i] = x[i] * 0.999f + 1e-4f;
    g_sink += x[reps % 1024];
}

/* Slowest rank's value (timings are only as good as the slowest rank). */
static dt_status max_over_ranks(dt_comm *ctl, double v, double *all, double *out) {
    DT_TRY(dt_allgather(ctl, &v, all, 1, DT_F64));
    *out = all[0];
    for (int q = 1; q < dt_comm_size(ctl); q++)
        if (all[q] > *out) *out = all[q];
    return DT_OK;
}

/* The alpha-beta line through one sweep, in the ring's terms (what `dtrain plan` takes): a
 * rank sends m messages of bytes in all (all-reduce 2(N-1) and 2(N-1)/N of the buffer,
 * reduce-scatter and all-gather N-1 and (N-1)/N), t = m·alpha + bytes/beta; least squares
 * on the error relative to the timed loop's time per call (loop = t, or t plus the
 * computation --between puts in it, whose noise the difference carries), so small and
 * large messages count alike. */
static void fit_add(double *ne, double m, double bytes, double t, double loop) {
    double x = m / loop, y = bytes / loop, z = t / loop; /* rows (x, y) · (alpha, 1/beta) = z */
    ne[0] += x * x, ne[1] += x * y, ne[2] += y * y, ne[3] += x * z, ne[4] += y * z;
}
static void fit_print(const double *ne, const char *op, const char *algo) {
    double det = ne[0] * ne[2] - ne[1] * ne[1];
    if (!(det > 0)) return; /* fewer than two sizes */
    double alpha = (ne[3] * ne[2] - ne[4] * ne[1]) / det, inv = (ne[0] * ne[4] - ne[1] * ne[3]) / det;
    if (alpha < 0) alpha = 0, inv = ne[4] / ne[2]; /* bandwidth alone */
    if (inv < 0) inv = 1e-15, alpha = ne[3] / ne[0]; /* latency alone (bandwidth beyond measuring) */
    if (!(inv > 0)) return;
    printf("# fit %s %s: alpha %.3g s per message, beta %.3g GB/s (dtrain plan --intra or --inter %.3g:%.3g)\n", op,
           algo, alpha, 1e-9 / inv, alpha, 1e-9 / inv);
    fflush(stdout);
}

/* --between: the work count lasting us microseconds with every rank computing at once
 * (the same on every rank: from the slowest), probed for at least 0.3 s so that every
 * rank of an oversubscribed node has had its turns. */
static dt_status calibrate_between(dt_comm *ctl, double us, double *all, long *reps) {
    long probe = 20000;
    for (;;) {
        DT_TRY(dt_barrier(ctl));
        double t0 = dt_now(), t;
        work(probe);
        DT_TRY(max_over_ranks(ctl, dt_now() - t0, all, &t));
        if (t >= 0.3 || probe > (1L << 40)) {
            *reps = t > 0 ? (long)(us * 1e-6 / t * (double)probe) : probe;
            if (*reps < 1) *reps = 1;
            return DT_OK;
        }
        probe *= t > 0.03 ? 0.35 / t + 1 : 10;
    }
}

/* on: the ranks each collective runs over (the on, or a --group of it); ctl: every rank;
 * reps > 0: work(reps) before each call, timed alone in a loop as long before each point */
static dt_status bench(dt_comm *on, dt_comm *ctl, const size_t *sizes, int nsizes, const int *ops,
                       const int *algos, int fixed_iters, float *plain, float *shared, float *b, double *all,
                       long reps) {
    int n = dt_comm_size(on), rank = dt_comm_rank(ctl);
    if (rank == 0) {
        int groups = dt_comm_size(ctl) / n;
        char by[64] = "";
        if (groups > 1) snprintf(by, sizeof by, " in each of %d groups at once", groups);
        printf("# bench comm: %d ranks%s (%d on this node), f32; time = slowest rank's mean per call\n", n, by,
               dt_comm_local_size(on));
        if (reps) printf("# between calls: computation per rank (timed with all computing), less from each time\n");
        printf("%-15s %10s  %-7s %6s %12s %12s %12s\n", "op", "bytes", "algo", "iters", "time_us", "algbw_GB/s",
               "busbw_GB/s");
        fflush(stdout);
    }
    for (int oi = 0; oi < 3; oi++) {
        dt_coll op = g_ops[oi];
        if (!ops[oi]) continue;
        for (int ai = 0; ai < DT_ALGO_N; ai++) {
            if (!algos[ai] || ai == DT_ALGO_AUTO || !dt_algo_supports((dt_algo)ai, op)) continue;
            /* e.g. shm across nodes; every group skips if one must (all run at once) */
            double bad = dt_comm_set_algo(on, op, (dt_algo)ai) != DT_OK, any;
            DT_TRY(max_over_ranks(ctl, bad, all, &any));
            if (any > 0) {
                if (rank == 0) printf("# %s: %s skipped: %s\n", dt_coll_name(op), dt_algo_name((dt_algo)ai),
                                      bad ? dt_error_message() : "not on every group");
                dt_error_clear();
                continue;
            }
            for (int v = 0; v < (ai == DT_ALGO_SHM ? 2 : 1); v++) {
            float *a = v ? shared : plain;
            double ne[5] = {0}; /* the fit's normal equations */
            for (int si = 0; si < nsizes; si++) {
                size_t elems = sizes[si] / sizeof(float), count = op == DT_COLL_ALLREDUCE ? elems : elems / (size_t)n;
                size_t bytes = (op == DT_COLL_ALLREDUCE ? count : count * (size_t)n) * sizeof(float);
                if (count == 0) continue;
                for (int w = 0; w < 2; w++) DT_TRY(run_once(on, op, a, b, count)); /* grows scratch/windows */
                int iters = fixed_iters;
                if (iters <= 0) {
                    DT_TRY(dt_barrier(ctl));
                    double t0 = dt_now(), t1;
                    if (reps) work(reps);
                    DT_TRY(run_once(on, op, a, b, count));
                    DT_TRY(max_over_ranks(ctl, dt_now() - t0, all, &t1));
                    iters = t1 > 0 ? (int)((reps ? 1.0 : 0.25) / t1) : 1000;
                    if (iters < (reps ? 10 : 3)) iters = reps ? 10 : 3;
                    if (iters > 2000) iters = 2000;
                }
                double t0, t, t_work = 0, tw;
                if (reps) { /* the computation alone, just before (and after): drift in the load cancels */
                    DT_TRY(dt_barrier(ctl));
                    t0 = dt_now();
                    for (int it = 0; it < iters; it++) work(reps);
                    DT_TRY(max_over_ranks(ctl, (dt_now() - t0) / iters, all, &t_work));
                }
                DT_TRY(dt_barrier(ctl));
                t0 = dt_now();
                for (int it = 0; it < iters; it++) {
                    if (reps) work(reps);
                    DT_TRY(run_once(on, op, a, b, count));
                }
                DT_TRY(max_over_ranks(ctl, (dt_now() - t0) / iters, all, &t));
                double loop = t;
                if (reps) {
                    DT_TRY(dt_barrier(ctl));
                    t0 = dt_now();
                    for (int it = 0; it < iters; it++) work(reps);
                    DT_TRY(max_over_ranks(ctl, (dt_now() - t0) / iters, all, &tw));
                    t_work = (t_work + tw) / 2;
                    t = t - t_work > 1e-7 ? t - t_work : 1e-7; /* the call's share of the loop */
                }
                if (rank == 0) {
                    char sz[32];
                    fmt_bytes(sz, sizeof sz, bytes);
                    double algbw = (double)bytes / t / 1e9;
                    double f = op == DT_COLL_ALLREDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
                    printf("%-15s %10s  %-7s %6d %12.1f %12.2f %12.2f\n", dt_coll_name(op), sz,
                           v ? "shm-reg" : dt_algo_name((dt_algo)ai), iters, t * 1e6, algbw, algbw * f);
                    fflush(stdout);
                    fit_add(ne, op == DT_COLL_ALLREDUCE ? 2.0 * (n - 1) : n - 1.0, (double)bytes * f, t, loop);
                }
            }
            if (rank == 0) fit_print(ne, dt_coll_name(op), v ? "shm-reg" : dt_algo_name((dt_algo)ai));
            }
        }
    }
    return DT_OK;
}

dt_status dt_bench_comm(dt_comm *world, int argc, char **argv) {
    size_t lo = 4u << 10, hi = 256u << 20;
    int ops[3] = {1, 1, 1}, algos[DT_ALGO_N], iters = 0, group = 0;
    double between = 0;
    for (int i = 0; i < DT_ALGO_N; i++) algos[i] = 1;
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i];
        int known = !strcmp(o, "--sizes") || !strcmp(o, "--ops") || !strcmp(o, "--algos") || !strcmp(o, "--iters") ||
                    !strcmp(o, "--group") || !strcmp(o, "--between");
        if (!known)
            return dt_fail(DT_EINPUT,
                           "bench comm: unknown option '%s' (--sizes, --ops, --algos, --iters, --group, --between)", o);
        if (i + 1 >= argc) return dt_fail(DT_EINPUT, "bench comm: option %s needs a value", o);
        const char *v = argv[++i];
        if (!strcmp(o, "--sizes")) {
            const char *colon = strchr(v, ':');
            char first[64];
            if (!colon || (size_t)(colon - v) >= sizeof first)
                return dt_fail(DT_EINPUT, "bench comm: --sizes expects MIN:MAX, got '%s'", v);
            memcpy(first, v, (size_t)(colon - v));
            first[colon - v] = 0;
            DT_TRY(parse_bytes(first, &lo));
            DT_TRY(parse_bytes(colon + 1, &hi));
            if (lo > hi) return dt_fail(DT_EINPUT, "bench comm: --sizes %s: MIN exceeds MAX", v);
        } else if (!strcmp(o, "--ops")) {
            const char *names[3] = {"allreduce", "reduce_scatter", "allgather"};
            DT_TRY(parse_list(o, v, names, 3, ops));
        } else if (!strcmp(o, "--algos")) {
            const char *names[DT_ALGO_N];
            for (int k = 0; k < DT_ALGO_N; k++) names[k] = dt_algo_name((dt_algo)k);
            DT_TRY(parse_list(o, v, names, DT_ALGO_N, algos));
        } else {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 1000000) return dt_fail(DT_EINPUT, "bench comm: %s '%s' is not in 1..1000000", o, v);
            if (!strcmp(o, "--group")) group = (int)n;
            else if (!strcmp(o, "--between")) between = (double)n;
            else iters = (int)n;
        }
    }
    /* 4 KiB · 4^k within [lo, hi], plus the bounds themselves */
    size_t sizes[MAX_SIZES];
    int ns = 0;
    sizes[ns++] = lo;
    for (size_t s = 4u << 10; s <= hi && ns < MAX_SIZES - 1; s *= 4)
        if (s > lo && s < hi) sizes[ns++] = s;
    if (hi > lo) sizes[ns++] = hi;

    int W = dt_comm_size(world), wr = dt_comm_rank(world);
    if (group && W % group)
        return dt_fail(DT_EINPUT, "bench comm: --group %d does not divide the %d ranks", group, W);
    dt_comm *grp = NULL; /* the ranks each collective runs over: the world, or its group */
    dt_status st = group ? dt_comm_split(world, wr / group, wr, &grp) : DT_OK;
    dt_comm *on = grp ? grp : world;
    int n = dt_comm_size(on);
    dt_algo saved[DT_COLL_N];
    for (int k = 0; k < DT_COLL_N; k++) saved[k] = dt_comm_get_algo(on, (dt_coll)k);
    dt_comm *ctl = NULL; /* control traffic (barriers, timings) over every rank, on MPI's algorithms */
    float *a = NULL, *ra = NULL, *b = NULL;
    double *all = NULL;
    if (!st) st = dt_comm_split(world, 0, wr, &ctl);
    for (int k = 0; ctl && !st && k < DT_COLL_N; k++) st = dt_comm_set_algo(ctl, (dt_coll)k, DT_ALGO_MPI);
    /* buffers once, at the largest size: all-reduce and all-gather use a; reduce-scatter a -> b */
    if (!st) st = dt_alloc((void **)&a, hi, "bench comm buffer");
    if (!st && algos[DT_ALGO_SHM]) st = dt_comm_alloc_shared(on, hi, "bench comm buffer", (void **)&ra);
    if (!st) st = dt_alloc((void **)&b, hi / (size_t)n + 64, "bench comm buffer");
    if (!st) st = dt_alloc((void **)&all, sizeof(double) * (size_t)W, "bench comm timings");
    long reps = 0;
    if (!st && between > 0) st = calibrate_between(ctl, between, all, &reps);
    if (!st) {
        for (size_t i = 0; i < hi / sizeof(float); i++) a[i] = 1.0f;
        if (ra) memcpy(ra, a, hi);
        st = bench(on, ctl, sizes, ns, ops, algos, iters, a, ra, b, all, reps);
    }
    for (int k = 0; k < DT_COLL_N; k++) dt_comm_set_algo(on, (dt_coll)k, saved[k]);
    dt_free(a);
    dt_comm_free_shared(on, ra);
    dt_free(b);
    dt_free(all);
    dt_comm_free(ctl);
    dt_comm_free(grp);
    if (st) dt_error_context("bench comm");
    return st;
}

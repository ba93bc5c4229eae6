/* The planner's calibration (plan.h): a rank's training FLOP/s for each shard shape and
 * the optimizer's time per parameter, measured on this machine, alone or under load. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../core/timer.h"
#include "../../model/gpt.h"
#include "../../optim/optimizer.h"
#include "estimate.h"
#include "plan.h"

/* The calibration model of shard shape tp x cp (at most 2 blocks and 512 tokens) and the
 * bytes it allocates. */
static dt_status calib_shape(const dt_config *c, int tp, int cp, gpt_shape *s, int *B, int *T, double *bytes) {
    *s = gpt_shape_of_config(c);
    s->n_layer = s->n_layer < 2 ? s->n_layer : 2;
    *T = (c->train.seq_len > 0 ? c->train.seq_len : c->model.seq_len) / cp, *B = c->train.micro_batch;
    if (*T > 512) *T = 512; /* the FLOPs are counted at this length too */
    if ((long long)*B * *T > 512) *B = 512 / *T;
    DT_TRY(gpt_shape_check(s));
    gpt_layout lay = {.tp = tp};
    *bytes = 16.0 * (double)gpt_param_count_layout(s, &lay) +
             (double)gpt_activation_bytes_layout(s, *B, *T, 4, &lay, NULL) + 2.0 * *B * *T;
    return DT_OK;
}

/* One rank's training FLOP/s for the shard shape of tp tensor-parallel pieces and T/cp
 * positions (forward + backward of one micro-batch of that rank's model, the collectives
 * left out, after a warm-up), and (optim_s not NULL) the optimizer update's seconds per
 * parameter; each timed over 2 runs and at least min_s seconds. The rate per FLOP is the
 * shard's GEMM shapes' (width / tp, tokens), not the depth's: at most 2 blocks and 512
 * tokens are run, so a model that does not fit this machine (what the planner is for) is
 * calibrated without being built whole. */
static dt_status calibrate(const dt_config *c, int tp, int cp, double min_s, double *flops, double *optim_s) {
    gpt_shape s;
    int B, T;
    double need, have = (double)dt_memory_available() / 2;
    DT_TRY(calib_shape(c, tp, cp, &s, &B, &T, &need));
    gpt_layout lay = {.tp = tp}; /* no collectives attached: each is an identity */
    if (need > have)
        return dt_fail(DT_EINPUT, "plan: calibrating a rank's speed on this machine needs %.1f GB for two blocks of "
                       "width %d / tp %d (%.1f GB free); pass --flops F (a rank's FLOP/s) instead", need / 1e9,
                       s.n_embd, tp, have * 2 / 1e9);
    gpt_model m;
    DT_TRY(gpt_create_layout(&m, &s, dt_ops_cpu(), B, T, 1, &lay));
    gpt_init(&m, 1);
    size_t n = (size_t)B * T, np = m.nparams;
    dt_token *tok = malloc(n * sizeof(dt_token));
    float *mom = optim_s ? calloc(2 * np, sizeof(float)) : NULL;
    dt_status st = tok && (mom || !optim_s) ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (calibration)");
    for (size_t i = 0; st == DT_OK && i < n; i++) tok[i] = (dt_token)((i * 7919u) % (unsigned)(s.vocab_size / tp));
    double t0 = 0, loss;
    int k = 0;
    for (; st == DT_OK && (k < 3 || dt_now() - t0 < min_s); k++) {
        if (k == 1) t0 = dt_now();
        st = gpt_forward_backward(&m, tok, tok, B, T, 1.0f / (float)n, &loss);
    }
    if (st == DT_OK) *flops = (k - 1.0) * (double)n * gpt_flops_per_token(&m.shape, T) / tp / (dt_now() - t0);
    if (st == DT_OK && optim_s) { /* the update as the trainer runs it: the norm, then AdamW over every element */
        dt_adamw_hparams hp = {1e-4, 1e-5, 0.9, 0.95, 1e-8, 0.1, 1.0, 0, 100};
        for (k = 0; k < 3 || dt_now() - t0 < min_s; k++) {
            if (k == 1) t0 = dt_now();
            float g = dt_clip_coef(dt_grad_norm(m.ops, m.grads, np), hp.grad_clip);
            dt_adamw_range(&hp, m.ops, k + 1, 1, 1e-4, g, m.params, NULL, m.grads, mom, mom + np, np);
        }
        *optim_s = (dt_now() - t0) / (k - 1.0) / (double)np;
    }
    free(mom);
    free(tok);
    gpt_destroy(&m);
    return st;
}

/* Every shard shape a layout of mc->world gives a rank (tp x cp), in calibration order. */
static int shard_shapes(const dt_config *c, const dt_machine *mc, const gpt_shape *shape, int *tp, int *cp) {
    int n = 0;
    for (int t = 1; t <= mc->world; t++)
        for (int q = 1; mc->world % t == 0 && q <= mc->world / t; q++) {
            if ((mc->world / t) % q || !dt_plan_shard_ok(c, shape, t, q) || n == DT_PLAN_MAX_RATES) continue;
            tp[n] = t, cp[n] = q, n++;
        }
    return n;
}

/* The processes of a calibration under load meet before each measurement, so all run it
 * at once. A process that is gone (crashed) makes the rest stop: none waits forever. */
typedef struct {
    atomic_int arrived, abort;
} meet_point; /* in memory every process shares */
typedef struct {
    meet_point *at;
    pid_t *kids; /* the parent's copies (NULL in a copy) */
    int nkids;
    pid_t parent;
} meet;

static int gone(meet *m) {
    if (!m->kids) return getppid() != m->parent;
    for (int i = 0; i < m->nkids; i++)
        if (m->kids[i] > 0 && waitpid(m->kids[i], NULL, WNOHANG) == m->kids[i]) /* it left before the end */
            return m->kids[i] = 0, 1;
    return 0;
}

static int meet_wait(meet *m, int target) { /* 0, or -1 when a process of the load is gone */
    struct timespec ms = {0, 1000000};
    while (atomic_load(&m->at->arrived) < target) {
        if (atomic_load(&m->at->abort) || gone(m)) {
            atomic_store(&m->at->abort, 1);
            return -1;
        }
        nanosleep(&ms, NULL);
    }
    return 0;
}

/* One process's measurements into out: [0] the optimizer's seconds per parameter, [1] the
 * 1 x 1 rate, then each shape's. */
static dt_status measure(const dt_config *c, const int *tp, const int *cp, int n, double *out, meet *m, int load) {
    dt_status st = DT_OK;
    for (int k = 0; k <= n; k++) { /* k = 0: 1 x 1 and the optimizer */
        if (m) {
            atomic_fetch_add(&m->at->arrived, 1);
            if (meet_wait(m, (k + 1) * load)) return dt_fail(DT_ERUNTIME, "plan: a calibrating process is gone");
        }
        if (st != DT_OK) continue; /* keeps meeting the others: none waits for a failed one */
        /* under load each measurement lasts long enough for the scheduler to share the cores
         * among all the processes, as it does over a run's steps */
        double min_s = m ? 0.3 : 0.0;
        if (k == 0) st = calibrate(c, 1, 1, min_s, &out[1], &out[0]);
        else if (tp[k - 1] > 1 || cp[k - 1] > 1) st = calibrate(c, tp[k - 1], cp[k - 1], min_s, &out[k + 1], NULL);
        else out[k + 1] = out[1];
    }
    return st;
}

dt_status dt_plan_calibrate_machine(const dt_config *c, dt_machine *mc, int load) {
    gpt_shape shape = gpt_shape_of_config(c);
    DT_TRY(gpt_shape_check(&shape));
    int tp[DT_PLAN_MAX_RATES], cp[DT_PLAN_MAX_RATES], n = shard_shapes(c, mc, &shape, tp, cp), width = n + 2;
    if (load < 1) load = 1;
    gpt_shape one;
    int B1, T1;
    double need, have = (double)dt_memory_available() / 2;
    DT_TRY(calib_shape(c, 1, 1, &one, &B1, &T1, &need)); /* 1 x 1: the largest */
    need *= load;
    if (load > 1 && need > have)
        return dt_fail(DT_EINPUT, "plan: --load %d: %d calibrations at once need %.1f GB (%.1f GB free); pass a "
                       "smaller --load, or --flops F", load, load, need / 1e9, have * 2 / 1e9);
    /* the results (and the meeting point) in memory the forked copies share */
    size_t bytes = sizeof(meet_point) + sizeof(double) * (size_t)width * (size_t)load;
    void *shm = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shm == MAP_FAILED) return dt_fail(DT_ERUNTIME, "plan: no memory for the calibration");
    meet mt = {.at = shm, .parent = getpid()}, *m = &mt;
    double *res = (double *)((char *)shm + sizeof(meet_point));
    atomic_init(&m->at->arrived, 0);
    atomic_init(&m->at->abort, 0);
    pid_t *kids = calloc((size_t)load, sizeof *kids);
    dt_status st = kids ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (calibration)");
    int started = 0;
    fflush(NULL);
    for (int i = 1; st == DT_OK && i < load; i++) { /* before this process runs any kernel: fork-safe */
        pid_t p = fork();
        if (p == 0) _exit(measure(c, tp, cp, n, res + (size_t)i * width, m, load) == DT_OK ? 0 : 1);
        if (p < 0) st = dt_fail(DT_ERUNTIME, "plan: cannot start calibrating process %d of %d", i + 1, load);
        else kids[started++] = p;
    }
    m->kids = kids, m->nkids = started; /* the copies forked with kids NULL: theirs watch the parent */
    if (st == DT_OK) st = measure(c, tp, cp, n, res, load > 1 ? m : NULL, load);
    else atomic_store(&m->at->abort, 1);
    for (int i = 0; i < started; i++) {
        int ws = 0;
        if (kids[i] <= 0 || waitpid(kids[i], &ws, 0) < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            atomic_store(&m->at->abort, 1);
            if (st == DT_OK) st = dt_fail(DT_ERUNTIME, "plan: calibrating process %d of %d failed", i + 2, load);
        }
    }
    if (st == DT_OK) { /* a rank's speed while the others compute too: the mean time per FLOP
                          (a process the scheduler favoured a while does not count more) */
        double inv[DT_PLAN_MAX_RATES + 1] = {0};
        mc->optim_s = 0;
        for (int i = 0; i < load; i++) {
            const double *r = res + (size_t)i * width;
            mc->optim_s += r[0] / load;
            for (int k = 0; k <= n; k++) inv[k] += 1.0 / r[k + 1] / load;
        }
        mc->flops = 1.0 / inv[0];
        mc->nrates = n;
        for (int k = 0; k < n; k++) mc->rates[k] = (dt_plan_rate){tp[k], cp[k], 1.0 / inv[k + 1]};
    }
    free(kids);
    munmap(shm, bytes);
    return st;
}

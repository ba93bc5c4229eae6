#include "async_ps.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../ckpt/ckpt_dir.h"
#include "../ckpt/rank_state.h"
#include "../core/timer.h"
#include "../launch/heartbeat.h"

enum { TAG_ASK = 71, TAG_GRAD = 72, TAG_TASK = 73, TAG_WEIGHTS = 74 };
enum { H_LOSS, H_TOKENS, H_TASK, H_VERSION, H_N }; /* a worker's header */

typedef struct {
    double hdr[H_N];
    dt_request *req;  /* the posted receive of its next header (NULL: none) */
    dt_request *greq; /* its gradient on the way in (NULL: none) */
    dt_request *wreq; /* its task's weights on the way out (NULL: none) */
    float *into;      /* where greq lands */
    long long task;  /* in progress (-1: none) */
    long long ver;   /* the server's update count when it got its weights */
    int waiting;     /* asked, not answered yet */
    int done;        /* told to stop */
    long long tasks; /* applied */
} worker;

struct dt_async_ps {
    dt_async_opts o;
    int N;
    size_t n;
    float *w;     /* the weights sent with a task (a worker: received) */
    worker *wk;   /* wk[r], r = 1 .. N-1 */
    /* the server's: each worker's weights on their way out and gradient on its way in, so
     * that the transfers to and from several workers (over different links) overlap each
     * other and the updates; allocated once (gin only outside the fixed order, which
     * receives into its slots) */
    float **wout, **gin;
    int broken;   /* the exchange broke with receives posted into wk: kept, never freed */
    long long next; /* the server's next task to hand out: past the updates by the tasks handed out ahead */
    /* fixed order: gradients that arrived before their turn, task t in slot t mod (s + 1) */
    int slots;
    float **early;
    long long *early_task; /* the task a slot holds, -1: empty */
    double (*early_hdr)[H_N];
};

/* One run of the server (dt_async_ps_run). Updates count from the run's start (every
 * update is one task's gradient: after `applied` updates, task `applied` is due). */
typedef struct {
    dt_async_ps *P;
    const dt_async_opts *o;
    int N;
    size_t n;
    long long total;     /* tasks are handed out below this */
    long long apply_end; /* the run stops after this many updates */
    long long applied;
    int failed;    /* a rank failed (a worker's notice, or the server's own error): no new tasks, wind down */
    dt_status err; /* the server's own first error */
    /* the global step being reported */
    double loss, ltok, stale_sum, t0, all_tokens;
    int stale_max, in_step;
} server;

/* A failure that leaves the protocol intact (the server's own update, a worker's notice):
 * no new task; every worker is told to stop when it next asks, so no rank waits for ever. */
static void wind_down(server *S, dt_status own) {
    if (own != DT_OK && S->err == DT_OK) S->err = own;
    S->failed = 1;
    S->total = S->P->next;
}

/* Nothing to do this pass. While a model-sized transfer is under way the server keeps
 * driving it (Open MPI's TCP path moves data only inside MPI calls); otherwise every worker
 * is computing and a short sleep leaves the cores to them instead of spinning (a header
 * then waits at most the sleep, against a task of many milliseconds). */
static void idle(const dt_async_ps *P, int N) {
    for (int r = 1; r < N; r++)
        if (P->wk[r].wreq || P->wk[r].greq) {
            sched_yield();
            return;
        }
    struct timespec ts = {0, 200 * 1000};
    nanosleep(&ts, NULL);
}

static dt_status post(server *S, int r) {
    return dt_irecv(S->o->comm, S->P->wk[r].hdr, H_N, DT_F64, r, TAG_ASK, &S->P->wk[r].req);
}

/* Whether worker r may take a task now: the server is at most s updates past the weights
 * of every other task in progress (fixed order: task t exactly at update t - s). */
static int may_start(const server *S, int r) {
    if (S->o->fixed) return S->P->next <= S->applied + S->o->staleness;
    for (int q = 1; q < S->N; q++) {
        const worker *w = &S->P->wk[q];
        if (q != r && w->task >= 0 && S->applied - w->ver > S->o->staleness) return 0;
    }
    return 1;
}

static dt_status answer(server *S, int r) {
    dt_async_ps *P = S->P;
    worker *w = &P->wk[r];
    double msg[2] = {-1.0, (double)S->applied};
    if (w->wreq) { /* its last task's weights: long delivered (it computed since) */
        dt_status e = dt_wait(w->wreq);
        w->wreq = NULL;
        DT_TRY(e);
    }
    dt_status g = dt_par_get_weights(S->o->par, P->wout[r]); /* the last answer's too: defined bytes */
    if (g != DT_OK) wind_down(S, g);
    if (P->next < S->total) {
        w->task = P->next++;
        w->ver = S->applied;
        msg[0] = (double)w->task;
    } else {
        w->done = 1;
    }
    w->waiting = 0;
    DT_TRY(dt_send(S->o->comm, msg, 2, DT_F64, r, TAG_TASK));
    /* the weights follow every answer (the worker has posted their receive), the last too */
    DT_TRY(dt_isend(S->o->comm, P->wout[r], S->n, DT_F32, r, TAG_WEIGHTS, &w->wreq));
    return w->done ? DT_OK : post(S, r);
}

/* The gradient in the model's gradient buffer, of task k (header hdr) computed at update
 * `ver`: applied now, one update. */
static dt_status update(server *S, const double *hdr, long long ver) {
    const dt_async_opts *o = S->o;
    long long k = (long long)hdr[H_TASK];
    if (dt_ckpt_test_fail("async_update", S->applied))
        return dt_fail(DT_ERUNTIME, "update %lld failed (test hook DT_TEST_FAIL_AT)", S->applied);
    int stale = (int)(S->applied - ver);
    double lr = dt_par_lr_at(o->par, k / S->N) / (o->inverse_lr && stale > 1 ? stale : 1), norm;
    DT_TRY(dt_par_apply(o->par, lr, &norm));
    S->applied++;
    dt_heartbeat(S->applied, 0);
    S->loss += hdr[H_LOSS];
    S->ltok += hdr[H_TOKENS];
    S->stale_sum += stale;
    S->stale_max = stale > S->stale_max ? stale : S->stale_max;
    S->in_step++;
    if (S->in_step == S->N) { /* a global step's worth of data */
        double now = dt_now();
        dt_async_step st = {S->applied / S->N, S->ltok > 0 ? S->loss / S->ltok : 0.0, lr, norm,
                            now - S->t0, S->ltok, S->stale_sum / S->N, S->stale_max};
        if (o->report) o->report(o->ctx, &st);
        S->all_tokens += S->ltok;
        S->loss = S->ltok = S->stale_sum = 0.0;
        S->stale_max = S->in_step = 0;
        S->t0 = now;
    }
    return DT_OK;
}

/* Worker r's header has come: its notice of a failure, or the start of its gradient's
 * receive, into its buffer (in the fixed order, into the slot of its task). */
static dt_status begin_arrival(server *S, int r) {
    dt_async_ps *P = S->P;
    worker *w = &P->wk[r];
    long long k = (long long)w->hdr[H_TASK];
    w->task = -1;
    if (k < 0) { /* its notice of a failure: it sends nothing more */
        wind_down(S, DT_OK);
        w->waiting = 1;
        return DT_OK;
    }
    w->tasks++;
    w->into = S->failed ? P->w : S->o->fixed ? P->early[k % P->slots] : P->gin[r]; /* winding down: scratch */
    return dt_irecv(S->o->comm, w->into, S->n, DT_F32, r, TAG_GRAD, &w->greq);
}

/* Worker r's gradient has come: applied at once; in the fixed order, kept until its turn
 * (the updates so far are exactly the tasks before it) and until the task s after it has
 * been handed out (so that one got the weights of exactly this turn). Winding down:
 * received, not applied. */
static dt_status arrive(server *S, int r) {
    dt_async_ps *P = S->P;
    worker *w = &P->wk[r];
    long long k = (long long)w->hdr[H_TASK]; /* its next header is posted when it is answered, after this */
    w->waiting = 1; /* its next task: with the weights its gradient made */
    if (S->failed) { /* a slot it was received into (the failure came meanwhile) holds nothing due */
        if (S->o->fixed && w->into != P->w) P->early_task[k % P->slots] = -1;
        return DT_OK;
    }
    if (!S->o->fixed) {
        memcpy(dt_par_grad_buffer(S->o->par), w->into, S->n * sizeof(float));
        dt_status u = update(S, w->hdr, w->ver);
        if (u != DT_OK) wind_down(S, u);
        return DT_OK;
    }
    int slot = (int)(k % P->slots);
    P->early_task[slot] = k;
    memcpy(P->early_hdr[slot], w->hdr, sizeof w->hdr);
    P->early_hdr[slot][H_VERSION] = (double)w->ver;
    return DT_OK;
}

/* The fixed order's updates that are due, up to the run's end. */
static dt_status drain(server *S) {
    dt_async_ps *P = S->P;
    const dt_async_opts *o = S->o;
    while (o->fixed && !S->failed && S->applied < S->apply_end) {
        long long t = S->applied; /* the task whose turn it is */
        int slot = (int)(t % P->slots);
        if (P->early_task[slot] != t) return DT_OK;                             /* not here yet */
        if (P->next < S->total && P->next <= t + o->staleness) return DT_OK; /* t + s not handed out yet */
        memcpy(dt_par_grad_buffer(o->par), P->early[slot], S->n * sizeof(float));
        P->early_task[slot] = -1;
        dt_status u = update(S, P->early_hdr[slot], (long long)P->early_hdr[slot][H_VERSION]);
        if (u != DT_OK) wind_down(S, u);
    }
    return DT_OK;
}

/* Where a run that must stop now (a signal) ends: the next global step's boundary; in the
 * fixed order, the first one no task handed out lies s or more past. */
static void stop_early(server *S) {
    long long N = S->N, s = S->o->staleness, next = S->P->next;
    if (!S->o->fixed) {
        S->total = S->apply_end = (next + N - 1) / N * N;
        return;
    }
    long long from = next - s > S->applied ? next - s : S->applied;
    long long end = (from + N - 1) / N * N, hand = end + s;
    if (end < S->apply_end) {
        S->apply_end = end;
        S->total = hand < S->total ? hand : S->total;
    }
}

static dt_status serve(dt_async_ps *P, long long at, long long stop, long long *steps, double *tokens) {
    const dt_async_opts *o = &P->o;
    server S = {.P = P, .o = o, .N = P->N, .n = P->n};
    S.applied = at * S.N;
    S.apply_end = stop * S.N;
    if (P->next < S.applied) P->next = S.applied; /* none handed out ahead (a fresh start) */
    long long ahead = o->fixed ? stop * S.N + o->staleness : stop * S.N, last = o->last * S.N;
    S.total = ahead < last ? ahead : last;
    dt_status s = DT_OK;
    for (int r = 1; s == DT_OK && r < S.N; r++) {
        P->wk[r] = (worker){.task = -1, .tasks = P->wk[r].tasks};
        s = post(&S, r);
    }
    S.t0 = dt_now();
    dt_par_set_updates(o->par, S.applied); /* N updates per global step before this run's first */
    int alive = S.N - 1, stopped = 0; /* a worker whose gradient is on its way in is not told to stop yet */
    while (s == DT_OK && alive > 0) {
        int progress = 0;
        if (!stopped && P->next < S.total && o->stopping && o->stopping(o->ctx)) { /* finish the step under way */
            stop_early(&S);
            stopped = 1;
        }
        for (int r = 1; s == DT_OK && r < S.N; r++) {
            worker *w = &P->wk[r];
            int done = 0;
            if (w->wreq && (s = dt_test(w->wreq, &done)) == DT_OK && done) { /* drives the send on */
                s = dt_wait(w->wreq);
                w->wreq = NULL;
            }
            if (s == DT_OK && w->greq && (s = dt_test(w->greq, &done)) == DT_OK && done) {
                s = dt_wait(w->greq);
                w->greq = NULL;
                if (s == DT_OK) s = arrive(&S, r);
                progress = 1;
            }
            if (s != DT_OK || !w->req || (s = dt_test(w->req, &done)) != DT_OK || !done) continue;
            s = dt_wait(w->req);
            w->req = NULL;
            if (s == DT_OK && w->hdr[H_TASK] == -1) w->waiting = 1; /* its first ask */
            else if (s == DT_OK) s = begin_arrival(&S, r);
            progress = 1;
        }
        if (s == DT_OK) s = drain(&S);
        for (int r = 1; s == DT_OK && r < S.N; r++) {
            worker *w = &P->wk[r];
            if (!w->waiting || (P->next < S.total && !may_start(&S, r))) continue;
            s = answer(&S, r);
            if (w->done) alive--;
            progress = 1;
            if (s == DT_OK) s = drain(&S); /* a hand-out may make an update due */
        }
        if (!progress) idle(P, S.N);
    }
    if (s == DT_OK) s = drain(&S);
    for (int r = 1; s == DT_OK && r < S.N; r++) /* the last weights sent */
        if (P->wk[r].wreq) {
            s = dt_wait(P->wk[r].wreq);
            P->wk[r].wreq = NULL;
        }
    if (s != DT_OK) { /* the exchange itself broke */
        P->broken = 1;
        return s;
    }
    s = S.err;
    if (s == DT_OK && !S.failed && S.applied != S.apply_end)
        s = dt_fail(DT_ERUNTIME, "parameter server: %lld updates at the end, %lld expected", S.applied, S.apply_end);
    *steps = (S.applied - at * S.N) / S.N;
    *tokens = S.all_tokens;
    if (s == DT_OK && !S.failed && stop == o->last) { /* who did what: a slow worker takes fewer tasks */
        long long all = 0;
        for (int r = 1; r < S.N; r++) all += P->wk[r].tasks;
        printf("async: %lld updates; tasks per worker (rank 1..%d):", all, S.N - 1);
        for (int r = 1; r < S.N; r++) printf(" %lld", P->wk[r].tasks);
        printf("\n");
        fflush(stdout);
    }
    return s;
}

/* The receives of the next task and its weights, posted before this worker's gradient
 * goes out: the server's answer (weights with every one) then never waits on the worker
 * entering a receive. */
static dt_status expect_task(dt_async_ps *P, double *msg, dt_request **mreq, dt_request **wreq) {
    DT_TRY(dt_irecv(P->o.comm, msg, 2, DT_F64, 0, TAG_TASK, mreq));
    return dt_irecv(P->o.comm, P->w, P->n, DT_F32, 0, TAG_WEIGHTS, wreq);
}

static dt_status got_task(dt_request **mreq, dt_request **wreq) {
    dt_status s = dt_wait(*mreq);
    *mreq = NULL;
    if (s == DT_OK) s = dt_wait(*wreq); /* the weights follow every answer, the last one's too */
    *wreq = NULL;
    return s;
}

static dt_status work(dt_async_ps *P) {
    const dt_async_opts *o = &P->o;
    dt_comm *c = o->comm;
    int N = P->N;
    size_t n = P->n;
    double hdr[H_N] = {0, 0, -1.0, 0}, msg[2];
    dt_request *mreq = NULL, *wreq = NULL;
    dt_status s = expect_task(P, msg, &mreq, &wreq);
    if (s == DT_OK) s = dt_send(c, hdr, H_N, DT_F64, 0, TAG_ASK);
    while (s == DT_OK) {
        s = got_task(&mreq, &wreq);
        if (s != DT_OK || msg[0] < 0) break;
        long long k = (long long)msg[0], tokens;
        double ver = msg[1];
        dt_status own = dt_par_set_weights(o->par, P->w);
        if (own == DT_OK) {
            o->seek(o->ctx, k / N);
            own = dt_par_task_gradients(o->par, o->fill, o->ctx, (int)(k % N), &hdr[H_LOSS], &tokens);
        }
        if (own == DT_OK && dt_ckpt_test_fail("async_task", k))
            own = dt_fail(DT_ERUNTIME, "task %lld failed on rank %d (test hook DT_TEST_FAIL_AT)", k, dt_comm_rank(c));
        s = expect_task(P, msg, &mreq, &wreq);
        if (own != DT_OK) { /* told to the server, which stops handing out tasks: no rank waits for ever */
            double notice[H_N] = {0, 0, -2.0, 0};
            if (s == DT_OK && dt_send(c, notice, H_N, DT_F64, 0, TAG_ASK) == DT_OK) (void)got_task(&mreq, &wreq);
            s = own;
            break;
        }
        hdr[H_TOKENS] = (double)tokens;
        hdr[H_TASK] = (double)k;
        hdr[H_VERSION] = ver;
        if (s == DT_OK) s = dt_send(c, hdr, H_N, DT_F64, 0, TAG_ASK);
        if (s == DT_OK) s = dt_send(c, dt_par_grad_buffer(o->par), n, DT_F32, 0, TAG_GRAD);
        dt_heartbeat(k / N, dt_comm_rank(c));
    }
    if (mreq || wreq) P->broken = 1; /* receives still posted into P->w: kept, never freed */
    return s;
}

dt_status dt_async_ps_create(dt_async_ps **out, const dt_async_opts *o) {
    dt_async_ps *P = calloc(1, sizeof *P);
    *out = P;
    dt_status s = P ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (parameter server)");
    if (s == DT_OK) {
        P->o = *o;
        P->N = dt_comm_size(o->comm);
        P->n = dt_par_nparams(o->par);
        P->slots = o->fixed && dt_comm_rank(o->comm) == 0 ? o->staleness + 1 : 0;
        P->w = malloc(P->n * sizeof(float) + 1);
        P->wk = calloc((size_t)P->N, sizeof *P->wk);
        P->early = calloc((size_t)P->slots + 1, sizeof *P->early);
        P->early_task = calloc((size_t)P->slots + 1, sizeof *P->early_task);
        P->early_hdr = calloc((size_t)P->slots + 1, sizeof *P->early_hdr);
        P->wout = calloc((size_t)P->N, sizeof *P->wout);
        P->gin = calloc((size_t)P->N, sizeof *P->gin);
        if (!P->w || !P->wk || !P->early || !P->early_task || !P->early_hdr || !P->wout || !P->gin)
            s = dt_fail(DT_ERUNTIME, "out of memory (parameter server)");
    }
    for (int r = 1; s == DT_OK && dt_comm_rank(o->comm) == 0 && r < P->N; r++) {
        P->wout[r] = malloc(P->n * sizeof(float) + 1);
        P->gin[r] = o->fixed ? NULL : malloc(P->n * sizeof(float) + 1);
        if (!P->wout[r] || (!o->fixed && !P->gin[r]))
            s = dt_fail(DT_ERUNTIME, "out of memory (parameter server: the workers' weights and gradients in flight)");
    }
    for (int i = 0; s == DT_OK && i < P->slots; i++) {
        P->early_task[i] = -1;
        if (!(P->early[i] = malloc(P->n * sizeof(float) + 1)))
            s = dt_fail(DT_ERUNTIME, "out of memory (parameter server: gradients waiting their turn)");
    }
    return dt_comm_agree(o->comm, s, NULL);
}

void dt_async_ps_free(dt_async_ps *P) {
    if (!P) return;
    for (int i = 0; P->early && i < P->slots; i++) free(P->early[i]);
    free(P->early);
    free(P->early_task);
    free(P->early_hdr);
    if (!P->broken) free(P->w); /* a broken exchange may still write it */
    for (int r = 0; !P->broken && P->wout && r < P->N; r++) { /* a broken exchange may still write them */
        free(P->wout[r]);
        free(P->gin[r]);
    }
    free(P->wout);
    free(P->gin);
    if (!P->broken) free(P->wk);
    free(P);
}

/* The tasks handed out ahead of update u (fixed order, at a run's end): u .. next - 1. */
static int pending(const dt_async_ps *P, long long u) { return P->slots && P->next > u ? (int)(P->next - u) : 0; }

dt_status dt_async_ps_save(void *ps, const char *dir, long long step, int rank, const char *layout) {
    dt_async_ps *P = ps;
    if (rank != 0) return DT_OK;
    long long u = step * P->N;
    int k = pending(P, u);
    double count = (double)k, *hdr = malloc((size_t)k * H_N * sizeof(double) + 1);
    float *g = malloc((size_t)k * P->n * sizeof(float) + 1);
    if (!g || !hdr) {
        free(g);
        free(hdr);
        return dt_fail(DT_ERUNTIME, "out of memory (saving the parameter server's gradients)");
    }
    dt_status s = DT_OK;
    for (int i = 0; s == DT_OK && i < k; i++) { /* in task order */
        int slot = (int)((u + i) % P->slots);
        if (P->early_task[slot] != u + i)
            s = dt_fail(DT_ERUNTIME, "parameter server: task %lld's gradient missing at the save", u + i);
        else {
            memcpy(g + (size_t)i * P->n, P->early[slot], P->n * sizeof(float));
            memcpy(hdr + (size_t)i * H_N, P->early_hdr[slot], sizeof P->early_hdr[slot]);
        }
    }
    st_tensor_ref t[] = {{"pending_count", ST_F64, 1, {1}, &count},
                         {"pending_headers", ST_F64, 2, {k, H_N}, hdr},
                         {"pending_gradients", ST_F32, 2, {k, (int64_t)P->n}, g}};
    if (s == DT_OK) s = dt_rank_state_save(dir, step, rank, layout, t, k > 0 ? 3 : 1);
    free(g);
    free(hdr);
    return s;
}

dt_status dt_async_ps_load(void *ps, const char *step_dir, long long step, int rank, const char *layout) {
    dt_async_ps *P = ps;
    long long u = step * P->N;
    P->next = u;
    for (int i = 0; i < P->slots; i++) P->early_task[i] = -1;
    /* the real order holds nothing between runs; another mode's checkpoint: none either */
    if (rank != 0 || !P->slots || !dt_rank_state_present(step_dir, step)) return DT_OK;
    st_file f = {0};
    DT_TRY(dt_rank_state_open(step_dir, step, rank, layout, &f));
    double count = 0.0;
    dt_status s = dt_rank_state_read_f64(&f, "pending_count", &count, 1);
    int in_range = count >= 0 && count <= P->o.staleness, k = in_range ? (int)count : 0; /* no cast of a wild value */
    if (s == DT_OK && (!in_range || count != (double)k))
        s = dt_fail(DT_EINPUT, "%s: pending_count %g is not 0 .. parallel.staleness %d", f.path, count,
                    P->slots ? P->o.staleness : 0);
    double *hdr = s == DT_OK ? malloc((size_t)k * H_N * sizeof(double) + 1) : NULL;
    float *g = s == DT_OK ? malloc((size_t)k * P->n * sizeof(float) + 1) : NULL;
    if (s == DT_OK && (!g || !hdr)) s = dt_fail(DT_ERUNTIME, "out of memory (the parameter server's gradients)");
    if (s == DT_OK && k > 0) s = dt_rank_state_read_f64(&f, "pending_headers", hdr, (size_t)k * H_N);
    if (s == DT_OK && k > 0) s = dt_rank_state_read(&f, "pending_gradients", g, (size_t)k * P->n);
    for (int i = 0; s == DT_OK && i < k; i++) {
        int slot = (int)((u + i) % P->slots);
        if ((long long)hdr[(size_t)i * H_N + H_TASK] != u + i) {
            s = dt_fail(DT_EINPUT, "%s: pending gradient %d is task %g, not %lld", f.path, i,
                        hdr[(size_t)i * H_N + H_TASK], u + i);
            break;
        }
        memcpy(P->early_hdr[slot], hdr + (size_t)i * H_N, sizeof P->early_hdr[slot]);
        memcpy(P->early[slot], g + (size_t)i * P->n, P->n * sizeof(float));
        P->early_task[slot] = u + i;
    }
    free(g);
    free(hdr);
    if (s == DT_OK) P->next = u + k;
    st_close(&f);
    return s;
}

dt_status dt_async_ps_run(dt_async_ps *P, long long at, long long stop, long long *steps, double *seconds,
                          double *tokens) {
    const dt_async_opts *o = &P->o;
    double t0 = dt_now();
    *tokens = 0.0;
    *steps = 0;
    dt_status s = dt_comm_rank(o->comm) == 0 ? serve(P, at, stop, steps, tokens) : work(P);
    DT_TRY(dt_comm_agree(o->comm, s, NULL));
    double done = (double)*steps;
    DT_TRY(dt_bcast(o->comm, &done, 1, DT_F64, 0));
    *steps = (long long)done;
    /* every rank ends with the server's weights, its loader at the last step's batch */
    s = dt_comm_rank(o->comm) == 0 ? dt_par_get_weights(o->par, P->w) : DT_OK;
    DT_TRY(dt_comm_agree(o->comm, s, NULL));
    s = dt_bcast(o->comm, P->w, P->n, DT_F32, 0);
    if (s == DT_OK && dt_comm_rank(o->comm) != 0) s = dt_par_set_weights(o->par, P->w);
    if (*steps > 0) o->seek(o->ctx, at + *steps - 1);
    *seconds = dt_now() - t0;
    return dt_comm_agree(o->comm, s, NULL);
}

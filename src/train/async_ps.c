#include "async_ps.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/timer.h"
#include "../launch/heartbeat.h"

enum { TAG_ASK = 71, TAG_GRAD = 72, TAG_TASK = 73, TAG_WEIGHTS = 74 };
enum { H_LOSS, H_TOKENS, H_TASK, H_VERSION, H_N }; /* a worker's header */

typedef struct {
    double hdr[H_N];
    dt_request *req; /* the posted receive of its next header (NULL: none) */
    long long task;  /* in progress (-1: none) */
    long long ver;   /* the server's update count when it got its weights */
    int waiting;     /* asked, not answered yet */
    int done;        /* told to stop */
    long long tasks; /* applied */
} worker;

typedef struct {
    const dt_async_opts *o;
    int N;
    size_t n;
    float *w;         /* the weights sent with a task */
    worker *wk;       /* wk[r], r = 1 .. N-1 */
    long long next, total, applied; /* tasks: the next to hand out, the end, the updates done */
    long long version;
    /* fixed order: gradients that arrived before their turn, task t in slot t mod (s + 1) */
    float **early;
    long long *early_task; /* the task a slot holds, -1: empty */
    double (*early_hdr)[H_N];
    int failed;   /* a rank failed (a worker's notice, or the server's own error): no new tasks, wind down */
    dt_status err; /* the server's own first error */
    /* the global step being reported */
    double loss, ltok, norm, lr, stale_sum, t0, tokens, all_tokens;
    int stale_max, in_step;
} server;

/* A failure that leaves the protocol intact (the server's own update, a worker's notice):
 * no new task; every worker is told to stop when it next asks, so no rank waits for ever. */
static void wind_down(server *S, dt_status own) {
    if (own != DT_OK && S->err == DT_OK) S->err = own;
    S->failed = 1;
    S->total = S->next;
}

static dt_status post(server *S, int r) {
    return dt_irecv(S->o->comm, S->wk[r].hdr, H_N, DT_F64, r, TAG_ASK, &S->wk[r].req);
}

/* Whether worker r may take a task now: the server is at most s updates past the weights
 * of every other task in progress. */
static int may_start(const server *S, int r) {
    if (S->o->fixed) return S->next - S->o->first * S->N <= S->version + S->o->staleness;
    for (int q = 1; q < S->N; q++)
        if (q != r && S->wk[q].task >= 0 && S->version - S->wk[q].ver > S->o->staleness) return 0;
    return 1;
}

static dt_status answer(server *S, int r) {
    worker *w = &S->wk[r];
    double msg[2] = {-1.0, (double)S->version};
    if (S->next < S->total) {
        dt_status g = dt_par_get_weights(S->o->par, S->w);
        if (g != DT_OK) wind_down(S, g);
    }
    if (S->next < S->total) {
        w->task = S->next++;
        w->ver = S->version;
        msg[0] = (double)w->task;
    } else {
        w->done = 1;
    }
    w->waiting = 0;
    DT_TRY(dt_send(S->o->comm, msg, 2, DT_F64, r, TAG_TASK));
    if (w->done) return DT_OK;
    DT_TRY(dt_send(S->o->comm, S->w, S->n, DT_F32, r, TAG_WEIGHTS));
    return post(S, r);
}

/* The gradient in the model's gradient buffer, of task k (header hdr) computed at update
 * `ver`: applied now, one update. */
static dt_status update(server *S, const double *hdr, long long ver) {
    const dt_async_opts *o = S->o;
    long long k = (long long)hdr[H_TASK];
    double lr = dt_par_lr_at(o->par, k / S->N), norm;
    DT_TRY(dt_par_apply(o->par, lr, &norm));
    int stale = (int)(S->version - ver);
    S->version++;
    S->applied++;
    dt_heartbeat(S->applied, 0);
    S->loss += hdr[H_LOSS];
    S->ltok += hdr[H_TOKENS];
    S->norm = norm;
    S->lr = lr;
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

/* Worker r's gradient for its task: applied at once; in the fixed order, kept until its
 * turn (the updates so far are exactly the tasks before it) and until the task s after it
 * has been handed out (so that one got the weights of exactly this turn). */
static dt_status arrive(server *S, int r) {
    worker *w = &S->wk[r];
    const dt_async_opts *o = S->o;
    long long k = (long long)w->hdr[H_TASK];
    w->task = -1;
    if (k < 0) { /* its notice of a failure: it sends nothing more */
        wind_down(S, DT_OK);
        return DT_OK;
    }
    w->tasks++;
    if (!o->fixed || S->failed) { /* winding down: received, not applied */
        DT_TRY(dt_recv(o->comm, dt_par_grad_buffer(o->par), S->n, DT_F32, r, TAG_GRAD));
        if (S->failed) return DT_OK;
        dt_status u = update(S, w->hdr, w->ver);
        if (u != DT_OK) wind_down(S, u);
        return DT_OK;
    }
    int slot = (int)(k % (o->staleness + 1));
    DT_TRY(dt_recv(o->comm, S->early[slot], S->n, DT_F32, r, TAG_GRAD));
    S->early_task[slot] = k;
    memcpy(S->early_hdr[slot], w->hdr, sizeof w->hdr);
    S->early_hdr[slot][H_VERSION] = (double)w->ver;
    return DT_OK;
}

/* The fixed order's updates that are due. */
static dt_status drain(server *S) {
    const dt_async_opts *o = S->o;
    long long base = o->first * S->N;
    while (o->fixed && !S->failed) {
        long long t = base + S->version; /* the task whose turn it is */
        int slot = (int)(t % (o->staleness + 1));
        if (S->early_task[slot] != t) return DT_OK;                             /* not here yet */
        if (S->next < S->total && S->next <= t + o->staleness) return DT_OK; /* t + s not handed out yet */
        memcpy(dt_par_grad_buffer(o->par), S->early[slot], S->n * sizeof(float));
        S->early_task[slot] = -1;
        dt_status u = update(S, S->early_hdr[slot], (long long)S->early_hdr[slot][H_VERSION]);
        if (u != DT_OK) wind_down(S, u);
    }
    return DT_OK;
}

static dt_status serve(const dt_async_opts *o, long long *steps, double *tokens) {
    server S = {.o = o, .N = dt_comm_size(o->comm), .n = dt_par_nparams(o->par)};
    S.next = S.applied = o->first * S.N;
    S.total = o->stop * S.N;
    S.w = malloc(S.n * sizeof(float) + 1);
    S.wk = calloc((size_t)S.N, sizeof *S.wk);
    int slots = o->fixed ? o->staleness + 1 : 0;
    S.early = calloc((size_t)slots + 1, sizeof *S.early);
    S.early_task = calloc((size_t)slots + 1, sizeof *S.early_task);
    S.early_hdr = calloc((size_t)slots + 1, sizeof *S.early_hdr);
    dt_status s = S.w && S.wk && S.early && S.early_task && S.early_hdr
                      ? DT_OK
                      : dt_fail(DT_ERUNTIME, "out of memory (parameter server)");
    for (int i = 0; s == DT_OK && i < slots; i++) {
        S.early_task[i] = -1;
        if (!(S.early[i] = malloc(S.n * sizeof(float) + 1)))
            s = dt_fail(DT_ERUNTIME, "out of memory (parameter server: gradients waiting their turn)");
    }
    for (int r = 1; s == DT_OK && r < S.N; r++) {
        S.wk[r].task = -1;
        s = post(&S, r);
    }
    S.t0 = dt_now();
    dt_par_set_updates(o->par, S.applied); /* N updates per global step before this run's first */
    int alive = S.N - 1;
    while (s == DT_OK && alive > 0) {
        int progress = 0;
        if (S.next < S.total && o->stopping && o->stopping(o->ctx)) /* finish the global step under way */
            S.total = (S.next + S.N - 1) / S.N * S.N;
        for (int r = 1; s == DT_OK && r < S.N; r++) {
            worker *w = &S.wk[r];
            if (!w->req) continue;
            int done = 0;
            s = dt_test(w->req, &done);
            if (s != DT_OK || !done) continue;
            s = dt_wait(w->req);
            w->req = NULL;
            if (s == DT_OK && w->hdr[H_TASK] != -1) s = arrive(&S, r); /* -1: its first ask */
            w->waiting = 1;
            progress = 1;
        }
        if (s == DT_OK) s = drain(&S);
        for (int r = 1; s == DT_OK && r < S.N; r++) {
            worker *w = &S.wk[r];
            if (!w->waiting || (S.next < S.total && !may_start(&S, r))) continue;
            s = answer(&S, r);
            if (w->done) alive--;
            progress = 1;
            if (s == DT_OK) s = drain(&S); /* a hand-out may make an update due */
        }
        if (!progress) sched_yield();
    }
    if (s != DT_OK) /* the exchange itself broke: receives may still be posted into wk, so nothing is freed */
        return s;
    s = S.err;
    *steps = (S.applied - o->first * S.N) / S.N;
    *tokens = S.all_tokens;
    if (s == DT_OK && !S.failed && S.wk) { /* who did what: a slow worker takes fewer tasks */
        printf("async: %lld updates; tasks per worker (rank 1..%d):", S.applied - o->first * S.N, S.N - 1);
        for (int r = 1; r < S.N; r++) printf(" %lld", S.wk[r].tasks);
        printf("\n");
        fflush(stdout);
    }
    for (int i = 0; S.early && i < slots; i++) free(S.early[i]);
    free(S.early);
    free(S.early_task);
    free(S.early_hdr);
    free(S.w);
    free(S.wk);
    return s;
}

static dt_status work(const dt_async_opts *o, long long *steps) {
    dt_comm *c = o->comm;
    int N = dt_comm_size(c);
    size_t n = dt_par_nparams(o->par);
    float *w = malloc(n * sizeof(float) + 1);
    if (!w) return dt_fail(DT_ERUNTIME, "out of memory (parameter server worker)");
    double hdr[H_N] = {0, 0, -1.0, 0}, msg[2];
    dt_status s = dt_send(c, hdr, H_N, DT_F64, 0, TAG_ASK);
    while (s == DT_OK) {
        s = dt_recv(c, msg, 2, DT_F64, 0, TAG_TASK);
        if (s != DT_OK || msg[0] < 0) break;
        long long k = (long long)msg[0];
        s = dt_recv(c, w, n, DT_F32, 0, TAG_WEIGHTS);
        if (s != DT_OK) break;
        long long tokens;
        dt_status own = dt_par_set_weights(o->par, w);
        if (own == DT_OK) {
            o->seek(o->ctx, k / N);
            own = dt_par_task_gradients(o->par, o->fill, o->ctx, (int)(k % N), &hdr[H_LOSS], &tokens);
        }
        if (own != DT_OK) { /* told to the server, which stops handing out tasks: no rank waits for ever */
            double notice[H_N] = {0, 0, -2.0, 0};
            if (dt_send(c, notice, H_N, DT_F64, 0, TAG_ASK) == DT_OK) (void)dt_recv(c, msg, 2, DT_F64, 0, TAG_TASK);
            s = own;
            break;
        }
        hdr[H_TOKENS] = (double)tokens;
        hdr[H_TASK] = (double)k;
        hdr[H_VERSION] = msg[1];
        s = dt_send(c, hdr, H_N, DT_F64, 0, TAG_ASK);
        if (s == DT_OK) s = dt_send(c, dt_par_grad_buffer(o->par), n, DT_F32, 0, TAG_GRAD);
        dt_heartbeat(k / N, dt_comm_rank(c));
    }
    free(w);
    *steps = 0;
    return s;
}

dt_status dt_async_ps_run(const dt_async_opts *o, long long *steps, double *seconds, double *tokens) {
    double t0 = dt_now();
    *tokens = 0.0;
    dt_status s = dt_comm_rank(o->comm) == 0 ? serve(o, steps, tokens) : work(o, steps);
    DT_TRY(dt_comm_agree(o->comm, s, NULL));
    double done = (double)*steps;
    DT_TRY(dt_bcast(o->comm, &done, 1, DT_F64, 0));
    *steps = (long long)done;
    /* every rank ends with the server's weights, its loader at the last step's batch */
    size_t n = dt_par_nparams(o->par);
    float *w = malloc(n * sizeof(float) + 1);
    s = w ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (the final weights)");
    if (s == DT_OK && dt_comm_rank(o->comm) == 0) s = dt_par_get_weights(o->par, w);
    s = dt_comm_agree(o->comm, s, NULL);
    if (s != DT_OK) {
        free(w);
        return s;
    }
    s = dt_bcast(o->comm, w, n, DT_F32, 0);
    if (s == DT_OK && dt_comm_rank(o->comm) != 0) s = dt_par_set_weights(o->par, w);
    free(w);
    if (*steps > 0) o->seek(o->ctx, o->first + *steps - 1);
    *seconds = dt_now() - t0;
    return dt_comm_agree(o->comm, s, NULL);
}

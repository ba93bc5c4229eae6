#include "schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[DT_SCHED_N] = {"gpipe", "1f1b", "interleaved", "zb-h1"};

dt_status dt_schedule_parse(const char *name, dt_schedule *out) {
    for (int s = 0; s < DT_SCHED_N; s++)
        if (!strcmp(name, names[s])) {
            *out = (dt_schedule)s;
            return DT_OK;
        }
    return dt_fail(DT_EINPUT, "parallel.schedule '%s' is not one of gpipe, 1f1b, interleaved, zb-h1", name);
}

const char *dt_schedule_name(dt_schedule s) { return s >= 0 && s < DT_SCHED_N ? names[s] : "?"; }

int dt_schedule_splits_backward(dt_schedule s) { return s == DT_SCHED_ZBH1; }

dt_status dt_schedule_check(dt_schedule s, int p, int v, int m) {
    if (p < 1 || m < 1) return dt_fail(DT_EINPUT, "pipeline: %d stages and %d micro-batches must be positive", p, m);
    if (p > 64) return dt_fail(DT_EINPUT, "pipeline: %d stages exceed the 64 supported", p);
    if (s == DT_SCHED_INTERLEAVED) {
        if (v < 2)
            return dt_fail(DT_EINPUT, "parallel.schedule interleaved needs parallel.virtual_stages >= 2 (got %d)", v);
        if (m % p != 0)
            return dt_fail(DT_EINPUT, "parallel.schedule interleaved: the %d micro-batches must be a multiple of the "
                           "%d pipeline stages", m, p);
    } else if (v != 1) {
        return dt_fail(DT_EINPUT, "parallel.virtual_stages %d needs parallel.schedule interleaved (got %s)", v,
                       dt_schedule_name(s));
    }
    return DT_OK;
}

int dt_schedule_max_ops(int v, int m) { return 7 * v * m; }

/* The i-th forward (backward: reversed chunks) of a rank in the interleaved order:
 * micro-batches go round in groups of p, each group through every local chunk. */
static void nth(int i, int p, int v, int backward, int *mb, int *k) {
    int group = i / (p * v), within = i % (p * v);
    *k = within / p;
    if (backward) *k = v - 1 - *k;
    *mb = group * p + within % p;
}

typedef struct {
    dt_pp_op *ops;
    int n, p, v, r;
} plan;

static void push(plan *pl, dt_op_kind kind, int mb, int k, int peer) {
    pl->ops[pl->n++] = (dt_pp_op){kind, mb, k, peer};
}

/* A compute operation with the communication around it. */
static void emit(plan *pl, dt_op_kind kind, int mb, int k) {
    int p = pl->p, g = k * p + pl->r, last = p * pl->v - 1;
    int prev = (pl->r - 1 + p) % p, next = (pl->r + 1) % p;
    if (kind == DT_OP_F && g > 0) push(pl, DT_OP_RECV_ACT, mb, k, prev);
    if (kind == DT_OP_B && g < last) push(pl, DT_OP_RECV_GRAD, mb, k, next);
    push(pl, kind, mb, k, -1);
    if (kind == DT_OP_F && g < last) push(pl, DT_OP_SEND_ACT, mb, k, next);
    if (kind == DT_OP_B && g > 0) push(pl, DT_OP_SEND_GRAD, mb, k, prev);
}

int dt_schedule_ops(dt_schedule s, int p, int v, int m, int r, dt_pp_op *ops) {
    plan pl = {ops, 0, p, v, r};
    int total = m * v, nf = 0, nb = 0, mb, k;
    if (s == DT_SCHED_GPIPE) { /* every forward, then every backward */
        for (int i = 0; i < total; i++) emit(&pl, DT_OP_F, i, 0);
        for (int i = 0; i < total; i++) emit(&pl, DT_OP_B, i, 0);
        return pl.n;
    }
    /* 1F1B family: warm up with the forwards the later stages need, then alternate, then
     * drain. Interleaved warms up longer (Megatron's count: each of the v-1 extra rounds
     * of chunks adds p forwards). */
    int warm = v == 1 ? p - r - 1 : (p - r - 1) * 2 + (v - 1) * p;
    if (warm > total) warm = total;
    /* zb-h1: W of the oldest micro-batch once more than r of them wait: later stages
     * defer more, passing input gradients upstream sooner; at most p micro-batches in
     * flight on any rank, as 1F1B */
    int split = dt_schedule_splits_backward(s), nw = 0;
    for (; nf < warm; nf++) {
        nth(nf, p, v, 0, &mb, &k);
        emit(&pl, DT_OP_F, mb, k);
    }
    while (nb < total) {
        if (nf < total) {
            nth(nf++, p, v, 0, &mb, &k);
            emit(&pl, DT_OP_F, mb, k);
        }
        nth(nb++, p, v, 1, &mb, &k);
        emit(&pl, DT_OP_B, mb, k);
        if (split && (nb - nw > r || nf == total)) { /* in the drain, one W after each B */
            nth(nw++, p, v, 1, &mb, &k);
            emit(&pl, DT_OP_W, mb, k);
        }
    }
    while (split && nw < total) {
        nth(nw++, p, v, 1, &mb, &k);
        emit(&pl, DT_OP_W, mb, k);
    }
    return pl.n;
}

/* ---- the simulator ---- */

typedef struct {
    dt_pp_op *ops;
    int n, pc;
    double t, busy;
    int inflight, peak;
} sim_rank;

/* state per (mb, global chunk): 0 nothing, 1 F done, 2 B done, 3 W done */
typedef struct {
    unsigned char *done;
    double *act_sent, *grad_sent; /* time the send happened, -1 if not yet */
    unsigned char *act_recv, *grad_recv;
} sim_msgs;

dt_status dt_plan_simulate(const char *name, dt_pp_op *const *plans, const int *lens, int p, int v, int m,
                           int split, double t_f, double t_b, double t_w, dt_sim_result *out) {
    memset(out, 0, sizeof *out);
    if (p < 1 || p > 64 || v < 1 || m < 1) return dt_fail(DT_EINPUT, "plan: p %d, v %d, m %d", p, v, m);
    int chunks = p * v, cells = m * chunks;
    sim_rank *R = calloc((size_t)p, sizeof *R);
    sim_msgs M = {calloc((size_t)cells, 1), malloc((size_t)cells * sizeof(double)),
                  malloc((size_t)cells * sizeof(double)), calloc((size_t)cells, 1), calloc((size_t)cells, 1)};
    dt_status st = DT_OK;
    if (!R || !M.done || !M.act_sent || !M.grad_sent || !M.act_recv || !M.grad_recv) {
        st = dt_fail(DT_ERUNTIME, "out of memory (schedule simulation)");
        goto done;
    }
    for (int i = 0; i < cells; i++) M.act_sent[i] = M.grad_sent[i] = -1;
    for (int r = 0; r < p; r++) {
        R[r].ops = plans[r];
        R[r].n = lens[r];
    }
    double cost[3] = {t_f / v, (split ? t_b : t_b + t_w) / v, t_w / v};
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < p; r++) {
            sim_rank *x = &R[r];
            while (x->pc < x->n) {
                const dt_pp_op *o = &x->ops[x->pc];
                int g = o->chunk * p + r, cell = o->mb * chunks + g;
                if (o->mb < 0 || o->mb >= m || o->chunk < 0 || o->chunk >= v) {
                    st = dt_fail(DT_ERUNTIME, "schedule %s: rank %d op %d names micro-batch %d chunk %d",
                                 name, r, x->pc, o->mb, o->chunk);
                    goto done;
                }
                int ok = 1;
                switch (o->kind) {
                case DT_OP_RECV_ACT: /* the previous chunk's send, at its rank */
                    if (g == 0 || o->peer != (r - 1 + p) % p) ok = -1;
                    else if (M.act_sent[cell - 1] < 0) ok = 0;
                    else {
                        if (x->t < M.act_sent[cell - 1]) x->t = M.act_sent[cell - 1];
                        M.act_recv[cell - 1] = 1;
                    }
                    break;
                case DT_OP_RECV_GRAD:
                    if (g == chunks - 1 || o->peer != (r + 1) % p) ok = -1;
                    else if (M.grad_sent[cell + 1] < 0) ok = 0;
                    else {
                        if (x->t < M.grad_sent[cell + 1]) x->t = M.grad_sent[cell + 1];
                        M.grad_recv[cell + 1] = 1;
                    }
                    break;
                case DT_OP_SEND_ACT:
                    if (g == chunks - 1 || M.done[cell] < 1 || M.act_sent[cell] >= 0) ok = -1;
                    else M.act_sent[cell] = x->t;
                    break;
                case DT_OP_SEND_GRAD:
                    if (g == 0 || M.done[cell] < 2 || M.grad_sent[cell] >= 0) ok = -1;
                    else M.grad_sent[cell] = x->t;
                    break;
                case DT_OP_F:
                case DT_OP_B:
                case DT_OP_W: {
                    int step = o->kind == DT_OP_F ? 1 : o->kind == DT_OP_B ? 2 : 3;
                    if (M.done[cell] != step - 1 || (o->kind == DT_OP_W && !split)) ok = -1;
                    else if (step == 1 && g > 0 && !M.act_recv[cell - 1]) ok = -1; /* F without its input */
                    else if (step == 2 && g < chunks - 1 && !M.grad_recv[cell + 1]) ok = -1;
                    else {
                        M.done[cell] = (unsigned char)step;
                        x->t += cost[step - 1];
                        x->busy += cost[step - 1];
                        if (step == 1) x->inflight++;
                        if (step == (split ? 3 : 2)) x->inflight--;
                        if (x->inflight > x->peak) x->peak = x->inflight;
                    }
                    break;
                }
                default:
                    ok = -1;
                }
                if (ok < 0) {
                    static const char *kn[DT_OP_N] = {"F", "B", "W", "send act", "recv act", "send grad", "recv grad"};
                    st = dt_fail(DT_ERUNTIME, "schedule %s (p %d, v %d, m %d): rank %d op %d (%s mb %d chunk %d) is out "
                                 "of order", name, p, v, m, r, x->pc,
                                 o->kind < DT_OP_N ? kn[o->kind] : "?", o->mb, o->chunk);
                    goto done;
                }
                if (!ok) break; /* waits for a send */
                x->pc++;
                progress = 1;
            }
        }
    }
    double busy = 0;
    for (int r = 0; r < p; r++) {
        if (R[r].pc < R[r].n) {
            st = dt_fail(DT_ERUNTIME, "schedule %s (p %d, v %d, m %d): deadlock, rank %d waits at op %d",
                         name, p, v, m, r, R[r].pc);
            goto done;
        }
        if (R[r].t > out->makespan) out->makespan = R[r].t;
        busy += R[r].busy;
        out->peak_inflight[r] = R[r].peak;
        if ((double)R[r].peak / v > out->peak_stages) out->peak_stages = (double)R[r].peak / v;
    }
    for (int i = 0; i < cells; i++) {
        int g = i % chunks;
        if (M.done[i] != (split ? 3 : 2) || (g < chunks - 1 && !M.act_recv[i]) || (g > 0 && !M.grad_recv[i])) {
            st = dt_fail(DT_ERUNTIME, "schedule %s (p %d, v %d, m %d): micro-batch %d chunk %d is incomplete",
                         name, p, v, m, i / chunks, g);
            goto done;
        }
    }
    out->bubble = 1.0 - busy / ((double)p * out->makespan);
done:
    free(R);
    free(M.done);
    free(M.act_sent);
    free(M.grad_sent);
    free(M.act_recv);
    free(M.grad_recv);
    return st;
}

dt_status dt_schedule_simulate(dt_schedule s, int p, int v, int m, double t_f, double t_b, double t_w,
                               dt_sim_result *out) {
    DT_TRY(dt_schedule_check(s, p, v, m));
    int cap = dt_schedule_max_ops(v, m), lens[64];
    dt_pp_op *all = malloc((size_t)p * (size_t)cap * sizeof *all), *plans[64];
    if (!all) return dt_fail(DT_ERUNTIME, "out of memory (schedule simulation)");
    for (int r = 0; r < p; r++) {
        plans[r] = all + (size_t)r * cap;
        lens[r] = dt_schedule_ops(s, p, v, m, r, plans[r]);
    }
    dt_status st = dt_plan_simulate(dt_schedule_name(s), plans, lens, p, v, m, dt_schedule_splits_backward(s), t_f,
                                    t_b, t_w, out);
    free(all);
    return st;
}

double dt_schedule_bubble_formula(dt_schedule s, int p, int v, int m, double t_f, double t_b, double t_w) {
    if (s == DT_SCHED_INTERLEAVED) return (p - 1.0) / (v * m + p - 1.0);
    if (s == DT_SCHED_ZBH1) {
        double idle = (p - 1.0) * (t_f + t_b - t_w), work = m * (t_f + t_b + t_w);
        return idle / (work + idle);
    }
    return (p - 1.0) / (m + p - 1.0);
}

dt_status dt_schedule_draw(dt_schedule s, int p, int v, int m, char *buf, size_t cap) {
    DT_TRY(dt_schedule_check(s, p, v, m));
    int split = dt_schedule_splits_backward(s);
    /* the same simulation with integer costs, recording what each rank does when */
    int ops_cap = dt_schedule_max_ops(v, m), chunks = p * v;
    int tf = 1, tb = split ? 1 : 2, tw = 1; /* time units per chunk pass */
    int *pc = calloc((size_t)p, sizeof(int)), *t = calloc((size_t)p, sizeof(int)), *n = calloc((size_t)p, sizeof(int));
    int *sent = malloc((size_t)(2 * m * chunks) * sizeof(int));
    dt_pp_op *all = malloc((size_t)p * (size_t)ops_cap * sizeof *all);
    int width = 4 * m * v * 3 + 8;
    char *rows = malloc((size_t)p * (size_t)width);
    dt_status st = DT_OK;
    if (!pc || !t || !n || !sent || !all || !rows) {
        st = dt_fail(DT_ERUNTIME, "out of memory (schedule drawing)");
        goto done;
    }
    memset(rows, '.', (size_t)p * (size_t)width);
    for (int i = 0; i < 2 * m * chunks; i++) sent[i] = -1;
    for (int r = 0; r < p; r++) n[r] = dt_schedule_ops(s, p, v, m, r, all + (size_t)r * ops_cap);
    int makespan = 0;
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < p; r++)
            while (pc[r] < n[r]) {
                const dt_pp_op *o = &all[(size_t)r * ops_cap + pc[r]];
                int cell = o->mb * chunks + o->chunk * p + r;
                if (o->kind == DT_OP_RECV_ACT || o->kind == DT_OP_RECV_GRAD) {
                    int from = o->kind == DT_OP_RECV_ACT ? cell - 1 : m * chunks + cell + 1;
                    if (sent[from] < 0) break;
                    if (t[r] < sent[from]) t[r] = sent[from];
                } else if (o->kind == DT_OP_SEND_ACT || o->kind == DT_OP_SEND_GRAD) {
                    sent[o->kind == DT_OP_SEND_ACT ? cell : m * chunks + cell] = t[r];
                } else {
                    int d = o->kind == DT_OP_F ? tf : o->kind == DT_OP_B ? tb : tw;
                    char c = o->kind == DT_OP_F   ? (char)(o->mb < 10 ? '0' + o->mb : '+')
                             : o->kind == DT_OP_B ? (char)('a' + o->mb % 26)
                                                  : (char)('A' + o->mb % 26);
                    for (int k = 0; k < d && t[r] + k < width - 1; k++) rows[(size_t)r * width + t[r] + k] = c;
                    t[r] += d;
                }
                if (t[r] > makespan) makespan = t[r];
                pc[r]++;
                progress = 1;
            }
    }
    size_t used = 0;
    if (makespan > width - 1) makespan = width - 1;
    for (int r = 0; r < p && used < cap; r++) {
        int w = snprintf(buf + used, cap - used, "rank %d |%.*s|\n", r, makespan, rows + (size_t)r * width);
        if (w < 0) break;
        used += (size_t)w;
    }
done:
    free(pc);
    free(t);
    free(n);
    free(sent);
    free(all);
    free(rows);
    return st;
}

/* ---- activation slots ---- */

/* Happens-before over every rank's list: clock[(r·cap + i)·p + q] = how many of rank q's
 * operations certainly ran before rank r's operation i finished (a receive completes
 * after its send was issued). recv_at[send op] = (receiving rank, its op index). */
typedef struct {
    int p, cap;
    int *clock;
    int *recv_rank, *recv_op; /* per (r, i): for a send, where it is received */
} plan_clocks;

static dt_status clocks_build(dt_pp_op *const *plans, const int *lens, int p, int v, int m, int cap, plan_clocks *c) {
    int chunks = p * v, cells = m * chunks;
    c->p = p;
    c->cap = cap;
    c->clock = calloc((size_t)p * cap * p, sizeof(int));
    c->recv_rank = malloc((size_t)p * cap * sizeof(int));
    c->recv_op = malloc((size_t)p * cap * sizeof(int));
    int *send_op = malloc((size_t)2 * cells * sizeof(int)), *pc = calloc((size_t)p, sizeof(int));
    dt_status st = DT_OK;
    if (!c->clock || !c->recv_rank || !c->recv_op || !send_op || !pc) {
        st = dt_fail(DT_ERUNTIME, "out of memory (pipeline slots)");
        goto done;
    }
    for (size_t i = 0; i < (size_t)p * cap; i++) c->recv_rank[i] = c->recv_op[i] = -1;
    for (int i = 0; i < 2 * cells; i++) send_op[i] = -1;
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < p; r++)
            while (pc[r] < lens[r]) {
                int i = pc[r];
                const dt_pp_op *o = &plans[r][i];
                int cell = o->mb * chunks + o->chunk * p + r;
                int *now = c->clock + ((size_t)r * cap + i) * p;
                if (i > 0) memcpy(now, now - p, (size_t)p * sizeof(int));
                now[r] = i + 1;
                if (o->kind == DT_OP_RECV_ACT || o->kind == DT_OP_RECV_GRAD) {
                    int from = o->kind == DT_OP_RECV_ACT ? cell - 1 : cells + cell + 1, q = o->peer;
                    if (send_op[from] < 0) break; /* its send is not issued yet */
                    const int *then = c->clock + ((size_t)q * cap + send_op[from]) * p;
                    for (int k = 0; k < p; k++)
                        if (then[k] > now[k]) now[k] = then[k];
                    c->recv_rank[(size_t)q * cap + send_op[from]] = r;
                    c->recv_op[(size_t)q * cap + send_op[from]] = i;
                } else if (o->kind == DT_OP_SEND_ACT || o->kind == DT_OP_SEND_GRAD) {
                    send_op[o->kind == DT_OP_SEND_ACT ? cell : cells + cell] = i;
                }
                pc[r]++;
                progress = 1;
            }
    }
    for (int r = 0; r < p; r++)
        if (pc[r] < lens[r]) st = dt_fail(DT_ERUNTIME, "pipeline slots: the plan deadlocks at rank %d op %d", r, pc[r]);
    for (int r = 0; st == DT_OK && r < p; r++) /* every send has its receive */
        for (int i = 0; i < lens[r]; i++)
            if ((plans[r][i].kind == DT_OP_SEND_ACT || plans[r][i].kind == DT_OP_SEND_GRAD) &&
                c->recv_rank[(size_t)r * cap + i] < 0) {
                st = dt_fail(DT_ERUNTIME, "pipeline slots: rank %d's send at op %d is never received", r, i);
                break;
            }
done:
    free(send_op);
    free(pc);
    return st;
}

static void clocks_free(plan_clocks *c) {
    free(c->clock);
    free(c->recv_rank);
    free(c->recv_op);
}

/* Whether rank r may wait, at the start of its op `at`, for its send at op i (-1: none)
 * to complete. Strict: the receive certainly ran before (happens-before), so the wait
 * adds no dependency. Relaxed: the receiver reaches that receive without needing any of
 * rank r's operations from `at` on (the wait adds a dependency, checked by plan_runs). */
static int send_done_by(const plan_clocks *c, int r, int i, int at, int relaxed) {
    if (i < 0) return 1;
    int q = c->recv_rank[(size_t)r * c->cap + i], j = c->recv_op[(size_t)r * c->cap + i];
    if (relaxed) return j == 0 || c->clock[((size_t)q * c->cap + j - 1) * c->p + r] <= at;
    return at > 0 && c->clock[((size_t)r * c->cap + at - 1) * c->p + q] >= j + 1;
}

/* Rank r's slots (module comment in schedule.h); returns the count. */
static int assign_rank(const plan_clocks *c, const dt_pp_op *ops, int n, int r, int p, int v, int m, int relaxed,
                       int *op_slot, int *tmp) {
    int cells = m * v, used = 0, last_head = p * v - 1;
    int *first_f = tmp, *first_d = tmp + cells, *last = tmp + 2 * cells, *slot_of = tmp + 3 * cells;
    int *busy = tmp + 4 * cells, *act_send = tmp + 5 * cells, *grad_send = tmp + 6 * cells;
    for (int k = 0; k < cells; k++) first_f[k] = first_d[k] = slot_of[k] = act_send[k] = grad_send[k] = -1;
    memset(busy, 0, (size_t)cells * sizeof(int));
    /* where a pass overwrites its slot's sent buffers: the output in its forward, the
     * residual gradient at its gradient's receive (or backward; the head's loss writes it
     * in the forward) */
    for (int i = n - 1; i >= 0; i--) {
        int cell = ops[i].mb * v + ops[i].chunk, head = ops[i].chunk * p + r == last_head;
        if (ops[i].kind == DT_OP_F) first_f[cell] = i;
        if (ops[i].kind == DT_OP_RECV_GRAD || ops[i].kind == DT_OP_B || (head && ops[i].kind == DT_OP_F))
            first_d[cell] = i;
    }
    for (int i = 0; i < n; i++) last[ops[i].mb * v + ops[i].chunk] = i;
    for (int i = 0; i < n; i++) {
        int cell = ops[i].mb * v + ops[i].chunk, k = slot_of[cell];
        if (k < 0) { /* a new pass: the lowest free slot whose earlier sends are done by then */
            for (k = 0; busy[k] || !send_done_by(c, r, act_send[k], first_f[cell], relaxed) ||
                        !send_done_by(c, r, grad_send[k], first_d[cell], relaxed);
                 k++) {}
            busy[k] = 1;
            slot_of[cell] = k;
            if (k + 1 > used) used = k + 1;
        }
        if (ops[i].kind == DT_OP_SEND_ACT) act_send[k] = i;
        if (ops[i].kind == DT_OP_SEND_GRAD) grad_send[k] = i;
        op_slot[i] = k;
        if (last[cell] == i) busy[k] = 0;
    }
    return used;
}

/* Whether every rank's list runs to the end when, besides blocking receives, each op
 * first waits for the earlier sends of its slot that it overwrites (as the runner does):
 * a send is complete once its receiver has posted the receive, i.e. got past its own
 * waits at that operation. */
static int plan_runs(const plan_clocks *c, dt_pp_op *const *plans, const int *lens, int p, int v, int m,
                     const int *op_slot, int *tmp) {
    int cap = c->cap, chunks = p * v, cells = m * chunks, last_head = chunks - 1;
    int *pc = tmp, *sent = tmp + p, *pend = tmp + p + 2 * cells; /* pend: per rank, slot: act, grad send op */
    memset(pc, 0, (size_t)p * sizeof(int));
    for (int i = 0; i < 2 * cells; i++) sent[i] = 0;
    for (int i = 0; i < 2 * p * cells; i++) pend[i] = -1;
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < p; r++)
            while (pc[r] < lens[r]) {
                const dt_pp_op *o = &plans[r][pc[r]];
                int k = op_slot[(size_t)r * cap + pc[r]], cell = o->mb * chunks + o->chunk * p + r;
                int *pa = &pend[2 * ((size_t)r * cells + k)], blocked = 0;
                int wa = o->kind == DT_OP_F, wg = o->kind == DT_OP_RECV_GRAD || o->kind == DT_OP_B ||
                                                 (o->kind == DT_OP_F && o->chunk * p + r == last_head);
                for (int g = 0; g < 2; g++) {
                    int i = pa[g];
                    if (i < 0 || !(g ? wg : wa)) continue;
                    /* received once the receiver is past its receive (at it, it may still be
                     * waiting on a send of its own before posting the receive) */
                    if (pc[c->recv_rank[(size_t)r * cap + i]] <= c->recv_op[(size_t)r * cap + i]) blocked = 1;
                    else pa[g] = -1;
                }
                if (o->kind == DT_OP_RECV_ACT && !sent[cell - 1]) blocked = 1;
                if (o->kind == DT_OP_RECV_GRAD && !sent[cells + cell + 1]) blocked = 1;
                if (blocked) break;
                if (o->kind == DT_OP_SEND_ACT) sent[cell] = 1, pa[0] = pc[r];
                if (o->kind == DT_OP_SEND_GRAD) sent[cells + cell] = 1, pa[1] = pc[r];
                pc[r]++;
                progress = 1;
            }
    }
    for (int r = 0; r < p; r++)
        if (pc[r] < lens[r]) return 0;
    return 1;
}

int dt_schedule_slots(dt_schedule s, int p, int v, int m, int r, int *op_slot) {
    if (dt_schedule_check(s, p, v, m) != DT_OK || r < 0 || r >= p) return -1;
    int cap = dt_schedule_max_ops(v, m), lens[64], cells = m * p * v, used = -1;
    dt_pp_op *all = malloc((size_t)p * (size_t)cap * sizeof *all), *plans[64];
    int *slots = malloc((size_t)p * (size_t)cap * sizeof(int));
    int *tmp = malloc(((size_t)7 * cells + (size_t)p + 2 * (size_t)cells + 2 * (size_t)p * cells) * sizeof(int));
    plan_clocks c = {0};
    if (!all || !slots || !tmp) goto done;
    for (int q = 0; q < p; q++) {
        plans[q] = all + (size_t)q * cap;
        lens[q] = dt_schedule_ops(s, p, v, m, q, plans[q]);
    }
    if (clocks_build(plans, lens, p, v, m, cap, &c) != DT_OK) goto done;
    /* as few slots as waiting allows; where the relaxed waits would deadlock the plan,
     * the strict ones (which add no dependency) */
    for (int relaxed = 1; relaxed >= 0 && used < 0; relaxed--) {
        for (int q = 0; q < p; q++) {
            int n = assign_rank(&c, plans[q], lens[q], q, p, v, m, relaxed, slots + (size_t)q * cap, tmp);
            if (q == r) used = n;
        }
        if (relaxed && !plan_runs(&c, plans, lens, p, v, m, slots, tmp)) used = -1;
    }
    if (op_slot) memcpy(op_slot, slots + (size_t)r * cap, (size_t)lens[r] * sizeof(int));
done:
    clocks_free(&c);
    free(all);
    free(slots);
    free(tmp);
    return used;
}

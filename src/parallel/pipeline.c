#include "pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "../core/timer.h"

dt_status dt_pp_split(int n_layer, int pp, int stage, int *first, int *count) {
    if (pp < 1 || n_layer < pp)
        return dt_fail(DT_EINPUT, "parallel.pp %d: the model's %d blocks cannot give every stage one", pp, n_layer);
    int base = n_layer / pp, extra = n_layer % pp;
    *count = base + (stage < extra);
    *first = stage * base + (stage < extra ? stage : extra);
    return DT_OK;
}

dt_status dt_pp_check(const dt_config *c, int m) {
    int pp = c->parallel.pp, v = c->parallel.virtual_stages;
    if (pp <= 1) {
        if (v > 1) return dt_fail(DT_EINPUT, "parallel.virtual_stages %d needs parallel.pp > 1", v);
        return DT_OK;
    }
    dt_schedule s;
    DT_TRY(dt_schedule_parse(c->parallel.schedule, &s));
    if (c->model.n_layer < pp * v)
        return dt_fail(DT_EINPUT, "parallel.pp %d x virtual_stages %d: the model's %d blocks cannot give every stage "
                       "one", pp, v, c->model.n_layer);
    DT_TRY(dt_schedule_check(s, pp, v, m));
    const char *what = NULL;
    if (s == DT_SCHED_INTERLEAVED) what = "parallel.schedule interleaved";
    else if (s == DT_SCHED_ZBH1 && c->parallel.zero >= 2)
        what = "zb-h1 with ZeRO-2/3 (their per-unit gradient reduction needs a unit's backward in one piece)";
    else if (!strcmp(c->parallel.determinism, "bitwise")) what = "parallel.determinism bitwise";
    else if (!strcmp(c->backend, "cuda")) what = "backend cuda";
    else if (c->log.sample_tokens > 0) what = "the final sample (log.sample_tokens > 0; set it to 0)";
    if (what)
        return dt_fail(DT_EINPUT, "parallel.pp %d: %s is not implemented with pipeline parallelism yet", pp, what);
    return DT_OK;
}

int dt_pp_slots(dt_schedule s, int p, int r, int m) {
    int n = s == DT_SCHED_GPIPE ? m : s == DT_SCHED_ZBH1 ? p : p - r;
    return n < m ? n : m;
}

struct dt_pipeline {
    gpt_model *m;
    dt_comm *comm;
    dt_schedule sched;
    int p, r, nmb, B, T, nslots, nops;
    size_t count;        /* floats in one boundary message: this rank's rows x n_embd */
    dt_pp_op *ops;
    dt_request **pending; /* per slot: its activation send, its gradient send */
    uint16_t *tok, *tgt;
    double busy, wait, span;
};

dt_status dt_pipeline_create(dt_pipeline **out, gpt_model *model, dt_comm *pp, dt_schedule s, int m, int B, int T) {
    dt_pipeline *pl = calloc(1, sizeof *pl);
    if (!pl) return dt_fail(DT_ERUNTIME, "out of memory (pipeline)");
    *out = pl;
    pl->m = model;
    pl->comm = pp;
    pl->sched = s;
    pl->p = dt_comm_size(pp);
    pl->r = dt_comm_rank(pp);
    pl->nmb = m;
    pl->B = B;
    pl->T = T;
    DT_TRY(dt_schedule_check(s, pl->p, 1, m));
    if (s == DT_SCHED_INTERLEAVED)
        return dt_fail(DT_EINPUT, "parallel.schedule %s: not runnable yet (gpipe, 1f1b and zb-h1 are)",
                       dt_schedule_name(s));
    if (dt_schedule_splits_backward(s) != model->split)
        return dt_fail(DT_ERUNTIME, "pipeline: schedule %s and the model's backward (split %d) disagree",
                       dt_schedule_name(s), model->split);
    pl->nslots = dt_pp_slots(s, pl->p, pl->r, m);
    pl->count = (size_t)(model->sp ? B * T / model->tp : B * T) * (size_t)model->shape.n_embd;
    pl->ops = malloc((size_t)dt_schedule_max_ops(1, m) * sizeof *pl->ops);
    pl->pending = calloc(2 * (size_t)pl->nslots, sizeof *pl->pending);
    pl->tok = malloc((size_t)B * T * sizeof(uint16_t));
    pl->tgt = malloc((size_t)B * T * sizeof(uint16_t));
    if (!pl->ops || !pl->pending || !pl->tok || !pl->tgt) return dt_fail(DT_ERUNTIME, "out of memory (pipeline)");
    pl->nops = dt_schedule_ops(s, pl->p, 1, m, pl->r, pl->ops);
    return DT_OK;
}

static dt_status wait_slot(dt_pipeline *pl, int slot) {
    dt_status s = DT_OK;
    for (int k = 0; k < 2; k++) {
        dt_request **rq = &pl->pending[2 * slot + k];
        if (*rq) {
            dt_status w = dt_wait(*rq);
            *rq = NULL;
            if (s == DT_OK) s = w;
        }
    }
    return s;
}

void dt_pipeline_destroy(dt_pipeline *pl) {
    if (!pl) return;
    for (int k = 0; pl->pending && k < pl->nslots; k++) (void)wait_slot(pl, k);
    free(pl->ops);
    free(pl->pending);
    free(pl->tok);
    free(pl->tgt);
    free(pl);
}

void dt_pipeline_times(const dt_pipeline *pl, double *busy, double *wait, double *span) {
    *busy = pl->busy;
    *wait = pl->wait;
    *span = pl->span;
}

/* Loss sums live on the last stage; every pipeline rank gets them. */
static dt_status share_loss(dt_pipeline *pl, double *loss) {
    return pl->p > 1 ? dt_bcast(pl->comm, loss, 1, DT_F64, pl->p - 1) : DT_OK;
}

/* Message tags: a micro-batch's activation and its gradient (one pair of ranks, one direction each). */
static int tag_of(int mb, int grad) { return 2 * mb + grad; }

dt_status dt_pipeline_step(dt_pipeline *pl, const dt_pp_io *io, float grad_scale, double *loss) {
    gpt_model *m = pl->m;
    double sum = 0.0, start = dt_now();
    int last_f = -1, last_b = -1; /* after these, the rank's gradients are final */
    dt_op_kind final = m->split ? DT_OP_W : DT_OP_B;
    for (int i = 0; i < pl->nops; i++) {
        if (pl->ops[i].kind == DT_OP_F) last_f = i;
        if (pl->ops[i].kind == final) last_b = i;
    }
    for (int i = 0; i < pl->nops; i++) {
        const dt_pp_op *o = &pl->ops[i];
        int slot = o->mb % pl->nslots;
        double t0 = dt_now();
        switch (o->kind) {
        case DT_OP_RECV_ACT:
            DT_TRY(wait_slot(pl, slot)); /* the slot's previous micro-batch has left */
            DT_TRY(dt_recv(pl->comm, gpt_slot_input(m, slot), pl->count, DT_F32, o->peer, tag_of(o->mb, 0)));
            pl->wait += dt_now() - t0;
            break;
        case DT_OP_RECV_GRAD:
            DT_TRY(dt_recv(pl->comm, gpt_slot_grad(m, slot), pl->count, DT_F32, o->peer, tag_of(o->mb, 1)));
            pl->wait += dt_now() - t0;
            break;
        case DT_OP_SEND_ACT:
            DT_TRY(dt_isend(pl->comm, gpt_slot_output(m, slot), pl->count, DT_F32, o->peer, tag_of(o->mb, 0),
                            &pl->pending[2 * slot]));
            break;
        case DT_OP_SEND_GRAD:
            DT_TRY(dt_isend(pl->comm, gpt_slot_grad(m, slot), pl->count, DT_F32, o->peer, tag_of(o->mb, 1),
                            &pl->pending[2 * slot + 1]));
            break;
        case DT_OP_F: {
            DT_TRY(wait_slot(pl, slot));
            io->fill(io->ctx, o->mb, pl->tok, pl->tgt);
            if (m->has_head) io->micro(io->ctx, i == last_f); /* the head's backward runs with the forward */
            t0 = dt_now();
            DT_TRY(gpt_forward(m, slot, pl->tok, pl->B, pl->T, 0));
            if (m->has_head) {
                double l;
                DT_TRY(gpt_loss(m, slot, pl->tgt, grad_scale, &l));
                sum += l;
            }
            pl->busy += dt_now() - t0;
            break;
        }
        case DT_OP_B:
            io->micro(io->ctx, i == last_b);
            DT_TRY(m->split ? gpt_backward_input(m, slot) : gpt_backward(m, slot));
            pl->busy += dt_now() - t0;
            break;
        case DT_OP_W:
            io->micro(io->ctx, i == last_b);
            DT_TRY(gpt_backward_weight(m, slot));
            pl->busy += dt_now() - t0;
            break;
        default:
            return dt_fail(DT_ERUNTIME, "pipeline: operation %d is not runnable here", (int)o->kind);
        }
    }
    for (int k = 0; k < pl->nslots; k++) DT_TRY(wait_slot(pl, k));
    pl->span += dt_now() - start;
    *loss = sum;
    return share_loss(pl, loss);
}

dt_status dt_pipeline_eval(dt_pipeline *pl, const dt_pp_io *io, int nmb, double *loss) {
    gpt_model *m = pl->m;
    int prev = pl->r - 1, next = pl->r + 1;
    double sum = 0.0;
    for (int mb = 0; mb < nmb; mb++) { /* stage by stage; blocking sends: nothing waits back */
        io->fill(io->ctx, mb, pl->tok, pl->tgt);
        if (!m->has_embed)
            DT_TRY(dt_recv(pl->comm, gpt_slot_input(m, 0), pl->count, DT_F32, prev, tag_of(mb, 0)));
        DT_TRY(gpt_forward(m, 0, pl->tok, pl->B, pl->T, 0));
        if (m->has_head) {
            double l;
            DT_TRY(gpt_loss(m, 0, pl->tgt, 0.0f, &l));
            sum += l;
        } else {
            DT_TRY(dt_send(pl->comm, gpt_slot_output(m, 0), pl->count, DT_F32, next, tag_of(mb, 0)));
        }
    }
    *loss = sum;
    return share_loss(pl, loss);
}

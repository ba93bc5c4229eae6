#include "pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "../../comm/watchdog.h"
#include "../../core/timer.h"

dt_status dt_pp_split(int n_layer, int pp, int stage, int *first, int *count) {
    if (pp < 1 || n_layer < pp)
        return dt_fail(DT_EINPUT, "parallel.pp %d: the model's %d blocks cannot give every stage one", pp, n_layer);
    int base = n_layer / pp, extra = n_layer % pp;
    *count = base + (stage < extra);
    *first = stage * base + (stage < extra ? stage : extra);
    return DT_OK;
}

/* Piece `piece` of parallel.pp_split's list of `pieces` block counts (checked whole). */
static dt_status split_piece(const char *split, int n_layer, int pieces, int piece, int *first, int *count) {
    int k = 0, sum = 0;
    const char *at = split;
    while (*at) {
        char *end;
        long n = strtol(at, &end, 10);
        if (end == at || n < 1 || n > n_layer || (*end && (*end != ',' || !end[1])))
            return dt_fail(DT_EINPUT, "parallel.pp_split '%s': expected positive block counts separated by commas",
                           split);
        if (k == piece) {
            *first = sum;
            *count = (int)n;
        }
        sum += (int)n;
        k++;
        at = *end ? end + 1 : end;
    }
    if (k != pieces || sum != n_layer)
        return dt_fail(DT_EINPUT, "parallel.pp_split '%s': %d pieces of %d blocks; the layout needs %d pieces (pp x "
                       "virtual_stages) of the model's %d blocks", split, k, sum, pieces, n_layer);
    return DT_OK;
}

dt_status dt_pp_layout(int n_layer, int p, int v, int r, const char *split, gpt_layout *lay) {
    int balanced = !split || !*split;
    if (v > GPT_MAX_CHUNKS)
        return dt_fail(DT_EINPUT, "parallel.virtual_stages %d exceeds the %d supported", v, GPT_MAX_CHUNKS);
    gpt_layout out = *lay; /* written only whole */
    if (v <= 1) {
        DT_TRY(balanced ? dt_pp_split(n_layer, p, r, &out.first_layer, &out.n_layers)
                        : split_piece(split, n_layer, p, r, &out.first_layer, &out.n_layers));
    } else {
        out.chunks = v;
        for (int c = 0; c < v; c++)
            DT_TRY(balanced ? dt_pp_split(n_layer, p * v, c * p + r, &out.chunk_first[c], &out.chunk_layers[c])
                            : split_piece(split, n_layer, p * v, c * p + r, &out.chunk_first[c], &out.chunk_layers[c]));
    }
    *lay = out;
    return DT_OK;
}

int dt_pp_slots(dt_schedule s, int p, int v, int r, int m) {
    /* closed forms where the plan is the passes in flight (test_schedule checks they agree
     * with the planned slots): the planner asks for thousands of large (p, m) */
    if (v <= 1 && p >= 1 && m >= 1 && r >= 0 && r < p) {
        if (s == DT_SCHED_GPIPE) return m;
        if (s == DT_SCHED_1F1B) return m < p - r ? m : p - r;
    }
    int n = dt_schedule_slots(s, p, v, m, r, NULL);
    return n > 0 ? n : 0;
}

struct dt_pipeline {
    gpt_model *m;
    dt_comm *comm;
    dt_schedule sched;
    int p, r, v, nmb, B, T, nslots, nops;
    size_t count;        /* elements in one boundary message: this rank's rows x n_embd */
    dt_dtype dtype;      /* the activations' storage type (fp32, or bf16 sent as it is) */
    size_t esz;
    dt_pp_op *ops;
    int *op_slot;        /* per operation: its pass's activation slot (dt_schedule_slots) */
    int last_f;          /* the head's last forward (its loss's backward finishes ln_f and the head's wte) */
    int *last_b;         /* per chunk: the backward (W when split) after which its blocks' gradients are final */
    dt_request **pending; /* per slot: its activation send, its gradient send */
    /* a model in device memory: MPI sends and receives host memory, so each message goes
     * through here: per slot an activation and a gradient send buffer (reused once that
     * send has completed, as the slot's device buffers are), then one receive buffer */
    void *host;
    dt_token *tok, *tgt;
    int *seg;            /* the micro-batch's document starts (dt_pp_io.documents) */
    double busy, wait, span;
};

dt_status dt_pipeline_create(dt_pipeline **out, gpt_model *model, dt_comm *pp, dt_schedule s, int v, int m, int B,
                             int T) {
    dt_pipeline *pl = calloc(1, sizeof *pl);
    if (!pl) return dt_fail(DT_ERUNTIME, "out of memory (pipeline)");
    *out = pl;
    pl->m = model;
    pl->comm = pp;
    pl->sched = s;
    pl->p = dt_comm_size(pp);
    pl->r = dt_comm_rank(pp);
    pl->v = v;
    pl->nmb = m;
    pl->B = B;
    pl->T = T;
    DT_TRY(dt_schedule_check(s, pl->p, v, m));
    if (model->nchunks != v)
        return dt_fail(DT_ERUNTIME, "pipeline: %d virtual stages but the model has %d chunks", v, model->nchunks);
    if (dt_schedule_splits_backward(s) != model->split)
        return dt_fail(DT_ERUNTIME, "pipeline: schedule %s and the model's backward (split %d) disagree",
                       dt_schedule_name(s), model->split);
    pl->count = (size_t)(model->sp ? B * T / model->tp : B * T) * (size_t)model->shape.n_embd;
    int max = dt_schedule_max_ops(v, m);
    pl->ops = malloc((size_t)max * sizeof *pl->ops);
    pl->op_slot = malloc((size_t)max * sizeof *pl->op_slot);
    pl->last_b = malloc((size_t)v * sizeof *pl->last_b);
    pl->tok = malloc((size_t)B * T * sizeof(dt_token));
    pl->tgt = malloc((size_t)B * T * sizeof(dt_token));
    pl->seg = malloc((size_t)B * T * sizeof(int));
    if (!pl->ops || !pl->op_slot || !pl->last_b || !pl->tok || !pl->tgt || !pl->seg)
        return dt_fail(DT_ERUNTIME, "out of memory (pipeline)");
    pl->nops = dt_schedule_ops(s, pl->p, v, m, pl->r, pl->ops);
    pl->nslots = dt_schedule_slots(s, pl->p, v, m, pl->r, pl->op_slot);
    if (pl->nslots < 0) return dt_fail(DT_ERUNTIME, "out of memory (pipeline)");
    if (pl->nslots > gpt_slot_count(model))
        return dt_fail(DT_ERUNTIME, "pipeline: schedule %s needs %d activation slots, the model has %d",
                       dt_schedule_name(s), pl->nslots, gpt_slot_count(model));
    pl->pending = calloc(2 * (size_t)pl->nslots, sizeof *pl->pending);
    if (!pl->pending) return dt_fail(DT_ERUNTIME, "out of memory (pipeline)");
    pl->dtype = model->ops->bf16 ? DT_BF16 : DT_F32;
    pl->esz = dt_elem_bytes(model->ops);
    if (model->ops->on_device) {
        pl->host = malloc((2 * (size_t)pl->nslots + 1) * pl->count * pl->esz);
        if (!pl->host) return dt_fail(DT_ERUNTIME, "out of memory (pipeline host staging)");
    }
    dt_op_kind final = model->split ? DT_OP_W : DT_OP_B;
    pl->last_f = -1;
    for (int k = 0; k < v; k++) pl->last_b[k] = -1;
    for (int i = 0; i < pl->nops; i++) {
        if (pl->ops[i].kind == DT_OP_F) pl->last_f = i;
        if (pl->ops[i].kind == final) pl->last_b[pl->ops[i].chunk] = i;
    }
    return DT_OK;
}

/* The slot's earlier activation (grad 0) or gradient (grad 1) send has completed: its
 * buffer may be overwritten (dt_schedule_slots made sure the receive came first). */
static dt_status wait_send(dt_pipeline *pl, int slot, int grad) {
    dt_request **rq = &pl->pending[2 * slot + grad];
    if (!*rq) return DT_OK;
    dt_status s = dt_wait(*rq);
    *rq = NULL;
    return s;
}

static dt_status wait_slot(dt_pipeline *pl, int slot) {
    dt_status a = wait_send(pl, slot, 0), b = wait_send(pl, slot, 1);
    return a != DT_OK ? a : b;
}

void dt_pipeline_destroy(dt_pipeline *pl) {
    if (!pl) return;
    for (int k = 0; pl->pending && k < pl->nslots; k++) (void)wait_slot(pl, k);
    free(pl->ops);
    free(pl->op_slot);
    free(pl->last_b);
    free(pl->pending);
    free(pl->host);
    free(pl->tok);
    free(pl->tgt);
    free(pl->seg);
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

/* Message tags: micro-batch mb's activation (grad 0) or gradient (grad 1) for the chunk
 * pass of global chunk g (the receiver's), kept below MPI's smallest tag bound (messages
 * between two ranks with one tag arrive in order, and passes that far apart are never in
 * flight together). */
static int tag_of(const dt_pipeline *pl, int mb, int g, int grad) {
    return (2 * (mb * pl->p * pl->v + g) + grad) % 32768;
}

/* What MPI sends for n floats at x: x itself, or (a device model) its host copy in
 * staging buffer `buf` (slot·2 + grad for the slot's sends; the receive buffer for a
 * blocking send, which is done with it on return). */
static const void *outgoing(dt_pipeline *pl, const float *x, size_t n, size_t buf) {
    if (!pl->host) return x;
    char *h = (char *)pl->host + buf * pl->count * pl->esz;
    pl->m->ops->download(h, x, n * pl->esz);
    return h;
}

static size_t recv_buf(const dt_pipeline *pl) { return 2 * (size_t)pl->nslots; }

/* Receives n elements into x (through the receive buffer for a device model). */
static dt_status receive(dt_pipeline *pl, float *x, size_t n, int peer, int tag) {
    if (!pl->host) return dt_recv(pl->comm, x, n, pl->dtype, peer, tag);
    char *h = (char *)pl->host + recv_buf(pl) * pl->count * pl->esz;
    DT_TRY(dt_recv(pl->comm, h, n, pl->dtype, peer, tag));
    pl->m->ops->upload(x, h, n * pl->esz); /* staged before it returns: h is free again */
    return DT_OK;
}

/* Whether local chunk k holds the embeddings / the head. */
static int first_chunk(const dt_pipeline *pl, int k) { return pl->r == 0 && k == 0; }
static int head_chunk(const dt_pipeline *pl, int k) { return pl->r == pl->p - 1 && k == pl->v - 1; }

dt_status dt_pipeline_step(dt_pipeline *pl, const dt_pp_io *io, float grad_scale, double *loss) {
    gpt_model *m = pl->m;
    double sum = 0.0, start = dt_now();
    for (int i = 0; i < pl->nops; i++) {
        const dt_pp_op *o = &pl->ops[i];
        int slot = pl->op_slot[i], g = o->chunk * pl->p + pl->r;
        double t0 = dt_now();
        dt_watchdog_micro(o->mb); /* the flight recorder's micro-step */
        switch (o->kind) {
        case DT_OP_RECV_ACT:
            DT_TRY(receive(pl, gpt_slot_input(m, slot), pl->count, o->peer, tag_of(pl, o->mb, g, 0)));
            pl->wait += dt_now() - t0;
            break;
        case DT_OP_RECV_GRAD:
            DT_TRY(wait_send(pl, slot, 1));
            DT_TRY(receive(pl, gpt_slot_grad(m, slot), pl->count, o->peer, tag_of(pl, o->mb, g, 1)));
            pl->wait += dt_now() - t0;
            break;
        case DT_OP_SEND_ACT:
            DT_TRY(dt_isend(pl->comm, outgoing(pl, gpt_slot_output(m, slot), pl->count, 2 * (size_t)slot), pl->count,
                            pl->dtype, o->peer, tag_of(pl, o->mb, g + 1, 0), &pl->pending[2 * slot]));
            break;
        case DT_OP_SEND_GRAD:
            DT_TRY(dt_isend(pl->comm, outgoing(pl, gpt_slot_grad(m, slot), pl->count, 2 * (size_t)slot + 1),
                            pl->count, pl->dtype, o->peer, tag_of(pl, o->mb, g - 1, 1), &pl->pending[2 * slot + 1]));
            break;
        case DT_OP_F: {
            int head = head_chunk(pl, o->chunk);
            if (head || first_chunk(pl, o->chunk) || io->documents) io->fill(io->ctx, o->mb, pl->tok, pl->tgt, pl->seg);
            gpt_set_documents(m, slot, io->documents ? pl->seg : NULL, pl->B, pl->T);
            if (head) io->micro(io->ctx, i == pl->last_f); /* the head's backward runs with the forward */
            DT_TRY(wait_send(pl, slot, 0));
            if (head) DT_TRY(wait_send(pl, slot, 1)); /* its loss writes the residual gradient */
            pl->wait += dt_now() - t0;
            t0 = dt_now();
            DT_TRY(gpt_forward_chunk(m, slot, o->chunk, pl->tok, pl->B, pl->T, 0));
            if (head) {
                double l;
                DT_TRY(gpt_loss(m, slot, pl->tgt, grad_scale, &l));
                sum += l;
            }
            pl->busy += dt_now() - t0;
            break;
        }
        case DT_OP_B:
            DT_TRY(wait_send(pl, slot, 1));
            pl->wait += dt_now() - t0;
            t0 = dt_now();
            io->micro(io->ctx, i == pl->last_b[o->chunk]);
            DT_TRY(m->split ? gpt_backward_input(m, slot) : gpt_backward(m, slot));
            pl->busy += dt_now() - t0;
            break;
        case DT_OP_W:
            io->micro(io->ctx, i == pl->last_b[o->chunk]);
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
    int prev = (pl->r - 1 + pl->p) % pl->p, next = (pl->r + 1) % pl->p;
    double sum = 0.0;
    /* micro-batch by micro-batch, chunk by chunk in the model's order; blocking sends:
     * nothing waits back */
    for (int mb = 0; mb < nmb; mb++) {
        io->fill(io->ctx, mb, pl->tok, pl->tgt, pl->seg);
        for (int k = 0; k < pl->v; k++) {
            int g = k * pl->p + pl->r;
            if (!first_chunk(pl, k))
                DT_TRY(receive(pl, gpt_slot_input(m, 0), pl->count, prev, tag_of(pl, mb, g, 0)));
            gpt_set_documents(m, 0, io->documents ? pl->seg : NULL, pl->B, pl->T);
            DT_TRY(gpt_forward_chunk(m, 0, k, pl->tok, pl->B, pl->T, 0));
            if (head_chunk(pl, k)) {
                double l;
                DT_TRY(gpt_loss(m, 0, pl->tgt, 0.0f, &l));
                sum += l;
            } else {
                DT_TRY(dt_send(pl->comm, outgoing(pl, gpt_slot_output(m, 0), pl->count, recv_buf(pl)), pl->count,
                               pl->dtype, next, tag_of(pl, mb, g + 1, 0)));
            }
        }
    }
    *loss = sum;
    return share_loss(pl, loss);
}

dt_status dt_pipeline_next_logits(dt_pipeline *pl, const dt_token *tokens, int T, float *logits) {
    gpt_model *m = pl->m;
    int prev = (pl->r - 1 + pl->p) % pl->p, next = (pl->r + 1) % pl->p;
    size_t count = (size_t)T * (size_t)m->shape.n_embd;
    if (m->sp) return dt_fail(DT_EINPUT, "sampling with sequence parallelism is not implemented");
    if (count > pl->count) /* the slot (and the staging buffer) hold a micro-batch's rows */
        return dt_fail(DT_EINPUT, "sampling: %d positions exceed the pipeline's %zu rows", T, pl->count / m->shape.n_embd);
    dt_status s = DT_OK;
    for (int k = 0; k < pl->v && s == DT_OK; k++) {
        int g = k * pl->p + pl->r;
        if (!first_chunk(pl, k)) s = receive(pl, gpt_slot_input(m, 0), count, prev, tag_of(pl, 0, g, 0));
        if (s == DT_OK) s = gpt_forward_chunk(m, 0, k, tokens, 1, T, 0);
        if (s == DT_OK && head_chunk(pl, k)) s = gpt_last_logits(m, 0, logits);
        else if (s == DT_OK)
            s = dt_send(pl->comm, outgoing(pl, gpt_slot_output(m, 0), count, recv_buf(pl)), count, pl->dtype, next,
                        tag_of(pl, 0, g + 1, 0));
    }
    DT_TRY(dt_comm_agree(pl->comm, s, NULL)); /* a failed stage fails every rank, none waits in the broadcast */
    return dt_bcast(pl->comm, logits, (size_t)m->shape.vocab_size, DT_F32, pl->p - 1);
}

/* The data-parallel strategy table (src/parallel/data_parallel/strategy.c) and the
 * optimizer object (src/optim/): each option set picks its mode's table, bitwise mode
 * wraps it (its own backward hook and reduction, the mode's update), every table has
 * the operations the engine calls; the one norm function sums pieces into classes in
 * order and hands them to the reduction; the optimizer's steps are AdamW's on the right
 * elements, with and without bf16 master weights. */
#include <math.h>
#include <stdlib.h>

#include "backend/ops.h"
#include "check.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/strategy.h"

static void check_choice(const dt_dp_opts *o, const char *want, int wrapped) {
    const dt_dp_strategy *mode = NULL;
    dt_dp_strategy run;
    CHECK(dt_dp_strategy_for(o, &mode, &run) == DT_OK, "ps %d zero %d", o->ps, o->zero);
    if (!mode) return;
    CHECK(!strcmp(mode->name, want), "ps %d zero %d: %s, want %s", o->ps, o->zero, mode->name, want);
    /* the wrapper replaces the reduction and the backward hook, keeps the mode's update */
    CHECK((run.reduce != mode->reduce) == wrapped, "%s: reduce wrapped %d", want, wrapped);
    CHECK((run.after_backward != mode->after_backward) == wrapped, "%s: after_backward wrapped %d", want, wrapped);
    CHECK(run.update == mode->update && run.drain == mode->drain, "%s: the mode's update and drain", want);
}

static void check_table(const dt_dp_strategy *s) {
    /* what the engine calls without asking */
    CHECK(s->setup && s->free && s->begin_step && s->reduce && s->update && s->open_full && s->close_full &&
              s->init_weights && s->load && s->memory && s->estimate,
          "%s: a required operation is missing", s->name);
    CHECK(!s->source_open == !s->source_close, "%s: source_open and source_close come together", s->name);
    CHECK(!s->gather_full == !s->release_full, "%s: gather_full and release_full come together", s->name);
    CHECK(s->grads >= DT_GRADS_FLAT && s->grads <= DT_GRADS_SHARD, "%s: gradient layout %d", s->name, s->grads);
}

/* The estimator's questions (strategy.h: estimate, formula, ring), answered by each mode's
 * table without an engine: the state shrinks stage by stage as the formulas say, a
 * mode's bytes do not depend on the wrapper's, and bitwise mode adds its fold's workspace
 * after the mode's. The numbers themselves are `dtrain estimate`'s, compared with the
 * measured memory by tests/test_data_parallel.sh and test_bf16.sh. */
static void check_estimates(void) {
    dt_config c;
    dt_config_defaults(&c);
    dt_layout L;
    dt_layout_derive(&L, &c, 8); /* the default model over 8 data-parallel ranks */
    gpt_layout lay = {.tp = 1};
    double psi = (double)gpt_param_count_layout(&L.shape, &lay), prev = INFINITY;
    int rows = 0;
    for (int i = 0; dt_dp_modes[i]; i++) {
        const dt_dp_strategy *m = dt_dp_modes[i];
        dt_dp_stage st = {&L, &lay, psi, L.dp, DT_SHARD_ALIGN, m};
        double state = -1, work = 0;
        m->estimate(&st, &state, &work);
        CHECK(state > 0 && work >= 0, "%s: state %g, work %g", m->name, state, work);
        if (m->formula.fp32_text) { /* the ZeRO stages' rows, in order: each holds less */
            CHECK(state < prev, "%s: %g bytes, not below the previous stage's %g", m->name, state, prev);
            prev = state;
            rows++;
        }
        CHECK(m->ring[1][0] + m->ring[1][1] > 0, "%s: some gradient traffic", m->name);
        dt_dp_strategy run = *m;
        dt_bitwise_wrap(&run);
        double bstate = -1, bwork = 0;
        run.estimate(&st, &bstate, &bwork);
        CHECK(bwork > work && bstate >= state, "%s bitwise: workspace %g over %g, state %g over %g", m->name, bwork,
              work, bstate, state);
    }
    CHECK(rows == 4, "%d rows in the formula table, want ZeRO 0-3", rows);
    CHECK(dt_dp_zero3.formula.sharded[0] && !dt_dp_zero2.formula.sharded[0] && dt_dp_zero1.formula.sharded[2],
          "the formulas' sharded pieces");
    CHECK(dt_dp_zero1.sharded && !dt_dp_ddp.sharded && !dt_dp_ps.sharded, "ZeRO shards the optimizer state");
}

/* a reduction that records what it was given and returns their sum + 1 */
static double seen[DT_NORM_MAX_PARTS];
static int seen_n;
static dt_status record(void *ctx, double *part, int n, double *norm) {
    (void)ctx;
    seen_n = n;
    *norm = 1.0;
    for (int i = 0; i < n; i++) *norm += seen[i] = part[i];
    return DT_OK;
}

static void check_norm(const dt_ops *ops) {
    float a[3] = {1, 2, 3}, b[2] = {4, 5}, c[1] = {100};
    dt_grad_piece p[3] = {{a, 3, 0}, {c, 1, -1}, {b, 2, 1}}; /* c: a tied copy, not counted */
    double norm = 0;
    CHECK(dt_grad_norm_of(ops, p, 3, 2, (dt_norm_reduce){record, NULL}, &norm) == DT_OK, "norm of pieces");
    CHECK(seen_n == 2 && seen[0] == 14.0 && seen[1] == 41.0 && norm == 56.0, "classes %g %g, norm %g", seen[0],
          seen[1], norm);
    /* no reduction: this rank holds everything, the norm of one class */
    CHECK(dt_grad_norm_of(ops, p, 1, 1, (dt_norm_reduce){NULL, NULL}, &norm) == DT_OK && norm == sqrt(14.0),
          "local norm %g", norm);
    CHECK(dt_grad_norm(ops, a, 3) == sqrt(ops->sumsq(a, 3)), "dt_grad_norm is the square root of sumsq");
    CHECK(dt_grad_norm_of(ops, p, 1, DT_NORM_MAX_PARTS + 1, (dt_norm_reduce){NULL, NULL}, &norm) != DT_OK,
          "too many classes refused");
}

static void check_optimizer(const dt_ops *f32) {
    dt_adamw_hparams hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .grad_clip = 1};
    enum { N = 8 };
    float g[N], p[N], want[N], wm[N] = {0}, wv[N] = {0};
    for (int i = 0; i < N; i++) g[i] = 0.1f * (float)(i - 3), p[i] = want[i] = 0.5f - 0.05f * (float)i;
    dt_optimizer o;
    CHECK(dt_optimizer_create(&o, f32, &hp, 2 * N, 1, " (test)", NULL) == DT_OK, "create");
    if (!o.m) return;
    CHECK(!o.master && o.n == 2 * N, "fp32: no master weights");
    /* owned elements [N, 2N): the moments there move, those before stay zero */
    dt_optimizer_step_range(&o, 1, 1, 1e-3, 0.5f, N, p, g, N);
    dt_adamw_range(&hp, f32, 1, 1, 1e-3, 0.5f, want, NULL, g, wm, wv, N);
    int same = 1, untouched = 1;
    for (int i = 0; i < N; i++) {
        same &= p[i] == want[i] && o.m[N + i] == wm[i] && o.v[N + i] == wv[i];
        untouched &= o.m[i] == 0.0f && o.v[i] == 0.0f;
    }
    CHECK(same && untouched, "step_range is dt_adamw_range on the owned elements");
    dt_optimizer_free(&o);
    /* bf16 storage: the fp32 master weights are updated, the parameters get their bf16 copy */
    const dt_ops *b16 = dt_ops_bf16_storage(f32);
    CHECK(dt_optimizer_create(&o, b16, &hp, N, 0, "", NULL) == DT_OK && o.master && !o.m, "bf16 peer: master weights only");
    dt_optimizer_free(&o);
    CHECK(dt_optimizer_create(&o, b16, &hp, N, 1, "", NULL) == DT_OK && o.master && o.m, "bf16: master weights and moments");
    if (!o.master || !o.m) return;
    uint16_t store[N], gb[N];
    for (int i = 0; i < N; i++) o.master[i] = want[i], gb[i] = 0;
    b16->to_bf16(gb, g, N);
    dt_optimizer_step_range(&o, 1, 0, 1e-3, 1.0f, 0, (float *)store, (const float *)gb, N);
    float back[N];
    b16->from_bf16(back, store, N);
    int copy = 1;
    for (int i = 0; i < N; i++) copy &= fabsf(back[i] - o.master[i]) <= fabsf(o.master[i]) / 128.0f;
    CHECK(copy, "bf16: the parameters are the master weights' copy");
    dt_optimizer_free(&o);
}

int main(void) {
    dt_dp_opts o = {0};
    static const char *const zero[] = {"ddp", "zero1", "zero2", "zero3"};
    for (int bw = 0; bw < 2; bw++) {
        o.bitwise = bw;
        for (int z = 0; z < 4; z++) {
            o.ps = 0;
            o.zero = z;
            check_choice(&o, zero[z], bw);
            o.ps = 1; /* the central rank whatever the stage */
            check_choice(&o, "ps", bw);
        }
    }
    o = (dt_dp_opts){.zero = 4};
    const dt_dp_strategy *mode;
    dt_dp_strategy run;
    CHECK(dt_dp_strategy_for(&o, &mode, &run) == DT_EINPUT, "zero 4: no such mode");
    const dt_dp_strategy *all[] = {&dt_dp_ps, &dt_dp_ddp, &dt_dp_zero1, &dt_dp_zero2, &dt_dp_zero3};
    for (int i = 0; i < 5; i++) check_table(all[i]);
    check_estimates();
    check_norm(dt_ops_cpu());
    check_optimizer(dt_ops_cpu());
    return check_finish();
}

/* The data-parallel strategy table (src/parallel/data_parallel/strategy.c) and the
 * optimizer object (src/optim/): each option set picks its mode's table, bitwise mode
 * wraps it (its own backward hook and reduction, the mode's update), every table has
 * the operations the engine calls; the one norm function sums pieces into classes in
 * order and hands them to the reduction; the optimizer's steps are AdamW's on the right
 * elements, with and without bf16 master weights. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>

#include "backend/ops.h"
#include "check.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/strategy.h"
#include "parallel/data_parallel/zero_shard.h"
#include "parallel/layout/estimate.h"

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
        dt_dp_stage st = {&L, &lay, psi, L.dp, DT_SHARD_ALIGN, m, NULL};
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

/* `dtrain estimate --json` of the default model over dp ranks with the settings sets
 * (K=V, NULL-terminated): its "offload" object and stage 0's rank bytes, or NULL. */
static cJSON *estimate_json(int dp, const char *const *sets, double *rank_bytes, dt_layout *L) {
    dt_config c;
    dt_config_defaults(&c);
    for (int i = 0; sets[i]; i++) CHECK(dt_config_set(&c, sets[i]) == DT_OK, "%s", sets[i]);
    CHECK(dt_layout_build(L, &c, dp * c.parallel.pp) == DT_OK, "layout");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f && dt_estimate_print(L, 1, f) == DT_OK, "estimate --json");
    if (f) fclose(f);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(root != NULL, "estimate's JSON parses");
    cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "stages"), 0);
    *rank_bytes = cJSON_GetNumberValue(cJSON_GetObjectItem(st, "rank_bytes"));
    cJSON *off = cJSON_DetachItemFromObject(root, "offload");
    cJSON_Delete(root);
    return off;
}

static double num(const cJSON *o, const char *k) { return cJSON_GetNumberValue(cJSON_GetObjectItem(o, k)); }

/* Offload on paper (docs/offload.md): what leaves the device is the mode's shard of fp32
 * master weights and moments (8 bytes per element in fp32, where the parameters are the
 * master weights and stay; 12 in bf16) and ZeRO-3's parameter shard; NVMe holds it in
 * whole blocks of 3 fields, host memory buffer_count blocks of each; the I/O of a step
 * is the optimizer file read and written once, the parameter file read per use (2 per
 * micro-step, 1 under a pipeline) and written once. */
static void check_offload_estimates(void) {
    const double MiB = 1 << 20;
    double rb, rb0;
    dt_layout L;
    /* ZeRO-2 over 2 ranks, optimizer state on NVMe in 1 MiB blocks, 4 in flight */
    const char *z2[] = {"parallel.zero=2", "offload.optimizer=nvme", "offload.nvme_path=/x", "offload.block_mb=1", NULL};
    cJSON *o = estimate_json(2, z2, &rb, &L);
    const char *z2none[] = {"parallel.zero=2", NULL};
    cJSON *none = estimate_json(2, z2none, &rb0, &L);
    CHECK(!none, "no offload: no offload object (the output stays what it was)");
    gpt_layout lay = {.tp = 1};
    dt_dp_stage st = {&L, &lay, (double)gpt_param_count_layout(&L.shape, &lay), 2, DT_SHARD_ALIGN, &dt_dp_zero2, NULL};
    /* fp32 on the CPU: the parameters are the weights, the store holds the moments (2 fields);
     * blocks of 1 MiB, or the state's own size when smaller */
    double S = dt_zero_units_of(&st).shard, blk = fmin(MiB, ceil(4 * S / 4096) * 4096);
    double file = ceil(4 * S / blk) * blk * 2, slots = fmin(4, ceil(4 * S / blk));
    CHECK(o && num(o, "optimizer_elements") == S && num(o, "device") == rb && rb == rb0 - 8 * S &&
              num(o, "without_offload") == rb0,
          "zero2 fp32 nvme: the device loses the shard's moments, 8 x %.0f: %.0f vs %.0f", S, rb, rb0);
    CHECK(o && num(o, "host") == slots * 2 * blk && num(o, "nvme") == file && num(o, "io_per_step") == 2 * file,
          "zero2 nvme: host = min(4, blocks) x 2 x block, file = 2 x blocks x block = %.0f, I/O 2 x file: %.0f %.0f %.0f", file,
          num(o, "host"), num(o, "nvme"), num(o, "io_per_step"));
    cJSON_Delete(o);
    /* bf16: the fp32 master weights leave too (12 bytes per element of the shard) */
    const char *z2b[] = {"parallel.zero=2", "precision=bf16", "offload.optimizer=nvme", "offload.nvme_path=/x", NULL};
    const char *z2b0[] = {"parallel.zero=2", "precision=bf16", NULL};
    o = estimate_json(2, z2b, &rb, &L);
    cJSON_Delete(estimate_json(2, z2b0, &rb0, &L));
    /* default 8 MiB blocks; 3 fields with master weights; bf16's gradients and parameters
     * cross through two fp32 buffers of a block, and ZeRO-2 hands its gradients over during
     * backward into a host copy of the shard's (2 bytes each) */
    blk = fmin(8 * MiB, ceil(4 * S / 4096) * 4096);
    CHECK(o && rb == rb0 - 12 * S && num(o, "nvme") == ceil(4 * S / blk) * blk * 3 &&
              num(o, "host") == fmin(4, ceil(4 * S / blk)) * 3 * blk + 2 * 4 * fmin(blk / 4, S) + 2 * S,
          "zero2 bf16 nvme: device %.0f = %.0f - 12 x %.0f, default 8 MiB blocks", rb, rb0, S);
    cJSON_Delete(o);
    /* ZeRO-3, bf16, optimizer in host memory, parameters on NVMe, 3 micro-batches a step */
    const char *z3[] = {"parallel.zero=3", "precision=bf16", "offload.optimizer=cpu", "offload.param=nvme",
                        "offload.nvme_path=/x", "offload.buffer_count=5", "train.micro_batch=4", "train.global_batch=24",
                        NULL};
    const char *z30[] = {"parallel.zero=3", "precision=bf16", "train.micro_batch=4", "train.global_batch=24", NULL};
    o = estimate_json(2, z3, &rb, &L);
    cJSON_Delete(estimate_json(2, z30, &rb0, &L));
    st.mode = &dt_dp_zero3;
    S = dt_zero_units_of(&st).shard;
    blk = fmin(8 * MiB, ceil(2 * S / 4096) * 4096);
    double pfile = ceil(2 * S / blk) * blk;
    CHECK(o && num(o, "param_elements") == S && num(o, "param_reads") == 6 && rb == rb0 - 12 * S - 2 * S &&
              num(o, "host") == 12 * S + fmin(5, ceil(2 * S / blk)) * blk + 2 * 4 * fmin(262144, S) + 2 * S &&
              num(o, "nvme") == pfile &&
              num(o, "io_per_step") == 7 * pfile,
          "zero3 bf16 cpu + param nvme: device %.0f (%.0f - 14 x %.0f), host %.0f, file %.0f, 6 reads + 1 write", rb,
          rb0, S, num(o, "host"), num(o, "nvme"));
    cJSON_Delete(o);
    /* under a pipeline ZeRO-3 gathers a stage once a step: one read */
    const char *pp[] = {"parallel.zero=3", "parallel.pp=2", "offload.param=cpu", "train.global_batch=64", NULL};
    o = estimate_json(2, pp, &rb, &L);
    CHECK(o && num(o, "param_reads") == 1 && num(o, "nvme") == 0 && num(o, "io_per_step") == 0, "pp2: 1 read a step");
    cJSON_Delete(o);
    /* DDP: the whole model's state; on the CPU backend host memory is the device's, so the
     * budget (what the planner and the trainer's memory check compare) counts it */
    const char *ddp[] = {"offload.optimizer=cpu", NULL}, *ddp0[] = {NULL};
    o = estimate_json(2, ddp, &rb, &L);
    double psi = (double)gpt_param_count_layout(&L.shape, &lay), budget = dt_estimate_layout_bytes(&L);
    cJSON_Delete(estimate_json(2, ddp0, &rb0, &L));
    CHECK(o && num(o, "optimizer_elements") == psi && rb == rb0 - 8 * psi && num(o, "host") == 8 * psi &&
              budget == rb + 8 * psi,
          "ddp cpu fp32: device -8psi, host 8psi (the moments; the parameters are the weights), the CPU budget both: "
          "%.0f %.0f", rb, budget);
    cJSON_Delete(o);
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
    CHECK(dt_optimizer_create(&o, f32, &hp, 2 * N, 1, " (test)", NULL, NULL, 0) == DT_OK, "create");
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
    CHECK(dt_optimizer_create(&o, b16, &hp, N, 0, "", NULL, NULL, 0) == DT_OK && o.master && !o.m, "bf16 peer: master weights only");
    dt_optimizer_free(&o);
    CHECK(dt_optimizer_create(&o, b16, &hp, N, 1, "", NULL, NULL, 0) == DT_OK && o.master && o.m, "bf16: master weights and moments");
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
    check_offload_estimates();
    check_norm(dt_ops_cpu());
    check_optimizer(dt_ops_cpu());
    return check_finish();
}

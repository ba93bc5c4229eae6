/* The layout value (src/parallel/layout/layout.h), as pure functions: what it derives from
 * a config and a world size (dp, m, micro-batch, sequence per rank, shape, enums), its
 * predicates, and every refusal of its one check, by scope (the config's keys, the world,
 * what this build runs, what `dtrain estimate` accepts), each with the line the trainer
 * and the other commands print. */
#include <stdarg.h>
#include <stdlib.h>

#include "check.h"
#include "core/config.h"
#include "parallel/layout/layout.h"

/* A small model (4 blocks, 4 heads, 64 wide, 32 positions) with the given --set
 * assignments (NULL-terminated), built over world ranks. */
static dt_status build(dt_layout *L, int world, ...) {
    dt_config c;
    dt_config_defaults(&c);
    const char *base[] = {"model.n_layer=4", "model.n_head=4", "model.n_embd=64", "model.seq_len=32",
                          "model.vocab_size=300", "train.micro_batch=2"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) DT_TRY(dt_config_set(&c, base[i]));
    va_list ap;
    va_start(ap, world);
    for (const char *s; (s = va_arg(ap, const char *));) {
        dt_status st = dt_config_set(&c, s);
        if (st != DT_OK) {
            va_end(ap);
            return st;
        }
    }
    va_end(ap);
    return dt_layout_build(L, &c, world);
}

/* Whether the check of scope `what` refuses with a message containing `want`. */
static int refused(const dt_layout *L, int what, const char *want) {
    dt_error_clear();
    return dt_layout_check(L, what) == DT_EINPUT && strstr(dt_error_message(), want) != NULL;
}

static void derivations(void) {
    dt_layout L;
    CHECK(build(&L, 16, "parallel.tp=2", "parallel.pp=2", "parallel.cp=2", "train.global_batch=16", NULL) == DT_OK,
          "build");
    CHECK(L.world == 16 && L.dp == 2 && L.tp == 2 && L.pp == 2 && L.cp == 2, "dp = world / (tp pp cp): %d", L.dp);
    CHECK(L.micro == 2 && L.global_batch == 16 && L.m == 4, "m = global / (micro dp): %d", L.m);
    CHECK(L.T == 32 && L.Tl == 16, "T %d, Tl %d", L.T, L.Tl);
    CHECK(dt_layout_shape_ok(&L) && L.shape.padded_vocab == 320 && L.shape.n_layer == 4, "shape, padded %d", L.shape.padded_vocab);
    CHECK(dt_layout_check(&L, DT_CHECK_RUN) == DT_OK, "a layout the trainer runs");

    CHECK(build(&L, 4, "train.grad_accum=3", NULL) == DT_OK && L.dp == 4 && L.m == 3 && L.global_batch == 24,
          "grad_accum: global = micro x dp x a (%d)", L.global_batch);
    CHECK(build(&L, 4, "train.global_batch=16", "parallel.micro_batches=2", NULL) == DT_OK && L.micro == 2 &&
              L.m == 2, "micro_batches: micro = global / (dp m) = %d", L.micro);
    CHECK(build(&L, 2, "train.grad_accum=2", "parallel.micro_batches=3", NULL) == DT_EINPUT &&
              strstr(dt_error_message(), "disagree"), "grad_accum and micro_batches disagree: refused by build");
    CHECK(build(&L, 0, "train.seq_len=16", NULL) == DT_OK && L.world == 0 && L.dp == 1 && L.T == 16 && L.m == 1,
          "no world: dp 1, train.seq_len");
    CHECK(build(&L, 3, "parallel.tp=2", NULL) == DT_OK && L.dp == 1, "world not divisible: dp 1 until checked");
    CHECK(build(&L, 0, "parallel.micro_batches=2", "train.global_batch=8", NULL) == DT_OK && L.micro == 2,
          "no world: the batch keys wait for one (`dtrain plan`, `config` without -n)");
    CHECK(build(&L, 4, "parallel.zero=2", "parallel.cp=1", NULL) == DT_OK && L.zero == 2, "zero");
}

static void enums_and_predicates(void) {
    dt_layout L;
    CHECK(build(&L, 1, NULL) == DT_OK, "defaults");
    CHECK(L.backend == DT_BACKEND_CPU && L.precision == DT_PREC_FP32 && L.dp_mode == DT_DPMODE_DDP &&
              L.determinism == DT_DET_FAST && L.schedule == DT_SCHED_1F1B && L.recompute == DT_RECOMPUTE_NONE &&
              L.comm_backend == DT_COMM_MPI && L.tokenizer == DT_TOKENIZER_BYTE, "the defaults' enums");
    CHECK(!dt_layout_tp_enabled(&L) && !dt_layout_pp_enabled(&L) && !dt_layout_cp_enabled(&L) &&
              !dt_layout_dp_enabled(&L) && !dt_layout_dp_cp_enabled(&L) && !dt_layout_zero_enabled(&L) &&
              !dt_layout_ps(&L) && !dt_layout_bitwise(&L) && !dt_layout_bf16(&L) && !dt_layout_recompute(&L) &&
              !dt_layout_nccl(&L), "one process: no predicate holds");
    CHECK(build(&L, 8, "backend=emulated", "precision=bf16", "parallel.dp_mode=ps", "parallel.determinism=bitwise",
                "parallel.schedule=zb-h1", "train.recompute=full", "comm.backend=nccl", "parallel.pp=2", "parallel.tp=2",
                "parallel.zero=1", NULL) == DT_OK, "every string key set");
    CHECK(L.backend == DT_BACKEND_EMULATED && L.precision == DT_PREC_BF16 && L.dp_mode == DT_DPMODE_PS &&
              L.determinism == DT_DET_BITWISE && L.schedule == DT_SCHED_ZBH1 && L.recompute == DT_RECOMPUTE_FULL &&
              L.comm_backend == DT_COMM_NCCL, "parsed once to enums");
    CHECK(dt_layout_tp_enabled(&L) && dt_layout_pp_enabled(&L) && !dt_layout_cp_enabled(&L) && dt_layout_dp_enabled(&L) &&
              dt_layout_dp_cp_enabled(&L) && dt_layout_zero_enabled(&L) && dt_layout_ps(&L) && dt_layout_bitwise(&L) &&
              dt_layout_bf16(&L) && dt_layout_recompute(&L) && dt_layout_nccl(&L), "predicates");
    CHECK(build(&L, 2, "parallel.cp=2", NULL) == DT_OK && dt_layout_cp_enabled(&L) && !dt_layout_dp_enabled(&L) &&
              dt_layout_dp_cp_enabled(&L), "cp alone: the data group is dp x cp");
    CHECK(build(&L, 1, "data.tokenizer=gpt2", "model.vocab_size=50257", "parallel.schedule=gpipe", NULL) == DT_OK &&
              L.tokenizer == DT_TOKENIZER_GPT2 && L.schedule == DT_SCHED_GPIPE, "tokenizer, gpipe");
}

/* The config's own keys (every command). */
static void config_refusals(void) {
    dt_layout L;
    build(&L, 0, "model.n_embd=66", NULL);
    CHECK(refused(&L, DT_CHECK_CONFIG, "model.n_embd (66) must be divisible by model.n_head (4)"), "n_embd %% n_head");
    build(&L, 0, "train.seq_len=64", NULL);
    CHECK(refused(&L, DT_CHECK_CONFIG, "train.seq_len (64) exceeds the position table"), "seq_len");
    build(&L, 0, "train.global_batch=5", NULL);
    CHECK(refused(&L, DT_CHECK_CONFIG, "train.global_batch (5) must be a multiple of train.micro_batch (2)"), "batch");
    build(&L, 0, "train.lr=1e-4", "train.min_lr=1e-3", NULL);
    CHECK(refused(&L, DT_CHECK_CONFIG, "train.min_lr"), "min_lr > lr");
    build(&L, 0, "data.tokenizer=gpt2", NULL);
    CHECK(refused(&L, DT_CHECK_CONFIG, "smaller than the GPT-2 tokenizer"), "gpt2 vocabulary");
    build(&L, 0, "train.freeze=h.9.*", NULL);
    CHECK(refused(&L, DT_CHECK_CONFIG, "train.freeze: 'h.9.*' matches no tensor"), "freeze glob");
    build(&L, 0, "train.freeze=wte.weight", NULL);
    CHECK(dt_layout_check(&L, DT_CHECK_CONFIG) == DT_OK, "freeze glob that matches");
}

/* The world: tp x pp x cp divides it, the global batch splits over dp. */
static void world_refusals(void) {
    dt_layout L;
    build(&L, 6, "parallel.tp=4", NULL);
    CHECK(refused(&L, DT_CHECK_WORLD, "parallel: world size 6 is not divisible by tp x pp x cp = 4"), "world");
    build(&L, 0, "parallel.tp=4", NULL);
    CHECK(dt_layout_check(&L, DT_CHECK_WORLD) == DT_OK, "no world: nothing to divide");
    build(&L, 4, "train.global_batch=12", NULL);
    CHECK(refused(&L, DT_CHECK_WORLD, "train.micro_batch x data-parallel size = 2 x 4 does not divide "
                                      "train.global_batch 12"), "batch over dp");
}

/* What this build runs (the trainer's refusals, launch's and the planner's). */
static void feature_refusals(void) {
    dt_layout L;
    static const struct {
        int world;
        const char *set[4];
        const char *want;
    } cases[] = {
        /* data parallelism */
        {2, {"parallel.determinism=bitwise", "backend=cuda"}, "parallel.determinism=bitwise runs on the CPU and emulated"},
        {2, {"comm.backend=nccl"}, "comm.backend nccl needs a device backend"},
        {4, {"comm.backend=nccl", "backend=emulated", "parallel.tp=2"}, "comm.backend nccl carries data parallelism only"},
        {2, {"comm.backend=nccl", "backend=emulated", "parallel.dp_mode=ps"}, "comm.backend nccl runs DDP and ZeRO"},
        /* offload (docs/offload.md) */
        {2, {"offload.param=cpu", "parallel.zero=2"}, "offload.param cpu needs parallel.zero=3"},
        {2, {"offload.optimizer=cpu", "parallel.dp_mode=ps"}, "not with parallel.dp_mode ps"},
        {2, {"offload.optimizer=nvme"}, "offload.nvme_path is empty: set the directory for the offload files"},
        /* context parallelism */
        {2, {"parallel.cp=2", "train.seq_len=30"}, "parallel.cp 2: the sequence length 30 must split into 2 x cp = 4"},
        {2, {"parallel.cp=2", "parallel.determinism=bitwise"}, "parallel.cp 2 in bitwise mode: needs parallel.cp_chunks"},
        {4, {"parallel.cp=4", "parallel.determinism=bitwise", "parallel.cp_chunks=4", "train.seq_len=32"},
         "parallel.cp 4 in bitwise mode: parallel.cp_chunks must be a multiple of 2 x cp"},
        {2, {"parallel.cp=2", "parallel.cp_chunks=4", "parallel.determinism=bitwise", "log.sample_tokens=5"},
         "parallel.cp 2: the final sample"},
        {2, {"parallel.cp=2", "backend=emulated"}, "parallel.cp 2: a backend other than cpu"},
        {2, {"parallel.cp=2", "precision=bf16"}, "parallel.cp 2: a precision other than fp32"},
        /* bitwise mode's chunks would not help: the reason named is cp's own */
        {2, {"parallel.cp=2", "precision=bf16", "parallel.determinism=bitwise"}, "parallel.cp 2: a precision other"},
        {2, {"parallel.cp=2", "log.sample_tokens=5"}, "parallel.cp 2: the final sample"},
        /* tensor parallelism */
        {1, {"parallel.sp=true"}, "parallel.sp needs parallel.tp > 1 (sequence parallelism"},
        {3, {"parallel.tp=3"}, "parallel.tp 3 must divide model.n_head 4"},
        {2, {"parallel.tp=2", "parallel.sp=true", "train.micro_batch=1", "train.seq_len=1"},
         "parallel.sp: the micro-batch's 1 x 1 tokens do not split into parallel.tp 2"},
        {2, {"parallel.tp=2", "parallel.determinism=bitwise", "parallel.tp_chunks=1"}, "parallel.tp 2: parallel.determinism bitwise"},
        {8, {"parallel.tp=8", "model.n_head=8", "parallel.determinism=bitwise"}, "parallel.tp 8: bitwise mode cuts"},
        {2, {"parallel.tp=2", "parallel.sp=true", "log.sample_tokens=5"}, "parallel.tp 2: the final sample with sequence"},
        /* pipeline parallelism */
        {1, {"parallel.virtual_stages=2"}, "parallel.virtual_stages 2 needs parallel.pp > 1"},
        {1, {"parallel.pp_split=2,2"}, "parallel.pp_split '2,2' needs parallel.pp > 1"},
        {4, {"parallel.pp=4", "parallel.virtual_stages=2", "parallel.schedule=interleaved"},
         "parallel.pp 4 x virtual_stages 2: the model's 4 blocks cannot give every stage one"},
        {2, {"parallel.pp=2", "parallel.schedule=interleaved"}, "parallel.schedule interleaved needs parallel.virtual_stages >= 2"},
        {2, {"parallel.pp=2", "parallel.virtual_stages=2"}, "parallel.virtual_stages 2 needs parallel.schedule interleaved"},
        {2, {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.schedule=interleaved", "train.global_batch=6"},
         "parallel.schedule interleaved: the 3 micro-batches must be a multiple"},
        {2, {"parallel.pp=2", "parallel.pp_split=3,2"}, "parallel.pp_split '3,2': 2 pieces of 5 blocks"},
        {2, {"parallel.pp=2", "parallel.pp_split=3,x"}, "parallel.pp_split '3,x': expected positive block counts"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *const *s = cases[i].set;
        CHECK(build(&L, cases[i].world, s[0], s[1], s[2], s[3], NULL) == DT_OK, "case %zu builds", i);
        CHECK(refused(&L, DT_CHECK_FEATURES, cases[i].want), "case %zu: %s", i, cases[i].want);
    }
    /* Llama's key/value heads replicated over tp in bitwise mode: a group's tree splits at
     * the replicas where each holds a power of two of its query heads */
    build(&L, 4, "model.family=llama", "model.n_kv_head=1", "model.intermediate_size=128", "parallel.tp=4",
          "parallel.determinism=bitwise", NULL);
    CHECK(dt_layout_check(&L, DT_CHECK_RUN) == DT_OK && dt_layout_canon(&L) == 4, "bitwise multi-query tp 4");
    build(&L, 2, "model.family=llama", "model.n_kv_head=1", "model.intermediate_size=128", "model.n_head=6",
          "model.n_embd=48", "parallel.tp=2", "parallel.determinism=bitwise", NULL);
    CHECK(refused(&L, DT_CHECK_RUN, "per rank (n_head / tp) that is not a power of two") && !dt_layout_canon(&L),
          "bitwise multi-query, 3 query heads a rank");
    /* the sequence chunks step aside for the sample where there are no cp ranks */
    build(&L, 2, "parallel.tp=2", "parallel.cp_chunks=4", "parallel.determinism=bitwise", "log.sample_tokens=5", NULL);
    CHECK(dt_layout_check(&L, DT_CHECK_RUN) == DT_OK, "bitwise tp 2 with the sequence chunks and the sample");
    build(&L, 4, "parallel.pp=2", "parallel.pp_split=3,1", "parallel.schedule=zb-h1", NULL);
    CHECK(dt_layout_check(&L, DT_CHECK_RUN) == DT_OK, "an uneven split, zero bubble");
    build(&L, 2, "parallel.zero=3", "offload.optimizer=nvme", "offload.param=nvme", "offload.nvme_path=/x", NULL);
    CHECK(dt_layout_check(&L, DT_CHECK_RUN) == DT_OK && dt_layout_offload(&L) && L.offload_param == DT_OFFLOAD_NVME,
          "ZeRO-3 with optimizer and parameters on NVMe");
    build(&L, 2, "parallel.zero=3", "offload.param=cpu", NULL);
    CHECK(dt_layout_check(&L, DT_CHECK_RUN) == DT_OK, "parameter offload without optimizer offload (as DeepSpeed)");
    /* the trainer's order: the first rule broken is the one named */
    build(&L, 6, "parallel.tp=4", "parallel.sp=true", NULL);
    CHECK(refused(&L, DT_CHECK_RUN, "world size 6"), "world before tp's rules");
    build(&L, 2, "model.n_embd=66", "parallel.tp=2", NULL);
    CHECK(refused(&L, DT_CHECK_RUN, "model.n_embd (66)"), "config before the layout");
}

/* `dtrain estimate`: a layout on paper, in its own words. */
static void estimate_refusals(void) {
    dt_layout L;
    build(&L, 3, "parallel.tp=3", "model.n_head=3", "model.n_embd=48", NULL);
    CHECK(refused(&L, DT_CHECK_ESTIMATE, "parallel.tp 3 must divide model.n_head 3 and the padded vocabulary 320"),
          "padded vocabulary");
    build(&L, 1, "parallel.sp=true", NULL);
    CHECK(refused(&L, DT_CHECK_ESTIMATE, "parallel.sp needs parallel.tp > 1") &&
              !strstr(dt_error_message(), "sequence parallelism splits"), "sp without tp (short form)");
    build(&L, 2, "parallel.pp=2", "parallel.schedule=zb-h1", "train.recompute=full", NULL);
    CHECK(refused(&L, DT_CHECK_ESTIMATE, "train.recompute full: not with a split backward (parallel.schedule zb-h1)"),
          "recompute and zb-h1");
    build(&L, 4, "parallel.cp=4", "train.seq_len=20", NULL);
    CHECK(refused(&L, DT_CHECK_ESTIMATE, "must split into 2 x cp = 8"), "cp");
    build(&L, 2, "parallel.tp=2", "parallel.sp=true", "train.micro_batch=1", "train.seq_len=1", NULL);
    CHECK(refused(&L, DT_CHECK_ESTIMATE, "do not split into parallel.tp 2 sequence pieces"), "sp tokens");
    build(&L, 1, "model.n_embd=65536", "model.n_head=1", "model.n_layer=1024", "model.seq_len=65536",
          "train.micro_batch=1000000", NULL);
    CHECK(refused(&L, DT_CHECK_ESTIMATE, "exceed 4 EB per rank"), "activations beyond size_t");
    build(&L, 2, "parallel.cp=2", "precision=bf16", NULL);
    CHECK(dt_layout_check(&L, DT_CHECK_ESTIMATE) == DT_OK, "on paper: cp with bf16 is fine");
}

int main(void) {
    derivations();
    enums_and_predicates();
    config_refusals();
    world_refusals();
    feature_refusals();
    estimate_refusals();
    return check_finish();
}

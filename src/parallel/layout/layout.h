/* The parallel layout of a run, as one value (torchtitan's ParallelDims): built once from
 * the config and the world size, it holds every derived size (dp = world / (tp·pp·cp),
 * the sequence each rank computes, micro-batches per step), every string-valued key as an
 * enum, and the model's shape. Every command checks it with the one function below, so a
 * layout is refused with the same line by `train`, `launch`, `config`, `plan` and
 * `estimate`; the trainer, the planner, the estimator and parallelize read it instead of
 * re-deriving it.
 *
 * The config keeps its strings (they are the file contract: JSON, docs, a checkpoint's
 * saved config); the config table already restricts them to their choices, so parsing
 * them here cannot fail. */
#ifndef DT_LAYOUT_H
#define DT_LAYOUT_H
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "../../core/config.h"
#include "../../core/status.h"
#include "../../model/gpt.h"
#include "../model_parallel/schedule.h"

typedef enum { DT_BACKEND_CPU, DT_BACKEND_CUDA, DT_BACKEND_EMULATED } dt_backend_kind;
typedef enum { DT_PREC_FP32, DT_PREC_BF16 } dt_precision;
typedef enum { DT_DPMODE_DDP, DT_DPMODE_PS, DT_DPMODE_PS_ASYNC } dt_dp_mode;
typedef enum { DT_DET_FAST, DT_DET_BITWISE } dt_determinism;
typedef enum { DT_RECOMPUTE_NONE, DT_RECOMPUTE_FULL } dt_recompute;
typedef enum { DT_COMM_MPI, DT_COMM_NCCL } dt_comm_backend;
typedef enum { DT_TOKENIZER_BYTE, DT_TOKENIZER_GPT2, DT_TOKENIZER_HF } dt_tokenizer_kind;
typedef enum { DT_OFFLOAD_NONE, DT_OFFLOAD_CPU, DT_OFFLOAD_NVME } dt_offload_kind;
typedef enum { DT_SYNC_EVERY_STEP, DT_SYNC_LOCAL_SGD, DT_SYNC_DILOCO } dt_sync_mode;

/* Replicas as separate jobs (`dtrain launch --replicas`, which sets DTRAIN_REPLICA,
 * DTRAIN_REPLICAS and DTRAIN_OUTER_ADDR): this job is replica `me` of `n` and the layout's
 * sizes are the whole run's (world = n x this job's ranks, dp_shard = this job's
 * data-parallel ranks); the replicas meet at the outer server, addr. n = 1: one job. */
typedef struct {
    int n, me;
    char addr[280];
} dt_replica_jobs;

typedef struct {
    dt_config cfg; /* the config it was built from, micro-batch and batch keys resolved for the world */
    int world;     /* 0: not known (`dtrain config` without -n); the sizes below then assume dp = 1 */
    int dp, tp, pp, cp, sp, v; /* v: virtual stages (interleaved chunks per pipeline rank) */
    int zero;                  /* ZeRO stage 0..3 (parallel.policy: its units' highest) */
    int replicated;            /* parallel.policy: some units ddp (replicated), the others ZeRO stage zero */
    int dp_shard, dp_replicas; /* HSDP: ZeRO within groups of dp_shard data-parallel ranks, dp_replicas of them (1: none);
                                * local SGD: replicas of dp_shard ranks each (DDP inside) */
    int micro;                 /* sequences per rank per micro-step */
    int m;                     /* micro-steps per optimizer step on each data-parallel rank (accumulation) */
    int global_batch;          /* sequences per optimizer step */
    int T, Tl;                 /* training sequence length; the positions one rank computes (T / cp) */
    gpt_shape shape;           /* the model (padded_vocab 0 when the shape is not valid: dt_layout_shape_ok) */
    dt_backend_kind backend;
    dt_precision precision;
    dt_dp_mode dp_mode;
    dt_determinism determinism;
    dt_schedule schedule;
    dt_recompute recompute;
    dt_comm_backend comm_backend;
    dt_tokenizer_kind tokenizer;
    dt_offload_kind offload_optimizer, offload_param;
    dt_sync_mode sync; /* every_step where local SGD would be it (sync_every 1, one replica) */
    dt_replica_jobs jobs;
} dt_layout;

/* What a command checks (flags): the config's own keys; the world (tp·pp·cp divides it,
 * the batch splits over dp); the features this build runs together (the trainer's
 * refusals); the shape-only rules of `dtrain estimate` (a layout on paper). */
enum { DT_CHECK_CONFIG = 1, DT_CHECK_WORLD = 2, DT_CHECK_FEATURES = 4, DT_CHECK_ESTIMATE = 8 };
#define DT_CHECK_RUN (DT_CHECK_CONFIG | DT_CHECK_WORLD | DT_CHECK_FEATURES)

/* Builds the layout of c over world ranks (0: unknown). Resolves the batch keys
 * (dt_config_resolve_micro_batch): DT_EINPUT when they contradict; nothing else fails
 * here (what does not fit is dt_layout_check's to say). */
dt_status dt_layout_build(dt_layout *L, const dt_config *c, int world);
/* The same for a config whose batch keys are resolved already (cannot fail). */
void dt_layout_derive(dt_layout *L, const dt_config *c, int world);
/* The one validation: DT_EINPUT with one line naming the key(s) and the cause for the
 * first rule of `what` (DT_CHECK_* flags) the layout breaks. */
dt_status dt_layout_check(const dt_layout *L, int what);

/* Ranks one model replica spans: tp x pp x cp (a world is a multiple of it). */
static inline long long dt_layout_model_ranks(const dt_layout *L) { return (long long)L->tp * L->pp * L->cp; }
static inline int dt_layout_tp_enabled(const dt_layout *L) { return L->tp > 1; }
static inline int dt_layout_pp_enabled(const dt_layout *L) { return L->pp > 1; }
static inline int dt_layout_cp_enabled(const dt_layout *L) { return L->cp > 1; }
static inline int dt_layout_dp_enabled(const dt_layout *L) { return L->dp > 1; }
/* Ranks ZeRO shards a state over: a shard group's data-parallel ranks, with the context-parallel ones. */
static inline int dt_layout_shards(const dt_layout *L) { return L->dp_shard * L->cp; }
/* Whether the config's model shape is valid (else dt_layout_check names what is wrong). */
static inline int dt_layout_shape_ok(const dt_layout *L) { return L->shape.padded_vocab > 0; }
/* This job's data-parallel ranks (all of dp but for replicas as separate jobs). */
static inline int dt_layout_job_dp(const dt_layout *L) { return L->dp / L->jobs.n; }
static inline int dt_layout_hsdp(const dt_layout *L) { return L->dp_replicas > 1 && L->sync == DT_SYNC_EVERY_STEP; }
/* Gradients are reduced over the data- and context-parallel ranks together. */
static inline int dt_layout_dp_cp_enabled(const dt_layout *L) { return L->dp * L->cp > 1; }
static inline int dt_layout_zero_enabled(const dt_layout *L) { return L->zero > 0; }
static inline int dt_layout_ps(const dt_layout *L) { return L->dp_mode == DT_DPMODE_PS; }
/* The asynchronous parameter server (its own training loop: src/train/async_ps.h). */
static inline int dt_layout_ps_async(const dt_layout *L) { return L->dp_mode == DT_DPMODE_PS_ASYNC; }
/* A one-line description of what a rank's own training state depends on (ckpt/rank_state.h):
 * "tp .. pp .. cp .. MODE PRECISION sync .. every .. staleness .. params N | world W dp D". */
void dt_layout_state_key(const dt_layout *L, size_t nparams, char *out, size_t cap);
/* The asynchronous parameter server's reproducible order (async_ps.h: with bitwise determinism). */
/* ps-async's updates at the schedule's rate over their gradients' staleness. */
static inline int dt_layout_async_inverse_lr(const dt_layout *L) { return L->cfg.parallel.staleness_lr[0] == 'i'; }
static inline int dt_layout_async_fixed_order(const dt_layout *L) {
    return L->dp_mode == DT_DPMODE_PS_ASYNC && L->determinism == DT_DET_BITWISE;
}
/* The replicas train apart between synchronisations (local SGD, DiLoCo). */
static inline int dt_layout_local_sgd(const dt_layout *L) { return L->sync != DT_SYNC_EVERY_STEP; }
static inline int dt_layout_bitwise(const dt_layout *L) { return L->determinism == DT_DET_BITWISE; }
/* Kernels whose sums do not depend on the thread count (dt_ops_cpu_fixed): bitwise mode's
 * bits then hold across thread counts too (an elastic restart on other cores). */
static inline int dt_layout_fixed_kernels(const dt_layout *L) { return dt_layout_bitwise(L); }
static inline int dt_layout_bf16(const dt_layout *L) { return L->precision == DT_PREC_BF16; }
/* Bitwise mode's canonical chunks of the tensor-parallel sums (parallel.tp_chunks;
 * src/model/tp_chunks.c), in every layout of a model alike, one process included, so tp
 * (dividing them) keeps the bits: GPT-2 without sp, its width a multiple of them; else 0
 * (tp refused in bitwise mode). */
static inline int dt_layout_canon(const dt_layout *L) {
    int q = atoi(L->cfg.parallel.tp_chunks);
    const gpt_shape *s = &L->shape;
    /* Llama: the key/value width and the MLP's cut by q too; key/value heads replicated over
     * tp (attention.c's rope_canon_bwd) only with a power of two of query heads per rank */
    int llama_ok = s->family != GPT_FAMILY_LLAMA ||
                   (gpt_kv_tree_splits(s, L->tp) && (s->n_kv_head * (s->n_embd / s->n_head)) % q == 0 &&
                    s->intermediate % q == 0);
    return dt_layout_bitwise(L) && q > 1 && llama_ok && s->n_embd % q == 0 ? q : 0;
}
/* Bitwise mode's canonical sequence chunks (parallel.cp_chunks; model_parallel/cp_chunks.c):
 * the rows of one (T / cp_chunks positions), 0 where off. */
static inline int dt_layout_row_block(const dt_layout *L) {
    int q = atoi(L->cfg.parallel.cp_chunks);
    return dt_layout_bitwise(L) && q > 1 && L->T % q == 0 ? L->T / q : 0;
}
static inline int dt_layout_recompute(const dt_layout *L) { return L->recompute == DT_RECOMPUTE_FULL; }
/* Each block two units (parallel.unit_split: layout/policy.h); 0 where it does not parse. */
int dt_layout_split_blocks(const dt_layout *L);
static inline int dt_layout_nccl(const dt_layout *L) { return L->comm_backend == DT_COMM_NCCL; }
/* Rows hold documents (data.layout pack, pad or budget): the model takes their starts. */
static inline int dt_layout_documents(const dt_layout *L) { return strcmp(L->cfg.data.layout, "stream") != 0; }
/* The offloaded optimizer state holds fp32 master weights besides the moments: wherever the
 * parameters are not fp32 host memory (a device's, bf16's) or are offloaded themselves
 * (as the optimizer object decides, optim/optimizer.h). */
static inline int dt_layout_offload_master(const dt_layout *L) {
    return L->precision == DT_PREC_BF16 || L->backend != DT_BACKEND_CPU || L->offload_param != DT_OFFLOAD_NONE;
}
/* Some state lives off the model's memory (ZeRO-Offload / ZeRO-Infinity). */
static inline int dt_layout_offload(const dt_layout *L) {
    return L->offload_optimizer != DT_OFFLOAD_NONE || L->offload_param != DT_OFFLOAD_NONE;
}

/* The header line of the batch ("global batch ... (micro-batch ... x ... data-parallel x
 * ... accumulation), N steps, precision, mode, device") and the layout's lines (ZeRO,
 * recompute, tensor, context and pipeline parallelism), as the trainer prints them. */
void dt_layout_print_batch(const dt_layout *L, const char *device, FILE *out);
void dt_layout_print(const dt_layout *L, FILE *out);

#endif

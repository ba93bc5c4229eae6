/* Run configuration: every key, its type, default, range and documentation live in
 * one table (config.c). JSON files (cJSON) and --set key.path=value overrides are
 * both checked against it; unknown keys and out-of-range values are errors naming
 * the key. docs/config.md is generated from the same table (`dtrain config --doc`). */
#ifndef DT_CONFIG_H
#define DT_CONFIG_H
#include <stdio.h>
#include "status.h"

#define DT_PATH_MAX 512

typedef struct {
    struct {
        int n_layer, n_head, n_embd, seq_len, vocab_size;
        char family[8];             /* gpt2 | llama (docs/models.md) */
        int n_kv_head;              /* llama: key/value heads (0: n_head) */
        int intermediate_size;      /* llama: SwiGLU width (0: 8C/3 rounded up to a multiple of 256) */
        double rope_theta, norm_eps;
        double rope_factor, rope_low_freq, rope_high_freq; /* Llama 3 frequency scaling (factor 0: none) */
        int rope_original_max;
        int tie_embeddings, qkv_bias;
    } model;
    struct {
        char train[DT_PATH_MAX], val[DT_PATH_MAX];
        int shuffle;
        char tokenizer[16]; /* "byte", "gpt2" or "hf" */
        char tokenizer_json[DT_PATH_MAX]; /* hf: the tokenizer.json (sampling decodes with it) */
        char layout[8];     /* how rows are built: "stream", "pack", "pad" or "budget" (docs/config.md#rows) */
        char uneven[8];     /* a last global batch with fewer rows: "drop", "join" or "error" */
        char encoder_json[DT_PATH_MAX], vocab_bpe[DT_PATH_MAX];
    } data;
    struct {
        int steps, micro_batch, global_batch, grad_accum, warmup_steps, seq_len, stop_after;
        int epochs; /* > 0: passes over the data, which set steps (finite data) */
        double lr, min_lr, weight_decay, beta1, beta2, eps, grad_clip;
        long long seed;
        int val_every, val_batches, check_memory;
        char init_from[DT_PATH_MAX];
        char recompute[8]; /* none, full */
        char freeze[DT_PATH_MAX]; /* comma-separated globs over tensor names */
    } train;
    struct {
        char dir[DT_PATH_MAX], resume[DT_PATH_MAX];
        int every, overwrite, keep_last, async;
        double shard_mb;
    } checkpoint;
    struct {
        char metrics[DT_PATH_MAX];
        int digest, every, sample_tokens, profile;
        double peak_gflops; /* 0: measured (CPU) or the GPU's table */
        char progress[8]; /* auto, tty, plain */
    } log;
    char backend[16], precision[16];
    int threads;
    struct {
        int tp, pp, cp, sp, zero, micro_batches, virtual_stages;
        char dp_mode[12], schedule[16], determinism[8], tp_chunks[4], cp_chunks[4];
        char pp_split[256]; /* blocks per pipeline stage (per chunk when interleaved), "" balanced */
        double bucket_mb;
        int overlap;
        char sync[16];         /* every_step | local_sgd | diloco (src/parallel/local_sgd.h) */
        int sync_every;        /* H: inner steps between synchronisations */
        double outer_lr, outer_momentum; /* DiLoCo's outer Nesterov step */
        int staleness;         /* gradients applied this many steps late (the deterministic delayed mode) */
        char staleness_lr[12]; /* ps-async: constant | inverse (the rate over the gradient's staleness) */
        int dp_shard;          /* HSDP: ZeRO within groups of this many data-parallel ranks, replicated across (0: all) */
        int unit_blocks;       /* consecutive blocks per wrap unit (ZeRO gathers and reduce-scatters them together) */
        char policy[DT_PATH_MAX]; /* per-unit sharding: comma-separated GLOB:MODE rules (layout/policy.c) */
        char unit_split[DT_PATH_MAX]; /* globs over tensor names beginning a unit inside a block (layout/policy.c) */
    } parallel;
    struct {
        char allreduce[8], reduce_scatter[8], allgather[8], bcast[8];
        char backend[8]; /* mpi | nccl: who carries the data-parallel collectives of a device's state */
        double timeout;  /* seconds before the hang diagnosis (src/comm/watchdog.h); 0: off */
    } comm;
    struct { /* ZeRO-Infinity (src/offload/, docs/offload.md) */
        char optimizer[8], param[8]; /* none | cpu | nvme: where the optimizer state / the parameters live */
        char nvme_path[DT_PATH_MAX]; /* directory of the offload files (nvme) */
        double block_mb;             /* NVMe transfer size per state field */
        int buffer_count;            /* blocks in flight */
        int pin_memory;              /* page-locked host buffers (a GPU's transfers) */
        int delayed_update;          /* ZeRO-Offload's one-step delayed parameter update */
        int delayed_update_warmup;   /* steps updated exactly before the delay starts */
    } offload;
} dt_config;

/* Fills every key with its default. */
void dt_config_defaults(dt_config *c);
/* The text of a JSON config file (a regular file of at most 16 MiB, no NUL byte); caller
 * frees with free(). what names it in messages ("--config", "--deepspeed"). */
dt_status dt_config_read_file(const char *path, const char *what, char **text);
/* Applies a JSON file on top of the current values. */
dt_status dt_config_load_file(dt_config *c, const char *path);
/* Applies a JSON text (e.g. the config saved in a checkpoint). */
dt_status dt_config_load_json(dt_config *c, const char *json, const char *origin);
/* Applies one "key.path=value" override. */
dt_status dt_config_set(dt_config *c, const char *assignment);
/* Cross-key checks (n_embd % n_head, batch divisibility, ...). */
dt_status dt_config_validate(const dt_config *c);
/* The data-parallel size of a world, world / (tp * pp * cp): the one place it is derived
 * (the layout value, the mesh and the batch keys ask here); 0 when a size is below 1, the
 * world unknown (0) or not a multiple of tp * pp * cp. */
int dt_config_dp_size(int world, int tp, int pp, int cp);
/* The batch keys that need the data-parallel size dp = world / (tp * pp * cp):
 * with train.grad_accum a > 0, a global_batch of 0 becomes micro_batch * dp * a, and a set
 * one must equal it (DeepSpeed's train_batch_size = micro x accumulation x dp check);
 * with parallel.micro_batches m > 0, sets train.micro_batch to train.global_batch / (dp * m),
 * so every step runs m micro-batches whatever the layout (Megatron's num_microbatches);
 * a and m both set must agree. DT_EINPUT naming the keys when they contradict. A no-op
 * when neither is set or tp*pp*cp does not divide the world (the layout's check reports that). */
dt_status dt_config_resolve_micro_batch(dt_config *c, int world);
/* Resume: copies every key of a checkpoint's saved config except the per-invocation
 * ones (checkpoint.resume, checkpoint.overwrite, train.stop_after, train.init_from). */
void dt_config_restore(dt_config *dst, const dt_config *saved);
/* DT_EINPUT naming the first key that may not differ from the checkpoint's (model
 * shape, tokenizer), with both values. */
dt_status dt_config_check_resume(const dt_config *now, const dt_config *saved, const char *ckpt);
/* Describes the keys among keys[] that differ ("k old -> new, ..."); returns how many. */
int dt_config_changes(const dt_config *before, const dt_config *after, const char *const *keys, int nkeys, char *buf,
                      size_t cap);
/* Serialises every key as nested JSON; caller frees with free(). */
char *dt_config_to_json(const dt_config *c);
/* Markdown table of every key: path, type, default, range, meaning. */
void dt_config_write_doc(FILE *out);

#endif

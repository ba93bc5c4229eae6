#include "config.h"

#include "deepspeed.h"
#include "input_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { K_INT, K_I64, K_FLOAT, K_BOOL, K_STR, K_ENUM } key_type;

typedef struct {
    const char *path;
    key_type type;
    size_t offset;
    size_t size; /* for strings: buffer size */
    double min, max;
    const char *choices; /* K_ENUM: "a|b|c" */
    const char *def;
    const char *doc;
} key_desc;

#define OFF(field) offsetof(dt_config, field)
#define SZ(field) sizeof(((dt_config *)0)->field)
#define INT(p, f, lo, hi, d, doc) {p, K_INT, OFF(f), SZ(f), lo, hi, NULL, d, doc}
#define I64(p, f, lo, hi, d, doc) {p, K_I64, OFF(f), SZ(f), lo, hi, NULL, d, doc}
#define FLT(p, f, lo, hi, d, doc) {p, K_FLOAT, OFF(f), SZ(f), lo, hi, NULL, d, doc}
#define BOOL(p, f, d, doc) {p, K_BOOL, OFF(f), SZ(f), 0, 1, NULL, d, doc}
#define STR(p, f, d, doc) {p, K_STR, OFF(f), SZ(f), 0, 0, NULL, d, doc}
#define ENUM(p, f, ch, d, doc) {p, K_ENUM, OFF(f), SZ(f), 0, 0, ch, d, doc}

static const key_desc KEYS[] = {
    INT("model.n_layer", model.n_layer, 1, 1024, "4", "transformer blocks"),
    INT("model.n_head", model.n_head, 1, 1024, "4", "attention heads (n_embd must be divisible by it)"),
    INT("model.n_embd", model.n_embd, 1, 65536, "128", "residual stream width C"),
    INT("model.seq_len", model.seq_len, 1, 65536, "128", "context length T (size of the position table)"),
    INT("model.vocab_size", model.vocab_size, 1, 16777216,
        "256", "vocabulary size V; padded internally to a multiple of 64 (token files: 2-byte ids, 4-byte above 65536)"),
    ENUM("model.family", model.family, "gpt2|llama", "gpt2",
         "gpt2: learned positions, LayerNorm, GELU MLP; llama: rotary positions, RMSNorm, SwiGLU, grouped-query "
         "attention (docs/models.md)"),
    INT("model.n_kv_head", model.n_kv_head, 0, 1024, "0",
        "llama: key/value heads, dividing n_head (0: n_head); parallel.tp divides it or is a multiple of it"),
    INT("model.intermediate_size", model.intermediate_size, 0, 1 << 20, "0",
        "llama: the SwiGLU MLP's width (0: 8·n_embd/3 rounded up to a multiple of 256); gpt2: 4·n_embd"),
    FLT("model.rope_theta", model.rope_theta, 1, 1e12, "10000", "llama: rotary embedding base"),
    FLT("model.norm_eps", model.norm_eps, 1e-12, 1, "1e-5", "llama: RMSNorm epsilon (gpt2's LayerNorm: 1e-5)"),
    FLT("model.rope_factor", model.rope_factor, 0, 1e6, "0",
        "llama: Llama 3 rotary frequency scaling factor (0: none; then rope_low_freq, rope_high_freq, "
        "rope_original_max apply)"),
    FLT("model.rope_low_freq", model.rope_low_freq, 0, 1e6, "1", "llama: Llama 3 scaling's low_freq_factor"),
    FLT("model.rope_high_freq", model.rope_high_freq, 0, 1e6, "4", "llama: Llama 3 scaling's high_freq_factor"),
    INT("model.rope_original_max", model.rope_original_max, 1, 1 << 24, "8192",
        "llama: Llama 3 scaling's original_max_position_embeddings"),
    BOOL("model.tie_embeddings", model.tie_embeddings, "true",
         "the LM head is the token embedding (gpt2: always; llama: false gives lm_head.weight of its own)"),
    BOOL("model.qkv_bias", model.qkv_bias, "false", "llama: biases on q, k and v (Qwen2)"),
    STR("data.train", data.train, "data/demo_train.bin", "training token file (see docs/config.md#token-files)"),
    STR("data.val", data.val, "auto",
        "validation token file; auto: the training file's `_val.bin` sibling (PREFIX_train.bin -> PREFIX_val.bin) if it exists; empty: no validation"),
    BOOL("data.shuffle", data.shuffle, "true", "seeded shuffle of sequences each epoch (false: file order)"),
    ENUM("data.tokenizer", data.tokenizer, "byte|gpt2|hf", "byte",
         "tokenizer used by `prepare` and `sample` (hf: a Hugging Face tokenizer.json, data.tokenizer_json)"),
    STR("data.tokenizer_json", data.tokenizer_json, "", "data.tokenizer hf: the tokenizer.json (`sample` decodes with it)"),
    ENUM("data.layout", data.layout, "stream|pack|pad|budget", "stream",
         "rows: windows of the token stream, documents packed with document masks, one document per row, or "
         "pad's documents packed whole into each micro-batch's token budget"),
    ENUM("data.uneven", data.uneven, "drop|join|error", "drop",
         "an epoch's last global batch with fewer rows: drop it, train it (ranks without rows join with nothing), "
         "or refuse the data"),
    STR("data.encoder_json", data.encoder_json, "", "GPT-2 encoder.json (tokenizer gpt2)"),
    STR("data.vocab_bpe", data.vocab_bpe, "", "GPT-2 vocab.bpe (tokenizer gpt2)"),
    INT("train.steps", train.steps, 0, 1e9, "1000", "optimizer steps"),
    INT("train.epochs", train.epochs, 0, 1e6, "0",
        "> 0: train this many passes over the data and stop (sets train.steps: data.uneven decides the last batch)"),
    INT("train.seq_len", train.seq_len, 0, 65536, "0", "training sequence length (0: model.seq_len); at most model.seq_len"),
    INT("train.stop_after", train.stop_after, 0, 1e9,
        "0", "end this run after N steps, keeping the schedule of train.steps (0: run to the end)"),
    INT("train.micro_batch", train.micro_batch, 1, 1e6, "16", "sequences per rank per micro-step"),
    INT("train.global_batch", train.global_batch, 0, 1e9,
        "0", "sequences per optimizer step (0: micro_batch x data-parallel size x grad_accum); accumulation is derived"),
    INT("train.grad_accum", train.grad_accum, 0, 1e6, "0",
        "micro-batches accumulated per optimizer step on each rank, DeepSpeed's gradient_accumulation_steps "
        "(0: derived, global_batch / (micro_batch x data-parallel size)); set with global_batch, the two must agree"),
    FLT("train.lr", train.lr, 0, 10, "2e-3", "peak learning rate"),
    FLT("train.min_lr", train.min_lr, 0, 10, "2e-4", "learning rate at the end of cosine decay"),
    INT("train.warmup_steps", train.warmup_steps, 0, 1e9, "50", "linear warmup steps"),
    FLT("train.weight_decay", train.weight_decay, 0, 10, "0.1", "AdamW decoupled weight decay (2-D weights only)"),
    FLT("train.beta1", train.beta1, 0, 0.999999, "0.9", "AdamW beta1"),
    FLT("train.beta2", train.beta2, 0, 0.999999999, "0.95", "AdamW beta2"),
    FLT("train.eps", train.eps, 1e-30, 1, "1e-8", "AdamW epsilon"),
    FLT("train.grad_clip", train.grad_clip, 0, 1e9, "1.0", "global gradient-norm clip (0 disables)"),
    I64("train.seed", train.seed, 0, 9007199254740991.0, "1337", "seed for initialisation and data order"),
    INT("train.val_every", train.val_every, 0, 1e9, "100", "validate every N steps and at the end (0: never)"),
    STR("train.init_from", train.init_from, "", "start from these weights (safetensors, HF GPT-2 names) instead of random init"),
    INT("train.val_batches", train.val_batches, 1, 1e9, "8", "micro-batches per validation"),
    BOOL("train.check_memory", train.check_memory, "true",
         "refuse to start when the estimated memory of the ranks on this node exceeds the memory available"),
    STR("checkpoint.dir", checkpoint.dir, "", "save checkpoints here (empty: no saving)"),
    INT("checkpoint.every", checkpoint.every, 0, 1e9, "0", "save every N steps (0: only at the end)"),
    STR("checkpoint.resume", checkpoint.resume, "", "resume from this checkpoint directory"),
    BOOL("checkpoint.overwrite", checkpoint.overwrite, "false",
         "start a fresh run in a checkpoint.dir that holds another run's checkpoints (dropped after the first save)"),
    INT("checkpoint.keep_last", checkpoint.keep_last, 0, 1e9, "0",
        "after each save keep only the newest N step directories (0: keep all)"),
    BOOL("checkpoint.async", checkpoint.async, "false",
         "write checkpoints in a background process while training goes on (rank 0 writing alone: no tp, pp or cp)"),
    FLT("checkpoint.shard_mb", checkpoint.shard_mb, 0, 1e9, "0",
        "split the saved model (and optimizer) into files of at most this many MiB, Hugging Face shards + index "
        "(0: one file per pipeline stage, a single file without pipeline stages)"),
    STR("log.metrics", log.metrics, "", "JSON Lines metrics file"),
    BOOL("log.digest", log.digest, "false", "print `digest sha256:...` of the final weights"),
    BOOL("log.profile", log.profile, "false", "time every kernel and print the breakdown at the end"),
    INT("log.every", log.every, 1, 1e9, "1", "print a plain progress line every N steps (non-TTY)"),
    ENUM("log.progress", log.progress, "auto|tty|plain", "auto",
         "progress display: tty = one updating line, plain = a line per step; auto: tty only on an interactive terminal outside MPI launchers"),
    FLT("log.peak_gflops", log.peak_gflops, 0, 1e9, "0",
        "peak GFLOP/s of one rank, the denominator of MFU (0: measured at start on the CPU, a 512^3 SGEMM with each rank's threads, all ranks at once; on a GPU its dense bf16 datasheet rate)"),
    INT("log.sample_tokens", log.sample_tokens, 0, 1e6, "0", "print a text sample of this many tokens at the end"),
    ENUM("backend", backend, "cpu|cuda|emulated", "cpu",
         "compute backend (emulated: the CPU kernels behind a device boundary, to test the GPU paths without a GPU)"),
    STR("train.freeze", train.freeze, "",
        "frozen parameters: comma-separated globs over tensor names, e.g. wte.weight,wpe.weight,h.0.* (no gradient, no update)"),
    ENUM("train.recompute", train.recompute, "none|full", "none",
         "activation checkpointing: full = keep only each block's input, recompute the block in its backward"),
    ENUM("precision", precision, "fp32|bf16", "fp32", "compute precision"),
    INT("threads", threads, 0, 4096, "0",
        "OpenMP/BLAS threads per rank (0: automatic, the CPUs each rank may run on shared among the ranks of its node; OMP_NUM_THREADS, when set, is used instead)"),
    INT("parallel.tp", parallel.tp, 1, 4096, "1", "tensor-parallel size"),
    INT("parallel.pp", parallel.pp, 1, 4096, "1", "pipeline-parallel size"),
    INT("parallel.cp", parallel.cp, 1, 4096, "1", "context-parallel size"),
    BOOL("parallel.sp", parallel.sp, "false", "sequence parallelism (with tp)"),
    INT("parallel.zero", parallel.zero, 0, 3, "0", "ZeRO stage"),
    ENUM("parallel.dp_mode", parallel.dp_mode, "ddp|ps|ps-async", "ddp",
         "data-parallel mode: ddp, ps (a central rank, synchronous) or ps-async (a parameter server applying each "
         "worker's gradient as it arrives, parallel.staleness bounding how far workers run apart)"),
    ENUM("parallel.schedule", parallel.schedule, "gpipe|1f1b|interleaved|zb-h1", "1f1b", "pipeline schedule"),
    INT("parallel.micro_batches", parallel.micro_batches, 0, 1e6, "0", "micro-batches per step, a pipeline's m: sets train.micro_batch to global_batch / (dp x m) (0: train.micro_batch decides)"),
    INT("parallel.virtual_stages", parallel.virtual_stages, 1, 1024, "1", "interleaved pipeline chunks per rank"),
    STR("parallel.pp_split", parallel.pp_split, "",
        "blocks per pipeline stage, comma-separated, e.g. 3,2,2,1 (interleaved: per chunk, in model order; empty: balanced)"),
    BOOL("parallel.overlap", parallel.overlap, "true",
         "DDP and ZeRO-1: start gradient all-reduces / reduce-scatters during backward (false: all after it)"),
    FLT("parallel.bucket_mb", parallel.bucket_mb, 0, 1e6, "25", "DDP gradient bucket size in MiB"),
    INT("parallel.dp_shard", parallel.dp_shard, 0, 1e6, "0",
        "hybrid sharding (HSDP): ZeRO shards the state within groups of this many consecutive data-parallel ranks "
        "(usually a node's) and the groups are replicas, their gradients all-reduced across (0: one group of all); "
        "with parallel.sync local_sgd or diloco: the ranks of one replica, DDP inside (0: 1)"),
    INT("parallel.unit_blocks", parallel.unit_blocks, 1, 1e6, "1",
        "consecutive transformer blocks per wrap unit (FSDP's wrap policy): ZeRO gathers, reduce-scatters and pads "
        "them as one unit (1: each block its own unit); must divide the blocks, pp 1 only"),
    STR("parallel.policy", parallel.policy, "",
        "per-unit sharding policy (FSDP's per-module wrapping): comma-separated GLOB:MODE rules over tensor names "
        "(train.freeze's globs), MODE ddp (replicated), zero1, zero2 or zero3; a tensor takes its first matching "
        "rule's mode, else parallel.zero, and a unit's tensors must take one mode; ddp units with one ZeRO stage, "
        "zero2 units (kept whole between updates) among zero3's (empty: every unit parallel.zero)"),
    STR("parallel.unit_split", parallel.unit_split, "",
        "a block's wrap units (FSDP's wrapping of its submodules): comma-separated globs over tensor names naming "
        "where a unit begins; a block splits at its second norm (h.*.ln_2.weight; Llama: "
        "model.layers.*.post_attention_layernorm.weight) into its attention and MLP halves, every block alike; "
        "unit_blocks 1, pp 1, no recompute, no parameter offload (empty: a block is one unit)"),
    ENUM("parallel.sync", parallel.sync, "every_step|local_sgd|diloco", "every_step",
         "how the data-parallel replicas synchronise: every_step (gradients every step), local_sgd (each replica "
         "trains alone for sync_every steps, then the replicas' weights are averaged) or diloco (the same with an "
         "outer Nesterov step on the averaged change)"),
    INT("parallel.sync_every", parallel.sync_every, 1, 1e9, "1",
        "local_sgd, diloco: inner steps between synchronisations (H); 1 with local_sgd is every_step"),
    INT("parallel.staleness", parallel.staleness, 0, 1e6, "0",
        "dp_mode ddp or ps: the deterministic delayed mode (the gradient applied at update t was computed at the "
        "weights of update t - staleness); ps-async: the bound (a worker waits while it is more than this many "
        "updates ahead of the oldest gradient in progress); 0: synchronous"),
    ENUM("parallel.staleness_lr", parallel.staleness_lr, "constant|inverse", "constant",
         "ps-async: each update's learning rate: constant (the schedule's) or inverse (the schedule's divided by the "
         "gradient's staleness, when above 1: Zhang et al. 2016)"),
    FLT("parallel.outer_lr", parallel.outer_lr, 0, 1e3, "0.7", "diloco: the outer Nesterov step's learning rate"),
    FLT("parallel.outer_momentum", parallel.outer_momentum, 0, 0.999999, "0.9",
        "diloco: the outer Nesterov step's momentum"),
    ENUM("comm.allreduce", comm.allreduce, "auto|mpi|ring|rhd|tree|shm", "auto",
         "all-reduce algorithm (auto: shm when all ranks share a node, else mpi)"),
    ENUM("comm.reduce_scatter", comm.reduce_scatter, "auto|mpi|ring|shm", "auto",
         "reduce-scatter algorithm (auto: shm when all ranks share a node, else mpi)"),
    ENUM("comm.allgather", comm.allgather, "auto|mpi|ring|shm", "auto",
         "all-gather algorithm (auto: shm into node-shared buffers within a node, else mpi)"),
    ENUM("comm.bcast", comm.bcast, "mpi|tree", "mpi", "broadcast algorithm"),
    FLT("comm.timeout", comm.timeout, 0, 1e7, "600",
        "seconds a rank may wait in one collective or point-to-point before it names the ranks that have not "
        "arrived, dumps its flight recorder and exits 1 (0: wait forever)"),
    ENUM("comm.backend", comm.backend, "mpi|nccl", "mpi",
         "data-parallel collectives of a device's state: mpi (host memory, staged) or nccl (device memory; "
         "DDP and ZeRO without tp/pp/cp)"),
    ENUM("parallel.determinism", parallel.determinism, "fast|bitwise", "fast", "reduction order guarantee"),
    ENUM("parallel.tp_chunks", parallel.tp_chunks, "1|2|4|8", "4",
         "bitwise mode: the canonical chunks every tensor-parallel sum is cut into, in every layout alike (one "
         "process included), so any tp dividing it gives the same weights; 1: none (faster, tp refused in bitwise "
         "mode); runs that must share bits use the same value"),
    ENUM("parallel.cp_chunks", parallel.cp_chunks, "1|2|4|8|16|32|64", "1",
         "bitwise mode: the canonical chunks the sequence is cut into, in every layout alike (one process included), "
         "so any cp with 2 x cp dividing it gives the same weights (tp x cp must divide parallel.tp_chunks; fp32); 1: "
         "none (cp refused in bitwise mode); runs that must share bits use the same value"),
    ENUM("offload.optimizer", offload.optimizer, "none|cpu|nvme", "none",
         "where the fp32 master weights and AdamW moments live (ZeRO-Offload / ZeRO-Infinity; DeepSpeed's "
         "zero_optimization.offload_optimizer.device): none = with the parameters, cpu = host memory, nvme = files "
         "under offload.nvme_path, streamed through the update"),
    ENUM("offload.param", offload.param, "none|cpu|nvme", "none",
         "where ZeRO-3's parameter shard lives between uses (DeepSpeed's offload_param.device): fetched one unit "
         "ahead of its forward and backward"),
    STR("offload.nvme_path", offload.nvme_path, "",
        "directory for the offload files (nvme; DeepSpeed's nvme_path): a filesystem that takes O_DIRECT, one "
        "file per rank, created at start and removed at the end"),
    FLT("offload.block_mb", offload.block_mb, 0.0625, 4096, "8",
        "NVMe transfer size in MiB per state field (DeepSpeed's aio block_size); the update streams blocks"),
    INT("offload.buffer_count", offload.buffer_count, 3, 64, "4",
        "NVMe blocks in flight: read ahead, being updated, written back (DeepSpeed's buffer_count)"),
    BOOL("offload.pin_memory", offload.pin_memory, "true",
         "page-locked host memory for a GPU's offloaded state and transfers (DeepSpeed's pin_memory)"),
    BOOL("offload.delayed_update", offload.delayed_update, "false",
         "ZeRO-Offload's one-step delayed parameter update: the host's update of step s runs while step s+1 "
         "computes, which uses the weights without it (needs offload.optimizer cpu or nvme; docs/offload.md)"),
    INT("offload.delayed_update_warmup", offload.delayed_update_warmup, 0, 1000000000, "40",
        "steps updated exactly before offload.delayed_update starts (the ZeRO-Offload paper's 40)"),
};
#define NKEYS (sizeof KEYS / sizeof KEYS[0])

static const key_desc *find_key(const char *path) {
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(KEYS[i].path, path) == 0) return &KEYS[i];
    return NULL;
}

/* Edit distance (insert, delete, substitute, swap of neighbours) for "did you mean". */
static int edit_distance(const char *a, const char *b) {
    enum { MAXL = 64 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= MAXL || m >= MAXL) return 1 << 20;
    int d[MAXL][MAXL];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

/* The unknown key's error: names the closest known key when one is near (a typo, or
 * the right leaf under the wrong group, e.g. train.n_layer for model.n_layer). */
static dt_status unknown_key(const char *origin, const char *path) {
    const char *best = NULL, *leaf = strrchr(path, '.');
    leaf = leaf ? leaf + 1 : path;
    int best_d = 1 << 20;
    for (size_t i = 0; i < NKEYS; i++) {
        const char *kleaf = strrchr(KEYS[i].path, '.');
        kleaf = kleaf ? kleaf + 1 : KEYS[i].path;
        int dist = strcmp(kleaf, leaf) == 0 ? 1 : edit_distance(path, KEYS[i].path);
        if (dist < best_d) {
            best_d = dist;
            best = KEYS[i].path;
        }
    }
    int near = best && best_d <= 1 + (int)strlen(path) / 6;
    return dt_fail(DT_EINPUT, "%s: unknown config key '%s'%s%s%s", origin, path, near ? " (did you mean '" : "",
                   near ? best : "", near ? "'?)" : " (`dtrain config --doc` lists every key)");
}

static int enum_has(const char *choices, const char *v) {
    size_t n = strlen(v);
    const char *p = choices;
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0) return 1;
        if (!bar) break;
        p = bar + 1;
    }
    return 0;
}

static dt_status check_range(const key_desc *k, double v) {
    if (!(v >= k->min && v <= k->max))
        return dt_fail(DT_EINPUT, "config: %s = %g is out of range [%g, %g]", k->path, v, k->min, k->max);
    return DT_OK;
}

/* Stores a value given as text (from --set or the defaults table). */
static dt_status set_from_text(dt_config *c, const key_desc *k, const char *text) {
    char *base = (char *)c + k->offset;
    char *end = NULL;
    switch (k->type) {
    case K_INT:
    case K_I64: {
        /* decimal digits only (1e3, 0x10, 2.5 are errors); range and value from one parse */
        const char *d = text + (*text == '-' || *text == '+');
        if (*d < '0' || *d > '9')
            return dt_fail(DT_EINPUT, "config: %s = '%s' is not an integer", k->path, text);
        errno = 0;
        long long v = strtoll(text, &end, 10);
        if (*end != 0) return dt_fail(DT_EINPUT, "config: %s = '%s' is not an integer", k->path, text);
        if (errno == ERANGE || (double)v < k->min || (double)v > k->max)
            return dt_fail(DT_EINPUT, "config: %s = %s is out of range [%g, %g]", k->path, text, k->min, k->max);
        if (k->type == K_INT) *(int *)base = (int)v;
        else *(long long *)base = v;
        return DT_OK;
    }
    case K_FLOAT: {
        errno = 0;
        double v = strtod(text, &end);
        if (end == text || *end != 0 || errno == ERANGE || !isfinite(v))
            return dt_fail(DT_EINPUT, "config: %s = '%s' is not a number", k->path, text);
        DT_TRY(check_range(k, v));
        *(double *)base = v;
        return DT_OK;
    }
    case K_BOOL:
        if (!strcmp(text, "true") || !strcmp(text, "1")) *(int *)base = 1;
        else if (!strcmp(text, "false") || !strcmp(text, "0")) *(int *)base = 0;
        else return dt_fail(DT_EINPUT, "config: %s = '%s' is not a boolean (true/false)", k->path, text);
        return DT_OK;
    case K_ENUM:
        if (!enum_has(k->choices, text))
            return dt_fail(DT_EINPUT, "config: %s = '%s' is not one of %s", k->path, text, k->choices);
        /* fallthrough */
    case K_STR:
        if (strlen(text) >= k->size)
            return dt_fail(DT_EINPUT, "config: %s is longer than %zu characters", k->path, k->size - 1);
        memcpy(base, text, strlen(text) + 1);
        return DT_OK;
    }
    return DT_OK;
}

void dt_config_defaults(dt_config *c) {
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NKEYS; i++) {
        dt_status s = set_from_text(c, &KEYS[i], KEYS[i].def);
        (void)s; /* defaults are valid by construction (tested) */
    }
}

static dt_status apply_json(dt_config *c, const cJSON *node, const char *prefix, const char *origin) {
    for (const cJSON *it = node->child; it; it = it->next) {
        char path[256];
        if (!it->string) return dt_fail(DT_EINPUT, "%s: config must be a JSON object", origin);
        int n = snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", it->string);
        if (n < 0 || (size_t)n >= sizeof path) return dt_fail(DT_EINPUT, "%s: key path too long", origin);
        const key_desc *k = find_key(path);
        if (cJSON_IsObject(it) && !k) {
            DT_TRY(apply_json(c, it, path, origin));
            continue;
        }
        if (!k) return unknown_key(origin, path);
        char text[DT_PATH_MAX + 32];
        if (cJSON_IsNumber(it)) {
            if (k->type == K_I64 || k->type == K_INT) {
                double v = it->valuedouble;
                if (v != floor(v) || !isfinite(v))
                    return dt_fail(DT_EINPUT, "%s: config key '%s' must be an integer", origin, path);
                snprintf(text, sizeof text, "%.0f", v);
            } else if (k->type == K_FLOAT) {
                snprintf(text, sizeof text, "%.17g", it->valuedouble);
            } else {
                return dt_fail(DT_EINPUT, "%s: config key '%s' must not be a number", origin, path);
            }
        } else if (cJSON_IsBool(it)) {
            if (k->type != K_BOOL) return dt_fail(DT_EINPUT, "%s: config key '%s' must not be a boolean", origin, path);
            snprintf(text, sizeof text, "%s", cJSON_IsTrue(it) ? "true" : "false");
        } else if (cJSON_IsString(it)) {
            if (k->type != K_STR && k->type != K_ENUM)
                return dt_fail(DT_EINPUT, "%s: config key '%s' must not be a string", origin, path);
            if (strlen(it->valuestring) >= sizeof text)
                return dt_fail(DT_EINPUT, "%s: config key '%s' is too long", origin, path);
            snprintf(text, sizeof text, "%s", it->valuestring);
        } else {
            return dt_fail(DT_EINPUT, "%s: config key '%s' has an unsupported JSON type", origin, path);
        }
        dt_status s = set_from_text(c, k, text);
        if (s != DT_OK) {
            dt_error_context("%s", origin);
            return s;
        }
    }
    return DT_OK;
}

dt_status dt_config_load_json(dt_config *c, const char *json, const char *origin) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at ? (size_t)(at - json) : 0;
        return dt_fail(DT_EINPUT, "%s: malformed JSON near byte %zu", origin, off);
    }
    while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r') end++;
    if (*end) {
        cJSON_Delete(root);
        return dt_fail(DT_EINPUT, "%s: unexpected text after the JSON object at byte %zu", origin,
                       (size_t)(end - json));
    }
    dt_status s = DT_OK;
    const char *ds = cJSON_IsObject(root) ? dt_deepspeed_marker(root) : NULL;
    if (!cJSON_IsObject(root)) s = dt_fail(DT_EINPUT, "%s: config must be a JSON object", origin);
    else if (ds) /* explicit: --config takes dtrain's keys only, --deepspeed translates */
        s = dt_fail(DT_EINPUT, "%s is a DeepSpeed config (it has '%s'): pass it with --deepspeed FILE, which "
                    "translates it (docs/coming-from.md)", origin, ds);
    else s = apply_json(c, root, "", origin);
    cJSON_Delete(root);
    return s;
}

dt_status dt_config_read_file(const char *path, const char *what, char **text) {
    *text = NULL;
    size_t got;
    char *buf;
    DT_TRY(dt_input_read(path, what, &buf, &got, 16u << 20));
    const char *nul = memchr(buf, 0, got); /* the parser would stop there and ignore the rest */
    if (nul) {
        size_t at = (size_t)(nul - buf);
        free(buf);
        return dt_fail(DT_EINPUT, "%s: '%s': a NUL byte at offset %zu (not a JSON text file)", what, path, at);
    }
    *text = buf;
    return DT_OK;
}

dt_status dt_config_load_file(dt_config *c, const char *path) {
    char *buf;
    DT_TRY(dt_config_read_file(path, "--config", &buf));
    char origin[DT_PATH_MAX + 16];
    snprintf(origin, sizeof origin, "config file '%s'", path);
    dt_status s = dt_config_load_json(c, buf, origin);
    free(buf);
    return s;
}

dt_status dt_config_set(dt_config *c, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    if (!eq) return dt_fail(DT_EINPUT, "--set '%s': expected key.path=value", assignment);
    char path[256];
    size_t n = (size_t)(eq - assignment);
    if (n == 0 || n >= sizeof path) return dt_fail(DT_EINPUT, "--set '%s': bad key", assignment);
    memcpy(path, assignment, n);
    path[n] = 0;
    const key_desc *k = find_key(path);
    if (!k) return unknown_key("--set", path);
    return set_from_text(c, k, eq + 1);
}

dt_status dt_config_validate(const dt_config *c) {
    if (c->model.n_embd % c->model.n_head != 0)
        return dt_fail(DT_EINPUT, "config: model.n_embd (%d) must be divisible by model.n_head (%d)", c->model.n_embd,
                       c->model.n_head);
    if (!strcmp(c->model.family, "gpt2")) { /* GPT-2's choices are fixed */
        if (!c->model.tie_embeddings)
            return dt_fail(DT_EINPUT, "config: model.tie_embeddings false: GPT-2's head is always its token embedding");
        if (c->model.qkv_bias || (c->model.n_kv_head && c->model.n_kv_head != c->model.n_head) ||
            (c->model.intermediate_size && c->model.intermediate_size != 4 * c->model.n_embd) || c->model.rope_factor)
            return dt_fail(DT_EINPUT, "config: model.qkv_bias, n_kv_head, intermediate_size and rope_factor are "
                           "model.family llama's (gpt2 has full heads, a 4·n_embd MLP and learned positions)");
    } else {
        if (c->model.n_kv_head && c->model.n_head % c->model.n_kv_head != 0)
            return dt_fail(DT_EINPUT, "config: model.n_kv_head (%d) must divide model.n_head (%d)", c->model.n_kv_head,
                           c->model.n_head);
        if ((c->model.n_embd / c->model.n_head) % 2 != 0)
            return dt_fail(DT_EINPUT, "config: model.family llama: the head size n_embd / n_head (%d) must be even "
                           "(rotary embeddings rotate pairs)", c->model.n_embd / c->model.n_head);
    }
    if (c->train.seq_len > c->model.seq_len)
        return dt_fail(DT_EINPUT, "config: train.seq_len (%d) exceeds the position table (model.seq_len %d)",
                       c->train.seq_len, c->model.seq_len);
    if (c->parallel.micro_batches == 0 && c->train.global_batch > 0 && c->train.global_batch % c->train.micro_batch != 0)
        return dt_fail(DT_EINPUT, "config: train.global_batch (%d) must be a multiple of train.micro_batch (%d)",
                       c->train.global_batch, c->train.micro_batch);
    if (c->train.min_lr > c->train.lr)
        return dt_fail(DT_EINPUT, "config: train.min_lr (%g) must not exceed train.lr (%g)", c->train.min_lr,
                       c->train.lr);
    if (!strcmp(c->data.layout, "budget") && !strcmp(c->parallel.determinism, "bitwise"))
        return dt_fail(DT_EINPUT, "config: data.layout budget: not with parallel.determinism bitwise (its fixed "
                       "reduction tree has a leaf per micro-step of the layout)");
    if (!strcmp(c->data.tokenizer, "gpt2") && c->model.vocab_size < 50257)
        return dt_fail(DT_EINPUT, "config: model.vocab_size (%d) is smaller than the GPT-2 tokenizer's 50257",
                       c->model.vocab_size);
    return DT_OK;
}

int dt_config_dp_size(int world, int tp, int pp, int cp) {
    if (world < 1 || tp < 1 || pp < 1 || cp < 1) return 0;
    long long model = (long long)tp * pp * cp;
    return world % model == 0 ? (int)(world / model) : 0;
}

dt_status dt_config_resolve_micro_batch(dt_config *c, int world) {
    int m = c->parallel.micro_batches, a = c->train.grad_accum;
    long long dp = dt_config_dp_size(world, c->parallel.tp, c->parallel.pp, c->parallel.cp), gb = c->train.global_batch;
    if ((m <= 0 && a <= 0) || dp <= 0) return DT_OK;
    if (a > 0 && m > 0 && a != m)
        return dt_fail(DT_EINPUT, "config: train.grad_accum %d and parallel.micro_batches %d disagree (both count the "
                       "micro-batches of a step: set one)", a, m);
    if (a > 0) {
        long long want = (long long)c->train.micro_batch * dp * a;
        if (gb == 0 && want > 1000000000LL)
            return dt_fail(DT_EINPUT, "config: train.micro_batch %d x data-parallel size %lld x train.grad_accum %d "
                           "exceeds the largest train.global_batch", c->train.micro_batch, dp, a);
        if (gb == 0) c->train.global_batch = (int)(gb = want);
        else if (m <= 0 && gb != want)
            return dt_fail(DT_EINPUT, "config: train.global_batch %lld is not train.micro_batch %d x data-parallel "
                           "size %lld x train.grad_accum %d = %lld (set train.grad_accum=0 to derive it)", gb,
                           c->train.micro_batch, dp, a, want);
    }
    if (m <= 0) return DT_OK;
    if (gb <= 0)
        return dt_fail(DT_EINPUT, "config: parallel.micro_batches %d needs train.global_batch (the micro-batch is "
                       "derived from it)", m);
    if (gb % (dp * m) != 0)
        return dt_fail(DT_EINPUT, "config: parallel.micro_batches %d x data-parallel size %lld does not divide "
                       "train.global_batch %lld", m, dp, gb);
    c->train.micro_batch = (int)(gb / (dp * m));
    return DT_OK;
}

/* ---- resume: what a checkpoint's saved config restores ---- */

/* Chosen for this invocation only, never taken from a checkpoint. The model-parallel
 * layout is the job's (how its ranks split the model): checkpoints hold whole tensors,
 * so any layout resumes any checkpoint, as any data-parallel size does. */
static const char *const PER_RUN[] = {"checkpoint.resume", "checkpoint.overwrite", "train.stop_after",
                                      "train.init_from", "parallel.tp", "parallel.pp", "parallel.cp"};
/* What the weights and the token ids depend on: fixed for the life of a run. */
static const char *const FIXED[] = {"model.n_layer",      "model.n_head",     "model.n_embd",
                                    "model.seq_len",      "model.vocab_size", "data.tokenizer",
                                    "model.family",       "model.n_kv_head",  "model.intermediate_size",
                                    "model.rope_theta",   "model.norm_eps",   "model.rope_factor",
                                    "model.rope_low_freq", "model.rope_high_freq", "model.rope_original_max",
                                    "model.tie_embeddings", "model.qkv_bias"};

static int in_list(const char *path, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(path, list[i])) return 1;
    return 0;
}

static void format_value(const key_desc *k, const dt_config *c, char *buf, size_t cap) {
    const char *base = (const char *)c + k->offset;
    switch (k->type) {
    case K_INT:
    case K_BOOL: snprintf(buf, cap, "%d", *(const int *)base); break;
    case K_I64: snprintf(buf, cap, "%lld", *(const long long *)base); break;
    case K_FLOAT: /* the shortest text that reads back as the same double */
        for (int p = 1; p <= 17; p++) {
            snprintf(buf, cap, "%.*g", p, *(const double *)base);
            if (strtod(buf, NULL) == *(const double *)base) break;
        }
        break;
    case K_STR:
    case K_ENUM: snprintf(buf, cap, "'%s'", base); break;
    }
    if (k->type == K_BOOL) snprintf(buf, cap, "%s", *(const int *)base ? "true" : "false");
}

static int same_value(const key_desc *k, const dt_config *a, const dt_config *b) {
    const char *x = (const char *)a + k->offset, *y = (const char *)b + k->offset;
    if (k->type == K_STR || k->type == K_ENUM) return strcmp(x, y) == 0;
    return memcmp(x, y, k->size) == 0;
}

void dt_config_restore(dt_config *dst, const dt_config *saved) {
    for (size_t i = 0; i < NKEYS; i++)
        if (!in_list(KEYS[i].path, PER_RUN, sizeof PER_RUN / sizeof *PER_RUN))
            memcpy((char *)dst + KEYS[i].offset, (const char *)saved + KEYS[i].offset, KEYS[i].size);
}

dt_status dt_config_check_resume(const dt_config *now, const dt_config *saved, const char *ckpt) {
    for (size_t i = 0; i < NKEYS; i++) {
        const key_desc *k = &KEYS[i];
        if (!in_list(k->path, FIXED, sizeof FIXED / sizeof *FIXED) || same_value(k, now, saved)) continue;
        char a[DT_PATH_MAX + 8], b[DT_PATH_MAX + 8];
        format_value(k, now, a, sizeof a);
        format_value(k, saved, b, sizeof b);
        return dt_fail(DT_EINPUT, "checkpoint '%s': %s = %s, but it was trained with %s (the model shape and "
                       "tokenizer of a checkpoint cannot change)", ckpt, k->path, a, b);
    }
    return DT_OK;
}

int dt_config_changes(const dt_config *before, const dt_config *after, const char *const *keys, int nkeys, char *buf,
                      size_t cap) {
    int n = 0;
    size_t len = 0;
    if (cap) buf[0] = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        const key_desc *k = &KEYS[i];
        if (!in_list(k->path, keys, (size_t)nkeys) || same_value(k, before, after)) continue;
        char a[DT_PATH_MAX + 8], b[DT_PATH_MAX + 8];
        format_value(k, before, a, sizeof a);
        format_value(k, after, b, sizeof b);
        if (len < cap) len += (size_t)snprintf(buf + len, cap - len, "%s%s %s -> %s", n ? ", " : "", k->path, a, b);
        n++;
    }
    return n;
}

static cJSON *ensure_object(cJSON *root, const char *path, const char **leaf) {
    char part[64];
    const char *p = path;
    cJSON *node = root;
    for (;;) {
        const char *dot = strchr(p, '.');
        if (!dot) break;
        size_t n = (size_t)(dot - p);
        if (n >= sizeof part) n = sizeof part - 1;
        memcpy(part, p, n);
        part[n] = 0;
        cJSON *child = cJSON_GetObjectItemCaseSensitive(node, part);
        if (!child) child = cJSON_AddObjectToObject(node, part);
        node = child;
        p = dot + 1;
    }
    *leaf = p;
    return node;
}

char *dt_config_to_json(const dt_config *c) {
    cJSON *root = cJSON_CreateObject();
    for (size_t i = 0; i < NKEYS; i++) {
        const key_desc *k = &KEYS[i];
        const char *leaf;
        cJSON *obj = ensure_object(root, k->path, &leaf);
        const char *base = (const char *)c + k->offset;
        switch (k->type) {
        case K_INT: cJSON_AddNumberToObject(obj, leaf, *(const int *)base); break;
        case K_I64: {
            char num[32]; /* as digits: cJSON prints doubles with 15 significant digits */
            snprintf(num, sizeof num, "%lld", *(const long long *)base);
            cJSON_AddRawToObject(obj, leaf, num);
            break;
        }
        case K_FLOAT: {
            /* the shortest form that reads back as the same double (a resumed run's
             * learning rate must be bitwise the saved one) */
            double v = *(const double *)base;
            char num[40];
            for (int digits = 15; digits <= 17; digits++) {
                snprintf(num, sizeof num, "%.*g", digits, v);
                if (strtod(num, NULL) == v) break;
            }
            cJSON_AddRawToObject(obj, leaf, num);
            break;
        }
        case K_BOOL: cJSON_AddBoolToObject(obj, leaf, *(const int *)base); break;
        case K_STR:
        case K_ENUM: cJSON_AddStringToObject(obj, leaf, base); break;
        }
    }
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

void dt_config_write_doc(FILE *out) {
    static const char *type_names[] = {"int", "int", "float", "bool", "string", "enum"};
    fprintf(out, "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n");
    for (size_t i = 0; i < NKEYS; i++) {
        const key_desc *k = &KEYS[i];
        char allowed[128] = "";
        if (k->type == K_ENUM) {
            /* '|' would split the markdown cell */
            size_t j = 0;
            for (const char *p = k->choices; *p && j + 3 < sizeof allowed; p++) {
                if (*p == '|') { allowed[j++] = ','; allowed[j++] = ' '; }
                else allowed[j++] = *p;
            }
            allowed[j] = 0;
        }
        else if (k->type == K_INT || k->type == K_I64 || k->type == K_FLOAT)
            snprintf(allowed, sizeof allowed, "%g .. %g", k->min, k->max);
        else if (k->type == K_BOOL) snprintf(allowed, sizeof allowed, "true, false");
        fprintf(out, "| `%s` | %s | `%s` | %s | %s |\n", k->path, type_names[k->type], k->def, allowed, k->doc);
    }
}

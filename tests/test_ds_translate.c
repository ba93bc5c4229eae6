/* The DeepSpeed translation (src/core/deepspeed.c) and the batch triple it leans on
 * (dt_config_resolve_micro_batch with train.grad_accum), as pure functions: DeepSpeed's
 * derivations of the missing batch size for every combination given, "auto" as absent,
 * type errors, refusals, the ignored list, the --config detection. The CLI paths and the
 * training parity are tests/test_deepspeed.sh. */
#include <string.h>

#include "check.h"
#include "core/config.h"
#include "core/deepspeed.h"

static char g_ign[1024];

static dt_status ds(dt_config *c, const char *json) {
    dt_error_clear(); /* the first failure's message stays until cleared */
    dt_config_defaults(c);
    return dt_deepspeed_load_json(c, json, "ds", g_ign, sizeof g_ign);
}

/* The micro-batch, global batch and accumulation after resolving on `world` ranks. */
static dt_status triple(const char *json, int world, int *micro, int *gb, int *accum) {
    dt_config c;
    DT_TRY(ds(&c, json));
    DT_TRY(dt_config_resolve_micro_batch(&c, world));
    int dp = world / (c.parallel.tp * c.parallel.pp * c.parallel.cp);
    *micro = c.train.micro_batch;
    *gb = c.train.global_batch > 0 ? c.train.global_batch : *micro * dp;
    *accum = *gb / (*micro * dp);
    return DT_OK;
}

int main(void) {
    dt_config c;
    int m, g, a;
    /* DeepSpeed's derivations (4 ranks; dtrain's default micro-batch is 16) */
    CHECK(triple("{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 4}",
                 4, &m, &g, &a) == DT_OK && m == 4 && g == 64 && a == 4, "all three: %d %d %d", m, g, a);
    CHECK(triple("{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 8}", 4, &m, &g, &a) == DT_OK &&
          m == 8 && g == 64 && a == 2, "batch + micro: %d %d %d", m, g, a);
    CHECK(triple("{\"train_batch_size\": 64, \"gradient_accumulation_steps\": 2}", 4, &m, &g, &a) == DT_OK &&
          m == 8 && g == 64 && a == 2, "batch + accumulation: %d %d %d", m, g, a);
    CHECK(triple("{\"train_batch_size\": 32}", 4, &m, &g, &a) == DT_OK && m == 8 && g == 32 && a == 1,
          "batch alone: %d %d %d", m, g, a);
    CHECK(triple("{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 3}", 4, &m, &g, &a) ==
              DT_OK && m == 2 && g == 24 && a == 3, "micro + accumulation: %d %d %d", m, g, a);
    CHECK(triple("{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\", "
                 "\"gradient_accumulation_steps\": \"auto\"}", 4, &m, &g, &a) == DT_OK && m == 16 && g == 64 && a == 1,
          "all auto: dtrain's: %d %d %d", m, g, a);
    CHECK(triple("{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 4}",
                 2, &m, &g, &a) == DT_EINPUT && strstr(dt_error_message(), "train.grad_accum 4"),
          "all three on the wrong world");
    CHECK(ds(&c, "{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2}")
              == DT_EINPUT, "batch not a multiple of micro x accumulation: refused before the world is known");

    /* train.grad_accum, the dtrain key */
    dt_config_defaults(&c);
    c.train.micro_batch = 2;
    c.train.grad_accum = 3;
    CHECK(dt_config_resolve_micro_batch(&c, 2) == DT_OK && c.train.global_batch == 12, "grad_accum defines the batch");
    CHECK(dt_config_resolve_micro_batch(&c, 2) == DT_OK && c.train.global_batch == 12, "and again: idempotent");
    dt_error_clear();
    CHECK(dt_config_resolve_micro_batch(&c, 4) == DT_EINPUT && strstr(dt_error_message(), "train.global_batch 12"),
          "then another dp contradicts it");
    c.train.global_batch = 0;
    c.parallel.micro_batches = 2;
    dt_error_clear();
    CHECK(dt_config_resolve_micro_batch(&c, 2) == DT_EINPUT && strstr(dt_error_message(), "parallel.micro_batches 2"),
          "grad_accum and micro_batches disagree");
    c.parallel.micro_batches = 3;
    c.train.global_batch = 24;
    CHECK(dt_config_resolve_micro_batch(&c, 2) == DT_OK && c.train.micro_batch == 4, "equal to micro_batches: fine");

    /* the design notes' ZeRO-2 file */
    CHECK(ds(&c, "{\"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2, \"overlap_comm\": false, "
                 "\"contiguous_gradients\": true, \"reduce_bucket_size\": 5e8, \"allgather_bucket_size\": 5e8}, "
                 "\"gradient_accumulation_steps\": 4, \"gradient_clipping\": 0.5, \"train_batch_size\": \"auto\", "
                 "\"train_micro_batch_size_per_gpu\": \"auto\", \"wall_clock_breakdown\": false}") == DT_OK,
          "zero2");
    CHECK(!strcmp(c.precision, "bf16") && c.parallel.zero == 2 && !c.parallel.overlap && c.train.grad_clip == 0.5 &&
              c.train.grad_accum == 4 && c.train.global_batch == 0 && c.parallel.bucket_mb == 5e8 * 2 / (1 << 20) &&
              !c.log.profile,
          "zero2 values");
    CHECK(!strcmp(g_ign, "zero_optimization.contiguous_gradients, zero_optimization.allgather_bucket_size"),
          "zero2 ignored: %s", g_ign);
    CHECK(ds(&c, "{\"zero_optimization\": {\"allgather_bucket_size\": 1048576}}") == DT_OK &&
              c.parallel.bucket_mb == 4 && !g_ign[0], "the all-gather bucket when there is no reduce bucket (fp32: 4 MiB)");

    /* types and refusals name the key */
    static const struct { const char *json, *want; } bad[] = {
        {"{\"gradient_clipping\": \"1\"}", "gradient_clipping must be a number"},
        {"{\"train_batch_size\": 2.5}", "train_batch_size = 2.5 must be an integer"},
        {"{\"train_micro_batch_size_per_gpu\": 0}", "train_micro_batch_size_per_gpu = 0"},
        {"{\"zero_optimization\": {\"stage\": 4}}", "zero_optimization.stage = 4"},
        {"{\"zero_optimization\": 3}", "zero_optimization must be an object, not a number"},
        {"{\"zero_optimization\": {\"overlap_comm\": \"yes\"}}", "zero_optimization.overlap_comm must be true"},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}}}",
         "offload_optimizer.ratio: partial offload is not supported"},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/a\"}, "
         "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/b\"}}}", "'/a' and zero_optimization.offload_param.nvme_path '/b' differ"},
        {"{\"zero_optimization\": {\"offload_param\": {\"device\": \"cpu\", \"buffer\": 5}}}",
         "unknown key zero_optimization.offload_param.buffer"},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\", \"buffer_count\": 2}}}",
         "offload.buffer_count = 2 is out of range"},
        {"{\"zero_optimization\": {\"aio\": {}}}", "aio is a top-level block"},
        {"{\"zero_optimization\": {\"cpu_offload\": 1}}", "cpu_offload must be true, false"},
        {"{\"zero_optimization\": {\"offload_param\": {\"device\": \"gpu\"}}}", "is not one of none, cpu, nvme"},
        {"{\"zero_optimization\": {\"contiguous_gradients\": {}}}", "must be a number, boolean or string"},
        {"{\"fp16\": {\"enabled\": true}}", "fp16.enabled: fp16 with loss scaling"},
        {"{\"amp\": {\"enabled\": true}}", "amp.enabled"},
        {"{\"optimizer\": {\"params\": {}}}", "optimizer.type is missing"},
        {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": [1]}}}", "optimizer.params.lr must be a number"},
        {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"momentum\": 0.9}}}", "unknown key optimizer.params.momentum"},
        {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"amsgrad\": true}}}", "AMSGrad"},
        {"{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 5, \"warmup_type\": \"linear\", "
         "\"warmup_min_ratio\": 0.1}}}", "warmup_min_ratio: dtrain's warmup starts from 0"},
        {"{\"scheduler\": {\"type\": \"OneCycle\"}}", "scheduler.type = 'OneCycle'"},
        {"{\"sparse_attention\": {\"mode\": \"fixed\"}}", NULL /* no enabled switch: listed, not refused */},
        {"[1, 2]", "must be a JSON object"},
        {"{\"bf16\": {\"enabled\": true}} x", "unexpected text"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dt_status s = ds(&c, bad[i].json);
        if (!bad[i].want) CHECK(s == DT_OK, "%s accepted", bad[i].json);
        else CHECK(s == DT_EINPUT && strstr(dt_error_message(), bad[i].want), "%s -> '%s'", bad[i].json, bad[i].want);
    }

    /* offload: the blocks onto offload.* (docs/offload.md's table) */
    CHECK(ds(&c, "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": "
                 "\"/nv\", \"pin_memory\": false, \"buffer_count\": 6, \"fast_init\": false, \"ratio\": 1}, "
                 "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/nv\", \"pin_memory\": true, \"buffer_count\": 5, "
                 "\"buffer_size\": 1e8, \"max_in_cpu\": 1e9}}, \"aio\": {\"block_size\": 262144, \"queue_depth\": 32, "
                 "\"thread_count\": 1, \"single_submit\": false, \"overlap_events\": true}}") == DT_OK,
          "ZeRO-Infinity's nvme file: %s", dt_error_message());
    CHECK(!strcmp(c.offload.optimizer, "nvme") && !strcmp(c.offload.param, "nvme") && !strcmp(c.offload.nvme_path, "/nv") &&
              c.offload.block_mb == 0.25 && c.offload.buffer_count == 6 && !c.offload.pin_memory && c.parallel.zero == 3,
          "nvme: devices, one directory, block_size 256 KiB = 0.25 MiB, the optimizer block's buffer_count and pin_memory");
    CHECK(!strcmp(g_ign, "zero_optimization.offload_optimizer.fast_init, zero_optimization.offload_param.buffer_size "
                         "(dtrain sizes its buffers from offload.block_mb), zero_optimization.offload_param.max_in_cpu, "
                         "zero_optimization.offload_param.pin_memory (one offload.pin_memory: the optimizer block's), "
                         "zero_optimization.offload_param.buffer_count (one offload.buffer_count: the optimizer block's), "
                         "aio.queue_depth (dtrain keeps offload.buffer_count blocks in flight), aio.thread_count, "
                         "aio.single_submit, aio.overlap_events"),
          "nvme ignored: %s", g_ign);
    CHECK(ds(&c, "{\"zero_optimization\": {\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/p\", "
                 "\"buffer_count\": 8}, \"offload_optimizer\": {\"device\": \"cpu\", \"nvme_path\": \"/o\"}}, "
                 "\"aio\": {\"block_size\": 1048576}}") == DT_OK &&
              !strcmp(c.offload.optimizer, "cpu") && !strcmp(c.offload.nvme_path, "/p") && c.offload.buffer_count == 8 &&
              c.offload.block_mb == 1 &&
              !strcmp(g_ign, "zero_optimization.offload_optimizer.nvme_path (device is not nvme)"),
          "param on nvme, optimizer on cpu: the param block's directory and buffers, the cpu block's path listed: %s", g_ign);
    CHECK(ds(&c, "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\", \"buffer_count\": \"auto\"}}}") ==
              DT_OK && c.offload.buffer_count == 4 && !g_ign[0], "nvme with buffer_count auto: dtrain's, not listed: %s", g_ign);
    CHECK(ds(&c, "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", \"buffer_count\": 2}}, "
                 "\"aio\": {\"block_size\": 4096}}") == DT_OK && c.offload.buffer_count == 4 && c.offload.block_mb == 8 &&
              !strcmp(g_ign, "zero_optimization.offload_optimizer.buffer_count (device is not nvme), aio.block_size (no "
                             "nvme offload)"),
          "cpu: the nvme knobs listed, not applied: %s", g_ign);
    CHECK(ds(&c, "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"none\", \"ratio\": 0.5, \"pin_memory\": "
                 "false}}}") == DT_OK && !strcmp(c.offload.optimizer, "none") && c.offload.pin_memory && !g_ign[0],
          "device none: the block's other keys have no effect");
    CHECK(ds(&c, "{\"zero_optimization\": {\"stage\": 3, \"cpu_offload\": true, \"cpu_offload_params\": true, "
                 "\"cpu_offload_use_pin_memory\": false}}") == DT_OK && !strcmp(c.offload.optimizer, "cpu") &&
              !strcmp(c.offload.param, "cpu") && !c.offload.pin_memory && !g_ign[0],
          "legacy cpu_offload, cpu_offload_params, cpu_offload_use_pin_memory: %s", g_ign);
    CHECK(ds(&c, "{\"zero_optimization\": {\"cpu_offload\": true, \"offload_optimizer\": {\"device\": \"nvme\", "
                 "\"nvme_path\": \"/n\"}}}") == DT_OK && !strcmp(c.offload.optimizer, "nvme") &&
              !strcmp(g_ign, "zero_optimization.cpu_offload (offload_optimizer given)"),
          "the block wins over the legacy switch: %s", g_ign);

    /* schedules: the same math as dtrain's */
    CHECK(ds(&c, "{\"optimizer\": {\"type\": \"adam\", \"params\": {\"lr\": 0.01, \"betas\": [0.5, 0.75]}}, "
                 "\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 100, "
                 "\"warmup_num_steps\": 0}}}") == DT_OK,
          "cosine without warmup: no warmup_type needed");
    CHECK(c.train.lr == 0.01 && c.train.beta1 == 0.5 && c.train.beta2 == 0.75 && c.train.steps == 100 &&
              c.train.warmup_steps == 0 && c.train.min_lr == 0.01 * 1e-4,
          "cosine: min_lr = cos_min_ratio default 1e-4 x lr (%g)", c.train.min_lr);
    CHECK(ds(&c, "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_max_lr\": \"auto\", "
                 "\"warmup_num_steps\": 7, \"warmup_type\": \"linear\"}}}") == DT_OK &&
              c.train.lr == 2e-3 && c.train.min_lr == 2e-3 && c.train.warmup_steps == 7,
          "WarmupLR with auto peak: dtrain's lr, flat after the warmup");

    /* --config detection */
    dt_config_defaults(&c);
    dt_error_clear();
    CHECK(dt_config_load_json(&c, "{\"train_micro_batch_size_per_gpu\": 4}", "f") == DT_EINPUT &&
              strstr(dt_error_message(), "--deepspeed"), "--config names a DeepSpeed file");
    CHECK(dt_config_load_json(&c, "{\"train\": {\"grad_accum\": 2}}", "f") == DT_OK && c.train.grad_accum == 2,
          "train.grad_accum in a dtrain file");
    return check_finish();
}

#include "deepspeed.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* An offload block (zero_optimization.offload_optimizer / offload_param) as read: dtrain
 * has one directory, one pin_memory and one buffer_count for both, so the two blocks are
 * applied together once zero_optimization is read (apply_offload). */
typedef struct {
    int present;
    const char *device; /* "cpu" or "nvme"; NULL: none (or "auto") */
    const cJSON *nvme_path, *pin_memory, *buffer_count;
} ds_offload;

typedef struct {
    dt_config *c;
    const char *origin;
    char *ignored;
    size_t cap, len;
    ds_offload off[2];      /* [0] offload_optimizer, [1] offload_param */
    const cJSON *legacy[3]; /* cpu_offload, cpu_offload_params (or _param), cpu_offload_use_pin_memory */
} ds_ctx;

/* Keys that only a DeepSpeed config has at its top level (none is a dtrain key). */
static const char *const MARKERS[] = {"train_batch_size",  "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                      "zero_optimization", "bf16", "bfloat16", "fp16", "gradient_clipping",
                                      "steps_per_print",   "wall_clock_breakdown", "zero_allow_untested_optimizer"};

const char *dt_deepspeed_marker(const struct cJSON *root) {
    for (const cJSON *it = root ? root->child : NULL; it; it = it->next)
        for (size_t i = 0; it->string && i < sizeof MARKERS / sizeof *MARKERS; i++)
            if (!strcmp(it->string, MARKERS[i])) return MARKERS[i];
    return NULL;
}

static void ignore(ds_ctx *x, const char *path, const char *why) {
    if (x->len >= x->cap) return;
    int n = snprintf(x->ignored + x->len, x->cap - x->len, "%s%s%s", x->len ? ", " : "", path, why);
    if (n > 0) x->len += (size_t)n;
    if (x->len >= x->cap) x->len = x->cap - 1;
}

/* prefix.key; a path longer than the buffer is cut (it only names the key in messages) */
static void join(char *out, size_t cap, const char *prefix, const char *key) {
    size_t n = strlen(prefix);
    if (n >= cap) n = cap - 1;
    memcpy(out, prefix, n);
    out[n] = 0;
    if (n + 1 < cap) {
        out[n++] = '.';
        out[n] = 0;
    }
    size_t m = strlen(key);
    if (m > cap - 1 - n) m = cap - 1 - n;
    memcpy(out + n, key, m);
    out[n + m] = 0;
}

static const char *type_name(const cJSON *it) {
    if (cJSON_IsNumber(it)) return "a number";
    if (cJSON_IsBool(it)) return "a boolean";
    if (cJSON_IsString(it)) return "a string";
    if (cJSON_IsArray(it)) return "an array";
    if (cJSON_IsObject(it)) return "an object";
    return "null";
}

static dt_status bad_type(const ds_ctx *x, const char *path, const char *want, const cJSON *it) {
    return dt_fail(DT_EINPUT, "%s: %s must be %s, not %s", x->origin, path, want, type_name(it));
}

static int is_auto(const cJSON *it) { return cJSON_IsString(it) && !strcmp(it->valuestring, "auto"); }

/* A number (or "auto" where allow_auto: *found = 0, the key is as if absent). */
static dt_status get_num(const ds_ctx *x, const cJSON *it, const char *path, int allow_auto, double *v, int *found) {
    *found = 0;
    if (allow_auto && is_auto(it)) return DT_OK;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return bad_type(x, path, allow_auto ? "a number or \"auto\"" : "a number", it);
    *v = it->valuedouble;
    *found = 1;
    return DT_OK;
}

static dt_status get_int(const ds_ctx *x, const cJSON *it, const char *path, double lo, double hi, long long *v,
                         int *found) {
    double d = 0;
    DT_TRY(get_num(x, it, path, 1, &d, found));
    if (!*found) return DT_OK;
    if (d != floor(d) || d < lo || d > hi)
        return dt_fail(DT_EINPUT, "%s: %s = %g must be an integer in [%g, %g]", x->origin, path, d, lo, hi);
    *v = (long long)d;
    return DT_OK;
}

static dt_status get_bool(const ds_ctx *x, const cJSON *it, const char *path, int *v, int *found) {
    *found = 0;
    if (is_auto(it)) return DT_OK;
    if (!cJSON_IsBool(it)) return bad_type(x, path, "true, false or \"auto\"", it);
    *v = cJSON_IsTrue(it);
    *found = 1;
    return DT_OK;
}

static dt_status get_object(const ds_ctx *x, const cJSON *it, const char *path) {
    return cJSON_IsObject(it) ? DT_OK : bad_type(x, path, "an object", it);
}

/* Sets dtrain's key; a value out of its range names both keys. */
static dt_status set(const ds_ctx *x, const char *ds_path, const char *fmt, ...) {
    char buf[DT_PATH_MAX + 64]; /* a path value too long for its key still fails there, not cut here */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    dt_status s = dt_config_set(x->c, buf);
    if (s != DT_OK) dt_error_context("%s: %s", x->origin, ds_path);
    return s;
}

static dt_status refuse(const ds_ctx *x, const char *path, const char *why) {
    return dt_fail(DT_EINPUT, "%s: %s: %s", x->origin, path, why);
}

/* ---- blocks with an "enabled" switch ---- */

/* A block whose one key with meaning here is "enabled" (the others are listed as
 * ignored): *on, and its path for messages. */
static dt_status block_enabled(ds_ctx *x, const cJSON *blk, const char *name, int *on, char *path, size_t cap) {
    DT_TRY(get_object(x, blk, name));
    *on = 0;
    for (const cJSON *it = blk->child; it; it = it->next) {
        join(path, cap, name, it->string);
        if (strcmp(it->string, "enabled")) {
            ignore(x, path, "");
            continue;
        }
        int v = 0, found;
        DT_TRY(get_bool(x, it, path, &v, &found));
        if (found) *on = v;
    }
    join(path, cap, name, "enabled");
    return DT_OK;
}

/* bf16 / bfloat16: precision. */
static dt_status do_bf16(ds_ctx *x, const cJSON *blk, const char *name) {
    char path[160];
    int on;
    DT_TRY(block_enabled(x, blk, name, &on, path, sizeof path));
    return on ? set(x, path, "precision=bf16") : DT_OK;
}

/* fp16 and amp: only disabled (dtrain has no loss scaling); their other keys then mean nothing. */
static dt_status do_disabled_only(ds_ctx *x, const cJSON *blk, const char *name, const char *why) {
    char path[160];
    int on;
    DT_TRY(block_enabled(x, blk, name, &on, path, sizeof path));
    return on ? refuse(x, path, why) : DT_OK;
}

/* A feature block that changes the math when enabled (curriculum, layer drop, ...). */
static dt_status do_feature(ds_ctx *x, const cJSON *blk, const char *name) {
    if (!cJSON_IsObject(blk)) return bad_type(x, name, "an object", blk);
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(blk, "enabled");
    char path[160];
    join(path, sizeof path, name, "enabled");
    int on = 0, found = 0;
    if (en) DT_TRY(get_bool(x, en, path, &on, &found));
    if (found && on) return refuse(x, path, "this training feature is not implemented in dtrain (it changes the math)");
    ignore(x, name, "");
    return DT_OK;
}

/* ---- zero_optimization ---- */

/* One offload block: its device, and the keys dtrain has (applied by apply_offload); the
 * tuning keys with no counterpart are listed; partial offload (ratio) is refused. With
 * device none the block's other keys have no effect (as in DeepSpeed). */
static dt_status do_offload(ds_ctx *x, const cJSON *blk, const char *path, int param) {
    DT_TRY(get_object(x, blk, path));
    ds_offload *o = &x->off[param];
    o->present = 1;
    char sub[200];
    const cJSON *dev = cJSON_GetObjectItemCaseSensitive(blk, "device");
    join(sub, sizeof sub, path, "device");
    if (dev && !cJSON_IsString(dev)) return bad_type(x, sub, "\"none\", \"cpu\" or \"nvme\"", dev);
    if (dev && strcmp(dev->valuestring, "none") && strcmp(dev->valuestring, "auto")) {
        if (strcmp(dev->valuestring, "cpu") && strcmp(dev->valuestring, "nvme"))
            return dt_fail(DT_EINPUT, "%s: %s = '%s' is not one of none, cpu, nvme", x->origin, sub, dev->valuestring);
        o->device = dev->valuestring;
    }
    int nvme = o->device && !strcmp(o->device, "nvme");
    for (const cJSON *it = blk->child; it; it = it->next) {
        const char *k = it->string;
        join(sub, sizeof sub, path, k);
        int found = 0, on = 0, used = 0;
        long long v = 0;
        double d = 0;
        const char *note = ""; /* why a key is listed as ignored */
        if (!strcmp(k, "device")) continue;
        if (!strcmp(k, "nvme_path")) {
            if (cJSON_IsNull(it)) continue; /* DeepSpeed's default: none */
            if (!cJSON_IsString(it)) return bad_type(x, sub, "a string", it);
            if ((used = nvme)) o->nvme_path = it;
            note = " (device is not nvme)";
        } else if (!strcmp(k, "pin_memory")) {
            DT_TRY(get_bool(x, it, sub, &on, &found));
            if (found) o->pin_memory = it;
            continue; /* a second block's disagreeing value is listed by apply_offload */
        } else if (!strcmp(k, "buffer_count")) {
            DT_TRY(get_int(x, it, sub, 1, 1e6, &v, &found));
            if ((used = nvme) && found) o->buffer_count = it; /* "auto": as if absent */
            note = " (device is not nvme)";
        } else if (!param && !strcmp(k, "ratio")) {
            DT_TRY(get_num(x, it, sub, 1, &d, &found));
            if (found && d != 1 && o->device)
                return refuse(x, sub, "partial offload is not supported in dtrain (ratio 1: all of the optimizer "
                                      "state, or device \"none\")");
            continue;
        } else if (!param && !strcmp(k, "fast_init")) {
            DT_TRY(get_bool(x, it, sub, &on, &found));
        } else if (param && !strcmp(k, "buffer_size")) {
            DT_TRY(get_num(x, it, sub, 1, &d, &found));
            note = " (dtrain sizes its buffers from offload.block_mb)";
        } else if (param && !strcmp(k, "max_in_cpu")) {
            DT_TRY(get_num(x, it, sub, 1, &d, &found));
        } else {
            return dt_fail(DT_EINPUT, "%s: unknown key %s (DeepSpeed refuses it too)", x->origin, sub);
        }
        if (o->device && !used) ignore(x, sub, note);
    }
    return DT_OK;
}

/* The blocks (and the legacy keys) onto offload.*: one directory (two different ones are
 * refused rather than one dropped), one pin_memory and buffer_count (the optimizer
 * block's where both give one). */
static dt_status apply_offload(ds_ctx *x) {
    static const char *const blk[2] = {"zero_optimization.offload_optimizer", "zero_optimization.offload_param"};
    static const char *const key[2] = {"offload.optimizer", "offload.param"};
    char p[200], legacy[3][160];
    for (int l = 0; l < 3; l++)
        if (x->legacy[l]) join(legacy[l], sizeof legacy[l], "zero_optimization", x->legacy[l]->string);
    for (int w = 0; w < 2; w++) {
        if (x->legacy[w] && cJSON_IsTrue(x->legacy[w])) { /* the block, where both are given */
            if (x->off[w].present) ignore(x, legacy[w], w ? " (offload_param given)" : " (offload_optimizer given)");
            else DT_TRY(set(x, legacy[w], "%s=cpu", key[w]));
        }
        if (x->off[w].device) {
            join(p, sizeof p, blk[w], "device");
            DT_TRY(set(x, p, "%s=%s", key[w], x->off[w].device));
        }
    }
    const cJSON *a = x->off[0].nvme_path, *b = x->off[1].nvme_path;
    if (a && b && strcmp(a->valuestring, b->valuestring))
        return dt_fail(DT_EINPUT, "%s: %s.nvme_path '%s' and %s.nvme_path '%s' differ: dtrain keeps the offload files "
                       "in one directory (offload.nvme_path)", x->origin, blk[0], a->valuestring, blk[1], b->valuestring);
    if (a || b) {
        join(p, sizeof p, blk[a ? 0 : 1], "nvme_path");
        DT_TRY(set(x, p, "offload.nvme_path=%s", (a ? a : b)->valuestring));
    }
    static const char *const one[2] = {"pin_memory", "buffer_count"};
    for (int k = 0; k < 2; k++) {
        const cJSON *v[2];
        for (int w = 0; w < 2; w++) v[w] = !x->off[w].device ? NULL : k ? x->off[w].buffer_count : x->off[w].pin_memory;
        const cJSON *use = v[0] ? v[0] : v[1];
        if (!use && !k && x->legacy[2] && cJSON_IsBool(x->legacy[2])) { /* the legacy pin_memory */
            DT_TRY(set(x, legacy[2], "offload.pin_memory=%s", cJSON_IsTrue(x->legacy[2]) ? "true" : "false"));
            continue;
        }
        if (x->legacy[2] && !k && use) ignore(x, legacy[2], "");
        if (!use) continue;
        join(p, sizeof p, blk[use == v[1]], one[k]);
        if (k) DT_TRY(set(x, p, "offload.buffer_count=%.0f", use->valuedouble));
        else DT_TRY(set(x, p, "offload.pin_memory=%s", cJSON_IsTrue(use) ? "true" : "false"));
        if (v[0] && v[1] && (k ? v[0]->valuedouble != v[1]->valuedouble : cJSON_IsTrue(v[0]) != cJSON_IsTrue(v[1]))) {
            join(p, sizeof p, blk[1], one[k]);
            ignore(x, p, k ? " (one offload.buffer_count: the optimizer block's)"
                           : " (one offload.pin_memory: the optimizer block's)");
        }
    }
    return DT_OK;
}

/* Whether the file offloads anything to NVMe (the aio block then sets the transfer size). */
static int offloads_nvme(const ds_ctx *x) {
    for (int w = 0; w < 2; w++)
        if (x->off[w].device && !strcmp(x->off[w].device, "nvme")) return 1;
    return 0;
}

/* The top-level aio block: its block_size is dtrain's NVMe transfer size; the rest tunes
 * DeepSpeed's I/O threads and queue, which dtrain's store sizes itself. */
static dt_status do_aio(ds_ctx *x, const cJSON *blk) {
    DT_TRY(get_object(x, blk, "aio"));
    char path[160];
    for (const cJSON *it = blk->child; it; it = it->next) {
        const char *k = it->string;
        join(path, sizeof path, "aio", k);
        long long v = 0;
        int found = 0, on = 0;
        if (!strcmp(k, "block_size")) {
            DT_TRY(get_int(x, it, path, 1, 1e12, &v, &found));
            if (found && offloads_nvme(x)) DT_TRY(set(x, path, "offload.block_mb=%.17g", (double)v / (1 << 20)));
            else if (found) ignore(x, path, " (no nvme offload)");
        } else if (!strcmp(k, "queue_depth")) {
            DT_TRY(get_int(x, it, path, 1, 1e9, &v, &found));
            ignore(x, path, " (dtrain keeps offload.buffer_count blocks in flight)");
        } else if (!strcmp(k, "thread_count") || !strcmp(k, "intra_op_parallelism")) {
            DT_TRY(get_int(x, it, path, 1, 1e9, &v, &found));
            ignore(x, path, "");
        } else if (!strcmp(k, "single_submit") || !strcmp(k, "overlap_events") || !strcmp(k, "use_gds")) {
            DT_TRY(get_bool(x, it, path, &on, &found));
            ignore(x, path, "");
        } else {
            ignore(x, path, " (not a DeepSpeed key)");
        }
    }
    return DT_OK;
}

typedef enum { Z_IGNORE, Z_SAME, Z_REFUSE_TRUE, Z_LEGACY } z_kind;
/* The ZeRO keys with no dtrain counterpart: tuning knobs (ignored, listed), behaviour
 * dtrain always has (same, not listed), features that change the math (refused when on);
 * and the legacy offload switches (read with the offload blocks: apply_offload). */
static const struct {
    const char *key;
    z_kind kind;
} ZKEYS[] = {
    {"contiguous_gradients", Z_IGNORE},
    {"reduce_scatter", Z_IGNORE},
    {"allgather_partitions", Z_IGNORE},
    {"stage3_prefetch_bucket_size", Z_IGNORE},
    {"stage3_param_persistence_threshold", Z_IGNORE},
    {"stage3_model_persistence_threshold", Z_IGNORE},
    {"stage3_max_live_parameters", Z_IGNORE},
    {"stage3_max_reuse_distance", Z_IGNORE},
    {"sub_group_size", Z_IGNORE},
    {"load_from_fp32_weights", Z_IGNORE},
    {"elastic_checkpoint", Z_IGNORE},
    {"round_robin_gradients", Z_IGNORE},
    {"ignore_unused_parameters", Z_IGNORE},
    {"legacy_stage1", Z_IGNORE},
    {"memory_efficient_linear", Z_IGNORE},
    {"override_module_apply", Z_IGNORE},
    {"log_trace_cache_warnings", Z_IGNORE},
    {"use_multi_rank_bucket_allreduce", Z_IGNORE},
    {"stage3_use_all_reduce_for_fetch_params", Z_IGNORE},
    {"use_all_reduce_for_fetch_params", Z_IGNORE},
    {"module_granularity_threshold", Z_IGNORE},
    {"pipeline_loading_checkpoint", Z_IGNORE},
    {"zero_hpz_partition_size", Z_IGNORE},
    {"mics_shard_size", Z_IGNORE},
    {"mics_hierarchical_params_gather", Z_IGNORE},
    {"stage3_gather_16bit_weights_on_model_save", Z_SAME}, /* dtrain's saves always hold whole tensors */
    {"stage3_gather_fp16_weights_on_model_save", Z_SAME},
    {"gather_16bit_weights_on_model_save", Z_SAME},
    {"cpu_offload", Z_LEGACY},
    {"cpu_offload_params", Z_LEGACY},
    {"cpu_offload_param", Z_LEGACY},
    {"cpu_offload_use_pin_memory", Z_LEGACY},
    {"zero_quantized_weights", Z_REFUSE_TRUE},
    {"zero_quantized_nontrainable_weights", Z_REFUSE_TRUE},
    {"zero_quantized_gradients", Z_REFUSE_TRUE},
    {"zeropp_loco_param", Z_REFUSE_TRUE},
};

static dt_status do_zero(ds_ctx *x, const cJSON *blk, double *bucket_elems, int *bucket_found) {
    DT_TRY(get_object(x, blk, "zero_optimization"));
    const cJSON *reduce = cJSON_GetObjectItemCaseSensitive(blk, "reduce_bucket_size");
    char path[160];
    for (const cJSON *it = blk->child; it; it = it->next) {
        const char *k = it->string;
        join(path, sizeof path, "zero_optimization", k);
        int found = 0, on = 0;
        long long v = 0;
        double d = 0;
        if (!strcmp(k, "stage")) {
            DT_TRY(get_int(x, it, path, 0, 3, &v, &found));
            if (found) DT_TRY(set(x, path, "parallel.zero=%lld", v));
        } else if (!strcmp(k, "overlap_comm")) {
            DT_TRY(get_bool(x, it, path, &on, &found));
            if (found) DT_TRY(set(x, path, "parallel.overlap=%s", on ? "true" : "false"));
        } else if (!strcmp(k, "reduce_bucket_size") || !strcmp(k, "allgather_bucket_size")) {
            /* one bucket size here: the reduce one, else the all-gather one */
            DT_TRY(get_num(x, it, path, 1, &d, &found));
            if (found && d < 0) return dt_fail(DT_EINPUT, "%s: %s = %g must not be negative", x->origin, path, d);
            if (found && (it == reduce || !reduce)) {
                *bucket_elems = d;
                *bucket_found = 1;
            } else if (found) ignore(x, path, "");
        } else if (!strcmp(k, "offload_optimizer") || !strcmp(k, "offload_param")) {
            DT_TRY(do_offload(x, it, path, !strcmp(k, "offload_param")));
        } else {
            size_t i = 0, n = sizeof ZKEYS / sizeof *ZKEYS;
            while (i < n && strcmp(ZKEYS[i].key, k)) i++;
            if (i == n) /* as DeepSpeed's own ZeRO config: a typo must not silently mean the default */
                return dt_fail(DT_EINPUT, "%s: unknown key %s (DeepSpeed refuses it too%s)", x->origin, path,
                               !strcmp(k, "aio") ? "; aio is a top-level block" : "");
            if (cJSON_IsObject(it) || cJSON_IsArray(it) || cJSON_IsNull(it))
                return bad_type(x, path, "a number, boolean or string", it);
            if (ZKEYS[i].kind == Z_REFUSE_TRUE) {
                DT_TRY(get_bool(x, it, path, &on, &found));
                if (found && on)
                    return refuse(x, path, "quantized ZeRO communication is not implemented in dtrain (it changes "
                                           "the math)");
            } else if (ZKEYS[i].kind == Z_LEGACY) {
                DT_TRY(get_bool(x, it, path, &on, &found));
                if (found) x->legacy[!strcmp(k, "cpu_offload") ? 0 : strstr(k, "pin") ? 2 : 1] = it;
            } else if (ZKEYS[i].kind == Z_SAME) {
                DT_TRY(get_bool(x, it, path, &on, &found));
            } else {
                ignore(x, path, "");
            }
        }
    }
    return apply_offload(x);
}

/* ---- optimizer ---- */

static dt_status do_optimizer(ds_ctx *x, const cJSON *blk) {
    DT_TRY(get_object(x, blk, "optimizer"));
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(blk, "type");
    int adamw = 0;
    if (!type) return dt_fail(DT_EINPUT, "%s: optimizer.type is missing", x->origin);
    if (!cJSON_IsString(type)) return bad_type(x, "optimizer.type", "a string", type);
    if (!strcasecmp(type->valuestring, "adamw")) adamw = 1;
    else if (strcasecmp(type->valuestring, "adam"))
        return dt_fail(DT_EINPUT, "%s: optimizer.type = '%s': dtrain implements AdamW only (type Adam or AdamW)",
                       x->origin, type->valuestring);
    char path[160];
    for (const cJSON *it = blk->child; it; it = it->next) {
        if (!strcmp(it->string, "type")) continue;
        join(path, sizeof path, "optimizer", it->string);
        if (strcmp(it->string, "params")) {
            ignore(x, path, " (not a DeepSpeed key)");
            continue;
        }
        DT_TRY(get_object(x, it, path));
    }
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(blk, "params");
    int l2 = 0; /* Adam with adam_w_mode false: L2 regularisation, not decoupled decay */
    double wd = x->c->train.weight_decay;
    for (const cJSON *it = params ? params->child : NULL; it; it = it->next) {
        const char *k = it->string;
        join(path, sizeof path, "optimizer.params", k);
        int found = 0, on = 0;
        double d = 0;
        if (!strcmp(k, "lr") || !strcmp(k, "eps") || !strcmp(k, "weight_decay")) {
            DT_TRY(get_num(x, it, path, 1, &d, &found));
            if (found && !strcmp(k, "weight_decay")) wd = d;
            if (found) DT_TRY(set(x, path, "train.%s=%.17g", k, d));
        } else if (!strcmp(k, "betas")) {
            if (is_auto(it)) continue;
            if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2 || !cJSON_IsNumber(cJSON_GetArrayItem(it, 0)) ||
                !cJSON_IsNumber(cJSON_GetArrayItem(it, 1)))
                return dt_fail(DT_EINPUT, "%s: %s must be an array of two numbers or \"auto\"", x->origin, path);
            DT_TRY(set(x, path, "train.beta1=%.17g", cJSON_GetArrayItem(it, 0)->valuedouble));
            DT_TRY(set(x, path, "train.beta2=%.17g", cJSON_GetArrayItem(it, 1)->valuedouble));
        } else if (!strcmp(k, "adam_w_mode")) {
            DT_TRY(get_bool(x, it, path, &on, &found));
            if (found && !on && !adamw) l2 = 1; /* type AdamW is decoupled whatever adam_w_mode says */
        } else if (!strcmp(k, "bias_correction")) {
            DT_TRY(get_bool(x, it, path, &on, &found));
            if (found && !on) return refuse(x, path, "dtrain's AdamW always corrects the moments' bias");
        } else if (!strcmp(k, "amsgrad")) {
            DT_TRY(get_bool(x, it, path, &on, &found));
            if (found && on) return refuse(x, path, "AMSGrad is not implemented in dtrain");
        } else if (!strcmp(k, "torch_adam") || !strcmp(k, "fused") || !strcmp(k, "foreach") ||
                   !strcmp(k, "capturable") || !strcmp(k, "set_grad_none")) {
            DT_TRY(get_bool(x, it, path, &on, &found)); /* which implementation, same update */
            ignore(x, path, "");
        } else {
            /* DeepSpeed hands params to the optimizer's constructor, which refuses unknown ones */
            return dt_fail(DT_EINPUT, "%s: unknown key %s (Adam and AdamW take lr, betas, eps, weight_decay, "
                           "adam_w_mode, bias_correction, amsgrad, torch_adam)", x->origin, path);
        }
    }
    if (l2 && wd != 0)
        return refuse(x, "optimizer.params.adam_w_mode",
                      "false with weight_decay is Adam with L2 regularisation; dtrain's decay is decoupled (AdamW)");
    return DT_OK;
}

/* ---- scheduler ---- */

/* warmup_type must be linear (DeepSpeed's default is log, which dtrain cannot reproduce). */
static dt_status check_warmup_type(const ds_ctx *x, const cJSON *params, long long warmup) {
    const cJSON *wt = params ? cJSON_GetObjectItemCaseSensitive(params, "warmup_type") : NULL;
    if (wt && !cJSON_IsString(wt)) return bad_type(x, "scheduler.params.warmup_type", "\"log\" or \"linear\"", wt);
    const char *t = wt ? wt->valuestring : "log";
    if (!strcmp(t, "linear") || warmup == 0) return DT_OK;
    if (strcmp(t, "log")) return dt_fail(DT_EINPUT, "%s: scheduler.params.warmup_type = '%s' is not log or linear", x->origin, t);
    return dt_fail(DT_EINPUT, "%s: scheduler.params.warmup_type = 'log'%s: dtrain's warmup is linear (set "
                   "\"warmup_type\": \"linear\", or drop the scheduler block to keep dtrain's)", x->origin,
                   wt ? "" : " (DeepSpeed's default)");
}

static dt_status do_scheduler(ds_ctx *x, const cJSON *blk) {
    DT_TRY(get_object(x, blk, "scheduler"));
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(blk, "type");
    if (!type) return dt_fail(DT_EINPUT, "%s: scheduler.type is missing", x->origin);
    if (!cJSON_IsString(type)) return bad_type(x, "scheduler.type", "a string", type);
    const char *t = type->valuestring;
    int cosine = !strcmp(t, "WarmupCosineLR"), constant = !strcmp(t, "WarmupLR");
    if (!cosine && !constant)
        return dt_fail(DT_EINPUT, "%s: scheduler.type = '%s': dtrain's schedule is a linear warmup and a cosine decay "
                       "(WarmupCosineLR, or WarmupLR: constant after the warmup)%s", x->origin, t,
                       !strcmp(t, "WarmupDecayLR") ? "; WarmupDecayLR decays linearly" : "");
    char path[160];
    for (const cJSON *it = blk->child; it; it = it->next) {
        if (!strcmp(it->string, "type")) continue;
        join(path, sizeof path, "scheduler", it->string);
        if (strcmp(it->string, "params")) ignore(x, path, " (not a DeepSpeed key)");
        else DT_TRY(get_object(x, it, path));
    }
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(blk, "params");
    long long warmup = x->c->train.warmup_steps, total = 0;
    double peak = x->c->train.lr, floor_ratio = 1e-4 /* WarmupCosineLR's cos_min_ratio default */, start = 0;
    int have_total = 0, found;
    for (const cJSON *it = params ? params->child : NULL; it; it = it->next) {
        const char *k = it->string;
        join(path, sizeof path, "scheduler.params", k);
        long long v;
        double d;
        if (!strcmp(k, "warmup_num_steps")) {
            DT_TRY(get_int(x, it, path, 0, 1e9, &v, &found));
            if (found) warmup = v;
        } else if (!strcmp(k, "total_num_steps") && cosine) {
            DT_TRY(get_int(x, it, path, 0, 1e9, &v, &found));
            if (found) total = v, have_total = 1;
        } else if (!strcmp(k, "warmup_max_lr") && constant) {
            DT_TRY(get_num(x, it, path, 1, &d, &found));
            if (found) peak = d;
        } else if ((!strcmp(k, "warmup_min_lr") && constant) || (!strcmp(k, "warmup_min_ratio") && cosine)) {
            DT_TRY(get_num(x, it, path, 1, &d, &found));
            if (found) start = d;
            if (start != 0) return refuse(x, path, "dtrain's warmup starts from 0 (set it to 0)");
        } else if (!strcmp(k, "cos_min_ratio") && cosine) {
            DT_TRY(get_num(x, it, path, 1, &d, &found));
            if (found && (d < 0 || d > 1))
                return dt_fail(DT_EINPUT, "%s: %s = %g must be in [0, 1]", x->origin, path, d);
            if (found) floor_ratio = d;
        } else if (!strcmp(k, "warmup_type")) {
            continue; /* checked below, with the warmup length */
        } else if (!strcmp(k, "last_batch_iteration")) {
            DT_TRY(get_int(x, it, path, -1, -1, &v, &found)); /* a resume point: dtrain resumes from checkpoints */
        } else {
            return dt_fail(DT_EINPUT, "%s: unknown key %s for scheduler %s", x->origin, path, t);
        }
    }
    DT_TRY(check_warmup_type(x, params, warmup));
    DT_TRY(set(x, "scheduler.params.warmup_num_steps", "train.warmup_steps=%lld", warmup));
    if (constant) { /* a cosine from lr to lr is flat */
        DT_TRY(set(x, "scheduler.params.warmup_max_lr", "train.lr=%.17g", peak));
        DT_TRY(set(x, "scheduler.params.warmup_max_lr", "train.min_lr=%.17g", peak));
    } else {
        DT_TRY(set(x, "scheduler.params.cos_min_ratio", "train.min_lr=%.17g", floor_ratio * x->c->train.lr));
        if (have_total) DT_TRY(set(x, "scheduler.params.total_num_steps", "train.steps=%lld", total));
    }
    return DT_OK;
}

/* ---- the top level ---- */

typedef enum { T_IGNORE, T_FEATURE } t_kind;
static const struct {
    const char *key;
    t_kind kind;
} TKEYS[] = {
    {"zero_allow_untested_optimizer", T_IGNORE}, {"zero_force_ds_cpu_optimizer", T_IGNORE},
    {"prescale_gradients", T_IGNORE},            {"gradient_predivide_factor", T_IGNORE},
    {"communication_data_type", T_IGNORE},       {"seq_parallel_communication_data_type", T_IGNORE},
    {"sparse_gradients", T_IGNORE},              {"dump_state", T_IGNORE},
    {"memory_breakdown", T_IGNORE},              {"flops_profiler", T_IGNORE},
    {"tensorboard", T_IGNORE},                   {"wandb", T_IGNORE},
    {"csv_monitor", T_IGNORE},                   {"comet", T_IGNORE},
    {"comms_logger", T_IGNORE},                  {"activation_checkpointing", T_IGNORE},
    {"checkpoint", T_IGNORE},                    {"autotuning", T_IGNORE},
    {"dataloader_drop_last", T_IGNORE},
    {"disable_allgather", T_IGNORE},             {"timers", T_IGNORE},
    {"pipeline", T_IGNORE},                      {"data_types", T_IGNORE},
    {"hybrid_engine", T_IGNORE},                 {"compile", T_IGNORE},
    {"nebula", T_IGNORE},                        {"eigenvalue", T_IGNORE},
    {"graph_harvesting", T_IGNORE},              {"use_data_before_expert_parallelism", T_IGNORE},
    {"tensor_parallel", T_IGNORE},               {"weight_quantization", T_IGNORE},
    {"compression_training", T_IGNORE},          {"elasticity", T_FEATURE},
    {"curriculum_learning", T_FEATURE},          {"data_efficiency", T_FEATURE},
    {"progressive_layer_drop", T_FEATURE},       {"quantize_training", T_FEATURE},
    {"sparse_attention", T_FEATURE},
};

static dt_status translate(ds_ctx *x, const cJSON *root) {
    long long tbs = 0, mbs = 0, gas = 0, v;
    int has_tbs = 0, has_mbs = 0, has_gas = 0, found, on;
    double bucket = 0, d;
    int has_bucket = 0;
    for (const cJSON *it = root->child; it; it = it->next) {
        const char *k = it->string;
        if (!strcmp(k, "train_batch_size")) DT_TRY(get_int(x, it, k, 1, 1e9, &tbs, &has_tbs));
        else if (!strcmp(k, "train_micro_batch_size_per_gpu")) DT_TRY(get_int(x, it, k, 1, 1e6, &mbs, &has_mbs));
        else if (!strcmp(k, "gradient_accumulation_steps")) DT_TRY(get_int(x, it, k, 1, 1e6, &gas, &has_gas));
        else if (!strcmp(k, "gradient_clipping")) {
            DT_TRY(get_num(x, it, k, 1, &d, &found));
            if (found) DT_TRY(set(x, k, "train.grad_clip=%.17g", d));
        } else if (!strcmp(k, "bf16") || !strcmp(k, "bfloat16")) DT_TRY(do_bf16(x, it, k));
        else if (!strcmp(k, "fp16"))
            DT_TRY(do_disabled_only(x, it, k, "fp16 with loss scaling is not implemented in dtrain (use bf16: "
                                              "\"bf16\": {\"enabled\": true})"));
        else if (!strcmp(k, "amp"))
            DT_TRY(do_disabled_only(x, it, k, "Apex AMP is not implemented in dtrain (use bf16)"));
        else if (!strcmp(k, "zero_optimization")) DT_TRY(do_zero(x, it, &bucket, &has_bucket));
        else if (!strcmp(k, "optimizer")) DT_TRY(do_optimizer(x, it));
        else if (!strcmp(k, "scheduler")) continue; /* after the optimizer: its lr is the cosine's peak */
        else if (!strcmp(k, "aio")) continue; /* after zero_optimization: whether it offloads to NVMe */
        else if (!strcmp(k, "steps_per_print")) {
            DT_TRY(get_int(x, it, k, 1, 1e9, &v, &found));
            if (found) DT_TRY(set(x, k, "log.every=%lld", v));
        } else if (!strcmp(k, "wall_clock_breakdown")) {
            DT_TRY(get_bool(x, it, k, &on, &found));
            if (found && on) DT_TRY(set(x, k, "log.profile=true")); /* the nearest: a time breakdown at the end */
        } else {
            size_t i = 0, n = sizeof TKEYS / sizeof *TKEYS;
            while (i < n && strcmp(TKEYS[i].key, k)) i++;
            if (i < n && TKEYS[i].kind == T_FEATURE) DT_TRY(do_feature(x, it, k));
            else ignore(x, k, i < n ? "" : " (not a DeepSpeed key)"); /* DeepSpeed tolerates unknown ones */
        }
    }
    const cJSON *sched = cJSON_GetObjectItemCaseSensitive(root, "scheduler");
    if (sched) DT_TRY(do_scheduler(x, sched));
    const cJSON *aio = cJSON_GetObjectItemCaseSensitive(root, "aio");
    if (aio) DT_TRY(do_aio(x, aio));
    /* The batch triple as DeepSpeed resolves it; the equation with the data-parallel size
     * is checked when the world is known (dt_config_resolve_micro_batch). */
    if (has_tbs && has_mbs && has_gas && tbs % (mbs * gas) != 0)
        return dt_fail(DT_EINPUT, "%s: train_batch_size %lld is not train_micro_batch_size_per_gpu %lld x "
                       "gradient_accumulation_steps %lld x a number of ranks", x->origin, tbs, mbs, gas);
    if (has_tbs) DT_TRY(set(x, "train_batch_size", "train.global_batch=%lld", tbs));
    if (has_mbs) DT_TRY(set(x, "train_micro_batch_size_per_gpu", "train.micro_batch=%lld", mbs));
    if (has_tbs && !has_mbs) /* the micro-batch follows from the others: train_batch_size / (accumulation x dp) */
        DT_TRY(set(x, "gradient_accumulation_steps", "parallel.micro_batches=%lld", has_gas ? gas : 1));
    else if (has_gas) DT_TRY(set(x, "gradient_accumulation_steps", "train.grad_accum=%lld", gas));
    if (has_bucket) { /* DeepSpeed counts elements; dtrain MiB of gradient */
        double mib = bucket * (!strcmp(x->c->precision, "bf16") ? 2.0 : 4.0) / (1024.0 * 1024.0);
        DT_TRY(set(x, "zero_optimization.reduce_bucket_size", "parallel.bucket_mb=%.17g", mib));
    }
    return DT_OK;
}

dt_status dt_deepspeed_load_json(dt_config *c, const char *json, const char *origin, char *ignored, size_t cap) {
    if (cap) ignored[0] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        return dt_fail(DT_EINPUT, "%s: malformed JSON near byte %zu", origin, at ? (size_t)(at - json) : 0);
    }
    while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r') end++;
    dt_status s = DT_OK;
    if (*end) s = dt_fail(DT_EINPUT, "%s: unexpected text after the JSON object at byte %zu", origin, (size_t)(end - json));
    else if (!cJSON_IsObject(root)) s = dt_fail(DT_EINPUT, "%s: a DeepSpeed config must be a JSON object", origin);
    else {
        ds_ctx x = {.c = c, .origin = origin, .ignored = ignored, .cap = cap};
        s = translate(&x, root);
    }
    cJSON_Delete(root);
    return s;
}

dt_status dt_deepspeed_load_file(dt_config *c, const char *path, char *ignored, size_t cap) {
    char *buf;
    DT_TRY(dt_config_read_file(path, "--deepspeed", &buf));
    char origin[DT_PATH_MAX + 32];
    snprintf(origin, sizeof origin, "deepspeed config '%s'", path);
    dt_status s = dt_deepspeed_load_json(c, buf, origin, ignored, cap);
    free(buf);
    return s;
}
